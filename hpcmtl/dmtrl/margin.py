"""Margin corrections of box-loss W-steps near their end or stalled, both halves.

A correction ``c`` of a block's w puts its free rows on their margins (:func:`margin_correction`, from
:func:`free_rows`, :func:`coordinate_newton`, :func:`min_norm_through_gram`); the server scales each task's
(:func:`correction_scales`) and keeps ``W + C diag(s)`` when its exact primal is smaller.  The worker half
(:class:`MarginBlocks`) and the server half (:class:`MarginServer`); the server's ``correction`` is created
and written here only.
"""
from __future__ import annotations

import numpy as np

from ..engine import check_finite_rows
from ..losses import primal_reference
from .commands import DMTRLCommand
from .outer import primal_dual_of


MARGIN_STALL = 5                 # recorded rounds without the W-step's gap halving before a margin correction
MARGIN_NEAR = 30                 # ... and every round whose relative gap is within this factor of --tol: W(alpha)'s
                                 # primal lags the dual (a box loss's P at W(alpha) falls like the dual's error's
                                 # square root), and near the end a correction often certifies what would take many
                                 # more rounds (the choice of 30: docs/dmtrl-notes.md)
MARGIN_SCALES = (0.25, 0.5, 0.75, 1.0)   # per task, the server takes w_i + s_i c_i, s_i one of these or 0
MARGIN_SWEEPS = 8                # the server's sweeps over the tasks choosing the s_i (fewer when one changes nothing)
MARGIN_MAX_FLOPS = 2 ** 28       # a block's least squares: |F| d min(|F|, d) at most (about 0.1 s) ...
MARGIN_FLOPS_PER_VALUE = 64      # ... and at most this many times its stored values (nnz; n d when dense): a few
                                 # passes' time.  Sparse rows beyond it: through the free rows' Gram matrix (|F|
                                 # nnz(Z_F) + |F|^3 flops, the same caps)
FREE_FLOOR = 1e-12               # free rows: y alpha in (FREE_FLOOR, 1 - FREE_FLOOR) and inside after a coordinate
                                 # Newton step (free_rows)


def free_rows(beta, ahead):
    """The rows a margin correction puts on their margins: ``beta = y o alpha`` strictly inside (0, 1) by
    FREE_FLOOR and still strictly inside after its own coordinate Newton step (``ahead``, from
    :func:`coordinate_newton`).

    A row whose step would take it past a bound is on its way there, and at the optimum sits on
    its bound off its margin; pinning its margin would pull w away from the optimum.  Such rows
    are common before the dual has settled, and not only within a hair of a bound (an example:
    docs/dmtrl-notes.md).  The test needs no threshold: a row free at the optimum with a tiny ``beta`` (raw features
    near 1e5: every free row near 1e-12) stays, and one leaving for a bound from 0.3 goes."""
    inside = (beta > FREE_FLOOR) & (beta < 1.0 - FREE_FLOOR) & (ahead > 0.0) & (ahead < 1.0)
    return np.flatnonzero(inside)


def coordinate_newton(blk, beta, margins, loss, gamma, curvature):
    """Every row's ``beta`` after its own coordinate Newton step on the W-step's dual, the others held:
    ``beta + (t_j - z_j . w) / (g + curvature |x_j|^2 / n)`` with ``Z = diag(y) X``, ``margins = Z w``,
    ``t_j = 1`` and ``g = 0`` for the hinge, ``t_j = 1 - gamma beta_j`` and ``g = gamma`` for the smoothed
    hinge, ``curvature = sigma_ii / lam`` (the dual's own, without any rho); a row without values gets
    ``+-inf`` (its margin cannot move).  Clipped to [0, 1] it is the local SDCA kernel's coordinate maximizer
    (``_sdca.coordinate_step`` with ``q = curvature |x_j|^2 / n``), here for every row of a block at once."""
    smoothed = loss == "smoothed-hinge"
    residual = (1.0 - gamma * beta if smoothed else 1.0) - margins
    h = curvature * blk.sq_norms / blk.n_task + (gamma if smoothed else 0.0)
    positive = h > 0.0
    with np.errstate(all="ignore"):
        step = np.where(positive, residual / np.where(positive, h, 1.0), np.copysign(np.inf, residual))
    return beta + step


