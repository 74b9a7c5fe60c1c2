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
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from . import _kernels
from ._rows import Rows


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
        self.rows, self.X = rows_of(self.X)
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
    def nnz(self) -> int:
        return int(self.X.nnz) if self.sparse else int(self.X.size)

    @property
    def sq_norms(self) -> np.ndarray:
        """``||x_j||^2`` per row (of ``x_j - mu`` for implicitly centered rows)."""
        if self._sq_norms is None:
            self._sq_norms = _kernels.row_sq_norms(self.rows, self.n_rows)
            if self.mu is not None:
                # ||x - mu||^2 = ||mu||^2 + sum over the row's non-zeros of x_k (x_k - 2 mu_k)
                X = self.X
                rows = np.repeat(np.arange(self.n_rows), np.diff(X.indptr))
                inner = np.bincount(rows, weights=X.data * (X.data - 2.0 * self.mu[X.indices]), minlength=self.n_rows)
                self._sq_norms = np.maximum(float(self.mu @ self.mu) + inner, 0.0)
        return self._sq_norms

    @property
    def support(self) -> np.ndarray:
        """Sorted int64 ids of the features the block's rows can touch (issue 14): a CSR block's column
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
            self._x_mu = np.ascontiguousarray(np.asarray(self.X @ self.mu).reshape(-1), dtype=np.float64)
        return self._x_mu

    def z_shift(self, w: np.ndarray) -> float:
        """``mu . w``: what implicit centering subtracts from every score (0 without it)."""
        return float(self.mu @ w) if self.mu is not None else 0.0

    def decision(self, w: np.ndarray) -> np.ndarray:
        """Scores ``X w`` of the block's rows (``(X - 1 mu^T) w`` when implicitly centered)."""
        z = np.asarray(self.X @ w).reshape(-1)
        return z - self.z_shift(w) if self.mu is not None else z

    def rmatvec(self, v: np.ndarray) -> np.ndarray:
        """``X^T v`` (``X^T v - mu sum(v)`` when implicitly centered)."""
        out = np.asarray(self.X.T @ v).reshape(-1)
        return out - self.mu * float(np.sum(v)) if self.mu is not None else out

    def gram(self) -> np.ndarray:
        """``X^T X`` as a dense d x d array (of the centered rows when implicitly centered)."""
        G = self.X.T @ self.X
        G = G.toarray() if hasattr(G, "toarray") else np.asarray(G)
        if self.mu is not None:
            s = np.asarray(self.X.sum(axis=0)).reshape(-1)
            G = G - np.outer(self.mu, s) - np.outer(s, self.mu) + self.n_rows * np.outer(self.mu, self.mu)
        return G

    def intercept(self, w: np.ndarray) -> float:
        """The task's intercept for the centered problem's w: ``ybar - mu . w`` (0 for an uncentered block)."""
        if self.center is None:
            return 0.0
        mu, ybar = self.center
        return float(ybar - mu @ w)

    def transformed(self, feature_map) -> "TaskBlock":
        """The same block with ``phi(X)`` in place of ``X`` (random features)."""
        return TaskBlock(self.task, self.name, self.n_task, self.row_start,
                         feature_map(self.X), self.y, self.part)

    def centered(self, mu: np.ndarray, ybar: float) -> "TaskBlock":
        """The block of the task centered by its means (the squared loss's unpenalized intercept).

        Dense rows: ``X - 1 mu^T`` formed; CSR rows: kept, read as ``x_j - mu``.
        Labels ``y - ybar``.  ``mu`` and ``ybar`` are means over the whole task
        (:func:`task_means`), so a split task's blocks share them.
        """
        mu = np.ascontiguousarray(mu, dtype=np.float64)
        y = self.y - ybar
        if self.sparse:
            return TaskBlock(self.task, self.name, self.n_task, self.row_start, self.X, y, self.part,
                             mu=mu, center=(mu, float(ybar)))
        return TaskBlock(self.task, self.name, self.n_task, self.row_start, self.X - mu, y, self.part,
                         center=(mu, float(ybar)))

    def augmented(self, scaling: float) -> "TaskBlock":
        """The block with a constant last feature of value ``scaling`` (liblinear's intercept feature)."""
        return TaskBlock(self.task, self.name, self.n_task, self.row_start, with_constant_column(self.X, scaling),
                         self.y, self.part)


def with_constant_column(X, value: float):
    """``[X, value * 1]``: dense or CSR (one more non-zero a row, at column d)."""
    n, d = X.shape
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float64)
        X.sort_indices()
        data = np.insert(X.data, X.indptr[1:], value)          # after each row's last entry
        indices = np.insert(X.indices, X.indptr[1:], d).astype(np.int32)
        indptr = X.indptr.astype(np.int64) + np.arange(n + 1, dtype=np.int64)
        return sp.csr_matrix((data, indices, indptr), shape=(n, d + 1))
    return np.hstack([np.asarray(X, dtype=np.float64), np.full((n, 1), float(value))])


def rows_of(X):
    """``(Rows, X)``: the kernels' row interface over a dense or CSR matrix, and the matrix it reads.

    CSR: float64 data, int32 sorted column indices, int64 row pointers.  Dense:
    C-ordered float64 with the shared index array ``0..d-1``.  The arrays are
    the returned matrix's own (no copy when it already has these types).
    """
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float64)
        X.sort_indices()
        return Rows(data=np.ascontiguousarray(X.data, dtype=np.float64),
                    indices=np.ascontiguousarray(X.indices, dtype=np.int32),
                    indptr=np.ascontiguousarray(X.indptr, dtype=np.int64),
                    dense=False, n_features=X.shape[1]), X
    X = np.ascontiguousarray(X, dtype=np.float64)
    return Rows(data=X.reshape(-1), indices=np.arange(X.shape[1], dtype=np.int32),
                indptr=np.zeros(1, dtype=np.int64), dense=True, n_features=X.shape[1]), X


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
        else:
            X = np.asarray(X, dtype=np.float64)
            for k in range(n_groups):
                xs[k] += X[g == k].sum(axis=0) if groups is not None else X.sum(axis=0)
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
