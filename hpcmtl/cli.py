"""The ``hpcmtl`` command: data | train | evaluate | report | jobs | demo.

``hpcmtl train ...`` runs serially; ``mpiexec -n P hpcmtl train ...`` (or
``srun``) runs the same command distributed: rank 0 is the server, ranks
1..P-1 the workers.  Bad input ends every rank with one line and exit code 2.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import sys

from . import __version__
from .errors import InputError
from .progress import DEFAULT_SECONDS

TRAIN_METHODS = ("dmtrl", "stl", "fixed", "graph", "ssdca", "mtrl-central", "l1inf", "online")
SYNTH_NAMES = ("dmtrl1", "dmtrl2", "joint-sparse", "seasonal", "multilabel-stream", "mnist-scale", "mds-scale")


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors, exit code 2, 'did you mean' and no abbreviations."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        from .cluster import launcher_rank
        if launcher_rank() == 0:              # one line per job, not one per rank
            print(f"hpcmtl: error: {self.prog}: {message}.{self.hint(message)}".replace("..", "."), file=sys.stderr)
        sys.exit(2)

    def hint(self, message):
        """' Did you mean ...?' for a misspelt option or choice (empty when nothing is close)."""
        hint = ""
        if "unrecognized arguments" in message:
            options = _all_options(self)
            for word in message.split(":", 1)[1].split():
                match = difflib.get_close_matches(word.split("=")[0], options, n=1, cutoff=0.6)
                if match:
                    hint = f" Did you mean '{match[0]}'?"
                    break
        elif "invalid choice" in message:
            import re
            m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
            if m:
                choices = [c.strip(" '\"") for c in m.group(2).split(",")]
                match = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.5)
                if match:
                    hint = f" Did you mean '{match[0]}'?"
        return hint


def _all_options(parser):
    """Option strings of a parser and of all its sub-commands."""
    out = []
    for action in parser._actions:
        out += action.option_strings
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _all_options(sub)
    return sorted(set(out))


def _positive_float(name):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{name} must be > 0, got {text}")
        return value
    return parse


def _count(name, minimum=1):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be >= {minimum}, got {value}")
        return value
    return parse


def build_parser():  # noqa: C901 - one flat description of the command line
    p = Parser(prog="hpcmtl", description="MPI-native multi-task learning", allow_abbrev=False)
    p.add_argument("--version", action="version", version=f"hpcmtl {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    # abbreviations are off everywhere: a misspelt option in a job script is an error, never a guess

    # -- data ---------------------------------------------------------------
    data = sub.add_parser("data", help="convert, split, inspect and generate task datasets")
    dsub = data.add_subparsers(dest="data_command", required=True, parser_class=Parser)
    conv = dsub.add_parser("convert", help="convert a public format into a task dataset or a stream")
    conv.add_argument("--format", required=True,
                      choices=("malsar", "svmlight", "csv", "npz", "mnist", "mds", "reuters", "tasks"),
                      help="tasks: an hpcmtl task dataset (to relabel it, or with --stream)")
    conv.add_argument("inputs", nargs="+", metavar="IN")
    conv.add_argument("output", metavar="OUT.h5")
    conv.add_argument("--test-out", metavar="TEST.h5", help="mnist/reuters: also write the test split")
    conv.add_argument("--stream", action="store_true",
                      help="write an online stream (train online --stream): a task dataset gives one label column "
                           "a task; a file without task ids gives one column a class or a label")
    conv.add_argument("--shuffle", action="store_true", help="--stream: rows in a random order drawn from --seed")
    conv.add_argument("--positive-label", metavar="L", default=None,
                      help="labels equal to L become +1, all others -1 (a number or text)")
    conv.add_argument("--labels", metavar="MAP", default=None,
                      help="a full label mapping LABEL:VALUE,... such as 0:-1,1:1 or spam:1,ham:-1 (write "
                           "--labels=-1:1,... when it starts with a minus); an unmapped label is an error")
    conv.add_argument("--features", metavar="COLS", default=None,
                      help="csv: the feature columns: names or 0-based indices, ranges 3-7 or x1:x9, comma-separated")
    conv.add_argument("--drop", metavar="COLS", default=None,
                      help="csv: columns that are not features (as --features)")
    conv.add_argument("--online", action="store_true", help="reuters --stream: one stream of every ModApte document "
                      "in original order, hashed log-count features (paper 004)")
    conv.add_argument("--single-label", type=_count("--single-label"), default=None, metavar="N",
                      help="reuters --online: only documents whose one topic is among the N most frequent")
    conv.add_argument("--min-docs", type=_count("--min-docs"), default=100, help="reuters: minimum training documents of a topic")
    conv.add_argument("--n-features", type=_count("--n-features"), default=None,
                      help="svmlight: number of features; mds: hashing dimension (10000); reuters: vocabulary size (20000)")
    conv.add_argument("--task-column", default=None,
                      help="csv: the task column (default 'task'; with --stream a file without it is single-label)")
    conv.add_argument("--label-column", default="y", help="csv: the label column")
    conv.add_argument("--seed", type=_count("--seed", 0), default=0,
                      help="mnist: the negatives drawn; --shuffle: the order of the rounds")
    conv.add_argument("--force", action="store_true", help="overwrite existing outputs")

    split = dsub.add_parser("split", help="split every task into train and test (stratified for +-1 labels)")
    split.add_argument("input", metavar="IN.h5")
    split.add_argument("train", metavar="TRAIN.h5")
    split.add_argument("test", metavar="TEST.h5")
    split.add_argument("--test-fraction", type=_positive_float("--test-fraction"), default=0.25)
    split.add_argument("--seed", type=_count("--seed", 0), default=0)
    split.add_argument("--force", action="store_true")

    stdz = dsub.add_parser("standardize", help="scale features with statistics of the training file")
    stdz.add_argument("train", metavar="TRAIN.h5")
    stdz.add_argument("output", metavar="OUT_TRAIN.h5")
    stdz.add_argument("--test", nargs=2, metavar=("TEST.h5", "OUT_TEST.h5"), help="apply the same scaling to a test file")
    stdz.add_argument("--force", action="store_true")

    info = dsub.add_parser("info", help="tasks, sizes, nnz, label balance")
    info.add_argument("input", metavar="FILE.h5")
    info.add_argument("--json", action="store_true")

    insp = dsub.add_parser("inspect", help="what a .mat/.csv/.npz/.svm/.h5 file holds and how to convert it")
    insp.add_argument("input", metavar="FILE")
    insp.add_argument("--json", action="store_true", help="the same as one JSON object")

    synth = dsub.add_parser("synth", help="generate the papers' synthetic data (with ground truth)")
    synth.add_argument("name", choices=SYNTH_NAMES)
    synth.add_argument("output", metavar="OUT.h5")
    synth.add_argument("--test", metavar="OUT_TEST.h5")
    synth.add_argument("--seed", type=_count("--seed", 0), default=0)
    synth.add_argument("--scale", type=_positive_float("--scale"), default=1.0,
                       help="size multiplier (mnist-scale / mds-scale: 1 = MNIST- / MDS-sized)")
    synth.add_argument("--n-train", type=_count("--n-train"), default=100, help="joint-sparse: examples per task")
    synth.add_argument("--force", action="store_true")

    # -- train: one sub-parser a method, each with only the options that method reads --------------
    tr = sub.add_parser("train", help="train a model (distributed under mpiexec)",
                        description="hpcmtl train METHOD --help lists the options of one method")
    add_train_methods(tr)

    ev = sub.add_parser("evaluate", help="test metrics of a result file: per task, pooled_* and task_mean_*")
    ev.add_argument("result", metavar="RESULT.h5")
    ev.add_argument("test", metavar="TEST.h5", help="a task dataset, or a test stream for an online result")
    ev.add_argument("--json", action="store_true", help="one JSON object {tasks, summary} with the same names")

    rep = sub.add_parser("report", help="figures and a Markdown summary from result files")
    rep.add_argument("results", nargs="+", metavar="RESULT.h5")
    rep.add_argument("--out", required=True, metavar="DIR")
    rep.add_argument("--csv", action="store_true", help="also export each run's history as CSV into DIR")

    jobs = sub.add_parser("jobs", help="SLURM job scripts from templates")
    jsub = jobs.add_subparsers(dest="jobs_command", required=True, parser_class=Parser)
    jsub.add_parser("list", help="the templates and their parameters")
    render = jsub.add_parser("render", help="fill a template (values are shell-quoted)")
    render.add_argument("template")
    render.add_argument("--set", action="append", metavar="KEY=VALUE", help="a parameter value (repeatable)")
    render.add_argument("--out", metavar="FILE", help="write here instead of standard output")

    demo = sub.add_parser("demo", help="Synthetic 1 under mpiexec -n 5: STL vs learned task relationships")
    demo.add_argument("--out", default="demo-output")
    demo.add_argument("--ranks", type=_count("--ranks"), default=5)
    return p


# ---------------------------------------------------------------------------
# train: every option defined once, in groups; each method's sub-parser takes the groups it reads
# ---------------------------------------------------------------------------
TASK_METHODS = tuple(m for m in TRAIN_METHODS if m != "online")
SDCA_METHODS = ("dmtrl", "stl", "fixed", "graph", "ssdca", "mtrl-central")
DISTRIBUTED_SDCA = ("dmtrl", "stl", "fixed", "graph")
CHECKPOINTED = ("dmtrl", "stl", "fixed", "graph", "l1inf", "online")
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
METHOD_DEFAULTS = {m: {"max_rounds": 500} for m in SDCA_METHODS} | {"l1inf": {"max_rounds": 200}}


def train_option_groups():
    """(title, methods, [(flags, argparse keywords), ...]) of ``hpcmtl train``: each option once."""
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
            (("--loss",), dict(default="hinge", help="hinge, smoothed-hinge, squared or logistic")),
            (("--gamma",), dict(type=_positive_float("--gamma"), default=1.0, help="smoothed-hinge parameter")),
            (("--max-rounds",), dict(type=_count("--max-rounds"), default=None,
                                     help="rounds per W-step",
                                     help_for={"l1inf": "subgradient steps per radius"})),
            (("--seed",), dict(type=_count("--seed", 0), default=0, help="random numbers (coordinate orders, "
                                                                          "random features)")),
            (("--rff-dim",), dict(type=_count("--rff-dim", 0), default=0,
                                  help="random Fourier features (0: the features as they are)")),
            (("--rff-gamma",), dict(type=_positive_float("--rff-gamma"), default=1.0,
                                    help="RBF kernel width of the random features")),
            (("--split-tasks",), dict(action="store_true", methods=DISTRIBUTED_SDCA + ("l1inf",),
                                      help="split tasks larger than a worker's share")),
        ]),
        ("dual coordinate ascent", SDCA_METHODS, [
            (("--lam",), dict(type=_positive_float("--lam"), help="regularization (required)")),
            (("--tol",), dict(type=_positive_float("--tol"), default=1e-6, help="relative duality gap of a W-step")),
            (("--local-iters",), dict(type=_positive_float("--local-iters"), default=1.0,
                                      help="local SDCA steps per round, as a multiple of the block's rows")),
            (("--gap-every",), dict(type=_count("--gap-every"), default=1, help="compute the duality gap every N rounds")),
            (("--no-shrinking",), dict(action="store_true",
                                       help="visit every coordinate in every pass (hinge losses)")),
            (("--outer",), dict(type=_count("--outer"), default=10,
                                help="maximum Omega-steps + 1 (one W-step when Sigma is fixed)")),
            (("--outer-tol",), dict(type=float, default=1e-5,
                                    help="stop when the objective changes by at most this, relatively, "
                                         "between W-steps")),
            (("--sigma",), dict(metavar="SIGMA", methods=("fixed", "ssdca", "mtrl-central"),
                                help="the task covariance, from a result file (/model/Sigma) or a .npy file "
                                     "(required for fixed)")),
        ]),
        ("aggregation of the workers' local steps", DISTRIBUTED_SDCA, [
            (("--aggregation",), dict(choices=("qp", "adaptive", "line", "safe"), default="qp",
                                      help="'safe' is paper 001's Lemma 6.7 rho (its experiments as published); "
                                           "the others take optimistic local steps and the exact dual-maximizing "
                                           "step per task with momentum (qp; adaptive: also adapts each task's "
                                           "rho) or one common step (line). All keep the duality-gap certificate "
                                           "and dual ascent")),
            (("--eta",), dict(type=_positive_float("--eta"), default=1.0,
                              help="safe aggregation: the step applied to every local update (paper 001's eta); "
                                   "other aggregations: the largest step")),
        ]),
        ("task graph", ("graph",), [
            (("--graph",), dict(help="a task graph (cycle, chain, complete, star, 'grid RxC', empty) or an "
                                     "edge-list CSV (task_a,task_b,weight) (required)")),
            (("--alpha",), dict(type=float, default=2.0 ** -8, help="diagonal alpha of L + alpha I")),
            (("--unnormalized",), dict(action="store_true", help="keep (L + alpha I)^-1 without unit diagonal")),
        ]),
        ("l1,inf ball", ("l1inf",), [
            (("--radius",), dict(type=_positive_float("--radius"), help="the ball radius C (or --path)")),
            (("--path",), dict(metavar="C1,C2,...", help="a regularization path, each radius warm-started from "
                                                         "the previous solution")),
            (("--projection",), dict(choices=("l1inf", "l1", "l2"), default="l1inf",
                                     help="the constraint (l1 / l2: every task column in its own ball)")),
            (("--eta0",), dict(type=_positive_float("--eta0"), default=1.0, help="step size eta0 / sqrt(t)")),
        ]),
        ("online rule", ("online",), [
            (("--update",), dict(choices=("implicit", "perceptron", "infinite"), default="implicit",
                                 help="implicit (Sec. 5), finite-horizon Perceptron (Sec. 3) or infinite horizon "
                                      "(Sec. 4)")),
            (("--norm",), dict(choices=("linf", "l1", "l2", "rmax", "p"), default="rmax",
                               help="the global loss (rmax with --r; p with --p)")),
            (("--r",), dict(type=_count("--r"), default=1, help="r of the r-max norm (1 = L-inf, k = L1)")),
            (("--p",), dict(type=float, default=2.0, help="p of the p-norm")),
            (("--C",), dict(default="1.0", help="aggressiveness, or 'auto': the dual norm of a unit step "
                                                "1/mean||x||^2 on every active task (docs/math.md)")),
            (("--R",), dict(type=_positive_float("--R"), default=None,
                            help="bound on ||x|| for the infinite-horizon update (none: the stream's largest "
                                 "instance norm)")),
            (("--code",), dict(help="an output code over a single-label stream's classes: exhaustive, "
                                    "one-vs-rest, random:K[:SEED] or a .npy matrix")),
            (("--block-rounds",), dict(type=_count("--block-rounds"), default=64,
                                       help="rounds per exchange with the workers (same sequential algorithm "
                                            "at any value)")),
            (("--chunk-rounds",), dict(type=_count("--chunk-rounds"), default=4096,
                                       help="rounds read from the file at a time (bounds memory)")),
        ]),
        ("checkpoints", CHECKPOINTED, [
            (("--checkpoint",), dict(metavar="PATH", help="checkpoint file (none: OUT.checkpoint.h5; always "
                                                          "written when SIGTERM, SIGUSR1 or SIGINT arrives)")),
            (("--checkpoint-every",), dict(type=_count("--checkpoint-every", 0), default=0, metavar="N",
                                           help="also write a checkpoint every N rounds (0: never)")),
            (("--checkpoint-seconds",), dict(type=_positive_float("--checkpoint-seconds"), default=None,
                                             metavar="S", help="also write a checkpoint every S seconds")),
            (("--resume",), dict(action="store_true", help="continue from the checkpoint")),
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


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------
def cmd_data(args):
    from . import store
    store.check_outputs(*data_paths(args))          # before any work: no output may be an input
    if args.data_command == "info":
        stream = store.file_format(args.input) == store.STREAM_FORMAT
        with (store.StreamFile if stream else store.TaskFile)(args.input) as f:
            info = f.info()
        if args.json:
            print(json.dumps(info))
        elif stream:
            print(f"{info['path']}: stream of {info['n_rounds']} rounds, {info['n_features']} features, "
                  f"{info['n_labels']} labels, {info['nnz'] / max(1, info['n_rounds']):.1f} non-zeros a round, "
                  f"max ||x|| {info['max_row_norm']:.4g}, {info['positive_labels_per_round']:.2f} positive labels a round")
            for t in info["labels"]:
                print(f"  {t['name']:>20s}  +1 {t['positive']:<8d} -1 {t['negative']:<8d} dormant {t['dormant']}")
        else:
            print(f"{info['path']}: {info['n_tasks']} tasks, {info['n_features']} features, "
                  f"{info['storage']}, {info['n_samples']} samples, density {info['density']:.4g}")
            for t in info["tasks"]:
                extra = (f"positive {t['positive_fraction']:.3f}" if "positive_fraction" in t
                         else f"y mean {t['y_mean']:.4g} std {t['y_std']:.4g}")
                print(f"  {t['name']:>20s}  n={t['n_samples']:<8d} nnz={t['nnz']:<10d} {extra}")
        return 0
    if args.data_command == "split":
        return data_split(args)
    if args.data_command == "standardize":
        return data_standardize(args)
    if args.data_command == "synth":
        return data_synth(args)
    if args.data_command == "inspect":
        return data_inspect(args)
    return data_convert(args)


def data_split(args):
    import numpy as np
    from sklearn.model_selection import train_test_split

    from . import store
    if not args.test_fraction < 1:
        raise InputError(f"--test-fraction must be in (0, 1), got {args.test_fraction}")
    for path in (args.train, args.test):
        store.check_writable(path, args.force)
    with store.TaskFile(args.input) as tf:
        blocks = [tf.read_task(i) for i in range(tf.n_tasks)]
        truth, names = tf.read_truth(), tf.names
    train, test = ([], []), ([], [])
    for b in blocks:
        binary = np.all(np.abs(b.y) == 1) and min(np.sum(b.y == 1), np.sum(b.y == -1)) >= 2
        idx = np.arange(b.n_rows)
        if b.n_rows < 2:
            raise InputError(f"{args.input}: task '{b.name}': field 'y': {b.n_rows} sample(s) cannot be split")
        tr_idx, te_idx = train_test_split(idx, test_size=args.test_fraction, random_state=args.seed,
                                          stratify=b.y if binary else None)
        for part, rows in ((train, np.sort(tr_idx)), (test, np.sort(te_idx))):
            part[0].append(b.X[rows])
            part[1].append(b.y[rows])
    store.write_tasks(args.train, *train, names=names, truth=truth, force=args.force)
    store.write_tasks(args.test, *test, names=names, force=args.force)
    print(f"wrote {args.train} and {args.test}")
    return 0


def data_standardize(args):
    from . import converters, store
    pairs = [(args.train, args.output)] + ([tuple(args.test)] if args.test else [])
    for _, out in pairs:
        store.check_writable(out, args.force)
    with store.TaskFile(args.train) as tf:
        blocks = [tf.read_task(i) for i in range(tf.n_tasks)]
    mean, scale = converters.standardization(blocks)
    for src, out in pairs:
        with store.TaskFile(src) as tf:
            if tf.n_features != mean.size:
                raise InputError(f"{src}: has {tf.n_features} features, {args.train} has {mean.size}")
            blocks = [tf.read_task(i) for i in range(tf.n_tasks)]
            names, truth = tf.names, tf.read_truth()
        Xs = [converters.apply_standardization(b.X, mean, scale) for b in blocks]
        store.write_tasks(out, Xs, [b.y for b in blocks], names=names, truth=truth,
                          preprocessing={"mean": mean, "scale": scale}, force=args.force)
    print("wrote " + " and ".join(out for _, out in pairs))
    return 0


def data_synth(args):
    from . import store, synthetic
    outputs = [args.output] + ([args.test] if args.test else [])
    for path in outputs:
        store.check_writable(path, args.force)
    name = args.name
    if name in ("dmtrl1", "dmtrl2"):
        train, test, truth = synthetic.dmtrl(int(name[-1]), args.seed, args.scale)
    elif name == "joint-sparse":
        train, test, truth = synthetic.joint_sparse(args.seed, n_train=args.n_train)
    elif name in ("mnist-scale", "mds-scale"):
        train, test, truth = synthetic.scaled(name.split("-")[0], args.seed, args.scale)
    elif name == "seasonal":
        full, truth = synthetic.seasonal(args.seed, n_per_month=int(470 * args.scale))
        store.write_tasks(args.output, *full[:2], names=full[2], truth=truth, force=args.force)
        if args.test:
            raise InputError("seasonal: split it with 'hpcmtl data split' (the study needs train/validation/test)")
        print(f"wrote {args.output}")
        return 0
    else:  # multilabel-stream
        T = int(20000 * args.scale)
        n_test = T // 4 if args.test else 0
        X, Y, truth = synthetic.multilabel_stream(args.seed, n_rounds=T + n_test)
        store.write_stream(args.output, X[:T], Y[:T], truth=truth, force=args.force)
        if args.test:       # later rounds of the same stream
            store.write_stream(args.test, X[T:], Y[T:], truth=truth, force=args.force)
        print("wrote " + " and ".join(outputs))
        return 0
    store.write_tasks(args.output, *train[:2], names=train[2], truth=truth, force=args.force)
    if args.test:
        store.write_tasks(args.test, *test[:2], names=test[2], truth=truth, force=args.force)
    print("wrote " + " and ".join(outputs))
    return 0


def _convert_rule(args, binary=False):
    """The --positive-label / --labels rule of ``data convert`` (None when labels stay as read)."""
    from . import converters
    return converters.label_rule(args.positive_label, args.labels, binary)


def _convert_attrs(args, **extra):
    attrs = {"source_format": args.format}
    if args.positive_label is not None:
        attrs["label_map"] = f"--positive-label {args.positive_label}"
    elif args.labels is not None:
        attrs["label_map"] = f"--labels {args.labels}"
    attrs.update(extra)
    return attrs


def check_convert_options(args):
    """Options of ``data convert`` that do not fit the format (one line, before reading anything)."""
    fmt, inputs = args.format, args.inputs
    if fmt in ("csv", "reuters", "tasks") and len(inputs) != 1:
        raise InputError(f"{fmt} takes one input, got {len(inputs)}: {', '.join(inputs)}")
    if args.test_out and fmt not in ("mnist", "reuters"):
        raise InputError(f"--test-out is only for mnist (a directory) and reuters; split {fmt} data with 'hpcmtl data split'")
    if args.test_out and args.stream and fmt != "reuters":
        raise InputError("--test-out with --stream is only for reuters; split a stream's source first")
    if args.shuffle and not args.stream:
        raise InputError("--shuffle orders the rounds of a stream: add --stream (task datasets keep the file's order)")
    for option, value in (("--features", args.features), ("--drop", args.drop)):
        if value is not None and fmt != "csv":
            raise InputError(f"{option} selects CSV columns; --format {fmt} has none")


def data_convert(args):
    from . import converters, store
    outputs = [args.output] + ([args.test_out] if args.test_out else [])
    for path in outputs:
        store.check_writable(path, args.force)
    check_convert_options(args)
    fmt, inputs = args.format, args.inputs
    if args.stream:
        return reuters_stream(args) if fmt == "reuters" else data_stream(args)
    labels = _convert_rule(args)
    test = None
    attrs = _convert_attrs(args)
    if fmt == "malsar":
        train = converters.from_malsar(inputs, labels)
    elif fmt == "svmlight":
        train = converters.from_svmlight(inputs, args.n_features, labels)
    elif fmt == "csv":
        train = converters.from_csv(inputs[0], args.task_column or "task", args.label_column, args.features,
                                    args.drop, labels, report=print)
    elif fmt == "npz":
        train = converters.from_npz(inputs, labels)
    elif fmt == "tasks":
        train = converters.from_task_file(inputs[0], labels)
    elif fmt == "mnist":
        if len(inputs) == 1 and os.path.isdir(inputs[0]):
            d = inputs[0]
            train = converters.mnist_one_vs_all(os.path.join(d, "train-images-idx3-ubyte.gz"),
                                                os.path.join(d, "train-labels-idx1-ubyte.gz"), args.seed, labels)
            if args.test_out:
                test = converters.mnist_one_vs_all(os.path.join(d, "t10k-images-idx3-ubyte.gz"),
                                                   os.path.join(d, "t10k-labels-idx1-ubyte.gz"), args.seed, labels)
        else:
            train = converters.from_mnist(inputs, args.seed, labels)
    elif fmt == "mds":
        train = converters.from_mds(inputs, args.n_features or 10000, labels)
    else:  # reuters
        train, test = converters.from_reuters(inputs[0], args.min_docs, args.n_features or 20000, labels)
    if args.test_out and test is None:
        raise InputError(f"{inputs[0]}: no ModApte TEST documents for --test-out" if fmt == "reuters"
                         else "mnist --test-out needs the MNIST directory (the t10k files are read from it)")
    if labels is not None:
        labels.check_used(", ".join(inputs))
    store.write_tasks(args.output, *train[:2], names=train[2], attrs=attrs, force=args.force)
    written = [args.output]
    if args.test_out:
        store.write_tasks(args.test_out, *test[:2], names=test[2], attrs=attrs, force=args.force)
        written.append(args.test_out)
    print("wrote " + " and ".join(written))
    return 0


def data_stream(args):
    """``data convert --stream`` of every format but reuters: any task dataset or labeled file -> a stream."""
    from . import converters, store
    labels = converters.LabelRule(args.positive_label, args.labels, binary=True)
    X, Y, names, what = converters.stream_from(
        args.format, args.inputs, labels, n_features=args.n_features, task_column=args.task_column,
        label_column=args.label_column, features=args.features, drop=args.drop, seed=args.seed, report=print)
    extra = {"order": "file"}
    if args.shuffle:
        X, Y = converters.shuffle_rows(X, Y, args.seed)
        extra = {"order": "shuffled", "shuffle_seed": args.seed}
    store.write_stream(args.output, X, Y, label_names=names, force=args.force, attrs=_convert_attrs(args, **extra))
    print(f"wrote {args.output}: {X.shape[0]} rounds, {X.shape[1]} features, {len(names)} label column"
          f"{'s' if len(names) > 1 else ''} ({what}{'; shuffled' if args.shuffle else ''}): "
          f"{converters.short_list(names)}")
    return 0


def reuters_stream(args):
    from . import converters, store
    labels = _convert_rule(args)
    extra = {"order": "shuffled", "shuffle_seed": args.seed} if args.shuffle else {}

    def write(path, X, Y, topics, split, **attrs):
        Y = converters.map_stream_labels(Y, topics, f"{args.inputs[0]} ({split})", labels)
        if args.shuffle:
            X, Y = converters.shuffle_rows(X, Y, args.seed)
        store.write_stream(path, X, Y, label_names=topics, force=args.force,
                           attrs=_convert_attrs(args, **{**attrs, **extra}))

    if args.online:
        X, Y, topics = converters.reuters_online(args.inputs[0], args.n_features or 2 ** 16,
                                                 args.min_docs, args.single_label)
        write(args.output, X, Y, topics, "stream", order="NEWID")
        print(f"wrote {args.output}: {X.shape[0]} rounds, {len(topics)} labels")
        return 0
    train, test = converters.read_reuters(args.inputs[0])
    topics = converters.reuters_topics(train, args.min_docs)
    Xtr, Xte = converters.reuters_features(train, test, args.n_features or 20000)
    write(args.output, Xtr, converters.reuters_labels(train, topics), topics, "ModApte TRAIN")
    written = [args.output]
    if args.test_out:
        write(args.test_out, Xte, converters.reuters_labels(test, topics), topics, "ModApte TEST")
        written.append(args.test_out)
    print("wrote " + " and ".join(written))
    return 0


def data_inspect(args):
    from . import converters
    info = converters.inspect_file(args.input)
    if args.json:
        print(json.dumps(info))
    else:
        print("\n".join(converters.inspection_lines(info)))
    return 0


# ---------------------------------------------------------------------------
# train / evaluate
# ---------------------------------------------------------------------------
def config_from_args(args):
    from .dmtrl import DMTRLConfig
    if args.method == "l1inf":
        from .joint_sparse import JointSparseConfig
        if args.radius is None and args.path is None:
            raise InputError("method 'l1inf' needs --radius C (or --path C1,C2,...)")
        return JointSparseConfig(radius=args.radius or 1.0, loss=args.loss, projection=args.projection,
                                 eta0=args.eta0, max_rounds=args.max_rounds or 200, gamma=args.gamma,
                                 seed=args.seed, rff_dim=args.rff_dim, rff_gamma=args.rff_gamma,
                                 split_tasks=args.split_tasks).validate()
    if args.lam is None:
        raise InputError(f"method '{args.method}' needs --lam")
    relationship = {"dmtrl": "learned", "stl": "identity", "fixed": "fixed", "graph": "fixed", "ssdca": "learned",
                    "mtrl-central": "learned"}[args.method]
    if args.sigma is not None and args.method in ("ssdca", "mtrl-central"):
        relationship = "fixed"                      # the centralized baselines under a given Sigma
    return DMTRLConfig(loss=args.loss, lam=args.lam, gamma=args.gamma, tol=args.tol, max_rounds=args.max_rounds or 500,
                       outer=args.outer, outer_tol=args.outer_tol, local_iters=args.local_iters, seed=args.seed,
                       eta=args.eta, gap_every=args.gap_every, relationship=relationship, rff_dim=args.rff_dim,
                       aggregation=args.aggregation,
                       rff_gamma=args.rff_gamma, split_tasks=args.split_tasks, shrinking=not args.no_shrinking,
                       method=args.method).validate()


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


def data_paths(args):
    """(outputs, inputs) of an ``hpcmtl data`` command (files inside an input directory count as inputs)."""
    force = getattr(args, "force", False)
    if args.data_command == "convert":
        inputs = []
        for path in args.inputs:
            inputs.append(("input", path))
            if os.path.isdir(path):
                with os.scandir(path) as entries:
                    inputs += [("input", e.path) for e in entries if e.is_file()]
        return [("output", args.output, force), ("--test-out", args.test_out, force)], inputs
    if args.data_command == "split":
        return [("train output", args.train, force), ("test output", args.test, force)], [("input", args.input)]
    if args.data_command == "standardize":
        test_in, test_out = args.test or (None, None)
        return ([("output", args.output, force), ("--test output", test_out, force)],
                [("input", args.train), ("--test input", test_in)])
    if args.data_command == "synth":
        return [("output", args.output, force), ("--test", args.test, force)], []
    return [], []


def check_report_paths(args):
    """``hpcmtl report``: --out is a directory (made if missing) whose files must not be any input."""
    from . import store
    from .results import REPORT_FILES, TEST_CSV
    inputs = [("input", p) for p in args.results]
    out = args.out
    if os.path.lexists(out) and not os.path.isdir(out):
        store.check_outputs([("--out", out, True)], inputs)          # names the input if it is one
        raise InputError(f"{out}: report --out must be a directory, this is a file")
    names = list(REPORT_FILES)
    if args.csv:
        names += [os.path.splitext(os.path.basename(p))[0] + "-history.csv" for p in args.results] + [TEST_CSV]
    if os.path.isdir(out):
        store.check_outputs([("report file", os.path.join(out, n), True) for n in names], inputs)
        return
    parent = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise InputError(f"{out}: cannot make the report directory: {parent} is not a writable directory")


def cmd_train_online(args, cluster, signals, checkpoint):
    import numpy as np

    from .checkpoint import Checkpointer
    from .online import StreamTasks, evaluate_stream, train
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
        from .progress import Progress
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
    from . import store
    store.write_result(args.out, result.W, None, result.history, config_out, cluster.size, __version__,
                       task_names=result.task_names, extra=model, test=result.test, ranks=result.extra,
                       groups={"trace": result.trace}, force=args.force)
    if args.log_level != "error":
        print(summary_table(args, result, headline))
    return result


def cmd_train(args, cluster):
    from . import store
    from .baselines import mtrl_central, ssdca
    from .checkpoint import Checkpointer
    from .cluster import SignalFlag
    from .dmtrl import train
    signals = SignalFlag().install()                # before anything slow: no rank dies on SIGTERM
    check_inputs(args)
    if args.quiet:
        args.log_level = "error"
    config = config_from_args(args) if args.method != "online" else None   # identical on every rank
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
        from .task_graph import graph_adjacency, task_kernel
        if args.graph is None:
            raise InputError("method 'graph' needs --graph (a topology name or an edge-list CSV)")
        sigma = task_kernel(graph_adjacency(args.graph, source.names), args.alpha, not args.unnormalized,
                            source.names)
    elif getattr(config, "relationship", None) == "fixed":
        sigma = read_sigma(args.sigma)
    if args.quiet:
        args.log_level = "error"
    progress = None
    if cluster.is_server:
        from .progress import Progress
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
                                          result.task_names)
    else:
        checkpointer = Checkpointer(checkpoint, args.checkpoint_every, args.checkpoint_seconds or 0.0, signals,
                                    config.to_dict(), source, sigma) if cluster.is_server else None
        resume = checkpoint if args.resume else None
        if args.method == "l1inf":
            from .joint_sparse import train as train_l1inf
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
    result = save_result(args, cluster, source, result, result.Sigma,
                         {"model": {"rho": result.rho, "converged": int(result.converged)}, "wsteps": steps},
                         summary)
    if not result.converged:             # at every --log-level, --quiet included: the model is not certified
        print(f"hpcmtl: warning: {n_bad} of {len(steps['converged'])} W-steps ended unconverged (worst relative gap "
              f"{float(steps['rel_gap'].max()):.3e} > tol {config.tol:g}): the model is not certified; "
              f"raise --max-rounds", file=sys.stderr, flush=True)
    return result


def warn_line(args, progress=None):
    """Rank 0's one stderr line per W-step that ended unconverged (kept at every --log-level but error)."""
    def warn(message):
        if args.log_level == "error":
            return
        if progress is not None and getattr(progress, "tty", False) and progress.show:
            print(file=progress.stream, flush=True)          # end the live progress line first
        print(f"hpcmtl: warning: {message}", file=sys.stderr, flush=True)
    return warn


