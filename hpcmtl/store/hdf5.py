"""What every file of the store shares: the format names, opening a file for reading, probing a file.

Every file the store writes is HDF5 with two root attributes, ``format``
(one of the ``*_FORMAT`` names below) and ``format_version``
(:data:`FORMAT_VERSION`); :func:`open_read` refuses a file whose attributes
say otherwise, in one line naming the file.  :func:`file_format`,
:func:`is_hdf5` and :func:`list_datasets` look at a file without reading its
data (``hpcmtl data info``, the converters).

Every file is kept in its box: an input must be a regular file, checked with
``os.stat`` before it is opened (a FIFO is never opened, so nothing blocks),
and every HDF5 file hpcmtl opens is visited once, its metadata only, by
:func:`check_contained`: an external link, a soft link leading out of its
group, a dataset with external raw storage or a virtual dataset is refused in
one line naming the file and the object, since each would make hpcmtl read (or
a later ``--force`` overwrite) a file it was not given.
"""
from __future__ import annotations

import contextlib
import os
import posixpath
import stat

import h5py
import numpy as np

from ..errors import InputError

TASKS_FORMAT = "hpcmtl-tasks"
RESULT_FORMAT = "hpcmtl-result"
CHECKPOINT_FORMAT = "hpcmtl-checkpoint"
STREAM_FORMAT = "hpcmtl-stream"
FORMAT_VERSION = 1

TRUTH = "truth"           # group of ground-truth arrays (synthetic task files and streams)


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


