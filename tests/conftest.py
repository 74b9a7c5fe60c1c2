"""Shared fixtures: real mpiexec launches, the ../shared data folder, small datasets."""
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")


# Markers (registered in pyproject.toml): ``mpi`` for a test that launches mpiexec, ``slow`` for one
# that takes more than a few seconds without it, ``shared_data`` for one reading ../shared/data, ``smoke``
# for the chosen set of ``make test-fast``.  A test launching mpiexec, or taking the shared_data fixture,
# without its marker fails (see ``mpiexec_path``, ``shared_data``) rather than slip into ``-m "not mpi"``.
RUNNING = {"marks": None}        # the markers of the test being set up, run or torn down


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    RUNNING["marks"] = {m.name for m in item.iter_markers()}


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    RUNNING["marks"] = None


def mpiexec_path():
    if RUNNING["marks"] is not None and "mpi" not in RUNNING["marks"]:
        pytest.fail("this test launches mpiexec: mark it @pytest.mark.mpi (-m 'not mpi' leaves those out)")
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else "mpiexec"


def one_error_line(r):
    """The one non-blank line a refused command writes to stderr (fails the test if there are more or none)."""
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


def file_digest(path):
    """SHA-256 of a file's bytes: an input that must come out of a refused command unchanged."""
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run_hpcmtl(args, n_ranks=None, timeout=180, cwd=None, env=None):
    """Run ``[mpiexec -n K] python -m hpcmtl ARGS`` as a real subprocess."""
    cmd = [sys.executable, "-m", "hpcmtl"] + [str(a) for a in args]
    if n_ranks is not None:
        cmd = [mpiexec_path(), "-n", str(n_ranks)] + cmd
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=full_env)


def learned_hinge_args(train, out, lam, outer, *extra):
    """``train dmtrl`` with a learned Sigma: hinge, tol 1e-6 on every W-step, ``outer`` W-steps (outer-tol 0)."""
    return ["train", "dmtrl", "--train", train, "--out", out, "--loss", "hinge", "--lam", lam, "--tol", "1e-6",
            "--outer", outer, "--outer-tol", "0", "--quiet", "--force", *extra]


def assert_certified_ascent(h):
    """Every history row: finite, P >= D, and the dual never decreasing within a W-step."""
    assert np.all(np.isfinite(h["primal"])) and np.all(np.isfinite(h["dual"]))
    assert np.all(h["primal"] - h["dual"] >= -1e-12 * np.abs(h["primal"]))              # P >= D every row
    for outer in np.unique(h["outer"]):
        dual = h["dual"][h["outer"] == outer]
        assert np.all(np.diff(dual) >= -1e-12 * np.abs(dual[1:])), f"the dual decreased in W-step {outer}"


def assert_fits_agree(a, b, loss, lam, top, certified_only, w_rel=1e-10):
    """Two fits of one problem through two Sigma forms (dense against factors or a sparse graph kernel).
    ``certified_only`` (the box QPs of the two forms part at the Newton-CG's tolerance): both certified and the
    primals within 2 tol, and W within what the two certificates allow: P is (lam / top)-strongly convex in W, top
    = lambda_max(Sigma), so ``||W - W*|| <= sqrt(2 gap top / lam)`` for each.  Else: the same rounds, W to
    ``w_rel`` of its size (logistic: 1e-8, W flat for the objective in some directions, as in
    tests/test_many_tasks.py), primal, dual and gap to 1e-10."""
    from numpy.testing import assert_allclose
    if certified_only:
        for r in (a, b):                     # each certified: P - D <= tol P, so the primals agree to 2 tol
            assert r.history["gap"][-1] <= 1e-8 * r.history["primal"][-1]
        assert abs(a.history["primal"][-1] - b.history["primal"][-1]) <= 2e-8 * a.history["primal"][-1]
        bound = sum(np.sqrt(2 * r.history["gap"][-1] * top / lam) for r in (a, b))
        assert np.linalg.norm(b.W - a.W) <= bound
        return
    assert np.array_equal(a.history["round"], b.history["round"])
    scale = np.abs(a.W).max() * (1e-8 if loss == "logistic" else w_rel)
    assert_allclose(b.W, a.W, rtol=0, atol=scale)
    for key in ("primal", "dual"):
        assert_allclose(b.history[key], a.history[key], rtol=1e-10, atol=1e-12)
    assert_allclose(b.history["gap"], a.history["gap"], rtol=0, atol=1e-10 * np.abs(a.history["primal"]).max())


