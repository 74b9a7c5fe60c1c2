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

from .. import _sdca
from ..engine import Command, Down, Up, check_finite_rows

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


class JointCommand(Command):
    """The joint certificate's message (ids: DMTRL's protocol, :mod:`.commands`)."""
    # per block [K candidate w's (K d)] -> per block [loss sum at each candidate (K), conjugate sum at each
    # DUAL_SCALES s (S), max_j y_j alpha_j]
    JOINT_TERMS = 40, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("width", "count"), "joint_terms"


def prox_trace_norm_squared(Z: np.ndarray, t: float):
    """``argmin_W ||W - Z||_F^2 / 2 + (t/2) ||W||_*^2`` and its trace norm.

    With Z's singular values z (descending): ``w_k = max(z_k - t S, 0)`` where ``S = sum_{k<=K} z_k /
    (1 + K t)`` and K is the largest count with ``z_K > t S_K`` (the optimality of the shrunk values, which
    sum to S).  Thin SVD of Z: O(m d min(m, d)).
    """
    U, z, Vt = np.linalg.svd(Z, full_matrices=False)
    if z.size == 0 or not z[0] > 0:
        return np.zeros_like(Z), 0.0
    K = np.arange(1, z.size + 1)
    S = np.cumsum(z) / (1.0 + K * t)
    keep = np.nonzero(z - t * S > 0)[0]
    k = int(keep[-1]) + 1
    w = np.maximum(z[:k] - t * S[k - 1], 0.0)
    return (U[:, :k] * w) @ Vt[:k], float(w.sum())


def candidate_steps(center: float):
    """The prox steps t to try: 0, then ``center * STEP_FACTOR^k`` for ``|k| <= STEP_SPREAD``."""
    return np.concatenate([[0.0], center * STEP_FACTOR ** np.arange(-STEP_SPREAD, STEP_SPREAD + 1)])


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
    spectral2 = float(np.linalg.norm(BT, 2)) ** 2 if BT.size else 0.0
    duals = -np.sum(conj_sums / n[:, None], axis=0) - DUAL_SCALES ** 2 * spectral2 / (2.0 * lam)
    if loss_name != "squared":                # hinge, smoothed hinge, logistic: y s alpha stays in [0, 1]
        duals = np.where(DUAL_SCALES * box_max <= 1.0 + 1e-12, duals, -np.inf)
    j = int(np.argmax(duals))
    best = int(np.argmin(np.where(np.isfinite(primals), primals, np.inf)))
    primal, dual = float(primals[0]), float(duals[j])
    gap = primal - dual
    return {"joint_primal": primal, "joint_dual": dual, "joint_gap": gap,
            "joint_rel_gap": gap / max(abs(primal), 1e-300), "dual_scale": float(DUAL_SCALES[j]),
            "prox_step": float(steps[best]), "prox_primal": float(primals[best]), "best": best}


class JointBlocks:
    """Worker half: JOINT_TERMS on this rank's blocks."""

    def joint_terms(self, ctrl, rows):
        """JOINT_TERMS: per block ``[K candidate w's]`` -> per block :func:`block_joint_terms`."""
        out = np.zeros((len(self.blocks), ctrl.count + DUAL_SCALES.size + 1))
        for k, (vecs, _) in enumerate(self.from_rows(rows, ctrl.count)):
            out[k] = block_joint_terms(self.blocks[k], self.state[k].alpha, vecs, self.loss, self.config.gamma)
        return out


def joint_step(outer_state, loss_name, lam, eig_floor, n, WT, BT, evaluate):
    """The joint certificate at W and the chosen prox step: ``(fields, W(t)^T or None)``.

    ``evaluate(wts)`` returns the per-task sums of :func:`block_joint_terms` (m x (K + S)) at the candidates
    ``wts`` and ``max y alpha``; the center of the next prox steps moves to the chosen t (a quarter of it
    when W itself was best).  Shared by the server and the centralized baselines.
    """
    center = outer_state.prox_center or first_step(WT, BT)
    steps, wts, norms = candidates(WT, BT, lam, center)
    sums, box_max = evaluate(wts)
    K = len(wts)
    out = choose(loss_name, steps, norms, sums[:, :K], sums[:, K:], box_max, n, BT, lam)
    best = out.pop("best")
    # every earlier W-step's dual bound still bounds P*: the certificate keeps the best one
    earlier = [w["joint_dual"] for w in outer_state.wsteps if "joint_dual" in w]
    if earlier and max(earlier) > out["joint_dual"]:
        out["joint_dual"] = max(earlier)
        out["joint_gap"] = out["joint_primal"] - out["joint_dual"]
        out["joint_rel_gap"] = out["joint_gap"] / max(abs(out["joint_primal"]), 1e-300)
    outer_state.prox_center = out["prox_step"] if best > 0 else center / STEP_FACTOR ** 2
    outer_state.floor = float(np.clip(FLOOR_PER_GAP * out["joint_rel_gap"], eig_floor,
                                      min(FLOOR_START, outer_state.floor or FLOOR_START)))
    return out, (wts[best] if best > 0 else None)


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

        out, self.next_wt = joint_step(self.outer_state, self.config.loss, self.config.lam, self.config.eig_floor,
                                       self.n, self.dense_wt(), self.space.dense(self.BT), evaluate)
        if hasattr(self.progress, "outer_step"):
            self.progress.outer_step(self.outer, out)
        return out
