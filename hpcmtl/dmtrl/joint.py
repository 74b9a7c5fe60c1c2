"""The learned-Sigma problem's own certificate and the outer step that reaches its optimum.

Minimizing the objective over Sigma (``tr Sigma = 1``) leaves a convex problem in W alone
(Zhang & Yeung 2010)::

    P(W) = sum_i (1/n_i) sum_j l(w_i . x_ij, y_ij) + (lam/2) ||W||_*^2

(``||.||_*`` the trace norm).  Its dual, with ``B(alpha)`` as in the W-steps and ``||.||_2`` the spectral
norm, ``D(alpha) = -sum_i (1/n_i) sum_j l*(-alpha_ij) - ||B||_2^2 / (2 lam) <= P*`` for every feasible alpha,
so ``P(W) - max_s D(s alpha)`` bounds how far a W is from the optimum (the *joint gap*; ``s``: the scale
along alpha that tightens the bound, within the dual box).  Derivation: docs/math.md.

Alternating W-steps with the Omega-step ``Sigma = (W^T W)^(1/2) / tr`` never increases P but can stall: with
an eigenvalue floor, Sigma is nearly singular off the row space of W, so the next W-step keeps that row
space, and a W of rank d < m cannot rotate it towards the optimum's.  After each W-step the outer step
here takes a proximal-gradient step on P from the W-step's W with ``-B``, the loss's (sub)gradient there::

    W(t) = prox_{t lam ||.||_*^2 / 2}(W + t B)

and keeps the best of a few ``t`` (``t = 0``, W itself, included, so P never increases); the next Sigma
is the Omega-step of that W(t).  The prox rotates the row space freely (a shrinkage of the singular
values of ``W + t B``), the W-step then does what alternating does well.  One collective a W-step
evaluates every candidate and the dual's scales: :data:`JOINT_TERMS`.

Worker half: :class:`JointBlocks`; server half: :class:`JointServer`; the math, shared with the
centralized baselines: :func:`prox_trace_norm_squared`, :func:`candidate_steps`, :func:`block_joint_terms`,
:func:`choose`.
"""
from __future__ import annotations

import numpy as np

from .. import _joint_terms, _sdca
from ..engine import Command, Down, Up, check_finite_rows
from ..losses import get_loss
from .dual_phase import DualCommand, dual_phase
from .spectral_phase import MAX_TASKS, SpectralCommand, spectral_phase

# the prox step t: STEP_SPREAD candidates on each side of the last chosen t (or of the first guess), a factor
# STEP_FACTOR apart; t = 0 (W itself) is always a candidate
STEP_FACTOR = 2.0
STEP_SPREAD = 4
# the dual's scales s (D(s alpha)): near 1 (at the optimum s = 1) and a few coarse ones for early W-steps
_NEAR_ONE = np.array([1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3])
DUAL_SCALES = np.unique(np.concatenate([[0.5, 1.0], 1.0 - _NEAR_ONE, 1.0 + _NEAR_ONE]))
# the Omega-step's eigenvalue floor while the joint gap is open: FLOOR_PER_GAP times the joint relative gap,
# at most FLOOR_START, never rising, never below --eig-floor (a larger start slows W-steps under the safe rule)
FLOOR_START = 1e-3
FLOOR_PER_GAP = 0.1
# the accelerated phase (smooth losses): APG_FIRST iterations after the first W-step that does not certify the
# optimum, twice as many after each later one, at most APG_MOST; it ends early once its own joint gap is below
# APG_TARGET times --outer-tol (the W-step after it then certifies with room to spare)
APG_FIRST = 200
APG_MOST = 6400
APG_TARGET = 0.5
# the hinge's dual phase: the next Omega-step's W is the candidate whose bound on the next W-step's P (P plus the
# floor's majorizer excess) is lowest, unless no bound lowers P by DUAL_MOVE_SHARE of the joint gap and the last
# W-step did not either: then the W the dual recovers with the lowest P (hpcmtl.dmtrl.dual_phase)
DUAL_MOVE_SHARE = 0.03
# the hinge's dual phase while the W-steps' own bounds close the joint gap by themselves: when the gap of the W-step's
# own alpha shrank from the W-step before's by a ratio q such that, shrinking on at q, it would reach --outer-tol
# within CLOSING_WSTEPS more W-steps, the phase gets at most PHASE_STEPS_PER_ROUND steps for each round those
# W-steps would take (at this W-step's rounds each) and makes no recovered-W move (:func:`closing_budget`)
CLOSING_WSTEPS = 4
PHASE_STEPS_PER_ROUND = 3
# the hinge's first dual phase (after the first W-step, the tasks' own) ends once its bound puts that W-step's P within
# FIRST_REACH times --outer-tol of the optimum (relative), at most FIRST_REACH_MOST and at least --outer-tol: what
# it is for is the W it recovers (:func:`first_phase_target`)
FIRST_REACH = 100
FIRST_REACH_MOST = 0.02
# after this many accepted steps in a row the accelerated phase tries a STEP_FACTOR longer one (backtracking
# halves it again when the quadratic model fails)
STEP_TRIAL_AFTER = 10
# the outer step's extrapolations: candidates ``W + t (W - W_prev)`` (W_prev: the W-step before's W) scored with
# the prox steps.  The alternation is a fixed-point iteration that converges linearly where it does not stall
# (Reuters, 2,000 rows, lam 1e-4: P's decrease shrinks by about 0.8 a W-step), its slow part along the last
# move; a step t along it is an over-relaxation (SQUAREM's idea for EM and MM iterations), kept only where its
# P is lower, so P never increases
EXTRAPOLATIONS = (1.0, 2.0, 4.0, 8.0, 16.0)
# the hinge's phase ends once the W it recovers puts the next W-step's P within this share of --outer-tol of the
# bound (SettleCheck; the rest is the W-step's own tolerance and room to spare, as APG_TARGET)
SETTLE_SHARE = 0.5


