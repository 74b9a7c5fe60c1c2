"""The MPI backend: the collectives over an mpi4py communicator of several processes.

The hot path uses MPI's nonblocking uppercase collectives on NumPy buffers,
completed by :meth:`MPICluster.complete` (spinning, or sleeping between tests on
a crowded node: :func:`waits_by_sleeping`); small metadata goes through
mpi4py's pickle-based lowercase ones.  Every Gatherv / Scatterv of float
vectors is :meth:`MPICluster.gatherv` / :meth:`MPICluster.scatterv`.  A
communicator of one process is the serial backend's (:func:`hpcmtl.cluster.connect`).

Out of band, on a duplicate of the communicator (so nothing there can match a
collective's message): a worker's termination signal, forwarded to the server
(:meth:`MPICluster.forward_signal`, :meth:`MPICluster.signal_elsewhere`), and the
watchdog's pings (:meth:`MPICluster.complete`): a server that has waited past
:meth:`Watch.limit <hpcmtl.cluster.failure.Watch.limit>` in one collective asks
every worker whether it is alive; a worker waiting in a collective answers within
``POLL_SECONDS``, a stopped or wedged one does not, and the server ends the job
naming it (:class:`~hpcmtl.cluster.failure.SilentRank`).
"""
from __future__ import annotations

import os
import signal
import time

import numpy as np

from ..errors import InputError
from .base import CONTROL_SIZE, Cluster, displacements
from .failure import PING_GRACE_SECONDS, POLL_SECONDS, SilentRank, installed_flag

WAIT_VARIABLE = "HPCMTL_MPI_WAIT"     # how ranks wait in the hot path's collectives: auto (default), spin, sleep
SPIN_SECONDS = 5e-5                  # sleeping waits: spin this long first (a reply that is about to come)
SLEEP_SECONDS = 1e-4                 # then test every 0.1 ms
# tags on the side communicator
TAG_SIGNAL = 1                       # worker -> server: the number of the termination signal it received
TAG_PING = 2                         # server -> worker: the watchdog asks "are you alive?"
TAG_PONG = 3                         # worker -> server: "yes" (answered while waiting in a collective)


def world():
    """``MPI.COMM_WORLD`` (ImportError without mpi4py)."""
    from mpi4py import MPI
    return MPI.COMM_WORLD


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


