"""A graph kernel held sparse (issue 35, docs/many-tasks.md): :class:`hpcmtl.covariance.GraphSigma` against the
dense kernel of :func:`hpcmtl.task_graph.task_kernel` (NumPy's m x m inverse) and the dense training path."""
import numpy as np
import pytest
from numpy.testing import assert_allclose

from hpcmtl import covariance, store, task_graph
from hpcmtl.cluster import Cluster
from hpcmtl.covariance import GraphSigma, inverse_diagonal
from hpcmtl.dmtrl import DMTRLConfig, train
from hpcmtl.errors import InputError
from hpcmtl.estimators import MemoryTasks
from hpcmtl.task_graph import check_graph, graph_adjacency, graph_covariance, task_kernel, topology

from conftest import assert_fits_agree, random_tasks, run_hpcmtl

TOPOLOGIES = ["cycle", "chain", "star", "grid 4x5", "complete", "empty"]


def edge_list(tmp_path, m, seed=0):
    """A random weighted edge list over tasks t0..t{m-1} (two components, names and indices, repeated edges)."""
    rng = np.random.default_rng(seed)
    path = tmp_path / "edges.csv"
    rows = ["task_a,task_b,weight"]
    for _ in range(2 * m):
        s, t = rng.choice(m // 2, 2, replace=False) + (0 if rng.uniform() < 0.5 else m // 2)
        rows.append(f"t{s},{t},{rng.uniform(0.1, 3):.3f}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


@pytest.mark.parametrize("name", TOPOLOGIES + ["edges"])
@pytest.mark.parametrize("normalize", [True, False])
def test_graph_sigma_is_the_dense_kernel(name, normalize, tmp_path):
    m = 20
    names = [f"t{i}" for i in range(m)]
    graph = edge_list(tmp_path, m) if name == "edges" else name
    A = graph_adjacency(graph, names, sparse=True)
    assert_allclose(A.toarray(), graph_adjacency(graph, names))           # the sparse and dense builds agree
    rng = np.random.default_rng(1)
    alpha = rng.uniform(0.01, 1.0, m)
    K = task_kernel(A.toarray(), alpha, normalize)                         # NumPy's dense inverse
    G = GraphSigma(*check_graph(A, alpha), normalize)
    X = rng.normal(size=(m, 3))
    Omega = np.linalg.inv(K)
    assert_allclose(G.dense(), K, rtol=0, atol=1e-12)
    assert_allclose(G.matmul(X), K @ X, rtol=0, atol=1e-12 * np.abs(K @ X).max())
    assert_allclose(G.matmul(X[:, 0]), K @ X[:, 0], rtol=0, atol=1e-12 * np.abs(K @ X).max())
    assert_allclose(G.diag(), np.diag(K), rtol=1e-13)
    assert_allclose(G.inverse_matmul(X), Omega @ X, rtol=0, atol=1e-11 * np.abs(Omega @ X).max())
    assert_allclose(G.inverse_diag(), np.diag(Omega), rtol=1e-11)
    assert_allclose(G.inverse_column(3), Omega[:, 3], rtol=0, atol=1e-11 * np.abs(Omega).max())
    idx, cols = np.array([2, 7, 11]), np.array([0, 7, 19, 2])
    assert_allclose(G.rows(idx, cols), K[np.ix_(idx, cols)], rtol=0, atol=1e-13)
    assert_allclose(G.correlation(idx), K[np.ix_(idx, idx)] / np.sqrt(np.outer(np.diag(K)[idx], np.diag(K)[idx])),
                    rtol=0, atol=1e-13)
    assert_allclose(G.abs_times(np.abs(X[:, 0])), np.abs(K) @ np.abs(X[:, 0]), rtol=1e-12)
    assert G.is_diagonal() == (name == "empty") == bool(np.all(K[~np.eye(m, dtype=bool)] == 0))
    back = GraphSigma.from_arrays(G.arrays(), m=m)
    assert_allclose(back.dense(), G.dense(), rtol=0, atol=0)                # the stored arrays give the same bits


@pytest.mark.parametrize("name,method", [("chain", "banded"), ("grid 12x15", "banded"), ("star", "solves"),
                                         ("cycle", "banded")])
def test_inverse_diagonal_both_methods_are_the_dense_inverse_s(name, method, monkeypatch):
    """diag((L + diag(alpha))^-1) by the banded Takahashi recurrence and by blocked sparse solves (each forced by
    the flop limits) against NumPy's dense inverse."""
    m = 180
    A = topology(name, m, sparse=True)
    alpha = np.random.default_rng(2).uniform(0.001, 0.5, m)
    P = G = GraphSigma(*check_graph(A, alpha), False).precision
    reference = np.diag(np.linalg.inv(P.toarray()))
    if method == "solves":
        monkeypatch.setattr(covariance, "GRAPH_BAND_MAX_VALUES", 0)
        monkeypatch.setattr(covariance, "DIAG_SOLVE_COLUMNS", 7)      # blocks that do not divide m
    assert_allclose(inverse_diagonal(P), reference, rtol=1e-12)
    del G


def test_the_diagonal_is_planned_when_built_and_computed_at_its_first_use_only(monkeypatch):
    """Building a GraphSigma (every rank of `train graph`) plans the diagonal's method and refuses a costly graph,
    but computes the diagonal only when it is first used (the server's); a stored diagonal is never recomputed."""
    calls = []
    original = covariance.inverse_diagonal
    monkeypatch.setattr(covariance, "inverse_diagonal", lambda *a: calls.append(1) or original(*a))
    A, alpha = check_graph(topology("grid 20x30", 600, sparse=True), 0.2)
    G = GraphSigma(A, alpha)
    assert calls == [] and G._plan[0] == "banded" and 20 <= G._plan[2] <= 25 and G._lu is None    # no LU needed either
    K = task_kernel(A, alpha)
    assert_allclose(G.matmul(np.ones(600)), K @ np.ones(600), rtol=1e-12)
    G.diag(), G.matmul(np.ones(600))
    assert calls == [1]
    assert GraphSigma.from_arrays(G.arrays(), m=600).matmul(np.ones(600)).tobytes() == G.matmul(np.ones(600)).tobytes()
    assert calls == [1]
    star = GraphSigma(*check_graph(topology("star", 600, sparse=True), 0.2))
    assert star._plan[0] == "solves" and calls == [1]


def test_a_graph_too_costly_for_its_diagonal_is_one_line_error(monkeypatch):
    monkeypatch.setattr(covariance, "GRAPH_DIAG_MAX_FLOPS", 1e5)
    A = topology("grid 30x40", 1200, sparse=True)
    with pytest.raises(InputError, match=r"^graph 'grid 30x40': the diagonal of \(L \+ diag\(alpha\)\)\^-1 over 1200 "
                                         r"tasks costs .* flops banded \(bandwidth 3\d\) or .* by sparse solves, "
                                         r"above"):
        GraphSigma(*check_graph(A, 0.1), what="graph 'grid 30x40'")
    with pytest.raises(InputError, match=r"graph 'complete' over 5000 tasks: its Laplacian is dense"):
        topology("complete", 5000, sparse=True)


def test_a_component_without_alpha_is_refused_on_the_sparse_path_too(monkeypatch):
    monkeypatch.setattr(task_graph, "SPARSE_GRAPH_MIN_TASKS", 0)
    names = [f"t{i}" for i in range(6)]
    A = graph_adjacency("chain", names, sparse=True)
    A = A.tolil()
    A[2, 3] = A[3, 2] = 0.0                          # two components: {t0, t1, t2} and {t3, t4, t5}
    with pytest.raises(InputError, match=r"component \{t3, t4, t5\} has no task with alpha > 0"):
        graph_covariance(A.tocsr(), [1, 1, 1, 0, 0, 0], names=names)
    assert isinstance(graph_covariance(A.tocsr(), [1, 1, 1, 0, 1, 0], names=names), GraphSigma)


def fit(Xs, ys, Sigma, **kw):
    config = DMTRLConfig(relationship="fixed", **kw)
    return train(Cluster.serial(), MemoryTasks(Xs, ys), config, sigma_fixed=Sigma, warn=lambda msg: None)


@pytest.mark.parametrize("loss,name", [("squared", "chain"), ("squared", "grid 3x6"), ("squared", "star"),
                                       ("squared", "edges"), ("hinge", "cycle"), ("logistic", "star"),
                                       ("smoothed-hinge", "edges")])
def test_sparse_and_dense_paths_train_the_same_model(loss, name, tmp_path):
    """The squared loss: the same rounds, W, primal, dual and gap.  The box losses: the sparse path's box QPs are
    the projected Newton-CG on A's products with Jacobi's preconditioner (a graph kernel has no low-rank part for
    the capacitance), the dense path's at 18 tasks the active-set method, so their answers (and the rounds after)
    may part at the Newton-CG's tolerance; and on the weighted edge list and the chain the squared loss's trajectory
    turns rounding into 1e-6 (edges; the dense path on ``G.dense()``, K to 1e-16, too) and 2e-8 (the chain, since the
    'qp' rho's least value is 1/4, sigma.RHO_LOW: its tasks' s_i are below 1/2) of W.  There: both certified, and W
    within what the two certificates allow: P is (lam / lambda_max(Sigma))-strongly convex in W, so
    ``||W - W*|| <= sqrt(2 gap lambda_max / lam)`` for each."""
    m, d = 18, 5
    Xs, ys = random_tasks(seed=3, m=m, d=d, sizes=(9, 14, 11), loss=loss)
    names = [str(i) for i in range(m)]
    graph = edge_list(tmp_path, m) if name == "edges" else name
    A = graph_adjacency(graph, [f"t{i}" for i in range(m)] if name == "edges" else names, sparse=True)
    alpha = 0.05
    dense, sparse = task_kernel(A, alpha), GraphSigma(*check_graph(A, alpha))
    kw = dict(loss=loss, lam=0.05, tol=1e-8, max_rounds=3000, fit_intercept=False)
    a, b = fit(Xs, ys, dense, **kw), fit(Xs, ys, sparse, **kw)
    assert isinstance(b.Sigma, GraphSigma) and isinstance(a.Sigma, np.ndarray)
    assert a.converged and b.converged
    # W to 1e-9 of its size where the rounds agree: these W-steps amplify rounding (the dense path on G.dense(),
    # which is K to 1e-16, ends 1e-10 from the dense path on K on the squared grid case; the sparse path 9e-10)
    assert_fits_agree(a, b, loss, kw["lam"], np.linalg.eigvalsh(dense)[-1],
                      loss != "squared" or name in ("edges", "chain"), w_rel=1e-9)
    out = tmp_path / "r.h5"
    store.write_result(out, b.W, b.Sigma, b.history, {"relationship": "fixed"}, 1, "test")
    model = store.read_result(out)["model"]
    assert "Sigma" not in model and "graph_indptr" in model
    back = covariance.model_sigma(model, out)
    assert isinstance(back, GraphSigma)
    assert_allclose(back.dense(), dense, rtol=0, atol=1e-12)
    assert np.array_equal(back.khat_diag, sparse.khat_diag)


TEN_THOUSAND = r"""
import sys, numpy as np
from hpcmtl import store
from hpcmtl.cluster import Cluster
from hpcmtl.covariance import GraphSigma, model_sigma
from hpcmtl.dmtrl import DMTRLConfig, train
from hpcmtl.engine import peak_rss_mb   # this program's own peak (VmHWM), not the launching pytest's
from hpcmtl.estimators import MemoryTasks
from hpcmtl.task_graph import graph_adjacency, graph_covariance
m, d = 10000, 5
rng = np.random.default_rng(4)
w = np.cumsum(0.1 * rng.normal(size=(m, d)), axis=0)          # neighbours on the chain alike
Xs = [rng.normal(size=(int(rng.integers(3, 6)), d)) for _ in range(m)]
ys = [X @ w[t] + 0.1 * rng.normal(size=X.shape[0]) for t, X in enumerate(Xs)]
names = [f"t{i}" for i in range(m)]
Sigma = graph_covariance(graph_adjacency("chain", names, sparse=True), 0.01, True, names)
r = train(Cluster.serial(), MemoryTasks(Xs, ys, names=names), DMTRLConfig(loss="squared", lam=1e-3,
          relationship="fixed", tol=1e-6, max_rounds=400, fit_intercept=False), sigma_fixed=Sigma,
          warn=lambda msg: None)
store.write_result(sys.argv[1], r.W, r.Sigma, r.history, {"relationship": "fixed"}, 1, "test")
back = model_sigma(store.read_result(sys.argv[1])["model"])
corr = back.correlation(np.array([0, 1, 5000]))
print(isinstance(Sigma, GraphSigma), isinstance(back, GraphSigma), r.converged, len(r.history["round"]),
      corr[0, 1], corr[0, 2], peak_rss_mb())
"""


def test_ten_thousand_tasks_train_without_an_m_by_m_array(tmp_path):
    """10^4 tasks on a chain: the kernel held sparse, trained to the certificate, written and read back, with the
    process's peak RSS far below one 10^4 x 10^4 array (800 MB)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", TEN_THOUSAND, str(tmp_path / "r.h5")], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    sparse, back, converged, rounds, near, far, peak_mb = out.stdout.split()
    assert sparse == back == converged == "True" and int(rounds) > 1
    assert 0.5 < float(near) < 1 and 0 <= float(far) < 1e-6          # neighbours correlated, far tasks not
    assert float(peak_mb) < 400, peak_mb


@pytest.mark.parametrize("loss", ["squared", "hinge"])
def test_training_checkpoints_and_results_never_form_the_m_by_m_kernel(loss, monkeypatch, tmp_path):
    """Rounds, rho, margin corrections (hinge: Sigma^-1 through the sparse precision), the checkpoint, the result
    file, report's sampled correlation and the estimator: GraphSigma.dense is never called."""
    from hpcmtl import GraphMTL
    from hpcmtl.checkpoint import Checkpointer
    from hpcmtl.results import task_correlation

    def no_dense(self):
        raise AssertionError("an m x m Sigma was formed")
    monkeypatch.setattr(GraphSigma, "dense", no_dense)
    m, d = 40, 30                            # d m > interior.MAX_WIDTH: no interior-point rounds (they need dense)
    Xs, ys = random_tasks(seed=5, m=m, d=d, sizes=(6, 9), loss=loss)
    Sigma = GraphSigma(*check_graph(topology("cycle", m, sparse=True), 0.1))
    ck = tmp_path / "c.h5"
    config = DMTRLConfig(loss=loss, lam=0.05, tol=1e-6, relationship="fixed", max_rounds=500, fit_intercept=False)
    r = train(Cluster.serial(), MemoryTasks(Xs, ys), config, sigma_fixed=Sigma, warn=lambda msg: None,
              checkpointer=Checkpointer(str(ck), every=3, config=config.to_dict(), sigma=Sigma))
    assert r.converged and r.Sigma is Sigma
    saved = store.read_checkpoint(str(ck))["arrays"]
    assert "Sigma" not in saved and np.array_equal(saved["graph_diag"], Sigma.khat_diag)
    out = tmp_path / "r.h5"
    store.write_result(out, r.W, r.Sigma, r.history, {"relationship": "fixed"}, 1, "test")
    back = covariance.model_sigma(store.read_result(out)["model"], out)
    monkeypatch.undo()
    K = task_kernel(topology("cycle", m), 0.1)
    picked = np.array([0, 3, 39])
    assert_allclose(task_correlation(back, picked), K[np.ix_(picked, picked)], rtol=0, atol=1e-13)
    monkeypatch.setattr(task_graph, "SPARSE_GRAPH_MIN_TASKS", 0)
    monkeypatch.setattr(GraphSigma, "dense", no_dense)
    est = GraphMTL(graph="cycle", alpha=0.1, exact=False, kernel="linear", loss=loss, lam=0.05, tol=1e-6,
                   fit_intercept=False).fit(Xs, ys)
    assert isinstance(est.K_, GraphSigma) and np.allclose(est.W_, r.W, atol=1e-6 * np.abs(r.W).max())


def test_train_fixed_takes_a_graph_result_file_as_its_sparse_kernel(tmp_path):
    """`train fixed --sigma RESULT.h5` of a graph kernel's result (many tasks) reads the GraphSigma back, no m x m
    array; a result file's graph fields that do not fit are one line."""
    import h5py

    from hpcmtl.methods import read_sigma
    m = 30
    G = GraphSigma(*check_graph(topology("chain", m, sparse=True), 0.2))
    out = tmp_path / "g.h5"
    store.write_result(out, np.zeros((3, m)), G, {"round": np.array([1])}, {"relationship": "fixed"}, 1, "test")
    back = read_sigma(str(out))
    assert isinstance(back, GraphSigma)
    assert back.matmul(np.arange(float(m))).tobytes() == G.matmul(np.arange(float(m))).tobytes()
    with h5py.File(out, "r+") as f:
        f["model/graph_data"][0] = -1.0
    with pytest.raises(InputError, match=r"g.h5: fields 'model/graph_indptr', .* the task graph does not fit its "
                                         r"30 tasks"):
        store.read_result(out)
