"""Settings and result of one DMTRL run, and the solver-choice predicates that read the settings.

:class:`DMTRLConfig` (validated against :data:`hpcmtl.params.PARAMS`), :class:`TrainResult`,
:class:`DMTRLConvergenceWarning`, and which local solver / step rule a run uses
(:func:`uses_exact_solver`, :func:`uses_exact_box_solver`, :func:`uses_interior_point`,
:func:`uses_momentum`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .. import interior
from ..errors import InputError
from ..params import check_positive_label, validate as check_params

EXACT_MAX_FEATURES = 2048       # auto: exact squared-loss subproblems up to this many features
# auto: exact hinge / smoothed-hinge subproblems (a box QP over the block's dual variables) for blocks of at most this
# many rows; the QP's n x n matrix exists only during the step (timings: docs/dmtrl-notes.md)
EXACT_BOX_ROWS = 64


class DMTRLConvergenceWarning(UserWarning):
    """A W-step ended at max_rounds above its tolerance: that W is not certified at tol."""


@dataclass
class DMTRLConfig:
    """Settings of one training run (validated by :meth:`validate`)."""
    loss: str = "hinge"
    lam: float = 1e-3
    gamma: float = 1.0              # smoothed-hinge parameter
    tol: float = 1e-6               # relative duality gap of each W-step
    max_rounds: int = 500           # rounds per W-step, then a budget that follows the gap (outer.round_budget)
    outer: int = 30                 # maximum W-steps (learned Sigma)
    outer_tol: float = 2e-4         # joint relative duality gap of the learned-Sigma problem (dmtrl.joint)
    local_iters: float = 1.0        # H as a multiple of each block's rows
    local_steps: int = 100          # local rounds: at most this many local steps a block a round (LocalBlocks.local_round)
    seed: int = 0
    eta: float = 1.0                # safe aggregation: the step; other aggregations: the largest step
    gap_every: int = 1              # compute the gap every k rounds
    relationship: str = "learned"
    eig_floor: float = 1e-8         # eigenvalues of (W^T W)^(1/2) floored at this fraction of the largest
    rff_dim: int = 0                # random Fourier features (0 = linear)
    rff_gamma: float = 1.0
    split_tasks: bool = False       # split tasks larger than a worker's share over several workers
    float32: bool = False           # features rounded to float32 as they are read (engine.load_blocks)
    fit_intercept: bool = True      # per-task intercepts (squared: centering, exact; others: augmented feature)
    intercept_scaling: float = 1.0  # the augmented feature's value (hinge, smoothed hinge, logistic)
    shrinking: bool = True          # liblinear-style shrinking in local SDCA (hinge, smoothed hinge)
    aggregation: str = "qp"         # qp | adaptive | line | safe (Lemma 6.7, the paper's rule)
    local_solver: str = "auto"      # sdca | exact (squared loss: the local subproblem solved exactly) | auto
    exchange: str = "auto"          # auto: W-steps under a diagonal Sigma run on the workers alone | dense
    method: str = "dmtrl"
    positive_label: float | None = None     # classification: this label is +1, the other class -1

    def validate(self, owner="DMTRL"):
        """Every field against :data:`hpcmtl.params.PARAMS`, then the rules coupling two fields."""
        def bad(name, rule, value):
            raise InputError(f"The '{name}' parameter of {owner} must be {rule}. Got {value!r} instead.")
        self._check(("loss", "relationship", "aggregation", "local_solver", "exchange"), owner)
        if self.local_solver == "exact" and self.aggregation == "safe":
            bad("local_solver", "'sdca' or 'auto' with the safe aggregation (the paper's local SDCA)", self.local_solver)
        if self.local_solver == "exact" and self.loss != "squared":
            bad("local_solver", "'sdca' or 'auto' for the " + self.loss + " loss ('exact' solves squared-loss "
                "subproblems)", self.local_solver)
        self._check(("lam", "tol", "local_iters", "local_steps", "eta", "gamma", "eig_floor", "outer_tol", "max_rounds", "outer",
                     "gap_every", "rff_dim") + (("rff_gamma",) if self.rff_dim else ())
                    + ("seed", "split_tasks", "float32", "shrinking", "fit_intercept", "intercept_scaling"), owner)
        self.positive_label = check_positive_label(self.positive_label, self.loss, owner)
        return self

    def _check(self, names, owner):
        """validate() these fields; NumPy scalars become Python numbers."""
        for name, value in check_params({n: getattr(self, n) for n in names}, owner).items():
            setattr(self, name, value)

    def to_dict(self):
        return asdict(self)


@dataclass
class TrainResult:
    W: np.ndarray                   # d x m (without the augmented intercept row)
    Sigma: object                   # m x m array; a learned Sigma of many tasks (sigma.FACTORED_MIN_TASKS on):
                                    # hpcmtl.covariance.SigmaFactors (V, s, c), never the m x m array
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
    wsteps: dict = field(default_factory=dict)   # per W-step: outer, round (last), rel_gap, converged
    intercept: np.ndarray | None = None          # m per-task intercepts (zeros without fit_intercept)


def uses_exact_solver(config, d) -> bool:
    """Squared-loss subproblems are solved exactly ('exact', or 'auto' with at most EXACT_MAX_FEATURES
    features and an aggregation other than the paper's 'safe' rule); otherwise local SDCA."""
    if config.local_solver == "exact":
        return True
    return (config.local_solver == "auto" and config.loss == "squared" and config.aggregation != "safe"
            and d <= EXACT_MAX_FEATURES)


def uses_exact_box_solver(config, n_rows) -> bool:
    """Hinge and smoothed-hinge subproblems of a block of at most EXACT_BOX_ROWS rows are solved exactly
    ('auto', an aggregation other than the paper's 'safe' rule); otherwise local SDCA."""
    return (config.local_solver == "auto" and config.loss in ("hinge", "smoothed-hinge")
            and config.aggregation != "safe" and 0 < n_rows <= EXACT_BOX_ROWS)


def uses_interior_point(config, d, m, coupled=True) -> bool:
    """Hinge (smoothed hinge) W-steps may take interior-point rounds (:mod:`hpcmtl.interior`): 'auto' local
    solver, the 'qp' or 'adaptive' aggregation, ``d <= interior.MAX_FEATURES``, ``m d (d + 1) / 2 <=
    interior.MAX_SYSTEM_VALUES`` and, under a ``coupled`` Sigma, ``d m <= interior.MAX_WIDTH`` (d with the
    intercept feature).  When they do: :meth:`Server.interior_point_due`."""
    return (config.local_solver == "auto" and config.loss in ("hinge", "smoothed-hinge")
            and config.aggregation in ("qp", "adaptive") and d <= interior.MAX_FEATURES
            and m * d * (d + 1) // 2 <= interior.MAX_SYSTEM_VALUES
            and (not coupled or d * m <= interior.MAX_WIDTH))


def uses_momentum(config) -> str | None:
    """Per-task steps also along each task's previous step p_i (momentum); None for 'safe' and 'line'.

    ``'free'`` (squared loss, no box): the dual along ``alpha + eta_i delta_i +
    beta_i p_i`` is an exact concave quadratic in ``(eta, beta)``, maximized
    without bounds: at least as good a step as block-Jacobi preconditioned
    conjugate gradients.  ``'box'`` (hinge, smoothed hinge, logistic): p_i
    keeps only the coordinates that can move a whole further step inside the
    box, ``beta_max`` is how far it can go, and the steps stay in
    ``eta <= 1/2, beta <= beta_max / 2``, feasible by convexity."""
    if config.aggregation not in ("qp", "adaptive"):
        return None
    return "free" if config.loss == "squared" else "box"
