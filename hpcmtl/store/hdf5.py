"""What every file of the store shares: the format names, opening a file for reading, probing a file.

Every file the store writes is HDF5 with two root attributes, ``format``
(one of the ``*_FORMAT`` names below) and ``format_version``
(:data:`FORMAT_VERSION`); :func:`open_read` refuses a file whose attributes
say otherwise, in one line naming the file.  :func:`file_format`,
:func:`is_hdf5` and :func:`list_datasets` look at a file without reading its
data (``hpcmtl data info``, the converters).
"""
from __future__ import annotations

import contextlib
import os

import h5py
import numpy as np

from ..errors import InputError

TASKS_FORMAT = "hpcmtl-tasks"
RESULT_FORMAT = "hpcmtl-result"
CHECKPOINT_FORMAT = "hpcmtl-checkpoint"
STREAM_FORMAT = "hpcmtl-stream"
FORMAT_VERSION = 1

TRUTH = "truth"           # group of ground-truth arrays (synthetic task files and streams)


def open_read(path: str, expected_format: str, **options) -> h5py.File:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    try:
        f = h5py.File(path, "r", **options)
    except OSError:
        raise InputError(f"{path}: not an HDF5 file") from None
    fmt = f.attrs.get("format")
    if isinstance(fmt, bytes):
        fmt = fmt.decode("utf-8", "replace")
    if not isinstance(fmt, str) or fmt != expected_format:
        f.close()
        raise InputError(f"{path}: attribute 'format' is {fmt!r}, expected {expected_format!r}")
    # a number equal to FORMAT_VERSION; text ('one'), arrays and other versions are refused
    version = f.attrs.get("format_version")
    version = version.item() if isinstance(version, np.generic) else version
    if isinstance(version, bool) or not isinstance(version, (int, float)) or version != FORMAT_VERSION:
        f.close()
        shown = "missing" if version is None else repr(version.tolist() if isinstance(version, np.ndarray) else version)
        raise InputError(f"{path}: attribute 'format_version' is {shown}, this hpcmtl reads version {FORMAT_VERSION}")
    return f




class OpenFile:
    """An open HDF5 file that closes on ``close()`` or at the end of a ``with`` block."""

    def close(self):
        with contextlib.suppress(Exception):
            self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_array(group, name, data):
    """A dataset; large arrays are chunked by rows and gzip-1 compressed (readable by h5dump)."""
    data = np.asarray(data)
    if data.nbytes > (1 << 20):
        rows = max(1, (1 << 20) // max(1, data[:1].nbytes))
        chunks = (min(rows, data.shape[0]),) + data.shape[1:]
        return group.create_dataset(name, data=data, chunks=chunks, compression="gzip", compression_opts=1,
                                    shuffle=True)
    return group.create_dataset(name, data=data)


def duplicate_name(names):
    """(name, first index, second index) of the first repeated task name, or None."""
    seen = {}
    for i, name in enumerate(names):
        if name in seen:
            return name, seen[name], i
        seen[name] = i
    return None


def file_format(path) -> str | None:
    """The 'format' attribute of an HDF5 file (None if it has none); InputError if unreadable."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    try:
        with h5py.File(path, "r") as f:
            fmt = f.attrs.get("format")
    except OSError:
        raise InputError(f"{path}: not an HDF5 file") from None
    return fmt.decode() if isinstance(fmt, bytes) else fmt


def is_hdf5(path) -> bool:
    """Whether ``path`` is an HDF5 file (by its signature, not its name)."""
    return bool(h5py.is_hdf5(os.fspath(path)))


def list_datasets(path) -> list:
    """Every dataset of an HDF5 file as ``{"name", "shape", "dtype"}`` (metadata only, no data read)."""
    found = []

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            found.append({"name": name, "shape": list(obj.shape), "dtype": str(obj.dtype)})

    with h5py.File(os.fspath(path), "r") as f:
        f.visititems(visit)
    return found
