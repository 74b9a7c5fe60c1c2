"""Compiled kernels against slow NumPy references, dense and CSR."""
import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose, assert_array_equal
from scipy.optimize import minimize_scalar

from hpcmtl.losses import LOSSES, conjugate_reference, primal_reference
from hpcmtl.store import read_result, write_tasks
from hpcmtl._rows import Rows
from hpcmtl.taskdata import TaskBlock

from conftest import run_hpcmtl
from reference import (LocalSDCAReference, ShrinkingReference, coordinate_step_reference, local_objective,
                       sdca_local_reference)
from conftest import wsteps_certified  # noqa: E402

ALL_LOSSES = list(LOSSES)


def feasible_alpha(loss, y, rng):
    return rng.normal() if loss == "squared" else y * rng.uniform(0, 1)


@pytest.mark.parametrize("loss", ALL_LOSSES)
def test_coordinate_step_matches_closed_form_and_maximizes(kernels, loss):
    rng = np.random.default_rng(1)
    kid = LOSSES[loss].kernel_id
    for _ in range(300):
        y = rng.choice([-1.0, 1.0]) if loss != "squared" else rng.normal()
        a = feasible_alpha(loss, y, rng)
        ux = rng.normal(scale=3)
        q = 10 ** rng.uniform(-4, 3)
        gamma = 10 ** rng.uniform(-2, 0.5)
        delta = kernels.coordinate_step(kid, y, a, ux, q, gamma)
        assert_allclose(delta, coordinate_step_reference(loss, y, a, ux, q, gamma), rtol=1e-9, atol=1e-12)
        # a general-purpose 1-D solver finds no better point of the local objective
        f = lambda dl: -local_objective(loss, y, a, ux, q, dl, gamma)  # noqa: E731
        if loss == "squared":
            best = minimize_scalar(f, bracket=(-10, 10), tol=1e-12).x
        else:
            lo, hi = sorted([y * 0 - a, y * 1 - a])
            best = minimize_scalar(f, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12}).x
        assert -f(delta) >= -f(best) - 1e-9


def test_hinge_step_with_zero_row_is_finite(kernels):
    # ||x|| = 0 gives q = 0: the maximizer moves to the box edge the margin points to
    assert kernels.coordinate_step(0, 1.0, 0.3, 0.0, 0.0, 1.0) == pytest.approx(0.7)
    assert kernels.coordinate_step(0, -1.0, -0.3, -2.0, 0.0, 1.0) == pytest.approx(0.3)


def _block(X, y, n_task=None):
    return TaskBlock(0, "t", n_task or X.shape[0], 0, X, y)


@pytest.mark.parametrize("loss", ALL_LOSSES)
@pytest.mark.parametrize("sparse", [False, True])
def test_sdca_local_matches_numpy_reference(kernels, loss, sparse):
    rng = np.random.default_rng(2)
    n, d = 37, 9
    X = rng.normal(size=(n, d)) * (rng.uniform(size=(n, d)) < 0.5)
    y = rng.normal(size=n) if loss == "squared" else rng.choice([-1.0, 1.0], size=n)
    alpha0 = np.array([feasible_alpha(loss, yi, rng) for yi in y])
    w = rng.normal(size=d)
    blk = _block(sp.csr_matrix(X) if sparse else X, y, n_task=50)
    alpha = alpha0.copy()
    delta_b = np.empty(d)
    steps = kernels.sdca_local(blk.rows, blk.y, alpha, w, delta_b, blk.sq_norms, np.arange(n, dtype=np.int32),
                               kernels.new_shrink_state(n, False), LOSSES[loss].kernel_id, 0.7, 2.5, 50.0,
                               80 / n, 12345)
    assert steps == 80
    ref_alpha, ref_db = sdca_local_reference(X, y, alpha0, w, 2.5, 50.0, 80, 12345, loss, 0.7)
    assert_allclose(alpha, ref_alpha, rtol=1e-9, atol=1e-12)
    # delta_b is read off u = w + c delta_b: exact up to a few ulps of |w|
    assert_allclose(delta_b, ref_db, rtol=1e-9, atol=1e-13 * np.abs(w).max() / 2.5 * 100)
    assert_allclose(delta_b, X.T @ (alpha - alpha0) / 50.0, rtol=1e-9, atol=1e-13 * np.abs(w).max())


@pytest.mark.parametrize("loss", ["hinge", "smoothed-hinge"])
@pytest.mark.parametrize("sparse", [False, True])
def test_shrinking_matches_numpy_reference_over_rounds(kernels, loss, sparse):
    rng = np.random.default_rng(12)
    n, d = 60, 5
    X = rng.normal(size=(n, d)) * (rng.uniform(size=(n, d)) < 0.7)
    y = np.where(X @ rng.normal(size=d) + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    blk = _block(sp.csr_matrix(X) if sparse else X, y)
    c, kid = 20.0, LOSSES[loss].kernel_id
    alpha, b = np.zeros(n), np.zeros(d)
    order, state = np.arange(n, dtype=np.int32), kernels.new_shrink_state(n, True)
    ref = ShrinkingReference(n)
    shrunk_seen = unshrunk_seen = False
    for r in range(40):
        # each round from identical inputs and shrinking state: rounding cannot accumulate
        ref.order, ref.n_active = list(order), int(state[1])
        ref.pg_max_old, ref.pg_min_old, ref.eps = state[2], state[3], state[4]
        ref_alpha = alpha.copy()
        before = ref.n_active
        db = np.empty(d)
        kernels.sdca_local(blk.rows, blk.y, alpha, b * c, db, blk.sq_norms, order, state, kid, 0.5, c,
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


def test_dense_and_csr_give_identical_bits(kernels):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(50, 8)) * (rng.uniform(size=(50, 8)) < 0.6)
    y = rng.choice([-1.0, 1.0], size=50)
    outs = []
    for M in (X, sp.csr_matrix(X)):
        blk = _block(M, y)
        alpha, db = np.zeros(50), np.empty(8)
        kernels.sdca_local(blk.rows, blk.y, alpha, np.zeros(8), db, blk.sq_norms, np.arange(50, dtype=np.int32),
                           kernels.new_shrink_state(50, True), 0, 1.0, 3.0, 50.0, 3.0, 7)
        outs.append((alpha, db))
    assert_array_equal(outs[0][0], outs[1][0])
    assert_allclose(outs[0][1], outs[1][1], rtol=1e-14, atol=1e-15)  # sums skip explicit zeros in CSR


@pytest.mark.parametrize("loss", ALL_LOSSES)
@pytest.mark.parametrize("sparse", [False, True])
def test_objective_terms_match_numpy(kernels, loss, sparse):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(40, 7)) * (rng.uniform(size=(40, 7)) < 0.5)
    y = rng.normal(size=40) if loss == "squared" else rng.choice([-1.0, 1.0], size=40)
    alpha = np.array([feasible_alpha(loss, yi, rng) for yi in y])
    w = rng.normal(size=7) * 3
    blk = _block(sp.csr_matrix(X) if sparse else X, y)
    lsum, csum = kernels.objective_terms(blk.rows, blk.y, alpha, w, LOSSES[loss].kernel_id, 0.4)
    assert_allclose(lsum, primal_reference(loss, X @ w, y, 0.4).sum(), rtol=1e-12)
    assert_allclose(csum, conjugate_reference(loss, alpha, y, 0.4).sum(), rtol=1e-12, atol=1e-12)


def test_logistic_loss_is_stable_for_large_margins(kernels):
    blk = _block(np.array([[1.0], [1.0]]), np.array([1.0, -1.0]))
    lsum, _ = kernels.objective_terms(blk.rows, blk.y, np.zeros(2), np.array([800.0]), 3, 1.0)
    assert_allclose(lsum, 800.0, rtol=1e-12)   # log(1 + e^-800) + log(1 + e^800)


def test_row_sq_norms_dense_and_csr(kernels):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(20, 5)) * (rng.uniform(size=(20, 5)) < 0.5)
    for M in (X, sp.csr_matrix(X)):
        assert_allclose(_block(M, np.ones(20)).sq_norms, (X ** 2).sum(axis=1), rtol=1e-14)



