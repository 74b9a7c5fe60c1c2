"""Reports and summaries a reader does not misread (issue 38): the job's seconds beside the refit's, a CV choice
said in report.md, the task-correlation plot in cluster order with a sample for many tasks."""
import numpy as np
import pytest

from hpcmtl import store
from hpcmtl.results import correlation_order

from conftest import run_hpcmtl


def block_correlation(sizes, seed=0):
    """A correlation matrix of blocks (1 inside, 0 across), rows shuffled: (C, group of each task)."""
    groups = np.repeat(np.arange(len(sizes)), sizes)
    C = (groups[:, None] == groups[None, :]).astype(float) * 0.8 + np.eye(len(groups)) * 0.2
    perm = np.random.default_rng(seed).permutation(len(groups))
    return C[np.ix_(perm, perm)], groups[perm]


def test_correlation_order_puts_related_tasks_together():
    C, groups = block_correlation([5, 7, 4])
    order, caption = correlation_order(C)
    assert sorted(order.tolist()) == list(range(16))
    runs = 1 + np.count_nonzero(np.diff(groups[order]))
    assert runs == 3                                  # each block one contiguous run
    assert "cluster order" in caption and "sample" not in caption


def test_correlation_order_samples_many_tasks():
    C, groups = block_correlation([40, 50, 30], seed=1)
    order, caption = correlation_order(C, limit=60)
    assert len(order) == 60 and len(set(order.tolist())) == 60
    assert "a random sample of 60 of the 120 tasks" in caption
    assert 1 + np.count_nonzero(np.diff(groups[order])) == 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("report-user")
    tr, te = d / "s1.h5", d / "s1t.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--test", te, "--scale", "0.03"]).returncode == 0
    cv = run_hpcmtl(["train", "dmtrl", "--train", tr, "--test", te, "--out", d / "cv.h5", "--loss", "logistic",
                     "--lam-grid", "1e-3:1e-1:3", "--cv", "2", "--outer", "2"])
    assert cv.returncode == 0, cv.stderr
    one = run_hpcmtl(["train", "stl", "--train", tr, "--out", d / "stl.h5", "--loss", "logistic", "--lam", "1e-2"])
    assert one.returncode == 0, one.stderr
    return d, cv.stdout, one.stdout


def summary_rows(stdout):
    return {line[:line.index("  ")]: line[line.index("  "):].strip() for line in stdout.splitlines()
            if "  " in line and not line.startswith(("round", "hpcmtl"))}


def test_every_summary_gives_the_job_and_the_refit_seconds(runs):
    d, cv_out, stl_out = runs
    cv = store.read_result(d / "cv.h5")
    t = cv["timing"]
    assert t["train_seconds"] == pytest.approx(cv["history"]["seconds"][-1])
    assert t["selection_seconds"] == pytest.approx(np.sum(cv["path"]["seconds"]))
    assert t["job_seconds"] > t["train_seconds"] + t["selection_seconds"]
    rows = summary_rows(cv_out)
    assert rows["seconds"] == f"{t['train_seconds']:.2f} (the refit at the chosen value)"
    assert rows["job seconds"].startswith(f"{t['job_seconds']:.2f} (the whole command; the grid's fold fits "
                                          f"{t['selection_seconds']:.2f})")
    one = store.read_result(d / "stl.h5")["timing"]
    assert "selection_seconds" not in one and one["job_seconds"] >= one["train_seconds"]
    assert summary_rows(stl_out)["job seconds"] == f"{one['job_seconds']:.2f} (the whole command)"


