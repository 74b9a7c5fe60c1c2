"""Converters from public formats into task datasets ``(Xs, ys, names)``.

Parsing that scikit-learn or SciPy already do well is left to them: svmlight
files (``load_svmlight_files``), MATLAB files (``scipy.io.loadmat``), bag of
words (``HashingVectorizer`` / ``TfidfVectorizer``).  What is here is the
protocol of each data set (which rows form which task) and tolerant readers for
the two non-standard text formats (the MDS pseudo-XML and Reuters SGML).

Every converter checks what it returns (``check_tasks``: numbers, finite, one
label a row, at least one row a task, one feature count), so a bad input ends
with one line naming the input file and the cell, array, line or row at fault,
never the output file it would have become.
"""
from __future__ import annotations

import csv
import gzip
import html
import os
import re
import struct

import numpy as np
import scipy.sparse as sp

from .errors import InputError

FORMATS = ("malsar", "svmlight", "csv", "npz", "mnist", "mds", "reuters")


def _exists(path):
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or directory")


def _file(path):
    """``path`` is an existing regular file (not a directory)."""
    _exists(path)
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected a file")


# ---------------------------------------------------------------------------
# Checks in the input's terms: the problem named by file and cell, row or line
# ---------------------------------------------------------------------------
def _numeric(a, at):
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


def _first_nonfinite(X):
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


# ---------------------------------------------------------------------------
# Labels mapped at conversion time (--positive-label, --labels)
# ---------------------------------------------------------------------------
def _label_key(value):
    """A label as a comparable key: ``('n', number)`` (the text '1.0' equals 1) or ``('s', text)``."""
    if isinstance(value, (bytes, np.bytes_)):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        text = value.strip()
        try:
            return ("n", float(text))
        except ValueError:
            return ("s", text)
    return ("n", float(value))


def show_label(value):
    """A label as written in messages and label names: 3 (not 3.0), 0.5, 'spam'."""
    kind, v = _label_key(value)
    if kind == "s":
        return repr(v)
    return str(int(v)) if np.isfinite(v) and v == int(v) and abs(v) < 1e15 else repr(v)


def short_list(items, limit=8):
    """A comma-separated list cut in the middle when long: ``a, b, c, ..., y, z (40 in all)``."""
    items = [str(t) for t in items]
    if len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit - 2] + ["..."] + items[-2:]) + f" ({len(items)} in all)"


class LabelRule:
    """How labels become numbers at conversion time.

    Parameters
    ----------
    positive : str, optional
        ``--positive-label L``: labels equal to L become +1, every other label -1.
    mapping : str, optional
        ``--labels 0:-1,1:1``: a full mapping LABEL:VALUE, comma-separated; a
        label it does not name is an error at its row.
    binary : bool
        Every label must end as -1 or +1 (tasks written as the columns of a stream).

    A label matches a key as a number when both read as numbers (the text
    '1.0' matches the key 1) and as text otherwise (``--positive-label spam``).
    """

    def __init__(self, positive=None, mapping=None, binary=False):
        if positive is not None and mapping is not None:
            raise InputError("give --positive-label or --labels, not both")
        self.positive = None if positive is None else _label_key(positive)
        self.positive_text = positive
        self.table = None if mapping is None else self.parse(mapping)
        self.binary = binary
        self.n_positive = 0          # labels that matched --positive-label (0 in the end: a typo)
        self.seen = []               # a few labels read, for that message

    @staticmethod
    def parse(text):
        table = {}
        for item in text.split(","):
            key, sep, value = item.strip().rpartition(":")
            if not sep or not key.strip():
                raise InputError(f"--labels: {item.strip()!r} is not LABEL:VALUE (e.g. --labels 0:-1,1:1)")
            try:
                number = float(value)
            except ValueError:
                number = float("nan")
            if not np.isfinite(number):
                raise InputError(f"--labels: in {item.strip()!r}, {value!r} is not a finite number")
            k = _label_key(key)
            if k in table:
                raise InputError(f"--labels: label {key.strip()!r} is mapped twice")
            table[k] = number
        return table

    @property
    def maps(self):
        return self.positive is not None or self.table is not None

    def value(self, label):
        """The number a label becomes, or None when --labels does not name it."""
        key = _label_key(label)
        if self.positive is not None:
            return 1.0 if key == self.positive else -1.0
        return self.table.get(key)

    def apply(self, y, where):
        """``y`` (1-D numbers or text) mapped to float64; ``where(k)`` names element ``k`` in the input."""
        y = np.asarray(y).reshape(-1)
        if not self.maps or y.dtype.kind not in "biufUS":
            return _numeric(y, where(None))
        values, first, inverse = np.unique(y, return_index=True, return_inverse=True)
        mapped = np.empty(len(values))
        for j, v in enumerate(values):
            key = _label_key(v)
            if key[0] == "n" and not np.isfinite(key[1]):
                raise InputError(f"{where(first[j])}: {show_label(v)} is not a finite number")
            if len(self.seen) < 12 and show_label(v) not in self.seen:
                self.seen.append(show_label(v))
            mapped[j] = self.value(v) if self.positive is not None or key in self.table else np.nan
            if np.isnan(mapped[j]):
                keys = [show_label(k[1]) if k[0] == "n" else repr(k[1]) for k in self.table]
                raise InputError(f"{where(first[j])}: label {show_label(v)} is not in --labels ({short_list(keys)})")
        out = mapped[np.asarray(inverse).reshape(-1)]
        if self.positive is not None:
            self.n_positive += int(np.count_nonzero(out == 1))
        return out

    def check_binary(self, y, where):
        """Every label -1 or +1 (with ``binary``): otherwise an error at the first other one."""
        if self.binary:
            bad = np.flatnonzero((y != 1) & (y != -1))
            if bad.size:
                raise InputError(f"{where(int(bad[0]))}: label {show_label(y[bad[0]])} is not -1 or +1 (tasks become "
                                 "stream columns of +-1 labels: map them with --positive-label or --labels)")

    def check_used(self, source):
        """``--positive-label L`` matched some label of ``source`` (no match is a typo, not a dataset)."""
        if self.positive is not None and self.n_positive == 0:
            raise InputError(f"{source}: no label equals --positive-label {self.positive_text!r} "
                             f"(labels read: {short_list(self.seen)})")


def label_rule(positive=None, mapping=None, binary=False):
    """A :class:`LabelRule` when it changes anything, else None."""
    if positive is None and mapping is None and not binary:
        return None
    return LabelRule(positive, mapping, binary)


