"""Failing together and stopping cleanly: what every backend and :func:`hpcmtl.cluster.run_main` share.

:class:`AgreedError` is an input error every rank raised at once (through
:meth:`Cluster.agree`), :class:`StopRequested` a worker told by the server to
leave with an exit code; :class:`SignalFlag` turns a termination signal into a
checkpoint at the next safe point (on whichever rank it arrives: :func:`installed_flag` is what
the backend forwards to the server); :class:`SilentRank` is the watchdog's verdict on a rank that
stopped answering; :func:`fault_point` is the test hook that fails one rank at one round.
"""
from __future__ import annotations

import os

from ..errors import InputError

TERMINATION_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")
# what MPI launchers set in each process they start: MPICH/Hydra and Intel MPI, Open MPI, PMIx, SLURM's srun,
# MVAPICH's mpirun_rsh, Cray's PALS and ALPS.  A process with none of them runs serial without initializing MPI
# (cluster.connect), so a launcher missing here would start P copies of a serial run
LAUNCHER_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK",
                           "PALS_RANKID", "ALPS_APP_PE")


def launcher_rank() -> int:
    """This process's rank as the launcher announced it (before MPI is initialized).

    Used only to keep command-line errors to one line per job: MPICH/Hydra set
    PMI_RANK, Open MPI OMPI_COMM_WORLD_RANK, SLURM's srun SLURM_PROCID.
    """
    for var in LAUNCHER_RANK_VARIABLES:
        value = os.environ.get(var)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def launched_by_mpi() -> bool:
    """Whether an MPI launcher (mpiexec, srun) may have started this process as one of several ranks: one of
    the variables :func:`launcher_rank` reads is set.  A run without mpi4py must not go on alone then (every
    rank would train the whole problem and write the same files)."""
    return any(var in os.environ for var in LAUNCHER_RANK_VARIABLES)


class AgreedError(InputError):
    """An input error every rank raised together (through :meth:`Cluster.agree`): nobody waits for anybody."""


class StopRequested(Exception):
    """A worker was told by the server to stop with a non-zero exit code (server prints why)."""

    def __init__(self, code):
        super().__init__(f"stopped by the server with exit code {code}")
        self.exit_code = int(code)


class SilentRank(Exception):
    """The server's collective waited past the watchdog's limit and a rank did not answer its ping (stopped,
    wedged, or on a dead node): the job must end (exit 1) without another collective, which would wait too."""

    exit_code = 1


WATCHDOG_SECONDS = 300.0     # --watchdog's default: minutes, longer than any healthy wait of a round on a cluster
WATCHDOG_FACTOR = 10         # ... and never below this many times the slowest wait seen in the run so far
PING_GRACE_SECONDS = 5.0     # how long the server waits for the ranks' answers before naming the silent ones
POLL_SECONDS = 0.05          # how often a waiting rank looks for pings (and a worker forwards its signal)


class Watch:
    """What the backend's waits share across a cluster's planned views (like the byte counter): the watchdog's
    limit and the slowest wait seen, a worker's signal as the server learned it, this rank's pending side sends.

    ``seconds``: the watchdog's base limit (0: off).  The server's wait in a collective ends the job when it
    lasts longer than :meth:`limit` and some rank does not answer a ping within ``PING_GRACE_SECONDS``; a
    healthy job whose rounds grow (a long local step, a slow node) raises the limit with them."""

    __slots__ = ("seconds", "slowest", "remote_signal", "sends")

    def __init__(self, seconds=WATCHDOG_SECONDS):
        self.seconds = float(seconds)
        self.slowest = 0.0
        self.remote_signal = None        # (rank, signal name): the first worker signal the server received
        self.sends = []                  # nonblocking side sends still in flight (kept alive until complete)

    def limit(self) -> float:
        """Seconds a server may wait in one collective before it pings the ranks (inf: the watchdog is off)."""
        if not self.seconds:
            return float("inf")
        return max(self.seconds, WATCHDOG_FACTOR * self.slowest)

    def waited(self, seconds):
        self.slowest = max(self.slowest, seconds)


_INSTALLED = []          # the process's SignalFlag, once installed (signals are per process, like the handler)


def installed_flag():
    """The :class:`SignalFlag` this process installed (None: none): a worker's backend forwards what it
    received to the server, which alone decides when the job stops."""
    return _INSTALLED[-1] if _INSTALLED else None


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

    A worker's signal reaches the server through the backend
    (:meth:`~hpcmtl.cluster.mpi.MPICluster.forward_signal`, after the worker's next command): the server
    stops the job at its next safe point as if the signal had been its own, so ``kill -TERM`` of one
    worker's pid (a launcher that signals one task, an OOM-killer's warning) is not swallowed.
    """

    def __init__(self):
        self.received = None
        self.count = 0
        self.forwarded = False               # a worker: told the server already

    def install(self):
        import signal
        for name in TERMINATION_SIGNALS:
            signal.signal(getattr(signal, name), self._handle)
        _INSTALLED.append(self)
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
