"""``hpcmtl data convert | split | standardize | info | inspect | synth``."""
from __future__ import annotations

import json

from .. import formats
from ..errors import InputError
from ..store.packed import LAYOUTS, PACKED_MIN_TASKS
from . import COMMAND_HELP, Parser, _count, _positive_float


SYNTH_NAMES = ("dmtrl1", "dmtrl2", "joint-sparse", "seasonal", "multilabel-stream", "mnist-scale", "mds-scale")


def add_parser(sub):
    """The ``data`` command and its sub-commands."""
    data = sub.add_parser("data", help=COMMAND_HELP["data"])
    dsub = data.add_subparsers(dest="data_command", required=True, parser_class=Parser)
    conv = dsub.add_parser("convert", help="convert a public format into a task dataset or a stream")
    conv.add_argument("--format", required=True, choices=formats.format_names(),
                      help="; ".join(f"{s.name}: {s.help}" for s in formats.all_formats() if s.help))
    conv.add_argument("inputs", nargs="+", metavar="IN")
    conv.add_argument("output", metavar="OUT.h5")
    conv.add_argument("--test-out", metavar="TEST.h5", help="/".join(s.name for s in formats.all_formats()
                                                                    if s.test_out is not None)
                      + ": also write the test split")
    conv.add_argument("--stream", action="store_true",
                      help="write an online stream (train online --stream): a task dataset gives one label column "
                           "a task; a file without task ids gives one column a class or a label")
    conv.add_argument("--shuffle", action="store_true", help="--stream: rows in a random order drawn from --seed")
    conv.add_argument("--positive-label", metavar="L", default=None,
                      help="labels equal to L become +1, all others -1 (a number or text)")
    conv.add_argument("--labels", metavar="MAP", default=None,
                      help="a full label mapping LABEL:VALUE,... such as 0:-1,1:1 or spam:1,ham:-1 (write "
                           "--labels=-1:1,... when it starts with a minus); an unmapped label is an error")
    # the formats' options: what they mean and their defaults come from the format specs (None: not given)
    option_help = formats.option_help
    conv.add_argument("--features", metavar="COLS", default=None, help=option_help("--features"))
    conv.add_argument("--drop", metavar="COLS", default=None, help=option_help("--drop"))
    conv.add_argument("--online", action="store_true", help=option_help("--online"))
    conv.add_argument("--single-label", type=_count("--single-label"), default=None, metavar="N",
                      help=option_help("--single-label"))
    conv.add_argument("--min-docs", type=_count("--min-docs"), default=None, help=option_help("--min-docs"))
    conv.add_argument("--n-features", type=_count("--n-features"), default=None, help=option_help("--n-features"))
    conv.add_argument("--task-column", default=None, help=option_help("--task-column"))
    conv.add_argument("--label-column", default=None, help=option_help("--label-column"))
    conv.add_argument("--x", default=None, metavar="NAME", help=option_help("--x"))
    conv.add_argument("--y", default=None, metavar="NAME", help=option_help("--y"))
    conv.add_argument("--seed", type=_count("--seed", 0), default=0,
                      help=option_help("--seed") + "; --shuffle: the order of the rounds")
    _layout_option(conv)
    conv.add_argument("--force", action="store_true", help="overwrite existing outputs")
    conv.add_argument("--float32", action="store_true", help="task datasets: store the features as float32 "
                      "(half the size; labels stay float64)")

    split = dsub.add_parser("split", help="split every task into train and test (stratified for +-1 labels)")
    split.add_argument("input", metavar="IN.h5")
    split.add_argument("train", metavar="TRAIN.h5")
    split.add_argument("test", metavar="TEST.h5")
    split.add_argument("--test-fraction", type=_positive_float("--test-fraction"), default=0.25)
    split.add_argument("--seed", type=_count("--seed", 0), default=0)
    _layout_option(split)
    split.add_argument("--force", action="store_true")
    split.add_argument("--float32", action="store_true", help="store the features as float32 (default: as the "
                       "input stores them)")

    stdz = dsub.add_parser("standardize", help="scale features with statistics of the training file")
    stdz.add_argument("train", metavar="TRAIN.h5")
    stdz.add_argument("output", metavar="OUT_TRAIN.h5")
    stdz.add_argument("--test", nargs=2, metavar=("TEST.h5", "OUT_TEST.h5"), help="apply the same scaling to a test file")
    stdz.add_argument("--scale", choices=formats.SCALINGS, default="standard",
                      help="standard: dense columns centred to mean 0 and scaled to variance 1, CSR columns only "
                           "scaled to root-mean-square 1 (never centred: centring would fill every zero); maxabs: "
                           "columns divided by their largest |value| (never centred; values in [-1, 1]); l2-rows: "
                           "each row divided by its Euclidean norm (no training statistics; tf-idf rows)")
    _layout_option(stdz)
    stdz.add_argument("--force", action="store_true")
    stdz.add_argument("--float32", action="store_true", help="store the features as float32 (half the size; labels stay float64)")

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
    _layout_option(synth)
    synth.add_argument("--force", action="store_true")
    synth.add_argument("--float32", action="store_true", help="task datasets: store the features as float32 "
                       "(half the size; labels stay float64)")


