"""hpcmtl.params: one table of hyper-parameters serving the configs, the estimators and the command line."""
import ast
import pathlib

import numpy as np
import pytest

from hpcmtl import params
from hpcmtl.errors import InputError
from hpcmtl.params import PARAMS, validate

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("values, message", [
    (dict(lam=-1), "The 'lam' parameter of DMTRL must be > 0. Got -1 instead."),
    (dict(lam=float("nan")), "The 'lam' parameter of DMTRL must be > 0. Got nan instead."),
    (dict(lam=float("inf")), "The 'lam' parameter of DMTRL must be > 0. Got inf instead."),
    (dict(lam=True), "The 'lam' parameter of DMTRL must be > 0. Got True instead."),
    (dict(lam="1"), "The 'lam' parameter of DMTRL must be > 0. Got '1' instead."),
    (dict(eta=1.5), "The 'eta' parameter of DMTRL must be in (0, 1]. Got 1.5 instead."),
    (dict(outer_tol=-1), "The 'outer_tol' parameter of DMTRL must be >= 0. Got -1 instead."),
    (dict(max_rounds=0), "The 'max_rounds' parameter of DMTRL must be an integer >= 1. Got 0 instead."),
    (dict(max_rounds=5.0), "The 'max_rounds' parameter of DMTRL must be an integer >= 1. Got 5.0 instead."),
    (dict(seed=np.int64(-2)), "The 'seed' parameter of DMTRL must be an integer >= 0. Got -2 instead."),
    (dict(shrinking="yes"), "The 'shrinking' parameter of DMTRL must be True or False. Got 'yes' instead."),
    (dict(aggregation="sfe"), "The 'aggregation' parameter of DMTRL must be one of qp, adaptive, line, safe. "
                              "Got 'sfe' instead. Did you mean 'safe'?"),
    (dict(C=0), "The 'C' parameter of DMTRL must be > 0 or 'auto'. Got 0 instead."),
])
@pytest.mark.smoke
def test_one_message_style(values, message):
    with pytest.raises(InputError) as exc:
        validate(values, "DMTRL")
    assert str(exc.value) == message


def test_numpy_scalars_are_accepted_and_become_python_numbers():
    out = validate(dict(lam=np.float32(0.5), max_rounds=np.int64(7), eta=np.float64(1.0), shrinking=np.bool_(True),
                        C="auto", outer_tol=float("inf")), "DMTRL")
    assert out == dict(lam=0.5, max_rounds=7, eta=1.0, shrinking=True, C="auto", outer_tol=float("inf"))
    assert type(out["lam"]) is float and type(out["max_rounds"]) is int


def test_configs_and_estimators_read_the_table():
    from hpcmtl.dmtrl import DMTRLConfig
    from hpcmtl.estimators import DMTRL, GraphMTL, JointSparseMTL
    from hpcmtl.joint_sparse import JointSparseConfig
    config = DMTRLConfig(lam=np.float32(0.25), max_rounds=np.int64(3)).validate()
    assert (config.lam, config.max_rounds) == (0.25, 3) and type(config.max_rounds) is int
    with pytest.raises(InputError, match=r"^The 'gap_every' parameter of DMTRL must be an integer >= 1. Got True"):
        DMTRLConfig(gap_every=True).validate()
    with pytest.raises(InputError, match=r"^The 'eta0' parameter of JointSparseMTL must be > 0. Got 0 instead."):
        JointSparseConfig(eta0=0).validate()
    X, y = np.eye(4), np.array([1.0, -1.0, 1.0, -1.0])
    with pytest.raises(InputError, match=r"^The 'lam' parameter of DMTRL must be > 0. Got -1 instead."):
        DMTRL(lam=-1).fit(X, y)
    with pytest.raises(InputError, match=r"^The 'radius' parameter of JointSparseMTL must be > 0. Got -1.0 inst"):
        JointSparseMTL(radius=[1.0, -1.0]).fit(X, y)
    with pytest.raises(InputError, match=r"^The 'degree' parameter of GraphMTL must be an integer >= 0. Got 2.5"):
        GraphMTL(kernel="poly", degree=2.5).fit(X, y)


