"""Graphical multi-task kernels (paper 003): a task graph's Laplacian as the task covariance.

With the weighted Laplacian ``L = diag(W 1) - W`` of a task graph and per-task
``alpha_t >= 0`` (positive for some task of every connected component), the task
kernel of Eq. 5 is::

    K_hat = (L + diag(alpha))^-1,   D = diag(K_hat),   K = D^-1/2 K_hat D^-1/2

(``normalize=False`` keeps K_hat).  Its inverse regularizes the task functions as
``sum_{edges s~t} w_st ||f_s - f_t||^2 + sum_t alpha_t ||f_t||^2``.  K serves two ways:

* as the fixed task covariance Sigma of the DMTRL engine (``hpcmtl train graph``;
  linear or random-Fourier features, distributed);
* in the product multi-task kernel ``K_st k(x, y)`` for an exact kernel machine
  (:func:`product_gram`, fed to scikit-learn's SVC with ``kernel='precomputed'``).
"""
from __future__ import annotations

import csv
import os
import re

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph

from .covariance import GraphSigma
from .errors import InputError

COMPLETE_MAX_EDGES = 1 << 24       # a complete graph's edges at most (both directions: 400 MB as a sparse matrix)
TOPOLOGIES = ("cycle", "chain", "complete", "star", "grid RxC", "empty")


def topology(name: str, m: int, sparse: bool = False):
    """Unit-weight adjacency (m x m) of a named topology over tasks 0..m-1 in file order.

    ``cycle`` (t ~ t+1 and m-1 ~ 0), ``chain``, ``complete``, ``star`` (task 0 in the
    centre), ``grid RxC`` (R * C == m, row-major; also written ``grid:RxC``), ``empty``.
    Built from its edge list (O(m + edges)); ``sparse=True`` returns it as a scipy.sparse CSR matrix (many
    tasks: a dense m x m array at 10^5 tasks is 80 GB), else the dense array.
    """
    name = name.strip().lower()
    grid = re.fullmatch(r"grid[ :](\d+)x(\d+)", name)
    t = np.arange(m, dtype=np.int64)
    if name in ("cycle", "chain"):
        s, e = t[:-1], t[1:]
        if name == "cycle" and m > 2:
            s, e = np.append(s, 0), np.append(e, m - 1)
    elif name == "complete":
        if m * (m - 1) > COMPLETE_MAX_EDGES:     # (and the kernel's diagonal would cost m^3: refused too)
            raise InputError(f"graph 'complete' over {m} tasks: its Laplacian is dense ({m * (m - 1) / 2:.2g} "
                             f"edges); the sparse graph kernel takes graphs of few edges a task")
        s, e = np.triu_indices(m, 1)
    elif name == "star":
        s, e = np.zeros(max(m - 1, 0), dtype=np.int64), t[1:]
    elif grid:
        rows, cols = int(grid.group(1)), int(grid.group(2))
        if rows * cols != m:
            raise InputError(f"graph 'grid {rows}x{cols}' has {rows * cols} nodes but there are {m} tasks")
        right = t[(t % cols) + 1 < cols]
        down = t[t + cols < m]
        s, e = np.concatenate([right, down]), np.concatenate([right + 1, down + cols])
    elif name == "empty":
        s = e = np.zeros(0, dtype=np.int64)
    else:
        from .losses import closest
        raise InputError(f"unknown graph '{name}'; use one of {', '.join(TOPOLOGIES)} or an edge-list CSV file."
                         f"{closest(name, ['cycle', 'chain', 'complete', 'star', 'empty'])}")
    return _symmetric(s, e, np.ones(len(s)), m, sparse)


def _symmetric(s, e, w, m, sparse):
    """The symmetric adjacency of edges ``s[k] ~ e[k]`` of weights ``w[k]`` (repeated edges add up): summed once
    over the upper triangle, then mirrored, so that A is symmetric to the bit."""
    upper = scipy.sparse.coo_matrix((w, (np.minimum(s, e), np.maximum(s, e))), shape=(m, m)).tocsr()
    upper.sum_duplicates()
    A = (upper + upper.T).tocsr()
    A.sort_indices()
    return A if sparse else A.toarray()


