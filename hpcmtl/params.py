"""One table of the user-facing hyper-parameters, and the one validation that reads it.

Each parameter is declared once in :data:`PARAMS` (name -> :class:`Param`): its type
and interval (open or closed ends), or its choices, whether ``'auto'`` is allowed, its
default and its help text.  The same entry serves

* :func:`validate`, called by the configs (``DMTRLConfig``, ``JointSparseConfig``,
  ``OnlineConfig``) and so by the estimators' ``fit``, with one message style::

      The 'lam' parameter of DMTRL must be > 0. Got -1 instead.

* the command line (``hpcmtl train``): :func:`argparse_type` converts an option's text
  and :func:`option_keywords` fills its ``type``, ``choices``, ``default`` and ``help``.

The idea follows scikit-learn's ``sklearn/utils/_param_validation.py`` (constraints as
values, one checker, one message).  NumPy scalars (``np.float32``, ``np.int64``) are
accepted where a number is expected and become Python numbers; ``bool`` is refused
where a number is expected.  Rules that couple two parameters (``local_solver='exact'``
only for the squared loss, the online norm and update rules) stay with their method.
"""
from __future__ import annotations

import argparse
import math
import numbers
from dataclasses import dataclass

import numpy as np

from .errors import InputError
from .losses import LOSSES, closest
from .progress import DEFAULT_SECONDS

# the choices of the methods' string parameters, in the order the command line lists them
RELATIONSHIPS = ("learned", "identity", "fixed")
AGGREGATIONS = ("qp", "adaptive", "line", "safe")
LOCAL_SOLVERS = ("auto", "sdca", "exact")
EXCHANGES = ("auto", "dense")
PROJECTIONS = ("l1inf", "l1", "l2")
UPDATES = ("implicit", "perceptron", "infinite")
NORMS = ("linf", "l1", "l2", "rmax", "p")
KERNELS = ("rbf", "linear", "poly")
METRICS = ("rmse", "error", "auc", "logloss")     # validation metrics of a lam grid (hpcmtl.model_selection)


@dataclass(frozen=True)
class Interval:
    """Numbers of one kind (``int`` or ``float``) between ``low`` and ``high``.

    ``None`` for an end means unbounded (a float must then be finite on that side);
    ``closed`` is ``"left"``, ``"right"``, ``"both"`` or ``"neither"``.
    """
    kind: type
    low: float | None = None
    high: float | None = None
    closed: str = "left"

    def is_type(self, value) -> bool:
        if isinstance(value, (bool, np.bool_)):
            return False
        return isinstance(value, numbers.Integral if self.kind is int else numbers.Real)

    def __contains__(self, value) -> bool:
        if not self.is_type(value):
            return False
        if self.low is None and self.high is None and self.kind is float:
            return math.isfinite(value)
        left = self.closed in ("left", "both")
        right = self.closed in ("right", "both")
        if self.low is not None and not (value >= self.low if left else value > self.low):
            return False
        if self.high is None:
            return self.kind is int or value < math.inf
        return value <= self.high if right else value < self.high

    def __str__(self) -> str:
        prefix = "an integer " if self.kind is int else ""
        if self.low is None and self.high is None:
            return "an integer" if self.kind is int else "a finite number"
        if self.high is None or self.high == math.inf:
            return f"{prefix}{'>=' if self.closed in ('left', 'both') else '>'} {self.low:g}"
        if self.low is None:
            return f"{prefix}{'<=' if self.closed in ('right', 'both') else '<'} {self.high:g}"
        brackets = {"left": "[)", "right": "(]", "both": "[]", "neither": "()"}[self.closed]
        return f"{prefix}in {brackets[0]}{self.low:g}, {self.high:g}{brackets[1]}"


@dataclass(frozen=True)
class Param:
    """One parameter: an :class:`Interval`, choices, or a bool; ``auto`` also allows 'auto'."""
    constraint: object                  # Interval | tuple of choices | bool (the type)
    default: object
    help: str
    auto: bool = False

    def allows(self, value) -> bool:
        if self.auto and isinstance(value, str) and value == "auto":
            return True
        if isinstance(self.constraint, Interval):
            return value in self.constraint
        if isinstance(self.constraint, tuple):
            return isinstance(value, str) and value in self.constraint
        return isinstance(value, (bool, np.bool_))

    def rule(self) -> str:
        """What the message says the value must be."""
        if isinstance(self.constraint, tuple):
            text = "one of " + ", ".join(self.constraint)
        elif isinstance(self.constraint, Interval):
            text = str(self.constraint)
        else:
            text = "True or False"
        return text + (" or 'auto'" if self.auto else "")


