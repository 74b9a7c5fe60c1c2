"""The same bits at every rank count: one parametrized test over the case table ``CASES``.

Each case trains one command line under ``mpiexec -n P`` for every P of its ``counts`` and checks that the
result's ``compare`` arrays are bitwise those of the first count; then its own ``check`` (convergence,
traffic per round, a killed and resumed run, a ``--split-tasks`` run ...) runs on those results.  Each case
launches exactly the mpiexec jobs its test launched before the suite gathered them.
"""
import os
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pytest
from numpy.testing import assert_allclose

from hpcmtl import store

from conftest import assert_certified_ascent, assert_resume_is_bitwise, learned_hinge_args, run_hpcmtl

pytestmark = pytest.mark.mpi

MODEL = (("model", "W"), ("model", "Sigma"))
HISTORY = tuple(("history", k) for k in ("round", "primal", "dual", "step"))


@dataclass
class Case:
    data: Callable                   # data(directory) -> what ``args`` trains on (written once a session)
    args: Callable                   # args(data, out) -> the ``hpcmtl`` command line
    check: Optional[Callable] = None  # check(runs, data, args, tmp_path): the case's own assertions
    counts: tuple = (1, 2, 3, 5)
    compare: tuple = MODEL + HISTORY
    timeout: int = 300


# -- training data -------------------------------------------------------------------------------------------
def synth_file(*options):
    def make(directory):
        path = os.path.join(directory, "tr.h5")
        r = run_hpcmtl(["data", "synth", "dmtrl1", path, *options])
        assert r.returncode == 0, r.stderr
        return path
    return make


SYNTH_AGGREGATION = synth_file("--scale", "0.04", "--seed", "5")


def synth_with_test(directory):
    tr, te = os.path.join(directory, "tr.h5"), os.path.join(directory, "te.h5")
    r = run_hpcmtl(["data", "synth", "dmtrl1", tr, "--test", te, "--scale", "0.04", "--seed", "5"])
    assert r.returncode == 0, r.stderr
    return tr, te


def written(make_tasks):
    """``make_tasks()`` -> (Xs, ys[, names]) written as a task file."""
    def make(directory):
        tasks = make_tasks()
        path = os.path.join(directory, "tr.h5")
        names = tasks[2] if len(tasks) > 2 else [f"t{i}" for i in range(len(tasks[0]))]
        store.write_tasks(path, tasks[0], tasks[1], names=names)
        return path
    return make


def interior_small_raw():
    from test_interior import raw_tasks
    return raw_tasks(7, m=12, d=6, zero_row=True)


def interior_one_large_feature():
    from test_interior import one_large_feature_tasks
    return one_large_feature_tasks(1)


def polish_scaled():
    from test_polish import scaled_tasks
    return scaled_tasks()


def polish_sparse_rows():
    """Synthetic 2 at 30 % of its rows with the values below 1.5 in magnitude dropped (13 % of them stay),
    stored as CSR: the third W-step's corrections go through the free rows' Gram matrix (min_norm_through_gram;
    62 of them at P = 1)."""
    import scipy.sparse as sp
    from hpcmtl import synthetic
    (Xs, ys, names), _, _ = synthetic.dmtrl(2, 0, 0.3)
    return [sp.csr_matrix(np.where(np.abs(X) >= 1.5, X, 0.0)) for X in Xs], ys, names


def intercept_tasks(sparse):
    def make(directory):
        from test_intercept import offset_tasks
        Xs, ys = offset_tasks(seed=10, sparse=sparse, m=5, d=6, sizes=(40, 60, 35, 50, 45))
        path = os.path.join(directory, "tr.h5")
        store.write_tasks(path, Xs, ys)
        return path
    return make


# -- command lines -------------------------------------------------------------------------------------------
def aggregation_args(loss):
    def args(tr, out):
        return ["train", "dmtrl", "--train", tr, "--out", out, "--loss", "hinge", "--lam", "1e-3",
                "--tol", "1e-6", "--outer", "3", "--outer-tol", "0", "--quiet", "--force", "--loss", loss]
    return args


def mpi_args(data, out):
    return ["train", "dmtrl", "--train", data[0], "--out", out, "--loss", "hinge", "--lam", "1e-2",
            "--tol", "1e-5", "--outer", "3", "--quiet", "--force"]


def learned(lam, outer):
    def args(tr, out, *extra):
        return learned_hinge_args(str(tr), str(out), lam, outer, *extra)
    return args


