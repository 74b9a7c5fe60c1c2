"""The outer loop (Algorithm 1) and the per-round certificate: W-steps alternating with Omega-steps.

:class:`OuterState` (where the loop is), :func:`outer_loop`, :func:`unconverged_message`,
:class:`GapHistory` (the recorded rows and the certificate's checks), :func:`primal_dual` /
:func:`primal_dual_of`, and how long a W-step's gap has gone without halving (:func:`next_halving`,
:func:`rounds_since_halved`, :func:`stalled_since`).  Shared with the centralized baselines.
"""
from __future__ import annotations

import warnings

import numpy as np

from ..errors import ConvergenceError
from .config import DMTRLConvergenceWarning


# learned Sigma: a joint gap that shrank by less than STALL_SHRINK (a fraction of itself) over the last STALL_STEPS
# W-steps, the last with no W found after it (prox step or accelerated phase: hpcmtl.dmtrl.joint) lower than the
# W-step's by STALL_SHRINK of the joint gap, ends the outer loop as stalled (with --outer-tol 0 the loop runs
# --outer W-steps)
STALL_SHRINK = 0.03
STALL_STEPS = 3


class OuterState:
    """Where the outer loop is: the current outer step, the previous W-step's objective, each W-step's status,
    the center of the next prox steps and the Omega-step's floor (learned Sigma, :mod:`.joint`)."""

    KEYS = ("outer", "round", "rel_gap", "converged")
    JOINT_KEYS = ("joint_primal", "joint_dual", "joint_rel_gap", "dual_scale", "prox_step", "prox_primal",
                  "apg_iterations", "extrapolation", "wstep_dual")
    # absent from the W-steps of a checkpoint written before the accelerated phase / the extrapolations (0 there:
    # none ran) / the W-step's own bound (NaN there: never computed; closing_budget skips a bound that is not finite)
    LATER_KEYS = ("apg_iterations", "extrapolation", "wstep_dual")

    def __init__(self, outer=0, previous=None, wsteps=None, prox_center=None, floor=None, apg_step=None):
        self.outer = outer                   # the current outer step (0-based: W-step outer + 1 is running)
        self.previous = previous
        self.wsteps = list(wsteps or [])     # dicts: KEYS, and JOINT_KEYS under a learned Sigma
        self.prox_center = prox_center
        self.floor = floor                   # the Omega-step's eigenvalue floor (None: --eig-floor)
        self.apg_step = apg_step             # the accelerated phase's last step size (None: none ran yet)
        # the hinge's dual phase: the W^T a move to a recovered W replaced, and its P (None: no such move pending)
        self.revert_wt, self.revert_primal = None, None
        # the last W-step's W^T: the outer step's extrapolations go along the move from it (None: first W-step)
        self.prev_wt = None

    def wstep_arrays(self):
        out = {k: np.asarray([w[k] for w in self.wsteps], dtype=np.float64 if k == "rel_gap" else np.int64)
               for k in self.KEYS}
        if self.wsteps and all(k in w for w in self.wsteps for k in self.JOINT_KEYS if k not in self.LATER_KEYS):
            out.update({k: np.asarray([w.get(k, np.nan if k == "wstep_dual" else 0) for w in self.wsteps],
                                     dtype=np.float64) for k in self.JOINT_KEYS})
        return out


def unconverged_message(step, config, stalled_since=None):
    """The warning of a W-step that ended above tol; ``stalled_since``: the round its gap last halved, when it
    has not since for most of the W-step (more rounds would not help)."""
    head = (f"W-step {step['outer'] + 1} ended unconverged at round {step['round']}: relative gap "
            f"{step['rel_gap']:.3e} > tol {config.tol:g}")
    if stalled_since is None:
        return head + " (raise --max-rounds; the model of this step is not certified)"
    return (head + f" (the model of this step is not certified); the gap has not halved since round "
            f"{stalled_since}, so more rounds will not help: features on very different scales (raw values "
            f"far above 1 beside the intercept feature, a small --lam) are the usual cause; standardize them "
            f"(hpcmtl data standardize) or raise --lam")


