"""Joint-sparse projected subgradient: correctness and path (distributed, resumed: test_rank_counts.py)."""
import numpy as np
import pytest
from numpy.testing import assert_allclose

from hpcmtl import JointSparseMTL, synthetic
from hpcmtl.cluster import Cluster
from hpcmtl.errors import InputError
from hpcmtl.estimators import MemoryTasks
from hpcmtl.joint_sparse import JointSparseConfig, train
from hpcmtl.losses import loss_and_derivative, primal_reference
from hpcmtl.projection import l1inf_norm


@pytest.fixture(scope="module")
def problem():
    tr, te, truth = synthetic.joint_sparse(seed=3, n_train=30, n_test=60, d=40, m=8)
    return MemoryTasks(*tr), MemoryTasks(*te), truth


@pytest.mark.parametrize("loss", ["smoothed-hinge", "squared", "logistic"])
def test_loss_derivatives_match_finite_differences(loss):
    rng = np.random.default_rng(0)
    z, y = rng.normal(size=50) * 2, rng.choice([-1.0, 1.0], size=50)
    values, dz = loss_and_derivative(loss, z, y, 0.7)
    assert_allclose(values, primal_reference(loss, z, y, 0.7), rtol=1e-12)
    h = 1e-6
    numeric = (primal_reference(loss, z + h, y, 0.7) - primal_reference(loss, z - h, y, 0.7)) / (2 * h)
    assert_allclose(dz, numeric, rtol=1e-5, atol=1e-7)


def test_hinge_subgradient_is_a_subgradient():
    rng = np.random.default_rng(1)
    z, y = rng.normal(size=200), rng.choice([-1.0, 1.0], size=200)
    values, dz = loss_and_derivative("hinge", z, y)
    for _ in range(20):       # l(z') >= l(z) + g (z' - z) for every z'
        z2 = z + rng.normal(size=200)
        assert np.all(primal_reference("hinge", z2, y) >= values + dz * (z2 - z) - 1e-12)


@pytest.mark.parametrize("projection", ["l1inf", "l1", "l2"])
def test_iterates_stay_feasible_and_the_objective_drops(problem, projection):
    src, _, truth = problem
    C = float(truth["l1inf_norm"]) if projection == "l1inf" else 2.0
    r = train(Cluster.serial(), src, JointSparseConfig(radius=C, projection=projection, eta0=10.0,
                                                             max_rounds=60, fit_intercept=False))
    h = r.history
    assert h["best_objective"][-1] < h["objective"][0] * 0.9
    assert np.all(np.diff(h["best_objective"]) <= 0)
    norm = {"l1inf": l1inf_norm(r.W), "l1": np.abs(r.W).sum(axis=0).max(), "l2": np.linalg.norm(r.W, axis=0).max()}
    assert norm[projection] <= C * (1 + 1e-12)
    # the reported best objective is the objective of the returned W
    scores = [src.read_task(i).decision(r.W[:, i]) for i in range(src.n_tasks)]
    obj = sum(primal_reference("hinge", s, src.read_task(i).y).mean() for i, s in enumerate(scores))
    assert obj == pytest.approx(h["best_objective"][-1], rel=1e-12)


def test_warm_started_path_never_gets_worse(problem):
    src, _, truth = problem
    C = float(truth["l1inf_norm"])
    radii = [0.1 * C, 0.3 * C, C, 3 * C]
    r = train(Cluster.serial(), src, JointSparseConfig(eta0=10.0, max_rounds=40), radii=radii)
    p = r.path
    assert list(p["radius"]) == radii and p["W"].shape == (4, 40, 8)
    assert np.all(np.diff(p["objective"]) <= 1e-12)           # each start is feasible in the next ball
    assert np.all(p["l1inf_norm"] <= np.array(radii) * (1 + 1e-12))
    assert p["selected"][0] < 40 and p["selected"][0] <= p["selected"][-1]


@pytest.mark.smoke
def test_estimator(problem):
    src, te, truth = problem
    est = JointSparseMTL(radius=float(truth["l1inf_norm"]), eta0=10.0, max_rounds=50, fit_intercept=False)
    assert est.fit(src.Xs, src.ys) is est
    assert est.W_.shape == (40, 8) and est.score(te.Xs, te.ys) > 0.6
    assert set(est.selected_features_) == set(np.flatnonzero(np.abs(est.W_).max(axis=1)))
    with pytest.raises(InputError, match="The 'projection' parameter of JointSparseMTL must be one of l1inf, l1, l2. "
                                         "Got 'linf' instead. Did you mean 'l1inf'\\?"):
        JointSparseMTL(projection="linf").fit(src.Xs, src.ys)

