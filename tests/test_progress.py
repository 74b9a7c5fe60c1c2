"""Rank 0's progress output: live line on a terminal, throttled lines in a log, levels."""
import io
import math

import pytest

from hpcmtl import store
from hpcmtl.progress import Progress, describe, fields

from conftest import run_hpcmtl


def rows(n):
    return [{"round": r, "outer": 0, "primal": 1.0 + 10.0 ** -r, "dual": 1.0, "gap": 10.0 ** -r,
             "rel_gap": 10.0 ** -r, "seconds": 0.1 * r, "bytes": 1000 * r} for r in range(1, n + 1)]


@pytest.mark.smoke
def test_terminal_gets_one_live_line_with_a_bar():
    out = io.StringIO()
    p = Progress("info", tol=1e-6, stream=out, tty=True)
    for row in rows(6):
        p(row)
    p.close()
    text = out.getvalue()
    assert text.count("\r") == 6 and text.endswith("\n") and text.count("\n") == 1
    assert "[####################] round     6" in text           # gap reached the tolerance: full bar
    assert "[....................] round     1" in text


def test_log_gets_plain_lines_throttled_and_the_last_one():
    out = io.StringIO()
    p = Progress("info", every_seconds=3600, stream=out, tty=False)
    for row in rows(5):
        p(row)
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("round     1") and lines[1].startswith("round     5")
    quiet = io.StringIO()
    p = Progress("warning", stream=quiet, tty=False)
    p(rows(1)[0])
    p.close()
    assert quiet.getvalue() == ""


def test_log_keeps_the_last_line_of_every_outer_step():
    out = io.StringIO()
    p = Progress("info", every_seconds=3600, stream=out, tty=False)
    for outer in range(3):
        for row in rows(4):
            p(dict(row, outer=outer, round=10 * outer + row["round"]))
    p.close()
    rounds = [int(line.split()[1]) for line in out.getvalue().splitlines()]
    assert rounds == [1, 4, 14, 24]      # first line, then where each W-step ended (the last one at close)
    every = io.StringIO()
    p = Progress("info", every_seconds=0, stream=every, tty=False)
    for row in rows(7):
        p(row)
    p.close()
    assert len(every.getvalue().splitlines()) == 7


def test_fields_read_every_kind_of_line_back():
    dmtrl = {"round": 60, "outer": 1, "primal": 1.25, "dual": -3e-05, "rel_gap": 1.5e-3, "seconds": 12.5,
             "bytes": 2.5e6}
    online = {"round": 7, "n_rounds": 2000, "cumulative_loss": 12.5, "inf_error_rate": 0.25, "one_error_rate": 0.125,
              "multiclass_error_rate": 0.5, "seconds": 1.5, "bytes": 0}
    l1inf = {"round": 3, "objective": math.inf, "best_objective": 2.5, "selected": 12, "seconds": 1e5, "bytes": 1e3}
    assert fields(describe(dmtrl)) == {"round": 60, "outer": 1, "primal": 1.25, "dual": -3e-05, "rel_gap": 1.5e-3,
                                       "seconds": 12.5, "MB": 2.5}
    assert fields(describe(online)) == {"round": 7, "n_rounds": 2000, "loss": 12.5, "inf-error": 0.25,
                                        "1-error": 0.125, "multiclass": 0.5, "seconds": 1.5, "MB": 0.0}
    assert fields(describe(l1inf)) == {"round": 3, "objective": math.inf, "best": 2.5, "features": 12,
                                       "seconds": 1e5, "MB": 0.001}
    assert fields("\r[####................] " + describe(dmtrl)) == fields(describe(dmtrl))     # a terminal's line
    for other in ("hpcmtl: error: rank 1 of 3: round 13, task 'a' (#0): NaN", "rounds 60", "", "result file r.h5"):
        assert fields(other) == {}


def progress_rows(stdout):
    return [f for f in map(fields, stdout.splitlines()) if f]


@pytest.mark.slow
def test_cli_log_is_throttled_by_default_and_every_round_on_request(tmp_path):
    tr = tmp_path / "tr.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--scale", "0.03"]).returncode == 0
    base = ["train", "dmtrl", "--train", tr, "--lam", "1e-3", "--loss", "hinge", "--outer", "3", "--force",
            "--tol", "1e-8"]
    default = run_hpcmtl(base + ["--out", tmp_path / "a.h5"])
    every = run_hpcmtl(base + ["--out", tmp_path / "b.h5", "--progress-seconds", "0"])
    assert default.returncode == 0 and every.returncode == 0, default.stderr + every.stderr
    per_round, logged = progress_rows(every.stdout), progress_rows(default.stdout)
    outers = {f["outer"] for f in per_round}
    taken = {int(o) for o in store.read_result(str(tmp_path / "b.h5"))["wsteps"]["outer"]}
    assert len(per_round) > 20 and outers == taken and len(outers) >= 2      # every W-step's lines (at most --outer)
    # one line at the start, one where each W-step ended (a run this short takes under 10 s)
    assert len(logged) <= 1 + len(outers) and {f["outer"] for f in logged} == outers
    final = ("round", "outer", "primal", "dual", "rel_gap")
    assert [logged[-1][k] for k in final] == [per_round[-1][k] for k in final]   # the same final round


@pytest.fixture
def stl_run(tmp_path):
    tr = tmp_path / "tr.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--scale", "0.03"]).returncode == 0
    return ["train", "stl", "--train", tr, "--lam", "1e-2", "--loss", "logistic", "--force"]


@pytest.mark.slow
def test_cli_levels_and_summary_table(stl_run, tmp_path):
    info = run_hpcmtl(stl_run + ["--out", tmp_path / "a.h5"]).stdout
    assert "rel_gap" in info and "rounds " in info and "result file" in info
    warn = run_hpcmtl(stl_run + ["--out", tmp_path / "b.h5", "--log-level", "warning"]).stdout
    assert "rel_gap " not in warn and "result file" in warn


@pytest.mark.mpi
def test_cli_quiet_prints_nothing_on_any_rank(stl_run, tmp_path):
    quiet = run_hpcmtl(stl_run + ["--out", tmp_path / "c.h5", "--quiet"], n_ranks=2)
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""


def test_quiet_still_says_when_the_model_is_not_certified(tmp_path):
    tr = tmp_path / "tr.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--scale", "0.03"]).returncode == 0
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", tmp_path / "o.h5", "--loss", "hinge", "--lam", "1e-4",
                    "--outer", "2", "--outer-tol", "0", "--max-rounds", "5", "--tol", "1e-9", "--quiet",
                    "--local-steps", "1", "--local-solver", "sdca"])   # (exact steps certify the first W-step at once)
    assert r.returncode == 0 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and "2 of 2 W-steps ended unconverged" in lines[0] and "not certified" in lines[0], r.stderr
    assert "joint relative gap" in lines[1] and "> --outer-tol 0" in lines[1] and "not certified" in lines[1]
