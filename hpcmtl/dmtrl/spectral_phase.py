"""The hinge loss's outer step at a few tasks: prox-linear ascent of the joint dual (issue 36).

The joint dual ``D(beta) = sum_i (1/n_i) sum_j beta_ij - ||V(beta)||_2^2 / (2 lam)`` (``beta = y alpha`` in the box,
V as in :mod:`.dual_phase`) is not smooth where the top eigenvalues of ``M = V^T V`` tie, and at the optimum they do,
as many as the rank of W*.  The smoothed ascent of :mod:`.dual_phase` replaces ``lambda_max(M)`` by a soft maximum
whose curvature across the tied eigenvectors is ``1/mu``: its steps shrink with the accuracy it aims at, and on
Reuters (8 tasks, W of rank 3) its bound stalls 2-5e-3 below P.  Here the nonsmooth term is kept exact and only V is
linearized (a prox-linear step).  At an extrapolated point ``beta_y`` (``V_y``, ``M_y``) and for a step ``d``::

    ||V_y + V(d)||_2^2 <= max_{S in the spectraplex} tr(S (M_y + V_y^T V(d) + V(d)^T V_y)) + ||V(d)||_2^2,

so with ``tau`` small enough (backtracking: the exact ``D`` of the trial must reach the model) the step maximizes
``c(beta_y + d) - max_S tr(S (M_y + 2 sym(V_y^T V(d)))) / (2 lam) - |d|^2 / (2 tau)`` over the box (``|d|^2 =
sum_i |d_i|^2 / n_i``).  Exchanging max and min, ``S`` minimizes the convex ``phi(S)`` (the step's value at S), and
for a fixed S the step is one projected gradient step of the fixed-Sigma dual: ``d(S) = clip(beta_y + tau (1 - y
x . w_i)) - beta_y`` with ``W = V_y S / lam``, the margins of the W that S's W-step points to.  ``phi`` and its
gradient ``-(M_y + V_y^T V(d) + V(d)^T V_y) / (2 lam)`` need, per row, only ``q_j = y_j x_j^T V_y`` (m numbers):
one pass over the rows stores them (:data:`SpectralCommand.SPECTRAL_PROJECT`), then each evaluation of phi is a
pass over q (:data:`SpectralCommand.SPECTRAL_EVAL`, m + 2 numbers a block back, two S in one exchange), and the
m x m problem in S is solved on the server by accelerated projected gradient on the spectraplex.  The chosen S's
step is then taken by DUAL_TERMS (:mod:`.dual_phase`'s worker state: FISTA's momentum, the restart, the same trial
arithmetic), whose trial's exact D joins the certificate.  S carries the tied eigenvalues' weights exactly, so the
step is the fixed-Sigma dual's (curvature ``||X||^2 / lam``, no ``1/mu``).  Each iteration costs two passes over the
rows and m x m algebra: for few tasks (:data:`MAX_TASKS`); more tasks keep the smoothed phase.

Worker half: :class:`SpectralPhaseBlocks`; server half: :func:`spectral_phase`.  Derivation: docs/math.md.
"""
from __future__ import annotations

import numpy as np

from ..engine import Command, Down, Up
from ..taskdata import float64_chunks
from .dual_phase import DUAL_STALL, FIRST_STEP, MU_EVERY, START, TRIAL, next_momentum

# the prox-linear phase runs where the m x m problem in S and m numbers a row are cheap (more tasks: dual_phase)
MAX_TASKS = 32
# the problem in S: at most S_ITERATIONS accelerated projected-gradient steps a phase iteration (warm started from the
# last S), fewer once a step lowers phi by less than S_TOL of the gap left (phi's scale)
S_ITERATIONS = 60
S_TOL = 1e-4
PROJECT, EVALUATE = 0, 1
# tau doubles after this many accepted steps in a row.  The curvature along the phase's path falls as it leaves the
# W-step's alpha (the first moves are along the rows' common direction: a tau that fails there holds 10-20x longer
# later), so tau must climb back quickly after the backtracking at the start; a doubling that fails costs one trial
STEP_GROW_AFTER = 2
# every this many accepted steps the phase asks whether the W its last accepted point recovers settles the outer loop
# (its P and Omega-step close the gap: hpcmtl.dmtrl.joint); the question costs a pass over the rows
SETTLE_EVERY = 10


