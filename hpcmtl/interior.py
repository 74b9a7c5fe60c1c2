"""Interior-point W-steps: the coupled hinge (smoothed hinge) dual under a learned Sigma.

The W-step's dual in ``x = y o alpha`` (every task's block of coordinates in [0, 1])
is the box QP ``max_x sum_i (1/n_i) sum_j (x_ij - gamma x_ij^2 / 2) - tr(B Sigma B^T) / (2 lam)``
with ``b_i = Z_i^T x_i / n_i`` and ``Z_i = diag(y_i) X_i``.  Under a learned Sigma of rank
``d + 1 < m`` (the rest at the eigenvalue floor) its Hessian is so ill-conditioned that
the per-task steps of the 'qp' aggregation, exact local solves, momentum, ADMM and
L-BFGS-B all stall (relative gaps of 1e-3 to 0.25 after hundreds of rounds).  A
primal-dual interior-point method does not care: its Newton system is solved exactly.

One iteration is one round of exchanges, the server never sees a row:

1. every block sends ``G_i = Z_i^T diag(1/h) Z_i / n_i^2`` (d x d, its upper triangle) and
   ``v_i = Z_i^T (r / h) / n_i`` (d), ``h = z/x + s/(1-x) (+ gamma/n_i)`` the barrier's
   curvature (held at >= ``REGULARIZATION ||K|| max_j ||z_j||^2 / n_i^2`` in the solves) and
   ``r = g + mu/x - mu/(1-x)``, ``g`` the dual's gradient at x;
2. the server solves the coupled Newton system by Woodbury through
   ``K = (Sigma / lam) (x) I_d``: ``y = K^(1/2) (I + K^(1/2) G K^(1/2))^-1 K^(1/2) v``
   (:class:`NewtonSystem`, a (d m) x (d m) Cholesky of a matrix whose eigenvalues are >= 1,
   however singular Sigma is), and sends each task its ``y_i``;
3. every block takes ``dx = (r - Z_i y_i / n_i) / h`` and sends ``Z_i^T dx / n_i``;
4. ``REFINEMENTS`` times: the server sends the w of dx, ``(K Z^T dx)_i``, every block the v
   of its residual ``r - h dx - Z_i (K Z^T dx)_i / n_i`` (the true h), the server solves with
   the same factor, every block corrects dx and sends ``Z_i^T dx / n_i`` again; with it the
   largest steps that keep x, z and s inside (a common step for all tasks: the Newton
   direction is a joint one).

So a round moves ``d (d + 1) / 2 + O(d)`` numbers a task: this solver is for small d
(``START_FEATURES`` at the start of a coupled W-step, ``MAX_FEATURES`` after a stall) and a small server
system (``MAX_WIDTH`` = d m under a coupled Sigma; a diagonal one gives m systems of d x d).  What they
cost and reach on small raw-feature tasks is in docs/dmtrl-notes.md.

The arithmetic here is per block and per server step, with no MPI and no files
(:mod:`hpcmtl.dmtrl` wires it into rounds).  Everything is deterministic: the same
bits at every rank count (each block's numbers depend on its own rows only, the
server's on per-task sums taken in task order).
"""
from __future__ import annotations

import numpy as np
from scipy.linalg import LinAlgError, cho_factor, cho_solve, eigh

from . import _blockops

START_FEATURES = 64     # d: a W-step under a coupled Sigma starts with these rounds (each task's d x d G_i travels
                        # every round: d (d + 1) / 2 numbers, at most 33 d here)
MAX_FEATURES = 256      # d: a W-step whose other rounds stalled turns to them (dmtrl.interior_rounds.INTERIOR_AFTER_STALL); there
                        # d (d + 1) / 2 numbers a task and round are the price of a certificate the O(d) rounds
                        # do not reach (raw features far above 1: 6 tasks of 800-2,500 rows, 100 features, 10 of
                        # them on scales up to 7,000, hinge, lam 1e-2: 500 rounds and 594 s left the first W-step
                        # at a relative gap of 0.86; turned here, 27 rounds, 6.7 s)
