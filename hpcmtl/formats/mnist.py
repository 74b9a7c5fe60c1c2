"""MNIST IDX files -> 10 one-vs-all tasks (paper 001, Table 3 protocol)."""
from __future__ import annotations

import gzip
import math
import os
import struct

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from . import FormatSpec, Option, register_format
from .checks import check_tasks, locate_in, require_file
from .streams import one_stream, tasks_as_stream

SEED = 0                    # the negatives drawn
TRAIN_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")      # in an MNIST directory
TEST_FILES = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def read_idx(path):
    """An IDX file (optionally gzip'd) as a NumPy array."""
    import zlib
    require_file(path)
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot be read ({exc})") from None
    if len(raw) < 8:
        raise InputError(f"{path}: too short for an IDX file")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise InputError(f"{path}: not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    if len(raw) < 4 + 4 * ndim:
        raise InputError(f"{path}: too short for the {ndim} dimensions its header announces")
    shape = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != math.prod(shape):                 # Python integers: a header's huge dimensions cannot wrap
        raise InputError(f"{path}: header says {shape}, file holds {data.size} values")
    return data.reshape(shape)


def mnist_one_vs_all(images_path, labels_path, seed=SEED, labels=None):
    """Each digit's images as positives plus as many random negatives from other digits.

    The rows are CSR (pixels / 255): 81 % of MNIST's pixels are 0, and the row kernels
    then touch only the others, as liblinear's do."""
    images = read_idx(images_path)
    rule, labels = labels, read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise InputError(f"{images_path}, {labels_path}: expected n x 28 x 28 images and n labels")
    X = sp.csr_matrix(images.reshape(images.shape[0], -1)).astype(np.float64)
    X.data /= 255.0
    rng = np.random.default_rng(seed)
    Xs, ys, names = [], [], []
    for digit in range(10):
        pos = np.flatnonzero(labels == digit)
        others = np.flatnonzero(labels != digit)
        if pos.size == 0 or others.size < pos.size:
            raise InputError(f"{labels_path}: {pos.size} images of digit {digit} and {others.size} of other digits; "
                             "each digit's task needs at least one image and as many of other digits")
        neg = rng.choice(others, size=pos.size, replace=False)
        rows = np.concatenate([pos, neg])
        Xs.append(X[rows])
        ys.append(np.concatenate([np.ones(pos.size), -np.ones(neg.size)]))
        names.append(f"digit{digit}")
    return Xs, check_tasks(Xs, ys, locate_in(images_path, names), rule), names


def from_mnist(paths, seed=SEED, labels=None):
    """``paths``: a directory or the (images, labels) IDX pair."""
    if len(paths) == 1 and os.path.isdir(paths[0]):
        d = paths[0]
        paths = [os.path.join(d, f) for f in TRAIN_FILES]
    if len(paths) != 2:
        raise InputError("mnist needs an images IDX file and a labels IDX file (or a directory)")
    return mnist_one_vs_all(paths[0], paths[1], seed, labels)



def _read(inputs, options, labels, report, test=False):
    """The training tasks (a directory or an IDX pair), and with ``test`` the t10k tasks of the directory."""
    seed = options["seed"]
    if len(inputs) == 1 and os.path.isdir(inputs[0]):
        d = inputs[0]
        train = mnist_one_vs_all(*(os.path.join(d, f) for f in TRAIN_FILES), seed, labels)
        return train, (mnist_one_vs_all(*(os.path.join(d, f) for f in TEST_FILES), seed, labels) if test else None)
    train = from_mnist(inputs, seed, labels)
    if test:
        raise InputError("mnist --test-out needs the MNIST directory (the t10k files are read from it)")
    return train, None


def mnist_inputs(paths, options=None) -> list:
    """The IDX files read for ``paths``: a directory's training and t10k files, or the pair itself."""
    if len(paths) == 1 and os.path.isdir(paths[0]):
        return [os.path.join(paths[0], f) for f in TRAIN_FILES + TEST_FILES]
    return list(paths)


register_format(FormatSpec(
    name="mnist", read=_read, inputs=mnist_inputs,
    stream=one_stream(lambda inputs, options, labels, report: tasks_as_stream(*from_mnist(inputs, options["seed"],
                                                                                          labels))),
    options=(Option("seed", SEED, "the negatives drawn"),), test_out="a directory"))
