"""Checkpoints (format ``hpcmtl-checkpoint``): everything needed to continue a run bit for bit.

A checkpoint holds the server's arrays (``/state``), one group per task block
(``/blocks/TTTTTT_PPPP``: alpha, coordinate order, shrinking state), the
config and counters (JSON root attributes) and the fingerprints of the
training data read (``/fingerprints``, verified on resume).  A grid's checkpoint (a lam grid, ``--cv``, a
radius path with validation) adds ``/path``: its JSON attribute ``path`` (where the path stands and what
must match to resume it) and ``/path/arrays`` (the finished points' scores, the warm starts it carries
forward); ``/state`` and ``/blocks`` then hold the current grid point's solver state (or nothing: the
point restarts).  It is written
atomically (:mod:`hpcmtl.store.atomic`), so a crash mid-write never destroys
the last good checkpoint.
"""
from __future__ import annotations

import json
import os

import h5py
import numpy as np

from ..errors import InputError
from .atomic import atomic_h5
from .hdf5 import CHECKPOINT_FORMAT, FORMAT_VERSION, open_read

_FINGERPRINTS = "fingerprints"
_PATH = "path"
# the checkpoint layout's own version (root attribute ``checkpoint_version``): 2 since checkpoints always carry
# the training data's content fingerprints when the data has them; absent (1): written before that, when a
# checkpoint without /fingerprints could be either an old file or one whose group was removed
CHECKPOINT_VERSION = 2


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def write_checkpoint(path, arrays: dict, blocks: list, config: dict, counters: dict, fingerprints: dict | None = None,
                     path_state: dict | None = None):
    """Full training state, written atomically (the previous checkpoint survives a crash).

    ``arrays``: server state (B, Sigma, rho, history columns); ``blocks``: one
    dict per task block with ``task, part, start, stop`` and the arrays
    ``alpha``, ``order`` (coordinate order) and ``shrink`` (shrinking state);
    ``fingerprints``: ``{task name: content fingerprint}`` of the training data
    read (``/fingerprints/{name,value}``; verified on resume); ``path_state``: a grid's
    ``{"info": JSON-able dict, "arrays": {name: array}}`` (``/path``).
    """
    with atomic_h5(path, force=True, what="checkpoint") as f:
        f.attrs["format"] = CHECKPOINT_FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["checkpoint_version"] = CHECKPOINT_VERSION
        f.attrs["config"] = json.dumps(config, sort_keys=True)
        f.attrs["counters"] = json.dumps(counters, sort_keys=True)
        g = f.create_group("state")
        for key, value in arrays.items():
            g.create_dataset(key, data=np.asarray(value))
        bg = f.create_group("blocks")
        for b in blocks:
            h = bg.create_group(f"{int(b['task']):06d}_{int(b['part']):04d}")
            for key in ("task", "part", "start", "stop"):
                h.attrs[key] = int(b[key])
            h.create_dataset("alpha", data=np.asarray(b["alpha"], dtype=np.float64))
            h.create_dataset("order", data=np.asarray(b["order"], dtype=np.int32))
            h.create_dataset("shrink", data=np.asarray(b["shrink"], dtype=np.float64))
        if fingerprints:
            g = f.create_group(_FINGERPRINTS)
            g.create_dataset("name", data=np.array(list(fingerprints), dtype=h5py.string_dtype()))
            g.create_dataset("value", data=np.array(list(fingerprints.values()), dtype=h5py.string_dtype()))
        if path_state is not None:
            g = f.create_group(_PATH)
            g.attrs["path"] = json.dumps(path_state["info"], sort_keys=True,
                                         default=lambda v: v.item() if isinstance(v, np.generic) else str(v))
            a = g.create_group("arrays")
            for key, value in path_state.get("arrays", {}).items():
                a.create_dataset(key, data=np.asarray(value))


def _version(path, value) -> int:
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= CHECKPOINT_VERSION:
        raise InputError(f"{path}: attribute 'checkpoint_version' is {value!r}, this hpcmtl reads 1 to "
                         f"{CHECKPOINT_VERSION}")
    return value


