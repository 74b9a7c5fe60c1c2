"""`hpcmtl train online` under real mpiexec: same bits at any rank count, the estimator's bits at
one round per exchange, chunked reading, checkpoints, output codes and bad input."""
import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from hpcmtl import estimators, output_codes, store

from conftest import run_hpcmtl

pytestmark = pytest.mark.mpi

RULE = ["--norm", "rmax", "--r", "3", "--C", "0.05"]


@pytest.fixture(scope="module")
def streams(tmp_path_factory):
    d = tmp_path_factory.mktemp("online")
    s, t = d / "s.h5", d / "t.h5"
    r = run_hpcmtl(["data", "synth", "multilabel-stream", s, "--test", t, "--scale", "0.2", "--seed", "3"])
    assert r.returncode == 0, r.stderr
    ref = d / "ref.h5"
    r = run_hpcmtl(["train", "online", "--stream", s, "--out", ref, "--quiet", "--chunk-rounds", "1000"] + RULE,
                   n_ranks=2)
    assert r.returncode == 0, r.stderr
    return s, t, store.read_result(ref)


def same_bits(path, reference):
    res = store.read_result(path)
    return (res["model"]["W"].tobytes() == reference["model"]["W"].tobytes()
            and all(res["history"][k].tobytes() == reference["history"][k].tobytes()
                    for k in ("global_loss", "n_errors", "n_active")))


@pytest.mark.parametrize("n_ranks", [1, 3, 5])
def test_same_bits_at_any_rank_count_and_chunk_size(streams, tmp_path, n_ranks):
    s, _, reference = streams
    out = tmp_path / "r.h5"
    r = run_hpcmtl(["train", "online", "--stream", s, "--out", out, "--quiet", "--chunk-rounds", "300"] + RULE,
                   n_ranks=n_ranks if n_ranks > 1 else None)
    assert r.returncode == 0, r.stderr
    assert same_bits(out, reference)
    res = store.read_result(out)
    assert res["n_ranks"] == n_ranks and res["config"]["chunk_rounds"] == 320      # a multiple of 64 rounds