def test_rmatvec_nonzero_reads_only_the_moved_rows(kernels):
    """X^T v over the rows where v is non-zero (the box momentum's direction): on CSR rows bitwise scipy's
    X.T @ v, dense rows to rounding; at its edges (v all zero, one row, the last row, rows without entries,
    d = 0, no rows) and against damaged rows, which it refuses only where it reads them."""
    rng = np.random.default_rng(9)
    n, d = 40, 7
    X = rng.normal(size=(n, d)) * (rng.uniform(size=(n, d)) < 0.4)
    X[[3, 17, n - 1]] = 0.0                                    # rows without entries (CSR: empty rows)
    for v in (np.zeros(n), np.eye(n)[0], np.eye(n)[n - 1], np.eye(n)[17],
              rng.normal(size=n) * (rng.uniform(size=n) < 0.1), rng.normal(size=n)):
        csr = sp.csr_matrix(X)
        out = np.full(d, np.nan)
        kernels.rmatvec_nonzero(_block(csr, np.ones(n)).rows, v, out)
        assert_array_equal(out, csr.T @ v)                     # bitwise, zeros included
        kernels.rmatvec_nonzero(_block(X, np.ones(n)).rows, v, out)
        assert_allclose(out, X.T @ v, rtol=1e-13, atol=1e-15)
        X32 = X.astype(np.float32)
        kernels.rmatvec_nonzero(_block(sp.csr_matrix(X32), np.ones(n)).rows, v, out)
        assert_allclose(out, X32.astype(np.float64).T @ v, rtol=1e-13, atol=1e-15)
    # the block method: implicit centering subtracts mu sum(v), as rmatvec does
    mu = rng.normal(size=d)
    centered = TaskBlock(0, "t", n, 0, sp.csr_matrix(X), np.ones(n), mu=mu)
    v = rng.normal(size=n) * (rng.uniform(size=n) < 0.2)
    assert_array_equal(centered.rmatvec_sparse(v), centered.rmatvec(v))
    assert_allclose(centered.rmatvec_sparse(v), (X - mu).T @ v, rtol=1e-12, atol=1e-14)
    one = _block(sp.csr_matrix(np.array([[0.0, 2.5, 0.0]])), np.ones(1))
    out = np.empty(3)
    kernels.rmatvec_nonzero(one.rows, np.array([-2.0]), out)
    assert_array_equal(out, [0.0, -5.0, 0.0])
    empty = _block(np.zeros((0, 0)), np.zeros(0))
    kernels.rmatvec_nonzero(empty.rows, np.zeros(0), np.zeros(0))
    no_features = _block(np.zeros((2, 0)), np.ones(2))
    kernels.rmatvec_nonzero(no_features.rows, np.ones(2), np.zeros(0))
    rows = _block(sp.csr_matrix(np.array([[1.0, 0.0], [0.0, 2.0]])), np.ones(2)).rows
    with pytest.raises(ValueError, match="out has length 3"):
        kernels.rmatvec_nonzero(rows, np.ones(2), np.zeros(3))
    with pytest.raises(ValueError, match="indptr has 3 entries"):
        kernels.rmatvec_nonzero(rows, np.ones(3), np.zeros(2))      # a v longer than the rows
    bad_column = changed(rows, indices=np.array([0, 2], dtype=np.int32))
    with pytest.raises(ValueError, match="column index 2 outside 0..1"):
        kernels.rmatvec_nonzero(bad_column, np.array([0.0, 1.0]), np.zeros(2))
    out = np.zeros(2)
    kernels.rmatvec_nonzero(bad_column, np.array([1.0, 0.0]), out)  # the damaged row is never read
    assert_array_equal(out, [1.0, 0.0])
    with pytest.raises(ValueError, match="dense rows"):
        kernels.rmatvec_nonzero(changed(_block(np.ones((2, 2)), np.ones(2)).rows, data=np.ones(3)),
                                np.ones(2), np.zeros(2))
    with pytest.raises(TypeError):
        kernels.rmatvec_nonzero(None, np.ones(2), np.zeros(2))

# ---------------------------------------------------------------------------
# Issue 12: an active set that shrinking empties restarts (liblinear), never underflows
# ---------------------------------------------------------------------------
def with_guards(a, fill):
    """``a`` inside a buffer with 3 cells of ``fill`` each side (an out-of-range write shows up there)."""
    buf = np.full(a.size + 6, fill, dtype=a.dtype)
    buf[3:-3] = a
    return buf, buf[3:-3]


