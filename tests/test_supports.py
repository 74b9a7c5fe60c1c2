"""Sparse supports in the DMTRL exchange and the server's algebra on task supports (issue 14).

A round moves delta b up and w down only on each block's support.  When the task supports are sparse enough
(:func:`hpcmtl.taskspace.support_algebra_pays`, true for every sparse problem here) the server also keeps B, W
and dP on the task supports (:class:`hpcmtl.taskspace.SupportSpace`): another summation order, so the results
match the dense exchange to rounding (W to 1e-10 relative where the trajectory is the same, within the duality
certificates where the box losses' active sets amplify the rounding), and are bitwise the same at every rank
count, with split tasks, with centered and augmented intercepts, and across a checkpoint and resume."""
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from hpcmtl import dmtrl, store, synthetic, taskspace
from hpcmtl.dmtrl import interior_rounds as dmtrl_interior_rounds, supports as dmtrl_supports
from hpcmtl.cluster import Cluster
from hpcmtl.dmtrl import DMTRLConfig, SupportLayout, train
from hpcmtl.estimators import MemoryTasks
from hpcmtl.taskdata import TaskBlock
from hpcmtl.taskspace import SupportSpace

from conftest import assert_resume_is_bitwise, metrics_during_and_after, run_hpcmtl
from conftest import wsteps_certified  # noqa: E402

SIZES = (200, 30, 40, 25, 35, 20)      # task 0 is larger than a worker's share at P = 3: --split-tasks cuts it


def sparse_tasks(sizes=SIZES, d=3000):
    """Tasks of a few hundred features each out of d (Zipf vocabularies), of unequal sizes."""
    (Xs, ys, _), _, _ = synthetic.sparse_vocabulary(seed=0, m=len(sizes), d=d, vocabulary=300,
                                                    n_per_task=max(sizes), words=20)
    return [X[:n] for X, n in zip(Xs, sizes)], [y[:n] for y, n in zip(ys, sizes)]


def fit(Xs, ys, supports=True, **kw):
    """In one process; ``supports=False``: auto as it was before supports (dense rows, every block computed on
    all d columns: no block has a support to exchange on).  ``result.extra["space"]``: whether the server's
    algebra ran on the task supports."""
    original = dmtrl_supports.exchange_index
    if not supports:
        dmtrl_supports.exchange_index = lambda block, d: None
    made = []

    def server_class(*args, **kwargs):
        made.append(dmtrl.Server(*args, **kwargs))
        return made[-1]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**kw), server_class=server_class)
    finally:
        dmtrl_supports.exchange_index = original
    result.extra["space"] = made[0].space.sparse
    return result


def assert_certified_alike(after, before, exact):
    """``after`` (support algebra) and ``before`` (dense): both certified, their [dual, primal] intervals of
    the last W-step overlapping (both hold the optimum), and W alike: to 1e-9 relative when ``exact`` (the
    same trajectory, another summation order), else within what the certificates allow: the W-step's
    objective is lam-strongly convex in the Omega-norm, so ``||W_a - W_b||_Omega <= sqrt(2 gap_a / lam) +
    sqrt(2 gap_b / lam)`` (a factor 2 of slack: the two Sigmas differ by rounding,
    or, where only the dense run took margin corrections (dmtrl.margin_correction), by the earlier W-steps'
    certified models: the intervals then overlap within --tol)."""
    for r in (after, before):
        assert np.all(np.isfinite(r.W)) and np.all(np.isfinite(r.history["primal"]))
        assert np.isfinite(r.history["rel_gap"][-1]) and r.history["rel_gap"][-1] <= r.config["tol"]
    pa, da = after.history["primal"][-1], after.history["dual"][-1]
    pb, db = before.history["primal"][-1], before.history["dual"][-1]
    slack = (1e-9 if exact else after.config["tol"]) * max(abs(pa), abs(pb))
    assert pa >= db - slack and pb >= da - slack, (pa, da, pb, db)
    scale = np.max(np.abs(before.W))
    assert scale > 0
    if exact:
        # (1e-9: a learned Sigma's prox step and floor follow the joint gap, which carries the rounding along)
        assert np.max(np.abs(after.W - before.W)) <= 1e-9 * scale
        assert np.max(np.abs(after.intercept - before.intercept)) <= 1e-9 * max(np.max(np.abs(before.intercept)), 1.0)
        assert np.max(np.abs(after.Sigma - before.Sigma)) <= 1e-9 * np.max(np.abs(before.Sigma))
        return
    lam = after.config["lam"]
    omega = np.linalg.inv(before.Sigma)
    diff = np.vstack([after.W - before.W, (after.intercept - before.intercept)[None, :]])
    dist = np.sqrt(max(float(np.sum((diff @ omega) * diff)), 0.0))
    bound = np.sqrt(2 * (pa - da) / lam) + np.sqrt(2 * (pb - db) / lam)
    assert np.isfinite(dist) and dist <= 2 * bound, (dist, bound)