class SpectralCommand(Command):
    """The prox-linear phase's messages (ids: DMTRL's protocol, :mod:`.commands`)."""
    # [V_y^T (m x d), row-major, theta, accept] -> nothing: with accept, first DUAL_TERMS' commit (beta <- trial,
    # ext <- trial + theta (trial - beta)); then each block stores q_j = y_j x_j . V_y[:, l] (the rows' scores at V_y's
    # columns, implicitly centered rows as their scores; a block on its support columns reads V_y there)
    SPECTRAL_PROJECT = 45, Down.BCAST, Up.NOTHING, ("width", "m"), "spectral_project"
    # [S_1 .. S_k (m x m each), row-major, tau, lam] -> per block, for each S in turn, [sum d, |d|^2, q^T d (m)] with
    # d = clip(ext + tau (1 - q S_:t / lam), 0, 1) - ext (t the block's task, ext DUAL_TERMS' extrapolated point):
    # several S in one exchange (the S-problem's trial and its next extrapolation), each S's sums as alone
    SPECTRAL_EVAL = 46, Down.BCAST, Up.GATHER_ROWS, ("width", "m"), "spectral_eval"


class SpectralPhaseBlocks:
    """Worker half: the per-row ``q`` at the server's V_y and the step's sums at an S (DUAL_TERMS' state)."""

    def spectral_project(self, ctrl, flat):
        m = ctrl.m
        flat = np.asarray(flat, dtype=np.float64)
        theta, accept = float(flat[-2]), flat[-1] != 0.0
        if accept:
            beta, ext, trial = self.dual_state
            ext[:] = trial + theta * (trial - beta)
            beta[:] = trial
        VT = flat[:-2].reshape(m, -1)
        self.spectral_q = []
        for blk, f in zip(self.blocks, self.columns):
            V = np.ascontiguousarray((VT if f is None else VT[:, f]).T)          # the block's columns x m
            # all m columns in one pass over the rows (m matvecs would read them m times)
            q = np.concatenate([np.asarray(C @ V).reshape(-1, m) for C in float64_chunks(blk.X)] or
                               [np.zeros((0, m))])
            if blk.mu is not None:                                           # implicitly centered rows
                q -= np.array([blk.z_shift(V[:, col]) for col in range(m)])[None, :]
            self.spectral_q.append(q * blk.y[:, None])

    def spectral_eval(self, ctrl, flat):
        m = ctrl.m
        flat = np.asarray(flat, dtype=np.float64)
        count = (flat.size - 2) // (m * m)
        Ss, tau, lam = flat[:count * m * m].reshape(count, m, m), float(flat[-2]), float(flat[-1])
        ext = self.dual_state[1]
        out = np.zeros((len(self.blocks), count, m + 2))
        for k, (start, stop) in enumerate(self.dual_slices()):
            q, point = self.spectral_q[k], ext[start:stop]
            for s, S in enumerate(Ss):          # one S at a time: each S's sums the same bits as alone
                d = np.clip(point + tau * (1.0 - q @ S[:, self.blocks[k].task] / lam), 0.0, 1.0) - point
                out[k, s, 0], out[k, s, 1], out[k, s, 2:] = float(np.sum(d)), float(d @ d), q.T @ d
        return out.reshape(len(self.blocks), count * (m + 2))

    def dual_slices(self):
        """Each block's slice of DUAL_TERMS' state (its order: :func:`.dual_phase.dual_batch`)."""
        batch = self.dual_batch
        slices = [None] * len(self.blocks)
        for ks, _, a, _, _, starts, _ in batch["groups"]:
            for i, k in enumerate(ks):
                slices[k] = (a + int(starts[i]), a + int(starts[i + 1]))
        return slices


def project_spectraplex(S):
    """The Frobenius projection of a symmetric S onto ``{S >= 0, tr S = 1}``: its eigenvalues onto the simplex."""
    e, Q = np.linalg.eigh(0.5 * (S + S.T))
    u = e[::-1]
    css = np.cumsum(u)
    k = np.nonzero(u * np.arange(1, u.size + 1) > css - 1.0)[0][-1]
    w = np.maximum(e - (css[k] - 1.0) / (k + 1), 0.0)
    return (Q * w) @ Q.T