class JointCommand(Command):
    """The joint certificate's message (ids: DMTRL's protocol, :mod:`.commands`)."""
    # per block [K candidate w's (K d)] -> per block [loss sum at each candidate (K), conjugate sum at each
    # DUAL_SCALES s (S), max_j y_j alpha_j]
    JOINT_TERMS = 40, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("width", "count"), "joint_terms"
    # per block [w at the prox point, w at the extrapolated point (2 d)] -> per block [X^T l'(scores at the
    # extrapolated point) (d), loss sum at the prox point, loss sum at the extrapolated point, conjugate sum of
    # alpha = -l'(those scores) at each DUAL_SCALES s (S), max_j y_j alpha_j] (count: that row's width)
    GRADIENT_TERMS = 41, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("width", "count"), "gradient_terms"


def prox_trace_norm_squared(Z: np.ndarray, t: float):
    """``argmin_W ||W - Z||_F^2 / 2 + (t/2) ||W||_*^2`` and its trace norm.

    With Z's singular values z (descending): ``w_k = max(z_k - t S, 0)`` where ``S = sum_{k<=K} z_k /
    (1 + K t)`` and K is the largest count with ``z_K > t S_K`` (the optimality of the shrunk values, which
    sum to S).  Thin SVD of Z: O(m d min(m, d)) (not the smaller Gram matrix's eigenvectors: their rounding,
    eps z_1^2 / z_k, moves the accelerated phase's iterates enough to change where it stops).
    """
    U, z, Vt = np.linalg.svd(Z, full_matrices=False)
    k, w = shrunk_values(z, t)
    if k == 0:
        return np.zeros_like(Z), 0.0
    return (U[:, :k] * w) @ Vt[:k], float(w.sum())


def shrunk_values(z, t):
    """``(K, w)``: the prox's shrunk singular values ``w_k = z_k - t S`` of Z's singular values z (descending),
    K of them (0 when z is empty or zero)."""
    if z.size == 0 or not z[0] > 0:
        return 0, z[:0]
    K = np.arange(1, z.size + 1)
    S = np.cumsum(z) / (1.0 + K * t)
    keep = np.nonzero(z - t * S > 0)[0]
    k = int(keep[-1]) + 1
    return k, np.maximum(z[:k] - t * S[k - 1], 0.0)


def candidate_steps(center: float):
    """The prox steps t to try: 0, then ``center * STEP_FACTOR^k`` for ``|k| <= STEP_SPREAD``."""
    return np.concatenate([[0.0], center * STEP_FACTOR ** np.arange(-STEP_SPREAD, STEP_SPREAD + 1)])


def extrapolated(WT, prev):
    """``(ts, [W(t)^T], [||W(t)||_*])``: the outer step's extrapolations ``W + t (W - W_prev)`` for t in
    EXTRAPOLATIONS (none without the W-step before's W, or when it equals W)."""
    if prev is None or prev.shape != WT.shape or not np.any(prev != WT):
        return [], [], []
    move = WT - prev
    wts = [WT + t * move for t in EXTRAPOLATIONS]
    return list(EXTRAPOLATIONS), wts, [float(np.linalg.svd(wt, compute_uv=False).sum()) for wt in wts]


def first_step(WT, BT):
    """The first W-step's center of the prox steps: ``||W||_F / ||B||_F`` (W = B Sigma / lam: the scale of
    Sigma / lam, what moves W by its own size); 1 when either is zero."""
    nb, nw = float(np.linalg.norm(BT)), float(np.linalg.norm(WT))
    return nw / nb if nb > 0 and nw > 0 else 1.0


def candidates(WT, BT, lam, center):
    """``(steps, [W(t)^T], [||W(t)||_*])``: W itself first (t = 0), then every prox step (server)."""
    steps = candidate_steps(center)
    wts, norms = [WT], [float(np.linalg.svd(WT, compute_uv=False).sum())]
    for t in steps[1:]:
        W, nuc = prox_trace_norm_squared((WT + t * BT).T, t * lam)
        wts.append(W.T)
        norms.append(nuc)
    return steps, wts, np.array(norms)


