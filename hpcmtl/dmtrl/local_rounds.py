"""Local rounds: under a diagonal Sigma nothing couples the tasks, so each block (= a task) takes whole rounds
alone on its worker; both halves.

The worker half (:class:`LocalRoundBlocks`: a one-task :class:`.steps.TaskSteps` a block, the round's local
steps, a block's own stopping rule) and the server half (:class:`LocalRoundServer`: when local rounds are
possible, handing B to the workers and taking it back, one round).  The server's ``local_phase`` is created
and written here only.
"""
from __future__ import annotations

import numpy as np

from .. import _blockops
from ..engine import check_finite_rows
from .commands import DMTRLCommand
from .steps import TaskSteps


class LocalRoundBlocks:
    """The worker half of local rounds (a :class:`hpcmtl.dmtrl.worker.LocalBlocks` mixin)."""

    def init_local_rounds(self):
        self.task_steps = []                            # local rounds: each block's TaskSteps

    def take_local_round_steps(self, parts, out, safe):
        """Each block's steps from its local step ``parts[k]``, then b, w and alpha; ``out[k, 2:]``."""
        cfg = self.config
        for k, t in enumerate(self.task_steps):
            if parts[k] is None:
                continue
            vecs, scalars = parts[k]
            row = np.concatenate([*vecs, scalars])
            if not np.all(np.isfinite(row)):
                out[k] = np.nan
                self.pending[k] = None
                continue
            if safe:
                t.BT += row[None, :]
                eta, beta = np.array([cfg.eta]), np.zeros(1)
            else:
                eta, beta = t.solve_steps(row[None, :t.d], row[None, :])
                t.step, t.beta = eta, beta
            t.WT = (t.Sigma @ t.BT) / cfg.lam
            self.w[k] = t.WT[0]
            if not safe:
                t.adapt_rho(np.clip(eta, 0.0, cfg.eta))
                self.apply_step(k, float(eta[0]), float(beta[0]), float(t.rho_task[0]))
            out[k, 2:] = (_blockops.ordered_dot(t.BT[0], t.WT[0]), float(eta[0]), float(beta[0]))

    def local_vectors(self):
        return 2 if self.momentum == "free" else 1

    def reset_local(self, ctrl, inputs):
        """RESET_LOCAL: every block's b and dP zero, steps zero, rho 1 (the server's state at the start)."""
        self.start_local([([np.zeros(b.n_features)] * self.local_vectors(), (0.0, 0.0, 1.0)) for b in self.blocks])

    def set_local(self, ctrl, rows):
        """SET_LOCAL: per block ``[b, dP (free momentum only), step, beta, rho]``."""
        self.start_local(self.from_rows(rows, self.local_vectors()))

    def set_local_on_support(self, ctrl, flat):
        """SET_LOCAL_ON_SUPPORT: SET_LOCAL's rows, b (and dP) on the supports."""
        self.start_local(self.from_support(flat, ctrl.vectors, ctrl.scalars))

    def start_local(self, parts):
        """Each block's one-task :class:`TaskSteps` from its ``([b, (dP)], [step, beta, rho])``; w from b."""
        self.w_dense = None
        self.task_steps = [TaskSteps(self.config, self.sigma_ii[k], blk.n_task, vecs[0],
                                vecs[1] if len(vecs) > 1 else np.zeros(len(vecs[0])), *sc[:3])
                      for k, (blk, (vecs, sc)) in enumerate(zip(self.blocks, parts))]
        self.w = [t.WT[0] for t in self.task_steps]
        for k, t in enumerate(self.task_steps):
            self.rho_block[k] = float(t.rho_task[0])

    def local_parts(self):
        free = self.momentum == "free"
        return [([t.BT[0]] + ([t.dPT[0]] if free else []), np.concatenate([t.step, t.beta, t.rho_task]))
                for t in self.task_steps]

    def get_local(self, ctrl, inputs):
        """GET_LOCAL: per block ``[b, (dP), step, beta, rho]``."""
        return self.dense_rows(self.local_parts(), self.local_vectors(), ctrl.width)

    def get_local_on_support(self, ctrl, inputs):
        """GET_LOCAL_ON_SUPPORT: GET_LOCAL's rows, b (and dP) on the supports."""
        return self.support_values(self.local_parts())

    def local_round(self, ctrl, inputs):
        """LOCAL_ROUND: the server's round (:meth:`Server.round_steps` or ``round_safe``) on each block alone.

        The local step as TRIAL (SDCA for 'safe') computes it, the block's steps from
        the same :class:`StepSolver` arithmetic over one task, ``b`` and ``w = sigma_ii b
        / lam`` updated here, alpha as APPLY updates it.  Per block ``[loss sum,
        conjugate sum, b . w, eta, beta]`` (the objective terms only with_objective); a
        block whose step is not finite reports NaN and keeps its state (the server names it).

        Aggregations other than 'safe' take up to ``config.local_steps`` such steps a block
        in one round and stop a block once its own gap is within tol (:meth:`local_done`):
        nothing couples the tasks, so a round's exchange (the gap) is all they would
        wait for.  A block's steps depend on its own state only (seeds
        :func:`block_seed` with ``inner``), so the same at every rank count.
        """
        out = np.zeros((len(self.blocks), 5))
        if self.config.aggregation == "safe":     # the paper's rule: one local SDCA a round
            self.take_local_round_steps([([s], np.zeros(0)) for s in self.sdca_steps(ctrl.round)], out, True)
            if ctrl.with_objective:
                out[:, :2] = self.objective_terms()
            return out
        done = np.zeros(len(self.blocks), dtype=bool)
        for inner in range(self.config.local_steps):
            self.take_local_round_steps(self.trial_parts(ctrl.round, inner, done), out, False)
            out[~done, :2] = self.objective_terms(~done)
            done |= self.local_done(out)
            if done.all():
                break
        return out

    def local_done(self, out):
        """Blocks (= tasks) of a local round whose own step went wrong (NaN) or whose own duality gap is within
        tol of their primal: ``gap_k = (loss_k + conj_k) / n_k + b_k . w_k <= tol P_k``,
        ``P_k = loss_k / n_k + b_k . w_k / 2 >= 0``, so the tasks' sum is within tol too."""
        n = np.array([float(b.n_task) for b in self.blocks])
        primal = out[:, 0] / n + 0.5 * out[:, 2]
        gap = (out[:, 0] + out[:, 1]) / n + out[:, 2]
        with np.errstate(invalid="ignore"):
            return ~np.isfinite(out).all(axis=1) | (gap <= self.config.tol * primal)


