"""Timing shared by the benchmarks: the median of several runs (the machines are shared and noisy)."""
import json
import statistics
import time


def median_time(fn, repeats):
    """(median seconds, every run's seconds) of ``fn()`` over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def save_json(path, everything):
    """Every run's numbers, for a later look (``--json``); nothing when ``path`` is None."""
    if path:
        with open(path, "w") as f:
            json.dump(everything, f, indent=1)
