"""Baselines of paper 001: STL, single-machine SDCA (SSDCA) and centralized MTRL.

* STL is the DMTRL engine with Sigma fixed at I/m (``relationship='identity'``):
  each task alone, ``(1/n_i) sum_j l + (lam m / 2) ||w_i||^2``.
* SSDCA: one process, SDCA over all coordinates of all tasks with W kept exact
  after every step (the non-distributed reference the paper compares with).
* Centralized MTRL: squared loss solved exactly (the d*m linear system of the
  stationarity conditions), other losses by SSDCA to a relative gap of 1e-10;
  both alternate with the same Omega-step as DMTRL.

These are centralized on purpose: they run on rank 0 and read every task.
Per-task intercepts follow the engine's formulations (``engine.with_intercept``):
squared loss centered by the same task means (CSR tasks are densified here, where
every task is in memory anyway), other losses with the augmented feature.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from . import _sdca
from .dmtrl.joint import block_gradient_terms, block_joint_terms, joint_step
from .dmtrl import (DMTRLConfig, GapHistory, OuterState, TrainResult, block_seed, check_sigma, outer_loop,
                    omega_step, primal_dual)
from .engine import check_finite_rows, check_scale, intercept_mode, split_intercept, with_intercept
from .features import rff_map
from .losses import get_loss, signed_labels
from .taskdata import TaskBlock


class _Centralized:
    """All tasks in one process: data, alpha, B, W, Sigma and the gap."""

    def __init__(self, source, config: DMTRLConfig, sigma_fixed=None):
        self.config = config
        self.source = source
        self.loss = get_loss(config.loss)
        phi = rff_map(source.n_features, config.rff_dim, config.rff_gamma, config.seed) if config.rff_dim else None
        blocks = []
        for i in range(source.n_tasks):
            blk = source.read_task(i)
            blk.y = signed_labels(self.loss, blk.y, config.positive_label, f"{source.path}: task '{blk.name}' (#{i})")
            blk = blk.transformed(phi) if phi is not None else blk
            check_scale(blk, f"{source.path}: task '{blk.name}' (#{i})", self.loss)
            if intercept_mode(config) == "center" and blk.sparse:      # one stacked matrix for ssdca_epoch
                blk = TaskBlock(blk.task, blk.name, blk.n_task, blk.row_start, blk.X.toarray(), blk.y, blk.part)
            blocks.append(with_intercept(blk, config, source, phi))
        self.blocks = blocks
        self.names = list(source.names)
        self.m = len(blocks)
        self.d = blocks[0].n_features
        self.n = np.array([b.n_rows for b in blocks], dtype=np.float64)
        self.Sigma = (check_sigma(sigma_fixed, self.m) if config.relationship == "fixed"
                      else np.eye(self.m) / self.m)
        self.BT = np.zeros((self.m, self.d))
        self.WT = np.zeros((self.m, self.d))
        self.offsets = np.concatenate([[0], np.cumsum(self.n.astype(np.int64))])
        self.alpha = np.zeros(int(self.offsets[-1]))
        self.history = GapHistory()
        self.outer_state = OuterState()
        self.next_wt = None
        self.t0 = time.perf_counter()
        self.round = 0

    def alpha_of(self, i):
        return self.alpha[self.offsets[i]:self.offsets[i + 1]]

    def record(self, outer):
        cfg = self.config
        terms = np.array([_sdca.objective_terms(b.rows, b.y, self.alpha_of(i), self.WT[i],
                                                   self.loss.kernel_id, cfg.gamma)
                          for i, b in enumerate(self.blocks)])
        check_finite_rows(terms, self.round, self.names, "loss or conjugate sum", outer)
        check_finite_rows(self.WT, self.round, self.names, "W column", outer)
        primal, dual = primal_dual(terms[:, 0], terms[:, 1], self.n, self.BT, self.WT, cfg.lam)
        return self.history.record(self.round, outer, primal, dual, time.perf_counter() - self.t0, 0)

    def certify(self):
        """The joint certificate and the prox step of :mod:`hpcmtl.dmtrl.joint`, every task here."""
        cfg = self.config

        def evaluate(wts):
            rows = np.array([block_joint_terms(b, self.alpha_of(i), [wt[i] for wt in wts], self.loss, cfg.gamma)
                             for i, b in enumerate(self.blocks)])
            return rows[:, :-1], float(np.max(rows[:, -1]))

        def gradient(prox_t, ext_t):
            parts = [block_gradient_terms(b, prox_t[i], ext_t[i], self.loss, cfg.gamma)
                     for i, b in enumerate(self.blocks)]
            grad = np.array([g for g, _ in parts]).reshape(self.m, self.d)
            sc = np.array([s for _, s in parts])
            check_finite_rows(np.hstack([grad, sc[:, 1:-1]]), self.round, self.names,
                              "accelerated step's gradient, loss or conjugate sum", self.outer_state.outer)
            return grad, sc[:, 0], sc[:, 1], sc[:, 2:-1], float(np.max(sc[:, -1]))

        out, self.next_wt = joint_step(self.outer_state, cfg.loss, cfg.lam, cfg.eig_floor, self.n, self.WT, self.BT,
                                       evaluate, gradient if self.loss.smooth else None, cfg.outer_tol)
        return out

    def omega(self):
        W = self.WT.T if self.next_wt is None else self.next_wt.T     # the prox step's W when one was taken
        self.next_wt = None
        self.Sigma = omega_step(W, self.outer_state.floor or self.config.eig_floor)
        check_finite_rows(self.Sigma, self.round, self.names, "Sigma row", self.outer_state.outer)
        self.WT = self.Sigma @ self.BT / self.config.lam

    def result(self, converged, method):
        config = dict(self.config.to_dict(), method=method)
        W, intercept = split_intercept(self.WT.T, self.config, self.source)
        return TrainResult(W=W, intercept=intercept, Sigma=self.Sigma.copy(), history=self.history.arrays(),
                           config=config, task_names=self.names, converged=converged, n_rounds=self.round,
                           seconds=time.perf_counter() - self.t0, bytes_moved=0, rho=1.0,
                           wsteps=self.outer_state.wstep_arrays())


def ssdca(source, config: DMTRLConfig, sigma_fixed=None, progress=None, warn=None) -> TrainResult:
    """Single-machine SDCA over all coordinates, exact W after every step."""
    config.validate()
    state = _Centralized(source, config, sigma_fixed)
    rows = [b.X for b in state.blocks]
    X = sp.vstack(rows, format="csr") if any(sp.issparse(r) for r in rows) else np.vstack(rows)
    stacked = TaskBlock(-1, "all", X.shape[0], 0, X, np.concatenate([b.y for b in state.blocks]))
    task_of_row = np.repeat(np.arange(state.m, dtype=np.int32), state.n.astype(np.int64))
    perm = np.empty(X.shape[0], dtype=np.int32)

    def w_step(p):
        row = None
        for t in range(config.max_rounds):
            state.round += 1
            _sdca.ssdca_epoch(stacked.rows, stacked.y, state.alpha, task_of_row, state.n,
                                 state.WT, state.BT, state.Sigma, stacked.sq_norms, perm,
                                 state.loss.kernel_id, config.gamma, config.lam,
                                 max(1, int(round(config.local_iters * X.shape[0]))),
                                 block_seed(config.seed, state.m, 0, state.round))
            if (t + 1) % config.gap_every == 0 or t + 1 == config.max_rounds:
                state.WT = state.Sigma @ state.BT / config.lam    # refresh: no drift from the rank-1 updates
                row = state.record(p)
                if progress is not None:
                    progress(row)
                if row["rel_gap"] <= config.tol:
                    return row, True
        return row, False

    converged = outer_loop(config, w_step, state.omega, state.outer_state, warn, state.certify)
    return state.result(converged, "ssdca")


def mtrl_central(source, config: DMTRLConfig, sigma_fixed=None, progress=None, warn=None) -> TrainResult:
    """Centralized MTRL: exact for the squared loss, SSDCA to 1e-10 otherwise."""
    config.validate()
    if config.loss != "squared":
        tight = dataclasses.replace(config, tol=min(config.tol, 1e-10), max_rounds=max(config.max_rounds, 5000))
        result = ssdca(source, tight, sigma_fixed, progress, warn)
        result.config["method"] = "mtrl-central"
        return result
    state = _Centralized(source, config, sigma_fixed)
    d, m, lam = state.d, state.m, config.lam
    A = np.zeros((m * d, m * d))
    c = np.zeros(m * d)
    for i, b in enumerate(state.blocks):
        Xi = np.asarray(b.X.toarray() if sp.issparse(b.X) else b.X, dtype=np.float64)     # (float32 files)
        A[i * d:(i + 1) * d, i * d:(i + 1) * d] = Xi.T @ Xi / state.n[i]     # X_i^T X_i / n_i
        c[i * d:(i + 1) * d] = Xi.T @ b.y / state.n[i]

    def w_step(p):
        # (blockdiag(X_i^T X_i / n_i) + lam (Omega kron I_d)) vec(W) = vec(X_i^T y_i / n_i)
        Omega = np.linalg.inv(state.Sigma)
        Omega = 0.5 * (Omega + Omega.T)
        WT = scipy.linalg.solve(A + lam * np.kron(Omega, np.eye(d)), c, assume_a="pos").reshape(m, d)
        # the optimal dual point: alpha = y - X w; B = [X_i^T alpha_i / n_i]
        for i, b in enumerate(state.blocks):
            state.alpha_of(i)[:] = b.y - b.decision(WT[i])
            state.BT[i] = b.rmatvec(state.alpha_of(i)) / state.n[i]
        state.WT = state.Sigma @ state.BT / lam
        state.round += 1
        row = state.record(p)
        if progress is not None:
            progress(row)
        return row, True

    converged = outer_loop(config, w_step, state.omega, state.outer_state, warn, state.certify)
    return state.result(converged, "mtrl-central")
