"""The hinge loss's outer step: accelerated ascent on a smoothed joint dual (issue 36), for more tasks than
:data:`hpcmtl.dmtrl.spectral_phase.MAX_TASKS` (fewer take the prox-linear phase there, which keeps the spectral norm
exact: this phase's steps shrink with mu where the top eigenvalues of V^T V tie).

The smooth losses reach the learned-Sigma optimum by an accelerated proximal-gradient phase on P(W)
(:func:`hpcmtl.dmtrl.joint.accelerated_phase`); the hinge loss has no gradient, and its W-steps alone stall
(the Omega-step's floor freezes W's task subspace; on many one-row tasks 14 % above P*).  Its joint dual has
no such obstacle: with ``beta = y alpha`` in the box ``[0, 1]`` and ``V(beta)_i = sum_j beta_ij y_ij x_ij / n_i``
(d x m)::

    D(beta) = sum_i (1/n_i) sum_j beta_ij - ||V(beta)||_2^2 / (2 lam)  <=  P*

and ``||V||_2^2``, the largest eigenvalue of ``V^T V``, has the smooth upper bound
``f_mu(V) = mu log sum_k exp(s_k^2 / mu)`` over V's singular values s (``f_mu - ||V||_2^2 <= mu log r``,
r = min(m, d)), whose gradient is ``2 V Sigma_mu`` with ``Sigma_mu = R diag(w) R^T`` (R: V's right singular
vectors, w: the softmax of ``s^2 / mu``, trace 1).  So ``D_mu = sum beta / n - f_mu / (2 lam) <= D`` is a
smooth concave function on a box, and its gradient in ``beta_ij`` is ``(1 - y_ij x_ij . w_i) / n_i`` with
``W = V Sigma_mu / lam``: the hinge margins of the W that Sigma_mu's W-step would recover.  The phase runs
FISTA with backtracking and the gradient restart on D_mu (projected steps onto the box), from the W-step's
own alpha, halving mu every :data:`MU_EVERY` accepted steps down to a level where the smoothing costs a
fraction of the target gap:

* every trial point's exact ``D(beta)`` (its own spectral norm; a rejected trial is in the box too) joins the
  certificate, and the phase ends at the first one that certifies its target;
* the last point's ``W_mu`` is the next Omega-step's W: its Omega-step is ``Sigma_mu``'s (up to the
  singular values' weights), the covariance the dual says the optimum has, and the next W-step (certified,
  distributed as always) recovers a W near P* from it.  The returned model stays a certified W-step's W.

One collective an iteration (:data:`DualCommand.DUAL_TERMS`): the server sends ``W_mu`` at the extrapolated
point, each block takes its projected step and returns ``X^T (y beta)`` of the trial and four sums; the
extrapolation is linear, so the server forms V at the next extrapolated point from what it has.
Worker half: :class:`DualPhaseBlocks`; server half: :func:`dual_phase` (through an evaluator the server
builds: :meth:`hpcmtl.dmtrl.joint.JointServer.certify`).  Derivation: docs/math.md.
"""
from __future__ import annotations

import numpy as np

from .. import _joint_terms
from ..engine import Command, Down, Up

# mu halves after this many accepted steps (the smoothed dual's own progress comes first, then its accuracy)
MU_EVERY = 50
# mu starts where the smoothing costs MU_START_SHARE of the gap left and stops where it costs MU_END_SHARE of
# the phase's target gap
MU_START_SHARE = 0.5
MU_END_SHARE = 0.25
# the next Omega-step's W_mu is taken at a mu where the smoothing costs at least MU_RECOVER of the gap left
MU_RECOVER = 0.1
# at its last mu the phase ends once MU_EVERY accepted steps raised the dual by less than DUAL_STALL of the gap
# left to the W-step's P (what is left is the primal's to close, through the next Omega-step and W-step).  Small:
# D is one function at every W-step, but each phase starts again from its W-step's alpha, so what a phase stopped
# while D still rose is lost (at 0.02 phases on MDS ended short of the bound a longer one reached, and certifying
# took two more W-steps and their phases)
DUAL_STALL = 0.005
# the first phase's step in beta (backtracking halves it until the quadratic model holds)
FIRST_STEP = 1.0
# after this many accepted steps in a row the phase tries a twice longer step
STEP_TRIAL_AFTER = 10
# the block's row: [X^T (y trial) (d), sum trial, g . (trial - ext), |trial - ext|^2, (ext - trial) . (trial - beta)]
START, TRIAL = 0, 1
# a worker's blocks on all d columns take one kernel call from this many on (below: one call a block; a huge
# number: one call a block always, the tests' reference)
DUAL_BATCH_MIN_BLOCKS = 2


