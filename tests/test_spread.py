"""The server's round algebra spread over the ranks by task chunks (issue 35 item 3, hpcmtl/dmtrl/spread.py):
the chunk arithmetic against a dense NumPy reference, the spread rounds against the server path (1e-10), and the
same bits at every rank count, a rank without a chunk included."""
import os
import subprocess
import sys

import numpy as np
import pytest
from numpy.testing import assert_allclose

from hpcmtl import store
from hpcmtl.cluster import Cluster
from hpcmtl.covariance import SigmaFactors
from hpcmtl.dmtrl import DMTRLConfig, spread, spread_precond, steps, train
from hpcmtl.dmtrl import sigma as sigma_rules
from hpcmtl.estimators import MemoryTasks

from conftest import mpiexec_path, one_error_line, random_tasks, run_hpcmtl
from test_spread_precond import Ranks


@pytest.mark.parametrize("m", [1, 5, 63, 64, 65, 130, 4096, 10001])
@pytest.mark.parametrize("chunk_min", [1, 7, 64])
def test_chunks_cover_every_task_once_and_do_not_depend_on_the_rank_count(m, chunk_min, monkeypatch):
    monkeypatch.setattr(spread, "CHUNK_MIN_TASKS", chunk_min)
    bounds = spread.chunk_bounds(m)
    size = bounds[1] - bounds[0]
    assert bounds[0] == 0 and bounds[-1] == m and np.all(np.diff(bounds) > 0)
    assert np.all(np.diff(bounds)[:-1] == size) and len(bounds) - 1 <= max(spread.MAX_CHUNKS, 1)
    assert size == min(m, max(chunk_min, -(-m // spread.MAX_CHUNKS)))      # from m alone
    for P in (1, 2, 3, 5, 16, 100):
        owned = [spread.rank_chunks(bounds, rank, P) for rank in range(P)]
        assert owned[0][0] == 0 and owned[-1][1] == len(bounds) - 1
        for (c0, c1, t0, t1), (n0, _, n_t0, _) in zip(owned, owned[1:]):
            assert c1 == n0 and t1 == n_t0 and c0 <= c1               # contiguous, in rank order
        for c0, c1, t0, t1 in owned:
            assert (t0, t1) == (bounds[c0], bounds[c1])
        if P > len(bounds) - 1:                                          # more ranks than chunks: some have none
            assert any(c0 == c1 for c0, c1, _, _ in owned)


def random_factors(m, r, seed):
    rng = np.random.default_rng(seed)
    V, _ = np.linalg.qr(rng.normal(size=(m, r)))
    return SigmaFactors(V, np.sort(rng.uniform(0.2, 1.0, r))[::-1], 0.05)


@pytest.mark.parametrize("chunk_min", [1, 5, 64])
@pytest.mark.parametrize("r", [0, 3])
def test_chunked_sigma_products_are_the_dense_matrix_s(chunk_min, r, monkeypatch):
    monkeypatch.setattr(spread, "CHUNK_MIN_TASKS", chunk_min)
    m, d = 37, 4                                   # 37 tasks: chunks of 5 end in one of 2
    F = random_factors(m, r, 3)
    X = np.random.default_rng(4).normal(size=(m, d))
    dense = F.V @ np.diag(F.s) @ F.V.T + F.c * (np.eye(m) - F.V @ F.V.T)        # the NumPy reference
    assert_allclose(spread.chunked_sigma_times(F, X), dense @ X, rtol=0, atol=1e-14 * np.abs(dense @ X).max())
    # a rank's chunks alone give the same rows as the whole (the per-chunk numbers depend on the chunk only)
    bounds = spread.chunk_bounds(m)
    KZ = (F.s - F.c)[:, None] * spread.ordered_sum(spread.chunk_partials(F.V, X, bounds))
    whole = spread.chunk_rows(F.V, KZ, F.c, X, bounds)
    c0, c1, t0, t1 = spread.rank_chunks(bounds, 1, 3)
    part = spread.chunk_rows(np.ascontiguousarray(F.V[t0:t1]), KZ, F.c, X[t0:t1].copy(), bounds[c0:c1 + 1] - t0)
    assert part.tobytes() == whole[t0:t1].tobytes()


@pytest.mark.parametrize("shape", [(64, 400), (3, 400), (64, 1), (1, 400), (17, 6), (0, 5)])
def test_chunk_partials_are_added_one_after_the_other_in_chunk_order(shape):
    rng = np.random.default_rng(sum(shape))
    parts = rng.normal(size=shape) * 10.0 ** rng.uniform(-8, 8, size=shape)      # rounding shows in the order
    total = np.zeros(shape[1])
    for part in parts:
        total += part
    assert spread.ordered_sum(parts).tobytes() == total.tobytes()
    assert spread.ordered_sum(parts[:, 0]).tobytes() == total[:1].reshape(()).tobytes() if shape[1] else True


def test_same_bits_tells_a_signed_zero_apart():
    a = np.array([0.0, 1.0])
    assert spread.same_bits(a, a.copy()) and not spread.same_bits(a, np.array([-0.0, 1.0]))
    assert not spread.same_bits(a, np.zeros(3))


def squared_tasks(m, d, seed):
    rng = np.random.default_rng(seed)
    return random_tasks(seed=seed, m=m, d=d, sizes=tuple(int(s) for s in rng.integers(8, 15, m)), loss="squared")


def fit(Xs, ys, spread_on, monkeypatch, **kw):
    monkeypatch.setattr(sigma_rules, "FACTORED_MIN_TASKS", 0)
    monkeypatch.setattr(spread, "SPREAD_MIN_TASKS", 0 if spread_on else 10 ** 9)
    monkeypatch.setattr(spread, "PRECOND_MIN_TASKS", 0 if spread_on else 10 ** 9)
    monkeypatch.delenv(spread.SPREAD_VARIABLE, raising=False)
    monkeypatch.delenv(spread.PRECOND_VARIABLE, raising=False)
    return train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**kw), warn=lambda msg: None)


@pytest.mark.parametrize("chunk_min", [1, 7])
@pytest.mark.parametrize("m,d", [(40, 6), (9, 12)])
def test_spread_rounds_train_the_server_path_s_model(m, d, chunk_min, monkeypatch):
    """Chunks of 1 task, and of 7 (the last one shorter), at m > d and m < d: the same rounds, W, Sigma and gaps
    as the server path's matrix-free CG to 1e-10; B and dP are sent once and then kept on the ranks."""
    monkeypatch.setattr(spread, "CHUNK_MIN_TASKS", chunk_min)
    Xs, ys = squared_tasks(m, d, 5 * m + d)
    kw = dict(loss="squared", lam=0.05, tol=1e-8, outer=3, outer_tol=0, max_rounds=3000, fit_intercept=False)
    a = fit(Xs, ys, False, monkeypatch, **kw)
    sent = []
    init = spread.ChunkState.__init__

    def spy(self, piece, *rest):
        sent.append(int(piece[4]))                # has_rows: B and dP sent (1) or kept from the last round (0)
        init(self, piece, *rest)
    monkeypatch.setattr(spread.ChunkState, "__init__", spy)
    b = fit(Xs, ys, True, monkeypatch, **kw)
    assert len(sent) > 5 and sent[0] == 1 and 0 in sent          # the spread ran, and kept the rows
    assert np.array_equal(a.history["round"], b.history["round"])
    assert_allclose(b.W, a.W, rtol=0, atol=1e-10 * np.abs(a.W).max())
    assert_allclose(b.Sigma.dense(), a.Sigma.dense(), rtol=0, atol=1e-10 * np.abs(a.Sigma.dense()).max())
    for key in ("primal", "dual"):
        assert_allclose(b.history[key], a.history[key], rtol=1e-10, atol=1e-12)
    assert_allclose(b.history["gap"], a.history["gap"], rtol=0, atol=1e-10 * np.abs(a.history["primal"]).max())


def test_the_box_losses_do_not_take_the_squared_step_and_a_dense_sigma_stays_on_rank_0(monkeypatch):
    """Only the squared loss sends SPREAD_START (a hinge run spreads its own box commands), a 'line' aggregation
    (no momentum) nothing, and a run below FACTORED_MIN_TASKS never spreads."""
    Xs, ys = squared_tasks(12, 5, 3)
    monkeypatch.setattr(spread.SpreadBlocks, "spread_start", lambda *a: pytest.fail("squared spread at a box loss"))
    fit([X for X in Xs], [np.where(y > np.median(y), 1.0, -1.0) for y in ys], True, monkeypatch, loss="hinge",
        lam=0.05, tol=1e-6, outer=2, outer_tol=0)
    monkeypatch.setattr(spread.SpreadBlocks, "spread_box_start", lambda *a: pytest.fail("spread under 'line'"))
    fit([X for X in Xs], [np.where(y > np.median(y), 1.0, -1.0) for y in ys], True, monkeypatch, loss="hinge",
        lam=0.05, tol=1e-6, outer=2, outer_tol=0, aggregation="line")
    monkeypatch.setattr(sigma_rules, "FACTORED_MIN_TASKS", 10 ** 9)
    monkeypatch.setattr(spread, "SPREAD_MIN_TASKS", 0)
    train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(loss="squared", lam=0.05, tol=1e-6, outer=2,
                                                              outer_tol=0), warn=lambda msg: None)


