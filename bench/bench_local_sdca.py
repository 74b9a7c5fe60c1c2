"""Local SDCA vs liblinear (dual coordinate descent, -s 3) on one hinge task.

For each problem: liblinear trains with its default stopping rule and we take
the primal objective of its model, P_ll.  Then hpcmtl's compiled local SDCA
runs passes over the same data (H = n_i, rho sigma / lam = 1 / lam: the exact
single-task SDCA) until its primal objective is at most P_ll.  Reported: the
median time of each over several runs and their ratio (hpcmtl / liblinear;
below 1 means hpcmtl is faster), in CPU seconds of the calling thread (both
solvers run in it, one thread each: on a crowded node the wall clock mostly
measures the others) and in wall seconds.  Solver time only: liblinear's conversion of
the rows (``problem``) and our row norms are not timed, nor are the objective
evaluations between our passes (liblinear's own stopping checks are part of
its time).

    python bench/bench_local_sdca.py [--repeats 3] [--small] [--kinds dense,sparse]
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


class Clock:
    """Wall and CPU seconds (of this thread) of the timed sections, added up."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def __enter__(self):
        self.t, self.c = time.perf_counter(), time.thread_time()
        return self

    def __exit__(self, *exc):
        self.wall += time.perf_counter() - self.t
        self.cpu += time.thread_time() - self.c


def run_liblinear(X, y, lam):
    C = 1.0 / (lam * X.shape[0])          # (1/n) sum hinge + lam/2 ||w||^2  <=>  C = 1/(lam n)
    prob = problem(y, X)                  # the conversion to liblinear's rows: not solver time
    with Clock() as clock:
        model = train(prob, parameter(f"-s 3 -c {C} -B -1 -q"))
    w = np.array([model.w[k] for k in range(X.shape[1])])
    if model.get_labels()[0] != 1:
        w = -w
    return clock, primal(X, y, w, lam)


def run_hpcmtl(X, y, lam, target, seed, shrinking=True, max_epochs=2000):
    blk = TaskBlock(0, "t", X.shape[0], 0, X, y)
    n, d = X.shape
    alpha, b, delta_b = np.zeros(n), np.zeros(d), np.empty(d)
    order = np.arange(n, dtype=np.int32)
    shrink = _sdca.new_shrink_state(n, shrinking)
    _ = blk.sq_norms
    clock = Clock()
    for epoch in range(1, max_epochs + 1):
        w = b / lam
        with clock:
            _sdca.sdca_local(blk.rows, blk.y, alpha, w, delta_b, blk.sq_norms, order, shrink, 0, 1.0,
                             1.0 / lam, float(n), 1.0, seed * 100003 + epoch)
            b += delta_b
        if primal(X, y, b / lam, lam) <= target:
            return clock, epoch
    clock.wall = clock.cpu = float("inf")
    return clock, max_epochs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="smaller problems (smoke test)")
    ap.add_argument("--kinds", default="dense,sparse")
    args = ap.parse_args()
    print(f"median of {args.repeats}; ratio = hpcmtl / liblinear (CPU seconds, wall seconds)")
    print(f"{'problem':<26s} {'liblinear CPU':>13s} {'hpcmtl CPU':>10s} {'ratio':>6s} {'no-shrink':>9s} "
          f"{'ratio':>6s} | {'wall ratio':>10s} {'no-shrink':>9s} | {'rounds':>6s}  P_liblinear")
    for kind in args.kinds.split(","):
        X, y = make(kind, small=args.small)
        lam = 1.0 / X.shape[0]            # C = 1
        ll, ours, epochs, plain = [], [], [], []
        for r in range(args.repeats):
            clock, target = run_liblinear(X, y, lam)
            ll.append(clock)
            clock, ep = run_hpcmtl(X, y, lam, target, seed=r)
            ours.append(clock)
            epochs.append(ep)
            plain.append(run_hpcmtl(X, y, lam, target, seed=r, shrinking=False)[0])
        label = f"{kind} {X.shape[0]}x{X.shape[1]}" + (f" ({X.nnz / X.shape[0] / X.shape[1]:.1%})" if kind == "sparse" else "")
        cpu = [statistics.median(c.cpu for c in runs) for runs in (ll, ours, plain)]
        wall = [statistics.median(c.wall for c in runs) for runs in (ll, ours, plain)]
        print(f"{label:<26s} {cpu[0]:13.3f} {cpu[1]:10.3f} {cpu[1] / cpu[0]:6.2f} {cpu[2]:9.3f} {cpu[2] / cpu[0]:6.2f} | "
              f"{wall[1] / wall[0]:10.2f} {wall[2] / wall[0]:9.2f} | {int(statistics.median(epochs)):6d}  {target:.6f}",
              flush=True)


if __name__ == "__main__":
    main()
