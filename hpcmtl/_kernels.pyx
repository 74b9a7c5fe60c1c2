# cython: language_level=3
"""Compiled arithmetic for hpcmtl.  No MPI, no I/O, no Python objects in loops.

Rows of a task block come through one interface whether the block is dense or
CSR (see ``RowView``): a dense row is ``(shared 0..d-1 indices, X[i], d)``, a
CSR row is ``(indices[indptr[i]:indptr[i+1]], data[...], nnz)``, so every
solver loop below is written once.

Loss ids (mapped once from a validated name in ``hpcmtl.losses``):
0 hinge, 1 smoothed hinge (parameter gamma), 2 squared, 3 logistic.

Local SDCA solves the DMTRL local subproblem (paper 001, Eq. 4) coordinate by
coordinate: for coordinate j of task i, with
``u = w_i + (rho sigma_ii / lam) delta_b_i`` and
``q = rho sigma_ii ||x_j||^2 / (lam n_i)`` it maximizes
``-l*(-(a + delta)) - delta u.x_j - (q/2) delta^2`` over delta.
"""
from libc.math cimport exp, log, log1p, fabs, sqrt, INFINITY
from libc.stdint cimport uint64_t, int64_t
from libc.stdlib cimport malloc, free

import numpy as np

cdef enum LossId:
    HINGE = 0
    SMOOTHED_HINGE = 1
    SQUARED = 2
    LOGISTIC = 3


# ---------------------------------------------------------------------------
# Row interface
# ---------------------------------------------------------------------------
cdef struct RowView:
    const double* data        # dense: n x d row-major values; CSR: data
    const int* indices        # dense: shared 0..d-1; CSR: column indices
    const int64_t* indptr     # CSR row pointers (unused when dense)
    int dense
    int n_features


cdef inline int get_row(const RowView* rows, Py_ssize_t i,
                        const double** values, const int** idx) noexcept nogil:
    """Point ``values``/``idx`` at row ``i``; return its number of entries."""
    cdef int64_t start
    if rows.dense:
        values[0] = rows.data + i * rows.n_features
        idx[0] = rows.indices
        return rows.n_features
    start = rows.indptr[i]
    values[0] = rows.data + start
    idx[0] = rows.indices + start
    return <int>(rows.indptr[i + 1] - start)


cdef inline double sparse_dot(const double* values, const int* idx, int nnz,
                              const double* w) noexcept nogil:
    # np.dot(x_row, w)
    cdef double s = 0.0
    cdef int k
    for k in range(nnz):
        s += values[k] * w[idx[k]]
    return s


# ---------------------------------------------------------------------------
# Input checks.  The loops below run without bounds checks, so every public
# kernel checks shapes, ids and the row structure here, before it releases the
# GIL: no index computed inside a loop can then leave its array.  (The same
# source compiled with bounds checks on, ``hpcmtl._kernels_debug``, runs the
# kernel tests too: see setup.py and tests/conftest.py.)
# ---------------------------------------------------------------------------
# What an empty array points at: a pointer into a real object (never NULL, never
# ``&a[0]`` of a zero-length view), so ``p + 0`` is defined and nothing is read.
cdef double NO_DOUBLES[1]
cdef int NO_INTS[1]
cdef int64_t NO_OFFSETS[1]


cdef inline const double* cptr(const double[::1] a) noexcept:
    return &a[0] if a.shape[0] > 0 else NO_DOUBLES


cdef inline double* mptr(double[::1] a) noexcept:
    return &a[0] if a.shape[0] > 0 else NO_DOUBLES


cdef inline double* mptr2(double[:, ::1] a) noexcept:
    return &a[0, 0] if a.shape[0] > 0 and a.shape[1] > 0 else NO_DOUBLES


cdef inline const double* cptr2(const double[:, ::1] a) noexcept:
    return &a[0, 0] if a.shape[0] > 0 and a.shape[1] > 0 else NO_DOUBLES


cdef int check_rows(const double[::1] data, const int[::1] indices, const int64_t[::1] indptr,
                    bint dense, int n_features, Py_ssize_t start, Py_ssize_t stop) except -1:
    """Raise ValueError unless rows ``start..stop-1`` exist with every column in ``0..n_features-1``.

    Dense: ``data`` holds ``stop x n_features`` values and ``indices`` is ``0..d-1``
    (O(d)).  CSR: ``indptr[start..stop]`` is non-decreasing inside ``data`` and
    ``indices``, and each of those rows' column indices is in range (O(rows + nnz)).
    """
    cdef Py_ssize_t i, p = 0, lo, hi
    cdef int bad = 0
    if n_features < 0:
        raise ValueError(f"rows: n_features must be >= 0. Got {n_features} instead.")
    if start < 0 or stop < start:
        raise ValueError(f"rows: bad row range {start}..{stop}")
    if dense:
        if indices.shape[0] != n_features:
            raise ValueError(f"dense rows: the shared index array has {indices.shape[0]} entries, "
                             f"expected n_features = {n_features}")
        if n_features > 0 and data.shape[0] // n_features < stop:
            raise ValueError(f"dense rows: {data.shape[0]} values hold fewer than {stop} rows "
                             f"of {n_features} features")
        with nogil:
            for i in range(n_features):
                if indices[i] != i:
                    bad = 1
                    break
        if bad:
            raise ValueError("dense rows: the shared index array must be 0..n_features-1")
        return 0
    if indptr.shape[0] <= stop:
        raise ValueError(f"CSR rows: indptr has {indptr.shape[0]} entries, {stop} rows need {stop + 1}")
    lo = indptr[start]
    hi = indptr[stop]
    if lo < 0 or hi > data.shape[0] or hi > indices.shape[0]:
        raise ValueError(f"CSR rows: indptr points outside data ({data.shape[0]}) or indices "
                         f"({indices.shape[0]})")
    with nogil:
        for i in range(start, stop):
            if indptr[i + 1] < indptr[i]:
                bad = 1
                break
        if not bad:
            for p in range(lo, hi):
                if indices[p] < 0 or indices[p] >= n_features:
                    bad = 2
                    break
    if bad == 1:
        raise ValueError("CSR rows: indptr decreases")
    if bad == 2:
        raise ValueError(f"CSR rows: column index {indices[p]} outside 0..{n_features - 1}")
    return 0


cdef int check_length(str name, Py_ssize_t got, Py_ssize_t expected) except -1:
    if got != expected:
        raise ValueError(f"{name} has length {got}, expected {expected}")
    return 0


cdef int check_shape(str name, const double[:, ::1] a, Py_ssize_t rows, Py_ssize_t cols) except -1:
    if a.shape[0] != rows or a.shape[1] != cols:
        raise ValueError(f"{name} has shape ({a.shape[0]}, {a.shape[1]}), expected ({rows}, {cols})")
    return 0


cdef int check_loss(int loss) except -1:
    if loss < HINGE or loss > LOGISTIC:
        raise ValueError(f"unknown loss id {loss} (0 hinge, 1 smoothed hinge, 2 squared, 3 logistic)")
    return 0


cdef RowView make_view(const double[::1] data, const int[::1] indices,
                       const int64_t[::1] indptr, bint dense, int n_features):
    """The row interface over checked arrays (see ``check_rows``)."""
    cdef RowView rows
    rows.data = cptr(data)
    rows.indices = &indices[0] if indices.shape[0] > 0 else NO_INTS
    rows.indptr = &indptr[0] if indptr.shape[0] > 0 else NO_OFFSETS
    rows.dense = dense
    rows.n_features = n_features
    return rows


# ---------------------------------------------------------------------------
# Random numbers: splitmix64, seeded once from Python per (seed, task, round)
# ---------------------------------------------------------------------------
cdef inline uint64_t splitmix64(uint64_t* state) noexcept nogil:
    cdef uint64_t z
    state[0] += <uint64_t>0x9E3779B97F4A7C15ULL
    z = state[0]
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline Py_ssize_t bounded_rand(uint64_t* state, Py_ssize_t n) noexcept nogil:
    # uniform integer in [0, n): top 53 bits scaled (bias < 2^-53 n)
    return <Py_ssize_t>((splitmix64(state) >> 11) * (1.0 / 9007199254740992.0) * n)


cdef void shuffle(int* perm, Py_ssize_t n, uint64_t* state) noexcept nogil:
    # perm = rng.permutation(n) (Fisher-Yates)
    cdef Py_ssize_t i, j
    cdef int t
    for i in range(n):
        perm[i] = <int>i
    for i in range(n - 1, 0, -1):
        j = bounded_rand(state, i + 1)
        t = perm[i]
        perm[i] = perm[j]
        perm[j] = t


