# cython: language_level=3
"""``Rows``: a block's rows in the kernels' row interface (see ``_rows.pxd``)."""
from libc.stdint cimport int64_t

cdef int NO_INTS[1]
cdef int64_t NO_OFFSETS[1]


cdef class Rows:
    """A dense or CSR block of rows as the compiled kernels take it (build it with ``taskdata.rows_of``).

    Dense: ``data`` is the row-major ``n x d`` values, ``indices`` the shared
    ``0..d-1``, ``indptr`` unused.  CSR: ``data``, ``indices``, ``indptr`` of the
    matrix.  Every argument is keyword-only; the arrays are held (not copied)
    and each kernel checks the rows it reads, so a malformed block is a
    ValueError at the call, never a bad read.
    """

    def __cinit__(self, *, const double[::1] data not None, const int[::1] indices not None,
                  const int64_t[::1] indptr not None, bint dense, int n_features):
        self.data = data
        self.indices = indices
        self.indptr = indptr
        self.dense = dense
        self.n_features = n_features
        self.view.data = &data[0] if data.shape[0] > 0 else hpcmtl_no_doubles
        self.view.indices = &indices[0] if indices.shape[0] > 0 else NO_INTS
        self.view.indptr = &indptr[0] if indptr.shape[0] > 0 else NO_OFFSETS
        self.view.dense = dense
        self.view.n_features = n_features

    @property
    def nbytes(self):
        """Bytes of the three arrays."""
        return self.data.nbytes + self.indices.nbytes + self.indptr.nbytes

    def __repr__(self):
        kind = "dense" if self.dense else "CSR"
        return f"Rows({kind}, n_features={self.n_features}, {self.data.shape[0]} values)"
