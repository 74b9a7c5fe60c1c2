"""Helpers shared by the experiment scripts: run hpcmtl as a user would (CLI, real mpiexec)."""
import argparse
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


def setup(doc, default_out, ranks=True, **options):
    """Parse --out (and --ranks, and ``options``: name -> (type, default)); make the folder.

    Returns ``(args, P)`` where ``P(name)`` is a path inside the output folder.
    """
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default=default_out)
    if ranks:
        ap.add_argument("--ranks", type=int, default=5)
    for name, (kind, default) in options.items():
        ap.add_argument(f"--{name}", type=kind, default=default, nargs="+" if isinstance(default, list) else None)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    return args, lambda name: os.path.join(args.out, name)
