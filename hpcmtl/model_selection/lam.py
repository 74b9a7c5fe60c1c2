"""lam (or a graph kernel's alpha) chosen by validation over DMTRL fits: the hooks of the driver, and the two
commands of a path.

Every grid point is one ordinary DMTRL fit (:func:`hpcmtl.dmtrl.train`) over a
fold's in-memory training blocks, from the largest lam down, with two commands of
its own (:class:`PathCommand`): the server starts a point from the dual variables
the workers kept from the previous point (``B = X^T alpha / n`` per block,
``W = B Sigma / lam``: the boxes of the dual depend on neither lam nor Sigma, so
alpha stays feasible), and after the fit gathers the validation rows' scores.
Sigma is not carried over: a learned Sigma starts at ``I / m`` at every point, as
in a single run.  The refit at the chosen point starts from that point's alpha of
the last fold (zero on the rows it did not train on).

With the squared loss's exact intercept (per-task centering) a fold's training rows
are centered on their own means, never the whole task's, so no validation row leaks
into the fit (:func:`hpcmtl.taskdata.task_means` with the fold ids: one pass over
the file, the same bits at any rank count); a validation row is scored
``x.w + ybar_f - mu_f.w`` with its fold's means; the refit centers on the whole
task's means as a single run does.

Every point is certified like a single run: its W-steps' convergence is kept per
point, and a path with an unconverged point says so.  The fold fits stop at a
looser relative gap than the refit (:func:`hpcmtl.model_selection.split.selection_tol`:
``--selection-tol``, by default 100x ``--tol`` at most 1e-3, and a learned Sigma's
``--outer-tol``; W-steps and, with a learned Sigma, the joint gap), certified at it;
the refit still runs to the config's ``--tol`` / ``--outer-tol`` from the chosen
point's alpha.  The choice is made on scores of models within that gap of the
optimum: where two grid points score closer than the gap moves a score, it may
differ from the exhaustive path's (``--selection-tol 0``).

Points that cannot change the choice are stopped (``--path-patience K``, 3): once a
fold's validation score fell K points in a row past the fold's best
(:func:`hpcmtl.model_selection.split.path_fell`, the server's, broadcast after every
point), the rest of the grid is skipped in that fold and the next ones; those points
get the status *stopped early* (``/path/status`` 2), no score, and are never chosen.
The stop travels in the checkpoint's position (``stop_at``), so a resumed path stops
where the uninterrupted one did.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from .. import dmtrl, engine, features
from ..checkpoint import block_payloads
from ..dmtrl.commands import DMTRLCommand
from ..engine import Command, Down, Up
from .driver import Search, ServerMaker, cross_validate, edge_warning
from .split import Selection, fold_means, path_fell, score_of, selection_tol, server_task_folds

CERTIFIED, UNCONVERGED, STOPPED = 1, 0, 2     # a point's status in /path/status


class PathCommand(Command):
    """``ID = id, down, up, control fields, computation (a PathBlocks method)``."""
    # every block's b = X^T alpha / n_task (n_blocks x d): a warm start from the dual variables kept in memory
    DUAL_B = 110, Down.NOTHING, Up.GATHER_ROWS, ("width",), "dual_b"
    # the scores of every block's validation rows, concatenated in plan order, per rank
    VALIDATE = 111, Down.NOTHING, Up.GATHER_VECTORS, ("point",), "validation_scores"
    # a checkpoint in the last fold: every block's alpha at the end of an earlier point (the refit's warm start)
    SNAPSHOT = 113, Down.NOTHING, Up.GATHER_VECTORS, ("point",), "snapshot_of"


class PathBlocks(dmtrl.LocalBlocks):
    """:class:`hpcmtl.dmtrl.LocalBlocks` that also hold each block's validation rows (``held_out``)."""

    COMMANDS = dmtrl.LocalBlocks.COMMANDS + (PathCommand,)

    def __init__(self, cluster, blocks, config, test_blocks=None, held_out=None, alpha=None):
        super().__init__(cluster, blocks, config, test_blocks)
        self.held_out = held_out or [None] * len(blocks)
        self.snapshots = None             # the path's per-point alpha of this rank's blocks (the last fold's)
        self.record = False               # keep each point's alpha in snapshots when it is validated
        for st, a in zip(self.state, alpha or ()):
            st.alpha = np.array(a, dtype=np.float64)

    def snapshot_of(self, ctrl, inputs):
        """SNAPSHOT: the alpha of every block at the end of point ``ctrl.point``, concatenated in plan order."""
        parts = self.snapshots[ctrl.point]
        return np.concatenate(parts) if parts else np.zeros(0)

    def dual_b(self, ctrl, inputs):
        """DUAL_B: ``b = X^T alpha / n_task`` of every block (of the centered rows when centered)."""
        return self.dense_rows([([blk.rmatvec(self.state[k].alpha) / blk.n_task], ())
                                for k, blk in enumerate(self.blocks)], 1, ctrl.width)

    def validation_scores(self, ctrl, inputs):
        """VALIDATE: ``X w + b`` of every block's validation rows (b of the training block: ``ybar_f - mu_f.w``
        when centered, else 0), in plan order."""
        if self.record:                   # the point is solved: its alpha is the refit's start if it is chosen
            self.snapshots[ctrl.point] = [st.alpha.copy() for st in self.state]
        parts = [h.decision(self.full_w(k)) + self.blocks[k].intercept(self.w[k])
                 for k, h in enumerate(self.held_out) if h is not None]
        return np.concatenate(parts) if parts else np.zeros(0)


