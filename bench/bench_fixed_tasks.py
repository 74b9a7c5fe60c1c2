"""A learned result's Sigma as the fixed task covariance at many tasks (issue 35, `train fixed --sigma RESULT.h5`):
dense (the m x m matrix, as before) against held as factors (hpcmtl.covariance.SigmaFactors), in one run.

For each m (``--tasks``) and path (``--paths dense,factors``; dense only up to ``--dense-max`` tasks: its m x m
arrays): m tasks of 20-40 rows (uniform), d features (default 20), squared loss, weight vectors on an r-dimensional
subspace (default r = 5); a learned result's file of those tasks is written with ``Sigma``'s factors (``omega_factors``
of the weights, as a learned run of m >= 512 tasks stores them), then read as ``train fixed`` reads it
(``methods.read_sigma`` + ``dmtrl.check_sigma``: the factors, or for the dense path ``as_dense`` of them) and trained
through the Python API on one process (P = 1), each case in a child process of its own (its peak memory its own),
``--repeat`` times (medians printed).  Per case:

* ``read s``: CPU seconds to read and check Sigma (dense: the m x m matrix and check_sigma's eigensolve);
* ``round s``: the median CPU seconds of a coupled round (``Server.round_steps``: the workers' local steps, the step
  problem, ``W = B Sigma / lam``), and of its server part alone (``StepSolver.take_steps`` + ``recompute_w``, or
  ``spread_steps`` by task chunks from ``spread.SPREAD_MIN_TASKS`` tasks on with factors);
* ``peak MB``: the process's peak RSS, and above the data (its RSS once the tasks are generated);
* the rounds run (``--max-rounds``, tol 1e-12: every round a coupled one) and the last relative gap.

    python bench/bench_fixed_tasks.py [--tasks 1000,10000] [--d 20] [--rank 5] [--paths dense,factors]
        [--dense-max 10000] [--max-rounds 10] [--repeat 3] [--lam 1e-2] [--json FILE]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from timing import save_json


def child(m, path, d, rank, max_rounds, lam, seed=35):
    """One case, in this process: prints one JSON line."""
    from hpcmtl import store
    from hpcmtl.cluster import Cluster
    from hpcmtl.covariance import SigmaFactors, as_dense
    from hpcmtl.dmtrl import DMTRLConfig, check_sigma, server, spread, steps, train
    from hpcmtl.dmtrl.sigma import omega_factors
    from hpcmtl.engine import one_blas_thread
    from hpcmtl.estimators import MemoryTasks
    from hpcmtl.methods import read_sigma

    rng = np.random.default_rng(seed)
    W = rng.normal(size=(m, rank)) @ rng.normal(size=(rank, d))          # the tasks on a rank-r subspace
    Xs, ys = [], []
    for t in range(m):
        X = rng.normal(size=(int(rng.integers(20, 41)), d))
        Xs.append(X)
        ys.append(X @ W[t] + 0.3 * rng.normal(size=X.shape[0]))
    with tempfile.TemporaryDirectory() as tmp:
        learned = os.path.join(tmp, "learned.h5")
        store.write_result(learned, W.T, omega_factors(W, 1e-8), {"round": np.arange(2)}, {}, 1, "bench")
        rss_data = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        start = time.process_time()
        with one_blas_thread():             # as in a run (engine.train)
            Sigma = read_sigma(learned)
            if path == "dense":
                Sigma = as_dense(Sigma)
            Sigma = check_sigma(Sigma, m)
        read = time.process_time() - start

    rounds, server_part, inside = [], [], [0.0]

    def wrap(owner, name, sink=None):
        """Time ``owner.name``: a round's CPU into ``sink``; the server's algebra (sink None) summed over the round."""
        original = getattr(owner, name)

        def timed(self, *args, **kwargs):
            if sink is not None:
                inside[0] = 0.0
            start = time.process_time()
            out = original(self, *args, **kwargs)
            if sink is None:
                inside[0] += time.process_time() - start
            else:
                sink.append(time.process_time() - start)
                server_part.append(inside[0])
            return out
        setattr(owner, name, timed)
    wrap(server.Server, "round_steps", rounds)
    wrap(steps.StepSolver, "take_steps")           # the step problem on rank 0
    wrap(spread.SpreadServer, "spread_steps")      # or by task chunks (from 4096 tasks: W included)
    wrap(server.Server, "recompute_w")
    config = DMTRLConfig(loss="squared", lam=lam, relationship="fixed", tol=1e-12, max_rounds=max_rounds,
                         fit_intercept=False)
    start = time.process_time()
    r = train(Cluster.serial(), MemoryTasks(Xs, ys), config, sigma_fixed=Sigma, warn=lambda msg: None)
    total = time.process_time() - start
    print(json.dumps(dict(m=m, path=path, read_cpu=read, round_cpu=statistics.median(rounds) if rounds else None,
                          server_cpu=statistics.median(server_part) if server_part else None, train_cpu=total,
                          rounds=len(rounds), rel_gap=float(r.history["rel_gap"][-1]),
                          peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, data_mb=rss_data,
                          factors=isinstance(Sigma, SigmaFactors))))


KEYS = ("read_cpu", "round_cpu", "server_cpu", "train_cpu", "peak_mb", "data_mb")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="1000,10000")
    ap.add_argument("--paths", default="dense,factors")
    ap.add_argument("--dense-max", type=int, default=10000)
    ap.add_argument("--d", type=int, default=20)
    ap.add_argument("--rank", type=int, default=5)
    ap.add_argument("--max-rounds", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--lam", type=float, default=1e-2)
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=2, metavar=("M", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(int(args.child[0]), args.child[1], args.d, args.rank, args.max_rounds, args.lam)
    results = []
    print(f"{'m':>7} {'path':>8} {'read s':>8} {'round s':>8} {'server s':>8} {'train s':>8} {'peak MB':>8} "
          f"{'+data MB':>8} {'rounds':>6} {'rel gap':>9}", flush=True)
    for m in (int(v) for v in args.tasks.split(",")):
        for path in args.paths.split(","):
            if path == "dense" and m > args.dense_max:
                print(f"{m:>7} {path:>8}  not run: m x m arrays of {m * m * 8 / 2 ** 20:.0f} MB "
                      f"(--dense-max {args.dense_max})", flush=True)
                continue
            runs = []
            for _ in range(args.repeat):     # one case's runs back to back, each its own process
                cmd = [sys.executable, os.path.abspath(__file__), "--child", str(m), path, "--d", str(args.d),
                       "--rank", str(args.rank), "--max-rounds", str(args.max_rounds), "--lam", str(args.lam)]
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode != 0:
                    runs = (out.stderr.strip().splitlines() or ["?"])[-1]
                    break
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            if isinstance(runs, str):
                print(f"{m:>7} {path:>8}  failed: {runs}", flush=True)
                results.append(dict(m=m, path=path, error=runs))
                continue
            row = dict(runs[0], **{k: statistics.median(run[k] for run in runs) for k in KEYS}, runs=runs)
            results.append(row)
            print(f"{m:>7} {path:>8} {row['read_cpu']:>8.2f} {row['round_cpu']:>8.3f} {row['server_cpu']:>8.3f} "
                  f"{row['train_cpu']:>8.2f} {row['peak_mb']:>8.0f} {row['peak_mb'] - row['data_mb']:>8.0f} "
                  f"{row['rounds']:>6} {row['rel_gap']:>9.2e}", flush=True)
    pairs = {}
    for row in results:
        if "error" not in row:
            pairs.setdefault(row["m"], {})[row["path"]] = row
    for m, both in pairs.items():
        if "dense" in both and "factors" in both:
            a, b = both["dense"], both["factors"]
            print(f"m {m}: dense / factors  read {a['read_cpu'] / b['read_cpu']:.1f}x, round "
                  f"{a['round_cpu'] / b['round_cpu']:.1f}x, server {a['server_cpu'] / b['server_cpu']:.1f}x, "
                  f"peak above the data {(a['peak_mb'] - a['data_mb']) / max(b['peak_mb'] - b['data_mb'], 1):.1f}x; "
                  f"rel gaps {a['rel_gap']:.3e} / {b['rel_gap']:.3e}")
    if args.json:
        save_json(args.json, results)


if __name__ == "__main__":
    main()
