"""Per-task intercepts (issue 15, part 1): scikit-learn / liblinear agreement to the certificate's precision,
the centralized baselines, joint-sparse, result files old and new (MPI bits: test_rank_counts.py)."""
import json
import warnings

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose

from hpcmtl import store
from hpcmtl.baselines import mtrl_central, ssdca
from hpcmtl.checkpoint import read_compatible
from hpcmtl.cluster import Cluster
from hpcmtl.dmtrl import DMTRLConfig, train
from hpcmtl.errors import InputError
from hpcmtl.estimators import DMTRL, JointSparseMTL, MemoryTasks
from hpcmtl.joint_sparse import JointSparseConfig
from hpcmtl.joint_sparse import train as train_js
from hpcmtl.losses import primal_reference
from hpcmtl.metrics import evaluate_arrays

from conftest import metrics_during_and_after, random_tasks, run_hpcmtl
from conftest import wsteps_certified  # noqa: E402


def offset_tasks(seed=0, loss="squared", sparse=False, m=3, d=5, sizes=(40, 55, 33)):
    """Tasks whose labels have a large per-task offset and whose features have non-zero means."""
    rng = np.random.default_rng(seed)
    Xs, ys = [], []
    for i in range(m):
        n = sizes[i % len(sizes)]
        X = (rng.normal(size=(n, d)) + 1.5) * (rng.random((n, d)) < 0.5)
        z = X @ rng.normal(size=d) + (8.0 + 3 * i if loss == "squared" else 1.0 - i)
        y = z + 0.2 * rng.normal(size=n) if loss == "squared" else np.where(z + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
        Xs.append(sp.csr_matrix(X) if sparse else X)
        ys.append(y)
    return Xs, ys


def stl(Xs, ys, **kw):
    return train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(relationship="identity", **kw))


def task_primal(loss, X, y, w, b, lam_m, reg):
    """One STL task's objective mean_j l(x.w + b) + (lam m / 2) reg, reg the squared norm that is penalized."""
    return primal_reference(loss, np.asarray(X @ w).ravel() + b, y).mean() + 0.5 * lam_m * reg


def distance_bound(gap, p_ref_minus_dual, lam_m):
    """||W - W_ref||_F from the certificate: each task objective is (lam m)-strongly convex in what is penalized,
    so ||W - W*||^2 <= 2 gap / (lam m) and ||W_ref - W*||^2 <= 2 (P(W_ref) - D) / (lam m); plus 1e-9 for the
    rounding of P and D (a gap of -5e-16 is an exact solution within rounding)."""
    return np.sqrt(2 * max(gap, 0.0) / lam_m) + np.sqrt(2 * max(p_ref_minus_dual, 0.0) / lam_m) + 1e-9


# ---------------------------------------------------------------------------
# STL against scikit-learn per task
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("local_solver", ["sdca", "exact"])
def test_stl_squared_equals_ridge_with_intercept(sparse, local_solver):
    from sklearn.linear_model import Ridge
    Xs, ys = offset_tasks(seed=1, sparse=sparse)
    lam, m = 1e-2, len(Xs)
    r = stl(Xs, ys, loss="squared", lam=lam, tol=1e-12, max_rounds=20000, local_solver=local_solver)
    h = r.history
    assert np.isfinite(h["primal"][-1]) and np.isfinite(h["dual"][-1]) and np.isfinite(h["gap"][-1])
    assert wsteps_certified(r) and h["rel_gap"][-1] <= 1e-12
    assert r.W.shape == (5, m) and r.intercept.shape == (m,)
    p_ref = 0.0
    refs = []
    for i, (X, y) in enumerate(zip(Xs, ys)):
        Xd = X.toarray() if sparse else X
        # Ridge: ||y - Xw - b||^2 + alpha ||w||^2 = 2 n_i (our task objective): alpha = lam m n_i
        ridge = Ridge(alpha=lam * m * len(y), fit_intercept=True, solver="cholesky").fit(Xd, y)
        refs.append(ridge)
        p_ref += task_primal("squared", Xd, y, ridge.coef_, ridge.intercept_, lam * m, ridge.coef_ @ ridge.coef_)
    assert np.isfinite(p_ref)
    # the reported primal is the objective with the intercept, recomputed here from W and b
    ours = sum(task_primal("squared", X, y, r.W[:, i], r.intercept[i], lam * m, r.W[:, i] @ r.W[:, i])
               for i, (X, y) in enumerate(zip(Xs, ys)))
    assert ours == pytest.approx(h["primal"][-1], rel=1e-10)
    bound = distance_bound(h["gap"][-1], p_ref - h["dual"][-1], lam * m)
    assert bound < 1e-4
    W_ref = np.column_stack([f.coef_ for f in refs])
    assert np.linalg.norm(r.W - W_ref) <= bound
    for i, (X, f) in enumerate(zip(Xs, refs)):
        mu = np.asarray(X.mean(axis=0)).ravel()
        # b_i = ybar_i - mu_i . w_i: off by at most ||mu_i|| ||w_i - w_ref||
        assert abs(r.intercept[i] - f.intercept_) <= np.linalg.norm(mu) * bound + 1e-12
        assert abs(f.intercept_) > 1.0                          # the offset is really there


