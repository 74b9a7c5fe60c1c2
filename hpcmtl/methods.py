"""The method table of ``hpcmtl train``: one row a method, name -> what builds its config, trains, writes.

:data:`METHODS` maps a method name to a :class:`Method`:

* ``config(args)``: the validated config from the command line, identically on every rank
  (None: the method builds its config in ``train``, as online does against its stream);
* ``selection(args, config)``: a :class:`hpcmtl.model_selection.Selection` when a grid or a
  validation split is asked for, else None (None for a method without one);
* ``train(run)``: the training on a :class:`Run` (the parsed options, the cluster, the config,
  the selection); the result (server) or None (workers);
* ``write(run, result)``: the result file and the summary (server);
* ``estimator``: the scikit-learn estimator of the method in :mod:`hpcmtl.estimators` with the
  parameters that make it that method (None: no estimator), loaded on demand by
  :func:`estimator_class` (a training job does not import scikit-learn).

So ``hpcmtl train METHOD`` is a lookup (:func:`hpcmtl.cli.train.cmd_train`), and a new method
is its own module plus one row here, plus its name, help and option groups in
:mod:`hpcmtl.params`: the command line's option table lives below this layer (the
configs validate against it), so the names are declared there (``TRAIN_METHODS``) and this
table is the behaviour under them; importing this module checks the two agree.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable

from .errors import InputError
from .metrics import evaluate_arrays
from .params import DISTRIBUTED_SDCA, TRAIN_METHODS


@dataclass
class Run:
    """One ``hpcmtl train``: what every method's ``train`` and ``write`` read."""
    args: object                   # the parsed options (every method's attribute, another method's at its default)
    cluster: object
    signals: object                # the installed SignalFlag (checkpoints on SIGTERM, SIGUSR1, SIGINT)
    checkpoint: str                # the checkpoint path (--checkpoint, else OUT.checkpoint.h5)
    version: str                   # hpcmtl's version, written into the result file
    config: object = None
    selection: object = None
    source: object = None          # the task file (task methods)
    test_source: object = None
    sigma: object = None           # the fixed task covariance (or None)
    sigma_of: Callable | None = None   # alpha -> Sigma of a graph kernel (train graph)
    progress: object = None
    # a test stream checked against an online model (the command line's: hpcmtl.cli.evaluate.open_test_stream,
    # which lives above this layer)
    open_test_stream: Callable | None = None


@dataclass(frozen=True)
class Method:
    """One row of :data:`METHODS`."""
    name: str
    config: Callable | None
    selection: Callable | None
    train: Callable
    write: Callable
    estimator: tuple | None = None          # (class name in hpcmtl.estimators, the parameters it is fixed at)
    stream: bool = False                    # reads --stream, not --train


# ---------------------------------------------------------------------------
# configs and selections from the command line
# ---------------------------------------------------------------------------
def sdca_config(relationship, fixed_by_sigma=False):
    """The config builder of a dual coordinate ascent method whose task covariance is ``relationship``
    (``fixed_by_sigma``: ``fixed`` when --sigma is given)."""
    def build(args):
        from .dmtrl import DMTRLConfig
        lam = args.lam_grid if getattr(args, "lam_grid", None) is not None else args.lam
        if lam is None:
            raise InputError(f"method '{args.method}' needs --lam")
        lam = max(lam) if isinstance(lam, list) else lam       # a grid: validated here, solved by train_path
        kind = "fixed" if fixed_by_sigma and args.sigma is not None else relationship
        return DMTRLConfig(loss=args.loss, lam=lam, gamma=args.gamma, tol=args.tol, max_rounds=args.max_rounds or 500,
                           outer=args.outer, outer_tol=args.outer_tol, local_iters=args.local_iters, seed=args.seed,
                           local_steps=args.local_steps, eta=args.eta, gap_every=args.gap_every, relationship=kind,
                           rff_dim=args.rff_dim, aggregation=args.aggregation, exchange=args.exchange,
                           local_solver=args.local_solver, rff_gamma=args.rff_gamma, split_tasks=args.split_tasks,
                           shrinking=not args.no_shrinking, float32=getattr(args, "float32", False),
                           fit_intercept=not args.no_intercept, intercept_scaling=args.intercept_scaling,
                           method=args.method, positive_label=args.positive_label).validate()
    return build


