"""Where a DMTRL round's time goes, per rank (issue 14, "per-round overhead").

Runs ``hpcmtl train dmtrl`` under cProfile on every rank (``mpiexec -n P``; P = 1 is the serial path, server
and worker in one process) and sorts each rank's own time (cProfile's tottime) into:

- ``worker``: the workers' local computation (``LocalBlocks``: local steps, conversions, momentum scalars,
  and the compiled kernels they call: cProfile does not see into Cython functions, so their time is their
  caller's own time);
- ``collectives``: the time inside ``Cluster`` (MPI calls, and the waiting for the other ranks they include,
  spinning or sleeping);
- ``server``: the server's algebra (``Server`` / ``StepSolver``: W = B Sigma / lam, the step QPs, the
  Omega-step, the gap's regularizer);
- ``numpy/scipy``: library calls made from any of the above (cProfile does not charge them to their caller);
- ``other``: the rest (the interpreter's start-up, h5py).

Milliseconds per round = a category's whole-run time / rounds: start-up, reading the data and writing the
result are in them too (mostly ``numpy/scipy`` and ``other``), so compare runs, rank counts and cases with
each other rather than reading one number alone; cProfile also slows Python-heavy code more than the rest.

    python bench/bench_round_profile.py [--case sparse|dense|mds] [--ranks 1,3] [--work DIR]
"""
import argparse
import os
import pstats
import subprocess
import sys
import tempfile

from bench_traffic import CASES, dataset
from timing import mpiexec

from hpcmtl import store

CATEGORIES = ("worker", "collectives", "server", "numpy/scipy", "other")


def category(filename, function):
    base = os.path.basename(filename)
    if "mpi4py" in filename or "mpi4py" in function or "time.sleep" in function:     # sleep: Cluster.complete
        return "collectives"
    if base == "cluster.py" or os.path.basename(os.path.dirname(filename)) == "cluster":     # hpcmtl/cluster/
        return "collectives"
    if os.path.basename(os.path.dirname(filename)) == "dmtrl":                          # hpcmtl/dmtrl/
        if base == "worker.py":
            return "worker"
        if base in ("server.py", "steps.py", "outer.py", "sigma.py"):
            return "server"
        # a feature's module holds both halves: the worker half's methods by their names
        worker = ("LocalBlocks", "trial", "sdca", "local", "apply", "from_", "dense_rows", "support_values",
                  "objective_terms", "box_direction", "conjugate", "exact_step", "full_w", "on_all_features", "get_", "set_")
        return "worker" if function.startswith(worker) or function in ("reset_shrinking", "start_local") \
            else "server"
    if base in ("engine.py", "taskdata.py"):
        return "worker" if function in ("working_on", "decision", "rmatvec", "z_shift", "intercept") else "other"
    if "numpy" in filename or "scipy" in filename or filename.startswith("~") or filename == "{built-in}":
        return "numpy/scipy"
    return "other"


def profile(case, ranks, work):
    loss, lam = CASES[case]
    out = os.path.join(work, f"profile-{case}-{ranks}.h5")
    prefix = os.path.join(work, f"profile-{case}-{ranks}")
    # every rank writes its own profile: the launcher's rank variable names the file
    runner = ("import cProfile, os, runpy, sys; rank = next((os.environ[v] for v in ('PMI_RANK', 'OMPI_COMM_WORLD_RANK') "
              "if v in os.environ), '0'); sys.argv = ['hpcmtl'] + sys.argv[1:]; "
              f"cProfile.run('runpy.run_module(\"hpcmtl\", run_name=\"__main__\")', '{prefix}.' + rank)")
    cmd = [sys.executable, "-c", runner, "train", "dmtrl", "--train", dataset(case, work), "--out", out,
           "--loss", loss, "--lam", str(lam), "--tol", "1e-4", "--quiet", "--force"]
    if ranks > 1:
        cmd = mpiexec(ranks) + cmd
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode not in (0, None) and not os.path.exists(out):
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    rounds = int(store.read_result(out)["history"]["round"][-1])
    table = []
    for rank in range(ranks):
        stats = pstats.Stats(f"{prefix}.{rank}")
        totals = dict.fromkeys(CATEGORIES, 0.0)
        for (filename, _, function), (_, _, tottime, _, _) in stats.stats.items():
            totals[category(filename, function)] += tottime
        table.append(totals)
    return rounds, table


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="sparse", choices=sorted(CASES))
    ap.add_argument("--ranks", default="1,3")
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="hpcmtl-profile-")
    os.makedirs(work, exist_ok=True)
    print(f"case {args.case}: milliseconds a round by category (cProfile's own time, start-up and loading included)")
    print(f"{'P':>2s} {'rank':>4s} {'rounds':>6s} " + " ".join(f"{c:>12s}" for c in CATEGORIES))
    for ranks in (int(p) for p in args.ranks.split(",")):
        rounds, table = profile(args.case, ranks, work)
        for rank, totals in enumerate(table):
            print(f"{ranks:2d} {rank:4d} {rounds:6d} " + " ".join(f"{1e3 * totals[c] / rounds:12.2f}"
                                                             for c in CATEGORIES), flush=True)


if __name__ == "__main__":
    main()