def test_layout_packs_each_blocks_support_and_restores_the_rows():
    d = 7
    layout = SupportLayout([np.array([1, 4]), np.zeros(0, dtype=np.int64), np.arange(d)], d)
    rows = np.zeros((3, 2 * d + 2))
    rows[0, [1, 4, d + 1, d + 4]] = (1.0, 2.0, 3.0, 4.0)
    rows[2, :2 * d] = np.arange(2 * d) + 10.0
    rows[:, 2 * d:] = [[5.0, 6.0], [7.0, 8.0], [9.0, -1.0]]
    flat = layout.pack(rows, 2)
    assert flat.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0] + list(np.arange(2 * d) + 10.0) + [9.0, -1.0]
    assert layout.rows(flat, 2, 2).tobytes() == rows.tobytes()
    with pytest.raises(ValueError):
        layout.rows(flat[:-1], 2, 2)


def test_a_blocks_support_is_what_its_rows_touch_with_the_mean_and_the_intercept_feature():
    X = sp.csr_matrix(np.array([[0.0, 2.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 3.0]]))
    blk = TaskBlock(0, "t", 2, 0, X, np.array([1.0, -1.0]))
    assert blk.support.tolist() == [1, 4] and blk.support.dtype == np.int64
    assert blk.augmented(1.0).support.tolist() == [1, 4, 5]                 # the constant column d
    mu = np.array([0.5, 0.0, 0.0, 0.25, 0.0])                              # the whole task's mean (split task)
    assert blk.centered(mu, 0.0).support.tolist() == [0, 1, 3, 4]
    assert TaskBlock(0, "t", 2, 0, X.toarray(), np.ones(2)).support.tolist() == list(range(5))   # dense rows
    empty = TaskBlock(0, "t", 2, 0, sp.csr_matrix((2, 5)), np.ones(2))
    assert empty.support.size == 0


# the box losses' shrinking and QP active sets turn rounding into another (certified) trajectory
SAME_TRAJECTORY = {"squared", "logistic", "smoothed-hinge"}


@pytest.mark.parametrize("loss,aggregation,intercept", [
    ("hinge", "qp", True), ("hinge", "qp", False), ("hinge", "safe", True), ("hinge", "line", True),
    ("hinge", "adaptive", True), ("squared", "qp", True), ("squared", "qp", False), ("squared", "safe", True),
    ("squared", "line", True), ("squared", "adaptive", True), ("logistic", "line", True),
    ("logistic", "qp", True), ("logistic", "safe", True), ("logistic", "adaptive", True),
    ("smoothed-hinge", "adaptive", True)])
def test_support_algebra_matches_the_dense_rows(loss, aggregation, intercept):
    Xs, ys = sparse_tasks()
    # (the box losses without the joint stop: their rounding gives another certified trajectory, and the hinge's
    # dual phase then may pick another W for the last Omega-step, whose W-step need not share the dense one's optimum)
    kw = dict(loss=loss, aggregation=aggregation, fit_intercept=intercept, lam=1e-2, tol=1e-6, outer=3,
              max_rounds=300, **({} if loss in SAME_TRAJECTORY else {"outer_tol": 0.0}))
    before, after = fit(Xs, ys, supports=False, **kw), fit(Xs, ys, **kw)
    assert after.extra["space"] and not before.extra["space"]
    assert_certified_alike(after, before, loss in SAME_TRAJECTORY)


def alike_tasks(loss, m=4):
    """Tasks whose blocks all have narrow supports (the exchange on supports) but with sum_f c_f^2 above m^2 d / 8:
    the server stays dense."""
    rng = np.random.default_rng(7)
    Xs = [sp.random(30, 200, density=0.015, random_state=i, format="csr") for i in range(m)]
    return Xs, [np.sign(rng.normal(size=30)) if loss != "squared" else rng.normal(size=30) for _ in Xs]


