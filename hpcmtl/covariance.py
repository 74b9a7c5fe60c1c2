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


def sampled_correlation(Sigma, idx):
    """``Sigma_ij / sqrt(sigma_ii sigma_jj)`` of the tasks ``idx`` from a held Sigma's ``rows`` and ``diag``."""
    M = Sigma.rows(idx, idx)
    root = np.sqrt(Sigma.diag()[np.asarray(idx)])
    return M / np.outer(root, root)


def row_pieces(Sigma):
    """``(start, Sigma[start:stop])`` of a held Sigma in row pieces of at most PIECE_VALUES numbers."""
    step = max(1, PIECE_VALUES // max(Sigma.m, 1))
    for start in range(0, Sigma.m, step):
        yield start, Sigma.rows(np.arange(start, min(start + step, Sigma.m)))


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
        return sampled_correlation(self, idx)

    def pieces(self):
        """``(start, Sigma[start:stop])`` in row pieces of at most PIECE_VALUES numbers (no m x m array)."""
        return row_pieces(self)

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

    def signature_bytes(self):
        """The bytes that identify this Sigma (a checkpoint's must-match key of a fixed Sigma): the factors,
        O(m r), not the m x m matrix they stand for."""
        return b"".join(np.ascontiguousarray(v, dtype=np.float64).tobytes() for v in (self.V, self.s, [self.c]))

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
    """Sigma is not an m x m array: a learned Sigma's :class:`SigmaFactors` or a graph kernel's
    :class:`GraphSigma` (the engine's matrix-free path takes either through the same interface)."""
    return isinstance(Sigma, (SigmaFactors, GraphSigma))


def diagonal(Sigma) -> np.ndarray:
    """``sigma_ii`` of a dense Sigma or of :class:`SigmaFactors`."""
    return Sigma.diag() if is_factored(Sigma) else np.diag(Sigma)


def as_dense(Sigma) -> np.ndarray:
    """The m x m matrix (formed from the factors: only for small m)."""
    return Sigma.dense() if is_factored(Sigma) else Sigma


def model_sigma(model: dict, path="result"):
    """A result file's task covariance (:func:`hpcmtl.store.read_result`'s ``model``): the dense
    ``/model/Sigma`` of the files of small m (and every file written before factors), the
    :class:`SigmaFactors` of ``/model/sigma_V``, ``sigma_s``, ``sigma_c`` at many tasks, the
    :class:`GraphSigma` of ``/model/graph_*`` (a graph kernel of many tasks), None without one."""
    if "Sigma" in model:
        return model["Sigma"]
    return covariance_from_arrays(model, path, where="model", m=np.shape(model["W"])[1])


def covariance_from_arrays(arrays, path="checkpoint", where="state", m=None):
    """A checkpoint's or a result file's Sigma held as :class:`SigmaFactors` or :class:`GraphSigma`; None when its
    arrays hold neither (the dense ``Sigma`` of a file of few tasks)."""
    graph = GraphSigma.from_arrays(arrays, path, where, m)
    return graph if graph is not None else SigmaFactors.from_arrays(arrays, path, where, m)


# ---------------------------------------------------------------------------
# A graph kernel held sparse (paper 003, issue 35): Sigma = S (L + diag(alpha))^-1 S, S diagonal
# ---------------------------------------------------------------------------
# the result file's (and the checkpoint's) names of a graph covariance: the adjacency as CSR arrays, alpha, whether
# it is normalized, and diag((L + diag(alpha))^-1) (computed once: the costly part, so a resume or a reader
# never redoes it)
GRAPH_FIELDS = ("graph_indptr", "graph_indices", "graph_data", "graph_alpha", "graph_normalize", "graph_diag")
# diag((L + diag(alpha))^-1) is computed exactly while its cheaper method costs at most this many flops (about
# 10-60 s of one core: docs/many-tasks.md, "A graph kernel at many tasks"); beyond it a graph is refused
GRAPH_DIAG_MAX_FLOPS = 2e10
GRAPH_BAND_MAX_VALUES = 1 << 26     # the banded factor's values at most (512 MB)
DIAG_SOLVE_COLUMNS = 256            # unit columns solved at a time by the blocked-solve method


class GraphSigma:
    """``Sigma = S K_hat S`` with ``K_hat = (L + diag(alpha))^-1`` (L the task graph's Laplacian, sparse) and
    ``S = diag(K_hat)^-1/2`` (``normalize``: paper 003's Eq. 5, unit diagonal) or I, never formed: products go
    through a sparse LU of ``P = L + diag(alpha)`` (SuperLU, symmetric mode, no pivoting: P is SPD), Sigma^-1
    is ``S^-1 P S^-1`` (sparse).  P is an M-matrix (positive definite, non-positive off the diagonal), so K_hat
    is entrywise >= 0 and ``|Sigma| x = Sigma x``.  The same interface as :class:`SigmaFactors`; immutable.

    ``adjacency``: a symmetric scipy.sparse (or dense) m x m matrix of weights >= 0; ``alpha``: m values >= 0
    (positive somewhere in every component: :func:`hpcmtl.task_graph.check_graph`); ``khat_diag``: the stored
    ``diag(K_hat)`` (a checkpoint's or a result file's), else computed (:func:`inverse_diagonal`)."""

    def __init__(self, adjacency, alpha, normalize=True, khat_diag=None, what="graph"):
        import scipy.sparse as sp
        A = sp.csr_matrix(adjacency, dtype=np.float64)
        A.sum_duplicates()
        A.eliminate_zeros()
        A.sort_indices()
        self.adjacency = A
        self.alpha = np.array(np.broadcast_to(np.asarray(alpha, dtype=np.float64), (A.shape[0],)))
        self.normalize = bool(normalize)
        self.what = what
        degree = np.asarray(A.sum(axis=1)).reshape(-1)
        self.precision = (sp.diags(degree + self.alpha) - A).tocsc()
        self.precision.sort_indices()
        self._lu = None
        self.alpha.flags.writeable = False
        # the diagonal's method and cost now (a graph too costly is refused where it is built: on every rank of
        # `train graph` alike), the diagonal itself at its first use (the server's: the workers never need it)
        self._khat = self._scale = None
        if khat_diag is not None:
            self._set_diag(np.array(khat_diag, dtype=np.float64).reshape(-1))
        else:
            self._plan = diagonal_plan(self.precision, what, lambda: self.lu)

    def _set_diag(self, khat):
        self._khat = khat
        self._scale = 1.0 / np.sqrt(khat) if self.normalize else np.ones(self.m)
        for array in (self._khat, self._scale):
            array.flags.writeable = False

    @property
    def khat_diag(self):
        """``diag(K_hat)`` (computed at the first use: :func:`inverse_diagonal`)."""
        if self._khat is None:
            self._set_diag(inverse_diagonal(self.precision, self.what, self._plan, self.lu))
        return self._khat

    @property
    def scale(self):
        """S's diagonal: ``diag(K_hat)^-1/2`` (normalized) or ones."""
        if self._scale is None:
            self.khat_diag
        return self._scale

    @property
    def m(self):
        return self.adjacency.shape[0]

    @property
    def shape(self):
        return (self.m, self.m)

    @property
    def lu(self):
        """P's sparse LU (formed at the first product: a reader that only stores or samples needs none)."""
        if self._lu is None:
            import scipy.sparse.linalg as spla
            self._lu = spla.splu(self.precision, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                                 options={"SymmetricMode": True})
        return self._lu

    def copy(self):
        return self        # immutable: its arrays are read-only and nothing changes it

    def solve(self, X):
        """``K_hat X`` (X: m rows or an m-vector)."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim == 2 and X.shape[1] == 0:
            return np.zeros_like(X)
        return self.lu.solve(np.ascontiguousarray(X))

    def matmul(self, X):
        """``Sigma @ X = S K_hat (S X)``."""
        X = np.asarray(X, dtype=np.float64)
        s = self.scale if X.ndim == 1 else self.scale[:, None]
        return s * self.solve(s * X)

    def inverse_matmul(self, X):
        """``Sigma^-1 @ X = S^-1 P (S^-1 X)``: a sparse product."""
        X = np.asarray(X, dtype=np.float64)
        s = self.scale if X.ndim == 1 else self.scale[:, None]
        return (self.precision @ (X / s)) / s

    def diag(self):
        """``sigma_ii``: exactly 1 when normalized."""
        return np.ones(self.m) if self.normalize else self.khat_diag.copy()

    def inverse_diag(self):
        return self.precision.diagonal() / (self.scale * self.scale)

    def inverse_column(self, i):
        col = self.precision[:, [i]].toarray().reshape(-1)
        return col / self.scale / self.scale[i]

    def rows(self, idx, cols=None):
        """``Sigma[np.ix_(idx, cols)]`` from ``len(idx)`` sparse solves (K_hat is symmetric)."""
        idx = np.asarray(idx, dtype=np.int64)
        cols = np.arange(self.m) if cols is None else np.asarray(cols, dtype=np.int64)
        E = np.zeros((self.m, idx.size))
        E[idx, np.arange(idx.size)] = self.scale[idx]
        Z = self.solve(E)                                  # column k: K_hat S e_idx[k]
        M = (Z[cols] * self.scale[cols][:, None]).T
        if self.normalize:                                 # the unit diagonal exactly, as task_kernel's
            M[idx[:, None] == cols[None, :]] = 1.0
        return M

    correlation = sampled_correlation      # from rows and diag, as SigmaFactors'
    pieces = row_pieces

    def abs_times(self, x):
        """``|Sigma| @ x = Sigma @ x`` (K_hat >= 0 entrywise, S > 0): one sparse solve."""
        return self.matmul(x)

    def abs_bound(self, x):
        return self.matmul(x)

    def is_diagonal(self) -> bool:
        """No edge: K_hat = diag(1 / alpha).  An edge makes its component's block of K_hat entrywise positive
        (the inverse of an irreducible M-matrix)."""
        return self.adjacency.nnz == 0

    def dense(self):
        """The m x m matrix (small m only): :func:`hpcmtl.task_graph.task_kernel`'s arithmetic on the sparse LU."""
        K = self.solve(np.eye(self.m))
        K = 0.5 * (K + K.T)
        if self.normalize:
            K = K * np.outer(self.scale, self.scale)
            np.fill_diagonal(K, 1.0)
        return K

    def arrays(self):
        A = self.adjacency
        return {"graph_indptr": A.indptr.astype(np.int64), "graph_indices": A.indices.astype(np.int64),
                "graph_data": A.data, "graph_alpha": self.alpha, "graph_normalize": np.array(int(self.normalize)),
                "graph_diag": self.khat_diag}

    def signature_bytes(self):
        """The bytes that identify this Sigma (a checkpoint's must-match key), O(m + edges): the graph, alpha and
        normalize, which determine the rest (not the diagonal: no rank computes it for a signature)."""
        A = self.adjacency
        return b"".join(np.ascontiguousarray(v).tobytes() for v in
                        (A.indptr.astype(np.int64), A.indices.astype(np.int64), A.data, self.alpha,
                         np.array(int(self.normalize))))

    @classmethod
    def from_arrays(cls, arrays, path="checkpoint", where="state", m=None):
        """The graph covariance of a checkpoint's or a result file's arrays; None when it has none; a one-line
        InputError naming the fields when they do not fit together or with ``m`` tasks."""
        if "graph_indptr" not in arrays:
            return None
        import scipy.sparse as sp
        try:
            missing = [k for k in GRAPH_FIELDS if k not in arrays]
            if missing:
                raise ValueError(f"missing {missing}")
            indptr, indices = (np.asarray(arrays[k]).reshape(-1) for k in ("graph_indptr", "graph_indices"))
            data, alpha, khat = (np.asarray(arrays[k], dtype=np.float64).reshape(-1)
                                 for k in ("graph_data", "graph_alpha", "graph_diag"))
            n = alpha.size if m is None else m
            if (indptr.size != n + 1 or alpha.size != n or khat.size != n or indices.size != data.size
                    or indptr.dtype.kind not in "iu" or indices.dtype.kind not in "iu"
                    or not np.all(np.isfinite(data)) or np.any(data < 0) or not np.all(np.isfinite(alpha))
                    or np.any(alpha < 0) or not np.all(khat > 0) or not np.all(np.isfinite(khat))):
                raise ValueError("shapes or values")
            A = sp.csr_matrix((data, indices, indptr), shape=(n, n))
            A.check_format(full_check=True)
            if (A != A.T).nnz:
                raise ValueError("not symmetric")
        except ValueError:
            raise InputError(f"{path}: fields '{where}/graph_indptr', 'graph_indices', 'graph_data', 'graph_alpha', "
                             f"'graph_diag': the task graph does not fit its {m if m is not None else '?'} tasks "
                             f"(a symmetric adjacency with weights >= 0, alpha >= 0)") from None
        return cls(A, alpha, bool(np.asarray(arrays["graph_normalize"]).reshape(-1)[0]), khat, what=path)


def diagonal_plan(P, what="graph", lu=None):
    """How :func:`inverse_diagonal` computes ``diag(P^-1)`` of a sparse SPD P exactly (to rounding): ``("banded",
    order, b)`` or ``("solves", None, b)``, the cheaper of two methods by their flop counts:

    * banded: P's rows and columns in reverse Cuthill-McKee ``order`` have a bandwidth b; its banded Cholesky
      ``P = L L^T`` (LAPACK pbtrf) and Takahashi's recurrence, column j from the last, give the band of
      ``Z = P^-1``: ``z = -Z_w l``, ``Z_jj = 1 / L_jj^2 - l . z`` (``l = L[j+1:j+b+1, j] / L_jj``, ``Z_w`` the
      b x b window of Z below j, kept in a circular buffer): m b^2 flops, (b + 1) m values.  Chains (b = 1),
      cycles (2) and grids (b = the shorter side) cost O(m) to O(m b^2).
    * blocked solves: P's sparse LU (``lu()``, SuperLU's) solved for ``DIAG_SOLVE_COLUMNS`` unit columns at a
      time: 2 m nnz(LU) flops (a star: an LU with no fill, where its bandwidth is m / 2).

    The LU is asked for only when the band is not surely the cheaper (``2 m nnz(P)`` bounds the solves' flops
    from below).  A one-line InputError naming the graph and both costs when the cheaper costs more than
    :data:`GRAPH_DIAG_MAX_FLOPS` flops."""
    import scipy.sparse.csgraph as csgraph
    m = P.shape[0]
    if m == 0:
        return ("banded", np.zeros(0, dtype=np.int64), 0)
    order = csgraph.reverse_cuthill_mckee(P.tocsr(), symmetric_mode=True)
    rows, cols = P.tocsr()[order][:, order].nonzero()
    b = int(np.max(np.abs(rows - cols))) if rows.size else 0
    band_flops = float(m) * max(b, 1) ** 2
    band_fits = (b + 1) * m <= GRAPH_BAND_MAX_VALUES
    if band_fits and band_flops <= GRAPH_DIAG_MAX_FLOPS and band_flops <= 2.0 * m * P.nnz:
        return ("banded", order, b)
    solve_flops = 2.0 * m * (lu().L.nnz + lu().U.nnz)
    banded = band_fits and band_flops <= solve_flops
    if min(band_flops if banded else np.inf, solve_flops) > GRAPH_DIAG_MAX_FLOPS:
        raise InputError(f"{what}: the diagonal of (L + diag(alpha))^-1 over {m} tasks costs {band_flops:.2g} flops "
                         f"banded (bandwidth {b}) or {solve_flops:.2g} by sparse solves, above the "
                         f"{GRAPH_DIAG_MAX_FLOPS:.0e} supported (docs/many-tasks.md): use a graph of smaller "
                         f"bandwidth or fewer tasks")
    return ("banded", order, b) if banded else ("solves", None, b)


def inverse_diagonal(P, what="graph", plan=None, lu=None):
    """``diag(P^-1)`` by :func:`diagonal_plan`'s method (``plan``, else planned here; ``lu``: P's SuperLU, else
    formed here when the plan asks for solves)."""
    import scipy.sparse.linalg as spla

    def factor():
        nonlocal lu
        if lu is None:
            lu = spla.splu(P.tocsc(), permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                           options={"SymmetricMode": True})
        return lu
    method, order, b = plan if plan is not None else diagonal_plan(P, what, factor)
    m = P.shape[0]
    if method == "banded":
        out = np.empty(m)
        out[order] = _banded_inverse_diagonal(P.tocsr()[order][:, order].tocoo(), b)
        return out
    lu = factor()
    out = np.empty(m)
    for start in range(0, m, DIAG_SOLVE_COLUMNS):
        cols = np.arange(start, min(start + DIAG_SOLVE_COLUMNS, m))
        E = np.zeros((m, cols.size))
        E[cols, np.arange(cols.size)] = 1.0
        out[cols] = lu.solve(E)[cols, np.arange(cols.size)]
    return out


def _banded_inverse_diagonal(Q, b):
    """:func:`inverse_diagonal`'s banded method on Q (COO, bandwidth b, in band order)."""
    import scipy.linalg
    m = Q.shape[0]
    if b == 0:
        return 1.0 / Q.diagonal()
    ab = np.zeros((b + 1, m))
    low = Q.row >= Q.col
    ab[Q.row[low] - Q.col[low], Q.col[low]] = Q.data[low]
    L = scipy.linalg.cholesky_banded(ab, lower=True, check_finite=False)
    for k in range(1, b + 1):                   # LAPACK leaves the entries past the last row unset
        L[k, m - k:] = 0.0
    window = np.zeros((b, b))                    # Z[p, q] for p, q in (j, j + b] at slots p % b, q % b
    z = np.empty(m)
    for j in range(m - 1, -1, -1):
        ljj = L[0, j]
        l = np.roll(L[1:, j] / ljj, (j + 1) % b)     # l at the slots of rows j + 1 .. j + b
        col = -(window @ l)
        zjj = 1.0 / (ljj * ljj) - float(l @ col)
        z[j] = zjj
        s = j % b                                # the slot of row j + b, which leaves the window
        window[s, :] = col
        window[:, s] = col
        window[s, s] = zjj
    return z


def is_graph(Sigma) -> bool:
    return isinstance(Sigma, GraphSigma)
