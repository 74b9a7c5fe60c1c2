"""hpcmtl data synth / split / info and the synthetic generators' ground truth."""
import json
import os

import numpy as np
import pytest

from hpcmtl import store, synthetic

from conftest import run_hpcmtl


def test_synth_dmtrl1_shapes_and_truth(tmp_path):
    tr, te = tmp_path / "tr.h5", tmp_path / "te.h5"
    r = run_hpcmtl(["data", "synth", "dmtrl1", tr, "--test", te, "--seed", "3"])
    assert r.returncode == 0, r.stderr
    with store.TaskFile(tr) as a, store.TaskFile(te) as b:
        assert a.n_tasks == b.n_tasks == 16 and a.n_features == 100
        total = a.n_samples.sum() + b.n_samples.sum()
        assert 0.85 * 43280 < total < 1.15 * 43280
        assert 0.65 < a.n_samples.sum() / total < 0.75          # about 1,894 / 2,705
        truth = a.read_truth()
        W = truth["W"]
        for i in range(16):                                       # children copy +-parent
            if i not in (0, 5, 10):
                p = int(truth["parent"][i])
                assert abs(np.corrcoef(W[:, i], W[:, p])[0, 1]) > 0.8
        assert np.allclose(truth["correlation"], np.corrcoef(W.T))


def test_dmtrl2_has_more_correlated_tasks():
    _, _, t1 = synthetic.dmtrl(1, seed=0, scale=0.05)
    _, _, t2 = synthetic.dmtrl(2, seed=0, scale=0.05)
    off = ~np.eye(16, dtype=bool)
    assert np.abs(t2["correlation"][off]).mean() > np.abs(t1["correlation"][off]).mean() + 0.1


def test_joint_sparse_truth():
    train, test, truth = synthetic.joint_sparse(seed=1, n_train=10, n_test=20)
    W, relevant = truth["W"], truth["relevant"]
    assert W.shape == (200, 60) and relevant.sum() == 20
    assert np.all(W[~relevant] == 0)
    assert np.isclose(truth["l1inf_norm"], np.abs(W).max(axis=1).sum())
    assert np.allclose(np.linalg.norm(train[0][0], axis=1), 1.0)
    assert np.all(train[1][0] == np.sign(train[0][0] @ W[:, 0]))


def test_seasonal_positive_rates_vary():
    (Xs, ys, names), truth = synthetic.seasonal(seed=0)
    rates = np.array([np.mean(y == 1) for y in ys])
    assert names[0] == "jan" and len(Xs) == 12
    assert rates.min() < 0.06 and rates.max() > 0.4


def test_multilabel_stream_file(tmp_path):
    out = tmp_path / "s.h5"
    assert run_hpcmtl(["data", "synth", "multilabel-stream", out, "--scale", "0.05"]).returncode == 0
    with store.StreamFile(out) as sf:
        assert (sf.n_rounds, sf.n_labels) == (1000, 20)
        sizes = [X.shape[0] for _, X, _ in sf.chunks(300)]
        assert sizes == [300, 300, 300, 100]


@pytest.mark.parametrize("name,tasks,sparse", [("mnist-scale", 10, False), ("mds-scale", 22, True)])
def test_scaled_problems(tmp_path, name, tasks, sparse):
    out = tmp_path / "x.h5"
    assert run_hpcmtl(["data", "synth", name, out, "--scale", "0.01"]).returncode == 0
    info = json.loads(run_hpcmtl(["data", "info", out, "--json"]).stdout)
    assert info["n_tasks"] == tasks and info["storage"] == ("csr" if sparse else "dense")
    if sparse:
        assert 0.005 < info["density"] < 0.013


