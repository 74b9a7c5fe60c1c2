"""SLURM job scripts: golden files, quoting, and the lam sweep run locally with a fake sbatch."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from hpcmtl import cli, jobs, store
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
    assert f"--train={hostile}" in args
    assert not (tmp_path / "pwned").exists()


@pytest.mark.smoke
def test_render_errors():
    with pytest.raises(InputError, match=r"The 'time' parameter of template 'train' must be a SLURM time"):
        jobs.render("train", dict(EXAMPLE, test="t", time="1:00; rm -rf /"))
    with pytest.raises(InputError, match=r"The 'job_name' parameter .* made of letters, digits and _.:/@%\+=,- only"):
        jobs.render("train", dict(EXAMPLE, test="t", job_name="a b"))
    with pytest.raises(InputError, match=r"template 'train' has no parameter 'lamda'.*Did you mean 'lam'\?"):
        jobs.render("train", dict(EXAMPLE, test="t", lamda="1"))
    with pytest.raises(InputError, match=r"template 'train' needs --set test=\.\.\."):
        jobs.render("train", EXAMPLE)
    with pytest.raises(InputError, match=r"unknown job template 'trian'.*Did you mean 'train'\?"):
        jobs.render("trian", {})
    r = run_hpcmtl(["jobs", "render", "sweep", "--set", "prefix"])
    assert r.returncode == 2 and "--set takes key=value" in r.stderr


def test_every_template_parameter_has_a_checked_kind():
    for name, (_, params) in jobs.templates().items():
        for key, (default, _) in params.items():
            assert key in jobs.KINDS, (name, key)
            if default != "-":
                jobs.check_value(key, default, name)


# --- values are data: hostile values run through every template and every nested shell ---------
HOSTILE = [
    "$(touch pwned)",
    "`touch pwned`",
    "x; touch pwned",
    "x && touch pwned #",
    "it's \"quoted\" \\ $HOME ~ * ? [a] {a,b} !! %s",
    "x' ; touch pwned ; '",
    "a'\\''b'\"'\"'c",
    "$'\\x41' ${IFS} $((1+1))",
    "--help",
    "-x",
    "tab\tin it",
    "données é ✓",
]

FAKE_TOOLS = {
    # srun: drop its own options, run the command
    "srun": 'while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n',
    # hpcmtl: record argv, one record per call (values are one line: newlines are refused at render)
    "hpcmtl": 'printf "%s\\n" "$@" >> "$ARGS_FILE"; echo "<end>" >> "$ARGS_FILE"\n',
    "scontrol": "exit 0\n",
}


def run_rendered(tmp_path, text, wrap_shell="bash"):
    """Run a rendered script with fake sbatch (runs --wrap with WRAP_SHELL -c), srun, scontrol, hpcmtl."""
    bindir = fake_slurm(tmp_path / "bin")
    sbatch = (bindir / "sbatch").read_text()
    assert sbatch.count("bash -c") == 2
    (bindir / "sbatch").write_text(sbatch.replace("bash -c", '"$WRAP_SHELL" -c'))
    for name, body in FAKE_TOOLS.items():
        write_tool(bindir, name, body)
    script = tmp_path / "job.sh"
    script.write_text(text)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", ARGS_FILE=str(tmp_path / "args"),
               WRAP_SHELL=wrap_shell, HOME=str(tmp_path / "home"))
    r = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    calls, call = [], []
    for line in (tmp_path / "args").read_text().split("\n")[:-1]:
        if line == "<end>":
            calls.append(call)
            call = []
        else:
            call.append(line)
    return calls


WRAP_SHELLS = ["bash"] + (["dash"] if shutil.which("dash") else [])


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("template", ["train", "preemptible", "multinode", "sweep"])
def test_hostile_values_arrive_verbatim_and_run_nothing(tmp_path, template, value):
    values = {"train": value, "test": value, "out": value, "prefix": value, "lams": "1e-3 2e-3"}
    params = jobs.templates()[template][1]
    text = jobs.render(template, {k: v for k, v in values.items() if k in params})
    for shell in WRAP_SHELLS:
        calls = run_rendered(tmp_path, text, shell)
        assert not (tmp_path / "pwned").exists()
        trains = [cli.build_parser().parse_args(c) for c in calls if c[0] == "train"]
        assert len(trains) == (2 if template == "sweep" else 1)
        for k, args in enumerate(trains):
            assert args.train == value and args.lam == ([1e-3, 2e-3][k] if template == "sweep" else 1e-3)
            assert args.out == (f"{value}-{k}.h5" if template == "sweep" else value)
            if "test" in params:
                assert args.test == value
        if template == "sweep":
            report, = [cli.build_parser().parse_args(c) for c in calls if c[0] == "report"]
            assert report.out == f"{value}-report" and report.results == [f"{value}-*.h5"]
        (tmp_path / "args").unlink()


BAD_VALUES = [
    ("sweep", "lams", "1e-3 $(touch pwned)", "The 'lams' parameter of template 'sweep' must be numbers > 0"),
    ("sweep", "lams", "1e-3 `touch pwned`", "must be numbers > 0"),
    ("sweep", "lams", "1e-3;touch pwned", "must be numbers > 0"),
    ("sweep", "lams", "--help", "must be numbers > 0"),
    ("sweep", "lams", "1e-3 -1", "must be numbers > 0"),
    ("sweep", "lams", "1e-3 nan", "must be numbers > 0"),
    ("sweep", "lams", " ", "must be numbers > 0"),
    ("train", "lam", "inf", "The 'lam' parameter of template 'train' must be a number > 0, such as 1e-3, or a comma-separated grid "
                            "such as 1e-5,1e-4,1e-3. Got 'inf'"),
    ("train", "lam", "0", "must be a number > 0"),
    ("train", "lam", "1e-3 --help", "must be a number > 0"),
    ("train", "ntasks", "0", "The 'ntasks' parameter of template 'train' must be an integer >= 1. Got '0'"),
    ("multinode", "nodes", "2.5", "must be an integer >= 1"),
    ("multinode", "tasks_per_node", "4 --exclusive", "must be an integer >= 1"),
    ("train", "time", "--help", "must be a SLURM time"),
    ("train", "time", "1:00:00$(touch pwned)", "must be a SLURM time"),
    ("train", "method", "--help", "The 'method' parameter of template 'train' must be one of dmtrl, stl"),
    ("train", "method", "dmtr", "Did you mean 'dmtrl'?"),
    ("train", "loss", "hinge; touch pwned", "The 'loss' parameter of template 'train' must be one of hinge"),
    ("multinode", "mpi", "pmi2 --x", "made of letters, digits"),
    ("preemptible", "partition", "$(touch pwned)", "made of letters, digits"),
    ("train", "train", "", "The 'train' parameter of template 'train' must be a file name, not empty"),
    ("train", "train", "a\ntouch pwned", "must be one line. Got 'a\\ntouch pwned' instead"),
    ("train", "out", "a\rb", "must be one line"),
]


@pytest.mark.parametrize("template,key,value,message", BAD_VALUES)
def test_values_are_checked_at_render_time(tmp_path, capsys, template, key, value, message):
    values = {"train": "t.h5", "test": "t.h5", "out": "o.h5", "prefix": "p", "lams": "1e-3", key: value}
    params = jobs.templates()[template][1]
    sets = [x for k, v in values.items() if k in params for x in ("--set", f"{k}={v}")]
    out = tmp_path / "job.sh"
    assert cli.main(["jobs", "render", template, "--out", str(out)] + sets) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpcmtl: error: ") and message in err, err
    assert not out.exists() and not (tmp_path / "pwned").exists()


def test_the_reported_sweep_is_refused_and_runs_nothing(tmp_path):
    r = run_hpcmtl(["jobs", "render", "sweep", "--set", "train=tr.h5", "--set", "test=te.h5", "--set", "prefix=p",
                    "--set", f"lams=1e-3 $(touch {tmp_path}/x)", "--out", tmp_path / "sweep.sh"])
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "The 'lams' parameter of template 'sweep' must be numbers > 0" in r.stderr
    assert not (tmp_path / "sweep.sh").exists() and not (tmp_path / "x").exists()


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


@pytest.mark.parametrize("key,value", [("ntasks", "\u0663"), ("nodes", "1\u0661"), ("lam", "\u0661e-3"),
                                       ("time", "\u0661:00"), ("lams", "1e-3 \u0662e-2")])
def test_numbers_are_ascii_digits(key, value):
    """int('٣') is 3 and Python's \\d takes any Unicode digit, but sbatch reads ASCII: refused at render."""
    template = {"lams": "sweep", "nodes": "multinode"}.get(key, "train")
    values = {"train": "t.h5", "test": "t.h5", "out": "o.h5", "prefix": "p", "lams": "1e-3", key: value}
    params = jobs.templates()[template][1]
    with pytest.raises(InputError, match=f"The '{key}' parameter of template '{template}' must be"):
        jobs.render(template, {k: v for k, v in values.items() if k in params})


