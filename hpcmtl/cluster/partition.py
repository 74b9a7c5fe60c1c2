"""Which rows each worker owns: the block plan (pure arithmetic, testable without MPI).

A plan is a list of :class:`Block` (a task's row range and its worker) in the
order a Gatherv over the workers delivers them; :meth:`hpcmtl.cluster.Cluster.planned`
gives a cluster whose plan-driven collectives follow one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Block:
    task: int
    part: int
    start: int
    stop: int
    worker: int          # worker index 0..n_workers-1

    @property
    def n_rows(self) -> int:
        return self.stop - self.start


def plan_blocks(n_samples, nnz, n_workers: int, split_large: bool = False):
    """Assign task row blocks to workers, balanced by non-zeros, deterministically.

    Greedy longest-processing-time: blocks in order of decreasing nnz (ties by
    task, part) go to the least-loaded worker (ties by worker index).  With
    ``split_large`` a task whose nnz exceeds the ideal share ``sum(nnz) /
    n_workers`` is cut into ``ceil(nnz / share)`` row ranges of near-equal size
    (at most ``n_workers`` and at most ``n_i`` pieces).

    Returns the blocks sorted by (worker, task, part): the order in which a
    Gatherv over workers delivers their columns.
    """
    n_samples = np.asarray(n_samples, dtype=np.int64)
    nnz = np.asarray(nnz, dtype=np.float64)
    if n_workers < 1:
        raise ValueError("need at least one worker")
    pieces = []
    share = nnz.sum() / n_workers
    for t, (n, z) in enumerate(zip(n_samples, nnz)):
        k = 1
        if split_large and share > 0 and z > share:
            k = int(min(n_workers, n, int(np.ceil(z / share))))
        edges = np.linspace(0, n, k + 1).round().astype(np.int64)
        for p in range(k):
            pieces.append((t, p, int(edges[p]), int(edges[p + 1]), z * (edges[p + 1] - edges[p]) / max(n, 1)))
    order = sorted(range(len(pieces)), key=lambda b: (-pieces[b][4], pieces[b][0], pieces[b][1]))
    load = np.zeros(n_workers)
    owner = {}
    for b in order:
        w = int(np.argmin(load))       # first minimum: lowest index wins ties
        owner[b] = w
        load[w] += pieces[b][4] + 1.0  # +1: even empty tasks cost a little
    blocks = [Block(t, p, s, e, owner[b]) for b, (t, p, s, e, _) in enumerate(pieces)]
    return sorted(blocks, key=lambda b: (b.worker, b.task, b.part))