def outer_not_certified_message(step, config, stalled=False):
    """The warning of an outer loop that ended with the joint gap above --outer-tol."""
    why = ("the joint gap stopped shrinking" if stalled else
           f"--outer {config.outer} W-steps were taken")
    return (f"the outer loop ended after W-step {step['outer'] + 1} ({why}) with the joint relative gap "
            f"{step['joint_rel_gap']:.3e} > --outer-tol {config.outer_tol:g}: W is not certified as the optimum "
            f"of the learned-Sigma problem (P(W) {step['joint_primal']:.10g}, lower bound {step['joint_dual']:.10g}); "
            + outer_advice(step["joint_rel_gap"], stalled))


def outer_advice(joint_rel_gap, stalled):
    """What to do about an outer loop that ended above --outer-tol: more W-steps, unless the joint gap had
    stopped shrinking (then they would not help, and the gap says how far from the optimum W can be)."""
    if not stalled:
        return "raise --outer"
    return (f"more W-steps would not help: P(W) is within {joint_rel_gap:.1e} (relative) of the optimum, and "
            f"--outer-tol {joint_rel_gap:.1e} or more accepts that")


def outer_loop(config, w_step, omega_update, state: OuterState | None = None, warn=None, certify=None):
    """The outer loop of Algorithm 1, shared by DMTRL and the centralized baselines.

    ``w_step(p)`` returns ``(last history row, converged)``; ``omega_update()`` replaces Sigma;
    ``certify()`` (learned Sigma) returns the joint certificate of the W-step just ended and prepares the
    next Omega-step (:mod:`.joint`: the fields of ``OuterState.JOINT_KEYS``).  Stops after a W-step when
    relationships are not learned (the W-step's gap is then the certificate); when learned, once the joint
    relative gap is at most ``outer_tol`` (the optimum of the learned-Sigma problem certified), after
    ``config.outer`` W-steps, or when the joint gap stalls (shrank by less than STALL_SHRINK of itself over
    STALL_STEPS W-steps, no prox step taken: more W-steps would not help).  The joint dual kept is the best
    of every W-step's (each bounds P*).
    Always ends on a W-step, so the returned W is certified for the returned Sigma.  ``state`` lets a
    resumed run continue where a checkpoint left the loop.  Every W-step's status is kept in
    ``state.wsteps``; ``warn(message)`` hears of each one that ended unconverged and of an outer loop that
    ended above ``outer_tol``.  Returns True when every W-step converged and, when learned, the joint gap
    is within ``outer_tol``.
    """
    state = state or OuterState()
    warn = warn if warn is not None else (lambda msg: warnings.warn(msg, DMTRLConvergenceWarning, stacklevel=3))
    learned = config.relationship == "learned" and certify is not None
    certified = not learned
    while state.outer < config.outer:
        row, converged = w_step(state.outer)
        objective = row["primal"]
        step = {"outer": int(state.outer), "round": int(row["round"]), "rel_gap": float(row["rel_gap"]),
                "converged": int(bool(converged))}
        state.wsteps.append(step)
        if not converged:
            warn(unconverged_message(step, config, row.get("stalled_since")))
        if not np.isfinite(objective):
            raise ConvergenceError(f"non-finite objective {objective} after W-step {state.outer + 1}")
        if not learned:
            if (config.relationship != "learned" or state.outer + 1 == config.outer or
                    (state.previous is not None and
                     abs(objective - state.previous) <= config.outer_tol * abs(objective))):
                break
            state.previous = objective
            state.outer += 1
            omega_update()
            continue
        step.update(certify())
        for key in ("joint_primal", "joint_dual"):
            if not np.isfinite(step[key]):
                raise ConvergenceError(f"non-finite {key} {step[key]} after W-step {state.outer + 1}")
        if step["joint_rel_gap"] <= config.outer_tol:
            certified = True
            break
        gaps = [w["joint_rel_gap"] for w in state.wsteps if "joint_rel_gap" in w]
        # a prox step or the accelerated phase that lowered P by a part of the gap worth another W-step
        gap = step["joint_primal"] - step["joint_dual"]
        moved = (step.get("dual_move", 0) > 0 or      # a move to a W the hinge's dual phase recovered (.joint)
                 step.get("dual_skipped", 0) > 0 or   # the hinge's phase skipped: the last W-step lowered P by
                 # more than --outer-tol, and the bound it did not try to raise cannot have stalled (.joint)
                 step["prox_primal"] < step["joint_primal"] - STALL_SHRINK * gap)
        stalled = (config.outer_tol > 0 and not moved and len(gaps) > STALL_STEPS and
                   gaps[-1] > (1.0 - STALL_SHRINK) * gaps[-1 - STALL_STEPS])
        if stalled or state.outer + 1 == config.outer:
            warn(outer_not_certified_message(step, config, stalled))
            break
        state.previous = step["joint_primal"]
        state.outer += 1
        omega_update()
    return all(w["converged"] for w in state.wsteps) and certified


