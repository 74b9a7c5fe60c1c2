"""Timing shared by the benchmarks: the median of several runs (the machines are shared and noisy)."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def median_time(fn, repeats):
    """(median seconds, every run's seconds) of ``fn()`` over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def save_json(path, everything):
    """Every run's numbers, for a later look (``--json``); nothing when ``path`` is None."""
    if path:
        with open(path, "w") as f:
            json.dump(everything, f, indent=1)


def mpiexec(ranks):
    """``[mpiexec, -n, ranks]``: the launcher beside this Python (the mpich wheel's), else the first on PATH (a
    site's own MPI, whose mpi4py this Python then imports)."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return [here if os.path.exists(here) else (shutil.which("mpiexec") or "mpiexec"), "-n", str(ranks)]


def hpcmtl(args, ranks=1):
    """``[mpiexec -n ranks] python -m hpcmtl ARGS``; a failure ends the benchmark with the command's stderr."""
    cmd = [sys.executable, "-m", "hpcmtl"] + [str(a) for a in args]
    if ranks > 1:
        cmd = mpiexec(ranks) + cmd
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")


def medians(runs):
    """``(median of every numeric key, mark)`` over runs' dicts; the mark is '>' unless every run converged."""
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "converged"}
    return med, "" if all(r.get("converged", True) for r in runs) else ">"


def work_dir(path, prefix):
    """``path`` (created if missing), or a new temporary folder named ``prefix...``."""
    path = path or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(path, exist_ok=True)
    return path
