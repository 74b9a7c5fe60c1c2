"""The bad-input matrix: crafted files give exit code 2 and exactly one line, never a traceback or a huge allocation.

Each case builds one malformed input from good files (a task set, a result, a checkpoint, a stream
made once per module) and runs one command on it; the command must exit 2 with one stderr line
starting ``hpcmtl: error:`` and write nothing under its output name.  One case runs under
``mpiexec -n 2``: every rank exits, within the timeout.
"""
import gzip
import json
import os
import pickle
import shutil
import struct

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from hpcmtl import store
from hpcmtl.errors import InputError
from hpcmtl.memory import check_fits, dense_bytes, node_memory

from conftest import run_hpcmtl

TRAIN = ["--lam", "0.1", "--outer", "2", "--quiet"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """Good files: tasks.h5, r.h5 (a dmtrl result on it), ck.h5 (a checkpoint of a killed run), s.h5 (a stream)."""
    d = tmp_path_factory.mktemp("good")
    rng = np.random.default_rng(0)
    Xs = [rng.normal(size=(30, 5)) for _ in range(3)]
    ys = [np.where(X @ np.ones(5) + 0.3 * rng.normal(size=30) > 0, 1.0, -1.0) for X in Xs]
    store.write_tasks(d / "tasks.h5", Xs, ys, names=["a", "b", "c"])
    r = run_hpcmtl(["train", "dmtrl", "--train", d / "tasks.h5", "--out", d / "r.h5"] + TRAIN)
    assert r.returncode == 0, r.stderr
    killed = run_hpcmtl(["train", "dmtrl", "--train", d / "tasks.h5", "--out", d / "k.h5", "--checkpoint",
                         d / "ck.h5", "--checkpoint-every", "2"] + TRAIN, env={"HPCMTL_FAULT": "0:5:kill"})
    assert killed.returncode != 0 and os.path.exists(d / "ck.h5"), killed.stderr
    X = sp.csr_matrix(rng.normal(size=(20, 4)))
    store.write_stream(d / "s.h5", X, np.where(rng.normal(size=(20, 2)) > 0, 1.0, -1.0), label_names=["p", "q"])
    return d


def copy_and_edit(base, tmp_path, name, edit):
    """``base/name`` copied to ``tmp_path`` and changed by ``edit(h5py.File)``; the copy's path."""
    path = tmp_path / name
    shutil.copy(base / name, path)
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


def replace(f, name, data):
    del f[name]
    f[name] = data


def result_case(edit):
    def build(base, tmp_path):
        return ["evaluate", copy_and_edit(base, tmp_path, "r.h5", edit), base / "tasks.h5"], None
    return build


def report_case(edit):
    def build(base, tmp_path):
        return ["report", copy_and_edit(base, tmp_path, "r.h5", edit), "--out", tmp_path / "rep"], tmp_path / "rep"
    return build


def stream_case(edit):
    def build(base, tmp_path):
        return ["data", "info", copy_and_edit(base, tmp_path, "s.h5", edit)], None
    return build


def checkpoint_case(edit):
    def build(base, tmp_path):
        ck = copy_and_edit(base, tmp_path, "ck.h5", edit)
        out = tmp_path / "k.h5"
        return ["train", "dmtrl", "--train", base / "tasks.h5", "--out", out, "--checkpoint", ck,
                "--checkpoint-every", "2", "--resume"] + TRAIN, out
    return build


def first_block(f):
    return f["blocks"][sorted(f["blocks"])[0]]


def sigma_case(write):
    def build(base, tmp_path):
        path = tmp_path / "sigma.npy"
        write(path)
        out = tmp_path / "f.h5"
        return ["train", "fixed", "--train", base / "tasks.h5", "--out", out, "--sigma", path] + TRAIN, out
    return build


def svmlight_case(text, *options):
    def build(base, tmp_path):
        (tmp_path / "in.svm").write_text(text)
        out = tmp_path / "c.h5"
        return ["data", "convert", "--format", "svmlight", *options, tmp_path / "in.svm", out], out
    return build


def idx_case(base, tmp_path):
    images = tmp_path / "images.idx"
    # 4 x 2^16 dimensions: 2^64 values, 0 in int64 arithmetic (the size of the empty payload)
    images.write_bytes(struct.pack(">HBB", 0, 8, 4) + struct.pack(">IIII", *[2 ** 16] * 4))
    labels = tmp_path / "labels.idx.gz"
    with gzip.open(labels, "wb") as f:
        f.write(struct.pack(">HBB", 0, 8, 1) + struct.pack(">I", 2) + bytes(2))
    out = tmp_path / "m.h5"
    return ["data", "convert", "--format", "mnist", images, labels, out], out


def wide_tasks_case(n_ranks):
    """A task file of 8 one-row tasks over 2^31 - 2 features: sparse on disk, far beyond memory as dense arrays."""
    def build(base, tmp_path):
        d = 2 ** 31 - 2
        Xs = [sp.csr_matrix(([1.0, 1.0], ([0, 1], [7 * i, d - 1 - i])), shape=(2, d)) for i in range(8)]
        store.write_tasks(tmp_path / "wide.h5", Xs, [np.array([1.0, -1.0])] * 8)
        out = tmp_path / "w.h5"
        return ["train", "dmtrl", "--train", tmp_path / "wide.h5", "--out", out, "--lam", "0.1", "--quiet"], out
    return build


def sparse_tasks_claiming_2_to_the_40_features(base, tmp_path):
    Xs = [sp.csr_matrix(np.eye(2, 5)), sp.csr_matrix(np.eye(2, 5)[::-1])]
    store.write_tasks(tmp_path / "t40.h5", Xs, [np.array([1.0, -1.0])] * 2)
    with h5py.File(tmp_path / "t40.h5", "r+") as f:
        f.attrs["n_features"] = 2 ** 40
    out = tmp_path / "w.h5"
    return ["train", "dmtrl", "--train", tmp_path / "t40.h5", "--out", out, "--lam", "0.1", "--quiet"], out


def tasks_case(edit, storage="dense"):
    """``train dmtrl`` on a copy of a good task file (``storage``: dense, or csr for the CSR fields) changed by
    ``edit``."""
    def build(base, tmp_path):
        path = tmp_path / "t.h5"
        if storage == "dense":
            shutil.copy(base / "tasks.h5", path)
        else:
            with store.TaskFile(base / "tasks.h5") as tf:
                blocks = [tf.read_task(i) for i in range(tf.n_tasks)]
            store.write_tasks(path, [sp.csr_matrix(b.X) for b in blocks], [b.y for b in blocks], names=["a", "b", "c"])
        with h5py.File(path, "r+") as f:
            edit(f)
        out = tmp_path / "w.h5"
        return ["train", "dmtrl", "--train", path, "--out", out] + TRAIN, out
    return build


def tasks_info_case(edit):
    def build(base, tmp_path):
        return ["data", "info", copy_and_edit(base, tmp_path, "tasks.h5", edit)], None
    return build


def alpha_case(value):
    """A resume from a checkpoint whose first block's first alpha is ``value`` times its label (the box of the
    hinge dual is y alpha in [0, 1]: a value outside [0, 1] leaves it)."""
    def build(base, tmp_path):
        with h5py.File(base / "ck.h5", "r") as f:
            task, start = int(first_block(f).attrs["task"]), int(first_block(f).attrs["start"])
        with store.TaskFile(base / "tasks.h5") as tf:
            y0 = tf.read_labels(task)[start]

        def edit(f):
            alpha = first_block(f)["alpha"][()]
            alpha[0] = value * y0
            replace(f, first_block(f).name + "/alpha", alpha)
        return checkpoint_case(edit)(base, tmp_path)
    return build


def online_case(edit):
    def build(base, tmp_path):
        out = tmp_path / "o.h5"
        return ["train", "online", "--stream", copy_and_edit(base, tmp_path, "s.h5", edit), "--out", out,
                "--quiet"], out
    return build


def rff_huge(f):
    cfg = json.loads(f.attrs["config"])
    cfg.update(rff_dim=1_000_000_000, rff_gamma=1.0)
    f.attrs["config"] = json.dumps(cfg)


CASES = {
    # result files (evaluate / report)
    "result-config-bad-json": result_case(lambda f: f.attrs.__setitem__("config", "{not json")),
    "result-config-missing": result_case(lambda f: f.attrs.__delitem__("config")),
    "result-config-a-list": result_case(lambda f: f.attrs.__setitem__("config", "[1, 2]")),
    "result-history-missing": result_case(lambda f: f.__delitem__("history")),
    "result-W-1d": result_case(lambda f: replace(f, "model/W", np.zeros(5))),
    "result-W-nan": result_case(lambda f: replace(f, "model/W", np.full((5, 3), np.nan))),
    "result-W-strings": result_case(lambda f: replace(f, "model/W", np.array([["x"] * 3] * 5, dtype="S1"))),
    "result-W-a-group": result_case(lambda f: (f.__delitem__("model/W"), f.create_group("model/W"))),
    "result-intercept-short": result_case(lambda f: replace(f, "model/intercept", np.zeros(2))),
    "result-n-ranks-x": result_case(lambda f: f.attrs.__setitem__("n_ranks", "x")),
    "result-rff-dim-huge": result_case(rff_huge),
    "result-rff-dim-text": result_case(lambda f: f.attrs.__setitem__(
        "config", json.dumps(dict(json.loads(f.attrs["config"]), rff_dim="many")))),
    "report-history-missing": report_case(lambda f: f.__delitem__("history")),
    "report-config-bad-json": report_case(lambda f: f.attrs.__setitem__("config", "{")),
    # streams (data info)
    "stream-no-label-names": stream_case(lambda f: f.__delitem__("label_names")),
    "stream-no-n-rounds": stream_case(lambda f: f.attrs.__delitem__("n_rounds")),
    "stream-n-rounds-text": stream_case(lambda f: f.attrs.__setitem__("n_rounds", "twenty")),
    "stream-Y-a-group": stream_case(lambda f: (f.__delitem__("Y"), f.create_group("Y"))),
    "stream-Y-strings": stream_case(lambda f: replace(f, "Y", np.full((20, 2), b"1", dtype="S1"))),
    "stream-Y-complex": stream_case(lambda f: replace(f, "Y", np.ones((20, 2)) + 1j)),
    "stream-X-complex": stream_case(lambda f: replace(f, "X/data", f["X/data"][()] + 1j)),
    "stream-indices-float": stream_case(lambda f: replace(f, "X/indices", f["X/indices"][()] + 0.5)),
    "stream-n-features-2-to-the-40": online_case(lambda f: f.attrs.__setitem__("n_features", 2 ** 40)),
    # converters
    "svmlight-index-beyond-int64": svmlight_case("1 qid:1 1:1\n-1 qid:2 99999999999999999999:1\n"),
    "svmlight-index-beyond-int32": svmlight_case("1 qid:1 1:1\n-1 qid:2 3000000000:1\n"),
    "svmlight-stream-index-beyond-int32": svmlight_case("1 1:1\n-1 3000000000:1\n", "--stream"),
    "idx-header-overflow": idx_case,
    # --sigma files
    "sigma-pickled": sigma_case(lambda p: p.write_bytes(pickle.dumps(np.eye(3)))),
    "sigma-object-array": sigma_case(lambda p: np.save(p, np.array([{}, None], dtype=object), allow_pickle=True)),
    "sigma-garbage": sigma_case(lambda p: p.write_bytes(b"\x93NUMPY garbage")),
    # checkpoints (train --resume)
    "checkpoint-config-bad-json": checkpoint_case(lambda f: f.attrs.__setitem__("config", "{")),
    "checkpoint-counters-bad-json": checkpoint_case(lambda f: f.attrs.__setitem__("counters", "]")),
    "checkpoint-alpha-nan": checkpoint_case(lambda f: replace(
        f, first_block(f).name + "/alpha", np.full(first_block(f)["alpha"].shape, np.nan))),
    "checkpoint-alpha-short": checkpoint_case(lambda f: replace(
        f, first_block(f).name + "/alpha", first_block(f)["alpha"][1:])),
    "checkpoint-order-outside": checkpoint_case(lambda f: replace(
        f, first_block(f).name + "/order", first_block(f)["order"][()] + 1000)),
    "checkpoint-sigma-nan": checkpoint_case(lambda f: replace(
        f, "state/Sigma", np.full(f["state/Sigma"].shape, np.nan))),
    "checkpoint-alpha-above-the-box": alpha_case(1.5),
    "checkpoint-alpha-below-the-box": alpha_case(-0.25),
    "checkpoint-block-missing": checkpoint_case(lambda f: f.__delitem__(first_block(f).name)),
    # task files: stored types (train, and data info where it reads the field)
    "tasks-y-strings": tasks_case(lambda f: replace(f, "tasks/000001/y", f["tasks/000001/y"][()].astype("S4"))),
    "tasks-y-complex": tasks_case(lambda f: replace(f, "tasks/000001/y", f["tasks/000001/y"][()] + 0.5j)),
    "tasks-y-a-group": tasks_case(lambda f: (f.__delitem__("tasks/000001/y"), f.create_group("tasks/000001/y"))),
    "tasks-indices-float": tasks_case(lambda f: replace(
        f, "tasks/000001/indices", f["tasks/000001/indices"][()].astype(np.float64) + 0.5), storage="csr"),
    "tasks-indptr-float": tasks_case(lambda f: replace(
        f, "tasks/000001/indptr", f["tasks/000001/indptr"][()].astype(np.float64)), storage="csr"),
    "tasks-n-features-6.7": tasks_case(lambda f: f.attrs.__setitem__("n_features", 6.7)),
    "info-y-strings": tasks_info_case(lambda f: replace(f, "tasks/000001/y", f["tasks/000001/y"][()].astype("S4"))),
    "info-y-complex": tasks_info_case(lambda f: replace(f, "tasks/000001/y", f["tasks/000001/y"][()] + 0.5j)),
    # sizes: refused before the allocation (serial, and every rank under mpiexec)
    "tasks-too-wide-for-memory": wide_tasks_case(None),
    "tasks-n-features-2-to-the-40": sparse_tasks_claiming_2_to_the_40_features,
}
MPI_CASES = {"tasks-too-wide-for-memory-mpi2": wide_tasks_case(2)}
# what the line must say: the file's field and, for a task, the task (a case not listed: one line is enough)
MESSAGES = {
    "checkpoint-alpha-above-the-box": "ck.h5: cannot resume: task 'a' (#0): field 'alpha': row 0 has alpha = ",
    "checkpoint-alpha-below-the-box": "outside the hinge dual's box (y alpha must be in [0, 1]",
    "checkpoint-block-missing": "ck.h5: cannot resume: the blocks of task 'a' (#0) do not cover its 30 rows exactly",
    "tasks-y-strings": "t.h5: task 'b' (#1): field 'y': stored as |S4, expected real numbers",
    "tasks-y-complex": "t.h5: task 'b' (#1): field 'y': stored as complex128, expected real numbers",
    "tasks-y-a-group": "t.h5: task 'b' (#1): field 'y' must be a dataset, found a Group",
    "tasks-indices-float": "t.h5: task 'b' (#1): field 'indices': stored as float64, expected integers",
    "tasks-indptr-float": "t.h5: task 'b' (#1): field 'indptr': stored as float64, expected integers",
    "tasks-n-features-6.7": "t.h5: attribute 'n_features' is 6.7, expected an integer >= 1",
    "info-y-strings": "tasks.h5: task 'b' (#1): field 'y': stored as |S4, expected real numbers",
    "info-y-complex": "tasks.h5: task 'b' (#1): field 'y': stored as complex128, expected real numbers",
}


def check_one_line(r, out):
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("hpcmtl: error:"), r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    if out is not None:
        assert not os.path.exists(out) or (os.path.isdir(out) and not os.listdir(out)), os.listdir(out)
    return lines[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_file_gives_one_line_and_exit_2(base, tmp_path, case):
    args, out = CASES[case](base, tmp_path)
    line = check_one_line(run_hpcmtl(args, timeout=120), out)
    assert MESSAGES.get(case, "") in line


@pytest.mark.mpi
@pytest.mark.parametrize("case", sorted(MPI_CASES))
def test_bad_file_under_mpiexec_ends_every_rank(base, tmp_path, case):
    args, out = MPI_CASES[case](base, tmp_path)
    line = check_one_line(run_hpcmtl(args, n_ranks=2, timeout=120), out)
    assert "GiB" in line


def test_memory_estimate_is_pure_arithmetic_that_never_overflows():
    assert dense_bytes(10, 3) == 2 * 10 * 3 * 8
    assert dense_bytes(10, 3, copies=1, rows=4, dense_rows=True) == 10 * 3 * 8 + 4 * 10 * 8
    assert dense_bytes(10, 3, rff_dim=100, rows=4, copies=1) == 100 * 3 * 8 + 2 * 10 * 100 * 8 + 4 * 100 * 8
    assert dense_bytes(2 ** 40, 2 ** 20) == 2 * 2 ** 60 * 8          # Python integers: no int64 wrap-around
    assert 0 < node_memory()
    check_fits(10, "x", available=10)
    with pytest.raises(InputError, match=r"^x needs about 1\.0 GiB of memory, this node has 0\.5 GiB$"):
        check_fits(2 ** 30, "x", available=2 ** 29)


def test_fit_with_a_csr_of_2_to_the_32_columns_is_one_input_error():
    from hpcmtl.estimators import DMTRL
    X = sp.csr_matrix((np.ones(4), (np.arange(4), [0, 1, 2 ** 32 - 2, 2 ** 32 - 1])), shape=(4, 2 ** 32))
    with pytest.raises(InputError, match=r"4294967296 features, at most 2147483647"):
        DMTRL(lam=0.1).fit(X, np.array([1.0, -1.0, 1.0, -1.0]), tasks=np.array([0, 0, 1, 1]))
