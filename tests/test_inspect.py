"""hpcmtl data inspect: variables / columns, a guess of the layout, and a command that reads the file."""
import json
import shlex

import h5py
import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from hpcmtl import formats, store
from hpcmtl.cli import main


def inspect(capsys, path, *extra):
    code = main(["data", "inspect", str(path)] + list(extra))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def suggested(capsys, path):
    """inspect_file's answer, each suggested convert command run (it must read the file)."""
    info = formats.inspect_file(str(path))
    for k, command in enumerate(info["commands"]):
        if not command.startswith("hpcmtl data convert") or "LABELS.npz" in command:
            continue
        command = command.replace("[MORE.mat ...] ", "").replace("[MORE.npz ...] ", "")
        command = command.replace("OUT.h5", str(path.parent / f"{path.stem}-out{k}.h5"))
        command = command.replace("OUT-stream.h5", str(path.parent / f"{path.stem}-stream{k}.h5"))
        code = main(shlex.split(command)[1:])
        err = capsys.readouterr().err
        assert code == 0, (command, err)
    return info


def cells(*items):
    c = np.empty((1, len(items)), dtype=object)
    for i, v in enumerate(items):
        c[0, i] = v
    return c


def test_mat_malsar_cells(tmp_path, capsys):
    X = cells(np.ones((3, 2)), sp.csc_matrix(np.eye(2)))
    scipy.io.savemat(tmp_path / "school.mat", {"X": X, "Y": cells(np.ones((3, 1)), -np.ones((2, 1)))})
    code, out, err = inspect(capsys, tmp_path / "school.mat")
    assert code == 0, err
    assert "  X     1 x 2" in out and "cell" in out
    assert "layout: MALSAR cell arrays: 2 tasks (cell X{i}, dense or sparse, and its labels Y{i})" in out
    info = suggested(capsys, tmp_path / "school.mat")
    assert info["commands"][0] == f"hpcmtl data convert --format malsar {tmp_path / 'school.mat'} OUT.h5"


def test_mat_fea_gnd_suggests_a_label_mapping(tmp_path, capsys):
    scipy.io.savemat(tmp_path / "books.mat", {"fea": sp.csc_matrix(np.eye(4)), "gnd": np.array([[1], [2], [2], [1]])})
    info = suggested(capsys, tmp_path / "books.mat")
    assert info["variables"] == [{"name": "fea", "shape": [4, 4], "dtype": "sparse"},
                                 {"name": "gnd", "shape": [4, 1], "dtype": "int64"}]
    assert info["layout"].startswith("a sparse 4 x 4 matrix 'fea' and labels 'gnd' (2 distinct: 1, 2): one task")
    assert info["commands"][0].endswith("OUT.h5 --labels 1:-1,2:1")
    with store.TaskFile(tmp_path / "books-out0.h5") as tf:
        assert tf.names == ["books"]
    scipy.io.savemat(tmp_path / "digits.mat", {"fea": np.eye(5), "gnd": np.arange(5).reshape(-1, 1)})
    assert suggested(capsys, tmp_path / "digits.mat")["commands"][0].endswith("--positive-label 4")


def test_mat_matrix_and_labels_is_a_stream_and_other_layouts_are_named(tmp_path, capsys):
    scipy.io.savemat(tmp_path / "m.mat", {"X": np.eye(3), "Y": np.array([[1, -1], [-1, 1], [1, 1]])})
    info = suggested(capsys, tmp_path / "m.mat")
    assert "(2 label columns: multi-label)" in info["layout"] and "--stream" in info["commands"][0]
    scipy.io.savemat(tmp_path / "other.mat", {"A": np.eye(2)})
    code, out, _ = inspect(capsys, tmp_path / "other.mat")
    assert code == 0 and "layout: no layout hpcmtl reads" in out


def test_mat_v73_is_named(tmp_path, capsys):
    path = tmp_path / "v73.mat"
    with h5py.File(path, "w", userblock_size=512) as f:
        f.create_dataset("X", data=np.eye(2))
    with open(path, "r+b") as f:
        f.write(b"MATLAB 7.3 MAT-file, Platform: GLNXA64")
    code, out, _ = inspect(capsys, path)
    assert code == 0 and "MATLAB v7.3 .mat (HDF5)" in out and "save(..., '-v7')" in out


