"""Every converter on small files in the genuine format, and on ../shared/data."""
import gzip
import os
import struct

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
from numpy.testing import assert_allclose, assert_array_equal

from hpcmtl import converters, store
from hpcmtl.errors import InputError

from conftest import run_hpcmtl


def info_json(path):
    import json
    r = run_hpcmtl(["data", "info", path, "--json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_malsar_mat_file(tmp_path):
    rng = np.random.default_rng(0)
    X = np.empty((1, 3), dtype=object)
    Y = np.empty((1, 3), dtype=object)
    for i, n in enumerate((5, 8, 6)):
        X[0, i] = rng.integers(0, 9, size=(n, 4)).astype(np.uint8)
        Y[0, i] = rng.normal(size=(n, 1))
    mat = tmp_path / "school_like.mat"
    scipy.io.savemat(mat, {"X": X, "Y": Y})
    out = tmp_path / "s.h5"
    r = run_hpcmtl(["data", "convert", "--format", "malsar", mat, out])
    assert r.returncode == 0, r.stderr
    with store.TaskFile(out) as tf:
        assert tf.n_tasks == 3 and tf.n_features == 4 and list(tf.n_samples) == [5, 8, 6]
        assert_array_equal(tf.read_task(1).X, X[0, 1].astype(float))
        assert_allclose(tf.read_task(2).y, Y[0, 2].ravel())
    scipy.io.savemat(tmp_path / "bad.mat", {"X": X})
    with pytest.raises(InputError, match=r"bad\.mat: field 'Y' is missing"):
        converters.from_malsar(str(tmp_path / "bad.mat"))


def test_svmlight_one_file_per_task_and_qid(tmp_path):
    (tmp_path / "a.svm").write_text("1 1:0.5 3:2\n-1 2:1\n")
    (tmp_path / "b.svm").write_text("-1 4:1.5\n1 1:1 4:-1\n1 2:3\n")
    Xs, ys, names = converters.from_svmlight([str(tmp_path / "a.svm"), str(tmp_path / "b.svm")])
    assert names == ["a", "b"] and [X.shape for X in Xs] == [(2, 4), (3, 4)]
    assert_array_equal(Xs[0].toarray(), [[0.5, 0, 2, 0], [0, 1, 0, 0]])
    (tmp_path / "q.svm").write_text("1 qid:1 1:1\n-1 qid:1 2:1\n1 qid:2 3:1\n-1 qid:7 1:2\n")
    Xs, ys, names = converters.from_svmlight([str(tmp_path / "q.svm")])
    assert names == ["qid1", "qid2", "qid7"] and [len(y) for y in ys] == [2, 1, 1]
    out = tmp_path / "q.h5"
    assert run_hpcmtl(["data", "convert", "--format", "svmlight", tmp_path / "q.svm", out]).returncode == 0
    assert info_json(out)["storage"] == "csr"


def test_csv_with_task_column(tmp_path):
    (tmp_path / "d.csv").write_text("task,f1,y,f2\nx,1,1,2\ny,3,-1,4\nx,5,-1,6\n")
    Xs, ys, names = converters.from_csv(str(tmp_path / "d.csv"))
    assert names == ["x", "y"]
    assert_array_equal(Xs[0], [[1, 2], [5, 6]])
    assert_array_equal(ys[0], [1, -1])
    with pytest.raises(InputError, match=r"d\.csv: column 'label' is missing"):
        converters.from_csv(str(tmp_path / "d.csv"), label_column="label")


def test_npz_both_layouts(tmp_path):
    np.savez(tmp_path / "a.npz", X_0=np.ones((2, 3)), y_0=np.ones(2), X_1=np.zeros((1, 3)), y_1=-np.ones(1))
    Xs, ys, names = converters.from_npz(str(tmp_path / "a.npz"))
    assert names == ["task0", "task1"] and Xs[1].shape == (1, 3)
    np.savez(tmp_path / "b.npz", X=np.arange(12.0).reshape(4, 3), y=np.ones(4), tasks=np.array([3, 1, 3, 1]))
    Xs, ys, names = converters.from_npz(str(tmp_path / "b.npz"))
    assert names == ["3", "1"]
    assert_array_equal(Xs[0], [[0, 1, 2], [6, 7, 8]])


def write_idx(path, array, gz=True):
    magic = {3: 2051, 1: 2049}[array.ndim]
    payload = struct.pack(">I", magic) + struct.pack(">" + "I" * array.ndim, *array.shape) + array.astype(np.uint8).tobytes()
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(payload)


def test_mnist_idx_protocol(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 6)
    images = rng.integers(0, 256, size=(60, 28, 28))
    write_idx(tmp_path / "img.gz", images)
    write_idx(tmp_path / "lab.gz", labels)
    Xs, ys, names = converters.from_mnist([str(tmp_path / "img.gz"), str(tmp_path / "lab.gz")], seed=1)
    assert names[3] == "digit3" and len(Xs) == 10
    for digit in range(10):
        assert Xs[digit].shape == (12, 784) and ys[digit].sum() == 0           # 6 positives + 6 negatives
        assert_allclose(Xs[digit][:6], images[labels == digit].reshape(6, -1) / 255.0)
    write_idx(tmp_path / "raw", labels, gz=False)
    assert_array_equal(converters.read_idx(str(tmp_path / "raw")), labels)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04\x00\x00\x00\x01")
    with pytest.raises(InputError, match="not an unsigned-byte IDX file"):
        converters.read_idx(str(tmp_path / "bad"))


REVIEW = """<review>
<unique_id>
x{k}
</unique_id>
<rating>
{rating}
</rating>
<title>
{title}
</title>
<review_text>
{text}
</review_text>
</review>
"""


def test_mds_sorted_data_and_processed_acl(tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    (books / "positive.review").write_text(
        "<reviews>" + "".join(REVIEW.format(k=k, rating="5.0", title="great", text="wonderful book &amp; story")
                              for k in range(3)), encoding="latin-1")
    (books / "negative.review").write_text(
        REVIEW.format(k=9, rating="1.0", title="bad", text="boring caf\xe9 plot"), encoding="latin-1")
    dvd = tmp_path / "dvd"
    dvd.mkdir()
    (dvd / "positive.review").write_text("great:2 fun_movie:1 #label#:positive\n")
    (dvd / "negative.review").write_text("awful:3 #label#:negative\nbad:1 #label#:negative\n")
    Xs, ys, names = converters.from_mds([str(tmp_path)], n_features=64)
    assert names == ["books", "dvd"]
    assert Xs[0].shape == (4, 64) and Xs[1].shape == (3, 64)
    assert_array_equal(ys[0], [1, 1, 1, -1])
    assert_array_equal(ys[1], [1, -1, -1])
    assert_allclose(sp.linalg.norm(Xs[0], axis=1), 1.0)
    # a rating that contradicts the file's label is an input error
    (books / "negative.review").write_text(REVIEW.format(k=9, rating="5.0", title="x", text="y"))
    with pytest.raises(InputError, match=r"negative\.review: field 'rating': 1 ratings disagree"):
        converters.from_mds([str(books)])


SGML = """<!DOCTYPE lewis SYSTEM "lewis.dtd">
<REUTERS TOPICS="YES" LEWISSPLIT="TRAIN" CGISPLIT="TRAINING-SET" OLDID="1" NEWID="1">
<TOPICS><D>earn</D></TOPICS><TEXT><TITLE>PROFIT UP</TITLE><BODY>net profit rose sharply &lt;corp&gt;</BODY></TEXT></REUTERS>
<REUTERS TOPICS="YES" LEWISSPLIT="TRAIN" CGISPLIT="TRAINING-SET" OLDID="2" NEWID="2">
<TOPICS><D>acq</D><D>earn</D></TOPICS><TEXT><TITLE>MERGER</TITLE><BODY>company acquires rival profit</BODY></TEXT></REUTERS>
<REUTERS TOPICS="NO" LEWISSPLIT="TRAIN" CGISPLIT="TRAINING-SET" OLDID="3" NEWID="3">
<TOPICS></TOPICS><TEXT><BODY>not in ModApte</BODY></TEXT></REUTERS>
<REUTERS TOPICS="YES" LEWISSPLIT="TEST" CGISPLIT="TRAINING-SET" OLDID="4" NEWID="4">
<TOPICS><D>acq</D></TOPICS><TEXT><TITLE>DEAL</TITLE><BODY>company acquires profit rival</BODY></TEXT></REUTERS>
<REUTERS TOPICS="YES" LEWISSPLIT="NOT-USED" CGISPLIT="TRAINING-SET" OLDID="5" NEWID="5">
<TOPICS><D>acq</D></TOPICS><TEXT><BODY>unused</BODY></TEXT></REUTERS>
"""


def test_reuters_modapte_sgml(tmp_path):
    (tmp_path / "reut2-000.sgm").write_text(SGML, encoding="latin-1")
    train, test = converters.read_reuters(str(tmp_path))
    assert [d["newid"] for d in train] == [1, 2] and [d["newid"] for d in test] == [4]
    assert train[1]["topics"] == ["acq", "earn"] and "<corp>" in train[0]["text"]
    assert converters.reuters_topics(train, 1) == ["earn", "acq"]
    out, out_test = tmp_path / "r.h5", tmp_path / "rt.h5"
    r = run_hpcmtl(["data", "convert", "--format", "reuters", tmp_path, out, "--test-out", out_test, "--min-docs", "1"])
    assert r.returncode == 0, r.stderr
    with store.TaskFile(out) as tf:
        assert tf.names == ["earn", "acq"]
        assert_array_equal(tf.read_task(1).y, [-1, 1])
    s = tmp_path / "s.h5"
    assert run_hpcmtl(["data", "convert", "--format", "reuters", tmp_path, s, "--stream", "--min-docs", "1"]).returncode == 0
    with store.StreamFile(s) as sf:
        assert (sf.n_rounds, sf.n_labels) == (2, 2)
        (_, X, Y), = list(sf.chunks(10))
        assert_array_equal(Y, [[1, -1], [1, 1]])


# -- ../shared/data -------------------------------------------------------------
def test_school_from_shared(shared_data, tmp_path):
    out = tmp_path / "school.h5"
    r = run_hpcmtl(["data", "convert", "--format", "malsar", os.path.join(shared_data, "school.mat"), out])
    assert r.returncode == 0, r.stderr
    info = info_json(out)
    assert (info["n_tasks"], info["n_samples"], info["n_features"]) == (139, 15362, 28)
    with store.TaskFile(out) as tf:
        assert np.all(tf.read_task(0).X[:, -1] == 1.0)     # the bias column


def test_mnist_from_shared(shared_data):
    d = os.path.join(shared_data, "mnist")
    labels = converters.read_idx(os.path.join(d, "train-labels-idx1-ubyte.gz"))
    Xs, ys, names = converters.mnist_one_vs_all(os.path.join(d, "train-images-idx3-ubyte.gz"),
                                                os.path.join(d, "train-labels-idx1-ubyte.gz"))
    assert len(Xs) == 10
    for digit in range(10):
        count = int(np.sum(labels == digit))
        assert Xs[digit].shape == (2 * count, 784) and int(np.sum(ys[digit] == 1)) == count


def test_reuters_from_shared(shared_data):
    train, test = converters.read_reuters(os.path.join(shared_data, "reuters21578"))
    assert (len(train), len(test)) == (9603, 3299)
    assert converters.reuters_topics(train, 100)[:2] == ["earn", "acq"]


def test_mds_from_shared(shared_data):
    Xs, ys, names = converters.from_mds([os.path.join(shared_data, "mds")])
    assert names == ["books", "dvd", "electronics", "kitchen"]
    assert all(X.shape == (2000, 10000) for X in Xs) and all(y.sum() == 0 for y in ys)
