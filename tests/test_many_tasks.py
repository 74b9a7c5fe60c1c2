"""Many tasks (issue 35): a learned Sigma held as factors and the matrix-free step problems agree with the dense
arithmetic, against NumPy references (dense eigendecompositions, pseudo-inverses)."""
import os

import numpy as np
import pytest
from numpy.testing import assert_allclose

from hpcmtl.cluster import Cluster
from hpcmtl.dmtrl import DMTRLConfig, omega_step, train
from hpcmtl.dmtrl import sigma as sigma_rules
from hpcmtl.dmtrl.sigma import RHO_LOW, SigmaFactors, coupled_rho, omega_factors
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
    assert_allclose(coupled_rho(f), np.clip(1.0 / (np.diag(ref) * inv_diag), RHO_LOW, 1.0), rtol=1e-7)
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


@pytest.mark.parametrize("zero_previous", [False, True])
def test_from_64_tasks_the_dense_momentum_step_is_cg_on_the_matrix(zero_previous, monkeypatch):
    """From steps.DENSE_OPERATOR_MIN_TASKS tasks the dense path's squared-loss momentum step is CG on the 2m x 2m
    matrix's products (no eigensolve): NumPy's pseudo-inverse step to 1e-9, dual ascent; and with one task's two
    directions zero and two tasks' parallel (A singular) the same B update eta dB + beta dP as the pseudo-inverse's
    (eta and beta themselves may differ by a part A does not see)."""
    from hpcmtl.dmtrl import steps
    m = 80
    assert m >= steps.DENSE_OPERATOR_MIN_TASKS
    inputs, dBT, scalars = momentum_problem(m, 8, 11, zero_previous)
    inputs = inputs._replace(factors=None)
    solver = StepSolver(DMTRLConfig(loss="squared", lam=0.1), "free")
    eigh = np.linalg.eigh
    monkeypatch.setattr(steps.np.linalg, "eigh", lambda a: pytest.fail("an eigensolve at 80 tasks"))
    x = np.concatenate(solver.steps_momentum(inputs, dBT, scalars))
    A, g = solver.two_direction_quadratic(inputs, dBT, inputs.dPT, *scalars.T)
    v = np.linalg.pinv(A, rcond=1e-12) @ g
    assert_allclose(x, v, rtol=0, atol=1e-9 * np.abs(v).max())
    assert g @ x - 0.5 * x @ A @ x > 0
    dBT, scalars = dBT.copy(), scalars.copy()
    dBT[3] = 0.0
    scalars[3] = 0.0
    inputs.dPT[3] = 0.0
    inputs.dPT[5] = 2.0 * dBT[5]                     # task 5's two directions parallel
    x = np.concatenate(solver.steps_momentum(inputs, dBT, scalars))
    monkeypatch.setattr(steps.np.linalg, "eigh", eigh)
    monkeypatch.setattr(steps, "DENSE_OPERATOR_MIN_TASKS", m + 1)
    ref = np.concatenate(solver.steps_momentum(inputs, dBT, scalars))
    update = (lambda z: z[:m, None] * dBT + z[m:, None] * inputs.dPT)
    assert_allclose(update(x), update(ref), rtol=0, atol=1e-9 * np.abs(update(ref)).max())


