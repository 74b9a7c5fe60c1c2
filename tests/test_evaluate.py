"""`hpcmtl evaluate` on online results (test streams) and batch results, and the one metric naming scheme.

Every expected number is computed here with NumPy from the stored W (and code), never by the
code under test.
"""
import csv
import json

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.metrics import roc_auc_score

from hpcmtl import store
from hpcmtl.metrics import OLD_SUMMARY_NAMES, SUMMARY_KEYS

from conftest import run_hpcmtl

RULE = ["--norm", "rmax", "--r", "2", "--C", "0.1"]


def multilabel_stream(path, seed, T, d=12, k=4, names="abcd"):
    """k labels over shared instances (one fixed U for every seed); label 'd' is dormant on most rounds."""
    U = np.random.default_rng(99).normal(size=(d, k))
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(T, d)) * (rng.uniform(size=(T, d)) < 0.6)
    noise = np.array([0.3] * (k - 1) + [3.0])                 # the rarely active label is also the noisiest
    Y = np.where(X @ U + noise * rng.normal(size=(T, k)) > 0, 1.0, -1.0)
    Y[rng.uniform(size=T) < 0.3, 1] = 0
    Y[rng.uniform(size=T) < 0.85, 3] = 0
    store.write_stream(path, sp.csr_matrix(X), Y, label_names=list(names[:k]))
    return X, Y


def single_label_stream(path, seed, T, d=20, n_classes=4):
    """Rounds of classes around fixed centers (the same for every seed: train and test share them)."""
    centers = np.random.default_rng(99).normal(size=(n_classes, d)) * 0.4
    rng = np.random.default_rng(seed)
    classes = rng.integers(0, n_classes, size=T)
    X = centers[classes] + rng.normal(size=(T, d))
    Y = -np.ones((T, n_classes))
    Y[np.arange(T), classes] = 1
    store.write_stream(path, sp.csr_matrix(X), Y, label_names=[f"class{c}" for c in range(n_classes)])
    return X, classes


def numpy_stream_metrics(W, X, Y):
    """Paper 004's counts (a task is wrong when y w.x <= 0, dormant never) and per-task error / AUC."""
    M = X @ W
    wrong = (Y * M <= 0) & (Y != 0)
    active = Y != 0
    T, k = Y.shape
    per_task = [(wrong[:, j].sum() / active[:, j].sum(), roc_auc_score(Y[active[:, j], j], M[active[:, j], j]))
                for j in range(k)]
    return {"n_rounds": T, "inf_error_rate": wrong.any(axis=1).mean(), "one_error_rate": wrong.sum() / (T * k),
            "pooled_error_rate": wrong.sum() / active.sum(),
            "task_mean_error_rate": np.mean([e for e, _ in per_task]),
            "task_mean_auc": np.mean([a for _, a in per_task]), "n_samples": int(active.sum()),
            "task_error_rates": [e for e, _ in per_task]}


