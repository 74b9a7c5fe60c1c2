"""hpcmtl task datasets as input: relabel them, or write them as a stream; ``inspect`` of any HDF5 file."""
from __future__ import annotations

from . import FormatSpec, register_format
from .checks import check_tasks, locate_in
from .inspect import q
from .streams import one_stream, tasks_as_stream


def from_task_file(path, labels=None):
    """The tasks of an ``hpcmtl-tasks`` file (``hpcmtl data convert --format tasks``)."""
    from .. import store
    blocks, names, _ = store.read_all_tasks(path)
    Xs, ys = [b.X for b in blocks], [b.y for b in blocks]
    return Xs, check_tasks(Xs, ys, locate_in(path, names), labels), names


def inspect_hdf5(path, out):
    from .. import store
    with open(path, "rb") as f:
        if f.read(10) == b"MATLAB 7.3":
            out["format"] = "MATLAB v7.3 .mat (HDF5)"
            out["layout"] = "scipy reads MATLAB files up to v7: save it with save(..., '-v7') to convert it"
            return
    fmt = store.file_format(path)
    if fmt == store.TASKS_FORMAT:
        with store.TaskFile(path) as tf:
            info = tf.info()
        out["format"] = f"hpcmtl task dataset ({info['storage']}{', float32' if info['dtype'] == 'float32' else ''})"
        out["variables"] = [{"name": t["name"], "shape": [t["n_samples"], info["n_features"]], "dtype": "task",
                             "first": [f"nnz {t['nnz']}"]} for t in info["tasks"]]
        out["layout"] = f"{info['n_tasks']} tasks, {info['n_features']} features: ready for hpcmtl train"
        out["commands"] = [f"hpcmtl data info {q(path)}",
                           f"hpcmtl data convert --format tasks {q(path)} OUT-stream.h5 --stream --shuffle"]
        return
    if fmt == store.STREAM_FORMAT:
        with store.StreamFile(path) as sf:
            info = sf.info()
        out["format"] = "hpcmtl stream"
        out["variables"] = [{"name": t["name"], "shape": [info["n_rounds"]], "dtype": "label",
                             "first": [f"+1 {t['positive']}", f"-1 {t['negative']}", f"dormant {t['dormant']}"]}
                            for t in info["labels"]]
        out["layout"] = (f"{info['n_rounds']} rounds, {info['n_features']} features, {info['n_labels']} labels: "
                         "ready for hpcmtl train online --stream")
        out["commands"] = [f"hpcmtl data info {q(path)}"]
        return
    out["format"] = "HDF5" + (f" (format {fmt!r})" if fmt else "")
    out["variables"] = store.list_datasets(path)
    out["layout"] = ("an hpcmtl result or checkpoint: see hpcmtl report / evaluate" if fmt else
                     "not an hpcmtl file: save its arrays with numpy.savez or scipy.io.savemat to convert them")



def _sniff(path, head):
    from .. import store
    return 5 if store.is_hdf5(path) else None


register_format(FormatSpec(
    name="tasks",
    read=lambda inputs, options, labels, report, test=False: (from_task_file(inputs[0], labels), None),
    stream=one_stream(lambda inputs, options, labels, report: tasks_as_stream(*from_task_file(inputs[0], labels))),
    one_input=True, sniff=_sniff, kind="hdf5", inspect=inspect_hdf5,
    help="an hpcmtl task dataset (to relabel it, or with --stream)"))
