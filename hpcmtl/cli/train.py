"""``hpcmtl train METHOD``: one sub-parser a method, built from one option table, and the training runs."""
from __future__ import annotations

import argparse
import os
import sys

from .. import __version__
from ..errors import InputError
from ..metrics import evaluate_arrays
from ..params import (CHECKPOINTED, DISTRIBUTED_SDCA, METHOD_DEFAULTS, METHOD_HELP,  # noqa: F401
                      SDCA_METHODS, TASK_METHODS, TRAIN_METHODS, train_option_groups, train_options_of)
from . import Parser, _all_options
from .evaluate import open_test_stream


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends every option's line with its default (or 'required')."""

    def _get_help_string(self, action):
        text = action.help or ""
        if not action.option_strings or "%(default)" in text or action.default is argparse.SUPPRESS:
            return text
        if action.required:
            return text if "(required)" in text else text + " (required)"
        if isinstance(action, argparse._StoreTrueAction):
            return text + " (default: off)"
        if action.default is None:
            return text if "(required)" in text or "(none:" in text else text + " (default: none)"
        return text + " (default: %(default)s)"


class MethodParser(Parser):
    """``hpcmtl train METHOD``: an option of another method is an error that names the methods taking it."""

    method = None

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error("unrecognized arguments: " + " ".join(extras))
        return namespace, extras

    def hint(self, message):
        if self.method is not None and "unrecognized arguments" in message:
            own = _all_options(self)
            for word in message.split(":", 1)[1].split():
                name = word.split("=")[0]
                takers = [m for m in TRAIN_METHODS if name in train_options_of(m)]
                if name.startswith("--") and takers and name not in own:
                    return (f" '{name}' is an option of train {', '.join(takers)}, not of train {self.method} "
                            f"(hpcmtl train {self.method} --help lists its options).")
        return super().hint(message)


def add_train_methods(train_parser):
    """One sub-parser a method with the option groups it reads; options of other methods default as before."""
    methods = train_parser.add_subparsers(dest="method", required=True, parser_class=MethodParser,
                                          metavar="METHOD")
    everything = {}
    for name in TRAIN_METHODS:
        everything.update(train_options_of(name))
    for name in TRAIN_METHODS:
        mp = methods.add_parser(name, help=METHOD_HELP[name], description=f"hpcmtl train {name}: "
                                f"{METHOD_HELP[name]}", formatter_class=DefaultsFormatter)
        mp.method = name
        own = train_options_of(name)
        for title, group_methods, options in train_option_groups():
            flags_here = [flags for flags, kw in options if flags[0] in own]
            if not flags_here:
                continue
            group = mp.add_argument_group(title)
            for flags in flags_here:
                group.add_argument(*flags, **own[flags[0]][1])
        mp.set_defaults(**METHOD_DEFAULTS.get(name, {}))
        # the namespace keeps every attribute the commands read: another method's option is its default
        foreign = {}
        for option, (flags, kw) in everything.items():
            if option not in own:
                off = False if kw.get("action") == "store_true" else None
                foreign[option.lstrip("-").replace("-", "_")] = kw.get("default", off)
        mp.set_defaults(**foreign)


def train_method_first(argv):
    """``train [OPTIONS] METHOD ...`` as ``train METHOD [OPTIONS] ...``: the one parser before accepted both orders."""
    if len(argv) < 3 or argv[0] != "train" or not argv[1].startswith("-") or argv[1] in ("-h", "--help"):
        return argv
    takes_value = {}
    for name in TRAIN_METHODS:
        for option, (flags, kw) in train_options_of(name).items():
            takes_value[option] = kw.get("action") != "store_true"
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv
        if not word.startswith("-"):
            return ["train", word] + argv[1:i] + argv[i + 1:]
        i += 2 if takes_value.get(word, False) and "=" not in word else 1
    return argv


def add_parser(sub):
    """The ``train`` command: one sub-parser a method."""
    # -- train: one sub-parser a method, each with only the options that method reads --------------
    tr = sub.add_parser("train", help="train a model (distributed under mpiexec)",
                        description="hpcmtl train METHOD --help lists the options of one method")
    add_train_methods(tr)


