"""The same bits at every rank count: one parametrized test over the case table ``CASES``.

Each case trains one command line under ``mpiexec -n P`` for every P of its ``counts`` and checks that the
result's ``compare`` arrays are bitwise those of the first count; then its own ``check`` (convergence,
traffic per round, a killed and resumed run, a ``--split-tasks`` run ...) runs on those results.  A new case
is one entry: its data, its command line, and what else it asserts.
"""
import os
from dataclasses import dataclass
from unittest import mock
from typing import Callable, Optional

import numpy as np
import pytest
from numpy.testing import assert_allclose

from hpcmtl import store
from hpcmtl.covariance import model_sigma

from conftest import assert_certified_ascent, assert_resume_is_bitwise, learned_hinge_args, run_hpcmtl
from conftest import wsteps_certified  # noqa: E402

pytestmark = pytest.mark.mpi

MODEL = (("model", "W"), ("model", "Sigma"))
FACTORS = tuple(("model", k) for k in ("sigma_V", "sigma_s", "sigma_c"))      # Sigma of many tasks, as factors
GRAPH = tuple(("model", k) for k in ("graph_indptr", "graph_indices", "graph_data", "graph_alpha", "graph_diag"))
HISTORY = tuple(("history", k) for k in ("round", "primal", "dual", "step"))


@dataclass
class Case:
    data: Callable                   # data(directory) -> what ``args`` trains on (written once a session)
    args: Callable                   # args(data, out) -> the ``hpcmtl`` command line
    check: Optional[Callable] = None  # check(runs, data, args, tmp_path): the case's own assertions
    counts: tuple = (1, 2, 3, 5)
    compare: tuple = MODEL + HISTORY
    timeout: int = 300
    env: Optional[dict] = None        # the environment's additions for every run of the case (its check's too)


# -- training data -------------------------------------------------------------------------------------------
def synth_file(*options):
    def make(directory):
        path = os.path.join(directory, "tr.h5")
        r = run_hpcmtl(["data", "synth", "dmtrl1", path, *options])
        assert r.returncode == 0, r.stderr
        return path
    return make


SYNTH_AGGREGATION = synth_file("--scale", "0.04", "--seed", "5")


def synth_with_test(directory):
    tr, te = os.path.join(directory, "tr.h5"), os.path.join(directory, "te.h5")
    r = run_hpcmtl(["data", "synth", "dmtrl1", tr, "--test", te, "--scale", "0.04", "--seed", "5"])
    assert r.returncode == 0, r.stderr
    return tr, te


def written(make_tasks):
    """``make_tasks()`` -> (Xs, ys[, names]) written as a task file."""
    def make(directory):
        tasks = make_tasks()
        path = os.path.join(directory, "tr.h5")
        names = tasks[2] if len(tasks) > 2 else [f"t{i}" for i in range(len(tasks[0]))]
        store.write_tasks(path, tasks[0], tasks[1], names=names)
        return path
    return make


def interior_small_raw():
    from test_interior import raw_tasks
    return raw_tasks(7, m=12, d=6, zero_row=True)


def interior_one_large_feature():
    from test_interior import one_large_feature_tasks
    return one_large_feature_tasks(1)


def polish_scaled():
    from test_polish import scaled_tasks
    return scaled_tasks()


def polish_sparse_rows():
    """Synthetic 2 at 30 % of its rows with the values below 1.5 in magnitude dropped (13 % of them stay),
    stored as CSR: the third W-step's corrections go through the free rows' Gram matrix (min_norm_through_gram;
    62 of them at P = 1)."""
    import scipy.sparse as sp
    from hpcmtl import synthetic
    (Xs, ys, names), _, _ = synthetic.dmtrl(2, 0, 0.3)
    return [sp.csr_matrix(np.where(np.abs(X) >= 1.5, X, 0.0)) for X in Xs], ys, names


def intercept_tasks(sparse):
    def make(directory):
        from test_intercept import offset_tasks
        Xs, ys = offset_tasks(seed=10, sparse=sparse, m=5, d=6, sizes=(40, 60, 35, 50, 45))
        path = os.path.join(directory, "tr.h5")
        store.write_tasks(path, Xs, ys)
        return path
    return make


def synth_float32(directory):
    """dmtrl1 synthetic data as float64 and as float32 (the same values rounded)."""
    paths = {k: os.path.join(directory, f"{k}.h5") for k in ("tr64", "te64", "tr32", "te32")}
    for tr, te, extra in (("tr64", "te64", []), ("tr32", "te32", ["--float32"])):
        r = run_hpcmtl(["data", "synth", "dmtrl1", paths[tr], "--test", paths[te], "--scale", "0.04", "--seed", "5",
                        *extra])
        assert r.returncode == 0, r.stderr
    return paths


def synth_local(directory):
    path = os.path.join(directory, "s.h5")
    assert run_hpcmtl(["data", "synth", "dmtrl1", path, "--scale", "0.05", "--seed", "3"]).returncode == 0
    return path


