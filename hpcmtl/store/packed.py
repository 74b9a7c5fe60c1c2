"""The packed layout of a task file: every task's rows in one set of datasets, read a window at a time.

A task file of many small tasks in the group layout (``/tasks/NNNNNN/...``, one HDF5 group and two or
four datasets a task) costs a few object lookups a task to read: about 0.3 ms of CPU each, minutes at
10^5 tasks, and on a parallel file system each lookup is a metadata operation.  The packed layout holds
the same rows in one set of datasets, tasks in order::

    /rows/offsets   (m + 1,) int64: task i's rows are rows offsets[i]:offsets[i + 1]
    /rows/y         (N,) labels
    /rows/X         (N x d)                           when storage == "dense"
    /rows/{data,indices,indptr}                       when storage == "csr" (indptr: N + 1 entries)

(root attributes as the group layout's, ``layout = "packed"`` and ``format_version`` 2, so an hpcmtl
that reads only the group layout refuses the file by its version instead of missing its groups).  The
task table, the fingerprints and every check of a task's rows are the group layout's: the same rows
give the same fingerprints in either layout, so a checkpoint taken on one resumes on the other.

:class:`PackedRows` reads a task's rows out of a window of consecutive rows (about
:data:`WINDOW_BYTES`, to the end of a file chunk: a chunk is decompressed once, not once a task); a
block larger than the window is read directly.  Ranks read their own tasks, which the plan keeps in
order, so a window serves the next tasks of the same rank.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from .hdf5 import write_array

ROWS = "rows"
LAYOUTS = ("groups", "packed")
PACKED_VERSION = 2
# files of at least this many tasks are written packed by default (layout="auto"): below it a task's own
# group costs little, and the group layout stays what older hpcmtl versions read
PACKED_MIN_TASKS = 1000
WINDOW_BYTES = 1 << 22      # rows read at a time (about; a chunk of the file's datasets is about 1 MB)


def layout_for(layout: str, n_tasks: int) -> str:
    """The layout a file of ``n_tasks`` tasks is written in: ``layout``, or for "auto" packed from
    PACKED_MIN_TASKS tasks on."""
    if layout == "auto":
        return "packed" if n_tasks >= PACKED_MIN_TASKS else "groups"
    if layout not in LAYOUTS:
        raise InputError(f"layout {layout!r}: expected 'auto', 'groups' or 'packed'")
    return layout


def write_packed(f, mats, storage):
    """Every task's ``(X, y)`` of ``mats`` (checked, CSR with sorted indices) into ``/rows`` of the open file."""
    g = f.create_group(ROWS)
    counts = np.array([X.shape[0] for X, _ in mats], dtype=np.int64)
    g.create_dataset("offsets", data=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
    write_array(g, "y", np.concatenate([y for _, y in mats]))
    if storage == "csr":
        X = sp.vstack([X for X, _ in mats], format="csr")
        write_array(g, "data", X.data)
        write_array(g, "indices", X.indices.astype(np.int32))
        write_array(g, "indptr", X.indptr.astype(np.int64))
    else:
        write_array(g, "X", np.concatenate([X for X, _ in mats]))


class PackedRows:
    """The ``/rows`` datasets of an open packed task file, checked once; rows of a task read through a window.

    ``check_kind(where, field, dataset, kinds)`` and ``check_dtype(where, field, dataset)`` are the task
    file's own checks (one line naming the file and the field)."""

    def __init__(self, f, path, n_samples, storage, n_features, check_kind, check_dtype, label_kinds, index_kinds):
        self.path, self.storage, self.n_features = path, storage, n_features
        where = f"{path}: group '/{ROWS}'"
        g = f.get(ROWS)
        if g is None:
            raise InputError(f"{path}: group '/{ROWS}' is missing (a packed task file keeps its rows there)")
        fields = ("offsets", "y") + (("data", "indices", "indptr") if storage == "csr" else ("X",))
        ds = {}
        for name in fields:
            ds[name] = g.get(name)
            if ds[name] is None:
                raise InputError(f"{where}: field '{name}' is missing")
        check_kind(where, "offsets", ds["offsets"], index_kinds)
        check_kind(where, "y", ds["y"], label_kinds)
        m = len(n_samples)
        if ds["offsets"].shape != (m + 1,):
            raise InputError(f"{where}: field 'offsets': has shape {ds['offsets'].shape}, expected ({m + 1},) "
                             f"for {m} tasks")
        offsets = ds["offsets"][()].astype(np.int64)
        sizes = np.diff(offsets)
        if offsets[0] != 0 or np.any(sizes != n_samples):
            bad = 0 if offsets[0] != 0 else int(np.flatnonzero(sizes != n_samples)[0])
            raise InputError(f"{where}: field 'offsets': task #{bad} has {int(sizes[bad])} rows there, the task "
                             f"table says {int(n_samples[bad])}")
        N = int(offsets[-1])
        if ds["y"].shape != (N,):
            raise InputError(f"{where}: field 'y': has shape {ds['y'].shape}, expected ({N},)")
        if storage == "csr":
            for name in ("indices", "indptr"):
                check_kind(where, name, ds[name], index_kinds)
            check_dtype(where, "data", ds["data"])
            if ds["indptr"].shape != (N + 1,):
                raise InputError(f"{where}: field 'indptr': has shape {ds['indptr'].shape}, expected ({N + 1},)")
            if ds["data"].shape != ds["indices"].shape or len(ds["data"].shape) != 1:
                raise InputError(f"{where}: fields 'data' and 'indices': shapes {ds['data'].shape} and "
                                 f"{ds['indices'].shape} differ")
            self.row_bytes = max(1, 12 * int(ds["data"].shape[0]) // max(1, N)) + 8
        else:
            X = ds["X"]
            if len(X.shape) != 2 or X.shape[0] != N or X.shape[1] != n_features:
                raise InputError(f"{where}: field 'X': has shape {X.shape}, expected ({N}, {n_features})")
            check_dtype(where, "X", X)
            self.row_bytes = X.dtype.itemsize * n_features + 8
        self.ds, self.offsets, self.n_rows = ds, offsets, N
        chunks = [d.chunks[0] for d in ds.values() if d.chunks and d is not ds["offsets"]]
        self.chunk_rows = max(chunks) if chunks and storage == "dense" else 0
        self.window = None                  # (first row, end row, y, X or (indptr, data, indices, indptr's base))

    def span(self, i, start, stop):
        """Task ``i``'s rows ``start:stop`` as rows of the file."""
        return int(self.offsets[i]) + start, int(self.offsets[i]) + stop

    def large(self, lo, hi) -> bool:
        """A range larger than the window is read directly, never held in a window beside its block."""
        return (hi - lo) * self.row_bytes > WINDOW_BYTES

    def labels(self, lo, hi):
        if self.large(lo, hi):
            return self.ds["y"][lo:hi]
        y, _ = self._window(lo, hi)
        return y.copy()

    def rows(self, lo, hi):
        """``(y, X)`` of file rows ``lo:hi`` (small ranges): y a copy; X a view of the window (dense, the
        caller copies or converts it) or ``(indptr, data, indices)`` views (CSR, indptr as file positions)."""
        y, X = self._window(lo, hi)
        return y.copy(), X

    def _window(self, lo, hi):
        """Views of rows ``lo:hi`` in the window, reading a new window from ``lo`` when they are not in it."""
        w = self.window
        if w is None or lo < w[0] or hi > w[1]:
            self.window = w = self._read_window(lo, hi)
        a, b = lo - w[0], hi - w[0]
        if self.storage == "csr":
            indptr, data, indices, base = w[3]
            return w[2][a:b], (indptr[a:b + 1], data, indices, base)
        return w[2][a:b], w[3][a:b]

    def _read_window(self, lo, hi):
        """Rows ``lo`` up to about WINDOW_BYTES further (at least to ``hi``, at most the file's end, to the end of
        a chunk of the dense rows) read in one slice of each dataset."""
        end = max(hi, lo + max(1, WINDOW_BYTES // self.row_bytes))
        if self.chunk_rows:
            end = -(-end // self.chunk_rows) * self.chunk_rows
        end = min(end, self.n_rows)
        y = self.ds["y"][lo:end]
        if self.storage == "csr":
            # the stored values the window's rows point at; a damaged pointer is named by the task whose block
            # reads it (PackedRows' caller checks each block's pointer against these arrays)
            indptr = self.ds["indptr"][lo:end + 1].astype(np.int64)
            size = int(self.ds["data"].shape[0])
            nz0 = min(max(0, int(indptr.min())), size)
            nz1 = max(nz0, min(int(indptr.max()), size))
            return lo, end, y, (indptr, self.ds["data"][nz0:nz1], self.ds["indices"][nz0:nz1], nz0)
        return lo, end, y, self.ds["X"][lo:end]
