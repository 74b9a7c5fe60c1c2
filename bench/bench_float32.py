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
the hinge loss at lam 1e-3.
"""
import argparse
import itertools
import os

import numpy as np

from timing import hpcmtl, medians, save_json, work_dir

from hpcmtl import store, synthetic

CASES = {"sparse": ("hinge", 1e-3), "dense": ("hinge", 1e-3)}
OPTIONS = (("--cases", str, "sparse,dense"), ("--methods", str, "dmtrl,stl"), ("--ranks", str, "1,3"),
           ("--repeats", int, 3), ("--tol", float, 1e-4), ("--max-rounds", int, 500), ("--work", str, None),
           ("--json", str, None))


def datasets(case, work):
    """``{dtype: (train, test)}`` paths of the case, written once."""
    out = {dt: (os.path.join(work, f"{case}-{dt}.h5"), os.path.join(work, f"{case}-{dt}-test.h5"))
           for dt in ("float64", "float32")}
    if all(os.path.exists(p) for pair in out.values() for p in pair):
        return out
    if case == "sparse":
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
    loss, lam = CASES[case]
    tr, te = datasets(case, work)[dtype]
    out = os.path.join(work, f"r-{case}-{method}-{dtype}-{ranks}.h5")
    hpcmtl(["train", method, "--train", tr, "--test", te, "--out", out, "--loss", loss, "--lam", lam,
            "--tol", args.tol, "--max-rounds", args.max_rounds, "--quiet", "--force"], ranks)
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
            "error_rate": float(res["test"]["summary"]["pooled_error_rate"])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kind, default in OPTIONS:
        ap.add_argument(flag, type=kind, default=default)
    args = ap.parse_args()
    work, everything = work_dir(args.work, "hpcmtl-float32-"), {}
    print(f"medians of {args.repeats}; to rel. gap {args.tol:g} ('>' not reached in {args.max_rounds} rounds); "
          f"grow/part: (peak - RSS before data) / partition of the worst worker\n"
          f"{'case':<7s} {'method':<6s} {'dtype':<8s} {'P':>2s} {'file MB':>8s} {'part MB':>8s} {'peak MB':>8s} "
          f"{'worker':>8s} {'grow/part':>9s} {'s/round':>9s} {'rounds':>7s} {'error':>8s}", flush=True)
    grid = itertools.product(args.cases.split(","), args.methods.split(","), ("float64", "float32"),
                             [int(r) for r in args.ranks.split(",")])
    for case, method, dtype, ranks in grid:
        file_mb = os.path.getsize(datasets(case, work)[dtype][0]) / 2 ** 20
        runs = [run_once(case, method, dtype, ranks, args, work) for _ in range(args.repeats)]
        everything[f"{case}/{method}/{dtype}/{ranks}"] = runs
        med, mark = medians(runs)
        print(f"{case:<7s} {method:<6s} {dtype:<8s} {ranks:2d} {file_mb:8.2f} {med['partition_mb']:8.2f} "
              f"{med['peak_rss_mb']:8.1f} {med['worker_peak_rss_mb']:8.1f} {med['worker_growth_per_partition']:9.2f} "
              f"{med['seconds_per_round']:9.4f} {mark + str(int(med['rounds'])):>7s} {med['error_rate']:8.5f}",
              flush=True)
    save_json(args.json, everything)


if __name__ == "__main__":
    main()
