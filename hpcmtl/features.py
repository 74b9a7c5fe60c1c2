"""Explicit feature maps phi(x) (paper 001 uses explicit maps instead of an n x n kernel).

Random Fourier features for the RBF kernel ``exp(-gamma ||x - x'||^2)`` come
from scikit-learn's ``RBFSampler``; the map depends only on (n_features, dim,
gamma, seed), so every rank and every later evaluation builds the same one.
"""
from __future__ import annotations

import numpy as np


def rff_map(n_features: int, dim: int, gamma: float, seed: int):
    """Return ``phi(X)``: X (n x n_features, dense or sparse) -> dense (n x dim)."""
    # imported here: scikit-learn takes ~1.8 s to import, which every rank of every job paid at start-up
    from sklearn.kernel_approximation import RBFSampler
    sampler = RBFSampler(gamma=gamma, n_components=dim, random_state=seed)
    sampler.fit(np.zeros((1, n_features)))

    def phi(X):
        return np.ascontiguousarray(sampler.transform(X), dtype=np.float64)

    return phi


def feature_map_from_config(config: dict, n_features: int):
    """The map a result was trained with (identity when no random features)."""
    dim = int(config.get("rff_dim") or 0)
    if dim <= 0:
        return None
    return rff_map(n_features, dim, float(config["rff_gamma"]), int(config["seed"]))