def save_result(args, cluster, source, result, sigma, groups, summary):
    """Write the result file (rank 0) and print a summary table unless --log-level error."""
    from . import store
    config_out = dict(result.config, n_features=source.n_features, train=os.path.abspath(args.train),
                      test=os.path.abspath(args.test) if args.test else None)
    groups = dict(groups)
    model_extra = groups.pop("model", None)
    store.write_result(args.out, result.W, sigma, result.history, config_out, cluster.size, __version__,
                       task_names=result.task_names, extra=model_extra, test=result.test,
                       ranks=result.extra or None, groups=groups, force=args.force)
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
    summary = (f"{result.config['projection']} ball: best objective {result.history['best_objective'][-1]:.6g}, "
               f"{int(path['selected'][-1])} of {result.W.shape[0]} features selected")
    return save_result(args, cluster, source, result, None, {"path": path}, summary)


def match_tasks(model_names, test_source, model_path=None, what="task"):
    """Pairs (model column, test task index) matched by task name; refuses a different task set.

    ``what`` names the test file's columns in the message (``label`` for a stream).
    """
    names = list(test_source.names)
    model_names = list(model_names)
    if set(names) != set(model_names) or len(names) != len(model_names):
        def listed(items):
            shown = ", ".join(f"'{n}'" for n in items[:3])
            return shown + (f" and {len(items) - 3} more" if len(items) > 3 else "")
        test_set, model_set = set(names), set(model_names)
        missing = [n for n in model_names if n not in test_set]
        extra = [n for n in names if n not in model_set]
        many, some = (what + "es", what + "(es)") if what.endswith("s") else (what + "s", what + "(s)")
        parts = ([f"missing the model's {some} {listed(missing)}"] if missing else []) + \
                ([f"{some} {listed(extra)} not in the model"] if extra else [])
        counts = f" ({len(names)} {many}, the model has {len(model_names)})" if len(names) != len(model_names) else ""
        raise InputError(f"{test_source.path}: its {many} differ from the model's"
                         + (f" ({model_path})" if model_path else "") + ": " + "; ".join(parts) + counts)
    where = {n: i for i, n in enumerate(names)}
    return [(j, where[n]) for j, n in enumerate(model_names)]


