"""Every ```bash block of docs/*.md runs as written (in a temporary folder, with ../shared)."""
import glob
import os
import re
import shlex
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


SHELL_OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "(", ")"}


def hpcmtl_commands(path):
    """``(line, argv)`` of every ``hpcmtl ...`` command in the page's bash blocks: at the start of a command, or
    after ``mpiexec -n K``, ``srun``, ``time`` or ``python -m``; its arguments up to the next shell operator
    (``2>`` included) or comment."""
    for block in bash_blocks(path):
        line = ""
        for piece in block.replace("\\\n", " ").splitlines():
            line += piece
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split, lexer.commenters = True, "#"
            try:
                words = list(lexer)
            except ValueError:                          # a quote open to a later line (python -c "...")
                line += "\n"
                continue
            text, line = line, ""
            for i, word in enumerate(words):
                before = words[i - 1] if i else ";"
                after_launcher = before.isdigit() or before in ("srun", "time", "-m")
                if word == "hpcmtl" and (before in SHELL_OPERATORS or after_launcher):
                    end = next((j for j in range(i + 1, len(words)) if words[j] in SHELL_OPERATORS
                                or (words[j].isdigit() and words[j + 1:j + 2] in ([">"], [">>"]))), len(words))
                    yield text, words[i + 1:end]


@pytest.mark.smoke
def test_every_hpcmtl_command_in_the_docs_parses():
    """Each data / evaluate / report / jobs / demo command a page shows is accepted by the real argument parser
    (a renamed or removed option, a misspelt subcommand or a value its type refuses fails here, without running
    anything); the train commands: test_cli.test_every_train_command_in_docs_readme_and_job_scripts_parses."""
    from hpcmtl.cli import build_parser, train_method_first
    shown = [(os.path.basename(p), line, argv) for p in RUNNABLE for line, argv in hpcmtl_commands(p)
             if argv[:1] != ["train"]]
    assert {name for name, _, _ in shown} >= {"tutorial-school.md", "formats.md", "cli.md", "cluster.md"}
    for name, line, argv in shown:
        try:
            build_parser().parse_args(train_method_first(argv))
        except SystemExit as exc:                   # argparse: 2 on a refused command line, 0 after --help
            assert exc.code in (0, None), f"{name}: {line}"


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


@pytest.mark.shared_data
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
