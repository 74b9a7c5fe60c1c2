"""In-memory task blocks in the kernels' row interface.

A block is a contiguous row range of one task (the whole task unless the task is
split over several workers).  Dense blocks keep ``X`` row-major with one shared
``0..d-1`` index array; CSR blocks keep ``data/indices/indptr``.  Either way
``block.rows`` is the ``(data, indices, indptr, dense, n_features)`` tuple the
kernels take, so no solver is written twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from . import _kernels


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
        if sp.issparse(self.X):
            X = sp.csr_matrix(self.X, dtype=np.float64)
            X.sort_indices()
            self.X = X
            self.rows = (np.ascontiguousarray(X.data, dtype=np.float64),
                         np.ascontiguousarray(X.indices, dtype=np.int32),
                         np.ascontiguousarray(X.indptr, dtype=np.int64),
                         False, X.shape[1])
        else:
            X = np.ascontiguousarray(self.X, dtype=np.float64)
            self.X = X
            self.rows = (X.reshape(-1), np.arange(X.shape[1], dtype=np.int32),
                         np.zeros(1, dtype=np.int64), True, X.shape[1])
        self.y = np.ascontiguousarray(self.y, dtype=np.float64)

    @property
    def n_rows(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]

    @property
    def sparse(self) -> bool:
        return not self.rows[3]

    @property
    def nnz(self) -> int:
        return int(self.X.nnz) if self.sparse else int(self.X.size)

    @property
    def sq_norms(self) -> np.ndarray:
        if self._sq_norms is None:
            self._sq_norms = _kernels.row_sq_norms(*self.rows, self.n_rows)
        return self._sq_norms

    def decision(self, w: np.ndarray) -> np.ndarray:
        """Scores ``X w`` of the block's rows."""
        return np.asarray(self.X @ w).reshape(-1)

    def transformed(self, feature_map) -> "TaskBlock":
        """The same block with ``phi(X)`` in place of ``X`` (random features)."""
        return TaskBlock(self.task, self.name, self.n_task, self.row_start,
                         feature_map(self.X), self.y, self.part)


def dense_or_csr(X):
    """Validate the matrix type the package stores: dense float or CSR."""
    if sp.issparse(X):
        return sp.csr_matrix(X, dtype=np.float64)
    return np.asarray(X, dtype=np.float64)