def l1inf_config(args):
    from .joint_sparse import JointSparseConfig
    if args.radius is None and args.path is None:
        raise InputError("method 'l1inf' needs --radius C (or --path C1,C2,...)")
    return JointSparseConfig(radius=args.radius or 1.0, loss=args.loss, projection=args.projection,
                             eta0=args.eta0, intercept_eta0=args.intercept_eta0,
                             max_rounds=args.max_rounds or 200, gamma=args.gamma,
                             seed=args.seed, rff_dim=args.rff_dim, rff_gamma=args.rff_gamma,
                             split_tasks=args.split_tasks, fit_intercept=not args.no_intercept,
                             positive_label=args.positive_label).validate()


def lam_selection(args, config):
    """A lam grid (or a graph kernel's alpha grid) or a validation split; None when neither is asked for."""
    from .model_selection import Selection
    grid = getattr(args, "lam_grid", None)
    if grid is not None and args.lam is not None:
        raise InputError("give --lam or --lam-grid, not both")
    grid = args.lam if grid is None else grid
    name = "lam"
    if isinstance(args.alpha, list):                 # train graph: a grid of the graph kernel's alpha at one lam
        if isinstance(grid, list):
            raise InputError("a grid of --alpha goes with one --lam, not with a grid of lam")
        grid, name = args.alpha, "alpha"
    if not (isinstance(grid, list) or args.validation_fraction is not None or args.cv is not None):
        if args.metric is not None or args.no_warm_start:
            raise InputError("--metric and --no-warm-start go with a lam grid (--lam A,B,... or --lam-grid) or "
                             "--validation-fraction / --cv")
        return None
    if args.method not in DISTRIBUTED_SDCA:
        raise InputError(f"a lam grid is for train {', '.join(DISTRIBUTED_SDCA)}, not for train {args.method}")
    if args.resume or args.checkpoint_every or args.checkpoint_seconds:
        raise InputError("checkpoints are for a single lam, not for a lam grid")
    return Selection(grid if isinstance(grid, list) else [grid], args.validation_fraction, args.cv, args.metric,
                     warm_start=not args.no_warm_start, name=name).validate(config.loss)


def radius_selection(args, config):
    """The radius of the ball from --path (or --radius) chosen by validation; None without a validation split."""
    from .model_selection import Selection
    if args.validation_fraction is None and args.cv is None:
        if args.metric is not None:
            raise InputError("--metric goes with --validation-fraction or --cv")
        return None
    if args.resume or args.checkpoint_every or args.checkpoint_seconds:
        raise InputError("checkpoints are for a radius path without validation, not with --validation-fraction "
                         "or --cv")
    grid = parse_radii(args.path) if args.path else [args.radius]
    return Selection(grid, args.validation_fraction, args.cv, args.metric, name="radius").validate(config.loss)


def parse_radii(text):
    try:
        radii = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"--path must be comma-separated numbers, got {text!r}") from None
    if not radii or any(not (r > 0) for r in radii):
        raise InputError(f"--path radii must be > 0, got {text!r}")
    return radii


def read_sigma(path):
    """A task covariance from a result file (/model/Sigma) or a .npy file."""
    import numpy as np

    from . import store
    if path is None:
        raise InputError("method 'fixed' needs --sigma RESULT.h5 or --sigma SIGMA.npy")
    if path.endswith(".npy"):
        if not os.path.exists(path):
            raise InputError(f"{path}: no such file")
        return np.load(path, allow_pickle=False)
    return store.read_result(path)["model"]["Sigma"]


def online_config(args):
    from .online import OnlineConfig
    C = args.C
    if C != "auto":
        try:
            C = float(C)
        except ValueError:
            raise InputError(f"--C must be a number > 0 or 'auto', got {args.C!r}") from None
        if not C > 0 or C == float("inf"):
            raise InputError(f"--C must be a number > 0 or 'auto', got {args.C!r}")
    return OnlineConfig(update=args.update, norm=args.norm, r=args.r, p=args.p, C=C, R=args.R, code=args.code,
                        block_rounds=args.block_rounds, chunk_rounds=args.chunk_rounds)


# ---------------------------------------------------------------------------
# training: the task file, the task covariance and the progress every task method opens, then each method's run
# ---------------------------------------------------------------------------
def fixed_sigma(run):
    """A fixed task covariance from --sigma where the config's relationship is fixed."""
    if getattr(run.config, "relationship", None) == "fixed":
        run.sigma = read_sigma(run.args.sigma)