def conjugate_at_scales(loss, alpha, y, gamma, scales=DUAL_SCALES):
    """``sum_j l*(-s alpha_j)`` for every scale s (alpha feasible; the box losses' scales that leave the box
    are the server's to drop: :func:`choose` reads ``max_j y_j alpha_j``)."""
    a = np.asarray(alpha, dtype=np.float64)
    if loss == "logistic":
        b = np.clip(np.multiply.outer(scales, y * a), 0.0, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ent = np.where(b > 0, b * np.log(b), 0.0) + np.where(b < 1, (1 - b) * np.log1p(-b), 0.0)
        return ent.sum(axis=1)
    if loss == "squared":
        linear, quadratic = -float(a @ y), 0.5 * float(a @ a)
    elif loss == "smoothed-hinge":
        linear, quadratic = -float(a @ y), 0.5 * gamma * float(a @ a)
    else:                                     # hinge
        linear, quadratic = -float(a @ y), 0.0
    return scales * linear + scales ** 2 * quadratic


def block_joint_terms(blk, alpha, ws, loss, gamma):
    """One block's JOINT_TERMS row: the loss sum at each candidate w (on the block's own columns), the
    conjugate sums at DUAL_SCALES, ``max_j y_j alpha_j`` (0 without rows)."""
    row = np.zeros(len(ws) + DUAL_SCALES.size + 1)
    for c, w in enumerate(ws):
        w = np.ascontiguousarray(w, dtype=np.float64)
        row[c] = _sdca.objective_terms(blk.rows, blk.y, alpha, w, loss.kernel_id, gamma, blk.z_shift(w))[0]
    row[len(ws):-1] = conjugate_at_scales(loss.name, alpha, blk.y, gamma)
    row[-1] = float(np.max(blk.y * alpha)) if alpha.size else 0.0
    return row


def choose(loss_name, steps, norms, loss_sums, conj_sums, box_max, n, BT, lam):
    """The joint certificate at W (candidate 0) and the best prox step (server).

    ``loss_sums`` (m x K) and ``conj_sums`` (m x S) are per-task sums, ``box_max`` the largest ``y alpha``
    over all rows.  Returns a dict: ``joint_primal`` P(W), ``joint_dual`` max_s D(s alpha), ``joint_gap``,
    ``joint_rel_gap``, ``dual_scale`` s, ``prox_step`` the chosen t (0: none better than W) and
    ``prox_primal`` P at it; ``best`` is the chosen candidate's index.
    """
    losses = np.sum(loss_sums / n[:, None], axis=0)
    primals = losses + 0.5 * lam * norms ** 2
    dual, scale = joint_dual_at(loss_name, conj_sums, box_max, n, BT, lam)
    best = int(np.argmin(np.where(np.isfinite(primals), primals, np.inf)))
    primal = float(primals[0])
    gap = primal - dual
    return {"joint_primal": primal, "joint_dual": dual, "joint_gap": gap,
            "joint_rel_gap": gap / max(abs(primal), 1e-300), "dual_scale": scale,
            "prox_step": float(steps[best]), "prox_primal": float(primals[best]), "best": best}


def block_gradient_terms(blk, w_prox, w_ext, loss, gamma):
    """One block's GRADIENT_TERMS: ``(X^T l'(z), [loss sum at w_prox, loss sum at w_ext, conjugate sums of
    alpha = -l'(z) at DUAL_SCALES, max_j y_j alpha_j])`` with z the block's scores at ``w_ext`` (on the
    block's own columns; implicitly centered rows score ``(x - mu) . w``: :meth:`TaskBlock.decision`)."""
    w_prox = np.ascontiguousarray(w_prox, dtype=np.float64)
    w_ext = np.ascontiguousarray(w_ext, dtype=np.float64)
    grad = np.zeros(blk.n_features)
    scalars = np.empty(DUAL_SCALES.size + 4)
    _joint_terms.gradient_terms(blk.rows, blk.y, w_prox, w_ext, loss.kernel_id, gamma, blk.z_shift(w_prox),
                                blk.z_shift(w_ext), DUAL_SCALES, grad, scalars)
    if blk.mu is not None:                # X^T l' - mu sum(l'): the centered rows' gradient
        grad -= blk.mu * scalars[-1]
    return grad, scalars[:-1]


def spectral_norm_squared(A: np.ndarray) -> float:
    """``||A||_2^2``: the largest eigenvalue of the smaller Gram matrix (min(m, d) square), which LAPACK's
    symmetric solver finds to the rounding of ``||A||_2^2`` itself; a full SVD costs twice as much, and the
    accelerated phase asks for this once an iteration."""
    if A.size == 0:
        return 0.0
    gram = A.T @ A if A.shape[0] >= A.shape[1] else A @ A.T
    return max(float(np.linalg.eigvalsh(gram)[-1]), 0.0)


def joint_dual_at(loss_name, conj_sums, box_max, n, VT, lam):
    """``(max_s D(s alpha), s)`` from the per-task conjugate sums at DUAL_SCALES and ``V(alpha)^T`` (the W-step's
    B, or minus the loss's gradient G for ``alpha = -l'(z)``)."""
    spectral2 = spectral_norm_squared(VT)
    duals = -np.sum(conj_sums / n[:, None], axis=0) - DUAL_SCALES ** 2 * spectral2 / (2.0 * lam)
    if loss_name != "squared":                # hinge, smoothed hinge, logistic: y s alpha stays in [0, 1]
        duals = np.where(DUAL_SCALES * box_max <= 1.0 + 1e-12, duals, -np.inf)
    j = int(np.argmax(duals))
    return float(duals[j]), float(DUAL_SCALES[j])


def accelerated_phase(loss_name, lam, n, WT0, evaluate, budget, target, step=None, stop=None):
    """Accelerated proximal gradient on P(W) from W0 (FISTA with backtracking and the gradient restart of
    O'Donoghue & Candes 2015): the outer step of the smooth losses.

    The W-steps solve each Sigma's problem to the certificate, but the alternation only crawls towards P*
    once W's task subspace is nearly right; proximal gradient on P itself has no such stall.  Each iteration
    is one collective: ``evaluate(W_prox^T, W_ext^T)`` returns per-task sums ``(X^T l' at W_ext (m x d), loss
    at W_prox (m), loss at W_ext (m), conjugates at DUAL_SCALES (m x S), max y alpha)``; the scores at the
    extrapolated point give the next gradient and a dual bound (alpha = -l').  Ends after ``budget``
    iterations, when ``(P(W_best) - best dual) / P <= target`` or when ``stop()`` says so (a signal); every
    trial, rejected or not, counts against ``budget``.  Returns a dict: ``wt`` (the best W^T by P), ``primal``,
    ``dual``, ``dual_scale``, ``iterations`` and ``step`` (the last step size, the next phase's first guess).
    """
    inv_n = 1.0 / n

    def sums(out):
        grad, loss_prox, loss_ext, conj, box = out
        return grad * inv_n[:, None], float(loss_prox @ inv_n), float(loss_ext @ inv_n), conj, box

    G, _, f_ext, conj, box = sums(evaluate(WT0, WT0))
    best = {"wt": WT0, "primal": f_ext + 0.5 * lam * float(np.linalg.svd(WT0, compute_uv=False).sum()) ** 2,
            "dual": -np.inf, "dual_scale": 1.0, "iterations": 0}
    best["dual"], best["dual_scale"] = joint_dual_at(loss_name, conj, box, n, G, lam)
    if step is None:                          # ||W|| / ||G||: a step that moves W by its own size
        step = first_step(WT0, G)
    prev, ext, momentum, k, accepted = WT0, WT0, 1.0, 0, 0
    while k < budget and step > 0:
        if stop is not None and stop():
            break
        k += 1
        prox, nuc = prox_trace_norm_squared((ext - step * G).T, step * lam)
        prox = prox.T
        restart = float(np.sum((ext - prox) * (prox - prev))) > 0.0
        following = 1.0 if restart else 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * momentum * momentum))
        ext_next = prox if restart else prox + ((momentum - 1.0) / following) * (prox - prev)
        G_next, f_prox, f_next, conj, box = sums(evaluate(prox, ext_next))
        move = prox - ext
        bound = f_ext + float(np.sum(G * move)) + float(np.sum(move * move)) / (2.0 * step)
        if not np.isfinite(f_prox) or f_prox > bound + 1e-12 * abs(f_ext):
            step *= 0.5                       # backtracking: the quadratic model did not hold
            accepted = 0
            continue
        primal = f_prox + 0.5 * lam * nuc * nuc
        if primal < best["primal"]:
            best.update(wt=prox, primal=primal)
        dual, scale = joint_dual_at(loss_name, conj, box, n, G_next, lam)
        if dual > best["dual"]:
            best.update(dual=dual, dual_scale=scale)
        prev, ext, G, f_ext, momentum = prox, ext_next, G_next, f_next, following
        accepted += 1
        if accepted == STEP_TRIAL_AFTER:      # the curvature may have dropped: try a longer step
            step, accepted = step * STEP_FACTOR, 0
        if best["primal"] - best["dual"] <= target * abs(best["primal"]):
            break
    best.update(iterations=k, step=step)
    return best