@pytest.mark.smoke
def test_the_table_knows_every_choice_the_methods_accept():
    """The choices the table offers are the ones the methods implement, where a method names them itself
    (dmtrl's RELATIONSHIPS / AGGREGATIONS / LOCAL_SOLVERS, online_rules.NORMS and the loss names are the
    table's own tuples, re-exported: nothing to compare there)."""
    from hpcmtl import joint_sparse, online_rules
    assert params.PROJECTIONS == tuple(joint_sparse.PROJECTIONS)        # the projection functions by name
    assert set(online_rules._UPDATE_IDS) == set(params.UPDATES)         # the kernel's update ids by name


def test_command_line_defaults_types_and_choices_come_from_the_table():
    from hpcmtl import methods
    own = {}
    for method in methods.TRAIN_METHODS:
        own.update(methods.train_options_of(method))
    written_here = {"--lam": None, "--max-rounds": None, "--radius": None, "--C": "1.0"}
    for flag, (_, kw) in own.items():
        name = flag.lstrip("-").replace("-", "_")
        if name not in PARAMS:
            continue
        param = PARAMS[name]
        if param.constraint is bool:
            assert kw["action"] == "store_true"
            continue
        assert kw.get("default") == written_here.get(flag, param.default), flag
        if isinstance(param.constraint, tuple) and flag != "--loss":
            assert kw["choices"] == param.constraint
    parse = params.argparse_type("lam", "--lam")
    assert parse("0.5") == 0.5
    with pytest.raises(Exception, match="--lam must be > 0, got -1"):
        parse("-1")


def test_estimators_run_on_cluster_serial_without_importing_mpi4py():
    """An estimator's fit runs on the serial backend: in a fresh interpreter, mpi4py is not imported after it."""
    import subprocess
    import sys
    from hpcmtl.cluster import Cluster
    cluster = Cluster.serial()
    assert (cluster.size, cluster.rank, cluster.is_server, cluster.my_worker) == (1, 0, True, 0)
    tree = ast.parse((ROOT / "hpcmtl" / "estimators.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "mpi4py" not in imported
    code = ("from hpcmtl import DMTRL; import numpy as np; rng = np.random.default_rng(0)\n"
            "Xs = [rng.normal(size=(30, 5)) for _ in range(3)]; ys = [np.sign(rng.normal(size=30)) for _ in range(3)]\n"
            "DMTRL(loss='hinge', lam=1e-2).fit(Xs, ys); import sys; print('mpi4py' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_no_module_imports_the_command_line():
    """Only ``python -m hpcmtl`` (``__main__``) imports hpcmtl.cli; demo reads evaluate_arrays from metrics."""
    for path in (ROOT / "hpcmtl").glob("*.py"):
        if path.name == "__main__.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                assert not (node.level == 1 and module.split(".")[0] == "cli"), path.name
                assert not (node.level == 0 and module.startswith("hpcmtl.cli")), path.name


@pytest.mark.smoke
def test_every_estimator_keeps_its_init_arguments_as_given():
    """scikit-learn's contract: __init__ stores each argument unchanged under its own name (clone relies on it)."""
    import inspect

    from sklearn.base import clone

    from hpcmtl import estimators
    for cls in (estimators.DMTRL, estimators.DMTRLCV, estimators.JointSparseMTL, estimators.GraphMTL,
                estimators.OnlineMultitask, estimators.OnlineECOC):
        names = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        given = {name: object() for name in names}          # sentinels: no validation, no copy in __init__
        est = cls(**given)
        assert all(getattr(est, name) is given[name] for name in names), cls.__name__
        assert set(est.get_params(deep=False)) == set(names)
        assert all(clone(cls(), safe=True).get_params()[n] == cls().get_params()[n] for n in names)


def test_the_engine_config_s_defaults_are_the_table_s():
    """DMTRLConfig (the Python API, the estimators' engine) and the command line share their defaults: a default
    changed in one place only (as --outer-tol once was) would make `train()` and `hpcmtl train` solve to
    different tolerances."""
    import dataclasses

    from hpcmtl.dmtrl import DMTRLConfig
    shared = [f for f in dataclasses.fields(DMTRLConfig) if f.name in PARAMS]
    assert len(shared) >= 15
    for field in shared:
        assert field.default == PARAMS[field.name].default, field.name