@pytest.mark.parametrize("loss", ["logistic", "hinge"])
@pytest.mark.parametrize("scaling", [1.0, 10.0])
def test_stl_classification_equals_liblinear_with_intercept_scaling(loss, scaling):
    """logistic: scikit-learn's liblinear; hinge: liblinear's formulation solved by a dual reference
    (LinearSVC's dual coordinate descent stops at max_iter on these offsets before reaching 1e-6)."""
    from sklearn.linear_model import LogisticRegression
    Xs, ys = offset_tasks(seed=2, loss=loss)
    lam, m = 1e-2, len(Xs)
    r = stl(Xs, ys, loss=loss, lam=lam, tol=1e-11, max_rounds=50000, intercept_scaling=scaling)
    h = r.history
    assert np.isfinite(h["primal"][-1]) and np.isfinite(h["dual"][-1]) and np.isfinite(h["gap"][-1])
    assert wsteps_certified(r) and h["rel_gap"][-1] <= 1e-11
    p_ref, refs = 0.0, []
    for X, y in zip(Xs, ys):
        C = 1.0 / (lam * m * len(y))      # liblinear: 1/2 |w~|^2 + C sum l = C n_i (our task objective)
        if loss == "logistic":
            f = LogisticRegression(solver="liblinear", C=C, intercept_scaling=scaling, tol=1e-12, max_iter=100000)
            with warnings.catch_warnings():      # liblinear may stop at max_iter: the bound below counts how far it got
                warnings.simplefilter("ignore")
                f.fit(X, y)
            w, b = f.coef_.ravel(), float(f.intercept_[0])
        else:
            w, b = augmented_svm_dual_reference(X, y, C, scaling)
        refs.append((w, b))
        # the augmented weight is b / scaling, penalized like the others
        p_ref += task_primal(loss, X, y, w, b, lam * m, w @ w + (b / scaling) ** 2)
    assert np.isfinite(p_ref)
    ours = sum(task_primal(loss, X, y, r.W[:, i], r.intercept[i], lam * m,
                           r.W[:, i] @ r.W[:, i] + (r.intercept[i] / scaling) ** 2) for i, (X, y) in enumerate(zip(Xs, ys)))
    assert ours == pytest.approx(h["primal"][-1], rel=1e-10)
    assert p_ref >= h["dual"][-1] - 1e-12                       # liblinear's point cannot beat the dual bound
    bound = distance_bound(h["gap"][-1], p_ref - h["dual"][-1], lam * m)
    assert bound < 1e-2
    for i, (w, b) in enumerate(refs):
        v = np.append(r.W[:, i], r.intercept[i] / scaling)
        v_ref = np.append(w, b / scaling)
        assert np.linalg.norm(v - v_ref) <= bound
        assert abs(r.intercept[i] - b) <= scaling * bound


