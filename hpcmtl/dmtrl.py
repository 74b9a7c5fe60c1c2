"""DMTRL: distributed multi-task relationship learning (paper 001), the core engine.

Objective (task covariance ``Sigma = Omega^-1``, ``tr(Sigma) = 1`` when learned)::

    P(W) = sum_i (1/n_i) sum_j l(w_i . x_ij, y_ij) + (lam/2) tr(W Omega W^T)

and its dual with ``b_i = (1/n_i) sum_j alpha_ij x_ij``, ``W(alpha) = B Sigma / lam``::

    D(alpha) = -(1/(2 lam)) tr(B Sigma B^T) - sum_i (1/n_i) sum_j l*(-alpha_ij)

Since ``(lam/2) tr(W Omega W^T) = tr(B Sigma B^T) / (2 lam)`` at ``W(alpha)``, the
duality gap needs only per-task loss and conjugate sums from the workers plus
``tr(B Sigma B^T)`` on the server; Omega is never inverted.

W-step round: every worker runs local SDCA (Algorithm 2) on each of its task
blocks and sends ``delta b`` (d numbers a block, Gatherv); the server sets
``B += eta sum delta b``, ``W = B Sigma / lam`` and sends each block its task's
column back (Scatterv).  Omega-step (learned relationships): on the server,
``Sigma = (W^T W)^(1/2) / tr((W^T W)^(1/2))`` with an eigenvalue floor and
``rho = eta max_i sum_i' |sigma_ii'| / sigma_ii`` (Lemma 6.7, generalized to
tasks split into several blocks).  alpha carries over.

Relationship modes: ``learned`` (DMTRL), ``identity`` (STL: Sigma fixed at I/m)
and ``fixed`` (a user-given Sigma, e.g. a graph kernel).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from . import _kernels
from .cluster import STOP, STOP_DONE, STOP_FAILED, STOP_PREEMPTED, StopRequested, fault_point, plan_blocks
from .errors import ConvergenceError, InputError, Preempted
from .features import rff_map
from .losses import LOSSES, check_labels, closest, get_loss
from .metrics import summarize, task_metrics

RELATIONSHIPS = ("learned", "identity", "fixed")

# server-driven commands (ids shared by every rank)
CMD_SDCA = 1          # a = global round: local SDCA on every block -> Gatherv delta b
CMD_SET_W = 2         # a = 1 to also return objective terms: Scatterv w columns
CMD_SET_SIGMA = 3     # Bcast sigma_ii per task and rho
CMD_GET_STATE = 4     # Gatherv alpha, coordinate order and shrinking state of every block (checkpoint)
CMD_SET_STATE = 5     # Scatterv the same (resume)
CMD_TEST = 6          # per-task test metrics of the current W


@dataclass
class DMTRLConfig:
    """Settings of one training run (validated by :meth:`validate`)."""
    loss: str = "hinge"
    lam: float = 1e-3
    gamma: float = 1.0              # smoothed-hinge parameter
    tol: float = 1e-6               # relative duality gap of each W-step
    max_rounds: int = 500           # rounds per W-step
    outer: int = 10                 # maximum outer (Omega) steps
    outer_tol: float = 1e-5         # relative change of the objective between W-steps
    local_iters: float = 1.0        # H as a multiple of each block's rows
    seed: int = 0
    eta: float = 1.0                # aggregation parameter
    gap_every: int = 1              # compute the gap every k rounds
    relationship: str = "learned"
    eig_floor: float = 1e-8         # eigenvalues of (W^T W)^(1/2) floored at this fraction of the largest
    rff_dim: int = 0                # random Fourier features (0 = linear)
    rff_gamma: float = 1.0
    split_tasks: bool = False       # split tasks larger than a worker's share over several workers
    shrinking: bool = True          # liblinear-style shrinking in local SDCA (hinge, smoothed hinge)
    method: str = "dmtrl"

    def validate(self, owner="DMTRL"):
        def bad(name, rule, value):
            raise InputError(f"The '{name}' parameter of {owner} must be {rule}. Got {value!r} instead.")
        if self.loss not in LOSSES:
            raise InputError(f"The 'loss' parameter of {owner} must be one of {', '.join(LOSSES)}. "
                             f"Got {self.loss!r} instead.{closest(self.loss, LOSSES)}")
        if self.relationship not in RELATIONSHIPS:
            raise InputError(f"The 'relationship' parameter of {owner} must be one of {', '.join(RELATIONSHIPS)}. "
                             f"Got {self.relationship!r} instead.{closest(self.relationship, RELATIONSHIPS)}")
        for name in ("lam", "tol", "local_iters", "eta", "gamma", "eig_floor"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value > 0):
                bad(name, "> 0", value)
        if self.eta > 1:
            bad("eta", "in (0, 1]", self.eta)
        if not (self.outer_tol >= 0):
            bad("outer_tol", ">= 0", self.outer_tol)
        for name in ("max_rounds", "outer", "gap_every"):
            value = getattr(self, name)
            if not (isinstance(value, (int, np.integer)) and value >= 1):
                bad(name, "an integer >= 1", value)
        if not (isinstance(self.rff_dim, (int, np.integer)) and self.rff_dim >= 0):
            bad("rff_dim", "an integer >= 0", self.rff_dim)
        if self.rff_dim and not self.rff_gamma > 0:
            bad("rff_gamma", "> 0", self.rff_gamma)
        if not (isinstance(self.seed, (int, np.integer)) and self.seed >= 0):
            bad("seed", "an integer >= 0", self.seed)
        return self

    def to_dict(self):
        return asdict(self)


@dataclass
class TrainResult:
    W: np.ndarray                   # d x m
    Sigma: np.ndarray               # m x m
    history: dict
    config: dict
    task_names: list
    converged: bool
    n_rounds: int
    seconds: float
    bytes_moved: int
    rho: float
    test: dict | None = None        # {"tasks": [...], "summary": {...}}
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------
# Omega-step and rho (server arithmetic, public for tests)
# ---------------------------------------------------------------------------
def omega_step(W: np.ndarray, eig_floor: float = 1e-8) -> np.ndarray:
    """``Sigma = (W^T W)^(1/2) / tr((W^T W)^(1/2))`` with an eigenvalue floor.

    Eigenvalues of the square root below ``eig_floor`` times the largest are
    raised to that floor, so Sigma stays positive definite and Omega exists.
    An all-zero W gives ``I / m``.
    """
    m = W.shape[1]
    evals, evecs = np.linalg.eigh(W.T @ W)
    s = np.sqrt(np.clip(evals, 0.0, None))
    top = s.max() if s.size else 0.0
    if not top > 0:
        return np.eye(m) / m
    s = np.maximum(s, eig_floor * top)
    root = (evecs * s) @ evecs.T
    root = 0.5 * (root + root.T)
    return root / np.trace(root)


def safe_rho(Sigma: np.ndarray, blocks_per_task=None, eta: float = 1.0) -> float:
    """rho of Lemma 6.7, ``eta max_i sum_i' |sigma_ii'| / sigma_ii``, with split tasks.

    A task cut into s_i blocks counts as s_i tasks sharing its row and column of
    Sigma: ``eta max_i (sum_i' s_i' |sigma_ii'|) / sigma_ii``.
    """
    A = np.abs(Sigma)
    s = np.ones(Sigma.shape[0]) if blocks_per_task is None else np.asarray(blocks_per_task, float)
    return float(eta * np.max((A @ s) / np.diag(Sigma)))


class OuterState:
    """Where the outer loop is: the current outer step and the previous W-step's objective."""

    def __init__(self, p=0, previous=None):
        self.p = p
        self.previous = previous


def alternate(config, w_step, omega_update, state: OuterState | None = None):
    """The outer loop of Algorithm 1, shared by DMTRL and the centralized baselines.

    ``w_step(p)`` returns ``(last history row, converged)``; ``omega_update()``
    replaces Sigma.  Stops after a W-step when relationships are not learned,
    after ``config.outer`` W-steps, or when the objective changed by at most
    ``outer_tol`` relative to the previous W-step.  Always ends on a W-step, so
    the returned W is certified for the returned Sigma.  ``state`` lets a
    resumed run continue where a checkpoint left the loop.
    """
    state = state or OuterState()
    converged = False
    while state.p < config.outer:
        row, converged = w_step(state.p)
        objective = row["primal"]
        if (config.relationship != "learned" or state.p + 1 == config.outer or
                (state.previous is not None and abs(objective - state.previous) <= config.outer_tol * abs(objective))):
            break
        state.previous = objective
        state.p += 1
        omega_update()
    return converged


def block_seed(seed: int, task: int, part: int, round_: int) -> int:
    """The 64-bit seed of one block's coordinate stream in one round."""
    return int(np.random.SeedSequence([seed, task, part, round_]).generate_state(1, dtype=np.uint64)[0])


def primal_dual(loss_sums, conj_sums, n, BT, WT, lam):
    """``(P, D)`` from per-task sums of l(w.x) and l*(-alpha), with W = B Sigma / lam.

    ``(lam/2) tr(W Omega W^T) = tr(B Sigma B^T) / (2 lam) = sum(B * W) / 2``.
    """
    half = 0.5 * float(np.sum(BT * WT))
    primal = float(np.sum(np.asarray(loss_sums) / n)) + half
    dual = -half - float(np.sum(np.asarray(conj_sums) / n))
    return primal, dual


class GapHistory:
    """Per-evaluation rows (round, outer, primal, dual, gap, rel_gap, seconds, bytes)."""

    COLUMNS = ("round", "outer", "primal", "dual", "gap", "rel_gap", "seconds", "bytes")

    def __init__(self):
        self.rows = {k: [] for k in self.COLUMNS}

    def record(self, round_, outer, primal, dual, seconds, bytes_moved):
        gap = primal - dual
        if gap < -1e-9 * max(abs(primal), abs(dual), 1.0):
            raise ConvergenceError(f"negative duality gap {gap:.3e} (primal {primal:.12g}, dual {dual:.12g}) "
                                   f"at round {round_}: the dual iterate is inconsistent")
        row = {"round": round_, "outer": outer, "primal": primal, "dual": dual, "gap": gap,
               "rel_gap": gap / max(abs(primal), 1e-300), "seconds": seconds, "bytes": bytes_moved}
        for k, v in row.items():
            self.rows[k].append(v)
        return row

    def arrays(self):
        return {k: np.asarray(v) for k, v in self.rows.items()}


# ---------------------------------------------------------------------------
# Worker side: the blocks a rank owns and the handlers it runs
# ---------------------------------------------------------------------------
class LocalBlocks:
    """A rank's task blocks with their dual variables and current w columns."""

    def __init__(self, cluster, blocks, config: DMTRLConfig, test_blocks=None):
        self.cluster = cluster
        self.blocks = blocks
        self.test_blocks = test_blocks or {}
        self.config = config
        self.loss = get_loss(config.loss)
        d = blocks[0].n_features if blocks else 0
        self.alpha = [np.zeros(b.n_rows) for b in blocks]
        self.w = np.zeros((len(blocks), d))
        self.sigma_ii = np.ones(len(blocks))
        self.rho = 1.0
        self.order = [np.arange(b.n_rows, dtype=np.int32) for b in blocks]
        self.reset_shrinking()
        self.d = d

    def reset_shrinking(self):
        """Every coordinate active again (start, and after each Omega-step changes W)."""
        enabled = self.config.shrinking and self.loss.name in ("hinge", "smoothed-hinge")
        self.shrink = [_kernels.new_shrink_state(b.n_rows, enabled) for b in self.blocks]

    def register(self, cluster):
        cluster.handlers.update({
            CMD_SDCA: self.on_sdca, CMD_SET_W: self.on_set_w, CMD_SET_SIGMA: self.on_set_sigma,
            CMD_GET_STATE: self.on_get_state, CMD_SET_STATE: self.on_set_state, CMD_TEST: self.on_test,
        })

    def on_sdca(self, ctrl, payload, width):
        round_ = int(ctrl[1])
        cfg = self.config
        out = np.zeros((len(self.blocks), width))
        for k, blk in enumerate(self.blocks):
            try:
                fault_point(self.cluster.rank, round_)
                old = self.alpha[k].copy() if cfg.eta != 1.0 else None
                _kernels.sdca_local(*blk.rows, blk.y, self.alpha[k], self.w[k], out[k], blk.sq_norms,
                                    self.order[k], self.shrink[k], self.loss.kernel_id, cfg.gamma,
                                    self.rho * self.sigma_ii[k] / cfg.lam, float(blk.n_task), cfg.local_iters,
                                    block_seed(cfg.seed, blk.task, blk.part, round_))
                if old is not None:   # alpha <- alpha + eta delta_alpha
                    self.alpha[k] = old + cfg.eta * (self.alpha[k] - old)
                    out[k] *= cfg.eta
            except Exception as exc:
                exc.hpcmtl_task = blk.name
                raise
        return self.cluster.gather_block_rows(out, width)

    def on_set_w(self, ctrl, payload, width):
        self.w = self.cluster.scatter_block_rows(payload, width)
        if not ctrl[1]:
            return None
        terms = np.zeros((len(self.blocks), 2))
        for k, blk in enumerate(self.blocks):
            terms[k] = _kernels.objective_terms(*blk.rows, blk.y, self.alpha[k], self.w[k],
                                                self.loss.kernel_id, self.config.gamma)
        return self.cluster.gather_block_rows(terms, 2)

    def on_set_sigma(self, ctrl, payload, width):
        m = int(ctrl[1])
        shared = self.cluster.bcast_array(payload, (m + 1,))
        self.sigma_ii = np.array([shared[b.task] for b in self.blocks])
        self.rho = float(shared[m])
        self.reset_shrinking()

    def on_get_state(self, ctrl, payload, width):
        """Per block, concatenated: alpha (n), coordinate order (n), shrinking state (5)."""
        parts = []
        for k in range(len(self.blocks)):
            parts += [self.alpha[k], self.order[k].astype(np.float64), self.shrink[k]]
        return self.cluster.gather_variable(np.concatenate(parts) if parts else np.zeros(0))

    def on_set_state(self, ctrl, payload, width):
        mine = self.cluster.scatter_variable(payload)
        pos = 0
        for k, blk in enumerate(self.blocks):
            n = blk.n_rows
            self.alpha[k] = mine[pos:pos + n].copy()
            self.order[k] = mine[pos + n:pos + 2 * n].astype(np.int32)
            self.shrink[k] = mine[pos + 2 * n:pos + 2 * n + 5].copy()
            pos += 2 * n + 5

    def on_test(self, ctrl, payload, width):
        regression = not self.loss.binary_labels
        local = {}
        for k, blk in enumerate(self.blocks):
            test = self.test_blocks.get(blk.task)
            if test is not None and blk.part == 0:
                local[blk.task] = task_metrics(test.y, test.decision(self.w[k]), regression)
        gathered = self.cluster.gather_objects(local)
        if gathered is None:
            return None
        merged = {}
        for part in gathered:
            merged.update(part)
        return merged


# ---------------------------------------------------------------------------
# Loading: every rank reads only its own blocks, and all ranks fail together
# ---------------------------------------------------------------------------
def load_blocks(cluster, source, config: DMTRLConfig, test_source=None):
    """Plan the blocks, read this rank's rows (and test rows) and validate them.

    Rank-local problems (a corrupt group, NaN, bad labels) are collected and
    raised on every rank through :meth:`Cluster.agree` before any data
    collective starts.
    """
    loss = get_loss(config.loss)
    blocks = plan_blocks(source.n_samples, source.nnz, cluster.n_workers, config.split_tasks)
    cluster.set_plan(blocks)
    error = None
    mine, tests = [], {}
    phi = rff_map(source.n_features, config.rff_dim, config.rff_gamma, config.seed) if config.rff_dim else None
    try:
        if test_source is not None:
            if test_source.n_features != source.n_features:
                raise InputError(f"{test_source.path}: has {test_source.n_features} features, "
                                 f"the training data {source.path} has {source.n_features}")
            if list(test_source.names) != list(source.names):
                raise InputError(f"{test_source.path}: task names differ from the training data {source.path}")
        for b in cluster.my_blocks:
            blk = source.read_block(b.task, b.start, b.stop, b.part)
            check_labels(loss, blk.y, f"{source.path}: task '{blk.name}' (#{b.task})")
            if phi is not None:
                blk = blk.transformed(phi)
            mine.append(blk)
            if test_source is not None and b.part == 0:
                test = test_source.read_task(b.task)
                check_labels(loss, test.y, f"{test_source.path}: task '{test.name}' (#{b.task})")
                tests[b.task] = test.transformed(phi) if phi is not None else test
    except InputError as exc:
        error = str(exc)
    cluster.agree(error)
    return mine, tests


# ---------------------------------------------------------------------------
# The server's driver
# ---------------------------------------------------------------------------
class Server:
    """Holds B, Sigma, W and drives the rounds; runs on rank 0 only."""

    def __init__(self, cluster, source, config: DMTRLConfig, sigma_fixed=None, progress=None,
                 checkpointer=None):
        self.cluster = cluster
        self.config = config
        self.source = source
        self.m = source.n_tasks
        self.n = np.asarray(source.n_samples, dtype=np.float64)
        self.names = list(source.names)
        self.d = config.rff_dim or source.n_features
        self.blocks = cluster.blocks
        self.block_task = np.array([b.task for b in self.blocks], dtype=np.int64)
        self.blocks_per_task = np.bincount(self.block_task, minlength=self.m)
        self.BT = np.zeros((self.m, self.d))
        if config.relationship == "fixed":
            self.Sigma = np.array(sigma_fixed, dtype=np.float64)
        else:
            self.Sigma = np.eye(self.m) / self.m
        self.WT = np.zeros((self.m, self.d))
        self.rho = safe_rho(self.Sigma, self.blocks_per_task, config.eta)
        self.history = GapHistory()
        self.round = 0                # rounds so far (the coordinate streams are keyed by it)
        self.t = 0                    # rounds so far in the current W-step
        self.outer_state = OuterState()
        self.progress = progress
        self.checkpointer = checkpointer
        self.t0 = time.perf_counter()
        self.seconds_before = 0.0     # time spent before a resume

    @property
    def outer(self):
        return self.outer_state.p

    # -- commands ----------------------------------------------------------
    def command(self, cmd, a=0, payload=None, width=0):
        ctrl = self.cluster.send_command(cmd, a, width)
        return self.cluster.handlers[cmd](ctrl, payload, width)

    def push_sigma(self):
        shared = np.concatenate([np.diag(self.Sigma), [self.rho]])
        self.command(CMD_SET_SIGMA, self.m, payload=shared)

    def push_w(self, with_objective: bool):
        terms = self.command(CMD_SET_W, int(with_objective), payload=self.WT[self.block_task], width=self.d)
        return terms

    # -- arithmetic ----------------------------------------------------------
    def recompute_w(self):
        self.WT = (self.Sigma @ self.BT) / self.config.lam      # W = B Sigma / lam

    def objective(self, terms):
        """Primal and dual of the current alpha from per-block terms."""
        loss = np.zeros(self.m)
        conj = np.zeros(self.m)
        for k, t in enumerate(self.block_task):     # fixed block order: same sums at any P
            loss[t] += terms[k, 0]
            conj[t] += terms[k, 1]
        return primal_dual(loss, conj, self.n, self.BT, self.WT, self.config.lam)

    def record(self, primal, dual):
        row = self.history.record(self.round, self.outer, primal, dual, self.elapsed(), self.cluster.bytes_moved)
        if self.progress is not None:
            self.progress(row)
        return row

    def elapsed(self):
        return self.seconds_before + time.perf_counter() - self.t0

    # -- the algorithm ---------------------------------------------------------
    def w_step(self):
        cfg = self.config
        rows = self.history.rows
        row = {k: v[-1] for k, v in rows.items()} if rows["round"] else None
        while self.t < cfg.max_rounds:
            self.t += 1
            self.round += 1
            delta = self.command(CMD_SDCA, self.round, width=self.d)
            dB = np.zeros_like(self.BT)
            for k, task in enumerate(self.block_task):
                dB[task] += delta[k]
            self.BT += dB
            self.recompute_w()
            want_gap = self.t % cfg.gap_every == 0 or self.t == cfg.max_rounds
            terms = self.push_w(want_gap)
            if want_gap:
                row = self.record(*self.objective(terms))
                if row["rel_gap"] <= cfg.tol:
                    return row, True
            self.safe_point()
        return row, False

    def omega(self):
        self.Sigma = omega_step(self.WT.T, self.config.eig_floor)
        self.rho = safe_rho(self.Sigma, self.blocks_per_task, self.config.eta)
        self.recompute_w()
        self.push_sigma()
        self.push_w(False)
        self.t = 0
        self.safe_point()

    def run(self, resume=None):
        if resume is not None:
            self.restore(resume)
        else:
            self.push_sigma()
        return alternate(self.config, lambda p: self.w_step(), self.omega, self.outer_state)

    # -- checkpoints -------------------------------------------------------------
    def safe_point(self):
        """Between rounds: write a checkpoint when one is due or a signal arrived."""
        ck = self.checkpointer
        if ck is None:
            return
        signal_name = ck.signal_received()
        if signal_name or ck.due(self.round):
            ck.save(self)
        if signal_name:
            raise Preempted(f"received {signal_name}: checkpoint written to {ck.path} after round {self.round}; "
                            f"continue with --resume")

    def gather_state(self):
        """Every block's (alpha, order, shrinking state), in plan order."""
        pieces = self.command(CMD_GET_STATE)
        out = []
        by_rank = {}
        for b in self.blocks:
            by_rank.setdefault(self.cluster.worker_rank(b.worker), []).append(b)
        for rank, blocks in sorted(by_rank.items()):
            data, pos = pieces[rank], 0
            for b in blocks:
                n = b.n_rows
                out.append((b, data[pos:pos + n], data[pos + n:pos + 2 * n].astype(np.int32),
                            data[pos + 2 * n:pos + 2 * n + 5]))
                pos += 2 * n + 5
        return out

    def restore(self, ck):
        """Continue from a checkpoint read by :mod:`hpcmtl.checkpoint` (same data, same math)."""
        from .checkpoint import block_payloads
        self.BT = ck["arrays"]["BT"].copy()
        self.Sigma = ck["arrays"]["Sigma"].copy()
        self.rho = float(ck["arrays"]["rho"])
        c = ck["counters"]
        self.round, self.t = int(c["round"]), int(c["t"])
        self.outer_state = OuterState(int(c["outer"]), c["previous"])
        self.seconds_before = float(c["seconds"])
        self.cluster.bytes_moved = int(c["bytes"])
        for k in GapHistory.COLUMNS:
            self.history.rows[k] = list(ck["arrays"][f"history_{k}"])
        self.recompute_w()
        self.push_sigma()                                  # also resets shrinking: restored next
        self.command(CMD_SET_STATE, payload=block_payloads(ck, self.blocks, self.cluster))
        self.push_w(False)

    def test_metrics(self, regression):
        per_task = self.command(CMD_TEST)
        tasks = [dict(name=self.names[t], **per_task[t]) for t in sorted(per_task)]
        return {"tasks": tasks, "summary": summarize(tasks, regression)} if tasks else None

    def stop(self, reason=STOP_DONE, code=0):
        self.cluster.send_command(STOP, reason, code)


def serve(cluster):
    """Worker loop: obey the server's commands until STOP; return (reason, exit code)."""
    while True:
        ctrl = cluster.receive_command()
        if ctrl[0] == STOP:
            return int(ctrl[1]), int(ctrl[2])
        cluster.handlers[int(ctrl[0])](ctrl, None, int(ctrl[2]))


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MB)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def partition_mb(local) -> float:
    """Memory of a rank's own data partition and dual variables (MB)."""
    total = 0
    for k, blk in enumerate(local.blocks):
        total += sum(a.nbytes for a in blk.rows[:3]) + blk.y.nbytes + blk.sq_norms.nbytes
        total += local.alpha[k].nbytes + local.order[k].nbytes
    for blk in local.test_blocks.values():
        total += sum(a.nbytes for a in blk.rows[:3]) + blk.y.nbytes
    return total / 2 ** 20