def sparse_supports(directory):
    """test_supports' sparse tasks, with the sum over tasks of |support| (one block a task), m and d."""
    from test_supports import sparse_tasks
    Xs, ys = sparse_tasks()
    path = os.path.join(directory, "sparse.h5")
    store.write_tasks(path, Xs, ys, force=True)
    return path, sum(int(np.unique(X.indices).size) for X in Xs), len(Xs), Xs[0].shape[1]


def joint_sparse_synth(directory):
    tr, te = os.path.join(directory, "tr.h5"), os.path.join(directory, "te.h5")
    assert run_hpcmtl(["data", "synth", "joint-sparse", tr, "--test", te, "--n-train", "20"]).returncode == 0
    with store.TaskFile(tr) as tf:
        C = float(tf.read_truth()["l1inf_norm"])
    return tr, te, C


def radius_tasks(directory):
    from test_radius_path import small_tasks
    Xs, ys, test = small_tasks()
    tr, te = os.path.join(directory, "js.h5"), os.path.join(directory, "js-test.h5")
    store.write_tasks(tr, Xs, ys)
    store.write_tasks(te, test[0], test[1])
    return tr, te


def csr_offsets(directory):
    import scipy.sparse as sp
    rng = np.random.default_rng(4)
    Xs = [sp.random(n, 40, density=0.15, random_state=rng, format="csr") for n in (40, 55, 30)]
    ys = [np.asarray(X @ rng.normal(size=40)).ravel() + 10.0 * (i + 1) + 0.1 * rng.normal(size=X.shape[0])
          for i, X in enumerate(Xs)]
    tr = os.path.join(directory, "csr.h5")
    store.write_tasks(tr, Xs, ys)
    return tr


def seasonal(directory):
    months = os.path.join(directory, "months.h5")
    assert run_hpcmtl(["data", "synth", "seasonal", months, "--scale", "0.3"]).returncode == 0
    return months


def many_tasks(directory):
    """512 related tasks of 6-9 rows and 5 features: from dmtrl.sigma.FACTORED_MIN_TASKS tasks on, a learned
    Sigma is held as factors and the step problems are matrix-free (issue 35)."""
    rng = np.random.default_rng(35)
    centers = rng.normal(size=(4, 5))
    Xs, ys, hinge = [], [], []
    for t in range(512):
        X = rng.normal(size=(int(rng.integers(6, 10)), 5))
        z = X @ (centers[t % 4] + 0.3 * rng.normal(size=5))
        Xs.append(X)
        ys.append(z + 0.3 * rng.normal(size=z.size))
        hinge.append(np.where(z + 0.3 * rng.normal(size=z.size) > 0, 1.0, -1.0))
    paths = os.path.join(directory, "many.h5"), os.path.join(directory, "many-hinge.h5")
    store.write_tasks(paths[0], Xs, ys, names=[f"t{i}" for i in range(512)])
    store.write_tasks(paths[1], Xs, hinge, names=[f"t{i}" for i in range(512)])
    return paths


def many_tasks_fixed(directory):
    """many_tasks and a learned result's file of its 512 tasks (Sigma's factors, rank 4) for `train fixed --sigma`."""
    from hpcmtl.dmtrl.sigma import omega_factors
    paths = many_tasks(directory)
    rng = np.random.default_rng(36)
    W = rng.normal(size=(512, 4)) @ rng.normal(size=(4, 5))
    sigma = os.path.join(directory, "learned.h5")
    store.write_result(sigma, W.T, omega_factors(W, 1e-3), {"round": np.arange(2)}, {}, 1, "test")
    return paths + (sigma,)


# -- command lines -------------------------------------------------------------------------------------------
def aggregation_args(loss):
    def args(tr, out):
        return ["train", "dmtrl", "--train", tr, "--out", out, "--loss", "hinge", "--lam", "1e-3",
                "--tol", "1e-6", "--outer", "3", "--outer-tol", "0", "--quiet", "--force", "--loss", loss]
    return args


def mpi_args(data, out):
    return ["train", "dmtrl", "--train", data[0], "--out", out, "--loss", "hinge", "--lam", "1e-2",
            "--tol", "1e-5", "--outer", "3", "--quiet", "--force"]


def learned(lam, outer):
    def args(tr, out, *extra):
        return learned_hinge_args(str(tr), str(out), lam, outer, *extra)
    return args


def intercept_args(tr, out, *extra):
    return ["train", "dmtrl", "--train", tr, "--loss", "squared", "--lam", "1e-2", "--tol", "1e-9", "--outer", "3",
            "--quiet", "--force", "--out", out, *extra]


def path_args(data, out, *extra):
    tr, te = data
    return ["train", "dmtrl", "--train", tr, "--out", out, "--loss", "hinge", "--lam-grid", "1e-3:1e-1:3",
            "--tol", "1e-5", "--outer", "2", "--force", "--quiet", "--cv", "3", *extra]


def float32_args(paths, out, *extra, train="tr32", test="te32"):
    return ["train", "dmtrl", "--train", paths[train], "--test", paths[test], "--out", out, "--loss", "hinge",
            "--lam", "1e-2", "--tol", "1e-8", "--outer", "3", "--max-rounds", "3000", "--quiet", "--force", *extra]


