"""``hpcmtl report RESULT.h5 ... --out DIR``: figures, a Markdown summary and CSV exports."""
from __future__ import annotations

import os

from ..errors import InputError
from . import COMMAND_HELP


def add_parser(sub):
    """The ``report`` command."""
    rep = sub.add_parser("report", help=COMMAND_HELP["report"])
    rep.add_argument("results", nargs="+", metavar="RESULT.h5")
    rep.add_argument("--out", required=True, metavar="DIR")
    rep.add_argument("--csv", action="store_true", help="also export each run's history as CSV into DIR")


def check_report_paths(args):
    """``hpcmtl report``: --out is a directory (made if missing) whose files must not be any input."""
    from .. import store
    from ..results import REPORT_FILES, TEST_CSV, history_csv_names
    inputs = [("input", p) for p in args.results]
    out = args.out
    if os.path.lexists(out) and not os.path.isdir(out):
        store.check_outputs([("--out", out, True)], inputs)          # names the input if it is one
        raise InputError(f"{out}: report --out must be a directory, this is a file")
    names = list(REPORT_FILES)
    if args.csv:
        names += list(dict.fromkeys(history_csv_names(args.results))) + [TEST_CSV]
    if os.path.isdir(out):
        store.check_outputs([("report file", os.path.join(out, n), True) for n in names], inputs)
        return
    parent = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise InputError(f"{out}: cannot make the report directory: {parent} is not a writable directory")


def cmd_report(args):
    from ..results import TEST_CSV, history_csv, history_csv_names, report, test_metrics_csv
    check_report_paths(args)
    written = report(args.results, args.out)
    if args.csv:
        for path, name in zip(args.results, history_csv_names(args.results)):
            written[name] = history_csv(path, os.path.join(args.out, name))
        tests = test_metrics_csv(args.results, os.path.join(args.out, TEST_CSV))
        if tests:
            written[TEST_CSV] = tests
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0