def evaluate_arrays(W, config, test_source, task_names=None, model_path=None):
    """Per-task and summary metrics of a model on a test task source.

    With the model's ``task_names`` test tasks are matched to model columns by
    name (a test file in another task order gives the same metrics; another
    task set is refused); without, by position.
    """
    import numpy as np

    from .features import feature_map_from_config
    from .losses import get_loss
    from .metrics import summarize, task_metrics
    loss = get_loss(config["loss"])
    n_features = int(config.get("n_features", W.shape[0]))
    if test_source.n_features != n_features:
        raise InputError(f"{test_source.path}: has {test_source.n_features} features, the model was trained on {n_features}")
    phi = feature_map_from_config(config, n_features)
    if task_names is not None and len(task_names) == W.shape[1]:
        pairs = match_tasks(task_names, test_source, model_path)
    elif test_source.n_tasks != W.shape[1]:
        raise InputError(f"{test_source.path}: has {test_source.n_tasks} tasks, the model has {W.shape[1]}")
    else:
        pairs = [(i, i) for i in range(W.shape[1])]
    tasks = []
    for column, i in pairs:
        blk = test_source.read_task(i)
        X = phi(blk.X) if phi is not None else blk.X
        scores = np.asarray(X @ W[:, column]).ravel()
        tasks.append(dict(name=blk.name, **task_metrics(blk.y, scores, not loss.binary_labels)))
    return {"tasks": tasks, "summary": summarize(tasks, not loss.binary_labels)}


