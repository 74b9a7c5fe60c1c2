"""The box step problem's structured preconditioner (hpcmtl/dmtrl/qp_precond.py): the same box QP answers as the
dense active-set solver and Jacobi-preconditioned CG, in fewer products, against dense NumPy matrices formed
independently of the factored arithmetic."""
import numpy as np
import pytest
from numpy.testing import assert_allclose

from hpcmtl.covariance import SigmaFactors
from hpcmtl.dmtrl import steps
from hpcmtl.dmtrl.qp_precond import CapacitancePreconditioner, block_inverse, low_rank_terms
from hpcmtl.dmtrl.steps import box_qp, box_qp_operator


def factored_sigma(m, r, floor, rng):
    """Sigma = V diag(s) V^T + c (I - V V^T), trace 1, eigenvalues s spread over a decade, c = floor s_max."""
    V, _ = np.linalg.qr(rng.normal(size=(m, r)))
    s = np.sort(rng.uniform(0.1, 1.0, r))[::-1]
    c = floor * s[0]
    total = s.sum() + c * (m - r)
    return SigmaFactors(V, s / total, c / total)


def dense_quadratic(Sigma, D, lam, extra):
    """A = (Sigma2 o D D^T) / lam + the per-task conjugate blocks, formed densely (D: one or two m x d arrays)."""
    S = Sigma.dense()
    k = len(D)
    D2 = np.vstack(D)
    A = np.tile(S, (k, k)) * (D2 @ D2.T) / lam
    m = S.shape[0]
    t = np.arange(m)
    c2, cross, c2q = extra
    A[t, t] += c2
    if k == 2:
        A[m + t, m + t] += c2q
        A[t, m + t] += cross
        A[m + t, t] += cross
    return 0.5 * (A + A.T)


def counted(A):
    calls = []

    def times(v):
        calls.append(1)
        return A @ v
    return times, calls


@pytest.mark.parametrize("m,d,r,floor", [(120, 5, 3, 1e-4), (200, 4, 4, 1e-6), (90, 3, 2, 1e-3)])
def test_capacitance_box_qp_is_the_dense_box_qp_in_fewer_products(m, d, r, floor):
    rng = np.random.default_rng(m + d + r)
    lam = 1e-2
    Sigma = factored_sigma(m, r, floor, rng)
    D = rng.normal(size=(m, d)) * rng.uniform(0.1, 3.0, (m, 1))      # tasks' directions, scales over a decade
    extra = (rng.uniform(0, 1e-3, m), np.zeros(m), np.zeros(m))
    A = dense_quadratic(Sigma, [D], lam, extra)
    g = rng.normal(size=m) * np.sqrt(np.diag(A))
    upper = 1.0
    ref = box_qp(A, g, upper, max_iter=1000)
    jacobi_times, jacobi_calls = counted(A)
    x_j = box_qp_operator(jacobi_times, np.diag(A).copy(), g, upper)
    pre = CapacitancePreconditioner(*low_rank_terms(Sigma, lam, d), [D], lam, extra)
    cap_times, cap_calls = counted(A)
    x_c = box_qp_operator(cap_times, np.diag(A).copy(), g, upper, precond=pre)
    # positive definite (c > 0, rows not zero): one optimum, which both find
    assert_allclose(x_c, ref, rtol=0, atol=1e-10)
    value = (lambda y: g @ y - 0.5 * y @ A @ y)
    assert value(x_c) >= value(ref) - 1e-12 * abs(value(ref))
    # the floor makes A ill-conditioned after Jacobi scaling: CG on the low-rank part's spread eigenvalues
    assert len(cap_calls) * 3 < len(jacobi_calls), (len(cap_calls), len(jacobi_calls))
    assert np.all(x_c >= 0) and np.all(x_c <= upper)


def test_the_preconditioner_is_the_inverse_of_the_free_block_and_follows_the_free_set():
    """M_FF = A_FF when every term is kept (conjugate blocks, two directions, a zero direction included), for a
    sequence of free sets (the capacitance updated task by task, never rebuilt)."""
    rng = np.random.default_rng(7)
    m, d, r, lam = 40, 3, 3, 0.5
    Sigma = factored_sigma(m, r, 1e-3, rng)
    D = [rng.normal(size=(m, d)), rng.normal(size=(m, d))]
    D[1][:5] = 0.0                                                    # tasks without a momentum direction
    extra = (rng.uniform(0, 0.1, m), rng.uniform(-0.01, 0.01, m), rng.uniform(0, 0.1, m))
    extra[1][:5] = extra[2][:5] = 0.0
    A = dense_quadratic(Sigma, D, lam, extra)
    pre = CapacitancePreconditioner(*low_rank_terms(Sigma, lam, d), D, lam, extra)
    for _ in range(4):
        free = rng.uniform(size=2 * m) < 0.7
        free[m:m + 5] = False
        idx = np.flatnonzero(free)
        solve = pre.for_free(free)
        b = rng.normal(size=2 * m)
        z = solve(b)
        assert np.all(z[~free] == 0)
        assert_allclose(z[idx], np.linalg.solve(A[np.ix_(idx, idx)], b[idx]), rtol=1e-9)


