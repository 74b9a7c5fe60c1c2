"""Nothing of the user's is destroyed, and faults end cleanly (issue 12, sections 3 and 4).

Real processes throughout: ``hpcmtl`` subprocesses, ``mpiexec -n K`` for the
multi-rank cases, a real full disk (a small tmpfs; ``mount`` needs root) and a
real file size limit (RLIMIT_FSIZE with SIGXFSZ ignored, available anywhere).
"""
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from hpcmtl import store
from hpcmtl.errors import InputError
from hpcmtl.progress import fields

from conftest import file_digest, mpiexec_path, one_error_line, random_tasks, run_hpcmtl, run_hpcmtl_timed

pytestmark = pytest.mark.mpi

FAST = ["--lam", "1e-2", "--max-rounds", "3", "--outer", "1", "--quiet", "--local-steps", "1"]   # running at round 3


def no_temporaries(directory):
    return [n for n in os.listdir(directory) if n.endswith(".tmp")] == []


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("safety")
    tr, te = d / "tr.h5", d / "te.h5"
    r = run_hpcmtl(["data", "synth", "dmtrl1", tr, "--test", te, "--scale", "0.05", "--seed", "2"])
    assert r.returncode == 0, r.stderr
    return tr, te


@pytest.fixture
def train_copy(data, tmp_path):
    copy = tmp_path / "train.h5"
    copy.write_bytes(data[0].read_bytes())
    return copy


