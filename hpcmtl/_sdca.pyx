# cython: language_level=3
"""Compiled arithmetic of DMTRL's workers: local SDCA coordinate updates, the
single-machine SDCA epoch of the baselines, and the objective sums of a block
(dense and CSR rows through one interface, ``_rows.pxd``).  No MPI, no I/O, no
NumPy or Python objects in a loop: each public function checks its arguments,
then runs with the GIL released.  (The losses' values, conjugates and slopes
are in ``_losses.pxd``, the learned-Sigma problem's outer phases in
``_joint_terms.pyx``, the projections in ``_projections.pyx``, the server's box
QP in ``_box_qp.pyx``, fixed-order row sums in ``_blockops.pyx``, the online
tau solvers in ``_online.pyx``.)

Rows are float64 or float32 (``Rows.single``); every kernel here reads both
through ``row_dot`` / ``row_axpy`` (``_rows.pxd``) and computes in double, so
float32 rows give the bits of the same values stored as float64.

Local SDCA solves the DMTRL local subproblem (paper 001, Eq. 4) coordinate by
coordinate: for coordinate j of task i, with
``u = w_i + (rho sigma_ii / lam) delta_b_i`` and
``q = rho sigma_ii ||x_j||^2 / (lam n_i)`` it maximizes
``-l*(-(a + delta)) - delta u.x_j - (q/2) delta^2`` over delta.
"""
from libc.math cimport log, log1p, fabs, INFINITY
from libc.stdint cimport uint64_t, int64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy

from hpcmtl._losses cimport (HINGE, SMOOTHED_HINGE, SQUARED, LOGISTIC, check_loss, primal_loss, conjugate_neg,
                             clip01, sigmoid)
from hpcmtl._random cimport bounded_rand
from hpcmtl._rows cimport (RowView, Rows, row_span, row_dot, checked_row_dot, row_axpy, row_columns_outside, cptr,
                           mptr2, check_rows, check_length, check_shape, hpcmtl_no_doubles)

from enum import IntEnum