def test_parallel_directions_lift_the_null_direction():
    """One-row tasks: db and dq parallel, Dg's block singular; its inverse is I / trace, so M = A + trace n n^T
    and M^-1 A is the projector onto A's range (eigenvalues 0 and 1 only)."""
    i11, i12, i22 = block_inverse(np.array([4.0, 1.0, 0.0]), np.array([2.0, 0.0, 0.0]), np.array([1.0, 0.0, 2.0]))
    assert_allclose([i11[0], i12[0], i22[0]], [0.2, 0.0, 0.2])            # singular: I / (4 + 1)
    assert [i11[1], i22[1], i11[2], i22[2]] == [1.0, 0.0, 0.0, 0.5]       # a zero direction: 0, not 1/0
    rng = np.random.default_rng(3)
    m, d, r, lam = 30, 4, 2, 0.1
    Sigma = factored_sigma(m, r, 1e-4, rng)
    X = rng.normal(size=(m, d))
    D = [X * rng.uniform(0.5, 2, (m, 1)), X * rng.uniform(-2, 2, (m, 1))]
    zero = (np.zeros(m),) * 3
    A = dense_quadratic(Sigma, D, lam, zero)
    pre = CapacitancePreconditioner(*low_rank_terms(Sigma, lam, d), D, lam, zero)
    solve = pre.for_free(np.ones(2 * m, dtype=bool))
    Minv = np.column_stack([solve(e) for e in np.eye(2 * m)])
    ev = np.sort(np.linalg.eigvals(Minv @ A).real)
    assert_allclose(ev[:m], 0.0, atol=1e-8)
    assert_allclose(ev[m:], 1.0, atol=1e-8)


def test_dense_sigma_terms_are_its_eigendecomposition_and_truncation_keeps_the_diagonal(monkeypatch):
    rng = np.random.default_rng(11)
    m, d, r, lam = 50, 4, 5, 0.3
    Sigma = factored_sigma(m, r, 1e-3, rng)
    U, rest = low_rank_terms(Sigma.dense(), lam, d)
    Uf, restf = low_rank_terms(Sigma, lam, d)
    assert U.shape == Uf.shape == (m, r)
    assert_allclose(U @ U.T, Uf @ Uf.T, atol=1e-12)                      # the same terms (signs aside)
    assert_allclose(rest, Sigma.c, rtol=1e-9)
    # fewer columns allowed: the largest terms kept, the others' diagonal in sigma_rest (so M's diagonal is A's)
    monkeypatch.setattr("hpcmtl.dmtrl.qp_precond.CAPACITY_MAX", 2 * d)
    U2, rest2 = low_rank_terms(Sigma, lam, d)
    assert U2.shape == (m, 2)
    assert_allclose(lam * (U2 * U2).sum(1) + rest2, Sigma.diag(), rtol=1e-12)
    D = [rng.normal(size=(m, d))]
    extra = (np.zeros(m),) * 3
    A = dense_quadratic(Sigma, D, lam, extra)
    pre = CapacitancePreconditioner(U2, rest2, D, lam, extra)
    solve = pre.for_free(np.ones(m, dtype=bool))
    M = np.linalg.inv(np.column_stack([solve(e) for e in np.eye(m)]))
    assert_allclose(np.diag(M), np.diag(A), rtol=1e-8)
    assert np.linalg.eigvalsh(0.5 * (M + M.T)).min() > 0


def test_step_solver_through_the_factors_takes_the_dense_active_set_steps(monkeypatch):
    """The server's box-momentum steps through Sigma's factors are the dense path's (the compiled active-set
    box QPs on the formed 2m x 2m matrix: m < DENSE_OPERATOR_MIN_TASKS) to 1e-12, with the capacitance
    preconditioner as with Jacobi, whose Newton CG takes several times the products."""
    from hpcmtl.dmtrl import DMTRLConfig
    from hpcmtl.dmtrl.steps import StepInputs, StepSolver
    from hpcmtl.taskspace import DENSE
    rng = np.random.default_rng(5)
    m, d, r, lam = 48, 4, 3, 1e-2
    Sigma = factored_sigma(m, r, 1e-3, rng)
    dBT, dQT = rng.normal(size=(m, d)), rng.normal(size=(m, d))
    WT = rng.normal(size=(m, d)) * 1e-3
    n = rng.integers(1, 4, m).astype(float)
    scalars = np.column_stack([rng.normal(size=m) * 1e-3, np.zeros((m, 4)), rng.uniform(0, 3, m)])
    solver = StepSolver(DMTRLConfig(loss="hinge", lam=lam), "box")
    dense = StepInputs(DENSE, Sigma.dense(), n, WT, WT.copy(), np.zeros((m, d)), np.zeros(m), np.zeros(m))
    ref = solver.steps_box_momentum(dense, dBT, dQT, scalars)
    factored = dense._replace(factors=Sigma)
    cg = steps.preconditioned_cg
    products = {}
    for name in ("jacobi", "capacitance"):
        counts = []

        def counted_cg(*args, **kwargs):
            x, k = cg(*args, **kwargs)
            counts.append(k)
            return x, k
        monkeypatch.setattr(steps, "preconditioned_cg", counted_cg)
        monkeypatch.setattr(steps, "QP_PRECONDITIONER", name)
        for a, b in zip(ref, solver.steps_box_momentum(factored, dBT, dQT, scalars)):
            assert_allclose(b, a, rtol=0, atol=1e-12)
        products[name] = sum(counts)
    assert 3 * products["capacitance"] < products["jacobi"], products
