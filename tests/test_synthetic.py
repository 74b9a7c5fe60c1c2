"""The sparse-vocabulary generator (bench/bench_traffic.py, issue 14): shapes, supports, norms, determinism."""
import numpy as np
import pytest

from hpcmtl import synthetic
from hpcmtl.errors import InputError


def test_sparse_vocabulary_tasks_touch_only_their_vocabulary():
    (Xs, ys, names), (Xt, yt, _), truth = synthetic.sparse_vocabulary(seed=3, m=4, d=5000, vocabulary=600,
                                                                       n_per_task=40, words=30)
    assert names == ["user01", "user02", "user03", "user04"]
    union = 0
    for i, (X, y, Xte) in enumerate(zip(Xs, ys, Xt)):
        assert X.shape == (30, 5000) and Xte.shape == (10, 5000)
        assert set(np.unique(y)) <= {-1.0, 1.0}
        np.testing.assert_allclose(np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel()), 1.0, rtol=1e-12)
        support = np.union1d(X.indices, Xte.indices)
        assert support.size == truth["support_sizes"][i] <= 600      # at most the task's vocabulary
        union += support.size
    assert union < 0.5 * 4 * 5000                                       # supports far below d * m
    again = synthetic.sparse_vocabulary(seed=3, m=4, d=5000, vocabulary=600, n_per_task=40, words=30)
    assert all((a != b).nnz == 0 for a, b in zip(Xs, again[0][0]))


def test_sparse_vocabulary_refuses_impossible_sizes():
    with pytest.raises(InputError, match="vocabulary <= d"):
        synthetic.sparse_vocabulary(d=10, vocabulary=20)
