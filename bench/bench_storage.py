"""Dense rows against CSR rows of the same values: local SDCA passes and the objective pass, by density.

What ``hpcmtl data convert`` stores decides which row kernels every method runs.  For each
density, one hinge task of n rows and d features (uniform values, each kept with probability
= the density; MNIST is d = 784 at density 0.19) is written both ways, and the compiled local
SDCA (three passes, no shrinking, from alpha = 0) and ``objective_terms`` run on each.
Reported: medians over ``--repeats`` runs and the ratio CSR / dense measured in the same run
(below 1: CSR is faster), and the bytes of each storage.

    python bench/bench_storage.py [--repeats 5] [--n 20000] [--d 784]
"""
import argparse

import numpy as np
import scipy.sparse as sp

from hpcmtl import _sdca
from hpcmtl.losses import get_loss
from hpcmtl.taskdata import TaskBlock
from timing import median_time

HINGE = int(get_loss("hinge").kernel_id)


def task(n, d, density, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d)) * (rng.random((n, d)) < density)
    z = X @ rng.normal(size=d)
    return X, np.where(z > np.median(z), 1.0, -1.0)


def timings(X, y, repeats, lam=1e-3):
    """(median seconds of 3 local SDCA passes, of one objective pass) on the block of X."""
    n, d = X.shape
    blk = TaskBlock(0, "t", n, 0, X, y)
    _ = blk.sq_norms

    def sdca():
        alpha, w, db = np.zeros(n), np.zeros(d), np.empty(d)
        order = np.arange(n, dtype=np.int32)
        _sdca.sdca_local(blk.rows, blk.y, alpha, w, db, blk.sq_norms, order, _sdca.new_shrink_state(n, False),
                            HINGE, 0.0, 1.0 / lam, float(n), 3.0, 1)

    w = np.random.default_rng(1).normal(size=d) * 1e-2
    alpha = np.full(n, 0.5) * y

    def objective():
        _sdca.objective_terms(blk.rows, blk.y, alpha, w, HINGE, 0.0)

    return median_time(sdca, repeats)[0], median_time(objective, repeats)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--d", type=int, default=784)
    ap.add_argument("--densities", default="0.05,0.1,0.19,0.3,0.5,0.7,1.0")
    args = ap.parse_args()
    print(f"{args.n} x {args.d}, medians of {args.repeats}; ratio = CSR / dense (below 1: CSR faster)")
    print(f"{'density':>8} {'SDCA dense':>11} {'SDCA CSR':>9} {'ratio':>6} {'obj dense':>10} {'obj CSR':>8} "
          f"{'ratio':>6} {'MB dense':>9} {'MB CSR':>7}")
    for density in (float(x) for x in args.densities.split(",")):
        X, y = task(args.n, args.d, density)
        C = sp.csr_matrix(X)
        sd, od = timings(X, y, args.repeats)
        sc, oc = timings(C, y, args.repeats)
        mb_csr = (C.data.nbytes + C.nnz * 4 + C.indptr.size * 8) / 1e6      # float64 values, int32 columns
        print(f"{density:8.2f} {sd * 1e3:9.1f}ms {sc * 1e3:7.1f}ms {sc / sd:6.2f} {od * 1e3:8.1f}ms {oc * 1e3:6.1f}ms "
              f"{oc / od:6.2f} {X.nbytes / 1e6:9.1f} {mb_csr:7.1f}", flush=True)


if __name__ == "__main__":
    main()
