"""Online multitask learning with a shared loss (paper 004), distributed over the engine.

Workers own task columns of W (d x k) and the instance rows of the current chunk
of a stream file; per block of rounds they send the base margins ``X_b W`` of
their tasks (one worker also the Gram matrix ``X_b X_b^T``), and the server
solves each round's tau in order with the exact margins, records the running
metrics and sends tau back, so the result is bitwise the same at any rank count
(and with block_rounds = 1 bitwise :class:`hpcmtl.estimators.OnlineMultitask`).
This module holds that run (:class:`OnlineConfig`, :class:`StreamTasks`,
:class:`LocalColumns`, :class:`OnlineServer`, :func:`train`) and the test
metrics of a model on a stream (:func:`evaluate_stream`).

The rest of paper 004 lives beside it: the update rules and choices of C in
:mod:`hpcmtl.online_rules`, the output codes in :mod:`hpcmtl.output_codes`, the
running metrics in :mod:`hpcmtl.metrics`, the in-memory learners
(``OnlineMultitask``, ``OnlineECOC``) in :mod:`hpcmtl.estimators`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from . import _online, engine
from .cluster import fault_point
from .engine import Command, Down, EngineCommand, LocalBase, RunResult, ServerBase, Up
from .errors import InputError
from .metrics import RunningMetrics, error_rates, mistakes, multiclass_mistakes
from .online_rules import auto_C, make_rule, tau  # noqa: F401 (auto_C, tau: see below)
from .output_codes import classes_from_onehot, code_distance, exhaustive_code, get_code  # noqa: F401
from .params import validate as check_params
from .stream_scaling import StreamScaling, check_scale, fit_scaling, row_statistics
from .taskdata import rows_of

# auto_C, tau, code_distance and exhaustive_code stay importable from here for one release: docs/math.md
# showed them as online.<name> before the rules and codes moved to online_rules.py and output_codes.py.


# ---------------------------------------------------------------------------
# Distributed: workers own task columns, the server computes tau once per round
# ---------------------------------------------------------------------------
class OnlineCommand(Command):
    """The distributed online run's messages: ``ID = id, down, up, control fields, computation (a LocalColumns
    method)``.  ``rounds``: the rounds of the block (B) starting at round ``start``."""
    # per rank: base margins X_b W of its tasks (B x k_local), worker 0 also the Gram matrix X_b X_b^T (B x B)
    MARGINS = 31, Down.NOTHING, Up.GATHER_VECTORS, ("start", "rounds"), "margins"
    # per rank: tau of the block's rounds for its tasks (B x k_local); every rank applies them
    UPDATE = 32, Down.SCATTER_VECTORS, Up.NOTHING, ("start", "rounds"), "update"
    # every task's w as one row per task (checkpoint, result)
    GET_W = 33, Down.NOTHING, Up.GATHER_ROWS, (), "get_w"
    # the same, back (resume; width = d)
    SET_W = 34, Down.SCATTER_ROWS, Up.NOTHING, ("width",), "set_w"
    # every rank reads its part of the chunk at round start; all fail together on bad data (the server's own
    # reading error is its input)
    LOAD = 35, Down.NOTHING, Up.AGREE, ("start",), "load_chunk"


@dataclass
class OnlineConfig:
    """Settings of a distributed online run (validated by :meth:`validate`)."""
    update: str = "implicit"
    norm: str = "rmax"
    r: int = 1
    p: float = 2.0
    C: object = 1.0                  # a number or "auto"
    R: float | None = None           # bound on ||x|| (default: the stream's largest row norm)
    code: str | None = None          # an output code over a single-label stream's classes
    decoder: str = "loss"            # the code's decoder (output_codes.decode): "loss" or "hamming"
    scale: str = "none"              # the stream's feature scaling (stream_scaling), shared by the test stream
    block_rounds: int = 64           # rounds per exchange (exact sequential semantics at any value)
    chunk_rounds: int = 4096         # rounds read from the file at a time (a multiple of block_rounds)
    method: str = "online"

    def validate(self, k, max_row_norm, typical=None, owner="train online"):
        """The rule for k tasks; ``typical`` (active tasks a round, mean ||x||^2) is read only for C=auto."""
        checked = check_params({"block_rounds": self.block_rounds, "chunk_rounds": self.chunk_rounds,
                                "decoder": self.decoder}, owner)
        self.block_rounds, self.chunk_rounds = checked["block_rounds"], checked["chunk_rounds"]
        check_scale(self.scale, owner)
        self.chunk_rounds = -(-self.chunk_rounds // self.block_rounds) * self.block_rounds
        if self.R is None:
            self.R = float(max_row_norm) if max_row_norm > 0 else 1.0
        if callable(typical):
            typical = typical() if self.C == "auto" else None
        return make_rule(k, self.C, self.update, self.norm, self.p, self.r, self.R, owner, typical)

    def to_dict(self):
        return asdict(self)


class StreamTasks:
    """A stream file seen as k tasks (label columns, or code columns over its classes).

    Every rank opens the file read-only and reads only what it needs: workers
    the instance rows and their tasks' labels, the server the labels.
    ``scaling``: a scaling kind to fit on this stream (every rank reads it once,
    :func:`hpcmtl.stream_scaling.fit_scaling`) or a fitted
    :class:`~hpcmtl.stream_scaling.StreamScaling` (a test stream takes its model's);
    :meth:`read_rounds` returns scaled instances.
    """

    def __init__(self, path, code=None, label_order=None, scaling=None):
        from .store import StreamFile
        self.stream = StreamFile(path)
        self.path = self.stream.path
        s = self.stream
        self.n_rounds, self.n_features = s.n_rounds, s.n_features
        try:
            self.code = None if code is None else get_code(code, s.n_labels)
        except InputError as exc:
            raise InputError(f"{self.path}: {s.n_labels} labels: {exc}") from None
        if isinstance(scaling, str):
            scaling = fit_scaling(check_scale(scaling), (X for _, X, _ in s.chunks(65536)), s.n_rounds, s.n_features)
        self.scaling = scaling if scaling is not None else StreamScaling()
        self._row_stats = None
        # label_order[j] = the file's column seen as label (or class) j: a test stream in a model's order
        self.label_order = None if label_order is None else np.asarray(label_order, dtype=np.int64)
        self.class_names = s.label_names if label_order is None else [s.label_names[i] for i in self.label_order]
        self.names = self.class_names if self.code is None else [f"code{j}" for j in range(self.code.shape[1])]
        self.n_tasks = len(self.names)
        self.n_samples = np.full(self.n_tasks, self.n_rounds, dtype=np.int64)
        self.nnz = np.full(self.n_tasks, s.nnz, dtype=np.int64)
        self._typical = None

    def typical(self):
        """(active tasks a round, mean ||x||^2) of the stream, for C=auto (every code column is active)."""
        if self._typical is None:
            active = self.n_tasks if self.code is not None else self.stream.mean_active_labels()
            self._typical = (float(active), self.mean_sq_row_norm())
        return self._typical

    def _scaled_stats(self):
        if self._row_stats is None:
            self._row_stats = row_statistics(self.scaling, (X for _, X, _ in self.stream.chunks(65536)))
        return self._row_stats

    def max_row_norm(self):
        """Largest ``||x_t||`` of the (scaled) stream: the default R."""
        return self.stream.max_row_norm() if self.scaling.kind == "none" else self._scaled_stats()[0]

    def mean_sq_row_norm(self):
        """Mean ``||x_t||^2`` of the (scaled) stream: what C=auto scales with."""
        return self.stream.mean_sq_row_norm() if self.scaling.kind == "none" else self._scaled_stats()[1]

    def read_rounds(self, start, stop):
        """Rounds ``start:stop`` as (scaled CSR instances, labels as stored)."""
        X, Y = self.stream.read_rounds(start, stop)
        return self.scaling.apply(X), Y

    def labels(self, Y, start):
        """(task labels, classes or None) of a chunk of the stream's Y."""
        if self.label_order is not None:
            Y = Y[:, self.label_order]
        if self.code is None:
            return np.ascontiguousarray(Y, dtype=np.float64), None
        classes = classes_from_onehot(Y, self.path, start)
        return np.ascontiguousarray(self.code[classes]), classes

    def close(self):
        self.stream.close()


class LocalColumns(LocalBase):
    """Worker side: the rank's task columns of W (d x k_local) and the current chunk of the stream.

    Its plan blocks are whole tasks over the stream, not rows read in advance:
    the base's ``blocks`` stay empty and each computation reads the chunk it needs.
    """

    COMMANDS = (EngineCommand, OnlineCommand)

    def __init__(self, cluster, source, config):
        super().__init__(cluster, [], config)
        self.source = source
        self.d = source.n_features
        self.tasks = np.array([b.task for b in cluster.my_blocks], dtype=np.int64)
        # d x k_local (not per-task rows like LocalBase.w): every round updates all the rank's tasks from one
        # shared instance row, and _online's kernels take W's columns
        self.W = np.zeros((source.n_features, len(self.tasks)))
        self.sends_gram = cluster.my_worker == 0
        self.scratch = np.zeros(source.n_features) if self.sends_gram else None
        self.chunk = (-1, -1)
        self.rows = self.Y = None

    def load(self, start):
        """Make sure the chunk holding round ``start`` is in memory (chunks are aligned to chunk_rounds)."""
        lo = start - start % self.config.chunk_rounds
        if self.chunk[0] == lo:
            return
        hi = min(self.source.n_rounds, lo + self.config.chunk_rounds)
        X, Y = self.source.read_rounds(lo, hi)
        Yt, _ = self.source.labels(Y, lo)
        self.rows, _ = rows_of(X)
        self.Y = np.ascontiguousarray(Yt[:, self.tasks])
        self.chunk = (lo, hi)

    def load_chunk(self, ctrl, server_error):
        """LOAD: read the chunk starting at round ctrl.start; returns the error to agree on (or None)."""
        error = server_error
        if error is None and (len(self.tasks) or self.sends_gram):
            try:
                self.load(ctrl.start)
            except InputError as exc:
                error = str(exc)
        return error

    def margins(self, ctrl, inputs):
        """MARGINS: base margins of the rank's tasks over the block (+ the Gram matrix on worker 0), one vector."""
        start, B = ctrl.start, ctrl.rounds
        fault_point(self.cluster.rank, start // self.config.block_rounds)
        pieces = []
        if len(self.tasks) or self.sends_gram:
            offset = start - self.chunk[0]
            M0 = np.empty((B, len(self.tasks)))
            _online.online_block_margins(self.rows, offset, self.W, M0)
            pieces.append(M0.ravel())
            if self.sends_gram:
                G = np.empty((B, B))
                _online.online_block_gram(self.rows, offset, G, self.scratch)
                pieces.append(G.ravel())
        return np.concatenate(pieces) if pieces else np.zeros(0)

    def update(self, ctrl, tau):
        """UPDATE: apply the block's tau (B x k_local) to the rank's columns."""
        start, B = ctrl.start, ctrl.rounds
        tau_local = tau.reshape(B, len(self.tasks))
        if len(self.tasks):
            offset = start - self.chunk[0]
            _online.online_block_apply(self.rows, offset, np.ascontiguousarray(self.Y[offset:offset + B]),
                                       np.ascontiguousarray(tau_local), self.W)
        return None

    def get_w(self, ctrl, inputs):
        """GET_W: the rank's columns as rows, one per task (k_local x d)."""
        return self.W.T

    def set_w(self, ctrl, rows):
        """SET_W: one row per task (k_local x d) becomes the rank's columns."""
        self.W = np.ascontiguousarray(rows.T)

    def partition_mb(self):
        total = self.W.nbytes
        if self.rows is not None:
            total += self.rows.nbytes + self.Y.nbytes
        return total / 2 ** 20


class OnlineServer(ServerBase):
    """Rank 0: reads the labels, solves each round's tau in order, records the running metrics."""

    def __init__(self, cluster, source, config, rule, progress=None, checkpointer=None):
        super().__init__(cluster, source, progress, checkpointer)
        self.config, self.rule = config, rule
        self.metrics = RunningMetrics(config.decoder)
        self.rank_tasks = [[] for _ in range(cluster.size)]
        for b in self.blocks:
            self.rank_tasks[cluster.worker_rank(b.worker)].append(b.task)
        self.gram_rank = cluster.worker_rank(0)
        self.trace = {"round": [], "seconds": [], "bytes": []}

    def progress_row(self):
        s = self.metrics.summary(self.m)
        return {"round": self.round, "n_rounds": self.source.n_rounds, "cumulative_loss": s["cumulative_loss"],
                "inf_error_rate": s["inf_error_rate"], "one_error_rate": s["one_error_rate"],
                "multiclass_error_rate": s.get("multiclass_error_rate"), "seconds": self.elapsed(),
                "bytes": self.cluster.bytes_moved}

    def block(self, start, B, Y, classes):
        pieces = self.command(OnlineCommand.MARGINS, start=start, rounds=B)
        M0 = np.empty((B, self.m))
        for rank, tasks in enumerate(self.rank_tasks):
            if tasks:
                M0[:, tasks] = pieces[rank][:B * len(tasks)].reshape(B, len(tasks))
        G = pieces[self.gram_rank][B * len(self.rank_tasks[self.gram_rank]):].reshape(B, B)
        tau_b = np.zeros((B, self.m))
        margins = np.empty((B, self.m))
        gloss = np.empty(B)
        _online.online_block_solve(M0, np.ascontiguousarray(G), Y, *self.rule.args(), tau_b, margins, gloss)
        self.metrics.add(Y, margins, gloss, self.source.code, classes)
        self.command(OnlineCommand.UPDATE, payload=[tau_b[:, tasks].ravel() for tasks in self.rank_tasks], start=start,
                     rounds=B)
        self.round = start + B

    def run(self, resume=None):
        if resume is not None:
            self.restore(resume())
        cfg, T = self.config, self.source.n_rounds
        while self.round < T:
            lo = self.round - self.round % cfg.chunk_rounds
            hi = min(T, lo + cfg.chunk_rounds)
            error = None
            try:
                Yc, classes = self.source.labels(self.source.stream.read_labels(lo, hi), lo)
            except InputError as exc:
                error = str(exc)
            self.command(OnlineCommand.LOAD, payload=error, start=lo)
            while self.round < hi:
                start = self.round
                B = min(cfg.block_rounds, hi - start)
                self.block(start, B, np.ascontiguousarray(Yc[start - lo:start - lo + B]),
                           None if classes is None else classes[start - lo:start - lo + B])
                self.safe_point()
            for key, value in (("round", self.round), ("seconds", self.elapsed()), ("bytes", self.cluster.bytes_moved)):
                self.trace[key].append(value)
            if self.progress is not None:
                self.progress(self.progress_row())
        self.final_W = self.gather_W()
        return True

    def gather_W(self):
        rows = self.command(OnlineCommand.GET_W)
        W = np.zeros((self.source.n_features, self.m))
        W[:, self.block_task] = rows.T
        return W

    def checkpoint_state(self):
        arrays = {"W": self.gather_W()}
        arrays.update({f"metrics_{k}": np.concatenate(v) if v else np.zeros(0) for k, v in self.metrics.parts.items()})
        arrays.update({f"trace_{k}": np.asarray(v) for k, v in self.trace.items()})
        counters = {"round": self.round, "seconds": self.elapsed(), "bytes": self.cluster.bytes_moved}
        return arrays, [], counters

    def restore(self, ck):
        a, c = ck["arrays"], ck["counters"]
        if a["W"].shape != (self.source.n_features, self.m):
            raise InputError(f"{ck['path']}: cannot resume: W has shape {a['W'].shape}, expected "
                             f"{(self.source.n_features, self.m)}")
        self.command(OnlineCommand.SET_W, payload=np.ascontiguousarray(a["W"].T[self.block_task]),
                     width=self.source.n_features)
        self.metrics.extend({k: a[f"metrics_{k}"] for k in RunningMetrics.COLUMNS})
        for k in self.trace:
            self.trace[k] = list(a[f"trace_{k}"])
        self.round = int(c["round"])
        self.seconds_before, self.cluster.bytes_moved = float(c["seconds"]), int(c["bytes"])


@dataclass
class OnlineResult(RunResult):
    summary: dict
    trace: dict
    code: np.ndarray | None = None
    test: dict | None = None
    extra: dict | None = None
    scaling: StreamScaling | None = None


def train(cluster, source, config: OnlineConfig, progress=None, checkpointer=None, resume=None, test_source=None):
    """Run the stream through the online learner on every rank; the server returns an OnlineResult.

    Rounds go in blocks of ``config.block_rounds``: workers send base margins
    ``X_b W`` of their tasks (worker 0 also the Gram matrix ``X_b X_b^T``), the
    server solves the rounds in order with the exact margins
    ``M0 + sum_{s'<s} tau y G`` and sends tau back.  Each task's arithmetic does
    not depend on where it lives, so the result is bitwise the same at any rank
    count; block_rounds = 1 is bitwise :class:`OnlineMultitask`.
    """
    from .checkpoint import read_compatible
    from .cluster import plan_blocks
    rule = config.validate(source.n_tasks, source.max_row_norm(), source.typical)

    def make_local():           # whole tasks over the stream, one unit each
        planned = cluster.planned(plan_blocks(np.ones(source.n_tasks, dtype=np.int64), np.ones(source.n_tasks),
                                              cluster.n_workers))
        return LocalColumns(planned, source, config)

    def make_server(cluster):          # the planned cluster the local state was read under
        return OnlineServer(cluster, source, config, rule, progress, checkpointer)

    def result(server, _, extra):
        return OnlineResult(W=server.final_W, history=server.metrics.arrays(), config=dict(config.to_dict(), C=rule.C),
                            task_names=source.names, n_rounds=server.round, seconds=server.elapsed(),
                            bytes_moved=cluster.bytes_moved, summary=server.metrics.summary(source.n_tasks),
                            trace={k: np.asarray(v) for k, v in server.trace.items()}, code=source.code, extra=extra,
                            scaling=source.scaling)

    state = None if resume is None else (lambda: read_compatible(resume, config, source))
    return engine.train(cluster, make_local, make_server, result, state)


def evaluate_stream(W, test_source, chunk=4096, decoder="loss"):
    """Test metrics of final hypotheses (d x k, columns in ``test_source.names`` order) on a stream.

    The stream is read ``chunk`` rounds at a time (scaled by its ``scaling``); the
    per-round mistakes are counted by the rule the training run uses
    (:func:`mistakes`, so a margin of 0 is wrong), giving the inf-error, 1-error
    and, with an output code, the multiclass error rate after decoding with
    ``decoder`` (:func:`hpcmtl.output_codes.decode`) and one row a class (its
    name, rounds, errors, error rate: ``classes``); per task (active rounds only)
    the error rate and AUC, pooled and averaged by :func:`hpcmtl.metrics.summarize`.
    Memory: one chunk of instances plus each task's active margins (for its AUC).
    """
    from .metrics import summarize, task_metrics
    k = test_source.n_tasks
    if W.shape != (test_source.n_features, k):
        raise InputError(f"{test_source.path}: {test_source.n_features} features and {k} tasks, the model's W "
                         f"is {W.shape[0]} x {W.shape[1]}")
    scores, labels = [[] for _ in range(k)], [[] for _ in range(k)]
    task_errors = np.zeros(k, dtype=np.int64)
    inf_errors, multiclass = 0, (0 if test_source.code is not None else None)
    n_classes = 0 if test_source.code is None else test_source.code.shape[0]
    class_rounds, class_errors = np.zeros(n_classes, dtype=np.int64), np.zeros(n_classes, dtype=np.int64)
    for start in range(0, test_source.n_rounds, chunk):
        X, Y = test_source.read_rounds(start, min(test_source.n_rounds, start + chunk))
        Yt, classes = test_source.labels(Y, start)
        margins = np.asarray(X @ W)
        wrong = mistakes(Yt, margins)
        task_errors += wrong.sum(axis=0)
        inf_errors += int(wrong.any(axis=1).sum())
        if classes is not None:
            missed = multiclass_mistakes(margins, test_source.code, classes, decoder)
            multiclass += int(missed.sum())
            class_rounds += np.bincount(classes, minlength=n_classes)
            class_errors += np.bincount(classes[missed], minlength=n_classes)
        for j in range(k):
            active = Yt[:, j] != 0
            scores[j].append(margins[active, j])
            labels[j].append(Yt[active, j])
    tasks = []
    for j, name in enumerate(test_source.names):
        y = np.concatenate(labels[j]) if labels[j] else np.zeros(0)
        if y.size:
            tasks.append(dict(name=name, **task_metrics(y, np.concatenate(scores[j]), False, int(task_errors[j]))))
    summary = summarize(tasks, False)
    summary["n_rounds"] = int(test_source.n_rounds)
    summary.update(error_rates(test_source.n_rounds, k, inf_errors, int(task_errors.sum()), multiclass))
    out = {"tasks": tasks, "summary": summary}
    if n_classes:
        out["classes"] = [{"name": str(name), "n": int(n), "errors": int(e), "error_rate": int(e) / max(1, int(n))}
                          for name, n, e in zip(test_source.class_names, class_rounds, class_errors)]
    return out
