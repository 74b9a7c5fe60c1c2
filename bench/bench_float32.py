"""float32 against float64 features on the sparse Zipf case and the dense case (issue 14).

For each case, features stored as float64 and as float32 (the same values rounded:
``store.write_tasks(..., float32=True)``, what ``hpcmtl data ... --float32`` writes), and
each rank count of ``--ranks``: the data partition (MB, the largest over the ranks), the
peak RSS of every rank and what it grew by after the interpreter and modules were
loaded (``peak - RSS before data``), seconds per round, rounds, and the final test
metric (pooled error rate; hinge loss), medians of ``--repeats`` runs.  The last column
is the worker memory target of the issue: ``(peak - before) / partition`` of the worst
worker rank (P > 1: ranks 1..P-1; P = 1: rank 0, which also holds the server's d x m
state).

    python bench/bench_float32.py [--cases sparse,dense] [--methods dmtrl,stl] [--ranks 1,3]
        [--repeats 3] [--work DIR] [--json FILE]

Cases as in ``bench_traffic.py``: ``sparse`` (:func:`hpcmtl.synthetic.sparse_vocabulary`:
15 tasks of 400 rows over 152,543 features, Zipf vocabularies of about 10k
features a task), ``dense`` (``data synth dmtrl1``: 16 tasks, d = 100), both with
the hinge loss at lam 1e-3; and ``wide`` (the memory case: 16 dense tasks of ``--wide-rows`` rows
over 400 features, Gaussian, labels of a shared direction plus noise; hinge, lam 1e-3).

The memory target (worker peak <= 1.1x its float32 partition) mixes two things: what grows with the
data and what a process takes once whatever the data (library code and HDF5 state first used while
loading, MPI's buffers of the first large collectives, allocator arenas of the rounds' fixed-size
temporaries).  The ``wide`` case runs at each of the ``--wide-rows`` sizes (8,000 and 2,000 rows a task:
a 100 MB and a 25 MB float32 partition a worker at P = 3), and a second table fits
``growth = fixed + slope x partition`` through the medians of the two sizes: ``slope`` is the
per-partition cost to hold against 1.1, ``fixed`` the rest.  The largest fixed part is scikit-learn,
which a worker imports for its test metrics (``metrics.task_metrics``) at the end of a run with a test
file: about 59 MB a rank; ``--no-test`` leaves the test file out.  A quick memory run:

    python bench/bench_float32.py --cases wide --methods stl --dtypes float32 --ranks 3,2 --max-rounds 20 [--no-test]
"""
import argparse
import itertools
import os

import numpy as np

from timing import hpcmtl, medians, save_json, work_dir

from hpcmtl import store, synthetic

CASES = {"sparse": ("hinge", 1e-3), "dense": ("hinge", 1e-3), "wide": ("hinge", 1e-3)}
OPTIONS = (("--cases", str, "sparse,dense"), ("--methods", str, "dmtrl,stl"), ("--ranks", str, "1,3"),
           ("--dtypes", str, "float64,float32"), ("--wide-rows", str, "8000,2000"),
           ("--repeats", int, 3), ("--tol", float, 1e-4), ("--max-rounds", int, 500), ("--work", str, None),
           ("--json", str, None))
WIDE_FEATURES, WIDE_TASKS, WIDE_TEST_ROWS = 400, 16, 200


