"""Result files for analysis: plain NumPy arrays and dicts, CSV export, and `hpcmtl report`.

``load(path)`` returns ``{"config", "hpcmtl_version", "n_ranks", "model",
"history", ...}`` with NumPy arrays (no h5py objects), so results can be
analysed anywhere.  ``report(paths, out_dir)`` draws, for one or several runs:
the duality gap (or objective) against rounds, seconds and bytes on shared axes
(paper 001 Fig. 4); the learned task correlation beside the ground truth when
the training file has one (Fig. 2); the sparsity pattern of W for joint-sparse
runs (paper 002 Fig. 4); and writes ``report.md`` with a table of test metrics.
"""
from __future__ import annotations

import csv
import os

import numpy as np

from . import store
from .covariance import is_factored, model_sigma
from .errors import InputError
from .metrics import ordered_summary_keys

# every file `report` may write into its directory (checked against the inputs before any work)
REPORT_FILES = ("gap.png", "objective.png", "sparsity.png", "online-errors.png", "task-correlation.png", "report.md")
TEST_CSV = "test-metrics.csv"       # with --csv: one row a run, one column a summary metric

# test metrics in report.md's table (named as everywhere: pooled_* / task_mean_*, metrics.py)
REPORTED_METRICS = ("pooled_error_rate", "task_mean_error_rate", "task_mean_auc", "pooled_rmse", "task_mean_rmse",
                    "pooled_explained_variance", "task_mean_explained_variance", "inf_error_rate", "one_error_rate",
                    "multiclass_error_rate")


def load(path) -> dict:
    """A result file as plain NumPy arrays and dicts."""
    return store.read_result(path)


def history_csv_names(paths) -> list:
    """The ``--csv`` history file name of each result: ``STEM-history.csv``, unique among ``paths``.

    Runs named alike in different folders (``a/r.h5``, ``b/r.h5``) get the folders that tell them apart as a
    prefix (``a-r-history.csv``, ``b-r-history.csv``), so one run's CSV never replaces another's; the same
    file given twice keeps one name.
    """
    full = [os.path.abspath(os.fspath(p)) for p in paths]
    parts = [os.path.splitext(f)[0].split(os.sep)[1:] for f in full]
    names = []
    for k, own in enumerate(parts):
        depth = 1
        while depth < len(own) and any(other[-depth:] == own[-depth:] and full[j] != full[k]
                                       for j, other in enumerate(parts)):
            depth += 1
        names.append("-".join(own[-depth:]) + "-history.csv")
    return names


def history_csv(path, out=None) -> str:
    """Write the per-round history of a result file as CSV (default: next to it); return the CSV path."""
    res = load(path)
    history = res["history"]
    if not history:
        raise InputError(f"{path}: the result has no history")
    out = out or os.path.splitext(os.fspath(path))[0] + "-history.csv"
    columns = sorted(history)
    with store.atomic_output(out, "history CSV") as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in zip(*(history[c] for c in columns)):
            writer.writerow([repr(float(v)) if isinstance(v, (float, np.floating)) else int(v) for v in row])
    return out


def test_metrics_csv(paths, out) -> str | None:
    """One row a result file with test metrics: ``run`` (the path as given) then every summary metric by its name.

    Returns the CSV path, or None (nothing written) when no result has test metrics.
    """
    rows = []
    for path in paths:
        test = load(path).get("test", {}).get("summary")
        if test:
            rows.append((os.fspath(path), test))                # as given: runs in two folders stay apart
    if not rows:
        return None
    columns = ordered_summary_keys(set().union(*(t for _, t in rows)))
    with store.atomic_output(out, "test metrics CSV") as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run"] + columns)
        for name, test in rows:
            writer.writerow([name] + ["" if test.get(c) is None else repr(test[c]) if isinstance(test[c], float)
                                      else test[c] for c in columns])
    return out


def intercept_range(res) -> str:
    """report.md's intercept cell: 'none' (fit without, or a file from before intercepts), else 'min .. max'."""
    b = res["model"].get("intercept")
    if res["config"].get("method") == "online":
        return "-"
    if not res["config"].get("fit_intercept", False) or b is None or np.size(b) == 0:
        return "none"
    return f"{float(np.min(b)):.4g} .. {float(np.max(b)):.4g}"


def _label(path, res):
    cfg = res["config"]
    method = cfg.get("method", "?")
    extra = f", lam {cfg['lam']:g}" if cfg.get("lam") is not None else ""
    if method == "online":
        norm = {"rmax": f"r-max r={cfg.get('r')}", "p": f"p={cfg.get('p')}"}.get(cfg.get("norm"), cfg.get("norm"))
        extra = f", {cfg.get('update')}, {norm}, C {float(cfg.get('C')):g}" + \
            (f", code {cfg['code']}" if cfg.get("code") else "")
    if method == "l1inf":
        extra = f", {cfg.get('projection')}, C {cfg.get('radius'):g}"
    return f"{os.path.basename(os.fspath(path))} ({method}{extra})"


