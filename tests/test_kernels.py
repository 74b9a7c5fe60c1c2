"""Compiled kernels against slow NumPy references, dense and CSR."""
import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose, assert_array_equal
from scipy.optimize import minimize_scalar

from hpcmtl import _kernels
from hpcmtl.losses import LOSSES, conjugate_reference, primal_reference
from hpcmtl.taskdata import TaskBlock

from reference import ShrinkingReference, coordinate_step_reference, local_objective, sdca_local_reference

ALL_LOSSES = list(LOSSES)


def feasible_alpha(loss, y, rng):
    return rng.normal() if loss == "squared" else y * rng.uniform(0, 1)


@pytest.mark.parametrize("loss", ALL_LOSSES)
def test_coordinate_step_matches_closed_form_and_maximizes(loss):
    rng = np.random.default_rng(1)
    kid = LOSSES[loss].kernel_id
    for _ in range(300):
        y = rng.choice([-1.0, 1.0]) if loss != "squared" else rng.normal()
        a = feasible_alpha(loss, y, rng)
        ux = rng.normal(scale=3)
        q = 10 ** rng.uniform(-4, 3)
        gamma = 10 ** rng.uniform(-2, 0.5)
        delta = _kernels.coordinate_step(kid, y, a, ux, q, gamma)
        assert_allclose(delta, coordinate_step_reference(loss, y, a, ux, q, gamma), rtol=1e-9, atol=1e-12)
        # a general-purpose 1-D solver finds no better point of the local objective
        f = lambda dl: -local_objective(loss, y, a, ux, q, dl, gamma)  # noqa: E731
        if loss == "squared":
            best = minimize_scalar(f, bracket=(-10, 10), tol=1e-12).x
        else:
            lo, hi = sorted([y * 0 - a, y * 1 - a])
            best = minimize_scalar(f, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12}).x
        assert -f(delta) >= -f(best) - 1e-9


def test_hinge_step_with_zero_row_is_finite():
    # ||x|| = 0 gives q = 0: the maximizer moves to the box edge the margin points to
    assert _kernels.coordinate_step(0, 1.0, 0.3, 0.0, 0.0, 1.0) == pytest.approx(0.7)
    assert _kernels.coordinate_step(0, -1.0, -0.3, -2.0, 0.0, 1.0) == pytest.approx(0.3)


def _block(X, y, n_task=None):
    return TaskBlock(0, "t", n_task or X.shape[0], 0, X, y)


@pytest.mark.parametrize("loss", ALL_LOSSES)
@pytest.mark.parametrize("sparse", [False, True])
def test_sdca_local_matches_numpy_reference(loss, sparse):
    rng = np.random.default_rng(2)
    n, d = 37, 9
    X = rng.normal(size=(n, d)) * (rng.uniform(size=(n, d)) < 0.5)
    y = rng.normal(size=n) if loss == "squared" else rng.choice([-1.0, 1.0], size=n)
    alpha0 = np.array([feasible_alpha(loss, yi, rng) for yi in y])
    w = rng.normal(size=d)
    blk = _block(sp.csr_matrix(X) if sparse else X, y, n_task=50)
    alpha = alpha0.copy()
    delta_b = np.empty(d)
    steps = _kernels.sdca_local(*blk.rows, blk.y, alpha, w, delta_b, blk.sq_norms, np.arange(n, dtype=np.int32),
                                _kernels.new_shrink_state(n, False), LOSSES[loss].kernel_id, 0.7, 2.5, 50.0,
                                80 / n, 12345)
    assert steps == 80
    ref_alpha, ref_db = sdca_local_reference(X, y, alpha0, w, 2.5, 50.0, 80, 12345, loss, 0.7)
    assert_allclose(alpha, ref_alpha, rtol=1e-9, atol=1e-12)
    # delta_b is read off u = w + c delta_b: exact up to a few ulps of |w|
    assert_allclose(delta_b, ref_db, rtol=1e-9, atol=1e-13 * np.abs(w).max() / 2.5 * 100)
    assert_allclose(delta_b, X.T @ (alpha - alpha0) / 50.0, rtol=1e-9, atol=1e-13 * np.abs(w).max())


