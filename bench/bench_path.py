"""A lam grid in one warm-started job vs the same grid cold and as separate jobs (issue 15 part 2).

For each method, on ``data synth dmtrl1`` (16 dense tasks, d = 100): the
whole job's seconds and the rounds of its grid points for

* ``path, warm``: ``hpcmtl train METHOD --lam-grid GRID`` (one job, blocks read
  once, each point started from the previous point's alpha);
* ``path, cold``: the same job with ``--no-warm-start`` (every point from zero);
* ``separate``: one ``hpcmtl train METHOD --lam L`` job per grid point on the
  training rows alone (what a user did by hand: a launch and a read of the
  data per point; no validation, no refit);

and the ratios to ``path, warm``.  Seconds are medians of ``--repeats`` runs at
``--ranks`` ranks; rounds are exact (rounds of the path's points, the refit
not included, so the three count the same grid).

    python bench/bench_path.py [--methods stl,dmtrl] [--grid 1e-4:1e-1:7] [--ranks 3] [--repeats 1]
        [--scale 0.1] [--work DIR] [--json FILE]

``--case landmine`` (issue 39): a Landmine-shaped problem instead, generated (29 tasks
of 445-690 rows, 9 features, about 6 % positive labels, the tasks in two groups like
Landmine's two terrains), a 17-point lam grid, 3-fold CV scored by AUC, the logistic
loss, one process; ``hpcmtl train stl`` and ``hpcmtl train dmtrl`` (learned Sigma)
against scikit-learn's ``LogisticRegressionCV`` fitted task by task in the same run
(the same folds' count, stratified, the same grid as ``C = 1 / (lam n_task)``, AUC, one
BLAS thread as hpcmtl's ranks),
each the median of ``--repeats`` runs, and the ratio to scikit-learn's seconds, wall
and CPU (user + system of every process: on a crowded node the wall clock mostly
measures the others).  The hpcmtl seconds are whole commands (start, read, CV path,
refit, result file), as a user runs them.  ``--selection-tol T`` adds each method
with its fold fits stopped at relative gap T, ``--exhaustive`` each method's exhaustive path (``--selection-tol 0 --path-patience 0``:
every fold fit at --tol, no point stopped), the reference the default path's choice is compared with.

    python bench/bench_path.py --case landmine [--grid 1e-5:1e-1:17] [--repeats 3] [--selection-tol 1e-3]
        [--exhaustive] [--methods stl,dmtrl] [--json FILE]
"""
import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from timing import hpcmtl, median_time, save_json

