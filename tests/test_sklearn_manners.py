"""What a scikit-learn user expects of the estimators (issue 15, part 3): scikit-learn's own
estimator checks, any two labels with ``classes_``, NotFittedError, and ``--positive-label`` on the
command line for files whose classes are not -1/+1."""
import warnings

import h5py
import numpy as np
import pytest
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import NotFittedError
from sklearn.preprocessing import LabelEncoder
from sklearn.utils.estimator_checks import parametrize_with_checks
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import check_is_fitted, validate_data

from hpcmtl import DMTRL, GraphMTL, JointSparseMTL, OnlineECOC, OnlineMultitask, store
from hpcmtl.errors import InputError

from conftest import random_tasks, run_hpcmtl


# ---------------------------------------------------------------------------
# thin single-task adapters: the online learners take a (T x k) label matrix or class ids
# ---------------------------------------------------------------------------
class OnlineBinary(ClassifierMixin, BaseEstimator):
    """One task of :class:`OnlineMultitask`: any two classes as that task's -1/+1 column."""

    def __init__(self, update="implicit", norm="rmax", C=1.0):
        self.update, self.norm, self.C = update, norm, C

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        tags.input_tags.sparse = True
        return tags

    def fit(self, X, y):
        X, y = validate_data(self, X, y, accept_sparse="csr")
        check_classification_targets(y)
        if type_of_target(y) != "binary":
            raise ValueError(f"Only binary classification is supported. The type of the target is "
                             f"{type_of_target(y)}.")
        self.classes_ = np.unique(y)
        if self.classes_.size < 2:
            raise ValueError("the labels hold one class only")
        self.model_ = OnlineMultitask(update=self.update, norm=self.norm, C=self.C).fit(
            X, np.where(y == self.classes_[1], 1.0, -1.0)[:, None])
        return self

    def decision_function(self, X):
        check_is_fitted(self)
        return self.model_.decision_function(validate_data(self, X, accept_sparse="csr", reset=False))[:, 0]

    def predict(self, X):
        positive = self.decision_function(X) > 0
        return self.classes_[positive.astype(int)]


class OnlineMulticlass(ClassifierMixin, BaseEstimator):
    """:class:`OnlineECOC` over any labels (class ids 0..K-1 through a LabelEncoder)."""

    def __init__(self, code="one-vs-rest", C=1.0):
        self.code, self.C = code, C

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def fit(self, X, y):
        X, y = validate_data(self, X, y, accept_sparse="csr")
        check_classification_targets(y)
        encoder = LabelEncoder().fit(y)
        self.classes_ = encoder.classes_
        if self.classes_.size < 2:
            raise ValueError("the labels hold one class only")
        self.model_ = OnlineECOC(n_classes=self.classes_.size, code=self.code, r=1, C=self.C).fit(
            X, encoder.transform(y))
        return self

    def predict(self, X):
        check_is_fitted(self)
        return self.classes_[self.model_.predict(validate_data(self, X, accept_sparse="csr", reset=False))]


ESTIMATORS = [
    DMTRL(loss="hinge", max_rounds=100, outer=2),
    DMTRL(loss="logistic", max_rounds=100, outer=2, relationship="identity"),
    DMTRL(loss="squared"),
    JointSparseMTL(loss="hinge", max_rounds=50),
    JointSparseMTL(loss="squared", max_rounds=50),
    GraphMTL(),
    GraphMTL(exact=False, kernel="linear", loss="smoothed-hinge", max_rounds=100),
    OnlineBinary(),
    OnlineMulticlass(),
]


@parametrize_with_checks(ESTIMATORS)        # every check passes: none is listed as an expected failure
def test_scikit_learn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # unconverged W-steps on the checks' tiny data say so
        check(estimator)


# ---------------------------------------------------------------------------
# labels
# ---------------------------------------------------------------------------
def stacked(Xs, ys):
    tasks = np.concatenate([np.full(len(v), i) for i, v in enumerate(ys)])
    return np.vstack(Xs), np.concatenate(ys), tasks


