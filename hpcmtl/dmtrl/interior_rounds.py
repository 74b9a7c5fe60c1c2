"""Interior-point rounds of hinge (smoothed-hinge) W-steps, both halves; the math is :mod:`hpcmtl.interior`.

The worker half (:class:`InteriorBlocks`: every block's iterate x = y o alpha in (0, 1), its Newton system
and steps) and the server half (:class:`InteriorServer`: when the rounds are due, the rounds themselves).
The server's ``interior_tried`` is created and written here only.
"""
from __future__ import annotations

import numpy as np

from .. import _sdca, interior
from ..engine import check_finite_rows, nan_fault
from .commands import DMTRLCommand
from .config import uses_interior_point
from .outer import primal_dual_of

INTERIOR_AFTER_STALL = 10             # recorded rounds without halving before a W-step turns to interior-point rounds
INTERIOR_AFTER_LOCAL_STALL = 5        # ... local rounds (up to --local-steps local steps a task each): 5 such rounds of
                                 # 100 steps without halving the gap are a stall


class InteriorBlocks:
    """The worker half of interior-point rounds (a :class:`hpcmtl.dmtrl.worker.LocalBlocks` mixin)."""

    def init_interior_rounds(self):
        self.iterates = []                              # interior-point W-steps: every block's BlockIterate

    def interior_start(self, ctrl, inputs):
        """INTERIOR_START: every block's iterate from its alpha -> per block ``[Z^T x / n, z.x + s.(1 - x)]``."""
        gamma = self.config.gamma if self.loss.name == "smoothed-hinge" else 0.0
        self.iterates, parts = [], []
        for k, blk in enumerate(self.blocks):
            it = interior.BlockIterate(blk, blk.y * self.state[k].alpha, gamma)
            self.iterates.append(it)
            parts.append(([it.b()], [it.complementarity()]))
        return self.dense_rows(parts, 1, ctrl.width)

    def interior_system(self, ctrl, rows):
        """INTERIOR_SYSTEM: the pending steps taken; per block ``[G's upper triangle, v, loss sum, conjugate sum]`` at x."""
        d = ctrl.d
        t = d * (d + 1) // 2                       # G's upper triangle
        out = np.zeros((len(self.blocks), t + d + 2))
        for k, (vecs, sc) in enumerate(self.from_rows(rows, 1)):
            blk, it, w = self.blocks[k], self.iterates[k], vecs[0]
            with self.working_on(blk, ctrl.round):
                it.move(float(sc[0]), float(sc[1]))
                terms = _sdca.objective_terms(blk.rows, blk.y, blk.y * it.x, w, self.loss.kernel_id,
                                                 self.config.gamma, blk.z_shift(w))
                G, v = it.system(w, float(sc[2]), float(sc[3]))
                if nan_fault(ctrl.round, blk.task) and v.size:
                    v[0] = np.nan
            f = self.columns[k]
            if f is not None:                      # the block's own columns -> their places among all d
                Gd, vd = np.zeros((d, d)), np.zeros(d)
                Gd[np.ix_(f, f)], vd[f] = G, v
                G, v = Gd, vd
            out[k, :t], out[k, t:t + d], out[k, t + d:] = interior.packed(G), v, terms
        return out

    def interior_step(self, ctrl, rows):
        """INTERIOR_STEP: ``alpha = y o x`` when accepted; the Newton steps -> per block ``[Z^T dx / n, largest primal
        step, largest dual step, 4 complementarity coefficients]``."""
        parts = self.from_rows(rows, 1)
        if parts and parts[0][1][0] > 0:              # (the same flag for every block)
            self.accept_iterates()
        return self.step_rows([it.step(vecs[0]) for it, (vecs, sc) in zip(self.iterates, parts)], ctrl.d)

    def interior_residual(self, ctrl, rows):
        """INTERIOR_RESIDUAL: every block's Newton residual at its pending dx -> per block its ``v``."""
        return self.dense_rows([([self.iterates[k].residual(vecs[0])], ())
                                for k, (vecs, sc) in enumerate(self.from_rows(rows, 1))], 1, ctrl.d)

    def interior_correct(self, ctrl, rows):
        """INTERIOR_CORRECT: every block's dx corrected -> what :meth:`interior_step` sends."""
        return self.step_rows([it.correct(vecs[0]) for it, (vecs, sc) in zip(self.iterates, self.from_rows(rows, 1))],
                              ctrl.d)

    def step_rows(self, steps, d):
        """Every block's ``(Z^T dx / n, largest primal step, largest dual step, 4 coefficients)`` -> its row."""
        return self.dense_rows([([db], [primal, dual, *coefficients]) for db, primal, dual, coefficients in steps],
                               1, d + 6)

    def accept_iterates(self):
        """``alpha = y o x`` on every block: the server accepted the iterates."""
        for st, blk, it in zip(self.state, self.blocks, self.iterates):
            st.alpha = blk.y * it.x

    def interior_end(self, ctrl, shared):
        """INTERIOR_END: ``alpha = y o x`` when accepted; the iterates dropped, shrinking reset."""
        if shared[0] > 0:
            self.accept_iterates()
        self.pending = [None] * len(self.blocks)
        self.iterates = []
        self.reset_shrinking()


