"""Every compiled kernel on random tiny and degenerate inputs (hypothesis), against NumPy references.

Inputs: 1-3 rows, d = 1, all one label, zero rows (nnz = 0), repeated rows, scales from
1e-100 to 1e100 (finite squares), k = 1 task, zero losses, zero instances, ties.  Each test
runs twice through the ``kernels`` fixture (tests/conftest.py): on the optimized module and
on the same source compiled with bounds checks.  Outputs written in place sit between guard
cells that must come back untouched, so an out-of-range write fails the optimized run too.
Examples are derandomized (the same ones on every run, no example database).
"""
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numpy.testing import assert_allclose, assert_array_equal

from hpcmtl import online_rules
from hpcmtl.losses import LOSSES, conjugate_reference, primal_reference
from hpcmtl.projection import (l1inf_norm, project_l1, project_l1_columns, project_l1inf, project_l2,
                               project_l2_columns)
from hpcmtl.taskdata import TaskBlock, rows_of

from reference import (LocalSDCAReference, dual_norm, global_norm, implicit_l2_brentq, implicit_objective,
                       implicit_rmax_enumerate, implicit_rmax_kkt_violation, local_dual_objective,
                       online_reference, project_l1_sort, project_l1inf_bisection, sequential_dot,
                       ssdca_epoch_reference)


def examples(n):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much])


ALL_LOSSES = list(LOSSES)
BOX_LOSSES = ("hinge", "smoothed-hinge", "logistic")
SCALES = [1e-100, 1e-8, 1.0, 1.0, 1.0, 1e8, 1e100]       # |x|^2 stays finite at 1e100
SEEDS = st.integers(0, 2 ** 64 - 1)

# ---------------------------------------------------------------------------
# Guard cells around every array a kernel writes
# ---------------------------------------------------------------------------
GUARD = 3
SENTINEL = {np.dtype(np.float64): -7.25e77, np.dtype(np.int32): -1234567}


def guarded(a):
    """A copy of ``a`` (C order) inside a buffer with GUARD sentinel cells on each side."""
    a = np.ascontiguousarray(a)
    buf = np.full(a.size + 2 * GUARD, SENTINEL[a.dtype], dtype=a.dtype)
    view = buf[GUARD:GUARD + a.size].reshape(a.shape)
    view[...] = a
    return buf, view


def assert_guards(*bufs):
    for buf in bufs:
        fill = SENTINEL[buf.dtype]
        assert np.all(buf[:GUARD] == fill) and np.all(buf[buf.size - GUARD:] == fill), "a kernel wrote out of bounds"


# ---------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------
ENTRY = st.one_of(st.sampled_from([0.0, 0.0, 1.0, -1.0, 0.5, -3.0]), st.floats(-4.0, 4.0))


@st.composite
def rows(draw, max_n=3, max_d=3, min_n=1, scales=SCALES):
    """(n x d) rows with the degenerate shapes mixed in, times a scale."""
    n = draw(st.integers(min_n, max_n))
    d = draw(st.integers(1, max_d))
    X = draw(hnp.arrays(np.float64, (n, d), elements=ENTRY))
    kind = draw(st.sampled_from(["random", "random", "zero row", "repeated rows", "all zero"]))
    if kind == "zero row" and n:
        X[draw(st.integers(0, n - 1))] = 0.0
    elif kind == "repeated rows":
        X[:] = X[:1]
    elif kind == "all zero":
        X[:] = 0.0
    return X * draw(st.sampled_from(scales))


def labels(draw, loss, n):
    if loss == "squared":
        return draw(hnp.arrays(np.float64, n, elements=st.floats(-3.0, 3.0)))
    kind = draw(st.sampled_from(["mixed", "all +1", "all -1"]))
    if kind == "mixed":
        return draw(hnp.arrays(np.float64, n, elements=st.sampled_from([-1.0, 1.0])))
    return np.full(n, 1.0 if kind == "all +1" else -1.0)


def feasible_alpha(draw, loss, y):
    """Dual variables in their box (y alpha in [0, 1]), the bounds themselves included."""
    if loss == "squared":
        return draw(hnp.arrays(np.float64, y.size, elements=st.floats(-3.0, 3.0)))
    b = draw(hnp.arrays(np.float64, y.size, elements=st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0))))
    return y * b


def block(X, y, sparse, n_task=None):
    return TaskBlock(0, "t", n_task or X.shape[0], 0, sp.csr_matrix(X) if sparse else X, y)