@pytest.mark.smoke
@pytest.mark.parametrize("negative, positive", [(0, 1), (1, 2), ("ham", "spam"), (-1.0, 1.0)])
def test_any_two_labels_give_the_model_of_minus_one_plus_one(negative, positive):
    Xs, ys = random_tasks(seed=3, loss="hinge")
    X, y, tasks = stacked(Xs, ys)
    reference = DMTRL(lam=0.05, tol=1e-8).fit(X, y, tasks)
    labels = np.where(y > 0, positive, negative).astype(object if isinstance(positive, str) else type(positive))
    est = DMTRL(lam=0.05, tol=1e-8).fit(X, labels, tasks)
    np.testing.assert_array_equal(est.W_, reference.W_)          # the same numbers reach the solver
    assert list(est.classes_) == [negative, positive]
    assert est.task_classes_.shape == (4, 2)
    pred = est.predict(X, tasks)
    np.testing.assert_array_equal(pred, np.where(reference.predict(X, tasks) > 0, positive, negative))
    assert est.score(X, labels, tasks) == reference.score(X, y, tasks) > 0.7


def test_tasks_with_their_own_pairs_and_a_one_class_task():
    Xs, ys = random_tasks(seed=4, loss="hinge")
    named = [np.where(y > 0, f"yes{i}", f"no{i}") for i, y in enumerate(ys)]    # 8 labels, 2 a task
    est = JointSparseMTL(radius=5.0, max_rounds=30).fit(Xs, named)
    assert not hasattr(est, "classes_")
    assert [list(p) for p in est.task_classes_] == [[f"no{i}", f"yes{i}"] for i in range(4)]
    assert set(est.predict(Xs)[2]) <= {"no2", "yes2"}
    one_class = [np.where(y > 0, "b", "a") for y in ys]
    one_class[1][:] = "a"                                                       # a task of one class
    est = DMTRL(lam=0.05, max_rounds=50, outer=2).fit(Xs, one_class)
    assert list(est.classes_) == ["a", "b"]
    with pytest.raises(InputError, match=r"task #1: field 'y': Only binary classification is supported"):
        JointSparseMTL(max_rounds=5).fit(Xs, [named[0], np.full(len(ys[1]), "q"), *named[2:]])


def test_label_errors_name_the_problem():
    Xs, ys = random_tasks(seed=5, loss="hinge")
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        DMTRL().fit(Xs, [y + 0.5 for y in ys])
    with pytest.raises(ValueError, match="only one class"):
        DMTRL().fit(Xs, [np.ones_like(y) for y in ys])
    with pytest.raises(ValueError, match="needs numeric labels"):
        DMTRL(loss="squared").fit(Xs, [np.where(y > 0, "a", "b") for y in ys])


# ---------------------------------------------------------------------------
# NotFittedError, GraphMTL's max_rounds, a single task without ids
# ---------------------------------------------------------------------------
@pytest.mark.smoke
@pytest.mark.parametrize("estimator", [DMTRL(), JointSparseMTL(), GraphMTL(), GraphMTL(exact=False),
                                       OnlineMultitask(), OnlineECOC()], ids=lambda e: repr(e))
def test_predict_before_fit_raises_not_fitted(estimator):
    with pytest.raises(NotFittedError):
        estimator.predict(np.ones((2, 6)))


def test_graph_mtl_takes_max_rounds():
    Xs, ys = random_tasks(seed=6, loss="hinge")
    with pytest.warns(UserWarning, match="unconverged"):
        short = GraphMTL(exact=False, kernel="linear", graph="chain", lam=1e-3, tol=1e-12, max_rounds=3).fit(Xs, ys)
    assert len(short.history_["round"]) <= 3 + 1
    with pytest.raises(InputError, match="The 'max_rounds' parameter of GraphMTL must be an integer >= 1"):
        GraphMTL(exact=False, max_rounds=0).fit(Xs, ys)


@pytest.mark.parametrize("estimator", [DMTRL(lam=0.05), JointSparseMTL(radius=5.0), GraphMTL(),
                                       GraphMTL(exact=False, kernel="linear")], ids=lambda e: repr(e))