def stl_exchange(exchange):
    def args(tr, out):
        return ["train", "stl", "--train", tr, "--out", out, "--lam", "1e-3", "--quiet", "--exchange", exchange]
    return args


def supports_args(data, out, *extra):
    return ["train", "dmtrl", "--train", data[0], "--out", out, "--loss", "hinge", "--lam", "1e-2", "--tol", "1e-6",
            "--outer", "3", "--outer-tol", "0", "--quiet", "--force", *extra]


def l1inf_args(data, out, *extra):
    tr, te, C = data
    return ["train", "l1inf", "--train", tr, "--radius", C, "--eta0", "100", "--max-rounds", "30", "--quiet",
            "--out", out, *extra]


def radius_args(data, out):
    tr, te = data
    return ["train", "l1inf", "--train", tr, "--test", te, "--out", out, "--path", "0.5,2,8", "--eta0", "20",
            "--max-rounds", "40", "--cv", "3", "--log-level", "warning"]


def csr_path_args(tr, out, *extra):
    return ["train", "stl", "--train", tr, "--out", out, "--loss", "squared", "--lam", "1e-2,1e-1", "--cv", "3",
            "--tol", "1e-9", "--quiet", *extra]


def graph_alpha_args(months, out):
    return ["train", "graph", "--graph", "cycle", "--alpha", "1,0.01,0.1", "--lam", "1e-3", "--train", months,
            "--out", out, "--loss", "squared", "--cv", "3", "--no-intercept", "--quiet"]


# -- the cases' own checks -----------------------------------------------------------------------------------
def many_tasks_args(loss):
    def args(paths, out, *extra):
        return ["train", "dmtrl", "--train", paths[loss == "hinge"], "--out", out, "--loss", loss, "--lam", "1e-2",
                "--tol", "1e-6", "--outer", "3", "--outer-tol", "0", "--quiet", "--force", *extra]
    return args


def sparse_graph_args(paths, out, *extra):
    """train graph over 512 tasks: from task_graph.SPARSE_GRAPH_MIN_TASKS on, the kernel is held sparse."""
    return ["train", "graph", "--graph", "grid 16x32", "--alpha", "0.05", "--train", paths[0], "--out", out,
            "--loss", "squared", "--lam", "1e-2", "--tol", "1e-8", "--quiet", "--force", *extra]


def fixed_factors_args(loss):
    """train fixed --sigma LEARNED.h5 over 512 tasks: from dmtrl.sigma.FACTORED_MIN_TASKS on, the factors are kept."""
    def args(paths, out, *extra):
        return ["train", "fixed", "--sigma", paths[2], "--train", paths[loss == "hinge"], "--out", out, "--loss", loss,
                "--lam", "1e-2", "--tol", "1e-8", "--quiet", "--force", *extra]
    return args


def accelerated_args(tr, out, *extra):
    """Smoothed hinge, learned Sigma, the default --outer and --outer-tol: the accelerated outer step runs."""
    return ["train", "dmtrl", "--train", tr, "--out", out, "--loss", "smoothed-hinge", "--lam", "1e-3", "--tol", "1e-6",
            "--quiet", "--force", *extra]


def dual_phase_args(tr, out, *extra):
    """Hinge, learned Sigma, the default --outer and --outer-tol: the dual phase runs after each W-step."""
    return ["train", "dmtrl", "--train", tr, "--out", out, "--loss", "hinge", "--lam", "1e-3", "--tol", "1e-6",
            "--quiet", "--force", *extra]


def check_accelerated(runs, data, args, tmp_path):
    ref = converged(runs)
    steps = ref["wsteps"]
    assert steps["apg_iterations"][0] > 0 and ref["model"]["converged"]
    assert steps["joint_rel_gap"][-1] <= 1e-3 and steps["joint_dual"][-1] <= steps["joint_primal"][-1]
    # killed in W-step 2, after the first accelerated phase: the checkpoint carries its step size, the resumed
    # run (another rank count) takes the same phases, bitwise
    out = tmp_path / "r.h5"
    kill = int(steps["round"][0]) + 2
    res = assert_resume_is_bitwise(args(data, out, "--checkpoint-every", "1"), out, ref, kill, kill - 1)
    for key in ("joint_primal", "joint_dual", "apg_iterations", "prox_primal"):
        assert res["wsteps"][key].tobytes() == steps[key].tobytes(), key


def converged(runs):
    ref = runs[1]
    assert wsteps_certified(ref) and ref["wsteps"]["converged"].all()
    return ref


def check_mpi(runs, data, args, tmp_path):
    for p, res in runs.items():
        assert res["n_ranks"] == p
    assert runs[1]["history"]["rel_gap"][-1] <= 1e-5
    # bytes per round under the default aggregation (hinge: box momentum): delta b up and w down, 2 * 8 * d * m,
    # and the momentum direction's b where it differs from the server's dP (at most whole: 3 * 8 * d * m), plus
    # per-task scalars (9), the direction's header and control messages
    h = runs[5]["history"]
    per_round = np.diff(h["bytes"]) / np.diff(h["round"])
    d, m = 100, 16
    assert 2 * 8 * d * m <= np.median(per_round) <= 1.05 * 8 * (3 * d + 10) * m


