"""Every input stays in its box: no HDF5 file makes hpcmtl read or overwrite another file, no input blocks.

An HDF5 file hpcmtl reads (task files, results, checkpoints, streams, ``data
inspect`` of any HDF5 file) may not hold an external link, a soft link out of
its group, a dataset with external raw storage or a virtual dataset; every
input (and every file a format reads inside an input directory) must be a
regular file, checked before it is opened, so a FIFO never blocks a rank.
Each case: exit 2, one line naming the file and the object, nothing written,
the input unchanged, every process gone within a timeout.
"""
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

from hpcmtl import store
from hpcmtl.errors import InputError

from conftest import file_digest, one_error_line, run_hpcmtl

FAST = ["--lam", "1e-2", "--max-rounds", "3", "--outer", "1", "--quiet", "--local-steps", "1"]
TIMEOUT = 60            # a blocked command would run into it; every case here ends in seconds


def refused(args, needles, n_ranks=None):
    """Run hpcmtl (in a subprocess with a timeout: a FIFO never blocks the test); exit 2 and one line."""
    try:
        r = run_hpcmtl(args, n_ranks=n_ranks, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hpcmtl {' '.join(map(str, args))} blocked for {TIMEOUT} s")
    assert r.returncode == 2, r.stderr
    line = one_error_line(r)
    for needle in needles:
        assert str(needle) in line, line
    return line


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("boxes")
    tr, te = d / "tr.h5", d / "te.h5"
    r = run_hpcmtl(["data", "synth", "dmtrl1", tr, "--test", te, "--scale", "0.02", "--seed", "1"])
    assert r.returncode == 0, r.stderr
    res = d / "r.h5"
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", res] + FAST)
    assert r.returncode == 0, r.stderr
    stream = d / "s.h5"
    r = run_hpcmtl(["data", "convert", "--format", "tasks", tr, stream, "--stream"])
    assert r.returncode == 0, r.stderr
    secret = d / "secret.bin"
    secret.write_bytes(np.arange(1000, dtype=np.float64).tobytes())
    return {"train": tr, "test": te, "result": res, "stream": stream, "secret": secret}


def copy_with(src, dst, change):
    shutil.copy(src, dst)
    with h5py.File(dst, "a") as f:
        change(f)
    return dst


def first_task(f):
    return "tasks/" + sorted(f["tasks"])[0]


def external_storage(target):
    """Replace the first task's y by a dataset whose raw data is ``target`` (the adversary's secret.bin)."""
    def change(f):
        g = f[first_task(f)]
        n = g["y"].shape[0]
        del g["y"]
        g.create_dataset("y", (n,), "f8", external=[(os.path.abspath(target), 0, 8 * n)])
    return change


def external_link(target_file, target_object):
    def change(f):
        name = first_task(f)
        del f[name]
        f[name] = h5py.ExternalLink(os.path.abspath(target_file), target_object)
    return change


def soft_link_out_of_group(f):
    names = sorted(f["tasks"])
    del f[f"tasks/{names[1]}/y"]
    f[f"tasks/{names[1]}/y"] = h5py.SoftLink(f"/tasks/{names[0]}/y")


def virtual_dataset(source):
    def change(f):
        g = f[first_task(f)]
        n = g["y"].shape[0]
        layout = h5py.VirtualLayout((n,), "f8")
        layout[:] = h5py.VirtualSource(os.path.abspath(source), first_task(f) + "/y", shape=(n,))
        del g["y"]
        g.create_virtual_dataset("y", layout)
    return change


# --- the check itself, in-process -------------------------------------------------------------------------

def test_a_plain_task_file_and_links_inside_a_group_are_accepted(files, tmp_path):
    def inside(f):
        g = f[first_task(f)]
        g["y_again"] = h5py.SoftLink("y")                  # relative, inside its group
        g["X_hard"] = g["X"] if "X" in g else g["data"]    # a second hard link: still this file
    path = copy_with(files["train"], tmp_path / "ok.h5", inside)
    with store.TaskFile(path) as tf:
        assert tf.info()["n_tasks"] > 1


@pytest.mark.parametrize("case", ["external storage", "external link", "soft link out", "virtual dataset",
                                  "dangling soft link", "soft link cycle"])
def test_open_read_refuses_a_file_reaching_outside_itself(files, tmp_path, case):
    def dangling(f):
        f[first_task(f) + "/z"] = h5py.SoftLink("missing")

    def cycle(f):
        f[first_task(f) + "/a"] = h5py.SoftLink("b")
        f[first_task(f) + "/b"] = h5py.SoftLink("a")
    change = {"external storage": external_storage(files["secret"]),
              "external link": external_link(files["test"], "/" + "tasks"),
              "soft link out": soft_link_out_of_group, "virtual dataset": virtual_dataset(files["test"]),
              "dangling soft link": dangling, "soft link cycle": cycle}[case]
    path = copy_with(files["train"], tmp_path / "bad.h5", change)
    with pytest.raises(InputError) as info:
        store.TaskFile(path)
    assert str(path) in str(info.value) and "/tasks/" in str(info.value)
    assert "\n" not in str(info.value)


def test_names_read_from_the_file_cannot_forge_a_second_line(files, tmp_path):
    def forged(f):
        f["x\nhpcmtl: error: forged"] = h5py.ExternalLink("/etc/passwd\n\x1b[2J", "/")
    path = copy_with(files["train"], tmp_path / "bad.h5", forged)
    line = refused(["data", "info", path], [path, "external link", "\\n"])
    assert "\x1b" not in line


# --- every command that reads an HDF5 file ----------------------------------------------------------------

def test_training_on_external_raw_storage_is_refused(files, tmp_path):
    path = copy_with(files["train"], tmp_path / "bad.h5", external_storage(files["secret"]))
    before, out = file_digest(path), tmp_path / "r.h5"
    refused(["train", "dmtrl", "--train", path, "--out", out] + FAST,
            [path, "external file", files["secret"]])
    assert not out.exists() and file_digest(path) == before
    assert [n for n in os.listdir(tmp_path) if n != "bad.h5"] == []


def test_convert_does_not_copy_external_raw_storage(files, tmp_path):
    path = copy_with(files["train"], tmp_path / "bad.h5", external_storage(files["secret"]))
    out = tmp_path / "copy.h5"
    refused(["data", "convert", "--format", "tasks", path, out], [path, "external file"])
    assert not out.exists()


def test_convert_force_never_overwrites_an_external_links_target(files, tmp_path):
    """The link's target is the output: refused before any work, the target unchanged."""
    target = tmp_path / "target.h5"
    shutil.copy(files["test"], target)
    path = copy_with(files["train"], tmp_path / "bad.h5", external_link(target, "/tasks"))
    before = file_digest(target)
    refused(["data", "convert", "--format", "tasks", path, target, "--force"], [path, "external link", target])
    assert file_digest(target) == before
    refused(["train", "dmtrl", "--train", path, "--out", tmp_path / "r.h5"] + FAST, [path, "external link"])
    assert not (tmp_path / "r.h5").exists()


@pytest.mark.parametrize("case", ["soft link out", "virtual dataset"])
def test_data_info_and_inspect_refuse_links_out_and_virtual_datasets(files, tmp_path, case):
    change = soft_link_out_of_group if case == "soft link out" else virtual_dataset(files["test"])
    path = copy_with(files["train"], tmp_path / "bad.h5", change)
    what = "soft link" if case == "soft link out" else "virtual dataset"
    refused(["data", "info", path], [path, what])
    refused(["data", "inspect", path], [path, what])


def test_inspect_of_any_hdf5_file_refuses_an_external_link(files, tmp_path):
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f["a"] = np.zeros(3)
        f["b"] = h5py.ExternalLink(os.path.abspath(files["train"]), "/task_table")
    refused(["data", "inspect", path], [path, "'/b'", "external link"])


def test_results_streams_and_checkpoints_are_checked(files, tmp_path):
    result = copy_with(files["result"], tmp_path / "r.h5",
                       lambda f: f.__setitem__("stolen", h5py.ExternalLink(os.path.abspath(files["train"]), "/")))
    refused(["evaluate", result, files["test"]], [result, "'/stolen'", "external link"])
    refused(["report", result, "--out", tmp_path / "rep"], [result, "external link"])
    assert not (tmp_path / "rep").exists()

    def stream_storage(f):
        n = f.attrs["n_rounds"]
        f.create_dataset("extra", (n,), "f8", external=[(os.path.abspath(files["secret"]), 0, 8 * n)])
    stream = copy_with(files["stream"], tmp_path / "s.h5", stream_storage)
    refused(["data", "info", stream], [stream, "'/extra'", "external file"])

    checkpoint = tmp_path / "c.h5"
    with h5py.File(checkpoint, "w") as f:
        f.attrs["format"] = store.CHECKPOINT_FORMAT
        f.attrs["format_version"] = store.FORMAT_VERSION
        f["state"] = h5py.ExternalLink(os.path.abspath(files["train"]), "/")
    before = file_digest(checkpoint)
    out = tmp_path / "out.h5"
    refused(["train", "dmtrl", "--train", files["train"], "--out", out, "--checkpoint", checkpoint, "--resume"]
            + FAST, [checkpoint, "external link"])
    assert file_digest(checkpoint) == before and not out.exists()


# --- FIFOs: never opened ----------------------------------------------------------------------------------

@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("command", ["train", "info", "inspect", "convert", "convert-svmlight", "evaluate"])
def test_a_fifo_given_as_an_input_is_refused_without_blocking(files, tmp_path, fifo, command):
    out = tmp_path / "out.h5"
    args = {"train": ["train", "dmtrl", "--train", fifo, "--out", out] + FAST,
            "info": ["data", "info", fifo], "inspect": ["data", "inspect", fifo],
            "convert": ["data", "convert", "--format", "tasks", fifo, out],
            "convert-svmlight": ["data", "convert", "--format", "svmlight", fifo, out],
            "evaluate": ["evaluate", files["result"], fifo]}[command]
    refused(args, [fifo, "FIFO"])
    assert not out.exists()


def test_external_raw_storage_on_a_fifo_is_refused_without_blocking(files, tmp_path, fifo):
    path = copy_with(files["train"], tmp_path / "bad.h5", external_storage(fifo))
    refused(["train", "dmtrl", "--train", path, "--out", tmp_path / "r.h5"] + FAST, [path, "external file"])
    refused(["data", "convert", "--format", "tasks", path, tmp_path / "c.h5"], [path, "external file"])


def test_a_fifo_inside_an_input_directory_is_refused(tmp_path):
    domain = tmp_path / "books"
    domain.mkdir()
    (domain / "positive.review").write_text("good:2 book:1 #label#:positive\n")
    os.mkfifo(domain / "negative.review")
    out = tmp_path / "out.h5"
    refused(["data", "convert", "--format", "mds", domain, out], [domain / "negative.review", "FIFO"])
    assert not out.exists()


# --- every rank exits ---------------------------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("case", ["external storage on a FIFO", "external link", "FIFO input", "checkpoint"])
def test_every_rank_exits_under_mpiexec(files, tmp_path, case):
    extra = []
    if case == "checkpoint":                  # read when resuming, not by the output checks
        checkpoint = tmp_path / "c.h5"
        with h5py.File(checkpoint, "w") as f:
            f.attrs["format"] = store.CHECKPOINT_FORMAT
            f.attrs["format_version"] = store.FORMAT_VERSION
            f["state"] = h5py.ExternalLink(os.path.abspath(files["train"]), "/")
        path, extra, needles = files["train"], ["--checkpoint", checkpoint, "--resume"], [checkpoint, "external link"]
    elif case == "FIFO input":
        path = tmp_path / "pipe"
        os.mkfifo(path)
        needles = [path, "FIFO"]
    elif case == "external link":
        path = copy_with(files["train"], tmp_path / "bad.h5", external_link(files["test"], "/tasks"))
        needles = [path, "external link"]
    else:
        os.mkfifo(tmp_path / "pipe")
        path = copy_with(files["train"], tmp_path / "bad.h5", external_storage(tmp_path / "pipe"))
        needles = [path, "external file"]
    out = tmp_path / "r.h5"
    refused(["train", "dmtrl", "--train", path, "--out", out] + extra + FAST, needles, n_ranks=2)
    assert not out.exists()
