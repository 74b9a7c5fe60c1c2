"""In-memory task blocks in the kernels' row interface.

A block is a contiguous row range of one task (the whole task unless the task is
split over several workers).  Dense blocks keep ``X`` row-major with one shared
``0..d-1`` index array; CSR blocks keep ``data/indices/indptr``.  Either way
``block.rows`` is the ``Rows`` object the kernels take (built once per block by
:func:`rows_of`), so no solver is written twice.

Per-task intercepts (docs/math.md) change a block in one of two ways, before any
solver sees it: :meth:`TaskBlock.centered` (squared loss: the task's mean row and
mean label subtracted; dense rows explicitly, CSR rows implicitly through ``mu``,
which :meth:`TaskBlock.decision`, :meth:`TaskBlock.rmatvec`, :meth:`TaskBlock.gram`,
``sq_norms`` and the kernels' ``mu`` / ``x_mu`` arguments honour, so a CSR block is
never densified) and :meth:`TaskBlock.augmented` (hinge and logistic losses: a
constant extra feature, one more non-zero a CSR row).

Feature values are float64 or float32 (``hpcmtl train --float32``, float32 task
files): a float32 block keeps its ``X`` (and ``rows``) in float32, and everything
computed from it is float64: ``sq_norms`` and ``x_mu`` (the kernels accumulate in
double), :meth:`TaskBlock.decision`, :meth:`TaskBlock.rmatvec` and
:meth:`TaskBlock.gram` (NumPy/SciPy on float64 copies of at most
``FLOAT32_CHUNK_VALUES`` values at a time, so no float64 copy of the block is
ever formed).  Centering a dense float32 block computes ``x - mu`` in double
(``mu`` float64) and rounds the result once to float32; the means stay float64.
Labels are always float64.

Every task, read from a file or given in memory, passes one check,
:func:`check_task` (non-empty, shapes that agree, finite values).
:class:`MemoryTasks` is the task source over in-memory arrays (the estimators'
input), with the interface of :class:`hpcmtl.store.TaskFile`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from . import _blockops
from ._rows import Rows
from .errors import InputError


@dataclass
class TaskBlock:
    task: int                 # task index in the dataset
    name: str
    n_task: int               # n_i of the whole task (scaling 1/n_i)
    row_start: int            # first row of the task this block holds
    X: object                 # np.ndarray (n x d, C order) or scipy.sparse.csr_matrix
    y: np.ndarray
    part: int = 0             # block number within its task
    mu: np.ndarray | None = None        # implicit centering of CSR rows: the rows are read as x_j - mu
    center: tuple | None = None         # (mu, ybar) of the whole task when the block was centered
    _sq_norms: np.ndarray | None = field(default=None, repr=False)
    _x_mu: np.ndarray | None = field(default=None, repr=False)
    _support: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self):
        self.rows, self.X = rows_of(self.X, keep_float32=True)
        self.y = np.ascontiguousarray(self.y, dtype=np.float64)

    @property
    def n_rows(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]

    @property
    def sparse(self) -> bool:
        return not self.rows.dense

    @property
    def float32(self) -> bool:
        """The feature values are stored in float32."""
        return self.rows.single

    @property
    def nnz(self) -> int:
        return int(self.X.nnz) if self.sparse else int(self.X.size)

    @property
    def sq_norms(self) -> np.ndarray:
        """``||x_j||^2`` per row (of ``x_j - mu`` for implicitly centered rows)."""
        if self._sq_norms is None:
            self._sq_norms = _blockops.row_sq_norms(self.rows, self.n_rows)
            if self.mu is not None:
                # ||x - mu||^2 = ||mu||^2 + sum over the row's non-zeros of x_k (x_k - 2 mu_k)
                X = self.X
                rows = np.repeat(np.arange(self.n_rows), np.diff(X.indptr))
                data = X.data.astype(np.float64)
                inner = np.bincount(rows, weights=data * (data - 2.0 * self.mu[X.indices]), minlength=self.n_rows)
                self._sq_norms = np.maximum(_blockops.ordered_dot(self.mu, self.mu) + inner, 0.0)
        return self._sq_norms

    @property
    def support(self) -> np.ndarray:
        """Sorted int64 ids of the features the block's rows can touch: a CSR block's column
        indices, with its implicit centering's mean (the whole task's features) and the augmented constant
        column (a non-zero of every row); every feature for dense rows.  ``X^T v`` is zero outside it, and
        the block's scores read ``w`` only on it."""
        if self._support is None:
            if self.sparse:
                ids = np.unique(self.X.indices)
                if self.mu is not None:
                    ids = np.union1d(ids, np.flatnonzero(self.mu))
                self._support = np.ascontiguousarray(ids, dtype=np.int64)
            else:
                self._support = np.arange(self.n_features, dtype=np.int64)
        return self._support

    @property
    def x_mu(self) -> np.ndarray | None:
        """``x_j . mu`` per row (implicitly centered rows; the kernels' ``x_mu``), else None."""
        if self.mu is not None and self._x_mu is None:
            self._x_mu = np.ascontiguousarray(matvec(self.X, self.mu), dtype=np.float64)
        return self._x_mu

    def z_shift(self, w: np.ndarray) -> float:
        """``mu . w``: what implicit centering subtracts from every score (0 without it)."""
        return _blockops.ordered_dot(self.mu, np.ascontiguousarray(w, dtype=np.float64)) if self.mu is not None else 0.0

    def decision(self, w: np.ndarray) -> np.ndarray:
        """Scores ``X w`` of the block's rows (``(X - 1 mu^T) w`` when implicitly centered)."""
        z = matvec(self.X, w)
        return z - self.z_shift(w) if self.mu is not None else z

    def rmatvec(self, v: np.ndarray) -> np.ndarray:
        """``X^T v`` (``X^T v - mu sum(v)`` when implicitly centered)."""
        out = rmatvec(self.X, v)
        return out - self.mu * float(np.sum(v)) if self.mu is not None else out

    def rmatvec_sparse(self, v: np.ndarray) -> np.ndarray:
        """:meth:`rmatvec` for a ``v`` with few non-zeros: only their rows are read (``_blockops.rmatvec_nonzero``;
        on float64 CSR rows bitwise :meth:`rmatvec`; dense and float32 rows to rounding)."""
        out = np.empty(self.n_features)
        _blockops.rmatvec_nonzero(self.rows, np.ascontiguousarray(v, dtype=np.float64), out)
        return out - self.mu * float(np.sum(v)) if self.mu is not None else out

    def gram(self) -> np.ndarray:
        """``X^T X`` as a dense d x d array (of the centered rows when implicitly centered)."""
        G = np.zeros((self.n_features, self.n_features))
        for X in float64_chunks(self.X):
            P = X.T @ X
            G += P.toarray() if hasattr(P, "toarray") else P
        if self.mu is not None:
            s = rmatvec(self.X, np.ones(self.n_rows)) if self.float32 else np.asarray(self.X.sum(axis=0)).reshape(-1)
            G = G - np.outer(self.mu, s) - np.outer(s, self.mu) + self.n_rows * np.outer(self.mu, self.mu)
        return G

    def signed_rows(self, which=None) -> np.ndarray:
        """``Z = diag(y) X`` as a dense float64 array (of the centered rows when implicitly centered): the box
        losses' dual in ``y o alpha`` is written in it.  ``which``: those rows only (indices).  n x d numbers:
        small blocks, few rows or small d only."""
        X, y = (self.X, self.y) if which is None else (self.X[which], self.y[which])
        X = X.toarray() if hasattr(X, "toarray") else X
        Z = np.asarray(X, dtype=np.float64) * y[:, None]
        if self.mu is not None:
            Z = Z - y[:, None] * self.mu[None, :]
        return Z

    def intercept(self, w: np.ndarray) -> float:
        """The task's intercept for the centered problem's w: ``ybar - mu . w`` (0 for an uncentered block)."""
        if self.center is None:
            return 0.0
        mu, ybar = self.center
        return float(ybar - _blockops.ordered_dot(np.ascontiguousarray(mu, dtype=np.float64),
                                                 np.ascontiguousarray(w, dtype=np.float64)))

    def transformed(self, feature_map) -> "TaskBlock":
        """The same block with ``phi(X)`` in place of ``X`` (random features)."""
        return TaskBlock(self.task, self.name, self.n_task, self.row_start,
                         feature_map(self.X), self.y, self.part)

    def centered(self, mu: np.ndarray, ybar: float, in_place: bool = False) -> "TaskBlock":
        """The block of the task centered by its means (the squared loss's unpenalized intercept).

        Dense rows: ``X - 1 mu^T`` formed; CSR rows: kept, read as ``x_j - mu``.
        Labels ``y - ybar``.  ``mu`` and ``ybar`` are means over the whole task
        (:func:`task_means`), so a split task's blocks share them.  ``in_place``: dense rows are
        centered in this block's own array (the same bits, no second copy of the block; for a block
        nothing else holds, as :func:`hpcmtl.engine.load_blocks` reads them).
        """
        mu = np.ascontiguousarray(mu, dtype=np.float64)
        y = self.y - ybar
        if self.sparse:
            return TaskBlock(self.task, self.name, self.n_task, self.row_start, self.X, y, self.part,
                             mu=mu, center=(mu, float(ybar)))
        if self.float32:                    # x - mu in double, rounded once to float32, a chunk at a time
            Xc = self.X if in_place else np.empty_like(self.X)
            for start, stop in chunk_bounds(self.n_rows, self.n_features):
                Xc[start:stop] = self.X[start:stop] - mu
        elif in_place:
            Xc = self.X
            Xc -= mu
        else:
            Xc = self.X - mu
        return TaskBlock(self.task, self.name, self.n_task, self.row_start, Xc, y, self.part,
                         center=(mu, float(ybar)))

    def as_float32(self) -> "TaskBlock":
        """The same block with its feature values rounded to float32 (``--float32``); the caller checks the
        values fit (:func:`float32_overflow`)."""
        if self.float32:
            return self
        X = self.X.astype(np.float32)
        return TaskBlock(self.task, self.name, self.n_task, self.row_start, X, self.y, self.part,
                         mu=self.mu, center=self.center)

    def on_features(self, ids: np.ndarray) -> "TaskBlock":
        """The same CSR block with its columns renumbered ``0 .. len(ids) - 1``: column ``ids[c]``
        becomes c.  ``ids`` (sorted) must hold :attr:`support`, so nothing is lost: scores, ``X^T v``, norms,
        ``mu`` and the intercept read only those features.  A worker that exchanges the block on its support
        computes on this one: its w and delta b have ``len(ids)`` entries instead of d."""
        ids = np.asarray(ids, dtype=np.int64)
        X = self.X
        position = np.searchsorted(ids, X.indices)
        if position.size and (position.max() >= ids.size or np.any(ids[position] != X.indices)):
            raise ValueError("on_features: the ids do not hold the block's support")
        Xc = sp.csr_matrix((X.data, position.astype(np.int32), X.indptr), shape=(X.shape[0], ids.size))
        mu = None if self.mu is None else np.ascontiguousarray(self.mu[ids])
        center = None if self.center is None else (np.ascontiguousarray(self.center[0][ids]), self.center[1])
        out = TaskBlock(self.task, self.name, self.n_task, self.row_start, Xc, self.y, self.part, mu=mu, center=center)
        out._sq_norms, out._x_mu = self._sq_norms, self._x_mu      # the same rows' values: nothing to recompute
        return out

    def augmented(self, scaling: float) -> "TaskBlock":
        """The block with a constant last feature of value ``scaling`` (liblinear's intercept feature)."""
        return TaskBlock(self.task, self.name, self.n_task, self.row_start, with_constant_column(self.X, scaling),
                         self.y, self.part)


