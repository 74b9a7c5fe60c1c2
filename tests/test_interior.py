"""Interior-point W-steps (hpcmtl.interior): coupled hinge / smoothed-hinge duals under a learned or fixed Sigma."""
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest

from hpcmtl import dmtrl, interior, store
from hpcmtl.dmtrl import interior_rounds as dmtrl_interior_rounds, outer as dmtrl_outer
from hpcmtl.cluster import Cluster
from hpcmtl.dmtrl import DMTRLConfig, train, uses_interior_point
from hpcmtl.estimators import MemoryTasks
from hpcmtl.progress import fields
from hpcmtl.taskdata import TaskBlock

from conftest import assert_certified_ascent, learned_hinge_args, mpiexec_path, run_hpcmtl
from reference import box_qp_reference
from conftest import wsteps_certified  # noqa: E402


def raw_tasks(seed, m=6, d=5, one_row=False, zero_row=False):
    """Tasks of 30-50 raw rows (positive, skewed, feature scales 0.1-10), 20 % positive labels, related weights;
    optionally task 0 of one row and an all-zero row in every other task."""
    rng = np.random.default_rng(seed)
    scales, base = rng.uniform(0.1, 10, d), rng.normal(size=d)
    Xs, ys = [], []
    for t in range(m):
        n = 1 if one_row and t == 0 else int(rng.integers(30, 51))
        X = rng.gamma(2.0, 1.0, size=(n, d)) * scales
        if zero_row and n > 1:
            X[n // 2] = 0.0
        s = (X - X.mean(0)) @ (base + 0.5 * rng.normal(size=d))
        Xs.append(X)
        ys.append(np.where(s > np.quantile(s, 0.8), 1.0, -1.0) if n > 1 else np.ones(1))
    return Xs, ys


def low_rank_sigma(m, rank, seed):
    """A task covariance of the given rank plus the eigenvalue floor (what the Omega-step learns on few tasks)."""
    U = np.random.default_rng(seed).normal(size=(m, rank))
    S = U @ U.T + 1e-8 * np.eye(m)
    return S / np.trace(S)


def fit(Xs, ys, Sigma, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(relationship="fixed", **kw),
                     sigma_fixed=Sigma)


def dual_optimum(Xs, ys, Sigma, lam, gamma=0.0):
    """The coupled dual's maximum by an independent dense box QP over all N rows (tests/reference.py):
    ``max_x sum_ij (x_ij - gamma x_ij^2 / 2) / n_i - tr(B Sigma B^T) / (2 lam)``, ``b_i = Z_i^T x_i / n_i``."""
    n = [len(y) for y in ys]
    off = np.concatenate([[0], np.cumsum(n)])
    Z = [X * y[:, None] / len(y) for X, y in zip(Xs, ys)]
    A = np.zeros((off[-1], off[-1]))
    for i in range(len(Xs)):
        for j in range(len(Xs)):
            A[off[i]:off[i + 1], off[j]:off[j + 1]] = Sigma[i, j] / lam * Z[i] @ Z[j].T
    A[np.diag_indices_from(A)] += np.concatenate([np.full(k, gamma / k) for k in n])
    g = np.concatenate([np.full(k, 1.0 / k) for k in n])
    x = box_qp_reference(A, g, 1.0, max_iter=500)
    return float(g @ x - 0.5 * x @ A @ x)


# -- the server's Newton system ------------------------------------------------------------------------------
@pytest.mark.parametrize("m,d,rank", [(1, 1, 1), (7, 3, 2), (12, 4, 12), (5, 6, 1)])
def test_coupled_solve_is_the_dense_newton_solve_under_a_singular_sigma(m, d, rank):
    rng = np.random.default_rng([m, d, rank])
    lam = 1e-4
    Sigma = low_rank_sigma(m, rank, m + d)
    # the tasks' G_i: PSD, one of them zero (a task whose rows all sit at bounds), curvatures over 8 decades
    G = np.stack([(lambda A: A @ A.T)(rng.normal(size=(d, d)) * 10.0 ** rng.uniform(-4, 4)) for _ in range(m)])
    G[m // 2] = 0.0
    V = rng.normal(size=(m, d))
    Y = interior.coupled_solve(interior.sigma_root(Sigma, lam), G, V)
    K = np.kron(Sigma / lam, np.eye(d))
    blocks = np.zeros((m * d, m * d))
    for i in range(m):
        blocks[i * d:(i + 1) * d, i * d:(i + 1) * d] = G[i]
    # (K^-1 + G) y = v, multiplied through by K: (I + K G) y = K v (K itself is nearly singular).  Backward error:
    # the residual against the sizes of the terms (the system's condition number reaches 1e13 here)
    A, rhs, y = np.eye(m * d) + K @ blocks, K @ V.reshape(-1), Y.reshape(-1)
    assert np.all(np.isfinite(Y))
    assert np.linalg.norm(A @ y - rhs) <= 1e-12 * (np.linalg.norm(A, 2) * np.linalg.norm(y) + np.linalg.norm(rhs))
    if m * d > 1:          # and it is not the trivial solution of a well-conditioned system
        assert np.linalg.norm(y) > 1e-3 * np.linalg.norm(np.linalg.solve(A, rhs))


@pytest.mark.parametrize("m,d", [(1, 1), (4, 3), (6, 9)])
def test_a_diagonal_sigma_gives_one_system_a_task_and_the_dense_solve(m, d):
    """Under a diagonal Sigma the Newton system is block diagonal: m Cholesky factors of d x d (no (d m)^2
    matrix), the same y as the dense (I + K G) y = K v; one G_i zero, curvatures over 8 decades."""
    rng = np.random.default_rng([m, d])
    lam = 1e-3
    Sigma = np.diag(rng.uniform(0.01, 1.0, m))
    G = np.stack([(lambda A: A @ A.T)(rng.normal(size=(d, d)) * 10.0 ** rng.uniform(-4, 4)) for _ in range(m)])
    G[m // 2] = 0.0
    V = rng.normal(size=(m, d))
    root = interior.sigma_root(Sigma, lam)
    assert np.array_equal(root, np.diag(np.sqrt(np.diag(Sigma)) / np.sqrt(lam)))
    system = interior.NewtonSystem(root, G)
    assert system.blocks is not None and len(system.blocks) == m
    Y = system.solve(V)
    for i in range(m):
        A = np.eye(d) + Sigma[i, i] / lam * G[i]
        assert np.linalg.norm(A @ Y[i] - Sigma[i, i] / lam * V[i]) <= 1e-12 * (
            np.linalg.norm(A, 2) * np.linalg.norm(Y[i]) + np.linalg.norm(Sigma[i, i] / lam * V[i]))
    assert interior.NewtonSystem(interior.sigma_root(low_rank_sigma(m, m, 1), lam), G).blocks is None or m == 1


def test_sigma_root_squares_to_sigma_over_lam_and_clips_rounding_negatives():
    Sigma = low_rank_sigma(9, 3, 0)
    Sigma[0, 0] -= 2e-8                      # an eigenvalue a rounding error below zero
    root = interior.sigma_root(Sigma, 1e-3)
    assert np.all(np.isfinite(root)) and np.array_equal(root, root.T)
    assert np.allclose(root @ root, Sigma / 1e-3, atol=1e-6)


@pytest.mark.parametrize("d", [1, 2, 5])
def test_the_packed_triangle_gives_back_the_symmetric_matrices(d):
    A = np.random.default_rng(d).normal(size=(3, d, d))
    G = A + A.transpose(0, 2, 1)
    rows = np.stack([interior.packed(g) for g in G])
    assert rows.shape == (3, d * (d + 1) // 2)
    assert np.array_equal(interior.unpacked(rows, d), G)


def test_step_lengths_at_their_edges():
    v = np.array([1.0, 2.0])
    assert interior.largest_step(v, np.array([0.0, 1.0])) == 2.0                  # nothing decreases: the cap
    assert interior.largest_step(v, np.array([-4.0, 1.0])) == 0.25
    assert interior.largest_step(np.zeros(0), np.zeros(0)) == 2.0                 # an empty block
    assert interior.step_lengths(np.array([2.0, 2.0]), np.array([2.0])) == (1.0, 1.0)
    assert interior.step_lengths(np.array([0.5, 2.0]), np.array([0.1])) == (0.995 * 0.5, 0.995 * 0.1)
    assert interior.step_lengths(np.zeros(0), np.zeros(0)) == (1.0, 1.0)           # no blocks: full steps


@pytest.mark.parametrize("n,zero_row,gamma", [(1, False, 0.0), (1, True, 0.0), (2, True, 0.5), (40, True, 0.0)])
def test_a_block_iterate_stays_inside_the_box_on_one_row_and_zero_rows(n, zero_row, gamma):
    rng = np.random.default_rng(n)
    X = rng.gamma(2.0, 1.0, size=(n, 4)) * 10.0
    if zero_row:
        X[-1] = 0.0
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    blk = TaskBlock(0, "t", n, 0, X, y)
    it = interior.BlockIterate(blk, np.array([0.0, 1.0] * n)[:n], gamma)
    assert np.all((it.x >= interior.START_MARGIN) & (it.x <= 1 - interior.START_MARGIN))
    Z = X * y[:, None]
    assert np.allclose(it.b(), Z.T @ it.x / n, rtol=1e-14, atol=0)
    for _ in range(5):
        w = rng.normal(size=4)
        G, v = it.system(w, 1e-3, 0.0)          # no curvature floor: the exact G
        h = it.z / it.x + it.s / (1 - it.x) + gamma / n
        assert np.allclose(G, Z.T @ (Z / h[:, None]) / n ** 2, rtol=1e-12, atol=0) and np.all(np.isfinite(v))
        k_norm = 1e30                        # the curvature floor of the solves: REGULARIZATION ||K|| max ||z||^2 / n^2
        floor = interior.REGULARIZATION * k_norm * np.max(np.sum(X * X, axis=1)) / n ** 2
        G_floor, _ = it.system(w, 1e-3, k_norm)
        if floor > 0:
            assert np.allclose(G_floor, Z.T @ Z / (n ** 2 * floor), rtol=1e-12, atol=0)   # h << floor here
        G, v = it.system(w, 1e-3, 0.0)
        db, primal, dual, coefficients = it.step(rng.normal(size=4))
        assert primal > 0 and dual > 0 and np.all(np.isfinite(db)) and np.all(np.isfinite(coefficients))
        a_p, a_d = interior.step_lengths(np.array([primal]), np.array([dual]))
        before = it.complementarity()
        it.move(a_p, a_d)
        assert np.all((it.x > 0) & (it.x < 1) & (it.z > 0) & (it.s > 0))
        c00, c10, c01, c11 = coefficients
        assert it.complementarity() == pytest.approx(c00 + a_p * c10 + a_d * c01 + a_p * a_d * c11, rel=1e-12)
        assert c00 == before


def test_a_step_that_rounds_onto_a_bound_leaves_x_inside_and_the_system_finite():
    """1 - x below half an ulp of 1 rounds to 1 (seen at lam 1e-8, where it ended the job with a NaN)."""
    X = np.array([[1.0, 2.0], [3.0, 0.5], [0.0, 0.0]])
    blk = TaskBlock(0, "t", 3, 0, X, np.array([1.0, -1.0, 1.0]))
    it = interior.BlockIterate(blk, np.array([0.5, 0.5, 0.5]))
    it.x = np.array([1.0 - 2.0 ** -52, 2.0 ** -52, 0.5])
    it.system(np.zeros(2), 1e-3, 1.0)
    it.dx, it.dz, it.ds = np.array([1.0, -1.0, 0.0]), np.zeros(3), np.zeros(3)
    it.move(2.0 ** -52, 0.0)                                 # x_0 -> 1.0 and x_1 -> 0.0 in floating point
    assert it.x[0] == 1.0 - interior.INSIDE and it.x[1] == interior.INSIDE and it.x[2] == 0.5
    G, v = it.system(np.array([0.1, -0.2]), 1e-3, 1.0)
    assert np.all(np.isfinite(G)) and np.all(np.isfinite(v))


def test_auto_takes_interior_point_w_steps_for_box_losses_with_small_d_only():
    hinge = DMTRLConfig(loss="hinge", lam=1e-3)
    assert uses_interior_point(hinge, interior.MAX_FEATURES, 2)
    assert uses_interior_point(DMTRLConfig(loss="smoothed-hinge", lam=1e-3, aggregation="adaptive"), 10, 100)
    assert not uses_interior_point(hinge, interior.MAX_FEATURES + 1, 2)
    assert not uses_interior_point(hinge, 32, interior.MAX_WIDTH // 32 + 1)
    assert uses_interior_point(hinge, interior.MAX_FEATURES, 100, coupled=False)     # m systems of d x d
    d = interior.MAX_FEATURES          # ... whose triangles the server receives every round: bounded too
    assert not uses_interior_point(hinge, d, interior.MAX_SYSTEM_VALUES // (d * (d + 1) // 2) + 1, coupled=False)
    assert interior.START_FEATURES < interior.MAX_FEATURES
    for cfg in (DMTRLConfig(loss="logistic", lam=1e-3), DMTRLConfig(loss="squared", lam=1e-3),
                DMTRLConfig(loss="hinge", lam=1e-3, aggregation="safe"),
                DMTRLConfig(loss="hinge", lam=1e-3, aggregation="line"),
                DMTRLConfig(loss="hinge", lam=1e-3, local_solver="sdca")):
        assert not uses_interior_point(cfg, 5, 5)


# -- whole W-steps in one process -----------------------------------------------------------------------------
@pytest.mark.parametrize("loss,lam", [("hinge", 1e-2), ("hinge", 1e-4), ("smoothed-hinge", 1e-4)])
def test_a_coupled_w_step_reaches_the_independent_dual_optimum_where_the_qp_rounds_stall(loss, lam, monkeypatch):
    """A fixed Sigma of rank 2 on 6 raw tasks (one of them a single row, all-zero rows): the interior-point rounds
    certify 1e-8 within 40 rounds and the certified objective brackets the optimum of an independent dense box QP;
    the 'qp' rounds alone (interior-point rounds off) are still above 1e-8 after 400 rounds (their budget held at
    --max-rounds: past it, it follows the gap, dmtrl.outer.round_budget)."""
    Xs, ys = raw_tasks(0, one_row=True, zero_row=True)
    Sigma = low_rank_sigma(len(Xs), 2, 1)
    kw = dict(loss=loss, lam=lam, tol=1e-8, fit_intercept=False, max_rounds=400)
    r = fit(Xs, ys, Sigma, **kw)
    h = r.history
    assert wsteps_certified(r) and r.n_rounds <= 40
    assert_certified_ascent(h)
    optimum = dual_optimum(Xs, ys, Sigma, lam, 1.0 if loss == "smoothed-hinge" else 0.0)
    gap = h["primal"][-1] - h["dual"][-1]
    # the reference's own rounding: its two exact formulas for the value at its x (x^T A x, and sums of squares
    # through Sigma^(1/2)) differ by 1.4e-11 relative at lam 1e-4, where A's entries reach 6e5
    slack = 1e-10 * abs(optimum)
    assert h["dual"][-1] - slack <= optimum <= h["primal"][-1] + slack
    assert abs(optimum - h["dual"][-1]) <= gap + slack
    monkeypatch.setattr(interior, "MAX_ROUNDS", 0)
    monkeypatch.setattr(dmtrl_outer, "BUDGET_MOST", 1)        # 400 rounds, not the budget that follows the gap
    qp = fit(Xs, ys, Sigma, **kw)
    assert not qp.converged and qp.history["rel_gap"][-1] > 1e-8 and qp.n_rounds == 400
    assert_certified_ascent(qp.history)


def test_stalled_interior_point_rounds_hand_over_to_the_qp_rounds_keeping_ascent_and_the_certificate(monkeypatch):
    """Interior-point rounds cut off after 6 rounds: the W-step goes on with the 'qp' rounds from the best
    accepted iterate, certifies, and the dual never decreases across the switch."""
    Xs, ys = raw_tasks(3, m=5, d=3)
    Xs = [(X - X.mean(0)) / X.std(0) for X in Xs]         # standardized: the 'qp' rounds can finish the job
    Sigma = low_rank_sigma(len(Xs), 3, 2)
    kw = dict(loss="hinge", lam=1e-2, tol=1e-6, max_rounds=3000)
    full = fit(Xs, ys, Sigma, **kw)
    monkeypatch.setattr(interior, "MAX_ROUNDS", 6)
    cut = fit(Xs, ys, Sigma, **kw)
    assert wsteps_certified(full) and wsteps_certified(cut) and cut.n_rounds > 6 and cut.n_rounds > full.n_rounds
    assert_certified_ascent(cut.history)
    assert cut.history["dual"][5] > cut.history["dual"][0]              # the interior-point rounds did ascend
    gaps = [r.history["primal"][-1] - r.history["dual"][-1] for r in (full, cut)]
    assert abs(full.history["primal"][-1] - cut.history["primal"][-1]) <= sum(gaps)


@pytest.mark.parametrize("seed", [7, 8])
def test_raw_features_at_lam_1e_6_certify_with_refined_regularized_newton_steps(seed, monkeypatch):
    """Learned Sigma, lam 1e-6, 12 raw tasks (objective near 1e-3: the data are nearly separable): every W-step
    certified at 1e-6 within 40 interior-point rounds.  Without the curvature floor and the refinements the
    Newton steps' rounding stops the interior-point rounds first and 300 rounds a W-step leave it unconverged
    (the margin corrections of stalled W-steps, test_polish, off too: they rescue some of those W-steps)."""
    Xs, ys = raw_tasks(seed, m=12, d=6, zero_row=True)
    kw = dict(loss="hinge", lam=1e-6, outer=4, outer_tol=0, max_rounds=300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**kw))
        assert wsteps_certified(r) and np.all(r.wsteps["rel_gap"] <= 1e-6) and np.max(np.diff(r.wsteps["round"])) <= 40
        assert_certified_ascent(r.history)
        monkeypatch.setattr(interior, "REFINEMENTS", 0)
        monkeypatch.setattr(interior, "REGULARIZATION", 0.0)
        monkeypatch.setattr(dmtrl.Server, "margin_correction_possible", lambda self: False)
        plain = train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**kw))
    assert not plain.converged
    assert_certified_ascent(plain.history)


# -- killed and resumed --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_raw(tmp_path_factory):
    path = tmp_path_factory.mktemp("interior") / "tr.h5"
    Xs, ys = raw_tasks(7, m=12, d=6, zero_row=True)
    store.write_tasks(path, Xs, ys, names=[f"t{i}" for i in range(12)])
    return path


def learned(train_path, out, *extra):
    return learned_hinge_args(train_path, out, "1e-4", "4", *extra)


@pytest.mark.mpi
def test_a_sigterm_in_interior_point_rounds_writes_the_state_they_began_from_and_resume_is_bitwise(small_raw, tmp_path):
    """Signalled in the middle of the run (nearly every round is an interior-point round): exit 75, the
    checkpoint is a W-step's starting state (the one the message names), and --resume gives the uninterrupted
    run's W and history bitwise."""
    args = learned(small_raw, tmp_path / "ref.h5", "--outer", "10", "--tol", "1e-9")
    assert run_hpcmtl(args, n_ranks=2, timeout=300).returncode == 0
    ref = store.read_result(tmp_path / "ref.h5")
    starts = set(int(r) for r in ref["wsteps"]["round"][:-1])
    out = tmp_path / "r.h5"
    args = learned(small_raw, out, "--outer", "10", "--tol", "1e-9")
    args = [a for a in args if a != "--quiet"] + ["--progress-seconds", "0"]
    proc = subprocess.Popen([mpiexec_path(), "-n", "3", sys.executable, "-m", "hpcmtl"] + [str(a) for a in args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(5000):
        line = proc.stdout.readline()
        if not line or fields(line).get("round", 0) >= sorted(starts)[2] + 3:
            break
    assert fields(line).get("round", 0) > 0, "the run ended before it could be signalled"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    saved = store.read_checkpoint(str(out) + ".checkpoint.h5")["counters"]["round"]
    assert saved in starts and f"checkpoint written to {out}.checkpoint.h5 after round {saved};" in err, err
    r = run_hpcmtl([a for a in learned(small_raw, out, "--outer", "10", "--tol", "1e-9")] + ["--resume"], n_ranks=2,
                   timeout=300)
    assert r.returncode == 0, r.stderr
    res = store.read_result(out)
    assert res["model"]["W"].tobytes() == ref["model"]["W"].tobytes()
    for key in ("round", "primal", "dual"):
        assert res["history"][key].tobytes() == ref["history"][key].tobytes(), key


# -- W-steps whose rounds stall turn to interior-point rounds (any Sigma) -----------------------------------
def one_large_feature_tasks(seed, m=4, d=4):
    """Tasks of 80-120 raw rows (more than the exact local steps take: local SDCA) whose feature 0 is near 1e5
    (a money amount beside small counts), 30 % positive labels."""
    rng = np.random.default_rng(seed)
    scales, base = rng.uniform(0.1, 10, d), rng.normal(size=d)
    scales[0] *= 1e4
    Xs, ys = [], []
    for _ in range(m):
        n = int(rng.integers(80, 121))
        X = rng.gamma(2.0, 1.0, size=(n, d)) * scales
        s = (X - X.mean(0)) @ (base + 0.5 * rng.normal(size=d))
        Xs.append(X)
        ys.append(np.where(s > np.quantile(s, 0.7), 1.0, -1.0))
    return Xs, ys


@pytest.mark.parametrize("seed", [1, 2])
def test_stl_on_a_feature_near_1e5_turns_to_interior_point_rounds_and_certifies(seed, monkeypatch):
    """STL (a diagonal Sigma: local rounds) with local SDCA on a feature near 1e5 beside the intercept feature
    makes no progress (relative gap 1.0 after 100 rounds); once the gap has not halved for
    INTERIOR_AFTER_LOCAL_STALL local rounds the W-step turns to interior-point rounds and certifies at 1e-6, and
    the model written has the certified primal."""
    from test_polish import exact_primal
    Xs, ys = one_large_feature_tasks(seed)
    kw = dict(loss="hinge", lam=1e-2, relationship="identity", max_rounds=100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**kw))
        h = r.history
        assert wsteps_certified(r) and h["rel_gap"][-1] <= 1e-6 and r.n_rounds <= 40
        assert np.all(h["rel_gap"][:dmtrl.INTERIOR_AFTER_LOCAL_STALL] > 0.5)    # the local rounds' stall
        assert_certified_ascent(h)
        assert exact_primal(Xs, ys, r.W, r.intercept, r.Sigma, 1e-2) == pytest.approx(h["primal"][-1], rel=1e-10)
        monkeypatch.setattr(dmtrl_interior_rounds, "INTERIOR_AFTER_STALL", 10 ** 9)
        monkeypatch.setattr(dmtrl_interior_rounds, "INTERIOR_AFTER_LOCAL_STALL", 10 ** 9)
        stuck = train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**kw))
    assert not stuck.converged and stuck.history["rel_gap"][-1] > 0.1
    assert_certified_ascent(stuck.history)


def test_more_features_than_a_coupled_w_step_starts_with_turn_to_interior_point_rounds_after_a_stall(monkeypatch):
    """d = 81 with the intercept feature: above START_FEATURES (no coupled W-step starts with interior-point
    rounds), within MAX_FEATURES (a stalled one turns to them).  Feature 0 near 1e5, a learned Sigma: every
    W-step certified within 40 rounds, the model written has the certified primal; with the limit before
    (MAX_FEATURES = START_FEATURES), or with blocks too large to keep dense (MAX_ROW_VALUES), the second
    W-step ends 60 rounds above a relative gap of 1e-3."""
    from test_polish import exact_primal
    Xs, ys = one_large_feature_tasks(1, m=3, d=80)
    kw = dict(loss="hinge", lam=1e-2, relationship="learned", outer=2, outer_tol=0, max_rounds=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**kw))
        assert wsteps_certified(r) and r.wsteps["converged"].all()
        assert np.all(np.diff(np.concatenate([[0], r.wsteps["round"]])) <= 40)
        second = r.history["outer"] == 1
        assert np.all(r.history["rel_gap"][second][:dmtrl.INTERIOR_AFTER_STALL] > 1e-3)    # the qp rounds first
        assert_certified_ascent(r.history)
        assert exact_primal(Xs, ys, r.W, r.intercept, r.Sigma, 1e-2) == pytest.approx(r.history["primal"][-1],
                                                                                       rel=1e-10)
        for name, value in (("MAX_FEATURES", interior.START_FEATURES), ("MAX_ROW_VALUES", 80 * 81 - 1)):
            with monkeypatch.context() as patch:
                patch.setattr(interior, name, value)
                stuck = train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**kw))
            assert not stuck.wsteps["converged"][1] and stuck.wsteps["rel_gap"][1] > 1e-3, name
            assert_certified_ascent(stuck.history)