def margin_correction(blk, a, w, loss, gamma, curvature, scores=None):
    """The least-squares change ``c`` of a box-loss block's ``w`` that puts its free rows on their margins.

    At the optimum every row with ``beta_j = y_j alpha_j`` strictly inside (0, 1) sits on
    its margin: ``z_j . w = 1`` (hinge), ``1 - gamma beta_j`` (smoothed hinge), ``Z = diag(y) X``.
    The engine's ``w = sigma_ii b / lam`` (W = B Sigma / lam) is a sum over rows that
    cancels where the features are large next to their spread (raw values far from 0 beside
    the intercept feature 1): a dual within 1e-10 of its optimum can then give a w whose
    margins are off by 1e-4 and a primal stuck a relative 1e-6 above it; and for any box loss
    the margins at W(alpha) converge only like the square root of the dual's error.  The free rows F
    are those inside (0, 1) that stay inside after their own coordinate Newton step on the dual
    (:func:`free_rows`; ``curvature = sigma_ii / lam``, ``scores = X w`` when the caller has them).
    ``c`` solves ``Z_F c = target_F - Z_F w`` by least squares (``numpy.linalg.lstsq``: the smallest c when
    the rows leave freedom), from the rows themselves, so the cancellation does not return;
    sparse rows too wide for that: the smallest c through ``Z_F Z_F^T`` (:func:`min_norm_through_gram`).
    Zero where there is no free row, the least squares would cost more than
    MARGIN_MAX_FLOPS or MARGIN_FLOPS_PER_VALUE times the block's stored values, or does not
    give a finite answer; zero on the columns the free rows do not touch.  Any w is a valid
    primal point: the server keeps ``w + s c`` only where its exact primal is smaller.
    """
    beta = blk.y * a
    scores = blk.decision(w) if scores is None else scores
    free = free_rows(beta, coordinate_newton(blk, beta, blk.y * scores, loss, gamma, curvature))
    d = blk.n_features
    if free.size == 0:
        return np.zeros(d)
    budget = min(MARGIN_MAX_FLOPS, MARGIN_FLOPS_PER_VALUE * blk.rows.n_values)
    target = 1.0 - gamma * beta[free] if loss == "smoothed-hinge" else np.ones(free.size)
    try:
        with np.errstate(all="ignore"):
            dense_flops = free.size * d * min(free.size, d)
            if blk.sparse and blk.mu is None:       # Z_F = diag(y_F) X_F: the signs folded into the vectors
                X, y = blk.X[free].astype(np.float64, copy=False), blk.y[free]
                gram_flops = free.size * X.nnz + free.size ** 3
                if min(gram_flops, dense_flops) > budget:
                    return np.zeros(d)
                if gram_flops <= dense_flops:
                    c = min_norm_through_gram(X, y * target - X @ w)
                else:
                    Z = X.toarray() * y[:, None]
                    c = np.linalg.lstsq(Z, target - Z @ w, rcond=None)[0]
                    c[~np.any(Z != 0.0, axis=0)] = 0.0
            elif dense_flops <= budget:
                Z = blk.signed_rows(free)
                c = np.linalg.lstsq(Z, target - Z @ w, rcond=None)[0]
                c[~np.any(Z != 0.0, axis=0)] = 0.0
            else:
                return np.zeros(d)
    except np.linalg.LinAlgError:         # the SVD did not converge: no correction (it is only ever a candidate)
        return np.zeros(d)
    if not np.all(np.isfinite(c)):
        return np.zeros(d)
    return c


def min_norm_through_gram(X, r):
    """The smallest ``c`` with ``X c = r`` in the least-squares sense, ``c = X^T G^+ r`` with ``G = X X^T`` (few,
    wide sparse rows; ``Z_F c = t`` is ``X_F c = y_F t``): ``G``'s eigenvalues below ``|F| eps`` times the
    largest are dropped, and one refinement from the rows themselves (``r - X c``) takes back most of what
    forming ``G`` rounded away.  Exactly zero on the columns no row touches."""
    G = (X @ X.T).toarray()
    values, vectors = np.linalg.eigh(0.5 * (G + G.T))
    if values.size == 0 or not values[-1] > 0.0:
        return np.zeros(X.shape[1])
    keep = values > values[-1] * G.shape[0] * np.finfo(np.float64).eps
    V, inverse = vectors[:, keep], 1.0 / values[keep]
    c = X.T @ (V @ (inverse * (V.T @ r)))
    return c + X.T @ (V @ (inverse * (V.T @ (r - X @ c))))