def assert_resume_is_bitwise(args, out, ref, kill_round, saved_round, keys=("round", "primal", "dual", "step")):
    """Train ``args`` (writing ``out``) at P = 3 killed in round ``kill_round`` (HPCMTL_FAULT): no result, the
    checkpoint at ``saved_round``; ``--resume`` at P = 2 then gives ``ref``'s W and history ``keys`` bitwise."""
    from hpcmtl import store
    killed = run_hpcmtl(args, n_ranks=3, timeout=120, env={"HPCMTL_FAULT": f"1:{kill_round}:kill"})
    assert killed.returncode != 0 and not os.path.exists(out)
    assert store.read_checkpoint(str(out) + ".checkpoint.h5")["counters"]["round"] == saved_round
    r = run_hpcmtl(list(args) + ["--resume"], n_ranks=2, timeout=300)
    assert r.returncode == 0, r.stderr
    res = store.read_result(out)
    assert res["model"]["W"].tobytes() == ref["model"]["W"].tobytes()
    for key in keys:
        assert res["history"][key].tobytes() == ref["history"][key].tobytes(), key
    return res


def metrics_during_and_after(train_args, out, test_path, n_ranks):
    """Train (``train_args`` with ``--test``, under mpiexec) and ``hpcmtl evaluate`` the saved model on the same
    test file: ``(summary reported during training, summary of evaluate)``."""
    import json
    from hpcmtl import store
    r = run_hpcmtl(train_args, n_ranks=n_ranks, timeout=180)
    assert r.returncode == 0, r.stderr
    during = store.read_result(out)["test"]["summary"]
    ev = run_hpcmtl(["evaluate", out, test_path, "--json"])
    assert ev.returncode == 0, ev.stderr
    return during, json.loads(ev.stdout)["summary"]