def augmented_svm_dual_reference(X, y, C, scaling):
    """liblinear's L1-loss SVM with the intercept feature ``scaling`` (what ``LinearSVC(loss='hinge',
    intercept_scaling=scaling)`` solves), by L-BFGS-B on its box-constrained dual: ``max sum a - a^T Q a / 2``,
    ``0 <= a <= C``, ``Q = (y y^T) o (X~ X~^T)``; ``w~ = sum_j a_j y_j x~_j``.  Returns ``(w, b)``.

    Q is singular (rank d + 1 of n), and SciPy's L-BFGS-B (1.17) can stop on such a dual far from its optimum:
    on task 2 of offset_tasks(2) one call reports convergence (relative reduction of f) at a relative duality
    gap of 0.08, and task 0 ends ABNORMAL in its line search.  It is restarted from its last point, with fresh
    curvature pairs, until a call moves nothing (relative gaps of 1e-8 and below there; the test judges the
    reference by its own primal, so a poor one fails loudly rather than passing)."""
    from scipy.optimize import minimize
    Xa = np.hstack([X, np.full((X.shape[0], 1), scaling)])
    Z = Xa * y[:, None]
    Q = Z @ Z.T
    a = np.zeros(len(y))
    for _ in range(50):
        res = minimize(lambda a: (0.5 * a @ Q @ a - a.sum(), Q @ a - 1.0), a, jac=True,
                       method="L-BFGS-B", bounds=[(0.0, C)] * len(y),
                       options={"maxiter": 100000, "ftol": 1e-16, "gtol": 1e-14, "maxcor": 50})
        if np.array_equal(res.x, a):
            break
        a = res.x
    v = Z.T @ a
    return v[:-1], scaling * v[-1]


def test_larger_intercept_scaling_weakens_the_penalty_on_the_intercept():
    Xs, ys = offset_tasks(seed=3, loss="logistic")
    small = stl(Xs, ys, loss="logistic", lam=0.05, tol=1e-9, max_rounds=20000, intercept_scaling=0.1)
    large = stl(Xs, ys, loss="logistic", lam=0.05, tol=1e-9, max_rounds=20000, intercept_scaling=10.0)
    assert np.all(np.isfinite(small.intercept)) and np.all(np.isfinite(large.intercept))
    # at scaling 0.1 the intercept costs 100x its square: it stays near 0; at 10 it is nearly free
    assert np.max(np.abs(small.intercept)) < 0.5 * np.max(np.abs(large.intercept))


# ---------------------------------------------------------------------------
# DMTRL with learned Sigma against the centralized baselines (same centered formulation)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("sparse", [False, True])
def test_dmtrl_learned_squared_matches_centralized_mtrl_with_intercept(sparse):
    Xs, ys = offset_tasks(seed=4, sparse=sparse, m=4, sizes=(30, 45, 25, 40))
    cfg = dict(loss="squared", lam=0.02, tol=1e-11, max_rounds=20000, outer=5, outer_tol=0)
    a = train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(local_solver="sdca", **cfg))
    b = mtrl_central(MemoryTasks(Xs, ys), DMTRLConfig(**cfg))
    for r in (a, b):
        assert np.isfinite(r.history["primal"][-1]) and np.isfinite(r.history["gap"][-1])
    assert wsteps_certified(a) and wsteps_certified(b)
    gap = a.history["gap"][-1] + b.history["gap"][-1]
    assert abs(a.history["primal"][-1] - b.history["primal"][-1]) <= gap + 1e-9 * abs(b.history["primal"][-1])
    assert_allclose(a.Sigma, b.Sigma, atol=1e-5)
    assert_allclose(a.intercept, b.intercept, atol=1e-5)
    assert np.min(np.abs(b.intercept)) > 1.0
    # without the intercept the same data fits far worse: the offsets are real
    c = mtrl_central(MemoryTasks(Xs, ys), DMTRLConfig(fit_intercept=False, **cfg))
    assert c.history["primal"][-1] > 2 * b.history["primal"][-1]
    s = ssdca(MemoryTasks(Xs, ys), DMTRLConfig(**dict(cfg, tol=1e-9)))
    assert np.isfinite(s.history["primal"][-1])
    assert s.history["primal"][-1] == pytest.approx(b.history["primal"][-1], rel=1e-6)
    assert_allclose(s.intercept, b.intercept, atol=1e-3)


