"""Never replace what is not ours: checkpoints of other runs, converter inputs, another live job's outputs.

Real ``hpcmtl`` processes where the case is between jobs: a writer held open
at a known point (it waits on its stdin) while a second job starts, so no
case depends on timing.
"""
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from hpcmtl import store
from hpcmtl.cli import main

from conftest import run_hpcmtl

TRAIN = ["--lam", "1e-2", "--tol", "1e-300", "--max-rounds", "3", "--outer", "1", "--local-steps", "1"]

# a process that runs ``hpcmtl ARGV`` and, as its first output is about to be written, says "holding" and
# waits for a line on stdin: a live writer, paused exactly where a second job would meet it
HELD_WRITER = """
import sys
from hpcmtl import store
from hpcmtl.store import tasks
real = tasks.write_tasks
def held(*args, **kwargs):
    print("holding", flush=True)
    sys.stdin.readline()
    return real(*args, **kwargs)
store.write_tasks = held
from hpcmtl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def one_line(err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def tasks_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("writers") / "tr.h5"
    assert main(["data", "synth", "dmtrl1", str(path), "--scale", "0.02", "--seed", "3"]) == 0
    return path


def held_writer(args):
    proc = subprocess.Popen([sys.executable, "-c", HELD_WRITER] + [str(a) for a in args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding", proc.stderr.read()
    return proc


def release(proc):
    out, err = proc.communicate("go\n", timeout=120)
    return proc.returncode, out, err


# -- item 10: one live writer an output ------------------------------------------------------------------------

def test_second_live_writer_of_an_output_is_refused(tmp_path):
    out = tmp_path / "d.h5"
    first = held_writer(["data", "synth", "dmtrl1", out, "--scale", "0.01", "--seed", "1", "--force"])
    try:
        r = run_hpcmtl(["data", "synth", "dmtrl1", out, "--scale", "0.01", "--seed", "2", "--force"])
    finally:
        code, _, err = release(first)
    assert r.returncode == 2, r.stderr
    assert "another hpcmtl job is writing this output" in one_line(r.stderr)
    assert code == 0, err                                        # the first job is untouched and finishes
    with store.TaskFile(out) as f:
        mine = f.read_task(0).X
    ref = tmp_path / "ref.h5"
    assert main(["data", "synth", "dmtrl1", str(ref), "--scale", "0.01", "--seed", "1"]) == 0
    with store.TaskFile(ref) as f:
        assert np.array_equal(mine, f.read_task(0).X)          # the file under the name is the first job's
    assert sorted(os.listdir(tmp_path)) == ["d.h5", "ref.h5"]   # locks and temporaries gone


def test_a_train_is_refused_while_another_job_writes_its_checkpoint(tmp_path, tasks_file, capsys):
    out, ck = tmp_path / "r.h5", tmp_path / "ck.h5"
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from hpcmtl import store\n"
                               "with store.output_locks([sys.argv[1]]):\n"
                               "    print('holding', flush=True); sys.stdin.readline()", str(ck)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        code = main(["train", "dmtrl", "--train", str(tasks_file), "--out", str(out), "--checkpoint", str(ck),
                     *TRAIN])
    finally:
        holder.communicate("go\n", timeout=60)
    assert code == 2
    assert "another hpcmtl job is writing this output" in one_line(capsys.readouterr().err)
    assert not out.exists()


def test_a_killed_jobs_lock_never_blocks_a_later_job(tmp_path):
    out = tmp_path / "d.h5"
    first = held_writer(["data", "synth", "dmtrl1", out, "--scale", "0.01", "--force"])
    first.kill()
    first.wait(timeout=30)
    assert store.lock_path(out) in [str(p) for p in tmp_path.iterdir()]      # left behind, held by nobody
    r = run_hpcmtl(["data", "synth", "dmtrl1", out, "--scale", "0.01", "--force"])
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["d.h5"]


def test_the_temporary_stays_locked_until_it_is_renamed(tmp_path, monkeypatch):
    """Another job's stale-temporary cleanup, at the moment between closing and renaming, finds it locked."""
    from hpcmtl.store import atomic
    path = tmp_path / "t.h5"
    real_replace = os.replace

    def replace_after_cleanup(src, dst):
        assert atomic.remove_stale_temporaries(dst) == []
        return real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace_after_cleanup)
    with store.atomic_h5(path) as f:
        f.create_dataset("x", data=np.arange(3))
    with h5py.File(path, "r") as f:
        assert list(f["x"][()]) == [0, 1, 2]


