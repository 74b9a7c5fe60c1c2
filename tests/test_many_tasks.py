"""Many tasks (issue 35): a learned Sigma held as factors and the matrix-free step problems agree with the dense
arithmetic, against NumPy references (dense eigendecompositions, pseudo-inverses)."""
import numpy as np
import pytest
from numpy.testing import assert_allclose

from hpcmtl.cluster import Cluster
from hpcmtl.dmtrl import DMTRLConfig, omega_step, train
from hpcmtl.dmtrl import sigma as sigma_rules
from hpcmtl.dmtrl.sigma import SigmaFactors, coupled_rho, omega_factors
from hpcmtl.dmtrl.steps import StepInputs, StepSolver, box_qp, box_qp_operator
from hpcmtl.errors import InputError
from hpcmtl.estimators import MemoryTasks
from hpcmtl.taskspace import DENSE

from conftest import random_tasks, wsteps_certified

LOSSES = ["hinge", "smoothed-hinge", "squared", "logistic"]


def sqrt_reference(W, floor):
    """(W^T W)^(1/2) / tr with the eigenvalue floor, from NumPy's eigh of W^T W (independent of both paths)."""
    ev, U = np.linalg.eigh(W.T @ W)
    s = np.sqrt(np.clip(ev, 0, None))
    s = np.maximum(s, floor * s.max())
    R = (U * s) @ U.T
    return R / np.trace(R)


@pytest.mark.parametrize("m,d,rank", [(7, 12, 7), (40, 6, 6), (40, 6, 3), (25, 25, 25)])
def test_factored_omega_step_is_the_dense_one(m, d, rank):
    # the floor above sqrt(eps): the dense path's eigh of W^T W leaves its null space's eigenvalues at rounding
    # noise (about eps ||W||^2), whose square roots (1.5e-8 ||W||) pass a floor of 1e-8; the SVD puts them at it
    floor = 1e-6
    rng = np.random.default_rng(m + d + rank)
    W = rng.normal(size=(d, rank)) @ rng.normal(size=(rank, m))        # rank <= min(m, d)
    f = omega_factors(W.T, floor)
    assert f.V.shape == (m, min(rank, d, m))                           # r: the rank, not m
    assert_allclose(f.V.T @ f.V, np.eye(f.V.shape[1]), atol=1e-12)
    ref = sqrt_reference(W, floor)
    dense = f.dense()
    assert np.array_equal(dense, dense.T)
    assert_allclose(dense, ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    assert_allclose(dense, omega_step(W, floor), rtol=0, atol=1e-12 * np.abs(ref).max())
    assert np.trace(dense) == pytest.approx(1.0, abs=1e-13)
    X = rng.normal(size=(m, 5))
    assert_allclose(f.matmul(X), ref @ X, rtol=1e-10, atol=1e-13)
    assert_allclose(f.matmul(X[:, 0]), ref @ X[:, 0], rtol=1e-10, atol=1e-13)
    assert_allclose(f.diag(), np.diag(ref), rtol=1e-10)
    ev, U = np.linalg.eigh(ref)                  # Sigma^-1 from its eigenvectors (an explicit inv loses cond * eps)
    inv_diag = (U * U) @ (1.0 / ev)
    assert_allclose(f.inverse_diag(), inv_diag, rtol=1e-7)
    assert_allclose(coupled_rho(f), np.clip(1.0 / (np.diag(ref) * inv_diag), 0.5, 1.0), rtol=1e-7)
    assert_allclose(coupled_rho(f), coupled_rho(ref), rtol=1e-6)


def test_factored_omega_step_of_zero_and_a_larger_floor():
    f = omega_factors(np.zeros((9, 4)))
    assert f.V.shape == (9, 0) and f.c == pytest.approx(1 / 9)
    assert_allclose(f.dense(), np.eye(9) / 9)
    assert_allclose(coupled_rho(f), np.ones(9))
    rng = np.random.default_rng(3)
    W = rng.normal(size=(5, 30)) * np.array([1.0, 1.0, 1e-3, 1e-4, 1e-5] + [1] * 25)[:30]
    f = omega_factors(W.T, 1e-2)                    # singular values under 1e-2 of the top join the complement
    assert_allclose(f.dense(), sqrt_reference(W, 1e-2), atol=1e-13)
    assert f.c > 0 and np.all(f.s > f.c)


def test_checkpoint_arrays_round_trip_the_factors_bit_for_bit():
    rng = np.random.default_rng(1)
    f = omega_factors(rng.normal(size=(30, 4)))
    g = SigmaFactors.from_arrays({k: np.array(v) for k, v in f.arrays().items()})
    assert np.array_equal(g.V, f.V) and np.array_equal(g.s, f.s) and g.c == f.c
    assert SigmaFactors.from_arrays({"Sigma": np.eye(2)}) is None
    f0 = omega_factors(np.zeros((7, 3)))                  # I / m: no columns (a checkpoint in the first W-step)
    g0 = SigmaFactors.from_arrays({"Sigma": f0.dense(), **f0.arrays()})
    assert g0.V.shape == (7, 0) and g0.c == f0.c
    with pytest.raises(InputError, match="sigma_V.*do not fit its 8 tasks"):
        SigmaFactors.from_arrays({"Sigma": np.eye(8), **f.arrays()})


def momentum_problem(m, d, seed, zero_previous=False):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(d, 3)) @ rng.normal(size=(3, m)) + 0.1 * rng.normal(size=(d, m))
    f = omega_factors(W.T, 1e-3)
    BT = rng.normal(size=(m, d))
    WT = f.matmul(BT) / 0.1
    dBT = rng.normal(size=(m, d))
    dPT = np.zeros((m, d)) if zero_previous else rng.normal(size=(m, d))
    n = rng.integers(20, 41, m).astype(float)
    c2, c2q = rng.uniform(0.5, 2, m) * n / 30, (0 if zero_previous else 1) * rng.uniform(0.5, 2, m) * n / 30
    cross = (0 if zero_previous else 1) * rng.uniform(-0.3, 0.3, m) * n / 30
    scalars = np.column_stack([rng.normal(size=m), c2, rng.normal(size=m) * (not zero_previous), c2q, cross])
    inputs = StepInputs(DENSE, f.dense(), n, WT, BT, dPT, np.zeros(m), np.zeros(m), f)
    return inputs, dBT, scalars


