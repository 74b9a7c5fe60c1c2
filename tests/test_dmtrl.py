"""DMTRL engine (serial path): certificates, Omega-step, rho, agreement with independent solvers."""
import numpy as np
import pytest
import scipy.linalg
from numpy.testing import assert_allclose

from hpcmtl.baselines import mtrl_central, ssdca
from hpcmtl.cluster import Cluster, plan_blocks
from hpcmtl.dmtrl import DMTRLConfig, GapHistory, omega_step, safe_rho, train
from hpcmtl.errors import ConvergenceError, InputError
from hpcmtl.estimators import DMTRL, MemoryTasks
from hpcmtl.losses import primal_reference

from conftest import random_tasks
from conftest import wsteps_certified  # noqa: E402

LOSSES = ["hinge", "smoothed-hinge", "squared", "logistic"]


def run(Xs, ys, **kw):
    return train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**kw))


def primal_numpy(Xs, ys, W, Sigma, lam, loss, gamma=1.0):
    """P(W) = sum_i mean_j l(w_i.x_ij) + lam/2 tr(W Omega W^T), Omega = Sigma^-1."""
    total = sum(primal_reference(loss, np.asarray(X @ W[:, i]).ravel(), ys[i], gamma).mean()
                for i, X in enumerate(Xs))
    return total + 0.5 * lam * np.trace(W @ np.linalg.solve(Sigma, W.T))


@pytest.mark.smoke
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("sparse", [False, True])
def test_relative_gap_certificate_at_convergence(loss, sparse):
    Xs, ys = random_tasks(seed=1, sparse=sparse, loss=loss)
    lam = 0.05
    r = run(Xs, ys, loss=loss, lam=lam, tol=1e-6, max_rounds=3000, outer=4, gamma=0.5, fit_intercept=False)
    h = r.history
    assert wsteps_certified(r) and h["rel_gap"][-1] <= 1e-6
    assert np.all(h["gap"] >= -1e-12 * np.abs(h["primal"]))
    # the primal the engine reports is the objective recomputed from scratch with Omega = Sigma^-1
    assert_allclose(h["primal"][-1], primal_numpy(Xs, ys, r.W, r.Sigma, lam, loss, 0.5), rtol=1e-9)
    assert np.trace(r.Sigma) == pytest.approx(1.0)


def test_gap_decreases_and_outer_steps_lower_the_objective():
    Xs, ys = random_tasks(seed=2, loss="squared")
    r = run(Xs, ys, loss="squared", lam=0.01, tol=1e-8, outer=6, outer_tol=0, max_rounds=5000, aggregation="safe")
    h = r.history
    ends = [h["primal"][h["outer"] == p][-1] for p in np.unique(h["outer"])]
    assert len(ends) == 6
    assert all(b <= a * (1 + 1e-7) for a, b in zip(ends, ends[1:]))   # alternating minimization descends
    first = h["rel_gap"][h["outer"] == 0]
    assert first[-1] < first[0] * 1e-4


@pytest.mark.smoke
def test_omega_step_properties():
    rng = np.random.default_rng(0)
    for m in (1, 2, 7):
        W = rng.normal(size=(5, m)) @ rng.normal(size=(m, m))
        S = omega_step(W)
        assert S.shape == (m, m) and np.trace(S) == pytest.approx(1.0)
        assert np.allclose(S, S.T) and np.linalg.eigvalsh(S).min() > 0
        root = scipy.linalg.sqrtm(W.T @ W).real
        assert_allclose(S, root / np.trace(root), atol=1e-8)
        assert safe_rho(S) >= 1.0
    assert_allclose(omega_step(np.zeros((4, 3))), np.eye(3) / 3)
    low_rank = np.outer(rng.normal(size=6), rng.normal(size=4))       # rank one: floored, still invertible
    S = omega_step(low_rank, eig_floor=1e-6)
    assert np.linalg.eigvalsh(S).min() >= 1e-6 * np.linalg.eigvalsh(S).max() * 0.99


