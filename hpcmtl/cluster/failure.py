"""Failing together and stopping cleanly: what every backend and :func:`hpcmtl.cluster.run_main` share.

:class:`AgreedError` is an input error every rank raised at once (through
:meth:`Cluster.agree`), :class:`StopRequested` a worker told by the server to
leave with an exit code; :class:`SignalFlag` turns a termination signal into a
checkpoint at the next safe point; :func:`fault_point` is the test hook that
fails one rank at one round.
"""
from __future__ import annotations

import os

from ..errors import InputError

TERMINATION_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")
LAUNCHER_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


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