def shrink_state(draw, kernels, n, enabled):
    """A fresh state, one whose thresholds shrink every coordinate at a bound at once, random
    thresholds, or garbage (NaN / out-of-range counts, NaN eps) the kernel must not trust."""
    state = kernels.new_shrink_state(n, enabled)
    kind = draw(st.sampled_from(["fresh", "shrink everything", "random", "garbage"]))
    if kind == "shrink everything":
        state[1:4] = [n, -np.inf, np.inf]
    elif kind == "random":
        state[1] = draw(st.integers(1, n))
        state[2] = draw(st.sampled_from([np.inf, 0.5, 2.0, 1e-3]))
        state[3] = draw(st.sampled_from([-np.inf, -0.5, -2.0, -1e-3]))
        state[4] = draw(st.sampled_from([0.1, 1e-3, 1e-13, 0.0]))
    elif kind == "garbage":
        state[1] = draw(st.sampled_from([np.nan, -1.0, 0.0, n + 1.0, 1e300]))
        state[4] = draw(st.sampled_from([np.nan, -1.0, np.inf]))
    return state


# ---------------------------------------------------------------------------
# Local SDCA: every loss x dense / CSR x shrinking on / off
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("shrinking", [False, True], ids=["no-shrinking", "shrinking"])
@pytest.mark.parametrize("loss", ALL_LOSSES)
@examples(30)
@given(data=st.data())
def test_sdca_local_matches_the_liblinear_loop_and_ascends(kernels, loss, shrinking, data):
    draw = data.draw
    X = draw(rows())
    n, d = X.shape
    y = labels(draw, loss, n)
    alpha0 = feasible_alpha(draw, loss, y)
    w = draw(hnp.arrays(np.float64, d, elements=st.floats(-3.0, 3.0)))
    c = 10.0 ** draw(st.integers(-3, 3))
    n_task = float(n * draw(st.sampled_from([1, 2, 10])))
    gamma = draw(st.sampled_from([0.1, 1.0, 5.0]))
    kid = LOSSES[loss].kernel_id
    state0 = shrink_state(draw, kernels, n, shrinking)
    ref = LocalSDCAReference(n, shrinking, state=state0)
    blocks = [block(X, y, False, n_task), block(X, y, True, n_task)]
    runs = [dict(alpha=alpha0.copy(), order=np.arange(n, dtype=np.int32), state=state0.copy()) for _ in blocks]
    alpha_ref = alpha0.copy()
    for call in range(draw(st.integers(1, 3))):          # the state is carried from call to call
        local_iters = draw(st.sampled_from([0.3, 1.0, 2.5]))
        seed = draw(SEEDS)
        start = alpha_ref.copy()
        alpha_ref, db_ref, steps_ref = ref.call(X, y, start, w, c, n_task, local_iters, seed, loss, gamma)
        for blk, run in zip(blocks, runs):
            abuf, alpha = guarded(run["alpha"])
            obuf, order = guarded(run["order"])
            sbuf, state = guarded(run["state"])
            dbuf, db = guarded(np.zeros(d))
            steps = kernels.sdca_local(blk.rows, blk.y, alpha, w, db, blk.sq_norms, order, state, kid, gamma,
                                       c, n_task, local_iters, seed)
            assert_guards(abuf, obuf, sbuf, dbuf)
            assert steps == steps_ref >= 1
            # logistic: the kernel (Newton in logit space, u updated in place) and the reference (bisection,
            # u recomputed) round the margin z_j = x_j . u differently, by ulps of |x_j| . |u|; the root moves
            # by at most that times t (1 - t) <= 1/4 (1e8-sized rows make |u| 1e9: differences of 1e-9)
            spread = 0.0
            if loss == "logistic":
                u_size = np.abs(w) + c * (np.abs(X).T @ (np.abs(alpha_ref) + np.abs(start))) / n_task
                spread = 1e-15 * (steps + 1) * (np.abs(X) @ u_size)
            assert np.all(np.abs(alpha - alpha_ref) <= 1e-9 * np.abs(alpha_ref) + 1e-12 + spread), (alpha, alpha_ref)
            if loss != "logistic":                       # same operations in the same order: same path
                assert list(order) == list(ref.order)
            if shrinking and loss in ("hinge", "smoothed-hinge"):
                assert int(state[1]) == ref.n_active and 1 <= ref.n_active <= n
                assert_allclose(state[2:], ref.state()[1:], rtol=1e-12)
            else:
                assert_array_equal(state, run["state"])  # untouched: no shrinking for this loss / setting
            assert sorted(order) == list(range(n))       # still a permutation of the block's rows
            if loss in BOX_LOSSES:
                assert np.all((0.0 <= y * alpha) & (y * alpha <= 1.0))
            # delta_b is X^T (alpha - alpha_start) / n_task, read off u = w + c delta_b (a few ulps of |w| / c;
            # a step below an ulp of alpha_j still moves u)
            moved = np.abs(X).T @ (np.abs(alpha - start) + np.abs(alpha)) / n_task
            tol = 1e-12 * (steps + 1) * (moved + np.abs(w).max() / c)
            assert np.all(np.abs(db - X.T @ (alpha - start) / n_task) <= tol + 1e-300)
            apart = np.abs(X).T @ np.abs(alpha - alpha_ref) / n_task     # what the alpha difference above moves
            assert np.all(np.abs(db - db_ref) <= tol + 1e-9 * moved + apart + 1e-300)
            # dual ascent: each step maximizes the local subproblem along one coordinate
            before = local_dual_objective(loss, X, y, start, start, w, c, n_task, gamma)
            after = local_dual_objective(loss, X, y, start, alpha, w, c, n_task, gamma)
            size = (np.abs(conjugate_reference(loss, alpha, y, gamma)).sum() + abs(before)
                    + n_task * np.abs(w) @ moved + 0.5 * c * n_task * moved @ moved)
            # (logistic keeps y alpha in [1e-300, 1 - 1e-16]: a step can miss by 1e-300 times its gradient)
            floor = steps * 1e-299 * (750.0 + np.abs(X).max() * (np.abs(w).sum() + c * moved.sum()))
            assert after >= before - 1e-9 * size - floor
            run.update(alpha=alpha.copy(), order=order.copy(), state=state.copy())
    assert_array_equal(runs[0]["alpha"], runs[1]["alpha"])    # dense and CSR: the same bits


