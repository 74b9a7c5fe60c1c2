"""HDF5 task store: round trips, validation messages, atomic writes."""
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_array_equal

from hpcmtl import store
from hpcmtl.errors import InputError


def small(sparse=False):
    rng = np.random.default_rng(0)
    Xs = [rng.normal(size=(n, 5)) * (rng.uniform(size=(n, 5)) < 0.5) for n in (4, 7, 3)]
    if sparse:
        Xs = [sp.csr_matrix(X) for X in Xs]
    ys = [rng.choice([-1.0, 1.0], size=X.shape[0]) for X in Xs]
    return Xs, ys


@pytest.mark.smoke
@pytest.mark.parametrize("sparse", [False, True])
def test_round_trip(tmp_path, sparse):
    Xs, ys = small(sparse)
    path = tmp_path / "t.h5"
    store.write_tasks(path, Xs, ys, names=["a", "b", "c"], truth={"W": np.ones((5, 3))})
    with store.TaskFile(path) as tf:
        assert (tf.n_tasks, tf.n_features, tf.storage) == (3, 5, "csr" if sparse else "dense")
        assert tf.names == ["a", "b", "c"]
        assert_array_equal(tf.n_samples, [4, 7, 3])
        for i in range(3):
            blk = tf.read_task(i)
            dense = Xs[i].toarray() if sparse else Xs[i]
            got = blk.X.toarray() if sparse else blk.X
            assert_array_equal(got, dense)
            assert_array_equal(blk.y, ys[i])
            assert tf.nnz[i] == np.count_nonzero(dense)
        # a row range of one task (what a split block reads)
        part = tf.read_block(1, 2, 5, part=1)
        assert_array_equal(part.X.toarray() if sparse else part.X, (Xs[1].toarray() if sparse else Xs[1])[2:5])
        assert part.n_task == 7 and part.row_start == 2
        assert_array_equal(tf.read_truth()["W"], np.ones((5, 3)))


def test_metadata_is_read_without_task_data(tmp_path):
    Xs, ys = small()
    path = tmp_path / "t.h5"
    store.write_tasks(path, Xs, ys)
    with h5py.File(path, "a") as f:        # destroy every task group: the table must still be readable
        del f["tasks"]
    with store.TaskFile(path) as tf:
        assert tf.n_tasks == 3 and list(tf.n_samples) == [4, 7, 3]
        with pytest.raises(InputError, match=r"task 'task1' \(#1\): group '/tasks/000001' is missing"):
            tf.read_task(1)


@pytest.mark.parametrize("field,value,message", [
    ("X", np.nan, r"t\.h5: task 'task1' \(#1\): field 'X': contains NaN or Inf"),
    ("X", np.inf, r"task 'task1' \(#1\): field 'X': contains NaN or Inf"),
    ("y", np.nan, r"task 'task1' \(#1\): field 'y': contains NaN or Inf"),
])
@pytest.mark.smoke
def test_non_finite_values_are_refused_on_write(tmp_path, field, value, message):
    Xs, ys = small()
    (Xs if field == "X" else ys)[1][0] = value if field == "y" else np.full(5, value)
    with pytest.raises(InputError, match=message):
        store.write_tasks(tmp_path / "t.h5", Xs, ys)
    assert not os.path.exists(tmp_path / "t.h5")


def test_non_finite_values_in_an_existing_file_are_found_on_read(tmp_path):
    Xs, ys = small()
    path = tmp_path / "t.h5"
    store.write_tasks(path, Xs, ys)
    with h5py.File(path, "a") as f:
        f["tasks/000002/X"][1, 1] = np.inf
    with store.TaskFile(path) as tf:
        tf.read_task(0)
        with pytest.raises(InputError, match=r"task 'task2' \(#2\): field 'X': contains NaN or Inf"):
            tf.read_task(2)


def test_empty_task_and_inconsistent_features(tmp_path):
    Xs, ys = small()
    with pytest.raises(InputError, match=r"task 'task1' \(#1\): field 'y': empty task"):
        store.write_tasks(tmp_path / "e.h5", [Xs[0], np.zeros((0, 5))], [ys[0], np.zeros(0)])
    with pytest.raises(InputError, match=r"task 'task1' \(#1\): field 'X': has 4 features, other tasks have 5"):
        store.write_tasks(tmp_path / "d.h5", [Xs[0], np.zeros((2, 4))], [ys[0], np.ones(2)])


