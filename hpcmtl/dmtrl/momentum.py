"""Box momentum: each task's previous step as a second direction, both halves.

The direction's arithmetic (:func:`box_direction`, :func:`conjugate_two` is in :mod:`.steps`), how a
worker sends it on supports only where it differs from the server's dP (:func:`encode_direction`,
:func:`direction_tolerance`, :func:`mask_positions`), the worker half (:class:`MomentumBlocks`: the
previous steps and the mirrors of the server's B and dP) and the server half (:class:`MomentumServer`:
decoding the directions, restarting the momentum, its checkpoint state).  The server's flags
``dp_known`` and ``mirrored`` are created and written here only.
"""
from __future__ import annotations

import numpy as np

from .commands import DMTRLCommand
from .config import uses_momentum
from .steps import BETA_CAP


def box_direction(a, p, y):
    """The previous step p kept where a whole further step stays in the box ``0 <= y alpha <= 1``; ``beta_max``."""
    b, yp = y * a, y * p
    # room >= 1 without dividing: (1 - b) / yp >= 1 exactly when 1 - b >= yp (yp > 0), -b / yp >= 1 when
    # b >= -yp (yp < 0): a correctly rounded quotient of positive numbers is >= 1 exactly when x >= y
    keep = ((yp > 0) & (1.0 - b >= yp)) | ((yp < 0) & (b >= -yp))
    if not keep.any():
        return np.zeros_like(p), 0.0
    bk, ypk = b[keep], yp[keep]
    room = np.where(ypk > 0, 1.0 - bk, -bk) / ypk
    return np.where(keep, p, 0.0), float(min(BETA_CAP, np.min(room)))


DIRECTION_ULPS = 8.0      # box momentum on supports: dP stands for X^T q / n where B could not tell them apart
EPS64 = np.finfo(np.float64).eps


def direction_tolerance(direction, dp, b, beta_max):
    """How far the server's momentum direction may be from ``X^T q / n`` at any position: ``DIRECTION_ULPS``
    ulps of the largest of ``|X^T q / n|``, ``|dP|`` and ``|B| / max(1, beta_max)``.  With the step ``beta <=
    beta_max`` (:meth:`StepSolver.within_triangle`), what B gains from it is then off by at most those ulps of
    B's largest entry: the rounding of B's own update."""
    # (the ndarray methods: np.max's Python wrapper and np.finfo were most of this call's time on
    # Landmine-sized blocks, asked once a block a round; the same reductions)
    scale = max(float(np.abs(direction).max(initial=0.0)), float(np.abs(dp).max(initial=0.0)),
                float(np.abs(b).max(initial=0.0)) / max(1.0, beta_max))
    return DIRECTION_ULPS * EPS64 * scale