@pytest.mark.parametrize("loss", ALL_LOSSES)
@examples(15)
@given(data=st.data())
def test_sdca_local_converges_to_the_kkt_point_of_its_subproblem(kernels, loss, data):
    """Many passes on 1-3 rows solve the local subproblem: the projected gradient vanishes.

    Two rows that cancel (y_1 x_1 = -y_2 x_2) leave a flat direction that coordinate ascent
    crosses in steps of about 1 / q, q = c ||x||^2 / n: O(q) passes, so q stays below ~50 here
    (the agreement test above covers the extreme scales).
    """
    draw = data.draw
    X = draw(rows(scales=[1e-100, 1e-8, 1.0]))
    n, d = X.shape
    y = labels(draw, loss, n)
    w = draw(hnp.arrays(np.float64, d, elements=st.floats(-3.0, 3.0)))
    c, gamma = 10.0 ** draw(st.integers(-2, 0)), draw(st.sampled_from([0.5, 1.0]))
    shrinking = draw(st.booleans())
    alpha = np.zeros(n)
    blk = block(X, y, draw(st.booleans()))
    db = np.empty(d)
    kernels.sdca_local(blk.rows, blk.y, alpha, w, db, blk.sq_norms, np.arange(n, dtype=np.int32),
                       kernels.new_shrink_state(n, shrinking), LOSSES[loss].kernel_id, gamma, c, float(n),
                       400.0, draw(SEEDS))
    u = w + c * db
    ux = np.array([sequential_dot(X[j], u) for j in range(n)])
    # d/d alpha_j of  sum -l*(-alpha) - w.X^T alpha - (c n / 2)||X^T alpha / n||^2  is  -d l*(-a)/da - x_j.u
    if loss == "squared":
        grad, b = y - alpha - ux, None
    else:
        b = y * alpha
        dconj = {"hinge": np.ones(n), "smoothed-hinge": 1.0 - gamma * b,
                 "logistic": np.log(np.maximum(1 - b, 1e-300)) - np.log(np.maximum(b, 1e-300))}[loss]
        grad = dconj - y * ux                                  # in b = y alpha
    scale = 1.0 + np.abs(ux) + (np.abs(y) if loss == "squared" else 0.0)
    if loss in ("hinge", "smoothed-hinge"):
        pg = np.where(b <= 0.0, np.maximum(grad, 0.0), np.where(b >= 1.0, np.minimum(grad, 0.0), grad))
        # repeated rows make the subproblem degenerate: the dual optimum is a face, coordinate ascent
        # reaches it only linearly, so the check is on the projected gradient at 1e-6
        assert np.all(np.abs(pg) <= 1e-6 * scale)
    elif loss == "squared":
        assert np.all(np.abs(grad) <= 1e-6 * scale)
    else:
        interior = (b > 1e-12) & (b < 1 - 1e-12)
        assert np.all(np.abs(grad[interior]) <= 1e-6 * (scale[interior] + np.abs(np.log(b[interior]))))


