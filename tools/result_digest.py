"""Digest of the numbers in hpcmtl output files, for checking that a refactor changed no result.

Usage: python tools/result_digest.py FILE.h5|FILE.npz ... > digest.txt

One line per dataset (HDF5) or array (npz): ``file path dtype shape sha256``.  Wall-clock
figures (any dataset or attribute whose name says seconds, time, rss or memory) and the
version/path attributes are left out: they differ between two runs of the same code.
Two digests of the same runs before and after a change must be identical.
"""
import hashlib
import json
import os
import sys

import numpy as np

VOLATILE = ("second", "time", "rss", "memory", "_mb", "hpcmtl_version", "created", "elapsed")


def volatile(name: str) -> bool:
    low = name.lower()
    return any(v in low for v in VOLATILE)


def digest(array) -> str:
    a = np.asarray(array)
    if a.dtype.kind in "OSU":
        data = repr(a.tolist()).encode()
    else:
        data = np.ascontiguousarray(a).tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def scrub_config(text):
    """The config JSON without paths (tmp folders differ) and wall-clock entries."""
    try:
        cfg = json.loads(text)
    except (TypeError, ValueError):
        return text

    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in sorted(x.items()) if not volatile(k)}
        if isinstance(x, list):
            return [clean(v) for v in x]
        if isinstance(x, str) and os.sep in x:
            return os.path.basename(x)
        return x
    return json.dumps(clean(cfg), sort_keys=True)


def h5_lines(path):
    import h5py
    out = []
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if volatile(name.rsplit("/", 1)[-1]):
                return
            if isinstance(obj, h5py.Dataset):
                out.append(f"{name} {obj.dtype} {obj.shape} {digest(obj[()])}")
            for key, value in sorted(obj.attrs.items()):
                if volatile(key):
                    continue
                if key == "config" or (isinstance(value, (str, bytes)) and str(value).startswith("{")):
                    value = scrub_config(value.decode() if isinstance(value, bytes) else value)
                out.append(f"{name}@{key} {digest(np.asarray(value, dtype=object) if isinstance(value, str) else value)}")
        for key, value in sorted(f.attrs.items()):
            if not volatile(key):
                if isinstance(value, (str, bytes)):
                    value = scrub_config(value.decode() if isinstance(value, bytes) else value)
                    value = np.asarray(value, dtype=object)
                out.append(f"/@{key} {digest(value)}")
        f.visititems(visit)
    return out


def npz_lines(path):
    with np.load(path, allow_pickle=False) as z:
        return [f"{k} {z[k].dtype} {z[k].shape} {digest(z[k])}" for k in sorted(z.files) if not volatile(k)]


def main(paths):
    for path in paths:
        lines = npz_lines(path) if path.endswith(".npz") else h5_lines(path)
        for line in lines:
            print(f"{os.path.basename(path)} {line}")


if __name__ == "__main__":
    main(sys.argv[1:])
