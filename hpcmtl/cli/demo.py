"""``hpcmtl demo``: Synthetic 1 under mpiexec, STL against learned task relationships."""
from __future__ import annotations

from . import COMMAND_HELP, _count


def add_parser(sub):
    """The ``demo`` command."""
    demo = sub.add_parser("demo", help=COMMAND_HELP["demo"])
    demo.add_argument("--out", default="demo-output")
    demo.add_argument("--ranks", type=_count("--ranks"), default=5)


def cmd_demo(args):
    from ..demo import run_demo
    return run_demo(args.out, args.ranks)
