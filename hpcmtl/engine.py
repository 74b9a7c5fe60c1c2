"""The distributed engine every algorithm runs on.

An algorithm supplies three things: its commands (a :class:`Command` enum: one
member per message, declaring its id, what the server sends with it, what the
ranks send back and the names of its control integers), a worker side (a
:class:`LocalBase` holding the rank's task blocks, with one plain method per
command computing ``(block state, inputs) -> rows`` without touching the
cluster) and a server side (a :class:`ServerBase` driving rounds).

The protocol: the server calls ``ServerBase.command(cmd, payload, **fields)``,
which broadcasts the control (``[id, field 1, field 2, field 3]``, 4 int64)
and then runs :meth:`Endpoint.execute`, exactly what every worker runs when it
receives that control in :meth:`Endpoint.serve`: the command's down collective
(``cmd.down``: Scatterv of per-block rows, Scatterv of per-rank vectors, Bcast
of a shared vector, or nothing), the computation on the rank's own blocks
(the server's are nonempty only when P = 1), and the command's up collective
(``cmd.up``: Gatherv of per-block rows or of per-rank vectors, a gather of
objects, :meth:`Cluster.agree`, or nothing).  The server gets what the up
collective delivers; no handler runs anywhere just to join a collective.

This module also does the rest, identically for every algorithm: plan and read
the blocks (each rank only its own, failing together on bad data), run the
worker loop, end every rank with the server's exit code, take checkpoints at
safe points and react to termination signals, gather test metrics and per-rank
memory figures (:func:`run`, :func:`train`).  A DMTRL block's checkpoint
state is :class:`hpcmtl.checkpoint.BlockState`.
"""
from __future__ import annotations

import contextlib
import enum
import functools
import os
import time
from dataclasses import dataclass

import numpy as np

from .cluster import (CONTROL_SIZE, STOP, STOP_DONE, STOP_FAILED, STOP_PREEMPTED, AgreedError, SilentRank,
                      StopRequested, fault_point, plan_blocks)
from .errors import ConvergenceError, InputError, Preempted
from .features import rff_map
from .memory import check_columns, check_fits, dense_bytes
from .losses import get_loss, signed_labels
from .metrics import summarize, task_metrics
from .taskdata import float32_overflow, float32_overflow_error


# ---------------------------------------------------------------------------
# The protocol: commands, their collectives and their control integers
# ---------------------------------------------------------------------------
class Down(enum.Enum):
    """What the server sends with a command (after the control broadcast)."""
    NOTHING = "nothing"                 # the computation gets the server's payload on the server, None elsewhere
    SCATTER_ROWS = "scatter rows"       # Scatterv (n_blocks x ctrl.width) rows: each rank gets its blocks' rows
    SCATTER_VECTORS = "scatter vectors" # Scatterv one float vector per rank (payload: a list in rank order)
    BCAST = "bcast"                     # Bcast one shared float vector of length ctrl.width
    SCATTER_SUPPORT = "scatter support" # Scatterv per-block rows of ctrl.vectors x |S_k| + ctrl.scalars values
                                        # (each block's d-vectors on its support S_k): flat, plan order


class Up(enum.Enum):
    """What the ranks send back; the server's :meth:`ServerBase.command` returns what it delivers."""
    NOTHING = "nothing"                 # None
    GATHER_ROWS = "gather rows"         # Gatherv per-block rows: (n_blocks x width) in plan order
    GATHER_VECTORS = "gather vectors"   # Gatherv one float vector per rank: a list in rank order
    GATHER_OBJECTS = "gather objects"   # gather one picklable object per rank: a list in rank order
    AGREE = "agree"                     # Cluster.agree on the error (str or None) each rank returns
    GATHER_SUPPORT = "gather support"   # Gatherv per-block rows on supports (as SCATTER_SUPPORT): flat, plan order