def test_report_says_the_job_seconds_and_when_lam_was_chosen_by_cv(runs):
    d, _, _ = runs
    r = run_hpcmtl(["report", d / "cv.h5", d / "stl.h5", "--out", d / "rep"])
    assert r.returncode == 0, r.stderr
    md = (d / "rep" / "report.md").read_text()
    cv = store.read_result(d / "cv.h5")
    chosen = cv["config"]["selection"]["chosen_lam"]
    assert chosen in cv["path"]["lam"]
    assert (f"- cv.h5: lam {chosen:.4g} was chosen by 2-fold cross-validation (validation error) over the grid "
            f"0.1, 0.01, 0.001; the grid's fold fits took {cv['timing']['selection_seconds']:.2f} s, the whole job "
            f"{cv['timing']['job_seconds']:.2f} s") in md
    row = next(line for line in md.splitlines() if line.startswith("| cv.h5"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[2] == f"{cv['history']['seconds'][-1]:.2f}" and cells[3] == f"{cv['timing']['job_seconds']:.2f}"
    assert "stl.h5: lam" not in md                     # a run at a given lam says nothing of a choice
    assert (d / "rep" / "task-correlation.png").stat().st_size > 0


def test_omega_steps_are_where_the_outer_step_changes(runs):
    from hpcmtl.results import omega_step_rounds
    d, _, _ = runs
    h = store.read_result(d / "cv.h5")["history"]
    expected = [int(h["round"][k]) for k in range(1, len(h["round"])) if h["outer"][k] != h["outer"][k - 1]]
    assert omega_step_rounds(h) == expected and len(expected) >= 1
    assert omega_step_rounds({"round": np.arange(1, 4), "outer": np.zeros(3)}) == []


@pytest.mark.mpi
def test_the_mb_moved_panel_plots_a_grids_refit_not_its_cv_path(tmp_path):
    """Under mpiexec a CV grid's refit history counts every byte the path moved before it (5.4 MB before a 0.6 MB
    refit on this data): the panel plots the refit's own bytes (history minus /path/selection_bytes) and states
    the path's total in its title."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from hpcmtl import results
    tr = tmp_path / "tr.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--scale", "0.04", "--seed", "5"]).returncode == 0
    common = ["--loss", "hinge", "--tol", "1e-6", "--outer", "2", "--outer-tol", "0", "--quiet"]
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", tmp_path / "cv.h5", "--lam-grid", "1e-3:1e-1:3",
                    "--cv", "3", *common], n_ranks=3)
    assert r.returncode == 0, r.stderr
    res = store.read_result(tmp_path / "cv.h5")
    before, h = int(res["path"]["selection_bytes"]), res["history"]["bytes"]
    refit_total = int(h[-1]) - before
    assert 0 < refit_total < before                       # the path moved more than its refit
    assert int(h[0]) > before                             # the history counts the path's bytes too
    moved, path_mb = results.refit_bytes(res)
    assert path_mb == before / 1e6 and np.array_equal(moved, h - before)
    titles = []
    real_save = results._save

    def keep_titles(plt_, fig, written, name, path, **kw):      # the figure as report draws it, before it closes
        titles.extend((ax.get_title(), ax.get_xlabel(), [ln.get_xdata() for ln in ax.get_lines()])
                      for ax in fig.axes)
        real_save(plt_, fig, written, name, path, **kw)
    results._save = keep_titles
    try:
        results.report([tmp_path / "cv.h5"], tmp_path / "rep")
    finally:
        results._save = real_save
        plt.close("all")
    title, xlabel, lines = next(t for t in titles if t[1].startswith("MB moved"))
    assert f"its grid's path moved {before / 1e6:.3g} MB before the refit" in title
    assert xlabel == "MB moved (a grid: its refit)"
    assert np.array_equal(lines[0], (h - before) / 1e6) and lines[0].max() < before / 1e6


def test_the_online_legend_names_the_output_code():
    """An online run's curve is labelled with its update, norm, C and output code (issue 38: the legend omitted
    the code, so two ECOC runs drew alike)."""
    from hpcmtl.results import _label
    res = {"config": {"method": "online", "update": "implicit", "norm": "rmax", "r": 2, "C": 1.0, "code": "ecoc-15"}}
    assert _label("a/run.h5", res) == "run.h5 (online, implicit, r-max r=2, C 1, code ecoc-15)"
    del res["config"]["code"]
    assert _label("a/run.h5", res) == "run.h5 (online, implicit, r-max r=2, C 1)"