def file_kind(mode: int) -> str:
    """What a ``st_mode`` that is not a regular file names, in words ("a FIFO", "a directory", ...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def require_regular(path) -> str:
    """``path`` (as a str) if it names an existing regular file (through links); a one-line InputError if not.

    Uses ``os.stat`` only: a FIFO, socket or device is refused without being
    opened (opening a FIFO for reading blocks until a writer comes).
    """
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        if stat.S_ISDIR(mode):
            raise InputError(f"{path}: is a directory, expected a file")
        raise InputError(f"{path}: is {file_kind(mode)}, not a regular file: refusing to read it")
    return path


def _open(path: str, **options) -> h5py.File:
    """An HDF5 file opened read-only after :func:`require_regular`, then checked by :func:`check_contained`."""
    require_regular(path)
    try:
        f = h5py.File(path, "r", **options)
    except OSError:
        raise InputError(f"{path}: not an HDF5 file") from None
    try:
        check_contained(f, path)
    except BaseException:
        f.close()
        raise
    return f


def _shown(raw: bytes) -> str:
    """A name read from a file, printable on one line (control characters escaped: no forged lines)."""
    text = raw.decode("utf-8", "replace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def check_contained(f: h5py.File, path: str) -> None:
    """Refuse an HDF5 file that reaches outside itself, in one line naming ``path`` and the object.

    Visits every link once (metadata only, low-level API): only hard links
    and soft links resolving inside the group that holds them pass; every
    dataset must keep its raw data in the file (no external storage, not
    virtual).  Cycles of hard links are visited once (by object address).
    """
    seen = set()

    def refuse(name, what):
        raise InputError(f"{path}: object '{name}' {what}: refusing a file that reaches outside itself")

    def resolves(target):
        try:
            h5py.h5o.open(f.id, target.encode())   # follows soft links all the way (metadata only)
            return True
        except Exception:                          # missing, a missing group on the way, a cycle of soft links
            return False

    def visit(gid, prefix):
        names = []
        gid.links.iterate(names.append)
        for raw in names:
            name = prefix + _shown(raw)
            info = gid.links.get_info(raw)
            if info.type == h5py.h5l.TYPE_SOFT:
                target = _shown(gid.links.get_val(raw))
                here = prefix.rstrip("/") or "/"
                resolved = posixpath.normpath(posixpath.join(here, target)).replace("//", "/")
                if here != "/" and not resolved.startswith(here + "/"):
                    refuse(name, f"is a soft link to '{target}', outside its group '{here}'")
                if resolved != "/" and not resolves(resolved):
                    refuse(name, f"is a soft link to '{target}', which leads to no object")
                continue                           # its target is visited where it lives
            if info.type != h5py.h5l.TYPE_HARD:
                shown = "a user-defined link"
                if info.type == h5py.h5l.TYPE_EXTERNAL:
                    shown = "an external link"
                    with contextlib.suppress(Exception):
                        target_file, target_obj = (_shown(v) for v in gid.links.get_val(raw))
                        shown += f" to {target_file}:{target_obj}"
                refuse(name, f"is {shown}")
            obj = h5py.h5o.open(gid, raw)
            address = h5py.h5o.get_info(obj).addr
            if address in seen:
                continue
            seen.add(address)
            if isinstance(obj, h5py.h5g.GroupID):
                visit(obj, name + "/")
            elif isinstance(obj, h5py.h5d.DatasetID):
                plist = obj.get_create_plist()
                if plist.get_layout() == h5py.h5d.VIRTUAL:
                    refuse(name, "is a virtual dataset (its data lives in other files)")
                if plist.get_external_count() > 0:
                    shown = _shown(plist.get_external(0)[0])
                    refuse(name, f"keeps its data in an external file ({shown})")

    visit(f.id, "/")


def check_input(path) -> None:
    """Refuse an HDF5 input that reaches outside itself (:func:`check_contained`) before any work starts.

    Not an HDF5 file, or not a regular file: nothing to do here (the reader
    refuses it).  Run by the output checks, so that no output can be a file an
    input links to: such an input is refused whatever the outputs are.
    """
    if is_hdf5(path):
        with _open(os.fspath(path)):
            pass


def open_read(path: str, expected_format: str, versions=(FORMAT_VERSION,), **options) -> h5py.File:
    """``path`` opened read-only: a regular file, kept inside itself, of ``expected_format`` and one of
    ``versions`` (a task file: 1, or 2 for the packed layout)."""
    path = os.fspath(path)
    f = _open(path, **options)
    fmt = f.attrs.get("format")
    if isinstance(fmt, bytes):
        fmt = fmt.decode("utf-8", "replace")
    if not isinstance(fmt, str) or fmt != expected_format:
        f.close()
        raise InputError(f"{path}: attribute 'format' is {fmt!r}, expected {expected_format!r}")
    # a number equal to FORMAT_VERSION; text ('one'), arrays and other versions are refused
    version = f.attrs.get("format_version")
    version = version.item() if isinstance(version, np.generic) else version
    if isinstance(version, bool) or not isinstance(version, (int, float)) or version not in versions:
        f.close()
        shown = "missing" if version is None else repr(version.tolist() if isinstance(version, np.ndarray) else version)
        readable = " or ".join(str(v) for v in versions)
        raise InputError(f"{path}: attribute 'format_version' is {shown}, this hpcmtl reads version {readable}")
    return f




class OpenFile:
    """An open HDF5 file that closes on ``close()`` or at the end of a ``with`` block."""

    def close(self):
        with contextlib.suppress(Exception):
            self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_array(group, name, data):
    """A dataset; large arrays are chunked by rows and gzip-1 compressed (readable by h5dump)."""
    data = np.asarray(data)
    if data.nbytes > (1 << 20):
        rows = max(1, (1 << 20) // max(1, data[:1].nbytes))
        chunks = (min(rows, data.shape[0]),) + data.shape[1:]
        return group.create_dataset(name, data=data, chunks=chunks, compression="gzip", compression_opts=1,
                                    shuffle=True)
    return group.create_dataset(name, data=data)


def duplicate_name(names):
    """(name, first index, second index) of the first repeated task name, or None."""
    seen = {}
    for i, name in enumerate(names):
        if name in seen:
            return name, seen[name], i
        seen[name] = i
    return None


def file_format(path) -> str | None:
    """The 'format' attribute of an HDF5 file (None if it has none); InputError if unreadable."""
    with _open(os.fspath(path)) as f:
        fmt = f.attrs.get("format")
    return fmt.decode() if isinstance(fmt, bytes) else fmt


def is_hdf5(path) -> bool:
    """Whether ``path`` is an HDF5 file (by its signature, not its name); never opens what is not a regular file."""
    path = os.fspath(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
    except OSError:
        return False
    return bool(h5py.is_hdf5(path))


def list_datasets(path) -> list:
    """Every dataset of an HDF5 file as ``{"name", "shape", "dtype"}`` (metadata only, no data read)."""
    found = []

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            found.append({"name": name, "shape": list(obj.shape), "dtype": str(obj.dtype)})

    with _open(os.fspath(path)) as f:
        f.visititems(visit)
    return found
