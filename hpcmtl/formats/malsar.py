"""MALSAR .mat files: cell arrays X, Y (one file, one task a cell), or fea/gnd (one task a file).

Read with ``scipy.io.loadmat`` (MATLAB files up to v7; v7.3 files are HDF5).
"""
from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from . import FormatSpec, register_format
from .checks import Labeled, file_names, numeric_array, require_file, tasks_of
from .inspect import label_summary, map_hint, q
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


def from_malsar(paths, labels=None):
    """MALSAR .mat files as tasks.

    One file with cell arrays ``X`` (1 x m, each n_i x d, dense or sparse) and
    ``Y`` (1 x m, each n_i x 1): task i is cell i (names ``task001``, ...).
    Or one or more files each with a matrix ``fea`` (n x d, dense or sparse)
    and labels ``gnd`` (n x 1): one task a file, named after the file.
    """
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    source = _mat_source(paths)
    return tasks_of(source, labels)


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
        out["layout"] = ("no layout hpcmtl reads: expected cell arrays X and Y (MALSAR), a matrix fea and labels "
                         "gnd, or a matrix X and labels Y")
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



def _sniff(path, head):
    return 3 if head.startswith(b"MATLAB") or path.lower().endswith(".mat") else None


register_format(FormatSpec(
    name="malsar",
    read=lambda inputs, options, labels, report, test=False: (from_malsar(inputs, labels), None),
    stream=one_stream(lambda inputs, options, labels, report: source_stream(_mat_source(inputs, stream=True),
                                                                              labels)),
    sniff=_sniff, kind="mat", inspect=inspect_mat))
