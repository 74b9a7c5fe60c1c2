"""Checkpoints, resume, signals, failing together and the bad-input matrix (real mpiexec runs)."""
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from hpcmtl import store
from hpcmtl.progress import fields

from conftest import mpiexec_path, run_hpcmtl

pytestmark = pytest.mark.mpi

SETTINGS = ["--loss", "hinge", "--lam", "1e-2", "--tol", "1e-8", "--outer", "4", "--outer-tol", "0"]   # 96 rounds: a signal at 60 lands (4 W-steps: with the joint stop the dual phase certifies in fewer)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("rel")
    tr, te = d / "tr.h5", d / "te.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--test", te, "--scale", "0.05", "--seed", "2"]).returncode == 0
    ref = d / "reference.h5"
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", ref, "--quiet"] + SETTINGS, n_ranks=2)
    assert r.returncode == 0, r.stderr
    return tr, te, store.read_result(ref)


def same_model(path, reference):
    res = store.read_result(path)
    return (res["model"]["W"].tobytes() == reference["model"]["W"].tobytes()
            and res["model"]["Sigma"].tobytes() == reference["model"]["Sigma"].tobytes())


def test_killed_worker_ends_the_job_and_resume_is_bitwise(data, tmp_path):
    tr, _, reference = data
    out = tmp_path / "r.h5"
    args = ["train", "dmtrl", "--train", tr, "--out", out, "--quiet", "--checkpoint-every", "5"] + SETTINGS
    cmd = [mpiexec_path(), "-n", "3", sys.executable, "-m", "hpcmtl"] + [str(a) for a in args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, HPCMTL_FAULT="2:33:kill"))
    for line in proc.stderr:                     # the rank says when it dies (MPI start-up not timed)
        if "injected kill" in line:
            break
    t = time.monotonic()
    proc.communicate(timeout=60)
    elapsed = time.monotonic() - t
    assert proc.returncode != 0 and elapsed < 10, (proc.returncode, elapsed)
    assert not out.exists()
    ck = store.read_checkpoint(str(out) + ".checkpoint.h5")
    assert ck["counters"]["round"] == 30                         # the last checkpoint before the kill
    r = run_hpcmtl(args + ["--resume"], n_ranks=4)               # another rank count
    assert r.returncode == 0, r.stderr
    assert same_model(out, reference)


def test_exception_on_one_worker_ends_every_rank_with_one_line(data, tmp_path):
    tr, _, _ = data
    cmd = [mpiexec_path(), "-n", "4", sys.executable, "-m", "hpcmtl", "train", "dmtrl", "--train", str(tr),
           "--out", str(tmp_path / "r.h5"), "--quiet"] + SETTINGS
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, HPCMTL_FAULT="3:7"))
    lines = []
    for line in proc.stderr:                     # the failing rank's line arrives first ...
        lines.append(line)
        if line.startswith("hpcmtl:"):
            break
    t = time.monotonic()
    _, rest = proc.communicate(timeout=60)       # ... then every rank must be gone promptly
    assert time.monotonic() - t < 10
    assert proc.returncode != 0
    ours = [line for line in lines + rest.splitlines() if line.startswith("hpcmtl:")]
    assert len(ours) == 1
    assert "rank 3 of 4" in ours[0] and "injected fault" in ours[0] and "task '" in ours[0]


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGUSR1", "SIGINT"])
def test_signal_checkpoints_and_exits_75_then_resume_is_bitwise(data, tmp_path, signame):
    tr, _, reference = data
    out = tmp_path / "r.h5"
    cmd = [mpiexec_path(), "-n", "3", sys.executable, "-m", "hpcmtl", "train", "dmtrl", "--train", str(tr),
           "--out", str(out), "--progress-seconds", "0"] + SETTINGS
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(2000):
        line = proc.stdout.readline()
        if not line or fields(line).get("round", 0) >= 60:
            break
    t = time.monotonic()
    proc.send_signal(getattr(signal, signame))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 75, err
    assert time.monotonic() - t < 10
    assert f"received {signame}: checkpoint written to" in err and not out.exists()
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", out, "--quiet", "--resume"] + SETTINGS, n_ranks=2)
    assert r.returncode == 0, r.stderr
    assert same_model(out, reference)
    assert store.read_result(out)["history"]["round"][-1] == reference["history"]["round"][-1]


