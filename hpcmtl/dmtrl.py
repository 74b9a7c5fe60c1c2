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

Aggregation (how the workers' local steps are combined; every choice keeps the
certificate: P and D are computed exactly from alpha and B, and D never decreases):

* ``safe``: the paper's rule.  Local subproblems use Lemma 6.7's rho and every
  step is applied with the fixed ``eta``.
* ``qp`` (the default) / ``adaptive`` / ``line``: workers solve their local
  subproblems with an optimistic per-task ``rho_i`` (start 1; 'qp': :func:`coupled_rho`) and keep the step
  ``delta_alpha`` pending; they send ``delta b`` plus two per-task scalars of the
  conjugate along the step.  Along per-task steps ``eta in [0, 1]^m``
  (the box stays feasible by convexity) the dual is exactly the concave quadratic::

      D(alpha + eta o delta) - D(alpha) = g . eta - eta^T A eta / 2,
      g_i = -w_i . db_i - c1_i / n_i,   A = (Sigma o dB^T dB) / lam + diag(c2_i / n_i)

  with ``sum_j l*(-(a_j + e delta_j)) = sum_j l*(-a_j) + e c1 + e^2 c2 / 2`` (hinge:
  ``c1 = -sum y delta``; smoothed hinge: ``c1 = sum (gamma a - y) delta``,
  ``c2 = gamma sum delta^2``; squared: ``c1 = sum (a - y) delta``, ``c2 = sum
  delta^2``; logistic: the chord ``c1 = sum l*(-(a + delta)) - l*(-a)``, ``c2 = 0``,
  an upper bound of the convex conjugate, so the model is a lower bound of D).
  The server maximizes it over the box (``qp``, ``adaptive``) or over one common
  eta (``line``), applies ``B += dB diag(eta)`` and sends each block its eta with
  w_i; workers apply ``alpha += eta_i delta_alpha``.  ``adaptive`` also moves
  each ``rho_i`` between 1 and the task's own Lemma 6.7 bound: up when its step
  had to be shortened, down when it was taken whole.  ``qp`` and ``adaptive``
  add momentum: each task's previous step p_i is a second direction (squared
  loss: unbounded, an exact block-Jacobi preconditioned subspace step; box
  losses: p_i kept where a whole further step stays feasible, steps bounded so
  that the combination stays in the box; see :func:`uses_momentum`), and
  squared-loss subproblems are solved exactly (:meth:`LocalBlocks.exact_step`).
  Server work per round: ``[dB, dP]^T [dB, dP]`` (O(d m^2), the order of
  ``W = B Sigma / lam``; on sparse task supports O(sum_f c_f^2), c_f the tasks
  whose support holds feature f: :mod:`hpcmtl.taskspace`) and a QP over m or
  2m numbers; traffic: one or two
  d-vectors and a few scalars a block up, one d-vector and 3 scalars down.

Relationship modes: ``learned`` (DMTRL), ``identity`` (STL: Sigma fixed at I/m)
and ``fixed`` (a user-given Sigma, e.g. a graph kernel).
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np

from . import _blockops, _box_qp, _sdca
from . import engine
from . import interior
from .checkpoint import BlockState, block_payloads, read_compatible
from .engine import Command, Down, EngineCommand, LocalBase, ServerBase, Up, check_finite_rows, nan_fault
from .errors import ConvergenceError, InputError
from .losses import conjugate_reference, get_loss, primal_reference
from .params import AGGREGATIONS, LOCAL_SOLVERS, RELATIONSHIPS  # noqa: F401 - the choices, named here too
from .params import check_positive_label, validate as check_params
from .taskspace import DENSE, DenseSpace, SupportSpace, support_algebra_pays, task_supports
EXACT_MAX_FEATURES = 2048       # auto: exact squared-loss subproblems up to this many features
# auto: exact hinge / smoothed-hinge subproblems (a box QP over the block's dual variables) for blocks of at most this
# many rows; the QP's n x n matrix exists only during the step.  The QP from zero (a W-step's first round) on raw rows
# of rank 10 (measured, _kernels.box_qp, KKT to 1e-12): 30 rows 2.9 ms, 60 rows 33 ms, 120 rows 143 ms, 256 rows
# 5.9 s; warm-started from the last round's alpha 0.03 / 0.06 / 0.13 / 0.5 ms
EXACT_BOX_ROWS = 64
# pending local steps (aggregations other than 'safe'): every block's shrinking restarts every this many local steps.
# liblinear's own restart (the active set's projected gradients within eps) assumes each pass continues the last
# one's iterate; here only eta of each step is applied, and measured on syn2 with a learned Sigma the active sets
# froze for hundreds of rounds with the dual still to 3e-4 of the optimum
UNSHRINK_EVERY = 20



class DMTRLCommand(Command):
    """DMTRL's messages: ``ID = id, down, up, control fields, computation (a LocalBlocks method)[, up_if]``."""
    # local SDCA on every block -> delta b per block (n_blocks x d)
    SDCA = 1, Down.NOTHING, Up.GATHER_ROWS, ("round", "width"), "sdca"
    # every block's w column; with_objective: -> per block (loss sum, conjugate sum)
    SET_W = 2, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("with_objective", "width"), "set_w", "with_objective"
    # sigma_ii per task and rho (width = m + 1)
    SET_SIGMA = 3, Down.BCAST, Up.NOTHING, ("m", "width"), "set_sigma"
    # every block's BlockState (alpha, coordinate order, shrinking state), per rank (checkpoint)
    GET_STATE = 4, Down.NOTHING, Up.GATHER_VECTORS, (), "get_state"
    # the same, back (resume)
    SET_STATE = 5, Down.SCATTER_VECTORS, Up.NOTHING, (), "set_state"
    # local SDCA kept pending -> per block [delta b, c1, c2] (momentum: more, see LocalBlocks.trial)
    TRIAL = 6, Down.NOTHING, Up.GATHER_ROWS, ("round", "width"), "trial"
    # per block [w, eta, beta, rho]; with_objective: -> per block (loss sum, conjugate sum)
    APPLY = 7, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("with_objective", "width"), "apply", "with_objective"
    # every block's previous step (momentum state), per rank (checkpoint)
    GET_PREVIOUS = 8, Down.NOTHING, Up.GATHER_VECTORS, (), "get_previous"
    # the same, back (resume, and zeros after an Omega-step)
    SET_PREVIOUS = 9, Down.SCATTER_VECTORS, Up.NOTHING, (), "set_previous"
    # Sigma diagonal and every task one block (nothing couples the tasks): a whole round on the workers, each
    # block its own local step, step sizes and b, w -> per block [loss sum, conjugate sum, b.w, eta, beta]
    LOCAL_ROUND = 10, Down.NOTHING, Up.GATHER_ROWS, ("round", "with_objective", "width"), "local_round"
    # start local rounds from B = 0 (no momentum yet, rho 1): nothing to send
    RESET_LOCAL = 11, Down.NOTHING, Up.NOTHING, ("width",), "reset_local"
    # start local rounds from the server's per block [b, dP (free momentum), step, beta, rho] (a resume, a later
    # W-step under a diagonal Sigma)
    SET_LOCAL = 12, Down.SCATTER_ROWS, Up.NOTHING, ("width",), "set_local"
    # the same, back to the server (the W-step ended; a checkpoint)
    GET_LOCAL = 13, Down.NOTHING, Up.GATHER_ROWS, ("width",), "get_local"
    # sparse blocks (issue 14): every block's support, once -> per rank, per block [|S_k|, S_k] ([-1]: exchanged
    # whole, its support is every feature)
    GET_SUPPORTS = 14, Down.NOTHING, Up.GATHER_VECTORS, (), "get_supports"
    # every plan block's exchange size (|S_k|, or d) to every rank: what sizes the rounds' values-only collectives
    SET_SUPPORTS = 15, Down.BCAST, Up.NOTHING, ("width",), "set_supports"
    # SDCA, TRIAL, SET_W and APPLY with each block's d-vectors on its support only (SupportLayout): the same rows
    SDCA_ON_SUPPORT = 16, Down.NOTHING, Up.GATHER_SUPPORT, ("round", "vectors", "scalars"), "sdca_on_support"
    SET_W_ON_SUPPORT = 17, Down.SCATTER_SUPPORT, Up.GATHER_ROWS, ("with_objective", "vectors", "scalars"), \
        "set_w_on_support", "with_objective"
    TRIAL_ON_SUPPORT = 18, Down.NOTHING, Up.GATHER_SUPPORT, ("round", "vectors", "scalars"), "trial_on_support"
    APPLY_ON_SUPPORT = 19, Down.SCATTER_SUPPORT, Up.GATHER_ROWS, ("with_objective", "vectors", "scalars"), \
        "apply_on_support", "with_objective"
    # SET_LOCAL and GET_LOCAL with b (and dP) on the supports (a W-step of local rounds starts, ends; 21 is taken)
    SET_LOCAL_ON_SUPPORT = 20, Down.SCATTER_SUPPORT, Up.NOTHING, ("vectors", "scalars"), "set_local_on_support"
    GET_LOCAL_ON_SUPPORT = 22, Down.NOTHING, Up.GATHER_SUPPORT, ("vectors", "scalars"), "get_local_on_support"
    # TRIAL_ON_SUPPORT of the box momentum, one block a task, the server's dP (the B change of the step applied
    # last round, X^T p / n up to rounding) mirrored on the workers: per block [delta b on S_k, scalars], then,
    # after all of a rank's segments, per block where X^T q / n differs from dP (the rows the box removed from
    # p, and rounding above a few ulps): [c, c positions in S_k, X^T q / n there], or [-1, X^T q / n on S_k]
    # when that is shorter (see encode_direction; the variable part: a Gatherv of what each rank has)
    TRIAL_MOMENTUM_ON_SUPPORT = 23, Down.NOTHING, Up.GATHER_VECTORS, ("round", "vectors", "scalars"), \
        "trial_momentum_on_support"
    # the server's B and dP on every block's support (its workers' mirror of them: a resume, after local rounds
    # or a warm start); sent on supports only
    SET_DP_ON_SUPPORT = 24, Down.SCATTER_SUPPORT, Up.NOTHING, ("vectors", "scalars"), "set_dp_on_support"
    # interior-point W-steps (hpcmtl.interior; every task one block, dense rows): each block starts its iterate x
    # from its alpha -> per block [Z^T x / n (d), z.x + s.(1 - x)]
    IPM_START = 25, Down.NOTHING, Up.GATHER_ROWS, ("width",), "ipm_start"
    # per block [w at x (d), primal step, dual step, mu, ||K||]: the pending step taken, then -> per block
    # [G's upper triangle (d (d + 1) / 2), v (d), loss sum, conjugate sum] at the new x
    IPM_SYSTEM = 26, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("round", "width", "d"), "ipm_system"
    # per block [y_i (d), accepted]: (accepted: alpha = y o x) -> per block [Z^T dx / n (d), largest primal step,
    # largest dual step, the 4 coefficients of the complementarity after the steps]
    IPM_STEP = 27, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("width", "d"), "ipm_step"
    # [accepted]: (accepted: alpha = y o x), the iterates dropped (width = 1)
    IPM_END = 28, Down.BCAST, Up.NOTHING, ("width",), "ipm_end"
    # refinement of the Newton step: per block [K Z^T dx (the w of dx, d)] -> per block [v of its residual (d)]
    IPM_RESIDUAL = 29, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("width", "d"), "ipm_residual"
    # per block [y_i of the residual (d)]: dx corrected -> what IPM_STEP sends
    IPM_CORRECT = 30, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("width", "d"), "ipm_correct"
    # a box-loss W-step near its end or stalled (every task one block, dense task arrays): per block [c (d), loss
    # sums at w + s c for s in POLISH_SCALES, c . b (local: the block's own b; else 0)], c the least-squares
    # change of w that puts the free rows on their margins (margin_correction); nothing changes on the workers
    POLISH = 36, Down.NOTHING, Up.GATHER_ROWS, ("width", "d", "local"), "polish"


ON_SUPPORT = {DMTRLCommand.SDCA: DMTRLCommand.SDCA_ON_SUPPORT, DMTRLCommand.SET_W: DMTRLCommand.SET_W_ON_SUPPORT,
              DMTRLCommand.TRIAL: DMTRLCommand.TRIAL_ON_SUPPORT, DMTRLCommand.APPLY: DMTRLCommand.APPLY_ON_SUPPORT,
              DMTRLCommand.SET_LOCAL: DMTRLCommand.SET_LOCAL_ON_SUPPORT,
              DMTRLCommand.GET_LOCAL: DMTRLCommand.GET_LOCAL_ON_SUPPORT}


def exchange_index(block, d):
    """The features a block's d-vectors travel on: its support when some feature is outside it (``|S| < d``),
    else None (the block is exchanged whole: dense rows, or sparse rows that touch every feature).  Any
    feature outside saves 16 bytes a round against one gather of ``|S|`` numbers a vector, so a support of
    0.9 d travels as one (issue 14's MDS domains: 1.08x fewer bytes than whole)."""
    support = block.support
    return support if support.size < d else None


