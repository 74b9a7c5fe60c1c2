"""The serial backend: the collectives on one process, without MPI (mpi4py is never imported).

Rank 0 is the server and worker 0 at once, and the server "sends" commands to
its in-process worker through the same interface the MPI backend serves: a
gather of one rank is the input (a copy), a scatter or broadcast hands the
server's values over, ``agree`` raises the one error there is, ``abort`` ends
the process.  Objects are copied through pickle as mpi4py does on a
communicator of one, so callers see the same objects under either backend.
Nothing travels: the byte counter stays where it is.
"""
from __future__ import annotations

import os
import pickle
import sys

import numpy as np

from .base import CONTROL_SIZE, Cluster


def _copied(obj):
    return pickle.loads(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))


class SerialCluster(Cluster):
    """P = 1: the server owns every block (worker 0); see the module docstring."""

    def __init__(self):
        super().__init__(rank=0, size=1)

    # -- small metadata --------------------------------------------------------
    def bcast_object(self, obj):
        return _copied(obj)

    def gather_objects(self, obj):
        return [_copied(obj)]

    def allgather_objects(self, obj):
        return [_copied(obj)]

    # -- the hot path ------------------------------------------------------------
    def send_command(self, command: int, a: int = 0, b: int = 0, c: int = 0):
        """The control as the server would broadcast it (no worker to receive it)."""
        return np.array([command, a, b, c], dtype=np.int64)

    def receive_command(self):
        raise RuntimeError(f"a serial cluster has no server to receive a command ({CONTROL_SIZE} int64) from")

    def gather_block_rows(self, local, width):
        return np.ascontiguousarray(local, dtype=np.float64).reshape(-1, width).copy()

    def scatter_block_rows(self, rows, width):
        mine = np.empty((len(self.my_blocks), width), dtype=np.float64)
        mine[...] = rows
        return mine

    def gather_variable(self, local):
        return [np.ascontiguousarray(local, dtype=np.float64).reshape(-1).copy()]

    def scatter_variable(self, pieces):
        return np.array(pieces[0], dtype=np.float64)

    def gather_counted(self, local, counts):
        local, _ = self.counted_local(local, counts)
        return local.copy()

    def scatter_counted(self, send, counts):
        mine = np.empty(int(np.asarray(counts, dtype=np.int64)[0]), dtype=np.float64)
        mine[...] = send
        return mine

    def bcast_array(self, array, shape, dtype=np.float64):
        return np.ascontiguousarray(array, dtype=dtype)

    def barrier(self):
        pass

    def abort(self, code: int):
        """End the process at once, as ``MPI_Abort`` ends a job (no clean-up runs)."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