@pytest.mark.parametrize("loss,aggregation", [("hinge", "qp"), ("hinge", "adaptive")])
def test_supports_too_alike_with_box_momentum_match_the_dense_rows_within_the_certificates(loss, aggregation):
    # box momentum on supports: the server rebuilds X^T q / n as dP minus the rows the box removed
    # (test_the_box_momentum_direction_rebuilt_on_the_server_is_the_workers), another order of arithmetic
    Xs, ys = alike_tasks(loss)
    kw = dict(loss=loss, aggregation=aggregation, lam=1e-2, tol=1e-6, outer=3, max_rounds=300)
    before, after = fit(Xs, ys, supports=False, **kw), fit(Xs, ys, **kw)
    assert not after.extra["space"]
    assert_certified_alike(after, before, False)


@pytest.mark.parametrize("loss,aggregation", [("squared", "qp"), ("logistic", "safe"), ("smoothed-hinge", "line")])
def test_supports_too_alike_for_the_support_algebra_give_the_dense_rows_bitwise(loss, aggregation):
    # the server's arithmetic in the same order as the dense exchange's (no box momentum: its direction is
    # rebuilt on the server)
    Xs, ys = alike_tasks(loss)
    kw = dict(loss=loss, aggregation=aggregation, lam=1e-2, tol=1e-6, outer=3, max_rounds=300)
    before, after = fit(Xs, ys, supports=False, **kw), fit(Xs, ys, **kw)
    assert not after.extra["space"] and np.all(np.isfinite(after.W)) and after.history["rel_gap"][-1] <= 1e-6
    assert after.W.tobytes() == before.W.tobytes() and after.Sigma.tobytes() == before.Sigma.tobytes()
    assert after.intercept.tobytes() == before.intercept.tobytes()
    for key in ("primal", "dual", "step"):
        assert after.history[key].tobytes() == before.history[key].tobytes(), key


def test_edges_an_empty_support_a_task_of_one_row_and_one_feature():
    rng = np.random.default_rng(4)
    d = 200
    Xs = [sp.random(30, d, density=0.01, random_state=1, format="csr"), sp.csr_matrix((20, d)),     # all-zero rows
          sp.random(1, d, density=0.05, random_state=2, format="csr"), sp.random(25, d, density=0.01, random_state=3,
                                                                                  format="csr")]
    ys = [np.sign(rng.normal(size=X.shape[0])) + (np.sign(rng.normal(size=X.shape[0])) == 0) for X in Xs]
    for loss, intercept in (("hinge", False), ("hinge", True), ("squared", True), ("logistic", True)):
        kw = dict(loss=loss, fit_intercept=intercept, lam=1e-2, tol=1e-6, outer=2, max_rounds=300)
        before, after = fit(Xs, ys, supports=False, **kw), fit(Xs, ys, **kw)
        assert after.extra["space"], (loss, intercept)
        assert_certified_alike(after, before, loss != "hinge")
    one = [sp.csr_matrix(rng.normal(size=(n, 1))) for n in (5, 8)]        # d = 1: the support is all d (exchanged whole)
    y1 = [rng.normal(size=5), rng.normal(size=8)]
    before, after = fit(one, y1, supports=False, loss="squared"), fit(one, y1, loss="squared")
    assert not after.extra["space"] and after.W.tobytes() == before.W.tobytes()


def dense_tasks(m=5, d=12):
    rng = np.random.default_rng(11)
    Xs = [rng.normal(size=(int(n), d)) for n in rng.integers(20, 40, size=m)]
    return Xs, [np.where(X @ rng.normal(size=d) + rng.normal(size=X.shape[0]) > 0, 1.0, -1.0) for X in Xs]


