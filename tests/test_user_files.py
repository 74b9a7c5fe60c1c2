"""A user's own files to a report (issue 38): evaluate's JSON, skipped AUC tasks, --quiet, the import.

Expected numbers come from NumPy / scikit-learn here, never from the code under test.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from hpcmtl import store

from conftest import run_hpcmtl


def one_class_tasks(tmp_path):
    """Three tasks; 'flat' and 'flat2' have only +1 test labels (no AUC), 'mixed' both classes."""
    rng = np.random.default_rng(3)
    X = [rng.normal(size=(20, 3)) for _ in range(3)]
    w = np.array([1.0, -2.0, 0.5])
    y = [np.ones(20), np.sign(X[1] @ w + 0.7 * rng.normal(size=20)), np.ones(20)]
    test = tmp_path / "test.h5"
    store.write_tasks(test, X, y, names=["flat", "mixed", "flat2"])
    out = tmp_path / "r.h5"
    config = {"method": "stl", "loss": "hinge", "n_features": 3}
    store.write_result(out, np.column_stack([w, w, w]), None, {}, config, 1, "test",
                       task_names=["flat", "mixed", "flat2"])
    return out, test, X, y, w


def test_evaluate_json_writes_null_for_undefined_and_counts_skipped_auc_tasks(tmp_path):
    out, test, X, y, w = one_class_tasks(tmp_path)
    r = run_hpcmtl(["evaluate", out, test, "--json"])
    assert r.returncode == 0, r.stderr
    assert "NaN" not in r.stdout
    # a strict parser: bare NaN / Infinity refused
    metrics = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    aucs = {t["name"]: t["auc"] for t in metrics["tasks"]}
    assert aucs["flat"] is None and aucs["flat2"] is None
    assert aucs["mixed"] == pytest.approx(roc_auc_score(y[1], X[1] @ w))
    s = metrics["summary"]
    assert s["n_tasks_without_auc"] == 2
    assert s["task_mean_auc"] == pytest.approx(roc_auc_score(y[1], X[1] @ w))
    # the table says it too
    r = run_hpcmtl(["evaluate", out, test])
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("n_tasks_without_auc")]
    assert line and line[0].split()[1] == "2"


def test_evaluate_json_null_for_a_mean_over_no_tasks(tmp_path):
    out, test, X, y, w = one_class_tasks(tmp_path)
    store.write_tasks(test, [X[0], X[2]], [y[0], y[2]], names=["flat", "flat2"])
    store.write_result(out, np.column_stack([w, w]), None, {}, {"method": "stl", "loss": "hinge", "n_features": 3},
                       1, "test", task_names=["flat", "flat2"])
    r = run_hpcmtl(["evaluate", out, test, "--json"])
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))["summary"]
    assert s["task_mean_auc"] is None and s["n_tasks_without_auc"] == 2


@pytest.mark.parametrize("quiet", [["--quiet"], ["--log-level", "error"], []])
def test_quiet_keeps_numpy_runtime_warnings_out(tmp_path, monkeypatch, quiet):
    """A training whose arithmetic overflows (as a logistic grid's far end does) warns only without --quiet."""
    import dataclasses
    import warnings

    from hpcmtl import methods
    from hpcmtl.cli import main
    rng = np.random.default_rng(0)
    X = [rng.normal(size=(15, 3)) for _ in range(2)]
    store.write_tasks(tmp_path / "t.h5", X, [np.sign(x[:, 0] + 0.1) for x in X])
    row = methods.METHODS["stl"]

    def overflowing(run):
        np.exp(np.array([1e4]))                       # RuntimeWarning: overflow encountered in exp
        return row.train(run)

    monkeypatch.setitem(methods.METHODS, "stl", dataclasses.replace(row, train=overflowing))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["train", "stl", "--train", tmp_path / "t.h5", "--out", tmp_path / "r.h5", "--loss", "hinge",
                     "--lam", "0.1"] + quiet)
    assert code == 0
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert (len(runtime) == 0) if quiet else (len(runtime) >= 1)
    assert store.read_result(tmp_path / "r.h5")["model"]["W"].shape == (3, 2)


def test_data_info_counts_label_values_and_says_the_scaling(tmp_path):
    rng = np.random.default_rng(1)
    X = [rng.normal(size=(12, 3)), rng.normal(size=(9, 3))]
    y = [np.r_[np.zeros(7), np.ones(5)], rng.normal(size=9)]
    store.write_tasks(tmp_path / "t.h5", X, y, names=["zero_one", "real"])
    r = run_hpcmtl(["data", "info", tmp_path / "t.h5", "--json"])
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["tasks"][0]["label_counts"] == {"0": 7, "1": 5}
    assert "label_counts" not in info["tasks"][1]            # 9 distinct real values are not counted
    assert info["scaling"] == "none"
    r = run_hpcmtl(["data", "info", tmp_path / "t.h5"])
    assert "labels 0:7 1:5" in r.stdout and "scaling: none" in r.stdout
    r = run_hpcmtl(["data", "standardize", tmp_path / "t.h5", tmp_path / "s.h5", "--scale", "maxabs"])
    assert r.returncode == 0, r.stderr
    r = run_hpcmtl(["data", "info", tmp_path / "s.h5", "--json"])
    assert json.loads(r.stdout)["scaling"].startswith("maxabs")


def test_hinge_on_real_valued_labels_suggests_the_squared_loss(tmp_path):
    from conftest import one_error_line
    rng = np.random.default_rng(2)
    X = [rng.normal(size=(10, 3)) for _ in range(2)]
    store.write_tasks(tmp_path / "t.h5", X, [x @ np.ones(3) for x in X])
    r = run_hpcmtl(["train", "stl", "--train", tmp_path / "t.h5", "--out", tmp_path / "r.h5", "--loss", "hinge",
                    "--lam", "0.1"])
    line = one_error_line(r)
    assert r.returncode == 2 and "needs labels -1/+1" in line and "--loss squared" in line