POSITIVE = Interval(float, 0, None, "neither")
COUNT = Interval(int, 1)
NONNEGATIVE_INT = Interval(int, 0)

PARAMS = {
    # loss and features
    "loss": Param(tuple(LOSSES), "hinge", "hinge, smoothed-hinge, squared or logistic"),
    "gamma": Param(POSITIVE, 1.0, "smoothed-hinge parameter"),
    "max_rounds": Param(COUNT, 500, "rounds per W-step"),
    "seed": Param(NONNEGATIVE_INT, 0, "random numbers (coordinate orders, random features)"),
    "rff_dim": Param(NONNEGATIVE_INT, 0, "random Fourier features (0: the features as they are)"),
    "rff_gamma": Param(POSITIVE, 1.0, "RBF kernel width of the random features"),
    "split_tasks": Param(bool, False, "split tasks larger than a worker's share"),
    "float32": Param(bool, False, "hold the features in float32 (half the memory of X; every sum, the gap and "
                                  "the model stay float64); a float32 task file trains in float32 without it"),
    "positive_label": Param(Interval(float), None, "classification losses: the label value of the positive "
                                                   "class; the other class becomes -1 (none: labels are -1/+1)"),
    "fit_intercept": Param(bool, True, "a per-task intercept b_i (squared loss and joint-sparse: unpenalized; "
                                       "hinge and logistic losses: liblinear's augmented feature, docs/math.md)"),
    "intercept_scaling": Param(POSITIVE, 1.0, "value of the augmented intercept feature (hinge and logistic "
                                              "losses; larger: a weaker penalty on the intercept)"),
    # dual coordinate ascent (DMTRL and the engines sharing it)
    "lam": Param(POSITIVE, 1e-3, "regularization (required)"),
    "tol": Param(POSITIVE, 1e-6, "relative duality gap of a W-step"),
    "local_iters": Param(POSITIVE, 1.0, "local SDCA steps per round, as a multiple of the block's rows"),
    "local_steps": Param(COUNT, 100, "local rounds (a diagonal Sigma, aggregations other than safe): at most this "
                                     "many local steps a task takes in one round, each with its exact step sizes, "
                                     "until its own gap is within tol (1: one a round, as an exchanged round)"),
    "gap_every": Param(COUNT, 1, "compute the duality gap every N rounds"),
    "shrinking": Param(bool, True, "liblinear-style shrinking of the local SDCA (hinge losses)"),
    "outer": Param(COUNT, 10, "maximum Omega-steps + 1 (one W-step when Sigma is fixed)"),
    "outer_tol": Param(Interval(float, 0, math.inf, "both"), 1e-5,
                       "stop when the objective changes by at most this, relatively, between W-steps"),
    "eig_floor": Param(POSITIVE, 1e-8, "eigenvalues of (W^T W)^(1/2) floored at this fraction of the largest"),
    "relationship": Param(RELATIONSHIPS, "learned", "the task covariance: learned, identity or fixed"),
    "local_solver": Param(LOCAL_SOLVERS, "auto",
                          "the local subproblems: sdca (paper 001's local SDCA), exact (squared loss: solved exactly), "
                          "auto (exact where it is cheap: the squared loss up to 2048 features, hinge and smoothed "
                          "hinge on blocks of up to 64 rows; aggregations other than safe; and for hinge and smoothed "
                          "hinge under a coupled Sigma with at most 64 features and 1024 features x tasks, every "
                          "task one block: interior-point W-steps, the qp rounds after them if they stall; under any "
                          "Sigma, interior-point rounds once a W-step whose gap stops halving for 10 rounds (5 local "
                          "rounds), up to 256 features)"),
    "exchange": Param(EXCHANGES, "auto",
                      "auto: while Sigma is diagonal (STL, a diagonal fixed Sigma, the first W-step of a learned "
                      "one), every task is one block and the loss is not squared, workers take whole rounds alone "
                      "and send 5 numbers a "
                      "task, no d-vectors, and other rounds move delta b and w on each block's support only (the "
                      "features its rows touch, when not all d); dense: every round exchanges whole delta b and w "
                      "(for comparisons)"),
    "aggregation": Param(AGGREGATIONS, "qp",
                         "'safe' is paper 001's Lemma 6.7 rho (its experiments as published); the others take "
                         "optimistic local steps and the exact dual-maximizing step per task with momentum (qp; "
                         "adaptive: also adapts each task's rho) or one common step (line). All keep the "
                         "duality-gap certificate and dual ascent"),
    "eta": Param(Interval(float, 0, 1, "right"), 1.0,
                 "safe aggregation: the step applied to every local update (paper 001's eta); other "
                 "aggregations: the largest step"),
    # l1,inf ball
    "radius": Param(POSITIVE, 1.0, "the ball radius C (or --path)"),
    "projection": Param(PROJECTIONS, "l1inf", "the constraint (l1 / l2: every task column in its own ball)"),
    "eta0": Param(POSITIVE, 1.0, "step size eta0 / sqrt(t)"),
    "intercept_eta0": Param(POSITIVE, 1.0, "the intercepts' own step size intercept_eta0 / sqrt(t) (they are not "
                                           "in the ball, so eta0, sized for it, does not fit them)"),
    # online rule (the coupled checks of norm, r, p, C and R are online.make_rule's)
    "update": Param(UPDATES, "implicit",
                    "implicit (Sec. 5), finite-horizon Perceptron (Sec. 3) or infinite horizon (Sec. 4)"),
    "norm": Param(NORMS, "rmax", "the global loss (rmax with --r; p with --p)"),
    "r": Param(COUNT, 1, "r of the r-max norm (1 = L-inf, k = L1)"),
    "p": Param(Interval(float, 1, None, "left"), 2.0, "p of the p-norm"),
    "C": Param(POSITIVE, 1.0, "aggressiveness, or 'auto': the dual norm of a unit step 1/mean||x||^2 on every "
                              "active task (docs/math.md)", auto=True),
    "R": Param(POSITIVE, None, "bound on ||x|| for the infinite-horizon update (none: the stream's largest "
                               "instance norm)"),
    "block_rounds": Param(COUNT, 64, "rounds per exchange with the workers (same sequential algorithm at any value)"),
    "chunk_rounds": Param(COUNT, 4096, "rounds read from the file at a time (bounds memory)"),
    # task graph (GraphMTL)
    "kernel": Param(KERNELS, "rbf", "the base kernel of the product multi-task kernel"),
    "normalize": Param(bool, True, "the task kernel with unit diagonal"),
    "exact": Param(bool, True, "an SVM on the exact product kernel (else the DMTRL engine)"),
    "degree": Param(NONNEGATIVE_INT, 3, "degree of the poly base kernel"),
    "coef0": Param(Interval(float), 1.0, "constant term of the poly base kernel"),
    # a grid of lam chosen by validation (hpcmtl.model_selection)
    "validation_fraction": Param(Interval(float, 0, 1, "neither"), None,
                                 "hold out this fraction of every task's rows (stratified by label for "
                                 "classification, seeded by --seed) to choose lam from a grid (a grid without "
                                 "--cv: 0.2)"),
    "cv": Param(Interval(int, 2), None, "choose lam by K-fold cross-validation within every task (stratified, seeded)"),
    "metric": Param(METRICS, None, "the validation metric: rmse (squared loss, the default there), error (the "
                                   "default otherwise), auc or logloss"),
}


