"""Memory estimates: refuse, before allocating, what cannot fit in the node's memory.

A few bytes of input (an svmlight index of 2e9, ``"rff_dim": 1e9`` in a result's
config) can ask for arrays proportional to d, m, rff_dim or rows.  The callers
that decide such an allocation call :func:`check_fits` with the estimate of
:func:`dense_bytes` first; it raises a one-line :class:`InputError` (exit 2)
naming the estimate and the node's memory.  The estimate is an order of
magnitude (the dense arrays a rank holds at once), so only what cannot fit at
all is refused; sparse data is counted by its stored entries, never densified.
"""
from __future__ import annotations

import os

from .errors import InputError

FLOAT = 8                   # bytes of a float64
# d x m arrays the DMTRL server surely holds at once (W and B); a worker holds fewer
SERVER_COPIES = 2


def dense_bytes(n_features: int, n_tasks: int = 1, rff_dim: int = 0, rows: int = 0, copies: int = SERVER_COPIES,
                dense_rows: bool = False) -> int:
    """Bytes of the dense arrays a rank allocates for a model over ``n_features`` and ``n_tasks``.

    ``copies`` d x m float64 arrays of the model's dimension (``rff_dim`` when a
    random Fourier map is used, else ``n_features``), the map itself
    (n_features x rff_dim) and, for ``dense_rows`` (or a feature map, whose
    output is dense), ``rows`` rows of the model's dimension.  Pure arithmetic
    on Python integers: never overflows.
    """
    n_features, n_tasks, rff_dim, rows = (max(0, int(v)) for v in (n_features, n_tasks, rff_dim, rows))
    d = rff_dim or n_features
    total = copies * d * max(1, n_tasks) * FLOAT
    if rff_dim:
        total += n_features * rff_dim * FLOAT * 2                  # the map and one transformed block's work
    if dense_rows or rff_dim:
        total += rows * d * FLOAT
    return total


def _cgroup_limit() -> int | None:
    """This process's cgroup memory limit in bytes (v2 or v1), None when there is none or it cannot be read."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def node_memory() -> int:
    """The memory this process may use: physical memory, or the cgroup limit when lower."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        physical = 1 << 62
    limit = _cgroup_limit()
    return min(physical, limit) if limit else physical


def gib(n: int) -> str:
    return f"{n / 2 ** 30:.1f} GiB"


def check_fits(estimate: int, what: str, available: int | None = None) -> None:
    """Raise a one-line InputError when ``estimate`` bytes exceed the node's memory (``available``)."""
    available = node_memory() if available is None else available
    if estimate > available:
        raise InputError(f"{what} needs about {gib(estimate)} of memory, this node has {gib(available)}")


# the compiled kernels index columns with int32 (a CSR's indices)
MAX_COLUMNS = 2 ** 31 - 1


def check_columns(n_features: int, what: str) -> None:
    """Raise a one-line InputError when ``n_features`` exceeds the kernels' int32 column index."""
    if int(n_features) > MAX_COLUMNS:
        raise InputError(f"{what}: {n_features} features, at most {MAX_COLUMNS} (2^31 - 1) are supported")
