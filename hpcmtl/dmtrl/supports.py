"""The support exchange: a block's d-vectors travel on its support S_k only, both halves.

:func:`exchange_index` (which features a block's vectors travel on), :class:`SupportLayout` (where each
block's numbers sit in a support collective's buffer), the worker half (:class:`SupportBlocks`: a block
computed on its own columns, converted at the boundary to dense rows or support values) and the server half
(:class:`SupportServer`: the supports learned at the first exchange, the gathers and scatters of the rounds
on them).  The server's ``layout``, ``direction_layout``, ``supports_known`` and ``scores_off_supports``
are created and written here only.
"""
from __future__ import annotations

import numpy as np

from ..taskspace import SupportSpace, support_algebra_pays, task_supports
from .commands import DMTRLCommand, ON_SUPPORT


def exchange_index(block, d):
    """The features a block's d-vectors travel on: its support when some feature is outside it (``|S| < d``),
    else None (the block is exchanged whole: dense rows, or sparse rows that touch every feature).  Any
    feature outside saves 16 bytes a round against one gather of ``|S|`` numbers a vector, so a support of
    0.9 d travels as one."""
    support = block.support
    return support if support.size < d else None


class SupportLayout:
    """Where each block's numbers sit in the flat buffer of a support collective.

    ``index``: per block (plan order; a worker: its own blocks), the sorted feature ids its d-vectors travel
    on (all d for a block exchanged whole).  A block's segment is ``[v_1 on S_k, ..., v_V on S_k, scalars]``:
    its rows ``[v_1, ..., v_V, scalars]`` (V d-vectors then the scalars, the dense commands' rows) restricted to
    S_k; segments follow in plan order, which is rank order.  :meth:`pack` and :meth:`rows` convert, the rows
    coming back with zeros off the supports: exactly the dense commands' rows where the vectors vanish there.
    """

    def __init__(self, index, d):
        self.d = int(d)
        self.index = [np.asarray(i, dtype=np.int64) for i in index]
        self.sizes = np.array([i.size for i in self.index], dtype=np.int64)
        self.row = np.repeat(np.arange(len(self.index)), self.sizes)
        self.feature = np.concatenate(self.index) if self.index else np.zeros(0, dtype=np.int64)
        self.within = np.arange(self.feature.size) - np.repeat(np.cumsum(self.sizes) - self.sizes, self.sizes)
        self._positions = {}

    def positions(self, vectors, scalars):
        """``(flat positions of the vectors' values, the same values' positions in the flattened rows,
        flat positions of the scalars, their positions in the flattened rows, total length)``."""
        key = (int(vectors), int(scalars))
        if key not in self._positions:
            width = vectors * self.d + scalars
            lengths = vectors * self.sizes + scalars
            start = np.cumsum(lengths) - lengths
            base = start[self.row] + self.within
            step = self.sizes[self.row]
            vec = np.concatenate([base + v * step for v in range(vectors)]) if vectors else np.zeros(0, np.int64)
            cell = self.row * width + self.feature
            vec_cell = np.concatenate([cell + v * self.d for v in range(vectors)]) if vectors else vec
            blocks = np.arange(len(self.index))
            scal = (start[:, None] + vectors * self.sizes[:, None] + np.arange(scalars)[None, :]).reshape(-1)
            scal_cell = (blocks[:, None] * width + vectors * self.d + np.arange(scalars)[None, :]).reshape(-1)
            self._positions[key] = (vec, vec_cell, scal, scal_cell, int(lengths.sum()))
        return self._positions[key]

    def pack(self, rows, vectors):
        """The flat values of per-block rows ``(n_blocks x (vectors d + scalars))`` on the supports."""
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        vec, vec_cell, scal, scal_cell, total = self.positions(vectors, rows.shape[1] - vectors * self.d)
        flat = np.empty(total)
        cells = rows.reshape(-1)
        flat[vec] = cells[vec_cell]
        flat[scal] = cells[scal_cell]
        return flat

    def rows(self, flat, vectors, scalars):
        """The per-block rows ``(n_blocks x (vectors d + scalars))`` of flat values, zeros off the supports."""
        vec, vec_cell, scal, scal_cell, total = self.positions(vectors, scalars)
        if flat.size != total:
            raise ValueError(f"{flat.size} support values, the layout has {total}")
        out = np.zeros((len(self.index), vectors * self.d + scalars))
        cells = out.reshape(-1)
        cells[vec_cell] = flat[vec]
        cells[scal_cell] = flat[scal]
        return out


