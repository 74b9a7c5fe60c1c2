# cython: language_level=3
"""Compiled arithmetic of DMTRL and joint sparsity: local SDCA coordinate updates (dense
and CSR rows through one interface, ``_rows.pxd``) and the O(dm log dm) l1,inf
projection.  No MPI, no I/O, no NumPy or Python objects in a loop: each public
function checks its arguments, then runs with the GIL released.  (The online
tau solvers are in ``_online.pyx``.)

Rows are float64 or float32 (``Rows.single``); every kernel here reads both
through ``row_dot`` / ``row_axpy`` / ``row_sq_norm`` (``_rows.pxd``) and computes
in double, so float32 rows give the bits of the same values stored as float64.

Local SDCA solves the DMTRL local subproblem (paper 001, Eq. 4) coordinate by
coordinate: for coordinate j of task i, with
``u = w_i + (rho sigma_ii / lam) delta_b_i`` and
``q = rho sigma_ii ||x_j||^2 / (lam n_i)`` it maximizes
``-l*(-(a + delta)) - delta u.x_j - (q/2) delta^2`` over delta.
"""
from libc.math cimport exp, log, log1p, fabs, sqrt, INFINITY
from libc.stdint cimport uint64_t
from libc.stdlib cimport malloc, free, qsort
from scipy.linalg.cython_lapack cimport dsyev

from hpcmtl._rows cimport (RowView, Rows, row_dot, row_axpy, row_sq_norm, cptr, mptr2, check_rows, check_length,
                           check_shape, hpcmtl_no_doubles)

import numpy as np                 # output arrays only, allocated before a kernel runs


cpdef enum LossId:
    # the loss of every SDCA kernel; hpcmtl.losses maps a validated name to one of these, once
    HINGE = 0
    SMOOTHED_HINGE = 1             # parameter gamma
    SQUARED = 2
    LOGISTIC = 3


cdef int check_loss(int loss) except -1:
    if loss < HINGE or loss > LOGISTIC:
        raise ValueError(f"unknown loss id {loss} (0 hinge, 1 smoothed hinge, 2 squared, 3 logistic)")
    return 0


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


cdef int check_dual_rows(Rows rows, Py_ssize_t n, Py_ssize_t n_alpha, Py_ssize_t n_sq_norms) except -1:
    """The rows, dual variables and squared norms of a block of n rows agree in length."""
    check_rows(rows, 0, n, True)
    check_length("alpha", n_alpha, n)
    check_length("sq_norms", n_sq_norms, n)
    return 0


