"""Sparse supports in the DMTRL exchange (issue 14): a round moves delta b up and w down only on each block's
support; the results are the dense exchange's, bitwise (the server adds the same numbers in the same order), at
every rank count, with split tasks, with centered and augmented intercepts, and across a checkpoint and resume."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from hpcmtl import dmtrl, store, synthetic
from hpcmtl.cluster import Cluster
from hpcmtl.dmtrl import DMTRLConfig, SupportLayout, train
from hpcmtl.estimators import MemoryTasks
from hpcmtl.taskdata import TaskBlock

from conftest import mpiexec_path, run_hpcmtl

SIZES = (200, 30, 40, 25, 35, 20)      # task 0 is larger than a worker's share at P = 3: --split-tasks cuts it


def sparse_tasks(sizes=SIZES, d=3000):
    """Tasks of a few hundred features each out of d (Zipf vocabularies), of unequal sizes."""
    (Xs, ys, _), _, _ = synthetic.sparse_vocabulary(seed=0, m=len(sizes), d=d, vocabulary=300,
                                                    n_per_task=max(sizes), words=20)
    return [X[:n] for X, n in zip(Xs, sizes)], [y[:n] for y, n in zip(ys, sizes)]


def fit(Xs, ys, supports=True, **kw):
    """In one process; ``supports=False``: auto as it was before supports (dense rows, every block computed on
    all d columns: no block has a support to exchange on)."""
    original = dmtrl.exchange_index
    if not supports:
        dmtrl.exchange_index = lambda block, d: None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**kw))
    finally:
        dmtrl.exchange_index = original


def test_layout_packs_each_blocks_support_and_restores_the_rows():
    d = 7
    layout = SupportLayout([np.array([1, 4]), np.zeros(0, dtype=np.int64), np.arange(d)], d)
    rows = np.zeros((3, 2 * d + 2))
    rows[0, [1, 4, d + 1, d + 4]] = (1.0, 2.0, 3.0, 4.0)
    rows[2, :2 * d] = np.arange(2 * d) + 10.0
    rows[:, 2 * d:] = [[5.0, 6.0], [7.0, 8.0], [9.0, -1.0]]
    flat = layout.pack(rows, 2)
    assert flat.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0] + list(np.arange(2 * d) + 10.0) + [9.0, -1.0]
    assert layout.rows(flat, 2, 2).tobytes() == rows.tobytes()
    with pytest.raises(ValueError):
        layout.rows(flat[:-1], 2, 2)


def test_a_blocks_support_is_what_its_rows_touch_with_the_mean_and_the_intercept_feature():
    X = sp.csr_matrix(np.array([[0.0, 2.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 3.0]]))
    blk = TaskBlock(0, "t", 2, 0, X, np.array([1.0, -1.0]))
    assert blk.support.tolist() == [1, 4] and blk.support.dtype == np.int64
    assert blk.augmented(1.0).support.tolist() == [1, 4, 5]                 # the constant column d
    mu = np.array([0.5, 0.0, 0.0, 0.25, 0.0])                              # the whole task's mean (split task)
    assert blk.centered(mu, 0.0).support.tolist() == [0, 1, 3, 4]
    assert TaskBlock(0, "t", 2, 0, X.toarray(), np.ones(2)).support.tolist() == list(range(5))   # dense rows
    empty = TaskBlock(0, "t", 2, 0, sp.csr_matrix((2, 5)), np.ones(2))
    assert empty.support.size == 0


@pytest.mark.parametrize("loss,aggregation,intercept", [
    ("hinge", "qp", True), ("hinge", "qp", False), ("hinge", "safe", True), ("squared", "qp", True),
    ("squared", "qp", False), ("logistic", "line", True), ("smoothed-hinge", "adaptive", True)])
def test_supports_give_the_dense_rows_bitwise(loss, aggregation, intercept):
    Xs, ys = sparse_tasks()
    kw = dict(loss=loss, aggregation=aggregation, fit_intercept=intercept, lam=1e-2, tol=1e-6, outer=3,
              max_rounds=300)
    before, after = fit(Xs, ys, supports=False, **kw), fit(Xs, ys, **kw)
    assert np.all(np.isfinite(after.W)) and after.history["rel_gap"][-1] <= 1e-6
    # the workers compute on each block's support columns (dot products added in index order): the same bits
    assert after.W.tobytes() == before.W.tobytes() and after.Sigma.tobytes() == before.Sigma.tobytes()
    assert after.intercept.tobytes() == before.intercept.tobytes()
    for key in ("primal", "dual", "step"):
        assert after.history[key].tobytes() == before.history[key].tobytes(), key


def test_edges_an_empty_support_a_task_of_one_row_and_one_feature():
    rng = np.random.default_rng(4)
    d = 200
    Xs = [sp.random(30, d, density=0.01, random_state=1, format="csr"), sp.csr_matrix((20, d)),     # all-zero rows
          sp.random(1, d, density=0.05, random_state=2, format="csr"), sp.random(25, d, density=0.01, random_state=3,
                                                                                  format="csr")]
    ys = [np.sign(rng.normal(size=X.shape[0])) + (np.sign(rng.normal(size=X.shape[0])) == 0) for X in Xs]
    for loss, intercept in (("hinge", False), ("hinge", True), ("squared", True)):
        kw = dict(loss=loss, fit_intercept=intercept, lam=1e-2, tol=1e-6, outer=2, max_rounds=300)
        before, after = fit(Xs, ys, supports=False, **kw), fit(Xs, ys, **kw)
        assert np.all(np.isfinite(after.W)) and after.W.tobytes() == before.W.tobytes(), (loss, intercept)
    one = [sp.csr_matrix(rng.normal(size=(n, 1))) for n in (5, 8)]        # d = 1: the support is never below d/2
    y1 = [rng.normal(size=5), rng.normal(size=8)]
    before, after = fit(one, y1, supports=False, loss="squared"), fit(one, y1, loss="squared")
    assert after.W.tobytes() == before.W.tobytes()


# ---------------------------------------------------------------------------
# Through mpiexec: bytes per round, every rank count, split tasks, resume
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    Xs, ys = sparse_tasks()
    path = tmp_path_factory.mktemp("supports") / "sparse.h5"
    store.write_tasks(path, Xs, ys, force=True)
    # sum over tasks of |support| (one block a task); hinge adds the augmented feature to each
    return path, sum(int(np.unique(X.indices).size) for X in Xs), len(Xs), Xs[0].shape[1]


def args_of(path, out, loss, *extra):
    return ["train", "dmtrl", "--train", path, "--out", out, "--loss", loss, "--lam", "1e-2", "--tol", "1e-6",
            "--outer", "3", "--outer-tol", "0", "--quiet", "--force", *extra]


def run(path, tmp_path, name, loss, ranks, *extra, env=None):
    out = tmp_path / f"{name}.h5"
    r = run_hpcmtl(args_of(path, out, loss, *extra), n_ranks=ranks, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return store.read_result(out)


def per_round(h, rows=None):
    rows = np.ones(h["round"].size, dtype=bool) if rows is None else rows
    return np.median((np.diff(h["bytes"]) / np.diff(h["round"]))[rows[1:]])


@pytest.mark.mpi
def test_squared_rounds_move_the_supports_only_and_match_the_dense_exchange_bitwise(data, tmp_path):
    path, support, m, d = data
    runs = {(ex, p): run(path, tmp_path, f"sq-{ex}-{p}", "squared", p, "--exchange", ex)
            for ex, p in (("auto", 3), ("dense", 3))}
    ref = runs["dense", 3]
    assert ref["model"]["converged"] == 1
    # no local rounds for the squared loss: the same arithmetic (P = 1: test_supports_give_the_dense_rows_bitwise)
    assert runs["auto", 3]["model"]["W"].tobytes() == ref["model"]["W"].tobytes()
    assert runs["auto", 3]["model"]["intercept"].tobytes() == ref["model"]["intercept"].tobytes()
    for key in ("primal", "dual", "step"):
        assert runs["auto", 3]["history"][key].tobytes() == ref["history"][key].tobytes(), key
    # the target: one vector up (delta b, 5 scalars) and one down (w, 3 scalars) on the supports
    auto, dense = per_round(runs["auto", 3]["history"]), per_round(runs["dense", 3]["history"])
    assert np.isfinite(auto) and np.isfinite(dense)
    assert 2 * 8 * support <= auto <= 1.1 * 2 * 8 * support + 64 * 1024
    assert dense >= 2 * 8 * d * m > 5 * auto
    # split tasks (task 0 cut in two at P = 3: its blocks carry the whole task's support, the mean's)
    split = {ex: run(path, tmp_path, f"sq-split-{ex}", "squared", 3, "--exchange", ex, "--split-tasks")
             for ex in ("auto", "dense")}
    assert np.array_equal(split["auto"]["model"]["W"], split["dense"]["model"]["W"])
    assert np.array_equal(split["auto"]["history"]["primal"], split["dense"]["history"]["primal"])
    assert per_round(split["auto"]["history"]) < per_round(split["dense"]["history"]) / 5


@pytest.mark.mpi
def test_hinge_supports_are_bitwise_at_every_rank_count_and_with_split_tasks(data, tmp_path):
    path, support, m, d = data
    runs = {p: run(path, tmp_path, f"h-{p}", "hinge", p) for p in (1, 2, 3)}
    ref = runs[1]
    assert ref["model"]["converged"] == 1
    for p in (2, 3):
        assert runs[p]["model"]["W"].tobytes() == ref["model"]["W"].tobytes(), p
        assert runs[p]["model"]["Sigma"].tobytes() == ref["model"]["Sigma"].tobytes(), p
        for key in ("round", "primal", "dual", "step", "rho"):
            assert runs[p]["history"][key].tobytes() == ref["history"][key].tobytes(), (key, p)
    # box momentum: delta b and the momentum direction's b up (6 scalars), w down (3): 3 vectors on the
    # supports (+1 a task: the augmented intercept feature), in the W-steps that exchange (after the first)
    h = runs[3]["history"]
    exchanged = h["outer"] >= 1
    assert exchanged.sum() >= 5
    on_support = support + m
    assert 3 * 8 * on_support <= per_round(h, exchanged) <= 1.1 * 3 * 8 * on_support + 64 * 1024
    # the line aggregation never takes local rounds: auto and dense do the same arithmetic, split or not
    # (task 0 cut in two at P = 3: its blocks' supports overlap; the other tasks stay whole)
    line = {ex: run(path, tmp_path, f"h-line-{ex}", "hinge", 3, "--aggregation", "line", "--exchange", ex,
                    "--split-tasks") for ex in ("auto", "dense")}
    assert np.array_equal(line["auto"]["model"]["W"], line["dense"]["model"]["W"])
    assert np.array_equal(line["auto"]["history"]["dual"], line["dense"]["history"]["dual"])
    # the two pieces of task 0 carry at least its support together and at most twice it
    most = on_support + np.unique(sparse_tasks()[0][0].indices).size + 1
    assert 2 * 8 * on_support <= per_round(line["auto"]["history"]) <= 1.1 * 2 * 8 * most + 64 * 1024


@pytest.mark.mpi
def test_dense_tasks_keep_the_dense_exchange_and_its_bytes(tmp_path):
    rng = np.random.default_rng(5)
    d, m = 40, 4
    Xs = [rng.normal(size=(n, d)) for n in (20, 30, 25, 15)]
    ys = [X @ rng.normal(size=d) + 0.1 * rng.normal(size=X.shape[0]) for X in Xs]
    path = tmp_path / "dense.h5"
    store.write_tasks(path, Xs, ys, force=True)
    runs = {ex: run(path, tmp_path, f"dense-{ex}", "squared", 3, "--exchange", ex) for ex in ("auto", "dense")}
    auto, dense = runs["auto"], runs["dense"]
    assert auto["model"]["W"].tobytes() == dense["model"]["W"].tobytes()
    assert np.array_equal(auto["history"]["round"], dense["history"]["round"])
    # the same collectives every round; once, GET_SUPPORTS: one number a block ([-1]: exchanged whole)
    assert np.all(auto["history"]["bytes"] - dense["history"]["bytes"] == 8 * m + 32 * 2)     # + its control


@pytest.mark.mpi
def test_resume_on_supports_is_bitwise_at_another_rank_count(data, tmp_path):
    path = data[0]
    # smoothed hinge: the first W-step (Sigma = I/m) runs local rounds, rounds 18-42 exchange on supports
    ref = run(path, tmp_path, "ref", "smoothed-hinge", 3, "--tol", "1e-9")
    assert ref["history"]["round"][-1] > 35 and ref["history"]["outer"][ref["history"]["round"] == 30] >= 1
    out = tmp_path / "r.h5"
    args = args_of(path, out, "smoothed-hinge", "--tol", "1e-9", "--checkpoint-every", "5")
    killed = [mpiexec_path(), "-n", "3", sys.executable, "-m", "hpcmtl"] + [str(a) for a in args]
    proc = subprocess.run(killed, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, HPCMTL_FAULT="1:33:kill"))
    assert proc.returncode != 0 and not out.exists()
    assert store.read_checkpoint(str(out) + ".checkpoint.h5")["counters"]["round"] == 30
    r = run_hpcmtl(args + ["--resume"], n_ranks=2, timeout=120)
    assert r.returncode == 0, r.stderr
    res = store.read_result(out)
    assert res["model"]["W"].tobytes() == ref["model"]["W"].tobytes()
    for key in ("round", "primal", "dual", "step"):
        assert res["history"][key].tobytes() == ref["history"][key].tobytes(), key


@pytest.mark.mpi
def test_test_rows_off_the_supports_are_scored_with_the_whole_w(tmp_path):
    """Workers compute on their blocks' support columns; test rows touch other features too.  The test metrics
    reported during training equal `hpcmtl evaluate` on the saved model: learned Sigma (w is pushed whole at the
    end), STL (local rounds only: w = sigma_ii b / lam vanishes off the support), the centered squared loss."""
    (Xs, ys, _), (Xt, yt, _), _ = synthetic.sparse_vocabulary(seed=2, m=5, d=3000, vocabulary=300, n_per_task=60,
                                                               words=20, test_fraction=0.5)
    train_path, test_path = tmp_path / "train.h5", tmp_path / "test.h5"
    store.write_tasks(train_path, Xs, ys, force=True)
    store.write_tasks(test_path, Xt, yt, force=True)
    off = sum(np.setdiff1d(np.unique(T.indices), np.unique(X.indices)).size for X, T in zip(Xs, Xt))
    assert off > 0                                                # test rows do touch features off the supports
    for method, loss in (("dmtrl", "hinge"), ("stl", "hinge"), ("dmtrl", "squared")):
        out = tmp_path / f"{method}-{loss}.h5"
        args = ["train", method, "--train", train_path, "--test", test_path, "--out", out, "--loss", loss,
                "--lam", "1e-2", "--tol", "1e-6", "--outer", "2", "--quiet", "--force"]
        r = run_hpcmtl(args, n_ranks=3, timeout=120)
        assert r.returncode == 0, r.stderr
        during = store.read_result(out)["test"]["summary"]
        ev = run_hpcmtl(["evaluate", out, test_path, "--json"])
        assert ev.returncode == 0, ev.stderr
        import json
        after = json.loads(ev.stdout)["summary"]
        key = "task_mean_error_rate" if loss == "hinge" else "task_mean_rmse"
        assert np.isfinite(after[key]) and during[key] == pytest.approx(after[key], rel=1e-12, abs=1e-12), \
            (method, loss)
