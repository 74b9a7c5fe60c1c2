# cython: language_level=3
"""The kernels' random numbers: splitmix64, seeded once from Python per (seed, task, round).

``splitmix64`` advances a 64-bit state and returns the next output;
``bounded_rand`` maps one output to a uniform integer in ``[0, n)``.  Both are
``inline``, as everything in ``_rows.pxd`` is: they compile into each kernel
module (``_sdca``, ``_projections``) with that module's directives, and a given
seed gives the same stream in every module and build.
"""
from libc.stdint cimport uint64_t


cdef inline uint64_t splitmix64(uint64_t* state) noexcept nogil:
    cdef uint64_t z
    state[0] += <uint64_t>0x9E3779B97F4A7C15ULL
    z = state[0]
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline Py_ssize_t bounded_rand(uint64_t* state, Py_ssize_t n) noexcept nogil:
    # uniform integer in [0, n): top 53 bits scaled (bias < 2^-53 n)
    return <Py_ssize_t>((splitmix64(state) >> 11) * (1.0 / 9007199254740992.0) * n)