def _tasks_of(source, labels):
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
        bad = _first_nonfinite(X)
        if bad is not None:
            raise InputError(f"{locate(i, 'X', bad[0], bad[1])}: {bad[2]} is not a finite number")
        if labels is not None and labels.maps:
            y = labels.apply(y, lambda r, i=i: locate(i, "y", r))
        elif y.dtype.kind not in "biuf":
            y = _numeric(y, locate(i, "y"))
        y = np.asarray(y, dtype=np.float64)
        bad = _first_nonfinite(y.reshape(-1, 1))
        if bad is not None:
            raise InputError(f"{locate(i, 'y', bad[0])}: {bad[2]} is not a finite number")
        if labels is not None:
            labels.check_binary(y, lambda r, i=i: locate(i, "y", r))
        out.append(y)
    return out


def _check_name(name, where):
    """A task name is one printable line (it appears in messages, tables and file listings)."""
    name = str(name)
    if not name:
        raise InputError(f"{where}: empty task name")
    if not name.isprintable():
        raise InputError(f"{where}: task name {name!r} holds a line break or control character")
    return name


def _locate_in(source, names):
    """``locate`` for generated tasks: the source and the task name."""
    def locate(i, field, row=None, column=None):
        where = f"{source}: task '{names[i]}'"
        if row is not None:
            where += f", row {row + 1}"
        return where + (f", feature {column + 1}" if column is not None else "")
    return locate


# ---------------------------------------------------------------------------
# Standardization (statistics from training data only)
# ---------------------------------------------------------------------------
def standardization(blocks):
    """Per-feature ``(mean, scale)`` over all rows of all tasks.

    Dense data is centred and scaled to unit variance; CSR data is only scaled
    (centring would destroy sparsity).  Constant columns (such as a bias column
    of ones) keep mean 0 and scale 1, so they pass through unchanged.
    """
    sparse = sp.issparse(blocks[0].X)
    n = sum(b.n_rows for b in blocks)
    total = sum(np.asarray(b.X.sum(axis=0)).ravel() for b in blocks)
    total_sq = sum(np.asarray((b.X.multiply(b.X) if sparse else b.X ** 2).sum(axis=0)).ravel() for b in blocks)
    mean = total / n
    var = np.maximum(total_sq / n - mean ** 2, 0.0)
    constant = var <= 1e-12 * np.maximum(1.0, mean ** 2)
    scale = np.where(constant, 1.0, np.sqrt(var))
    if sparse:
        scale = np.where(constant, 1.0, np.sqrt(total_sq / n))
        mean = np.zeros_like(mean)
    mean = np.where(constant, 0.0, mean)
    return mean, scale


def apply_standardization(X, mean, scale):
    if sp.issparse(X):
        return sp.csr_matrix(X @ sp.diags(1.0 / scale))
    return (X - mean) / scale


# ---------------------------------------------------------------------------
# MALSAR .mat: cell arrays X, Y (one file), or fea/gnd (one task a file)
# ---------------------------------------------------------------------------
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
        self.task_name = task_name or _stem(source)

    def as_task(self, labels=None):
        """The file as one task named after it: ``(Xs, ys, names)``."""
        X = self.X
        if X.ndim != 2:
            raise InputError(f"{self.locate(0, 'X')}: expected a 2-D matrix (rows x features), got shape {X.shape}")
        ys = check_tasks([X], [self.y], self.locate, labels)
        return [X], ys, [self.task_name]


def _stem(path):
    return os.path.splitext(os.path.basename(os.path.normpath(path)))[0]


def _file_names(paths):
    """Task names from file names (``task0``, ``task1``, ... when two files share a name)."""
    names = [_stem(p) for p in paths]
    return names if len(set(names)) == len(names) else [f"task{i}" for i in range(len(paths))]


def _loadmat(path):
    import scipy.io
    _file(path)
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

    X = _numeric(mat[x_key], locate(0, "X"))
    y = mat[y_key].toarray() if sp.issparse(mat[y_key]) else np.asarray(mat[y_key])
    if y.dtype.kind not in "biuf":
        y = _numeric(y, locate(0, "y"))
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
        return ("tasks", [t.X for t in parts], [t.y for t in parts], _file_names(paths),
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

    Xs = [_numeric(x, locate(i, "X")) for i, x in enumerate(X)]
    ys = [_numeric(y, locate(i, "y")) for i, y in enumerate(Y)]
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
    return _tasks_of(source, labels)


# ---------------------------------------------------------------------------
# svmlight: one file per task, or one file with qid as the task id
# ---------------------------------------------------------------------------
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
        _file(p)
    try:
        if len(paths) == 1:
            X, y, qid = load_svmlight_file(paths[0], n_features=n_features, query_id=True, dtype=np.float64)
        else:
            loaded = load_svmlight_files(paths, n_features=n_features, dtype=np.float64)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _svmlight_error(paths, n_features, exc) from None
    pairs = [(X, y)] if len(paths) == 1 else list(zip(loaded[0::2], loaded[1::2]))
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
    return Xs, ys, _file_names(paths)


def _svmlight_labeled(path, n_features=None):
    """One svmlight file without task ids: single-label or multi-label (labels ``1,3``) rows.

    Returns a :class:`Labeled` whose ``y`` is a list of label tuples, or None
    when the file has ``qid:`` task ids (then it is a task dataset).
    """
    from sklearn.datasets import load_svmlight_file
    _file(path)
    try:
        X, y, qid = load_svmlight_file(path, n_features=n_features, query_id=True, multilabel=True, dtype=np.float64)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _svmlight_error([path], n_features, exc, multilabel=True) from None
    if not np.isfinite(X.data).all() or not all(np.isfinite(v) for t in y for v in t):
        raise _svmlight_error([path], n_features, "NaN or Inf", multilabel=True)
    if X.shape[0] == 0:
        raise InputError(f"{path}: no data lines")
    if len(np.unique(qid)) > 1:
        return None
    locate = _svmlight_locate([(path, np.arange(X.shape[0]))])
    return Labeled(sp.csr_matrix(X), list(y), locate, "label", path)


# ---------------------------------------------------------------------------
# CSV with a task column and a label column
# ---------------------------------------------------------------------------
def _read_text(path):
    """The text of a UTF-8 file (a byte-order mark is dropped), or an InputError naming the bad line."""
    _file(path)
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{path}: line {line}: byte 0x{raw[exc.start]:02x} is not UTF-8 text "
                         "(save the file as UTF-8)") from None
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise InputError(f"{path}: line {line}: a NUL byte (not a text file)")
    return text