MAX_TASK_TICKS = 40           # the correlation plot names its tasks up to this many
MAX_TASKS_SHOWN = 60          # and draws a sample of this many when there are more (a 5000-pixel matrix is noise)


def sampled_tasks(m, limit=MAX_TASKS_SHOWN, seed=0):
    """The tasks a correlation plot draws: all m, or a random sample of ``limit`` (drawn from ``seed``), sorted."""
    if m > limit:
        return np.sort(np.random.default_rng(seed).choice(m, size=limit, replace=False))
    return np.arange(m)


def task_correlation(Sigma, picked):
    """The correlation ``Sigma_ij / sqrt(sigma_ii sigma_jj)`` of the tasks ``picked`` only: from a dense Sigma,
    or from :class:`hpcmtl.covariance.SigmaFactors` (many tasks: never an m x m array)."""
    if is_factored(Sigma):
        return Sigma.correlation(picked)
    s = np.sqrt(np.diag(Sigma)[picked])
    return Sigma[np.ix_(picked, picked)] / np.outer(s, s)


def correlation_order(C, limit=MAX_TASKS_SHOWN, seed=0, picked=None, total=None):
    """``(task indices to draw, in cluster order; a caption)`` of a task correlation matrix ``C``.

    Related tasks are drawn side by side: the leaves of an average-linkage clustering on the distance
    ``1 - C``.  With more than ``limit`` tasks a random sample of ``limit`` (drawn from ``seed``,
    :func:`sampled_tasks`) is ordered and drawn, and the caption says so.  ``picked``: ``C`` is the
    correlation of these tasks only (:func:`task_correlation` of :func:`sampled_tasks` of ``total`` tasks).
    """
    from scipy.cluster.hierarchy import leaves_list, linkage
    from scipy.spatial.distance import squareform
    if picked is None:
        m = C.shape[0]
        picked = sampled_tasks(m, limit, seed)
        C = C[np.ix_(picked, picked)]
    else:
        m, picked = int(total), np.asarray(picked)
    if len(picked) > 2:
        D = np.clip(1.0 - C, 0.0, 2.0)
        D = (D + D.T) / 2
        np.fill_diagonal(D, 0.0)
        picked = picked[leaves_list(linkage(squareform(D, checks=False), method="average"))]
    caption = "tasks in cluster order (average linkage on 1 - correlation)"
    if m > limit:
        caption += f"; a random sample of {limit} of the {m} tasks"
    return picked, caption


def refit_bytes(res):
    """(bytes moved at each history row, the grid's fold fits' MB or None) of a run: a grid's history is its refit,
    whose byte count starts after the whole path's (``/path/selection_bytes``; files written before it: the
    refit from its first row); the MB-moved panel plots the refit's own, so a CV path does not dwarf it."""
    moved = np.asarray(res["history"]["bytes"], dtype=np.float64)
    path = res.get("path") or {}
    if not isinstance(res["config"].get("selection"), dict) or not moved.size:
        return moved, None
    before = float(path["selection_bytes"]) if "selection_bytes" in path else float(moved[0])
    return moved - before, before / 1e6


def omega_step_rounds(history) -> list:
    """The first round of every W-step after the first (where ``outer`` changes): an Omega-step came before it."""
    outer = np.asarray(history.get("outer", []))
    if outer.size != np.size(history.get("round", [])):
        return []
    return [int(history["round"][k + 1]) for k in np.flatnonzero(np.diff(outer) != 0)]


def selection_note(path, res) -> str:
    """report.md's line on how a run's regularization was chosen (empty for a run at a given value)."""
    sel = res["config"].get("selection")
    if not isinstance(sel, dict) or "parameter" not in sel:
        return ""
    name = sel["parameter"]
    chosen = sel.get(f"chosen_{name}", sel.get("chosen_lam"))
    how = (f"{sel['cv']}-fold cross-validation" if "cv" in sel else
           f"a validation split of {sel['validation_fraction']:g} of every task" if "validation_fraction" in sel
           else "validation")
    grid = res.get("path", {}).get(name)
    grid = f" over the grid {', '.join(f'{v:.4g}' for v in np.asarray(grid).ravel())}" if grid is not None else ""
    timing = res.get("timing", {})
    spent = (f"; the grid's fold fits took {float(timing['selection_seconds']):.2f} s, the whole job "
             f"{float(timing['job_seconds']):.2f} s" if "selection_seconds" in timing else "")
    status = res.get("path", {}).get("status")        # 1 certified, 0 unconverged, 2 stopped early
    points = ("" if status is None else
              f"; grid points: {int(np.count_nonzero(status == 1))} certified, {int(np.count_nonzero(status == 0))} "
              f"unconverged, {int(np.count_nonzero(status == 2))} stopped early (the validation score fell "
              f"{sel.get('patience', '?')} points in a row past its best)")
    return (f"- {os.path.basename(os.fspath(path))}: {name} {float(chosen):.4g} was chosen by {how} "
            f"(validation {sel.get('metric', '?')}){grid}{spent}{points}; its rounds, seconds and curves are the "
            f"refit's at that value.")


