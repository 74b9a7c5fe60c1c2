"""Every ```bash block of docs/*.md runs as written (in a temporary folder, with ../shared)."""
import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, SHARED_DATA, fake_slurm

pytestmark = pytest.mark.mpi
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def bash_blocks(path):
    return re.findall(r"```bash\n(.*?)```", open(path, encoding="utf-8").read(), re.S)


RUNNABLE = [p for p in DOCS if bash_blocks(p)]          # pages that show commands


def test_docs_exist():
    names = {os.path.basename(p) for p in RUNNABLE}
    assert {"tutorial-school.md", "formats.md", "cli.md", "cluster.md", "math.md"} <= names   # all show commands


@pytest.mark.parametrize("path", RUNNABLE, ids=[os.path.basename(p) for p in RUNNABLE])
def test_doc_commands_run(path, tmp_path, shared_data):
    script = "\n".join(bash_blocks(path)).replace("../shared/data", SHARED_DATA)
    script = script.replace("python experiments/", f"python {ROOT}/experiments/")
    bindir = fake_slurm(str(tmp_path / ".bin"))
    env = dict(os.environ, PATH=os.pathsep.join([bindir, os.path.dirname(sys.executable), os.environ["PATH"]]))
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, f"{os.path.basename(path)}:\n{r.stderr[-3000:]}"
