# cython: language_level=3
"""The row interface of the compiled kernels (``_sdca``, ``_blockops``, ``_online``) and their shared
checks (also ``_box_qp``'s).

A block's rows come through one struct, ``RowView``, whether the block is dense
or CSR: a dense row is ``(shared 0..d-1 indices, X[i], d)``, a CSR row is
``(indices[indptr[i]:indptr[i+1]], data[...], nnz)`` (``row_span``), so every
solver loop is written once.

Values are float64 or float32 (``Rows.single``): the view holds one typed
pointer per dtype (the other points at an empty dummy).  The loops over a
row's entries (``sparse_dot``, ``sparse_axpy``, ``sparse_sq``) are written once
over Cython's fused ``floating`` type, so the compiler emits a float and a
double version of each; ``row_dot``, ``row_axpy`` and ``row_sq_norm`` pick one
per row (a branch per row, never per entry).  Every product and sum is in
double: a float32 value is widened exactly when it is loaded, so a kernel on
float32 rows gives the bits it gives on the same values stored as float64.
``get_row`` (float64 values only) is what ``_online`` uses; its kernels refuse
float32 rows in ``check_rows``.

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
from cython cimport floating
from libc.stdint cimport int64_t

cdef extern from *:
    """
    /* What an empty array points at: a real object (never NULL, never &a[0] of a
       zero-length view), so p + 0 is defined and nothing is read. */
    static double hpcmtl_no_doubles[1];
    #if defined(__GNUC__)
    __attribute__((unused))
    #endif
    static float hpcmtl_no_floats[1];
    """
    double hpcmtl_no_doubles[1]
    float hpcmtl_no_floats[1]


cdef struct RowView:
    const double* data        # float64 values (dense: n x d row-major; CSR: data); a dummy when single
    const float* data32       # float32 values, the same layout; a dummy unless single
    const int* indices        # dense: shared 0..d-1; CSR: column indices
    const int64_t* indptr     # CSR row pointers (unused when dense)
    int dense
    int single                # 1: the values are float32 (data32)
    int n_features


cdef class Rows:
    cdef readonly object data                 # the values (a float64 or float32 view of the array given)
    cdef const double[::1] data64
    cdef const float[::1] data32
    cdef readonly const int[::1] indices
    cdef readonly const int64_t[::1] indptr
    cdef readonly bint dense
    cdef readonly bint single                 # float32 values
    cdef readonly Py_ssize_t n_values
    cdef readonly int n_features
    cdef RowView view                 # pointers into the arrays above (held, so never moved)


cdef inline int row_span(const RowView* rows, Py_ssize_t i, int64_t* start, const int** idx) noexcept nogil:
    """Set ``start`` to the offset of row ``i``'s first value and ``idx`` to its indices; return its entries."""
    if rows.dense:
        start[0] = i * rows.n_features
        idx[0] = rows.indices
        return rows.n_features
    start[0] = rows.indptr[i]
    idx[0] = rows.indices + start[0]
    return <int>(rows.indptr[i + 1] - start[0])


cdef inline int get_row(const RowView* rows, Py_ssize_t i,
                        const double** values, const int** idx) noexcept nogil:
    """Point ``values``/``idx`` at row ``i`` of float64 rows; return its number of entries."""
    cdef int64_t start
    cdef int nnz = row_span(rows, i, &start, idx)
    values[0] = rows.data + start
    return nnz


# UNROLL.  The loops over a row's entries (sparse_dot, checked_sparse_dot, sparse_axpy) take four entries a
# turn and walk the two pointers: the same operations in the same order as one entry a turn (the sums are the
# left-to-right ones, a repeated column is added twice in row order), so no result changes by a bit.  A local
# SDCA step is mostly these loops, and a turn of four costs about half the instructions of four turns of one:
# with a 32-bit counter under Python's -fwrapv every `values[k + 1]` paid a sign extension, and the loop's own
# increment, compare and branch came once an entry (bench/bench_local_sdca.py; docs/architecture.md).
cdef inline double sparse_dot(const floating* values, const int* idx, int nnz,
                              const double* w) noexcept nogil:
    # np.dot(x_row, w), in double, summed left to right; four entries a turn of the loop (UNROLL)
    cdef double s = 0.0
    cdef Py_ssize_t k = nnz                  # entries left (the pointers walk the row)
    while k >= 4:
        s += values[0] * w[idx[0]]
        s += values[1] * w[idx[1]]
        s += values[2] * w[idx[2]]
        s += values[3] * w[idx[3]]
        values += 4
        idx += 4
        k -= 4
    while k > 0:
        s += values[0] * w[idx[0]]
        values += 1
        idx += 1
        k -= 1
    return s