@pytest.mark.parametrize("loss", ["hinge", "smoothed-hinge"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_an_active_set_emptied_before_the_first_step_restarts_with_every_coordinate(kernels, loss, sparse, n):
    """Every coordinate at a bound, thresholds (-inf, +inf): each one shrinks on its first visit, so
    n_active reaches 0 before any step.  The old kernel went on to n_active = -1 and wrote order[-1]
    (an IndexError in the bounds-checked build, heap corruption in the optimized one)."""
    rng = np.random.default_rng(n)
    X = rng.normal(size=(n, 4))
    X[-1, 1:] = 0.0                                   # a CSR row with one entry
    y = np.array([1.0, -1.0, 1.0])[:n]
    alpha0 = y * (np.arange(n) % 2)                   # b = y alpha = 0, 1, 0: every one at a bound
    w = rng.normal(size=4)
    blk = _block(sp.csr_matrix(X) if sparse else X, y)
    abuf, alpha = with_guards(alpha0.copy(), -9e99)
    obuf, order = with_guards(np.arange(n, dtype=np.int32), -77)
    dbuf, db = with_guards(np.zeros(4), -9e99)
    state = kernels.new_shrink_state(n, True)
    state[2], state[3] = -np.inf, np.inf              # PG_max_old, PG_min_old: shrink at any gradient
    ref = LocalSDCAReference(n, True, state=state)
    steps = kernels.sdca_local(blk.rows, blk.y, alpha, w, db, blk.sq_norms, order, state, LOSSES[loss].kernel_id,
                               0.5, 4.0, float(n), 2.0, 99)
    ref_alpha, ref_db, ref_steps = ref.call(X, y, alpha0, w, 4.0, float(n), 2.0, 99, loss, 0.5)
    assert ref.restarts == 1                          # the reference went through the empty set once
    assert steps == ref_steps == 2 * n                # and every step was taken: round(2.0 x n)
    assert_array_equal(abuf[:3], -9e99)
    assert_array_equal(abuf[-3:], -9e99)
    assert_array_equal(obuf[:3], -77)                 # order[-1] untouched
    assert_array_equal(obuf[-3:], -77)
    assert_array_equal(dbuf[[0, 1, 2, -3, -2, -1]], -9e99)
    assert sorted(order) == list(range(n)) and list(order) == ref.order
    assert int(state[1]) == ref.n_active and 1 <= ref.n_active <= n
    assert_allclose(state[2:], ref.state()[1:], rtol=1e-12)
    assert_allclose(alpha, ref_alpha, rtol=1e-12, atol=1e-15)
    assert_allclose(db, ref_db, rtol=1e-9, atol=1e-14)
    assert_allclose(db, X.T @ (alpha - alpha0) / n, rtol=1e-9, atol=1e-14)
    assert np.all((0 <= y * alpha) & (y * alpha <= 1))


def changed(rows, **arrays):
    """The same rows with some arrays replaced (a malformed block for the kernels to refuse)."""
    fields = dict(data=rows.data, indices=rows.indices, indptr=rows.indptr, dense=rows.dense,
                  n_features=rows.n_features)
    fields.update(arrays)
    return Rows(**fields)


@pytest.mark.smoke
def test_rows_take_their_arrays_by_name_only():
    rows = TaskBlock(0, "t", 2, 0, sp.csr_matrix(np.array([[1.0, 0.0], [0.0, 2.0]])), np.ones(2)).rows
    with pytest.raises(TypeError):
        Rows(rows.data, rows.indices, rows.indptr, False, 2)                      # positional: refused
    with pytest.raises(ValueError, match="dtype mismatch"):
        Rows(data=rows.data, indices=rows.indptr, indptr=rows.indices, dense=False, n_features=2)   # swapped
    assert rows.nbytes == 2 * 8 + 2 * 4 + 3 * 8 and not rows.dense and rows.n_features == 2


def test_local_sdca_validates_what_would_index_out_of_range(kernels):
    X = np.array([[1.0, 0.0], [0.0, 2.0]])
    blk = _block(X, np.array([1.0, -1.0]))
    csr = _block(sp.csr_matrix(X), np.array([1.0, -1.0]))

    def call(rows=blk.rows, alpha=None, w=None, db=None, order=None, state=None, loss=0, c=1.0):
        return kernels.sdca_local(rows, blk.y, np.zeros(2) if alpha is None else alpha,
                                  np.zeros(2) if w is None else w, np.zeros(2) if db is None else db, blk.sq_norms,
                                  np.arange(2, dtype=np.int32) if order is None else order,
                                  kernels.new_shrink_state(2, True) if state is None else state, loss, 1.0, c, 2.0,
                                  1.0, 0)
    for kwargs, message in [(dict(order=np.array([0, 2], dtype=np.int32)), "order"),
                            (dict(order=np.array([-1, 0], dtype=np.int32)), "order"),
                            (dict(alpha=np.zeros(1)), "alpha"), (dict(w=np.zeros(3)), "w"),
                            (dict(db=np.zeros(1)), "delta_b"), (dict(state=np.zeros(4)), "shrink_state"),
                            (dict(loss=7), "loss"), (dict(c=0.0), "rho"),
                            (dict(rows=changed(blk.rows, data=X.ravel()[:3])), "dense rows"),
                            (dict(rows=changed(csr.rows, indices=np.array([0, 2], dtype=np.int32))), "column"),
                            (dict(rows=changed(csr.rows, indptr=np.array([0, 1, 5]))), "indptr"),
                            (dict(rows=changed(csr.rows, indptr=np.array([0, 2, 1]))), "indptr")]:
        with pytest.raises(ValueError, match=message):
            call(**kwargs)
    # a count or eps from a damaged checkpoint is not trusted: everything active, eps = 0.1
    for bad in (np.nan, -3.0, 0.0, 5.0, 1e300):
        state = np.array([1.0, bad, np.inf, -np.inf, np.nan])
        assert call(state=state) == 2 and 1 <= state[1] <= 2 and 0 < state[4] <= 0.1


def test_a_bad_column_index_is_refused_when_its_row_comes_up(kernels):
    """CSR column indices are checked row by row as the kernels read them (not in a scan of every index per
    call): a bad one met in the middle of a pass raises ValueError naming it, before u or w is read with
    it; the steps before it stay in alpha, delta_b and the shrinking state are not written."""
    rng = np.random.default_rng(4)
    X = sp.csr_matrix(rng.normal(size=(40, 3)))
    y = np.where(rng.normal(size=40) > 0, 1.0, -1.0)
    blk = _block(X, y)
    indices = np.array(X.indices)
    indices[X.indptr[39]] = 3                            # the last row's first column: out of 0..2
    bad = changed(blk.rows, indices=indices)
    order = np.arange(40, dtype=np.int32)
    alpha, db, state = np.zeros(40), np.full(3, 7.0), kernels.new_shrink_state(40, True)
    kept = state.copy()
    with pytest.raises(ValueError, match="column index 3 outside 0..2"):
        kernels.sdca_local(bad, blk.y, alpha, np.zeros(3), db, blk.sq_norms, order, state, 0, 1.0, 1.0, 40.0, 1.0,
                           11)
    assert np.count_nonzero(alpha) == list(order).index(39)          # the steps before row 39 came up
    assert np.all(db == 7.0) and np.array_equal(state, kept)
    with pytest.raises(ValueError, match="column index 3 outside 0..2"):
        kernels.objective_terms(bad, blk.y, alpha, np.zeros(3), 0, 1.0)
    good = kernels.objective_terms(blk.rows, blk.y, alpha, np.ones(3), 0, 1.0)
    assert np.isfinite(good).all()


@pytest.mark.parametrize("value", [3, 4, -1, 2**31 - 1, -2**31])
@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("single", [False, True])
def test_local_sdca_checks_each_column_index_inside_its_dot_product(kernels, value, where, single):
    """sdca_local checks a CSR row's columns in the loop of its dot product (checked_sparse_dot), not in a pass
    of their own: every index just past either end of 0..d-1 (and the int32 extremes; a negative one as well),
    at either end of the row, in either value dtype, is refused naming it, with the steps before its row kept;
    the last valid column (d - 1) at the same places is read as before."""
    rng = np.random.default_rng(5)
    X = sp.csr_matrix(rng.normal(size=(30, 3)) * (rng.uniform(size=(30, 3)) < 0.8))
    X[29, :] = [1.0, 2.0, 3.0]                                # the last row: all three columns stored
    X = sp.csr_matrix(X)
    y = np.where(rng.normal(size=30) > 0, 1.0, -1.0)
    blk = _block(X.astype(np.float32) if single else X, y)
    at = X.indptr[29] if where == "first" else X.indptr[30] - 1
    indices = np.array(X.indices)
    indices[at] = value
    bad = changed(blk.rows, indices=indices)
    order = np.arange(30, dtype=np.int32)
    alpha, db, state = np.zeros(30), np.full(3, 7.0), kernels.new_shrink_state(30, True)
    with pytest.raises(ValueError, match=f"column index {value} outside 0..2"):
        kernels.sdca_local(bad, blk.y, alpha, np.zeros(3), db, blk.sq_norms, order, state, 0, 1.0, 1.0, 30.0, 1.0, 3)
    assert np.count_nonzero(alpha) == list(order).index(29) and np.all(db == 7.0)
    # the edge inside: column d - 1 there is a valid row (its column repeated), read like any other
    indices[at] = 2
    edge = changed(blk.rows, indices=indices)
    runs = []
    for rows in (edge, blk.rows):
        alpha, db, state = np.zeros(30), np.zeros(3), kernels.new_shrink_state(30, True)
        steps = kernels.sdca_local(rows, blk.y, alpha, np.zeros(3), db, blk.sq_norms, np.arange(30, dtype=np.int32),
                                   state, 0, 1.0, 1.0, 30.0, 1.0, 3)
        runs.append((steps, alpha, db))
    assert runs[0][0] == runs[1][0] == 30 and np.isfinite(runs[0][2]).all()
    if where == "last":                                       # X[29, 2] moved onto column 2: nothing changed
        assert np.array_equal(runs[0][1], runs[1][1]) and np.array_equal(runs[0][2], runs[1][2])


def _one_step_reference(values, columns, w, y, sq, c, n_task):
    """One squared-loss step of sdca_local from alpha = 0 on a one-row block, in Python floats and in the
    kernel's order: x.u summed entry by entry from the left, u += c_u x entry by entry (a repeated column
    twice), delta_b = (u - w) / c."""
    ux = 0.0
    for v, k in zip(values, columns):
        ux += float(v) * w[k]
    q = c * sq * (1.0 / n_task)
    delta = (y - ux - 0.0) / (1.0 + q)
    c_u = c * delta * (1.0 / n_task)
    u = [float(x) for x in w]
    for v, k in zip(values, columns):
        u[k] += c_u * float(v)
    return delta, np.array([(u[k] - w[k]) * (1.0 / c) for k in range(len(w))])


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.parametrize("dense", [False, True])
def test_row_loops_keep_the_left_to_right_order_at_every_row_length(kernels, dense, single):
    """The row loops take four entries a turn (_rows.pxd, UNROLL): at every row length from 0 to 13 (no full
    turn, whole turns, every remainder), on terms of mixed magnitudes, with a
    repeated column in a CSR row, one local SDCA step gives the bits of the same step summed one entry at a
    time in Python (eight rows a length: every length from 3 on has rows whose sum changes if a turn's four
    terms are added in another order)."""
    rng = np.random.default_rng(17)
    dtype = np.float32 if single else np.float64
    for nnz, trial in ((nnz, trial) for nnz in range(14) for trial in range(8)):
        d = max(nnz, 1) if dense else 11
        values = (rng.normal(size=nnz) * 10.0 ** rng.uniform(-2, 2, size=nnz)).astype(dtype)
        if dense:
            columns = np.arange(nnz, dtype=np.int32)
            rows = Rows(data=values if nnz else np.zeros(d, dtype), indices=np.arange(d, dtype=np.int32),
                        indptr=np.zeros(1, np.int64), dense=True, n_features=d)
            if not nnz:
                values, columns = np.zeros(d, dtype), np.arange(d, dtype=np.int32)
        else:
            columns = rng.integers(0, d, size=nnz).astype(np.int32)
            if nnz >= 6:
                columns[5] = columns[1]                          # a column twice in the row
            rows = Rows(data=values, indices=columns, indptr=np.array([0, nnz], np.int64), dense=False,
                        n_features=d)
        w = rng.normal(size=d) * 10.0 ** rng.uniform(-2, 2, size=d)
        sq, y, c, n_task = 2.5, 0.75, 1.5, 3.0
        alpha, db = np.zeros(1), np.full(d, np.nan)
        steps = kernels.sdca_local(rows, np.array([y]), alpha, w, db, np.array([sq]), np.zeros(1, np.int32),
                                   kernels.new_shrink_state(1, False), LOSSES["squared"].kernel_id, 1.0, c,
                                   n_task, 1.0, 5)
        delta, ref_db = _one_step_reference(values, columns, w, y, sq, c, n_task)
        assert steps == 1
        assert alpha[0] == delta, (nnz, alpha[0], delta)
        assert_array_equal(db, ref_db)


@pytest.mark.parametrize("value", [13, -1, 2**31 - 1])
@pytest.mark.parametrize("at", range(13))
def test_a_bad_column_anywhere_in_a_long_row_is_refused(kernels, value, at):
    """A 13-entry row (three turns of four and one left over, UNROLL): an index outside 0..12 at any place is
    refused naming it, with the steps before its row kept and delta_b untouched; the same row with a valid
    index there is read."""
    rng = np.random.default_rng(6)
    X = sp.csr_matrix(rng.normal(size=(20, 13)) * (rng.uniform(size=(20, 13)) < 0.5))
    X[19, :] = rng.normal(size=13)                               # the last row: all 13 columns stored
    X = sp.csr_matrix(X)
    y = np.where(rng.normal(size=20) > 0, 1.0, -1.0)
    blk = _block(X, y)
    indices = np.array(X.indices)
    indices[X.indptr[19] + at] = value
    order = np.arange(20, dtype=np.int32)
    alpha, db, state = np.zeros(20), np.full(13, 7.0), kernels.new_shrink_state(20, True)
    with pytest.raises(ValueError, match=f"column index {value} outside 0..12"):
        kernels.sdca_local(changed(blk.rows, indices=indices), blk.y, alpha, np.zeros(13), db, blk.sq_norms,
                           order, state, 0, 1.0, 1.0, 20.0, 1.0, 3)
    assert np.count_nonzero(alpha) == list(order).index(19) and np.all(db == 7.0)
    indices[X.indptr[19] + at] = 12                              # the last valid column there: read
    alpha, db = np.zeros(20), np.zeros(13)
    assert kernels.sdca_local(changed(blk.rows, indices=indices), blk.y, alpha, np.zeros(13), db, blk.sq_norms,
                              np.arange(20, dtype=np.int32), kernels.new_shrink_state(20, True), 0, 1.0, 1.0,
                              20.0, 1.0, 3) == 20
    assert np.isfinite(db).all() and np.count_nonzero(alpha) == 20


def test_row_kernels_check_the_row_structure(kernels, online_kernels):
    csr = _block(sp.csr_matrix(np.array([[1.0, 0.0], [0.0, 2.0]])), np.ones(2))
    rows = csr.rows
    with pytest.raises(ValueError, match="indptr has 2 entries"):
        kernels.row_sq_norms(changed(rows, indptr=np.asarray(rows.indptr)[:2]), 2)
    with pytest.raises(ValueError, match="column index 2 outside 0..1"):
        kernels.objective_terms(changed(rows, indices=np.array([0, 2], dtype=np.int32)), np.ones(2), np.zeros(2),
                                np.zeros(2), 0, 1.0)
    with pytest.raises(ValueError, match="w has length 3"):
        kernels.objective_terms(rows, np.ones(2), np.zeros(2), np.zeros(3), 0, 1.0)
    with pytest.raises(ValueError, match="task_of_row"):
        kernels.ssdca_epoch(rows, np.ones(2), np.zeros(2), np.array([0, 1], np.int32),
                            np.ones(1), np.zeros((1, 2)), np.zeros((1, 2)), np.eye(1), np.ones(2),
                            np.zeros(2, np.int32), 0, 1.0, 1.0, 3, 0)
    # the block-length checks both SDCA kernels share (check_dual_rows): alpha and sq_norms against the rows
    with pytest.raises(ValueError, match="sq_norms has length 1, expected 2"):
        kernels.sdca_local(rows, np.ones(2), np.zeros(2), np.zeros(2), np.zeros(2), np.ones(1),
                           np.arange(2, dtype=np.int32), kernels.new_shrink_state(2, True), 0, 1.0, 1.0, 2.0, 1.0, 0)
    for alpha, sq, message in ((np.zeros(3), np.ones(2), "alpha has length 3"),
                               (np.zeros(2), np.ones(0), "sq_norms has length 0")):
        with pytest.raises(ValueError, match=message):
            kernels.ssdca_epoch(rows, np.ones(2), alpha, np.zeros(2, np.int32), np.ones(1), np.zeros((1, 2)),
                                np.zeros((1, 2)), np.eye(1), sq, np.zeros(2, np.int32), 0, 1.0, 1.0, 3, 0)
    with pytest.raises(ValueError, match="r >= 1"):
        online_kernels.tau_rounds(np.ones((1, 2)), np.ones((1, 2)), 2, 1, 0.0, 0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="W has shape"):
        online_kernels.online_block_apply(rows, 0, np.ones((2, 1)), np.ones((2, 1)), np.zeros((1, 1)))
    with pytest.raises(ValueError, match="3 rows need 4"):
        online_kernels.online_block_margins(rows, 1, np.zeros((2, 1)), np.empty((2, 1)))
    with pytest.raises(TypeError):
        kernels.row_sq_norms(None, 0)                    # no rows at all: refused, not dereferenced
    # empty blocks, d = 0 and k = 0 take no pointer into an empty array
    empty = _block(np.zeros((0, 0)), np.zeros(0))
    assert kernels.row_sq_norms(empty.rows, 0).shape == (0,)
    assert kernels.objective_terms(empty.rows, np.zeros(0), np.zeros(0), np.zeros(0), 0, 1.0) == (0.0, 0.0)
    no_features = _block(np.zeros((2, 0)), np.array([1.0, -1.0]))
    alpha, db = np.zeros(2), np.zeros(0)
    assert kernels.sdca_local(no_features.rows, no_features.y, alpha, np.zeros(0), db, no_features.sq_norms,
                              np.arange(2, dtype=np.int32), kernels.new_shrink_state(2, True), 0, 1.0, 1.0, 2.0,
                              1.0, 0) == 2
    assert_array_equal(alpha, [1.0, -1.0])            # a zero row: q = 0, the margin 1 sends b to 1
    assert online_kernels.tau_rounds(np.zeros((2, 0)), np.zeros((2, 0)), 2, 1, 0.0, 1, 1.0, 1.0, 1.0).shape == (2, 0)
    gloss = np.full(2, np.nan)
    online_kernels.online_rounds(no_features.rows, False, np.zeros((2, 0)), np.zeros((0, 0)), 2, 1, 0.0, 1, 1.0,
                                 1.0, 1.0, np.zeros((2, 0)), gloss)
    assert_array_equal(gloss, 0.0)


@pytest.mark.smoke
def test_ids_are_the_kernels_enums():
    """Loss, update and norm ids are defined once, in the compiled modules; Python uses those."""
    from hpcmtl import _online, _sdca, online_rules
    from hpcmtl.losses import LOSSES
    assert {n: l.kernel_id for n, l in LOSSES.items()} == {
        "hinge": _sdca.LossId.HINGE, "smoothed-hinge": _sdca.LossId.SMOOTHED_HINGE,
        "squared": _sdca.LossId.SQUARED, "logistic": _sdca.LossId.LOGISTIC}
    assert set(online_rules.UPDATES.values()) == set(_online.UpdateId)
    assert {online_rules.resolve_norm(n, 3.0, 1, 4)[0] for n in online_rules.NORMS} == set(_online.NormId)


def issue_12_tasks(path, seed=23):
    """16 tasks of 3 rows, 5 features, labels +-1 (issue 12).  With this seed, shrinking empties some
    block's active set before the first step of a round: the old kernel died with 'corrupted size vs.
    prev_size' (exit 134) serially and took every rank down at 3 ranks."""
    rng = np.random.default_rng(seed)
    Xs = [rng.normal(size=(3, 5)) for _ in range(16)]
    ys = [rng.choice([-1.0, 1.0], size=3) for _ in range(16)]
    write_tasks(str(path), Xs, ys)


@pytest.mark.parametrize("n_ranks", [pytest.param(None, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.mpi)],
                         ids=["serial", "3-ranks"])
def test_issue_12_reproduction_trains_to_a_finite_converged_model(tmp_path, n_ranks):
    train, out = tmp_path / "tasks.h5", tmp_path / "model.h5"
    issue_12_tasks(train)
    proc = run_hpcmtl(["train", "dmtrl", "--train", train, "--out", out, "--lam", "1e-2", "--outer", "2", "--quiet"],
                      n_ranks=n_ranks, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "corrupt" not in proc.stderr and "free()" not in proc.stderr
    result = read_result(str(out))
    model, history = result["model"], result["history"]
    assert wsteps_certified(result)
    assert model["W"].shape == (5, 16) and np.all(np.isfinite(model["W"])) and np.all(np.isfinite(model["Sigma"]))
    for key in ("primal", "dual", "rel_gap"):
        assert np.all(np.isfinite(history[key])), key
    assert 0 <= history["rel_gap"][-1] <= 1e-6


@pytest.mark.parametrize("aggregation", ["safe", "qp"])
@pytest.mark.parametrize("loss", ["hinge", "smoothed-hinge"])
def test_tiny_tasks_with_shrinking_through_several_omega_steps(kernel_build, loss, aggregation):
    """The whole DMTRL engine (serial) on the build under test: 16 tasks of 1-3 rows, shrinking on, four
    Omega-steps; on the bounds-checked build an out-of-range index anywhere in the run is an IndexError
    (session 3's shrinking underflow wrote order[-1] on exactly such tasks)."""
    from hpcmtl.estimators import DMTRL
    rng = np.random.default_rng(3)
    Xs, ys = [], []
    for i in range(16):
        n = 1 + i % 3
        Xs.append(rng.normal(size=(n, 5)))
        ys.append(np.where(rng.random(n) < 0.5, -1.0, 1.0))
    tol = 1e-4 if aggregation == "safe" else 1e-6        # the safe rho is slow to 1e-6 here (issue 13)
    model = DMTRL(loss=loss, lam=1e-2, tol=tol, outer=4, outer_tol=0.0, max_rounds=3000, shrinking=True,
                  aggregation=aggregation).fit(Xs, ys)
    assert wsteps_certified(model) and len(model.wsteps_["converged"]) == 4
    assert np.all(model.wsteps_["rel_gap"] <= tol) and np.all(np.isfinite(model.W_))


def test_tiny_csr_tasks_with_centered_intercepts_through_several_omega_steps(kernel_build):
    """The squared loss's intercept on CSR rows (implicit centering in sdca_local and objective_terms) through
    the whole engine on the build under test: 12 tasks of 1-3 rows (a task of one row centers to zero), rows
    without non-zeros, local rounds in the first W-step, then three more Omega-steps."""
    import scipy.sparse as sp
    from hpcmtl.cluster import Cluster
    from hpcmtl.dmtrl import DMTRLConfig, train
    from hpcmtl.estimators import MemoryTasks
    rng = np.random.default_rng(4)
    Xs, ys = [], []
    for i in range(12):
        n = 1 + i % 3
        X = rng.normal(size=(n, 6)) * (rng.random((n, 6)) < 0.5)
        if n == 3:
            X[1] = 0.0
        Xs.append(sp.csr_matrix(X))
        ys.append(rng.normal(size=n) + 2.0)
    config = DMTRLConfig(loss="squared", lam=1e-2, tol=1e-8, outer=4, outer_tol=0.0, max_rounds=3000,
                         local_solver="sdca")             # the kernel, not the exact small-d solver
    result = train(Cluster.serial(), MemoryTasks(Xs, ys), config)
    assert wsteps_certified(result) and len(result.wsteps["converged"]) == 4
    assert np.all(result.wsteps["rel_gap"] <= 1e-8) and np.all(np.isfinite(result.W))
    assert np.all(np.isfinite(result.intercept))


@pytest.mark.parametrize("loss,rows", [("squared", "csr"), ("logistic", "dense"), ("smoothed-hinge", "float32")])
def test_tiny_tasks_through_the_accelerated_outer_step(kernel_build, loss, rows):
    """gradient_terms (the accelerated outer step's kernel) through the whole engine on the build under test:
    14 tasks of 1-3 rows, rows without non-zeros, shrinking on, an --outer-tol no W-step reaches, so every one of
    four W-steps is followed by a phase; CSR rows with the squared loss's implicit centering, dense rows with the
    augmented intercept, float32 rows."""
    import scipy.sparse as sp
    from hpcmtl.cluster import Cluster
    from hpcmtl.dmtrl import DMTRLConfig, train
    from hpcmtl.estimators import MemoryTasks
    rng = np.random.default_rng(8)
    Xs, ys = [], []
    for i in range(14):
        n = 1 + i % 3
        X = rng.normal(size=(n, 6)) * (rng.random((n, 6)) < 0.6)
        if n == 3:
            X[1] = 0.0
        if rows == "float32":
            X = X.astype(np.float32).astype(np.float64)
        Xs.append(sp.csr_matrix(X) if rows == "csr" else X)
        ys.append(rng.normal(size=n) + 2.0 if loss == "squared" else np.where(rng.random(n) < 0.5, -1.0, 1.0))
    config = DMTRLConfig(loss=loss, lam=1e-2, tol=1e-7, outer=4, outer_tol=1e-12, max_rounds=3000, shrinking=True,
                         local_solver="sdca", float32=rows == "float32")
    result = train(Cluster.serial(), MemoryTasks(Xs, ys), config)
    steps = result.wsteps
    assert wsteps_certified(result) and len(steps["converged"]) == 4 and np.all(steps["apg_iterations"] > 0)
    for key in ("joint_primal", "joint_dual", "prox_primal"):
        assert np.all(np.isfinite(steps[key])), key
    assert steps["joint_dual"].max() <= steps["joint_primal"].min()
    assert np.all(steps["prox_primal"] <= steps["joint_primal"]) and np.all(np.isfinite(result.W))


def test_interior_point_rounds_on_the_build_under_test(kernel_build, monkeypatch):
    """hpcmtl.interior's kernel calls (its dot products, the blocks' objective sums) on the build under test: a
    coupled hinge W-step of 5 small raw tasks (one of a single row, an all-zero row in the others) under a fixed
    Sigma of rank 2, which the interior-point rounds certify."""
    from hpcmtl import interior
    from hpcmtl.cluster import Cluster
    from hpcmtl.dmtrl import DMTRLConfig, train
    from hpcmtl.estimators import MemoryTasks
    rng = np.random.default_rng(3)
    d, Xs, ys = 4, [], []
    for t in range(5):
        n = 1 if t == 0 else 12 + 3 * t
        X = rng.gamma(2.0, 1.0, size=(n, d)) * rng.uniform(0.1, 10, d)
        if n > 1:
            X[n // 2] = 0.0
        Xs.append(X)
        ys.append(np.where(rng.random(n) < 0.3, 1.0, -1.0) if n > 1 else np.ones(1))
    U = rng.normal(size=(5, 2))
    Sigma = U @ U.T + 1e-8 * np.eye(5)
    assert interior._blockops is kernel_build["_blockops"]
    calls, original = [], interior.dot
    monkeypatch.setattr(interior, "dot", lambda a, b: calls.append(1) or original(a, b))
    config = DMTRLConfig(relationship="fixed", loss="hinge", lam=1e-3, tol=1e-8, fit_intercept=False, max_rounds=400)
    result = train(Cluster.serial(), MemoryTasks(Xs, ys), config, sigma_fixed=Sigma / np.trace(Sigma))
    assert wsteps_certified(result) and np.all(np.isfinite(result.W)) and calls     # interior-point rounds were taken


@pytest.mark.parametrize("loss", ["hinge", "squared"])
def test_tiny_tasks_computed_on_their_support_columns_through_several_omega_steps(kernel_build, loss):
    """Blocks whose support is not all d features are computed on their own columns (issue 14): the kernels run on
    blocks of 0 (an all-zero task without intercept), 1 and a few columns, tasks of 1-3 rows, shrinking on, local
    rounds then four learned-Sigma W-steps, on the build under test; the same bits as every block on all d
    columns."""
    import scipy.sparse as sp
    from hpcmtl import dmtrl
    from hpcmtl.cluster import Cluster
    from hpcmtl.estimators import MemoryTasks
    rng = np.random.default_rng(6)
    d = 40
    Xs, ys = [], []
    for i in range(10):
        n = 1 + i % 3
        X = np.zeros((n, d))
        cols = rng.choice(d, size=1 + i % 4, replace=False)
        X[:, cols] = rng.normal(size=(n, cols.size)) * (rng.random((n, cols.size)) < 0.7)
        if i == 4:
            X[:] = 0.0                                        # no non-zero at all
        Xs.append(sp.csr_matrix(X))
        ys.append(np.where(rng.random(n) < 0.5, -1.0, 1.0) if loss == "hinge" else rng.normal(size=n))
    intercept = loss == "squared"                              # hinge: no augmented column, an empty support
    config = dmtrl.DMTRLConfig(loss=loss, lam=1e-2, tol=1e-7, outer=4, outer_tol=0.0, max_rounds=3000,
                               shrinking=True, fit_intercept=intercept, local_solver="sdca")
    local = dmtrl.LocalBlocks(Cluster.serial(), [MemoryTasks(Xs, ys).read_task(i) for i in range(len(Xs))], config)
    widths = [b.n_features for b in local.blocks]
    assert 0 in widths                                        # the all-zero task (its mean is zero too)
    assert max(widths) < d / 2 and [w.size for w in local.w] == widths
    server_on_supports = dmtrl.train(Cluster.serial(), MemoryTasks(Xs, ys), config)   # the server's too
    assert wsteps_certified(server_on_supports) and len(server_on_supports.wsteps["converged"]) == 4
    assert np.all(np.isfinite(server_on_supports.W))
    # the workers alone: the server's algebra dense in both runs (its support algebra adds in another order), and
    # the box momentum's direction sent whole (on supports the server rebuilds most of it from its dP)
    from hpcmtl.dmtrl import supports as dmtrl_supports
    original_pays, original_index = dmtrl_supports.support_algebra_pays, dmtrl_supports.exchange_index
    original_one_block = dmtrl.Server.one_block_a_task
    dmtrl_supports.support_algebra_pays = lambda supports, d: False
    dmtrl.Server.one_block_a_task = property(lambda self: False)
    try:
        result = dmtrl.train(Cluster.serial(), MemoryTasks(Xs, ys), config)
        dmtrl_supports.exchange_index = lambda block, d: None          # every block on all d columns
        whole = dmtrl.train(Cluster.serial(), MemoryTasks(Xs, ys), config)
    finally:
        dmtrl_supports.support_algebra_pays, dmtrl_supports.exchange_index = original_pays, original_index
        dmtrl.Server.one_block_a_task = original_one_block
    assert wsteps_certified(result) and len(result.wsteps["converged"]) == 4 and np.all(np.isfinite(result.W))
    assert result.W.tobytes() == whole.W.tobytes() and result.intercept.tobytes() == whole.intercept.tobytes()
    assert result.history["dual"].tobytes() == whole.history["dual"].tobytes()


def test_ordered_dot_adds_in_index_order_and_ignores_the_zeros_between(kernels):
    rng = np.random.default_rng(8)
    assert kernels.ordered_dot(np.zeros(0), np.zeros(0)) == 0.0
    assert kernels.ordered_dot(np.array([3.0]), np.array([-2.0])) == -6.0
    a, b = rng.normal(size=50), rng.normal(size=50)
    expected = 0.0
    for x, y in zip(a, b):
        expected += x * y
    assert kernels.ordered_dot(a, b) == expected
    full_a, full_b = np.zeros(500), rng.normal(size=500)
    ids = np.sort(rng.choice(500, size=50, replace=False))
    full_a[ids] = a
    assert kernels.ordered_dot(full_a, full_b) == kernels.ordered_dot(a, np.ascontiguousarray(full_b[ids]))
    with pytest.raises(ValueError, match="b"):
        kernels.ordered_dot(np.zeros(3), np.zeros(2))


# ---------------------------------------------------------------------------
# implicit centering (the squared loss's intercept on CSR rows): mu, x_mu and z_shift
# ---------------------------------------------------------------------------
def _centered_pair(rng, n, d, zero_row=True):
    """A CSR block read as x_j - mu (mu: its column means) and the same rows centered densely."""
    X = rng.normal(size=(n, d)) * (rng.random((n, d)) < 0.4)
    if zero_row and n > 1:
        X[1] = 0.0                                            # a row without non-zeros
    y = rng.normal(size=n) + 3.0
    mu = X.mean(axis=0) if n else np.zeros(d)
    implicit = TaskBlock(0, "t", max(n, 1), 0, sp.csr_matrix(X), y).centered(mu, 0.0)
    dense = TaskBlock(0, "t", max(n, 1), 0, X - mu, y)
    return implicit, dense, mu


@pytest.mark.parametrize("loss", ALL_LOSSES)
def test_sdca_local_with_implicit_centering_equals_dense_centered_rows(kernels, loss):
    rng = np.random.default_rng(7)
    for n, d in ((30, 5), (1, 3), (4, 1)):
        implicit, dense, mu = _centered_pair(rng, n, d)
        y = dense.y if loss == "squared" else np.where(dense.y > 3.0, 1.0, -1.0)
        assert implicit.sparse and implicit.mu is not None and implicit.X.nnz < n * d + 1
        assert_allclose(implicit.sq_norms, dense.sq_norms, rtol=1e-12, atol=1e-12)
        w = rng.normal(size=d)
        out = []
        for blk in (implicit, dense):
            alpha, db = np.zeros(n), np.zeros(d)
            steps = kernels.sdca_local(blk.rows, y, alpha, w, db, blk.sq_norms, np.arange(n, dtype=np.int32),
                                       kernels.new_shrink_state(n, False), LOSSES[loss].kernel_id, 0.7, 2.5, 40.0,
                                       3.0, 99, blk.mu, blk.x_mu)
            out.append((alpha, db, steps))
        assert out[0][2] == out[1][2] == 3 * n
        assert np.all(np.isfinite(out[0][1]))
        assert_allclose(out[0][0], out[1][0], rtol=1e-9, atol=1e-12)
        assert_allclose(out[0][1], out[1][1], rtol=1e-9, atol=1e-12)
        # delta b is exactly X~^T delta_alpha / n_i of the alpha it returns
        assert_allclose(out[0][1], implicit.rmatvec(out[0][0]) / 40.0, rtol=1e-9, atol=1e-12)
        ref_alpha, ref_db = sdca_local_reference(dense.X, y, np.zeros(n), w, 2.5, 40.0, 3 * n, 99, loss, 0.7)
        assert_allclose(out[0][0], ref_alpha, rtol=1e-9, atol=1e-12)
        # objective terms: the scores of the centered rows are x.w - mu.w
        a = out[0][0]
        got = kernels.objective_terms(implicit.rows, y, a, w, LOSSES[loss].kernel_id, 0.7, implicit.z_shift(w))
        want = kernels.objective_terms(dense.rows, y, a, w, LOSSES[loss].kernel_id, 0.7)
        assert np.all(np.isfinite(got))
        assert_allclose(got, want, rtol=1e-10)
        assert_allclose(implicit.decision(w), dense.X @ w, atol=1e-12)


def test_implicit_centering_edges(kernels):
    rng = np.random.default_rng(3)
    # an empty block: nothing to do, delta b zeroed
    empty = TaskBlock(0, "t", 1, 0, sp.csr_matrix((0, 3)), np.zeros(0)).centered(np.ones(3), 0.0)
    db = np.full(3, np.nan)
    assert kernels.sdca_local(empty.rows, empty.y, np.zeros(0), np.zeros(3), db, empty.sq_norms,
                              np.zeros(0, np.int32), kernels.new_shrink_state(0, False), 2, 1.0, 1.0, 1.0, 1.0, 0,
                              empty.mu, empty.x_mu) == 0
    assert_array_equal(db, 0.0)
    assert kernels.objective_terms(empty.rows, empty.y, np.zeros(0), np.zeros(3), 2, 1.0, 5.0) == (0.0, 0.0)
    # one row with no non-zeros: it is -mu, its squared norm ||mu||^2
    mu = np.array([0.5, -1.0])
    one = TaskBlock(0, "t", 1, 0, sp.csr_matrix((1, 2)), np.array([2.0])).centered(mu, 0.0)
    assert one.X.nnz == 0 and one.sq_norms[0] == pytest.approx(1.25) and one.x_mu[0] == 0.0
    alpha, db = np.zeros(1), np.zeros(2)
    kernels.sdca_local(one.rows, one.y, alpha, np.zeros(2), db, one.sq_norms, np.zeros(1, np.int32),
                       kernels.new_shrink_state(1, False), 2, 1.0, 1.0, 1.0, 1.0, 0, one.mu, one.x_mu)
    # squared loss, u = 0, q = ||mu||^2: delta = y / (1 + q); delta b = delta * (-mu)
    assert alpha[0] == pytest.approx(2.0 / 2.25)
    assert_allclose(db, -mu * alpha[0], rtol=1e-14)
    # mu without x_mu, or of the wrong lengths: refused before any work
    rows, y = one.rows, one.y
    args = (rows, y, np.zeros(1), np.zeros(2), np.zeros(2), one.sq_norms, np.zeros(1, np.int32),
            kernels.new_shrink_state(1, False), 2, 1.0, 1.0, 1.0, 1.0, 0)
    with pytest.raises(ValueError, match="come together"):
        kernels.sdca_local(*args, mu, None)
    with pytest.raises(ValueError, match="come together"):
        kernels.sdca_local(*args, None, np.zeros(1))
    with pytest.raises(ValueError, match="mu has length 3, expected 2"):
        kernels.sdca_local(*args, np.zeros(3), np.zeros(1))
    with pytest.raises(ValueError, match="x_mu has length 2, expected 1"):
        kernels.sdca_local(*args, mu, np.zeros(2))
    del rng


@pytest.mark.smoke
def test_augmented_rows_add_one_entry_a_row():
    X = sp.csr_matrix(np.array([[0.0, 2.0], [0.0, 0.0], [1.0, 0.0]]))
    blk = TaskBlock(0, "t", 3, 0, X, np.ones(3)).augmented(4.0)
    assert blk.X.shape == (3, 3) and blk.X.nnz == X.nnz + 3
    assert_array_equal(blk.X.toarray(), [[0, 2, 4], [0, 0, 4], [1, 0, 4]])
    dense = TaskBlock(0, "t", 3, 0, X.toarray(), np.ones(3)).augmented(4.0)
    assert_array_equal(dense.X, blk.X.toarray())
    assert_array_equal(blk.sq_norms, [20.0, 16.0, 17.0])


@pytest.mark.parametrize("sparse", [False, True])
def test_tiny_float32_tasks_with_shrinking_through_several_omega_steps(kernel_build, sparse):
    """float32 rows (--float32: the fused row loops) and, on CSR rows, the support exchange through the whole
    engine on the build under test: 16 hinge tasks of 1-3 rows, some rows without non-zeros, shrinking on,
    four Omega-steps; the model equals, bit for bit, the float64 run on the same (float32-rounded) values."""
    import scipy.sparse as sp
    from hpcmtl.cluster import Cluster
    from hpcmtl.dmtrl import DMTRLConfig, train
    from hpcmtl.estimators import MemoryTasks
    rng = np.random.default_rng(5)
    Xs, ys = [], []
    for i in range(16):
        n = 1 + i % 3
        X = (rng.normal(size=(n, 12)) * (rng.random((n, 12)) < 0.3)).astype(np.float32).astype(np.float64)
        if n == 3:
            X[2] = 0.0
        Xs.append(sp.csr_matrix(X) if sparse else X)
        ys.append(np.where(rng.random(n) < 0.5, -1.0, 1.0))
    runs = {}
    for single in (True, False):
        config = DMTRLConfig(loss="hinge", lam=1e-2, tol=1e-6, outer=4, outer_tol=0.0, max_rounds=3000,
                             shrinking=True, float32=single)
        runs[single] = train(Cluster.serial(), MemoryTasks(Xs, ys), config)
    r = runs[True]
    assert wsteps_certified(r) and len(r.wsteps["converged"]) == 4
    assert np.all(np.isfinite(r.wsteps["rel_gap"])) and np.all(r.wsteps["rel_gap"] <= 1e-6)
    assert np.all(np.isfinite(r.W)) and np.array_equal(r.W, runs[False].W)


# --- the aggregation steps' box QP (hpcmtl.dmtrl.box_qp over _box_qp.box_qp) -----------------------------
def _qp_value(A, g, x):
    return float(g @ x - 0.5 * x @ (A @ x))


def _kkt_violation(A, g, upper, x):
    grad = g - A @ x
    upper = np.broadcast_to(upper, x.shape)
    v = np.where(x <= 0, np.maximum(grad, 0), np.where(x >= upper, np.maximum(-grad, 0), np.abs(grad)))
    v = np.where(upper <= 0, 0.0, v)                    # a box of one point along that coordinate
    return float(np.max(v, initial=0.0)) / max(float(np.max(np.abs(np.diag(A)), initial=0.0)),
                                               float(np.max(np.abs(g), initial=0.0)), 1e-300)


def _box_qp_cases(rng, n_cases):
    """Random PSD quadratics: full rank, singular (rank m/2, the hinge's Schur products of few features),
    with per-coordinate bounds, some zero, and starts."""
    for trial in range(n_cases):
        m = int(rng.integers(1, 14))
        R = rng.normal(size=(m, max(1, m // 2) if trial % 3 else m + 1))
        A = R @ R.T * 10.0 ** rng.uniform(-3, 3) + (np.diag(rng.uniform(0, 1, m)) if trial % 4 == 1 else 0)
        g = rng.normal(size=m) * 10.0 ** rng.uniform(-2, 2)
        upper = rng.uniform(0.1, 2, m) * (rng.uniform(size=m) > 0.15) if trial % 2 else 1.0
        start = rng.uniform(0, 1, m) if trial % 5 == 2 else None
        yield A, g, upper, start


def test_box_qp_kernel_reaches_the_maximum_of_the_numpy_reference(kernels):
    from hpcmtl.dmtrl import box_qp
    from reference import box_qp_reference
    rng = np.random.default_rng(21)
    for A, g, upper, start in _box_qp_cases(rng, 200):
        x = box_qp(A, g, upper, start=start)
        ref = box_qp_reference(A, g, upper, start=start)
        up = np.broadcast_to(upper, x.shape)
        assert np.all(np.isfinite(x)) and np.all(x >= 0) and np.all(x <= up)
        value, ref_value = _qp_value(A, g, x), _qp_value(A, g, ref)
        assert np.isfinite(value) and value >= 0.0
        assert value >= ref_value - 1e-9 * max(abs(ref_value), 1e-12)
        assert _kkt_violation(A, g, upper, x) <= 1e-7
        for _ in range(20):                     # no random feasible point is better
            z = rng.uniform(0, 1, x.size) * up
            assert _qp_value(A, g, z) <= value + 1e-9 * max(abs(value), 1e-12)


def test_box_qp_kernel_edges(kernels):
    """m = 1, every coordinate at a bound, a zero and a singular A, zero bounds, the ray of a linear objective."""
    from hpcmtl.dmtrl import box_qp
    assert_array_equal(box_qp(np.array([[2.0]]), np.array([1.0]), 1.0), [0.5])
    assert_array_equal(box_qp(np.array([[2.0]]), np.array([5.0]), 1.0), [1.0])          # at the upper bound
    assert_array_equal(box_qp(np.array([[2.0]]), np.array([-1.0]), 1.0), [0.0])         # at 0
    assert_array_equal(box_qp(np.array([[0.0]]), np.array([1.0]), 3.0), [3.0])          # linear: to the bound
    assert_array_equal(box_qp(np.zeros((3, 3)), np.array([1.0, -1.0, 0.0]), 2.0), [2.0, 0.0, 0.0])
    A = np.eye(4)
    assert_array_equal(box_qp(A, np.array([5.0, -5.0, 5.0, -5.0]), 1.0), [1.0, 0.0, 1.0, 0.0])   # all at bounds
    assert_array_equal(box_qp(A, np.ones(4), np.zeros(4)), np.zeros(4))                 # a box of one point
    assert box_qp(np.zeros((0, 0)), np.zeros(0), 1.0).shape == (0,)
    v = np.array([1.0, 1.0, 0.0])
    x = box_qp(np.outer(v, v), np.array([1.0, -1.0, 0.5]), 1.0)     # singular: linear along (1, -1, 0) and e3
    assert_allclose(x, [1.0, 0.0, 1.0])
    x = box_qp(np.outer(v, v), np.array([1.0, 1.0, 0.0]), 1.0)      # singular, gradient in the range
    assert_allclose(x[0] + x[1], 1.0) and np.all(x >= 0)
    assert _kkt_violation(np.outer(v, v), np.array([1.0, 1.0, 0.0]), 1.0, x) <= 1e-12
    x = box_qp(A, np.ones(4), 1.0, start=np.array([np.nan, 0, 0, 0]))                   # a start that is not finite
    assert_allclose(x, np.ones(4))
    with pytest.raises(ValueError):
        kernels.box_qp(np.eye(2), np.ones(3), np.ones(3), np.ones(3), False, np.zeros(3), 10, 1e-12)


# ---------------------------------------------------------------------------
# the accelerated outer step's per-block terms (hpcmtl.dmtrl.joint.block_gradient_terms)
# ---------------------------------------------------------------------------
SMOOTH_LOSSES = [name for name, loss in LOSSES.items() if loss.smooth]


def _gradient_blocks(rng, n, d):
    """The same rows as dense float64, CSR, float32 (values rounded to float32 first) and implicitly centered
    CSR, with that block's dense reference rows (what its scores read)."""
    X = rng.normal(size=(n, d)) * (rng.random((n, d)) < 0.5)
    if n > 1:
        X[0] = 0.0                                          # a row without non-zeros
    X32 = X.astype(np.float32).astype(np.float64)
    y = rng.normal(size=n)
    mu = X.mean(axis=0) if n else np.zeros(d)
    return [("dense", TaskBlock(0, "t", max(n, 1), 0, X, y), X),
            ("csr", TaskBlock(0, "t", max(n, 1), 0, sp.csr_matrix(X), y), X),
            ("float32", TaskBlock(0, "t", max(n, 1), 0, X32.astype(np.float32), y), X32),
            ("centered", TaskBlock(0, "t", max(n, 1), 0, sp.csr_matrix(X), y).centered(mu, 0.0), X - mu)]


@pytest.mark.parametrize("loss", SMOOTH_LOSSES)
def test_gradient_terms_match_the_numpy_reference(kernels, loss):
    """Every row (the first and the last included), every column, an empty block and one feature: the loss sums
    at both points, X^T l', the conjugate at every dual scale and max y alpha equal the reference."""
    from hpcmtl.dmtrl.joint import DUAL_SCALES, block_gradient_terms
    from hpcmtl.losses import loss_and_derivative
    rng = np.random.default_rng(11)
    gamma = 0.7
    for n, d in ((25, 6), (1, 3), (3, 1), (0, 4)):
        for kind, blk, Xref in _gradient_blocks(rng, n, d):
            if loss != "squared":
                blk.y = np.where(blk.y >= 0, 1.0, -1.0)
            w_prox, w_ext = rng.normal(size=d), rng.normal(size=d)
            grad, scalars = block_gradient_terms(blk, w_prox, w_ext, LOSSES[loss], gamma)
            assert np.all(np.isfinite(grad)) and np.all(np.isfinite(scalars)), kind
            lp, _ = loss_and_derivative(loss, Xref @ w_prox, blk.y, gamma)
            le, slope = loss_and_derivative(loss, Xref @ w_ext, blk.y, gamma)
            alpha = -slope
            want = np.concatenate([[lp.sum(), le.sum()],
                                   [np.sum(conjugate_reference(loss, s * alpha, blk.y, gamma)) for s in DUAL_SCALES],
                                   [np.max(blk.y * alpha) if n else 0.0]])
            assert scalars.shape == want.shape, kind
            assert_allclose(scalars, want, rtol=1e-10, atol=1e-12, err_msg=f"{kind} n={n} d={d}")
            assert_allclose(grad, Xref.T @ slope, rtol=1e-10, atol=1e-12, err_msg=f"{kind} n={n} d={d}")


def test_gradient_terms_of_many_blocks_are_the_per_block_bits(kernels):
    """gradient_terms_blocks (GRADIENT_TERMS' one call for many blocks): every block's gradient and scalars are
    those of gradient_terms on it alone, bit for bit -- dense, CSR, float32 and centered rows (with their shifts),
    0 to 25 rows, every loss; a block of other width or label starts that do not fit are refused."""
    from hpcmtl.dmtrl.joint import DUAL_SCALES
    rng = np.random.default_rng(12)
    d, gamma = 5, 0.7
    for loss in LOSSES:
        blocks = [blk for n in (25, 1, 0, 3) for _, blk, _ in _gradient_blocks(rng, n, d)]
        for blk in blocks:
            if loss != "squared":
                blk.y = np.where(blk.y >= 0, 1.0, -1.0)
        nb, S = len(blocks), DUAL_SCALES.size
        w_prox, w_ext = rng.normal(size=(nb, d)), rng.normal(size=(nb, d))
        shift_prox, shift_ext = rng.normal(size=nb), rng.normal(size=nb)
        grad, scalars = rng.normal(size=(nb, d)), np.full((nb, S + 4), np.nan)
        want_grad, want_scalars = grad.copy(), np.zeros((nb, S + 4))
        for k, blk in enumerate(blocks):
            kernels.gradient_terms(blk.rows, blk.y, w_prox[k], w_ext[k], LOSSES[loss].kernel_id, gamma, shift_prox[k],
                                   shift_ext[k], DUAL_SCALES, want_grad[k], want_scalars[k])
        y_start = np.concatenate([[0], np.cumsum([b.y.size for b in blocks])]).astype(np.int64)
        kernels.gradient_terms_blocks([b.rows for b in blocks], np.concatenate([b.y for b in blocks]), y_start,
                                      w_prox, w_ext, LOSSES[loss].kernel_id, gamma, shift_prox, shift_ext, DUAL_SCALES,
                                      grad, scalars)
        assert np.array_equal(grad, want_grad), loss
        assert np.array_equal(scalars, want_scalars), loss
    blocks = [TaskBlock(0, "t", 4, 0, np.ones((4, 3)), np.ones(4)),
              TaskBlock(0, "t", 2, 0, np.ones((2, 4)), np.ones(2))]
    args = (LOSSES["squared"].kernel_id, 1.0, np.zeros(2), np.zeros(2), np.ones(2), np.zeros((2, 3)), np.zeros((2, 6)))
    rows, y = [b.rows for b in blocks], np.ones(6)
    with pytest.raises(ValueError, match="block features"):
        kernels.gradient_terms_blocks(rows, y, np.array([0, 4, 6]), np.zeros((2, 3)), np.zeros((2, 3)), *args)
    for y_start, message in (([0, 4], "y_start"), ([0, 4, 5], "y_start spans"), ([0, 7, 6], "decreases")):
        with pytest.raises(ValueError, match=message):
            kernels.gradient_terms_blocks(rows, y, np.array(y_start), np.zeros((2, 3)), np.zeros((2, 3)), *args)


def test_dual_terms_of_many_blocks_are_each_blocks_own_call_and_refuse_what_does_not_fit(kernels):
    """dual_terms_blocks (the hinge dual phase's DUAL_TERMS): a block's state (beta, ext, trial), its v and out are
    the same bits in a batch as in a call of its own -- dense, CSR, float32 and centered rows, 0 to 25 rows,
    accept on and off; label starts, state lengths and a block of another width that do not fit are refused."""
    rng = np.random.default_rng(13)
    d = 5
    blocks = [blk for n in (25, 1, 0, 3) for _, blk, _ in _gradient_blocks(rng, n, d)]
    for blk in blocks:
        blk.y = np.where(blk.y >= 0, 1.0, -1.0)
    nb = len(blocks)
    sizes = [b.y.size for b in blocks]
    y_start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    total = int(y_start[-1])
    w, shift = rng.normal(size=(nb, d)), rng.normal(size=nb)
    control = np.column_stack([rng.uniform(0.1, 2.0, nb), rng.uniform(0.0, 0.9, nb), np.arange(nb) % 2])
    state = [rng.uniform(0.0, 1.0, total) for _ in range(3)]
    v, out = rng.normal(size=(nb, d)), np.full((nb, 5), np.nan)
    batch = [a.copy() for a in state] + [v.copy(), out.copy()]
    kernels.dual_terms_blocks([b.rows for b in blocks], np.concatenate([b.y for b in blocks]), y_start, w, shift,
                              control, *batch)
    for k, blk in enumerate(blocks):
        a, b = y_start[k], y_start[k + 1]
        own = [x[a:b].copy() for x in state] + [v[k:k + 1].copy(), out[k:k + 1].copy()]
        kernels.dual_terms_blocks([blk.rows], blk.y, np.array([0, b - a]), w[k:k + 1], shift[k:k + 1],
                                  control[k:k + 1], *own)
        for got, want in zip([x[a:b] for x in batch[:3]] + [batch[3][k:k + 1], batch[4][k:k + 1]], own):
            assert np.array_equal(got, want), (k, sizes[k])
    assert np.all(np.isfinite(batch[4])) and np.all((batch[2] >= 0) & (batch[2] <= 1))
    blocks = [TaskBlock(0, "t", 4, 0, np.ones((4, 3)), np.ones(4)),
              TaskBlock(0, "t", 2, 0, np.ones((2, 4)), np.ones(2))]
    rows, y = [b.rows for b in blocks], np.ones(6)

    def call(y_start=(0, 4, 6), width=3, length=6):
        kernels.dual_terms_blocks(rows, y, np.array(y_start, dtype=np.int64), np.zeros((2, width)), np.zeros(2),
                                  np.zeros((2, 3)), np.zeros(length), np.zeros(6), np.zeros(6),
                                  np.zeros((2, width)), np.zeros((2, 5)))
    with pytest.raises(ValueError, match="block features"):
        call()
    for y_start, message in (((0, 4), "y_start"), ((0, 4, 5), "y_start spans"), ((0, 7, 6), "decreases")):
        with pytest.raises(ValueError, match=message):
            call(y_start, width=4)
    with pytest.raises(ValueError, match="beta"):
        call(width=4, length=5)


def test_gradient_terms_refuse_mismatched_lengths(kernels):
    blk = TaskBlock(0, "t", 4, 0, np.ones((4, 3)), np.ones(4))
    scales = np.ones(2)
    good = dict(w_prox=np.zeros(3), w_ext=np.zeros(3), grad=np.zeros(3), scalars=np.zeros(6))
    for name, bad in (("w_prox", np.zeros(2)), ("w_ext", np.zeros(4)), ("grad", np.zeros(2)), ("scalars", np.zeros(5))):
        args = dict(good, **{name: bad})
        with pytest.raises(ValueError, match=name):
            kernels.gradient_terms(blk.rows, blk.y, args["w_prox"], args["w_ext"], LOSSES["squared"].kernel_id, 1.0,
                                   0.0, 0.0, scales, args["grad"], args["scalars"])