# ---------------------------------------------------------------------------
# Losses: primal value, conjugate l*(-alpha), and the coordinate maximizer
# ---------------------------------------------------------------------------
cdef inline double primal_loss(int loss, double z, double y, double gamma) noexcept nogil:
    cdef double m, t
    if loss == HINGE:
        m = 1.0 - y * z
        return m if m > 0.0 else 0.0
    elif loss == SMOOTHED_HINGE:
        m = 1.0 - y * z
        if m <= 0.0:
            return 0.0
        if m >= gamma:
            return m - 0.5 * gamma
        return 0.5 * m * m / gamma
    elif loss == SQUARED:
        t = z - y
        return 0.5 * t * t
    else:  # LOGISTIC: log(1 + exp(-y z)), stable
        t = -y * z
        if t > 0.0:
            return t + log1p(exp(-t))
        return log1p(exp(t))


cdef inline double xlogx(double b) noexcept nogil:
    return b * log(b) if b > 0.0 else 0.0


cdef inline double conjugate_neg(int loss, double a, double y, double gamma) noexcept nogil:
    """l*(-a) for a dual variable a with label y (a feasible: y a in [0, 1])."""
    cdef double b
    if loss == HINGE:
        return -y * a
    elif loss == SMOOTHED_HINGE:
        return -y * a + 0.5 * gamma * a * a
    elif loss == SQUARED:
        return 0.5 * a * a - a * y
    else:  # LOGISTIC
        b = y * a
        if b < 0.0:
            b = 0.0
        elif b > 1.0:
            b = 1.0
        return xlogx(b) + xlogx(1.0 - b)


cdef inline double clip01(double b) noexcept nogil:
    if b < 0.0:
        return 0.0
    if b > 1.0:
        return 1.0
    return b


cdef inline double sigmoid(double u) noexcept nogil:
    # 1 / (1 + exp(-u)), without overflow
    cdef double e
    if u >= 0.0:
        return 1.0 / (1.0 + exp(-u))
    e = exp(u)
    return e / (1.0 + e)


cdef inline double logit(double t) noexcept nogil:
    return log(t) - log1p(-t)


cdef inline double logistic_root(double z, double q, double b) noexcept nogil:
    """Root in (0, 1) of g(t) = log((1 - t) / t) - z - q (t - b).

    g is decreasing; the root lies between b and s = sigmoid(-z) (g(s) has the
    sign of b - s).  It is found for u = log(t / (1 - t)), where
    G(u) = -u - z - q (sigmoid(u) - b) has G' <= -1 whatever q is: safeguarded
    Newton (Numerical Recipes' rtsafe: bisect whenever the Newton step leaves the
    bracket or does not halve it) inside the bracket, whose ends are kept in
    [1e-300, 1 - 1e-16] (u in [-690.8, 36.7]), so a root near 0 at a huge q
    (1e-198 at q = 1e200) costs a few bisections in u instead of hundreds in t.
    A bracket wholly below 1e-300 (or above 1 - 1e-16) returns its inner end.
    """
    cdef double s, lo, hi, u, un, t, G, Gp, dx, dxold
    cdef int it
    s = sigmoid(-z)
    if q <= 0.0:
        return s
    lo = b if b < s else s
    hi = s if b < s else b
    if hi < 1e-300:                  # the whole bracket below the floor (s underflowed, b = 0): stay
        return hi
    if lo > 1.0 - 1e-16:
        return lo
    lo = logit(lo) if lo > 1e-300 else logit(1e-300)
    hi = logit(hi) if hi < 1.0 - 1e-16 else logit(1.0 - 1e-16)
    u = -z
    if not (u >= lo and u <= hi):
        u = 0.5 * (lo + hi)
    dxold = hi - lo
    dx = dxold
    for it in range(100):
        t = sigmoid(u)
        G = -u - z - q * (t - b)
        if G > 0.0:
            lo = u
        elif G < 0.0:
            hi = u
        else:
            return t
        Gp = -1.0 - q * t * (1.0 - t)
        un = u - G / Gp
        if not (un > lo and un < hi) or fabs(2.0 * G) > fabs(dxold * Gp):
            dxold = dx
            dx = 0.5 * (hi - lo)
            un = lo + dx
        else:
            dxold = dx
            dx = un - u
        # |du| bounds the relative change of t and of 1 - t
        if fabs(dx) <= 4e-16 * (1.0 + fabs(un)) or hi - lo <= 4e-16 * (1.0 + fabs(hi)):
            return sigmoid(un)
        u = un
    return sigmoid(u)


cdef inline double coordinate_delta(int loss, double y, double a, double ux,
                                    double q, double gamma) noexcept nogil:
    """argmax_delta  -l*(-(a + delta)) - delta * ux - (q / 2) delta^2."""
    cdef double b, margin, bn
    if loss == SQUARED:
        return (y - ux - a) / (1.0 + q)
    b = y * a
    margin = 1.0 - y * ux
    if loss == HINGE:
        if q > 0.0:
            bn = clip01(b + margin / q)
        elif margin > 0.0:
            bn = 1.0
        elif margin < 0.0:
            bn = 0.0
        else:
            bn = b
    elif loss == SMOOTHED_HINGE:
        bn = clip01((q * b + margin) / (gamma + q))
    else:  # LOGISTIC
        bn = logistic_root(y * ux, q, b)
    return y * bn - a


# ---------------------------------------------------------------------------
# Public kernels
# ---------------------------------------------------------------------------
def coordinate_step(int loss, double y, double a, double ux, double q, double gamma=1.0):
    """One coordinate maximizer (exposed so tests compare it with NumPy)."""
    return coordinate_delta(loss, y, a, ux, q, gamma)


cdef struct Shrink:
    Py_ssize_t n_active
    double pg_max_old, pg_min_old, eps   # thresholds from the last pass; unshrink tolerance
    double pg_max, pg_min                # extremes of the projected gradient in this pass


cdef inline void end_of_pass(Shrink* s, Py_ssize_t n) noexcept nogil:
    """liblinear's bookkeeping after a pass over the active set.

    An exhausted active set (every coordinate shrunk, so the pass took no step
    and PG_max - PG_min = -inf) restarts with the full set and no thresholds,
    as in liblinear's solve_l2r_l1l2_svc: ``n_active`` never drops below 0, and
    the next pass visits every coordinate.
    """
    if s.n_active <= 0 or s.pg_max - s.pg_min <= s.eps:
        if s.n_active == n and s.eps > 1e-12:
            s.eps *= 0.1                 # the full set met eps: tighten
        s.n_active = n                   # unshrink
        s.pg_max_old = INFINITY
        s.pg_min_old = -INFINITY
    else:
        s.pg_max_old = s.pg_max if s.pg_max > 0.0 else INFINITY
        s.pg_min_old = s.pg_min if s.pg_min < 0.0 else -INFINITY
    s.pg_max = -INFINITY
    s.pg_min = INFINITY


cdef inline double box_gradient(int loss, double y, double b, double ux, double gamma) noexcept nogil:
    """liblinear's G: minus the derivative of the local objective in b = y alpha, at delta = 0."""
    if loss == SMOOTHED_HINGE:
        return y * ux - 1.0 + gamma * b
    return y * ux - 1.0


