"""The packed task-file layout (hpcmtl.store.packed): the group layout's rows, checks and fingerprints, read a
window at a time; damaged packed files refused in one line naming the file, the task and the field."""
import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_array_equal

from conftest import one_error_line, random_tasks, run_hpcmtl
from hpcmtl import store
from hpcmtl.errors import InputError
from hpcmtl.store import packed


def uneven_tasks(sparse, m=40, d=7, seed=3):
    """Tasks of 1 to 60 rows (a one-row task, the first and the last of the file included)."""
    rng = np.random.default_rng(seed)
    sizes = [1] + list(rng.integers(1, 61, size=m - 2)) + [1]
    Xs = [rng.normal(size=(int(n), d)) * (rng.uniform(size=(int(n), d)) < (0.4 if sparse else 1.0)) for n in sizes]
    if sparse:
        Xs = [sp.csr_matrix(X) for X in Xs]
    ys = [rng.choice([-1.0, 1.0], size=X.shape[0]) for X in Xs]
    return Xs, ys


def as_dense(X):
    return X.toarray() if sp.issparse(X) else X


def reads(tf, order, m):
    """Every task whole, then row ranges of a few (a split task's blocks), in ``order``."""
    out = {}
    for i in order:
        n = int(tf.n_samples[i])
        out[(i, 0, n)] = tf.read_block(i)
        if n > 2:
            out[(i, 1, n - 1)] = tf.read_block(i, 1, n - 1, part=1)
    return out


@pytest.mark.parametrize("window", [packed.WINDOW_BYTES, 600])
@pytest.mark.parametrize("kind", ["dense", "float32", "csr"])
def test_packed_rows_equal_the_group_layouts(tmp_path, monkeypatch, kind, window):
    """Whatever the order the tasks are read in (the plan's, reversed, shuffled), with windows of the default size
    and of a few rows (most tasks then straddle a window's end or exceed it and are read directly), the packed file
    gives every row range, label vector and read fingerprint of the group layout's, bit for bit; the task table's
    fingerprints are the same; the intercept column and the float32 rounding of a float64 file too."""
    monkeypatch.setattr(packed, "WINDOW_BYTES", window)
    Xs, ys = uneven_tasks(kind == "csr")
    m = len(Xs)
    paths = {}
    for layout in ("groups", "packed"):
        paths[layout] = tmp_path / f"{layout}.h5"
        store.write_tasks(paths[layout], Xs, ys, float32=kind == "float32", layout=layout)
    rng = np.random.default_rng(0)
    for order in (range(m), range(m - 1, -1, -1), rng.permutation(m)):
        with store.TaskFile(paths["groups"]) as g, store.TaskFile(paths["packed"]) as p:
            assert (g.layout, p.layout) == ("groups", "packed")
            assert p.fingerprints == g.fingerprints and p.names == g.names
            a, b = reads(g, order, m), reads(p, order, m)
            for key in a:
                assert type(a[key].X) is type(b[key].X)
                assert as_dense(b[key].X).tobytes() == as_dense(a[key].X).tobytes(), key
                assert b[key].y.tobytes() == a[key].y.tobytes(), key
                assert (b[key].n_task, b[key].row_start) == (a[key].n_task, a[key].row_start)
            assert p.read_parts == g.read_parts
            for i in order:
                assert_array_equal(p.read_labels(i), ys[i])
            assert {k: v for k, v in p.info().items() if k not in ("path", "layout")} == {
                k: v for k, v in g.info().items() if k not in ("path", "layout")}
            if kind == "dense":
                for i in (0, 5, m - 1):
                    n = int(g.n_samples[i])
                    for options in ({"constant_column": 1.0}, {"float32": True},
                                    {"float32": True, "constant_column": 2.0}):
                        ga, pa = g.read_block(i, 0, n, **options), p.read_block(i, 0, n, **options)
                        assert pa.X.dtype == ga.X.dtype and pa.X.tobytes() == ga.X.tobytes(), (i, options)
                assert p.read_parts == g.read_parts
        for i in range(m):
            assert_array_equal(as_dense(store.read_all_tasks(paths["packed"])[0][i].X), as_dense(Xs[i]).astype(
                np.float32 if kind == "float32" else np.float64))


