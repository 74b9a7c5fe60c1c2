"""svmlight files: one file a task, or one file with ``qid:`` task ids; without ids, a single- or multi-label stream.

Parsed by scikit-learn's ``load_svmlight_file(s)``; when it refuses a file the
lines are re-scanned to name the first bad one.
"""
from __future__ import annotations

import os
import re

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from ..memory import MAX_COLUMNS
from . import FormatSpec, Option, register_format
from .checks import Labeled, check_tasks, file_names, require_file
from .inspect import map_hint_cells, q
from .labels import label_key
from .streams import labeled_stream, one_stream, tasks_as_stream


def _svmlight_lines(path):
    """``(line number, words)`` of every data line (sklearn's rules: '#' starts a comment, blank lines skipped)."""
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, start=1):
            words = line.split(b"#", 1)[0].split()
            if words:
                yield line_no, [w.decode("utf-8", "replace") for w in words]


def _svmlight_problem(words, one_based, n_features, multilabel=False):
    """What is wrong with one svmlight data line (its words), or None."""
    def number(text):
        try:
            value = float(text)
        except ValueError:
            return None
        return value if np.isfinite(value) else None

    features = words[1:]
    if multilabel and ":" in words[0] and not words[0].startswith("qid"):
        features = words                  # a line with no label (an empty label set)
    elif multilabel:
        for label in words[0].split(","):
            if number(label) is None:
                return f"label {label!r} of {words[0]!r} is not a finite number"
    elif number(words[0]) is None:
        if "," in words[0] and all(number(t) is not None for t in words[0].split(",")):
            return (f"label {words[0]!r} is several labels: a multi-label line (--stream reads multi-label files "
                    "without qid: task ids)")
        return f"label {words[0]!r} is not a finite number"
    if features and features[0].startswith("qid"):
        key, _, value = features.pop(0).partition(":")
        if key != "qid" or not re.fullmatch(r"[+-]?\d+", value):
            return f"{key}:{value!r} is not qid:INTEGER"
    previous = -1
    for word in features:
        index, sep, value = word.partition(":")
        if not sep or not re.fullmatch(r"\d+", index):
            return f"{word!r} is not INDEX:VALUE"
        if int(index) <= previous:
            return f"feature index {index} is not above the previous one (indices must be sorted and unique)"
        previous = int(index)
        if int(index) - one_based >= MAX_COLUMNS:
            return f"feature index {index} is beyond the largest supported column ({MAX_COLUMNS}, 2^31 - 1)"
        if number(value) is None:
            return f"feature {index}: {value!r} is not a finite number"
        if n_features is not None and int(index) - one_based >= n_features:
            return f"feature index {index} is beyond --n-features {n_features}"
    return None


def _svmlight_error(paths, n_features, exc, multilabel=False):
    """An InputError at the first bad line of ``paths`` (re-scanned after sklearn refused them)."""
    indices = {w.partition(":")[0] for p in paths for _, words in _svmlight_lines(p) for w in words[1:]}
    one_based = "0" not in indices          # sklearn's zero_based="auto" over all files
    for p in paths:
        for line_no, words in _svmlight_lines(p):
            problem = _svmlight_problem(words, one_based, n_features, multilabel)
            if problem:
                return InputError(f"{p}: line {line_no}: {problem}")
    return InputError(f"{', '.join(paths)}: not valid svmlight data ({exc})")


def _svmlight_locate(rows_of):
    """``locate`` over svmlight tasks: ``rows_of[i] = (path, file rows of task i)``, rows found as lines."""
    lines = {}

    def locate(i, field, row=None, column=None):
        path, rows = rows_of[i]
        if row is None:
            return path
        if path not in lines:
            lines[path] = [line_no for line_no, _ in _svmlight_lines(path)]
        return f"{path}: line {lines[path][rows[row]]}"
    return locate


def from_svmlight(paths, n_features=None, labels=None):
    """svmlight files as tasks: one file a task (named after it), or one file with ``qid:`` task ids."""
    from sklearn.datasets import load_svmlight_file, load_svmlight_files
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    for p in paths:
        require_file(p)
    try:
        if len(paths) == 1:
            X, y, qid = load_svmlight_file(paths[0], n_features=n_features, query_id=True, dtype=np.float64)
        else:
            loaded = load_svmlight_files(paths, n_features=n_features, dtype=np.float64)
    except (ValueError, OverflowError, UnicodeDecodeError) as exc:
        raise _svmlight_error(paths, n_features, exc) from None
    pairs = [(X, y)] if len(paths) == 1 else list(zip(loaded[0::2], loaded[1::2]))
    if pairs[0][0].shape[1] > MAX_COLUMNS:                 # before any array of that width is made
        raise _svmlight_error(paths, n_features, f"{pairs[0][0].shape[1]} features")
    if not all(np.isfinite(X.data).all() and np.isfinite(y).all() for X, y in pairs):
        raise _svmlight_error(paths, n_features, "NaN or Inf")
    if len(paths) == 1:
        path = paths[0]
        if X.shape[0] == 0:
            raise InputError(f"{path}: no data lines")
        if qid.shape[0] == 0:
            raise InputError(f"{path}: a single svmlight file needs 'qid:' task ids (or give one file per task; "
                             "--stream reads a single-label or multi-label file)")
        if qid.shape[0] != X.shape[0]:
            for line_no, words in _svmlight_lines(path):
                if len(words) < 2 or not words[1].startswith("qid:"):
                    raise InputError(f"{path}: line {line_no}: no 'qid:' task id (the other lines have one)")
        ids = np.unique(qid)
        if len(ids) <= 1:
            raise InputError(f"{path}: a single svmlight file needs 'qid:' task ids "
                             "(or give one file per task)")
        rows = [np.flatnonzero(qid == t) for t in ids]
        Xs, ys = [sp.csr_matrix(X[r]) for r in rows], [y[r] for r in rows]
        ys = check_tasks(Xs, ys, _svmlight_locate([(path, r) for r in rows]), labels)
        return Xs, ys, [f"qid{t}" for t in ids]
    Xs, ys = [sp.csr_matrix(X) for X in loaded[0::2]], list(loaded[1::2])
    ys = check_tasks(Xs, ys, _svmlight_locate([(p, np.arange(X.shape[0])) for p, X in zip(paths, Xs)]), labels)
    return Xs, ys, file_names(paths)


