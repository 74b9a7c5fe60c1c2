"""The server's box step problem on many tiny hinge tasks (issues 35/36): Newton-CG products and CPU a round with
the capacitance preconditioner (hpcmtl/dmtrl/qp_precond.py) against Jacobi, in the same session.

Each run is ``hpcmtl train dmtrl --loss hinge`` in a child process with
:data:`hpcmtl.dmtrl.steps.QP_PRECONDITIONER` set to ``jacobi`` or ``capacitance`` (the two alternate, ``--repeats``
pairs), counting the products that ``box_qp_operator`` asks for and its CPU seconds.  Printed per file and
preconditioner: coupled rounds (rounds whose step the server solved over all m tasks), products a round, the box
QPs' CPU seconds a round, the run's CPU seconds (medians over the repeats), the final primal and joint relative
gap, and the ratios capacitance / jacobi of products and of QP CPU a round.

    python bench/bench_box_qp.py FILE.h5 [FILE.h5 ...] [--lam 1e-2] [--repeats 1] [--factored-min-tasks N]
        [--preconditioners jacobi,capacitance] [--train-args '--outer 3 --max-rounds 6']

``--make M:PATH`` writes M one-row hinge tasks (d = 20: one shared weight vector, each task's sign flipped every
other task, plus noise; rows N(0, I)) to PATH first (the files measured in docs/many-tasks.md were made this way
by an earlier session's script: /tmp/exp37/many/one-row-500.h5 and one-row.h5, 10^4 tasks).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np


def make_one_row(path, m, d=20, seed=0):
    from hpcmtl.store import write_tasks
    rng = np.random.default_rng(seed)
    base = rng.normal(size=d)
    X = rng.normal(size=(m, d))
    W = base[None, :] * np.where(np.arange(m) % 2 == 0, 1.0, -1.0)[:, None] + 0.5 * rng.normal(size=(m, d))
    y = np.where(np.einsum("ij,ij->i", X, W) + 0.5 * rng.normal(size=m) > 0, 1.0, -1.0)
    write_tasks(path, [X[i:i + 1] for i in range(m)], [y[i:i + 1] for i in range(m)])


def child(args, rest):
    import resource
    import time
    from hpcmtl.dmtrl import sigma, steps
    if args.factored_min_tasks is not None:
        sigma.FACTORED_MIN_TASKS = args.factored_min_tasks
    steps.QP_PRECONDITIONER = args.child
    stats = {"products": 0, "qp_cpu": 0.0, "rounds": 0}
    qp = steps.box_qp_operator

    def counted_qp(times, *a, **k):
        def t(v):
            stats["products"] += 1
            return times(v)
        c0 = time.process_time()
        try:
            return qp(t, *a, **k)
        finally:
            stats["qp_cpu"] += time.process_time() - c0
    steps.box_qp_operator = counted_qp
    take = steps.StepSolver.take_steps

    def counted_take(self, inputs, *a, **k):
        stats["rounds"] += inputs.m > 1           # the server's rounds over all tasks (not a worker's one task)
        return take(self, inputs, *a, **k)
    steps.StepSolver.take_steps = counted_take
    from hpcmtl.cli import main
    from hpcmtl.store import read_result
    code = main(["train", "dmtrl", "--train", args.data, "--loss", "hinge", "--lam", str(args.lam), "--out", args.out,
                 "--force", "--quiet", *rest])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    res = read_result(args.out)
    wsteps = res.get("wsteps", {}) if isinstance(res, dict) else {}
    hist = res["history"] if isinstance(res, dict) else {}
    stats.update(code=code, cpu=usage.ru_utime + usage.ru_stime,
                 primal=float(np.asarray(hist.get("primal", [np.nan]))[-1]),
                 joint_rel_gap=float(np.asarray(wsteps.get("joint_rel_gap", [np.nan]))[-1]))
    print("RESULT " + json.dumps(stats))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*")
    ap.add_argument("--lam", type=float, default=1e-2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--factored-min-tasks", type=int, default=None)
    ap.add_argument("--make", action="append", default=[])
    ap.add_argument("--preconditioners", default="jacobi,capacitance", help="which to run (a long case: one)")
    ap.add_argument("--train-args", default="",
                    help="extra `train dmtrl` options, one string: '--outer 3 --max-rounds 6'")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    rest = args.train_args.split()
    if args.child:
        return child(args, rest)
    for spec in args.make:
        m, path = spec.split(":", 1)
        make_one_row(path, int(m))
        args.files.append(path)
    work = tempfile.mkdtemp(prefix="bench_box_qp_")
    for path in args.files:
        runs = {name: [] for name in args.preconditioners.split(",")}
        for _ in range(args.repeats):
            for pre in runs:
                cmd = [sys.executable, os.path.abspath(__file__), "--child", pre, "--data", path,
                       "--out", os.path.join(work, f"{pre}.h5"), "--lam", str(args.lam)]
                if args.factored_min_tasks is not None:
                    cmd += ["--factored-min-tasks", str(args.factored_min_tasks)]
                out = subprocess.run(cmd + ["--train-args", args.train_args], capture_output=True, text=True)
                line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
                if not line:
                    sys.exit(f"child failed:\n{out.stdout}\n{out.stderr}")
                runs[pre].append(json.loads(line[-1][7:]))
        print(f"{os.path.basename(path)} (lam {args.lam}, {' '.join(rest) or 'defaults'}; medians of {args.repeats})")
        print("preconditioner | coupled rounds | products a round | QP CPU s a round | run CPU s | primal | "
              "joint rel gap")
        med = {}
        for pre, rs in runs.items():
            per = [r["products"] / max(r["rounds"], 1) for r in rs]
            qcpu = [r["qp_cpu"] / max(r["rounds"], 1) for r in rs]
            med[pre] = (statistics.median(per), statistics.median(qcpu))
            print(f"{pre} | {rs[-1]['rounds']} | {med[pre][0]:.1f} | {med[pre][1]:.4f} | "
                  f"{statistics.median(r['cpu'] for r in rs):.2f} | {rs[-1]['primal']:.9g} | "
                  f"{rs[-1]['joint_rel_gap']:.4g}")
        if len(med) == 2:
            products = med['capacitance'][0] / max(med['jacobi'][0], 1e-300)
            qp_cpu = med['capacitance'][1] / max(med['jacobi'][1], 1e-300)
            print(f"ratio capacitance / jacobi: products a round {products:.3f}, QP CPU a round {qp_cpu:.3f}")


if __name__ == "__main__":
    main()