import numpy as np                 # output arrays only, allocated before a kernel runs


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define HPCMTL_PREFETCH_READ(p) __builtin_prefetch((p), 0, 3)
    #else
    #define HPCMTL_PREFETCH_READ(p) ((void)0)
    #endif
    """
    void HPCMTL_PREFETCH_READ(const void* p) noexcept nogil


# How many coordinates ahead local SDCA asks for a row (a hint only: nothing it computes changes).
# The coordinates come in random order, so each row starts a fresh run of cache misses that the
# hardware prefetcher sees too late; a pass over 50k x 20k CSR rows at 0.5 % spent most of its
# time waiting for them in the dot product.  Asking two rows ahead halved that pass
# (bench/bench_local_sdca.py); one row ahead did about as well.
cdef enum:
    PREFETCH_AHEAD = 2


cdef inline void prefetch_row(const RowView* rows, Py_ssize_t i, const double* alpha, const double* y,
                              const double* sq_norms) noexcept nogil:
    """Ask for row i's values and column indices, one request a cache line, and its dual variable,
    label and squared norm."""
    cdef int64_t start
    cdef const int* idx
    cdef int nnz = row_span(rows, i, &start, &idx)
    cdef Py_ssize_t k, n_bytes
    cdef const char* p
    if rows.single:
        p = <const char*>(rows.data32 + start)
        n_bytes = <Py_ssize_t>nnz * <Py_ssize_t>sizeof(float)
    else:
        p = <const char*>(rows.data + start)
        n_bytes = <Py_ssize_t>nnz * <Py_ssize_t>sizeof(double)
    for k in range(0, n_bytes, 64):
        HPCMTL_PREFETCH_READ(p + k)
    if not rows.dense:                       # (dense rows share one small index array, already cached)
        p = <const char*>idx
        n_bytes = <Py_ssize_t>nnz * <Py_ssize_t>sizeof(int)
        for k in range(0, n_bytes, 64):
            HPCMTL_PREFETCH_READ(p + k)
    HPCMTL_PREFETCH_READ(alpha + i)
    HPCMTL_PREFETCH_READ(y + i)
    HPCMTL_PREFETCH_READ(sq_norms + i)


# the loss of every kernel (_losses.pxd), as Python sees it
LossId = IntEnum("LossId", [("HINGE", HINGE), ("SMOOTHED_HINGE", SMOOTHED_HINGE), ("SQUARED", SQUARED),
                            ("LOGISTIC", LOGISTIC)], module=__name__)


# ---------------------------------------------------------------------------
# Coordinate order: a permutation from the block's splitmix64 stream (_random.pxd)
# ---------------------------------------------------------------------------
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
# The coordinate maximizer (the losses' values and conjugates: _losses.pxd)
# ---------------------------------------------------------------------------
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


cdef struct ShrinkState:
    # A block's shrinking state between rounds, as its caller keeps it: five doubles in this order
    # (new_shrink_state; checkpoints save them as they are), read and written only through these names
    double enabled                       # 0: no shrinking, every pass a fresh permutation of 0..n-1
    double active_size                   # order[:active_size] is the active set
    double PGmax_old, PGmin_old          # thresholds from the last pass
    double eps                           # unshrink tolerance


cdef Py_ssize_t SHRINK_STATE_LENGTH = sizeof(ShrinkState) // sizeof(double)     # 5


cdef struct Shrink:
    # the shrinking state during a call, liblinear's names (solve_l2r_l1l2_svc)
    Py_ssize_t active_size
    double PGmax_old, PGmin_old, eps     # thresholds from the last pass; unshrink tolerance
    double PGmax_new, PGmin_new          # extremes of the projected gradient in this pass


cdef inline void end_of_pass(Shrink* s, Py_ssize_t n) noexcept nogil:
    """liblinear's bookkeeping after a pass over the active set.

    An exhausted active set (every coordinate shrunk, so the pass took no step
    and PG_max - PG_min = -inf) restarts with the full set and no thresholds,
    as in liblinear's solve_l2r_l1l2_svc: ``active_size`` never drops below 0, and
    the next pass visits every coordinate.
    """
    if s.active_size <= 0 or s.PGmax_new - s.PGmin_new <= s.eps:
        if s.active_size == n and s.eps > 1e-12:
            s.eps *= 0.1                 # the full set met eps: tighten
        s.active_size = n                # unshrink
        s.PGmax_old = INFINITY
        s.PGmin_old = -INFINITY
    else:
        s.PGmax_old = s.PGmax_new if s.PGmax_new > 0.0 else INFINITY
        s.PGmin_old = s.PGmin_new if s.PGmin_new < 0.0 else -INFINITY
    s.PGmax_new = -INFINITY
    s.PGmin_new = INFINITY


cdef inline double box_gradient(int loss, double y, double b, double ux, double gamma) noexcept nogil:
    """liblinear's G: minus the derivative of the local objective in b = y alpha, at delta = 0."""
    if loss == SMOOTHED_HINGE:
        return y * ux - 1.0 + gamma * b
    return y * ux - 1.0


