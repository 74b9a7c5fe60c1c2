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

import h5py
import numpy as np

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
    """Every task's ``(X, y)`` of ``mats`` (checked, CSR with sorted indices) into ``/rows`` of the open file, a
    slab of about a chunk at a time into datasets of their final size (never a second copy of every task)."""
    g = f.create_group(ROWS)
    counts = np.array([X.shape[0] for X, _ in mats], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    g.create_dataset("offsets", data=offsets)
    N = int(offsets[-1])
    ys = _slab_writer(g, "y", (N,), np.float64)
    if storage == "csr":
        nnz = np.array([X.nnz for X, _ in mats], dtype=np.int64)
        indptr = np.zeros(N + 1, dtype=np.int64)
        indptr[1:] = np.cumsum(np.concatenate([np.diff(X.indptr) for X, _ in mats]))
        write_array(g, "indptr", indptr)
        values = _slab_writer(g, "data", (int(nnz.sum()),), mats[0][0].dtype)
        columns = _slab_writer(g, "indices", (int(nnz.sum()),), np.int32)
        for X, y in mats:
            values(X.data)
            columns(X.indices.astype(np.int32))
            ys(y)
        for write in (values, columns, ys):
            write(None)
    else:
        rows = _slab_writer(g, "X", (N, mats[0][0].shape[1]), mats[0][0].dtype)
        for X, y in mats:
            rows(X)
            ys(y)
        for write in (rows, ys):
            write(None)


def _slab_writer(group, name, shape, dtype):
    """``write(piece)``: appends ``piece``'s rows to dataset ``name`` of ``shape`` (chunked and compressed as
    :func:`.hdf5.write_array` would store the whole), a chunk's rows at a time; ``write(None)`` flushes."""
    dtype = np.dtype(dtype)
    row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    if shape[0] * row > (1 << 20):
        step = max(1, (1 << 20) // max(1, row))
        ds = group.create_dataset(name, shape=shape, dtype=dtype, chunks=(min(step, shape[0]),) + tuple(shape[1:]),
                                  compression="gzip", compression_opts=1, shuffle=True)
    else:
        step = max(1, shape[0])
        ds = group.create_dataset(name, shape=shape, dtype=dtype)
    pending, state = [], {"rows": 0, "at": 0}

    def write(piece):
        if piece is not None:
            pending.append(np.asarray(piece, dtype=dtype))
            state["rows"] += pending[-1].shape[0]
        if pending and (piece is None or state["rows"] >= step):
            slab = np.concatenate(pending)
            ds[state["at"]:state["at"] + slab.shape[0]] = slab
            state["at"] += slab.shape[0]
            pending.clear()
            state["rows"] = 0
    return write


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
        if not isinstance(g, h5py.Group):
            raise InputError(f"{path}: '/{ROWS}' must be a group, found a {type(g).__name__}")
        fields = ("offsets", "y") + (("data", "indices", "indptr") if storage == "csr" else ("X",))
        ds = {}
        for name in fields:
            ds[name] = g.get(name)
            if ds[name] is None:
                raise InputError(f"{where}: field '{name}' is missing")
        check_kind(where, "offsets", ds["offsets"], index_kinds)
        check_kind(where, "y", ds["y"], label_kinds)
        check_kind(where, "data" if storage == "csr" else "X", ds["data" if storage == "csr" else "X"], "f")
        m = len(n_samples)
        if ds["offsets"].shape != (m + 1,):
            raise InputError(f"{where}: field 'offsets': has shape {ds['offsets'].shape}, expected ({m + 1},) "
                             f"for {m} tasks")
        offsets = ds["offsets"][()].astype(np.int64)
        sizes = np.diff(offsets)
        if offsets[0] != 0 or np.any(sizes != n_samples) or np.any(sizes < 0):
            bad = 0 if offsets[0] != 0 else int(np.flatnonzero((sizes != n_samples) | (sizes < 0))[0])
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
            if len(ds["data"].shape) != 1 or ds["data"].shape != ds["indices"].shape:
                raise InputError(f"{where}: fields 'data' and 'indices': shapes {ds['data'].shape} and "
                                 f"{ds['indices'].shape}, expected one equal length")
            self.value_bytes = ds["data"].dtype.itemsize + ds["indices"].dtype.itemsize
            self.chunk_rows = 0
        else:
            X = ds["X"]
            if len(X.shape) != 2 or X.shape[0] != N or X.shape[1] != n_features:
                raise InputError(f"{where}: field 'X': has shape {X.shape}, expected ({N}, {n_features})")
            check_dtype(where, "X", X)
            self.row_bytes = X.dtype.itemsize * n_features + 8
            # a window ends at the end of one of X's chunks (each compressed chunk inflated once) unless that
            # is far past the window's size (a file written with one huge chunk)
            self.chunk_rows = X.chunks[0] if X.chunks else 0
        self.ds, self.offsets, self.n_rows = ds, offsets, N
        self.window = None                  # (first row, end row, y, X or (indptr, data, indices, indptr's base))

    def span(self, i, start, stop):
        """Task ``i``'s rows ``start:stop`` as rows of the file."""
        return int(self.offsets[i]) + start, int(self.offsets[i]) + stop

    def large(self, lo, hi) -> bool:
        """A range larger than the window is read directly, never held in a window beside its block (CSR: by
        its stored values, two entries of the row pointer)."""
        w = self.window
        if w is not None and w[0] <= lo and hi <= w[1]:
            return False
        if self.storage == "csr":
            a, b = (int(v) for v in self.ds["indptr"][[lo, hi]]) if hi > lo else (0, 0)
            return (b - a) * self.value_bytes + (hi - lo) * 16 > WINDOW_BYTES
        return (hi - lo) * self.row_bytes > WINDOW_BYTES

    def labels(self, lo, hi):
        if self.large(lo, hi):
            return self.ds["y"][lo:hi]
        y, _ = self._window(lo, hi)
        return y.copy()

    def rows(self, lo, hi):
        """``(y, X)`` of file rows ``lo:hi`` (small ranges): y a copy; X a view of the window (dense, the
        caller copies or converts it) or ``(indptr, data, indices, base)`` views (CSR, indptr as file positions,
        ``data[0]`` at position ``base``)."""
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
        """Rows ``lo`` up to about WINDOW_BYTES further (at least to ``hi``, at most the file's end; dense: to the
        end of X's chunk) read in one slice of each dataset."""
        if self.storage == "csr":
            return self._read_csr_window(lo, hi)
        end = max(hi, lo + max(1, WINDOW_BYTES // self.row_bytes))
        if self.chunk_rows:
            aligned = -(-end // self.chunk_rows) * self.chunk_rows
            end = aligned if (aligned - lo) * self.row_bytes <= 2 * WINDOW_BYTES else end
        end = min(end, self.n_rows)
        return lo, end, self.ds["y"][lo:end], self.ds["X"][lo:end]

    def _read_csr_window(self, lo, hi):
        """The CSR window: rows from ``lo`` whose stored values fit WINDOW_BYTES (at least to ``hi``), the values
        read only as far as the row pointer is sound (ordered, within the values): a damaged pointer is named by
        the task whose block reads it, and never makes a window read the rest of the file."""
        last = min(self.n_rows, max(hi, lo + max(1, WINDOW_BYTES // 16)))
        indptr = self.ds["indptr"][lo:last + 1].astype(np.int64)
        size = int(self.ds["data"].shape[0])
        base = min(max(int(indptr[0]), 0), size)
        bad = np.flatnonzero((indptr < base) | (indptr > size) | (np.maximum.accumulate(indptr) != indptr))
        sound = lo + (int(bad[0]) - 1 if bad.size else last - lo)     # rows lo:sound point within the values
        fits = lo + int(np.searchsorted(indptr[:max(sound - lo, 0) + 1],
                                        base + max(1, WINDOW_BYTES // self.value_bytes), side="right")) - 1
        end = max(min(sound, fits), hi)
        top = int(indptr[min(end, sound) - lo]) if sound >= lo else base
        return lo, end, self.ds["y"][lo:end], (indptr[:end - lo + 1], self.ds["data"][base:top],
                                               self.ds["indices"][base:top], base)
