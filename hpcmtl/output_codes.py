"""Error-correcting output codes: multiclass online learning as binary tasks (paper 004, Sec. 8.2).

A code is an (s x K) matrix of -1/+1 over s classes: column j is binary task j,
class c is learned as the labels of row c, and a prediction is the class whose
row best explains the K margins f (:func:`decode`):

* ``loss`` (the default; Allwein, Schapire and Singer 2000, loss-based decoding):
  the class whose row has the least summed hinge loss ``sum_j [1 - M_cj f_j]_+``,
  the loss the online rules train with.  It reads how far each margin is from
  its row's sign, so a round with no positive column, or several, still has one
  best class; for one-vs-rest it is exactly the largest margin (below).
* ``hamming``: the row nearest to ``sign(f)`` (a 0 margin counts half).  Hamming
  distances are integers (or halves) and tie often; ties go to the least summed
  hinge loss, then as below.

Both compare classes by what depends on the class only: every row pays
``[1 + f_j]_+`` on its -1 entries, so ``loss_c = sum_j [1 + f_j]_+ + sum_{j: M_cj = +1}
g(f_j)`` with ``g(f) = [1 - f]_+ - [1 + f]_+`` strictly decreasing; the first sum
is the same for every class and is left out of the comparison (one-vs-rest:
``g(f_c)`` alone, so the largest margin wins with no rounding between classes,
up to the tie tolerance).
Remaining ties (scores equal to within ``1e-9 sum_j |f_j|``, far above rounding)
go to the larger ``sum_{j: M_cj = +1} f_j`` (the linear loss, same argument),
then to the lowest class index.

This module holds the code matrices (exhaustive, one-vs-rest, random, ``auto``
by the class count, by name or from a .npy file), their minimum row distance,
the decoders, a multilabel stream's ranking of labels by margin, and the
conversion of a single-label one-hot stream to class indices.
"""
from __future__ import annotations

import numpy as np

from .errors import InputError
from .params import DECODERS

# 2^(C-1) - 1 columns: 511 at C = 10 (already 5x the work of one-vs-rest on MNIST); 16 classes would be 32,767
MAX_EXHAUSTIVE_CLASSES = 10
TIE_TOLERANCE = 1e-9        # relative to sum_j |f_j|: class scores closer than this are tied (decode)


def exhaustive_code(n_classes):
    """Dietterich and Bakiri's exhaustive code: every column with +1 in the first row, except all +1.

    For 5 classes this is the paper's 5 x 15 matrix (Sec. 8.2), in its column
    order; the distance between any two rows is ``2^(s-2)`` (8 for s = 5).
    """
    s = int(n_classes)
    if not 3 <= s <= MAX_EXHAUSTIVE_CLASSES:
        raise InputError(f"the exhaustive code has 2^(C-1) - 1 columns, so it is offered for 3..{MAX_EXHAUSTIVE_CLASSES} "
                         f"classes only, got {s}: use --code auto (the default code for C classes), one-vs-rest "
                         f"or random:K[:SEED]")
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


def auto_code(n_classes):
    """The default code for C classes (``--code auto``): one-vs-rest (C x C).

    Measured one pass, implicit L-inf, ``C = auto``, loss-based decoding, against
    a random dense code of ``ceil(10 log2 C)`` columns (docs/math.md, "Which code"):
    one-vs-rest had the lower test error on MNIST (10 classes) and on Reuters
    single-label topics, at a fraction of the columns.  A linear learner sees a
    random column's union of classes as a harder (often not linearly separable)
    problem than one class against the rest, and one pass gives it no time to
    make up for it; the extra columns also cost rounds/s in proportion.
    """
    return one_vs_rest_code(n_classes)


def code_distance(M):
    """Minimum Hamming distance between two rows of a code matrix."""
    M = np.asarray(M)
    return int(min(np.sum(M[a] != M[b]) for a in range(len(M)) for b in range(a + 1, len(M))))


def get_code(code, n_classes):
    """A code matrix by name (``auto``, ``exhaustive``, ``one-vs-rest``, ``random:K[:SEED]``) or a .npy file."""
    if isinstance(code, np.ndarray):
        M = np.asarray(code, dtype=np.float64)
    elif code == "auto":
        M = auto_code(n_classes)
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
        raise InputError(f"unknown code {code!r}: use auto, one-vs-rest, random:K[:SEED], exhaustive or a .npy "
                         f"file")
    if M.ndim != 2 or M.shape[0] != n_classes or not np.all(np.isin(M, (-1.0, 1.0))):
        raise InputError(f"code {code if isinstance(code, str) else 'matrix'}: expected a {n_classes} x K "
                         f"matrix of -1/+1, got shape {M.shape}")
    return M


