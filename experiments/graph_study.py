"""Paper 003, Sec. 3: POOL vs INDIV vs CYCLE on the `seasonal` data, Fig. 3, and exact vs random features.

12 monthly tasks (drifting weights, 3 % to 45 % positives), per month 300
training, 50 validation and the rest (about 120) test examples.
* POOL: one RBF SVM on all months, the month one-hot encoded as extra features.
* INDIV: one RBF SVM per month (one (C, gamma) for all months, chosen on the pooled
  validation set: winter months have too few positives to validate alone).
* CYCLE: one SVM with the product kernel K_st k(x, y), K from a 12-cycle (Eq. 5).
All are scikit-learn SVC (libsvm) on precomputed kernels; grid C in {0.1, 10, 1e3,
1e5}, gamma in {1e-3, 0.1, 10, 1e3} (the paper's), alpha in {2^-10, 2^-8, ..., 1};
selection by pooled validation AUC, reported: pooled test AUC.  Then CYCLE with
its selected (alpha, gamma) through the distributed engine on random Fourier
features of growing dimension: test AUC and fit time against the exact SVM.

    python experiments/graph_study.py --out results/graph
"""
import json
import time

import numpy as np
from sklearn.metrics import roc_auc_score
from sklearn.metrics.pairwise import rbf_kernel
from sklearn.svm import SVC

from hpcmtl import GraphMTL, synthetic
from hpcmtl.task_graph import task_kernel, topology

from common import pyplot, setup

CS = (0.1, 10.0, 1e3, 1e5)
GAMMAS = (1e-3, 0.1, 10.0, 1e3)
ALPHAS = tuple(2.0 ** k for k in range(-10, 1, 2))


def split(Xs, ys, rng):
    parts = {"train": ([], [], []), "val": ([], [], []), "test": ([], [], [])}
    for t, (X, y) in enumerate(zip(Xs, ys)):
        order = rng.permutation(len(y))
        for name, rows in (("train", order[:300]), ("val", order[300:350]), ("test", order[350:])):
            parts[name][0].append(X[rows])
            parts[name][1].append(y[rows])
            parts[name][2].append(np.full(len(rows), t))
    return {k: tuple(np.concatenate(v) for v in p) for k, p in parts.items()}


def svc_auc(G_train, y_train, G_eval, y_eval, C):
    svc = SVC(kernel="precomputed", C=C, max_iter=2_000_000).fit(G_train, y_train)
    return roc_auc_score(y_eval, svc.decision_function(G_eval))