def evaluate_json(result, test):
    r = run_hpcmtl(["evaluate", result, test, "--json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def evaluate_text(result, test):
    r = run_hpcmtl(["evaluate", result, test])
    assert r.returncode == 0, r.stderr
    return r.stdout


def text_summary(text):
    """{row label: value} of the summary rows (after the first blank line; an output code's classes follow the
    next one) of the evaluate table."""
    rows = text.split("\n\n")[1].split("\n")
    return {line.split()[0]: float(line.split()[1]) for line in rows if line.strip()}


@pytest.fixture(scope="module")
def online_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("online-eval")
    train, test = d / "train.h5", d / "test.h5"
    multilabel_stream(train, 0, 600)
    X, Y = multilabel_stream(test, 1, 300)
    out = d / "r.h5"
    r = run_hpcmtl(["train", "online", "--stream", train, "--test", test, "--out", out, "--quiet",
                    "--chunk-rounds", "64"] + RULE)
    assert r.returncode == 0, r.stderr
    return d, out, test, X, Y


def test_online_result_on_a_test_stream_matches_numpy(online_run):
    d, out, test, X, Y = online_run
    W = store.read_result(out)["model"]["W"]
    expected = numpy_stream_metrics(W, X, Y)
    assert expected["pooled_error_rate"] != pytest.approx(expected["task_mean_error_rate"], abs=1e-3)
    metrics = evaluate_json(out, test)
    s = metrics["summary"]
    for key in ("inf_error_rate", "one_error_rate", "pooled_error_rate", "task_mean_error_rate", "task_mean_auc"):
        assert s[key] == pytest.approx(expected[key], rel=1e-12, abs=1e-15), key
    assert s["n_rounds"] == 300 and s["n_samples"] == expected["n_samples"] and "multiclass_error_rate" not in s
    assert [t["error_rate"] for t in metrics["tasks"]] == pytest.approx(expected["task_error_rates"], rel=1e-12)
    # the text table shows the same numbers under the same names; --test at training time gave them too
    shown = text_summary(evaluate_text(out, test))
    for key in ("inf_error_rate", "one_error_rate", "pooled_error_rate", "task_mean_error_rate"):
        assert shown[key] == pytest.approx(expected[key], abs=5e-7), key
    during = store.read_result(out)["test"]["summary"]
    assert during == pytest.approx(s)


def test_online_result_in_another_label_order_is_matched_by_name(online_run, tmp_path):
    d, out, test, X, Y = online_run
    shuffled = tmp_path / "reordered.h5"
    order = [2, 0, 3, 1]
    store.write_stream(shuffled, sp.csr_matrix(X), Y[:, order], label_names=[list("abcd")[j] for j in order])
    a, b = evaluate_json(out, test), evaluate_json(out, shuffled)
    assert b["summary"] == pytest.approx(a["summary"])
    assert {t["name"]: t["error_rate"] for t in b["tasks"]} == {t["name"]: t["error_rate"] for t in a["tasks"]}


def test_online_ecoc_result_reports_the_multiclass_error(tmp_path):
    train, test = tmp_path / "train.h5", tmp_path / "test.h5"
    single_label_stream(train, 0, 800)
    X, classes = single_label_stream(test, 1, 400)
    out = tmp_path / "ecoc.h5"
    r = run_hpcmtl(["train", "online", "--stream", train, "--out", out, "--quiet", "--code", "exhaustive",
                    "--norm", "rmax", "--r", "2", "--C", "0.1"])
    assert r.returncode == 0, r.stderr
    model = store.read_result(out)["model"]
    W, M = model["W"], model["code"]
    assert M.shape == (4, 7)
    margins = X @ W
    # loss-based decoding (the default): the class whose code row has the least summed hinge loss
    hinge = np.array([[np.sum(np.maximum(0.0, 1.0 - M[c] * margins[t])) for c in range(4)] for t in range(len(X))])
    multiclass = np.mean(np.argmin(hinge, axis=1) != classes)
    expected = numpy_stream_metrics(W, X, M[classes])
    s = evaluate_json(out, test)["summary"]
    assert s["multiclass_error_rate"] == pytest.approx(multiclass, abs=1e-15)
    assert 0 < s["multiclass_error_rate"] < 0.5
    for key in ("inf_error_rate", "one_error_rate", "pooled_error_rate", "task_mean_error_rate"):
        assert s[key] == pytest.approx(expected[key], rel=1e-12), key
    assert text_summary(evaluate_text(out, test))["multiclass_error_rate"] == pytest.approx(multiclass, abs=5e-7)
    assert model["class_names"] == ["class0", "class1", "class2", "class3"]
    # the test stream's classes are matched to the code's rows by name
    order = [2, 0, 3, 1]
    Y = -np.ones((len(X), 4))
    Y[np.arange(len(X)), classes] = 1
    reordered = tmp_path / "reordered.h5"
    store.write_stream(reordered, sp.csr_matrix(X), Y[:, order], label_names=[f"class{c}" for c in order])
    assert evaluate_json(out, reordered)["summary"] == pytest.approx(s)


def one_error_line(r):
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    return lines[0]


def test_mismatched_inputs_are_one_line_exit_2(online_run, tmp_path):
    d, out, test, X, Y = online_run
    wide = tmp_path / "wide.h5"
    store.write_stream(wide, sp.csr_matrix(np.hstack([X, X[:, :1]])), Y, label_names=list("abcd"))
    fewer = tmp_path / "fewer.h5"
    store.write_stream(fewer, sp.csr_matrix(X), Y[:, :3], label_names=list("abc"))
    renamed = tmp_path / "renamed.h5"
    store.write_stream(renamed, sp.csr_matrix(X), Y, label_names=list("abcz"))
    tasks = tmp_path / "tasks.h5"
    store.write_tasks(tasks, [X[:50], X[50:80]], [np.where(X[:50, 0] > 0, 1.0, -1.0),
                                                  np.where(X[50:80, 1] > 0, 1.0, -1.0)], names=["a", "b"])
    ecoc_train, ecoc_test = tmp_path / "ecoc-train.h5", tmp_path / "ecoc-test.h5"
    single_label_stream(ecoc_train, 0, 200, n_classes=4)
    single_label_stream(ecoc_test, 1, 50, n_classes=5)
    ecoc_renamed = tmp_path / "ecoc-renamed.h5"
    with store.StreamFile(ecoc_train) as f:
        Xe, Ye = f.read_rounds(0, 60)
    store.write_stream(ecoc_renamed, Xe, Ye, label_names=["class0", "class1", "class2", "other"])
    ecoc = tmp_path / "ecoc.h5"
    assert run_hpcmtl(["train", "online", "--stream", ecoc_train, "--out", ecoc, "--quiet", "--code", "exhaustive",
                       "--C", "0.1"]).returncode == 0
    batch = tmp_path / "stl.h5"
    assert run_hpcmtl(["train", "stl", "--train", tasks, "--out", batch, "--lam", "0.1", "--quiet"]).returncode == 0
    cases = [
        (out, wide, f"{wide}: has 13 features, the model ({out}) was trained on 12"),
        (out, fewer, f"{fewer}: its labels differ from the model's ({out}): missing the model's label(s) 'd' "
                     f"(3 labels, the model has 4)"),
        (out, renamed, f"{renamed}: its labels differ from the model's ({out}): missing the model's label(s) 'd'; "
                       f"label(s) 'z' not in the model"),
        (ecoc, ecoc_test, f"{ecoc_test}: has 5 labels, the model's output code ({ecoc}) is over 4 classes"),
        (ecoc, ecoc_renamed, f"{ecoc_renamed}: its classes differ from the model's ({ecoc}): missing the model's "
                             f"class(es) 'class3'; class(es) 'other' not in the model"),
        (out, tasks, f"{tasks}: is a task dataset, but {out} is an online result: evaluate it on a test stream "
                     f"('hpcmtl-stream')"),
        (batch, test, f"{test}: is an online stream, but {batch} is a 'stl' result: evaluate it on a task "
                      f"dataset ('hpcmtl-tasks')"),
    ]
    for result, path, message in cases:
        for extra in ([], ["--json"]):
            r = run_hpcmtl(["evaluate", result, path] + extra)
            assert one_error_line(r) == f"hpcmtl: error: {message}"
            assert r.stdout == ""
    # the same checks refuse a test stream before training starts
    r = run_hpcmtl(["train", "online", "--stream", ecoc_train, "--test", ecoc_test, "--out", tmp_path / "no.h5",
                    "--code", "exhaustive", "--C", "0.1"])
    assert one_error_line(r).endswith("has 5 labels, the model's output code (" + str(ecoc_train)
                                      + ") is over 4 classes")
    assert not (tmp_path / "no.h5").exists()


# ---------------------------------------------------------------------------
# one naming scheme: pooled_* vs task_mean_*
# ---------------------------------------------------------------------------
def unequal_tasks(tmp_path, regression=False):
    """Two tasks, 5 and 100 samples; W gets every sample of 'small' wrong and every sample of 'big' right."""
    rng = np.random.default_rng(0)
    X = [rng.normal(size=(5, 3)), rng.normal(size=(100, 3))]
    w = np.array([1.0, -2.0, 0.5])
    if regression:
        y = [X[0] @ w + 3.0, X[1] @ w + 0.1 * rng.normal(size=100)]
    else:
        y = [-np.sign(X[0] @ w), np.sign(X[1] @ w)]
    test = tmp_path / ("reg-test.h5" if regression else "test.h5")
    store.write_tasks(test, X, y, names=["small", "big"])
    out = tmp_path / ("reg.h5" if regression else "r.h5")
    config = {"method": "stl", "loss": "squared" if regression else "hinge", "n_features": 3}
    store.write_result(out, np.column_stack([w, w]), None, {}, config, 1, "test", task_names=["small", "big"])
    return out, test, X, y, w


@pytest.mark.smoke
def test_pooled_is_pooled_and_task_mean_is_the_mean(tmp_path):
    out, test, X, y, w = unequal_tasks(tmp_path)
    s = evaluate_json(out, test)["summary"]
    assert s["pooled_error_rate"] == pytest.approx(5 / 105) and s["task_mean_error_rate"] == pytest.approx(0.5)
    shown = text_summary(evaluate_text(out, test))
    assert shown["pooled_error_rate"] == pytest.approx(5 / 105, abs=1e-6)
    assert shown["task_mean_error_rate"] == pytest.approx(0.5, abs=1e-6)
    out, test, X, y, w = unequal_tasks(tmp_path, regression=True)
    s = evaluate_json(out, test)["summary"]
    sq = [(Xi @ w - yi) ** 2 for Xi, yi in zip(X, y)]
    assert s["pooled_rmse"] == pytest.approx(np.sqrt(np.concatenate(sq).mean()))
    assert s["task_mean_rmse"] == pytest.approx(np.mean([np.sqrt(e.mean()) for e in sq]))
    assert s["pooled_rmse"] < 0.5 * s["task_mean_rmse"]
    yy = np.concatenate(y)
    assert s["pooled_explained_variance"] == pytest.approx(1 - np.concatenate(sq).mean() / yy.var())


def test_json_table_csv_and_report_use_the_same_names(tmp_path, online_run):
    _, online_out, online_test, _, _ = online_run
    runs = []
    for regression in (False, True):
        out, test, *_ = unequal_tasks(tmp_path, regression)
        metrics = evaluate_json(out, test)
        keys = list(metrics["summary"])
        assert set(keys) <= set(SUMMARY_KEYS) and not set(keys) & set(OLD_SUMMARY_NAMES)
        assert all(k.startswith(("pooled_", "task_mean_", "n_")) for k in keys)
        assert set(text_summary(evaluate_text(out, test))) == set(keys)
        # the result file's test metrics carry the same names (written here as a training run writes them)
        res = store.read_result(out)
        store.write_result(out, res["model"]["W"], None, {"round": np.arange(1, 3)}, res["config"], 1, "test",
                           task_names=res["model"]["task_names"], test=metrics)
        assert set(store.read_result(out)["test"]["summary"]) == set(keys)
        runs.append((out, metrics["summary"]))
    online_keys = set(evaluate_json(online_out, online_test)["summary"])
    assert {"inf_error_rate", "one_error_rate", "pooled_error_rate", "task_mean_error_rate"} <= online_keys
    assert set(store.read_result(online_out)["test"]["summary"]) == online_keys
    report = tmp_path / "report"
    r = run_hpcmtl(["report", runs[0][0], runs[1][0], online_out, "--out", report, "--csv"])
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(report / "test-metrics.csv")))
    header = list(rows[0])
    assert header[0] == "run" and set(header[1:]) == set(runs[0][1]) | set(runs[1][1]) | online_keys
    by_run = {row["run"]: row for row in rows}
    for out, summary in runs:
        for key, value in summary.items():
            assert float(by_run[str(out)][key]) == pytest.approx(value), key
    md = (report / "report.md").read_text()
    for name in ("pooled_error_rate 0.0476", "task_mean_error_rate 0.5000", "pooled_rmse", "task_mean_rmse",
                 "inf_error_rate"):
        assert name in md, name


