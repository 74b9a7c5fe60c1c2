# cython: language_level=3
"""Compiled projections of joint sparsity (paper 002, Sec. 4; Duchi et al. 2008): the
caps and removed mass of the l1,inf projection (O(dm log dm) at worst) and the
Euclidean projection onto the l1 ball in expected linear time.

``hpcmtl.projection`` sorts, checks and applies them; the functions here only
compute.  No MPI, no I/O, no NumPy or Python objects in a loop: each public
function checks its arguments, then runs with the GIL released.
"""
from libc.math cimport INFINITY
from libc.stdint cimport uint64_t
from libc.stdlib cimport malloc, free, qsort

from hpcmtl._random cimport bounded_rand

import numpy as np                 # output arrays only, allocated before a kernel runs


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