class SupportLayout:
    """Where each block's numbers sit in the flat buffer of a support collective (issue 14).

    ``index``: per block (plan order; a worker: its own blocks), the sorted feature ids its d-vectors travel
    on (all d for a block exchanged whole).  A block's segment is ``[v_1 on S_k, ..., v_V on S_k, scalars]``:
    its rows ``[v_1, ..., v_V, scalars]`` (V d-vectors then the scalars, the dense commands' rows) restricted to
    S_k; segments follow in plan order, which is rank order.  :meth:`pack` and :meth:`rows` convert, the rows
    coming back with zeros off the supports: exactly the dense commands' rows where the vectors vanish there.
    """

    def __init__(self, index, d):
        self.d = int(d)
        self.index = [np.asarray(i, dtype=np.int64) for i in index]
        self.sizes = np.array([i.size for i in self.index], dtype=np.int64)
        self.row = np.repeat(np.arange(len(self.index)), self.sizes)
        self.feature = np.concatenate(self.index) if self.index else np.zeros(0, dtype=np.int64)
        self.within = np.arange(self.feature.size) - np.repeat(np.cumsum(self.sizes) - self.sizes, self.sizes)
        self._positions = {}

    def positions(self, vectors, scalars):
        """``(flat positions of the vectors' values, the same values' positions in the flattened rows,
        flat positions of the scalars, their positions in the flattened rows, total length)``."""
        key = (int(vectors), int(scalars))
        if key not in self._positions:
            width = vectors * self.d + scalars
            lengths = vectors * self.sizes + scalars
            start = np.cumsum(lengths) - lengths
            base = start[self.row] + self.within
            step = self.sizes[self.row]
            vec = np.concatenate([base + v * step for v in range(vectors)]) if vectors else np.zeros(0, np.int64)
            cell = self.row * width + self.feature
            vec_cell = np.concatenate([cell + v * self.d for v in range(vectors)]) if vectors else vec
            blocks = np.arange(len(self.index))
            scal = (start[:, None] + vectors * self.sizes[:, None] + np.arange(scalars)[None, :]).reshape(-1)
            scal_cell = (blocks[:, None] * width + vectors * self.d + np.arange(scalars)[None, :]).reshape(-1)
            self._positions[key] = (vec, vec_cell, scal, scal_cell, int(lengths.sum()))
        return self._positions[key]

    def pack(self, rows, vectors):
        """The flat values of per-block rows ``(n_blocks x (vectors d + scalars))`` on the supports."""
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        vec, vec_cell, scal, scal_cell, total = self.positions(vectors, rows.shape[1] - vectors * self.d)
        flat = np.empty(total)
        cells = rows.reshape(-1)
        flat[vec] = cells[vec_cell]
        flat[scal] = cells[scal_cell]
        return flat

    def rows(self, flat, vectors, scalars):
        """The per-block rows ``(n_blocks x (vectors d + scalars))`` of flat values, zeros off the supports."""
        vec, vec_cell, scal, scal_cell, total = self.positions(vectors, scalars)
        if flat.size != total:
            raise ValueError(f"{flat.size} support values, the layout has {total}")
        out = np.zeros((len(self.index), vectors * self.d + scalars))
        cells = out.reshape(-1)
        cells[vec_cell] = flat[vec]
        cells[scal_cell] = flat[scal]
        return out


class DMTRLConvergenceWarning(UserWarning):
    """A W-step ended at max_rounds above its tolerance: that W is not certified at tol."""


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
    wsteps: dict = field(default_factory=dict)   # per W-step: outer, round (last), rel_gap, converged
    intercept: np.ndarray | None = None          # m per-task intercepts (zeros without fit_intercept)


# ---------------------------------------------------------------------------
# Omega-step and rho (server arithmetic, public for tests)
# ---------------------------------------------------------------------------
def omega_step(W: np.ndarray, eig_floor: float = 1e-8) -> np.ndarray:
    """``Sigma = (W^T W)^(1/2) / tr((W^T W)^(1/2))`` with an eigenvalue floor.

    Eigenvalues of the square root below ``eig_floor`` times the largest are
    raised to that floor, so Sigma stays positive definite and Omega exists.
    An all-zero W gives ``I / m``.
    """
    return omega_from_gram(W.T @ W, eig_floor)


def omega_from_gram(G: np.ndarray, eig_floor: float = 1e-8) -> np.ndarray:
    """:func:`omega_step` from ``G = W^T W`` (m x m): the server on task supports forms it as
    ``Sigma (B^T B) Sigma / lam^2`` without a dense W."""
    m = G.shape[0]
    evals, evecs = np.linalg.eigh(G)
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


def task_rho_bounds(Sigma: np.ndarray, blocks_per_task=None) -> np.ndarray:
    """Per-task Lemma 6.7 bounds ``(sum_i' s_i' |sigma_ii'|) / sigma_ii`` (their maximum is :func:`safe_rho`).

    ``tr(dB Sigma dB^T) <= sum_i bound_i sigma_ii ||db_i||^2`` (Gershgorin on
    ``Sigma o dB^T dB``), so a task whose local subproblem uses its own bound
    never needs a step below 1; the adaptive aggregation keeps rho_i in [1, bound_i].
    """
    A = np.abs(Sigma)
    s = np.ones(Sigma.shape[0]) if blocks_per_task is None else np.asarray(blocks_per_task, float)
    return (A @ s) / np.diag(Sigma)


def coupled_rho(Sigma: np.ndarray) -> np.ndarray:
    """The 'qp' aggregation's per-task rho_i under a task covariance: ``max(1/2, s_i)``, 1 when Sigma is diagonal.

    ``s_i = 1 / (sigma_ii (Sigma^-1)_ii)`` in (0, 1] is the curvature of task i's
    direction when the other tasks' b follow optimally (the Schur complement) relative
    to sigma_ii, its curvature alone (rho = 1).  The server's steps can shorten a local
    step (eta <= 1) but never lengthen it, so a local model stiffer than the coupled
    dual in the directions that separate related tasks wastes rounds; the steps shorten
    what a softer model overshoots along the tasks' common direction.  Measured with a
    learned Sigma (bench_convergence's mds, P = 1, 10 W-steps): 228 rounds against 311
    with rho 1 (``(1 + s_i) / 2``: 234); one fixed rho for every task before the local
    steps and restarts of shrinking: 0.25: 252, 0.35: 245, 0.5: 224, 0.7: 260, 1: 358,
    s_i: 273.  Fewer rounds on syn1, syn2 and the small-task case too.
    """
    m = Sigma.shape[0]
    if interior.is_diagonal(Sigma):
        return np.ones(m)
    s = 1.0 / (np.diag(Sigma) * np.diag(np.linalg.inv(Sigma)))
    return np.clip(s, 0.5, 1.0)


COUPLED_PASSES_MAX = 2     # 'qp': at most this many local passes a round for a task the others hardly explain
UNCOUPLED_PASSES = 2       # 'qp': local passes a step for a task nothing couples (a diagonal Sigma: rho = 1)


def coupled_passes(rho: float) -> int:
    """Local SDCA passes a round for a task with the 'qp' rho ``max(1/2, s_i)`` (:func:`coupled_rho`):
    ``floor(1 / (2 (1 - s_i)))`` in ``[1, COUPLED_PASSES_MAX]`` while s_i < 1.  A task nothing couples
    (rho = 1, a diagonal Sigma) takes ``UNCOUPLED_PASSES`` a local step, in a local round's steps and in the
    exchanged rounds that remain (``--exchange dense``, the squared loss's SDCA), so one local step a round
    (``--local-steps 1``) is still an exchanged round.  Its local problem is then the whole problem, so every
    pass is dual ascent; a step of two passes lets liblinear's shrinking work on its own second pass, and
    the gap (a pass over the rows for the losses) and the step's exact sizes come in fewer steps.
    Measured on the first W-step of MNIST (10 tasks, P = 1): one pass 52 steps a task, 5.1e6 coordinate
    steps, 16.4 s; two passes 12.5 steps, 2.0e6, 5.2 s; four 6.9 steps, 2.1e6, 4.9 s.  Whole runs (10
    W-steps, tol 1e-6, P = 1, rounds / s, one pass -> two -> four): MNIST 72 / 60.8 -> 70 / 45.2 -> 67 /
    43.2, syn1 529 / 11.0 -> 523 / 9.3 -> 526 / 8.6, syn2 781 / 14.5 -> 778 / 13.4 -> 788 / 12.9, small
    1,426 / 16.2 -> 1,446 / 14.7 -> 1,468 / 14.9, mds 200 / 1.35 -> 210 / 1.31 -> 203 / 1.38.

    ``1 - s_i`` is how much of task i's variance under Sigma the other tasks explain.  Where that is small the
    local subproblem (the other tasks' b fixed) is nearly the coupled dual's own block, so solving it further
    before an exchange is work the next rounds would otherwise repeat; the server's steps (eta <= 1) cut back
    what the coupling makes too long, so the certificate and dual ascent are unchanged.  Strongly related
    tasks (s_i <= 3/4) keep one pass.  Measured (bench_convergence, P = 3, 10 W-steps, tol 1e-6) on MNIST
    (s_i 0.89-0.96, dense rows then): one pass 226 rounds / 61 s, 4 passes 66 / 29 s, 5-8 passes (a cap of
    8) 55 / 51 s.  With the later local solver (CSR rows, UNCOUPLED_PASSES), seeds 0, 1, 2, P = 3, rounds /
    s: a cap of 4 70 / 10.4, 73 / 10.2, 66 / 9.6; a cap of 2 71 / 8.8, 71 / 8.4, 77 / 8.8 (median -13 %
    seconds, about the same rounds; a cap of 3 was worse than both, 87 rounds, dense rows at P = 1).  The
    late W-steps take 3 rounds each whatever the cap, so passes beyond 2 are work the certificate does not
    need there.  Synthetic 1 and 2, the small tasks and School (every s_i < 5/6, or the exact
    solver) are bitwise unchanged by the cap; MDS 210 -> 212 rounds, the same seconds.
    """
    if rho >= 1.0:
        return UNCOUPLED_PASSES
    return int(min(COUPLED_PASSES_MAX, max(1.0, np.floor(0.5 / (1.0 - rho)))))


QP_ITERATIONS = 60


def box_qp(A: np.ndarray, g: np.ndarray, upper, start=None, max_iter: int = QP_ITERATIONS,
           rtol: float = 1e-12) -> np.ndarray:
    """``argmax_x g.x - x.A.x / 2`` over ``0 <= x <= upper`` (A symmetric positive semidefinite; upper >= 0,
    a number or one per coordinate).

    An active-set Newton method: coordinates at a bound whose gradient points
    out of the box are held; the Newton step on the others (Cholesky; a
    pseudo-inverse, or the ray along which the objective is linear, when the
    free block is singular: its eigendecomposition by cyclic Jacobi rotations) is
    tried projected onto the box, which may change many bounds at once, and when
    that does not gain, taken up to the first bound it meets, which always gains.
    Starts from the best of 0, every coordinate alone (scaled back as a whole) and
    ``start`` (the previous round's answer: few iterations when the active set
    barely moves).  Deterministic (fixed operations in a fixed order); never worse
    than 0.  The iterations run in ``_kernels.box_qp`` (a NumPy reference of the
    same method is ``tests/reference.py::box_qp_reference``): on small tasks the
    server's QP over m or 2m steps is most of a round, and NumPy's per-call cost
    made it 6x the whole safe round.
    """
    g = np.ascontiguousarray(g, dtype=np.float64).reshape(-1)
    m = g.size
    x = np.zeros(m)
    if m == 0:
        return x
    A = np.ascontiguousarray(A, dtype=np.float64)
    upper = np.full(m, float(upper)) if np.ndim(upper) == 0 else np.ascontiguousarray(upper, dtype=np.float64)
    use_start = start is not None and np.shape(start) == (m,) and bool(np.isfinite(start).all())
    start = np.ascontiguousarray(start, dtype=np.float64) if use_start else upper
    _box_qp.box_qp(A, g, upper, start, use_start, x, max_iter, rtol)
    return x


class OuterState:
    """Where the outer loop is: the current outer step, the previous W-step's objective, each W-step's status."""

    def __init__(self, p=0, previous=None, wsteps=None):
        self.p = p
        self.previous = previous
        self.wsteps = list(wsteps or [])     # dicts: outer, round (last), rel_gap, converged

    def wstep_arrays(self):
        keys = ("outer", "round", "rel_gap", "converged")
        return {k: np.asarray([w[k] for w in self.wsteps], dtype=np.float64 if k == "rel_gap" else np.int64)
                for k in keys}


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


def alternate(config, w_step, omega_update, state: OuterState | None = None, warn=None):
    """The outer loop of Algorithm 1, shared by DMTRL and the centralized baselines.

    ``w_step(p)`` returns ``(last history row, converged)``; ``omega_update()``
    replaces Sigma.  Stops after a W-step when relationships are not learned,
    after ``config.outer`` W-steps, or when the objective changed by at most
    ``outer_tol`` relative to the previous W-step.  Always ends on a W-step, so
    the returned W is certified for the returned Sigma.  ``state`` lets a
    resumed run continue where a checkpoint left the loop.  Every W-step's
    status is kept in ``state.wsteps``; ``warn(message)`` hears of each one that
    ended unconverged.  Returns True when every W-step converged.
    """
    state = state or OuterState()
    warn = warn if warn is not None else (lambda msg: warnings.warn(msg, DMTRLConvergenceWarning, stacklevel=3))
    while state.p < config.outer:
        row, converged = w_step(state.p)
        objective = row["primal"]
        step = {"outer": int(state.p), "round": int(row["round"]), "rel_gap": float(row["rel_gap"]),
                "converged": int(bool(converged))}
        state.wsteps.append(step)
        if not converged:
            warn(unconverged_message(step, config, row.get("stalled_since")))
        if not np.isfinite(objective):
            raise ConvergenceError(f"non-finite objective {objective} after W-step {state.p + 1}")
        if (config.relationship != "learned" or state.p + 1 == config.outer or
                (state.previous is not None and abs(objective - state.previous) <= config.outer_tol * abs(objective))):
            break
        state.previous = objective
        state.p += 1
        omega_update()
    return all(w["converged"] for w in state.wsteps)


def block_seed(seed: int, task: int, part: int, round_: int, inner: int = 0) -> int:
    """The 64-bit seed of one block's coordinate stream in one round (``inner``: its local step in that round,
    ``local_steps``)."""
    key = [seed, task, part, round_] + ([inner] if inner else [])
    return int(np.random.SeedSequence(key).generate_state(1, dtype=np.uint64)[0])


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