def test_old_result_files_with_the_old_names_still_load_and_report(tmp_path):
    out, test, *_ = unequal_tasks(tmp_path)
    new = evaluate_json(out, test)["summary"]
    old = {"n_tasks": 2, "n_samples": 105, "error_rate": new["task_mean_error_rate"],
           "pooled_error_rate": new["pooled_error_rate"], "auc": new["task_mean_auc"]}
    old_reg = {"n_tasks": 2, "n_samples": 105, "rmse": 1.5, "mse": 2.25, "explained_variance": 0.25,
               "task_mean_rmse": 2.0, "task_mean_explained_variance": 0.1}
    paths = []
    for name, summary in (("old.h5", old), ("old-reg.h5", old_reg)):
        path = tmp_path / name
        store.write_result(path, np.zeros((3, 2)), None, {"round": np.arange(1, 3)}, {"method": "stl"}, 1, "0.1",
                           task_names=["small", "big"], test={"tasks": [{"name": "small", "n": 5}],
                                                             "summary": {}})
        with h5py.File(path, "r+") as f:                   # exactly what the earlier hpcmtl wrote
            f["test"].attrs["summary"] = json.dumps(summary, sort_keys=True)
        paths.append(path)
    assert store.read_result(paths[0])["test"]["summary"] == {
        "n_tasks": 2, "n_samples": 105, "task_mean_error_rate": new["task_mean_error_rate"],
        "pooled_error_rate": new["pooled_error_rate"], "task_mean_auc": new["task_mean_auc"]}
    assert store.read_result(paths[1])["test"]["summary"] == {
        "n_tasks": 2, "n_samples": 105, "pooled_rmse": 1.5, "pooled_mse": 2.25, "pooled_explained_variance": 0.25,
        "task_mean_rmse": 2.0, "task_mean_explained_variance": 0.1}
    report = tmp_path / "report"
    r = run_hpcmtl(["report", *paths, "--out", report, "--csv"])
    assert r.returncode == 0, r.stderr
    md = (report / "report.md").read_text()
    assert f"task_mean_error_rate {new['task_mean_error_rate']:.4f}" in md and "pooled_rmse 1.5000" in md
    header = next(csv.reader(open(report / "test-metrics.csv")))
    assert "task_mean_error_rate" in header and "pooled_rmse" in header and "error_rate" not in header
