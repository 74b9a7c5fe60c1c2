"""MALSAR .mat files: cell arrays X, Y (one file, one task a cell), or fea/gnd (one task a file).

Read with ``scipy.io.loadmat`` (MATLAB files up to v7; v7.3 files are HDF5).
"""
from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from . import FormatSpec, Option, register_format
from .checks import Labeled, file_names, numeric_array, require_file, tasks_of
from .inspect import label_summary, map_hint, q
from .labels import short_list
from .streams import one_stream, source_stream


def _loadmat(path):
    import scipy.io
    require_file(path)
    try:
        return scipy.io.loadmat(path, appendmat=False)
    except NotImplementedError:     # scipy reads MATLAB files up to v7; v7.3 files are HDF5
        raise InputError(f"{path}: a MATLAB v7.3 file; save it with save(..., '-v7') to convert it") from None
    except Exception as exc:  # noqa: BLE001 - scipy raises several types for bad files
        raise InputError(f"{path}: not a readable MATLAB file ({exc})") from None


def _mat_variables(mat):
    return ", ".join(k for k in mat if not k.startswith("__")) or "none"


def _mat_labeled(path, mat, x_key, y_key):
    """A matrix ``x_key`` (dense or sparse, n x d) and its labels ``y_key`` (n labels, or n x k) of a .mat file."""
    def locate(i, field, row=None, column=None):
        where = f"{path}: field '{x_key if field == 'X' else y_key}'"
        if row is not None:
            where += f", row {row + 1}"
        return where + (f", column {column + 1}" if column is not None else "")

    X = numeric_array(mat[x_key], locate(0, "X"))
    y = mat[y_key].toarray() if sp.issparse(mat[y_key]) else np.asarray(mat[y_key])
    if y.dtype.kind not in "biuf":
        y = numeric_array(y, locate(0, "y"))
    if y.ndim == 2 and 1 in y.shape and y.size == X.shape[0]:
        y = y.reshape(-1)
    return Labeled(X, y, locate, y_key, path)


def _mat_source(paths, stream=False):
    """``('tasks', Xs, ys, names, locate)`` or ``('labeled', Labeled)`` of one or more .mat files."""
    mats = [(p, _loadmat(p)) for p in paths]
    if len(mats) > 1:
        parts = []
        for path, mat in mats:
            if "fea" not in mat or "gnd" not in mat:
                raise InputError(f"{path}: field '{'fea' if 'fea' not in mat else 'gnd'}' is missing (several .mat "
                                 f"files are one task each: a matrix 'fea' and labels 'gnd'; variables: "
                                 f"{_mat_variables(mat)})")
            parts.append(_mat_labeled(path, mat, "fea", "gnd"))
        return ("tasks", [t.X for t in parts], [t.y for t in parts], file_names(paths),
                lambda i, *where: parts[i].locate(i, *where))
    path, mat = mats[0]
    if "X" not in mat and "fea" in mat:
        if "gnd" not in mat:
            raise InputError(f"{path}: field 'gnd' is missing (a fea/gnd file holds a matrix 'fea' and its labels "
                             f"'gnd'; variables: {_mat_variables(mat)})")
        return ("labeled", _mat_labeled(path, mat, "fea", "gnd"))
    if stream and "X" in mat and mat["X"].dtype != object and ("Y" in mat or "y" in mat):
        return ("labeled", _mat_labeled(path, mat, "X", "Y" if "Y" in mat else "y"))   # one matrix and its labels
    for key in ("X", "Y"):
        if key not in mat:
            extra = " or a matrix 'fea' and labels 'gnd'" if key == "X" else ""
            raise InputError(f"{path}: field '{key}' is missing (MALSAR files hold cell arrays X and Y{extra}; "
                             f"variables: {_mat_variables(mat)})")
    for key in ("X", "Y"):
        if mat[key].dtype != object:
            shape = " x ".join(str(k) for k in mat[key].shape)
            raise InputError(f"{path}: field '{key}' is a {shape} {mat[key].dtype} matrix, "
                             "expected a cell array (one cell per task)")
    X, Y = mat["X"].ravel(), mat["Y"].ravel()
    if X.shape != Y.shape:
        raise InputError(f"{path}: X has {X.size} tasks but Y has {Y.size}")

    def locate(i, field, row=None, column=None):
        where = f"{path}: cell {field.upper()}{{{i + 1}}}"
        if row is not None:
            where += f", row {row + 1}"
        return where + (f", column {column + 1}" if column is not None else "")

    Xs = [numeric_array(x, locate(i, "X")) for i, x in enumerate(X)]
    ys = [numeric_array(y, locate(i, "y")) for i, y in enumerate(Y)]
    return "tasks", Xs, ys, [f"task{i + 1:03d}" for i in range(len(Xs))], locate