def _json(path, f, name) -> dict:
    raw = f.attrs[name]
    try:
        value = json.loads(_text(raw))
    except ValueError as exc:
        raise InputError(f"{path}: attribute '{name}' is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise InputError(f"{path}: attribute '{name}' must be a JSON object, got {type(value).__name__}")
    return value


# the server arrays that must be finite (the model and the task covariance); history columns may hold inf
FINITE_STATE = ("BT", "Sigma", "sigma_V", "sigma_s", "sigma_c", "graph_data", "graph_alpha", "graph_diag", "W", "b",
                "rho")


def _real(path, field, dataset, shape=None, kinds="biuf", finite=True):
    """A dataset's real values (of ``shape`` when given; ``finite``: no NaN or Inf), or a one-line InputError."""
    if not isinstance(dataset, h5py.Dataset) or dataset.dtype.kind not in kinds:
        raise InputError(f"{path}: field '{field}' must be an array of {'integers' if kinds == 'iu' else 'numbers'}")
    value = dataset[()]
    if shape is not None and np.shape(value) != shape:
        raise InputError(f"{path}: field '{field}' has shape {np.shape(value)}, expected {shape}")
    if finite and value.dtype.kind == "f" and not np.all(np.isfinite(value)):
        raise InputError(f"{path}: field '{field}' has NaN or Inf")
    return value


def _block(path, name, h) -> dict:
    """One block's state, validated: alpha (finite) and order (rows of the block) of stop - start entries each."""
    head = {}
    for k in ("task", "part", "start", "stop"):
        v = h.attrs[k]
        v = v.item() if isinstance(v, np.generic) else v
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InputError(f"{path}: block '{name}': attribute '{k}' must be an integer >= 0, got {v!r}")
        head[k] = v
    n = head["stop"] - head["start"]
    if n < 0:
        raise InputError(f"{path}: block '{name}': stop {head['stop']} is below start {head['start']}")
    where = f"blocks/{name}"
    out = dict(head, alpha=_real(path, f"{where}/alpha", h["alpha"], (n,)),
               order=_real(path, f"{where}/order", h["order"], (n,), kinds="iu"),
               shrink=_real(path, f"{where}/shrink", h["shrink"], finite=False))
    if out["shrink"].ndim != 1:
        raise InputError(f"{path}: field '{where}/shrink' must be 1-D, has shape {out['shrink'].shape}")
    if n and (out["order"].min() < 0 or out["order"].max() >= n):
        raise InputError(f"{path}: field '{where}/order' holds a row outside the block's 0..{n - 1}")
    return out


def _path_state(path, g) -> dict:
    """A grid's ``/path``: its JSON record and its arrays (real numbers; scores may be NaN before they exist)."""
    return {"info": _json(path, g, "path"),
            "arrays": {k: _real(path, f"path/arrays/{k}", v, finite=False) for k, v in g["arrays"].items()}}


def read_checkpoint(path) -> dict:
    """A checkpoint as plain values, validated by type and shape (one-line InputErrors, never a traceback)."""
    with open_read(path, CHECKPOINT_FORMAT) as f:
        try:
            return {
                "path": os.fspath(path),
                "checkpoint_version": _version(path, f.attrs.get("checkpoint_version", 1)),
                "config": _json(path, f, "config"),
                "counters": _json(path, f, "counters"),
                "arrays": {k: _real(path, f"state/{k}", v, kinds="biufSO", finite=k in FINITE_STATE)
                           for k, v in f["state"].items()},
                "blocks": [_block(path, name, h) for name, h in f["blocks"].items()],
                "fingerprints": ({_text(n): _text(v) for n, v in zip(f[_FINGERPRINTS]["name"][()],
                                                                     f[_FINGERPRINTS]["value"][()])}
                                 if _FINGERPRINTS in f else None),     # None: written before fingerprints
                "grid": _path_state(path, f[_PATH]) if _PATH in f else None,     # None: a single run's
            }
        except KeyError as exc:
            raise InputError(f"{path}: incomplete checkpoint (missing {exc.args[0]})") from None
        except (TypeError, AttributeError) as exc:         # a group where a dataset belongs, or the reverse
            raise InputError(f"{path}: not a valid checkpoint ({exc})") from None