class Command(enum.IntEnum):
    """Base of every method's command enum; a member is ``ID = id, down, up, fields, compute[, up_if]``.

    ``fields`` name the control integers after the id (at most three: the
    wire is 4 int64), read as ``ctrl.round``, ``ctrl.width``, ...;
    ``compute`` names the method of the rank's local state that runs the
    computation ``(ctrl, inputs) -> rows`` (inputs: what ``down`` delivered);
    ``up_if`` names a field that, when 0, skips the up collective (the
    computation returns None then).  Ids are unique across every enum one
    local state serves.
    """

    def __new__(cls, value, down, up, fields=(), compute=None, up_if=None):
        obj = int.__new__(cls, value)
        obj._value_ = value
        if len(fields) > CONTROL_SIZE - 1:
            raise ValueError(f"command {value}: at most {CONTROL_SIZE - 1} control fields")
        obj.down, obj.up, obj.fields, obj.compute, obj.up_if = down, up, tuple(fields), compute, up_if
        return obj


class EngineCommand(Command):
    """The commands every algorithm shares."""
    TEST = 100, Down.NOTHING, Up.GATHER_OBJECTS, (), "test_metrics"   # per-task test (labels, scores) of the current w



class Control:
    """A received (or sent) control broadcast, its integers read by the names its command declares."""

    __slots__ = ("command", "raw")

    def __init__(self, command, raw):
        self.command = command
        self.raw = raw

    def __getattr__(self, name):
        try:
            return int(self.raw[1 + self.command.fields.index(name)])
        except ValueError:
            raise AttributeError(f"command {self.command!r} has no control field {name!r} "
                                 f"(it has {self.command.fields})") from None

    @classmethod
    def send(cls, cluster, command, **fields):
        """Server: broadcast ``[id, fields in declared order]`` (unnamed ones 0)."""
        unknown = set(fields) - set(command.fields)
        if unknown:
            raise TypeError(f"command {command!r} has no control fields {sorted(unknown)}")
        values = [int(fields.get(name, 0)) for name in command.fields]
        return cls(command, cluster.send_command(int(command), *values))


class Endpoint:
    """Runs commands on one rank: down collective, the local computation, up collective."""

    def __init__(self, cluster, local):
        self.cluster = cluster
        self.local = local
        self.commands = {}
        for enum_ in local.COMMANDS:
            for c in enum_:
                if int(c) in self.commands:
                    raise ValueError(f"command id {int(c)} declared twice: {self.commands[int(c)]!r} and {c!r}")
                self.commands[int(c)] = c

    def execute(self, ctrl, payload=None):
        """Run ``ctrl.command`` here; returns what the up collective delivers (on the server), else None."""
        cmd, cluster = ctrl.command, self.cluster
        if cmd.down is Down.SCATTER_ROWS:
            inputs = cluster.scatter_block_rows(payload, ctrl.width)
        elif cmd.down is Down.SCATTER_VECTORS:
            inputs = cluster.scatter_variable(payload)
        elif cmd.down is Down.BCAST:
            inputs = cluster.bcast_array(payload, (ctrl.width,))
        elif cmd.down is Down.SCATTER_SUPPORT:
            inputs = cluster.scatter_counted(payload, self.support_counts(ctrl))
        else:
            inputs = payload
        out = getattr(self.local, cmd.compute)(ctrl, inputs)
        if cmd.up is Up.NOTHING or (cmd.up_if is not None and not getattr(ctrl, cmd.up_if)):
            return None
        if cmd.up is Up.GATHER_ROWS:
            return cluster.gather_block_rows(out, out.shape[1])
        if cmd.up is Up.GATHER_VECTORS:
            return cluster.gather_variable(out)
        if cmd.up is Up.GATHER_OBJECTS:
            return cluster.gather_objects(out)
        if cmd.up is Up.GATHER_SUPPORT:
            return cluster.gather_counted(out, self.support_counts(ctrl))
        cluster.agree(out)              # Up.AGREE
        return None

    def support_counts(self, ctrl):
        """Per rank, the values a support collective carries: ``vectors |S_k| + scalars`` summed over its blocks
        (``local.support_sizes``: every plan block's |S_k|, known on every rank once registered)."""
        return self.cluster.rank_totals(ctrl.vectors * np.asarray(self.local.support_sizes) + ctrl.scalars)

    def serve(self):
        """Worker loop: obey the server's commands until STOP; return (reason, exit code)."""
        while True:
            raw = self.cluster.receive_command()
            if raw[0] == STOP:
                return int(raw[1]), int(raw[2])
            self.execute(Control(self.commands[int(raw[0])], raw))