# from this many blocks on all d columns, GRADIENT_TERMS computes them in one kernel call: the same bits as one
# call a block (a block's arithmetic is the same code), without a block's Python (10^4 one-task blocks: most of
# an iteration of the accelerated phase).  A huge number: one call a block (tests compare the two)
GRADIENT_BATCH_MIN_BLOCKS = 1


class JointBlocks:
    """Worker half: JOINT_TERMS and GRADIENT_TERMS on this rank's blocks."""

    def gradient_terms(self, ctrl, rows):
        """GRADIENT_TERMS: per block ``[w_prox, w_ext]`` -> per block :func:`block_gradient_terms` (the gradient
        on all d features, zeros off a block's own columns).  Rows read and written in place (the dense
        commands' layout: :meth:`from_rows` / :meth:`dense_rows`): an iteration of the phase is a pass over the
        rows, and these small blocks' Python is most of it."""
        d = self.d
        out = np.zeros((len(self.blocks), ctrl.count))
        whole = [k for k, f in enumerate(self.columns) if f is None]
        if len(whole) >= GRADIENT_BATCH_MIN_BLOCKS:
            self.gradient_terms_whole(whole, rows, out)
            rest = [k for k, f in enumerate(self.columns) if f is not None]
        else:
            rest = range(len(self.blocks))
        for k in rest:
            blk, f = self.blocks[k], self.columns[k]
            w_prox, w_ext = rows[k, :d], rows[k, d:2 * d]
            if f is not None:
                w_prox, w_ext = w_prox[f], w_ext[f]
            grad, scalars = block_gradient_terms(blk, w_prox, w_ext, self.loss, self.config.gamma)
            if f is None:
                out[k, :d] = grad
            else:
                out[k, f] = grad
            out[k, d:] = scalars
        return out

    def gradient_terms_whole(self, whole, rows, out):
        """:meth:`gradient_terms` of the blocks ``whole`` (those on all d columns) in one kernel call
        (``_joint_terms.gradient_terms_blocks``): each block's numbers are :func:`block_gradient_terms`' bits, its
        implicit centering (``mu``) applied the same way, so the choice of path never changes a result."""
        d, blocks = self.d, self.blocks
        batch = self.gradient_batch(whole)
        idx, centered = batch["idx"], batch["centered"]
        w_prox = np.ascontiguousarray(rows[idx, :d], dtype=np.float64)
        w_ext = np.ascontiguousarray(rows[idx, d:2 * d], dtype=np.float64)
        shift_prox, shift_ext = np.zeros(idx.size), np.zeros(idx.size)
        for j in centered:
            blk = blocks[whole[j]]
            shift_prox[j], shift_ext[j] = blk.z_shift(w_prox[j]), blk.z_shift(w_ext[j])
        grad = np.zeros((idx.size, d))
        scalars = np.empty((idx.size, DUAL_SCALES.size + 4))
        _joint_terms.gradient_terms_blocks(batch["rows"], batch["y"], batch["y_start"], w_prox, w_ext,
                                           self.loss.kernel_id, self.config.gamma, shift_prox, shift_ext, DUAL_SCALES,
                                           grad, scalars)
        for j in centered:                    # X^T l' - mu sum(l'): the centered rows' gradient
            grad[j] -= blocks[whole[j]].mu * scalars[j, -1]
        out[idx, :d] = grad
        out[idx, d:] = scalars[:, :-1]

    def gradient_batch(self, whole):
        """What :meth:`gradient_terms_whole` hands the kernel besides the w's, built once a set of blocks (an
        accelerated phase calls it hundreds of times on the same blocks): their rows, their labels end to end
        with each block's start, the positions of the implicitly centered ones.  Keyed on the blocks' ids; the
        cache holds the blocks themselves, so an id cannot be reused by a block that replaced one."""
        key = [id(self.blocks[k]) for k in whole]
        cached = getattr(self, "_gradient_batch", None)
        if cached is None or cached["key"] != key:
            blocks = [self.blocks[k] for k in whole]
            sizes = np.array([blk.y.size for blk in blocks], dtype=np.int64)
            cached = self._gradient_batch = {
                "key": key, "blocks": blocks, "idx": np.asarray(whole, dtype=np.intp),
                "rows": [blk.rows for blk in blocks],
                "y": np.ascontiguousarray(np.concatenate([blk.y for blk in blocks]) if blocks else np.zeros(0),
                                          dtype=np.float64),
                "y_start": np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                "centered": [j for j, blk in enumerate(blocks) if blk.mu is not None]}
        return cached

    def joint_terms(self, ctrl, rows):
        """JOINT_TERMS: per block ``[K candidate w's]`` -> per block :func:`block_joint_terms`."""
        out = np.zeros((len(self.blocks), ctrl.count + DUAL_SCALES.size + 1))
        for k, (vecs, _) in enumerate(self.from_rows(rows, ctrl.count)):
            out[k] = block_joint_terms(self.blocks[k], self.state[k].alpha, vecs, self.loss, self.config.gamma)
        return out