@pytest.mark.parametrize("tasks", ["sparse", "alike", "dense"])
@pytest.mark.parametrize("loss", ["hinge", "smoothed-hinge", "logistic"])
def test_the_box_momentum_direction_on_the_server_is_the_workers_every_round(tasks, loss, monkeypatch):
    """Every exchanging round: the server's ``X^T q / n`` per task (its dP, with what the workers sent where
    they differ) is within ``DIRECTION_ULPS`` ulps of the workers' own, on the support space and the dense
    one, dense blocks too (on all d), and the workers send far fewer numbers than the whole direction."""
    Xs, ys = {"sparse": sparse_tasks, "alike": lambda: alike_tasks(loss, m=5), "dense": dense_tasks}[tasks]()
    direct, rebuilt, sent, whole = [], [], [0], [0]
    on_support = dmtrl.LocalBlocks.trial_momentum_on_support
    gather = dmtrl.Server.gather_trial_momentum

    def worker(self, ctrl, inputs):
        mirror = [(np.zeros(1) if dp is None else dp.copy(), np.zeros(1) if b is None else b.copy())
                  for dp, b in zip(self.dp_mirror, self.b_mirror)]
        out = on_support(self, ctrl, inputs)
        exact = [self.on_exchange(k, blk.rmatvec_sparse(self.pending_q[k]) / blk.n_task)   # as the worker computes it
                 for k, blk in enumerate(self.blocks)]
        beta_max = [dmtrl.box_direction(st.alpha, p, blk.y)[1]
                    for st, p, blk in zip(self.state, self.previous, self.blocks)]
        tolerance = [dmtrl.direction_tolerance(e, dp, b, bm) for e, (dp, b), bm in zip(exact, mirror, beta_max)]
        direct.append(list(zip(exact, tolerance)))
        sent[0] += out.size - sum(self.support_sizes + 6)
        whole[0] += int(sum(self.support_sizes))
        assert tasks != "dense" or all(f is None for f in self.features)       # dense blocks: on all d
        return out

    def server(self, scalars):
        vecs, block_scalars = gather(self, scalars)
        dense = self.space.dense(vecs[1])
        rebuilt.append([dense[self.block_task[k], self.direction_layout.index[k]] for k in range(len(self.blocks))])
        return vecs, block_scalars

    monkeypatch.setattr(dmtrl.LocalBlocks, "trial_momentum_on_support", worker)
    monkeypatch.setattr(dmtrl.Server, "gather_trial_momentum", server)
    # the momentum rounds of coupled W-steps, which interior-point rounds take over at this small d
    monkeypatch.setattr(dmtrl_interior_rounds, "uses_interior_point", lambda *args: False)
    # --outer-tol 0: six W-steps of momentum rounds (the accelerated outer step would certify in fewer)
    result = fit(Xs, ys, loss=loss, lam=1e-2, tol=1e-9, outer=6, outer_tol=0.0, max_rounds=500)
    assert result.extra["space"] == (tasks == "sparse") and result.history["rel_gap"][-1] <= 1e-9
    assert len(direct) == len(rebuilt) >= 10
    for ours, theirs in zip(rebuilt, direct):          # one block a task
        for a, (b, tolerance) in zip(ours, theirs):
            assert np.all(np.isfinite(a)) and a.shape == b.shape and tolerance < 1e-12
            assert np.all(np.abs(a - b) <= tolerance)
    # dense rows: a removed row touches every feature, so only rounds without one save the direction
    assert 0 < sent[0] < (0.9 if tasks == "dense" else 0.5) * whole[0], (sent, whole)


