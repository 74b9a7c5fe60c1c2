"""Decoding an output code (loss-based and Hamming), a multilabel stream's ranking, stream scaling and class names:
each against an independent NumPy (or scikit-learn) reference, and the same predictions from the command line,
``evaluate`` and the estimators."""
import json

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import one_error_line, run_hpcmtl

from hpcmtl import estimators, output_codes, store
from hpcmtl.stream_scaling import StreamScaling, fit_scaling


# ---------------------------------------------------------------------------
# the NumPy references: every class's summed loss written out, ties by lexsort
# ---------------------------------------------------------------------------
def reference_decode(F, M, decoder):
    """Per round: least Hamming distance (hamming only), then least summed hinge loss, then largest M f, then
    lowest class; with exactly representable margins (multiples of 1/4 here) no tolerance is needed."""
    out = []
    for f in np.atleast_2d(F):
        hinge = np.array([sum(max(0.0, 1.0 - m * v) for m, v in zip(row, f)) for row in M])
        linear = np.array([sum(m * v for m, v in zip(row, f)) for row in M])
        hamming = np.array([sum(0.5 if v == 0 else float(np.sign(v) != m) for m, v in zip(row, f)) for row in M])
        keys = (np.arange(len(M)), -linear, hinge) + ((hamming,) if decoder == "hamming" else ())
        out.append(int(np.lexsort(keys)[0]))                     # lexsort: the last key sorts first
    return np.array(out)


def codes():
    return {"one-vs-rest": output_codes.one_vs_rest_code(6), "exhaustive": output_codes.exhaustive_code(5),
            "random": output_codes.random_code(7, 12, seed=3)}


@pytest.mark.parametrize("name", ["one-vs-rest", "exhaustive", "random"])
@pytest.mark.parametrize("decoder", ["loss", "hamming"])
def test_decoding_matches_the_numpy_reference_with_ties(name, decoder):
    M = codes()[name]
    rng = np.random.default_rng(5)
    # quarter steps in [-2, 2]: many exact ties of loss, distance and margin sums; also continuous margins
    F = np.vstack([rng.integers(-8, 9, size=(300, M.shape[1])) / 4.0, rng.normal(size=(100, M.shape[1])) * 2,
                   np.zeros((1, M.shape[1]))])
    got = output_codes.decode(F, M, decoder)
    want = reference_decode(F, M, decoder)
    np.testing.assert_array_equal(got, want)
    scores = output_codes.class_scores(F, M, decoder)
    hinge = np.maximum(0.0, 1.0 - F[:, None, :] * M[None, :, :]).sum(axis=2)
    hamming = ((np.sign(F)[:, None, :] != M[None, :, :]) * np.where(F[:, None, :] == 0, 0.5, 1.0)).sum(axis=2)
    np.testing.assert_allclose(scores, -(hinge if decoder == "loss" else hamming), rtol=1e-12, atol=1e-12)
    assert np.all(scores[np.arange(len(F)), got] >= scores.max(axis=1) - 1e-9)   # predict is a best score


def test_one_vs_rest_loss_decoding_is_the_largest_margin_even_with_no_positive_column():
    rng = np.random.default_rng(6)
    F = -np.abs(rng.normal(size=(500, 8))) - 1.0               # every margin below -1: no positive column
    F[:250] = rng.normal(size=(250, 8)) * 3                    # and rows with several positive columns
    M = output_codes.one_vs_rest_code(8)
    np.testing.assert_array_equal(output_codes.decode(F, M), np.argmax(F, axis=1))
    np.testing.assert_array_equal(output_codes.decode(F, M, "hamming")[250:], np.argmax(F[250:], axis=1))
    # the decoder before: every all-negative row went to class 0
    assert np.all(np.argmin((8 - np.sign(F[250:]) @ M.T) / 2.0, axis=1) == 0)


def test_ties_within_rounding_decode_alike_from_margins_that_differ_in_the_last_bits():
    M = output_codes.exhaustive_code(5)
    f = np.array([-0.047, -0.473, -0.047, 0.047, 0.473, 0.047, 0.473, -0.473, -0.047, -0.473, -0.047, 0.047,
                  0.473, 0.047, 0.473])                        # classes 0, 1 and 3 tie exactly (a real round)
    nudged = f * (1.0 + np.random.default_rng(7).uniform(-1e-15, 1e-15, size=f.size))
    # mathematically classes 0, 1 and 3 have the same loss and the same margin sum: the lowest wins, whatever
    # the last bits (a reference summing in another order, without the tolerance, picks one of them by rounding)
    assert output_codes.decode(f, M)[0] == output_codes.decode(nudged, M)[0] == 0
    assert reference_decode(f, M, "loss")[0] in (0, 1, 3)


