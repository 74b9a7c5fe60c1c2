"""Input formats: a registry of the formats ``hpcmtl data convert`` reads, one module a format.

Parsing that scikit-learn or SciPy already do well is left to them: svmlight
files (``load_svmlight_files``), MATLAB files (``scipy.io.loadmat``), bag of
words (``HashingVectorizer`` / ``TfidfVectorizer``).  What the format modules
hold is the protocol of each data set (which rows form which task) and
tolerant readers for the two non-standard text formats (the MDS pseudo-XML and
Reuters SGML).

Every reader checks what it returns (:func:`check_tasks`: numbers, finite, one
label a row, at least one row a task, one feature count), so a bad input ends
with one line naming the input file and the cell, array, line or row at fault,
never the output file it would have become.

Each format module registers one :class:`FormatSpec` (its name, how to
recognize a file of it, its task reader, its stream reader, its options with
their defaults, its inspector that prints the ``hpcmtl data convert`` command
lines for a file).  The command line and :func:`inspect_file` look formats up
here, so a new format is one module plus one :func:`register_format` call (and
its import at the end of this file).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class Option:
    """An option of a format: the reader's keyword ``name``, its ``default`` and the CLI ``flag`` that sets it.

    ``help`` says what it means for this format (``hpcmtl data convert --help``
    lists it per format, with the default); a help starting with ``--`` names
    the mode it applies to (``--online: ...``).  Several options of one format
    may share a flag when its meaning depends on the mode.
    """

    name: str
    default: Any = None
    help: str = ""
    flag: Optional[str] = None

    @property
    def cli_flag(self):
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def dest(self):
        """The attribute argparse stores the flag under."""
        return self.cli_flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class FormatSpec:
    """One input format.

    read(inputs, options, labels, report, test) -> (train, test)
        The task reader: ``train`` is ``(Xs, ys, names)``; ``test`` the same
        for ``--test-out`` (None when not asked: a reader that cannot give one
        when asked raises an InputError).  ``options`` maps every
        :class:`Option` name to its value, ``labels`` is a
        :class:`LabelRule` or None, ``report`` receives progress lines.
    stream(inputs, options, label_map, report, test) -> iterable of :class:`Stream`
        The ``--stream`` reader (None: the format has none); ``label_map`` is
        ``(positive_label, mapping)`` as given.  It yields the training stream,
        then the test stream when ``test`` is true.
    sniff(path, head) -> int or None
        How a file of this format is recognized (``head``: its first 4096
        bytes): a priority, the highest wins (5 HDF5 signature, 4 zip
        signature, 3 MATLAB header, 2 file name extension, 1 a first line that
        looks like the format, 0 the fallback), None when it is not one.
    kind, inspect(path, out)
        The file kind ``inspect`` reports and the function that fills its
        answer (``format``, ``variables``, ``layout``, ``commands``).
    one_input
        The format reads exactly one input path.
    test_out
        None: no ``--test-out``; else the note of when it applies ('' always).
    stream_test_out
        ``--test-out`` also works with ``--stream``.
    help
        A line for ``--format``'s help, when the name does not say enough.
    inputs(paths, options) -> list of paths
        Every file the readers open for these input paths (the paths
        themselves need not be listed), so that no output replaces one
        (:meth:`input_files`); None: every file under a directory input, at
        any depth (:func:`~hpcmtl.formats.checks.files_under`).
    """

    name: str
    read: Callable
    stream: Optional[Callable] = None
    options: tuple = ()
    sniff: Optional[Callable] = None
    kind: Optional[str] = None
    inspect: Optional[Callable] = None
    one_input: bool = False
    test_out: Optional[str] = None
    stream_test_out: bool = False
    help: str = ""
    inputs: Optional[Callable] = None

    def input_files(self, paths, options):
        """The input paths and every file the readers open for them (files that do not exist are left out)."""
        from .checks import files_under
        listed = self.inputs(paths, options) if self.inputs is not None else files_under(paths)
        return list(dict.fromkeys(list(paths) + [f for f in listed if os.path.isfile(f)]))

    def defaults(self):
        """``{option name: default}``."""
        return {o.name: o.default for o in self.options}

    def takes(self, flag):
        """Whether some option of the format is set by ``flag``."""
        return any(o.cli_flag == flag for o in self.options)

    def resolve(self, given):
        """``{option name: value}``: ``given[dest]`` (argparse's values) when set, else the default."""
        out = {}
        for o in self.options:
            value = given.get(o.dest)
            out[o.name] = o.default if value is None else value
        return out


@dataclass
class Stream:
    """One stream a format's stream reader yields, ready to be written.

    ``split`` is 'train' (the output) or 'test' (``--test-out``); ``attrs`` the
    attributes the format records (``order``); ``what`` says how the labels
    became columns (printed with the counts), ``note`` is a summary the
    format words itself when there is no ``what``.
    """

    X: Any
    Y: Any
    names: list
    split: str = "train"
    attrs: dict = field(default_factory=dict)
    what: Optional[str] = None
    note: Optional[str] = None


_REGISTRY: dict = {}


def register_format(spec):
    """Add ``spec`` to the formats (its module calls this once, at import)."""
    if spec.name in _REGISTRY:
        raise ValueError(f"format {spec.name!r} is registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def get_format(name):
    """The :class:`FormatSpec` called ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r} (formats: {', '.join(_REGISTRY)})") from None


def format_names():
    """The registered formats' names, in registration order (``--format``'s choices)."""
    return tuple(_REGISTRY)


def all_formats():
    """The registered :class:`FormatSpec` objects, in registration order."""
    return tuple(_REGISTRY.values())


def option_help(flag):
    """What ``flag`` means for each format that reads it, with its default: ``svmlight: ...; mds: ... (10000)``."""
    parts = []
    for spec in all_formats():
        for o in spec.options:
            if o.cli_flag != flag or not o.help:
                continue
            default = "" if o.default is None or isinstance(o.default, bool) else f" ({o.default})"
            parts.append(f"{spec.name}{' ' if o.help.startswith('--') else ': '}{o.help}{default}")
    return "; ".join(parts)


# The format modules register themselves on import; the registry above must exist first.  The order
# of these imports is the order of --format's choices.
from . import malsar, svmlight, csv, npz, mnist, mds, reuters, tasks  # noqa: E402,F401,I001

# The public names of the format modules, importable as ``hpcmtl.formats.NAME``.
from .checks import Labeled, check_tasks  # noqa: E402,F401
from .csv import csv_columns, from_csv  # noqa: E402,F401
from .inspect import inspect_file, inspection_lines  # noqa: E402,F401
from .labels import LabelRule, label_rule, short_list, show_label  # noqa: E402,F401
from .malsar import from_malsar  # noqa: E402,F401
from .mds import from_mds, read_processed, read_reviews  # noqa: E402,F401
from .mnist import from_mnist, mnist_one_vs_all, read_idx  # noqa: E402,F401
from .npz import from_npz  # noqa: E402,F401
from .reuters import (from_reuters, read_reuters, reuters_features, reuters_labels,  # noqa: E402,F401
                      reuters_online, reuters_topics)
from .standardize import SCALINGS, apply_standardization, scaling_text, standardization  # noqa: E402,F401
from .streams import labeled_stream, map_stream_labels, shuffle_rows, tasks_stream  # noqa: E402,F401
from .svmlight import from_svmlight  # noqa: E402,F401
from .tasks import from_task_file  # noqa: E402,F401
