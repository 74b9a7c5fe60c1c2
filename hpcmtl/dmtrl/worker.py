"""The worker core: a rank's task blocks, their dual variables and w, and the rounds' computations.

:class:`LocalBlocks` holds the blocks and answers the core commands (SDCA, TRIAL, APPLY, SET_W, SET_SIGMA,
the state); each feature's commands are answered by its mixin (:mod:`.supports`, :mod:`.momentum`,
:mod:`.local_rounds`, :mod:`.interior_rounds`, :mod:`.margin`).
"""
from __future__ import annotations

import functools

import numpy as np

from .. import _sdca
from ..checkpoint import BlockState
from ..engine import EngineCommand, LocalBase, nan_fault
from .batched import BatchedBlocks
from .commands import DMTRLCommand
from .config import DMTRLConfig, uses_exact_box_solver, uses_exact_solver
from .interior_rounds import InteriorBlocks
from .dual_phase import DualCommand, DualPhaseBlocks
from .joint import JointBlocks, JointCommand
from .spectral_phase import SpectralCommand, SpectralPhaseBlocks
from .local_rounds import LocalRoundBlocks
from .margin import MarginBlocks
from .momentum import MomentumBlocks, box_direction
from .spread import SpreadBlocks
from .spread_precond import SpreadPrecondBlocks
from .steps import QP_ITERATIONS, box_qp, conjugate_along, conjugate_terms, coupled_passes
from .supports import SupportBlocks


# pending local steps (aggregations other than 'safe'): every block's shrinking restarts every this many local steps.
# liblinear's own restart (the active set's projected gradients within eps) assumes each pass continues the last
# one's iterate; here only eta of each step is applied, and the active sets can freeze with the dual far from its
# optimum (docs/dmtrl-notes.md)
UNSHRINK_EVERY = 20


def block_seed(seed: int, task: int, part: int, round_: int, inner: int = 0) -> int:
    """The 64-bit seed of one block's coordinate stream in one round (``inner``: its local step in that round,
    ``local_steps``)."""
    return _seed_of((int(seed), int(task), int(part), int(round_)) + ((int(inner),) if inner else ()))


@functools.lru_cache(maxsize=1 << 15)
def _seed_of(key: tuple) -> int:
    # The first 64 bits of SeedSequence(key).  Memoized: a SeedSequence costs some 25 us, and a CV path asks
    # for the same (seed, task, part, round) in every fold fit and at every grid point (tens of thousands of
    # calls, about 5 s of a 68 s Landmine-sized DMTRL run); the cache holds the same integers, so the
    # streams are bit for bit those of a fresh SeedSequence (tests/test_kernels.py checks against one)
    return int(np.random.SeedSequence(list(key)).generate_state(1, dtype=np.uint64)[0])


def box_local_step(blk, a, w, c, loss, gamma=1.0):
    """The hinge (smoothed hinge) local subproblem of a block solved exactly: its step ``delta`` from ``a``.

    In ``beta_j = y_j (a_j + delta_j)`` in [0, 1], maximizing
    ``-sum l*(-(a + delta)) - delta^T X w - (c / (2 n)) ||X^T delta||^2`` (what local SDCA
    approaches as its passes grow) is ``max g.beta - beta.A.beta / 2`` with ``Z = diag(y) X``,
    ``A = (c / n) Z Z^T (+ gamma I, smoothed hinge)``, ``g = 1 - Z w + (c / n) Z X^T a``:
    :func:`box_qp`, started at the current beta, so the step never loses.  On raw features
    with a small lam local SDCA needs thousands of passes a task where this takes one.
    ``A`` (n x n) exists only during the call: blocks of at most EXACT_BOX_ROWS rows.  A QP stopped by its
    iteration cap still never loses (the server's step then decides how much of it to take).
    """
    n, y = float(blk.n_task), blk.y
    Z = blk.signed_rows()
    A = (c / n) * (Z @ Z.T)
    if loss == "smoothed-hinge":
        A[np.diag_indices_from(A)] += gamma
    g = 1.0 - y * blk.decision(w) + (c / n) * y * blk.decision(blk.rmatvec(a))
    # the active set can change one bound an iteration: up to a few per row (60 rows of rank 5 from zero: 60 < it <= 200)
    beta = box_qp(A, g, 1.0, start=np.clip(y * a, 0.0, 1.0), max_iter=QP_ITERATIONS + 10 * len(a))
    return y * beta - a