def test_render_out_is_checked_and_written_atomically(tmp_path, capsys, monkeypatch):
    sets = ["--set", "train=t.h5", "--set", "out=o.h5", "--set", "test=te.h5"]
    copies = tmp_path / "templates"               # a copy, so a failing check cannot damage the package's own
    shutil.copytree(jobs.TEMPLATE_DIR, copies)
    monkeypatch.setattr(jobs, "TEMPLATE_DIR", str(copies))
    template_file = jobs.templates()["train"][0]
    original = open(template_file, "rb").read()
    link = tmp_path / "t.sbatch"
    os.symlink(template_file, link)               # a link to the package's own template: an input
    for force in ([], ["--force"]):
        assert cli.main(["jobs", "render", "train", "--out", str(link)] + sets + force) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "refusing to overwrite an input" in err, err
    assert open(template_file, "rb").read() == original and os.path.islink(link)
    out = tmp_path / "job.sbatch"
    assert cli.main(["jobs", "render", "train", "--out", str(out)] + sets) == 0
    assert os.stat(out).st_mode & 0o777 == 0o755 and "#SBATCH" in out.read_text()
    assert cli.main(["jobs", "render", "train", "--out", str(out)] + sets) == 2      # exists: --force needed
    assert "output file exists" in capsys.readouterr().err
    assert cli.main(["jobs", "render", "train", "--out", str(out), "--force"] + sets) == 0
    for bad, message in [(tmp_path / "nodir" / "x.sh", "does not exist"), (copies, "is a directory")]:
        assert cli.main(["jobs", "render", "train", "--out", str(bad)] + sets) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []


