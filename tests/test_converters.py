"""Every converter on small files in the genuine format, and on ../shared/data."""
import gzip
import os
import struct

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
from numpy.testing import assert_allclose, assert_array_equal

from hpcmtl import formats, store
from hpcmtl.errors import InputError

from conftest import run_hpcmtl


def info_json(path):
    import json
    r = run_hpcmtl(["data", "info", path, "--json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.smoke
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
        formats.from_malsar(str(tmp_path / "bad.mat"))


@pytest.mark.slow
def test_svmlight_one_file_per_task_and_qid(tmp_path):
    (tmp_path / "a.svm").write_text("1 1:0.5 3:2\n-1 2:1\n")
    (tmp_path / "b.svm").write_text("-1 4:1.5\n1 1:1 4:-1\n1 2:3\n")
    Xs, ys, names = formats.from_svmlight([str(tmp_path / "a.svm"), str(tmp_path / "b.svm")])
    assert names == ["a", "b"] and [X.shape for X in Xs] == [(2, 4), (3, 4)]
    assert_array_equal(Xs[0].toarray(), [[0.5, 0, 2, 0], [0, 1, 0, 0]])
    (tmp_path / "q.svm").write_text("1 qid:1 1:1\n-1 qid:1 2:1\n1 qid:2 3:1\n-1 qid:7 1:2\n")
    Xs, ys, names = formats.from_svmlight([str(tmp_path / "q.svm")])
    assert names == ["qid1", "qid2", "qid7"] and [len(y) for y in ys] == [2, 1, 1]
    out = tmp_path / "q.h5"
    assert run_hpcmtl(["data", "convert", "--format", "svmlight", tmp_path / "q.svm", out]).returncode == 0
    assert info_json(out)["storage"] == "csr"


@pytest.mark.smoke
def test_csv_with_task_column(tmp_path):
    (tmp_path / "d.csv").write_text("task,f1,y,f2\nx,1,1,2\ny,3,-1,4\nx,5,-1,6\n")
    Xs, ys, names = formats.from_csv(str(tmp_path / "d.csv"))
    assert names == ["x", "y"]
    assert_array_equal(Xs[0], [[1, 2], [5, 6]])
    assert_array_equal(ys[0], [1, -1])
    with pytest.raises(InputError, match=r"d\.csv: line 1: column 'label' is missing"):
        formats.from_csv(str(tmp_path / "d.csv"), label_column="label")


@pytest.mark.smoke
def test_npz_both_layouts(tmp_path):
    np.savez(tmp_path / "a.npz", X_0=np.ones((2, 3)), y_0=np.ones(2), X_1=np.zeros((1, 3)), y_1=-np.ones(1))
    Xs, ys, names = formats.from_npz(str(tmp_path / "a.npz"))
    assert names == ["task0", "task1"] and Xs[1].shape == (1, 3)
    np.savez(tmp_path / "b.npz", X=np.arange(12.0).reshape(4, 3), y=np.ones(4), tasks=np.array([3, 1, 3, 1]))
    Xs, ys, names = formats.from_npz(str(tmp_path / "b.npz"))
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
    Xs, ys, names = formats.from_mnist([str(tmp_path / "img.gz"), str(tmp_path / "lab.gz")], seed=1)
    assert names[3] == "digit3" and len(Xs) == 10
    for digit in range(10):
        assert Xs[digit].shape == (12, 784) and ys[digit].sum() == 0           # 6 positives + 6 negatives
        assert sp.isspmatrix_csr(Xs[digit]) and Xs[digit].nnz == np.count_nonzero(Xs[digit].toarray())
        assert_allclose(Xs[digit][:6].toarray(), images[labels == digit].reshape(6, -1) / 255.0, rtol=0, atol=0)
    write_idx(tmp_path / "raw", labels, gz=False)
    assert_array_equal(formats.read_idx(str(tmp_path / "raw")), labels)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04\x00\x00\x00\x01")
    with pytest.raises(InputError, match="not an unsigned-byte IDX file"):
        formats.read_idx(str(tmp_path / "bad"))


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
    Xs, ys, names = formats.from_mds([str(tmp_path)], n_features=64)
    assert names == ["books", "dvd"]
    assert Xs[0].shape == (4, 64) and Xs[1].shape == (3, 64)
    assert_array_equal(ys[0], [1, 1, 1, -1])
    assert_array_equal(ys[1], [1, -1, -1])
    assert_allclose(sp.linalg.norm(Xs[0], axis=1), 1.0)
    # a rating that contradicts the file's label is an input error
    (books / "negative.review").write_text(REVIEW.format(k=9, rating="5.0", title="x", text="y"))
    with pytest.raises(InputError, match=r"negative\.review: field 'rating': 1 ratings disagree"):
        formats.from_mds([str(books)])


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


@pytest.mark.slow
def test_reuters_modapte_sgml(tmp_path):
    (tmp_path / "reut2-000.sgm").write_text(SGML, encoding="latin-1")
    train, test = formats.read_reuters(str(tmp_path))
    assert [d["newid"] for d in train] == [1, 2] and [d["newid"] for d in test] == [4]
    assert train[1]["topics"] == ["acq", "earn"] and "<corp>" in train[0]["text"]
    assert formats.reuters_topics(train, 1) == ["earn", "acq"]
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
@pytest.mark.shared_data
def test_school_from_shared(shared_data, tmp_path):
    out = tmp_path / "school.h5"
    r = run_hpcmtl(["data", "convert", "--format", "malsar", os.path.join(shared_data, "school.mat"), out])
    assert r.returncode == 0, r.stderr
    info = info_json(out)
    assert (info["n_tasks"], info["n_samples"], info["n_features"]) == (139, 15362, 28)
    with store.TaskFile(out) as tf:
        assert np.all(tf.read_task(0).X[:, -1] == 1.0)     # the bias column


@pytest.mark.shared_data
@pytest.mark.slow
def test_mnist_from_shared(shared_data):
    d = os.path.join(shared_data, "mnist")
    labels = formats.read_idx(os.path.join(d, "train-labels-idx1-ubyte.gz"))
    Xs, ys, names = formats.mnist_one_vs_all(os.path.join(d, "train-images-idx3-ubyte.gz"),
                                                os.path.join(d, "train-labels-idx1-ubyte.gz"))
    assert len(Xs) == 10
    for digit in range(10):
        count = int(np.sum(labels == digit))
        assert Xs[digit].shape == (2 * count, 784) and int(np.sum(ys[digit] == 1)) == count


@pytest.mark.shared_data
def test_reuters_from_shared(shared_data):
    train, test = formats.read_reuters(os.path.join(shared_data, "reuters21578"))
    assert (len(train), len(test)) == (9603, 3299)
    assert formats.reuters_topics(train, 100)[:2] == ["earn", "acq"]


@pytest.mark.shared_data
@pytest.mark.slow
def test_mds_from_shared(shared_data):
    Xs, ys, names = formats.from_mds([os.path.join(shared_data, "mds")])
    assert names == ["books", "dvd", "electronics", "kitchen"]
    assert all(X.shape == (2000, 10000) for X in Xs) and all(y.sum() == 0 for y in ys)


# -- the bad-input matrix: exit 2, one line naming the input and the position, no output ------------
def cells(*items):
    """A MATLAB 1 x m cell array."""
    c = np.empty((1, len(items)), dtype=object)
    for i, v in enumerate(items):
        c[0, i] = v
    return c


R = np.random.default_rng(0).normal(size=(3, 2))
ONES = np.ones((3, 1))


def mat(**fields):
    return lambda path: scipy.io.savemat(path, fields)


def text(content, encoding="utf-8"):
    return lambda path: path.write_bytes(content.encode(encoding) if isinstance(content, str) else content)


def npz(**arrays):
    return lambda path: np.savez(path, **arrays)


def spnpz(matrix):
    """A matrix file written by scipy.sparse.save_npz."""
    return lambda path: sp.save_npz(path, sp.csr_matrix(matrix))


BAD_INPUTS = [
    # (id, format, {file: writer}, extra arguments, message)
    ("mat string cell", "malsar", {"in.mat": mat(X=cells(R, "hello"), Y=cells(ONES, ONES))}, [],
     "in.mat: cell X{2}: holds text ('hello'), not numbers"),
    ("mat string labels", "malsar", {"in.mat": mat(X=cells(R), Y=cells("abc"))}, [],
     "in.mat: cell Y{1}: holds text ('abc'), not numbers"),
    ("mat struct cell", "malsar", {"in.mat": mat(X=cells({"a": 1}), Y=cells(ONES))}, [],
     "in.mat: cell X{1}: holds a struct or record, not a numeric matrix"),
    ("mat complex", "malsar", {"in.mat": mat(X=cells(R + 1j), Y=cells(ONES))}, [],
     "in.mat: cell X{1}: holds complex numbers"),
    ("mat not a cell", "malsar", {"in.mat": mat(X=R, Y=ONES)}, [],
     "in.mat: field 'X' is a 3 x 2 float64 matrix, expected a cell array"),
    ("mat wrong d", "malsar", {"wrongd.mat": mat(X=cells(R, np.ones((3, 3))), Y=cells(ONES, ONES))}, [],
     "wrongd.mat: cell X{2}: has 3 features, the first task has 2"),
    ("mat nan", "malsar", {"in.mat": mat(X=cells(R, np.array([[1.0, 2], [3, np.nan]])), Y=cells(ONES, ONES[:2]))}, [],
     "in.mat: cell X{2}, row 2, column 2: nan is not a finite number"),
    ("mat inf label", "malsar", {"in.mat": mat(X=cells(R), Y=cells(np.array([[1.0], [np.inf], [1]])))}, [],
     "in.mat: cell Y{1}, row 2: inf is not a finite number"),
    ("mat empty task", "malsar", {"in.mat": mat(X=cells(R, np.zeros((0, 2))), Y=cells(ONES, np.zeros((0, 1))))}, [],
     "in.mat: cell X{2}: no rows (every task needs at least one sample)"),
    ("mat label count", "malsar", {"in.mat": mat(X=cells(R), Y=cells(ONES[:2]))}, [],
     "in.mat: cell Y{1}: has shape (2, 1), expected 3 labels"),
    ("mat 3-D", "malsar", {"in.mat": mat(X=cells(np.ones((3, 2, 2))), Y=cells(ONES))}, [],
     "in.mat: cell X{1}: expected a 2-D matrix"),
    ("mat empty file", "malsar", {"in.mat": text(b"")}, [], "in.mat: not a readable MATLAB file"),
    ("csv not utf-8", "csv", {"in.csv": text("task,f1,y\nx,1,1\ncaf\xe9,1,1\n", "latin-1")}, [],
     "in.csv: line 3: byte 0xe9 is not UTF-8 text"),
    ("csv NUL", "csv", {"in.csv": text(b"task,f1,y\nx,1\x00,1\n")}, [], "in.csv: line 2: a NUL byte"),
    ("csv extra cell", "csv", {"in.csv": text("task,f1,y\nx,1,1\nx,2,-1,5\n")}, [],
     "in.csv: line 3: 4 cells, the header has 3"),
    ("csv missing cell", "csv", {"in.csv": text("task,f1,y\nx,1,1\n\nx,2\n")}, [],
     "in.csv: line 4: 2 cells, the header has 3"),
    ("csv label not a number", "csv", {"in.csv": text("task,f1,y\nx,1,yes\n")}, [],
     "in.csv: line 2, column 'y': 'yes' is not a number"),
    ("csv empty cell", "csv", {"in.csv": text("task,f1,y\nx,,1\n")}, [],
     "in.csv: line 2, column 'f1': '' is not a number"),
    ("csv nan", "csv", {"in.csv": text("task,f1,y\nx,1,1\nx,2,nan\n")}, [],
     "in.csv: line 3, column 'y': 'nan' is not a finite number"),
    ("csv inf", "csv", {"in.csv": text("task,f1,y\nx,-inf,1\n")}, [],
     "in.csv: line 2, column 'f1': '-inf' is not a finite number"),
    ("csv no task column", "csv", {"in.csv": text("name,f1,y\nx,1,1\n")}, [],
     "in.csv: line 1: column 'task' is missing (columns: 'name', 'f1', 'y')"),
    ("csv no name column", "csv", {"in.csv": text("task,f1,y\nx,1,1\n")}, ["--task-column", "name"],
     "in.csv: line 1: column 'name' is missing"),
    ("csv label column twice", "csv", {"in.csv": text("task,f1,y,y\nx,1,1,1\n")}, [],
     "in.csv: line 1: column 'y' appears 2 times"),
    ("csv no features", "csv", {"in.csv": text("task,y\nx,1\n")}, [], "in.csv: line 1: no feature columns"),
    ("csv empty task name", "csv", {"in.csv": text("task,f1,y\n,1,1\n")}, [],
     "in.csv: line 2, column 'task': empty task name"),
    ("csv header only", "csv", {"in.csv": text("task,f1,y\n")}, [], "in.csv: no data lines after the header"),
    ("csv empty", "csv", {"in.csv": text("")}, [], "in.csv: empty CSV file"),
    ("csv unclosed quote", "csv", {"in.csv": text('task,f1,y\nx,1,1\nx,"2\n,1\n')}, [],
     "in.csv: line 3: 2 cells, the header has 3"),
    ("csv name with a line break", "csv", {"in.csv": text('task,f1,y\nx,1,1\n"a\nb",1,1\n')}, [],
     "in.csv: line 3, column 'task': task name 'a\\nb' holds a line break or control character"),
    ("npz name", "npz", {"in.npz": npz(X_0=np.ones((2, 2)), y_0=np.ones(2), name_0=np.array("a\tb"))}, [],
     "in.npz: array 'name_0': task name 'a\\tb' holds a line break"),
    ("svmlight bad feature", "svmlight", {"in.svm": text("1 qid:1 1:0.5\n-1 qid:2 2:1\n1 qid:1 x:1\n")}, [],
     "in.svm: line 3: 'x:1' is not INDEX:VALUE"),
    ("svmlight bad label", "svmlight", {"in.svm": text("# comment\n1 qid:1 1:1\n\nfoo qid:2 2:1\n")}, [],
     "in.svm: line 4: label 'foo' is not a finite number"),
    ("svmlight nan", "svmlight", {"in.svm": text("1 qid:1 1:1\n-1 qid:2 2:nan\n")}, [],
     "in.svm: line 2: feature 2: 'nan' is not a finite number"),
    ("svmlight overflow", "svmlight", {"in.svm": text("1 qid:1 1:1e400\n-1 qid:2 2:1\n")}, [],
     "in.svm: line 1: feature 1: '1e400' is not a finite number"),
    ("svmlight unsorted", "svmlight", {"in.svm": text("1 qid:1 3:1 1:1\n-1 qid:2 2:1\n")}, [],
     "in.svm: line 1: feature index 1 is not above the previous one"),
    ("svmlight missing qid", "svmlight", {"in.svm": text("1 qid:1 1:1\n-1 2:1\n-1 qid:2 1:1\n")}, [],
     "in.svm: line 2: no 'qid:' task id"),
    ("svmlight bad qid", "svmlight", {"in.svm": text("1 qid:1 1:1\n-1 qid:b 2:1\n")}, [],
     "in.svm: line 2: qid:'b' is not qid:INTEGER"),
    ("svmlight n-features", "svmlight", {"in.svm": text("1 qid:1 1:1 3:1\n-1 qid:2 2:1\n")}, ["--n-features", "2"],
     "in.svm: line 1: feature index 3 is beyond --n-features 2"),
    ("svmlight second file", "svmlight", {"a.svm": text("1 1:1\n"), "b.svm": text("1 1:1\nbad 1:1\n")}, [],
     "b.svm: line 2: label 'bad' is not a finite number"),
    ("svmlight empty task file", "svmlight", {"a.svm": text("1 1:1\n"), "b.svm": text("# nothing\n")}, [],
     "b.svm: no rows"),
    ("svmlight empty", "svmlight", {"in.svm": text("")}, [], "in.svm: no data lines"),
    ("npz text", "npz", {"in.npz": npz(X_0=np.array([["a", "b"]]), y_0=np.ones(1))}, [],
     "in.npz: array 'X_0': holds text ('a'), not numbers"),
    ("npz objects", "npz", {"in.npz": npz(X_0=np.array([[1, None]], dtype=object), y_0=np.ones(1))}, [],
     "in.npz: array 'X_0': holds Python objects"),
    ("npz labels", "npz", {"in.npz": npz(X_0=np.ones((2, 2)), y_0=np.array(["a", "b"]))}, [],
     "in.npz: array 'y_0': holds text ('a'), not numbers"),
    ("npz nan", "npz", {"in.npz": npz(X_0=np.ones((2, 2)), y_0=np.ones(2), X_1=np.array([[1, 2], [np.nan, 1]]),
                                      y_1=np.ones(2))}, [], "in.npz: array 'X_1', row 2, column 1: nan is not"),
    ("npz stacked lengths", "npz", {"in.npz": npz(X=np.ones((3, 2)), y=np.ones(2), tasks=np.array([1, 1, 2]))}, [],
     "in.npz: arrays X (3, 2), y (2,) and tasks (3,) need one row, label and task id per sample"),
    ("npz stacked inf", "npz", {"in.npz": npz(X=np.ones((3, 2)), y=np.array([1, 1, np.inf]), tasks=np.array([1, 2, 2]))},
     [], "in.npz: array 'y', element 3: inf is not a finite number"),
    ("npz empty task", "npz", {"in.npz": npz(X_0=np.ones((0, 2)), y_0=np.ones(0))}, [],
     "in.npz: array 'X_0': no rows"),
    ("npz a .npy file", "npz", {"in.npz": lambda path: np.save(open(path, "wb"), np.ones(3))}, [],
     "in.npz: not a .npz archive"),
    ("npz text file", "npz", {"in.npz": text("hello")}, [], "in.npz: not a .npz archive"),
    ("mnist not gzip", "mnist", {"img.gz": text("not gzip"), "lab.gz": text("x")}, [], "img.gz: cannot be read"),
    ("directory", "csv", {"in.csv": lambda path: path.mkdir()}, [], "in.csv: is a directory, expected a file"),
    ("two csv files", "csv", {"a.csv": text("task,f,y\nx,1,1\n"), "b.csv": text("")}, [],
     "csv takes one input, got 2"),
] + [
    # --features / --drop (issue 16)
    (f"csv {name}", "csv", {"in.csv": text("task,f1,f2,leak,y\nx,1,2,9,1\n")}, extra, message)
    for name, extra, message in [
        ("unknown feature", ["--features", "f1,zz"],
         "in.csv: line 1: --features: no column 'zz' (columns: 'task', 'f1', 'f2', 'leak', 'y')"),
        ("misspelt drop", ["--drop", "lek"], "in.csv: line 1: --drop: no column 'lek' (columns: 'task', 'f1', "
                                             "'f2', 'leak', 'y'); did you mean 'leak'?"),
        ("index beyond", ["--features", "1-7"],
         "in.csv: line 1: --features: column index 7 is beyond the last column (4; indices start at 0)"),
        ("feature is the label", ["--features", "f1,y"], "in.csv: line 1: --features: column 'y' is the label column"),
        ("drop the task column", ["--drop", "0"], "in.csv: line 1: --drop: column 'task' is the task column"),
        ("backwards range", ["--features", "f2:f1"], "in.csv: line 1: --features: range 'f2:f1' runs backwards"),
        ("empty item", ["--features", "f1,,f2"], "in.csv: line 1: --features: an empty column name in 'f1,,f2'"),
        ("drop every feature", ["--drop", "1-3"],
         "in.csv: line 1: no feature columns (only 'task' and 'y' after --features/--drop)"),
    ]
] + [
    ("csv duplicate feature name", "csv", {"in.csv": text("task,f,f,y\nx,1,2,1\n")}, ["--drop", "f"],
     "in.csv: line 1: --drop: column 'f' appears 2 times (give its index)"),
    ("features for svmlight", "svmlight", {"in.svm": text("1 qid:1 1:1\n-1 qid:2 1:1\n")}, ["--features", "1"],
     "--features selects CSV columns; --format svmlight has none"),
    # --positive-label / --labels (issue 16)
    ("csv unmapped label", "csv", {"in.csv": text("task,f1,y\nx,1,yes\nx,2,no\nx,3,maybe\n")},
     ["--labels", "yes:1,no:-1"], "in.csv: line 4, column 'y': label 'maybe' is not in --labels ('yes', 'no')"),
    ("csv positive label matches nothing", "csv", {"in.csv": text("task,f1,y\nx,1,0\nx,2,1\n")},
     ["--positive-label", "2"], "in.csv: no label equals --positive-label '2' (labels read: 0, 1)"),
    ("csv nan label mapped", "csv", {"in.csv": text("task,f1,y\nx,1,1\nx,1,nan\n")}, ["--positive-label", "1"],
     "in.csv: line 3, column 'y': nan is not a finite number"),
    ("mat unmapped label", "malsar", {"in.mat": mat(X=cells(R), Y=cells(np.array([[1.0], [3], [2]])))},
     ["--labels", "1:1,2:-1"], "in.mat: cell Y{1}, row 2: label 3 is not in --labels (1, 2)"),
    ("svmlight unmapped label", "svmlight", {"in.svm": text("1 qid:1 1:1\n5 qid:2 1:1\n")},
     ["--labels", "1:1,0:-1"], "in.svm: line 2: label 5 is not in --labels (1, 0)"),
    ("npz unmapped text label", "npz", {"in.npz": npz(X_0=np.ones((2, 2)), y_0=np.array(["a", "b"]))},
     ["--labels", "a:1"], "in.npz: array 'y_0', element 2: label 'b' is not in --labels ('a')"),
    ("labels not LABEL:VALUE", "csv", {"in.csv": text("task,f1,y\nx,1,1\n")}, ["--labels", "yes"],
     "--labels: 'yes' is not LABEL:VALUE (e.g. --labels 0:-1,1:1)"),
    ("labels value not a number", "csv", {"in.csv": text("task,f1,y\nx,1,1\n")}, ["--labels", "a:b"],
     "--labels: in 'a:b', 'b' is not a finite number"),
    ("labels mapped twice", "csv", {"in.csv": text("task,f1,y\nx,1,1\n")}, ["--labels", "1:1,1.0:-1"],
     "--labels: label '1.0' is mapped twice"),
    ("both label options", "csv", {"in.csv": text("task,f1,y\nx,1,1\n")},
     ["--positive-label", "1", "--labels", "1:1"], "give --positive-label or --labels, not both"),
    # MALSAR variants: fea/gnd, one task a file (issue 16)
    ("fea without gnd", "malsar", {"in.mat": mat(fea=R)}, [], "in.mat: field 'gnd' is missing"),
    ("no MALSAR layout", "malsar", {"in.mat": mat(A=R)}, [], "in.mat: field 'X' is missing (MALSAR files hold "
     "cell arrays X and Y or a matrix 'fea' and labels 'gnd'; variables: A)"),
    ("several mat files without fea", "malsar", {"a.mat": mat(fea=R, gnd=ONES), "b.mat": mat(X=cells(R), Y=cells(ONES))},
     [], "b.mat: field 'fea' is missing (several .mat files are one task each"),
    ("fea files of different d", "malsar", {"a.mat": mat(fea=R, gnd=ONES), "b.mat": mat(fea=np.ones((3, 3)), gnd=ONES)},
     [], "b.mat: field 'fea': has 3 features, the first task has 2"),
    ("gnd count", "malsar", {"a.mat": mat(fea=R, gnd=ONES[:2])}, [], "a.mat: field 'gnd': has shape (2, 1), expected 3"),
    ("sparse fea nan", "malsar", {"a.mat": mat(fea=sp.csc_matrix(np.array([[1.0, 0], [0, np.nan]])), gnd=ONES[:2])}, [],
     "a.mat: field 'fea', row 2, column 2: nan is not a finite number"),
    ("gnd text", "malsar", {"a.mat": mat(fea=R, gnd="abc")}, [], "a.mat: field 'gnd': holds text"),
    # npz: sparse matrices from scipy.sparse.save_npz and a labels file (issue 16)
    ("save_npz without labels", "npz", {"a.npz": spnpz(R)}, [], "a.npz: a matrix from scipy.sparse.save_npz holds no "
     "labels: give a labels .npz too (np.savez('labels.npz', a=y))"),
    ("labels array missing", "npz", {"a.npz": spnpz(R), "b.npz": spnpz(R), "labels.npz": npz(a=np.ones(3))}, [],
     "labels.npz: no array 'b' (the labels of "),
    ("labels array of no matrix", "npz", {"a.npz": spnpz(R), "labels.npz": npz(a=np.ones(3), c=np.ones(2))}, [],
     "labels.npz: array 'c' is the labels of no matrix file (give c.npz too)"),
    ("two labels files", "npz", {"a.npz": spnpz(R), "l1.npz": npz(a=np.ones(3)), "l2.npz": npz(a=np.ones(3))}, [],
     "l2.npz: not a matrix from scipy.sparse.save_npz"),
    ("sparse label count", "npz", {"a.npz": spnpz(R), "labels.npz": npz(a=np.ones(2))}, [],
     "labels.npz: array 'a': has shape (2,), expected 3 labels"),
    ("sparse nan", "npz", {"a.npz": spnpz(np.array([[1.0, 0], [0, np.nan]])), "labels.npz": npz(a=np.ones(2))}, [],
     "a.npz: row 2, column 2: nan is not a finite number"),
    ("single matrix without y", "npz", {"a.npz": spnpz(R), "labels.npz": npz(z=np.ones(3))}, [],
     "labels.npz: no array 'y' or 'a' (the labels of "),
    ("stacked sparse tasks length", "npz", {"a.npz": spnpz(R), "labels.npz": npz(y=np.ones(3), tasks=np.ones(2))}, [],
     "labels.npz: arrays y (3,) and tasks (2,) need one label and task id"),
    ("a matrix file that is not save_npz", "npz", {"a.npz": spnpz(R), "b.npz": npz(X=R), "labels.npz": npz(a=ONES)}, [],
     "not a matrix from scipy.sparse.save_npz"),
    # --stream (issue 16)
    ("stream task labels not +-1", "csv", {"in.csv": text("task,f1,y\nx,1,1\nx,2,2\n")}, ["--stream"],
     "in.csv: line 3, column 'y': label 2 is not -1 or +1 (tasks become stream columns of +-1 labels"),
    ("stream task labels text", "csv", {"in.csv": text("task,f1,y\nx,1,yes\n")}, ["--stream"],
     "in.csv: line 2, column 'y': 'yes' is not a number"),
    ("stream mat task labels", "malsar", {"in.mat": mat(X=cells(R), Y=cells(np.array([[1.0], [0], [1]])))}, ["--stream"],
     "in.mat: cell Y{1}, row 2: label 0 is not -1 or +1"),
    ("shuffle without stream", "csv", {"in.csv": text("task,f1,y\nx,1,1\n")}, ["--shuffle"],
     "--shuffle orders the rounds of a stream: add --stream"),
    ("stream non-integer class", "csv", {"in.csv": text("f1,y\n1,0.5\n2,1\n")}, ["--stream"],
     "in.csv: line 2, column 'y': label 0.5 is not a class"),
    ("stream named task column missing", "csv", {"in.csv": text("f1,y\n1,1\n")}, ["--stream", "--task-column", "t"],
     "in.csv: line 1: column 't' is missing"),
    ("stream too many classes", "csv", {"in.csv": text("f1,y\n" + "".join(f"1,{k}\n" for k in range(1001)))},
     ["--stream"], "in.csv: 1001 distinct labels; a single-label stream has one column a class (at most 1000)"),
    ("stream 0/1 label matrix", "malsar", {"in.mat": mat(X=R, Y=np.array([[0, 1], [1, 0], [1, 1]]))}, ["--stream"],
     "in.mat: field 'Y': holds only 0 and 1, and a 0 marks a dormant label"),
    ("stream label matrix value", "malsar", {"in.mat": mat(X=R, Y=np.array([[1, 2], [1, -1], [1, 1]]))}, ["--stream"],
     "in.mat: field 'Y', row 1, column 2: 2 is not -1, 0 or +1"),
    ("stream multi-label --labels", "svmlight", {"in.svm": text("1 1:1\n1,2 1:1\n")}, ["--stream", "--labels", "1:1,2:-1"],
     "in.svm: line 2: 2 labels: --labels maps one label a line"),
    ("stream multi-label bad label", "svmlight", {"in.svm": text("1 1:1\n1,x 1:1\n")}, ["--stream"],
     "in.svm: line 2: label 'x' of '1,x' is not a finite number"),
    ("stream multi-label nan feature", "svmlight", {"in.svm": text("1 1:1\n1,2 1:nan\n")}, ["--stream"],
     "in.svm: line 2: feature 1: 'nan' is not a finite number"),
    ("multi-label without stream", "svmlight", {"in.svm": text("1 qid:1 1:1\n1,2 qid:2 1:1\n")}, [],
     "in.svm: line 2: label '1,2' is several labels: a multi-label line (--stream reads multi-label files without"),
    ("svmlight without qid", "svmlight", {"in.svm": text("1 1:1\n2 1:1\n")}, [],
     "in.svm: a single svmlight file needs 'qid:' task ids (or give one file per task; --stream reads"),
    ("stream npz label count", "npz", {"in.npz": npz(X=R, y=np.ones(2))}, ["--stream"],
     "in.npz: array 'y': has shape (2,), expected 3 labels"),
    ("stream npz X nan", "npz", {"in.npz": npz(X=np.array([[1.0, np.inf]]), y=np.ones(1))}, ["--stream"],
     "in.npz: array 'X', row 1, column 2: inf is not a finite number"),
    ("stream of a stream file", "tasks", {"in.h5": lambda path: store.write_stream(path, np.eye(2), np.ones((2, 1)))},
     ["--stream"], "in.h5: attribute 'format' is 'hpcmtl-stream', expected 'hpcmtl-tasks'"),
    ("tasks labels unmapped", "tasks", {"in.h5": lambda path: store.write_tasks(path, [np.eye(2)], [np.array([1.0, 3])],
                                                                                 names=["a"])},
     ["--labels", "1:1"], "in.h5: task 'a', row 2: label 3 is not in --labels (1)"),
]


@pytest.mark.parametrize("name,fmt,files,extra,message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_matrix(tmp_path, capsys, name, fmt, files, extra, message):
    from hpcmtl.cli import main
    for fname, write in files.items():
        write(tmp_path / fname)
    out = tmp_path / "out.h5"
    code = main(["data", "convert", "--format", fmt] + [str(tmp_path / f) for f in files] + [str(out)] + extra)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and message in err, err
    assert "out.h5" not in err                                  # the input is named, not the output
    assert sorted(os.listdir(tmp_path)) == sorted(files)        # nothing written, nothing left behind


@pytest.mark.parametrize("fmt,fname,write,message", [
    ("csv", "in.csv", text("task,f1,y\nx,1,1\ncaf\xe9,1,1\n", "latin-1"), "in.csv: line 3: byte 0xe9 is not UTF-8"),
    ("malsar", "wrongd.mat", mat(X=cells(R, np.ones((3, 3))), Y=cells(ONES, ONES)), "wrongd.mat: cell X{2}: has 3"),
    ("malsar", "in.mat", mat(X=cells(R, "hello"), Y=cells(ONES, ONES)), "in.mat: cell X{2}: holds text"),
    ("csv", "in.csv", text("task,f1,y\nx,1,1\nx,2,-1,5\n"), "in.csv: line 3: 4 cells, the header has 3"),
])
def test_reported_converter_cases_end_with_one_line_and_exit_2(tmp_path, fmt, fname, write, message):
    write(tmp_path / fname)
    r = run_hpcmtl(["data", "convert", "--format", fmt, tmp_path / fname, tmp_path / f"{fname}.h5"])
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert not (tmp_path / f"{fname}.h5").exists()


def test_csv_byte_order_mark_and_crlf_are_read(tmp_path):
    (tmp_path / "d.csv").write_bytes("task,f1,y\r\nx,1,1\r\nx,2,-1\r\n".encode("utf-8-sig"))
    Xs, ys, names = formats.from_csv(str(tmp_path / "d.csv"))
    assert names == ["x"]
    assert_array_equal(Xs[0], [[1], [2]])


def test_svmlight_finds_the_line_of_a_bad_value_in_a_large_file(tmp_path):
    lines = [f"{1 if i % 2 else -1} qid:{i % 3} {1 + i % 5}:{i}.5" for i in range(20000)]
    lines[15321] = "1 qid:1 2:0.5 4:nan"
    (tmp_path / "big.svm").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"big\.svm: line 15322: feature 4: 'nan' is not a finite number"):
        formats.from_svmlight([str(tmp_path / "big.svm")])


def test_generated_tasks_name_their_source(tmp_path):
    (tmp_path / "p.review").write_text("good:1 #label#:positive\nnice:x #label#:positive\n")
    with pytest.raises(InputError, match=r"p\.review: line 2: 'nice:x' is not WORD:COUNT"):
        formats.read_processed(str(tmp_path / "p.review"))
    (tmp_path / "p.review").write_text("good:1 #label#:neutral\n")
    with pytest.raises(InputError, match=r"p\.review: line 1: '#label#:neutral', expected positive or negative"):
        formats.read_processed(str(tmp_path / "p.review"))
    labels = np.repeat(np.arange(9), 2)                      # no image of digit 9
    write_idx(tmp_path / "img.gz", np.zeros((18, 28, 28)))
    write_idx(tmp_path / "lab.gz", labels)
    with pytest.raises(InputError, match=r"lab\.gz: 0 images of digit 9 and 18 of other digits"):
        formats.mnist_one_vs_all(str(tmp_path / "img.gz"), str(tmp_path / "lab.gz"))
    (tmp_path / "reut2-000.sgm").write_text(SGML.replace('NEWID="2"', 'NEWID="two"'), encoding="latin-1")
    with pytest.raises(InputError, match=r"reut2-000\.sgm: document NEWID='two': not an integer"):
        formats.read_reuters(str(tmp_path))


# -- issue 16: columns, label mapping, MALSAR fea/gnd, sparse npz, streams -----------------------------
def convert(capsys, *args):
    """``hpcmtl data convert ARGS`` in this process: (exit code, stdout, stderr)."""
    from hpcmtl.cli import main
    code = main(["data", "convert"] + [str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_stream(path):
    import h5py
    with store.StreamFile(path) as s:
        X, _ = s.read_rounds(0, s.n_rounds)
        Y = s.read_labels(0, s.n_rounds)
        names = s.label_names
    with h5py.File(path, "r") as f:
        attrs = dict(f.attrs)
    return sp.csr_matrix(X).toarray(), np.asarray(Y), names, attrs


LEAKY = "task,x1,x2,other_target,x3,y\na,1,2,0.5,3,yes\na,2,1,0.1,4,no\nb,0,1,0.7,5,yes\nb,1,1,0.2,6,no\n"


@pytest.mark.parametrize("option,cols,expected", [
    ("--drop", "other_target", ["x1", "x2", "x3"]),
    ("--drop", "3", ["x1", "x2", "x3"]),
    ("--features", "x1,x3", ["x1", "x3"]),
    ("--features", "x3,1", ["x1", "x3"]),               # the file's column order
    ("--features", "1-2", ["x1", "x2"]),
    ("--features", "x1:x2,4", ["x1", "x2", "x3"]),
    ("--features", "x2:x3", ["x2", "other_target", "x3"]),
])
def test_csv_features_and_drop(tmp_path, capsys, option, cols, expected):
    (tmp_path / "d.csv").write_text(LEAKY)
    code, out, err = convert(capsys, "--format", "csv", tmp_path / "d.csv", tmp_path / "d.h5", option, cols,
                             "--positive-label", "yes")
    assert code == 0, err
    header = LEAKY.split("\n")[0].split(",")
    line = out.splitlines()[0]
    assert line.endswith(f"{len(expected)} feature column{'s' if len(expected) > 1 else ''} of 6: "
                         f"{', '.join(expected)}; task column 'task', label column 'y'"
                         + (f"; left out: {', '.join(c for c in header[1:5] if c not in expected)}"
                            if len(expected) < 4 else "")), line
    blocks, names, d = store.read_all_tasks(tmp_path / "d.h5")
    rows = [r.split(",") for r in LEAKY.split("\n")[1:3]]
    assert names == ["a", "b"] and d == len(expected)
    assert_array_equal(blocks[0].X, [[float(r[header.index(c)]) for c in expected] for r in rows])
    assert_array_equal(blocks[0].y, [1, -1])


def test_csv_column_named_like_a_range_and_without_selection(tmp_path, capsys):
    (tmp_path / "d.csv").write_text("task,a-b,c,y\nt,1,2,1\nt,3,4,-1\n")
    Xs, _, _ = formats.from_csv(str(tmp_path / "d.csv"), features="a-b")
    assert_array_equal(Xs[0], [[1], [3]])
    Xs, _, _ = formats.from_csv(str(tmp_path / "d.csv"), features="a-b:c")
    assert_array_equal(Xs[0], [[1, 2], [3, 4]])
    code, out, err = convert(capsys, "--format", "csv", tmp_path / "d.csv", tmp_path / "d.h5")
    assert code == 0 and out.splitlines()[0].endswith("2 feature columns of 4: a-b, c; task column 'task', "
                                                      "label column 'y'")


def test_csv_feature_line_is_one_short_line_for_wide_files(tmp_path, capsys):
    header = ["task"] + [f"px{k}" for k in range(784)] + ["y"]
    rows = [",".join(["t"] + ["0.5"] * 784 + [str(s)]) for s in (1, -1)]
    (tmp_path / "wide.csv").write_text(",".join(header) + "\n" + "\n".join(rows) + "\n")
    code, out, err = convert(capsys, "--format", "csv", tmp_path / "wide.csv", tmp_path / "w.h5", "--drop", "px5-px783")
    assert code == 0, err
    line = out.splitlines()[0]
    assert line.endswith("5 feature columns of 786: px0, px1, px2, px3, px4; task column 'task', label column 'y'; "
                         "left out: px5, px6, px7, px8, px9, px10, ..., px782, px783 (779 in all)"), line
    code, out, err = convert(capsys, "--format", "csv", tmp_path / "wide.csv", tmp_path / "w2.h5")
    assert "784 feature columns of 786: px0, px1, px2, px3, px4, px5, ..., px782, px783 (784 in all)" in out
    assert len(out.splitlines()[0]) < 200


def test_label_mapping_for_every_format(tmp_path, capsys):
    rule = lambda **kw: formats.LabelRule(**kw)            # noqa: E731
    # csv: text labels
    (tmp_path / "d.csv").write_text("task,f,y\nt,1,spam\nt,2,ham\nu,3,ham\nu,4,spam\n")
    _, ys, _ = formats.from_csv(str(tmp_path / "d.csv"), labels=rule(positive="spam"))
    assert_array_equal(np.concatenate(ys), [1, -1, -1, 1])
    _, ys, _ = formats.from_csv(str(tmp_path / "d.csv"), labels=rule(mapping="spam:1, ham:-1"))
    assert_array_equal(np.concatenate(ys), [1, -1, -1, 1])
    # malsar cells and fea/gnd files
    scipy.io.savemat(tmp_path / "c.mat", {"X": cells(R, R), "Y": cells(np.array([[0], [1], [1]]), np.zeros((3, 1)))})
    _, ys, _ = formats.from_malsar(str(tmp_path / "c.mat"), rule(mapping="0:-1,1:1"))
    assert_array_equal(np.concatenate(ys), [-1, 1, 1, -1, -1, -1])
    scipy.io.savemat(tmp_path / "g.mat", {"fea": R, "gnd": np.array([[1], [2], [3]])})
    _, ys, _ = formats.from_malsar([str(tmp_path / "g.mat")], rule(positive="3"))
    assert_array_equal(ys[0], [-1, -1, 1])
    # svmlight (numbers: 1.0 matches the key 1)
    (tmp_path / "q.svm").write_text("1 qid:1 1:1\n0 qid:1 2:1\n1 qid:2 1:1\n0 qid:2 1:2\n")
    _, ys, _ = formats.from_svmlight([str(tmp_path / "q.svm")], labels=rule(mapping="0:-1,1.0:1"))
    assert_array_equal(np.concatenate(ys), [1, -1, 1, -1])
    # npz: numbers and text labels
    np.savez(tmp_path / "a.npz", X_0=np.ones((2, 2)), y_0=np.array(["pos", "neg"]))
    _, ys, _ = formats.from_npz(str(tmp_path / "a.npz"), rule(positive="pos"))
    assert_array_equal(ys[0], [1, -1])
    # an hpcmtl task dataset
    store.write_tasks(tmp_path / "t.h5", [np.eye(3)], [np.array([2.0, 7, 2])], names=["only"])
    _, ys, _ = formats.from_task_file(str(tmp_path / "t.h5"), rule(mapping="2:-1,7:1"))
    assert_array_equal(ys[0], [-1, 1, -1])
    # mnist, mds, reuters: generated +-1 labels, flipped by --positive-label -1
    labels = np.repeat(np.arange(10), 2)
    write_idx(tmp_path / "img.gz", np.zeros((20, 28, 28)))
    write_idx(tmp_path / "lab.gz", labels)
    plain = formats.from_mnist([str(tmp_path / "img.gz"), str(tmp_path / "lab.gz")])[1]
    flipped = formats.from_mnist([str(tmp_path / "img.gz"), str(tmp_path / "lab.gz")], labels=rule(positive="-1"))[1]
    assert all(np.array_equal(a, -b) for a, b in zip(plain, flipped))
    books = tmp_path / "mds" / "books"
    books.mkdir(parents=True)
    (books / "positive.review").write_text("good:2 #label#:positive\n")
    (books / "negative.review").write_text("bad:1 #label#:negative\n")
    _, ys, _ = formats.from_mds([str(books)], 64, labels=rule(mapping="1:-1,-1:1"))
    assert_array_equal(ys[0], [-1, 1])
    (tmp_path / "reuters").mkdir()
    (tmp_path / "reuters" / "reut2-000.sgm").write_text(SGML, encoding="latin-1")
    train, test = formats.from_reuters(str(tmp_path / "reuters"), min_docs=1, labels=rule(positive="-1"))
    plain_train, plain_test = formats.from_reuters(str(tmp_path / "reuters"), min_docs=1)
    assert all(np.array_equal(a, -b) for a, b in zip(train[1], plain_train[1]))
    assert all(np.array_equal(a, -b) for a, b in zip(test[1], plain_test[1]))


def test_label_mapping_on_the_command_line_is_recorded(tmp_path, capsys):
    (tmp_path / "d.csv").write_text("task,f,y\nt,1,3\nt,2,5\n")
    code, _, err = convert(capsys, "--format", "csv", tmp_path / "d.csv", tmp_path / "d.h5", "--labels=3:-1,5:1")
    assert code == 0, err
    import h5py
    with h5py.File(tmp_path / "d.h5", "r") as f:
        assert f.attrs["label_map"] == "--labels 3:-1,5:1"
    assert_array_equal(store.read_all_tasks(tmp_path / "d.h5")[0][0].y, [-1, 1])


def test_malsar_fea_gnd_files_and_sparse_cells(tmp_path, capsys):
    rng = np.random.default_rng(1)
    dense = {}
    for name, n in (("books", 5), ("dvd", 4)):
        fea = sp.random(n, 6, density=0.4, random_state=n, format="csc")
        dense[name] = fea.toarray()
        scipy.io.savemat(tmp_path / f"{name}.mat", {"fea": fea, "gnd": rng.integers(1, 3, size=(n, 1))})
    code, out, err = convert(capsys, "--format", "malsar", tmp_path / "books.mat", tmp_path / "dvd.mat",
                             tmp_path / "bd.h5", "--labels", "1:-1,2:1")
    assert code == 0, err
    blocks, names, d = store.read_all_tasks(tmp_path / "bd.h5")
    assert names == ["books", "dvd"] and d == 6 and info_json(tmp_path / "bd.h5")["storage"] == "csr"
    assert_array_equal(blocks[1].X.toarray(), dense["dvd"])
    assert set(np.concatenate([b.y for b in blocks])) <= {-1.0, 1.0}
    Xs, ys, names = formats.from_malsar(str(tmp_path / "books.mat"))          # one file: one task
    assert names == ["books"] and Xs[0].shape == (5, 6) and set(ys[0]) <= {1.0, 2.0}
    # the X/Y cell layout with sparse cells (documented in docs/formats.md)
    scipy.io.savemat(tmp_path / "cells.mat", {"X": cells(sp.csc_matrix(dense["books"]), sp.csc_matrix(dense["dvd"])),
                                              "Y": cells(np.ones((5, 1)), -np.ones((4, 1)))})
    Xs, ys, names = formats.from_malsar(str(tmp_path / "cells.mat"))
    assert names == ["task001", "task002"] and all(sp.issparse(X) for X in Xs)
    assert_array_equal(Xs[0].toarray(), dense["books"])


def test_npz_sparse_matrices_and_a_labels_file(tmp_path, capsys):
    mats = {"books": sp.random(5, 7, density=0.3, random_state=2, format="csr"),
            "dvd": sp.random(4, 7, density=0.3, random_state=3, format="csc")}
    for name, X in mats.items():
        sp.save_npz(tmp_path / f"{name}.npz", X)
    np.savez(tmp_path / "labels.npz", books=[1, -1, 1, -1, 1], dvd=[1, 1, -1, -1])
    code, _, err = convert(capsys, "--format", "npz", tmp_path / "books.npz", tmp_path / "dvd.npz",
                           tmp_path / "labels.npz", tmp_path / "bd.h5")
    assert code == 0, err
    blocks, names, _ = store.read_all_tasks(tmp_path / "bd.h5")
    assert names == ["books", "dvd"] and info_json(tmp_path / "bd.h5")["storage"] == "csr"
    assert_array_equal(blocks[1].X.toarray(), mats["dvd"].toarray())
    assert_array_equal(blocks[1].y, [1, 1, -1, -1])
    # one matrix, stacked labels and task ids
    np.savez(tmp_path / "stacked.npz", y=[1, -1, 1, -1, 1], tasks=["p", "q", "p", "q", "q"])
    Xs, ys, names = formats.from_npz([str(tmp_path / "books.npz"), str(tmp_path / "stacked.npz")])
    assert names == ["p", "q"] and [X.shape[0] for X in Xs] == [2, 3]
    assert_array_equal(Xs[0].toarray(), mats["books"].toarray()[[0, 2]])
    # one matrix and y: one task
    np.savez(tmp_path / "y.npz", y=[1, -1, 1, -1, 1])
    Xs, ys, names = formats.from_npz([str(tmp_path / "books.npz"), str(tmp_path / "y.npz")])
    assert names == ["books"] and same(ys[0], [1, -1, 1, -1, 1])
    # a dense X, y file: one task named after the file
    np.savez(tmp_path / "plain.npz", X=np.eye(3), y=[1, -1, 1])
    assert formats.from_npz(str(tmp_path / "plain.npz"))[2] == ["plain"]


def same(a, b):
    """assert_array_equal that returns True (to join other checks in one assert)."""
    assert_array_equal(a, b)
    return True


# streams ---------------------------------------------------------------------------------------------
def test_stream_from_a_task_dataset_marks_other_tasks_dormant(tmp_path, capsys):
    (tmp_path / "d.csv").write_text("task,f1,f2,y\na,1,0,1\nb,0,1,-1\na,2,0,-1\nb,0,2,1\nc,1,1,1\n")
    code, out, err = convert(capsys, "--format", "csv", tmp_path / "d.csv", tmp_path / "s.h5", "--stream")
    assert code == 0, err
    assert out.splitlines()[-1] == (f"wrote {tmp_path / 's.h5'}: 5 rounds, 2 features, 3 label columns "
                                    "(3 tasks, 0 on the other tasks' rows): a, b, c")
    X, Y, names, attrs = read_stream(tmp_path / "s.h5")
    assert names == ["a", "b", "c"] and attrs["order"] == "file" and attrs["source_format"] == "csv"
    assert_array_equal(X, [[1, 0], [2, 0], [0, 1], [0, 2], [1, 1]])                   # task by task
    assert_array_equal(Y, [[1, 0, 0], [-1, 0, 0], [0, -1, 0], [0, 1, 0], [0, 0, 1]])
    # the same from an hpcmtl task dataset
    convert(capsys, "--format", "csv", tmp_path / "d.csv", tmp_path / "t.h5")
    code, _, err = convert(capsys, "--format", "tasks", tmp_path / "t.h5", tmp_path / "s2.h5", "--stream")
    assert code == 0, err
    assert_array_equal(read_stream(tmp_path / "s2.h5")[1], Y)


def test_stream_from_single_label_and_multi_label_files(tmp_path, capsys):
    (tmp_path / "mc.svm").write_text("3 1:0.5\n2 2:1\n3 1:1 3:1\n1 3:2\n")
    code, out, err = convert(capsys, "--format", "svmlight", tmp_path / "mc.svm", tmp_path / "mc.h5", "--stream")
    assert code == 0 and "(single-label, 3 classes): 1, 2, 3" in out, err
    _, Y, names, _ = read_stream(tmp_path / "mc.h5")
    assert names == ["1", "2", "3"]
    assert_array_equal(Y, [[-1, -1, 1], [-1, 1, -1], [-1, -1, 1], [1, -1, -1]])        # one-hot
    (tmp_path / "pm.svm").write_text("1 1:0.5\n-1 2:1\n")
    convert(capsys, "--format", "svmlight", tmp_path / "pm.svm", tmp_path / "pm.h5", "--stream")
    _, Y, names, _ = read_stream(tmp_path / "pm.h5")
    assert names == ["label"] and same(Y, [[1], [-1]])                                 # +-1: one column
    (tmp_path / "ml.svm").write_text("1,3 1:0.5 2:1\n2 2:1\n 3:1\n1,2,3 1:1\n")       # line 3: no label
    code, out, err = convert(capsys, "--format", "svmlight", tmp_path / "ml.svm", tmp_path / "ml.h5", "--stream")
    assert code == 0 and "(multi-label): 1, 2, 3" in out, err
    _, Y, names, _ = read_stream(tmp_path / "ml.h5")
    assert_array_equal(Y, [[1, -1, 1], [-1, 1, -1], [-1, -1, -1], [1, 1, 1]])
    code, out, err = convert(capsys, "--format", "svmlight", tmp_path / "ml.svm", tmp_path / "ml3.h5", "--stream",
                             "--positive-label", "3")
    _, Y, names, _ = read_stream(tmp_path / "ml3.h5")
    assert code == 0 and names == ["3"] and same(Y.ravel(), [1, -1, -1, 1])
    # CSV without a task column: text classes; .mat fea/gnd; npz X, y; an n x k label matrix
    (tmp_path / "iris.csv").write_text("a,b,species\n1,2,setosa\n3,4,virginica\n5,6,setosa\n")
    convert(capsys, "--format", "csv", tmp_path / "iris.csv", tmp_path / "iris.h5", "--stream", "--label-column", "species")
    X, Y, names, _ = read_stream(tmp_path / "iris.h5")
    assert names == ["setosa", "virginica"] and same(Y, [[1, -1], [-1, 1], [1, -1]]) and same(X[1], [3, 4])
    scipy.io.savemat(tmp_path / "g.mat", {"fea": sp.csc_matrix(np.eye(3)), "gnd": np.array([[0], [1], [2]])})
    convert(capsys, "--format", "malsar", tmp_path / "g.mat", tmp_path / "g.h5", "--stream")
    assert read_stream(tmp_path / "g.h5")[2] == ["0", "1", "2"]
    np.savez(tmp_path / "m.npz", X=np.eye(3), y=np.array([[1, 0], [0, 1], [1, 1]]))
    code, _, err = convert(capsys, "--format", "npz", tmp_path / "m.npz", tmp_path / "m.h5", "--stream",
                           "--labels", "0:-1,1:1")
    _, Y, names, _ = read_stream(tmp_path / "m.h5")
    assert code == 0 and names == ["label0", "label1"] and same(Y, [[1, -1], [-1, 1], [1, 1]]), err
    sp.save_npz(tmp_path / "x.npz", sp.csr_matrix(np.eye(3)))
    np.savez(tmp_path / "xl.npz", y=[5, 7, 5])
    code, _, err = convert(capsys, "--format", "npz", tmp_path / "x.npz", tmp_path / "xl.npz", tmp_path / "x.h5",
                           "--stream", "--positive-label", "7")
    _, Y, names, _ = read_stream(tmp_path / "x.h5")
    assert code == 0 and names == ["7"] and same(Y.ravel(), [-1, 1, -1]), err


def test_stream_shuffle_is_a_seeded_permutation(tmp_path, capsys):
    rows = "".join(f"{k % 3} 1:{k + 1}\n" for k in range(30))                 # sorted-ish by class is common
    (tmp_path / "c.svm").write_text(rows)
    outs = {}
    for name, extra in (("plain", []), ("s1", ["--shuffle", "--seed", "1"]), ("s1b", ["--shuffle", "--seed", "1"]),
                        ("s2", ["--shuffle", "--seed", "2"])):
        code, _, err = convert(capsys, "--format", "svmlight", tmp_path / "c.svm", tmp_path / f"{name}.h5",
                               "--stream", *extra)
        assert code == 0, err
        outs[name] = read_stream(tmp_path / f"{name}.h5")
    X, Y, _, attrs = outs["s1"]
    assert attrs["order"] == "shuffled" and attrs["shuffle_seed"] == 1
    order = np.argsort(X[:, 0])                                                 # feature 1 = k + 1 names the row
    assert_array_equal(X[order], outs["plain"][0])
    assert_array_equal(Y[order], outs["plain"][1])
    assert_array_equal(X, outs["s1b"][0])                                        # same seed, same order
    assert not np.array_equal(X, outs["s2"][0]) and not np.array_equal(X, outs["plain"][0])
    order = np.random.default_rng(1).permutation(30)
    assert_array_equal(X, outs["plain"][0][order])                               # the permutation drawn from --seed


@pytest.mark.slow
def test_converted_stream_trains_online(tmp_path, capsys):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 4))
    cls = np.argmax(X[:, :3], axis=1)
    (tmp_path / "d.csv").write_text("a,b,c,d,label\n" + "".join(
        ",".join(f"{v:.3f}" for v in x) + f",{'xyz'[k]}\n" for x, k in zip(X, cls)))
    code, _, err = convert(capsys, "--format", "csv", tmp_path / "d.csv", tmp_path / "s.h5", "--stream",
                           "--label-column", "label", "--shuffle", "--seed", "3")
    assert code == 0, err
    r = run_hpcmtl(["train", "online", "--stream", tmp_path / "s.h5", "--out", tmp_path / "r.h5",
                    "--code", "exhaustive", "--norm", "rmax", "--r", "1", "--C", "0.1", "--quiet"])
    assert r.returncode == 0, r.stderr


def test_stream_options_that_do_not_fit(tmp_path, capsys):
    code, _, err = convert(capsys, "--format", "mnist", tmp_path, tmp_path / "s.h5", "--stream",
                           "--test-out", tmp_path / "t.h5")
    assert code == 2 and "--test-out with --stream is only for reuters" in err and err.count("\n") == 1
    assert not (tmp_path / "s.h5").exists()


def test_reuters_stream_takes_label_mapping_and_shuffle(tmp_path, capsys):
    (tmp_path / "reut2-000.sgm").write_text(SGML, encoding="latin-1")
    code, _, err = convert(capsys, "--format", "reuters", tmp_path, tmp_path / "o.h5", "--stream", "--online",
                           "--min-docs", "1")
    code2, _, err2 = convert(capsys, "--format", "reuters", tmp_path, tmp_path / "f.h5", "--stream", "--online",
                             "--min-docs", "1", "--positive-label", "-1", "--shuffle", "--seed", "4")
    assert code == code2 == 0, err + err2
    X, Y, names, _ = read_stream(tmp_path / "o.h5")
    Xf, Yf, namesf, attrs = read_stream(tmp_path / "f.h5")
    order = np.random.default_rng(4).permutation(len(Y))
    assert names == namesf and attrs["order"] == "shuffled"
    assert_array_equal(Yf, -Y[order])
    assert_array_equal(Xf, X[order])


def test_a_new_format_is_one_registration(tmp_path, capsys, monkeypatch):
    """The command line names no format: a registered FormatSpec is a --format choice, its options' defaults and
    help come from the spec, its reader and stream reader run, and --stream of it is written like any other."""
    def rows(inputs, options):
        n = options["rows"]
        return [np.arange(2.0 * n).reshape(n, 2)], [np.where(np.arange(n) % 2, 1.0, -1.0)], ["only"]

    def read(inputs, options, labels, report, test=False):
        return rows(inputs, options), None

    spec = formats.FormatSpec(
        name="toy", read=read, options=(formats.Option("rows", 3, "rows read", flag="--n-features"),),
        stream=formats.streams.one_stream(lambda inputs, options, labels, report:
                                          formats.streams.tasks_as_stream(*rows(inputs, options))))
    monkeypatch.setitem(formats._REGISTRY, "toy", spec)
    (tmp_path / "in.toy").write_text("")
    assert "toy: rows read (3)" in formats.option_help("--n-features")
    code, out, err = convert(capsys, "--format", "toy", tmp_path / "in.toy", tmp_path / "a.h5")
    assert code == 0, err
    code, out, err = convert(capsys, "--format", "toy", tmp_path / "in.toy", tmp_path / "b.h5", "--n-features", "5")
    assert code == 0, err
    with store.TaskFile(str(tmp_path / "a.h5")) as a, store.TaskFile(str(tmp_path / "b.h5")) as b:
        assert (a.read_task(0).n_rows, b.read_task(0).n_rows) == (3, 5) and a.names == ["only"]
    code, out, err = convert(capsys, "--format", "toy", tmp_path / "in.toy", tmp_path / "s.h5", "--stream")
    assert code == 0, err
    X, Y, names, attrs = read_stream(tmp_path / "s.h5")
    assert names == ["only"] and attrs["source_format"] == "toy" and attrs["order"] == "file"
    assert_array_equal(Y[:, 0], [-1, 1, -1])
    code, _, err = convert(capsys, "--format", "toy", tmp_path / "in.toy", tmp_path / "c.h5", "--test-out",
                           tmp_path / "ct.h5")
    assert code == 2 and "--test-out is only for malsar (with --x/--y naming the training variables: the test ones " \
        "replace 'train' by 'test') and mnist (a directory) and reuters; split toy data" in err


@pytest.mark.smoke
def test_every_format_is_registered_once_with_its_defaults():
    """The formats --format offers, in order, and each default written in one place (the spec) and used by the
    reader's own keyword default too."""
    import inspect as pyinspect
    assert formats.format_names() == ("malsar", "svmlight", "csv", "npz", "mnist", "mds", "reuters", "tasks")
    assert formats.get_format("mds").defaults() == {"n_features": 10000}
    assert formats.get_format("reuters").defaults()["min_docs"] == 100
    for fn, option in ((formats.from_mds, ("mds", "n_features")), (formats.from_reuters, ("reuters", "min_docs")),
                       (formats.reuters_online, ("reuters", "min_docs")),
                       (formats.from_reuters, ("reuters", "max_features")),
                       (formats.reuters_online, ("reuters", "online_features")),
                       (formats.from_mnist, ("mnist", "seed"))):
        name = "n_features" if option[1] == "online_features" else option[1]
        assert pyinspect.signature(fn).parameters[name].default == formats.get_format(option[0]).defaults()[option[1]]
    with pytest.raises(ValueError, match="registered twice"):
        formats.register_format(formats.get_format("csv"))