def primal_dual(loss_sums, conj_sums, n, BT, WT, lam):
    """``(P, D)`` from per-task sums of l(w.x) and l*(-alpha), with W = B Sigma / lam.

    ``(lam/2) tr(W Omega W^T) = tr(B Sigma B^T) / (2 lam) = sum(B * W) / 2``.
    """
    return primal_dual_of(loss_sums, conj_sums, n, float(np.sum(BT * WT)))


def primal_dual_of(loss_sums, conj_sums, n, regularizer):
    """``(P, D)`` from per-task sums and ``tr(B Sigma B^T) / lam = sum_i b_i . w_i`` (local rounds send b_i . w_i)."""
    half = 0.5 * regularizer
    primal = float(np.sum(np.asarray(loss_sums) / n)) + half
    dual = -half - float(np.sum(np.asarray(conj_sums) / n))
    return primal, dual


class GapHistory:
    """Per-evaluation rows (round, outer, primal, dual, gap, rel_gap, seconds, bytes, step, rho).

    ``step``: the mean step over tasks applied in that round and ``rho``: the
    largest rho of the local subproblems (NaN where not applicable).
    """

    COLUMNS = ("round", "outer", "primal", "dual", "gap", "rel_gap", "seconds", "bytes", "step", "rho")

    def __init__(self):
        self.rows = {k: [] for k in self.COLUMNS}
        self.halving_seen = (None, 0, (np.inf, 0))    # (outer, rows read, halving state): since_halved's cache
        self.first_seen = (None, 0)                   # (outer, its first row): first_row's cache

    def first_row(self, outer):
        """The index of W-step ``outer``'s first recorded row (the row count when it has none yet), found once a
        W-step (a W-step's rows are the last ones while it runs)."""
        cached, first = self.first_seen
        outers = self.rows["outer"]
        if cached != outer or first > len(outers) or (first < len(outers) and outers[first] != outer):
            first = len(outers)
            while first > 0 and outers[first - 1] == outer:
                first -= 1
            self.first_seen = (outer, first)
        return first

    def since_halved(self, outer, rel_gap=None):
        """:func:`rounds_since_halved` of W-step ``outer``'s recorded rows (and ``rel_gap`` after them), read
        incrementally (a long W-step does not rescan the history every round)."""
        rows = self.rows
        n = len(rows["round"])
        cached, seen, state = self.halving_seen
        if cached != outer or seen > n:
            seen = n
            while seen > 0 and rows["outer"][seen - 1] == outer:
                seen -= 1
            state = (np.inf, 0)
        for g in rows["rel_gap"][seen:n]:
            state = next_halving(state, g)
        self.halving_seen = (outer, n, state)
        return (state if rel_gap is None else next_halving(state, rel_gap))[1]

    def record(self, round_, outer, primal, dual, seconds, bytes_moved, step=np.nan, rho=np.nan):
        for name, value in (("primal", primal), ("dual", dual)):
            if not np.isfinite(value):
                raise ConvergenceError(f"non-finite {name} objective {value} in round {round_} (outer step {outer})")
        gap = primal - dual
        if gap < -1e-9 * max(abs(primal), abs(dual), 1.0):
            raise ConvergenceError(f"negative duality gap {gap:.3e} (primal {primal:.12g}, dual {dual:.12g}) "
                                   f"at round {round_}: the dual iterate is inconsistent")
        row = {"round": round_, "outer": outer, "primal": primal, "dual": dual, "gap": gap,
               "rel_gap": gap / max(abs(primal), 1e-300), "seconds": seconds, "bytes": bytes_moved,
               "step": float(step), "rho": float(rho)}
        for k, v in row.items():
            self.rows[k].append(v)
        return row

    def arrays(self):
        return {k: np.asarray(v) for k, v in self.rows.items()}

    def checkpoint_arrays(self):
        return {f"history_{k}": np.asarray(v, dtype=np.int64 if k in ("round", "outer", "bytes") else np.float64)
                for k, v in self.rows.items()}

    def restore(self, arrays):
        n = len(arrays["history_round"])
        for k in self.COLUMNS:
            self.rows[k] = list(arrays.get(f"history_{k}", np.full(n, np.nan)))
        self.halving_seen = (None, 0, (np.inf, 0))
        self.first_seen = (None, 0)


