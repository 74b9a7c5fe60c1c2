"""Task dataset files (format ``hpcmtl-tasks``): writing, and reading only the rows asked for.

Two layouts: a group a task (version 1, below), and for many tasks every task's rows in one set of
datasets (``layout = "packed"``, version 2: :mod:`hpcmtl.store.packed`); ``write_tasks`` picks the packed
one from :data:`hpcmtl.store.packed.PACKED_MIN_TASKS` tasks on.  The group layout::

    /                 attrs: format, format_version, n_tasks, n_features, storage, dtype
    /task_table       compound (name, n_samples, nnz, fingerprint), one row per task
    /tasks/000000/y   labels (n_i,)
    /tasks/000000/X   dense (n_i x d)                 when storage == "dense"
    /tasks/000000/{data,indices,indptr}               when storage == "csr"
    /truth/...        optional ground truth of synthetic data (W, correlation, ...)
    /preprocessing/.. optional arrays of the preprocessing applied (e.g. standardization)

Feature dtype: a task file stores ``X`` (dense, or the CSR ``data``) as float64
or, written with ``float32=True`` (``hpcmtl data ... --float32``), as float32;
the root attribute ``dtype`` says which (absent: float64, files written before
it existed).  Reading keeps the stored dtype (a float32 file gives float32
blocks, never a float64 copy); any other stored type is refused.  Labels are
float64 in both.

Every task written or read passes :func:`hpcmtl.taskdata.check_task` (the
checks in-memory tasks get too), and every row range read is fingerprinted
(:mod:`hpcmtl.store.fingerprints`) in the same pass.
"""
from __future__ import annotations

import os

import h5py
import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from ..taskdata import (FLOAT32_CHUNK_VALUES, TaskBlock, all_finite, check_name, check_task, float32_overflow,
                        float32_overflow_error, task_means as _task_means)
from .atomic import atomic_h5
from .fingerprints import MASK64, fingerprint_hex, fingerprint_rows
from .hdf5 import (FORMAT_VERSION, STREAM_FORMAT, TASKS_FORMAT, TRUTH, OpenFile, duplicate_name, file_format, is_hdf5,
                   open_read, write_array)
from .packed import LAYOUTS, PACKED_VERSION, PackedRows, layout_for, write_packed

FEATURE_DTYPES = ("float64", "float32")

_TABLE = "task_table"
_TASKS = "tasks"
_PREPROCESSING = "preprocessing"
LABEL_VALUES_SHOWN = 10         # data info counts each label value of a task with at most this many whole values


def _task_group(i: int) -> str:
    return f"{_TASKS}/{i:06d}"


