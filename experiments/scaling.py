"""Scaling runs on MNIST-sized (dense) and MDS-sized (sparse) synthetic problems.

``hpcmtl data synth mnist-scale`` (10 tasks, 140,000 x 784 dense at scale 1)
and ``mds-scale`` (22 tasks, 91,000 x 10,000 CSR at 0.9 % density), 70 % for
training.  DMTRL runs a fixed number of rounds under mpiexec -n P; reported per
P: seconds per round, bytes per round, and per worker its data partition and
its peak memory above the interpreter's baseline.

    python experiments/scaling.py --out results/scaling [--scale 1] [--rounds 20] [--ranks 2 3 5]
"""
import argparse
import json
import os

import numpy as np

from hpcmtl import store

from common import hpcmtl


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/scaling")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 5])
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    P = lambda name: os.path.join(args.out, name)  # noqa: E731
    report = {}
    print(f"{'problem':<12s} {'P':>2s} {'s/round':>8s} {'MB/round':>9s} {'worker partition MB':>20s} "
          f"{'worker peak-baseline MB':>24s} {'ratio':>6s} {'server peak-baseline MB':>24s}")
    for name in ("mnist-scale", "mds-scale"):
        hpcmtl(["data", "synth", name, P(f"{name}.h5"), "--scale", args.scale, "--force"])
        for ranks in args.ranks:
            out = P(f"{name}-P{ranks}.h5")
            hpcmtl(["train", "dmtrl", "--train", P(f"{name}.h5"), "--out", out, "--loss", "hinge", "--lam", "1e-4",
                    "--max-rounds", args.rounds, "--outer", "1", "--tol", "1e-12", "--quiet", "--force"], ranks=ranks)
            res = store.read_result(out)
            h, rk = res["history"], res["ranks"]
            growth = rk["peak_rss_mb"] - rk["rss_before_data_mb"]
            workers = slice(0, 1) if ranks == 1 else slice(1, None)
            w = int(np.argmax(rk["partition_mb"][workers])) + workers.start
            row = {"seconds_per_round": float(h["seconds"][-1] / h["round"][-1]),
                   "mb_per_round": float(h["bytes"][-1] / h["round"][-1] / 1e6),
                   "largest_worker_partition_mb": float(rk["partition_mb"][w]),
                   "its_peak_growth_mb": float(growth[w]), "server_peak_growth_mb": float(growth[0])}
            report[f"{name}/P{ranks}"] = row
            print(f"{name:<12s} {ranks:2d} {row['seconds_per_round']:8.3f} {row['mb_per_round']:9.3f} "
                  f"{row['largest_worker_partition_mb']:20.1f} {row['its_peak_growth_mb']:24.1f} "
                  f"{row['its_peak_growth_mb'] / row['largest_worker_partition_mb']:6.2f} "
                  f"{row['server_peak_growth_mb']:24.1f}", flush=True)
    with open(P("scaling.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
