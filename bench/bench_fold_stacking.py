"""Would the K folds of a grid point be cheaper as one fit (issue 39, item 1)?  The cost shares of the fold fits, and
the K folds stacked as one fit over K x m tasks against the K fits one after another, in the same run.

A fit's cost is per-block arithmetic + per-block Python + the server's step problems + a fixed part per round (the
command dispatch, the collectives' latency) and per fit (the servers' and the local states' set-up, the warm start,
the validation scores).  Stacking the folds divides only the fixed part by K; the server's step problems grow with
the task count (the squared loss's 2m x 2m pseudo-inverse: (K m)^3 against K m^3; a coupled fixed Sigma's box QP
over K m tasks), and the plan-wide switches keyed on the task count (the batched blocks and the factored Sigma at
512 tasks, the dense operator's QP at 64) turn at K m where the folds' own fits do not (so a stacked fit takes
other code paths, other bits).

For every case, one process (serial cluster):

* ``shares``: the real ``--cv 3`` path (:func:`hpcmtl.model_selection.train_path`; Landmine-shaped: 17 points from
  1e-5 to 1e-1, the small cases: 9 from 1e-4 to 1) under cProfile (``path s``: its profiled CPU), split into the
  workers' computation (what the dispatch ``engine.Endpoint.execute`` calls), the server's step problems
  (``StepSolver.take_steps``, the Omega-step, the learned Sigma's certificate), the set-up done once a path or a
  fold (:data:`SETUP`) and the rest (per round and per fit fixed: the only part stacking could divide by K);

and each fold's training rows of the path's own split (:func:`hpcmtl.model_selection.task_folds`, ``--cv 3``)
fitted at each lam of ``--lams`` from zero at the path's fold tolerance (100x --tol: 1e-4):

* ``sequential``: the K fold fits one after another (CPU seconds, median of ``--repeats``);
* ``stacked``: one fit over the K folds' training rows as K x m tasks, Sigma block-diagonal (K copies of the fold's
  Sigma: the stacked objective is the sum of the folds'), CPU seconds, median of ``--repeats``; in both the
  Sigma is checked once before the timed fits (:func:`checked`);

and the ratio stacked / sequential (< 1: stacking is cheaper).  A learned Sigma is not stackable this way (each
fold learns its own Sigma: a per-fold Omega-step), so ``landmine-dmtrl`` reports its shares only.

    python bench/bench_fold_stacking.py [--cases landmine-stl,landmine-dmtrl,small-stl,small-fixed,small-logistic]
        [--repeats 3] [--lams 1e-3,1e-2] [--tasks 300]

``--latency N`` (under ``mpiexec -n P``) instead measures the fixed cost of one command of the protocol between
ranks: N times a control broadcast (4 numbers, ``Cluster.bcast_array``) and a Gatherv of 150 numbers a worker
(``Cluster.gather_variable``), wall and CPU seconds a command on the server, the better of two passes.

    mpiexec -n 3 python bench/bench_fold_stacking.py --latency 2000
"""
import argparse
import cProfile
import os
import pstats
import statistics
import tempfile
import time

import numpy as np
import scipy.linalg

from bench_path import landmine_like
from hpcmtl import dmtrl
from hpcmtl.cluster import Cluster
from hpcmtl.model_selection import Selection, task_folds
from hpcmtl.taskdata import MemoryTasks

K = 3
FOLD_TOL = 1e-4          # the path's fold tolerance at the default --tol 1e-6 (selection_tol)

# cumulative-time buckets of the profile: the server's step problems (as the server calls them)
SERVER = (("dmtrl/steps.py", "take_steps"), ("dmtrl/server.py", "omega"))
SERVER_CALLERS = ("dmtrl/server.py", "dmtrl/outer.py")
# the learned Sigma's certificate and prox step: the server's own time in these modules (their worker halves,
# called by the dispatch, are the workers')
SERVER_FILES = ("dmtrl/joint.py", "dmtrl/dual_phase.py", "dmtrl/outer.py", "dmtrl/sigma.py", "hpcmtl/covariance.py")
# set-up done once a path or once a fold whatever the grid (loading, the split, the folds' cuts, the local states)
SETUP = (("engine.py", "load_blocks"), ("model_selection/split.py", "fold_plans"), ("model_selection/split.py", "cut"),
         ("model_selection/split.py", "local_folds"), ("model_selection/lam.py", "start"),
         ("dmtrl/worker.py", "__init__"))


