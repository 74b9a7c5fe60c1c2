"""Many tiny tasks on a worker (issue 35): a rank's small dense blocks computed together, not one at a time.

At 10^4 tasks of 20-40 rows a block's own arithmetic is a few microseconds, and the Python around it (a dozen
NumPy calls on 20-vectors, the per-block lists) was about 65 microseconds a block a round: most of a round.
:class:`BatchedBlocks` (a :class:`hpcmtl.dmtrl.worker.LocalBlocks` mixin, the worker half; nothing on the
server) stacks those blocks' rows once (``X^T``: d x N over the N rows of the batch) and computes TRIAL (the
squared loss's exact local step, its conjugate terms and the free momentum's scalars), APPLY
(``alpha += eta delta + beta p``) and the objective terms of all of them in a few NumPy operations over the N
rows, whatever the number of blocks.

Bits: every number of a block is computed from that block's values alone: its products are stacked ``matmul``
(BLAS on each block's own matrix, as the per-block path's ``X @ w``), its objective sums ``np.bincount`` over its
rows in row order (the kernel's order), so a block gives the same bits in any batch, alone or with others, at
every rank count (tests/test_many_tasks.py, tests/test_rank_counts.py).  They need not be the per-block path's
(its dot products and the step's order of operations differ), so which path a block takes is fixed by the plan
alone: blocks of at most BATCH_MAX_ROWS dense float64 rows in a run of at least BATCH_MIN_TASKS tasks.
"""
from __future__ import annotations

import os
from collections import deque
from itertools import repeat
from operator import attrgetter, is_, itemgetter

import numpy as np

from ..engine import fault_point, nan_fault

BATCH_MIN_TASKS = 512      # plan-wide tasks from which small blocks are batched (below: one block at a time)
BATCH_MAX_ROWS = 256       # a block of at most this many rows is batched (a larger one's Python cost is small
                           # beside its arithmetic, and the stacked copy would double its memory)
CHUNK_BYTES = 1 << 18      # TRIAL takes the blocks a chunk of about this many bytes of rows at a time through all
                           # its products, so the chunk stays in cache (the whole batch: 24 MB at 5,000 blocks of
                           # 30 x 20, read from memory four times a round)


def batchable(blk) -> bool:
    """A block the batch takes: dense float64 rows (centered explicitly, no implicit mu), 1 to BATCH_MAX_ROWS."""
    return (not blk.sparse and not blk.float32 and blk.mu is None and 1 <= blk.n_rows <= BATCH_MAX_ROWS)


