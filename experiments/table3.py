"""Paper 001, Table 3: test error of DMTRL vs STL on MNIST and MDS (hinge loss).

* MNIST (../shared/data/mnist): 10 one-vs-all tasks, each digit's images plus
  as many random other digits, from the official training and test files.
* MDS (../shared/data/mds): the classic 4 domains (the paper used 22), one
  sentiment task per domain, hashed bag of words (10,000 dims), 75/25 split
  per task.

lam is chosen per method from a grid by validation on an 80/20 split of the
training file; both methods run as distributed jobs (mpiexec).  Reported: the
test error averaged over tasks, the relative duality gap reached and rounds.

    python experiments/table3.py --out results/table3 [--ranks 5]
"""
import json
import os

from hpcmtl import store

from common import SHARED_DATA, hpcmtl, need_shared, setup

GRIDS = {"mnist": (1e-5, 1e-4, 1e-3), "mds": (1e-5, 1e-4, 1e-3)}
SOLVER = ["--loss", "hinge", "--tol", "1e-3", "--max-rounds", "300", "--outer", "5", "--quiet", "--force"]


def run(method, train, test, out, lam, ranks):
    hpcmtl(["train", method, "--train", train, "--test", test, "--out", out, "--lam", lam] + SOLVER, ranks=ranks)
    res = store.read_result(out)
    h = res["history"]
    return {"lam": lam, "task_mean_error_rate": res["test"]["summary"]["task_mean_error_rate"],
            "rel_gap": float(h["rel_gap"][-1]),
            "rounds": int(h["round"][-1]), "seconds": float(h["seconds"][-1])}


def main():
    args, P = setup(__doc__, "results/table3")
    hpcmtl(["data", "convert", "--format", "mnist", need_shared(os.path.join(SHARED_DATA, "mnist")),
            P("mnist-tr.h5"), "--test-out", P("mnist-te.h5"), "--force"])
    hpcmtl(["data", "convert", "--format", "mds", need_shared(os.path.join(SHARED_DATA, "mds")), P("mds.h5"), "--force"])
    hpcmtl(["data", "split", P("mds.h5"), P("mds-tr.h5"), P("mds-te.h5"), "--test-fraction", "0.25", "--force"])
    table = {}
    for data in ("mnist", "mds"):
        hpcmtl(["data", "split", P(f"{data}-tr.h5"), P(f"{data}-in.h5"), P(f"{data}-va.h5"), "--test-fraction", "0.2",
                "--seed", "1", "--force"])
        for method in ("stl", "dmtrl"):
            val = {lam: run(method, P(f"{data}-in.h5"), P(f"{data}-va.h5"), P("val.h5"), lam,
                            args.ranks)["task_mean_error_rate"] for lam in GRIDS[data]}
            lam = min(val, key=val.get)
            final = run(method, P(f"{data}-tr.h5"), P(f"{data}-te.h5"), P(f"{data}-{method}.h5"), lam, args.ranks)
            final["validation_error"] = val
            table[f"{data}/{method}"] = final
            print(f"{data:5s} {method:5s} lam {lam:g}: task-mean test error "
                  f"{100 * final['task_mean_error_rate']:.2f} %, rel. gap "
                  f"{final['rel_gap']:.1e} after {final['rounds']} rounds ({final['seconds']:.1f} s)", flush=True)
    with open(P("table3.json"), "w") as f:
        json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