# ---------------------------------------------------------------------------
# A full disk: a small tmpfs where mounting is allowed (root), else skipped with the reason
# ---------------------------------------------------------------------------
@contextlib.contextmanager
def small_disk(path, size_bytes, read_only=False):
    os.makedirs(path, exist_ok=True)
    options = f"size={int(size_bytes)}" + (",ro" if read_only else "")
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot make a small file system for a real full disk: {exc}")
    if r.returncode != 0:
        pytest.skip("cannot make a small file system for a real full disk "
                    f"('mount -t tmpfs' needs root / CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fsize_limit(limit):
    """preexec_fn: files may not grow beyond ``limit`` bytes; writes past it fail with EFBIG."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


# ===========================================================================
# Section 3: never destroy the user's files
# ===========================================================================
def output_cases(tmp, train, test):
    """(name, command, the paths the message must name) -- each command would overwrite an input."""
    link = tmp / "link.h5"
    link.symlink_to(train)
    hard = tmp / "hard.h5"
    os.link(train, hard)
    implicit = tmp / "r.h5.checkpoint.h5"            # --out r.h5 checkpoints here by default
    implicit.write_bytes(train.read_bytes())
    result = tmp / "result.h5"
    store.write_result(result, np.ones((100, 16)), np.eye(16), {"round": np.arange(2)}, {"lam": 0.1}, 1, "0")
    report_md = tmp / "rep" / "report.md"            # a result file named like a report file
    report_md.parent.mkdir()
    report_md.write_bytes(result.read_bytes())
    npz = tmp / "x.npz"
    np.savez(npz, X=np.ones((4, 2)), y=np.ones(4), task=np.array([0, 0, 1, 1]))
    t = ["train", "stl", "--train", train] + FAST
    return [
        ("checkpoint is the training file", t + ["--out", tmp / "o.h5", "--checkpoint", train], [train]),
        ("out is the training file, forced", t + ["--out", train, "--force"], [train]),
        ("out is a symbolic link to it", t + ["--out", link, "--force"], [link, train]),
        ("out is a hard link to it", t + ["--out", hard, "--force"], [hard, train]),
        ("the implicit checkpoint is it", ["train", "stl", "--train", implicit, "--out", tmp / "r.h5"] + FAST,
         [implicit]),
        ("out is the test file", t + ["--test", test, "--out", test, "--force"], [test]),
        ("out is the checkpoint", t + ["--out", tmp / "o.h5", "--checkpoint", tmp / "o.h5"], [tmp / "o.h5"]),
        ("sigma is the output", ["train", "fixed", "--train", train, "--sigma", result, "--out", result, "--force"]
         + FAST, [result]),
        ("split over its input", ["data", "split", train, train, tmp / "te2.h5", "--force"], [train]),
        ("split into one file", ["data", "split", train, tmp / "a.h5", tmp / "a.h5"], [tmp / "a.h5"]),
        ("standardize over its input", ["data", "standardize", train, train, "--force"], [train]),
        ("standardize over the test input", ["data", "standardize", train, tmp / "s.h5", "--test", test, test,
                                             "--force"], [test]),
        ("convert over its input", ["data", "convert", "--format", "npz", npz, npz, "--force"], [npz]),
        ("synth test over train", ["data", "synth", "dmtrl1", tmp / "b.h5", "--test", tmp / "b.h5"], [tmp / "b.h5"]),
        ("report over its input", ["report", result, "--out", result], [result]),
        ("report file over an input", ["report", report_md, "--out", report_md.parent], [report_md]),
    ]


CASE_NAMES = ["checkpoint is the training file", "out is the training file, forced", "out is a symbolic link to it",
              "out is a hard link to it", "the implicit checkpoint is it", "out is the test file",
              "out is the checkpoint", "sigma is the output", "split over its input", "split into one file",
              "standardize over its input", "standardize over the test input", "convert over its input",
              "synth test over train", "report over its input", "report file over an input"]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_an_output_that_is_an_input_is_refused_before_any_work(data, tmp_path, case):
    tr, te = data
    train = tmp_path / "train.h5"
    train.write_bytes(tr.read_bytes())
    test = tmp_path / "test.h5"
    test.write_bytes(te.read_bytes())
    cases = {name: (cmd, named) for name, cmd, named in output_cases(tmp_path, train, test)}
    cmd, named = cases[case]
    before = {p: file_digest(p) for p in tmp_path.rglob("*") if p.is_file()}
    listing = sorted(str(p) for p in tmp_path.rglob("*"))
    r = run_hpcmtl(cmd)
    line = one_error_line(r)
    assert r.returncode == 2, r.stderr
    assert line.startswith("hpcmtl: error: ") and "is the same file as" in line, line
    for path in named:
        assert str(path) in line, line
    assert "round" not in r.stdout                          # refused before any work
    assert {p: file_digest(p) for p in before} == before           # every file as it was ...
    assert sorted(str(p) for p in tmp_path.rglob("*")) == listing     # ... and nothing new


def test_an_output_that_is_an_input_is_refused_on_every_rank(train_copy, tmp_path):
    before = file_digest(train_copy)
    r, after_report = run_hpcmtl_timed(["train", "dmtrl", "--train", train_copy, "--out", train_copy, "--force"]
                                       + FAST, n_ranks=3, report="hpcmtl: error", timeout=120)
    assert r.returncode == 2 and after_report is not None and after_report < 10, (r.returncode, after_report)
    assert f"--out {train_copy} is the same file as --train {train_copy}" in one_error_line(r)
    assert file_digest(train_copy) == before


# --- content fingerprints ------------------------------------------------------------------------
@pytest.mark.parametrize("sparse", [False, True])
def test_fingerprints_are_stored_and_add_up_over_row_ranges(tmp_path, sparse):
    Xs, ys = random_tasks(0, m=3, sparse=sparse)
    path = tmp_path / "t.h5"
    store.write_tasks(path, Xs, ys)
    with store.TaskFile(path) as tf:
        assert len(tf.fingerprints) == 3 and len(set(tf.fingerprints)) == 3
        for i in range(3):
            n = int(tf.n_samples[i])
            whole = store.fingerprint_hex(*store.fingerprint_rows(tf.read_task(i).X, tf.read_task(i).y, 0, 6))
            assert whole == tf.fingerprints[i]
            parts = [(a, b, *store.fingerprint_rows(tf.read_block(i, a, b).X, tf.read_block(i, a, b).y, a, 6))
                     for a, b in ((0, 7), (7, 8), (8, n))]
            assert store.combine_fingerprints(parts, n) == tf.fingerprints[i]
            assert store.combine_fingerprints(parts[:2], n) is None          # not the whole task
    y = ys[1].copy()
    y[4] = -y[4]
    changed = store.fingerprint_hex(*store.fingerprint_rows(Xs[1], y, 0, 6))
    assert changed[:16] == tf.fingerprints[1][:16] and changed[16:] != tf.fingerprints[1][16:]


def reference_fingerprint(X, y, row_start, d):
    """The fingerprint element by element in plain Python integers (what the NumPy version must equal)."""
    mask = (1 << 64) - 1

    def mix(z):
        z ^= z >> 30
        z = (z * 0xBF58476D1CE4E5B9) & mask
        z ^= z >> 27
        z = (z * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    def bits(v):
        return int(np.float64(v).view(np.uint64))

    if sp.issparse(X):
        entries = [(r, int(X.indices[k]), X.data[k]) for r in range(X.shape[0])
                   for k in range(X.indptr[r], X.indptr[r + 1])]
    else:
        entries = [(r, c, X[r, c]) for r in range(X.shape[0]) for c in range(X.shape[1])]
    xs = sum(mix((((row_start + r) * d + c) * 0x9E3779B97F4A7C15 & mask) ^ bits(v)) for r, c, v in entries) & mask
    ys = sum(mix((((row_start + r) * 0x9E3779B97F4A7C15 + 0xD6E8FEB86659FD93) & mask) ^ bits(v))
             for r, v in enumerate(y)) & mask
    return xs, ys


@pytest.mark.parametrize("sparse", [False, True])
def test_fingerprint_equals_a_plain_python_reference_at_any_chunk_size(monkeypatch, sparse):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(9, 4)) * (rng.uniform(size=(9, 4)) < 0.5)
    X[3] = 0.0                                     # an empty row
    X[5, 1] = -0.0
    X = sp.csr_matrix(X) if sparse else X
    y = rng.choice([-1.0, 1.0], size=9)
    expected = reference_fingerprint(X, y, 11, 4)
    for chunk in (1 << 20, 5, 1):
        monkeypatch.setattr(store.fingerprints, "_CHUNK", chunk)
        assert store.fingerprint_rows(X, y, 11, 4) == expected


def flip_label(path, task, row=0):
    with h5py.File(path, "a") as f:
        y = f[f"tasks/{task:06d}/y"][()]
        y[row] = -y[row]
        f[f"tasks/{task:06d}/y"][...] = y


def drop_fingerprints(path):
    """Rewrite the task table as files written before fingerprints had it."""
    with h5py.File(path, "a") as f:
        table = f["task_table"][()]
        old = np.zeros(len(table), dtype=[("name", h5py.string_dtype()), ("n_samples", "i8"), ("nnz", "i8")])
        for key in ("name", "n_samples", "nnz"):
            old[key] = table[key]
        del f["task_table"]
        f.create_dataset("task_table", data=old)


@pytest.mark.parametrize("old_file", [False, True], ids=["fingerprinted", "written-before-fingerprints"])
def test_resume_refuses_training_data_whose_labels_changed(train_copy, tmp_path, old_file):
    if old_file:
        drop_fingerprints(train_copy)
        with store.TaskFile(train_copy) as tf:
            assert tf.fingerprints is None
    out = tmp_path / "r.h5"
    args = ["train", "dmtrl", "--train", train_copy, "--out", out, "--checkpoint-every", "3"] + FAST
    assert run_hpcmtl(args, n_ranks=3).returncode == 0
    os.remove(out)
    flip_label(train_copy, 5)
    for ranks in (3, 2):                        # verified at another rank count too
        r = run_hpcmtl(args + ["--resume"], n_ranks=ranks, timeout=60)
        line = one_error_line(r)
        assert r.returncode == 2, r.stderr
        assert (f"cannot resume: task 'task06' (#5) of {train_copy} has changed since the checkpoint was written: "
                f"its labels (y) differ") in line, line
        assert not out.exists() and no_temporaries(tmp_path)
    flip_label(train_copy, 5)                   # the same data again: resume is accepted
    r = run_hpcmtl(args + ["--resume"], n_ranks=2)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("written_before_versions", [False, True], ids=["group-removed", "old-checkpoint"])
def test_resume_refuses_a_checkpoint_without_fingerprints(train_copy, tmp_path, written_before_versions):
    """A checkpoint without /fingerprints (its group deleted, or an old file) resumed on changed data: the
    ambiguous case is refused, naming why (issue 40, item 22)."""
    out = tmp_path / "r.h5"
    args = ["train", "dmtrl", "--train", train_copy, "--out", out, "--checkpoint-every", "3"] + FAST
    assert run_hpcmtl(args, n_ranks=2).returncode == 0
    os.remove(out)
    ck = str(out) + ".checkpoint.h5"
    assert store.read_checkpoint(ck)["checkpoint_version"] == 2
    with h5py.File(ck, "a") as f:
        del f["fingerprints"]
        if written_before_versions:
            del f.attrs["checkpoint_version"]
    flip_label(train_copy, 5)
    r = run_hpcmtl(args + ["--resume"], n_ranks=2, timeout=60)
    line = one_error_line(r)
    assert r.returncode == 2, r.stderr
    why = ("it was written by an hpcmtl without content fingerprints" if written_before_versions
           else "its /fingerprints group is missing")
    assert f"cannot resume: {why}" in line and "start again without --resume" in line, line
    assert not out.exists()
    with h5py.File(ck, "a") as f:
        f.attrs["checkpoint_version"] = 7
    r = run_hpcmtl(args + ["--resume"], n_ranks=2, timeout=60)
    assert r.returncode == 2 and "attribute 'checkpoint_version' is 7" in one_error_line(r)


def test_resume_verifies_a_task_split_over_ranks(tmp_path):
    rng = np.random.default_rng(3)
    Xs = [rng.normal(size=(n, 4)) for n in (120, 10, 10)]
    ys = [np.where(X[:, 0] > 0, 1.0, -1.0) for X in Xs]
    train = tmp_path / "split.h5"
    store.write_tasks(train, Xs, ys)
    out = tmp_path / "r.h5"
    args = ["train", "dmtrl", "--train", train, "--out", out, "--split-tasks", "--checkpoint-every", "3"] + FAST
    assert run_hpcmtl(args, n_ranks=3).returncode == 0           # task 0 is cut between the two workers
    ck = store.read_checkpoint(str(out) + ".checkpoint.h5")
    assert len([b for b in ck["blocks"] if b["task"] == 0]) == 2
    with store.TaskFile(train) as tf:
        assert ck["fingerprints"] == dict(zip(tf.names, tf.fingerprints))   # the parts add up to the task
    os.remove(out)
    with h5py.File(train, "a") as f:                               # a feature in the second part
        f["tasks/000000/X"][100, 2] += 1.0
    r = run_hpcmtl(args + ["--resume"], n_ranks=3)
    assert r.returncode == 2 and "task 'task0' (#0)" in r.stderr and "its features (X) differ" in r.stderr


# --- evaluate matches tasks by name ----------------------------------------------------------------
@pytest.fixture(scope="module")
def model(data, tmp_path_factory):
    tr, _ = data
    out = tmp_path_factory.mktemp("model") / "stl.h5"
    r = run_hpcmtl(["train", "stl", "--train", tr, "--out", out, "--lam", "1e-2", "--max-rounds", "30", "--quiet"])
    assert r.returncode == 0, r.stderr
    return out


def rewrite(src, dst, order=None, rename=None):
    blocks, names, _ = store.read_all_tasks(src)
    order = list(range(len(blocks))) if order is None else order
    new_names = [(rename or {}).get(names[i], names[i]) for i in order]
    store.write_tasks(dst, [blocks[i].X for i in order], [blocks[i].y for i in order], names=new_names)


def test_evaluate_matches_test_tasks_to_model_tasks_by_name(data, model, tmp_path):
    _, te = data
    ordered = run_hpcmtl(["evaluate", model, te, "--json"])
    assert ordered.returncode == 0, ordered.stderr
    shuffled = tmp_path / "shuffled.h5"
    rewrite(te, shuffled, order=list(np.random.default_rng(0).permutation(16)))
    r = run_hpcmtl(["evaluate", model, shuffled, "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == json.loads(ordered.stdout)


@pytest.mark.parametrize("change,message", [
    ({"rename": {"task03": "task03b"}}, "missing the model's task(s) 'task03'; task(s) 'task03b' not in the model"),
    ({"order": list(range(15))}, "missing the model's task(s) 'task16'"),
])
def test_evaluate_refuses_a_test_file_with_another_task_set(data, model, tmp_path, change, message):
    _, te = data
    other = tmp_path / "other.h5"
    rewrite(te, other, **change)
    r = run_hpcmtl(["evaluate", model, other])
    line = one_error_line(r)
    assert r.returncode == 2 and f"{other}: its tasks differ from the model's ({model}): {message}" in line, line


# --- duplicate task names ---------------------------------------------------------------------------
def test_duplicate_task_names_are_an_input_error_when_written_and_when_read(tmp_path):
    Xs, ys = random_tasks(0, m=3)
    with pytest.raises(InputError, match=r"task name 'b' is used by tasks #1 and #2"):
        store.write_tasks(tmp_path / "w.h5", Xs, ys, names=["a", "b", "b"])
    assert not (tmp_path / "w.h5").exists()
    path = tmp_path / "d.h5"
    store.write_tasks(path, Xs, ys, names=["a", "b", "c"])
    with h5py.File(path, "a") as f:
        table = f["task_table"][()]
        table["name"][2] = "a"
        f["task_table"][...] = table
    with pytest.raises(InputError, match=r"d\.h5: 'task_table': task name 'a' is used by tasks #0 and #2"):
        store.TaskFile(path)
    r = run_hpcmtl(["data", "info", path])
    assert r.returncode == 2 and "task name 'a' is used by tasks #0 and #2" in one_error_line(r)
    with pytest.raises(InputError, match=r"label name 'x' is used by labels #0 and #1"):
        store.write_stream(tmp_path / "s.h5", sp.csr_matrix(np.ones((2, 2))), np.ones((2, 2)), label_names=["x", "x"])


# ===========================================================================
# Section 4: faults end cleanly
# ===========================================================================
def checkpoint_size(train, tmp_path):
    out = tmp_path / "probe" / "r.h5"
    out.parent.mkdir()
    r = run_hpcmtl(["train", "dmtrl", "--train", train, "--out", out, "--checkpoint-every", "1", "--lam", "1e-2",
                    "--max-rounds", "2", "--outer", "1", "--quiet", "--local-steps", "1"])     # still running
    assert r.returncode == 0, r.stderr
    return os.path.getsize(str(out) + ".checkpoint.h5")


@pytest.mark.parametrize("n_ranks", [1, 3])
def test_disk_full_while_writing_a_checkpoint(data, tmp_path, n_ranks):
    """Room for one checkpoint, not for two: the second write (temporary beside the first) fills the disk."""
    tr, _ = data
    size = checkpoint_size(tr, tmp_path)
    with small_disk(tmp_path / "disk", 1.5 * size) as disk:
        out, ck = tmp_path / "r.h5", disk / "ck.h5"
        r, after_report = run_hpcmtl_timed(["train", "dmtrl", "--train", tr, "--out", out, "--checkpoint", ck,
                                            "--checkpoint-every", "1", "--lam", "1e-2", "--outer", "2", "--quiet"],
                                           n_ranks=n_ranks, report="hpcmtl: error", timeout=120)
        line = one_error_line(r)
        assert r.returncode == 2, r.stderr
        assert line == f"hpcmtl: error: cannot write checkpoint {ck}: no space left on device"
        assert after_report < 10                 # every rank gone promptly (start-up and training not timed)
        assert store.read_checkpoint(ck)["counters"]["round"] == 1         # the previous one, intact
        assert os.listdir(disk) == ["ck.h5"] and not out.exists()


@pytest.mark.parametrize("n_ranks", [1, 2])
def test_disk_full_while_writing_the_result(data, tmp_path, n_ranks):
    tr, _ = data
    with small_disk(tmp_path / "disk", 16 * 1024) as disk:           # a result here is about 40 kB
        out = disk / "r.h5"
        r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", out, "--lam", "1e-2", "--max-rounds", "3",
                        "--outer", "2", "--quiet"], n_ranks=n_ranks, timeout=120)
        assert r.returncode == 2, r.stderr
        assert one_error_line(r) == f"hpcmtl: error: cannot write result {out}: no space left on device"
        assert os.listdir(disk) == []


def test_disk_full_in_data_and_report_commands(data, model, tmp_path):
    tr, _ = data
    with small_disk(tmp_path / "disk", 64 * 1024) as disk:
        out = disk / "x.h5"
        r = run_hpcmtl(["data", "synth", "dmtrl1", out, "--scale", "0.05"])
        assert r.returncode == 2
        assert one_error_line(r) == f"hpcmtl: error: cannot write data file {out}: no space left on device"
        r = run_hpcmtl(["data", "split", tr, disk / "a.h5", disk / "b.h5"])
        assert r.returncode == 2 and one_error_line(r).startswith(f"hpcmtl: error: cannot write data file {disk}/")
        assert os.listdir(disk) == []
        (disk / "filler").write_bytes(b"\0" * (60 * 1024))
        r = run_hpcmtl(["report", model, "--out", disk / "rep"])
        line = one_error_line(r)
        assert r.returncode == 2 and line.startswith(f"hpcmtl: error: cannot write report file {disk}/rep/"), line
        assert line.endswith(": no space left on device") and no_temporaries(disk / "rep")


def test_file_size_limit_while_writing_ends_with_one_line(tmp_path):
    """RLIMIT_FSIZE (SIGXFSZ ignored) makes writes fail with EFBIG through the same path as a full disk."""
    out = tmp_path / "x.h5"
    cmd = [sys.executable, "-m", "hpcmtl", "data", "synth", "dmtrl1", str(out), "--scale", "0.05"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, preexec_fn=fsize_limit(64 * 1024))
    assert r.returncode == 2, r.stderr
    assert one_error_line(r) == f"hpcmtl: error: cannot write data file {out}: file too large"
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("target,gap", [("group", 0.3), ("group", 0.6), ("mpiexec", 0.3)])
def test_a_second_sigterm_is_absorbed_and_the_job_exits_75(data, tmp_path, target, gap):
    tr, _ = data
    out = tmp_path / "r.h5"
    cmd = [mpiexec_path(), "-n", "3", sys.executable, "-m", "hpcmtl", "train", "dmtrl", "--train", str(tr),
           "--out", str(out), "--lam", "1e-2", "--tol", "1e-9", "--outer", "8", "--progress-seconds", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for _ in range(5000):
            line = proc.stdout.readline()
            if not line or fields(line).get("round", 0) >= 20:
                break
        assert fields(line).get("round", 0) >= 20, "the run ended before it could be signalled"
        send = (lambda: os.killpg(proc.pid, signal.SIGTERM)) if target == "group" else \
            (lambda: proc.send_signal(signal.SIGTERM))
        t = time.monotonic()
        send()
        time.sleep(gap)
        send()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 75, err
    assert time.monotonic() - t < 30
    ours = [line for line in err.splitlines() if line.startswith("hpcmtl:")]
    assert len(ours) == 1 and "received SIGTERM: checkpoint written to" in ours[0]
    assert store.read_checkpoint(str(out) + ".checkpoint.h5")["counters"]["round"] >= 20
    assert not out.exists() and no_temporaries(tmp_path)


def kill_a_writer(path):
    """A writer SIGKILLed in the middle of an atomic write: its temporary is left behind."""
    code = ("import numpy as np, sys\n"
            "from hpcmtl import store\n"
            "with store.atomic_h5(sys.argv[1]) as f:\n"
            "    f.create_dataset('x', data=np.ones(10**5)); f.flush()\n"
            "    print('writing', flush=True); sys.stdin.readline()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "writing"
    return proc


def test_orphaned_temporaries_are_removed_by_the_next_write(data, tmp_path):
    tr, _ = data
    out = tmp_path / "r.h5"
    proc = kill_a_writer(out)
    proc.kill()
    proc.wait(timeout=30)
    orphans = [n for n in os.listdir(tmp_path) if n.startswith(".r.h5.") and n.endswith(".tmp")]
    assert len(orphans) == 1
    r = run_hpcmtl(["train", "stl", "--train", tr, "--out", out] + FAST)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["r.h5"]


def test_a_live_writers_temporary_is_kept(tmp_path):
    out = tmp_path / "r.h5"
    proc = kill_a_writer(out)                    # alive, holding the lock on its temporary
    try:
        # its temporary and the output's lock file (.r.h5.lock, held while it writes)
        (live,) = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
        assert sorted(os.listdir(tmp_path)) == sorted([live, ".r.h5.lock"])
        assert store.remove_stale_temporaries(out) == [] and sorted(os.listdir(tmp_path)) == sorted([live, ".r.h5.lock"])
    finally:
        proc.communicate("go\n", timeout=30)     # it finishes and renames its file into place
    assert proc.returncode == 0 and os.listdir(tmp_path) == ["r.h5"]


@pytest.mark.parametrize("force", [False, True])
def test_out_an_existing_directory_is_refused_before_any_work(data, tmp_path, force):
    tr, _ = data
    (tmp_path / "d").mkdir()
    args = ["train", "dmtrl", "--train", tr, "--out", tmp_path / "d", "--lam", "1e-2"] + (["--force"] if force else [])
    r = run_hpcmtl(args, n_ranks=2)
    assert r.returncode == 2 and "round" not in r.stdout
    assert one_error_line(r) == f"hpcmtl: error: {tmp_path / 'd'}: is a directory, expected the name of an output file"
    r = run_hpcmtl(["data", "synth", "dmtrl1", tmp_path / "d", "--force"])
    assert r.returncode == 2 and "is a directory" in one_error_line(r)
    (tmp_path / "file").write_text("x")
    r = run_hpcmtl(["report", tr, "--out", tmp_path / "file"])
    assert r.returncode == 2 and "report --out must be a directory" in one_error_line(r)


def test_an_unwritable_location_is_refused_before_any_work(data, tmp_path):
    tr, _ = data
    r = run_hpcmtl(["train", "stl", "--train", tr, "--out", "/proc/r.h5", "--lam", "1e-2"], n_ranks=2)
    assert r.returncode == 2 and "round" not in r.stdout
    assert "/proc/r.h5: cannot write output: cannot create a file in /proc" in one_error_line(r)
    with small_disk(tmp_path / "ro", 64 * 1024, read_only=True) as ro:
        r = run_hpcmtl(["train", "stl", "--train", tr, "--out", ro / "r.h5", "--lam", "1e-2"], n_ranks=2)
        assert r.returncode == 2 and "round" not in r.stdout
        assert f"{ro / 'r.h5'}: cannot write output: directory {ro} is not writable" in one_error_line(r)