@pytest.mark.parametrize("loss", ["hinge", "smoothed-hinge"])
@pytest.mark.parametrize("sparse", [False, True])
def test_shrinking_matches_numpy_reference_over_rounds(loss, sparse):
    rng = np.random.default_rng(12)
    n, d = 60, 5
    X = rng.normal(size=(n, d)) * (rng.uniform(size=(n, d)) < 0.7)
    y = np.where(X @ rng.normal(size=d) + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    blk = _block(sp.csr_matrix(X) if sparse else X, y)
    c, kid = 20.0, LOSSES[loss].kernel_id
    alpha, b = np.zeros(n), np.zeros(d)
    order, state = np.arange(n, dtype=np.int32), _kernels.new_shrink_state(n, True)
    ref = ShrinkingReference(n)
    shrunk_seen = unshrunk_seen = False
    for r in range(40):
        # each round from identical inputs and shrinking state: rounding cannot accumulate
        ref.order, ref.n_active = list(order), int(state[1])
        ref.pg_max_old, ref.pg_min_old, ref.eps = state[2], state[3], state[4]
        ref_alpha = alpha.copy()
        before = ref.n_active
        db = np.empty(d)
        _kernels.sdca_local(*blk.rows, blk.y, alpha, b * c, db, blk.sq_norms, order, state, kid, 0.5, c,
                            float(n), 1.3, 1000 + r)
        ref_db = ref.round(X, y, ref_alpha, b * c, c, float(n), 1.3, 1000 + r, loss, 0.5)
        assert_allclose(alpha, ref_alpha, rtol=1e-9, atol=1e-12)
        assert_allclose(db, ref_db, rtol=1e-9, atol=1e-12)
        assert int(state[1]) == ref.n_active and list(order) == ref.order
        assert_allclose(state[2:], [ref.pg_max_old, ref.pg_min_old, ref.eps], rtol=1e-12)
        shrunk_seen |= ref.n_active < n
        unshrunk_seen |= ref.n_active > before
        b += db
    assert shrunk_seen and unshrunk_seen                 # the test exercised both directions
    assert_allclose(b, X.T @ alpha / n, atol=1e-12)      # B stays consistent with alpha


def test_dense_and_csr_give_identical_bits():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(50, 8)) * (rng.uniform(size=(50, 8)) < 0.6)
    y = rng.choice([-1.0, 1.0], size=50)
    outs = []
    for M in (X, sp.csr_matrix(X)):
        blk = _block(M, y)
        alpha, db = np.zeros(50), np.empty(8)
        _kernels.sdca_local(*blk.rows, blk.y, alpha, np.zeros(8), db, blk.sq_norms, np.arange(50, dtype=np.int32),
                            _kernels.new_shrink_state(50, True), 0, 1.0, 3.0, 50.0, 3.0, 7)
        outs.append((alpha, db))
    assert_array_equal(outs[0][0], outs[1][0])
    assert_allclose(outs[0][1], outs[1][1], rtol=1e-14, atol=1e-15)  # sums skip explicit zeros in CSR


@pytest.mark.parametrize("loss", ALL_LOSSES)
@pytest.mark.parametrize("sparse", [False, True])
def test_objective_terms_match_numpy(loss, sparse):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(40, 7)) * (rng.uniform(size=(40, 7)) < 0.5)
    y = rng.normal(size=40) if loss == "squared" else rng.choice([-1.0, 1.0], size=40)
    alpha = np.array([feasible_alpha(loss, yi, rng) for yi in y])
    w = rng.normal(size=7) * 3
    blk = _block(sp.csr_matrix(X) if sparse else X, y)
    lsum, csum = _kernels.objective_terms(*blk.rows, blk.y, alpha, w, LOSSES[loss].kernel_id, 0.4)
    assert_allclose(lsum, primal_reference(loss, X @ w, y, 0.4).sum(), rtol=1e-12)
    assert_allclose(csum, conjugate_reference(loss, alpha, y, 0.4).sum(), rtol=1e-12, atol=1e-12)


def test_logistic_loss_is_stable_for_large_margins():
    blk = _block(np.array([[1.0], [1.0]]), np.array([1.0, -1.0]))
    lsum, _ = _kernels.objective_terms(*blk.rows, blk.y, np.zeros(2), np.array([800.0]), 3, 1.0)
    assert_allclose(lsum, 800.0, rtol=1e-12)   # log(1 + e^-800) + log(1 + e^800)


def test_row_sq_norms_dense_and_csr():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(20, 5)) * (rng.uniform(size=(20, 5)) < 0.5)
    for M in (X, sp.csr_matrix(X)):
        assert_allclose(_block(M, np.ones(20)).sq_norms, (X ** 2).sum(axis=1), rtol=1e-14)
