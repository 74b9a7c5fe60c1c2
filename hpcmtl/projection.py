"""Euclidean projections onto norm balls (paper 002 and its comparison).

* :func:`project_l1inf` -- onto ``{W : sum_i max_j |W_ij| <= C}`` (paper 002,
  Sec. 4.1-4.2): the rows of |W| are sorted once, then the removed mass theta
  shared by every surviving row is found exactly by Newton's method on the
  concave piecewise-linear ``sum_i F_i(theta)`` (compiled), and each row is
  clipped at its cap ``mu_i``.  O(dm log m) for the sort plus O(d log m) per
  Newton step; only non-zero rows are touched.
* :func:`project_l1` -- onto the l1 ball (Duchi et al. 2008, expected linear time).
* :func:`project_l2` -- onto the l2 ball (a rescaling).
* ``*_columns`` -- the last two applied to every task column independently.

Each returns a new array unless ``out`` is given (``out=W`` projects in place).
"""
from __future__ import annotations

import numpy as np

from . import _projections
from .errors import InputError


def _radius(C):
    C = float(C)
    if not (C >= 0 and np.isfinite(C)):
        raise InputError(f"The radius C must be finite and >= 0. Got {C!r} instead.")
    return C


def _finite(W, name="W"):
    W = np.asarray(W, dtype=np.float64)
    if not np.all(np.isfinite(W)):
        raise InputError(f"{name} contains NaN or Inf")
    return W


def l1inf_norm(W) -> float:
    """``sum_i max_j |W_ij|``."""
    W = np.asarray(W)
    return float(np.abs(W).max(axis=1).sum()) if W.size else 0.0


def project_l1inf(W, C, out=None, return_info=False):
    """Euclidean projection of W (d x m) onto the l1,inf ball of radius C.

    Minimizes ``||B - W||_F^2`` subject to ``sum_i max_j |B_ij| <= C``.  W inside
    the ball comes back unchanged; signs are kept (the projection never flips
    one); all-zero rows stay zero and cost nothing.  With ``return_info`` also
    returns ``{"theta", "mu", "newton_steps"}`` (mu per row, theta the mass
    removed from every row that survives).
    """
    C = _radius(C)
    W = _finite(W)
    if W.ndim != 2:
        raise InputError(f"W must be a matrix, got shape {W.shape}")
    target = np.empty_like(W) if out is None else out
    d, m = W.shape
    S = np.abs(W)
    if m:
        S.sort(axis=1)                               # increasing, in place: the only O(dm log m) step
    rowmax = S[:, -1].copy() if m else np.zeros(d)
    norm = float(rowmax.sum())
    info = {"theta": 0.0, "mu": rowmax, "newton_steps": 0}
    if norm <= C:
        if target is not W:
            target[...] = W
        return (target, info) if return_info else target
    if C == 0.0:
        target[...] = 0.0
        info["mu"] = np.zeros_like(rowmax)
        return (target, info) if return_info else target
    nz = None
    if np.count_nonzero(rowmax) < 0.9 * d:           # many zero rows: work on the others only
        nz = np.flatnonzero(rowmax)
        S = S[nz]
    theta, mu, steps = _projections.l1inf_caps(S, norm - C)
    if nz is not None:
        full = np.zeros(d)
        full[nz] = mu
        mu = full
    np.clip(W, -mu[:, None], mu[:, None], out=target)   # sign(W) * min(|W|, mu_i); zero rows stay zero
    if return_info:
        return target, {"theta": float(theta), "mu": mu, "newton_steps": int(steps)}
    return target


def project_l1(v, C, seed=0):
    """Euclidean projection of a vector onto ``{x : ||x||_1 <= C}`` (Duchi et al. 2008)."""
    C = _radius(C)
    v = _finite(v, "v").reshape(-1)
    if np.abs(v).sum() <= C:
        return v.copy()
    if C == 0.0:
        return np.zeros_like(v)
    a = np.abs(v)
    _projections.project_l1_inplace(a, C, seed)
    return np.copysign(a, v)


def project_l2(v, C):
    """Euclidean projection onto ``{x : ||x||_2 <= C}``."""
    C = _radius(C)
    v = _finite(v, "v")
    norm = float(np.linalg.norm(v))
    return v.copy() if norm <= C else v * (C / norm)


def project_l1_columns(W, C):
    """Each task column onto its own l1 ball of radius C (the paper's independent l1)."""
    W = _finite(W)
    return np.column_stack([project_l1(W[:, j], C, seed=j) for j in range(W.shape[1])]) if W.shape[1] else W.copy()


def project_l2_columns(W, C):
    """Each task column onto its own l2 ball of radius C (the paper's independent l2)."""
    W = _finite(W)
    norms = np.linalg.norm(W, axis=0)
    scale = np.where(norms > C, C / np.maximum(norms, 1e-300), 1.0)
    return W * scale
