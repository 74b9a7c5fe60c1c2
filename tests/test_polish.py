"""Margin corrections of stalled box-loss W-steps (dmtrl.margin_correction, DMTRL command POLISH).

On a task whose raw features reach 2.6e5 beside the intercept feature 1, ``w = sigma_ii b / lam`` cancels: the
dual is within 1e-10 of its optimum while the primal at that w stays a relative 5e-6 above it, and before the
corrections the W-step stalled there (hinge, lam 1e-2: 300 rounds, relative gap 5.4e-6).  Any W is a primal
point, so the W-step may certify at ``W + C``; these tests check that the certified P is the exact primal of the
model written, the edges of the correction, and the warning of a W-step that stalls for good.
"""
import warnings

import numpy as np
import pytest

from conftest import assert_bitwise_at_rank_counts, assert_certified_ascent, assert_resume_is_bitwise, \
    learned_hinge_args, run_hpcmtl
from test_interior import one_large_feature_tasks, raw_tasks

from hpcmtl import dmtrl, store
from hpcmtl.cluster import Cluster
from hpcmtl.dmtrl import DMTRLConfig, POLISH_MAX_FLOPS, margin_correction, rounds_since_halved, stalled_since, train
from hpcmtl.estimators import MemoryTasks
from hpcmtl.taskdata import TaskBlock


def scaled_tasks():
    """raw_tasks(11) (task 0 one row, a zero row in the others) with task 3's features times 1e4 (up to 2.6e5),
    task 1 one class and task 2 without features."""
    Xs, ys = raw_tasks(11, m=10, d=5, one_row=True, zero_row=True)
    Xs[3] = Xs[3] * 1e4
    ys[1] = -np.ones_like(ys[1])
    Xs[2] = np.zeros_like(Xs[2])
    return Xs, ys


def fit(Xs, ys, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**kw))


def exact_primal(Xs, ys, W, intercept, Sigma, lam, loss="hinge", gamma=1.0):
    """The MTRL primal of a written model, from the rows alone: mean loss per task plus (lam / 2) tr(W' Sigma^-1
    W'^T), W' with the intercepts as the augmented feature's row (intercept_scaling 1)."""
    Wa = np.vstack([W, intercept])
    total = 0.0
    for i, (X, y) in enumerate(zip(Xs, ys)):
        z = y * (np.column_stack([X, np.ones(len(y))]) @ Wa[:, i])
        if loss == "hinge":
            total += np.mean(np.maximum(0.0, 1.0 - z))
        else:
            total += np.mean(np.where(z >= 1, 0.0, np.where(z <= 1 - gamma, 1 - z - gamma / 2, (1 - z) ** 2 / (2 * gamma))))
    return total + 0.5 * lam * float(np.sum(Wa * np.linalg.solve(Sigma, Wa.T).T))


def block(X, y):
    return TaskBlock(0, "t", len(y), 0, np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64))


# -- the correction's edges ------------------------------------------------------------------------------------
def test_no_free_row_gives_no_correction():
    X = np.arange(12.0).reshape(4, 3)
    y = np.array([1.0, -1.0, 1.0, -1.0])
    for a in (np.zeros(4), y.copy(), np.array([0.0, -1.0, 0.0, -1.0])):      # every y alpha at 0 or 1
        c = margin_correction(block(X, y), a, np.ones(3), "hinge")
        assert c.shape == (3,) and not np.any(c)


def test_one_free_row_lands_on_its_margin_with_the_smallest_change():
    X, y = np.array([[3.0, 4.0]]), np.array([-1.0])
    w = np.array([0.5, -0.25])
    c = margin_correction(block(X, y), np.array([-0.5]), w, "hinge")
    assert y[0] * X[0] @ (w + c) == pytest.approx(1.0, abs=1e-15)
    assert np.allclose(c, X[0] * (1.0 - y[0] * X[0] @ w) / (X[0] @ X[0]) * y[0], atol=1e-15)    # along the row