def test_from_many_tasks_the_momentum_step_stops_at_its_gain(monkeypatch):
    """From steps.CG_INEXACT_MIN_TASKS tasks the squared loss's CG step stops once a product adds less than
    CG_GAIN_RTOL of the quadratic's gain so far: fewer products than to the residual's CG_RTOL, and the dual
    ascent it buys within 1e-7 of the exact step's (NumPy's solve of the 2m x 2m system), never above it."""
    from hpcmtl.dmtrl import steps
    m = 600
    inputs, dBT, scalars = momentum_problem(m, 20, 5)
    solver = StepSolver(DMTRLConfig(loss="squared", lam=0.1), "free")
    A, g = solver.two_direction_quadratic(inputs, dBT, inputs.dPT, *scalars.T)
    best = 0.5 * g @ np.linalg.solve(A, g)
    quadratic = (lambda x: g @ x - 0.5 * x @ A @ x)
    assert m >= steps.CG_INEXACT_MIN_TASKS
    x = np.concatenate(solver.steps_momentum_cg(inputs, dBT, scalars))
    products = solver.cg_iterations
    monkeypatch.setattr(steps, "CG_INEXACT_MIN_TASKS", m + 1)
    exact = np.concatenate(solver.steps_momentum_cg(inputs, dBT, scalars))
    assert products < 0.75 * solver.cg_iterations
    assert quadratic(exact) == pytest.approx(best, rel=1e-12)
    assert 0 < best - quadratic(x) <= 1e-7 * best


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
    assert isinstance(b.Sigma, SigmaFactors) and isinstance(a.Sigma, np.ndarray)     # never m x m when factored
    # Sigma is the Omega-step of W: logistic's to W's 1e-8 (2e-9 measured at m 5, d 12 with the least qp rho 1/4)
    sigma_rel = 1e-8 if loss == "logistic" else 1e-10
    assert_allclose(b.Sigma.dense(), a.Sigma, rtol=0, atol=sigma_rel * np.abs(a.Sigma).max())
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
    assert_allclose(b.Sigma.dense(), a.Sigma, rtol=0, atol=close * np.abs(a.Sigma).max())
    assert_allclose(b.history["primal"][-1], a.history["primal"][-1], rtol=close)


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_no_m_by_m_eigensolve_or_factorization_once_factored(loss, monkeypatch):
    """From FACTORED_MIN_TASKS on no round and no Omega-step solves an m x m or 2m x 2m system, the first
    W-step (Sigma = I / m) included: every eigh, SVD and Cholesky the server calls is at most d wide, but the box
    QPs' capacitance (dmtrl/qp_precond.py: k d wide, k of Sigma's r terms, whatever m is, at most CAPACITY_MAX).
    (Not yet the hinge losses: their margin corrections near a W-step's end invert Sigma, dmtrl/margin.py.)"""
    import scipy.linalg
    from hpcmtl.dmtrl import qp_precond
    m, d = 16, 4
    Xs, ys = tasks(m, d, 5, False, loss)
    sizes, capacitance = [], []
    for_free = qp_precond.CapacitancePreconditioner.for_free

    def for_free_spy(self, free):
        capacitance.append(self.k * self.d)
        return for_free(self, free)
    monkeypatch.setattr(qp_precond.CapacitancePreconditioner, "for_free", for_free_spy)
    for mod, name in ((np.linalg, "eigh"), (np.linalg, "cholesky"), (np.linalg, "pinv"), (np.linalg, "inv"),
                      (scipy.linalg, "cho_factor"), (scipy.linalg, "eigh")):
        inner = getattr(mod, name)

        def spy(a, *args, _inner=inner, _cho=(mod is scipy.linalg and name == "cho_factor"), **kw):
            width = min(np.shape(a)[-2:])
            if not (_cho and capacitance and width == capacitance[-1]):      # the capacitance's own Cholesky
                sizes.append(width)
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
    assert max(capacitance, default=0) <= qp_precond.CAPACITY_MAX


@pytest.mark.parametrize("aggregation", ["qp", "line"])
def test_matrix_free_steps_without_momentum_match_the_dense_ones(aggregation):
    inputs, dBT, scalars = momentum_problem(40, 6, 9)
    solver = StepSolver(DMTRLConfig(loss="hinge", lam=0.1, aggregation=aggregation), None)
    c1, c2 = scalars[:, 0], scalars[:, 1]
    eta = solver.steps(inputs, dBT, c1, c2)
    eta_dense = solver.steps(inputs._replace(factors=None), dBT, c1, c2)
    assert np.all((eta >= 0) & (eta <= 1))
    assert_allclose(eta, eta_dense, rtol=0, atol=1e-9)


# -- no m x m Sigma at many tasks: the factors' own arithmetic, the files, report, the estimators ------------
def random_factors(m, r, seed):
    rng = np.random.default_rng(seed)
    return omega_factors(rng.normal(size=(m, r)) @ rng.normal(size=(r, r + 2)), 1e-3)