def open_test_stream(path, model, model_path):
    """A test stream for an online model, checked against it, its labels in the model's order.

    ``model`` is a result's ``/model`` dict (W, task_names, code, class_names).  The
    stream must have the model's feature count and, without a code, the model's label
    names (in any order); with a code, one label a class of the code's rows (matched
    by name when the result names its classes, so Hamming ties break as in training).
    One-line errors, before any rounds are read.
    """
    import numpy as np

    from .online import StreamTasks
    W = np.asarray(model["W"])
    code = model.get("code")
    order = None
    source = StreamTasks(path)                       # label columns; a code is applied after the checks
    try:
        if source.n_features != W.shape[0]:
            raise InputError(f"{path}: has {source.n_features} features, the model ({model_path}) was trained on "
                             f"{W.shape[0]}")
        if code is not None and source.n_tasks != code.shape[0]:
            raise InputError(f"{path}: has {source.n_tasks} labels, the model's output code ({model_path}) is over "
                             f"{code.shape[0]} classes")
        names = model.get("task_names") if code is None else model.get("class_names")
        if names is not None:                        # code results before class_names: classes by position
            pairs = match_tasks(names, source, model_path, what="label" if code is None else "class")
            order = [i for _, i in sorted(pairs)]
    finally:
        source.close()
    return StreamTasks(path, code, label_order=order)


