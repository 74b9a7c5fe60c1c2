"""SLURM job scripts generated from parameters (``hpcmtl jobs list | render``).

Templates live in ``hpcmtl/templates``; each declares its parameters in
``# hpcmtl-param: NAME DEFAULT DESCRIPTION`` lines (default ``-``: required).
Every value is checked against its kind (``KINDS``) when the template is
rendered: numbers must be numbers, ``time`` a SLURM time, ``method`` and
``loss`` known names, paths one line.  Placeholders:

``{{name}}``
    the value quoted for the shell that runs the script (a list value such as
    ``lams``: each item quoted);
``{{name|raw}}``
    the value as is, for ``#SBATCH`` lines (sbatch parses them itself, no
    shell does), allowed only for kinds made of safe characters;
``{{name|wrap}}``
    the value quoted for the ``sh`` that runs a ``sbatch --wrap`` command, with
    that quoted text escaped once more for the single-quoted ``'...'`` string
    that holds the command in the script: two shells, two levels of quoting.

Three placeholders are computed, not set (each word rendered with a space before it):
``{{lam_option}}`` (``--lam=LAM``, a grid ``--lam=A,B`` too; nothing when
``lam-grid`` is set), ``{{checkpoint_option}}`` (``--checkpoint-seconds=600``, a
grid's too: a grid checkpoints its path and resumes like a single run) and
``{{train_options}}``: every ``--set KEY=VALUE`` whose key is not a parameter
of the template but an option of ``hpcmtl train METHOD`` (``lam-grid``,
``cv``, ``max-rounds``, ``no-intercept=true`` ...), checked against that
method's own option table and rendered as ``--KEY=VALUE``.

Options are written ``--opt={{value}}`` and positional values are checked
names, so no value (``--help``) can become an option.  The rendered examples in
the repository's ``jobs/`` folder are these templates with example paths, and
a test keeps them identical.
"""
from __future__ import annotations

import os
import re
import shlex

from .errors import InputError
from .losses import LOSSES, closest

TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
_PARAM = re.compile(r"^# hpcmtl-param:\s+(\w+)\s+(\S+)\s+(.*)$", re.M)
_PLACEHOLDER = re.compile(r"\{\{(\w+)(?:\|(\w+))?\}\}")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.:/@%+=,-]+$")
# numbers are ASCII digits: str.isdigit and \d (without re.ASCII) take any Unicode digit ('٣'), which int()
# accepts but sbatch does not
_NUMBER = re.compile(r"^(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")
_COUNT = re.compile(r"^[0-9]+$")
# SLURM --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds (or unlimited)
_TIME = re.compile(r"^(?:\d+(?::\d+){0,2}|\d+-\d+(?::\d+){0,2}|unlimited|infinite)$", re.I | re.ASCII)

# The kind of every template parameter: what it may hold and how it is checked.
KINDS = {
    "job_name": "name", "partition": "name", "mpi": "name",
    "ntasks": "count", "nodes": "count", "tasks_per_node": "count",
    "time": "time",
    "method": "method", "loss": "loss",
    "lam": "lam", "lams": "numbers",
    "train": "path", "test": "path", "out": "path", "prefix": "path",
}
_RAW_KINDS = ("name", "count", "time")      # kinds that may appear unquoted in #SBATCH lines


def templates() -> dict:
    """Template name -> (path, {param: (default, description)})."""
    out = {}
    for fname in sorted(os.listdir(TEMPLATE_DIR)):
        path = os.path.join(TEMPLATE_DIR, fname)
        name = os.path.splitext(fname)[0]
        with open(path, encoding="utf-8") as f:
            params = {m.group(1): (m.group(2), m.group(3).strip()) for m in _PARAM.finditer(f.read())}
        out[name] = (path, params)
    return out


_TRAIN_LINE = re.compile(r"hpcmtl train \{\{method[^}]*\}\}(.*)")
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z-]*)")
# the computed placeholders and the train options they render
COMPUTED = {"lam_option": "--lam", "checkpoint_option": "--checkpoint-seconds", "train_options": None}
CHECKPOINT_SECONDS = "600"
# options that make a run a grid (chosen by validation): one job, which a template of one lam a job cannot run
GRID_OPTIONS = ("--lam-grid", "--cv", "--validation-fraction")