@pytest.mark.parametrize("sparse", [False, True])
def test_standardize_scalings_match_numpy(tmp_path, sparse):
    import scipy.sparse as sp
    rng = np.random.default_rng(4)
    dense = [rng.normal(size=(8, 4)) * [1, 10, 0.1, 0] * (rng.uniform(size=(8, 4)) < 0.6) + [0, 0, 0, 0]
             for _ in range(2)]
    dense[0][0, 3] = 0.0
    Xs = [sp.csr_matrix(x) if sparse else x for x in dense]
    ys = [np.ones(8), -np.ones(8)]
    store.write_tasks(tmp_path / "t.h5", Xs, ys)
    store.write_tasks(tmp_path / "u.h5", [Xs[1]], [ys[1]])
    allX = np.vstack(dense)
    for kind in ("standard", "maxabs", "l2-rows"):
        out, test_out = tmp_path / f"{kind}.h5", tmp_path / f"{kind}-test.h5"
        r = run_hpcmtl(["data", "standardize", tmp_path / "t.h5", out, "--test", tmp_path / "u.h5", test_out,
                        "--scale", kind])
        assert r.returncode == 0, r.stderr
        if kind == "standard":
            mu = np.zeros(4) if sparse else allX.mean(axis=0)
            sd = np.sqrt((allX ** 2).mean(axis=0)) if sparse else allX.std(axis=0)
            sd[sd == 0] = 1.0
            expect = [(x - mu) / sd for x in dense]
        elif kind == "maxabs":
            peak = np.abs(allX).max(axis=0)
            peak[peak == 0] = 1.0
            expect = [x / peak for x in dense]
        else:
            expect = []
            for x in dense:
                n = np.linalg.norm(x, axis=1)
                expect.append(x / np.where(n > 0, n, 1.0)[:, None])
        got = [b.X for b in store.read_all_tasks(out)[0]]
        got_test = store.read_all_tasks(test_out)[0][0].X
        for g, e in zip(got + [got_test], expect + [expect[1]]):
            assert sp.issparse(g) == sparse                   # CSR stays CSR
            g = g.toarray() if sparse else g
            np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-14)
            if sparse:                                        # never centred: the zeros stay zeros
                assert np.array_equal(g == 0, e == 0)


@pytest.mark.parametrize("sparse", [False, True])
def test_load_tasks_gives_what_was_written_and_feeds_an_estimator(tmp_path, sparse):
    import scipy.sparse as sp

    import hpcmtl
    rng = np.random.default_rng(5)
    Xs = [rng.normal(size=(n, 5)) * (rng.uniform(size=(n, 5)) < 0.5) for n in (14, 9, 11)]
    Xs = [sp.csr_matrix(x) for x in Xs] if sparse else Xs
    ys = [np.where(rng.uniform(size=x.shape[0]) < 0.5, 1.0, -1.0) for x in Xs]
    store.write_tasks(tmp_path / "t.h5", Xs, ys, names=["a", "b", "c"])
    got_X, got_y, names = hpcmtl.load_tasks(tmp_path / "t.h5")
    assert names == ["a", "b", "c"]
    for x, gx, y, gy in zip(Xs, got_X, ys, got_y):
        assert sp.issparse(gx) == sparse
        np.testing.assert_array_equal(gx.toarray() if sparse else gx, x.toarray() if sparse else x)
        np.testing.assert_array_equal(gy, y)
    a = hpcmtl.DMTRL(loss="hinge", lam=0.1, relationship="identity").fit(got_X, got_y)
    b = hpcmtl.DMTRL(loss="hinge", lam=0.1, relationship="identity").fit(Xs, ys)
    np.testing.assert_array_equal(a.W_, b.W_)


def test_load_stream_and_the_wrong_kind_of_file(tmp_path):
    import scipy.sparse as sp

    import hpcmtl
    rng = np.random.default_rng(6)
    X = sp.random(30, 7, density=0.3, format="csr", random_state=1)
    Y = rng.choice([-1.0, 0.0, 1.0], size=(30, 2))
    store.write_stream(tmp_path / "s.h5", X, Y, label_names=["p", "q"])
    gX, gY, names = hpcmtl.load_stream(tmp_path / "s.h5")
    np.testing.assert_array_equal(gX.toarray(), X.toarray())
    np.testing.assert_array_equal(gY, Y)
    assert names == ["p", "q"]
    with pytest.raises(hpcmtl.InputError, match=r"s\.h5: is an online stream.*hpcmtl\.load_stream"):
        hpcmtl.load_tasks(tmp_path / "s.h5")
    (tmp_path / "raw.csv").write_text("task,x,y\na,1,1\n")
    with pytest.raises(hpcmtl.InputError, match=r"raw\.csv: is not an hpcmtl task dataset.*data inspect"):
        hpcmtl.load_tasks(tmp_path / "raw.csv")


def test_import_from_the_folder_that_holds_a_clone_named_hpcmtl(tmp_path):
    """`cd` to a clone's parent folder: its top folder `hpcmtl/` (no __init__.py) must not win the import as an
    empty namespace package over the installed package (it did with setuptools' meta-path editable finder)."""
    clone = tmp_path / "hpcmtl"
    (clone / "docs").mkdir(parents=True)
    (clone / "README.md").write_text("a clone\n")
    r = subprocess.run([sys.executable, "-c", "import hpcmtl; from hpcmtl import DMTRL, load_tasks; "
                        "print(hpcmtl.__file__)"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import hpcmtl
    assert os.path.samefile(r.stdout.strip(), hpcmtl.__file__)
