"""The ``hpcmtl`` command: data | train | evaluate | report | jobs | demo.

One module a command group (``data``, ``train``, ``evaluate``, ``report``, ``jobs``,
``demo``), each with ``add_parser(sub)`` and its ``cmd_*`` functions; this module
holds the shared :class:`Parser`, the top-level parser and :func:`main`.

``hpcmtl train ...`` runs serially; ``mpiexec -n P hpcmtl train ...`` (or
``srun``) runs the same command distributed: rank 0 is the server, ranks
1..P-1 the workers.  Bad input ends every rank with one line and exit code 2.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys

from .. import __version__
from ..errors import InputError
from ..params import POSITIVE, Interval, number_type


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors, exit code 2, 'did you mean' and no abbreviations."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        from ..cluster import launcher_rank
        if launcher_rank() == 0:              # one line per job, not one per rank
            print(f"hpcmtl: error: {self.prog}: {message}.{self.hint(message)}".replace("..", "."), file=sys.stderr)
        sys.exit(2)

    def hint(self, message):
        """' Did you mean ...?' for a misspelt option or choice (empty when nothing is close)."""
        hint = ""
        if "unrecognized arguments" in message:
            options = _all_options(self)
            for word in message.split(":", 1)[1].split():
                match = difflib.get_close_matches(word.split("=")[0], options, n=1, cutoff=0.6)
                if match:
                    hint = f" Did you mean '{match[0]}'?"
                    break
        elif "invalid choice" in message:
            import re
            m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
            if m:
                choices = [c.strip(" '\"") for c in m.group(2).split(",")]
                match = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.5)
                if match:
                    hint = f" Did you mean '{match[0]}'?"
        return hint


def _all_options(parser):
    """Option strings of a parser and of all its sub-commands."""
    out = []
    for action in parser._actions:
        out += action.option_strings
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _all_options(sub)
    return sorted(set(out))


def _positive_float(flag):
    """argparse type: a number > 0 (one-line message naming ``flag``)."""
    return number_type(flag, POSITIVE)


def _count(flag, minimum=1):
    """argparse type: an integer >= ``minimum``."""
    return number_type(flag, Interval(int, minimum))


# the command groups, in the order --help lists them, with their one-line help: one module a group
# (``hpcmtl.cli.NAME``: ``add_parser(sub)`` and its ``cmd_*`` functions), imported when its command runs
COMMAND_HELP = {
    "data": "convert, split, inspect and generate task datasets",
    "train": "train a model (distributed under mpiexec)",
    "evaluate": "test metrics of a result file: per task, pooled_* and task_mean_*",
    "report": "figures and a Markdown summary from result files",
    "jobs": "SLURM job scripts from templates",
    "demo": "Synthetic 1 under mpiexec -n 5: STL vs learned task relationships",
}


def group(name):
    """The module of command group ``name`` (imported on first use)."""
    return importlib.import_module(f"{__name__}.{name}")


def build_parser(command=None):
    """The ``hpcmtl`` parser: every command group's sub-parser (``command=None``), or only ``command``'s
    (``""``: none), the others named with their help only.  A command line builds its own group's, so
    ``hpcmtl train ...`` or ``--help`` does not import the input formats of ``data`` or what other groups
    read (start-up of every job, every rank)."""
    p = Parser(prog="hpcmtl", description="MPI-native multi-task learning", allow_abbrev=False)
    p.add_argument("--version", action="version", version=f"hpcmtl {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    # abbreviations are off everywhere: a misspelt option in a job script is an error, never a guess
    for name, text in COMMAND_HELP.items():
        if command is None or name == command:
            group(name).add_parser(sub)
        else:
            sub.add_parser(name, help=text)
    return p


def command_of(argv):
    """The command group an argument list names (its first word, when it is one), else ``""``."""
    return argv[0] if argv and argv[0] in COMMAND_HELP else ""


def main(argv=None):
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader went away (`hpcmtl data info X | head`): stop quietly, like other tools
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv=None):
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    command = command_of(argv)
    if command == "train":
        argv = group("train").train_method_first(argv)
    args = build_parser(command).parse_args(argv)
    if args.command == "train":
        from ..cluster import run_main
        return run_main(lambda cluster: group("train").cmd_train(args, cluster))
    try:
        return getattr(group(args.command), f"cmd_{args.command}")(args)
    except InputError as exc:
        print(f"hpcmtl: error: {exc}", file=sys.stderr)
        return 2


# names of ``hpcmtl.cli.train`` that this package has always exported, loaded with it
TRAIN_NAMES = ("TRAIN_METHODS", "DefaultsFormatter", "MethodParser", "add_train_methods", "train_method_first",
               "train_option_groups", "train_options_of")


def __getattr__(name):
    # the command groups (hpcmtl.cli.data, ...) and the train names above, imported when first asked for
    if name in COMMAND_HELP:
        return group(name)
    if name in TRAIN_NAMES:
        return getattr(group("train"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