# --- grids and every train option (issue 38) -----------------------------------------------------
def srun_argv(text):
    """The hpcmtl argv (after 'hpcmtl') of a rendered script's srun line."""
    import shlex
    line = re.sub(r"\\\n\s*", " ", text)
    words = shlex.split(next(ln for ln in line.splitlines() if ln.startswith("srun ")), comments=True)
    return words[words.index("hpcmtl") + 1:]


def sample_value(flag, kw):
    """A value train accepts for option ``flag`` (None: one that needs a file or a partner option)."""
    if kw.get("action") == "store_true":
        return "true"
    if kw.get("choices"):
        return str(list(kw["choices"])[-1])
    grid = {"--lam-grid": "1e-4:1e-2:3", "--cv": "3", "--validation-fraction": "0.25", "--selection-tol": "1e-3"}
    if flag in grid:
        return grid[flag]
    if kw.get("default") is not None and not isinstance(kw["default"], (list, bool)):
        return str(kw["default"])
    return None


@pytest.mark.parametrize("method", ["dmtrl", "stl", "fixed", "graph"])
def test_train_template_renders_every_option_of_the_method(method):
    from hpcmtl.methods import train_options_of
    table = train_options_of(method)
    own = {"--train", "--test", "--out", "--loss", "--lam", "--checkpoint-seconds", "--stream", "--resume"}
    rendered = 0
    for flag, (_, kw) in table.items():
        value = sample_value(flag, kw)
        if flag in own or value is None:           # a grid's options too: a grid is one job, checkpointed
            continue
        key = flag[2:]
        text = jobs.render("train", dict(EXAMPLE, test="t.h5", method=method, **{key: value}))
        argv = srun_argv(text)
        expected = flag if kw.get("action") == "store_true" else f"{flag}={value}"
        assert expected in argv, (flag, argv)
        args = cli.build_parser().parse_args(argv)            # the real command line takes it as rendered
        assert getattr(args, kw.get("dest", key.replace("-", "_"))) is not None
        rendered += 1
    assert rendered >= 20


def test_a_grid_renders_with_checkpoints_and_runs(tmp_path):
    tr, te = tmp_path / "tr.h5", tmp_path / "te.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--test", te, "--scale", "0.03"]).returncode == 0
    for extra, grid in (({"lam": "1e-3,1e-2"}, [1e-3, 1e-2]),
                        ({"lam-grid": "1e-3:1e-1:3", "cv": "2"}, [1e-3, 1e-2, 1e-1])):
        text = jobs.render("train", dict(train=str(tr), test=str(te), out=str(tmp_path / "g.h5"), method="stl",
                                         loss="logistic", **extra))
        argv = srun_argv(text)
        assert "--checkpoint-seconds=600" in argv                          # a grid checkpoints its path
        assert ("--lam-grid=1e-3:1e-1:3" in argv and not any(a.startswith("--lam=") for a in argv)) \
            if "lam-grid" in extra else "--lam=1e-3,1e-2" in argv
        r = run_hpcmtl(argv + ["--force", "--quiet"])
        assert r.returncode == 0, r.stderr
        res = store.read_result(tmp_path / "g.h5")
        assert res["path"]["lam"].tolist() == pytest.approx(sorted(grid, reverse=True))
        assert res["config"]["selection"]["chosen_lam"] in grid
    single = srun_argv(jobs.render("train", dict(EXAMPLE, test="t.h5")))
    assert "--checkpoint-seconds=600" in single and "--lam=1e-3" in single