class PathServer(dmtrl.Server):
    """A DMTRL server that may start from the workers' alpha, and scores validation rows."""

    def __init__(self, *args, warm=False, validate=False, resume_state=None, warm_state=None, point=0,
                 solved=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.warm, self.validate, self.resume_state, self.warm_state = warm, validate, resume_state, warm_state
        self.point, self.solved = point, solved
        self.score_rows_off_supports(validate)
        self.scores = None

    def run(self, resume=None):
        if self.resume_state is not None:        # a grid's checkpoint: this point's solver state, read and checked
            state = self.resume_state
            resume = lambda: state               # noqa: E731
        elif self.warm:
            if self.warm_state is not None:      # a checkpoint between points: the previous point's block states
                self.command(DMTRLCommand.SET_STATE, payload=block_payloads(self.warm_state, self.blocks,
                                                                            self.cluster))
            self.start_from_alpha()
        converged = super().run(resume)
        if self.validate:
            self.scores = self.command(PathCommand.VALIDATE, point=self.point)
        if self.solved is not None:              # the path's safe point between points (workers still serving)
            self.solved(self, converged)
        return converged

    def start_from_alpha(self):
        """``B = X^T alpha / n`` from the workers, ``W = B Sigma / lam`` pushed."""
        self.BT = self.per_task(self.command(PathCommand.DUAL_B, width=self.d))
        self.recompute_w()
        self.push_sigma()
        self.mirrors_stale()                   # a new B: the workers' mirror of it is sent when next used
        if self.momentum:                      # a new lam, a new quadratic: no previous step
            self.restart_momentum()
        self.push_w(False)


@dataclass
class PathTrainResult(dmtrl.TrainResult):
    """The refit model at the chosen lam, with the path (one entry per grid point) and the choice."""
    path: dict = field(default_factory=dict)
    selection: dict = field(default_factory=dict)


def fit(cluster, rows, cfg, local, sigma_fixed, warn, warm, validate=False, progress=None, test_source=None,
        checkpointer=None, resume_state=None, **options):
    """One grid point (or the refit): a DMTRL fit over ``local``'s blocks (its cluster's plan); (result, server)
    on the server, (None, None) on workers.  ``checkpointer`` (server): the path's
    (:class:`hpcmtl.checkpoint.PathCheckpointer`); ``resume_state`` (server): a checkpoint whose solver state
    this fit continues (instead of a warm start); ``options``: the rest of :class:`PathServer`'s."""
    if checkpointer is not None:
        checkpointer.point_started()
    maker = ServerMaker(PathServer, warm=warm, validate=validate, resume_state=resume_state, **options)
    result = dmtrl.train(cluster, rows, cfg, test_source, sigma_fixed=sigma_fixed, progress=progress, warn=warn,
                         make_local=lambda: local, server_class=maker, checkpointer=checkpointer)
    return result, maker.server


class LamSearch(Search):
    """The hooks of :func:`hpcmtl.model_selection.driver.cross_validate` for a grid of lam (``selection.name ==
    "lam"``) or of a graph kernel's alpha at ``config.lam`` (``"alpha"``, ``sigma_of(alpha)`` a point's Sigma)."""

    def __init__(self, config, selection, test_source=None, sigma_fixed=None, progress=None, warn=None, note=None,
                 sigma_of=None):
        self.config, self.selection, self.test_source = config, selection, test_source
        self.sigma_fixed, self.sigma_of, self.progress, self.note = sigma_fixed, sigma_of, progress, note
        self.warn = warn or (lambda text: None)
        self.center = self.all_means = self.means = None

    def prepare(self, source):
        """Every point's Sigma, identically on every rank (errors fail together)."""
        selection, config = self.selection, self.config
        if selection.name == "alpha":
            sigmas = [self.sigma_of(v) for v in selection.grid]
        else:
            sigmas = [self.sigma_fixed] * len(selection.grid)
        if config.relationship == "fixed":          # each distinct Sigma checked once (an m x m eigensolve)
            checked = {}
            for sigma in sigmas:
                if id(sigma) not in checked:
                    checked[id(sigma)] = dmtrl.check_sigma(sigma, source.n_tasks)
            sigmas = [checked[id(sigma)] for sigma in sigmas]
        self.sigmas = sigmas
        self.center = engine.intercept_mode(config) == "center"

    def point(self, g):
        """(config, Sigma) of grid point g."""
        value = self.selection.grid[g]
        return ((dataclasses.replace(self.config, lam=value) if self.selection.name == "lam" else self.config),
                self.sigmas[g])

    def fold_tol(self):
        """The fold fits' relative gap (:func:`hpcmtl.model_selection.split.selection_tol`; a learned Sigma's
        --outer-tol counts)."""
        cfg = self.config
        return selection_tol(self.selection, cfg.tol, cfg.outer_tol if cfg.relationship == "learned" else 0.0)

    def fold_config(self, cfg):
        """A fold fit's config: ``cfg`` with its tolerances loosened to the selection's
        (:func:`hpcmtl.model_selection.split.selection_tol`: ``--selection-tol``, by default 100x ``--tol``).
        ``--outer-tol 0`` stays 0: it asks for ``--outer`` W-steps without the joint stop or the outer phases, and
        the fold fits keep that (a positive tolerance would add phases the refit does not take)."""
        tol = self.fold_tol()
        outer_tol = max(cfg.outer_tol, tol) if cfg.outer_tol > 0 else 0.0
        return dataclasses.replace(cfg, tol=max(cfg.tol, tol), outer_tol=outer_tol)

    def load(self, whole, source, test_source):
        return engine.load_blocks(whole, source, self.config, test_source, prepare=not self.center)

    def start(self, split):
        """The folds' training-row means (centered fits): every task's on the server, this rank's tasks' here."""
        config, source, n_folds = self.config, split.source, split.n_folds
        phi = engine.means_map(config, features.rff_map(source.n_features, config.rff_dim, config.rff_gamma,
                                                        config.seed) if config.rff_dim else None)
        self.phi = phi
        if self.center and split.info is not None:          # every task's, for the fold fits' intercepts
            self.all_means = fold_means(source, server_task_folds(split.info, list(split.whole.blocks),
                                                                  source.n_tasks), n_folds, phi)
        if self.center:                                     # this rank's tasks' (read once in serial runs)
            self.means = ({t: self.all_means[t] for t in split.task_ids} if self.all_means is not None
                          else fold_means(source, split.task_ids, n_folds, phi))
        G = len(split.grid)
        self.converged, self.snapshots = np.ones(G, dtype=np.int64), [None] * G
        # kept: the server's copies of the last fold's snapshots (a checkpoint's); the resume's points and phase
        self.split, self.kept, self.server_points, self.refit_resumed = split, {}, set(), False
        self.warm_state = self.recorded = None     # server: a resume's block states of the point before

    def fold_means(self, f):
        return {t: m[f] for t, m in self.all_means.items()} if self.all_means is not None else None

    def rank_means(self):
        return self.means

    keeps_point = True            # a checkpoint holds the running point's DMTRL state: it continues on resume

    def path_key(self, split):
        """The grid's must-match record, with every point's fixed Sigma (a graph kernel's at each alpha)."""
        from ..checkpoint import sigma_signature
        return dict(super().path_key(split), sigmas=[sigma_signature(s) for s in self.sigmas],
                    selection_tol=self.fold_tol(), patience=self.selection.patience)

    def path_arrays(self, server):
        """Every point's certification so far and, in the last fold with warm starts, the earlier points' alpha
        (the refit starts from the chosen one's): gathered from the ranks, one vector a point, tasks in order."""
        out = {"converged": self.converged}
        position, K = self.position, len(self.split.shared["plans"])
        if position["phase"] != "fit" or position["fold"] != K - 1 or not self.selection.warm_start:
            return out
        counts = self.split.shared["counts"][K - 1]
        for g in range(position["point"] + bool(position.get("done"))):
            if g not in self.kept:
                pieces = server.command(PathCommand.SNAPSHOT, point=g)
                tasks = [np.zeros(int(n)) for n in counts]
                for b, values in server.block_slices(pieces, lambda b: b.n_rows):
                    tasks[b.task][b.start:b.stop] = values
                self.kept[g] = np.concatenate(tasks) if tasks else np.zeros(0)
            out[f"snapshot_{g:04d}"] = self.kept[g]
        return out

    def restore_path(self, arrays):
        self.converged[...] = arrays["converged"]
        self.kept = {int(k.split("_")[1]): v for k, v in arrays.items() if k.startswith("snapshot_")}

    def resumed(self, split, saved):
        """The last fold's points before the resumed one left their alpha on the server only (the checkpoint's):
        the refit takes the chosen one's from there.  ``saved``: the position as the checkpoint has it."""
        K = split.n_folds
        self.refit_resumed = saved["phase"] == "refit"
        self.server_points = (set(range(saved["point"] + bool(saved.get("done"))))
                              if saved["phase"] == "fit" and saved["fold"] == K - 1 else set())

    def solved(self, f, table):
        """The path's safe point after a point is solved and scored (``PathServer.solved``): on a signal (or when
        --checkpoint-seconds is due) the path is written as of that point, with its block states for the next
        point's warm start, and the job stops (a fit that converges in its first round has no safe point of its
        own: an STL grid's points do)."""
        ck = self.checkpointer
        if ck is None:
            return None

        def at(server, converged):
            signal_name, who = ck.pending_signal(server.cluster)
            if not signal_name and not (ck.seconds and ck.time_due()):
                return
            g = self.position["point"]
            self.record_point(server, f, g, converged, table)
            self.position["done"] = True
            blocks = [{"task": b.task, "part": b.part, "start": b.start, "stop": b.stop, "alpha": st.alpha,
                       "order": st.order, "shrink": st.shrink} for b, st in server.gather_state()]
            ck.save(server, ({}, blocks, {}))
            self.position["done"] = False
            self.recorded = g
            if signal_name:
                from ..errors import Preempted
                raise Preempted(f"{who}received {signal_name}: checkpoint written to {ck.path} after "
                                f"{self.selection.name} {self.split.grid[g]:.4g} was solved; continue with --resume")
        return at

    def record_point(self, server, f, g, converged, table):
        """Point g of fold f into the table (server): its rounds, seconds, certification and validation score."""
        table["rounds"][g] += server.round
        table["seconds"][g] += server.elapsed()
        self.converged[g] &= int(converged)
        table["fold_scores"][g, f] = score_of(server, self.split.info, f, self.selection.metric)
        sel, position = self.selection, self.position
        if g + 1 < position.get("stop_at", len(sel.grid)) and path_fell(sel.metric, table["fold_scores"][:g + 1, f],
                                                                         sel.patience):
            position["stop_at"] = g + 1      # the rest of the grid is stopped, in this fold and the next ones

    def fit_fold(self, split, f, fold, rows, train_blocks, held, table, first=0):
        """The grid on fold f, each point warm-started from the previous one's alpha (from ``first`` on: a resumed
        path, whose point ``first`` continues from the checkpoint's state)."""
        selection, warm, n_folds = self.selection, self.selection.warm_start, split.n_folds
        local = None
        if first >= self.position.get("stop_at", len(split.grid)):     # a resume after the rule stopped the grid
            self.pending = self.warm_state = None
        for g, value in enumerate(split.grid):
            if g < first:
                continue
            if g >= self.position.get("stop_at", len(split.grid)):    # stopped early (path_fell, the server's)
                break
            self.position["point"] = g
            cfg, sigma = self.point(g)
            cfg = self.fold_config(cfg)
            pending, self.pending = self.pending, None
            between, self.warm_state = self.warm_state, None       # a resume between points: g - 1's blocks
            if local is None or not warm:
                local = PathBlocks(fold, train_blocks, cfg, held_out=held)
                local.snapshots, local.record = self.snapshots, f == n_folds - 1 and warm
            local.config = cfg
            self.recorded = None
            result, server = fit(fold, rows, cfg, local, sigma, self.warn, warm=warm and (g > first or between
                                                                                          is not None),
                                 validate=True, checkpointer=self.checkpointer, resume_state=pending,
                                 warm_state=between, point=g, solved=self.solved(f, table))
            if result is not None and self.recorded != g:   # (the safe point after the point recorded it already)
                self.record_point(server, f, g, result.converged, table)
            if selection.patience:               # the server's rule: every rank stops the grid at the same point
                stop_at = fold.bcast_object(self.position.get("stop_at") if fold.is_server else None)
                if stop_at is not None:
                    self.position["stop_at"] = stop_at
            if result is None:
                continue
            if self.note is not None:
                self.note(f"{selection.name} {value:.4g} (fold {f + 1}/{n_folds}): {result.n_rounds} rounds, "
                          f"{'converged' if result.converged else 'NOT converged'}, validation {selection.metric} "
                          f"{table['fold_scores'][g, f]:.6g}")

    def refit(self, split, chosen):
        """The chosen point on every training row, from its alpha of the last fold (zero on its validation rows)."""
        warm, n_folds, config = self.selection.warm_start, split.n_folds, self.config
        cfg, sigma = self.point(chosen)
        pending, self.pending = self.pending, None       # a resumed refit continues from its own state
        alpha = None
        if warm and not self.refit_resumed:
            snapshots = self.snapshots[chosen]
            if chosen in self.server_points:     # a resumed path: the chosen point's alpha is the checkpoint's
                snapshots = self.snapshot_from_server(split, chosen)
            alpha = []
            for ids, a in zip(split.folds, snapshots):
                full = np.zeros(ids.size)
                full[ids != n_folds - 1] = a
                alpha.append(full)
        blocks = split.blocks
        if self.center:                         # the refit: centered on the whole task's means, as a single run
            blocks = [engine.with_intercept(b, config, split.source, self.phi) for b in blocks]
        local = PathBlocks(split.whole, blocks, cfg, split.tests, alpha=alpha)
        result, _ = fit(split.whole, split.source, cfg, local, sigma, self.warn, warm=warm and alpha is not None,
                        progress=self.progress, test_source=self.test_source, checkpointer=self.checkpointer,
                        resume_state=pending)
        self.chosen_config = cfg
        return result

    def snapshot_from_server(self, split, g):
        """Every rank: its blocks' alpha of the last fold at point g, from the server's copy (a resumed path)."""
        K = split.n_folds
        whole = split.whole.planned(split.shared["plans"][K - 1])
        counts = split.shared["counts"][K - 1]
        values = whole.bcast_object(self.kept[g] if whole.is_server else None)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return [values[starts[b.task] + b.start:starts[b.task] + b.stop] for b in whole.my_blocks]

    def finish(self, split, result, chosen, table):
        selection, grid = self.selection, split.grid
        G, name, cfg = len(grid), selection.name, self.chosen_config
        stop_at = self.position.get("stop_at", G)
        # a point's status: certified, unconverged (a fold fit ended above its tolerance) or stopped early (the
        # grid was stopped before it in some fold: no complete score, never counted as unconverged)
        status = np.where(self.converged == 1, CERTIFIED, UNCONVERGED).astype(np.int64)
        status[stop_at:] = STOPPED
        converged = (status != UNCONVERGED).astype(np.int64)
        warnings = []
        if not converged.all():
            bad = [f"{grid[g]:.4g}" for g in np.flatnonzero(converged == 0)]
            warnings.append(f"{len(bad)} of {G} grid points had W-steps that ended unconverged or, with a learned "
                            f"Sigma, a joint gap above --outer-tol ({name} {', '.join(bad)}): their validation "
                            f"scores are not certified; raise --max-rounds (or --outer)")
        edge = edge_warning(name, grid, chosen)
        if edge is not None:
            warnings.append(edge)
        path = {"lam": np.asarray([self.point(g)[0].lam for g in range(G)]),
                "validation_score": table["validation_score"], "fold_scores": table["fold_scores"],
                "rounds": table["rounds"], "seconds": table["seconds"], "converged": converged, "status": status}
        path[name] = np.asarray(grid)
        chosen_info = dict(split.how(), parameter=name, chosen_lam=cfg.lam, chosen_index=chosen,
                           metric=selection.metric, warm_start=selection.warm_start,
                           selection_tol=self.fold_tol(), patience=selection.patience,
                           stopped_early=int(G - stop_at),
                           split_digest=split.info["digest"], converged=bool(converged.all()), warnings=warnings,
                           **({"chosen_alpha": grid[chosen]} if name == "alpha" else {}))
        out = PathTrainResult(**{f.name: getattr(result, f.name) for f in dataclasses.fields(dmtrl.TrainResult)},
                              path=path, selection=chosen_info)
        out.config = dict(out.config, selection=chosen_info)
        return out


def train_path(cluster, source, config, selection: Selection, test_source=None, sigma_fixed=None, progress=None,
               warn=None, note=None, sigma_of=None, checkpointer=None, resume=None):
    """Solve ``selection.grid`` on every rank, choose lam by validation, refit on all rows (server: a
    :class:`PathTrainResult`; workers: None).

    ``note(text)`` (server) hears one line per grid point, ``warn(text)``
    (server) of every unconverged W-step; the result's ``selection["warnings"]``
    name unconverged points and a chosen lam at an edge of the grid.
    ``selection.name == "alpha"``: the grid is of a graph kernel's alpha at
    ``config.lam``, ``sigma_of(alpha)`` the fixed Sigma of a point (warm
    starts keep alpha of the dual: its boxes depend on neither lam nor Sigma).
    ``checkpointer`` (server, a :class:`hpcmtl.checkpoint.PathCheckpointer`) and ``resume`` (every rank, its
    path): the path's checkpoints (:func:`hpcmtl.model_selection.driver.cross_validate`).
    """
    search = LamSearch(config, selection, test_source, sigma_fixed=sigma_fixed, progress=progress, warn=warn,
                       note=note, sigma_of=sigma_of)
    return cross_validate(cluster, source, config, selection, search, test_source, checkpointer, resume)
