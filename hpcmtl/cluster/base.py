"""The communication interface every backend implements, and what the backends share.

:class:`Cluster` holds the roles (rank 0 is the server, ranks 1..P-1 the
workers; with P = 1 rank 0 is both), the block plan of a planned view
(:meth:`Cluster.planned`) and the byte counter.  A backend
(:class:`~hpcmtl.cluster.serial.SerialCluster`, :class:`~hpcmtl.cluster.mpi.MPICluster`)
provides the collectives:

=====================  ==============================================================
``send_command``       server: broadcast the 4-int64 control; ``receive_command``: workers
``scatter_block_rows``  per plan block rows down (each rank gets its blocks'); ``gather_block_rows`` up
``scatter_variable``   one float vector per rank down (sizes travel); ``gather_variable`` up
``scatter_counted``    one float vector per rank down by lengths every rank knows; ``gather_counted`` up
``bcast_array``        one shared array from the server
``bcast_object``       small picklable metadata; ``gather_objects`` one object per rank up
``agree``              fail together: every rank raises the first rank's error
``barrier``, ``abort``  synchronize; end every rank at once
=====================  ==============================================================

Every "up" collective delivers on the server and returns None on workers; the
counter (``bytes_moved``) adds what the server sends and receives.
"""
from __future__ import annotations

import copy

import numpy as np

from .failure import AgreedError, Watch

CONTROL_SIZE = 4
STOP = 0

# reasons carried by STOP (ctrl[1]); workers leave with the matching exit code
STOP_DONE = 0
STOP_PREEMPTED = 1
STOP_FAILED = 2


def displacements(counts) -> np.ndarray:
    """Where each rank's piece starts in the concatenation of pieces of ``counts`` values (a Gatherv's or
    Scatterv's displacements)."""
    return np.concatenate([[0], np.cumsum(counts)[:-1]])


class Traffic:
    """The bytes a cluster's collectives moved at the server: one counter, shared by the cluster's planned
    views (a run's figure covers every plan it ran under)."""

    __slots__ = ("bytes",)

    def __init__(self):
        self.bytes = 0


class Cluster:
    """Roles, the block plan and the byte counter; the collectives are the backend's (module docstring).

    An unplanned cluster (``blocks`` empty) serves what needs no plan: roles,
    per-rank vectors, objects, ``agree``.  :meth:`planned` gives the view whose
    per-block collectives, :meth:`rank_totals` and servers follow a plan.
    """

    blocks = ()             # the plan: every block in plan order (empty: not planned)
    my_blocks = ()          # this rank's blocks of the plan
    block_counts = None     # per rank, how many plan blocks it owns (None: not planned)
    sleep_waits = False     # whether waits sleep between tests (MPI on crowded nodes)

    def __init__(self, rank: int, size: int):
        self.rank = rank
        self.size = size
        self.n_workers = 1 if size == 1 else size - 1
        self.traffic = Traffic()
        self.watch = Watch()            # the watchdog's limit, a forwarded signal: shared by the planned views

    @classmethod
    def serial(cls):
        """The cluster of one process (no MPI; mpi4py is not imported): the P = 1 path the estimators'
        ``fit`` and every in-process run use."""
        from .serial import SerialCluster
        return SerialCluster()

    # -- roles -------------------------------------------------------------
    @property
    def is_server(self) -> bool:
        return self.rank == 0

    def worker_rank(self, worker: int) -> int:
        return 0 if self.size == 1 else worker + 1

    @property
    def my_worker(self):
        """This rank's worker index, or None for a server that owns no blocks."""
        if self.size == 1:
            return 0
        return None if self.rank == 0 else self.rank - 1

    # -- the plan ------------------------------------------------------------
    def planned(self, blocks):
        """This cluster under the plan ``blocks`` (as :func:`~hpcmtl.cluster.partition.plan_blocks` returns
        them): a view sharing the communication and the byte counter, the plan fixed.  The cluster itself is
        left as it is, so each run, fold or server holds the plan it was made for."""
        view = copy.copy(self)
        view.blocks = tuple(blocks)
        me = view.my_worker
        view.my_blocks = tuple(b for b in view.blocks if b.worker == me)
        counts = np.zeros(self.size, dtype=np.int64)
        for b in view.blocks:
            counts[self.worker_rank(b.worker)] += 1
        view.block_counts = counts
        return view

    @property
    def is_planned(self) -> bool:
        return self.block_counts is not None

    def rank_totals(self, per_block) -> np.ndarray:
        """Per rank, the sum of ``per_block`` (one integer a plan block) over the rank's blocks."""
        totals = np.zeros(self.size, dtype=np.int64)
        ranks = np.array([self.worker_rank(b.worker) for b in self.blocks], dtype=np.int64)
        np.add.at(totals, ranks, np.asarray(per_block, dtype=np.int64))
        return totals

    # -- the byte counter ----------------------------------------------------
    @property
    def bytes_moved(self) -> int:
        return self.traffic.bytes

    @bytes_moved.setter
    def bytes_moved(self, value):
        self.traffic.bytes = value

    def moved(self, nbytes):
        """Count ``nbytes`` sent or received by the server."""
        self.traffic.bytes += nbytes

    # -- what the backends share ----------------------------------------------
    def counted_local(self, local, counts):
        """``gather_counted``'s arguments checked: (local as a flat float64 vector, counts as int64)."""
        local = np.ascontiguousarray(local, dtype=np.float64).reshape(-1)
        counts = np.asarray(counts, dtype=np.int64)
        if local.size != counts[self.rank]:
            raise ValueError(f"rank {self.rank}: {local.size} values to gather, {counts[self.rank]} expected")
        return local, counts

    def forward_signal(self):
        """Worker: tell the server about a termination signal this process received (one process: nothing to
        tell, the server's own flag is it)."""

    def signal_elsewhere(self):
        """Server: ``(rank, signal name)`` of a termination signal a worker received, or None."""
        return None

    def agree(self, error: str | None):
        """Fail together: if any rank reports an error, every rank raises it.

        The first error in rank order wins, so every rank raises the same
        one-line :class:`InputError` and rank 0 prints it.
        """
        for e in self.allgather_objects(error):
            if e is not None:
                raise AgreedError(e)