# ---------------------------------------------------------------------------
# objective_terms, row_sq_norms, rmatvec_nonzero, ssdca_epoch
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("loss", ALL_LOSSES)
@examples(25)
@given(data=st.data())
def test_objective_terms_and_row_norms(kernels, loss, data):
    draw = data.draw
    X = draw(rows(min_n=0))
    n, d = X.shape
    y = labels(draw, loss, n)
    alpha = feasible_alpha(draw, loss, y)
    w = draw(hnp.arrays(np.float64, d, elements=st.floats(-3.0, 3.0))) * draw(st.sampled_from([1.0, 1e-50]))
    gamma = draw(st.sampled_from([0.1, 1.0]))
    for sparse in (False, True):
        blk = block(X, y, sparse)
        sq = kernels.row_sq_norms(blk.rows, n)
        assert_array_equal(sq, [sequential_dot(X[j], X[j]) for j in range(n)])
        assert_allclose(sq, (X ** 2).sum(axis=1), rtol=1e-14)
        lsum, csum = kernels.objective_terms(blk.rows, blk.y, alpha, w, LOSSES[loss].kernel_id, gamma)
        z = np.array([sequential_dot(X[j], w) for j in range(n)])
        losses = primal_reference(loss, z, y, gamma)
        conj = conjugate_reference(loss, alpha, y, gamma)
        assert np.isfinite(lsum) and np.isfinite(csum)
        assert abs(lsum - losses.sum()) <= 1e-12 * np.abs(losses).sum() + 1e-300
        assert abs(csum - conj.sum()) <= 1e-12 * np.abs(conj).sum() + 1e-300


@examples(40)
@given(data=st.data())
def test_rmatvec_nonzero_matches_numpy(kernels, data):
    """X^T v over the rows where v is non-zero: 0-3 rows, zero rows, v all zero / one entry / dense, dense,
    CSR and float32 rows; the output sits between guard cells; CSR rows give scipy's bits."""
    draw = data.draw
    X = draw(rows(min_n=0))
    n, d = X.shape
    v = draw(hnp.arrays(np.float64, n, elements=st.one_of(st.just(0.0), st.floats(-3.0, 3.0))))
    v = v * draw(st.sampled_from([1.0, 1e-50, 1e50]))
    for sparse in (False, True):
        for single in (False, True) if np.all(np.abs(X) < 1e38) else (False,):     # float32 where X fits it
            Xs = X.astype(np.float32) if single else X
            blk = block(Xs, np.ones(n), sparse)
            obuf, out = guarded(np.full(d, np.nan))
            kernels.rmatvec_nonzero(blk.rows, v, out)
            assert_guards(obuf)
            exact = Xs.astype(np.float64)
            if sparse and not single:
                assert_array_equal(out, sp.csr_matrix(exact).T @ v)
            scale = np.abs(exact).T @ np.abs(v)
            assert np.all(np.abs(out - exact.T @ v) <= 1e-14 * scale + 1e-300)


@pytest.mark.parametrize("loss", ALL_LOSSES)
@examples(20)
@given(data=st.data())
def test_ssdca_epoch_matches_numpy_and_keeps_w_equal_b_sigma_over_lam(kernels, loss, data):
    draw = data.draw
    m = draw(st.integers(1, 3))
    parts = [draw(rows(max_d=2, scales=[1.0])) for _ in range(m)]
    d = min(p.shape[1] for p in parts)
    scale = draw(st.sampled_from(SCALES))            # one for all tasks: W mixes them through Sigma
    parts = [p[:, :d] * scale for p in parts]
    X = np.vstack(parts)
    counts = np.array([p.shape[0] for p in parts], dtype=float)
    n = X.shape[0]
    y = labels(draw, loss, n)
    alpha0 = feasible_alpha(draw, loss, y)
    task_of_row = np.repeat(np.arange(m, dtype=np.int32), counts.astype(int))
    A = draw(hnp.arrays(np.float64, (m, m), elements=st.floats(-1.0, 1.0)))
    Sigma = A @ A.T + 0.1 * np.eye(m)
    lam = 10.0 ** draw(st.integers(-3, 1))
    BT = np.zeros((m, d))
    for j in range(n):
        BT[task_of_row[j]] += alpha0[j] * X[j] / counts[task_of_row[j]]
    WT = Sigma @ BT / lam
    n_steps, seed = draw(st.integers(0, 8)), draw(SEEDS)
    sparse = draw(st.booleans())
    blk = block(X, y, sparse)
    abuf, alpha = guarded(alpha0)
    wbuf, WTk = guarded(WT)
    bbuf, BTk = guarded(BT)
    pbuf, perm = guarded(np.zeros(n, dtype=np.int32))
    steps = kernels.ssdca_epoch(blk.rows, blk.y, alpha, task_of_row, counts, WTk, BTk, Sigma, blk.sq_norms,
                                perm, LOSSES[loss].kernel_id, 0.5, lam, n_steps, seed)
    assert_guards(abuf, wbuf, bbuf, pbuf)
    ref_alpha, ref_WT, ref_BT, ref_steps = ssdca_epoch_reference(X, y, alpha0, task_of_row, counts, WT, BT, Sigma,
                                                                  lam, n_steps, seed, loss, 0.5)
    assert steps == ref_steps == n_steps
    assert_allclose(alpha, ref_alpha, rtol=1e-9, atol=1e-12)
    if loss in BOX_LOSSES:
        assert np.all((0.0 <= y * alpha) & (y * alpha <= 1.0))
    moved = np.abs(X).T @ np.abs(alpha - alpha0)
    bscale = np.abs(BT).max() + moved.max() / counts.min() + 1e-300
    assert_allclose(BTk, ref_BT, rtol=1e-9, atol=1e-9 * bscale)
    wscale = np.abs(Sigma).max() * bscale / lam
    assert_allclose(WTk, ref_WT, rtol=1e-9, atol=1e-9 * wscale)
    assert_allclose(WTk, Sigma @ BTk / lam, rtol=1e-9, atol=1e-9 * wscale)   # W = B Sigma / lam kept exact


