"""The task covariance Sigma: the Omega-step, the rho rules that Sigma sets, and a user-given Sigma's check.

Server arithmetic, public for tests: :func:`omega_step` / :func:`omega_from_gram` (Sigma from W),
:class:`SigmaFactors` and :func:`omega_factors` (the same Sigma from a thin SVD of W, held as factors),
:func:`safe_rho` and :func:`task_rho_bounds` (Lemma 6.7), :func:`coupled_rho` (the 'qp' aggregation's
per-task rho), :func:`check_sigma`.
"""
from __future__ import annotations

import weakref

import numpy as np

from .. import interior
from ..covariance import GraphSigma, SigmaFactors, diagonal, is_factored  # noqa: F401  (public here too)
from ..errors import InputError

# From this many tasks on, a learned Sigma is computed and held as factors (:func:`omega_factors`) and the
# server's per-round products go through them (:mod:`.steps`): an m x m eigensolve a W-step and an m x m
# matrix in every round's algebra cost m^3 and m^2 d, the factors O(m d r).  Below it the dense arithmetic of
# before (its bits) is kept; tests set it to 0 to compare the two paths.
FACTORED_MIN_TASKS = 512


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


def omega_factors(WT: np.ndarray, eig_floor: float = 1e-8) -> SigmaFactors:
    """:func:`omega_step` of ``W = WT^T`` (WT: m x d task rows) as :class:`SigmaFactors`, from a thin SVD of WT
    (``O(m d min(m, d))``, no m x m matrix): ``WT = U S Q^T`` gives ``(W^T W)^(1/2) = U diag(S) U^T``; singular
    values below ``eig_floor`` times the largest and the complement of U's columns take that floor, and the
    trace ``sum(max(S, floor)) + floor (m - k)`` divides.  Only the columns above the floor are kept (r of them).
    An all-zero W gives ``I / m`` (r = 0)."""
    WT = np.asarray(WT, dtype=np.float64)
    m = WT.shape[0]
    if WT.size == 0:
        return SigmaFactors(np.zeros((m, 0)), np.zeros(0), 1.0 / max(m, 1))
    U, S, _ = np.linalg.svd(WT, full_matrices=False)
    top = float(S.max()) if S.size else 0.0
    if not top > 0:
        return SigmaFactors(np.zeros((m, 0)), np.zeros(0), 1.0 / m)
    floor = eig_floor * top
    keep = S > floor
    trace = float(np.sum(S[keep])) + floor * (m - int(np.count_nonzero(keep)))
    return SigmaFactors(np.ascontiguousarray(U[:, keep]), S[keep] / trace, floor / trace)


def safe_rho(Sigma: np.ndarray, blocks_per_task=None, eta: float = 1.0, exact: bool = True) -> float:
    """rho of Lemma 6.7, ``eta max_i sum_i' |sigma_ii'| / sigma_ii``, with split tasks.

    A task cut into s_i blocks counts as s_i tasks sharing its row and column of
    Sigma: ``eta max_i (sum_i' s_i' |sigma_ii'|) / sigma_ii``.  ``exact=False`` with Sigma as factors: a
    larger rho that Lemma 6.7 allows too, from :meth:`SigmaFactors.abs_bound` (O(m r), not the m^2 r of
    the exact row sums): for the aggregations that never read rho (the server's: 'qp', 'line').
    """
    s = np.ones(Sigma.shape[0]) if blocks_per_task is None else np.asarray(blocks_per_task, float)
    sums = Sigma.abs_bound(s) if not exact and is_factored(Sigma) else abs_times(Sigma, s)
    return float(eta * np.max(sums / diagonal(Sigma)))


