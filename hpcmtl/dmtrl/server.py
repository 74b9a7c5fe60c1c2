"""The server core: B, Sigma and W on rank 0, one round, the W-step, the run loop and its checkpoint state.

:class:`Server` holds the task arrays and drives the rounds; each feature's server half is a mixin
(:mod:`.supports`, :mod:`.momentum`, :mod:`.local_rounds`, :mod:`.interior_rounds`, :mod:`.margin`).
"""
from __future__ import annotations

import numpy as np

from .. import engine
from ..checkpoint import BlockState, block_payloads
from ..covariance import SigmaFactors, as_dense, covariance_from_arrays, diagonal, is_factored
from ..engine import ServerBase, check_finite_rows
from ..errors import InputError
from ..losses import get_loss
from ..taskspace import DENSE
from .commands import DMTRLCommand
from .config import DMTRLConfig, uses_momentum
from .interior_rounds import InteriorServer
from .joint import JointServer
from .local_rounds import LocalRoundServer
from .margin import MarginServer
from .momentum import MomentumServer
from .outer import GapHistory, OuterState, outer_loop, primal_dual_of, round_budget, stalled_since
from . import sigma as sigma_rules
from .sigma import coupled_rho, omega_factors, omega_from_gram, safe_rho
from .spread import SpreadBlocks, SpreadServer
from .spread_precond import SpreadPrecondBlocks, SpreadPrecondServer
from .steps import StepInputs, StepSolver
from .supports import SupportServer


class LocalChunks(SpreadBlocks, SpreadPrecondBlocks):
    """The spread's worker halves that rank 0 runs itself when it computes every chunk (crowded ranks)."""


