"""A CV path that spends its time where the choice is made (issue 39 item 1): the fold fits at a looser tolerance
by default, the grid stopped once a fold's validation score keeps falling, each point's status in /path."""
import numpy as np
import pytest

from hpcmtl import dmtrl, store
from hpcmtl.cluster import Cluster
from hpcmtl.errors import InputError
from hpcmtl.estimators import MemoryTasks
from hpcmtl.model_selection import Selection, train_path
from hpcmtl.model_selection.split import best_index, path_fell, selection_tol

from conftest import random_tasks, run_hpcmtl, wsteps_certified


def test_the_path_stops_only_after_falling_patience_times_in_a_row_past_its_best():
    rising_then_falling = [0.80, 0.85, 0.90, 0.89, 0.88, 0.87]          # auc: higher is better
    assert not path_fell("auc", rising_then_falling[:5], 3)             # two falls
    assert path_fell("auc", rising_then_falling, 3)
    assert not path_fell("auc", rising_then_falling, 4) and not path_fell("auc", rising_then_falling, 0)
    assert not path_fell("auc", [0.80, 0.85, 0.90, 0.89, 0.91, 0.90, 0.89], 3)   # a new best in between
    assert not path_fell("auc", [0.90, 0.89, 0.895, 0.88], 3)            # not every step falls
    assert not path_fell("auc", [0.90, 0.90, 0.90, 0.90], 3)             # a plateau (ties) is no fall
    assert path_fell("rmse", [1.0, 0.5, 0.6, 0.7, 0.8], 3)              # rmse: lower is better
    assert not path_fell("rmse", [1.0, 0.9, 0.8, 0.7, 0.6], 3)
    assert not path_fell("error", [0.1, 0.2, 0.3, np.nan], 2)           # a non-finite score stops nothing
    assert not path_fell("auc", [0.9, 0.8, 0.7], 3)                      # no point before the falls: no best


def test_the_choice_skips_the_stopped_points():
    assert best_index("auc", [0.8, 0.9, 0.85, np.nan, np.nan], 3) == 1
    assert best_index("rmse", [0.8, 0.7, 0.75, 0.1], 3) == 1             # a stopped point's partial score ignored


def test_the_selection_tolerance_defaults_to_a_hundred_times_tol():
    assert selection_tol(Selection([1.0]), 1e-6) == pytest.approx(1e-4)
    assert selection_tol(Selection([1.0]), 1e-4) == 1e-3                  # at most 1e-3 ...
    assert selection_tol(Selection([1.0]), 1e-2) == 1e-2                  # ... and never looser than --tol
    assert selection_tol(Selection([1.0], tol=0.0), 1e-6) == 1e-6         # 0: the exhaustive path's
    assert selection_tol(Selection([1.0], tol=1e-3), 1e-6) == 1e-3
    assert selection_tol(Selection([1.0]), 1e-6, 1e-3) == 1e-3             # a learned Sigma: its --outer-tol
    assert selection_tol(Selection([1.0]), 1e-6, 2e-4) == 1e-3             # ... at least 1e-3 (the default 2e-4:
    assert selection_tol(Selection([1.0]), 1e-6, 5e-3) == 5e-3             # the refit's), or a looser one
    assert selection_tol(Selection([1.0]), 1e-6, 0.0) == pytest.approx(1e-4)   # --outer-tol 0: no joint stop
    assert selection_tol(Selection([1.0], tol=0.0), 1e-6, 1e-3) == 1e-6
    for bad, field in ((dict(tol=1.0), "selection_tol"), (dict(tol=-1e-3), "selection_tol"),
                       (dict(patience=-1), "path_patience"), (dict(patience=1.5), "path_patience")):
        with pytest.raises(InputError, match=field):
            Selection([1.0], **bad).validate("hinge")


CASES = [("logistic", "learned", dict(cv=3, metric="auc"), 2),
         ("squared", "learned", dict(cv=3), 3),
         ("logistic", "identity", dict(cv=3, metric="logloss"), 4),
         ("logistic", "learned", dict(cv=3, metric="logloss"), 6)]


