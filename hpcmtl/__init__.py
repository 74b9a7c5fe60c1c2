"""hpcmtl: MPI-native multi-task learning (DMTRL and friends) for HPC clusters."""
__version__ = "0.1.0"

from .errors import InputError

__all__ = ["DMTRL", "DMTRLCV", "JointSparseMTL", "GraphMTL", "MemoryTasks", "OnlineMultitask", "OnlineECOC", "InputError",
           "load_tasks", "load_stream", "__version__"]


def load_tasks(path):
    """Read a task dataset (``hpcmtl-tasks`` HDF5) for the estimators: ``(Xs, ys, names)``.

    ``Xs[i]``: task i's n_i x d rows (NumPy array, or SciPy CSR for a CSR file),
    ``ys[i]``: its n_i labels, ``names[i]``: its name; ``DMTRL().fit(Xs, ys)``.
    Any file ``hpcmtl data convert`` wrote.  A stream, or a file that is not a task
    dataset, raises :class:`InputError` naming the file (and the reader to use).
    """
    from .store import load_tasks as read
    return read(path)


def load_stream(path):
    """Read an online stream (``hpcmtl-stream`` HDF5): ``(X, Y, label_names)``, T x d CSR, T x k in -1/0/+1.

    ``OnlineMultitask().fit(X, Y)`` takes it as it is.
    """
    from .store import load_stream as read
    return read(path)


def __getattr__(name):
    # estimators import scikit-learn; load them only when asked for
    if name in ("DMTRL", "DMTRLCV", "JointSparseMTL", "GraphMTL", "MemoryTasks", "OnlineMultitask", "OnlineECOC"):
        from . import estimators
        return getattr(estimators, name)
    raise AttributeError(f"module 'hpcmtl' has no attribute {name!r}")