def test_resume_with_other_settings_or_data_is_refused(data, tmp_path):
    tr, te, _ = data
    out = tmp_path / "r.h5"
    args = ["train", "dmtrl", "--train", tr, "--out", out, "--quiet", "--checkpoint-every", "3", "--max-rounds", "3",
            "--outer", "1", "--loss", "hinge", "--lam", "1e-2", "--local-steps", "1"]   # (still running at round 3)
    assert run_hpcmtl(args, n_ranks=2).returncode == 0
    os.remove(out)
    for change, message in ((["--lam", "0.5"], "'lam' is 0.01 in the checkpoint but 0.5 now"),
                            (["--loss", "logistic"], "'loss' is 'hinge' in the checkpoint but 'logistic' now"),
                            (["--seed", "4"], "'seed' is 0 in the checkpoint but 4 now"),
                            (["--positive-label", "-1"], "'positive_label' is None in the checkpoint but -1"),
                            (["--aggregation", "safe"], "'aggregation' is 'qp' in the checkpoint but 'safe' now")):
        r = run_hpcmtl(args + change + ["--resume"], n_ranks=2)
        assert r.returncode == 2 and message in r.stderr and r.stderr.count("hpcmtl: error") == 1, r.stderr
    other = tmp_path / "other.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", other, "--scale", "0.05", "--seed", "9"]).returncode == 0
    r = run_hpcmtl(["train", "dmtrl", "--train", other] + args[4:] + ["--resume"], n_ranks=2)
    assert r.returncode == 2 and "written for other training data" in r.stderr
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", tmp_path / "none.h5", "--lam", "1", "--resume"])
    assert r.returncode == 2 and "no checkpoint to resume from" in r.stderr


