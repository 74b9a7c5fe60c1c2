"""The server's round algebra spread over the ranks (issue 35, item 3): the squared loss's momentum step by CG
and ``W = B Sigma / lam`` computed by fixed chunks of tasks, every rank (rank 0 included) its own chunks.

With a learned Sigma held as factors (``Sigma = V diag(s) V^T + c (I - V V^T)``) a CG product and W are
``O(m d r)``: ``Sigma X = V (K (V^T X)) + c X`` (K = diag(s - c)).  The only sums across tasks are
``V^T X`` (r x d) and CG's inner products; everything else is per task.  So the tasks are cut into chunks whose
size depends on m alone (:func:`chunk_bounds`), each chunk's partial (its ``V_c^T X_c``, its share of
``p.Ap`` or ``r.z``) is computed whole by the one rank that owns the chunk, and rank 0 adds the partials in
chunk order: the same operations on the same numbers at every rank count, so the same bits (P = 1 runs the
same commands on its one rank).  Rank 0 drives CG (its stopping tests, the signal poll) with one command a
reduction; the chunks' rows of dB, dP and B go down once a round, eta, beta and W's rows come back
(docs/many-tasks.md, "Server algebra spread over ranks").

The box losses (hinge, smoothed hinge, logistic under 'qp' / 'adaptive': box momentum) spread the products of
their step problem the same way: rank 0 runs the projected Newton-CG (its active sets, line searches: O(m)
vectors; its capacitance preconditioner's update and solves run on the chunks too, dmtrl/spread_precond.py, rank
0 keeping the Cholesky), and each product ``A v`` is two commands,
the chunks' ``V_c^T X_c`` up and ``Z = V^T X`` down, then the ranks' rows of ``A v`` up
(:meth:`SpreadServer.spread_box_times`).  ``A v`` has the same bits at every rank count, so rank 0 takes the
same decisions at every P; B is updated and ``W = B Sigma / lam`` computed on the chunks as for the squared loss.

Chosen from the problem alone, never from P (:meth:`SpreadServer.spread_applies`): a learned Sigma as factors,
the dense task arrays, momentum (free: the squared loss, box: the box losses; 'qp' / 'adaptive') and at least
:data:`SPREAD_MIN_TASKS` tasks.  Who computes the chunks is chosen from the ranks' cores: all the ranks, or rank
0 alone where they share cores (:meth:`SpreadServer.spread_size`); the bits are the same either way.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np

from ..covariance import SigmaFactors
from ..errors import InputError
from ..engine import Down
from .commands import DMTRLCommand
from . import steps as step_rules
from .steps import block_jacobi

# from this many tasks the squared loss's round algebra is spread (bench/bench_tasks.py --spread-min-tasks; the
# environment variable HPCMTL_SPREAD_MIN_TASKS overrides it, read by every rank alike).  The cost model and the
# measurements behind the number: docs/many-tasks.md
SPREAD_MIN_TASKS = 4096
SPREAD_VARIABLE = "HPCMTL_SPREAD_MIN_TASKS"
# from this many tasks (and the spread on) the box QPs' capacitance preconditioner goes by chunks too
# (dmtrl/spread_precond.py); below it rank 0 keeps its own.  The chunks' capacitances cost every changed chunk its
# own r d x r d update and the tree's sums over it, where rank 0's moves one matrix by all the changes: more
# arithmetic and memory in all, a win only where the ranks' share outweighs that (many tasks, a rank a core).
# HPCMTL_SPREAD_PRECOND_MIN_TASKS overrides it, read by every rank alike.  Measurements: docs/many-tasks.md
PRECOND_MIN_TASKS = 32768
PRECOND_VARIABLE = "HPCMTL_SPREAD_PRECOND_MIN_TASKS"
# a chunk holds at least CHUNK_MIN_TASKS tasks (a chunk's partial costs a BLAS call and r d numbers of traffic),
# and there are at most MAX_CHUNKS chunks (the partials rank 0 receives each reduction: MAX_CHUNKS r d numbers)
CHUNK_MIN_TASKS = 64
MAX_CHUNKS = 64
# what each task's row of the start's payload holds after its dB, dP and B rows
TASK_SCALARS = ("g1", "g2", "a11", "a12", "a22", "c2", "cross", "c2q", "n")
# the same for the box losses' start (after dB, dQ and B): the conjugate blocks of A's products
BOX_SCALARS = ("c2", "cross", "c2q", "n")


def spread_min_tasks(variable: str = SPREAD_VARIABLE) -> int:
    """:data:`SPREAD_MIN_TASKS` (``variable`` PRECOND_VARIABLE: :data:`PRECOND_MIN_TASKS`), or the environment's
    ``variable`` (the same on every rank)."""
    raw = os.environ.get(variable)
    if raw is None or not raw.strip():
        return PRECOND_MIN_TASKS if variable == PRECOND_VARIABLE else SPREAD_MIN_TASKS
    try:
        return int(raw)
    except ValueError:
        raise InputError(f"environment variable {variable}={raw!r}: not a whole number of tasks") from None


# ---------------------------------------------------------------------------
# The chunk arithmetic both halves share (pure NumPy: a chunk's numbers come from its own rows alone)
# ---------------------------------------------------------------------------
def chunk_bounds(m: int) -> np.ndarray:
    """Where each chunk of the m tasks starts, then m: ``max(CHUNK_MIN_TASKS, ceil(m / MAX_CHUNKS))`` tasks a
    chunk (the last one shorter), from m alone."""
    size = max(1, CHUNK_MIN_TASKS, -(-m // MAX_CHUNKS))
    return np.append(np.arange(0, m, size, dtype=np.int64), np.int64(m))


def rank_chunks(bounds, rank: int, size: int):
    """``(first chunk, end chunk, first task, end task)`` of ``rank``'s chunks: contiguous, in rank order (a rank
    may have none when there are fewer chunks than ranks)."""
    n = len(bounds) - 1
    c0, c1 = rank * n // size, (rank + 1) * n // size
    return c0, c1, int(bounds[c0]), int(bounds[c1])


def chunk_partials(V, X, bounds) -> np.ndarray:
    """``V_c^T X_c`` of every chunk c (``bounds``: its rows' starts, then the end): (chunks, r, d)."""
    out = np.empty((len(bounds) - 1, V.shape[1], X.shape[1]))
    for j in range(len(bounds) - 1):
        lo, hi = bounds[j], bounds[j + 1]
        out[j] = V[lo:hi].T @ X[lo:hi]
    return out


def chunk_rows(V, KZ, c, X, bounds) -> np.ndarray:
    """``V KZ + c X`` a chunk at a time (``KZ = K (V^T X)``, the chunks' partials summed): ``Sigma X``'s rows."""
    out = np.empty_like(X)
    for j in range(len(bounds) - 1):
        lo, hi = bounds[j], bounds[j + 1]
        np.matmul(V[lo:hi], KZ, out=out[lo:hi])      # then + c X: the same two roundings, no temporaries
        out[lo:hi] += c * X[lo:hi]
    return out


def chunk_dots(a, b, bounds) -> np.ndarray:
    """Per chunk, ``a . b`` over its tasks of two (2, n) vectors (eta's half, then beta's): each task's
    ``a1 b1 + a2 b2``, then a chunk's tasks added by one ``np.add.reduceat`` segment (its numbers alone)."""
    if len(bounds) < 2:
        return np.zeros(0)
    return np.add.reduceat(a[0] * b[0] + a[1] * b[1], bounds[:-1])


def ordered_sum(parts) -> np.ndarray:
    """The chunks' partials added over the chunk axis of their (chunks, ...) array, all of them at once: the
    array is the same at every rank count, and so is NumPy's fixed order of adding it (one after the other down
    the chunk axis for C-ordered rows, and by ``accumulate`` for one number a chunk: tests/test_spread.py checks
    both against that loop)."""
    parts = np.ascontiguousarray(parts, dtype=np.float64)
    if parts.shape[0] == 0:
        return np.zeros(parts.shape[1:])
    if parts.ndim == 1:                    # one number a chunk: a 1-d reduce would be pairwise, accumulate is not
        return np.add.accumulate(parts)[-1]
    return np.add.reduce(parts, axis=0)


def same_bits(a, b) -> bool:
    """The two float arrays hold the same bits (not only equal values: -0.0 and NaNs count)."""
    a, b = np.ascontiguousarray(a, dtype=np.float64), np.ascontiguousarray(b, dtype=np.float64)
    return a.shape == b.shape and np.array_equal(a.view(np.int64), b.view(np.int64))


def chunked_sigma_times(factors, X) -> np.ndarray:
    """``Sigma X`` of task rows X through the factors, by chunks: the bits the spread commands give at any P
    (rank 0 alone: W outside the rounds, after an Omega-step or a resume)."""
    V = np.ascontiguousarray(factors.V, dtype=np.float64)
    X = np.ascontiguousarray(X, dtype=np.float64)
    bounds = chunk_bounds(len(X))
    Z = ordered_sum(chunk_partials(V, X, bounds))
    return chunk_rows(V, (factors.s - factors.c)[:, None] * Z, factors.c, X, bounds)


# ---------------------------------------------------------------------------
# The worker half: every rank's chunks
# ---------------------------------------------------------------------------
class ChunkState:
    """One rank's chunks of a round: their rows of dB, dP, B, V and CG's vectors as (2, n) arrays."""

    def __init__(self, piece, cached, rank, size):
        pos, n, has_rows = self.read_header(piece, cached, rank, size)
        d = self.d
        self.dB = piece[pos:pos + n * d].reshape(n, d).copy()
        pos += n * d
        if has_rows:                      # B and dP as rank 0 holds them (else as the last round left them here)
            rows = piece[pos:pos + 2 * n * d].reshape(2, n, d)
            pos += 2 * n * d
            self.dP, self.B = rows[0].copy(), rows[1].copy()
        else:
            self.dP, self.B = cached.dP, cached.B
        t = piece[pos:pos + len(TASK_SCALARS) * n].reshape(len(TASK_SCALARS), n)
        self.g = t[0:2].copy()
        self.precond = block_jacobi(t[2].copy(), t[3].copy(), t[4].copy())
        self.c2, self.cross, self.c2q, self.n = (t[k].copy() for k in range(5, 9))
        self.x = np.zeros((2, n))
        self.r_ = self.g.copy()
        self.z = self.solve(self.r_)
        self.p = self.z.copy()
        self.X = self.combine(self.p)
        self.Ap = None

    def read_header(self, piece, cached, rank, size):
        """The piece's sizes, lam, Sigma's K and c and this rank's chunks' rows of V (the cached ones while Sigma is
        the same): where the rows that follow start, this rank's task count and whether rank 0 sent B."""
        self.rank, self.size = rank, size
        m, d, r, has_factors, has_rows = (int(v) for v in piece[:5])
        self.m, self.d, self.r, self.lam = m, d, r, float(piece[5])   # lam: rank 0's (a grid's point, not the config's)
        pos = 6
        if has_factors:                                   # a new Sigma: K, c and the chunks' rows of V
            self.K, self.c = piece[pos:pos + r].copy(), float(piece[pos + r])
            pos += r + 1
        else:
            self.K, self.c = cached.K, cached.c
        bounds = chunk_bounds(m)
        self.n_chunks = len(bounds) - 1
        self.chunk0, self.chunk1, t0, t1 = rank_chunks(bounds, rank, size)
        self.bounds = bounds[self.chunk0:self.chunk1 + 1] - t0
        n = t1 - t0
        if has_factors:
            self.V = piece[pos:pos + n * r].reshape(n, r).copy()
            pos += n * r
        else:
            self.V = cached.V
        return pos, n, bool(has_rows)

    def solve(self, r):
        """The block-Jacobi preconditioner (elementwise: the server path's numbers for these tasks)."""
        return self.precond(r.reshape(-1)).reshape(r.shape)

    def combine(self, v):
        """``diag(v1) dB + diag(v2) dP`` (DenseSpace.combine's arithmetic)."""
        return v[0][:, None] * self.dB + v[1][:, None] * self.dP

    def partials(self, X):
        return chunk_partials(self.V, X, self.bounds).reshape(len(self.bounds) - 1, self.r * self.d)

    def times(self, Z, v):
        """A v on these tasks (StepSolver.momentum_operator's apply): ``S = Sigma X`` from the summed ``Z = V^T X``."""
        S = chunk_rows(self.V, self.K[:, None] * Z.reshape(self.r, self.d), self.c, self.X, self.bounds)
        lam, out = self.lam, np.empty_like(v)
        out[0] = np.einsum("ij,ij->i", self.dB, S) / lam + (self.c2 * v[0] + self.cross * v[1]) / self.n
        out[1] = np.einsum("ij,ij->i", self.dP, S) / lam + (self.cross * v[0] + self.c2q * v[1]) / self.n
        return out


class BoxChunkState(ChunkState):
    """One rank's chunks of a box-loss round: dB, dQ (in ChunkState's ``dP`` slot: :meth:`ChunkState.times` reads
    it as the second direction), B, V; rank 0 sends the vectors whose products it wants (``v``)."""

    def __init__(self, piece, cached, rank, size):      # (no CG state: rank 0 runs the projected Newton-CG)
        pos, n, has_rows = self.read_header(piece, cached, rank, size)
        d = self.d
        rows = piece[pos:pos + 2 * n * d].reshape(2, n, d)
        self.dB, self.dP = rows[0].copy(), rows[1].copy()
        pos += 2 * n * d
        if has_rows:                      # B as rank 0 holds it (else as the last round's finish left it here)
            self.B = piece[pos:pos + n * d].reshape(n, d).copy()
            pos += n * d
        else:
            self.B = cached.B
        t = piece[pos:pos + len(BOX_SCALARS) * n].reshape(len(BOX_SCALARS), n)
        self.c2, self.cross, self.c2q, self.n = (t[k].copy() for k in range(4))
        self.v = self.X = self.Ap = None


class SpreadBlocks:
    """The spread commands' worker half (every rank, rank 0 too): ``self.chunks`` holds this rank's chunks of
    the round in progress (their V rows kept while Sigma is the same)."""

    chunks = None

    def init_spread(self):
        """Every rank reads the spread's setting (HPCMTL_SPREAD_MIN_TASKS) as it builds its local state, so a bad
        value is the same one-line error on every rank before the first round."""
        spread_min_tasks()
        spread_min_tasks(PRECOND_VARIABLE)

    def spread_start(self, ctrl, inputs):
        """SPREAD_START: this rank's rows -> per chunk ``[r.z, V_c^T X_c of p = M g]`` (CG's start)."""
        self.chunks = state = ChunkState(np.asarray(inputs, dtype=np.float64), self.chunks, self.cluster.rank,
                                         self.cluster.size)
        rz = chunk_dots(state.r_, state.z, state.bounds)
        return np.column_stack([rz, state.partials(state.X)])

    def spread_direction(self, ctrl, inputs):
        """SPREAD_DIRECTION [beta]: ``p = z + beta p`` (target 0) or the iterate x itself (target 1) -> per chunk
        ``V_c^T X_c`` of its rows ``X = diag(v1) dB + diag(v2) dP``."""
        st = self.chunks
        if ctrl.target == 0:
            st.p = st.z + float(inputs[0]) * st.p
            st.X = st.combine(st.p)
        else:
            st.X = st.combine(st.x)
        return st.partials(st.X)

    def spread_product(self, ctrl, inputs):
        """SPREAD_PRODUCT [Z = V^T X]: A of the direction (target 0: per chunk ``p.Ap``) or of x (target 1: per
        chunk ``[g.x, x.Ax]``)."""
        st = self.chunks
        if ctrl.target == 2:                          # the box losses: this rank's rows of A v, both halves
            return st.times(inputs, st.v).reshape(-1)
        if ctrl.target == 0:
            st.Ap = st.times(inputs, st.p)
            return chunk_dots(st.p, st.Ap, st.bounds)[:, None]
        Ax = st.times(inputs, st.x)
        return np.column_stack([chunk_dots(st.g, st.x, st.bounds), chunk_dots(st.x, Ax, st.bounds)])

    def spread_update(self, ctrl, inputs):
        """SPREAD_UPDATE [a]: ``x += a p``, ``r -= a Ap``, ``z = M r`` -> per chunk ``r.z``."""
        st, a = self.chunks, float(inputs[0])
        st.x += a * st.p
        st.r_ -= a * st.Ap
        st.z = st.solve(st.r_)
        return chunk_dots(st.r_, st.z, st.bounds)[:, None]

    def spread_finish(self, ctrl, inputs):
        """SPREAD_FINISH [accept]: the steps (x, or 0 when rank 0 refused it), ``dP = eta dB + beta dP``, ``B += dP``
        -> ``[eta, beta, per chunk V_c^T B_c]``."""
        st = self.chunks
        steps = st.x if float(inputs[0]) > 0 else np.zeros_like(st.x)
        st.dP = st.combine(steps)                 # kept with B for the next round: rank 0 then sends neither
        st.B += st.dP
        return np.concatenate([steps.reshape(-1), st.partials(st.B).reshape(-1)])

    def spread_box_start(self, ctrl, inputs):
        """SPREAD_BOX_START: this rank's chunks of a box-loss round (:class:`BoxChunkState`); nothing back."""
        self.chunks = BoxChunkState(np.asarray(inputs, dtype=np.float64), self.chunks, self.cluster.rank,
                                    self.cluster.size)

    def spread_box_direction(self, ctrl, inputs):
        """SPREAD_BOX_DIRECTION [this rank's v_eta, v_beta]: ``X = diag(v_eta) dB + diag(v_beta) dQ`` -> per chunk
        ``V_c^T X_c``."""
        st = self.chunks
        st.v = np.asarray(inputs, dtype=np.float64).reshape(2, -1)
        st.X = st.combine(st.v)
        return st.partials(st.X)

    def spread_box_finish(self, ctrl, inputs):
        """SPREAD_BOX_FINISH [this rank's eta, beta]: ``B += eta dB + beta dQ`` (StepSolver.take_steps' arithmetic,
        DenseSpace.add_two: the same bits as rank 0's B) -> per chunk ``V_c^T B_c``."""
        st = self.chunks
        st.B += st.combine(np.asarray(inputs, dtype=np.float64).reshape(2, -1))
        return st.partials(st.B)

    def spread_w(self, ctrl, inputs):
        """SPREAD_W [Z = V^T B]: this rank's rows of ``W = Sigma B / lam``; CG's vectors are dropped (B, dP kept)."""
        st = self.chunks
        W = chunk_rows(st.V, st.K[:, None] * inputs.reshape(st.r, st.d), st.c, st.B, st.bounds) / st.lam
        st.dB = st.X = st.Ap = st.x = st.r_ = st.z = st.p = None
        return W


# ---------------------------------------------------------------------------
# The server half: rank 0 sends the rows, drives CG, sums the partials in chunk order
# ---------------------------------------------------------------------------
class SpreadServer:
    """The spread round's server half (a :class:`Server` mixin)."""

    local_chunks = SpreadBlocks           # the worker half rank 0 runs itself when it computes every chunk

    def init_spread(self):
        self.spread_sigma = None          # the Sigma whose V rows the ranks hold (sent again when it changes)
        self.spread_rows = None           # (B, dP) as the last spread round left them on the ranks' chunks
        self.spread_chunks = chunk_bounds(self.m)
        self.spread_min = spread_min_tasks()
        self.spread_precond_min = spread_min_tasks(PRECOND_VARIABLE)     # dmtrl/spread_precond.py asks it
        self.spread_local = None          # rank 0's own chunks when it computes all of them (spread_command)
        self.spread_products = 0          # the box losses' spread products of the round in progress (benches read it)

    def spread_applies(self) -> bool:
        """The round's algebra goes by chunks (at every P, P = 1 included: the same bits): a learned Sigma as
        factors (a graph kernel's sparse Sigma has no V to chunk), the dense task arrays, the squared loss's free
        momentum or the box losses' box momentum, m >= SPREAD_MIN_TASKS."""
        return (isinstance(self.sigma_factors, SigmaFactors) and not self.space.sparse
                and self.momentum in ("free", "box") and self.m >= self.spread_min)

    def spread_size(self) -> int:
        """How many ranks share the chunks: all of them, or rank 0 alone where the ranks share cores (the cluster's
        waits sleep: a command's collectives then wait for the scheduler, 1.4 ms each at P = 3 on 2 cores, and the
        other ranks' chunks run on the same cores anyway).  Who computes a chunk does not change its bits."""
        return 1 if self.cluster.sleep_waits else self.cluster.size

    def spread_command(self, cmd, payload=None, **fields):
        """``cmd`` on the ranks (its per-rank answers), or, when rank 0 computes every chunk
        (:meth:`spread_size` 1), the same worker half run here on one :class:`ChunkState` of all the chunks, with
        no collective (one answer).  In one process this is what the serial cluster's command does."""
        if self.spread_size() == self.cluster.size:
            return self.command(cmd, payload=payload, **fields)
        if self.spread_local is None:
            self.spread_local = self.local_chunks()
            self.spread_local.cluster = SimpleNamespace(rank=0, size=1)
        ctrl = SimpleNamespace(target=int(fields.get("target", 0)))
        inputs = payload[0] if cmd.down is Down.SCATTER_VECTORS else payload
        return [getattr(self.spread_local, cmd.compute)(ctrl, inputs)]

    def spread_sigma_times(self, XT):
        """``Sigma X`` by chunks on rank 0 alone: W outside the rounds, the bits the spread rounds give."""
        return chunked_sigma_times(self.sigma_factors, XT)

    def spread_ranges(self):
        """Each computing rank's ``(first chunk, end chunk, first task, end task)``, in rank order."""
        size = self.spread_size()
        return [rank_chunks(self.spread_chunks, rank, size) for rank in range(size)]

    @staticmethod
    def chunk_sum(parts):
        """The chunks' partials added in chunk order (:func:`ordered_sum`)."""
        return ordered_sum(parts)

    def spread_by_chunk(self, cmd, columns, payload, **fields):
        """``cmd``'s per-rank answers as one row of ``columns`` numbers a chunk (ranks own contiguous chunks in
        rank order, so rank order is chunk order)."""
        pieces = self.spread_command(cmd, payload=payload, **fields)
        flat = np.concatenate([np.asarray(p, dtype=np.float64).reshape(-1) for p in pieces])
        return flat.reshape(len(self.spread_chunks) - 1, columns)

    def spread_payloads(self, dBT, dPT, g, blocks, scalars):
        """Every rank's SPREAD_START piece: ``[m, d, r, has_factors, has_rows, lam, (K, c, V rows), dB, (dP, B rows),
        TASK_SCALARS]``.  V goes when Sigma changed; B and dP unless they are, bit for bit, what the last spread round
        left on the ranks (anything else that set them since, a resume, local rounds, is seen)."""
        kept = self.spread_rows
        send_rows = kept is None or not (same_bits(kept[0], self.BT) and same_bits(kept[1], dPT))
        _, c2, _, c2q, cross = scalars.T[:5]
        rows = np.column_stack([g[:self.m], g[self.m:], *blocks, c2, cross, c2q, self.n])

        def task_rows(t0, t1):
            return ([dBT[t0:t1]] + ([dPT[t0:t1], self.BT[t0:t1]] if send_rows else []) + [rows[t0:t1].T])
        return self.chunk_pieces(send_rows, task_rows)

    def chunk_pieces(self, send_rows, task_rows):
        """Every rank's piece of a round's start: the header ``[m, d, r, has_factors, has_rows, lam]``, K and c and
        its chunks' rows of V when Sigma changed since the last spread round, then ``task_rows(t0, t1)`` of its
        chunks' tasks (what :meth:`ChunkState.read_header` reads)."""
        factors, size = self.sigma_factors, self.spread_size()
        fresh = self.spread_sigma is not factors
        head = [np.array([self.m, self.d, factors.V.shape[1], int(fresh), int(send_rows), self.config.lam],
                         dtype=np.float64)]
        if fresh:
            head.append(np.append(factors.s - factors.c, factors.c))
        pieces = []
        for rank in range(size):
            _, _, t0, t1 = rank_chunks(self.spread_chunks, rank, size)
            piece = head + ([factors.V[t0:t1]] if fresh else []) + task_rows(t0, t1)
            pieces.append(np.concatenate([np.asarray(x).reshape(-1) for x in piece]))
        self.spread_sigma = factors
        return pieces

    def spread_steps(self, dBT, scalars, dQT=None):
        """The squared loss's ``(eta, beta)`` (:meth:`StepSolver.steps_momentum_cg`'s CG, the same stopping rules)
        with its products and ``W = B Sigma / lam`` spread; ``self.BT``, ``self.dPT`` and ``self.WT`` updated.
        The box losses (``dQT``: box momentum's second direction): :meth:`spread_box_steps`."""
        if self.momentum == "box":
            return self.spread_box_steps(dBT, dQT, scalars)
        m, solver = self.m, self.solver
        _, g, blocks = solver.momentum_operator(self.step_inputs(), dBT, scalars)    # O(m d): g and M's blocks
        rd = self.sigma_factors.V.shape[1] * self.d
        first = self.spread_by_chunk(DMTRLCommand.SPREAD_START, 1 + rd,
                                     self.spread_payloads(dBT, self.dPT, g, blocks, scalars))
        rz, Z = float(ordered_sum(first[:, 0])), ordered_sum(first[:, 1:])
        products, accept = 0, 0.0
        if rz > 0:
            small, q = step_rules.CG_RTOL * step_rules.CG_RTOL * rz, 0.0      # read now: benches and tests set them
            gain_rtol = step_rules.CG_GAIN_RTOL if m >= step_rules.CG_INEXACT_MIN_TASKS else 0.0
            for _ in range(step_rules.CG_MAX_ITER):
                if self.signal_pending():
                    break
                products += 1
                parts = self.spread_by_chunk(DMTRLCommand.SPREAD_PRODUCT, 1, Z, width=rd, target=0)
                curv = float(ordered_sum(parts[:, 0]))
                if not curv > 0:
                    break
                a = rz / curv
                parts = self.spread_by_chunk(DMTRLCommand.SPREAD_UPDATE, 1, np.array([a]), width=1)
                rz_new = float(ordered_sum(parts[:, 0]))
                gain = 0.5 * a * rz
                q += gain
                if gain_rtol > 0 and gain <= gain_rtol * q:
                    break
                if not rz_new > small:
                    break
                Z = ordered_sum(self.spread_by_chunk(DMTRLCommand.SPREAD_DIRECTION, rd, np.array([rz_new / rz]),
                                                     width=1, target=0))
                rz = rz_new
            # the step is kept only when it raises the quadratic (as the server path checks g.v - v.A.v / 2 > 0)
            Zx = ordered_sum(self.spread_by_chunk(DMTRLCommand.SPREAD_DIRECTION, rd, np.zeros(1), width=1, target=1))
            value = self.spread_by_chunk(DMTRLCommand.SPREAD_PRODUCT, 2, Zx, width=rd, target=1)
            accept = float(float(ordered_sum(value[:, 0])) - 0.5 * float(ordered_sum(value[:, 1])) > 0)
        solver.cg_iterations = products
        pieces = self.spread_command(DMTRLCommand.SPREAD_FINISH, payload=np.array([accept]), width=1)
        eta, beta, partials = np.zeros(m), np.zeros(m), []
        for rank, piece in enumerate(pieces):
            c0, c1, t0, t1 = rank_chunks(self.spread_chunks, rank, self.spread_size())
            n = t1 - t0
            eta[t0:t1], beta[t0:t1] = piece[:n], piece[n:2 * n]
            partials.append(piece[2 * n:].reshape(c1 - c0, rd))
        ZB = ordered_sum(np.concatenate(partials)) if partials else np.zeros(rd)
        WT = np.concatenate([np.asarray(p).reshape(-1) for p in
                             self.spread_command(DMTRLCommand.SPREAD_W, payload=ZB.reshape(-1), width=rd)])
        self.dPT = self.space.combine(eta, dBT, beta, self.dPT)     # the ranks' arithmetic on their rows: the same bits
        self.space.add(self.BT, self.dPT)
        self.spread_rows = (self.BT.copy(), self.dPT.copy())
        self.WT = WT.reshape(m, self.d)
        return eta, beta

    # -- the box losses: rank 0 drives the projected Newton-CG, the ranks compute its products --------------------
    def spread_box_payloads(self, dBT, dQT, scalars):
        """Every rank's SPREAD_BOX_START piece: ``[m, d, r, has_factors, has_rows, lam, (K, c, V rows), dB, dQ,
        (B rows), BOX_SCALARS]``; V as :meth:`spread_payloads` sends it, B unless the ranks hold its bits."""
        send_rows = self.spread_rows is None or not same_bits(self.spread_rows[0], self.BT)
        _, c2, _, c2q, cross = scalars.T[:5]
        rows = np.column_stack([c2, cross, c2q, self.n])

        def task_rows(t0, t1):
            return [dBT[t0:t1], dQT[t0:t1]] + ([self.BT[t0:t1]] if send_rows else []) + [rows[t0:t1].T]
        return self.chunk_pieces(send_rows, task_rows)

    def spread_by_rank(self, x):
        """``x`` = [first half; second half] (2m) cut into each rank's ``[its tasks' first half, second half]``."""
        m, size = self.m, self.spread_size()
        pieces = []
        for rank in range(size):
            _, _, t0, t1 = rank_chunks(self.spread_chunks, rank, size)
            pieces.append(np.concatenate([x[t0:t1], x[m + t0:m + t1]]))
        return pieces

    def spread_box_times(self, v):
        """``A v`` of the box step problem (StepSolver.momentum_operator's apply) by chunks: each rank its tasks'
        ``V_c^T X_c`` (summed here in chunk order), then with ``Z = V^T X`` its tasks' rows of ``A v``.  16 m
        bytes down and up, plus the chunks' partials and Z (r d numbers each) a product."""
        rd, m = self.sigma_factors.V.shape[1] * self.d, self.m
        Z = ordered_sum(self.spread_by_chunk(DMTRLCommand.SPREAD_BOX_DIRECTION, rd, self.spread_by_rank(v)))
        pieces = self.spread_command(DMTRLCommand.SPREAD_PRODUCT, payload=Z, width=rd, target=2)
        out = np.empty(2 * m)
        for rank, piece in enumerate(pieces):
            _, _, t0, t1 = rank_chunks(self.spread_chunks, rank, self.spread_size())
            n = t1 - t0
            out[t0:t1], out[m + t0:m + t1] = piece[:n], piece[n:]
        self.spread_products += 1
        return out

    def spread_box_inputs(self):
        """The round's :class:`StepInputs` with A's products by chunks."""
        return self.step_inputs()._replace(apply=self.spread_box_times)

    def spread_box_steps(self, dBT, dQT, scalars):
        """The box losses' ``(eta, beta)``: :meth:`StepSolver.steps_box_momentum` on rank 0 with every product of
        A by chunks on the ranks (:meth:`spread_box_times`); then B updated on the chunks as rank 0 updates it, and
        ``W = B Sigma / lam`` from them (SPREAD_W).  ``self.BT`` and ``self.WT`` updated."""
        self.spread_command(DMTRLCommand.SPREAD_BOX_START, payload=self.spread_box_payloads(dBT, dQT, scalars))
        self.spread_products = 0
        inputs = self.spread_box_inputs()
        eta, beta, _ = self.solver.take_steps(inputs, dBT, dQT, scalars)       # rank 0's BT += eta dB + beta dQ
        rd = self.sigma_factors.V.shape[1] * self.d
        parts = self.spread_by_chunk(DMTRLCommand.SPREAD_BOX_FINISH, rd,
                                     self.spread_by_rank(np.concatenate([eta, beta])))
        WT = np.concatenate([np.asarray(p).reshape(-1) for p in
                             self.spread_command(DMTRLCommand.SPREAD_W, payload=ordered_sum(parts), width=rd)])
        self.spread_rows = (self.BT.copy(), None)
        self.WT = WT.reshape(self.m, self.d)
        return eta, beta
