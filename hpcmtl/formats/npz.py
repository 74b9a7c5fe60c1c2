""".npz files: arrays X_0, y_0, X_1, y_1, ...; stacked X, y, tasks; X, y; or sparse matrices
(``scipy.sparse.save_npz``, one a task) and one labels file."""
from __future__ import annotations

import os
import re

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from . import FormatSpec, register_format
from .checks import Labeled, check_name, numeric_array, require_file, stem, tasks_of
from .inspect import q, shape_text
from .labels import short_list
from .streams import one_stream, source_stream

_SAVE_NPZ_KEYS = {"format", "shape", "data"}       # what scipy.sparse.save_npz always writes


def _open_npz(path):
    import zipfile
    require_file(path)
    if not zipfile.is_zipfile(path):
        raise InputError(f"{path}: not a .npz archive (numpy.savez writes one)")
    try:
        return np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{path}: not a readable .npz file ({exc})") from None


def _npz_array(z, path, key, numeric=True):
    """Array ``key`` of an open .npz (numbers, or any plain array with ``numeric=False``)."""
    try:
        a = z[key]
    except ValueError:           # what allow_pickle=False says about object arrays
        raise InputError(f"{path}: array '{key}': holds Python objects; save numeric arrays") from None
    except Exception as exc:  # noqa: BLE001 - a damaged archive member
        raise InputError(f"{path}: array '{key}': cannot be read ({exc})") from None
    return numeric_array(a, f"{path}: array '{key}'") if numeric else a


def _array_locate(path, x_key, y_key, rows=None):
    """``locate`` for arrays of a .npz file (``rows[i]``: the rows of task i in the arrays, when stacked)."""
    def locate(i, field, row=None, column=None):
        key = x_key(i) if field == "X" else y_key(i)
        where = f"{path}: array '{key}'"
        if row is not None:
            where += f", {'row' if field == 'X' else 'element'} {(row if rows is None else rows[i][row]) + 1}"
        return where + (f", column {column + 1}" if column is not None else "")
    return locate


def _sparse_npz_source(paths, opened):
    """Matrices written by ``scipy.sparse.save_npz`` (one a task) and one labels file written by ``numpy.savez``."""
    matrices = [p for p in paths if _SAVE_NPZ_KEYS <= set(opened[p].files)]
    others = [p for p in paths if p not in matrices]
    if not others:
        raise InputError(f"{matrices[0]}: a matrix from scipy.sparse.save_npz holds no labels: give a labels .npz "
                         f"too (np.savez('labels.npz', {stem(matrices[0])}=y))")
    if len(others) > 1 or not matrices:
        raise InputError(f"{others[-1]}: not a matrix from scipy.sparse.save_npz (several .npz files are sparse "
                         "task matrices and one labels file)")
    lpath, z = others[0], opened[others[0]]
    Xs = []
    for p in matrices:
        try:
            X = sp.load_npz(p)
        except Exception as exc:  # noqa: BLE001 - scipy raises several types for bad files
            raise InputError(f"{p}: not a readable scipy.sparse.save_npz matrix ({exc})") from None
        Xs.append(numeric_array(sp.csr_matrix(X), f"{p}"))

    def x_locate(i, field, row=None, column=None):
        where = matrices[i] + (f": row {row + 1}" if row is not None else "")
        return where + (f", column {column + 1}" if column is not None else "")

    names = [stem(p) for p in matrices]
    dup = [n for n in names if names.count(n) > 1]
    if dup:
        raise InputError(f"{lpath}: two matrix files are named '{dup[0]}' (labels are found by file name)")
    keys = set(z.files)
    if len(matrices) == 1 and names[0] not in keys:
        if "y" not in keys:
            raise InputError(f"{lpath}: no array 'y' or '{names[0]}' (the labels of {matrices[0]})")
        y = _npz_array(z, lpath, "y", numeric=False)
        loc_y = _array_locate(lpath, None, lambda i: "y")

        def locate(i, field, row=None, column=None):
            return x_locate(0, field, row, column) if field == "X" else loc_y(0, field, row, column)
        if "tasks" not in keys:
            named = [k for k in ("class_names", "target_names") if k in keys]
            if named:                                 # e.g. fetch_20newsgroups_vectorized: y indexes target_names
                y = _named_classes(y, _npz_array(z, lpath, named[0], False), lpath, named[0])
            return ("labeled", Labeled(Xs[0], y, locate, "y", lpath, task_name=names[0]))
        tasks = _npz_array(z, lpath, "tasks", numeric=False)
        if tasks.ndim != 1 or tasks.dtype.kind not in "biuUS" or len(tasks) != Xs[0].shape[0] or y.size != len(tasks):
            raise InputError(f"{lpath}: arrays y {y.shape} and tasks {tasks.shape} need one label and task id "
                             f"(integers or text) per row of {matrices[0]} ({Xs[0].shape[0]} rows)")
        order = list(dict.fromkeys(tasks.tolist()))
        rows = [np.flatnonzero(tasks == t) for t in order]
        names = [check_name(t, f"{lpath}: array 'tasks', element {r[0] + 1}") for t, r in zip(order, rows)]
        y = y.reshape(-1)

        def stacked(i, field, row=None, column=None):
            return locate(0, field, None if row is None else rows[i][row], column)
        return "tasks", [Xs[0][r] for r in rows], [y[r] for r in rows], names, stacked
    for n, p in zip(names, matrices):
        if n not in keys:
            raise InputError(f"{lpath}: no array '{n}' (the labels of {p})")
    extra = sorted(keys - set(names))
    if extra:
        raise InputError(f"{lpath}: array '{extra[0]}' is the labels of no matrix file (give {extra[0]}.npz too)")
    ys = [_npz_array(z, lpath, n, numeric=False) for n in names]
    y_locate = _array_locate(lpath, None, lambda i: names[i])

    def locate(i, field, row=None, column=None):
        return x_locate(i, field, row, column) if field == "X" else y_locate(i, field, row, column)
    return "tasks", Xs, ys, names, locate


