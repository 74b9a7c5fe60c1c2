"""A graph kernel as the fixed task covariance at many tasks (issue 35): dense (task_kernel) against held sparse
(hpcmtl.covariance.GraphSigma), in one run.

For each m (``--tasks``), graph (``--graphs``: ``chain``, ``grid`` = the squarest R x C with R C = m, ``star``, or
any topology name) and path (``--paths dense,sparse``; dense only up to ``--dense-max`` tasks: its m x m arrays):
m tasks of 20-40 rows (uniform), d features (default 20), squared loss, weight vectors drifting along the graph's
task order, ``train graph``'s arithmetic through the Python API on one process (P = 1: rank 0 is every rank), each
case in a child process of its own (its peak memory its own).  Printed per case:

* ``build``: CPU seconds to build Sigma from the topology's name: the adjacency and ``task_kernel``'s m x m inverse
  (dense), or the sparse Laplacian, its LU and ``diag((L + diag(alpha))^-1)`` (sparse; ``diag`` alone beside it,
  with the method the cost model picked and the bandwidth after reverse Cuthill-McKee);
* ``round``: the median CPU seconds of a coupled round (``Server.round_steps``: the workers' local steps, the step
  problem, ``W = B Sigma / lam``), and of its server part alone (``StepSolver.take_steps`` + ``recompute_w``);
* ``peak MB``: the process's peak RSS, and above the data (its RSS once the tasks are generated);
* the rounds run (``--max-rounds``, tol 1e-12: every round is a coupled one) and the last relative gap.

    python bench/bench_graph_tasks.py [--tasks 1000,10000,100000] [--graphs chain,grid] [--d 20]
        [--paths dense,sparse] [--dense-max 3000] [--max-rounds 10] [--alpha 0.1] [--lam 1e-2] [--json FILE]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

from timing import save_json


def grid_name(m):
    rows = int(np.sqrt(m))
    while m % rows:
        rows -= 1
    return f"grid {rows}x{m // rows}"


def child(m, graph, path, d, max_rounds, alpha, lam, seed=35):
    """One case, in this process: prints one JSON line."""
    from hpcmtl import covariance, task_graph
    from hpcmtl.cluster import Cluster
    from hpcmtl.dmtrl import DMTRLConfig, server, steps, train
    from hpcmtl.estimators import MemoryTasks

    rng = np.random.default_rng(seed)
    walk = np.cumsum(0.2 * rng.normal(size=(m, d)), axis=0)           # neighbours in task order alike
    drift = walk / np.sqrt(np.arange(1, m + 1))[:, None] + rng.normal(size=d)
    Xs, ys = [], []
    for t in range(m):
        X = rng.normal(size=(int(rng.integers(20, 41)), d))
        Xs.append(X)
        ys.append(X @ drift[t] + 0.3 * rng.normal(size=X.shape[0]))
    names = [f"t{i}" for i in range(m)]
    rss_data = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    name = grid_name(m) if graph == "grid" else graph

    diag = {}
    inverse_diagonal = covariance.inverse_diagonal

    def timed_diag(P, what="graph", plan=None, lu=None):
        start = time.process_time()
        out = inverse_diagonal(P, what, plan, lu)
        diag["cpu"] = time.process_time() - start
        return out
    covariance.inverse_diagonal = timed_diag
    task_graph.SPARSE_GRAPH_MIN_TASKS = 0 if path == "sparse" else 10 ** 12
    from hpcmtl.engine import one_blas_thread
    start = time.process_time()
    with one_blas_thread():               # as in a run (engine.train), where the server first uses the diagonal
        A = task_graph.graph_adjacency(name, names, sparse=path == "sparse")
        Sigma = task_graph.graph_covariance(A, alpha, True, names, what=f"graph '{name}'")
        if path == "sparse":
            Sigma.khat_diag               # computed at its first use (the server's): here, inside the build
    build = time.process_time() - start
    rss_sigma = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    info = {}
    if path == "sparse":
        method, _, b = Sigma._plan
        lu_nnz = Sigma.lu.L.nnz + Sigma.lu.U.nnz
        info = dict(bandwidth=b, lu_nnz=lu_nnz, band_flops=float(m) * max(b, 1) ** 2,
                    solve_flops=2.0 * m * lu_nnz, method=method)

    rounds, serverside = [], []

    def wrap(owner, name, sink):
        original = getattr(owner, name)

        def timed(self, *args, **kwargs):
            start = time.process_time()
            out = original(self, *args, **kwargs)
            sink.append(time.process_time() - start)
            return out
        setattr(owner, name, timed)
    wrap(server.Server, "round_steps", rounds)
    wrap(steps.StepSolver, "take_steps", serverside)
    recompute = []
    wrap(server.Server, "recompute_w", recompute)
    config = DMTRLConfig(loss="squared", lam=lam, relationship="fixed", tol=1e-12, max_rounds=max_rounds,
                         fit_intercept=False)
    start = time.process_time()
    r = train(Cluster.serial(), MemoryTasks(Xs, ys, names=names), config, sigma_fixed=Sigma, warn=lambda msg: None)
    total = time.process_time() - start
    server_part = [a + b for a, b in zip(serverside, recompute[-len(serverside):])]
    print(json.dumps(dict(m=m, graph=name, path=path, build_cpu=build, diag_cpu=diag.get("cpu"),
                          round_cpu=statistics.median(rounds) if rounds else None,
                          server_cpu=statistics.median(server_part) if server_part else None,
                          train_cpu=total, rounds=len(rounds), rel_gap=float(r.history["rel_gap"][-1]),
                          peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, data_mb=rss_data,
                          sigma_mb=rss_sigma, sparse=type(Sigma).__name__ == "GraphSigma", **info)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="1000,10000,100000")
    ap.add_argument("--graphs", default="chain,grid")
    ap.add_argument("--paths", default="dense,sparse")
    ap.add_argument("--dense-max", type=int, default=3000)
    ap.add_argument("--d", type=int, default=20)
    ap.add_argument("--max-rounds", type=int, default=10)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--lam", type=float, default=1e-2)
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=3, metavar=("M", "GRAPH", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        m, graph, path = args.child
        return child(int(m), graph, path, args.d, args.max_rounds, args.alpha, args.lam)
    results = []
    head = (f"{'m':>7} {'graph':>13} {'path':>6} {'build s':>8} {'diag s':>7} {'method':>7} {'band':>5} "
            f"{'round s':>8} {'server s':>8} {'peak MB':>8} {'+data MB':>8} {'rounds':>6} {'rel gap':>9}")
    print(head, flush=True)
    for m in (int(v) for v in args.tasks.split(",")):
        for graph in args.graphs.split(","):
            for path in args.paths.split(","):
                if path == "dense" and m > args.dense_max:
                    print(f"{m:>7} {graph:>13} {path:>6}  not run: m x m arrays of {m * m * 8 / 2 ** 20:.0f} MB "
                          f"(--dense-max {args.dense_max})", flush=True)
                    continue
                cmd = [sys.executable, os.path.abspath(__file__), "--child", str(m), graph, path, "--d", str(args.d),
                       "--max-rounds", str(args.max_rounds), "--alpha", str(args.alpha), "--lam", str(args.lam)]
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode != 0:
                    line = (out.stderr.strip().splitlines() or ["?"])[-1]
                    print(f"{m:>7} {graph:>13} {path:>6}  failed: {line}", flush=True)
                    results.append(dict(m=m, graph=graph, path=path, error=line))
                    continue
                row = json.loads(out.stdout.strip().splitlines()[-1])
                results.append(row)
                diag = "-" if row["diag_cpu"] is None else f"{row['diag_cpu']:.2f}"
                print(f"{m:>7} {row['graph']:>13} {path:>6} {row['build_cpu']:>8.2f} {diag:>7} "
                      f"{row.get('method', '-'):>7} {row.get('bandwidth', '-'):>5} {row['round_cpu']:>8.3f} "
                      f"{row['server_cpu']:>8.3f} {row['peak_mb']:>8.0f} {row['peak_mb'] - row['data_mb']:>8.0f} "
                      f"{row['rounds']:>6} {row['rel_gap']:>9.2e}", flush=True)
    pairs = {}
    for row in results:
        if "error" not in row:
            pairs.setdefault((row["m"], row["graph"]), {})[row["path"]] = row
    for (m, graph), both in pairs.items():
        if "dense" in both and "sparse" in both:
            d, s = both["dense"], both["sparse"]
            print(f"m {m} {graph}: dense / sparse  build {d['build_cpu'] / s['build_cpu']:.1f}x, round "
                  f"{d['round_cpu'] / s['round_cpu']:.2f}x, server {d['server_cpu'] / s['server_cpu']:.1f}x, "
                  f"peak above the data {(d['peak_mb'] - d['data_mb']) / max(s['peak_mb'] - s['data_mb'], 1):.1f}x")
    if args.json:
        save_json(args.json, results)


if __name__ == "__main__":
    main()