def test_crash_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path):
    path = tmp_path / "ck.h5"
    blocks = [{"task": 0, "part": 0, "start": 0, "stop": 3, "alpha": np.ones(3), "order": np.arange(3),
               "shrink": np.zeros(5)}]
    store.write_checkpoint(path, {"BT": np.ones((1, 2))}, blocks, {"lam": 1}, {"round": 5})
    code = ("import numpy as np, os, signal\n"
            "from hpcmtl import store\n"
            "with store.atomic_h5(os.environ['P']) as f:\n"
            "    f.create_dataset('x', data=np.ones(10**6)); f.flush()\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    subprocess.run([sys.executable, "-c", code], env=dict(os.environ, P=str(path)), timeout=60)
    assert store.read_checkpoint(path)["counters"] == {"round": 5}


def test_different_seeds_reach_the_same_optimum(data, tmp_path):
    tr, _, reference = data
    out = tmp_path / "s.h5"
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", out, "--quiet", "--seed", "7"] + SETTINGS, n_ranks=3)
    assert r.returncode == 0
    res = store.read_result(out)
    assert not np.array_equal(res["history"]["primal"], reference["history"]["primal"])   # other coordinate order
    assert res["history"]["primal"][-1] == pytest.approx(reference["history"]["primal"][-1], rel=2e-5)


# --- the bad-input matrix: one line, exit code 2, nothing under the final name -----------------
def bad_files(tmp, tr):
    notes = tmp / "notes.h5"
    notes.write_text("plain text")
    other = tmp / "other-format.h5"
    with h5py.File(other, "w") as f:
        f.attrs["format"] = "pandas"
    future = tmp / "future.h5"
    future.write_bytes(open(tr, "rb").read())
    with h5py.File(future, "a") as f:
        f.attrs["format_version"] = 7
    nan_y = tmp / "nan-y.h5"
    nan_y.write_bytes(open(tr, "rb").read())
    with h5py.File(nan_y, "a") as f:
        y = f["tasks/000004/y"][()]
        y[3] = np.nan
        f["tasks/000004/y"][...] = y
    inf_x = tmp / "inf-x.h5"
    inf_x.write_bytes(open(tr, "rb").read())
    with h5py.File(inf_x, "a") as f:
        f["tasks/000009/X"][2, 2] = np.inf
    labels = tmp / "labels.h5"
    store.write_tasks(labels, [np.ones((3, 2))] * 2, [np.array([1, -1, 1.0]), np.array([0, 1, -1.0])])
    empty = tmp / "empty.h5"
    store.write_tasks(empty, [np.ones((3, 2))] * 2, [np.ones(3)] * 2)
    with h5py.File(empty, "a") as f:
        del f["tasks/000001"]
        f.create_group("tasks/000001")
        f["tasks/000001"].create_dataset("y", data=np.zeros(0))
        f["tasks/000001"].create_dataset("X", data=np.zeros((0, 2)))
        table = f["task_table"][()]
        table["n_samples"][1] = 0
        f["task_table"][...] = table
    broken = tmp / "broken.h5"
    broken.write_bytes(open(tr, "rb").read())
    with h5py.File(broken, "a") as f:
        del f["tasks/000013/X"]
    ragged = tmp / "ragged.h5"
    store.write_tasks(ragged, [np.ones((3, 2))] * 2, [np.ones(3)] * 2)
    with h5py.File(ragged, "a") as f:
        del f["tasks/000001/X"]
        f["tasks/000001"].create_dataset("X", data=np.ones((3, 5)))
    dupnames = tmp / "dupnames.h5"
    store.write_tasks(dupnames, [np.ones((3, 2))] * 2, [np.ones(3)] * 2, names=["a", "b"])
    with h5py.File(dupnames, "a") as f:
        table = f["task_table"][()]
        table["name"][1] = "a"
        f["task_table"][...] = table
    trcopy = tmp / "trcopy.h5"                 # a training file the case may try to overwrite
    trcopy.write_bytes(open(tr, "rb").read())
    outdir = tmp / "outdir"
    outdir.mkdir()
    return locals()


CASES = [
    ("missing", ["--train", "{tmp}/missing.h5"], r"missing.h5: no such file"),
    ("not hdf5", ["--train", "{notes}"], r"notes.h5: not an HDF5 file"),
    ("other format", ["--train", "{other}"], r"other-format.h5: attribute 'format' is 'pandas', expected 'hpcmtl-tasks'"),
    ("other version", ["--train", "{future}"], r"future.h5: attribute 'format_version' is 7, this hpcmtl reads version 1"),
    ("nan in y", ["--train", "{nan_y}"], r"nan-y.h5: task 'task05' (#4): field 'y': contains NaN or Inf"),
    ("inf in X", ["--train", "{inf_x}"], r"inf-x.h5: task 'task10' (#9): field 'X': contains NaN or Inf"),
    ("labels", ["--train", "{labels}"], r"labels.h5: task 'task1' (#1): field 'y': the hinge loss needs labels -1/+1, found 0.0"),
    ("empty task", ["--train", "{empty}"], r"empty.h5: task 'task1' (#1): field 'y': empty task (0 samples)"),
    ("corrupt group", ["--train", "{broken}"], r"broken.h5: task 'task14' (#13): field 'X' is missing"),
    ("features differ", ["--train", "{ragged}"], r"ragged.h5: task 'task1' (#1): field 'X': has 5 features, other tasks have 2"),
    ("test features", ["--test", "{labels}"], r"labels.h5: has 2 features, the training data"),
    ("lam", ["--lam", "-1"], r"argument --lam: --lam must be > 0, got -1"),
    ("tol", ["--tol", "0"], r"argument --tol: --tol must be > 0, got 0"),
    ("negative count", ["--max-rounds", "-3"], r"argument --max-rounds: --max-rounds must be >= 1, got -3"),
    ("unknown option", ["--lamda", "1"], r"unrecognized arguments: --lamda 1. Did you mean '--lam'?"),
    ("unknown loss", ["--loss", "hing"], r"Got 'hing' instead. Did you mean 'hinge'?"),
    ("unwritable output", ["--out", "/proc/hpcmtl/r.h5"], r"cannot write output: directory /proc/hpcmtl does not exist"),
    ("duplicate task names", ["--train", "{dupnames}"], r"dupnames.h5: 'task_table': task name 'a' is used by tasks #0 and #1"),
    ("checkpoint is the training file", ["--train", "{trcopy}", "--checkpoint", "{trcopy}"],
     r"trcopy.h5 is the same file as --train"),
    ("out is the test file", ["--test", "{trcopy}", "--out", "{trcopy}"], r"trcopy.h5 is the same file as --test"),
    ("out is a directory", ["--out", "{outdir}"], r"outdir: is a directory, expected the name of an output file"),
    ("checkpoint is a directory", ["--checkpoint", "{outdir}"], r"outdir: is a directory, expected the name of an output file"),
]


@pytest.mark.parametrize("name,change,message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_matrix(data, tmp_path, name, change, message):
    tr, te, _ = data
    files = {k: str(v) for k, v in bad_files(tmp_path, tr).items() if isinstance(v, os.PathLike)}
    files["tmp"] = str(tmp_path)
    out = tmp_path / "result.h5"
    base = {"--train": str(tr), "--out": str(out), "--lam": "1e-2", "--loss": "hinge"}
    extra = []
    for key, value in zip(change[0::2], change[1::2]):
        value = value.format(**files)
        if key in base:
            base[key] = value
        else:
            extra += [key, value]
    args = ["train", "dmtrl"] + [x for kv in base.items() for x in kv] + extra
    r = run_hpcmtl(args, n_ranks=3, timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert not out.exists() and not any(p.startswith(".result.h5") for p in os.listdir(tmp_path))
    assert open(files["trcopy"], "rb").read() == open(tr, "rb").read()      # an input is never written
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path))


def test_existing_result_is_refused_unless_force(data, tmp_path):
    tr, _, _ = data
    out = tmp_path / "r.h5"
    out.write_text("precious")
    args = ["train", "stl", "--train", tr, "--out", out, "--lam", "1e-2", "--quiet", "--max-rounds", "3"]
    r = run_hpcmtl(args, n_ranks=2)
    assert r.returncode == 2 and "r.h5: output file exists (use --force to overwrite)" in r.stderr
    assert out.read_text() == "precious"
    assert run_hpcmtl(args + ["--force"], n_ranks=2).returncode == 0
    assert store.read_result(out)["model"]["W"].shape == (100, 16)


def test_evaluate_refuses_a_test_file_with_other_features(data, tmp_path):
    tr, _, reference = data
    out = tmp_path / "r.h5"
    assert run_hpcmtl(["train", "stl", "--train", tr, "--out", out, "--lam", "1e-2", "--quiet"]).returncode == 0
    small = tmp_path / "small.h5"
    store.write_tasks(small, [np.ones((2, 3))] * 16, [np.ones(2)] * 16)
    r = run_hpcmtl(["evaluate", out, small])
    assert r.returncode == 2 and "small.h5: has 3 features, the model was trained on 100" in r.stderr