@pytest.mark.slow
def test_split_is_per_task_and_stratified(tmp_path):
    full = tmp_path / "full.h5"
    rng = np.random.default_rng(0)
    ys = [np.r_[np.ones(10), -np.ones(30)], np.r_[np.ones(20), -np.ones(20)]]
    store.write_tasks(full, [rng.normal(size=(40, 3)), rng.normal(size=(40, 3))], ys)
    tr, te = tmp_path / "tr.h5", tmp_path / "te.h5"
    r = run_hpcmtl(["data", "split", full, tr, te, "--test-fraction", "0.25", "--seed", "1"])
    assert r.returncode == 0, r.stderr
    with store.TaskFile(tr) as a, store.TaskFile(te) as b:
        assert list(a.n_samples) == [30, 30] and list(b.n_samples) == [10, 10]
        assert np.sum(b.read_task(0).y == 1) in (2, 3)          # 10 positives x 0.25
        assert np.sum(b.read_task(1).y == 1) == 5
        # rows are partitioned: together they are the original rows
        rows = np.vstack([a.read_task(0).X, b.read_task(0).X])
        with store.TaskFile(full) as f:
            orig = f.read_task(0).X
        assert sorted(map(tuple, rows)) == sorted(map(tuple, orig))


@pytest.mark.smoke
def test_info_json_fields(tmp_path):
    out = tmp_path / "t.h5"
    store.write_tasks(out, [np.ones((3, 2)), np.zeros((2, 2))], [np.ones(3), -np.ones(2)], names=["p", "q"])
    info = json.loads(run_hpcmtl(["data", "info", out, "--json"]).stdout)
    assert info["n_tasks"] == 2 and info["n_features"] == 2 and info["storage"] == "dense"
    assert info["tasks"] == [
        {"name": "p", "n_samples": 3, "nnz": 6, "label_counts": {"1": 3}, "positive_fraction": 1.0},
        {"name": "q", "n_samples": 2, "nnz": 0, "label_counts": {"-1": 2}, "positive_fraction": 0.0},
    ]


def test_data_errors_exit_2_with_one_line(tmp_path):
    r = run_hpcmtl(["data", "info", tmp_path / "missing.h5"])
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "missing.h5: no such file" in r.stderr
    r = run_hpcmtl(["data", "synth", "dmtrl3", tmp_path / "x.h5"])
    assert r.returncode == 2
    assert "invalid choice: 'dmtrl3'" in r.stderr and "Did you mean 'dmtrl" in r.stderr


# -- task files with a damaged header: one line, exit 2 (the HDF5 layout itself is store.py's) ------
def damaged_task_file(path, change):
    import h5py
    store.write_tasks(path, [np.ones((3, 2)), np.zeros((2, 2))], [np.ones(3), -np.ones(2)], names=["p", "q"])
    with h5py.File(path, "a") as f:
        change(f)


def drop_table_column(column):
    def change(f):
        table = f["task_table"][()]
        keep = [name for name in table.dtype.names if name != column]
        new = np.zeros(len(table), dtype=[(name, table.dtype[name]) for name in keep])
        for name in keep:
            new[name] = table[name]
        del f["task_table"]
        f["task_table"] = new
    return change


def set_attr(key, value):
    def change(f):
        f.attrs[key] = value
    return change


TASK_FILE_FAULTS = [
    ("format_version one", set_attr("format_version", "one"), "attribute 'format_version' is 'one', this hpcmtl reads version 1"),
    ("format_version 1.5", set_attr("format_version", 1.5), "attribute 'format_version' is 1.5, this hpcmtl reads version 1"),
    ("format_version array", set_attr("format_version", np.array([1, 1])), "attribute 'format_version' is"),
    ("format_version missing", lambda f: f.attrs.__delitem__("format_version"), "attribute 'format_version' is missing"),
    ("task table without name", drop_table_column("name"), "'task_table'"),
]


@pytest.mark.parametrize("name,change,message", TASK_FILE_FAULTS, ids=[c[0] for c in TASK_FILE_FAULTS])
@pytest.mark.parametrize("command", ["info", "split"])
def test_damaged_task_file_header_is_one_line_exit_2(tmp_path, capsys, command, name, change, message):
    from hpcmtl.cli import main
    bad = tmp_path / "bad.h5"
    damaged_task_file(bad, change)
    args = {"info": ["data", "info", str(bad)],
            "split": ["data", "split", str(bad), str(tmp_path / "tr.h5"), str(tmp_path / "te.h5")]}[command]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"bad.h5: {message}" in err, err
    assert sorted(os.listdir(tmp_path)) == ["bad.h5"]