def from_malsar(paths, labels=None, x=None, y=None, report=None):
    """MALSAR .mat files as tasks: ``(Xs, ys, names)`` (:func:`read_malsar` for the test split too).

    One file with cell arrays ``X`` (1 x m, each n_i x d, dense or sparse) and
    ``Y`` (1 x m, each n_i x 1): task i is cell i (names ``task001``, ...).
    Or one or more files each with a matrix ``fea`` (n x d, dense or sparse)
    and labels ``gnd`` (n x 1): one task a file, named after the file.
    ``x`` and ``y`` name the variables of one file instead (:func:`named_source`:
    cell arrays, a shared design matrix and a response matrix, or a matrix and
    its one-hot classes, with ``test`` the test split from the same file).
    """
    return read_malsar(paths, labels, x, y, False, report)[0]


def read_malsar(paths, labels=None, x=None, y=None, test=False, report=None):
    """:func:`from_malsar` as ``(train, test)`` (test None unless asked: ``--test-out``, with ``x`` and ``y``)."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if x is None and y is None:
        if test:
            raise InputError("--test-out for .mat files: name the training variables with --x and --y (the test "
                             "ones are the same names with 'train' -> 'test')")
        return tasks_of(_mat_source(paths), labels), None
    if x is None or y is None:
        raise InputError(f"{'--y' if x is not None else '--x'} is missing: --x and --y name the feature and label "
                         f"variables together")
    if len(paths) != 1:
        raise InputError(f"--x/--y name the variables of one .mat file, got {len(paths)} files")
    tx, ty = _test_name(x), _test_name(y)
    if test and (tx is None or ty is None):
        raise InputError(f"--test-out with --x {x} --y {y}: the test variables are found by the names with "
                         f"'train' -> 'test' (trainW -> testW); these names hold no 'train'")
    mat = _loadmat(paths[0])
    train = tasks_of(named_source(paths[0], mat, x, y, report), labels)
    if not test:
        return train, None
    split = tasks_of(named_source(paths[0], mat, tx, ty, report), labels)
    if split[2] != train[2]:
        raise InputError(f"{paths[0]}: the test variables '{tx}', '{ty}' give tasks {short_list(split[2])}, the "
                         f"training ones {short_list(train[2])}")
    return train, split


def _test_name(name):
    """``trainW`` -> ``testW``, ``Xtrain`` -> ``Xtest``, ``X_TRAIN`` -> ``X_TEST``; None without 'train'."""
    for a, b in (("train", "test"), ("Train", "Test"), ("TRAIN", "TEST")):
        if a in name:
            return name.replace(a, b, 1)
    return None


def _text_cells(value):
    """A MATLAB cell array of strings or a char matrix as a list of str (None when it is neither)."""
    a = np.asarray(value)
    if a.dtype.kind == "U":
        return [str(r).strip() for r in (a.ravel() if a.ndim < 2 else ["".join(row) for row in a])]
    if a.dtype == object:
        out = []
        for cell in a.ravel():
            cell = np.asarray(cell)
            if cell.dtype.kind != "U":
                return None
            out.append("".join(cell.ravel().tolist()).strip())
        return out
    return None


def constant_columns(X):
    """Indices of the columns of a dense or CSR matrix whose values are all equal (a bias column of ones)."""
    if sp.issparse(X):
        X = X.toarray()
    return np.flatnonzero(np.all(X == X[:1], axis=0)) if X.shape[0] else np.zeros(0, dtype=int)


def one_hot(Y):
    """Whether ``Y`` (n x C, C >= 2) is a 0/1 (or -1/+1) class matrix with one 1 a row."""
    Y = Y.toarray() if sp.issparse(Y) else np.asarray(Y)
    if Y.ndim != 2 or Y.shape[1] < 2 or Y.dtype.kind not in "biuf":
        return False
    on = Y == 1
    return bool(np.all(on | (Y == 0) | (Y == -1)) and np.all(on.sum(axis=1) == 1))


def named_source(path, mat, x, y, report=None, stream=False):
    """``('tasks', Xs, ys, names, locate)`` of one .mat file's variables ``x`` (features) and ``y`` (labels).

    * both cell arrays: MALSAR's layout under other names (task i: cells ``x{i}``, ``y{i}``);
    * ``x`` a k x p design shared by every task and ``y`` an m x k response matrix (conjoint
      analysis): one task a row of ``y`` (its responses to the k profiles; a NaN response left out),
      every task's rows the design; a constant column (the design's intercept) is dropped and
      reported, the per-task intercept takes its place;
    * ``x`` n x d and ``y`` an n x C one-hot class matrix: one task a class (+1 on its rows, -1 on
      the others), named by a ``class_names`` variable when the file has one (``stream``:
      ``('stream', X, Y, names, what)``, one +-1 label column a class);
    * ``x`` n x d and ``y`` n labels: one task, named after the file.
    """
    for key in (x, y):
        if key not in mat:
            raise InputError(f"{path}: field '{key}' is missing (variables: {_mat_variables(mat)})")
    X, Y = mat[x], mat[y]

    def cell_locate(i, field, row=None, column=None):
        where = f"{path}: cell {x if field == 'X' else y}{{{i + 1}}}"
        if row is not None:
            where += f", row {row + 1}"
        return where + (f", column {column + 1}" if column is not None else "")

    if X.dtype == object or Y.dtype == object:
        if X.dtype != object or Y.dtype != object:
            cell, other = (x, y) if X.dtype == object else (y, x)
            raise InputError(f"{path}: field '{cell}' is a cell array but '{other}' is not (a cell a task in both)")
        X, Y = X.ravel(), Y.ravel()
        if X.shape != Y.shape:
            raise InputError(f"{path}: {x} has {X.size} cells but {y} has {Y.size}")
        Xs = [numeric_array(c, cell_locate(i, "X")) for i, c in enumerate(X)]
        ys = [numeric_array(c, cell_locate(i, "y")) for i, c in enumerate(Y)]
        return "tasks", Xs, ys, [f"task{i + 1:03d}" for i in range(len(Xs))], cell_locate
    X = numeric_array(X, f"{path}: field '{x}'")
    Y = numeric_array(Y, f"{path}: field '{y}'")
    Y = Y.toarray() if sp.issparse(Y) else Y
    if X.ndim != 2:
        raise InputError(f"{path}: field '{x}': expected a 2-D matrix, got shape {X.shape}")
    if Y.ndim == 2 and Y.shape[1] == X.shape[0] and Y.shape[0] > 1 and Y.shape[0] != X.shape[0]:
        return _design_source(path, x, y, X, Y, report)
    if Y.ndim == 2 and Y.shape[0] == X.shape[0] and one_hot(Y):
        names = _text_cells(mat["class_names"]) if "class_names" in mat else None
        if names is None or len(names) != Y.shape[1] or len(set(names)) != len(names) or not all(names):
            names = [f"class{c + 1}" for c in range(Y.shape[1])]
        signed = np.where(Y == 1, 1.0, -1.0)
        if stream:                          # one label column a class, one round a row
            return "stream", X, signed, names, f"{len(names)} classes, one-hot"

        def class_locate(i, field, row=None, column=None):
            if field == "X":
                where = f"{path}: field '{x}'" + (f", row {row + 1}" if row is not None else "")
                return where + (f", column {column + 1}" if column is not None else "")
            return f"{path}: field '{y}', column {i + 1}" + (f", row {row + 1}" if row is not None else "")
        return "tasks", [X] * len(names), list(signed.T), names, class_locate
    if Y.ndim == 2 and 1 in Y.shape and Y.size == X.shape[0]:
        return "labeled", _mat_labeled(path, mat, x, y)
    raise InputError(f"{path}: field '{y}' is {' x '.join(map(str, Y.shape))}; with '{x}' "
                     f"{' x '.join(map(str, X.shape))} it must be {X.shape[0]} labels, a {X.shape[0]} x C one-hot "
                     f"class matrix, or m x {X.shape[0]} responses (one task a row)")


def _design_source(path, x, y, D, R, report):
    """One task a row of the response matrix ``R`` (m x k), each over the shared design ``D`` (k x p)."""
    const = constant_columns(D)
    if const.size and const.size < D.shape[1]:
        keep = np.setdiff1d(np.arange(D.shape[1]), const)
        if report is not None:
            report(f"{path}: column{'s' if const.size > 1 else ''} {', '.join(str(c + 1) for c in const)} of "
                   f"'{x}' constant: left out (every task has its own intercept)")
        D = D[:, keep] if not sp.issparse(D) else sp.csr_matrix(D[:, keep])
    else:
        keep = np.arange(D.shape[1])
    Xs, ys = [], []
    for row in R:
        known = np.isfinite(row)             # a respondent who skipped a profile: that row is left out
        Xs.append(D[known])
        ys.append(row[known])

    def locate(i, field, row=None, column=None):
        if field == "X":
            where = f"{path}: field '{x}'" + (f", row {row + 1}" if row is not None else "")
            return where + (f", column {keep[column] + 1}" if column is not None else "")
        return f"{path}: field '{y}', row {i + 1}" + (f", column {row + 1}" if row is not None else "")
    width = len(str(R.shape[0]))
    return "tasks", Xs, ys, [f"{y}{i + 1:0{width}d}" for i in range(R.shape[0])], locate


def inspect_mat(path, out):
    import scipy.io
    try:
        variables = scipy.io.whosmat(path, appendmat=False)
    except NotImplementedError:
        out["layout"] = "a MATLAB v7.3 file (HDF5): scipy reads up to v7; save it with save(..., '-v7')"
        return
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{path}: not a readable MATLAB file ({exc})") from None
    out["format"] = "MATLAB .mat (scipy.io.whosmat: names, shapes and classes only)"
    out["variables"] = [{"name": n, "shape": list(shape), "dtype": cls} for n, shape, cls in variables]
    kinds = {n: cls for n, _, cls in variables}
    shapes = {n: shape for n, shape, _ in variables}
    if kinds.get("X") == "cell" and kinds.get("Y") == "cell":
        m = int(np.prod(shapes["X"]))
        out["layout"] = f"MALSAR cell arrays: {m} tasks (cell X{{i}}, dense or sparse, and its labels Y{{i}})"
        out["commands"] = [f"hpcmtl data convert --format malsar {q(path)} OUT.h5",
                           f"hpcmtl data convert --format malsar {q(path)} OUT-stream.h5 --stream --shuffle"]
        return
    pair = next(((x, y) for x, y in (("fea", "gnd"), ("X", "Y"), ("X", "y")) if x in kinds and y in kinds
                 and kinds[x] != "cell"), None)
    if pair is None:
        propose_named(path, kinds, shapes, out)
        return
    x, y = pair
    n, d = (list(shapes[x]) + [0, 0])[:2]
    labels = None
    if kinds[y] not in ("cell", "struct", "char", "sparse") and int(np.prod(shapes[y])) <= 10 ** 7:
        labels = np.asarray(scipy.io.loadmat(path, appendmat=False, variable_names=[y])[y])
    summary = label_summary(labels)
    what = f"a {'sparse' if kinds[x] == 'sparse' else 'dense'} {n} x {d} matrix '{x}' and labels '{y}'{summary}"
    if x == "fea":
        out["layout"] = f"{what}: one task (several fea/gnd files: one task a file, named after the file)"
        out["commands"] = [f"hpcmtl data convert --format malsar {q(path)} [MORE.mat ...] OUT.h5" + map_hint(labels),
                           f"hpcmtl data convert --format malsar {q(path)} OUT-stream.h5 --stream --shuffle"]
    else:
        out["layout"] = f"{what}: one matrix and its labels (a stream)"
        out["commands"] = [f"hpcmtl data convert --format malsar {q(path)} OUT-stream.h5 --stream --shuffle"]



_X_WORDS = ("x", "fea", "feature", "data", "design", "w", "input")
_Y_WORDS = ("y", "gnd", "label", "target", "class", "response", "rating", "c", "output")


def _name_score(name, words):
    """How much a variable's name looks like one of ``words`` (2: is one, 1: contains one, 0: neither)."""
    low = name.lower().replace("train", "").replace("test", "").strip("_")
    return 2 if low in words else 1 if any(len(w) > 1 and w in low for w in words) else 0


