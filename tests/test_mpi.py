"""Real mpiexec runs: split tasks, failing together, School (the same bits at any rank count: test_rank_counts.py)."""
import json
import os

import h5py
import numpy as np
import pytest

from hpcmtl import store

from conftest import run_hpcmtl

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth")
    tr, te = d / "tr.h5", d / "te.h5"
    r = run_hpcmtl(["data", "synth", "dmtrl1", tr, "--test", te, "--scale", "0.04", "--seed", "5"])
    assert r.returncode == 0, r.stderr
    return tr, te


def train_args(tr, out, *extra):
    return ["train", "dmtrl", "--train", tr, "--out", out, "--loss", "hinge", "--lam", "1e-2",
            "--tol", "1e-5", "--outer", "3", "--quiet", "--force", *extra]


def test_split_tasks_reach_the_same_optimum(synth, tmp_path):
    tr, _ = synth
    plain, split = tmp_path / "plain.h5", tmp_path / "split.h5"
    args = ["--tol", "1e-7", "--max-rounds", "3000"]
    assert run_hpcmtl(train_args(tr, plain) + args, n_ranks=1).returncode == 0
    r = run_hpcmtl(train_args(tr, split) + args + ["--split-tasks"], n_ranks=4, timeout=240)
    assert r.returncode == 0, r.stderr
    a, b = store.read_result(plain), store.read_result(split)
    assert b["history"]["rel_gap"][-1] <= 1e-7
    assert b["history"]["primal"][-1] == pytest.approx(a["history"]["primal"][-1], rel=1e-5)


def test_test_metrics_during_training_match_evaluate(synth, tmp_path):
    tr, te = synth
    out = tmp_path / "r.h5"
    r = run_hpcmtl(train_args(tr, out, "--test", te), n_ranks=3)
    assert r.returncode == 0, r.stderr
    during = store.read_result(out)["test"]["summary"]
    ev = run_hpcmtl(["evaluate", out, te, "--json"])
    after = json.loads(ev.stdout)["summary"]
    assert during["task_mean_error_rate"] == pytest.approx(after["task_mean_error_rate"], abs=1e-12)
    assert 0.0 < after["task_mean_error_rate"] < 0.4


def corrupt(path, task, field, value):
    with h5py.File(path, "a") as f:
        data = f[f"tasks/{task:06d}/{field}"]
        arr = data[()]
        arr.flat[0] = value
        data[...] = arr


@pytest.mark.parametrize("field,value,message", [
    ("X", np.nan, "field 'X': contains NaN or Inf"),
    ("y", 3.0, "field 'y': the hinge loss needs labels -1/+1, found 3.0"),
])
def test_bad_task_data_on_one_worker_fails_every_rank_with_exit_2(synth, tmp_path, field, value, message):
    tr, _ = synth
    bad = tmp_path / "bad.h5"
    bad.write_bytes(open(tr, "rb").read())
    corrupt(bad, 11, field, value)
    out = tmp_path / "r.h5"
    r = run_hpcmtl(train_args(bad, out), n_ranks=4, timeout=120)
    assert r.returncode == 2
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    assert "task 'task12' (#11)" in lines[0] and message in lines[0] and "bad.h5" in lines[0]
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".r.h5")]


def test_option_errors_exit_2(synth, tmp_path):
    tr, te = synth
    out = tmp_path / "r.h5"
    r = run_hpcmtl(train_args(tr, out, "--los", "hinge"), n_ranks=2)
    assert r.returncode == 2 and "Did you mean '--loss'?" in r.stderr
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", out, "--lam", "0"], n_ranks=2)
    assert r.returncode == 2 and "--lam must be > 0" in r.stderr
    assert r.stderr.count("hpcmtl: error") == 1          # one line per job, not per rank
    other = tmp_path / "other.h5"
    store.write_tasks(other, [np.ones((3, 7))] * 16, [np.ones(3)] * 16, names=[f"task{i + 1:02d}" for i in range(16)])
    r = run_hpcmtl(train_args(tr, out, "--test", other), n_ranks=3)
    assert r.returncode == 2 and "other.h5: has 7 features, the training data" in r.stderr
    assert r.stderr.count("hpcmtl: error") == 1


