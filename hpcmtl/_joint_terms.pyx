# cython: language_level=3
"""Compiled arithmetic of the learned-Sigma problem's outer phases (hpcmtl.dmtrl.joint's accelerated outer
step, hpcmtl.dmtrl.dual_phase's hinge dual phase): each block's terms of one iteration, for one block or for
many blocks in one call (at many tasks the Python around each block would cost more than its arithmetic).
A block's arithmetic is one body, so its bits are the same alone or in any batch.  Like every kernel module:
no MPI, no I/O; each public function checks its arguments, then runs on C pointers.  The losses' values,
slopes and conjugates are ``_losses.pxd``'s, the rows ``_rows.pxd``'s.
"""
from libc.math cimport INFINITY
from libc.stdint cimport int64_t

from hpcmtl._losses cimport (HINGE, SMOOTHED_HINGE, LOGISTIC, check_loss, primal_loss, conjugate_neg, clip01,
                             loss_slope)
from hpcmtl._rows cimport (RowView, Rows, row_dot, row_axpy, cptr, check_rows, check_length, check_shape,
                           hpcmtl_no_doubles)


# ---------------------------------------------------------------------------
# The accelerated outer step (hpcmtl.dmtrl.joint): GRADIENT terms
# ---------------------------------------------------------------------------
cdef void gradient_terms_one(const RowView* view, const double* y, Py_ssize_t n, Py_ssize_t S,
                             const double* wp, const double* we, int loss, double gamma, double shift_prox,
                             double shift_ext, const double* scales, double* gp, double* out) noexcept nogil:
    """:func:`gradient_terms` on one block's checked rows (``gp``: its d gradient entries, ``out``: its S + 4
    scalars): the one body the per-block and the many-block kernels share, so both give the same bits."""
    cdef Py_ssize_t j, k
    cdef double z, slope, a, b, box = 0.0, lin = 0.0, quad = 0.0
    for k in range(S + 4):
        out[k] = 0.0
    if n > 0:
        box = -INFINITY
    for j in range(n):
        out[0] += primal_loss(loss, row_dot(view, j, wp) - shift_prox, y[j], gamma)
        z = row_dot(view, j, we) - shift_ext
        out[1] += primal_loss(loss, z, y[j], gamma)
        slope = loss_slope(loss, z, y[j], gamma)
        out[S + 3] += slope
        if slope != 0.0:
            row_axpy(view, j, slope, gp)
        a = -slope
        if loss == LOGISTIC:
            for k in range(S):
                out[2 + k] += conjugate_neg(loss, scales[k] * a, y[j], gamma)
        else:
            lin += -y[j] * a
            quad += 0.5 * a * a
        b = y[j] * a
        if b > box:
            box = b
    if loss != LOGISTIC:
        if loss == SMOOTHED_HINGE:
            quad *= gamma
        elif loss == HINGE:
            quad = 0.0
        for k in range(S):
            out[2 + k] = scales[k] * lin + scales[k] * scales[k] * quad
    out[S + 2] = box


def gradient_terms(Rows rows not None, const double[::1] y, const double[::1] w_prox, const double[::1] w_ext,
                   int loss, double gamma, double shift_prox, double shift_ext, const double[::1] scales,
                   double[::1] grad, double[::1] scalars):
    """One block's terms of an accelerated outer step: with ``z_j = w_ext . x_j - shift_ext`` and
    ``alpha_j = -l'(z_j)``, adds ``sum_j l'(z_j) x_j`` to ``grad`` (the rows as stored: an implicit centering
    is the caller's, from ``sum_j l'(z_j)``) and writes ``scalars = [sum_j l(w_prox . x_j - shift_prox),
    sum_j l(z_j), sum_j l*(-s alpha_j) for each s of scales, max_j y_j alpha_j (0 without rows),
    sum_j l'(z_j)]``.  The conjugates of the hinge, smoothed hinge and squared losses are ``s lin + s^2 quad``
    in the scale: two sums a row, not one a scale."""
    cdef Py_ssize_t n = y.shape[0], S = scales.shape[0]
    cdef RowView view
    cdef double* gp
    cdef const double* yp
    cdef const double* wp
    cdef const double* we
    cdef const double* sp
    check_rows(rows, 0, n, True)
    check_length("w_prox", w_prox.shape[0], rows.n_features)
    check_length("w_ext", w_ext.shape[0], rows.n_features)
    check_length("grad", grad.shape[0], rows.n_features)
    check_length("scalars", scalars.shape[0], S + 4)
    check_loss(loss)
    view = rows.view
    gp = &grad[0] if grad.shape[0] > 0 else hpcmtl_no_doubles
    yp, wp, we, sp = cptr(y), cptr(w_prox), cptr(w_ext), cptr(scales)
    with nogil:
        gradient_terms_one(&view, yp, n, S, wp, we, loss, gamma, shift_prox, shift_ext, sp, gp, &scalars[0])


