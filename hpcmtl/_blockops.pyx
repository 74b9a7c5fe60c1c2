# cython: language_level=3
"""Compiled sums over a block's rows and vectors, each in one fixed order: ``||x_j||^2``
per row, ``X^T v`` over the rows a sparse ``v`` moves, and a dot product with one
accumulator in index order.

Used by the task data (``hpcmtl.taskdata``: squared norms, centering, the box
momentum's ``X^T q``), the server and the interior-point rounds, wherever a
result must not depend on how BLAS splits a sum.  Dense and CSR rows, float64
or float32, come through ``_rows.pxd``; every sum is in double.  Each public
function checks its arguments, then runs with the GIL released where it loops
over rows.
"""
from hpcmtl._rows cimport RowView, Rows, row_axpy, row_sq_norm, check_rows, check_length

import numpy as np                 # output arrays only, allocated before a kernel runs


def ordered_dot(const double[::1] a, const double[::1] b):
    """``sum_k a[k] b[k]`` with one accumulator, in index order.

    Exact zeros between the terms leave the sum's bits alone, so a d-vector and
    its values on a support (the same order, the zeros dropped) give the same
    result: the compact blocks of the support exchange score and center in the
    dense exchange's bits.  (BLAS dot products split the sum by position and
    length, so they do not.)
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
