"""In-memory task blocks in the kernels' row interface.

A block is a contiguous row range of one task (the whole task unless the task is
split over several workers).  Dense blocks keep ``X`` row-major with one shared
``0..d-1`` index array; CSR blocks keep ``data/indices/indptr``.  Either way
``block.rows`` is the ``Rows`` object the kernels take (built once per block by
:func:`rows_of`), so no solver is written twice.
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
    _sq_norms: np.ndarray | None = field(default=None, repr=False)

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
        if self._sq_norms is None:
            self._sq_norms = _kernels.row_sq_norms(self.rows, self.n_rows)
        return self._sq_norms

    def decision(self, w: np.ndarray) -> np.ndarray:
        """Scores ``X w`` of the block's rows."""
        return np.asarray(self.X @ w).reshape(-1)

    def transformed(self, feature_map) -> "TaskBlock":
        """The same block with ``phi(X)`` in place of ``X`` (random features)."""
        return TaskBlock(self.task, self.name, self.n_task, self.row_start,
                         feature_map(self.X), self.y, self.part)


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