def next_halving(state, rel_gap):
    """``(gap at the last halving, rows since)`` after one more recorded relative gap."""
    halved, since = state
    return (rel_gap, 0) if rel_gap < 0.5 * halved else (halved, since + 1)


def rounds_since_halved(rel_gaps) -> int:
    """Recorded rounds since a W-step's relative gap last fell below half its value at the previous halving."""
    state = (np.inf, 0)
    for g in rel_gaps:
        state = next_halving(state, g)
    return state[1]


STALLED_ROWS = 20                # an unconverged W-step is reported stalled after this many rows without halving


def stalled_since(rounds, rel_gaps):
    """The round a W-step's gap last halved when it has not since for STALLED_ROWS recorded rounds and the
    second half of the W-step at least, else None."""
    since = rounds_since_halved(rel_gaps)
    if since < max(STALLED_ROWS, len(rel_gaps) // 2):
        return None
    return int(rounds[len(rounds) - 1 - since])


# a W-step's round budget past --max-rounds (round_budget): the rate of its smallest gap over its last
# BUDGET_WINDOW_SHARE of --max-rounds recorded rounds (at least STALLED_ROWS rows) projects the round it reaches --tol
# at; the W-step goes on to that round while it is at most BUDGET_MOST times --max-rounds, and stops as soon as the
# projection passes that
BUDGET_WINDOW_SHARE = 0.25
BUDGET_MOST = 4


def round_budget(rounds, rel_gaps, done, tol, max_rounds):
    """The rounds a W-step may take: ``max_rounds``, or, once it has taken them (``done``), the round at which the
    rate of the smallest of its recorded relative gaps ``rel_gaps`` (at global ``rounds``, the W-step's own, oldest
    first) over its last ``BUDGET_WINDOW_SHARE * max_rounds`` rounds (at least STALLED_ROWS rows) projects ``tol``,
    when that is at most ``BUDGET_MOST * max_rounds``.

    A W-step's rounds grow with Sigma's conditioning (the late W-steps of a learned Sigma: a coupled dual whose
    per-task blocks the others nearly explain converges linearly at a rate that falls with the eigenvalue floor), so
    a fixed budget cuts W-steps that are converging steadily; the budget follows the gap's own progress instead, and
    a W-step whose rate would not reach ``tol`` within the cap (a stall, or a crawl) stops at ``max_rounds`` as
    before.  The projection is read from the recorded rows alone, so a resumed run decides alike at any rank count.
    """
    if done < max_rounds:
        return max_rounds
    rounds, rel_gaps = np.asarray(rounds, dtype=np.int64), np.asarray(rel_gaps, dtype=np.float64)
    # the window is the last BUDGET_WINDOW_SHARE of --max-rounds in rounds, not in rows: past --max-rounds every
    # round is recorded, so a window of rows (a quarter of --max-rounds / --gap-every) would shrink to that many
    # rounds there; at least STALLED_ROWS rows (the last row before the window is its start)
    width = int(BUDGET_WINDOW_SHARE * max_rounds)
    cut = min(int(np.searchsorted(rounds, rounds[-1] - width, side="right")) - 1 if rounds.size else -1,
              rel_gaps.size - 1 - STALLED_ROWS)
    if cut < 0:
        return max_rounds
    # the hinge's gap moves up and down by 2x within tens of rounds (the primal of each alpha): the rate is the
    # smallest gap's, now against the window's start
    now, then = float(np.min(rel_gaps)), float(np.min(rel_gaps[:cut + 1]))
    span = int(rounds[-1]) - int(rounds[cut])
    if not (tol > 0 and 0 < now < then and span > 0 and now > tol):
        return max_rounds
    per_round = np.log(now / then) / span               # < 0: the gap's log falls this much a round
    end = done + int(np.ceil(np.log(tol / now) / per_round))
    return end if end <= BUDGET_MOST * max_rounds else max_rounds