def test_single_task_model_scores_rows_without_task_ids(estimator):
    Xs, ys = random_tasks(seed=7, loss="hinge")
    est = estimator.fit(Xs[0], ys[0])
    scores = est.decision_function(Xs[0])
    np.testing.assert_allclose(scores, est.decision_function(Xs[0], np.zeros(len(ys[0]), int)))
    assert scores.shape == (len(ys[0]),) and est.score(Xs[0], ys[0]) > 0.7


def test_regressors_have_no_decision_function():
    Xs, ys = random_tasks(seed=8, loss="squared")
    est = DMTRL(loss="squared", lam=0.05).fit(Xs, ys)
    assert not hasattr(est, "decision_function") and hasattr(DMTRL(loss="hinge"), "decision_function")
    assert est.score(Xs, ys) > 0.8


# ---------------------------------------------------------------------------
# the command line: --positive-label
# ---------------------------------------------------------------------------
@pytest.fixture
def zero_one_files(tmp_path):
    Xs, ys = random_tasks(seed=9, loss="hinge")
    signed = tmp_path / "signed.h5"
    zero_one = tmp_path / "zero_one.h5"
    store.write_tasks(signed, Xs, ys)
    store.write_tasks(zero_one, Xs, [(y > 0).astype(float) for y in ys])
    return tmp_path, signed, zero_one


@pytest.mark.mpi
def test_positive_label_trains_zero_one_files_like_signed_ones(zero_one_files):
    tmp, signed, zero_one = zero_one_files
    common = ["--lam", "0.05", "--max-rounds", "200", "--outer", "3", "--quiet"]
    a = run_hpcmtl(["train", "dmtrl", "--train", signed, "--test", signed, "--out", tmp / "a.h5", *common], 2)
    b = run_hpcmtl(["train", "dmtrl", "--train", zero_one, "--test", zero_one, "--out", tmp / "b.h5",
                    "--positive-label", "1", *common], 2)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    with h5py.File(tmp / "a.h5") as fa, h5py.File(tmp / "b.h5") as fb:
        np.testing.assert_array_equal(fa["model/W"][()], fb["model/W"][()])
    ev_a = run_hpcmtl(["evaluate", tmp / "a.h5", signed, "--json"])
    ev_b = run_hpcmtl(["evaluate", tmp / "b.h5", zero_one, "--json"])
    assert ev_a.returncode == 0 and ev_a.stdout == ev_b.stdout, ev_b.stderr     # the mapping is in the result


@pytest.mark.mpi
def test_positive_label_errors(zero_one_files, tmp_path):
    tmp, signed, zero_one = zero_one_files
    plain = run_hpcmtl(["train", "stl", "--train", zero_one, "--out", tmp / "c.h5", "--lam", "0.1"], 2)
    assert plain.returncode == 2
    assert "zero_one.h5: task 'task0' (#0): field 'y': the hinge loss needs labels -1/+1, found 0.0 (two other " \
           "classes: pass --positive-label" in plain.stderr
    squared = run_hpcmtl(["train", "stl", "--train", zero_one, "--out", tmp / "c.h5", "--lam", "0.1",
                          "--loss", "squared", "--positive-label", "1"])
    assert squared.returncode == 2 and "'positive_label' parameter of DMTRL is for classification losses" \
        in squared.stderr
    Xs, ys = random_tasks(seed=9, loss="hinge")
    three = tmp_path / "three.h5"
    store.write_tasks(three, Xs, [np.arange(len(y)) % 3 for y in ys])
    many = run_hpcmtl(["train", "stl", "--train", three, "--out", tmp / "c.h5", "--lam", "0.1",
                       "--positive-label", "2"], 2)
    assert many.returncode == 2
    assert "three.h5: task 'task0' (#0): field 'y': --positive-label 2 needs two classes, found 3 label values " \
           "(0, 1, 2)" in many.stderr
    assert not (tmp / "c.h5").exists()
