"""Result files (format ``hpcmtl-result``): a trained model, its history, and what a run adds.

Layout: ``/model/W`` (d x m), ``/model/intercept`` (m; files written before
intercepts existed read as zeros), ``/model/Sigma`` (m x m, absent for methods
without a task covariance) or, a learned Sigma of many tasks, its factors
``/model/sigma_V`` (m x r), ``sigma_s`` (r), ``sigma_c`` (a number):
``Sigma = V diag(s) V^T + c (I - V V^T)`` (:class:`hpcmtl.covariance.SigmaFactors`;
no m x m array), ``/model/task_names``, ``/history/<column>``,
optional ``/test``, ``/ranks`` and further groups (e.g. ``/path``), and root
attributes ``config`` (JSON), ``hpcmtl_version``, ``n_ranks``.  Only numbers
and strings: readable with h5py or h5dump, never pickles.
"""
from __future__ import annotations

import json

import h5py
import numpy as np

from ..covariance import FACTOR_FIELDS, GRAPH_FIELDS, GraphSigma, SigmaFactors
from ..errors import InputError
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
    Sigma may be None for methods without a task covariance, a :class:`SigmaFactors` (written as
    ``/model/sigma_V``, ``sigma_s``, ``sigma_c``) or a :class:`GraphSigma` (``/model/graph_*``: the adjacency's
    CSR arrays, alpha, normalize, diag((L + diag(alpha))^-1)).
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
        if isinstance(Sigma, (SigmaFactors, GraphSigma)):        # no m x m array: the factors, or the graph
            for key, value in Sigma.arrays().items():
                value = np.asarray(value)
                model.create_dataset(key, data=value if value.dtype.kind in "iu" else value.astype(np.float64))
        elif Sigma is not None:
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
            if test.get("classes"):                  # an output code's classes by name (name, n, errors, error_rate)
                g.attrs["classes"] = json.dumps(test["classes"])
            for key in test["tasks"][0]:
                column = [t[key] for t in test["tasks"]]
                g.create_dataset(key, data=np.array(column, dtype=h5py.string_dtype()) if key == "name" else np.asarray(column))


def _classes_attr(g, path) -> list:
    """``/test`` attribute ``classes``: a JSON list of {name, n, errors, error_rate}, or a one-line InputError."""
    raw = g.attrs["classes"]
    try:
        value = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw))
    except ValueError:
        value = None
    if not (isinstance(value, list) and all(isinstance(c, dict) and "name" in c for c in value)):
        raise InputError(f"{path}: '/test' attribute 'classes' must be a JSON list of objects with a 'name'")
    return value


