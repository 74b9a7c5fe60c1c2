"""Aggregation: the per-task step problems the server (over m tasks) and a worker in local rounds (over one)
solve, and the box QP they use.

:func:`box_qp` (the one call of ``_box_qp.box_qp``), :func:`conjugate_along` / :func:`conjugate_two` /
:func:`conjugate_terms` (the conjugate along the steps), :func:`coupled_passes` (local passes under 'qp'),
:class:`StepSolver` and its one-task :class:`TaskSteps`.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import _blockops, _box_qp
from ..losses import conjugate_reference
from ..taskspace import DenseSpace
from .config import uses_momentum
from .qp_precond import CapacitancePreconditioner, low_rank_terms
from .sigma import task_rho_bounds


COUPLED_PASSES_MAX = 2     # 'qp': at most this many local passes a round for a task the others hardly explain
UNCOUPLED_PASSES = 2       # 'qp': local passes a step for a task nothing couples (a diagonal Sigma: rho = 1)


def coupled_passes(rho: float) -> int:
    """Local SDCA passes a round for a task with the 'qp' rho ``max(1/4, s_i)`` (:func:`coupled_rho`):
    ``floor(1 / (2 (1 - s_i)))`` in ``[1, COUPLED_PASSES_MAX]`` while s_i < 1.  A task nothing couples
    (rho = 1, a diagonal Sigma) takes ``UNCOUPLED_PASSES`` a local step, in a local round's steps and in the
    exchanged rounds that remain (``--exchange dense``, the squared loss's SDCA), so one local step a round
    (``--local-steps 1``) is still an exchanged round.  Its local problem is then the whole problem, so every
    pass is dual ascent; a step of two passes lets liblinear's shrinking work on its own second pass, and
    the gap (a pass over the rows for the losses) and the step's exact sizes come in fewer steps.

    ``1 - s_i`` is how much of task i's variance under Sigma the other tasks explain.  Where that is small the
    local subproblem (the other tasks' b fixed) is nearly the coupled dual's own block, so solving it further
    before an exchange is work the next rounds would otherwise repeat; the server's steps (eta <= 1) cut back
    what the coupling makes too long, so the certificate and dual ascent are unchanged.  Strongly related
    tasks (s_i <= 3/4) keep one pass.  The measurements behind the passes and the cap: docs/dmtrl-notes.md.
    """
    if rho >= 1.0:
        return UNCOUPLED_PASSES
    return int(min(COUPLED_PASSES_MAX, max(1.0, np.floor(0.5 / (1.0 - rho)))))


QP_ITERATIONS = 60
BETA_CAP = 100.0          # box momentum: the furthest extension of the previous step


def box_qp(A: np.ndarray, g: np.ndarray, upper, start=None, max_iter: int = QP_ITERATIONS,
           rtol: float = 1e-12) -> np.ndarray:
    """``argmax_x g.x - x.A.x / 2`` over ``0 <= x <= upper`` (A symmetric positive semidefinite; upper >= 0,
    a number or one per coordinate).

    An active-set Newton method: coordinates at a bound whose gradient points
    out of the box are held; the Newton step on the others (Cholesky; a
    pseudo-inverse, or the ray along which the objective is linear, when the
    free block is singular: its eigendecomposition, LAPACK's dsyev) is
    tried projected onto the box, which may change many bounds at once, and when
    that does not gain, taken up to the first bound it meets, which always gains.
    Starts from the best of 0, every coordinate alone (scaled back as a whole) and
    ``start`` (the previous round's answer: few iterations when the active set
    barely moves).  Deterministic (fixed operations in a fixed order); never worse
    than 0.  The iterations run in ``_box_qp.box_qp`` (a NumPy reference of the
    same method is ``tests/reference.py::box_qp_reference``): on small tasks the
    server's QP over m or 2m steps is most of a round.
    """
    g = np.ascontiguousarray(g, dtype=np.float64).reshape(-1)
    m = g.size
    x = np.zeros(m)
    if m == 0:
        return x
    A = np.ascontiguousarray(A, dtype=np.float64)
    upper = np.full(m, float(upper)) if np.ndim(upper) == 0 else np.ascontiguousarray(upper, dtype=np.float64)
    use_start = start is not None and np.shape(start) == (m,) and bool(np.isfinite(start).all())
    start = np.ascontiguousarray(start, dtype=np.float64) if use_start else upper
    _box_qp.box_qp(A, g, upper, start, use_start, x, max_iter, rtol)
    return x


# box momentum: box QPs inside each task's triangle after the two boxes (StepSolver.within_triangle)
TRIANGLE_PASSES = 3


def conjugate_two(loss, a, delta, q, beta_max, y, gamma):
    """``(c1p, c2p, cross)`` of the conjugate along ``eta delta + beta q`` beyond :func:`conjugate_along`.

    Quadratic conjugates: ``sum l*(-(a + eta delta + beta q)) - l*(-a) = eta c1 +
    beta c1p + (eta^2 c2 + 2 eta beta cross + beta^2 c2p) / 2``.  Logistic: the
    plane through the values at 0, delta and ``beta_max q`` bounds the convex
    conjugate from above on that triangle (``c2p = cross = 0``).
    """
    if loss == "hinge":
        return float(-(y @ q)), 0.0, 0.0
    if loss == "smoothed-hinge":
        return float((gamma * a - y) @ q), float(gamma * (q @ q)), float(gamma * (delta @ q))
    if beta_max <= 0:
        return 0.0, 0.0, 0.0
    far, here = conjugates(loss, (a + beta_max * q, a), y)
    return float((far - here).sum() / beta_max), 0.0, 0.0


def conjugate_along(loss, a, delta, y, gamma):
    """``(c1, c2)`` with ``sum_j l*(-(a_j + e delta_j)) - l*(-a_j) = e c1 + e^2 c2 / 2`` for e in [0, 1].

    Exact for the quadratic conjugates (hinge on its box, smoothed hinge,
    squared); for the logistic loss the chord ``e (sum l*(-(a + delta)) - l*(-a))``,
    which bounds the convex conjugate from above on [0, 1].
    """
    if loss == "hinge":
        return float(-(y @ delta)), 0.0
    if loss == "smoothed-hinge":
        return float((gamma * a - y) @ delta), float(gamma * (delta @ delta))
    if loss == "squared":
        return float((a - y) @ delta), float(delta @ delta)
    moved, here = conjugates(loss, (a + delta, a), y)
    return float((moved - here).sum()), 0.0


def conjugates(loss, points, y):
    """``conjugate_reference(loss, p, y)`` of each of ``points`` (arrays of one block's rows), as the rows of one
    evaluation of them stacked: elementwise the operations of one call a point, so the same numbers
    (tests/test_small_overhead.py), with a third to a half of the NumPy calls.  A worker asks for these every
    round of every block (the logistic loss: some 14 NumPy calls a point), and on Landmine-sized tasks those
    calls, not the arithmetic, were the time."""
    return conjugate_reference(loss, np.stack(points), y)


def conjugate_terms(loss, a, delta, y, gamma, q=None, beta_max=0.0):
    """:func:`conjugate_along`'s ``(c1, c2)``, followed with a momentum direction ``q`` by :func:`conjugate_two`'s
    ``(c1p, c2p, cross)``: the same numbers, the logistic loss's from one evaluation of the conjugate at ``a``,
    ``a + delta`` and ``a + beta_max q`` (it is a sum of the differences from ``a``, computed once, not twice)."""
    if q is None:
        return conjugate_along(loss, a, delta, y, gamma)
    if loss != "logistic" or beta_max <= 0:
        return conjugate_along(loss, a, delta, y, gamma) + conjugate_two(loss, a, delta, q, beta_max, y, gamma)
    moved, here, far = conjugates(loss, (a + delta, a, a + beta_max * q), y)
    return float((moved - here).sum()), 0.0, float((far - here).sum() / beta_max), 0.0, 0.0


class StepInputs(NamedTuple):
    """What :class:`StepSolver` reads of its owner's state in a round: the task arrays' ``space``
    (:mod:`hpcmtl.taskspace`), the task covariance ``Sigma`` (m x m), the tasks' sizes ``n``, ``WT``
    (W as task arrays), ``BT`` (B, updated in place by :meth:`StepSolver.take_steps`), ``dPT`` (the B
    change of the last round's step: free momentum) and the last round's ``step`` and ``beta`` (warm starts).
    """
    space: object
    Sigma: np.ndarray
    n: np.ndarray
    WT: object
    BT: object
    dPT: object
    step: np.ndarray
    beta: np.ndarray
    factors: object = None      # Sigma as :class:`.sigma.SigmaFactors` (a learned Sigma from FACTORED_MIN_TASKS)
    # v -> A v of the two-direction quadratic computed elsewhere (the box losses' products by task chunks on every
    # rank, dmtrl/spread.py): :meth:`StepSolver.momentum_operator` then hands it out instead of its own
    apply: object = None
    # directions -> the box QPs' capacitance preconditioner computed elsewhere (by task chunks on every rank,
    # dmtrl/spread_precond.py): :meth:`StepSolver.capacitance` then hands it out instead of its own
    capacitance: object = None

    @property
    def m(self):
        return self.Sigma.shape[0]

    def sigma_times(self, XT):
        """``Sigma X`` of a task array (task rows) through the factors, on the space's positions."""
        space = self.space
        return space.compact(self.factors.matmul(space.dense(XT))) if space.sparse else self.factors.matmul(XT)


class StepSolver:
    """The per-task steps of the aggregations other than 'safe': the exact dual-maximizing ``eta``
    (and momentum ``beta``) along the pending local steps, and B updated with them.

    A component: the server holds one over all m tasks (``Server.solver``), and a worker one a
    block over its task (:class:`TaskSteps`) when Sigma is diagonal and nothing couples the tasks
    (the quadratic is then a sum of per-task terms: the same arithmetic with m = 1).  It keeps only
    ``config`` and ``momentum`` (:func:`.config.uses_momentum`); every call gets the round's
    :class:`StepInputs`.  ``BT``, ``WT``, ``dPT`` and the d-vectors passed in are task arrays of
    ``inputs.space``: dense ``m x d`` rows unless the server keeps them on the task supports.
    """

    def __init__(self, config, momentum, stop=None):
        self.config = config
        self.momentum = momentum
        # stop(): a termination signal arrived; the matrix-free solvers (many tasks: thousands of products a
        # round) then end with the ascent they have, so the round ends and its safe point checkpoints in seconds
        self.stop = stop

    def steps(self, inputs, dBT, c1, c2):
        """Per-task steps eta in [0, eta_max]^m maximizing the dual along the pending local steps.

        ``D(eta) - D = g . eta - eta^T A eta / 2`` exactly (a lower bound for the
        logistic loss), with ``g_i = -w_i . db_i - c1_i / n_i`` and
        ``A = (Sigma o dB^T dB) / lam + diag(c2 / n)``.
        """
        cfg = self.config
        g = -inputs.space.dots(inputs.WT, dBT) - c1 / inputs.n
        if matrix_free(inputs):         # through Sigma's factors: A's sum is 1 . A 1, its diagonal a11
            space, m = inputs.space, inputs.m
            times = (lambda v: space.dots(dBT, inputs.sigma_times(space.combine(v, dBT, np.zeros(m), dBT))) / cfg.lam
                     + c2 / inputs.n * v)
            if cfg.aggregation == "line":
                slope, curv = float(np.sum(g)), float(np.sum(times(np.ones(m))))
                if slope <= 0:
                    return np.zeros(m)
                return np.full(m, cfg.eta if curv <= slope / cfg.eta else slope / curv)
            diag = inputs.factors.diag() * space.dots(dBT, dBT) / cfg.lam + c2 / inputs.n
            return box_qp_operator(times, diag, g, cfg.eta, start=inputs.step, stop=self.stop,
                                   precond=self.capacitance(inputs, (dBT,), (c2 / inputs.n,)))
        A = inputs.Sigma * inputs.space.gram(dBT) / cfg.lam + np.diag(c2 / inputs.n)
        A = 0.5 * (A + A.T)
        if cfg.aggregation == "line":
            slope, curv = float(np.sum(g)), float(np.sum(A))
            if slope <= 0:
                return np.zeros(inputs.m)
            e = cfg.eta if curv <= slope / cfg.eta else slope / curv
            return np.full(inputs.m, e)
        if inputs.m >= DENSE_OPERATOR_MIN_TASKS:
            return box_qp_operator(lambda v: A @ v, np.diag(A).copy(), g, cfg.eta, start=inputs.step, stop=self.stop,
                                   precond=self.capacitance(inputs, (dBT,), (c2 / inputs.n,)))
        return box_qp(A, g, cfg.eta, start=inputs.step, max_iter=QP_ITERATIONS)

    def two_direction_quadratic(self, inputs, dBT, dQT, c1, c2, c1q, c2q, cross):
        """``(A, g)`` of the dual change along ``eta_i delta_i + beta_i q_i`` (2m directions, ``D2 = [dB; dQ]``):
        ``A = (Sigma2 o D2 D2^T) / lam`` plus each task's 2 x 2 conjugate block ``[[c2, cross], [cross, c2q]] / n``,
        ``g = -w . D2 - [c1, c1q] / n``."""
        m, lam = inputs.m, self.config.lam
        G2, wd2 = inputs.space.gram_dots2(inputs.WT, dBT, dQT)
        A = np.tile(inputs.Sigma, (2, 2)) * G2 / lam       # Sigma2 = Sigma[np.ix_(idx, idx)], idx = [0..m, 0..m]
        if np.any(c2) or np.any(c2q) or np.any(cross):            # (hinge: all zero, nothing to add)
            A2 = A.reshape(2, m, 2, m)                             # A2[s, i, t, j] = A[s m + i, t m + j]
            tasks = np.arange(m)
            A2[0, tasks, 0, tasks] += c2 / inputs.n
            A2[1, tasks, 1, tasks] += c2q / inputs.n
            A2[0, tasks, 1, tasks] += cross / inputs.n
            A2[1, tasks, 0, tasks] += cross / inputs.n
        A = 0.5 * (A + A.T)
        g = -wd2 - np.concatenate([c1 / inputs.n, c1q / inputs.n])
        return A, g

    def steps_momentum(self, inputs, dBT, scalars):
        """Squared loss: ``(eta, beta)`` maximizing the dual over ``alpha + eta_i delta_i + beta_i p_i``, no bounds.

        The same exact quadratic as :meth:`steps` over 2m directions (each
        task's new local step and its previous step): ``D2 = [dB; dP]``,
        ``A = (Sigma2 o D2 D2^T) / lam + (per-task 2 x 2 conjugate blocks) / n``,
        solved by a pseudo-inverse (eigenvalues below 1e-12 of the largest
        dropped): the gain ``g^T A^+ g / 2`` is never negative.  From
        :data:`DENSE_OPERATOR_MIN_TASKS` tasks on, by block-Jacobi CG on A's
        products instead (no eigensolve): the same B update to about 1e-12
        (eta and beta themselves may differ by a part A does not see when A is
        singular: a task's two directions parallel or zero).
        """
        m = inputs.m
        A, g = self.two_direction_quadratic(inputs, dBT, inputs.dPT, *scalars.T)
        if m >= DENSE_OPERATOR_MIN_TASKS:
            # conjugate gradients on A's products, as :meth:`steps_momentum_cg` through the factors: (2m)^2 a
            # product against the eigensolve's (2m)^3 (300 tasks, a fixed Sigma: half a grid's CPU)
            tasks = np.arange(m)
            blocks = (A[tasks, tasks].copy(), A[tasks, m + tasks].copy(), A[m + tasks, m + tasks].copy())
            v, self.cg_iterations = preconditioned_cg(lambda x: A @ x, block_jacobi(*blocks), g, CG_RTOL * CG_RTOL,
                                                      CG_MAX_ITER, self.stop)
            if v is None or not float(g @ v - 0.5 * v @ (A @ v)) > 0:
                v = np.zeros(2 * m)
            return v[:m], v[m:]
        w, V = np.linalg.eigh(A)
        keep = w > 1e-12 * max(float(w[-1]), 1e-300)
        v = V[:, keep] @ ((V[:, keep].T @ g) / w[keep])
        if not float(g @ v) > 0:
            v = np.zeros(2 * m)
        return v[:m], v[m:]

    def steps_momentum_cg(self, inputs, dBT, scalars):
        """:meth:`steps_momentum` without the 2m x 2m matrix: block-Jacobi preconditioned conjugate gradients on
        ``A v = g`` with A applied through Sigma's factors (:meth:`momentum_operator`, O(m d r) a product).

        From v = 0 every CG iterate raises the quadratic ``g.v - v.A.v / 2`` (a dual lower bound, exact for the
        squared loss), so the step is dual ascent at any iteration; CG stays in the range of A (a consistent
        system), so it converges to the pseudo-inverse's step.  It stops at a preconditioned residual of
        ``CG_RTOL`` of g's, or after ``CG_MAX_ITER`` products; fixed operations in a fixed order (the same bits
        at every rank count: the server computes it alone).  From ``CG_INEXACT_MIN_TASKS`` tasks on it also stops
        once a product adds less than ``CG_GAIN_RTOL`` of the quadratic's gain so far: the step is a direction
        whose dual ascent the round's objective then measures exactly, and the last 2/3 of the products (10^4
        tasks: 58 a round to the residual's 1e-13, 20 to the gain's 1e-8) bought less than 1e-8 of the round's
        ascent (docs/many-tasks.md)."""
        m = inputs.m
        apply, g, blocks = self.momentum_operator(inputs, dBT, scalars)
        gain_rtol = CG_GAIN_RTOL if m >= CG_INEXACT_MIN_TASKS else 0.0
        v, self.cg_iterations = preconditioned_cg(apply, block_jacobi(*blocks), g, CG_RTOL * CG_RTOL, CG_MAX_ITER,
                                                  self.stop, gain_rtol)
        if v is None:
            return np.zeros(m), np.zeros(m)
        if not float(g @ v - 0.5 * v @ apply(v)) > 0:
            v = np.zeros(2 * m)
        return v[:m], v[m:]

    def momentum_operator(self, inputs, dBT, scalars, dQT=None):
        """``(v -> A v, g, (a11, a12, a22))`` of :meth:`two_direction_quadratic` without forming A:
        ``(Sigma2 o D2 D2^T) v`` is ``[dots(dB, S), dots(dP, S)]`` with ``S = Sigma (diag(v1) dB + diag(v2) dP)``
        (task rows), plus the per-task 2 x 2 conjugate blocks; ``a..``: A's per-task 2 x 2 diagonal blocks.
        The second direction is ``dQT`` (box momentum) or ``inputs.dPT`` (free momentum)."""
        space, lam, n = inputs.space, self.config.lam, inputs.n
        c1, c2, c1q, c2q, cross = scalars.T
        dPT = inputs.dPT if dQT is None else dQT
        g = -np.concatenate([space.dots(inputs.WT, dBT), space.dots(inputs.WT, dPT)]) - np.concatenate([c1 / n, c1q / n])
        sdiag = inputs.factors.diag()
        a11 = sdiag * space.dots(dBT, dBT) / lam + c2 / n
        a12 = sdiag * space.dots(dBT, dPT) / lam + cross / n
        a22 = sdiag * space.dots(dPT, dPT) / lam + c2q / n
        m = inputs.m
        if inputs.apply is not None:
            return inputs.apply, g, (a11, a12, a22)

        def apply(v):
            x, y = v[:m], v[m:]
            S = inputs.sigma_times(space.combine(x, dBT, y, dPT))
            return np.concatenate([space.dots(dBT, S) / lam + (c2 * x + cross * y) / n,
                                   space.dots(dPT, S) / lam + (cross * x + c2q * y) / n])
        return apply, g, (a11, a12, a22)

    def steps_box_momentum(self, inputs, dBT, dQT, scalars):
        """Box losses: the better of per-task steps alone (eta in [0, 1]) and steps with momentum
        (``eta in [0, 1/2]``, ``beta in [0, beta_max / 2]``), each the exact maximizer of its box QP, then
        improved inside each task's whole triangle of feasible steps (:meth:`within_triangle`)."""
        m, cfg = inputs.m, self.config
        beta_max = scalars[:, 5]
        c2, c2q, cross = (scalars[:, k] / inputs.n for k in (1, 3, 4))
        if matrix_free(inputs) or m >= DENSE_OPERATOR_MIN_TASKS:
            # the projected Newton-CG (box_qp_operator) on A's products: through Sigma's factors (no 2m x 2m
            # matrix), or the dense matrix's (see DENSE_OPERATOR_MIN_TASKS); CG preconditioned by A's structure
            if matrix_free(inputs):
                times, g, (a11, _, a22) = self.momentum_operator(inputs, dBT, scalars[:, :5], dQT)
                diag = np.concatenate([a11, a22])
                alone_times = (lambda v: times(np.concatenate([v, np.zeros(m)]))[:m])
            else:
                A, g = self.two_direction_quadratic(inputs, dBT, dQT, *scalars[:, :5].T)
                times, alone_times, diag = (lambda v: A @ v), (lambda v: A[:m, :m] @ v), np.diag(A).copy()
            pre_alone = self.capacitance(inputs, (dBT,), (c2,))
            pre_both = self.capacitance(inputs, (dBT, dQT), (c2, cross, c2q))
            alone = box_qp_operator(alone_times, diag[:m], g[:m], cfg.eta, start=inputs.step, stop=self.stop,
                                    precond=pre_alone)
            solve = (lambda upper, start: box_qp_operator(times, diag, g, upper, start=start, stop=self.stop,
                                                          precond=pre_both))
        else:
            A, g = self.two_direction_quadratic(inputs, dBT, dQT, *scalars[:, :5].T)
            times, alone_times = (lambda v: A @ v), (lambda v: A[:m, :m] @ v)
            alone = box_qp(A[:m, :m], g[:m], cfg.eta, start=inputs.step, max_iter=QP_ITERATIONS)
            solve = (lambda upper, start: box_qp(A, g, upper, start=start, max_iter=QP_ITERATIONS))
        gain_alone = float(g[:m] @ alone - 0.5 * alone @ alone_times(alone))
        if not np.any(beta_max > 0):
            return alone, np.zeros(m)
        upper = np.concatenate([np.full(m, 0.5 * cfg.eta), 0.5 * np.minimum(beta_max, BETA_CAP)])
        both = solve(upper, np.concatenate([inputs.step, inputs.beta]))
        gain_both = float(g @ both - 0.5 * both @ times(both))
        x = both if gain_both > gain_alone else np.concatenate([alone, np.zeros(m)])
        x = self.within_triangle(times, solve, g, x, np.minimum(beta_max, BETA_CAP))
        return x[:m], x[m:]

    def within_triangle(self, times, solve, g, x, beta_max):
        """Better steps ``(eta, beta)`` than ``x`` inside each task's triangle ``eta / eta_max + beta / beta_max
        <= 1`` (alpha + eta delta + beta q is then a convex combination of alpha, alpha + eta_max delta and
        alpha + beta_max q: feasible, and for the logistic loss the plane of :func:`conjugate_two` still bounds
        the conjugate from above).  Each pass solves the box QP over a box inside the triangle through
        ``x``'s corner on the side its gradient points to (eta up to ``eta_max (1 - beta / beta_max)`` with beta
        at most its value, or the other way round), started from ``x``: never worse than ``x``.  ``times(v)`` is
        ``A v`` and ``solve(upper, start)`` the box QP of ``(A, g)`` over ``[0, upper]``."""
        m, top = x.size // 2, self.config.eta
        has = beta_max > 0
        share = np.where(has, 1.0 / np.where(has, beta_max, 1.0), 0.0)
        for _ in range(TRIANGLE_PASSES):
            eta, beta = x[:m], x[m:]
            r = g - times(x)
            up_eta = np.where(has, top * np.maximum(0.0, 1.0 - beta * share), top)
            up_beta = np.where(has, beta_max * np.maximum(0.0, 1.0 - eta / top), 0.0)
            towards_eta = r[:m] * top >= r[m:] * beta_max
            upper = np.concatenate([np.where(towards_eta, up_eta, eta), np.where(towards_eta, beta, up_beta)])
            upper = np.maximum(upper, x)
            y = solve(upper, x)
            if not float(g @ y - 0.5 * y @ times(y)) > float(g @ x - 0.5 * x @ times(x)):
                break
            x = y
        return x

    def capacitance(self, inputs, directions, extra):
        """The box QP's preconditioner from A's structure (:class:`.qp_precond.CapacitancePreconditioner`) for
        the directions' task arrays (eta's, and beta's with box momentum) and the conjugate blocks ``extra``;
        None (Jacobi) under ``QP_PRECONDITIONER = 'jacobi'``.  Sigma's terms (its factors, or the dense Sigma's
        eigendecomposition: m^3, once) are kept while Sigma is the same object (a W-step's rounds)."""
        if QP_PRECONDITIONER != "capacitance" or (inputs.factors is not None and not hasattr(inputs.factors, "V")):
            return None          # (a graph kernel held sparse has no low-rank part: Jacobi)
        if inputs.capacitance is not None:
            return inputs.capacitance(len(directions))
        Sigma = inputs.factors if inputs.factors is not None else inputs.Sigma
        rows = [inputs.space.dense(x) for x in directions]
        d = rows[0].shape[1]
        cached = getattr(self, "_terms", None)
        if cached is None or cached[0] is not Sigma or cached[1] != d:
            self._terms = cached = (Sigma, d, low_rank_terms(Sigma, self.config.lam, d))
        U, rest = cached[2]
        return CapacitancePreconditioner(U, rest, rows, self.config.lam, extra)

    def adapt_rho(self, eta, rho_task, Sigma, blocks_per_task):
        """The next per-task rho: under 'adaptive', rho_i up (towards the task's Lemma 6.7 bound) when its step
        was cut, down when taken whole; otherwise ``rho_task`` as it is.  The bounds (``|Sigma| s``: m^2) are
        kept while Sigma is the same array (a W-step's rounds: a new Sigma is a new array)."""
        if self.config.aggregation != "adaptive":
            return rho_task
        cached = getattr(self, "_bounds", None)
        if cached is None or cached[0] is not Sigma or not np.array_equal(cached[1], blocks_per_task):
            self._bounds = cached = (Sigma, np.array(blocks_per_task), task_rho_bounds(Sigma, blocks_per_task))
        bound = np.maximum(cached[2], 1.0)
        full = eta >= 0.999 * self.config.eta
        grow = np.where(eta > 0, 1.0 / np.maximum(eta / self.config.eta, 1e-3), 2.0)
        rho = np.where(full, 0.5 * rho_task, rho_task * np.sqrt(grow))
        return np.clip(rho, 1.0, bound)

    def take_steps(self, inputs, dBT, dQT, scalars):
        """This round's ``(eta, beta, dPT)`` per task on task arrays ``dBT`` (and ``dQT``, box momentum) and
        per-task ``scalars``; ``inputs.BT`` updated with them in place, ``dPT`` the new B change (free
        momentum; else ``inputs.dPT``)."""
        space = inputs.space
        dPT = inputs.dPT
        if self.momentum == "free":
            if matrix_free(inputs):
                eta, beta = self.steps_momentum_cg(inputs, dBT, scalars)
            else:
                eta, beta = self.steps_momentum(inputs, dBT, scalars)
            dPT = space.combine(eta, dBT, beta, dPT)
            space.add(inputs.BT, dPT)
        elif self.momentum == "box":
            eta, beta = self.steps_box_momentum(inputs, dBT, dQT, scalars)
            space.add_two(inputs.BT, eta, dBT, beta, dQT)
        else:
            eta, beta = self.steps(inputs, dBT, scalars[:, 0], scalars[:, 1]), np.zeros(inputs.m)
            space.add_scaled(inputs.BT, eta, dBT)
        return eta, beta, dPT


# from this many tasks the dense path's box QPs (2m x 2m with momentum) are solved by box_qp_operator on the
# dense matrix's products too, which polls the signal: the active-set method's Cholesky factorizations cost m^3
# each (hinge, 150 tasks of 30 rows: 132 s against 17 s; one-row tasks, whose A is singular: 50-250 s a round at
# 500 tasks), while at 16 tasks it is the faster of the two by a few percent; and the squared loss's momentum
# step by CG on the matrix's products, not its (2m)^3 eigensolve
DENSE_OPERATOR_MIN_TASKS = 64
CG_RTOL = 1e-13          # matrix-free steps: CG's preconditioned residual, relative to the first (the step then
                         # agrees with the pseudo-inverse's to about 1e-12 on small problems)
CG_MAX_ITER = 500
# from this many tasks the squared loss's CG step stops when a product adds less than CG_GAIN_RTOL of the
# quadratic's gain so far (each product adds a*rz/2; the gains fall geometrically, so what is left is a few times
# the last one: 1e-9 to 4e-9 of a round's ascent measured at 10^4 tasks, 4.5e-8 on tests/test_many_tasks.py's
# random 600-task problem).  Below it the step stays the pseudo-inverse's to 1e-12 (the factored and dense
# paths agree to 1e-10 on small problems: tests/test_many_tasks.py)
CG_INEXACT_MIN_TASKS = 512
CG_GAIN_RTOL = 1e-8


def matrix_free(inputs) -> bool:
    """The per-round step problem through Sigma's factors (no 2m x 2m matrix): Sigma is held as factors
    (a learned Sigma from :data:`.sigma.FACTORED_MIN_TASKS` tasks on)."""
    return inputs.factors is not None


def block_jacobi(a11, a12, a22):
    """``r -> M^-1 r`` with M the per-task 2 x 2 diagonal blocks ``[[a11, a12], [a12, a22]]`` of A (both halves
    of r: m each).  A block that is singular to rounding (the two directions parallel, or one of them zero)
    falls back to its diagonal, and a zero diagonal entry to 0 (that direction's row of A is zero, its g too):
    positive semidefinite, so CG stays a descent method."""
    det = a11 * a22 - a12 * a12
    good = det > 1e-12 * a11 * a22
    safe = np.where(good, det, 1.0)
    i11 = np.where(good, a22 / safe, np.where(a11 > 0, 1.0 / np.where(a11 > 0, a11, 1.0), 0.0))
    i22 = np.where(good, a11 / safe, np.where(a22 > 0, 1.0 / np.where(a22 > 0, a22, 1.0), 0.0))
    i12 = np.where(good, -a12 / safe, 0.0)
    m = a11.size

    def precond(r):
        x, y = r[:m], r[m:]
        return np.concatenate([i11 * x + i12 * y, i12 * x + i22 * y])
    return precond


# the box QPs' Newton CG: 'capacitance' (A's diagonal-plus-low-rank structure, .qp_precond) or 'jacobi' (A's
# diagonal: the preconditioner before; benches and tests compare the two)
QP_PRECONDITIONER = "capacitance"
NEWTON_CG_ITER = 50       # box_qp_operator: CG iterations of one Newton direction on the free coordinates
SEARCH_HALVINGS = 12      # box_qp_operator: projected steps t = 1, 1/2, ... tried along a Newton direction


def box_qp_operator(times, diag, g, upper, start=None, max_iter=QP_ITERATIONS, rtol=1e-12, stop=None,
                    precond=None):
    """:func:`box_qp` with A given only as ``times(v) = A v`` (and its diagonal ``diag``): a projected Newton-CG
    method (Bertsekas' two-metric projection).  Each iteration holds the coordinates at a bound whose gradient
    ``g - A x`` points out of the box, takes a Newton direction on the others by Jacobi-preconditioned CG (from
    zero: the CG iterates' quadratic only rises), and projects steps ``t = 1, 1/2, ...`` along it onto the box,
    keeping the first that gains; when none does, the projected gradient step, exact up to the first bound it
    meets (it always gains while the projected gradient is not zero).  Starts from the better of 0 and
    ``start`` (in the box); ends when the projected gradient is ``rtol`` of g's size, after ``max_iter``
    iterations, when no step gains, or when ``stop()`` says so (a termination signal: every iterate is in the
    box and gains, so the step so far is still dual ascent): never worse than 0, deterministic, and
    O(iterations x a product).  ``precond``: an object whose ``for_free(free)`` gives the Newton CG's
    preconditioner solve on the free set (:class:`.qp_precond.CapacitancePreconditioner`: A's structure
    through Sigma's factors); None: Jacobi on ``diag``."""
    g = np.ascontiguousarray(g, dtype=np.float64).reshape(-1)
    m = g.size
    upper = np.full(m, float(upper)) if np.ndim(upper) == 0 else np.asarray(upper, dtype=np.float64)
    x, Ax, best = np.zeros(m), np.zeros(m), 0.0
    if start is not None and np.shape(start) == (m,) and bool(np.isfinite(start).all()):
        y = np.clip(start, 0.0, upper)
        Ay = times(y)
        if float(g @ y - 0.5 * y @ Ay) > best:
            x, Ax, best = y, Ay, float(g @ y - 0.5 * y @ Ay)
    inv_diag = np.where(diag > 0, 1.0 / np.where(diag > 0, diag, 1.0), 0.0)
    size = max(float(np.linalg.norm(g)), 1e-300)
    for _ in range(max_iter):
        if stop is not None and stop():
            break
        r = g - Ax
        held = ((x <= 0) & (r <= 0)) | ((x >= upper) & (r >= 0))
        pg = np.where(held, 0.0, r)
        if not float(np.linalg.norm(pg)) > rtol * size:
            break
        d = free_newton_direction(times, inv_diag, ~held, pg, stop, precond)
        moved = False
        t = 1.0
        for _ in range(SEARCH_HALVINGS):
            y = np.clip(x + t * d, 0.0, upper)
            Ay = times(y)
            value = float(g @ y - 0.5 * y @ Ay)
            if value > best:
                x, Ax, best, moved = y, Ay, value, True
                break
            t *= 0.5
        if moved:
            continue
        curv = float(pg @ times(pg))
        up, down = pg > 0, pg < 0                # how far each moving coordinate may go before its bound
        room = np.where(up, (upper - x) / np.where(up, pg, 1.0), np.where(down, -x / np.where(down, pg, -1.0), np.inf))
        t = min(float(pg @ pg) / curv if curv > 0 else np.inf, float(np.min(room)))
        if not (np.isfinite(t) and t > 0):
            break
        y = np.clip(x + t * pg, 0.0, upper)
        Ay = times(y)
        value = float(g @ y - 0.5 * y @ Ay)
        if not value > best:
            break
        x, Ax, best = y, Ay, value
    return x


def free_newton_direction(times, inv_diag, free, r, stop=None, precond=None):
    """``A_FF d_F = r_F`` (d zero off the free set F) by preconditioned CG from zero (Jacobi, or
    ``precond.for_free(free)``), at most NEWTON_CG_ITER products, stopped at a preconditioned residual of 1e-10
    of the first or on a direction of no curvature."""
    solve = (lambda res: inv_diag * res) if precond is None else precond.for_free(free)
    d, _ = preconditioned_cg(lambda p: np.where(free, times(p), 0.0), solve,
                             np.where(free, r, 0.0), 1e-20, NEWTON_CG_ITER, stop)
    if d is None:
        return np.where(free, r, 0.0)
    return d if d.any() else np.where(free, r, 0.0)


def preconditioned_cg(apply, precond, r, rtol2, max_iter, stop=None, gain_rtol=0.0):
    """``(x, products)``: preconditioned conjugate gradients on ``A x = r`` from x = 0 (``apply``: v -> A v,
    ``precond``: the preconditioner's solve), stopped when ``r.M r`` falls to ``rtol2`` of its start, when a
    product raises ``q(x) = r.x - x.A.x / 2`` by at most ``gain_rtol`` of q so far (0: never), on a
    direction of no curvature, after ``max_iter`` products or when ``stop()`` says so (a termination signal:
    from x = 0 every iterate raises q); x is None when ``r.M r <= 0`` at the start.
    Fixed operations in a fixed order (the server's steps: the same bits at every rank count)."""
    x = np.zeros(r.size)
    r = r.copy()
    z = precond(r)
    rz = float(r @ z)
    if not rz > 0:
        return None, 0
    small, p, products, q = rtol2 * rz, z.copy(), 0, 0.0
    for _ in range(max_iter):
        if stop is not None and stop():
            break
        products += 1
        Ap = apply(p)
        curv = float(p @ Ap)
        if not curv > 0:
            break
        a = rz / curv
        x += a * p
        r -= a * Ap
        gain = 0.5 * a * rz          # q(x + a p) - q(x) = a (r.p) - a^2 curv / 2, with r.p = r.z in CG
        q += gain
        if gain_rtol > 0 and gain <= gain_rtol * q:
            break
        z = precond(r)
        rz_new = float(r @ z)
        if not rz_new > small:
            break
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x, products


class OrderedDenseSpace(DenseSpace):
    """The dense space with its dot products added in index order (``_blockops.ordered_dot``): a one-task
    :class:`TaskSteps` on a block's support columns then gets the bits of the same vectors with the zeros off
    the support (all d columns, the dense exchange), at every rank count."""

    def dots(self, X, Y):
        return np.array([_blockops.ordered_dot(x, y) for x, y in zip(X, Y)])

    def total(self, X, Y):
        return float(np.sum(self.dots(X, Y)))

    def gram(self, X):
        return np.array([[_blockops.ordered_dot(a, b) for b in X] for a in X]).reshape(len(X), len(X))

    def gram_dots2(self, W, X, Y):
        D2 = np.vstack([X, Y])
        return self.gram(D2), self.dots(np.vstack([W, W]), D2)


ORDERED = OrderedDenseSpace()


class TaskSteps:
    """One task's step state on its worker during local rounds (Sigma diagonal: the task's quadratic is its
    own), with its :class:`StepSolver`: ``b`` and ``dP`` as 1 x d rows, ``w = sigma_ii b / lam``.  A worker's
    block computes on its support's columns (LocalBlocks.columns): its dot products in index order (ORDERED)."""

    space = ORDERED

    def __init__(self, config, sigma_ii, n, b, dp, step, beta, rho):
        self.config = config
        self.n = np.array([float(n)])
        self.Sigma = np.array([[float(sigma_ii)]])
        self.BT = np.array(b, dtype=np.float64).reshape(1, -1)
        self.d = self.BT.shape[1]
        self.dPT = np.array(dp, dtype=np.float64).reshape(1, -1)
        self.WT = (self.Sigma @ self.BT) / config.lam
        self.step = np.array([float(step)])
        self.beta = np.array([float(beta)])
        self.rho_task = np.array([float(rho)])
        self.blocks_per_task = np.ones(1)
        self.momentum = uses_momentum(config)
        self.solver = StepSolver(config, self.momentum)

    def solve_steps(self, dBT, rows):
        """This round's (eta, beta), B (and dP) updated with them; ``rows``: the task's row of TRIAL
        (``[dB, (dQ: box momentum), scalars]``, dense)."""
        d = self.d
        inputs = StepInputs(self.space, self.Sigma, self.n, self.WT, self.BT, self.dPT, self.step, self.beta)
        if self.momentum == "box":
            eta, beta, self.dPT = self.solver.take_steps(inputs, dBT, rows[:, d:2 * d], rows[:, 2 * d:])
        else:
            eta, beta, self.dPT = self.solver.take_steps(inputs, dBT, None, rows[:, d:])
        return eta, beta

    def adapt_rho(self, eta):
        self.rho_task = self.solver.adapt_rho(eta, self.rho_task, self.Sigma, self.blocks_per_task)