def joint_step(outer_state, loss_name, lam, eig_floor, n, WT, BT, evaluate, gradient=None, outer_tol=0.0,
               stop=None, dual=None, steps_left=None, spectral=None):
    """The joint certificate at W and the W of the next Omega-step: ``(fields, W^T or None)``.

    ``evaluate(wts)`` returns the per-task sums of :func:`block_joint_terms` (m x (K + S)) at the candidates
    ``wts`` and ``max y alpha``; the center of the next prox steps moves to the chosen t (a quarter of it
    when W itself was best).  ``gradient`` (smooth losses): GRADIENT_TERMS' evaluation for
    :func:`accelerated_phase`, which then runs from the best candidate while the joint gap is above
    ``outer_tol``; its dual bounds join the certificate and its best W, when better, is the next Omega-step's.
    ``stop()`` ends the phase early (a signal).  ``dual`` (the hinge loss): DUAL_TERMS' evaluation for
    :func:`.dual_phase.dual_phase`, which runs instead while the joint gap is above ``outer_tol``: its dual
    bounds join the certificate and its W_mu is the next Omega-step's (the covariance its dual points to).
    ``steps_left``: the W-steps --outer still allows after this one (a move that may raise P needs two).
    ``spectral`` (the hinge loss at most MAX_TASKS tasks): ``(project, evaluate)`` of SPECTRAL_PROJECT and
    SPECTRAL_EVAL: the phase is then :func:`.spectral_phase.spectral_phase` (prox-linear), the same in every other way.
    Shared by the server and the centralized baselines.
    """
    center = outer_state.prox_center or first_step(WT, BT)
    steps, wts, norms = candidates(WT, BT, lam, center)
    prox_count = len(wts)
    # the extrapolations along the last W-steps' move, scored in the same collective (the prox steps' t: 0)
    ts, more, more_norms = extrapolated(WT, outer_state.prev_wt)
    outer_state.prev_wt = np.array(WT, dtype=np.float64)
    wts, steps, norms = wts + more, np.concatenate([steps, np.zeros(len(more))]), np.concatenate([norms, more_norms])
    sums, box_max = evaluate(wts)
    K = len(wts)
    out = choose(loss_name, steps, norms, sums[:, :K], sums[:, K:], box_max, n, BT, lam)
    best = out.pop("best")
    out["wstep_dual"] = out["joint_dual"]         # the W-step's own alpha's bound (closing_budget reads it)
    out["extrapolation"] = ts[best - prox_count] if best >= prox_count else 0.0
    chosen = wts[best] if best > 0 else None
    # every earlier W-step's dual bound still bounds P*: the certificate keeps the best one
    bounds = [w["joint_dual"] for w in outer_state.wsteps if "joint_dual" in w]
    floor = None
    out["apg_iterations"] = 0
    reverted = outer_state.revert_wt is not None and out["joint_primal"] > outer_state.revert_primal
    if reverted:
        # the last Omega-step took a W the dual recovered and this W-step's P is above the P of the W it replaced:
        # the next Omega-step is that W's (hpcmtl.dmtrl.dual_phase; recorded as dual_move -1)
        chosen, out["prox_primal"], out["dual_move"] = outer_state.revert_wt, outer_state.revert_primal, -1
        out["extrapolation"] = 0.0
    outer_state.revert_wt = outer_state.revert_primal = None
    if gradient is not None and outer_tol > 0 and (out["joint_primal"] - max(bounds + [out["joint_dual"]]) >
                                                   outer_tol * abs(out["joint_primal"])):
        phases = sum(1 for w in outer_state.wsteps if w.get("apg_iterations", 0) > 0)
        phase = accelerated_phase(loss_name, lam, n, wts[best], gradient, min(APG_FIRST * 2 ** phases, APG_MOST),
                                  APG_TARGET * outer_tol, outer_state.apg_step, stop)
        outer_state.apg_step = phase["step"]
        out["apg_iterations"] = phase["iterations"]
        bounds.append(phase["dual"])
        if phase["dual"] > out["joint_dual"] and phase["dual"] >= max(bounds):
            out["dual_scale"] = phase["dual_scale"]
        if phase["primal"] < out["prox_primal"]:
            out["prox_primal"], chosen = phase["primal"], phase["wt"]
        # W is near P*: the largest floor whose majorizer exceeds P at the phase's W by at most FLOOR_PER_GAP of
        # the gap left (a larger floor keeps the next W-step well conditioned, a smaller one keeps it near P*)
        budget = FLOOR_PER_GAP * (phase["primal"] - max(bounds + [out["joint_dual"]]))
        floor = floor_within(np.linalg.svd(phase["wt"], compute_uv=False), len(n), lam, budget, eig_floor,
                             min(FLOOR_START, outer_state.floor or FLOOR_START))
    earlier = [w for w in outer_state.wsteps if "joint_primal" in w]
    kept = max(bounds + [out["joint_dual"]])
    open_gap = dual is not None and outer_tol > 0 and out["joint_primal"] - kept > outer_tol * abs(out["joint_primal"])
    if open_gap and still_dropping(earlier, out["joint_primal"], kept, outer_tol):
        # the W-steps still lower P by more than --outer-tol each: this W cannot be certified (its gap is at least
        # P - P*, and P* lies below the next W-step's P), and the phase's bound is only needed for that; the next
        # W-step also starts the phase from a better alpha.  Recorded, so the stall rule does not read the bound
        # it did not try to raise as a stall (hpcmtl.dmtrl.outer)
        out["dual_skipped"] = 1
    elif open_gap:
        # the budget grows with the W-steps taken (a phase skipped above still counts: the phases after them
        # start from alphas as good as the W-steps' P, and need the budget of their place in the run)
        phases = len(earlier)
        budget = min(APG_FIRST * 2 ** phases, APG_MOST)
        capped = closing_budget(outer_state.wsteps, out["joint_primal"], out["wstep_dual"], outer_tol)
        if capped is not None and capped < budget:
            budget, out["dual_capped"] = capped, 1
        # its target is --outer-tol itself: the phase's bounds certify the W-step just ended (the loop then ends on
        # it), unlike the accelerated phase's, whose W needs another W-step and so room below --outer-tol; the first
        # phase's is FIRST_REACH times that (first_phase_target)
        target = outer_tol if earlier else first_phase_target(outer_tol)
        if spectral is not None:
            settles = SettleCheck(evaluate, n, lam, eig_floor, outer_state.floor, out["joint_primal"], kept, outer_tol)
            phase = spectral_phase(lam, n, dual, *spectral, out["joint_primal"], budget, target, outer_state.apg_step,
                                   stop, settles)
            if settles.best_wt is not None:       # a W the phase passed, as a candidate beside its last
                phase["wts"].append(settles.best_wt)
        else:
            phase = dual_phase(lam, n, dual, out["joint_primal"], budget, target, outer_state.apg_step, stop)
        outer_state.apg_step = phase["step"]
        out["apg_iterations"] = phase["iterations"]
        if phase["dual"] > max(bounds + [out["joint_dual"]]):
            out["dual_scale"] = 1.0               # the phase's own beta
        bounds.append(phase["dual"])
        # the next W-step's P is at most P + the floor's majorizer excess at the W its Sigma comes from: the
        # candidate (the prox steps' best, or a W the dual recovered) with the lowest such bound (one collective)
        floor = next_floor(out["joint_primal"], max(bounds), eig_floor, outer_state.floor)
        recovered = phase["wts"]
        sums, _ = evaluate(recovered)
        singular = [np.linalg.svd(wt, compute_uv=False) for wt in [wts[best]] + recovered]
        primals = [out["prox_primal"]] + [float(np.sum(sums[:, c] / n)) + 0.5 * lam * float(sv.sum()) ** 2
                                          for c, sv in enumerate(singular[1:])]
        bound = [p + majorizer_excess(sv, len(n), lam, floor) if np.isfinite(p) else np.inf
                 for p, sv in zip(primals, singular)]
        pick = int(np.argmin(bound))
        gap = out["joint_primal"] - max(bounds)
        progress = earlier[-1]["joint_primal"] - out["joint_primal"] if earlier else np.inf
        failed = any(w.get("dual_move", 0) < 0 for w in earlier)
        if reverted:
            pick = 0                              # the W before the move, chosen above
        elif (not bound[pick] < out["joint_primal"] - DUAL_MOVE_SHARE * gap and 0 <= progress < DUAL_MOVE_SHARE * gap
                and not failed and not out.get("dual_capped") and (steps_left is None or steps_left >= 2)):
            # no candidate's bound promises a step worth taking and the last W-step lowered P by next to nothing:
            # the alternation has stalled (the floor pins W's task subspace), so the W the dual recovers with the
            # lowest P goes on, bound or not: its Sigma is supported where the dual says the optimum's is, and
            # the W-step after it finds the weights there.  Its P is no bound on that W-step's, so the W it
            # replaces is kept: if the W-step raises P, the next Omega-step goes back to it, and no such move is
            # tried again
            outer_state.revert_wt = wts[best]
            outer_state.revert_primal = out["prox_primal"]
            pick = 1 + int(np.argmin(primals[1:]))
            out["dual_move"] = 1
        if pick > 0:
            chosen = recovered[pick - 1]
            out["extrapolation"] = 0.0
            out["prox_primal"] = primals[pick] if out.get("dual_move") else min(out["prox_primal"], primals[pick])
    if bounds and max(bounds) > out["joint_dual"]:
        out["joint_dual"] = max(bounds)
        out["joint_gap"] = out["joint_primal"] - out["joint_dual"]
        out["joint_rel_gap"] = out["joint_gap"] / max(abs(out["joint_primal"]), 1e-300)
    # the prox steps' center moves to the chosen t (a quarter of it when W itself was best; kept when an
    # extrapolation was)
    outer_state.prox_center = (out["prox_step"] if 0 < best < prox_count else
                               center if best >= prox_count else center / STEP_FACTOR ** 2)
    if floor is None:
        floor = float(np.clip(FLOOR_PER_GAP * out["joint_rel_gap"], eig_floor,
                              min(FLOOR_START, outer_state.floor or FLOOR_START)))
    outer_state.floor = floor
    return out, chosen