def train(cluster, source, config: DMTRLConfig, test_source=None, sigma_fixed=None, progress=None,
          checkpointer=None, resume=None):
    """Run DMTRL (or STL / a fixed Sigma) on every rank; the server returns a TrainResult.

    ``source`` / ``test_source`` are task sources (:class:`hpcmtl.store.TaskFile`
    or :class:`hpcmtl.estimators.MemoryTasks`): each rank reads its own blocks.
    ``checkpointer`` (server) writes checkpoints and reacts to termination
    signals; ``resume`` (server) is a checkpoint path to continue from.
    Workers return None.  However the server ends (done, preempted, failed), it
    tells the workers, so every rank leaves with the same exit code.
    """
    config.validate()
    if config.relationship == "fixed":
        sigma_fixed = check_sigma(sigma_fixed, source.n_tasks)
    rss_before_data = peak_rss_mb()
    blocks, tests = load_blocks(cluster, source, config, test_source)
    local = LocalBlocks(cluster, blocks, config, tests)
    local.register(cluster)
    if not cluster.is_server:
        reason, code = serve(cluster)
        if reason == STOP_PREEMPTED:
            raise Preempted("stopped for a checkpoint")
        if reason == STOP_FAILED:
            raise StopRequested(code)
        cluster.gather_objects((rss_before_data, partition_mb(local), peak_rss_mb()))
        return None
    server = Server(cluster, source, config, sigma_fixed, progress, checkpointer)
    try:
        state = None
        if resume is not None:
            from .checkpoint import read_compatible
            state = read_compatible(resume, config, source, sigma_fixed)
        converged = server.run(state)
        test = server.test_metrics(not get_loss(config.loss).binary_labels) if test_source is not None else None
    except Preempted:
        server.stop(STOP_PREEMPTED, Preempted.exit_code)
        raise
    except BaseException as exc:
        server.stop(STOP_FAILED, getattr(exc, "exit_code", 1))
        raise
    server.stop(STOP_DONE)
    ranks = np.array(cluster.gather_objects((rss_before_data, partition_mb(local), peak_rss_mb())))
    return TrainResult(W=server.WT.T.copy(), Sigma=server.Sigma.copy(),
                       history=server.history.arrays(),
                       config=config.to_dict(), task_names=server.names, converged=converged,
                       n_rounds=server.round, seconds=server.elapsed(), bytes_moved=cluster.bytes_moved,
                       rho=server.rho, test=test,
                       extra={"rss_before_data_mb": ranks[:, 0], "partition_mb": ranks[:, 1],
                              "peak_rss_mb": ranks[:, 2]})


def check_sigma(Sigma, m):
    """A user-given task covariance: m x m, symmetric, positive definite."""
    if Sigma is None:
        raise InputError("relationship 'fixed' needs a task covariance Sigma")
    Sigma = np.asarray(Sigma, dtype=np.float64)
    if Sigma.shape != (m, m):
        raise InputError(f"task covariance Sigma has shape {Sigma.shape}, the data has {m} tasks")
    if not np.all(np.isfinite(Sigma)) or not np.allclose(Sigma, Sigma.T, rtol=1e-10, atol=1e-12):
        raise InputError("task covariance Sigma must be finite and symmetric")
    if np.linalg.eigvalsh(Sigma).min() <= 0:
        raise InputError("task covariance Sigma must be positive definite")
    return 0.5 * (Sigma + Sigma.T)
