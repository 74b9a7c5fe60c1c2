"""When to checkpoint, what a checkpoint holds, and whether a run may resume from it.

A checkpoint is taken between rounds on the server: the algorithm's server
says what its state is (``checkpoint_state()``: for DMTRL every block's dual
variables, coordinate order and shrinking state, gathered from the workers,
with B, Sigma, rho, the counters and the history) and it is written with the
config (``store.write_checkpoint``: temporary name, then rename).  Resuming restores
all of it, so the final model is bitwise the one of an uninterrupted run with
the same seed and settings, at any rank count (as long as no task is split;
split blocks are re-cut for the new rank count and restart their shrinking).

Settings that change the mathematics must match the checkpoint; stopping
rules (tol, max_rounds, outer, outer_tol, gap_every) may change on resume.

The training data must be the same too, content and not only shape: every
rank computes the content fingerprint of the rows it reads, in the same pass
(:func:`hpcmtl.store.fingerprint_rows`), the server adds them up per task
(:func:`share_fingerprints`, one small gather after loading), a checkpoint
stores them, and a resume whose data gives another fingerprint for any task
(changed labels, changed features) is refused naming the task.  Because the
fingerprints are computed from what is read, task files written before
fingerprints existed resume exactly like new ones; a checkpoint written
before fingerprints existed resumes with the task-table check only.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass

import numpy as np

from . import _sdca, store
from .errors import InputError
from .losses import get_loss, signed_labels

MUST_MATCH = ("method", "loss", "lam", "gamma", "relationship", "eta", "local_iters", "seed", "rff_dim", "radius",
              "projection", "eta0",
              "rff_gamma", "eig_floor", "split_tasks", "shrinking",
              "update", "norm", "r", "p", "C", "R", "code", "block_rounds", "fit_intercept", "intercept_scaling",
              "intercept_eta0", "float32", "local_steps",
              # the labels' meaning (which class is +1) changes the data; the aggregation, the local solver and the
              # exchange change the iterates, so a resumed run would not be the uninterrupted one
              "positive_label", "aggregation", "local_solver", "exchange",
              # online: the stream's feature scaling changes the instances every round sees
              "scale")
# what a checkpoint written before a setting existed ran with (intercepts came later: none; one local step a round)
OLD_DEFAULTS = {"fit_intercept": False, "float32": False, "local_steps": 1, "positive_label": None, "scale": "none"}


def data_signature(source) -> str:
    """Identity of a training set from its task table (names, sizes, nnz, d)."""
    table = {"names": list(source.names), "n_samples": [int(v) for v in source.n_samples],
             "nnz": [int(v) for v in source.nnz], "n_features": int(source.n_features)}
    return hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()


def sigma_signature(sigma) -> str | None:
    if sigma is not None and hasattr(sigma, "signature_bytes"):       # a graph kernel or factors: their arrays
        return hashlib.sha256(sigma.signature_bytes()).hexdigest()
    return None if sigma is None else hashlib.sha256(np.ascontiguousarray(sigma, dtype=np.float64).tobytes()).hexdigest()


class Checkpointer:
    """Server-side checkpoint policy: every N rounds, every S seconds, and on a signal.

    Parameters
    ----------
    path : checkpoint file
    every : rounds between checkpoints (0: not by rounds)
    seconds : seconds between checkpoints (0: not by time)
    signals : a :class:`hpcmtl.cluster.SignalFlag` (or None)
    """

    def __init__(self, path, every=0, seconds=0.0, signals=None, config=None, source=None, sigma=None):
        self.path = os.fspath(path)
        self.every = int(every)
        self.seconds = float(seconds)
        self.signals = signals
        self.config = dict(config or {})
        self.source = source
        self.data_signature = data_signature(source) if source is not None else None
        self.train_path = getattr(source, "path", None)
        self.sigma_signature = sigma_signature(sigma)
        self.last = time.monotonic()
        self.last_round = None
        self.written = 0

    def signal_received(self):
        return self.signals.received if self.signals is not None else None

    def due(self, round_) -> bool:
        """Every N rounds (a multiple of N was reached since the last check) or every S seconds."""
        prev = round_ - 1 if self.last_round is None else self.last_round
        crossed = self.every and round_ // self.every > prev // self.every
        self.last_round = round_
        if crossed:
            return True
        return bool(self.seconds) and time.monotonic() - self.last >= self.seconds

    def save(self, server, state=None):
        """Write ``server.checkpoint_state()`` (or ``state``, what it returned earlier) plus what identifies the
        run."""
        arrays, blocks, counters = state if state is not None else server.checkpoint_state()
        counters = dict(counters, n_ranks=server.cluster.size, data_signature=self.data_signature,
                        train=self.train_path, sigma_signature=self.sigma_signature)
        store.write_checkpoint(self.path, arrays, blocks, self.config, counters,
                               fingerprints=getattr(self.source, "content_fingerprints", None))
        self.last = time.monotonic()
        self.written += 1


class PathCheckpointer(Checkpointer):
    """A grid's checkpoint policy (server): the same triggers as a single run's, the grid's state written with it.

    ``path_state(server)`` (set by the grid's driver) returns ``(path_state, keep)``: the path's record for
    :func:`hpcmtl.store.write_checkpoint` (where the path stands, the finished points' scores, what it carries
    forward) and whether the running point's solver state is saved with it (``keep``; else the point restarts
    on resume).  Every fit of the path runs under this one checkpointer; :meth:`point_started` makes the
    every-N-rounds rule count each point's own rounds.
    """

    path_state = None

    def point_started(self):
        self.last_round = None

    def pending_signal(self, cluster):
        """(signal name, ``"rank R "`` or ``""``) of a termination signal this rank or a worker received, else
        (None, ""): what a safe point between the path's fits asks (the fits' own ask the same in the engine)."""
        name = self.signal_received()
        if not name and self.signals is not None:
            remote = cluster.signal_elsewhere()
            if remote is not None:
                return remote[1], f"rank {remote[0]} "
        return name, ""

    def time_due(self) -> bool:
        """--checkpoint-seconds has passed since the last checkpoint."""
        return bool(self.seconds) and time.monotonic() - self.last >= self.seconds

    def save(self, server, state=None):
        record, keep = self.path_state(server)
        arrays, blocks, counters = ((state if state is not None else server.checkpoint_state()) if keep
                                    else ({}, [], {}))
        counters = dict(counters, n_ranks=server.cluster.size, data_signature=self.data_signature,
                        train=self.train_path, sigma_signature=self.sigma_signature)
        store.write_checkpoint(self.path, arrays, blocks, self.config, counters,
                               fingerprints=getattr(self.source, "content_fingerprints", None), path_state=record)
        self.last = time.monotonic()
        self.written += 1


def config_mismatch(ck: dict, now: dict) -> str | None:
    """The first setting of :data:`MUST_MATCH` that differs between a checkpoint and ``now`` (None: all match)."""
    for key in MUST_MATCH:
        # a setting the method has, missing from an older checkpoint: what runs did before it existed
        saved = ck["config"].get(key, OLD_DEFAULTS.get(key) if key in now else None)
        if key in ("intercept_scaling", "intercept_eta0") and not now.get("fit_intercept"):
            continue                                   # no intercept: its settings are not used
        if saved != now.get(key):
            return f"'{key}' is {saved!r} in the checkpoint but {now.get(key)!r} now"
    return None


def foreign_checkpoint(path, method: str, config=None) -> str | None:
    """Why the existing file ``path`` is not a checkpoint of this command (None: it is one).

    A checkpoint of this command is an ``hpcmtl-checkpoint`` of the same
    method whose settings that must match to resume (:func:`config_mismatch`)
    equal ``config``'s (only the method is compared when ``config`` is None,
    for a method whose config settles while it loads).  Training data is not
    compared: that needs the data read, and is checked on ``--resume``.
    """
    try:
        ck = store.read_checkpoint(path)
    except InputError as exc:
        return str(exc).removeprefix(f"{os.fspath(path)}: ")
    except Exception:             # a damaged file is not ours: any reading error means "not a checkpoint"
        return "not a readable hpcmtl checkpoint"
    saved = ck["config"].get("method") if isinstance(ck.get("config"), dict) else None
    if saved != method:
        return f"a checkpoint of method {saved!r}, not {method!r}"
    return config_mismatch(ck, config.to_dict()) if config is not None else None


def read_compatible(path, config, source, sigma=None) -> dict:
    """Read a checkpoint and refuse it, naming the mismatch, if it belongs to another run."""
    ck = store.read_checkpoint(path)
    if ck.get("grid") is not None:
        raise InputError(f"{path}: cannot resume: a checkpoint of a grid ({ck['grid']['info'].get('parameter')} "
                         f"chosen by validation), not of a single run; resume it with the same grid options")
    check_same_run(path, ck, config, source, sigma)
    check_blocks(path, ck, config, source)
    return ck


def read_path_compatible(path, config, source, key: dict) -> dict:
    """Read a grid's checkpoint (:class:`PathCheckpointer`) and refuse it, naming the mismatch, if it belongs to
    another run: the single run's must-match settings and data, and the grid's ``key`` (the grid, the split and
    its digest, the metric, the warm start, every point's fixed Sigma).  The blocks of its current point are a
    fold's training rows, checked when they are restored (:func:`block_payloads`)."""
    ck = store.read_checkpoint(path)
    if ck.get("grid") is None:
        raise InputError(f"{path}: cannot resume: a checkpoint of a single run, not of a grid chosen by "
                         f"validation; resume it without the grid options")
    check_same_run(path, ck, config, source, sigma_too=False)      # the key holds every point's Sigma
    saved = ck["grid"]["info"].get("key", {})
    for name in sorted(set(saved) | set(key)):
        if saved.get(name) != key.get(name):
            what = {"split_digest": "the validation split (its fold ids)",
                    # hpcmtl a08afef and before held a learned result's factors (512 tasks or more) as their dense
                    # matrix and signed that; a grid resumed on it would train its later points on another form
                    "sigmas": "a grid point's fixed Sigma, or its form: a checkpoint written before learned "
                              "factors were kept held them as a dense matrix; start again without --resume"}
            raise InputError(f"{path}: cannot resume: the grid's '{name}' differs"
                             + (f" ({what[name]})" if name in what else
                                f": {saved.get(name)!r} in the checkpoint but {key.get(name)!r} now"))
    return ck


def signed_as_dense(ck, sigma) -> bool:
    """A fixed Sigma given as factors, and a checkpoint written while such a Sigma was held as its dense matrix
    (hpcmtl a08afef and before: `train fixed --sigma` of a learned result of 512 tasks or more) whose signature is
    that matrix's: the same Sigma (the run resumes on the checkpoint's dense Sigma, its arithmetic as written)."""
    return (hasattr(sigma, "dense") and hasattr(sigma, "V") and "Sigma" in ck["arrays"]
            and "sigma_V" not in ck["arrays"] and ck["counters"].get("sigma_signature") == sigma_signature(sigma.dense()))


def check_same_run(path, ck, config, source, sigma=None, sigma_too=True):
    """Refuse a checkpoint whose must-match settings, training data or fixed Sigma differ from this run's."""
    mismatch = config_mismatch(ck, config.to_dict())
    if mismatch is not None:
        raise InputError(f"{path}: cannot resume: {mismatch}")
    if ck["counters"].get("data_signature") != data_signature(source):
        raise InputError(f"{path}: cannot resume: the checkpoint was written for other training data "
                         f"({ck['counters'].get('train')}), not {source.path}")
    if (sigma_too and ck["counters"].get("sigma_signature") != sigma_signature(sigma)
            and not signed_as_dense(ck, sigma)):
        raise InputError(f"{path}: cannot resume: the fixed task covariance differs from the checkpoint's")
    saved, now_read = ck.get("fingerprints"), getattr(source, "content_fingerprints", None)
    if now_read and not saved:      # nothing to compare with: the data may have changed, so refuse
        why = ("its /fingerprints group is missing" if ck.get("checkpoint_version", 1) >= 2 else
               "it was written by an hpcmtl without content fingerprints")
        raise InputError(f"{path}: cannot resume: {why}, so nothing shows that {source.path} holds the data the "
                         f"checkpoint was written for; start again without --resume")
    if saved and now_read:
        for i, name in enumerate(source.names):
            if name in saved and now_read.get(name) is not None and saved[name] != now_read[name]:
                a, b = saved[name], now_read[name]          # 16 hex digits of features, then 16 of labels
                what = {(True, False): "its features (X)", (False, True): "its labels (y)"}.get(
                    (a[:16] != b[:16], a[16:] != b[16:]), "its features and labels")
                raise InputError(f"{path}: cannot resume: task '{name}' (#{i}) of {source.path} has changed since the "
                                 f"checkpoint was written: {what} differ (content fingerprint {b}, the "
                                 f"checkpoint's {a})")


BOX_TOLERANCE = 1e-9      # y alpha of a saved box dual: in [0, 1] up to the rounding of a few aggregated steps


def check_blocks(path, ck, config, source):
    """Refuse a checkpoint whose blocks do not fit the data: every task's rows tiled by its blocks exactly (no
    row missing, none twice), and for the box losses (hinge, smoothed hinge, logistic) every ``y_i alpha_i`` in
    [0, 1], the dual's domain.  The shapes are :func:`hpcmtl.store.read_checkpoint`'s; here what needs the data:
    a checkpoint edited (or damaged) within its shapes would resume from an infeasible dual, and the run would
    certify a gap it does not have.  The server reads one task's labels at a time (never X)."""
    blocks = ck.get("blocks") or []
    if not blocks or not hasattr(source, "read_labels"):
        return                               # no dual state (joint-sparse, online) or in-memory tasks
    by_task = {}
    for b in blocks:
        by_task.setdefault(b["task"], []).append(b)
    tiles = []                               # per task, its blocks in row order
    for i in range(source.n_tasks):
        parts = sorted(by_task.pop(i, []), key=lambda b: b["start"])
        tiles.append(parts)
        ends = [0] + [b["stop"] for b in parts]
        spans = ", ".join(f"{b['start']}..{b['stop']}" for b in parts)
        if [b["start"] for b in parts] != ends[:-1] or ends[-1] != int(source.n_samples[i]):
            raise InputError(f"{path}: cannot resume: the blocks of task '{source.names[i]}' (#{i}) do not cover its "
                             f"{int(source.n_samples[i])} rows exactly (saved: {spans or 'none'})")
    if by_task:
        raise InputError(f"{path}: cannot resume: blocks of task #{min(by_task)}, but {source.path} has "
                         f"{source.n_tasks} tasks")
    loss_name = getattr(config, "loss", None)
    if loss_name not in ("hinge", "smoothed-hinge", "logistic"):
        return                               # the squared loss's dual is unbounded
    loss = get_loss(loss_name)
    positive = getattr(config, "positive_label", None)
    for i in range(source.n_tasks):
        where = f"{source.path}: task '{source.names[i]}' (#{i})"
        y = signed_labels(loss, source.read_labels(i), positive, where)
        for b in tiles[i]:
            ya = y[b["start"]:b["stop"]] * b["alpha"]
            bad = np.flatnonzero((ya < -BOX_TOLERANCE) | (ya > 1 + BOX_TOLERANCE))
            if bad.size:
                j = int(bad[0])
                raise InputError(f"{path}: cannot resume: task '{source.names[i]}' (#{i}): field 'alpha': row "
                                 f"{b['start'] + j} has alpha = {b['alpha'][j]:.17g} outside the {loss_name} dual's "
                                 f"box (y alpha must be in [0, 1], y = {y[b['start'] + j]:g})")


def share_fingerprints(cluster, source):
    """After loading: the server learns every task's content fingerprint from the rows the ranks read.

    Called on every rank (one small gather); sets ``source.content_fingerprints``
    (``{task name: fingerprint}``, None for a task not read completely) on the
    server.  A source that keeps no fingerprints (in-memory tasks) is skipped
    on every rank alike.
    """
    if not hasattr(source, "read_fingerprints"):
        return None
    gathered = cluster.gather_objects(source.read_fingerprints())
    if gathered is None:
        return None
    parts = {}
    for rank_parts in gathered:
        for task, ranges in rank_parts.items():
            parts.setdefault(task, {}).update({(r[0], r[1]): r for r in ranges})
    source.content_fingerprints = {name: store.combine_fingerprints(list(parts.get(i, {}).values()),
                                                                    int(source.n_samples[i]))
                                   for i, name in enumerate(source.names)}
    return source.content_fingerprints


def block_payloads(ck, blocks, cluster):
    """Per rank, the packed :class:`BlockState` of its blocks under the current plan (SET_STATE)."""
    saved = {(b["task"], b["part"]): b for b in ck["blocks"]}
    by_task = {}
    for b in ck["blocks"]:
        by_task.setdefault(b["task"], []).append(b)
    enabled = ck["config"].get("shrinking", True) and ck["config"].get("loss") in ("hinge", "smoothed-hinge")
    pieces = [[] for _ in range(cluster.size)]
    for b in blocks:
        s = saved.get((b.task, b.part))
        if s is not None and (s["start"], s["stop"]) == (b.start, b.stop):
            state = BlockState(s["alpha"], s["order"], s["shrink"])
        else:   # the task was cut differently: rebuild this block's rows, restart its shrinking
            parts = sorted(by_task[b.task], key=lambda x: x["start"])
            state = BlockState(np.concatenate([x["alpha"] for x in parts])[b.start:b.stop], np.arange(b.n_rows),
                               _sdca.new_shrink_state(b.n_rows, enabled))
        pieces[cluster.worker_rank(b.worker)].append(state)
    return [BlockState.pack_all(p) for p in pieces]


# ---------------------------------------------------------------------------
# A block's dual state, as checkpoints hold it
# ---------------------------------------------------------------------------
SHRINK_SIZE = 5       # the shrinking state of a block (_sdca.new_shrink_state)


@dataclass
class BlockState:
    """One task block's dual state: what a checkpoint saves and a resume restores (DMTRL).

    ``alpha`` (n_rows) the dual variables, ``order`` (n_rows, int32) the
    coordinate order the local solver continues from, ``shrink`` (5) the
    shrinking state.  :meth:`pack` / :meth:`unpack` are the one wire layout
    (per block, concatenated: alpha, order as float64, shrink), used by the
    workers (GET_STATE / SET_STATE), the server and
    :func:`hpcmtl.checkpoint.block_payloads`.
    """
    alpha: np.ndarray
    order: np.ndarray
    shrink: np.ndarray

    def pack(self) -> list:
        return [self.alpha, np.asarray(self.order, dtype=np.float64), self.shrink]

    @staticmethod
    def packed_size(n_rows) -> int:
        """The length of a packed block of ``n_rows`` rows."""
        return 2 * n_rows + SHRINK_SIZE

    @classmethod
    def unpack(cls, data, pos, n_rows):
        """The state of a block of ``n_rows`` rows at ``data[pos:]``, and the position after it."""
        end = pos + cls.packed_size(n_rows)
        return cls(data[pos:pos + n_rows].copy(), data[pos + n_rows:pos + 2 * n_rows].astype(np.int32),
                   data[pos + 2 * n_rows:end].copy()), end

    @staticmethod
    def pack_all(states) -> np.ndarray:
        """One rank's blocks, concatenated in plan order (an empty vector for none)."""
        parts = [p for s in states for p in s.pack()]
        return np.concatenate(parts) if parts else np.zeros(0)
