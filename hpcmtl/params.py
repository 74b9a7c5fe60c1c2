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

# the choices of the methods' string parameters, in the order the command line lists them
RELATIONSHIPS = ("learned", "identity", "fixed")
AGGREGATIONS = ("qp", "adaptive", "line", "safe")
LOCAL_SOLVERS = ("auto", "sdca", "exact")
EXCHANGES = ("auto", "dense")
PROJECTIONS = ("l1inf", "l1", "l2")
UPDATES = ("implicit", "perceptron", "infinite")
NORMS = ("linf", "l1", "l2", "rmax", "p")
DECODERS = ("loss", "hamming")                     # output codes' decoders (hpcmtl.output_codes.decode)
STREAM_SCALINGS = ("none", "l2", "maxabs", "tfidf")  # a stream's feature scaling (hpcmtl.stream_scaling)
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
    "max_rounds": Param(COUNT, 500, "rounds per W-step; past them a DMTRL W-step goes on while its "
                                    "gap's rate reaches --tol within 4x as many (docs/cli.md)"),
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
    "outer": Param(COUNT, 30, "maximum W-steps (Omega-steps + 1; one W-step when Sigma is fixed)"),
    "outer_tol": Param(Interval(float, 0, math.inf, "both"), 2e-4,
                       "learned Sigma: stop when the joint relative duality gap of the learned-Sigma problem "
                       "(P(W) with the squared trace norm) is at most this: the optimum certified"),
    "eig_floor": Param(POSITIVE, 1e-8, "eigenvalues of (W^T W)^(1/2) floored at this fraction of the largest "
                       "(the final floor: a larger one while the joint gap is open)"),
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
    "decoder": Param(DECODERS, "loss", "an output code's decoder: loss (the least summed hinge loss, Allwein et al. "
                                       "2000) or hamming (ties to the least hinge loss)"),
    "scale": Param(STREAM_SCALINGS, "none", "the stream's feature scaling, shared by --test: l2 (unit rows), maxabs "
                                            "(features in [-1, 1]), tfidf (counts: log idf, unit rows)"),
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
