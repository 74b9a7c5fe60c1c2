"""`data inspect` on the raw layouts of issue 38: each small generated file has the structure of a public data set
that needed a hand-written script; inspect's first command, run as printed, must give the expected tasks (checked
against NumPy slices of the generated arrays)."""
import json
import shlex

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from hpcmtl import store

from conftest import run_hpcmtl


def inspect_then_convert(tmp_path, name, n_commands=1):
    """inspect's JSON answer and the tasks its first command writes (run in tmp_path as printed)."""
    r = run_hpcmtl(["data", "inspect", name, "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert len(info["commands"]) >= n_commands, info
    argv = shlex.split(info["commands"][0])
    assert argv[:3] == ["hpcmtl", "data", "convert"], argv
    r = run_hpcmtl(argv[1:], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return info, argv, r.stdout


def tasks_of(path):
    blocks, names, _ = store.read_all_tasks(path)
    return [b.X.toarray() if sp.issparse(b.X) else b.X for b in blocks], [b.y for b in blocks], names


def test_malsar_cells_under_other_names(tmp_path):
    rng = np.random.default_rng(0)
    X = np.empty((1, 3), dtype=object)
    Y = np.empty((1, 3), dtype=object)
    for i, n in enumerate((10, 7, 12)):
        X[0, i] = rng.normal(size=(n, 4))
        Y[0, i] = np.where(rng.uniform(size=(n, 1)) < 0.5, 1.0, -1.0)
    scipy.io.savemat(tmp_path / "cells.mat", {"feature": X, "label": Y, "note": np.ones((1, 1))})
    info, argv, _ = inspect_then_convert(tmp_path, "cells.mat")
    assert "--x feature --y label" in info["commands"][0] and "3 tasks" in info["layout"]
    Xs, ys, names = tasks_of(tmp_path / "OUT.h5")
    assert names == ["task001", "task002", "task003"]
    for i in range(3):
        np.testing.assert_array_equal(Xs[i], X[0, i])
        np.testing.assert_array_equal(ys[i], Y[0, i].ravel())


def test_shared_design_and_response_matrix(tmp_path):
    """Conjoint analysis: k profiles x p attributes (column 0 the constant), m respondents x k ratings."""
    rng = np.random.default_rng(1)
    k, p, m = 12, 5, 30
    D = np.column_stack([np.ones(k), rng.integers(0, 2, size=(k, p - 1))]).astype(float)
    R = rng.integers(1, 8, size=(m, k)).astype(float)
    R[3, 5] = np.nan                                           # a skipped profile
    scipy.io.savemat(tmp_path / "conjoint.mat", {"design": D, "ratings": R})
    info, argv, printed = inspect_then_convert(tmp_path, "conjoint.mat")
    assert info["constant_columns"] == [0] and "constant" in info["layout"]
    assert "column 1 of 'design' constant" in printed               # convert reports it too
    Xs, ys, names = tasks_of(tmp_path / "OUT.h5")
    assert len(Xs) == m and names[0] == "ratings01" and names[-1] == f"ratings{m}"
    for i in range(m):
        known = np.isfinite(R[i])
        np.testing.assert_array_equal(Xs[i], D[known][:, 1:])
        np.testing.assert_array_equal(ys[i], R[i][known])
    assert len(ys[3]) == k - 1


def test_train_and_test_in_one_mat_with_one_hot_classes(tmp_path):
    rng = np.random.default_rng(2)
    classes = ["earn", "acq", "crude"]

    def split(n, seed):
        W = sp.random(n, 30, density=0.2, format="csc", random_state=seed)
        c = rng.integers(0, 3, size=n)
        C = np.zeros((n, 3))
        C[np.arange(n), c] = 1
        return W, C, c
    trW, trC, trc = split(40, 1)
    teW, teC, tec = split(20, 2)
    names = np.empty((1, 3), dtype=object)
    names[0, :] = classes
    scipy.io.savemat(tmp_path / "traintest.mat", {"trainW": trW, "trainC": trC, "testW": teW, "testC": teC,
                                                  "class_names": names})
    info, argv, _ = inspect_then_convert(tmp_path, "traintest.mat", n_commands=2)
    assert "--test-out" in argv
    for out, W, c in (("OUT.h5", trW, trc), ("OUT-test.h5", teW, tec)):
        Xs, ys, got = tasks_of(tmp_path / out)
        assert got == classes
        for j in range(3):
            np.testing.assert_array_equal(Xs[j], W.toarray())
            np.testing.assert_array_equal(ys[j], np.where(c == j, 1.0, -1.0))
    # the stream command: one label column a class, named
    argv = shlex.split(info["commands"][1])
    r = run_hpcmtl(argv[1:], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    with store.StreamFile(tmp_path / "OUT-stream.h5") as f:
        assert f.label_names == classes and f.n_rounds == 40
        Y = f.read_labels(0, 40)
    assert np.all((Y == 1).sum(axis=1) == 1)
    assert sorted((Y == 1).sum(axis=0).tolist()) == sorted(np.bincount(trc, minlength=3).tolist())


def test_csv_with_a_subject_id_task_column(tmp_path):
    rng = np.random.default_rng(3)
    lines, rows = ["subject#,age,x1,x2,passed,score"], []
    for s in range(1, 9):
        for _ in range(rng.integers(4, 9)):
            x = rng.normal(size=2)
            rows.append((s, int(rng.integers(20, 60)), round(x[0], 3), round(x[1], 3), int(x[0] + x[1] > 0)))
            lines.append(",".join(map(str, rows[-1])) + f",{x.sum():.3f}")
    (tmp_path / "subjects.csv").write_text("\n".join(lines) + "\n")
    info, argv, _ = inspect_then_convert(tmp_path, "subjects.csv")
    assert info["task_column"] == "subject#"
    assert info["label_candidates"][0] == "passed" and "score" in info["label_candidates"]
    assert argv[argv.index("--label-column") + 1] == "passed"
    Xs, ys, names = tasks_of(tmp_path / "OUT.h5")
    assert names == [str(s) for s in range(1, 9)]
    table = np.array([r + (float(l.split(",")[-1]),) for r, l in zip(rows, lines[1:])])
    for s in range(1, 9):
        mine = table[table[:, 0] == s]
        np.testing.assert_allclose(Xs[s - 1], mine[:, [1, 2, 3, 5]])
        np.testing.assert_array_equal(ys[s - 1], np.where(mine[:, 4] == 1, 1.0, -1.0))


def test_named_variables_errors_are_one_line(tmp_path):
    from conftest import one_error_line
    scipy.io.savemat(tmp_path / "a.mat", {"feature": np.ones((4, 2)), "label": np.ones((3, 1))})
    for extra, message in ((["--x", "feature"], "--y is missing"),
                           (["--x", "feature", "--y", "nope"], "field 'nope' is missing (variables: feature, label)"),
                           (["--x", "feature", "--y", "label"], "field 'label' is 3 x 1"),
                           (["--x", "feature", "--y", "label", "--test-out", "t.h5"], "hold no 'train'")):
        r = run_hpcmtl(["data", "convert", "--format", "malsar", "a.mat", "o.h5"] + extra, cwd=tmp_path)
        assert r.returncode == 2 and message in one_error_line(r), (extra, r.stderr)


def test_a_csv_sorted_by_its_binary_label_is_not_read_as_tasks(tmp_path):
    rows = ["x1,x2,outcome"] + [f"{k},{k % 3},{0 if k < 6 else 1}" for k in range(12)]
    (tmp_path / "sorted.csv").write_text("\n".join(rows) + "\n")
    r = run_hpcmtl(["data", "inspect", "sorted.csv", "--json"], cwd=tmp_path)
    info = json.loads(r.stdout)
    assert info["layout"].startswith("no task column") and "'outcome' (guessed: two values)" in info["layout"]