def evaluate_online(result, path, model_path):
    """Test metrics of an online result on a test stream (read in chunks of the run's --chunk-rounds)."""
    from .online import evaluate_stream
    source = open_test_stream(path, result["model"], model_path)
    try:
        return evaluate_stream(result["model"]["W"], source, chunk=int(result["config"].get("chunk_rounds") or 4096))
    finally:
        source.close()


def metrics_text(metrics):
    """The text table of ``hpcmtl evaluate``: one row a task, then one row a summary metric, by its JSON name."""
    from .metrics import TASK_COLUMNS, ordered_summary_keys
    s = metrics["summary"]

    def shown(v):
        return f"{v:d}" if isinstance(v, int) else f"{v:.6f}"

    kind = "regression" if "pooled_rmse" in s else "classification"
    columns = ("n",) + TASK_COLUMNS[kind]
    keys = ordered_summary_keys(s)
    width = max([len("task")] + [len(str(t["name"])) for t in metrics["tasks"]] + [len(k) for k in keys])
    lines = [f"{'task':<{width}s}  " + "  ".join(f"{c:>18s}" for c in columns)]
    for t in metrics["tasks"]:
        lines.append(f"{t['name']:<{width}s}  " + "  ".join(f"{shown(t[c]):>18s}" for c in columns))
    lines.append("")
    lines += [f"{k:<{width}s}  {shown(s[k]):>18s}" for k in keys]
    return "\n".join(lines)


