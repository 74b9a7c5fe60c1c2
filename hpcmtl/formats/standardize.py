"""Scaling of task datasets (statistics from training data only): ``hpcmtl data standardize --scale``."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

# the choices of ``data standardize --scale``
SCALINGS = ("standard", "maxabs", "l2-rows")


def standardization(blocks, kind="standard"):
    """Per-feature ``(mean, scale)`` over all rows of all tasks (``(None, None)`` for ``l2-rows``).

    ``standard``: dense data is centred and scaled to unit variance; CSR data is
    only scaled, to unit root-mean-square (centring would destroy sparsity).
    ``maxabs``: every column divided by its largest absolute value, never centred.
    Constant columns (such as a bias column of ones) keep mean 0 and scale 1
    under ``standard``, and all-zero columns scale 1 under ``maxabs``, so they
    pass through unchanged.  ``l2-rows`` needs no statistics: each row is
    divided by its own norm.
    """
    if kind == "l2-rows":
        return None, None
    sparse = sp.issparse(blocks[0].X)
    d = blocks[0].X.shape[1]
    if kind == "maxabs":
        peak = np.zeros(d)
        for b in blocks:
            if b.n_rows:
                peak = np.maximum(peak, np.asarray(abs(b.X).max(axis=0).todense() if sparse
                                                   else np.abs(b.X).max(axis=0)).ravel())
        return np.zeros(d), np.where(peak > 0, peak, 1.0)
    n = sum(b.n_rows for b in blocks)
    total = sum(np.asarray(b.X.sum(axis=0)).ravel() for b in blocks)
    total_sq = sum(np.asarray((b.X.multiply(b.X) if sparse else b.X ** 2).sum(axis=0)).ravel() for b in blocks)
    mean = total / n
    var = np.maximum(total_sq / n - mean ** 2, 0.0)
    constant = var <= 1e-12 * np.maximum(1.0, mean ** 2)
    scale = np.where(constant, 1.0, np.sqrt(var))
    if sparse:
        scale = np.where(constant, 1.0, np.sqrt(total_sq / n))
        mean = np.zeros_like(mean)
    mean = np.where(constant, 0.0, mean)
    return mean, scale


def apply_standardization(X, mean, scale, kind="standard"):
    """``X`` scaled by :func:`standardization`'s statistics (CSR stays CSR and is never centred)."""
    if kind == "l2-rows":
        norms = np.sqrt(np.asarray((X.multiply(X) if sp.issparse(X) else X ** 2).sum(axis=1)).ravel())
        inv = 1.0 / np.where(norms > 0, norms, 1.0)          # an all-zero row stays zero
        return sp.csr_matrix(sp.diags(inv) @ X) if sp.issparse(X) else X * inv[:, None]
    if sp.issparse(X):
        return sp.csr_matrix(X @ sp.diags(1.0 / scale))
    return (X - mean) / scale


def scaling_text(kind, X) -> str:
    """The ``scaling`` attribute ``data info`` shows for a file scaled by ``kind``."""
    if kind == "standard":
        return ("standard (CSR: columns scaled to root-mean-square 1, not centred)" if sp.issparse(X)
                else "standard (columns centred, variance 1)")
    return {"maxabs": "maxabs (columns divided by their max |value|, not centred)",
            "l2-rows": "l2-rows (rows scaled to norm 1)"}[kind]
