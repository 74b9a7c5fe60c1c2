"""Many small tasks (issue 35): what a DMTRL round costs as the number of tasks m grows at fixed rows a task.

For each m: m tasks of 20-40 rows (uniform), d features (default 20), squared loss, learned Sigma, the tasks
in a few clusters of related weight vectors (so the learned Sigma has structure: rank about the cluster
count, the rest at the eigenvalue floor).  One run per m and rank count (``--ranks 1,3``; P > 1 under
``mpiexec -n P``), ``--outer`` W-steps (the first, at Sigma = I / m, is one exact round here; the others are the
coupled rounds whose server step this benchmark is about), ``--max-rounds`` rounds a W-step at most.

Printed per (m, P): the median seconds from one coupled round's start to the next's (``period``: the gap, the
checks between rounds and the safe point included; the ratio at 10^4 over 10^3 is of these), of the
round's own command (``round``: its server algebra: the step problem,
``W = B Sigma / lam`` and the rho update, also as rank 0's CPU seconds (``cpu``: what a loaded machine's
wall clock blurs), and its worker part: ``LocalBlocks.trial`` and ``apply`` summed
over the ranks that hold blocks, per round), the median Omega-step seconds, rank 0's peak resident memory,
the median bytes a coupled round moves, the squared-loss step's CG products a round (mean), the rounds of
each W-step and whether it was certified (``>``: it stopped at ``--max-rounds``), and, when both are run, the
ratio of seconds a round at m = 10^4 to m = 10^3 (linear growth: <= 12 at 20-40 rows a task).  Below each row:
the workers' CPU seconds a round (the median TRIAL's and APPLY's, summed over the ranks) and the time outside the
rounds (the slowest rank's reading of its blocks, ``engine.load_blocks``; rank 0's intercepts' task means,
``engine.split_intercept``: 0 once the workers send them).

    python bench/bench_tasks.py [--tasks 1000,10000] [--ranks 1,3] [--d 20] [--outer 3] [--max-rounds 100]
        [--factored-min-tasks N] [--batch-min-tasks N] [--cg-inexact-min-tasks N] [--spread-min-tasks N]
        [--outer-tol T] [--loss squared|hinge|smoothed-hinge|logistic]
        [--gradient-batch-min-blocks N] [--gradient-compare] [--read N] [--json FILE] [--work DIR]

``--factored-min-tasks`` sets :data:`hpcmtl.dmtrl.sigma.FACTORED_MIN_TASKS` in every rank (0: a learned Sigma
always as factors, the step problems matrix-free; a huge number: the dense path of before);
``--batch-min-tasks`` sets :data:`hpcmtl.dmtrl.batched.BATCH_MIN_TASKS` (a huge number: every block on its own on
the workers, the per-block path of before); ``--cg-inexact-min-tasks`` sets
:data:`hpcmtl.dmtrl.steps.CG_INEXACT_MIN_TASKS` (a huge number: the squared loss's CG step to its residual's 1e-13
at every m, as before; 0 with ``--convergence``: the gain's stop on its small cases too); ``--spread-min-tasks``
sets :data:`hpcmtl.dmtrl.spread.SPREAD_MIN_TASKS` (0: the squared loss's step products and W by task chunks on
every rank at every m; a huge number: all on rank 0, as before), and below each row the CPU seconds a round each
rank spent in its share of that algebra (the ``spread_*`` commands' computations); ``--outer-tol``
(default 0: no accelerated outer phase; > 0: the phase runs after W-steps that do not reach
it, and the CPU seconds of its GRADIENT_TERMS are printed, ``--gradient-batch-min-blocks`` setting
:data:`hpcmtl.dmtrl.joint.GRADIENT_BATCH_MIN_BLOCKS`: a huge number, one kernel call a block as before;
``--gradient-compare``: every GRADIENT_TERMS computed both ways in turn, checked equal, the median CPU seconds
of each and their ratio printed).
``--loss`` (default squared): hinge, smoothed-hinge or logistic train the same rows with the signs of their
targets as labels; ``CG/round`` is then the box step's products of A a coupled round (rank 0's or spread).
``--read N`` instead times reading the first N tasks of each ``--tasks`` file (CPU seconds a task of
``TaskFile.read_block`` and ``task_means``: the load and the intercepts' means, outside the rounds) in the
group layout and the packed one, and their ratio.
``--convergence`` instead runs bench/bench_convergence.py's squared-loss cases (School, P = 1, in process) with
the dense and the matrix-free step problems and prints rounds and seconds of each (``--cases`` picks other
bench_convergence.py cases, e.g. the hinge ones: ``syn1,syn2,small,mnist,mds``).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from timing import mpiexec, save_json

from hpcmtl import store

HERE = os.path.dirname(os.path.abspath(__file__))


def make_tasks(path, m, d, seed=0, clusters=5, layout="auto", loss="squared"):
    """m squared-loss tasks of 20-40 rows and d features, their weights in ``clusters`` groups plus noise
    (``layout``: the task file's, :func:`hpcmtl.store.write_tasks`); the box losses: the same rows, labels the
    sign of the squared loss's targets (+-1)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(clusters, d))
    Xs, ys = [], []
    for t in range(m):
        n = int(rng.integers(20, 41))
        w = centers[t % clusters] + 0.3 * rng.normal(size=d)
        X = rng.normal(size=(n, d))
        Xs.append(X)
        y = X @ w + 0.5 * rng.normal(size=n)
        ys.append(y if loss == "squared" else np.where(y > 0, 1.0, -1.0))
    store.write_tasks(path, Xs, ys, names=[f"t{i}" for i in range(m)], force=True, layout=layout)


def timed(cls, name, log):
    """Wrap ``cls.name`` so every call appends its seconds to ``log[name]``."""
    inner = getattr(cls, name)

    def wrapper(self, *a, **k):
        t, c = time.perf_counter(), time.process_time()
        try:
            return inner(self, *a, **k)
        finally:
            log.setdefault(name, []).append(time.perf_counter() - t)
            log.setdefault(name + ":cpu", []).append(time.process_time() - c)
    setattr(cls, name, wrapper)


def timed_function(module, name, log):
    """Wrap ``module.name`` (looked up at call time) so every call appends its seconds and CPU seconds to ``log``."""
    inner = getattr(module, name)

    def wrapper(*a, **k):
        t, c = time.perf_counter(), time.process_time()
        try:
            return inner(*a, **k)
        finally:
            log.setdefault(name, []).append(time.perf_counter() - t)
            log.setdefault(name + ":cpu", []).append(time.process_time() - c)
    setattr(module, name, wrapper)


# the rounds' worker halves on task supports (the box losses' momentum trial), timed beside trial and apply
WORKER_TWINS = ("trial_on_support", "trial_momentum_on_support", "apply_on_support")
# the spread algebra's computations on each rank (rank 0's included), dmtrl/spread.py
SPREAD_PARTS = ("spread_start", "spread_direction", "spread_product", "spread_update", "spread_finish", "spread_w",
                "spread_box_start", "spread_box_direction", "spread_box_finish", "spread_box_free", "spread_box_solve",
                "spread_box_solve_rows")


def child(args):
    """One training run on this rank (under mpiexec or alone): per-rank timings to ``args.out.RANK``."""
    from hpcmtl import cluster as hc
    from hpcmtl import dmtrl
    from hpcmtl.dmtrl import server as srv, sigma, steps, worker
    if args.factored_min_tasks is not None and hasattr(sigma, "FACTORED_MIN_TASKS"):
        sigma.FACTORED_MIN_TASKS = args.factored_min_tasks
    if args.cg_inexact_min_tasks is not None:
        steps.CG_INEXACT_MIN_TASKS = args.cg_inexact_min_tasks
    if args.batch_min_tasks is not None:
        from hpcmtl.dmtrl import batched
        batched.BATCH_MIN_TASKS = args.batch_min_tasks
    if args.spread_min_tasks is not None:
        from hpcmtl.dmtrl import spread
        spread.SPREAD_MIN_TASKS = args.spread_min_tasks
    log = {}
    for name in ("round_local", "omega", "recompute_w"):
        timed(srv.Server, name, log)
    timed(steps.StepSolver, "take_steps", log)
    timed(steps.StepSolver, "adapt_rho", log)
    cg = steps.StepSolver.steps_momentum_cg

    def cg_counted(self, *a, **k):          # the CG products of each round's squared-loss step
        try:
            return cg(self, *a, **k)
        finally:
            log.setdefault("cg_products", []).append(getattr(self, "cg_iterations", 0))
    steps.StepSolver.steps_momentum_cg = cg_counted
    timed(srv.Server, "spread_steps", log)
    spread_steps = srv.Server.spread_steps

    def spread_counted(self, *a, **k):      # the same count when the step's products are spread
        before = {key: len(log.get(key, [])) for key in ("take_steps", "take_steps:cpu")}
        try:
            return spread_steps(self, *a, **k)
        finally:
            if self.momentum != "box":
                log.setdefault("cg_products", []).append(getattr(self.solver, "cg_iterations", 0))
            for key, start in before.items():      # the box losses' take_steps runs inside: counted once
                log.setdefault("nested_" + key, []).append(-sum(log.get(key, [])[start:]))
    srv.Server.spread_steps = spread_counted
    operator = steps.StepSolver.momentum_operator

    def operator_counted(self, *a, **k):    # the box losses' step products a round (rank 0's or spread)
        apply, g, blocks = operator(self, *a, **k)
        count = log.setdefault("box_products", [])
        if self.momentum == "box":
            count.append(0)

        def counted(v):
            if count and self.momentum == "box":
                count[-1] += 1
            return apply(v)
        return counted, g, blocks
    steps.StepSolver.momentum_operator = operator_counted
    for name in SPREAD_PARTS:
        timed(worker.LocalBlocks, name, log)
    for name in ("trial", "apply", "gradient_terms") + WORKER_TWINS:
        timed(worker.LocalBlocks, name, log)
    from hpcmtl import engine               # outside the rounds: reading the blocks, the intercepts' task means
    for name in ("load_blocks", "split_intercept"):
        timed_function(engine, name, log)
    from hpcmtl.dmtrl import joint
    if args.gradient_batch_min_blocks is not None:
        joint.GRADIENT_BATCH_MIN_BLOCKS = args.gradient_batch_min_blocks
    if args.gradient_compare:               # every GRADIENT_TERMS twice, batched and one call a block, in turn first
        inner_terms = worker.LocalBlocks.gradient_terms

        def both(self, ctrl, rows):
            outs = {}
            order = ("batched", "per_block") if len(log.get("batched", [])) % 2 == 0 else ("per_block", "batched")
            for label in order:
                joint.GRADIENT_BATCH_MIN_BLOCKS = 1 if label == "batched" else 10 ** 18
                c = time.process_time()
                outs[label] = inner_terms(self, ctrl, rows)
                log.setdefault(label, []).append(time.process_time() - c)
            if not np.array_equal(outs["batched"], outs["per_block"]):
                raise SystemExit("GRADIENT_TERMS: the batched and the per-block results differ")
            return outs["batched"]
        worker.LocalBlocks.gradient_terms = both
    rounds = {"round": [], "server": [], "server_cpu": [], "bytes": [], "start": [], "outer": []}
    orig = srv.Server.round_steps
    server_keys = ("take_steps", "spread_steps", "adapt_rho", "recompute_w", "nested_take_steps")

    def round_steps(self, want_gap):         # one coupled round: its seconds, its server algebra, its bytes
        spent = sum(sum(log.get(k, [])) for k in server_keys)
        spent_cpu = sum(sum(log.get(k + ":cpu", [])) for k in server_keys)
        before, t = self.cluster.bytes_moved, time.perf_counter()
        rounds["start"].append(t)
        rounds["outer"].append(self.outer)
        try:
            return orig(self, want_gap)
        finally:
            rounds["round"].append(time.perf_counter() - t)
            rounds["server"].append(sum(sum(log.get(k, [])) for k in server_keys) - spent)
            rounds["server_cpu"].append(sum(sum(log.get(k + ":cpu", [])) for k in server_keys) - spent_cpu)
            rounds["bytes"].append(self.cluster.bytes_moved - before)
    srv.Server.round_steps = round_steps
    pairs = []                                # a worker's trial + the apply that follows it (a coupled round)
    trial, apply = worker.LocalBlocks.trial, worker.LocalBlocks.apply
    last = {}

    def trial_w(self, *a, **k):
        t = time.perf_counter()
        try:
            return trial(self, *a, **k)
        finally:
            last["trial"] = time.perf_counter() - t

    def apply_w(self, *a, **k):
        t = time.perf_counter()
        try:
            return apply(self, *a, **k)
        finally:
            if "trial" in last:
                pairs.append(last.pop("trial") + time.perf_counter() - t)
    worker.LocalBlocks.trial, worker.LocalBlocks.apply = trial_w, apply_w
    cl = hc.connect()
    config = dmtrl.DMTRLConfig(loss=args.loss, lam=args.lam, outer=args.outer, outer_tol=args.outer_tol, tol=args.tol,
                               max_rounds=args.max_rounds)
    t0 = time.perf_counter()
    with store.TaskFile(args.data) as source:
        res = dmtrl.train(cl, source, config, warn=lambda msg: None)
    wall = time.perf_counter() - t0
    out = {"rank": cl.rank, "log": log, "rounds": rounds, "pairs": pairs, "wall": wall,
           "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    if res is not None:
        out["wsteps"] = {k: np.asarray(v).tolist() for k, v in res.wsteps.items()}
        out["n_rounds"] = int(res.n_rounds)
        out["primal"] = float(res.history["primal"][-1])
    with open(f"{args.out}.{cl.rank}", "w") as f:
        json.dump(out, f)


def run_case(args, path, m, ranks, work):
    out = os.path.join(work, f"t-{m}-{ranks}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--data", path, "--out", out,
           "--outer", str(args.outer), "--max-rounds", str(args.max_rounds), "--lam", str(args.lam),
           "--tol", str(args.tol), "--loss", args.loss]
    if args.factored_min_tasks is not None:
        cmd += ["--factored-min-tasks", str(args.factored_min_tasks)]
    if args.batch_min_tasks is not None:
        cmd += ["--batch-min-tasks", str(args.batch_min_tasks)]
    if args.cg_inexact_min_tasks is not None:
        cmd += ["--cg-inexact-min-tasks", str(args.cg_inexact_min_tasks)]
    if args.spread_min_tasks is not None:
        cmd += ["--spread-min-tasks", str(args.spread_min_tasks)]
    if args.gradient_batch_min_blocks is not None:
        cmd += ["--gradient-batch-min-blocks", str(args.gradient_batch_min_blocks)]
    if args.gradient_compare:
        cmd += ["--gradient-compare"]
    cmd += ["--outer-tol", str(args.outer_tol)]
    if ranks > 1:
        cmd = mpiexec(ranks) + cmd
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"m={m} P={ranks}: exit {r.returncode}: {r.stderr.strip()[-2000:]}")
    per_rank = []
    for rank in range(ranks):
        with open(f"{out}.{rank}") as f:
            per_rank.append(json.load(f))
    s = per_rank[0]
    coupled = s["rounds"]["round"]
    n = len(coupled)
    # the workers' part of a coupled round: trial + apply, summed over the ranks (each rank's k-th pair is round k)
    pairs = [np.array(r_["pairs"]) for r_ in per_rank if len(r_["pairs"]) == n and n]
    worker_round = np.sum(pairs, axis=0) if pairs else np.zeros(0)
    # its CPU seconds (what a loaded machine's wall clock blurs): the median trial's + the median apply's, summed
    # over the ranks that hold blocks
    # (on supports, the box losses: their twins, TRIAL_MOMENTUM_ON_SUPPORT / APPLY_ON_SUPPORT)
    worker_cpu = []
    for r_ in per_rank:
        parts = [next((r_["log"][k + ":cpu"] for k in group if r_["log"].get(k + ":cpu")), None)
                 for group in (("trial", "trial_on_support", "trial_momentum_on_support"),
                               ("apply", "apply_on_support"))]
        if all(parts):
            worker_cpu.append(sum(float(np.median(p)) for p in parts))
    worker_cpu = np.array(worker_cpu)
    worker_cpu = np.array([worker_cpu.sum()]) if worker_cpu.size else worker_cpu
    # a whole round: from one coupled round's start to the next's in the same W-step (the gap, the checks
    # between rounds, the safe point included)
    starts, outers = np.array(s["rounds"]["start"]), np.array(s["rounds"]["outer"])
    periods = np.diff(starts)[outers[1:] == outers[:-1]] if n > 1 else np.zeros(0)
    ws = s["wsteps"]
    steps_rounds = np.diff(np.concatenate([[0], ws["round"]])).astype(int).tolist()
    row = {"m": m, "ranks": ranks, "round_median": statistics.median(coupled) if n else float("nan"),
           "coupled_rounds": n, "period_median": float(np.median(periods)) if periods.size else float("nan"),
           "server_median": statistics.median(s["rounds"]["server"]) if n else float("nan"),
           "server_cpu_median": statistics.median(s["rounds"]["server_cpu"]) if n else float("nan"),
           "worker_median": float(np.median(worker_round)) if worker_round.size else float("nan"),
           "worker_cpu_median": float(np.median(worker_cpu)) if worker_cpu.size else float("nan"),
           "local_round_median": statistics.median(s["log"]["round_local"]) if s["log"].get("round_local") else
           float("nan"),
           "omega_median": statistics.median(s["log"]["omega"]) if s["log"].get("omega") else float("nan"),
           "cg_products": float(np.mean(s["log"]["cg_products"])) if s["log"].get("cg_products") else
           # the box losses: A's products a coupled round (a round makes two box QPs and the triangle passes)
           float(sum(s["log"].get("box_products", [])) / max(n, 1)),
           # the accelerated outer phase (--outer-tol > 0): GRADIENT_TERMS' calls, CPU seconds summed over the ranks
           "gradient_calls": len(s["log"].get("gradient_terms", [])) or max(len(r_["log"].get("gradient_terms", []))
                                                                            for r_ in per_rank),
           "gradient_cpu": sum(sum(r_["log"].get("gradient_terms:cpu", [])) for r_ in per_rank),
           "gradient_batched": [float(np.median(r_["log"]["batched"])) for r_ in per_rank if r_["log"].get("batched")],
           "gradient_per_block": [float(np.median(r_["log"]["per_block"])) for r_ in per_rank
                                  if r_["log"].get("per_block")],
           "peak_mb": s["peak_mb"], "bytes_round": statistics.median(s["rounds"]["bytes"]) if n else 0,
           "wstep_rounds": steps_rounds, "certified": [bool(c) for c in ws["converged"]],
           "wall": s["wall"], "primal": s["primal"],
           # outside the rounds: the slowest rank's reading of its blocks, rank 0's intercepts (seconds, CPU s)
           "load_s": max(sum(r_["log"].get("load_blocks", [])) for r_ in per_rank),
           "load_cpu": max(sum(r_["log"].get("load_blocks:cpu", [])) for r_ in per_rank),
           "means_s": sum(s["log"].get("split_intercept", [])),
           "means_cpu": sum(s["log"].get("split_intercept:cpu", [])),
           "rounds_s": float(sum(coupled)) + float(sum(s["log"].get("round_local", []))),
           # each rank's CPU seconds a coupled round in its share of the spread algebra (0: not spread)
           "spread_cpu": [sum(sum(r_["log"].get(k + ":cpu", [])) for k in SPREAD_PARTS) / max(n, 1)
                          for r_ in per_rank]}
    return row


def read_cost(args, work):
    """``--read N``: CPU seconds a task of reading the first N tasks of the m = ``--tasks`` file (``read_block``, then
    ``task_means``: what loading and the intercepts' means cost outside the rounds), medians of 3 passes, in the
    group layout and the packed one (the same tasks), and the ratio groups / packed; and the seconds of writing
    each file (``write_tasks``)."""
    rows = []
    for m in [int(x) for x in args.tasks.split(",")]:
        for layout in ("groups", "packed"):
            path = os.path.join(work, f"tasks-{m}-{args.d}-{layout}.h5")
            t = time.process_time()
            make_tasks(path, m, args.d, layout=layout)
            written = time.process_time() - t
            with store.TaskFile(path) as source:
                count = min(args.read, source.n_tasks)
                cost = {}
                for name in ("read_block", "task_means"):
                    passes = []
                    for _ in range(3):
                        t = time.process_time()
                        for i in range(count):
                            getattr(source, name)(i)
                        passes.append((time.process_time() - t) / count)
                    cost[name] = statistics.median(passes)
            rows.append({"m": m, "layout": layout, "tasks_read": count, "write_seconds": written, **cost})
            print(f"{m:6d} tasks, {layout:>6s}: the first {count} read: read_block {cost['read_block'] * 1e3:.3f} ms "
                  f"CPU a task, task_means {cost['task_means'] * 1e3:.3f} ms CPU a task; written in {written:.2f} s "
                  f"(generating the tasks included)", flush=True)
        groups, packed = rows[-2], rows[-1]
        print(f"{m:6d} tasks, groups / packed: read_block {groups['read_block'] / packed['read_block']:.1f}x, "
              f"task_means {groups['task_means'] / packed['task_means']:.1f}x", flush=True)
    return rows


def convergence(args, work):
    """bench_convergence.py's cases (``--cases``: default its squared-loss School cases), P = 1, in process: the
    dense against the matrix-free step problems (``FACTORED_MIN_TASKS = 0``), bench_convergence's settings."""
    sys.path.insert(0, HERE)
    from bench_convergence import CASES, dataset
    from hpcmtl import dmtrl
    from hpcmtl.cluster import SerialCluster
    from hpcmtl.dmtrl import sigma, steps
    if args.cg_inexact_min_tasks is not None:
        steps.CG_INEXACT_MIN_TASKS = args.cg_inexact_min_tasks
    rows = []
    for case in args.cases.split(","):
        key, loss, lam = CASES[case]
        path = dataset(key, work)
        if case == "school-default":
            config = dmtrl.DMTRLConfig(loss=loss, lam=lam)
        else:
            config = dmtrl.DMTRLConfig(loss=loss, lam=lam, tol=1e-6, outer=10, outer_tol=0, max_rounds=5000)
        row = {"case": case}
        for label, threshold in (("dense", 10 ** 9), ("matrix-free", 0)):
            sigma.FACTORED_MIN_TASKS = threshold
            t = time.perf_counter()
            with store.TaskFile(path) as source:
                r = dmtrl.train(SerialCluster(), source, config, warn=lambda msg: None)
            row[label] = {"rounds": int(r.n_rounds), "seconds": time.perf_counter() - t,
                          "primal": float(r.history["primal"][-1]), "converged": bool(r.converged)}
        rows.append(row)
        d, f = row["dense"], row["matrix-free"]
        print(f"{case:15s} dense {d['rounds']:5d} rounds {d['seconds']:6.2f} s   matrix-free {f['rounds']:5d} "
              f"rounds {f['seconds']:6.2f} s   ratio {f['rounds'] / d['rounds']:.3f}   primal diff "
              f"{abs(f['primal'] - d['primal']) / abs(d['primal']):.1e}", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="1000,10000")
    ap.add_argument("--ranks", default="1,3")
    ap.add_argument("--d", type=int, default=20)
    ap.add_argument("--outer", type=int, default=3)
    ap.add_argument("--max-rounds", type=int, default=100)
    ap.add_argument("--lam", type=float, default=1e-3)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--loss", default="squared", choices=("squared", "hinge", "smoothed-hinge", "logistic"))
    ap.add_argument("--factored-min-tasks", type=int, default=None)
    ap.add_argument("--batch-min-tasks", type=int, default=None)
    ap.add_argument("--cg-inexact-min-tasks", type=int, default=None)
    ap.add_argument("--spread-min-tasks", type=int, default=None)
    ap.add_argument("--gradient-batch-min-blocks", type=int, default=None)
    ap.add_argument("--outer-tol", type=float, default=0.0)
    ap.add_argument("--gradient-compare", action="store_true")
    ap.add_argument("--read", type=int, default=0)
    ap.add_argument("--convergence", action="store_true")
    ap.add_argument("--cases", default="school-raw-2,school-raw-3,school-std-2,school-std-3,school-default",
                    help="--convergence: bench_convergence.py's cases (syn1, syn2, small, small-raw, mnist, mds: hinge)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    work = args.work or tempfile.mkdtemp(prefix="hpcmtl-tasks-")
    os.makedirs(work, exist_ok=True)
    if args.convergence:
        return save_json(args.json, convergence(args, work))
    if args.read:
        return save_json(args.json, read_cost(args, work))
    rows = []
    print("     m  P  period s  round s  server s  (cpu s)  worker s  omega s  peak MB  bytes/round  CG/round  "
          "W-step rounds", flush=True)
    for m in [int(x) for x in args.tasks.split(",")]:
        label = "" if args.loss == "squared" else "-" + args.loss
        path = os.path.join(work, f"tasks-{m}-{args.d}{label}.h5")
        if not os.path.exists(path):
            make_tasks(path, m, args.d, loss=args.loss)
        for ranks in [int(x) for x in args.ranks.split(",")]:
            row = run_case(args, path, m, ranks, work)
            rows.append(row)
            marks = " ".join(f"{r}{'' if c else '>'}" for r, c in zip(row["wstep_rounds"], row["certified"]))
            print(f"{m:6d} {ranks:2d} {row['period_median']:9.4f} {row['round_median']:8.4f} "
                  f"{row['server_median']:9.4f} {row['server_cpu_median']:8.4f} "
                  f"{row['worker_median']:9.4f} {row['omega_median']:8.3f} "
                  f"{row['peak_mb']:8.0f} {row['bytes_round']:12.0f} {row['cg_products']:9.1f}  {marks}   "
                  f"(wall {row['wall']:.1f} s)", flush=True)
            print(f"        workers' CPU s a round (median trial + median apply, summed over the ranks): "
                  f"{row['worker_cpu_median']:.4f}", flush=True)
            print(f"        outside the rounds: reading the blocks {row['load_s']:.1f} s ({row['load_cpu']:.1f} CPU s, "
                  f"slowest rank), the intercepts' task means on rank 0 {row['means_s']:.1f} s "
                  f"({row['means_cpu']:.1f} CPU s)", flush=True)
            if any(row["spread_cpu"]):
                print("        spread algebra, CPU s a round by rank: " +
                      ", ".join(f"{c:.4f}" for c in row["spread_cpu"]), flush=True)
            if row["gradient_calls"]:
                print(f"        accelerated phase: {row['gradient_calls']} GRADIENT_TERMS, {row['gradient_cpu']:.2f} "
                      f"CPU s in them (all ranks)", flush=True)
            for r_, (b, o) in enumerate(zip(row["gradient_batched"], row["gradient_per_block"])):
                print(f"        GRADIENT_TERMS median CPU s a call, a rank holding blocks: one kernel call {b:.4f}, "
                      f"one call a block {o:.4f}, ratio {o / b:.2f} (the same bits)", flush=True)
    for ranks in sorted({r["ranks"] for r in rows}):
        by_m = {r["m"]: r["period_median"] for r in rows if r["ranks"] == ranks}
        if 1000 in by_m and 10000 in by_m:
            print(f"P = {ranks}: seconds a round at m = 10^4 / m = 10^3: {by_m[10000] / by_m[1000]:.2f} "
                  f"(linear: 10)")
    save_json(args.json, rows)


if __name__ == "__main__":
    main()
