"""The distributed engine every algorithm runs on.

An algorithm supplies two classes: a worker side (a :class:`LocalBase` holding
the rank's task blocks and answering commands) and a server side (a
:class:`ServerBase` driving rounds).  This module does the rest, identically
for all of them: plan and read the blocks (each rank only its own, failing
together on bad data), run the worker loop, end every rank with the server's
exit code, take checkpoints at safe points and react to termination signals,
gather test metrics and per-rank memory figures.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

import numpy as np

from .cluster import STOP, STOP_DONE, AgreedError, STOP_FAILED, STOP_PREEMPTED, StopRequested, fault_point, plan_blocks
from .errors import ConvergenceError, InputError, Preempted
from .features import rff_map
from .losses import check_labels, get_loss
from .metrics import summarize, task_metrics

CMD_TEST = 100        # per-task test metrics of the current w columns (shared by all algorithms)


# ---------------------------------------------------------------------------
# Loading: every rank reads only its own blocks, and all ranks fail together
# ---------------------------------------------------------------------------
def load_blocks(cluster, source, config, test_source=None):
    """Plan the blocks, read this rank's rows (and test rows) and validate them.

    ``config`` needs ``loss``, ``split_tasks``, ``rff_dim``, ``rff_gamma`` and
    ``seed``.  Rank-local problems (a corrupt group, NaN, bad labels) are
    collected and raised on every rank through :meth:`Cluster.agree` before any
    data collective starts.
    """
    loss = get_loss(config.loss)
    blocks = plan_blocks(source.n_samples, source.nnz, cluster.n_workers, config.split_tasks)
    cluster.set_plan(blocks)
    error = None
    mine, tests = [], {}
    phi = rff_map(source.n_features, config.rff_dim, config.rff_gamma, config.seed) if config.rff_dim else None
    try:
        if test_source is not None:
            if test_source.n_features != source.n_features:
                raise InputError(f"{test_source.path}: has {test_source.n_features} features, "
                                 f"the training data {source.path} has {source.n_features}")
            if list(test_source.names) != list(source.names):
                raise InputError(f"{test_source.path}: task names differ from the training data {source.path}")
        for b in cluster.my_blocks:
            blk = source.read_block(b.task, b.start, b.stop, b.part)
            check_labels(loss, blk.y, f"{source.path}: task '{blk.name}' (#{b.task})")
            if phi is not None:
                blk = blk.transformed(phi)
            check_scale(blk, f"{source.path}: task '{blk.name}' (#{b.task})", loss)
            mine.append(blk)
            if test_source is not None and b.part == 0:
                test = test_source.read_task(b.task)
                check_labels(loss, test.y, f"{test_source.path}: task '{test.name}' (#{b.task})")
                tests[b.task] = test.transformed(phi) if phi is not None else test
                check_scale(tests[b.task], f"{test_source.path}: task '{test.name}' (#{b.task})", loss)
    except InputError as exc:
        error = str(exc)
    cluster.agree(error)
    from .checkpoint import share_fingerprints
    share_fingerprints(cluster, source)     # the server learns what was read (checkpoints, resume check)
    return mine, tests


def check_scale(blk, where, loss=None):
    """Refuse data whose magnitudes overflow double precision in the solvers.

    Finite values can still overflow where the solvers square them: ``||x_j||^2``
    (every coordinate step and the duality gap use it), and ``y^2`` in the
    squared loss.  ``where`` names the file and task; the row is given in the
    task's numbering.  Raises :class:`InputError` (exit 2, every rank together).
    """
    sq = blk.sq_norms
    bad = np.flatnonzero(~np.isfinite(sq))
    if bad.size:
        j = int(bad[0])
        raise InputError(f"{where}: field 'X': row {blk.row_start + j}: the squared norm ||x||^2 overflows "
                         f"(largest |x| {float(np.max(np.abs(blk.X[j].data if blk.sparse else blk.X[j]))):.3g}); "
                         f"rescale the features")
    if loss is not None and loss.name == "squared":
        with np.errstate(over="ignore"):
            bad = np.flatnonzero(~np.isfinite(blk.y * blk.y))
        if bad.size:
            j = int(bad[0])
            raise InputError(f"{where}: field 'y': row {blk.row_start + j}: y^2 overflows (y = {blk.y[j]:.3g}); "
                             f"rescale the labels")


def nan_fault(round_, task) -> bool:
    """Test hook: ``HPCMTL_FAULT_NAN=ROUND:TASK`` makes that task's worker report NaN in that round.

    The same round and task at any rank count, so tests can check that a
    non-finite number ends the job wherever it appears.
    """
    spec = os.environ.get("HPCMTL_FAULT_NAN")
    if not spec:
        return False
    r, t = spec.split(":")[:2]
    return int(r) == int(round_) and int(t) == int(task)


def check_finite_rows(values, round_, names, what, outer=None):
    """Raise :class:`ConvergenceError` naming the round and the first task whose row of ``values`` is not finite.

    ``values``: one row (or one number) per task.  Every certificate and
    every tolerance comparison is preceded by such a check, because every
    comparison with NaN is false.
    """
    values = np.asarray(values)
    finite = np.isfinite(values) if values.ndim == 1 else np.all(np.isfinite(values.reshape(values.shape[0], -1)), axis=1)
    if finite.all():
        return
    i = int(np.flatnonzero(~finite)[0])
    where = f"round {round_}" + (f" (outer step {outer})" if outer is not None else "")
    shown = values[i] if values.ndim == 1 else values[i].reshape(-1)[~np.isfinite(values[i].reshape(-1))][0]
    raise ConvergenceError(f"non-finite {what} in {where}: task '{names[i]}' (#{i}) has {shown}; "
                           f"the last checkpoint (if any) is intact")


# ---------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------
class LocalBase:
    """A rank's task blocks, their current w columns and the shared handlers."""

    def __init__(self, cluster, blocks, config, test_blocks=None):
        self.cluster = cluster
        self.blocks = blocks
        self.test_blocks = test_blocks or {}
        self.config = config
        self.loss = get_loss(config.loss)
        self.d = blocks[0].n_features if blocks else 0
        self.w = np.zeros((len(blocks), self.d))

    @contextlib.contextmanager
    def working_on(self, block, round_):
        """Around one block's work in a round: the test fault hook, and errors that name the task."""
        try:
            fault_point(self.cluster.rank, round_)
            yield
        except Exception as exc:
            exc.hpcmtl_task = block.name
            raise

    def handlers(self) -> dict:
        """Command id -> handler(ctrl, payload, width); subclasses add theirs."""
        return {CMD_TEST: self.on_test}

    def register(self):
        self.cluster.handlers.update(self.handlers())

    def on_test(self, ctrl, payload, width):
        regression = not self.loss.binary_labels
        local = {}
        for k, blk in enumerate(self.blocks):
            test = self.test_blocks.get(blk.task)
            if test is not None and blk.part == 0:
                local[blk.task] = task_metrics(test.y, test.decision(self.w[k]), regression)
        gathered = self.cluster.gather_objects(local)
        if gathered is None:
            return None
        merged = {}
        for part in gathered:
            merged.update(part)
        return merged

    def extra_bytes(self) -> int:
        """Per-rank state beyond the data (dual variables, ...), for the memory report."""
        return 0

    def partition_mb(self) -> float:
        """Memory of this rank's own data partition and algorithm state (MB)."""
        total = self.extra_bytes()
        for blk in self.blocks:
            total += blk.rows.nbytes + blk.y.nbytes + blk.sq_norms.nbytes
        for blk in self.test_blocks.values():
            total += blk.rows.nbytes + blk.y.nbytes
        return total / 2 ** 20