def check_positive_label(value, loss: str, owner: str):
    """``positive_label``: None, or a finite number with a classification loss; returned as a Python float."""
    if value is None:
        return None
    value = validate({"positive_label": value}, owner)["positive_label"]
    if not LOSSES[loss].binary_labels:
        raise InputError(f"The 'positive_label' parameter of {owner} is for classification losses; the {loss} "
                         f"loss reads the labels as numbers. Got {value!r} instead.")
    return float(value)


def validate(params: dict, owner: str) -> dict:
    """Check ``{name: value}`` against :data:`PARAMS`; the values with NumPy scalars as Python numbers.

    The first wrong value raises :class:`InputError`: "The 'lam' parameter of DMTRL
    must be > 0. Got -1 instead." (with a 'Did you mean' for a misspelt choice).
    """
    out = {}
    for name, value in params.items():
        param = PARAMS[name]
        plain = value.item() if isinstance(value, np.generic) else value
        if not param.allows(value):
            hint = closest(value, param.constraint) if isinstance(param.constraint, tuple) else ""
            raise InputError(f"The '{name}' parameter of {owner} must be {param.rule()}. "
                             f"Got {plain!r} instead.{hint}")
        out[name] = plain
    return out


# ---------------------------------------------------------------------------
# the command line: option text -> value, and an option's argparse keywords
# ---------------------------------------------------------------------------
def number_type(flag: str, interval: Interval):
    """An argparse ``type`` reading a number for ``flag``, checking the interval's lower end.

    The messages are the command line's ("--lam must be > 0, got -1"); an upper end
    and a closed lower end of a float are left to :func:`validate` on the config.
    """
    def parse(text):
        try:
            value = interval.kind(text)
        except ValueError:
            what = "an integer" if interval.kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{flag} must be {what}, got {text!r}") from None
        low = interval.low
        if interval.kind is int and low is not None and value < low:
            raise argparse.ArgumentTypeError(f"{flag} must be >= {low}, got {value}")
        if interval.kind is float and low is not None and interval.closed in ("right", "neither"):
            if not value > low or value != value or value == float("inf"):
                raise argparse.ArgumentTypeError(f"{flag} must be > {low:g}, got {text}")
        return value
    return parse


