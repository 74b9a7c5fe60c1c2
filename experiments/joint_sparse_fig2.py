"""Paper 002, Sec. 5.1 / Fig. 2: l1,inf vs independent l1 vs independent l2 projections.

Synthetic jointly sparse tasks (d = 200, m = 60, 10 % relevant features; x
normalized to unit norm, y = sign(w_k . x), as the paper describes), 10 to 640
training examples per task, 500 test examples.  Every model is the same
distributed projected subgradient (hinge loss, 200 iterations, eta0 / sqrt(t)
with eta0 chosen from a grid by the training objective, as in the paper);
only the projection differs.  Radii: the true ||W||_{1,inf} for l1,inf, the
true per-task l1 / l2 norms averaged over tasks for the column-wise balls.
Reported: test error (mean over tasks) and precision / recall of the selected
features (rows of W non-zero for at least one task) against the relevant set.

    python experiments/joint_sparse_fig2.py --out results/joint-sparse [--ranks 5]
"""
import json

import numpy as np

from hpcmtl import store, synthetic

from common import hpcmtl, pyplot, setup

SIZES = (10, 20, 40, 80, 160, 320, 640)
ETA0 = (1.0, 10.0, 100.0, 1000.0)


def main():
    args, P = setup(__doc__, "results/joint-sparse", seed=(int, 0))
    table = {}
    for n in SIZES:
        tr, te, truth = synthetic.joint_sparse(seed=args.seed, n_train=n, n_test=500)
        store.write_tasks(P("tr.h5"), *tr[:2], names=tr[2], truth=truth)
        store.write_tasks(P("te.h5"), *te[:2], names=te[2])
        W = truth["W"]
        radius = {"l1inf": float(truth["l1inf_norm"]), "l1": float(np.abs(W).sum(axis=0).mean()),
                  "l2": float(np.linalg.norm(W, axis=0).mean())}
        for proj in ("l1inf", "l1", "l2"):
            best = None
            for eta0 in ETA0:
                out = P(f"{proj}-{n}-{eta0:g}.h5")
                hpcmtl(["train", "l1inf", "--projection", proj, "--radius", radius[proj], "--eta0", eta0,
                        "--max-rounds", "200", "--train", P("tr.h5"), "--test", P("te.h5"), "--out", out,
                        "--quiet", "--force"], ranks=args.ranks)
                res = store.read_result(out)
                objective = float(res["history"]["best_objective"][-1])
                if best is None or objective < best[0]:
                    best = (objective, eta0, res)
            objective, eta0, res = best
            selected = np.abs(res["model"]["W"]).max(axis=1) > 0
            hits = int(np.sum(selected & truth["relevant"]))
            row = {"eta0": eta0, "objective": objective, "test_error": res["test"]["summary"]["task_mean_error_rate"],
                   "precision": hits / max(1, int(selected.sum())), "recall": hits / int(truth["relevant"].sum()),
                   "selected": int(selected.sum())}
            table[f"{proj}/{n}"] = row
            print(f"n = {n:4d} {proj:6s} eta0 {eta0:6g}: test error {row['test_error']:.4f}, precision "
                  f"{row['precision']:.2f}, recall {row['recall']:.2f} ({row['selected']} features)", flush=True)
    with open(P("fig2.json"), "w") as f:
        json.dump(table, f, indent=1)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for proj in ("l1inf", "l1", "l2"):
        axes[0].semilogx(SIZES, [table[f"{proj}/{n}"]["test_error"] for n in SIZES], "o-", label=proj)
    for proj in ("l1inf", "l1"):
        axes[1].semilogx(SIZES, [table[f"{proj}/{n}"]["precision"] for n in SIZES], "o-", label=f"{proj} precision")
        axes[1].semilogx(SIZES, [table[f"{proj}/{n}"]["recall"] for n in SIZES], "x--", label=f"{proj} recall")
    axes[0].set_ylabel("test error")
    axes[1].set_ylabel("feature selection")
    for ax in axes:
        ax.set_xlabel("training examples per task")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(P("fig2.png"), dpi=110)


if __name__ == "__main__":
    main()
