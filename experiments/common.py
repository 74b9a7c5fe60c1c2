"""Helpers shared by the experiment scripts: run hpcmtl as a user would (CLI, real mpiexec)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")


def hpcmtl(args, ranks=None, quiet=True):
    """Run ``[mpiexec -n ranks] python -m hpcmtl ARGS``; raise on failure."""
    cmd = [sys.executable, "-m", "hpcmtl"] + [str(a) for a in args]
    if ranks:
        cmd = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(ranks)] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    if not quiet:
        print(out.stdout, end="")
    return out.stdout


def evaluate(result, test):
    return json.loads(hpcmtl(["evaluate", result, test, "--json"]))


def need_shared(path):
    if not os.path.exists(path):
        sys.exit(f"{path}: not found; the experiments need ../shared/data beside the checkout")
    return path


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