@pytest.mark.parametrize("m,r", [(9, 3), (40, 6), (30, 0)])
def test_factor_products_are_the_dense_matrix_s(m, r, monkeypatch):
    from hpcmtl import covariance
    monkeypatch.setattr(covariance, "PIECE_VALUES", 7 * m)         # several row pieces, one with fewer rows
    f = random_factors(m, r, m + r) if r else omega_factors(np.zeros((m, 2)))
    S = f.dense()
    Omega = np.linalg.inv(S)
    rng = np.random.default_rng(1)
    X = rng.normal(size=(m, 4))
    scale = np.abs(Omega).max()
    assert_allclose(f.inverse_matmul(X), Omega @ X, rtol=0, atol=1e-9 * scale * np.abs(X).max())
    assert_allclose(f.inverse_column(3), Omega[:, 3], rtol=0, atol=1e-9 * scale)
    idx = np.array([0, 5, 2, m - 1])
    assert_allclose(f.rows(idx), S[idx], rtol=0, atol=1e-15)
    assert_allclose(f.rows(idx, idx), S[np.ix_(idx, idx)], rtol=0, atol=1e-15)
    root = np.sqrt(np.diag(S)[idx])
    assert_allclose(f.correlation(idx), S[np.ix_(idx, idx)] / np.outer(root, root), rtol=0, atol=1e-12)
    x = rng.uniform(1, 3, m)
    assert_allclose(f.abs_times(x), np.abs(S) @ x, rtol=1e-12)
    assert np.all(f.abs_bound(x) >= np.abs(S) @ x * (1 - 1e-12))      # Lemma 6.7 allows any larger rho
    assert sigma_rules.safe_rho(f, x, exact=False) >= sigma_rules.safe_rho(f, x) == pytest.approx(
        sigma_rules.safe_rho(S, x), rel=1e-12)
    assert_allclose(sigma_rules.task_rho_bounds(f, x), sigma_rules.task_rho_bounds(S, x), rtol=1e-12)
    assert f.is_diagonal() == (r == 0) == sigma_rules.is_diagonal(S)


def test_factors_on_single_tasks_are_diagonal():
    V = np.eye(6)[:, [1, 4]]                        # each column one task: Sigma diagonal with r = 2
    f = SigmaFactors(V, np.array([0.3, 0.2]), 0.1)
    assert f.is_diagonal() and sigma_rules.is_diagonal(f.dense())
    g = SigmaFactors(np.eye(6)[:, [1]] + np.eye(6)[:, [4]], np.array([0.3]), 0.1)   # (not normalized: its shape)
    assert not g.is_diagonal() and not sigma_rules.is_diagonal(g.dense())


def test_margin_scales_through_the_factors_are_the_dense_ones():
    from hpcmtl.dmtrl.margin import MARGIN_SCALES, OmegaGram, correction_scales
    m, d, lam = 40, 5, 0.1
    f = random_factors(m, 4, 3)
    rng = np.random.default_rng(4)
    CT = rng.normal(size=(m, d)) * (rng.uniform(size=(m, 1)) > 0.2)
    Q = lam * np.linalg.inv(f.dense()) * (CT @ CT.T)
    op = OmegaGram(f, CT, lam)
    s = rng.uniform(0, 1, m)
    assert_allclose(op.times(s), Q @ s, rtol=1e-9, atol=1e-9 * np.abs(Q).max())
    assert_allclose(op.column(7), Q[:, 7], rtol=1e-9, atol=1e-9 * np.abs(Q).max())
    assert_allclose(op.diagonal(), np.diag(Q), rtol=1e-9)
    loss_at = np.sort(rng.uniform(0, 5, (m, 1 + len(MARGIN_SCALES))), axis=1)[:, ::-1]     # losses fall with s
    cb, n, movable = rng.normal(size=m) * 0.1, rng.integers(5, 20, m), np.any(CT != 0, axis=1)
    assert np.array_equal(correction_scales(loss_at, cb, op, n, movable), correction_scales(loss_at, cb, Q, n, movable))