def _json_attr(f, path, name) -> dict:
    """A JSON object root attribute, or a one-line InputError."""
    if name not in f.attrs:
        raise InputError(f"{path}: missing attribute '{name}' (not a complete result file)")
    raw = f.attrs[name]
    try:
        value = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw))
    except ValueError as exc:
        raise InputError(f"{path}: attribute '{name}' is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise InputError(f"{path}: attribute '{name}' must be a JSON object, got {type(value).__name__}")
    return value


def _integer_attr(f, path, name) -> int:
    value = f.attrs.get(name)
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{path}: attribute '{name}' must be an integer >= 1, got {value!r}")
    return value


def _group(f, path, name):
    if name not in f or not isinstance(f[name], h5py.Group):
        raise InputError(f"{path}: missing group '/{name}' (not a complete result file)")
    return f[name]


def _numbers(path, field, dataset, ndim=None):
    """A numeric (real) dataset's values, checked by type (and rank): a one-line InputError otherwise."""
    if not isinstance(dataset, h5py.Dataset) or dataset.dtype.kind not in "biuf":
        raise InputError(f"{path}: field '{field}' must be a real numeric array")
    value = dataset[()]
    if ndim is not None and np.ndim(value) != ndim:
        raise InputError(f"{path}: field '{field}' must be {ndim}-D, has shape {np.shape(value)}")
    return value


# the model's numeric arrays: W (d x m), Sigma (m x m), intercept (m), Sigma's factors (m x r, r, a number)
MODEL_ARRAYS = ("W", "Sigma", "intercept") + FACTOR_FIELDS + GRAPH_FIELDS
MODEL_NDIM = {"W": 2, "Sigma": 2, "intercept": 1, "sigma_V": 2, "sigma_s": 1, "sigma_c": 0, "graph_indptr": 1,
              "graph_indices": 1, "graph_data": 1, "graph_alpha": 1, "graph_normalize": 0, "graph_diag": 1}


def _check_model(path, model: dict) -> None:
    """W (d x m, finite), intercept (m, finite) and Sigma (m x m, finite) where present."""
    W = model["W"]
    if not np.all(np.isfinite(W)):
        raise InputError(f"{path}: field 'model/W' has NaN or Inf")
    m = W.shape[1]
    for key, shape in (("intercept", (m,)), ("Sigma", (m, m))):
        if key in model:
            value = model[key]
            if np.shape(value) != shape:
                raise InputError(f"{path}: field 'model/{key}' has shape {np.shape(value)}, expected {shape} "
                                 f"(model/W has {m} columns)")
            if not np.all(np.isfinite(value)):
                raise InputError(f"{path}: field 'model/{key}' has NaN or Inf")
    if any(k in model for k in FACTOR_FIELDS):
        if "Sigma" in model or not all(k in model for k in FACTOR_FIELDS):
            raise InputError(f"{path}: fields 'model/sigma_V', 'model/sigma_s', 'model/sigma_c' come together, "
                             f"and without 'model/Sigma'")
        SigmaFactors.from_arrays(model, path, where="model", m=m)       # shapes, finite, positive
    if any(k in model for k in GRAPH_FIELDS):
        if "Sigma" in model or any(k in model for k in FACTOR_FIELDS) or not all(k in model for k in GRAPH_FIELDS):
            raise InputError(f"{path}: fields 'model/graph_*' ({', '.join(GRAPH_FIELDS)}) come together, and "
                             f"without 'model/Sigma' or its factors")
        GraphSigma.from_arrays(model, path, where="model", m=m)        # shapes, symmetric, weights and alpha >= 0
    names = model.get("task_names")
    if names is not None and len(names) != m:
        raise InputError(f"{path}: field 'model/task_names' has {len(names)} names, model/W has {m} columns")


def read_result(path) -> dict:
    """A result file as plain NumPy arrays and dicts, validated by type and shape (one-line InputErrors).

    The task covariance is ``model['Sigma']`` (m x m) or, a file of many tasks, its factors ``model['sigma_V']``,
    ``['sigma_s']``, ``['sigma_c']`` or a graph kernel's ``model['graph_*']``: :func:`hpcmtl.covariance.model_sigma`
    gives any of them as one object."""
    with open_read(path, RESULT_FORMAT) as f:
        model, history = _group(f, path, "model"), _group(f, path, "history")
        if "W" not in model:
            raise InputError(f"{path}: missing field 'model/W'")
        out = {
            "config": _json_attr(f, path, "config"),
            "hpcmtl_version": str(f.attrs.get("hpcmtl_version", "?")),
            "n_ranks": _integer_attr(f, path, "n_ranks"),
            "model": {},
            "history": {k: _numbers(path, f"history/{k}", v) for k, v in history.items()},
        }
        for k, v in model.items():
            if not isinstance(v, h5py.Dataset):
                raise InputError(f"{path}: field 'model/{k}' must be a dataset, not a group")
            if k in MODEL_ARRAYS:
                value = _numbers(path, f"model/{k}", v, ndim=MODEL_NDIM[k])
            elif k == "task_names" or h5py.check_string_dtype(v.dtype) is not None:      # names: a list of str
                value = v[()]
                if np.ndim(value) != 1:
                    raise InputError(f"{path}: field 'model/{k}' must be a 1-D list of names")
                value = [s.decode() if isinstance(s, bytes) else str(s) for s in value]
            else:
                value = v[()]
            out["model"][k] = value
        if "intercept" not in out["model"]:
            out["model"]["intercept"] = np.zeros(out["model"]["W"].shape[1])   # written before intercepts existed
        _check_model(path, out["model"])
        for name in f:
            if name not in ("model", "history", "test"):
                g = f[name]
                if not isinstance(g, h5py.Group):
                    raise InputError(f"{path}: '/{name}' must be a group")
                out[name] = {k: v[()] for k, v in g.items() if isinstance(v, h5py.Dataset)}
        if "test" in f:
            from ..metrics import canonical_summary        # old files' metric names -> today's
            test = _group(f, path, "test")
            out["test"] = {"summary": canonical_summary(_json_attr(test, path, "summary")),
                           "tasks": {k: v[()] for k, v in test.items() if isinstance(v, h5py.Dataset)}}
            if "classes" in test.attrs:
                out["test"]["classes"] = _classes_attr(test, path)
    return out