def csv_columns(spec, header, path, option):
    """0-based column indices of a ``--features`` / ``--drop`` list, in the order given.

    Items are comma-separated: a column name, a 0-based index, or an inclusive
    range of either (``3-7``, ``x1:x9``); a name is matched first, so a column
    called ``a-b`` is that column, not a range.
    """
    import difflib

    def one(item):
        if item in header:
            if header.count(item) > 1:
                raise InputError(f"{path}: line 1: {option}: column {item!r} appears {header.count(item)} times "
                                 "(give its index)")
            return header.index(item)
        if re.fullmatch(r"\d+", item):
            if int(item) >= len(header):
                raise InputError(f"{path}: line 1: {option}: column index {item} is beyond the last column "
                                 f"({len(header) - 1}; indices start at 0)")
            return int(item)
        return None

    out = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            raise InputError(f"{path}: line 1: {option}: an empty column name in {spec!r}")
        k = one(item)
        if k is not None:
            out.append(k)
            continue
        for m in re.finditer(r"[:-]", item):
            a, b = item[:m.start()].strip(), item[m.end():].strip()
            if a and b and one(a) is not None and one(b) is not None:
                if one(a) > one(b):
                    raise InputError(f"{path}: line 1: {option}: range {item!r} runs backwards "
                                     f"(column {one(a)} to {one(b)})")
                out += range(one(a), one(b) + 1)
                break
        else:
            close = difflib.get_close_matches(item, header, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InputError(f"{path}: line 1: {option}: no column {item!r} "
                             f"(columns: {short_list([repr(h) for h in header])}){hint}")
    return list(dict.fromkeys(out))


def _csv_table(path, task_column="task", label_column="y", features=None, drop=None, raw_labels=False,
               task_optional=False, report=None):
    """Read a CSV file: ``(header, task cells or None, label cells, X, line numbers, feature indices)``.

    Label cells are numbers, or the text as written with ``raw_labels`` (to be
    mapped by a :class:`LabelRule` or read as class names).  With
    ``task_optional`` a file without the task column has no tasks (None).
    ``report`` receives one line naming the feature columns.
    """
    import io
    if task_column == label_column:
        raise InputError(f"--task-column and --label-column are both '{task_column}'")
    text = _read_text(path)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise InputError(f"{path}: empty CSV file") from None
    except csv.Error as exc:
        raise InputError(f"{path}: line 1: {exc}") from None
    if task_optional and task_column not in header:
        task_column = None
    for col in (task_column, label_column):
        if col is None:
            continue
        if col not in header:
            shown = short_list([repr(h) for h in header])
            raise InputError(f"{path}: line 1: column '{col}' is missing (columns: {shown})")
        if header.count(col) > 1:
            raise InputError(f"{path}: line 1: column '{col}' appears {header.count(col)} times")
    ti = None if task_column is None else header.index(task_column)
    yi = header.index(label_column)
    roles = {yi: "label column"} if ti is None else {ti: "task column", yi: "label column"}
    chosen = [k for k in range(len(header)) if k not in roles]
    for option, spec in (("--features", features), ("--drop", drop)):
        if spec is None:
            continue
        picked = csv_columns(spec, header, path, option)
        for k in picked:
            if k in roles:
                raise InputError(f"{path}: line 1: {option}: column {header[k]!r} is the {roles[k]}")
        chosen = sorted(picked) if option == "--features" else chosen
        if option == "--drop":
            chosen = [k for k in chosen if k not in picked]
    fi = chosen
    if not fi:
        used = " and ".join(f"'{header[k]}'" for k in sorted(roles))
        raise InputError(f"{path}: line 1: no feature columns (only {used}"
                         f"{' after --features/--drop' if features or drop else ''})")
    if report is not None:
        left = [header[k] for k in range(len(header)) if k not in fi and k not in roles]
        line = (f"{path}: {len(fi)} feature column{'s' if len(fi) > 1 else ''} of {len(header)}: "
                f"{short_list([header[k] for k in fi])}; "
                + ", ".join(f"{r} '{header[k]}'" for k, r in sorted(roles.items())))
        report(line + (f"; left out: {short_list(left)}" if left else ""))
    tasks, labels, rows, lines = [], [], [], []

    def number(line_no, row, k):
        try:
            value = float(row[k])
        except ValueError:
            raise InputError(f"{path}: line {line_no}, column '{header[k]}': {row[k]!r} is not a number") from None
        if not np.isfinite(value):
            raise InputError(f"{path}: line {line_no}, column '{header[k]}': {row[k]!r} is not a finite number")
        return value

    line_no = reader.line_num + 1
    try:
        for row in reader:
            if row:
                if len(row) != len(header):
                    raise InputError(f"{path}: line {line_no}: {len(row)} cells, the header has {len(header)}")
                if ti is not None:
                    tasks.append(_check_name(row[ti], f"{path}: line {line_no}, column '{task_column}'"))
                labels.append(row[yi].strip() if raw_labels else number(line_no, row, yi))
                rows.append([number(line_no, row, k) for k in fi])
                lines.append(line_no)
            line_no = reader.line_num + 1
    except csv.Error as exc:
        raise InputError(f"{path}: line {line_no}: {exc}") from None
    if not rows:
        raise InputError(f"{path}: no data lines after the header")
    X = np.array(rows, dtype=np.float64).reshape(len(rows), len(fi))
    return header, (None if ti is None else np.array(tasks)), np.array(labels), X, np.array(lines), fi, yi


def _csv_locate(path, header, lines_of, fi, yi):
    """``locate`` over CSV rows: ``lines_of[i]`` the line numbers of task i's rows."""
    def locate(i, field, row=None, column=None):
        if row is None:
            return f"{path}: column '{header[yi]}'" if field == "y" else path
        k = yi if field == "y" else (fi[column] if column is not None else None)
        return f"{path}: line {lines_of[i][row]}" + (f", column '{header[k]}'" if k is not None else "")
    return locate


def from_csv(path, task_column="task", label_column="y", features=None, drop=None, labels=None, report=None):
    """A UTF-8 CSV file: a header line, then one sample a line.

    ``task_column`` names each row's task and ``label_column`` holds its label;
    the features are every other column, or ``features`` (a column list as in
    :func:`csv_columns`) less ``drop``.  ``labels`` (a :class:`LabelRule`)
    maps the labels, which may then be text.  ``report`` receives one line
    naming the feature columns.
    """
    raw = labels is not None and labels.maps
    header, tasks, y, X, lines, fi, yi = _csv_table(path, task_column, label_column, features, drop, raw,
                                                    report=report)
    names = list(dict.fromkeys(tasks))        # order of first appearance
    rows = [np.flatnonzero(tasks == t) for t in names]
    Xs, ys = [X[r] for r in rows], [y[r] for r in rows]
    ys = check_tasks(Xs, ys, _csv_locate(path, header, [lines[r] for r in rows], fi, yi), labels)
    return Xs, ys, names


def _csv_numbers(cells, where):
    """Label cells of a CSV file as numbers (an error names the line of the first that is not)."""
    out = np.empty(len(cells))
    for r, cell in enumerate(cells):
        cell = str(cell)
        try:
            out[r] = float(cell)
        except ValueError:
            raise InputError(f"{where(r)}: {cell!r} is not a number") from None
        if not np.isfinite(out[r]):
            raise InputError(f"{where(r)}: {cell!r} is not a finite number")
    return out


def _csv_source(path, task_column=None, label_column="y", features=None, drop=None, labels=None, report=None):
    """A CSV file for a stream: tasks when it has the task column (always when one is named), else one matrix."""
    header, tasks, y, X, lines, fi, yi = _csv_table(path, task_column or "task", label_column, features, drop,
                                                    raw_labels=True, task_optional=task_column is None,
                                                    report=report)
    if tasks is None:
        return "labeled", Labeled(X, y, _csv_locate(path, header, [lines], fi, yi), label_column, path)
    names = list(dict.fromkeys(tasks))
    rows = [np.flatnonzero(tasks == t) for t in names]
    locate = _csv_locate(path, header, [lines[r] for r in rows], fi, yi)
    ys = [y[r] for r in rows]
    if labels is None or not labels.maps:
        ys = [_csv_numbers(c, lambda r, i=i: locate(i, "y", r)) for i, c in enumerate(ys)]
    return "tasks", [X[r] for r in rows], ys, names, locate


# ---------------------------------------------------------------------------
# npz: X_0, y_0, X_1, y_1, ...; stacked X, y, tasks; X, y; or sparse matrices
# (scipy.sparse.save_npz, one a task) and one labels file
# ---------------------------------------------------------------------------
_SAVE_NPZ_KEYS = {"format", "shape", "data"}       # what scipy.sparse.save_npz always writes


def _open_npz(path):
    import zipfile
    _file(path)
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
    return _numeric(a, f"{path}: array '{key}'") if numeric else a


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
                         f"too (np.savez('labels.npz', {_stem(matrices[0])}=y))")
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
        Xs.append(_numeric(sp.csr_matrix(X), f"{p}"))

    def x_locate(i, field, row=None, column=None):
        where = matrices[i] + (f": row {row + 1}" if row is not None else "")
        return where + (f", column {column + 1}" if column is not None else "")

    names = [_stem(p) for p in matrices]
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
            return ("labeled", Labeled(Xs[0], y, locate, "y", lpath, task_name=names[0]))
        tasks = _npz_array(z, lpath, "tasks", numeric=False)
        if tasks.ndim != 1 or tasks.dtype.kind not in "biuUS" or len(tasks) != Xs[0].shape[0] or y.size != len(tasks):
            raise InputError(f"{lpath}: arrays y {y.shape} and tasks {tasks.shape} need one label and task id "
                             f"(integers or text) per row of {matrices[0]} ({Xs[0].shape[0]} rows)")
        order = list(dict.fromkeys(tasks.tolist()))
        rows = [np.flatnonzero(tasks == t) for t in order]
        names = [_check_name(t, f"{lpath}: array 'tasks', element {r[0] + 1}") for t, r in zip(order, rows)]
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
        names = [_check_name(t, f"{path}: array 'tasks', element {r[0] + 1}") for t, r in zip(order, rows)]
        locate = _array_locate(path, lambda i: "X", lambda i: "y", rows)
        return "tasks", [X[r] for r in rows], [y[r] for r in rows], names, locate
    suffixes = sorted((int(k[2:]), k[2:]) for k in keys if re.fullmatch(r"X_\d+", k))
    if not suffixes and {"X", "y"} <= keys:
        locate = _array_locate(path, lambda i: "X", lambda i: "y")
        return "labeled", Labeled(_npz_array(z, path, "X"), _npz_array(z, path, "y", False), locate, "y", path)
    if not suffixes:
        raise InputError(f"{path}: expected arrays X, y, tasks or X_0, y_0, X_1, y_1, ... or X, y "
                         f"(arrays: {short_list(sorted(keys))})")
    for _, sfx in suffixes:
        if f"y_{sfx}" not in keys:
            raise InputError(f"{path}: array 'y_{sfx}' is missing (there is an 'X_{sfx}')")
    locate = _array_locate(path, lambda i: f"X_{suffixes[i][1]}", lambda i: f"y_{suffixes[i][1]}")
    Xs = [_npz_array(z, path, f"X_{sfx}") for _, sfx in suffixes]
    ys = [_npz_array(z, path, f"y_{sfx}", False) for _, sfx in suffixes]
    names = [_check_name(_npz_array(z, path, f"name_{sfx}", numeric=False), f"{path}: array 'name_{sfx}'")
             if f"name_{sfx}" in keys else f"task{i}" for i, sfx in suffixes]
    return "tasks", Xs, ys, names, locate


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
    return _tasks_of(source, labels)