def test_smoothed_hinge_targets_one_minus_gamma_beta_and_untouched_columns_stay_zero():
    rng = np.random.default_rng(3)
    X = np.column_stack([rng.normal(size=(6, 3)), np.zeros(6)])          # column 3 in no row
    X[2] = 0.0                                                           # a zero row, free: its margin stays 0
    y = np.where(rng.random(6) < 0.5, 1.0, -1.0)
    beta = np.array([0.3, 0.0, 0.5, 1.0, 0.7, 0.2])
    w = rng.normal(size=4)
    c = margin_correction(block(X, y), y * beta, w, "smoothed-hinge", gamma=0.5)
    assert c[3] == 0.0
    free = [0, 4, 5]                                                     # free, non-zero rows: on target exactly
    assert np.allclose(y[free] * (X[free] @ (w + c)), 1.0 - 0.5 * beta[free], atol=1e-13)


def test_a_least_squares_too_costly_is_skipped():
    d = 64
    rows = POLISH_MAX_FLOPS // (d * d) + 1
    X = np.ones((rows, d))
    y = np.ones(rows)
    assert not np.any(margin_correction(block(X, y), np.full(rows, 0.5), np.zeros(d), "hinge"))


def test_a_least_squares_costing_more_than_a_few_passes_over_sparse_rows_is_skipped():
    """|F| d min(|F|, d) within POLISH_MAX_FLOPS but above POLISH_FLOPS_PER_VALUE times the stored values (wide
    sparse rows): no correction; the same rows with values enough to pay for it: a correction."""
    import scipy.sparse as sp
    rows, d = 40, 4000
    rng = np.random.default_rng(3)
    X = sp.random(rows, d, density=2.0 / d, format="csr", random_state=rng) + sp.eye(rows, d, format="csr")
    y = np.ones(rows)
    flops = rows * d * rows
    assert flops <= POLISH_MAX_FLOPS and flops > dmtrl.POLISH_FLOPS_PER_VALUE * X.nnz
    sparse = TaskBlock(0, "t", rows, 0, X.tocsr(), y)
    assert sparse.sparse
    assert not np.any(margin_correction(sparse, np.full(rows, 0.5), np.zeros(d), "hinge"))
    c = margin_correction(block(X.toarray(), y), np.full(rows, 0.5), np.zeros(d), "hinge")
    assert np.allclose(X @ c, 1.0, atol=1e-12)


def test_stall_counting():
    assert rounds_since_halved([]) == 0
    assert rounds_since_halved([1.0, 0.4, 0.3, 0.25, 0.19]) == 0        # 0.19 < 0.4 / 2
    assert rounds_since_halved([1.0, 0.4, 0.3, 0.25]) == 2
    assert stalled_since(list(range(1, 6)), [1.0, 0.4, 0.3, 0.25, 0.21]) is None   # fewer than STALLED_ROWS
    gaps = [1e-3] + [4e-4] * 30
    assert stalled_since(list(range(1, 32)), gaps) == 2
    assert stalled_since(list(range(1, 32)), [1e-3 * 0.4 ** k for k in range(31)]) is None


# -- whole W-steps ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loss", ["hinge", "smoothed-hinge"])
def test_a_task_of_features_near_3e5_certifies_and_the_model_written_has_the_certified_primal(loss):
    Xs, ys = scaled_tasks()
    X, y = [Xs[3]], [ys[3]]
    r = fit(X, y, loss=loss, lam=1e-2, relationship="identity", max_rounds=300)
    h = r.history
    assert r.converged and h["rel_gap"][-1] <= 1e-6 and r.n_rounds <= 20   # before: 300 rounds, 5.4e-6
    assert_certified_ascent(h)
    primal = exact_primal(X, y, r.W, r.intercept, r.Sigma, 1e-2, loss)
    assert primal == pytest.approx(h["primal"][-1], rel=1e-12)
    assert primal - h["dual"][-1] <= 1e-6 * primal                   # the written model against the dual


def test_learned_sigma_with_a_badly_scaled_task_certifies_every_w_step():
    Xs, ys = scaled_tasks()
    r = fit(Xs, ys, loss="hinge", lam=1e-2, outer=4, outer_tol=0)
    steps = r.wsteps
    assert r.converged and steps["converged"].all() and np.all(steps["rel_gap"] <= 1e-6)
    assert_certified_ascent(r.history)
    assert exact_primal(Xs, ys, r.W, r.intercept, r.Sigma, 1e-2) == pytest.approx(r.history["primal"][-1], rel=1e-10)