def write_tasks(path, Xs, ys, names=None, truth=None, attrs=None, force=True, preprocessing=None, float32=False,
                layout="auto"):
    """Write a task dataset.

    Parameters
    ----------
    Xs : list of (n_i x d) dense arrays or sparse matrices (any sparse -> CSR storage)
    ys : list of (n_i,) label arrays
    names : task names (default ``task0``, ``task1``, ...)
    truth : optional dict of arrays (ground truth of synthetic data)
    attrs : optional dict of extra root attributes (strings / numbers)
    preprocessing : optional dict of arrays (e.g. the standardization applied)
    float32 : store the feature values as float32 (root attribute ``dtype``);
        a finite value beyond float32's range is refused
    layout : "groups" (a group a task), "packed" (every task's rows in one set of datasets, :mod:`.packed`)
        or "auto" (packed from :data:`.packed.PACKED_MIN_TASKS` tasks on)
    """
    path = os.fspath(path)
    if len(Xs) != len(ys) or len(Xs) == 0:
        raise InputError(f"{path}: need one label vector per task and at least one task")
    names = [str(n) for n in (names if names is not None else [f"task{i}" for i in range(len(Xs))])]
    if len(names) != len(Xs):
        raise InputError(f"{path}: {len(names)} task names for {len(Xs)} tasks")
    for i, name in enumerate(names):
        check_name(name, f"{path}: task #{i}")
    dup = duplicate_name(names)
    if dup:
        raise InputError(f"{path}: task name '{dup[0]}' is used by tasks #{dup[1]} and #{dup[2]} "
                         f"(task names must be unique)")
    storage = "csr" if any(sp.issparse(X) for X in Xs) else "dense"
    layout = layout_for(layout, len(Xs))
    dtype = np.float32 if float32 else np.float64
    d = None
    mats = []
    for i, (X, y) in enumerate(zip(Xs, ys)):
        X = sp.csr_matrix(X, dtype=np.float64) if storage == "csr" else np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64).reshape(-1) if np.ndim(y) <= 2 else np.asarray(y)
        check_task(path, i, names[i], X, y, d)
        if float32:
            big = float32_overflow(X)
            if big is not None:
                raise InputError(f"{path}: task '{names[i]}' (#{i}): field 'X': row {big[0]}: {big[1]:.3g} does "
                                 f"not fit float32; rescale the features or write float64")
            X = X.astype(dtype)
        d = X.shape[1]
        mats.append((X, y))
    with atomic_h5(path, force=force, what="data file") as f:
        f.attrs["format"] = TASKS_FORMAT
        f.attrs["format_version"] = PACKED_VERSION if layout == "packed" else FORMAT_VERSION
        if layout == "packed":
            f.attrs["layout"] = layout
        f.attrs["n_tasks"] = len(mats)
        f.attrs["n_features"] = d
        f.attrs["storage"] = storage
        f.attrs["dtype"] = np.dtype(dtype).name
        for key, value in (attrs or {}).items():
            f.attrs[key] = value
        table = np.zeros(len(mats), dtype=[("name", h5py.string_dtype()), ("n_samples", "i8"), ("nnz", "i8"),
                                           ("fingerprint", h5py.string_dtype())])
        for i, (X, y) in enumerate(mats):
            if storage == "csr":
                X.sort_indices()
            if layout == "groups":
                g = f.create_group(_task_group(i))
                g.create_dataset("y", data=y)
                if storage == "csr":
                    write_array(g, "data", X.data)
                    write_array(g, "indices", X.indices.astype(np.int32))
                    write_array(g, "indptr", X.indptr.astype(np.int64))
                else:
                    write_array(g, "X", X)
            nnz = X.nnz if storage == "csr" else int(np.count_nonzero(X))
            table[i] = (names[i], X.shape[0], nnz, fingerprint_hex(*fingerprint_rows(X, y, 0, d)))
        if layout == "packed":
            write_packed(f, mats, storage)
        f.create_dataset(_TABLE, data=table)
        for group, arrays in ((TRUTH, truth), (_PREPROCESSING, preprocessing)):
            if arrays:
                g = f.create_group(group)
                for key, value in arrays.items():
                    g.create_dataset(key, data=np.asarray(value))


