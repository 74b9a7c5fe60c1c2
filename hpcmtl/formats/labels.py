"""Labels mapped at conversion time (``--positive-label``, ``--labels``) and how labels are written in messages."""
from __future__ import annotations

import numpy as np

from ..errors import InputError
from .checks import numeric_array


def label_key(value):
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
    kind, v = label_key(value)
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
        self.positive = None if positive is None else label_key(positive)
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
            k = label_key(key)
            if k in table:
                raise InputError(f"--labels: label {key.strip()!r} is mapped twice")
            table[k] = number
        return table

    @property
    def maps(self):
        return self.positive is not None or self.table is not None

    def value(self, label):
        """The number a label becomes, or None when --labels does not name it."""
        key = label_key(label)
        if self.positive is not None:
            return 1.0 if key == self.positive else -1.0
        return self.table.get(key)

    def apply(self, y, where):
        """``y`` (1-D numbers or text) mapped to float64; ``where(k)`` names element ``k`` in the input."""
        y = np.asarray(y).reshape(-1)
        if not self.maps or y.dtype.kind not in "biufUS":
            return numeric_array(y, where(None))
        values, first, inverse = np.unique(y, return_index=True, return_inverse=True)
        mapped = np.empty(len(values))
        for j, v in enumerate(values):
            key = label_key(v)
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