def graph_sigma(run):
    """train graph: the task kernel of --graph at --alpha (a grid of alpha: one Sigma a point, ``run.sigma_of``)."""
    from .task_graph import graph_adjacency, task_kernel
    args, source = run.args, run.source
    if args.graph is None:
        raise InputError("method 'graph' needs --graph (a topology name or an edge-list CSV)")
    adjacency = graph_adjacency(args.graph, source.names)

    def sigma_of(alpha):
        return task_kernel(adjacency, alpha, not args.unnormalized, source.names)
    run.sigma_of = sigma_of
    run.sigma = None if isinstance(args.alpha, list) else sigma_of(args.alpha)


def open_tasks(run, covariance=fixed_sigma):
    """The task file (and test file), the task covariance, the progress display (server)."""
    from . import store
    args, config = run.args, run.config
    run.source = store.TaskFile(args.train)
    run.test_source = store.TaskFile(args.test) if args.test else None
    covariance(run)
    if run.cluster.is_server:
        from .progress import Progress
        run.progress = Progress(args.log_level, args.progress_seconds, tol=getattr(config, "tol", None),
                                max_rounds=None if getattr(config, "tol", None) else config.max_rounds)


def checkpointer_of(run):
    """The server's checkpoint policy (None on workers)."""
    from .checkpoint import Checkpointer
    args = run.args
    return (Checkpointer(run.checkpoint, args.checkpoint_every, args.checkpoint_seconds or 0.0, run.signals,
                         run.config.to_dict(), run.source, run.sigma) if run.cluster.is_server else None)


def closed(run, result):
    """``result`` once the progress display is closed."""
    run.progress and run.progress.close()
    return result


def train_sdca(covariance=fixed_sigma):
    """The train function of a distributed dual coordinate ascent method (DMTRL's engine): one lam, or a grid
    chosen by validation (:func:`hpcmtl.model_selection.train_path`)."""
    def train_run(run):
        from .dmtrl import train
        open_tasks(run, covariance)
        args, cluster = run.args, run.cluster
        if run.selection is not None:
            from .model_selection import train_path
            return closed(run, train_path(cluster, run.source, run.config, run.selection, run.test_source,
                                          sigma_fixed=run.sigma, progress=run.progress,
                                          warn=warn_line(args, run.progress),
                                          note=warn_line(args, run.progress, kind="path"), sigma_of=run.sigma_of))
        checkpointer = checkpointer_of(run)
        resume = run.checkpoint if args.resume else None
        return closed(run, train(cluster, run.source, run.config, run.test_source, sigma_fixed=run.sigma,
                                 progress=run.progress, checkpointer=checkpointer, resume=resume,
                                 warn=warn_line(args, run.progress)))
    return train_run


def train_baseline(solve_name):
    """The train function of a centralized baseline of :mod:`hpcmtl.baselines` (rank 0 only)."""
    def train_run(run):
        from . import baselines
        open_tasks(run)
        args, source = run.args, run.source
        if args.resume or args.checkpoint_every or args.checkpoint_seconds:
            raise InputError(f"checkpoints are for the distributed methods, not '{args.method}'")
        if not run.cluster.is_server:
            return None                             # centralized baselines run on rank 0 only
        result = getattr(baselines, solve_name)(source, run.config, run.sigma, progress=run.progress,
                                                warn=warn_line(args))
        if run.test_source is not None:
            result.test = evaluate_arrays(result.W, dict(result.config, n_features=source.n_features),
                                          run.test_source, result.task_names, intercept=result.intercept)
        return closed(run, result)
    return train_run


def train_l1inf(run):
    """Joint-sparse (paper 002): one radius, a --path, or the radius chosen by validation."""
    open_tasks(run, covariance=lambda run: None)
    args, cluster = run.args, run.cluster
    checkpointer = checkpointer_of(run)
    resume = run.checkpoint if args.resume else None
    if run.selection is not None:                       # the radius chosen by validation
        from .model_selection import train_radius_path
        return closed(run, train_radius_path(cluster, run.source, run.config, run.selection, run.test_source,
                                             progress=run.progress,
                                             note=warn_line(args, run.progress, kind="path")))
    from .joint_sparse import train
    radii = parse_radii(args.path) if args.path else None
    return closed(run, train(cluster, run.source, run.config, run.test_source, progress=run.progress,
                             checkpointer=checkpointer, resume=resume, radii=radii))