class TaskFile(OpenFile):
    """Read-only view of a task dataset; task data is read only on request.

    ``TaskFile(path)`` validates the format and reads the task table (names,
    sizes, nnz) without touching any task's data.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        # no chunk cache: reads take row ranges in order (a chunk at the edge of two ranges is read twice),
        # and HDF5's cache would hold chunk buffers beside each block read and in the worker's heap after its load
        self._f = open_read(self.path, TASKS_FORMAT, versions=(FORMAT_VERSION, PACKED_VERSION), rdcc_nbytes=0)
        f = self._f
        self._packed = None
        try:
            self.n_tasks = self._count(f.attrs["n_tasks"], "n_tasks")
            self.n_features = self._count(f.attrs["n_features"], "n_features")
            storage = f.attrs["storage"]
            self.storage = storage.decode() if isinstance(storage, bytes) else str(storage)
            table = f[_TABLE][()]
        except KeyError as exc:
            self.close()
            raise InputError(f"{self.path}: missing {exc.args[0]!s} (root attributes n_tasks, n_features, storage and dataset '{_TABLE}' are required)") from None
        if self.storage not in ("dense", "csr"):
            self.close()
            raise InputError(f"{self.path}: attribute 'storage' is {self.storage!r}, expected 'dense' or 'csr'")
        dtype = f.attrs.get("dtype", "float64")
        self.dtype = dtype.decode() if isinstance(dtype, bytes) else str(dtype)
        if self.dtype not in FEATURE_DTYPES:
            self.close()
            raise InputError(f"{self.path}: attribute 'dtype' is {self.dtype!r}, expected 'float64' or 'float32'")
        if len(table) != self.n_tasks:
            self.close()
            raise InputError(f"{self.path}: '{_TABLE}' has {len(table)} rows but n_tasks is {self.n_tasks}")
        try:
            self.names = [n.decode() if isinstance(n, bytes) else str(n) for n in table["name"]]
            self.n_samples = np.asarray(table["n_samples"], dtype=np.int64)
            self.nnz = np.asarray(table["nnz"], dtype=np.int64)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            self.close()
            raise InputError(f"{self.path}: '{_TABLE}' needs the columns name, n_samples and nnz ({exc})") from None
        try:                 # names reach messages and tables: one printable line each, as converters check
            for i, name in enumerate(self.names):
                check_name(name, f"{self.path}: '{_TABLE}' row {i}")
        except InputError:
            self.close()
            raise
        dup = duplicate_name(self.names)
        if dup:
            self.close()
            raise InputError(f"{self.path}: '{_TABLE}': task name '{dup[0]}' is used by tasks #{dup[1]} and #{dup[2]} "
                             f"(task names must be unique)")
        # written by write_tasks since fingerprints exist; None for older files
        self.fingerprints = ([v.decode() if isinstance(v, bytes) else str(v) for v in table["fingerprint"]]
                             if "fingerprint" in (table.dtype.names or ()) else None)
        # (start, stop, x_sum, y_sum) of every row range read, per task: fingerprints of what was read
        self.read_parts: dict = {}
        self.attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        self.layout = str(self.attrs.get("layout", "groups"))
        version = self.attrs["format_version"]
        if self.layout not in LAYOUTS or version != (PACKED_VERSION if self.layout == "packed" else FORMAT_VERSION):
            self.close()
            shown = repr(self.layout) if "layout" in self.attrs else "missing (the group layout)"
            raise InputError(f"{self.path}: attribute 'layout' is {shown} in a file of format_version {version}: "
                             f"expected the group layout (no 'layout', version {FORMAT_VERSION}) or 'packed' "
                             f"(version {PACKED_VERSION})")
        if self.layout == "packed":
            try:
                self._packed = PackedRows(f, self.path, self.n_samples, self.storage, self.n_features,
                                          _check_kind, self._check_dtype, LABEL_KINDS, INDEX_KINDS)
            except InputError:
                self.close()
                raise
            except (OSError, KeyError, ValueError, TypeError, AttributeError) as exc:
                self.close()
                raise InputError(f"{self.path}: group '/rows': cannot read it: {exc}") from None

    def _where(self, i):
        return f"{self.path}: task '{self.names[i]}' (#{i})"

    fresh_arrays = True     # read_block's arrays are its own (nothing else holds them): load_blocks may center in place

    def read_block(self, i: int, start: int = 0, stop: int | None = None, part: int = 0,
                   constant_column: float | None = None, float32: bool = False) -> TaskBlock:
        """Rows ``start:stop`` of task ``i`` as a validated ``TaskBlock``.

        ``constant_column`` (dense storage only): the rows are read straight into an ``n x (d + 1)`` array
        whose last column holds that value, the block :meth:`TaskBlock.augmented` would make, without a
        second copy of the rows in memory; validation and fingerprints see the file's d columns.
        ``float32`` (dense float64 files only; ``--float32``): the rows are rounded to float32 into their final
        array a file chunk at a time (never a float64 copy of the block), checked and fingerprinted as stored;
        a value beyond float32's range is refused in one line naming the row."""
        n = int(self.n_samples[i])
        stop = n if stop is None else stop
        rounded = float32 and self.storage == "dense" and self.dtype == "float64"
        X, y, x_sum = self._read(i, start, stop, constant_column, rounded)
        if x_sum is None:
            features = X if constant_column is None else X[:, :self.n_features]
            x_sum, y_sum = fingerprint_rows(features, y, start, self.n_features)
        else:
            y_sum = fingerprint_rows(np.zeros((0, self.n_features)), y, start, self.n_features)[1]
        self.read_parts.setdefault(i, {})[(start, stop)] = (x_sum, y_sum)
        return TaskBlock(i, self.names[i], n, start, X, y, part)

    def task_means(self, i: int, feature_map=None, folds=None, n_folds: int = 0):
        """``(mu, ybar)`` of task ``i``, streamed from the file in fixed chunks (:func:`hpcmtl.taskdata.task_means`);
        with ``folds``, the list of every fold's training-row means.

        Every rank gets the same bits; memory is one chunk; nothing is added to the read fingerprints.
        """
        return _task_means(lambda a, b: self._read_rows(i, a, b), int(self.n_samples[i]), feature_map,
                           folds=folds, n_folds=n_folds)

    def _read_rows(self, i: int, start: int, stop: int, constant_column: float | None = None):
        """Validated ``(X, y)`` of rows ``start:stop`` of task ``i`` (``constant_column``: see :meth:`read_block`)."""
        X, y, _ = self._read(i, start, stop, constant_column)
        return X, y

    def _read(self, i: int, start: int, stop: int, constant_column: float | None = None, rounded: bool = False):
        """``(X, y, x_sum)``: :meth:`_read_rows`, and with ``rounded`` (a dense float64 file) X rounded to float32
        with the fingerprint of the stored rows (``x_sum``; else None)."""
        where = self._where(i)
        try:
            if self._packed is not None:
                X, y, x_sum = self._read_packed(where, i, start, stop, constant_column, rounded)
            else:
                X, y, x_sum = self._read_group(where, i, start, stop, constant_column, rounded)
        except InputError:
            raise
        except (OSError, KeyError, ValueError, TypeError, AttributeError) as exc:
            raise InputError(f"{where}: cannot read task data: {exc}") from None
        y = np.asarray(y, dtype=np.float64)
        check_task(self.path, i, self.names[i], X if constant_column is None else X[:, :-1], y, self.n_features)
        return X, y, x_sum

    def _read_group(self, where, i, start, stop, constant_column, rounded):
        """:meth:`_read` from task ``i``'s own group (the group layout)."""
        n = int(self.n_samples[i])
        gname = _task_group(i)
        # each object looked up once (h5py's lookups by name are most of a small task's read: 10^5 tasks of
        # 20-40 rows took minutes); a missing name is None here, the same messages as before
        g = self._f.get(gname)
        if g is None:
            raise InputError(f"{where}: group '/{gname}' is missing")
        if not isinstance(g, h5py.Group):
            raise InputError(f"{where}: '/{gname}' must be a group, found a {type(g).__name__}")
        yd = g.get("y")
        if yd is None:
            raise InputError(f"{where}: field 'y' is missing")
        _check_kind(where, "y", yd, LABEL_KINDS)
        y = yd[start:stop]
        if yd.shape != (n,):
            raise InputError(f"{where}: field 'y': has shape {yd.shape}, task table says ({n},)")
        if self.storage == "dense":
            Xd = g.get("X")
            if Xd is None:
                raise InputError(f"{where}: field 'X' is missing")
            if not isinstance(Xd, h5py.Dataset):
                raise InputError(f"{where}: field 'X' must be a dataset, found a {type(Xd).__name__}")
            shape = Xd.shape
            if len(shape) != 2 or shape[0] != n:
                raise InputError(f"{where}: field 'X': has shape {shape}, task table says {n} rows")
            self._check_dtype(where, "X", Xd)
            X, x_sum = self._dense_rows(where, Xd, start, stop, 0, constant_column, rounded)
            return X, y, x_sum
        fields = {}
        for field_name in ("data", "indices", "indptr"):
            fields[field_name] = g.get(field_name)
            if fields[field_name] is None:
                raise InputError(f"{where}: field '{field_name}' is missing")
            if not isinstance(fields[field_name], h5py.Dataset):
                raise InputError(f"{where}: field '{field_name}' must be a dataset, found a "
                                 f"{type(fields[field_name]).__name__}")
        dd, idd, ipd = fields["data"], fields["indices"], fields["indptr"]
        _check_kind(where, "indptr", ipd, INDEX_KINDS)
        _check_kind(where, "indices", idd, INDEX_KINDS)
        self._check_dtype(where, "data", dd)
        indptr = ipd[start:stop + 1].astype(np.int64)
        if indptr.shape[0] != stop - start + 1:
            raise InputError(f"{where}: field 'indptr': has {ipd.shape[0]} entries, expected {n + 1}")
        return self._csr_rows(where, indptr, dd, idd, 0), y, None

    def _read_packed(self, where, i, start, stop, constant_column, rounded):
        """:meth:`_read` from the packed rows (:mod:`.packed`): a small range out of the window of rows, a large
        one straight from the datasets as the group layout reads it."""
        rows = self._packed
        lo, hi = rows.span(i, start, stop)
        if rows.large(lo, hi):
            y = rows.labels(lo, hi)
            if self.storage == "dense":
                X, x_sum = self._dense_rows(where, rows.ds["X"], lo, hi, lo - start, constant_column, rounded)
                return X, y, x_sum
            indptr = rows.ds["indptr"][lo:hi + 1].astype(np.int64)
            return self._csr_rows(where, indptr, rows.ds["data"], rows.ds["indices"], 0), y, None
        y, X = rows.rows(lo, hi)
        if self.storage == "csr":
            indptr, data, indices, base = X
            return self._csr_rows(where, indptr, data, indices, base, copy=True), y, None
        x_sum = None
        d = self.n_features
        if rounded:          # checked and hashed as stored, then rounded (as _read_rounded does a chunk)
            if not all_finite(X):
                raise InputError(f"{where}: field 'X': contains NaN or Inf")
            big = float32_overflow(X)
            if big is not None:
                raise float32_overflow_error(where, start + big[0], big[1])
            x_sum = fingerprint_rows(X, np.zeros(0), start, d)[0] & MASK64
            out = np.empty((hi - lo, d + (constant_column is not None)), dtype=np.float32)
        elif constant_column is not None:
            out = np.empty((hi - lo, d + 1), dtype=X.dtype)
        else:
            return X.copy(), y, None
        out[:, :d] = X
        if constant_column is not None:
            out[:, -1] = constant_column
        return out, y, x_sum

    def _dense_rows(self, where, Xd, lo, hi, base, constant_column, rounded):
        """``(X, x_sum)``: rows ``lo:hi`` of the dense dataset ``Xd`` (a task's rows from ``base`` on)."""
        if rounded:
            return self._read_rounded(where, Xd, lo, hi, constant_column, base)
        if constant_column is None:
            return Xd[lo:hi], None
        X = np.empty((hi - lo, Xd.shape[1] + 1), dtype=Xd.dtype)
        if hi > lo:
            Xd.read_direct(X, np.s_[lo:hi], np.s_[:, :Xd.shape[1]])
        X[:, -1] = constant_column
        return X, None

    def _csr_rows(self, where, indptr, data, indices, base, copy=False):
        """A CSR block from its row pointer ``indptr`` (positions in ``data`` / ``indices`` plus ``base``), checked:
        the pointer ordered and within the arrays, every column index within the features."""
        lo, hi = int(indptr[0]) - base, int(indptr[-1]) - base
        if np.any(np.diff(indptr) < 0) or lo < 0 or hi > data.shape[0] or hi > indices.shape[0]:
            raise InputError(f"{where}: field 'indptr': not a valid CSR row pointer")
        values, columns = data[lo:hi], indices[lo:hi]
        if copy:                      # views of the window: the block's arrays are its own
            values, columns = values.copy(), columns.copy()
        if columns.size and (columns.min() < 0 or columns.max() >= self.n_features):
            raise InputError(f"{where}: field 'indices': column index outside 0..{self.n_features - 1}")
        return sp.csr_matrix((values, columns, indptr - indptr[0]), shape=(indptr.shape[0] - 1, self.n_features))

    def _read_rounded(self, where, dataset, start, stop, constant_column, base=0):
        """Rows ``start:stop`` of a float64 ``dataset`` as float32 (``+ constant_column``) and the stored rows'
        fingerprint sum, through one float64 buffer of a file chunk's rows (about 1 MB): each piece is checked
        (finite, within float32), hashed and rounded into the final array.  ``base``: the dataset's row of the
        task's first row (the packed layout's offset; rows and the fingerprint count from the task's)."""
        d = dataset.shape[1]
        X = np.empty((stop - start, d + (constant_column is not None)), dtype=np.float32)
        step = dataset.chunks[0] if dataset.chunks else max(1, FLOAT32_CHUNK_VALUES // max(1, d))
        buffer = np.empty((min(step, stop - start), d))
        x_sum, a = 0, start
        while a < stop:
            b = min(stop, (a // step + 1) * step)         # to the next chunk boundary of the file
            piece = buffer[:b - a]
            dataset.read_direct(piece, np.s_[a:b], np.s_[0:b - a])
            if not all_finite(piece):
                raise InputError(f"{where}: field 'X': contains NaN or Inf")
            big = float32_overflow(piece)
            if big is not None:
                raise float32_overflow_error(where, a - base + big[0], big[1])
            x_sum += fingerprint_rows(piece, np.zeros(0), a - base, self.n_features)[0]
            X[a - start:b - start, :d] = piece
            a = b
        if constant_column is not None:
            X[:, -1] = constant_column
        return X, x_sum & MASK64

    def _check_dtype(self, where, field_name, dataset):
        """The stored feature values are of the file's ``dtype`` (float64 or float32), before any is read."""
        if dataset.dtype != np.dtype(self.dtype):
            raise InputError(f"{where}: field '{field_name}': stored as {dataset.dtype}, the file's dtype is "
                             f"{self.dtype} (task files hold float64 or float32 features)")

    def read_labels(self, i: int) -> np.ndarray:
        """Task ``i``'s labels only (no X): a validation split stratified over a task cut into several blocks."""
        y = self._labels(i)
        if y is None:
            raise InputError(f"{self._where(i)}: field 'y' is missing")
        return np.asarray(y, dtype=np.float64)

    def _labels(self, i: int):
        """Task ``i``'s stored labels (their kind checked), or None when its group has none (group layout)."""
        if self._packed is not None:
            return self._packed.labels(*self._packed.span(i, 0, int(self.n_samples[i])))
        g = self._f.get(_task_group(i))
        if g is None or "y" not in g:
            return None
        _check_kind(self._where(i), "y", g["y"], LABEL_KINDS)
        return g["y"][()]

    def read_fingerprints(self) -> dict:
        """{task index: (start, stop, x_sum, y_sum) list} of the rows read so far (see :func:`combine_fingerprints`)."""
        return {i: [(a, b, xs, ys) for (a, b), (xs, ys) in parts.items()] for i, parts in self.read_parts.items()}

    def _count(self, value, name) -> int:
        """A root attribute that counts (tasks, features): an integer >= 1 (6.7, 'three', 0, True are refused)."""
        value = value.item() if isinstance(value, np.generic) else value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.close()
            raise InputError(f"{self.path}: attribute '{name}' is {value!r}, expected an integer >= 1")
        return value

    def read_task(self, i: int) -> TaskBlock:
        return self.read_block(i)

    def read_truth(self) -> dict:
        if TRUTH not in self._f:
            return {}
        return {k: v[()] for k, v in self._f[TRUTH].items()}

    def info(self) -> dict:
        """Summary for ``hpcmtl data info`` (reads labels, never X)."""
        tasks = []
        for i in range(self.n_tasks):
            entry = {"name": self.names[i], "n_samples": int(self.n_samples[i]), "nnz": int(self.nnz[i])}
            y = self._labels(i)
            if y is not None:
                values, counts = np.unique(y[np.isfinite(y)], return_counts=True) if y.size else ((), ())
                if 0 < len(values) <= LABEL_VALUES_SHOWN and np.all(values == np.round(values)):
                    # a 0/1 (or class-id) file shows its counts, not just "mean 0.5": 0/1 labels then read
                    # as such before a hinge or logistic run refuses them
                    entry["label_counts"] = {f"{v:g}": int(c) for v, c in zip(values, counts)}
                if y.size and np.all((y == 1) | (y == -1)):
                    entry["positive_fraction"] = float(np.mean(y == 1))
                elif y.size:
                    with np.errstate(all="ignore"):         # inf labels: the figures say inf / nan, no warning
                        entry["y_mean"] = float(np.mean(y))
                        entry["y_std"] = float(np.std(y))
            tasks.append(entry)
        total = int(self.n_samples.sum())
        density = float(self.nnz.sum()) / max(1, total * self.n_features)
        return {"path": self.path, "n_tasks": self.n_tasks, "n_features": self.n_features,
                "storage": self.storage, "dtype": self.dtype, "layout": self.layout,
                "n_samples": total, "nnz": int(self.nnz.sum()),
                "density": density, "has_truth": TRUTH in self._f, "scaling": self.scaling(), "tasks": tasks}

    def scaling(self) -> str:
        """What scaling the features have had: the ``scaling`` attribute ``data standardize`` writes, else
        'standardized' for a file with preprocessing arrays from before that attribute, else 'none'."""
        if "scaling" in self.attrs:
            return str(self.attrs["scaling"])
        return "standardized" if _PREPROCESSING in self._f else "none"


LABEL_KINDS = "biuf"       # labels are real numbers: strings would be parsed as numbers, complex lose their imaginary part
INDEX_KINDS = "iu"         # CSR indices and row pointers: float ones would be truncated


def _check_kind(where, field_name, dataset, kinds):
    """A task's dataset holds numbers of ``kinds`` (NumPy dtype kinds), before any value is read or converted:
    one line naming the file, the task and the field otherwise."""
    if not isinstance(dataset, h5py.Dataset):
        raise InputError(f"{where}: field '{field_name}' must be a dataset, found a {type(dataset).__name__}")
    if dataset.dtype.kind not in kinds:
        what = "integers" if kinds == INDEX_KINDS else "real numbers"
        raise InputError(f"{where}: field '{field_name}': stored as {dataset.dtype}, expected {what}")


def read_all_tasks(path):
    """Every task of a file as full blocks (for single-process tools and tests)."""
    with TaskFile(path) as tf:
        return [tf.read_task(i) for i in range(tf.n_tasks)], tf.names, tf.n_features


def load_tasks(path):
    """``(Xs, ys, names)`` of a task dataset: the public loader behind :func:`hpcmtl.load_tasks`.

    ``Xs[i]`` is task i's n_i x d rows (a NumPy array, or a SciPy CSR matrix for a
    CSR file; float32 for a float32 file), ``ys[i]`` its n_i labels (float64),
    ``names[i]`` its name: what the estimators' ``fit(Xs, ys)`` takes.  Every task
    is checked as training checks it; another kind of file is one InputError
    naming the reader that takes it.
    """
    path = os.fspath(path)
    if os.path.isfile(path) and not is_hdf5(path):
        raise InputError(f"{path}: is not an hpcmtl task dataset (not HDF5): 'hpcmtl data inspect {path}' names "
                         f"the command that converts it")
    if file_format(path) == STREAM_FORMAT:
        raise InputError(f"{path}: is an online stream ('{STREAM_FORMAT}'): read it with hpcmtl.load_stream")
    blocks, names, _ = read_all_tasks(path)
    return [b.X for b in blocks], [b.y for b in blocks], list(names)
