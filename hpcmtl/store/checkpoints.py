"""Checkpoints (format ``hpcmtl-checkpoint``): everything needed to continue a run bit for bit.

A checkpoint holds the server's arrays (``/state``), one group per task block
(``/blocks/TTTTTT_PPPP``: alpha, coordinate order, shrinking state), the
config and counters (JSON root attributes) and the fingerprints of the
training data read (``/fingerprints``, verified on resume).  It is written
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
# the checkpoint layout's own version (root attribute ``checkpoint_version``): 2 since checkpoints always carry
# the training data's content fingerprints when the data has them; absent (1): written before that, when a
# checkpoint without /fingerprints could be either an old file or one whose group was removed
CHECKPOINT_VERSION = 2


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def write_checkpoint(path, arrays: dict, blocks: list, config: dict, counters: dict, fingerprints: dict | None = None):
    """Full training state, written atomically (the previous checkpoint survives a crash).

    ``arrays``: server state (B, Sigma, rho, history columns); ``blocks``: one
    dict per task block with ``task, part, start, stop`` and the arrays
    ``alpha``, ``order`` (coordinate order) and ``shrink`` (shrinking state);
    ``fingerprints``: ``{task name: content fingerprint}`` of the training data
    read (``/fingerprints/{name,value}``; verified on resume).
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


def _version(path, value) -> int:
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= CHECKPOINT_VERSION:
        raise InputError(f"{path}: attribute 'checkpoint_version' is {value!r}, this hpcmtl reads 1 to "
                         f"{CHECKPOINT_VERSION}")
    return value


def read_checkpoint(path) -> dict:
    with open_read(path, CHECKPOINT_FORMAT) as f:
        try:
            return {
                "path": os.fspath(path),
                "checkpoint_version": _version(path, f.attrs.get("checkpoint_version", 1)),
                "config": json.loads(f.attrs["config"]),
                "counters": json.loads(f.attrs["counters"]),
                "arrays": {k: v[()] for k, v in f["state"].items()},
                "blocks": [dict({k: int(h.attrs[k]) for k in ("task", "part", "start", "stop")},
                                alpha=h["alpha"][()], order=h["order"][()], shrink=h["shrink"][()])
                           for h in f["blocks"].values()],
                "fingerprints": ({_text(n): _text(v) for n, v in zip(f[_FINGERPRINTS]["name"][()],
                                                                     f[_FINGERPRINTS]["value"][()])}
                                 if _FINGERPRINTS in f else None),     # None: written before fingerprints
            }
        except KeyError as exc:
            raise InputError(f"{path}: incomplete checkpoint (missing {exc.args[0]})") from None