def train_online(run):
    """Online multitask learning from a stream (paper 004), evaluated on --test at the end."""
    import numpy as np

    from .checkpoint import Checkpointer
    from .online import StreamTasks, evaluate_stream, train
    args, cluster, open_test_stream = run.args, run.cluster, run.open_test_stream
    config = run.config = online_config(args)
    source = run.source = StreamTasks(args.stream, config.code)
    if args.test:                                    # checked on every rank before any work, evaluated at the end
        probe = open_test_stream(args.test, {"W": np.zeros((source.n_features, source.n_tasks)),
                                                "task_names": source.names, "code": source.code,
                                                "class_names": source.class_names}, args.stream)
        probe.close()
    config.validate(source.n_tasks, source.stream.max_row_norm(), source.typical)   # R, C settle here
    if cluster.is_server:
        from .progress import Progress
        run.progress = Progress(args.log_level, args.progress_seconds, max_rounds=source.n_rounds)
    checkpointer = Checkpointer(run.checkpoint, args.checkpoint_every, args.checkpoint_seconds or 0.0, run.signals,
                                config.to_dict(), source) if cluster.is_server else None
    result = closed(run, train(cluster, source, config, progress=run.progress, checkpointer=checkpointer,
                               resume=run.checkpoint if args.resume else None))
    if result is None:
        return None
    if args.test:
        test_source = open_test_stream(args.test, {"W": result.W, "task_names": result.task_names,
                                                   "code": result.code, "class_names": source.class_names}, args.stream)
        try:
            result.test = evaluate_stream(result.W, test_source, chunk=config.chunk_rounds)
        finally:
            test_source.close()
    return result


# ---------------------------------------------------------------------------
# result files and summaries (server)
# ---------------------------------------------------------------------------
def warn_line(args, progress=None, kind="warning"):
    """Rank 0's one stderr line per W-step that ended unconverged (kept at every --log-level but error);
    ``kind="path"``: one stdout line per grid point of a lam path (--log-level info and debug)."""
    quiet = ("error",) if kind == "warning" else ("error", "warning")

    def warn(message):
        if args.log_level in quiet:
            return
        if progress is not None and getattr(progress, "tty", False) and progress.show:
            print(file=progress.stream, flush=True)          # end the live progress line first
        print(f"hpcmtl: {kind}: {message}", file=sys.stderr if kind == "warning" else sys.stdout, flush=True)
    return warn


def save_result(run, result, sigma, groups, summary):
    """Write the result file (rank 0) and print a summary table unless --log-level error."""
    from . import store
    args, source = run.args, run.source
    config_out = dict(result.config, n_features=source.n_features, train=os.path.abspath(args.train),
                      test=os.path.abspath(args.test) if args.test else None)
    groups = dict(groups)
    model_extra = groups.pop("model", None)
    store.write_result(args.out, result.W, sigma, result.history, config_out, run.cluster.size, run.version,
                       task_names=result.task_names, extra=model_extra, test=result.test,
                       ranks=result.extra or None, groups=groups, force=args.force,
                       intercept=getattr(result, "intercept", None))
    if args.log_level != "error":
        print(summary_table(args, result, summary))
    return result


def summary_table(args, result, headline):
    """The final summary: what ran, how far it got, what it cost, how it tests."""
    rows = [("method", result.config.get("method")), ("status", headline),
            ("rounds", result.n_rounds), ("seconds", f"{result.seconds:.2f}"),
            ("MB moved", f"{result.bytes_moved / 1e6:.3f}")]
    if result.test:
        rows += [(f"test {k}", f"{v:.6g}" if isinstance(v, float) else v) for k, v in result.test["summary"].items()]
    rows.append(("result file", args.out))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def write_sdca(run, result):
    """The result of a dual coordinate ascent method: the model, its W-steps, the path of a grid, the warnings."""
    config = run.config
    h, steps = result.history, result.wsteps
    n_bad = int(len(steps["converged"]) - steps["converged"].sum()) if len(steps.get("converged", [])) else 0
    if result.converged:
        summary = f"converged: every W-step certified, relative gap {h['rel_gap'][-1]:.3e}"
    else:
        summary = (f"NOT converged: {n_bad} of {len(steps['converged'])} W-steps reached max rounds "
                   f"(worst relative gap {float(steps['rel_gap'].max()):.3e} > tol {config.tol:g}); "
                   f"last relative gap {h['rel_gap'][-1]:.3e}")
    path = getattr(result, "path", None)
    if path is not None:
        name = result.selection["parameter"]
        summary += (f"; {name} {result.selection['chosen_' + name]:.4g} chosen by validation "
                    f"{result.selection['metric']}")
    result = save_result(run, result, result.Sigma,
                         {"model": {"rho": result.rho, "converged": int(result.converged)}, "wsteps": steps,
                          **({"path": path} if path is not None else {})},
                         summary)
    for text in (result.selection["warnings"] if path is not None else ()):   # at every --log-level, like below
        print(f"hpcmtl: warning: {text}", file=sys.stderr, flush=True)
    if not result.converged:             # at every --log-level, --quiet included: the model is not certified
        print(f"hpcmtl: warning: {n_bad} of {len(steps['converged'])} W-steps ended unconverged (worst relative gap "
              f"{float(steps['rel_gap'].max()):.3e} > tol {config.tol:g}): the model is not certified; "
              f"raise --max-rounds, or rescale the features where a W-step's warning says its gap stalled",
              file=sys.stderr, flush=True)
    return result


