"""Joint-sparse multi-task learning by projected subgradient (paper 002).

Minimizes the sum of per-task average losses subject to a norm ball::

    min_W  sum_i (1/n_i) sum_j l(w_i . x_ij, y_ij)   s.t.  ||W||_{1,inf} = sum_k max_i |W_ki| <= C

(``projection='l1'`` / ``'l2'``: every task column in its own l1 / l2 ball of
radius C instead, the paper's comparison).  With ``fit_intercept`` every loss
becomes ``l(w_i . x_ij + b_i, y_ij)`` with an unpenalized intercept b_i: it takes
the same subgradient step as W and is never projected.  Round t: every worker computes
its blocks' loss sums and subgradient sums at the current columns (d + 1
numbers a block, Gatherv); the server forms G (d x m) and sets
``W <- P_C(W - eta0 / sqrt(t) G)``, then sends the columns back (Scatterv).
The best iterate by objective is kept (a subgradient method is not monotone).
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np

from . import engine
from .engine import (Command, Down, EngineCommand, LocalBase, RunResult, ServerBase, Up, check_finite_rows,
                     nan_fault)
from .errors import InputError
from .losses import LOSSES, loss_and_derivative
from .params import check_positive_label, validate as check_params
from .projection import l1inf_norm, project_l1_columns, project_l1inf, project_l2_columns

PROJECTIONS = {"l1inf": project_l1inf, "l1": project_l1_columns, "l2": project_l2_columns}



class JointSparseCommand(Command):
    """The projected-subgradient messages: ``ID = id, down, up, control fields, computation``."""
    # every block's w column (width = d; [w, b] with d + 1 with an intercept)
    # -> per block [loss sum, subgradient sum (d)] (and the sum of l'(z_j), the intercept's)
    SUBGRADIENT = 21, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("round", "width"), "subgradient"


@dataclass
class JointSparseConfig:
    """Settings of a projected-subgradient run (validated by :meth:`validate`)."""
    radius: float = 1.0            # C
    loss: str = "hinge"
    projection: str = "l1inf"
    eta0: float = 1.0              # learning rate eta_t = eta0 / sqrt(t)
    intercept_eta0: float = 1.0    # the intercepts' own: intercept_eta0 / sqrt(t) (docs/math.md)
    max_rounds: int = 200
    gamma: float = 1.0             # smoothed-hinge parameter
    seed: int = 0
    rff_dim: int = 0
    rff_gamma: float = 1.0
    split_tasks: bool = False
    fit_intercept: bool = True     # an unpenalized per-task intercept, stepped but not projected
    method: str = "l1inf"
    positive_label: float | None = None     # classification: this label is +1, the other class -1
    explicit_intercept: ClassVar[bool] = True     # the intercept is b itself (engine.intercept_mode)

    def validate(self, owner="JointSparseMTL"):
        """Every field against :data:`hpcmtl.params.PARAMS` (NumPy scalars become Python numbers)."""
        names = ("loss", "projection", "radius", "eta0", "intercept_eta0", "gamma", "max_rounds", "seed", "rff_dim")
        names += (("rff_gamma",) if self.rff_dim else ()) + ("split_tasks", "fit_intercept")
        for name, value in check_params({n: getattr(self, n) for n in names}, owner).items():
            setattr(self, name, value)
        self.positive_label = check_positive_label(self.positive_label, self.loss, owner)
        return self

    def to_dict(self):
        return asdict(self)


class LocalGradients(LocalBase):
    """Worker side: loss and subgradient sums of the rank's blocks."""

    COMMANDS = (EngineCommand, JointSparseCommand)

    def subgradient(self, ctrl, rows):
        """SUBGRADIENT: set every block's w (and b), return per block [loss sum, sum_j l'(z_j) x_j (, sum_j l'(z_j))]
        (n_blocks x (width + 1))."""
        with_b = engine.intercept_mode(self.config) == "explicit"
        self.w = np.ascontiguousarray(rows[:, :self.d]) if with_b else rows
        if with_b:
            self.b = rows[:, self.d].copy()
        out = np.zeros((len(self.blocks), ctrl.width + 1))
        for k, blk in enumerate(self.blocks):
            with self.working_on(blk, ctrl.round):
                values, dz = loss_and_derivative(self.config.loss, blk.decision(self.w[k]) + self.b[k], blk.y,
                                                 self.config.gamma)
                out[k, 0] = values.sum()
                out[k, 1:self.d + 1] = blk.rmatvec(dz)      # sum_j l'(z_j) x_j
                if with_b:
                    out[k, self.d + 1] = dz.sum()           # the intercept's subgradient
                if nan_fault(ctrl.round, blk.task):
                    out[k, 0] = np.nan
        return out