def cmd_evaluate(args):
    from . import store
    result = store.read_result(args.result)
    fmt = store.file_format(args.test)
    method = result["config"].get("method", "?")
    if method == "online":
        if fmt != store.STREAM_FORMAT:
            what = "a task dataset" if fmt == store.TASKS_FORMAT else f"not a stream (format {fmt!r})"
            raise InputError(f"{args.test}: is {what}, but {args.result} is an online result: evaluate it on a "
                             f"test stream ('{store.STREAM_FORMAT}')")
        metrics = evaluate_online(result, args.test, args.result)
    else:
        if fmt == store.STREAM_FORMAT:
            raise InputError(f"{args.test}: is an online stream, but {args.result} is a '{method}' result: evaluate "
                             f"it on a task dataset ('{store.TASKS_FORMAT}')")
        with store.TaskFile(args.test) as test_source:
            metrics = evaluate_arrays(result["model"]["W"], result["config"], test_source,
                                      result["model"].get("task_names"), args.result)
    print(json.dumps(metrics) if args.json else metrics_text(metrics))
    return 0


# ---------------------------------------------------------------------------
def main(argv=None):
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader went away (`hpcmtl data info X | head`): stop quietly, like other tools
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv=None):
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args = build_parser().parse_args(train_method_first(argv))
    if args.command == "train":
        from .cluster import run_main
        return run_main(lambda cluster: cmd_train(args, cluster))
    try:
        if args.command == "data":
            return cmd_data(args)
        if args.command == "evaluate":
            return cmd_evaluate(args)
        if args.command == "jobs":
            from . import jobs
            if args.jobs_command == "list":
                for name, (_, params) in jobs.templates().items():
                    print(name)
                    for key, (default, text) in params.items():
                        print(f"    {key:<15s} {'(required)' if default == '-' else default:<18s} {text}")
                return 0
            text = jobs.render(args.template, jobs.parse_sets(args.set))
            if args.out:
                with open(args.out, "w") as f:
                    f.write(text)
                os.chmod(args.out, 0o755)
            else:
                print(text, end="")
            return 0
        if args.command == "report":
            from .results import TEST_CSV, history_csv, report, test_metrics_csv
            check_report_paths(args)
            written = report(args.results, args.out)
            if args.csv:
                for path in args.results:
                    name = os.path.splitext(os.path.basename(path))[0] + "-history.csv"
                    written[name] = history_csv(path, os.path.join(args.out, name))
                tests = test_metrics_csv(args.results, os.path.join(args.out, TEST_CSV))
                if tests:
                    written[TEST_CSV] = tests
            for name, path in written.items():
                print(f"{name}: {path}")
            return 0
        if args.command == "demo":
            from .demo import run_demo
            return run_demo(args.out, args.ranks)
    except InputError as exc:
        print(f"hpcmtl: error: {exc}", file=sys.stderr)
        return 2
    return 0
