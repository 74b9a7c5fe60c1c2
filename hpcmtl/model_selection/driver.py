"""The one cross-validation driver: plan the whole, split it into folds, fit every fold, score, choose, refit.

:func:`cross_validate` is the skeleton every selection runs under; a :class:`Search`
(:class:`hpcmtl.model_selection.lam.LamSearch` for lam or a graph kernel's alpha over
DMTRL fits, :class:`hpcmtl.model_selection.radius.RadiusSearch` for the radius of
joint-sparse fits) fills in what differs:

1. ``prepare(source)``: per-method checks after the selection's (identically on every
   rank, so errors fail together);
2. ``load(whole, source, test_source)``: this rank's blocks of the whole plan (and its
   test rows);
3. ``start(split)``: anything computed once the split is known (the folds' means);
4. ``fit_fold(split, f, fold, rows, train_blocks, held, table)``: the grid on fold f's
   training rows, its validation scores into ``table["fold_scores"][:, f]`` (server);
5. ``refit(split, chosen)``: the chosen point on every training row;
6. ``finish(split, result, chosen, table)``: the path, the choice and its warnings on
   the refit's result.

Checkpoints (:class:`hpcmtl.checkpoint.PathCheckpointer`, the server's): every fit of the path runs
under one checkpointer, so ``--checkpoint-every`` / ``--checkpoint-seconds`` and a termination signal
write the path's state at the fit's next safe point (the ``position``: which fold, which point or the
refit; the finished points' scores; what the search carries forward, :meth:`Search.path_arrays`) with
the running fit's solver state where the search keeps it (:attr:`Search.keeps_point`), and the job exits
75.  ``resume`` reads it back on the server (refused, naming why, for another run or another grid:
:meth:`Search.path_key`), every rank learns the position, and the path continues from there: the same
choice, scores and refit as a run that was never stopped.

The driver owns the order of the collective steps (plan, fold ids, fold plans, one
fold after another, the choice broadcast, the refit): every rank runs the same steps
in the same order whatever the method.  Every fold's plan is passed to the fits as a
planned cluster (``cluster.planned(plan)``), never set on the shared one.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np

from .. import engine
from ..errors import InputError, Preempted
from ..losses import get_loss
from .split import TrainingRows, best_index, cut, fold_plans, local_folds


@dataclass
class Split:
    """This rank's view of a selection's split (``info`` and the scores are the server's)."""
    source: object
    config: object
    selection: object
    whole: object           # the cluster planned over every training row: the refit's
    blocks: list            # this rank's blocks of ``whole`` as loaded
    tests: list             # this rank's test rows (or None)
    folds: list             # per block, each row's fold id
    task_ids: dict          # task -> each row's fold id, for this rank's tasks
    shared: dict            # every rank: per fold the plan ("plans") and the tasks' training counts ("counts")
    info: dict | None       # server: per fold the validation labels, the split's digest (None on workers)

    @property
    def n_folds(self) -> int:
        return self.selection.n_folds

    @property
    def grid(self) -> list:
        return self.selection.grid

    def how(self) -> dict:
        """The split in the result's selection record: the hold-out fraction or the fold count."""
        return ({"validation_fraction": self.selection.validation_fraction}
                if self.selection.validation_fraction is not None else {"cv": self.n_folds})


class Search(abc.ABC):
    """The per-method hooks of :func:`cross_validate` (the defaults: nothing to prepare, blocks loaded
    prepared, no training-row means); a method's search gives the three abstract ones."""

    def prepare(self, source):
        pass

    def load(self, whole, source, test_source):
        return engine.load_blocks(whole, source, self.config, test_source)

    def start(self, split):
        pass

    def fold_means(self, f):
        """Fold f's training-row means of every task (server, centered fits), else None."""
        return None

    def rank_means(self):
        """This rank's tasks' training-row means of every fold (centered fits), else None."""
        return None

    # checkpoints: whether a checkpoint keeps the running fit's solver state (else the fit restarts on resume),
    # the checkpointer the fits run under (server; None) and where the path stands (every rank: a dict the
    # driver and the search update, {"phase": "fit" | "refit", "fold": f, "point": g})
    keeps_point = False
    checkpointer = None
    position = None
    pending = None          # server: the checkpoint whose running fit is resumed (its solver state)
    warm_state = None       # server: the checkpoint written between two points (the next one's warm start)

    def path_key(self, split) -> dict:
        """What must match to resume a grid (server): JSON-able; the grid, the split and its digest, the metric."""
        sel = self.selection
        return dict(split.how(), parameter=sel.name, grid=[float(v) for v in split.grid], metric=sel.metric,
                    warm_start=bool(sel.warm_start), selection_tol=sel.tol, split_digest=split.info["digest"])

    def path_arrays(self, server) -> dict:
        """The search's own arrays of a checkpoint (server, during a fit of the path: ``server`` is its server)."""
        return {}

    def restore_path(self, arrays):
        """Server: the search's own arrays from a checkpoint (what :meth:`path_arrays` wrote)."""

    def resumed(self, split, saved):
        """Every rank, after the position of a resume is known (``self.position``; ``saved``: as the checkpoint
        has it, ``done`` when it was written after its point was solved)."""

    @abc.abstractmethod
    def fit_fold(self, split, f, fold, rows, train_blocks, held, table, first=0):
        """One fold's fits over the grid (from point ``first`` on) on the fold's planned cluster; fills its row of
        ``table``."""

    @abc.abstractmethod
    def refit(self, split, chosen):
        """The refit at the chosen grid point on every training row."""

    @abc.abstractmethod
    def finish(self, split, result, chosen, table):
        """The result of the path: the refit's result with the path record."""


def edge_warning(name, grid, chosen):
    """The warning of a choice at an end of the grid (None inside it): the best value may lie beyond."""
    if len(grid) < 2 or chosen not in (0, len(grid) - 1):
        return None
    low, high = min(grid), max(grid)
    end = "largest" if grid[chosen] == high else "smallest"
    return (f"the chosen {name} {grid[chosen]:.4g} is the {end} of the grid ({low:.4g} .. {high:.4g}): the best "
            f"{name} may lie beyond it; extend the grid")


class ServerMaker:
    """A method's ``server_class`` that keeps the server it made: a fold's validation scores are the server's
    (``server`` stays None on workers, which make none)."""

    def __init__(self, server_class, **options):
        self.server_class, self.options, self.server = server_class, options, None

    def __call__(self, *args, **kwargs):
        self.server = self.server_class(*args, **self.options, **kwargs)
        return self.server


TABLE = ("rounds", "seconds", "fold_scores")


def check_position(path, position, split):
    """A checkpoint's position is one this grid has: a phase, a fold and a grid point in range."""
    ok = (position.get("phase") in ("fit", "refit")
          and all(isinstance(position.get(k), int) and not isinstance(position.get(k), bool) for k in ("fold", "point"))
          and 0 <= position["fold"] < split.n_folds and 0 <= position["point"] < len(split.grid)
          and (isinstance(position.get("stop_at", 1), int) and 1 <= position.get("stop_at", 1) <= len(split.grid)))
    if not ok:
        raise InputError(f"{path}: cannot resume: the grid's position {position} is not one of this grid "
                         f"({split.n_folds} folds, {len(split.grid)} points)")


def check_tiles(path, blocks, counts):
    """The running fit's saved blocks tile each task's rows exactly (``counts``: the fit's rows a task)."""
    by_task = {}
    for b in blocks:
        by_task.setdefault(int(b["task"]), []).append((int(b["start"]), int(b["stop"])))
    for t, n in enumerate(counts):
        spans = sorted(by_task.pop(t, []))
        ends = [0] + [stop for _, stop in spans]
        if [start for start, _ in spans] != ends[:-1] or ends[-1] != int(n):
            raise InputError(f"{path}: cannot resume: the saved blocks of task #{t} do not cover its {int(n)} rows "
                             f"of the running fit exactly")
    if by_task:
        raise InputError(f"{path}: cannot resume: blocks of task #{min(by_task)}, but the data has {len(counts)} tasks")


def resume_path(cluster, split, search, table, checkpointer, resume):
    """Every rank: where a resumed path stands (the server reads the checkpoint, refused together on every rank
    when it is not this grid's); the server's table and the search's arrays restored."""
    error = position = None
    if cluster.is_server:
        from ..checkpoint import read_path_compatible
        try:
            ck = read_path_compatible(resume, split.config, split.source, search.path_key(split))
            info, arrays = ck["grid"]["info"], ck["grid"]["arrays"]
            for name in TABLE:
                if np.shape(arrays.get(name)) != table[name].shape:
                    raise InputError(f"{resume}: cannot resume: field 'path/arrays/{name}' has shape "
                                     f"{np.shape(arrays.get(name))}, expected {table[name].shape}")
                table[name][...] = arrays[name]
            position = {k: info[k] for k in ("phase", "fold", "point", "done", "bytes_before_refit", "stop_at")
                        if k in info}
            check_position(resume, position, split)
            search.restore_path(arrays)
            if search.keeps_point:              # the running fit's blocks: its rows (a fold's, or every row)
                check_tiles(resume, ck["blocks"], split.shared["counts"][position["fold"]]
                            if position["phase"] == "fit" else split.source.n_samples)
                if not position.get("done"):
                    search.pending = ck         # the running fit continues from its state
                elif position["point"] + 1 < len(split.grid):
                    search.warm_state = ck      # the next point starts from the solved one's block states
        except InputError as exc:
            error = str(exc)
        except (KeyError, ValueError, IndexError, TypeError) as exc:     # a damaged record: one line, every rank
            error = f"{resume}: cannot resume: an incomplete grid checkpoint ({type(exc).__name__}: {exc})"
    cluster.agree(error)
    return cluster.bcast_object(position)


def cross_validate(cluster, source, config, selection, search: Search, test_source=None, checkpointer=None,
                   resume=None):
    """Choose a point of ``selection.grid`` by validation and refit it on every row: the refit's result with
    the path and the choice (server), None (workers).  ``checkpointer`` (server): a
    :class:`hpcmtl.checkpoint.PathCheckpointer` the fits run under; ``resume`` (every rank): its checkpoint
    path to continue from."""
    config.validate()
    selection.validate(config.loss)
    selection.check_sizes(source)
    search.prepare(source)
    whole = engine.planned_for(cluster, source, config)          # every training row: the refit's plan
    blocks, tests = search.load(whole, source, test_source)
    plan = list(whole.blocks)
    folds, task_ids = local_folds(source, blocks, selection, config.seed, get_loss(config.loss).binary_labels)
    shared, info = fold_plans(cluster, plan, folds, blocks, source.n_tasks, selection.n_folds)
    split = Split(source, config, selection, whole, blocks, tests, folds, task_ids, shared, info)
    search.start(split)
    G, n_folds = len(selection.grid), selection.n_folds
    table = {"rounds": np.zeros(G, dtype=np.int64), "seconds": np.zeros(G), "fold_scores": np.zeros((G, n_folds))}
    search.position = position = {"phase": "fit", "fold": 0, "point": 0}
    search.checkpointer = checkpointer
    if checkpointer is not None:
        key = search.path_key(split)
        checkpointer.path_state = lambda server: (
            {"info": dict(position, key=key), "arrays": dict({k: table[k] for k in TABLE},
                                                             **search.path_arrays(server))}, search.keeps_point)
    if resume is not None:
        saved = resume_path(cluster, split, search, table, checkpointer, resume)
        position.update(saved)
        if position.pop("done", False):      # written after its point was solved: the path goes on at the next
            position["point"] += 1
            if position["point"] == G:
                position.update(fold=position["fold"] + 1, point=0)
        search.resumed(split, saved)
    try:
        first_fold = position["fold"] if position["phase"] == "fit" else n_folds
        for f in range(first_fold, n_folds):
            position["fold"] = f
            fold = cluster.planned(shared["plans"][f])
            counts = shared["counts"][f]
            rows = TrainingRows(source, counts, search.fold_means(f))
            train_blocks, held = cut(blocks, folds, f, counts, fold.my_blocks, search.rank_means())
            search.fit_fold(split, f, fold, rows, train_blocks, held, table,
                            first=position["point"] if f == first_fold else 0)
        # the points from stop_at on were stopped early (the search's rule, the same on every rank): no score
        stop_at = position.get("stop_at", G)
        table["validation_score"] = scores = table["fold_scores"].mean(axis=1)
        scores[stop_at:] = np.nan
        chosen = cluster.bcast_object(best_index(selection.metric, scores, stop_at) if cluster.is_server else None)
        # the path's traffic before the refit (the server's count; a resumed refit keeps the checkpoint's): the
        # refit's own bytes are its history's minus this (report's MB-moved panel)
        position.setdefault("bytes_before_refit", int(cluster.bytes_moved))
        position.update(phase="refit", point=chosen)
        result = search.refit(split, chosen)
    except Preempted as exc:                 # say where the grid stood (the round is the running fit's)
        where = (f"the refit at {selection.name} {split.grid[position['point']]:.4g}" if position["phase"] == "refit"
                 else f"fold {position['fold'] + 1}/{n_folds}" + (f", {selection.name} "
                                                                   f"{split.grid[position['point']]:.4g}"
                                                                   if search.keeps_point else ""))
        raise Preempted(f"{exc} (the grid: {where})") from None
    if result is None:
        return None
    out = search.finish(split, result, chosen, table)
    out.path["selection_bytes"] = np.int64(position["bytes_before_refit"])
    return out
