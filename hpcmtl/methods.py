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
is its own module plus this file: its name and one-line help (:data:`METHOD_HELP`), the option
groups it takes (:func:`train_option_groups`: every ``hpcmtl train`` option once, its value rules
from :data:`hpcmtl.params.PARAMS`, which every config and estimator validates against too) and its
row in :data:`METHODS`; importing this module checks that the rows and the names agree.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from .cluster import WATCHDOG_SECONDS
from .errors import InputError
from .metrics import evaluate_arrays
from .params import (NONNEGATIVE_INT, POSITIVE, Interval, log_grid_type, number_list_type, number_type,  # noqa: F401
                     option_keywords)
from .progress import DEFAULT_SECONDS

# ---------------------------------------------------------------------------
# hpcmtl train: every option once, in groups; each method's sub-parser takes the groups it reads
# ---------------------------------------------------------------------------
# the methods, in the order the command line lists them: the names and help here (the option groups below read
# them), the behaviour of each in METHODS (one row a method, checked to agree with these names)
METHOD_HELP = {
    "dmtrl": "distributed multi-task relationship learning (paper 001)",
    "stl": "single-task learning: every task alone (Sigma = identity), same engine",
    "fixed": "a fixed task covariance (--sigma), same engine",
    "graph": "a task-graph kernel as the fixed covariance (paper 003), same engine",
    "ssdca": "centralized baseline: single-machine SDCA over all tasks (rank 0)",
    "mtrl-central": "centralized baseline: exact MTRL for the squared loss, SSDCA otherwise (rank 0)",
    "l1inf": "joint feature selection under an l1,inf ball (paper 002)",
    "online": "online multitask learning from a stream (paper 004)",
}
TRAIN_METHODS = tuple(METHOD_HELP)
TASK_METHODS = tuple(m for m in TRAIN_METHODS if m != "online")                 # read --train (online: --stream)
DISTRIBUTED_SDCA = ("dmtrl", "stl", "fixed", "graph")                           # DMTRL's engine under mpiexec
SDCA_METHODS = DISTRIBUTED_SDCA + ("ssdca", "mtrl-central")                     # + the centralized baselines
CHECKPOINTED = DISTRIBUTED_SDCA + ("l1inf", "online")
METHOD_DEFAULTS = {m: {"max_rounds": 500} for m in SDCA_METHODS} | {"l1inf": {"max_rounds": 200}}


def watchdog_seconds(text):
    """``--watchdog``'s argparse type: finite seconds >= 0 (0 turns the watchdog off)."""
    import argparse
    import math
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"--watchdog must be a number of seconds >= 0, got {text!r}")
    return value


