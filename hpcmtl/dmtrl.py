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

from dataclasses import asdict, dataclass, field

import numpy as np

from . import _kernels
from . import engine
from .checkpoint import read_compatible
from .engine import LocalBase, ServerBase, load_blocks, peak_rss_mb
from .errors import ConvergenceError, InputError
from .losses import LOSSES, check_choice, get_loss

RELATIONSHIPS = ("learned", "identity", "fixed")

# server-driven commands (ids shared by every rank)
CMD_SDCA = 1          # a = global round: local SDCA on every block -> Gatherv delta b
CMD_SET_W = 2         # a = 1 to also return objective terms: Scatterv w columns
CMD_SET_SIGMA = 3     # Bcast sigma_ii per task and rho
CMD_GET_STATE = 4     # Gatherv alpha, coordinate order and shrinking state of every block (checkpoint)
CMD_SET_STATE = 5     # Scatterv the same (resume)


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
        check_choice("loss", self.loss, LOSSES, owner)
        check_choice("relationship", self.relationship, RELATIONSHIPS, owner)
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

    def checkpoint_arrays(self):
        return {f"history_{k}": np.asarray(v, dtype=np.int64 if k in ("round", "outer", "bytes") else np.float64)
                for k, v in self.rows.items()}

    def restore(self, arrays):
        for k in self.COLUMNS:
            self.rows[k] = list(arrays[f"history_{k}"])


# ---------------------------------------------------------------------------
# Worker side: the blocks a rank owns and the handlers it runs
# ---------------------------------------------------------------------------
class LocalBlocks(LocalBase):
    """A rank's task blocks with their dual variables and current w columns."""

    def __init__(self, cluster, blocks, config: DMTRLConfig, test_blocks=None):
        super().__init__(cluster, blocks, config, test_blocks)
        self.alpha = [np.zeros(b.n_rows) for b in blocks]
        self.sigma_ii = np.ones(len(blocks))
        self.rho = 1.0
        self.order = [np.arange(b.n_rows, dtype=np.int32) for b in blocks]
        self.reset_shrinking()

    def extra_bytes(self):
        return sum(a.nbytes + o.nbytes for a, o in zip(self.alpha, self.order))

    def reset_shrinking(self):
        """Every coordinate active again (start, and after each Omega-step changes W)."""
        enabled = self.config.shrinking and self.loss.name in ("hinge", "smoothed-hinge")
        self.shrink = [_kernels.new_shrink_state(b.n_rows, enabled) for b in self.blocks]

    def handlers(self):
        return {**super().handlers(),
                CMD_SDCA: self.on_sdca, CMD_SET_W: self.on_set_w, CMD_SET_SIGMA: self.on_set_sigma,
                CMD_GET_STATE: self.on_get_state, CMD_SET_STATE: self.on_set_state}

    def on_sdca(self, ctrl, payload, width):
        round_ = int(ctrl[1])
        cfg = self.config
        out = np.zeros((len(self.blocks), width))
        for k, blk in enumerate(self.blocks):
            with self.working_on(blk, round_):
                old = self.alpha[k].copy() if cfg.eta != 1.0 else None
                _kernels.sdca_local(*blk.rows, blk.y, self.alpha[k], self.w[k], out[k], blk.sq_norms,
                                    self.order[k], self.shrink[k], self.loss.kernel_id, cfg.gamma,
                                    self.rho * self.sigma_ii[k] / cfg.lam, float(blk.n_task), cfg.local_iters,
                                    block_seed(cfg.seed, blk.task, blk.part, round_))
                if old is not None:   # alpha <- alpha + eta delta_alpha
                    self.alpha[k] = old + cfg.eta * (self.alpha[k] - old)
                    out[k] *= cfg.eta
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