class MPICluster(Cluster):
    """The collectives over ``comm`` (default ``MPI.COMM_WORLD``; passed in, never global), P > 1."""

    def __init__(self, comm=None):
        from mpi4py import MPI
        comm = MPI.COMM_WORLD if comm is None else comm
        if comm.Get_size() == 1:
            raise ValueError("a communicator of one process: use the serial backend (hpcmtl.cluster.connect)")
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.MPI = MPI
        self.comm = comm
        self.sleep_waits = waits_by_sleeping(comm, MPI)
        self.side = comm.Dup()          # forwarded signals and the watchdog's pings: never a collective's message

    def complete(self, request):
        """Wait for a nonblocking collective: spinning on tests (the lowest latency when every rank has its own
        core), or, where this node runs more ranks than it has cores for them (:func:`waits_by_sleeping`),
        sleeping between tests after ``SPIN_SECONDS``: a rank waiting for the others then leaves them the core
        instead of spinning on it.  Every ``POLL_SECONDS`` a worker answers the watchdog's pings and forwards a
        signal it received; the server, past the watchdog's limit, pings (:meth:`check_alive`).  Never
        ``request.Wait()``: a rank blocked inside MPI could neither answer nor notice a silent one."""
        if request.Test():
            return
        watch = self.watch
        began = start = time.perf_counter()
        spin_until, check_at = began + SPIN_SECONDS, began + POLL_SECONDS
        limit = watch.limit() if self.is_server else float("inf")
        test, spins = request.Test, 0
        while not test():
            if not self.sleep_waits:
                spins += 1
                if spins & 63:              # the clock every 64 tests: a spinning wait stays a tight MPI_Test loop
                    continue
                os.sched_yield()            # as MPICH's own wait does now and then: a core shared after all
            now = time.perf_counter()
            if self.sleep_waits and now > spin_until:
                time.sleep(SLEEP_SECONDS)
            if now >= check_at:
                check_at = now + POLL_SECONDS
                if not self.is_server:
                    self.answer_pings()
                    self.forward_signal()
                elif now - start > limit:
                    self.check_alive(now - began, limit)
                    start = time.perf_counter()        # every rank answered: wait another limit
        watch.waited(time.perf_counter() - began)

    # -- out of band: forwarded signals and the watchdog ------------------------
    def _send_side(self, value: int, dest: int, tag: int):
        watch = self.watch
        watch.sends = [r for r in watch.sends if not r.Test()]     # drop the completed ones
        watch.sends.append(self.side.Isend(np.array([value], dtype=np.int64), dest=dest, tag=tag))

    def forward_signal(self):
        """Worker: tell the server, once, about a termination signal this process received (the server stops
        the job at its next safe point, as for its own signal)."""
        flag = installed_flag()
        if self.is_server or flag is None or flag.received is None or flag.forwarded:
            return
        flag.forwarded = True
        self._send_side(int(getattr(signal, flag.received)), 0, TAG_SIGNAL)

    def signal_elsewhere(self):
        """Server: ``(rank, signal name)`` of the first termination signal a worker forwarded (None: none yet)."""
        watch = self.watch
        if watch.remote_signal is None:
            status = self.MPI.Status()
            if self.side.Iprobe(source=self.MPI.ANY_SOURCE, tag=TAG_SIGNAL, status=status):
                buf = np.zeros(1, dtype=np.int64)
                self.side.Recv(buf, source=status.Get_source(), tag=TAG_SIGNAL)
                watch.remote_signal = (status.Get_source(), signal.Signals(int(buf[0])).name)
        return watch.remote_signal

    def answer_pings(self):
        """Worker: answer every ping of the server's watchdog that has arrived."""
        while self.side.Iprobe(source=0, tag=TAG_PING):
            buf = np.zeros(1, dtype=np.int64)
            self.side.Recv(buf, source=0, tag=TAG_PING)
            self._send_side(int(buf[0]), 0, TAG_PONG)

    def check_alive(self, waited, limit):
        """Server, waiting past the watchdog's limit: ping every worker and wait ``PING_GRACE_SECONDS`` for the
        answers.  All answered (the collective is slow, not dead): return.  Otherwise raise :class:`SilentRank`
        naming those that did not; the caller ends the job without another collective."""
        answers = {r: np.zeros(1, dtype=np.int64) for r in range(1, self.size)}
        recvs = {r: self.side.Irecv(answers[r], source=r, tag=TAG_PONG) for r in answers}
        pings = [self.side.Isend(np.array([r], dtype=np.int64), dest=r, tag=TAG_PING) for r in answers]
        give_up = time.perf_counter() + PING_GRACE_SECONDS
        silent = list(recvs)
        while silent and time.perf_counter() < give_up:
            silent = [r for r in silent if not recvs[r].Test()]
            time.sleep(POLL_SECONDS / 5)
        if not silent:
            self.MPI.Request.Waitall(pings)
            return
        who = f"rank {silent[0]}" if len(silent) == 1 else "ranks " + ", ".join(map(str, silent))
        raise SilentRank(f"{who} of {self.size} did not answer after the job waited {waited:.0f} s in a collective "
                         f"(stopped or wedged): ending the job (--watchdog: {limit:.0f} s, at least "
                         f"{self.watch.seconds:g} s and 10x the slowest wait); the last checkpoint is intact")

    # -- the two float-vector collectives everything below is made of -----------
    def gatherv(self, local: np.ndarray, counts) -> np.ndarray | None:
        """Gatherv of the float64 buffer ``local`` (``counts[r]`` values from rank r): the server gets the
        concatenation in rank order (flat), workers None."""
        if not self.is_server:
            self.complete(self.comm.Igatherv(local, None, root=0))
            return None
        recv = np.empty(int(counts.sum()), dtype=np.float64)
        self.complete(self.comm.Igatherv(local, [recv, counts, displacements(counts), self.MPI.DOUBLE], root=0))
        self.moved(int(counts.sum()) * 8)
        return recv

    def scatterv(self, send: np.ndarray | None, counts, mine: np.ndarray) -> np.ndarray:
        """Scatterv of the server's float64 buffer ``send`` (``counts[r]`` values to rank r) into ``mine``."""
        if self.is_server:
            self.complete(self.comm.Iscatterv([send, counts, displacements(counts), self.MPI.DOUBLE], mine, root=0))
            self.moved(int(counts.sum()) * 8)
        else:
            self.complete(self.comm.Iscatterv(None, mine, root=0))
        return mine

    # -- small metadata (pickle-based, rare) -------------------------------
    def bcast_object(self, obj):
        return self.comm.bcast(obj, root=0)

    def gather_objects(self, obj):
        return self.comm.gather(obj, root=0)

    def allgather_objects(self, obj):
        return self.comm.allgather(obj)

    # -- hot path: uppercase collectives on NumPy buffers ---------------------
    def send_command(self, command: int, a: int = 0, b: int = 0, c: int = 0):
        """Server: broadcast a command; returns it (workers call :meth:`receive_command`)."""
        ctrl = np.array([command, a, b, c], dtype=np.int64)
        self.complete(self.comm.Ibcast(ctrl, root=0))
        self.moved(ctrl.nbytes * (self.size - 1))
        return ctrl

    def receive_command(self):
        ctrl = np.empty(CONTROL_SIZE, dtype=np.int64)
        self.complete(self.comm.Ibcast(ctrl, root=0))
        self.forward_signal()           # a signal that arrived during a short wait or the last computation
        return ctrl

    def gather_block_rows(self, local: np.ndarray, width: int) -> np.ndarray | None:
        """Gatherv ``(n_my_blocks x width)`` rows to the server, in plan order."""
        local = np.ascontiguousarray(local, dtype=np.float64).reshape(-1, width)
        recv = self.gatherv(local, self.block_counts * width)
        return None if recv is None else recv.reshape(len(self.blocks), width)

    def scatter_block_rows(self, rows: np.ndarray | None, width: int) -> np.ndarray:
        """Scatterv ``(n_blocks x width)`` rows from the server; each rank gets its blocks'."""
        mine = np.empty((len(self.my_blocks), width), dtype=np.float64)
        send = np.ascontiguousarray(rows, dtype=np.float64) if self.is_server else None
        return self.scatterv(send, self.block_counts * width, mine)

    def gather_variable(self, local: np.ndarray):
        """Gatherv of variable-length float vectors (one per rank); server gets the list."""
        local = np.ascontiguousarray(local, dtype=np.float64).reshape(-1)
        counts = np.zeros(self.size if self.is_server else 0, dtype=np.int64)    # nonblocking: see complete()
        self.complete(self.comm.Igather(np.array([local.size], dtype=np.int64), counts, root=0))
        if self.is_server:
            self.moved(8 * self.size)
        recv = self.gatherv(local, counts)
        return None if recv is None else [recv[s:s + c] for s, c in zip(displacements(counts), counts)]

    def scatter_variable(self, pieces):
        """Scatterv of variable-length float vectors (server gives one per rank)."""
        counts = np.array([len(p) for p in pieces], dtype=np.int64) if self.is_server else None
        count = np.zeros(1, dtype=np.int64)
        self.complete(self.comm.Iscatter(counts, count, root=0))
        mine = np.empty(int(count[0]), dtype=np.float64)
        send = None
        if self.is_server:
            self.moved(8 * self.size)
            send = np.concatenate([np.asarray(p, dtype=np.float64) for p in pieces]) if counts.sum() else np.zeros(0)
        return self.scatterv(send, counts, mine)

    def gather_counted(self, local: np.ndarray, counts) -> np.ndarray | None:
        """Gatherv of one float vector per rank whose lengths every rank knows (``counts``, per rank, e.g.
        the values of its blocks on their supports): the server gets them concatenated in rank order.  Unlike
        :meth:`gather_variable` no sizes travel, only the values."""
        local, counts = self.counted_local(local, counts)
        return self.gatherv(local, counts)

    def scatter_counted(self, send: np.ndarray | None, counts) -> np.ndarray:
        """Scatterv of the server's ``send`` (every rank's piece, concatenated in rank order) by lengths every
        rank knows (``counts``, per rank); each rank gets its piece."""
        counts = np.asarray(counts, dtype=np.int64)
        mine = np.empty(int(counts[self.rank]), dtype=np.float64)
        if self.is_server:
            send = np.ascontiguousarray(send, dtype=np.float64).reshape(-1)
            if send.size != counts.sum():
                raise ValueError(f"{send.size} values to scatter, {int(counts.sum())} expected")
        return self.scatterv(send, counts, mine)

    def bcast_array(self, array: np.ndarray | None, shape, dtype=np.float64) -> np.ndarray:
        """Bcast a shared array (e.g. sigma_ii and rho) from the server."""
        buf = np.ascontiguousarray(array, dtype=dtype) if self.is_server else np.empty(shape, dtype=dtype)
        self.complete(self.comm.Ibcast(buf, root=0))
        if self.is_server:
            self.moved(buf.nbytes * (self.size - 1))
        return buf

    def barrier(self):
        self.comm.Barrier()

    def abort(self, code: int):
        self.comm.Abort(code)
