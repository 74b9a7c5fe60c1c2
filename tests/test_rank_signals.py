"""One rank signalled, stopped or failing on the server: the job ends the way the docs promise (real mpiexec).

Issue 40, items 6, 8 and 21: a SIGTERM to one worker's pid stops the job like one to rank 0 (checkpoint,
exit 75, ``--resume`` bitwise); a SIGSTOPped worker ends the job through the watchdog (one line naming it,
exit 1, every rank gone, the checkpoint intact); ``HPCMTL_FAULT=0:ROUND`` fires on the server at P > 1.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from hpcmtl import store
from hpcmtl.cluster import WATCHDOG_SECONDS, Watch
from hpcmtl.progress import fields

from conftest import mpiexec_path, run_hpcmtl, run_hpcmtl_timed

pytestmark = pytest.mark.mpi

SETTINGS = ["--loss", "hinge", "--lam", "1e-2", "--tol", "1e-8", "--outer", "4"]    # 96 rounds: a signal at 30 lands


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranks")
    tr = d / "tr.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--scale", "0.05", "--seed", "2"]).returncode == 0
    ref = d / "reference.h5"
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", ref, "--quiet"] + SETTINGS, n_ranks=2)
    assert r.returncode == 0, r.stderr
    return tr, store.read_result(ref)


def same_model(path, reference):
    res = store.read_result(path)
    return (res["model"]["W"].tobytes() == reference["model"]["W"].tobytes()
            and res["model"]["Sigma"].tobytes() == reference["model"]["Sigma"].tobytes()
            and res["history"]["round"][-1] == reference["history"]["round"][-1])


def rank_pids(root):
    """{MPI rank: pid} of the ranks mpiexec (pid ``root``) started: its descendants with PMI_RANK set."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except OSError:
                pass
    ranks, todo = {}, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            env = {}
        if b"PMI_RANK" in env:
            ranks[int(env[b"PMI_RANK"])] = pid
        todo += parents.get(pid, [])
    return ranks


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_and_signal(args, rank, signum, at_round=30):
    """Start ``train`` at P = 3, wait for the progress line of ``at_round``, send ``signum`` to ``rank``'s pid
    only; returns (proc, the rank pids, the time it was sent)."""
    cmd = [mpiexec_path(), "-n", "3", sys.executable, "-m", "hpcmtl"] + [str(a) for a in args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    for _ in range(5000):
        line = proc.stdout.readline()
        if not line or fields(line).get("round", 0) >= at_round:
            break
    assert fields(line).get("round", 0) >= at_round, "the run ended before it could be signalled"
    pids = rank_pids(proc.pid)
    assert sorted(pids) == [0, 1, 2], pids
    os.kill(pids[rank], signum)
    return proc, pids, time.monotonic()


def finish(proc, timeout=60):
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return out, err


def ours(err):
    return [line for line in err.splitlines() if line.startswith("hpcmtl:")]


@pytest.mark.parametrize("rank,signame", [(2, "SIGTERM"), (1, "SIGUSR1")])
def test_a_signal_to_one_worker_stops_the_job_like_one_to_rank_0(data, tmp_path, rank, signame):
    """Before: the worker swallowed it, the job ran to the end and exited 0 (item 8)."""
    tr, reference = data
    out = tmp_path / "r.h5"
    args = ["train", "dmtrl", "--train", tr, "--out", out, "--progress-seconds", "0"] + SETTINGS
    proc, _, sent = start_and_signal(args, rank, getattr(signal, signame))
    _, err = finish(proc)
    assert proc.returncode == 75, err
    assert time.monotonic() - sent < 10
    (line,) = ours(err)
    assert f"hpcmtl: rank {rank} received {signame}: checkpoint written to" in line and "--resume" in line
    assert not out.exists()
    saved = store.read_checkpoint(str(out) + ".checkpoint.h5")["counters"]["round"]
    assert 30 <= saved < reference["history"]["round"][-1]
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", out, "--quiet", "--resume"] + SETTINGS, n_ranks=2)
    assert r.returncode == 0, r.stderr
    assert same_model(out, reference)


def test_a_stopped_worker_ends_the_job_naming_it_and_the_checkpoint_resumes(data, tmp_path):
    """Before: SIGSTOP of rank 2 left ranks 0 and 1 waiting forever (item 6)."""
    tr, reference = data
    out = tmp_path / "r.h5"
    args = ["train", "dmtrl", "--train", tr, "--out", out, "--progress-seconds", "0", "--checkpoint-every", "5",
            "--watchdog", "2"] + SETTINGS
    proc, pids, sent = start_and_signal(args, 2, signal.SIGSTOP)
    try:
        _, err = finish(proc, timeout=90)
        waited = time.monotonic() - sent
        for _ in range(50):                  # the launcher's SIGKILLs land, the orphans are reaped
            left = [rank for rank, pid in pids.items() if alive(pid)]
            if not left:
                break
            time.sleep(0.1)
    finally:
        for pid in pids.values():            # never leave a stopped rank behind, whatever happened
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 1, err
    assert waited < 2 + 5 + 10, waited       # the limit, the ping's grace, the abort
    (line,) = ours(err)
    assert line.startswith("hpcmtl: fatal error: rank 2 of 3 did not answer after the job waited "), line
    assert "stopped or wedged" in line and "checkpoint is intact" in line
    assert left == [], f"ranks {left} outlived the job"
    assert not out.exists()
    saved = store.read_checkpoint(str(out) + ".checkpoint.h5")["counters"]["round"]
    assert saved >= 25 and saved % 5 == 0              # the last one before the stop at round 30 or later
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", out, "--quiet", "--resume"] + SETTINGS, n_ranks=3)
    assert r.returncode == 0, r.stderr
    assert same_model(out, reference)


def test_a_healthy_run_under_a_tiny_watchdog_is_unchanged(data, tmp_path):
    """Every wait past 1 ms pings the workers, who answer: the run goes on and its model is the same bits."""
    tr, reference = data
    out = tmp_path / "r.h5"
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", out, "--quiet", "--watchdog", "0.001"] + SETTINGS,
                   n_ranks=3, env={"HPCMTL_MPI_WAIT": "sleep"})
    # (only the outer loop's own warning: 4 W-steps do not certify the learned Sigma at --outer-tol)
    assert r.returncode == 0 and all("joint relative gap" in line for line in r.stderr.splitlines()), r.stderr
    assert same_model(out, reference)