def sdca_local(const double[::1] data, const int[::1] indices,
               const int64_t[::1] indptr, bint dense, int n_features,
               const double[::1] y, double[::1] alpha,
               const double[::1] w, double[::1] delta_b,
               const double[::1] sq_norms, int[::1] order, double[::1] shrink_state,
               int loss, double gamma, double rho_sigma_over_lam,
               double n_task, double local_iters, uint64_t seed):
    """Local SDCA (paper 001, Algorithm 2) on one task block, in place.

    Parameters
    ----------
    data, indices, indptr, dense, n_features : the block's rows (row interface)
    y : labels of the block's rows
    alpha : dual variables of the block, updated in place
    w : the task's current weight vector w_i (fixed during the call)
    delta_b : output, ``(1/n_i) sum_j (alpha_new - alpha_old)_j x_j`` (zeroed here)
    sq_norms : ``||x_j||^2`` per row
    order : the block's coordinates; its first ``n_active`` entries are the
        active set.  Kept by the caller between rounds (shrinking state).
    shrink_state : ``[enabled, n_active, PG_max_old, PG_min_old, eps]`` kept
        between rounds (see :func:`new_shrink_state`); ``enabled = 0``: every
        pass is a fresh permutation of all ``0..n-1``.
    rho_sigma_over_lam : ``rho sigma_ii / lam``
    n_task : n_i, the size of the whole task (a split block keeps its task's n_i)
    local_iters : H as a multiple of the active coordinates (1 = one pass)
    seed : 64-bit seed of this block's stream for this round

    Shrinking (hinge and smoothed hinge, liblinear's rule; ignored for the
    other losses): a coordinate at a bound whose gradient points out of the box
    by more than the previous pass's extreme projected gradient leaves the
    active set; when the projected gradients on the active set span at most
    ``eps``, or when every coordinate has left it, every coordinate returns (and
    ``eps`` shrinks tenfold once the full set has reached it).  Shrinking only
    chooses which coordinates are visited: the duality gap is always computed
    over all of them.

    Returns the number of coordinate steps taken (``max(1, round(local_iters *
    n_active))`` for a non-empty block).  Raises ValueError on inconsistent
    shapes, rows, ``order`` entries outside ``0..n-1`` (with shrinking), an
    unknown loss id, or a non-positive ``rho_sigma_over_lam`` / ``n_task``.
    """
    cdef Py_ssize_t n = y.shape[0]
    cdef int d = n_features
    cdef RowView rows
    cdef uint64_t state = seed
    cdef Py_ssize_t step = 0, pos, j, n_steps, i
    cdef int k, nnz, tmp
    cdef const double* vals
    cdef const double* wp
    cdef const int* idx
    cdef double ux, q, delta, c_u, c_b, b, G, PG, v
    cdef double inv_n
    cdef double* u
    cdef bint shrinking, in_pass = False
    cdef Shrink sh
    check_rows(data, indices, indptr, dense, n_features, 0, n)
    check_length("alpha", alpha.shape[0], n)
    check_length("sq_norms", sq_norms.shape[0], n)
    check_length("order", order.shape[0], n)
    check_length("w", w.shape[0], d)
    check_length("delta_b", delta_b.shape[0], d)
    check_length("shrink_state", shrink_state.shape[0], 5)
    check_loss(loss)
    if not (rho_sigma_over_lam > 0.0 and rho_sigma_over_lam < INFINITY):
        raise ValueError(f"rho sigma / lam must be finite and > 0. Got {rho_sigma_over_lam!r} instead.")
    if not (n_task > 0.0 and n_task < INFINITY):
        raise ValueError(f"n_task must be finite and > 0. Got {n_task!r} instead.")
    if not (local_iters >= 0.0 and local_iters * n < 1e18):
        raise ValueError(f"local_iters must be >= 0 and local_iters * n < 1e18. Got {local_iters!r} instead.")
    # shrinking is liblinear's rule for the box-constrained (hinge) duals only
    shrinking = shrink_state[0] != 0.0 and (loss == HINGE or loss == SMOOTHED_HINGE)
    sh.n_active = n
    sh.pg_max_old = INFINITY
    sh.pg_min_old = -INFINITY
    sh.eps = 0.1
    if shrinking:
        v = shrink_state[1]
        if v >= 1.0 and v <= <double>n:          # (a NaN or out-of-range count: everything active)
            sh.n_active = <Py_ssize_t>v
        sh.pg_max_old = shrink_state[2]
        sh.pg_min_old = shrink_state[3]
        if shrink_state[4] >= 0.0 and shrink_state[4] < INFINITY:
            sh.eps = shrink_state[4]
        for i in range(n):                       # the kept order indexes y, alpha and the rows
            if order[i] < 0 or order[i] >= n:
                raise ValueError(f"order[{i}] = {order[i]} is not a coordinate of this block (0..{n - 1})")
    sh.pg_max = -INFINITY
    sh.pg_min = INFINITY
    if n == 0:
        delta_b[:] = 0.0
        return 0
    rows = make_view(data, indices, indptr, dense, n_features)
    wp = cptr(w)
    inv_n = 1.0 / n_task
    n_steps = <Py_ssize_t>(local_iters * sh.n_active + 0.5)
    if n_steps < 1:
        n_steps = 1
    u = <double*>malloc(max(d, 1) * sizeof(double))
    if u == NULL:
        raise MemoryError("local SDCA workspace")
    with nogil:
        for k in range(d):
            u[k] = wp[k]          # u = w + (rho sigma / lam) delta_b
        # Each iteration either takes a step or shrinks one coordinate (n_active
        # >= pos + 1 before it, so >= 0 after); a pass that shrank every coordinate
        # ends with n_active = 0 and the next one restarts with all n and no
        # thresholds, so it steps: the loop ends after n_steps steps.
        pos = sh.n_active
        while step < n_steps:
            if pos >= sh.n_active:
                if shrinking:
                    if in_pass:
                        end_of_pass(&sh, n)
                    in_pass = True
                    # order[:n_active] = rng.permutation(order[:n_active])
                    for i in range(sh.n_active - 1, 0, -1):
                        j = bounded_rand(&state, i + 1)
                        tmp = order[i]
                        order[i] = order[j]
                        order[j] = tmp
                else:
                    shuffle(&order[0], n, &state)
                pos = 0
            j = order[pos]
            nnz = get_row(&rows, j, &vals, &idx)
            ux = sparse_dot(vals, idx, nnz, u)
            if shrinking:
                b = y[j] * alpha[j]
                G = box_gradient(loss, y[j], b, ux, gamma)
                PG = 0.0
                if b <= 0.0:
                    if G > sh.pg_max_old:
                        sh.n_active -= 1                  # shrink: swap with the last active
                        order[pos] = order[sh.n_active]
                        order[sh.n_active] = <int>j
                        continue
                    if G < 0.0:
                        PG = G
                elif b >= 1.0:
                    if G < sh.pg_min_old:
                        sh.n_active -= 1
                        order[pos] = order[sh.n_active]
                        order[sh.n_active] = <int>j
                        continue
                    if G > 0.0:
                        PG = G
                else:
                    PG = G
                if PG > sh.pg_max:
                    sh.pg_max = PG
                if PG < sh.pg_min:
                    sh.pg_min = PG
            pos += 1
            step += 1
            q = rho_sigma_over_lam * sq_norms[j] * inv_n
            delta = coordinate_delta(loss, y[j], alpha[j], ux, q, gamma)
            if delta == 0.0:
                continue
            alpha[j] += delta
            c_u = rho_sigma_over_lam * delta * inv_n
            for k in range(nnz):
                u[idx[k]] += c_u * vals[k]           # u += (rho sigma / lam) delta x_j / n_i
        # delta_b = (u - w) lam / (rho sigma): one axpy per step instead of two; the
        # rounding error is about eps |b_i| per round whatever rho sigma / lam is
        c_b = 1.0 / rho_sigma_over_lam
        for k in range(d):
            delta_b[k] = (u[k] - wp[k]) * c_b
        if shrinking:
            if pos >= sh.n_active:
                end_of_pass(&sh, n)                  # the round ended on a pass boundary
            elif sh.pg_max >= sh.pg_min:             # mid-pass: keep what this partial pass saw
                sh.pg_max_old = sh.pg_max if sh.pg_max > 0.0 else INFINITY
                sh.pg_min_old = sh.pg_min if sh.pg_min < 0.0 else -INFINITY
            shrink_state[1] = sh.n_active
            shrink_state[2] = sh.pg_max_old
            shrink_state[3] = sh.pg_min_old
            shrink_state[4] = sh.eps
    free(u)
    return step


def new_shrink_state(Py_ssize_t n, bint enabled):
    """Initial shrinking state of a block: everything active, no thresholds yet, eps = 0.1."""
    return np.array([1.0 if enabled else 0.0, n, np.inf, -np.inf, 0.1])


def objective_terms(const double[::1] data, const int[::1] indices,
                    const int64_t[::1] indptr, bint dense, int n_features,
                    const double[::1] y, const double[::1] alpha,
                    const double[::1] w, int loss, double gamma):
    """Return ``(sum_j l(w.x_j, y_j), sum_j l*(-alpha_j))`` over a block."""
    cdef Py_ssize_t n = y.shape[0], j
    cdef RowView rows
    cdef const double* vals
    cdef const int* idx
    cdef const double* wp
    cdef int nnz
    cdef double loss_sum = 0.0, conj_sum = 0.0
    check_rows(data, indices, indptr, dense, n_features, 0, n)
    check_length("alpha", alpha.shape[0], n)
    check_length("w", w.shape[0], n_features)
    check_loss(loss)
    rows = make_view(data, indices, indptr, dense, n_features)
    wp = cptr(w)
    with nogil:
        for j in range(n):
            nnz = get_row(&rows, j, &vals, &idx)
            loss_sum += primal_loss(loss, sparse_dot(vals, idx, nnz, wp), y[j], gamma)
            conj_sum += conjugate_neg(loss, alpha[j], y[j], gamma)
    return loss_sum, conj_sum