def train_option_groups():
    """(title, methods, [(flags, argparse keywords), ...]) of ``hpcmtl train``: each option once.

    A hyper-parameter's keywords come from :data:`PARAMS` (:func:`option_keywords`); the
    keywords written here are what the command line does differently (a required value
    has no default, ``--loss`` is checked by the config, ``--C`` is read as text).
    ``methods`` narrows an option to some of its group's methods, ``help_for`` gives a
    method its own help text.
    """
    def param(flag, **given):
        return (flag,), option_keywords(flag.lstrip("-").replace("-", "_"), flag, **given)

    return [
        ("data and output", TRAIN_METHODS, [
            (("--train",), dict(metavar="TRAIN.h5", methods=TASK_METHODS, help="the task dataset (required)")),
            (("--stream",), dict(metavar="STREAM.h5", methods=("online",),
                                 help="the stream, read in chunks of rounds (required)")),
            (("--out",), dict(required=True, metavar="RESULT.h5", help="the result file")),
            (("--test",), dict(metavar="TEST.h5", help="test tasks for the final model",
                               help_for={"online": "a test stream for the final model"})),
            (("--force",), dict(action="store_true", help="overwrite an existing result file")),
        ]),
        ("loss and features", TASK_METHODS, [
            param("--loss", choices=None),
            param("--gamma"),
            param("--max-rounds", default=None, help_for={"l1inf": "subgradient steps per radius"}),
            param("--seed"),
            param("--rff-dim"),
            param("--rff-gamma"),
            param("--split-tasks", methods=DISTRIBUTED_SDCA + ("l1inf",)),
            param("--float32", methods=DISTRIBUTED_SDCA),
            param("--positive-label", metavar="LABEL", default=None),
            (("--no-intercept",), dict(action="store_true", help="no per-task intercept (fit_intercept=False)")),
            param("--intercept-scaling", methods=SDCA_METHODS),
        ]),
        ("dual coordinate ascent", SDCA_METHODS, [
            param("--lam", default=None, type=number_list_type("--lam", POSITIVE),
                  help="regularization (required), or a comma-separated grid chosen by validation",
                  help_for={"ssdca": "regularization (required)", "mtrl-central": "regularization (required)"}),
            param("--tol"),
            param("--local-iters"),
            param("--local-steps"),
            param("--gap-every"),
            (("--no-shrinking",), dict(action="store_true",
                                       help="visit every coordinate in every pass (hinge losses)")),
            param("--outer"),
            param("--outer-tol", type=float),          # its range is the config's check, as it always was
            (("--sigma",), dict(metavar="SIGMA", methods=("fixed", "ssdca", "mtrl-central"),
                                help="the task covariance, from a result file (/model/Sigma, or its factors: "
                                     "kept from 512 tasks on), a .npy file, or a sparse precision Sigma^-1 in a "
                                     "scipy.sparse .npz file (required for fixed)")),
        ]),
        ("lam (l1inf: the radius) chosen by validation (one job, warm-started)",
         DISTRIBUTED_SDCA + ("l1inf",), [
            (("--lam-grid",), dict(metavar="LO:HI:COUNT", type=log_grid_type("--lam-grid"), methods=DISTRIBUTED_SDCA,
                                   help="a log-spaced grid of lam, e.g. 1e-5:1:13 (instead of --lam)")),
            param("--validation-fraction"),
            param("--cv", metavar="K"),
            param("--metric"),
            (("--no-warm-start",), dict(action="store_true", methods=DISTRIBUTED_SDCA,
                                        help="solve every grid point from zero (for comparisons)")),
            (("--selection-tol",), dict(metavar="T", type=float, methods=DISTRIBUTED_SDCA,
                                        help="the fold fits stop at relative gap T (W-steps and joint gap, when "
                                             "looser than --tol / --outer-tol); the refit still runs to --tol "
                                             "(default: 100 x --tol, at most 1e-3; 0: at --tol, the exhaustive "
                                             "path)")),
            (("--path-patience",), dict(metavar="K", type=int, methods=DISTRIBUTED_SDCA,
                                        help="stop the rest of the grid once a fold's validation score fell K "
                                             "points in a row past its best (default 3; 0: never, the exhaustive "
                                             "path)")),
        ]),
        ("aggregation of the workers' local steps", DISTRIBUTED_SDCA, [
            param("--aggregation"),
            param("--eta"),
            param("--exchange"),
            param("--local-solver"),
        ]),
        ("task graph", ("graph",), [
            (("--graph",), dict(help="a task graph (cycle, chain, complete, star, 'grid RxC', empty) or an "
                                     "edge-list CSV (task_a,task_b,weight) (required)")),
            (("--alpha",), dict(type=number_list_type("--alpha", Interval(float)), default=2.0 ** -8,
                                help="diagonal alpha of L + alpha I, or a comma-separated grid chosen by validation "
                                     "(at one --lam)")),
            (("--unnormalized",), dict(action="store_true", help="keep (L + alpha I)^-1 without unit diagonal")),
        ]),
        ("l1,inf ball", ("l1inf",), [
            param("--radius", default=None),
            (("--path",), dict(metavar="C1,C2,...", help="a regularization path, each radius warm-started from "
                                                         "the previous solution")),
            param("--projection"),
            param("--eta0"),
            param("--intercept-eta0"),
        ]),
        ("online rule", ("online",), [
            param("--update"),
            param("--norm"),
            param("--r"),
            param("--p", type=float),                  # p >= 1 is checked by the online rule
            param("--C", type=None, default="1.0"),    # a number or 'auto', read by online_config
            param("--R"),
            (("--code",), dict(help="an output code over a single-label stream's classes: auto (the default "
                                    "code for C classes), one-vs-rest, random:K[:SEED], exhaustive (3..10 "
                                    "classes) or a .npy matrix")),
            param("--decoder"),
            param("--scale"),
            param("--block-rounds"),
            param("--chunk-rounds"),
        ]),
        ("checkpoints", CHECKPOINTED, [
            (("--checkpoint",), dict(metavar="PATH", help="checkpoint file (none: OUT.checkpoint.h5; always "
                                                          "written when SIGTERM, SIGUSR1 or SIGINT arrives)")),
            (("--checkpoint-every",), dict(type=number_type("--checkpoint-every", NONNEGATIVE_INT), default=0,
                                           metavar="N", help="also write a checkpoint every N rounds (0: never)")),
            (("--checkpoint-seconds",), dict(type=number_type("--checkpoint-seconds", POSITIVE), default=None,
                                             metavar="S", help="also write a checkpoint every S seconds")),
            (("--resume",), dict(action="store_true", help="continue from the checkpoint")),
        ]),
        ("failure", TRAIN_METHODS, [
            (("--watchdog",), dict(type=watchdog_seconds, default=WATCHDOG_SECONDS, metavar="S",
                                   help="under mpiexec, end the job (exit 1, naming the rank) when rank 0 has waited "
                                        "in one collective longer than S seconds, and 10 times the slowest wait so "
                                        "far, for a rank that does not answer (stopped or wedged); 0: never")),
        ]),
        ("logging", TRAIN_METHODS, [
            (("--quiet",), dict(action="store_true",
                                 help="same as --log-level error (a run that did not converge still says so)")),
            (("--log-level",), dict(choices=("debug", "info", "warning", "error"), default="info",
                                    help="info: progress and summary; warning: summary only; error: errors only")),
            (("--progress-seconds",), dict(type=float, default=DEFAULT_SECONDS, metavar="S",
                                           help="in a log (not a terminal) print at most one progress line every "
                                                "S seconds, plus the last line of every outer step; 0 prints every "
                                                "round")),
        ]),
    ]