class DualCommand(Command):
    """The dual phase's message (ids: DMTRL's protocol, :mod:`.commands`)."""
    # START: nothing down; per block [X^T (y beta) (d), sum beta, 0, 0, 0] at beta = y alpha of the W-step.
    # TRIAL: per block [W_mu's column at the extrapolated point (d), step, theta, accept] -> per block
    # [X^T (y trial) (d), sum trial, g . (trial - ext), |trial - ext|^2, (ext - trial) . (trial - beta)], where
    # g = 1 - y x.w, trial = clip(ext + step g, 0, 1); accept = 1 first commits the previous trial (beta <- trial,
    # ext <- trial + theta (trial - beta))
    DUAL_TERMS = 42, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("width", "action"), "dual_terms"


class DualPhaseBlocks:
    """Worker half: DUAL_TERMS on this rank's blocks (their state lives for one phase: beta, ext, trial, the
    blocks' rows end to end).  The blocks on all d columns take one kernel call
    (``_joint_terms.dual_terms_blocks``), a block on its support columns one call of its own: the same body, so a
    block's bits never depend on the path, the batch or the rank count."""

    def dual_terms(self, ctrl, rows):
        d = ctrl.width - 3                    # from the command: a rank without blocks knows no d
        out = np.zeros((len(self.blocks), d + 4))
        if ctrl.action == START:
            self.dual_batch = dual_batch(self.blocks, self.columns)
            y = self.dual_batch["y"]
            order = self.dual_batch["order"]
            alpha = np.concatenate([self.state[k].alpha for k in order]) if order else np.zeros(0)
            beta = np.clip(y * alpha, 0.0, 1.0)                         # the W-step's alpha, in the box
            self.dual_state = (beta, beta.copy(), beta.copy())          # beta, ext, trial
            # step 0: trial = ext = beta, the row [X^T (y beta), sum beta, 0, 0, 0]
            self.dual_rows(np.zeros((len(self.blocks), d)), np.zeros((len(self.blocks), 3)), d, out)
            out[:, d + 1:] = 0.0
            return out
        self.dual_rows(rows[:, :d], rows[:, d:d + 3], d, out)
        return out

    def dual_rows(self, w, control, d, out):
        """The blocks' kernel calls (:func:`dual_groups`); ``out`` gets ``[X^T (y trial) (d), sum trial, g . move,
        |move|^2, restart]`` a block, the implicit centering's ``- mu sum(y trial)`` applied."""
        batch, (beta, ext, trial) = self.dual_batch, self.dual_state
        control = np.ascontiguousarray(control, dtype=np.float64)
        for ks, f, a, b, rows, starts, centered in batch["groups"]:
            wk = np.ascontiguousarray(w[ks] if f is None else w[ks[0]][f][None, :], dtype=np.float64)
            shift = np.zeros(len(ks))
            for i in centered:
                shift[i] = self.blocks[ks[i]].z_shift(wk[i])
            v = np.zeros((len(ks), wk.shape[1]))
            sums = np.empty((len(ks), 5))
            _joint_terms.dual_terms_blocks(rows, batch["y"][a:b], starts, wk, shift, control[ks], beta[a:b],
                                           ext[a:b], trial[a:b], v, sums)
            for i in centered:                                     # X^T u - mu sum(u): centered rows
                v[i] -= self.blocks[ks[i]].mu * sums[i, 4]
            if f is None:
                out[ks, :d] = v
            else:
                out[ks[0], f] = v[0]
            out[ks, d:] = sums[:, :4]