def test_without_the_correction_the_same_w_step_stalls(monkeypatch):
    from hpcmtl import dmtrl
    monkeypatch.setattr(dmtrl.Server, "polish_possible", lambda self: False)
    monkeypatch.setattr(dmtrl, "IPM_AFTER_STALL", 10 ** 9)        # nor the turn to interior-point rounds
    monkeypatch.setattr(dmtrl, "IPM_AFTER_LOCAL_STALL", 10 ** 9)
    Xs, ys = scaled_tasks()
    r = fit([Xs[3]], [ys[3]], loss="hinge", lam=1e-2, relationship="identity", max_rounds=60)
    assert not r.converged and r.history["rel_gap"][-1] > 1e-6


# -- the CLI: a W-step that stalls for good, every rank count, killed and resumed ------------------------------
@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    directory = tmp_path_factory.mktemp("polish")
    Xs, ys = scaled_tasks()
    store.write_tasks(directory / "all.h5", Xs, ys, names=[f"t{i}" for i in range(10)])
    store.write_tasks(directory / "one.h5", [Xs[3]], [ys[3]], names=["t3"])
    Xs, ys = one_large_feature_tasks(1)
    store.write_tasks(directory / "large.h5", Xs, ys, names=[f"t{i}" for i in range(len(Xs))])
    return directory


def test_a_w_step_that_stalls_for_good_says_more_rounds_will_not_help(scaled, tmp_path):
    out = tmp_path / "r.h5"
    # lam 1e-5 and a feature near 1e5 in every task: neither the local rounds nor the interior-point rounds
    # they turn to resolve the intercept beside it (the gap stays near 1)
    r = run_hpcmtl(["train", "stl", "--train", str(scaled / "large.h5"), "--out", str(out), "--lam", "1e-5",
                    "--max-rounds", "60", "--force"])
    assert r.returncode == 0, r.stderr
    assert "the gap has not halved since round 1, so more rounds will not help" in r.stderr
    assert "standardize them (hpcmtl data standardize)" in r.stderr
    assert store.read_result(out)["model"]["converged"] == 0
    # short of rounds, not stalled: the old advice
    r = run_hpcmtl(["train", "stl", "--train", str(scaled / "all.h5"), "--out", str(out), "--lam", "1e-3",
                    "--local-solver", "sdca", "--max-rounds", "3", "--force"])
    assert r.returncode == 0, r.stderr
    assert "(raise --max-rounds; the model of this step is not certified)" in r.stderr
    assert "more rounds will not help" not in r.stderr


@pytest.mark.mpi
def test_corrected_w_steps_are_bitwise_at_1_2_3_5_ranks_and_resume_bitwise(scaled, tmp_path):
    def args(out, *extra):
        return learned_hinge_args(str(scaled / "all.h5"), str(out), "1e-2", "3", *extra)
    ref = assert_bitwise_at_rank_counts(args, tmp_path)
    steps = ref["wsteps"]
    assert ref["model"]["converged"] == 1 and steps["converged"].all()
    first = int(steps["round"][0])
    assert 1 < first <= 10                  # W-step 1 (local rounds) certifies by its correction
    # killed in W-step 1 before its correction: resumed at another rank count, the same correction, bitwise
    out = tmp_path / "r.h5"
    assert_resume_is_bitwise(args(out, "--checkpoint-every", "1"), out, ref, first - 1, first - 2)


def test_a_least_squares_without_a_finite_answer_gives_no_correction(monkeypatch):
    X, y = np.array([[3.0, 4.0], [1.0, 2.0]]), np.array([1.0, -1.0])
    a = np.array([0.5, -0.5])
    monkeypatch.setattr(np.linalg, "lstsq", lambda *args, **kw: (np.array([np.inf, 0.0]),))
    assert not np.any(margin_correction(block(X, y), a, np.zeros(2), "hinge"))

    def fails(*args, **kw):
        raise np.linalg.LinAlgError("SVD did not converge")
    monkeypatch.setattr(np.linalg, "lstsq", fails)
    assert not np.any(margin_correction(block(X, y), a, np.zeros(2), "hinge"))