def test_estimators_predict_with_intercept():
    Xs, ys = offset_tasks(seed=5)
    est = DMTRL(loss="squared", lam=1e-3, tol=1e-10, relationship="identity").fit(Xs, ys)
    assert est.intercept_.shape == (3,) and np.all(np.isfinite(est.intercept_))
    scores = est.predict(Xs)                   # a regressor: predict returns the scores (no decision_function)
    for i, X in enumerate(Xs):
        assert_allclose(scores[i], X @ est.W_[:, i] + est.intercept_[i], rtol=1e-12)
    assert est.score(Xs, ys) > 0.95
    off = DMTRL(loss="squared", lam=1e-3, tol=1e-10, relationship="identity", fit_intercept=False).fit(Xs, ys)
    assert_allclose(off.intercept_, 0.0)
    assert off.score(Xs, ys) < est.score(Xs, ys)
    with pytest.raises(InputError, match="The 'intercept_scaling' parameter of DMTRL must be > 0. Got -1"):
        DMTRL(intercept_scaling=-1).fit(Xs, ys)
    with pytest.raises(InputError, match="The 'fit_intercept' parameter of DMTRL must be True or False"):
        DMTRL(fit_intercept=1).fit(Xs, ys)


# ---------------------------------------------------------------------------
# joint-sparse: an unpenalized, unprojected intercept for every loss
# ---------------------------------------------------------------------------
def projected_subgradient_reference(Xs, ys, loss, radius, eta0, rounds, intercept_eta0=1.0):
    """The method written out in NumPy with a bisection l1,inf projection (tests/reference.py)."""
    from reference import project_l1inf_bisection
    from hpcmtl.losses import loss_and_derivative
    d, m = Xs[0].shape[1], len(Xs)
    W, b = np.zeros((d, m)), np.zeros(m)
    best, W_best, b_best = np.inf, W.copy(), b.copy()
    for t in range(1, rounds + 2):
        G, gb, obj = np.zeros((d, m)), np.zeros(m), 0.0
        for i, (X, y) in enumerate(zip(Xs, ys)):
            values, dz = loss_and_derivative(loss, X @ W[:, i] + b[i], y, 1.0)
            obj += values.mean()
            G[:, i], gb[i] = X.T @ dz / len(y), dz.mean()
        if obj < best:
            best, W_best, b_best = obj, W.copy(), b.copy()
        if t == rounds + 1:
            break
        eta = eta0 / np.sqrt(t)
        b = b - intercept_eta0 / np.sqrt(t) * gb
        W = project_l1inf_bisection(W - eta * G, radius)
    return W_best, b_best, best


@pytest.mark.parametrize("loss,intercept_eta0", [("squared", 1.0), ("hinge", 1.0), ("logistic", 1.0),
                                                 ("hinge", 0.2), ("squared", 3.0)])
def test_joint_sparse_intercept_agrees_with_a_slow_reference(loss, intercept_eta0):
    Xs, ys = offset_tasks(seed=6, loss=loss, m=3, d=4, sizes=(12, 9, 15))
    radius, eta0, rounds = 1.0, 0.2, 40
    r = train_js(Cluster.serial(), MemoryTasks(Xs, ys), JointSparseConfig(loss=loss, radius=radius, eta0=eta0,
                                                                          max_rounds=rounds,
                                                                          intercept_eta0=intercept_eta0))
    W, b, best = projected_subgradient_reference(Xs, ys, loss, radius, eta0, rounds, intercept_eta0)
    assert np.isfinite(best) and np.all(np.isfinite(r.intercept))
    assert r.history["best_objective"][-1] == pytest.approx(best, rel=1e-9)
    assert_allclose(r.W, W, atol=1e-7)
    assert_allclose(r.intercept, b, atol=1e-7)
    assert np.max(np.abs(b)) > 0.1                   # the intercept moved
    assert np.abs(r.W).max(axis=1).sum() <= radius * (1 + 1e-12)    # W in the ball, b outside any projection


