"""Aggregation of the workers' local steps (issue 13): certified, monotone, resumable (bitwise at any rank count:
test_rank_counts.py)."""
import numpy as np
import pytest
from numpy.testing import assert_allclose

from hpcmtl import store
from hpcmtl.baselines import mtrl_central
from hpcmtl.cluster import Cluster
from hpcmtl import dmtrl
from hpcmtl import _sdca
from hpcmtl.dmtrl import margin as dmtrl_margin, steps as dmtrl_steps
from hpcmtl.dmtrl.sigma import RHO_LOW
from hpcmtl.dmtrl import (AGGREGATIONS, DMTRLConfig, box_qp, conjugate_along, coupled_passes, coupled_rho,
                         task_rho_bounds, train)
from hpcmtl.estimators import MemoryTasks
from hpcmtl.losses import conjugate_reference

from conftest import run_hpcmtl, random_tasks
from conftest import wsteps_certified  # noqa: E402

LOSSES = ["hinge", "smoothed-hinge", "squared", "logistic"]


def run(Xs, ys, sigma=None, **kw):
    return train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**kw), sigma_fixed=sigma)


# --- the server's arithmetic -------------------------------------------------------------------------
@pytest.mark.parametrize("loss", LOSSES)
def test_conjugate_along_the_step_is_exact_or_an_upper_bound(loss):
    rng = np.random.default_rng(0)
    y = np.where(rng.uniform(size=40) < 0.5, -1.0, 1.0) if loss != "squared" else rng.normal(size=40)
    box = loss != "squared"
    a = y * rng.uniform(0, 1, size=40) if box else rng.normal(size=40)
    target = y * rng.uniform(0, 1, size=40) if box else rng.normal(size=40)
    delta = target - a
    c1, c2 = conjugate_along(loss, a, delta, y, 0.7)
    for e in np.linspace(0, 1, 11):
        exact = np.sum(conjugate_reference(loss, a + e * delta, y, 0.7) - conjugate_reference(loss, a, y, 0.7))
        model = e * c1 + 0.5 * e * e * c2
        if loss == "logistic":
            assert exact <= model + 1e-12          # the chord bounds a convex function from above
        else:
            assert exact == pytest.approx(model, abs=1e-10)