def _layout_option(parser):
    parser.add_argument("--layout", choices=("auto",) + LAYOUTS, default="auto",
                        help="task datasets: 'groups' (an HDF5 group a task), 'packed' (every task's rows in one set "
                             "of datasets: many tasks read in a fraction of the time) or 'auto' (packed from "
                             f"{PACKED_MIN_TASKS:,} tasks on)")


def cmd_data(args):
    from .. import store
    outputs, inputs = data_paths(args)
    store.check_outputs(outputs, inputs)            # before any work: no output may be an input
    with store.output_locks([path for _, path, _ in outputs]):      # and no other live job writes one
        return _run_data_command(args)


def _run_data_command(args):
    from .. import store
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
                  f"{info['storage']} {info['dtype']}, {info['n_samples']} samples, density {info['density']:.4g}, "
                  f"scaling: {info['scaling']}" + (", packed layout" if info["layout"] == "packed" else ""))
            for t in info["tasks"]:
                extra = (f"positive {t['positive_fraction']:.3f}" if "positive_fraction" in t
                         else f"y mean {t['y_mean']:.4g} std {t['y_std']:.4g}" if "y_mean" in t else "no rows")
                if "label_counts" in t:
                    extra += "  labels " + " ".join(f"{v}:{c}" for v, c in t["label_counts"].items())
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


def data_paths(args):
    """(outputs, inputs) of an ``hpcmtl data`` command (files inside an input directory count as inputs)."""
    force = getattr(args, "force", False)
    if args.data_command == "convert":       # every file the format reads, at any depth under a directory
        spec = formats.get_format(args.format)
        inputs = [("input", path) for path in spec.input_files(args.inputs, spec.resolve(vars(args)))]
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


def data_split(args):
    import numpy as np
    from sklearn.model_selection import train_test_split

    from .. import store
    if not args.test_fraction < 1:
        raise InputError(f"--test-fraction must be in (0, 1), got {args.test_fraction}")
    for path in (args.train, args.test):
        store.check_writable(path, args.force)
    with store.TaskFile(args.input) as tf:
        blocks = [tf.read_task(i) for i in range(tf.n_tasks)]
        truth, names = tf.read_truth(), tf.names
        float32 = args.float32 or tf.dtype == "float32"
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
    store.write_tasks(args.train, *train, names=names, truth=truth, force=args.force, float32=float32,
                      layout=args.layout)
    store.write_tasks(args.test, *test, names=names, force=args.force, float32=float32, layout=args.layout)
    print(f"wrote {args.train} and {args.test}")
    return 0


def data_standardize(args):
    from .. import store
    pairs = [(args.train, args.output)] + ([tuple(args.test)] if args.test else [])
    for _, out in pairs:
        store.check_writable(out, args.force)
    with store.TaskFile(args.train) as tf:
        blocks = [tf.read_task(i) for i in range(tf.n_tasks)]
        d = tf.n_features
    mean, scale = formats.standardization(blocks, args.scale)
    for src, out in pairs:
        with store.TaskFile(src) as tf:
            if tf.n_features != d:
                raise InputError(f"{src}: has {tf.n_features} features, {args.train} has {d}")
            blocks = [tf.read_task(i) for i in range(tf.n_tasks)]
            names, truth, before = tf.names, tf.read_truth(), tf.scaling()
        Xs = [formats.apply_standardization(b.X, mean, scale, args.scale) for b in blocks]
        # data info says what scaling a file has had (a second one is listed after the first)
        done = formats.scaling_text(args.scale, Xs[0])
        attrs = {"scaling": done if before == "none" else f"{before}, then {done}"}
        store.write_tasks(out, Xs, [b.y for b in blocks], names=names, truth=truth, attrs=attrs,
                          preprocessing={"mean": mean, "scale": scale} if mean is not None else None,
                          force=args.force, float32=args.float32, layout=args.layout)
    print("wrote " + " and ".join(out for _, out in pairs))
    return 0


def data_synth(args):
    from .. import store, synthetic
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
        store.write_tasks(args.output, *full[:2], names=full[2], truth=truth, force=args.force,
                          float32=args.float32, layout=args.layout)
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
    store.write_tasks(args.output, *train[:2], names=train[2], truth=truth, force=args.force, float32=args.float32,
                      layout=args.layout)
    if args.test:
        store.write_tasks(args.test, *test[:2], names=test[2], truth=truth, force=args.force, float32=args.float32,
                          layout=args.layout)
    print("wrote " + " and ".join(outputs))
    return 0


