"""Rounds and seconds to a certified relative gap on every W-step: each aggregation against the safe rho.

A full DMTRL run per case (10 outer steps, --outer-tol 0, --tol 1e-6 on every
W-step), P = 3 by default (``--ranks 1`` runs serially), the median of
``--repeats`` runs of each method, and the ratio against the paper's safe rho
(``--aggregation safe``) measured in the same run.  Where an exact centralized
MTRL objective exists (squared loss: ``baselines.mtrl_central`` solves each
W-step as one linear system) the final objective is compared with it after the
same number of outer steps.  A run whose W-steps do not all reach the
tolerance within ``--max-rounds`` (``--safe-max-rounds`` for safe) is shown
with ``>``: its rounds are a lower bound.

    python bench/bench_convergence.py [--ranks 3] [--repeats 3] [--cases syn1,school-raw-2,...]
        [--methods safe,qp] [--work DIR]

Cases: syn1, syn2 (paper 001's Synthetic 1/2, hinge, lam 1e-3), school-raw-2,
school-raw-3, school-std-2, school-std-3 (School as shipped / standardized,
squared loss, lam 1e-2 / 1e-3), small (30 generated tasks of 30-50 rows, 9
features, hinge, lam 1e-4), mnist (10 one-vs-all tasks, hinge, lam 1e-3), mds
(4 sentiment domains, hinge, lam 1e-3), small-raw: 29 tasks of 30-50 rows, 9 raw
positive skewed features on scales 0.1-10, 15 % positive labels, hinge, lam 1e-4
(its learned Sigma has rank 10 of 29, the rest at the eigenvalue floor).  On
small and small-raw the coupled W-steps are interior-point rounds
(``hpcmtl/interior.py``); measured at P = 3, medians of 3 (safe: 1 run): small
177 rounds, 2.7 s, every W-step certified (safe: > 50,000 rounds, 122 s, worst
gap 1.2e-2; the 'qp' rounds before the interior-point ones: 1,446 rounds,
19.7 s), small-raw 207 rounds, 3.3 s (safe: > 50,000 rounds, 119 s, worst gap
0.86; 'qp' before: 9 of 10 W-steps unconverged after 500 rounds each).  With the margin corrections of
stalled box-loss W-steps (dmtrl.margin_correction), P = 3, medians of 3 (safe: 1 run): syn1 523 -> 219
rounds, 7.6 -> 4.0 s (safe 8,465 rounds, 74.6 s: 38.7x rounds, 18.5x seconds), syn2 778 -> 287 rounds,
10.7 -> 4.9 s (safe 19,899 rounds, 165 s: 69x, 33.5x); small, small-raw, mnist and mds unchanged (mnist 71
rounds, 8.3 s against safe 875 rounds: 12.3x, 8.5x; mds 212 rounds, 1.9 s against 2,521: 11.9x, 6.0x).
Without the corrections that cost more than a few passes (dmtrl.margin.MARGIN_FLOPS_PER_VALUE: on MDS's 10,000 sparse
features they cost 10 % of the run and helped no W-step), P = 3, medians of 3 (safe: 1 run): mds 212 rounds,
1.78 s against 2,521 rounds, 12.07 s (11.9x, 6.8x); mnist 71 rounds, 9.60 s against 875 rounds, 84.0 s (12.3x,
8.7x).  With the corrections in every round within dmtrl.margin.MARGIN_NEAR = 30 times --tol, per-task scales and
sparse rows through the free rows' Gram matrix, P = 3, medians of 3 (mnist's safe: 1 run), the safe rho
measured in the same run: mds 139 rounds, 1.61 s against 2,521 rounds, 13.55 s (18.1x, 8.4x; before, that
day: 212 rounds, 2.37 s against 19.31 s, 8.1x); mnist 33 rounds, 5.23 s against 875 rounds, 65.5 s (26.5x,
12.5x).  MARGIN_NEAR = 100 (a correction in twice as many rounds): mds 138 rounds, 2.01 s against 15.78 s
(7.8x), mnist 30 rounds, 5.76 s against 75.4 s (13.1x).  P = 1 rounds: syn1 219 -> 185, syn2 287 -> 254;
small and small-raw unchanged (their exact local solvers leave no lag between the primal and the dual).
With the corrections pinning only rows whose coordinate Newton step stays inside (0, 1)
(dmtrl.free_rows), P = 3, medians of 3 (safe: 3 on mds and mnist, 1 elsewhere), the safe rho measured in
the same run: mds 113 rounds, 0.84 s against 2,521 rounds, 10.03 s (22.3x, 11.9x); mnist 33 rounds, 4.33 s
against 875 rounds, 58.9 s (26.5x, 13.6x); syn1 177 rounds, 2.91 s against 8,576, 61.6 s (48.5x, 21.2x);
syn2 246, 3.55 s against 19,885, 137 s (80.8x, 38.6x); small 177, 2.22 s and small-raw 207, 2.29 s against
> 50,000 rounds, 102 s and 103 s; school-raw-2 68 rounds, 0.99 s (+4.9e-8 from the exact objective),
school-raw-3 136, 1.92 s, school-std-2 45, 0.68 s, school-std-3 60, 0.84 s (the safe rho: > 45,044, >
45,392, 3,304 and > 11,417 rounds; 182, 175, 13.6 and 43.8 s); school-default 68 rounds, 1.00 s, +4.9e-8.
``school-default`` is the default
command on raw School at lam 1e-2 (defaults for every stopping rule) against
the exact MTRL objective with the same defaults.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from timing import mpiexec, save_json

from hpcmtl import store

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "data")

CASES = {   # name: (data key, loss, lam)
    "syn1": ("syn1", "hinge", 1e-3),
    "syn2": ("syn2", "hinge", 1e-3),
    "school-raw-2": ("school", "squared", 1e-2),
    "school-raw-3": ("school", "squared", 1e-3),
    "school-std-2": ("school-std", "squared", 1e-2),
    "school-std-3": ("school-std", "squared", 1e-3),
    "small": ("small", "hinge", 1e-4),
    "small-raw": ("small-raw", "hinge", 1e-4),
    "mnist": ("mnist", "hinge", 1e-3),
    "mds": ("mds", "hinge", 1e-3),
    "school-default": ("school", "squared", 1e-2),
}


def hpcmtl(args, ranks=None, check=True):
    cmd = [sys.executable, "-m", "hpcmtl"] + [str(a) for a in args]
    if ranks and ranks > 1:
        cmd = mpiexec(ranks) + cmd
    return subprocess.run(cmd, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def small_tasks(path, seed=0):
    """30 related hinge tasks of 30-50 rows and 9 features (8 Gaussian and a constant), noisy labels."""
    rng = np.random.default_rng(seed)
    m, d = 30, 9
    base = rng.normal(size=d)
    Xs, ys = [], []
    for _ in range(m):
        n = int(rng.integers(30, 51))
        w = base + 0.7 * rng.normal(size=d)
        X = rng.normal(size=(n, d))
        X[:, -1] = 1.0
        Xs.append(X)
        ys.append(np.where(X @ w + 0.8 * rng.normal(size=n) > 0, 1.0, -1.0))
    store.write_tasks(path, Xs, ys, names=[f"t{i:02d}" for i in range(m)], force=True)


def small_raw_tasks(path, seed=0):
    """29 hinge tasks of 30-50 rows and 9 raw features: positive, skewed (Gamma(2)), on scales 0.1-10 (one per
    feature), two groups of related tasks, 15 % positive labels (the shape of a radar-measurement dataset, not
    standardized)."""
    rng = np.random.default_rng(seed)
    groups = [rng.normal(size=9) for _ in range(2)]
    scales = rng.uniform(0.1, 10, 9)
    Xs, ys = [], []
    for t in range(29):
        n = int(rng.integers(30, 51))
        w = groups[t >= 15] + 0.5 * rng.normal(size=9)
        X = rng.gamma(2.0, 1.0, size=(n, 9)) * scales
        s = (X - X.mean(0)) @ w / 3.0
        Xs.append(X)
        ys.append(np.where(s + rng.normal(0, 0.5 * s.std() + 1e-9, n) > np.quantile(s, 0.85), 1.0, -1.0))
    store.write_tasks(path, Xs, ys, names=[f"t{i:02d}" for i in range(29)], force=True)


def dataset(key, work):
    """Path of a case's training file, made on first use in ``work``."""
    path = os.path.join(work, key + ".h5")
    if os.path.exists(path):
        return path
    if key in ("syn1", "syn2"):
        hpcmtl(["data", "synth", "dmtrl" + key[-1], path, "--force"])
    elif key == "school":
        hpcmtl(["data", "convert", "--format", "malsar", os.path.join(SHARED, "school.mat"), path, "--force"])
    elif key == "school-std":
        hpcmtl(["data", "standardize", dataset("school", work), path, "--force"])
    elif key == "small":
        small_tasks(path)
    elif key == "small-raw":
        small_raw_tasks(path)
    elif key == "mnist":
        hpcmtl(["data", "convert", "--format", "mnist", os.path.join(SHARED, "mnist"), path, "--force"])
    elif key == "mds":
        hpcmtl(["data", "convert", "--format", "mds", os.path.join(SHARED, "mds"), path, "--force"])
    return path


