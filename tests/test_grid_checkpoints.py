"""Grids that checkpoint, resume and honour signals (issue 38 "Jobs", issue 40 item 7).

A lam grid (``--lam-grid``, ``--lam a,b``, ``--cv``) or a radius path with validation writes the path's state at
its fits' safe points (a termination signal, ``--checkpoint-every``, ``--checkpoint-seconds``) and exits 75;
``--resume`` gives the same choice, scores and refit as a run that was never stopped, bitwise.  In process
(P = 1): a signal at every kind of place (an early fold, the last fold's later points whose warm starts the
refit takes, the refit); as commands: SIGINT of a serial grid, SIGTERM to one rank under mpiexec -n 3.
"""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from hpcmtl import store
from hpcmtl.checkpoint import PathCheckpointer
from hpcmtl.cluster import Cluster
from hpcmtl.dmtrl import DMTRLConfig
from hpcmtl.errors import InputError, Preempted
from hpcmtl.joint_sparse import JointSparseConfig
from hpcmtl.model_selection import Selection, train_path, train_radius_path

from conftest import mpiexec_path, one_error_line, run_hpcmtl


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("grid")
    tr = d / "tr.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--scale", "0.04", "--seed", "5"]).returncode == 0
    return tr


class SignalAt:
    """A SignalFlag stand-in that 'receives' SIGTERM at the ``at``-th safe point of the run (None: never); counts
    the safe points it was asked at."""

    def __init__(self, at=None):
        self.at, self.asked = at, 0

    @property
    def received(self):
        self.asked += 1
        return "SIGTERM" if self.at is not None and self.asked == self.at else None


def lam_run(tr, ck_path, selection, at=None, resume=False, config=None):
    source = store.TaskFile(str(tr))
    config = config or DMTRLConfig(loss="hinge", lam=0.1, tol=1e-6, outer=2, outer_tol=0.0)
    flag = SignalAt(at)
    ckpt = PathCheckpointer(ck_path, 0, 0.0, flag, config.to_dict(), source)
    sel = Selection(**selection).validate(config.loss)
    result = train_path(Cluster.serial(), source, config, sel, checkpointer=ckpt,
                        resume=str(ck_path) if resume else None)
    return result, flag


def same_path(a, b):
    assert a.W.tobytes() == b.W.tobytes() and a.Sigma.tobytes() == b.Sigma.tobytes()
    assert a.selection["chosen_index"] == b.selection["chosen_index"]
    for key in ("fold_scores", "validation_score", "rounds", "converged", "status"):
        assert np.asarray(a.path[key]).tobytes() == np.asarray(b.path[key]).tobytes(), key
    for key in ("primal", "dual", "round"):
        assert a.history[key].tobytes() == b.history[key].tobytes(), key


DMTRL = DMTRLConfig(loss="hinge", lam=0.1, tol=1e-6, outer=2, outer_tol=0.0)
STL = DMTRLConfig(loss="logistic", lam=0.1, tol=1e-6, relationship="identity")


@pytest.mark.parametrize("selection,config", [(dict(grid=[0.1, 0.01, 0.001], cv=3), DMTRL),
                                              # (at --tol: at the default looser fold gap its last point
                                              # has no safe point of its own to be preempted at)
                                              (dict(grid=[0.3, 0.03], validation_fraction=0.25, tol=0), DMTRL),
                                              (dict(grid=[0.1, 0.01, 0.001], cv=2), STL)])