@pytest.mark.parametrize("loss", ["squared", "hinge"])
def test_factored_training_never_forms_the_m_by_m_sigma(loss, monkeypatch, tmp_path):
    """Rounds, Omega-steps, margin corrections, the checkpoint, the result file and the estimator hold the
    factors only: SigmaFactors.dense (the m x m matrix) is never called."""
    from hpcmtl import store
    from hpcmtl.checkpoint import Checkpointer
    from hpcmtl.estimators import DMTRL

    def no_dense(self):
        raise AssertionError("an m x m Sigma was formed")
    Xs, ys = tasks(16, 4, 8, False, loss)
    monkeypatch.setattr(sigma_rules, "FACTORED_MIN_TASKS", 0)
    monkeypatch.setattr(SigmaFactors, "dense", no_dense)
    from hpcmtl.dmtrl import margin
    corrections = []
    times = margin.OmegaGram.times
    monkeypatch.setattr(margin.OmegaGram, "times", lambda self, s: corrections.append(1) or times(self, s))
    ck = tmp_path / "c.h5"
    config = DMTRLConfig(loss=loss, lam=0.05, tol=1e-6, outer=3, outer_tol=0, max_rounds=3000, fit_intercept=False,
                         local_solver="sdca")
    r = train(Cluster.serial(), MemoryTasks(Xs, ys), config, warn=lambda msg: None,
              checkpointer=Checkpointer(str(ck), every=5, config=config.to_dict()))
    assert wsteps_certified(r) and isinstance(r.Sigma, SigmaFactors) and r.Sigma.V.shape[1] > 0
    assert bool(corrections) == (loss == "hinge")          # the hinge W-steps' margin corrections, through the factors
    saved = store.read_checkpoint(str(ck))["arrays"]
    assert "Sigma" not in saved and saved["sigma_V"].shape[0] == 16
    out = tmp_path / "r.h5"
    store.write_result(out, r.W, r.Sigma, r.history, {"relationship": "learned"}, 1, "test")
    model = store.read_result(out)["model"]
    assert "Sigma" not in model
    back = sigma_rules.SigmaFactors.from_arrays(model, where="model", m=16)
    for a, b in zip(back, r.Sigma):
        assert np.array_equal(a, b)                                 # bit for bit
    # the estimator (its hinge W-steps may take interior-point rounds, which form the m x m matrix: d m is small)
    monkeypatch.undo()
    monkeypatch.setattr(sigma_rules, "FACTORED_MIN_TASKS", 0)
    est = DMTRL(loss=loss, lam=0.05, tol=1e-6, outer=2, outer_tol=0.99, fit_intercept=False).fit(Xs, ys)
    assert isinstance(est.Sigma_, SigmaFactors) and est.Sigma_.m == 16


def test_report_draws_the_correlation_of_a_sample_from_the_factors(monkeypatch, tmp_path):
    """A result file of many tasks holds Sigma's factors; report draws the correlation of a sample of tasks from
    them (never the m x m matrix) and reads today's dense files as before."""
    from hpcmtl import store
    from hpcmtl.results import MAX_TASKS_SHOWN, correlation_order, report, sampled_tasks, task_correlation
    m = 300
    f = random_factors(m, 4, 9)
    W = np.random.default_rng(2).normal(size=(3, m))
    hist = {"round": np.arange(1, 4), "primal": np.array([3.0, 2.0, 1.5]), "dual": np.array([1.0, 1.2, 1.49]),
            "gap": np.array([2.0, 0.8, 0.01]), "rel_gap": np.array([0.6, 0.4, 0.007]), "seconds": np.arange(3.0),
            "bytes": np.arange(3.0) * 1e3,
            "outer": np.array([0, 0, 1])}
    config = {"relationship": "learned", "method": "dmtrl"}
    factored, dense = tmp_path / "f.h5", tmp_path / "d.h5"
    store.write_result(factored, W, f, hist, config, 1, "test")
    store.write_result(dense, W, f.dense(), hist, config, 1, "test")
    picked = sampled_tasks(m)
    assert len(picked) == MAX_TASKS_SHOWN
    # the sample's correlation from the factors is the dense matrix's, and so is the order drawn
    assert_allclose(task_correlation(f, picked), task_correlation(f.dense(), picked), rtol=0, atol=1e-12)
    C = f.dense() / np.sqrt(np.outer(np.diag(f.dense()), np.diag(f.dense())))
    order, caption = correlation_order(task_correlation(f, picked), picked=picked, total=m)
    assert np.array_equal(order, correlation_order(C)[0]) and f"a random sample of 60 of the {m} tasks" in caption

    def no_dense(self):
        raise AssertionError("an m x m Sigma was formed")
    monkeypatch.setattr(SigmaFactors, "dense", no_dense)
    for path in (factored, dense):
        out = tmp_path / f"report-{path.stem}"
        written = report([str(path)], str(out))
        assert os.path.getsize(written["correlation"]) > 0


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(sigma_V=a["sigma_V"][:-1]), "sigma_V.*do not fit its 30 tasks"),
    (lambda a: a.update(sigma_s=-a["sigma_s"]), "sigma_V.*do not fit its 30 tasks"),
    (lambda a: a.pop("sigma_c"), "come together"),
    (lambda a: a.update(Sigma=np.eye(30)), "without 'model/Sigma'"),
])
def test_a_result_file_with_bad_factors_is_one_line_error(change, message, tmp_path):
    from hpcmtl import store
    f = random_factors(30, 3, 1)
    arrays = dict(f.arrays())
    change(arrays)
    out = tmp_path / "r.h5"
    store.write_result(out, np.zeros((2, 30)), None, {"round": np.arange(2)}, {}, 1, "test", extra=arrays)
    with pytest.raises(InputError, match=message):
        store.read_result(out)


