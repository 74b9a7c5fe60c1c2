"""project_l1inf against its floor, numpy.sort(abs(W), axis=1), in the same run.

Sorting every row once is where the paper's algorithm starts; the ratio says what
the rest costs (target: within 3x).  Also reports how the time grows from 1e5 to
1e7 entries against dm log dm.  Medians over --repeats runs; C is half the norm.

    python bench/bench_projection.py [--repeats 5]
"""
import argparse

import numpy as np
from timing import median_time

from hpcmtl.projection import l1inf_norm, project_l1inf


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'shape':>14s} {'sort s':>9s} {'project s':>10s} {'ratio':>6s} {'newton steps':>13s}")
    for d, m in ((10000, 100), (1000, 1000), (100000, 20)):
        W = rng.normal(size=(d, m))
        C = 0.5 * l1inf_norm(W)
        sort = median_time(lambda: np.sort(np.abs(W), axis=1), args.repeats)[0]
        proj = median_time(lambda: project_l1inf(W, C), args.repeats)[0]
        steps = project_l1inf(W, C, return_info=True)[1]["newton_steps"]
        print(f"{d:>7d} x {m:<5d} {sort:9.4f} {proj:10.4f} {proj / sort:6.2f} {steps:13d}", flush=True)
    print("\ngrowth (m = 100):")
    print(f"{'entries':>10s} {'project s':>10s} {'s / (dm log dm) x 1e9':>22s}")
    for d in (1000, 10000, 100000):
        W = rng.normal(size=(d, 100))
        C = 0.5 * l1inf_norm(W)
        proj = median_time(lambda: project_l1inf(W, C), args.repeats)[0]
        n = d * 100
        print(f"{n:>10d} {proj:10.4f} {proj / (n * np.log(n)) * 1e9:22.3f}", flush=True)


if __name__ == "__main__":
    main()