def _convert_rule(args, binary=False):
    """The --positive-label / --labels rule of ``data convert`` (None when labels stay as read)."""
    return formats.label_rule(args.positive_label, args.labels, binary)


def _convert_attrs(args, **extra):
    attrs = {"source_format": args.format}
    if args.positive_label is not None:
        attrs["label_map"] = f"--positive-label {args.positive_label}"
    elif args.labels is not None:
        attrs["label_map"] = f"--labels {args.labels}"
    attrs.update(extra)
    return attrs


def check_convert_options(args, spec):
    """Options of ``data convert`` that do not fit the format (one line, before reading anything)."""
    fmt, inputs = args.format, args.inputs
    if spec.one_input and len(inputs) != 1:
        raise InputError(f"{fmt} takes one input, got {len(inputs)}: {', '.join(inputs)}")
    if args.test_out and spec.test_out is None:
        splits = " and ".join(s.name + (f" ({s.test_out})" if s.test_out else "") for s in formats.all_formats()
                              if s.test_out is not None)
        raise InputError(f"--test-out is only for {splits}; split {fmt} data with 'hpcmtl data split'")
    if args.test_out and args.stream and not spec.stream_test_out:
        streams = " and ".join(s.name for s in formats.all_formats() if s.stream_test_out)
        raise InputError(f"--test-out with --stream is only for {streams}; split a stream's source first")
    if args.float32 and args.stream:
        raise InputError("--float32 is for task datasets; a stream stores float64 (the online kernels read float64)")
    if args.shuffle and not args.stream:
        raise InputError("--shuffle orders the rounds of a stream: add --stream (task datasets keep the file's order)")
    for option, value in (("--features", args.features), ("--drop", args.drop)):
        if value is not None and not spec.takes(option):
            raise InputError(f"{option} selects CSV columns; --format {fmt} has none")


def data_convert(args):
    from .. import store
    outputs = [args.output] + ([args.test_out] if args.test_out else [])
    for path in outputs:
        store.check_writable(path, args.force)
    spec = formats.get_format(args.format)
    check_convert_options(args, spec)
    options = spec.resolve(vars(args))
    if args.stream:
        return data_stream(args, spec, options)
    labels = _convert_rule(args)
    attrs = _convert_attrs(args)
    train, test = spec.read(args.inputs, options, labels, print, test=bool(args.test_out))
    if labels is not None:
        labels.check_used(", ".join(args.inputs))
    store.write_tasks(args.output, *train[:2], names=train[2], attrs=attrs, force=args.force, float32=args.float32,
                      layout=args.layout)
    written = [args.output]
    if args.test_out:
        store.write_tasks(args.test_out, *test[:2], names=test[2], attrs=attrs, force=args.force,
                          float32=args.float32, layout=args.layout)
        written.append(args.test_out)
    print("wrote " + " and ".join(written))
    return 0


def data_stream(args, spec, options):
    """``data convert --stream``: the format's streams, shuffled with --shuffle, written with the convert attrs."""
    from .. import store
    if spec.stream is None:
        raise InputError(f"--stream does not read format '{args.format}'")
    written = []
    for s in spec.stream(args.inputs, options, (args.positive_label, args.labels), print, test=bool(args.test_out)):
        X, Y, attrs = s.X, s.Y, s.attrs
        if args.shuffle:
            X, Y = formats.shuffle_rows(X, Y, args.seed)
            attrs = {**attrs, "order": "shuffled", "shuffle_seed": args.seed}
        path = args.test_out if s.split == "test" else args.output
        store.write_stream(path, X, Y, label_names=s.names, force=args.force, attrs=_convert_attrs(args, **attrs))
        written.append((path, X, s))
    if len(written) == 1 and written[0][2].what is not None:
        path, X, s = written[0]
        print(f"wrote {path}: {X.shape[0]} rounds, {X.shape[1]} features, {len(s.names)} label column"
              f"{'s' if len(s.names) > 1 else ''} ({s.what}{'; shuffled' if args.shuffle else ''}): "
              f"{formats.short_list(s.names)}")
    elif len(written) == 1 and written[0][2].note:
        print(f"wrote {written[0][0]}: {written[0][2].note}")
    else:
        print("wrote " + " and ".join(path for path, _, _ in written))
    return 0


def data_inspect(args):
    info = formats.inspect_file(args.input)
    if args.json:
        print(json.dumps(info))
    else:
        print("\n".join(formats.inspection_lines(info)))
    return 0
