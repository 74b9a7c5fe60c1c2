"""Who is server and who is worker, which rows each worker owns, and every MPI call.

Roles: rank 0 is the server; ranks 1..P-1 are workers.  With P = 1 rank 0 is
both, and the very same code runs in one process (the server "sends" commands
to its in-process worker through the same collectives on a communicator of
size one).

Protocol: the server drives.  Each step starts with a small control broadcast
(:meth:`Cluster.send_command`: 4 int64, a command id and up to three integers
whose names the command declares); then every rank, the server included, takes
part in the command's collectives around its own computation: a down one from
the server (Scatterv of per-block rows or of per-rank vectors, Bcast of a small
shared vector) and an up one to it (Gatherv of per-block rows or of per-rank
vectors, a gather of objects, :meth:`Cluster.agree`).  Which command uses which
collectives is declared once per method (:class:`hpcmtl.engine.Command`) and
paired with the computations by :class:`hpcmtl.engine.Endpoint`; algorithms
never touch MPI themselves, and this module is the only one that calls it.

Failure: :func:`run_main` turns an :class:`~hpcmtl.errors.InputError` raised
identically on every rank into exit code 2 with one line printed by rank 0, and
any other exception on any rank into one line naming the rank and a
``MPI_Abort`` that ends every rank (no hang).  :meth:`Cluster.agree` lets
rank-local validation (each worker checks only its own tasks) fail together
before the first data collective.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from dataclasses import dataclass

import numpy as np

from .errors import InputError, Preempted


def launcher_rank() -> int:
    """This process's rank as the launcher announced it (before MPI is initialized).

    Used only to keep command-line errors to one line per job: MPICH/Hydra set
    PMI_RANK, Open MPI OMPI_COMM_WORLD_RANK, SLURM's srun SLURM_PROCID.
    """
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        value = os.environ.get(var)
        if value is not None and value.isdigit():
            return int(value)
    return 0


# ---------------------------------------------------------------------------
# Partition arithmetic (pure: testable without MPI)
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Block:
    task: int
    part: int
    start: int
    stop: int
    worker: int          # worker index 0..n_workers-1

    @property
    def n_rows(self) -> int:
        return self.stop - self.start


def plan_blocks(n_samples, nnz, n_workers: int, split_large: bool = False):
    """Assign task row blocks to workers, balanced by non-zeros, deterministically.

    Greedy longest-processing-time: blocks in order of decreasing nnz (ties by
    task, part) go to the least-loaded worker (ties by worker index).  With
    ``split_large`` a task whose nnz exceeds the ideal share ``sum(nnz) /
    n_workers`` is cut into ``ceil(nnz / share)`` row ranges of near-equal size
    (at most ``n_workers`` and at most ``n_i`` pieces).

    Returns the blocks sorted by (worker, task, part): the order in which a
    Gatherv over workers delivers their columns.
    """
    n_samples = np.asarray(n_samples, dtype=np.int64)
    nnz = np.asarray(nnz, dtype=np.float64)
    if n_workers < 1:
        raise ValueError("need at least one worker")
    pieces = []
    share = nnz.sum() / n_workers
    for t, (n, z) in enumerate(zip(n_samples, nnz)):
        k = 1
        if split_large and share > 0 and z > share:
            k = int(min(n_workers, n, int(np.ceil(z / share))))
        edges = np.linspace(0, n, k + 1).round().astype(np.int64)
        for p in range(k):
            pieces.append((t, p, int(edges[p]), int(edges[p + 1]), z * (edges[p + 1] - edges[p]) / max(n, 1)))
    order = sorted(range(len(pieces)), key=lambda b: (-pieces[b][4], pieces[b][0], pieces[b][1]))
    load = np.zeros(n_workers)
    owner = {}
    for b in order:
        w = int(np.argmin(load))       # first minimum: lowest index wins ties
        owner[b] = w
        load[w] += pieces[b][4] + 1.0  # +1: even empty tasks cost a little
    blocks = [Block(t, p, s, e, owner[b]) for b, (t, p, s, e, _) in enumerate(pieces)]
    return sorted(blocks, key=lambda b: (b.worker, b.task, b.part))


# ---------------------------------------------------------------------------
# Commands of the server-driven protocol
# ---------------------------------------------------------------------------
CONTROL_SIZE = 4
STOP = 0

# reasons carried by STOP (ctrl[1]); workers leave with the matching exit code
STOP_DONE = 0
STOP_PREEMPTED = 1
STOP_FAILED = 2

TERMINATION_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")


class AgreedError(InputError):
    """An input error every rank raised together (through :meth:`Cluster.agree`): nobody waits for anybody."""


class StopRequested(Exception):
    """A worker was told by the server to stop with a non-zero exit code (server prints why)."""

    def __init__(self, code):
        super().__init__(f"stopped by the server with exit code {code}")
        self.exit_code = int(code)


class SignalFlag:
    """Remembers a termination signal instead of dying on it.

    SIGTERM and SIGUSR1 (what SLURM sends before a time limit or preemption)
    and SIGINT only set the flag; the server finishes its round, writes a
    checkpoint and stops the job.  Installed on every rank (mpiexec and srun
    forward the signal to all of them), so no worker dies mid-collective.

    The first signal decides: from then on every termination signal is
    ignored (``SIG_IGN``) until the process ends.  A second SIGTERM (a
    launcher that forwards the signal and the scheduler that sends it to the
    ranks too, or an impatient user) is absorbed while the checkpoint is
    written, and also during interpreter shutdown, where Python resets its
    own handlers to the default and a late signal used to kill the rank (exit
    15 instead of 75, so the job was not requeued).  SIGKILL still ends it.
    """

    def __init__(self):
        self.received = None
        self.count = 0

    def install(self):
        import signal
        for name in TERMINATION_SIGNALS:
            signal.signal(getattr(signal, name), self._handle)
        return self

    def _handle(self, signum, frame):
        import signal
        for name in TERMINATION_SIGNALS:      # absorb the rest; SIG_IGN survives interpreter shutdown
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        self.count += 1
        if self.received is None:             # the first signal is the one reported
            self.received = signal.Signals(signum).name


def fault_point(rank: int, round_: int):
    """Test hook: ``HPCMTL_FAULT=RANK:ROUND[:kill]`` fails that rank at that round.

    ``raise`` (default) raises an exception, ``kill`` SIGKILLs the process, the
    way a node failure looks to the rest of the job.  Unset, it costs one
    dictionary lookup per round.
    """
    spec = os.environ.get("HPCMTL_FAULT")
    if not spec:
        return
    parts = spec.split(":")
    if int(parts[0]) != rank or int(parts[1]) != round_:
        return
    if len(parts) > 2 and parts[2] == "kill":
        import signal
        import sys
        # the time of death, for tests that measure how fast the rest of the job ends
        print(f"hpcmtl: rank {rank}: injected kill (HPCMTL_FAULT={spec})", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault (HPCMTL_FAULT={spec})")


WAIT_VARIABLE = "HPCMTL_MPI_WAIT"     # how ranks wait in the hot path's collectives: auto (default), spin, sleep
SPIN_SECONDS = 5e-5                  # sleeping waits: spin this long first (a reply that is about to come)
SLEEP_SECONDS = 1e-4                 # then test every 0.1 ms
ABORT_GRACE_SECONDS = 0.5            # a failing rank's line, written and flushed, before MPI_Abort: the launcher
                                     # forwards ranks' stderr through its own event loop, and an abort it handles
                                     # first ends the job with the line unread (seen once in 4 CI runs of
                                     # test_reliability's fault test: the job ended, its one line missing)


def waits_by_sleeping(comm, MPI) -> bool:
    """Whether this run's ranks should sleep while they wait (``HPCMTL_MPI_WAIT``: ``spin``, ``sleep``, or
    ``auto``: when some node runs more ranks than the CPUs its ranks may use together, e.g. ``mpiexec -n 5``
    on 2 cores, or a SLURM allocation smaller than the ranks placed in it).  Collective: every rank calls it
    and every rank gets the same answer."""
    mode = os.environ.get(WAIT_VARIABLE, "auto").strip().lower() or "auto"
    if comm.allreduce(int(mode not in ("auto", "spin", "sleep")), op=MPI.MAX):     # every rank fails, none hangs
        raise InputError(f"environment variable {WAIT_VARIABLE}={os.environ.get(WAIT_VARIABLE)!r} on some rank: "
                         f"expected auto, spin or sleep")
    if mode != "auto":
        return mode == "sleep"
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        cpus = node.allgather(sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else
                              list(range(os.cpu_count() or 1)))
        crowded = node.Get_size() > len(set().union(*map(set, cpus)))
    finally:
        node.Free()
    return bool(comm.allreduce(int(crowded), op=MPI.MAX))


class Cluster:
    """MPI roles, block ownership and the collectives hpcmtl uses.

    Parameters
    ----------
    comm : mpi4py communicator (default ``MPI.COMM_WORLD``); passed in, never global.
    """

    def __init__(self, comm=None):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.n_workers = 1 if self.size == 1 else self.size - 1
        self.bytes_moved = 0
        self.blocks = []
        self.sleep_waits = self.size > 1 and waits_by_sleeping(self.comm, MPI)

    def complete(self, request):
        """Wait for a nonblocking collective: spinning, as MPI does (the lowest latency when every rank has its
        own core), or, where this node runs more ranks than it has cores for them (:func:`waits_by_sleeping`),
        sleeping between tests after ``SPIN_SECONDS``: a rank waiting for the others then leaves them the core
        instead of spinning on it."""
        if not self.sleep_waits:
            request.Wait()
            return
        give_up = time.perf_counter() + SPIN_SECONDS
        while not request.Test():
            if time.perf_counter() > give_up:
                time.sleep(SLEEP_SECONDS)

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

    def set_plan(self, blocks):
        self.blocks = list(blocks)
        me = self.my_worker
        self.my_blocks = [b for b in self.blocks if b.worker == me]
        counts = np.zeros(self.size, dtype=np.int64)
        for b in self.blocks:
            counts[self.worker_rank(b.worker)] += 1
        self.block_counts = counts

    # -- small metadata (pickle-based, rare) -------------------------------
    def bcast_object(self, obj):
        return self.comm.bcast(obj, root=0)

    def gather_objects(self, obj):
        return self.comm.gather(obj, root=0)

    def agree(self, error: str | None):
        """Fail together: if any rank reports an error, every rank raises it.

        The first error in rank order wins, so every rank raises the same
        one-line :class:`InputError` and rank 0 prints it.
        """
        errors = self.comm.allgather(error)
        for e in errors:
            if e is not None:
                raise AgreedError(e)

    # -- hot path: uppercase collectives on NumPy buffers ---------------------
    def send_command(self, command: int, a: int = 0, b: int = 0, c: int = 0):
        """Server: broadcast a command; returns it (workers call :meth:`receive_command`)."""
        ctrl = np.array([command, a, b, c], dtype=np.int64)
        self.complete(self.comm.Ibcast(ctrl, root=0))
        self.bytes_moved += ctrl.nbytes * (self.size - 1)
        return ctrl

    def receive_command(self):
        ctrl = np.empty(CONTROL_SIZE, dtype=np.int64)
        self.complete(self.comm.Ibcast(ctrl, root=0))
        return ctrl

    def gather_block_rows(self, local: np.ndarray, width: int) -> np.ndarray | None:
        """Gatherv ``(n_my_blocks x width)`` rows to the server, in plan order."""
        local = np.ascontiguousarray(local, dtype=np.float64).reshape(-1, width)
        if self.size == 1:
            return local.copy()
        recv = None
        if self.is_server:
            counts = self.block_counts * width
            recv = np.empty((len(self.blocks), width), dtype=np.float64)
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
            self.complete(self.comm.Igatherv(local, [recv, counts, displs, self.MPI.DOUBLE], root=0))
            self.bytes_moved += int(counts.sum()) * 8
        else:
            self.complete(self.comm.Igatherv(local, None, root=0))
        return recv

    def scatter_block_rows(self, rows: np.ndarray | None, width: int) -> np.ndarray:
        """Scatterv ``(n_blocks x width)`` rows from the server; each rank gets its blocks'."""
        mine = np.empty((len(self.my_blocks), width), dtype=np.float64)
        if self.size == 1:
            mine[...] = rows
            return mine
        if self.is_server:
            counts = self.block_counts * width
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
            send = np.ascontiguousarray(rows, dtype=np.float64)
            self.complete(self.comm.Iscatterv([send, counts, displs, self.MPI.DOUBLE], mine, root=0))
            self.bytes_moved += int(counts.sum()) * 8
        else:
            self.complete(self.comm.Iscatterv(None, mine, root=0))
        return mine

    def gather_variable(self, local: np.ndarray):
        """Gatherv of variable-length float vectors (one per rank); server gets the list."""
        local = np.ascontiguousarray(local, dtype=np.float64).reshape(-1)
        if self.size == 1:
            return [local.copy()]
        counts = np.zeros(self.size if self.is_server else 0, dtype=np.int64)    # nonblocking: see complete()
        self.complete(self.comm.Igather(np.array([local.size], dtype=np.int64), counts, root=0))
        if self.is_server:
            self.bytes_moved += 8 * self.size
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
            recv = np.empty(int(counts.sum()), dtype=np.float64)
            self.complete(self.comm.Igatherv(local, [recv, counts, displs, self.MPI.DOUBLE], root=0))
            self.bytes_moved += int(counts.sum()) * 8
            return [recv[s:s + c] for s, c in zip(displs, counts)]
        self.complete(self.comm.Igatherv(local, None, root=0))
        return None

    def scatter_variable(self, pieces):
        """Scatterv of variable-length float vectors (server gives one per rank)."""
        if self.size == 1:
            return np.array(pieces[0], dtype=np.float64)
        counts = np.array([len(p) for p in pieces], dtype=np.int64) if self.is_server else None
        count = np.zeros(1, dtype=np.int64)
        self.complete(self.comm.Iscatter(counts, count, root=0))
        mine = np.empty(int(count[0]), dtype=np.float64)
        if self.is_server:
            self.bytes_moved += 8 * self.size
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
            send = np.concatenate([np.asarray(p, dtype=np.float64) for p in pieces]) if counts.sum() else np.zeros(0)
            self.complete(self.comm.Iscatterv([send, counts, displs, self.MPI.DOUBLE], mine, root=0))
            self.bytes_moved += int(counts.sum()) * 8
        else:
            self.complete(self.comm.Iscatterv(None, mine, root=0))
        return mine

    def rank_totals(self, per_block) -> np.ndarray:
        """Per rank, the sum of ``per_block`` (one integer a plan block) over the rank's blocks."""
        totals = np.zeros(self.size, dtype=np.int64)
        ranks = np.array([self.worker_rank(b.worker) for b in self.blocks], dtype=np.int64)
        np.add.at(totals, ranks, np.asarray(per_block, dtype=np.int64))
        return totals

    def gather_counted(self, local: np.ndarray, counts) -> np.ndarray | None:
        """Gatherv of one float vector per rank whose lengths every rank knows (``counts``, per rank, e.g.
        the values of its blocks on their supports): the server gets them concatenated in rank order.  Unlike
        :meth:`gather_variable` no sizes travel, only the values."""
        local = np.ascontiguousarray(local, dtype=np.float64).reshape(-1)
        counts = np.asarray(counts, dtype=np.int64)
        if local.size != counts[self.rank]:
            raise ValueError(f"rank {self.rank}: {local.size} values to gather, {counts[self.rank]} expected")
        if self.size == 1:
            return local.copy()
        if self.is_server:
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
            recv = np.empty(int(counts.sum()), dtype=np.float64)
            self.complete(self.comm.Igatherv(local, [recv, counts, displs, self.MPI.DOUBLE], root=0))
            self.bytes_moved += int(counts.sum()) * 8
            return recv
        self.complete(self.comm.Igatherv(local, None, root=0))
        return None

    def scatter_counted(self, send: np.ndarray | None, counts) -> np.ndarray:
        """Scatterv of the server's ``send`` (every rank's piece, concatenated in rank order) by lengths every
        rank knows (``counts``, per rank); each rank gets its piece."""
        counts = np.asarray(counts, dtype=np.int64)
        mine = np.empty(int(counts[self.rank]), dtype=np.float64)
        if self.size == 1:
            mine[...] = send
            return mine
        if self.is_server:
            send = np.ascontiguousarray(send, dtype=np.float64).reshape(-1)
            if send.size != counts.sum():
                raise ValueError(f"{send.size} values to scatter, {int(counts.sum())} expected")
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
            self.complete(self.comm.Iscatterv([send, counts, displs, self.MPI.DOUBLE], mine, root=0))
            self.bytes_moved += int(counts.sum()) * 8
        else:
            self.complete(self.comm.Iscatterv(None, mine, root=0))
        return mine

    def bcast_array(self, array: np.ndarray | None, shape, dtype=np.float64) -> np.ndarray:
        """Bcast a shared array (e.g. sigma_ii and rho) from the server."""
        buf = np.ascontiguousarray(array, dtype=dtype) if self.is_server else np.empty(shape, dtype=dtype)
        if self.size > 1:
            self.complete(self.comm.Ibcast(buf, root=0))
            if self.is_server:
                self.bytes_moved += buf.nbytes * (self.size - 1)
        return buf

    def reduce_sum(self, local: np.ndarray) -> np.ndarray | None:
        """Reduce(SUM) to the server (where several ranks contribute to the same numbers)."""
        local = np.ascontiguousarray(local, dtype=np.float64)
        if self.size == 1:
            return local.copy()
        recv = np.empty_like(local) if self.is_server else None
        self.complete(self.comm.Ireduce(local, recv, op=self.MPI.SUM, root=0))
        if self.is_server:
            self.bytes_moved += local.nbytes * (self.size - 1)
        return recv

    def barrier(self):
        self.comm.Barrier()

    def abort(self, code: int):
        self.comm.Abort(code)

    @classmethod
    def serial(cls):
        """A cluster of one process over ``MPI.COMM_SELF``: the P = 1 path the estimators' ``fit`` runs."""
        from mpi4py import MPI
        return cls(MPI.COMM_SELF)


# ---------------------------------------------------------------------------
# Running a command on every rank with shared failure handling
# ---------------------------------------------------------------------------
def run_main(fn, comm=None, stderr=None) -> int:
    """Run ``fn(cluster)`` on every rank; return the exit code.

    * :class:`InputError` (raised identically on every rank): rank 0 prints
      ``hpcmtl: error: <message>``; every rank returns 2.
    * :class:`Preempted`: every rank returns its exit code (checkpoint written).
    * anything else: the failing rank prints one line naming itself and the
      cause, then ``MPI_Abort`` ends every rank of the job.
    """
    stderr = stderr or sys.stderr
    try:
        cluster = Cluster(comm)
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