def check_aggregation(loss):
    def check(runs, data, args, tmp_path):
        converged(runs)
        # traffic, O(d) a task and round: delta b with 5 (hinge: 6) scalars up, w with 3 scalars down; hinge: and
        # the momentum direction's b where it differs from the server's dP (at most whole, plus its header)
        h = runs[5]["history"]
        per_round = np.median(np.diff(h["bytes"]) / np.diff(h["round"]))
        d, m = 100, 16
        vectors, scalars = (3, 10) if loss == "hinge" else (2, 8)
        assert 2 * 8 * d * m <= per_round <= 1.05 * 8 * (vectors * d + scalars) * m
    return check


def check_spread(runs, data, args, tmp_path):
    """check_factored with the resume, and the spread really ran: rank 0's server path gives other bits (and the
    same first round to the CG's stopping rule)."""
    check_factored(True)(runs, data, args, tmp_path)
    out = tmp_path / "rank0.h5"
    r = run_hpcmtl(args(data, out), env={"HPCMTL_SPREAD_MIN_TASKS": str(10 ** 9)})
    assert r.returncode == 0, r.stderr
    server = store.read_result(out)
    assert server["model"]["W"].tobytes() != runs[1]["model"]["W"].tobytes()
    # the first coupled round's ascent: from CG_INEXACT_MIN_TASKS (512) on CG stops at its gain, where another
    # summation order moves the iterate by about sqrt(1e-8) of the step (1.3e-6 of the dual measured); to 1e-12 when
    # CG runs to its residual (tests/test_spread.py)
    assert_allclose(server["history"]["dual"][:2], runs[1]["history"]["dual"][:2], rtol=1e-5)


def check_exact_box(runs, data, args, tmp_path):
    ref = converged(runs)
    assert ref["wsteps"]["round"][0] == 1                    # the first W-step (Sigma = I/m): one exact round
    h = ref["history"]
    assert_certified_ascent(h)                               # P >= D, dual ascent in every W-step
    assert h["round"][-1] > 15
    out = tmp_path / "r.h5"
    assert_resume_is_bitwise(args(data, out, "--checkpoint-every", "4"), out, ref, 15, 12)


def check_factored(resume):
    def check(runs, data, args, tmp_path):
        ref = converged(runs)
        assert_certified_ascent(ref["history"])
        # the result file holds Sigma's factors, no m x m array (issue 35)
        assert "Sigma" not in ref["model"]
        Sigma = model_sigma(ref["model"])
        assert Sigma.shape == (512, 512) and 0 < Sigma.V.shape[1] <= 6       # r <= d (+ 1: the hinge intercept)
        assert np.trace(Sigma.dense()) == pytest.approx(1.0)
        if resume:                  # the checkpoint keeps Sigma's factors: a resume takes the same (factored) path
            out = tmp_path / "r.h5"
            kill = int(ref["wsteps"]["round"][1]) + 3
            res = assert_resume_is_bitwise(args(data, out, "--checkpoint-every", "2"), out, ref, kill,
                                           kill - 2 + kill % 2)
            for _, key in FACTORS:
                assert res["model"][key].tobytes() == ref["model"][key].tobytes(), key
            ck = store.read_checkpoint(str(out) + ".checkpoint.h5")
            assert "sigma_V" in ck["arrays"] and ck["arrays"]["sigma_V"].shape[0] == 512
            assert "Sigma" not in ck["arrays"]
    return check


def check_interior_learned(runs, data, args, tmp_path):
    from hpcmtl import interior
    ref = converged(runs)
    steps = ref["wsteps"]
    assert np.all(steps["rel_gap"] <= 1e-6)
    assert steps["round"][0] == 1                             # Sigma = I/m: one round of exact local steps
    assert np.max(np.diff(steps["round"])) <= interior.MAX_ROUNDS   # the coupled ones: interior-point rounds only
    assert_certified_ascent(ref["history"])
    # killed inside W-step 3's interior-point rounds: the checkpoint is the one after W-step 2 (none inside them)
    out = tmp_path / "r.h5"
    assert_resume_is_bitwise(args(data, out, "--checkpoint-every", "1"), out, ref,
                             int(steps["round"][1]) + 3, int(steps["round"][1]))


def check_interior_turn(runs, data, args, tmp_path):
    from hpcmtl import dmtrl
    ref = converged(runs)
    turn = dmtrl.INTERIOR_AFTER_LOCAL_STALL + 1           # the first row sets the gap the next ones do not halve
    assert turn < ref["wsteps"]["round"][0] <= 40
    # killed inside those interior-point rounds: the checkpoint is the state they began from, bitwise again
    out = tmp_path / "r.h5"
    assert_resume_is_bitwise(args(data, out, "--checkpoint-every", "1"), out, ref, turn + 4, turn)


def check_polish_corrected(runs, data, args, tmp_path):
    ref = converged(runs)
    first = int(ref["wsteps"]["round"][0])
    assert 1 < first <= 10                  # W-step 1 (local rounds) certifies by its correction
    # killed in W-step 1 before its correction: resumed at another rank count, the same correction, bitwise
    out = tmp_path / "r.h5"
    assert_resume_is_bitwise(args(data, out, "--checkpoint-every", "1"), out, ref, first - 1, first - 2)