def _hinge_gap(margins):
    """``g(f) = [1 - f]_+ - [1 + f]_+ = -f - clip(f, -1, 1)``: what a +1 code entry costs beyond a -1 entry."""
    return -(margins + np.clip(margins, -1.0, 1.0))


def _positive_part(M):
    """The 0/1 matrix of a code's +1 entries (s x K), float so that ``values @ P.T`` sums a row's +1 columns."""
    return (np.asarray(M) == 1).astype(np.float64)


def _best(F, keys):
    """Per row of margins F, the class with the largest first key; ties go to the next key, then the lowest class.

    ``keys``: ``(score(F) -> T x s, relative)`` pairs, larger is better; with ``relative`` scores within
    ``TIE_TOLERANCE sum_j |f_j|`` of a row's best tie, else only equal ones.  The later keys are computed
    on the tied rows only (few: the decoders run on every block, and each key is a T x K by K x s product).
    """
    score, relative = keys[0]
    tol = TIE_TOLERANCE * np.abs(F).sum(axis=1, keepdims=True)
    key = score(F)
    best = np.argmax(key, axis=1)
    candidates = key >= np.take_along_axis(key, best[:, None], axis=1) - (tol if relative else 0.0)
    tied = np.flatnonzero(np.count_nonzero(candidates, axis=1) > 1)
    if tied.size == 0:
        return best
    candidates, F, tol = candidates[tied], F[tied], tol[tied]
    for score, relative in keys[1:]:
        masked = np.where(candidates, score(F), -np.inf)
        candidates &= masked >= masked.max(axis=1, keepdims=True) - (tol if relative else 0.0)
    best[tied] = np.argmax(candidates, axis=1)
    return best


def _check_decoder(decoder):
    if decoder not in DECODERS:
        raise InputError(f"unknown decoder {decoder!r}: use {' or '.join(DECODERS)}")


def class_scores(margins, M, decoder="loss"):
    """Per round and class, how well the class's code row explains the margins (larger is better), (T x s).

    ``loss``: minus the summed hinge loss ``sum_j [1 - M_cj f_j]_+``; ``hamming``:
    minus the Hamming distance from ``sign(f)`` to the row (a 0 margin counts half).
    :func:`decode` takes the largest, with the tie rule of the module docstring.
    """
    _check_decoder(decoder)
    F = np.atleast_2d(np.asarray(margins, dtype=np.float64))
    M = np.asarray(M, dtype=np.float64)
    if decoder == "hamming":
        return -(M.shape[1] - np.sign(F) @ M.T) / 2.0
    common = np.maximum(0.0, 1.0 + F).sum(axis=1, keepdims=True)      # every row's -1 entries at their cheapest
    return -(common + _hinge_gap(F) @ _positive_part(M).T)


def decode(margins, M, decoder="loss"):
    """The class of each row of margins (T x K) under code M (s x K): see the module docstring.

    >>> decode([[-2.0, -3.0, -0.5]], one_vs_rest_code(3))           # no positive column: the largest margin
    array([2])
    """
    _check_decoder(decoder)
    F = np.atleast_2d(np.asarray(margins, dtype=np.float64))
    P = _positive_part(M)
    # Each key is the class-dependent part of a score, larger is better.  Classes whose sums differ by rounding
    # only are tied: |g(f)| <= 2 |f|, so a sum's rounding error is below K eps sum_j |f_j|, far under
    # TIE_TOLERANCE sum_j |f_j|.  Exact ties are common (symmetric codes after a few rounds), and margins computed
    # by two paths (the distributed server, the estimator, CSR or dense X) then decode alike.
    keys = [(lambda G: -(_hinge_gap(G) @ P.T), True),    # -loss_c up to the round's constant (exact for OvR)
            (lambda G: G @ P.T, True)]                   # the linear loss's class-dependent part
    if decoder == "hamming":                             # -d_c = sum_{+1 entries} sign f_j - (K + sum_j sign f_j) / 2
        keys.insert(0, (lambda G: np.sign(G) @ P.T, False))
    return _best(F, keys)


def hamming_decode(margins, M):
    """Hamming decoding (:func:`decode` with ``decoder="hamming"``; ties to the least hinge loss)."""
    return decode(margins, M, "hamming")


def loss_decode(margins, M):
    """Loss-based decoding (:func:`decode` with ``decoder="loss"``)."""
    return decode(margins, M, "loss")


def rank_labels(margins):
    """A multilabel round's labels from most to least likely: by decreasing margin, ties to the lower index (T x k).

    The ranking output of a multilabel stream (no probabilities needed): ``rank_labels(F)[:, 0]``
    is each round's top label, positive or not.
    """
    F = np.atleast_2d(np.asarray(margins, dtype=np.float64))
    return np.argsort(-F, axis=1, kind="stable")


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

