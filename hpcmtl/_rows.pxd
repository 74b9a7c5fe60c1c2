# cython: language_level=3
"""The row interface of the compiled kernels (``_kernels`` and ``_online``) and their shared checks.

A block's rows come through one struct, ``RowView``, whether the block is dense
or CSR: a dense row is ``(shared 0..d-1 indices, X[i], d)``, a CSR row is
``(indices[indptr[i]:indptr[i+1]], data[...], nnz)`` (``get_row``), so every
solver loop is written once.

Python holds a block's rows as one ``Rows`` object, built once per block by
``hpcmtl.taskdata.rows_of``: the three arrays (given by keyword, so two cannot be
swapped unnoticed) and the ``RowView`` over them.  A struct of pointers cannot
itself cross the Python boundary (Cython converts only pointer-free structs, and
nothing would keep the arrays alive), hence the small extension type around it.
Each kernel checks the rows it is given (``check_rows``) and copies ``rows.view``
before it releases the GIL.

Everything here except the ``Rows`` type itself (``_rows.pyx``) is ``inline``:
it compiles into each kernel module with that module's directives, so the
bounds-checked build (``HPCMTL_DEBUG_KERNELS=1``, see setup.py) checks it too.
"""
from libc.stdint cimport int64_t

cdef extern from *:
    """
    /* What an empty array points at: a real object (never NULL, never &a[0] of a
       zero-length view), so p + 0 is defined and nothing is read. */
    static double hpcmtl_no_doubles[1];
    """
    double hpcmtl_no_doubles[1]


cdef struct RowView:
    const double* data        # dense: n x d row-major values; CSR: data
    const int* indices        # dense: shared 0..d-1; CSR: column indices
    const int64_t* indptr     # CSR row pointers (unused when dense)
    int dense
    int n_features


cdef class Rows:
    cdef readonly const double[::1] data
    cdef readonly const int[::1] indices
    cdef readonly const int64_t[::1] indptr
    cdef readonly bint dense
    cdef readonly int n_features
    cdef RowView view                 # pointers into the three arrays above (held, so never moved)


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
# Input checks.  The kernel loops run without bounds checks, so every public
# kernel checks shapes, ids and the row structure with these, before it releases
# the GIL: no index computed inside a loop can then leave its array.
# ---------------------------------------------------------------------------
cdef inline const double* cptr(const double[::1] a) noexcept:
    return &a[0] if a.shape[0] > 0 else hpcmtl_no_doubles


cdef inline double* mptr2(double[:, ::1] a) noexcept:
    return &a[0, 0] if a.shape[0] > 0 and a.shape[1] > 0 else hpcmtl_no_doubles


cdef inline const double* cptr2(const double[:, ::1] a) noexcept:
    return &a[0, 0] if a.shape[0] > 0 and a.shape[1] > 0 else hpcmtl_no_doubles


cdef inline int check_rows(Rows rows, Py_ssize_t start, Py_ssize_t stop) except -1:
    """Raise ValueError unless rows ``start..stop-1`` exist with every column in ``0..n_features-1``.

    Dense: ``data`` holds ``stop x n_features`` values and ``indices`` is ``0..d-1``
    (O(d)).  CSR: ``indptr[start..stop]`` is non-decreasing inside ``data`` and
    ``indices``, and each of those rows' column indices is in range (O(rows + nnz)).
    (A ``Rows`` argument typed ``not None`` by the caller: None never gets here.)
    """
    cdef const double[::1] data = rows.data
    cdef const int[::1] indices = rows.indices
    cdef const int64_t[::1] indptr = rows.indptr
    cdef int n_features = rows.n_features
    cdef Py_ssize_t i, p = 0, lo, hi
    cdef int bad = 0
    if n_features < 0:
        raise ValueError(f"rows: n_features must be >= 0. Got {n_features} instead.")
    if start < 0 or stop < start:
        raise ValueError(f"rows: bad row range {start}..{stop}")
    if rows.dense:
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


cdef inline int check_length(str name, Py_ssize_t got, Py_ssize_t expected) except -1:
    if got != expected:
        raise ValueError(f"{name} has length {got}, expected {expected}")
    return 0


cdef inline int check_shape(str name, const double[:, ::1] a, Py_ssize_t rows, Py_ssize_t cols) except -1:
    if a.shape[0] != rows or a.shape[1] != cols:
        raise ValueError(f"{name} has shape ({a.shape[0]}, {a.shape[1]}), expected ({rows}, {cols})")
    return 0
