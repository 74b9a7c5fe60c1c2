"""HDF5 files of hpcmtl: task datasets, result files, checkpoints and online streams.

Every HDF5 path string of the package lives in this package, and only this
package imports h5py.  One module a concern:

* :mod:`~hpcmtl.store.hdf5`: the format names and version every file carries,
  opening a file for reading with its format checked, probing a file;
* :mod:`~hpcmtl.store.atomic`: atomic writes (temporary + rename, a guarded raw
  file under HDF5, one-line :class:`WriteError`) and the output checks made
  before any work;
* :mod:`~hpcmtl.store.fingerprints`: additive content fingerprints of task rows;
* :mod:`~hpcmtl.store.tasks`: task dataset files (:func:`write_tasks`, :class:`TaskFile`);
* :mod:`~hpcmtl.store.results`: result files (:func:`write_result`, :func:`read_result`);
* :mod:`~hpcmtl.store.checkpoints`: checkpoints (:func:`write_checkpoint`, :func:`read_checkpoint`);
* :mod:`~hpcmtl.store.streams`: online streams (:func:`write_stream`, :class:`StreamFile`).

The names below are the store's public interface: the rest of the package
imports them from here (``from hpcmtl import store; store.read_result(...)``).
"""
from __future__ import annotations

from ..taskdata import check_task
from .atomic import (TEMPORARY_EXTRA, WriteError, atomic_h5, atomic_output, check_outputs, check_writable,
                     lock_path, output_locks, output_target, remove_stale_temporaries, same_file, write_error)
from .checkpoints import read_checkpoint, write_checkpoint
from .fingerprints import combine_fingerprints, fingerprint_hex, fingerprint_rows
from .hdf5 import (CHECKPOINT_FORMAT, FORMAT_VERSION, RESULT_FORMAT, STREAM_FORMAT, TASKS_FORMAT, duplicate_name,
                   file_format, is_hdf5, list_datasets)
from .results import read_result, write_result
from .streams import StreamFile, load_stream, write_stream
from .tasks import FEATURE_DTYPES, TaskFile, load_tasks, read_all_tasks, write_tasks

__all__ = [
    "TASKS_FORMAT", "RESULT_FORMAT", "CHECKPOINT_FORMAT", "STREAM_FORMAT", "FORMAT_VERSION", "FEATURE_DTYPES",
    "file_format", "is_hdf5", "list_datasets", "duplicate_name",
    "WriteError", "write_error", "remove_stale_temporaries", "atomic_h5", "atomic_output", "check_writable",
    "same_file", "check_outputs", "output_target", "output_locks", "lock_path", "TEMPORARY_EXTRA",
    "fingerprint_rows", "fingerprint_hex", "combine_fingerprints",
    "check_task", "write_tasks", "TaskFile", "read_all_tasks", "load_tasks",
    "write_result", "read_result",
    "write_checkpoint", "read_checkpoint",
    "write_stream", "StreamFile", "load_stream",
]
