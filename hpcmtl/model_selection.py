"""lam chosen by validation: a whole grid solved in one job, warm-started, on the same ranks.

The grid is solved from the largest lam down.  Every rank reads its blocks once
(:func:`hpcmtl.engine.load_blocks`); each task's rows get a fold id, a pure
function of (seed, task, the task's labels), so the split is the same at any
rank count and with ``--split-tasks``:

* hold-out (``validation_fraction F``): ``clip(round(F n_i), 1, n_i - 1)`` rows of
  every task are held out (fold 0), the others (fold ``HOLDOUT``) are always
  trained on;
* K-fold (``cv K``): every row gets a fold in ``0..K-1``.

Classification splits are stratified: the task's rows are put in a random order
(seeded by ``SeedSequence([seed, task, SPLIT_STREAM])``), grouped by label, and
each label gets its share of validation rows (largest remainder) or its rows
dealt round-robin over the folds.

For each fold the rank cuts its blocks into training rows (a new block whose
``n_task`` is the task's training count) and validation rows, and every grid
point is one ordinary DMTRL fit (:func:`hpcmtl.dmtrl.train`) over those
in-memory blocks with two commands of its own (:class:`PathCommand`): the
server starts a point from the dual variables the workers kept from the
previous point (``B = X^T alpha / n`` per block, ``W = B Sigma / lam``: the
boxes of the dual do not depend on lam, so alpha stays feasible), and after
the fit gathers the validation rows' scores.  Sigma is not carried over: a
learned Sigma starts at ``I / m`` at every point, as in a single run (carried
over, it made the squared-loss path of tests/test_path.py's data slower, 441
and 1660 rounds instead of 278 and 173 at two points, and the 10 Omega-steps
ended farther from the cold run's objective).  The
score of a lam is the metric over all validation rows of a fold (``rmse``,
``error``, ``logloss``: rows pooled over tasks; ``auc``: the mean over tasks of
each task's AUC), averaged over folds; the best lam (the largest among equal
scores) is refit on all the training rows, warm-started from the point at that
lam (its alpha, zero on the rows it did not train on).

With the squared loss's exact intercept (per-task centering) a fold's training
rows are centered on their own means, never the whole task's, so no validation
row leaks into the fit: every rank computes the means of its tasks' training
rows of every fold in one pass over the file (:func:`hpcmtl.taskdata.task_means`
with the fold ids: fixed chunks and fold order, the same bits at any rank count),
keeps the blocks as read, and centers each fold's cut (CSR rows implicitly, as
at load).  A validation row is scored ``x.w + ybar_f - mu_f.w`` with its fold's
means; the refit centers on the whole task's means as a single run does.

Every point is certified like a single run: its W-steps' convergence is kept
per point, and a path with an unconverged point says so.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

import numpy as np

from . import dmtrl, engine, features, joint_sparse
from .cluster import Block
from .engine import Command, Down, Up
from .errors import ConvergenceError, InputError
from .losses import get_loss
from .params import validate as check_params
from .taskdata import TaskBlock

HOLDOUT = -1                  # fold id of the rows a hold-out split always trains on
SPLIT_STREAM = 0x5E1EC7       # the validation split's own random stream (apart from the coordinate orders)
LOWER_IS_BETTER = {"rmse": True, "error": True, "logloss": True, "auc": False}
DEFAULT_FRACTION = 0.2        # a grid without --validation-fraction or --cv


@dataclass
class Selection:
    """How lam is chosen: the grid, the split (a fraction, K folds, or given fold ids), the metric."""
    grid: list
    validation_fraction: float | None = None
    cv: int | None = None
    metric: str | None = None
    warm_start: bool = True
    folds: list | None = None      # per task, each row's validation fold (a scikit-learn splitter's splits)
    name: str = "lam"              # the parameter of the grid: lam, or alpha of a graph kernel (one Sigma a point)

    def validate(self, loss: str, owner: str = "hpcmtl train"):
        """Check the grid and the split; fill the defaults (a fraction of 0.2, the loss's metric)."""
        grid = ([check_params({self.name: v}, owner)[self.name] for v in self.grid] if self.name in ("lam", "radius")
                else [float(v) for v in self.grid])
        if not grid:
            raise InputError(f"The '{self.name}' grid of {owner} is empty.")
        if len(set(grid)) != len(grid):
            raise InputError(f"The '{self.name}' grid of {owner} lists a value twice: {grid}.")
        # the most regularized point first (it wins ties): the largest lam / alpha, the smallest radius
        self.grid = sorted(grid, reverse=self.name != "radius")
        given = [n for n in ("validation_fraction", "cv", "folds") if getattr(self, n) is not None]
        if len(given) > 1:
            raise InputError(f"{owner}: give one of --validation-fraction and --cv, not both")
        for name in ("validation_fraction", "cv"):
            if getattr(self, name) is not None:
                setattr(self, name, check_params({name: getattr(self, name)}, owner)[name])
        if not given:
            self.validation_fraction = DEFAULT_FRACTION
        regression = not get_loss(loss).binary_labels
        self.metric = self.metric or ("rmse" if regression else "error")
        check_params({"metric": self.metric}, owner)
        if regression != (self.metric == "rmse"):
            rule = "rmse for the squared loss" if regression else f"error, auc or logloss for the {loss} loss"
            raise InputError(f"The 'metric' parameter of {owner} must be {rule}. Got {self.metric!r} instead.")
        return self

    @property
    def n_folds(self) -> int:
        if self.folds is not None:
            return int(max((int(np.max(f)) for f in self.folds if len(f)), default=0)) + 1
        return 1 if self.validation_fraction is not None else int(self.cv)

    def check_sizes(self, source):
        """Every task can be split (the same check on every rank, from the task table only)."""
        need = 2 if self.validation_fraction is not None else (self.cv or 0)
        for t, n in enumerate(source.n_samples):
            if self.folds is not None:
                f = np.asarray(self.folds[t])
                if f.shape != (int(n),):
                    raise InputError(f"{source.path}: task '{source.names[t]}' (#{t}): field 'y': {n} rows but "
                                     f"{f.size} fold ids")
                short = [k for k in range(self.n_folds) if not np.any(f != k)]
                if short:
                    raise InputError(f"{source.path}: task '{source.names[t]}' (#{t}): field 'y': no training rows "
                                     f"left in validation fold {short[0]}")
            elif n < need:
                what = (f"--validation-fraction needs at least 2" if self.validation_fraction is not None
                        else f"--cv {self.cv} needs at least {self.cv}")
                raise InputError(f"{source.path}: task '{source.names[t]}' (#{t}): field 'y': {n} rows, too few "
                                 f"to split ({what})")


def task_folds(y, seed: int, task: int, selection: Selection, stratify: bool) -> np.ndarray:
    """Each row's fold id (int64): 0 held out / ``HOLDOUT`` (hold-out), or ``0..K-1`` (K-fold).

    A pure function of ``(seed, task, y)``: the same at any rank count and
    however the task is cut into blocks.
    """
    y = np.asarray(y)
    n = y.size
    order = np.random.default_rng(np.random.SeedSequence([seed, task, SPLIT_STREAM])).permutation(n)
    groups = [order[y[order] == c] for c in np.unique(y)] if stratify else [order]
    folds = np.full(n, HOLDOUT, dtype=np.int64)
    if selection.validation_fraction is not None:
        n_val = min(max(int(round(selection.validation_fraction * n)), 1), n - 1)
        sizes = np.array([len(g) for g in groups], dtype=np.float64)
        quota = n_val * sizes / n
        take = np.floor(quota).astype(np.int64)
        extra = np.argsort(-(quota - take), kind="stable")[:n_val - int(take.sum())]
        take[extra] += 1
        for g, k in zip(groups, take):
            folds[g[:k]] = 0
        return folds
    pos = 0
    for g in groups:
        folds[g] = (pos + np.arange(len(g))) % selection.cv
        pos += len(g)
    return folds


def validation_score(metric: str, ys, scores) -> float:
    """The metric over validation rows given per task (pooled over rows; ``auc``: the mean of per-task AUCs)."""
    if metric == "auc":
        from sklearn.metrics import roc_auc_score
        aucs = [roc_auc_score(y, s) for y, s in zip(ys, scores) if len(np.unique(y)) == 2]
        return float(np.mean(aucs)) if aucs else float("nan")
    y, s = np.concatenate(ys), np.concatenate(scores)
    if metric == "rmse":
        return float(np.sqrt(np.mean((s - y) ** 2)))
    if metric == "error":
        return float(np.mean(np.where(s >= 0, 1.0, -1.0) != y))
    return float(np.mean(np.logaddexp(0.0, -y * s)))          # logloss of the logistic link


def best_index(metric: str, scores) -> int:
    """The best point (solve order: the largest lam first wins ties); every score must be finite."""
    scores = np.asarray(scores, dtype=np.float64)
    if not np.all(np.isfinite(scores)):
        i = int(np.flatnonzero(~np.isfinite(scores))[0])
        hint = " (no task's validation rows hold both classes)" if metric == "auc" else ""
        raise ConvergenceError(f"non-finite validation {metric} {scores[i]} at grid point {i + 1}{hint}")
    return int(np.argmin(scores) if LOWER_IS_BETTER[metric] else np.argmax(scores))


# ---------------------------------------------------------------------------
# The two commands of a path, and the local and server sides that answer them
# ---------------------------------------------------------------------------
class PathCommand(Command):
    """``ID = id, down, up, control fields, computation (a PathBlocks method)``."""
    # every block's b = X^T alpha / n_task (n_blocks x d): a warm start from the dual variables kept in memory
    DUAL_B = 110, Down.NOTHING, Up.GATHER_ROWS, ("width",), "dual_b"
    # the scores of every block's validation rows, concatenated in plan order, per rank
    VALIDATE = 111, Down.NOTHING, Up.GATHER_VECTORS, (), "validation_scores"


class PathBlocks(dmtrl.LocalBlocks):
    """:class:`hpcmtl.dmtrl.LocalBlocks` that also hold each block's validation rows (``held_out``)."""

    COMMANDS = dmtrl.LocalBlocks.COMMANDS + (PathCommand,)

    def __init__(self, cluster, blocks, config, test_blocks=None, held_out=None, alpha=None):
        super().__init__(cluster, blocks, config, test_blocks)
        self.held_out = held_out or [None] * len(blocks)
        for st, a in zip(self.state, alpha or ()):
            st.alpha = np.array(a, dtype=np.float64)

    def dual_b(self, ctrl, inputs):
        """DUAL_B: ``b = X^T alpha / n_task`` of every block (of the centered rows when centered)."""
        return self.dense_rows([([blk.rmatvec(self.state[k].alpha) / blk.n_task], ())
                                for k, blk in enumerate(self.blocks)], 1, ctrl.width)

    def validation_scores(self, ctrl, inputs):
        """VALIDATE: ``X w + b`` of every block's validation rows (b of the training block: ``ybar_f - mu_f.w``
        when centered, else 0), in plan order."""
        parts = [h.decision(self.full_w(k)) + self.blocks[k].intercept(self.w[k])
                 for k, h in enumerate(self.held_out) if h is not None]
        return np.concatenate(parts) if parts else np.zeros(0)


class PathServer(dmtrl.Server):
    """A DMTRL server that may start from the workers' alpha, and scores validation rows."""

    def __init__(self, *args, warm=False, validate=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.warm, self.validate = warm, validate
        self.score_rows_off_supports(validate)
        self.scores = None

    def run(self, resume=None):
        if self.warm:
            self.start_from_alpha()
        converged = super().run(resume)
        if self.validate:
            self.scores = self.command(PathCommand.VALIDATE)
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


# ---------------------------------------------------------------------------
# The split: every rank its own blocks' fold ids; the server every fold's plan
# ---------------------------------------------------------------------------
class TrainingRows:
    """A task source's table with the training counts of one fold (what the server reads of a source)."""

    def __init__(self, source, n_samples, means=None):
        self.path, self.names, self.n_tasks = source.path, list(source.names), source.n_tasks
        self.n_features, self.nnz = source.n_features, source.nnz
        self.n_samples = np.asarray(n_samples, dtype=np.int64)
        self.means = means                    # task -> (mu, ybar) of the fold's training rows (centered fits)

    def task_means(self, i, feature_map=None):
        """The fold's training-row means of task ``i`` (the fit's intercept ``ybar_f - mu_f.w``)."""
        return self.means[i]


def labels_of(source, blocks, task):
    """The task's labels: from a block holding the whole task, else read (labels only)."""
    for b in blocks:
        if b.task == task and b.row_start == 0 and b.n_rows == int(source.n_samples[task]):
            return b.y
    read = getattr(source, "read_labels", None)
    return read(task) if read is not None else source.read_task(task).y


def local_folds(source, blocks, selection, seed, stratify):
    """The fold ids of this rank's blocks' rows (one array a block), and of its tasks' rows (task -> array)."""
    whole = {}
    for b in blocks:
        if b.task not in whole:
            whole[b.task] = (np.asarray(selection.folds[b.task], dtype=np.int64) if selection.folds is not None
                             else task_folds(labels_of(source, blocks, b.task), seed, b.task, selection, stratify))
    return [whole[b.task][b.row_start:b.row_start + b.n_rows] for b in blocks], whole


def fold_means(source, task_ids, n_folds, phi):
    """task -> every fold's ``(mu_f, ybar_f)`` over its training rows, for the tasks of ``task_ids``
    (task -> fold id of each row): one pass over each task's rows."""
    return {t: source.task_means(t, phi, folds=ids, n_folds=n_folds) for t, ids in sorted(task_ids.items())}


def server_task_folds(info, plan, n_tasks):
    """On the server: task -> the fold id of each of its rows, from the ids gathered per plan block."""
    parts = {}
    for k, b in enumerate(plan):
        parts.setdefault(b.task, []).append((b.part, info["ids"][k]))
    return {t: np.concatenate([ids for _, ids in sorted(parts[t], key=lambda e: e[0])]) for t in range(n_tasks)}


def fold_plans(cluster, plan, folds, blocks, n_tasks, n_folds):
    """On every rank: per fold, the plan of the training rows, the tasks' training counts; on the server also
    each plan block's validation labels and the split's digest.

    The fold ids and labels travel once (Gatherv); the plans come back by a
    broadcast of small metadata.
    """
    ids = cluster.gather_variable(np.concatenate(folds) if folds else np.zeros(0))
    labels = cluster.gather_variable(np.concatenate([b.y for b in blocks]) if blocks else np.zeros(0))
    info = None
    if cluster.is_server:
        pos = {}
        per_block = []
        for b in plan:
            r = cluster.worker_rank(b.worker)
            p = pos.get(r, 0)
            per_block.append((ids[r][p:p + b.n_rows].astype(np.int64), labels[r][p:p + b.n_rows]))
            pos[r] = p + b.n_rows
        order = sorted(range(len(plan)), key=lambda k: (plan[k].task, plan[k].part))
        digest = hashlib.sha256()
        for k in order:
            digest.update(np.int64(plan[k].task).tobytes() + per_block[k][0].tobytes())
        info = {"plans": [], "counts": [], "val_y": [], "digest": digest.hexdigest(),
                "ids": [ids for ids, _ in per_block]}
        for f in range(n_folds):
            counts = np.zeros(n_tasks, dtype=np.int64)
            start, keep = {}, {}
            for k in order:                      # a task's parts in order: their training rows numbered on
                keep[k] = int(np.count_nonzero(per_block[k][0] != f))
                start[k] = int(counts[plan[k].task])
                counts[plan[k].task] += keep[k]
            info["plans"].append([Block(b.task, b.part, start[k], start[k] + keep[k], b.worker)
                                  for k, b in enumerate(plan)])
            info["counts"].append(counts)
            info["val_y"].append([per_block[k][1][per_block[k][0] == f] for k in range(len(plan))])
    shared = cluster.bcast_object(None if info is None else {"plans": info["plans"], "counts": info["counts"]})
    return shared, info


def cut(blocks, folds, f, counts, sub_plan, means=None):
    """This rank's blocks for fold f: (training blocks, validation blocks or None); ``sub_plan``: this rank's
    blocks of the fold's plan (their starts number the task's training rows); ``means`` (task -> every fold's
    training-row means): the training rows centered on them, the validation rows left as read."""
    train, held = [], []
    for b, ids, sub in zip(blocks, folds, sub_plan):
        keep = ids != f
        rows = TaskBlock(b.task, b.name, int(counts[b.task]), sub.start, b.X[keep], b.y[keep], b.part)
        train.append(rows.centered(*means[b.task][f]) if means is not None else rows)
        val = ~keep
        held.append(TaskBlock(b.task, b.name, b.n_task, b.row_start, b.X[val], b.y[val], b.part)
                    if val.any() else None)
    return train, held


@dataclass
class PathTrainResult(dmtrl.TrainResult):
    """The refit model at the chosen lam, with the path (one entry per grid point) and the choice."""
    path: dict = field(default_factory=dict)
    selection: dict = field(default_factory=dict)


def train_path(cluster, source, config, selection: Selection, test_source=None, sigma_fixed=None, progress=None,
               warn=None, note=None, sigma_of=None):
    """Solve ``selection.grid`` on every rank, choose lam by validation, refit on all rows (server: a
    :class:`PathTrainResult`; workers: None).

    ``note(text)`` (server) hears one line per grid point, ``warn(text)``
    (server) of every unconverged W-step; the result's ``selection["warnings"]``
    name unconverged points and a chosen lam at an edge of the grid.
    ``selection.name == "alpha"``: the grid is of a graph kernel's alpha at
    ``config.lam``, ``sigma_of(alpha)`` the fixed Sigma of a point (warm
    starts keep alpha of the dual: its boxes depend on neither lam nor Sigma).
    """
    config.validate()
    selection.validate(config.loss)
    selection.check_sizes(source)
    if selection.name == "alpha":
        sigmas = [sigma_of(v) for v in selection.grid]        # identically on every rank: errors fail together
    else:
        sigmas = [sigma_fixed] * len(selection.grid)
    if config.relationship == "fixed":
        sigmas = [dmtrl.check_sigma(sigma, source.n_tasks) for sigma in sigmas]

    def point(g):                                           # (config, Sigma) of grid point g
        value = selection.grid[g]
        return (dataclasses.replace(config, lam=value) if selection.name == "lam" else config), sigmas[g]
    warn = warn or (lambda text: None)
    center = engine.intercept_mode(config) == "center"
    whole = engine.planned_for(cluster, source, config)          # every training row: the refit's plan
    blocks, tests = engine.load_blocks(whole, source, config, test_source, prepare=not center)
    plan = list(whole.blocks)
    stratify = get_loss(config.loss).binary_labels
    folds, task_ids = local_folds(source, blocks, selection, config.seed, stratify)
    shared, info = fold_plans(cluster, plan, folds, blocks, source.n_tasks, selection.n_folds)
    grid, n_folds, warm = selection.grid, selection.n_folds, selection.warm_start
    phi = engine.means_map(config, features.rff_map(source.n_features, config.rff_dim, config.rff_gamma, config.seed)
                           if config.rff_dim else None)
    means = all_means = None
    if center and cluster.is_server:             # every task's, for the fold fits' intercepts
        all_means = fold_means(source, server_task_folds(info, plan, source.n_tasks), n_folds, phi)
    if center:                                   # this rank's tasks' (the same bits: read once in serial runs)
        means = ({t: all_means[t] for t in task_ids} if all_means is not None
                 else fold_means(source, task_ids, n_folds, phi))
    G = len(grid)
    rounds, seconds = np.zeros(G, dtype=np.int64), np.zeros(G)
    converged, fold_scores = np.ones(G, dtype=np.int64), np.zeros((G, n_folds))
    snapshots = [None] * G
    for f in range(n_folds):
        fold = cluster.planned(shared["plans"][f])
        rows = TrainingRows(source, shared["counts"][f],
                            {t: m[f] for t, m in all_means.items()} if all_means is not None else None)
        train_blocks, held = cut(blocks, folds, f, shared["counts"][f], fold.my_blocks, means)
        local = None
        for g, value in enumerate(grid):
            cfg, sigma = point(g)
            if local is None or not warm:
                local = PathBlocks(fold, train_blocks, cfg, held_out=held)
            local.config = cfg
            result, server = fit(fold, rows, cfg, local, sigma, warn, warm=warm and g > 0, validate=True)
            if f == n_folds - 1 and warm:
                snapshots[g] = [st.alpha.copy() for st in local.state]
            if result is None:
                continue
            rounds[g] += result.n_rounds
            seconds[g] += result.seconds
            converged[g] &= int(result.converged)
            fold_scores[g, f] = score_of(server, info, f, selection.metric)
            if note is not None:
                note(f"{selection.name} {value:.4g} (fold {f + 1}/{n_folds}): {result.n_rounds} rounds, "
                     f"{'converged' if result.converged else 'NOT converged'}, validation {selection.metric} "
                     f"{fold_scores[g, f]:.6g}")
    scores = fold_scores.mean(axis=1)
    chosen = cluster.bcast_object(best_index(selection.metric, scores) if cluster.is_server else None)
    # the refit on every training row, from the chosen point's alpha (zero on its validation rows)
    cfg, sigma = point(chosen)
    alpha = None
    if warm:
        alpha = []
        for ids, a in zip(folds, snapshots[chosen]):
            full = np.zeros(ids.size)
            full[ids != n_folds - 1] = a
            alpha.append(full)
    if center:                                  # the refit: centered on the whole task's means, as a single run
        blocks = [engine.with_intercept(b, config, source, phi) for b in blocks]
    local = PathBlocks(whole, blocks, cfg, tests, alpha=alpha)
    result, _ = fit(whole, source, cfg, local, sigma, warn, warm=warm, progress=progress,
                    test_source=test_source)
    if result is None:
        return None
    warnings, name = [], selection.name
    if not converged.all():
        bad = [f"{grid[g]:.4g}" for g in np.flatnonzero(converged == 0)]
        warnings.append(f"{len(bad)} of {G} grid points had W-steps that ended unconverged ({name} {', '.join(bad)}): "
                        f"their validation scores are not certified; raise --max-rounds")
    if G > 1 and chosen in (0, G - 1):
        end = "largest" if chosen == 0 else "smallest"
        warnings.append(f"the chosen {name} {grid[chosen]:.4g} is the {end} of the grid ({grid[-1]:.4g} .. "
                        f"{grid[0]:.4g}): the best {name} may lie beyond it; extend the grid")
    path = {"lam": np.asarray([point(g)[0].lam for g in range(G)]), "validation_score": scores,
            "fold_scores": fold_scores, "rounds": rounds, "seconds": seconds, "converged": converged}
    path[name] = np.asarray(grid)
    how = ({"validation_fraction": selection.validation_fraction} if selection.validation_fraction is not None
           else {"cv": n_folds})
    chosen_info = dict(how, parameter=name, chosen_lam=cfg.lam, chosen_index=chosen, metric=selection.metric,
                       warm_start=warm, split_digest=info["digest"], converged=bool(converged.all()),
                       warnings=warnings, **({"chosen_alpha": grid[chosen]} if name == "alpha" else {}))
    out = PathTrainResult(**{f.name: getattr(result, f.name) for f in dataclasses.fields(dmtrl.TrainResult)},
                          path=path, selection=chosen_info)
    out.config = dict(out.config, selection=chosen_info)
    return out


class ServerMaker:
    """A method's ``server_class`` that keeps the server it made: a fold's validation scores are the server's
    (``server`` stays None on workers, which make none)."""

    def __init__(self, server_class, **options):
        self.server_class, self.options, self.server = server_class, options, None

    def __call__(self, *args, **kwargs):
        self.server = self.server_class(*args, **self.options, **kwargs)
        return self.server


def fit(cluster, rows, cfg, local, sigma_fixed, warn, warm, validate=False, progress=None, test_source=None):
    """One grid point (or the refit): a DMTRL fit over ``local``'s blocks (its cluster's plan); (result, server)
    on the server, (None, None) on workers."""
    maker = ServerMaker(PathServer, warm=warm, validate=validate)
    result = dmtrl.train(cluster, rows, cfg, test_source, sigma_fixed=sigma_fixed, progress=progress, warn=warn,
                         make_local=lambda: local, server_class=maker)
    return result, maker.server


def score_of(server, info, f, metric, scores=None):
    """The validation metric of fold f from the scores the server gathered (a list in rank order, default
    ``server.scores``; tasks in order, parts in order)."""
    scores = server.scores if scores is None else scores
    plan = server.blocks
    val_y = info["val_y"][f]
    pos = {}
    per_task = {}
    for k, b in enumerate(plan):
        r = server.cluster.worker_rank(b.worker)
        p, n = pos.get(r, 0), val_y[k].size
        per_task.setdefault(b.task, []).append((b.part, val_y[k], scores[r][p:p + n]))
        pos[r] = p + n
    ys, ss = [], []
    for t in sorted(per_task):
        parts = sorted(per_task[t], key=lambda e: e[0])
        ys.append(np.concatenate([e[1] for e in parts]))
        ss.append(np.concatenate([e[2] for e in parts]))
    keep = [k for k, y in enumerate(ys) if y.size]
    return validation_score(metric, [ys[k] for k in keep], [ss[k] for k in keep])


# ---------------------------------------------------------------------------
# The radius of joint-sparse (paper 002) chosen by validation: the path of each fold, then a refit
# ---------------------------------------------------------------------------
class RadiusCommand(Command):
    """``ID = id, down, up, control fields, computation (a RadiusBlocks method)``."""
    # every block's [w, b] of the radius just solved -> the scores of its validation rows, per rank
    VALIDATE_COLUMNS = 112, Down.SCATTER_ROWS, Up.GATHER_VECTORS, ("width",), "validation_scores_of"


class RadiusBlocks(joint_sparse.LocalGradients):
    """:class:`hpcmtl.joint_sparse.LocalGradients` that also hold each block's validation rows (``held_out``)."""

    COMMANDS = joint_sparse.LocalGradients.COMMANDS + (RadiusCommand,)

    def __init__(self, cluster, blocks, config, held_out):
        super().__init__(cluster, blocks, config)
        self.held_out = held_out

    def validation_scores_of(self, ctrl, rows):
        """VALIDATE_COLUMNS: ``X w + b`` of every block's validation rows at the given columns, in plan order."""
        w = rows[:, :self.d]
        b = rows[:, self.d] if rows.shape[1] > self.d else np.zeros(len(self.blocks))
        parts = [h.decision(w[k]) + b[k] for k, h in enumerate(self.held_out) if h is not None]
        return np.concatenate(parts) if parts else np.zeros(0)


class RadiusServer(joint_sparse.Server):
    """A joint-sparse server that scores the validation rows after every radius of its path."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.validation, self.marks = [], [(0, 0.0)]

    def radius_solved(self):
        columns = np.hstack([self.W.T, self.b[:, None]]) if self.with_b else self.W.T
        self.validation.append(self.command(RadiusCommand.VALIDATE_COLUMNS, payload=columns[self.block_task],
                                            width=columns.shape[1]))
        self.marks.append((self.round, self.elapsed()))


def train_radius_path(cluster, source, config, selection: Selection, test_source=None, progress=None, note=None):
    """Joint-sparse (paper 002): choose the ball's radius from ``selection.grid`` by validation, refit on all rows
    (server: a :class:`hpcmtl.joint_sparse.JointSparseResult` whose ``path`` is the selection's and whose
    ``selection`` says what was chosen; workers: None).

    Each fold solves the whole path on its training rows, smallest radius
    first, each radius warm-started from the previous one's best iterate (as
    ``--path`` does), and scores its validation rows at every radius.  The refit
    solves the chosen radius on all the rows, warm-started from the last
    fold's solution there (``max_rounds`` steps, like every radius).  A
    subgradient method has no certificate: every point runs ``max_rounds``.
    """
    if selection.name != "radius":
        raise ValueError(f"train_radius_path chooses a radius, not {selection.name!r}")
    config.validate()
    selection.validate(config.loss)
    selection.check_sizes(source)
    whole = engine.planned_for(cluster, source, config)          # every training row: the refit's plan
    blocks, tests = engine.load_blocks(whole, source, config, test_source)
    plan = list(whole.blocks)
    folds, _ = local_folds(source, blocks, selection, config.seed, get_loss(config.loss).binary_labels)
    shared, info = fold_plans(cluster, plan, folds, blocks, source.n_tasks, selection.n_folds)
    grid, n_folds = selection.grid, selection.n_folds
    G = len(grid)
    rounds, seconds = np.zeros(G, dtype=np.int64), np.zeros(G)
    fold_scores, selected = np.zeros((G, n_folds)), np.zeros((G, n_folds), dtype=np.int64)
    last = None
    for f in range(n_folds):
        fold = cluster.planned(shared["plans"][f])
        train_blocks, held = cut(blocks, folds, f, shared["counts"][f], fold.my_blocks)
        maker = ServerMaker(RadiusServer)
        result = joint_sparse.train(fold, TrainingRows(source, shared["counts"][f]), config, radii=grid,
                                    make_local=lambda: RadiusBlocks(fold, train_blocks, config, held),
                                    server_class=maker)
        if result is None:
            continue
        server, last = maker.server, result
        marks = np.asarray(server.marks)
        rounds += np.diff(marks[:, 0]).astype(np.int64)
        seconds += np.diff(marks[:, 1])
        selected[:, f] = result.path["selected"]
        for g in range(G):
            fold_scores[g, f] = score_of(server, info, f, selection.metric, server.validation[g])
            if note is not None:
                note(f"radius {grid[g]:.4g} (fold {f + 1}/{n_folds}): {int(selected[g, f])} features selected, "
                     f"validation {selection.metric} {fold_scores[g, f]:.6g}")
    scores = fold_scores.mean(axis=1)
    chosen = cluster.bcast_object(best_index(selection.metric, scores) if cluster.is_server else None)
    W0 = b0 = None
    if last is not None and selection.warm_start:
        W0, b0 = last.path["W"][chosen], last.path["intercept"][chosen]
    result = joint_sparse.train(whole, source, config, test_source, W0=W0, b0=b0, progress=progress,
                                radii=[grid[chosen]],
                                make_local=lambda: joint_sparse.LocalGradients(whole, blocks, config, tests))
    if result is None:
        return None
    warnings = []
    if G > 1 and chosen in (0, G - 1):
        end = "smallest" if chosen == 0 else "largest"
        warnings.append(f"the chosen radius {grid[chosen]:.4g} is the {end} of the grid ({grid[0]:.4g} .. "
                        f"{grid[-1]:.4g}): the best radius may lie beyond it; extend the grid")
    how = ({"validation_fraction": selection.validation_fraction} if selection.validation_fraction is not None
           else {"cv": n_folds})
    chosen_info = dict(how, parameter="radius", chosen_radius=grid[chosen], chosen_index=chosen,
                       metric=selection.metric, warm_start=selection.warm_start, split_digest=info["digest"],
                       warnings=warnings)
    result.path = {"radius": np.asarray(grid), "validation_score": scores, "fold_scores": fold_scores,
                   "rounds": rounds, "seconds": seconds, "selected": selected,
                   "refit_selected": np.asarray(result.path["selected"])}
    result.selection = chosen_info
    result.config = dict(result.config, radius=grid[chosen], selection=chosen_info)
    return result
