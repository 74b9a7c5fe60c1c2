"""Where the DMTRL server keeps its per-task d-vectors (B, W, the momentum dP) and its algebra on them.

One small interface, two implementations, chosen once a run from the task supports
(:func:`support_algebra_pays`, the same at every rank count and with split tasks):

* :class:`DenseSpace`: a task array is ``m x d`` rows; NumPy and BLAS (``Sigma @ B``,
  ``dB @ dB.T``): the arithmetic of dense problems, unchanged.
* :class:`SupportSpace`: a task array is one flat vector, task i's numbers on its support
  ``T_i`` (sorted feature ids) after task i-1's: ``b_i`` and ``db_i`` vanish off ``T_i``
  and ``w_i`` is only read there (the workers on their blocks' supports, the objective in
  ``b_i . w_i``).  With ``c_f`` the number of tasks whose support holds feature f, a round
  costs ``O(sum_f c_f^2 + sum_i |T_i|)`` instead of ``O(m^2 d)``:

  - ``w_i = (1/lam) sum_j Sigma_ij b_j`` on ``T_i``: one fixed-pattern sparse matrix over
    the pairs of positions sharing a feature (``sum_f c_f^2`` of them), values
    ``Sigma_ij / lam`` refreshed once per Sigma;
  - Gram matrices ``X X^T`` (and ``[X; Y][X; Y]^T``): the features of one support add to the
    diagonal only (per-task sums); the shared ones (``c_f >= 2``) go through BLAS on a dense
    ``m x |shared|`` block when that block is small beside their ``sum c_f^2`` pairs, else through a
    fixed-pattern CSR ``m x d`` times its transpose, the compact values as ``.data``;
  - per-task dot products: sums over each task's contiguous positions (``np.add.reduceat``, numpy's
    pairwise summation: several times faster than ``np.bincount`` with weights).

A task array of either space is what ``BT``, ``WT`` and ``dPT`` of
:class:`hpcmtl.dmtrl.StepSolver` hold; :meth:`dense` and :meth:`compact` convert to and
from ``m x d`` rows where dense rows must exist (results, checkpoints, local rounds).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

# the support algebra when sum_f c_f^2 <= SUPPORT_ALGEBRA m^2 d (its sparse products cost several BLAS flops each)
SUPPORT_ALGEBRA = 1.0 / 8.0
# Grams through a dense block of the shared features when m |shared| <= SHARED_DENSE sum_{shared f} c_f^2
SHARED_DENSE = 8.0


def task_supports(index, block_task, m, d):
    """Each task's support ``T_i``: the union of its blocks' exchange indices (all d for a block exchanged
    whole), the same however the task is cut into blocks."""
    parts = [[] for _ in range(m)]
    for k, task in enumerate(block_task):
        parts[int(task)].append(np.asarray(index[k], dtype=np.int64))
    out = []
    for p in parts:
        t = np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=np.int64)
        t = t[np.concatenate([[True], t[1:] != t[:-1]])] if t.size else t      # np.unique (sorting, no hashing)
        out.append(t)
    return out


def support_algebra_pays(supports, d) -> bool:
    """Whether the server's algebra on task supports beats the dense one: ``sum_f c_f^2 <= SUPPORT_ALGEBRA
    m^2 d`` (``c_f``: how many supports hold feature f)."""
    m = len(supports)
    if m == 0 or d == 0:
        return False
    counts = np.bincount(np.concatenate(supports), minlength=d).astype(np.float64)
    return float(counts @ counts) <= SUPPORT_ALGEBRA * m * m * d


def segment_sums(values, offsets):
    """Per segment ``values[offsets[i]:offsets[i + 1]].sum()`` (0 for an empty one): ``np.add.reduceat`` over
    the non-empty segments (its pairwise summation depends on the values and the segment bounds only)."""
    out = np.zeros(offsets.size - 1)
    starts = offsets[:-1]
    full = np.flatnonzero(offsets[1:] > starts)
    if full.size:
        out[full] = np.add.reduceat(values, starts[full])
    return out


class DenseSpace:
    """Task arrays as ``m x d`` rows: the dense arithmetic (the same expressions, the same bits, as before
    the support space existed).  Stateless: one instance serves every server and worker."""

    sparse = False

    def dense(self, X):
        """``m x d`` rows of a task array (the array itself)."""
        return X

    def compact(self, rows):
        """A task array (a copy) of ``m x d`` rows."""
        return np.array(rows, dtype=np.float64)

    def finite_rows(self, X):
        """What :func:`hpcmtl.engine.check_finite_rows` checks of a task array: its rows."""
        return X

    def dots(self, X, Y):
        """Per task ``x_i . y_i``."""
        return np.einsum("ij,ij->i", X, Y)

    def total(self, X, Y):
        """``sum_i x_i . y_i``."""
        return float(np.sum(X * Y))

    def gram(self, X):
        """``X X^T`` (m x m)."""
        return X @ X.T

    def gram_dots2(self, W, X, Y):
        """``(D2 D2^T, per row w . D2)`` of ``D2 = [X; Y]`` (2m rows; w the task's own row of W, twice)."""
        D2 = np.vstack([X, Y])
        return D2 @ D2.T, np.einsum("ij,ij->i", np.vstack([W, W]), D2)

    def add(self, Y, X):
        """``Y += X`` in place."""
        Y += X

    def add_scaled(self, Y, c, X):
        """``Y += diag(c) X`` in place (c: one number a task)."""
        Y += c[:, None] * X

    def add_two(self, Y, c1, X1, c2, X2):
        """``Y += diag(c1) X1 + diag(c2) X2`` in place."""
        Y += c1[:, None] * X1 + c2[:, None] * X2

    def combine(self, c1, X1, c2, X2):
        """``diag(c1) X1 + diag(c2) X2`` (new)."""
        return c1[:, None] * X1 + c2[:, None] * X2

    def mix(self, Sigma, B, lam):
        """``W = Sigma B / lam`` (task rows)."""
        return (Sigma @ B) / lam

    def wtw(self, W, B, Sigma, lam):
        """``W^T W`` (m x m) with W as d x m columns: the Omega-step's matrix."""
        W = W.T
        return W.T @ W


DENSE = DenseSpace()


class SupportSpace:
    """Task arrays on the task supports: one flat vector, task i's values on ``T_i`` at
    ``offsets[i]:offsets[i + 1]`` (see the module docstring for the costs)."""

    sparse = True

    def __init__(self, supports, d, shared_dense=None):
        self.m, self.d = len(supports), int(d)
        self.supports = [np.asarray(t, dtype=np.int64) for t in supports]
        self.sizes = sizes = np.array([t.size for t in self.supports], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.size = int(self.offsets[-1])
        self.task_of = np.repeat(np.arange(self.m), sizes)
        self.feature = np.concatenate(self.supports) if self.supports else np.zeros(0, dtype=np.int64)
        # positions in feature order (tasks ascending within a feature): the transpose's CSR order
        self.by_feature = np.argsort(self.feature, kind="stable")
        self.counts = np.bincount(self.feature, minlength=self.d)
        self._rows = sp.csr_matrix((np.zeros(self.size), self.feature.astype(np.int32),
                                    self.offsets.astype(np.int32)), shape=(self.m, self.d))
        self._cols = self._transposed(self.task_of[self.by_feature], self.m, self.counts)
        self._rows2 = self._cols2 = self._by_feature2 = None
        self._mixer = self._pairs = self._sigma = None
        # Grams: positions of features in one support only (the diagonal) and of the shared ones (a dense block)
        shared = self.counts[self.feature] >= 2
        self.lone = np.flatnonzero(~shared)
        self.lone_task = self.task_of[self.lone]
        self.lone_offsets = np.searchsorted(self.lone_task, np.arange(self.m + 1))    # lone is in task order
        self.shared = np.flatnonzero(shared)
        columns = np.flatnonzero(self.counts >= 2)
        self.n_shared = columns.size
        self.shared_cell = self.task_of[self.shared] * columns.size + np.searchsorted(columns, self.feature[self.shared])
        if shared_dense is None:
            pairs = float(np.sum(self.counts[columns].astype(np.float64) ** 2))
            shared_dense = self.m * columns.size <= SHARED_DENSE * pairs
        self.shared_dense = bool(shared_dense)
        self._gram_blocks = {}     # _gram_shared's dense blocks, by number of parts

    def _transposed(self, row_of_sorted, n_rows, counts):
        """An empty ``d x n_rows`` CSR whose row f lists, ascending, the ``counts[f]`` rows holding feature f."""
        indptr = np.concatenate([[0], np.cumsum(counts)])
        return sp.csr_matrix((np.zeros(row_of_sorted.size), row_of_sorted.astype(np.int32), indptr.astype(np.int32)),
                             shape=(self.d, n_rows))

    # -- conversions ------------------------------------------------------------
    def dense(self, X):
        """``m x d`` rows of a task array, zeros off the supports."""
        out = np.zeros((self.m, self.d))
        out[self.task_of, self.feature] = X
        return out

    def compact(self, rows):
        """The task array of ``m x d`` rows (their values off the supports are dropped: zeros for B and dP)."""
        return np.asarray(rows, dtype=np.float64)[self.task_of, self.feature]

    def finite_rows(self, X):
        """Per task the first non-finite value of its part of X (0 where all are finite): what
        :func:`hpcmtl.engine.check_finite_rows` checks and names."""
        out = np.zeros(self.m)
        bad = np.flatnonzero(~np.isfinite(X))
        if bad.size:
            out[self.task_of[bad[::-1]]] = X[bad[::-1]]      # the first bad value of each task wins
        return out

    # -- algebra -----------------------------------------------------------------
    def dots(self, X, Y):
        return segment_sums(X * Y, self.offsets)

    def total(self, X, Y):
        return float(np.sum(X * Y))

    def gram(self, X):
        if self.shared_dense:
            return self._gram_shared([X])
        self._rows.data = np.asarray(X, dtype=np.float64)
        self._cols.data = X[self.by_feature]
        return (self._rows @ self._cols).toarray()

    def _gram_shared(self, parts):
        """``[X; Y; ...][X; Y; ...]^T``: BLAS on the dense block of the shared features, plus each task's sums
        over the features of its support alone (the diagonal of each pair of parts)."""
        m, u = self.m, self.n_shared
        D = self._gram_blocks.get(len(parts))
        if D is None:          # kept: only the shared cells are written, the others stay zero (no 2m x u memset)
            D = self._gram_blocks[len(parts)] = np.zeros((len(parts) * m, u))
        cells = D.reshape(-1)
        for k, X in enumerate(parts):
            cells[k * m * u + self.shared_cell] = X[self.shared]
        G = D @ D.T
        tasks = np.arange(m)
        lone = [X[self.lone] for X in parts]
        for a in range(len(parts)):
            for b in range(a, len(parts)):
                add = segment_sums(lone[a] * lone[b], self.lone_offsets)
                G[a * m + tasks, b * m + tasks] += add
                if b != a:
                    G[b * m + tasks, a * m + tasks] += add
        return G

    def gram_dots2(self, W, X, Y):
        if self.shared_dense:
            return self._gram_shared([X, Y]), np.concatenate([self.dots(W, X), self.dots(W, Y)])
        if self._rows2 is None:
            m, n = self.m, self.size
            self._rows2 = sp.csr_matrix((np.zeros(2 * n), np.concatenate([self.feature, self.feature]).astype(np.int32),
                                         np.concatenate([self.offsets, n + self.offsets[1:]]).astype(np.int32)),
                                        shape=(2 * m, self.d))
            self._by_feature2 = np.argsort(np.concatenate([self.feature, self.feature]), kind="stable")
            row_of = np.concatenate([self.task_of, m + self.task_of])[self._by_feature2]
            self._cols2 = self._transposed(row_of, 2 * m, 2 * self.counts)
        data = np.concatenate([X, Y])
        self._rows2.data = data
        self._cols2.data = data[self._by_feature2]
        return (self._rows2 @ self._cols2).toarray(), np.concatenate([self.dots(W, X), self.dots(W, Y)])

    def add(self, Y, X):
        Y += X

    def spread(self, c):
        """One number a task on each of its positions (``c[task_of]``, by ``np.repeat``: several times faster)."""
        return np.repeat(np.asarray(c, dtype=np.float64), self.sizes)

    def add_scaled(self, Y, c, X):
        Y += self.spread(c) * X

    def add_two(self, Y, c1, X1, c2, X2):
        Y += self.spread(c1) * X1 + self.spread(c2) * X2

    def combine(self, c1, X1, c2, X2):
        return self.spread(c1) * X1 + self.spread(c2) * X2

    def mix(self, Sigma, B, lam):
        """``w_i = (1/lam) sum_j Sigma_ij b_j`` on ``T_i``: the pairs of positions sharing a feature."""
        if self._mixer is None:
            self._mixer, self._pairs = self._pair_matrix()
        key = (float(lam), np.asarray(Sigma).tobytes())
        if self._sigma != key:
            self._mixer.data = Sigma[self._pairs[0], self._pairs[1]] / lam
            self._sigma = key
        return self._mixer @ B

    def _pair_matrix(self):
        """The ``N x N`` CSR over pairs of positions with the same feature, and each entry's (task, task)."""
        order = self.by_feature
        count = self.counts[self.feature[order]]                  # per sorted position: its feature's c_f
        start = (np.cumsum(self.counts) - self.counts)[self.feature[order]]
        rows = np.repeat(order, count)
        total = int(count.sum())
        within = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
        cols = order[np.repeat(start, count) + within]
        key = np.arange(1, total + 1, dtype=np.float64)           # exact: which pair each entry is
        mixer = sp.csr_matrix((key, (rows, cols)), shape=(self.size, self.size))
        mixer.sort_indices()
        entry = mixer.data.astype(np.int64) - 1
        return mixer, (self.task_of[rows[entry]], self.task_of[cols[entry]])

    def wtw(self, W, B, Sigma, lam):
        """``W^T W = Sigma (B^T B) Sigma / lam^2`` from B's Gram (W is not zero off the supports, B is)."""
        G = (Sigma @ self.gram(B) @ Sigma) / (lam * lam)
        return 0.5 * (G + G.T)

    # -- the exchange: flat support values of the blocks (plan order) <-> task arrays ------------------------
    def exchange(self, index, block_task):
        """Bind the blocks' exchange indices (:class:`hpcmtl.dmtrl.SupportLayout`'s ``index``, plan order)."""
        self.block_task = np.asarray(block_task, dtype=np.int64)
        self.block_sizes = np.array([np.asarray(i).size for i in index], dtype=np.int64)
        self.block_pos = [self.offsets[t] + np.searchsorted(self.supports[t], np.asarray(i, dtype=np.int64))
                          for t, i in zip(self.block_task, index)]
        self._up, self._down = {}, {}
        return self

    def _up_maps(self, vectors, scalars):
        key = (vectors, scalars)
        if key not in self._up:
            lengths = vectors * self.block_sizes + scalars
            start = np.cumsum(lengths) - lengths
            src, tgt, scal = [], [], []
            for k, pos in enumerate(self.block_pos):
                size = int(self.block_sizes[k])
                for v in range(vectors):
                    src.append(start[k] + v * size + np.arange(size))
                    tgt.append(v * self.size + pos)
                scal.append(start[k] + vectors * size + np.arange(scalars))
            cat = (lambda parts: np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64))
            src, tgt, scal = cat(src), cat(tgt), cat(scal)
            whole = tgt.size == vectors * self.size and bool(np.all(np.bincount(tgt, minlength=tgt.size) == 1))
            self._up[key] = (src, tgt, scal, whole, int(lengths.sum()))
        return self._up[key]

    def from_flat(self, flat, vectors, scalars):
        """``([per-task sum of the blocks' vector v as a task array, v < vectors], per-block scalars)`` of a
        GATHER_SUPPORT's flat values; the blocks of a task add up in plan order."""
        src, tgt, scal, whole, total = self._up_maps(vectors, scalars)
        if flat.size != total:
            raise ValueError(f"{flat.size} support values, the layout has {total}")
        if whole:
            buf = np.empty(vectors * self.size)
            buf[tgt] = flat[src]
        else:
            buf = np.bincount(tgt, weights=flat[src], minlength=vectors * self.size)
        vecs = [buf[v * self.size:(v + 1) * self.size] for v in range(vectors)]
        return vecs, flat[scal].reshape(len(self.block_pos), scalars)

    def vectors_to_flat(self, arrays):
        """A SCATTER_SUPPORT's flat values of several task arrays, no scalars: every block's ``[its task's
        values of arrays[0] on S_k, of arrays[1] on S_k, ...]``."""
        source = np.concatenate(arrays) if arrays else np.zeros(0)
        pieces = [v * self.size + pos for pos in self.block_pos for v in range(len(arrays))]
        return source[np.concatenate(pieces).astype(np.int64)] if pieces else np.zeros(0)

    def to_flat(self, W, scalars):
        """A SCATTER_SUPPORT's flat values: every block's ``[its task's w on S_k, its task's scalars]``
        (``scalars``: m x s per task, or None)."""
        s = 0 if scalars is None else scalars.shape[1]
        if s not in self._down:
            parts = []
            for k, pos in enumerate(self.block_pos):
                parts += [pos, self.size + s * self.block_task[k] + np.arange(s)]
            self._down[s] = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
        source = W if s == 0 else np.concatenate([W, np.ascontiguousarray(scalars, dtype=np.float64).reshape(-1)])
        return source[self._down[s]]