def config_from_args(args):
    from ..dmtrl import DMTRLConfig
    if args.method == "l1inf":
        from ..joint_sparse import JointSparseConfig
        if args.radius is None and args.path is None:
            raise InputError("method 'l1inf' needs --radius C (or --path C1,C2,...)")
        return JointSparseConfig(radius=args.radius or 1.0, loss=args.loss, projection=args.projection,
                                 eta0=args.eta0, intercept_eta0=args.intercept_eta0,
                                 max_rounds=args.max_rounds or 200, gamma=args.gamma,
                                 seed=args.seed, rff_dim=args.rff_dim, rff_gamma=args.rff_gamma,
                                 split_tasks=args.split_tasks, fit_intercept=not args.no_intercept,
                                 positive_label=args.positive_label).validate()
    lam = args.lam_grid if getattr(args, "lam_grid", None) is not None else args.lam
    if lam is None:
        raise InputError(f"method '{args.method}' needs --lam")
    lam = max(lam) if isinstance(lam, list) else lam       # a grid: validated here, solved by train_path
    relationship = {"dmtrl": "learned", "stl": "identity", "fixed": "fixed", "graph": "fixed", "ssdca": "learned",
                    "mtrl-central": "learned"}[args.method]
    if args.sigma is not None and args.method in ("ssdca", "mtrl-central"):
        relationship = "fixed"                      # the centralized baselines under a given Sigma
    return DMTRLConfig(loss=args.loss, lam=lam, gamma=args.gamma, tol=args.tol, max_rounds=args.max_rounds or 500,
                       outer=args.outer, outer_tol=args.outer_tol, local_iters=args.local_iters, seed=args.seed,
                       local_steps=args.local_steps, eta=args.eta, gap_every=args.gap_every, relationship=relationship, rff_dim=args.rff_dim,
                       aggregation=args.aggregation, exchange=args.exchange, local_solver=args.local_solver,
                       rff_gamma=args.rff_gamma, split_tasks=args.split_tasks, shrinking=not args.no_shrinking,
                       float32=getattr(args, "float32", False),
                       fit_intercept=not args.no_intercept, intercept_scaling=args.intercept_scaling,
                       method=args.method, positive_label=args.positive_label).validate()


def selection_from_args(args, config):
    """A :class:`hpcmtl.model_selection.Selection` when a lam grid or a validation split is asked for, else None
    (validated here, identically on every rank)."""
    from ..model_selection import Selection
    if args.method == "l1inf":                       # the radius of the ball, from --path (or --radius)
        if args.validation_fraction is None and args.cv is None:
            if args.metric is not None:
                raise InputError("--metric goes with --validation-fraction or --cv")
            return None
        if args.resume or args.checkpoint_every or args.checkpoint_seconds:
            raise InputError("checkpoints are for a radius path without validation, not with --validation-fraction "
                             "or --cv")
        grid = parse_radii(args.path) if args.path else [args.radius]
        return Selection(grid, args.validation_fraction, args.cv, args.metric, name="radius").validate(config.loss)
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


def read_sigma(path):
    """A task covariance from a result file (/model/Sigma) or a .npy file."""
    import numpy as np

    from .. import store
    if path is None:
        raise InputError("method 'fixed' needs --sigma RESULT.h5 or --sigma SIGMA.npy")
    if path.endswith(".npy"):
        if not os.path.exists(path):
            raise InputError(f"{path}: no such file")
        return np.load(path, allow_pickle=False)
    return store.read_result(path)["model"]["Sigma"]


def online_config(args):
    from ..online import OnlineConfig
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


def check_inputs(args):
    """--train for the task-dataset methods, --stream for online (one-line errors)."""
    if args.method == "online":
        if args.stream is None:
            raise InputError("method 'online' needs --stream STREAM.h5")
        if args.train is not None:
            raise InputError("method 'online' reads --stream, not --train")
    elif args.train is None:
        raise InputError(f"method '{args.method}' needs --train TRAIN.h5")