def read_edges(path: str, names, sparse: bool = False):
    """Weighted adjacency from a CSV of ``task_a,task_b,weight`` rows (names or 0-based indices).

    A header line is allowed; the weight column is optional (default 1); repeated
    edges add up.  Built from the edge list (``sparse=True``: a scipy.sparse CSR matrix, else dense).
    """
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    names = [str(n) for n in names]
    index = {n: i for i, n in enumerate(names)}
    m = len(names)
    starts, ends, weights = [], [], []

    def task(token, line_no):
        token = token.strip()
        if token in index:
            return index[token]
        if token.isdigit() and int(token) < m:
            return int(token)
        raise InputError(f"{path}: line {line_no}: unknown task '{token}' (tasks: {', '.join(names[:8])}"
                         f"{', ...' if m > 8 else ''})")

    with open(path, newline="", encoding="utf-8") as f:
        for line_no, row in enumerate(csv.reader(f), start=1):
            if not row or row[0].strip().startswith("#"):
                continue
            if line_no == 1 and row[0].strip() not in index and not row[0].strip().isdigit():
                continue                                   # header
            if len(row) < 2:
                raise InputError(f"{path}: line {line_no}: expected task_a,task_b[,weight]")
            s, t = task(row[0], line_no), task(row[1], line_no)
            try:
                w = float(row[2]) if len(row) > 2 and row[2].strip() else 1.0
            except ValueError:
                raise InputError(f"{path}: line {line_no}: weight {row[2]!r} is not a number") from None
            if not (w >= 0 and np.isfinite(w)):
                raise InputError(f"{path}: line {line_no}: negative or non-finite edge weight {w} ({row[0]}, {row[1]})")
            if s == t:
                raise InputError(f"{path}: line {line_no}: self-loop on task '{names[s]}'")
            starts.append(s)
            ends.append(t)
            weights.append(w)
    return _symmetric(np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64),
                      np.array(weights, dtype=np.float64), m, sparse)


def graph_adjacency(graph, names, sparse: bool = False):
    """A named topology, an edge-list CSV path, or an (m x m) weight matrix (dense or scipy.sparse);
    ``sparse=True``: as a scipy.sparse CSR matrix."""
    m = len(names)
    if isinstance(graph, str):
        if graph.lower().endswith(".csv") or os.path.sep in graph:
            return read_edges(graph, names, sparse)
        return topology(graph, m, sparse)
    if scipy.sparse.issparse(graph):
        A = scipy.sparse.csr_matrix(graph, dtype=np.float64)
        if A.shape != (m, m):
            raise InputError(f"graph weight matrix has shape {A.shape}, there are {m} tasks")
        if np.any(A.data < 0) or not np.all(np.isfinite(A.data)):
            raise InputError("graph weights must be finite and >= 0")
        if abs(A - A.T).max() > 1e-8 * max(abs(A).max(), 1e-300) if A.nnz else False:
            raise InputError("graph weight matrix must be symmetric")
        return A if sparse else A.toarray()
    A = np.asarray(graph, dtype=np.float64)
    if A.shape != (m, m):
        raise InputError(f"graph weight matrix has shape {A.shape}, there are {m} tasks")
    if np.any(A < 0) or not np.all(np.isfinite(A)):
        raise InputError("graph weights must be finite and >= 0")
    if not np.allclose(A, A.T):
        raise InputError("graph weight matrix must be symmetric")
    return scipy.sparse.csr_matrix(A) if sparse else A


def check_graph(adjacency, alpha, names=None):
    """``(A, alpha)`` checked for Eq. 5: alpha finite and >= 0, weights >= 0, and some task of every connected
    component with alpha > 0 (otherwise ``L + diag(alpha)`` is singular): one-line InputErrors.  A stays dense
    or sparse as given; alpha becomes one value per task."""
    sparse = scipy.sparse.issparse(adjacency)
    A = scipy.sparse.csr_matrix(adjacency, dtype=np.float64) if sparse else np.asarray(adjacency, dtype=np.float64)
    m = A.shape[0]
    names = [str(n) for n in (names if names is not None else range(m))]
    alpha = np.broadcast_to(np.asarray(alpha, dtype=np.float64), (m,)).copy()
    if np.any(alpha < 0) or not np.all(np.isfinite(alpha)):
        raise InputError(f"alpha must be finite and >= 0, got {alpha.tolist()[:8]}")
    if np.any((A.data if sparse else A) < 0):
        raise InputError("graph edge weights must be >= 0")
    n_comp, labels = scipy.sparse.csgraph.connected_components(A > 0, directed=False)
    positive = np.bincount(labels, weights=(alpha > 0).astype(np.float64), minlength=n_comp)
    for c in np.flatnonzero(positive == 0)[:1]:
        members = np.flatnonzero(labels == c)
        shown = ", ".join(names[i] for i in members[:6]) + (", ..." if members.size > 6 else "")
        raise InputError(f"the graph component {{{shown}}} has no task with alpha > 0: L + diag(alpha) is "
                         "singular (give alpha > 0)")
    degree = np.asarray(A.sum(axis=1)).reshape(-1)
    if not np.all(np.isfinite(degree)):
        raise InputError("the graph's weighted degrees overflow: rescale the edge weights")
    return A, alpha


