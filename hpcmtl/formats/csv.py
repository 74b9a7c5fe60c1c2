"""CSV files (UTF-8): a header line, then one sample a line, with a task column and a label column.

Without the task column (``--stream``) a file is one matrix and its labels.
"""
from __future__ import annotations

import csv
import os
import re

import numpy as np

from ..errors import InputError
from . import FormatSpec, Option, register_format
from .checks import Labeled, check_name, check_tasks, require_file
from .inspect import map_hint_cells, q
from .labels import label_key, short_list
from .streams import one_stream, source_stream

TASK_COLUMN = "task"        # the task column's name when --task-column is not given
LABEL_COLUMN = "y"          # the label column's name when --label-column is not given


def _read_text(path):
    """The text of a UTF-8 file (a byte-order mark is dropped), or an InputError naming the bad line."""
    require_file(path)
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


def _csv_table(path, task_column=TASK_COLUMN, label_column=LABEL_COLUMN, features=None, drop=None, raw_labels=False,
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
                    tasks.append(check_name(row[ti], f"{path}: line {line_no}, column '{task_column}'"))
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


def from_csv(path, task_column=TASK_COLUMN, label_column=LABEL_COLUMN, features=None, drop=None, labels=None, report=None):
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


def _csv_source(path, task_column=None, label_column=LABEL_COLUMN, features=None, drop=None, labels=None, report=None):
    """A CSV file for a stream: tasks when it has the task column (always when one is named), else one matrix."""
    header, tasks, y, X, lines, fi, yi = _csv_table(path, task_column or TASK_COLUMN, label_column, features, drop,
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


_LABEL_NAMES = ("y", "label", "labels", "target", "class", "gnd", "Y")


SAMPLE_ROWS = 2000      # data inspect judges a CSV file's columns by at most this many rows
_ID_WORDS = ("id", "#", "subject", "task", "user", "group", "person", "respondent", "participant", "patient",
             "school", "site", "session")


def _sample_rows(path, header, limit=SAMPLE_ROWS):
    """Up to ``limit`` data rows of a CSV file with the header's cell count (empty when the file cannot be read:
    the reader then reports the error where it is)."""
    import io
    from itertools import islice
    text = []
    try:
        with open(path, "rb") as f:
            for raw in islice(f, 4 * limit + 1):
                try:
                    text.append(raw.decode("utf-8-sig" if not text else "utf-8"))
                except UnicodeDecodeError:
                    break                     # the sample ends where the text does (convert names the line)
        reader = csv.reader(io.StringIO("".join(text), newline=""))
        return [r for r in islice(reader, 1, limit + 1) if len(r) == len(header)]
    except (OSError, csv.Error):
        return []


def _numbers(cells):
    """The cells as floats, or None when one is not a finite number."""
    try:
        values = np.array([float(c) for c in cells])
    except ValueError:
        return None
    return values if np.all(np.isfinite(values)) else None


def _task_column(header, rows):
    """The column that looks like a task id (None if none does): whole numbers or text ids with at least 3 (2 for a
    name like 'subject#' or 'user_id', which also wins ties) and at most half as many distinct values as rows, each
    value in one run of consecutive rows (a file sorted by subject); never a column named like a label."""
    best, best_score = None, 0
    n = len(rows)
    for k, name in enumerate(header):
        cells = [r[k].strip() for r in rows]
        values = _numbers(cells)
        if values is not None and np.any(values != np.round(values)):
            continue                          # a real-valued column is a feature or a label
        runs = 1 + sum(a != b for a, b in zip(cells, cells[1:]))
        distinct = len(set(cells))
        named = any(w in name.lower() for w in _ID_WORDS)
        # two values in two runs is as likely a label of a file sorted by class: an id needs its name then
        if name in _LABEL_NAMES or not (2 + (not named) <= distinct <= n // 2 and runs == distinct):
            continue
        score = 2 + (values is not None) + 2 * named
        if score > best_score:
            best, best_score = name, score
    return best


def _label_candidates(header, rows, task):
    """``[(column, its values)]`` of the numeric columns with at most 10 distinct values (a class label), binary
    first; the task column left out."""
    out = []
    for k, name in enumerate(header):
        values = _numbers([r[k] for r in rows]) if name != task else None
        if values is not None and len(rows) and len(set(values.tolist())) <= 10:
            out.append((name, [f"{v:g}" for v in sorted(set(values.tolist()))]))
    out = sorted(out, key=lambda c: len(c[1]) != 2)
    last = next((h for h in reversed(header) if h != task), None)
    if last is not None and last not in [c for c, _ in out] and _numbers([r[header.index(last)] for r in rows]) \
            is not None and rows:
        out.append((last, ["real values: --loss squared"]))    # a regression target, commonly last
    return out


def inspect_csv(path, out, n_rows=5):
    import io
    require_file(path)
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
    columns = []
    for k, name in enumerate(header):
        cells = [r[k] for r in rows]
        numeric = all(label_key(c)[0] == "n" for c in cells) and bool(cells)
        columns.append({"name": name, "shape": [k], "dtype": "number" if numeric else "text",
                        "first": cells[:3]})
    out["variables"] = columns
    sample = _sample_rows(path, header) or rows
    out["format"] = (f"CSV, {len(header)} columns (the header and the first {len(rows)} rows shown, "
                     f"{len(sample)} read to judge the columns)")
    task = TASK_COLUMN if TASK_COLUMN in header else _task_column(header, sample)
    label = next((c for c in _LABEL_NAMES if c in header and c != task), None)
    candidates = _label_candidates(header, sample, task)
    guessed = label is None
    if guessed:
        binary = [c for c, values in candidates if len(values) == 2]
        label = binary[-1] if binary else next((h for h in reversed(header) if h != task), header[-1])
    texts = [c["name"] for c in columns if c["dtype"] == "text" and c["name"] not in (task, label)]
    n_feat = len(header) - (task is not None) - 1 - len(texts)
    cells = [r[header.index(label)] for r in sample]
    flags = ("" if task in (None, TASK_COLUMN) else f" --task-column {q(task)}") + \
            ("" if label == LABEL_COLUMN else f" --label-column {q(label)}") + \
            (f" --drop {q(','.join(texts))}" if texts else "")
    hint = map_hint_cells(cells)
    why = "two values" if guessed and len(set(cells)) == 2 else "the last column"
    lab = f"label column '{label}'{f' (guessed: {why})' if guessed else ''}"
    if task is None:
        out["layout"] = (f"no task column, so a single-label file: {lab}, {n_feat} feature columns; a stream, or "
                         "add a task column")
        out["commands"] = [f"hpcmtl data convert --format csv {q(path)} OUT-stream.h5 --stream --shuffle{flags}"]
    else:
        found = "" if task == TASK_COLUMN else " (found by its shape: whole numbers or ids, few distinct, " \
                                               "each in one run of rows)"
        out["layout"] = f"task column '{task}'{found}, {lab}, {n_feat} feature columns"
        out["task_column"] = task
        out["label_candidates"] = [c for c, _ in candidates]
        out["commands"] = [f"hpcmtl data convert --format csv {q(path)} OUT.h5{flags}{hint}",
                           f"hpcmtl data convert --format csv {q(path)} OUT-stream.h5 --stream --shuffle{flags}{hint}"]
    if texts:
        out["layout"] += f"; text columns {short_list(texts)} cannot be features (--drop)"
    others = [f"'{c}' ({short_list(values)})" for c, values in candidates if c != label]
    if task is not None and others:
        out["layout"] += f"; other label candidates (--label-column; the rest are features): {', '.join(others)}"



def _read(inputs, options, labels, report, test=False):
    return from_csv(inputs[0], options["task_column"] or TASK_COLUMN, options["label_column"], options["features"],
                    options["drop"], labels, report=report), None


def _stream(inputs, options, labels, report):
    return source_stream(_csv_source(inputs[0], options["task_column"], options["label_column"], options["features"],
                                     options["drop"], labels, report), labels)


def _sniff(path, head):
    return 2 if os.path.splitext(path)[1].lower() in (".csv", ".tsv") else 0     # 0: any other text


register_format(FormatSpec(
    name="csv", read=_read, stream=one_stream(_stream), one_input=True,
    options=(Option("task_column", None, f"the task column (default '{TASK_COLUMN}'; with --stream a file without "
                                         "it is single-label)"),
             Option("label_column", LABEL_COLUMN, "the label column"),
             Option("features", None, "the feature columns: names or 0-based indices, ranges 3-7 or x1:x9, "
                                      "comma-separated"),
             Option("drop", None, "columns that are not features (as --features)")),
    sniff=_sniff, kind="csv", inspect=inspect_csv))