def _svmlight_labeled(path, n_features=None):
    """One svmlight file without task ids: single-label or multi-label (labels ``1,3``) rows.

    Returns a :class:`Labeled` whose ``y`` is a list of label tuples, or None
    when the file has ``qid:`` task ids (then it is a task dataset).
    """
    from sklearn.datasets import load_svmlight_file
    require_file(path)
    try:
        X, y, qid = load_svmlight_file(path, n_features=n_features, query_id=True, multilabel=True, dtype=np.float64)
    except (ValueError, OverflowError, UnicodeDecodeError) as exc:
        raise _svmlight_error([path], n_features, exc, multilabel=True) from None
    if X.shape[1] > MAX_COLUMNS:
        raise _svmlight_error([path], n_features, f"{X.shape[1]} features", multilabel=True)
    if not np.isfinite(X.data).all() or not all(np.isfinite(v) for t in y for v in t):
        raise _svmlight_error([path], n_features, "NaN or Inf", multilabel=True)
    if X.shape[0] == 0:
        raise InputError(f"{path}: no data lines")
    if len(np.unique(qid)) > 1:
        return None
    locate = _svmlight_locate([(path, np.arange(X.shape[0]))])
    return Labeled(sp.csr_matrix(X), list(y), locate, "label", path)


def inspect_svmlight(path, out, n_lines=1000):
    require_file(path)
    labels, qids, low, high, count, multi = set(), set(), None, -1, 0, False
    for _, words in _svmlight_lines(path):
        count += 1
        features = words[1:]
        if ":" in words[0] and not words[0].startswith("qid"):
            features, multi = words, True
        else:
            multi |= "," in words[0]
            labels.update(words[0].split(","))
        if features and features[0].startswith("qid:"):
            qids.add(features.pop(0)[4:])
        indices = [int(w.partition(":")[0]) for w in features if w.partition(":")[0].isdigit()]
        if indices:
            low = min(indices) if low is None else min(low, min(indices))
            high = max(high, max(indices))
        if count >= n_lines:
            break
    if not count:
        raise InputError(f"{path}: no data lines")
    shown = sorted(labels, key=lambda t: label_key(t)[1] if label_key(t)[0] == "n" else float("inf"))
    out["format"] = f"svmlight text (the first {count} data lines read)"
    out["variables"] = [
        {"name": "labels", "shape": [len(labels)], "dtype": "multi-label" if multi else "single-label",
         "first": shown[:8]},
        {"name": "features", "shape": [0 if low is None else high + (low == 0)], "dtype": "sparse",
         "first": [f"indices {low}..{high} ({'0' if low == 0 else '1'}-based)"] if low is not None else []}]
    if len(qids) > 1:
        out["variables"].append({"name": "qid", "shape": [len(qids)], "dtype": "task ids", "first": sorted(qids)[:8]})
        out["layout"] = f"task ids 'qid:' ({len(qids)} seen): one task a qid"
        hint = map_hint_cells(list(labels))
        out["commands"] = [f"hpcmtl data convert --format svmlight {q(path)} OUT.h5{hint}",
                           f"hpcmtl data convert --format svmlight {q(path)} OUT-stream.h5 --stream --shuffle{hint}"]
    elif multi:
        out["layout"] = "multi-label lines (labels 1,3): a stream, one +-1 column a label"
        out["commands"] = [f"hpcmtl data convert --format svmlight {q(path)} OUT-stream.h5 --stream --shuffle"]
    else:
        out["layout"] = ("single-label lines, no task ids: a stream (one column a class), or one task of "
                         "several files (one file a task)")
        out["commands"] = [f"hpcmtl data convert --format svmlight {q(path)} OUT-stream.h5 --stream --shuffle",
                           f"hpcmtl data convert --format svmlight {q(path)} MORE.svm OUT.h5"]



def _stream(inputs, options, labels, report):
    if len(inputs) == 1:
        lab = _svmlight_labeled(inputs[0], options["n_features"])
        if lab is not None:
            return labeled_stream(lab, labels)
    return tasks_as_stream(*from_svmlight(inputs, options["n_features"], labels))


def _sniff(path, head):
    if os.path.splitext(path)[1].lower() in (".svm", ".svmlight", ".libsvm"):
        return 2
    first = next((ln for ln in head.decode("utf-8", "replace").splitlines() if ln.strip()
                  and not ln.lstrip().startswith("#")), "")
    if re.fullmatch(r"\s*[^\s:]+(\s+qid:\S+)?(\s+\d+:\S+)*\s*", first) and ":" in first:
        return 1
    return None


register_format(FormatSpec(
    name="svmlight",
    read=lambda inputs, options, labels, report, test=False: (
        from_svmlight(inputs, options["n_features"], labels), None),
    stream=one_stream(_stream),
    options=(Option("n_features", None, "number of features"),),
    sniff=_sniff, kind="svmlight", inspect=inspect_svmlight))
