"""Local SDCA vs liblinear (dual coordinate descent, -s 3) on one hinge task.

For each problem: liblinear trains with its default stopping rule and we take
the primal objective of its model, P_ll.  Then hpcmtl's compiled local SDCA
runs passes over the same data (H = n_i, rho sigma / lam = 1 / lam: the exact
single-task SDCA) until its primal objective is at most P_ll.  Reported: the
median wall time of each over several runs and their ratio (hpcmtl / liblinear;
below 1 means hpcmtl is faster).  Objective evaluations between our passes are
not timed (liblinear's own stopping checks are part of its time).

    python bench/bench_local_sdca.py [--repeats 5] [--small]
"""
import argparse
import statistics
import time

import numpy as np
import scipy.sparse as sp
from liblinear.liblinearutil import parameter, problem, train

from hpcmtl import _sdca
from hpcmtl.taskdata import TaskBlock


def make(kind, seed=0, small=False):
    rng = np.random.default_rng(seed)
    if kind == "dense":
        n, d = (20000, 100) if not small else (4000, 100)
        X = rng.normal(size=(n, d))
    else:
        n, d = (50000, 20000) if not small else (10000, 20000)
        X = sp.random(n, d, density=0.005, format="csr", random_state=rng, data_rvs=rng.standard_normal)
    w = rng.normal(size=d)
    z = np.asarray(X @ w).ravel()
    y = np.where(z + 0.5 * z.std() * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


def primal(X, y, w, lam):
    return float(np.mean(np.maximum(0.0, 1.0 - y * np.asarray(X @ w).ravel())) + 0.5 * lam * w @ w)


def run_liblinear(X, y, lam):
    C = 1.0 / (lam * X.shape[0])          # (1/n) sum hinge + lam/2 ||w||^2  <=>  C = 1/(lam n)
    t = time.perf_counter()
    model = train(problem(y, X), parameter(f"-s 3 -c {C} -B -1 -q"))
    seconds = time.perf_counter() - t
    w = np.array([model.w[k] for k in range(X.shape[1])])
    if model.get_labels()[0] != 1:
        w = -w
    return seconds, primal(X, y, w, lam)


def run_hpcmtl(X, y, lam, target, seed, shrinking=True, max_epochs=2000):
    blk = TaskBlock(0, "t", X.shape[0], 0, X, y)
    n, d = X.shape
    alpha, b, delta_b = np.zeros(n), np.zeros(d), np.empty(d)
    order = np.arange(n, dtype=np.int32)
    shrink = _sdca.new_shrink_state(n, shrinking)
    _ = blk.sq_norms
    seconds = 0.0
    for epoch in range(1, max_epochs + 1):
        w = b / lam
        t = time.perf_counter()
        _sdca.sdca_local(blk.rows, blk.y, alpha, w, delta_b, blk.sq_norms, order, shrink, 0, 1.0,
                            1.0 / lam, float(n), 1.0, seed * 100003 + epoch)
        b += delta_b
        seconds += time.perf_counter() - t
        if primal(X, y, b / lam, lam) <= target:
            return seconds, epoch
    return float("inf"), max_epochs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--small", action="store_true", help="smaller problems (smoke test)")
    args = ap.parse_args()
    print(f"{'problem':<28s} {'liblinear s':>12s} {'hpcmtl s':>10s} {'ratio':>7s} {'rounds':>7s} "
          f"{'no-shrink s':>12s} {'ratio':>7s}  P_liblinear")
    for kind in ("dense", "sparse"):
        X, y = make(kind, small=args.small)
        lam = 1.0 / X.shape[0]            # C = 1
        ll, ours, epochs, plain = [], [], [], []
        for r in range(args.repeats):
            s, target = run_liblinear(X, y, lam)
            ll.append(s)
            s2, ep = run_hpcmtl(X, y, lam, target, seed=r)
            ours.append(s2)
            epochs.append(ep)
            plain.append(run_hpcmtl(X, y, lam, target, seed=r, shrinking=False)[0])
        label = f"{kind} {X.shape[0]}x{X.shape[1]}" + (f" ({X.nnz / X.shape[0] / X.shape[1]:.1%})" if kind == "sparse" else "")
        a, b, c = statistics.median(ll), statistics.median(ours), statistics.median(plain)
        print(f"{label:<28s} {a:12.3f} {b:10.3f} {b / a:7.2f} {int(statistics.median(epochs)):7d} "
              f"{c:12.3f} {c / a:7.2f}  {target:.6f}", flush=True)


if __name__ == "__main__":
    main()