cdef inline void sparse_axpy(double c, const floating* values, const int* idx, int nnz,
                             double* out) noexcept nogil:
    # out[idx] += c * x_row, in double, entry by entry in row order (a column repeated in the row is added
    # twice, in that order); four entries a turn of the loop (UNROLL)
    cdef Py_ssize_t k = nnz                  # entries left (the pointers walk the row)
    while k >= 4:
        out[idx[0]] += c * values[0]
        out[idx[1]] += c * values[1]
        out[idx[2]] += c * values[2]
        out[idx[3]] += c * values[3]
        values += 4
        idx += 4
        k -= 4
    while k > 0:
        out[idx[0]] += c * values[0]
        values += 1
        idx += 1
        k -= 1


cdef inline double sparse_sq(const floating* values, int nnz) noexcept nogil:
    # np.dot(x_row, x_row), in double
    cdef double s = 0.0, v
    cdef int k
    for k in range(nnz):
        v = values[k]
        s += v * v
    return s


cdef inline double row_dot(const RowView* rows, Py_ssize_t i, const double* w) noexcept nogil:
    """``x_i . w`` of row ``i`` (either dtype)."""
    cdef int64_t start
    cdef const int* idx
    cdef int nnz = row_span(rows, i, &start, &idx)
    if rows.single:
        return sparse_dot(rows.data32 + start, idx, nnz, w)
    return sparse_dot(rows.data + start, idx, nnz, w)


cdef inline double checked_sparse_dot(const floating* values, const int* idx, int nnz, const double* w, int d,
                                     int* outside) noexcept nogil:
    """``sparse_dot`` (the same operations in the same order) that also sets ``outside`` when a column index is
    outside ``0..d-1``: the loop stops at the first such index, before it reads ``w`` with it, and the caller
    drops the sum.  The check rides on the index loads of the product instead of a pass of its own over the row
    before it (``row_columns_outside``): local SDCA reads every CSR row it visits this way.  An entry's check is
    one compare and a branch that is never taken on good rows (UNROLL: a flag and a guarded index an entry cost
    about twice the instructions of the product itself)."""
    cdef double s = 0.0
    cdef unsigned int c, n = <unsigned int>d        # (a negative index wraps to a large one: outside too)
    cdef Py_ssize_t k = nnz                         # entries left (the pointers walk the row)
    outside[0] = 1
    while k >= 4:
        c = <unsigned int>idx[0]
        if c >= n:
            return 0.0
        s += values[0] * w[c]
        c = <unsigned int>idx[1]
        if c >= n:
            return 0.0
        s += values[1] * w[c]
        c = <unsigned int>idx[2]
        if c >= n:
            return 0.0
        s += values[2] * w[c]
        c = <unsigned int>idx[3]
        if c >= n:
            return 0.0
        s += values[3] * w[c]
        values += 4
        idx += 4
        k -= 4
    while k > 0:
        c = <unsigned int>idx[0]
        if c >= n:
            return 0.0
        s += values[0] * w[c]
        values += 1
        idx += 1
        k -= 1
    outside[0] = 0
    return s


cdef inline double checked_row_dot(const RowView* rows, Py_ssize_t i, const double* w, int* outside) noexcept nogil:
    """``row_dot`` of CSR row ``i`` with its column check (:func:`checked_sparse_dot`)."""
    cdef int64_t start
    cdef const int* idx
    cdef int nnz = row_span(rows, i, &start, &idx)
    if rows.single:
        return checked_sparse_dot(rows.data32 + start, idx, nnz, w, rows.n_features, outside)
    return checked_sparse_dot(rows.data + start, idx, nnz, w, rows.n_features, outside)


cdef inline void row_axpy(const RowView* rows, Py_ssize_t i, double c, double* out) noexcept nogil:
    """``out += c x_i`` over row ``i``'s entries (either dtype)."""
    cdef int64_t start
    cdef const int* idx
    cdef int nnz = row_span(rows, i, &start, &idx)
    if rows.single:
        sparse_axpy(c, rows.data32 + start, idx, nnz, out)
    else:
        sparse_axpy(c, rows.data + start, idx, nnz, out)