def train_options_of(method):
    """{option string: (flags, argparse keywords)} of the options ``train METHOD`` takes."""
    out = {}
    for _, methods, options in train_option_groups():
        for flags, kw in options:
            if method in kw.get("methods", methods) and method in methods:
                own = {k: v for k, v in kw.items() if k not in ("methods", "help_for")}
                own["help"] = kw.get("help_for", {}).get(method, kw.get("help"))
                out[flags[0]] = (flags, own)
    return out



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
    # when the command started: the whole job's seconds (reading, a CV grid, the refit, test metrics) beside the
    # training run's own (a grid's refit only), in the summary, the result file (/timing) and the report
    started: float = field(default_factory=time.perf_counter)


def timing(run, result) -> dict:
    """``/timing`` of a result file: ``job_seconds`` (this command, start to result), ``train_seconds`` (the
    training run's clock, its history's last ``seconds``: a grid's refit, with the time before a resume) and, for a
    grid, ``selection_seconds``
    (its fold fits)."""
    import numpy as np
    clock = result.history.get("seconds") if isinstance(result.history, dict) else None
    # the history's clock is the training run's own (a grid's refit restarts it); the server's may have run
    # through the grid before the refit
    train = float(clock[-1]) if clock is not None and len(clock) else float(result.seconds)
    out = {"job_seconds": time.perf_counter() - run.started, "train_seconds": train}
    path = getattr(result, "path", None)
    if getattr(result, "selection", None) and isinstance(path, dict) and "seconds" in path:
        out["selection_seconds"] = float(np.sum(path["seconds"]))
    return out


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
        if (args.metric is not None or args.no_warm_start or args.selection_tol is not None
                or args.path_patience is not None):
            raise InputError("--metric, --no-warm-start, --selection-tol and --path-patience go with a lam grid "
                             "(--lam A,B,... or "
                             "--lam-grid) or --validation-fraction / --cv")
        return None
    if args.method not in DISTRIBUTED_SDCA:
        raise InputError(f"a lam grid is for train {', '.join(DISTRIBUTED_SDCA)}, not for train {args.method}")
    from .model_selection import Selection          # (only here: a single lam runs without the path's modules)
    return Selection(grid if isinstance(grid, list) else [grid], args.validation_fraction, args.cv, args.metric,
                     warm_start=not args.no_warm_start, name=name, tol=args.selection_tol,
                     **({} if args.path_patience is None else {"patience": args.path_patience})).validate(config.loss)