# -- item 2: --checkpoint never replaces another run's file ------------------------------------------------------

def test_checkpoint_path_holding_an_unrelated_file_is_refused_without_force(tmp_path, tasks_file, capsys):
    out, ck = tmp_path / "r.h5", tmp_path / "notes.txt"
    ck.write_text("my notes\n")
    code = main(["train", "dmtrl", "--train", str(tasks_file), "--out", str(out), "--checkpoint", str(ck),
                 "--checkpoint-every", "1", *TRAIN])
    line = one_line(capsys.readouterr().err)
    assert code == 2 and "is not a checkpoint of this command" in line and "--force" in line, line
    assert ck.read_text() == "my notes\n" and not out.exists()          # refused before any work
    code = main(["train", "dmtrl", "--train", str(tasks_file), "--out", str(out), "--checkpoint", str(ck),
                 "--checkpoint-every", "1", "--force", *TRAIN])
    assert code == 0 and "hpcmtl: note: replacing" in capsys.readouterr().err
    assert store.file_format(ck) == store.CHECKPOINT_FORMAT


def test_checkpoint_of_another_configuration_is_refused_without_force(tmp_path, tasks_file, capsys):
    out, ck = tmp_path / "r.h5", tmp_path / "ck.h5"
    assert main(["train", "dmtrl", "--train", str(tasks_file), "--out", str(out), "--checkpoint", str(ck),
                 "--checkpoint-every", "1", *TRAIN]) == 0
    before = ck.read_bytes()
    capsys.readouterr()
    code = main(["train", "dmtrl", "--train", str(tasks_file), "--out", str(tmp_path / "r2.h5"),
                 "--checkpoint", str(ck), "--checkpoint-every", "1", "--lam", "1e-3", *TRAIN[2:]])
    line = one_line(capsys.readouterr().err)
    assert code == 2 and "'lam' is 0.01 in the checkpoint but 0.001 now" in line, line
    assert ck.read_bytes() == before


def test_new_run_over_its_own_earlier_checkpoint_says_so(tmp_path, tasks_file, capsys):
    out, ck = tmp_path / "r.h5", tmp_path / "ck.h5"
    args = ["train", "dmtrl", "--train", str(tasks_file), "--out", str(out), "--checkpoint", str(ck),
            "--checkpoint-every", "1", "--force", *TRAIN]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 0                                       # no --force needed for the checkpoint itself
    err = capsys.readouterr().err
    assert f"hpcmtl: note: replacing the checkpoint of an earlier run: {ck} (use --resume to continue it)" in err
    assert main(args + ["--resume"]) == 0
    assert "note:" not in capsys.readouterr().err               # resuming replaces nothing of another run


# -- item 3: no converter output replaces a file the converter reads ----------------------------------------------

def test_convert_refuses_an_output_that_is_a_file_it_reads_deep_in_a_directory(tmp_path, capsys):
    books = tmp_path / "mds" / "books"
    books.mkdir(parents=True)
    (books / "positive.review").write_text("great:2 fun:1 #label#:positive\nnice:1 #label#:positive\n")
    negative = books / "negative.review"
    negative.write_text("awful:3 #label#:negative\nbad:1 #label#:negative\n")
    before = negative.read_bytes()
    code = main(["data", "convert", "--format", "mds", str(tmp_path / "mds"), str(negative), "--force"])
    line = one_line(capsys.readouterr().err)
    assert code == 2 and "refusing to overwrite an input" in line, line
    assert negative.read_bytes() == before
    assert sorted(os.listdir(books)) == ["negative.review", "positive.review"]


@pytest.mark.parametrize("fmt,layout,victim", [
    ("mnist", ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
               "t10k-labels-idx1-ubyte.gz"], "t10k-labels-idx1-ubyte.gz"),
    ("reuters", ["reut2-000.sgm", "reut2-001.sgm"], "reut2-001.sgm"),
    ("svmlight", ["sub/a.svm"], "sub/a.svm"),
])
def test_every_format_lists_the_files_it_reads(tmp_path, fmt, layout, victim):
    from hpcmtl import formats
    for name in layout:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    spec = formats.get_format(fmt)
    listed = spec.input_files([str(tmp_path)], spec.defaults())
    assert str(tmp_path / victim) in listed