class SubgradientHistory:
    COLUMNS = ("round", "objective", "best_objective", "selected", "seconds", "bytes")

    def __init__(self):
        self.rows = {k: [] for k in self.COLUMNS}

    def record(self, **row):
        for k in self.COLUMNS:
            self.rows[k].append(row[k])
        return row

    def arrays(self):
        return {k: np.asarray(v) for k, v in self.rows.items()}


class Server(ServerBase):
    """Holds W and the best iterate; one projected subgradient step per round.

    With several radii (a regularization path) it solves them in the given
    order, each warm-started from the previous solution, without reloading data.
    """

    def __init__(self, cluster, source, config: JointSparseConfig, W0=None, progress=None, checkpointer=None,
                 test=False, radii=None, b0=None):
        super().__init__(cluster, source, progress, checkpointer)
        self.config = config
        self.radii = [config.radius] if radii is None else [float(r) for r in radii]
        self.path = {"radius": [], "objective": [], "selected": [], "l1inf_norm": [], "W": [], "intercept": []}
        self.d = config.rff_dim or source.n_features
        self.W = np.zeros((self.d, self.m)) if W0 is None else np.array(W0, dtype=np.float64)
        self.W_best = self.W.copy()
        self.with_b = engine.intercept_mode(config) == "explicit"
        # the unpenalized intercepts (zeros without fit_intercept)
        self.b = np.zeros(self.m) if b0 is None or not self.with_b else np.array(b0, dtype=np.float64)
        self.b_best = self.b.copy()
        self.best = np.inf
        self.t = 0                    # rounds at the current radius
        self.k = 0                    # index of the current radius
        self.history = SubgradientHistory()
        self.want_test = test
        self.test = None
        self.project = PROJECTIONS[config.projection]

    def evaluate(self):
        """Objective and subgradient at the current W (and b) (one round trip); the intercepts' subgradient
        is the last row of G when there are intercepts."""
        columns = np.hstack([self.W.T, self.b[:, None]]) if self.with_b else self.W.T
        rows = self.per_task(self.command(JointSparseCommand.SUBGRADIENT, payload=columns[self.block_task],
                                          round=self.round, width=columns.shape[1]))
        # before any comparison with the best objective (every comparison with NaN is false)
        check_finite_rows(rows[:, :1], self.round, self.names, "loss sum", None)
        check_finite_rows(rows[:, 1:], self.round, self.names, "subgradient", None)
        objective = float(np.sum(rows[:, 0] / self.n))
        G = (rows[:, 1:] / self.n[:, None]).T                       # d (+ 1) x m, column i from task i
        return objective, G

    def note(self, objective):
        if objective < self.best:
            self.best = objective
            self.W_best = self.W.copy()
            self.b_best = self.b.copy()
        row = self.history.record(round=self.round, radius=self.radii[self.k], objective=objective,
                                  best_objective=self.best,
                                  selected=int(np.count_nonzero(np.abs(self.W).max(axis=1))),
                                  seconds=self.elapsed(), bytes=self.cluster.bytes_moved)
        if self.progress is not None:
            self.progress(row)

    def solve(self, radius):
        """max_rounds projected subgradient steps in the ball of this radius; W becomes the best iterate."""
        cfg = self.config
        self.W = self.project(self.W, radius)
        while self.t < cfg.max_rounds:
            self.t += 1
            self.round += 1
            objective, G = self.evaluate()
            self.note(objective)
            eta = cfg.eta0 / np.sqrt(self.t)
            if self.with_b:
                # unpenalized: stepped with its own rate, never projected
                self.b = self.b - cfg.intercept_eta0 / np.sqrt(self.t) * G[-1]
                G = G[:-1]
            self.W = self.project(self.W - eta * G, radius)
            check_finite_rows(self.W.T, self.round, self.names, "W column", None)
            self.safe_point()
        objective, _ = self.evaluate()                                # the last iterate counts too
        self.note(objective)
        self.W, self.b = self.W_best, self.b_best

    def run(self, resume=None):
        if resume is not None:
            self.restore(resume())
        while self.k < len(self.radii):
            radius = self.radii[self.k]
            self.solve(radius)
            for key, value in (("radius", radius), ("objective", self.best), ("W", self.W.copy()),
                               ("intercept", self.b.copy()),
                               ("selected", int(np.count_nonzero(np.abs(self.W).max(axis=1)))),
                               ("l1inf_norm", l1inf_norm(self.W))):
                self.path[key].append(value)
            self.radius_solved()
            self.k += 1
            self.t, self.best = 0, np.inf                            # the next radius starts from this W
        if self.want_test:
            self.test = self.test_metrics(not LOSSES[self.config.loss].binary_labels)
        return True

    def radius_solved(self):
        """Called after each radius of the path, W and b at its best iterate (a hook: nothing here)."""

    def checkpoint_state(self):
        arrays = {"W": self.W, "W_best": self.W_best, "b": self.b, "b_best": self.b_best}
        arrays.update({f"history_{k}": np.asarray(v) for k, v in self.history.rows.items()})
        arrays.update({f"path_{k}": np.asarray(v) for k, v in self.path.items()})
        counters = {"round": self.round, "t": self.t, "k": self.k, "best": self.best, "radii": self.radii,
                    "seconds": self.elapsed(), "bytes": self.cluster.bytes_moved}
        return arrays, [], counters

    def restore(self, ck):
        a, c = ck["arrays"], ck["counters"]
        if [float(r) for r in c["radii"]] != self.radii:
            raise InputError(f"{ck['path']}: cannot resume: the checkpoint's radii {c['radii']} differ from {self.radii}")
        self.W, self.W_best = a["W"].copy(), a["W_best"].copy()
        self.b = np.asarray(a.get("b", np.zeros(self.m)), dtype=np.float64).copy()
        self.b_best = np.asarray(a.get("b_best", np.zeros(self.m)), dtype=np.float64).copy()
        for k in SubgradientHistory.COLUMNS:
            self.history.rows[k] = list(a[f"history_{k}"])
        for k in self.path:
            self.path[k] = list(a.get(f"path_{k}", []))
        self.round, self.t, self.k, self.best = int(c["round"]), int(c["t"]), int(c["k"]), float(c["best"])
        self.seconds_before, self.cluster.bytes_moved = float(c["seconds"]), int(c["bytes"])