def box_tasks(loss, m, d, seed):
    rng = np.random.default_rng(seed)
    return random_tasks(seed=seed, m=m, d=d, sizes=tuple(int(s) for s in rng.integers(8, 15, m)), loss=loss)


def chunked_capacitance(capacitance):
    """StepSolver.capacitance with rank 0's path's preconditioner by the spread's chunk arithmetic (one rank's
    worker half run here, tests/test_spread_precond.py); the spread rounds keep their own."""
    def chunked(self, inputs, directions, extra):
        if inputs.capacitance is not None or steps.QP_PRECONDITIONER != "capacitance":
            return capacitance(self, inputs, directions, extra)
        dB = inputs.space.dense(directions[0])
        m = dB.shape[0]
        scalars = np.zeros((m, 6))          # extra is already per task size: divided by n = 1, the same bits
        for column, value in zip((1, 4, 3), extra):
            scalars[:, column] = value
        dQ = inputs.space.dense(directions[1]) if len(directions) == 2 else np.zeros_like(dB)
        ranks = Ranks(1, inputs.factors, dB, dQ, scalars, np.ones(m), self.config.lam)
        return spread_precond.SpreadCapacitance(ranks, len(directions))
    return chunked


def box_fits(loss, m, spread_on_off, monkeypatch, chunked=False):
    """The box loss's fits of ``m`` tasks (d = 6: d m above interior.MAX_WIDTH, so the W-steps run 'qp' rounds),
    spread and not; ``chunked``: rank 0's path with Sigma's products and the box QPs' preconditioner by the
    spread's chunk arithmetic too."""
    if chunked:
        matmul = SigmaFactors.matmul
        monkeypatch.setattr(SigmaFactors, "matmul", lambda self, X: spread.chunked_sigma_times(self, X)
                            if np.ndim(X) == 2 else matmul(self, X))
        monkeypatch.setattr(steps.StepSolver, "capacitance", chunked_capacitance(steps.StepSolver.capacitance))
    Xs, ys = box_tasks(loss, m, 6, m)
    kw = dict(loss=loss, lam=0.05, tol=1e-8, outer=3, outer_tol=0, max_rounds=3000)
    return [fit(Xs, ys, on, monkeypatch, **kw) for on in spread_on_off]


