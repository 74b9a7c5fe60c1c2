"""Graph task kernels (paper 003): Eq. 5 properties, validation, exact and distributed training."""
import numpy as np
import pytest
from numpy.testing import assert_allclose

from hpcmtl import GraphMTL, store, synthetic
from hpcmtl.errors import InputError
from hpcmtl.task_graph import graph_adjacency, product_gram, read_edges, regularizer, task_kernel, topology

from conftest import run_hpcmtl

NAMES = [f"t{i}" for i in range(6)]


@pytest.mark.smoke
@pytest.mark.parametrize("name", ["cycle", "chain", "complete", "star", "grid 2x3", "grid:3x2", "empty"])
def test_kernel_is_positive_definite_with_unit_diagonal(name):
    K = task_kernel(topology(name, 6), 0.1)
    assert_allclose(np.diag(K), 1.0)
    assert np.allclose(K, K.T) and np.linalg.eigvalsh(K).min() > 0
    assert np.all(K <= 1 + 1e-12) and np.all(K >= -1e-12)       # entries in [0, 1]


def test_unnormalized_kernel_inverse_is_the_graph_regularizer():
    rng = np.random.default_rng(0)
    A = rng.uniform(0, 2, size=(6, 6)) * (rng.uniform(size=(6, 6)) < 0.5)
    A = np.triu(A, 1)
    A = A + A.T
    alpha = rng.uniform(0.1, 1.0, size=6)
    K = task_kernel(A, alpha, normalize=False)
    for _ in range(5):
        W = rng.normal(size=(4, 6))
        assert_allclose(np.trace(W @ np.linalg.solve(K, W.T)), regularizer(W, A, alpha), rtol=1e-10)


def test_limits_complete_graph_and_empty_graph():
    assert_allclose(task_kernel(topology("complete", 5), 1e-8), np.ones((5, 5)), atol=1e-6)
    assert_allclose(task_kernel(topology("empty", 5), 0.3), np.eye(5))
    assert_allclose(topology("cycle", 4), [[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0]])


def test_validation_messages(tmp_path):
    edges = tmp_path / "g.csv"
    edges.write_text("task_a,task_b,weight\nt0,t1,1\nt1,t9,2\n")
    with pytest.raises(InputError, match=r"g.csv: line 3: unknown task 't9'"):
        read_edges(str(edges), NAMES)
    edges.write_text("t0,t1,-1\n")
    with pytest.raises(InputError, match=r"line 1: negative or non-finite edge weight -1.0"):
        read_edges(str(edges), NAMES)
    edges.write_text("t0,t1,2\n3,4\n")                       # names and indices; weight optional
    A = read_edges(str(edges), NAMES)
    assert A[0, 1] == A[1, 0] == 2 and A[3, 4] == 1
    with pytest.raises(InputError, match=r"component \{t2\} has no task with alpha > 0"):
        task_kernel(A, [1, 1, 0, 1, 1, 1], names=NAMES)
    with pytest.raises(InputError, match=r"component \{t3, t4\} has no task with alpha > 0"):
        task_kernel(A, [1, 1, 1, 0, 0, 1], names=NAMES)
    with pytest.raises(InputError, match=r"unknown graph 'cycel'.*Did you mean 'cycle'\?"):
        graph_adjacency("cycel", NAMES)
    with pytest.raises(InputError, match=r"graph 'grid 2x2' has 4 nodes but there are 6 tasks"):
        topology("grid 2x2", 6)


def test_product_gram_matches_its_definition():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(7, 3))
    t = np.array([0, 1, 2, 0, 1, 2, 0])
    K = task_kernel(topology("cycle", 3), 0.5)
    G = product_gram(X, t, K, "rbf", gamma=0.3)
    for i in range(7):
        for j in range(7):
            assert G[i, j] == pytest.approx(K[t[i], t[j]] * np.exp(-0.3 * np.sum((X[i] - X[j]) ** 2)))


def test_graph_mtl_exact_and_distributed():
    (Xs, ys, names), _ = synthetic.seasonal(seed=1, n_per_month=120)
    train = [X[:80] for X in Xs], [y[:80] for y in ys]
    test = [X[80:] for X in Xs], [y[80:] for y in ys]
    exact = GraphMTL(kernel="rbf", graph="cycle", alpha=2.0 ** -6, C=10.0, gamma=0.1).fit(*train)
    assert exact.K_.shape == (12, 12) and exact.score(*test) > 0.75
    rff = GraphMTL(kernel="rbf", graph="cycle", alpha=2.0 ** -6, exact=False, lam=1e-3, gamma=0.1,
                   rff_dim=300).fit(*train)
    assert rff.W_.shape == (300, 12) and rff.score(*test) > 0.7
    assert rff.history_["rel_gap"][-1] <= 1e-4


@pytest.mark.mpi
def test_train_graph_cli_distributed(tmp_path):
    full, tr, te = tmp_path / "s.h5", tmp_path / "tr.h5", tmp_path / "te.h5"
    assert run_hpcmtl(["data", "synth", "seasonal", full, "--scale", "0.3"]).returncode == 0
    assert run_hpcmtl(["data", "split", full, tr, te]).returncode == 0
    outs = {}
    for p in (1, 3):
        outs[p] = tmp_path / f"g{p}.h5"
        r = run_hpcmtl(["train", "graph", "--graph", "cycle", "--alpha", "0.01", "--train", tr, "--test", te,
                        "--out", outs[p], "--lam", "1e-3", "--rff-dim", "100", "--rff-gamma", "0.1",
                        "--tol", "1e-5", "--quiet"], n_ranks=p)
        assert r.returncode == 0, r.stderr
    a, b = store.read_result(outs[1]), store.read_result(outs[3])
    assert a["model"]["W"].tobytes() == b["model"]["W"].tobytes()
    assert_allclose(a["model"]["Sigma"], task_kernel(topology("cycle", 12), 0.01))
    assert a["test"]["summary"]["task_mean_auc"] > 0.7
    r = run_hpcmtl(["train", "graph", "--train", tr, "--out", tmp_path / "x.h5", "--lam", "1"])
    assert r.returncode == 2 and "needs --graph" in r.stderr


def test_exported_gram_and_other_base_kernels(tmp_path):
    from hpcmtl.task_graph import export_gram
    rng = np.random.default_rng(2)
    X, t = rng.normal(size=(9, 4)), np.repeat(np.arange(3), 3)
    K = task_kernel(topology("chain", 3), 0.2)
    G = export_gram(tmp_path / "gram.npy", X, t, K, "poly", degree=2, gamma=0.5, coef0=1.0)
    assert_allclose(np.load(tmp_path / "gram.npy"), G)
    assert_allclose(G, K[np.ix_(t, t)] * (0.5 * X @ X.T + 1.0) ** 2)
    assert_allclose(product_gram(X, t, K, "linear"), K[np.ix_(t, t)] * (X @ X.T))
    assert np.linalg.eigvalsh(G).min() > -1e-9                 # a valid kernel: PSD
    lin = GraphMTL(kernel="linear", graph="chain", alpha=0.2, C=1.0).fit([X[:3], X[3:6], X[6:]],
                                                                        [np.array([1, -1, 1.0])] * 3)
    assert lin.decision_function([X[:3], X[3:6], X[6:]])[0].shape == (3,)
