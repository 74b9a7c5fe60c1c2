"""Result analysis: results.load, CSV export, hpcmtl report."""
import csv
import os

import numpy as np
import pytest

from hpcmtl import results, store

from conftest import run_hpcmtl


@pytest.mark.slow
def test_report_and_csv_for_dmtrl_and_l1inf_runs(tmp_path):
    tr, te = tmp_path / "tr.h5", tmp_path / "te.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--test", te, "--scale", "0.04"]).returncode == 0
    runs = []
    for method in ("stl", "dmtrl"):
        out = tmp_path / f"{method}.h5"
        r = run_hpcmtl(["train", method, "--train", tr, "--test", te, "--out", out, "--loss", "logistic",
                        "--lam", "1e-2", "--quiet"])
        assert r.returncode == 0, r.stderr
        runs.append(out)
    js, js_te = tmp_path / "js.h5", tmp_path / "js-te.h5"
    assert run_hpcmtl(["data", "synth", "joint-sparse", js, "--test", js_te, "--n-train", "10"]).returncode == 0
    assert run_hpcmtl(["train", "l1inf", "--train", js, "--out", tmp_path / "l1inf.h5", "--radius", "5",
                       "--max-rounds", "10", "--quiet"]).returncode == 0
    runs.append(tmp_path / "l1inf.h5")
    loaded = results.load(runs[1])
    assert isinstance(loaded["model"]["W"], np.ndarray) and loaded["config"]["method"] == "dmtrl"
    out_dir = tmp_path / "report"
    r = run_hpcmtl(["report", *runs, "--out", out_dir, "--csv"])
    assert r.returncode == 0, r.stderr
    for name in ("gap.png", "objective.png", "sparsity.png", "task-correlation.png", "report.md",
                 "dmtrl-history.csv"):
        assert os.path.getsize(out_dir / name) > 0, name
    md = (out_dir / "report.md").read_text()
    assert md.count("| ") >= 3 and "dmtrl.h5 (dmtrl, lam 0.01)" in md and "pooled_error_rate" in md and "task_mean_error_rate" in md
    rows = list(csv.DictReader(open(out_dir / "dmtrl-history.csv")))
    h = store.read_result(runs[1])["history"]
    assert len(rows) == len(h["round"]) and float(rows[-1]["rel_gap"]) == h["rel_gap"][-1]
    r = run_hpcmtl(["report", tmp_path / "missing.h5", "--out", out_dir])
    assert r.returncode == 2 and "missing.h5: no such file" in r.stderr


@pytest.mark.slow
def test_report_draws_cumulative_online_errors(tmp_path):
    s = tmp_path / "s.h5"
    assert run_hpcmtl(["data", "synth", "multilabel-stream", s, "--scale", "0.1"]).returncode == 0
    runs = []
    for norm in ("linf", "l1"):
        out = tmp_path / f"{norm}.h5"
        r = run_hpcmtl(["train", "online", "--stream", s, "--out", out, "--norm", norm, "--C", "0.05", "--quiet"])
        assert r.returncode == 0, r.stderr
        runs.append(out)
    out_dir = tmp_path / "report"
    r = run_hpcmtl(["report", *runs, "--out", out_dir, "--csv"])
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(out_dir / "online-errors.png") > 0
    md = (out_dir / "report.md").read_text()
    h = store.read_result(runs[0])["history"]
    assert "linf.h5 (online, implicit, linf, C 0.05)" in md and f"inf-error {h['inf_error'].mean():.4f}" in md
    rows = list(csv.DictReader(open(out_dir / "linf-history.csv")))
    assert len(rows) == 2000 and int(rows[-1]["n_errors"]) == h["n_errors"][-1]


def test_report_csv_keeps_runs_named_alike_in_different_folders_apart(tmp_path):
    """`report a/r.h5 b/r.h5 --csv` wrote both histories to r-history.csv: the second replaced the first."""
    tr = tmp_path / "tr.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--scale", "0.02"]).returncode == 0
    runs = []
    for folder, lam in (("a", "1e-1"), ("b", "1e-2")):
        (tmp_path / folder).mkdir()
        out = tmp_path / folder / "r.h5"
        r = run_hpcmtl(["train", "stl", "--train", tr, "--out", out, "--lam", lam, "--quiet"])
        assert r.returncode == 0, r.stderr
        runs.append(out)
    out_dir = tmp_path / "report"
    r = run_hpcmtl(["report", *runs, "--out", out_dir, "--csv"])
    assert r.returncode == 0, r.stderr
    for folder, run in zip("ab", runs):
        rows = list(csv.DictReader(open(out_dir / f"{folder}-r-history.csv")))
        h = store.read_result(run)["history"]
        assert len(rows) == len(h["round"]) and float(rows[-1]["primal"]) == h["primal"][-1]
    assert not (out_dir / "r-history.csv").exists()
    assert results.history_csv_names(["x/y/r.h5", "z/y/r.h5", "c.h5"]) == [
        "x-y-r-history.csv", "z-y-r-history.csv", "c-history.csv"]
