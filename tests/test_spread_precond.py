"""The box QPs' capacitance preconditioner on the task chunks (hpcmtl/dmtrl/spread_precond.py): its solves are the
rank-0 preconditioner's (qp_precond.CapacitancePreconditioner) to rounding, through a sequence of free sets, and the
same bits at every rank count (the chunks' G added over a fixed tree whoever adds which node), a rank without a
chunk included.  The ranks are run in one process here (each its own worker half); tests/test_spread.py and
tests/test_rank_counts.py run them under mpiexec."""
from types import SimpleNamespace

import numpy as np
import pytest
from numpy.testing import assert_allclose

from hpcmtl.covariance import SigmaFactors
from hpcmtl.dmtrl import qp_precond, spread, spread_precond
from hpcmtl.dmtrl.qp_precond import CapacitancePreconditioner, low_rank_terms
from hpcmtl.engine import Down


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64])
def test_the_tree_s_nodes_of_every_rank_range_cover_it_and_sum_alike(n):
    rng = np.random.default_rng(n)
    leaves = rng.normal(size=(n, 5)) * 10.0 ** rng.uniform(-8, 8, size=(n, 5))    # rounding shows in the order
    whole = spread_precond.tree_sum(0, n, {(j, j + 1): leaves[j] for j in range(n)})
    for P in (1, 2, 3, 5, 100):
        known = {}
        for rank in range(P):
            a, b = rank * n // P, (rank + 1) * n // P
            nodes = spread_precond.tree_nodes(0, n, a, b)
            assert [x for lo, hi in nodes for x in range(lo, hi)] == list(range(a, b))   # cover, in order, once
            for lo, hi in nodes:
                known[(lo, hi)] = spread_precond.tree_sum(lo, hi, {(j, j + 1): leaves[j] for j in range(lo, hi)})
        assert spread_precond.tree_sum(0, n, known).tobytes() == whole.tobytes()


class Chunks(spread.SpreadBlocks, spread_precond.SpreadPrecondBlocks):
    """One rank's worker halves of the spread box round."""


class Ranks(spread.SpreadServer):
    """Rank 0's spread server half with P ranks' worker halves run here in turn (what the commands do)."""

    def __init__(self, P, F, dB, dQ, scalars, n, lam):
        self.m, self.d = dB.shape
        self.config = SimpleNamespace(lam=lam)
        self.sigma_factors, self.n, self.BT = F, n, np.zeros_like(dB)
        self.P = P
        self.init_spread()
        self.ranks = [Chunks() for _ in range(P)]
        for rank, blocks in enumerate(self.ranks):
            blocks.cluster = SimpleNamespace(rank=rank, size=P)
        pieces = self.spread_box_payloads(dB, dQ, scalars)
        self.sent = 0
        self.spread_command(spread.DMTRLCommand.SPREAD_BOX_START, payload=pieces)

    def spread_size(self):
        return self.P

    def spread_command(self, cmd, payload=None, **fields):
        ctrl = SimpleNamespace(target=int(fields.get("target", 0)))
        out = []
        for rank, blocks in enumerate(self.ranks):
            inputs = payload[rank] if cmd.down is Down.SCATTER_VECTORS else payload
            out.append(getattr(blocks, cmd.compute)(ctrl, inputs))
        if cmd is spread.DMTRLCommand.SPREAD_BOX_FREE:
            self.sent += sum(np.asarray(x).size for x in out)
        return out


def problem(m, d, r, seed):
    rng = np.random.default_rng(seed)
    V, _ = np.linalg.qr(rng.normal(size=(m, r)))
    s = np.sort(rng.uniform(0.1, 1.0, r))[::-1]
    F = SigmaFactors(V, s / (s.sum() + 1e-3 * m), 1e-3 / (s.sum() + 1e-3 * m))
    dB = rng.normal(size=(m, d)) * rng.uniform(0.1, 3.0, (m, 1))
    dQ = rng.normal(size=(m, d))
    dQ[::5] = 0.5 * dB[::5]                      # parallel directions: blocks lifted, their null direction removed
    n = rng.integers(1, 30, m).astype(np.float64)
    scalars = np.zeros((m, 6))
    scalars[:, 1], scalars[:, 3], scalars[:, 4] = (rng.uniform(0, 1e-3, m) for _ in range(3))
    return F, dB, dQ, scalars, n, rng


