"""Result files (format ``hpcmtl-result``): a trained model, its history, and what a run adds.

Layout: ``/model/W`` (d x m), ``/model/intercept`` (m; files written before
intercepts existed read as zeros), ``/model/Sigma`` (m x m, absent for methods
without a task covariance), ``/model/task_names``, ``/history/<column>``,
optional ``/test``, ``/ranks`` and further groups (e.g. ``/path``), and root
attributes ``config`` (JSON), ``hpcmtl_version``, ``n_ranks``.  Only numbers
and strings: readable with h5py or h5dump, never pickles.
"""
from __future__ import annotations

import json

import h5py
import numpy as np

from .atomic import atomic_h5
from .hdf5 import FORMAT_VERSION, RESULT_FORMAT, open_read


def write_result(path, W, Sigma, history: dict, config: dict, n_ranks: int,
                 version: str, task_names=None, extra: dict | None = None, test: dict | None = None,
                 ranks: dict | None = None, groups: dict | None = None, force=True, intercept=None):
    """Write a result file (the layout: see the module docstring).

    ``intercept`` (m per-task intercepts) is written as ``/model/intercept``
    (zeros when None, so every new file has one).

    ``extra`` adds /model arrays; ``test`` (``{"tasks": [...], "summary": {...}}``)
    adds ``/test/<metric>`` per-task arrays and a ``summary`` JSON attribute;
    ``ranks`` adds ``/ranks/<name>`` arrays with one entry per MPI rank (memory);
    ``groups`` adds further ``/<group>/<name>`` arrays (e.g. a regularization path).
    Sigma may be None for methods without a task covariance.
    """
    with atomic_h5(path, force=force, what="result") as f:
        f.attrs["format"] = RESULT_FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["config"] = json.dumps(config, sort_keys=True)
        f.attrs["hpcmtl_version"] = version
        f.attrs["n_ranks"] = int(n_ranks)
        model = f.create_group("model")
        model.create_dataset("W", data=np.asarray(W, dtype=np.float64))
        n_columns = np.shape(W)[1] if np.ndim(W) == 2 else 0
        model.create_dataset("intercept", data=np.zeros(n_columns) if intercept is None
                             else np.asarray(intercept, dtype=np.float64).reshape(n_columns))
        if Sigma is not None:
            model.create_dataset("Sigma", data=np.asarray(Sigma, dtype=np.float64))
        if task_names is not None:
            model.create_dataset("task_names", data=np.array(task_names, dtype=h5py.string_dtype()))
        for key, value in (extra or {}).items():
            value = np.asarray(value)
            model.create_dataset(key, data=value.astype(h5py.string_dtype()) if value.dtype.kind == "U" else value)
        hist = f.create_group("history")
        for key, values in history.items():
            hist.create_dataset(key, data=np.asarray(values))
        for name, arrays in dict(groups or {}, **({"ranks": ranks} if ranks else {})).items():
            g = f.create_group(name)
            for key, values in arrays.items():
                g.create_dataset(key, data=np.asarray(values))
        if test:
            g = f.create_group("test")
            g.attrs["summary"] = json.dumps(test["summary"], sort_keys=True)
            for key in test["tasks"][0]:
                column = [t[key] for t in test["tasks"]]
                g.create_dataset(key, data=np.array(column, dtype=h5py.string_dtype()) if key == "name" else np.asarray(column))


def read_result(path) -> dict:
    """A result file as plain NumPy arrays and dicts."""
    with open_read(path, RESULT_FORMAT) as f:
        out = {
            "config": json.loads(f.attrs["config"]),
            "hpcmtl_version": str(f.attrs["hpcmtl_version"]),
            "n_ranks": int(f.attrs["n_ranks"]),
            "model": {},
            "history": {k: v[()] for k, v in f["history"].items()},
        }
        for k, v in f["model"].items():
            value = v[()]
            if k == "task_names" or h5py.check_string_dtype(v.dtype) is not None:      # names: a list of str
                value = [s.decode() if isinstance(s, bytes) else str(s) for s in value]
            out["model"][k] = value
        if "intercept" not in out["model"] and np.ndim(out["model"].get("W")) == 2:
            out["model"]["intercept"] = np.zeros(out["model"]["W"].shape[1])   # written before intercepts existed
        for name in f:
            if name not in ("model", "history", "test"):
                out[name] = {k: v[()] for k, v in f[name].items()}
        if "test" in f:
            from ..metrics import canonical_summary        # old files' metric names -> today's
            out["test"] = {"summary": canonical_summary(json.loads(f["test"].attrs["summary"])),
                           "tasks": {k: v[()] for k, v in f["test"].items()}}
    return out