def task_rho_bounds(Sigma: np.ndarray, blocks_per_task=None) -> np.ndarray:
    """Per-task Lemma 6.7 bounds ``(sum_i' s_i' |sigma_ii'|) / sigma_ii`` (their maximum is :func:`safe_rho`).

    ``tr(dB Sigma dB^T) <= sum_i bound_i sigma_ii ||db_i||^2`` (Gershgorin on
    ``Sigma o dB^T dB``), so a task whose local subproblem uses its own bound
    never needs a step below 1; the adaptive aggregation keeps rho_i in [1, bound_i].
    """
    s = np.ones(Sigma.shape[0]) if blocks_per_task is None else np.asarray(blocks_per_task, float)
    return abs_times(Sigma, s) / diagonal(Sigma)


ABS_ROWS = 2048     # abs_times: rows of |Sigma| formed at a time


def is_diagonal(Sigma) -> bool:
    """:func:`hpcmtl.interior.is_diagonal` (every entry off the diagonal exactly zero) in ABS_ROWS-row pieces:
    no m x m temporaries (two of them at 10^4 tasks are 1.6 GB); one piece, the same call, up to ABS_ROWS.
    Factors: :meth:`SigmaFactors.is_diagonal` (O(m r))."""
    if is_factored(Sigma):
        return Sigma.is_diagonal()
    m = Sigma.shape[0]
    if m <= ABS_ROWS:
        return interior.is_diagonal(Sigma)
    for i in range(0, m, ABS_ROWS):
        piece = np.array(Sigma[i:i + ABS_ROWS])
        k = np.arange(piece.shape[0])
        piece[k, i + k] = 0.0
        if np.any(piece):
            return False
    return True


def abs_times(Sigma, s):
    """``|Sigma| @ s`` without a second m x m array: ABS_ROWS rows of |Sigma| at a time (one piece, the
    arithmetic of before, up to ABS_ROWS tasks).  Factors: :meth:`SigmaFactors.abs_times`, row pieces formed
    from them (O(m^2 r) time, once a W-step)."""
    if is_factored(Sigma):
        return Sigma.abs_times(s)
    m = Sigma.shape[0]
    if m <= ABS_ROWS:
        return np.abs(Sigma) @ s
    return np.concatenate([np.abs(Sigma[i:i + ABS_ROWS]) @ s for i in range(0, m, ABS_ROWS)])


# the 'qp' rho's least value: a task the others explain nearly whole (s_i near 0: a learned Sigma of low task rank
# under a small eigenvalue floor) takes a local step up to 1 / RHO_LOW its Lemma-free length, which the server's
# steps cut back where the tasks' common directions make it too long (measurements: docs/dmtrl-notes.md)
RHO_LOW = 0.25


def coupled_rho(Sigma: np.ndarray) -> np.ndarray:
    """The 'qp' aggregation's per-task rho_i under a task covariance: ``max(RHO_LOW, s_i)``, 1 when Sigma is diagonal.

    ``s_i = 1 / (sigma_ii (Sigma^-1)_ii)`` in (0, 1] is the curvature of task i's
    direction when the other tasks' b follow optimally (the Schur complement) relative
    to sigma_ii, its curvature alone (rho = 1).  The server's steps can shorten a local
    step (eta <= 1) but never lengthen it, so a local model stiffer than the coupled
    dual in the directions that separate related tasks wastes rounds; the steps shorten
    what a softer model overshoots along the tasks' common direction (measurements:
    docs/dmtrl-notes.md).
    """
    if isinstance(Sigma, SigmaFactors):       # Sigma^-1's diagonal from the factors: no m x m inverse
        if Sigma.V.shape[1] == 0:
            return np.ones(Sigma.m)
        return np.clip(1.0 / (Sigma.diag() * Sigma.inverse_diag()), RHO_LOW, 1.0)
    if isinstance(Sigma, GraphSigma):         # Sigma^-1 = S^-1 (L + diag(alpha)) S^-1 is sparse: its diagonal exactly
        if Sigma.is_diagonal():
            return np.ones(Sigma.m)
        return np.clip(1.0 / (Sigma.diag() * Sigma.inverse_diag()), RHO_LOW, 1.0)
    m = Sigma.shape[0]
    if is_diagonal(Sigma):
        return np.ones(m)
    s = 1.0 / (np.diag(Sigma) * np.diag(np.linalg.inv(Sigma)))
    return np.clip(s, RHO_LOW, 1.0)