class Batch:
    """The batched blocks, grouped by their row count: ``ks`` (their positions in the rank's blocks, by row count
    then position), per group ``(n, i0, i1, f0, f1, X)``: blocks ``ks[i0:i1]`` of n rows each, their rows
    ``f0:f1`` of the batch's N (a flat N-vector's ``[f0:f1].reshape(-1, n)`` is the group's blocks, a row each)
    and ``X`` (blocks x n x d).  Products are stacked ``matmul``: BLAS on each block's own matrix, so a block's
    bits never depend on the others.  ``Q``, ``s``: each block's ``X^T X`` eigendecomposition (built on the first
    exact step)."""

    def __init__(self, blocks, ks):
        ks = sorted(ks, key=lambda k: (blocks[k].n_rows, k))
        self.ks = np.asarray(ks, dtype=np.int64)
        # the per-block lists are read and written through C-level map/itemgetter, not a Python loop a block:
        # at 5,000 blocks a rank, each such loop was about a millisecond a round, and a round made a dozen
        self.kl = [int(k) for k in ks]
        self.take = itemgetter(*self.kl) if len(ks) > 1 else (lambda seq: tuple(seq[k] for k in self.kl))
        self.mask = np.zeros(len(blocks), dtype=bool)
        self.mask[self.ks] = True
        self.others = [k for k in range(len(blocks)) if not self.mask[k]]      # the blocks taken one at a time
        sizes = np.array([blocks[k].n_rows for k in ks], dtype=np.int64)
        stops = np.cumsum(sizes)
        self.bounds = list(zip((stops - sizes).tolist(), stops.tolist()))
        self.slices = [slice(a, b) for a, b in self.bounds]
        self.seg = np.repeat(np.arange(len(ks)), sizes)
        self.y = np.concatenate([blocks[k].y for k in ks]) if ks else np.zeros(0)
        self.n = np.array([float(blocks[k].n_task) for k in ks])
        self.groups = []                   # chunks of CHUNK_BYTES at most of the blocks of one row count
        for n in np.unique(sizes):
            i0, i1 = np.searchsorted(sizes, n), np.searchsorted(sizes, n, side="right")
            X = np.stack([blocks[k].X for k in ks[i0:i1]])
            per = max(1, CHUNK_BYTES // max(1, X[0].nbytes))
            for j0 in range(int(i0), int(i1), per):
                j1 = min(j0 + per, int(i1))
                self.groups.append((int(n), j0, j1, int(self.bounds[j0][0]), int(self.bounds[j1 - 1][1]),
                                    X[j0 - i0:j1 - i0]))
        self.Q = self.s = None
        self.kept_scores = None            # (W, a copy of it, X_b w_b): the objective's scores, TRIAL's next
        self.kept = {}                     # name -> (flat array, the blocks' views of it, their ids) the lists may hold

    @property
    def size(self):
        return len(self.ks)

    def scores(self, W):
        """``X_b w_b`` of every block, as a flat N-vector (``W``: B x d, a block a row)."""
        out = np.empty(self.y.size)
        for n, i0, i1, f0, f1, X in self.groups:
            out[f0:f1] = np.matmul(X, W[i0:i1, :, None]).reshape(-1)
        return out

    def scores_at(self, W):
        """:meth:`scores` of ``W``, the objective's own when it computed them at these values (the same bits)."""
        kept = self.kept_scores
        if kept is not None and kept[0] is W and np.array_equal(kept[1], W):
            return kept[2]
        return self.scores(W)

    def keep_scores(self, W, scores):
        self.kept_scores = (W, W.copy(), scores)

    def current(self, arrays, attr=None):
        """The blocks' entries of a per-block list (in ``ks`` order; ``attr``: that attribute of each)."""
        picked = self.take(arrays)
        return picked if attr is None else tuple(map(attrgetter(attr), picked))

    def unchanged(self, current, name):
        """The flat array kept under ``name`` when the blocks still hold its views (``current``), else None."""
        kept = self.kept.get(name)
        if kept is not None and list(map(id, current)) == kept[2]:   # ids of live objects: identity
            return kept[0]
        return None

    def stacked(self, arrays, name=None, attr=None):
        """One flat N-vector of the blocks' per-row arrays (in ``ks`` order; ``attr``: that attribute of each
        entry); ``name``: the flat array :meth:`pieces` made under that name when the blocks still hold its
        views (no copy)."""
        current = self.current(arrays, attr)
        flat = self.unchanged(current, name)
        return np.concatenate(current) if flat is None else flat

    def pieces(self, flat, name=None):
        """The blocks' slices (views) of a flat N-vector (``name``: kept for :meth:`stacked`)."""
        views = list(map(flat.__getitem__, self.slices))
        if name is not None:
            self.keep(name, flat, views)
        return views

    def keep(self, name, flat, views):
        self.kept[name] = (flat, views, list(map(id, views)))

    def rows(self, vectors, name):
        """The blocks' d-vectors as one B x d array (``name``: as in :meth:`stacked`)."""
        current = self.current(vectors)
        flat = self.unchanged(current, name)
        return np.stack(current) if flat is None else flat

    def put(self, seq, values):
        """``seq[k] = value`` for the blocks' positions k and their values (in ``ks`` order), in C."""
        deque(map(seq.__setitem__, self.kl, values), maxlen=0)

    def put_attr(self, objects, attr, values):
        """``objects[k].attr = value`` for the blocks' positions k and their values (in ``ks`` order), in C."""
        deque(map(setattr, self.current(objects), repeat(attr), values), maxlen=0)


def block_dots(u, v, n):
    """``u_b . v_b`` of the blocks of n rows each whose rows two flat vectors hold end to end."""
    return np.matmul(u.reshape(-1, 1, n), v.reshape(-1, n, 1)).reshape(-1)


def batched_solve(Q, s, t, scale):
    """``Q ((Q^T t) / (scale + max(s, 0)))`` per block (Q: B x d x d, s and t: B x d, scale: B), the exact
    squared-loss step's Woodbury solve (:meth:`LocalBlocks.exact_step`): stacked ``matmul``, a block's d x d
    product at a time."""
    u = np.matmul(t[:, None, :], Q)[:, 0, :]          # Q^T t
    u /= scale[:, None] + np.maximum(s, 0.0)
    return np.matmul(Q, u[:, :, None])[:, :, 0]


class BatchedBlocks:
    """The worker half (a :class:`hpcmtl.dmtrl.worker.LocalBlocks` mixin): the squared loss's exact TRIAL,
    APPLY and objective terms of the batched blocks (:class:`Batch`) at once."""

    def init_batched(self, plan_tasks):
        """The batch (None: every block alone): the exact squared-loss solver, momentum 'free' or none, and at
        least BATCH_MIN_TASKS tasks in the plan (the same choice at every rank count)."""
        self.batch = None
        if self.exact and self.momentum in (None, "free") and plan_tasks >= BATCH_MIN_TASKS:
            ks = [k for k, b in enumerate(self.blocks) if self.columns[k] is None and batchable(b)]
            if ks:
                self.batch = Batch(self.blocks, ks)

    def batch_eigen(self):
        """Every batched block's ``X^T X = Q diag(s) Q^T`` (the per-block path's own, :meth:`exact_step`)."""
        batch = self.batch
        if batch.Q is None:
            grams = np.stack([self.blocks[k].gram() for k in batch.ks])
            # one stacked eigh: LAPACK on each d x d matrix alone, the per-block path's eigh of the same matrix
            batch.s, batch.Q = np.linalg.eigh(0.5 * (grams + grams.transpose(0, 2, 1)))
            for i, k in enumerate(batch.ks):            # one copy: the per-block entries become views of the stack
                self.gram[k] = (batch.s[i], batch.Q[i])
        return batch.Q, batch.s

    def batched_trial(self, round_, unshrink):
        """TRIAL of the batched blocks: per block ``[delta b (d), c1, c2 (, (a - y).p, p.p, delta.p)]`` as rows
        (B x width, ``ks`` order); each block's delta pending, as the per-block path leaves it (``unshrink``: the
        round restarts every block's shrinking state, as the per-block path does)."""
        batch, cfg = self.batch, self.config
        fault_point(self.cluster.rank, round_)
        if unshrink:
            for k in batch.ks:
                self.unshrink(k)
        Q, s = self.batch_eigen()
        ks, d = batch.ks, self.d
        a = batch.stacked(self.state, "alpha", attr="alpha")
        c = self.rho_block[ks] * self.sigma_ii[ks] / cfg.lam
        W = batch.rows(self.w, "w")
        sc = batch.scores_at(W)
        free = self.momentum == "free"
        p = batch.stacked(self.previous, "previous") if free else None
        scale, y = batch.n / c, batch.y
        delta = np.empty(y.size)
        rows = np.empty((batch.size, d + (5 if free else 2)))
        # a chunk of blocks at a time through the whole step (its rows stay in cache for its three products); each
        # block's numbers are the same operations on its own values whatever the chunk, so the same bits
        for n, i0, i1, f0, f1, X in batch.groups:
            y_c, a_c = y[f0:f1], a[f0:f1]
            r = y_c - a_c - sc[f0:f1]
            z = batched_solve(Q[i0:i1], s[i0:i1], np.matmul(r.reshape(-1, 1, n), X)[:, 0, :], scale[i0:i1])
            dc = delta[f0:f1]
            np.subtract(r, np.matmul(X, z[:, :, None]).reshape(-1), out=dc)
            rows[i0:i1, :d] = np.matmul(dc.reshape(-1, 1, n), X)[:, 0, :] / batch.n[i0:i1, None]
            ay = a_c - y_c
            rows[i0:i1, d] = block_dots(ay, dc, n)
            rows[i0:i1, d + 1] = block_dots(dc, dc, n)
            if free:
                p_c = p[f0:f1]
                rows[i0:i1, d + 2] = block_dots(ay, p_c, n)
                rows[i0:i1, d + 3] = block_dots(p_c, p_c, n)
                rows[i0:i1, d + 4] = block_dots(dc, p_c, n)
        batch.put(self.pending, batch.pieces(delta, "pending"))
        if os.environ.get("HPCMTL_FAULT_NAN"):
            for i, k in enumerate(ks):
                if nan_fault(round_, self.blocks[k].task):
                    rows[i, self.d] = np.nan
        return rows

    def batched_apply(self, W, eta, beta, rho):
        """APPLY of the batched blocks (``W``: their w rows, B x d; per block eta, beta, rho): ``alpha += eta delta +
        beta p`` where a step is pending (the per-block path's :meth:`apply_step`, elementwise: the same bits)."""
        batch = self.batch
        ks = batch.ks
        views = list(W)                           # W's rows, each block's w (no copy)
        batch.put(self.w, views)
        batch.keep("w", W, views)
        if not any(map(is_, batch.current(self.pending), repeat(None))) and self.momentum in (None, "free"):
            seg = batch.seg
            step = eta[seg] * batch.stacked(self.pending, "pending")
            if self.momentum:
                step = step + beta[seg] * batch.stacked(self.previous, "previous")
                batch.put(self.previous, batch.pieces(step, "previous"))
                batch.put(self.pending_q, repeat(None))
            a = batch.stacked(self.state, "alpha", attr="alpha")
            moved = ((eta != 0.0) | (beta != 0.0))[seg]        # a block without a step keeps its alpha's bits
            batch.put_attr(self.state, "alpha", batch.pieces(np.where(moved, a + step, a), "alpha"))
            # (no mirrors to update: they are box momentum's, momentum.mirror_applied_step)
            batch.put(self.pending, repeat(None))
            self.rho_block[ks] = rho
        else:                                     # not every block has a pending step: one at a time
            for i, k in enumerate(ks):
                self.apply_step(k, float(eta[i]), float(beta[i]), float(rho[i]))

    def batched_objective(self):
        """Per batched block (loss sum, conjugate sum) of the squared loss at its w and alpha (B x 2), the kernel's
        ``objective_terms``: its formulas, the sums over each block's rows in row order (``np.bincount``)."""
        batch = self.batch
        a = batch.stacked(self.state, "alpha", attr="alpha")
        W = batch.rows(self.w, "w")
        sc = batch.scores(W)
        batch.keep_scores(W, sc)               # the next TRIAL's, while w stays
        t = sc - batch.y
        loss = 0.5 * t * t
        conj = 0.5 * a * a - a * batch.y
        return np.column_stack([np.bincount(batch.seg, weights=loss, minlength=batch.size),
                                np.bincount(batch.seg, weights=conj, minlength=batch.size)])