def intercept_args(tr, out, *extra):
    return ["train", "dmtrl", "--train", tr, "--loss", "squared", "--lam", "1e-2", "--tol", "1e-9", "--outer", "3",
            "--quiet", "--force", "--out", out, *extra]


def path_args(data, out, *extra):
    tr, te = data
    return ["train", "dmtrl", "--train", tr, "--out", out, "--loss", "hinge", "--lam-grid", "1e-3:1e-1:3",
            "--tol", "1e-5", "--outer", "2", "--force", "--quiet", "--cv", "3", *extra]


# -- the cases' own checks -----------------------------------------------------------------------------------
def converged(runs):
    ref = runs[1]
    assert ref["model"]["converged"] == 1 and ref["wsteps"]["converged"].all()
    return ref


def check_mpi(runs, data, args, tmp_path):
    for p, res in runs.items():
        assert res["n_ranks"] == p
    assert runs[1]["history"]["rel_gap"][-1] <= 1e-5
    # bytes per round under the default aggregation (hinge: box momentum): delta b up and w down, 2 * 8 * d * m,
    # and the momentum direction's b where it differs from the server's dP (at most whole: 3 * 8 * d * m), plus
    # per-task scalars (9), the direction's header and control messages
    h = runs[5]["history"]
    per_round = np.diff(h["bytes"]) / np.diff(h["round"])
    d, m = 100, 16
    assert 2 * 8 * d * m <= np.median(per_round) <= 1.05 * 8 * (3 * d + 10) * m


def check_aggregation(loss):
    def check(runs, data, args, tmp_path):
        converged(runs)
        # traffic, O(d) a task and round: delta b with 5 (hinge: 6) scalars up, w with 3 scalars down; hinge: and
        # the momentum direction's b where it differs from the server's dP (at most whole, plus its header)
        h = runs[5]["history"]
        per_round = np.median(np.diff(h["bytes"]) / np.diff(h["round"]))
        d, m = 100, 16
        vectors, scalars = (3, 10) if loss == "hinge" else (2, 8)
        assert 2 * 8 * d * m <= per_round <= 1.05 * 8 * (vectors * d + scalars) * m
    return check


def check_exact_box(runs, data, args, tmp_path):
    ref = converged(runs)
    assert ref["wsteps"]["round"][0] == 1                    # the first W-step (Sigma = I/m): one exact round
    h = ref["history"]
    assert_certified_ascent(h)                               # P >= D, dual ascent in every W-step
    assert h["round"][-1] > 15
    out = tmp_path / "r.h5"
    assert_resume_is_bitwise(args(data, out, "--checkpoint-every", "4"), out, ref, 15, 12)


def check_interior_learned(runs, data, args, tmp_path):
    from hpcmtl import interior
    ref = converged(runs)
    steps = ref["wsteps"]
    assert np.all(steps["rel_gap"] <= 1e-6)
    assert steps["round"][0] == 1                             # Sigma = I/m: one round of exact local steps
    assert np.max(np.diff(steps["round"])) <= interior.MAX_ROUNDS   # the coupled ones: interior-point rounds only
    assert_certified_ascent(ref["history"])
    # killed inside W-step 3's interior-point rounds: the checkpoint is the one after W-step 2 (none inside them)
    out = tmp_path / "r.h5"
    assert_resume_is_bitwise(args(data, out, "--checkpoint-every", "1"), out, ref,
                             int(steps["round"][1]) + 3, int(steps["round"][1]))


def check_interior_turn(runs, data, args, tmp_path):
    from hpcmtl import dmtrl
    ref = converged(runs)
    turn = dmtrl.INTERIOR_AFTER_LOCAL_STALL + 1           # the first row sets the gap the next ones do not halve
    assert turn < ref["wsteps"]["round"][0] <= 40
    # killed inside those interior-point rounds: the checkpoint is the state they began from, bitwise again
    out = tmp_path / "r.h5"
    assert_resume_is_bitwise(args(data, out, "--checkpoint-every", "1"), out, ref, turn + 4, turn)


def check_polish_corrected(runs, data, args, tmp_path):
    ref = converged(runs)
    first = int(ref["wsteps"]["round"][0])
    assert 1 < first <= 10                  # W-step 1 (local rounds) certifies by its correction
    # killed in W-step 1 before its correction: resumed at another rank count, the same correction, bitwise
    out = tmp_path / "r.h5"
    assert_resume_is_bitwise(args(data, out, "--checkpoint-every", "1"), out, ref, first - 1, first - 2)


def check_polish_sparse_rows(runs, data, args, tmp_path):
    converged(runs)