def test_one_round_per_exchange_is_the_estimator_bit_for_bit(streams, tmp_path):
    s, _, reference = streams
    out = tmp_path / "r.h5"
    r = run_hpcmtl(["train", "online", "--stream", s, "--out", out, "--quiet", "--block-rounds", "1"] + RULE,
                   n_ranks=3)
    assert r.returncode == 0, r.stderr
    with store.StreamFile(s) as sf:
        X, Y = sf.read_rounds(0, sf.n_rounds)
    model = estimators.OnlineMultitask(norm="rmax", r=3, C=0.05).partial_fit(X, Y)
    res = store.read_result(out)
    assert res["model"]["W"].tobytes() == model.W_.tobytes()
    assert np.array_equal(res["history"]["n_errors"], model.history_["n_errors"])
    # blocks of 64 rounds solve the same sequential rounds; only the margins' rounding differs
    np.testing.assert_allclose(reference["model"]["W"], model.W_, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(reference["history"]["n_errors"], model.history_["n_errors"])


def test_result_file_has_running_metrics_and_test_metrics(streams, tmp_path):
    s, t, _ = streams
    out = tmp_path / "r.h5"
    r = run_hpcmtl(["train", "online", "--stream", s, "--out", out, "--test", t] + RULE, n_ranks=2)
    assert r.returncode == 0, r.stderr
    assert "inf-error rate" in r.stdout and "test task_mean_auc" in r.stdout
    res = store.read_result(out)
    h = res["history"]
    T = 4000
    assert len(h["round"]) == T and h["round"][-1] == T
    np.testing.assert_allclose(h["cumulative_loss"], np.cumsum(h["global_loss"]))
    np.testing.assert_array_equal(h["inf_error"], h["n_errors"] > 0)
    assert res["config"]["summary"]["inf_error_rate"] == pytest.approx(h["inf_error"].mean())
    assert res["test"]["summary"]["n_tasks"] == 20 and 0.5 < res["test"]["summary"]["task_mean_auc"] <= 1
    # the test metrics are those of the final hypotheses
    with store.StreamFile(t) as tf:
        Xt, Yt = tf.read_rounds(0, tf.n_rounds)
    scores = np.asarray(Xt @ res["model"]["W"])
    errors = np.mean(np.where(scores >= 0, 1, -1) != Yt)
    assert res["test"]["summary"]["pooled_error_rate"] == pytest.approx(errors)


def test_killed_worker_then_resume_at_another_rank_count_is_bitwise(streams, tmp_path):
    s, _, reference = streams
    out = tmp_path / "r.h5"
    args = ["train", "online", "--stream", s, "--out", out, "--quiet", "--chunk-rounds", "1000",
            "--checkpoint-every", "1000"] + RULE
    r = run_hpcmtl(args, n_ranks=3, env={"HPCMTL_FAULT": "2:40:kill"}, timeout=60)        # block 40 = round 2560
    assert r.returncode != 0 and not out.exists()
    ck = store.read_checkpoint(str(out) + ".checkpoint.h5")
    assert ck["counters"]["round"] == 2048                    # the block that crossed round 2000
    r = run_hpcmtl(args + ["--resume"], n_ranks=4)
    assert r.returncode == 0, r.stderr
    assert same_bits(out, reference)
    r = run_hpcmtl(args[:-6] + ["--norm", "linf", "--C", "0.05", "--resume", "--force"], n_ranks=2)
    assert r.returncode == 2 and "cannot resume: 'norm' is 'rmax' in the checkpoint but 'linf' now" in r.stderr


def test_output_code_over_a_single_label_stream(tmp_path):
    rng = np.random.default_rng(4)
    centers = rng.normal(size=(5, 50)) * 2
    classes = rng.integers(0, 5, size=2000)
    X = sp.csr_matrix((centers[classes] + rng.normal(size=(2000, 50))) * (rng.uniform(size=(2000, 50)) < 0.5))
    Y = -np.ones((2000, 5))
    Y[np.arange(2000), classes] = 1
    path = tmp_path / "mc.h5"
    store.write_stream(path, X, Y, label_names=list("abcde"))
    out = tmp_path / "r.h5"
    r = run_hpcmtl(["train", "online", "--stream", path, "--out", out, "--quiet", "--code", "exhaustive",
                    "--norm", "rmax", "--r", "3", "--C", "0.1", "--block-rounds", "1"], n_ranks=3)
    assert r.returncode == 0, r.stderr
    res = store.read_result(out)
    assert res["model"]["task_names"][0] == "code0" and res["model"]["W"].shape == (50, 15)
    np.testing.assert_array_equal(res["model"]["code"], output_codes.exhaustive_code(5))
    model = estimators.OnlineECOC(n_classes=5, code="exhaustive", norm="rmax", r=3, C=0.1).partial_fit(X, classes)
    assert res["model"]["W"].tobytes() == model.W_.tobytes()
    np.testing.assert_array_equal(res["history"]["multiclass_error"], model.history_["multiclass_error"])
    assert res["history"]["multiclass_error"][-500:].mean() < 0.1


def bad_streams(base, d):
    """Copies of a good stream with one defect each."""
    out = {}
    for name, edit in (("nan", lambda f: f["X/data"].__setitem__(7, np.nan)),
                       ("label", lambda f: f["Y"].__setitem__((5, 2), 0.5)),
                       ("index", lambda f: f["X/indices"].__setitem__(3, 10 ** 6))):
        path = d / f"{name}.h5"
        path.write_bytes(base.read_bytes())
        with h5py.File(path, "r+") as f:
            edit(f)
        out[name] = path
    return out


@pytest.mark.parametrize("case,extra,message", [
    ("nan", [], "field 'X': NaN or Inf in round 0"),
    ("label", [], "field 'Y': round 5 has a label other than -1, 0, +1"),
    ("index", [], "field 'X/indices': column index outside"),
    ("good", ["--code", "one-vs-rest"], "labels; an output code needs exactly one class per round"),
    ("good", ["--code", "exhaustive"], "s.h5: 20 labels: the exhaustive code has 2^(C-1) - 1 columns, so it is "
                                       "offered for 3..10 classes only, got 20: use --code auto"),
    ("good", ["--C", "big"], "--C must be a number > 0 or 'auto', got 'big'"),
    ("good", ["--r", "50"], "'r' parameter of train online must be an integer in 1..20"),
    ("good", ["--norm", "p", "--p", "3"], "solved exactly for the L2 and r-max norms"),
    ("tasks", [], "attribute 'format' is 'hpcmtl-tasks', expected 'hpcmtl-stream'"),
    ("none", [], "method 'online' needs --stream STREAM.h5"),
])
def test_bad_input_is_one_line_exit_2_on_every_rank(streams, tmp_path, case, extra, message):
    s, _, _ = streams
    paths = dict(bad_streams(s, tmp_path), good=s)
    if case == "tasks":
        paths["tasks"] = tmp_path / "tasks.h5"
        store.write_tasks(paths["tasks"], [np.ones((3, 2))], [np.ones(3)])
    out = tmp_path / "r.h5"
    source = [] if case == "none" else ["--stream", paths[case]]
    args = ["train", "online"] + source + ["--out", out] + RULE
    r = run_hpcmtl(args + extra, n_ranks=3, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("hpcmtl:")]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert not out.exists()