MAX_WIDTH = 1024        # d m under a coupled Sigma: the server's Newton system, a dense Cholesky of (d m)^2 numbers
                        # (a diagonal Sigma: m systems of d x d, bounded by MAX_SYSTEM_VALUES alone)
MAX_ROW_VALUES = 2 ** 25    # n_i d: a block's rows times labels are kept dense for G_i (256 MB)
MAX_SYSTEM_VALUES = 2 ** 22 # m d (d + 1) / 2: the tasks' G_i triangles a round brings to the server (32 MB)
START_MARGIN = 0.05     # x starts at the engine's alpha moved into [START_MARGIN, 1 - START_MARGIN]
CENTERING = 0.1         # mu = CENTERING * (z.x + s.(1 - x)) / (2 N): the barrier parameter of the next step
INSIDE = 1e-15          # x is kept in [INSIDE, 1 - INSIDE] (a coordinate there is at its bound to rounding)
TO_BOUNDARY = 0.995     # steps stop this fraction of the way to the nearest bound
MAX_ROUNDS = 100        # interior-point rounds a W-step at most; then the 'qp' rounds go on from the best point
REFINEMENTS = 2         # iterative refinements of every Newton step (2 more exchanges each): the Woodbury form's
                        # dx = (r - Z y / n) / h cancels for free coordinates (h ~ mu), and its error grows like
                        # 1/mu; refinement through the residual of the full system corrects it
REGULARIZATION = 1e-12  # the solves use max(h, REGULARIZATION ||K|| max_j ||z_j||^2 / n^2) for h: I + K^(1/2) G K^(1/2)
                        # then has a condition number below about 1e12 (the refinements go on against the true
                        # h).  Without it, raw features at lam 1e-6 gave Newton steps no refinement could fix
STALL_ROUNDS = 12       # ... or when the iterate's duality gap has not halved in this many rounds
DIVERGED = 100.0        # ... or at once when it is this many times its smallest (the Newton steps' rounding
                        # grows like 1/mu: at lam 1e-6 on raw features the gap stops near 1e-5 and then grows)


def dot(a, b):
    """``a . b`` added in index order (``_blockops.ordered_dot``): BLAS's ddot sums in an order that depends
    on alignment.  Looked up at each call, so the kernel tests can swap in the bounds-checked build."""
    return _blockops.ordered_dot(a, b)