def _existing_file(path):
    return path if path is not None and os.path.isfile(path) else None


def train_paths(args, checkpoint):
    """(outputs, inputs) of ``hpcmtl train`` for :func:`hpcmtl.store.check_outputs`."""
    inputs = [("--train", args.train), ("--stream", args.stream), ("--test", args.test),
              ("--sigma", _existing_file(args.sigma)), ("--graph", _existing_file(args.graph)),
              ("--code", _existing_file(args.code))]
    outputs = [("--out", args.out, args.force), ("--checkpoint" if args.checkpoint else "checkpoint", checkpoint, True)]
    return outputs, inputs


def cmd_train_online(args, cluster, signals, checkpoint):
    import numpy as np

    from ..checkpoint import Checkpointer
    from ..online import StreamTasks, evaluate_stream, train
    config = online_config(args)
    source = StreamTasks(args.stream, config.code)
    if args.test:                                    # checked on every rank before any work, evaluated at the end
        probe = open_test_stream(args.test, {"W": np.zeros((source.n_features, source.n_tasks)),
                                                "task_names": source.names, "code": source.code,
                                                "class_names": source.class_names}, args.stream)
        probe.close()
    config.validate(source.n_tasks, source.stream.max_row_norm(), source.typical)   # R, C settle here
    progress = None
    if cluster.is_server:
        from ..progress import Progress
        progress = Progress(args.log_level, args.progress_seconds, max_rounds=source.n_rounds)
    checkpointer = Checkpointer(checkpoint, args.checkpoint_every, args.checkpoint_seconds or 0.0, signals,
                                config.to_dict(), source) if cluster.is_server else None
    result = train(cluster, source, config, progress=progress, checkpointer=checkpointer,
                   resume=checkpoint if args.resume else None)
    progress and progress.close()
    if result is None:
        return None
    if args.test:
        test_source = open_test_stream(args.test, {"W": result.W, "task_names": result.task_names,
                                                   "code": result.code, "class_names": source.class_names}, args.stream)
        try:
            result.test = evaluate_stream(result.W, test_source, chunk=config.chunk_rounds)
        finally:
            test_source.close()
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
    from .. import store
    store.write_result(args.out, result.W, None, result.history, config_out, cluster.size, __version__,
                       task_names=result.task_names, extra=model, test=result.test, ranks=result.extra,
                       groups={"trace": result.trace}, force=args.force)
    if args.log_level != "error":
        print(summary_table(args, result, headline))
    return result


