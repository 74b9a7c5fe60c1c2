"""A sparse precision as `train fixed`'s Sigma (issue 35 item 1, docs/many-tasks.md): ``--sigma OMEGA.npz`` (written
by scipy.sparse.save_npz) held as a :class:`hpcmtl.covariance.GraphSigma`, against NumPy's dense inverse, and the
precisions it refuses, one line naming the file, exit 2 on every rank."""
import re

import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose

from hpcmtl import covariance, store
from hpcmtl.covariance import GraphSigma
from hpcmtl.errors import InputError
from hpcmtl.methods import read_sigma
from hpcmtl.task_graph import precision_covariance, topology

from conftest import random_tasks, run_hpcmtl


def laplacian(A):
    A = sp.csr_matrix(A, dtype=np.float64)
    return sp.diags(np.asarray(A.sum(axis=1)).reshape(-1)) - A


def grid_precision(m=20):
    """A 4 x 5 grid's Laplacian with alpha on two tasks only (the other rows sum to 0)."""
    alpha = np.zeros(m)
    alpha[[0, m - 1]] = (0.3, 0.1)
    return (laplacian(topology("grid 4x5", m, sparse=True)) + sp.diags(alpha)).tocsr()


def edges_precision(m=30, seed=1):
    """Random weighted edges in two components, a random alpha >= 0 on a third of the tasks, the diagonal summed
    in another order than GraphSigma's (its zero row sums are zero only to rounding)."""
    rng = np.random.default_rng(seed)
    rows, cols = [], []
    for _ in range(2 * m):
        s, t = rng.choice(m // 2, 2, replace=False) + (0 if rng.uniform() < 0.5 else m // 2)
        rows.append(s)
        cols.append(t)
    A = sp.coo_matrix((rng.uniform(0.1, 3, len(rows)), (rows, cols)), shape=(m, m)).tocsr()
    A = A + A.T
    A.setdiag(0)
    A.eliminate_zeros()
    alpha = np.where(rng.uniform(size=m) < 0.33, rng.uniform(0.05, 1, m), 0.0)
    alpha[[0, m // 2]] = 0.5                                 # both components
    degree = np.array([np.sum(np.sort(A.getrow(i).data)[::-1]) for i in range(m)])
    return (sp.diags(degree + alpha) - A).tocsr()


@pytest.mark.parametrize("make", [grid_precision, edges_precision])
def test_a_sparse_precision_is_its_inverse_held_sparse(make, tmp_path):
    """read_sigma of a .npz precision: a GraphSigma, unnormalized, whose Sigma is NumPy's inverse of Q (1e-12) and
    whose precision is Q to rounding; written to a result file and read back (train fixed --sigma RESULT.h5) the
    same."""
    Q = make()
    path = tmp_path / "omega.npz"
    sp.save_npz(path, Q)
    G = read_sigma(str(path))
    assert isinstance(G, GraphSigma) and not G.normalize
    S = np.linalg.inv(Q.toarray())
    assert_allclose(G.dense(), S, rtol=0, atol=1e-12 * np.abs(S).max())
    assert_allclose(G.precision.toarray(), Q.toarray(), rtol=0, atol=1e-14 * abs(Q).max())
    assert_allclose(G.diag(), np.diag(S), rtol=1e-12)
    x = np.arange(Q.shape[0], dtype=float)
    assert_allclose(G.inverse_matmul(x), Q @ x, rtol=1e-13, atol=1e-13)
    out = tmp_path / "r.h5"
    store.write_result(out, np.zeros((2, Q.shape[0])), G, {"round": np.arange(2)}, {}, 1, "test")
    back = read_sigma(str(out))
    assert isinstance(back, GraphSigma) and back.matmul(x).tobytes() == G.matmul(x).tobytes()


@pytest.mark.mpi
def test_train_fixed_with_a_precision_file_is_the_dense_inverse_s_model(tmp_path):
    """`train fixed --sigma OMEGA.npz` against `--sigma SIGMA.npy` of NumPy's inverse (squared loss), the result file
    holding the graph (no m x m array), and the same bits at P = 1 and 2."""
    m, d = 20, 6
    Xs, ys = random_tasks(seed=4, m=m, d=d, sizes=(8, 12, 10))
    tr = tmp_path / "tr.h5"
    store.write_tasks(tr, Xs, ys)
    Q = grid_precision(m)
    sp.save_npz(tmp_path / "omega.npz", Q)
    np.save(tmp_path / "sigma.npy", np.linalg.inv(Q.toarray()))
    results = {}
    for name, sigma, ranks in (("sparse", "omega.npz", None), ("sparse2", "omega.npz", 2),
                               ("dense", "sigma.npy", None)):
        out = tmp_path / f"{name}.h5"
        r = run_hpcmtl(["train", "fixed", "--train", tr, "--sigma", tmp_path / sigma, "--out", out, "--loss",
                        "squared", "--lam", "1e-2", "--tol", "1e-10", "--no-intercept", "--quiet"], n_ranks=ranks)
        assert r.returncode == 0, r.stderr
        results[name] = store.read_result(out)
    a, b = results["dense"], results["sparse"]
    assert "Sigma" not in b["model"] and int(b["model"]["graph_normalize"]) == 0
    assert_allclose(covariance.model_sigma(b["model"]).dense(), a["model"]["Sigma"], rtol=0, atol=1e-12)
    # the first rounds alike; the last ones part where the momentum steps amplify rounding (the dense path on the
    # inverse that NumPy rounded, the sparse one on Q's LU), so there: both certified, W within what the two
    # certificates allow (P is (lam / lambda_max(Sigma))-strongly convex in W)
    assert_allclose(b["history"]["primal"][:10], a["history"]["primal"][:10], rtol=1e-10)
    for res in (a, b):
        assert res["history"]["gap"][-1] <= 1e-10 * res["history"]["primal"][-1]
    top = np.linalg.eigvalsh(a["model"]["Sigma"])[-1]
    bound = sum(np.sqrt(2 * res["history"]["gap"][-1] * top / 1e-2) for res in (a, b))
    assert np.linalg.norm(b["model"]["W"] - a["model"]["W"]) <= bound
    for key in ("W", "graph_data", "graph_diag"):
        assert results["sparse2"]["model"][key].tobytes() == b["model"][key].tobytes(), key


def not_symmetric():
    Q = grid_precision().tolil()
    Q[0, 1] = -0.5
    return Q.tocsr()


def positive_off_diagonal():
    """Symmetric positive definite, but an off-diagonal entry > 0: Q^-1 has negative entries."""
    Q = grid_precision().tolil()
    Q[0, 2] = Q[2, 0] = 0.05
    Q[0, 0] += 0.1
    Q[2, 2] += 0.1
    return Q.tocsr()


def negative_row_sum():
    """An M-matrix, positive definite ([[1, -2], [-2, 5]] in the corner), but row 0 sums to -1."""
    Q = sp.lil_matrix((20, 20))
    Q.setdiag(1.0)
    Q[0, 0], Q[0, 1], Q[1, 0], Q[1, 1] = 1.0, -2.0, -2.0, 5.0
    return Q.tocsr()


def singular():
    """A grid Laplacian plus alpha, and a second component (tasks 20-22, a chain) without: singular."""
    Q = sp.block_diag([grid_precision(), laplacian(topology("chain", 3, sparse=True))])
    return Q.tocsr()


BAD = {
    "not square": (lambda: sp.csr_matrix(np.eye(20)[:, :19]), r"the precision is 20 x 19, not square"),
    "not symmetric": (not_symmetric, r"the precision is not symmetric: entry \(0, 1\) is -0.5, \(1, 0\) is -1.0"),
    "not finite": (lambda: sp.csr_matrix(np.diag(np.r_[np.nan, np.ones(19)])), "entries that are not finite"),
    "zero diagonal": (lambda: sp.diags(np.r_[1.0, 0.0, np.ones(18)]).tocsr(),
                      r"not positive definite: its diagonal entry 1 is 0.0"),
    "singular": (singular, r"not positive definite \(singular\): the rows of the connected tasks \{20, 21, 22\} "
                           r"sum to 0"),
    "positive off-diagonal": (positive_off_diagonal, r"a positive off-diagonal entry \(0, 2\) = 0.05: supported are "
                                                     r"graph precisions"),
    "negative row sum": (negative_row_sum, r"row 0 sums to -1.0 < 0: supported are graph precisions"),
    "wrong m": (lambda: grid_precision(), r"the sparse task covariance \(a graph kernel or a precision\) has 20 tasks, the data has 5"),
    "not sparse": (None, r"not a scipy.sparse .npz precision"),
    # no tasks: the row maxima had nothing to reduce (a ValueError traceback, exit 1)
    "empty": (lambda: sp.csr_matrix((0, 0)), r"the precision is 0 x 0: no tasks"),
    # a Hermitian positive definite Q: it was cast to its real part (the identity here) and trained on, silently
    "complex": (lambda: sp.csr_matrix(np.eye(20) + 0.5j * (np.eye(20, k=1) - np.eye(20, k=-1))),
                r"the precision's entries are complex128, not real numbers"),
}


UNDER_MPI = ("singular", "wrong m")      # these under mpiexec -n 2: every rank exits 2 with the one line


@pytest.mark.parametrize("case", [pytest.param(k, marks=pytest.mark.mpi) if k in UNDER_MPI else k for k in BAD])
def test_a_bad_precision_is_one_line_naming_the_file(case, tmp_path):
    make, message = BAD[case]
    path = tmp_path / "omega.npz"
    if make is None:
        np.savez(path, a=np.eye(5))
    else:
        sp.save_npz(path, make())
    if case not in ("wrong m", "not sparse"):
        with pytest.raises(InputError, match=message):
            read_sigma(str(path))
    Xs, ys = random_tasks(seed=1, m=5, d=3, sizes=(6, 7, 8))
    store.write_tasks(tmp_path / "tr.h5", Xs, ys)
    r = run_hpcmtl(["train", "fixed", "--train", tmp_path / "tr.h5", "--sigma", path, "--out", tmp_path / "o.h5",
                    "--lam", "0.1", "--quiet"], n_ranks=2 if case in UNDER_MPI else None)
    assert r.returncode == 2, r.stderr
    lines = sorted(set(r.stderr.strip().splitlines()))
    assert len(lines) == 1 and lines[0].startswith(f"hpcmtl: error: {path}: "), r.stderr
    assert re.search(message, lines[0]), lines[0]


def test_precision_covariance_refuses_what_is_not_a_sparse_matrix():
    with pytest.raises(InputError, match="P: not a scipy.sparse matrix"):
        precision_covariance(np.eye(3), what="P")


def test_a_precision_near_the_largest_float_is_symmetrized_without_overflow():
    """``(Q + Q^T) / 2`` overflowed to inf for entries near 1e308, and the file was refused as "not positive
    definite (singular)", which it is not: the halves are added instead."""
    from hpcmtl.task_graph import precision_covariance
    Q = sp.csr_matrix(np.array([[1e308, -1e308], [-1e308, 1.5e308]]))
    G = precision_covariance(Q)
    assert G.m == 2 and np.all(np.isfinite(G.precision.data))
    assert_allclose(G.precision.toarray(), Q.toarray(), rtol=1e-15)