# ---------------------------------------------------------------------------
# Worker side: the blocks a rank owns and the computations of its commands
# ---------------------------------------------------------------------------
class LocalBlocks(LocalBase):
    """A rank's task blocks with their dual variables and current w columns.

    Each method named by a :class:`DMTRLCommand` is the worker-side computation of
    that command on this rank's blocks: ``(ctrl, inputs) -> rows`` (or None),
    with the collectives left to the engine.

    With the support exchange (``exchange='auto'``) a block exchanged on its support S_k
    (:func:`exchange_index`) is also computed on it (issue 14): its columns are renumbered
    ``0 .. |S_k| - 1`` at construction (:meth:`TaskBlock.on_features`), and its w, its local
    steps and its local-round state are vectors of ``|S_k|`` numbers, never d.  The support
    commands' values are then these vectors as they are; the dense commands' rows are
    converted at the boundary (:meth:`dense_rows`, :meth:`from_rows`).  ``features[k]`` is S_k
    (None: the block keeps all d columns).
    """

    COMMANDS = (EngineCommand, DMTRLCommand)

    def __init__(self, cluster, blocks, config: DMTRLConfig, test_blocks=None, consume=False):
        """``consume``: the caller hands ``blocks`` over (its list then holds this rank's blocks as computed
        on): each block computed on its support replaces the one read in that list at once, so the two are
        never all in memory together.  Otherwise the caller's blocks are left as they are (model selection
        builds several local states over the same blocks)."""
        super().__init__(cluster, list(blocks), config, test_blocks)
        on_support = config.exchange == "auto"
        self.exact = uses_exact_solver(config, self.d)
        self.exact_box = [uses_exact_box_solver(config, b.n_rows) for b in self.blocks]
        # features[k]: the block's support S_k as exchanged; columns[k]: the d features its own columns stand
        # for (None: all d).  The exact squared-loss solver keeps all d (d <= EXACT_MAX_FEATURES, its
        # eigendecomposition of X^T X in the dense exchange's bits)
        self.features = [exchange_index(b, self.d) if on_support else None for b in self.blocks]
        self.columns = [None if self.exact else f for f in self.features]
        for k, f in enumerate(self.columns):
            if f is not None:
                self.blocks[k] = self.blocks[k].on_features(f)
                if consume:
                    blocks[k] = self.blocks[k]
        self.w = [np.zeros(b.n_features) for b in self.blocks]
        self.w_dense = None       # every block's whole w row, when SET_W sent it (scores of rows off the supports)
        self.state = [BlockState(np.zeros(b.n_rows), np.arange(b.n_rows, dtype=np.int32), None) for b in self.blocks]
        self.sigma_ii = np.ones(len(self.blocks))
        self.rho = 1.0
        self.rho_block = np.ones(len(self.blocks))      # per-block rho (aggregations other than safe)
        # 'qp': blocks that are their task's only block take coupled_passes(rho) local passes (the plan: the
        # same blocks at every rank count)
        plan = cluster.blocks or self.blocks
        per_task = np.bincount([b.task for b in plan], minlength=1 + max([b.task for b in plan], default=0))
        self.whole_task = np.array([per_task[b.task] == 1 for b in self.blocks], dtype=bool)
        self.pending = [None] * len(self.blocks)        # local steps waiting for their eta
        self.momentum = uses_momentum(config)
        self.previous = [np.zeros(b.n_rows) for b in self.blocks]    # momentum: the step applied last round
        self.pending_q = [None] * len(self.blocks)                   # box momentum: this round's p'
        # box momentum on supports: the server's dP and B on each block's exchange positions (None: zero), and
        # this round's delta b and X^T q / n as the server has them, that make the next ones
        self.dp_mirror = [None] * len(self.blocks)
        self.b_mirror = [None] * len(self.blocks)
        self.pending_exchanged = [None] * len(self.blocks)
        self.gram = [None] * len(self.blocks)           # exact solver: eigendecomposition of X^T X per block
        self.local = []                                 # local rounds: each block's TaskSteps
        self.support_sizes = None                       # every plan block's exchange size (SET_SUPPORTS)
        self.iterates = []                              # interior-point W-steps: every block's BlockIterate
        self.reset_shrinking()

    def extra_bytes(self):
        return sum(s.alpha.nbytes + s.order.nbytes for s in self.state)

    def reset_shrinking(self):
        """Every coordinate active again (start, and after each Omega-step changes W)."""
        for k in range(len(self.blocks)):
            self.unshrink(k)

    def unshrink(self, k):
        """Block k's coordinates all active again, its shrinking thresholds forgotten."""
        enabled = self.config.shrinking and self.loss.name in ("hinge", "smoothed-hinge")
        self.state[k].shrink = _sdca.new_shrink_state(self.blocks[k].n_rows, enabled)

    # -- a block's vectors: on its own columns inside; dense rows or support values on the wire --------------
    def dense_rows(self, parts, vectors, width):
        """Per-block ``(vectors, scalars)`` -> the dense commands' rows ``(n_blocks x width)``, ``width = vectors
        d + scalars`` (the command's: a rank without blocks knows no d), zeros off each block's support."""
        d = self.d
        out = np.zeros((len(self.blocks), width))
        for k, (vecs, sc) in enumerate(parts):
            f = self.columns[k]
            for v, vec in enumerate(vecs):
                if f is None:
                    out[k, v * d:(v + 1) * d] = vec
                else:
                    out[k, v * d + f] = vec
            out[k, vectors * d:] = sc
        return out

    def from_rows(self, rows, vectors):
        """The dense commands' rows -> per block ``(vectors on its own columns, scalars)``."""
        d = self.d
        parts = []
        for k, f in enumerate(self.columns):
            vecs = [rows[k, v * d:(v + 1) * d] for v in range(vectors)]
            parts.append(([np.ascontiguousarray(v if f is None else v[f]) for v in vecs], rows[k, vectors * d:]))
        return parts

    def support_values(self, parts):
        """Per-block ``(vectors, scalars)`` -> the support commands' flat values (SupportLayout's segments)."""
        pieces = []
        for k, (vecs, sc) in enumerate(parts):
            cut = self.features[k] is not None and self.columns[k] is None     # whole columns, sent on S_k
            pieces += [v[self.features[k]] if cut else v for v in vecs]
            pieces.append(np.asarray(sc, dtype=np.float64).reshape(-1))
        return np.concatenate(pieces) if pieces else np.zeros(0)

    def from_support(self, flat, vectors, scalars):
        """The support commands' flat values -> per block ``(vectors on its own columns, scalars)``."""
        parts, pos = [], 0
        for k, blk in enumerate(self.blocks):
            index = self.features[k]
            f = blk.n_features if index is None else index.size
            vecs = [flat[pos + v * f:pos + (v + 1) * f] for v in range(vectors)]
            if index is not None and self.columns[k] is None:      # whole columns: zeros off S_k
                vecs = [self.spread(index, v) for v in vecs]
            parts.append((vecs, flat[pos + vectors * f:pos + vectors * f + scalars]))
            pos += vectors * f + scalars
        if pos != flat.size:
            raise ValueError(f"{flat.size} support values, this rank's blocks take {pos}")
        return parts

    def full_w(self, k):
        """Block k's whole w (d numbers) for rows off its support (test rows): SET_W's row when it sent one,
        else w on the support and zero elsewhere (right under a diagonal Sigma: w_i = sigma_ii b_i / lam)."""
        if self.w_dense is not None:
            return self.w_dense[k]
        f = self.columns[k]
        return self.w[k] if f is None else self.spread(f, self.w[k])

    def spread(self, index, values):
        """A d-vector with ``values`` at ``index``, zero elsewhere."""
        full = np.zeros(self.d)
        full[index] = values
        return full

    # -- the rounds' computations --------------------------------------------------------------------------
    def sdca(self, ctrl, inputs):
        """SDCA: local SDCA on every block -> delta b per block (n_blocks x d), alpha updated."""
        return self.dense_rows([([s], ()) for s in self.sdca_steps(ctrl.round)], 1, ctrl.width)

    def sdca_steps(self, round_):
        """Local SDCA on every block: its delta b (on its own columns), alpha updated."""
        cfg = self.config
        steps = []
        for k, blk in enumerate(self.blocks):
            st = self.state[k]
            out = np.zeros(blk.n_features)
            with self.working_on(blk, round_):
                old = st.alpha.copy() if cfg.eta != 1.0 else None
                _sdca.sdca_local(blk.rows, blk.y, st.alpha, self.w[k], out, blk.sq_norms,
                                    st.order, st.shrink, self.loss.kernel_id, cfg.gamma,
                                    self.rho * self.sigma_ii[k] / cfg.lam, float(blk.n_task), cfg.local_iters,
                                    block_seed(cfg.seed, blk.task, blk.part, round_), blk.mu, blk.x_mu)
                if old is not None:   # alpha <- alpha + eta delta_alpha
                    st.alpha = old + cfg.eta * (st.alpha - old)
                    out *= cfg.eta
                if nan_fault(round_, blk.task) and out.size:
                    out[0] = np.nan
            steps.append(out)
        return steps

    def trial(self, ctrl, inputs):
        """TRIAL: local SDCA with each block's rho on a copy of alpha; the step stays pending.

        Returns per block ``[delta b (d), c1, c2]``: the conjugate along the step,
        ``sum_j l*(-(a_j + e delta_j)) - l*(-a_j) = e c1 + e^2 c2 / 2`` (exact for
        hinge, smoothed hinge and squared; the chord, an upper bound, for logistic).
        With momentum (squared loss) also ``[(a - y).p, p.p, delta.p]`` for the
        previous step p; box momentum: ``[delta b, delta q, c1, c2, c1q, c2q, cross, beta_max]``.
        """
        return self.dense_rows(self.trial_parts(ctrl.round), 2 if self.momentum == "box" else 1, ctrl.width)

    def trial_parts(self, round_, inner=0, skip=None):
        """TRIAL's computation: per block ``(vectors on its own columns, scalars)``; ``inner``: the block's local
        step in this round (local rounds take several), ``skip[k]``: block k takes none (its part is None)."""
        cfg = self.config
        parts = []
        for k, blk in enumerate(self.blocks):
            if skip is not None and skip[k]:
                parts.append(None)
                continue
            if (round_ + inner) % UNSHRINK_EVERY == 0:
                self.unshrink(k)
            st = self.state[k]
            passes = self.local_passes(k)
            with self.working_on(blk, round_):
                a = st.alpha
                c = self.rho_block[k] * self.sigma_ii[k] / cfg.lam
                if self.exact or self.exact_box[k]:
                    delta = self.exact_step(k, c) if self.exact else self.exact_box_step(k, c)
                    db = blk.rmatvec(delta) / blk.n_task
                else:
                    trial, db = a.copy(), np.zeros(blk.n_features)
                    _sdca.sdca_local(blk.rows, blk.y, trial, self.w[k], db, blk.sq_norms,
                                        st.order, st.shrink, self.loss.kernel_id, cfg.gamma, c,
                                        float(blk.n_task), passes,
                                        block_seed(cfg.seed, blk.task, blk.part, round_, inner), blk.mu, blk.x_mu)
                    delta = trial - a
                self.pending[k] = delta
                c12 = conjugate_along(self.loss.name, a, delta, blk.y, cfg.gamma)
                if self.momentum == "free":
                    p = self.previous[k]
                    vecs, scalars = [db], [*c12, float((a - blk.y) @ p), float(p @ p), float(delta @ p)]
                elif self.momentum == "box":
                    q, beta_max = box_direction(a, self.previous[k], blk.y)
                    self.pending_q[k] = q
                    vecs = [db, blk.rmatvec_sparse(q) / blk.n_task]     # q moves few rows
                    scalars = [*c12, *conjugate_two(self.loss.name, a, delta, q, beta_max, blk.y, cfg.gamma), beta_max]
                else:
                    vecs, scalars = [db], list(c12)
                scalars = np.array(scalars, dtype=np.float64)
                if nan_fault(round_, blk.task):
                    scalars[0] = np.nan
            parts.append((vecs, scalars))
        return parts

    def local_passes(self, k):
        """Block k's local SDCA work in a local step (an exchanging round's, or one of a local round's), as a
        multiple of its rows: ``--local-iters``, times :func:`coupled_passes` of its task's rho under 'qp' when
        the block is its task's only one (the blocks of a split task share one w_i: more passes on a stale w_i
        would overshoot one another)."""
        cfg = self.config
        if cfg.aggregation != "qp" or not self.whole_task[k]:
            return cfg.local_iters
        return cfg.local_iters * coupled_passes(self.rho_block[k])

    def exact_step(self, k, c):
        """The squared-loss local subproblem solved exactly (what SDCA approaches as H grows).

        Maximizes ``-sum l*(-(a + delta)) - delta^T X w - (c / (2 n)) ||X^T delta||^2``:
        ``(I + (c/n) X X^T) delta = y - a - X w``, by Woodbury through the
        block's ``X^T X = Q diag(s) Q^T`` (computed once):
        ``delta = r - X Q diag(1 / (n/c + s)) Q^T X^T r``.
        """
        blk = self.blocks[k]
        if self.gram[k] is None:
            G = blk.gram()
            self.gram[k] = np.linalg.eigh(0.5 * (G + G.T))
        s, Q = self.gram[k]
        n = float(blk.n_task)
        r = blk.y - self.state[k].alpha - blk.decision(self.w[k])
        z = Q @ ((Q.T @ blk.rmatvec(r)) / (n / c + np.maximum(s, 0.0)))
        return r - blk.decision(z)

    def exact_box_step(self, k, c):
        """The hinge (smoothed hinge) local subproblem of block k solved exactly (:func:`box_local_step`)."""
        return box_local_step(self.blocks[k], self.state[k].alpha, self.w[k], c, self.loss.name, self.config.gamma)

    def apply(self, ctrl, rows):
        """APPLY: ``[w (d), eta, beta, rho]`` per block: ``alpha += eta delta + beta p``, next rho; objective terms.

        ``delta`` is the pending local step and ``p`` the step applied in the
        previous round (momentum, squared loss; beta = 0 otherwise).
        """
        return self.apply_parts(self.from_rows(rows, 1), ctrl.with_objective)

    def apply_parts(self, parts, with_objective):
        self.w_dense = None
        for k, (vecs, sc) in enumerate(parts):
            self.w[k] = np.ascontiguousarray(vecs[0])
            self.apply_step(k, float(sc[0]), float(sc[1]), float(sc[2]))
        return self.objective_terms() if with_objective else None

    # -- the exchange on supports (issue 14): the dense commands' rows, only each block's support travels --
    def get_supports(self, ctrl, inputs):
        """GET_SUPPORTS: per block ``[|S_k|, S_k]`` (``[-1]``: exchanged whole), concatenated in plan order."""
        parts = []
        for index in self.features:
            parts += [[-1.0]] if index is None else [[float(index.size)], index.astype(np.float64)]
        return np.concatenate(parts) if parts else np.zeros(0)

    def set_supports(self, ctrl, sizes):
        """SET_SUPPORTS: every plan block's exchange size (the support collectives' counts)."""
        self.support_sizes = np.asarray(sizes, dtype=np.int64)

    def sdca_on_support(self, ctrl, inputs):
        """SDCA_ON_SUPPORT: SDCA's delta b rows, on the supports."""
        return self.support_values([([s], ()) for s in self.sdca_steps(ctrl.round)])

    def trial_on_support(self, ctrl, inputs):
        """TRIAL_ON_SUPPORT: TRIAL's rows, their d-vectors on the supports."""
        parts = self.trial_parts(ctrl.round)
        if self.momentum == "box":       # the server's dP after this step: delta b and X^T q / n as sent
            self.pending_exchanged = [tuple(self.on_exchange(k, v) for v in vecs) for k, (vecs, _) in enumerate(parts)]
        return self.support_values(parts)

    def trial_momentum_on_support(self, ctrl, inputs):
        """TRIAL_MOMENTUM_ON_SUPPORT: TRIAL_ON_SUPPORT's segments with delta b alone, then every block's
        momentum direction ``X^T q / n`` where it differs from the server's dP (:func:`encode_direction`)."""
        parts = self.trial_parts(ctrl.round)
        fixed = self.support_values([(vecs[:1], scalars) for vecs, scalars in parts])
        tails = []
        for k, (vecs, _) in enumerate(parts):
            direction = self.on_exchange(k, vecs[1])
            zero = np.zeros(direction.size)
            dp = self.dp_mirror[k] if self.dp_mirror[k] is not None else zero
            b = self.b_mirror[k] if self.b_mirror[k] is not None else zero
            sent, used = encode_direction(direction, dp, b, float(parts[k][1][-1]))
            self.pending_exchanged[k] = (self.on_exchange(k, vecs[0]), used)
            tails.append(sent)
        return np.concatenate([fixed, *tails])

    def set_dp_on_support(self, ctrl, flat):
        """SET_DP_ON_SUPPORT: the server's B and dP on each block's support, the mirrors the next directions use."""
        parts = self.from_support(flat, 2, 0)
        self.b_mirror = [self.on_exchange(k, vecs[0]).copy() for k, (vecs, _) in enumerate(parts)]
        self.dp_mirror = [self.on_exchange(k, vecs[1]).copy() for k, (vecs, _) in enumerate(parts)]

    def on_exchange(self, k, vec):
        """Block k's vector on its own columns -> its values at the exchange positions (its support as sent)."""
        return vec[self.features[k]] if self.features[k] is not None and self.columns[k] is None else vec

    def set_w_on_support(self, ctrl, flat):
        """SET_W_ON_SUPPORT: w on each block's support; objective terms."""
        self.w_dense = None
        self.w = [np.ascontiguousarray(vecs[0]) for vecs, _ in self.from_support(flat, 1, 0)]
        return self.objective_terms() if ctrl.with_objective else None

    def apply_on_support(self, ctrl, flat):
        """APPLY_ON_SUPPORT: APPLY's ``[w on the support, eta, beta, rho]`` per block."""
        return self.apply_parts(self.from_support(flat, 1, ctrl.scalars), ctrl.with_objective)

    def local_steps(self, parts, out, safe):
        """Each block's steps from its local step ``parts[k]``, then b, w and alpha; ``out[k, 2:]``."""
        cfg = self.config
        for k, t in enumerate(self.local):
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

    def apply_step(self, k, eta, beta, rho):
        """Block k: ``alpha += eta delta + beta p`` (the pending step and the momentum direction), next rho."""
        if self.pending[k] is not None:
            step = eta * self.pending[k]
            if self.momentum:
                q = self.previous[k] if self.momentum == "free" else self.pending_q[k]
                step = step + beta * q
                self.previous[k] = step
                self.pending_q[k] = None
            if eta != 0.0 or beta != 0.0:
                self.state[k].alpha = self.state[k].alpha + step
        if self.pending_exchanged[k] is not None:     # the server's dP = eta dB + beta dQ, B += dP: its arithmetic
            db, dq = self.pending_exchanged[k]
            self.dp_mirror[k] = eta * db + beta * dq
            self.b_mirror[k] = self.dp_mirror[k] + (self.b_mirror[k] if self.b_mirror[k] is not None else 0.0)
            self.pending_exchanged[k] = None
        self.pending[k] = None
        self.rho_block[k] = rho

    # -- local rounds: a diagonal Sigma couples nothing, so a block (= a task) takes its whole round alone --
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
        self.local = [TaskSteps(self.config, self.sigma_ii[k], blk.n_task, vecs[0],
                                vecs[1] if len(vecs) > 1 else np.zeros(len(vecs[0])), *sc[:3])
                      for k, (blk, (vecs, sc)) in enumerate(zip(self.blocks, parts))]
        self.w = [t.WT[0] for t in self.local]
        for k, t in enumerate(self.local):
            self.rho_block[k] = float(t.rho_task[0])

    def local_parts(self):
        free = self.momentum == "free"
        return [([t.BT[0]] + ([t.dPT[0]] if free else []), np.concatenate([t.step, t.beta, t.rho_task]))
                for t in self.local]

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
            self.local_steps([([s], np.zeros(0)) for s in self.sdca_steps(ctrl.round)], out, True)
            if ctrl.with_objective:
                out[:, :2] = self.objective_terms()
            return out
        done = np.zeros(len(self.blocks), dtype=bool)
        for inner in range(self.config.local_steps):
            self.local_steps(self.trial_parts(ctrl.round, inner, done), out, False)
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

    def objective_terms(self, which=None):
        """Per block (loss sum, conjugate sum) at the current w and alpha (n_blocks x 2; ``which``: those blocks)."""
        chosen = [k for k in range(len(self.blocks)) if which is None or which[k]]
        terms = np.zeros((len(chosen), 2))
        for i, k in enumerate(chosen):
            blk = self.blocks[k]
            terms[i] = _sdca.objective_terms(blk.rows, blk.y, self.state[k].alpha, self.w[k],
                                                self.loss.kernel_id, self.config.gamma, blk.z_shift(self.w[k]))
        return terms

    def set_w(self, ctrl, rows):
        """SET_W: every block's w column (kept whole for rows off the supports); objective terms when asked."""
        self.w = [np.ascontiguousarray(vecs[0]) for vecs, _ in self.from_rows(rows, 1)]
        self.w_dense = rows if any(f is not None for f in self.columns) else None
        return self.objective_terms() if ctrl.with_objective else None

    def set_sigma(self, ctrl, shared):
        """SET_SIGMA: ``[sigma_ii per task, rho]``; resets shrinking."""
        m = ctrl.m
        self.sigma_ii = np.array([shared[b.task] for b in self.blocks])
        self.rho = float(shared[m])
        self.reset_shrinking()

    # -- interior-point W-steps (hpcmtl.interior): every block's iterate x = y o alpha in (0, 1) --------------
    def ipm_start(self, ctrl, inputs):
        """IPM_START: every block's iterate from its alpha -> per block ``[Z^T x / n, z.x + s.(1 - x)]``."""
        gamma = self.config.gamma if self.loss.name == "smoothed-hinge" else 0.0
        self.iterates, parts = [], []
        for k, blk in enumerate(self.blocks):
            it = interior.BlockIterate(blk, blk.y * self.state[k].alpha, gamma)
            self.iterates.append(it)
            parts.append(([it.b()], [it.complementarity()]))
        return self.dense_rows(parts, 1, ctrl.width)

    def ipm_system(self, ctrl, rows):
        """IPM_SYSTEM: the pending steps taken; per block ``[G's upper triangle, v, loss sum, conjugate sum]`` at x."""
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

    def ipm_step(self, ctrl, rows):
        """IPM_STEP: ``alpha = y o x`` when accepted; the Newton steps -> per block ``[Z^T dx / n, largest primal
        step, largest dual step, 4 complementarity coefficients]``."""
        parts = self.from_rows(rows, 1)
        if parts and parts[0][1][0] > 0:              # (the same flag for every block)
            self.accept_iterates()
        return self.step_rows([it.step(vecs[0]) for it, (vecs, sc) in zip(self.iterates, parts)], ctrl.d)

    def ipm_residual(self, ctrl, rows):
        """IPM_RESIDUAL: every block's Newton residual at its pending dx -> per block its ``v``."""
        return self.dense_rows([([self.iterates[k].residual(vecs[0])], ())
                                for k, (vecs, sc) in enumerate(self.from_rows(rows, 1))], 1, ctrl.d)

    def ipm_correct(self, ctrl, rows):
        """IPM_CORRECT: every block's dx corrected -> what :meth:`ipm_step` sends."""
        return self.step_rows([it.correct(vecs[0]) for it, (vecs, sc) in zip(self.iterates, self.from_rows(rows, 1))],
                              ctrl.d)

    def polish(self, ctrl, inputs):
        """POLISH: per block ``[c (d), loss sums at w + s c for s in POLISH_SCALES, c . b (local rounds: its own
        b)]`` (:func:`margin_correction` under the block's ``sigma_ii / lam``; the loss sums from the scores at w,
        which also choose the free rows, and at c: two passes; zeros where c is zero; nothing changes here)."""
        d, scales = ctrl.d, np.asarray(POLISH_SCALES)
        out = np.zeros((len(self.blocks), d + scales.size + 1))
        for k, blk in enumerate(self.blocks):
            a, w = self.state[k].alpha, self.w[k]
            z = blk.decision(w)
            c = margin_correction(blk, a, w, self.loss.name, self.config.gamma, self.sigma_ii[k] / self.config.lam,
                                  scores=z)
            if not np.any(c):
                continue
            zc = blk.decision(c)
            out[k, d:d + scales.size] = [float(np.sum(primal_reference(self.loss.name, z + s * zc, blk.y,
                                                                       self.config.gamma))) for s in scales]
            if ctrl.local:
                out[k, -1] = float(c @ self.local[k].BT[0])
            f = self.columns[k]
            out[k, :d] = c if f is None else self.spread(f, c)
        return out

    def step_rows(self, steps, d):
        """Every block's ``(Z^T dx / n, largest primal step, largest dual step, 4 coefficients)`` -> its row."""
        return self.dense_rows([([db], [primal, dual, *coefficients]) for db, primal, dual, coefficients in steps],
                               1, d + 6)

    def accept_iterates(self):
        """``alpha = y o x`` on every block: the server accepted the iterates."""
        for st, blk, it in zip(self.state, self.blocks, self.iterates):
            st.alpha = blk.y * it.x

    def ipm_end(self, ctrl, shared):
        """IPM_END: ``alpha = y o x`` when accepted; the iterates dropped, shrinking reset."""
        if shared[0] > 0:
            self.accept_iterates()
        self.pending = [None] * len(self.blocks)
        self.iterates = []
        self.reset_shrinking()

    def get_previous(self, ctrl, inputs):
        """GET_PREVIOUS: every block's previous step, concatenated in plan order."""
        parts = [p for p in self.previous]
        return np.concatenate(parts) if parts else np.zeros(0)

    def set_previous(self, ctrl, mine):
        pos = 0
        for k, blk in enumerate(self.blocks):
            self.previous[k] = mine[pos:pos + blk.n_rows].copy()
            pos += blk.n_rows
        self.dp_mirror = [None] * len(self.blocks)     # the server's dP: zero, or sent next (a resume)

    def get_state(self, ctrl, inputs):
        """GET_STATE: every block's :class:`BlockState`, packed and concatenated in plan order."""
        return BlockState.pack_all(self.state)

    def set_state(self, ctrl, mine):
        pos = 0
        for k, blk in enumerate(self.blocks):
            self.state[k], pos = BlockState.unpack(mine, pos, blk.n_rows)
            self.pending[k] = None


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


