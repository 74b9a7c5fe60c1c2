"""HDF5 files of hpcmtl: task datasets, result files and checkpoints.

Every HDF5 path string of the package lives in this module.

Task dataset (format ``hpcmtl-tasks``, version 1)::

    /                 attrs: format, format_version, n_tasks, n_features, storage
    /task_table       compound (name, n_samples, nnz), one row per task
    /tasks/000000/y   labels (n_i,)
    /tasks/000000/X   dense (n_i x d)                 when storage == "dense"
    /tasks/000000/{data,indices,indptr}               when storage == "csr"
    /truth/...        optional ground truth of synthetic data (W, correlation, ...)

Result file (format ``hpcmtl-result``): ``/model/W`` (d x m), ``/model/intercept``
(m; files written before intercepts existed read as zeros), ``/model/Sigma`` (m x m), ``/history/<column>`` and root attributes ``config`` (JSON),
``hpcmtl_version``, ``n_ranks``.  Checkpoints (format ``hpcmtl-checkpoint``)
hold everything needed to continue bit for bit.

Every file is written under a temporary name in the target directory and
renamed into place only when complete, so a killed writer never leaves a
half-written file under the final name.  HDF5 writes through a guarded raw
file (h5py's ``fileobj`` driver): the first operating-system error (disk full,
quota, file size limit) is kept and later writes are dropped, so the HDF5
library never sees a failed write (it used to crash there); the error then
ends the write with one line, ``cannot write checkpoint PATH: no space left on
device``, the temporary removed and the previous file untouched.  A temporary
orphaned by a killed writer is removed by the next write to the same path
(a live writer holds a lock on its temporary, so it is never taken).

Content fingerprints: every task's arrays (``X`` or the CSR arrays, and ``y``)
have a 128-bit fingerprint, stored in the task table's ``fingerprint`` column
when the file is written and computed again, in the same pass, whenever a
task's rows are read (:func:`fingerprint_rows`).  It is a sum over elements of
a mixed hash of (row, column, value bits), so the fingerprints of row ranges
read on different ranks add up to the task's (a split task is verified too).
Files written before fingerprints existed load as before: the fingerprint is
computed from what is read (see :mod:`hpcmtl.checkpoint`).

Feature dtype: a task file stores ``X`` (dense, or the CSR ``data``) as float64
or, written with ``float32=True`` (``hpcmtl data ... --float32``), as float32;
the root attribute ``dtype`` says which (absent: float64, files written before
it existed).  Reading keeps the stored dtype (a float32 file gives float32
blocks, never a float64 copy); any other stored type is refused.  A float32
element is hashed from its 32 IEEE bits tagged with a NaN pattern in the upper
half (``_F32_TAG``), so its fingerprint differs from the same values stored as
float64 (whose finite elements never carry those bits): a checkpoint resume
cannot mistake a float32 file for its float64 original.  Labels are float64
in both.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import re
import tempfile

import h5py
import numpy as np
import scipy.sparse as sp

from .errors import InputError
from .taskdata import (FLOAT32_CHUNK_VALUES, TaskBlock, float32_overflow, float32_overflow_error,
                       task_means as _task_means)

TASKS_FORMAT = "hpcmtl-tasks"
RESULT_FORMAT = "hpcmtl-result"
CHECKPOINT_FORMAT = "hpcmtl-checkpoint"
STREAM_FORMAT = "hpcmtl-stream"
FORMAT_VERSION = 1

_TABLE = "task_table"
_TASKS = "tasks"
_TRUTH = "truth"
_PREPROCESSING = "preprocessing"
_FINGERPRINTS = "fingerprints"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _task_group(i: int) -> str:
    return f"{_TASKS}/{i:06d}"


# ---------------------------------------------------------------------------
# Atomic writing
# ---------------------------------------------------------------------------
class WriteError(InputError):
    """An output file could not be written (disk full, quota, permissions): one line, exit 2."""


def write_error(what: str, path, exc: OSError) -> WriteError:
    """``cannot write checkpoint PATH: no space left on device`` (the reason as the OS gives it)."""
    reason = exc.strerror or (errno.errorcode.get(exc.errno, "") if exc.errno else "") or str(exc)
    return WriteError(f"cannot write {what} {os.fspath(path)}: {reason[:1].lower() + reason[1:]}")


class _GuardedFile(io.RawIOBase):
    """The raw file under h5py's ``fileobj`` driver while a temporary is written.

    The first ``OSError`` of a write, truncate or sync is kept in ``error`` and
    every later write is dropped (reported as done), so the HDF5 library never
    sees a failed write -- on a full disk it used to crash in its cleanup.
    The writer holds an exclusive ``flock`` on the file while it lives, which
    tells :func:`remove_stale_temporaries` the temporary is not an orphan.
    """

    def __init__(self, fd: int):
        super().__init__()
        self.fd = fd
        self.pos = 0
        self.error: OSError | None = None
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def readable(self):
        return True

    def writable(self):
        return True

    def seekable(self):
        return True

    def seek(self, pos, whence=0):
        if whence == os.SEEK_SET:
            self.pos = pos
        elif whence == os.SEEK_CUR:
            self.pos += pos
        else:
            self.pos = os.fstat(self.fd).st_size + pos
        return self.pos

    def tell(self):
        return self.pos

    def readinto(self, buffer):
        view = memoryview(buffer).cast("B")
        data = os.pread(self.fd, len(view), self.pos)
        if self.error is not None and len(data) < len(view):
            data += bytes(len(view) - len(data))     # past a failed write: zeros, never a short read
        view[:len(data)] = data
        self.pos += len(data)
        return len(data)

    def write(self, buffer):
        view = memoryview(buffer).cast("B")
        if self.error is None:
            try:
                done = 0
                while done < len(view):
                    done += os.pwrite(self.fd, view[done:], self.pos + done)
            except OSError as exc:
                self.error = exc
        self.pos += len(view)
        return len(view)

    def truncate(self, size=None):
        size = self.pos if size is None else size
        if self.error is None:
            try:
                os.ftruncate(self.fd, size)
            except OSError as exc:
                self.error = exc
        return size

    def flush(self):
        pass

    def sync(self):
        """fsync: a network file system may report a full disk only here."""
        if self.error is None:
            try:
                os.fsync(self.fd)
            except OSError as exc:
                self.error = exc

    def close(self):
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            try:
                os.close(fd)
            except OSError as exc:
                self.error = self.error or exc
        super().close()


def _temporary_pattern(path: str):
    """Names of the temporaries of ``path``: ``.NAME.XXXXXXXX.tmp`` (mkstemp's 8 random characters)."""
    return re.compile(r"\." + re.escape(os.path.basename(path)) + r"\.[A-Za-z0-9_]{8}\.tmp")


def remove_stale_temporaries(path) -> list:
    """Remove temporaries of ``path`` left by killed writers; return their names.

    A temporary whose writer still runs is locked (``flock``) and kept.  Where
    the file system has no locks nothing is removed.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    pattern = _temporary_pattern(path)
    removed = []
    try:
        names = [n for n in os.listdir(directory) if pattern.fullmatch(n)]
    except OSError:
        return removed
    for name in names:
        full = os.path.join(directory, name)
        try:
            fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)    # fails while its writer lives
            os.unlink(full)
            removed.append(name)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def _new_temporary(path: str, what: str):
    """``(fd, name)`` of a new temporary file beside ``path`` (after removing those of killed writers)."""
    directory = os.path.dirname(os.path.abspath(path))
    remove_stale_temporaries(path)
    try:
        return tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise write_error(what, path, exc) from None


def _finished_mode() -> int:
    """The permission bits of a finished output: 0666 under the process umask (mkstemp creates 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_h5(path: str, force: bool = True, what: str = "output file"):
    """Open a temporary HDF5 file beside ``path``; rename it into place on success.

    On any exception the temporary file is removed and ``path`` is untouched.
    An operating-system error while writing (disk full, quota, file size
    limit) raises :class:`WriteError` naming ``what`` and ``path``.
    """
    path = os.fspath(path)
    check_writable(path, force)
    fd, tmp = _new_temporary(path, what)
    raw = _GuardedFile(fd)
    try:
        with h5py.File(raw, "w") as f:
            yield f
        raw.sync()
        with contextlib.suppress(OSError):
            os.fchmod(raw.fd, _finished_mode())     # mkstemp creates 0600; finished files follow the umask
        raw.close()
        if raw.error is not None:
            raise write_error(what, path, raw.error)
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise write_error(what, path, exc) from None
    except BaseException as exc:
        raw.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if raw.error is not None and isinstance(exc, Exception) and not isinstance(exc, WriteError):
            raise write_error(what, path, raw.error) from None     # the failed write is the cause
        raise


@contextlib.contextmanager
def atomic_output(path, what: str = "output file"):
    """A temporary path beside ``path`` for any writer (figures, CSV); renamed into place on success.

    Same rules as :func:`atomic_h5`: temporaries of killed writers are removed
    first, the temporary is locked while written, an ``OSError`` becomes a
    one-line :class:`WriteError` and nothing is left under either name.
    """
    path = os.fspath(path)
    fd, tmp = _new_temporary(path, what)
    lock = _GuardedFile(fd)                 # holds the lock; the writer opens the path itself
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, _finished_mode())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise write_error(what, path, exc) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        lock.close()


def check_writable(path: str, force: bool) -> None:
    """Refuse an output path early (before any work): a directory, exists without force, or unwritable."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected the name of an output file")
    if os.path.lexists(path) and not force:
        raise InputError(f"{path}: output file exists (use --force to overwrite)")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InputError(f"{path}: cannot write output: directory {directory} does not exist")
    if not os.access(directory, os.W_OK):
        raise InputError(f"{path}: cannot write output: directory {directory} is not writable")
    try:                  # root passes os.access everywhere: try for real (an unnamed file where supported)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise InputError(f"{path}: cannot write output: cannot create a file in {directory} "
                         f"({reason[:1].lower() + reason[1:]})") from None


def same_file(a, b) -> str | None:
    """How two paths name one file (None if they do not): same resolved path, or same (device, inode)."""
    a, b = os.fspath(a), os.fspath(b)
    if os.path.realpath(a) == os.path.realpath(b):
        if os.path.abspath(a) == os.path.abspath(b):
            return "same path"
        return "through a symbolic link" if os.path.islink(a) or os.path.islink(b) else "same resolved path"
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return None
    if (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino):
        return "a hard link"
    return None


def check_outputs(outputs, inputs=()) -> None:
    """Refuse, before any work, outputs that would destroy an input or each other.

    ``outputs``: ``(label, path, force)``; ``inputs``: ``(label, path)``
    (None paths are skipped).  Like ``cp a a``, an output that resolves to an
    input (same path, a symbolic link, a hard link) is refused whether or not
    ``force`` is given; then each output must be a writable file name
    (:func:`check_writable`).  One-line :class:`InputError` naming both paths.
    """
    outputs = [(label, os.fspath(p), force) for label, p, force in outputs if p is not None]
    inputs = [(label, os.fspath(p)) for label, p in inputs if p is not None]
    for k, (label, path, _) in enumerate(outputs):
        for in_label, in_path in inputs:
            how = same_file(path, in_path)
            if how:
                detail = "" if how == "same path" else f" ({how})"
                raise InputError(f"{label} {path} is the same file as {in_label} {in_path}{detail}: "
                                 f"refusing to overwrite an input")
        for other_label, other, _ in outputs[:k]:
            how = same_file(path, other)
            if how:
                detail = "" if how == "same path" else f" ({how})"
                raise InputError(f"{label} {path} is the same file as {other_label} {other}{detail}: "
                                 f"two outputs cannot share a file")
    for label, path, force in outputs:
        check_writable(path, force)


def _open_read(path: str, expected_format: str, **options) -> h5py.File:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    try:
        f = h5py.File(path, "r", **options)
    except OSError:
        raise InputError(f"{path}: not an HDF5 file") from None
    fmt = f.attrs.get("format")
    if isinstance(fmt, bytes):
        fmt = fmt.decode("utf-8", "replace")
    if not isinstance(fmt, str) or fmt != expected_format:
        f.close()
        raise InputError(f"{path}: attribute 'format' is {fmt!r}, expected {expected_format!r}")
    # a number equal to FORMAT_VERSION; text ('one'), arrays and other versions are refused
    version = f.attrs.get("format_version")
    version = version.item() if isinstance(version, np.generic) else version
    if isinstance(version, bool) or not isinstance(version, (int, float)) or version != FORMAT_VERSION:
        f.close()
        shown = "missing" if version is None else repr(version.tolist() if isinstance(version, np.ndarray) else version)
        raise InputError(f"{path}: attribute 'format_version' is {shown}, this hpcmtl reads version {FORMAT_VERSION}")
    return f


# ---------------------------------------------------------------------------
# Task datasets
# ---------------------------------------------------------------------------
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_Y_SALT = np.uint64(0xD6E8FEB86659FD93)
_MASK = (1 << 64) - 1
_F32_TAG = np.uint64(0x7FF8F32F00000000)     # float32 bits sit in the low half under a float64 NaN pattern
FEATURE_DTYPES = ("float64", "float32")
_CHUNK = 1 << 16          # elements hashed (or checked) at a time: temporaries of 0.5 MB, whatever the block


def _mix(z):
    """splitmix64's finalizer, in place on a uint64 array (arithmetic wraps modulo 2**64)."""
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


def _element_sum(rows, cols, bits, n_features) -> int:
    """sum_e mix((row_e * d + col_e) * golden ^ bits_e) mod 2**64 over equally long uint64 arrays."""
    key = rows * np.uint64(n_features) + cols      # broadcasts (rows x 1) + (1 x d) for dense blocks
    key *= _GOLDEN
    key ^= bits
    return int(_mix(key).sum(dtype=np.uint64))


def fingerprint_rows(X, y, row_start: int, n_features: int):
    """Additive content fingerprint of rows ``row_start ..`` of a task: ``(x_sum, y_sum)``.

    Every stored element of ``X`` (dense: all of them; CSR: the stored
    entries) and every label contributes a 64-bit mixed hash of (global row,
    column, IEEE bits) to a sum modulo 2**64, so the sums of row ranges add up
    to the task's (:func:`fingerprint_hex`).  About 1 GB/s, in chunks.
    """
    total = 0
    if sp.issparse(X):
        data = X.data
        indices, indptr = np.asarray(X.indices), np.asarray(X.indptr, dtype=np.int64)
        for s in range(0, data.size, _CHUNK):
            e = slice(s, s + _CHUNK)
            stop = min(s + _CHUNK, data.size)
            r0 = int(np.searchsorted(indptr, s, side="right")) - 1             # rows holding entries s..stop-1
            r1 = int(np.searchsorted(indptr, stop - 1, side="right"))
            counts = np.diff(np.clip(indptr[r0:r1 + 1], s, stop))
            rows = np.repeat(np.arange(row_start + r0, row_start + r1, dtype=np.uint64), counts)
            total += _element_sum(rows, indices[e].astype(np.uint64), _value_bits(data[e]), n_features)
    else:
        X = np.asarray(X)
        cols = np.arange(X.shape[1], dtype=np.uint64)
        step = max(1, _CHUNK // max(1, X.shape[1]))
        for s in range(0, X.shape[0], step):
            b = _value_bits(X[s:s + step])
            rows = np.arange(row_start + s, row_start + s + b.shape[0], dtype=np.uint64)[:, None]
            total += _element_sum(rows, cols[None, :], b, n_features)
    ybits = np.ascontiguousarray(y, dtype=np.float64).view(np.uint64)
    key = np.arange(row_start, row_start + ybits.size, dtype=np.uint64)
    key *= _GOLDEN
    key += _Y_SALT
    key ^= ybits
    return total & _MASK, int(_mix(key).sum(dtype=np.uint64))


def _value_bits(values) -> np.ndarray:
    """uint64 keys of feature values: float64 bits, or float32 bits under ``_F32_TAG``."""
    values = np.asarray(values)
    if values.dtype == np.float32:
        return np.ascontiguousarray(values).view(np.uint32).astype(np.uint64) | _F32_TAG
    return np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)


def fingerprint_hex(x_sum: int, y_sum: int) -> str:
    """The fingerprint as 32 hex digits (features, then labels)."""
    return f"{x_sum & _MASK:016x}{y_sum & _MASK:016x}"


def combine_fingerprints(parts, n_rows: int) -> str | None:
    """A task's fingerprint from ``(start, stop, x_sum, y_sum)`` of row ranges covering ``0..n_rows`` once.

    None when the ranges do not cover the task exactly (nothing to compare with).
    """
    whole = [p for p in parts if p[0] == 0 and p[1] == n_rows]
    if whole:                       # the task was read in one piece (perhaps besides its blocks)
        return fingerprint_hex(whole[0][2], whole[0][3])
    x = y = pos = 0
    for start, stop, xs, ys in sorted(parts):
        if start != pos:
            return None
        x, y, pos = x + xs, y + ys, stop
    return fingerprint_hex(x, y) if pos == n_rows else None


def duplicate_name(names):
    """(name, first index, second index) of the first repeated task name, or None."""
    seen = {}
    for i, name in enumerate(names):
        if name in seen:
            return name, seen[name], i
        seen[name] = i
    return None


def _array(group, name, data):
    """A dataset; large arrays are chunked by rows and gzip-1 compressed (readable by h5dump)."""
    data = np.asarray(data)
    if data.nbytes > (1 << 20):
        rows = max(1, (1 << 20) // max(1, data[:1].nbytes))
        chunks = (min(rows, data.shape[0]),) + data.shape[1:]
        return group.create_dataset(name, data=data, chunks=chunks, compression="gzip", compression_opts=1,
                                    shuffle=True)
    return group.create_dataset(name, data=data)


def _all_finite(values) -> bool:
    """No NaN or Inf in ``values``, checked ``_CHUNK`` at a time (no mask of the whole block in memory)."""
    values = np.asarray(values)
    if values.ndim == 2:            # by rows: also a view of some columns of a larger array, never copied whole
        step = max(1, _CHUNK // max(1, values.shape[1]))
        return all(np.isfinite(values[s:s + step]).all() for s in range(0, values.shape[0], step))
    flat = values.reshape(-1)
    return all(np.isfinite(flat[s:s + _CHUNK]).all() for s in range(0, flat.size, _CHUNK))


def _check_task(path, i, name, X, y, n_features):
    where = f"{path}: task '{name}' (#{i})"
    n = X.shape[0]
    if n == 0:
        raise InputError(f"{where}: field 'y': empty task (0 samples)")
    if X.ndim != 2:
        raise InputError(f"{where}: field 'X': expected a 2-D matrix, got shape {X.shape}")
    if n_features is not None and X.shape[1] != n_features:
        raise InputError(f"{where}: field 'X': has {X.shape[1]} features, other tasks have {n_features}")
    if y.ndim != 1 or y.shape[0] != n:
        raise InputError(f"{where}: field 'y': has shape {y.shape}, expected ({n},)")
    if not _all_finite(X.data if sp.issparse(X) else X):
        raise InputError(f"{where}: field 'X': contains NaN or Inf")
    if not np.all(np.isfinite(y)):
        raise InputError(f"{where}: field 'y': contains NaN or Inf")


def write_tasks(path, Xs, ys, names=None, truth=None, attrs=None, force=True, preprocessing=None, float32=False):
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
    """
    path = os.fspath(path)
    if len(Xs) != len(ys) or len(Xs) == 0:
        raise InputError(f"{path}: need one label vector per task and at least one task")
    names = [str(n) for n in (names if names is not None else [f"task{i}" for i in range(len(Xs))])]
    if len(names) != len(Xs):
        raise InputError(f"{path}: {len(names)} task names for {len(Xs)} tasks")
    dup = duplicate_name(names)
    if dup:
        raise InputError(f"{path}: task name '{dup[0]}' is used by tasks #{dup[1]} and #{dup[2]} "
                         f"(task names must be unique)")
    storage = "csr" if any(sp.issparse(X) for X in Xs) else "dense"
    dtype = np.float32 if float32 else np.float64
    d = None
    mats = []
    for i, (X, y) in enumerate(zip(Xs, ys)):
        X = sp.csr_matrix(X, dtype=np.float64) if storage == "csr" else np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64).reshape(-1) if np.ndim(y) <= 2 else np.asarray(y)
        _check_task(path, i, names[i], X, y, d)
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
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["n_tasks"] = len(mats)
        f.attrs["n_features"] = d
        f.attrs["storage"] = storage
        f.attrs["dtype"] = np.dtype(dtype).name
        for key, value in (attrs or {}).items():
            f.attrs[key] = value
        table = np.zeros(len(mats), dtype=[("name", h5py.string_dtype()), ("n_samples", "i8"), ("nnz", "i8"),
                                           ("fingerprint", h5py.string_dtype())])
        for i, (X, y) in enumerate(mats):
            g = f.create_group(_task_group(i))
            g.create_dataset("y", data=y)
            if storage == "csr":
                X.sort_indices()
                _array(g, "data", X.data)
                _array(g, "indices", X.indices.astype(np.int32))
                _array(g, "indptr", X.indptr.astype(np.int64))
                nnz = X.nnz
            else:
                _array(g, "X", X)
                nnz = int(np.count_nonzero(X))
            table[i] = (names[i], X.shape[0], nnz, fingerprint_hex(*fingerprint_rows(X, y, 0, d)))
        f.create_dataset(_TABLE, data=table)
        for group, arrays in ((_TRUTH, truth), (_PREPROCESSING, preprocessing)):
            if arrays:
                g = f.create_group(group)
                for key, value in arrays.items():
                    g.create_dataset(key, data=np.asarray(value))


class _OpenFile:
    """An open HDF5 file that closes on ``close()`` or at the end of a ``with`` block."""

    def close(self):
        with contextlib.suppress(Exception):
            self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class TaskFile(_OpenFile):
    """Read-only view of a task dataset; task data is read only on request.

    ``TaskFile(path)`` validates the format and reads the task table (names,
    sizes, nnz) without touching any task's data.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        # no chunk cache: reads take row ranges in order (a chunk at the edge of two ranges is read twice);
        # HDF5's cache and its freed chunk buffers held 3-9 MB beside each block read and about 10 MB of a
        # worker's heap after its load (issue 14)
        self._f = _open_read(self.path, TASKS_FORMAT, rdcc_nbytes=0)
        f = self._f
        try:
            self.n_tasks = int(f.attrs["n_tasks"])
            self.n_features = int(f.attrs["n_features"])
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

    def task_index(self, name) -> int:
        if name in self.names:
            return self.names.index(name)
        raise InputError(f"{self.path}: no task named '{name}'")

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
        x_sum = None
        n = int(self.n_samples[i])
        where = self._where(i)
        gname = _task_group(i)
        if gname not in self._f:
            raise InputError(f"{where}: group '/{gname}' is missing")
        g = self._f[gname]
        try:
            if "y" not in g:
                raise InputError(f"{where}: field 'y' is missing")
            y = g["y"][start:stop]
            if g["y"].shape != (n,):
                raise InputError(f"{where}: field 'y': has shape {g['y'].shape}, task table says ({n},)")
            if self.storage == "dense":
                if "X" not in g:
                    raise InputError(f"{where}: field 'X' is missing")
                if g["X"].ndim != 2 or g["X"].shape[0] != n:
                    raise InputError(f"{where}: field 'X': has shape {g['X'].shape}, task table says {n} rows")
                self._check_dtype(where, "X", g["X"])
                if rounded:
                    X, x_sum = self._read_rounded(where, g["X"], start, stop, constant_column)
                elif constant_column is None:
                    X = g["X"][start:stop]
                else:
                    X = np.empty((stop - start, g["X"].shape[1] + 1), dtype=g["X"].dtype)
                    if stop > start:
                        g["X"].read_direct(X, np.s_[start:stop], np.s_[:, :g["X"].shape[1]])
                    X[:, -1] = constant_column
            else:
                for field_name in ("data", "indices", "indptr"):
                    if field_name not in g:
                        raise InputError(f"{where}: field '{field_name}' is missing")
                indptr = g["indptr"][start:stop + 1].astype(np.int64)
                if indptr.shape[0] != stop - start + 1:
                    raise InputError(f"{where}: field 'indptr': has {g['indptr'].shape[0]} entries, expected {n + 1}")
                lo, hi = int(indptr[0]), int(indptr[-1])
                if np.any(np.diff(indptr) < 0) or hi > g["data"].shape[0] or hi > g["indices"].shape[0]:
                    raise InputError(f"{where}: field 'indptr': not a valid CSR row pointer")
                self._check_dtype(where, "data", g["data"])
                data = g["data"][lo:hi]
                indices = g["indices"][lo:hi]
                if indices.size and (indices.min() < 0 or indices.max() >= self.n_features):
                    raise InputError(f"{where}: field 'indices': column index outside 0..{self.n_features - 1}")
                X = sp.csr_matrix((data, indices, indptr - lo), shape=(stop - start, self.n_features))
        except InputError:
            raise
        except (OSError, KeyError, ValueError, TypeError) as exc:
            raise InputError(f"{where}: cannot read task data: {exc}") from None
        y = np.asarray(y, dtype=np.float64)
        _check_task(self.path, i, self.names[i], X if constant_column is None else X[:, :-1], y, self.n_features)
        return X, y, x_sum

    def _read_rounded(self, where, dataset, start, stop, constant_column):
        """Rows ``start:stop`` of a float64 ``dataset`` as float32 (``+ constant_column``) and the stored rows'
        fingerprint sum, through one float64 buffer of a file chunk's rows (about 1 MB): each piece is checked
        (finite, within float32), hashed and rounded into the final array."""
        d = dataset.shape[1]
        X = np.empty((stop - start, d + (constant_column is not None)), dtype=np.float32)
        step = dataset.chunks[0] if dataset.chunks else max(1, FLOAT32_CHUNK_VALUES // max(1, d))
        buffer = np.empty((min(step, stop - start), d))
        x_sum, a = 0, start
        while a < stop:
            b = min(stop, (a // step + 1) * step)         # to the next chunk boundary of the file
            piece = buffer[:b - a]
            dataset.read_direct(piece, np.s_[a:b], np.s_[0:b - a])
            if not _all_finite(piece):
                raise InputError(f"{where}: field 'X': contains NaN or Inf")
            big = float32_overflow(piece)
            if big is not None:
                raise float32_overflow_error(where, a + big[0], big[1])
            x_sum += fingerprint_rows(piece, np.zeros(0), a, self.n_features)[0]
            X[a - start:b - start, :d] = piece
            a = b
        if constant_column is not None:
            X[:, -1] = constant_column
        return X, x_sum & _MASK

    def _check_dtype(self, where, field_name, dataset):
        """The stored feature values are of the file's ``dtype`` (float64 or float32), before any is read."""
        if dataset.dtype != np.dtype(self.dtype):
            raise InputError(f"{where}: field '{field_name}': stored as {dataset.dtype}, the file's dtype is "
                             f"{self.dtype} (task files hold float64 or float32 features)")

    def read_labels(self, i: int) -> np.ndarray:
        """Task ``i``'s labels only (no X): a validation split stratified over a task cut into several blocks."""
        g = self._f.get(_task_group(i))
        if g is None or "y" not in g:
            raise InputError(f"{self._where(i)}: field 'y' is missing")
        return np.asarray(g["y"][()], dtype=np.float64)

    def read_fingerprints(self) -> dict:
        """{task index: (start, stop, x_sum, y_sum) list} of the rows read so far (see :func:`combine_fingerprints`)."""
        return {i: [(a, b, xs, ys) for (a, b), (xs, ys) in parts.items()] for i, parts in self.read_parts.items()}

    def read_task(self, i: int) -> TaskBlock:
        return self.read_block(i)

    def read_truth(self) -> dict:
        if _TRUTH not in self._f:
            return {}
        return {k: v[()] for k, v in self._f[_TRUTH].items()}

    def info(self) -> dict:
        """Summary for ``hpcmtl data info`` (reads labels, never X)."""
        tasks = []
        for i in range(self.n_tasks):
            entry = {"name": self.names[i], "n_samples": int(self.n_samples[i]), "nnz": int(self.nnz[i])}
            g = self._f.get(_task_group(i))
            if g is not None and "y" in g:
                y = g["y"][()]
                if np.all((y == 1) | (y == -1)):
                    entry["positive_fraction"] = float(np.mean(y == 1))
                else:
                    entry["y_mean"] = float(np.mean(y))
                    entry["y_std"] = float(np.std(y))
            tasks.append(entry)
        total = int(self.n_samples.sum())
        density = float(self.nnz.sum()) / max(1, total * self.n_features)
        return {"path": self.path, "n_tasks": self.n_tasks, "n_features": self.n_features,
                "storage": self.storage, "dtype": self.dtype, "n_samples": total, "nnz": int(self.nnz.sum()),
                "density": density, "has_truth": _TRUTH in self._f, "tasks": tasks}


def file_format(path) -> str | None:
    """The 'format' attribute of an HDF5 file (None if it has none); InputError if unreadable."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    try:
        with h5py.File(path, "r") as f:
            fmt = f.attrs.get("format")
    except OSError:
        raise InputError(f"{path}: not an HDF5 file") from None
    return fmt.decode() if isinstance(fmt, bytes) else fmt


def is_hdf5(path) -> bool:
    """Whether ``path`` is an HDF5 file (by its signature, not its name)."""
    return bool(h5py.is_hdf5(os.fspath(path)))


def list_datasets(path) -> list:
    """Every dataset of an HDF5 file as ``{"name", "shape", "dtype"}`` (metadata only, no data read)."""
    found = []

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            found.append({"name": name, "shape": list(obj.shape), "dtype": str(obj.dtype)})

    with h5py.File(os.fspath(path), "r") as f:
        f.visititems(visit)
    return found


def read_all_tasks(path):
    """Every task of a file as full blocks (for single-process tools and tests)."""
    with TaskFile(path) as tf:
        return [tf.read_task(i) for i in range(tf.n_tasks)], tf.names, tf.n_features


# ---------------------------------------------------------------------------
# Result files
# ---------------------------------------------------------------------------
def write_result(path, W, Sigma, history: dict, config: dict, n_ranks: int,
                 version: str, task_names=None, extra: dict | None = None, test: dict | None = None,
                 ranks: dict | None = None, groups: dict | None = None, force=True, intercept=None):
    """Write a result file (see module docstring).

    ``intercept`` (m per-task intercepts) is written as ``/model/intercept``
    (zeros when None, so every new file has one).

    ``extra`` adds /model arrays; ``test`` (``{"tasks": [...], "summary": {...}}``)
    adds ``/test/<metric>`` per-task arrays and a ``summary`` JSON attribute;
    ``ranks`` adds ``/ranks/<name>`` arrays with one entry per MPI rank (memory);
    ``groups`` adds further ``/<group>/<name>`` arrays (e.g. a regularization path).
    Sigma may be None for methods without a task covariance.
    """
    with atomic_h5(path, force=force, what="result") as f:
        f.attrs["format"] = RESULT_FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["config"] = json.dumps(config, sort_keys=True)
        f.attrs["hpcmtl_version"] = version
        f.attrs["n_ranks"] = int(n_ranks)
        model = f.create_group("model")
        model.create_dataset("W", data=np.asarray(W, dtype=np.float64))
        n_columns = np.shape(W)[1] if np.ndim(W) == 2 else 0
        model.create_dataset("intercept", data=np.zeros(n_columns) if intercept is None
                             else np.asarray(intercept, dtype=np.float64).reshape(n_columns))
        if Sigma is not None:
            model.create_dataset("Sigma", data=np.asarray(Sigma, dtype=np.float64))
        if task_names is not None:
            model.create_dataset("task_names", data=np.array(task_names, dtype=h5py.string_dtype()))
        for key, value in (extra or {}).items():
            value = np.asarray(value)
            model.create_dataset(key, data=value.astype(h5py.string_dtype()) if value.dtype.kind == "U" else value)
        hist = f.create_group("history")
        for key, values in history.items():
            hist.create_dataset(key, data=np.asarray(values))
        for name, arrays in dict(groups or {}, **({"ranks": ranks} if ranks else {})).items():
            g = f.create_group(name)
            for key, values in arrays.items():
                g.create_dataset(key, data=np.asarray(values))
        if test:
            g = f.create_group("test")
            g.attrs["summary"] = json.dumps(test["summary"], sort_keys=True)
            for key in test["tasks"][0]:
                column = [t[key] for t in test["tasks"]]
                g.create_dataset(key, data=np.array(column, dtype=h5py.string_dtype()) if key == "name" else np.asarray(column))


def read_result(path) -> dict:
    """A result file as plain NumPy arrays and dicts."""
    with _open_read(path, RESULT_FORMAT) as f:
        out = {
            "config": json.loads(f.attrs["config"]),
            "hpcmtl_version": str(f.attrs["hpcmtl_version"]),
            "n_ranks": int(f.attrs["n_ranks"]),
            "model": {},
            "history": {k: v[()] for k, v in f["history"].items()},
        }
        for k, v in f["model"].items():
            value = v[()]
            if k == "task_names" or h5py.check_string_dtype(v.dtype) is not None:      # names: a list of str
                value = [s.decode() if isinstance(s, bytes) else str(s) for s in value]
            out["model"][k] = value
        if "intercept" not in out["model"] and np.ndim(out["model"].get("W")) == 2:
            out["model"]["intercept"] = np.zeros(out["model"]["W"].shape[1])   # written before intercepts existed
        for name in f:
            if name not in ("model", "history", "test"):
                out[name] = {k: v[()] for k, v in f[name].items()}
        if "test" in f:
            from .metrics import canonical_summary        # old files' metric names -> today's
            out["test"] = {"summary": canonical_summary(json.loads(f["test"].attrs["summary"])),
                           "tasks": {k: v[()] for k, v in f["test"].items()}}
    return out


# ---------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------
def write_checkpoint(path, arrays: dict, blocks: list, config: dict, counters: dict, fingerprints: dict | None = None):
    """Full training state, written atomically (the previous checkpoint survives a crash).

    ``arrays``: server state (B, Sigma, rho, history columns); ``blocks``: one
    dict per task block with ``task, part, start, stop`` and the arrays
    ``alpha``, ``order`` (coordinate order) and ``shrink`` (shrinking state);
    ``fingerprints``: ``{task name: content fingerprint}`` of the training data
    read (``/fingerprints/{name,value}``; verified on resume).
    """
    with atomic_h5(path, force=True, what="checkpoint") as f:
        f.attrs["format"] = CHECKPOINT_FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["config"] = json.dumps(config, sort_keys=True)
        f.attrs["counters"] = json.dumps(counters, sort_keys=True)
        g = f.create_group("state")
        for key, value in arrays.items():
            g.create_dataset(key, data=np.asarray(value))
        bg = f.create_group("blocks")
        for b in blocks:
            h = bg.create_group(f"{int(b['task']):06d}_{int(b['part']):04d}")
            for key in ("task", "part", "start", "stop"):
                h.attrs[key] = int(b[key])
            h.create_dataset("alpha", data=np.asarray(b["alpha"], dtype=np.float64))
            h.create_dataset("order", data=np.asarray(b["order"], dtype=np.int32))
            h.create_dataset("shrink", data=np.asarray(b["shrink"], dtype=np.float64))
        if fingerprints:
            g = f.create_group(_FINGERPRINTS)
            g.create_dataset("name", data=np.array(list(fingerprints), dtype=h5py.string_dtype()))
            g.create_dataset("value", data=np.array(list(fingerprints.values()), dtype=h5py.string_dtype()))


def read_checkpoint(path) -> dict:
    with _open_read(path, CHECKPOINT_FORMAT) as f:
        try:
            return {
                "path": os.fspath(path),
                "config": json.loads(f.attrs["config"]),
                "counters": json.loads(f.attrs["counters"]),
                "arrays": {k: v[()] for k, v in f["state"].items()},
                "blocks": [dict({k: int(h.attrs[k]) for k in ("task", "part", "start", "stop")},
                                alpha=h["alpha"][()], order=h["order"][()], shrink=h["shrink"][()])
                           for h in f["blocks"].values()],
                "fingerprints": ({_text(n): _text(v) for n, v in zip(f[_FINGERPRINTS]["name"][()],
                                                                     f[_FINGERPRINTS]["value"][()])}
                                 if _FINGERPRINTS in f else None),     # None: written before fingerprints
            }
        except KeyError as exc:
            raise InputError(f"{path}: incomplete checkpoint (missing {exc.args[0]})") from None


# ---------------------------------------------------------------------------
# Online streams (one shared instance per round, k labels)
# ---------------------------------------------------------------------------
def write_stream(path, X, Y, label_names=None, truth=None, attrs=None, force=True):
    """Write an online stream (format ``hpcmtl-stream``): public API, the file ``train online --stream`` reads.

    Round t shows instance ``X[t]`` and reveals labels ``Y[t]``: ``/X`` CSR
    (T x d) by rows, ``/Y`` (T x k) in {-1, 0, +1}.  A 0 label marks a dormant
    task on that round (paper 004, Sec. 9): it is neither predicted nor updated.
    A single-label stream over C classes is one-hot (+1 on the round's class,
    -1 on the others), the input of ``train online --code``.

    Parameters
    ----------
    path : str or path-like
        The output file, written under a temporary name and renamed when complete.
    X : (T, d) array or sparse matrix
        One instance a round (stored as CSR float64; every value finite).
    Y : (T, k) array
        Labels in {-1, 0, +1}.
    label_names : list of str, optional
        One unique name a label column (default ``label0``, ``label1``, ...).
    truth : dict of arrays, optional
        Ground truth of synthetic data, stored under ``/truth``.
    attrs : dict, optional
        Extra root attributes (strings or numbers), e.g. the source of the data.
    force : bool
        Overwrite an existing file.

    Raises
    ------
    InputError
        Shapes that do not match, non-finite X, labels outside -1/0/+1,
        repeated label names.
    """
    X = sp.csr_matrix(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    if Y.ndim != 2 or Y.shape[0] != X.shape[0]:
        raise InputError(f"{path}: field 'Y': has shape {Y.shape}, expected ({X.shape[0]}, k)")
    if not (np.all(np.isfinite(X.data)) and np.all(np.isin(Y, (-1.0, 0.0, 1.0)))):
        raise InputError(f"{path}: field 'X' must be finite and 'Y' in -1/0/+1")
    names = [str(n) for n in (label_names if label_names is not None else [f"label{j}" for j in range(Y.shape[1])])]
    dup = duplicate_name(names)
    if dup:
        raise InputError(f"{path}: label name '{dup[0]}' is used by labels #{dup[1]} and #{dup[2]} "
                         f"(label names must be unique)")
    with atomic_h5(path, force=force, what="data file") as f:
        f.attrs["format"] = STREAM_FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["n_rounds"] = X.shape[0]
        f.attrs["n_features"] = X.shape[1]
        f.attrs["n_labels"] = Y.shape[1]
        f.attrs["max_row_norm"] = float(np.sqrt(np.max(np.asarray(X.multiply(X).sum(axis=1))))) if X.shape[0] else 0.0
        f.attrs["mean_sq_row_norm"] = float(np.dot(X.data, X.data) / X.shape[0]) if X.shape[0] else 0.0
        f.attrs["mean_active_labels"] = float(np.count_nonzero(Y) / Y.shape[0]) if Y.shape[0] else 0.0
        for key, value in (attrs or {}).items():
            f.attrs[key] = value
        g = f.create_group("X")
        _array(g, "data", X.data)
        _array(g, "indices", X.indices.astype(np.int32))
        _array(g, "indptr", X.indptr.astype(np.int64))
        f.create_dataset("Y", data=Y, chunks=(min(4096, max(1, Y.shape[0])), Y.shape[1]))
        f.create_dataset("label_names", data=np.array(names, dtype=h5py.string_dtype()))
        if truth:
            t = f.create_group(_TRUTH)
            for key, value in truth.items():
                t.create_dataset(key, data=np.asarray(value))


class StreamFile(_OpenFile):
    """Read a stream in chunks of rounds (memory bounded by the chunk)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._f = _open_read(self.path, STREAM_FORMAT)
        self.n_rounds = int(self._f.attrs["n_rounds"])
        self.n_features = int(self._f.attrs["n_features"])
        self.n_labels = int(self._f.attrs["n_labels"])
        self.label_names = [s.decode() if isinstance(s, bytes) else str(s) for s in self._f["label_names"][()]]
        f = self._f
        try:
            g = f["X"]
            self.nnz = int(g["indptr"][-1]) if g["indptr"].shape[0] else 0
            ok = (g["indptr"].shape == (self.n_rounds + 1,) and f["Y"].shape == (self.n_rounds, self.n_labels)
                  and g["data"].shape[0] >= self.nnz and g["indices"].shape[0] >= self.nnz)
        except KeyError as exc:
            self.close()
            raise InputError(f"{self.path}: missing {exc.args[0]!s} (datasets X/data, X/indices, X/indptr and Y "
                             f"are required)") from None
        if not ok or len(self.label_names) != self.n_labels:
            self.close()
            raise InputError(f"{self.path}: field 'X' or 'Y': shapes do not match n_rounds={self.n_rounds}, "
                             f"n_labels={self.n_labels}")
        dup = duplicate_name(self.label_names)
        if dup:
            self.close()
            raise InputError(f"{self.path}: field 'label_names': label name '{dup[0]}' is used by labels #{dup[1]} "
                             f"and #{dup[2]} (label names must be unique)")

    def info(self) -> dict:
        """Summary for ``hpcmtl data info`` (reads the labels, not the instances)."""
        Y = self._f["Y"][()]
        labels = [{"name": n, "positive": int(np.sum(Y[:, j] == 1)), "negative": int(np.sum(Y[:, j] == -1)),
                   "dormant": int(np.sum(Y[:, j] == 0))} for j, n in enumerate(self.label_names)]
        return {"path": self.path, "format": STREAM_FORMAT, "n_rounds": self.n_rounds, "n_features": self.n_features,
                "n_labels": self.n_labels, "nnz": self.nnz, "max_row_norm": self.max_row_norm(),
                "positive_labels_per_round": float(np.sum(Y == 1) / max(1, self.n_rounds)), "labels": labels}

    def max_row_norm(self, chunk=65536) -> float:
        """Largest ||x_t|| of the stream (stored by write_stream; computed in chunks for older files)."""
        if "max_row_norm" in self._f.attrs:
            return float(self._f.attrs["max_row_norm"])
        best = 0.0
        for start in range(0, self.n_rounds, chunk):
            X, _ = self.read_rounds(start, min(self.n_rounds, start + chunk))
            if X.shape[0]:
                best = max(best, float(np.sqrt(np.max(np.asarray(X.multiply(X).sum(axis=1))))))
        return best

    def mean_sq_row_norm(self, chunk=1 << 22) -> float:
        """Mean ||x_t||^2 over the rounds (stored by write_stream; summed in chunks of values for older files)."""
        if "mean_sq_row_norm" in self._f.attrs:
            return float(self._f.attrs["mean_sq_row_norm"])
        data, total = self._f["X"]["data"], 0.0
        for start in range(0, self.nnz, chunk):
            values = np.asarray(data[start:min(self.nnz, start + chunk)], dtype=np.float64)
            total += float(np.dot(values, values))
        return total / max(1, self.n_rounds)

    def mean_active_labels(self, chunk=65536) -> float:
        """Mean number of non-dormant labels a round (stored by write_stream; counted in chunks for older files)."""
        if "mean_active_labels" in self._f.attrs:
            return float(self._f.attrs["mean_active_labels"])
        active = sum(int(np.count_nonzero(self.read_labels(start, min(self.n_rounds, start + chunk))))
                     for start in range(0, self.n_rounds, chunk))
        return active / max(1, self.n_rounds)

    def read_rounds(self, start: int, stop: int):
        """Rounds ``start:stop`` as (CSR instances, labels), validated (one-line errors naming the round)."""
        g = self._f["X"]
        try:
            indptr = g["indptr"][start:stop + 1].astype(np.int64)
            lo, hi = int(indptr[0]), int(indptr[-1])
            if np.any(np.diff(indptr) < 0) or hi > g["data"].shape[0]:
                raise InputError(f"{self.path}: field 'X/indptr': not a valid CSR row pointer in rounds {start}..{stop - 1}")
            data, indices = g["data"][lo:hi], g["indices"][lo:hi]
        except (OSError, ValueError) as exc:
            raise InputError(f"{self.path}: cannot read rounds {start}..{stop - 1}: {exc}") from None
        if indices.size and (indices.min() < 0 or indices.max() >= self.n_features):
            raise InputError(f"{self.path}: field 'X/indices': column index outside 0..{self.n_features - 1} "
                             f"in rounds {start}..{stop - 1}")
        if not np.all(np.isfinite(data)):
            bad = int(np.searchsorted(indptr, lo + int(np.argmax(~np.isfinite(data))), side="right")) - 1
            raise InputError(f"{self.path}: field 'X': NaN or Inf in round {start + bad}")
        X = sp.csr_matrix((data, indices, indptr - lo), shape=(stop - start, self.n_features))
        return X, self.read_labels(start, stop)

    def read_labels(self, start: int, stop: int):
        Y = self._f["Y"][start:stop]
        bad = ~np.isin(Y, (-1.0, 0.0, 1.0))
        if np.any(bad):
            t = int(np.argmax(bad.any(axis=1)))
            raise InputError(f"{self.path}: field 'Y': round {start + t} has a label other than -1, 0, +1")
        return np.asarray(Y, dtype=np.float64)

    def chunks(self, size: int):
        for start in range(0, self.n_rounds, size):
            stop = min(self.n_rounds, start + size)
            X, Y = self.read_rounds(start, stop)
            yield start, X, Y