def _pairs(path, kinds, shapes):
    """Candidate ``(score, layout, x, y)`` pairs of a .mat file's variables, best first (by shapes, then names)."""
    import scipy.io
    numeric = [n for n, k in kinds.items() if k not in ("cell", "struct", "char", "object", "function")]
    cells = [n for n, k in kinds.items() if k == "cell"]
    found = []
    for a in cells:                          # cell arrays of the same length: MALSAR's layout, other names
        for b in cells:
            if a != b and int(np.prod(shapes[a])) == int(np.prod(shapes[b])):
                found.append([3, "cells", a, b])
    for a in numeric:
        for b in numeric:
            sa, sb = list(shapes[a]), list(shapes[b])
            if a == b or len(sa) != 2 or len(sb) != 2:
                continue
            if 1 in sb and max(sb) == sa[0] and sa[0] > 1:
                found.append([2, "labels", a, b])
            elif sb[0] == sa[0] and sb[1] >= 2 and int(np.prod(sb)) <= 10 ** 7:
                found.append([2, "classes", a, b])
            elif sb[1] == sa[0] and sb[0] > 1 and sb[0] != sa[0]:
                found.append([2, "design", a, b])
    if cells and any(f[1] == "cells" for f in found):
        loaded = scipy.io.loadmat(path, appendmat=False, variable_names=cells)
        for f in found:
            if f[1] == "cells":              # the feature cells hold matrices, the label cells vectors
                first = [np.asarray(loaded[v].ravel()[0]) if loaded[v].size else np.zeros((0, 0)) for v in f[2:]]
                if min(first[1].shape or (1,)) == 1 and min(first[0].shape or (0,)) > 1:
                    f[0] += 2
    names = [f[3] for f in found if f[1] == "classes"]
    loaded = scipy.io.loadmat(path, appendmat=False, variable_names=names) if names else {}
    for f in found:
        if f[1] == "classes" and not one_hot(loaded[f[3]]):
            f[0] = -1                        # an n x k matrix that is not one class a row: not this layout
        f[0] += 0.5 * (_name_score(f[2], _X_WORDS) + _name_score(f[3], _Y_WORDS))
        if "train" in f[2].lower() and "train" in f[3].lower():
            f[0] += 0.5                      # the training split first when the file holds both
    return sorted((f for f in found if f[0] >= 0), key=lambda f: -f[0])