def radius_selection(args, config):
    """The radius of the ball from --path (or --radius) chosen by validation; None without a validation split."""
    from .model_selection import Selection
    if args.validation_fraction is None and args.cv is None:
        if args.metric is not None:
            raise InputError("--metric goes with --validation-fraction or --cv")
        return None
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
    """A task covariance from a result file (/model/Sigma), a .npy file, or a sparse precision ``Sigma^-1`` in a
    scipy.sparse .npz file (:func:`hpcmtl.task_graph.precision_covariance`: held sparse)."""
    import numpy as np

    from . import store
    if path is None:
        raise InputError("method 'fixed' needs --sigma RESULT.h5, --sigma SIGMA.npy or --sigma PRECISION.npz")
    if path.endswith((".npy", ".npz")) and not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if path.endswith(".npz"):
        import zipfile

        import scipy.sparse
        from .task_graph import precision_covariance
        try:
            Q = scipy.sparse.load_npz(path)
        except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as exc:
            raise InputError(f"{path}: not a scipy.sparse .npz precision (scipy.sparse.save_npz): {exc}") from None
        return precision_covariance(Q, what=path)
    if path.endswith(".npy"):
        try:
            Sigma = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:      # a pickle, a truncated or garbage file
            raise InputError(f"{path}: not a NumPy .npy array of numbers ({exc})") from None
        if not isinstance(Sigma, np.ndarray) or Sigma.dtype.kind not in "biuf" or Sigma.ndim != 2:
            raise InputError(f"{path}: --sigma must be a 2-D array of real numbers (m x m)")
        return Sigma
    from .covariance import model_sigma
    from .dmtrl.sigma import fixed_form
    Sigma = model_sigma(store.read_result(path)["model"], path)
    if Sigma is None:
        raise InputError(f"{path}: has no task covariance (model/Sigma): give --sigma a result of a method that "
                         f"learns one, a .npy file or a sparse precision .npz")
    # a graph kernel of many tasks stays sparse; a learned Sigma's factors stay factors from FACTORED_MIN_TASKS
    # tasks on, dense below (docs/many-tasks.md)
    return fixed_form(Sigma)


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
                        decoder=args.decoder, scale=args.scale, block_rounds=args.block_rounds,
                        chunk_rounds=args.chunk_rounds)


# ---------------------------------------------------------------------------
# training: the task file, the task covariance and the progress every task method opens, then each method's run
# ---------------------------------------------------------------------------
def fixed_sigma(run):
    """A fixed task covariance from --sigma where the config's relationship is fixed."""
    if getattr(run.config, "relationship", None) == "fixed":
        from .dmtrl import check_sigma
        sigma = read_sigma(run.args.sigma)
        try:                      # checked here, on every rank, so that the one-line error names the file
            run.sigma = check_sigma(sigma, run.source.n_tasks)
        except InputError as exc:
            raise InputError(f"{run.args.sigma}: {exc}") from None