class Server(SupportServer, MomentumServer, LocalRoundServer, InteriorServer, MarginServer, JointServer,
             SpreadPrecondServer, SpreadServer, ServerBase):
    """Holds B, Sigma, W and drives the rounds; runs on rank 0 only."""

    local_chunks = LocalChunks

    def __init__(self, cluster, source, config: DMTRLConfig, sigma_fixed=None, progress=None,
                 checkpointer=None, test=False, warn=None):
        super().__init__(cluster, source, progress, checkpointer)
        self.config = config
        self.safe = config.aggregation == "safe"
        self.d = engine.model_width(config, source.n_features)      # + 1: the augmented intercept feature
        self.blocks_per_task = np.bincount(self.block_task, minlength=self.m)
        # B, W and dP are kept transposed (m x d, the T suffix): a task's row is what the per-block Gatherv /
        # Scatterv carry and self.WT[self.block_task] is the payload; W leaves as d x m (TrainResult.W).
        # With sparse task supports they move to the task supports at the first exchange (self.space,
        # hpcmtl.taskspace: then flat task arrays; dense_wt() is the whole W)
        self.space = DENSE
        self.BT = np.zeros((self.m, self.d))
        # self.Sigma: the m x m array, or, a learned Sigma of many tasks, its SigmaFactors (sigma.omega_factors)
        # and never the m x m array (10^4 tasks: 800 MB).  I / m is factored too (r = 0): the first W-step's
        # rounds then need no m x m matrix either
        if config.relationship == "fixed":       # a graph kernel of many tasks stays sparse, factors stay factors
            self.Sigma = sigma_fixed if is_factored(sigma_fixed) else np.array(sigma_fixed, dtype=np.float64)
        elif self.m >= sigma_rules.FACTORED_MIN_TASKS:
            self.Sigma = SigmaFactors(np.zeros((self.m, 0)), np.zeros(0), 1.0 / self.m)
        else:
            self.Sigma = np.eye(self.m) / self.m
        self.WT = np.zeros((self.m, self.d))
        self.rho = self.lemma_rho()
        self.rho_task = np.ones(self.m)          # optimistic per-task rho (aggregations other than safe)
        if config.aggregation == "qp":
            self.rho_task = coupled_rho(self.Sigma)
        self.step = np.zeros(self.m)             # the last round's per-task steps
        self.momentum = uses_momentum(config)
        # the per-task steps (aggregations other than safe); a signal ends their long solves early
        self.solver = StepSolver(config, self.momentum, self.signal_pending)
        self.beta = np.zeros(self.m)             # momentum: the last round's coefficients of the previous step
        self.dPT = np.zeros((self.m, self.d))    # momentum: the B change of the last round's step
        self.history = GapHistory()
        self.wstep_round = 0                    # rounds so far in the current W-step
        self.outer_state = OuterState()
        self.want_test = test
        self.test = None
        self.warn = warn
        self.init_support_exchange()
        self.init_momentum_mirrors()
        self.init_local_rounds()
        self.init_interior_rounds()
        self.init_margin_corrections()
        self.init_joint()
        self.init_spread()

    @property
    def outer(self):
        return self.outer_state.outer

    @property
    def sigma_factors(self):
        """Sigma's :class:`SigmaFactors` when it is held as factors (many tasks), or its :class:`GraphSigma` (a graph
        kernel of many tasks: the same interface), else None (an m x m array)."""
        return self.Sigma if is_factored(self.Sigma) else None

    def dense_sigma(self):
        """The m x m Sigma, formed from the factors where it is held as factors: only for what needs the matrix
        and runs at small m alone (the interior-point rounds: d m <= interior.MAX_WIDTH)."""
        return as_dense(self.Sigma)

    def lemma_rho(self):
        """Lemma 6.7's rho, which only the 'safe' aggregation reads (its local SDCA): with Sigma as factors the
        others get an upper bound in O(m r) instead of the exact m^2 r row sums (sigma.safe_rho)."""
        return safe_rho(self.Sigma, self.blocks_per_task, self.config.eta, exact=self.safe)

    def push_sigma(self):
        shared = np.concatenate([diagonal(self.Sigma), [self.rho]])
        self.command(DMTRLCommand.SET_SIGMA, payload=shared, m=self.m, width=self.m + 1)

    def push_w(self, with_objective: bool, eta=None, beta=None):
        """Send every block its w column (and, unless safe, its steps eta and beta and next rho)."""
        if self.safe:
            return self.scatter_down(DMTRLCommand.SET_W, lambda: self.WT, None, with_objective=with_objective)
        eta = np.zeros(self.m) if eta is None else eta
        beta = np.zeros(self.m) if beta is None else beta
        return self.scatter_down(DMTRLCommand.APPLY, lambda: self.WT, np.column_stack([eta, beta, self.rho_task]),
                                 with_objective=with_objective)

    def dense_wt(self):
        """The whole ``W^T = Sigma B^T / lam`` (m x d): on task supports, W is only kept on each T_i."""
        if not self.space.sparse:
            return self.WT
        if self.sigma_factors is not None:
            return self.sigma_factors.matmul(self.space.dense(self.BT)) / self.config.lam
        return (self.Sigma @ self.space.dense(self.BT)) / self.config.lam

    def push_dense_w(self):
        """Every block's whole w column (after rounds on supports, w is only right on each block's support):
        before anything scores other rows (test metrics, validation folds) or leaves the training."""
        if self.layout is not None:
            self.command(DMTRLCommand.SET_W, payload=self.dense_wt()[self.block_task], with_objective=0,
                         width=self.d)

    def check_vectors(self, X, what):
        """:func:`check_finite_rows` on a task array (naming the round and the first task not finite)."""
        check_finite_rows(self.space.finite_rows(X), self.round, self.names, what, self.outer)

    def recompute_w(self):
        if self.sigma_factors is not None and self.spread_applies():   # by chunks: the spread rounds' bits
            self.WT = self.spread_sigma_times(self.BT) / self.config.lam
        elif self.sigma_factors is not None:      # W = B Sigma / lam through the factors: O(m d r), not m^2 d
            self.WT = self.step_inputs().sigma_times(self.BT) / self.config.lam
        else:
            self.WT = self.space.mix(self.Sigma, self.BT, self.config.lam)      # W = B Sigma / lam
        self.check_vectors(self.WT, "W column")

    def step_inputs(self):
        """This round's :class:`StepInputs` of the step solver (B is updated in place)."""
        return StepInputs(self.space, self.Sigma, self.n, self.WT, self.BT, self.dPT, self.step, self.beta,
                          self.sigma_factors)

    def objective(self, terms):
        """Primal and dual of the current alpha from per-block terms."""
        sums = self.per_task(terms)
        check_finite_rows(sums, self.round, self.names, "loss or conjugate sum", self.outer)
        return primal_dual_of(sums[:, 0], sums[:, 1], self.n, self.space.total(self.BT, self.WT))

    def record(self, primal, dual):
        step, rho = (self.config.eta, self.rho) if self.safe else (float(np.mean(self.step)), float(np.max(self.rho_task)))
        row = self.history.record(self.round, self.outer, primal, dual, self.elapsed(), self.cluster.bytes_moved,
                                  step, rho)
        if self.progress is not None:
            self.progress(row)
        return row

    def round_safe(self, want_gap):
        """The paper's round: local SDCA with Lemma 6.7's rho, every step applied with eta."""
        (dBT,), _ = self.gather_up(DMTRLCommand.SDCA, 1, 0, round=self.round)
        self.check_vectors(dBT, "local step delta b")
        self.space.add(self.BT, dBT)
        self.recompute_w()
        return self.push_w(want_gap)

    def round_steps(self, want_gap):
        """Optimistic local steps, exact steps eta on the server, then alpha += eta delta on the workers."""
        scalars = {None: 2, "free": 5, "box": 6}[self.momentum]
        self.supports()
        box_on_supports = self.momentum == "box" and self.direction_layout is not None
        gathered = self.trial_with_directions(scalars) if box_on_supports else None
        if gathered is not None:
            vecs, block_scalars = gathered
        else:
            vecs, block_scalars = self.gather_up(DMTRLCommand.TRIAL, 2 if self.momentum == "box" else 1, scalars,
                                                 round=self.round)
        per_task = self.per_task(block_scalars)
        if self.momentum == "box":       # beta_max: the smallest over a task's blocks, not the sum
            beta_max = np.full(self.m, np.inf)
            np.minimum.at(beta_max, self.block_task, block_scalars[:, -1])
            per_task[:, -1] = beta_max
        for v in vecs:
            self.check_vectors(v, "local step delta b")
        check_finite_rows(per_task, self.round, self.names, "local step delta b", self.outer)
        spread = self.spread_applies()
        if spread:                       # the step's products and W by task chunks on every rank (dmtrl/spread.py)
            eta, beta = self.spread_steps(vecs[0], per_task, vecs[1] if self.momentum == "box" else None)
            self.check_vectors(self.WT, "W column")
        else:
            eta, beta, self.dPT = self.solver.take_steps(self.step_inputs(), vecs[0],
                                                         vecs[1] if self.momentum == "box" else None, per_task)
        self.step, self.beta = eta, beta
        if box_on_supports:
            self.track_previous_steps(eta, vecs[0], beta, vecs[1])
        if not spread:
            self.recompute_w()
        self.rho_task = self.solver.adapt_rho(np.clip(eta, 0.0, self.config.eta), self.rho_task, self.Sigma,
                                              self.blocks_per_task)
        return self.push_w(want_gap, eta, beta)

    @property
    def one_block_a_task(self):
        return bool(np.all(self.blocks_per_task == 1))

    def blocks_by_rank(self):
        """``(rank, [plan indices of its blocks])`` for every rank, in rank order (plan order within a rank)."""
        by_rank = [[] for _ in range(self.cluster.size)]
        for k, b in enumerate(self.blocks):
            by_rank[self.cluster.worker_rank(b.worker)].append(k)
        return list(enumerate(by_rank))

    def coupled(self) -> bool:
        """Sigma has a nonzero off the diagonal (asked every recorded round: kept while Sigma is the same
        array, and checked in row pieces, sigma.is_diagonal: at 10^4 tasks each check is 800 MB read)."""
        cached = getattr(self, "_coupled_for", None)
        if cached is None or cached[0] is not self.Sigma:
            self._coupled_for = cached = (self.Sigma, not sigma_rules.is_diagonal(self.Sigma))
        return cached[1]

    def since_halved(self, rel_gap=None):
        """:meth:`GapHistory.since_halved` of the current W-step."""
        return self.history.since_halved(self.outer, rel_gap)

    def w_step(self):
        if self.wstep_round == 0:
            self.forget_interior_rounds()
        row, converged = None, False
        while True:
            if self.interior_point_due():
                row, converged = self.interior_rounds()
                if converged or self.wstep_round >= self.round_budget():
                    break
            local = self.local_rounds_possible()
            if local:
                self.enter_local()
            row, converged = self.w_step_rounds(local)
            if local:
                self.leave_local()
            if converged or self.wstep_round >= self.round_budget() or not self.interior_point_due():
                break
        if not converged and row is not None:
            rows = self.history.rows
            mine = [i for i, o in enumerate(rows["outer"]) if o == self.outer]
            stalled = stalled_since([rows["round"][i] for i in mine], [rows["rel_gap"][i] for i in mine])
            if stalled is not None:
                row = dict(row, stalled_since=stalled)
        self.apply_correction()
        return row, converged

    def round_budget(self, rel_gap=None):
        """The current W-step's rounds: --max-rounds, or past it as far as its gap's recent rate projects --tol
        (:func:`.outer.round_budget`, from this W-step's recorded rows; ``rel_gap``: this round's, not recorded yet,
        read as its row, so a check inside the round sees the budget the loop will see after it)."""
        cfg = self.config
        if self.wstep_round < cfg.max_rounds:
            return cfg.max_rounds
        rows = self.history.rows
        start = self.history.first_row(self.outer)
        rounds, gaps = rows["round"][start:], rows["rel_gap"][start:]
        if rel_gap is not None:
            rounds, gaps = rounds + [self.round], gaps + [rel_gap]
        return round_budget(rounds, gaps, self.wstep_round, cfg.tol, cfg.max_rounds)

    def w_step_rounds(self, local):
        cfg = self.config
        rows = self.history.rows
        row = {k: v[-1] for k, v in rows.items()} if rows["round"] else None
        while self.wstep_round < self.round_budget():
            self.wstep_round += 1
            self.round += 1
            # every round past --max-rounds is recorded: the budget follows the gap (round_budget)
            want_gap = self.wstep_round % cfg.gap_every == 0 or self.wstep_round >= cfg.max_rounds
            if local:
                terms = self.round_local(want_gap)
            else:
                terms = self.round_safe(want_gap) if self.safe else self.round_steps(want_gap)
            if want_gap:
                if local:
                    regularizer = float(np.sum(terms[:, 2]))
                    primal, dual = primal_dual_of(terms[:, 0], terms[:, 1], self.n, regularizer)
                else:
                    regularizer = self.space.total(self.BT, self.WT)
                    primal, dual = self.objective(terms)
                primal, correction = self.corrected_primal(terms, primal, dual, regularizer, local)
                row = self.record(primal, dual)
                if row["rel_gap"] <= cfg.tol:
                    self.keep_correction(correction)
                    return row, True
            self.safe_point()
            if want_gap and self.interior_point_due():     # stalled: interior-point rounds from here (w_step)
                return row, False
        return row, False

    def omega(self):
        floor = self.outer_state.floor or self.config.eig_floor
        if self.m >= sigma_rules.FACTORED_MIN_TASKS:  # many tasks: a thin SVD of W^T, Sigma kept as its factors
            WT = self.next_wt if self.next_wt is not None else self.dense_wt()
            self.next_wt = None
            self.Sigma = omega_factors(WT, floor)
        else:
            if self.next_wt is not None:      # the prox step's W (hpcmtl.dmtrl.joint), else the W-step's own
                G = self.next_wt @ self.next_wt.T
                self.next_wt = None
            else:
                G = self.space.wtw(self.WT, self.BT, self.Sigma, self.config.lam)
            self.Sigma = omega_from_gram(G, floor)
        factors = self.sigma_factors
        check_finite_rows(self.Sigma if factors is None else np.column_stack([factors.V, factors.diag()]), self.round,
                          self.names, "Sigma row", self.outer)
        self.rho = self.lemma_rho()
        if self.config.aggregation == "qp":
            self.rho_task = coupled_rho(self.Sigma)
        self.recompute_w()
        self.push_sigma()
        self.push_w(False)
        if self.momentum:                 # a new Sigma, a new quadratic: restart the momentum
            self.restart_momentum()
        self.wstep_round = 0
        self.safe_point()

    def block_slices(self, pieces, size):
        """``(block, its slice)`` of per-rank vectors concatenating each rank's blocks in plan order.

        ``size(block)`` is the length of a block's slice; yields rank by rank.
        """
        for rank, blocks in self.blocks_by_rank():
            pos = 0
            for b in (self.blocks[k] for k in blocks):
                yield b, pieces[rank][pos:pos + size(b)]
                pos += size(b)

    def run(self, resume=None):
        if resume is not None:
            self.restore(resume())        # read (and checked) on the server, workers already serving
        else:
            self.push_sigma()
        converged = outer_loop(self.config, lambda p: self.w_step(), self.omega, self.outer_state, self.warn,
                               self.certify)
        if self.want_test or self.scores_off_supports:
            self.push_dense_w()
        if self.want_test:
            self.test = self.test_metrics(not get_loss(self.config.loss).binary_labels)
        if engine.intercept_mode(self.config) == "center":
            self.intercept = self.intercepts()
        return converged

    def intercepts(self):
        """The centered problem's per-task intercepts ``ybar_i - mu_i . w_i`` from the workers, which hold the
        means their blocks were centered with: m numbers come back, where rank 0 read every task again (minutes at
        10^5 tasks).  A split task's blocks give the same number; its first block's is taken."""
        rows = self.command(DMTRLCommand.INTERCEPTS, payload=self.dense_wt()[self.block_task], width=self.d)
        tasks, first = np.unique(self.block_task, return_index=True)
        b = np.zeros(self.m)
        b[tasks] = rows[first, 0]
        return b

    def checkpoint_state(self):
        """(server arrays, per-block worker state, counters) for :class:`hpcmtl.checkpoint.Checkpointer`."""
        if self.local_phase:
            self.pull_local()             # B lives on the workers during local rounds
        blocks = [{"task": b.task, "part": b.part, "start": b.start, "stop": b.stop,
                   "alpha": st.alpha, "order": st.order, "shrink": st.shrink}
                  for b, st in self.gather_state()]
        arrays = {"BT": self.space.dense(self.BT), "rho": np.array(self.rho)}
        if self.sigma_factors is not None:        # the factors the rounds use (a resume takes the same path), no
            arrays.update(self.sigma_factors.arrays())     # m x m array
        else:
            arrays["Sigma"] = self.Sigma
        if not self.safe:
            arrays.update(rho_task=self.rho_task, step=self.step)
        if self.momentum:
            arrays.update(beta=self.beta, dPT=self.space.dense(self.dPT), previous=self.gather_previous())
        arrays.update(self.history.checkpoint_arrays())
        if self.outer_state.revert_wt is not None:      # a recovered-W move's W, until the W-step after it ends
            arrays["revert_WT"] = self.outer_state.revert_wt
        if self.outer_state.prev_wt is not None:        # the last W-step's W: the next extrapolations' origin
            arrays["prev_WT"] = self.outer_state.prev_wt
        counters = {"round": self.round, "t": self.wstep_round, "outer": self.outer_state.outer,
                    "previous": self.outer_state.previous, "seconds": self.elapsed(),
                    "bytes": self.cluster.bytes_moved, "wsteps": self.outer_state.wsteps,
                    "prox_center": self.outer_state.prox_center, "floor": self.outer_state.floor,
                    "apg_step": self.outer_state.apg_step, "revert_primal": self.outer_state.revert_primal,
                    **self.momentum_counters(), **self.interior_counters()}
        return arrays, blocks, counters

    def gather_state(self):
        """Every block's (plan block, :class:`BlockState`), in plan order."""
        pieces = self.command(DMTRLCommand.GET_STATE)
        return [(b, BlockState.unpack(data, 0, b.n_rows)[0])
                for b, data in self.block_slices(pieces, lambda b: BlockState.packed_size(b.n_rows))]

    def restore(self, ck):
        """Continue from a checkpoint read by :mod:`hpcmtl.checkpoint` (same data, same math)."""
        for key, default in (("aggregation", "safe"), ("local_solver", "auto"), ("exchange", "dense")):
            saved, now = ck["config"].get(key, default), getattr(self.config, key)
            if saved != now:
                raise InputError(f"{ck['path']}: cannot resume: '{key}' is {saved!r} in the checkpoint but {now!r} now")
        self.BT = self.space.compact(ck["arrays"]["BT"])
        factors = covariance_from_arrays(ck["arrays"], ck["path"], m=self.m)
        # a checkpoint of the factored path (also one written with the dense copy beside the factors) resumes
        # on the factors; one of the dense path on its Sigma
        if factors is None and "Sigma" not in ck["arrays"]:
            raise InputError(f"{ck['path']}: cannot resume: no task covariance (field 'state/Sigma', "
                             f"'state/sigma_V', 'sigma_s', 'sigma_c' or 'state/graph_*')")
        self.Sigma = factors if factors is not None else ck["arrays"]["Sigma"].copy()
        # rho depends on how tasks are cut into blocks, which may differ at another rank count
        self.rho = self.lemma_rho()
        if not self.safe:
            self.rho_task = np.asarray(ck["arrays"]["rho_task"], dtype=np.float64).copy()
            self.step = np.asarray(ck["arrays"]["step"], dtype=np.float64).copy()
        if self.momentum:
            self.beta = np.asarray(ck["arrays"]["beta"], dtype=np.float64).copy()
            self.dPT = self.space.compact(ck["arrays"]["dPT"])
        c = ck["counters"]
        self.round, self.wstep_round = int(c["round"]), int(c["t"])
        self.restore_momentum_counters(c)
        self.restore_interior_counters(c)
        self.outer_state = OuterState(int(c["outer"]), c["previous"], c.get("wsteps", []), c.get("prox_center"),
                                      c.get("floor"), c.get("apg_step"))
        if "revert_WT" in ck["arrays"] and c.get("revert_primal") is not None:
            self.outer_state.revert_wt = np.asarray(ck["arrays"]["revert_WT"], dtype=np.float64).copy()
            self.outer_state.revert_primal = float(c["revert_primal"])
        if "prev_WT" in ck["arrays"]:
            self.outer_state.prev_wt = np.asarray(ck["arrays"]["prev_WT"], dtype=np.float64).copy()
        self.seconds_before = float(c["seconds"])
        self.cluster.bytes_moved = int(c["bytes"])
        self.history.restore(ck["arrays"])
        self.recompute_w()
        self.push_sigma()                                  # also resets shrinking: restored next
        self.command(DMTRLCommand.SET_STATE, payload=block_payloads(ck, self.blocks, self.cluster))
        if self.momentum:
            self.command(DMTRLCommand.SET_PREVIOUS,
                         payload=self.previous_payloads(np.asarray(ck["arrays"]["previous"])))
        self.push_w(False)
