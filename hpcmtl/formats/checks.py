"""Checks shared by every format: paths, numbers, task shapes and names, each problem named in the input's terms.

A reader returns a *source*: ``('tasks', Xs, ys, names, locate)`` or
``('labeled', Labeled)`` (one matrix and its labels, the input of a stream).
``locate(i, field, row=None, column=None)`` names task ``i``'s ``field``
('X' or 'y') in the input file, down to the row and column when given.
"""
from __future__ import annotations

import os
import stat

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from ..taskdata import check_name  # noqa: F401 - the formats' name check is the task files' (hpcmtl.taskdata)


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def _mode(path, missing):
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError(f"{path}: {missing}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _refuse_special(path, mode):
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise InputError(f"{path}: is {kind}, not a regular file: refusing to read it")


def require_path(path):
    """``path`` is a directory or a regular file (through links), by ``os.stat``: a FIFO is never opened."""
    mode = _mode(path, "no such file or directory")
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        _refuse_special(path, mode)


def files_under(paths) -> list:
    """Every regular file under the directories among ``paths``, at any depth (the default input listing)."""
    found = []
    for path in paths:
        if os.path.isdir(path):
            for root, _, names in os.walk(path):
                found += [os.path.join(root, n) for n in sorted(names)]
    return found


def require_file(path):
    """``path`` is an existing regular file (through links), by ``os.stat`` before anything opens it.

    A directory, FIFO, socket or device is refused in one line: reading a FIFO
    would block every rank until some writer came.  A format reading files
    inside a directory calls this for every file it reads there.
    """
    mode = _mode(path, "no such file or directory")
    if stat.S_ISDIR(mode):
        raise InputError(f"{path}: is a directory, expected a file")
    if not stat.S_ISREG(mode):
        _refuse_special(path, mode)


def numeric_array(a, at):
    """``a`` as float64 (CSR if sparse), or an InputError naming ``at`` when it is not numbers."""
    kind = a.dtype.kind if sp.issparse(a) else np.asarray(a).dtype.kind
    if kind in "US":
        sample = np.asarray(a).ravel()[:1]
        shown = f" ({str(sample[0])!r})" if sample.size else ""
        raise InputError(f"{at}: holds text{shown}, not numbers")
    if kind == "O":
        raise InputError(f"{at}: holds a cell array or objects, not a numeric matrix")
    if kind == "V":
        raise InputError(f"{at}: holds a struct or record, not a numeric matrix")
    if kind == "c":
        raise InputError(f"{at}: holds complex numbers")
    if kind not in "biuf":
        raise InputError(f"{at}: holds {a.dtype} values, not numbers")
    if sp.issparse(a):
        return sp.csr_matrix(a, dtype=np.float64)
    return np.asarray(a, dtype=np.float64)


def first_nonfinite(X):
    """``(row, column, value)`` of the first NaN or Inf of ``X`` (dense or CSR), or None."""
    if sp.issparse(X):
        bad = np.flatnonzero(~np.isfinite(X.data))
        if not bad.size:
            return None
        k = int(bad[0])
        return int(np.searchsorted(X.indptr, k, side="right")) - 1, int(X.indices[k]), X.data[k]
    bad = np.argwhere(~np.isfinite(X))
    if not bad.size:
        return None
    return tuple(int(v) for v in bad[0]) + (X[tuple(bad[0])],)


def tasks_of(source, labels):
    """``(Xs, ys, names)`` of a MATLAB or npz source: one labeled table split by task, or one matrix a task."""
    if source[0] == "labeled":
        return source[1].as_task(labels)
    _, Xs, ys, names, locate = source
    return Xs, check_tasks(Xs, ys, locate, labels), names


def check_tasks(Xs, ys, locate, labels=None):
    """The checks ``store.write_tasks`` makes, reported where the problem is in the input.

    ``locate(i, field, row=None, column=None)`` names task ``i``'s ``field``
    ('X' or 'y') in the input file, down to the row (0-based) and column when
    given: a cell of a .mat file, an array of a .npz file, a line of a text
    file.  ``labels`` (a :class:`LabelRule`) maps the labels first (they may
    then be text).  Returns ``ys`` as 1-D float arrays.
    """
    d = None
    out = []
    for i, (X, y) in enumerate(zip(Xs, ys)):
        if X.ndim != 2:
            raise InputError(f"{locate(i, 'X')}: expected a 2-D matrix (rows x features), got shape {X.shape}")
        n = X.shape[0]
        if n == 0:
            raise InputError(f"{locate(i, 'X')}: no rows (every task needs at least one sample)")
        if d is None:
            d = X.shape[1]
            if d == 0:
                raise InputError(f"{locate(i, 'X')}: no feature columns")
        elif X.shape[1] != d:
            raise InputError(f"{locate(i, 'X')}: has {X.shape[1]} features, the first task has {d}")
        y = y.toarray() if sp.issparse(y) else np.asarray(y)
        if y.ndim > 2 or y.size != n or (y.ndim == 2 and 1 not in y.shape):
            raise InputError(f"{locate(i, 'y')}: has shape {y.shape}, expected {n} labels (one per row of X)")
        y = y.reshape(-1)
        bad = first_nonfinite(X)
        if bad is not None:
            raise InputError(f"{locate(i, 'X', bad[0], bad[1])}: {bad[2]} is not a finite number")
        if labels is not None and labels.maps:
            y = labels.apply(y, lambda r, i=i: locate(i, "y", r))
        elif y.dtype.kind not in "biuf":
            y = numeric_array(y, locate(i, "y"))
        y = np.asarray(y, dtype=np.float64)
        bad = first_nonfinite(y.reshape(-1, 1))
        if bad is not None:
            raise InputError(f"{locate(i, 'y', bad[0])}: {bad[2]} is not a finite number")
        if labels is not None:
            labels.check_binary(y, lambda r, i=i: locate(i, "y", r))
        out.append(y)
    return out


def locate_in(source, names):
    """``locate`` for generated tasks: the source and the task name."""
    def locate(i, field, row=None, column=None):
        where = f"{source}: task '{names[i]}'"
        if row is not None:
            where += f", row {row + 1}"
        return where + (f", feature {column + 1}" if column is not None else "")
    return locate


class Labeled:
    """One matrix and its labels (a single-label or multi-label file): the input of a stream.

    ``y`` is a 1-D array (numbers, or text from a CSV file), a 2-D n x k label
    matrix (multi-label), or a list of label tuples (svmlight multi-label);
    ``locate(i, field, row=None, column=None)`` (``i`` ignored) names a place
    in the input as :func:`check_tasks` does; ``name`` names the one label
    column of a +-1 file; ``source`` is the input path (of the labels), and
    ``task_name`` the name of the file as one task (default: after ``source``).
    """

    def __init__(self, X, y, locate, name, source, task_name=None):
        self.X, self.y, self.locate, self.name, self.source = X, y, locate, name, source
        self.task_name = task_name or stem(source)

    def as_task(self, labels=None):
        """The file as one task named after it: ``(Xs, ys, names)``."""
        X = self.X
        if X.ndim != 2:
            raise InputError(f"{self.locate(0, 'X')}: expected a 2-D matrix (rows x features), got shape {X.shape}")
        ys = check_tasks([X], [self.y], self.locate, labels)
        return [X], ys, [self.task_name]


def stem(path):
    return os.path.splitext(os.path.basename(os.path.normpath(path)))[0]


def file_names(paths):
    """Task names from file names (``task0``, ``task1``, ... when two files share a name)."""
    names = [stem(p) for p in paths]
    return names if len(set(names)) == len(names) else [f"task{i}" for i in range(len(paths))]