@pytest.mark.shared_data
def test_school_end_to_end_on_3_ranks(shared_data, tmp_path):
    full, tr, te = tmp_path / "school.h5", tmp_path / "tr.h5", tmp_path / "te.h5"
    assert run_hpcmtl(["data", "convert", "--format", "malsar", os.path.join(shared_data, "school.mat"), full]).returncode == 0
    raw_tr, raw_te = tmp_path / "raw_tr.h5", tmp_path / "raw_te.h5"
    assert run_hpcmtl(["data", "split", full, raw_tr, raw_te, "--test-fraction", "0.25", "--seed", "0"]).returncode == 0
    r = run_hpcmtl(["data", "standardize", raw_tr, tr, "--test", raw_te, te])
    assert r.returncode == 0, r.stderr
    out = tmp_path / "r.h5"
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--test", te, "--out", out, "--loss", "squared",
                    "--lam", "1e-2", "--tol", "1e-6", "--outer", "3", "--max-rounds", "3000", "--quiet"],
                   n_ranks=3, timeout=600)
    assert r.returncode == 0, r.stderr
    res = store.read_result(out)
    assert res["history"]["rel_gap"][-1] <= 1e-6 and res["n_ranks"] == 3
    assert res["model"]["W"].shape == (28, 139)
    ev = json.loads(run_hpcmtl(["evaluate", out, te, "--json"]).stdout)["summary"]
    assert 9.0 < ev["pooled_rmse"] < 12.5 and 0.1 < ev["pooled_explained_variance"] < 0.45


def test_fixed_sigma_from_a_result_reproduces_the_last_w_step(synth, tmp_path):
    tr, _ = synth
    learned, fixed = tmp_path / "learned.h5", tmp_path / "fixed.h5"
    assert run_hpcmtl(train_args(tr, learned, "--tol", "1e-8", "--max-rounds", "5000"), n_ranks=3).returncode == 0
    r = run_hpcmtl(["train", "fixed", "--sigma", learned, "--train", tr, "--out", fixed, "--loss", "hinge",
                    "--lam", "1e-2", "--tol", "1e-8", "--max-rounds", "5000", "--quiet"], n_ranks=2)
    assert r.returncode == 0, r.stderr
    a, b = store.read_result(learned), store.read_result(fixed)
    assert b["model"]["Sigma"].tobytes() == a["model"]["Sigma"].tobytes()
    assert b["history"]["primal"][-1] == pytest.approx(a["history"]["primal"][-1], rel=1e-6)
    r = run_hpcmtl(["train", "fixed", "--train", tr, "--out", tmp_path / "x.h5", "--lam", "1"], n_ranks=2)
    assert r.returncode == 2 and "needs --sigma" in r.stderr


def test_sleeping_and_spinning_waits_give_the_same_bits_and_a_bad_mode_exits_2(synth, tmp_path):
    """HPCMTL_MPI_WAIT: how ranks wait inside the hot path's collectives (auto sleeps between tests when a node
    runs more ranks than it has CPUs for them, as this 2-core machine does at P = 3).  Waiting differently never
    changes a number; a value other than auto/spin/sleep is a one-line error, exit 2 on every rank."""
    tr, _ = synth
    models = {}
    for mode in ("spin", "sleep"):
        out = tmp_path / f"{mode}.h5"
        r = run_hpcmtl(train_args(tr, out), n_ranks=3, timeout=240, env={"HPCMTL_MPI_WAIT": mode})
        assert r.returncode == 0, r.stderr
        models[mode] = store.read_result(out)
    assert models["spin"]["model"]["W"].tobytes() == models["sleep"]["model"]["W"].tobytes()
    assert np.array_equal(models["spin"]["history"]["primal"], models["sleep"]["history"]["primal"])
    out = tmp_path / "bad.h5"
    r = run_hpcmtl(train_args(tr, out), n_ranks=3, timeout=120, env={"HPCMTL_MPI_WAIT": "nap"})
    assert r.returncode == 2 and not out.exists()
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "HPCMTL_MPI_WAIT='nap'" in lines[0] and "auto, spin or sleep" in lines[0], r.stderr