# -- the workers' batched blocks (many tiny tasks: hpcmtl/dmtrl/batched.py) -----------------------------------
def local_state(Xs, ys, monkeypatch, batch, momentum_loss="squared", aggregation="qp"):
    """A serial rank's LocalBlocks over the tasks, batched or not, with random alpha, w, previous steps, rho."""
    from hpcmtl import engine
    from hpcmtl.dmtrl import batched
    from hpcmtl.dmtrl.worker import LocalBlocks
    monkeypatch.setattr(batched, "BATCH_MIN_TASKS", 0 if batch else 10 ** 9)
    config = DMTRLConfig(loss=momentum_loss, lam=0.05, fit_intercept=False, aggregation=aggregation)
    local = engine.local_reader(LocalBlocks, Cluster.serial(), MemoryTasks(Xs, ys), config)()
    rng = np.random.default_rng(5)
    for k, blk in enumerate(local.blocks):
        local.state[k].alpha = rng.normal(size=blk.n_rows)
        local.previous[k] = rng.normal(size=blk.n_rows)
        local.w[k] = rng.normal(size=blk.n_features)
    local.rho_block = rng.uniform(0.5, 1.0, len(local.blocks))
    local.sigma_ii = rng.uniform(0.01, 0.1, len(local.blocks))
    return local


def control(command, **fields):
    from hpcmtl.engine import Control
    return Control(command, np.array([int(command)] + [fields.get(f, 0) for f in command.fields]))


def round_of(local, round_, width, seed, offset=0):
    """TRIAL, then APPLY with random steps: (trial rows, objective terms, alphas, previous steps)."""
    from hpcmtl.dmtrl.commands import DMTRLCommand
    rows = local.trial(control(DMTRLCommand.TRIAL, round=round_, width=width), None)
    d = local.d
    down = np.zeros((len(local.blocks), d + 3))
    for k, blk in enumerate(local.blocks):         # a task's values whatever the other blocks
        rng = np.random.default_rng([round_, seed, offset + blk.task])
        down[k] = np.concatenate([rng.normal(size=d), rng.uniform(0, 1, 1), rng.uniform(0, 0.5, 1),
                                  rng.uniform(0.5, 1, 1)])
        if (offset + blk.task) % 3 == 0:
            down[k, d:d + 2] = 0.0                 # some blocks take no step: their alpha keeps its bits
    terms = local.apply(control(DMTRLCommand.APPLY, with_objective=1, width=d + 3), down)
    return rows, terms, [st.alpha.copy() for st in local.state], [p.copy() for p in local.previous]