class InteriorServer:
    """The server half of interior-point rounds (a :class:`hpcmtl.dmtrl.server.Server` mixin)."""

    def init_interior_rounds(self):
        self.interior_tried = False        # the current W-step ran interior-point rounds (checkpointed)

    def forget_interior_rounds(self):
        """A new W-step: it has not run interior-point rounds yet."""
        self.interior_tried = False

    def interior_counters(self):
        return {"ipm_tried": bool(self.interior_tried)}

    def restore_interior_counters(self, counters):
        self.interior_tried = bool(counters.get("ipm_tried", False))

    def interior_point_possible(self) -> bool:
        """Every task one block on dense task arrays, :func:`uses_interior_point`, and every block's rows
        dense within ``interior.MAX_ROW_VALUES``."""
        return (uses_interior_point(self.config, self.d, self.m, self.coupled()) and self.one_block_a_task
                and not self.space.sparse and float(np.max(self.n)) * self.d <= interior.MAX_ROW_VALUES)

    def interior_point_due(self) -> bool:
        """Interior-point rounds now: at the start of a W-step under a coupled Sigma with at most
        ``interior.START_FEATURES`` features (not after a resume inside one), or, once a W-step, when its gap
        has not halved for INTERIOR_AFTER_STALL recorded rounds (INTERIOR_AFTER_LOCAL_STALL local rounds: under a
        diagonal Sigma too, whose local rounds stall on raw features far above 1, where local SDCA and the
        exact local steps make no progress).  Read from the history and the checkpointed ``interior_tried``, so a
        resumed run decides alike."""
        if not self.interior_point_possible():
            return False
        if self.wstep_round == 0:
            return self.coupled() and self.d <= interior.START_FEATURES
        stall = INTERIOR_AFTER_LOCAL_STALL if self.local_rounds_possible() else INTERIOR_AFTER_STALL
        return not self.interior_tried and self.since_halved() >= stall

    def interior_rounds(self):
        """Interior-point rounds (:mod:`hpcmtl.interior`) until alpha is certified, they stall, or a cap.

        The iterate x lives on the workers beside alpha; alpha (the engine's dual iterate) becomes x whenever x's
        dual is at least alpha's, so the dual never decreases.  Every round P and D are computed exactly at x;
        the certificate is the smallest P seen (alpha's w or an iterate's) against alpha's D (weak duality holds
        for any w), and a certified W-step ends with that w as W (B stays alpha's: the next W-step starts from
        alpha).  The warm start's D is often above x's until the last rounds, where x's own gap is smallest.
        x, z and s are not saved: a checkpoint due inside these rounds, or a signal, writes the state they began
        from (a job stopped in them resumes there and repeats them bit for bit).  Returns ``(last history row or
        None, certified)``; uncertified, the W-step goes on with the 'qp' rounds from alpha."""
        cfg, d, m = self.config, self.d, self.m
        began = (self.checkpoint_state(), self.round) if self.checkpointer is not None else None
        self.interior_tried = True                # once a W-step (after the state they began from: a resume repeats them)
        primal_best, dual_a = self.objective(self.scatter_down(DMTRLCommand.SET_W, lambda: self.WT, None,
                                                            with_objective=True))
        best_WT = self.WT
        start = self.command(DMTRLCommand.INTERIOR_START, width=d + 1)
        self.check_vectors(start, "interior-point start b")
        BxT = self.per_task(start[:, :d])
        n_total = float(np.sum(self.n))
        mu = interior.barrier_parameter(np.sum(self.per_task(start[:, d])), n_total)   # task order: same bits at any P
        Sigma = self.dense_sigma()       # the m x m matrix (formed from factors: d m <= interior.MAX_WIDTH here)
        root = interior.sigma_root(Sigma, cfg.lam)
        k_norm = float(np.max(np.linalg.eigvalsh(Sigma))) / cfg.lam
        a_primal = a_dual = 0.0
        row, certified, accepted = None, False, False
        halved, smallest, since = np.inf, np.inf, 0      # x's gap at its last halving, its smallest; rounds since
        for _ in range(interior.MAX_ROUNDS):
            if self.wstep_round >= self.round_budget():
                break
            self.wstep_round += 1
            self.round += 1
            WxT = self.space.mix(Sigma, BxT, cfg.lam)
            steps = np.tile([a_primal, a_dual, mu, k_norm], (len(self.blocks), 1))
            rows = self.command(DMTRLCommand.INTERIOR_SYSTEM, payload=np.column_stack([WxT[self.block_task], steps]),
                                round=self.round, width=d + 4, d=d)
            sums = self.per_task(rows)
            check_finite_rows(sums, self.round, self.names, "interior-point system", self.outer)
            primal_x, dual_x = primal_dual_of(sums[:, -2], sums[:, -1], self.n, float(np.sum(BxT * WxT)))
            accepted = dual_x >= dual_a
            if accepted:
                self.BT, self.WT = BxT.copy(), WxT
                dual_a = dual_x
            if primal_x <= primal_best:                # the best w seen (weak duality: any w against alpha's D)
                primal_best, best_WT = primal_x, WxT
            certified = primal_best - dual_a <= cfg.tol * max(abs(primal_best), 1e-300)
            if certified or self.wstep_round % cfg.gap_every == 0 or self.wstep_round >= cfg.max_rounds:
                row = self.record(primal_best, dual_a)
            if certified:
                break
            self.safe_point(began)
            gap_x = primal_x - dual_x
            halved, since = (gap_x, 0) if gap_x < 0.5 * halved else (halved, since + 1)
            smallest = min(smallest, gap_x)
            if since >= interior.STALL_ROUNDS or gap_x > interior.DIVERGED * smallest:
                break
            t = d * (d + 1) // 2
            newton = interior.NewtonSystem(root, interior.unpacked(sums[:, :t], d))
            Y = newton.solve(sums[:, t:t + d])
            check_finite_rows(Y, self.round, self.names, "interior-point step", self.outer)
            rows = self.command(DMTRLCommand.INTERIOR_STEP, width=d + 1, d=d,
                                payload=np.column_stack([Y[self.block_task], np.full(len(self.blocks), float(accepted))]))
            check_finite_rows(rows, self.round, self.names, "interior-point step", self.outer)
            accepted = False                                        # delivered
            for _ in range(interior.REFINEMENTS):                   # the step through the full system's residual
                WdT = self.space.mix(Sigma, self.per_task(rows[:, :d]), cfg.lam)
                V = self.per_task(self.command(DMTRLCommand.INTERIOR_RESIDUAL, payload=WdT[self.block_task], width=d, d=d))
                Y = newton.solve(V)
                check_finite_rows(Y, self.round, self.names, "interior-point refinement", self.outer)
                rows = self.command(DMTRLCommand.INTERIOR_CORRECT, payload=Y[self.block_task], width=d, d=d)
                check_finite_rows(rows, self.round, self.names, "interior-point refinement", self.outer)
            a_primal, a_dual = interior.step_lengths(rows[:, d], rows[:, d + 1])
            BxT = BxT + a_primal * self.per_task(rows[:, :d])
            c = self.per_task(rows[:, d + 2:d + 6])
            mu = interior.barrier_parameter(np.sum(c[:, 0] + a_primal * c[:, 1] + a_dual * c[:, 2]
                                                   + a_primal * a_dual * c[:, 3]), n_total)
        self.command(DMTRLCommand.INTERIOR_END, payload=np.array([float(accepted)]), width=1)
        self.recompute_w()
        if certified or self.wstep_round >= self.round_budget():
            self.WT = best_WT               # the w of the last row's P (alpha's own, or an iterate's with a smaller P)
        self.mirrors_stale()                # the workers' mirror of B (box momentum on supports) is stale
        self.push_w(False)
        return row, certified