def test_multilabel_ranking_is_by_margin_with_ties_to_the_lower_label():
    rng = np.random.default_rng(8)
    F = np.vstack([rng.integers(-3, 3, size=(200, 6)) / 2.0, -np.abs(rng.normal(size=(50, 6)))])
    want = np.array([sorted(range(6), key=lambda j: (-f[j], j)) for f in F])
    np.testing.assert_array_equal(output_codes.rank_labels(F), want)
    X = rng.normal(size=(300, 5))
    Y = np.where(X @ rng.normal(size=(5, 6)) > 0.5, 1.0, -1.0)
    model = estimators.OnlineMultitask(norm="linf", C="auto").fit(X, Y)
    margins = X @ model.W_
    np.testing.assert_array_equal(model.rank(X), np.array([sorted(range(6), key=lambda j: (-m[j], j)) for m in margins]))


def test_online_ecoc_predict_and_decision_function_use_the_decoder():
    rng = np.random.default_rng(9)
    centers = rng.normal(size=(6, 10)) * 2
    classes = rng.integers(0, 6, size=800)
    X = centers[classes] + rng.normal(size=(800, 10))
    for decoder in ("loss", "hamming"):
        model = estimators.OnlineECOC(n_classes=6, code="random:9:1", norm="linf", r=1, C="auto",
                                      decoder=decoder).fit(X, classes)
        F = X @ model.W_
        np.testing.assert_array_equal(model.predict(X), reference_decode(F, model.code_, decoder))
        scores = model.decision_function(X)
        assert scores.shape == (800, 6)
        np.testing.assert_allclose(scores, output_codes.class_scores(F, model.code_, decoder))
    assert estimators.OnlineECOC().get_params()["code"] == "auto"
    with pytest.raises(Exception, match="'decoder' parameter of OnlineECOC must be one of loss, hamming"):
        estimators.OnlineECOC(n_classes=6, decoder="vote").fit(X, classes)


def test_auto_code_and_the_exhaustive_limit():
    np.testing.assert_array_equal(output_codes.get_code("auto", 20), output_codes.one_vs_rest_code(20))
    assert output_codes.get_code("exhaustive", 10).shape == (10, 511)
    with pytest.raises(Exception, match=r"offered for 3\.\.10 classes only, got 11: use --code auto"):
        output_codes.get_code("exhaustive", 11)


# ---------------------------------------------------------------------------
# the same predictions from train online --test, evaluate and the estimator; class names kept
# ---------------------------------------------------------------------------
def class_stream(rng, n, centers, names):
    classes = rng.integers(0, len(names), size=n)
    X = sp.csr_matrix(np.abs(centers[classes] + rng.normal(size=(n, centers.shape[1]))) *
                      (rng.uniform(size=(n, centers.shape[1])) < 0.6))
    Y = -np.ones((n, len(names)))
    Y[np.arange(n), classes] = 1.0
    return X, Y, classes