cdef inline double row_sq_norm(const RowView* rows, Py_ssize_t i) noexcept nogil:
    """``||x_i||^2`` (either dtype)."""
    cdef int64_t start
    cdef const int* idx
    cdef int nnz = row_span(rows, i, &start, &idx)
    if rows.single:
        return sparse_sq(rows.data32 + start, nnz)
    return sparse_sq(rows.data + start, nnz)


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


cdef inline bint csr_indices_outside(const int* indices, Py_ssize_t count, int n_features) noexcept nogil:
    """Whether any of ``indices[:count]`` is outside ``0..n_features-1``.

    Every entry is read, with no exit and no branch in the loop, so the compiler vectorizes it (an
    early-exit loop over a block's column indices cost about a sixth of a local SDCA pass over 50k x 20k
    CSR rows, bench/bench_local_sdca.py)."""
    cdef int outside = 0
    cdef Py_ssize_t p
    for p in range(count):
        outside |= (indices[p] < 0) | (indices[p] >= n_features)
    return outside != 0


cdef inline bint row_columns_outside(const RowView* rows, Py_ssize_t i) noexcept nogil:
    """Whether a column index of CSR row ``i`` is outside ``0..n_features-1`` (its ``indptr`` checked): what a
    kernel that passed ``columns=False`` to :func:`check_rows` asks before it reads a row's columns."""
    cdef int64_t start
    cdef const int* idx
    cdef int nnz = row_span(rows, i, &start, &idx)
    return csr_indices_outside(idx, nnz, rows.n_features)


cdef inline int check_rows(Rows rows, Py_ssize_t start, Py_ssize_t stop, bint float32_ok=False,
                           bint columns=True) except -1:
    """Raise ValueError unless rows ``start..stop-1`` exist with every column in ``0..n_features-1``.

    Float32 rows only where the caller reads them through ``row_dot`` /
    ``row_axpy`` / ``row_sq_norm`` (``float32_ok``): ``get_row`` reads float64.

    Dense: ``data`` holds ``stop x n_features`` values and ``indices`` is ``0..d-1``
    (O(d)).  CSR: ``indptr[start..stop]`` is non-decreasing inside ``data`` and
    ``indices``, and each of those rows' column indices is in range (O(rows + nnz)).
    ``columns=False`` leaves the CSR column indices out (O(rows)): for a kernel that checks each
    row's with :func:`row_columns_outside` before it reads them, while the row is in cache anyway
    (a scan of all of them streams 4 bytes a non-zero through memory once more a call).
    (A ``Rows`` argument typed ``not None`` by the caller: None never gets here.)
    """
    cdef Py_ssize_t n_values = rows.n_values
    cdef const int[::1] indices = rows.indices
    cdef const int64_t[::1] indptr = rows.indptr
    cdef int n_features = rows.n_features
    cdef Py_ssize_t i, p = 0, lo, hi
    cdef int bad = 0
    if rows.single and not float32_ok:
        raise ValueError("rows: this kernel takes float64 values, not float32")
    if n_features < 0:
        raise ValueError(f"rows: n_features must be >= 0. Got {n_features} instead.")
    if start < 0 or stop < start:
        raise ValueError(f"rows: bad row range {start}..{stop}")
    if rows.dense:
        if indices.shape[0] != n_features:
            raise ValueError(f"dense rows: the shared index array has {indices.shape[0]} entries, "
                             f"expected n_features = {n_features}")
        if n_features > 0 and n_values // n_features < stop:
            raise ValueError(f"dense rows: {n_values} values hold fewer than {stop} rows "
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
    if lo < 0 or hi > n_values or hi > indices.shape[0]:
        raise ValueError(f"CSR rows: indptr points outside data ({n_values}) or indices "
                         f"({indices.shape[0]})")
    with nogil:
        for i in range(start, stop):
            if indptr[i + 1] < indptr[i]:
                bad = 1
                break
        if not bad and columns and hi > lo and csr_indices_outside(&indices[lo], hi - lo, n_features):
            for p in range(lo, hi):              # (only to name the first bad index)
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
