"""SLURM job scripts: golden files, quoting, and the lam sweep run locally with a fake sbatch."""
import os
import subprocess
import sys

import pytest

from hpcmtl import jobs, store
from hpcmtl.errors import InputError

from conftest import ROOT, fake_slurm, run_hpcmtl

EXAMPLE = {"train": "data/train.h5", "out": "results/run.h5"}
GOLDEN = {
    "train.sbatch": ("train", dict(EXAMPLE, test="data/test.h5")),
    "preemptible.sbatch": ("preemptible", EXAMPLE),
    "multinode.sbatch": ("multinode", EXAMPLE),
    "sweep.sh": ("sweep", {"train": "data/train.h5", "test": "data/test.h5", "prefix": "results/sweep",
                           "lams": "1e-4 1e-3 1e-2"}),
}


def write_tool(directory, name, body):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write("#!/bin/bash\n" + body)
    os.chmod(path, 0o755)


@pytest.mark.parametrize("fname", sorted(GOLDEN))
def test_shipped_jobs_are_the_rendered_templates_and_parse(fname):
    name, values = GOLDEN[fname]
    text = jobs.render(name, values)
    assert text == open(os.path.join(ROOT, "jobs", fname)).read()
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    assert "{{" not in text


def test_values_are_quoted_so_they_arrive_verbatim(tmp_path):
    hostile = "my data/train $(touch pwned) 'x'.h5"
    script = tmp_path / "job.sbatch"
    r = run_hpcmtl(["jobs", "render", "train", "--set", f"train={hostile}", "--set", "out=r.h5",
                    "--set", "test=t.h5", "--out", script])
    assert r.returncode == 0, r.stderr
    bindir = tmp_path / "bin"
    bindir.mkdir()
    write_tool(bindir, "srun", 'printf "%s\\n" "$@" > "$ARGS_FILE"\n')
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", ARGS_FILE=str(tmp_path / "args"))
    assert subprocess.run(["bash", str(script)], cwd=tmp_path, env=env).returncode == 0
    args = (tmp_path / "args").read_text().splitlines()
    assert args[args.index("--train") + 1] == hostile
    assert not (tmp_path / "pwned").exists()


def test_render_errors():
    with pytest.raises(InputError, match=r"only letters, digits and _.:/@%\+=,- are allowed here"):
        jobs.render("train", dict(EXAMPLE, test="t", time="1:00; rm -rf /"))
    with pytest.raises(InputError, match=r"template 'train' has no parameter 'lamda'.*Did you mean 'lam'\?"):
        jobs.render("train", dict(EXAMPLE, test="t", lamda="1"))
    with pytest.raises(InputError, match=r"template 'train' needs --set test=\.\.\."):
        jobs.render("train", EXAMPLE)
    with pytest.raises(InputError, match=r"unknown job template 'trian'.*Did you mean 'train'\?"):
        jobs.render("trian", {})
    r = run_hpcmtl(["jobs", "render", "sweep", "--set", "prefix"])
    assert r.returncode == 2 and "--set takes key=value" in r.stderr


@pytest.mark.mpi
def test_lam_sweep_runs_locally_with_a_fake_sbatch(tmp_path):
    tr, te = tmp_path / "tr.h5", tmp_path / "te.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--test", te, "--scale", "0.03"]).returncode == 0
    script = tmp_path / "sweep.sh"
    r = run_hpcmtl(["jobs", "render", "sweep", "--set", f"train={tr}", "--set", f"test={te}",
                    "--set", f"prefix={tmp_path}/out dir/sweep", "--set", "lams=1e-3 1e-2 1e-1",
                    "--set", "method=stl", "--out", script])
    assert r.returncode == 0, r.stderr
    (tmp_path / "out dir").mkdir()
    bindir = fake_slurm(tmp_path / "bin")
    env = dict(os.environ, SBATCH_LOG=str(tmp_path / "sbatch.log"),
               PATH=f"{bindir}{os.pathsep}{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "submitted array job 4242 with 3 values of lam" in r.stdout
    lams = [store.read_result(tmp_path / "out dir" / f"sweep-{i}.h5")["config"]["lam"] for i in range(3)]
    assert lams == [1e-3, 1e-2, 1e-1]
    assert (tmp_path / "out dir" / "sweep-report" / "report.md").exists()
    log = (tmp_path / "sbatch.log").read_text().splitlines()
    assert log[0].startswith("0-2|")                                        # the array first ...
    assert [line for line in log if line.startswith("|")][0].startswith("|hpcmtl report")   # ... then collection
