"""The box step problem's preconditioner from Sigma's structure (issues 35/36: many tiny hinge tasks).

The server's box QP over per-task steps has the matrix ``A = (Sigma2 o D D^T) / lam + (per-task conjugate
blocks) / n`` (D: one row a coordinate, ``db_i`` for eta_i and ``dq_i`` for beta_i; Sigma2 repeats Sigma for the
second direction).  With Sigma held as factors, ``Sigma = c I + sum_k s'_k v_k v_k^T`` (``s'_k = s_k - c``), so

    A = Dg + Z Z^T,   Z = [sqrt(s'_k / lam) diag(v_k) D]_k   (N x r d),

with Dg block diagonal: task i's 2 x 2 block ``(c / lam) [db_i; dq_i][db_i; dq_i]^T`` plus its conjugate block.
A's Jacobi scaling leaves the low-rank part's r d eigenvalues spread over several decades above the floor's
cluster (``c sigma_ii^-1`` of the diagonal), which costs Jacobi-preconditioned CG hundreds of products a
Newton direction (500 one-row tasks: 50, its cap, every direction).  On a free set F,
``M_FF = Dg_FF + Z_F Z_F^T`` is A_FF itself when every term is kept, and Woodbury solves it through the
capacitance ``C_F = I + Z_F^T Dg_F^-1 Z_F`` (r d x r d): CG then ends in one or two products.

Cost: the capacitance is built once a QP from F's rows (``|F| (r d)^2``) and then updated, Newton iteration to
Newton iteration, by the tasks whose free coordinates changed (``|changes| (r d)^2``), plus one Cholesky
(``(r d)^3 / 3``) an iteration; a preconditioner solve is two products with Z (``O(N r d)``, Z never stored:
its rows are ``u_i (x) D_i``).  Terms beyond ``CAPACITY_MAX`` columns (largest s' first) are left out and their
diagonal joins Dg, so M stays A's diagonal and SPD; Dg's 2 x 2 blocks are inverted like
:func:`.steps.block_jacobi` (a block singular to rounding falls back to its diagonal, a zero diagonal to 0).
M only changes CG's path: the Newton directions, and so the QP's answer, are those CG converges to.
Deterministic: fixed operations in a fixed order on the server alone (the same bits at every rank count).
"""
from __future__ import annotations

import numpy as np
import scipy.linalg

# columns of the capacitance (kept terms x d) at most: (r d)^3 / 3 flops a Newton iteration
CAPACITY_MAX = 512
CHUNK_ROWS = 1024           # rows of Z formed at a time (memory CHUNK_ROWS x r d)


def low_rank_terms(Sigma, lam, d):
    """``(U, sigma_rest)``: the kept terms' row weights ``U[i, k] = sqrt(s'_k / lam) v_ik`` (m x k, largest s'
    first, ``k d <= CAPACITY_MAX``) and ``sigma_rest_i = c + sum_{k left out} s'_k v_ik^2`` (what Dg gets).
    ``Sigma``: :class:`hpcmtl.covariance.SigmaFactors`, or a dense matrix (its eigendecomposition; the
    smallest eigenvalue is c)."""
    if hasattr(Sigma, "V"):
        V, s, c = Sigma.V, np.asarray(Sigma.s, dtype=np.float64), float(Sigma.c)
    else:
        e, V = np.linalg.eigh(np.asarray(Sigma, dtype=np.float64))
        c = float(e[0])
        above = e - c > 1e-12 * abs(float(e[-1]))
        V, s = V[:, above], e[above]
    return terms_of(V, s - c, c, lam, d)