@pytest.mark.smoke
def test_csv_reads_the_header_and_a_few_rows_only(tmp_path, capsys):
    lines = ["task,age,city,other_target,y"] + [f"t{k % 2},{k},paris,0.{k},{'yes' if k % 3 else 'no'}"
                                                 for k in range(5)]
    lines += ["t1,\xff\xfe not utf-8 and not a number,x,y,z"] * 3          # never read
    path = tmp_path / "d.csv"
    path.write_bytes(("\n".join(lines[:6]) + "\n").encode() + "\n".join(lines[6:]).encode("latin-1") + b"\n")
    code, out, err = inspect(capsys, path)
    assert code == 0, err
    assert out.splitlines()[:6] == [
        f"{path}: CSV, 5 columns (the header and the first 5 rows shown, 5 read to judge the columns)",
        "  task          column 0     text      t0, t1, t0",
        "  age           column 1     number    0, 1, 2",
        "  city          column 2     text      paris, paris, paris",
        "  other_target  column 3     number    0.0, 0.1, 0.2",
        "  y             column 4     text      no, yes, yes"]
    assert ("layout: task column 'task', label column 'y', 2 feature columns; text columns city cannot be features "
            "(--drop)") in out
    assert f"hpcmtl data convert --format csv {path} OUT.h5 --drop city --positive-label yes" in out


def test_csv_without_task_column_guesses_the_label_and_suggests_a_stream(tmp_path, capsys):
    path = tmp_path / "iris.csv"
    path.write_text("sl,sw,species\n5.1,3.5,setosa\n7.0,3.2,versicolor\n6.3,3.3,virginica\n")
    info = suggested(capsys, path)
    assert info["layout"].startswith("no task column, so a single-label file: label column 'species' (guessed: "
                                     "the last column), 2 feature columns")
    assert info["commands"] == [f"hpcmtl data convert --format csv {path} OUT-stream.h5 --stream --shuffle "
                                "--label-column species"]


def test_npz_layouts_from_headers_only(tmp_path, capsys):
    np.savez(tmp_path / "pairs.npz", X_0=np.eye(3), y_0=np.ones(3), X_1=np.ones((2, 3)), y_1=-np.ones(2),
             notes=np.array([{"a": 1}], dtype=object))          # an object array np.load would refuse to read
    code, out, err = inspect(capsys, tmp_path / "pairs.npz")
    assert code == 0, err
    assert "  notes  1            object" in out and "  X_1    2 x 3        float64" in out
    assert "layout: 2 tasks as arrays X_i, y_i" in out
    np.savez(tmp_path / "stacked.npz", X=np.eye(4), y=[1, -1, 1, -1], tasks=[0, 0, 1, 1])
    assert suggested(capsys, tmp_path / "stacked.npz")["layout"].startswith("stacked X, y and task ids")
    np.savez(tmp_path / "xy.npz", X=np.eye(4), y=[1, 2, 3, 1])
    assert suggested(capsys, tmp_path / "xy.npz")["layout"].startswith("one matrix X and its labels y")
    sp.save_npz(tmp_path / "books.npz", sp.random(5, 7, density=0.4, random_state=0, format="csr"))
    info = formats.inspect_file(str(tmp_path / "books.npz"))
    assert info["layout"].startswith("a sparse csr 5 x 7 matrix from scipy.sparse.save_npz (14 stored values)")
    np.savez(tmp_path / "labels.npz", books=[1, -1, 1, -1, 1])
    info = formats.inspect_file(str(tmp_path / "labels.npz"))
    assert info["layout"] == ("label arrays books: the labels file of matrices written by scipy.sparse.save_npz as "
                              "books.npz")
    assert info["commands"] == [f"hpcmtl data convert --format npz books.npz {tmp_path / 'labels.npz'} OUT.h5"]
    np.savez(tmp_path / "other.npz", A=np.ones((2, 2, 2)))
    assert formats.inspect_file(str(tmp_path / "other.npz"))["layout"].startswith("no layout hpcmtl reads")


