"""Issue 39 item 2: the per-round helpers of a small serial run made cheap without changing a bit.

* ``block_seed`` memoizes ``SeedSequence(key)``'s first 64 bits: the value must be exactly a fresh
  SeedSequence's, for every key shape it is asked (with and without ``inner``, large seeds, NumPy integers).
* ``nan_fault`` reads ``HPCMTL_FAULT_NAN`` once a run (``engine.arm_nan_fault``), not once a block a round:
  the hook must still fire in a run started after the variable was set in this process.
* ``conjugate_along`` / ``conjugate_two`` / ``conjugate_terms``: one conjugate evaluation of the points stacked,
  the same bits as the separate calls they replaced (the formulas before, written out here).
"""
import numpy as np
import pytest

from hpcmtl import engine
from hpcmtl.cluster import Cluster
from hpcmtl.dmtrl import DMTRLConfig, block_seed, train
from hpcmtl.dmtrl.steps import conjugate_along, conjugate_terms, conjugate_two
from hpcmtl.errors import ConvergenceError
from hpcmtl.estimators import MemoryTasks
from hpcmtl.losses import conjugate_reference

from conftest import random_tasks


def fresh_seed(key):
    return int(np.random.SeedSequence(key).generate_state(1, dtype=np.uint64)[0])


@pytest.mark.smoke
def test_block_seed_is_a_fresh_seed_sequence_bit_for_bit():
    rng = np.random.default_rng(7)
    keys = [(0, 0, 0, 0, 0), (0, 0, 0, 1, 0), (0, 0, 0, 0, 1), (1, 2, 0, 37, 0), (2**32, 5, 0, 1, 3),
            (2**64 - 1, 28, 3, 10**6, 9)]
    keys += [tuple(int(v) for v in rng.integers(0, 2**31, size=4)) + (int(rng.integers(0, 3)),) for _ in range(300)]
    for seed, task, part, round_, inner in keys:
        expected = fresh_seed([seed, task, part, round_] + ([inner] if inner else []))
        assert block_seed(seed, task, part, round_, inner) == expected
        assert block_seed(seed, task, part, round_, inner) == expected            # the memoized value
        assert block_seed(np.int64(seed % 2**63), np.int32(task), part, np.int64(round_), inner) == \
            fresh_seed([seed % 2**63, task, part, round_] + ([inner] if inner else []))
    # inner = 0 is the key without it (the streams of runs without local steps unchanged), not [.., 0]
    assert block_seed(3, 1, 0, 5) == fresh_seed([3, 1, 0, 5]) != fresh_seed([3, 1, 0, 5, 0])


def test_nan_fault_is_armed_by_each_run(monkeypatch):
    """Set after hpcmtl was imported, the hook still fires in the next run (``engine.run`` re-reads it), and
    unset again, the next run is clean."""
    Xs, ys = random_tasks(seed=3, m=4)
    config = dict(lam=1e-2, tol=1e-12, max_rounds=40, aggregation="safe")
    monkeypatch.setenv("HPCMTL_FAULT_NAN", "6:2")
    with pytest.raises(ConvergenceError, match=r"non-finite .* in round 6 .*task 'task2' \(#2\)"):
        train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**config))
    assert engine.nan_fault(6, 2) and engine.nan_fault(np.int64(6), np.int32(2))
    assert not engine.nan_fault(6, 1) and not engine.nan_fault(5, 2)
    monkeypatch.delenv("HPCMTL_FAULT_NAN")
    train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**config))
    assert engine._nan_fault is None and not engine.nan_fault(6, 2)


@pytest.mark.parametrize("n", [1, 7, 64, 501])
def test_logistic_conjugate_along_keeps_its_bits(n):
    rng = np.random.default_rng(n)
    y = np.where(rng.random(n) < 0.3, 1.0, -1.0)
    a = y * rng.random(n)
    a[: n // 4] = 0.0                                    # at the box's ends as well as inside
    a[n // 4: n // 3] = y[n // 4: n // 3]
    delta = y * np.clip(rng.random(n), 0.0, 1.0) - a
    c1, c2 = conjugate_along("logistic", a, delta, y, 1.0)
    before = float(np.sum(conjugate_reference("logistic", a + delta, y) - conjugate_reference("logistic", a, y)))
    assert c2 == 0.0 and c1 == before                   # bit for bit what the two calls gave
    # and the number itself, against the definition sum b log b + (1 - b) log(1 - b) at b = y a
    xlogx = lambda b: np.where(b > 0, b * np.log(np.where(b > 0, b, 1.0)), 0.0)  # noqa: E731
    ref = sum(float(np.sum(xlogx(y * v) + xlogx(1 - y * v))) * s for v, s in ((a + delta, 1), (a, -1)))
    assert abs(c1 - ref) <= 1e-12 * max(1.0, abs(ref)) * n


@pytest.mark.parametrize("loss", ["logistic", "squared", "hinge", "smoothed-hinge"])
@pytest.mark.parametrize("n", [1, 9, 500])
def test_conjugate_terms_are_along_then_two_bit_for_bit(loss, n):
    rng = np.random.default_rng(100 + n)
    y = np.where(rng.random(n) < 0.3, 1.0, -1.0)
    a = y * rng.random(n)
    delta = y * rng.random(n) - a
    q = np.where(rng.random(n) < 0.5, y * rng.random(n) - a, 0.0)
    for beta_max in (0.0, 0.37, 1.0):
        terms = conjugate_terms(loss, a, delta, y, 0.5, q, beta_max)
        assert terms == conjugate_along(loss, a, delta, y, 0.5) + conjugate_two(loss, a, delta, q, beta_max, y, 0.5)
        if loss in ("logistic", "squared") and beta_max > 0:    # conjugate_two's plane, as it was computed
            far = np.sum(conjugate_reference(loss, a + beta_max * q, y) - conjugate_reference(loss, a, y))
            assert terms[2] == float(far / beta_max) and terms[3:] == (0.0, 0.0)
        if loss == "logistic":
            assert terms[0] == float(np.sum(conjugate_reference(loss, a + delta, y) - conjugate_reference(loss, a, y)))
    assert conjugate_terms(loss, a, delta, y, 0.5) == conjugate_along(loss, a, delta, y, 0.5)
