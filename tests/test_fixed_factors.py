"""A fixed Sigma held as factors (issue 35 item 1, docs/many-tasks.md): ``train fixed --sigma RESULT.h5`` of a
learned result of many tasks keeps :class:`hpcmtl.covariance.SigmaFactors` from
``dmtrl.sigma.FACTORED_MIN_TASKS`` tasks on, against the dense fixed path on the same matrix."""
import os
import subprocess
import sys

import numpy as np
import pytest
from numpy.testing import assert_allclose

from hpcmtl import covariance, store
from hpcmtl.cluster import Cluster
from hpcmtl.dmtrl import DMTRLConfig, check_sigma, train
from hpcmtl.dmtrl import sigma as sigma_rules
from hpcmtl.dmtrl.sigma import SigmaFactors, omega_factors
from hpcmtl.errors import InputError
from hpcmtl.estimators import MemoryTasks

from conftest import assert_fits_agree, random_tasks, run_hpcmtl

LOSSES = ["hinge", "smoothed-hinge", "squared", "logistic"]


def learned_like(m, r, seed, floor=1e-3):
    """The factors a learned Sigma of rank r over m tasks has (a thin SVD of W^T: omega_factors)."""
    rng = np.random.default_rng(seed)
    return omega_factors(rng.normal(size=(m, r)) @ rng.normal(size=(r, r + 2)), floor)


def tasks(m, d, seed, sparse=False, loss="squared"):
    rng = np.random.default_rng(seed)
    sizes = tuple(int(s) for s in rng.integers(6, 12, m))
    return random_tasks(seed=seed, m=m, d=d, sizes=sizes, sparse=sparse, loss=loss)


def fit(Xs, ys, sigma, factored, monkeypatch, **kw):
    monkeypatch.setattr(sigma_rules, "FACTORED_MIN_TASKS", 0 if factored else 10 ** 9)
    config = DMTRLConfig(relationship="fixed", fit_intercept=False, **kw)
    return train(Cluster.serial(), MemoryTasks(Xs, ys), config, sigma_fixed=sigma, warn=lambda msg: None)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("m,d,sparse", [(6, 12, False), (14, 4, False), (14, 6, True), (40, 30, False)])