def write_l1inf(run, result):
    """The result of joint-sparse: the path of radii (or of the selection), the features selected."""
    path = dict(result.path)
    selection = getattr(result, "selection", None)
    selected = int(path["refit_selected"][-1] if selection else path["selected"][-1])
    summary = (f"{result.config['projection']} ball: best objective {result.history['best_objective'][-1]:.6g}, "
               f"{selected} of {result.W.shape[0]} features selected")
    if selection:
        summary += f"; radius {selection['chosen_radius']:.4g} chosen by validation {selection['metric']}"
    result = save_result(run, result, None, {"path": path}, summary)
    for text in (selection["warnings"] if selection else ()):          # at every --log-level
        print(f"hpcmtl: warning: {text}", file=sys.stderr, flush=True)
    return result


def write_online(run, result):
    """The result of online learning: W, the trace, the stream's summary (and the output code)."""
    from . import store
    args, source = run.args, run.source
    s = result.summary
    headline = (f"{s['rounds']} rounds: cumulative loss {s['cumulative_loss']:.6g}, inf-error rate "
                f"{s['inf_error_rate']:.4f}, 1-error rate {s['one_error_rate']:.4f}"
                + (f", multiclass error rate {s['multiclass_error_rate']:.4f}" if "multiclass_error_rate" in s else ""))
    model = {"C": result.config["C"]}
    if result.code is not None:
        model["code"] = result.code
        model["class_names"] = list(source.class_names)      # the code's rows: evaluate matches test classes by name
    config_out = dict(result.config, n_features=source.n_features, stream=os.path.abspath(args.stream),
                      test=os.path.abspath(args.test) if args.test else None, summary=s)
    store.write_result(args.out, result.W, None, result.history, config_out, run.cluster.size, run.version,
                       task_names=result.task_names, extra=model, test=result.test, ranks=result.extra,
                       groups={"trace": result.trace}, force=args.force)
    if args.log_level != "error":
        print(summary_table(args, result, headline))
    return result


# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------
METHODS = {m.name: m for m in (
    Method("dmtrl", sdca_config("learned"), lam_selection, train_sdca(), write_sdca, ("DMTRL", {})),
    Method("stl", sdca_config("identity"), lam_selection, train_sdca(), write_sdca,
           ("DMTRL", {"relationship": "identity"})),
    Method("fixed", sdca_config("fixed"), lam_selection, train_sdca(), write_sdca,
           ("DMTRL", {"relationship": "fixed"})),
    Method("graph", sdca_config("fixed"), lam_selection, train_sdca(graph_sigma), write_sdca, ("GraphMTL", {})),
    Method("ssdca", sdca_config("learned", fixed_by_sigma=True), lam_selection, train_baseline("ssdca"),
           write_sdca),
    Method("mtrl-central", sdca_config("learned", fixed_by_sigma=True), lam_selection,
           train_baseline("mtrl_central"), write_sdca),
    Method("l1inf", l1inf_config, radius_selection, train_l1inf, write_l1inf, ("JointSparseMTL", {})),
    Method("online", None, None, train_online, write_online, ("OnlineMultitask", {}), stream=True),
)}

if tuple(METHODS) != TRAIN_METHODS:             # the names are hpcmtl.params's (the option table's)
    raise RuntimeError(f"hpcmtl.methods.METHODS {tuple(METHODS)} differ from hpcmtl.params.TRAIN_METHODS "
                       f"{TRAIN_METHODS}")


def method(name) -> Method:
    """The row of ``name`` (an :class:`hpcmtl.errors.InputError` naming the methods for another name)."""
    try:
        return METHODS[name]
    except KeyError:
        raise InputError(f"unknown method {name!r}: one of {', '.join(METHODS)}") from None


def estimator_class(name):
    """(the estimator class of method ``name``, the parameters it is fixed at), or None: scikit-learn is
    imported here, not when a training job starts."""
    row = method(name).estimator
    if row is None:
        return None
    from . import estimators
    return getattr(estimators, row[0]), dict(row[1])