# ---------------------------------------------------------------------------
# Loading: every rank reads only its own blocks, and all ranks fail together
# ---------------------------------------------------------------------------
def planned_for(cluster, source, config):
    """``cluster`` under the plan of ``source``'s blocks: balanced by non-zeros over its workers, tasks cut
    under ``config.split_tasks`` (:func:`hpcmtl.cluster.plan_blocks`)."""
    return cluster.planned(plan_blocks(source.n_samples, source.nnz, cluster.n_workers, config.split_tasks))


def load_blocks(cluster, source, config, test_source=None, prepare=True):
    """Read this rank's rows (and test rows) of ``cluster``'s plan and validate them.

    ``cluster``: planned (:func:`planned_for`); an unplanned one is planned
    here the same way, for callers that want only this rank's blocks.
    ``config`` needs ``loss``, ``positive_label``, ``split_tasks``, ``rff_dim``,
    ``rff_gamma`` and ``seed``; with a ``positive_label`` the labels of two classes
    become -1/+1 as they are read (``losses.signed_labels``), test labels too; with
    ``fit_intercept`` the training blocks are centered or augmented
    (:func:`with_intercept`; ``prepare=False``: the training blocks as read, the
    caller prepares them), the test blocks augmented alike.  Rank-local problems (a corrupt group, NaN, bad labels) are
    collected and raised on every rank through :meth:`Cluster.agree` before any
    data collective starts.
    """
    loss = get_loss(config.loss)
    if not cluster.is_planned:
        cluster = planned_for(cluster, source, config)
    error = None
    mine, tests = [], {}
    phi = None
    try:
        # before any array proportional to d, m or rff_dim: refuse what cannot fit (one line on every rank)
        check_columns(source.n_features, source.path)
        check_fits(dense_bytes(source.n_features, source.n_tasks, config.rff_dim or 0,
                               rows=sum(b.stop - b.start for b in cluster.my_blocks)),
                   f"{source.path}: {source.n_tasks} tasks of {source.n_features} features"
                   + (f" (rff_dim {config.rff_dim})" if config.rff_dim else ""))
        phi = rff_map(source.n_features, config.rff_dim, config.rff_gamma, config.seed) if config.rff_dim else None
        if test_source is not None:
            if test_source.n_features != source.n_features:
                raise InputError(f"{test_source.path}: has {test_source.n_features} features, "
                                 f"the training data {source.path} has {source.n_features}")
            if list(test_source.names) != list(source.names):
                raise InputError(f"{test_source.path}: task names differ from the training data {source.path}")
        augment = intercept_mode(config) == "augment"
        options = read_options(source, config, phi, prepare and augment)
        test_options = read_options(test_source, config, phi, augment)
        read_augmented = "constant_column" in options
        own = getattr(source, "fresh_arrays", False)        # a file's blocks: centered in place (no second copy)
        for b in cluster.my_blocks:
            blk = source.read_block(b.task, b.start, b.stop, b.part, **options)
            blk.y = signed_labels(loss, blk.y, config.positive_label, f"{source.path}: task '{blk.name}' (#{b.task})")
            if phi is not None:
                blk = blk.transformed(phi)
            if getattr(config, "float32", False):
                blk = as_float32(blk, f"{source.path}: task '{blk.name}' (#{b.task})")
            check_scale(blk, f"{source.path}: task '{blk.name}' (#{b.task})", loss)
            mine.append(with_intercept(blk, config, source, means_map(config, phi), own=own)
                        if prepare and not read_augmented else blk)
            if test_source is not None and b.part == 0:
                test = test_source.read_block(b.task, **test_options)
                test.y = signed_labels(loss, test.y, config.positive_label,
                                       f"{test_source.path}: task '{test.name}' (#{b.task})")
                test = test.transformed(phi) if phi is not None else test
                if getattr(config, "float32", False):
                    test = as_float32(test, f"{test_source.path}: task '{test.name}' (#{b.task})")
                check_scale(test, f"{test_source.path}: task '{test.name}' (#{b.task})", loss)
                # scored with the training block's intercept (LocalBase.test_metrics); augmented like it
                tests[b.task] = test.augmented(config.intercept_scaling) \
                    if augment and "constant_column" not in test_options else test
    except InputError as exc:
        error = str(exc)
    cluster.agree(error)
    from .checkpoint import share_fingerprints
    share_fingerprints(cluster, source)     # the server learns what was read (checkpoints, resume check)
    return mine, tests


