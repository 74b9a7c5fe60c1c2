"""The collectives of hpcmtl.cluster, one by one: the serial backend in this process (P = 1, no MPI) and the
MPI backend under real ``mpiexec -n 2`` and ``-n 3`` (each rank checks what it got, the server also what the
byte counter says).  The same checks (:data:`EXERCISE`) run under both."""
import os
import subprocess
import sys

import numpy as np
import pytest

from hpcmtl.cluster import Cluster, SerialCluster, displacements, plan_blocks

from conftest import ROOT, mpiexec_path

# Every collective with known inputs; every rank asserts its part, the server returns the bytes it expects
# its collectives to have counted.  Used in-process (serial) and as the script of the mpiexec runs.
EXERCISE = r'''
import numpy as np
from hpcmtl.cluster import AgreedError, plan_blocks


def exercise(c):
    P, rank, server = c.size, c.rank, c.is_server
    expected_bytes = 0
    to_others = P - 1                                   # a broadcast reaches the other ranks
    moves = P > 1                                       # the serial backend moves nothing

    # per-block rows, under a plan that cuts task 1 into two parts (the plan is a view, the cluster stays bare)
    plan = plan_blocks([3, 8, 2, 4, 1], [3.0, 12.0, 2.0, 4.0, 1.0], c.n_workers, split_large=True)
    pc = c.planned(plan)
    assert not c.is_planned and c.blocks == () and pc.is_planned
    width = 3
    rows = np.array([[b.task, b.start, b.worker] for b in plan], dtype=np.float64)
    mine = pc.scatter_block_rows(rows if server else None, width)
    want = np.array([[b.task, b.start, b.worker] for b in pc.my_blocks], dtype=np.float64).reshape(-1, width)
    assert mine.tobytes() == want.tobytes(), (rank, mine, want)
    back = pc.gather_block_rows(mine * 2.0 + 0.5, width)
    if server:
        assert back.shape == (len(plan), width) and back.tobytes() == (rows * 2.0 + 0.5).tobytes()
    else:
        assert back is None
    expected_bytes += 2 * 8 * width * len(plan) * moves
    totals = pc.rank_totals([b.n_rows for b in plan])
    assert totals.tolist() == [sum(b.n_rows for b in plan if pc.worker_rank(b.worker) == r) for r in range(P)]

    # a second plan at the same time: each view keeps its own (no call order to get right)
    other = c.planned(plan_blocks([1] * 4, [1.0] * 4, c.n_workers))
    assert pc.blocks == tuple(plan) and len(other.blocks) == 4
    assert len(pc.scatter_block_rows(rows if server else None, width)) == len(pc.my_blocks)
    expected_bytes += 8 * width * len(plan) * moves

    # counted vectors: every rank knows every length, rank r holds r + 1 values (the server too)
    counts = np.arange(1, P + 1, dtype=np.int64)
    local = rank + np.arange(counts[rank]) / 10.0
    every = np.concatenate([r + np.arange(counts[r]) / 10.0 for r in range(P)])
    got = c.gather_counted(local, counts)
    assert (got.tobytes() == every.tobytes()) if server else got is None
    piece = c.scatter_counted(every if server else None, counts)
    assert piece.tobytes() == local.tobytes()
    expected_bytes += 2 * 8 * int(counts.sum()) * moves
    try:
        c.gather_counted(np.zeros(counts[rank] + 1), counts)
    except ValueError as exc:
        assert f"rank {rank}: {counts[rank] + 1} values to gather, {counts[rank]} expected" in str(exc)
    else:
        raise AssertionError("a wrong local length must be refused before anything travels")

    # variable-length vectors: the sizes travel too (rank r sends 2r values, gets r + 1)
    got = c.gather_variable(np.arange(2.0 * rank))
    if server:
        assert [g.tolist() for g in got] == [list(np.arange(2.0 * r)) for r in range(P)]
    else:
        assert got is None
    piece = c.scatter_variable([np.arange(r + 1.0) for r in range(P)] if server else None)
    assert piece.tolist() == list(np.arange(rank + 1.0))
    expected_bytes += (8 * P + 8 * sum(2 * r for r in range(P)) + 8 * P + 8 * sum(r + 1 for r in range(P))) * moves

    # a shared array, small objects, the control
    shared = c.bcast_array(np.array([1.5, -2.25, 3.0]) if server else None, (3,))
    assert shared.tolist() == [1.5, -2.25, 3.0]
    expected_bytes += 3 * 8 * to_others
    sent = {"plan": plan, "x": [1, 2]}
    obj = c.bcast_object(sent if server else None)
    assert obj == sent and obj is not sent                  # a copy, as mpi4py hands the root too
    objects = c.gather_objects((rank, [rank]))
    assert (objects == [(r, [r]) for r in range(P)]) if server else objects is None
    if server:
        ctrl = c.send_command(7, 1, 2, 3)
    else:
        ctrl = c.receive_command()
    assert ctrl.tolist() == [7, 1, 2, 3] and ctrl.dtype == np.int64
    expected_bytes += 4 * 8 * to_others

    # failing together: the first error in rank order, on every rank
    c.agree(None)
    try:
        c.agree(f"bad data on rank {rank}" if rank in (P - 1, P // 2) else None)
    except AgreedError as exc:
        assert str(exc) == f"bad data on rank {P // 2}", str(exc)
    else:
        raise AssertionError("agree must raise on every rank")
    c.barrier()

    # one counter for the cluster and its views
    assert pc.bytes_moved == other.bytes_moved == c.bytes_moved
    if server:
        assert c.bytes_moved == expected_bytes, (c.bytes_moved, expected_bytes)
    return c.bytes_moved


if __name__ == "__main__":
    from hpcmtl.cluster import MPICluster, connect
    cluster = connect()
    assert isinstance(cluster, MPICluster)
    moved = exercise(cluster)
    import os, sys        # one file a rank: the launcher interleaves the ranks' stdout, even within a line
    with open(os.path.join(sys.argv[1], f"rank-{cluster.rank}.txt"), "w") as f:
        f.write(f"rank {cluster.rank} of {cluster.size}: ok ({moved} bytes)\n")
'''


