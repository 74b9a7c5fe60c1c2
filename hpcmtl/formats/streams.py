"""Streams (``hpcmtl-stream``) from what the readers return: tasks, single-label and multi-label files.

A task dataset becomes one label column a task; a single-label file one +-1
column, or one column a class; a multi-label file one +-1 column a label.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from . import Stream
from .checks import check_tasks, first_nonfinite, numeric_array
from .labels import LabelRule, label_key, show_label


MAX_CLASSES = 1000      # one stream column a class; more looks like a regression target or an id


def tasks_stream(Xs, ys, names):
    """Tasks as one stream: task 0's rows, then task 1's, ...

    Label column i holds task i's labels (+-1) on its rows and 0 (dormant) on
    every other row, so each round trains exactly one task.  Returns
    ``(X, Y, label_names)``.
    """
    X = sp.vstack([sp.csr_matrix(X, dtype=np.float64) for X in Xs], format="csr")
    Y = np.zeros((X.shape[0], len(Xs)))
    start = 0
    for i, y in enumerate(ys):
        Y[start:start + len(y), i] = y
        start += len(y)
    return X, Y, [str(n) for n in names]


def _one_hot(column, n_classes):
    Y = -np.ones((len(column), n_classes))
    Y[np.arange(len(column)), column] = 1.0
    return Y


def _too_many_classes(source, k):
    return InputError(f"{source}: {k} distinct labels; a single-label stream has one column a class (at most "
                      f"{MAX_CLASSES}): map them with --labels or --positive-label")


def _single_label_stream(lab, y, labels):
    """A label vector as stream columns: one +-1 column, or one column a class (+1 on the row's class)."""
    def where(r):
        return lab.locate(0, "y", r)

    if labels is not None and labels.maps:
        values = labels.apply(y, where)
    elif y.dtype.kind in "US":                       # CSV cells: numbers, or else class names
        uniq, first, inverse = np.unique(y, return_index=True, return_inverse=True)
        keys = [label_key(u) for u in uniq]
        if any(k[0] == "s" for k in keys):
            if len(uniq) > MAX_CLASSES:
                raise _too_many_classes(lab.source, len(uniq))
            return (sp.csr_matrix(lab.X), _one_hot(np.asarray(inverse).reshape(-1), len(uniq)),
                    [str(u).strip() for u in uniq], f"single-label, {len(uniq)} classes")
        values = np.array([k[1] for k in keys])[np.asarray(inverse).reshape(-1)]
    else:
        values = numeric_array(y, where(None))
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise InputError(f"{where(int(bad[0]))}: {show_label(y[bad[0]])} is not a finite number")
    X = sp.csr_matrix(lab.X)
    if np.all((values == 1) | (values == -1)):
        name = lab.name if labels is None or labels.positive is None else str(labels.positive_text)
        return X, values.reshape(-1, 1), [name], "+-1 labels"
    bad = np.flatnonzero(values != np.round(values))
    if bad.size:
        raise InputError(f"{where(int(bad[0]))}: label {show_label(values[bad[0]])} is not a class (an integer or "
                         "a name; -1/+1 for one label): map labels with --labels or --positive-label")
    classes, column = np.unique(values, return_inverse=True)
    if len(classes) > MAX_CLASSES:
        raise _too_many_classes(lab.source, len(classes))
    return X, _one_hot(np.asarray(column).reshape(-1), len(classes)), [show_label(c) for c in classes], \
        f"single-label, {len(classes)} classes"


def _label_sets_stream(lab, labels):
    """svmlight multi-label rows (label tuples) as one +-1 column a label."""
    sizes = np.array([len(t) for t in lab.y])
    if labels is not None and labels.table is not None:
        r = int(np.flatnonzero(sizes != 1)[0])
        raise InputError(f"{lab.locate(0, 'y', r)}: {sizes[r]} labels: --labels maps one label a line "
                         "(--positive-label L gives one +-1 column: is L among the line's labels)")
    X = sp.csr_matrix(lab.X)
    if labels is not None and labels.positive is not None:
        col = np.array([1.0 if any(label_key(v) == labels.positive for v in t) else -1.0 for t in lab.y])
        labels.n_positive += int(np.count_nonzero(col == 1))
        labels.seen = [show_label(v) for v in sorted({v for t in lab.y for v in t})][:12]
        return X, col.reshape(-1, 1), [str(labels.positive_text)], "+-1 labels"
    classes = sorted({v for t in lab.y for v in t})
    if len(classes) > MAX_CLASSES:
        raise _too_many_classes(lab.source, len(classes))
    index = {v: j for j, v in enumerate(classes)}
    Y = -np.ones((len(lab.y), len(classes)))
    for r, t in enumerate(lab.y):
        Y[r, [index[v] for v in t]] = 1.0
    return X, Y, [show_label(c) for c in classes], "multi-label"


def _label_matrix_stream(lab, Y, labels):
    """An n x k label matrix: +1 / -1 per label, 0 for a dormant one."""
    n, k = Y.shape
    if labels is not None and labels.maps:
        Y = labels.apply(Y.reshape(-1), lambda e: lab.locate(0, "y", None if e is None else e // k,
                                                             None if e is None else e % k)).reshape(n, k)
    else:
        Y = numeric_array(Y, lab.locate(0, "y"))
        bad = first_nonfinite(Y)
        if bad is not None:
            raise InputError(f"{lab.locate(0, 'y', bad[0], bad[1])}: {bad[2]} is not a finite number")
    bad = np.argwhere((Y != 1) & (Y != -1) & (Y != 0))
    if bad.size:
        r, c = (int(v) for v in bad[0])
        raise InputError(f"{lab.locate(0, 'y', r, c)}: {show_label(Y[r, c])} is not -1, 0 or +1 (a label matrix "
                         "holds +1 / -1, and 0 for a dormant label): map it with --labels")
    if np.any(Y == 0) and not np.any(Y == -1):
        raise InputError(f"{lab.locate(0, 'y')}: holds only 0 and 1, and a 0 marks a dormant label, not a "
                         "negative one: map them with --labels 0:-1,1:1")
    return sp.csr_matrix(lab.X), Y, [f"label{j}" for j in range(k)], "multi-label"


def labeled_stream(lab, labels=None):
    """A single-label or multi-label file (:class:`Labeled`) as ``(X, Y, label_names, description)``.

    Labels -1/+1 give one column.  Any other single labels are classes: one
    column a class, +1 on the row's class and -1 on the others (the input of
    ``hpcmtl train online --code``).  Multi-label rows (svmlight ``1,3``, or
    an n x k label matrix) give one +-1 column a label.  ``labels`` (a
    :class:`LabelRule`) maps the labels first.
    """
    X = lab.X
    if X.ndim != 2:
        raise InputError(f"{lab.locate(0, 'X')}: expected a 2-D matrix (rows x features), got shape {X.shape}")
    if X.shape[0] == 0:
        raise InputError(f"{lab.locate(0, 'X')}: no rows")
    if X.shape[1] == 0:
        raise InputError(f"{lab.locate(0, 'X')}: no feature columns")
    bad = first_nonfinite(X)
    if bad is not None:
        raise InputError(f"{lab.locate(0, 'X', bad[0], bad[1])}: {bad[2]} is not a finite number")
    y = lab.y
    if isinstance(y, list):                               # svmlight label tuples
        if any(len(t) != 1 for t in y):
            return _label_sets_stream(lab, labels)
        y = np.array([t[0] for t in y])
    y = y.toarray() if sp.issparse(y) else np.asarray(y)
    n = X.shape[0]
    if y.ndim == 2 and y.shape[0] == n and y.shape[1] > 1:
        return _label_matrix_stream(lab, y, labels)
    if y.ndim > 2 or y.size != n:
        raise InputError(f"{lab.locate(0, 'y')}: has shape {y.shape}, expected {n} labels (one per row) "
                         f"or an {n} x k label matrix")
    return _single_label_stream(lab, y.reshape(-1), labels)


def map_stream_labels(Y, names, source, labels=None):
    """A stream's T x k label matrix through ``labels`` (a :class:`LabelRule`); it must stay in -1/0/+1."""
    if labels is None or not labels.maps:
        return Y
    k = Y.shape[1]

    def where(e):
        return source if e is None else f"{source}: round {e // k + 1}, label '{names[e % k]}'"
    Y = labels.apply(Y.reshape(-1), where).reshape(Y.shape)
    bad = np.flatnonzero((Y != 1) & (Y != -1) & (Y != 0))
    if bad.size:
        raise InputError(f"{where(int(bad[0]))}: label {show_label(Y.flat[bad[0]])} is not -1, 0 or +1")
    return Y


def shuffle_rows(X, Y, seed):
    """Rows of a stream in a random order drawn once from ``seed`` (files sorted by class are common)."""
    order = np.random.default_rng(seed).permutation(X.shape[0])
    return sp.csr_matrix(X)[order], np.asarray(Y)[order]



def source_stream(source, labels):
    """A reader's source (``('labeled', Labeled)`` or ``('tasks', ...)``) as ``(X, Y, label_names, description)``."""
    if source[0] == "labeled":
        return labeled_stream(source[1], labels)
    _, Xs, ys, names, locate = source
    return tasks_as_stream(Xs, check_tasks(Xs, ys, locate, labels), names)


def tasks_as_stream(Xs, ys, names):
    """Checked tasks as ``(X, Y, label_names, description)`` (:func:`tasks_stream`)."""
    X, Y, names = tasks_stream(Xs, ys, names)
    return X, Y, names, f"{len(names)} task{'s' if len(names) > 1 else ''}, 0 on the other tasks' rows"


def one_stream(read):
    """A format's stream reader from ``read(inputs, options, labels, report) -> (X, Y, label_names, description)``.

    Task datasets become one label column a task (:func:`tasks_stream`: their
    labels must be +-1 after the label map); single-label and multi-label files
    (no task ids) become columns as in :func:`labeled_stream`.  ``labels`` is a
    :class:`LabelRule` with ``binary=True``; one stream, in the file's order.
    """
    def stream(inputs, options, label_map, report, test=False):
        labels = LabelRule(*label_map, binary=True)
        inputs = list(inputs)
        X, Y, names, what = read(inputs, options, labels, report)
        labels.check_used(", ".join(map(str, inputs)))
        yield Stream(X, Y, names, attrs={"order": "file"}, what=what)
    return stream