def read_options(source, config, phi, augment):
    """``read_block``'s options that read a dense file's rows straight into their final array when nothing
    transforms them first: the one with the augmented intercept column (``augment``), rounded to float32 a
    file chunk at a time (``--float32`` on a float64 file): no second copy of a block in memory."""
    direct = phi is None and getattr(source, "storage", None) == "dense"
    options = dict(constant_column=config.intercept_scaling) if augment and direct else {}
    if direct and getattr(config, "float32", False) and getattr(source, "dtype", None) == "float64":
        options["float32"] = True
    return options


# ---------------------------------------------------------------------------
# Per-task intercepts (docs/math.md): how a config fits them, the blocks' preparation, the model's split
# ---------------------------------------------------------------------------
def intercept_mode(config) -> str | None:
    """How ``config`` fits per-task intercepts: None (``fit_intercept`` off), ``'center'`` (squared loss: the
    exact unpenalized intercept by per-task centering), ``'augment'`` (other losses: liblinear's constant
    feature ``intercept_scaling``, its weight regularized like the others) or ``'explicit'`` (the method keeps
    b itself: ``config.explicit_intercept``, joint-sparse)."""
    if not getattr(config, "fit_intercept", False):
        return None
    if getattr(config, "explicit_intercept", False):
        return "explicit"
    return "center" if config.loss == "squared" else "augment"


def model_width(config, n_features: int) -> int:
    """Rows of the W the solvers work on: the features (or random features), plus one augmented row."""
    return (config.rff_dim or n_features) + (1 if intercept_mode(config) == "augment" else 0)


def with_intercept(blk, config, source, phi=None, own=False):
    """A training block prepared for the intercept: centered by its whole task's means (streamed from
    ``source`` in fixed chunks: the same bits on every rank, whatever part of the task it holds), augmented,
    or as it is.  ``own``: nothing else holds ``blk`` (just read), so dense rows are centered in place."""
    mode = intercept_mode(config)
    if mode == "center":
        return blk.centered(*source.task_means(blk.task, phi), in_place=own)
    if mode == "augment":
        return blk.augmented(config.intercept_scaling)
    return blk


def split_intercept(W, config, source):
    """``(W, intercept)`` of the model from the solvers' W (d' x m): the augmented row taken off and scaled,
    or ``b_i = ybar_i - mu_i . w_i`` of the centered problem (means read again on the server), or zeros."""
    W = np.asarray(W)
    mode = intercept_mode(config)
    if mode == "augment":
        return W[:-1].copy(), config.intercept_scaling * W[-1].copy()
    if mode == "center":
        phi = rff_map(source.n_features, config.rff_dim, config.rff_gamma, config.seed) if config.rff_dim else None
        phi = means_map(config, phi)
        b = np.zeros(W.shape[1])
        for i in range(W.shape[1]):
            mu, ybar = source.task_means(i, phi)
            b[i] = ybar - float(mu @ W[:, i])
        return W.copy(), b
    return W.copy(), np.zeros(W.shape[1])