class LocalRoundServer:
    """The server half of local rounds (a :class:`hpcmtl.dmtrl.server.Server` mixin)."""

    def init_local_rounds(self):
        self.local_phase = False      # workers hold B (their b rows) during a W-step of local rounds

    def leave_local(self):
        """The W-step's local rounds ended: B, dP, steps and rho back on the server."""
        self.pull_local()
        self.local_phase = False

    def local_rounds_possible(self) -> bool:
        """A diagonal Sigma (STL, a diagonal fixed Sigma, the first W-step of a learned one), every task in
        one block, and per-task steps (not 'line''s one common step) with bounded momentum: each worker can take
        whole rounds alone."""
        # not with the squared loss's free momentum: alone, a task's 2 x 2 pseudo-inverse keeps near-parallel
        # directions the joint one drops (its cut-off is relative to every task's eigenvalues), and the huge,
        # cancelling (eta, beta) it then returns drive b and alpha apart (a negative gap on tasks of 1-3 rows)
        return (self.config.exchange == "auto" and self.config.aggregation != "line" and self.momentum != "free"
                and bool(np.all(self.blocks_per_task == 1))
                and not self.coupled())

    def enter_local(self):
        """Hand every block its task's b, dP, step, beta and rho (nothing to send when all are at their start)."""
        if np.any(self.BT) or np.any(self.dPT) or np.any(self.step) or np.any(self.beta) or np.any(self.rho_task != 1):
            scalars = np.column_stack([self.step, self.beta, self.rho_task])
            if self.momentum == "free":     # never (local_rounds_possible): [b, dP, scalars] as dense rows
                dense = self.space.dense
                payload = np.column_stack([dense(self.BT), dense(self.dPT), scalars])[self.block_task]
                self.command(DMTRLCommand.SET_LOCAL, payload=payload, width=payload.shape[1])
            else:
                self.scatter_down(DMTRLCommand.SET_LOCAL, lambda: self.BT, scalars)
        else:
            self.command(DMTRLCommand.RESET_LOCAL, width=self.d)
        self.local_phase = True
        self.previous_steps_replaced()          # the local rounds' steps become the previous steps, B theirs

    def pull_local(self):
        """B, dP, steps and rho back from the workers (one block a task); W recomputed."""
        vecs, block_scalars = self.gather_up(DMTRLCommand.GET_LOCAL, 2 if self.momentum == "free" else 1, 3)
        own = (lambda X: X) if self.space.sparse else np.ascontiguousarray      # one block a task: the sums
        self.BT = own(vecs[0])
        if len(vecs) > 1:
            self.dPT = own(vecs[1])
        scalars = self.per_task(block_scalars)
        self.step, self.beta, self.rho_task = scalars[:, 0].copy(), scalars[:, 1].copy(), scalars[:, 2].copy()
        self.recompute_w()

    def round_local(self, want_gap):
        """One round on the workers alone -> per task [loss sum, conjugate sum, b.w, eta, beta] (5 numbers)."""
        rows = self.per_task(self.command(DMTRLCommand.LOCAL_ROUND, round=self.round, with_objective=want_gap,
                                          width=5))
        check_finite_rows(rows, self.round, self.names, "local step delta b", self.outer)
        if not self.safe:
            self.step, self.beta = rows[:, 3].copy(), rows[:, 4].copy()
        return rows