@pytest.mark.parametrize("chunk_min", [7, 64])
@pytest.mark.parametrize("loss", ["hinge", "logistic", "smoothed-hinge"])
def test_spread_box_steps_take_rank_0_s_decisions_bit_for_bit(loss, chunk_min, monkeypatch):
    """With rank 0's Sigma products and box QP preconditioner by the same chunk arithmetic, the spread box rounds
    (rank 0's projected Newton-CG, every product of A and every preconditioner solve by chunks, B and W on the
    chunks) give rank 0's path bit for bit: the same active sets, line searches and steps, so the spread changes
    nothing but where the products and solves are computed."""
    monkeypatch.setattr(spread, "CHUNK_MIN_TASKS", chunk_min)
    products = []
    times = spread.SpreadServer.spread_box_times
    monkeypatch.setattr(spread.SpreadServer, "spread_box_times", lambda self, v: products.append(1) or times(self, v))
    a, b = box_fits(loss, 200, (False, True), monkeypatch, chunked=True)
    assert len(products) > 100                                   # the spread ran (hundreds of products)
    assert all(a.wsteps["converged"]) and all(b.wsteps["converged"])      # every W-step certified
    assert b.W.tobytes() == a.W.tobytes()
    for key in ("round", "primal", "dual", "step"):
        assert np.asarray(b.history[key]).tobytes() == np.asarray(a.history[key]).tobytes(), key


