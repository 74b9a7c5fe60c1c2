# cython: language_level=3
"""Compiled arithmetic of online multitask learning with a shared loss (paper 004): the tau
solvers and the rounds, in one process or in blocks for the distributed engine.  No
MPI, no I/O, no NumPy or Python objects in a loop: each public function checks its
arguments, then runs with the GIL released.

Every rule sets ``w_j <- w_j + tau_j y_j x_j``; they differ in tau (Fig. 1).  The ids
are the enums below, used by ``hpcmtl.online`` as they are.
"""
from libc.math cimport sqrt, pow as cpow, INFINITY
from libc.stdlib cimport malloc, free, qsort

from hpcmtl._rows cimport RowView, Rows, get_row, cptr2, mptr2, check_rows, check_length, check_shape

import numpy as np                 # output arrays only, allocated before a kernel runs


cpdef enum UpdateId:
    PERCEPTRON = 0                 # finite-horizon Perceptron (Eq. 9)
    INFINITE_HORIZON = 1           # infinite horizon (Eq. 16)
    IMPLICIT = 2                   # implicit (Eq. 23 / Lemma 8)


cpdef enum NormId:
    PNORM = 0                      # p-norm with 1 < p < inf (p = 1 and p = inf arrive as r-max, r = k / r = 1)
    RMAX = 1                       # r-max norm (Eq. 1; its dual is max(||u||_inf, ||u||_1 / r), Eq. 3)


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


def online_rounds(Rows rows not None, bint per_task, const double[:, ::1] Y, double[:, ::1] W,
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
    check_rows(rows, 0, T * k if per_task else T)
    check_shape("W", W, rows.n_features, k)
    check_shape("margins", margins, T, k)
    check_length("global_loss", global_loss.shape[0], T)
    if k == 0:                                   # no task: every loss vector is empty
        global_loss[:] = 0.0
        return
    cdef RowView view = rows.view
    cdef int nnz, a, n_move
    cdef const double* vals
    cdef const int* idx
    cdef double v, s
    cdef double* m
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
                nnz = get_row(&view, t, &vals, &idx)
                row_times_W(vals, idx, nnz, Wp, k, m)
                s = 0.0
                for a in range(nnz):
                    s += vals[a] * vals[a]
                for j in range(k):
                    sq[j] = s
            else:
                for j in range(k):
                    nnz = get_row(&view, t * k + j, &vals, &idx)
                    s = 0.0
                    v = 0.0
                    for a in range(nnz):
                        s += vals[a] * vals[a]
                        v += vals[a] * Wp[<Py_ssize_t>idx[a] * k + j]
                    m[j] = v
                    sq[j] = s
            if not per_task and t + 1 < T and not view.dense:
                prefetch_rows(&view, t + 1, Wp, k)
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
                        nnz = get_row(&view, t * k + j, &vals, &idx)
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
def online_block_margins(Rows rows not None, Py_ssize_t start, const double[:, ::1] W,
                         double[:, ::1] M0):
    """``M0[s] = x_{start+s} @ W`` for the B rows of a block (same summation order as ``online_rounds``)."""
    cdef Py_ssize_t B = M0.shape[0], k = M0.shape[1], s
    cdef int nnz
    cdef const double* vals
    cdef const int* idx
    cdef const double* Wp
    cdef double* m
    if k == 0:
        return
    check_rows(rows, start, start + B)
    check_shape("W", W, rows.n_features, k)
    cdef RowView view = rows.view
    Wp = cptr2(W)
    with nogil:
        for s in range(B):
            m = &M0[s, 0]
            nnz = get_row(&view, start + s, &vals, &idx)
            row_times_W(vals, idx, nnz, Wp, k, m)


def online_block_gram(Rows rows not None, Py_ssize_t start, double[:, ::1] G, double[::1] scratch):
    """``G = X_b X_b^T`` for the B rows of a block; ``scratch`` is a zeroed length-d vector (left zeroed).

    The diagonal is ``||x||^2`` summed in row order, as in ``online_rounds``.
    """
    cdef Py_ssize_t B = G.shape[0], s, s2
    check_rows(rows, start, start + B)
    check_shape("G", G, B, B)
    check_length("scratch", scratch.shape[0], rows.n_features)
    cdef RowView view = rows.view
    cdef int nnz, nnz2, a
    cdef const double* vals
    cdef const int* idx
    cdef const double* vals2
    cdef const int* idx2
    cdef double v
    with nogil:
        for s in range(B):
            nnz = get_row(&view, start + s, &vals, &idx)
            v = 0.0
            for a in range(nnz):
                v += vals[a] * vals[a]
            G[s, s] = v
            for a in range(nnz):
                scratch[idx[a]] = vals[a]
            for s2 in range(s):
                nnz2 = get_row(&view, start + s2, &vals2, &idx2)
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


def online_block_apply(Rows rows not None, Py_ssize_t start, const double[:, ::1] Y,
                       const double[:, ::1] tau, double[:, ::1] W):
    """Worker: ``W += x_s (tau_s * y_s)`` for the block's rounds s in order (local task columns)."""
    cdef Py_ssize_t B = Y.shape[0], k = Y.shape[1], s
    cdef int nnz, n_move
    cdef const double* vals
    cdef const int* idx
    if k == 0:
        return
    check_rows(rows, start, start + B)
    check_shape("tau", tau, B, k)
    check_shape("W", W, rows.n_features, k)
    cdef RowView view = rows.view
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
                nnz = get_row(&view, start + s, &vals, &idx)
                add_scaled_row(Wp, k, vals, idx, nnz, coef, moving, n_move)
    free(coef)
    free(moving)