class SettleCheck:
    """The hinge's phase's question ``settles(W^T, D)``: whether the next W-step, on the Omega-step of W at the floor
    the phase's bound D sets, is certified to SETTLE_SHARE of ``outer_tol`` by the bounds (the W-step's ``kept`` and
    D).  That W-step's P is at most ``P(W)`` plus the floor's majorizer excess (its objective at W; the trace norm
    squared is at most ``tr(W Omega W^T)`` for a trace-one Sigma), so once that sum is that close to the bound the
    phase has done its part: raising the bound to certify the W-step just ended may take it hundreds of passes
    more, where the recovered W is that close already.  One JOINT_TERMS collective (a pass over the rows) and W's
    singular values a question.  The W asked about with the lowest such sum is kept (``best_wt``): the W a phase
    recovers moves up and down with its momentum, and its last one may be well above a W it passed."""

    def __init__(self, evaluate, n, lam, eig_floor, last_floor, primal, kept, outer_tol):
        self.evaluate, self.n, self.lam, self.eig_floor, self.last_floor = evaluate, n, lam, eig_floor, last_floor
        self.primal, self.kept, self.outer_tol = primal, kept, outer_tol
        self.best_wt, self.best_value = None, np.inf

    def __call__(self, wt, dual):
        bound = max(self.kept, dual)
        sums, _ = self.evaluate([wt])
        singular = np.linalg.svd(wt, compute_uv=False)
        p = float(np.sum(sums[:, 0] / self.n)) + 0.5 * self.lam * float(singular.sum()) ** 2
        floor = next_floor(self.primal, bound, self.eig_floor, self.last_floor)
        value = p + majorizer_excess(singular, self.n.size, self.lam, floor)
        if not np.isfinite(value):
            return False
        if value < self.best_value:
            self.best_wt, self.best_value = wt, value
        return value - bound <= SETTLE_SHARE * self.outer_tol * abs(p)