def with_constant_column(X, value: float):
    """``[X, value * 1]``: dense or CSR (one more non-zero a row, at column d)."""
    n, d = X.shape
    dtype = feature_dtype(X)
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=dtype)
        X.sort_indices()
        data = np.insert(X.data, X.indptr[1:], dtype(value))   # after each row's last entry
        indices = np.insert(X.indices, X.indptr[1:], d).astype(np.int32, copy=False)
        indptr = X.indptr.astype(np.int64) + np.arange(n + 1, dtype=np.int64)
        return sp.csr_matrix((data, indices, indptr), shape=(n, d + 1))
    return np.hstack([np.asarray(X, dtype=dtype), np.full((n, 1), value, dtype=dtype)])


def feature_dtype(X):
    """float32 for float32 feature values, else float64 (the two types the kernels read)."""
    return np.float32 if getattr(X, "dtype", None) == np.float32 else np.float64


def rows_of(X, keep_float32=False):
    """``(Rows, X)``: the kernels' row interface over a dense or CSR matrix, and the matrix it reads.

    CSR: float64 data, int32 sorted column indices, int64 row pointers.  Dense:
    C-ordered float64 with the shared index array ``0..d-1``.  With
    ``keep_float32``, float32 values stay float32 (TaskBlock; the ``_online``
    kernels take float64 only).  The arrays are the returned matrix's own (no
    copy when it already has these types).
    """
    dtype = feature_dtype(X) if keep_float32 else np.float64
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=dtype)
        X.sort_indices()
        return Rows(data=np.ascontiguousarray(X.data, dtype=dtype),
                    indices=np.ascontiguousarray(X.indices, dtype=np.int32),
                    indptr=np.ascontiguousarray(X.indptr, dtype=np.int64),
                    dense=False, n_features=X.shape[1]), X
    X = np.ascontiguousarray(X, dtype=dtype)
    return Rows(data=X.reshape(-1), indices=np.arange(X.shape[1], dtype=np.int32),
                indptr=np.zeros(1, dtype=np.int64), dense=True, n_features=X.shape[1]), X


