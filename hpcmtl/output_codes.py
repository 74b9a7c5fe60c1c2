"""Error-correcting output codes: multiclass online learning as binary tasks (paper 004, Sec. 8.2).

A code is an (s x K) matrix of -1/+1 over s classes: column j is binary task j,
class c is learned as the labels of row c, and a prediction is the class whose
row is nearest in Hamming distance to the signs of the K margins.  This module
holds the code matrices (exhaustive, one-vs-rest, random, by name or from a
.npy file), their minimum row distance, Hamming decoding and the conversion of
a single-label one-hot stream to class indices.
"""
from __future__ import annotations

import numpy as np

from .errors import InputError


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