def next_floor(primal, bound, eig_floor, last_floor):
    """The Omega-step's floor after the hinge's phase: FLOOR_PER_GAP times the joint relative gap, at least
    --eig-floor, at most FLOOR_START and the last floor."""
    return float(np.clip(FLOOR_PER_GAP * (primal - bound) / abs(primal), eig_floor,
                         min(FLOOR_START, last_floor or FLOOR_START)))


def first_phase_target(outer_tol):
    """The hinge's first dual phase's target: ``FIRST_REACH * outer_tol``, at most FIRST_REACH_MOST and at least
    ``outer_tol``.

    The first W-step is the tasks' own (Sigma = I/m, no Omega-step's), and a phase after a later W-step is skipped
    while the W-step before it lowered P by more than --outer-tol (:func:`still_dropping`), which the first cannot
    tell.  Its phase cannot certify a W far above P*; it pays through the W it recovers for the first Omega-step,
    worth the most where the tasks' own W is far from the optimum.  Once its bound puts the first W-step's P close
    to P*, the W-steps close the rest at their linear rate for less than the phase's iterations cost (an iteration,
    with its m-column projection, costs about what a W-step's round does).  The cap is a distance to P*, not a
    multiple of a loose tolerance: a phase stopped at a gap of 50 % recovers nothing.  A bound is below P*, so a
    first W-step further above P* than the target keeps its whole phase; one already within --outer-tol is
    certified by the second W-step's phase.  The cases behind the constants: docs/math.md."""
    return max(outer_tol, min(FIRST_REACH * outer_tol, FIRST_REACH_MOST))


def still_dropping(earlier, primal, dual, outer_tol):
    """Whether the hinge's dual phase after this W-step is skipped: the last W-step lowered P (from the W-step
    before it, without a recovered-W move or a revert in between) by more than ``outer_tol |P|`` and by at least
    DUAL_MOVE_SHARE of the joint gap ``primal - dual`` (the W-steps close the gap themselves, they do not crawl).
    Then P* is most likely more than ``outer_tol |P|`` below P (the W-steps' decrease is nearly geometric: the
    next one's alone is of that order), so no dual bound can certify this W, and a phase's 10^2-10^3 passes over
    the data would raise only the bound kept for a later W-step, which a phase from that W-step's own alpha raises
    further (Reuters, lam 1e-4: the bound stayed flat through the first seven phases).  A crawl (less than
    DUAL_MOVE_SHARE of the gap) keeps its phase: the stalled alternation's move needs the W the phase recovers."""
    if not earlier or earlier[-1].get("dual_move", 0) != 0:
        return False
    drop = earlier[-1]["joint_primal"] - primal
    return bool(np.isfinite(drop) and drop > outer_tol * abs(primal) and drop >= DUAL_MOVE_SHARE * (primal - dual))


def closing_budget(wsteps, primal, own, outer_tol):
    """The hinge's dual phase budget while the W-steps' own bounds close the joint gap, else None.

    ``wsteps``: the outer loop's records, the W-step just ended last (its ``round`` the run's count so far);
    ``primal``, ``own``: its P and the bound of its own alpha.  The W-step's alpha maximizes the dual at the Sigma
    of the W before it, and its joint dual misses ``(||B||_2^2 - tr(B Sigma B^T)) / (2 lam)``, which shrinks with
    the alternation's own steps (MNIST domains, lam 1e-3: the own gap falls 0.26-0.56x a W-step, 4.6e-3 to
    2.5e-4 in four W-steps of 2-6 rounds, where a phase from the first of them took 870 steps).  With ``g`` this
    gap, ``q`` the larger of its last two ratios to the W-step before's (the slower: the ratio grows as the
    alternation converges) and ``t = --outer-tol |P|``, the W-steps would certify in ``k = log(t / g) / log(q)``
    more; when ``k <= CLOSING_WSTEPS`` the phase is worth at most what they cost: PHASE_STEPS_PER_ROUND steps a
    round, ``k`` (at least 1) times this W-step's rounds (a phase step is one pass over the rows and the m x m
    algebra, a round at least one pass and the aggregation's solve)."""
    earlier = [w for w in wsteps if "joint_primal" in w]
    gaps = [w["joint_primal"] - w["wstep_dual"] for w in earlier[-2:] if "wstep_dual" in w] + [primal - own]
    target = outer_tol * abs(primal)
    if len(gaps) < 2 or not (np.all(np.isfinite(gaps)) and min(gaps) > 0 and target > 0):
        return None
    q = max(b / a for a, b in zip(gaps[:-1], gaps[1:]))
    if not q < 1.0:
        return None
    k = max(np.log(target / gaps[-1]) / np.log(q), 0.0)
    if k > CLOSING_WSTEPS:
        return None
    rounds = wsteps[-1].get("round", 0) - earlier[-1].get("round", 0) if wsteps[-1] is not earlier[-1] else 1
    return int(np.ceil(PHASE_STEPS_PER_ROUND * max(rounds, 1) * max(k, 1.0)))