def graph_sigma(run):
    """train graph: the task kernel of --graph at --alpha (a grid of alpha: one Sigma a point, ``run.sigma_of``)."""
    from .task_graph import graph_adjacency, graph_covariance
    args, source = run.args, run.source
    if args.graph is None:
        raise InputError("method 'graph' needs --graph (a topology name or an edge-list CSV)")
    adjacency = graph_adjacency(args.graph, source.names, sparse=True)     # O(m + edges), never m x m

    def sigma_of(alpha):          # dense below task_graph.SPARSE_GRAPH_MIN_TASKS, else held sparse (GraphSigma)
        return graph_covariance(adjacency, alpha, not args.unnormalized, source.names, what=f"graph '{args.graph}'")
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
    """The server's checkpoint policy (None on workers): a grid's (:class:`hpcmtl.checkpoint.PathCheckpointer`,
    the path's state with it) when a selection runs."""
    from .checkpoint import Checkpointer, PathCheckpointer
    args = run.args
    kind = PathCheckpointer if run.selection is not None else Checkpointer
    return (kind(run.checkpoint, args.checkpoint_every, args.checkpoint_seconds or 0.0, run.signals,
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
        checkpointer = checkpointer_of(run)
        resume = run.checkpoint if args.resume else None
        if run.selection is not None:               # the path checkpoints and resumes as a whole
            from .model_selection import train_path
            return closed(run, train_path(cluster, run.source, run.config, run.selection, run.test_source,
                                          sigma_fixed=run.sigma, progress=run.progress,
                                          warn=warn_line(args, run.progress),
                                          note=warn_line(args, run.progress, kind="path"), sigma_of=run.sigma_of,
                                          checkpointer=checkpointer, resume=resume))
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
        from .covariance import as_dense
        sigma = None if run.sigma is None else as_dense(run.sigma)      # the baselines' arithmetic is dense
        result = getattr(baselines, solve_name)(source, run.config, sigma, progress=run.progress,
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
                                             note=warn_line(args, run.progress, kind="path"),
                                             checkpointer=checkpointer, resume=resume))
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
    source = run.source = StreamTasks(args.stream, config.code, scaling=config.scale)
    if args.test:                                    # checked on every rank before any work, evaluated at the end
        probe = open_test_stream(args.test, {"W": np.zeros((source.n_features, source.n_tasks)),
                                                "task_names": source.names, "code": source.code,
                                                "class_names": source.class_names}, args.stream)
        probe.close()
    config.validate(source.n_tasks, source.max_row_norm(), source.typical)   # R, C settle here
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
                                                   "code": result.code, "class_names": source.class_names,
                                                   "scaling": source.scaling}, args.stream)
        try:
            result.test = evaluate_stream(result.W, test_source, chunk=config.chunk_rounds, decoder=config.decoder)
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
    groups = dict(groups, timing=timing(run, result))
    model_extra = groups.pop("model", None)
    store.write_result(args.out, result.W, sigma, result.history, config_out, run.cluster.size, run.version,
                       task_names=result.task_names, extra=model_extra, test=result.test,
                       ranks=result.extra or None, groups=groups, force=args.force,
                       intercept=getattr(result, "intercept", None))
    if args.log_level != "error":
        print(summary_table(args, result, summary, groups["timing"]))
    return result


