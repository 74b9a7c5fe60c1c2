"""``hpcmtl demo``: paper 001's Synthetic 1 under ``mpiexec -n 5``, STL vs DMTRL.

Generates the data, trains both methods as real MPI jobs (rank 0 the server,
ranks 1-4 the workers), evaluates them, prints a table and draws the duality
gap curves and the learned task correlation beside the ground truth.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np

from .errors import InputError


def find_mpiexec():
    """mpiexec beside this Python (the mpich wheel installs it there), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        return here
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise InputError("no mpiexec found: install hpcmtl with its MPI extra (pip install 'hpcmtl[mpi]')")
    return found


def correlation_of(Sigma):
    s = np.sqrt(np.diag(Sigma))
    return Sigma / np.outer(s, s)


def run_demo(out_dir: str, ranks: int = 5) -> int:
    from . import store
    from .metrics import evaluate_arrays
    os.makedirs(out_dir, exist_ok=True)
    train, test = os.path.join(out_dir, "synthetic1-train.h5"), os.path.join(out_dir, "synthetic1-test.h5")
    py = [sys.executable, "-m", "hpcmtl"]
    print(f"[1/3] generating paper 001's Synthetic 1 (16 tasks, d = 100) in {out_dir}/", flush=True)
    subprocess.run(py + ["data", "synth", "dmtrl1", train, "--test", test, "--force"], check=True)
    mpiexec = find_mpiexec()
    runs = {}
    settings = ["--loss", "logistic", "--lam", "1e-3", "--tol", "1e-6", "--quiet", "--force"]
    for k, method in enumerate(("stl", "dmtrl"), start=2):
        out = os.path.join(out_dir, f"{method}.h5")
        print(f"[{k}/3] {method}: mpiexec -n {ranks} hpcmtl train {method} ... (rank 0 server, "
              f"{ranks - 1} workers)", flush=True)
        subprocess.run([mpiexec, "-n", str(ranks)] + py + ["train", method, "--train", train, "--out", out]
                       + settings, check=True, timeout=900)
        runs[method] = out
    with store.TaskFile(test) as tf:
        truth = tf.read_truth()
        rows = []
        results = {}
        for method, path in runs.items():
            res = store.read_result(path)
            results[method] = res
            metrics = evaluate_arrays(res["model"]["W"], res["config"], tf)
            h = res["history"]
            rows.append((method, metrics["summary"]["task_mean_error_rate"], h["rel_gap"][-1], int(h["round"][-1]),
                         float(h["seconds"][-1]), float(h["bytes"][-1]) / 1e6))
    print()
    print(f"{'method':<8s} {'task-mean test error':>21s} {'rel. gap':>10s} {'rounds':>7s} {'seconds':>8s} "
          f"{'MB moved':>9s}")
    for r in rows:
        print(f"{r[0]:<8s} {r[1]:21.4f} {r[2]:10.2e} {r[3]:7d} {r[4]:8.2f} {r[5]:9.2f}")
    learned = correlation_of(results["dmtrl"]["model"]["Sigma"])
    true_corr = truth["correlation"]
    off = ~np.eye(learned.shape[0], dtype=bool)
    agreement = float(np.corrcoef(learned[off], true_corr[off])[0, 1])
    print(f"\nlearned vs true task correlation (off-diagonal Pearson r): {agreement:.3f}")
    plots = draw(results, learned, true_corr, out_dir)
    print(f"\nresult files: {runs['stl']}, {runs['dmtrl']}")
    if plots:
        print("plots: " + ", ".join(plots))
    return 0


def draw(results, learned, true_corr, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no plots; pip install 'hpcmtl[plot]')")
        return []
    paths = []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for method, res in results.items():
        h = res["history"]
        ax.semilogy(h["round"], np.maximum(h["rel_gap"], 1e-16), label=method)
    ax.set_xlabel("communication rounds")
    ax.set_ylabel("relative duality gap")
    ax.legend()
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "gap.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    for ax, M, title in ((axes[0], learned, "learned (DMTRL)"), (axes[1], true_corr, "ground truth")):
        im = ax.imshow(M, vmin=-1, vmax=1, cmap="RdBu_r")
        ax.set_title(title)
    fig.colorbar(im, ax=axes, shrink=0.8)
    paths.append(os.path.join(out_dir, "task-correlation.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
