"""The update rules of online multitask learning with a shared loss (paper 004, Dekel, Long and Singer).

k binary tasks learn in parallel from a stream.  On round t task j sees x_tj
(one shared instance for all tasks in the multilabel case), predicts
``sign(w_j . x_tj)``, gets y_tj and suffers the hinge loss
``l_tj = [1 - y_tj w_j . x_tj]_+``; the round's global loss is ``||l_t||`` for an
absolute norm (p-norms, r-max norms).  Every rule updates
``w_j <- w_j + tau_j y_tj x_tj`` (Fig. 1) and differs only in tau:

* ``perceptron`` (finite horizon, Eq. 9): ``tau = argmax tau . l`` over
  ``||tau||^* <= C`` (Eq. 11 for p-norms, Eq. 12 for r-max norms).
* ``infinite`` (Eq. 16): the same direction with ``||tau||^* <= min(C, ||l|| / (R^2 rho^2))``,
  rho the remoteness of the dual norm (Lemma 2: ``k^(1/p - 1/2)`` for p < 2, else 1;
  Lemma 3: ``sqrt(r)``).
* ``implicit`` (Eq. 23, dual Lemma 8): ``tau = argmax sum_j 2 tau_j l_j - tau_j^2 ||x_j||^2``
  over ``tau >= 0, ||tau||^* <= C``, solved exactly for the L2 norm (Sec. 6) and
  for r-max norms (Sec. 7; L-inf is r = 1, L1 is r = k) in O(k log k).

``C = "auto"`` (:func:`auto_C`, every update and norm) is the dual norm of the
implicit update's unconstrained step on a typical first round,
``|| (1/s, ..., 1/s) ||^*`` over the a active tasks of a round, s the mean
``||x||^2`` of the stream: ``sqrt(a) / s`` (L2), ``a / s`` (L-inf),
``1 / s`` (L1), ``max(1, a / r) / s`` (r-max), ``a^(1 - 1/p) / s`` (p).
Corollary 5's ``1 / (sqrt(T) R^2)`` (:func:`horizon_C`) assumes a comparator
with ``R^2 sum_j ||w_j*||^2 = rho^2``, which real streams miss by orders of
magnitude: it left one-vs-rest MNIST at chance (docs/math.md).

A dormant task (label 0) has loss 0, so its tau is 0 and its hypothesis stays
(Sec. 9).  The arithmetic is in ``_online.pyx``; this module holds the rule
names, the norms, the choices of C, the validation that turns settings into a
:class:`Rule` (the form the kernels take) and :func:`tau` for one round or a
batch of rounds.  The learners are :class:`hpcmtl.estimators.OnlineMultitask`
and :class:`hpcmtl.estimators.OnlineECOC`; the distributed run is
:mod:`hpcmtl.online`; the code matrices are :mod:`hpcmtl.output_codes`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _online, params
from ._online import NormId, UpdateId
from .errors import InputError
from .losses import check_choice

_UPDATE_IDS = {"perceptron": UpdateId.PERCEPTRON, "infinite": UpdateId.INFINITE_HORIZON, "implicit": UpdateId.IMPLICIT}
UPDATES = {name: _UPDATE_IDS[name] for name in params.UPDATES}     # the names once, in params.py
NORMS = params.NORMS


# ---------------------------------------------------------------------------
# Norms and the rules in isolation
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """A validated update rule for k tasks, in the form the kernels take."""
    update: UpdateId
    norm: NormId       # PNORM (1 < p < inf) or RMAX
    p: float
    r: int
    C: float
    R2: float
    rho2: float

    def args(self):
        return (self.update, self.norm, self.p, self.r, self.C, self.R2, self.rho2)


def resolve_norm(norm, p, r, k, owner="tau"):
    """(norm id, p, r) with L1 = r-max at r = k and L-inf = r-max at r = 1 (Sec. 1)."""
    check_choice("norm", norm, NORMS, owner)
    if norm == "linf":
        return NormId.RMAX, math.inf, 1
    if norm == "l1":
        return NormId.RMAX, 1.0, k
    if norm == "l2":
        return NormId.PNORM, 2.0, 0
    if norm == "rmax":
        if not (isinstance(r, (int, np.integer)) and 1 <= r <= k):
            raise InputError(f"The 'r' parameter of {owner} must be an integer in 1..{k} (the number of tasks). "
                             f"Got {r!r} instead.")
        return NormId.RMAX, 0.0, int(r)
    p = float(p)
    if not p >= 1:
        raise InputError(f"The 'p' parameter of {owner} must be >= 1 (or inf). Got {p!r} instead.")
    if p == 1:
        return NormId.RMAX, 1.0, k
    if math.isinf(p):
        return NormId.RMAX, math.inf, 1
    return NormId.PNORM, p, 0


def remoteness(norm_id, p, r, k):
    """rho of the dual norm: Lemma 2 for p-norms, Lemma 3 (sqrt(r)) for r-max norms."""
    if norm_id == NormId.RMAX:
        return math.sqrt(r)
    return 1.0 if p >= 2 else k ** (1.0 / p - 0.5)


def horizon_C(n_rounds, R):
    """Corollary 5: ``C = 1 / (sqrt(T) R^2)`` for a known horizon T (the paper's worst-case choice, not ``"auto"``)."""
    return 1.0 / (math.sqrt(n_rounds) * R * R)


def auto_C(norm_id, p, r, n_active, mean_sq_norm):
    """``C = "auto"``: the largest step a typical round asks of the implicit update, measured in the dual norm.

    On the first round (w = 0) every active task has hinge loss 1, and Lemma 8
    without its constraint gives ``tau_j = l_j / ||x_j||^2``: the step that puts
    every margin at exactly 1.  With the stream's mean ``||x||^2`` s and a
    active tasks a round that vector is ``(1/s) 1_a``; C is its dual norm, so
    the constraint ``||tau||^* <= C`` is slack on such a round and binds when a
    round asks for more (losses above 1, short instances).  The dual norm of
    ``1_a`` is ``a^(1 - 1/p)`` for a p-norm (``sqrt(a)`` for L2) and
    ``max(1, a / r)`` for an r-max norm (``a`` for L-inf, 1 for L1).

    C scales as ``1 / ||x||^2`` (scaling every x by c gives the same margins and
    predictions) and grows with the number of tasks exactly as the dual norm
    spreads the budget over them.  Theorems 4 and 6 (and 9) hold for every
    C > 0, so every bound keeps its form; only Corollaries 5 and 7's choices of
    C are replaced.
    """
    a = max(1.0, float(n_active))
    if not (np.isfinite(mean_sq_norm) and mean_sq_norm > 0):
        raise InputError(f"C=auto scales as 1 / mean ||x||^2, which is {mean_sq_norm!r} here (all-zero or "
                         f"non-finite instances); give C a number")
    ones = max(1.0, a / r) if norm_id == NormId.RMAX else a ** (1.0 - 1.0 / p)
    return ones / float(mean_sq_norm)


def make_rule(k, C, update="implicit", norm="rmax", p=2.0, r=1, R=None, owner="tau", typical=None):
    """Validate the settings of a rule for k tasks.

    ``C="auto"`` needs ``typical = (active tasks a round, mean ||x||^2)`` (:func:`auto_C`);
    the infinite-horizon update needs R, a bound on ``||x||``.
    """
    check_choice("update", update, tuple(UPDATES), owner)
    norm_id, p, r = resolve_norm(norm, p, r, k, owner)
    if update == "implicit" and norm_id == NormId.PNORM and p != 2:
        raise InputError(f"The implicit update of {owner} is solved exactly for the L2 and r-max norms "
                         f"(l1, linf, rmax, p in 1, 2, inf). Got p={p!r} instead.")
    rho = remoteness(norm_id, p, r, k)
    if update == "infinite" and not (isinstance(R, (int, float)) and np.isfinite(R) and R > 0):
        raise InputError(f"The 'R' parameter of {owner} (a bound on ||x||) must be > 0 for "
                         f"the infinite-horizon update. Got {R!r} instead.")
    if isinstance(C, str) and C == "auto":
        if typical is None:
            raise InputError(f"C=auto of {owner} needs the stream's typical round (active tasks, mean ||x||^2)")
        try:
            C = auto_C(norm_id, p, r, *typical)
        except InputError as exc:
            raise InputError(f"{owner}: {exc}") from None
    if not (isinstance(C, (int, float, np.floating)) and np.isfinite(C) and C > 0):
        raise InputError(f"The 'C' parameter of {owner} must be > 0 or 'auto'. Got {C!r} instead.")
    R2 = float(R) ** 2 if R is not None else 1.0
    return Rule(UPDATES[update], norm_id, float(p), int(r), float(C), R2, rho * rho)


def tau(losses, sq_norms, C, update="implicit", norm="rmax", p=2.0, r=1, R=None):
    """The update weights of one round (or of each row of a (T x k) array).

    Parameters
    ----------
    losses : (k,) or (T x k) hinge losses, >= 0 (0 for a dormant task)
    sq_norms : same shape, ``||x_j||^2``
    C : aggressiveness (``||tau||^* <= C``)
    update : ``"perceptron"`` (Eq. 9), ``"infinite"`` (Eq. 16) or ``"implicit"`` (Lemma 8)
    norm : ``"linf"``, ``"l1"``, ``"l2"``, ``"p"`` (with ``p``) or ``"rmax"`` (with ``r``)
    R : bound on ``||x||`` (infinite horizon)

    Returns
    -------
    tau : array of the same shape, non-negative, 0 where the loss is 0.
    """
    losses = np.asarray(losses, dtype=np.float64)
    sq_norms = np.asarray(sq_norms, dtype=np.float64)
    one = losses.ndim == 1
    L = np.ascontiguousarray(np.atleast_2d(losses))
    S = np.ascontiguousarray(np.atleast_2d(sq_norms))
    if L.shape != S.shape or L.ndim != 2:
        raise InputError(f"losses and sq_norms must have the same shape (k,) or (T, k); got {losses.shape} "
                         f"and {sq_norms.shape}")
    if not (np.all(np.isfinite(L)) and np.all(L >= 0) and np.all(np.isfinite(S)) and np.all(S >= 0)):
        raise InputError("losses and sq_norms must be finite and >= 0")
    rule = make_rule(L.shape[1], C, update, norm, p, r, R, typical=(L.shape[1], float(np.mean(S)) if S.size else 0.0))
    out = _online.tau_rounds(L, S, *rule.args())
    return out[0] if one else out