class SupportBlocks:
    """The worker half of the support exchange (a :class:`hpcmtl.dmtrl.worker.LocalBlocks` mixin)."""

    def init_support_exchange(self, consumed=None):
        """``features[k]``: block k's support S_k as exchanged; ``columns[k]``: the d features its own columns
        stand for (None: all d).  The exact squared-loss solver keeps all d (d <= EXACT_MAX_FEATURES, its
        eigendecomposition of X^T X in the dense exchange's bits).  A block computed on its support replaces
        the one read, also in ``consumed`` (the caller's list, handed over) when given."""
        on_support = self.config.exchange == "auto"
        self.features = [exchange_index(b, self.d) if on_support else None for b in self.blocks]
        self.columns = [None if self.exact else f for f in self.features]
        for k, f in enumerate(self.columns):
            if f is not None:
                self.blocks[k] = self.blocks[k].on_features(f)
                if consumed is not None:
                    consumed[k] = self.blocks[k]
        self.support_sizes = None                       # every plan block's exchange size (SET_SUPPORTS)

    def dense_rows(self, parts, vectors, width, which=None):
        """Per-block ``(vectors, scalars)`` -> the dense commands' rows ``(n_blocks x width)``, ``width = vectors
        d + scalars`` (the command's: a rank without blocks knows no d), zeros off each block's support
        (``which``: ``parts`` are those blocks', one row each)."""
        d = self.d
        out = np.zeros((len(parts), width))
        for i, (vecs, sc) in enumerate(parts):
            k = i if which is None else which[i]
            f = self.columns[k]
            for v, vec in enumerate(vecs):
                if f is None:
                    out[i, v * d:(v + 1) * d] = vec
                else:
                    out[i, v * d + f] = vec
            out[i, vectors * d:] = sc
        return out

    def from_rows(self, rows, vectors, which=None):
        """The dense commands' rows -> per block ``(vectors on its own columns, scalars)`` (``which``: of those
        blocks only)."""
        d = self.d
        parts = []
        for k in range(len(self.columns)) if which is None else which:
            f = self.columns[k]
            vecs = [rows[k, v * d:(v + 1) * d] for v in range(vectors)]
            parts.append(([np.ascontiguousarray(v if f is None else v[f]) for v in vecs], rows[k, vectors * d:]))
        return parts

    def support_values(self, parts):
        """Per-block ``(vectors, scalars)`` -> the support commands' flat values (SupportLayout's segments)."""
        pieces = []
        for k, (vecs, sc) in enumerate(parts):
            cut = self.features[k] is not None and self.columns[k] is None     # whole columns, sent on S_k
            pieces += [v[self.features[k]] if cut else v for v in vecs]
            pieces.append(np.asarray(sc, dtype=np.float64).reshape(-1))
        return np.concatenate(pieces) if pieces else np.zeros(0)

    def from_support(self, flat, vectors, scalars):
        """The support commands' flat values -> per block ``(vectors on its own columns, scalars)``."""
        parts, pos = [], 0
        for k, blk in enumerate(self.blocks):
            index = self.features[k]
            f = blk.n_features if index is None else index.size
            vecs = [flat[pos + v * f:pos + (v + 1) * f] for v in range(vectors)]
            if index is not None and self.columns[k] is None:      # whole columns: zeros off S_k
                vecs = [self.on_all_features(index, v) for v in vecs]
            parts.append((vecs, flat[pos + vectors * f:pos + vectors * f + scalars]))
            pos += vectors * f + scalars
        if pos != flat.size:
            raise ValueError(f"{flat.size} support values, this rank's blocks take {pos}")
        return parts

    def full_w(self, k):
        """Block k's whole w (d numbers) for rows off its support (test rows): SET_W's row when it sent one,
        else w on the support and zero elsewhere (right under a diagonal Sigma: w_i = sigma_ii b_i / lam)."""
        if self.w_dense is not None:
            return self.w_dense[k]
        f = self.columns[k]
        return self.w[k] if f is None else self.on_all_features(f, self.w[k])

    def on_all_features(self, index, values):
        """A d-vector with ``values`` at ``index``, zero elsewhere."""
        full = np.zeros(self.d)
        full[index] = values
        return full

    def get_supports(self, ctrl, inputs):
        """GET_SUPPORTS: per block ``[|S_k|, S_k]`` (``[-1]``: exchanged whole), concatenated in plan order."""
        parts = []
        for index in self.features:
            parts += [[-1.0]] if index is None else [[float(index.size)], index.astype(np.float64)]
        return np.concatenate(parts) if parts else np.zeros(0)

    def set_supports(self, ctrl, sizes):
        """SET_SUPPORTS: every plan block's exchange size (the support collectives' counts)."""
        self.support_sizes = np.asarray(sizes, dtype=np.int64)

    def sdca_on_support(self, ctrl, inputs):
        """SDCA_ON_SUPPORT: SDCA's delta b rows, on the supports."""
        return self.support_values([([s], ()) for s in self.sdca_steps(ctrl.round)])

    def trial_on_support(self, ctrl, inputs):
        """TRIAL_ON_SUPPORT: TRIAL's rows, their d-vectors on the supports."""
        parts = self.trial_parts(ctrl.round)
        if self.momentum == "box":       # the server's dP after this step: delta b and X^T q / n as sent
            self.keep_exchanged_directions(parts)
        return self.support_values(parts)

    def on_exchange(self, k, vec):
        """Block k's vector on its own columns -> its values at the exchange positions (its support as sent)."""
        return vec[self.features[k]] if self.features[k] is not None and self.columns[k] is None else vec

    def set_w_on_support(self, ctrl, flat):
        """SET_W_ON_SUPPORT: w on each block's support; objective terms."""
        self.w_dense = None
        self.w = [np.ascontiguousarray(vecs[0]) for vecs, _ in self.from_support(flat, 1, 0)]
        return self.objective_terms() if ctrl.with_objective else None

    def apply_on_support(self, ctrl, flat):
        """APPLY_ON_SUPPORT: APPLY's ``[w on the support, eta, beta, rho]`` per block."""
        return self.apply_parts(self.from_support(flat, 1, ctrl.scalars), ctrl.with_objective)


