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


def build_parser():
    p = Parser(prog="hpcmtl", description="MPI-native multi-task learning", allow_abbrev=False)
    p.add_argument("--version", action="version", version=f"hpcmtl {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    # abbreviations are off everywhere: a misspelt option in a job script is an error, never a guess
    for group in (data, train, evaluate, report, jobs, demo):
        group.add_parser(sub)
    return p


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
    args = build_parser().parse_args(train_method_first(argv))
    if args.command == "train":
        from ..cluster import run_main
        return run_main(lambda cluster: train.cmd_train(args, cluster))
    commands = {"data": data.cmd_data, "evaluate": evaluate.cmd_evaluate, "jobs": jobs.cmd_jobs,
                "report": report.cmd_report, "demo": demo.cmd_demo}
    try:
        return commands[args.command](args)
    except InputError as exc:
        print(f"hpcmtl: error: {exc}", file=sys.stderr)
        return 2


# the command groups use Parser and the helpers above, so they are imported after them
from . import data, demo, evaluate, jobs, report, train  # noqa: E402
from .train import (TRAIN_METHODS, DefaultsFormatter, MethodParser, add_train_methods,  # noqa: E402,F401
                    train_method_first, train_option_groups, train_options_of)