def test_a_lam_grid_resumed_anywhere_is_the_uninterrupted_path(data, tmp_path, selection, config):
    """Preempted at every safe point of a small job, or at many spread over a larger one (the first fold, the
    last fold's later points, whose alpha the refit starts from, between two points, the refit itself), each
    resume gives the uninterrupted path and refit bitwise.  STL's points converge in a round or two: the safe
    point after each solved point is what stops them."""
    ref, counter = lam_run(data, tmp_path / "none.h5", selection, config=config)
    total = counter.asked
    assert total >= 6
    places = range(1, total + 1) if total <= 12 else sorted({2, total // 3, (2 * total) // 3, total - 3, total - 1})
    phases = set()
    for at in places:
        ck = tmp_path / f"at{at}.h5"
        with pytest.raises(Preempted):
            lam_run(data, ck, selection, at=at, config=config)
        info = store.read_checkpoint(str(ck))["grid"]["info"]
        phases.add((info["phase"], info["fold"], info["point"], bool(info.get("done"))))
        resumed, _ = lam_run(data, ck, selection, resume=True, config=config)
        same_path(resumed, ref)
    n_folds = selection.get("cv", 1)
    if config is DMTRL:
        assert any(p[0] == "refit" for p in phases), phases                  # a refit resumed from its own state
        assert any(p[0] == "fit" and p[1] == n_folds - 1 and p[2] > 0 for p in phases), phases   # snapshots kept
    else:                                                                   # between points, every fold, the last
        assert {p[1] for p in phases if p[3]} == set(range(n_folds)), phases
        assert any(p[3] and p[2] == len(selection["grid"]) - 1 for p in phases), phases


def test_a_grid_with_stopped_points_resumed_anywhere_is_the_uninterrupted_path(tmp_path):
    """A path whose rule stops the grid (issue 39: a fold's score fell three points in a row past its best):
    preempted before, at and after the stop (later folds skip the stopped points, a checkpoint after the stopping
    point carries the stop), each resume gives the uninterrupted path, statuses and refit bitwise; another
    --path-patience is refused."""
    from conftest import random_tasks
    Xs, ys = random_tasks(4, m=4, d=14, sizes=(24, 20, 30, 26), loss="logistic")
    tr = tmp_path / "tr.h5"
    store.write_tasks(str(tr), Xs, ys)
    selection = dict(grid=list(np.logspace(-4, 0, 9)), cv=3, metric="logloss")
    config = DMTRLConfig(loss="logistic", lam=0.1, tol=1e-6, relationship="identity")
    ref, counter = lam_run(tr, tmp_path / "none.h5", selection, config=config)
    stopped = int(np.count_nonzero(ref.path["status"] == 2))
    assert stopped >= 1
    total = counter.asked
    stops = set()
    for at in sorted({3, total // 3, total // 2, (2 * total) // 3, total - 2}):
        ck = tmp_path / f"at{at}.h5"
        with pytest.raises(Preempted):
            lam_run(tr, ck, selection, at=at, config=config)
        stops.add(store.read_checkpoint(str(ck))["grid"]["info"].get("stop_at"))
        resumed, _ = lam_run(tr, ck, selection, resume=True, config=config)
        same_path(resumed, ref)
    assert None in stops and len(selection["grid"]) - stopped in stops, stops    # before and after the stop
    with pytest.raises(InputError, match="the grid's 'patience' differs"):
        lam_run(tr, ck, dict(selection, patience=0), resume=True, config=config)


def test_a_grid_checkpoint_is_refused_for_another_grid_or_a_single_run(data, tmp_path):
    ck = tmp_path / "ck.h5"
    selection = dict(grid=[0.1, 0.01, 0.001], cv=3)
    with pytest.raises(Preempted):
        lam_run(data, ck, selection, at=5)
    with pytest.raises(InputError, match="the grid's 'grid' differs"):
        lam_run(data, ck, dict(grid=[0.1, 0.01], cv=3), resume=True)
    with pytest.raises(InputError, match="the grid's 'cv' differs"):
        lam_run(data, ck, dict(grid=[0.1, 0.01, 0.001], cv=4), resume=True)
    with pytest.raises(InputError, match="'loss' is 'hinge' in the checkpoint"):
        lam_run(data, ck, selection, resume=True, config=DMTRLConfig(loss="logistic", lam=0.1, tol=1e-6, outer=2))
    r = run_hpcmtl(["train", "dmtrl", "--train", data, "--out", tmp_path / "one.h5", "--loss", "hinge", "--lam",
                    "0.1", "--tol", "1e-6", "--outer", "2", "--outer-tol", "0", "--checkpoint", ck, "--resume"])
    assert r.returncode == 2 and "a checkpoint of a grid" in one_error_line(r)


def radius_run(tr, ck_path, at=None, resume=False):
    source = store.TaskFile(str(tr))
    config = JointSparseConfig(radius=1.0, loss="hinge", max_rounds=30).validate()
    flag = SignalAt(at)
    ckpt = PathCheckpointer(ck_path, 0, 0.0, flag, config.to_dict(), source)
    sel = Selection([0.5, 2.0, 8.0], cv=3, name="radius").validate(config.loss)
    result = train_radius_path(Cluster.serial(), source, config, sel, checkpointer=ckpt,
                               resume=str(ck_path) if resume else None)
    return result, flag


def test_a_radius_path_with_validation_resumed_anywhere_is_the_uninterrupted_one(data, tmp_path):
    ref, counter = radius_run(data, tmp_path / "none.h5")
    total = counter.asked
    phases = set()
    for at in sorted({5, total // 2, total - 5}):
        ck = tmp_path / f"at{at}.h5"
        with pytest.raises(Preempted):
            radius_run(data, ck, at=at)
        info = store.read_checkpoint(str(ck))["grid"]["info"]
        phases.add(info["phase"])
        resumed, _ = radius_run(data, ck, resume=True)
        assert resumed.W.tobytes() == ref.W.tobytes() and resumed.intercept.tobytes() == ref.intercept.tobytes()
        for key in ("fold_scores", "validation_score", "selected", "refit_selected"):
            assert np.asarray(resumed.path[key]).tobytes() == np.asarray(ref.path[key]).tobytes(), key
    assert phases == {"fit", "refit"}


# ---------------------------------------------------------------------------
# the command line: signals, --checkpoint-every, --resume
# ---------------------------------------------------------------------------
GRID = ["--loss", "hinge", "--lam-grid", "1e-4:1:5", "--cv", "3", "--tol", "1e-8", "--outer", "2", "--outer-tol",
        "0", "--progress-seconds", "0"]


def grid_args(tr, out, *extra, method="dmtrl"):
    return ["train", method, "--train", tr, "--out", out, *GRID, *extra]


def same_result(a, b):
    ra, rb = store.read_result(a), store.read_result(b)
    assert ra["model"]["W"].tobytes() == rb["model"]["W"].tobytes()
    assert ra["model"]["Sigma"].tobytes() == rb["model"]["Sigma"].tobytes()
    for key in ("validation_score", "fold_scores", "rounds"):
        assert ra["path"][key].tobytes() == rb["path"][key].tobytes(), key
    assert ra["history"]["primal"].tobytes() == rb["history"]["primal"].tobytes()


def signal_mid_grid(cmd, signum, after="(fold 2/", pick=lambda proc: proc.pid):
    """Start ``cmd``, wait for the first grid-point line of the given fold, send ``signum``; (rc, stdout, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("hpcmtl: path:") and after in line:
                os.kill(pick(proc), signum)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, "".join(seen) + out, err


@pytest.mark.parametrize("method", ["dmtrl", "stl"])
def test_sigint_of_a_serial_grid_checkpoints_and_resume_finishes_it(data, tmp_path, method):
    """Ctrl-C of a serial grid: exit 75 with one line, and --resume gives the uninterrupted result bitwise (STL's
    points end in a round or two: the safe point after a solved point stops it)."""
    ref = tmp_path / "ref.h5"
    r = run_hpcmtl(grid_args(data, ref, "--quiet", method=method))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out.h5"
    rc, _, err = signal_mid_grid([sys.executable, "-m", "hpcmtl"] + [str(a) for a in grid_args(data, out,
                                                                                                 method=method)],
                                 signal.SIGINT)
    assert rc == 75, err
    lines = [line for line in err.splitlines() if line.startswith("hpcmtl: error") or "SIGINT" in line]
    assert len(lines) == 1 and "received SIGINT: checkpoint written to" in lines[0], err
    assert not out.exists()
    info = store.read_checkpoint(str(out) + ".checkpoint.h5")["grid"]["info"]
    assert info["phase"] == "fit" and info["fold"] >= 1
    r = run_hpcmtl(grid_args(data, out, "--quiet", "--resume", method=method))
    assert r.returncode == 0, r.stderr
    same_result(out, ref)


def test_checkpoint_every_on_a_grid_writes_the_path_state(data, tmp_path):
    out = tmp_path / "out.h5"
    r = run_hpcmtl(grid_args(data, out, "--quiet", "--checkpoint-every", "5"))
    assert r.returncode == 0, r.stderr
    ck = store.read_checkpoint(str(out) + ".checkpoint.h5")
    assert ck["grid"]["info"]["phase"] == "refit" and ck["grid"]["arrays"]["fold_scores"].shape == (5, 3)
    r = run_hpcmtl(grid_args(data, tmp_path / "s.h5", "--quiet", "--checkpoint-seconds", "0.01"))
    assert r.returncode == 0, r.stderr
    assert store.read_checkpoint(str(tmp_path / "s.h5") + ".checkpoint.h5")["grid"] is not None


@pytest.mark.mpi
@pytest.mark.parametrize("rank", [0, 2])
def test_sigterm_to_a_rank_of_a_grid_under_mpiexec_then_resume(data, tmp_path, rank):
    """P = 3: SIGTERM to rank ``rank`` only, mid-grid -> exit 75 with one line, every rank gone; --resume at
    P = 3 gives the uninterrupted P = 3 path and refit bitwise."""
    from test_rank_signals import rank_pids
    ref = tmp_path / "ref.h5"
    r = run_hpcmtl(grid_args(data, ref, "--quiet"), n_ranks=3, timeout=300)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out.h5"
    cmd = [mpiexec_path(), "-n", "3", sys.executable, "-m", "hpcmtl"] + [str(a) for a in grid_args(data, out)]
    rc, _, err = signal_mid_grid(cmd, signal.SIGTERM, pick=lambda proc: rank_pids(proc.pid)[rank])
    assert rc == 75, err
    ours = [line for line in err.splitlines() if line.startswith("hpcmtl:") and "warning" not in line]
    assert len(ours) == 1 and "SIGTERM: checkpoint written to" in ours[0], err
    r = run_hpcmtl(grid_args(data, out, "--quiet", "--resume"), n_ranks=3, timeout=300)
    assert r.returncode == 0, r.stderr
    same_result(out, ref)


@pytest.mark.mpi
def test_a_grid_killed_at_p3_resumes_at_p2_to_the_uninterrupted_path(data, tmp_path):
    """A node failure (rank 1 SIGKILLed in a fit) after a --checkpoint-every checkpoint: the resume at another rank
    count (blocks re-cut by task, the warm starts stored per task) still gives the uninterrupted path bitwise (the
    path itself is the same at every rank count)."""
    ref = tmp_path / "ref.h5"
    assert run_hpcmtl(grid_args(data, ref, "--quiet"), n_ranks=2, timeout=300).returncode == 0
    out = tmp_path / "out.h5"
    killed = run_hpcmtl(grid_args(data, out, "--quiet", "--checkpoint-every", "4"), n_ranks=3, timeout=300,
                        env={"HPCMTL_FAULT": "1:9:kill"})
    assert killed.returncode != 0 and not out.exists()
    assert store.read_checkpoint(str(out) + ".checkpoint.h5")["grid"]["info"]["phase"] == "fit"
    r = run_hpcmtl(grid_args(data, out, "--quiet", "--resume"), n_ranks=2, timeout=300)
    assert r.returncode == 0, r.stderr
    same_result(out, ref)


def test_a_damaged_grid_checkpoint_is_refused_in_one_line(data, tmp_path):
    """A position out of the grid, a running fit's block gone, a missing path array: one line (exit 2), no
    traceback and no result."""
    import json
    import shutil
    import h5py
    out = tmp_path / "out.h5"
    r = run_hpcmtl(grid_args(data, out, "--quiet", "--checkpoint-every", "7", "--max-rounds", "50"))
    assert r.returncode == 0, r.stderr
    ck = str(out) + ".checkpoint.h5"
    os.remove(out)
    good = tmp_path / "good.h5"
    shutil.copy(ck, good)

    def damaged(edit, message):
        shutil.copy(good, ck)
        with h5py.File(ck, "r+") as f:
            edit(f)
        r = run_hpcmtl(grid_args(data, out, "--quiet", "--resume", "--max-rounds", "50"))
        assert r.returncode == 2 and message in one_error_line(r), r.stderr
        assert not out.exists()

    def position(f, **change):
        info = json.loads(f["path"].attrs["path"])
        info.update(change)
        f["path"].attrs["path"] = json.dumps(info)

    damaged(lambda f: position(f, phase="fit", fold=3), "the grid's position")
    damaged(lambda f: position(f, point=-1), "the grid's position")
    damaged(lambda f: f["blocks"].__delitem__(sorted(f["blocks"])[1]), "do not cover its")
    damaged(lambda f: f["path/arrays"].__delitem__("converged"), "an incomplete grid checkpoint")
    damaged(lambda f: f["path/arrays"].__delitem__("fold_scores"), "field 'path/arrays/fold_scores' has shape")


def test_a_graph_kernels_alpha_grid_resumes_and_refuses_another_graph(data, tmp_path):
    """train graph --alpha A,B,C: every point's Sigma is in the grid's must-match key; a node failure after a
    checkpoint resumes to the uninterrupted path, and the same checkpoint with another --graph is refused."""
    def args(out, graph="cycle", *extra):
        return ["train", "graph", "--graph", graph, "--alpha", "1,0.1,0.01", "--lam", "1e-2", "--train", data,
                "--loss", "hinge", "--cv", "3", "--tol", "1e-8", "--quiet", "--out", out, *extra]
    ref, out = tmp_path / "ref.h5", tmp_path / "out.h5"
    assert run_hpcmtl(args(ref)).returncode == 0
    killed = run_hpcmtl(args(out, "cycle", "--checkpoint-every", "4"), env={"HPCMTL_FAULT": "0:9:kill"})
    assert killed.returncode != 0 and not out.exists()
    r = run_hpcmtl(args(out, "chain", "--resume"))
    assert r.returncode == 2 and "the grid's 'sigmas' differs" in one_error_line(r)
    r = run_hpcmtl(args(out, "cycle", "--resume"))
    assert r.returncode == 0, r.stderr
    a, b = store.read_result(out), store.read_result(ref)
    assert a["model"]["W"].tobytes() == b["model"]["W"].tobytes()
    assert a["path"]["fold_scores"].tobytes() == b["path"]["fold_scores"].tobytes()
    assert a["config"]["selection"]["chosen_alpha"] == b["config"]["selection"]["chosen_alpha"]