# ---------------------------------------------------------------------------
# Projections
# ---------------------------------------------------------------------------
@st.composite
def matrices(draw, max_d=4, max_m=4):
    d, m = draw(st.integers(1, max_d)), draw(st.integers(1, max_m))
    W = draw(hnp.arrays(np.float64, (d, m), elements=ENTRY))
    kind = draw(st.sampled_from(["random", "random", "ties", "zero rows", "one entry"]))
    if kind == "ties":
        W = np.sign(W) * np.abs(W).max(initial=1.0)
    elif kind == "zero rows":
        W[::2] = 0.0
    elif kind == "one entry":
        W[:] = 0.0
        W[draw(st.integers(0, d - 1)), draw(st.integers(0, m - 1))] = draw(st.sampled_from([1.0, -2.5]))
    return W * draw(st.sampled_from(SCALES))


FRACTIONS = st.sampled_from([0.0, 1e-9, 0.1, 0.5, 0.9, 1.0, 2.0])


@examples(40)
@given(W=matrices(), fraction=FRACTIONS)
def test_l1inf_projection_is_feasible_optimal_and_matches_bisection(kernels, W, fraction):
    norm = l1inf_norm(W)
    C = fraction * norm
    B, info = project_l1inf(W, C, return_info=True)
    scale = max(np.abs(W).max(), 1e-300)
    # the caps are row maxima minus the removed mass theta: C << ||W|| cancels digits, eps ||W|| each
    slack = 1e-13 * norm * W.size
    assert np.all(np.isfinite(B))
    assert l1inf_norm(B) <= C * (1 + 1e-12) + slack + 1e-300                # feasible
    if norm > C:
        assert abs(l1inf_norm(B) - C) <= 1e-9 * C + slack + 1e-300          # on the boundary
    else:
        assert_array_equal(B, W)                                          # inside: unchanged
    assert np.all(np.sign(B) * np.sign(W) >= 0) and np.all(np.abs(B) <= np.abs(W))
    assert_allclose(B, project_l1inf_bisection(W, C, iters=64), atol=1e-9 * scale)
    if 0 < C < norm:                                                       # KKT: the same mass theta leaves
        live = info["mu"] > 0                                              # every surviving row
        removed = (np.abs(W) - np.abs(B)).sum(axis=1)
        assert_allclose(removed[live], info["theta"], rtol=1e-9, atol=1e-12 * scale)
        assert np.all(np.abs(W).sum(axis=1)[~live] <= info["theta"] * (1 + 1e-9) + 1e-12 * scale)