def encode_direction(direction, dp, b, beta_max):
    """``(what a block sends, the direction the server will use)`` of its momentum direction ``X^T q / n`` on
    its exchange positions, given the server's ``dP`` and ``B`` there and the block's ``beta_max``.

    ``q`` is the previous step p without the rows the box removed, and ``dP`` the server's ``X^T p / n``
    (``eta dB + beta dQ`` of the last round, in its arithmetic, with local SDCA's accumulated delta b): they
    differ where removed rows touch, and by rounding elsewhere.  Sent, whichever is shortest: ``[c,
    positions, values]`` of the c positions where they differ by more than :func:`direction_tolerance` (the
    server keeps dP elsewhere); ``[-2, a bit mask of those positions (64 a number: np.packbits' bytes),
    values]``; or ``[-1, the whole direction]``.  The server's direction is then within that
    tolerance of the true one at every position, every round (no error carries over: dP is the server's
    own).  Decoded by :meth:`Server.directions`."""
    tolerance = direction_tolerance(direction, dp, b, beta_max)
    mask = ~(np.abs(direction - dp) <= tolerance)
    differ = np.flatnonzero(mask)
    words = -(-direction.size // 64)
    if min(2 * differ.size, words + differ.size) >= direction.size:
        return np.concatenate([[-1.0], direction]), direction
    used = dp.copy()
    used[differ] = direction[differ]
    if 2 * differ.size <= words + differ.size:
        return np.concatenate([[float(differ.size)], differ.astype(np.float64), direction[differ]]), used
    bits = np.zeros(8 * words, dtype=np.uint8)
    packed = np.packbits(mask)
    bits[:packed.size] = packed
    return np.concatenate([[-2.0], bits.view(np.float64), direction[differ]]), used


def mask_positions(words, size):
    """The positions of a bit mask sent by :func:`encode_direction` (``words``: its float64 numbers)."""
    return np.flatnonzero(np.unpackbits(np.ascontiguousarray(words).view(np.uint8))[:size]).astype(np.int64)


class MomentumBlocks:
    """The worker half of the momentum (a :class:`hpcmtl.dmtrl.worker.LocalBlocks` mixin)."""

    def init_momentum(self):
        self.momentum = uses_momentum(self.config)
        self.previous = [np.zeros(b.n_rows) for b in self.blocks]    # momentum: the step applied last round
        self.pending_q = [None] * len(self.blocks)                   # box momentum: this round's p'
        # box momentum on supports: the server's dP and B on each block's exchange positions (None: zero), and
        # this round's delta b and X^T q / n as the server has them, that make the next ones
        self.dp_mirror = [None] * len(self.blocks)
        self.b_mirror = [None] * len(self.blocks)
        self.pending_exchanged = [None] * len(self.blocks)

    def keep_exchanged_directions(self, parts):
        """Every block's delta b and X^T q / n (TRIAL's ``parts``) at its exchange positions, as the server gets
        them: what makes its next dP."""
        self.pending_exchanged = [tuple(self.on_exchange(k, v) for v in vecs) for k, (vecs, _) in enumerate(parts)]

    def mirror_applied_step(self, k, eta, beta):
        """Block k's mirrors after APPLY: the server's dP = eta dB + beta dQ and B += dP, in its arithmetic."""
        if self.pending_exchanged[k] is not None:
            db, dq = self.pending_exchanged[k]
            self.dp_mirror[k] = eta * db + beta * dq
            self.b_mirror[k] = self.dp_mirror[k] + (self.b_mirror[k] if self.b_mirror[k] is not None else 0.0)
            self.pending_exchanged[k] = None

    def trial_momentum_on_support(self, ctrl, inputs):
        """TRIAL_MOMENTUM_ON_SUPPORT: TRIAL_ON_SUPPORT's segments with delta b alone, then every block's
        momentum direction ``X^T q / n`` where it differs from the server's dP (:func:`encode_direction`)."""
        parts = self.trial_parts(ctrl.round)
        fixed = self.support_values([(vecs[:1], scalars) for vecs, scalars in parts])
        tails = []
        for k, (vecs, _) in enumerate(parts):
            direction = self.on_exchange(k, vecs[1])
            zero = np.zeros(direction.size)
            dp = self.dp_mirror[k] if self.dp_mirror[k] is not None else zero
            b = self.b_mirror[k] if self.b_mirror[k] is not None else zero
            sent, used = encode_direction(direction, dp, b, float(parts[k][1][-1]))
            self.pending_exchanged[k] = (self.on_exchange(k, vecs[0]), used)
            tails.append(sent)
        return np.concatenate([fixed, *tails])

    def set_dp_on_support(self, ctrl, flat):
        """SET_DP_ON_SUPPORT: the server's B and dP on each block's support, the mirrors the next directions use."""
        parts = self.from_support(flat, 2, 0)
        self.b_mirror = [self.on_exchange(k, vecs[0]).copy() for k, (vecs, _) in enumerate(parts)]
        self.dp_mirror = [self.on_exchange(k, vecs[1]).copy() for k, (vecs, _) in enumerate(parts)]

    def get_previous(self, ctrl, inputs):
        """GET_PREVIOUS: every block's previous step, concatenated in plan order."""
        parts = [p for p in self.previous]
        return np.concatenate(parts) if parts else np.zeros(0)

    def set_previous(self, ctrl, mine):
        pos = 0
        for k, blk in enumerate(self.blocks):
            self.previous[k] = mine[pos:pos + blk.n_rows].copy()
            pos += blk.n_rows
        self.dp_mirror = [None] * len(self.blocks)     # the server's dP: zero, or sent next (a resume)


class MomentumServer:
    """The server half of the momentum (a :class:`hpcmtl.dmtrl.server.Server` mixin)."""

    def init_momentum_mirrors(self):
        # box momentum on supports: dPT is the B change the workers' previous steps made (X^T p / n per task),
        # so they send their direction X^T q / n only where it differs (TRIAL_MOMENTUM_ON_SUPPORT); False
        # after anything else set their previous steps (local rounds, a checkpoint that did not record it)
        self.dp_known = True
        self.mirrored = True          # the workers mirror B and dP (False: sent before the next such TRIAL)

    def mirrors_stale(self):
        """B changed other than by a round's steps: the workers' mirror of it is sent before it is next used."""
        self.mirrored = False

    def previous_steps_replaced(self):
        """Something other than the rounds' steps set the workers' previous steps (local rounds): dP no longer
        stands for them, and their mirrors of B and dP are stale."""
        self.dp_known = self.mirrored = False

    def trial_with_directions(self, scalars):
        """TRIAL of the box momentum on supports, the directions sent only where they differ from dP
        (:meth:`gather_trial_momentum`), when dP stands for the workers' previous steps and every task is one
        block; else None (the caller gathers the whole directions)."""
        if not (self.dp_known and self.one_block_a_task):
            return None
        if not self.mirrored:               # the workers' mirrors of B and dP
            self.send_mirrors()
        return self.gather_trial_momentum(scalars)

    def track_previous_steps(self, eta, dBT, beta, dQT):
        """The workers' next previous step p = eta delta + beta q, as B sees it: dP."""
        self.dPT = self.space.combine(eta, dBT, beta, dQT)
        self.dp_known = True

    def momentum_counters(self):
        return {"dp_known": bool(self.momentum == "box" and self.dp_known)}

    def restore_momentum_counters(self, counters):
        self.dp_known = bool(counters.get("dp_known", False))    # dPT is the workers' X^T p / n (box momentum)
        self.mirrored = False

    def gather_trial_momentum(self, scalars):
        """TRIAL on the supports with box momentum, one block a task: per task ``X^T q / n`` is dP where the
        worker found them alike, what it sent elsewhere (:meth:`LocalBlocks.trial_momentum_on_support`);
        as :meth:`gather_up`."""
        layout = self.direction_layout
        pieces = self.command(DMTRLCommand.TRIAL_MOMENTUM_ON_SUPPORT, round=self.round, vectors=1, scalars=scalars)
        fixed = self.cluster.rank_totals(layout.sizes + scalars)
        (dBT,), block_scalars = self.support_task_arrays(
            np.concatenate([piece[:n] for piece, n in zip(pieces, fixed)]), 1, scalars, layout)
        positions, values = self.directions([piece[n:] for piece, n in zip(pieces, fixed)])
        dQT = self.dPT.copy()
        dQT.reshape(-1)[positions] = values
        return [dBT, dQT], block_scalars

    def send_mirrors(self):
        """SET_DP_ON_SUPPORT: every block's task's B and dP on its support (what the workers' directions
        compare with, :func:`encode_direction`)."""
        if self.space.sparse:
            payload = self.space.vectors_to_flat([self.BT, self.dPT])
        else:
            payload = self.direction_layout.pack(np.column_stack([self.BT, self.dPT])[self.block_task], 2)
        self.command(DMTRLCommand.SET_DP_ON_SUPPORT, payload=payload, vectors=2, scalars=0)
        self.mirrored = True

    def directions(self, tails):
        """Every block's momentum direction as sent (:func:`encode_direction`, per rank its blocks in plan
        order) as ``(positions in a task array of self.space, values)``."""
        positions, values = [], []
        for rank, blocks in self.blocks_by_rank():
            tail, pos = tails[rank], 0
            for k in blocks:
                index, size = self.direction_layout.index[k], int(self.direction_layout.sizes[k])
                count = int(tail[pos]) if pos < tail.size and np.isfinite(tail[pos]) else -3
                if count == -1:
                    at, value = np.arange(size, dtype=np.int64), tail[pos + 1:pos + 1 + size]
                    pos += 1 + size
                elif count == -2 and pos + 1 + -(-size // 64) <= tail.size:
                    words = -(-size // 64)
                    at = mask_positions(tail[pos + 1:pos + 1 + words], size)
                    value = tail[pos + 1 + words:pos + 1 + words + at.size]
                    pos += 1 + words + at.size
                elif 0 <= count <= size:
                    at = tail[pos + 1:pos + 1 + count]
                    value = tail[pos + 1 + count:pos + 1 + 2 * count]
                    pos += 1 + 2 * count
                    if not (np.all(np.isfinite(at)) and np.all((at >= 0) & (at < size))):
                        raise ValueError(f"rank {rank}: block {k}'s direction has positions outside its support")
                    at = at.astype(np.int64)
                else:
                    raise ValueError(f"rank {rank}: block {k}'s direction is not [c, ...], [-2, ...] or [-1, ...]")
                if value.size != at.size:
                    raise ValueError(f"rank {rank}: block {k}'s direction is cut short")
                task = int(self.block_task[k])
                positions.append(self.space.block_pos[k][at] if self.space.sparse else task * self.d + index[at])
                values.append(value)
            if pos != tail.size:
                raise ValueError(f"rank {rank}: {tail.size} direction values, its blocks took {pos}")
        cat = (lambda parts, dtype: np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype))
        return cat(positions, np.int64), cat(values, np.float64)

    def restart_momentum(self):
        """No previous step on the workers, none in dP (a new quadratic: a new Sigma, a new lam)."""
        self.dPT = np.zeros_like(self.dPT)      # (a task array of either space)
        self.command(DMTRLCommand.SET_PREVIOUS, payload=self.previous_payloads(None))
        self.dp_known = True

    def gather_previous(self):
        """Every task's previous step (momentum state) as one vector of all rows, tasks in file order."""
        pieces = self.command(DMTRLCommand.GET_PREVIOUS)
        full = [np.zeros(int(n)) for n in self.n]
        for b, rows in self.block_slices(pieces, lambda b: b.n_rows):
            full[b.task][b.start:b.stop] = rows
        return np.concatenate(full) if full else np.zeros(0)

    def previous_payloads(self, full):
        """Per rank, its blocks' slices of ``full`` (zeros when None), under the current plan."""
        offsets = np.concatenate([[0], np.cumsum(self.n.astype(np.int64))])
        pieces = [[] for _ in range(self.cluster.size)]
        for b in self.blocks:
            rows = (np.zeros(b.n_rows) if full is None
                    else full[offsets[b.task] + b.start:offsets[b.task] + b.stop])
            pieces[self.cluster.worker_rank(b.worker)].append(rows)
        return [np.concatenate(p) if p else np.zeros(0) for p in pieces]