class OmegaGram:
    """``Q = lam Omega o (C C^T)`` through Sigma's factors (many tasks: no m x m inverse, no m x m array):
    ``Q s`` is ``lam rowdots(C, Omega (diag(s) C))`` (O(m d r)), a column ``lam Omega[:, i] o (C c_i)`` (O(m (d + r)))
    and the diagonal ``lam Omega_ii ||c_i||^2``."""

    def __init__(self, factors, CT, lam):
        self.factors, self.CT, self.lam = factors, CT, lam

    def times(self, s):
        return self.lam * np.einsum("ij,ij->i", self.CT, self.factors.inverse_matmul(s[:, None] * self.CT))

    def column(self, i):
        return self.lam * self.factors.inverse_column(i) * (self.CT @ self.CT[i])

    def diagonal(self):
        return self.lam * self.factors.inverse_diag() * np.einsum("ij,ij->i", self.CT, self.CT)


def correction_scales(loss_at, cb, Q, n, movable):
    """Per task the scale ``s_i`` in ``(0,) + MARGIN_SCALES`` of its correction that makes the primal at
    ``W + C diag(s)`` smallest: sweeps over the tasks (each task to its best scale with the others held; at
    most MARGIN_SWEEPS, fewer when a sweep changes nothing) from every common scale (all tasks 0, all 1/4, ...),
    the best of them (none: every s_i 0).  The primal less the current one is
    ``sum_i (loss_at[i, s_i] - loss_at[i, 0]) / n_i + s . cb + s^T Q s / 2`` (``loss_at``: m x (1 + scales) loss sums, ``cb``: every ``c_i . b_i``, ``Q = lam Omega o (C
    C^T)``); tasks not ``movable`` keep 0.  A task whose correction costs more in the regularizer than it gains
    in its loss keeps its w; tasks a learned Sigma ties together may only gain together (Omega's negative
    entries between them), which the common starts find and single-task moves from zero would not.
    ``Q`` an :class:`OmegaGram` (many tasks): the same sweeps with ``Q s`` kept up to date a column at a time
    (O(m (d + r)) a change) instead of a row of an m x m matrix a task."""
    grid = np.concatenate([[0.0], MARGIN_SCALES])
    dense = not isinstance(Q, OmegaGram)
    cb = np.asarray(cb, dtype=np.float64)
    if dense:
        Q = np.asarray(Q, dtype=np.float64)
    else:
        q_diag = Q.diagonal()
    scaled = loss_at / np.asarray(n, dtype=np.float64)[:, None]
    tasks = np.flatnonzero(movable)
    rows = np.arange(len(cb))

    def value(pick):
        s = grid[pick]
        return float(np.sum(scaled[rows, pick]) + s @ cb + 0.5 * (s @ (Q @ s if dense else Q.times(s))))

    none = np.zeros(len(cb), dtype=np.int64)
    best_pick, best = none, value(none)
    for start in range(grid.size if tasks.size else 0):
        pick = np.where(movable, start, 0)
        s = grid[pick]
        Qs = None if dense else Q.times(s)
        for _ in range(MARGIN_SWEEPS):
            changed = False
            for i in tasks:           # task i to every scale at once: the change of the value
                step = grid - s[i]
                qi, qii = (Q[i] @ s, Q[i, i]) if dense else (Qs[i], q_diag[i])
                delta = scaled[i] - scaled[i, pick[i]] + step * (cb[i] + qi) + 0.5 * step * step * qii
                g = int(np.argmin(delta))
                if delta[g] < 0.0:
                    if not dense:
                        Qs += step[g] * Q.column(i)
                    pick[i], s[i], changed = g, grid[g], True
            if not changed:
                break
        v = value(pick)
        if v < best:
            best_pick, best = pick, v
    return grid[best_pick]


class MarginBlocks:
    """The worker half of margin corrections (a :class:`hpcmtl.dmtrl.worker.LocalBlocks` mixin)."""

    def margin_correction_rows(self, ctrl, inputs):
        """MARGIN_CORRECTION: per block ``[c (d), loss sums at w + s c for s in MARGIN_SCALES, c . b (local rounds: its own
        b)]`` (:func:`margin_correction` under the block's ``sigma_ii / lam``; the loss sums from the scores at w,
        which also choose the free rows, and at c: two passes; zeros where c is zero; nothing changes here)."""
        d, scales = ctrl.d, np.asarray(MARGIN_SCALES)
        out = np.zeros((len(self.blocks), d + scales.size + 1))
        for k, blk in enumerate(self.blocks):
            a, w = self.state[k].alpha, self.w[k]
            z = blk.decision(w)
            c = margin_correction(blk, a, w, self.loss.name, self.config.gamma, self.sigma_ii[k] / self.config.lam,
                                  scores=z)
            if not np.any(c):
                continue
            zc = blk.decision(c)
            out[k, d:d + scales.size] = [float(np.sum(primal_reference(self.loss.name, z + s * zc, blk.y,
                                                                       self.config.gamma))) for s in scales]
            if ctrl.local:
                out[k, -1] = float(c @ self.task_steps[k].BT[0])
            f = self.columns[k]
            out[k, :d] = c if f is None else self.on_all_features(f, c)
        return out