def _methods(template: str = ""):
    """The methods a template may run: those whose ``train METHOD`` takes every option its command line passes."""
    from .methods import TRAIN_METHODS, train_options_of
    available = templates()
    if template not in available:
        return TRAIN_METHODS
    with open(available[template][0], encoding="utf-8") as f:
        text = re.sub(r"\\\n\s*", " ", f.read())            # one line per command
    used = {o for line in _TRAIN_LINE.findall(text) for o in _OPTION.findall(line)}
    used |= {flag for key, flag in COMPUTED.items() if flag and "{{" + key in text}
    return tuple(m for m in TRAIN_METHODS if used <= set(train_options_of(m)))


def _template_options(path) -> set:
    """The train options a template's command line passes itself (written out or computed)."""
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"\\\n\s*", " ", f.read())
    used = {o for line in _TRAIN_LINE.findall(text) for o in _OPTION.findall(line)}
    return used | {flag for key, flag in COMPUTED.items() if flag and "{{" + key in text}


class _OptionParser:
    """``hpcmtl train METHOD``'s own option table as a parser whose errors are one-line InputErrors."""

    def __init__(self, method):
        import argparse
        from .methods import train_options_of

        class Parser(argparse.ArgumentParser):
            def error(self, message):
                raise InputError(f"--set for train {method}: {message}")

        self.table = train_options_of(method)
        self.parser = Parser(prog=f"hpcmtl train {method}", add_help=False, allow_abbrev=False)
        for flags, kw in self.table.values():
            self.parser.add_argument(*flags, **dict(kw, required=False))
        self.method = method

    def words(self, key, value, template):
        """``--KEY=VALUE`` (or ``--KEY`` for a switch) after checking that train METHOD takes it with this value."""
        flag = "--" + key.replace("_", "-")
        if flag not in self.table:
            return None
        if self.table[flag][1].get("action") == "store_true":
            if value.lower() in ("", "true", "yes", "1"):
                return [flag]
            if value.lower() in ("false", "no", "0"):
                return []
            raise InputError(f"--set {key}=...: {flag} of train {self.method} is a switch: true or false, "
                             f"got {value!r}")
        if any(c in value for c in "\n\r\0"):
            raise InputError(f"--set {key}=...: the value must be one line")
        self.parser.parse_args([f"{flag}={value}"])            # its type and range, as train checks them
        return [f"{flag}={value}"]


def train_words(name, path, params, values, method) -> dict:
    """The words of the computed placeholders for template ``name``: ``{lam_option, checkpoint_option,
    train_options}`` from the values that are not the template's parameters (options of train ``method``)."""
    own = _template_options(path)
    parser = _OptionParser(method)
    extra, given, checkpoint_seconds = [], set(), CHECKPOINT_SECONDS
    for key, value in values.items():
        if key in params:
            continue
        words = parser.words(key, str(value), name)
        if words is None:
            options = [o.lstrip("-") for o in parser.table]
            raise InputError(f"template '{name}' has no parameter '{key}', and train {method} has no option "
                             f"--{key.replace('_', '-')}; parameters: {', '.join(params)}, or any option of "
                             f"'hpcmtl train {method} --help'.{closest(key, list(params) + options)}")
        flag = "--" + key.replace("_", "-")
        if flag == "--checkpoint-seconds" and "{{checkpoint_option}}" in open(path, encoding="utf-8").read():
            checkpoint_seconds = words[0].split("=", 1)[1]            # the template's interval, changed
            given.add(flag)
            continue
        if flag in own or flag in ("--train", "--test", "--out", "--stream"):
            raise InputError(f"--set {key}=...: template '{name}' passes {flag} itself"
                             + (f" (--set {key.replace('-', '_')}=...)" if key.replace("-", "_") in params else ""))
        given.add(flag)
        extra += words
    lam = str(values.get("lam", params.get("lam", ("", ""))[0]))
    grid = bool(given & set(GRID_OPTIONS)) or "," in lam
    if grid and "--lam" in own and "{{lam_option}}" not in open(path, encoding="utf-8").read():
        raise InputError(f"template '{name}' runs one lam a job; a grid chosen by validation is one job: "
                         f"use template 'train' (hpcmtl jobs render train --set lam=A,B,C --set cv=3)")
    lam_words = [] if "--lam-grid" in given else [f"--lam={lam}"] if lam else []
    checkpoint = [f"--checkpoint-seconds={checkpoint_seconds}"]     # a grid's path state too (hpcmtl >= issue 38)
    return {"lam_option": lam_words, "checkpoint_option": checkpoint, "train_options": extra}