def check_polish_sparse_rows(runs, data, args, tmp_path):
    converged(runs)


def check_intercept(runs, data, args, tmp_path):
    ref = runs[1]["model"]
    assert np.all(np.isfinite(ref["intercept"])) and np.min(np.abs(ref["intercept"])) > 1.0
    # split tasks: every block is centered by its whole task's means; the same optimum
    out = tmp_path / "split.h5"
    r = run_hpcmtl(args(data, out, "--split-tasks", "--tol", "1e-11", "--max-rounds", "5000"), n_ranks=4,
                   timeout=240)
    assert r.returncode == 0, r.stderr
    split = store.read_result(out)
    assert split["history"]["rel_gap"][-1] <= 1e-11
    assert_allclose(split["model"]["intercept"], ref["intercept"], rtol=1e-5)
    assert_allclose(split["model"]["W"], ref["W"], atol=1e-5 * np.abs(ref["W"]).max())


def check_path(runs, data, args, tmp_path):
    ref = runs[1]
    assert ref["path"]["fold_scores"].shape == (3, 3) and ref["config"]["selection"]["cv"] == 3
    for p in (2, 3):
        assert runs[p]["config"]["selection"] == ref["config"]["selection"]
    split = tmp_path / "split.h5"
    r = run_hpcmtl(["train", "dmtrl", "--train", data[0], "--out", split, "--loss", "hinge", "--lam-grid",
                    "1e-3:1e-1:3", "--tol", "1e-5", "--outer", "2", "--force", "--quiet", "--cv", "3",
                    "--split-tasks"], n_ranks=3, timeout=300)
    assert r.returncode == 0, r.stderr
    s = store.read_result(split)
    assert s["config"]["selection"]["split_digest"] == ref["config"]["selection"]["split_digest"]
    assert s["config"]["selection"]["chosen_lam"] == ref["config"]["selection"]["chosen_lam"]


def certified(res, tol=1e-8):
    gap = res["history"]["rel_gap"]
    assert np.all(np.isfinite(gap)) and np.all(np.isfinite(res["model"]["W"]))
    assert wsteps_certified(res) and gap[-1] <= tol


def check_float32(runs, paths, args, tmp_path):
    out = tmp_path / "s.h5"
    r = run_hpcmtl(args(paths, out, "--float32", train="tr64", test="te64"), n_ranks=3, timeout=240)
    assert r.returncode == 0, r.stderr
    runs = dict(runs, split=store.read_result(out))
    for res in runs.values():
        certified(res)
    ref = runs[1]
    for key in ("W", "Sigma"):
        assert runs["split"]["model"][key].tobytes() == ref["model"][key].tobytes()
    assert np.array_equal(runs["split"]["history"]["primal"], ref["history"]["primal"])
    # the float32 file and --float32 on the original hold the same float32 partitions
    assert np.array_equal(runs["split"]["ranks"]["partition_mb"], runs[3]["ranks"]["partition_mb"])
    # the same test metrics at every rank count, and the server computes them from the workers' scores: a
    # worker grows by its (small) partition and a few MB, never by scikit-learn's import (59 MB, issue 14)
    for n in (2, 3, "split"):
        assert runs[n]["test"]["summary"] == ref["test"]["summary"], n
        info = runs[n]["ranks"]
        grown = info["peak_rss_mb"][1:] - info["rss_before_data_mb"][1:]
        assert np.all(np.isfinite(grown)) and np.all(grown < info["partition_mb"][1:] + 30), (n, grown)


def check_stl_local_rounds(runs, path, args, tmp_path):
    with store.TaskFile(path) as info:
        m, d = info.n_tasks, info.n_features
    out = tmp_path / "dense-3.h5"
    r = run_hpcmtl(stl_exchange("dense")(path, out), n_ranks=3)
    assert r.returncode == 0, r.stderr
    h = runs[3]["history"]
    per_round = np.diff(h["bytes"])[:-1] / np.diff(h["round"])[:-1]        # the last one includes pulling B
    assert np.all(per_round == 32 * 2 + 5 * 8 * m)          # the control to 2 workers, 5 numbers a task back
    dense = store.read_result(out)["history"]
    assert np.all(np.diff(dense["bytes"])[:-1] >= 2 * 8 * d * m)
    assert h["rel_gap"][-1] <= 1e-6 and dense["rel_gap"][-1] <= 1e-6