@examples(40)
@given(S=matrices(max_d=3), fraction=st.sampled_from([1e-9, 0.3, 0.99, 1.0]))
def test_l1inf_caps_directly_on_sorted_rows(kernels, S, fraction):
    S = np.sort(np.abs(S), axis=1)
    delta = fraction * S[:, -1].sum()
    theta, mu, steps = kernels.l1inf_caps(S, delta)
    theta_m, mu_m, _ = kernels.l1inf_caps(S, delta, max_newton=0)          # the merge-walk fallback
    scale = max(S.max(), 1e-300)
    assert np.all(mu >= 0) and np.all(mu <= S[:, -1] * (1 + 1e-12))
    if delta > 0:
        assert (S[:, -1] - mu).sum() == pytest.approx(delta, rel=1e-9, abs=1e-12 * scale)   # the mass removed
    if fraction < 1:                                   # (removing everything: any theta past the last row)
        assert theta == pytest.approx(theta_m, rel=1e-9, abs=1e-12 * scale)
    assert_allclose(mu, mu_m, rtol=1e-9, atol=1e-12 * scale)


def test_l1inf_caps_with_no_rows_or_no_columns(kernels):
    theta, mu, steps = kernels.l1inf_caps(np.zeros((0, 3)), 1.0)
    assert theta == 0.0 and mu.shape == (0,)
    theta, mu, steps = kernels.l1inf_caps(np.zeros((2, 0)), 1.0)           # (read S[i, -1] before the fix)
    assert theta == 0.0 and steps == 0
    assert_array_equal(mu, [0.0, 0.0])


def check_l1_and_l2_projections(kernels, v, fraction, seed, l1_atol):
    """project_l1 / project_l2 (and their column forms) of ``v`` at radius ``fraction`` of its norm against
    the sort-based projection and the closed form; ``l1_atol`` in units of 1e-12 |v|_inf."""
    C = fraction * np.abs(v).sum()
    x = project_l1(v, C, seed=seed)
    tol = 1e-12 * max(np.abs(v).max(), 1e-300)
    assert np.abs(x).sum() <= C * (1 + 1e-12) + v.size * tol + 1e-300     # (|v| - theta: eps |v| each)
    assert_allclose(x, project_l1_sort(v, C) if C > 0 else 0.0, atol=l1_atol * tol)
    a = np.abs(v)
    theta = kernels.project_l1_inplace(a, C, seed) if np.abs(v).sum() > C else 0.0
    if np.abs(v).sum() > C:
        assert_allclose(a, np.maximum(np.abs(v) - theta, 0.0), atol=10 * tol)   # a soft threshold at theta
    C2 = fraction * np.linalg.norm(v)
    x2 = project_l2(v, C2)
    assert np.linalg.norm(x2) <= C2 * (1 + 1e-12) + 1e-300
    assert_allclose(x2, v if np.linalg.norm(v) <= C2 else v * (C2 / np.linalg.norm(v)), atol=tol)
    W = np.column_stack([v, v[::-1]])
    assert_allclose(project_l1_columns(W, C), np.column_stack([x, x[::-1]]), atol=10 * tol)
    assert_allclose(project_l2_columns(W, C2), np.column_stack([project_l2(W[:, j], C2) for j in range(2)]),
                    atol=tol)
    return x, C


@examples(60)
@given(v=hnp.arrays(np.float64, st.integers(1, 6), elements=ENTRY), scale=st.sampled_from(SCALES),
       fraction=FRACTIONS, seed=SEEDS)
def test_l1_and_l2_projections(kernels, v, scale, fraction, seed):
    check_l1_and_l2_projections(kernels, v * scale, fraction, seed, l1_atol=10)


def test_l1_and_l2_projections_at_fixed_sizes_and_known_answers(kernels):
    """The same checks on vectors of up to 1001 entries (l1 to 1e-12 |v|_inf, the radius met to 1e-12), and
    the projections known by hand."""
    rng = np.random.default_rng(4)
    for n in (1, 2, 7, 100, 1001):
        for _ in range(5):
            v = rng.normal(size=n) * 10.0 ** rng.uniform(-3, 3)
            x, C = check_l1_and_l2_projections(kernels, v, 0.3, n, l1_atol=1)
            assert np.abs(x).sum() == pytest.approx(C, rel=1e-12)
    v = np.array([3.0, -4.0])
    assert_allclose(project_l2(v, 1.0), [0.6, -0.8])
    assert_array_equal(project_l2(v, 10.0), v)
    ties = np.array([1.0, 1.0, 1.0, -1.0])
    assert_allclose(project_l1(ties, 2.0), [0.5, 0.5, 0.5, -0.5])
    W = rng.normal(size=(6, 3))
    assert_allclose(project_l1_columns(W, 1.0), np.column_stack([project_l1_sort(W[:, j], 1.0) for j in range(3)]),
                    atol=1e-12)
    assert_allclose(np.linalg.norm(project_l2_columns(W, 0.5), axis=0), np.minimum(np.linalg.norm(W, axis=0), 0.5))


