"""Local rounds (issue 14): while Sigma is diagonal (STL, a diagonal fixed Sigma, the first W-step of a
learned one) and every task is one block, the workers take whole rounds alone and send 5 numbers a task:
the same optimum as the dense exchange within the certificate, bitwise on resume (at every rank count:
test_rank_counts.py)."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from hpcmtl import store
from hpcmtl.cluster import Cluster
from hpcmtl.dmtrl import DMTRLConfig, train
from hpcmtl.estimators import MemoryTasks

from conftest import mpiexec_path, random_tasks, run_hpcmtl
from conftest import wsteps_certified  # noqa: E402


def fit(Xs, ys, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(**kw))


@pytest.mark.parametrize("loss", ["hinge", "smoothed-hinge", "logistic", "squared"])
@pytest.mark.parametrize("aggregation", ["qp", "adaptive", "safe"])
@pytest.mark.parametrize("relationship", ["identity", "learned"])
def test_local_rounds_reach_the_dense_optimum_within_the_certificate(loss, aggregation, relationship):
    Xs, ys = random_tasks(seed=1, m=5, loss=loss)
    kw = dict(loss=loss, lam=1e-2, tol=1e-8, aggregation=aggregation, relationship=relationship, outer=3,
              max_rounds=2000)
    dense, local = fit(Xs, ys, exchange="dense", **kw), fit(Xs, ys, exchange="auto", **kw)
    for r in (dense, local):
        h = r.history
        assert np.all(np.isfinite(h["primal"])) and np.all(np.isfinite(h["dual"]))
        assert np.all(h["primal"] - h["dual"] >= -1e-12 * np.abs(h["primal"]))        # P >= D: a certificate
        first = h["outer"] == 0                                   # the W-step local rounds took (Sigma = I/m)
        assert np.all(np.diff(h["dual"][first]) >= -1e-12 * np.abs(h["dual"][first][1:]))   # dual ascent
        assert wsteps_certified(r)
    # the first W-step solves the same problem (Sigma = I/m) both ways: its optima agree within both certificates
    # (later W-steps start from different Omega-steps, so only the first is the same problem)
    ends = [np.flatnonzero(r.history["outer"] == 0)[-1] for r in (dense, local)]
    primal = [r.history["primal"][i] for r, i in zip((dense, local), ends)]
    gap = sum(r.history["primal"][i] - r.history["dual"][i] for r, i in zip((dense, local), ends))
    assert abs(primal[0] - primal[1]) <= gap + 1e-12
    # (a learned Sigma's later W-steps follow the joint certificate's prox step and floor, whose loss sums are
    # summed over each block's support columns on one path and over all columns on the other: not bitwise)
    if relationship == "identity" and (aggregation == "safe" or loss in ("squared", "logistic")):
        # the same arithmetic in the same order (one task's quadratic solved alone is the joint one's block), with
        # one local step a round as the exchanged rounds take
        one = local if aggregation == "safe" else fit(Xs, ys, exchange="auto", local_steps=1, **kw)
        assert one.W.tobytes() == dense.W.tobytes()


def test_a_learned_sigma_leaves_local_rounds_after_its_first_w_step():
    Xs, ys = random_tasks(seed=2, m=4, loss="squared")
    # --outer-tol 0: three W-steps (with it the accelerated outer step certifies the optimum after two)
    r = fit(Xs, ys, loss="squared", lam=1e-2, tol=1e-10, outer=3, outer_tol=0.0, exchange="auto")
    assert not np.allclose(r.Sigma, np.diag(np.diag(r.Sigma)))           # coupled after the Omega-step
    assert wsteps_certified(r) and len(r.wsteps["converged"]) == 3


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    d = tmp_path_factory.mktemp("local")
    path = d / "s.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", path, "--scale", "0.05", "--seed", "3"]).returncode == 0
    return path


@pytest.mark.mpi
def test_resume_inside_a_local_w_step_is_bitwise_at_another_rank_count(synth, tmp_path):
    # two local steps a round: still several a round, and a W-step long enough (32 rounds at tol 1e-9, with the
    # margin corrections near its end) to stop inside it
    args = ["train", "stl", "--train", synth, "--loss", "hinge", "--lam", "1e-3", "--tol", "1e-9", "--quiet",
            "--local-steps", "2", "--local-solver", "sdca"]      # local SDCA: the exact box solver needs 2 rounds
    reference = tmp_path / "reference.h5"
    assert run_hpcmtl(args + ["--out", reference], n_ranks=2).returncode == 0
    out = tmp_path / "r.h5"
    killed = [mpiexec_path(), "-n", "3", sys.executable, "-m", "hpcmtl"] + [str(a) for a in args] + [
        "--out", str(out), "--checkpoint-every", "5"]
    proc = subprocess.run(killed, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, HPCMTL_FAULT="2:23:kill"))
    assert proc.returncode != 0 and not out.exists()
    assert store.read_checkpoint(str(out) + ".checkpoint.h5")["counters"]["round"] == 20
    r = run_hpcmtl(args + ["--out", out, "--checkpoint-every", "5", "--resume"], n_ranks=4)
    assert r.returncode == 0, r.stderr
    assert store.read_result(out)["model"]["W"].tobytes() == store.read_result(reference)["model"]["W"].tobytes()
