"""The package's layering, checked mechanically on the source (docs/architecture.md draws the same map).

* mpi4py is imported only in ``cluster`` (its MPI backend, ``cluster/mpi.py``) and h5py only in the
  ``store/`` package;
* every module of ``hpcmtl`` has a layer in :data:`LAYERS`, and imports only
  modules of its own layer or below (a new module must be placed here first);
* the import graph has no cycle (within a layer too).

Imports are read with :mod:`ast`, including the ones inside functions, so a
lazy import cannot hide a dependency.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "hpcmtl"

# lowest first; a module may import its own layer and the layers before it
LAYERS = [
    # arithmetic and plain values: no MPI, no HDF5, no algorithm
    ("foundations", {"errors", "_rows", "_sdca", "_joint_terms", "_blockops", "_projections", "_box_qp", "_online",
                     "features", "progress", "memory"}),
    ("math", {"losses", "projection", "taskdata", "taskspace", "metrics", "params", "synthetic", "task_graph",
              "online_rules", "output_codes", "stream_scaling", "interior", "covariance"}),
    # the only modules that talk to MPI and to HDF5
    ("io", {"cluster", "store"}),
    ("files", {"checkpoint", "formats", "results"}),
    ("engine", {"engine"}),
    ("methods", {"dmtrl", "joint_sparse", "online", "baselines", "model_selection"}),
    # methods: the method table of `hpcmtl train` (imports every method module, above them)
    ("front ends", {"estimators", "jobs", "demo", "methods"}),
    ("command line", {"cli", "__main__", "__init__"}),
]
LAYER_OF = {name: k for k, (_, names) in enumerate(LAYERS) for name in names}
ONLY_IN = {"mpi4py": "cluster", "h5py": "store"}


def module_name(path: pathlib.Path) -> str:
    """The first component below hpcmtl/ (a subpackage counts as one module) or the file's stem."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def sources():
    return sorted(p for p in PACKAGE.rglob("*.py") if "build" not in p.relative_to(PACKAGE).parts)


