"""Outputs never replace what is not a regular file of ours (issue 40, item 1).

An output path that exists and is not a regular file (a FIFO, a socket, a
device, a symbolic link to one, a dangling link) is refused with one line and
exit 2, with or without --force, and is left as it was.  A symbolic link to a
regular file is written through: the link stays a link and the file it names
is replaced (atomically) -- unless that file is an input.  The tests never
point an output at a real device: a link to /dev/null stands for one, so a
broken check would replace the link in tmp_path, never /dev/null.
"""
import os
import socket
import stat

import h5py
import pytest

from hpcmtl import store
from hpcmtl.errors import InputError

from conftest import one_error_line, run_hpcmtl

SYNTH = ["data", "synth", "dmtrl1", "--scale", "0.01"]


def make_fifo(path):
    os.mkfifo(path)
    return path


def make_socket(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    return s


@pytest.mark.parametrize("kind", ["fifo", "socket", "link-to-device", "dangling-link", "link-to-fifo"])
@pytest.mark.parametrize("force", [False, True])
def test_synth_refuses_an_output_that_is_not_a_regular_file(tmp_path, kind, force):
    out = tmp_path / "out.h5"
    keep = None
    if kind == "fifo":
        make_fifo(out)
    elif kind == "socket":
        keep = make_socket(out)
    elif kind == "link-to-device":
        os.symlink("/dev/null", out)
    elif kind == "dangling-link":
        os.symlink(tmp_path / "missing.h5", out)
    else:
        os.symlink(make_fifo(tmp_path / "pipe"), out)
    before = os.lstat(out)
    r = run_hpcmtl(SYNTH + [out] + (["--force"] if force else []), timeout=60)
    try:
        assert r.returncode == 2, r.stderr
        line = one_error_line(r)
        assert line.startswith("hpcmtl: error:") and str(out) in line, line
        if force or kind == "dangling-link":
            assert "not a regular file" in line or "missing" in line, line
        after = os.lstat(out)
        assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
        if kind.startswith("link") or kind == "dangling-link":
            assert os.path.islink(out)
        assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []
    finally:
        if keep is not None:
            keep.close()


def test_a_link_to_a_regular_file_is_written_through(tmp_path):
    target = tmp_path / "real.h5"
    target.write_bytes(b"old contents")
    link = tmp_path / "link.h5"
    os.symlink(target, link)
    r = run_hpcmtl(SYNTH + [link], timeout=60)
    assert r.returncode == 2 and "exists" in one_error_line(r)       # no --force: refused, untouched
    assert target.read_bytes() == b"old contents"
    r = run_hpcmtl(SYNTH + [link, "--force"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert os.path.islink(link) and os.readlink(link) == str(target)  # the link itself is kept
    assert stat.S_ISREG(os.lstat(target).st_mode)
    with h5py.File(target, "r") as f:
        assert f.attrs["format"] == "hpcmtl-tasks"
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []


def test_a_link_to_an_input_is_refused_even_with_force(tmp_path):
    data = tmp_path / "train.h5"
    assert run_hpcmtl(SYNTH + [data], timeout=60).returncode == 0
    link = tmp_path / "out.h5"
    os.symlink(data, link)
    before = data.read_bytes()
    r = run_hpcmtl(["data", "split", data, link, tmp_path / "te.h5", "--force"], timeout=60)
    assert r.returncode == 2, r.stderr
    assert "refusing to overwrite an input" in one_error_line(r)
    assert data.read_bytes() == before and os.path.islink(link)


@pytest.mark.mpi
def test_train_under_mpiexec_refuses_a_fifo_output_and_every_rank_exits(tmp_path):
    data = tmp_path / "train.h5"
    assert run_hpcmtl(SYNTH + [data], timeout=60).returncode == 0
    out = make_fifo(tmp_path / "result.h5")
    r = run_hpcmtl(["train", "stl", "--train", data, "--out", out, "--lam", "1e-2", "--force", "--quiet"],
                   n_ranks=3, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "not a regular file" in one_error_line(r)
    assert stat.S_ISFIFO(os.lstat(out).st_mode)


@pytest.mark.parametrize("writer", ["atomic_h5", "atomic_output"])
def test_the_store_writers_refuse_special_files(tmp_path, writer):
    out = make_fifo(tmp_path / "x.h5")
    with pytest.raises(InputError, match="not a regular file"):
        with getattr(store, writer)(out) as handle:
            pytest.fail(f"{writer} opened {handle} over a FIFO")
    assert stat.S_ISFIFO(os.lstat(out).st_mode)
    link = tmp_path / "l.h5"
    os.symlink("/dev/null", link)
    with pytest.raises(InputError, match="not a regular file"):
        with getattr(store, writer)(link):
            pass
    assert os.readlink(link) == "/dev/null"


def test_atomic_output_writes_through_a_link(tmp_path):
    target = tmp_path / "figure.csv"
    target.write_text("old\n")
    link = tmp_path / "link.csv"
    os.symlink(target, link)
    with store.atomic_output(link) as tmp:
        with open(tmp, "w") as f:
            f.write("new\n")
    assert os.path.islink(link) and target.read_text() == "new\n"


def test_a_name_too_long_for_its_temporary_is_refused_before_any_work(tmp_path):
    """Names of 242-255 bytes are legal but their temporary's (.NAME.XXXXXXXX.tmp) is not: refuse them first."""
    longest = tmp_path / ("a" * (255 - store.TEMPORARY_EXTRA - 3) + ".h5")
    r = run_hpcmtl(SYNTH + [longest], timeout=60)
    assert r.returncode == 0, r.stderr
    too_long = tmp_path / ("b" * (255 - store.TEMPORARY_EXTRA - 2) + ".h5")
    r = run_hpcmtl(SYNTH + [too_long], timeout=60)
    assert r.returncode == 2 and "the name is too long" in one_error_line(r), r.stderr
    assert not too_long.exists()
