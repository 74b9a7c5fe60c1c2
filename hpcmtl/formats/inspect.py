"""``hpcmtl data inspect``: what a file holds and which ``hpcmtl data convert`` command reads it.

The format is recognized by the registry (each format's ``sniff``) and
described by that format's ``inspect`` function; the helpers here word the
label hints every inspector suggests.
"""
from __future__ import annotations

import os

import numpy as np

from . import all_formats
from .checks import require_file
from .labels import label_key, short_list, show_label


def q(path):
    """A path as a shell word in a suggested command."""
    import shlex
    return shlex.quote(path)


def shape_text(shape):
    return " x ".join(str(k) for k in shape) if len(shape) else "scalar"


def label_summary(labels):
    if labels is None:
        return ""
    labels = np.asarray(labels)
    if labels.ndim == 2 and min(labels.shape) > 1:
        return f" ({labels.shape[1]} label columns: multi-label)"
    values = np.unique(labels)
    return f" ({len(values)} distinct: {short_list([show_label(v) for v in values])})"


def map_hint(labels):
    """A label option to suggest when the labels are not -1/+1 (for the classifiers' losses)."""
    if labels is None:
        return ""
    values = np.unique(np.asarray(labels))
    if values.size == 0 or set(values.tolist()) <= {-1, 1} or values.size > 2 and values.dtype.kind == "f" \
            and np.any(values != np.round(values)):
        return ""
    if values.size == 2:
        return f" --labels {show_label(values[0])}:-1,{show_label(values[1])}:1"
    return f" --positive-label {show_label(values[-1])}"


def map_hint_cells(cells):
    keys = {label_key(c) for c in cells}
    if not keys or keys <= {("n", 1.0), ("n", -1.0)}:
        return ""
    if all(k[0] == "n" for k in keys):
        return map_hint(np.array([k[1] for k in keys]))
    return f" --positive-label {sorted(k[1] for k in keys if k[0] == 's')[-1]}"     # yes/no, spam/ham, pos/neg


def inspect_file(path):
    """What a file holds and which ``hpcmtl data convert`` flags would read it.

    Returns a dict: ``path``, ``format``, ``variables`` (name, shape, dtype
    and, for text files, the first values), ``layout`` (the guess) and
    ``commands`` (suggested commands).  Reads headers and metadata where the
    format allows it: ``scipy.io.whosmat``, the .npy headers inside a .npz
    archive, a CSV header and a few rows, the first lines of an svmlight file,
    an HDF5 file's metadata.
    """
    path = os.fspath(path)
    spec = sniff(path)
    out = {"path": path, "kind": spec.kind, "format": spec.kind, "variables": [], "layout": "", "commands": []}
    spec.inspect(path, out)
    return out


def sniff(path):
    """The format of a file, by content first and by extension for text (each format's ``sniff``: the highest wins)."""
    require_file(path)
    with open(path, "rb") as f:
        head = f.read(4096)
    ranked = [(rank, spec) for spec in all_formats() if spec.sniff is not None
              for rank in [spec.sniff(path, head)] if rank is not None]
    return max(ranked, key=lambda t: t[0])[1]


def inspection_lines(info, limit=24):
    """``inspect_file``'s answer as text lines (long variable lists cut in the middle)."""
    lines = [f"{info['path']}: {info['format']}"]
    rows = info["variables"]
    shown = rows if len(rows) <= limit else rows[:limit - 4] + [None] + rows[-3:]
    width = max([len(str(r["name"])) for r in rows if r] + [4])
    for r in shown:
        if r is None:
            lines.append(f"  ... {len(rows) - limit + 1} more")
            continue
        if info["kind"] == "csv":
            size = f"column {r['shape'][0]}"
        else:
            size = "?" if r["shape"] is None else shape_text(r["shape"])
        first = f"  {', '.join(map(str, r['first']))}" if r.get("first") else ""
        lines.append(f"  {str(r['name']):<{width}s}  {size:<12s} {r['dtype']:<8s}{first}".rstrip())
    lines.append(f"layout: {info['layout']}")
    lines += [f"  {c}" for c in info["commands"]]
    return lines
