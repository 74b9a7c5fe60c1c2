"""Paper 004, Figs. 4-6: online multitask learning on Reuters-21578 and the synthetic multilabel stream.

Every run is `hpcmtl train online` under mpiexec (tasks spread over workers), as a user runs it.

* Fig. 4: implicit update under the L-inf vs the L1 global norm, one binary task per topic:
  cumulative inf-error rate (any task wrong on the round) and 1-error rate (fraction of tasks wrong).
* Fig. 5: single-label documents of the 5 most frequent topics, the paper's 5 x 15 exhaustive code,
  implicit update under r-max norms for r = 1..15: multiclass error rate after the first N rounds;
  and the one-vs-rest code for comparison.
* Fig. 6: implicit update vs the finite-horizon multitask Perceptron, both under L-inf (same C, and
  the Perceptron also with Corollary 5's C = 1 / (sqrt(T) R^2)).

Reuters streams hold every ModApte document in NEWID order with hashed log2(1 + count) features of
unit length (`hpcmtl data convert --format reuters --stream --online`).

    python experiments/online_fig456.py [--out results/online] [--ranks 3] [--C 0.1]
"""
import os

import numpy as np

from common import SHARED_DATA, hpcmtl, need_shared, pyplot, setup

from hpcmtl import online_rules, store


def train(stream, out, ranks, *options):
    hpcmtl(["train", "online", "--stream", stream, "--out", out, "--force", "--quiet", *options], ranks=ranks)
    return store.read_result(out)


def rates(res):
    h = res["history"]
    t = h["round"]
    k = len(res["model"]["task_names"])
    out = {"inf": np.cumsum(h["inf_error"]) / t, "one": np.cumsum(h["n_errors"] / k) / t}
    if "multiclass_error" in h:
        out["multiclass"] = np.cumsum(h["multiclass_error"]) / t
    return out


def main():
    args, P = setup(__doc__, "results/online", C=(float, 0.1))
    args.ranks = args.ranks if args.ranks != 5 else 3
    C = str(args.C)
    reuters = need_shared(os.path.join(SHARED_DATA, "reuters21578"))
    streams = {"synthetic": P("synthetic.h5"), "reuters": P("reuters.h5")}
    hpcmtl(["data", "synth", "multilabel-stream", streams["synthetic"], "--force"])
    hpcmtl(["data", "convert", "--format", "reuters", "--stream", "--online", "--min-docs", "20", reuters,
            streams["reuters"], "--force"])
    hpcmtl(["data", "convert", "--format", "reuters", "--stream", "--online", "--single-label", "5", reuters,
            P("reuters5.h5"), "--force"])
    plt = pyplot()

    # Figs. 4 and 6
    for name, stream in streams.items():
        with store.StreamFile(stream) as sf:
            T, k = sf.n_rounds, sf.n_labels
            corollary5 = repr(online_rules.horizon_C(T, sf.max_row_norm()))     # the paper's C = 1/(sqrt(T) R^2)
        runs = {
            "implicit L-inf": train(stream, P(f"{name}-implicit-linf.h5"), args.ranks, "--norm", "linf", "--C", C),
            "implicit L1": train(stream, P(f"{name}-implicit-l1.h5"), args.ranks, "--norm", "l1", "--C", C),
            "Perceptron L-inf": train(stream, P(f"{name}-perceptron-linf.h5"), args.ranks, "--update",
                                      "perceptron", "--norm", "linf", "--C", C),
            "Perceptron L-inf, C = 1/sqrt(T)": train(stream, P(f"{name}-perceptron-linf-auto.h5"), args.ranks,
                                                     "--update", "perceptron", "--norm", "linf", "--C", corollary5),
        }
        print(f"\n{name}: {T} rounds, {k} tasks, C = {C}")
        print(f"{'run':34s} {'inf-error':>10s} {'1-error':>9s}   (cumulative rates after "
              f"{T // 10} / {T // 2} / {T} rounds)")
        for label, res in runs.items():
            r = rates(res)
            pts = [T // 10 - 1, T // 2 - 1, T - 1]
            print(f"{label:34s} " + " / ".join(f"{r['inf'][i]:.4f}" for i in pts) + "   "
                  + " / ".join(f"{r['one'][i]:.5f}" for i in pts))
        for fig_name, pair in (("fig4", ("implicit L-inf", "implicit L1")),
                               ("fig6", ("implicit L-inf", "Perceptron L-inf", "Perceptron L-inf, C = 1/sqrt(T)"))):
            fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
            for label in pair:
                r = rates(runs[label])
                t = np.arange(1, T + 1)
                axes[0].plot(t, r["inf"], label=label)
                axes[1].plot(t, r["one"], label=label)
            axes[0].set_ylabel("cumulative inf-error rate")
            axes[1].set_ylabel("cumulative 1-error rate")
            for ax in axes:
                ax.set_xlabel("rounds")
                tail = max(line.get_ydata()[T // 50:].max() for line in ax.get_lines())
                ax.set_ylim(0, 1.2 * tail)               # not the first rounds' spike
            axes[0].legend(fontsize=8)
            fig.suptitle(f"{name} ({k} tasks)")
            fig.tight_layout()
            fig.savefig(P(f"{fig_name}-{name}.png"), dpi=110)
            plt.close(fig)

    # Fig. 5
    stream5 = P("reuters5.h5")
    with store.StreamFile(stream5) as sf:
        T5 = sf.n_rounds
    checkpoints = [1000, 3000, T5]
    table = {}
    for r in range(1, 16):
        res = train(stream5, P(f"ecoc-r{r}.h5"), args.ranks, "--code", "exhaustive", "--norm", "rmax", "--r", str(r),
                    "--C", C)
        mc = rates(res)["multiclass"]
        table[r] = [mc[n - 1] for n in checkpoints]
    ovr = {}
    for norm in ("linf", "l1"):
        res = train(stream5, P(f"ovr-{norm}.h5"), args.ranks, "--code", "one-vs-rest", "--norm", norm, "--C", C)
        ovr[norm] = [rates(res)["multiclass"][n - 1] for n in checkpoints]
    print(f"\nECOC on {T5} single-label documents of the 5 most frequent topics (exhaustive 5 x 15 code, "
          f"distance 8): multiclass error rate after " + " / ".join(str(n) for n in checkpoints) + " rounds")
    for r, values in table.items():
        print(f"  r = {r:2d}  " + " / ".join(f"{v:.4f}" for v in values))
    for norm, values in ovr.items():
        print(f"  one-vs-rest code, {norm}: " + " / ".join(f"{v:.4f}" for v in values))
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for i, n in enumerate(checkpoints):
        ax.plot(list(table), [v[i] for v in table.values()], marker="o", label=f"after {n} rounds")
    ax.set_xlabel("r of the r-max global norm")
    ax.set_ylabel("multiclass error rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(P("fig5-reuters-ecoc.png"), dpi=110)
    plt.close(fig)
    hpcmtl(["report", P("reuters-implicit-linf.h5"), P("reuters-implicit-l1.h5"), P("reuters-perceptron-linf.h5"),
            "--out", P("report")])
    print(f"\nfigures in {args.out}")


if __name__ == "__main__":
    main()