def test_l1_kernel_rejects_what_it_cannot_project(kernels):
    with pytest.raises(ValueError, match="radius"):
        kernels.project_l1_inplace(np.ones(3), -1.0, 0)
    with pytest.raises(ValueError, match="entries >= 0"):
        kernels.project_l1_inplace(np.array([1.0, -1.0]), 0.5, 0)
    a = np.array([1.0, 3.0, 2.0])
    assert kernels.project_l1_inplace(a, 0.0, 0) == 3.0 and not a.any()   # radius 0: the origin


# ---------------------------------------------------------------------------
# Online multitask learning: tau and the round kernels
# ---------------------------------------------------------------------------
@st.composite
def tau_rounds(draw, max_k=3):
    k = draw(st.integers(1, max_k))
    loss = draw(hnp.arrays(np.float64, k, elements=st.one_of(st.just(0.0), st.floats(1e-3, 5.0))))
    sq = draw(hnp.arrays(np.float64, k, elements=st.one_of(st.just(0.0), st.floats(0.01, 5.0))))
    if draw(st.booleans()) and k > 1:
        loss[1:] = loss[0]                                # ties
    if draw(st.booleans()):
        loss[:] = 0.0 if draw(st.booleans()) else loss   # zero losses
    return loss * draw(st.sampled_from([1e-50, 1e-6, 1.0, 1e6, 1e50])), sq * draw(st.sampled_from([1e-6, 1.0, 1e6]))


RULES = [("linf", {}), ("l1", {}), ("l2", {}), ("rmax", {"r": 2}), ("p", {"p": 3.0}), ("p", {"p": 1.5})]


@pytest.mark.parametrize("update", ["perceptron", "infinite"])
@examples(40)
@given(round_=tau_rounds(), C=st.sampled_from([1e-3, 0.5, 4.0]))
def test_explicit_tau_solves_its_linear_problem(online_kernels, update, round_, C):
    loss, sq = round_
    k = loss.size
    for norm, kw in RULES:
        if kw.get("r", 1) > k:
            continue
        R = 1.3
        tau = online_rules.tau(loss, sq, C, update=update, norm=norm, R=R, **kw)
        assert np.all(tau >= 0) and np.all(tau[loss == 0] == 0)
        nid, p, r = online_rules.resolve_norm(norm, kw.get("p", 2.0), kw.get("r", 1), k)
        rho = online_rules.remoteness(nid, p, r, k)
        norm_l = global_norm(loss, norm, **kw)
        radius = C if update == "perceptron" else min(C, norm_l / (R * R * rho * rho))
        assert dual_norm(tau, norm, **kw) <= radius * (1 + 1e-12) + 1e-300
        assert tau @ loss == pytest.approx(radius * norm_l, rel=1e-12, abs=1e-300)   # Eq. 10 / 17


@examples(60)
@given(round_=tau_rounds(), C=st.sampled_from([1e-3, 0.3, 2.0]), rule=st.sampled_from(
    [("linf", {}), ("l1", {}), ("rmax", {"r": 2}), ("rmax", {"r": 3})]))
def test_implicit_rmax_tau_is_the_kkt_point(online_kernels, round_, C, rule):
    loss, sq = round_
    k = loss.size
    norm, kw = rule
    if kw.get("r", 1) > k:
        return
    r = {"linf": 1, "l1": k}.get(norm, kw.get("r"))
    tau = online_rules.tau(loss, sq, C, update="implicit", norm=norm, **kw)
    assert np.all(np.isfinite(tau)) and np.all(tau[loss == 0] == 0)
    assert tau.sum() <= r * C * (1 + 1e-15) and np.all(tau <= C)           # in the dual ball
    assert implicit_rmax_kkt_violation(tau, loss, sq, C, r) <= 1e-9
    if np.all(sq > 0) and np.all(loss / sq < 1e200):
        best = implicit_rmax_enumerate(loss, sq, C, r)
        size = np.abs(2 * best * loss).sum() + (best ** 2 * sq).sum() + 1e-300
        # tau_j = (l_j - theta) / s_j with theta ~ l_j: eps max(l / s) / C relative is rounding
        cond = np.max(loss / sq) / C
        assert implicit_objective(tau, loss, sq) >= implicit_objective(best, loss, sq) - (1e-9 + 1e-14 * cond) * size