def serve(cluster):
    """Worker loop: obey the server's commands until STOP; return (reason, exit code)."""
    while True:
        ctrl = cluster.receive_command()
        if ctrl[0] == STOP:
            return int(ctrl[1]), int(ctrl[2])
        cluster.handlers[int(ctrl[0])](ctrl, None, int(ctrl[2]))


# ---------------------------------------------------------------------------
# Server side
# ---------------------------------------------------------------------------
class ServerBase:
    """Drives the rounds on rank 0: commands, safe points, test metrics, stopping."""

    def __init__(self, cluster, source, progress=None, checkpointer=None):
        self.cluster = cluster
        self.source = source
        self.m = source.n_tasks
        self.n = np.asarray(source.n_samples, dtype=np.float64)
        self.names = list(source.names)
        self.blocks = cluster.blocks
        self.block_task = np.array([b.task for b in self.blocks], dtype=np.int64)
        self.progress = progress
        self.checkpointer = checkpointer
        self.round = 0
        self.t0 = time.perf_counter()
        self.seconds_before = 0.0     # time spent before a resume

    def command(self, cmd, a=0, payload=None, width=0):
        ctrl = self.cluster.send_command(cmd, a, width)
        return self.cluster.handlers[cmd](ctrl, payload, width)

    def elapsed(self):
        return self.seconds_before + time.perf_counter() - self.t0

    def per_task(self, rows):
        """Sum per-block rows into per-task rows, in the fixed block order (same bits at any P)."""
        out = np.zeros((self.m,) + rows.shape[1:])
        for k, task in enumerate(self.block_task):
            out[task] += rows[k]
        return out

    def safe_point(self):
        """Between rounds: write a checkpoint when one is due or a signal arrived."""
        ck = self.checkpointer
        if ck is None:
            return
        signal_name = ck.signal_received()
        if signal_name or ck.due(self.round):
            ck.save(self)
        if signal_name:
            raise Preempted(f"received {signal_name}: checkpoint written to {ck.path} after round {self.round}; "
                            f"continue with --resume")

    def test_metrics(self, regression):
        per_task = self.command(CMD_TEST)
        tasks = [dict(name=self.names[t], **per_task[t]) for t in sorted(per_task)]
        return {"tasks": tasks, "summary": summarize(tasks, regression)} if tasks else None

    def stop(self, reason=STOP_DONE, code=0):
        self.cluster.send_command(STOP, reason, code)

    # subclasses provide: run(resume) -> outcome, checkpoint_state() and restore(ck)


