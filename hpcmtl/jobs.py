"""SLURM job scripts generated from parameters (``hpcmtl jobs list | render``).

Templates live in ``hpcmtl/templates``; each declares its parameters in
``# hpcmtl-param: NAME DEFAULT DESCRIPTION`` lines (default ``-``: required).
Placeholders: ``{{name}}`` is replaced by the shell-quoted value,
``{{name|raw}}`` (for ``#SBATCH`` lines, which sbatch parses itself) only by
a value made of safe characters, ``{{name|words}}`` by each whitespace-separated
word quoted.  The rendered examples in the repository's ``jobs/`` folder are
these templates with example paths, and a test keeps them identical.
"""
from __future__ import annotations

import os
import re
import shlex

from .errors import InputError
from .losses import closest

TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
_PARAM = re.compile(r"^# hpcmtl-param:\s+(\w+)\s+(\S+)\s+(.*)$", re.M)
_PLACEHOLDER = re.compile(r"\{\{(\w+)(?:\|(raw|words))?\}\}")
_SAFE_RAW = re.compile(r"^[A-Za-z0-9_.:/@%+=,-]+$")


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
    for key, value in merged.items():
        if "\n" in str(value) or "\0" in str(value):
            raise InputError(f"parameter '{key}' must be one line")

    def substitute(m):
        key, mode = m.group(1), m.group(2)
        if key not in merged:
            raise InputError(f"template '{name}' uses undeclared parameter '{key}'")
        value = str(merged[key])
        if mode == "raw":
            if not _SAFE_RAW.match(value):
                raise InputError(f"parameter '{key}' = {value!r}: only letters, digits and _.:/@%+=,- are allowed here")
            return value
        if mode == "words":
            return " ".join(shlex.quote(w) for w in value.split())
        return shlex.quote(value)

    with open(path, encoding="utf-8") as f:
        return _PLACEHOLDER.sub(substitute, f.read())


def parse_sets(pairs) -> dict:
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--set takes key=value, got {pair!r}")
        out[key] = value
    return out