def terms_of(V, excess, c, lam, d):
    """:func:`low_rank_terms` of the rows ``V`` (some tasks' rows of Sigma's V: every number is its task's own),
    ``excess = s - c``: what a rank computes for its chunks of tasks (dmtrl/spread_precond.py)."""
    order = np.argsort(-excess, kind="stable")
    keep = order[:max(0, CAPACITY_MAX // max(d, 1))]
    drop = order[keep.size:]
    sp = np.maximum(excess, 0.0)
    rest = c + (V[:, drop] * V[:, drop]) @ sp[drop] if drop.size else np.full(V.shape[0], c)
    return V[:, keep] * np.sqrt(sp[keep] / lam), rest


def block_inverse(a11, a12, a22):
    """Per-task inverses ``(i11, i12, i22)`` of Dg's ``[[a11, a12], [a12, a22]]``.  A block singular to rounding
    (``det <= 1e-12 a11 a22``) is a task whose two directions are parallel (one-row tasks: db and dq are both
    multiples of the row), so Z's two rows of it are parallel too and A is singular along the same vector n:
    the block's null direction is lifted to its other eigenvalue (the inverse ``I / (a11 + a22)``), so that
    ``M = A + (a11 + a22) n n^T`` on such tasks and ``M^-1 A`` is the projector onto A's range (where keeping the
    diagonal, block_jacobi's rule, left eigenvalues 0 and 2 mixed with the rest; :func:`null_directions` then
    removes n from the solve).  A zero diagonal entry (that direction's row of A is zero) -> 0."""
    det = a11 * a22 - a12 * a12
    good = det > 1e-12 * a11 * a22
    safe = np.where(good, det, 1.0)
    lift = ~good & (a11 > 0) & (a22 > 0)
    trace = np.where(lift, a11 + a22, 1.0)
    i11 = np.where(good, a22 / safe, np.where(lift, 1.0 / trace, reciprocal(a11)))
    i22 = np.where(good, a11 / safe, np.where(lift, 1.0 / trace, reciprocal(a22)))
    return i11, np.where(good, -a12 / safe, 0.0), i22


def reciprocal(a):
    """``1 / a`` where a > 0, else 0 (a direction whose row of A is zero)."""
    return np.where(a > 0, 1.0 / np.where(a > 0, a, 1.0), 0.0)


def null_directions(a11, a12, a22):
    """``(n1, n2)``: per task, the unit null vector of a block :func:`block_inverse` lifts (0 elsewhere).  The
    solve is then ``(I - n n^T) M^-1 (I - n n^T)``, A's pseudo-inverse on those tasks: the rounding part of a
    residual along n (not in A's range, so CG cannot reduce it) weighs ``1 / (a11 + a22)`` in ``r.M^-1 r``, a
    large number on the tiny blocks of tasks whose step barely moved, and kept CG iterating there (about 9
    products a direction instead of 1 on 500 one-row tasks)."""
    det = a11 * a22 - a12 * a12
    lift = ~(det > 1e-12 * a11 * a22) & (a11 > 0) & (a22 > 0)
    norm = np.sqrt(np.where(lift, a11 + a22, 1.0))
    n1 = np.where(lift, np.sqrt(np.where(lift, a22, 0.0)) / norm, 0.0)
    n2 = np.where(lift, -np.where(a12 < 0, -1.0, 1.0) * np.sqrt(np.where(lift, a11, 0.0)) / norm, 0.0)
    return n1, n2


class CapacitancePreconditioner:
    """``free -> (r -> M_FF^-1 r)`` for :func:`.steps.box_qp_operator` (the module's docstring).

    ``U`` (m x k) and ``sigma_rest`` (m) from :func:`low_rank_terms`; ``D``: the directions' dense rows, one
    (m x d: eta only) or two (box momentum: the coordinates are ``[eta; beta]``); ``extra``: the conjugate
    blocks added to Dg, ``(c2,)`` or ``(c2, cross, c2q)`` (m each, divided by n).  One instance serves one QP's
    Newton iterations: it keeps the capacitance of the last free set and updates it by the tasks that changed."""

    def __init__(self, U, sigma_rest, D, lam, extra):
        self.U = U
        self.D = [np.ascontiguousarray(x, dtype=np.float64) for x in D]
        self.m, self.k = U.shape
        self.d = self.D[0].shape[1]
        two = len(self.D) == 2
        rest = sigma_rest / lam
        c2 = extra[0]
        self.a11 = rest * np.einsum("ij,ij->i", self.D[0], self.D[0]) + c2
        self.a12 = rest * np.einsum("ij,ij->i", self.D[0], self.D[1]) + extra[1] if two else np.zeros(self.m)
        self.a22 = rest * np.einsum("ij,ij->i", self.D[1], self.D[1]) + extra[2] if two else np.zeros(self.m)
        self.null = null_directions(self.a11, self.a12, self.a22) if two else None
        self.G = np.zeros((self.k * self.d, self.k * self.d))
        self.code = np.zeros(self.m, dtype=np.int8)      # a task's free coordinates: bit 0 eta, bit 1 beta
        self.inv = (np.zeros(self.m), np.zeros(self.m), np.zeros(self.m))

    def rows(self, which, tasks):
        """Z's rows of direction ``which`` for ``tasks``: ``U_i (x) D_i`` (len(tasks) x k d)."""
        D = self.D[which][tasks]
        return (self.U[tasks][:, :, None] * D[:, None, :]).reshape(tasks.size, self.k * self.d)

    def block_inverses(self, code):
        """The per-task inverse of Dg restricted to the free coordinates ``code`` says."""
        both = block_inverse(self.a11, self.a12, self.a22)
        one1, one2 = reciprocal(self.a11), reciprocal(self.a22)
        i11 = np.where(code == 3, both[0], np.where(code == 1, one1, 0.0))
        i12 = np.where(code == 3, both[1], 0.0)
        i22 = np.where(code == 3, both[2], np.where(code == 2, one2, 0.0))
        return i11, i12, i22

    def update(self, code):
        """The capacitance's ``sum_i [z1 z2]_i Dg_i^-1 [z1 z2]_i^T`` moved from the last free set to ``code``'s:
        each changed task's contribution subtracted and added again, in chunks of CHUNK_ROWS tasks."""
        new = self.block_inverses(code)
        changed = np.flatnonzero(code != self.code)
        if self.k * self.d:
            for start in range(0, changed.size, CHUNK_ROWS):
                t = changed[start:start + CHUNK_ROWS]
                e11, e12, e22 = (n[t] - o[t] for n, o in zip(new, self.inv))
                self.add_changes(self.rows(0, t), self.rows(1, t) if len(self.D) == 2 else None, e11, e12, e22)
        self.code, self.inv = code, new

    def add_changes(self, Z1, Z2, e11, e12, e22):
        """G moved by some changed tasks' rows of Z (``Z2`` None: one direction) and their inverses' changes."""
        if Z2 is not None:
            self.G += Z1.T @ (e11[:, None] * Z1 + e12[:, None] * Z2) + Z2.T @ (e12[:, None] * Z1 + e22[:, None] * Z2)
        else:
            self.G += Z1.T @ (e11[:, None] * Z1)

    def code_of(self, free):
        """Each task's free coordinates from the free mask (N coordinates): bit 0 eta, bit 1 beta."""
        m = self.m
        return free[:m].astype(np.int8) + (2 * free[m:].astype(np.int8) if len(self.D) == 2 else 0)

    def for_free(self, free):
        """The solve ``r -> M_FF^-1 r`` (zero off F) for the free mask ``free`` (N coordinates)."""
        code = self.code_of(free)
        self.update(code)
        factor = capacitance_factor(self.G) if self.k * self.d else None

        def solve(r):
            u = self.dg_inv(r)
            if factor is not None:
                u = u - self.dg_inv(self.z_times(scipy.linalg.cho_solve(factor, self.z_t(u), check_finite=False)))
            return self.unlift(u)
        return solve

    def dg_inv(self, r):
        """``Dg_F^-1 r`` on the free set of the last :meth:`update` (per task, its 2 x 2 block's inverse)."""
        i11, i12, i22 = self.inv
        if len(self.D) == 2:
            m = self.m
            x, y = r[:m], r[m:]
            return np.concatenate([i11 * x + i12 * y, i12 * x + i22 * y])
        return i11 * r

    def unlift(self, u):
        """``(I - n n^T) u`` on the tasks whose block :func:`block_inverse` lifted (both coordinates free): M^-1
        there is I / trace, symmetric (one direction: u as it is)."""
        if len(self.D) != 2:
            return u
        m, both = self.m, self.code == 3
        n1, n2 = np.where(both, self.null[0], 0.0), np.where(both, self.null[1], 0.0)
        along = n1 * u[:m] + n2 * u[m:]
        return np.concatenate([u[:m] - n1 * along, u[m:] - n2 * along])

    def z_t(self, u):
        """``Z^T u`` (k d): ``sum_i U_i (x) (u_i D_i)`` over the directions, O(N k d)."""
        m = self.m
        out = self.U.T @ (u[:m, None] * self.D[0])
        if len(self.D) == 2:
            out += self.U.T @ (u[m:, None] * self.D[1])
        return out.reshape(-1)

    def z_times(self, t):
        """``Z t`` (N): row i of direction j is ``D_j,i . (T^T U_i)`` with ``T = t`` as k x d, O(N k d)."""
        P = self.U @ t.reshape(self.k, self.d)
        parts = [np.einsum("ij,ij->i", P, D) for D in self.D]
        return np.concatenate(parts) if len(parts) == 2 else parts[0]


def capacitance_factor(G):
    """The Cholesky factor of ``C = I + G`` (symmetrized), or None when rounding made C indefinite (the solve is
    then Dg's blocks alone: block Jacobi)."""
    C = G + np.eye(G.shape[0])
    C = 0.5 * (C + C.T)
    try:
        return scipy.linalg.cho_factor(C, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return None
