"""``hpcmtl evaluate RESULT.h5 TEST.h5``: test metrics of a result file."""
from __future__ import annotations

import json
import math

from ..errors import InputError
from ..metrics import evaluate_arrays, match_tasks
from . import COMMAND_HELP


def add_parser(sub):
    """The ``evaluate`` command."""
    ev = sub.add_parser("evaluate", help=COMMAND_HELP["evaluate"])
    ev.add_argument("result", metavar="RESULT.h5")
    ev.add_argument("test", metavar="TEST.h5", help="a task dataset, or a test stream for an online result")
    ev.add_argument("--json", action="store_true",
                    help="one JSON object {tasks, summary} with the same names (an undefined value is null)")


def open_test_stream(path, model, model_path):
    """A test stream for an online model, checked against it, its labels in the model's order.

    ``model`` is a result's ``/model`` dict (W, task_names, code, class_names; ``scaling``: the
    training stream's fitted :class:`~hpcmtl.stream_scaling.StreamScaling`, applied to this one).  The
    stream must have the model's feature count and, without a code, the model's label
    names (in any order); with a code, one label a class of the code's rows (matched
    by name when the result names its classes, so ties between classes break as in training).
    One-line errors, before any rounds are read.
    """
    import numpy as np

    from ..online import StreamTasks
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
    return StreamTasks(path, code, label_order=order, scaling=model.get("scaling"))


def evaluate_online(result, path, model_path):
    """Test metrics of an online result on a test stream (read in chunks of the run's --chunk-rounds).

    The stream is scaled as the training stream was (``config/scale``, ``/model/feature_scale``) and a
    code's rounds decoded by the run's ``config/decoder`` (results before it: ``loss``, today's default).
    """
    import numpy as np

    from ..online import evaluate_stream
    from ..output_codes import DECODERS
    from ..stream_scaling import from_stored
    config, model = result["config"], dict(result["model"])
    decoder = config.get("decoder") or "loss"
    if decoder not in DECODERS:
        raise InputError(f"{model_path}: config 'decoder' must be one of {', '.join(DECODERS)}, got {decoder!r}")
    model["scaling"] = from_stored(config.get("scale"), model.get("feature_scale"), np.asarray(model["W"]).shape[0],
                                   model_path)
    source = open_test_stream(path, model, model_path)
    try:
        return evaluate_stream(model["W"], source, chunk=int(config.get("chunk_rounds") or 4096), decoder=decoder)
    finally:
        source.close()


def metrics_text(metrics):
    """The text table of ``hpcmtl evaluate``: one row a task, then one row a summary metric, by its JSON name."""
    from ..metrics import TASK_COLUMNS, ordered_summary_keys
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
    if metrics.get("classes"):                        # an output code's classes, by the names the stream gave them
        cw = max([len("class")] + [len(str(c["name"])) for c in metrics["classes"]])
        lines += ["", f"{'class':<{cw}s}  " + "  ".join(f"{c:>18s}" for c in ("n", "errors", "error_rate"))]
        lines += [f"{str(c['name']):<{cw}s}  " + "  ".join(f"{shown(c[k]):>18s}" for k in ("n", "errors", "error_rate"))
                  for c in metrics["classes"]]
    return "\n".join(lines)


def json_ready(value):
    """``value`` with every non-finite float as None: ``json.dumps`` writes NaN bare, which no JSON parser
    accepts (a one-class task's AUC, a constant task's explained variance)."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def config_count(result, key, path, default=0) -> int:
    """An integer >= 0 of a result's config (``rff_dim``, ``n_features``), or a one-line InputError."""
    value = result["config"].get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{path}: config '{key}' must be an integer >= 0, got {value!r}")
    return value


def check_model_memory(result, n_features, n_rows, path):
    """Refuse (one line) a model whose feature map or arrays cannot fit in this node's memory, before allocating."""
    from ..memory import check_fits, dense_bytes
    W = result["model"]["W"]
    rff_dim = config_count(result, "rff_dim", path)
    n_features = config_count(result, "n_features", path, default=n_features)
    if rff_dim:
        gamma = result["config"].get("rff_gamma")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 < gamma < float("inf"):
            raise InputError(f"{path}: config 'rff_gamma' must be a number > 0 (the model has random features), "
                             f"got {gamma!r}")
        config_count(result, "seed", path)
    check_fits(dense_bytes(n_features, W.shape[1], rff_dim, rows=n_rows, copies=1),
               f"evaluating {path} ({n_features} features" + (f", rff_dim {rff_dim})" if rff_dim else ")"))


def cmd_evaluate(args):
    from .. import store
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
            check_model_memory(result, test_source.n_features, max(test_source.n_samples, default=0), args.result)
            metrics = evaluate_arrays(result["model"]["W"], result["config"], test_source,
                                      result["model"].get("task_names"), args.result,
                                      result["model"].get("intercept"))
    print(json.dumps(json_ready(metrics), allow_nan=False) if args.json else metrics_text(metrics))
    return 0
