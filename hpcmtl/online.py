"""Online multitask learning with a shared loss (paper 004, Dekel, Long and Singer).

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
(Sec. 9).  The arithmetic is in ``_online.pyx``; this module validates,
holds the learners (:class:`OnlineMultitask`, :class:`OnlineECOC`), the code
matrices, and the distributed run over the engine (workers own task columns,
the server computes tau once per round).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp

from . import _online, engine
from ._online import NormId, UpdateId
from .cluster import fault_point
from .engine import RunResult, ServerBase, peak_rss_mb
from .errors import InputError
from .losses import check_choice
from .params import validate as check_params
from .taskdata import rows_of

UPDATES = {"perceptron": UpdateId.PERCEPTRON, "infinite": UpdateId.INFINITE_HORIZON, "implicit": UpdateId.IMPLICIT}
NORMS = ("linf", "l1", "l2", "p", "rmax")


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


# ---------------------------------------------------------------------------
# Error-correcting output codes
# ---------------------------------------------------------------------------
def exhaustive_code(n_classes):
    """Dietterich and Bakiri's exhaustive code: every column with +1 in the first row, except all +1.

    For 5 classes this is the paper's 5 x 15 matrix (Sec. 8.2), in its column
    order; the distance between any two rows is ``2^(s-2)`` (8 for s = 5).
    """
    s = int(n_classes)
    if not 3 <= s <= 16:
        raise InputError(f"the exhaustive code needs 3..16 classes, got {s}")
    cols = []
    for n in range(2 ** (s - 1) - 2, -1, -1):
        bits = [(n >> b) & 1 for b in range(s - 2, -1, -1)]
        cols.append([1] + [1 if bit else -1 for bit in bits])
    return np.array(cols, dtype=np.float64).T


def one_vs_rest_code(n_classes):
    """``2 I - 1``: class c is positive for column c only."""
    return 2.0 * np.eye(int(n_classes)) - 1.0


def random_code(n_classes, n_columns, seed=0, tries=200):
    """A dense random +-1 code: of ``tries`` draws without repeated or constant columns, the largest row distance."""
    rng = np.random.default_rng(seed)
    best, best_d = None, -1
    for _ in range(tries):
        M = rng.choice([-1.0, 1.0], size=(n_classes, n_columns))
        if np.any(np.abs(M.sum(axis=0)) == n_classes) or len({tuple(c) for c in M.T}) < n_columns:
            continue
        dist = code_distance(M)
        if dist > best_d:
            best, best_d = M, dist
    if best is None:
        raise InputError(f"no random code with {n_columns} distinct non-constant columns for {n_classes} classes")
    return best


def code_distance(M):
    """Minimum Hamming distance between two rows of a code matrix."""
    M = np.asarray(M)
    return int(min(np.sum(M[a] != M[b]) for a in range(len(M)) for b in range(a + 1, len(M))))


def get_code(code, n_classes):
    """A code matrix by name (``exhaustive``, ``one-vs-rest``, ``random:K[:SEED]``) or a .npy file."""
    if isinstance(code, np.ndarray):
        M = np.asarray(code, dtype=np.float64)
    elif code == "exhaustive":
        M = exhaustive_code(n_classes)
    elif code == "one-vs-rest":
        M = one_vs_rest_code(n_classes)
    elif isinstance(code, str) and code.startswith("random:"):
        parts = code.split(":")
        try:
            M = random_code(n_classes, int(parts[1]), int(parts[2]) if len(parts) > 2 else 0)
        except (ValueError, IndexError):
            raise InputError(f"code {code!r}: expected random:COLUMNS[:SEED]") from None
    elif isinstance(code, str) and code.endswith(".npy"):
        try:
            M = np.load(code, allow_pickle=False).astype(np.float64)
        except OSError as exc:
            raise InputError(f"{code}: cannot read the code matrix: {exc}") from None
    else:
        raise InputError(f"unknown code {code!r}: use exhaustive, one-vs-rest, random:K[:SEED] or a .npy file")
    if M.ndim != 2 or M.shape[0] != n_classes or not np.all(np.isin(M, (-1.0, 1.0))):
        raise InputError(f"code {code if isinstance(code, str) else 'matrix'}: expected a {n_classes} x K "
                         f"matrix of -1/+1, got shape {M.shape}")
    return M


def hamming_decode(margins, M):
    """Class of each row of margins: the code row nearest to sign(margins) (a 0 margin counts half; ties -> lowest)."""
    signs = np.sign(np.asarray(margins))
    dist = (M.shape[1] - signs @ M.T) / 2.0
    return np.argmin(dist, axis=1)


def classes_from_onehot(Y, where, first_round=0):
    """Class index of each row of a single-label +-1 matrix (exactly one +1 per row)."""
    Y = np.asarray(Y)
    positives = (Y == 1).sum(axis=1)
    bad = np.flatnonzero(positives != 1)
    if bad.size:
        raise InputError(f"{where}: field 'Y': round {first_round + int(bad[0])} has {int(positives[bad[0]])} "
                         f"positive labels; "
                         f"an output code needs exactly one class per round")
    return np.argmax(Y == 1, axis=1)


# ---------------------------------------------------------------------------
# Running metrics of a stream (paper 004, Sec. 8.1)
# ---------------------------------------------------------------------------
class RunningMetrics:
    """Per-round global loss, 1-error (tasks wrong) and inf-error (any task wrong).

    A task is wrong on a round when ``y w . x <= 0`` (the paper's e_tj); dormant
    tasks are never wrong.  With a code, also the multiclass error after
    Hamming decoding.
    """
    COLUMNS = ("global_loss", "n_errors", "n_active", "multiclass_error")

    def __init__(self):
        self.parts = {k: [] for k in self.COLUMNS}

    def add(self, Y, margins, global_loss, code=None, classes=None):
        wrong = mistakes(Y, margins)
        self.parts["global_loss"].append(np.asarray(global_loss, dtype=np.float64).copy())
        self.parts["n_errors"].append(wrong.sum(axis=1).astype(np.int32))
        self.parts["n_active"].append((Y != 0).sum(axis=1).astype(np.int32))
        if code is not None:
            self.parts["multiclass_error"].append(multiclass_mistakes(margins, code, classes).astype(np.int8))

    def extend(self, arrays):
        for k, v in arrays.items():
            if k in self.parts and len(v):
                self.parts[k].append(np.asarray(v))

    @property
    def n_rounds(self):
        return int(sum(len(a) for a in self.parts["global_loss"]))

    def arrays(self):
        """Per-round columns plus the cumulative global loss and error rates so far."""
        out = {k: np.concatenate(v) if v else np.zeros(0) for k, v in self.parts.items()}
        if not len(out["multiclass_error"]):
            del out["multiclass_error"]
        n = len(out["global_loss"])
        rounds = np.arange(1, n + 1)
        out["round"] = rounds
        out["cumulative_loss"] = np.cumsum(out["global_loss"])
        out["inf_error"] = (out["n_errors"] > 0).astype(np.int8)
        return out

    def summary(self, k):
        a = self.arrays()
        n = len(a["round"])
        s = {"rounds": n, "cumulative_loss": float(a["cumulative_loss"][-1]) if n else 0.0}
        s.update(error_rates(n, k, int(a["inf_error"].sum()), int(a["n_errors"].sum()),
                             int(a["multiclass_error"].sum()) if "multiclass_error" in a else None))
        return s


def mistakes(Y, margins):
    """The paper's e_tj: task j is wrong on round t when ``y_tj w_j . x_t <= 0``; dormant tasks (y = 0) never."""
    return (Y * margins <= 0) & (Y != 0)


def multiclass_mistakes(margins, code, classes):
    """Rounds whose Hamming-decoded class is not the true one (output codes)."""
    return hamming_decode(margins, code) != classes


def error_rates(n_rounds, k, inf_errors, task_errors, multiclass_errors=None):
    """inf-error, 1-error (and multiclass) rates from counts over ``n_rounds`` rounds of k tasks."""
    n = max(1, n_rounds)
    out = {"inf_error_rate": float(inf_errors / n), "one_error_rate": float(task_errors / (n * k))}
    if multiclass_errors is not None:
        out["multiclass_error_rate"] = float(multiclass_errors / n)
    return out


# ---------------------------------------------------------------------------
# In-process learners (scikit-learn conventions)
# ---------------------------------------------------------------------------
def _instances(X, k, owner):
    """(rows, n_rounds, per_task) from shared instances (T x d) or per-task ones ((T, k, d) or k matrices)."""
    if isinstance(X, (list, tuple)):
        if len(X) != k:
            raise InputError(f"{owner}: per-task instances need one matrix per task ({k}), got {len(X)}")
        T = X[0].shape[0]
        if any(x.shape[0] != T for x in X):
            raise InputError(f"{owner}: every task's instance matrix needs the same number of rounds")
        order = (np.arange(k)[None, :] * T + np.arange(T)[:, None]).ravel()   # row t * k + j
        if any(sp.issparse(x) for x in X):
            stacked = sp.vstack([sp.csr_matrix(x) for x in X], format="csr")[order]
        else:
            stacked = np.vstack([np.asarray(x, dtype=np.float64) for x in X])[order]
        rows, Xc = rows_of(stacked)
        return rows, Xc, T, True
    if not sp.issparse(X) and np.ndim(X) == 3:
        X = np.asarray(X, dtype=np.float64)
        if X.shape[1] != k:
            raise InputError(f"{owner}: per-task instances of shape (T, k, d) need k = {k}, got {X.shape[1]}")
        rows, Xc = rows_of(X.reshape(-1, X.shape[2]))
        return rows, Xc, X.shape[0], True
    if not sp.issparse(X) and np.ndim(X) != 2:
        raise InputError(f"{owner}: X must be (T x d) shared instances, (T, k, d) or a list of k matrices")
    rows, Xc = rows_of(X)
    return rows, Xc, Xc.shape[0], False


def typical_round(X, Y):
    """(active tasks a round, mean ||x||^2 over instance rows) of a batch: what ``C="auto"`` scales with."""
    sq = np.asarray(X.multiply(X).sum(axis=1) if sp.issparse(X) else np.einsum("ij,ij->i", X, X)).ravel()
    return float(np.mean(np.sum(Y != 0, axis=1))) if len(Y) else 0.0, float(np.mean(sq)) if sq.size else 0.0


def _check_finite(Xc, owner):
    values = Xc.data if sp.issparse(Xc) else Xc
    if not np.all(np.isfinite(values)):
        raise InputError(f"{owner}: field 'X' contains NaN or Inf")


class OnlineMultitask:
    """k binary tasks learned online under a shared global loss (paper 004).

    Parameters
    ----------
    update : ``"implicit"`` (recommended, Sec. 5), ``"perceptron"`` (finite horizon, Sec. 3)
        or ``"infinite"`` (Sec. 4)
    norm : ``"rmax"`` (with ``r``; r = 1 is L-inf, r = k is L1), ``"linf"``, ``"l1"``, ``"l2"`` or
        ``"p"`` (with ``p``; Perceptron rules only unless p is 1, 2 or inf)
    C : aggressiveness, ``||tau||^* <= C``; ``"auto"``: :func:`auto_C` from the first
        ``partial_fit`` batch (its mean ``||x||^2`` and active tasks a round)
    R : bound on ``||x||`` (the infinite-horizon update)
    horizon : unused since ``C="auto"`` no longer depends on the number of rounds (kept so that
        existing code runs; Corollary 5's C is :func:`horizon_C`)

    ``partial_fit(X, Y)`` runs rounds in order: X is (T x d) dense or sparse
    (one shared instance per round), (T, k, d), or a list of k (T x d)
    matrices (one instance per task); Y is (T x k) in {-1, +1}, 0 for a
    dormant task.  Learned: ``coef_`` (k x d), ``history_`` (per-round global
    loss, errors), ``n_rounds_``.
    """

    def __init__(self, update="implicit", norm="rmax", r=1, p=2.0, C=1.0, R=None, horizon=None):
        self.update = update
        self.norm = norm
        self.r = r
        self.p = p
        self.C = C
        self.R = R
        self.horizon = horizon

    def _rule(self, k, typical):
        return make_rule(k, self.C, self.update, self.norm, self.p, self.r, self.R, owner=type(self).__name__,
                         typical=typical)

    def _prepare(self, X, Y):
        owner = type(self).__name__
        Y = np.ascontiguousarray(Y, dtype=np.float64)
        if Y.ndim != 2:
            raise InputError(f"{owner}: Y must be (T x k) with -1/+1 (0 for a dormant task), got shape {Y.shape}")
        if not np.all(np.isin(Y, (-1.0, 0.0, 1.0))):
            raise InputError(f"{owner}: field 'Y' must hold -1, +1 or 0 (dormant)")
        k = Y.shape[1]
        rows, Xc, T, per_task = _instances(X, k, owner)
        _check_finite(Xc, owner)
        if T != Y.shape[0]:
            raise InputError(f"{owner}: X has {T} rounds but Y has {Y.shape[0]}")
        if hasattr(self, "W_"):
            if self.W_.shape != (rows.n_features, k):
                raise InputError(f"{owner}: partial_fit got {rows.n_features} features and {k} tasks, "
                                 f"earlier calls had {self.W_.shape[0]} and {self.W_.shape[1]}")
        else:
            self.rule_ = self._rule(k, typical_round(Xc, Y))
            self.W_ = np.zeros((rows.n_features, k))
            self.metrics_ = RunningMetrics()
        return rows, Y, T, per_task

    def partial_fit(self, X, Y):
        rows, Y, T, per_task = self._prepare(X, Y)
        margins = np.empty((T, Y.shape[1]))
        gloss = np.empty(T)
        if T:
            _online.online_rounds(rows, per_task, Y, self.W_, *self.rule_.args(), margins, gloss)
        self._record(Y, margins, gloss)
        return self

    def _record(self, Y, margins, gloss):
        self.metrics_.add(Y, margins, gloss)

    def fit(self, X, Y):
        for name in ("W_", "rule_", "metrics_"):
            self.__dict__.pop(name, None)
        return self.partial_fit(X, Y)

    @property
    def coef_(self):
        return self.W_.T

    @property
    def history_(self):
        return self.metrics_.arrays()

    @property
    def n_rounds_(self):
        return self.metrics_.n_rounds

    def decision_function(self, X):
        """Margins ``w_j . x`` ((T x k) for shared instances, per task for (T, k, d))."""
        if not hasattr(self, "W_"):
            raise InputError(f"this {type(self).__name__} instance is not fitted yet; call partial_fit first")
        k = self.W_.shape[1]
        if isinstance(X, (list, tuple)):
            return np.column_stack([np.asarray(X[j] @ self.W_[:, j]).ravel() for j in range(k)])
        if not sp.issparse(X) and np.ndim(X) == 3:
            return np.einsum("tkd,dk->tk", np.asarray(X, dtype=np.float64), self.W_)
        return np.asarray(X @ self.W_)

    def predict(self, X):
        """+1 where the margin is positive, else -1."""
        return np.where(self.decision_function(X) > 0, 1.0, -1.0)

    def get_params(self, deep=True):
        return {k: getattr(self, k) for k in ("update", "norm", "r", "p", "C", "R", "horizon")}

    def set_params(self, **params):
        for k, v in params.items():
            setattr(self, k, v)
        return self


class OnlineECOC(OnlineMultitask):
    """Multiclass online learning through an output code (paper 004, Sec. 8.2).

    The code's columns are the binary tasks, learned under the global norm
    (r-max by default: the paper recommends r slightly below half the code
    distance); prediction is Hamming decoding.  ``code``: ``"exhaustive"`` (for
    5 classes the paper's 5 x 15 matrix), ``"one-vs-rest"``, ``"random:K"``
    or an (s x K) +-1 array.  ``partial_fit(X, classes)`` with classes in
    0..n_classes-1.
    """

    def __init__(self, n_classes=5, code="exhaustive", update="implicit", norm="rmax", r=3, p=2.0, C=1.0,
                 R=None, horizon=None):
        super().__init__(update, norm, r, p, C, R, horizon)
        self.n_classes = n_classes
        self.code = code

    def partial_fit(self, X, classes):
        if not hasattr(self, "code_"):
            self.code_ = get_code(self.code, self.n_classes)
        classes = np.asarray(classes).reshape(-1)
        if not (np.issubdtype(classes.dtype, np.integer) and np.all((classes >= 0) & (classes < self.n_classes))):
            raise InputError(f"OnlineECOC: classes must be integers in 0..{self.n_classes - 1}")
        self._classes = classes
        return super().partial_fit(X, self.code_[classes])

    def _record(self, Y, margins, gloss):
        self.metrics_.add(Y, margins, gloss, self.code_, self._classes)

    def fit(self, X, classes):
        self.__dict__.pop("code_", None)
        return super().fit(X, classes)

    def predict(self, X):
        return hamming_decode(self.decision_function(X), self.code_)

    def get_params(self, deep=True):
        return dict(super().get_params(), n_classes=self.n_classes, code=self.code)


# ---------------------------------------------------------------------------
# Distributed: workers own task columns, the server computes tau once per round
# ---------------------------------------------------------------------------
CMD_MARGINS = 31      # Gatherv: base margins of a block of rounds (+ the Gram matrix from worker 0)
CMD_UPDATE = 32       # Scatterv: tau of the block's rounds for the rank's tasks
CMD_GET_W = 33        # Gatherv of the w columns (checkpoint, result)
CMD_SET_W = 34        # Scatterv of the w columns (resume)
CMD_LOAD = 35         # every rank reads its part of the next chunk; all fail together on bad data


@dataclass
class OnlineConfig:
    """Settings of a distributed online run (validated by :meth:`validate`)."""
    update: str = "implicit"
    norm: str = "rmax"
    r: int = 1
    p: float = 2.0
    C: object = 1.0                  # a number or "auto"
    R: float | None = None           # bound on ||x|| (default: the stream's largest row norm)
    code: str | None = None          # an output code over a single-label stream's classes
    block_rounds: int = 64           # rounds per exchange (exact sequential semantics at any value)
    chunk_rounds: int = 4096         # rounds read from the file at a time (a multiple of block_rounds)
    method: str = "online"

    def validate(self, k, max_row_norm, typical=None, owner="train online"):
        """The rule for k tasks; ``typical`` (active tasks a round, mean ||x||^2) is read only for C=auto."""
        checked = check_params({"block_rounds": self.block_rounds, "chunk_rounds": self.chunk_rounds}, owner)
        self.block_rounds, self.chunk_rounds = checked["block_rounds"], checked["chunk_rounds"]
        self.chunk_rounds = -(-self.chunk_rounds // self.block_rounds) * self.block_rounds
        if self.R is None:
            self.R = float(max_row_norm) if max_row_norm > 0 else 1.0
        if callable(typical):
            typical = typical() if self.C == "auto" else None
        return make_rule(k, self.C, self.update, self.norm, self.p, self.r, self.R, owner, typical)

    def to_dict(self):
        return asdict(self)


class StreamTasks:
    """A stream file seen as k tasks (label columns, or code columns over its classes).

    Every rank opens the file read-only and reads only what it needs: workers
    the instance rows and their tasks' labels, the server the labels.
    """

    def __init__(self, path, code=None, label_order=None):
        from .store import StreamFile
        self.stream = StreamFile(path)
        self.path = self.stream.path
        s = self.stream
        self.n_rounds, self.n_features = s.n_rounds, s.n_features
        try:
            self.code = None if code is None else get_code(code, s.n_labels)
        except InputError as exc:
            raise InputError(f"{self.path}: {s.n_labels} labels: {exc}") from None
        # label_order[j] = the file's column seen as label (or class) j: a test stream in a model's order
        self.label_order = None if label_order is None else np.asarray(label_order, dtype=np.int64)
        self.class_names = s.label_names if label_order is None else [s.label_names[i] for i in self.label_order]
        self.names = self.class_names if self.code is None else [f"code{j}" for j in range(self.code.shape[1])]
        self.n_tasks = len(self.names)
        self.n_samples = np.full(self.n_tasks, self.n_rounds, dtype=np.int64)
        self.nnz = np.full(self.n_tasks, s.nnz, dtype=np.int64)
        self._typical = None

    def typical(self):
        """(active tasks a round, mean ||x||^2) of the stream, for C=auto (every code column is active)."""
        if self._typical is None:
            active = self.n_tasks if self.code is not None else self.stream.mean_active_labels()
            self._typical = (float(active), self.stream.mean_sq_row_norm())
        return self._typical

    def labels(self, Y, start):
        """(task labels, classes or None) of a chunk of the stream's Y."""
        if self.label_order is not None:
            Y = Y[:, self.label_order]
        if self.code is None:
            return np.ascontiguousarray(Y, dtype=np.float64), None
        classes = classes_from_onehot(Y, self.path, start)
        return np.ascontiguousarray(self.code[classes]), classes

    def close(self):
        self.stream.close()


class LocalColumns:
    """Worker side: the rank's task columns of W (d x k_local) and the current chunk of the stream."""

    def __init__(self, cluster, source, config):
        self.cluster = cluster
        self.source = source
        self.config = config
        self.tasks = np.array([b.task for b in cluster.my_blocks], dtype=np.int64)
        self.W = np.zeros((source.n_features, len(self.tasks)))
        self.sends_gram = cluster.my_worker == 0
        self.scratch = np.zeros(source.n_features) if self.sends_gram else None
        self.chunk = (-1, -1)
        self.rows = self.Y = None

    def register(self):
        self.cluster.handlers.update({CMD_LOAD: self.on_load, CMD_MARGINS: self.on_margins, CMD_UPDATE: self.on_update,
                                      CMD_GET_W: self.on_get_w, CMD_SET_W: self.on_set_w})

    def load(self, start):
        """Make sure the chunk holding round ``start`` is in memory (chunks are aligned to chunk_rounds)."""
        lo = start - start % self.config.chunk_rounds
        if self.chunk[0] == lo:
            return
        hi = min(self.source.n_rounds, lo + self.config.chunk_rounds)
        X, Y = self.source.stream.read_rounds(lo, hi)
        Yt, _ = self.source.labels(Y, lo)
        self.rows, _ = rows_of(X)
        self.Y = np.ascontiguousarray(Yt[:, self.tasks])
        self.chunk = (lo, hi)

    def on_load(self, ctrl, payload, width):
        """Read the chunk starting at round ctrl[1]; ``payload`` is the server's own reading error."""
        error = payload
        if error is None and (len(self.tasks) or self.sends_gram):
            try:
                self.load(int(ctrl[1]))
            except InputError as exc:
                error = str(exc)
        self.cluster.agree(error)

    def on_margins(self, ctrl, payload, width):
        start, B = int(ctrl[1]), int(ctrl[2])
        fault_point(self.cluster.rank, start // self.config.block_rounds)
        pieces = []
        if len(self.tasks) or self.sends_gram:
            offset = start - self.chunk[0]
            M0 = np.empty((B, len(self.tasks)))
            _online.online_block_margins(self.rows, offset, self.W, M0)
            pieces.append(M0.ravel())
            if self.sends_gram:
                G = np.empty((B, B))
                _online.online_block_gram(self.rows, offset, G, self.scratch)
                pieces.append(G.ravel())
        local = np.concatenate(pieces) if pieces else np.zeros(0)
        return self.cluster.gather_variable(local)

    def on_update(self, ctrl, payload, width):
        start, B = int(ctrl[1]), int(ctrl[2])
        tau_local = self.cluster.scatter_variable(payload).reshape(B, len(self.tasks))
        if len(self.tasks):
            offset = start - self.chunk[0]
            _online.online_block_apply(self.rows, offset, np.ascontiguousarray(self.Y[offset:offset + B]),
                                       np.ascontiguousarray(tau_local), self.W)
        return None

    def on_get_w(self, ctrl, payload, width):
        return self.cluster.gather_block_rows(self.W.T, self.source.n_features)

    def on_set_w(self, ctrl, payload, width):
        self.W = np.ascontiguousarray(self.cluster.scatter_block_rows(payload, self.source.n_features).T)
        return None

    def partition_mb(self):
        total = self.W.nbytes
        if self.rows is not None:
            total += self.rows.nbytes + self.Y.nbytes
        return total / 2 ** 20


class OnlineServer(ServerBase):
    """Rank 0: reads the labels, solves each round's tau in order, records the running metrics."""

    def __init__(self, cluster, source, config, rule, progress=None, checkpointer=None):
        super().__init__(cluster, source, progress, checkpointer)
        self.config, self.rule = config, rule
        self.metrics = RunningMetrics()
        self.rank_tasks = [[] for _ in range(cluster.size)]
        for b in self.blocks:
            self.rank_tasks[cluster.worker_rank(b.worker)].append(b.task)
        self.gram_rank = cluster.worker_rank(0)
        self.trace = {"round": [], "seconds": [], "bytes": []}

    def progress_row(self):
        s = self.metrics.summary(self.m)
        return {"round": self.round, "n_rounds": self.source.n_rounds, "cumulative_loss": s["cumulative_loss"],
                "inf_error_rate": s["inf_error_rate"], "one_error_rate": s["one_error_rate"],
                "multiclass_error_rate": s.get("multiclass_error_rate"), "seconds": self.elapsed(),
                "bytes": self.cluster.bytes_moved}

    def block(self, start, B, Y, classes):
        pieces = self.command(CMD_MARGINS, start, width=B)
        M0 = np.empty((B, self.m))
        for rank, tasks in enumerate(self.rank_tasks):
            if tasks:
                M0[:, tasks] = pieces[rank][:B * len(tasks)].reshape(B, len(tasks))
        G = pieces[self.gram_rank][B * len(self.rank_tasks[self.gram_rank]):].reshape(B, B)
        tau_b = np.zeros((B, self.m))
        margins = np.empty((B, self.m))
        gloss = np.empty(B)
        _online.online_block_solve(M0, np.ascontiguousarray(G), Y, *self.rule.args(), tau_b, margins, gloss)
        self.metrics.add(Y, margins, gloss, self.source.code, classes)
        self.command(CMD_UPDATE, start, payload=[tau_b[:, tasks].ravel() for tasks in self.rank_tasks], width=B)
        self.round = start + B

    def run(self, resume=None):
        if resume is not None:
            self.restore(resume())
        cfg, T = self.config, self.source.n_rounds
        while self.round < T:
            lo = self.round - self.round % cfg.chunk_rounds
            hi = min(T, lo + cfg.chunk_rounds)
            error = None
            try:
                Yc, classes = self.source.labels(self.source.stream.read_labels(lo, hi), lo)
            except InputError as exc:
                error = str(exc)
            self.command(CMD_LOAD, lo, payload=error)
            while self.round < hi:
                start = self.round
                B = min(cfg.block_rounds, hi - start)
                self.block(start, B, np.ascontiguousarray(Yc[start - lo:start - lo + B]),
                           None if classes is None else classes[start - lo:start - lo + B])
                self.safe_point()
            for key, value in (("round", self.round), ("seconds", self.elapsed()), ("bytes", self.cluster.bytes_moved)):
                self.trace[key].append(value)
            if self.progress is not None:
                self.progress(self.progress_row())
        self.final_W = self.gather_W()
        return True

    def gather_W(self):
        rows = self.command(CMD_GET_W, width=self.source.n_features)
        W = np.zeros((self.source.n_features, self.m))
        W[:, self.block_task] = rows.T
        return W

    def checkpoint_state(self):
        arrays = {"W": self.gather_W()}
        arrays.update({f"metrics_{k}": np.concatenate(v) if v else np.zeros(0) for k, v in self.metrics.parts.items()})
        arrays.update({f"trace_{k}": np.asarray(v) for k, v in self.trace.items()})
        counters = {"round": self.round, "seconds": self.elapsed(), "bytes": self.cluster.bytes_moved}
        return arrays, [], counters

    def restore(self, ck):
        a, c = ck["arrays"], ck["counters"]
        if a["W"].shape != (self.source.n_features, self.m):
            raise InputError(f"{ck['path']}: cannot resume: W has shape {a['W'].shape}, expected "
                             f"{(self.source.n_features, self.m)}")
        self.command(CMD_SET_W, payload=np.ascontiguousarray(a["W"].T[self.block_task]), width=self.source.n_features)
        self.metrics.extend({k: a[f"metrics_{k}"] for k in RunningMetrics.COLUMNS})
        for k in self.trace:
            self.trace[k] = list(a[f"trace_{k}"])
        self.round = int(c["round"])
        self.seconds_before, self.cluster.bytes_moved = float(c["seconds"]), int(c["bytes"])


@dataclass
class OnlineResult(RunResult):
    summary: dict
    trace: dict
    code: np.ndarray | None = None
    test: dict | None = None
    extra: dict | None = None


def train(cluster, source, config: OnlineConfig, progress=None, checkpointer=None, resume=None, test_source=None):
    """Run the stream through the online learner on every rank; the server returns an OnlineResult.

    Rounds go in blocks of ``config.block_rounds``: workers send base margins
    ``X_b W`` of their tasks (worker 0 also the Gram matrix ``X_b X_b^T``), the
    server solves the rounds in order with the exact margins
    ``M0 + sum_{s'<s} tau y G`` and sends tau back.  Each task's arithmetic does
    not depend on where it lives, so the result is bitwise the same at any rank
    count; block_rounds = 1 is bitwise :class:`OnlineMultitask`.
    """
    from .checkpoint import read_compatible
    from .cluster import plan_blocks
    rule = config.validate(source.n_tasks, source.stream.max_row_norm(), source.typical)
    rss_before_data = peak_rss_mb()
    cluster.set_plan(plan_blocks(np.ones(source.n_tasks, dtype=np.int64), np.ones(source.n_tasks),
                                 cluster.n_workers))
    local = LocalColumns(cluster, source, config)

    def make_server():
        return OnlineServer(cluster, source, config, rule, progress, checkpointer)

    state = (lambda: read_compatible(resume, config, source)) if resume is not None and cluster.is_server else None
    outcome = engine.run(cluster, local, make_server, rss_before_data, state)
    if outcome is None:
        return None
    server, _, ranks = outcome
    result = OnlineResult(W=server.final_W, history=server.metrics.arrays(), config=dict(config.to_dict(), C=rule.C),
                          task_names=source.names, n_rounds=server.round, seconds=server.elapsed(),
                          bytes_moved=cluster.bytes_moved, summary=server.metrics.summary(source.n_tasks),
                          trace={k: np.asarray(v) for k, v in server.trace.items()}, code=source.code,
                          extra={"rss_before_data_mb": ranks[:, 0], "partition_mb": ranks[:, 1],
                                 "peak_rss_mb": ranks[:, 2]})
    return result


def evaluate_stream(W, test_source, chunk=4096):
    """Test metrics of final hypotheses (d x k, columns in ``test_source.names`` order) on a stream.

    The stream is read ``chunk`` rounds at a time; the per-round mistakes are
    counted by the rule the training run uses (:func:`mistakes`, so a margin of
    0 is wrong), giving the inf-error, 1-error and, with an output code, the
    multiclass error rates, and per task (active rounds only) the error rate
    and AUC, pooled and averaged by :func:`hpcmtl.metrics.summarize`.  Memory:
    one chunk of instances plus each task's active margins (for its AUC).
    """
    from .metrics import summarize, task_metrics
    k = test_source.n_tasks
    if W.shape != (test_source.n_features, k):
        raise InputError(f"{test_source.path}: {test_source.n_features} features and {k} tasks, the model's W "
                         f"is {W.shape[0]} x {W.shape[1]}")
    scores, labels = [[] for _ in range(k)], [[] for _ in range(k)]
    task_errors = np.zeros(k, dtype=np.int64)
    inf_errors, multiclass = 0, (0 if test_source.code is not None else None)
    for start in range(0, test_source.n_rounds, chunk):
        X, Y = test_source.stream.read_rounds(start, min(test_source.n_rounds, start + chunk))
        Yt, classes = test_source.labels(Y, start)
        margins = np.asarray(X @ W)
        wrong = mistakes(Yt, margins)
        task_errors += wrong.sum(axis=0)
        inf_errors += int(wrong.any(axis=1).sum())
        if classes is not None:
            multiclass += int(multiclass_mistakes(margins, test_source.code, classes).sum())
        for j in range(k):
            active = Yt[:, j] != 0
            scores[j].append(margins[active, j])
            labels[j].append(Yt[active, j])
    tasks = []
    for j, name in enumerate(test_source.names):
        y = np.concatenate(labels[j]) if labels[j] else np.zeros(0)
        if y.size:
            tasks.append(dict(name=name, **task_metrics(y, np.concatenate(scores[j]), False, int(task_errors[j]))))
    summary = summarize(tasks, False)
    summary["n_rounds"] = int(test_source.n_rounds)
    summary.update(error_rates(test_source.n_rounds, k, inf_errors, int(task_errors.sum()), multiclass))
    return {"tasks": tasks, "summary": summary}