def sdca_local(Rows rows not None, const double[::1] y, double[::1] alpha,
               const double[::1] w, double[::1] delta_b,
               const double[::1] sq_norms, int[::1] order, double[::1] shrink_state,
               int loss, double gamma, double rho_sigma_over_lam,
               double n_task, double local_iters, uint64_t seed,
               const double[::1] mu=None, const double[::1] x_mu=None):
    """Local SDCA (paper 001, Algorithm 2) on one task block, in place.

    Parameters
    ----------
    rows : the block's rows (``taskdata.rows_of``)
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
    mu, x_mu : implicit centering (the per-task intercept of the squared loss on
        CSR rows, docs/math.md): the rows are read as ``x~_j = x_j - mu`` without
        forming them; ``x_mu[j] = x_j . mu`` per row, ``sq_norms`` must then be
        ``||x~_j||^2``.  The dense u is kept lazily as ``u = u_s - t mu`` with the
        scalar ``mu . u`` maintained, so a step costs O(nnz of its row):
        ``x~_j . u = x_j . u_s - t x_mu[j] - mu . u``.  None: the rows as they are.

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
    cdef int d = rows.n_features
    cdef RowView view
    cdef uint64_t state = seed
    cdef Py_ssize_t step = 0, pos, j, n_steps, i
    cdef int k, tmp
    cdef const double* wp
    cdef double ux, q, delta, c_u, c_b, b, G, PG, v
    cdef double inv_n
    cdef double* u
    cdef bint shrinking, in_pass = False
    cdef bint centered = mu is not None
    cdef const double* mup = hpcmtl_no_doubles
    cdef const double* xmup = hpcmtl_no_doubles
    cdef double t_mu = 0.0, mu_u = 0.0, mu_sq = 0.0    # u = u_s - t_mu mu; mu_u = mu . u; mu_sq = ||mu||^2
    cdef Shrink sh
    check_dual_rows(rows, n, alpha.shape[0], sq_norms.shape[0])
    check_length("order", order.shape[0], n)
    check_length("w", w.shape[0], d)
    if centered != (x_mu is not None):
        raise ValueError("mu and x_mu come together (implicit centering) or not at all")
    if centered:
        check_length("mu", mu.shape[0], d)
        check_length("x_mu", x_mu.shape[0], n)
        mup = cptr(mu)
        xmup = cptr(x_mu)
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
    view = rows.view
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
        if centered:
            for k in range(d):
                mu_u += mup[k] * wp[k]           # mu . u
                mu_sq += mup[k] * mup[k]
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
            ux = row_dot(&view, j, u)
            if centered:                              # (x_j - mu) . (u_s - t mu)
                ux = ux - t_mu * xmup[j] - mu_u
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
            row_axpy(&view, j, c_u, u)               # u += (rho sigma / lam) delta x_j / n_i
            if centered:                              # u += c_u (x_j - mu): the -c_u mu part kept in t_mu
                t_mu += c_u
                mu_u += c_u * (xmup[j] - mu_sq)
        if centered:
            for k in range(d):
                u[k] -= t_mu * mup[k]                # u = u_s - t mu
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


def objective_terms(Rows rows not None, const double[::1] y, const double[::1] alpha,
                    const double[::1] w, int loss, double gamma, double z_shift=0.0):
    """Return ``(sum_j l(w.x_j - z_shift, y_j), sum_j l*(-alpha_j))`` over a block.

    ``z_shift = mu . w`` scores implicitly centered rows ``x_j - mu`` (the
    squared loss's intercept on CSR rows); 0 for the rows as they are."""
    cdef Py_ssize_t n = y.shape[0], j
    cdef RowView view
    cdef const double* wp
    cdef double loss_sum = 0.0, conj_sum = 0.0
    check_rows(rows, 0, n, True)
    check_length("alpha", alpha.shape[0], n)
    check_length("w", w.shape[0], rows.n_features)
    check_loss(loss)
    view = rows.view
    wp = cptr(w)
    with nogil:
        for j in range(n):
            loss_sum += primal_loss(loss, row_dot(&view, j, wp) - z_shift, y[j], gamma)
            conj_sum += conjugate_neg(loss, alpha[j], y[j], gamma)
    return loss_sum, conj_sum


def ssdca_epoch(Rows rows not None, const double[::1] y, double[::1] alpha,
                const int[::1] task_of_row, const double[::1] n_of_task,
                double[:, ::1] WT, double[:, ::1] BT, const double[:, ::1] Sigma,
                const double[::1] sq_norms, int[::1] perm,
                int loss, double gamma, double lam, Py_ssize_t n_steps, uint64_t seed):
    """Single-machine SDCA over all coordinates of all tasks with exact W.

    ``WT`` (m x d) is W transposed and ``BT`` (m x d) is B transposed; after
    each step on row j of task i, ``B[:, i] += delta x_j / n_i`` and
    ``W += outer(delta x_j / n_i, Sigma[i]) / lam`` keep ``W = B Sigma / lam``.
    """
    cdef Py_ssize_t n = y.shape[0], m = WT.shape[0], d = rows.n_features
    cdef RowView view
    cdef uint64_t state = seed
    cdef Py_ssize_t step = 0, pos, j, t
    cdef int i, bad = -1
    cdef double* WTp
    cdef double* BTp
    cdef double ux, q, delta, c_b, c_w
    check_dual_rows(rows, n, alpha.shape[0], sq_norms.shape[0])
    check_length("task_of_row", task_of_row.shape[0], n)
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
    view = rows.view
    WTp = mptr2(WT)
    BTp = mptr2(BT)
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
            ux = row_dot(&view, j, WTp + i * d)               # WT[i] . x_j
            q = Sigma[i, i] * sq_norms[j] / (lam * n_of_task[i])
            delta = coordinate_delta(loss, y[j], alpha[j], ux, q, gamma)
            if delta == 0.0:
                continue
            alpha[j] += delta
            c_b = delta / n_of_task[i]
            row_axpy(&view, j, c_b, BTp + i * d)             # BT[i] += c_b x_j
            for t in range(m):
                c_w = c_b * Sigma[i, t] / lam
                if c_w != 0.0:
                    row_axpy(&view, j, c_w, WTp + t * d)     # WT[t] += c_w x_j
    return step


def ordered_dot(const double[::1] a, const double[::1] b):
    """``sum_k a[k] b[k]`` with one accumulator, in index order.

    Exact zeros between the terms leave the sum's bits alone, so a d-vector and
    its values on a support (the same order, the zeros dropped) give the same
    result: the compact blocks of the support exchange (issue 14) score and
    center in the dense exchange's bits.  (BLAS dot products split the sum by
    position and length, so they do not.)
    """
    check_length("b", b.shape[0], a.shape[0])
    cdef Py_ssize_t k
    cdef double total = 0.0
    for k in range(a.shape[0]):
        total += a[k] * b[k]
    return total


def row_sq_norms(Rows rows not None, Py_ssize_t n_rows):
    """``||x_j||^2`` for every row of a block."""
    check_rows(rows, 0, n_rows, True)
    cdef RowView view = rows.view
    out = np.empty(n_rows, dtype=np.float64)
    cdef double[::1] o = out
    cdef Py_ssize_t j
    with nogil:
        for j in range(n_rows):
            o[j] = row_sq_norm(&view, j)
    return out


def rmatvec_nonzero(Rows rows not None, const double[::1] v, double[::1] out):
    """``out = X^T v`` over the rows where ``v`` is non-zero, one row at a time in row order.

    For a sparse ``v`` (the box momentum's direction q moves a few rows a round)
    this costs the nnz of those rows, not the block's.  Each feature's sum runs in
    row order, as scipy's ``X.T @ v`` of CSR rows does, so on float64 CSR rows the
    result is bitwise that product's (rows with ``v_j = 0`` add exact zeros there).
    Only the rows it reads are checked (dense rows: the shared index array, once).
    Raises ValueError on inconsistent lengths or rows.
    """
    cdef Py_ssize_t n = v.shape[0], j
    cdef int k
    cdef RowView view
    cdef double* o
    check_length("out", out.shape[0], rows.n_features)
    if rows.dense:
        check_rows(rows, 0, n, True)
    else:
        for j in range(n):
            if v[j] != 0.0:
                check_rows(rows, j, j + 1, True)
    view = rows.view
    o = &out[0] if out.shape[0] > 0 else NULL
    with nogil:
        for k in range(rows.n_features):
            o[k] = 0.0
        for j in range(n):
            if v[j] != 0.0:
                row_axpy(&view, j, v[j], o)


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


cdef struct Breakpoint:
    double r          # r_{i,c+2}: where row i's slope drops from 1/(c+1) to 1/(c+2) (to 0 past the row's end)
    Py_ssize_t flat   # i * m + c


cdef int breakpoint_cmp(const void* a, const void* b) noexcept nogil:
    """Increasing r, ties (and NaNs, which go last) in ``flat`` order: NumPy's stable argsort of R.ravel()."""
    cdef const Breakpoint* x = <const Breakpoint*>a
    cdef const Breakpoint* y = <const Breakpoint*>b
    cdef bint x_nan = x.r != x.r, y_nan = y.r != y.r
    if x_nan != y_nan:
        return 1 if x_nan else -1
    if not x_nan:
        if x.r < y.r:
            return -1
        if x.r > y.r:
            return 1
    return -1 if x.flat < y.flat else (1 if x.flat > y.flat else 0)


cdef double merge_theta(const double[:, ::1] S, double delta, Breakpoint* bp, double* g) noexcept nogil:
    """The paper's Fig. 1: walk all d m breakpoints in increasing order (the fallback, O(dm log dm)).

    ``bp`` holds d m breakpoints and ``g`` d slopes (workspace).  Row i's k-th
    largest entry is ``S[i, m - k]``; its breakpoints are
    ``r_{i,k+1} = sum_{j<=k} s_{i,j} - k s_{i,k+1}`` (``s_{i,m+1} = 0``):
    ``R = np.cumsum(desc, axis=1) - k * nxt`` with ``desc = S[:, ::-1]``, in that order of operations.
    """
    cdef Py_ssize_t d = S.shape[0], m = S.shape[1], i, c, t, row, kk
    cdef double csum = 0.0, nxt, n_prev = 0.0, r_prev = 0.0, n_now, total_slope
    for i in range(d):
        for c in range(m):
            csum = S[i, m - 1] if c == 0 else csum + S[i, m - 1 - c]
            nxt = S[i, m - 2 - c] if c + 1 < m else 0.0
            bp[i * m + c].r = csum - <double>(c + 1) * nxt
            bp[i * m + c].flat = i * m + c
        g[i] = 1.0                   # slope 1/k of every row, k = 1 at theta = 0+
    qsort(bp, d * m, sizeof(Breakpoint), breakpoint_cmp)
    total_slope = <double>d
    for t in range(d * m):
        n_now = n_prev + total_slope * (bp[t].r - r_prev)
        if n_now >= delta:
            return r_prev + (delta - n_prev) / total_slope
        n_prev = n_now
        r_prev = bp[t].r
        row = bp[t].flat // m
        kk = bp[t].flat % m + 2      # passing r_{i,kk}: the row's slope becomes 1/kk (0 past the end)
        total_slope -= g[row]
        g[row] = 1.0 / <double>kk if kk <= m else 0.0
        total_slope += g[row]
    return r_prev + (delta - n_prev) / total_slope if total_slope > 0 else r_prev


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
    cdef Breakpoint* bp
    cdef double* g
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
        bp = <Breakpoint*>malloc(max(d * m, 1) * sizeof(Breakpoint))
        g = <double*>malloc(max(d, 1) * sizeof(double))
        if bp == NULL or g == NULL:
            free(bp)
            free(g)
            free(rows)
            raise MemoryError("l1,inf projection workspace")
        with nogil:
            theta = merge_theta(S, delta, bp, g)
            for i in range(d):
                rows[i].k = 1
                rows[i].csum = 0.0
                rows[i].rk = 0.0
        free(bp)
        free(g)
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
# The aggregation steps' box QP (DMTRL, hpcmtl.dmtrl.box_qp): dense m x m algebra
# ---------------------------------------------------------------------------
cdef double qp_gain(const double[:, ::1] A, const double[::1] g, const double[::1] v) noexcept nogil:
    # g @ v - 0.5 * v @ (A @ v)
    cdef Py_ssize_t m = g.shape[0], i, j
    cdef double lin = 0.0, quad = 0.0, s
    for i in range(m):
        lin += g[i] * v[i]
        s = 0.0
        for j in range(m):
            s += A[i, j] * v[j]
        quad += v[i] * s
    return lin - 0.5 * quad


cdef void clip_snap(double[::1] v, const double[::1] upper, const double[::1] snap) noexcept nogil:
    # v = snapped(np.clip(v, 0, upper)): a coordinate a rounding error away from a bound is at the bound
    cdef Py_ssize_t i
    for i in range(v.shape[0]):
        if v[i] < 0.0:
            v[i] = 0.0
        elif v[i] > upper[i]:
            v[i] = upper[i]
        if v[i] <= snap[i]:
            v[i] = 0.0
        elif v[i] >= upper[i] - snap[i]:
            v[i] = upper[i]


cdef double move_if_better(const double[:, ::1] A, const double[::1] g, double[::1] trial, const double[::1] upper,
                           const double[::1] snap, double[::1] x, double best) noexcept nogil:
    # trial = snapped(np.clip(trial, 0, upper)); x = trial if it gains more than best; max(best, its gain)
    cdef Py_ssize_t i
    cdef double value
    clip_snap(trial, upper, snap)
    value = qp_gain(A, g, trial)
    if not (value > best):
        return best
    for i in range(x.shape[0]):
        x[i] = trial[i]
    return value


cdef bint free_cholesky(const double[:, ::1] A, const Py_ssize_t[::1] F, Py_ssize_t f,
                        double[:, ::1] L) noexcept nogil:
    # L L^T = A[np.ix_(F, F)] (L lower, f x f); False when a pivot is not positive or the block is nearly
    # singular (min L_jj^2 < 1e-12 max_j A_FjFj), as hpcmtl.dmtrl.box_qp decides before its eigh fallback
    cdef Py_ssize_t i, j, k
    cdef double s, top = 0.0, low = INFINITY
    for j in range(f):
        if A[F[j], F[j]] > top:
            top = A[F[j], F[j]]
    for j in range(f):
        s = A[F[j], F[j]]
        for k in range(j):
            s -= L[j, k] * L[j, k]
        if not (s > 0.0):
            return False
        L[j, j] = sqrt(s)
        if s < low:
            low = s
        for i in range(j + 1, f):
            s = A[F[i], F[j]]
            for k in range(j):
                s -= L[i, k] * L[j, k]
            L[i, j] = s / L[j, j]
    return not (low < 1e-12 * top)


cdef void cholesky_solve(const double[:, ::1] L, Py_ssize_t f, const double[::1] b, double[::1] z) noexcept nogil:
    # z[:f] = solve(L L^T, b[:f]) (forward, then back substitution)
    cdef Py_ssize_t i, k
    cdef double s
    for i in range(f):
        s = b[i]
        for k in range(i):
            s -= L[i, k] * z[k]
        z[i] = s / L[i, i]
    for i in range(f - 1, -1, -1):
        s = z[i]
        for k in range(i + 1, f):
            s -= L[k, i] * z[k]
        z[i] = s / L[i, i]


cdef void symmetric_eigen(double[:, ::1] E, double[:, ::1] V, double[::1] w, double[::1] work,
                          Py_ssize_t f) noexcept nogil:
    # w, V = np.linalg.eigh(E[:f, :f]) (E symmetric, destroyed; V's columns the eigenvectors); LAPACK reads E
    # column-major with leading dimension E.shape[1], which is E's transpose, the same matrix; its
    # eigenvectors come back as the columns of that layout, the rows of E
    cdef int n = <int>f, lda = <int>E.shape[1], lw = <int>work.shape[0], info = 0, i, k
    cdef char jobz = b'V', uplo = b'L'
    dsyev(&jobz, &uplo, &n, &E[0, 0], &lda, &w[0], &work[0], &lw, &info)
    for i in range(f):
        for k in range(f):
            V[i, k] = E[k, i]


def box_qp(const double[:, ::1] A, const double[::1] g, const double[::1] upper, const double[::1] start,
           bint use_start, double[::1] x, int max_iter, double rtol):
    """``x = argmax g.x - x.A.x / 2`` over ``0 <= x <= upper`` (the active-set Newton method of
    :func:`hpcmtl.dmtrl.box_qp`, which documents it; A symmetric positive semidefinite, upper >= 0).

    Starts from the best of 0, every coordinate alone (scaled back as a whole) and
    ``start`` (when ``use_start``).  Each iteration: the free set (coordinates not
    held at a bound by their gradient), the Newton step on it (Cholesky; when the
    free block is nearly singular, its eigendecomposition (LAPACK's dsyev): the ray along which the
    objective is linear, else the pseudo-inverse step), coordinates whose step
    leaves the box removed from the free set; the step projected onto the box,
    else taken up to the first bound it meets.  Returns the number of iterations.
    """
    cdef Py_ssize_t m = g.shape[0], i, j, f, blocked
    check_shape("A", A, m, m)
    check_length("upper", upper.shape[0], m)
    check_length("x", x.shape[0], m)
    if use_start:
        check_length("start", start.shape[0], m)
    snap_a = np.empty(m)
    dscale_a = np.empty(m)
    grad_a = np.empty(m)
    step_a = np.empty(m)
    trial_a = np.empty(m)
    rhs_a = np.empty(m)
    sol_a = np.empty(m)
    eig_a = np.empty(m)
    free_a = np.empty(m, dtype=np.uint8)
    index_a = np.empty(m, dtype=np.intp)
    L_a = np.empty((m, m))
    V_a = np.empty((m, m))
    work_a = np.empty(max(66 * m, 1))
    cdef double[::1] snap = snap_a, dscale = dscale_a, grad = grad_a, step = step_a, trial = trial_a
    cdef double[::1] rhs = rhs_a, sol = sol_a, eig = eig_a, lwork = work_a
    cdef unsigned char[::1] free_ = free_a
    cdef Py_ssize_t[::1] F = index_a
    cdef double[:, ::1] L = L_a, V = V_a
    cdef double top = 0.0, scale = 0.0, best = 0.0, value, slope, curv, gmax, s, t, r, wmax, nmax
    cdef int it = 0
    cdef bint ray, fallback
    if m == 0:
        return 0
    with nogil:
        for i in range(m):
            x[i] = 0.0
            if upper[i] > top:
                top = upper[i]
            if fabs(A[i, i]) > scale:
                scale = fabs(A[i, i])
        for i in range(m):
            if fabs(g[i]) / (top if top > 1e-300 else 1e-300) > scale:
                scale = fabs(g[i]) / (top if top > 1e-300 else 1e-300)
        if scale < 1e-300:
            scale = 1e-300
        for i in range(m):
            dscale[i] = A[i, i] if A[i, i] > 1e-12 * scale else 1e-12 * scale
            snap[i] = 1e-12 * upper[i]
        # candidate: every coordinate alone (g_i / A_ii clipped), scaled back as a whole
        for i in range(m):
            trial[i] = g[i] / dscale[i]
            trial[i] = 0.0 if trial[i] < 0.0 else (upper[i] if trial[i] > upper[i] else trial[i])
        slope = 0.0
        for i in range(m):
            slope += g[i] * trial[i]
        curv = 0.0
        for i in range(m):
            s = 0.0
            for j in range(m):
                s += A[i, j] * trial[j]
            curv += trial[i] * s
        if curv > slope and slope > 0.0:
            for i in range(m):
                trial[i] = trial[i] * (slope / curv)
        best = move_if_better(A, g, trial, upper, snap, x, best)
        if use_start:
            for i in range(m):
                trial[i] = start[i]
            best = move_if_better(A, g, trial, upper, snap, x, best)
        while it < max_iter:
            it += 1
            gmax = 0.0
            f = 0
            for i in range(m):
                s = g[i]
                for j in range(m):
                    s -= A[i, j] * x[j]
                grad[i] = s
                free_[i] = not ((x[i] <= 0.0 and s <= 0.0) or (x[i] >= upper[i] and s >= 0.0))
                if free_[i]:
                    f += 1
                    if fabs(s) > gmax:
                        gmax = fabs(s)
            if f == 0 or gmax <= rtol * scale * (top if top > 1.0 else 1.0):
                break
            ray = False
            while f > 0:
                f = 0
                for i in range(m):
                    step[i] = 0.0
                    if free_[i]:
                        F[f] = i
                        rhs[f] = grad[i]
                        f += 1
                if free_cholesky(A, F, f, L):
                    cholesky_solve(L, f, rhs, sol)
                    for i in range(f):
                        step[F[i]] = sol[i]
                    ray = False
                else:
                    for i in range(f):          # the free block, its eigendecomposition (LAPACK dsyev, as eigh)
                        for j in range(f):
                            L[i, j] = A[F[i], F[j]]
                    symmetric_eigen(L, V, eig, lwork, f)
                    wmax = eig[0]
                    for i in range(f):
                        if eig[i] > wmax:
                            wmax = eig[i]
                    wmax = 1e-9 * (wmax if wmax > 1e-300 else 1e-300)
                    for j in range(f):          # sol = V^T grad_F
                        s = 0.0
                        for i in range(f):
                            s += V[i, j] * rhs[i]
                        sol[j] = s
                    nmax = 0.0
                    gmax = 0.0
                    for i in range(f):          # where the objective is linear: climb to a bound
                        s = 0.0
                        for j in range(f):
                            if not (eig[j] > wmax):
                                s += V[i, j] * sol[j]
                        step[F[i]] = s
                        if fabs(s) > nmax:
                            nmax = fabs(s)
                        if fabs(rhs[i]) > gmax:
                            gmax = fabs(rhs[i])
                    ray = nmax > 1e-9 * gmax
                    if not ray:                 # the pseudo-inverse step
                        for i in range(f):
                            s = 0.0
                            for j in range(f):
                                if eig[j] > wmax:
                                    s += V[i, j] * (sol[j] / eig[j])
                            step[F[i]] = s
                blocked = 0
                for i in range(m):
                    if free_[i] and ((x[i] <= 0.0 and step[i] < 0.0) or (x[i] >= upper[i] and step[i] > 0.0)):
                        free_[i] = 0
                        blocked += 1
                if blocked == 0:
                    break
                f = 0
                for i in range(m):
                    f += free_[i]
            if f == 0:
                break
            if not ray:                         # the Newton step projected: many bounds at once
                for i in range(m):
                    trial[i] = x[i] + step[i]
                value = move_if_better(A, g, trial, upper, snap, x, best)
                if value > best:
                    best = value
                    continue
            t = INFINITY                        # up to the first bound: gains for t > 0
            for i in range(m):
                if step[i] > 0.0:
                    r = (upper[i] - x[i]) / step[i]
                elif step[i] < 0.0:
                    r = -x[i] / step[i]
                else:
                    continue
                if r < t:
                    t = r
            if not ray and t > 1.0:
                t = 1.0
            if not (t < INFINITY):
                break
            for i in range(m):
                trial[i] = x[i] + t * step[i]
            value = move_if_better(A, g, trial, upper, snap, x, best)
            if not (value > best):
                break
            best = value
    return it
