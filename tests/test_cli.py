"""`hpcmtl train METHOD`: one sub-parser a method, its own options with their defaults, other methods'
options refused, and every train command line the repository shows still parsing as before."""
import glob
import os
import re
import shlex

import pytest

from hpcmtl import cli, jobs

from conftest import ROOT, run_hpcmtl

METHODS = cli.TRAIN_METHODS


def method_parser(method):
    train = next(a for a in cli.build_parser()._actions if hasattr(a, "choices") and a.choices and "train" in
                 a.choices).choices["train"]
    return next(a for a in train._actions if hasattr(a, "choices") and a.choices and method in a.choices).choices[method]


def all_options():
    return sorted({o for m in METHODS for o in cli.train_options_of(m)})


def parse(argv):
    return cli.build_parser().parse_args(cli.train_method_first([str(a) for a in argv]))


@pytest.mark.parametrize("method", METHODS)
def test_help_lists_only_the_methods_options_each_with_its_default(method, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", method, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    own = cli.train_options_of(method)
    listed = set(re.findall(r"^\s{2}(--[A-Za-z][A-Za-z0-9-]*)", text, re.M))
    assert listed == set(own)                               # no option of another method
    for option in set(all_options()) - set(own):
        assert not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), option
    formatter = cli.DefaultsFormatter(f"hpcmtl train {method}")
    for action in method_parser(method)._actions:
        if action.option_strings and action.option_strings[0] != "-h":
            line = formatter._get_help_string(action)
            assert "(default: " in line or "(required)" in line or "(none: " in line, (action.option_strings, line)


def test_help_shows_each_methods_own_defaults(capsys):
    for method, expected in (("dmtrl", "(default: 500)"), ("l1inf", "(default: 200)"), ("online", "(default: 64)")):
        with pytest.raises(SystemExit):
            cli.main(["train", method, "--help"])
        assert expected in " ".join(capsys.readouterr().out.split())


def foreign_options(method):
    """One option of each other method that ``method`` does not take."""
    own = set(cli.train_options_of(method))
    out = {}
    for other in METHODS:
        for option in cli.train_options_of(other):
            if option not in own and option not in out.values():
                out[other] = option
                break
    return sorted(set(out.values()))


@pytest.mark.parametrize("method", METHODS)
def test_an_option_of_another_method_is_an_argparse_error(method, capsys):
    base = ["train", method, "--out", "r.h5"]
    for option in foreign_options(method):
        kw = next(cli.train_options_of(m)[option][1] for m in METHODS if option in cli.train_options_of(m))
        value = [] if kw.get("action") == "store_true" else ["5"]
        with pytest.raises(SystemExit) as exc:
            cli.main(base + [option] + value)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"hpcmtl train {method}: unrecognized arguments: {option}" in err
        assert f"'{option}' is an option of train " in err and f"not of train {method}" in err


@pytest.mark.mpi
def test_foreign_option_under_mpiexec_is_one_line_exit_2(tmp_path):
    r = run_hpcmtl(["train", "dmtrl", "--train", tmp_path / "t.h5", "--out", tmp_path / "r.h5", "--lam", "1",
                    "--radius", "5"], n_ranks=2, timeout=60)
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == ["hpcmtl: error: hpcmtl train dmtrl: unrecognized arguments: --radius 5. '--radius' is an option "
                     "of train l1inf, not of train dmtrl (hpcmtl train dmtrl --help lists its options)."]


@pytest.mark.smoke
def test_misspelt_options_and_methods_keep_their_hints(capsys):
    for argv, hint in ((["train", "dmtrl", "--out", "r", "--lamda", "1"], "Did you mean '--lam'?"),
                       (["train", "dmtr", "--out", "r"], "Did you mean 'dmtrl'?")):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2 and hint in capsys.readouterr().err


def test_every_attribute_the_commands_read_is_set_for_every_method():
    names = {kw.get("dest", o.lstrip("-").replace("-", "_")) for m in METHODS
             for o, (_, kw) in cli.train_options_of(m).items()}
    for method in METHODS:
        args = vars(parse(["train", method, "--out", "r.h5"]))
        assert names <= set(args), names - set(args)
    args = parse(["train", "online", "--stream", "s.h5", "--out", "r.h5"])
    assert (args.train, args.sigma, args.lam, args.radius, args.graph) == (None, None, None, None, None)
    args = parse(["train", "dmtrl", "--train", "t.h5", "--out", "r.h5", "--lam", "1"])
    assert (args.stream, args.code, args.C, args.max_rounds, args.outer) == (None, None, "1.0", 500, 30)


