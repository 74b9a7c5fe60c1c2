"""Online streams (format ``hpcmtl-stream``): one shared instance a round, k labels.

Layout: ``/X`` CSR (T x d) by rows (``data``, ``indices``, ``indptr``), ``/Y``
(T x k) in {-1, 0, +1}, ``/label_names``, optional ``/truth``; root attributes
``n_rounds``, ``n_features``, ``n_labels`` and the row statistics the online
methods' step sizes read (``max_row_norm``, ``mean_sq_row_norm``,
``mean_active_labels``).  :class:`StreamFile` reads it in chunks of rounds.
"""
from __future__ import annotations

import os

import h5py
import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from ..memory import check_columns
from .atomic import atomic_h5
from .hdf5 import FORMAT_VERSION, STREAM_FORMAT, TRUTH, OpenFile, duplicate_name, open_read, write_array


def write_stream(path, X, Y, label_names=None, truth=None, attrs=None, force=True):
    """Write an online stream (format ``hpcmtl-stream``): public API, the file ``train online --stream`` reads.

    Round t shows instance ``X[t]`` and reveals labels ``Y[t]``: ``/X`` CSR
    (T x d) by rows, ``/Y`` (T x k) in {-1, 0, +1}.  A 0 label marks a dormant
    task on that round (paper 004, Sec. 9): it is neither predicted nor updated.
    A single-label stream over C classes is one-hot (+1 on the round's class,
    -1 on the others), the input of ``train online --code``.

    Parameters
    ----------
    path : str or path-like
        The output file, written under a temporary name and renamed when complete.
    X : (T, d) array or sparse matrix
        One instance a round (stored as CSR float64; every value finite).
    Y : (T, k) array
        Labels in {-1, 0, +1}.
    label_names : list of str, optional
        One unique name a label column (default ``label0``, ``label1``, ...).
    truth : dict of arrays, optional
        Ground truth of synthetic data, stored under ``/truth``.
    attrs : dict, optional
        Extra root attributes (strings or numbers), e.g. the source of the data.
    force : bool
        Overwrite an existing file.

    Raises
    ------
    InputError
        Shapes that do not match, non-finite X, labels outside -1/0/+1,
        repeated label names.
    """
    X = sp.csr_matrix(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    if Y.ndim != 2 or Y.shape[0] != X.shape[0]:
        raise InputError(f"{path}: field 'Y': has shape {Y.shape}, expected ({X.shape[0]}, k)")
    if not (np.all(np.isfinite(X.data)) and np.all(np.isin(Y, (-1.0, 0.0, 1.0)))):
        raise InputError(f"{path}: field 'X' must be finite and 'Y' in -1/0/+1")
    names = [str(n) for n in (label_names if label_names is not None else [f"label{j}" for j in range(Y.shape[1])])]
    dup = duplicate_name(names)
    if dup:
        raise InputError(f"{path}: label name '{dup[0]}' is used by labels #{dup[1]} and #{dup[2]} "
                         f"(label names must be unique)")
    with atomic_h5(path, force=force, what="data file") as f:
        f.attrs["format"] = STREAM_FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["n_rounds"] = X.shape[0]
        f.attrs["n_features"] = X.shape[1]
        f.attrs["n_labels"] = Y.shape[1]
        f.attrs["max_row_norm"] = float(np.sqrt(np.max(np.asarray(X.multiply(X).sum(axis=1))))) if X.shape[0] else 0.0
        f.attrs["mean_sq_row_norm"] = float(np.dot(X.data, X.data) / X.shape[0]) if X.shape[0] else 0.0
        f.attrs["mean_active_labels"] = float(np.count_nonzero(Y) / Y.shape[0]) if Y.shape[0] else 0.0
        for key, value in (attrs or {}).items():
            f.attrs[key] = value
        g = f.create_group("X")
        write_array(g, "data", X.data)
        write_array(g, "indices", X.indices.astype(np.int32))
        write_array(g, "indptr", X.indptr.astype(np.int64))
        f.create_dataset("Y", data=Y, chunks=(min(4096, max(1, Y.shape[0])), Y.shape[1]))
        f.create_dataset("label_names", data=np.array(names, dtype=h5py.string_dtype()))
        if truth:
            t = f.create_group(TRUTH)
            for key, value in truth.items():
                t.create_dataset(key, data=np.asarray(value))


class StreamFile(OpenFile):
    """Read a stream in chunks of rounds (memory bounded by the chunk)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._f = open_read(self.path, STREAM_FORMAT)
        try:
            self._validate()
        except BaseException:
            self.close()
            raise

    def _count(self, name) -> int:
        value = self._f.attrs.get(name)
        value = value.item() if isinstance(value, np.generic) else value
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"{self.path}: attribute '{name}' must be an integer >= 0, got {value!r}")
        return value

    def _dataset(self, name, kinds, what):
        obj = self._f.get(name)
        if isinstance(obj, h5py.Group):
            raise InputError(f"{self.path}: '{name}' is a group, expected a dataset")
        if not isinstance(obj, h5py.Dataset):
            raise InputError(f"{self.path}: missing dataset '{name}' (datasets X/data, X/indices, X/indptr, Y and "
                             f"label_names are required)")
        if kinds is not None and obj.dtype.kind not in kinds:
            raise InputError(f"{self.path}: field '{name}' must hold {what}, has type {obj.dtype}")
        return obj

    def _validate(self):
        """Attributes and datasets by type and shape: one-line InputErrors, never a traceback."""
        self.n_rounds = self._count("n_rounds")
        self.n_features = self._count("n_features")
        self.n_labels = self._count("n_labels")
        if self.n_features < 1:
            raise InputError(f"{self.path}: attribute 'n_features' must be an integer >= 1, got {self.n_features}")
        check_columns(self.n_features, self.path)            # the kernels' int32 columns, before any d-array
        data = self._dataset("X/data", "biuf", "real numbers")
        indices = self._dataset("X/indices", "iu", "integers")
        indptr = self._dataset("X/indptr", "iu", "integers")
        Y = self._dataset("Y", "biuf", "real numbers (-1, 0, +1)")
        names = self._dataset("label_names", None, "names")
        if h5py.check_string_dtype(names.dtype) is None or names.ndim != 1:
            raise InputError(f"{self.path}: field 'label_names' must be a 1-D list of strings")
        self.label_names = [s.decode() if isinstance(s, bytes) else str(s) for s in names[()]]
        if any(d.ndim != 1 for d in (data, indices, indptr)):
            raise InputError(f"{self.path}: field 'X': data, indices and indptr must be 1-D")
        self.nnz = int(indptr[-1]) if indptr.shape[0] else 0
        ok = (indptr.shape == (self.n_rounds + 1,) and Y.shape == (self.n_rounds, self.n_labels)
              and 0 <= self.nnz and data.shape[0] >= self.nnz and indices.shape[0] >= self.nnz)
        if not ok or len(self.label_names) != self.n_labels:
            raise InputError(f"{self.path}: field 'X' or 'Y': shapes do not match n_rounds={self.n_rounds}, "
                             f"n_labels={self.n_labels}")
        dup = duplicate_name(self.label_names)
        if dup:
            raise InputError(f"{self.path}: field 'label_names': label name '{dup[0]}' is used by labels #{dup[1]} "
                             f"and #{dup[2]} (label names must be unique)")

    def info(self) -> dict:
        """Summary for ``hpcmtl data info`` (reads the labels, not the instances)."""
        Y = self._f["Y"][()]
        labels = [{"name": n, "positive": int(np.sum(Y[:, j] == 1)), "negative": int(np.sum(Y[:, j] == -1)),
                   "dormant": int(np.sum(Y[:, j] == 0))} for j, n in enumerate(self.label_names)]
        return {"path": self.path, "format": STREAM_FORMAT, "n_rounds": self.n_rounds, "n_features": self.n_features,
                "n_labels": self.n_labels, "nnz": self.nnz, "max_row_norm": self.max_row_norm(),
                "positive_labels_per_round": float(np.sum(Y == 1) / max(1, self.n_rounds)), "labels": labels}

    def max_row_norm(self, chunk=65536) -> float:
        """Largest ||x_t|| of the stream (stored by write_stream; computed in chunks for older files)."""
        if "max_row_norm" in self._f.attrs:
            return float(self._f.attrs["max_row_norm"])
        best = 0.0
        for start in range(0, self.n_rounds, chunk):
            X, _ = self.read_rounds(start, min(self.n_rounds, start + chunk))
            if X.shape[0]:
                best = max(best, float(np.sqrt(np.max(np.asarray(X.multiply(X).sum(axis=1))))))
        return best

    def mean_sq_row_norm(self, chunk=1 << 22) -> float:
        """Mean ||x_t||^2 over the rounds (stored by write_stream; summed in chunks of values for older files)."""
        if "mean_sq_row_norm" in self._f.attrs:
            return float(self._f.attrs["mean_sq_row_norm"])
        data, total = self._f["X"]["data"], 0.0
        for start in range(0, self.nnz, chunk):
            values = np.asarray(data[start:min(self.nnz, start + chunk)], dtype=np.float64)
            total += float(np.dot(values, values))
        return total / max(1, self.n_rounds)

    def mean_active_labels(self, chunk=65536) -> float:
        """Mean number of non-dormant labels a round (stored by write_stream; counted in chunks for older files)."""
        if "mean_active_labels" in self._f.attrs:
            return float(self._f.attrs["mean_active_labels"])
        active = sum(int(np.count_nonzero(self.read_labels(start, min(self.n_rounds, start + chunk))))
                     for start in range(0, self.n_rounds, chunk))
        return active / max(1, self.n_rounds)

    def read_rounds(self, start: int, stop: int):
        """Rounds ``start:stop`` as (CSR instances, labels), validated (one-line errors naming the round)."""
        g = self._f["X"]
        try:
            indptr = g["indptr"][start:stop + 1].astype(np.int64)
            lo, hi = int(indptr[0]), int(indptr[-1])
            if np.any(np.diff(indptr) < 0) or hi > g["data"].shape[0]:
                raise InputError(f"{self.path}: field 'X/indptr': not a valid CSR row pointer in rounds {start}..{stop - 1}")
            data, indices = g["data"][lo:hi], g["indices"][lo:hi]
        except (OSError, ValueError) as exc:
            raise InputError(f"{self.path}: cannot read rounds {start}..{stop - 1}: {exc}") from None
        if indices.size and (indices.min() < 0 or indices.max() >= self.n_features):
            raise InputError(f"{self.path}: field 'X/indices': column index outside 0..{self.n_features - 1} "
                             f"in rounds {start}..{stop - 1}")
        if not np.all(np.isfinite(data)):
            bad = int(np.searchsorted(indptr, lo + int(np.argmax(~np.isfinite(data))), side="right")) - 1
            raise InputError(f"{self.path}: field 'X': NaN or Inf in round {start + bad}")
        X = sp.csr_matrix((data, indices, indptr - lo), shape=(stop - start, self.n_features))
        return X, self.read_labels(start, stop)

    def read_labels(self, start: int, stop: int):
        Y = self._f["Y"][start:stop]
        bad = ~np.isin(Y, (-1.0, 0.0, 1.0))
        if np.any(bad):
            t = int(np.argmax(bad.any(axis=1)))
            raise InputError(f"{self.path}: field 'Y': round {start + t} has a label other than -1, 0, +1")
        return np.asarray(Y, dtype=np.float64)

    def chunks(self, size: int):
        for start in range(0, self.n_rounds, size):
            stop = min(self.n_rounds, start + size)
            X, Y = self.read_rounds(start, stop)
            yield start, X, Y


def load_stream(path):
    """``(X, Y, label_names)`` of a whole online stream: the public loader behind :func:`hpcmtl.load_stream`.

    ``X`` is the T x d CSR matrix of the rounds' instances, ``Y`` the T x k labels in
    -1/0/+1 (0: dormant), ``label_names`` the k column names: what
    ``OnlineMultitask.fit(X, Y)`` takes.  Validated as training reads it.
    """
    with StreamFile(path) as f:
        X, Y = f.read_rounds(0, f.n_rounds)
        return X, Y, list(f.label_names)
