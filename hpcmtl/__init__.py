"""hpcmtl: MPI-native multi-task learning (DMTRL and friends) for HPC clusters."""
__version__ = "0.1.0"

from .errors import InputError

__all__ = ["DMTRL", "DMTRLCV", "JointSparseMTL", "GraphMTL", "MemoryTasks", "OnlineMultitask", "OnlineECOC", "InputError",
           "__version__"]


def __getattr__(name):
    # estimators import scikit-learn; load them only when asked for
    if name in ("DMTRL", "DMTRLCV", "JointSparseMTL", "GraphMTL", "MemoryTasks", "OnlineMultitask", "OnlineECOC"):
        from . import estimators
        return getattr(estimators, name)
    raise AttributeError(f"module 'hpcmtl' has no attribute {name!r}")
