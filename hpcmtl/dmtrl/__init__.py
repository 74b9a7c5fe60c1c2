"""DMTRL: distributed multi-task relationship learning (paper 001), the core engine.

Objective (task covariance ``Sigma = Omega^-1``, ``tr(Sigma) = 1`` when learned)::

    P(W) = sum_i (1/n_i) sum_j l(w_i . x_ij, y_ij) + (lam/2) tr(W Omega W^T)

and its dual with ``b_i = (1/n_i) sum_j alpha_ij x_ij``, ``W(alpha) = B Sigma / lam``::

    D(alpha) = -(1/(2 lam)) tr(B Sigma B^T) - sum_i (1/n_i) sum_j l*(-alpha_ij)

Since ``(lam/2) tr(W Omega W^T) = tr(B Sigma B^T) / (2 lam)`` at ``W(alpha)``, the
duality gap needs only per-task loss and conjugate sums from the workers plus
``tr(B Sigma B^T)`` on the server; Omega is never inverted.

W-step round: every worker runs local SDCA (Algorithm 2) on each of its task
blocks and sends ``delta b`` (d numbers a block, Gatherv); the server sets
``B += eta sum delta b``, ``W = B Sigma / lam`` and sends each block its task's
column back (Scatterv).  Omega-step (learned relationships): on the server,
``Sigma = (W^T W)^(1/2) / tr((W^T W)^(1/2))`` with an eigenvalue floor and
``rho = eta max_i sum_i' |sigma_ii'| / sigma_ii`` (Lemma 6.7, generalized to
tasks split into several blocks).  alpha carries over.

Aggregation (how the workers' local steps are combined; every choice keeps the
certificate: P and D are computed exactly from alpha and B, and D never decreases):

* ``safe``: the paper's rule.  Local subproblems use Lemma 6.7's rho and every
  step is applied with the fixed ``eta``.
* ``qp`` (the default) / ``adaptive`` / ``line``: workers solve their local
  subproblems with an optimistic per-task ``rho_i`` (start 1; 'qp': :func:`coupled_rho`) and keep the step
  ``delta_alpha`` pending; they send ``delta b`` plus two per-task scalars of the
  conjugate along the step.  Along per-task steps ``eta in [0, 1]^m``
  (the box stays feasible by convexity) the dual is exactly the concave quadratic::

      D(alpha + eta o delta) - D(alpha) = g . eta - eta^T A eta / 2,
      g_i = -w_i . db_i - c1_i / n_i,   A = (Sigma o dB^T dB) / lam + diag(c2_i / n_i)

  with ``sum_j l*(-(a_j + e delta_j)) = sum_j l*(-a_j) + e c1 + e^2 c2 / 2`` (hinge:
  ``c1 = -sum y delta``; smoothed hinge: ``c1 = sum (gamma a - y) delta``,
  ``c2 = gamma sum delta^2``; squared: ``c1 = sum (a - y) delta``, ``c2 = sum
  delta^2``; logistic: the chord ``c1 = sum l*(-(a + delta)) - l*(-a)``, ``c2 = 0``,
  an upper bound of the convex conjugate, so the model is a lower bound of D).
  The server maximizes it over the box (``qp``, ``adaptive``) or over one common
  eta (``line``), applies ``B += dB diag(eta)`` and sends each block its eta with
  w_i; workers apply ``alpha += eta_i delta_alpha``.  ``adaptive`` also moves
  each ``rho_i`` between 1 and the task's own Lemma 6.7 bound: up when its step
  had to be shortened, down when it was taken whole.  ``qp`` and ``adaptive``
  add momentum: each task's previous step p_i is a second direction (squared
  loss: unbounded, an exact block-Jacobi preconditioned subspace step; box
  losses: p_i kept where a whole further step stays feasible, steps bounded so
  that the combination stays in the box; see :func:`uses_momentum`), and
  squared-loss subproblems are solved exactly (:meth:`LocalBlocks.exact_step`).
  Server work per round: ``[dB, dP]^T [dB, dP]`` (O(d m^2), the order of
  ``W = B Sigma / lam``; on sparse task supports O(sum_f c_f^2), c_f the tasks
  whose support holds feature f: :mod:`hpcmtl.taskspace`) and a QP over m or
  2m numbers; traffic: one or two
  d-vectors and a few scalars a block up, one d-vector and 3 scalars down.

Relationship modes: ``learned`` (DMTRL), ``identity`` (STL: Sigma fixed at I/m)
and ``fixed`` (a user-given Sigma, e.g. a graph kernel).

Where things are: this module is the public API (:func:`train` and the names other modules import);
the core is :mod:`.commands` (every message), :mod:`.config` (settings, result, solver choices),
:mod:`.sigma` (Omega-step, rho), :mod:`.steps` (the aggregation's step solver), :mod:`.outer` (the outer
loop, the certificate's history), :mod:`.worker` (``LocalBlocks``) and :mod:`.server` (``Server``: one
round is ``Server.round_steps`` / ``round_safe``, one W-step ``Server.w_step``).  Each feature owns its
commands' worker half, its server half and its flags: :mod:`.supports` (the exchange on supports),
:mod:`.momentum` (box momentum), :mod:`.local_rounds`, :mod:`.interior_rounds`, :mod:`.margin` (margin
corrections).  The cores import the features, never the reverse (tests/test_layering.py).
"""
from __future__ import annotations