def exercise_here(cluster):
    namespace = {"__name__": "exercise"}
    exec(compile(EXERCISE, "exercise", "exec"), namespace)
    return namespace["exercise"](cluster)


@pytest.mark.smoke
def test_every_collective_at_one_rank_on_the_serial_backend():
    cluster = Cluster.serial()
    assert isinstance(cluster, SerialCluster)
    assert (cluster.size, cluster.rank, cluster.is_server, cluster.my_worker, cluster.n_workers) == (1, 0, True, 0, 1)
    assert exercise_here(cluster) == 0


def test_the_serial_backend_hands_over_what_one_rank_has():
    c = Cluster.serial().planned(plan_blocks([2, 3], [2.0, 3.0], 1))
    rows = np.arange(6.0).reshape(2, 3)
    got = c.gather_block_rows(rows, 3)
    assert got.tobytes() == rows.tobytes() and got is not rows
    assert c.scatter_block_rows(rows, 3).tobytes() == rows.tobytes()
    assert c.gather_variable(np.arange(3.0))[0].tolist() == [0.0, 1.0, 2.0]
    assert c.scatter_variable([[1, 2]]).tolist() == [1.0, 2.0]
    assert c.gather_counted(np.arange(4.0), [4]).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert c.scatter_counted(np.arange(2.0), [2]).tolist() == [0.0, 1.0]
    with pytest.raises(RuntimeError, match="no server"):
        c.receive_command()
    assert c.bytes_moved == 0


@pytest.mark.smoke
def test_displacements():
    assert displacements(np.array([3, 0, 2], dtype=np.int64)).tolist() == [0, 3, 3]
    assert displacements(np.array([5], dtype=np.int64)).tolist() == [0]


def test_a_planned_view_shares_the_byte_counter_and_leaves_the_cluster_unplanned():
    c = Cluster.serial()
    a = c.planned(plan_blocks([2, 2], [1.0, 1.0], 1))
    a.bytes_moved = 40                          # a checkpoint's figure restored through a server's view
    a.moved(2)
    assert c.bytes_moved == 42 and not c.is_planned and c.my_blocks == ()
    assert a.my_blocks == a.blocks and a.block_counts.tolist() == [2]


def test_a_server_needs_a_planned_cluster():
    from hpcmtl.engine import ServerBase
    from hpcmtl.estimators import MemoryTasks
    source = MemoryTasks([np.ones((2, 2))], [np.ones(2)])
    with pytest.raises(ValueError, match="planned cluster"):
        ServerBase(Cluster.serial(), source)
    assert len(ServerBase(Cluster.serial().planned(plan_blocks([2], [4.0], 1)), source).blocks) == 1