def test_the_watchdog_limit_scales_with_the_slowest_wait():
    watch = Watch()
    assert watch.limit() == WATCHDOG_SECONDS == 300.0
    watch.waited(12.0)
    watch.waited(3.0)
    assert watch.limit() == 300.0
    watch.waited(45.5)
    assert watch.limit() == 455.0                  # ten times the slowest wait seen
    watch.seconds = 0
    assert watch.limit() == float("inf")           # --watchdog 0: never


@pytest.mark.parametrize("value", ["-1", "nan", "x"])
def test_a_bad_watchdog_is_refused_in_one_line(data, tmp_path, value):
    tr, _ = data
    r = run_hpcmtl(["train", "dmtrl", "--train", tr, "--out", tmp_path / "r.h5", "--lam", "1", "--watchdog", value])
    assert r.returncode == 2 and "--watchdog" in r.stderr and not (tmp_path / "r.h5").exists()


def test_an_injected_fault_on_the_server_ends_every_rank_with_one_line(data, tmp_path):
    """Before: HPCMTL_FAULT=0:ROUND never fired at P > 1 (rank 0 owns no block): the run ended with 0 (item 21)."""
    tr, _ = data
    out = tmp_path / "r.h5"
    r, after = run_hpcmtl_timed(["train", "dmtrl", "--train", tr, "--out", out, "--quiet", "--checkpoint-every", "5"]
                                + SETTINGS, 3, "injected fault", env={"HPCMTL_FAULT": "0:7"})
    assert r.returncode == 1, r.stderr
    assert after is not None and after < 10
    (line,) = ours(r.stderr)
    assert "hpcmtl: fatal error on rank 0 of 3" in line and "injected fault (HPCMTL_FAULT=0:7)" in line
    assert not out.exists()
    assert store.read_checkpoint(str(out) + ".checkpoint.h5")["counters"]["round"] == 5


def test_a_killed_server_ends_every_rank(data, tmp_path):
    tr, _ = data
    out = tmp_path / "r.h5"
    r, after = run_hpcmtl_timed(["train", "dmtrl", "--train", tr, "--out", out, "--quiet"] + SETTINGS, 3,
                                "injected kill", env={"HPCMTL_FAULT": "0:7:kill"})
    assert r.returncode != 0 and after is not None and after < 10, (r.returncode, after, r.stderr)
    assert "hpcmtl: rank 0: injected kill" in r.stderr and not out.exists()