class SupportServer:
    """The server half of the support exchange (a :class:`hpcmtl.dmtrl.server.Server` mixin)."""

    def init_support_exchange(self):
        self.layout = None            # every block's SupportLayout (exchange 'auto', some block sparse), or None
        # box momentum under exchange 'auto': where the workers' directions travel (the support layout, or every
        # block on all d when none is sparse: the direction is still sent only where it differs from dP)
        self.direction_layout = None
        self.supports_known = False   # registered at the first exchange (GET_SUPPORTS)
        self.scores_off_supports = False   # the workers score rows off their supports after training (validation)

    def score_rows_off_supports(self, wanted=True):
        """After training, every block gets its whole w (validation rows may lie off the supports)."""
        self.scores_off_supports = bool(wanted)

    def scatter_down(self, cmd, task_array, scalars, **fields):
        """``cmd`` (SET_W, APPLY, SET_LOCAL) with every block's ``[its task's row of task_array(), its task's
        scalars]`` (``scalars``: m x s, or None): on the supports when they are known.  ``task_array`` is read
        after the first exchange's registration, which may move B and W to the task supports."""
        layout = self.supports()
        s = 0 if scalars is None else scalars.shape[1]
        X = task_array()
        if self.space.sparse:
            return self.command(ON_SUPPORT[cmd], payload=self.space.to_flat(X, scalars), vectors=1, scalars=s,
                                **fields)
        payload = (X if scalars is None else np.column_stack([X, scalars]))[self.block_task]
        if layout is None:
            return self.command(cmd, payload=payload, width=payload.shape[1], **fields)
        return self.command(ON_SUPPORT[cmd], payload=layout.pack(payload, 1), vectors=1, scalars=s, **fields)

    def supports(self):
        """Every block's :class:`SupportLayout`, learned at the first exchange (GET_SUPPORTS, SET_SUPPORTS),
        or None: the dense exchange (``exchange='dense'``, or every block's support all d features).

        When the task supports are sparse enough (:func:`hpcmtl.taskspace.support_algebra_pays`), B, dP and
        W move to them here (:class:`hpcmtl.taskspace.SupportSpace`) and stay there for the run.  With box
        momentum the registration also sets ``direction_layout`` (all d for blocks exchanged whole)."""
        if not self.supports_known:
            self.supports_known = True
            if self.config.exchange == "auto":
                self.layout = self.register_supports()
            if self.layout is not None:
                supports = task_supports(self.layout.index, self.block_task, self.m, self.d)
                if support_algebra_pays(supports, self.d):
                    self.adopt(SupportSpace(supports, self.d).exchange(self.layout.index, self.block_task))
        return self.layout

    def adopt(self, space):
        """Keep B, dP (and W, recomputed) as task arrays of ``space`` from now on."""
        self.BT = space.compact(self.space.dense(self.BT))
        self.dPT = space.compact(self.space.dense(self.dPT))
        self.space = space
        self.recompute_w()

    def register_supports(self):
        pieces = self.command(DMTRLCommand.GET_SUPPORTS)
        flat = np.concatenate(pieces) if pieces else np.zeros(0)
        index, pos, sparse = [], 0, False
        for _ in self.blocks:                  # plan order is rank order: the pieces follow it
            size = int(flat[pos])
            pos += 1
            if size < 0:
                index.append(np.arange(self.d, dtype=np.int64))
            else:
                index.append(flat[pos:pos + size].astype(np.int64))
                pos += size
                sparse = True
        if not sparse and self.momentum != "box":
            return None
        layout = SupportLayout(index, self.d)
        self.command(DMTRLCommand.SET_SUPPORTS, payload=layout.sizes.astype(np.float64), width=len(self.blocks))
        self.direction_layout = layout
        return layout if sparse else None

    def gather_up(self, cmd, vectors, scalars, **fields):
        """What ``cmd`` (SDCA, TRIAL) returns, per block ``vectors`` d-vectors and ``scalars`` numbers:
        ``([per-task sum of vector v as a task array of self.space], per-block scalars)``.  On the supports
        when they are known (the same numbers: the vectors vanish off the supports), else dense rows."""
        if self.supports() is None:
            return self.row_task_arrays(self.command(cmd, width=vectors * self.d + scalars, **fields), vectors)
        flat = self.command(ON_SUPPORT[cmd], vectors=vectors, scalars=scalars, **fields)
        return self.support_task_arrays(flat, vectors, scalars)

    def support_task_arrays(self, flat, vectors, scalars, layout=None):
        """A support collective's flat values (on ``layout``, default the supports') -> ``([per-task sum of
        vector v, a task array], per-block scalars)``."""
        if self.space.sparse:
            return self.space.from_flat(flat, vectors, scalars)
        layout = self.layout if layout is None else layout
        return self.row_task_arrays(layout.rows(flat, vectors, scalars), vectors)

    def row_task_arrays(self, rows, vectors):
        """Per-block dense rows ``[vectors d-vectors, scalars]`` -> as :meth:`support_task_arrays` (m x d rows)."""
        d = self.d
        summed = self.per_task(rows[:, :vectors * d])
        return [summed[:, v * d:(v + 1) * d] for v in range(vectors)], rows[:, vectors * d:]