def main():
    args, P = setup(__doc__, "results/graph", ranks=False, seed=(int, 0))
    (Xs, ys, names), _ = synthetic.seasonal(seed=args.seed)
    d = split(Xs, ys, np.random.default_rng(args.seed))
    (Xtr, ytr, ttr), (Xva, yva, tva), (Xte, yte, tte) = d["train"], d["val"], d["test"]
    onehot = lambda t: np.eye(12)[t]  # noqa: E731
    results, val = {}, {}
    # POOL: month as features
    Ptr, Pva, Pte = (np.hstack([X, onehot(t)]) for X, t in ((Xtr, ttr), (Xva, tva), (Xte, tte)))
    val["POOL"] = {(C, g): svc_auc(rbf_kernel(Ptr, Ptr, gamma=g), ytr, rbf_kernel(Pva, Ptr, gamma=g), yva, C)
                   for C in CS for g in GAMMAS}
    C, g = max(val["POOL"], key=val["POOL"].get)
    results["POOL"] = {"C": C, "gamma": g, "val_auc": val["POOL"][(C, g)],
                       "test_auc": svc_auc(rbf_kernel(Ptr, Ptr, gamma=g), ytr, rbf_kernel(Pte, Ptr, gamma=g), yte, C)}
    print("POOL", results["POOL"], flush=True)
    # INDIV: one SVM per month, scores pooled

    def indiv(C, g, Xe, te):
        scores = np.zeros(len(te))
        for t in range(12):
            a, b = ttr == t, te == t
            svc = SVC(kernel="precomputed", C=C, max_iter=2_000_000).fit(rbf_kernel(Xtr[a], Xtr[a], gamma=g), ytr[a])
            scores[b] = svc.decision_function(rbf_kernel(Xe[b], Xtr[a], gamma=g))
        return scores

    val["INDIV"] = {(C, g): roc_auc_score(yva, indiv(C, g, Xva, tva)) for C in CS for g in GAMMAS}
    C, g = max(val["INDIV"], key=val["INDIV"].get)
    results["INDIV"] = {"C": C, "gamma": g, "val_auc": val["INDIV"][(C, g)],
                        "test_auc": roc_auc_score(yte, indiv(C, g, Xte, tte))}
    print("INDIV", results["INDIV"], flush=True)
    # CYCLE: product kernel
    cyc = {}
    best_by_alpha = {}
    for g in GAMMAS:
        Btr, Bva = rbf_kernel(Xtr, Xtr, gamma=g), rbf_kernel(Xva, Xtr, gamma=g)
        for alpha in ALPHAS:
            K = task_kernel(topology("cycle", 12), alpha)
            for C in CS:
                cyc[(alpha, C, g)] = svc_auc(Btr * K[np.ix_(ttr, ttr)], ytr, Bva * K[np.ix_(tva, ttr)], yva, C)
    for alpha in ALPHAS:
        best_by_alpha[alpha] = max(v for k, v in cyc.items() if k[0] == alpha)
    alpha, C, g = max(cyc, key=cyc.get)
    K = task_kernel(topology("cycle", 12), alpha)
    t0 = time.perf_counter()
    test_auc = svc_auc(rbf_kernel(Xtr, Xtr, gamma=g) * K[np.ix_(ttr, ttr)], ytr,
                       rbf_kernel(Xte, Xtr, gamma=g) * K[np.ix_(tte, ttr)], yte, C)
    exact_seconds = time.perf_counter() - t0
    results["CYCLE"] = {"alpha": alpha, "C": C, "gamma": g, "val_auc": cyc[(alpha, C, g)], "test_auc": test_auc,
                        "fit_seconds": exact_seconds}
    print("CYCLE", results["CYCLE"], flush=True)
    # exact vs random features (distributed engine, fixed Sigma = K): at the selected gamma, and at the
    # best gamma >= 0.1, where the kernel varies enough over the data for D random features to resolve it
    lists = lambda X, y, t: ([X[t == k] for k in range(12)], [y[t == k] for k in range(12)])  # noqa: E731
    results["CYCLE_rff"] = {}
    wide = max((k for k in cyc if k[2] >= 0.1), key=cyc.get)
    for a, C, gam in ((alpha, C, g), wide):
        K = task_kernel(topology("cycle", 12), a)
        t0 = time.perf_counter()
        exact_auc = svc_auc(rbf_kernel(Xtr, Xtr, gamma=gam) * K[np.ix_(ttr, ttr)], ytr,
                            rbf_kernel(Xte, Xtr, gamma=gam) * K[np.ix_(tte, ttr)], yte, C)
        exact_s = time.perf_counter() - t0
        lam_val = {}
        for lam in (1e-4, 1e-3, 1e-2):
            m = GraphMTL(graph="cycle", alpha=a, exact=False, gamma=gam, lam=lam, rff_dim=800).fit(*lists(Xtr, ytr, ttr))
            lam_val[lam] = roc_auc_score(yva, np.concatenate(m.decision_function(lists(Xva, yva, tva)[0])))
        lam = max(lam_val, key=lam_val.get)
        rff = {}
        for dim in (50, 100, 200, 400, 800, 1600):
            t0 = time.perf_counter()
            m = GraphMTL(graph="cycle", alpha=a, exact=False, gamma=gam, lam=lam, rff_dim=dim).fit(*lists(Xtr, ytr, ttr))
            seconds = time.perf_counter() - t0
            Xl, yl = lists(Xte, yte, tte)
            rff[dim] = {"test_auc": roc_auc_score(np.concatenate(yl), np.concatenate(m.decision_function(Xl))),
                        "fit_seconds": seconds}
            print("RFF gamma", gam, "dim", dim, rff[dim], flush=True)
        results["CYCLE_rff"][f"gamma={gam:g}"] = {"alpha": a, "C": C, "lam": lam, "exact_test_auc": exact_auc,
                                                   "exact_fit_seconds": exact_s, "by_dim": rff}
        print("exact at gamma", gam, exact_auc, exact_s, flush=True)
    with open(P("graph_study.json"), "w") as f:
        json.dump({"results": results, "best_val_auc_by_alpha": best_by_alpha}, f, indent=1, default=float)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.semilogx(list(best_by_alpha), list(best_by_alpha.values()), "o-", base=2, label="CYCLE")
    ax.axhline(results["POOL"]["val_auc"], color="gray", linestyle="--", label="POOL")
    ax.set_xlabel("alpha")
    ax.set_ylabel("best validation AUC")
    ax.legend()
    fig.tight_layout()
    fig.savefig(P("fig3-alpha.png"), dpi=110)


if __name__ == "__main__":
    main()