def propose_named(path, kinds, shapes, out):
    """``data inspect``'s answer for a .mat file whose variables are not MALSAR's names: the likely pair and
    the layout it makes, as a ``--x NAME --y NAME`` command (the other pairs listed)."""
    import scipy.io
    pairs = _pairs(path, kinds, shapes)
    if not pairs:
        out["layout"] = ("no layout hpcmtl reads: expected cell arrays (tasks) of features and labels, a matrix "
                         "and its labels or one-hot classes, or a design matrix and responses (one task a row); "
                         "variables: " + ", ".join(kinds))
        return
    _, layout, x, y = pairs[0]
    base = f"hpcmtl data convert --format malsar {q(path)} OUT.h5 --x {q(x)} --y {q(y)}"
    if layout == "cells":
        m = int(np.prod(shapes[x]))
        out["layout"] = f"cell arrays '{x}' (features) and '{y}' (labels): {m} tasks, MALSAR's layout under other names"
        labels = None
    elif layout == "design":
        D = scipy.io.loadmat(path, appendmat=False, variable_names=[x])[x]
        const = constant_columns(D.toarray() if sp.issparse(D) else np.asarray(D, dtype=float))
        k, p = shapes[x]
        note = (f"; column {', '.join(str(c + 1) for c in const)} of '{x}' is constant (an intercept): left out, "
                f"every task has its own" if 0 < const.size < p else "")
        out["layout"] = (f"a design '{x}' ({k} profiles x {p} attributes) shared by every task and responses "
                         f"'{y}' ({shapes[y][0]} x {k}): one task a row of '{y}'{note}")
        out["constant_columns"] = [int(c) for c in const]
        labels = None
    elif layout == "classes":
        C = shapes[y][1]
        named = " (task names from 'class_names')" if "class_names" in kinds else ""
        out["layout"] = f"a {shapes[x][0]} x {shapes[x][1]} matrix '{x}' and one-hot classes '{y}': {C} tasks, " \
                        f"one a class (+1 on its rows, -1 on the others){named}"
        labels = None
    else:
        labels = np.asarray(scipy.io.loadmat(path, appendmat=False, variable_names=[y])[y])
        out["layout"] = f"a {shapes[x][0]} x {shapes[x][1]} matrix '{x}' and labels '{y}'{label_summary(labels)}: one task"
    tx, ty = _test_name(x), _test_name(y)
    test = tx in kinds and ty in kinds
    if test:
        out["layout"] += f"; the test split in '{tx}' and '{ty}'"
    out["commands"] = [base + (" --test-out OUT-test.h5" if test else "") + map_hint(labels)]
    if layout == "classes":
        out["commands"].append(f"hpcmtl data convert --format malsar {q(path)} OUT-stream.h5 --x {q(x)} --y {q(y)} "
                               f"--stream --shuffle")
    others = [f"--x {a} --y {b} ({kind})" for _, kind, a, b in pairs[1:4]
              if {a, b} != {tx, ty} and not (a == y and b == x)]
    if others:
        out["layout"] += "; other pairs: " + ", ".join(others)


def _sniff(path, head):
    return 3 if head.startswith(b"MATLAB") or path.lower().endswith(".mat") else None


def _stream(inputs, options, labels, report):
    x, y = options["x_name"], options["y_name"]
    if x is None and y is None:
        return source_stream(_mat_source(inputs, stream=True), labels)
    if x is None or y is None or len(inputs) != 1:
        read_malsar(inputs, labels, x, y)                   # its one-line error for the option misuse
    source = named_source(inputs[0], _loadmat(inputs[0]), x, y, report, stream=True)
    return source[1:] if source[0] == "stream" else source_stream(source, labels)


register_format(FormatSpec(
    name="malsar",
    read=lambda inputs, options, labels, report, test=False: read_malsar(inputs, labels, options["x_name"],
                                                                         options["y_name"], test, report),
    stream=one_stream(_stream),
    options=(Option("x_name", None, "the feature variable of a .mat file (cell array, matrix or shared design)",
                    flag="--x"),
             Option("y_name", None, "the label variable: cell array, labels, one-hot classes, or responses (one "
                                    "task a row) to a shared design", flag="--y")),
    test_out="with --x/--y naming the training variables: the test ones replace 'train' by 'test'",
    sniff=_sniff, kind="mat", inspect=inspect_mat))