cdef check_starts(const int64_t[::1] y_start, Py_ssize_t nb, Py_ssize_t total):
    """The batched kernels' label ranges: ``y_start`` (nb + 1 entries, checked by the caller) runs from 0 to
    ``total`` without decreasing, so block k's labels are ``[y_start[k], y_start[k + 1])``."""
    cdef Py_ssize_t k
    if y_start[0] != 0 or y_start[nb] != total:
        raise ValueError(f"y_start spans {y_start[0]}..{y_start[nb]}, expected 0..{total}")
    for k in range(nb):
        if y_start[k + 1] < y_start[k]:
            raise ValueError(f"y_start decreases at block {k}")


cdef Rows checked_block(list rows, Py_ssize_t k, Py_ssize_t n, Py_ssize_t d):
    """Block k of a batched kernel's ``rows``: a :class:`Rows` of ``n`` rows and ``d`` features."""
    cdef Rows block = rows[k]
    check_rows(block, 0, n, True)
    check_length("block features", block.n_features, d)
    return block


def gradient_terms_blocks(list rows not None, const double[::1] y, const int64_t[::1] y_start,
                          const double[:, ::1] w_prox, const double[:, ::1] w_ext, int loss, double gamma,
                          const double[::1] shift_prox, const double[::1] shift_ext, const double[::1] scales,
                          double[:, ::1] grad, double[:, ::1] scalars):
    """:func:`gradient_terms` of many blocks in one call: block k's rows ``rows[k]`` (all with d =
    ``w_prox.shape[1]`` features), labels ``y[y_start[k]:y_start[k + 1]]`` (the blocks' labels end to end: no
    array a block to take a view of), its ``w_prox[k]``, ``w_ext[k]``, shifts ``shift_prox[k]``,
    ``shift_ext[k]``; its gradient added to ``grad[k]`` and its S + 4 scalars written to ``scalars[k]``.  Each
    block's arithmetic is the per-block kernel's (the same bits, alone or in any batch); only the Python
    around the blocks goes (10^4 small blocks a call: the accelerated outer phase's iterations at many tasks)."""
    cdef Py_ssize_t nb = len(rows), d = w_prox.shape[1], S = scales.shape[0], k, n
    cdef RowView view
    check_length("y_start", y_start.shape[0], nb + 1)
    check_shape("w_prox", w_prox, nb, d)
    check_shape("w_ext", w_ext, nb, d)
    check_shape("grad", grad, nb, d)
    check_shape("scalars", scalars, nb, S + 4)
    check_length("shift_prox", shift_prox.shape[0], nb)
    check_length("shift_ext", shift_ext.shape[0], nb)
    check_loss(loss)
    check_starts(y_start, nb, y.shape[0])
    for k in range(nb):
        n = y_start[k + 1] - y_start[k]
        view = checked_block(rows, k, n, d).view
        gradient_terms_one(&view, &y[y_start[k]] if n > 0 else hpcmtl_no_doubles, n, S,
                           &w_prox[k, 0] if d > 0 else hpcmtl_no_doubles,
                           &w_ext[k, 0] if d > 0 else hpcmtl_no_doubles, loss, gamma, shift_prox[k], shift_ext[k],
                           cptr(scales), &grad[k, 0] if d > 0 else hpcmtl_no_doubles, &scalars[k, 0])