@examples(60)
@given(round_=tau_rounds(), C=st.sampled_from([1e-3, 0.3, 2.0]))
def test_implicit_l2_tau_is_the_root_of_eq_27(online_kernels, round_, C):
    loss, sq = round_
    tau = online_rules.tau(loss, sq, C, update="implicit", norm="l2")
    assert np.all(np.isfinite(tau)) and np.all(tau >= 0) and np.all(tau[loss == 0] == 0)
    assert np.linalg.norm(tau) <= C * (1 + 1e-12)
    pos = loss > 0
    if pos.any():
        # tau_j (s_j + theta) = l_j for one theta >= 0, which is 0 unless ||tau|| = C
        theta = loss[pos] / tau[pos] - sq[pos]
        assert np.all(theta >= -1e-9 * (sq[pos] + np.abs(theta)))
        assert np.ptp(theta) <= 1e-9 * (np.abs(theta).max() + sq[pos].max())
        if np.linalg.norm(tau) < C * (1 - 1e-9):
            assert_allclose(tau[pos], loss[pos] / sq[pos], rtol=1e-9)
    if np.all(sq[pos] > 0) and pos.any() and np.all(loss[pos] / sq[pos] < 1e100):
        assert_allclose(tau, implicit_l2_brentq(loss, sq, C), rtol=1e-9, atol=1e-12 * C)


@examples(20)
@given(data=st.data())
def test_tau_rounds_is_each_round_on_its_own(online_kernels, data):
    draw = data.draw
    k = draw(st.integers(1, 3))
    T = draw(st.integers(0, 3))
    pairs = [draw(tau_rounds(max_k=1)) for _ in range(T * k)]
    L = np.array([p[0][0] for p in pairs]).reshape(T, k)
    S = np.array([p[1][0] for p in pairs]).reshape(T, k)
    update = draw(st.sampled_from(["implicit", "perceptron", "infinite"]))
    norm = draw(st.sampled_from(["linf", "l1", "l2"]))
    got = online_rules.tau(L, S, 0.5, update=update, norm=norm, R=2.0)
    assert got.shape == (T, k)
    for t in range(T):
        assert_array_equal(got[t], online_rules.tau(L[t], S[t], 0.5, update=update, norm=norm, R=2.0))


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@examples(20)
@given(data=st.data())
def test_online_round_kernels_replay_fig_1_and_the_block_exchange(online_kernels, sparse, data):
    """online_rounds against the NumPy replay; the block kernels (margins, Gram, server solve, worker
    apply) against online_rounds."""
    draw = data.draw
    X = draw(rows(max_n=4, min_n=0))
    T, d = X.shape
    k = draw(st.integers(1, 3))
    Y = draw(hnp.arrays(np.float64, (T, k), elements=st.sampled_from([-1.0, 1.0, 0.0])))
    update = draw(st.sampled_from(["implicit", "perceptron"]))
    norm = draw(st.sampled_from(["linf", "l1", "l2"]))
    rule = online_rules.make_rule(k, 0.7, update=update, norm=norm)
    rows_ = rows_of(sp.csr_matrix(X) if sparse else X)[0]
    wbuf, W = guarded(np.zeros((d, k)))
    mbuf, margins = guarded(np.zeros((T, k)))
    gbuf, gloss = guarded(np.zeros(T))
    online_kernels.online_rounds(rows_, False, Y, W, *rule.args(), margins, gloss)
    assert_guards(wbuf, mbuf, gbuf)
    W_ref, m_ref = online_reference(X, Y, lambda lo, sq: online_rules.tau(lo, sq, 0.7, update=update, norm=norm))
    scale = np.abs(X).max(initial=0.0) ** 2 + 1e-300
    assert_allclose(margins, m_ref, rtol=1e-9, atol=1e-12 * scale)
    assert_allclose(W, W_ref, rtol=1e-9, atol=1e-12 * (np.abs(W_ref).max(initial=0.0) + 1e-300))
    # the same rounds exchanged in one block
    if T:
        M0 = np.empty((T, k))
        online_kernels.online_block_margins(rows_, 0, np.zeros((d, k)), M0)
        assert_array_equal(M0, 0.0)
        G = np.empty((T, T))
        scratch = np.zeros(d)
        online_kernels.online_block_gram(rows_, 0, G, scratch)
        assert_allclose(G, X @ X.T, rtol=1e-12, atol=1e-300)
        assert_array_equal(scratch, 0.0)
        tau, m2, g2 = np.zeros((T, k)), np.empty((T, k)), np.empty(T)
        online_kernels.online_block_solve(M0, G, Y, *rule.args(), tau, m2, g2)
        assert_allclose(m2, margins, rtol=1e-9, atol=1e-12 * scale)
        W2 = np.zeros((d, k))
        online_kernels.online_block_apply(rows_, 0, Y, tau, W2)
        assert_allclose(W2, W, rtol=1e-9, atol=1e-12 * (np.abs(W).max(initial=0.0) + 1e-300))
