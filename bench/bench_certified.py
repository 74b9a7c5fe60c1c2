"""CPU seconds to the certified learned-Sigma optimum with the default command, against 10 outer steps (issue 36).

Issue 36's target: the default command (which stops once the joint relative gap is at most --outer-tol,
2e-4) within 2x the time of the issue-time code's 10 outer steps, which do not reach the optimum.  Each case
runs the default command of this build and a reference, alternating, ``--repeats`` times; CPU seconds are the
child's user + system time (the machines are shared: wall time is not comparable), medians, and the ratio
against the reference measured in the same run.  The reference is this build's ``--outer 10 --outer-tol 0``
(10 alternating W-steps with prox steps only), or another build's ``--outer 10`` with ``--reference BIN`` (the
issue-time build's ``hpcmtl``: its own defaults then).  Per case the default run's P, joint dual, joint
relative gap, W-steps, rounds and dual/accelerated phase iterations are printed from its result file.

    python bench/bench_certified.py --case NAME=TRAIN.h5 [--case NAME=TRAIN.h5 ...] [--args NAME='--lam 1e-3 ...']
        [--repeats 3] [--reference /path/to/old/hpcmtl] [--work DIR]

Measured (2 shared cores, medians of 3 alternating runs, the issue-time build a80c4e9's --outer 10 as the
reference): MDS hinge lam 1e-3 2.37 s against 1.35 s (1.76x; before the dual phase stopped at its first bound
within --outer-tol: 3.73 s, 2.76x), Synthetic 1 5.75 s against 5.72 s (1.01x; before 1.06x), Synthetic 2 5.61 s
against 6.68 s (0.84x; before 0.97x).  With the hinge's dual phase skipped while the W-steps still lower P by more
than --outer-tol (this build's own --outer 10 --outer-tol 0 as the reference, main's build measured right before):
MDS 2.33 s against 2.44 s (0.95x; main 2.31 s against 2.54 s, 0.91x: 4 W-steps instead of 3, phases 200 + 344
iterations instead of 200 + 400), Synthetic 1 0.95x (main 0.90x), Synthetic 2 0.78x (main 0.78x).
"""
import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from hpcmtl import store


def cpu_run(cmd):
    """CPU seconds (user + system) of one child command; its failure ends the benchmark with its stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def fmt(values):
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


def summary(path):
    """The default run's last W-step: P, joint dual and gap, W-steps, rounds, phase iterations."""
    w = store.read_result(path)["wsteps"]
    return {"P": float(w["joint_primal"][-1]), "D": float(w["joint_dual"][-1]), "gap": float(w["joint_rel_gap"][-1]),
            "wsteps": int(np.size(w["outer"])), "rounds": int(w["round"][-1]),
            "phases": [int(x) for x in np.asarray(w["apg_iterations"])]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", required=True, help="NAME=TRAIN.h5")
    ap.add_argument("--args", action="append", default=[], help="NAME='extra train arguments' (default --lam 1e-3)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reference", help="another build's hpcmtl: its --outer 10 is the reference")
    ap.add_argument("--work", help="where the result files go (default: a temporary directory)")
    opts = ap.parse_args(argv)
    extra = dict(a.split("=", 1) for a in opts.args)
    work = opts.work or tempfile.mkdtemp(prefix="bench_certified_")
    os.makedirs(work, exist_ok=True)
    this = [sys.executable, "-m", "hpcmtl"]
    for name, train in (c.split("=", 1) for c in opts.case):
        args = ["train", "dmtrl", "--train", train, *shlex.split(extra.get(name, "--lam 1e-3")), "--quiet", "--force"]
        out_new, out_ref = os.path.join(work, f"{name}-default.h5"), os.path.join(work, f"{name}-reference.h5")
        ref_cmd = ([opts.reference] + args + ["--outer", "10"] if opts.reference else
                   this + args + ["--outer", "10", "--outer-tol", "0"])
        new, ref = [], []
        for _ in range(opts.repeats):               # alternating: the same load on both
            ref.append(cpu_run(ref_cmd + ["--out", out_ref]))
            new.append(cpu_run(this + args + ["--out", out_new]))
        s = summary(out_new)
        mn, mr = statistics.median(new), statistics.median(ref)
        print(f"{name}: default {mn:.2f} s, reference {mr:.2f} s: {mn / mr:.2f}x (target <= 2x); "
              f"P {s['P']:.10g}, joint dual {s['D']:.10g}, joint gap {s['gap']:.3e}, {s['wsteps']} W-steps, "
              f"{s['rounds']} rounds, phase iterations {s['phases']}  (runs: default {fmt(new)}, reference {fmt(ref)})")


if __name__ == "__main__":
    main()