def test_factored_and_dense_fixed_paths_train_the_same_model(loss, m, d, sparse, monkeypatch):
    """The same factors given as a fixed Sigma: below the threshold (forced high) they become the dense matrix and
    the dense arithmetic of before, above it (forced to 0) they stay factors; the same rounds, W and gap history
    to 1e-10 (m < d and m > d, dense and CSR rows; 40 x 30: d m above interior.MAX_WIDTH, no interior-point
    rounds: the box losses' step QPs are the factors' projected Newton-CG against the dense active-set method,
    whose answers part at the Newton-CG's tolerance, as a learned Sigma's and a graph kernel's do: there both are
    certified and W lies within what the two certificates allow)."""
    Xs, ys = tasks(m, d, 5 * m + d, sparse, loss)
    F = learned_like(m, min(m, d) // 2 + 1, m + d)
    kw = dict(loss=loss, lam=0.05, tol=1e-8, max_rounds=3000)
    a = fit(Xs, ys, F, False, monkeypatch, **kw)
    b = fit(Xs, ys, F, True, monkeypatch, **kw)
    assert isinstance(a.Sigma, np.ndarray) and isinstance(b.Sigma, SigmaFactors)
    assert a.converged and b.converged
    for x, y in zip(b.Sigma, F):                   # the given factors, bit for bit
        assert np.array_equal(x, y)
    box_qps_part = "hinge" in loss and d * m > 1024
    if box_qps_part:
        assert np.linalg.norm(b.W - a.W) > 0         # two solvers' answers, not one run twice
    assert_fits_agree(a, b, loss, kw["lam"], F.s.max(), box_qps_part)


@pytest.mark.parametrize("loss", ["squared", "hinge"])
def test_a_fixed_factored_sigma_is_never_formed(loss, monkeypatch, tmp_path):
    """Rounds, rho, margin corrections (hinge: Sigma^-1 through the factors), the checkpoint, a resume, the result
    file, report's sampled correlation and the estimator: SigmaFactors.dense is never called."""
    from hpcmtl.checkpoint import Checkpointer
    from hpcmtl.estimators import DMTRL
    from hpcmtl.results import task_correlation

    def no_dense(self):
        raise AssertionError("an m x m Sigma was formed")
    m, d = 40, 30                            # d m > interior.MAX_WIDTH: no interior-point rounds (they need dense)
    Xs, ys = tasks(m, d, 11, loss=loss)
    F = learned_like(m, 4, 2)
    monkeypatch.setattr(sigma_rules, "FACTORED_MIN_TASKS", 0)
    monkeypatch.setattr(SigmaFactors, "dense", no_dense)
    ck = tmp_path / "c.h5"
    config = DMTRLConfig(loss=loss, lam=0.05, tol=1e-6, relationship="fixed", max_rounds=500, fit_intercept=False)
    source = MemoryTasks(Xs, ys)
    r = train(Cluster.serial(), source, config, sigma_fixed=F, warn=lambda msg: None,
              checkpointer=Checkpointer(str(ck), every=3, config=config.to_dict(), source=source, sigma=F))
    assert r.converged and isinstance(r.Sigma, SigmaFactors) and r.history["round"][-1] > 3
    saved = store.read_checkpoint(str(ck))["arrays"]
    assert "Sigma" not in saved and np.array_equal(saved["sigma_V"], F.V)
    again = train(Cluster.serial(), source, config, sigma_fixed=F, warn=lambda msg: None, resume=str(ck))
    assert again.W.tobytes() == r.W.tobytes()
    out = tmp_path / "r.h5"
    store.write_result(out, r.W, r.Sigma, r.history, {"relationship": "fixed"}, 1, "test")
    back = covariance.model_sigma(store.read_result(out)["model"], out)
    assert isinstance(back, SigmaFactors)
    picked = np.array([0, 3, 39])
    corr = task_correlation(back, picked)
    est = DMTRL(loss=loss, lam=0.05, tol=1e-6, relationship="fixed", sigma=F, fit_intercept=False).fit(Xs, ys)
    assert isinstance(est.Sigma_, SigmaFactors) and est.W_.tobytes() == r.W.tobytes()
    monkeypatch.undo()
    S = F.dense()
    expected = S[np.ix_(picked, picked)] / np.sqrt(np.outer(np.diag(S)[picked], np.diag(S)[picked]))
    assert_allclose(corr, expected, rtol=0, atol=1e-13)


def test_read_sigma_keeps_factors_from_the_threshold(monkeypatch, tmp_path):
    """``--sigma RESULT.h5`` with factors: SigmaFactors bit for bit from FACTORED_MIN_TASKS tasks on, the dense
    matrix below (tests/test_many_tasks.py checks the default threshold's dense matrix)."""
    from hpcmtl.methods import read_sigma
    F = learned_like(20, 3, 4)
    path = tmp_path / "f.h5"
    store.write_result(path, np.zeros((2, 20)), F, {"round": np.arange(2)}, {}, 1, "test")
    monkeypatch.setattr(sigma_rules, "FACTORED_MIN_TASKS", 20)
    got = read_sigma(str(path))
    assert isinstance(got, SigmaFactors) and all(np.array_equal(x, y) for x, y in zip(got, F))
    monkeypatch.setattr(sigma_rules, "FACTORED_MIN_TASKS", 21)
    assert np.array_equal(read_sigma(str(path)), F.dense())


@pytest.mark.parametrize("change,message", [
    (lambda F: SigmaFactors(F.V[:-1], F.s, F.c), r"sigma_V \(19, 3\)\) are for 19 tasks, the data has 20"),
    (lambda F: SigmaFactors(F.V, F.s, F.s.min() * 2), "sigma_s > sigma_c > 0"),
    (lambda F: SigmaFactors(F.V * 1.01, F.s, F.c), "orthonormal"),
    (lambda F: SigmaFactors(np.where(F.V == F.V[0, 0], np.nan, F.V), F.s, F.c), "finite"),
])
def test_bad_factors_as_a_fixed_sigma_are_refused(change, message, monkeypatch):
    monkeypatch.setattr(sigma_rules, "FACTORED_MIN_TASKS", 0)
    F = learned_like(20, 3, 4)
    assert check_sigma(F, 20) is F
    with pytest.raises(InputError, match=message):
        check_sigma(change(F), 20)


def test_train_fixed_names_the_sigma_file_of_the_wrong_task_count(tmp_path):
    """A result file of 600 tasks (factors) as --sigma of a task file of 5: one line naming the file, exit 2."""
    Xs, ys = random_tasks(seed=1, m=5, d=3, sizes=(6, 7, 8))
    tr = tmp_path / "tr.h5"
    store.write_tasks(tr, Xs, ys)
    sigma = tmp_path / "learned.h5"
    store.write_result(sigma, np.zeros((3, 600)), learned_like(600, 3, 1), {"round": np.arange(2)}, {}, 1, "test")
    r = run_hpcmtl(["train", "fixed", "--train", tr, "--sigma", sigma, "--out", tmp_path / "o.h5", "--lam", "0.1",
                    "--quiet"])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hpcmtl: error: {sigma}: task covariance Sigma's factors")
    assert "600 tasks, the data has 5 tasks" in lines[0]


def test_a_checkpoint_of_the_dense_fixed_sigma_of_before_resumes_on_the_factors_file(tmp_path):
    """hpcmtl a08afef held a learned result's factors given to `train fixed --sigma` as their dense matrix at any m
    and signed its checkpoints with that matrix (the same checkpoint `--sigma DENSE.npy` writes today): `--resume`
    with the same result file is the same Sigma, resumed on the checkpoint's dense Sigma to the uninterrupted dense
    run's bits; another result file is still refused."""
    m = 512
    Xs, ys = tasks(m, 4, 3)
    tr, F = tmp_path / "tr.h5", learned_like(m, 3, 2)
    store.write_tasks(tr, Xs, ys)
    learned, dense = tmp_path / "learned.h5", tmp_path / "dense.npy"
    store.write_result(learned, np.zeros((4, m)), F, {"round": np.arange(2)}, {}, 1, "test")
    np.save(dense, F.dense())
    other = tmp_path / "other.h5"
    store.write_result(other, np.zeros((4, m)), learned_like(m, 3, 3), {"round": np.arange(2)}, {}, 1, "test")

    def args(sigma, out, *extra):
        return ["train", "fixed", "--sigma", sigma, "--train", tr, "--out", out, "--loss", "squared", "--lam", "1e-2",
                "--tol", "1e-8", "--quiet", "--force", *extra]
    r = run_hpcmtl(args(dense, tmp_path / "ref.h5"))
    assert r.returncode == 0, r.stderr
    ref = store.read_result(tmp_path / "ref.h5")
    assert len(ref["history"]["round"]) > 4
    out = tmp_path / "o.h5"
    killed = run_hpcmtl(args(dense, out, "--checkpoint-every", "2"), env={"HPCMTL_FAULT": "0:4"})
    assert killed.returncode != 0 and os.path.exists(str(out) + ".checkpoint.h5")
    r = run_hpcmtl(args(other, out, "--resume"))
    assert r.returncode == 2 and "the fixed task covariance differs from the checkpoint's" in r.stderr, r.stderr
    r = run_hpcmtl(args(learned, out, "--resume"))
    assert r.returncode == 0, r.stderr
    res = store.read_result(out)
    assert res["model"]["W"].tobytes() == ref["model"]["W"].tobytes()
    assert res["history"]["primal"].tobytes() == ref["history"]["primal"].tobytes()


TEN_THOUSAND = r"""
import sys, time, numpy as np
from hpcmtl import store
from hpcmtl.cluster import Cluster
from hpcmtl.covariance import SigmaFactors, as_dense, model_sigma
from hpcmtl.dmtrl import DMTRLConfig, train
from hpcmtl.dmtrl.sigma import omega_factors
from hpcmtl.engine import peak_rss_mb   # this program's own peak (VmHWM), not the launching pytest's
from hpcmtl.estimators import MemoryTasks
from hpcmtl.methods import read_sigma
m, d, r = 10000, 5, 3
rng = np.random.default_rng(4)
w = rng.normal(size=(m, r)) @ rng.normal(size=(r, d))            # tasks on an r-dimensional subspace
Xs = [rng.normal(size=(int(rng.integers(3, 6)), d)) for _ in range(m)]
ys = [X @ w[t] + 0.1 * rng.normal(size=X.shape[0]) for t, X in enumerate(Xs)]
# a learned result's file of 10^4 tasks: Sigma's factors
store.write_result(sys.argv[1], w.T, omega_factors(w, 1e-3), {"round": np.arange(2)}, {}, 1, "test")
sigma = read_sigma(sys.argv[1])
if sys.argv[3] == "dense":
    sigma = as_dense(sigma)
start = time.process_time()
res = train(Cluster.serial(), MemoryTasks(Xs, ys), DMTRLConfig(loss="squared", lam=1e-3, relationship="fixed",
            tol=1e-6, max_rounds=int(sys.argv[4]), fit_intercept=False), sigma_fixed=sigma, warn=lambda msg: None)
seconds = time.process_time() - start
store.write_result(sys.argv[2], res.W, res.Sigma, res.history, {"relationship": "fixed"}, 1, "test")
back = model_sigma(store.read_result(sys.argv[2])["model"])
print(isinstance(sigma, SigmaFactors), isinstance(back, SigmaFactors), res.converged, len(res.history["round"]),
      seconds, peak_rss_mb())
"""


def ten_thousand(tmp_path, how, max_rounds=400):
    out = subprocess.run([sys.executable, "-c", TEN_THOUSAND, str(tmp_path / "learned.h5"), str(tmp_path / "f.h5"),
                          how, str(max_rounds)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_ten_thousand_tasks_fixed_from_a_learned_result_without_an_m_by_m_array(tmp_path):
    """10^4 tasks, ``--sigma`` a learned result's factors: held as factors, trained to the certificate, written
    and read back as factors, with the process's peak RSS far below one 10^4 x 10^4 array (800 MB), which the
    dense path (``as_dense``) holds, and more, before its first round."""
    factored, back, converged, rounds, _, peak_mb = ten_thousand(tmp_path, "factors")
    assert factored == back == converged == "True" and int(rounds) > 1
    assert float(peak_mb) < 400, peak_mb