def _npz_source(paths):
    """``('tasks', Xs, ys, names, locate)`` or ``('labeled', Labeled)`` of .npz input files."""
    opened = {}
    for p in paths:
        opened[p] = _open_npz(p)
    if len(paths) > 1 or _SAVE_NPZ_KEYS <= set(opened[paths[0]].files):
        return _sparse_npz_source(paths, opened)
    path, z = paths[0], opened[paths[0]]
    keys = set(z.files)
    if {"X", "y", "tasks"} <= keys:
        X, y, tasks = _npz_array(z, path, "X"), _npz_array(z, path, "y", False), _npz_array(z, path, "tasks", False)
        if tasks.ndim != 1 or X.ndim != 2 or len(X) != len(tasks) or y.size != len(tasks):
            raise InputError(f"{path}: arrays X {X.shape}, y {y.shape} and tasks {tasks.shape} "
                             "need one row, label and task id per sample")
        if tasks.dtype.kind not in "biuUS":
            raise InputError(f"{path}: array 'tasks' holds {tasks.dtype} values, expected task ids (integers or text)")
        y = y.reshape(-1)
        order = list(dict.fromkeys(tasks.tolist()))
        rows = [np.flatnonzero(tasks == t) for t in order]
        names = [check_name(t, f"{path}: array 'tasks', element {r[0] + 1}") for t, r in zip(order, rows)]
        locate = _array_locate(path, lambda i: "X", lambda i: "y", rows)
        return "tasks", [X[r] for r in rows], [y[r] for r in rows], names, locate
    suffixes = sorted((int(k[2:]), k[2:]) for k in keys if re.fullmatch(r"X_\d+", k))
    if not suffixes and {"X", "y"} <= keys:
        locate = _array_locate(path, lambda i: "X", lambda i: "y")
        y = _npz_array(z, path, "y", False)
        named = [k for k in ("class_names", "target_names") if k in keys]
        if named:                                     # scikit-learn's datasets: y indexes the class names
            y = _named_classes(y, _npz_array(z, path, named[0], False), path, named[0])
        return "labeled", Labeled(_npz_array(z, path, "X"), y, locate, "y", path)
    if not suffixes:
        raise InputError(f"{path}: expected arrays X, y, tasks or X_0, y_0, X_1, y_1, ... or X, y "
                         f"(arrays: {short_list(sorted(keys))})")
    for _, sfx in suffixes:
        if f"y_{sfx}" not in keys:
            raise InputError(f"{path}: array 'y_{sfx}' is missing (there is an 'X_{sfx}')")
    locate = _array_locate(path, lambda i: f"X_{suffixes[i][1]}", lambda i: f"y_{suffixes[i][1]}")
    Xs = [_npz_array(z, path, f"X_{sfx}") for _, sfx in suffixes]
    ys = [_npz_array(z, path, f"y_{sfx}", False) for _, sfx in suffixes]
    names = [check_name(_npz_array(z, path, f"name_{sfx}", numeric=False), f"{path}: array 'name_{sfx}'")
             if f"name_{sfx}" in keys else f"task{i}" for i, sfx in suffixes]
    return "tasks", Xs, ys, names, locate


def _named_classes(y, names, path, key):
    """Class ids 0..n-1 in ``y`` as the text of ``names[y]`` (``class_names`` / ``target_names``, as
    ``sklearn.datasets`` bunches hold them), so a stream's label columns carry the names."""
    names = np.asarray(names)
    if names.ndim != 1 or names.dtype.kind not in "US" or len(set(names.tolist())) != names.size:
        raise InputError(f"{path}: array '{key}' must be a 1-D list of distinct names, got {names.dtype} "
                         f"{names.shape}")
    if y.dtype.kind not in "iu" or y.ndim != 1:
        raise InputError(f"{path}: array 'y' must hold integer class ids 0..{names.size - 1} with '{key}', "
                         f"got {y.dtype} {y.shape}")
    bad = np.flatnonzero((y < 0) | (y >= names.size))
    if bad.size:
        raise InputError(f"{path}: array 'y', element {int(bad[0]) + 1}: class {int(y[bad[0]])} has no name in "
                         f"'{key}' ({names.size} names)")
    return names.astype(str)[y]