@pytest.mark.parametrize("m,d", [(6, 10), (60, 8)])
@pytest.mark.parametrize("zero_previous", [False, True])
def test_matrix_free_momentum_step_is_the_pseudo_inverse_step(m, d, zero_previous):
    inputs, dBT, scalars = momentum_problem(m, d, m + d, zero_previous)
    solver = StepSolver(DMTRLConfig(loss="squared", lam=0.1), "free")
    eta, beta = solver.steps_momentum_cg(inputs, dBT, scalars)
    eta_ref, beta_ref = solver.steps_momentum(inputs._replace(factors=None), dBT, scalars)
    # the reference by hand: A and g of the two-direction quadratic, NumPy's pseudo-inverse
    A, g = solver.two_direction_quadratic(inputs, dBT, inputs.dPT, *scalars.T)
    v = np.linalg.pinv(A, rcond=1e-12) @ g
    scale = np.abs(v).max()
    assert_allclose(np.concatenate([eta, beta]), v, rtol=0, atol=1e-9 * scale)
    assert_allclose(np.concatenate([eta_ref, beta_ref]), v, rtol=0, atol=1e-9 * scale)
    x = np.concatenate([eta, beta])
    assert g @ x - 0.5 * x @ A @ x > 0                                  # dual ascent
    if zero_previous:
        assert np.all(beta == 0)


def tasks(m, d, seed, sparse=False, loss="squared"):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(8, 15, m)
    return random_tasks(seed=seed, m=m, d=d, sizes=tuple(int(s) for s in sizes), sparse=sparse, loss=loss)


def fit(Xs, ys, factored, monkeypatch, **kw):
    monkeypatch.setattr(sigma_rules, "FACTORED_MIN_TASKS", 0 if factored else 10 ** 9)
    return train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**kw), warn=lambda msg: None)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("m,d,sparse", [(5, 12, False), (14, 4, False), (14, 6, True)])