def fixed_form(Sigma):
    """How a fixed Sigma given as :class:`SigmaFactors` (a learned result's, ``train fixed --sigma RESULT.h5``) is
    held: as its factors from :data:`FACTORED_MIN_TASKS` tasks on (the server's O(m d r) path, no m x m array),
    as the dense matrix below (the arithmetic and bits of before, as a learned Sigma there).  Anything else as
    given (a dense matrix stays dense at any m: the user's own array)."""
    if isinstance(Sigma, SigmaFactors) and Sigma.m < FACTORED_MIN_TASKS:
        return Sigma.dense()
    return Sigma


ORTHONORMAL_TOL = 1e-8      # |V^T V - I| at most this: a thin SVD's U is orthonormal to about m eps


def check_factors(F: SigmaFactors, m) -> SigmaFactors:
    """Factors given as a fixed Sigma: m tasks, finite, ``s > c > 0`` and V orthonormal, so that
    ``V diag(s) V^T + c (I - V V^T)`` is symmetric positive definite (O(m r^2), no m x m array)."""
    V, s, c = F
    r = s.size
    if V.ndim != 2 or V.shape != (m, r):
        raise InputError(f"task covariance Sigma's factors (sigma_V {V.shape}) are for {V.shape[0]} tasks, "
                         f"the data has {m} tasks")
    if not (np.all(np.isfinite(V)) and np.all(np.isfinite(s)) and np.isfinite(c) and c > 0 and np.all(s > c)):
        raise InputError("task covariance Sigma's factors must be finite with sigma_s > sigma_c > 0")
    if r and np.abs(V.T @ V - np.eye(r)).max() > ORTHONORMAL_TOL:
        raise InputError("task covariance Sigma's factors: the columns of sigma_V must be orthonormal")
    return F


# the arrays check_sigma returned, read-only (by id; the weak value tells a reused id from the array): a grid
# gives its every fit the Sigma it checked once, and the m x m eigensolve of a check a fit was a quarter of a
# fixed-Sigma path's CPU at 300 tasks (issue 39)
_CHECKED = weakref.WeakValueDictionary()


def check_sigma(Sigma, m):
    """A user-given task covariance: m x m, symmetric, positive definite.  Returns a symmetrized read-only copy,
    or the array itself when it is one this function returned and still read-only (checked already; made writable
    again, it is checked again)."""
    if Sigma is None:
        raise InputError("relationship 'fixed' needs a task covariance Sigma")
    if isinstance(Sigma, GraphSigma):         # positive definite by construction (task_graph.check_graph)
        if Sigma.m != m:
            raise InputError(f"the sparse task covariance (a graph kernel or a precision) has {Sigma.m} tasks, "
                             f"the data has {m}")
        return Sigma
    Sigma = fixed_form(Sigma)
    if isinstance(Sigma, SigmaFactors):
        return check_factors(Sigma, m)
    if _CHECKED.get(id(Sigma)) is Sigma and not Sigma.flags.writeable and Sigma.shape == (m, m):
        return Sigma
    Sigma = np.asarray(Sigma, dtype=np.float64)
    if Sigma.shape != (m, m):
        raise InputError(f"task covariance Sigma has shape {Sigma.shape}, the data has {m} tasks")
    if not np.all(np.isfinite(Sigma)) or not np.allclose(Sigma, Sigma.T, rtol=1e-10, atol=1e-12):
        raise InputError("task covariance Sigma must be finite and symmetric")
    if np.linalg.eigvalsh(Sigma).min() <= 0:
        raise InputError("task covariance Sigma must be positive definite")
    checked = 0.5 * (Sigma + Sigma.T)
    checked.flags.writeable = False
    _CHECKED[id(checked)] = checked
    return checked