from hpcmtl import store


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", choices=("dmtrl1", "landmine"), default="dmtrl1")
    ap.add_argument("--methods", default="stl,dmtrl")
    ap.add_argument("--grid", default=None, help="LO:HI:COUNT, as --lam-grid (dmtrl1: 1e-4:1e-1:7, landmine: "
                    "1e-5:1e-1:17)")
    ap.add_argument("--ranks", type=int, default=None, help="dmtrl1: 3; landmine: 1")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--scale", type=float, default=0.1, help="dmtrl1's size (data synth --scale)")
    ap.add_argument("--loss", default="hinge")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--selection-tol", default=None, help="landmine: also every method with --selection-tol T")
    ap.add_argument("--exhaustive", action="store_true", help="landmine: also every method's exhaustive path "
                    "(--selection-tol 0 --path-patience 0), the reference of the choice")
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="bench-path-")
    if args.case == "landmine":
        return landmine(args, work)
    args.grid = args.grid or "1e-4:1e-1:7"
    args.ranks = args.ranks or 3
    data = os.path.join(work, "dmtrl1.h5")
    hpcmtl(["data", "synth", "dmtrl1", data, "--scale", args.scale, "--seed", 1])
    lo, hi, count = args.grid.split(":")
    grid = np.logspace(np.log10(float(lo)), np.log10(float(hi)), int(count))
    common = ["--train", data, "--loss", args.loss, "--tol", args.tol, "--quiet", "--force"]
    rows, everything = [], {"grid": grid.tolist(), "ranks": args.ranks, "scale": args.scale}
    for method in args.methods.split(","):
        out = os.path.join(work, f"{method}-path.h5")
        runs = {}
        for name, extra in (("path, warm", []), ("path, cold", ["--no-warm-start"])):
            seconds, times = median_time(lambda: hpcmtl(["train", method, "--out", out, "--lam-grid", args.grid]
                                                         + common + extra, args.ranks), args.repeats)
            res = store.read_result(out)
            runs[name] = (seconds, int(res["path"]["rounds"].sum()), times)
        # separate jobs on the training rows of the same split: the path's own split, written out
        train = os.path.join(work, f"{method}-train.h5")
        write_training_rows(data, res["config"]["seed"], train)
        single = os.path.join(work, f"{method}-single.h5")
        rounds = []

        def separate():
            rounds.clear()
            for lam in grid:
                hpcmtl(["train", method, "--out", single, "--lam", lam] + common[2:] + ["--train", train], args.ranks)
                rounds.append(int(store.read_result(single)["history"]["round"][-1]))
        seconds, times = median_time(separate, args.repeats)
        runs["separate"] = (seconds, int(sum(rounds)), times)
        base_s, base_r = runs["path, warm"][0], runs["path, warm"][1]
        for name, (s, r, times) in runs.items():
            rows.append((method, name, s, r, s / base_s, r / base_r))
            everything[f"{method}/{name}"] = {"seconds": times, "rounds": r}
    print(f"grid {args.grid} ({len(grid)} points), {args.ranks} ranks, dmtrl1 --scale {args.scale}, "
          f"{args.loss}, tol {args.tol:g}; seconds: median of {args.repeats}")
    print(f"{'method':<7} {'run':<11} {'seconds':>8} {'rounds':>7} {'s / warm':>9} {'rounds / warm':>14}")
    for method, name, s, r, rs, rr in rows:
        print(f"{method:<7} {name:<11} {s:8.2f} {r:7d} {rs:9.2f} {rr:14.2f}")
    save_json(args.json, everything)


def landmine_like(path, seed=0):
    """A generated stand-in of Landmine (29 tasks, 445-690 rows each, d = 9, ~6 % positive): two groups of
    tasks share a direction each (Landmine's two terrains), a task's own weights vary around it; labels from a
    logistic model cut at the task's 94th percentile, so each task has its share of positives."""
    rng = np.random.default_rng(seed)
    d, m = 9, 29
    centers = rng.normal(size=(2, d))
    mix = rng.normal(size=(d, d)) / np.sqrt(d) + np.eye(d)        # correlated features, as image statistics are
    Xs, ys = [], []
    for t in range(m):
        n = int(rng.integers(445, 691))
        X = rng.normal(size=(n, d)) @ mix
        w = centers[int(t >= 15)] + 0.5 * rng.normal(size=d)
        z = X @ w + rng.logistic(size=n)
        y = np.where(z > np.quantile(z, 0.94), 1.0, -1.0)
        Xs.append(X)
        ys.append(y)
    store.write_tasks(path, Xs, ys)
    return Xs, ys


def sklearn_cv(Xs, ys, grid, folds):
    """scikit-learn's per-task CV over the same grid (``C = 1 / (lam n)``: its objective is n/(C n) times ours)."""
    import warnings
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold
    from threadpoolctl import threadpool_limits
    # one BLAS thread, as every hpcmtl rank runs (engine.one_blas_thread); its FutureWarnings on the defaults of
    # 1.10, once per task, kept out
    with threadpool_limits(limits=1, user_api="blas"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for X, y in zip(Xs, ys):
            LogisticRegressionCV(Cs=[1.0 / (lam * len(y)) for lam in grid], cv=StratifiedKFold(folds),
                                 scoring="roc_auc").fit(X, y)


def cpu_and_wall(fn, repeats):
    """(median wall seconds, median CPU seconds, every run's (wall, CPU)) of ``fn()``: CPU of this process and of
    its finished children (user + system), the measure that a crowded node does not inflate."""
    runs = []
    for _ in range(repeats):
        before, t = os.times(), time.perf_counter()
        fn()
        wall, after = time.perf_counter() - t, os.times()
        cpu = sum(after[k] - before[k] for k in range(4))
        runs.append((wall, cpu))
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs), runs