def ssdca_epoch(const double[::1] data, const int[::1] indices,
                const int64_t[::1] indptr, bint dense, int n_features,
                const double[::1] y, double[::1] alpha,
                const int[::1] task_of_row, const double[::1] n_of_task,
                double[:, ::1] WT, double[:, ::1] BT, const double[:, ::1] Sigma,
                const double[::1] sq_norms, int[::1] perm,
                int loss, double gamma, double lam, Py_ssize_t n_steps, uint64_t seed):
    """Single-machine SDCA over all coordinates of all tasks with exact W.

    ``WT`` (m x d) is W transposed and ``BT`` (m x d) is B transposed; after
    each step on row j of task i, ``B[:, i] += delta x_j / n_i`` and
    ``W += outer(delta x_j / n_i, Sigma[i]) / lam`` keep ``W = B Sigma / lam``.
    """
    cdef Py_ssize_t n = y.shape[0], m = WT.shape[0], d = n_features
    cdef RowView rows
    cdef uint64_t state = seed
    cdef Py_ssize_t step = 0, pos, j, t
    cdef int k, nnz, i, bad = -1
    cdef const double* vals
    cdef const int* idx
    cdef const double* WTp
    cdef double ux, q, delta, c_b, c_w
    check_rows(data, indices, indptr, dense, n_features, 0, n)
    check_length("alpha", alpha.shape[0], n)
    check_length("task_of_row", task_of_row.shape[0], n)
    check_length("sq_norms", sq_norms.shape[0], n)
    check_length("perm", perm.shape[0], n)
    check_length("n_of_task", n_of_task.shape[0], m)
    check_shape("WT", WT, m, d)
    check_shape("BT", BT, m, d)
    check_shape("Sigma", Sigma, m, m)
    check_loss(loss)
    with nogil:
        for t in range(n):
            if task_of_row[t] < 0 or task_of_row[t] >= m:
                bad = <int>t
                break
    if bad >= 0:
        raise ValueError(f"task_of_row[{bad}] = {task_of_row[bad]} is not a task (0..{m - 1})")
    if n == 0 or n_steps <= 0:
        return 0
    rows = make_view(data, indices, indptr, dense, n_features)
    WTp = mptr2(WT)
    with nogil:
        pos = n
        while step < n_steps:
            if pos == n:
                shuffle(&perm[0], n, &state)
                pos = 0
            j = perm[pos]
            pos += 1
            step += 1
            i = task_of_row[j]
            nnz = get_row(&rows, j, &vals, &idx)
            ux = sparse_dot(vals, idx, nnz, WTp + i * d)      # WT[i] . x_j
            q = Sigma[i, i] * sq_norms[j] / (lam * n_of_task[i])
            delta = coordinate_delta(loss, y[j], alpha[j], ux, q, gamma)
            if delta == 0.0:
                continue
            alpha[j] += delta
            c_b = delta / n_of_task[i]
            for k in range(nnz):
                BT[i, idx[k]] += c_b * vals[k]
            for t in range(m):
                c_w = c_b * Sigma[i, t] / lam
                if c_w != 0.0:
                    for k in range(nnz):
                        WT[t, idx[k]] += c_w * vals[k]
    return step


def row_sq_norms(const double[::1] data, const int[::1] indices,
                 const int64_t[::1] indptr, bint dense, int n_features, Py_ssize_t n_rows):
    """``||x_j||^2`` for every row of a block."""
    check_rows(data, indices, indptr, dense, n_features, 0, n_rows)
    cdef RowView rows = make_view(data, indices, indptr, dense, n_features)
    out = np.empty(n_rows, dtype=np.float64)
    cdef double[::1] o = out
    cdef Py_ssize_t j
    cdef int k, nnz
    cdef const double* vals
    cdef const int* idx
    cdef double s
    with nogil:
        for j in range(n_rows):
            nnz = get_row(&rows, j, &vals, &idx)
            s = 0.0
            for k in range(nnz):
                s += vals[k] * vals[k]
            o[j] = s
    return out


# ---------------------------------------------------------------------------
# Projections (paper 002, Sec. 4; Duchi et al. 2008)
# ---------------------------------------------------------------------------
cdef struct RowCap:
    Py_ssize_t k     # the piece: r_{i,k} <= theta < r_{i,k+1} (k = m + 1: the row is removed)
    double csum      # s_{i,1} + ... + s_{i,k-1}
    double rk        # r_{i,k} = csum - (k - 1) s_{i,k}


cdef double reduction(const double[:, ::1] S, double theta, RowCap* rows, double* slope) noexcept nogil:
    """sum_i F_i(theta) (the l1,inf norm removed at removed mass theta) and its slope.

    Row i of S is |W_i| sorted increasingly, so s_{i,k} = S[i, m-k] is its k-th
    largest entry.  The breakpoints r_{i,k} = sum_{j<k} s_{i,j} - (k-1) s_{i,k} are
    the removed masses at which the k-th largest entry becomes the cap.  For
    theta in [r_{i,k}, r_{i,k+1}) the cap is mu_i = s_{i,k} - (theta - r_{i,k}) / k,
    F_i(theta) = s_{i,1} - mu_i and the slope is 1/k; past r_{i,m+1} (the row's
    sum) the row is removed.  theta only grows during the search, so each row's
    piece only moves forward and the breakpoints are generated as it does
    (O(d) memory, amortized O(m) work per row over the whole search).
    """
    cdef Py_ssize_t d = S.shape[0], m = S.shape[1], i
    cdef double total = 0.0, g = 0.0, s_k, s_next, r_next
    cdef RowCap* c
    for i in range(d):
        c = &rows[i]
        while c.k <= m:
            s_k = S[i, m - c.k]
            s_next = S[i, m - c.k - 1] if c.k < m else 0.0
            r_next = c.csum + s_k - c.k * s_next      # r_{i,k+1}
            if r_next > theta:
                break
            c.csum += s_k
            c.k += 1
            c.rk = r_next
        if c.k > m:
            total += S[i, m - 1]                      # the whole row removed: mu_i = 0
        else:
            total += S[i, m - 1] - (S[i, m - c.k] - (theta - c.rk) / c.k)
            g += 1.0 / c.k
    slope[0] = g
    return total


def l1inf_caps(const double[:, ::1] S, double delta, int max_newton=200):
    """Caps mu_i and the removed mass theta of the l1,inf projection (paper 002, Eq. 11-13).

    ``S`` holds the rows of |W| sorted increasingly (d x m); ``delta =
    ||W||_{1,inf} - C > 0``.  Returns ``(theta, mu, newton_steps)``.

    sum_i F_i is concave, increasing and piecewise linear, so Newton's method from
    theta = 0 increases monotonically without overshooting and stops exactly on
    the last linear piece.  Should it need more than ``max_newton`` steps, the
    merge walk of the paper's Fig. 1 over all breakpoints finds theta instead.
    """
    cdef Py_ssize_t d = S.shape[0], m = S.shape[1], i, steps = 0
    cdef double theta = 0.0, value, slope, new_theta
    cdef RowCap* rows
    if m == 0:                                        # rows of no entries: nothing to remove
        return 0.0, np.zeros(d), 0
    rows = <RowCap*>malloc(max(d, 1) * sizeof(RowCap))
    if rows == NULL:
        raise MemoryError("l1,inf projection workspace")
    out = np.empty(d, dtype=np.float64)
    cdef double[::1] mu = out
    with nogil:
        for i in range(d):
            rows[i].k = 1
            rows[i].csum = 0.0
            rows[i].rk = 0.0
        while steps < max_newton:
            value = reduction(S, theta, rows, &slope)
            steps += 1
            if value >= delta or slope <= 0.0:
                break
            new_theta = theta + (delta - value) / slope
            if not (new_theta > theta):
                break
            theta = new_theta
    if steps >= max_newton:
        theta = _merge_theta(np.asarray(S), delta)
        for i in range(d):
            rows[i].k = 1
            rows[i].csum = 0.0
            rows[i].rk = 0.0
    with nogil:
        reduction(S, theta, rows, &slope)             # every row on theta's piece
        for i in range(d):
            if rows[i].k > m:
                mu[i] = 0.0
            else:
                mu[i] = S[i, m - rows[i].k] - (theta - rows[i].rk) / rows[i].k
                if mu[i] < 0.0:
                    mu[i] = 0.0
    free(rows)
    return theta, out, steps


