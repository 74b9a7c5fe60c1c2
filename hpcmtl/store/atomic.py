"""Atomic writes: an output file appears under its name complete, or not at all.

Every file is written under a temporary name in the target directory and
renamed into place only when complete, so a killed writer never leaves a
half-written file under the final name.  HDF5 writes through a guarded raw
file (h5py's ``fileobj`` driver): the first operating-system error (disk full,
quota, file size limit) is kept and later writes are dropped, so the HDF5
library never sees a failed write (it used to crash there); the error then
ends the write with one line, ``cannot write checkpoint PATH: no space left on
device``, the temporary removed and the previous file untouched.  A temporary
orphaned by a killed writer is removed by the next write to the same path
(a live writer holds a lock on its temporary, so it is never taken).

Before any work, :func:`check_outputs` refuses an output that would overwrite
an input (like ``cp a a``) or another output, and :func:`check_writable` one
that cannot be written.  Only regular files are ever replaced
(:func:`output_target`): an existing output that is a FIFO, a socket, a device
or a directory is refused, with or without ``--force``, since renaming a
temporary onto it would replace a device node (as root: ``/dev/null``) or
leave a pipe's reader waiting; a symbolic link is written through to the
regular file it names, which keeps the link, and a dangling link is refused.

One live writer an output: :func:`output_locks` holds an exclusive ``flock``
on ``.NAME.lock`` beside each output (the commands for their whole run, the
writers here for the write), so a second job on the same output is refused
with one line instead of racing the first; a temporary stays locked until
after its rename, so no other job's cleanup takes it for an orphan.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import re
import stat
import tempfile

import h5py

from ..errors import InputError
from .hdf5 import check_input


class WriteError(InputError):
    """An output file could not be written (disk full, quota, permissions): one line, exit 2."""


def write_error(what: str, path, exc: OSError) -> WriteError:
    """``cannot write checkpoint PATH: no space left on device`` (the reason as the OS gives it)."""
    reason = exc.strerror or (errno.errorcode.get(exc.errno, "") if exc.errno else "") or str(exc)
    return WriteError(f"cannot write {what} {os.fspath(path)}: {reason[:1].lower() + reason[1:]}")


class _GuardedFile(io.RawIOBase):
    """The raw file under h5py's ``fileobj`` driver while a temporary is written.

    The first ``OSError`` of a write, truncate or sync is kept in ``error`` and
    every later write is dropped (reported as done), so the HDF5 library never
    sees a failed write -- on a full disk it used to crash in its cleanup.
    The writer holds an exclusive ``flock`` on the file while it lives, which
    tells :func:`remove_stale_temporaries` the temporary is not an orphan.
    """

    def __init__(self, fd: int):
        super().__init__()
        self.fd = fd
        self.pos = 0
        self.error: OSError | None = None
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def readable(self):
        return True

    def writable(self):
        return True

    def seekable(self):
        return True

    def seek(self, pos, whence=0):
        if whence == os.SEEK_SET:
            self.pos = pos
        elif whence == os.SEEK_CUR:
            self.pos += pos
        else:
            self.pos = os.fstat(self.fd).st_size + pos
        return self.pos

    def tell(self):
        return self.pos

    def readinto(self, buffer):
        view = memoryview(buffer).cast("B")
        data = os.pread(self.fd, len(view), self.pos)
        if self.error is not None and len(data) < len(view):
            data += bytes(len(view) - len(data))     # past a failed write: zeros, never a short read
        view[:len(data)] = data
        self.pos += len(data)
        return len(data)

    def write(self, buffer):
        view = memoryview(buffer).cast("B")
        if self.error is None:
            try:
                done = 0
                while done < len(view):
                    done += os.pwrite(self.fd, view[done:], self.pos + done)
            except OSError as exc:
                self.error = exc
        self.pos += len(view)
        return len(view)

    def truncate(self, size=None):
        size = self.pos if size is None else size
        if self.error is None:
            try:
                os.ftruncate(self.fd, size)
            except OSError as exc:
                self.error = exc
        return size

    def flush(self):
        pass

    def sync(self):
        """fsync: a network file system may report a full disk only here."""
        if self.error is None:
            try:
                os.fsync(self.fd)
            except OSError as exc:
                self.error = exc

    def close(self):
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            try:
                os.close(fd)
            except OSError as exc:
                self.error = self.error or exc
        super().close()


def _temporary_pattern(path: str):
    """Names of the temporaries of ``path``: ``.NAME.XXXXXXXX.tmp`` (mkstemp's 8 random characters)."""
    return re.compile(r"\." + re.escape(os.path.basename(path)) + r"\.[A-Za-z0-9_]{8}\.tmp")


def remove_stale_temporaries(path) -> list:
    """Remove temporaries of ``path`` left by killed writers; return their names.

    A temporary whose writer still runs is locked (``flock``) and kept.  Where
    the file system has no locks nothing is removed.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    pattern = _temporary_pattern(path)
    removed = []
    try:
        names = [n for n in os.listdir(directory) if pattern.fullmatch(n)]
    except OSError:
        return removed
    for name in names:
        full = os.path.join(directory, name)
        try:
            fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)    # fails while its writer lives
            if not _same_inode(fd, full):                      # renamed into place meanwhile: not ours to remove
                continue
            os.unlink(full)
            removed.append(name)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def _same_inode(fd: int, path: str) -> bool:
    """Whether the open file ``fd`` is still the file named ``path``."""
    try:
        a, b = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def lock_path(path) -> str:
    """The lock file of an output: ``.NAME.lock`` beside the file that writing ``path`` replaces."""
    target = output_target(path)
    directory = os.path.realpath(os.path.dirname(os.path.abspath(target)))
    return os.path.join(directory, "." + os.path.basename(target) + ".lock")


_HELD: dict = {}      # lock file -> [fd, holders]: the output locks this process holds


def _acquire(lock: str, path: str) -> None:
    if lock in _HELD:
        _HELD[lock][1] += 1
        return
    for _ in range(100):        # the holder removes the file as it lets go: lock the file the name now holds
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                         0o666)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise InputError(f"{path}: cannot write output: cannot create its lock file {lock} "
                             f"({reason[:1].lower() + reason[1:]})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InputError(f"{path}: another hpcmtl job is writing this output (it holds {lock}): "
                             f"refusing to start a second writer") from None
        except OSError:          # no locks on this file system: nothing to hold
            os.close(fd)
            return
        if _same_inode(fd, lock):
            _HELD[lock] = [fd, 1]
            return
        os.close(fd)
    raise InputError(f"{path}: cannot lock the output ({lock} keeps changing)")


def _release(lock: str) -> None:
    held = _HELD.get(lock)
    if held is None:
        return
    held[1] -= 1
    if held[1] == 0:
        del _HELD[lock]
        with contextlib.suppress(OSError):
            os.unlink(lock)             # while still locked: a waiting job then locks a fresh file
        os.close(held[0])


@contextlib.contextmanager
def output_locks(paths):
    """Hold the lock of every output in ``paths`` (None skipped) for the ``with`` block: one writer an output.

    Each output's lock is an exclusive ``flock`` on ``.NAME.lock`` beside it,
    taken without waiting: an output another live process holds is refused
    with a one-line :class:`InputError`.  The file is removed when the lock
    is let go; one left by a killed job holds no lock (``flock`` locks die
    with their process), so it never blocks a later job.  Re-entrant within
    a process; where the file system has no locks, nothing is held.
    """
    taken = []
    try:
        for path in paths:
            if path is None:
                continue
            lock = lock_path(path)
            _acquire(lock, os.fspath(path))
            taken.append(lock)
        yield
    finally:
        for lock in reversed(taken):
            _release(lock)


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))
TEMPORARY_EXTRA = len(".") + len(".XXXXXXXX.tmp")   # a temporary's name: ".NAME.XXXXXXXX.tmp"


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def output_target(path) -> str:
    """The file that writing an output at ``path`` replaces: ``path``, or the regular file its link names.

    ``path`` may not exist yet (it is returned as is).  An existing path that
    is not a regular file, or a symbolic link to anything but an existing
    regular file, is refused with a one-line :class:`InputError`; nothing is
    touched.  Writers rename their temporary onto the returned path, so a
    link stays a link.
    """
    path = os.fspath(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise InputError(f"{path}: cannot use as an output: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return path
    if not stat.S_ISLNK(mode):
        raise InputError(f"{path}: output exists and is not a regular file ({_kind(mode)}): refusing to replace it")
    target = os.path.realpath(path)
    try:
        mode = os.stat(target).st_mode
    except OSError:
        raise InputError(f"{path}: output is a symbolic link to a missing file ({target}): "
                         f"refusing to write through it") from None
    if not stat.S_ISREG(mode):
        raise InputError(f"{path}: output is a symbolic link to {target}, which is not a regular file "
                         f"({_kind(mode)}): refusing to replace it")
    return target


def _new_temporary(path: str, what: str):
    """``(fd, name)`` of a new temporary file beside ``path`` (after removing those of killed writers)."""
    directory = os.path.dirname(os.path.abspath(path))
    remove_stale_temporaries(path)
    try:
        return tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise write_error(what, path, exc) from None


def _finished_mode() -> int:
    """The permission bits of a finished output: 0666 under the process umask (mkstemp creates 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_h5(path: str, force: bool = True, what: str = "output file"):
    """Open a temporary HDF5 file beside ``path``; rename it into place on success.

    On any exception the temporary file is removed and ``path`` is untouched.
    An operating-system error while writing (disk full, quota, file size
    limit) raises :class:`WriteError` naming ``what`` and ``path``.
    """
    path = os.fspath(path)
    check_writable(path, force)
    with output_locks([path]):
        target = output_target(path)
        fd, tmp = _new_temporary(target, what)
        raw = _GuardedFile(fd)
        keep = -1                  # a second descriptor of the temporary: its lock lasts until after the rename
        try:
            with h5py.File(raw, "w") as f:
                yield f
            raw.sync()
            with contextlib.suppress(OSError):
                os.fchmod(raw.fd, _finished_mode())     # mkstemp creates 0600; finished files follow the umask
            keep = os.dup(raw.fd)
            raw.close()
            if raw.error is not None:
                raise write_error(what, path, raw.error)
            if output_target(path) != target:          # changed while we wrote (a link re-pointed, a FIFO made)
                raise InputError(f"{path}: output changed while it was written: refusing to replace it")
            try:
                os.replace(tmp, target)
            except OSError as exc:
                raise write_error(what, path, exc) from None
        except BaseException as exc:
            raw.close()
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if raw.error is not None and isinstance(exc, Exception) and not isinstance(exc, WriteError):
                raise write_error(what, path, raw.error) from None     # the failed write is the cause
            raise
        finally:
            if keep >= 0:
                os.close(keep)


@contextlib.contextmanager
def atomic_output(path, what: str = "output file"):
    """A temporary path beside ``path`` for any writer (figures, CSV); renamed into place on success.

    Same rules as :func:`atomic_h5`: temporaries of killed writers are removed
    first, the temporary is locked while written, an ``OSError`` becomes a
    one-line :class:`WriteError` and nothing is left under either name.
    """
    path = os.fspath(path)
    with output_locks([path]):
        target = output_target(path)
        fd, tmp = _new_temporary(target, what)
        lock = _GuardedFile(fd)                 # holds the lock; the writer opens the path itself
        try:
            yield tmp
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.chmod(tmp, _finished_mode())
            if output_target(path) != target:
                raise InputError(f"{path}: output changed while it was written: refusing to replace it")
            os.replace(tmp, target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise write_error(what, path, exc) from None
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        finally:
            lock.close()                        # after the rename: never taken for an orphan before it


def check_writable(path: str, force: bool) -> None:
    """Refuse an output path early (before any work): a directory, not a regular file (:func:`output_target`),
    exists without force, a name too long for its temporary, or unwritable."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected the name of an output file")
    target = output_target(path)
    if os.path.lexists(path) and not force:
        raise InputError(f"{path}: output file exists (use --force to overwrite)")
    directory = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(directory):
        raise InputError(f"{path}: cannot write output: directory {directory} does not exist")
    if not os.access(directory, os.W_OK):
        raise InputError(f"{path}: cannot write output: directory {directory} is not writable")
    try:
        name_max = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    name = os.path.basename(target)
    if len(os.fsencode(name)) + TEMPORARY_EXTRA > name_max:   # found now, not when the finished work is written
        raise InputError(f"{path}: cannot write output: the name is too long ({len(os.fsencode(name))} bytes; "
                         f"at most {name_max - TEMPORARY_EXTRA} leave room for its temporary's name)")
    try:                  # root passes os.access everywhere: try for real (an unnamed file where supported)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise InputError(f"{path}: cannot write output: cannot create a file in {directory} "
                         f"({reason[:1].lower() + reason[1:]})") from None


def same_file(a, b) -> str | None:
    """How two paths name one file (None if they do not): same resolved path, or same (device, inode)."""
    a, b = os.fspath(a), os.fspath(b)
    if os.path.realpath(a) == os.path.realpath(b):
        if os.path.abspath(a) == os.path.abspath(b):
            return "same path"
        return "through a symbolic link" if os.path.islink(a) or os.path.islink(b) else "same resolved path"
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return None
    if (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino):
        return "a hard link"
    return None


def check_outputs(outputs, inputs=()) -> None:
    """Refuse, before any work, outputs that would destroy an input or each other.

    ``outputs``: ``(label, path, force)``; ``inputs``: ``(label, path)``
    (None paths are skipped).  Like ``cp a a``, an output that resolves to an
    input (same path, a symbolic link, a hard link) is refused whether or not
    ``force`` is given, and so is an HDF5 input that links to or stores its
    data in another file (:func:`~hpcmtl.store.hdf5.check_input`: an output
    could be that file); then each output must be a writable file name
    (:func:`check_writable`).  One-line :class:`InputError` naming both paths.
    """
    outputs = [(label, os.fspath(p), force) for label, p, force in outputs if p is not None]
    inputs = [(label, os.fspath(p)) for label, p in inputs if p is not None]
    for _, in_path in inputs:       # an HDF5 input linking to another file is refused: no output is a link target
        check_input(in_path)
    for k, (label, path, _) in enumerate(outputs):
        for in_label, in_path in inputs:
            how = same_file(path, in_path)
            if how:
                detail = "" if how == "same path" else f" ({how})"
                raise InputError(f"{label} {path} is the same file as {in_label} {in_path}{detail}: "
                                 f"refusing to overwrite an input")
        for other_label, other, _ in outputs[:k]:
            how = same_file(path, other)
            if how:
                detail = "" if how == "same path" else f" ({how})"
                raise InputError(f"{label} {path} is the same file as {other_label} {other}{detail}: "
                                 f"two outputs cannot share a file")
    for label, path, force in outputs:
        check_writable(path, force)