def run_once(case, method, args, work):
    key, loss, lam = CASES[case]
    out = os.path.join(work, f"r-{case}-{method}.h5")
    train = ["train", "dmtrl", "--train", dataset(key, work), "--out", out, "--loss", loss, "--lam", lam,
             "--aggregation", method, "--quiet", "--force"]
    if case != "school-default":
        cap = args.safe_max_rounds if method == "safe" else args.max_rounds
        train += ["--tol", args.tol, "--outer", args.outer, "--outer-tol", "0", "--max-rounds", cap]
    r = hpcmtl(train, args.ranks, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{case} {method}: exit {r.returncode}: {r.stderr.strip()}")
    res = store.read_result(out)
    h, steps = res["history"], res["wsteps"]
    return {"rounds": int(h["round"][-1]), "seconds": float(h["seconds"][-1]), "primal": float(h["primal"][-1]),
            "converged": bool(res["model"]["converged"]), "wsteps": len(steps["round"]),
            "worst_rel_gap": float(np.max(steps["rel_gap"])),
            "max_rounds_per_wstep": int(np.max(np.diff(np.concatenate([[0], steps["round"]]))))}


def exact_objective(case, args, work):
    """The centralized MTRL objective after the same outer steps (squared loss: exact W-steps)."""
    from hpcmtl.baselines import mtrl_central
    from hpcmtl.dmtrl import DMTRLConfig
    key, loss, lam = CASES[case]
    if loss != "squared":
        return None
    if case == "school-default":
        config = DMTRLConfig(loss=loss, lam=lam)
    else:
        config = DMTRLConfig(loss=loss, lam=lam, outer=args.outer, outer_tol=0)
    with store.TaskFile(dataset(key, work)) as source:
        r = mtrl_central(source, config)
    return float(r.history["primal"][-1]), float(np.max(np.abs(r.history["rel_gap"])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", default="syn1,syn2,school-raw-2,school-raw-3,school-std-2,school-std-3,small,small-raw,"
                                       "mnist,mds,school-default")
    ap.add_argument("--methods", default="safe,qp", help="the first is the reference of the ratios")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--outer", type=int, default=10)
    ap.add_argument("--max-rounds", type=int, default=5000, help="rounds per W-step (methods other than safe)")
    ap.add_argument("--safe-max-rounds", type=int, default=5000, help="rounds per W-step for the safe rho")
    ap.add_argument("--safe-repeats", type=int, default=None, help="repeats of the safe rho (default: --repeats)")
    ap.add_argument("--work", default=None, help="folder for data and results (default: a temporary one)")
    ap.add_argument("--json", default=None, help="also write every run's numbers here")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="hpcmtl-bench-")
    os.makedirs(work, exist_ok=True)
    methods = args.methods.split(",")
    everything = {}
    header = (f"{'case':<15s} {'method':<9s} {'rounds':>9s} {'ratio':>7s} {'seconds':>9s} {'ratio':>7s} "
              f"{'max/W-step':>10s} {'worst gap':>9s} {'objective':>15s} {'vs exact':>9s}")
    print(f"P = {args.ranks}, medians of {args.repeats} (safe: {args.safe_repeats or args.repeats}), tol {args.tol:g} "
          f"on every W-step, outer {args.outer}, outer-tol 0, at most {args.max_rounds} rounds a W-step (safe: "
          f"{args.safe_max_rounds}; '>': some W-step stopped there) (school-default: the default command)", flush=True)
    print(header, flush=True)
    for case in args.cases.split(","):
        exact = exact_objective(case, args, work)
        reference = None
        for method in methods:
            repeats = args.safe_repeats if method == "safe" and args.safe_repeats else args.repeats
            runs = [run_once(case, method, args, work) for _ in range(repeats)]
            everything[f"{case}/{method}"] = runs
            rounds = statistics.median(r["rounds"] for r in runs)
            seconds = statistics.median(r["seconds"] for r in runs)
            last = runs[-1]
            if reference is None:
                reference = (rounds, seconds)
            mark = "" if last["converged"] else ">"
            vs = "" if exact is None else f"{(last['primal'] - exact[0]) / abs(exact[0]):+9.1e}"
            print(f"{case:<15s} {method:<9s} {mark + str(int(rounds)):>9s} {reference[0] / rounds:7.1f} "
                  f"{seconds:9.2f} {reference[1] / seconds:7.1f} {last['max_rounds_per_wstep']:10d} "
                  f"{last['worst_rel_gap']:9.1e} {last['primal']:15.10g} {vs:>9s}", flush=True)
        if exact is not None:
            print(f"{case:<15s} {'exact':<9s} {'':>9s} {'':>7s} {'':>9s} {'':>7s} {'':>10s} {exact[1]:9.1e} "
                  f"{exact[0]:15.10g}", flush=True)
    save_json(args.json, everything)


if __name__ == "__main__":
    main()