def majorizer_excess(singular, m, lam, floor):
    """``(lam/2) (tr(W Sigma^-1 W^T) - ||W||_*^2)`` for the Omega-step of W floored at ``floor`` times its largest
    singular value: ``Sigma = diag(max(s, f s_1)) / T`` on W's singular directions (and ``f s_1 / T`` on the
    m - len(s) others), ``T`` its trace, so ``tr(W Sigma^-1 W^T) = T sum_k s_k^2 / max(s_k, f s_1)``."""
    s = np.asarray(singular, dtype=np.float64)
    if s.size == 0 or not s[0] > 0:
        return 0.0
    level = floor * s[0]
    floored = np.maximum(s, level)
    trace = float(floored.sum()) + level * (m - s.size)
    return 0.5 * lam * (trace * float(np.sum(s * s / floored)) - float(s.sum()) ** 2)


def floor_within(singular, m, lam, budget, lowest, highest):
    """The largest Omega-step floor in ``[lowest, highest]`` whose :func:`majorizer_excess` is at most ``budget``
    (``lowest`` when none is): the excess grows with the floor, so a bisection on its logarithm."""
    if not budget > 0 or majorizer_excess(singular, m, lam, lowest) > budget:
        return float(lowest)
    if majorizer_excess(singular, m, lam, highest) <= budget:
        return float(highest)
    lo, hi = np.log(lowest), np.log(highest)
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if majorizer_excess(singular, m, lam, np.exp(mid)) <= budget:
            lo = mid
        else:
            hi = mid
    return float(np.exp(lo))


class JointServer:
    """Server half: after a learned-Sigma W-step, the joint certificate and the next Omega-step's W."""

    def init_joint(self):
        self.next_wt = None               # the chosen prox step's W^T (m x d), None: the W-step's own W

    def certify(self):
        """The joint certificate of the W-step just ended and the prox step for the next Sigma (one
        collective): the W-step record's joint fields."""

        def evaluate(wts):
            payload = np.concatenate([wt[self.block_task] for wt in wts], axis=1)
            rows = self.command(JointCommand.JOINT_TERMS, payload=payload, width=payload.shape[1], count=len(wts))
            sums = self.per_task(rows[:, :-1])
            check_finite_rows(sums, self.round, self.names, "joint certificate's loss or conjugate sum", self.outer)
            return sums, (float(np.max(rows[:, -1])) if rows.shape[0] else 0.0)

        def gradient(prox_t, ext_t):
            payload = np.concatenate([prox_t[self.block_task], ext_t[self.block_task]], axis=1)
            width = self.d + 3 + DUAL_SCALES.size
            raw = self.command(JointCommand.GRADIENT_TERMS, payload=payload, width=payload.shape[1], count=width)
            rows = self.per_task(raw[:, :-1])
            # the prox point's loss may overflow (a step too long): the phase rejects it and halves the step
            check_finite_rows(np.delete(rows, self.d, axis=1), self.round, self.names,
                              "accelerated step's gradient, loss or conjugate sum", self.outer)
            box = float(np.max(raw[:, -1])) if raw.shape[0] else 0.0
            return rows[:, :self.d], rows[:, self.d], rows[:, self.d + 1], rows[:, self.d + 2:], box

        def dual(action, payload):
            if payload is None:
                payload = np.zeros((self.m, self.d + 3))
            raw = self.command(DualCommand.DUAL_TERMS, payload=payload[self.block_task], width=self.d + 3,
                               action=action)
            rows = self.per_task(raw)
            check_finite_rows(rows, self.round, self.names, "dual phase's V or sum", self.outer)
            return rows

        def project(VT, theta, accept):
            flat = np.concatenate([VT.ravel(), [theta, float(accept)]])
            self.command(SpectralCommand.SPECTRAL_PROJECT, payload=flat, width=flat.size, m=self.m)

        def spectral_eval(Ss, tau):
            flat = np.concatenate([S.ravel() for S in Ss] + [[tau, self.config.lam]])
            raw = self.command(SpectralCommand.SPECTRAL_EVAL, payload=flat, width=flat.size, m=self.m)
            rows = self.per_task(raw)
            check_finite_rows(rows, self.round, self.names, "prox-linear phase's sums", self.outer)
            return np.split(rows, len(Ss), axis=1)

        smooth = get_loss(self.config.loss).smooth
        hinge = self.config.loss == "hinge"
        out, self.next_wt = joint_step(self.outer_state, self.config.loss, self.config.lam, self.config.eig_floor,
                                       self.n, self.dense_wt(), self.space.dense(self.BT), evaluate,
                                       gradient if smooth else None, self.config.outer_tol,
                                       self.signal_pending, dual if hinge else None,
                                       self.config.outer - self.outer_state.outer - 1,
                                       (project, spectral_eval) if hinge and self.m <= MAX_TASKS else None)
        if hasattr(self.progress, "outer_step"):
            self.progress.outer_step(self.outer, out)
        return out