def free_sets(m, directions, rng):
    """Three free sets in turn: most of the coordinates, then a few flipped, then many (the capacitance moves)."""
    free = rng.uniform(size=directions * m) < 0.8
    out = [free.copy()]
    for flips in (3, m // 2):
        free[rng.choice(free.size, flips, replace=False)] ^= True
        out.append(free.copy())
    return out


@pytest.mark.parametrize("directions", [1, 2])
@pytest.mark.parametrize("chunk_min,d,r", [(1, 3, 2), (7, 4, 3), (64, 5, 2)])
def test_chunk_solves_are_the_rank_0_preconditioner_s_and_the_same_bits_at_every_rank_count(directions, chunk_min, d,
                                                                                           r, monkeypatch):
    monkeypatch.setattr(spread, "CHUNK_MIN_TASKS", chunk_min)
    m, lam = 150, 1e-2
    F, dB, dQ, scalars, n, rng = problem(m, d, r, chunk_min + d)
    rows = [dB, dQ][:directions]
    extra = tuple(scalars[:, k] / n for k in ((1, 4, 3) if directions == 2 else (1,)))
    reference = CapacitancePreconditioner(*low_rank_terms(F, lam, d), rows, lam, extra)
    frees = free_sets(m, directions, rng)
    rs = [rng.normal(size=directions * m) for _ in frees]
    answers = {}
    for P in (1, 2, 3, 4, 200):                               # 200 ranks: most without a chunk
        ranks = Ranks(P, F, dB, dQ, scalars, n, lam)
        pre = spread_precond.SpreadCapacitance(ranks, directions)
        answers[P] = []
        for free, r_ in zip(frees, rs):
            z = pre.for_free(free)(np.where(free, r_, 0.0))
            want = reference.for_free(free)(np.where(free, r_, 0.0)) if P == 1 else answers[1][len(answers[P])]
            if P == 1:
                assert_allclose(z, want, rtol=0, atol=1e-10 * np.abs(want).max())
            else:
                assert z.tobytes() == want.tobytes(), P
            answers[P].append(z)
        assert answers[P][0].any()


def test_unchanged_chunks_send_nothing_and_no_terms_is_block_jacobi(monkeypatch):
    """A free set that changes one task sends only the tree nodes above its chunk (one triangle from its rank at
    P = 4 with 8 chunks: its chunk's rank range is one node); with no low-rank term kept (CAPACITY_MAX below d) the
    solve is the rank-0 preconditioner's Dg blocks alone."""
    monkeypatch.setattr(spread, "CHUNK_MIN_TASKS", 16)
    m, d, r, lam = 128, 4, 3, 1e-2                                # 8 chunks of 16
    F, dB, dQ, scalars, n, rng = problem(m, d, r, 11)
    ranks = Ranks(4, F, dB, dQ, scalars, n, lam)
    pre = spread_precond.SpreadCapacitance(ranks, 2)
    free = np.ones(2 * m, dtype=bool)
    pre.for_free(free)(np.ones(2 * m))
    K = r * d
    triangle = 2 + K * (K + 1) // 2
    r_ = np.ones(2 * m)
    partials = 8 * K                                             # the first solve's half rides along: K a chunk
    assert ranks.sent == 4 * triangle + partials                  # fresh: every rank its one node (two chunks)
    ranks.sent = 0
    free[5] = False
    pre.for_free(free)(r_)
    assert ranks.sent == triangle + partials
    ranks.sent = 0
    pre.solve(r_)                                                 # a later solve on the same free set: no FREE
    assert ranks.sent == 0
    monkeypatch.setattr(qp_precond, "CAPACITY_MAX", d - 1)
    monkeypatch.setattr(spread_precond, "CAPACITY_MAX", d - 1)
    ranks = Ranks(3, F, dB, dQ, scalars, n, lam)
    pre = spread_precond.SpreadCapacitance(ranks, 2)
    extra = tuple(scalars[:, k] / n for k in (1, 4, 3))
    reference = CapacitancePreconditioner(*low_rank_terms(F, lam, d), [dB, dQ], lam, extra)
    r_ = np.where(free, rng.normal(size=2 * m), 0.0)
    assert pre.for_free(free)(r_).tobytes() == reference.for_free(free)(r_).tobytes()