def test_file_level_errors(tmp_path):
    with pytest.raises(InputError, match=r"nope\.h5: no such file"):
        store.TaskFile(tmp_path / "nope.h5")
    junk = tmp_path / "junk.h5"
    junk.write_text("this is not HDF5")
    with pytest.raises(InputError, match=r"junk\.h5: not an HDF5 file"):
        store.TaskFile(junk)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.attrs["format"] = "something-else"
    with pytest.raises(InputError, match=r"other\.h5: attribute 'format' is 'something-else', expected 'hpcmtl-tasks'"):
        store.TaskFile(other)
    Xs, ys = small()
    future = tmp_path / "future.h5"
    store.write_tasks(future, Xs, ys)
    with h5py.File(future, "a") as f:
        f.attrs["format_version"] = 99
    with pytest.raises(InputError, match=r"future\.h5: attribute 'format_version' is 99, this hpcmtl reads version 1"):
        store.TaskFile(future)


def test_missing_fields_are_named(tmp_path):
    for sparse, field in ((False, "X"), (False, "y"), (True, "indptr")):
        Xs, ys = small(sparse)
        path = tmp_path / f"m{field}.h5"
        store.write_tasks(path, Xs, ys)
        with h5py.File(path, "a") as f:
            del f[f"tasks/000000/{field}"]
        with store.TaskFile(path) as tf, pytest.raises(InputError, match=rf"task 'task0' \(#0\): field '{field}' is missing"):
            tf.read_task(0)


def test_a_task_that_is_not_a_group_is_named(tmp_path):
    """read_block looks each object up once (many tasks: h5py's lookups were most of a small task's read); a
    task stored as a dataset where its group belongs is still one line naming it."""
    Xs, ys = small()
    path = tmp_path / "g.h5"
    store.write_tasks(path, Xs, ys)
    with h5py.File(path, "a") as f:
        del f["tasks/000002"]
        f["tasks/000002"] = np.zeros(3)
    with store.TaskFile(path) as tf:
        assert_array_equal(tf.read_task(0).X, Xs[0])
        with pytest.raises(InputError, match=r"task 'task2' \(#2\): '/tasks/000002' must be a group, found a Dataset"):
            tf.read_task(2)


def test_stream_scale_statistics_are_stored_and_recomputed_for_older_files(tmp_path):
    rng = np.random.default_rng(0)
    X = sp.random(50, 7, density=0.4, format="csr", random_state=1) * 255.0
    Y = rng.choice([-1.0, 0.0, 1.0], size=(50, 3))
    path = tmp_path / "s.h5"
    store.write_stream(path, X, Y)
    expected = (float(X.multiply(X).sum() / 50), float(np.count_nonzero(Y) / 50))
    with store.StreamFile(path) as sf:
        stored = (sf.mean_sq_row_norm(), sf.mean_active_labels())
    with h5py.File(path, "a") as f:                  # a file written before these attributes existed
        del f.attrs["mean_sq_row_norm"], f.attrs["mean_active_labels"]
    with store.StreamFile(path) as sf:
        recomputed = (sf.mean_sq_row_norm(chunk=3), sf.mean_active_labels(chunk=7))
    assert stored == pytest.approx(expected) and recomputed == pytest.approx(expected)


def test_corrupt_csr_indices_are_caught(tmp_path):
    Xs, ys = small(sparse=True)
    path = tmp_path / "c.h5"
    store.write_tasks(path, Xs, ys)
    with h5py.File(path, "a") as f:
        f["tasks/000001/indices"][0] = 1000
    with store.TaskFile(path) as tf, pytest.raises(InputError, match=r"task 'task1' \(#1\): field 'indices': column index outside 0\.\.4"):
        tf.read_task(1)


def test_existing_output_is_refused_without_force(tmp_path):
    Xs, ys = small()
    path = tmp_path / "t.h5"
    store.write_tasks(path, Xs, ys)
    with pytest.raises(InputError, match="output file exists"):
        store.write_tasks(path, Xs, ys, force=False)
    with pytest.raises(InputError, match="cannot write output: directory .* does not exist"):
        store.write_tasks(tmp_path / "no" / "dir" / "t.h5", Xs, ys)