def top_eigenvalue(A):
    return max(float(np.linalg.eigvalsh(0.5 * (A + A.T))[-1]), 0.0)


def spectral_phase(lam, n, terms, project, evaluate, primal, budget, target, step=None, stop=None, settles=None):
    """Prox-linear ascent of the joint dual from the W-step's alpha (the module docstring).  ``terms`` as for
    :func:`.dual_phase.dual_phase`; ``project(VT, theta, accept)`` commits the last trial (accept) and
    stores the rows' q at ``V_y``; ``evaluate(Ss, tau)`` returns SPECTRAL_EVAL's per-task sums (m x (m + 2)) for
    each S of ``Ss``, in one exchange.  Every DUAL_TERMS trial and every projection counts against ``budget``
    (passes over the rows).  Ends at the budget, at the first trial with ``(primal - best D) / primal <=
    target``, once MU_EVERY accepted steps raised the bound by less than DUAL_STALL of the gap left, when
    ``settles(W^T, best D)`` (asked every SETTLE_EVERY accepted steps: one pass over the rows) says the W the last
    accepted point recovers certifies the next W-step (:class:`.joint.SettleCheck`), or when ``stop()`` says so.
    Returns :func:`.dual_phase.dual_phase`'s dict: ``dual`` (the best exact D of the start and every trial), ``wts``
    (the W^T of the last accepted point's S: ``S V^T / lam``), ``iterations`` (passes, the questions' included),
    ``step`` (tau, the next phase's first)."""
    inv_n = 1.0 / n
    m = n.size
    rows = terms(START, None)
    d = rows.shape[1] - 4

    def parts(rows):
        return rows[:, :d] * inv_n[:, None], float(rows[:, d] @ inv_n), rows[:, d + 1:].T @ inv_n

    VT_beta, lin_beta, _ = parts(rows)
    best = lin_beta - top_eigenvalue(VT_beta @ VT_beta.T) / (2.0 * lam)
    tau = FIRST_STEP if step is None else step
    VT_ext, lin_ext = VT_beta, lin_beta
    e, Q = np.linalg.eigh(VT_ext @ VT_ext.T)
    S = np.outer(Q[:, -1], Q[:, -1])
    momentum, theta, accept, k, accepted, run, checked = 1.0, 0.0, 0, 0, 0, 0, best
    projected = False
    S_best, VT_last = S, VT_beta
    while k + (1 if projected else 2) <= budget and tau > 0:      # the projection and the trial: two passes
        if stop is not None and stop():
            break
        M = VT_ext @ VT_ext.T
        if not projected:
            project(VT_ext, theta, accept)        # commits the last trial first (accept), then the rows' q
            k += 1
            projected, accept = True, 0
        S = minimize_phi(evaluate, M, S, tau, lam, inv_n, max(primal - best, 1e-300))
        k += 1
        WT = S @ VT_ext / lam
        payload = np.column_stack([WT, np.tile([tau, 0.0, 0.0], (m, 1))])
        VT_trial, lin_trial, (gdot, square, restart) = parts(terms(TRIAL, payload))
        exact = lin_trial - top_eigenvalue(VT_trial @ VT_trial.T) / (2.0 * lam)
        if np.isfinite(exact):                # the trial is in the box: its D bounds P* whether taken or not
            best = max(best, exact)
        if primal - best <= target * abs(primal):
            break
        cross = VT_ext @ (VT_trial - VT_ext).T            # V_y^T V(d), m x m
        model = lin_trial - top_eigenvalue(M + cross + cross.T) / (2.0 * lam) - square / (2.0 * tau)
        if not (np.isfinite(exact) and exact >= model - 1e-12 * abs(model)):
            tau *= backtrack(VT_trial, M + cross + cross.T, square, tau, lam) if np.isfinite(exact) else 0.5
            accept, run = 0, 0
            continue
        accepted += 1
        run += 1
        if run == STEP_GROW_AFTER:
            tau, run = 2.0 * tau, 0
        if accepted % MU_EVERY == 0:
            if best - checked < DUAL_STALL * (primal - best):
                break
            checked = best
        momentum, theta = next_momentum(momentum, restart)
        VT_ext = VT_trial + theta * (VT_trial - VT_beta)
        lin_ext = lin_trial + theta * (lin_trial - lin_beta)
        VT_beta, lin_beta, accept = VT_trial, lin_trial, 1
        S_best, VT_last = S, VT_trial
        projected = False
        if settles is not None and accepted % SETTLE_EVERY == 0:
            k += 1                                # the question's pass over the rows
            if settles(S_best @ VT_last / lam, best):
                break
    return {"dual": float(best), "wts": [S_best @ VT_last / lam], "iterations": k, "step": tau}


