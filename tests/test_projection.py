"""The l1,inf projection against independent solvers, with KKT checks (l1 / l2: tests/test_kernel_properties.py)."""
import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from scipy.optimize import minimize

from hpcmtl import _projections
from hpcmtl.errors import InputError
from hpcmtl.projection import l1inf_norm, project_l1inf

from reference import project_l1inf_bisection


def matrices():
    rng = np.random.default_rng(0)
    yield "random", rng.normal(size=(30, 8))
    yield "one row", rng.normal(size=(1, 9))
    yield "one column", rng.normal(size=(12, 1))
    ties = np.round(rng.normal(size=(20, 6)), 1)
    ties[3] = ties[4] = 0.7
    yield "ties", ties
    zeros = rng.normal(size=(25, 5))
    zeros[::3] = 0.0
    zeros[1, :] = [0, 0, 2.0, 0, 0]
    yield "zero rows and entries", zeros
    yield "huge dynamic range", rng.normal(size=(15, 7)) * 10.0 ** rng.uniform(-6, 6, size=(15, 1))
    yield "all equal", np.full((6, 4), -3.0)
    for k in range(20):
        d, m = rng.integers(1, 40), rng.integers(1, 12)
        yield f"random {k}", rng.standard_cauchy(size=(d, m)) * (rng.uniform(size=(d, m)) < 0.7)


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.01, 0.2, 0.7, 0.99])
def test_l1inf_agrees_with_bisection_and_satisfies_kkt(fraction):
    for name, W in matrices():
        C = fraction * l1inf_norm(W)
        B, info = project_l1inf(W, C, return_info=True)
        scale = max(1.0, np.abs(W).max())
        assert l1inf_norm(B) <= C * (1 + 1e-12) + 1e-15, name
        assert l1inf_norm(B) == pytest.approx(C, rel=1e-9), name           # on the boundary
        assert_allclose(B, project_l1inf_bisection(W, C), atol=1e-9 * scale, err_msg=name)
        A, Ab = np.abs(W), np.abs(B)
        assert np.all(np.sign(B) * np.sign(W) >= 0), name                  # signs never flip
        mu, theta = info["mu"], info["theta"]
        removed = (A - Ab).sum(axis=1)
        live = mu > 0
        assert_allclose(removed[live], theta, rtol=1e-9, atol=1e-12 * scale, err_msg=name)   # equal removed mass
        assert np.all(A.sum(axis=1)[~live] <= theta * (1 + 1e-9) + 1e-12), name              # rows that vanish
        assert_allclose(Ab.max(axis=1), mu, atol=1e-12 * scale, err_msg=name)               # mu = row maxima
        assert_allclose(project_l1inf(B, C), B, atol=1e-12 * scale, err_msg=name)          # idempotent


@pytest.mark.smoke
def test_l1inf_matches_a_general_qp_solver():
    rng = np.random.default_rng(1)
    for _ in range(5):
        W = rng.normal(size=(4, 3))
        C = 0.4 * l1inf_norm(W)
        d, m = W.shape
        # variables (B, mu): min 1/2 ||B - W||^2  s.t.  -mu_i <= B_ij <= mu_i, sum mu = C
        fun = lambda z: 0.5 * np.sum((z[:d * m] - W.ravel()) ** 2)  # noqa: E731
        jac = lambda z: np.concatenate([z[:d * m] - W.ravel(), np.zeros(d)])  # noqa: E731
        cons = [{"type": "eq", "fun": lambda z: z[d * m:].sum() - C},
                {"type": "ineq", "fun": lambda z: np.repeat(z[d * m:], m) - z[:d * m]},
                {"type": "ineq", "fun": lambda z: np.repeat(z[d * m:], m) + z[:d * m]}]
        z0 = np.concatenate([np.zeros(d * m), np.full(d, C / d)])
        qp = minimize(fun, z0, jac=jac, constraints=cons, method="SLSQP", options={"ftol": 1e-14, "maxiter": 1000})
        assert qp.success
        assert_allclose(project_l1inf(W, C), qp.x[:d * m].reshape(d, m), atol=1e-6)


@pytest.mark.smoke
def test_l1inf_edge_cases():
    rng = np.random.default_rng(2)
    W = rng.normal(size=(10, 4))
    inside = W * 0.5
    C = l1inf_norm(W)
    assert_array_equal(project_l1inf(inside, C), inside)                    # inside the ball: unchanged
    assert_array_equal(project_l1inf(W, 0.0), np.zeros_like(W))
    original = W.copy()
    B = project_l1inf(W, 0.3 * C)
    assert_array_equal(W, original)                                          # input untouched
    project_l1inf(W, 0.3 * C, out=W)                                         # unless asked
    assert_array_equal(W, B)
    assert_array_equal(project_l1inf(np.zeros((5, 3)), 1.0), np.zeros((5, 3)))
    with pytest.raises(InputError, match="The radius C must be finite and >= 0. Got -1.0 instead."):
        project_l1inf(W, -1)
    with pytest.raises(InputError, match="W contains NaN or Inf"):
        project_l1inf(np.array([[np.nan]]), 1.0)


def test_merge_walk_fallback_gives_the_same_theta():
    rng = np.random.default_rng(3)
    for _ in range(20):
        W = np.abs(rng.standard_cauchy(size=(rng.integers(1, 30), rng.integers(1, 9))))
        S = np.sort(W, axis=1)
        delta = 0.6 * W.max(axis=1).sum()
        theta, mu, steps = _projections.l1inf_caps(S, delta)
        theta_merge, mu_merge, _ = _projections.l1inf_caps(S, delta, max_newton=0)
        assert theta == pytest.approx(theta_merge, rel=1e-10, abs=1e-12)
        assert_allclose(mu, mu_merge, rtol=1e-10, atol=1e-12)
        assert steps < 50