@pytest.mark.parametrize("template,values,message", [
    ("train", {"max-rounds": "0"}, "--set for train dmtrl: argument --max-rounds"),
    ("train", {"max-round": "5"}, "Did you mean 'max-rounds'?"),
    ("train", {"train_": "x"}, "template 'train' has no parameter 'train_'"),
    ("train", {"no-intercept": "maybe"}, "is a switch: true or false"),
    ("train", {"lam": "1e-3,x"}, "a comma-separated grid such as 1e-5,1e-4,1e-3"),
    ("sweep", {"cv": "3"}, "template 'sweep' runs one lam a job"),
    ("train", {"radius": "3"}, "train dmtrl has no option --radius"),
])
def test_train_options_are_checked_at_render_time(template, values, message):
    base = {"train": "t.h5", "test": "t.h5", "out": "o.h5", "prefix": "p", "lams": "1e-3"}
    params = jobs.templates()[template][1]
    with pytest.raises(InputError) as err:
        jobs.render(template, dict({k: v for k, v in base.items() if k in params}, **values))
    assert message in str(err.value)


FAKE_PREEMPTING_SRUN = """#!{python}
# srun that runs the command and, on its first attempt, sends SIGUSR1 (SLURM's --signal) once the grid reached
# its second fold: the preemption of a grid job, at a place that is neither the start nor the end
import os, signal, subprocess, sys
mark = os.path.join(os.path.dirname(os.path.abspath(__file__)), "preempted-once")
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)
for line in proc.stdout:
    sys.stdout.write(line)
    if not os.path.exists(mark) and line.startswith("hpcmtl: path:") and "(fold 2/" in line:
        open(mark, "w").close()
        proc.send_signal(signal.SIGUSR1)
sys.exit(proc.wait())
"""


@pytest.mark.parametrize("grid", [{"lam-grid": "1e-4:1:4", "cv": "3"}, {"lam": "1,1e-2,1e-4", "cv": "3"}])
def test_the_preemptible_template_runs_a_grid_through_a_preemption(tmp_path, grid):
    """The preemptible script of a grid: its command line parses, the first attempt is preempted mid-grid
    (SIGUSR1 -> exit 75 -> scontrol requeue), the requeued attempt resumes (--resume) and gives the result of an
    uninterrupted run bitwise."""
    tr = tmp_path / "tr.h5"
    assert run_hpcmtl(["data", "synth", "dmtrl1", tr, "--scale", "0.04", "--seed", "5"]).returncode == 0
    out = tmp_path / "g.h5"
    settings = dict(grid, tol="1e-8", outer="2", **{"outer-tol": "0", "progress-seconds": "0"})
    text = jobs.render("preemptible", dict(train=str(tr), out=str(out), **settings))
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    argv = [w for w in srun_argv(text.replace('"$out"', str(out))) if not w.startswith("${resume")]
    args = cli.build_parser().parse_args(argv)               # hpcmtl train takes the rendered command line
    assert args.checkpoint_seconds == 600 and args.cv == 3 and not args.resume
    ref = tmp_path / "ref.h5"
    r = run_hpcmtl([f"--out={ref}" if a == f"--out={out}" else a for a in argv] + ["--quiet"])
    assert r.returncode == 0 and ref.exists(), r.stderr
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_tool(bin_dir, "scontrol", 'echo "$@" >> "$(dirname "$0")/requeued"\n')
    with open(bin_dir / "srun", "w") as f:
        f.write(FAKE_PREEMPTING_SRUN.format(python=sys.executable))
    os.chmod(bin_dir / "srun", 0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
               SLURM_JOB_ID="42")
    first = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr                 # requeued: the attempt itself ends well
    assert (bin_dir / "requeued").read_text().split() == ["requeue", "42"]
    assert "received SIGUSR1: checkpoint written to" in first.stderr and not out.exists()
    second = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                            timeout=300)
    assert second.returncode == 0, second.stderr
    assert (bin_dir / "requeued").read_text().split() == ["requeue", "42"]      # not requeued again
    a, b = store.read_result(out), store.read_result(ref)
    assert a["model"]["W"].tobytes() == b["model"]["W"].tobytes()
    assert a["path"]["fold_scores"].tobytes() == b["path"]["fold_scores"].tobytes()
    assert a["config"]["selection"]["chosen_lam"] == b["config"]["selection"]["chosen_lam"]