def box_local_step(blk, a, w, c, loss, gamma=1.0):
    """The hinge (smoothed hinge) local subproblem of a block solved exactly: its step ``delta`` from ``a``.

    In ``beta_j = y_j (a_j + delta_j)`` in [0, 1], maximizing
    ``-sum l*(-(a + delta)) - delta^T X w - (c / (2 n)) ||X^T delta||^2`` (what local SDCA
    approaches as its passes grow) is ``max g.beta - beta.A.beta / 2`` with ``Z = diag(y) X``,
    ``A = (c / n) Z Z^T (+ gamma I, smoothed hinge)``, ``g = 1 - Z w + (c / n) Z X^T a``:
    :func:`box_qp`, started at the current beta, so the step never loses.  On raw features
    with a small lam local SDCA needs thousands of passes a task where this takes one.
    ``A`` (n x n) exists only during the call: blocks of at most EXACT_BOX_ROWS rows.  A QP stopped by its
    iteration cap still never loses (the server's step then decides how much of it to take).
    """
    n, y = float(blk.n_task), blk.y
    Z = blk.signed_rows()
    A = (c / n) * (Z @ Z.T)
    if loss == "smoothed-hinge":
        A[np.diag_indices_from(A)] += gamma
    g = 1.0 - y * blk.decision(w) + (c / n) * y * blk.decision(blk.rmatvec(a))
    # the active set can change one bound an iteration: up to a few per row (60 rows of rank 5 from zero: 60 < it <= 200)
    beta = box_qp(A, g, 1.0, start=np.clip(y * a, 0.0, 1.0), max_iter=QP_ITERATIONS + 10 * len(a))
    return y * beta - a


POLISH_STALL = 5                 # recorded rounds without the W-step's gap halving before a margin correction
POLISH_NEAR = 30                 # ... and every round whose relative gap is within this factor of --tol: W(alpha)'s
                                 # primal lags the dual (a box loss's P at W(alpha) falls like the dual's error's
                                 # square root), and near the end a correction often certifies what would take many
                                 # more rounds.  With the free rows by coordinate Newton steps (free_rows), P = 3,
                                 # medians of 3: MDS 113 rounds, 0.86 s; 100: 104 rounds but more corrections that
                                 # do not certify, 0.92 s; 10: 138 rounds (P = 1)
POLISH_SCALES = (0.25, 0.5, 0.75, 1.0)   # per task, the server takes w_i + s_i c_i, s_i one of these or 0
POLISH_SWEEPS = 8                # the server's sweeps over the tasks choosing the s_i (fewer when one changes nothing)
POLISH_MAX_FLOPS = 2 ** 28       # a block's least squares: |F| d min(|F|, d) at most (about 0.1 s) ...
POLISH_FLOPS_PER_VALUE = 64      # ... and at most this many times its stored values (nnz; n d when dense): a few
                                 # passes' time.  Sparse rows beyond it: through the free rows' Gram matrix (|F|
                                 # nnz(Z_F) + |F|^3 flops, the same caps).  MDS (4 tasks of 2,000 rows, 10,000
                                 # sparse features, about 80 values a row, |F| 35-175): about 1e8 flops a task the
                                 # dense way, 2e6 through the Gram matrix
FREE_FLOOR = 1e-12               # free rows: y alpha in (FREE_FLOOR, 1 - FREE_FLOOR) and inside after a coordinate
                                 # Newton step (free_rows)


def free_rows(beta, ahead):
    """The rows a margin correction puts on their margins: ``beta = y o alpha`` strictly inside (0, 1) by
    FREE_FLOOR and still strictly inside after its own coordinate Newton step (``ahead``, from
    :func:`coordinate_newton`).

    A row whose step would take it past a bound is on its way there, and at the optimum sits on
    its bound off its margin; pinning its margin would pull w away from the optimum.  Such rows
    are common before the dual has settled, and not only within a hair of a bound: on MDS (a
    learned Sigma, the first coupled W-step) 6 of a task's 53 rows with ``beta`` inside were at
    0.003-0.999 and bound at the optimum, and pinning them made the correction 10 times larger
    than the distance of w to the optimum (a primal further from it than W(alpha)'s); every one
    of them was a row whose Newton step crosses a bound, and no row free at the optimum was.
    The test needs no threshold: a row free at the optimum with a tiny ``beta`` (raw features
    near 1e5: every free row near 1e-12) stays, and one leaving for a bound from 0.3 goes."""
    inside = (beta > FREE_FLOOR) & (beta < 1.0 - FREE_FLOOR) & (ahead > 0.0) & (ahead < 1.0)
    return np.flatnonzero(inside)


