"""float32 features (issue 14): kernels, blocks, files, training, rank counts.

The kernels widen each float32 value to double as they load it and do every
product and sum in double, so on float32 rows they must give exactly the bits
they give on the same values stored as float64: most comparisons here are
bitwise (``assert_array_equal``), both on the optimized and on the bounds-checked
build (the ``kernels`` fixture).
"""
import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose, assert_array_equal

from hpcmtl.losses import LOSSES
from hpcmtl.taskdata import TaskBlock

from reference import sdca_local_reference

ALL_LOSSES = list(LOSSES)


def f32_values(rng, n, d, density=0.5, scale=1.0):
    """Random values exactly representable in float32 (as float64), with explicit zeros."""
    X = rng.normal(size=(n, d)) * scale * (rng.uniform(size=(n, d)) < density)
    return X.astype(np.float32).astype(np.float64)


def pair(X, y, sparse, n_task=None):
    """The same rows as a float64 and a float32 block."""
    n_task = n_task or max(1, X.shape[0])
    M = sp.csr_matrix(X) if sparse else X
    b64 = TaskBlock(0, "t", n_task, 0, M, y)
    b32 = TaskBlock(0, "t", n_task, 0, M.astype(np.float32), y)
    assert not b64.float32 and b32.float32 and b32.rows.dtype == "float32"
    assert b32.X.dtype == np.float32 and b32.y.dtype == np.float64
    return b64, b32


def labels(loss, rng, n):
    return rng.normal(size=n) if loss == "squared" else rng.choice([-1.0, 1.0], size=n)


def feasible(loss, y, rng):
    return np.array([rng.normal() if loss == "squared" else yi * rng.uniform(0, 1) for yi in y])


