"""Shared fixtures: real mpiexec launches, the ../shared data folder, small datasets."""
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")


def mpiexec_path():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else "mpiexec"


def run_hpcmtl(args, n_ranks=None, timeout=180, cwd=None, env=None):
    """Run ``[mpiexec -n K] python -m hpcmtl ARGS`` as a real subprocess."""
    cmd = [sys.executable, "-m", "hpcmtl"] + [str(a) for a in args]
    if n_ranks is not None:
        cmd = [mpiexec_path(), "-n", str(n_ranks)] + cmd
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=full_env)


@pytest.fixture
def shared_data():
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
