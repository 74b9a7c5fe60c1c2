"""A W-step's round budget past --max-rounds (hpcmtl.dmtrl.outer.round_budget) and the 'qp' rho's least value
(hpcmtl.dmtrl.sigma.coupled_rho): what keeps a learned Sigma's late W-steps certified as its floor falls (issue 36)."""
import numpy as np
import pytest

from hpcmtl.cluster import Cluster
from hpcmtl.dmtrl import DMTRLConfig, omega_step, train
from hpcmtl.dmtrl.outer import BUDGET_MOST, STALLED_ROWS, round_budget
from hpcmtl.dmtrl.sigma import RHO_LOW, coupled_rho
from hpcmtl.estimators import MemoryTasks


def geometric(g0, q, rounds):
    k = np.arange(1, rounds + 1)
    return k, g0 * q ** k


def test_the_budget_is_max_rounds_until_they_are_taken():
    k, g = geometric(1e-2, 0.99, 300)
    assert round_budget(k, g, 300, 1e-6, 500) == 500


def test_past_max_rounds_the_budget_is_the_round_the_rate_projects():
    """A gap falling 0.99x a round from 1e-2 is 6.57e-5 at round 500; --tol 1e-6 is log(1e-6 / 6.57e-5) / log(0.99)
    = 416.4 rounds further: the budget is round 917."""
    k, g = geometric(1e-2, 0.99, 500)
    got = round_budget(k, g, 500, 1e-6, 500)
    assert got == 500 + int(np.ceil(np.log(1e-6 / g[-1]) / np.log(0.99))) == 917


def test_a_rate_that_would_pass_the_cap_stops_at_max_rounds():
    """0.999x a round from 1e-3: 6.1e-4 at round 500, 6,400 rounds more to 1e-6 (past BUDGET_MOST x 500)."""
    k, g = geometric(1e-3, 0.999, 500)
    assert 500 + np.log(1e-6 / g[-1]) / np.log(0.999) > BUDGET_MOST * 500
    assert round_budget(k, g, 500, 1e-6, 500) == 500


def test_a_stalled_or_rising_gap_stops_at_max_rounds():
    k = np.arange(1, 501)
    assert round_budget(k, np.full(500, 3e-5), 500, 1e-6, 500) == 500
    assert round_budget(k, np.linspace(1e-5, 2e-5, 500), 500, 1e-6, 500) == 500


def test_the_rate_is_the_smallest_gaps_through_the_hinges_ups_and_downs():
    """The hinge's gap moves 2x up and down from round to round; the smallest gap so far falls 0.99x a round, and
    the budget is within 6 rounds of the smooth gap's (917: the smallest gap may be two rounds old), also when the
    last gap jumps 3x up (the last gaps' own rate would then be 0.9932x a round: 775 rounds more)."""
    k, g = geometric(1e-2, 0.99, 500)
    noisy = g * np.where(k % 2 == 0, 1.0, 2.0)
    smooth = round_budget(k, g, 500, 1e-6, 500)
    assert abs(round_budget(k, noisy, 500, 1e-6, 500) - smooth) <= 6
    noisy[-1] *= 3.0
    assert abs(round_budget(k, noisy, 500, 1e-6, 500) - smooth) <= 6


def test_too_few_recorded_rows_keep_max_rounds():
    """--max-rounds 3 (a test's or a user's deliberate cut): fewer rows than the window, no projection."""
    k, g = geometric(1.0, 0.5, 3)
    assert STALLED_ROWS >= 3
    assert round_budget(k, g, 3, 1e-6, 3) == 3


def test_the_qp_rho_of_a_task_the_others_explain_falls_to_its_least_value():
    """Sigma of two equal tasks plus an independent one: s_i = 1 / (sigma_ii (Sigma^-1)_ii) is 1 - r^2 for the pair
    (r their correlation) and 1 for the third; the rho is s_i within [RHO_LOW, 1]."""
    for r, expect in ((0.999, RHO_LOW), (0.8, 0.36), (0.5, 0.75)):
        Sigma = np.array([[1.0, r, 0.0], [r, 1.0, 0.0], [0.0, 0.0, 1.0]]) / 3.0
        rho = coupled_rho(Sigma)
        assert rho[:2] == pytest.approx([expect, expect], rel=1e-12)
        assert rho[2] == pytest.approx(1.0, rel=1e-12)
    assert RHO_LOW == 0.25


@pytest.mark.slow
@pytest.mark.shared_data
def test_a_reuters_subsets_late_w_steps_certify_with_the_default_budget(shared_data, tmp_path):
    """Reuters, the first 500 training documents of each of 8 topics (all tasks share them), hinge, lam 1e-3, no
    intercept: W has task rank 3, and as the joint gap closes the floor falls to 2e-5, Sigma's condition number
    grows to 5e4 and the late W-steps need 450-850 rounds (main: 7 of 18 W-steps ended at --max-rounds 500
    unconverged).  With the defaults every W-step certifies --tol and the joint gap --outer-tol; at least one
    W-step went past --max-rounds on the budget that followed its gap, none past BUDGET_MOST of it."""
    from conftest import reuters_subset
    Xs, ys = reuters_subset(shared_data, tmp_path, 500)
    warnings = []
    config = DMTRLConfig(loss="hinge", lam=1e-3, fit_intercept=False)
    result = train(Cluster.serial(), MemoryTasks(Xs, ys), config, warn=warnings.append)
    steps = result.wsteps
    rounds = np.diff(np.concatenate([[0], steps["round"]]))
    assert result.converged and not warnings
    assert np.all(steps["converged"] == 1) and np.all(steps["rel_gap"] <= config.tol)
    assert steps["joint_rel_gap"][-1] <= config.outer_tol
    assert rounds.max() > config.max_rounds and rounds.max() <= BUDGET_MOST * config.max_rounds
