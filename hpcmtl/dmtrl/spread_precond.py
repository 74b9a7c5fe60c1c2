"""The box QPs' capacitance preconditioner spread over the ranks by task chunks (issue 35, after the products:
docs/many-tasks.md, "The box losses' preconditioner on the chunks").

With the box losses' products spread (dmtrl/spread.py), rank 0's step was mostly the projected Newton-CG's
preconditioner (:class:`.qp_precond.CapacitancePreconditioner`): moving the capacitance ``G = Z_F^T Dg_F^-1 Z_F``
(r d x r d) by the tasks whose free coordinates changed (``|changes| (r d)^2`` a Newton iteration: half of rank
0's step at 10^4 tasks) and the solves' ``Z^T u`` and ``Z t`` (O(m r d) each).  Everything in it but the
Cholesky is per task or a sum over tasks, so each rank holds one :class:`CapacitancePreconditioner` a chunk of
its tasks (the chunks of dmtrl/spread.py: the same arithmetic, a chunk's numbers from its own rows):

* ``SPREAD_BOX_FREE`` (each rank its tasks' free codes): every chunk updates its ``G_c`` by its changed tasks;
  the chunks' ``G_c`` are added over a fixed binary tree of the chunk indices (:func:`tree_nodes`): each rank
  adds the whole subtrees inside its range and sends the upper triangles of those whose chunks changed (its
  range's canonical nodes, at most 2 log2(chunks), one where ranks and subtrees align), rank 0 adds the rest of
  the tree.  Every node is its two children's sum whoever computes it, so G has the same bits at every rank count;
  the traffic is a few triangles a rank, not one a chunk.  Rank 0 factors ``I + G`` (the only ``(r d)^3`` step).
* a solve is two commands: ``SPREAD_BOX_SOLVE`` (each rank its rows of r) -> per chunk ``Z_c^T Dg_c^-1 r_c``,
  added in chunk order; ``SPREAD_BOX_SOLVE_ROWS`` (Bcast ``s = C^-1 Z^T u``) -> each rank its rows of
  ``Dg^-1 (r - Z s)``, the lifted tasks' null directions removed.

From ``spread.PRECOND_MIN_TASKS`` tasks on (below it rank 0's one G moved by all the changes costs less than the
chunks' own updates and sums: docs/many-tasks.md).  Rank 0 keeps the Newton-CG, its active sets and line searches (O(m) vector work a product, cheap beside the
rest) and only its ``precond`` changes: the solves are the rank-0 path's arithmetic on chunks (other roundings
of the same numbers), so the spread path is bitwise the same at every P, not the rank-0 path's bits.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg
from scipy.linalg.blas import dgemm

from .commands import DMTRLCommand
from .qp_precond import CAPACITY_MAX, CapacitancePreconditioner, capacitance_factor, terms_of


def tree_nodes(lo: int, hi: int, a: int, b: int):
    """The largest nodes of the binary tree over chunks ``[lo, hi)`` (a node's children split it at its middle)
    that lie inside ``[a, b)`` and together cover it, left to right."""
    if b <= lo or hi <= a or lo >= hi:
        return []
    if a <= lo and hi <= b:
        return [(lo, hi)]
    mid = (lo + hi) // 2
    return tree_nodes(lo, mid, a, b) + tree_nodes(mid, hi, a, b)


def tree_sum(lo: int, hi: int, known):
    """The node ``[lo, hi)``'s sum: ``known[(lo, hi)]`` when given, else its two children's sums added (left +
    right): the same additions whoever computed the known nodes."""
    if (lo, hi) in known:
        return known[(lo, hi)]
    mid = (lo + hi) // 2
    return tree_sum(lo, mid, known) + tree_sum(mid, hi, known)


def kept_columns(r: int, d: int) -> int:
    """The capacitance's columns ``k d``: :func:`.qp_precond.terms_of` keeps ``min(r, CAPACITY_MAX // d)`` terms."""
    return min(r, max(0, CAPACITY_MAX // max(d, 1))) * d


class ChunkCapacitance(CapacitancePreconditioner):
    """One chunk's :class:`CapacitancePreconditioner`, its ``G_c`` moved by one BLAS call a piece of changed tasks
    that adds ``Y^T X`` into G in place (``Y = [Z1; Z2]``, ``X = [e11 Z1 + e12 Z2; e12 Z1 + e22 Z2]``): a chunk
    changes by a few tasks a Newton iteration, where the r d x r d temporaries and sums of the rank-0 update's
    four products cost 16x this call (one BLAS thread, r d = 441, 5 tasks)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.G = np.zeros_like(self.G, order="F")       # dgemm's output, updated in place

    def add_changes(self, Z1, Z2, e11, e12, e22):
        """G moved in place by one BLAS call (``G += Y^T X``): a chunk changes by a few tasks at a time, where the
        rank-0 update's products and their temporaries cost several times that call."""
        if Z2 is not None:
            Y, X = np.vstack([Z1, Z2]), np.vstack([e11[:, None] * Z1 + e12[:, None] * Z2,
                                                   e12[:, None] * Z1 + e22[:, None] * Z2])
        else:
            Y, X = Z1, e11[:, None] * Z1
        dgemm(1.0, Y, X, beta=1.0, c=self.G, trans_a=1, overwrite_c=1)


def upper_mask(K: int) -> np.ndarray:
    """G's upper triangle, diagonal included (row by row: the order its entries travel in)."""
    return np.triu(np.ones((K, K), dtype=bool))


class RankCapacitance:
    """One rank's chunks of a box QP's preconditioner (``directions`` 1: eta alone, 2: eta and beta): one
    :class:`CapacitancePreconditioner` a chunk, and the sums of the tree's nodes inside this rank's range."""

    def __init__(self, st, directions):
        self.two = directions == 2
        self.n_chunks = st.n_chunks
        self.c0, self.c1 = st.chunk0, st.chunk1
        self.parts = []
        for j in range(len(st.bounds) - 1):
            lo, hi = int(st.bounds[j]), int(st.bounds[j + 1])
            n = st.n[lo:hi]
            U, rest = terms_of(st.V[lo:hi], st.K, st.c, st.lam, st.d)
            rows = [st.dB[lo:hi]] + ([st.dP[lo:hi]] if self.two else [])
            extra = ((st.c2[lo:hi] / n, st.cross[lo:hi] / n, st.c2q[lo:hi] / n) if self.two else (st.c2[lo:hi] / n,))
            self.parts.append(ChunkCapacitance(U, rest, rows, st.lam, extra))
        self.sums = {}                     # the tree's nodes inside this rank's range, kept while their chunks stay
        self.fresh = True
        self.u = None

    def free(self, codes):
        """Every chunk's ``G_c`` moved to its tasks' free ``codes``; -> ``[lo, hi, upper triangle]`` of each node
        of this rank's range (:func:`tree_nodes`) with a changed chunk below it."""
        changed = set()
        pos = 0
        for j, part in enumerate(self.parts):
            code = codes[pos:pos + part.m].astype(np.int8)
            pos += part.m
            if self.fresh or np.any(code != part.code):      # (an unchanged chunk keeps its G and inverses)
                changed.add(self.c0 + j)
                part.update(code)
        self.fresh = False
        out = []
        K = self.parts[0].G.shape[0] if self.parts else 0
        upper = upper_mask(K)
        for lo, hi in tree_nodes(0, self.n_chunks, self.c0, self.c1):
            if any(lo <= j < hi for j in changed):
                out += [np.array([lo, hi], dtype=np.float64), self.node(lo, hi, changed)[upper]]
        return np.concatenate(out) if out else np.zeros(0)

    def node(self, lo, hi, changed):
        """The node ``[lo, hi)``'s sum of ``G_c`` (a chunk's own G at a leaf), again only where a chunk changed."""
        if hi - lo == 1:
            return self.parts[lo - self.c0].G
        if (lo, hi) in self.sums and not any(lo <= j < hi for j in changed):
            return self.sums[(lo, hi)]
        mid = (lo + hi) // 2
        left, right = self.node(lo, mid, changed), self.node(mid, hi, changed)
        total = self.sums.get((lo, hi))
        if total is None:                 # kept and added into in place (no new r d x r d array a Newton iteration)
            self.sums[(lo, hi)] = total = np.empty_like(left, order="F")
        return np.add(left, right, out=total)

    def chunk_rows(self, rows, j, lo, hi):
        """Chunk j's part of a rank's rows (``[first halves; second halves]`` with two directions)."""
        if not self.two:
            return rows[lo:hi]
        n = rows.size // 2
        return np.concatenate([rows[lo:hi], rows[n + lo:n + hi]])

    def solve_up(self, rows, bounds):
        """``u = Dg^-1 r`` per chunk (kept) -> per chunk ``Z_c^T u_c``."""
        self.u = [part.dg_inv(self.chunk_rows(rows, j, int(bounds[j]), int(bounds[j + 1])))
                  for j, part in enumerate(self.parts)]
        return np.concatenate([part.z_t(u) for part, u in zip(self.parts, self.u)]) if self.parts else np.zeros(0)

    def solve_rows(self, s, has_factor):
        """This rank's rows of ``(I - n n^T) (u - Dg^-1 Z s)`` (the first halves, then the second ones)."""
        out = []
        for part, u in zip(self.parts, self.u):
            if has_factor:
                u = u - part.dg_inv(part.z_times(s))
            out.append(part.unlift(u))
        self.u = None
        if not self.two or not out:
            return np.concatenate(out) if out else np.zeros(0)
        return np.concatenate([u[:u.size // 2] for u in out] + [u[u.size // 2:] for u in out])


class SpreadPrecondBlocks:
    """The spread preconditioner's worker half (a mixin beside :class:`.spread.SpreadBlocks`, every rank, rank 0
    too: it reads the box round's chunks, ``self.chunks``): ``self.chunks.precond`` holds this rank's
    :class:`RankCapacitance` of the box QP in progress (by its direction count)."""

    def spread_box_free(self, ctrl, inputs):
        """SPREAD_BOX_FREE [fresh, this rank's tasks' free codes, its rows of r] -> per chunk ``Z_c^T Dg_c^-1 r_c``
        on the new free set (the first solve's half), then the changed tree nodes (RankCapacitance.free)."""
        st = self.chunks
        inputs = np.asarray(inputs, dtype=np.float64)
        if inputs[0] > 0 or ctrl.target not in getattr(st, "precond", {}):
            # a new QP's preconditioner: the last QP's (its chunks' G and tree sums) is not asked again
            st.precond = {ctrl.target: RankCapacitance(st, ctrl.target)}
        rc, n = st.precond[ctrl.target], len(st.c2)
        nodes = rc.free(inputs[1:1 + n])
        return np.concatenate([rc.solve_up(inputs[1 + n:], st.bounds), nodes])

    def spread_box_solve(self, ctrl, inputs):
        """SPREAD_BOX_SOLVE [this rank's rows of r] -> per chunk ``Z_c^T Dg_c^-1 r_c``."""
        return self.chunks.precond[ctrl.target].solve_up(np.asarray(inputs, dtype=np.float64), self.chunks.bounds)

    def spread_box_solve_rows(self, ctrl, inputs):
        """SPREAD_BOX_SOLVE_ROWS [has_factor, s] -> this rank's rows of the solve."""
        inputs = np.asarray(inputs, dtype=np.float64)
        return self.chunks.precond[ctrl.target].solve_rows(inputs[1:], inputs[0] > 0)


class SpreadCapacitance:
    """Rank 0's half of one box QP's spread preconditioner: what ``box_qp_operator`` asks of its ``precond``
    (``for_free(free) -> solve``), each through the chunks' commands."""

    def __init__(self, server, directions):
        self.server, self.directions = server, directions
        self.K = kept_columns(server.sigma_factors.V.shape[1], server.d)
        self.known = {}
        self.fresh = True
        self.code = self.factor = None     # the free codes the next solve sends first; I + G's Cholesky factor

    def for_free(self, free):
        """The solve on the free set ``free``: the capacitance moves to it with the first solve's first half (one
        command, SPREAD_BOX_FREE: CG's first solve follows at once)."""
        m = self.server.m
        self.code = free[:m].astype(np.float64) + (2.0 * free[m:] if self.directions == 2 else 0.0)
        return self.solve

    def moved(self, rows):
        """SPREAD_BOX_FREE with the first solve's rows: the chunks' partials ``Z_c^T u_c`` (chunks x K); the
        changed tree nodes kept, ``I + G`` factored (None: no terms kept, or indefinite)."""
        server, ranges = self.server, self.server.spread_ranges()
        pieces = [np.concatenate([[float(self.fresh)], self.code[t0:t1], part])
                  for (_, _, t0, t1), part in zip(ranges, rows)]
        self.fresh, self.code = False, None
        width = 2 + self.K * (self.K + 1) // 2
        parts = []
        for (c0, c1, _, _), piece in zip(ranges, server.spread_command(DMTRLCommand.SPREAD_BOX_FREE, payload=pieces,
                                                                        target=self.directions)):
            piece = np.asarray(piece, dtype=np.float64)
            parts.append(piece[:(c1 - c0) * self.K].reshape(c1 - c0, self.K))
            for node in piece[(c1 - c0) * self.K:].reshape(-1, width):
                self.known[(int(node[0]), int(node[1]))] = node[2:]
        self.factor = None
        if self.K:
            G = np.zeros((self.K, self.K))
            G[upper_mask(self.K)] = tree_sum(0, len(server.spread_chunks) - 1, self.known)
            G = G + np.triu(G, 1).T
            self.factor = capacitance_factor(G)
        return np.concatenate(parts)

    def solve(self, r):
        """``r -> M_FF^-1 r`` (two commands; the first after :meth:`for_free` also moves the capacitance)."""
        server, m = self.server, self.server.m
        rows = server.spread_by_rank(r) if self.directions == 2 else self.by_rank(r)
        if self.code is not None:
            parts = self.moved(rows)
        else:
            parts = server.spread_by_chunk(DMTRLCommand.SPREAD_BOX_SOLVE, self.K, rows, target=self.directions)
        factor = self.factor
        s = (scipy.linalg.cho_solve(factor, server.chunk_sum(parts), check_finite=False) if factor is not None
             else np.zeros(self.K))
        pieces = server.spread_command(DMTRLCommand.SPREAD_BOX_SOLVE_ROWS, payload=np.append(float(factor is not None),
                                       s), width=1 + self.K, target=self.directions)
        out = np.empty(r.size)
        for (_, _, t0, t1), piece in zip(server.spread_ranges(), pieces):
            n = t1 - t0
            out[t0:t1] = piece[:n]
            if self.directions == 2:
                out[m + t0:m + t1] = piece[n:]
        return out

    def by_rank(self, x):
        return [x[t0:t1] for _, _, t0, t1 in self.server.spread_ranges()]


class SpreadPrecondServer:
    """The server's spread rounds with the box QPs' preconditioner on the chunks too (a mixin before
    :class:`.spread.SpreadServer`, whose box round asks for its inputs here)."""

    def spread_box_inputs(self):
        inputs = super().spread_box_inputs()
        if self.m < self.spread_precond_min:        # rank 0's own preconditioner (spread.PRECOND_MIN_TASKS)
            return inputs
        return inputs._replace(capacitance=lambda directions: SpreadCapacitance(self, directions))