def test_rho_bounds_rho_min_also_for_split_tasks():
    """rho_min = max_alpha a^T K a / sum_blocks a_b^T K a_b (Lemma 5.1) <= safe_rho."""
    rng = np.random.default_rng(3)
    m, d = 3, 4
    Sigma = omega_step(rng.normal(size=(6, m)))
    sizes = [5, 4, 6]
    Xs = [rng.normal(size=(n, d)) for n in sizes]
    blocks_per_task = [1, 2, 3]
    # K_{(i,j),(i',j')} = sigma_ii' x_ij . x_i'j' / (n_i n_i')
    Z = np.vstack([X / n for X, n in zip(Xs, sizes)])
    task = np.repeat(np.arange(m), sizes)
    K = Sigma[np.ix_(task, task)] * (Z @ Z.T)
    block_id = np.concatenate([np.repeat(np.arange(s) + 10 * i, -(-n // s))[:n]
                               for i, (n, s) in enumerate(zip(sizes, blocks_per_task))])
    Kb = K * (block_id[:, None] == block_id[None, :])
    evals = scipy.linalg.eigh(K, Kb + 1e-12 * np.eye(len(K)), eigvals_only=True)
    assert evals.max() <= safe_rho(Sigma, blocks_per_task) * (1 + 1e-8)


def test_dmtrl_matches_centralized_mtrl():
    for loss in ("squared", "logistic"):
        Xs, ys = random_tasks(seed=4, loss=loss)
        cfg = dict(loss=loss, lam=0.02, tol=1e-10, max_rounds=20000, outer=5, outer_tol=0)
        a = run(Xs, ys, **cfg)
        b = mtrl_central(MemoryTasks(Xs, ys), DMTRLConfig(**cfg))
        assert wsteps_certified(a) and wsteps_certified(b)
        assert abs(a.history["primal"][-1] - b.history["primal"][-1]) <= 1e-6 * abs(b.history["primal"][-1])
        assert_allclose(a.Sigma, b.Sigma, atol=1e-5)


def test_ssdca_reaches_the_same_optimum():
    Xs, ys = random_tasks(seed=5, sparse=True, loss="hinge")
    cfg = dict(loss="hinge", lam=0.05, tol=1e-7, max_rounds=5000, outer=3, outer_tol=0)
    a = run(Xs, ys, **cfg)
    b = ssdca(MemoryTasks(Xs, ys), DMTRLConfig(**cfg))
    assert b.history["rel_gap"][-1] <= 1e-7
    assert a.history["primal"][-1] == pytest.approx(b.history["primal"][-1], rel=1e-5)


def test_stl_squared_equals_ridge_per_task():
    from sklearn.linear_model import Ridge
    Xs, ys = random_tasks(seed=6, loss="squared")
    lam, m = 0.03, len(Xs)
    r = run(Xs, ys, loss="squared", lam=lam, tol=1e-12, max_rounds=5000, relationship="identity", fit_intercept=False)
    # the objective is (lam m)-strongly convex in each w_i: ||w_i - w_i*||^2 <= 2 gap / (lam m)
    radius = np.sqrt(2 * max(r.history["gap"][-1], 0.0) / (lam * m))   # exact local solves: the gap may round below 0
    assert radius < 1e-5
    for i, (X, y) in enumerate(zip(Xs, ys)):
        # (1/(2n))||Xw - y||^2 + (lam m / 2)||w||^2  <=>  Ridge(alpha = lam m n)
        ridge = Ridge(alpha=lam * m * len(y), fit_intercept=False, solver="cholesky").fit(X, y)
        assert np.linalg.norm(r.W[:, i] - ridge.coef_) <= radius + 1e-12


def test_stl_hinge_matches_liblinear_objective():
    from liblinear.liblinearutil import parameter, problem, train as lltrain
    Xs, ys = random_tasks(seed=7, loss="hinge")
    lam, m = 0.02, len(Xs)
    r = run(Xs, ys, loss="hinge", lam=lam, tol=1e-9, max_rounds=20000, relationship="identity", fit_intercept=False)
    for i, (X, y) in enumerate(zip(Xs, ys)):
        n = len(y)
        model = lltrain(problem(y, X), parameter(f"-s 3 -c {1.0 / (lam * m * n)} -e 1e-10 -B -1 -q"))
        w_ll = np.array([model.w[k] for k in range(X.shape[1])])
        label_sign = 1.0 if model.get_labels()[0] == 1 else -1.0
        w_ll *= label_sign
        obj = lambda w: np.maximum(0, 1 - y * (X @ w)).mean() + 0.5 * lam * m * w @ w  # noqa: E731
        assert obj(r.W[:, i]) <= obj(w_ll) * (1 + 1e-6)
        assert obj(r.W[:, i]) == pytest.approx(obj(w_ll), rel=1e-4)


def test_stl_logistic_matches_sklearn():
    from sklearn.linear_model import LogisticRegression
    Xs, ys = random_tasks(seed=8, loss="logistic")
    lam, m = 0.02, len(Xs)
    r = run(Xs, ys, loss="logistic", lam=lam, tol=1e-12, max_rounds=5000, relationship="identity", fit_intercept=False)
    radius = np.sqrt(2 * r.history["gap"][-1] / (lam * m))
    for i, (X, y) in enumerate(zip(Xs, ys)):
        clf = LogisticRegression(C=1.0 / (lam * m * len(y)), fit_intercept=False, tol=1e-12, max_iter=10000).fit(X, y)
        assert np.linalg.norm(r.W[:, i] - clf.coef_.ravel()) <= radius + 1e-6   # lbfgs is the looser of the two


def test_fixed_sigma_and_eta():
    Xs, ys = random_tasks(seed=9, loss="squared")
    Sigma = np.full((4, 4), 0.1) + np.eye(4) * 0.3
    a = train(Cluster.serial(), MemoryTasks(Xs, ys),
              DMTRLConfig(loss="squared", lam=0.05, tol=1e-9, max_rounds=5000, relationship="fixed"),
              sigma_fixed=Sigma)
    assert_allclose(a.Sigma, Sigma)
    b = train(Cluster.serial(), MemoryTasks(Xs, ys),
              DMTRLConfig(loss="squared", lam=0.05, tol=1e-9, max_rounds=20000, relationship="fixed", eta=0.5),
              sigma_fixed=Sigma)
    assert wsteps_certified(b) and b.history["primal"][-1] == pytest.approx(a.history["primal"][-1], rel=1e-7)
    with pytest.raises(InputError, match="positive definite"):
        train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(relationship="fixed"),
              sigma_fixed=-np.eye(4))


def test_negative_gap_raises():
    with pytest.raises(ConvergenceError, match="negative duality gap"):
        GapHistory().record(3, 0, 1.0, 1.01, 0.0, 0)


def test_parameter_validation_messages():
    with pytest.raises(InputError, match=r"The 'lam' parameter of DMTRL must be > 0. Got -1 instead."):
        DMTRLConfig(lam=-1).validate()
    with pytest.raises(InputError, match=r"Got 'logistc' instead.*Did you mean 'logistic'\?"):
        DMTRLConfig(loss="logistc").validate()
    with pytest.raises(InputError, match=r"'max_rounds' parameter of DMTRL must be an integer >= 1"):
        DMTRLConfig(max_rounds=0).validate()
    Xs, ys = random_tasks(seed=0)
    ys[2] = ys[2] * 2
    with pytest.raises(InputError, match=r"task 'task2' \(#2\): field 'y': the hinge loss needs labels -1/\+1, found"):
        run(Xs, ys, loss="hinge", lam=0.1)


@pytest.mark.smoke
def test_plan_blocks_is_balanced_deterministic_and_splits():
    nnz = [100, 90, 50, 40, 30, 5]
    n = [10, 9, 5, 4, 3, 1]
    plan = plan_blocks(n, nnz, 3)
    assert plan == plan_blocks(n, nnz, 3)
    load = np.zeros(3)
    for b in plan:
        load[b.worker] += nnz[b.task]
    assert load.max() <= 4 / 3 * max(sum(nnz) / 3, max(nnz))     # LPT's guarantee (120 is optimal here)
    assert [(b.worker, b.task) for b in plan] == sorted((b.worker, b.task) for b in plan)
    # more workers than tasks: some idle, every task once
    plan = plan_blocks([3, 4], [3, 4], 5)
    assert sorted(b.task for b in plan) == [0, 1]
    # split: a dominant task is cut into row ranges covering it exactly
    plan = plan_blocks([1000, 10, 10], [10000, 100, 100], 4, split_large=True)
    parts = sorted((b.start, b.stop) for b in plan if b.task == 0)
    assert len(parts) == 4 and parts[0][0] == 0 and parts[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    assert len({b.worker for b in plan if b.task == 0}) == 4


@pytest.mark.smoke
def test_estimator_interfaces():
    from sklearn.base import clone
    Xs, ys = random_tasks(seed=10, loss="hinge")
    est = DMTRL(loss="hinge", lam=0.05, tol=1e-5)
    assert est.get_params()["lam"] == 0.05 and clone(est).get_params() == est.get_params()
    assert est.set_params(lam=0.04) is est and est.lam == 0.04
    assert est.fit(Xs, ys) is est
    assert est.W_.shape == (6, 4) and est.Sigma_.shape == (4, 4) and "rel_gap" in est.history_
    X = np.vstack(Xs)
    y = np.concatenate(ys)
    tasks = np.concatenate([np.full(len(v), 10 + i) for i, v in enumerate(ys)])
    est2 = DMTRL(loss="hinge", lam=0.04, tol=1e-5).fit(X, y, tasks)
    assert_allclose(est2.W_, est.W_)
    assert est2.score(X, y, tasks) == pytest.approx(est.score(Xs, ys)) and est.score(Xs, ys) > 0.7
    with pytest.raises(ValueError, match="X has 3 features, but DMTRL is expecting 6 features as input"):
        est2.predict(np.ones((2, 3)), np.array([10, 11]))
    with pytest.raises(InputError, match="the model has 4 tasks: pass the task id of every row"):
        est2.predict(X)
    single = DMTRL(loss="hinge", lam=0.05).fit(Xs[0], ys[0])       # no task ids: one task
    assert single.W_.shape == (6, 1) and single.score(Xs[0], ys[0]) > 0.7


def test_random_fourier_features_fit_a_nonlinear_task():
    rng = np.random.default_rng(11)
    Xs, ys = [], []
    for _ in range(3):
        X = rng.uniform(-1, 1, size=(300, 2))
        Xs.append(X)
        ys.append(np.where(np.sum(X ** 2, axis=1) < 0.5, 1.0, -1.0))   # a disc: not linearly separable
    linear = DMTRL(loss="hinge", lam=1e-3, tol=1e-4).fit(Xs, ys)
    rff = DMTRL(loss="hinge", lam=1e-3, tol=1e-4, rff_dim=200, rff_gamma=2.0).fit(Xs, ys)
    assert rff.W_.shape == (200, 3)
    assert rff.score(Xs, ys) > 0.9 > linear.score(Xs, ys)


# --- issue 12, section 2: non-finite numbers never pass silently ------------------------------------
def test_non_finite_objective_is_an_error_not_a_comparison():
    from hpcmtl.engine import check_finite_rows
    with pytest.raises(ConvergenceError, match=r"non-finite dual objective nan in round 7 \(outer step 1\)"):
        GapHistory().record(7, 1, 1.0, float("nan"), 0.0, 0)
    with pytest.raises(ConvergenceError, match=r"non-finite primal objective inf in round 3"):
        GapHistory().record(3, 0, float("inf"), 1.0, 0.0, 0)
    with pytest.raises(ConvergenceError, match=r"non-finite W column in round 5 \(outer step 2\): task 'b' \(#1\) has inf"):
        check_finite_rows(np.array([[1.0, 2.0], [3.0, np.inf]]), 5, ["a", "b"], "W column", 2)
    check_finite_rows(np.ones((3, 2)), 1, ["a", "b", "c"], "W column")


def test_overflowing_rows_are_an_input_error_in_memory_too():
    Xs, ys = random_tasks(seed=0)
    Xs[1] = Xs[1] * 1e200                    # finite values, but ||x||^2 overflows
    with pytest.raises(InputError, match=r"task 'task1' \(#1\): field 'X': row 0: the squared norm \|\|x\|\|\^2 "
                                         r"overflows"):
        run(Xs, ys, loss="hinge", lam=0.1)
    Xs, ys = random_tasks(seed=0, loss="squared")
    ys[2] = ys[2] * 1e160                    # the squared loss squares y
    with pytest.raises(InputError, match=r"task 'task2' \(#2\): field 'y': row 0: y\^2 overflows"):
        run(Xs, ys, loss="squared", lam=0.1)
    with pytest.raises(InputError, match=r"field 'y': row 0: y\^2 overflows"):
        mtrl_central(MemoryTasks(Xs, ys), DMTRLConfig(loss="squared", lam=0.1))


@pytest.mark.mpi
def test_features_scaled_by_1e200_fail_every_rank_with_exit_2(tmp_path):
    import h5py
    from conftest import run_hpcmtl
    from hpcmtl import store
    Xs, ys = random_tasks(seed=3, m=6)
    path = tmp_path / "big.h5"
    store.write_tasks(path, Xs, ys)
    with h5py.File(path, "a") as f:                     # one task, read by one worker only
        f["tasks/000004/X"][...] = f["tasks/000004/X"][()] * 1e200
    out = tmp_path / "r.h5"
    r = run_hpcmtl(["train", "dmtrl", "--train", path, "--out", out, "--lam", "1e-2", "--quiet"], n_ranks=3)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and "big.h5: task 'task4' (#4): field 'X': row 0: the squared norm" in lines[0], r.stderr
    assert not out.exists()


@pytest.mark.mpi
@pytest.mark.parametrize("method,extra,saved", [("dmtrl", ["--aggregation", "safe"], 10), ("dmtrl", [], 1),
                                                ("stl", ["--local-steps", "2", "--local-solver", "sdca"], 10),
                                                ("graph", ["--graph", "cycle"], 0), ("l1inf", ["--radius", "5"], 10)])
def test_a_nan_in_any_round_ends_the_job_naming_round_and_task(tmp_path, method, extra, saved):
    """The last good checkpoint is the one due at round 10; in interior-point rounds (dmtrl's second W-step from
    round 2, graph's only one from round 1) the state they began from, written when one fell due."""
    from conftest import run_hpcmtl
    from hpcmtl import store
    Xs, ys = random_tasks(seed=3, m=6)
    path = tmp_path / "tr.h5"
    store.write_tasks(path, Xs, ys)
    out = tmp_path / "r.h5"
    args = ["train", method, "--train", path, "--out", out, "--quiet", "--checkpoint-every", "5",
            "--max-rounds", "40"] + (["--lam", "1e-2", "--tol", "1e-12"] if method != "l1inf" else []) + extra
    r = run_hpcmtl(args, n_ranks=3, env={"HPCMTL_FAULT_NAN": "13:4"})   # task 4 reports NaN in round 13
    ours = [line for line in r.stderr.splitlines() if line.startswith("hpcmtl:")]
    assert r.returncode == 1, r.stderr
    assert len(ours) == 1 and "non-finite" in ours[0] and "round 13" in ours[0] and "task 'task4' (#4)" in ours[0], \
        r.stderr
    assert not out.exists()
    assert store.read_checkpoint(str(out) + ".checkpoint.h5")["counters"]["round"] == saved   # the last good one


def test_every_rank_runs_its_whole_training_on_one_blas_thread(monkeypatch):
    """engine.train enters threadpoolctl's one-thread BLAS limit once for the run: the workers' X^T q and y . q
    (threaded BLAS splits such sums by its thread count) and the server's algebra give the same bits on any node,
    and no rank's BLAS threads take the cores of the others; the limit ends with the run."""
    from threadpoolctl import threadpool_info, threadpool_limits
    from hpcmtl import dmtrl
    blas = lambda: [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]  # noqa: E731
    seen = {"trial": [], "omega": []}
    trial, omega = dmtrl.LocalBlocks.trial_parts, dmtrl.Server.omega

    def trial_parts(self, *args, **kwargs):
        seen["trial"].append(blas())
        return trial(self, *args, **kwargs)

    def omega_step_(self):
        seen["omega"].append(blas())
        return omega(self)

    monkeypatch.setattr(dmtrl.LocalBlocks, "trial_parts", trial_parts)
    monkeypatch.setattr(dmtrl.Server, "omega", omega_step_)
    Xs, ys = random_tasks(seed=31, m=4)
    with threadpool_limits(limits=2, user_api="blas"):      # more than one, whatever this machine's cores
        before = blas()
        r = run(Xs, ys, tol=1e-6, outer=3, max_rounds=500)
        after = blas()
    assert wsteps_certified(r) and seen["trial"] and seen["omega"]
    assert before == [2] * len(before) and before
    assert all(n == [1] * len(before) for n in seen["trial"] + seen["omega"])
    assert after == before


def test_a_fixed_sigma_path_checks_its_sigma_once(monkeypatch):
    """A fixed Sigma is checked (an m x m eigensolve) once by the grid, not again by each of its fits, and the checked
    copy is read-only (so one that was checked cannot change after); the same path without that saving gives the
    same choice and model; a non-definite Sigma is still refused."""
    from hpcmtl.cluster import Cluster
    from hpcmtl.dmtrl import sigma as sigma_rules
    from hpcmtl.estimators import MemoryTasks
    from hpcmtl.model_selection import Selection, train_path
    Xs, ys = random_tasks(5, m=4, d=6, sizes=(40, 35, 50, 45))
    source = MemoryTasks(Xs, ys)
    Sigma = 0.5 * np.eye(4) + 0.5 / 4
    config = DMTRLConfig(loss="hinge", lam=1e-2, tol=1e-8, relationship="fixed")
    import sys
    calls = []                                    # the eigensolves of check_sigma (other code solves its own)
    eigvalsh = np.linalg.eigvalsh

    def counted(a):
        if sys._getframe(1).f_code.co_name == "check_sigma":
            calls.append(a.shape)
        return eigvalsh(a)
    monkeypatch.setattr(sigma_rules.np.linalg, "eigvalsh", counted)
    grid = [1e-1, 3e-2, 1e-2, 3e-3]
    result = train_path(Cluster.serial(), source, config, Selection(grid, cv=3, patience=0), sigma_fixed=Sigma)
    assert calls == [(4, 4)]                      # 4 points x 3 folds + the refit: 13 fits, one check
    checked = sigma_rules.check_sigma(Sigma, 4)
    assert sigma_rules.check_sigma(checked, 4) is checked and len(calls) == 2
    with pytest.raises(ValueError, match="read-only"):
        checked[0, 1] = -5.0
    checked.flags.writeable = True                # made writable (and so changeable) again: checked again
    checked[0, 1] = checked[1, 0] = 5.0
    with pytest.raises(InputError, match="positive definite"):
        sigma_rules.check_sigma(checked, 4)
    checked = sigma_rules.check_sigma(Sigma, 4)
    forget = type("Forget", (dict,), {"__setitem__": lambda self, key, value: None})()
    monkeypatch.setattr(sigma_rules, "_CHECKED", forget)      # every fit checks again: the same path
    again = train_path(Cluster.serial(), source, config, Selection(grid, cv=3, patience=0), sigma_fixed=Sigma)
    assert len(calls) == 4 + 14
    assert again.selection["chosen_lam"] == result.selection["chosen_lam"]
    assert again.W.tobytes() == result.W.tobytes()
    with pytest.raises(InputError, match="positive definite"):
        sigma_rules.check_sigma(np.array([[1.0, 2.0], [2.0, 1.0]]), 2)


def test_the_run_s_peak_memory_is_its_own_not_its_launcher_s(tmp_path):
    """A run started by a large Python process (a notebook, a workflow manager; here one holding 640 MB) records
    its own peak RSS in /ranks/peak_rss_mb: ru_maxrss kept the launcher's high-water mark across the exec."""
    import subprocess
    import sys
    from hpcmtl import store
    rng = np.random.default_rng(7)
    Xs = [rng.normal(size=(30, 4)) for _ in range(3)]
    store.write_tasks(str(tmp_path / "t.h5"), Xs, [X @ np.ones(4) for X in Xs])
    launcher = ("import subprocess, sys, numpy; held = numpy.ones(80_000_000); "
                "sys.exit(subprocess.run(sys.argv[1:]).returncode)")
    r = subprocess.run([sys.executable, "-c", launcher, sys.executable, "-m", "hpcmtl", "train", "dmtrl", "--train",
                        str(tmp_path / "t.h5"), "--out", str(tmp_path / "r.h5"), "--loss", "squared", "--lam", "0.1",
                        "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    peak = float(store.read_result(str(tmp_path / "r.h5"))["ranks"]["peak_rss_mb"][0])
    assert np.isfinite(peak) and 20 < peak < 400, peak