def imports_of(path: pathlib.Path):
    """(kind, name, line): kind 'hpcmtl' for a package module, 'external' for a top-level third-party package."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel = path.relative_to(PACKAGE)
    depth = len(rel.parts) - 1            # 0 for hpcmtl/x.py, 1 for hpcmtl/cli/x.py
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "hpcmtl":
                    if len(parts) > 1:
                        yield "hpcmtl", parts[1], node.lineno
                else:
                    yield "external", parts[0], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] != "hpcmtl":
                    yield "external", parts[0], node.lineno
                    continue
                rest = parts[1:]
            else:
                up = node.level - 1           # levels above the file's own package
                if up > depth:
                    raise AssertionError(f"{rel}:{node.lineno}: relative import leaves the package")
                base = list(rel.parts[:-1])[:len(rel.parts) - 1 - up]
                rest = base + (node.module.split(".") if node.module else [])
            if rest:
                yield "hpcmtl", rest[0], node.lineno
            else:                              # from . import a, b
                for alias in node.names:
                    yield "hpcmtl", alias.name, node.lineno


def graph():
    edges = {}
    for path in sources():
        me = module_name(path)
        for kind, name, line in imports_of(path):
            if kind == "hpcmtl" and name != me:
                edges.setdefault(me, {}).setdefault(name, f"{path.relative_to(PACKAGE.parent)}:{line}")
    return edges


def test_mpi_and_hdf5_each_imported_in_one_module():
    wrong = []
    for path in sources():
        me = module_name(path)
        for kind, name, line in imports_of(path):
            if kind == "external" and name in ONLY_IN and ONLY_IN[name] != me:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name} "
                             f"(only {ONLY_IN[name]} may)")
    assert not wrong, "\n".join(wrong)


def test_within_cluster_only_the_mpi_backend_imports_mpi4py():
    """The serial backend (what the estimators and every in-process run use) must run without mpi4py: inside
    cluster/, only mpi.py imports it."""
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sources()
             if module_name(path) == "cluster" and path.name != "mpi.py"
             for kind, name, line in imports_of(path) if kind == "external" and name == "mpi4py"]
    assert (PACKAGE / "cluster" / "mpi.py").exists()
    assert not wrong, f"only hpcmtl/cluster/mpi.py may import mpi4py: {wrong}"


def test_every_module_has_a_layer():
    names = {module_name(p) for p in sources()}
    names |= {p.name.split(".")[0] for p in PACKAGE.glob("*.pyx")}
    missing = sorted(names - set(LAYER_OF))
    assert not missing, f"place these modules in tests/test_layering.py LAYERS (and docs/architecture.md): {missing}"


@pytest.mark.smoke
def test_no_module_imports_a_module_above_it():
    wrong = []
    for me, targets in sorted(graph().items()):
        for name, where in sorted(targets.items()):
            if name not in LAYER_OF or me not in LAYER_OF:
                continue                       # reported by test_every_module_has_a_layer
            if LAYER_OF[name] > LAYER_OF[me]:
                wrong.append(f"{where}: {me} ({LAYERS[LAYER_OF[me]][0]}) imports {name} "
                             f"({LAYERS[LAYER_OF[name]][0]}), a layer above it")
    assert not wrong, "\n".join(wrong)


@pytest.mark.smoke
def test_import_graph_has_no_cycle():
    edges = graph()
    state = {}
    stack = []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle) + " (at " + edges[node][nxt] + ")")
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)


# the compiled kernels (hpcmtl/*.pyx, *.pxd) are leaves, one concern a module: each may use these and nothing else
KERNEL_IMPORTS = {"cython", "libc.math", "libc.stdint", "libc.stdlib", "libc.string", "numpy", "enum", "hpcmtl._rows",
                  "hpcmtl._random", "hpcmtl._losses"}
KERNEL_ONLY_IN = {"scipy.linalg.cython_lapack": "_box_qp"}      # LAPACK: the server's box QP only


def test_each_compiled_kernel_imports_only_the_row_interface_the_random_numbers_and_c():
    """No kernel module imports another (they share only the inline ``_rows.pxd``, ``_random.pxd`` and
    ``_losses.pxd``), and SciPy's LAPACK stays in ``_box_qp``, so SDCA, the projections and the box QP build
    and change apart."""
    import re
    wrong, seen = [], set()
    for path in sorted(PACKAGE.glob("*.pyx")) + sorted(PACKAGE.glob("*.pxd")):
        me = path.name.split(".")[0]
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = re.match(r"(?:from\s+(\S+)\s+c?import\b|c?import\s+([\w.]+))", line)
            if not m:
                continue
            name = m.group(1) or m.group(2)
            seen.add(name)
            if name in KERNEL_ONLY_IN and KERNEL_ONLY_IN[name] == me or name in KERNEL_IMPORTS:
                continue
            wrong.append(f"{path.relative_to(PACKAGE.parent)}:{n} imports {name}")
    assert not wrong, "\n".join(wrong)
    assert {"hpcmtl._rows", "hpcmtl._random", "hpcmtl._losses", "scipy.linalg.cython_lapack"} <= seen  # read them


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """The reader itself: imports inside functions and both relative forms are found."""
    pkg = tmp_path / "hpcmtl"
    (pkg / "sub").mkdir(parents=True)
    f = pkg / "sub" / "x.py"
    f.write_text("def f():\n    import h5py\n    from ..store import a\n    from . import y\n    from .. import cluster\n")
    global PACKAGE
    saved = PACKAGE
    PACKAGE = pkg
    try:
        found = sorted((k, n) for k, n, _ in imports_of(f))
    finally:
        PACKAGE = saved
    assert found == [("external", "h5py"), ("hpcmtl", "cluster"), ("hpcmtl", "store"), ("hpcmtl", "sub")]


def test_a_training_job_starts_without_importing_scikit_learn():
    """scikit-learn takes seconds to import, and every rank of every job would pay it at start-up (2.4 s -> 1.0 s
    for a small `train stl`): the modules a job runs import it only inside the functions that need it
    (random features, graph kernels, formats, metrics); the estimators are loaded on demand."""
    import subprocess
    import sys
    code = ("import sys\n"
            "import hpcmtl.cli.train, hpcmtl.cli.data, hpcmtl.cli.evaluate, hpcmtl.dmtrl, hpcmtl.joint_sparse, "
            "hpcmtl.online, hpcmtl.model_selection, hpcmtl.baselines, hpcmtl.task_graph, hpcmtl.features\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# inside store/: hdf5 (opening, checking files), the other shared helpers, one module a file kind,
# then __init__ (it only re-exports)
STORE_LAYERS = [{"hdf5"}, {"atomic", "fingerprints", "packed"}, {"tasks", "results", "checkpoints", "streams"},
                {"__init__"}]


def store_imports(node):
    """The store module an ``import`` statement names (``"__init__"`` for the package itself), or None."""
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if node.level == 1:                               # from .tasks import x; from . import tasks
            return module.split(".")[0] if module else node.names[0].name
        if (node.level, module) in ((2, ""), (0, "hpcmtl")):     # from .. import store; from hpcmtl import store
            return "__init__" if any(alias.name == "store" for alias in node.names) else None
        parts = (["hpcmtl"] if node.level == 2 else []) + module.split(".")
    elif isinstance(node, ast.Import):
        parts = next((a.name.split(".") for a in node.names if a.name.split(".")[:2] == ["hpcmtl", "store"]), [])
    else:
        return None
    if parts[:2] != ["hpcmtl", "store"]:
        return None
    return parts[2] if len(parts) > 2 else "__init__"


def test_store_modules_import_only_the_store_modules_below_them():
    """A file kind's module may use the shared helpers but not another file kind, and no module imports
    the package itself, so ``hpcmtl.store`` has no import cycle inside."""
    level = {name: k for k, names in enumerate(STORE_LAYERS) for name in names}
    wrong = []
    for path in sorted((PACKAGE / "store").glob("*.py")):
        assert path.stem in level, f"place store/{path.name} in STORE_LAYERS (tests/test_layering.py)"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            target = store_imports(node)
            if target is not None and level.get(target, len(STORE_LAYERS)) >= level[path.stem]:
                wrong.append(f"store/{path.name}:{node.lineno} imports store.{target}, not a layer below it")
    assert not wrong, "\n".join(wrong)


# hpcmtl/dmtrl/: the cores (worker, server, the package's __init__) plug the features in; a feature imports only
# the pieces below it, never a core or another feature, and the pieces import no feature
DMTRL_PIECES = {"commands", "config", "sigma", "steps", "qp_precond", "outer", "dual_phase",
                "spectral_phase"}   # dual_phase, spectral_phase: the joint outer step's hinge part
DMTRL_FEATURES = {"supports", "momentum", "local_rounds", "interior_rounds", "margin", "joint", "batched", "spread",
                  "spread_precond"}
DMTRL_CORES = {"worker", "server", "__init__"}


def dmtrl_imports(path):
    """The modules of hpcmtl/dmtrl/ that ``path`` (a file in it) imports, as (name, line)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                yield node.module.split(".")[0], node.lineno
            else:
                for alias in node.names:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hpcmtl.dmtrl."):
            yield node.module.split(".")[2], node.lineno