def small_tasks(m, loss, seed=0):
    """m tasks of 20-40 rows, d = 20, in 10 groups sharing a direction; labels real (squared) or +-1; and a fixed
    Sigma (a task correlated 0.5 with its group's others, trace 1)."""
    rng = np.random.default_rng(seed)
    d, groups = 20, 10
    centers = rng.normal(size=(groups, d))
    Xs, ys = [], []
    for t in range(m):
        n = int(rng.integers(20, 41))
        X = rng.normal(size=(n, d))
        z = X @ (centers[t % groups] + 0.5 * rng.normal(size=d)) + 0.5 * rng.normal(size=n)
        Xs.append(X)
        ys.append(z if loss == "squared" else np.where(z > 0, 1.0, -1.0))
    g = np.arange(m) % groups
    S = np.where(g[:, None] == g[None, :], 0.5, 0.0) + 0.5 * np.eye(m)
    return Xs, ys, S / np.trace(S)


def fold_sets(Xs, ys, loss):
    """Each fold's training rows of every task (the path's split: task_folds, seed 0, stratified when binary)."""
    sel = Selection([1.0], cv=K).validate(loss)
    ids = [task_folds(y, 0, t, sel, stratify=loss != "squared") for t, y in enumerate(ys)]
    return [([X[i != f] for X, i in zip(Xs, ids)], [y[i != f] for y, i in zip(ys, ids)]) for f in range(K)]


def config(loss, lam, relationship):
    return dmtrl.DMTRLConfig(loss=loss, lam=lam, tol=FOLD_TOL, relationship=relationship,
                             outer_tol=1e-3 if relationship == "learned" else 2e-4)


def checked(sigma, m):
    """``dmtrl.train``'s Sigma check (an m x m eigvalsh a fit) skipped in the timed fits: every Sigma is checked once
    before them, as a path checks each point's Sigma (a stacked fit would check each fold's block once), so the
    (K m)^3 check of the stacked Sigma does not count against stacking."""
    return 0.5 * (np.asarray(sigma, dtype=np.float64) + np.asarray(sigma, dtype=np.float64).T)


def sequential(sources, loss, lams, relationship, sigma):
    for lam in lams:
        for source in sources:
            dmtrl.train(Cluster.serial(), source, config(loss, lam, relationship), sigma_fixed=sigma,
                        warn=lambda text: None)


def stacked_problem(folds, relationship, sigma):
    """The K folds as one task source of K x m tasks and its block-diagonal Sigma (STL's I/m per fold: a fixed
    diagonal Sigma, so that the stacked objective is the sum of the folds')."""
    Xs = [X for fx, _ in folds for X in fx]
    ys = [y for _, fy in folds for y in fy]
    m = len(folds[0][0])
    block = np.eye(m) / m if relationship == "identity" else sigma
    return MemoryTasks(Xs, ys), scipy.linalg.block_diag(*[block] * K)


def stacked(source, big, loss, lams):
    for lam in lams:
        dmtrl.train(Cluster.serial(), source, config(loss, lam, "fixed"), sigma_fixed=big, warn=lambda text: None)


def cpu(fn, repeats):
    runs = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        runs.append(time.process_time() - t)
    return statistics.median(runs)


def shares(fn):
    """(total, worker, server steps, set-up, rest) CPU seconds of ``fn()`` under cProfile (cumulative times of the
    workers' command computations, the server's step calls, the set-up's calls).  The rest is an upper bound of
    the fixed part: it also holds the server's per-block Python (per-task sums, scoring, payloads)."""
    prof = cProfile.Profile(time.process_time)
    prof.runcall(fn)
    stats = pstats.Stats(prof).stats
    total = sum(v[2] for v in stats.values())          # every function's own time
    # the workers' computation: what the protocol's dispatch (engine.Endpoint.execute) calls, less the collectives
    worker = sum(ct for (path, _, name), v in stats.items() if "/cluster/" not in path
                 for caller, (_, _, _, ct) in v[4].items()
                 if caller[0].endswith("engine.py") and caller[2] == "execute")
    # the server's step problems as the server calls them (a local round's one-task steps are the workers')
    server = sum(ct for (path, _, name), v in stats.items() if any(path.endswith(p) and name == n for p, n in SERVER)
                 for caller, (_, _, _, ct) in v[4].items() if caller[0].endswith(SERVER_CALLERS))
    # (the functions the dispatch reaches within three calls are the workers', already counted)
    below = {key for key, v in stats.items() if any(c[0].endswith("engine.py") and c[2] == "execute" for c in v[4])}
    for _ in range(2):
        below |= {key for key, v in stats.items() if any(c in below for c in v[4])}
    server += sum(v[2] for key, v in stats.items() if key[0].endswith(SERVER_FILES) and key not in below)
    setup = sum(v[3] for (path, _, name), v in stats.items() if any(path.endswith(p) and name == n for p, n in SETUP))
    return total, worker, server, setup, total - worker - server - setup