@pytest.mark.parametrize("loss", ["hinge", "logistic"])
def test_spread_box_steps_agree_with_today_s_rank_0_path(loss, monkeypatch):
    """Against rank 0's path as it is (Sigma's products in one BLAS call: other roundings), both certified.  The
    logistic loss takes the same rounds, gaps to 1e-9 of the primal; the hinge loss's projected Newton-CG flips a
    decision on a 1e-16 difference in its fourth round (the duals 2e-8 apart there, after 1e-16 in the third),
    after which the two runs follow their own trajectories, each W-step certified (27 and 30 rounds)."""
    a, b = box_fits(loss, 200, (False, True), monkeypatch)
    assert all(a.wsteps["converged"]) and all(b.wsteps["converged"])      # every W-step certified
    for res in (a, b):
        h = res.history
        assert np.all(np.asarray(h["primal"]) >= np.asarray(h["dual"]) - 1e-12 * np.abs(h["primal"]))
        assert h["rel_gap"][-1] <= 1e-8
    pa, pb = np.asarray(a.history["primal"]), np.asarray(b.history["primal"])
    assert_allclose(b.history["dual"][:3], a.history["dual"][:3], rtol=1e-13)
    # the last W-step's primal: its Sigma comes from W-steps certified at 1e-8 on other trajectories (2e-6 measured)
    assert_allclose(pb[-1], pa[-1], rtol=1e-5)
    if loss == "logistic":
        assert np.array_equal(a.history["round"], b.history["round"])
        assert_allclose(b.history["gap"], a.history["gap"], rtol=0, atol=1e-9 * np.abs(pa).max())
        assert_allclose(b.W, a.W, rtol=0, atol=1e-6 * np.abs(a.W).max())


def test_a_graph_kernel_held_sparse_is_not_spread(tmp_path):
    """A graph kernel's sparse Sigma (GraphSigma, from 512 tasks) has no factors to chunk: with the spread's
    threshold at 0 the squared loss's rounds stay on rank 0's matrix-free path and train to the certificate."""
    path = many_tasks_file(str(tmp_path))
    r = run_hpcmtl(["train", "graph", "--train", path, "--out", tmp_path / "g.h5", "--graph", "chain", "--loss",
                    "squared", "--lam", "1e-2", "--tol", "1e-6", "--quiet"], env={spread.SPREAD_VARIABLE: "0"})
    assert r.returncode == 0, r.stderr
    res = store.read_result(tmp_path / "g.h5")
    assert "graph_alpha" in res["model"] and "Sigma" not in res["model"], sorted(res["model"])
    assert bool(res["model"]["converged"])


def many_tasks_file(directory, m=512, labels=False):
    """``m`` related tasks of 6-9 rows and 5 features (as tests/test_rank_counts.py's many-tasks case); ``labels``:
    the targets' signs (+-1, the box losses')."""
    rng = np.random.default_rng(35)
    centers = rng.normal(size=(4, 5))
    Xs, ys = [], []
    for t in range(m):
        X = rng.normal(size=(int(rng.integers(6, 10)), 5))
        ys.append(X @ (centers[t % 4] + 0.3 * rng.normal(size=5)) + 0.3 * rng.normal(size=X.shape[0]))
        Xs.append(X)
    if labels:
        ys = [np.where(y > 0, 1.0, -1.0) for y in ys]
    path = os.path.join(directory, "many-labels.h5" if labels else "many.h5")
    store.write_tasks(path, Xs, ys, names=[f"t{i}" for i in range(m)])
    return path