def task_kernel(adjacency, alpha, normalize=True, names=None) -> np.ndarray:
    """Eq. 5: ``K = D^-1/2 (L + diag(alpha))^-1 D^-1/2`` (or the inverse alone), the dense m x m matrix.

    ``alpha``: a scalar or one value per task, all >= 0, positive for at least one
    task of every connected component (otherwise ``L + diag(alpha)`` is singular).
    Many tasks: :func:`graph_covariance` (the kernel held sparse, never formed).
    """
    A, alpha = check_graph(adjacency, alpha, names)
    if scipy.sparse.issparse(A):
        A = A.toarray()
    L = np.diag(A.sum(axis=1)) - A
    K = np.linalg.inv(L + np.diag(alpha))
    K = 0.5 * (K + K.T)
    if not np.all(np.isfinite(K)) or not np.all(np.diag(K) > 0):
        raise InputError("the task kernel (L + diag(alpha))^-1 is not finite and positive: L + diag(alpha) is "
                         "numerically singular (raise alpha or rescale the edge weights)")
    if normalize:
        s = 1.0 / np.sqrt(np.diag(K))
        K = K * np.outer(s, s)
        np.fill_diagonal(K, 1.0)
    return K


# from this many tasks a graph kernel is held sparse (:class:`hpcmtl.covariance.GraphSigma`: the Laplacian and a
# sparse LU, no m x m array); below it the dense matrix of task_kernel (its bits, as before).  Tests set it to 0
SPARSE_GRAPH_MIN_TASKS = 512


def graph_covariance(adjacency, alpha, normalize=True, names=None, what="graph"):
    """The task covariance of Eq. 5 for the DMTRL engine: :func:`task_kernel`'s dense matrix below
    :data:`SPARSE_GRAPH_MIN_TASKS` tasks, from there a :class:`hpcmtl.covariance.GraphSigma` (sparse; ``what``
    names the graph in its errors)."""
    m = adjacency.shape[0]
    if m < SPARSE_GRAPH_MIN_TASKS:
        return task_kernel(adjacency, alpha, normalize, names)
    A, alpha = check_graph(adjacency, alpha, names)
    return GraphSigma(A, alpha, normalize, what=what)


def regularizer(W, adjacency, alpha) -> float:
    """``sum_{edges} w_st ||w_s - w_t||^2 + sum_t alpha_t ||w_t||^2`` for W (d x m) (for tests and docs)."""
    A = np.asarray(adjacency, dtype=np.float64)
    m = A.shape[0]
    alpha = np.broadcast_to(np.asarray(alpha, dtype=np.float64), (m,))
    total = sum(A[s, t] * np.sum((W[:, s] - W[:, t]) ** 2) for s in range(m) for t in range(s + 1, m))
    return float(total + np.sum(alpha * np.sum(W ** 2, axis=0)))


def product_gram(X, tasks, K, kernel="rbf", Y=None, tasks_Y=None, **kernel_params) -> np.ndarray:
    """Product multi-task Gram matrix ``K[t_i, t_j] k(x_i, y_j)`` (Eq. 2).

    ``X`` (n x d, dense or sparse) with task ids ``tasks`` (n); ``Y``/``tasks_Y``
    default to X/tasks.  ``kernel`` and ``kernel_params`` go to scikit-learn's
    ``pairwise_kernels`` (``'rbf'`` with ``gamma``, ``'linear'``, ``'poly'`` with
    ``degree``, ``gamma``, ``coef0``).  Feed it to ``SVC(kernel='precomputed')`` or
    save it with :func:`export_gram` for any other solver.
    """
    if Y is None:
        Y, tasks_Y = X, tasks
    from sklearn.metrics.pairwise import pairwise_kernels     # lazily: scikit-learn is slow to import
    base = pairwise_kernels(X, Y, metric=kernel, **kernel_params)
    return base * np.asarray(K)[np.ix_(np.asarray(tasks), np.asarray(tasks_Y))]


def export_gram(path, X, tasks, K, kernel="rbf", **kernel_params):
    """Write the training Gram matrix as a .npy file (for an external kernel solver)."""
    G = product_gram(X, tasks, K, kernel, **kernel_params)
    np.save(path, G)
    return G


# a user's sparse precision (`train fixed --sigma OMEGA.npz`): entries this close to symmetric, row sums this close
# below zero, relative to the largest |entry| of the row or matrix, are rounding (taken as symmetric, as zero)
PRECISION_RTOL = 1e-12
# what a refused precision's error says is taken (GraphSigma's form, see precision_covariance)
SUPPORTED_PRECISIONS = ("supported are graph precisions L + diag(alpha), off-diagonal entries <= 0 and row sums "
                        ">= 0, whose inverse is >= 0 entrywise (docs/many-tasks.md)")