@pytest.mark.smoke
def test_options_before_the_method_still_parse():
    args = parse(["train", "--quiet", "--out", "stl", "stl", "--train", "t.h5", "--lam=1"])
    assert (args.method, args.out, args.quiet, args.lam, args.train) == ("stl", "stl", True, 1.0, "t.h5")


# -- every `hpcmtl train` line the repository shows -------------------------------------------------
def shown_train_commands():
    paths = glob.glob(os.path.join(ROOT, "docs", "*.md")) + [os.path.join(ROOT, "README.md")]
    paths += glob.glob(os.path.join(ROOT, "jobs", "*"))
    texts = []
    for path in paths:
        text = open(path, encoding="utf-8").read()
        if path.endswith(".md"):                            # the commands, not the prose about them
            text = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
        texts.append((os.path.relpath(path, ROOT), text))
    for name, (_, params) in jobs.templates().items():
        values = {k: "1e-3 1e-2" if k == "lams" else "1e-3" if k == "lam" else "x.h5"
                  for k, (default, _) in params.items() if default == "-"}
        for method in jobs._methods(name):
            texts.append((f"template {name} ({method})", jobs.render(name, dict(values, method=method))))
    for where, text in texts:
        for line in re.sub(r"\\\n\s*", " ", text).splitlines():
            if "hpcmtl train " not in line or "hpcmtl train METHOD" in line:
                continue
            rest = re.split(r"\s(?:\||;|&&|2>|>|#)\s?", line[line.index("hpcmtl train ") + 7:])[0].split("')")[0]
            rest = re.sub(r'"?\$1"?', "1e-3", rest)              # sweep.sh: the array task's lam
            words = [w for w in shlex.split(rest) if not w.startswith("${")]
            yield where, words


@pytest.mark.smoke
def test_every_train_command_in_docs_readme_and_job_scripts_parses():
    commands = list(shown_train_commands())
    assert len(commands) > 25
    for where, words in commands:
        if "--help" in words:
            continue
        try:
            args = parse(words)
        except SystemExit:
            pytest.fail(f"{where}: {' '.join(words)} no longer parses")
        assert args.method == words[1]


def test_job_templates_accept_only_methods_that_take_their_options():
    assert jobs._methods("train") == ("dmtrl", "stl", "fixed", "graph")
    assert jobs._methods("sweep") == ("dmtrl", "stl", "fixed", "graph", "ssdca", "mtrl-central")
    from hpcmtl.errors import InputError
    with pytest.raises(InputError, match=r"must be one of dmtrl, stl, fixed, graph \(the methods that take its "
                                         r"options\). Got 'online' instead"):
        jobs.render("train", {"train": "t.h5", "test": "t.h5", "out": "o.h5", "method": "online"})


IMPORTED = ("import sys\n"
            "from hpcmtl.cli import main\n"
            "try:\n"
            "    code = main(sys.argv[1:])\n"
            "except SystemExit as exc:\n"
            "    code = exc.code\n"
            "print('MODULES', *sorted(m for m in sys.modules if m.startswith(('hpcmtl', 'h5py', 'mpi4py', 'sklearn'))))\n"
            "sys.exit(code)\n")


def modules_imported_by(argv, tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", IMPORTED, *map(str, argv)], capture_output=True, text=True,
                       timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.splitlines()[-1].split()[1:])             # (the line after --help's text)


def test_a_command_imports_its_own_group_only(tmp_path):
    """``--help`` builds no command group's parser; ``train stl`` with one lam neither the input formats of
    ``data`` nor the lam path's modules (start-up of every job and every rank)."""
    from hpcmtl import store
    import numpy as np
    rng = np.random.default_rng(0)
    store.write_tasks(tmp_path / "tr.h5", [rng.normal(size=(20, 3)) for _ in range(2)],
                      [np.where(rng.normal(size=20) > 0, 1.0, -1.0) for _ in range(2)])
    helped = modules_imported_by(["--help"], tmp_path)
    assert not {"hpcmtl.formats", "hpcmtl.cli.data", "hpcmtl.cli.train", "hpcmtl.methods", "hpcmtl.dmtrl",
                "h5py"} & helped
    trained = modules_imported_by(["train", "stl", "--train", "tr.h5", "--out", "stl.h5", "--loss", "hinge",
                                   "--lam", "0.1", "--quiet", "--force"], tmp_path)
    assert "hpcmtl.dmtrl" in trained and "hpcmtl.cli.train" in trained
    assert not {"hpcmtl.formats", "hpcmtl.cli.data", "hpcmtl.model_selection", "hpcmtl.joint_sparse",
                "hpcmtl.online", "sklearn"} & trained
    assert {"hpcmtl.formats", "hpcmtl.cli.data"} <= modules_imported_by(["data", "info", "tr.h5"], tmp_path)
