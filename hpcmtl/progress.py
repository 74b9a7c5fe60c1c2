"""What rank 0 prints while training (other ranks print only when they fail).

On a terminal: one live line redrawn in place, with a bar that fills as the
relative duality gap falls (log scale) towards the tolerance, or as the rounds
of a subgradient run pass.  Elsewhere (a SLURM log): at most one plain line per
``every_seconds`` (10 s by default; 0 prints every round), plus the last row of
every outer step (W-step, radius of a path) and the final row, so logs stay
readable and still show where each step ended.  ``level``:
``debug`` and ``info`` print progress, ``warning`` only the final summary,
``error`` nothing but errors.  :func:`fields` reads a printed line back.
"""
from __future__ import annotations

import math
import re
import sys
import time

DEFAULT_SECONDS = 10.0          # a log line at most this often (not on a terminal)


def step_of(row):
    """The outer step a row belongs to (W-step of DMTRL, radius of a path), or None."""
    for key in ("outer", "radius"):
        if key in row:
            return row[key]
    return None


def describe(row) -> str:
    if "inf_error_rate" in row:
        mc = row.get("multiclass_error_rate")
        return (f"round {row['round']:8d}/{row['n_rounds']}  cumulative loss {row['cumulative_loss']:.6g}  "
                f"inf-error {row['inf_error_rate']:.4f}  1-error {row['one_error_rate']:.4f}  "
                + (f"multiclass {mc:.4f}  " if mc is not None else "")
                + f"{row['seconds']:8.2f}s  {row['bytes'] / 1e6:9.3f} MB")
    if "primal" in row:
        return (f"round {row['round']:5d}  outer {row['outer']:2d}  primal {row['primal']:.10g}  "
                f"dual {row['dual']:.10g}  rel_gap {row['rel_gap']:.3e}  {row['seconds']:8.2f}s  "
                f"{row['bytes'] / 1e6:9.3f} MB")
    return (f"round {row['round']:5d}  objective {row['objective']:.10g}  best {row['best_objective']:.10g}  "
            f"features {row['selected']:6d}  {row['seconds']:8.2f}s  {row['bytes'] / 1e6:9.3f} MB")


_START = re.compile(r"\r?(?:\[[#.]*\] )?round\s+\d")         # (after a terminal's bar)
_NAMED = re.compile(r"(?<!\S)([\w-]*[A-Za-z][\w-]*)\s+([-+]?(?:inf|nan|\d+(?:\.\d*)?(?:e[-+]?\d+)?))"
                    r"(?:/(\d+))?(?=\s|$)")
_SECONDS = re.compile(r"(?<!\S)(\d+\.\d+)s(?=\s|$)")
_MB = re.compile(r"(?<!\S)(\d+\.\d+) MB(?=\s|$)")


def fields(line: str) -> dict:
    """The numbers of a progress line by name, ``{}`` for any other line.

    Each printed ``name value`` pair (``round``, ``outer``, ``primal``, ``dual``,
    ``rel_gap``, ``objective``, ``best``, ``features``, ``loss``, ``inf-error``,
    ...), ``n_rounds`` from ``round t/T``, ``seconds`` and ``MB``; whole numbers
    as int.  Read logs with this rather than by column or padding.
    """
    if _START.match(line) is None:
        return {}

    def number(text):
        return int(text) if text.lstrip("+-").isdigit() else float(text)

    out = {}
    for name, value, total in _NAMED.findall(line):
        out[name] = number(value)
        if total:
            out["n_rounds"] = int(total)
    for key, pattern in (("seconds", _SECONDS), ("MB", _MB)):
        found = pattern.search(line)
        if found:
            out[key] = float(found.group(1))
    return out


class Progress:
    """Callable given each history row by the server."""

    def __init__(self, level="info", every_seconds=DEFAULT_SECONDS, tol=None, max_rounds=None, stream=None,
                 tty=None):
        self.stream = stream or sys.stdout
        self.show = level in ("debug", "info")
        self.tty = self.stream.isatty() if tty is None else tty
        self.every = float(every_seconds)
        self.tol, self.max_rounds = tol, max_rounds
        self.last = -math.inf
        self.first_gap = None
        self.pending = None

    def fraction(self, row):
        if "rel_gap" in row and self.tol:
            gap = max(row["rel_gap"], 1e-300)
            if self.first_gap is None:
                self.first_gap = max(gap, self.tol * 10)
            span = math.log(self.first_gap / self.tol)
            return min(1.0, max(0.0, math.log(self.first_gap / gap) / span)) if span > 0 else 1.0
        if self.max_rounds:
            return min(1.0, row["round"] / self.max_rounds)
        return 0.0

    def __call__(self, row):
        if not self.show:
            return
        now = time.monotonic()
        if self.tty:
            filled = int(round(20 * self.fraction(row)))
            self.stream.write("\r[" + "#" * filled + "." * (20 - filled) + "] " + describe(row) + "\033[K")
            self.stream.flush()
            return
        if self.pending is not None and step_of(self.pending) != step_of(row):
            self.print(self.pending)                         # where the previous outer step ended
        if now - self.last >= self.every:
            self.print(row)
            self.last = now
        else:
            self.pending = row

    def print(self, row):
        print(describe(row), file=self.stream, flush=True)
        self.pending = None

    def outer_step(self, outer, joint):
        """One line after each learned-Sigma W-step: the joint certificate (hpcmtl.dmtrl.joint)."""
        if not self.show:
            return
        if self.tty:
            self.stream.write("\n")
        elif self.pending is not None:
            self.print(self.pending)
        print(f"outer {outer:2d}  joint primal {joint['joint_primal']:.10g}  joint dual {joint['joint_dual']:.10g}  "
              f"joint_rel_gap {joint['joint_rel_gap']:.3e}  prox_step {joint['prox_step']:.3g}"
              + (f"  accelerated {joint['apg_iterations']} steps to P {joint['prox_primal']:.10g}"
                 if joint.get("apg_iterations") else ""),
              file=self.stream, flush=True)

    def close(self):
        """End the live line; in a log, print the last row if throttling held it back."""
        if not self.show:
            return
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
        elif self.pending is not None:
            self.print(self.pending)