def coordinate_newton(blk, beta, margins, loss, gamma, curvature):
    """Every row's ``beta`` after its own coordinate Newton step on the W-step's dual, the others held:
    ``beta + (t_j - z_j . w) / (g + curvature |x_j|^2 / n)`` with ``Z = diag(y) X``, ``margins = Z w``,
    ``t_j = 1`` and ``g = 0`` for the hinge, ``t_j = 1 - gamma beta_j`` and ``g = gamma`` for the smoothed
    hinge, ``curvature = sigma_ii / lam`` (the dual's own, without any rho); a row without values gets
    ``+-inf`` (its margin cannot move).  Clipped to [0, 1] it is the local SDCA kernel's coordinate maximizer
    (``_kernels.coordinate_step`` with ``q = curvature |x_j|^2 / n``), here for every row of a block at once."""
    smoothed = loss == "smoothed-hinge"
    residual = (1.0 - gamma * beta if smoothed else 1.0) - margins
    h = curvature * blk.sq_norms / blk.n_task + (gamma if smoothed else 0.0)
    positive = h > 0.0
    with np.errstate(all="ignore"):
        step = np.where(positive, residual / np.where(positive, h, 1.0), np.copysign(np.inf, residual))
    return beta + step


def margin_correction(blk, a, w, loss, gamma, curvature, scores=None):
    """The least-squares change ``c`` of a box-loss block's ``w`` that puts its free rows on their margins.

    At the optimum every row with ``beta_j = y_j alpha_j`` strictly inside (0, 1) sits on
    its margin: ``z_j . w = 1`` (hinge), ``1 - gamma beta_j`` (smoothed hinge), ``Z = diag(y) X``.
    The engine's ``w = sigma_ii b / lam`` (W = B Sigma / lam) is a sum over rows that
    cancels where the features are large next to their spread (raw values far from 0 beside
    the intercept feature 1): a dual within 1e-10 of its optimum can then give a w whose
    margins are off by 1e-4 and a primal stuck a relative 1e-6 above it; and for any box loss
    the margins at W(alpha) converge only like the square root of the dual's error.  The free rows F
    are those inside (0, 1) that stay inside after their own coordinate Newton step on the dual
    (:func:`free_rows`; ``curvature = sigma_ii / lam``, ``scores = X w`` when the caller has them).
    ``c`` solves ``Z_F c = target_F - Z_F w`` by least squares (``numpy.linalg.lstsq``: the smallest c when
    the rows leave freedom), from the rows themselves, so the cancellation does not return;
    sparse rows too wide for that: the smallest c through ``Z_F Z_F^T`` (:func:`min_norm_through_gram`).
    Zero where there is no free row, the least squares would cost more than
    POLISH_MAX_FLOPS or POLISH_FLOPS_PER_VALUE times the block's stored values, or does not
    give a finite answer; zero on the columns the free rows do not touch.  Any w is a valid
    primal point: the server keeps ``w + s c`` only where its exact primal is smaller.
    """
    beta = blk.y * a
    scores = blk.decision(w) if scores is None else scores
    free = free_rows(beta, coordinate_newton(blk, beta, blk.y * scores, loss, gamma, curvature))
    d = blk.n_features
    if free.size == 0:
        return np.zeros(d)
    budget = min(POLISH_MAX_FLOPS, POLISH_FLOPS_PER_VALUE * blk.rows.n_values)
    target = 1.0 - gamma * beta[free] if loss == "smoothed-hinge" else np.ones(free.size)
    try:
        with np.errstate(all="ignore"):
            dense_flops = free.size * d * min(free.size, d)
            if blk.sparse and blk.mu is None:       # Z_F = diag(y_F) X_F: the signs folded into the vectors
                X, y = blk.X[free].astype(np.float64, copy=False), blk.y[free]
                gram_flops = free.size * X.nnz + free.size ** 3
                if min(gram_flops, dense_flops) > budget:
                    return np.zeros(d)
                if gram_flops <= dense_flops:
                    c = min_norm_through_gram(X, y * target - X @ w)
                else:
                    Z = X.toarray() * y[:, None]
                    c = np.linalg.lstsq(Z, target - Z @ w, rcond=None)[0]
                    c[~np.any(Z != 0.0, axis=0)] = 0.0
            elif dense_flops <= budget:
                Z = blk.signed_rows(free)
                c = np.linalg.lstsq(Z, target - Z @ w, rcond=None)[0]
                c[~np.any(Z != 0.0, axis=0)] = 0.0
            else:
                return np.zeros(d)
    except np.linalg.LinAlgError:         # the SVD did not converge: no correction (it is only ever a candidate)
        return np.zeros(d)
    if not np.all(np.isfinite(c)):
        return np.zeros(d)
    return c


def min_norm_through_gram(X, r):
    """The smallest ``c`` with ``X c = r`` in the least-squares sense, ``c = X^T G^+ r`` with ``G = X X^T`` (few,
    wide sparse rows; ``Z_F c = t`` is ``X_F c = y_F t``): ``G``'s eigenvalues below ``|F| eps`` times the
    largest are dropped, and one refinement from the rows themselves (``r - X c``) takes back most of what
    forming ``G`` rounded away.  Exactly zero on the columns no row touches."""
    G = (X @ X.T).toarray()
    values, vectors = np.linalg.eigh(0.5 * (G + G.T))
    if values.size == 0 or not values[-1] > 0.0:
        return np.zeros(X.shape[1])
    keep = values > values[-1] * G.shape[0] * np.finfo(np.float64).eps
    V, inverse = vectors[:, keep], 1.0 / values[keep]
    c = X.T @ (V @ (inverse * (V.T @ r)))
    return c + X.T @ (V @ (inverse * (V.T @ (r - X @ c))))


def polish_scales(loss_at, cb, Q, n, movable):
    """Per task the scale ``s_i`` in ``(0,) + POLISH_SCALES`` of its correction that makes the primal at
    ``W + C diag(s)`` smallest: sweeps over the tasks (each task to its best scale with the others held; at
    most POLISH_SWEEPS, fewer when a sweep changes nothing) from every common scale (all tasks 0, all 1/4, ...),
    the best of them (none: every s_i 0).  The primal less the current one is
    ``sum_i (loss_at[i, s_i] - loss_at[i, 0]) / n_i + s . cb + s^T Q s / 2`` (``loss_at``: m x (1 + scales) loss sums, ``cb``: every ``c_i . b_i``, ``Q = lam Omega o (C
    C^T)``); tasks not ``movable`` keep 0.  A task whose correction costs more in the regularizer than it gains
    in its loss keeps its w; tasks a learned Sigma ties together may only gain together (Omega's negative
    entries between them), which the common starts find and single-task moves from zero would not."""
    grid = np.concatenate([[0.0], POLISH_SCALES])
    cb, Q = np.asarray(cb, dtype=np.float64), np.asarray(Q, dtype=np.float64)
    scaled = loss_at / np.asarray(n, dtype=np.float64)[:, None]
    tasks = np.flatnonzero(movable)
    rows = np.arange(len(cb))

    def value(pick):
        s = grid[pick]
        return float(np.sum(scaled[rows, pick]) + s @ cb + 0.5 * (s @ Q @ s))

    none = np.zeros(len(cb), dtype=np.int64)
    best_pick, best = none, value(none)
    for start in range(grid.size if tasks.size else 0):
        pick = np.where(movable, start, 0)
        s = grid[pick]
        for _ in range(POLISH_SWEEPS):
            changed = False
            for i in tasks:           # task i to every scale at once: the change of the value
                step = grid - s[i]
                delta = scaled[i] - scaled[i, pick[i]] + step * (cb[i] + Q[i] @ s) + 0.5 * step * step * Q[i, i]
                g = int(np.argmin(delta))
                if delta[g] < 0.0:
                    pick[i], s[i], changed = g, grid[g], True
            if not changed:
                break
        v = value(pick)
        if v < best:
            best_pick, best = pick, v
    return grid[best_pick]


def halving(state, rel_gap):
    """``(gap at the last halving, rows since)`` after one more recorded relative gap."""
    halved, since = state
    return (rel_gap, 0) if rel_gap < 0.5 * halved else (halved, since + 1)


def rounds_since_halved(rel_gaps) -> int:
    """Recorded rounds since a W-step's relative gap last fell below half its value at the previous halving."""
    state = (np.inf, 0)
    for g in rel_gaps:
        state = halving(state, g)
    return state[1]


IPM_AFTER_STALL = 10             # recorded rounds without halving before a W-step turns to interior-point rounds
IPM_AFTER_LOCAL_STALL = 5        # ... local rounds (up to --local-steps local steps a task each): 5 such rounds of
                                 # 100 steps without halving the gap are a stall (6 tasks, 100 raw features: 1.2 s
                                 # a round; the turn came after 10 of them, 12 of the W-step's 20 s)
STALLED_ROWS = 20                # an unconverged W-step is reported stalled after this many rows without halving