def test_a_bad_spread_setting_is_one_line_on_every_rank(tmp_path):
    path = many_tasks_file(str(tmp_path), 20)
    r = run_hpcmtl(["train", "dmtrl", "--train", path, "--out", tmp_path / "o.h5", "--loss", "squared", "--lam", "0.1",
                    "--quiet"], env={spread.SPREAD_VARIABLE: "lots"})
    assert r.returncode == 2
    assert "HPCMTL_SPREAD_MIN_TASKS" in one_error_line(r) and "not a whole number" in one_error_line(r)
    r = run_hpcmtl(["train", "dmtrl", "--train", path, "--out", tmp_path / "o.h5", "--loss", "squared", "--lam", "0.1",
                    "--quiet"], env={spread.PRECOND_VARIABLE: "4k"})
    assert r.returncode == 2 and not (tmp_path / "o.h5").exists()
    assert "HPCMTL_SPREAD_PRECOND_MIN_TASKS='4k'" in one_error_line(r) and "not a whole number" in one_error_line(r)


@pytest.mark.parametrize("precond_min", [0, 200, 201])
def test_the_box_preconditioner_goes_by_chunks_from_its_own_task_count(precond_min, monkeypatch):
    """With the spread on, the box QPs' products always go by chunks, and their preconditioner from
    PRECOND_MIN_TASKS tasks on (m = 200 here: 'qp' rounds, as box_fits'): below it rank 0's own (no
    SPREAD_BOX_FREE sent), from it the chunks'."""
    Xs, ys = box_tasks("hinge", 200, 6, 200)
    free, products = [], []
    monkeypatch.setattr(spread_precond.SpreadPrecondBlocks, "spread_box_free",
                        lambda self, *a, inner=spread_precond.SpreadPrecondBlocks.spread_box_free:
                        free.append(1) or inner(self, *a))
    monkeypatch.setattr(spread.SpreadBlocks, "spread_box_direction",
                        lambda self, *a, inner=spread.SpreadBlocks.spread_box_direction:
                        products.append(1) or inner(self, *a))
    fit(Xs, ys, True, monkeypatch, loss="hinge", lam=0.05, tol=1e-6, outer=2, outer_tol=0)
    assert products and free
    monkeypatch.setattr(spread, "PRECOND_MIN_TASKS", precond_min)
    free.clear()
    result = train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(loss="hinge", lam=0.05, tol=1e-6, outer=2,
                                                                       outer_tol=0), warn=lambda msg: None)
    assert all(result.wsteps["converged"])
    assert bool(free) == (precond_min <= 200)


def spread_runs(path, loss, runs, tmp_path, timeout):
    """`train dmtrl` of 512 tasks in 3 chunks of 200 (the last 112), spread from 512 tasks, at each (P, wait) of
    ``runs``: the result files by P (the sleeping run under "local")."""
    driver = ("import sys; from hpcmtl.dmtrl import spread; spread.CHUNK_MIN_TASKS = 200; "
              "spread.SPREAD_MIN_TASKS = 512; spread.PRECOND_MIN_TASKS = 512; "
              "from hpcmtl.cli import main; sys.exit(main(sys.argv[1:]))")
    results = {}
    for P, wait in runs:
        out = tmp_path / f"p{P}{wait}.h5"
        cmd = [mpiexec_path(), "-n", str(P), sys.executable, "-c", driver, "train", "dmtrl", "--train", path,
               "--out", str(out), "--loss", loss, "--lam", "1e-2", "--tol", "1e-6", "--outer", "3",
               "--outer-tol", "0", "--quiet", "--force"]
        env = {k: v for k, v in os.environ.items() if k != spread.SPREAD_VARIABLE}
        env["HPCMTL_MPI_WAIT"] = wait
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        assert r.returncode == 0, r.stderr
        results[P if wait != "sleep" else "local"] = store.read_result(out)
    return results


def assert_same_spread_bits(results):
    """Every run has P = 1's bits, and the spinning P = 4 run moved more than the sleeping one (rank 0 alone moves
    no chunk rows: less traffic for the same rounds), so the chunks really ran on the ranks."""
    spread_bytes, local_bytes = results[4]["history"]["bytes"][-1], results["local"]["history"]["bytes"][-1]
    assert local_bytes < spread_bytes, (local_bytes, spread_bytes)
    for P in (2, 4, "local"):
        for key in ("W", "sigma_V", "sigma_s"):
            assert results[P]["model"][key].tobytes() == results[1]["model"][key].tobytes(), (P, key)
        for key in ("round", "primal", "dual", "step"):
            assert results[P]["history"][key].tobytes() == results[1]["history"][key].tobytes(), (P, key)


