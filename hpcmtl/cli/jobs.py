"""``hpcmtl jobs list | render``: SLURM job scripts from templates."""
from __future__ import annotations

import os

from . import COMMAND_HELP, Parser


def add_parser(sub):
    """The ``jobs`` command and its sub-commands."""
    jobs = sub.add_parser("jobs", help=COMMAND_HELP["jobs"])
    jsub = jobs.add_subparsers(dest="jobs_command", required=True, parser_class=Parser)
    jsub.add_parser("list", help="the templates and their parameters")
    render = jsub.add_parser("render", help="fill a template (values are shell-quoted)")
    render.add_argument("template")
    render.add_argument("--set", action="append", metavar="KEY=VALUE", help="a parameter value (repeatable)")
    render.add_argument("--out", metavar="FILE", help="write here instead of standard output")
    render.add_argument("--force", action="store_true", help="overwrite an existing --out file")


def cmd_jobs(args):
    from .. import jobs
    if args.jobs_command == "list":
        for name, (_, params) in jobs.templates().items():
            print(name)
            for key, (default, text) in params.items():
                print(f"    {key:<15s} {'(required)' if default == '-' else default:<18s} {text}")
        return 0
    if args.out:
        # the templates are inputs: an --out naming one of them (or a link to it) would change every later render
        from .. import store
        store.check_outputs([("--out", args.out, args.force)],
                            [("template", path) for path, _ in jobs.templates().values()])
    text = jobs.render(args.template, jobs.parse_sets(args.set))
    if args.out:
        from .. import store
        with store.atomic_output(args.out, what="job script") as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
        os.chmod(args.out, 0o755)             # a script: executable (atomic_output leaves 0666 under the umask)
    else:
        print(text, end="")
    return 0
