# cython: language_level=3
"""``Rows``: a block's rows in the kernels' row interface (see ``_rows.pxd``)."""
from libc.stdint cimport int64_t

cdef int NO_INTS[1]
cdef int64_t NO_OFFSETS[1]


cdef class Rows:
    """A dense or CSR block of rows as the compiled kernels take it (build it with ``taskdata.rows_of``).

    Dense: ``data`` is the row-major ``n x d`` values, ``indices`` the shared
    ``0..d-1``, ``indptr`` unused.  CSR: ``data``, ``indices``, ``indptr`` of the
    matrix.  ``data`` is float64 or float32 (``single``); the kernels of
    ``_sdca`` and ``_blockops`` read both (in double arithmetic), those of
    ``_online`` only float64.  Every argument is keyword-only; the arrays are held (not copied)
    and each kernel checks the rows it reads, so a malformed block is a
    ValueError at the call, never a bad read.
    """

    def __cinit__(self, *, data not None, const int[::1] indices not None,
                  const int64_t[::1] indptr not None, bint dense, int n_features):
        cdef const float[::1] d32
        cdef const double[::1] d64
        try:
            d64 = data
            self.single = False
        except (ValueError, TypeError):
            try:
                d32 = data
            except (ValueError, TypeError):
                raise ValueError(f"rows: data must be contiguous float64 or float32 values, "
                                 f"got {getattr(data, 'dtype', type(data).__name__)}") from None
            self.single = True
        if self.single:
            self.data32 = d32
            self.data = d32
            self.n_values = d32.shape[0]
            self.view.data = hpcmtl_no_doubles
            self.view.data32 = &d32[0] if d32.shape[0] > 0 else hpcmtl_no_floats
        else:
            self.data64 = d64
            self.data = d64
            self.n_values = d64.shape[0]
            self.view.data = &d64[0] if d64.shape[0] > 0 else hpcmtl_no_doubles
            self.view.data32 = hpcmtl_no_floats
        self.indices = indices
        self.indptr = indptr
        self.dense = dense
        self.n_features = n_features
        self.view.indices = &indices[0] if indices.shape[0] > 0 else NO_INTS
        self.view.indptr = &indptr[0] if indptr.shape[0] > 0 else NO_OFFSETS
        self.view.dense = dense
        self.view.single = self.single
        self.view.n_features = n_features

    @property
    def dtype(self):
        """``"float32"`` or ``"float64"``: the values' type."""
        return "float32" if self.single else "float64"

    @property
    def nbytes(self):
        """Bytes of the three arrays."""
        return self.n_values * (4 if self.single else 8) + self.indices.nbytes + self.indptr.nbytes

    def __repr__(self):
        kind = "dense" if self.dense else "CSR"
        return f"Rows({kind}, {self.dtype}, n_features={self.n_features}, {self.n_values} values)"
