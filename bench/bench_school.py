"""School (paper 001, Table 2 data) DMTRL to a relative duality gap of 1e-6 at P = 1 and P = 3.

Reports per rank count (median over --repeats runs): seconds, rounds, bytes
moved per round against the 2 * 8 * d * m bytes the algorithm must move (delta
b up, w down), and per rank the peak memory above the interpreter's baseline
against the rank's data partition.

    python bench/bench_school.py [--repeats 3] [--lam 1e-2] [--outer 10]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from timing import mpiexec

from hpcmtl import store

HERE = os.path.dirname(os.path.abspath(__file__))
SCHOOL = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "data", "school.mat")


def hpcmtl(args, ranks=None):
    cmd = [sys.executable, "-m", "hpcmtl"] + [str(a) for a in args]
    if ranks:
        cmd = mpiexec(ranks) + cmd
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lam", type=float, default=1e-2)
    ap.add_argument("--outer", type=int, default=10)
    ap.add_argument("--school", default=SCHOOL)
    args = ap.parse_args()
    if not os.path.exists(args.school):
        sys.exit(f"{args.school}: not found (../shared/data/school.mat)")
    tmp = tempfile.mkdtemp(prefix="hpcmtl-bench-school-")
    full, raw, tr = (os.path.join(tmp, f) for f in ("school.h5", "raw.h5", "train.h5"))
    hpcmtl(["data", "convert", "--format", "malsar", args.school, full])
    hpcmtl(["data", "split", full, raw, os.path.join(tmp, "raw-test.h5"), "--seed", "0"])
    hpcmtl(["data", "standardize", raw, tr])
    with store.TaskFile(tr) as tf:
        d, m = tf.n_features, tf.n_tasks
    must_move = 2 * 8 * d * m
    print(f"School: d = {d}, m = {m}, lam = {args.lam}, relative gap 1e-6 per W-step, up to {args.outer} "
          f"outer steps; 2*8*d*m = {must_move} bytes")
    print(f"{'P':>2s} {'seconds':>8s} {'rounds':>7s} {'bytes/round':>12s} {'/ 2*8*d*m':>10s} "
          f"{'server growth MB':>17s} {'worker growth MB':>17s} {'worker partition MB':>20s}")
    for ranks in (1, 3):
        secs, rounds, per_round, over = [], [], [], []
        for r in range(args.repeats):
            out = os.path.join(tmp, f"r{ranks}-{r}.h5")
            hpcmtl(["train", "dmtrl", "--train", tr, "--out", out, "--loss", "squared", "--lam", args.lam,
                    "--tol", "1e-6", "--outer", args.outer, "--max-rounds", "5000", "--quiet", "--force"], ranks)
            res = store.read_result(out)
            h = res["history"]
            secs.append(float(h["seconds"][-1]))
            rounds.append(int(h["round"][-1]))
            per_round.append(float(h["bytes"][-1]) / int(h["round"][-1]))
            rk = res["ranks"]
            growth = rk["peak_rss_mb"] - rk["rss_before_data_mb"]   # peak above the interpreter's baseline
            workers = slice(0, 1) if ranks == 1 else slice(1, None)
            worst = int(np.argmax(growth[workers])) + workers.start
            over.append((growth[0], growth[worst], rk["partition_mb"][worst]))
        server, worker, part = np.median(np.array(over), axis=0)
        b = statistics.median(per_round)
        print(f"{ranks:2d} {statistics.median(secs):8.2f} {int(statistics.median(rounds)):7d} {b:12.0f} "
              f"{b / must_move:10.3f} {server:17.2f} {worker:17.2f} {part:20.2f}")
    print("(at P = 1 rank 0 is server and worker at once; growth = peak RSS - RSS before reading data)")


if __name__ == "__main__":
    main()