class MarginServer:
    """The server half of margin corrections (a :class:`hpcmtl.dmtrl.server.Server` mixin)."""

    def init_margin_corrections(self):
        self.correction = None        # CT of a margin correction that certified the W-step (W + C is its model)

    def corrected_primal(self, terms, primal, dual, regularizer, local):
        """``(primal, C^T or None)``: the smaller of this round's primal and a margin correction's, when one is
        due (``terms``: this round's, per block or, ``local``, per task)."""
        correction = None
        if primal - dual > self.config.tol * abs(primal) and self.margin_correction_due(primal, dual):
            loss_sums = terms[:, 0] if local else self.per_task(terms)[:, 0]
            corrected, CT = self.primal_with_correction(regularizer, local, loss_sums)
            if corrected < primal:               # any W is a primal point: the smaller P certifies
                primal, correction = corrected, CT
        return primal, correction

    def keep_correction(self, CT):
        """The W-step is certified at ``W + C`` (``CT``; None: at W)."""
        self.correction = CT

    def apply_correction(self):
        """At the end of a W-step certified at W + C: that is the model, on the workers too (B stays alpha's)."""
        if self.correction is not None:
            self.WT = self.WT + self.correction
            self.correction = None
            self.scatter_down(DMTRLCommand.SET_W, lambda: self.WT, None, with_objective=False)

    def margin_correction_possible(self) -> bool:
        """Hinge or smoothed hinge, an aggregation other than the paper's 'safe' rule, every task one block,
        dense task arrays."""
        return (not self.safe and self.config.loss in ("hinge", "smoothed-hinge") and self.one_block_a_task
                and not self.space.sparse)

    def margin_correction_due(self, primal, dual) -> bool:
        """The W-step's last round, its relative gap within MARGIN_NEAR times --tol, or its gap (this round's
        with the recorded ones) has not halved for a multiple of MARGIN_STALL recorded rounds; read from the
        history, so a resumed run decides alike."""
        if not self.margin_correction_possible():
            return False
        rel_gap = (primal - dual) / max(abs(primal), 1e-300)
        if self.wstep_round >= self.round_budget(rel_gap):      # (this round's row, as the loop will read it)
            return True
        if rel_gap <= MARGIN_NEAR * self.config.tol:
            return True
        since = self.since_halved(rel_gap)
        return since > 0 and since % MARGIN_STALL == 0

    def primal_with_correction(self, regularizer, local, loss_sums):
        """The exact primal at ``W + C diag(s)`` (C from MARGIN_CORRECTION, the scales s from :func:`correction_scales`) and
        ``diag(s) C^T`` (m x d); ``loss_sums``: every task's loss sum at W (this round's).

        ``(lam / 2) tr((W + C_s) Omega (W + C_s)^T)`` with ``W Omega = B / lam``: the
        current ``regularizer / 2`` plus ``sum_i s_i c_i . b_i`` plus ``(lam / 2) sum_ij s_i s_j
        Omega_ij c_i . c_j``; ``c_i . b_i`` from the workers in local rounds (B lives there)."""
        d, lam, scales = self.d, self.config.lam, len(MARGIN_SCALES)
        rows = self.per_task(self.command(DMTRLCommand.MARGIN_CORRECTION, width=d + scales + 1, d=d, local=int(local)))
        check_finite_rows(rows, self.round, self.names, "margin correction", self.outer)
        CT = rows[:, :d]
        cb = rows[:, -1] if local else np.einsum("ij,ij->i", CT, self.space.dense(self.BT))
        factors = self.sigma_factors
        Q = lam * np.linalg.inv(self.Sigma) * (CT @ CT.T) if factors is None else OmegaGram(factors, CT, lam)
        loss_at = np.column_stack([loss_sums, rows[:, d:d + scales]])
        s = correction_scales(loss_at, cb, Q, self.n, np.any(CT != 0.0, axis=1))
        chosen = loss_at[np.arange(self.m), np.searchsorted(np.concatenate([[0.0], MARGIN_SCALES]), s)]
        moved = regularizer + 2.0 * float(s @ cb) + float(s @ (Q @ s if factors is None else Q.times(s)))
        primal, _ = primal_dual_of(chosen, np.zeros(self.m), self.n, moved)
        return primal, s[:, None] * CT