class BlockIterate:
    """One block's interior-point iterate: ``x`` in (0, 1) (``x = y o alpha``), the multipliers ``z`` of
    ``x >= 0`` and ``s`` of ``x <= 1``, and the pending Newton step.

    ``block``: a :class:`hpcmtl.taskdata.TaskBlock` (its products with X are the engine's own, the same bits
    at every rank count; its rows times their labels are kept dense for G, n_rows x p: small p only);
    ``gamma``: the smoothed hinge's (0 for the hinge)."""

    def __init__(self, block, beta, gamma=0.0):
        self.block = block
        self.Z = block.signed_rows()
        self.n = float(block.n_task)
        self.gamma = float(gamma)
        self.x = np.clip(np.clip(beta, 0.0, 1.0), START_MARGIN, 1.0 - START_MARGIN)
        self.z = np.full(self.x.size, 1.0 / self.n)
        self.s = np.full(self.x.size, 1.0 / self.n)
        self.dx = self.dz = self.ds = None
        self.r = self.h = self.h_solve = self.res = None
        self.mu = 0.0

    def zt(self, v):
        """``Z^T v / n``."""
        return self.block.rmatvec(self.block.y * v) / self.n

    def b(self):
        """``Z^T x / n``: the block's share of b_i at x."""
        return self.zt(self.x)

    def complementarity(self):
        return dot(self.z, self.x) + dot(self.s, 1.0 - self.x)

    def move(self, a_primal, a_dual):
        """Take the pending step with the server's step lengths (nothing pending: nothing)."""
        if self.dx is not None:
            # the steps stop short of the bounds in exact arithmetic; rounding can still land on one (1 - x
            # below half an ulp of 1): held INSIDE away, where the barrier terms stay finite
            self.x = np.clip(self.x + a_primal * self.dx, INSIDE, 1.0 - INSIDE)
            self.z = self.z + a_dual * self.dz
            self.s = self.s + a_dual * self.ds
            self.dx = self.dz = self.ds = None

    def system(self, w, mu, k_norm):
        """``(G, v)`` of the Newton system at x (``w``: x's w) for the barrier parameter ``mu``; ``k_norm``:
        ``||K|| = max eig(Sigma) / lam``, which sets the curvature floor of the solves (:data:`REGULARIZATION`)."""
        x, n = self.x, self.n
        margins = self.block.y * self.block.decision(w)
        g = (1.0 - margins - self.gamma * x) / n              # the dual's gradient in x
        self.h = self.z / x + self.s / (1.0 - x) + self.gamma / n
        floor = REGULARIZATION * k_norm * float(np.max(self.block.sq_norms, initial=0.0)) / (n * n)
        self.h_solve = np.maximum(self.h, floor)
        self.r = g + mu / x - mu / (1.0 - x)
        self.mu = mu
        scaled = self.Z / self.h_solve[:, None]
        return (self.Z.T @ scaled) / (n * n), self.zt(self.r / self.h_solve)

    def step(self, y):
        """The Newton step given the server's ``y_i``: ``(Z^T dx / n, largest primal step, largest dual step,
        the 4 coefficients of z.x + s.(1 - x) after steps (a, a'): c00 + a c10 + a' c01 + a a' c11)``."""
        self.dx = (self.r - self.block.y * self.block.decision(y) / self.n) / self.h_solve
        return self.finish()

    def residual(self, wd):
        """The Newton system's residual at the pending dx, ``r - h dx - Z_i (K Z^T dx)_i / n`` (``wd``: the task's
        row of ``K Z^T dx``, the w of dx; the true curvature h), kept for :meth:`correct` -> its ``v``."""
        self.res = self.r - self.h * self.dx - self.block.y * self.block.decision(wd) / self.n
        return self.zt(self.res / self.h_solve)

    def correct(self, y):
        """dx plus the Newton solve of its residual (the server's ``y_i`` for it); returns what :meth:`step` does."""
        self.dx = self.dx + (self.res - self.block.y * self.block.decision(y) / self.n) / self.h_solve
        self.res = None
        return self.finish()

    def finish(self):
        """The multipliers' steps for the pending dx, the largest step lengths and the complementarity's
        coefficients (:meth:`step`)."""
        x, z, s, mu, dx = self.x, self.z, self.s, self.mu, self.dx
        dz = mu / x - z - (z / x) * dx
        ds = mu / (1.0 - x) - s + (s / (1.0 - x)) * dx
        self.dz, self.ds = dz, ds
        primal = min(largest_step(x, dx), largest_step(1.0 - x, -dx))
        dual = min(largest_step(z, dz), largest_step(s, ds))
        coefficients = (self.complementarity(), dot(z - s, dx), dot(dz, x) + dot(ds, 1.0 - x), dot(dz - ds, dx))
        return self.zt(dx), primal, dual, coefficients


def packed(G):
    """The upper triangle of a symmetric d x d ``G``, row by row (what travels: d (d + 1) / 2 numbers)."""
    return G[np.triu_indices(G.shape[0])]


def unpacked(rows, d):
    """The symmetric ``(m, d, d)`` matrices of rows of :func:`packed` triangles."""
    G = np.zeros((rows.shape[0], d, d))
    i, j = np.triu_indices(d)
    G[:, i, j] = rows
    G[:, j, i] = rows
    return G


def largest_step(v, dv, cap=2.0):
    """The largest ``a <= cap`` with ``v + a dv >= 0`` (v > 0)."""
    down = dv < 0
    if not np.any(down):
        return cap
    return float(min(cap, np.min(v[down] / -dv[down])))


def step_lengths(primal, dual):
    """The common step lengths from every block's largest ones."""
    return (min(1.0, TO_BOUNDARY * float(np.min(primal, initial=np.inf))),
            min(1.0, TO_BOUNDARY * float(np.min(dual, initial=np.inf))))