@pytest.mark.smoke
def test_failed_write_leaves_nothing_under_the_final_name(tmp_path):
    path = tmp_path / "t.h5"
    with pytest.raises(RuntimeError):
        with store.atomic_h5(path) as f:
            f.create_dataset("x", data=np.ones(10))
            raise RuntimeError("crash mid-write")
    assert os.listdir(tmp_path) == []


def test_killed_writer_leaves_no_file_under_the_final_name(tmp_path):
    path = tmp_path / "big.h5"
    code = (
        "import numpy as np, time, sys\n"
        "from hpcmtl import store\n"
        "with store.atomic_h5(sys.argv[1]) as f:\n"
        "    for k in range(10**6):\n"
        "        f.create_dataset(f'x{k}', data=np.ones(1000)); f.flush()\n"
        "        if k == 20: print('writing', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not path.exists()
    leftovers = os.listdir(tmp_path)
    assert leftovers and all(name.startswith(".big.h5.") for name in leftovers)


@pytest.mark.smoke
def test_result_file_layout(tmp_path):
    path = tmp_path / "r.h5"
    hist = {"round": np.arange(3), "gap": np.ones(3)}
    store.write_result(path, np.ones((4, 2)), np.eye(2), hist, {"lam": 0.1}, 3, "0.1.0", task_names=["a", "b"])
    with h5py.File(path, "r") as f:
        assert f["model/W"].shape == (4, 2) and f["model/Sigma"].shape == (2, 2)
        assert list(f["history"]) == ["gap", "round"]
        assert f.attrs["n_ranks"] == 3 and f.attrs["hpcmtl_version"] == "0.1.0"
    r = store.read_result(path)
    assert r["config"] == {"lam": 0.1} and r["model"]["task_names"] == ["a", "b"]


@pytest.mark.parametrize("float32", [False, True])
def test_dense_rows_read_with_the_intercept_column_equal_the_augmented_block(tmp_path, float32):
    """``read_block(constant_column=c)`` reads a dense file's rows straight into the augmented array (issue 14:
    no second copy of a block at load): the same values, norms and read fingerprints as ``augmented(c)`` of the
    rows read plainly, for a middle range, one row, and the whole task; a NaN is still found and named."""
    rng = np.random.default_rng(11)
    Xs = [rng.normal(size=(9, 4)), rng.normal(size=(1, 4))]
    ys = [rng.normal(size=9), rng.normal(size=1)]
    path = tmp_path / "d.h5"
    store.write_tasks(path, Xs, ys, float32=float32)
    for task, start, stop in ((0, 2, 7), (0, 4, 5), (0, 0, 9), (1, 0, 1)):
        plain, direct = store.TaskFile(path), store.TaskFile(path)
        a = plain.read_block(task, start, stop).augmented(2.5)
        b = direct.read_block(task, start, stop, constant_column=2.5)
        assert b.X.dtype == a.X.dtype == (np.float32 if float32 else np.float64) and b.X.shape == (stop - start, 5)
        assert b.X.tobytes() == a.X.tobytes() and b.y.tobytes() == a.y.tobytes()
        assert b.sq_norms.tobytes() == a.sq_norms.tobytes()
        assert direct.read_parts == plain.read_parts
        plain.close()
        direct.close()
    with h5py.File(path, "a") as f:
        X = f["tasks/000000/X"][()]
        X[3, 1] = np.nan
        f["tasks/000000/X"][...] = X
    with pytest.raises(InputError, match="field 'X': contains NaN or Inf"), store.TaskFile(path) as source:
        source.read_block(0, 0, 9, constant_column=1.0)


@pytest.mark.parametrize("constant_column", [None, 2.5])
def test_float64_rows_read_as_float32_equal_the_rounded_block(tmp_path, constant_column):
    """``read_block(float32=True)`` on a float64 file rounds the rows into their final float32 array a file chunk
    at a time (issue 14: no float64 copy of the block under ``--float32``): the bits of ``as_float32()`` (and
    ``augmented``) of the rows read plainly, the same read fingerprints (of the stored float64 values), for
    ranges that start and stop inside the file's chunks and span several; a NaN and a value beyond float32's
    range are named in one line with the task's row."""
    rng = np.random.default_rng(12)
    Xs = [rng.normal(size=(5000, 300)) * 1e3, rng.normal(size=(1, 300)), rng.normal(size=(9, 300))]
    ys = [rng.normal(size=X.shape[0]) for X in Xs]
    path = tmp_path / "d64.h5"
    store.write_tasks(path, Xs, ys)
    options = {} if constant_column is None else {"constant_column": constant_column}
    for task, start, stop in ((0, 0, 5000), (0, 100, 4000), (0, 873, 874), (1, 0, 1), (2, 3, 9)):
        plain, rounded = store.TaskFile(path), store.TaskFile(path)
        a = plain.read_block(task, start, stop).as_float32()
        a = a if constant_column is None else a.augmented(constant_column)
        b = rounded.read_block(task, start, stop, float32=True, **options)
        assert b.X.dtype == a.X.dtype == np.float32 and b.X.shape == a.X.shape
        assert b.X.tobytes() == a.X.tobytes() and b.y.tobytes() == a.y.tobytes()
        assert rounded.read_parts == plain.read_parts
        plain.close()
        rounded.close()
    with h5py.File(path, "a") as f:
        X = f["tasks/000000/X"][()]
        X[3000, 1] = 5e38
        X[4000, 2] = np.nan
        f["tasks/000000/X"][...] = X
    with store.TaskFile(path) as source:
        with pytest.raises(InputError, match=r"task 'task0' \(#0\): field 'X': row 3000: 5e\+38 does not fit float32"):
            source.read_block(0, 2000, 3500, float32=True, **options)
        with pytest.raises(InputError, match="field 'X': contains NaN or Inf"):
            source.read_block(0, 3500, 5000, float32=True, **options)


@pytest.mark.parametrize("name", ["ok\nhpcmtl: error: forged", "\x1b[2Jwiped", "tab\there", ""])
def test_task_names_read_from_a_file_are_one_printable_line(tmp_path, name):
    """A name with a line break forged a second 'hpcmtl: error:' line and escape sequences reached the terminal:
    names read from a task file get the converters' check (issue 40, item 16)."""
    path = tmp_path / "t.h5"
    store.write_tasks(path, [np.ones((2, 2)), np.ones((3, 2))], [np.ones(2), -np.ones(3)], names=["a", "b"])
    with h5py.File(path, "r+") as f:
        table = f["task_table"][()]
        table["name"][1] = name.encode()
        del f["task_table"]
        f["task_table"] = table
    with pytest.raises(InputError, match=r"'task_table' row 1: (empty task name|task name .* holds a line break)"):
        store.TaskFile(path)
    r = subprocess.run([sys.executable, "-m", "hpcmtl", "data", "info", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "\x1b" not in r.stderr, r.stderr
    assert r.stderr.startswith("hpcmtl: error: ") and "forged" not in r.stderr.split("\n", 1)[1]
    with pytest.raises(InputError, match="task #0"):
        store.write_tasks(tmp_path / "u.h5", [np.ones((2, 2))], [np.ones(2)], names=[name or "\n"])


@pytest.mark.parametrize("attr,value", [("n_features", 0), ("n_features", 6.7), ("n_tasks", "three"),
                                        ("n_features", True), ("n_tasks", -1)])
def test_task_file_counts_are_integers_of_at_least_one(tmp_path, attr, value):
    """n_features 6.7 was truncated to 6, 0 features trained, 'three' gave a traceback (issue 40, 13/15/17)."""
    path = tmp_path / "t.h5"
    store.write_tasks(path, [np.ones((2, 2))], [np.ones(2)])
    with h5py.File(path, "r+") as f:
        f.attrs[attr] = value
    with pytest.raises(InputError, match=f"attribute '{attr}' is .*expected an integer >= 1"):
        store.TaskFile(path)
    r = subprocess.run([sys.executable, "-m", "hpcmtl", "data", "info", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and f"attribute '{attr}'" in r.stderr, r.stderr


def test_data_info_on_infinite_labels_prints_no_warning(tmp_path):
    path = tmp_path / "t.h5"
    store.write_tasks(path, [np.ones((2, 2)), np.ones((3, 2))], [np.ones(2), np.array([1.0, 2.0, 3.0])])
    with h5py.File(path, "r+") as f:
        f["tasks/000001/y"][0] = np.inf                # a label no converter would write
    r = subprocess.run([sys.executable, "-W", "error", "-m", "hpcmtl", "data", "info", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "y mean inf" in r.stdout