cdef int check_dual_rows(Rows rows, Py_ssize_t n, Py_ssize_t n_alpha, Py_ssize_t n_sq_norms,
                         bint columns=True) except -1:
    """The rows, dual variables and squared norms of a block of n rows agree in length (``columns``: as
    :func:`check_rows`)."""
    check_rows(rows, 0, n, True, columns)
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
    order : the block's coordinates; its first ``active_size`` entries are the
        active set.  Kept by the caller between rounds (shrinking state).
    shrink_state : ``[enabled, active_size, PGmax_old, PGmin_old, eps]`` (the
        fields of ``ShrinkState``, in that order) kept between rounds (see
        :func:`new_shrink_state`); ``enabled = 0``: every
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
    active_size))`` for a non-empty block).  Raises ValueError on inconsistent
    shapes, rows, ``order`` entries outside ``0..n-1`` (with shrinking), an
    unknown loss id, or a non-positive ``rho_sigma_over_lam`` / ``n_task``, all
    before any step, except a CSR column index outside ``0..d-1``: that is found
    when its row comes up (each row's columns are checked by the loop of its dot
    product, which never indexes ``u`` with one outside), and then ``alpha`` and ``order`` keep the steps
    taken before it (``delta_b`` and ``shrink_state`` are not written).
    """
    cdef Py_ssize_t n = y.shape[0]
    cdef int d = rows.n_features
    cdef RowView view
    cdef uint64_t state = seed
    cdef Py_ssize_t step = 0, pos, j, n_steps, i
    cdef int k, tmp, outside = 0
    cdef const double* wp
    cdef const double* alpha_p                        # (prefetch hints only)
    cdef const double* y_p
    cdef const double* sq_p
    cdef double ux, q, delta, c_u, c_b, b, G, PG, v
    cdef double inv_n
    cdef double* u
    cdef bint shrinking, in_pass = False
    cdef bint centered = mu is not None
    cdef const double* mup = hpcmtl_no_doubles
    cdef const double* xmup = hpcmtl_no_doubles
    cdef double t_mu = 0.0, mu_u = 0.0, mu_sq = 0.0    # u = u_s - t_mu mu; mu_u = mu . u; mu_sq = ||mu||^2
    cdef ShrinkState kept
    cdef Shrink sh
    cdef bint check_columns = not rows.dense
    cdef Py_ssize_t bad_row = -1
    # a CSR row's column indices are checked when the row comes up, not all of them here: a scan of every
    # index streams 4 bytes a non-zero through memory once more a call (with shrinking, more than the pass
    # itself reads), while a row's check runs on indices the step loads anyway, inside its dot product's loop
    # (checked_row_dot: a separate loop over the indices before it cost a few % of a pass, bench_local_sdca)
    check_dual_rows(rows, n, alpha.shape[0], sq_norms.shape[0], columns=False)
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
    check_length("shrink_state", shrink_state.shape[0], SHRINK_STATE_LENGTH)
    check_loss(loss)
    if not (rho_sigma_over_lam > 0.0 and rho_sigma_over_lam < INFINITY):
        raise ValueError(f"rho sigma / lam must be finite and > 0. Got {rho_sigma_over_lam!r} instead.")
    if not (n_task > 0.0 and n_task < INFINITY):
        raise ValueError(f"n_task must be finite and > 0. Got {n_task!r} instead.")
    if not (local_iters >= 0.0 and local_iters * n < 1e18):
        raise ValueError(f"local_iters must be >= 0 and local_iters * n < 1e18. Got {local_iters!r} instead.")
    memcpy(&kept, &shrink_state[0], sizeof(ShrinkState))
    # shrinking is liblinear's rule for the box-constrained (hinge) duals only
    shrinking = kept.enabled != 0.0 and (loss == HINGE or loss == SMOOTHED_HINGE)
    sh.active_size = n
    sh.PGmax_old = INFINITY
    sh.PGmin_old = -INFINITY
    sh.eps = 0.1
    if shrinking:
        v = kept.active_size
        if v >= 1.0 and v <= <double>n:          # (a NaN or out-of-range count: everything active)
            sh.active_size = <Py_ssize_t>v
        sh.PGmax_old = kept.PGmax_old
        sh.PGmin_old = kept.PGmin_old
        if kept.eps >= 0.0 and kept.eps < INFINITY:
            sh.eps = kept.eps
        for i in range(n):                       # the kept order indexes y, alpha and the rows
            if order[i] < 0 or order[i] >= n:
                raise ValueError(f"order[{i}] = {order[i]} is not a coordinate of this block (0..{n - 1})")
    sh.PGmax_new = -INFINITY
    sh.PGmin_new = INFINITY
    if n == 0:
        delta_b[:] = 0.0
        return 0
    view = rows.view
    wp = cptr(w)
    alpha_p = &alpha[0]
    y_p = &y[0]
    sq_p = &sq_norms[0]
    inv_n = 1.0 / n_task
    n_steps = <Py_ssize_t>(local_iters * sh.active_size + 0.5)
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
        # Each iteration either takes a step or shrinks one coordinate (active_size
        # >= pos + 1 before it, so >= 0 after); a pass that shrank every coordinate
        # ends with active_size = 0 and the next one restarts with all n and no
        # thresholds, so it steps: the loop ends after n_steps steps.
        pos = sh.active_size
        while step < n_steps:
            if pos >= sh.active_size:
                if shrinking:
                    if in_pass:
                        end_of_pass(&sh, n)
                    in_pass = True
                    # order[:active_size] = rng.permutation(order[:active_size])
                    for i in range(sh.active_size - 1, 0, -1):
                        j = bounded_rand(&state, i + 1)
                        tmp = order[i]
                        order[i] = order[j]
                        order[j] = tmp
                else:
                    shuffle(&order[0], n, &state)
                pos = 0
            j = order[pos]
            if pos + 2 * PREFETCH_AHEAD < sh.active_size and not view.dense:
                HPCMTL_PREFETCH_READ(view.indptr + order[pos + 2 * PREFETCH_AHEAD])
            if pos + PREFETCH_AHEAD < sh.active_size:
                prefetch_row(&view, order[pos + PREFETCH_AHEAD], alpha_p, y_p, sq_p)
            if check_columns:                         # CSR: the row's columns checked as it is read
                ux = checked_row_dot(&view, j, u, &outside)
                if outside:
                    bad_row = j
                    break
            else:
                ux = row_dot(&view, j, u)
            if centered:                              # (x_j - mu) . (u_s - t mu)
                ux = ux - t_mu * xmup[j] - mu_u
            if shrinking:
                b = y[j] * alpha[j]
                G = box_gradient(loss, y[j], b, ux, gamma)
                PG = 0.0
                if b <= 0.0:
                    if G > sh.PGmax_old:
                        sh.active_size -= 1               # shrink: swap with the last active
                        order[pos] = order[sh.active_size]
                        order[sh.active_size] = <int>j
                        continue
                    if G < 0.0:
                        PG = G
                elif b >= 1.0:
                    if G < sh.PGmin_old:
                        sh.active_size -= 1
                        order[pos] = order[sh.active_size]
                        order[sh.active_size] = <int>j
                        continue
                    if G > 0.0:
                        PG = G
                else:
                    PG = G
                if PG > sh.PGmax_new:
                    sh.PGmax_new = PG
                if PG < sh.PGmin_new:
                    sh.PGmin_new = PG
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
        if bad_row < 0:                              # (a bad row: nothing more is written)
            if centered:
                for k in range(d):
                    u[k] -= t_mu * mup[k]                # u = u_s - t mu
            # delta_b = (u - w) lam / (rho sigma): one axpy per step instead of two; the
            # rounding error is about eps |b_i| per round whatever rho sigma / lam is
            c_b = 1.0 / rho_sigma_over_lam
            for k in range(d):
                delta_b[k] = (u[k] - wp[k]) * c_b
            if shrinking:
                if pos >= sh.active_size:
                    end_of_pass(&sh, n)                  # the round ended on a pass boundary
                elif sh.PGmax_new >= sh.PGmin_new:       # mid-pass: keep what this partial pass saw
                    sh.PGmax_old = sh.PGmax_new if sh.PGmax_new > 0.0 else INFINITY
                    sh.PGmin_old = sh.PGmin_new if sh.PGmin_new < 0.0 else -INFINITY
                kept.active_size = sh.active_size
                kept.PGmax_old = sh.PGmax_old
                kept.PGmin_old = sh.PGmin_old
                kept.eps = sh.eps
                memcpy(&shrink_state[0], &kept, sizeof(ShrinkState))
    free(u)
    if bad_row >= 0:
        check_rows(rows, bad_row, bad_row + 1, True)     # raises, naming the index
    return step


def new_shrink_state(Py_ssize_t n, bint enabled):
    """Initial shrinking state of a block (the five doubles of ``ShrinkState``): everything active, no
    thresholds yet, eps = 0.1."""
    cdef ShrinkState s
    s.enabled = 1.0 if enabled else 0.0
    s.active_size = n
    s.PGmax_old = INFINITY
    s.PGmin_old = -INFINITY
    s.eps = 0.1
    out = np.empty(SHRINK_STATE_LENGTH, dtype=np.float64)
    cdef double[::1] o = out
    memcpy(&o[0], &s, sizeof(ShrinkState))
    return out


def objective_terms(Rows rows not None, const double[::1] y, const double[::1] alpha,
                    const double[::1] w, int loss, double gamma, double z_shift=0.0):
    """Return ``(sum_j l(w.x_j - z_shift, y_j), sum_j l*(-alpha_j))`` over a block.

    ``z_shift = mu . w`` scores implicitly centered rows ``x_j - mu`` (the
    squared loss's intercept on CSR rows); 0 for the rows as they are."""
    cdef Py_ssize_t n = y.shape[0], j
    cdef RowView view
    cdef const double* wp
    cdef double loss_sum = 0.0, conj_sum = 0.0
    cdef bint check_columns = not rows.dense
    cdef Py_ssize_t bad_row = -1
    check_rows(rows, 0, n, True, columns=False)     # each CSR row's columns as it is read (as sdca_local)
    check_length("alpha", alpha.shape[0], n)
    check_length("w", w.shape[0], rows.n_features)
    check_loss(loss)
    view = rows.view
    wp = cptr(w)
    with nogil:
        for j in range(n):
            if check_columns and row_columns_outside(&view, j):
                bad_row = j
                break
            loss_sum += primal_loss(loss, row_dot(&view, j, wp) - z_shift, y[j], gamma)
            conj_sum += conjugate_neg(loss, alpha[j], y[j], gamma)
    if bad_row >= 0:
        check_rows(rows, bad_row, bad_row + 1, True)     # raises, naming the index
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