def test_dmtrl_features_plug_into_the_cores():
    folder = PACKAGE / "dmtrl"
    names = {p.stem for p in folder.glob("*.py")}
    assert names == DMTRL_PIECES | DMTRL_FEATURES | DMTRL_CORES, "place new dmtrl modules in the sets above"
    wrong = []
    for path in sorted(folder.glob("*.py")):
        me = path.stem
        allowed = (DMTRL_PIECES if me in DMTRL_PIECES | DMTRL_FEATURES else names) - {me}
        for name, line in dmtrl_imports(path):
            if name not in allowed:
                wrong.append(f"hpcmtl/dmtrl/{me}.py:{line} imports {name}")
    assert not wrong, "\n".join(wrong)


# hpcmtl/model_selection/: the split, then the one driver, then the searches that plug into it (lam, radius), then
# __init__ (it only re-exports); a search never imports another search
SELECTION_LAYERS = [{"split"}, {"driver"}, {"lam", "radius"}, {"__init__"}]


def test_selection_searches_plug_into_one_driver():
    level = {name: k for k, names in enumerate(SELECTION_LAYERS) for name in names}
    folder = PACKAGE / "model_selection"
    wrong = []
    for path in sorted(folder.glob("*.py")):
        assert path.stem in level, f"place model_selection/{path.name} in SELECTION_LAYERS (tests/test_layering.py)"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
                for name in names:
                    if level.get(name, len(SELECTION_LAYERS)) >= level[path.stem]:
                        wrong.append(f"model_selection/{path.name}:{node.lineno} imports {name}, not a layer below")
    assert not wrong, "\n".join(wrong)


def test_every_train_method_has_one_row_in_the_method_table():
    """`hpcmtl train METHOD` is a lookup: the table's names are the command line's, in its order."""
    from hpcmtl import methods
    assert tuple(methods.METHODS) == tuple(methods.METHOD_HELP) == methods.TRAIN_METHODS
    for name, row in methods.METHODS.items():
        assert row.name == name and callable(row.train) and callable(row.write)
        assert (row.selection is not None) == (name in methods.SDCA_METHODS + ("l1inf",))
        assert methods.train_options_of(name), name          # every method takes options of the table