def wide_tasks(rows, seed=0):
    """``(train, test, names)`` of the ``wide`` case: (Xs, ys) pairs of 16 dense tasks over 400 features."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(size=WIDE_FEATURES)
    train, test = ([], []), ([], [])
    for _ in range(WIDE_TASKS):
        w = shared + 0.3 * rng.normal(size=WIDE_FEATURES)
        for (Xs, ys), n in ((train, rows), (test, WIDE_TEST_ROWS)):
            X = rng.normal(size=(n, WIDE_FEATURES))
            Xs.append(X)
            ys.append(np.where(X @ w + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0))
    return train, test, [f"task{i}" for i in range(WIDE_TASKS)]


def datasets(case, work, dtypes=("float64", "float32")):
    """``{dtype: (train, test)}`` paths of the case (``wide`` at rows R: the case ``wideR``), written once."""
    out = {dt: (os.path.join(work, f"{case}-{dt}.h5"), os.path.join(work, f"{case}-{dt}-test.h5"))
           for dt in dtypes}
    if all(os.path.exists(p) for pair in out.values() for p in pair):
        return out
    if case.startswith("wide"):
        train, test, names = wide_tasks(int(case[len("wide"):]))
        truth = None
    elif case == "sparse":
        (Xs, ys, names), (Xt, yt, _), truth = synthetic.sparse_vocabulary(seed=0)
        train, test = (Xs, ys), (Xt, yt)
    else:
        tr, te = os.path.join(work, "dense-src.h5"), os.path.join(work, "dense-src-test.h5")
        hpcmtl(["data", "synth", "dmtrl1", tr, "--test", te, "--force"])
        tasks, _, _ = store.read_all_tasks(tr)
        tests, _, _ = store.read_all_tasks(te)
        names, truth = [t.name for t in tasks], None
        train, test = ([t.X for t in tasks], [t.y for t in tasks]), ([t.X for t in tests], [t.y for t in tests])
    for dt, (tr, te) in out.items():
        store.write_tasks(tr, *train, names=names, truth=truth, force=True, float32=dt == "float32")
        store.write_tasks(te, *test, names=names, force=True, float32=dt == "float32")
    return out


def run_once(case, method, dtype, ranks, args, work):
    loss, lam = CASES["wide" if case.startswith("wide") else case]
    tr, te = datasets(case, work, (dtype,))[dtype]
    out = os.path.join(work, f"r-{case}-{method}-{dtype}-{ranks}.h5")
    hpcmtl(["train", method, "--train", tr] + ([] if args.no_test else ["--test", te]) + ["--out", out, "--loss", loss,
            "--lam", lam, "--tol", args.tol, "--max-rounds", args.max_rounds, "--quiet", "--force"], ranks)
    res = store.read_result(out)
    h, info = res["history"], res["ranks"]
    rounds = int(h["round"][-1])
    workers = slice(1, None) if ranks > 1 else slice(0, 1)
    grown = info["peak_rss_mb"] - info["rss_before_data_mb"]
    return {"rounds": rounds, "seconds_per_round": float(h["seconds"][-1]) / max(rounds, 1),
            "converged": bool(res["model"]["converged"]),
            "partition_mb": float(np.max(info["partition_mb"])),
            "peak_rss_mb": float(np.max(info["peak_rss_mb"])),
            "worker_peak_rss_mb": float(np.max(info["peak_rss_mb"][workers])),
            "worker_growth_per_partition": float(np.max(grown[workers] / info["partition_mb"][workers])),
            "worker_growth_mb": float(np.max(grown[workers])),
            "worker_partition_mb": float(np.max(info["partition_mb"][workers])),
            "error_rate": float(res["test"]["summary"]["pooled_error_rate"]) if "test" in res else float("nan")}


def fit_table(medians_by_key):
    """``growth = fixed + slope x partition`` through the ``wide`` medians of two (or more: least squares) sizes,
    per method, dtype and rank count; printed as a second table."""
    groups = {}
    for (case, method, dtype, ranks), med in medians_by_key.items():
        if case.startswith("wide"):
            groups.setdefault((method, dtype, ranks), []).append((med["worker_partition_mb"], med["worker_growth_mb"]))
    if not any(len(points) >= 2 for points in groups.values()):
        return {}
    print(f"\nwide: worst worker's growth = fixed + slope x partition over the sizes (medians)\n"
          f"{'method':<6s} {'dtype':<8s} {'P':>2s} {'parts MB':>16s} {'growth MB':>16s} {'slope':>6s} {'fixed MB':>8s}")
    fits = {}
    for (method, dtype, ranks), points in sorted(groups.items()):
        if len(points) < 2:
            continue
        part, grown = np.array(points).T
        slope, fixed = np.polyfit(part, grown, 1)
        fits[f"{method}/{dtype}/{ranks}"] = {"slope": float(slope), "fixed_mb": float(fixed), "points": points}
        print(f"{method:<6s} {dtype:<8s} {ranks:2d} {','.join(f'{p:.1f}' for p in part):>16s} "
              f"{','.join(f'{g:.1f}' for g in grown):>16s} {slope:6.3f} {fixed:8.2f}", flush=True)
    return fits


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kind, default in OPTIONS:
        ap.add_argument(flag, type=kind, default=default)
    ap.add_argument("--no-test", action="store_true",
                    help="train without the test file (the workers' test metrics import scikit-learn: ~59 MB a rank)")
    args = ap.parse_args()
    work, everything, by_key = work_dir(args.work, "hpcmtl-float32-"), {}, {}
    cases = [c2 for c in args.cases.split(",")
             for c2 in ([f"wide{r}" for r in args.wide_rows.split(",")] if c == "wide" else [c])]
    dtypes = args.dtypes.split(",")
    print(f"medians of {args.repeats}; to rel. gap {args.tol:g} ('>' not reached in {args.max_rounds} rounds); "
          f"grow/part: (peak - RSS before data) / partition of the worst worker\n"
          f"{'case':<9s} {'method':<6s} {'dtype':<8s} {'P':>2s} {'file MB':>8s} {'part MB':>8s} {'peak MB':>8s} "
          f"{'worker':>8s} {'grow/part':>9s} {'s/round':>9s} {'rounds':>7s} {'error':>8s}", flush=True)
    grid = itertools.product(cases, args.methods.split(","), dtypes, [int(r) for r in args.ranks.split(",")])
    for case, method, dtype, ranks in grid:
        file_mb = os.path.getsize(datasets(case, work, (dtype,))[dtype][0]) / 2 ** 20
        runs = [run_once(case, method, dtype, ranks, args, work) for _ in range(args.repeats)]
        everything[f"{case}/{method}/{dtype}/{ranks}"] = runs
        med, mark = medians(runs)
        by_key[(case, method, dtype, ranks)] = med
        print(f"{case:<9s} {method:<6s} {dtype:<8s} {ranks:2d} {file_mb:8.2f} {med['partition_mb']:8.2f} "
              f"{med['peak_rss_mb']:8.1f} {med['worker_peak_rss_mb']:8.1f} {med['worker_growth_per_partition']:9.3f} "
              f"{med['seconds_per_round']:9.4f} {mark + str(int(med['rounds'])):>7s} {med['error_rate']:8.5f}",
              flush=True)
    everything["wide_fits"] = fit_table(by_key)
    save_json(args.json, everything)


if __name__ == "__main__":
    main()
