"""Paper 001, Sec. 7.2 on Synthetic 1 and 2: Figs. 2, 3 and 4.

* Fig. 2: DMTRL (mpiexec -n 5) recovers the task correlation of Synthetic 1;
  reported as the Pearson correlation between the off-diagonal entries of the
  learned and the true correlation matrices, with both heatmaps.
* Fig. 3: convergence of the W-step under the learned Sigma of Synthetic 1 vs
  Synthetic 2 (more correlated tasks, larger rho): rounds to reach each gap.
* Fig. 4: duality gap vs rounds and vs seconds for H in {0.1 n_i, n_i, 10 n_i}
  (DMTRL under mpiexec -n 5 with Synthetic 1's learned Sigma fixed), with
  single-machine SDCA as the reference.

    python experiments/dmtrl_synthetic.py --out results/synthetic [--ranks 5]

Losses: logistic, lam = 1e-3 (the labels come from a logistic model).
"""
import json

import numpy as np

from hpcmtl import store

from common import hpcmtl, pyplot, setup

TRAIN = ["--loss", "logistic", "--lam", "1e-3", "--quiet", "--force"]


def corr(S):
    s = np.sqrt(np.diag(S))
    return S / np.outer(s, s)


def main():
    args, P = setup(__doc__, "results/synthetic")
    plt = pyplot()
    summary = {}
    hists = {}
    for v in (1, 2):
        hpcmtl(["data", "synth", f"dmtrl{v}", P(f"s{v}-train.h5"), "--test", P(f"s{v}-test.h5"), "--force"])
        hpcmtl(["train", "dmtrl", "--train", P(f"s{v}-train.h5"), "--test", P(f"s{v}-test.h5"),
                "--out", P(f"s{v}-dmtrl.h5"), "--tol", "1e-6", "--outer", "20"] + TRAIN, ranks=args.ranks)
        # Fig. 3: a W-step from alpha = 0 under the learned Sigma
        hpcmtl(["train", "fixed", "--sigma", P(f"s{v}-dmtrl.h5"), "--train", P(f"s{v}-train.h5"),
                "--out", P(f"s{v}-fixed.h5"), "--tol", "1e-6", "--max-rounds", "5000"] + TRAIN, ranks=args.ranks)
        res = store.read_result(P(f"s{v}-fixed.h5"))
        h = res["history"]
        hists[v] = h
        summary[f"synthetic{v}"] = {
            "rho": float(res["model"]["rho"]),
            "rounds_to_gap": {f"{g:.0e}": int(h["round"][np.argmax(h["rel_gap"] <= g)]) if np.any(h["rel_gap"] <= g) else None
                              for g in (1e-2, 1e-3, 1e-4, 1e-5, 1e-6)},
            "dmtrl_test": store.read_result(P(f"s{v}-dmtrl.h5"))["test"]["summary"],
        }
    # Fig. 2
    with store.TaskFile(P("s1-train.h5")) as tf:
        truth = tf.read_truth()["correlation"]
    learned = corr(store.read_result(P("s1-dmtrl.h5"))["model"]["Sigma"])
    off = ~np.eye(16, dtype=bool)
    summary["fig2"] = {"pearson_offdiagonal": float(np.corrcoef(learned[off], truth[off])[0, 1]),
                       "sign_agreement_strong_pairs": float(np.mean(np.sign(learned[off & (np.abs(truth) > 0.5)])
                                                                    == np.sign(truth[off & (np.abs(truth) > 0.5)])))}
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    for ax, M, title in ((axes[0], learned, "DMTRL (learned)"), (axes[1], truth, "ground truth")):
        im = ax.imshow(M, vmin=-1, vmax=1, cmap="RdBu_r")
        ax.set_title(title)
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.savefig(P("fig2-correlation.png"), dpi=110)
    plt.close(fig)
    # Fig. 3
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for v, h in hists.items():
        ax.semilogy(h["round"], h["rel_gap"], label=f"Synthetic {v} (rho = {summary[f'synthetic{v}']['rho']:.2f})")
    ax.set_xlabel("rounds")
    ax.set_ylabel("relative duality gap")
    ax.legend()
    fig.tight_layout()
    fig.savefig(P("fig3-rho.png"), dpi=110)
    plt.close(fig)
    # Fig. 4
    curves = {}
    for H in (0.1, 1.0, 10.0):
        out = P(f"fig4-H{H:g}.h5")
        hpcmtl(["train", "fixed", "--sigma", P("s1-dmtrl.h5"), "--train", P("s1-train.h5"), "--out", out,
                "--tol", "1e-6", "--max-rounds", "20000", "--local-iters", H] + TRAIN, ranks=args.ranks)
        curves[f"DMTRL H={H:g} n_i"] = store.read_result(out)["history"]
    hpcmtl(["train", "ssdca", "--sigma", P("s1-dmtrl.h5"), "--train", P("s1-train.h5"), "--out", P("fig4-ssdca.h5"),
            "--tol", "1e-6", "--max-rounds", "2000"] + TRAIN)
    curves["SSDCA (1 process, epochs)"] = store.read_result(P("fig4-ssdca.h5"))["history"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for label, h in curves.items():
        axes[0].semilogy(h["seconds"], h["rel_gap"], label=label)
        axes[1].semilogy(h["round"], h["rel_gap"], label=label)
    axes[0].set_xlabel("seconds")
    axes[1].set_xlabel("rounds of communication (SSDCA: epochs)")
    for ax in axes:
        ax.set_ylabel("relative duality gap")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(P("fig4-gap.png"), dpi=110)
    plt.close(fig)
    summary["fig4"] = {label: {"rounds": int(h["round"][-1]), "seconds": float(h["seconds"][-1]),
                               "final_rel_gap": float(h["rel_gap"][-1])} for label, h in curves.items()}
    with open(P("summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
