"""Rounds per second of the implicit L-inf update against k independent Passive-Aggressive updates
written the obvious way in NumPy, in the same run (paper 004's RCV1 shape: k = 104 tasks, sparse
shared instances with about 80 non-zeros).

The NumPy reference is what one writes without a compiled kernel: per round, margins
``x.data @ W[x.indices]``, PA-I steps ``tau = min(C, loss / ||x||^2)`` for every task and
``W[x.indices] += outer(x.data, tau * y)``.  The implicit update does more work per round
(it couples the tasks through an O(k log k) solve) yet must run >= 100,000 rounds/s in one
process.  Medians over --repeats runs.  With --engine it also times ``hpcmtl train online`` on
the same stream (one process and mpiexec -n 3, blocks of 64 rounds) for the cost of the
distributed protocol.

    python bench/bench_online.py [--rounds 200000] [--repeats 5] [--engine]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import scipy.sparse as sp
from timing import median_time

from hpcmtl import store
from hpcmtl.estimators import OnlineMultitask


def rcv1_like_stream(n_rounds, d=47236, k=104, nnz=80, seed=0, zipf=True):
    """Unit-norm sparse instances; ~1.5 positive labels a round from noisy linear separators.

    Words are drawn with Zipf-like frequencies (p(f) ~ 1 / (f + 10)), as in text; ``zipf=False``
    draws them uniformly, the worst case for the cache (every row of W equally likely).
    """
    rng = np.random.default_rng(seed)
    if zipf:
        p = 1.0 / (np.arange(d) + 10.0)
        cols = np.sort(rng.choice(d, size=(n_rounds, nnz), p=p / p.sum()), axis=1)
    else:
        cols = np.sort(rng.integers(0, d, size=(n_rounds, nnz)), axis=1)
    vals = rng.exponential(size=(n_rounds, nnz))
    X = sp.csr_matrix((vals.ravel(), cols.ravel(), np.arange(0, n_rounds * nnz + 1, nnz)), shape=(n_rounds, d))
    X.sum_duplicates()
    X = sp.csr_matrix(sp.diags(1.0 / np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())) @ X)
    Wt = rng.normal(size=(d, k)) * (rng.uniform(size=(d, k)) < 0.05)
    Z = np.asarray(X @ Wt)
    Y = np.where(Z > np.quantile(Z, 0.985, axis=0), 1.0, -1.0)
    Y[rng.uniform(size=Y.shape) < 0.002] *= -1
    return X, Y


def numpy_pa(X, Y, C):
    """k independent PA-I learners, one NumPy step per round."""
    W = np.zeros((X.shape[1], Y.shape[1]))
    indptr, indices, data = X.indptr, X.indices, X.data
    for t in range(X.shape[0]):
        idx = indices[indptr[t]:indptr[t + 1]]
        x = data[indptr[t]:indptr[t + 1]]
        margins = x @ W[idx]
        loss = np.maximum(0.0, 1.0 - Y[t] * margins)
        tau = np.minimum(C, loss / (x @ x))
        W[idx] += np.outer(x, tau * Y[t])
    return W


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200000)
    ap.add_argument("--numpy-rounds", type=int, default=10000, help="rounds timed for the (slow) NumPy loop")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--C", type=float, default=0.1)
    ap.add_argument("--uniform", action="store_true", help="uniform word frequencies (cache worst case)")
    ap.add_argument("--engine", action="store_true", help="also time `hpcmtl train online` (P = 1 and 3)")
    args = ap.parse_args()
    X, Y = rcv1_like_stream(args.rounds, zipf=not args.uniform)
    print(f"stream ({'uniform' if args.uniform else 'Zipf'} word frequencies): {X.shape[0]} rounds, d = {X.shape[1]}, k = {Y.shape[1]}, {X.nnz / X.shape[0]:.1f} non-zeros "
          f"a round, {(Y == 1).sum() / X.shape[0]:.2f} positive labels a round")

    def implicit():
        return OnlineMultitask(update="implicit", norm="linf", C=args.C).partial_fit(X, Y)

    t_imp, all_imp = median_time(implicit, args.repeats)
    model = implicit()
    n = args.numpy_rounds
    t_np, all_np = median_time(lambda: numpy_pa(X[:n], Y[:n], args.C), args.repeats)
    rate_imp, rate_np = X.shape[0] / t_imp, n / t_np
    print(f"{'':28s} {'rounds/s (median)':>18s}   runs (s)")
    print(f"{'implicit L-inf (hpcmtl)':28s} {rate_imp:18,.0f}   " + " ".join(f"{v:.3f}" for v in all_imp))
    print(f"{'k PA-I updates (NumPy loop)':28s} {rate_np:18,.0f}   " + " ".join(f"{v:.3f}" for v in all_np))
    print(f"ratio implicit / NumPy: {rate_imp / rate_np:.1f}x   target >= 100,000 rounds/s: "
          f"{'met' if rate_imp >= 1e5 else 'NOT met'}")
    h = model.history_
    print(f"(implicit run: inf-error rate {h['inf_error'].mean():.4f}, 1-error rate "
          f"{h['n_errors'].sum() / (len(h['round']) * Y.shape[1]):.5f})")
    if args.engine:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "s.h5")
            store.write_stream(path, X, Y)
            bindir = os.path.dirname(sys.executable)
            for P in (1, 3):
                cmd = [sys.executable, "-m", "hpcmtl", "train", "online", "--stream", path, "--out",
                       os.path.join(d, "r.h5"), "--norm", "linf", "--C", str(args.C), "--quiet", "--force"]
                if P > 1:
                    cmd = [os.path.join(bindir, "mpiexec"), "-n", str(P)] + cmd
                times = []
                for _ in range(args.repeats):
                    subprocess.run(cmd, check=True)
                    times.append(store.read_result(os.path.join(d, "r.h5"))["trace"]["seconds"][-1])
                print(f"train online, P = {P}: {X.shape[0] / statistics.median(times):,.0f} rounds/s "
                      f"(training loop, median of {args.repeats})")


if __name__ == "__main__":
    main()