@pytest.mark.parametrize("aggregation", ["qp", "line"])
def test_batched_blocks_are_the_per_block_arithmetic_and_independent_of_the_batch(aggregation, monkeypatch):
    m, d = 30, 6
    rng = np.random.default_rng(0)
    Xs = [rng.normal(size=(int(rng.integers(3, 12)), d)) for _ in range(m)]
    ys = [X @ rng.normal(size=d) + rng.normal(size=len(X)) for X in Xs]
    one = local_state(Xs, ys, monkeypatch, batch=False, aggregation=aggregation)
    many = local_state(Xs, ys, monkeypatch, batch=True, aggregation=aggregation)
    assert one.batch is None and many.batch is not None and many.batch.size == m and not many.batch.others
    width = d + (5 if many.momentum == "free" else 2)
    for r in range(1, 4):
        a, b = round_of(one, r, width, 0), round_of(many, r, width, 0)
        assert_allclose(b[0], a[0], rtol=1e-10, atol=1e-12)          # TRIAL rows: delta b and the scalars
        assert_allclose(b[1], a[1], rtol=1e-12)                       # objective terms
        for x, y in zip(b[2] + b[3], a[2] + a[3]):
            assert_allclose(x, y, rtol=1e-10, atol=1e-12)
    # a block's bits do not depend on the other blocks of its batch (so not on the rank count): the tasks
    # split over two batches give every block the bits of the whole batch
    first = local_state(Xs[:11], ys[:11], monkeypatch, batch=True, aggregation=aggregation)
    rest = local_state(Xs[11:], ys[11:], monkeypatch, batch=True, aggregation=aggregation)
    whole = local_state(Xs, ys, monkeypatch, batch=True, aggregation=aggregation)
    for local, offset in ((first, 0), (rest, 11), (whole, 0)):   # the same starting state for each task
        for k, blk in enumerate(local.blocks):
            t = np.random.default_rng(100 + offset + blk.task)
            local.state[k].alpha, local.previous[k] = t.normal(size=blk.n_rows), t.normal(size=blk.n_rows)
            local.w[k] = t.normal(size=d)
            local.rho_block[k], local.sigma_ii[k] = t.uniform(0.5, 1), t.uniform(0.01, 0.1)
    for r in range(1, 3):
        parts = [round_of(x, r, width, 0, offset)[:1] for x, offset in ((first, 0), (rest, 11))]
        assert np.concatenate([p[0] for p in parts]).tobytes() == round_of(whole, r, width, 0)[0].tobytes()
        assert b"".join(st.alpha.tobytes() for st in first.state + rest.state) == \
            b"".join(st.alpha.tobytes() for st in whole.state)


@pytest.mark.parametrize("chunk_bytes", [1, 700])
def test_batched_trial_in_chunks_is_the_whole_batch_bit_for_bit(chunk_bytes, monkeypatch):
    """TRIAL takes the batch a chunk of blocks at a time (CHUNK_BYTES: one block a chunk, a few) and reuses the
    objective's scores while w stays: every number the bits of the batch taken whole, over rounds that change
    w, alpha and the previous steps; a w changed in place is not taken for the kept one."""
    from hpcmtl.dmtrl import batched
    from hpcmtl.dmtrl.commands import DMTRLCommand
    m, d = 40, 5
    rng = np.random.default_rng(3)
    Xs = [rng.normal(size=(int(rng.integers(1, 9)), d)) for _ in range(m)]
    ys = [X @ rng.normal(size=d) + rng.normal(size=len(X)) for X in Xs]
    whole = local_state(Xs, ys, monkeypatch, batch=True)
    monkeypatch.setattr(batched, "CHUNK_BYTES", chunk_bytes)
    chunked = local_state(Xs, ys, monkeypatch, batch=True)
    assert len(chunked.batch.groups) > len(whole.batch.groups) and not chunked.batch.others
    width = d + (5 if whole.momentum == "free" else 2)
    for r in range(1, 5):
        a, b = round_of(whole, r, width, 1), round_of(chunked, r, width, 1)
        assert a[0].tobytes() == b[0].tobytes() and a[1].tobytes() == b[1].tobytes()
        assert all(x.tobytes() == y.tobytes() for x, y in zip(a[2] + a[3], b[2] + b[3]))
    for local in (whole, chunked):            # w changed in place after the objective: the scores follow it
        local.w[int(local.batch.ks[0])][0] += 1.0
    a = whole.trial(control(DMTRLCommand.TRIAL, round=9, width=width), None)
    whole.batch.kept_scores = None
    fresh = whole.trial(control(DMTRLCommand.TRIAL, round=9, width=width), None)
    assert a.tobytes() == fresh.tobytes()


