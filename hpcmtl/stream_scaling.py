"""Feature scaling of an online stream, fitted on the training stream and shared by its test stream.

The online rules see raw instances: the implicit update's step ``l / ||x||^2``
and ``C = "auto"`` (``1 / mean ||x||^2``) absorb the instances' scale, but a
stream of raw counts or 0-255 pixels still mixes rows of very different norms
and features of very different ranges.  ``--scale`` fixes that once, the same
way for the training stream and every test stream of its model:

* ``none``: the instances as stored (the default; the training arithmetic of
  earlier releases, bit for bit).
* ``l2``: every row divided by its Euclidean norm (all-zero rows stay zero);
  stateless, nothing is fitted.
* ``maxabs``: every feature divided by its largest ``|x_f|`` on the training
  stream (features never seen keep scale 1), so features lie in [-1, 1] and
  sparsity is kept (scikit-learn's ``MaxAbsScaler``).
* ``tfidf``: for counts (text): ``x_f * idf_f`` with ``idf_f = ln((1 + T) / (1 +
  df_f)) + 1`` (T training rounds, ``df_f`` the rounds where feature f is
  non-zero; scikit-learn's smoothed idf), then unit rows as ``l2``.

A fitted scaling is a kind and one d-vector (``maxabs``: ``1 / maxabs``;
``tfidf``: idf; ``none`` / ``l2``: none); a result stores both
(``config/scale``, ``/model/feature_scale``) and ``evaluate`` rebuilds it from them.
Fitting reads the stream once in chunks (every rank computes the same vector, in
the same order); the row statistics ``C = "auto"`` and R read (mean ``||x||^2``,
largest ``||x||``) are then those of the scaled stream.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .errors import InputError
from .params import STREAM_SCALINGS


@dataclass(frozen=True)
class StreamScaling:
    """A fitted scaling: ``kind`` and its per-feature factors (None for ``none`` and ``l2``)."""
    kind: str = "none"
    factors: np.ndarray | None = None

    def apply(self, X):
        """The scaled CSR instances of a chunk (a new matrix; X itself is not changed)."""
        if self.kind == "none":
            return X
        X = sp.csr_matrix(X, dtype=np.float64, copy=True)
        if self.factors is not None:
            X.data *= self.factors[X.indices]                         # X @ diag(factors), CSR pattern kept
        if self.kind in ("l2", "tfidf"):
            norms = np.sqrt(_row_sums(X.data * X.data, X.indptr))
            scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
            X.data *= np.repeat(scale, np.diff(X.indptr))             # diag(1 / ||x_t||) @ X
        return X


def _row_sums(values, indptr):
    """Per-row sums of CSR values, empty rows 0 (``np.add.reduceat`` repeats a value at an empty row)."""
    out = np.zeros(len(indptr) - 1)
    counts = np.diff(indptr)
    nonempty = counts > 0
    if values.size:
        out[nonempty] = np.add.reduceat(values, indptr[:-1][nonempty])
    return out


def check_scale(kind, owner="train online"):
    if kind not in STREAM_SCALINGS:
        raise InputError(f"The 'scale' parameter of {owner} must be one of {', '.join(STREAM_SCALINGS)}. "
                         f"Got {kind!r} instead.")
    return kind


def fit_scaling(kind, chunks, n_rounds, n_features):
    """Fit ``kind`` on a stream given as an iterable of CSR chunks (its rounds in order)."""
    check_scale(kind)
    if kind in ("none", "l2"):
        return StreamScaling(kind)
    if kind == "maxabs":
        top = np.zeros(n_features)
        for X in chunks:
            X = sp.csr_matrix(X)
            if X.nnz:
                np.maximum.at(top, X.indices, np.abs(X.data))
        return StreamScaling(kind, np.divide(1.0, top, out=np.ones(n_features), where=top > 0))
    df = np.zeros(n_features)
    for X in chunks:
        X = sp.csr_matrix(X)
        X.eliminate_zeros()
        if X.nnz and np.any(X.data < 0):
            raise InputError("tf-idf scales counts, and the stream has negative values: use --scale l2 or maxabs")
        df += np.bincount(X.indices, minlength=n_features)
    return StreamScaling(kind, np.log((1.0 + n_rounds) / (1.0 + df)) + 1.0)


def from_stored(kind, factors, n_features, where):
    """A scaling rebuilt from a result's ``config/scale`` and ``/model/feature_scale`` (one-line errors)."""
    kind = "none" if kind is None else kind
    if kind not in STREAM_SCALINGS:
        raise InputError(f"{where}: config 'scale' must be one of {', '.join(STREAM_SCALINGS)}, got {kind!r}")
    if kind in ("none", "l2"):
        return StreamScaling(kind)
    factors = None if factors is None else np.asarray(factors, dtype=np.float64)
    if factors is None or factors.shape != (n_features,) or not np.all(np.isfinite(factors)):
        raise InputError(f"{where}: '/model/feature_scale' must hold {n_features} finite numbers for scale "
                         f"'{kind}'")
    return StreamScaling(kind, factors)


def row_statistics(scaling, chunks):
    """(largest ``||x||``, mean ``||x||^2``, rounds) of the scaled stream, from its CSR chunks."""
    top, total, n = 0.0, 0.0, 0
    for X in chunks:
        X = scaling.apply(X)
        sq = _row_sums(X.data * X.data, X.indptr)
        if sq.size:
            top = max(top, float(np.sqrt(sq.max())))
        total += float(sq.sum())
        n += X.shape[0]
    return top, total / max(1, n), n