def test_box_qp_is_optimal_and_never_worse_than_zero():
    rng = np.random.default_rng(1)
    for trial in range(30):
        m = int(rng.integers(1, 12))
        R = rng.normal(size=(m, max(1, m // 2)))
        A = R @ R.T + (np.diag(rng.uniform(0, 1, m)) if trial % 2 else 0)
        g = rng.normal(size=m)
        x = box_qp(A, g, 1.0)
        assert np.all(x >= 0) and np.all(x <= 1)
        value = g @ x - 0.5 * x @ A @ x
        assert value >= 0
        # KKT: no feasible direction gains to first order
        grad = g - A @ x
        assert np.all(grad[x <= 0] <= 1e-7) and np.all(grad[x >= 1] >= -1e-7)
        assert np.all(np.abs(grad[(x > 0) & (x < 1)]) <= 1e-7)
        # against random feasible points
        for _ in range(50):
            z = rng.uniform(0, 1, m)
            assert g @ z - 0.5 * z @ A @ z <= value + 1e-10


def test_box_direction_keeps_the_coordinates_a_whole_further_step_keeps_in_the_box():
    """box_direction decides 'room >= 1' without dividing; the same coordinates and beta_max as the quotients,
    on the box's edges too (alpha at 0 or 1, steps that end exactly on a bound, steps of 1e-300)."""
    from hpcmtl.dmtrl import BETA_CAP, box_direction
    rng = np.random.default_rng(3)
    for trial in range(3000):
        n = int(rng.integers(1, 12))
        y = rng.choice([-1.0, 1.0], n)
        a = y * rng.choice([0.0, 1.0, 0.3, 0.5, 1.0 - 2.0 ** -53], n) * (rng.uniform(0, 1, n) if trial % 2 else 1.0)
        p = y * rng.normal(size=n) * rng.choice([0.0, 1.0, 1e-300, 0.5], n)
        p = np.where(rng.uniform(size=n) < 0.3, y * (1.0 - y * a) * rng.choice([1.0, -1.0]), p)   # to a bound
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            b, yp = y * a, y * p
            room = np.where(yp > 0, (1.0 - b) / yp, np.where(yp < 0, -b / yp, np.inf))
            q, beta_max = box_direction(a, p, y)
        keep = (yp != 0) & (room >= 1.0)
        np.testing.assert_array_equal(q, np.where(keep, p, 0.0))
        assert beta_max == (float(min(BETA_CAP, np.min(room[keep]))) if keep.any() else 0.0)
        end = y * (a + beta_max * q)                            # in the box, up to the rounding of a + beta q
        assert np.all(np.isfinite(end)) and np.all(end >= -1e-15) and np.all(end <= 1.0 + 1e-15)


def test_task_rho_bounds_bound_the_coupling():
    rng = np.random.default_rng(2)
    R = rng.normal(size=(5, 5))
    Sigma = R @ R.T
    bounds = task_rho_bounds(Sigma, [1, 2, 1, 1, 3])
    dB = rng.normal(size=(7, 5))
    lhs = np.trace(dB @ Sigma @ dB.T)
    assert lhs <= np.sum(task_rho_bounds(Sigma) * np.diag(Sigma) * np.sum(dB ** 2, axis=0)) + 1e-12
    assert np.max(bounds) >= 1.0


# --- certificates and dual ascent ----------------------------------------------------------------------
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_dual_never_decreases_and_the_gap_is_a_certificate(loss, aggregation):
    Xs, ys = random_tasks(seed=11, loss=loss, m=6, sparse=loss == "logistic")
    r = run(Xs, ys, loss=loss, lam=0.01, gamma=0.5, tol=1e-7, max_rounds=400, outer=3, outer_tol=0,
            aggregation=aggregation)
    h = r.history
    for p in np.unique(h["outer"]):
        dual = h["dual"][h["outer"] == p]
        scale = np.abs(dual[1:]) + np.abs(h["primal"][h["outer"] == p][1:])
        assert np.all(np.diff(dual) >= -1e-13 * scale), (loss, aggregation, np.min(np.diff(dual)))
    assert np.all(h["primal"] - h["dual"] >= -1e-12 * np.abs(h["primal"]))
    assert np.all(np.isfinite(h["primal"])) and np.all(np.isfinite(h["dual"]))
    if aggregation == "qp":       # dmtrl.coupled_rho: 1 under the diagonal Sigma = I / m, in [1/4, 1] after it
        assert np.all(h["rho"][h["outer"] == 0] == 1)
        assert np.all((h["rho"] >= RHO_LOW) & (h["rho"] <= 1))
    elif aggregation != "safe":
        assert np.all(h["rho"] >= 1)
        if loss != "squared" or aggregation == "line":   # the squared loss's dual has no box: any step is feasible
            assert np.all((h["step"] >= 0) & (h["step"] <= 1))


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_fixed_sigma_optimum_lies_inside_the_certificate(aggregation):
    Xs, ys = random_tasks(seed=12, loss="squared", m=5)
    rng = np.random.default_rng(0)
    R = rng.normal(size=(5, 5))
    Sigma = R @ R.T + 0.5 * np.eye(5)
    Sigma /= np.trace(Sigma)
    cfg = dict(loss="squared", lam=1e-3, tol=1e-9, max_rounds=20000, relationship="fixed")
    a = run(Xs, ys, sigma=Sigma, aggregation=aggregation, **cfg)
    b = mtrl_central(MemoryTasks(Xs, ys), DMTRLConfig(**cfg), sigma_fixed=Sigma)     # exact: a linear system
    assert wsteps_certified(a)
    optimum = b.history["primal"][-1]
    primal, dual = a.history["primal"][-1], a.history["dual"][-1]
    slack = 1e-12 * abs(optimum)
    assert dual - slack <= optimum <= primal + slack



def test_coupled_passes_grow_as_the_other_tasks_explain_less_of_a_task(monkeypatch):
    # floor(1 / (2 (1 - s))) in [1, COUPLED_PASSES_MAX] while s < 1; an uncoupled task (rho = 1) takes
    # UNCOUPLED_PASSES a local step
    assert dmtrl.COUPLED_PASSES_MAX == 2 and dmtrl.UNCOUPLED_PASSES == 2
    cases = {0.5: 1, 0.7: 1, 0.75: 2, 0.8: 2, 5 / 6: 2, 0.95: 2, 1 - 1e-12: 2, 1.0: 2}
    assert {rho: coupled_passes(rho) for rho in cases} == cases
    monkeypatch.setattr(dmtrl_steps, "COUPLED_PASSES_MAX", 4)          # the rule under a higher cap
    cases = {0.5: 1, 0.7: 1, 0.75: 2, 0.8: 2, 5 / 6: 3, 0.86: 3, 0.875: 4, 0.95: 4, 1 - 1e-12: 4, 1.0: 2}
    assert {rho: coupled_passes(rho) for rho in cases} == cases


def weakly_coupled_sigma(m, c):
    """A fixed Sigma with equal off-diagonals c (trace 1): s_i = 1 / (sigma_ii (Sigma^-1)_ii) close to 1 for small c."""
    Sigma = (1 - c) * np.eye(m) + c * np.ones((m, m))
    return Sigma / np.trace(Sigma)


@pytest.mark.parametrize("loss", ["hinge", "logistic"])
def test_weakly_coupled_tasks_take_several_passes_and_reach_the_same_certified_optimum(loss, monkeypatch):
    """'qp' under a Sigma whose tasks explain little of each other (s_i ~ 0.9): every exchanged round takes
    coupled_passes(rho) local passes (COUPLED_PASSES_MAX, 2), the certificate and dual ascent hold, the optimum
    is the one-pass run's within both certificates, and the primal at W(alpha) certifies in fewer rounds.

    That last comparison is without the hinge's margin corrections (MARGIN_NEAR 0, no stall corrections): with
    them the certificate follows the dual, which on these 5 small tasks reaches 1e-9 of its optimum in 97 rounds
    with two passes and 92 with one (certified in 99 and 95); the cap of 2 was chosen on MNIST and MDS, where the
    second pass pays (coupled_passes)."""
    Xs, ys = random_tasks(seed=21, loss=loss, m=5, sparse=loss == "logistic")
    Sigma = weakly_coupled_sigma(5, 0.2)                  # s_i = 0.9
    rho = coupled_rho(Sigma)
    assert np.all((rho > 0.875) & (rho < 1)) and coupled_passes(float(rho[0])) == dmtrl.COUPLED_PASSES_MAX == 2
    passes = []
    kernel = _sdca.sdca_local

    def recording(*args):
        passes.append(args[12])
        return kernel(*args)

    monkeypatch.setattr(_sdca, "sdca_local", recording)
    cfg = dict(loss=loss, lam=1e-3, tol=1e-9, max_rounds=5000, relationship="fixed", local_solver="sdca")
    monkeypatch.setattr(dmtrl_margin, "MARGIN_NEAR", 0.0)
    monkeypatch.setattr(dmtrl_margin, "MARGIN_STALL", 10 ** 9)
    several = run(Xs, ys, sigma=Sigma, **cfg)
    # the first round precedes every APPLY, which brings the blocks their task's rho: rho 1, UNCOUPLED_PASSES
    assert passes[:5] == [2.0] * 5 and set(passes[5:]) == {2.0} and len(passes) > 5
    passes.clear()
    monkeypatch.setattr(dmtrl_steps, "COUPLED_PASSES_MAX", 1)
    monkeypatch.setattr(dmtrl_steps, "UNCOUPLED_PASSES", 1)
    one = run(Xs, ys, sigma=Sigma, **cfg)
    assert set(passes) == {1.0}
    for r in (several, one):
        h = r.history
        assert wsteps_certified(r) and np.all(np.isfinite(h["primal"])) and np.all(np.isfinite(h["dual"]))
        assert np.all(h["primal"] - h["dual"] >= -1e-12 * np.abs(h["primal"]))
        assert np.all(np.diff(h["dual"]) >= -1e-13 * (np.abs(h["dual"][1:]) + np.abs(h["primal"][1:])))
    gaps = sum(r.history["primal"][-1] - r.history["dual"][-1] for r in (several, one))
    assert abs(several.history["primal"][-1] - one.history["primal"][-1]) <= gaps + 1e-14
    assert several.n_rounds < one.n_rounds


def test_split_tasks_and_other_aggregations_keep_local_iters():
    """``local_passes``: ``--local-iters`` times coupled_passes(rho) under 'qp' for a task's only block; a block of a
    task cut into several (the plan, the same at every rank count) and 'adaptive' / 'line' keep ``--local-iters``."""
    from types import SimpleNamespace
    from hpcmtl.cluster import Cluster
    from hpcmtl.dmtrl import LocalBlocks
    Xs, ys = random_tasks(seed=22, m=3)
    tasks = MemoryTasks(Xs, ys)
    blocks = [tasks.read_task(i) for i in range(3)]
    for aggregation, expected in (("qp", [3.0, 3.0, 3.0]), ("adaptive", [1.5] * 3), ("line", [1.5] * 3)):
        local = LocalBlocks(Cluster.serial(), blocks, DMTRLConfig(aggregation=aggregation, local_iters=1.5))
        local.rho_block[:] = 0.9
        assert [local.local_passes(k) for k in range(3)] == expected, aggregation
    cluster = Cluster.serial()
    cluster.blocks = [SimpleNamespace(task=t) for t in (0, 1, 2, 2)]        # the plan: task 2 in two blocks
    local = LocalBlocks(cluster, blocks[:2], DMTRLConfig(local_iters=1.5))
    assert local.whole_task.tolist() == [True, True]
    cluster.blocks = [SimpleNamespace(task=t) for t in (0, 0, 1, 2)]        # task 0 in two blocks
    local = LocalBlocks(cluster, blocks[:2], DMTRLConfig(local_iters=1.5))
    local.rho_block[:] = 0.9
    assert local.whole_task.tolist() == [False, True]
    assert [local.local_passes(k) for k in range(2)] == [1.5, 3.0]
    local.rho_block[:] = 0.7                                                # s <= 3/4: one pass
    assert [local.local_passes(k) for k in range(2)] == [1.5, 1.5]
    local.rho_block[:] = 1.0                                                # nothing couples: UNCOUPLED_PASSES
    assert [local.local_passes(k) for k in range(2)] == [1.5, 3.0]
    local = LocalBlocks(Cluster.serial(), [], DMTRLConfig())                 # a rank without blocks
    assert local.whole_task.size == 0

def test_learned_sigma_matches_centralized_mtrl_within_the_certificate():
    """The engine and the centralized MTRL run the same outer loop to the same certified optimum: their joint
    objectives agree within the sum of their joint gaps, and both certificates are tight."""
    Xs, ys = random_tasks(seed=13, loss="squared", m=6)
    cfg = dict(loss="squared", lam=1e-2, tol=1e-10, max_rounds=5000, outer=60, outer_tol=1e-5)
    a = run(Xs, ys, **cfg)
    b = mtrl_central(MemoryTasks(Xs, ys), DMTRLConfig(**cfg))
    assert a.converged and b.converged and a.wsteps["converged"].all()
    p_a, p_b = a.wsteps["joint_primal"][-1], b.wsteps["joint_primal"][-1]
    assert abs(p_a - p_b) <= 1e-5 * abs(p_b)
    assert a.wsteps["joint_dual"][-1] <= p_b * (1 + 1e-12) and b.wsteps["joint_dual"][-1] <= p_a * (1 + 1e-12)
    assert_allclose(a.W, b.W, atol=1e-4 * np.abs(b.W).max())


@pytest.mark.slow
def test_faster_than_the_safe_rule_on_coupled_tasks():
    Xs, ys = random_tasks(seed=14, loss="squared", m=8)
    cfg = dict(loss="squared", lam=1e-3, tol=1e-8, max_rounds=20000, outer=4, outer_tol=0)
    safe = run(Xs, ys, aggregation="safe", **cfg)
    fast = run(Xs, ys, **cfg)
    assert wsteps_certified(safe) and wsteps_certified(fast)
    assert fast.n_rounds * 2 <= safe.n_rounds
    # the outer paths differ (each prox step is the best of a few): the joint objectives agree within the certificates
    p_fast, p_safe = fast.wsteps["joint_primal"][-1], safe.wsteps["joint_primal"][-1]
    assert safe.wsteps["joint_dual"][-1] <= p_fast and fast.wsteps["joint_dual"][-1] <= p_safe


def test_unconverged_w_steps_are_reported_each_and_in_the_result():
    Xs, ys = random_tasks(seed=15, loss="hinge", m=4)
    heard = []
    r = train(Cluster.serial(), MemoryTasks(Xs, ys),
              DMTRLConfig(loss="hinge", lam=1e-3, tol=1e-12, max_rounds=5, outer=3, outer_tol=0, local_steps=1,
                          local_solver="sdca"),
              warn=heard.append)      # (local SDCA, one local step a round: the first W-step must not reach tol)
    assert not r.converged
    assert len(heard) == 4 and all("ended unconverged" in h for h in heard[:3])
    assert "joint relative gap" in heard[3] and "--outer 3 W-steps" in heard[3]     # outer_tol 0: never certified
    assert r.wsteps["outer"].tolist() == [0, 1, 2] and r.wsteps["round"].tolist() == [5, 10, 15]
    assert not r.wsteps["converged"].any() and np.all(r.wsteps["rel_gap"] > 1e-12)
    with pytest.warns(UserWarning, match="W-step 1 ended unconverged at round 5"):
        run(Xs, ys, loss="hinge", lam=1e-3, tol=1e-12, max_rounds=5, outer=1, local_steps=1, local_solver="sdca")


# --- real mpiexec runs ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    d = tmp_path_factory.mktemp("agg")
    tr = d / "tr.h5"
    r = run_hpcmtl(["data", "synth", "dmtrl1", tr, "--scale", "0.04", "--seed", "5"])
    assert r.returncode == 0, r.stderr
    return tr


def train_args(tr, out, *extra):
    return ["train", "dmtrl", "--train", tr, "--out", out, "--loss", "hinge", "--lam", "1e-3",
            "--tol", "1e-6", "--outer", "3", "--outer-tol", "0", "--quiet", "--force", *extra]


@pytest.mark.mpi
def test_checkpoint_resume_is_bitwise_with_the_aggregation_state(synth, tmp_path):
    ref_out, out = tmp_path / "ref.h5", tmp_path / "r.h5"
    sdca = ["--local-solver", "sdca"]     # (what 'auto' takes on these 84-row tasks; test_exact_box: the exact steps)
    r = run_hpcmtl(train_args(synth, ref_out, *sdca), n_ranks=3, timeout=300)
    assert r.returncode == 0, r.stderr
    ref = store.read_result(ref_out)
    assert ref["history"]["round"][-1] > 40
    args = train_args(synth, out, "--checkpoint-every", "7", *sdca)
    r = run_hpcmtl(args, n_ranks=3, env={"HPCMTL_FAULT": "1:40:kill"}, timeout=120)
    assert r.returncode != 0 and not out.exists()
    ck = store.read_checkpoint(str(out) + ".checkpoint.h5")
    assert ck["counters"]["round"] == 35 and "rho_task" in ck["arrays"] and "step" in ck["arrays"]
    r = run_hpcmtl(args + ["--resume"], n_ranks=2, timeout=300)              # another rank count
    assert r.returncode == 0, r.stderr
    res = store.read_result(out)
    assert res["model"]["W"].tobytes() == ref["model"]["W"].tobytes()
    assert res["model"]["Sigma"].tobytes() == ref["model"]["Sigma"].tobytes()
    for key in ("round", "primal", "dual", "step", "rho"):
        assert res["history"][key].tobytes() == ref["history"][key].tobytes(), key
    for key in ("outer", "round", "rel_gap", "converged", "joint_primal", "joint_dual", "joint_rel_gap", "prox_step"):
        assert res["wsteps"][key].tobytes() == ref["wsteps"][key].tobytes(), key     # joint: prox center, floor kept
    # another aggregation cannot continue this checkpoint
    r = run_hpcmtl(train_args(synth, out, "--aggregation", "safe", "--resume", *sdca), n_ranks=2)
    assert r.returncode == 2 and "'aggregation' is" in r.stderr


@pytest.mark.mpi
def test_unconverged_run_warns_and_stores_status(synth, tmp_path):
    out = tmp_path / "r.h5"
    r = run_hpcmtl(["train", "dmtrl", "--train", synth, "--out", out, "--lam", "1e-3", "--tol", "1e-12",
                    "--max-rounds", "4", "--outer", "3", "--outer-tol", "0", "--log-level", "warning",
                    "--local-steps", "1", "--local-solver", "sdca"], n_ranks=2)
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("hpcmtl: warning:")]
    # one per W-step, the outer loop's (--outer-tol 0 is never certified), then the two of the end
    assert len(warnings) == 6, r.stderr
    assert all("ended unconverged" in w for w in warnings[:3]) and "joint relative gap" in warnings[3]
    assert "3 of 3 W-steps ended unconverged" in warnings[-2] and "joint relative gap" in warnings[-1]
    assert "NOT converged" in r.stdout
    res = store.read_result(out)
    assert res["model"]["converged"] == 0 and res["wsteps"]["converged"].tolist() == [0, 0, 0]
    assert res["wsteps"]["round"].tolist() == [4, 8, 12]