def test_joint_sparse_squared_intercept_meets_its_kkt_condition():
    """With the ball inactive and the smooth squared loss, the method converges: the intercept's gradient,
    each task's mean residual, goes to 0 (the KKT condition of an unpenalized b)."""
    Xs, ys = offset_tasks(seed=7, m=2, d=3, sizes=(20, 25))
    r = train_js(Cluster.serial(), MemoryTasks(Xs, ys), JointSparseConfig(loss="squared", radius=1e3, eta0=0.3,
                                                                          max_rounds=4000))
    assert np.all(np.isfinite(r.intercept))
    for i, (X, y) in enumerate(zip(Xs, ys)):
        residual = X @ r.W[:, i] + r.intercept[i] - y
        assert abs(residual.mean()) < 1e-2 * np.abs(y).mean()
    est = JointSparseMTL(loss="squared", radius=1e3, eta0=0.3, max_rounds=200).fit(Xs, ys)
    assert est.intercept_.shape == (2,) and np.all(np.abs(est.intercept_) > 1.0)


# ---------------------------------------------------------------------------
# files: /model/intercept, old files, evaluate, checkpoints
# ---------------------------------------------------------------------------
def test_result_files_store_the_intercept_and_old_files_read_zeros(tmp_path):
    Xs, ys = offset_tasks(seed=8)
    te = tmp_path / "te.h5"
    store.write_tasks(te, Xs, ys)
    r = stl(Xs, ys, loss="squared", lam=1e-3, tol=1e-10)
    new, old = tmp_path / "new.h5", tmp_path / "old.h5"
    config = dict(r.config, n_features=5)
    for path in (new, old):
        store.write_result(path, r.W, r.Sigma, r.history, config, 1, "test", task_names=["task0", "task1", "task2"],
                           intercept=r.intercept)
    with h5py.File(old, "a") as f:
        del f["model/intercept"]                          # as written before intercepts existed
    assert_allclose(store.read_result(new)["model"]["intercept"], r.intercept, rtol=0)
    assert_allclose(store.read_result(old)["model"]["intercept"], 0.0)
    with store.TaskFile(te) as src:
        with_b = evaluate_arrays(r.W, config, src, intercept=store.read_result(new)["model"]["intercept"])
        without = evaluate_arrays(r.W, config, src, intercept=None)
    ev_new = json.loads(run_hpcmtl(["evaluate", new, te, "--json"]).stdout)
    ev = run_hpcmtl(["evaluate", old, te, "--json"])
    assert ev.returncode == 0, ev.stderr
    ev_old = json.loads(ev.stdout)
    assert ev_new["summary"]["pooled_rmse"] == pytest.approx(with_b["summary"]["pooled_rmse"], rel=1e-12)
    assert ev_old["summary"]["pooled_rmse"] == pytest.approx(without["summary"]["pooled_rmse"], rel=1e-12)
    assert with_b["summary"]["pooled_rmse"] < 0.5 < without["summary"]["pooled_rmse"]


def test_checkpoint_refuses_another_intercept_setting(tmp_path):
    Xs, ys = random_tasks(seed=9, loss="squared")
    src = MemoryTasks(Xs, ys)
    ck = tmp_path / "ck.h5"
    config = DMTRLConfig(loss="squared", lam=0.1)
    store.write_checkpoint(ck, {"BT": np.zeros((4, 6))}, [], config.to_dict(), {"data_signature": None})
    with pytest.raises(InputError, match="'fit_intercept' is True in the checkpoint but False now"):
        read_compatible(ck, DMTRLConfig(loss="squared", lam=0.1, fit_intercept=False), src)
    old = {k: v for k, v in DMTRLConfig(loss="squared", lam=0.1, fit_intercept=False).to_dict().items()
           if k not in ("fit_intercept", "intercept_scaling")}
    store.write_checkpoint(ck, {"BT": np.zeros((4, 6))}, [], old, {"data_signature": None})
    with pytest.raises(InputError, match="'fit_intercept' is False in the checkpoint but True now"):
        read_compatible(ck, config, src)             # a checkpoint from before intercepts ran without them