def check_supports(runs, data, args, tmp_path):
    from test_supports import assert_files_alike, per_round, run, sparse_tasks
    path, support, m, d = data
    assert wsteps_certified(runs[1])
    # box momentum: delta b up (6 scalars) and w down (3), on the supports (+1 a task: the augmented intercept
    # feature), and the few rows' corrections of the momentum direction, in the W-steps that exchange (after
    # the first): the target
    h = runs[3]["history"]
    exchanged = h["outer"] >= 1
    assert exchanged.sum() >= 5
    on_support = support + m
    assert 2 * 8 * on_support <= per_round(h, exchanged) <= 1.1 * 2 * 8 * on_support + 64 * 1024
    # the line aggregation never takes local rounds: auto and dense do the same arithmetic, split or not
    # (task 0 cut in two at P = 3: its blocks' supports overlap; the other tasks stay whole)
    line = {ex: run(path, tmp_path, f"h-line-{ex}", "hinge", 3, "--aggregation", "line", "--exchange", ex,
                    "--split-tasks") for ex in ("auto", "dense")}
    assert_files_alike(line["auto"], line["dense"], exact=False)
    # the two pieces of task 0 carry at least its support together and at most twice it
    most = on_support + np.unique(sparse_tasks()[0][0].indices).size + 1
    assert 2 * 8 * on_support <= per_round(line["auto"]["history"]) <= 1.1 * 2 * 8 * most + 64 * 1024


def check_l1inf(runs, data, args, tmp_path):
    tr, te, C = data
    a, b = runs[1], runs[3]
    assert "Sigma" not in a["model"] and a["path"]["selected"][0] <= 200
    assert 0 < b["test"]["summary"]["task_mean_error_rate"] < 0.5
    killed = tmp_path / "k.h5"
    r = run_hpcmtl(l1inf_args(data, killed, "--checkpoint-every", "4"), n_ranks=3, env={"HPCMTL_FAULT": "1:11:kill"})
    assert r.returncode != 0 and not killed.exists()
    assert run_hpcmtl(l1inf_args(data, killed, "--resume"), n_ranks=2).returncode == 0
    assert store.read_result(killed)["model"]["W"].tobytes() == a["model"]["W"].tobytes()
    r = run_hpcmtl(["train", "l1inf", "--train", tr, "--out", tmp_path / "x.h5"])
    assert r.returncode == 2 and "method 'l1inf' needs --radius C" in r.stderr
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", tmp_path / "x.h5"])
    assert r.returncode == 2 and "method 'dmtrl' needs --lam" in r.stderr


def check_radius(runs, data, args, tmp_path):
    tr, te = data
    ref = runs[1]
    sel = ref["config"]["selection"]
    scores = ref["path"]["validation_score"]
    assert np.all(np.isfinite(scores)) and sel["chosen_index"] == int(np.argmin(scores))
    assert sel["parameter"] == "radius" and sel["cv"] == 3 and ref["config"]["radius"] == sel["chosen_radius"]
    assert ref["test"]["summary"]["pooled_error_rate"] < 0.5
    at_edge = sel["chosen_index"] in (0, 2)
    assert (len(sel["warnings"]) == 1) == at_edge
    assert ref["stderr"].count("hpcmtl: warning: the chosen radius") == int(at_edge)
    # two points: the chosen one is an edge whatever it is, and the warning names it and its end
    out = tmp_path / "edge.h5"
    r = run_hpcmtl(["train", "l1inf", "--train", tr, "--out", out, "--path", "1e-3,4", "--eta0", "20",
                    "--max-rounds", "20", "--validation-fraction", "0.3", "--quiet"], n_ranks=2, timeout=300)
    assert r.returncode == 0, r.stderr
    sel = store.read_result(out)["config"]["selection"]
    end = "smallest" if sel["chosen_radius"] == 1e-3 else "largest"
    text = f"the chosen radius {sel['chosen_radius']:.4g} is the {end} of the grid (0.001 .. 4)"
    assert sel["warnings"] and sel["warnings"][0].startswith(text)
    assert r.stderr.count(f"hpcmtl: warning: {text}") == 1


def check_csr_path(runs, tr, args, tmp_path):
    """With --split-tasks (a task's blocks on several ranks, each centered on the fold's means) the same choice."""
    ref = runs[1]
    assert ref["config"]["fit_intercept"] and np.all(ref["path"]["converged"] == 1)
    out = tmp_path / "p3.h5"
    r = run_hpcmtl(args(tr, out, "--split-tasks"), n_ranks=3, timeout=300)
    assert r.returncode == 0, r.stderr
    split = store.read_result(out)
    assert split["config"]["selection"]["chosen_lam"] == ref["config"]["selection"]["chosen_lam"]
    assert np.allclose(split["path"]["fold_scores"], ref["path"]["fold_scores"], rtol=1e-4, atol=0)
    assert np.allclose(split["model"]["intercept"], ref["model"]["intercept"], rtol=1e-4, atol=1e-4)


def check_graph_alpha(runs, months, args, tmp_path):
    from hpcmtl import dmtrl
    from hpcmtl.task_graph import graph_adjacency, task_kernel
    a = runs[1]
    sel = a["config"]["selection"]
    assert list(a["path"]["alpha"]) == [1.0, 0.1, 0.01] and np.all(a["path"]["lam"] == 1e-3)
    assert np.all(np.isfinite(a["path"]["validation_score"]))
    assert sel["parameter"] == "alpha"
    assert sel["chosen_alpha"] == a["path"]["alpha"][np.argmin(a["path"]["validation_score"])]
    names = a["model"]["task_names"]
    expected = dmtrl.check_sigma(task_kernel(graph_adjacency("cycle", names), sel["chosen_alpha"], True, names),
                                 len(names))
    assert np.array_equal(a["model"]["Sigma"], expected)          # the refit is at the chosen alpha's kernel