# ---------------------------------------------------------------------------
# kernels: float32 rows give the float64 kernel's bits on the same values
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("loss", ALL_LOSSES)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_sdca_local_float32_rows_give_the_float64_bits(kernels, loss, sparse):
    rng = np.random.default_rng(2)
    n, d = 37, 9
    X = f32_values(rng, n, d)
    y = labels(loss, rng, n)
    alpha0 = feasible(loss, y, rng)
    w = rng.normal(size=d)
    out = []
    for blk in pair(X, y, sparse, n_task=50):
        alpha, db = alpha0.copy(), np.empty(d)
        steps = kernels.sdca_local(blk.rows, blk.y, alpha, w, db, blk.sq_norms, np.arange(n, dtype=np.int32),
                                   kernels.new_shrink_state(n, False), LOSSES[loss].kernel_id, 0.7, 2.5, 50.0,
                                   80 / n, 12345)
        out.append((steps, alpha, db, blk.sq_norms))
    assert out[0][0] == out[1][0] == 80
    for a, b in zip(out[0][1:], out[1][1:]):
        assert np.all(np.isfinite(a))
        assert_array_equal(a, b)
    ref_alpha, _ = sdca_local_reference(X, y, alpha0, w, 2.5, 50.0, 80, 12345, loss, 0.7)
    assert_allclose(out[1][1], ref_alpha, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("loss", ["hinge", "smoothed-hinge"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_shrinking_rounds_float32_equal_float64(kernels, loss, sparse):
    rng = np.random.default_rng(12)
    n, d = 60, 5
    X = f32_values(rng, n, d, density=0.7)
    y = np.where(X @ rng.normal(size=d) > 0, 1.0, -1.0)
    states = []
    for blk in pair(X, y, sparse):
        alpha, b = np.zeros(n), np.zeros(d)
        order, state = np.arange(n, dtype=np.int32), kernels.new_shrink_state(n, True)
        for r in range(30):
            db = np.empty(d)
            kernels.sdca_local(blk.rows, blk.y, alpha, b * 20.0, db, blk.sq_norms, order, state,
                               LOSSES[loss].kernel_id, 0.5, 20.0, float(n), 1.3, 1000 + r)
            b += db
        states.append((alpha, b, order, state))
    for a, c in zip(states[0], states[1]):
        assert_array_equal(a, c)


@pytest.mark.parametrize("loss", ALL_LOSSES)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_objective_terms_and_norms_float32(kernels, loss, sparse):
    rng = np.random.default_rng(4)
    X = f32_values(rng, 40, 7)
    y = labels(loss, rng, 40)
    alpha = feasible(loss, y, rng)
    w = rng.normal(size=7) * 3
    b64, b32 = pair(X, y, sparse)
    got = kernels.objective_terms(b32.rows, b32.y, alpha, w, LOSSES[loss].kernel_id, 0.4, 0.25)
    want = kernels.objective_terms(b64.rows, b64.y, alpha, w, LOSSES[loss].kernel_id, 0.4, 0.25)
    assert np.all(np.isfinite(got)) and got == want
    assert_array_equal(kernels.row_sq_norms(b32.rows, 40), kernels.row_sq_norms(b64.rows, 40))
    assert_allclose(kernels.row_sq_norms(b32.rows, 40), (X ** 2).sum(axis=1), rtol=1e-14)


def test_float32_products_are_in_double(kernels):
    """Values whose float32 products or sums would round: the kernels' double arithmetic keeps them."""
    x = np.float32(1 + 2 ** -20)
    X = np.array([[x, x, -1.0]], dtype=np.float32)
    b32 = TaskBlock(0, "t", 1, 0, X, np.array([1.0]))
    sq = kernels.row_sq_norms(b32.rows, 1)[0]
    assert sq == 2 * float(x) ** 2 + 1.0 and sq != float(np.float32(x * x) * 2 + 1)
    w = np.array([1e8, 1e8, 1.0])
    z = float(x) * 2e8 - 1.0
    lsum, _ = kernels.objective_terms(b32.rows, b32.y, np.zeros(1), w, 2, 1.0)   # squared: (z - y)^2 / 2
    assert lsum == 0.5 * (z - 1.0) ** 2


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_ssdca_epoch_float32_equals_float64(kernels, sparse):
    rng = np.random.default_rng(6)
    n, d, m = 30, 6, 3
    X = f32_values(rng, n, d)
    y = rng.choice([-1.0, 1.0], size=n)
    task_of_row = (np.arange(n) % m).astype(np.int32)
    Sigma = np.eye(m) * 0.5 + 0.1
    out = []
    for blk in pair(X, y, sparse):
        alpha, WT, BT = np.zeros(n), np.zeros((m, d)), np.zeros((m, d))
        steps = kernels.ssdca_epoch(blk.rows, blk.y, alpha, task_of_row, np.full(m, n / m), WT, BT, Sigma,
                                    blk.sq_norms, np.arange(n, dtype=np.int32), 0, 1.0, 0.1, 3 * n, 5)
        out.append((steps, alpha, WT, BT))
    assert out[0][0] == out[1][0] == 3 * n and np.any(out[0][1] != 0)
    for a, b in zip(out[0][1:], out[1][1:]):
        assert_array_equal(a, b)


@pytest.mark.parametrize("loss", ["hinge", "smoothed-hinge"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_an_emptied_active_set_restarts_on_float32_rows(kernels, loss, sparse, n):
    """test_kernels' issue-12 edge (every coordinate shrinks before the first step) on float32 rows,
    with guard cells around every output: nothing outside is written, the float64 bits come out."""
    rng = np.random.default_rng(n)
    X = f32_values(rng, n, 4, density=1.0)
    X[-1, 1:] = 0.0
    y = np.array([1.0, -1.0, 1.0])[:n]
    alpha0 = y * (np.arange(n) % 2)
    w = rng.normal(size=4)
    results = []
    for blk in pair(X, y, sparse):
        abuf = np.full(n + 6, -9e99)
        abuf[3:-3] = alpha0
        obuf = np.full(n + 6, -77, dtype=np.int32)
        obuf[3:-3] = np.arange(n)
        dbuf = np.full(4 + 6, -9e99)
        dbuf[3:-3] = 0.0
        state = kernels.new_shrink_state(n, True)
        state[2], state[3] = -np.inf, np.inf
        steps = kernels.sdca_local(blk.rows, blk.y, abuf[3:-3], w, dbuf[3:-3], blk.sq_norms, obuf[3:-3], state,
                                   LOSSES[loss].kernel_id, 0.5, 4.0, float(n), 2.0, 99)
        for buf, fill in ((abuf, -9e99), (obuf, -77), (dbuf, -9e99)):
            assert_array_equal(buf[[0, 1, 2, -3, -2, -1]], fill)
        results.append((steps, abuf, obuf, dbuf, state))
    assert results[0][0] == results[1][0] == 2 * n
    for a, b in zip(results[0][1:], results[1][1:]):
        assert_array_equal(a, b)


@pytest.mark.parametrize("loss", ALL_LOSSES)
def test_implicit_centering_on_float32_csr_rows(kernels, loss):
    rng = np.random.default_rng(7)
    for n, d in ((30, 5), (1, 3), (4, 1)):
        X = f32_values(rng, n, d, density=0.4)
        if n > 1:
            X[1] = 0.0
        y = rng.normal(size=n) + 3.0
        y = y if loss == "squared" else np.where(y > 3.0, 1.0, -1.0)
        mu = X.mean(axis=0)
        b64, b32 = (b.centered(mu, 0.0) for b in pair(X, y, True))
        assert b32.float32 and b32.mu.dtype == np.float64
        assert_array_equal(b32.sq_norms, b64.sq_norms)
        assert_array_equal(b32.x_mu, b64.x_mu)
        w = rng.normal(size=d)
        out = []
        for blk in (b64, b32):
            alpha, db = np.zeros(n), np.zeros(d)
            kernels.sdca_local(blk.rows, blk.y, alpha, w, db, blk.sq_norms, np.arange(n, dtype=np.int32),
                               kernels.new_shrink_state(n, False), LOSSES[loss].kernel_id, 0.7, 2.5, 40.0, 3.0, 99,
                               blk.mu, blk.x_mu)
            terms = kernels.objective_terms(blk.rows, blk.y, alpha, w, LOSSES[loss].kernel_id, 0.7, blk.z_shift(w))
            out.append((alpha, db, np.array(terms)))
        for a, b in zip(*out):
            assert np.all(np.isfinite(a))
            assert_array_equal(a, b)


def _changed(rows, **arrays):
    from hpcmtl._rows import Rows
    fields = dict(data=rows.data, indices=rows.indices, indptr=rows.indptr, dense=rows.dense,
                  n_features=rows.n_features)
    fields.update(arrays)
    return Rows(**fields)


def test_float32_rows_are_checked_like_float64_rows(kernels, online_kernels):
    from hpcmtl._rows import Rows
    X = np.array([[1.0, 0.0], [0.0, 2.0]])
    dense = TaskBlock(0, "t", 2, 0, X.astype(np.float32), np.array([1.0, -1.0]))
    csr = TaskBlock(0, "t", 2, 0, sp.csr_matrix(X, dtype=np.float32), np.array([1.0, -1.0]))
    assert dense.rows.nbytes == 4 * 4 + 2 * 4 + 8 and csr.rows.nbytes == 2 * 4 + 2 * 4 + 3 * 8
    assert "float32" in repr(csr.rows) and csr.rows.single and not csr.rows.dense

    def call(rows):
        return kernels.sdca_local(rows, dense.y, np.zeros(2), np.zeros(2), np.zeros(2), dense.sq_norms,
                                  np.arange(2, dtype=np.int32), kernels.new_shrink_state(2, True), 0, 1.0, 1.0, 2.0,
                                  1.0, 0)
    assert call(dense.rows) == 2 and call(csr.rows) == 2
    for rows, message in [(_changed(dense.rows, data=X.ravel()[:3].astype(np.float32)), "dense rows"),
                          (_changed(csr.rows, indices=np.array([0, 2], dtype=np.int32)), "column"),
                          (_changed(csr.rows, indptr=np.array([0, 1, 5])), "indptr"),
                          (_changed(csr.rows, indptr=np.array([0, 2, 1])), "indptr")]:
        with pytest.raises(ValueError, match=message):
            call(rows)
        with pytest.raises(ValueError, match=message):
            kernels.row_sq_norms(rows, 2)
    for bad in (np.zeros(4, dtype=np.float16), np.zeros(4, dtype=np.int32), np.zeros((2, 2))):
        with pytest.raises(ValueError, match="float64 or float32"):
            Rows(data=bad, indices=np.arange(2, dtype=np.int32), indptr=np.zeros(1, np.int64), dense=True,
                 n_features=2)
    # the online kernels read float64 values only: float32 rows are refused, never misread
    with pytest.raises(ValueError, match="float64 values, not float32"):
        online_kernels.online_block_margins(csr.rows, 0, np.zeros((2, 1)), np.empty((2, 1)))
    # empty float32 blocks and d = 0 take no pointer into an empty array
    empty = TaskBlock(0, "t", 1, 0, np.zeros((0, 0), dtype=np.float32), np.zeros(0))
    assert empty.float32 and kernels.row_sq_norms(empty.rows, 0).shape == (0,)
    assert kernels.objective_terms(empty.rows, np.zeros(0), np.zeros(0), np.zeros(0), 0, 1.0) == (0.0, 0.0)
    none = TaskBlock(0, "t", 2, 0, np.zeros((2, 0), dtype=np.float32), np.array([1.0, -1.0]))
    alpha = np.zeros(2)
    assert kernels.sdca_local(none.rows, none.y, alpha, np.zeros(0), np.zeros(0), none.sq_norms,
                              np.arange(2, dtype=np.int32), kernels.new_shrink_state(2, True), 0, 1.0, 1.0, 2.0,
                              1.0, 0) == 2
    assert_array_equal(alpha, [1.0, -1.0])


# ---------------------------------------------------------------------------
# TaskBlock: X stays float32, what is computed from it is float64
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_task_block_keeps_float32_and_returns_float64(sparse, monkeypatch):
    from hpcmtl import taskdata
    monkeypatch.setattr(taskdata, "FLOAT32_CHUNK_VALUES", 7)          # several chunks, a ragged last one
    rng = np.random.default_rng(9)
    X = f32_values(rng, 23, 4)
    y = rng.normal(size=23)
    b64, b32 = pair(X, y, sparse)
    w, v = rng.normal(size=4), rng.normal(size=23)
    for name, got, want in [("decision", b32.decision(w), X @ w), ("rmatvec", b32.rmatvec(v), X.T @ v),
                            ("gram", b32.gram(), X.T @ X), ("sq_norms", b32.sq_norms, (X ** 2).sum(axis=1))]:
        assert got.dtype == np.float64, name
        assert_allclose(got, want, rtol=1e-13, atol=1e-13, err_msg=name)
    assert b32.X.dtype == np.float32 and b32.augmented(2.0).X.dtype == np.float32
    assert_array_equal(np.asarray(b32.augmented(2.0).X.todense() if sparse else b32.augmented(2.0).X),
                       np.asarray(b64.augmented(2.0).X.todense() if sparse else b64.augmented(2.0).X))
    # centering: means in float64; CSR rows read as x - mu (unchanged), dense rows x - mu rounded once
    mu = X.mean(axis=0)
    c32 = b32.centered(mu, 0.5)
    assert c32.X.dtype == np.float32 and c32.center[0].dtype == np.float64
    if sparse:
        assert c32.mu is not None
        assert_allclose(c32.decision(w), (X - mu) @ w, rtol=1e-12, atol=1e-12)
        assert_allclose(c32.gram(), (X - mu).T @ (X - mu), rtol=1e-12, atol=1e-12)
    else:
        assert_array_equal(c32.X, (X - mu).astype(np.float32))
    assert_array_equal(c32.y, y - 0.5)