def number_list_type(flag: str, interval: Interval):
    """An argparse ``type``: one number of ``interval`` (a float) or a comma-separated list (a list of floats,
    each checked like one): a grid chosen by validation (``--lam``, ``--alpha``)."""
    one = number_type(flag, interval)

    def parse(text):
        if "," not in text:
            return one(text)
        values = [one(part.strip()) for part in text.split(",")]
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"{flag} lists a value twice: {text!r}")
        return values
    return parse


def log_grid_type(flag: str):
    """An argparse ``type`` for a log range ``LO:HI:COUNT`` (0 < LO < HI, COUNT >= 2) -> COUNT floats."""
    def parse(text):
        parts = text.split(":")
        try:
            if len(parts) != 3:
                raise ValueError
            lo, hi, count = float(parts[0]), float(parts[1]), int(parts[2])
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be LO:HI:COUNT (e.g. 1e-5:1:13), got {text!r}") from None
        if not (0 < lo < hi < math.inf) or count < 2:
            raise argparse.ArgumentTypeError(f"{flag} needs 0 < LO < HI and COUNT >= 2, got {text!r}")
        return [float(v) for v in np.logspace(math.log10(lo), math.log10(hi), count)]
    return parse


def argparse_type(name: str, flag: str):
    """The argparse ``type`` of parameter ``name`` given as option ``flag`` (None for a string)."""
    constraint = PARAMS[name].constraint
    return number_type(flag, constraint) if isinstance(constraint, Interval) else None


def option_keywords(name: str, flag: str, **given) -> dict:
    """argparse keywords of the option ``flag`` for parameter ``name``; ``given`` ones win.

    ``type`` and ``choices`` come from the constraint, ``default`` and ``help`` from
    the table; a bool parameter is a ``store_true`` flag.
    """
    param = PARAMS[name]
    kw = {"default": param.default, "help": param.help}
    if isinstance(param.constraint, tuple):
        kw["choices"] = param.constraint
    elif isinstance(param.constraint, Interval):
        kw["type"] = argparse_type(name, flag)
    else:
        kw = {"action": "store_true", "help": param.help}
    kw.update(given)
    return {k: v for k, v in kw.items() if v is not None or k == "default"}