def test_auto_layout_packs_from_the_threshold(tmp_path, monkeypatch):
    """layout="auto" writes the group layout (version 1, no layout attribute: what older versions read) below
    PACKED_MIN_TASKS tasks and the packed one (version 2) from it on; an unknown layout is refused."""
    monkeypatch.setattr(packed, "PACKED_MIN_TASKS", 4)
    Xs, ys = random_tasks(m=4)
    for m, layout, version in ((3, "groups", 1), (4, "packed", 2)):
        path = tmp_path / f"{m}.h5"
        store.write_tasks(path, Xs[:m], ys[:m])
        with h5py.File(path, "r") as f:
            assert f.attrs["format_version"] == version and f.attrs.get("layout", "groups") == layout
            assert ("rows" in f) == (layout == "packed") and ("tasks" in f) == (layout == "groups")
    with pytest.raises(InputError, match="layout 'flat': expected 'auto', 'groups' or 'packed'"):
        store.write_tasks(tmp_path / "x.h5", Xs, ys, layout="flat")


def damage(path, change):
    with h5py.File(path, "a") as f:
        change(f)


def replace(f, name, value):
    del f[name]
    f[name] = value


DENSE_DAMAGE = {
    "no rows": (lambda f: f.__delitem__("rows"), r"group '/rows' is missing"),
    "rows a dataset": (lambda f: replace(f, "rows", np.zeros(3)), r"'/rows' must be a group, found a Dataset"),
    "X a group": (lambda f: (f.__delitem__("rows/X"), f.create_group("rows/X")),
                  r"field 'X' must be a dataset, found a Group"),
    "no labels": (lambda f: f.__delitem__("rows/y"), r"group '/rows': field 'y' is missing"),
    "offsets off": (lambda f: replace(f, "rows/offsets", f["rows/offsets"][()] + np.array([0, 1, 1, 1, 0])),
                    r"field 'offsets': task #0 has 31 rows there, the task table says 30"),
    "offsets short": (lambda f: replace(f, "rows/offsets", f["rows/offsets"][:-1]),
                      r"field 'offsets': has shape \(4,\), expected \(5,\) for 4 tasks"),
    "offsets float": (lambda f: replace(f, "rows/offsets", f["rows/offsets"][()].astype(float)),
                      r"field 'offsets': stored as float64, expected integers"),
    "labels short": (lambda f: replace(f, "rows/y", f["rows/y"][:-2]), r"field 'y': has shape \(138,\), expected"),
    "X columns": (lambda f: replace(f, "rows/X", f["rows/X"][:, :-1]), r"field 'X': has shape \(140, 5\), expected"),
    "X text": (lambda f: replace(f, "rows/X", f["rows/X"][()].astype(np.float32)),
               r"field 'X': stored as float32, the file's dtype is float64"),
    "layout of version 1": (lambda f: f.attrs.__setitem__("format_version", 1),
                            r"attribute 'layout' is 'packed' in a file of format_version 1"),
    "version 3": (lambda f: f.attrs.__setitem__("format_version", 3),
                  r"attribute 'format_version' is 3, this hpcmtl reads version 1 or 2"),
}