# ---------------------------------------------------------------------------
# MNIST IDX files -> 10 one-vs-all tasks (paper 001, Table 3 protocol)
# ---------------------------------------------------------------------------
def read_idx(path):
    """An IDX file (optionally gzip'd) as a NumPy array."""
    import zlib
    _file(path)
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot be read ({exc})") from None
    if len(raw) < 8:
        raise InputError(f"{path}: too short for an IDX file")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise InputError(f"{path}: not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    if len(raw) < 4 + 4 * ndim:
        raise InputError(f"{path}: too short for the {ndim} dimensions its header announces")
    shape = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise InputError(f"{path}: header says {shape}, file holds {data.size} values")
    return data.reshape(shape)


def mnist_one_vs_all(images_path, labels_path, seed=0, labels=None):
    """Each digit's images as positives plus as many random negatives from other digits.

    The rows are CSR (pixels / 255): 81 % of MNIST's pixels are 0, and the row kernels
    then touch only the others, as liblinear's do.  Measured on the 10 tasks (DMTRL,
    hinge, lam 1e-3, 10 W-steps, tol 1e-6, P = 1): 45 s dense, 15 s CSR, the same
    rounds and objective."""
    images = read_idx(images_path)
    rule, labels = labels, read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise InputError(f"{images_path}, {labels_path}: expected n x 28 x 28 images and n labels")
    X = sp.csr_matrix(images.reshape(images.shape[0], -1)).astype(np.float64)
    X.data /= 255.0
    rng = np.random.default_rng(seed)
    Xs, ys, names = [], [], []
    for digit in range(10):
        pos = np.flatnonzero(labels == digit)
        others = np.flatnonzero(labels != digit)
        if pos.size == 0 or others.size < pos.size:
            raise InputError(f"{labels_path}: {pos.size} images of digit {digit} and {others.size} of other digits; "
                             "each digit's task needs at least one image and as many of other digits")
        neg = rng.choice(others, size=pos.size, replace=False)
        rows = np.concatenate([pos, neg])
        Xs.append(X[rows])
        ys.append(np.concatenate([np.ones(pos.size), -np.ones(neg.size)]))
        names.append(f"digit{digit}")
    return Xs, check_tasks(Xs, ys, _locate_in(images_path, names), rule), names


def from_mnist(paths, seed=0, labels=None):
    """``paths``: a directory or the (images, labels) IDX pair."""
    if len(paths) == 1 and os.path.isdir(paths[0]):
        d = paths[0]
        pairs = [("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")]
        paths = [os.path.join(d, pairs[0][0]), os.path.join(d, pairs[0][1])]
    if len(paths) != 2:
        raise InputError("mnist needs an images IDX file and a labels IDX file (or a directory)")
    return mnist_one_vs_all(paths[0], paths[1], seed, labels)


# ---------------------------------------------------------------------------
# Multi-domain sentiment (Blitzer et al. 2007)
# ---------------------------------------------------------------------------
_REVIEW = re.compile(r"<review>(.*?)</review>", re.S)


def _field(block, name):
    m = re.search(rf"<{name}>(.*?)</{name}>", block, re.S)
    return html.unescape(m.group(1).strip()) if m else ""


def read_reviews(path):
    """``(texts, ratings)`` of a ``sorted_data`` pseudo-XML review file (latin-1)."""
    _exists(path)
    with open(path, encoding="latin-1") as f:
        text = f.read()
    texts, ratings = [], []
    for block in _REVIEW.findall(text):
        texts.append(_field(block, "title") + " " + _field(block, "review_text"))
        try:
            ratings.append(float(_field(block, "rating")))
        except ValueError:
            ratings.append(np.nan)
    if not texts:
        raise InputError(f"{path}: no <review> entries found")
    return texts, np.array(ratings)


def read_processed(path):
    """``(token-count dicts, labels)`` of a ``processed_acl`` file (``word:count ... #label#:positive``)."""
    _exists(path)
    docs, labels = [], []
    with open(path, encoding="latin-1") as f:
        for line_no, line in enumerate(f, start=1):
            parts = line.split()
            if not parts:
                continue
            counts, label = {}, None
            for tok in parts:
                word, _, count = tok.rpartition(":")
                if word == "#label#":
                    if count not in ("positive", "negative"):
                        raise InputError(f"{path}: line {line_no}: '#label#:{count}', expected positive or negative")
                    label = 1.0 if count == "positive" else -1.0
                elif word and count.isdigit():
                    counts[word] = counts.get(word, 0) + int(count)
                else:
                    raise InputError(f"{path}: line {line_no}: {tok!r} is not WORD:COUNT")
            if label is None:
                raise InputError(f"{path}: line {line_no}: no '#label#:' entry")
            docs.append(counts)
            labels.append(label)
    return docs, np.array(labels)


def from_mds(paths, n_features=10000, labels=None):
    """One sentiment task per domain directory; bag of words hashed to ``n_features``.

    A domain directory holds ``positive.review``/``negative.review`` (the
    original ``sorted_data``; labels from the file, cross-checked with the
    rating: 4-5 positive, 1-2 negative) or ``*.review`` files in
    ``processed_acl`` form.  Paths may also be a parent directory of domains.
    """
    rule = labels
    from sklearn.feature_extraction import FeatureHasher
    from sklearn.feature_extraction.text import HashingVectorizer
    domains = []
    for p in paths:
        _exists(p)
        if os.path.isdir(p) and not any(f.endswith(".review") for f in os.listdir(p)):
            domains += [os.path.join(p, s) for s in sorted(os.listdir(p)) if os.path.isdir(os.path.join(p, s))]
        else:
            domains.append(p)
    vectorizer = HashingVectorizer(n_features=n_features, alternate_sign=False, norm="l2",
                                   token_pattern=r"(?u)\b\w\w+\b")
    hasher = FeatureHasher(n_features=n_features, alternate_sign=False)
    Xs, ys, names = [], [], []
    for domain in domains:
        texts, labels, counts = [], [], []
        for label, fname in ((1.0, "positive.review"), (-1.0, "negative.review")):
            fpath = os.path.join(domain, fname)
            if not os.path.exists(fpath):
                raise InputError(f"{domain}: file '{fname}' is missing")
            with open(fpath, encoding="latin-1") as f:
                head = f.read(200)
            if "<review>" in head:
                t, ratings = read_reviews(fpath)
                wrong = (ratings < 3) if label > 0 else (ratings > 3)
                if np.any(wrong):
                    raise InputError(f"{fpath}: field 'rating': {int(wrong.sum())} ratings disagree with the file's label")
                texts += t
                labels += [label] * len(t)
            else:
                docs, lab = read_processed(fpath)
                counts += docs
                labels += list(lab)
        if texts and counts:
            raise InputError(f"{domain}: mixes sorted_data and processed_acl files")
        if not labels:
            raise InputError(f"{domain}: positive.review and negative.review hold no reviews")
        if texts:
            X = vectorizer.transform(texts)
        else:
            X = hasher.transform(counts)
            X = sp.csr_matrix(X, dtype=np.float64)
            norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1))).ravel()
            X = sp.diags(1.0 / np.maximum(norms, 1e-300)) @ X
        Xs.append(sp.csr_matrix(X, dtype=np.float64))
        ys.append(np.array(labels))
        names.append(os.path.basename(os.path.normpath(domain)))
    if not Xs:
        raise InputError(f"{', '.join(paths)}: no domain directories")
    return Xs, check_tasks(Xs, ys, _locate_in(", ".join(paths), names), rule), names


