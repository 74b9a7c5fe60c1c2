"""Every ```bash block of docs/*.md runs as written (in a temporary folder, with ../shared)."""
import glob
import os
import re
import subprocess
import sys

import pytest

import numpy as np

from hpcmtl.store import write_tasks

from conftest import ROOT, SHARED_DATA, fake_slurm

DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def bash_blocks(path):
    return re.findall(r"```bash\n(.*?)```", open(path, encoding="utf-8").read(), re.S)


RUNNABLE = [p for p in DOCS if bash_blocks(p)]          # pages that show commands


def test_docs_exist():
    names = {os.path.basename(p) for p in RUNNABLE}
    assert {"tutorial-school.md", "formats.md", "cli.md", "cluster.md", "math.md"} <= names   # all show commands


def test_docs_pipe_only_hpcmtl_into_head():
    """The blocks run under pipefail: ``X | head`` passes only if X exits 0 when head closes the pipe, as
    hpcmtl does (a ``python -c`` printing more than head reads dies of BrokenPipeError, exit 1)."""
    for path in RUNNABLE:
        for block in bash_blocks(path):
            for line in block.splitlines():
                for producer, consumer in zip(line.split("|"), line.split("|")[1:]):
                    if consumer.split()[:1] == ["head"]:
                        assert producer.split()[:1] == ["hpcmtl"], f"{os.path.basename(path)}: {line}"


def test_hpcmtl_stops_quietly_when_head_closes_the_pipe(tmp_path):
    path = str(tmp_path / "many.h5")
    n = 600                                           # long names: ~90 kB of `data info`, more than a pipe holds
    write_tasks(path, [np.ones((1, 1))] * n, [np.ones(1)] * n, names=[f"task-{i:04d}-" + "x" * 100 for i in range(n)])
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", f"{sys.executable} -m hpcmtl data info {path} | head -1"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(path) and r.stderr == "", r.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("path", RUNNABLE, ids=[os.path.basename(p) for p in RUNNABLE])
def test_doc_commands_run(path, tmp_path, shared_data):
    script = "\n".join(bash_blocks(path)).replace("../shared/data", SHARED_DATA)
    script = script.replace("python experiments/", f"python {ROOT}/experiments/")
    bindir = fake_slurm(str(tmp_path / ".bin"))
    env = dict(os.environ, PATH=os.pathsep.join([bindir, os.path.dirname(sys.executable), os.environ["PATH"]]))
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, f"{os.path.basename(path)}:\n{r.stderr[-3000:]}"