@pytest.mark.mpi
@pytest.mark.parametrize("decoder,scale", [("loss", "none"), ("hamming", "maxabs")])
def test_cli_evaluate_and_estimator_predict_alike_and_keep_class_names(tmp_path, decoder, scale):
    rng = np.random.default_rng(10)
    names = ["comp.graphics", "rec.autos", "sci.space", "talk.politics"]
    centers = rng.normal(size=(4, 30)) * 2
    X, Y, classes = class_stream(rng, 1500, centers, names)
    Xt, Yt, ct = class_stream(rng, 600, centers, names)
    X = X.multiply(np.arange(1, 31)[None, :]).tocsr()           # features of different ranges: maxabs matters
    Xt = Xt.multiply(np.arange(1, 31)[None, :]).tocsr()
    store.write_stream(tmp_path / "s.h5", X, Y, label_names=names)
    order = [2, 0, 3, 1]                                         # the test stream's classes in another order
    store.write_stream(tmp_path / "t.h5", Xt, Yt[:, order], label_names=[names[i] for i in order])
    out = tmp_path / "r.h5"
    r = run_hpcmtl(["train", "online", "--stream", tmp_path / "s.h5", "--test", tmp_path / "t.h5", "--out", out,
                    "--quiet", "--code", "auto", "--norm", "linf", "--C", "0.05", "--decoder", decoder,
                    "--scale", scale, "--block-rounds", "1"], n_ranks=2)
    assert r.returncode == 0, r.stderr
    res = store.read_result(out)
    assert res["model"]["class_names"] == names and res["config"]["decoder"] == decoder
    ev = run_hpcmtl(["evaluate", out, tmp_path / "t.h5", "--json"])
    assert ev.returncode == 0, ev.stderr
    metrics = json.loads(ev.stdout)
    assert [c["name"] for c in metrics["classes"]] == names
    assert metrics["summary"] == pytest.approx(res["test"]["summary"])   # train --test == evaluate

    scaling = fit_scaling(scale, [X], X.shape[0], X.shape[1])
    model = estimators.OnlineECOC(n_classes=4, code="auto", norm="linf", r=1, C=0.05, decoder=decoder)
    model.fit(scaling.apply(X), classes)
    assert res["model"]["W"].tobytes() == model.W_.tobytes()   # the training arithmetic is the estimator's
    predicted = model.predict(scaling.apply(Xt))
    wrong = predicted != ct
    assert metrics["summary"]["multiclass_error_rate"] == pytest.approx(wrong.mean(), abs=0)
    assert [c["errors"] for c in metrics["classes"]] == [int(wrong[ct == c].sum()) for c in range(4)]
    assert [c["n"] for c in metrics["classes"]] == [int((ct == c).sum()) for c in range(4)]
    np.testing.assert_array_equal(res["history"]["multiclass_error"], model.history_["multiclass_error"])
    text = run_hpcmtl(["evaluate", out, tmp_path / "t.h5"]).stdout
    assert all(n in text for n in names) and "error_rate" in text


def test_a_csv_streams_class_names_round_trip(tmp_path):
    rng = np.random.default_rng(11)
    names = ["setosa", "versicolor", "virginica"]
    centers = rng.normal(size=(3, 4)) * 3
    for part, n in (("train", 300), ("test", 90)):
        cls = rng.integers(0, 3, size=n)
        X = centers[cls] + rng.normal(size=(n, 4))
        (tmp_path / f"{part}.csv").write_text("a,b,c,d,species\n" + "".join(
            ",".join(f"{v:.3f}" for v in x) + f",{names[k]}\n" for x, k in zip(X, cls)))
        r = run_hpcmtl(["data", "convert", "--format", "csv", tmp_path / f"{part}.csv", tmp_path / f"{part}.h5",
                        "--stream", "--label-column", "species"])
        assert r.returncode == 0, r.stderr
    with store.StreamFile(tmp_path / "train.h5") as s:
        assert s.label_names == names
    out = tmp_path / "r.h5"
    r = run_hpcmtl(["train", "online", "--stream", tmp_path / "train.h5", "--test", tmp_path / "test.h5", "--out",
                    out, "--quiet", "--code", "auto", "--norm", "linf", "--C", "auto", "--scale", "l2"])
    assert r.returncode == 0, r.stderr
    res = store.read_result(out)
    assert res["model"]["class_names"] == names and [c["name"] for c in res["test"]["classes"]] == names
    assert res["test"]["summary"]["multiclass_error_rate"] < 0.2
    ev = json.loads(run_hpcmtl(["evaluate", out, tmp_path / "test.h5", "--json"]).stdout)
    assert ev["classes"] == res["test"]["classes"]