def cmd_train(args, cluster):
    from .. import store
    from ..baselines import mtrl_central, ssdca
    from ..checkpoint import Checkpointer
    from ..cluster import SignalFlag
    from ..dmtrl import train
    signals = SignalFlag().install()                # before anything slow: no rank dies on SIGTERM
    check_inputs(args)
    if args.quiet:
        args.log_level = "error"
    config = config_from_args(args) if args.method != "online" else None   # identical on every rank
    selection = selection_from_args(args, config) if args.method in SDCA_METHODS + ("l1inf",) else None
    checkpoint = args.checkpoint or args.out + ".checkpoint.h5"
    error = None
    try:                                            # before any work; every rank fails together
        store.check_outputs(*train_paths(args, checkpoint))
        if args.resume and not os.path.exists(checkpoint):
            raise InputError(f"{checkpoint}: no checkpoint to resume from")
    except InputError as exc:
        error = str(exc)
    cluster.agree(error)
    if args.method == "online":
        return cmd_train_online(args, cluster, signals, checkpoint)
    source = store.TaskFile(args.train)
    test_source = store.TaskFile(args.test) if args.test else None
    sigma = None
    if args.method == "graph":
        from ..task_graph import graph_adjacency, task_kernel
        if args.graph is None:
            raise InputError("method 'graph' needs --graph (a topology name or an edge-list CSV)")
        adjacency = graph_adjacency(args.graph, source.names)

        def sigma_of(alpha):
            return task_kernel(adjacency, alpha, not args.unnormalized, source.names)
        sigma = None if isinstance(args.alpha, list) else sigma_of(args.alpha)
    elif getattr(config, "relationship", None) == "fixed":
        sigma = read_sigma(args.sigma)
    if args.quiet:
        args.log_level = "error"
    progress = None
    if cluster.is_server:
        from ..progress import Progress
        progress = Progress(args.log_level, args.progress_seconds, tol=getattr(config, "tol", None),
                            max_rounds=None if getattr(config, "tol", None) else config.max_rounds)
    if args.method in ("ssdca", "mtrl-central"):
        if args.resume or args.checkpoint_every or args.checkpoint_seconds:
            raise InputError(f"checkpoints are for the distributed methods, not '{args.method}'")
        if not cluster.is_server:
            return None                             # centralized baselines run on rank 0 only
        result = (ssdca if args.method == "ssdca" else mtrl_central)(source, config, sigma, progress=progress,
                                                                     warn=warn_line(args))
        if test_source is not None:
            result.test = evaluate_arrays(result.W, dict(result.config, n_features=source.n_features), test_source,
                                          result.task_names, intercept=result.intercept)
    elif selection is not None and args.method != "l1inf":
        from ..model_selection import train_path
        result = train_path(cluster, source, config, selection, test_source, sigma_fixed=sigma, progress=progress,
                            warn=warn_line(args, progress), note=warn_line(args, progress, kind="path"),
                            sigma_of=sigma_of if args.method == "graph" else None)
    else:
        checkpointer = Checkpointer(checkpoint, args.checkpoint_every, args.checkpoint_seconds or 0.0, signals,
                                    config.to_dict(), source, sigma) if cluster.is_server else None
        resume = checkpoint if args.resume else None
        if selection is not None:                       # l1inf: the radius chosen by validation
            from ..model_selection import train_radius_path
            result = train_radius_path(cluster, source, config, selection, test_source, progress=progress,
                                       note=warn_line(args, progress, kind="path"))
            progress and progress.close()
            return write_l1inf_result(args, cluster, source, result)
        if args.method == "l1inf":
            from ..joint_sparse import train as train_l1inf
            radii = parse_radii(args.path) if args.path else None
            result = train_l1inf(cluster, source, config, test_source, progress=progress,
                                 checkpointer=checkpointer, resume=resume, radii=radii)
            progress and progress.close()
            return write_l1inf_result(args, cluster, source, result)
        result = train(cluster, source, config, test_source, sigma_fixed=sigma, progress=progress,
                       checkpointer=checkpointer, resume=resume, warn=warn_line(args, progress))
    progress and progress.close()
    if result is None:
        return None
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
    result = save_result(args, cluster, source, result, result.Sigma,
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


def save_result(args, cluster, source, result, sigma, groups, summary):
    """Write the result file (rank 0) and print a summary table unless --log-level error."""
    from .. import store
    config_out = dict(result.config, n_features=source.n_features, train=os.path.abspath(args.train),
                      test=os.path.abspath(args.test) if args.test else None)
    groups = dict(groups)
    model_extra = groups.pop("model", None)
    store.write_result(args.out, result.W, sigma, result.history, config_out, cluster.size, __version__,
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


def parse_radii(text):
    try:
        radii = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"--path must be comma-separated numbers, got {text!r}") from None
    if not radii or any(not (r > 0) for r in radii):
        raise InputError(f"--path radii must be > 0, got {text!r}")
    return radii


def write_l1inf_result(args, cluster, source, result):
    if result is None:
        return None
    path = dict(result.path)
    selection = getattr(result, "selection", None)
    selected = int(path["refit_selected"][-1] if selection else path["selected"][-1])
    summary = (f"{result.config['projection']} ball: best objective {result.history['best_objective'][-1]:.6g}, "
               f"{selected} of {result.W.shape[0]} features selected")
    if selection:
        summary += f"; radius {selection['chosen_radius']:.4g} chosen by validation {selection['metric']}"
    result = save_result(args, cluster, source, result, None, {"path": path}, summary)
    for text in (selection["warnings"] if selection else ()):          # at every --log-level
        print(f"hpcmtl: warning: {text}", file=sys.stderr, flush=True)
    return result