def dual_batch(blocks, columns):
    """What DUAL_TERMS hands the kernel, built once a phase: the blocks' labels end to end in the phase's state
    order (the blocks on all d columns first, so one slice holds all of theirs; then the blocks on their support
    columns) and the kernel calls' groups ``(blocks, columns or None, state slice a:b, their rows, their starts in
    the slice, the positions of the implicitly centered ones)``: the whole blocks in one call (fewer than
    DUAL_BATCH_MIN_BLOCKS: one each), each support block alone."""
    whole = [k for k, f in enumerate(columns) if f is None]
    support = [k for k, f in enumerate(columns) if f is not None]
    order = whole + support
    sizes = np.array([blocks[k].n_rows for k in order], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    calls = [whole] if len(whole) >= DUAL_BATCH_MIN_BLOCKS else [[k] for k in whole]
    calls += [[k] for k in support]
    groups, first = [], 0
    for ks in calls:                                  # in state order: each call's blocks are consecutive there
        last = first + len(ks)
        a, b = int(starts[first]), int(starts[last])
        groups.append((ks, columns[ks[0]], a, b, [blocks[k].rows for k in ks], starts[first:last + 1] - a,
                       [i for i, k in enumerate(ks) if blocks[k].mu is not None]))
        first = last
    return {"y": np.ascontiguousarray(np.concatenate([blocks[k].y for k in order]) if order else np.zeros(0),
                                      dtype=np.float64),
            "order": order, "groups": groups}


def next_momentum(momentum, restart):
    """FISTA's next momentum and the extrapolation's weight theta; the gradient restart (O'Donoghue & Candes, in
    beta: ``restart > 0``) starts them again (1, 0)."""
    if restart > 0:
        return 1.0, 0.0
    following = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * momentum * momentum))
    return following, (momentum - 1.0) / following


def smoothed(VT, mu, lam):
    """``(||V||_2^2, f_mu(V), W_mu^T)`` from the smaller Gram matrix of V^T (m x d): with
    ``VT^T VT = Q diag(e) Q^T`` (d x d, when d < m) ``W_mu^T = VT Q diag(w) Q^T / lam``; else with
    ``VT VT^T = R diag(e) R^T`` (m x m) ``W_mu^T = R diag(w) R^T VT / lam`` (``= Sigma_mu V^T / lam``).  The weights
    w multiply the eigenvectors and never divide by a singular value, so the Gram route's rounding in the small
    eigenvalues (eps ||V||^2) reaches W_mu only through weights of order ``exp(-(top - e) / mu)``; a thin SVD of
    V^T costs several times as much, and the phase asks for this once or twice an iteration."""
    if VT.size == 0:
        return 0.0, 0.0, np.zeros_like(VT)
    feature_side = VT.shape[0] > VT.shape[1]
    e, Q = np.linalg.eigh(VT.T @ VT if feature_side else VT @ VT.T)
    top = float(e[-1])
    if not top > 0:
        return 0.0, 0.0, np.zeros_like(VT)
    weights = np.exp((np.maximum(e, 0.0) - top) / mu)
    total = float(weights.sum())
    weights /= total
    if feature_side:
        WT = (VT @ Q * weights) @ Q.T / lam
    else:
        WT = (Q * weights) @ (Q.T @ VT) / lam
    return top, top + mu * np.log(total), WT