def check_intercept(runs, data, args, tmp_path):
    ref = runs[1]["model"]
    assert np.all(np.isfinite(ref["intercept"])) and np.min(np.abs(ref["intercept"])) > 1.0
    # split tasks: every block is centered by its whole task's means; the same optimum
    out = tmp_path / "split.h5"
    r = run_hpcmtl(args(data, out, "--split-tasks", "--tol", "1e-11", "--max-rounds", "5000"), n_ranks=4,
                   timeout=240)
    assert r.returncode == 0, r.stderr
    split = store.read_result(out)
    assert split["history"]["rel_gap"][-1] <= 1e-11
    assert_allclose(split["model"]["intercept"], ref["intercept"], rtol=1e-5)
    assert_allclose(split["model"]["W"], ref["W"], atol=1e-5 * np.abs(ref["W"]).max())


def check_path(runs, data, args, tmp_path):
    ref = runs[1]
    assert ref["path"]["fold_scores"].shape == (3, 3) and ref["config"]["selection"]["cv"] == 3
    for p in (2, 3):
        assert runs[p]["config"]["selection"] == ref["config"]["selection"]
    split = tmp_path / "split.h5"
    r = run_hpcmtl(["train", "dmtrl", "--train", data[0], "--out", split, "--loss", "hinge", "--lam-grid",
                    "1e-3:1e-1:3", "--tol", "1e-5", "--outer", "2", "--force", "--quiet", "--cv", "3",
                    "--split-tasks"], n_ranks=3, timeout=300)
    assert r.returncode == 0, r.stderr
    s = store.read_result(split)
    assert s["config"]["selection"]["split_digest"] == ref["config"]["selection"]["split_digest"]
    assert s["config"]["selection"]["chosen_lam"] == ref["config"]["selection"]["chosen_lam"]


CASES = {
    "dmtrl hinge": Case(synth_with_test, mpi_args, check_mpi, timeout=240,
                        compare=MODEL + (("history", "primal"),)),
    "aggregation hinge": Case(SYNTH_AGGREGATION, aggregation_args("hinge"),
                              check_aggregation("hinge"), compare=MODEL + HISTORY + (("history", "rho"),)),
    "aggregation squared": Case(SYNTH_AGGREGATION, aggregation_args("squared"),
                                check_aggregation("squared"), compare=MODEL + HISTORY + (("history", "rho"),)),
    "exact box steps": Case(synth_file("--scale", "0.025", "--seed", "5"), learned("1e-3", "3"),
                            check_exact_box),
    "interior-point W-steps": Case(written(interior_small_raw), learned("1e-4", "4"), check_interior_learned),
    "turn to interior-point rounds": Case(written(interior_one_large_feature), learned("1e-2", "2"),
                                          check_interior_turn),
    "margin corrections": Case(written(polish_scaled), learned("1e-2", "3"), check_polish_corrected),
    "margin corrections of sparse rows": Case(written(polish_sparse_rows), learned("1e-3", "3"),
                                              check_polish_sparse_rows),
    "intercept dense": Case(intercept_tasks(False), intercept_args, check_intercept, counts=(1, 2, 3),
                            compare=MODEL + (("model", "intercept"),), timeout=240),
    "intercept sparse": Case(intercept_tasks(True), intercept_args, check_intercept, counts=(1, 2, 3),
                             compare=MODEL + (("model", "intercept"),), timeout=240),
    "lam path by cv": Case(synth_with_test, lambda data, out: path_args(data, out, "--test", data[1]),
                           check_path, counts=(1, 2, 3),
                           compare=MODEL + (("path", "validation_score"), ("path", "fold_scores"),
                                            ("path", "rounds"), ("history", "primal"))),
}

DATA = {}          # data function -> what it wrote (once a session)


@pytest.mark.parametrize("name", CASES)
def test_the_same_bits_at_every_rank_count(name, tmp_path, tmp_path_factory):
    case = CASES[name]
    if case.data not in DATA:
        DATA[case.data] = case.data(str(tmp_path_factory.mktemp("data")))
    data = DATA[case.data]
    runs = {}
    for p in case.counts:
        out = tmp_path / f"p{p}.h5"
        r = run_hpcmtl(case.args(data, out), n_ranks=p, timeout=case.timeout)
        assert r.returncode == 0, r.stderr
        runs[p] = store.read_result(out)
    ref = runs[case.counts[0]]
    for p in case.counts[1:]:
        for group, key in case.compare:
            assert runs[p][group][key].tobytes() == ref[group][key].tobytes(), f"{group}/{key} differs at P={p}"
    if case.check is not None:
        case.check(runs, data, case.args, tmp_path)