# ---------------------------------------------------------------------------
# hpcmtl train: every option once, in groups; each method's sub-parser takes the groups it reads
# ---------------------------------------------------------------------------
# the methods, in the order the command line lists them: the names and help here (the option table below reads
# them), the behaviour of each in hpcmtl.methods.METHODS (one row a method, checked to agree with these names)
METHOD_HELP = {
    "dmtrl": "distributed multi-task relationship learning (paper 001)",
    "stl": "single-task learning: every task alone (Sigma = identity), same engine",
    "fixed": "a fixed task covariance (--sigma), same engine",
    "graph": "a task-graph kernel as the fixed covariance (paper 003), same engine",
    "ssdca": "centralized baseline: single-machine SDCA over all tasks (rank 0)",
    "mtrl-central": "centralized baseline: exact MTRL for the squared loss, SSDCA otherwise (rank 0)",
    "l1inf": "joint feature selection under an l1,inf ball (paper 002)",
    "online": "online multitask learning from a stream (paper 004)",
}
TRAIN_METHODS = tuple(METHOD_HELP)
TASK_METHODS = tuple(m for m in TRAIN_METHODS if m != "online")                 # read --train (online: --stream)
DISTRIBUTED_SDCA = ("dmtrl", "stl", "fixed", "graph")                           # DMTRL's engine under mpiexec
SDCA_METHODS = DISTRIBUTED_SDCA + ("ssdca", "mtrl-central")                     # + the centralized baselines
CHECKPOINTED = DISTRIBUTED_SDCA + ("l1inf", "online")
METHOD_DEFAULTS = {m: {"max_rounds": 500} for m in SDCA_METHODS} | {"l1inf": {"max_rounds": 200}}