@dataclass
class JointSparseResult(RunResult):
    # W is the best iterate at the last radius
    path: dict                     # per radius: radius, objective, selected, l1inf_norm, W, intercept
    test: dict | None = None
    intercept: np.ndarray | None = None   # m unpenalized intercepts of W (zeros without fit_intercept)
    extra: dict = dataclasses.field(default_factory=dict)


def train(cluster, source, config: JointSparseConfig, test_source=None, W0=None, progress=None,
          checkpointer=None, resume=None, radii=None, b0=None, make_local=None, server_class=None):
    """Projected subgradient on every rank; the server returns a JointSparseResult.

    ``radii``: a regularization path (solved in the given order, each radius
    warm-started from the previous solution); default ``[config.radius]``.
    ``W0`` / ``b0`` (server): the starting W and intercepts.  The hooks of
    :mod:`hpcmtl.model_selection`: ``make_local()`` returns this rank's local
    state over blocks already in memory (default: read them), ``server_class``
    replaces :class:`Server` (same arguments).
    """
    from .checkpoint import read_compatible
    config.validate()
    if radii is not None and (len(radii) == 0 or any(not (float(r) > 0) for r in radii)):
        raise InputError(f"the regularization path needs radii > 0, got {list(radii)}")

    make_local = make_local or engine.local_reader(LocalGradients, cluster, source, config, test_source)

    def make_server(cluster):          # the planned cluster the local state was read under
        return (server_class or Server)(cluster, source, config, W0, progress, checkpointer,
                                        test=test_source is not None, radii=radii, b0=b0)

    def result(server, _, extra):
        return JointSparseResult(W=server.W.copy(), intercept=server.b.copy(), history=server.history.arrays(),
                                 config=config.to_dict(),
                                 task_names=server.names, n_rounds=server.round, seconds=server.elapsed(),
                                 bytes_moved=cluster.bytes_moved, test=server.test,
                                 path={k: np.asarray(v) for k, v in server.path.items()}, extra=extra)

    state = None if resume is None else (lambda: read_compatible(resume, config, source))
    return engine.train(cluster, make_local, make_server, result, state)
