"""Who is server and who is worker, which rows each worker owns, and every MPI call.

Roles: rank 0 is the server; ranks 1..P-1 are workers.  With P = 1 rank 0 is
both, and the very same code runs in one process (the server "sends" commands
to its in-process worker through the same collectives).

One communication interface (:class:`Cluster`, :mod:`.base`), two backends:
:class:`SerialCluster` (:mod:`.serial`: one process, no MPI, mpi4py never
imported; the estimators and every P = 1 in-process run) and
:class:`MPICluster` (:mod:`.mpi`: an mpi4py communicator of several
processes, what ``mpiexec`` runs use).  :func:`connect` picks the one a run
needs; :meth:`Cluster.planned` gives a cluster under a block plan
(:mod:`.partition`), passed to whatever needs it instead of installed into a
shared object.

Protocol: the server drives.  Each step starts with a small control broadcast
(:meth:`Cluster.send_command`: 4 int64, a command id and up to three integers
whose names the command declares); then every rank, the server included, takes
part in the command's collectives around its own computation: a down one from
the server (Scatterv of per-block rows or of per-rank vectors, Bcast of a small
shared vector) and an up one to it (Gatherv of per-block rows or of per-rank
vectors, a gather of objects, :meth:`Cluster.agree`).  Which command uses which
collectives is declared once per method (:class:`hpcmtl.engine.Command`) and
paired with the computations by :class:`hpcmtl.engine.Endpoint`; algorithms
never touch MPI themselves, and this package is the only one that calls it.

Failure: :func:`run_main` turns an :class:`~hpcmtl.errors.InputError` raised
identically on every rank into exit code 2 with one line printed by rank 0, and
any other exception on any rank into one line naming the rank and a
``MPI_Abort`` that ends every rank (no hang).  :meth:`Cluster.agree` lets
rank-local validation (each worker checks only its own tasks) fail together
before the first data collective.  A rank that stops answering ends the job
through the watchdog of :meth:`MPICluster.complete` (:class:`SilentRank`: one
line naming it, ``MPI_Abort``, exit 1); a worker's termination signal reaches
the server (:meth:`Cluster.signal_elsewhere`) and stops the job like its own.
"""
from __future__ import annotations

import os
import sys
import time
import traceback

from ..errors import InputError, Preempted
from .base import CONTROL_SIZE, STOP, STOP_DONE, STOP_FAILED, STOP_PREEMPTED, Cluster, displacements
from .failure import (TERMINATION_SIGNALS, WATCHDOG_SECONDS, AgreedError, SignalFlag, SilentRank, StopRequested,
                      Watch, fault_point, launched_by_mpi, launcher_rank)
from .mpi import SLEEP_SECONDS, SPIN_SECONDS, WAIT_VARIABLE, MPICluster, waits_by_sleeping, world
from .partition import Block, plan_blocks
from .serial import SerialCluster

__all__ = ["Block", "plan_blocks", "Cluster", "SerialCluster", "MPICluster", "connect", "run_main", "CONTROL_SIZE",
           "STOP", "STOP_DONE", "STOP_PREEMPTED", "STOP_FAILED", "TERMINATION_SIGNALS", "AgreedError",
           "StopRequested", "SignalFlag", "fault_point", "launcher_rank", "displacements", "WAIT_VARIABLE",
           "SPIN_SECONDS", "SLEEP_SECONDS", "waits_by_sleeping", "ABORT_GRACE_SECONDS", "SilentRank", "Watch",
           "WATCHDOG_SECONDS"]

ABORT_GRACE_SECONDS = 0.5            # a failing rank's line, written and flushed, before MPI_Abort: the launcher
                                     # forwards ranks' stderr through its own event loop, and an abort it handles
                                     # first would end the job with the line unread


def connect(comm=None) -> Cluster:
    """The cluster of a run: :class:`MPICluster` over ``comm`` (default ``MPI.COMM_WORLD``) when it has several
    processes, :class:`SerialCluster` when it has one (``mpiexec -n 1``: the same collectives a communicator of
    one gave).  A process that no MPI launcher started (``python -m hpcmtl`` without ``mpiexec``: none of the
    variables of :func:`launched_by_mpi` set) is one process: it runs serial without importing mpi4py, so MPI
    is never initialized (its start-up and a library that need not be there); one that a launcher started
    without mpi4py installed fails as before (ImportError)."""
    if comm is None:
        if not launched_by_mpi():
            return SerialCluster()
        comm = world()
    return MPICluster(comm) if comm.Get_size() > 1 else SerialCluster()


# ---------------------------------------------------------------------------
# Running a command on every rank with shared failure handling
# ---------------------------------------------------------------------------
def run_main(fn, comm=None, stderr=None) -> int:
    """Run ``fn(cluster)`` on every rank (``cluster``: :func:`connect`'s); return the exit code.

    * :class:`InputError` (raised identically on every rank): rank 0 prints
      ``hpcmtl: error: <message>``; every rank returns 2.
    * :class:`Preempted`: every rank returns its exit code (checkpoint written).
    * anything else: the failing rank prints one line naming itself and the
      cause, then ``MPI_Abort`` ends every rank of the job.
    """
    stderr = stderr or sys.stderr
    try:
        cluster = connect(comm)
    except InputError as exc:             # raised on every rank alike (waits_by_sleeping)
        if (comm.Get_rank() if comm is not None else launcher_rank()) == 0:
            print(f"hpcmtl: error: {exc}", file=stderr, flush=True)
        return InputError.exit_code
    try:
        fn(cluster)
        return 0
    except InputError as exc:
        if cluster.rank == 0:
            print(f"hpcmtl: error: {exc}", file=stderr, flush=True)
        return InputError.exit_code
    except Preempted as exc:
        if cluster.rank == 0:
            print(f"hpcmtl: {exc}", file=stderr, flush=True)
        return Preempted.exit_code
    except StopRequested as exc:          # the server already printed the cause
        return exc.exit_code
    except SilentRank as exc:             # the watchdog (server): no collective can end the job, MPI_Abort does
        print(f"hpcmtl: fatal error: {exc}", file=stderr, flush=True)
        time.sleep(ABORT_GRACE_SECONDS)
        cluster.abort(exc.exit_code)
        return exc.exit_code
    except BaseException as exc:  # noqa: BLE001 - anything else must end every rank
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            return 0
        where = f"rank {cluster.rank} of {cluster.size}"
        task = getattr(exc, "hpcmtl_task", None)
        if task is not None:
            where += f", task '{task}'"
        print(f"hpcmtl: fatal error on {where}: {type(exc).__name__}: {exc}", file=stderr, flush=True)
        if os.environ.get("HPCMTL_TRACEBACK"):
            traceback.print_exc(file=stderr)
        if cluster.size > 1:
            time.sleep(ABORT_GRACE_SECONDS)
            cluster.abort(1)
        return 1