def _merge_theta(S, double delta):
    """The paper's Fig. 1: walk all breakpoints in increasing order (fallback, O(dm log dm))."""
    d, m = S.shape
    desc = S[:, ::-1]
    k = np.arange(1, m + 1)
    nxt = np.concatenate([desc[:, 1:], np.zeros((d, 1))], axis=1)
    R = np.cumsum(desc, axis=1) - k * nxt            # R[:, c] = r_{i,c+2}
    order = np.argsort(R, axis=None, kind="stable")
    rows, ks = np.unravel_index(order, (d, m))
    values = R.ravel()[order]
    g = np.ones(d)                  # slope 1/k of every row, k = 1 at theta = 0+
    cdef double n_prev = 0.0, r_prev = 0.0, total_slope = float(g.sum()), n_now
    cdef Py_ssize_t t
    for t in range(values.shape[0]):
        n_now = n_prev + total_slope * (values[t] - r_prev)
        if n_now >= delta:
            return r_prev + (delta - n_prev) / total_slope
        n_prev, r_prev = n_now, values[t]
        kk = ks[t] + 2              # passing r_{i,kk}: the row's slope becomes 1/kk (0 past the end)
        total_slope -= g[rows[t]]
        g[rows[t]] = 1.0 / kk if kk <= m else 0.0
        total_slope += g[rows[t]]
    return r_prev + (delta - n_prev) / total_slope if total_slope > 0 else r_prev


def project_l1_inplace(double[::1] v, double radius, uint64_t seed):
    """Euclidean projection of |v| onto the l1 ball (Duchi et al. 2008, Fig. 2), in place.

    ``v`` must be non-negative; returns theta (the soft threshold).  Expected
    linear time: a random pivot splits the candidate set as in quickselect.
    """
    cdef Py_ssize_t n = v.shape[0], lo = 0, hi = n, i, j, pivot_pos
    cdef double s = 0.0, ds, pivot, rho_total = 0.0, theta
    cdef double* work
    cdef uint64_t state = seed
    cdef double total = 0.0, top = 0.0
    if not (radius >= 0.0):
        raise ValueError(f"the l1 radius must be >= 0. Got {radius!r} instead.")
    for i in range(n):
        if not (v[i] >= 0.0 and v[i] < INFINITY):
            raise ValueError(f"v[{i}] = {v[i]!r}: the l1 projection kernel takes finite entries >= 0")
        total += v[i]
        if v[i] > top:
            top = v[i]
    if total <= radius:
        return 0.0
    if radius == 0.0:                                 # the ball is the origin: threshold at the largest
        for i in range(n):
            v[i] = 0.0
        return top
    work = <double*>malloc(max(n, 1) * sizeof(double))
    if work == NULL:
        raise MemoryError("l1 projection workspace")
    with nogil:
        for i in range(n):
            work[i] = v[i]
        # candidates work[lo:hi]; (rho_total, s) = count and sum of entries known to be above theta
        while lo < hi:
            pivot_pos = lo + bounded_rand(&state, hi - lo)
            pivot = work[pivot_pos]
            # partition: entries >= pivot to the front of [lo, hi)
            j = lo
            ds = 0.0
            for i in range(lo, hi):
                if work[i] >= pivot:
                    work[i], work[j] = work[j], work[i]
                    ds += work[j]
                    j += 1
            if (s + ds) - (rho_total + (j - lo)) * pivot < radius:
                s += ds
                rho_total += j - lo
                lo = j                       # theta is below pivot: look among the smaller entries
            else:
                # the pivot itself is in the set; drop it and look among the larger ones
                hi = j
                for i in range(lo, hi):
                    if work[i] == pivot:
                        work[i], work[hi - 1] = work[hi - 1], work[i]
                        break
                hi -= 1
        theta = (s - radius) / rho_total
        for i in range(n):
            v[i] = v[i] - theta if v[i] > theta else 0.0
    free(work)
    return theta


