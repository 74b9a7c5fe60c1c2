"""`hpcmtl evaluate` and the one metric naming scheme (pooled_* vs task_mean_*).

Every expected number is computed here with NumPy from the stored W, never by the code under test.
"""
import csv
import json

import h5py
import numpy as np
import pytest

from hpcmtl import store
from hpcmtl.metrics import OLD_SUMMARY_NAMES, SUMMARY_KEYS

from conftest import run_hpcmtl


def evaluate_json(result, test):
    r = run_hpcmtl(["evaluate", result, test, "--json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def evaluate_text(result, test):
    r = run_hpcmtl(["evaluate", result, test])
    assert r.returncode == 0, r.stderr
    return r.stdout


def text_summary(text):
    """{row label: value} of the summary rows (after the blank line) of the evaluate table."""
    rows = text.split("\n\n", 1)[1].split("\n")
    return {line.split()[0]: float(line.split()[1]) for line in rows if line.strip()}


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


def test_json_table_csv_and_report_use_the_same_names(tmp_path):
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
    report = tmp_path / "report"
    r = run_hpcmtl(["report", runs[0][0], runs[1][0], "--out", report, "--csv"])
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(report / "test-metrics.csv")))
    header = list(rows[0])
    assert header[0] == "run" and set(header[1:]) == set(runs[0][1]) | set(runs[1][1])
    by_run = {row["run"]: row for row in rows}
    for out, summary in runs:
        for key, value in summary.items():
            assert float(by_run[str(out)][key]) == pytest.approx(value), key
    md = (report / "report.md").read_text()
    for name in ("pooled_error_rate 0.0476", "task_mean_error_rate 0.5000", "pooled_rmse", "task_mean_rmse"):
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