class LocalBlocks(SupportBlocks, MomentumBlocks, LocalRoundBlocks, InteriorBlocks, MarginBlocks, JointBlocks,
                  DualPhaseBlocks, SpectralPhaseBlocks, BatchedBlocks, SpreadBlocks, SpreadPrecondBlocks, LocalBase):
    """A rank's task blocks with their dual variables and current w columns.

    Each method named by a :class:`DMTRLCommand` is the worker-side computation of
    that command on this rank's blocks: ``(ctrl, inputs) -> rows`` (or None),
    with the collectives left to the engine.

    With the support exchange (``exchange='auto'``) a block exchanged on its support S_k
    (:func:`exchange_index`) is also computed on it: its columns are renumbered
    ``0 .. |S_k| - 1`` at construction (:meth:`TaskBlock.on_features`), and its w, its local
    steps and its local-round state are vectors of ``|S_k|`` numbers, never d.  The support
    commands' values are then these vectors as they are; the dense commands' rows are
    converted at the boundary (:meth:`dense_rows`, :meth:`from_rows`).  ``features[k]`` is S_k
    (None: the block keeps all d columns).
    """

    COMMANDS = (EngineCommand, DMTRLCommand, JointCommand, DualCommand, SpectralCommand)

    def __init__(self, cluster, blocks, config: DMTRLConfig, test_blocks=None, consume=False):
        """``consume``: the caller hands ``blocks`` over (its list then holds this rank's blocks as computed
        on): each block computed on its support replaces the one read in that list at once, so the two are
        never all in memory together.  Otherwise the caller's blocks are left as they are (model selection
        builds several local states over the same blocks)."""
        super().__init__(cluster, list(blocks), config, test_blocks)
        self.exact = uses_exact_solver(config, self.d)
        self.exact_box = [uses_exact_box_solver(config, b.n_rows) for b in self.blocks]
        self.init_support_exchange(blocks if consume else None)
        self.w = [np.zeros(b.n_features) for b in self.blocks]
        self.w_dense = None       # every block's whole w row, when SET_W sent it (scores of rows off the supports)
        self.state = [BlockState(np.zeros(b.n_rows), np.arange(b.n_rows, dtype=np.int32), None) for b in self.blocks]
        self.sigma_ii = np.ones(len(self.blocks))
        self.rho = 1.0
        self.rho_block = np.ones(len(self.blocks))      # per-block rho (aggregations other than safe)
        # 'qp': blocks that are their task's only block take coupled_passes(rho) local passes (the plan: the
        # same blocks at every rank count)
        plan = cluster.blocks or self.blocks
        per_task = np.bincount([b.task for b in plan], minlength=1 + max([b.task for b in plan], default=0))
        self.whole_task = np.array([per_task[b.task] == 1 for b in self.blocks], dtype=bool)
        self.pending = [None] * len(self.blocks)        # local steps waiting for their eta
        self.init_momentum()
        self.gram = [None] * len(self.blocks)           # exact solver: eigendecomposition of X^T X per block
        self.init_local_rounds()
        self.init_interior_rounds()
        self.reset_shrinking()
        self.init_batched(int(np.count_nonzero(per_task)))   # many tiny tasks: computed together (.batched)
        self.init_spread()

    def extra_bytes(self):
        return sum(s.alpha.nbytes + s.order.nbytes for s in self.state)

    def reset_shrinking(self):
        """Every coordinate active again (start, and after each Omega-step changes W)."""
        for k in range(len(self.blocks)):
            self.unshrink(k)

    def unshrink(self, k):
        """Block k's coordinates all active again, its shrinking thresholds forgotten."""
        enabled = self.config.shrinking and self.loss.name in ("hinge", "smoothed-hinge")
        self.state[k].shrink = _sdca.new_shrink_state(self.blocks[k].n_rows, enabled)

    def sdca(self, ctrl, inputs):
        """SDCA: local SDCA on every block -> delta b per block (n_blocks x d), alpha updated."""
        return self.dense_rows([([s], ()) for s in self.sdca_steps(ctrl.round)], 1, ctrl.width)

    def sdca_steps(self, round_):
        """Local SDCA on every block: its delta b (on its own columns), alpha updated."""
        cfg = self.config
        steps = []
        for k, blk in enumerate(self.blocks):
            st = self.state[k]
            out = np.zeros(blk.n_features)
            with self.working_on(blk, round_):
                old = st.alpha.copy() if cfg.eta != 1.0 else None
                _sdca.sdca_local(blk.rows, blk.y, st.alpha, self.w[k], out, blk.sq_norms,
                                    st.order, st.shrink, self.loss.kernel_id, cfg.gamma,
                                    self.rho * self.sigma_ii[k] / cfg.lam, float(blk.n_task), cfg.local_iters,
                                    block_seed(cfg.seed, blk.task, blk.part, round_), blk.mu, blk.x_mu)
                if old is not None:   # alpha <- alpha + eta delta_alpha
                    st.alpha = old + cfg.eta * (st.alpha - old)
                    out *= cfg.eta
                if nan_fault(round_, blk.task) and out.size:
                    out[0] = np.nan
            steps.append(out)
        return steps

    def trial(self, ctrl, inputs):
        """TRIAL: local SDCA with each block's rho on a copy of alpha; the step stays pending.

        Returns per block ``[delta b (d), c1, c2]``: the conjugate along the step,
        ``sum_j l*(-(a_j + e delta_j)) - l*(-a_j) = e c1 + e^2 c2 / 2`` (exact for
        hinge, smoothed hinge and squared; the chord, an upper bound, for logistic).
        With momentum (squared loss) also ``[(a - y).p, p.p, delta.p]`` for the
        previous step p; box momentum: ``[delta b, delta q, c1, c2, c1q, c2q, cross, beta_max]``.
        """
        vectors = 2 if self.momentum == "box" else 1
        batch = self.batch
        if batch is None:
            return self.dense_rows(self.trial_parts(ctrl.round), vectors, ctrl.width)
        rows = np.zeros((len(self.blocks), ctrl.width))
        rows[batch.ks] = self.batched_trial(ctrl.round, ctrl.round % UNSHRINK_EVERY == 0)
        if batch.others:                          # the blocks the batch does not take, one at a time
            parts = self.trial_parts(ctrl.round, skip=batch.mask)
            rows[batch.others] = self.dense_rows([parts[k] for k in batch.others], vectors, ctrl.width, batch.others)
        return rows

    def trial_parts(self, round_, inner=0, skip=None):
        """TRIAL's computation: per block ``(vectors on its own columns, scalars)``; ``inner``: the block's local
        step in this round (local rounds take several), ``skip[k]``: block k takes none (its part is None)."""
        cfg = self.config
        parts = []
        for k, blk in enumerate(self.blocks):
            if skip is not None and skip[k]:
                parts.append(None)
                continue
            if (round_ + inner) % UNSHRINK_EVERY == 0:
                self.unshrink(k)
            st = self.state[k]
            passes = self.local_passes(k)
            with self.working_on(blk, round_):
                a = st.alpha
                c = self.rho_block[k] * self.sigma_ii[k] / cfg.lam
                if self.exact or self.exact_box[k]:
                    delta = self.exact_step(k, c) if self.exact else self.exact_box_step(k, c)
                    db = blk.rmatvec(delta) / blk.n_task
                else:
                    trial, db = a.copy(), np.zeros(blk.n_features)
                    _sdca.sdca_local(blk.rows, blk.y, trial, self.w[k], db, blk.sq_norms,
                                        st.order, st.shrink, self.loss.kernel_id, cfg.gamma, c,
                                        float(blk.n_task), passes,
                                        block_seed(cfg.seed, blk.task, blk.part, round_, inner), blk.mu, blk.x_mu)
                    delta = trial - a
                self.pending[k] = delta
                if self.momentum == "box":
                    q, beta_max = box_direction(a, self.previous[k], blk.y)
                    self.pending_q[k] = q
                    vecs = [db, blk.rmatvec_sparse(q) / blk.n_task]     # q moves few rows
                    # conjugate_along's terms then conjugate_two's, from one evaluation of the conjugates
                    scalars = [*conjugate_terms(self.loss.name, a, delta, blk.y, cfg.gamma, q, beta_max), beta_max]
                elif self.momentum == "free":
                    p = self.previous[k]
                    vecs, scalars = [db], [*conjugate_along(self.loss.name, a, delta, blk.y, cfg.gamma),
                                           float((a - blk.y) @ p), float(p @ p), float(delta @ p)]
                else:
                    vecs, scalars = [db], list(conjugate_along(self.loss.name, a, delta, blk.y, cfg.gamma))
                scalars = np.array(scalars, dtype=np.float64)
                if nan_fault(round_, blk.task):
                    scalars[0] = np.nan
            parts.append((vecs, scalars))
        return parts

    def local_passes(self, k):
        """Block k's local SDCA work in a local step (an exchanging round's, or one of a local round's), as a
        multiple of its rows: ``--local-iters``, times :func:`coupled_passes` of its task's rho under 'qp' when
        the block is its task's only one (the blocks of a split task share one w_i: more passes on a stale w_i
        would overshoot one another)."""
        cfg = self.config
        if cfg.aggregation != "qp" or not self.whole_task[k]:
            return cfg.local_iters
        return cfg.local_iters * coupled_passes(self.rho_block[k])

    def exact_step(self, k, c):
        """The squared-loss local subproblem solved exactly (what SDCA approaches as H grows).

        Maximizes ``-sum l*(-(a + delta)) - delta^T X w - (c / (2 n)) ||X^T delta||^2``:
        ``(I + (c/n) X X^T) delta = y - a - X w``, by Woodbury through the
        block's ``X^T X = Q diag(s) Q^T`` (computed once):
        ``delta = r - X Q diag(1 / (n/c + s)) Q^T X^T r``.
        """
        blk = self.blocks[k]
        if self.gram[k] is None:
            G = blk.gram()
            self.gram[k] = np.linalg.eigh(0.5 * (G + G.T))
        s, Q = self.gram[k]
        n = float(blk.n_task)
        r = blk.y - self.state[k].alpha - blk.decision(self.w[k])
        z = Q @ ((Q.T @ blk.rmatvec(r)) / (n / c + np.maximum(s, 0.0)))
        return r - blk.decision(z)

    def exact_box_step(self, k, c):
        """The hinge (smoothed hinge) local subproblem of block k solved exactly (:func:`box_local_step`)."""
        return box_local_step(self.blocks[k], self.state[k].alpha, self.w[k], c, self.loss.name, self.config.gamma)

    def apply(self, ctrl, rows):
        """APPLY: ``[w (d), eta, beta, rho]`` per block: ``alpha += eta delta + beta p``, next rho; objective terms.

        ``delta`` is the pending local step and ``p`` the step applied in the
        previous round (momentum, squared loss; beta = 0 otherwise).
        """
        batch = self.batch
        if batch is None:
            return self.apply_parts(self.from_rows(rows, 1), ctrl.with_objective)
        self.w_dense = None
        d, mine = self.d, rows[batch.ks]
        self.batched_apply(np.ascontiguousarray(mine[:, :d]), mine[:, d], mine[:, d + 1], mine[:, d + 2])
        for k, (vecs, sc) in zip(batch.others, self.from_rows(rows, 1, batch.others)):
            self.w[k] = np.ascontiguousarray(vecs[0])
            self.apply_step(k, float(sc[0]), float(sc[1]), float(sc[2]))
        return self.objective_terms() if ctrl.with_objective else None

    def apply_parts(self, parts, with_objective):
        self.w_dense = None
        for k, (vecs, sc) in enumerate(parts):
            self.w[k] = np.ascontiguousarray(vecs[0])
            self.apply_step(k, float(sc[0]), float(sc[1]), float(sc[2]))
        return self.objective_terms() if with_objective else None

    def apply_step(self, k, eta, beta, rho):
        """Block k: ``alpha += eta delta + beta p`` (the pending step and the momentum direction), next rho."""
        if self.pending[k] is not None:
            step = eta * self.pending[k]
            if self.momentum:
                q = self.previous[k] if self.momentum == "free" else self.pending_q[k]
                step = step + beta * q
                self.previous[k] = step
                self.pending_q[k] = None
            if eta != 0.0 or beta != 0.0:
                self.state[k].alpha = self.state[k].alpha + step
        self.mirror_applied_step(k, eta, beta)
        self.pending[k] = None
        self.rho_block[k] = rho

    def objective_terms(self, which=None):
        """Per block (loss sum, conjugate sum) at the current w and alpha (n_blocks x 2; ``which``: those blocks)."""
        if which is None and self.batch is not None:       # the batched blocks at once, the others one at a time
            terms = np.zeros((len(self.blocks), 2))
            terms[self.batch.ks] = self.batched_objective()
            rows, chosen = self.batch.others, self.batch.others
        else:
            chosen = [k for k in range(len(self.blocks)) if which is None or which[k]]
            terms = np.zeros((len(chosen), 2))
            rows = range(len(chosen))
        for i, k in zip(rows, chosen):
            blk = self.blocks[k]
            terms[i] = _sdca.objective_terms(blk.rows, blk.y, self.state[k].alpha, self.w[k],
                                                self.loss.kernel_id, self.config.gamma, blk.z_shift(self.w[k]))
        return terms

    def set_w(self, ctrl, rows):
        """SET_W: every block's w column (kept whole for rows off the supports); objective terms when asked."""
        self.w = [np.ascontiguousarray(vecs[0]) for vecs, _ in self.from_rows(rows, 1)]
        self.w_dense = rows if any(f is not None for f in self.columns) else None
        return self.objective_terms() if ctrl.with_objective else None

    def set_sigma(self, ctrl, shared):
        """SET_SIGMA: ``[sigma_ii per task, rho]``; resets shrinking."""
        m = ctrl.m
        self.sigma_ii = np.array([shared[b.task] for b in self.blocks])
        self.rho = float(shared[m])
        self.reset_shrinking()

    def intercepts(self, ctrl, rows):
        """INTERCEPTS: per block its task's w (all d columns) -> ``[ybar - mu . w]`` (:meth:`TaskBlock.intercept`,
        on the block's own columns: its means are those it was centered with, the whole task's)."""
        out = np.zeros((len(self.blocks), 1))
        for k, blk in enumerate(self.blocks):
            f = self.columns[k]
            out[k, 0] = blk.intercept(rows[k] if f is None else rows[k][f])
        return out

    def get_state(self, ctrl, inputs):
        """GET_STATE: every block's :class:`BlockState`, packed and concatenated in plan order."""
        return BlockState.pack_all(self.state)

    def set_state(self, ctrl, mine):
        pos = 0
        for k, blk in enumerate(self.blocks):
            self.state[k], pos = BlockState.unpack(mine, pos, blk.n_rows)
            self.pending[k] = None