def summary_table(args, result, headline, times=None):
    """The final summary: what ran, how far it got, what it cost, how it tests."""
    rows = [("method", result.config.get("method")), ("status", headline), ("rounds", result.n_rounds)]
    if times is None:
        rows.append(("seconds", f"{result.seconds:.2f}"))
    else:                               # a grid's rounds and seconds are its refit's: the job's said beside them
        grid = "selection_seconds" in times
        rows += [("seconds", f"{times['train_seconds']:.2f}" + (" (the refit at the chosen value)" if grid else "")),
                 ("job seconds", f"{times['job_seconds']:.2f} (the whole command"
                  + (f"; the grid's fold fits {times['selection_seconds']:.2f})" if grid else ")"))]
    rows += [("MB moved", f"{result.bytes_moved / 1e6:.3f}")]
    if result.test:
        rows += [(f"test {k}", f"{v:.6g}" if isinstance(v, float) else v) for k, v in result.test["summary"].items()]
    rows.append(("result file", args.out))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def write_sdca(run, result):
    """The result of a dual coordinate ascent method: the model, its W-steps, the path of a grid, the warnings."""
    from .dmtrl.outer import outer_advice
    config = run.config
    h, steps = result.history, result.wsteps
    n_bad = int(len(steps["converged"]) - steps["converged"].sum()) if len(steps.get("converged", [])) else 0
    joint = steps.get("joint_rel_gap")
    joint_text = (f"; joint relative gap {float(joint[-1]):.3e} (--outer-tol {config.outer_tol:g}) after "
                  f"{len(joint)} W-steps" if joint is not None and len(joint) else "")
    if result.converged:
        summary = f"converged: every W-step certified, relative gap {h['rel_gap'][-1]:.3e}" + (
            joint_text.replace("; joint", "; the learned-Sigma optimum certified: joint") if joint_text else "")
    else:
        reasons = []
        if n_bad:
            reasons.append(f"{n_bad} of {len(steps['converged'])} W-steps reached max rounds (worst relative gap "
                           f"{float(steps['rel_gap'].max()):.3e} > tol {config.tol:g})")
        if joint is not None and len(joint) and not float(joint[-1]) <= config.outer_tol:
            reasons.append(f"the joint relative gap {float(joint[-1]):.3e} > --outer-tol {config.outer_tol:g}")
        summary = (f"NOT converged: {'; '.join(reasons) or 'see the warnings'}; "
                   f"last W-step relative gap {h['rel_gap'][-1]:.3e}")
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
        if n_bad:
            print(f"hpcmtl: warning: {n_bad} of {len(steps['converged'])} W-steps ended unconverged (worst relative "
                  f"gap {float(steps['rel_gap'].max()):.3e} > tol {config.tol:g}): the model is not certified; "
                  f"raise --max-rounds, or rescale the features where a W-step's warning says its gap stalled",
                  file=sys.stderr, flush=True)
        if joint is not None and len(joint) and not float(joint[-1]) <= config.outer_tol:
            # fewer W-steps than --outer: the loop ended because the joint gap stopped shrinking
            print(f"hpcmtl: warning: the outer loop ended with the joint relative gap {float(joint[-1]):.3e} > "
                  f"--outer-tol {config.outer_tol:g}: W is not certified as the optimum of the learned-Sigma "
                  f"problem; {outer_advice(float(joint[-1]), len(joint) < config.outer)}", file=sys.stderr,
                  flush=True)
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
    if source.scaling.factors is not None:                   # evaluate scales a test stream with the same factors
        model["feature_scale"] = source.scaling.factors
    config_out = dict(result.config, n_features=source.n_features, stream=os.path.abspath(args.stream),
                      test=os.path.abspath(args.test) if args.test else None, summary=s)
    times = timing(run, result)
    store.write_result(args.out, result.W, None, result.history, config_out, run.cluster.size, run.version,
                       task_names=result.task_names, extra=model, test=result.test, ranks=result.extra,
                       groups={"trace": result.trace, "timing": times}, force=args.force)
    if args.log_level != "error":
        print(summary_table(args, result, headline, times))
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

if tuple(METHODS) != TRAIN_METHODS:             # one row a method, in the command line's order
    raise RuntimeError(f"hpcmtl.methods.METHODS {tuple(METHODS)} differ from TRAIN_METHODS {TRAIN_METHODS}")


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