NO_MPI4PY = ("import sys\n"
             "sys.modules['mpi4py'] = None          # import mpi4py raises ImportError\n"
             "from hpcmtl.cluster import connect, SerialCluster\n"
             "try:\n"
             "    print(type(connect()).__name__)\n"
             "except ImportError:\n"
             "    print('ImportError')\n")


def launcher_free_env(**extra):
    from hpcmtl.cluster.failure import LAUNCHER_RANK_VARIABLES
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_RANK_VARIABLES}
    env.update(extra)
    return env


@pytest.mark.parametrize("launched, expected", [(False, "SerialCluster"), (True, "ImportError")])
def test_without_mpi4py_a_process_no_launcher_started_runs_serial(launched, expected):
    env = launcher_free_env(**({"PMI_RANK": "1"} if launched else {}))
    r = subprocess.run([sys.executable, "-c", NO_MPI4PY], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == expected


def test_a_training_job_without_mpi4py_runs_serial_to_the_same_model(tmp_path):
    """``hpcmtl train`` without mpiexec and without mpi4py: the serial backend, the same bits as with mpi4py."""
    from hpcmtl import store
    from conftest import run_hpcmtl
    tr = tmp_path / "tr.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--scale", "0.02", "--seed", "5"]).returncode == 0
    args = ["train", "dmtrl", "--train", str(tr), "--loss", "hinge", "--lam", "1e-2", "--tol", "1e-4", "--outer", "2",
            "--quiet", "--force", "--out"]
    r = run_hpcmtl(args + [tmp_path / "with.h5"])
    assert r.returncode == 0, r.stderr
    code = "import sys; sys.modules['mpi4py'] = None; from hpcmtl.cli import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", code, *args, str(tmp_path / "without.h5")], capture_output=True,
                       text=True, timeout=180, cwd=ROOT, env=launcher_free_env())
    assert r.returncode == 0, r.stderr
    a, b = store.read_result(tmp_path / "with.h5"), store.read_result(tmp_path / "without.h5")
    assert b["n_ranks"] == 1
    assert a["model"]["W"].tobytes() == b["model"]["W"].tobytes()
    assert a["history"]["primal"].tobytes() == b["history"]["primal"].tobytes()


def test_a_training_job_no_launcher_started_never_imports_mpi4py(tmp_path):
    """``hpcmtl train`` without mpiexec is one process: the serial backend, with mpi4py installed but never
    imported (MPI not initialized); under ``mpiexec -n 1`` (a launcher's variable set) it still connects."""
    from conftest import run_hpcmtl
    tr = tmp_path / "tr.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--scale", "0.02", "--seed", "5"]).returncode == 0
    code = ("import sys\n"
            "from hpcmtl.cli import main\n"
            "code = main(sys.argv[1:])\n"
            "print('mpi4py' in sys.modules, 'mpi4py.MPI' in sys.modules)\n"
            "sys.exit(code)\n")
    args = ["train", "stl", "--train", str(tr), "--loss", "hinge", "--lam", "1e-2", "--quiet", "--force", "--out",
            str(tmp_path / "stl.h5")]
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=180, cwd=ROOT,
                       env=launcher_free_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=180, cwd=ROOT,
                       env=launcher_free_env(SLURM_PROCID="0"))          # a batch step without srun: MPI, size 1
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"]


@pytest.mark.smoke
def test_the_serial_backend_never_imports_mpi4py():
    code = ("import sys\n"
            "from hpcmtl.cluster import Cluster\n"
            "import hpcmtl.engine, hpcmtl.dmtrl, hpcmtl.model_selection, hpcmtl.online\n"
            "Cluster.serial().agree(None)\n"
            "print('mpi4py' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


@pytest.mark.mpi
@pytest.mark.parametrize("n_ranks", [pytest.param(2, marks=pytest.mark.smoke), 3])    # (make test-fast's mpiexec run)
def test_every_collective_under_mpiexec(tmp_path, n_ranks):
    script = tmp_path / "exercise.py"
    script.write_text(EXERCISE)
    r = subprocess.run([mpiexec_path(), "-n", str(n_ranks), sys.executable, str(script), str(tmp_path)],
                       capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = sorted(p.read_text().strip() for p in tmp_path.glob("rank-*.txt"))
    assert [line.split(":")[0] for line in lines] == [f"rank {k} of {n_ranks}" for k in range(n_ranks)], r.stdout
