"""Synthetic multi-task data of the four papers, with their ground truth.

Every generator returns ``(train, test, truth)`` where train/test are
``(Xs, ys, names)`` and truth is a dict of arrays stored under ``/truth`` of
the task file.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .errors import InputError


def _split(rng, X, y, test_fraction):
    n = X.shape[0]
    order = rng.permutation(n)
    n_test = int(round(test_fraction * n))
    te, tr = order[:n_test], order[n_test:]
    return X[tr], y[tr], X[te], y[te]


def dmtrl(variant: int = 1, seed: int = 0, scale: float = 1.0):
    """Paper 001 Sec. 7.1, Synthetic 1 (variant 1) and 2 (variant 2).

    16 tasks, d = 100.  Parents are tasks 1, 6 and 11 (0-based 0, 5, 10) with
    random weights; every other task copies one of {+-w1, +-w6, +-w11} plus
    noise.  Instances are standard normal; labels follow the logistic model
    ``P(y = 1 | x) = 1 / (1 + exp(-w_i . x))``.  About 2,705 instances per
    task (43,280 in all), 70 % train (about 1,894) and 30 % test (about 811).
    Variant 2 keeps the same instances but makes the task weights more
    correlated (smaller child noise, parents mixed into each other), which
    raises rho.
    """
    m, d = 16, 100
    rng = np.random.default_rng(seed)
    parents = [0, 5, 10]
    P = rng.normal(size=(d, 3))
    choice = rng.integers(0, 3, size=m)
    sign = rng.choice([-1.0, 1.0], size=m)
    noise = rng.normal(size=(d, m))
    if variant == 2:
        mix = np.array([[1.0, 0.6, 0.6], [0.6, 1.0, 0.6], [0.6, 0.6, 1.0]])
        P = P @ mix
        noise_level = 0.1
    else:
        noise_level = 0.3
    W = np.empty((d, m))
    for i in range(m):
        if i in parents:
            W[:, i] = P[:, parents.index(i)]
        else:
            W[:, i] = sign[i] * P[:, choice[i]] + noise_level * noise[:, i]
    W /= np.sqrt(d) / 3.0            # margins of order a few units: learnable, not separable
    sizes = np.maximum(50, np.round(2705 * scale * rng.uniform(0.7, 1.3, size=m))).astype(int)
    data_rng = np.random.default_rng([seed, 1])      # instances do not depend on the variant
    train, test = ([], [], []), ([], [], [])
    for i in range(m):
        X = data_rng.normal(size=(sizes[i], d))
        u = data_rng.uniform(size=sizes[i])
        y = np.where(u < 1.0 / (1.0 + np.exp(-X @ W[:, i])), 1.0, -1.0)
        Xtr, ytr, Xte, yte = _split(data_rng, X, y, 0.3)
        for part, (Xp, yp) in ((train, (Xtr, ytr)), (test, (Xte, yte))):
            part[0].append(Xp)
            part[1].append(yp)
            part[2].append(f"task{i + 1:02d}")
    truth = {"W": W, "correlation": np.corrcoef(W.T), "parent": np.array([parents[c] for c in choice]),
             "sign": sign}
    return train, test, truth


def scaled(kind: str, seed: int = 0, scale: float = 1.0):
    """Scaling-run problems shaped like MNIST (dense) or MDS (sparse).

    ``mnist``: 10 tasks, 140,000 x 784 dense rows in all at scale 1.
    ``mds``: 22 tasks, 91,000 x 10,000 CSR rows at 0.9 % density at scale 1.
    Labels come from a shared low-rank task structure plus a logistic model.
    """
    rng = np.random.default_rng(seed)
    if kind == "mnist":
        m, d, n_total, density = 10, 784, 140000, 1.0
    elif kind == "mds":
        m, d, n_total, density = 22, 10000, 91000, 0.009
    else:
        raise InputError(f"unknown scaled problem '{kind}' (use mnist or mds)")
    n_i = max(20, int(n_total * scale / m))
    U = rng.normal(size=(d, 3))
    W = U @ rng.normal(size=(3, m)) + 0.3 * rng.normal(size=(d, m))
    train, test = ([], [], []), ([], [], [])
    for i in range(m):
        if density >= 1.0:
            X = rng.uniform(0, 1, size=(n_i, d)) * (rng.uniform(size=(n_i, d)) < 0.2)
        else:
            X = sp.random(n_i, d, density=density, format="csr", random_state=rng,
                          data_rvs=lambda k: rng.exponential(size=k))
        z = np.asarray(X @ W[:, i]).ravel()
        z = (z - np.median(z)) / (z.std() + 1e-12) * 3.0
        y = np.where(rng.uniform(size=n_i) < 1.0 / (1.0 + np.exp(-z)), 1.0, -1.0)
        Xtr, ytr, Xte, yte = _split(rng, X, y, 0.3)
        for part, (Xp, yp) in ((train, (Xtr, ytr)), (test, (Xte, yte))):
            part[0].append(Xp)
            part[1].append(yp)
            part[2].append(f"task{i + 1:02d}")
    return train, test, {"W": W}


def joint_sparse(seed: int = 0, n_train: int = 100, n_test: int = 500, d: int = 200, m: int = 60,
                 relevant_fraction: float = 0.1, unit_norm: bool = True):
    """Paper 002 Sec. 5.1: jointly sparse task weights.

    Entries of W are N(0, 1); 10 % of the features form the relevant set V;
    each task keeps a random subset of V (each relevant feature with
    probability 1/2, at least one) and zeroes the rest.  Instances are N(0, I)
    normalized to unit norm; ``y = sign(w_k . x)``.  The truth holds W, the
    relevant-feature mask and ``||W||_{1,inf}`` (the radius C of the paper).
    ``unit_norm=False`` keeps x ~ N(0, I): margins of the true W are then of
    order one instead of about 0.17, so the hinge loss is not linear on the
    whole ball of radius C.
    """
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(d, m))
    relevant = np.zeros(d, dtype=bool)
    relevant[rng.choice(d, size=max(1, int(round(relevant_fraction * d))), replace=False)] = True
    rel_idx = np.flatnonzero(relevant)
    for k in range(m):
        keep = rel_idx[rng.uniform(size=rel_idx.size) < 0.5]
        if keep.size == 0:
            keep = rel_idx[rng.integers(rel_idx.size, size=1)]
        mask = np.zeros(d, dtype=bool)
        mask[keep] = True
        W[~mask, k] = 0.0
    train, test = ([], [], []), ([], [], [])
    for k in range(m):
        for part, n in ((train, n_train), (test, n_test)):
            X = rng.normal(size=(n, d))
            if unit_norm:
                X /= np.linalg.norm(X, axis=1, keepdims=True)
            y = np.sign(X @ W[:, k])
            y[y == 0] = 1.0
            part[0].append(X)
            part[1].append(y)
            part[2].append(f"task{k + 1:02d}")
    norm = float(np.abs(W).max(axis=1).sum())
    return train, test, {"W": W, "relevant": relevant, "l1inf_norm": np.array(norm)}


def seasonal(seed: int = 0, n_per_month: int = 470, d: int = 8):
    """Paper 003's setting: 12 monthly tasks in a cycle with drifting weights.

    Month t has weights ``w_t = w0 + cos(2 pi t/12) u + sin(2 pi t/12) v``, a
    strongly seasonal positive rate (about 3 % in winter to 45 % in summer,
    like Fig. 1 of the paper), and a non-linear term (a quadratic bump in two
    features) that an RBF kernel can use.  Features are standardized.
    """
    rng = np.random.default_rng(seed)
    w0, u, v = rng.normal(size=(3, d))
    rate = 0.03 + 0.42 * (0.5 - 0.5 * np.cos(2 * np.pi * (np.arange(12) - 0.5) / 12.0)) ** 1.5
    Xs, ys, names, Ws = [], [], [], []
    for t in range(12):
        w = w0 + np.cos(2 * np.pi * t / 12) * u + np.sin(2 * np.pi * t / 12) * v
        X = rng.normal(size=(n_per_month, d))
        z = X @ w / np.sqrt(d) + 1.0 * (1.0 - X[:, 0] ** 2 - X[:, 1] ** 2) * np.cos(2 * np.pi * t / 12)
        z += rng.logistic(scale=0.3, size=n_per_month)
        threshold = np.quantile(z, 1.0 - rate[t])
        Xs.append(X)
        ys.append(np.where(z > threshold, 1.0, -1.0))
        names.append(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"][t])
        Ws.append(w)
    return (Xs, ys, names), {"W": np.array(Ws).T, "positive_rate": rate}


def multilabel_stream(seed: int = 0, n_rounds: int = 20000, d: int = 2000, k: int = 20, nnz: int = 40):
    """Paper 004 style stream: one sparse shared instance per round, k binary labels.

    Labels come from k linear separators sharing a low-rank structure with 5 %
    label noise.  Returns ``(X csr (T x d), Y (T x k) in {-1, +1}, truth)``.
    """
    rng = np.random.default_rng(seed)
    U = rng.normal(size=(d, 4))
    Wt = U @ rng.normal(size=(4, k)) + 0.5 * rng.normal(size=(d, k))
    cols = np.concatenate([rng.choice(d, size=nnz, replace=False) for _ in range(n_rounds)])
    vals = rng.exponential(size=n_rounds * nnz)
    X = sp.csr_matrix((vals, cols, np.arange(0, n_rounds * nnz + 1, nnz)), shape=(n_rounds, d))
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    X = sp.csr_matrix(sp.diags(1.0 / norms) @ X)
    Z = np.asarray(X @ Wt)
    Z -= np.quantile(Z, 0.8, axis=0)          # about 20 % positives per label
    Y = np.where(Z > 0, 1.0, -1.0)
    flip = rng.uniform(size=Y.shape) < 0.05
    Y[flip] *= -1
    return X, Y, {"W": Wt}


def sparse_vocabulary(seed: int = 0, m: int = 15, d: int = 152543, vocabulary: int = 20000,
                      n_per_task: int = 400, words: int = 150, zipf: float = 1.01, test_fraction: float = 0.25):
    """Sparse tasks that each touch only their own vocabulary (a spam-filtering shape).

    ``d`` features ranked by a global Zipf popularity; each task draws a
    vocabulary of ``vocabulary`` distinct features from that ranking (so
    frequent features are shared, rare ones mostly private), and each row
    draws ``words`` tokens from its task's vocabulary with Zipf(``zipf``)
    frequencies.  Rows are term counts scaled to unit norm.  Labels come from a
    shared weight vector plus a task-specific one, with 5 % label noise.
    The union of the task supports is far smaller than ``d * m``: the case
    where moving only the supports pays.
    """
    if not (m >= 1 and d >= 2 and 1 <= vocabulary <= d and n_per_task >= 2 and words >= 1 and zipf > 1.0):
        raise InputError("sparse_vocabulary needs m >= 1, d >= 2, 1 <= vocabulary <= d, n_per_task >= 2, "
                         "words >= 1 and zipf > 1")
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, d + 1) ** 0.8
    popularity /= popularity.sum()
    shared = rng.normal(size=d)
    train, test = ([], [], []), ([], [], [])
    supports = []
    for i in range(m):
        vocab = np.sort(rng.choice(d, size=vocabulary, replace=False, p=popularity))
        weights = shared[vocab] + rng.normal(size=vocab.size)
        freq = 1.0 / np.arange(1, vocab.size + 1) ** zipf
        freq = rng.permutation(freq / freq.sum())
        tokens = rng.choice(vocab.size, size=(n_per_task, words), p=freq)
        rows = np.repeat(np.arange(n_per_task), words)
        X = sp.csr_matrix((np.ones(rows.size), (rows, tokens.ravel())), shape=(n_per_task, vocab.size))
        X.sum_duplicates()
        X = sp.csr_matrix(sp.diags(1.0 / np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())) @ X)
        z = np.asarray(X @ weights).ravel()
        y = np.where(z > np.median(z), 1.0, -1.0)
        y[rng.uniform(size=n_per_task) < 0.05] *= -1
        X = sp.csr_matrix((X.data, vocab[X.indices], X.indptr), shape=(n_per_task, d))   # to global features
        X.sort_indices()
        supports.append(np.unique(X.indices))
        Xtr, ytr, Xte, yte = _split(rng, X, y, test_fraction)
        for part, (Xp, yp) in ((train, (Xtr, ytr)), (test, (Xte, yte))):
            part[0].append(sp.csr_matrix(Xp))
            part[1].append(yp)
            part[2].append(f"user{i + 1:02d}")
    return train, test, {"support_sizes": np.array([s.size for s in supports], dtype=np.int64)}