# ---------------------------------------------------------------------------
# Reuters-21578 (ModApte split)
# ---------------------------------------------------------------------------
_DOC = re.compile(r"<REUTERS(.*?)>(.*?)</REUTERS>", re.S)
_ATTR = re.compile(r'(\w+)="([^"]*)"')


def read_reuters(directory):
    """Documents of the ModApte split in their original order.

    Returns ``(train, test)``, each a list of dicts with ``newid``, ``topics``
    (list) and ``text`` (title + body).  ModApte: ``LEWISSPLIT="TRAIN"`` /
    ``"TEST"`` with ``TOPICS="YES"`` (9,603 / 3,299 documents).
    """
    _exists(directory)
    files = sorted(f for f in os.listdir(directory) if re.fullmatch(r"reut2-\d{3}\.sgm", f))
    if not files:
        raise InputError(f"{directory}: no reut2-NNN.sgm files")
    train, test = [], []
    for fname in files:
        with open(os.path.join(directory, fname), encoding="latin-1") as f:
            content = f.read()
        for attrs, body in _DOC.findall(content):
            a = dict(_ATTR.findall(attrs))
            if a.get("TOPICS") != "YES" or a.get("LEWISSPLIT") not in ("TRAIN", "TEST"):
                continue
            topics_block = re.search(r"<TOPICS>(.*?)</TOPICS>", body, re.S)
            topics = re.findall(r"<D>(.*?)</D>", topics_block.group(1)) if topics_block else []
            text = " ".join(html.unescape(m) for m in re.findall(r"<(?:TITLE|BODY)>(.*?)</(?:TITLE|BODY)>", body, re.S))
            newid = a.get("NEWID", "-1")
            if not re.fullmatch(r"-?\d+", newid):
                raise InputError(f"{os.path.join(directory, fname)}: document NEWID={newid!r}: not an integer")
            doc = {"newid": int(newid), "topics": topics, "text": text}
            (train if a["LEWISSPLIT"] == "TRAIN" else test).append(doc)
    return train, test


