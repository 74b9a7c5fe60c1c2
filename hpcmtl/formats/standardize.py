"""Standardization of task datasets (statistics from training data only): ``hpcmtl data standardize``."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def standardization(blocks):
    """Per-feature ``(mean, scale)`` over all rows of all tasks.

    Dense data is centred and scaled to unit variance; CSR data is only scaled
    (centring would destroy sparsity).  Constant columns (such as a bias column
    of ones) keep mean 0 and scale 1, so they pass through unchanged.
    """
    sparse = sp.issparse(blocks[0].X)
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


def apply_standardization(X, mean, scale):
    if sp.issparse(X):
        return sp.csr_matrix(X @ sp.diags(1.0 / scale))
    return (X - mean) / scale