def check_value(key: str, value: str, template: str = "") -> list:
    """The checked value of parameter ``key`` as a list of words (one word unless a list kind)."""
    owner = f" of template '{template}'" if template else ""

    def wrong(what):
        return InputError(f"The '{key}' parameter{owner} must be {what}. Got {value!r} instead.")

    value = str(value)
    if any(c in value for c in "\n\r\0"):
        raise wrong("one line")
    kind = KINDS.get(key)
    if kind is None:
        raise InputError(f"template '{template}' declares parameter '{key}' of unknown kind; add it to jobs.KINDS")
    if kind == "path":
        if not value:
            raise wrong("a file name, not empty")
        return [value]
    if kind == "lam":            # one lam, or a comma-separated grid chosen by validation (train's --lam)
        items = value.split(",")
        if not all(_NUMBER.match(w) and 0 < float(w) < float("inf") for w in items):
            raise wrong("a number > 0, such as 1e-3, or a comma-separated grid such as 1e-5,1e-4,1e-3")
        return [value]
    if kind == "numbers":
        words = value.split()
        if not words or not all(_NUMBER.match(w) and 0 < float(w) < float("inf") for w in words):
            raise wrong("numbers > 0 separated by spaces, such as '1e-4 1e-3 1e-2'")
        return words
    if kind == "number":
        if not (_NUMBER.match(value) and 0 < float(value) < float("inf")):
            raise wrong("a number > 0, such as 1e-3")
    elif kind == "count":
        if not (_COUNT.match(value) and int(value) >= 1):
            raise wrong("an integer >= 1")
    elif kind == "time":
        if not _TIME.match(value):
            raise wrong("a SLURM time: MINUTES, HH:MM:SS or DAYS-HH[:MM[:SS]]")
    elif kind == "method":
        methods = _methods(template)
        if value not in methods:
            raise InputError(f"The '{key}' parameter{owner} must be one of {', '.join(methods)} (the methods "
                             f"that take its options). Got {value!r} instead.{closest(value, methods)}")
    elif kind == "loss":
        if value not in LOSSES:
            raise InputError(f"The '{key}' parameter{owner} must be one of {', '.join(LOSSES)}. "
                             f"Got {value!r} instead.{closest(value, LOSSES)}")
    elif kind == "name":
        if not _SAFE_NAME.match(value):
            raise wrong("made of letters, digits and _.:/@%+=,- only")
    return [value]


def _wrap_quote(word: str) -> str:
    """``word`` quoted for the shell of a ``--wrap`` command, then for the '...' string holding it."""
    return shlex.quote(word).replace("'", "'\\''")


def render(name: str, values: dict) -> str:
    """The job script of template ``name`` with ``values`` filled in (defaults for the rest)."""
    available = templates()
    if name not in available:
        raise InputError(f"unknown job template '{name}'; templates: {', '.join(available)}.{closest(name, available)}")
    path, params = available[name]
    with open(path, encoding="utf-8") as f:
        template = f.read()
    trains = "hpcmtl train {{method" in template
    for key in values:
        if key not in params and not trains:
            raise InputError(f"template '{name}' has no parameter '{key}'; parameters: {', '.join(params)}."
                             f"{closest(key, params)}")
    merged = {k: values.get(k, default) for k, (default, _) in params.items()}
    missing = [k for k, v in merged.items() if v == "-"]
    if missing:
        raise InputError(f"template '{name}' needs --set {missing[0]}=... ({params[missing[0]][1]})")
    words = {key: check_value(key, value, name) for key, value in merged.items()}
    computed = train_words(name, path, params, values, merged["method"]) if trains else {}

    def substitute(m):
        key, mode = m.group(1), m.group(2)
        if key in computed and key not in words:
            quote = _wrap_quote if mode == "wrap" else shlex.quote
            return "".join(" " + quote(w) for w in computed[key])
        if key not in words:
            raise InputError(f"template '{name}' uses undeclared parameter '{key}'")
        if mode is None:
            return " ".join(shlex.quote(w) for w in words[key])
        if mode == "wrap":
            return " ".join(_wrap_quote(w) for w in words[key])
        if mode == "raw" and KINDS[key] in _RAW_KINDS:
            return words[key][0]
        raise InputError(f"template '{name}': placeholder '{m.group(0)}' is not allowed "
                         f"(raw is only for kinds {', '.join(_RAW_KINDS)})")

    return _PLACEHOLDER.sub(substitute, template)


def parse_sets(pairs) -> dict:
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--set takes key=value, got {pair!r}")
        if key in out:
            raise InputError(f"--set {key}=... is given twice")
        out[key] = value
    return out
