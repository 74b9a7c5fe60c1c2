"""Test metrics per task and over tasks, and the one naming scheme every output uses.

Names
-----
Per task (``tasks`` in JSON, ``/test/<name>`` in result files, the columns of the
per-task table): ``n``, and ``errors``, ``error_rate``, ``auc`` (classification) or
``mse``, ``rmse``, ``explained_variance`` (regression).

Over tasks (``summary`` in JSON and result files, the summary rows of every table,
CSV headers): ``pooled_<metric>`` is computed over all test samples together (a task
counts with its size), ``task_mean_<metric>`` is the plain mean of the per-task values
(every task counts once); ``n_tasks`` and ``n_samples`` count what was evaluated.
An online test stream adds ``n_rounds``, ``inf_error_rate`` (rounds with any task
wrong), ``one_error_rate`` (wrong task predictions over rounds x tasks) and, with an
output code, ``multiclass_error_rate`` (paper 004, Sec. 8.1).

Result files written before this scheme used ``error_rate`` and ``auc`` for task
means and ``rmse``, ``mse``, ``explained_variance`` for pooled values;
:func:`canonical_summary` maps them when a file is read.

Running metrics of a stream
---------------------------
:class:`RunningMetrics` records, round by round, what an online learner suffers
(global loss, tasks wrong, active tasks, multiclass error after decoding: loss-based by default,
Hamming as an option, :func:`hpcmtl.output_codes.decode`)
and turns the counts into the ``inf_error_rate``, ``one_error_rate`` and
``multiclass_error_rate`` above (:func:`error_rates`), by the paper's rule that a
margin of 0 is a mistake (:func:`mistakes`).
"""
from __future__ import annotations

import numpy as np

from .errors import InputError
from .output_codes import decode

# per-task columns shown in tables, by kind
TASK_COLUMNS = {"classification": ("error_rate", "auc"), "regression": ("rmse", "explained_variance")}

# every summary name, in the order tables and CSV files show them
SUMMARY_KEYS = ("n_tasks", "n_samples",
                "pooled_error_rate", "task_mean_error_rate", "task_mean_auc", "n_tasks_without_auc",
                "pooled_rmse", "task_mean_rmse", "pooled_mse", "task_mean_mse",
                "pooled_explained_variance", "task_mean_explained_variance",
                "n_rounds", "inf_error_rate", "one_error_rate", "multiclass_error_rate")

# summary names of result files written before the scheme above -> their names now
OLD_SUMMARY_NAMES = {"error_rate": "task_mean_error_rate", "auc": "task_mean_auc", "rmse": "pooled_rmse",
                     "mse": "pooled_mse", "explained_variance": "pooled_explained_variance"}


def canonical_summary(summary: dict) -> dict:
    """A test summary with today's names (old result files' names mapped; today's pass unchanged)."""
    out = {}
    for key, value in summary.items():
        new = OLD_SUMMARY_NAMES.get(key, key)
        if new != key and new in summary:
            continue                                  # both present: the explicit new name wins
        out[new] = value
    return out


def ordered_summary_keys(keys) -> list:
    """Summary names in table order (known names first, unknown ones after, sorted)."""
    keys = set(keys)
    return [k for k in SUMMARY_KEYS if k in keys] + sorted(keys - set(SUMMARY_KEYS))


def task_metrics(y: np.ndarray, scores: np.ndarray, regression: bool, errors: int | None = None) -> dict:
    """Metrics of one task's predictions; sums are kept so tasks can be pooled.

    ``errors`` replaces the count of ``sign(score) != y`` (a score of 0 predicts +1)
    when the caller counts mistakes by another rule (online: ``y score <= 0``).
    """
    from sklearn.metrics import mean_squared_error, roc_auc_score
    y = np.asarray(y, float)
    scores = np.asarray(scores, float)
    out = {"n": int(y.size)}
    if regression:
        mse = float(mean_squared_error(y, scores))
        out.update(mse=mse, rmse=float(np.sqrt(mse)), sse=mse * y.size,
                   sum_y=float(y.sum()), sum_y2=float(np.dot(y, y)),
                   explained_variance=float(1.0 - mse / y.var()) if y.var() > 0 else float("nan"))
    else:
        if errors is None:
            errors = int(np.count_nonzero(np.where(scores >= 0, 1.0, -1.0) != y))
        out.update(errors=int(errors), error_rate=int(errors) / max(1, y.size))
        out["auc"] = float(roc_auc_score(y, scores)) if len(np.unique(y)) == 2 else float("nan")
    return out