def check_sparse_graph(runs, data, args, tmp_path):
    """The result file holds the graph (no m x m array), its kernel the dense task_kernel's; a resume is bitwise."""
    from hpcmtl.task_graph import task_kernel, topology
    ref = converged(runs)
    assert_certified_ascent(ref["history"])
    assert "Sigma" not in ref["model"] and "sigma_V" not in ref["model"]
    Sigma = model_sigma(ref["model"])
    assert Sigma.shape == (512, 512) and Sigma.adjacency.nnz == 2 * (15 * 32 + 16 * 31)
    assert_allclose(Sigma.dense(), task_kernel(topology("grid 16x32", 512), 0.05), rtol=0, atol=1e-12)
    out = tmp_path / "r.h5"
    kill = int(ref["history"]["round"][-1]) // 2 + 1
    res = assert_resume_is_bitwise(args(data, out, "--checkpoint-every", "2"), out, ref, kill, kill - 2 + kill % 2)
    for _, key in GRAPH:
        assert res["model"][key].tobytes() == ref["model"][key].tobytes(), key
    ck = store.read_checkpoint(str(out) + ".checkpoint.h5")
    assert "Sigma" not in ck["arrays"] and ck["arrays"]["graph_alpha"].shape == (512,)


def check_fixed_factors(resume):
    def check(runs, data, args, tmp_path):
        """The result file holds the given factors bit for bit (no m x m array); a resume is bitwise."""
        ref = converged(runs)
        assert_certified_ascent(ref["history"])
        assert "Sigma" not in ref["model"]
        given = store.read_result(data[2])["model"]
        for _, key in FACTORS:
            assert ref["model"][key].tobytes() == given[key].tobytes(), key
        # report (it reads Sigma as factors; its correlation plot is a learned Sigma's) and evaluate read the file
        result = tmp_path / f"p{min(runs)}.h5"
        r = run_hpcmtl(["report", result, "--out", tmp_path / "report"])
        assert r.returncode == 0 and os.path.getsize(tmp_path / "report" / "gap.png") > 0, r.stderr
        r = run_hpcmtl(["evaluate", result, args(data, "x")[5]])          # on its training file
        assert r.returncode == 0 and "tasks" in r.stdout, r.stderr
        if resume:
            out = tmp_path / "r.h5"
            kill = int(ref["history"]["round"][-1]) // 2 + 1
            res = assert_resume_is_bitwise(args(data, out, "--checkpoint-every", "2"), out, ref, kill,
                                           kill - 2 + kill % 2)
            ck = store.read_checkpoint(str(out) + ".checkpoint.h5")
            assert "Sigma" not in ck["arrays"] and ck["arrays"]["sigma_V"].tobytes() == given["sigma_V"].tobytes()
            assert res["model"]["sigma_V"].tobytes() == given["sigma_V"].tobytes()
    return check


