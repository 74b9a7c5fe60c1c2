"""A task covariance held as factors: ``Sigma = V diag(s) V^T + c (I - V V^T)`` (issue 35, docs/many-tasks.md).

A learned Sigma with its eigenvalue floor has exactly this form (V: m x r orthonormal, r <= min(m, d)), so
from :data:`hpcmtl.dmtrl.sigma.FACTORED_MIN_TASKS` tasks on the server, its checkpoints, the result file,
``report``, the estimators' ``Sigma_`` and :func:`hpcmtl.store.read_result` hold these factors and never the
m x m matrix (10^5 tasks: 80 GB).  Everything here costs O(m r) a vector, or O(m r) memory a piece; only
:meth:`SigmaFactors.dense` forms the matrix, for small m.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .errors import InputError

# the result file's (and the checkpoint's) names of the factors
FACTOR_FIELDS = ("sigma_V", "sigma_s", "sigma_c")
PIECE_VALUES = 1 << 22      # row pieces of Sigma formed at a time (abs_times, is_diagonal): 32 MB each


class SigmaFactors(NamedTuple):
    """``Sigma = V diag(s) V^T + c (I - V V^T)``: V (m x r) orthonormal columns, r <= min(m, d), ``s`` Sigma's
    eigenvalues on them, ``c`` its eigenvalue on the rest (the eigenvalue floor over the trace).  Products cost
    O(m r) a vector; :meth:`dense` forms the m x m matrix (m^2 r) for what still needs it (small m)."""
    V: np.ndarray
    s: np.ndarray
    c: float

    @property
    def m(self):
        return self.V.shape[0]

    @property
    def shape(self):
        """``(m, m)``: the matrix these factors are (for shape checks; it is never formed here)."""
        return (self.m, self.m)

    def copy(self):
        return SigmaFactors(self.V.copy(), self.s.copy(), float(self.c))

    def matmul(self, X):
        """``Sigma @ X`` (X: m rows, or one m-vector): ``V ((s - c) (V^T X)) + c X``."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim == 1:
            return self.V @ ((self.s - self.c) * (self.V.T @ X)) + self.c * X
        return self.V @ ((self.s - self.c)[:, None] * (self.V.T @ X)) + self.c * X

    def inverse_matmul(self, X):
        """``Sigma^-1 @ X`` (Omega): the same factors with ``1 / s`` and ``1 / c``."""
        X = np.asarray(X, dtype=np.float64)
        k = 1.0 / self.s - 1.0 / self.c
        if X.ndim == 1:
            return self.V @ (k * (self.V.T @ X)) + X / self.c
        return self.V @ (k[:, None] * (self.V.T @ X)) + X / self.c

    def diag(self):
        """``sigma_ii``."""
        return self.c + (self.V * self.V) @ (self.s - self.c)

    def inverse_diag(self):
        """``(Sigma^-1)_ii``: Sigma^-1 has the same factors with 1/s and 1/c."""
        return 1.0 / self.c + (self.V * self.V) @ (1.0 / self.s - 1.0 / self.c)

    def inverse_column(self, i):
        """Column i of ``Sigma^-1`` (m numbers, O(m r))."""
        col = self.V @ ((1.0 / self.s - 1.0 / self.c) * self.V[i])
        col[i] += 1.0 / self.c
        return col

    def rows(self, idx, cols=None):
        """``Sigma[np.ix_(idx, cols)]`` (``cols``: every task when None): the rows of the sampled tasks only."""
        idx = np.asarray(idx)
        cols = np.arange(self.m) if cols is None else np.asarray(cols)
        M = (self.V[idx] * (self.s - self.c)) @ self.V[cols].T
        M[idx[:, None] == cols[None, :]] += self.c
        return M

    def correlation(self, idx):
        """The task correlation ``Sigma_ij / sqrt(sigma_ii sigma_jj)`` of the tasks ``idx`` (a sample)."""
        M = self.rows(idx, idx)
        root = np.sqrt(self.diag()[np.asarray(idx)])
        return M / np.outer(root, root)

    def pieces(self):
        """``(start, Sigma[start:stop])`` in row pieces of at most PIECE_VALUES numbers (no m x m array)."""
        step = max(1, PIECE_VALUES // max(self.m, 1))
        for start in range(0, self.m, step):
            yield start, self.rows(np.arange(start, min(start + step, self.m)))

    def abs_times(self, x):
        """``|Sigma| @ x`` (Lemma 6.7's row sums) in row pieces: O(m^2 r) time, O(PIECE_VALUES) memory
        (``c x`` when r = 0: Sigma is c I)."""
        x = np.asarray(x, dtype=np.float64)
        if self.V.shape[1] == 0:
            return self.c * x
        return np.concatenate([np.abs(piece) @ x for _, piece in self.pieces()]) if self.m else np.zeros(0)

    def abs_bound(self, x):
        """An upper bound of ``|Sigma| @ x`` for ``x >= 0`` in O(m r): ``c x + |V| ((s - c) |V|^T x)`` (each
        ``|Sigma_ij| <= c delta_ij + sum_k (s_k - c) |V_ik| |V_jk|``, as s > c)."""
        x = np.asarray(x, dtype=np.float64)
        A = np.abs(self.V)
        return self.c * x + A @ ((self.s - self.c) * (A.T @ x))

    def is_diagonal(self) -> bool:
        """Every entry off the diagonal exactly zero: the rows of ``F = V diag(sqrt(s - c))`` pairwise orthogonal,
        so at most r of them non-zero, whose r x r Gram matrix is then diagonal (O(m r), no m x m array)."""
        F = self.V * np.sqrt(np.maximum(self.s - self.c, 0.0))
        live = np.flatnonzero(np.any(F != 0.0, axis=1))
        if live.size > F.shape[1]:
            return False
        G = F[live] @ F[live].T
        return not np.any(G[~np.eye(live.size, dtype=bool)])

    def dense(self):
        """The m x m matrix, symmetric to the bit and one m x m array at its peak: ``F F^T + c I`` with
        ``F = V diag(sqrt(s - c))`` (s > c: only the columns above the floor are kept), which NumPy computes as
        one symmetric rank-r update (BLAS syrk, its other triangle copied)."""
        F = self.V * np.sqrt(self.s - self.c)
        S = F @ F.T
        S[np.diag_indices_from(S)] += self.c
        return S

    def arrays(self):
        """The factors as file arrays (:meth:`from_arrays` reads them back bit for bit)."""
        return {"sigma_V": self.V, "sigma_s": self.s, "sigma_c": np.array(self.c)}

    @classmethod
    def from_arrays(cls, arrays, path="checkpoint", where="state", m=None):
        """The factors of a checkpoint's (``where='state'``) or a result file's (``'model'``) arrays; None when
        it has none (a file of the dense path, or older); an InputError naming the fields when they do not fit
        together or with ``m`` tasks (else the dense ``Sigma``'s, where there is one)."""
        if "sigma_V" not in arrays:
            return None
        V = np.array(arrays["sigma_V"], dtype=np.float64)
        s = np.array(arrays.get("sigma_s", np.zeros(0)), dtype=np.float64).reshape(-1)
        c = np.asarray(arrays.get("sigma_c", np.nan), dtype=np.float64)
        if m is None:
            m = np.shape(arrays["Sigma"])[0] if "Sigma" in arrays else (V.shape[0] if V.ndim == 2 else -1)
        if (V.ndim != 2 or V.shape != (m, s.size) or c.size != 1 or not float(c) > 0 or not np.all(s > 0)
                or not np.all(np.isfinite(V))):
            raise InputError(f"{path}: fields '{where}/sigma_V' {V.shape}, '{where}/sigma_s' {s.shape}, "
                             f"'{where}/sigma_c': Sigma's factors do not fit its {m} tasks")
        return cls(V, s, float(c))


def is_factored(Sigma) -> bool:
    return isinstance(Sigma, SigmaFactors)


def diagonal(Sigma) -> np.ndarray:
    """``sigma_ii`` of a dense Sigma or of :class:`SigmaFactors`."""
    return Sigma.diag() if is_factored(Sigma) else np.diag(Sigma)


def as_dense(Sigma) -> np.ndarray:
    """The m x m matrix (formed from the factors: only for small m)."""
    return Sigma.dense() if is_factored(Sigma) else Sigma


def model_sigma(model: dict, path="result"):
    """A result file's task covariance (:func:`hpcmtl.store.read_result`'s ``model``): the dense
    ``/model/Sigma`` of the files of small m (and every file written before factors), the
    :class:`SigmaFactors` of ``/model/sigma_V``, ``sigma_s``, ``sigma_c`` at many tasks, None without one."""
    if "Sigma" in model:
        return model["Sigma"]
    return SigmaFactors.from_arrays(model, path, where="model", m=np.shape(model["W"])[1])