def path(Xs, ys, loss, relationship, sigma, grid):
    """The real path (``hpcmtl train ... --lam-grid --cv 3``) in this process."""
    from hpcmtl.model_selection import train_path
    cfg = dmtrl.DMTRLConfig(loss=loss, lam=1.0, relationship=relationship)
    train_path(Cluster.serial(), MemoryTasks(Xs, ys), cfg, Selection(list(grid), cv=K), sigma_fixed=sigma,
               warn=lambda text: None)


CASES = {
    # name: (data, loss, relationship)
    "landmine-stl": ("landmine", "logistic", "identity"),
    "landmine-dmtrl": ("landmine", "logistic", "learned"),
    "small-stl": ("small", "squared", "identity"),
    "small-fixed": ("small", "squared", "fixed"),
    "small-logistic": ("small", "logistic", "identity"),
}


def latency(n):
    """The per-command fixed cost between the ranks of this launch (server's wall and CPU, best of two passes)."""
    from hpcmtl.cluster import connect
    cluster = connect()
    mine = np.zeros(0) if cluster.is_server else np.ones(150)
    best = None
    for _ in range(2):
        cluster.barrier()
        wall, cpu_s = time.perf_counter(), time.process_time()
        for _ in range(n):
            cluster.bcast_array(np.zeros(4) if cluster.is_server else None, (4,))
            cluster.gather_variable(mine)
        run = ((time.perf_counter() - wall) / n, (time.process_time() - cpu_s) / n)
        best = run if best is None or run[0] < best[0] else best
    if cluster.is_server:
        print(f"{cluster.size} ranks: {best[0] * 1e6:.1f} us wall, {best[1] * 1e6:.1f} us CPU a command "
              f"(control Bcast + Gatherv of 150 numbers a worker; best of 2 passes of {n})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lams", default="1e-3,1e-2")
    ap.add_argument("--tasks", type=int, default=300, help="the small cases' task count")
    ap.add_argument("--latency", type=int, default=0, help="N: the per-command fixed cost between ranks instead")
    args = ap.parse_args()
    if args.latency:
        return latency(args.latency)
    lams = [float(v) for v in args.lams.split(",")]
    print(f"{K} folds' training rows, fits at lam {args.lams} from zero at relative gap {FOLD_TOL:g}, one process; "
          f"CPU seconds (median of {args.repeats}); shares of the --cv 3 path's profiled CPU", flush=True)
    print(f"{'case':<16} {'tasks':>5} {'path s':>7} {'worker':>7} {'server':>7} {'set-up':>7} {'fixed':>7} "
          f"{'seq s':>7} {'stacked s':>9} {'stacked/seq':>11}", flush=True)
    for name in args.cases.split(","):
        data, loss, relationship = CASES[name]
        if data == "landmine":
            Xs, ys = landmine_like(os.path.join(tempfile.mkdtemp(prefix="bench-stack-"), "lm.h5"))
            sigma = None
        else:
            Xs, ys, sigma = small_tasks(args.tasks, loss)
        sigma = sigma if relationship == "fixed" else None
        folds = fold_sets(Xs, ys, loss)
        sources = [MemoryTasks(fx, fy) for fx, fy in folds]
        grid = np.logspace(-5, -1, 17) if data == "landmine" else np.logspace(-4, 0, 9)
        total, worker, server, setup, rest = shares(lambda: path(Xs, ys, loss, relationship, sigma, grid))
        if relationship == "learned":
            seq = cpu(lambda: sequential(sources, loss, lams, relationship, sigma), args.repeats)
            stack, ratio = float("nan"), "(not stackable)"
        else:
            source, big = stacked_problem(folds, relationship, sigma)
            for s in [sigma, big]:
                if s is not None:
                    dmtrl.check_sigma(s, len(s))
            check, dmtrl.check_sigma = dmtrl.check_sigma, checked
            try:
                seq = cpu(lambda: sequential(sources, loss, lams, relationship, sigma), args.repeats)
                stack = cpu(lambda: stacked(source, big, loss, lams), args.repeats)
            finally:
                dmtrl.check_sigma = check
            ratio = f"{stack / seq:.2f}"
        print(f"{name:<16} {len(Xs):5d} {total:7.2f} {worker / total:7.0%} {server / total:7.0%} {setup / total:7.0%} "
              f"{rest / total:7.0%} {seq:7.2f} {stack:9.2f} {ratio:>11}", flush=True)


if __name__ == "__main__":
    main()