def test_factored_and_dense_paths_train_the_same_model(loss, m, d, sparse, monkeypatch):
    Xs, ys = tasks(m, d, 7 * m + d, sparse, loss)
    kw = dict(loss=loss, lam=0.05, tol=1e-8, outer=3, outer_tol=0, max_rounds=3000, gamma=0.5, fit_intercept=False)
    a = fit(Xs, ys, False, monkeypatch, **kw)
    b = fit(Xs, ys, True, monkeypatch, **kw)
    assert np.array_equal(a.history["round"], b.history["round"])
    # logistic: its rounds agree to 1e-12 (primal, dual below), but W is flat for the objective in some
    # directions, and the local Newton steps carry those differences into W at about 1e-9
    scale = np.abs(a.W).max() * (1e-8 if loss == "logistic" else 1e-10)
    assert_allclose(b.W, a.W, rtol=0, atol=scale)
    assert_allclose(b.Sigma, a.Sigma, rtol=0, atol=1e-10 * np.abs(a.Sigma).max())
    for key in ("primal", "dual"):
        assert_allclose(b.history[key], a.history[key], rtol=1e-10, atol=1e-12)
    assert_allclose(b.history["gap"], a.history["gap"], rtol=0, atol=1e-10 * np.abs(a.history["primal"]).max())


@pytest.mark.parametrize("m,rank,seed", [(8, 8, 0), (30, 30, 1), (30, 6, 2), (60, 60, 3)])
def test_matrix_free_box_qp_finds_the_dense_box_qp_optimum(m, rank, seed):
    rng = np.random.default_rng(seed)
    F = rng.normal(size=(m, rank))
    A = F @ F.T + np.diag(rng.uniform(0, 0.1, m) * (rank == m))
    g = rng.normal(size=m) * 3
    upper = rng.uniform(0.2, 1.0, m)
    ref = box_qp(A, g, upper)
    x = box_qp_operator(lambda v: A @ v, np.diag(A).copy(), g, upper)
    value = (lambda y: g @ y - 0.5 * y @ A @ y)
    assert np.all(x >= 0) and np.all(x <= upper)
    assert value(x) >= value(ref) - 1e-10 * abs(value(ref))
    # KKT of the box QP: the gradient points out of the box at the bounds and vanishes between them
    r = g - A @ x
    inside = (x > 1e-12) & (x < upper - 1e-12)
    assert np.all(np.abs(r[inside]) <= 1e-7 * np.abs(g).max())
    assert np.all(r[x <= 1e-12] <= 1e-7 * np.abs(g).max()) and np.all(r[x >= upper - 1e-12] >= -1e-7 * np.abs(g).max())
    if rank == m:                                     # positive definite: one optimum
        assert_allclose(x, ref, rtol=0, atol=1e-8 * upper.max())
    x0 = box_qp_operator(lambda v: A @ v, np.diag(A).copy(), -np.abs(g), upper, start=upper)
    assert np.all(x0 == 0)                            # nothing gains: 0, never worse than it


@pytest.mark.parametrize("m,d", [(6, 10), (60, 8)])
def test_matrix_free_box_momentum_step_matches_the_dense_one(m, d):
    inputs, dBT, scalars = momentum_problem(m, d, 3 * m + d)
    rng = np.random.default_rng(m)
    dQT = inputs.dPT
    beta_max = rng.uniform(0, 3, m) * (rng.uniform(size=m) > 0.2)
    scalars = np.column_stack([scalars, beta_max])
    solver = StepSolver(DMTRLConfig(loss="smoothed-hinge", lam=0.1), "box")
    eta, beta = solver.steps_box_momentum(inputs, dBT, dQT, scalars)
    eta_d, beta_d = solver.steps_box_momentum(inputs._replace(factors=None), dBT, dQT, scalars)
    A, g = solver.two_direction_quadratic(inputs, dBT, dQT, *scalars[:, :5].T)
    value = (lambda x: g @ x - 0.5 * x @ A @ x)
    x, xd = np.concatenate([eta, beta]), np.concatenate([eta_d, beta_d])
    assert value(x) > 0
    # each box QP is the dense one's to rounding (the test above), but within_triangle's corner choices compare
    # gradients, so a rounding-level difference may send a pass to the other side: both ascend, by about as much
    assert value(x) >= (1 - 1e-3) * value(xd)
    top = beta_max.clip(0, 100)                       # each task's triangle
    assert np.all(eta >= 0) and np.all(beta >= 0)
    assert np.all(eta / 1.0 + np.where(top > 0, beta / np.where(top > 0, top, 1), 0) <= 1 + 1e-12)
    assert np.all(beta[top == 0] == 0)