def summarize(per_task: list, regression: bool) -> dict:
    """Over tasks: ``pooled_*`` (all samples together) and ``task_mean_*`` (each task counts once)."""
    n = sum(t["n"] for t in per_task)
    out = {"n_tasks": len(per_task), "n_samples": n}
    if regression:
        sse = sum(t["sse"] for t in per_task)
        sum_y = sum(t["sum_y"] for t in per_task)
        sum_y2 = sum(t["sum_y2"] for t in per_task)
        var = sum_y2 / n - (sum_y / n) ** 2
        out.update(pooled_rmse=float(np.sqrt(sse / n)), pooled_mse=sse / n,
                   pooled_explained_variance=float(1.0 - (sse / n) / var) if var > 0 else float("nan"),
                   task_mean_rmse=float(np.mean([t["rmse"] for t in per_task])),
                   task_mean_mse=float(np.mean([t["mse"] for t in per_task])),
                   task_mean_explained_variance=float(np.nanmean([t["explained_variance"] for t in per_task])))
    else:
        errors = sum(t["errors"] for t in per_task)
        aucs = [t["auc"] for t in per_task if not np.isnan(t["auc"])]
        # a task whose test labels are all one class has no AUC: the mean is over the others, and
        # the count says how many were left out (a mean over 3 of 50 tasks must not read as over 50)
        out.update(pooled_error_rate=errors / max(1, n),
                   task_mean_error_rate=float(np.mean([t["error_rate"] for t in per_task])) if per_task else float("nan"),
                   task_mean_auc=float(np.mean(aucs)) if aucs else float("nan"),
                   n_tasks_without_auc=len(per_task) - len(aucs))
    return out


