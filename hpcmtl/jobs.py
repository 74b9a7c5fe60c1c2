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
    "lam": "number", "lams": "numbers",
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


def _methods(template: str = ""):
    """The methods a template may run: those whose ``train METHOD`` takes every option its command line passes."""
    from .methods import TRAIN_METHODS, train_options_of
    available = templates()
    if template not in available:
        return TRAIN_METHODS
    with open(available[template][0], encoding="utf-8") as f:
        text = re.sub(r"\\\n\s*", " ", f.read())            # one line per command
    used = {o for line in _TRAIN_LINE.findall(text) for o in _OPTION.findall(line)}
    return tuple(m for m in TRAIN_METHODS if used <= set(train_options_of(m)))


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
    for key in values:
        if key not in params:
            raise InputError(f"template '{name}' has no parameter '{key}'; parameters: {', '.join(params)}."
                             f"{closest(key, params)}")
    merged = {k: values.get(k, default) for k, (default, _) in params.items()}
    missing = [k for k, v in merged.items() if v == "-"]
    if missing:
        raise InputError(f"template '{name}' needs --set {missing[0]}=... ({params[missing[0]][1]})")
    words = {key: check_value(key, value, name) for key, value in merged.items()}

    def substitute(m):
        key, mode = m.group(1), m.group(2)
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

    with open(path, encoding="utf-8") as f:
        return _PLACEHOLDER.sub(substitute, f.read())


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