def _save(plt, fig, written, name, path, tight=True):
    """Save a figure under a temporary name, then rename (a full disk: one line, nothing left)."""
    if tight:
        fig.tight_layout()
    try:
        with store.atomic_output(path, "report file") as tmp:
            fig.savefig(tmp, dpi=110, format=os.path.splitext(path)[1][1:] or "png")
    finally:
        plt.close(fig)
    written[name] = path


def report(paths, out_dir) -> dict:
    """Figures and a Markdown summary for result files; returns {name: path} of what was written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not paths:
        raise InputError("report needs at least one result file")
    runs = [(p, load(p)) for p in paths]
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise store.write_error("report directory", out_dir, exc) from None
    written = {}

    gap_runs = [(p, r) for p, r in runs if "rel_gap" in r["history"]]
    if gap_runs:
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        marked, path_notes = False, []
        for p, r in gap_runs:
            h = r["history"]
            gap = np.maximum(h["rel_gap"], 1e-16)       # a gap of exactly 0 sits on the floor, still drawn
            # markers: a run of one or a few rounds (STL) is a point, invisible as a line
            style = dict(marker="o", markersize=3) if len(gap) <= 20 else {}
            moved, path_mb = refit_bytes(r)
            if path_mb is not None:
                path_notes.append(f"{os.path.basename(os.fspath(p))}: its grid's path moved {path_mb:.3g} MB "
                                  f"before the refit")
            for ax, x in zip(axes, ("round", "seconds", "bytes")):
                line, = ax.semilogy(moved / 1e6 if x == "bytes" else h[x], gap, label=_label(p, r), **style)
            for k in omega_step_rounds(h):
                # an Omega-step between two W-steps: the gap of the next W-step starts high again (the saw-tooth)
                axes[0].axvline(k, color=line.get_color(), linestyle=":", linewidth=0.8)
                marked = True
        for ax, xl in zip(axes, ("rounds", "seconds (training; a grid: its refit)", "MB moved (a grid: its refit)")):
            ax.set_xlabel(xl)
            ax.set_ylabel("relative duality gap")
        if marked:
            axes[0].set_title("dotted: an Omega-step (Sigma updated), then a new W-step", fontsize=8)
        if all(not np.any(r["history"]["bytes"]) for _, r in gap_runs):
            axes[2].set_title("no bytes moved: every run on one process", fontsize=8)
        elif path_notes:                  # a grid's refit is plotted alone: its path's traffic said here
            axes[2].set_title("\n".join(path_notes), fontsize=8)
        axes[0].legend(fontsize=7)
        _save(plt, fig, written, "gap", os.path.join(out_dir, "gap.png"))

    sub_runs = [(p, r) for p, r in runs if "best_objective" in r["history"]]
    if sub_runs:
        fig, ax = plt.subplots(figsize=(5, 3.6))
        for p, r in sub_runs:
            ax.plot(r["history"]["round"], r["history"]["best_objective"], label=_label(p, r))
        ax.set_xlabel("rounds")
        ax.set_ylabel("best objective")
        ax.legend(fontsize=7)
        _save(plt, fig, written, "objective", os.path.join(out_dir, "objective.png"))
        p, r = sub_runs[0]
        W = r["model"]["W"]
        fig, ax = plt.subplots(figsize=(5, 4))
        ax.imshow(np.abs(W) > 0, aspect="auto", cmap="Greys", interpolation="nearest")
        ax.set_xlabel("task")
        ax.set_ylabel("feature")
        ax.set_title(f"non-zero entries of W: {int(np.count_nonzero(np.abs(W).max(axis=1)))} features")
        _save(plt, fig, written, "sparsity", os.path.join(out_dir, "sparsity.png"))

    online = [(p, r) for p, r in runs if "inf_error" in r["history"]]
    if online:
        columns = [("inf_error", "inf-error rate (any task wrong)"), ("n_errors", "1-error rate (tasks wrong)")]
        if any("multiclass_error" in r["history"] for _, r in online):
            columns.append(("multiclass_error", "multiclass error rate"))
        fig, axes = plt.subplots(1, len(columns), figsize=(4.6 * len(columns), 3.6), squeeze=False)
        for p, r in online:
            h = r["history"]
            t = h["round"]
            for ax, (key, _) in zip(axes[0], columns):
                if key in h:
                    errors = h[key] / (len(r["model"]["task_names"]) if key == "n_errors" else 1)
                    ax.plot(t, np.cumsum(errors) / t, label=_label(p, r))
        for ax, (_, title) in zip(axes[0], columns):
            ax.set_xlabel("rounds")
            ax.set_ylabel("cumulative " + title.split(" (")[0])
            ax.set_title(title, fontsize=9)
        axes[0][0].legend(fontsize=7)
        _save(plt, fig, written, "online", os.path.join(out_dir, "online-errors.png"))

    for p, r in runs:
        Sigma = model_sigma(r["model"], p)
        train = r["config"].get("train")
        if Sigma is None or r["config"].get("relationship") != "learned":
            continue
        # the correlation of the drawn tasks only (a sample of many): from the factors of a file of many tasks
        # no m x m array is formed
        m = Sigma.shape[0]
        picked = sampled_tasks(m)
        learned = task_correlation(Sigma, picked)
        names = r["model"].get("task_names") or [str(i) for i in range(m)]
        shown, note = correlation_order(learned, picked=picked, total=m)
        at = {int(t): k for k, t in enumerate(picked)}
        order = [at[int(t)] for t in shown]
        panels = [(f"learned task correlation, {os.path.basename(os.fspath(p))}", learned[np.ix_(order, order)])]
        if train and os.path.exists(train):
            with store.TaskFile(train) as tf:
                truth = tf.read_truth()
            if "correlation" in truth and truth["correlation"].shape == (m, m):
                panels.append(("ground truth", truth["correlation"][np.ix_(shown, shown)]))
        fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4), squeeze=False)
        for ax, (title, M) in zip(axes[0], panels):
            im = ax.imshow(M, vmin=-1, vmax=1, cmap="RdBu_r", interpolation="nearest")
            ax.set_title(title, fontsize=9)
            if len(shown) <= MAX_TASK_TICKS:         # task names, in the cluster order the matrix is drawn in
                ax.set_xticks(range(len(shown)), [names[i] for i in shown], rotation=90, fontsize=6)
                ax.set_yticks(range(len(shown)), [names[i] for i in shown], fontsize=6)
            else:
                ax.set_xticks([])
                ax.set_yticks([])
        fig.suptitle(note, fontsize=8)
        fig.colorbar(im, ax=list(axes[0]), shrink=0.8)
        _save(plt, fig, written, "correlation", os.path.join(out_dir, "task-correlation.png"), tight=False)
        break

    lines = ["# hpcmtl report", "",
             "| run | rounds | seconds (training; a grid: its refit) | job seconds | final gap / objective / online "
             "errors | test metrics | intercepts |",
             "|---|---|---|---|---|---|---|"]
    for p, r in runs:
        h = r["history"]
        final = (f"{h['rel_gap'][-1]:.2e}" if "rel_gap" in h else
                 f"{h['best_objective'][-1]:.6g}" if "best_objective" in h else "")
        if "inf_error" in h:
            k = len(r["model"]["task_names"])
            final = (f"inf-error {h['inf_error'].mean():.4f}, 1-error {h['n_errors'].sum() / (len(h['round']) * k):.4f}"
                     + (f", multiclass {h['multiclass_error'].mean():.4f}" if "multiclass_error" in h else ""))
            h = dict(h, seconds=r.get("trace", {}).get("seconds", [0.0]))
        test = r.get("test", {}).get("summary", {})
        metrics = ", ".join(f"{k} {test[k]:.4f}" for k in ordered_summary_keys(test) if k in REPORTED_METRICS)
        rounds = int(h["round"][-1]) if "round" in h and len(h["round"]) else 0
        seconds = float(h["seconds"][-1]) if "seconds" in h and len(h["seconds"]) else 0.0
        job = r.get("timing", {}).get("job_seconds")
        job = "-" if job is None else f"{float(job):.2f}"          # files from before /timing
        lines.append(f"| {_label(p, r)} | {rounds} | {seconds:.2f} | {job} | {final} | {metrics} | "
                     f"{intercept_range(r)} |")
    notes = [n for n in (selection_note(p, r) for p, r in runs) if n]
    if notes:
        lines += [""] + notes
    lines += [""] + [f"![{name}]({os.path.basename(path)})" for name, path in written.items()]
    written["summary"] = os.path.join(out_dir, "report.md")
    with store.atomic_output(written["summary"], "report file") as tmp, open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    return written