# ---------------------------------------------------------------------------
# Running metrics of a stream (paper 004, Sec. 8.1)
# ---------------------------------------------------------------------------
class RunningMetrics:
    """Per-round global loss, 1-error (tasks wrong) and inf-error (any task wrong).

    A task is wrong on a round when ``y w . x <= 0`` (the paper's e_tj); dormant
    tasks are never wrong.  With a code, also the multiclass error after
    decoding with ``decoder`` (:func:`hpcmtl.output_codes.decode`).
    """
    COLUMNS = ("global_loss", "n_errors", "n_active", "multiclass_error")

    # rounds of margins held before they are decoded at once: decoding has a fixed cost a call (~25 us) that the
    # server would otherwise pay every block of 64 rounds (3 % of its rounds/s at k = 20)
    DECODE_BATCH = 4096

    def __init__(self, decoder="loss"):
        self._parts = {k: [] for k in self.COLUMNS}
        self.decoder = decoder
        self._pending = []                  # (margins, code, classes) not decoded yet, in round order
        self._pending_rounds = 0

    @property
    def parts(self):
        """Per-column lists of per-call arrays, every pending round decoded."""
        self._decode_pending()
        return self._parts

    def _decode_pending(self):
        if not self._pending:
            return
        code = self._pending[0][1]
        margins = np.concatenate([m for m, _, _ in self._pending])
        classes = np.concatenate([c for _, _, c in self._pending])
        self._parts["multiclass_error"].append(multiclass_mistakes(margins, code, classes, self.decoder).astype(np.int8))
        self._pending, self._pending_rounds = [], 0

    def add(self, Y, margins, global_loss, code=None, classes=None):
        wrong = mistakes(Y, margins)
        self._parts["global_loss"].append(np.asarray(global_loss, dtype=np.float64).copy())
        self._parts["n_errors"].append(wrong.sum(axis=1).astype(np.int32))
        self._parts["n_active"].append((Y != 0).sum(axis=1).astype(np.int32))
        if code is not None:
            if self._pending and self._pending[0][1] is not code:
                self._decode_pending()
            self._pending.append((np.array(margins, dtype=np.float64), code, np.asarray(classes).copy()))
            self._pending_rounds += len(margins)
            if self._pending_rounds >= self.DECODE_BATCH:
                self._decode_pending()

    def extend(self, arrays):
        parts = self.parts
        for k, v in arrays.items():
            if k in parts and len(v):
                parts[k].append(np.asarray(v))

    @property
    def n_rounds(self):
        return int(sum(len(a) for a in self.parts["global_loss"]))

    def arrays(self):
        """Per-round columns plus the cumulative global loss and error rates so far."""
        out = {k: np.concatenate(v) if v else np.zeros(0) for k, v in self.parts.items()}
        if not len(out["multiclass_error"]):
            del out["multiclass_error"]
        n = len(out["global_loss"])
        rounds = np.arange(1, n + 1)
        out["round"] = rounds
        out["cumulative_loss"] = np.cumsum(out["global_loss"])
        out["inf_error"] = (out["n_errors"] > 0).astype(np.int8)
        return out

    def summary(self, k):
        a = self.arrays()
        n = len(a["round"])
        s = {"rounds": n, "cumulative_loss": float(a["cumulative_loss"][-1]) if n else 0.0}
        s.update(error_rates(n, k, int(a["inf_error"].sum()), int(a["n_errors"].sum()),
                             int(a["multiclass_error"].sum()) if "multiclass_error" in a else None))
        return s


def mistakes(Y, margins):
    """The paper's e_tj: task j is wrong on round t when ``y_tj w_j . x_t <= 0``; dormant tasks (y = 0) never."""
    return (Y * margins <= 0) & (Y != 0)


def multiclass_mistakes(margins, code, classes, decoder="loss"):
    """Rounds whose decoded class (:func:`hpcmtl.output_codes.decode`) is not the true one (output codes)."""
    return decode(margins, code, decoder) != classes


def error_rates(n_rounds, k, inf_errors, task_errors, multiclass_errors=None):
    """inf-error, 1-error (and multiclass) rates from counts over ``n_rounds`` rounds of k tasks."""
    n = max(1, n_rounds)
    out = {"inf_error_rate": float(inf_errors / n), "one_error_rate": float(task_errors / (n * k))}
    if multiclass_errors is not None:
        out["multiclass_error_rate"] = float(multiclass_errors / n)
    return out


# ---------------------------------------------------------------------------
# a model on a test task source
# ---------------------------------------------------------------------------
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


def evaluate_arrays(W, config, test_source, task_names=None, model_path=None, intercept=None):
    """Per-task and summary metrics of a model ``x -> w_i . phi(x) + b_i`` on a test task source.

    ``intercept``: the m per-task intercepts b (None: zeros, as files written before intercepts).

    With the model's ``task_names`` test tasks are matched to model columns by
    name (a test file in another task order gives the same metrics; another
    task set is refused); without, by position.
    """
    from .features import feature_map_from_config
    from .losses import get_loss, signed_labels
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
        y = signed_labels(loss, blk.y, config.get("positive_label"),
                          f"{test_source.path}: task '{blk.name}' (#{i})") if loss.binary_labels else blk.y
        X = phi(blk.X) if phi is not None else blk.X
        scores = np.asarray(X @ W[:, column]).ravel() + (0.0 if intercept is None else float(intercept[column]))
        tasks.append(dict(name=blk.name, **task_metrics(y, scores, not loss.binary_labels)))
    return {"tasks": tasks, "summary": summarize(tasks, not loss.binary_labels)}