# ---------------------------------------------------------------------------
# The server's driver
# ---------------------------------------------------------------------------
class Server(ServerBase):
    """Holds B, Sigma, W and drives the rounds; runs on rank 0 only."""

    def __init__(self, cluster, source, config: DMTRLConfig, sigma_fixed=None, progress=None,
                 checkpointer=None, test=False):
        super().__init__(cluster, source, progress, checkpointer)
        self.config = config
        self.d = config.rff_dim or source.n_features
        self.blocks_per_task = np.bincount(self.block_task, minlength=self.m)
        self.BT = np.zeros((self.m, self.d))
        if config.relationship == "fixed":
            self.Sigma = np.array(sigma_fixed, dtype=np.float64)
        else:
            self.Sigma = np.eye(self.m) / self.m
        self.WT = np.zeros((self.m, self.d))
        self.rho = safe_rho(self.Sigma, self.blocks_per_task, config.eta)
        self.history = GapHistory()
        self.t = 0                    # rounds so far in the current W-step
        self.outer_state = OuterState()
        self.want_test = test
        self.test = None

    @property
    def outer(self):
        return self.outer_state.p

    # -- commands ----------------------------------------------------------
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
        sums = self.per_task(terms)
        return primal_dual(sums[:, 0], sums[:, 1], self.n, self.BT, self.WT, self.config.lam)

    def record(self, primal, dual):
        row = self.history.record(self.round, self.outer, primal, dual, self.elapsed(), self.cluster.bytes_moved)
        if self.progress is not None:
            self.progress(row)
        return row

    # -- the algorithm ---------------------------------------------------------
    def w_step(self):
        cfg = self.config
        rows = self.history.rows
        row = {k: v[-1] for k, v in rows.items()} if rows["round"] else None
        while self.t < cfg.max_rounds:
            self.t += 1
            self.round += 1
            self.BT += self.per_task(self.command(CMD_SDCA, self.round, width=self.d))
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
            self.restore(resume())        # read (and checked) on the server, workers already serving
        else:
            self.push_sigma()
        converged = alternate(self.config, lambda p: self.w_step(), self.omega, self.outer_state)
        if self.want_test:
            self.test = self.test_metrics(not get_loss(self.config.loss).binary_labels)
        return converged

    # -- checkpoints -------------------------------------------------------------
    def checkpoint_state(self):
        """(server arrays, per-block worker state, counters) for :class:`hpcmtl.checkpoint.Checkpointer`."""
        blocks = [{"task": b.task, "part": b.part, "start": b.start, "stop": b.stop,
                   "alpha": alpha, "order": order, "shrink": shrink}
                  for b, alpha, order, shrink in self.gather_state()]
        arrays = {"BT": self.BT, "Sigma": self.Sigma, "rho": np.array(self.rho)}
        arrays.update(self.history.checkpoint_arrays())
        counters = {"round": self.round, "t": self.t, "outer": self.outer_state.p,
                    "previous": self.outer_state.previous, "seconds": self.elapsed(),
                    "bytes": self.cluster.bytes_moved}
        return arrays, blocks, counters

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
        # rho depends on how tasks are cut into blocks, which may differ at another rank count
        self.rho = safe_rho(self.Sigma, self.blocks_per_task, self.config.eta)
        c = ck["counters"]
        self.round, self.t = int(c["round"]), int(c["t"])
        self.outer_state = OuterState(int(c["outer"]), c["previous"])
        self.seconds_before = float(c["seconds"])
        self.cluster.bytes_moved = int(c["bytes"])
        self.history.restore(ck["arrays"])
        self.recompute_w()
        self.push_sigma()                                  # also resets shrinking: restored next
        self.command(CMD_SET_STATE, payload=block_payloads(ck, self.blocks, self.cluster))
        self.push_w(False)


def train(cluster, source, config: DMTRLConfig, test_source=None, sigma_fixed=None, progress=None,
          checkpointer=None, resume=None):
    """Run DMTRL (or STL / a fixed Sigma) on every rank; the server returns a TrainResult.

    ``source`` / ``test_source`` are task sources (:class:`hpcmtl.store.TaskFile`
    or :class:`hpcmtl.estimators.MemoryTasks`): each rank reads its own blocks.
    ``checkpointer`` (server) writes checkpoints and reacts to termination
    signals; ``resume`` (server) is a checkpoint path to continue from.
    Workers return None.
    """
    config.validate()
    if config.relationship == "fixed":
        sigma_fixed = check_sigma(sigma_fixed, source.n_tasks)
    rss_before_data = peak_rss_mb()
    blocks, tests = load_blocks(cluster, source, config, test_source)
    local = LocalBlocks(cluster, blocks, config, tests)

    def make_server():
        return Server(cluster, source, config, sigma_fixed, progress, checkpointer, test=test_source is not None)

    state = None
    if resume is not None and cluster.is_server:
        state = lambda: read_compatible(resume, config, source, sigma_fixed)  # noqa: E731 - read on the server, inside run
    outcome = engine.run(cluster, local, make_server, rss_before_data, state)
    if outcome is None:
        return None
    server, converged, ranks = outcome
    return TrainResult(W=server.WT.T.copy(), Sigma=server.Sigma.copy(),
                       history=server.history.arrays(),
                       config=config.to_dict(), task_names=server.names, converged=converged,
                       n_rounds=server.round, seconds=server.elapsed(), bytes_moved=cluster.bytes_moved,
                       rho=server.rho, test=server.test,
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