# ---------------------------------------------------------------------------
# stream scaling against scikit-learn
# ---------------------------------------------------------------------------
def test_stream_scalings_match_scikit_learn():
    from sklearn.feature_extraction.text import TfidfTransformer
    from sklearn.preprocessing import MaxAbsScaler, normalize
    rng = np.random.default_rng(12)
    counts = sp.random(200, 40, density=0.1, format="csr", random_state=1, data_rvs=lambda n: rng.integers(1, 9, n))
    counts = sp.csr_matrix(counts.multiply(np.arange(200)[:, None] != 5))   # row 5 empty: it stays empty
    counts.eliminate_zeros()                                     # (scikit-learn counts stored zeros in df)
    test = sp.random(50, 40, density=0.1, format="csr", random_state=2, data_rvs=lambda n: rng.integers(1, 9, n))
    chunks = [counts[:70], counts[70:]]                          # fitted in chunks as the stream is read
    tfidf = fit_scaling("tfidf", chunks, 200, 40)
    ref = TfidfTransformer(norm="l2", smooth_idf=True).fit(counts)
    np.testing.assert_allclose(tfidf.factors, ref.idf_, rtol=1e-14)
    np.testing.assert_allclose(tfidf.apply(test).toarray(), ref.transform(test).toarray(), rtol=1e-12, atol=1e-15)
    signed = counts.copy()
    signed.data = signed.data * rng.choice([-1.0, 1.0], size=signed.nnz)
    maxabs = fit_scaling("maxabs", [signed[:70], signed[70:]], 200, 40)
    np.testing.assert_allclose(maxabs.apply(test).toarray(), MaxAbsScaler().fit(signed).transform(test).toarray(),
                               rtol=1e-14)
    l2 = fit_scaling("l2", chunks, 200, 40)
    np.testing.assert_allclose(l2.apply(counts).toarray(), normalize(counts).toarray(), rtol=1e-14)
    assert StreamScaling().apply(counts) is counts              # none: the instances as stored, bit for bit
    with pytest.raises(Exception, match="tf-idf scales counts"):
        fit_scaling("tfidf", [signed], 200, 40)


@pytest.mark.mpi
def test_bad_scale_and_decoder_are_one_line_errors(tmp_path):
    X = sp.csr_matrix(np.array([[1.0, -2.0], [0.5, 1.0], [2.0, 0.0]]))
    Y = np.array([[1.0, -1.0, -1.0], [-1.0, 1.0, -1.0], [-1.0, -1.0, 1.0]])
    store.write_stream(tmp_path / "s.h5", X, Y)
    base = ["train", "online", "--stream", tmp_path / "s.h5", "--out", tmp_path / "r.h5", "--code", "auto"]
    r = run_hpcmtl(base + ["--scale", "tfidf"], n_ranks=2)
    assert r.returncode == 2 and "tf-idf scales counts" in one_error_line(r)
    for flag, value in (("--scale", "zscore"), ("--decoder", "vote")):
        r = run_hpcmtl(base + [flag, value])
        assert r.returncode == 2 and value in one_error_line(r)
    assert not (tmp_path / "r.h5").exists()


def test_npz_class_names_become_the_streams_label_names(tmp_path):
    rng = np.random.default_rng(13)
    X = sp.random(40, 12, density=0.3, format="csr", random_state=3)
    y = rng.integers(0, 3, size=40)
    names = np.array(["alt.atheism", "comp.graphics", "sci.space"])
    sp.save_npz(tmp_path / "news.npz", X)
    np.savez(tmp_path / "news-labels.npz", y=y, target_names=names)
    r = run_hpcmtl(["data", "convert", "--format", "npz", tmp_path / "news.npz", tmp_path / "news-labels.npz",
                    tmp_path / "s.h5", "--stream"])
    assert r.returncode == 0, r.stderr
    with store.StreamFile(tmp_path / "s.h5") as s:
        assert s.label_names == list(names)
        _, Y = s.read_rounds(0, 40)
    np.testing.assert_array_equal(np.argmax(Y == 1, axis=1), y)
    np.savez(tmp_path / "dense.npz", X=X.toarray(), y=y, class_names=names[:2])
    r = run_hpcmtl(["data", "convert", "--format", "npz", tmp_path / "dense.npz", tmp_path / "d.h5", "--stream"])
    assert r.returncode == 2 and "array 'y', element" in one_error_line(r) and "has no name in 'class_names'" in r.stderr


def test_a_checkpoint_resumes_only_under_its_scaling():
    from hpcmtl.checkpoint import config_mismatch
    from hpcmtl.online import OnlineConfig
    now = OnlineConfig(scale="l2").to_dict()
    saved = dict(now, scale="maxabs")
    assert config_mismatch({"config": saved}, now) == "'scale' is 'maxabs' in the checkpoint but 'l2' now"
    older = {k: v for k, v in now.items() if k != "scale"}       # written before --scale: the stored instances
    assert config_mismatch({"config": older}, now) == "'scale' is 'none' in the checkpoint but 'l2' now"
    assert config_mismatch({"config": older}, OnlineConfig().to_dict()) is None
