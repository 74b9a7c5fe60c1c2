"""Joint-sparse's radius chosen by validation in one job (issue 15 part 2, paper 002): each fold's path scored
against separate fits, the refit, errors (the same bits at P = 1 and 2 and the edge warning:
test_rank_counts.py)."""
import numpy as np
import pytest

from hpcmtl import store, synthetic
from hpcmtl.cluster import Cluster
from hpcmtl.estimators import MemoryTasks
from hpcmtl.joint_sparse import JointSparseConfig
from hpcmtl.joint_sparse import train as train_js
from hpcmtl.model_selection import Selection, task_folds, train_radius_path, validation_score

from conftest import run_hpcmtl


def small_tasks(m=6, n=40):
    train, test, _ = synthetic.joint_sparse(3, n_train=n, n_test=60, d=30, m=m)
    return train[0], train[1], test


def test_every_fold_scores_what_a_separate_path_on_its_training_rows_scores():
    """The path of each fold equals a separate joint-sparse path on that fold's training rows (the same
    arithmetic: one block a task, rows in order), so its validation error is the one computed here from the
    separate fit's W and b; the refit on all rows starts from the last fold's solution at the chosen radius."""
    Xs, ys, _ = small_tasks()
    config = JointSparseConfig(eta0=20.0, max_rounds=40, seed=2)
    selection = Selection([8.0, 0.5, 2.0], cv=3, name="radius")
    result = train_radius_path(Cluster.serial(), MemoryTasks(Xs, ys), config, selection)
    grid = [0.5, 2.0, 8.0]                                    # the smallest ball (most regularized) first
    assert list(result.path["radius"]) == grid and selection.metric == "error"
    folds = [task_folds(y, 2, t, selection, stratify=True) for t, y in enumerate(ys)]
    expected = np.zeros((3, 3))
    last = None
    for f in range(3):
        keep = [ids != f for ids in folds]
        sep = train_js(Cluster.serial(), MemoryTasks([X[k] for X, k in zip(Xs, keep)], [y[k] for y, k in zip(ys, keep)]),
                       JointSparseConfig(eta0=20.0, max_rounds=40, seed=2), radii=grid)
        for g in range(3):
            W, b = sep.path["W"][g], sep.path["intercept"][g]
            scores = [X[~k] @ W[:, t] + b[t] for t, (X, k) in enumerate(zip(Xs, keep))]
            expected[g, f] = validation_score("error", [y[~k] for y, k in zip(ys, keep)], scores)
        last = sep
    assert np.all(np.isfinite(result.path["fold_scores"]))
    assert np.allclose(result.path["fold_scores"], expected, rtol=0, atol=1e-12)
    assert np.allclose(result.path["validation_score"], expected.mean(axis=1), rtol=0, atol=1e-12)
    chosen = int(np.argmin(expected.mean(axis=1)))
    assert result.selection["chosen_radius"] == grid[chosen] and result.config["radius"] == grid[chosen]
    assert np.all(result.path["rounds"] == 3 * 40)             # max_rounds subgradient steps a radius a fold
    # the refit: max_rounds steps on all rows at the chosen radius from the last fold's W and b there
    refit = train_js(Cluster.serial(), MemoryTasks(Xs, ys), JointSparseConfig(eta0=20.0, max_rounds=40, seed=2),
                     radii=[grid[chosen]], W0=last.path["W"][chosen], b0=last.path["intercept"][chosen])
    assert np.array_equal(result.W, refit.W) and np.array_equal(result.intercept, refit.intercept)
    assert np.abs(result.W).max(axis=1).sum() <= grid[chosen] * (1 + 1e-12)


@pytest.fixture
def js_file(tmp_path):
    Xs, ys, test = small_tasks()
    tr, te = tmp_path / "js.h5", tmp_path / "js-test.h5"
    store.write_tasks(tr, Xs, ys)
    store.write_tasks(te, test[0], test[1])
    return tr, te


@pytest.mark.mpi
@pytest.mark.parametrize("option,message", [
    (["--radius", "1", "--metric", "auc"], "--metric goes with --validation-fraction or --cv"),
    (["--path", "1,2", "--cv", "3", "--metric", "rmse"], "The 'metric' parameter of hpcmtl train must be error, auc or "
                                                         "logloss for the hinge loss. Got 'rmse' instead."),
])
def test_bad_radius_selections_fail_with_one_line_on_every_rank(js_file, tmp_path, option, message):
    tr, _ = js_file
    out = tmp_path / "bad.h5"
    r = run_hpcmtl(["train", "l1inf", "--train", tr, "--out", out, *option], n_ranks=2)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert not out.exists()


@pytest.mark.filterwarnings("ignore:the chosen radius")
def test_estimator_chooses_the_radius_like_the_path_function():
    from hpcmtl import JointSparseMTL
    Xs, ys, test = small_tasks()
    est = JointSparseMTL(radius=[8.0, 0.5, 2.0], cv=3, eta0=20.0, max_rounds=40, seed=2).fit(Xs, ys)
    ref = train_radius_path(Cluster.serial(), MemoryTasks(Xs, ys), JointSparseConfig(eta0=20.0, max_rounds=40, seed=2),
                            Selection([8.0, 0.5, 2.0], cv=3, name="radius"))
    assert est.radius_ == ref.selection["chosen_radius"] and est.best_params_ == {"radius": est.radius_}
    assert np.array_equal(est.W_, ref.W) and np.array_equal(est.intercept_, ref.intercept)
    res = est.cv_results_
    assert list(res["param_radius"]) == [0.5, 2.0, 8.0]
    assert np.array_equal(res["mean_test_score"], -ref.path["validation_score"])      # greater is better
    assert res["rank_test_score"][est.best_index_] == 1 and est.best_score_ == ref.path["validation_score"].min()
    assert np.array_equal(res["split1_test_score"], -ref.path["fold_scores"][:, 1])
    err = np.mean(np.concatenate([est.predict(X, np.full(len(y), t)) != y for t, (X, y) in enumerate(zip(*test[:2]))]))
    assert err < 0.5
    plain = JointSparseMTL(radius=[0.5, 2.0], eta0=20.0, max_rounds=40).fit(Xs, ys)      # no cv: the path as given
    assert not hasattr(plain, "radius_") and list(plain.path_["radius"]) == [0.5, 2.0]