def train_option_groups():
    """(title, methods, [(flags, argparse keywords), ...]) of ``hpcmtl train``: each option once.

    A hyper-parameter's keywords come from :data:`PARAMS` (:func:`option_keywords`); the
    keywords written here are what the command line does differently (a required value
    has no default, ``--loss`` is checked by the config, ``--C`` is read as text).
    ``methods`` narrows an option to some of its group's methods, ``help_for`` gives a
    method its own help text.
    """
    def param(flag, **given):
        return (flag,), option_keywords(flag.lstrip("-").replace("-", "_"), flag, **given)

    return [
        ("data and output", TRAIN_METHODS, [
            (("--train",), dict(metavar="TRAIN.h5", methods=TASK_METHODS, help="the task dataset (required)")),
            (("--stream",), dict(metavar="STREAM.h5", methods=("online",),
                                 help="the stream, read in chunks of rounds (required)")),
            (("--out",), dict(required=True, metavar="RESULT.h5", help="the result file")),
            (("--test",), dict(metavar="TEST.h5", help="test tasks for the final model",
                               help_for={"online": "a test stream for the final model"})),
            (("--force",), dict(action="store_true", help="overwrite an existing result file")),
        ]),
        ("loss and features", TASK_METHODS, [
            param("--loss", choices=None),
            param("--gamma"),
            param("--max-rounds", default=None, help_for={"l1inf": "subgradient steps per radius"}),
            param("--seed"),
            param("--rff-dim"),
            param("--rff-gamma"),
            param("--split-tasks", methods=DISTRIBUTED_SDCA + ("l1inf",)),
            param("--float32", methods=DISTRIBUTED_SDCA),
            param("--positive-label", metavar="LABEL", default=None),
            (("--no-intercept",), dict(action="store_true", help="no per-task intercept (fit_intercept=False)")),
            param("--intercept-scaling", methods=SDCA_METHODS),
        ]),
        ("dual coordinate ascent", SDCA_METHODS, [
            param("--lam", default=None, type=number_list_type("--lam", POSITIVE),
                  help="regularization (required), or a comma-separated grid chosen by validation",
                  help_for={"ssdca": "regularization (required)", "mtrl-central": "regularization (required)"}),
            param("--tol"),
            param("--local-iters"),
            param("--local-steps"),
            param("--gap-every"),
            (("--no-shrinking",), dict(action="store_true",
                                       help="visit every coordinate in every pass (hinge losses)")),
            param("--outer"),
            param("--outer-tol", type=float),          # its range is the config's check, as it always was
            (("--sigma",), dict(metavar="SIGMA", methods=("fixed", "ssdca", "mtrl-central"),
                                help="the task covariance, from a result file (/model/Sigma) or a .npy file "
                                     "(required for fixed)")),
        ]),
        ("lam (l1inf: the radius) chosen by validation (one job, warm-started)",
         DISTRIBUTED_SDCA + ("l1inf",), [
            (("--lam-grid",), dict(metavar="LO:HI:COUNT", type=log_grid_type("--lam-grid"), methods=DISTRIBUTED_SDCA,
                                   help="a log-spaced grid of lam, e.g. 1e-5:1:13 (instead of --lam)")),
            param("--validation-fraction"),
            param("--cv", metavar="K"),
            param("--metric"),
            (("--no-warm-start",), dict(action="store_true", methods=DISTRIBUTED_SDCA,
                                        help="solve every grid point from zero (for comparisons)")),
        ]),
        ("aggregation of the workers' local steps", DISTRIBUTED_SDCA, [
            param("--aggregation"),
            param("--eta"),
            param("--exchange"),
            param("--local-solver"),
        ]),
        ("task graph", ("graph",), [
            (("--graph",), dict(help="a task graph (cycle, chain, complete, star, 'grid RxC', empty) or an "
                                     "edge-list CSV (task_a,task_b,weight) (required)")),
            (("--alpha",), dict(type=number_list_type("--alpha", Interval(float)), default=2.0 ** -8,
                                help="diagonal alpha of L + alpha I, or a comma-separated grid chosen by validation "
                                     "(at one --lam)")),
            (("--unnormalized",), dict(action="store_true", help="keep (L + alpha I)^-1 without unit diagonal")),
        ]),
        ("l1,inf ball", ("l1inf",), [
            param("--radius", default=None),
            (("--path",), dict(metavar="C1,C2,...", help="a regularization path, each radius warm-started from "
                                                         "the previous solution")),
            param("--projection"),
            param("--eta0"),
            param("--intercept-eta0"),
        ]),
        ("online rule", ("online",), [
            param("--update"),
            param("--norm"),
            param("--r"),
            param("--p", type=float),                  # p >= 1 is checked by the online rule
            param("--C", type=None, default="1.0"),    # a number or 'auto', read by online_config
            param("--R"),
            (("--code",), dict(help="an output code over a single-label stream's classes: exhaustive, "
                                    "one-vs-rest, random:K[:SEED] or a .npy matrix")),
            param("--block-rounds"),
            param("--chunk-rounds"),
        ]),
        ("checkpoints", CHECKPOINTED, [
            (("--checkpoint",), dict(metavar="PATH", help="checkpoint file (none: OUT.checkpoint.h5; always "
                                                          "written when SIGTERM, SIGUSR1 or SIGINT arrives)")),
            (("--checkpoint-every",), dict(type=number_type("--checkpoint-every", NONNEGATIVE_INT), default=0,
                                           metavar="N", help="also write a checkpoint every N rounds (0: never)")),
            (("--checkpoint-seconds",), dict(type=number_type("--checkpoint-seconds", POSITIVE), default=None,
                                             metavar="S", help="also write a checkpoint every S seconds")),
            (("--resume",), dict(action="store_true", help="continue from the checkpoint")),
        ]),
        ("logging", TRAIN_METHODS, [
            (("--quiet",), dict(action="store_true",
                                 help="same as --log-level error (a run that did not converge still says so)")),
            (("--log-level",), dict(choices=("debug", "info", "warning", "error"), default="info",
                                    help="info: progress and summary; warning: summary only; error: errors only")),
            (("--progress-seconds",), dict(type=float, default=DEFAULT_SECONDS, metavar="S",
                                           help="in a log (not a terminal) print at most one progress line every "
                                                "S seconds, plus the last line of every outer step; 0 prints every "
                                                "round")),
        ]),
    ]


def train_options_of(method):
    """{option string: (flags, argparse keywords)} of the options ``train METHOD`` takes."""
    out = {}
    for _, methods, options in train_option_groups():
        for flags, kw in options:
            if method in kw.get("methods", methods) and method in methods:
                own = {k: v for k, v in kw.items() if k not in ("methods", "help_for")}
                own["help"] = kw.get("help_for", {}).get(method, kw.get("help"))
                out[flags[0]] = (flags, own)
    return out