def test_a_direction_is_sent_where_it_differs_from_dp_or_whole_whichever_is_shorter():
    encode = dmtrl.encode_direction
    sent, used = encode(np.zeros(0), np.zeros(0), np.zeros(0), 0.0)         # an empty support
    assert sent.tolist() == [-1.0] and used.size == 0
    dp = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    sent, used = encode(dp.copy(), dp, np.zeros(5), 0.0)                     # no row removed: only c = 0
    assert sent.tolist() == [0.0] and used.tolist() == dp.tolist()
    sent, used = encode(dp * (1 + 4 * np.finfo(float).eps), dp, np.zeros(5), 0.0)   # within the ulps: kept
    assert sent.tolist() == [0.0] and used.tolist() == dp.tolist()
    q = np.array([1.0, 0.5, 3.0, 4.0, 5.0])                                # a removed row touched feature 1
    sent, used = encode(q, dp, np.zeros(5), 0.0)
    assert sent.tolist() == [1.0, 1.0, 0.5] and used.tolist() == q.tolist()
    q = np.array([0.0, 0.0, 0.0, 0.0, 0.0])                                # every position: sent whole
    sent, used = encode(q, dp, np.zeros(5), 0.0)
    assert sent.tolist() == [-1.0] + q.tolist() and used is q
    q = np.array([0.0, 0.0, 0.0, 4.0, 5.0])                                # 3 of 5: a mask (1 number) is shorter
    sent, used = encode(q, dp, np.zeros(5), 0.0)
    assert sent[0] == -2.0 and sent[2:].tolist() == [0.0, 0.0, 0.0] and used.tolist() == q.tolist()
    assert dmtrl.mask_positions(sent[1:2], 5).tolist() == [0, 1, 2]
    # not finite: sent whole (and caught by the server's finite check)
    sent, used = encode(np.array([np.nan, 2.0, 3.0, 4.0, 5.0]), dp, np.zeros(5), 0.0)
    assert sent[0] == -1.0 and np.isnan(sent[1]) and sent[2:].tolist() == dp[1:].tolist() and np.isnan(used[0])
    sent, used = encode(np.array([3.0]), np.zeros(1), np.zeros(1), 0.0)     # one feature
    assert sent.tolist() == [-1.0, 3.0]
    # many positions of a long support: a bit mask (64 positions a number) and their values
    dp2 = np.arange(200.0)
    q2 = dp2.copy()
    q2[::3] = -1.0                                                            # 67 of 200
    sent, used = encode(q2, dp2, np.zeros(200), 0.0)
    assert sent[0] == -2.0 and sent.size == 1 + 4 + 67 and used.tolist() == q2.tolist()
    assert dmtrl.mask_positions(sent[1:5], 200).tolist() == list(range(0, 200, 3))
    assert sent[5:].tolist() == [-1.0] * 67
    q2[1::3] = -1.0                                                           # 134 of 200: still 4 + 134 < 200
    sent, used = encode(q2, dp2, np.zeros(200), 0.0)
    assert sent[0] == -2.0 and sent.size == 1 + 4 + 134
    q2[:] = -1.0                                                              # all: whole
    assert encode(q2, dp2, np.zeros(200), 0.0)[0].tolist() == [-1.0] + q2.tolist()
    # B's scale: a difference below the ulps of |B| / beta_max cannot move B by more than its rounding
    b = np.array([0.0, 2.0 ** 40, 0.0, 0.0, 0.0])
    far = dp + np.array([0.0, 0.0, 2.0 ** -12, 0.0, 0.0])
    assert encode(far, dp, b, 4.0)[0].tolist() == [0.0]                     # 8 ulps of 2^38 = 2^-11: kept
    assert encode(far, dp, b, 4096.0)[0].tolist() == [1.0, 2.0, far[2]]     # 8 ulps of 2^28 = 2^-21: sent


# ---------------------------------------------------------------------------
# Through mpiexec: bytes per round, split tasks, resume
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    Xs, ys = sparse_tasks()
    path = tmp_path_factory.mktemp("supports") / "sparse.h5"
    store.write_tasks(path, Xs, ys, force=True)
    # sum over tasks of |support| (one block a task); hinge adds the augmented feature to each
    return path, sum(int(np.unique(X.indices).size) for X in Xs), len(Xs), Xs[0].shape[1]


def args_of(path, out, loss, *extra):
    return ["train", "dmtrl", "--train", path, "--out", out, "--loss", loss, "--lam", "1e-2", "--tol", "1e-6",
            "--outer", "3", "--outer-tol", "0", "--quiet", "--force", *extra]