def landmine(args, work):
    """The Landmine-shaped case: scikit-learn per task, then hpcmtl train stl / dmtrl, ratios to scikit-learn."""
    grid_text, ranks = args.grid or "1e-5:1e-1:17", args.ranks or 1
    lo, hi, count = grid_text.split(":")
    grid = np.logspace(np.log10(float(lo)), np.log10(float(hi)), int(count))
    data = os.path.join(work, "landmine-like.h5")
    Xs, ys = landmine_like(data)
    folds = 3
    everything = {"case": "landmine", "grid": grid.tolist(), "ranks": ranks, "cv": folds}
    print(f"Landmine-shaped (29 tasks, d = 9, ~6 % positive), logistic, grid {grid_text}, {folds}-fold CV, AUC, "
          f"{ranks} rank(s); seconds: median of {args.repeats} (wall, and CPU of every process)", flush=True)
    print(f"{'run':<36} {'wall s':>8} {'/ sklearn':>10} {'CPU s':>8} {'/ sklearn':>10} {'chosen lam':>11} "
          f"{'points certified':>10}", flush=True)
    base, base_cpu, runs = cpu_and_wall(lambda: sklearn_cv(Xs, ys, grid, folds), args.repeats)
    everything["sklearn"] = {"wall_cpu": runs}
    print(f"{'sklearn LogisticRegressionCV':<36} {base:8.2f} {1:10.2f} {base_cpu:8.2f} {1:10.2f}", flush=True)
    runs_of = [(m, []) for m in args.methods.split(",")]
    if args.selection_tol:
        runs_of += [(m, ["--selection-tol", args.selection_tol]) for m in args.methods.split(",")]
    if args.exhaustive:
        runs_of += [(m, ["--selection-tol", "0", "--path-patience", "0"]) for m in args.methods.split(",")]
    for method, extra in runs_of:
        out = os.path.join(work, f"landmine-{method}.h5")
        seconds, cpu, runs = cpu_and_wall(
            lambda: hpcmtl(["train", method, "--train", data, "--out", out, "--loss", "logistic", "--lam-grid",
                            grid_text, "--cv", folds, "--metric", "auc", "--quiet", "--force"] + extra, ranks),
            args.repeats)
        res = store.read_result(out)
        sel = res["config"]["selection"]
        name = f"hpcmtl train {method}" + (" exhaustive" if "--path-patience" in extra
                                             else f" --selection-tol {extra[1]}" if extra else "")
        status = res["path"].get("status", res["path"]["converged"])       # 1 certified, 0 not, 2 stopped early
        counts = {k: int(np.count_nonzero(status == v)) for k, v in (("certified", 1), ("unconverged", 0),
                                                                      ("stopped", 2))}
        print(f"{name:<36} {seconds:8.2f} {seconds / base:10.2f} {cpu:8.2f} {cpu / base_cpu:10.2f} "
              f"{sel['chosen_lam']:11.3g} {counts['certified']:>4}/{len(grid)} ({counts['stopped']} stopped early, "
              f"{counts['unconverged']} unconverged; fold gap {sel.get('selection_tol', 0):.0e}) "
              f"{'refit certified' if res['model']['converged'] else 'refit NOT certified'}", flush=True)
        everything[name] = {"wall_cpu": runs, "chosen_lam": sel["chosen_lam"],
                            "rounds": int(res["path"]["rounds"].sum()), **counts}
    save_json(args.json, everything)


def write_training_rows(data, seed, path):
    """The rows a hold-out split of 0.2 trains on (the path's split: model_selection.task_folds)."""
    from hpcmtl.model_selection import HOLDOUT, Selection, task_folds
    source = store.TaskFile(data)
    selection = Selection([1.0], validation_fraction=0.2).validate("hinge")
    Xs, ys = [], []
    for t in range(source.n_tasks):
        blk = source.read_task(t)
        keep = task_folds(blk.y, seed, t, selection, stratify=True) == HOLDOUT
        Xs.append(blk.X[keep])
        ys.append(blk.y[keep])
    store.write_tasks(path, Xs, ys, names=source.names)


if __name__ == "__main__":
    main()
