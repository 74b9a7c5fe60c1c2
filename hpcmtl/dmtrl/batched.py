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

import numpy as np

from ..engine import fault_point, nan_fault

BATCH_MIN_TASKS = 512      # plan-wide tasks from which small blocks are batched (below: one block at a time)
BATCH_MAX_ROWS = 256       # a block of at most this many rows is batched (a larger one's Python cost is small
                           # beside its arithmetic, and the stacked copy would double its memory)


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
        self.mask = np.zeros(len(blocks), dtype=bool)
        self.mask[self.ks] = True
        self.others = [k for k in range(len(blocks)) if not self.mask[k]]      # the blocks taken one at a time
        sizes = np.array([blocks[k].n_rows for k in ks], dtype=np.int64)
        stops = np.cumsum(sizes)
        self.bounds = list(zip((stops - sizes).tolist(), stops.tolist()))
        self.seg = np.repeat(np.arange(len(ks)), sizes)
        self.y = np.concatenate([blocks[k].y for k in ks]) if ks else np.zeros(0)
        self.n = np.array([float(blocks[k].n_task) for k in ks])
        self.groups = []
        for n in np.unique(sizes):
            i0, i1 = np.searchsorted(sizes, n), np.searchsorted(sizes, n, side="right")
            X = np.stack([blocks[k].X for k in ks[i0:i1]])
            self.groups.append((int(n), int(i0), int(i1), int(self.bounds[i0][0]), int(self.bounds[i1 - 1][1]), X))
        self.Q = self.s = None
        self.kept = {}                     # name -> (flat array, the blocks' views of it) that the lists still hold

    @property
    def size(self):
        return len(self.ks)

    def scores(self, W):
        """``X_b w_b`` of every block, as a flat N-vector (``W``: B x d, a block a row)."""
        out = np.empty(self.y.size)
        for n, i0, i1, f0, f1, X in self.groups:
            out[f0:f1] = np.matmul(X, W[i0:i1, :, None]).reshape(-1)
        return out

    def rmatvec(self, v):
        """``X_b^T v_b`` of every block (B x d) of a flat N-vector ``v``."""
        out = np.empty((self.size, self.groups[0][5].shape[2] if self.groups else 0))
        for n, i0, i1, f0, f1, X in self.groups:
            out[i0:i1] = np.matmul(v[f0:f1].reshape(-1, 1, n), X)[:, 0, :]
        return out

    def dots(self, u, v):
        """``u_b . v_b`` of every block (B) of two flat N-vectors."""
        out = np.empty(self.size)
        for n, i0, i1, f0, f1, _ in self.groups:
            out[i0:i1] = np.matmul(u[f0:f1].reshape(-1, 1, n), v[f0:f1].reshape(-1, n, 1)).reshape(-1)
        return out

    def stacked(self, arrays, name=None):
        """One flat N-vector of the blocks' per-row arrays (in ``ks`` order); ``name``: the flat array
        :meth:`pieces` made under that name when the blocks still hold its views (no copy)."""
        current = [arrays[k] for k in self.ks]
        kept = self.kept.get(name)
        if kept is not None and all(a is b for a, b in zip(current, kept[1])):
            return kept[0]
        return np.concatenate(current)

    def pieces(self, flat, name=None):
        """The blocks' slices (views) of a flat N-vector (``name``: kept for :meth:`stacked`)."""
        views = [flat[a:b] for a, b in self.bounds]
        if name is not None:
            self.kept[name] = (flat, views)
        return views

    def rows(self, vectors, name):
        """The blocks' d-vectors as one B x d array (``name``: as in :meth:`stacked`)."""
        current = [vectors[k] for k in self.ks]
        kept = self.kept.get(name)
        if kept is not None and all(a is b for a, b in zip(current, kept[1])):
            return kept[0]
        return np.stack(current)


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
        ks = batch.ks
        a = batch.stacked([st.alpha for st in self.state], "alpha")
        c = self.rho_block[ks] * self.sigma_ii[ks] / cfg.lam
        r = batch.y - a - batch.scores(batch.rows(self.w, "w"))
        z = batched_solve(Q, s, batch.rmatvec(r), batch.n / c)
        delta = r - batch.scores(z)
        db = batch.rmatvec(delta) / batch.n[:, None]
        ay = a - batch.y
        columns = [db, batch.dots(ay, delta), batch.dots(delta, delta)]
        if self.momentum == "free":
            p = batch.stacked(self.previous, "previous")
            columns += [batch.dots(ay, p), batch.dots(p, p), batch.dots(delta, p)]
        rows = np.column_stack(columns)
        for k, piece in zip(ks, batch.pieces(delta, "pending")):
            self.pending[k] = piece
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
        for k, w in zip(ks, W):
            self.w[k] = w
        batch.kept["w"] = (W, [self.w[k] for k in ks])
        if all(self.pending[k] is not None for k in ks) and self.momentum in (None, "free"):
            seg = batch.seg
            step = eta[seg] * batch.stacked(self.pending, "pending")
            if self.momentum:
                step = step + beta[seg] * batch.stacked(self.previous, "previous")
                for k, piece in zip(ks, batch.pieces(step, "previous")):
                    self.previous[k] = piece
                    self.pending_q[k] = None
            a = batch.stacked([st.alpha for st in self.state], "alpha")
            moved = ((eta != 0.0) | (beta != 0.0))[seg]        # a block without a step keeps its alpha's bits
            for k, new in zip(ks, batch.pieces(np.where(moved, a + step, a), "alpha")):
                self.state[k].alpha = new
            # (no mirrors to update: they are box momentum's, momentum.mirror_applied_step)
            for k in ks:
                self.pending[k] = None
            self.rho_block[ks] = rho
        else:                                     # not every block has a pending step: one at a time
            for i, k in enumerate(ks):
                self.apply_step(k, float(eta[i]), float(beta[i]), float(rho[i]))

    def batched_objective(self):
        """Per batched block (loss sum, conjugate sum) of the squared loss at its w and alpha (B x 2), the kernel's
        ``objective_terms``: its formulas, the sums over each block's rows in row order (``np.bincount``)."""
        batch = self.batch
        ks = batch.ks
        a = batch.stacked([st.alpha for st in self.state], "alpha")
        t = batch.scores(batch.rows(self.w, "w")) - batch.y
        loss = 0.5 * t * t
        conj = 0.5 * a * a - a * batch.y
        return np.column_stack([np.bincount(batch.seg, weights=loss, minlength=batch.size),
                                np.bincount(batch.seg, weights=conj, minlength=batch.size)])