def test_a_fixed_sigma_from_a_factored_result_file_is_its_dense_matrix(tmp_path):
    """``train fixed --sigma RESULT.h5`` reads a result file of many tasks (factors) as the m x m matrix (a fixed
    Sigma keeps its dense arithmetic), and today's dense files as before."""
    from hpcmtl import store
    from hpcmtl.methods import read_sigma
    f = random_factors(20, 3, 4)
    for name, sigma in (("f.h5", f), ("d.h5", f.dense())):
        store.write_result(tmp_path / name, np.zeros((2, 20)), sigma, {"round": np.arange(2)}, {}, 1, "test")
        got = read_sigma(str(tmp_path / name))
        assert got.shape == (20, 20) and np.array_equal(got, f.dense())


def test_a_signal_ends_the_matrix_free_solves_with_the_ascent_they_have():
    """stop() (a termination signal) ends box_qp_operator and preconditioned_cg after the products already
    taken: the iterate is in the box and gains over 0 (the round stays dual ascent), in far fewer products than
    the full solve; without a signal stop() changes nothing (the same bits)."""
    from hpcmtl.dmtrl.steps import preconditioned_cg
    rng = np.random.default_rng(9)
    m = 80
    F = rng.normal(size=(m, 60))
    A = F @ F.T + 1e-3 * np.eye(m)
    g = rng.normal(size=m) * 3
    upper = rng.uniform(0.2, 1.0, m)
    products = []

    def times(v):
        products.append(1)
        return A @ v

    value = (lambda y: g @ y - 0.5 * y @ A @ y)
    full = box_qp_operator(times, np.diag(A).copy(), g, upper)
    n_full = len(products)
    products.clear()
    quiet = box_qp_operator(times, np.diag(A).copy(), g, upper, stop=lambda: False)
    assert quiet.tobytes() == full.tobytes()
    products.clear()
    early = box_qp_operator(times, np.diag(A).copy(), g, upper, stop=lambda: len(products) >= 5)
    assert len(products) < min(10, n_full)
    assert np.all(early >= 0) and np.all(early <= upper) and 0 < value(early) <= value(full) + 1e-12
    calls = []
    x, k = preconditioned_cg(lambda v: A @ v, lambda r: r, g, 1e-26, 500,
                             stop=lambda: calls.append(1) or len(calls) > 3)
    exact = np.linalg.solve(A, g)
    assert k == 3 and 0 < value(x) < value(exact)


@pytest.mark.parametrize("sparse", [False, True])
def test_the_intercepts_come_from_the_workers_means(sparse, monkeypatch):
    """The centered problem's intercepts at the end of a run come from the means each block was centered with
    (INTERCEPTS): rank 0 reads no task again, and each intercept is ``ybar - mu . w`` of the task's means read
    afresh bit for bit (dense rows, CSR rows on their support columns), the re-reading path's within rounding."""
    from hpcmtl import _blockops, engine
    Xs, ys = tasks(12, 5, 3, sparse=sparse)
    ys = [y + 3.0 * i - 10.0 for i, y in enumerate(ys)]         # intercepts far from zero
    source = MemoryTasks(Xs, ys)
    calls = []
    inner = MemoryTasks.task_means

    def counted(self, i, *a, **k):
        calls.append(i)
        return inner(self, i, *a, **k)
    monkeypatch.setattr(MemoryTasks, "task_means", counted)
    config = DMTRLConfig(loss="squared", lam=0.05, outer=2)
    res = train(Cluster.serial(), source, config, warn=lambda msg: None)
    assert sorted(calls) == list(range(12))                     # each task's means once: the load's
    for i in range(12):
        mu, ybar = inner(source, i)
        want = float(ybar - _blockops.ordered_dot(np.ascontiguousarray(mu), np.ascontiguousarray(res.W[:, i])))
        assert res.intercept[i] == want
    _, again = engine.split_intercept(res.W, config, source)
    assert_allclose(res.intercept, again, rtol=1e-13, atol=1e-13)
    assert np.abs(res.intercept).max() > 5