FLOAT32_CHUNK_VALUES = 1 << 17     # float64 temporaries of float32 blocks: at most this many values (1 MB)


def chunk_bounds(n_rows: int, n_values_per_row: int):
    """Row ranges ``(start, stop)`` of at most ``FLOAT32_CHUNK_VALUES`` values (one row at least)."""
    step = max(1, FLOAT32_CHUNK_VALUES // max(1, n_values_per_row))
    return [(s, min(n_rows, s + step)) for s in range(0, n_rows, step)]


def float64_chunks(X):
    """``X`` itself when float64, else its rows as float64 copies, a chunk at a time (dense or CSR)."""
    if feature_dtype(X) is np.float64:
        yield X
        return
    per_row = max(1, X.nnz // max(1, X.shape[0])) if sp.issparse(X) else X.shape[1]
    for start, stop in chunk_bounds(X.shape[0], per_row):
        yield X[start:stop].astype(np.float64)


def matvec(X, w) -> np.ndarray:
    """``X w`` in float64 (float32 ``X``: a chunk of rows at a time, never the whole block upcast)."""
    if feature_dtype(X) is np.float64:
        return np.asarray(X @ w).reshape(-1)
    return np.concatenate([np.asarray(C @ w).reshape(-1) for C in float64_chunks(X)] or [np.zeros(0)])


def rmatvec(X, v) -> np.ndarray:
    """``X^T v`` in float64 (float32 ``X``: summed over chunks of rows)."""
    out, start = None, 0
    for C in float64_chunks(X):
        part = np.asarray(C.T @ v[start:start + C.shape[0]]).reshape(-1)
        out = part if out is None else out + part
        start += C.shape[0]
    return out if out is not None else np.zeros(X.shape[1])


def float32_overflow_error(where: str, row: int, value: float) -> InputError:
    """The one line of a value beyond float32's range met by ``--float32`` (exit 2 on every rank)."""
    return InputError(f"{where}: field 'X': row {row}: {value:.3g} does not fit float32 (--float32); rescale the "
                      f"features or train in float64")


def float32_overflow(X):
    """``(row, value)`` of the first finite value of ``X`` beyond float32's range, or None.

    Checked ``FLOAT32_CHUNK_VALUES`` at a time (no ``|X|`` of the whole block in memory); float32 values
    are within it by their type."""
    data = X.data if sp.issparse(X) else np.asarray(X).reshape(-1)
    if data.dtype == np.float32:
        return None
    limit = float(np.finfo(np.float32).max)
    for s in range(0, data.size, FLOAT32_CHUNK_VALUES):
        big = np.flatnonzero(np.abs(data[s:s + FLOAT32_CHUNK_VALUES]) > limit)
        if big.size:
            p = s + int(big[0])
            row = int(np.searchsorted(X.indptr, p, side="right") - 1) if sp.issparse(X) else p // max(1, X.shape[1])
            return row, float(data[p])
    return None


def dense_or_csr(X):
    """Validate the matrix type the package stores: dense float or CSR."""
    if sp.issparse(X):
        return sp.csr_matrix(X, dtype=np.float64)
    return np.asarray(X, dtype=np.float64)


MEAN_CHUNK_ROWS = 4096


def task_means(read_rows, n: int, feature_map=None, chunk: int = MEAN_CHUNK_ROWS, folds=None, n_folds: int = 0):
    """``(mu, ybar)``: the mean row and mean label of a task of ``n >= 1`` rows, read ``chunk`` rows at a time.

    ``read_rows(start, stop)`` returns ``(X, y)`` of those rows (dense or CSR);
    ``feature_map`` (random features) is applied to each chunk.  The sums run
    over fixed chunks in row order, so every rank that computes a task's means
    gets the same bits whatever blocks it holds; memory is one chunk.

    With ``folds`` (a fold id per row: ``0..n_folds-1``, or negative for rows
    that always train) the result is a list of ``n_folds`` pairs instead, the
    means of fold f's training rows (``folds != f``), from one pass: the sums
    of each fold id in chunk order, then added in fold order, so they too are
    the same bits on every rank (memory ``(n_folds + 1) x d``).
    """
    groups = None if folds is None else np.where(np.asarray(folds) < 0, n_folds, np.asarray(folds)).astype(np.int64)
    n_groups = 1 if groups is None else n_folds + 1
    xs, ys = None, np.zeros(n_groups)
    for start in range(0, n, chunk):
        X, y = read_rows(start, min(n, start + chunk))
        if feature_map is not None:
            X = feature_map(X)
        d = X.shape[1]
        if xs is None:
            xs = np.zeros((n_groups, d))
        g = np.zeros(X.shape[0], dtype=np.int64) if groups is None else groups[start:start + X.shape[0]]
        if sp.issparse(X):
            X = sp.csr_matrix(X)
            row_group = np.repeat(g, np.diff(X.indptr))
            xs += np.bincount(row_group * d + X.indices, weights=X.data, minlength=n_groups * d).reshape(n_groups, d)
        else:       # float32 rows summed in double as they are read (numpy's bits of a float64 copy, without it)
            X = np.asarray(X)
            for k in range(n_groups):
                xs[k] += (X[g == k] if groups is not None else X).sum(axis=0, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        for k in range(n_groups):
            ys[k] += float(np.sum(y[g == k] if groups is not None else y))
    if groups is None:
        return xs[0] / n, float(ys[0]) / n
    counts = np.bincount(groups, minlength=n_groups)
    means = []
    for f in range(n_folds):
        keep = [k for k in range(n_groups) if k != f]
        total_x, total_y = np.zeros(xs.shape[1]), 0.0
        for k in keep:
            total_x += xs[k]
            total_y += float(ys[k])
        size = int(sum(counts[k] for k in keep))
        means.append((total_x / size, total_y / size))
    return means


FINITE_CHUNK_VALUES = 1 << 16     # values checked at a time by all_finite: small masks, whatever the block


def all_finite(values) -> bool:
    """No NaN or Inf in ``values``, checked ``FINITE_CHUNK_VALUES`` at a time (no mask of the whole block in memory)."""
    values = np.asarray(values)
    if values.ndim == 2:            # by rows: also a view of some columns of a larger array, never copied whole
        step = max(1, FINITE_CHUNK_VALUES // max(1, values.shape[1]))
        return all(np.isfinite(values[s:s + step]).all() for s in range(0, values.shape[0], step))
    flat = values.reshape(-1)
    return all(np.isfinite(flat[s:s + FINITE_CHUNK_VALUES]).all() for s in range(0, flat.size, FINITE_CHUNK_VALUES))


def check_name(name, where):
    """A task name is one printable line (it appears in messages, tables and file listings): a line break
    would forge a second ``hpcmtl: error:`` line and an escape sequence would reach the terminal."""
    name = str(name)
    if not name:
        raise InputError(f"{where}: empty task name")
    if not name.isprintable():
        raise InputError(f"{where}: task name {name!r} holds a line break or control character")
    return name


def check_task(path, i, name, X, y, n_features):
    """Refuse task ``i`` (``name``) of ``path`` in one line unless ``X`` (n x d, d = ``n_features`` when given)
    and ``y`` (n,) are non-empty, match in shape and hold only finite values.

    The one check every task passes: written to or read from a task file (:mod:`hpcmtl.store.tasks`), or
    given in memory (:class:`MemoryTasks`)."""
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
    if not all_finite(X.data if sp.issparse(X) else X):
        raise InputError(f"{where}: field 'X': contains NaN or Inf")
    if not np.all(np.isfinite(y)):
        raise InputError(f"{where}: field 'y': contains NaN or Inf")


class MemoryTasks:
    """A task source over in-memory arrays (same interface as ``store.TaskFile``)."""

    def __init__(self, Xs, ys, names=None, path="<memory>"):
        if len(Xs) != len(ys) or len(Xs) == 0:
            raise InputError("need one label vector per task and at least one task")
        self.path = path
        self.Xs = [dense_or_csr(X) for X in Xs]
        self.ys = [np.asarray(y, dtype=np.float64).reshape(-1) for y in ys]
        self.names = [str(n) for n in (names if names is not None else [f"task{i}" for i in range(len(Xs))])]
        self.n_tasks = len(self.Xs)
        self.n_features = self.Xs[0].shape[1]
        self.n_samples = np.array([X.shape[0] for X in self.Xs], dtype=np.int64)
        self.nnz = np.array([X.nnz if sp.issparse(X) else np.count_nonzero(X) for X in self.Xs], dtype=np.int64)
        for i, (X, y) in enumerate(zip(self.Xs, self.ys)):
            check_task(path, i, self.names[i], X, y, self.n_features)     # the same checks as files get

    def read_block(self, i, start=0, stop=None, part=0):
        stop = int(self.n_samples[i]) if stop is None else stop
        return TaskBlock(i, self.names[i], int(self.n_samples[i]), start,
                         self.Xs[i][start:stop], self.ys[i][start:stop], part)

    def read_task(self, i):
        return self.read_block(i)

    def task_means(self, i, feature_map=None, folds=None, n_folds=0):
        """``(mu, ybar)`` of task ``i`` (the same chunked sums as ``store.TaskFile.task_means``)."""
        return task_means(lambda a, b: (self.Xs[i][a:b], self.ys[i][a:b]), int(self.n_samples[i]), feature_map,
                          folds=folds, n_folds=n_folds)