def precision_covariance(Q, what="precision"):
    """``Sigma = Q^-1`` for a user's sparse precision Q (m x m, scipy.sparse), held as a :class:`GraphSigma`
    (unnormalized: ``K_hat = Q^-1`` itself), or a one-line InputError starting with ``what``.

    GraphSigma holds ``Q = L + diag(alpha)``, a weighted graph Laplacian plus a diagonal ``alpha >= 0``, and relies
    on it: ``Q^-1 >= 0`` entrywise (Q an M-matrix), so ``|Sigma| x = Sigma x`` (Lemma 6.7's rho, 'safe' and
    'adaptive'); a result file and a checkpoint store it as the graph and alpha.  So exactly those Q are taken:
    square, finite, symmetric, off-diagonal entries <= 0 (``A = -offdiag(Q)`` the weights), row sums >= 0
    (``alpha = Q 1``), and positive definite: for such Q, when every connected component of the graph has a row of
    positive sum (O(m + nnz), no factorization).  A symmetric positive definite Q with a positive off-diagonal
    entry (``Q^-1`` may have negative entries) or a negative row sum is refused."""
    if not scipy.sparse.issparse(Q) or Q.ndim != 2:
        raise InputError(f"{what}: not a scipy.sparse matrix (write it with scipy.sparse.save_npz)")
    if Q.shape[0] != Q.shape[1]:
        raise InputError(f"{what}: the precision is {Q.shape[0]} x {Q.shape[1]}, not square")
    if Q.shape[0] == 0:                  # (the row maxima below have nothing to reduce: a traceback, not a line)
        raise InputError(f"{what}: the precision is 0 x 0: no tasks")
    if Q.dtype.kind not in "biuf":       # a complex Q would be cast to its real part, silently another matrix
        raise InputError(f"{what}: the precision's entries are {Q.dtype}, not real numbers")
    Q = scipy.sparse.csr_matrix(Q, dtype=np.float64)
    Q.sum_duplicates()
    m = Q.shape[0]
    if not np.all(np.isfinite(Q.data)):
        raise InputError(f"{what}: the precision has entries that are not finite")
    top = float(np.max(np.abs(Q.data))) if Q.nnz else 0.0
    asym = abs(Q - Q.T)
    if asym.nnz and asym.max() > PRECISION_RTOL * top:
        i, j = (int(v[0]) for v in (asym > PRECISION_RTOL * top).nonzero())
        raise InputError(f"{what}: the precision is not symmetric: entry ({i}, {j}) is {float(Q[i, j])!r}, "
                         f"({j}, {i}) is {float(Q[j, i])!r}")
    Q = (0.5 * Q + 0.5 * Q.T).tocsr()        # halves first: entries near the largest float do not overflow
    diag = Q.diagonal()
    if np.any(diag <= 0):
        i = int(np.flatnonzero(diag <= 0)[0])
        raise InputError(f"{what}: the precision is not positive definite: its diagonal entry {i} is "
                         f"{float(diag[i])!r}")
    off = Q - scipy.sparse.diags(diag)
    off.eliminate_zeros()
    if off.nnz and off.max() > 0:
        i, j = (int(v[0]) for v in (off > 0).nonzero())
        raise InputError(f"{what}: the precision has a positive off-diagonal entry ({i}, {j}) = {float(Q[i, j])!r}: "
                         f"{SUPPORTED_PRECISIONS}")
    A = (-off).tocsr()
    alpha = diag - np.asarray(A.sum(axis=1)).reshape(-1)            # Q's row sums
    scale = np.maximum(diag, A.max(axis=1).toarray().reshape(-1))
    if np.any(alpha < -PRECISION_RTOL * scale):
        i = int(np.flatnonzero(alpha < -PRECISION_RTOL * scale)[0])
        raise InputError(f"{what}: the precision's row {i} sums to {float(alpha[i])!r} < 0: {SUPPORTED_PRECISIONS}")
    alpha = np.where(alpha > PRECISION_RTOL * scale, alpha, 0.0)     # a Laplacian's row: zero to rounding
    n_comp, labels = scipy.sparse.csgraph.connected_components(A, directed=False)
    positive = np.bincount(labels, weights=(alpha > 0).astype(np.float64), minlength=n_comp)
    for c in np.flatnonzero(positive == 0)[:1]:
        members = np.flatnonzero(labels == c)
        shown = ", ".join(str(i) for i in members[:6]) + (", ..." if members.size > 6 else "")
        raise InputError(f"{what}: the precision is not positive definite (singular): the rows of the connected "
                         f"tasks {{{shown}}} sum to 0")
    return GraphSigma(A, alpha, normalize=False, what=what)