def test_svmlight_layouts_from_the_first_lines(tmp_path, capsys):
    (tmp_path / "q.svm").write_text("1 qid:1 1:1\n-1 qid:1 2:1\n1 qid:2 1:1\n-1 qid:2 3:1\n")
    info = suggested(capsys, tmp_path / "q.svm")
    assert info["layout"] == "task ids 'qid:' (2 seen): one task a qid"
    (tmp_path / "ml.svm").write_text("1,3 1:0.5\n2 0:1\n")
    info = suggested(capsys, tmp_path / "ml.svm")
    assert info["layout"].startswith("multi-label lines") and info["variables"][1]["first"] == ["indices 0..1 (0-based)"]
    lines = [f"{k % 4} 1:{k}" for k in range(1000)] + ["bad line"]                      # line 1001 is never read
    (tmp_path / "big.svm").write_text("\n".join(lines) + "\n")
    code, out, err = inspect(capsys, tmp_path / "big.svm")
    assert code == 0 and "svmlight text (the first 1000 data lines read)" in out and "0, 1, 2, 3" in out, err
    assert "single-label lines, no task ids" in out


def test_hdf5_files(tmp_path, capsys):
    store.write_tasks(tmp_path / "t.h5", [np.eye(2), np.ones((3, 2))], [np.ones(2), -np.ones(3)], names=["a", "b"])
    code, out, _ = inspect(capsys, tmp_path / "t.h5")
    assert code == 0 and "hpcmtl task dataset (dense)" in out and "  b     3 x 2" in out
    assert "layout: 2 tasks, 2 features: ready for hpcmtl train" in out
    suggested(capsys, tmp_path / "t.h5")
    store.write_stream(tmp_path / "s.h5", np.eye(3), np.array([[1.0], [-1], [0]]), label_names=["l"])
    code, out, _ = inspect(capsys, tmp_path / "s.h5")
    assert code == 0 and "  l     3            label     +1 1, -1 1, dormant 1" in out
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f.create_dataset("grp/data", data=np.zeros((4, 5), dtype=np.float32))
    code, out, _ = inspect(capsys, tmp_path / "foreign.h5")
    assert code == 0 and "  grp/data  4 x 5        float32" in out and "not an hpcmtl file" in out


def test_json_and_long_lists(tmp_path, capsys):
    header = ",".join(["task"] + [f"p{k}" for k in range(100)] + ["y"])
    (tmp_path / "wide.csv").write_text(header + "\n" + ",".join(["t"] + ["0"] * 100 + ["1"]) + "\n")
    code, out, _ = inspect(capsys, tmp_path / "wide.csv", "--json")
    info = json.loads(out)
    assert code == 0 and len(info["variables"]) == 102 and info["kind"] == "csv"
    code, out, _ = inspect(capsys, tmp_path / "wide.csv")
    assert "  ... 79 more" in out and len(out.splitlines()) < 30


@pytest.mark.parametrize("name,write,message", [
    ("missing.csv", None, "missing.csv: no such file or directory"),
    ("dir.csv", lambda p: p.mkdir(), "dir.csv: is a directory, expected a file"),
    ("latin.csv", lambda p: p.write_bytes("caf\xe9,y\n1,2\n".encode("latin-1")), "latin.csv: line 1: byte 0xe9 is not UTF-8"),
    ("empty.csv", lambda p: p.write_text(""), "empty.csv: empty CSV file"),
    ("empty.svm", lambda p: p.write_text("# only a comment\n"), "empty.svm: no data lines"),
    ("broken.mat", lambda p: p.write_bytes(b"MATLAB 5.0 MAT-file" + b"\0" * 10), "broken.mat: not a readable MATLAB file"),
])
def test_errors_are_one_line_exit_2(tmp_path, capsys, name, write, message):
    if write:
        write(tmp_path / name)
    code, out, err = inspect(capsys, tmp_path / name)
    assert code == 2 and err.count("\n") == 1 and message in err, err