def test_graph_mtl_exact_has_a_per_task_bias_in_its_kernel():
    from hpcmtl.estimators import GraphMTL
    Xs, ys = offset_tasks(seed=11, loss="hinge", m=3, d=4, sizes=(30, 25, 35))
    zeros = [np.zeros((1, 4))] * 3
    est = GraphMTL(kernel="linear", graph="chain", alpha=0.5, C=1.0, intercept_scaling=2.0).fit(Xs, ys)
    # at x = 0 the linear product kernel vanishes: the score is the task's bias, own plus shared
    at_zero = np.array([s[0] for s in est.decision_function(zeros)])
    assert np.all(np.isfinite(est.intercept_))
    assert_allclose(at_zero, est.intercept_, atol=1e-10)
    assert np.ptp(est.intercept_) > 0.1                        # tasks get biases of their own
    off = GraphMTL(kernel="linear", graph="chain", alpha=0.5, C=1.0, fit_intercept=False).fit(Xs, ys)
    at_zero = np.array([s[0] for s in off.decision_function(zeros)])
    assert_allclose(at_zero, off.svc_.intercept_[0], atol=1e-10)   # libsvm's one shared bias only
    assert_allclose(off.intercept_, off.svc_.intercept_[0])


@pytest.mark.mpi
@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_test_metrics_during_training_match_evaluate_with_intercept(tmp_path, loss):
    """The workers score test rows with the training block's intercept (centered: ybar - mu . w; augmented: the
    extra feature); evaluate reads /model/intercept: the same metrics."""
    Xs, ys = offset_tasks(seed=12, loss=loss, sparse=True, m=4, d=5, sizes=(50, 40, 45, 35))
    tr, te, out = tmp_path / "tr.h5", tmp_path / "te.h5", tmp_path / "r.h5"
    store.write_tasks(tr, [X[:30] for X in Xs], [y[:30] for y in ys])
    store.write_tasks(te, [X[30:] for X in Xs], [y[30:] for y in ys])
    during, after = metrics_during_and_after(["train", "stl", "--train", tr, "--test", te, "--out", out, "--loss",
                                              loss, "--lam", "1e-3", "--tol", "1e-8", "--quiet"], out, te, 3)
    key = "pooled_rmse" if loss == "squared" else "task_mean_auc"
    assert np.isfinite(during[key]) and np.isfinite(after[key])
    assert during[key] == pytest.approx(after[key], rel=1e-10)
    if loss == "squared":
        assert after["pooled_explained_variance"] > 0.9        # the offsets 8, 11, 14, 17 are fitted


def test_report_shows_the_intercepts(tmp_path):
    from hpcmtl.results import report
    Xs, ys = offset_tasks(seed=13)
    paths = []
    for fit in (True, False):
        r = stl(Xs, ys, loss="squared", lam=1e-3, tol=1e-9, fit_intercept=fit)
        path = tmp_path / f"fit{fit}.h5"
        store.write_result(path, r.W, r.Sigma, r.history, dict(r.config, n_features=5), 1, "test",
                           intercept=r.intercept)
        paths.append((path, r.intercept))
    report([p for p, _ in paths], tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    b = paths[0][1]
    assert np.all(np.isfinite(b)) and b.min() > 5.0
    assert f"| {b.min():.4g} .. {b.max():.4g} |" in md and "| none |" in md


def test_joint_sparse_intercept_with_the_papers_large_eta0_leaves_zero():
    """eta0 = 100 (paper 002's setting, sized for the ball): the intercepts' own rate keeps them on the scale of
    the labels, so the iterates improve on W = 0, b = 0 and beat the fit without intercepts (its problem is
    the same with b = 0, so its optimum is no better); before, b stepped at eta0 and no iterate beat W = 0."""
    from hpcmtl import synthetic
    train, _, _ = synthetic.joint_sparse(0, n_train=40)
    Xs, ys = train[0][:12], train[1][:12]
    runs = {}
    for fit_intercept in (True, False):
        r = train_js(Cluster.serial(), MemoryTasks(Xs, ys), JointSparseConfig(radius=10.0, eta0=100.0,
                                                                              max_rounds=150,
                                                                              fit_intercept=fit_intercept))
        runs[fit_intercept] = r.history["best_objective"]
    start = runs[True][0]
    assert np.isfinite(start) and start == pytest.approx(len(Xs))          # hinge at W = 0, b = 0: 1 a task
    assert np.isfinite(runs[True][-1]) and runs[True][-1] < 0.95 * start
    assert runs[True][-1] <= runs[False][-1] * 1.01