def as_float32(blk, where):
    """``--float32``: the block with its features rounded to float32, a value beyond float32's range refused
    (:class:`InputError` naming ``where``, the field and the row: exit 2 on every rank)."""
    big = float32_overflow(blk.X)
    if big is not None:
        raise float32_overflow_error(where, blk.row_start + big[0], big[1])
    return blk.as_float32()


def means_map(config, phi):
    """The map the task means of centering read rows through: ``phi``, rounded to float32 under ``--float32``."""
    return rounded_map(phi) if getattr(config, "float32", False) else phi


def rounded_map(phi):
    """The feature map ``phi`` (None: identity) followed by rounding to float32: the task means of centering
    are then those of the rounded rows the solvers see (the same bits as a float32 file's)."""
    return lambda X: (phi(X) if phi is not None else X).astype(np.float32)


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
    non-finite number ends the job wherever it appears.  The variable is read by
    :func:`arm_nan_fault` (at import and at the start of every :func:`run`), not
    here: this is asked once a block a round, and an ``os.environ`` lookup each
    time was a visible part of a Landmine-sized serial run.
    """
    spec = _nan_fault
    return spec is not None and spec[0] == int(round_) and spec[1] == int(task)


def arm_nan_fault():
    """Read ``HPCMTL_FAULT_NAN`` for :func:`nan_fault` (None when unset or empty)."""
    global _nan_fault
    spec = os.environ.get("HPCMTL_FAULT_NAN")
    if spec:
        r, t = spec.split(":")[:2]
        _nan_fault = (int(r), int(t))
    else:
        _nan_fault = None


_nan_fault = None
arm_nan_fault()


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
    """A rank's task blocks, their current w and the computations of the shared commands.

    Subclasses list their command enums in ``COMMANDS`` and give each command a
    method ``(ctrl, inputs) -> rows`` (named by the command's ``compute``) that
    works on the blocks only: the collectives are the :class:`Endpoint`'s.
    ``config.loss`` is read when the config has one (online configs do not).
    """

    COMMANDS = (EngineCommand,)

    def __init__(self, cluster, blocks, config, test_blocks=None):
        self.cluster = cluster          # planned: the rank (fault hooks) and the plan the run follows (run());
                                        # computations never call it
        self.blocks = blocks
        self.test_blocks = test_blocks or {}
        self.config = config
        self.loss = get_loss(config.loss) if hasattr(config, "loss") else None
        self.d = blocks[0].n_features if blocks else 0
        # m_local x d, one row per block (not d x m): a block's w is a contiguous row for the kernels and for the
        # per-block Scatterv/Gatherv rows
        self.w = np.zeros((len(blocks), self.d))
        self.b = np.zeros(len(blocks))  # a method's own per-block intercept (joint-sparse), added to every score

    @contextlib.contextmanager
    def working_on(self, block, round_):
        """Around one block's work in a round: the test fault hook, and errors that name the task."""
        try:
            fault_point(self.cluster.rank, round_)
            yield
        except Exception as exc:
            exc.hpcmtl_task = block.name
            raise

    def test_metrics(self, ctrl, inputs):
        """TEST: {task: (labels, scores)} of the test rows of this rank's first block of each task.  The server
        computes the metrics (:meth:`ServerBase.test_metrics`): a worker never imports scikit-learn (tens of MB a
        rank)."""
        local = {}
        for k, blk in enumerate(self.blocks):
            test = self.test_blocks.get(blk.task)
            if test is not None and blk.part == 0:
                scores = test.decision(self.full_w(k)) + blk.intercept(self.w[k]) + self.b[k]   # centered: + ybar - mu.w
                local[blk.task] = (test.y, scores)
        return local

    def full_w(self, k):
        """Block k's w over all d features (what scores rows off the block's own features)."""
        return self.w[k]

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
        if not cluster.is_planned:
            raise ValueError("a server runs under a plan: pass a planned cluster (Cluster.planned)")
        self.blocks = cluster.blocks
        self.block_task = np.array([b.task for b in self.blocks], dtype=np.int64)
        # block k is task k for every k (a task a block, in task order): per_task's sums are the rows themselves
        self.block_is_task = bool(np.array_equal(self.block_task, np.arange(self.m)))
        self.progress = progress
        self.checkpointer = checkpointer
        self.round = 0
        self.t0 = time.perf_counter()
        self.seconds_before = 0.0     # time spent before a resume

    endpoint = None       # set by :func:`run`: this rank's Endpoint (its local state: blocks only when P = 1)

    def command(self, cmd, payload=None, **fields):
        """Broadcast ``cmd`` with its named control fields, run it here like every worker does, return what
        its up collective delivers (rows in plan order, per-rank vectors or objects, or None)."""
        return self.endpoint.execute(Control.send(self.cluster, cmd, **fields), payload)

    def elapsed(self):
        return self.seconds_before + time.perf_counter() - self.t0

    def per_task(self, rows):
        """Sum per-block rows into per-task rows, in the fixed block order (same bits at any P)."""
        if self.block_is_task:               # a block a task: each sum is its one row (0.0 + x is x, bit for bit)
            return np.asarray(rows, dtype=np.float64) + 0.0
        out = np.zeros((self.m,) + rows.shape[1:])
        np.add.at(out, self.block_task, rows)     # unbuffered, in block order: the loop's additions, the same bits
        return out

    def signal_pending(self) -> bool:
        """Server: a termination signal arrived here or at a worker.  Long server computations poll it and end
        early with what they have (each keeps its iterates valid), so the next safe point comes in seconds."""
        ck = self.checkpointer
        return bool(ck is not None and ck.signals is not None and
                    (ck.signal_received() or self.cluster.signal_elsewhere()))

    def safe_point(self, earlier=None):
        """Between rounds: write a checkpoint when one is due or a signal arrived.

        ``earlier``: ``(state, round)``, what :meth:`checkpoint_state` returned after an earlier round, written
        instead of the current state (rounds whose own state is not saved: DMTRL's interior-point rounds resume
        from where they began)."""
        if self.cluster.size > 1:       # the server's own fault point (P = 1: the worker's in the round fires)
            fault_point(self.cluster.rank, self.round)
        ck = self.checkpointer
        if ck is None:
            return
        signal_name, who = ck.signal_received(), ""
        if not signal_name and ck.signals is not None:      # a worker's signal stops the job the same way
            remote = self.cluster.signal_elsewhere()
            if remote is not None:
                signal_name, who = remote[1], f"rank {remote[0]} "
        if signal_name or ck.due(self.round):
            ck.save(self, None if earlier is None else earlier[0])
        if signal_name:
            after = self.round if earlier is None else earlier[1]
            raise Preempted(f"{who}received {signal_name}: checkpoint written to {ck.path} after round {after}; "
                            f"continue with --resume")

    def test_metrics(self, regression):
        """Per-task test metrics and their summary from every rank's (labels, scores) (None without a test set)."""
        per_task = {}
        for part in self.command(EngineCommand.TEST):
            per_task.update(part)
        tasks = [dict(name=self.names[t], **task_metrics(*per_task[t], regression)) for t in sorted(per_task)]
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
    """Peak resident memory of this process so far (MB): Linux's VmHWM, which belongs to this program's image
    alone; ``ru_maxrss`` (elsewhere) keeps the high-water mark of the process that forked it across the exec, so a
    run started from a large Python process (a notebook, a workflow manager) would report that one's."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run(local, make_server, rss_before_data, resume=None):
    """Workers serve, the server runs; every rank ends with the server's outcome.

    The run's plan is the one ``local`` was made under (``local.cluster``, a
    planned cluster): this rank's :class:`Endpoint` and the server
    (``make_server(cluster)``) use that cluster.  Returns ``(server, outcome,
    rank_stats)`` on the server, where rank_stats is a ``(P x 3)`` array of
    (RSS before data, partition MB, peak RSS MB) per rank, and None on
    workers.  However the server ends (done, preempted, failed), it tells the
    workers, so no rank is left waiting in a collective.
    """
    cluster = local.cluster
    arm_nan_fault()                      # the test hook as this run's environment sets it
    endpoint = Endpoint(cluster, local)
    stats = lambda: (rss_before_data, local.partition_mb(), peak_rss_mb())  # noqa: E731
    if not cluster.is_server:
        reason, code = endpoint.serve()
        if reason == STOP_PREEMPTED:
            raise Preempted("stopped for a checkpoint")
        if reason == STOP_FAILED:
            raise StopRequested(code)
        cluster.gather_objects(stats())
        return None
    server = make_server(cluster)
    server.endpoint = endpoint
    try:
        outcome = server.run(resume)
    except Preempted:
        server.stop(STOP_PREEMPTED, Preempted.exit_code)
        raise
    except (AgreedError, SilentRank):   # every rank raised it in the same collective, or a rank is silent and a
        raise                            # STOP would wait for it too: run_main ends the job
    except BaseException as exc:
        server.stop(STOP_FAILED, getattr(exc, "exit_code", 1))
        exc.hpcmtl_workers_stopped = True      # every worker has left with the exit code: no MPI_Abort needed
        raise
    server.stop(STOP_DONE)
    return server, outcome, np.array(cluster.gather_objects(stats()))


def local_reader(local_class, cluster, source, config, test_source=None):
    """``make_local`` for :func:`train` when the local state is ``local_class(cluster, blocks, config, tests)``."""
    def make_local():
        planned = planned_for(cluster, source, config)
        blocks, tests = load_blocks(planned, source, config, test_source)
        return local_class(planned, blocks, config, tests)
    return make_local


@functools.lru_cache(maxsize=1)
def _blas_controller():
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController()


def one_blas_thread():
    """A context in which BLAS / LAPACK run on one thread: every rank's whole run (:func:`train`).

    * The same bits on any node: a threaded BLAS splits some sums by its thread count (a worker's
      ``X^T q`` and ``y . q`` on MNIST-sized blocks), so the results would depend on the cores a rank
      finds, not only on the data and the rank count.
    * Speed where it matters: the kernels are one thread a rank, an MPI job places one rank a core, and
      a rank's BLAS threads then fight the other ranks for their cores (MNIST at P = 3 on 2 cores: a
      round 0.41 -> 0.22 s); the server's algebra is on m x m (2m x 2m) matrices, where a threaded eigh
      or Cholesky is slower than one thread (7x for m = 60 on a loaded 2-core node).

    Entered once a run: threadpoolctl's limits cost milliseconds each."""
    return _blas_controller().limit(limits=1, user_api="blas")


def train(cluster, make_local, make_server, build_result, resume=None):
    """What every method's ``train`` does around its own classes, on every rank.

    ``make_local()`` reads this rank's data and returns its :class:`LocalBase`
    over a planned cluster (the RSS before it is the "before data" figure);
    ``make_server(cluster)`` builds the server on that planned cluster (rank 0
    only); ``resume`` is a zero-argument checkpoint reader
    (called on the server, inside the run) or None; ``build_result(server,
    outcome, extra)`` makes the server's result, ``extra`` holding the
    per-rank memory figures.  Returns that result on the server, None on workers.
    """
    rss_before_data = peak_rss_mb()
    with one_blas_thread():
        local = make_local()
        state = resume if resume is not None and cluster.is_server else None
        outcome = run(local, make_server, rss_before_data, state)
    if outcome is None:
        return None
    server, value, ranks = outcome
    extra = {"rss_before_data_mb": ranks[:, 0], "partition_mb": ranks[:, 1], "peak_rss_mb": ranks[:, 2]}
    return build_result(server, value, extra)