@pytest.mark.mpi
def test_a_rank_without_a_chunk_keeps_the_bits(tmp_path):
    """512 tasks in 3 chunks of 200 (the last 112) at P = 1, 2 and 4 (rank 0 then has no chunk), and at P = 4 with
    sleeping waits (rank 0 computes every chunk itself): the same bits, and the spread's setting refused alike on
    every rank of P = 3."""
    path = many_tasks_file(str(tmp_path))
    # P = 4 twice: ranks that spin share the chunks, ranks that sleep (as on crowded cores) leave them all to rank 0
    results = spread_runs(path, "squared", ((1, "auto"), (2, "auto"), (4, "spin"), (4, "sleep")), tmp_path, 300)
    assert spread.rank_chunks(np.array([0, 200, 400, 512]), 0, 4)[:2] == (0, 0)
    assert_same_spread_bits(results)
    bad = run_hpcmtl(["train", "dmtrl", "--train", path, "--out", tmp_path / "x.h5", "--loss", "squared", "--lam",
                      "1e-2", "--quiet"], n_ranks=3, env={spread.SPREAD_VARIABLE: "1e4"})
    assert bad.returncode == 2 and "HPCMTL_SPREAD_MIN_TASKS" in one_error_line(bad)


@pytest.mark.mpi
@pytest.mark.parametrize("loss", ["hinge", "logistic"])
def test_box_spread_keeps_the_bits_on_a_rank_without_a_chunk_and_on_crowded_ranks(loss, tmp_path):
    """The box losses' spread products: 512 tasks in 3 chunks of 200 (the last 112) at P = 1, 2 and 4 (rank 0 then
    has no chunk), and at P = 4 with sleeping waits (rank 0 computes every chunk itself): the same bits, and the
    box commands really ran on the ranks (more bytes than rank 0 alone for the same rounds)."""
    path = many_tasks_file(str(tmp_path), labels=True)
    results = spread_runs(path, loss, ((1, "auto"), (2, "spin"), (4, "spin"), (4, "sleep")), tmp_path, 600)
    assert all(results[1]["wsteps"]["converged"])
    assert_same_spread_bits(results)


@pytest.mark.mpi
def test_a_lam_grid_with_the_spread_is_the_lam_grid_without(tmp_path):
    """A lam grid by cross-validation (fold fits and the refit, each point's lam) at P = 2, the spread on and off,
    CG to its residual: the same choice, and scores and W within the fits' tolerance (each W-step stops at a gap of
    1e-6, where another rounding may take a round more or less: 5e-6 apart measured)."""
    path = many_tasks_file(str(tmp_path))
    driver = ("import sys; from hpcmtl.dmtrl import spread, steps; steps.CG_INEXACT_MIN_TASKS = 10 ** 9; "
              "spread.SPREAD_MIN_TASKS = int(sys.argv[1]); from hpcmtl.cli import main; sys.exit(main(sys.argv[2:]))")
    results = {}
    for threshold in (512, 10 ** 9):
        out = tmp_path / f"grid{threshold}.h5"
        cmd = [mpiexec_path(), "-n", "2", sys.executable, "-c", driver, str(threshold), "train", "dmtrl", "--train",
               path, "--out", str(out), "--loss", "squared", "--lam-grid", "1e-3:1e-1:3", "--cv", "2", "--tol", "1e-6",
               "--outer", "2", "--outer-tol", "0", "--quiet", "--force"]
        env = {k: v for k, v in os.environ.items() if k != spread.SPREAD_VARIABLE}
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        results[threshold] = store.read_result(out)
    on, off = results[512], results[10 ** 9]
    assert on["path"]["chosen_index"] == off["path"]["chosen_index"] if "chosen_index" in on["path"] else True
    assert_allclose(on["path"]["validation_score"], off["path"]["validation_score"], rtol=1e-4)
    assert_allclose(on["model"]["W"], off["model"]["W"], rtol=0, atol=1e-4 * np.abs(off["model"]["W"]).max())