@dataclass
class RunResult:
    """What every engine algorithm hands back on the server (subclasses add their own fields)."""
    W: np.ndarray                  # d x m (task columns)
    history: dict                  # per-round columns
    config: dict
    task_names: list
    n_rounds: int
    seconds: float
    bytes_moved: int


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MB)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run(cluster, local, make_server, rss_before_data, resume=None):
    """Workers serve, the server runs; every rank ends with the server's outcome.

    Returns ``(server, outcome, rank_stats)`` on the server, where rank_stats is a
    ``(P x 3)`` array of (RSS before data, partition MB, peak RSS MB) per rank,
    and None on workers.  However the server ends (done, preempted, failed), it
    tells the workers, so no rank is left waiting in a collective.
    """
    local.register()
    stats = lambda: (rss_before_data, local.partition_mb(), peak_rss_mb())  # noqa: E731
    if not cluster.is_server:
        reason, code = serve(cluster)
        if reason == STOP_PREEMPTED:
            raise Preempted("stopped for a checkpoint")
        if reason == STOP_FAILED:
            raise StopRequested(code)
        cluster.gather_objects(stats())
        return None
    server = make_server()
    try:
        outcome = server.run(resume)
    except Preempted:
        server.stop(STOP_PREEMPTED, Preempted.exit_code)
        raise
    except AgreedError:          # every rank raised it in the same collective: no one to stop
        raise
    except BaseException as exc:
        server.stop(STOP_FAILED, getattr(exc, "exit_code", 1))
        exc.hpcmtl_workers_stopped = True      # every worker has left with the exit code: no MPI_Abort needed
        raise
    server.stop(STOP_DONE)
    return server, outcome, np.array(cluster.gather_objects(stats()))