def from_npz(paths, labels=None):
    """.npz files as tasks.

    One file from ``numpy.savez``: arrays ``X_0, y_0, X_1, y_1, ...`` (and
    optional names ``name_0, ...``), or stacked ``X, y, tasks``, or ``X, y``
    (one task named after the file).  Or sparse matrices, one file a task
    written by ``scipy.sparse.save_npz(NAME.npz, X)``, plus one labels file
    ``numpy.savez(labels.npz, NAME=y, ...)`` (a single matrix file may use
    ``y`` and ``tasks`` in the labels file instead).
    """
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    source = _npz_source(paths)
    return tasks_of(source, labels)


def _npz_headers(path):
    """``{name: (shape, dtype)}`` of the arrays of a .npz archive, from their .npy headers only."""
    import zipfile
    from numpy.lib import format as npy
    arrays = {}
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                continue
            name = info.filename[:-4]
            try:
                with zf.open(info) as f:
                    version = npy.read_magic(f)
                    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                    shape, _, dtype = read(f)
            except Exception:  # noqa: BLE001 - a member numpy cannot describe (version 3 header, damage)
                shape, dtype = None, "unreadable header"
            arrays[name] = (shape, str(dtype))
    return arrays


def inspect_npz(path, out):
    arrays = _npz_headers(path)
    out["format"] = ".npz archive (array headers only)"
    out["variables"] = [{"name": k, "shape": None if v[0] is None else list(v[0]), "dtype": v[1]}
                        for k, v in arrays.items()]
    keys = set(arrays)
    if _SAVE_NPZ_KEYS <= keys:
        z = _open_npz(path)
        fmt = _npz_array(z, path, "format", numeric=False).item()
        fmt = fmt.decode("ascii", "replace") if isinstance(fmt, bytes) else str(fmt)
        shape = tuple(int(v) for v in _npz_array(z, path, "shape"))
        nnz = arrays["data"][0][0] if arrays["data"][0] else "?"
        out["layout"] = (f"a sparse {fmt} {shape_text(shape)} matrix from scipy.sparse.save_npz ({nnz} stored "
                         f"values): one task, its labels in a labels .npz (array '{stem(path)}', or 'y')")
        out["commands"] = [f"hpcmtl data convert --format npz {q(path)} [MORE.npz ...] LABELS.npz OUT.h5",
                           f"hpcmtl data convert --format npz {q(path)} LABELS.npz OUT-stream.h5 --stream --shuffle"]
        return
    tasks = sorted(k for k in keys if re.fullmatch(r"X_\d+", k))
    if {"X", "y", "tasks"} <= keys:
        out["layout"] = "stacked X, y and task ids 'tasks' (one task a distinct id)"
    elif tasks:
        out["layout"] = f"{len(tasks)} tasks as arrays X_i, y_i"
    elif {"X", "y"} <= keys:
        out["layout"] = "one matrix X and its labels y: one task named after the file, or a stream"
        out["commands"] = [f"hpcmtl data convert --format npz {q(path)} OUT.h5",
                           f"hpcmtl data convert --format npz {q(path)} OUT-stream.h5 --stream --shuffle"]
        return
    elif keys and all(v[0] is not None and len(v[0]) in (1, 2) for v in arrays.values()):
        out["layout"] = (f"label arrays {short_list(sorted(keys))}: the labels file of matrices written by "
                         f"scipy.sparse.save_npz as {short_list([k + '.npz' for k in sorted(keys)])}")
        out["commands"] = [f"hpcmtl data convert --format npz "
                           f"{' '.join(k + '.npz' for k in sorted(keys)[:3])}{' ...' if len(keys) > 3 else ''} "
                           f"{path} OUT.h5"]
        return
    else:
        out["layout"] = ("no layout hpcmtl reads: expected X_0, y_0, ...; X, y, tasks; X, y; or a matrix from "
                         "scipy.sparse.save_npz")
        return
    out["commands"] = [f"hpcmtl data convert --format npz {q(path)} OUT.h5",
                       f"hpcmtl data convert --format npz {q(path)} OUT-stream.h5 --stream --shuffle"]



def _sniff(path, head):
    import zipfile
    return 4 if zipfile.is_zipfile(path) else None


register_format(FormatSpec(
    name="npz",
    read=lambda inputs, options, labels, report, test=False: (from_npz(inputs, labels), None),
    stream=one_stream(lambda inputs, options, labels, report: source_stream(_npz_source(inputs), labels)),
    sniff=_sniff, kind="npz", inspect=inspect_npz))