@pytest.mark.parametrize("name", sorted(DENSE_DAMAGE))
def test_a_damaged_packed_file_is_refused_when_opened(tmp_path, name):
    change, message = DENSE_DAMAGE[name]
    path = tmp_path / "p.h5"
    store.write_tasks(path, *random_tasks(m=4), layout="packed")
    damage(path, change)
    with pytest.raises(InputError, match=message) as err:
        store.TaskFile(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_a_group_file_claiming_version_2_is_refused(tmp_path):
    path = tmp_path / "g.h5"
    store.write_tasks(path, *random_tasks(m=4), layout="groups")
    damage(path, lambda f: f.attrs.__setitem__("format_version", 2))
    with pytest.raises(InputError, match=r"attribute 'layout' is missing \(the group layout\) in a file of "
                                         r"format_version 2"):
        store.TaskFile(path)


def test_damaged_rows_are_named_by_their_task_when_read(tmp_path):
    """What only reading finds: a NaN, a CSR row pointer going backwards, a column index beyond the features: one
    line naming the task and the field, the other tasks still readable."""
    Xs, ys = random_tasks(m=4, sparse=True)
    path = tmp_path / "c.h5"
    store.write_tasks(path, Xs, ys, names=list("abcd"), layout="packed")
    with h5py.File(path, "r") as f:
        offsets, indptr = f["rows/offsets"][()], f["rows/indptr"][()]
    first_of_c = int(indptr[offsets[2]])             # task c's first stored value

    def set_value(f, name, position, value):
        a = f[name][()]
        a[position] = value
        replace(f, name, a)

    cases = [
        (lambda f: set_value(f, "rows/data", first_of_c, np.nan), r"task 'c' \(#2\): field 'X': contains NaN"),
        (lambda f: set_value(f, "rows/indices", first_of_c, 6), r"task 'c' \(#2\): field 'indices': column index "
                                                                r"outside 0..5"),
        (lambda f: set_value(f, "rows/indptr", offsets[2] + 3, int(indptr[offsets[2] + 1]) - 1),
         r"field 'indptr': not a valid CSR row pointer"),
    ]
    for k, (change, message) in enumerate(cases):
        bad = tmp_path / f"bad{k}.h5"
        bad.write_bytes(path.read_bytes())
        damage(bad, change)
        with store.TaskFile(bad) as tf:
            assert_array_equal(tf.read_block(0).X.toarray(), Xs[0].toarray())
            with pytest.raises(InputError, match=message) as err:
                tf.read_block(2)
            assert "\n" not in str(err.value) and str(bad) in str(err.value)


def test_training_reads_both_layouts_alike_and_the_cli_writes_packed(tmp_path):
    """`data split --layout packed` writes the packed layout (`data info` reads it); a training run on it gives the
    group file's model, bit for bit; a damaged packed file is one line and exit 2."""
    Xs, ys = random_tasks(m=6, sizes=(30, 45, 25, 40, 4, 33))
    whole = tmp_path / "whole.h5"
    store.write_tasks(whole, Xs, ys, layout="groups")
    results = {}
    for layout in ("groups", "packed"):
        train, test = tmp_path / f"tr-{layout}.h5", tmp_path / f"te-{layout}.h5"
        r = run_hpcmtl(["data", "split", whole, train, test, "--layout", layout])
        assert r.returncode == 0, r.stderr
        with store.TaskFile(train) as tf:
            assert tf.layout == layout
        out = tmp_path / f"{layout}.h5"
        r = run_hpcmtl(["train", "dmtrl", "--train", train, "--test", test, "--out", out, "--lam", "0.01",
                        "--quiet"])
        assert r.returncode == 0, r.stderr
        results[layout] = store.read_result(out)
    for key in ("W", "Sigma"):
        assert results["packed"]["model"][key].tobytes() == results["groups"]["model"][key].tobytes()
    info = run_hpcmtl(["data", "info", tmp_path / "tr-packed.h5"])
    assert info.returncode == 0 and "6 tasks" in info.stdout and "packed layout" in info.stdout, info.stderr
    damage(tmp_path / "tr-packed.h5", lambda f: f.__delitem__("rows/y"))
    r = run_hpcmtl(["train", "dmtrl", "--train", tmp_path / "tr-packed.h5", "--out", tmp_path / "x.h5",
                    "--lam", "0.01"])
    assert r.returncode == 2 and "field 'y' is missing" in one_error_line(r)


@pytest.mark.mpi
def test_a_packed_file_trains_to_the_same_bits_at_three_ranks(tmp_path):
    """Ranks read their own tasks' rows through their own windows: mpiexec -n 3 on the packed file gives the serial
    run's model on the group file."""
    Xs, ys = random_tasks(m=7, sizes=(30, 45, 25, 40, 1, 33, 12))
    outs = {}
    for layout, ranks in (("groups", None), ("packed", 3)):
        data = tmp_path / f"{layout}.h5"
        store.write_tasks(data, Xs, ys, layout=layout)
        outs[layout] = tmp_path / f"out-{layout}.h5"
        r = run_hpcmtl(["train", "dmtrl", "--train", data, "--out", outs[layout], "--lam", "0.01", "--quiet"],
                       n_ranks=ranks, timeout=240)
        assert r.returncode == 0, r.stderr
    a, b = store.read_result(outs["groups"]), store.read_result(outs["packed"])
    assert a["model"]["W"].tobytes() == b["model"]["W"].tobytes()


def test_windows_stay_small_whatever_the_chunks_and_the_tasks(tmp_path, monkeypatch):
    """A window holds about WINDOW_BYTES of rows: not a whole chunk of the labels (131,072 rows once a file has
    more rows), nor a CSR task with many stored values among tiny ones (read directly, never held beside its
    block); a damaged row pointer far from the rows asked for makes no window read the rest of the values, and is
    named by its task when that task is read; writing packed holds no second copy of the tasks."""
    import tracemalloc
    monkeypatch.setattr(packed, "WINDOW_BYTES", 1 << 16)
    rng = np.random.default_rng(4)
    Xs = [rng.normal(size=(100, 2)) for _ in range(1400)]                  # 140,000 rows: y chunked at 131,072
    ys = [rng.normal(size=100) for _ in range(1400)]
    path = tmp_path / "dense.h5"
    tracemalloc.start()
    store.write_tasks(path, Xs, ys, layout="packed")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2 * (1 << 20) < sum(X.nbytes + y.nbytes for X, y in zip(Xs, ys))    # about a chunk (1 MB)
    with store.TaskFile(path) as tf:
        assert_array_equal(tf.read_block(0).X, Xs[0])
        assert tf._packed.window[3].nbytes <= 2 * packed.WINDOW_BYTES
        assert_array_equal(tf.read_block(1399).X, Xs[1399])
    heavy = sp.csr_matrix(rng.normal(size=(200, 100)))                     # 20,000 values, 240 KB
    Xc = [heavy] + [sp.csr_matrix(rng.normal(size=(3, 100)) * (rng.uniform(size=(3, 100)) < 0.02))
                    for _ in range(2999)]
    yc = [np.ones(X.shape[0]) for X in Xc]
    path = tmp_path / "csr.h5"
    store.write_tasks(path, Xc, yc, layout="packed")
    with store.TaskFile(path) as tf:
        assert (tf.read_block(0).X != heavy).nnz == 0 and tf._packed.window is None
        assert (tf.read_block(1).X != Xc[1]).nnz == 0
        budget = packed.WINDOW_BYTES // tf._packed.value_bytes
        assert tf._packed.window[3][1].size <= budget + 300
    with h5py.File(path, "a") as f:
        offsets, indptr = f["rows/offsets"][()], f["rows/indptr"][()]
        indptr[offsets[2500] + 1] = 10 ** 12
        replace(f, "rows/indptr", indptr)
    with store.TaskFile(path) as tf:
        for i in (2400, 2499):                  # the window of task 2400 reaches task 2500's damaged pointer
            assert (tf.read_block(i).X != Xc[i]).nnz == 0
            assert tf._packed.window[3][1].size <= budget + 300
        with pytest.raises(InputError, match=r"task 'task2500' \(#2500\): field 'indptr': not a valid CSR row"):
            tf.read_block(2500)


@pytest.mark.mpi
def test_a_checkpoint_taken_on_the_group_layout_resumes_on_the_packed_one(tmp_path):
    """The layouts hold the same rows and fingerprints, so a run killed on the group file (P = 3, a worker killed
    in round 6, the checkpoint of round 5) resumes with --train on the packed copy (P = 2) to the uninterrupted
    run's W and history, bit for bit."""
    import os
    Xs, ys = random_tasks(m=7, sizes=(30, 45, 25, 40, 1, 33, 12))
    files = {}
    for layout in ("groups", "packed"):
        files[layout] = tmp_path / f"{layout}.h5"
        store.write_tasks(files[layout], Xs, ys, layout=layout)

    def args(train, out, *extra):
        return ["train", "dmtrl", "--train", train, "--out", out, "--loss", "squared", "--lam", "1e-3",
                "--tol", "1e-9", "--outer", "2", "--outer-tol", "0", "--quiet", "--force", *extra]
    ref_out = tmp_path / "ref.h5"
    r = run_hpcmtl(args(files["groups"], ref_out), n_ranks=2, timeout=240)
    assert r.returncode == 0, r.stderr
    ref = store.read_result(ref_out)
    assert int(ref["history"]["round"][-1]) > 6
    out = tmp_path / "r.h5"
    killed = run_hpcmtl(args(files["groups"], out, "--checkpoint-every", "1"), n_ranks=3, timeout=240,
                        env={"HPCMTL_FAULT": "1:6:kill"})
    assert killed.returncode != 0 and not os.path.exists(out)
    assert store.read_checkpoint(str(out) + ".checkpoint.h5")["counters"]["round"] == 5
    r = run_hpcmtl(args(files["packed"], out, "--checkpoint-every", "1", "--resume"), n_ranks=2, timeout=240)
    assert r.returncode == 0, r.stderr
    res = store.read_result(out)
    assert res["model"]["W"].tobytes() == ref["model"]["W"].tobytes()
    for key in ("round", "primal", "dual"):
        assert res["history"][key].tobytes() == ref["history"][key].tobytes(), key