import functools

import numpy as np

from .. import engine
from ..checkpoint import read_compatible
from ..params import AGGREGATIONS, LOCAL_SOLVERS, RELATIONSHIPS  # noqa: F401 - the choices, named here too
from .commands import ON_SUPPORT, DMTRLCommand  # noqa: F401
from .config import (EXACT_BOX_ROWS, EXACT_MAX_FEATURES, DMTRLConfig, DMTRLConvergenceWarning,  # noqa: F401
                     TrainResult, uses_exact_box_solver, uses_exact_solver, uses_interior_point, uses_momentum)
from .interior_rounds import INTERIOR_AFTER_LOCAL_STALL, INTERIOR_AFTER_STALL  # noqa: F401
from .margin import (MARGIN_FLOPS_PER_VALUE, MARGIN_MAX_FLOPS, MARGIN_NEAR, MARGIN_SCALES,  # noqa: F401
                     MARGIN_STALL, coordinate_newton, correction_scales, free_rows, margin_correction,
                     min_norm_through_gram)
from .momentum import box_direction, direction_tolerance, encode_direction, mask_positions  # noqa: F401
from .outer import (GapHistory, OuterState, outer_loop, primal_dual, primal_dual_of,  # noqa: F401
                    rounds_since_halved, stalled_since, unconverged_message)
from .server import Server
from .sigma import check_sigma, coupled_rho, omega_from_gram, omega_step, safe_rho, task_rho_bounds  # noqa: F401
from .steps import (BETA_CAP, COUPLED_PASSES_MAX, UNCOUPLED_PASSES, StepSolver, TaskSteps, box_qp,  # noqa: F401
                    conjugate_along, conjugate_two, coupled_passes)
from .supports import SupportLayout, exchange_index  # noqa: F401
from .worker import LocalBlocks, block_seed, box_local_step  # noqa: F401


def train(cluster, source, config: DMTRLConfig, test_source=None, sigma_fixed=None, progress=None,
          checkpointer=None, resume=None, warn=None, make_local=None, server_class=None):
    """Run DMTRL (or STL / a fixed Sigma) on every rank; the server returns a TrainResult.

    ``source`` / ``test_source`` are task sources (:class:`hpcmtl.store.TaskFile`
    or :class:`hpcmtl.estimators.MemoryTasks`): each rank reads its own blocks.
    ``checkpointer`` (server) writes checkpoints and reacts to termination
    signals; ``resume`` (server) is a checkpoint path to continue from;
    ``warn(message)`` (server) hears of every W-step that ended unconverged
    (default: a :class:`DMTRLConvergenceWarning`).  ``converged`` of the result
    is True only when every W-step reached ``tol``.  Workers return None.
    The warm-start hook of :mod:`hpcmtl.model_selection`: ``make_local()``
    returns this rank's local state over blocks already in memory (default:
    read them), ``server_class`` replaces :class:`Server` (same arguments).
    """
    config.validate()
    if config.relationship == "fixed":
        sigma_fixed = check_sigma(sigma_fixed, source.n_tasks)

    make_local = make_local or engine.local_reader(functools.partial(LocalBlocks, consume=True), cluster, source,
                                                   config, test_source)

    def make_server(cluster):          # the planned cluster the local state was read under
        return (server_class or Server)(cluster, source, config, sigma_fixed, progress, checkpointer, test=test_source is not None,
                      warn=warn)

    def result(server, converged, extra):
        if getattr(server, "intercept", None) is not None:     # the centered problem's, from the workers' means
            W, intercept = server.dense_wt().T.copy(), server.intercept
        else:
            W, intercept = engine.split_intercept(server.dense_wt().T, config, source)
        return TrainResult(W=W, Sigma=server.Sigma.copy(), intercept=intercept,
                           history=server.history.arrays(),
                           config=config.to_dict(), task_names=server.names, converged=converged,
                           n_rounds=server.round, seconds=server.elapsed(), bytes_moved=cluster.bytes_moved,
                           rho=server.rho if server.safe else float(np.max(server.rho_task)), test=server.test,
                           extra=extra, wsteps=server.outer_state.wstep_arrays())

    state = None if resume is None else (lambda: read_compatible(resume, config, source, sigma_fixed))
    return engine.train(cluster, make_local, make_server, result, state)
