"""The README's five-minute tour runs as written (in a temporary directory)."""
import os
import re
import subprocess
import sys

import pytest

from hpcmtl import store

from conftest import ROOT, SHARED_DATA

pytestmark = pytest.mark.mpi


def tour_commands():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = re.search(r"## Five-minute tour\s+```bash\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if not line.startswith("source ")]


@pytest.mark.shared_data
def test_readme_tour_runs(tmp_path, shared_data):
    script = "\n".join(tour_commands()).replace("../shared/data", SHARED_DATA)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    for name in ("dmtrl.h5", "school-dmtrl.h5", "js-result.h5", "months-cycle.h5"):
        assert store.read_result(tmp_path / name)["model"]["W"].size > 0
    assert store.read_result(tmp_path / "school-dmtrl.h5")["history"]["rel_gap"][-1] <= 1e-6
    assert list(store.read_result(tmp_path / "js-result.h5")["path"]["radius"]) == [5.0, 10.0, 20.0]
    assert (tmp_path / "report" / "report.md").exists() and (tmp_path / "report" / "gap.png").exists()