def stalled_since(rounds, rel_gaps):
    """The round a W-step's gap last halved when it has not since for STALLED_ROWS recorded rounds and the
    second half of the W-step at least, else None."""
    since = rounds_since_halved(rel_gaps)
    if since < max(STALLED_ROWS, len(rel_gaps) // 2):
        return None
    return int(rounds[len(rounds) - 1 - since])


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


BETA_CAP = 100.0          # box momentum: the furthest extension of the previous step
# box momentum: box QPs inside each task's triangle after the two boxes (StepSolver.within_triangle).  Measured at
# P = 1 (rounds, 10 W-steps, tol 1e-6): mds 228 -> 217, syn1 548 -> 520, syn2 847 -> 782, small 1,925 -> 1,380
TRIANGLE_PASSES = 3


def box_direction(a, p, y):
    """The previous step p kept where a whole further step stays in the box ``0 <= y alpha <= 1``; ``beta_max``."""
    b, yp = y * a, y * p
    # room >= 1 without dividing: (1 - b) / yp >= 1 exactly when 1 - b >= yp (yp > 0), -b / yp >= 1 when
    # b >= -yp (yp < 0): a correctly rounded quotient of positive numbers is >= 1 exactly when x >= y
    keep = ((yp > 0) & (1.0 - b >= yp)) | ((yp < 0) & (b >= -yp))
    if not keep.any():
        return np.zeros_like(p), 0.0
    bk, ypk = b[keep], yp[keep]
    room = np.where(ypk > 0, 1.0 - bk, -bk) / ypk
    return np.where(keep, p, 0.0), float(min(BETA_CAP, np.min(room)))


DIRECTION_ULPS = 8.0      # box momentum on supports: dP stands for X^T q / n where B could not tell them apart


def direction_tolerance(direction, dp, b, beta_max):
    """How far the server's momentum direction may be from ``X^T q / n`` at any position: ``DIRECTION_ULPS``
    ulps of the largest of ``|X^T q / n|``, ``|dP|`` and ``|B| / max(1, beta_max)``.  With the step ``beta <=
    beta_max`` (:meth:`StepSolver.within_triangle`), what B gains from it is then off by at most those ulps of
    B's largest entry: the rounding of B's own update."""
    scale = max(float(np.max(np.abs(direction), initial=0.0)), float(np.max(np.abs(dp), initial=0.0)),
                float(np.max(np.abs(b), initial=0.0)) / max(1.0, beta_max))
    return DIRECTION_ULPS * np.finfo(np.float64).eps * scale


def encode_direction(direction, dp, b, beta_max):
    """``(what a block sends, the direction the server will use)`` of its momentum direction ``X^T q / n`` on
    its exchange positions, given the server's ``dP`` and ``B`` there and the block's ``beta_max``.

    ``q`` is the previous step p without the rows the box removed, and ``dP`` the server's ``X^T p / n``
    (``eta dB + beta dQ`` of the last round, in its arithmetic, with local SDCA's accumulated delta b): they
    differ where removed rows touch, and by rounding elsewhere.  Sent, whichever is shortest: ``[c,
    positions, values]`` of the c positions where they differ by more than :func:`direction_tolerance` (the
    server keeps dP elsewhere); ``[-2, a bit mask of those positions (64 a number: np.packbits' bytes),
    values]``; or ``[-1, the whole direction]``.  The server's direction is then within that
    tolerance of the true one at every position, every round (no error carries over: dP is the server's
    own).  Decoded by :meth:`Server.directions`."""
    tolerance = direction_tolerance(direction, dp, b, beta_max)
    mask = ~(np.abs(direction - dp) <= tolerance)
    differ = np.flatnonzero(mask)
    words = -(-direction.size // 64)
    if min(2 * differ.size, words + differ.size) >= direction.size:
        return np.concatenate([[-1.0], direction]), direction
    used = dp.copy()
    used[differ] = direction[differ]
    if 2 * differ.size <= words + differ.size:
        return np.concatenate([[float(differ.size)], differ.astype(np.float64), direction[differ]]), used
    bits = np.zeros(8 * words, dtype=np.uint8)
    packed = np.packbits(mask)
    bits[:packed.size] = packed
    return np.concatenate([[-2.0], bits.view(np.float64), direction[differ]]), used


def mask_positions(words, size):
    """The positions of a bit mask sent by :func:`encode_direction` (``words``: its float64 numbers)."""
    return np.flatnonzero(np.unpackbits(np.ascontiguousarray(words).view(np.uint8))[:size]).astype(np.int64)


def conjugate_two(loss, a, delta, q, beta_max, y, gamma):
    """``(c1p, c2p, cross)`` of the conjugate along ``eta delta + beta q`` beyond :func:`conjugate_along`.

    Quadratic conjugates: ``sum l*(-(a + eta delta + beta q)) - l*(-a) = eta c1 +
    beta c1p + (eta^2 c2 + 2 eta beta cross + beta^2 c2p) / 2``.  Logistic: the
    plane through the values at 0, delta and ``beta_max q`` bounds the convex
    conjugate from above on that triangle (``c2p = cross = 0``).
    """
    if loss == "hinge":
        return float(-(y @ q)), 0.0, 0.0
    if loss == "smoothed-hinge":
        return float((gamma * a - y) @ q), float(gamma * (q @ q)), float(gamma * (delta @ q))
    if beta_max <= 0:
        return 0.0, 0.0, 0.0
    far = np.sum(conjugate_reference(loss, a + beta_max * q, y) - conjugate_reference(loss, a, y))
    return float(far / beta_max), 0.0, 0.0


def conjugate_along(loss, a, delta, y, gamma):
    """``(c1, c2)`` with ``sum_j l*(-(a_j + e delta_j)) - l*(-a_j) = e c1 + e^2 c2 / 2`` for e in [0, 1].

    Exact for the quadratic conjugates (hinge on its box, smoothed hinge,
    squared); for the logistic loss the chord ``e (sum l*(-(a + delta)) - l*(-a))``,
    which bounds the convex conjugate from above on [0, 1].
    """
    if loss == "hinge":
        return float(-(y @ delta)), 0.0
    if loss == "smoothed-hinge":
        return float((gamma * a - y) @ delta), float(gamma * (delta @ delta))
    if loss == "squared":
        return float((a - y) @ delta), float(delta @ delta)
    return float(np.sum(conjugate_reference(loss, a + delta, y) - conjugate_reference(loss, a, y))), 0.0

class StepSolver:
    """The per-task steps of the aggregations other than 'safe': the exact dual-maximizing ``eta``
    (and momentum ``beta``) along the pending local steps, and B updated with them.

    Used by the server over all m tasks, and by a worker over one task (:class:`TaskSteps`)
    when Sigma is diagonal and nothing couples the tasks (the quadratic is then a sum of
    per-task terms: the same arithmetic with m = 1).  Needs ``config``, ``m``, ``d``, ``n``,
    ``Sigma``, ``BT``, ``WT``, ``dPT``, ``step``, ``beta``, ``rho_task``,
    ``blocks_per_task`` and ``momentum``.  ``BT``, ``WT``, ``dPT`` and the d-vectors passed in
    are task arrays of ``space`` (:mod:`hpcmtl.taskspace`): dense ``m x d`` rows unless the
    server keeps them on the task supports.
    """

    space = DENSE

    def steps(self, dBT, c1, c2):
        """Per-task steps eta in [0, eta_max]^m maximizing the dual along the pending local steps.

        ``D(eta) - D = g . eta - eta^T A eta / 2`` exactly (a lower bound for the
        logistic loss), with ``g_i = -w_i . db_i - c1_i / n_i`` and
        ``A = (Sigma o dB^T dB) / lam + diag(c2 / n)``.
        """
        cfg = self.config
        g = -self.space.dots(self.WT, dBT) - c1 / self.n
        A = self.Sigma * self.space.gram(dBT) / cfg.lam + np.diag(c2 / self.n)
        A = 0.5 * (A + A.T)
        if cfg.aggregation == "line":
            slope, curv = float(np.sum(g)), float(np.sum(A))
            if slope <= 0:
                return np.zeros(self.m)
            e = cfg.eta if curv <= slope / cfg.eta else slope / curv
            return np.full(self.m, e)
        return box_qp(A, g, cfg.eta, start=self.step, max_iter=QP_ITERATIONS)

    def two_direction_quadratic(self, dBT, dQT, c1, c2, c1q, c2q, cross):
        """``(A, g)`` of the dual change along ``eta_i delta_i + beta_i q_i`` (2m directions, ``D2 = [dB; dQ]``):
        ``A = (Sigma2 o D2 D2^T) / lam`` plus each task's 2 x 2 conjugate block ``[[c2, cross], [cross, c2q]] / n``,
        ``g = -w . D2 - [c1, c1q] / n``."""
        m, lam = self.m, self.config.lam
        G2, wd2 = self.space.gram_dots2(self.WT, dBT, dQT)
        A = np.tile(self.Sigma, (2, 2)) * G2 / lam       # Sigma2 = Sigma[np.ix_(idx, idx)], idx = [0..m, 0..m]
        if np.any(c2) or np.any(c2q) or np.any(cross):            # (hinge: all zero, nothing to add)
            A2 = A.reshape(2, m, 2, m)                             # A2[s, i, t, j] = A[s m + i, t m + j]
            tasks = np.arange(m)
            A2[0, tasks, 0, tasks] += c2 / self.n
            A2[1, tasks, 1, tasks] += c2q / self.n
            A2[0, tasks, 1, tasks] += cross / self.n
            A2[1, tasks, 0, tasks] += cross / self.n
        A = 0.5 * (A + A.T)
        g = -wd2 - np.concatenate([c1 / self.n, c1q / self.n])
        return A, g

    def steps_momentum(self, dBT, scalars):
        """Squared loss: ``(eta, beta)`` maximizing the dual over ``alpha + eta_i delta_i + beta_i p_i``, no bounds.

        The same exact quadratic as :meth:`steps` over 2m directions (each
        task's new local step and its previous step): ``D2 = [dB; dP]``,
        ``A = (Sigma2 o D2 D2^T) / lam + (per-task 2 x 2 conjugate blocks) / n``,
        solved by a pseudo-inverse (eigenvalues below 1e-12 of the largest
        dropped): the gain ``g^T A^+ g / 2`` is never negative.
        """
        m = self.m
        A, g = self.two_direction_quadratic(dBT, self.dPT, *scalars.T)
        w, V = np.linalg.eigh(A)
        keep = w > 1e-12 * max(float(w[-1]), 1e-300)
        v = V[:, keep] @ ((V[:, keep].T @ g) / w[keep])
        if not float(g @ v) > 0:
            v = np.zeros(2 * m)
        return v[:m], v[m:]

    def steps_box_momentum(self, dBT, dQT, scalars):
        """Box losses: the better of per-task steps alone (eta in [0, 1]) and steps with momentum
        (``eta in [0, 1/2]``, ``beta in [0, beta_max / 2]``), each the exact maximizer of its box QP, then
        improved inside each task's whole triangle of feasible steps (:meth:`within_triangle`)."""
        m, cfg = self.m, self.config
        beta_max = scalars[:, 5]
        A, g = self.two_direction_quadratic(dBT, dQT, *scalars[:, :5].T)
        alone = box_qp(A[:m, :m], g[:m], cfg.eta, start=self.step, max_iter=QP_ITERATIONS)
        gain_alone = float(g[:m] @ alone - 0.5 * alone @ (A[:m, :m] @ alone))
        if not np.any(beta_max > 0):
            return alone, np.zeros(m)
        upper = np.concatenate([np.full(m, 0.5 * cfg.eta), 0.5 * np.minimum(beta_max, BETA_CAP)])
        both = box_qp(A, g, upper, start=np.concatenate([self.step, self.beta]), max_iter=QP_ITERATIONS)
        gain_both = float(g @ both - 0.5 * both @ (A @ both))
        x = both if gain_both > gain_alone else np.concatenate([alone, np.zeros(m)])
        x = self.within_triangle(A, g, x, np.minimum(beta_max, BETA_CAP))
        return x[:m], x[m:]

    def within_triangle(self, A, g, x, beta_max):
        """Better steps ``(eta, beta)`` than ``x`` inside each task's triangle ``eta / eta_max + beta / beta_max
        <= 1`` (alpha + eta delta + beta q is then a convex combination of alpha, alpha + eta_max delta and
        alpha + beta_max q: feasible, and for the logistic loss the plane of :func:`conjugate_two` still bounds
        the conjugate from above).  Each pass solves the box QP over a box inside the triangle through
        ``x``'s corner on the side its gradient points to (eta up to ``eta_max (1 - beta / beta_max)`` with beta
        at most its value, or the other way round), started from ``x``: never worse than ``x``."""
        m, top = self.m, self.config.eta
        has = beta_max > 0
        share = np.where(has, 1.0 / np.where(has, beta_max, 1.0), 0.0)
        for _ in range(TRIANGLE_PASSES):
            eta, beta = x[:m], x[m:]
            r = g - A @ x
            up_eta = np.where(has, top * np.maximum(0.0, 1.0 - beta * share), top)
            up_beta = np.where(has, beta_max * np.maximum(0.0, 1.0 - eta / top), 0.0)
            towards_eta = r[:m] * top >= r[m:] * beta_max
            upper = np.concatenate([np.where(towards_eta, up_eta, eta), np.where(towards_eta, beta, up_beta)])
            upper = np.maximum(upper, x)
            y = box_qp(A, g, upper, start=x, max_iter=QP_ITERATIONS)
            if not float(g @ y - 0.5 * y @ (A @ y)) > float(g @ x - 0.5 * x @ (A @ x)):
                break
            x = y
        return x

    def adapt_rho(self, eta):
        """adaptive: rho_i up (towards the task's Lemma 6.7 bound) when its step was cut, down when taken whole."""
        if self.config.aggregation != "adaptive":
            return
        bound = np.maximum(task_rho_bounds(self.Sigma, self.blocks_per_task), 1.0)
        full = eta >= 0.999 * self.config.eta
        grow = np.where(eta > 0, 1.0 / np.maximum(eta / self.config.eta, 1e-3), 2.0)
        rho = np.where(full, 0.5 * self.rho_task, self.rho_task * np.sqrt(grow))
        self.rho_task = np.clip(rho, 1.0, bound)

    def solve_steps(self, dBT, rows):
        """This round's (eta, beta) per task, B updated with them; ``rows``: the per-task rows of TRIAL
        (``[dB, (dQ: box momentum), scalars]``, dense)."""
        d = self.d
        if self.momentum == "box":
            return self.take_steps(dBT, rows[:, d:2 * d], rows[:, 2 * d:])
        return self.take_steps(dBT, None, rows[:, d:])

    def take_steps(self, dBT, dQT, scalars):
        """:meth:`solve_steps` on task arrays ``dBT`` (and ``dQT``, box momentum) and per-task ``scalars``."""
        space = self.space
        if self.momentum == "free":
            eta, beta = self.steps_momentum(dBT, scalars)
            self.dPT = space.combine(eta, dBT, beta, self.dPT)
            space.add(self.BT, self.dPT)
        elif self.momentum == "box":
            eta, beta = self.steps_box_momentum(dBT, dQT, scalars)
            space.add_two(self.BT, eta, dBT, beta, dQT)
        else:
            eta, beta = self.steps(dBT, scalars[:, 0], scalars[:, 1]), np.zeros(self.m)
            space.add_scaled(self.BT, eta, dBT)
        return eta, beta


def local_width(d, momentum):
    """Width of a block's local-round state ``[b, (dP: free momentum only), step, beta, rho]``."""
    return (2 * d if momentum == "free" else d) + 3


class OrderedDenseSpace(DenseSpace):
    """The dense space with its dot products added in index order (``_kernels.ordered_dot``): a one-task
    :class:`TaskSteps` on a block's support columns then gets the bits of the same vectors with the zeros off
    the support (all d columns, the dense exchange), at every rank count."""

    def dots(self, X, Y):
        return np.array([_blockops.ordered_dot(x, y) for x, y in zip(X, Y)])

    def total(self, X, Y):
        return float(np.sum(self.dots(X, Y)))

    def gram(self, X):
        return np.array([[_blockops.ordered_dot(a, b) for b in X] for a in X]).reshape(len(X), len(X))

    def gram_dots2(self, W, X, Y):
        D2 = np.vstack([X, Y])
        return self.gram(D2), self.dots(np.vstack([W, W]), D2)


ORDERED = OrderedDenseSpace()


class TaskSteps(StepSolver):
    """One task's :class:`StepSolver` state on its worker during local rounds (Sigma diagonal: the
    task's quadratic is its own): ``b`` and ``dP`` as 1 x d rows, ``w = sigma_ii b / lam``."""

    def __init__(self, config, sigma_ii, n, b, dp, step, beta, rho):
        self.config = config
        self.m = 1
        self.n = np.array([float(n)])
        self.Sigma = np.array([[float(sigma_ii)]])
        self.BT = np.array(b, dtype=np.float64).reshape(1, -1)
        self.d = self.BT.shape[1]
        self.dPT = np.array(dp, dtype=np.float64).reshape(1, -1)
        self.WT = (self.Sigma @ self.BT) / config.lam
        self.step = np.array([float(step)])
        self.beta = np.array([float(beta)])
        self.rho_task = np.array([float(rho)])
        self.blocks_per_task = np.ones(1)
        self.momentum = uses_momentum(config)

    # a worker's block computes on its support's columns (LocalBlocks.columns)
    space = ORDERED


# ---------------------------------------------------------------------------
# The server's driver
# ---------------------------------------------------------------------------
class Server(StepSolver, ServerBase):
    """Holds B, Sigma, W and drives the rounds; runs on rank 0 only."""

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
        if config.relationship == "fixed":
            self.Sigma = np.array(sigma_fixed, dtype=np.float64)
        else:
            self.Sigma = np.eye(self.m) / self.m
        self.WT = np.zeros((self.m, self.d))
        self.rho = safe_rho(self.Sigma, self.blocks_per_task, config.eta)
        self.rho_task = np.ones(self.m)          # optimistic per-task rho (aggregations other than safe)
        if config.aggregation == "qp":
            self.rho_task = coupled_rho(self.Sigma)
        self.step = np.zeros(self.m)             # the last round's per-task steps
        self.momentum = uses_momentum(config)
        self.beta = np.zeros(self.m)             # momentum: the last round's coefficients of the previous step
        self.dPT = np.zeros((self.m, self.d))    # momentum: the B change of the last round's step
        # box momentum on supports: dPT is the B change the workers' previous steps made (X^T p / n per task),
        # so they send their direction X^T q / n only where it differs (TRIAL_MOMENTUM_ON_SUPPORT); False
        # after anything else set their previous steps (local rounds, a checkpoint that did not record it)
        self.dp_known = True
        self.mirrored = True          # the workers mirror B and dP (False: sent before the next such TRIAL)
        self.history = GapHistory()
        self.correction = None        # CT of a margin correction that certified the W-step (W + C is its model)
        self.ipm_tried = False        # the current W-step ran interior-point rounds (checkpointed)
        self.halving = (None, 0, (np.inf, 0))    # (outer, history rows read, halving state): since_halved
        self.t = 0                    # rounds so far in the current W-step
        self.outer_state = OuterState()
        self.want_test = test
        self.test = None
        self.warn = warn
        self.local_phase = False      # workers hold B (their b rows) during a W-step of local rounds
        self.layout = None            # every block's SupportLayout (exchange 'auto', some block sparse), or None
        # box momentum under exchange 'auto': where the workers' directions travel (the support layout, or every
        # block on all d when none is sparse: the direction is still sent only where it differs from dP)
        self.direction_layout = None
        self.supports_known = False   # registered at the first exchange (GET_SUPPORTS)
        self.scores_off_supports = False   # the workers score rows off their supports after training (validation)

    @property
    def outer(self):
        return self.outer_state.p

    # -- commands ----------------------------------------------------------
    def push_sigma(self):
        shared = np.concatenate([np.diag(self.Sigma), [self.rho]])
        self.command(DMTRLCommand.SET_SIGMA, payload=shared, m=self.m, width=self.m + 1)

    def push_w(self, with_objective: bool, eta=None, beta=None):
        """Send every block its w column (and, unless safe, its steps eta and beta and next rho)."""
        if self.safe:
            return self.scatter_down(DMTRLCommand.SET_W, lambda: self.WT, None, with_objective=with_objective)
        eta = np.zeros(self.m) if eta is None else eta
        beta = np.zeros(self.m) if beta is None else beta
        return self.scatter_down(DMTRLCommand.APPLY, lambda: self.WT, np.column_stack([eta, beta, self.rho_task]),
                                 with_objective=with_objective)

    def scatter_down(self, cmd, task_array, scalars, **fields):
        """``cmd`` (SET_W, APPLY, SET_LOCAL) with every block's ``[its task's row of task_array(), its task's
        scalars]`` (``scalars``: m x s, or None): on the supports when they are known.  ``task_array`` is read
        after the first exchange's registration, which may move B and W to the task supports."""
        layout = self.supports()
        s = 0 if scalars is None else scalars.shape[1]
        X = task_array()
        if self.space.sparse:
            return self.command(ON_SUPPORT[cmd], payload=self.space.to_flat(X, scalars), vectors=1, scalars=s,
                                **fields)
        payload = (X if scalars is None else np.column_stack([X, scalars]))[self.block_task]
        if layout is None:
            return self.command(cmd, payload=payload, width=payload.shape[1], **fields)
        return self.command(ON_SUPPORT[cmd], payload=layout.pack(payload, 1), vectors=1, scalars=s, **fields)

    def dense_wt(self):
        """The whole ``W^T = Sigma B^T / lam`` (m x d): on task supports, W is only kept on each T_i."""
        if not self.space.sparse:
            return self.WT
        return (self.Sigma @ self.space.dense(self.BT)) / self.config.lam

    def push_dense_w(self):
        """Every block's whole w column (after rounds on supports, w is only right on each block's support):
        before anything scores other rows (test metrics, validation folds) or leaves the training."""
        if self.layout is not None:
            self.command(DMTRLCommand.SET_W, payload=self.dense_wt()[self.block_task], with_objective=0,
                         width=self.d)

    # -- the exchange on supports (issue 14) -----------------------------------
    def supports(self):
        """Every block's :class:`SupportLayout`, learned at the first exchange (GET_SUPPORTS, SET_SUPPORTS),
        or None: the dense exchange (``exchange='dense'``, or every block's support all d features).

        When the task supports are sparse enough (:func:`hpcmtl.taskspace.support_algebra_pays`), B, dP and
        W move to them here (:class:`hpcmtl.taskspace.SupportSpace`) and stay there for the run.  With box
        momentum the registration also sets ``direction_layout`` (all d for blocks exchanged whole)."""
        if not self.supports_known:
            self.supports_known = True
            if self.config.exchange == "auto":
                self.layout = self.register_supports()
            if self.layout is not None:
                supports = task_supports(self.layout.index, self.block_task, self.m, self.d)
                if support_algebra_pays(supports, self.d):
                    self.adopt(SupportSpace(supports, self.d).exchange(self.layout.index, self.block_task))
        return self.layout

    def adopt(self, space):
        """Keep B, dP (and W, recomputed) as task arrays of ``space`` from now on."""
        self.BT = space.compact(self.space.dense(self.BT))
        self.dPT = space.compact(self.space.dense(self.dPT))
        self.space = space
        self.recompute_w()

    def register_supports(self):
        pieces = self.command(DMTRLCommand.GET_SUPPORTS)
        flat = np.concatenate(pieces) if pieces else np.zeros(0)
        index, pos, sparse = [], 0, False
        for _ in self.blocks:                  # plan order is rank order: the pieces follow it
            size = int(flat[pos])
            pos += 1
            if size < 0:
                index.append(np.arange(self.d, dtype=np.int64))
            else:
                index.append(flat[pos:pos + size].astype(np.int64))
                pos += size
                sparse = True
        if not sparse and self.momentum != "box":
            return None
        layout = SupportLayout(index, self.d)
        self.command(DMTRLCommand.SET_SUPPORTS, payload=layout.sizes.astype(np.float64), width=len(self.blocks))
        self.direction_layout = layout
        return layout if sparse else None

    def gather_up(self, cmd, vectors, scalars, **fields):
        """What ``cmd`` (SDCA, TRIAL) returns, per block ``vectors`` d-vectors and ``scalars`` numbers:
        ``([per-task sum of vector v as a task array of self.space], per-block scalars)``.  On the supports
        when they are known (the same numbers: the vectors vanish off the supports), else dense rows."""
        if self.supports() is None:
            return self.row_task_arrays(self.command(cmd, width=vectors * self.d + scalars, **fields), vectors)
        flat = self.command(ON_SUPPORT[cmd], vectors=vectors, scalars=scalars, **fields)
        return self.support_task_arrays(flat, vectors, scalars)

    def support_task_arrays(self, flat, vectors, scalars, layout=None):
        """A support collective's flat values (on ``layout``, default the supports') -> ``([per-task sum of
        vector v, a task array], per-block scalars)``."""
        if self.space.sparse:
            return self.space.from_flat(flat, vectors, scalars)
        layout = self.layout if layout is None else layout
        return self.row_task_arrays(layout.rows(flat, vectors, scalars), vectors)

    def row_task_arrays(self, rows, vectors):
        """Per-block dense rows ``[vectors d-vectors, scalars]`` -> as :meth:`support_task_arrays` (m x d rows)."""
        d = self.d
        summed = self.per_task(rows[:, :vectors * d])
        return [summed[:, v * d:(v + 1) * d] for v in range(vectors)], rows[:, vectors * d:]

    def check_vectors(self, X, what):
        """:func:`check_finite_rows` on a task array (naming the round and the first task not finite)."""
        check_finite_rows(self.space.finite_rows(X), self.round, self.names, what, self.outer)

    # -- arithmetic ----------------------------------------------------------
    def recompute_w(self):
        self.WT = self.space.mix(self.Sigma, self.BT, self.config.lam)      # W = B Sigma / lam
        self.check_vectors(self.WT, "W column")

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

    # -- the algorithm ---------------------------------------------------------
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
        if box_on_supports and self.dp_known and self.one_block_a_task:
            if not self.mirrored:               # the workers' mirrors of B and dP
                self.send_mirrors()
            vecs, block_scalars = self.gather_trial_momentum(scalars)
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
        eta, beta = self.take_steps(vecs[0], vecs[1] if self.momentum == "box" else None, per_task)
        self.step, self.beta = eta, beta
        if box_on_supports:             # the workers' next previous step p = eta delta + beta q, as B sees it
            self.dPT = self.space.combine(eta, vecs[0], beta, vecs[1])
            self.dp_known = True
        self.recompute_w()
        self.adapt_rho(np.clip(eta, 0.0, self.config.eta))
        return self.push_w(want_gap, eta, beta)

    def gather_trial_momentum(self, scalars):
        """TRIAL on the supports with box momentum, one block a task: per task ``X^T q / n`` is dP where the
        worker found them alike, what it sent elsewhere (:meth:`LocalBlocks.trial_momentum_on_support`);
        as :meth:`gather_up`."""
        layout = self.direction_layout
        pieces = self.command(DMTRLCommand.TRIAL_MOMENTUM_ON_SUPPORT, round=self.round, vectors=1, scalars=scalars)
        fixed = self.cluster.rank_totals(layout.sizes + scalars)
        (dBT,), block_scalars = self.support_task_arrays(
            np.concatenate([piece[:n] for piece, n in zip(pieces, fixed)]), 1, scalars, layout)
        positions, values = self.directions([piece[n:] for piece, n in zip(pieces, fixed)])
        dQT = self.dPT.copy()
        dQT.reshape(-1)[positions] = values
        return [dBT, dQT], block_scalars

    def send_mirrors(self):
        """SET_DP_ON_SUPPORT: every block's task's B and dP on its support (what the workers' directions
        compare with, :func:`encode_direction`)."""
        if self.space.sparse:
            payload = self.space.vectors_to_flat([self.BT, self.dPT])
        else:
            payload = self.direction_layout.pack(np.column_stack([self.BT, self.dPT])[self.block_task], 2)
        self.command(DMTRLCommand.SET_DP_ON_SUPPORT, payload=payload, vectors=2, scalars=0)
        self.mirrored = True

    @property
    def one_block_a_task(self):
        return bool(np.all(self.blocks_per_task == 1))

    def directions(self, tails):
        """Every block's momentum direction as sent (:func:`encode_direction`, per rank its blocks in plan
        order) as ``(positions in a task array of self.space, values)``."""
        positions, values = [], []
        for rank, blocks in self.blocks_by_rank():
            tail, pos = tails[rank], 0
            for k in blocks:
                index, size = self.direction_layout.index[k], int(self.direction_layout.sizes[k])
                count = int(tail[pos]) if pos < tail.size and np.isfinite(tail[pos]) else -3
                if count == -1:
                    at, value = np.arange(size, dtype=np.int64), tail[pos + 1:pos + 1 + size]
                    pos += 1 + size
                elif count == -2 and pos + 1 + -(-size // 64) <= tail.size:
                    words = -(-size // 64)
                    at = mask_positions(tail[pos + 1:pos + 1 + words], size)
                    value = tail[pos + 1 + words:pos + 1 + words + at.size]
                    pos += 1 + words + at.size
                elif 0 <= count <= size:
                    at = tail[pos + 1:pos + 1 + count]
                    value = tail[pos + 1 + count:pos + 1 + 2 * count]
                    pos += 1 + 2 * count
                    if not (np.all(np.isfinite(at)) and np.all((at >= 0) & (at < size))):
                        raise ValueError(f"rank {rank}: block {k}'s direction has positions outside its support")
                    at = at.astype(np.int64)
                else:
                    raise ValueError(f"rank {rank}: block {k}'s direction is not [c, ...], [-2, ...] or [-1, ...]")
                if value.size != at.size:
                    raise ValueError(f"rank {rank}: block {k}'s direction is cut short")
                task = int(self.block_task[k])
                positions.append(self.space.block_pos[k][at] if self.space.sparse else task * self.d + index[at])
                values.append(value)
            if pos != tail.size:
                raise ValueError(f"rank {rank}: {tail.size} direction values, its blocks took {pos}")
        cat = (lambda parts, dtype: np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype))
        return cat(positions, np.int64), cat(values, np.float64)

    def blocks_by_rank(self):
        """``(rank, [plan indices of its blocks])`` for every rank, in rank order (plan order within a rank)."""
        by_rank = [[] for _ in range(self.cluster.size)]
        for k, b in enumerate(self.blocks):
            by_rank[self.cluster.worker_rank(b.worker)].append(k)
        return list(enumerate(by_rank))

    # -- local rounds (nothing couples the tasks) -------------------------------
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
        self.dp_known = self.mirrored = False   # the local rounds' steps become the previous steps, B theirs

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

    def coupled(self) -> bool:
        """Sigma has a nonzero off the diagonal."""
        return not interior.is_diagonal(self.Sigma)

    def interior_point_possible(self) -> bool:
        """Every task one block on dense task arrays, :func:`uses_interior_point`, and every block's rows
        dense within ``interior.MAX_ROW_VALUES``."""
        return (uses_interior_point(self.config, self.d, self.m, self.coupled()) and self.one_block_a_task
                and not self.space.sparse and float(np.max(self.n)) * self.d <= interior.MAX_ROW_VALUES)

    def interior_point_due(self) -> bool:
        """Interior-point rounds now: at the start of a W-step under a coupled Sigma with at most
        ``interior.START_FEATURES`` features (not after a resume inside one), or, once a W-step, when its gap
        has not halved for IPM_AFTER_STALL recorded rounds (IPM_AFTER_LOCAL_STALL local rounds: under a
        diagonal Sigma too, whose local rounds stall on raw features far above 1, where local SDCA and the
        exact local steps make no progress).  Read from the history and the checkpointed ``ipm_tried``, so a
        resumed run decides alike."""
        if not self.interior_point_possible():
            return False
        if self.t == 0:
            return self.coupled() and self.d <= interior.START_FEATURES
        stall = IPM_AFTER_LOCAL_STALL if self.local_rounds_possible() else IPM_AFTER_STALL
        return not self.ipm_tried and self.since_halved() >= stall

    def since_halved(self, rel_gap=None):
        """:func:`rounds_since_halved` of the current W-step's recorded rows (and ``rel_gap`` after them): what
        the history says, read incrementally (a long W-step does not rescan it every round)."""
        rows = self.history.rows
        n = len(rows["round"])
        outer, seen, state = self.halving
        if outer != self.outer or seen > n:
            seen = n
            while seen > 0 and rows["outer"][seen - 1] == self.outer:
                seen -= 1
            state = (np.inf, 0)
        for g in rows["rel_gap"][seen:n]:
            state = halving(state, g)
        self.halving = (self.outer, n, state)
        return (state if rel_gap is None else halving(state, rel_gap))[1]

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
        self.ipm_tried = True                # once a W-step (after the state they began from: a resume repeats them)
        primal_best, dual_a = self.objective(self.scatter_down(DMTRLCommand.SET_W, lambda: self.WT, None,
                                                            with_objective=True))
        best_WT = self.WT
        start = self.command(DMTRLCommand.IPM_START, width=d + 1)
        self.check_vectors(start, "interior-point start b")
        BxT = self.per_task(start[:, :d])
        n_total = float(np.sum(self.n))
        mu = interior.barrier_parameter(np.sum(self.per_task(start[:, d])), n_total)   # task order: same bits at any P
        root = interior.sigma_root(self.Sigma, cfg.lam)
        k_norm = float(np.max(np.linalg.eigvalsh(self.Sigma))) / cfg.lam
        a_primal = a_dual = 0.0
        row, certified, accepted = None, False, False
        halved, smallest, since = np.inf, np.inf, 0      # x's gap at its last halving, its smallest; rounds since
        for _ in range(interior.MAX_ROUNDS):
            if self.t >= cfg.max_rounds:
                break
            self.t += 1
            self.round += 1
            WxT = self.space.mix(self.Sigma, BxT, cfg.lam)
            steps = np.tile([a_primal, a_dual, mu, k_norm], (len(self.blocks), 1))
            rows = self.command(DMTRLCommand.IPM_SYSTEM, payload=np.column_stack([WxT[self.block_task], steps]),
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
            if certified or self.t % cfg.gap_every == 0 or self.t == cfg.max_rounds:
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
            rows = self.command(DMTRLCommand.IPM_STEP, width=d + 1, d=d,
                                payload=np.column_stack([Y[self.block_task], np.full(len(self.blocks), float(accepted))]))
            check_finite_rows(rows, self.round, self.names, "interior-point step", self.outer)
            accepted = False                                        # delivered
            for _ in range(interior.REFINEMENTS):                   # the step through the full system's residual
                WdT = self.space.mix(self.Sigma, self.per_task(rows[:, :d]), cfg.lam)
                V = self.per_task(self.command(DMTRLCommand.IPM_RESIDUAL, payload=WdT[self.block_task], width=d, d=d))
                Y = newton.solve(V)
                check_finite_rows(Y, self.round, self.names, "interior-point refinement", self.outer)
                rows = self.command(DMTRLCommand.IPM_CORRECT, payload=Y[self.block_task], width=d, d=d)
                check_finite_rows(rows, self.round, self.names, "interior-point refinement", self.outer)
            a_primal, a_dual = interior.step_lengths(rows[:, d], rows[:, d + 1])
            BxT = BxT + a_primal * self.per_task(rows[:, :d])
            c = self.per_task(rows[:, d + 2:d + 6])
            mu = interior.barrier_parameter(np.sum(c[:, 0] + a_primal * c[:, 1] + a_dual * c[:, 2]
                                                   + a_primal * a_dual * c[:, 3]), n_total)
        self.command(DMTRLCommand.IPM_END, payload=np.array([float(accepted)]), width=1)
        self.recompute_w()
        if certified or self.t >= cfg.max_rounds:
            self.WT = best_WT               # the w of the last row's P (alpha's own, or an iterate's with a smaller P)
        self.mirrored = False               # the workers' mirror of B (box momentum on supports) is stale
        self.push_w(False)
        return row, certified

    def w_step(self):
        if self.t == 0:
            self.ipm_tried = False
        row, converged = None, False
        while True:
            if self.interior_point_due():
                row, converged = self.interior_rounds()
                if converged or self.t >= self.config.max_rounds:
                    break
            local = self.local_rounds_possible()
            if local:
                self.enter_local()
            row, converged = self.w_step_rounds(local)
            if local:
                self.pull_local()
                self.local_phase = False
            if converged or self.t >= self.config.max_rounds or not self.interior_point_due():
                break
        if not converged and row is not None:
            rows = self.history.rows
            mine = [i for i, o in enumerate(rows["outer"]) if o == self.outer]
            stalled = stalled_since([rows["round"][i] for i in mine], [rows["rel_gap"][i] for i in mine])
            if stalled is not None:
                row = dict(row, stalled_since=stalled)
        if self.correction is not None:      # certified at W + C: the model, on the workers too (B stays alpha's)
            self.WT = self.WT + self.correction
            self.correction = None
            self.scatter_down(DMTRLCommand.SET_W, lambda: self.WT, None, with_objective=False)
        return row, converged

    def w_step_rounds(self, local):
        cfg = self.config
        rows = self.history.rows
        row = {k: v[-1] for k, v in rows.items()} if rows["round"] else None
        while self.t < cfg.max_rounds:
            self.t += 1
            self.round += 1
            want_gap = self.t % cfg.gap_every == 0 or self.t == cfg.max_rounds
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
                correction = None
                if primal - dual > cfg.tol * abs(primal) and self.polish_due(primal, dual):
                    loss_sums = terms[:, 0] if local else self.per_task(terms)[:, 0]
                    polished, CT = self.polished_primal(regularizer, local, loss_sums)
                    if polished < primal:               # any W is a primal point: the smaller P certifies
                        primal, correction = polished, CT
                row = self.record(primal, dual)
                if row["rel_gap"] <= cfg.tol:
                    self.correction = correction
                    return row, True
            self.safe_point()
            if want_gap and self.interior_point_due():     # stalled: interior-point rounds from here (w_step)
                return row, False
        return row, False

    # -- margin corrections of box-loss W-steps near their end or stalled (margin_correction) ----------------------
    def polish_possible(self) -> bool:
        """Hinge or smoothed hinge, an aggregation other than the paper's 'safe' rule, every task one block,
        dense task arrays."""
        return (not self.safe and self.config.loss in ("hinge", "smoothed-hinge") and self.one_block_a_task
                and not self.space.sparse)

    def polish_due(self, primal, dual) -> bool:
        """The W-step's last round, its relative gap within POLISH_NEAR times --tol, or its gap (this round's
        with the recorded ones) has not halved for a multiple of POLISH_STALL recorded rounds; read from the
        history, so a resumed run decides alike."""
        if not self.polish_possible():
            return False
        if self.t >= self.config.max_rounds:
            return True
        rel_gap = (primal - dual) / max(abs(primal), 1e-300)
        if rel_gap <= POLISH_NEAR * self.config.tol:
            return True
        since = self.since_halved(rel_gap)
        return since > 0 and since % POLISH_STALL == 0

    def polished_primal(self, regularizer, local, loss_sums):
        """The exact primal at ``W + C diag(s)`` (C from POLISH, the scales s from :func:`polish_scales`) and
        ``diag(s) C^T`` (m x d); ``loss_sums``: every task's loss sum at W (this round's).

        ``(lam / 2) tr((W + C_s) Omega (W + C_s)^T)`` with ``W Omega = B / lam``: the
        current ``regularizer / 2`` plus ``sum_i s_i c_i . b_i`` plus ``(lam / 2) sum_ij s_i s_j
        Omega_ij c_i . c_j``; ``c_i . b_i`` from the workers in local rounds (B lives there)."""
        d, lam, scales = self.d, self.config.lam, len(POLISH_SCALES)
        rows = self.per_task(self.command(DMTRLCommand.POLISH, width=d + scales + 1, d=d, local=int(local)))
        check_finite_rows(rows, self.round, self.names, "margin correction", self.outer)
        CT = rows[:, :d]
        cb = rows[:, -1] if local else np.einsum("ij,ij->i", CT, self.space.dense(self.BT))
        Q = lam * np.linalg.inv(self.Sigma) * (CT @ CT.T)
        loss_at = np.column_stack([loss_sums, rows[:, d:d + scales]])
        s = polish_scales(loss_at, cb, Q, self.n, np.any(CT != 0.0, axis=1))
        chosen = loss_at[np.arange(self.m), np.searchsorted(np.concatenate([[0.0], POLISH_SCALES]), s)]
        moved = regularizer + 2.0 * float(s @ cb) + float(s @ Q @ s)
        primal, _ = primal_dual_of(chosen, np.zeros(self.m), self.n, moved)
        return primal, s[:, None] * CT

    def omega(self):
        G = self.space.wtw(self.WT, self.BT, self.Sigma, self.config.lam)
        self.Sigma = omega_from_gram(G, self.config.eig_floor)
        check_finite_rows(self.Sigma, self.round, self.names, "Sigma row", self.outer)
        self.rho = safe_rho(self.Sigma, self.blocks_per_task, self.config.eta)
        if self.config.aggregation == "qp":
            self.rho_task = coupled_rho(self.Sigma)
        self.recompute_w()
        self.push_sigma()
        self.push_w(False)
        if self.momentum:                 # a new Sigma, a new quadratic: restart the momentum
            self.restart_momentum()
        self.t = 0
        self.safe_point()

    def restart_momentum(self):
        """No previous step on the workers, none in dP (a new quadratic: a new Sigma, a new lam)."""
        self.dPT = np.zeros_like(self.dPT)      # (a task array of either space)
        self.command(DMTRLCommand.SET_PREVIOUS, payload=self.previous_payloads(None))
        self.dp_known = True

    def gather_previous(self):
        """Every task's previous step (momentum state) as one vector of all rows, tasks in file order."""
        pieces = self.command(DMTRLCommand.GET_PREVIOUS)
        full = [np.zeros(int(n)) for n in self.n]
        for b, rows in self.block_slices(pieces, lambda b: b.n_rows):
            full[b.task][b.start:b.stop] = rows
        return np.concatenate(full) if full else np.zeros(0)

    def block_slices(self, pieces, size):
        """``(block, its slice)`` of per-rank vectors concatenating each rank's blocks in plan order.

        ``size(block)`` is the length of a block's slice; yields rank by rank.
        """
        for rank, blocks in self.blocks_by_rank():
            pos = 0
            for b in (self.blocks[k] for k in blocks):
                yield b, pieces[rank][pos:pos + size(b)]
                pos += size(b)

    def previous_payloads(self, full):
        """Per rank, its blocks' slices of ``full`` (zeros when None), under the current plan."""
        offsets = np.concatenate([[0], np.cumsum(self.n.astype(np.int64))])
        pieces = [[] for _ in range(self.cluster.size)]
        for b in self.blocks:
            rows = (np.zeros(b.n_rows) if full is None
                    else full[offsets[b.task] + b.start:offsets[b.task] + b.stop])
            pieces[self.cluster.worker_rank(b.worker)].append(rows)
        return [np.concatenate(p) if p else np.zeros(0) for p in pieces]

    def run(self, resume=None):
        if resume is not None:
            self.restore(resume())        # read (and checked) on the server, workers already serving
        else:
            self.push_sigma()
        converged = alternate(self.config, lambda p: self.w_step(), self.omega, self.outer_state, self.warn)
        if self.want_test or self.scores_off_supports:
            self.push_dense_w()
        if self.want_test:
            self.test = self.test_metrics(not get_loss(self.config.loss).binary_labels)
        return converged

    # -- checkpoints -------------------------------------------------------------
    def checkpoint_state(self):
        """(server arrays, per-block worker state, counters) for :class:`hpcmtl.checkpoint.Checkpointer`."""
        if self.local_phase:
            self.pull_local()             # B lives on the workers during local rounds
        blocks = [{"task": b.task, "part": b.part, "start": b.start, "stop": b.stop,
                   "alpha": st.alpha, "order": st.order, "shrink": st.shrink}
                  for b, st in self.gather_state()]
        arrays = {"BT": self.space.dense(self.BT), "Sigma": self.Sigma, "rho": np.array(self.rho)}
        if not self.safe:
            arrays.update(rho_task=self.rho_task, step=self.step)
        if self.momentum:
            arrays.update(beta=self.beta, dPT=self.space.dense(self.dPT), previous=self.gather_previous())
        arrays.update(self.history.checkpoint_arrays())
        counters = {"round": self.round, "t": self.t, "outer": self.outer_state.p,
                    "previous": self.outer_state.previous, "seconds": self.elapsed(),
                    "bytes": self.cluster.bytes_moved, "wsteps": self.outer_state.wsteps,
                    "dp_known": bool(self.momentum == "box" and self.dp_known), "ipm_tried": bool(self.ipm_tried)}
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
        self.Sigma = ck["arrays"]["Sigma"].copy()
        # rho depends on how tasks are cut into blocks, which may differ at another rank count
        self.rho = safe_rho(self.Sigma, self.blocks_per_task, self.config.eta)
        if not self.safe:
            self.rho_task = np.asarray(ck["arrays"]["rho_task"], dtype=np.float64).copy()
            self.step = np.asarray(ck["arrays"]["step"], dtype=np.float64).copy()
        if self.momentum:
            self.beta = np.asarray(ck["arrays"]["beta"], dtype=np.float64).copy()
            self.dPT = self.space.compact(ck["arrays"]["dPT"])
        c = ck["counters"]
        self.round, self.t = int(c["round"]), int(c["t"])
        self.dp_known = bool(c.get("dp_known", False))    # dPT is the workers' X^T p / n (box momentum)
        self.ipm_tried = bool(c.get("ipm_tried", False))
        self.mirrored = False
        self.outer_state = OuterState(int(c["outer"]), c["previous"], c.get("wsteps", []))
        self.seconds_before = float(c["seconds"])
        self.cluster.bytes_moved = int(c["bytes"])
        self.history.restore(ck["arrays"])
        self.halving = (None, 0, (np.inf, 0))
        self.recompute_w()
        self.push_sigma()                                  # also resets shrinking: restored next
        self.command(DMTRLCommand.SET_STATE, payload=block_payloads(ck, self.blocks, self.cluster))
        if self.momentum:
            self.command(DMTRLCommand.SET_PREVIOUS,
                         payload=self.previous_payloads(np.asarray(ck["arrays"]["previous"])))
        self.push_w(False)


def train(cluster, source, config: DMTRLConfig, test_source=None, sigma_fixed=None, progress=None,
          checkpointer=None, resume=None, warn=None, make_local=None, server_class=None):
    """Run DMTRL (or STL / a fixed Sigma) on every rank; the server returns a TrainResult.

    ``source`` / ``test_source`` are task sources (:class:`hpcmtl.store.TaskFile`
    or :class:`hpcmtl.estimators.MemoryTasks`): each rank reads its own blocks.
    ``checkpointer`` (server) writes checkpoints and reacts to termination
    signals; ``resume`` (server) is a checkpoint path to continue from;
    ``warn(message)`` (server) hears of every W-step that ended unconverged
    (default: a :class:`DMTRLConvergenceWarning`).  ``converged`` of the result
    is True only when every W-step reached ``tol``.  Workers return None.
    The warm-start hook of :mod:`hpcmtl.model_selection`: ``make_local()``
    returns this rank's local state over blocks already in memory (default:
    read them), ``server_class`` replaces :class:`Server` (same arguments).
    """
    config.validate()
    if config.relationship == "fixed":
        sigma_fixed = check_sigma(sigma_fixed, source.n_tasks)

    make_local = make_local or engine.local_reader(functools.partial(LocalBlocks, consume=True), cluster, source,
                                                   config, test_source)

    def make_server(cluster):          # the planned cluster the local state was read under
        return (server_class or Server)(cluster, source, config, sigma_fixed, progress, checkpointer, test=test_source is not None,
                      warn=warn)

    def result(server, converged, extra):
        W, intercept = engine.split_intercept(server.dense_wt().T, config, source)
        return TrainResult(W=W, Sigma=server.Sigma.copy(), intercept=intercept,
                           history=server.history.arrays(),
                           config=config.to_dict(), task_names=server.names, converged=converged,
                           n_rounds=server.round, seconds=server.elapsed(), bytes_moved=cluster.bytes_moved,
                           rho=server.rho if server.safe else float(np.max(server.rho_task)), test=server.test,
                           extra=extra, wsteps=server.outer_state.wstep_arrays())

    state = None if resume is None else (lambda: read_compatible(resume, config, source, sigma_fixed))
    return engine.train(cluster, make_local, make_server, result, state)


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