def dual_phase(lam, n, terms, primal, budget, target, step=None, stop=None):
    """FISTA on the smoothed joint dual from the W-step's alpha (the module docstring).  ``terms(action, rows)``
    returns the per-task sums of DUAL_TERMS (m x (d + 4)); ``primal``: P at the W-step's W.  Ends after
    ``budget`` trials, at the first trial with ``(primal - best D) / primal <= target``, or when ``stop()`` says
    so.  Returns a dict: ``dual`` (the best exact D of the start and every trial), ``wts`` (the primal W^T it
    recovers: W_mu at the last accepted point, and the average of the accepted points' W_mu weighted by their
    count, Nesterov's primal recovery: candidates for the next Omega-step's W), ``iterations``, ``step`` (the
    next phase's first guess, per unit of mu; ``step`` in: the same)."""
    inv_n = 1.0 / n
    rows = terms(START, None)
    d = rows.shape[1] - 4

    def parts(rows):
        return rows[:, :d] * inv_n[:, None], float(rows[:, d] @ inv_n), rows[:, d + 1:].T @ inv_n

    VT_beta, lin_beta, _ = parts(rows)
    top, _, _ = smoothed(VT_beta, 1.0, lam)
    best = lin_beta - top / (2.0 * lam)
    r = max(2, min(VT_beta.shape))
    mu_end = max(MU_END_SHARE * target * abs(primal) * 2.0 * lam / np.log(r), 1e-300)
    mu = max(MU_START_SHARE * (primal - best) * 2.0 * lam / np.log(r), mu_end)
    # the last phase's step per unit of mu: D_mu's curvature is nearly 1/mu once mu is small, so a step carried
    # over as it was (from a phase that ended at a small mu) would start this one's large mu 10^2-10^3 times too
    # short, and it doubles only after STEP_TRIAL_AFTER accepted steps in a row (Reuters, lam 1e-4, the phase
    # after W-step 9: joint gap 6.9e-3 from the step the phase before it ended with, 3.2e-3 from the first's)
    step = FIRST_STEP if step is None else min(FIRST_STEP, step * mu)
    VT_ext, lin_ext = VT_beta, lin_beta
    momentum, theta, accept, k, accepted, run, checked = 1.0, 0.0, 0, 0, 0, 0, best
    _, f_ext, WT_ext = smoothed(VT_ext, mu, lam)
    WT_sum, weight = np.zeros_like(WT_ext), 0.0
    while k < budget and step > 0:
        if stop is not None and stop():
            break
        k += 1
        payload = np.column_stack([WT_ext, np.tile([step, theta, float(accept)], (WT_ext.shape[0], 1))])
        VT_trial, lin_trial, (gdot, square, restart) = parts(terms(TRIAL, payload))
        top, f_trial, WT_trial = smoothed(VT_trial, mu, lam)
        mu_trial = mu
        value_ext = lin_ext - f_ext / (2.0 * lam)
        value = lin_trial - f_trial / (2.0 * lam)
        exact = lin_trial - top / (2.0 * lam)
        if np.isfinite(exact):                # a rejected trial is in the box too: its D bounds P* as well
            best = max(best, exact)
        if primal - best <= target * abs(primal):
            break                             # certified: the outer loop ends on this W-step
        if not (np.isfinite(value) and value >= value_ext + gdot - square / (2.0 * step) - 1e-12 * abs(value_ext)):
            step *= 0.5                       # backtracking: the quadratic model did not hold
            accept, run = 0, 0
            continue
        accepted += 1
        run += 1
        if run == STEP_TRIAL_AFTER:
            step, run = 2.0 * step, 0
        if accepted % MU_EVERY == 0:
            if mu <= mu_end and best - checked < DUAL_STALL * (primal - best):
                break                         # the dual has stalled at its sharpest: the next W-step goes on
            checked = best
            if mu > mu_end:
                mu = max(0.5 * mu, mu_end)    # a sharper dual: the momentum starts again
                restart = 1.0
        momentum, theta = next_momentum(momentum, restart)
        VT_ext = VT_trial + theta * (VT_trial - VT_beta)
        lin_ext = lin_trial + theta * (lin_trial - lin_beta)
        VT_beta, lin_beta, accept = VT_trial, lin_trial, 1
        # the primal recovery's average (the trial's W_mu is beta's while mu stayed)
        WT_sum = WT_sum + accepted * (WT_trial if mu == mu_trial else smoothed(VT_beta, mu, lam)[2])
        weight += accepted
        _, f_ext, WT_ext = smoothed(VT_ext, mu, lam)
    # the covariance the dual points to is as sharp as the dual is accurate: a mu far below the gap left puts
    # Sigma_mu on V's top singular vector alone while the top values are not yet tied (rank one: a poor W-step)
    mu_recover = max(mu, MU_RECOVER * (primal - best) * 2.0 * lam / np.log(r))
    _, _, WT_last = smoothed(VT_beta, mu_recover, lam)
    wts = [WT_last] + ([WT_sum / weight] if weight > 0 else [])
    return {"dual": float(best), "wts": wts, "iterations": k, "step": step / mu}
