# cython: language_level=3
"""Compiled box QP of DMTRL's aggregation steps: ``argmax g.x - x.A.x / 2`` over
``0 <= x <= upper`` for the server's dense m x m (or 2m x 2m) systems, by the
active-set Newton method that ``hpcmtl.dmtrl.box_qp`` documents and calls.

Dense algebra only (Cholesky and triangular solves written out, LAPACK's dsyev
through SciPy's ``cython_lapack`` for a nearly singular free block): fixed
operations in a fixed order, so the answer is deterministic.  The function
checks its arguments, allocates its workspace, then runs with the GIL released.
"""
from libc.math cimport fabs, sqrt, INFINITY
from scipy.linalg.cython_lapack cimport dsyev

from hpcmtl._rows cimport check_length, check_shape

import numpy as np                 # workspace arrays only, allocated before the iterations run


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
    # singular (min L_jj^2 < 1e-12 max_j A_FjFj): box_qp then steps from the block's eigendecomposition
    # (symmetric_eigen), as the NumPy reference of the method (tests/reference.py, box_qp_reference) does
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
    cdef bint ray
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
