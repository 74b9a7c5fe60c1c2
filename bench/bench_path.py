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
"""
import argparse
import os
import tempfile

import numpy as np

from timing import hpcmtl, median_time, save_json

from hpcmtl import store


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="stl,dmtrl")
    ap.add_argument("--grid", default="1e-4:1e-1:7", help="LO:HI:COUNT, as --lam-grid")
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--scale", type=float, default=0.1, help="dmtrl1's size (data synth --scale)")
    ap.add_argument("--loss", default="hinge")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="bench-path-")
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