# ---------------------------------------------------------------------------
# The hinge loss's dual phase (hpcmtl.dmtrl.dual_phase): DUAL_TERMS on a worker's blocks
# ---------------------------------------------------------------------------
cdef void dual_terms_one(const RowView* view, const double* y, Py_ssize_t n, const double* w, double shift,
                         double step, double theta, bint accept, double* beta, double* ext, double* trial,
                         double* v, double* out) noexcept nogil:
    """:func:`dual_terms_blocks` on one block's checked rows: its one body, so a block's bits are the same alone
    or in any batch."""
    cdef Py_ssize_t j
    cdef double t, b, e, g, move, u
    cdef double total = 0.0, gdot = 0.0, square = 0.0, restart = 0.0, signed = 0.0
    if accept:                   # commit the previous trial: beta <- trial, ext <- trial + theta (trial - beta)
        for j in range(n):
            t, b = trial[j], beta[j]
            beta[j] = t
            ext[j] = t + theta * (t - b)
    for j in range(n):
        e = ext[j]
        g = 1.0 - y[j] * (row_dot(view, j, w) - shift)
        t = clip01(e + step * g)
        move = t - e
        gdot += g * move
        square += move * move
        restart += (e - t) * (t - beta[j])
        total += t
        u = y[j] * t
        signed += u
        if u != 0.0:
            row_axpy(view, j, u, v)
        trial[j] = t
    out[0], out[1], out[2], out[3], out[4] = total, gdot, square, restart, signed


def dual_terms_blocks(list rows not None, const double[::1] y, const int64_t[::1] y_start, const double[:, ::1] w,
                      const double[::1] shift, const double[:, ::1] control, double[::1] beta, double[::1] ext,
                      double[::1] trial, double[:, ::1] v, double[:, ::1] out):
    """DUAL_TERMS (hpcmtl.dmtrl.dual_phase) of many blocks in one call, their state updated in place: block k's
    rows ``rows[k]`` (all with d = ``w.shape[1]`` features), its labels and state ``y``, ``beta``, ``ext``,
    ``trial`` ``[y_start[k]:y_start[k + 1]]`` (the blocks' end to end), its ``w[k]``, ``shift[k]``,
    ``control[k] = [step, theta, accept]``.  With ``accept`` first ``beta <- trial``, ``ext <- trial + theta
    (trial - beta)``; then, with ``g_j = 1 - y_j (x_j . w - shift)``, ``trial = clip(ext + step g, 0, 1)``;
    ``sum_j y_j trial_j x_j`` is added to ``v[k]`` (the rows as stored: an implicit centering is the caller's, from
    ``out[k, 4]``) and ``out[k] = [sum trial, g . (trial - ext), |trial - ext|^2, (ext - trial) . (trial - beta),
    sum_j y_j trial_j]``.  A block's arithmetic depends on its own values alone (the same bits in any batch or
    alone): the dual phase's iterations at many tasks without the Python around each block."""
    cdef Py_ssize_t nb = len(rows), d = w.shape[1], k, n, total
    cdef RowView view
    check_length("y_start", y_start.shape[0], nb + 1)
    check_shape("v", v, nb, d)
    check_shape("out", out, nb, 5)
    check_shape("control", control, nb, 3)
    check_length("shift", shift.shape[0], nb)
    total = y.shape[0]
    check_starts(y_start, nb, total)
    check_length("beta", beta.shape[0], total)
    check_length("ext", ext.shape[0], total)
    check_length("trial", trial.shape[0], total)
    for k in range(nb):
        n = y_start[k + 1] - y_start[k]
        view = checked_block(rows, k, n, d).view
        dual_terms_one(&view, &y[y_start[k]] if n > 0 else hpcmtl_no_doubles, n,
                       &w[k, 0] if d > 0 else hpcmtl_no_doubles, shift[k], control[k, 0], control[k, 1],
                       control[k, 2] != 0.0, &beta[y_start[k]] if n > 0 else hpcmtl_no_doubles,
                       &ext[y_start[k]] if n > 0 else hpcmtl_no_doubles,
                       &trial[y_start[k]] if n > 0 else hpcmtl_no_doubles,
                       &v[k, 0] if d > 0 else hpcmtl_no_doubles, &out[k, 0])
