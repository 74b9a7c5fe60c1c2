"""Content fingerprints of task data: additive 128-bit hashes of (row, column, value bits).

Every task's arrays (``X`` or the CSR arrays, and ``y``) have a 128-bit
fingerprint, stored in the task table's ``fingerprint`` column when the file
is written and computed again, in the same pass, whenever a task's rows are
read (:func:`fingerprint_rows`).  It is a sum over elements of a mixed hash of
(row, column, value bits), so the fingerprints of row ranges read on different
ranks add up to the task's (a split task is verified too,
:func:`combine_fingerprints`).  Files written before fingerprints existed load
as before: the fingerprint is computed from what is read (see
:mod:`hpcmtl.checkpoint`).

A float32 element is hashed from its 32 IEEE bits tagged with a NaN pattern in
the upper half (``_F32_TAG``), so its fingerprint differs from the same values
stored as float64 (whose finite elements never carry those bits): a checkpoint
resume cannot mistake a float32 file for its float64 original.  Labels are
hashed as float64.

Pure NumPy: no file is touched here.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_Y_SALT = np.uint64(0xD6E8FEB86659FD93)
MASK64 = (1 << 64) - 1      # the sums wrap modulo 2**64
_F32_TAG = np.uint64(0x7FF8F32F00000000)     # float32 bits sit in the low half under a float64 NaN pattern
_CHUNK = 1 << 16          # elements hashed at a time: temporaries of 0.5 MB, whatever the block


def _mix(z):
    """splitmix64's finalizer, in place on a uint64 array (arithmetic wraps modulo 2**64)."""
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


def _element_sum(rows, cols, bits, n_features) -> int:
    """sum_e mix((row_e * d + col_e) * golden ^ bits_e) mod 2**64 over equally long uint64 arrays."""
    key = rows * np.uint64(n_features) + cols      # broadcasts (rows x 1) + (1 x d) for dense blocks
    key *= _GOLDEN
    key ^= bits
    return int(_mix(key).sum(dtype=np.uint64))


def fingerprint_rows(X, y, row_start: int, n_features: int):
    """Additive content fingerprint of rows ``row_start ..`` of a task: ``(x_sum, y_sum)``.

    Every stored element of ``X`` (dense: all of them; CSR: the stored
    entries) and every label contributes a 64-bit mixed hash of (global row,
    column, IEEE bits) to a sum modulo 2**64, so the sums of row ranges add up
    to the task's (:func:`fingerprint_hex`).  Hashed ``_CHUNK`` elements at a time.
    """
    total = 0
    if sp.issparse(X):
        data = X.data
        indices, indptr = np.asarray(X.indices), np.asarray(X.indptr, dtype=np.int64)
        for s in range(0, data.size, _CHUNK):
            e = slice(s, s + _CHUNK)
            stop = min(s + _CHUNK, data.size)
            r0 = int(np.searchsorted(indptr, s, side="right")) - 1             # rows holding entries s..stop-1
            r1 = int(np.searchsorted(indptr, stop - 1, side="right"))
            counts = np.diff(np.clip(indptr[r0:r1 + 1], s, stop))
            rows = np.repeat(np.arange(row_start + r0, row_start + r1, dtype=np.uint64), counts)
            total += _element_sum(rows, indices[e].astype(np.uint64), _value_bits(data[e]), n_features)
    else:
        X = np.asarray(X)
        cols = np.arange(X.shape[1], dtype=np.uint64)
        step = max(1, _CHUNK // max(1, X.shape[1]))
        for s in range(0, X.shape[0], step):
            b = _value_bits(X[s:s + step])
            rows = np.arange(row_start + s, row_start + s + b.shape[0], dtype=np.uint64)[:, None]
            total += _element_sum(rows, cols[None, :], b, n_features)
    ybits = np.ascontiguousarray(y, dtype=np.float64).view(np.uint64)
    key = np.arange(row_start, row_start + ybits.size, dtype=np.uint64)
    key *= _GOLDEN
    key += _Y_SALT
    key ^= ybits
    return total & MASK64, int(_mix(key).sum(dtype=np.uint64))


def _value_bits(values) -> np.ndarray:
    """uint64 keys of feature values: float64 bits, or float32 bits under ``_F32_TAG``."""
    values = np.asarray(values)
    if values.dtype == np.float32:
        return np.ascontiguousarray(values).view(np.uint32).astype(np.uint64) | _F32_TAG
    return np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)


def fingerprint_hex(x_sum: int, y_sum: int) -> str:
    """The fingerprint as 32 hex digits (features, then labels)."""
    return f"{x_sum & MASK64:016x}{y_sum & MASK64:016x}"


def combine_fingerprints(parts, n_rows: int) -> str | None:
    """A task's fingerprint from ``(start, stop, x_sum, y_sum)`` of row ranges covering ``0..n_rows`` once.

    None when the ranges do not cover the task exactly (nothing to compare with).
    """
    whole = [p for p in parts if p[0] == 0 and p[1] == n_rows]
    if whole:                       # the task was read in one piece (perhaps besides its blocks)
        return fingerprint_hex(whole[0][2], whole[0][3])
    x = y = pos = 0
    for start, stop, xs, ys in sorted(parts):
        if start != pos:
            return None
        x, y, pos = x + xs, y + ys, stop
    return fingerprint_hex(x, y) if pos == n_rows else None