def backtrack(VT_trial, model_matrix, square, tau, lam):
    """The factor a failed trial's tau shrinks by: 1/2, or less when the trial's own curvature says so.  The model
    failed because ``(lambda_max(V_trial^T V_trial) - lambda_max(model_matrix)) / (2 lam)`` (V(d)'s own term)
    exceeded ``|d|^2 / (2 tau)`` by a ratio r; d grows linearly with tau off the box's faces, so that term falls like
    tau^2 and ``|d|^2 / tau`` like tau: tau / r is about where the model holds.  Halving would take log2(r) trials
    to get there (from the first phase's FIRST_STEP), each one an S-problem and a pass."""
    excess = (top_eigenvalue(VT_trial @ VT_trial.T) - top_eigenvalue(model_matrix)) / (2.0 * lam)
    ratio = excess / (square / (2.0 * tau)) if square > 0 else 0.0
    return min(0.5, 1.0 / ratio) if ratio > 0 and np.isfinite(ratio) else 0.5


def minimize_phi(evaluate, M, S, tau, lam, inv_n, scale):
    """The step's S: accelerated projected gradient on the spectraplex for ``phi(S) = c(d) - (tr(S M) + 2 tr(S
    V_y^T V(d))) / (2 lam) - |d|^2 / (2 tau)`` (convex: the step's value at S), from S; ``scale`` the gap left
    (the stopping test's unit).  Each trial goes out with the extrapolation that follows it should it be taken, so
    an iteration is one exchange with the ranks, not two (a rejected trial or the last one wastes a pass over q,
    which is cheap next to an exchange's latency).  Returns the S with the lowest phi seen."""

    def phis(*Ss):
        values = []
        for sums, S in zip(evaluate(Ss, tau), Ss):
            c = float(sums[:, 0] @ inv_n)
            square = float(sums[:, 1] @ inv_n)
            cross = (sums[:, 2:] * inv_n[:, None]).T         # [l, i]: V_y[:, l] . V(d)[:, i]
            value = c - (float(np.sum(S * M)) + 2.0 * float(np.sum(S * cross))) / (2.0 * lam) - square / (2.0 * tau)
            values.append((value, -(M + cross + cross.T) / (2.0 * lam)))
        return values

    [(value, grad)] = phis(S)
    best, best_value = S, value
    Y, Y_value, Y_grad, prev, momentum = S, value, grad, S, 1.0
    sigma = 1.0 / max(float(np.linalg.norm(grad)), 1e-300)
    for _ in range(S_ITERATIONS):
        following = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * momentum * momentum))
        while True:
            trial = project_spectraplex(Y - sigma * Y_grad)
            following_Y = trial + ((momentum - 1.0) / following) * (trial - prev)
            (t_value, t_grad), following_phi = phis(trial, following_Y)
            move = trial - Y
            if t_value <= Y_value + float(np.sum(Y_grad * move)) + float(np.sum(move * move)) / (2.0 * sigma) + \
                    1e-14 * abs(Y_value) or sigma < 1e-300:
                break
            sigma *= 0.5
        if t_value < best_value:
            drop = best_value - t_value
            best, best_value = trial, t_value
            if drop <= S_TOL * scale:
                break
        Y, prev, momentum = following_Y, trial, following
        Y_value, Y_grad = following_phi
        sigma *= 1.5
    return best