# ---------------------------------------------------------------------------
# Online multitask learning with a shared loss (paper 004)
# ---------------------------------------------------------------------------
# Every rule sets w_j <- w_j + tau_j y_j x_j; they differ in tau (Fig. 1).
# update ids: 0 finite-horizon Perceptron (Eq. 9), 1 infinite horizon (Eq. 16),
#             2 implicit (Eq. 23 / Lemma 8).
# norm ids:   0 p-norm with 1 < p < inf (p = 1 and p = inf arrive as r-max, r = k / r = 1),
#             1 r-max norm (Eq. 1; its dual is max(||u||_inf, ||u||_1 / r), Eq. 3).
from libc.stdlib cimport qsort
from libc.math cimport pow as cpow

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define HPCMTL_PREFETCH(p) __builtin_prefetch((p), 1, 3)
    #else
    #define HPCMTL_PREFETCH(p) ((void)0)
    #endif
    """
    void HPCMTL_PREFETCH(const void* p) noexcept nogil


cdef inline void prefetch_rows(const RowView* rows, Py_ssize_t t, const double* W, Py_ssize_t k) noexcept nogil:
    """Ask for the W rows of round t's instance while this round's tau is being solved (a hint only)."""
    cdef const double* vals
    cdef const int* idx
    cdef int nnz = get_row(rows, t, &vals, &idx), a
    cdef Py_ssize_t off
    for a in range(nnz):
        off = 0
        while off < k:
            HPCMTL_PREFETCH(W + <Py_ssize_t>idx[a] * k + off)
            off += 8

cdef enum UpdateId:
    PERCEPTRON = 0
    INFINITE_HORIZON = 1
    IMPLICIT = 2

cdef enum NormId:
    PNORM = 0
    RMAX = 1

cdef struct TauParams:
    int update
    int norm
    double p
    Py_ssize_t r
    double C
    double R2          # R^2 (infinite horizon)
    double rho2        # squared remoteness of the dual norm (Lemmas 2, 3)

cdef struct Event:
    double q           # breakpoint (or -loss when ranking losses)
    int kind           # 0: tau_j leaves C, 1: tau_j reaches 0, 2: a zero instance's tau jumps C -> 0
    int j


cdef int event_cmp(const void* a, const void* b) noexcept nogil:
    cdef const Event* x = <const Event*>a
    cdef const Event* y = <const Event*>b
    if x.q < y.q:
        return -1
    if x.q > y.q:
        return 1
    if x.kind != y.kind:
        return -1 if x.kind < y.kind else 1
    return -1 if x.j < y.j else (1 if x.j > y.j else 0)


cdef double kth_largest(Event* ev, Py_ssize_t n, Py_ssize_t kth) noexcept nogil:
    """The kth largest (1-based) of ev[0:n].q, by quickselect (expected O(n); reorders ev)."""
    cdef Py_ssize_t lo = 0, hi = n - 1, i, j, want = kth - 1
    cdef double pivot
    cdef Event tmp
    while lo < hi:
        pivot = ev[lo + (hi - lo) // 2].q
        i = lo
        j = hi
        while i <= j:
            while ev[i].q > pivot:
                i += 1
            while ev[j].q < pivot:
                j -= 1
            if i <= j:
                tmp = ev[i]; ev[i] = ev[j]; ev[j] = tmp
                i += 1
                j -= 1
        if want <= j:
            hi = j
        elif want >= i:
            lo = i
        else:
            break
    return ev[want].q


cdef double global_norm(const TauParams* P, const double* loss, Py_ssize_t k, Event* ev) noexcept nogil:
    """||loss|| under the global norm (losses are >= 0)."""
    cdef Py_ssize_t j, n = 0, above = 0
    cdef double m = 0.0, s = 0.0, v
    if P.norm == RMAX:
        # sum of the r largest: the r-th largest v by selection, then sum(l > v) + (r - #(l > v)) v
        for j in range(k):
            if loss[j] > 0.0:
                ev[n].q = loss[j]
                n += 1
                s += loss[j]
                if loss[j] > m:
                    m = loss[j]
        if P.r == 1 or n == 0:
            return m
        if n <= P.r:
            return s
        v = kth_largest(ev, n, P.r)
        s = 0.0
        for j in range(k):
            if loss[j] > v:
                s += loss[j]
                above += 1
        return s + (P.r - above) * v
    for j in range(k):
        if loss[j] > m:
            m = loss[j]
    if m == 0.0:
        return 0.0
    for j in range(k):
        if loss[j] > 0.0:
            s += cpow(loss[j] / m, P.p)       # scaled: no overflow for large p
    return m * cpow(s, 1.0 / P.p)


cdef Py_ssize_t top_losses(const double* loss, Py_ssize_t k, Event* ev) noexcept nogil:
    """The positive losses in decreasing order (ties: lower task index first); returns their count."""
    cdef Py_ssize_t j, n = 0
    for j in range(k):
        if loss[j] > 0.0:
            ev[n].q = -loss[j]
            ev[n].kind = 0
            ev[n].j = <int>j
            n += 1
    qsort(ev, n, sizeof(Event), event_cmp)
    return n


cdef void tau_explicit(const TauParams* P, const double* loss, Py_ssize_t k, double* tau,
                       Event* ev) noexcept nogil:
    """Eq. 9 (finite horizon) and Eq. 16 (infinite horizon): c * argmax of tau.loss on the unit dual ball."""
    cdef Py_ssize_t j, n
    cdef double norm, c
    for j in range(k):
        tau[j] = 0.0
    norm = global_norm(P, loss, k, ev)
    if norm == 0.0:
        return
    c = P.C
    if P.update == INFINITE_HORIZON and norm / (P.R2 * P.rho2) < c:
        c = norm / (P.R2 * P.rho2)
    if P.norm == RMAX and P.r == 1:              # Eq. 12 with r = 1: the first largest loss
        n = 0
        for j in range(k):
            if loss[j] > loss[n]:
                n = j
        tau[n] = c
        return
    if P.norm == RMAX:                           # Eq. 12: c on the r largest positive losses
        n = top_losses(loss, k, ev)
        for j in range(min(n, P.r)):
            tau[ev[j].j] = c
        return
    for j in range(k):                           # Eq. 11: c (l_j / ||l||_p)^(p - 1)
        if loss[j] > 0.0:
            tau[j] = c * cpow(loss[j] / norm, P.p - 1.0)


cdef void tau_implicit_l2(const TauParams* P, const double* loss, const double* sq, Py_ssize_t k,
                          double* tau) noexcept nogil:
    """Sec. 6: tau_j = l_j / (||x_j||^2 + theta), theta >= 0 the root of sum tau_j^2 = C^2 (Eq. 27)."""
    cdef Py_ssize_t j, it
    cdef double s = 0.0, theta = 0.0, phi, dphi, t, nxt, C2 = P.C * P.C
    cdef bint binding = False
    for j in range(k):
        tau[j] = 0.0
        if loss[j] > 0.0:
            if sq[j] <= 0.0:
                binding = True
            else:
                s += (loss[j] / sq[j]) * (loss[j] / sq[j])
            t = loss[j] / P.C - sq[j]            # theta* >= l_j / C - ||x_j||^2: each tau_j <= C
            if t > theta:
                theta = t
    if not binding and s <= C2:
        for j in range(k):
            if loss[j] > 0.0:
                tau[j] = loss[j] / sq[j]
        return
    # Newton on the convex decreasing phi(theta) = sum (l_j / (s_j + theta))^2 - C^2 from a point
    # left of the root: the iterates increase monotonically to the root
    for it in range(200):
        phi = -C2
        dphi = 0.0
        for j in range(k):
            if loss[j] > 0.0:
                t = loss[j] / (sq[j] + theta)
                phi += t * t
                dphi -= 2.0 * t * t / (sq[j] + theta)
        if phi <= 0.0 or dphi == 0.0:
            break
        nxt = theta - phi / dphi
        if not (nxt > theta):
            break
        theta = nxt
    s = 0.0
    for j in range(k):
        if loss[j] > 0.0:
            tau[j] = loss[j] / (sq[j] + theta)
            s += tau[j] * tau[j]
    if s > C2:                                   # rounding at the root: stay inside the ball
        t = P.C / sqrt(s)
        for j in range(k):
            tau[j] *= t


cdef inline bint event_above(const Event* a, const Event* b) noexcept nogil:
    return a.q > b.q or (a.q == b.q and (a.kind < b.kind or (a.kind == b.kind and a.j < b.j)))


cdef void sift_down(Event* h, Py_ssize_t n, Py_ssize_t i) noexcept nogil:
    """Max-heap (largest breakpoint on top) repair below position i."""
    cdef Py_ssize_t c
    cdef Event tmp
    while True:
        c = 2 * i + 1
        if c >= n:
            return
        if c + 1 < n and event_above(&h[c + 1], &h[c]):
            c += 1
        if not event_above(&h[c], &h[i]):
            return
        tmp = h[i]; h[i] = h[c]; h[c] = tmp
        i = c


cdef void tau_implicit_rmax(const TauParams* P, const double* loss, const double* sq, Py_ssize_t k,
                            double* tau, Event* ev) noexcept nogil:
    """Sec. 7: tau_j = clip((l_j - theta) / ||x_j||^2, 0, C) (Eq. 33), sum tau_j <= r C.

    theta = 0 when the clipped steps already fit the budget r C.  Otherwise sum tau_j(theta)
    is piecewise linear and non-increasing in theta, with breakpoints l_j - C ||x_j||^2 (tau_j
    leaves C) and l_j (tau_j reaches 0): on the interval holding theta* the sets Psi and Phi
    are fixed and Eq. 34 gives theta* exactly.  The paper walks the sorted breakpoints up from
    0; we walk them down from the largest with a heap (O(k) to build, O(log k) a step), so a
    small r C (L-inf) stops after the few largest losses: O(k log k) at worst.
    """
    cdef Py_ssize_t j, n = 0, n_jump
    cdef double budget = P.C * <double>P.r, total = 0.0, A = 0.0, S = 0.0, theta = 0.0, hi = INFINITY
    cdef double q, lo, share, g, floor, v
    cdef double top[9]
    cdef Py_ssize_t i
    cdef int jj, kind
    for j in range(k):
        tau[j] = 0.0
        if loss[j] > 0.0:
            total += min(loss[j] / sq[j], P.C) if sq[j] > 0.0 else P.C
    if total <= budget * (1.0 + 1e-12):          # theta = 0 (the sum of r values C may round above r C)
        for j in range(k):
            if loss[j] > 0.0:
                tau[j] = min(loss[j] / sq[j], P.C) if sq[j] > 0.0 else P.C
        return
    # At most r tasks sit at C, and every other j has theta* >= l_j - r C ||x_j||^2, so theta* is
    # at least the (r+1)-th largest of these: tasks with a loss below it stay at 0 (fewer events)
    # (a scan keeping the r + 1 largest, for r < 8; larger r skip this)
    floor = 0.0
    if P.r < 8:
        for j in range(P.r + 1):
            top[j] = -INFINITY
        for j in range(k):
            if loss[j] > 0.0:
                v = loss[j] - budget * sq[j]
                if v > top[P.r]:
                    i = P.r
                    while i > 0 and top[i - 1] < v:
                        top[i] = top[i - 1]
                        i -= 1
                    top[i] = v
        if top[P.r] > floor:
            floor = top[P.r]
    for j in range(k):
        if loss[j] <= 0.0 or loss[j] < floor:
            continue
        if sq[j] <= 0.0:
            ev[n].q = loss[j]; ev[n].kind = 2; ev[n].j = <int>j; n += 1
        else:
            ev[n].q = loss[j]; ev[n].kind = 1; ev[n].j = <int>j; n += 1
            ev[n].q = loss[j] - P.C * sq[j]; ev[n].kind = 0; ev[n].j = <int>j; n += 1
    j = n // 2
    while j > 0:
        j -= 1
        sift_down(ev, n, j)
    # g(theta) = A - theta S on [lo, hi) between consecutive breakpoints, from theta = inf down
    while True:
        q = ev[0].q if n > 0 else 0.0
        lo = q if q > 0.0 else 0.0
        if A - lo * S >= budget or n == 0:       # sum tau = r C is crossed in [lo, hi) (n == 0: it
            # must be, as sum tau(0) > r C; rounding in A can only hide it by an ulp)
            theta = (A - budget) / S if S > 0.0 else lo
            if theta < lo:
                theta = lo
            if theta > hi:
                theta = hi
            break
        # pass the breakpoint q: every event there (tau_j frees at l_j, caps at l_j - C s_j); the
        # top event always goes (n > 0 here), so even a NaN breakpoint cannot stall the walk
        n_jump = 0
        while True:
            jj = ev[0].j
            kind = ev[0].kind
            if kind == 1:
                A += loss[jj] / sq[jj]
                S += 1.0 / sq[jj]
            elif kind == 0:
                A += P.C - loss[jj] / sq[jj]
                S -= 1.0 / sq[jj]
            else:
                n_jump += 1
                A += P.C
            n -= 1
            ev[0] = ev[n]
            sift_down(ev, n, 0)
            if n == 0 or not (ev[0].q == q):
                break
        if n_jump > 0 and A - q * S >= budget:  # the zero instances at q jump past the budget:
            theta = q                            # theta* = q, and they share what is left
            break
        hi = q
    # Eq. 33 at theta; a zero instance is a step: C below theta, 0 above, and at theta = l_j
    # the zero instances share what the others leave of the (tight) budget
    n_jump = 0
    g = 0.0
    for j in range(k):
        if loss[j] <= 0.0:
            continue
        if sq[j] <= 0.0:
            if loss[j] > theta:
                tau[j] = P.C
            elif loss[j] == theta:
                n_jump += 1
        else:
            q = (loss[j] - theta) / sq[j]
            tau[j] = 0.0 if q <= 0.0 else (P.C if q >= P.C else q)
        g += tau[j]
    if n_jump > 0:
        share = (budget - g) / n_jump
        share = 0.0 if share < 0.0 else (P.C if share > P.C else share)
        for j in range(k):
            if loss[j] > 0.0 and sq[j] <= 0.0 and loss[j] == theta:
                tau[j] = share
        g += n_jump * share
    if g > budget:
        # rounding at the root: (l_j - theta) / s_j with theta close to l_j >> C s_j keeps only
        # eps l_j / s_j of tau_j; stay inside the dual ball (sum tau <= r C)
        share = budget / g
        for j in range(k):
            tau[j] *= share


cdef void solve_tau(const TauParams* P, const double* loss, const double* sq, Py_ssize_t k,
                    double* tau, Event* ev) noexcept nogil:
    if P.update == IMPLICIT:
        if P.norm == RMAX:
            tau_implicit_rmax(P, loss, sq, k, tau, ev)
        else:
            tau_implicit_l2(P, loss, sq, k, tau)
    else:
        tau_explicit(P, loss, k, tau, ev)


cdef TauParams make_params(int update, int norm, double p, Py_ssize_t r, double C, double R2, double rho2):
    cdef TauParams P
    if update < PERCEPTRON or update > IMPLICIT:
        raise ValueError(f"unknown update id {update} (0 perceptron, 1 infinite horizon, 2 implicit)")
    if norm != PNORM and norm != RMAX:
        raise ValueError(f"unknown norm id {norm} (0 p-norm, 1 r-max)")
    if norm == RMAX and r < 1:                    # r indexes the r largest losses
        raise ValueError(f"the r-max norm needs r >= 1. Got {r} instead.")
    P.update = update
    P.norm = norm
    P.p = p
    P.r = r
    P.C = C
    P.R2 = R2
    P.rho2 = rho2
    return P


def tau_rounds(const double[:, ::1] losses, const double[:, ::1] sq_norms, int update, int norm, double p,
               Py_ssize_t r, double C, double R2, double rho2):
    """tau for each row of (T x k) losses and squared instance norms (the rules in isolation)."""
    cdef Py_ssize_t T = losses.shape[0], k = losses.shape[1], t
    cdef TauParams P = make_params(update, norm, p, r, C, R2, rho2)
    check_shape("sq_norms", sq_norms, T, k)
    out = np.zeros((T, k), dtype=np.float64)
    if T == 0 or k == 0:
        return out
    cdef double[:, ::1] o = out
    cdef Event* ev = <Event*>malloc(max(2 * k, 1) * sizeof(Event))
    if ev == NULL:
        raise MemoryError("tau workspace")
    with nogil:
        for t in range(T):
            solve_tau(&P, &losses[t, 0], &sq_norms[t, 0], k, &o[t, 0], ev)
    free(ev)
    return out


cdef inline double hinge(double y, double margin) noexcept nogil:
    cdef double l
    if y == 0.0:                                 # a dormant task: loss 0, hypothesis untouched (Sec. 9)
        return 0.0
    l = 1.0 - y * margin
    return l if l > 0.0 else 0.0


cdef int moving_tasks(const double* tau, const double[:, ::1] Y, Py_ssize_t t, Py_ssize_t k,
                      double* coef, int* moving) noexcept nogil:
    """coef_j = tau_j y_j; the tasks with coef_j != 0 listed in ``moving``; returns their count."""
    cdef Py_ssize_t j
    cdef int n = 0
    for j in range(k):
        coef[j] = tau[j] * Y[t, j]
        if coef[j] != 0.0:
            moving[n] = <int>j
            n += 1
    return n


cdef void add_scaled_row(double* W, Py_ssize_t k, const double* vals, const int* idx, int nnz,
                         const double* coef, const int* moving, int n_move) noexcept nogil:
    # W[idx, :] += np.outer(vals, coef)   (W is d x k row-major; coef_j = tau_j y_j)
    cdef int a, m
    cdef Py_ssize_t j
    cdef double v
    cdef double* row
    for a in range(nnz):
        v = vals[a]
        row = W + <Py_ssize_t>idx[a] * k
        if 4 * n_move >= k:                      # many tasks move: the whole row, contiguous
            for j in range(k):
                row[j] += coef[j] * v
        else:                                    # a few: only theirs, still row by row
            for m in range(n_move):
                row[moving[m]] += coef[moving[m]] * v


cdef void row_times_W(const double* vals, const int* idx, int nnz, const double* W, Py_ssize_t k,
                      double* m) noexcept nogil:
    # m = x @ W for a sparse row x (W is d x k row-major).  Four rows of W at a time, adding in
    # exactly the order of one row at a time (so the bits do not depend on this unrolling)
    cdef int a = 0
    cdef Py_ssize_t j
    cdef double v0, v1, v2, v3
    cdef const double* r0
    cdef const double* r1
    cdef const double* r2
    cdef const double* r3
    for j in range(k):
        m[j] = 0.0
    while a + 4 <= nnz:
        v0 = vals[a]; v1 = vals[a + 1]; v2 = vals[a + 2]; v3 = vals[a + 3]
        r0 = W + <Py_ssize_t>idx[a] * k
        r1 = W + <Py_ssize_t>idx[a + 1] * k
        r2 = W + <Py_ssize_t>idx[a + 2] * k
        r3 = W + <Py_ssize_t>idx[a + 3] * k
        for j in range(k):
            m[j] = (((m[j] + v0 * r0[j]) + v1 * r1[j]) + v2 * r2[j]) + v3 * r3[j]
        a += 4
    while a < nnz:
        v0 = vals[a]
        r0 = W + <Py_ssize_t>idx[a] * k
        for j in range(k):
            m[j] = m[j] + v0 * r0[j]
        a += 1


def online_rounds(const double[::1] data, const int[::1] indices, const int64_t[::1] indptr,
                  bint dense, int n_features, bint per_task, const double[:, ::1] Y, double[:, ::1] W,
                  int update, int norm, double p, Py_ssize_t r, double C, double R2, double rho2,
                  double[:, ::1] margins, double[::1] global_loss):
    """Run the rounds of a chunk in order, updating ``W`` (d x k) in place.

    Row t of the data is round t's shared instance, or (``per_task``) row
    ``t * k + j`` is task j's instance.  ``Y`` (T x k) holds -1 / +1, or 0 for a
    dormant task.  Writes each round's margins ``w_j . x_j`` (before the update)
    and global loss ``||l_t||``.
    """
    cdef Py_ssize_t T = Y.shape[0], k = Y.shape[1], t, j
    cdef TauParams P = make_params(update, norm, p, r, C, R2, rho2)
    check_rows(data, indices, indptr, dense, n_features, 0, T * k if per_task else T)
    check_shape("W", W, n_features, k)
    check_shape("margins", margins, T, k)
    check_length("global_loss", global_loss.shape[0], T)
    if k == 0:                                   # no task: every loss vector is empty
        global_loss[:] = 0.0
        return
    cdef RowView rows = make_view(data, indices, indptr, dense, n_features)
    cdef int nnz, a, n_move
    cdef const double* vals
    cdef const int* idx
    cdef double v, s
    cdef double* m
    cdef double* row
    cdef double* work = <double*>malloc(max(4 * k, 1) * sizeof(double))
    cdef Event* ev = <Event*>malloc(max(2 * k, 1) * sizeof(Event))
    cdef int* moving = <int*>malloc(max(k, 1) * sizeof(int))
    if work == NULL or ev == NULL or moving == NULL:
        free(work)
        free(ev)
        free(moving)
        raise MemoryError("online workspace")
    cdef double* loss = work
    cdef double* sq = work + k
    cdef double* tau = work + 2 * k
    cdef double* coef = work + 3 * k
    cdef double* Wp = mptr2(W)
    with nogil:
        for t in range(T):
            m = &margins[t, 0]
            if not per_task:
                # margins[t] = x_t @ W;  sq = ||x_t||^2 for every task
                nnz = get_row(&rows, t, &vals, &idx)
                row_times_W(vals, idx, nnz, Wp, k, m)
                s = 0.0
                for a in range(nnz):
                    s += vals[a] * vals[a]
                for j in range(k):
                    sq[j] = s
            else:
                for j in range(k):
                    nnz = get_row(&rows, t * k + j, &vals, &idx)
                    s = 0.0
                    v = 0.0
                    for a in range(nnz):
                        s += vals[a] * vals[a]
                        v += vals[a] * Wp[<Py_ssize_t>idx[a] * k + j]
                    m[j] = v
                    sq[j] = s
            if not per_task and t + 1 < T and not rows.dense:
                prefetch_rows(&rows, t + 1, Wp, k)
            for j in range(k):
                loss[j] = hinge(Y[t, j], m[j])
            global_loss[t] = global_norm(&P, loss, k, ev)
            solve_tau(&P, loss, sq, k, tau, ev)
            n_move = moving_tasks(tau, Y, t, k, coef, moving)
            if n_move == 0:
                continue
            if not per_task:
                add_scaled_row(Wp, k, vals, idx, nnz, coef, moving, n_move)
            else:
                for j in range(k):
                    if coef[j] != 0.0:
                        nnz = get_row(&rows, t * k + j, &vals, &idx)
                        for a in range(nnz):
                            Wp[<Py_ssize_t>idx[a] * k + j] += coef[j] * vals[a]
    free(work)
    free(ev)
    free(moving)


# -- the same rounds in blocks of B, for the distributed engine ---------------
# Worker: base margins X_b W (B x k_local) and, on one worker, the Gram matrix
# X_b X_b^T (B x B).  Server: round s's exact margin is
#   w_{t+s} . x_{t+s} = M0[s] + sum_{s' < s} tau[s'] y[s'] G[s', s],
# so the rounds are solved in order (exact sequential semantics) with one
# exchange per block.  Worker: applies the B updates in round order.
def online_block_margins(const double[::1] data, const int[::1] indices, const int64_t[::1] indptr,
                         bint dense, int n_features, Py_ssize_t start, const double[:, ::1] W,
                         double[:, ::1] M0):
    """``M0[s] = x_{start+s} @ W`` for the B rows of a block (same summation order as ``online_rounds``)."""
    cdef Py_ssize_t B = M0.shape[0], k = M0.shape[1], s, j
    cdef int nnz, a
    cdef const double* vals
    cdef const int* idx
    cdef const double* Wp
    cdef double v
    cdef double* m
    cdef const double* row
    if k == 0:
        return
    check_rows(data, indices, indptr, dense, n_features, start, start + B)
    check_shape("W", W, n_features, k)
    cdef RowView rows = make_view(data, indices, indptr, dense, n_features)
    Wp = cptr2(W)
    with nogil:
        for s in range(B):
            m = &M0[s, 0]
            nnz = get_row(&rows, start + s, &vals, &idx)
            row_times_W(vals, idx, nnz, Wp, k, m)


def online_block_gram(const double[::1] data, const int[::1] indices, const int64_t[::1] indptr,
                      bint dense, int n_features, Py_ssize_t start, double[:, ::1] G, double[::1] scratch):
    """``G = X_b X_b^T`` for the B rows of a block; ``scratch`` is a zeroed length-d vector (left zeroed).

    The diagonal is ``||x||^2`` summed in row order, as in ``online_rounds``.
    """
    cdef Py_ssize_t B = G.shape[0], s, s2
    check_rows(data, indices, indptr, dense, n_features, start, start + B)
    check_shape("G", G, B, B)
    check_length("scratch", scratch.shape[0], n_features)
    cdef RowView rows = make_view(data, indices, indptr, dense, n_features)
    cdef int nnz, nnz2, a
    cdef const double* vals
    cdef const int* idx
    cdef const double* vals2
    cdef const int* idx2
    cdef double v
    with nogil:
        for s in range(B):
            nnz = get_row(&rows, start + s, &vals, &idx)
            v = 0.0
            for a in range(nnz):
                v += vals[a] * vals[a]
            G[s, s] = v
            for a in range(nnz):
                scratch[idx[a]] = vals[a]
            for s2 in range(s):
                nnz2 = get_row(&rows, start + s2, &vals2, &idx2)
                v = 0.0
                for a in range(nnz2):
                    v += vals2[a] * scratch[idx2[a]]
                G[s2, s] = v
                G[s, s2] = v
            for a in range(nnz):
                scratch[idx[a]] = 0.0


def online_block_solve(const double[:, ::1] M0, const double[:, ::1] G, const double[:, ::1] Y,
                       int update, int norm, double p, Py_ssize_t r, double C, double R2, double rho2,
                       double[:, ::1] tau, double[:, ::1] margins, double[::1] global_loss):
    """Server: the B rounds of a block in order, from base margins and the Gram matrix."""
    cdef Py_ssize_t B = M0.shape[0], k = M0.shape[1], s, s2, j
    cdef TauParams P = make_params(update, norm, p, r, C, R2, rho2)
    cdef double v
    check_shape("G", G, B, B)
    check_shape("Y", Y, B, k)
    check_shape("tau", tau, B, k)
    check_shape("margins", margins, B, k)
    check_length("global_loss", global_loss.shape[0], B)
    if k == 0:                                   # no task: every loss vector is empty
        global_loss[:] = 0.0
        return
    cdef double* work = <double*>malloc(max(2 * k, 1) * sizeof(double))
    cdef Event* ev = <Event*>malloc(max(2 * k, 1) * sizeof(Event))
    if work == NULL or ev == NULL:
        free(work)
        free(ev)
        raise MemoryError("online workspace")
    cdef double* loss = work
    cdef double* sq = work + k
    with nogil:
        for s in range(B):
            for j in range(k):
                v = M0[s, j]
                for s2 in range(s):
                    if tau[s2, j] != 0.0:
                        v += tau[s2, j] * Y[s2, j] * G[s2, s]
                margins[s, j] = v
                loss[j] = hinge(Y[s, j], v)
                sq[j] = G[s, s]
            global_loss[s] = global_norm(&P, loss, k, ev)
            solve_tau(&P, loss, sq, k, &tau[s, 0], ev)
    free(work)
    free(ev)


def online_block_apply(const double[::1] data, const int[::1] indices, const int64_t[::1] indptr,
                       bint dense, int n_features, Py_ssize_t start, const double[:, ::1] Y,
                       const double[:, ::1] tau, double[:, ::1] W):
    """Worker: ``W += x_s (tau_s * y_s)`` for the block's rounds s in order (local task columns)."""
    cdef Py_ssize_t B = Y.shape[0], k = Y.shape[1], s
    cdef int nnz, n_move
    cdef const double* vals
    cdef const int* idx
    if k == 0:
        return
    check_rows(data, indices, indptr, dense, n_features, start, start + B)
    check_shape("tau", tau, B, k)
    check_shape("W", W, n_features, k)
    cdef RowView rows = make_view(data, indices, indptr, dense, n_features)
    cdef double* Wp = mptr2(W)
    cdef double* coef = <double*>malloc(k * sizeof(double))
    cdef int* moving = <int*>malloc(k * sizeof(int))
    if coef == NULL or moving == NULL:
        free(coef)
        free(moving)
        raise MemoryError("online workspace")
    with nogil:
        for s in range(B):
            n_move = moving_tasks(&tau[s, 0], Y, s, k, coef, moving)
            if n_move:
                nnz = get_row(&rows, start + s, &vals, &idx)
                add_scaled_row(Wp, k, vals, idx, nnz, coef, moving, n_move)
    free(coef)
    free(moving)