@pytest.mark.parametrize("aggregation", ["safe", "line", "adaptive"])
@pytest.mark.parametrize("loss", ["squared", "hinge"])
def test_the_other_aggregations_take_the_factored_sigma_alike(aggregation, loss, monkeypatch):
    Xs, ys = tasks(12, 5, 11, False, loss)
    kw = dict(loss=loss, lam=0.05, tol=1e-7, outer=3, outer_tol=0, max_rounds=20000, aggregation=aggregation,
              fit_intercept=False)
    a = fit(Xs, ys, False, monkeypatch, **kw)
    b = fit(Xs, ys, True, monkeypatch, **kw)
    assert wsteps_certified(a) and wsteps_certified(b)
    # hinge: thousands of rounds of local SDCA whose rounding differs (the safe rule's W = B Sigma / lam through
    # the factors) end at another certified W; a relative gap of 1e-7 fixes W (and Sigma) only to about 1e-5
    close = 1e-8 if loss == "squared" else 1e-5
    assert_allclose(b.Sigma, a.Sigma, rtol=0, atol=close * np.abs(a.Sigma).max())
    assert_allclose(b.history["primal"][-1], a.history["primal"][-1], rtol=close)


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_no_m_by_m_eigensolve_or_factorization_once_factored(loss, monkeypatch):
    """From FACTORED_MIN_TASKS on no round and no Omega-step solves an m x m or 2m x 2m system, the first
    W-step (Sigma = I / m) included: every eigh, SVD and Cholesky the server calls is at most d wide.
    (Not yet the hinge losses: their margin corrections near a W-step's end invert Sigma, dmtrl/margin.py.)"""
    import scipy.linalg
    m, d = 16, 4
    Xs, ys = tasks(m, d, 5, False, loss)
    sizes = []
    for mod, name in ((np.linalg, "eigh"), (np.linalg, "cholesky"), (np.linalg, "pinv"), (np.linalg, "inv"),
                      (scipy.linalg, "cho_factor"), (scipy.linalg, "eigh")):
        inner = getattr(mod, name)

        def spy(a, *args, _inner=inner, **kw):
            sizes.append(min(np.shape(a)[-2:]))
            return _inner(a, *args, **kw)
        monkeypatch.setattr(mod, name, spy)
    svd = np.linalg.svd

    def svd_spy(a, *args, **kw):
        sizes.append(min(np.shape(a)[-2:]))
        return svd(a, *args, **kw)
    monkeypatch.setattr(np.linalg, "svd", svd_spy)
    # ('sdca' local steps: the hinge losses' interior-point rounds, which solve a d m wide system, run only
    # while d m <= interior.MAX_WIDTH = 1024, never at FACTORED_MIN_TASKS = 512 tasks of more than 2 features)
    r = fit(Xs, ys, True, monkeypatch, loss=loss, lam=0.05, tol=1e-6, outer=3, outer_tol=0, max_rounds=3000,
            fit_intercept=False, local_solver="sdca")
    assert wsteps_certified(r)
    assert max(sizes, default=0) <= d


@pytest.mark.parametrize("aggregation", ["qp", "line"])
def test_matrix_free_steps_without_momentum_match_the_dense_ones(aggregation):
    inputs, dBT, scalars = momentum_problem(40, 6, 9)
    solver = StepSolver(DMTRLConfig(loss="hinge", lam=0.1, aggregation=aggregation), None)
    c1, c2 = scalars[:, 0], scalars[:, 1]
    eta = solver.steps(inputs, dBT, c1, c2)
    eta_dense = solver.steps(inputs._replace(factors=None), dBT, c1, c2)
    assert np.all((eta >= 0) & (eta <= 1))
    assert_allclose(eta, eta_dense, rtol=0, atol=1e-9)