def barrier_parameter(complementarity, n_total):
    return CENTERING * float(complementarity) / (2.0 * n_total)


def is_diagonal(matrix) -> bool:
    """Every entry off the diagonal is exactly zero (a diagonal Sigma couples no tasks)."""
    return not np.any(matrix - np.diag(np.diag(matrix)))


def sigma_root(Sigma, lam):
    """``Sigma^(1/2) / sqrt(lam)`` (m x m, symmetric): K^(1/2) on the task index."""
    if is_diagonal(Sigma):                                # exactly diagonal too (NewtonSystem's blocks)
        return np.diag(np.sqrt(np.clip(np.diag(Sigma), 0.0, None)) / np.sqrt(lam))
    evals, evecs = np.linalg.eigh(0.5 * (Sigma + Sigma.T))
    root = (evecs * np.sqrt(np.clip(evals, 0.0, None))) @ evecs.T / np.sqrt(lam)
    return 0.5 * (root + root.T)


class NewtonSystem:
    """The server's coupled Newton system for the tasks' ``G_i`` (m x d x d): :meth:`solve` gives ``Y`` (m x d)
    with ``vec Y = K^(1/2) (I + K^(1/2) G K^(1/2))^-1 K^(1/2) vec V``, ``K^(1/2) = root (x) I_d`` and ``G`` the
    block diagonal of the ``G_i``: ``(K^-1 + G)^-1 v`` without K^-1.  Factored once, solved for the step and
    its refinements."""

    def __init__(self, root, G):
        m, d = G.shape[0], G.shape[1]
        self.root = root
        self.blocks = None
        if is_diagonal(root):
            # a diagonal Sigma couples nothing: m systems I + root_ii^2 G_i of d x d (m d^3 / 3 flops, no (d m)^2)
            r = np.diag(root)
            self.blocks = [SymmetricSolve(np.eye(d) + (r[i] * r[i]) * G[i]) for i in range(m)]
            return
        # (K^(1/2) G K^(1/2))[i a, j b] = sum_l root[i, l] G_l[a, b] root[l, j]: T = G K^(1/2) (T[l a, j b] =
        # G_l[a, b] root[l, j]) then root times T, (d m)^2 numbers and m^3 d^2 flops
        T = G[:, :, None, :] * root[:, None, :, None]
        S = (root @ T.reshape(m, d * m * d)).reshape(m * d, m * d)
        S = 0.5 * (S + S.T)
        S[np.diag_indices_from(S)] += 1.0
        self.whole = SymmetricSolve(S)

    def solve(self, V):
        m, d = V.shape
        if self.blocks is not None:
            r = np.diag(self.root)[:, None]
            return r * np.array([b.solve(v) for b, v in zip(self.blocks, r * V)]).reshape(m, d)
        u = self.whole.solve((self.root @ V).reshape(-1))
        return self.root @ u.reshape(m, d)


class SymmetricSolve:
    """Solves with a symmetric ``S = I + (a positive semidefinite part)``: a Cholesky factor, or, where rounding
    makes a pivot non-positive, its eigenbasis with the eigenvalues held at >= 1 (what they are in exact
    arithmetic).  Late iterations: free coordinates' curvature 1/h grows like 1/mu, and S's eigenvalues span
    more than 1e16."""

    def __init__(self, S):
        self.factor = self.eigen = None
        try:
            self.factor = cho_factor(S, lower=True, check_finite=True)
        except LinAlgError:
            evals, evecs = eigh(S, check_finite=False)
            self.eigen = (np.maximum(evals, 1.0), evecs)

    def solve(self, u):
        if self.factor is not None:
            return cho_solve(self.factor, u, check_finite=False)
        evals, evecs = self.eigen
        return evecs @ ((evecs.T @ u) / evals)


def coupled_solve(root, G, V):
    """:meth:`NewtonSystem.solve` for one right-hand side."""
    return NewtonSystem(root, G).solve(V)