def reuters_features(train, test, max_features=20000):
    """tf-idf fitted on the training documents (l2-normalized rows)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    vec = TfidfVectorizer(max_features=max_features, sublinear_tf=True, min_df=2)
    try:
        Xtr = vec.fit_transform([d["text"] for d in train])
    except ValueError as exc:       # no word in two training documents
        raise InputError(f"the Reuters training documents give no features ({exc})") from None
    Xte = vec.transform([d["text"] for d in test])
    return sp.csr_matrix(Xtr, dtype=np.float64), sp.csr_matrix(Xte, dtype=np.float64)


def reuters_online(directory, n_features=2 ** 16, min_docs=10, single_label=None):
    """An online stream of every ModApte document in its original order (NEWID), paper 004 style.

    Features are the paper's log2(1 + count) bag of words, hashed (nothing is fitted, so no
    round sees statistics of later ones) and scaled to unit length.  Labels: one task per
    topic with at least ``min_docs`` documents in the stream; or, with ``single_label=N``,
    only the documents whose one topic is among the N most frequent, one-vs-rest over those
    N classes (the input of an output code).  Returns ``(X, Y, topics)``.
    """
    from sklearn.feature_extraction.text import HashingVectorizer
    train, test = read_reuters(directory)
    docs = sorted(train + test, key=lambda d: d["newid"])
    topics = reuters_topics(docs, min_docs)
    if single_label is not None:
        topics = topics[:single_label]
        docs = [d for d in docs if len(d["topics"]) == 1 and d["topics"][0] in topics]
    if not topics or not docs:
        raise InputError(f"{directory}: no topic has {min_docs} documents")
    vec = HashingVectorizer(n_features=n_features, alternate_sign=False, norm=None)
    X = sp.csr_matrix(vec.transform([d["text"] for d in docs]), dtype=np.float64)
    X.data = np.log2(1.0 + X.data)
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    X = sp.csr_matrix(sp.diags(1.0 / np.where(norms > 0, norms, 1.0)) @ X)
    return X, reuters_labels(docs, topics), topics


def reuters_topics(train, min_docs):
    """Topics with at least ``min_docs`` training documents, most frequent first."""
    counts = {}
    for d in train:
        for t in d["topics"]:
            counts[t] = counts.get(t, 0) + 1
    return sorted((t for t, c in counts.items() if c >= min_docs), key=lambda t: (-counts[t], t))


def reuters_labels(docs, topics):
    """+-1 label matrix (n_docs x n_topics)."""
    Y = -np.ones((len(docs), len(topics)))
    col = {t: k for k, t in enumerate(topics)}
    for i, d in enumerate(docs):
        for t in d["topics"]:
            if t in col:
                Y[i, col[t]] = 1.0
    return Y


def from_reuters(directory, min_docs=100, max_features=20000, labels=None):
    """Task datasets (train, test): one binary task per topic, every document in every task."""
    train, test = read_reuters(directory)
    topics = reuters_topics(train, min_docs)
    if not topics:
        raise InputError(f"{directory}: no topic has {min_docs} training documents")
    Xtr, Xte = reuters_features(train, test, max_features)
    Ytr, Yte = reuters_labels(train, topics), reuters_labels(test, topics)
    ytr = check_tasks([Xtr] * len(topics), [Ytr[:, k] for k in range(len(topics))],
                      _locate_in(directory, topics), labels)
    test_tasks = None
    if test:
        yte = check_tasks([Xte] * len(topics), [Yte[:, k] for k in range(len(topics))],
                          _locate_in(f"{directory} (ModApte TEST)", topics), labels)
        test_tasks = ([Xte] * len(topics), yte, topics)
    return ([Xtr] * len(topics), ytr, topics), test_tasks


# ---------------------------------------------------------------------------
# hpcmtl task datasets as input (relabel them, or write them as a stream)
# ---------------------------------------------------------------------------
def from_task_file(path, labels=None):
    """The tasks of an ``hpcmtl-tasks`` file (``hpcmtl data convert --format tasks``)."""
    from . import store
    blocks, names, _ = store.read_all_tasks(path)
    Xs, ys = [b.X for b in blocks], [b.y for b in blocks]
    return Xs, check_tasks(Xs, ys, _locate_in(path, names), labels), names


# ---------------------------------------------------------------------------
# Streams (hpcmtl-stream): tasks, single-label and multi-label files
# ---------------------------------------------------------------------------
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
        keys = [_label_key(u) for u in uniq]
        if any(k[0] == "s" for k in keys):
            if len(uniq) > MAX_CLASSES:
                raise _too_many_classes(lab.source, len(uniq))
            return (sp.csr_matrix(lab.X), _one_hot(np.asarray(inverse).reshape(-1), len(uniq)),
                    [str(u).strip() for u in uniq], f"single-label, {len(uniq)} classes")
        values = np.array([k[1] for k in keys])[np.asarray(inverse).reshape(-1)]
    else:
        values = _numeric(y, where(None))
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
        col = np.array([1.0 if any(_label_key(v) == labels.positive for v in t) else -1.0 for t in lab.y])
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
        Y = _numeric(Y, lab.locate(0, "y"))
        bad = _first_nonfinite(Y)
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
    bad = _first_nonfinite(X)
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


def stream_from(fmt, inputs, labels=None, n_features=None, task_column=None, label_column="y", features=None,
                drop=None, seed=0, report=None):
    """Any input ``hpcmtl data convert --stream`` reads, as ``(X, Y, label_names, description)``.

    Task datasets become one label column a task (:func:`tasks_stream`: their
    labels must be +-1 after ``labels``); single-label and multi-label files
    (no task ids) become columns as in :func:`labeled_stream`.  ``labels`` is a
    :class:`LabelRule` with ``binary=True``.
    """
    inputs = list(inputs)
    source = None
    if fmt == "malsar":
        source = _mat_source(inputs, stream=True)
    elif fmt == "npz":
        source = _npz_source(inputs)
    elif fmt == "csv":
        source = _csv_source(inputs[0], task_column, label_column, features, drop, labels, report)
    elif fmt == "svmlight" and len(inputs) == 1:
        lab = _svmlight_labeled(inputs[0], n_features)
        source = ("labeled", lab) if lab is not None else None
    if source is not None and source[0] == "labeled":
        X, Y, names, what = labeled_stream(source[1], labels)
    else:
        if source is not None:
            _, Xs, ys, names, locate = source
            ys = check_tasks(Xs, ys, locate, labels)
        elif fmt == "svmlight":
            Xs, ys, names = from_svmlight(inputs, n_features, labels)
        elif fmt == "tasks":
            Xs, ys, names = from_task_file(inputs[0], labels)
        elif fmt == "mnist":
            Xs, ys, names = from_mnist(inputs, seed, labels)
        elif fmt == "mds":
            Xs, ys, names = from_mds(inputs, n_features or 10000, labels)
        else:
            raise InputError(f"--stream does not read format '{fmt}'")
        X, Y, names = tasks_stream(Xs, ys, names)
        what = f"{len(names)} task{'s' if len(names) > 1 else ''}, 0 on the other tasks' rows"
    if labels is not None:
        labels.check_used(", ".join(map(str, inputs)))
    return X, Y, names, what


# ---------------------------------------------------------------------------
# Inspect a file before converting it (headers and metadata only where possible)
# ---------------------------------------------------------------------------
_LABEL_NAMES = ("y", "label", "labels", "target", "class", "gnd", "Y")


def q(path):
    """A path as a shell word in a suggested command."""
    import shlex
    return shlex.quote(path)


def _kind_of(path):
    """'hdf5', 'npz', 'mat', 'csv' or 'svmlight', by content first and by extension for text."""
    import zipfile

    from . import store
    _file(path)
    with open(path, "rb") as f:
        head = f.read(4096)
    if store.is_hdf5(path):
        return "hdf5"
    if zipfile.is_zipfile(path):
        return "npz"
    if head.startswith(b"MATLAB") or path.lower().endswith(".mat"):
        return "mat"
    ext = os.path.splitext(path)[1].lower()
    if ext in (".csv", ".tsv"):
        return "csv"
    if ext in (".svm", ".svmlight", ".libsvm"):
        return "svmlight"
    first = next((ln for ln in head.decode("utf-8", "replace").splitlines() if ln.strip()
                  and not ln.lstrip().startswith("#")), "")
    if re.fullmatch(r"\s*[^\s:]+(\s+qid:\S+)?(\s+\d+:\S+)*\s*", first) and ":" in first:
        return "svmlight"
    return "csv"


def _shape_text(shape):
    return " x ".join(str(k) for k in shape) if len(shape) else "scalar"


def _inspect_mat(path, out):
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
    summary = _label_summary(labels)
    what = f"a {'sparse' if kinds[x] == 'sparse' else 'dense'} {n} x {d} matrix '{x}' and labels '{y}'{summary}"
    if x == "fea":
        out["layout"] = f"{what}: one task (several fea/gnd files: one task a file, named after the file)"
        out["commands"] = [f"hpcmtl data convert --format malsar {q(path)} [MORE.mat ...] OUT.h5" + _map_hint(labels),
                           f"hpcmtl data convert --format malsar {q(path)} OUT-stream.h5 --stream --shuffle"]
    else:
        out["layout"] = f"{what}: one matrix and its labels (a stream)"
        out["commands"] = [f"hpcmtl data convert --format malsar {q(path)} OUT-stream.h5 --stream --shuffle"]


def _label_summary(labels):
    if labels is None:
        return ""
    labels = np.asarray(labels)
    if labels.ndim == 2 and min(labels.shape) > 1:
        return f" ({labels.shape[1]} label columns: multi-label)"
    values = np.unique(labels)
    return f" ({len(values)} distinct: {short_list([show_label(v) for v in values])})"


def _map_hint(labels):
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


def _inspect_npz(path, out):
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
        out["layout"] = (f"a sparse {fmt} {_shape_text(shape)} matrix from scipy.sparse.save_npz ({nnz} stored "
                         f"values): one task, its labels in a labels .npz (array '{_stem(path)}', or 'y')")
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


def _inspect_csv(path, out, n_rows=5):
    import io
    _file(path)
    text, rows = "", []
    with open(path, "rb") as f:                  # the header and n_rows records (quoted cells may span lines)
        for line_no in range(1, 5 * n_rows + 2):
            raw = f.readline()
            if not raw:
                break
            try:
                text += raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{path}: line {line_no}: byte 0x{raw[exc.start]:02x} is not UTF-8 text "
                                 "(save the file as UTF-8)") from None
            try:
                rows = [r for r in csv.reader(io.StringIO(text, newline="")) if r]
            except csv.Error as exc:
                raise InputError(f"{path}: line {line_no}: {exc}") from None
            if len(rows) > n_rows and text.endswith("\n"):
                break
    if not rows:
        raise InputError(f"{path}: empty CSV file")
    header, rows = rows[0], [r for r in rows[1:n_rows + 1] if len(r) == len(rows[0])]
    out["format"] = f"CSV, {len(header)} columns (the header and the first {len(rows)} rows read)"
    columns = []
    for k, name in enumerate(header):
        cells = [r[k] for r in rows]
        numeric = all(_label_key(c)[0] == "n" for c in cells) and bool(cells)
        columns.append({"name": name, "shape": [k], "dtype": "number" if numeric else "text",
                        "first": cells[:3]})
    out["variables"] = columns
    task = "task" if "task" in header else None
    label = next((c for c in _LABEL_NAMES if c in header and c != task), None)
    guessed = label is None
    if guessed:
        label = next((h for h in reversed(header) if h != task), header[-1])
    texts = [c["name"] for c in columns if c["dtype"] == "text" and c["name"] not in (task, label)]
    n_feat = len(header) - (task is not None) - 1 - len(texts)
    cells = [r[header.index(label)] for r in rows]
    flags = ("" if task in (None, "task") else f" --task-column {task}") + \
            ("" if label == "y" else f" --label-column {label}") + (f" --drop {','.join(texts)}" if texts else "")
    hint = _map_hint_cells(cells)
    lab = f"label column '{label}'{' (guessed: the last column)' if guessed else ''}"
    if task is None:
        out["layout"] = (f"no task column, so a single-label file: {lab}, {n_feat} feature columns; a stream, or "
                         "add a task column")
        out["commands"] = [f"hpcmtl data convert --format csv {q(path)} OUT-stream.h5 --stream --shuffle{flags}"]
    else:
        out["layout"] = f"task column '{task}', {lab}, {n_feat} feature columns"
        out["commands"] = [f"hpcmtl data convert --format csv {q(path)} OUT.h5{flags}{hint}",
                           f"hpcmtl data convert --format csv {q(path)} OUT-stream.h5 --stream --shuffle{flags}{hint}"]
    if texts:
        out["layout"] += f"; text columns {short_list(texts)} cannot be features (--drop)"


def _map_hint_cells(cells):
    keys = {_label_key(c) for c in cells}
    if not keys or keys <= {("n", 1.0), ("n", -1.0)}:
        return ""
    if all(k[0] == "n" for k in keys):
        return _map_hint(np.array([k[1] for k in keys]))
    return f" --positive-label {sorted(k[1] for k in keys if k[0] == 's')[-1]}"     # yes/no, spam/ham, pos/neg


def _inspect_svmlight(path, out, n_lines=1000):
    _file(path)
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
    shown = sorted(labels, key=lambda t: _label_key(t)[1] if _label_key(t)[0] == "n" else float("inf"))
    out["format"] = f"svmlight text (the first {count} data lines read)"
    out["variables"] = [
        {"name": "labels", "shape": [len(labels)], "dtype": "multi-label" if multi else "single-label",
         "first": shown[:8]},
        {"name": "features", "shape": [0 if low is None else high + (low == 0)], "dtype": "sparse",
         "first": [f"indices {low}..{high} ({'0' if low == 0 else '1'}-based)"] if low is not None else []}]
    if len(qids) > 1:
        out["variables"].append({"name": "qid", "shape": [len(qids)], "dtype": "task ids", "first": sorted(qids)[:8]})
        out["layout"] = f"task ids 'qid:' ({len(qids)} seen): one task a qid"
        hint = _map_hint_cells(list(labels))
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


def _inspect_hdf5(path, out):
    from . import store
    with open(path, "rb") as f:
        if f.read(10) == b"MATLAB 7.3":
            out["format"] = "MATLAB v7.3 .mat (HDF5)"
            out["layout"] = "scipy reads MATLAB files up to v7: save it with save(..., '-v7') to convert it"
            return
    fmt = store.file_format(path)
    if fmt == store.TASKS_FORMAT:
        with store.TaskFile(path) as tf:
            info = tf.info()
        out["format"] = f"hpcmtl task dataset ({info['storage']}{', float32' if info['dtype'] == 'float32' else ''})"
        out["variables"] = [{"name": t["name"], "shape": [t["n_samples"], info["n_features"]], "dtype": "task",
                             "first": [f"nnz {t['nnz']}"]} for t in info["tasks"]]
        out["layout"] = f"{info['n_tasks']} tasks, {info['n_features']} features: ready for hpcmtl train"
        out["commands"] = [f"hpcmtl data info {q(path)}",
                           f"hpcmtl data convert --format tasks {q(path)} OUT-stream.h5 --stream --shuffle"]
        return
    if fmt == store.STREAM_FORMAT:
        with store.StreamFile(path) as sf:
            info = sf.info()
        out["format"] = "hpcmtl stream"
        out["variables"] = [{"name": t["name"], "shape": [info["n_rounds"]], "dtype": "label",
                             "first": [f"+1 {t['positive']}", f"-1 {t['negative']}", f"dormant {t['dormant']}"]}
                            for t in info["labels"]]
        out["layout"] = (f"{info['n_rounds']} rounds, {info['n_features']} features, {info['n_labels']} labels: "
                         "ready for hpcmtl train online --stream")
        out["commands"] = [f"hpcmtl data info {q(path)}"]
        return
    out["format"] = "HDF5" + (f" (format {fmt!r})" if fmt else "")
    out["variables"] = store.list_datasets(path)
    out["layout"] = ("an hpcmtl result or checkpoint: see hpcmtl report / evaluate" if fmt else
                     "not an hpcmtl file: save its arrays with numpy.savez or scipy.io.savemat to convert them")


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
    kind = _kind_of(path)
    out = {"path": path, "kind": kind, "format": kind, "variables": [], "layout": "", "commands": []}
    {"mat": _inspect_mat, "npz": _inspect_npz, "csv": _inspect_csv, "svmlight": _inspect_svmlight,
     "hdf5": _inspect_hdf5}[kind](path, out)
    return out


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
            size = "?" if r["shape"] is None else _shape_text(r["shape"])
        first = f"  {', '.join(map(str, r['first']))}" if r.get("first") else ""
        lines.append(f"  {str(r['name']):<{width}s}  {size:<12s} {r['dtype']:<8s}{first}".rstrip())
    lines.append(f"layout: {info['layout']}")
    lines += [f"  {c}" for c in info["commands"]]
    return lines