@pytest.mark.parametrize("loss,relationship,split,seed", CASES)
def test_the_early_stopped_path_chooses_the_exhaustive_lam_and_refit(loss, relationship, split, seed):
    """Four generated cases whose validation curves fall past their best (few rows, d = 14: small lam overfits):
    the default path (fold fits at 100x --tol or a learned Sigma's --outer-tol, the grid stopped after three
    falling points) stops points and
    chooses the exhaustive path's lam (--selection-tol 0 --path-patience 0); both refits certified at --tol,
    their objectives within the certificate; the stopped points have no score and are not unconverged."""
    Xs, ys = random_tasks(seed, m=4, d=14, sizes=(24, 20, 30, 26), loss=loss)
    source = MemoryTasks(Xs, ys)
    grid = list(np.logspace(-4, 0, 9))
    config = dmtrl.DMTRLConfig(loss=loss, lam=1e-2, relationship=relationship, tol=1e-6)
    full = train_path(Cluster.serial(), source, config, Selection(grid, tol=0, patience=0, **split))
    fast = train_path(Cluster.serial(), source, config, Selection(grid, **split))
    assert fast.selection["chosen_lam"] == full.selection["chosen_lam"]
    status = fast.path["status"]
    stopped = int(np.count_nonzero(status == 2))
    assert stopped >= 1 and fast.selection["stopped_early"] == stopped
    assert np.all(status[len(grid) - stopped:] == 2) and np.all(status[:len(grid) - stopped] == 1)
    assert np.all(np.isnan(fast.path["validation_score"][status == 2]))
    assert np.all(fast.path["converged"] == 1) and fast.selection["converged"] is True
    assert np.all(full.path["status"] == 1) and full.selection["stopped_early"] == 0
    # the fold fits' gap: 100x --tol; a learned Sigma's fits are certified at --outer-tol (1e-3) anyway
    assert fast.selection["selection_tol"] == pytest.approx(1e-3 if relationship == "learned" else 1e-4)
    assert full.selection["selection_tol"] == 1e-6
    for r in (full, fast):
        assert r.converged and wsteps_certified(r) and r.history["rel_gap"][-1] <= 1e-6
    P = [r.history["primal"][-1] for r in (full, fast)]
    assert abs(P[0] - P[1]) <= 1e-3 * abs(P[0])
    assert fast.path["rounds"].sum() < full.path["rounds"].sum()
    # the points before the stop: the same scores' order as the exhaustive path's near the choice
    c = fast.selection["chosen_index"]
    assert np.isfinite(fast.path["validation_score"][c])


def test_status_in_the_result_file_and_the_report(tmp_path):
    """The command line: --path-patience and --selection-tol reach the path, /path/status is written, the report
    counts the stopped points apart from the unconverged ones, and both options need a grid."""
    Xs, ys = random_tasks(4, m=4, d=14, sizes=(24, 20, 30, 26), loss="logistic")
    tr, out, rep = tmp_path / "tr.h5", tmp_path / "r.h5", tmp_path / "rep"
    store.write_tasks(str(tr), Xs, ys)
    base = ["train", "stl", "--train", tr, "--loss", "logistic", "--lam-grid", "1e-4:1:9", "--cv", "3", "--metric",
            "logloss", "--tol", "1e-6", "--force", "--quiet"]
    assert run_hpcmtl(base + ["--out", out]).returncode == 0
    res = store.read_result(str(out))
    status = res["path"]["status"]
    assert np.count_nonzero(status == 2) >= 1 and res["config"]["selection"]["patience"] == 3
    r = run_hpcmtl(["report", out, "--out", rep])
    assert r.returncode == 0, r.stderr
    text = (rep / "report.md").read_text()
    n_stop = int(np.count_nonzero(status == 2))
    assert f"{len(status) - n_stop} certified, 0 unconverged, {n_stop} stopped early" in text
    assert run_hpcmtl(base + ["--out", out, "--path-patience", "0", "--selection-tol", "0"]).returncode == 0
    res = store.read_result(str(out))
    assert np.all(res["path"]["status"] == 1) and res["config"]["selection"]["selection_tol"] == 1e-6
    r = run_hpcmtl(["train", "stl", "--train", tr, "--out", out, "--loss", "logistic", "--lam", "0.1",
                    "--path-patience", "2", "--force"])
    assert r.returncode == 2 and "--path-patience go with a lam grid" in r.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("method", ["stl", "dmtrl"])
def test_a_stopped_path_is_the_same_at_every_rank_count(tmp_path, method):
    """The stop is the server's decision, broadcast after every point: at P = 1, 2 and 3 the same points are
    stopped, and the scores, the choice and the refit are the same bits (a worker that missed the stop would
    hang or fit points the server skips)."""
    seed = 4 if method == "stl" else 6            # cases whose path stops (stl: identity; dmtrl: learned Sigma)
    Xs, ys = random_tasks(seed, m=4, d=14, sizes=(24, 20, 30, 26), loss="logistic")
    tr = tmp_path / "tr.h5"
    store.write_tasks(str(tr), Xs, ys)
    results = []
    for ranks in (None, 2, 3):
        out = tmp_path / f"r{ranks}.h5"
        r = run_hpcmtl(["train", method, "--train", tr, "--out", out, "--loss", "logistic", "--lam-grid", "1e-4:1:9",
                        "--cv", "3", "--metric", "logloss", "--tol", "1e-6", "--force", "--quiet"], ranks, timeout=300)
        assert r.returncode == 0, r.stderr
        results.append(store.read_result(str(out)))
    ref = results[0]
    assert np.count_nonzero(ref["path"]["status"] == 2) >= 1
    for res in results[1:]:
        assert res["model"]["W"].tobytes() == ref["model"]["W"].tobytes()
        for key in ("status", "fold_scores", "validation_score", "rounds"):
            assert res["path"][key].tobytes() == ref["path"][key].tobytes(), key