def run_hpcmtl_timed(args, n_ranks, report, timeout=180, env=None):
    """``run_hpcmtl`` (under mpiexec unless ``n_ranks`` is None) and the seconds from the first stderr line
    containing ``report`` to the end of the job (None if no line did).

    How fast every rank ends once a failure is reported, without MPI start-up or the work before the report
    (both slow on a loaded machine) in the time.
    """
    import tempfile
    import threading
    import time
    cmd = [sys.executable, "-m", "hpcmtl"] + [str(a) for a in args]
    if n_ranks is not None:
        cmd = [mpiexec_path(), "-n", str(n_ranks)] + cmd
    err, reported = [], []

    def read_stderr(stream):
        for line in stream:
            err.append(line)
            if not reported and report in line:
                reported.append(time.monotonic())

    with tempfile.TemporaryFile("w+") as out:          # a file, not a pipe: stdout can never block the job
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, **(env or {})))
        reader = threading.Thread(target=read_stderr, args=(proc.stderr,), daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        ended = time.monotonic()
        reader.join(timeout=30)
        out.seek(0)
        result = subprocess.CompletedProcess(cmd, proc.returncode, out.read(), "".join(err))
    return result, (ended - reported[0] if reported else None)


@pytest.fixture
def shared_data():
    if RUNNING["marks"] is not None and "shared_data" not in RUNNING["marks"]:
        pytest.fail("this test reads ../shared/data: mark it @pytest.mark.shared_data "
                    "(-m 'not shared_data' leaves those out)")
    if not os.path.isdir(SHARED_DATA):
        pytest.skip("../shared/data is not beside this checkout (a user's fresh clone); CI has it")
    return SHARED_DATA


def random_tasks(seed=0, m=4, d=6, sizes=(30, 45, 25, 40), sparse=False, loss="hinge", density=0.4):
    """Small related tasks: a shared direction plus task noise."""
    import scipy.sparse as sp
    rng = np.random.default_rng(seed)
    base = rng.normal(size=d)
    Xs, ys = [], []
    for i in range(m):
        n = sizes[i % len(sizes)]
        w = base * (1 if i % 2 == 0 else -1) + 0.5 * rng.normal(size=d)
        X = rng.normal(size=(n, d))
        if sparse:
            X = X * (rng.uniform(size=X.shape) < density)
        z = X @ w
        y = z + 0.3 * rng.normal(size=n) if loss == "squared" else np.where(z + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
        Xs.append(sp.csr_matrix(X) if sparse else X)
        ys.append(y)
    return Xs, ys


FAKE_SBATCH = """#!/bin/bash
# stand-in for sbatch: runs --wrap now (each array index in turn) and prints a job id
wrap=""; array=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wrap) wrap="$2"; shift 2;;
    --array=*) array="${1#--array=}"; shift;;
    *) shift;;
  esac
done
[ -n "${SBATCH_LOG:-}" ] && echo "$array|$wrap" >> "$SBATCH_LOG"
if [ -n "$array" ]; then
  for i in $(seq "${array%-*}" "${array#*-}"); do SLURM_ARRAY_TASK_ID=$i bash -c "$wrap" >&2 || exit 1; done
else
  bash -c "$wrap" >&2 || exit 1
fi
echo 4242
"""


def fake_slurm(directory):
    """A bin folder with stand-ins for sbatch (runs jobs locally) and srun (runs the command)."""
    os.makedirs(directory, exist_ok=True)
    for name, body in (("sbatch", FAKE_SBATCH), ("srun", '#!/bin/bash\nexec "$@"\n')):
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write(body)
        os.chmod(path, 0o755)
    return directory


# ---------------------------------------------------------------------------
# The compiled kernels twice: optimized, and the same sources bounds-checked
# ---------------------------------------------------------------------------
# setup.py compiles every kernel source hpcmtl/<name>.pyx (KERNEL_USERS' keys) as hpcmtl.<name>_debug
# when HPCMTL_DEBUG_KERNELS=1 (boundscheck and initializedcheck on, wraparound off, -O0; the inline
# row interface and checks of _rows.pxd and the random numbers of _random.pxd compiled into them).
# They go to build/kernels-debug/<hash of the sources>/ (gitignored), built once per source
# hash under a lock, so the in-place optimized modules are never touched.
# each compiled module, and the modules calling it (their attribute of that name is the build under test)
KERNEL_USERS = {"_sdca": ("hpcmtl.dmtrl.worker", "hpcmtl.dmtrl.joint", "hpcmtl.dmtrl.interior_rounds",
                          "hpcmtl.baselines", "hpcmtl.checkpoint"),
                "_joint_terms": ("hpcmtl.dmtrl.joint", "hpcmtl.dmtrl.dual_phase"),
                "_blockops": ("hpcmtl.taskdata", "hpcmtl.dmtrl.steps", "hpcmtl.dmtrl.local_rounds", "hpcmtl.interior"),
                "_projections": ("hpcmtl.projection",),
                "_box_qp": ("hpcmtl.dmtrl.steps",),
                "_online": ("hpcmtl.online_rules", "hpcmtl.estimators", "hpcmtl.online")}
KERNEL_SOURCES = ("hpcmtl/_rows.pxd", "hpcmtl/_rows.pyx", "hpcmtl/_random.pxd", "hpcmtl/_losses.pxd", "setup.py",
                  *(f"hpcmtl/{name}.pyx" for name in KERNEL_USERS))


def debug_kernels_dir():
    import hashlib
    import sysconfig

    import Cython
    digest = hashlib.sha256()
    for rel in KERNEL_SOURCES:
        with open(os.path.join(ROOT, rel), "rb") as f:
            digest.update(f.read())
    digest.update(f"{sys.version}|{sysconfig.get_config_var('EXT_SUFFIX')}|{Cython.__version__}|"
                  f"{np.__version__}".encode())
    return os.path.join(ROOT, "build", "kernels-debug", digest.hexdigest()[:16])


def build_debug_kernels(timeout=900):
    """``{module: path}`` of the bounds-checked extensions, compiling them first if this source hash has none."""
    import fcntl
    import shutil
    import sysconfig
    out = debug_kernels_dir()
    paths = {name: os.path.join(out, "hpcmtl", name + "_debug" + sysconfig.get_config_var("EXT_SUFFIX"))
             for name in KERNEL_USERS}
    if not all(os.path.exists(p) for p in paths.values()):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(os.path.join(os.path.dirname(out), ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)                 # one build at a time, the others wait for it
            if not all(os.path.exists(p) for p in paths.values()):
                tmp = f"{out}.partial-{os.getpid()}"
                shutil.rmtree(tmp, ignore_errors=True)
                env = dict(os.environ, HPCMTL_DEBUG_KERNELS="1", HPCMTL_DEBUG_CYTHON_DIR=os.path.join(tmp, "c"))
                proc = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", tmp,
                                       "--build-temp", os.path.join(tmp, "obj")],
                                      cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
                if proc.returncode != 0:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise RuntimeError(f"the bounds-checked kernel build failed:\n{proc.stdout}\n{proc.stderr}")
                for old in os.listdir(os.path.dirname(out)):    # builds of older sources (we hold the lock)
                    if old != ".lock" and old != os.path.basename(tmp):
                        shutil.rmtree(os.path.join(os.path.dirname(out), old), ignore_errors=True)
                os.replace(tmp, out)
    return paths


@pytest.fixture(scope="session")
def debug_kernels():
    """``{"_sdca": hpcmtl._sdca_debug, ..., "_online": hpcmtl._online_debug}``: the kernels' sources compiled
    with bounds checks (an IndexError, not a silent overwrite, on any out-of-range view index)."""
    import importlib.util
    modules = {}
    for name, path in build_debug_kernels().items():
        full = f"hpcmtl.{name}_debug"
        if full not in sys.modules:
            spec = importlib.util.spec_from_file_location(full, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[full] = module
        modules[name] = sys.modules[full]
    return modules


@pytest.fixture(params=["optimized", "bounds-checked"])
def kernel_build(request, monkeypatch):
    """The compiled modules, optimized then bounds-checked; the modules calling them use the same build."""
    import importlib

    if request.param == "optimized":
        modules = {name: importlib.import_module(f"hpcmtl.{name}") for name in KERNEL_USERS}
    else:
        modules = request.getfixturevalue("debug_kernels")
    for name, users in KERNEL_USERS.items():
        for user in users:
            monkeypatch.setattr(importlib.import_module(user), name, modules[name])
    return modules


@pytest.fixture
def kernels(kernel_build):
    """The SDCA, outer-phase, row-sum, projection and box-QP kernels (``hpcmtl._sdca``, ``._joint_terms``,
    ``._blockops``, ``._projections``, ``._box_qp``) of the build under test, as one namespace: a test names a
    kernel, not its module."""
    import types
    names = {}
    for name in ("_sdca", "_joint_terms", "_blockops", "_projections", "_box_qp"):
        for attr, value in vars(kernel_build[name]).items():
            if not attr.startswith("_") and attr != "np":
                assert attr not in names, f"{attr} is in two kernel modules"
                names[attr] = value
    return types.SimpleNamespace(**names)


@pytest.fixture
def online_kernels(kernel_build):
    """``hpcmtl._online`` (tau solvers, online rounds) of the build under test."""
    return kernel_build["_online"]


def wsteps_certified(result):
    """Every W-step of a run reached --tol (a TrainResult, a fitted estimator or a read result file's dict):
    what `converged` meant before a learned Sigma also had to certify the joint gap (tests/test_joint.py)."""
    steps = result["wsteps"] if isinstance(result, dict) else getattr(result, "wsteps", None)
    if steps is None:
        steps = result.wsteps_
    return bool(len(steps["converged"]) and np.all(np.asarray(steps["converged"]) == 1))


def reuters_subset(shared_data, tmp_path, rows):
    """Reuters' topics (``--min-docs 200``) cut to each task's first ``rows`` training documents and the columns
    they use: ``(Xs, ys)``, CSR."""
    import scipy.sparse as sp
    from hpcmtl import store
    full = tmp_path / "reuters.h5"
    r = run_hpcmtl(["data", "convert", "--format", "reuters", os.path.join(shared_data, "reuters21578"), str(full),
                    "--min-docs", "200"])
    assert r.returncode == 0, r.stderr
    Xs, ys, _ = store.load_tasks(str(full))
    Xs = [sp.csr_matrix(X[:rows]) for X in Xs]
    used = np.unique(np.concatenate([X.indices for X in Xs]))
    return [X[:, used] for X in Xs], [y[:rows] for y in ys]