CASES = {
    "dmtrl hinge": Case(synth_with_test, mpi_args, check_mpi, timeout=240,
                        compare=MODEL + (("history", "primal"),)),
    "aggregation hinge": Case(SYNTH_AGGREGATION, aggregation_args("hinge"),
                              check_aggregation("hinge"), compare=MODEL + HISTORY + (("history", "rho"),)),
    "aggregation squared": Case(SYNTH_AGGREGATION, aggregation_args("squared"),
                                check_aggregation("squared"), compare=MODEL + HISTORY + (("history", "rho"),)),
    "factored Sigma, many tasks, squared": Case(many_tasks, many_tasks_args("squared"), check_factored(True),
                                                counts=(1, 2, 3), compare=(("model", "W"),) + FACTORS + HISTORY),
    # the squared loss's step products and W spread over the ranks by task chunks (dmtrl/spread.py, from 512 tasks
    # here): 8 chunks of 64 tasks, none at P = 1, split 3-3-2 at P = 3, two a rank at P = 4; killed at P = 3 and
    # resumed at P = 2 to the same bits
    "spread squared step, many tasks": Case(many_tasks, many_tasks_args("squared"), check_spread,
                                            counts=(1, 2, 3, 4), compare=(("model", "W"),) + FACTORS + HISTORY,
                                            env={"HPCMTL_SPREAD_MIN_TASKS": "512"}),
    # the box losses' step products (rank 0's projected Newton-CG) and W by the same chunks: the same bits at P = 1-4
    # (P = 3, 4 on this machine's 2 cores: rank 0 computes every chunk), killed at P = 3 and resumed at P = 2
    "spread box step, many tasks, hinge": Case(many_tasks, many_tasks_args("hinge"), check_spread,
                                               counts=(1, 2, 3, 4), compare=(("model", "W"),) + FACTORS + HISTORY,
                                               env={"HPCMTL_SPREAD_MIN_TASKS": "512",
                                                    "HPCMTL_SPREAD_PRECOND_MIN_TASKS": "512"}),
    "factored Sigma, many tasks, hinge": Case(many_tasks, many_tasks_args("hinge"), check_factored(False),
                                              counts=(1, 3), compare=(("model", "W"),) + FACTORS + HISTORY),
    "graph kernel held sparse, many tasks": Case(many_tasks, sparse_graph_args, check_sparse_graph, counts=(1, 2, 3),
                                                 compare=(("model", "W"),) + GRAPH + HISTORY),
    "fixed factored Sigma, many tasks, squared": Case(many_tasks_fixed, fixed_factors_args("squared"),
                                                      check_fixed_factors(True), counts=(1, 2, 3),
                                                      compare=(("model", "W"),) + FACTORS + HISTORY),
    "fixed factored Sigma, many tasks, hinge": Case(many_tasks_fixed, fixed_factors_args("hinge"),
                                                    check_fixed_factors(False), counts=(1, 3),
                                                    compare=(("model", "W"),) + FACTORS + HISTORY),
    "accelerated outer step": Case(SYNTH_AGGREGATION, accelerated_args, check_accelerated, counts=(1, 2, 3),
                                   compare=MODEL + HISTORY + (("wsteps", "joint_primal"), ("wsteps", "joint_dual"),
                                                              ("wsteps", "apg_iterations"))),
    "hinge dual phase": Case(SYNTH_AGGREGATION, dual_phase_args, check_accelerated, counts=(1, 2, 3),
                             compare=MODEL + HISTORY + (("wsteps", "joint_primal"), ("wsteps", "joint_dual"),
                                                        ("wsteps", "apg_iterations"))),
    "exact box steps": Case(synth_file("--scale", "0.025", "--seed", "5"), learned("1e-3", "3"),
                            check_exact_box),
    "interior-point W-steps": Case(written(interior_small_raw), learned("1e-4", "4"), check_interior_learned),
    "turn to interior-point rounds": Case(written(interior_one_large_feature), learned("1e-2", "2"),
                                          check_interior_turn),
    "margin corrections": Case(written(polish_scaled), learned("1e-2", "3"), check_polish_corrected),
    "margin corrections of sparse rows": Case(written(polish_sparse_rows), learned("1e-3", "3"),
                                              check_polish_sparse_rows),
    "intercept dense": Case(intercept_tasks(False), intercept_args, check_intercept, counts=(1, 2, 3),
                            compare=MODEL + (("model", "intercept"),), timeout=240),
    "intercept sparse": Case(intercept_tasks(True), intercept_args, check_intercept, counts=(1, 2, 3),
                             compare=MODEL + (("model", "intercept"),), timeout=240),
    "lam path by cv": Case(synth_with_test, lambda data, out: path_args(data, out, "--test", data[1]),
                           check_path, counts=(1, 2, 3),
                           compare=MODEL + (("path", "validation_score"), ("path", "fold_scores"),
                                            ("path", "rounds"), ("history", "primal"))),
    "float32 features": Case(synth_float32, float32_args, check_float32, counts=(1, 2, 3), timeout=240,
                             compare=MODEL + (("history", "primal"),)),
    "stl local rounds": Case(synth_local, stl_exchange("auto"), check_stl_local_rounds, counts=(1, 3, 4),
                             compare=(("model", "W"),)),
    "hinge on supports": Case(sparse_supports, supports_args, check_supports, counts=(1, 2, 3), timeout=120,
                              compare=MODEL + HISTORY + (("history", "rho"),)),
    "l1inf": Case(joint_sparse_synth, lambda data, out: l1inf_args(data, out, "--test", data[1]), check_l1inf,
                  counts=(1, 3), compare=(("model", "W"),), timeout=180),
    "radius path by cv": Case(radius_tasks, radius_args, check_radius, counts=(1, 2),
                              compare=(("model", "W"), ("model", "intercept"), ("path", "fold_scores"),
                                       ("path", "selected"))),
    "squared intercept path on csr": Case(csr_offsets, csr_path_args, check_csr_path, counts=(1, 2),
                                          compare=(("model", "W"), ("model", "intercept"), ("path", "fold_scores"))),
    "graph alpha path by cv": Case(seasonal, graph_alpha_args, check_graph_alpha, counts=(1, 2),
                                   compare=(("model", "W"), ("path", "validation_score"))),
}

DATA = {}          # data function -> what it wrote (once a session)


@pytest.mark.parametrize("name", CASES)
def test_the_same_bits_at_every_rank_count(name, tmp_path, tmp_path_factory):
    case = CASES[name]
    if case.data not in DATA:
        DATA[case.data] = case.data(str(tmp_path_factory.mktemp("data")))
    data = DATA[case.data]
    runs = {}
    for p in case.counts:
        out = tmp_path / f"p{p}.h5"
        r = run_hpcmtl(case.args(data, out), n_ranks=p, timeout=case.timeout, env=case.env)
        assert r.returncode == 0, r.stderr
        runs[p] = store.read_result(out)
        runs[p]["stderr"] = r.stderr
    ref = runs[case.counts[0]]
    for p in case.counts[1:]:
        for group, key in case.compare:
            assert runs[p][group][key].tobytes() == ref[group][key].tobytes(), f"{group}/{key} differs at P={p}"
    if case.check is not None:
        with mock.patch.dict(os.environ, case.env or {}):
            case.check(runs, data, case.args, tmp_path)