def run(path, tmp_path, name, loss, ranks, *extra, env=None):
    out = tmp_path / f"{name}.h5"
    r = run_hpcmtl(args_of(path, out, loss, *extra), n_ranks=ranks, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return store.read_result(out)


def assert_files_alike(a, b, exact=True):
    """Two result files' models: W (and the intercepts) to 1e-10 relative (``exact``: the same trajectory), or
    within the certificates (the final [dual, primal] intervals overlap within the runs' --tol: where only one
    run took margin corrections, its earlier W-steps' certified models, and with them its Sigma, differ; W
    within a small relative distance)."""
    Wa, Wb = a["model"]["W"], b["model"]["W"]
    assert np.all(np.isfinite(Wa)) and np.all(np.isfinite(Wb)) and wsteps_certified(a)
    pa, da, pb, db = (h["history"][k][-1] for h in (a, b) for k in ("primal", "dual"))
    assert np.all(np.isfinite([pa, da, pb, db]))
    slack = (1e-9 if exact else a["config"]["tol"]) * max(abs(pa), abs(pb))
    assert pa >= db - slack and pb >= da - slack, (pa, da, pb, db)
    tol = 1e-10 if exact else 1e-2
    assert np.max(np.abs(Wa - Wb)) <= tol * np.max(np.abs(Wb))
    assert np.max(np.abs(a["model"]["intercept"] - b["model"]["intercept"])) <= tol * max(
        np.max(np.abs(b["model"]["intercept"])), 1.0)


def per_round(h, rows=None):
    rows = np.ones(h["round"].size, dtype=bool) if rows is None else rows
    return np.median((np.diff(h["bytes"]) / np.diff(h["round"]))[rows[1:]])


@pytest.mark.mpi
def test_squared_rounds_move_the_supports_only_and_match_the_dense_exchange(data, tmp_path):
    path, support, m, d = data
    runs = {(ex, p): run(path, tmp_path, f"sq-{ex}-{p}", "squared", p, "--exchange", ex)
            for ex, p in (("auto", 3), ("dense", 3), ("auto", 1))}
    ref = runs["dense", 3]
    assert wsteps_certified(ref)
    # no local rounds for the squared loss: the same trajectory, the server's sums in another order
    # (P = 1: test_support_algebra_matches_the_dense_rows), and bitwise the same at P = 1 and 3
    assert_files_alike(runs["auto", 3], ref)
    assert runs["auto", 3]["model"]["W"].tobytes() == runs["auto", 1]["model"]["W"].tobytes()
    for key in ("primal", "dual", "step"):
        assert runs["auto", 3]["history"][key].tobytes() == runs["auto", 1]["history"][key].tobytes(), key
    # the target: one vector up (delta b, 5 scalars) and one down (w, 3 scalars) on the supports
    auto, dense = per_round(runs["auto", 3]["history"]), per_round(runs["dense", 3]["history"])
    assert np.isfinite(auto) and np.isfinite(dense)
    assert 2 * 8 * support <= auto <= 1.1 * 2 * 8 * support + 64 * 1024
    assert dense >= 2 * 8 * d * m > 5 * auto
    # split tasks (task 0 cut in two at P = 3: its blocks carry the whole task's support, the mean's)
    split = {ex: run(path, tmp_path, f"sq-split-{ex}", "squared", 3, "--exchange", ex, "--split-tasks")
             for ex in ("auto", "dense")}
    assert_files_alike(split["auto"], split["dense"])
    assert per_round(split["auto"]["history"]) < per_round(split["dense"]["history"]) / 5


@pytest.mark.mpi
def test_dense_tasks_keep_the_dense_exchange_and_its_bytes(tmp_path):
    rng = np.random.default_rng(5)
    d, m = 40, 4
    Xs = [rng.normal(size=(n, d)) for n in (20, 30, 25, 15)]
    ys = [X @ rng.normal(size=d) + 0.1 * rng.normal(size=X.shape[0]) for X in Xs]
    path = tmp_path / "dense.h5"
    store.write_tasks(path, Xs, ys, force=True)
    runs = {ex: run(path, tmp_path, f"dense-{ex}", "squared", 3, "--exchange", ex) for ex in ("auto", "dense")}
    auto, dense = runs["auto"], runs["dense"]
    assert auto["model"]["W"].tobytes() == dense["model"]["W"].tobytes()
    assert np.array_equal(auto["history"]["round"], dense["history"]["round"])
    # the same collectives every round; once, GET_SUPPORTS: one number a block ([-1]: exchanged whole), each
    # rank's count of them (8 bytes a rank, P = 3) and its control
    assert np.all(auto["history"]["bytes"] - dense["history"]["bytes"] == 8 * m + 8 * 3 + 32 * 2)


@pytest.mark.mpi
def test_resume_on_supports_is_bitwise_at_another_rank_count(data, tmp_path):
    path = data[0]
    # smoothed hinge: the first W-step (Sigma = I/m) runs local rounds (one local step a round), the later rounds
    # exchange on supports (and take dmtrl.coupled_passes local passes: the blocks' rho comes back on resume)
    more = ("--tol", "1e-9", "--local-steps", "1", "--outer", "14")
    ref = run(path, tmp_path, "ref", "smoothed-hinge", 3, *more)
    assert ref["history"]["round"][-1] > 35 and ref["history"]["outer"][ref["history"]["round"] == 30] >= 1
    out = tmp_path / "r.h5"
    assert_resume_is_bitwise(args_of(path, out, "smoothed-hinge", "--checkpoint-every", "5", *more), out, ref, 33, 30)


@pytest.mark.mpi
def test_test_rows_off_the_supports_are_scored_with_the_whole_w(tmp_path):
    """Workers compute on their blocks' support columns; test rows touch other features too.  The test metrics
    reported during training equal `hpcmtl evaluate` on the saved model: learned Sigma (w is pushed whole at the
    end), STL (local rounds only: w = sigma_ii b / lam vanishes off the support), the centered squared loss."""
    (Xs, ys, _), (Xt, yt, _), _ = synthetic.sparse_vocabulary(seed=2, m=5, d=3000, vocabulary=300, n_per_task=60,
                                                               words=20, test_fraction=0.5)
    train_path, test_path = tmp_path / "train.h5", tmp_path / "test.h5"
    store.write_tasks(train_path, Xs, ys, force=True)
    store.write_tasks(test_path, Xt, yt, force=True)
    off = sum(np.setdiff1d(np.unique(T.indices), np.unique(X.indices)).size for X, T in zip(Xs, Xt))
    assert off > 0                                                # test rows do touch features off the supports
    for method, loss in (("dmtrl", "hinge"), ("stl", "hinge"), ("dmtrl", "squared")):
        out = tmp_path / f"{method}-{loss}.h5"
        args = ["train", method, "--train", train_path, "--test", test_path, "--out", out, "--loss", loss,
                "--lam", "1e-2", "--tol", "1e-6", "--outer", "2", "--quiet", "--force"]
        during, after = metrics_during_and_after(args, out, test_path, 3)
        key = "task_mean_error_rate" if loss == "hinge" else "task_mean_rmse"
        assert np.isfinite(after[key]) and during[key] == pytest.approx(after[key], rel=1e-12, abs=1e-12), \
            (method, loss)


# ---------------------------------------------------------------------------
# The server's task space: compact operations against dense NumPy on random sparse patterns
# ---------------------------------------------------------------------------
from hypothesis import given, settings, strategies as st  # noqa: E402


@st.composite
def spaces(draw):
    """A SupportSpace over random supports (some empty), random blocks cutting the tasks, values, Sigma."""
    m, d = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    supports = [np.flatnonzero(draw(st.lists(st.booleans(), min_size=d, max_size=d))) for _ in range(m)]
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    # blocks: each task one or two pieces whose indices are subsets of the task's support covering it
    index, block_task = [], []
    for i, t in enumerate(supports):
        if t.size and rng.random() < 0.5:
            keep = rng.random(t.size) < 0.6
            index += [t[keep], t[~keep | (rng.random(t.size) < 0.3)]]
            block_task += [i, i]
        else:
            index.append(t)
            block_task.append(i)
    space = SupportSpace(supports, d, shared_dense=draw(st.sampled_from([None, False, True]))).exchange(index, block_task)
    scale = draw(st.sampled_from([1e-100, 1.0, 1e100]))
    vals = [scale * rng.normal(size=space.size) for _ in range(3)]
    A = rng.normal(size=(m, m))
    return space, index, np.array(block_task), vals, A @ A.T + m * np.eye(m), rng


def close(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and a.shape == b.shape
    tol = 1e-12 * max(float(np.max(np.abs(b), initial=0.0)), 1e-300)
    assert np.all(np.abs(a - b) <= tol), (a, b)


@settings(max_examples=60, deadline=None)
@given(spaces())
def test_support_space_ops_equal_dense_numpy(case):
    space, index, block_task, (X, Y, Z), Sigma, rng = case
    m, d = space.m, space.d
    Xd, Yd, Zd = space.dense(X), space.dense(Y), space.dense(Z)
    off = np.ones((m, d), dtype=bool)
    off[space.task_of, space.feature] = False
    assert np.all(Xd[off] == 0) and space.compact(Xd).tobytes() == X.tobytes()
    c1, c2 = rng.normal(size=m), rng.normal(size=m)
    close(space.dots(X, Y), np.einsum("ij,ij->i", Xd, Yd))
    close(space.total(X, Y), np.sum(Xd * Yd))
    close(space.gram(X), Xd @ Xd.T)
    G2, g2 = space.gram_dots2(Z, X, Y)
    close(G2, np.vstack([Xd, Yd]) @ np.vstack([Xd, Yd]).T)
    close(g2, np.concatenate([np.einsum("ij,ij->i", Zd, Xd), np.einsum("ij,ij->i", Zd, Yd)]))
    close(space.dense(space.combine(c1, X, c2, Y)), c1[:, None] * Xd + c2[:, None] * Yd)
    for op, ref in ((lambda A: space.add(A, Y), Xd + Yd), (lambda A: space.add_scaled(A, c1, Y), Xd + c1[:, None] * Yd),
                    (lambda A: space.add_two(A, c1, Y, c2, Z), Xd + c1[:, None] * Yd + c2[:, None] * Zd)):
        A = X.copy()
        op(A)
        close(space.dense(A), ref)
    lam = 1e-3
    Wd = (Sigma @ Xd) / lam                                   # the whole W, not zero off the supports
    for S in (Sigma, np.eye(m) / m, Sigma):                   # the pattern kept, the values refreshed per Sigma
        close(space.mix(S, X, lam), ((S @ Xd) / lam)[space.task_of, space.feature])
    close(space.wtw(space.mix(Sigma, X, lam), X, Sigma, lam), Wd @ Wd.T)
    # the exchange: flat support values <-> per-task sums of the blocks' rows (SupportLayout)
    layout = SupportLayout(index, d)
    rows = np.zeros((len(index), 2 * d + 3))
    for k, i in enumerate(index):
        rows[k, i] = rng.normal(size=i.size)
        rows[k, d + i] = rng.normal(size=i.size)
    rows[:, 2 * d:] = rng.normal(size=(len(index), 3))
    vecs, scal = space.from_flat(layout.pack(rows, 2), 2, 3)
    summed = np.zeros((m, 2 * d))
    for k, t in enumerate(block_task):
        summed[t] += rows[k, :2 * d]
    close(space.dense(vecs[0]), summed[:, :d])
    close(space.dense(vecs[1]), summed[:, d:])
    assert scal.tobytes() == rows[:, 2 * d:].tobytes()
    per_task = rng.normal(size=(m, 3))
    down = np.column_stack([Xd, per_task])[block_task]
    assert space.to_flat(X, per_task).tobytes() == layout.pack(down, 1).tobytes()
    assert space.to_flat(X, None).tobytes() == layout.pack(Xd[block_task], 1).tobytes()
    bad = X.copy()
    if bad.size:
        bad[-1] = np.nan
        assert np.isnan(space.finite_rows(bad)[space.task_of[-1]])
    assert np.all(space.finite_rows(X) == 0)


def test_task_supports_are_the_same_however_a_task_is_cut_and_the_rule():
    d = 10
    whole = taskspace.task_supports([np.array([1, 3]), np.array([0, 2, 4, 5, 6, 7])], [0, 1], 2, d)
    cut = taskspace.task_supports([np.array([3]), np.array([1]), np.array([5, 6, 7]), np.array([0, 2, 4])],
                                  [0, 0, 1, 1], 2, d)
    assert [t.tolist() for t in whole] == [t.tolist() for t in cut] == [[1, 3], [0, 2, 4, 5, 6, 7]]
    # a block exchanged whole (index all d) makes its task's support all d, however the others are cut
    dense = taskspace.task_supports([np.array([1, 3]), np.arange(d), np.array([2])], [0, 1, 1], 2, d)
    assert [t.tolist() for t in dense] == [[1, 3], list(range(d))]
    assert not taskspace.support_algebra_pays(dense, d)        # sum c_f^2 = 12 > 4 * 10 / 8
    narrow = [np.array([0]), np.array([1]), np.array([2]), np.zeros(0, dtype=np.int64)]
    assert taskspace.support_algebra_pays(narrow, 100)          # 3 <= 16 * 100 / 8


def test_omega_from_b_gram_equals_omega_step_on_dense_w():
    rng = np.random.default_rng(2)
    m, d, lam = 5, 40, 1e-2
    supports = [np.sort(rng.choice(d, size=6, replace=False)) for _ in range(m)]
    space = SupportSpace(supports, d, shared_dense=False)
    B = rng.normal(size=space.size)
    A = rng.normal(size=(m, m))
    Sigma = A @ A.T / np.trace(A @ A.T) + 0.1 * np.eye(m)
    W = ((Sigma @ space.dense(B)) / lam).T                     # d x m
    ref = dmtrl.omega_step(W, 1e-8)
    got = dmtrl.omega_from_gram(space.wtw(space.mix(Sigma, B, lam), B, Sigma, lam), 1e-8)
    assert np.all(np.isfinite(got)) and np.max(np.abs(got - ref)) <= 1e-12 * np.max(np.abs(ref))
    assert abs(np.trace(got) - 1.0) <= 1e-12


def test_segment_sums_with_empty_segments_at_every_place():
    rng = np.random.default_rng(9)
    for sizes in ([0, 3, 0, 2, 0], [0], [4], [0, 0], [1, 0, 1], [2, 5, 1]):
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        values = rng.normal(size=int(offsets[-1]))
        expected = np.array([values[a:b].sum() for a, b in zip(offsets[:-1], offsets[1:])])
        out = taskspace.segment_sums(values, offsets)
        assert out.shape == (len(sizes),)
        assert np.allclose(out, expected, rtol=1e-15, atol=0) and np.all(out[np.array(sizes) == 0] == 0)
