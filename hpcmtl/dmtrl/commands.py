"""DMTRL's messages, every one named once (STYLE 19): the :class:`DMTRLCommand` enum and :data:`ON_SUPPORT`.

Each member is ``ID = id, down, up, control fields, computation (a LocalBlocks method)[, up_if]``; the
computation lives in the module of the feature that owns the command.  The ids are the wire protocol.
"""
from __future__ import annotations

from ..engine import Command, Down, Up


class DMTRLCommand(Command):
    """DMTRL's messages: ``ID = id, down, up, control fields, computation (a LocalBlocks method)[, up_if]``."""
    # local SDCA on every block -> delta b per block (n_blocks x d)
    SDCA = 1, Down.NOTHING, Up.GATHER_ROWS, ("round", "width"), "sdca"
    # every block's w column; with_objective: -> per block (loss sum, conjugate sum)
    SET_W = 2, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("with_objective", "width"), "set_w", "with_objective"
    # sigma_ii per task and rho (width = m + 1)
    SET_SIGMA = 3, Down.BCAST, Up.NOTHING, ("m", "width"), "set_sigma"
    # every block's BlockState (alpha, coordinate order, shrinking state), per rank (checkpoint)
    GET_STATE = 4, Down.NOTHING, Up.GATHER_VECTORS, (), "get_state"
    # the same, back (resume)
    SET_STATE = 5, Down.SCATTER_VECTORS, Up.NOTHING, (), "set_state"
    # local SDCA kept pending -> per block [delta b, c1, c2] (momentum: more, see LocalBlocks.trial)
    TRIAL = 6, Down.NOTHING, Up.GATHER_ROWS, ("round", "width"), "trial"
    # per block [w, eta, beta, rho]; with_objective: -> per block (loss sum, conjugate sum)
    APPLY = 7, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("with_objective", "width"), "apply", "with_objective"
    # every block's previous step (momentum state), per rank (checkpoint)
    GET_PREVIOUS = 8, Down.NOTHING, Up.GATHER_VECTORS, (), "get_previous"
    # the same, back (resume, and zeros after an Omega-step)
    SET_PREVIOUS = 9, Down.SCATTER_VECTORS, Up.NOTHING, (), "set_previous"
    # Sigma diagonal and every task one block (nothing couples the tasks): a whole round on the workers, each
    # block its own local step, step sizes and b, w -> per block [loss sum, conjugate sum, b.w, eta, beta]
    LOCAL_ROUND = 10, Down.NOTHING, Up.GATHER_ROWS, ("round", "with_objective", "width"), "local_round"
    # start local rounds from B = 0 (no momentum yet, rho 1): nothing to send
    RESET_LOCAL = 11, Down.NOTHING, Up.NOTHING, ("width",), "reset_local"
    # start local rounds from the server's per block [b, dP (free momentum), step, beta, rho] (a resume, a later
    # W-step under a diagonal Sigma)
    SET_LOCAL = 12, Down.SCATTER_ROWS, Up.NOTHING, ("width",), "set_local"
    # the same, back to the server (the W-step ended; a checkpoint)
    GET_LOCAL = 13, Down.NOTHING, Up.GATHER_ROWS, ("width",), "get_local"
    # sparse blocks: every block's support, once -> per rank, per block [|S_k|, S_k] ([-1]: exchanged
    # whole, its support is every feature)
    GET_SUPPORTS = 14, Down.NOTHING, Up.GATHER_VECTORS, (), "get_supports"
    # every plan block's exchange size (|S_k|, or d) to every rank: what sizes the rounds' values-only collectives
    SET_SUPPORTS = 15, Down.BCAST, Up.NOTHING, ("width",), "set_supports"
    # SDCA, TRIAL, SET_W and APPLY with each block's d-vectors on its support only (SupportLayout): the same rows
    SDCA_ON_SUPPORT = 16, Down.NOTHING, Up.GATHER_SUPPORT, ("round", "vectors", "scalars"), "sdca_on_support"
    SET_W_ON_SUPPORT = 17, Down.SCATTER_SUPPORT, Up.GATHER_ROWS, ("with_objective", "vectors", "scalars"), \
        "set_w_on_support", "with_objective"
    TRIAL_ON_SUPPORT = 18, Down.NOTHING, Up.GATHER_SUPPORT, ("round", "vectors", "scalars"), "trial_on_support"
    APPLY_ON_SUPPORT = 19, Down.SCATTER_SUPPORT, Up.GATHER_ROWS, ("with_objective", "vectors", "scalars"), \
        "apply_on_support", "with_objective"
    # SET_LOCAL and GET_LOCAL with b (and dP) on the supports (a W-step of local rounds starts, ends; 21 is taken)
    SET_LOCAL_ON_SUPPORT = 20, Down.SCATTER_SUPPORT, Up.NOTHING, ("vectors", "scalars"), "set_local_on_support"
    GET_LOCAL_ON_SUPPORT = 22, Down.NOTHING, Up.GATHER_SUPPORT, ("vectors", "scalars"), "get_local_on_support"
    # TRIAL_ON_SUPPORT of the box momentum, one block a task, the server's dP (the B change of the step applied
    # last round, X^T p / n up to rounding) mirrored on the workers: per block [delta b on S_k, scalars], then,
    # after all of a rank's segments, per block where X^T q / n differs from dP (the rows the box removed from
    # p, and rounding above a few ulps): [c, c positions in S_k, X^T q / n there], or [-1, X^T q / n on S_k]
    # when that is shorter (see encode_direction; the variable part: a Gatherv of what each rank has)
    TRIAL_MOMENTUM_ON_SUPPORT = 23, Down.NOTHING, Up.GATHER_VECTORS, ("round", "vectors", "scalars"), \
        "trial_momentum_on_support"
    # the server's B and dP on every block's support (its workers' mirror of them: a resume, after local rounds
    # or a warm start); sent on supports only
    SET_DP_ON_SUPPORT = 24, Down.SCATTER_SUPPORT, Up.NOTHING, ("vectors", "scalars"), "set_dp_on_support"
    # interior-point W-steps (hpcmtl.interior; every task one block, dense rows): each block starts its iterate x
    # from its alpha -> per block [Z^T x / n (d), z.x + s.(1 - x)]
    INTERIOR_START = 25, Down.NOTHING, Up.GATHER_ROWS, ("width",), "interior_start"
    # per block [w at x (d), primal step, dual step, mu, ||K||]: the pending step taken, then -> per block
    # [G's upper triangle (d (d + 1) / 2), v (d), loss sum, conjugate sum] at the new x
    INTERIOR_SYSTEM = 26, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("round", "width", "d"), "interior_system"
    # per block [y_i (d), accepted]: (accepted: alpha = y o x) -> per block [Z^T dx / n (d), largest primal step,
    # largest dual step, the 4 coefficients of the complementarity after the steps]
    INTERIOR_STEP = 27, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("width", "d"), "interior_step"
    # [accepted]: (accepted: alpha = y o x), the iterates dropped (width = 1)
    INTERIOR_END = 28, Down.BCAST, Up.NOTHING, ("width",), "interior_end"
    # refinement of the Newton step: per block [K Z^T dx (the w of dx, d)] -> per block [v of its residual (d)]
    INTERIOR_RESIDUAL = 29, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("width", "d"), "interior_residual"
    # per block [y_i of the residual (d)]: dx corrected -> what INTERIOR_STEP sends
    INTERIOR_CORRECT = 30, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("width", "d"), "interior_correct"
    # a box-loss W-step near its end or stalled (every task one block, dense task arrays): per block [c (d), loss
    # sums at w + s c for s in MARGIN_SCALES, c . b (local: the block's own b; else 0)], c the least-squares
    # change of w that puts the free rows on their margins (margin_correction); nothing changes on the workers
    MARGIN_CORRECTION = 36, Down.NOTHING, Up.GATHER_ROWS, ("width", "d", "local"), "margin_correction_rows"
    # the centered problem's intercepts at the end of a run: per block its task's column of the model's W (all d) ->
    # per block [ybar - mu . w], from the means the block was centered with (no task read again on rank 0)
    INTERCEPTS = 43, Down.SCATTER_ROWS, Up.GATHER_ROWS, ("width",), "intercepts"
    # the squared loss's step and W spread over the ranks by task chunks (dmtrl/spread.py; every rank has a share,
    # rank 0 too): per rank its chunks' rows [header, (K, c, V rows), dB, dP, B, per-task scalars] -> per chunk
    # [r.z, V_c^T X_c of CG's first direction]
    SPREAD_START = 50, Down.SCATTER_VECTORS, Up.GATHER_VECTORS, (), "spread_start"
    # [beta]: CG's next direction p (target 0) or its iterate x (target 1) -> per chunk V_c^T X_c (r x d)
    SPREAD_DIRECTION = 51, Down.BCAST, Up.GATHER_VECTORS, ("width", "target"), "spread_direction"
    # [Z = V^T X summed in chunk order]: A p -> per chunk p.Ap (target 0), or A x -> per chunk [g.x, x.Ax] (1),
    # or (target 2, the box losses) this rank's tasks' rows of A v, [eta's half, beta's half]
    SPREAD_PRODUCT = 52, Down.BCAST, Up.GATHER_VECTORS, ("width", "target"), "spread_product"
    # [a]: x += a p, r -= a Ap, z = M r -> per chunk r.z
    SPREAD_UPDATE = 53, Down.BCAST, Up.GATHER_VECTORS, ("width",), "spread_update"
    # [accept]: B += eta dB + beta dP on the chunks -> per rank [eta, beta, per chunk V_c^T B_c]
    SPREAD_FINISH = 54, Down.BCAST, Up.GATHER_VECTORS, ("width",), "spread_finish"
    # [Z = V^T B]: -> per rank its chunks' rows of W = Sigma B / lam
    SPREAD_W = 55, Down.BCAST, Up.GATHER_VECTORS, ("width",), "spread_w"
    # the box losses' step products spread alike (rank 0 drives the projected Newton-CG): per rank its chunks' rows
    # [header, (K, c, V rows), dB, dQ, (B), per-task c2, cross, c2q, n]; nothing back
    SPREAD_BOX_START = 56, Down.SCATTER_VECTORS, Up.NOTHING, (), "spread_box_start"
    # per rank its tasks' [v_eta, v_beta] -> per chunk V_c^T X_c of X = diag(v_eta) dB + diag(v_beta) dQ
    SPREAD_BOX_DIRECTION = 57, Down.SCATTER_VECTORS, Up.GATHER_VECTORS, (), "spread_box_direction"
    # per rank its tasks' [eta, beta]: B += eta dB + beta dQ -> per chunk V_c^T B_c (then SPREAD_W)
    SPREAD_BOX_FINISH = 58, Down.SCATTER_VECTORS, Up.GATHER_VECTORS, (), "spread_box_finish"
    # the box QPs' capacitance preconditioner on the chunks (dmtrl/spread_precond.py; target: 1 eta alone, 2 eta and
    # beta), with a new free set's first solve: per rank [fresh, its tasks' free codes, its rows of r] -> per rank
    # [per chunk Z_c^T Dg_c^-1 r_c, then [lo, hi, upper triangle of G] of each changed tree node]
    SPREAD_BOX_FREE = 59, Down.SCATTER_VECTORS, Up.GATHER_VECTORS, ("target",), "spread_box_free"
    # a solve's first half: per rank its tasks' rows of r -> per chunk Z_c^T Dg_c^-1 r_c
    SPREAD_BOX_SOLVE = 60, Down.SCATTER_VECTORS, Up.GATHER_VECTORS, ("target",), "spread_box_solve"
    # its second half: [has_factor, s = C^-1 Z^T u] -> per rank its tasks' rows of the solve
    SPREAD_BOX_SOLVE_ROWS = 61, Down.BCAST, Up.GATHER_VECTORS, ("width", "target"), "spread_box_solve_rows"


ON_SUPPORT = {DMTRLCommand.SDCA: DMTRLCommand.SDCA_ON_SUPPORT, DMTRLCommand.SET_W: DMTRLCommand.SET_W_ON_SUPPORT,
              DMTRLCommand.TRIAL: DMTRLCommand.TRIAL_ON_SUPPORT, DMTRLCommand.APPLY: DMTRLCommand.APPLY_ON_SUPPORT,
              DMTRLCommand.SET_LOCAL: DMTRLCommand.SET_LOCAL_ON_SUPPORT,
              DMTRLCommand.GET_LOCAL: DMTRLCommand.GET_LOCAL_ON_SUPPORT}
