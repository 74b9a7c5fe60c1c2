"""scikit-learn-style estimators over the same engines the CLI runs.

``fit`` runs the serial path (P = 1): the very code ``mpiexec -n P hpcmtl
train`` runs, on a communicator of size one.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.metrics import accuracy_score, r2_score
from sklearn.utils import ClassifierTags, RegressorTags
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from . import _online
from .errors import InputError
from .losses import LOSSES
from .memory import check_columns
from .metrics import RunningMetrics
from .online_rules import make_rule
from .output_codes import DECODERS, class_scores, decode, get_code, rank_labels
from .params import validate
from .taskdata import MemoryTasks, rows_of      # MemoryTasks: also imported from here (hpcmtl.MemoryTasks, tests)


def two_class_labels(ys, owner):
    """Each task's two classes and its labels as -1/+1 (the second class, in sorted order, is +1).

    As scikit-learn's binary classifiers do, any two label values work (0/1, 1/2,
    strings); continuous labels are refused as scikit-learn refuses them.  When the
    labels of all tasks together take two values, every task uses that pair (a task
    may then hold one class only); otherwise every task must hold exactly two.
    Returns ``(classes (m x 2), signed label vectors)``.
    """
    everything = np.concatenate([np.asarray(y).reshape(-1) for y in ys])
    check_classification_targets(everything)
    everything = np.unique(everything)
    if everything.size < 2:
        raise InputError(f"{owner}: a classification loss needs two classes; the labels hold only one class: "
                         f"{everything[0]!r}" if everything.size else f"{owner}: no labels")
    pairs = []
    for i, y in enumerate(ys):
        pair = everything if everything.size == 2 else np.unique(np.asarray(y))
        if pair.size != 2:
            raise InputError(f"{owner}: task #{i}: field 'y': Only binary classification is supported: a task "
                             f"needs two classes, found {pair.size} ({', '.join(map(repr, pair[:5].tolist()))}"
                             f"{', ...' if pair.size > 5 else ''}); all tasks together hold {everything.size}")
        pairs.append(pair)
    signed = [np.where(np.asarray(y) == pair[1], 1.0, -1.0) for y, pair in zip(ys, pairs)]
    return np.array(pairs), signed


def is_task_list(X) -> bool:
    """A list of per-task matrices (each 2-D or sparse), not a list of rows."""
    return (isinstance(X, (list, tuple)) and len(X) > 0
            and all(sp.issparse(x) or np.ndim(x) == 2 for x in X))


def _task_column(estimator, X, tasks):
    """``(X without the column, the task ids it held)`` when the estimator has ``task_column`` (so that
    scikit-learn's ``GridSearchCV`` and splitters, which pass X and y only, can fit and score it)."""
    column = getattr(estimator, "task_column", None)
    if column is None or isinstance(X, (list, tuple)):
        return X, tasks
    owner = type(estimator).__name__
    if tasks is not None:
        raise InputError(f"{owner}: give the task ids as tasks= or in X[:, task_column], not both")
    X = sp.csr_matrix(X) if sp.issparse(X) else np.asarray(X)
    if not (isinstance(column, (int, np.integer)) and 0 <= column < X.shape[1]):
        raise InputError(f"The 'task_column' parameter of {owner} must be a column of X (0..{X.shape[1] - 1}). "
                         f"Got {column!r} instead.")
    keep = np.flatnonzero(np.arange(X.shape[1]) != column)
    ids = X[:, [column]].toarray().ravel() if sp.issparse(X) else X[:, column]
    return X[:, keep], ids


def keep_params(estimator, arguments):
    """Store an estimator's ``__init__`` arguments unchanged, as scikit-learn's contract asks (validation is in fit).

    ``arguments`` is ``locals()`` at the top of ``__init__``; ``get_params``
    reads the same names back from the signature.
    """
    for name, value in arguments.items():
        if name not in ("self", "__class__"):
            setattr(estimator, name, value)


class _MultiTaskLinear(BaseEstimator):
    """Input checks, labels and prediction for fitted per-task linear models ``W_`` (d x m) and intercepts
    ``intercept_`` (m) over ``phi(x)``.

    ``fit`` takes lists of per-task arrays, or stacked rows with a task-id array
    (no ids: one task, so every estimator is also a plain scikit-learn estimator).
    With a classification loss any two label values work: ``task_classes_`` (m x 2)
    holds each task's pair (the second one is the positive class, score >= 0),
    ``classes_`` the pair when every task has the same one (as scikit-learn's binary
    classifiers), and ``predict`` returns them.  A classifier (with
    ``decision_function``) or a regressor by its loss (scikit-learn tags).
    """

    def _is_classifier(self):
        return self.loss in LOSSES and LOSSES[self.loss].binary_labels

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        if self._is_classifier():
            tags.estimator_type = "classifier"
            tags.classifier_tags = ClassifierTags(multi_class=False)
        else:
            tags.estimator_type = "regressor"
            tags.regressor_tags = RegressorTags()
        tags.target_tags.required = True
        return tags

    def _fit_source(self, X, y, tasks):
        """``(MemoryTasks, task ids)`` of fit's input: checked, labels -1/+1 for a classification loss.

        Sets ``n_features_in_`` and, for classification, ``task_classes_`` (and ``classes_``).
        """
        owner = type(self).__name__
        for name in ("classes_", "task_classes_"):
            self.__dict__.pop(name, None)
        validate({"loss": self.loss}, owner)
        if is_task_list(X) and tasks is None:
            if not isinstance(y, (list, tuple)) or len(X) != len(y):
                raise InputError(f"{owner}: lists of per-task arrays need one label vector per task and at "
                                 "least one task")
            Xs = [check_array(Xi, accept_sparse="csr", dtype=np.float64) for Xi in X]
            ys = [np.asarray(yi).reshape(-1) for yi in y]
            if len({Xi.shape[1] for Xi in Xs}) != 1:
                raise InputError(f"{owner}: every task needs the same number of features")
            ids = np.arange(len(Xs))
            self.n_features_in_ = Xs[0].shape[1]
        else:
            X, y = validate_data(self, X, y, accept_sparse="csr", dtype=np.float64,
                                 y_numeric=not self._is_classifier())
            tasks = np.zeros(X.shape[0], dtype=np.int64) if tasks is None else np.asarray(tasks).reshape(-1)
            if tasks.shape[0] != X.shape[0]:
                raise InputError(f"{owner}: X has {X.shape[0]} rows, tasks has {tasks.shape[0]}")
            ids = np.unique(tasks)
            Xs = [X[tasks == t] for t in ids]
            ys = [y[tasks == t] for t in ids]
        check_columns(Xs[0].shape[1], f"{owner}: X")          # before the kernels (int32 columns) or any d-array
        if self._is_classifier():
            self.task_classes_, ys = two_class_labels(ys, owner)
            self.classes_ = self.task_classes_[0]
            if not all(np.array_equal(pair, self.classes_) for pair in self.task_classes_):
                del self.classes_                   # tasks with their own pairs: task_classes_ only
        elif not all(np.issubdtype(np.asarray(yi).dtype, np.number) for yi in ys):
            raise InputError(f"{owner}: the {self.loss} loss needs numeric labels")
        return MemoryTasks(Xs, ys, names=[str(t) for t in ids]), ids

    def _fitted(self, W, source, ids, feature_map=None, intercept=None):
        self.W_ = W
        self.intercept_ = np.zeros(W.shape[1]) if intercept is None else np.asarray(intercept, dtype=np.float64)
        self.tasks_ = ids
        self._feature_map = feature_map

    def _columns(self, X, tasks):
        """(checked X, the model column of every row)."""
        check_is_fitted(self)
        X, tasks = _task_column(self, X, tasks)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        if tasks is None:
            if len(self.tasks_) != 1:
                raise InputError(f"the model has {len(self.tasks_)} tasks: pass the task id of every row")
            return X, np.zeros(X.shape[0], dtype=np.int64)
        tasks = np.asarray(tasks).reshape(-1)
        if tasks.shape[0] != X.shape[0]:
            raise InputError(f"X has {X.shape[0]} rows, tasks has {tasks.shape[0]}")
        column = {t: k for k, t in enumerate(self.tasks_)}
        unknown = set(np.unique(tasks).tolist()) - set(column)
        if unknown:
            raise InputError(f"unknown task ids {sorted(unknown)[:5]}")
        return X, np.array([column[t] for t in tasks.tolist()], dtype=np.int64)

    def _scores(self, X, cols):
        Z = self._feature_map(X) if self._feature_map is not None else X
        if sp.issparse(Z):
            Z = sp.csr_matrix(Z)
            return np.asarray(Z.multiply(self.W_[:, cols].T).sum(axis=1)).ravel() + self.intercept_[cols]
        return np.einsum("ij,ji->i", np.asarray(Z), self.W_[:, cols]) + self.intercept_[cols]

    def _per_task(self, method, X, tasks):
        """Lists in (one array a task, no ids), list out."""
        if is_task_list(X) and tasks is None:
            check_is_fitted(self)
            if len(X) != len(self.tasks_):
                raise InputError(f"the model has {len(self.tasks_)} tasks, got {len(X)} arrays")
            return [method(Xi, np.full(np.shape(Xi)[0], self.tasks_[i])) for i, Xi in enumerate(X)]
        return None

    @available_if(lambda self: self._is_classifier())
    def decision_function(self, X, tasks=None):
        """Scores ``w_task . phi(x)`` of each row (lists in, list out); >= 0 predicts ``task_classes_[task, 1]``.

        Classification losses only (a regressor's scores are ``predict``'s).
        """
        listed = self._per_task(self.decision_function, X, tasks)
        if listed is not None:
            return listed
        X, cols = self._columns(X, tasks)
        return self._scores(X, cols)

    def predict(self, X, tasks=None):
        """Scores for the squared loss; each row's class (from its task's ``task_classes_``) otherwise."""
        listed = self._per_task(self.predict, X, tasks)
        if listed is not None:
            return listed
        X, cols = self._columns(X, tasks)
        scores = self._scores(X, cols)
        if not self._is_classifier():
            return scores
        return self.task_classes_[cols, (scores >= 0).astype(np.int64)]

    def score(self, X, y, tasks=None):
        """Accuracy for classification losses, R^2 (pooled) for the squared loss."""
        pred = self.predict(X, tasks)
        if isinstance(pred, list):
            pred = np.concatenate(pred)
            y = np.concatenate([np.asarray(v).reshape(-1) for v in y])
        y = np.asarray(y)
        if not self._is_classifier():
            return float(r2_score(y, pred))
        return float(accuracy_score(y, pred))


class DMTRL(_MultiTaskLinear):
    """Distributed multi-task relationship learning (paper 001) as an estimator.

    Minimizes ``sum_i (1/n_i) sum_j l(w_i . x_ij, y_ij) + (lam/2) tr(W Omega W^T)``
    over W and (for ``relationship='learned'``) ``Sigma = Omega^-1`` with
    ``tr(Sigma) = 1``, by the primal-dual W-step / Omega-step alternation.

    Parameters mirror :class:`hpcmtl.dmtrl.DMTRLConfig` (``aggregation='safe'``:
    paper 001's Lemma 6.7 rho; ``fit_intercept``: per-task intercepts, exact and
    unpenalized for the squared loss, liblinear's augmented feature of value
    ``intercept_scaling`` otherwise).  ``sigma`` (``relationship='fixed'``): an m x m array, a learned fit's
    ``Sigma_`` as :class:`hpcmtl.covariance.SigmaFactors` (kept as factors from ``FACTORED_MIN_TASKS`` tasks on,
    its dense matrix below) or a :class:`hpcmtl.covariance.GraphSigma`.
    Fitted attributes: ``W_`` (d x m), ``intercept_`` (m), ``Sigma_``
    (m x m; a learned Sigma of many tasks, from ``hpcmtl.dmtrl.sigma.FACTORED_MIN_TASKS`` = 512 on, its
    :class:`hpcmtl.covariance.SigmaFactors` ``(V, s, c)``: ``Sigma = V diag(s) V^T + c (I - V V^T)``, with
    ``.diag()``, ``.matmul(X)``, ``.rows(idx)``, ``.correlation(idx)`` and ``.dense()``), ``history_`` (dict of arrays), ``tasks_`` (task ids in column
    order), ``converged_`` (every W-step reached ``tol``), ``wsteps_`` (per
    W-step: outer, round, rel_gap, converged).

    ``task_column=k`` reads each row's task id from column k of a stacked X
    (and leaves it out of the features), in ``fit`` and in the predictions:
    ``GridSearchCV(DMTRL(task_column=0), {"lam": [...]}, cv=GroupKFold(3))``
    works as with any scikit-learn estimator.
    """

    def __init__(self, loss="hinge", lam=1e-3, gamma=1.0, tol=1e-6, max_rounds=500, outer=30,
                 outer_tol=2e-4, local_iters=1.0, seed=0, eta=1.0, gap_every=1, relationship="learned",
                 sigma=None, rff_dim=0, rff_gamma=1.0, shrinking=True, aggregation="qp", fit_intercept=True,
                 intercept_scaling=1.0, exchange="auto", float32=False, task_column=None):
        keep_params(self, locals())

    def _config(self, lam=None):
        from .dmtrl import DMTRLConfig
        params = self.get_params()
        for name in ("sigma", "task_column", "lams", "cv", "metric", "selection_tol", "path_patience"):
            params.pop(name, None)
        if lam is not None:
            params["lam"] = lam
        return DMTRLConfig(**params).validate(type(self).__name__)

    def fit(self, X, y, tasks=None):
        """Fit on stacked rows with a task-id array, or on lists of per-task arrays."""
        from .cluster import Cluster
        from .dmtrl import train
        X, tasks = _task_column(self, X, tasks)
        config = self._config()
        source, ids = self._fit_source(X, y, tasks)
        result = train(Cluster.serial(), source, config, sigma_fixed=self.sigma)
        return self._keep(result, source, ids, config)

    def _keep(self, result, source, ids, config):
        """The fitted attributes of a DMTRL result."""
        self._fitted(result.W, source, ids, _feature_map(config, source), result.intercept)
        self.Sigma_ = result.Sigma
        self.history_ = result.history
        self.converged_ = result.converged
        self.wsteps_ = result.wsteps
        return self


class DMTRLCV(DMTRL):
    """DMTRL with lam chosen by validation: the grid solved in one fit, warm-started from the largest lam
    down (:mod:`hpcmtl.model_selection`), then refit on every row at the chosen lam.

    ``lams``: the grid.  ``cv``: None (hold out 20% of every task's rows), a
    fraction in (0, 1) (hold out that much), an integer K >= 2 (K folds within
    every task; stratified by label for classification, seeded by ``seed``),
    or the ``(train, test)`` index pairs of a scikit-learn splitter over the
    stacked rows (``list(GroupKFold(3).split(X, y, groups))``: every row in one
    test set).  ``metric``: rmse (squared loss, its default), error (the
    default otherwise), auc or logloss.  The other parameters are DMTRL's.

    Fitted attributes: DMTRL's at the chosen lam, and ``lam_``,
    ``best_params_`` (``{"lam": lam_}``), ``best_index_`` and ``best_score_``
    (the validation metric), ``cv_results_`` (one entry per grid point, largest
    lam first: ``param_lam``, ``mean_test_score`` and ``split<k>_test_score``
    with scikit-learn's sign, greater is better, ``rank_test_score``,
    ``mean_validation_<metric>``, ``rounds``, ``seconds``, ``converged``) and
    ``selection_`` (the split, ``warnings``: a chosen lam at an edge of the grid,
    unconverged points; each is also a ``UserWarning``).  ``selection_tol`` and
    ``path_patience``: ``hpcmtl train``'s ``--selection-tol`` and ``--path-patience``
    (0 and 0: the exhaustive path, every fold fit at ``tol`` and no point stopped,
    as ``GridSearchCV`` over DMTRL).
    """

    def __init__(self, lams=(1e-4, 1e-3, 1e-2, 1e-1), cv=None, metric=None, loss="hinge", gamma=1.0, tol=1e-6,
                 max_rounds=500, outer=30, outer_tol=2e-4, local_iters=1.0, seed=0, eta=1.0, gap_every=1,
                 relationship="learned", sigma=None, rff_dim=0, rff_gamma=1.0, shrinking=True, aggregation="qp",
                 fit_intercept=True, intercept_scaling=1.0, exchange="auto", float32=False, task_column=None,
                 selection_tol=None, path_patience=3):
        keep_params(self, locals())

    def fit(self, X, y, tasks=None):
        from .cluster import Cluster
        from .model_selection import Selection, train_path
        owner = type(self).__name__
        grid = [float(v) for v in np.atleast_1d(self.lams)]
        X, tasks = _task_column(self, X, tasks)
        config = self._config(lam=max(grid) if grid else None)
        source, ids = self._fit_source(X, y, tasks)
        selection = Selection(grid, metric=self.metric, tol=self.selection_tol, patience=self.path_patience,
                              **_split_of(self.cv, X, tasks, ids, owner))
        result = train_path(Cluster.serial(), source, config, selection.validate(config.loss, owner),
                            sigma_fixed=self.sigma)
        self._keep(result, source, ids, config)
        self.lam_ = result.selection["chosen_lam"]
        _keep_selection(self, result, "lam", {"converged": result.path["converged"]})
        return self


def _split_of(cv, X, tasks, ids, owner) -> dict:
    """The :class:`hpcmtl.model_selection.Selection` split of an estimator's ``cv``: None (the default hold-out),
    a fraction, a number of folds, or a scikit-learn splitter's ``(train, test)`` pairs."""
    if isinstance(cv, (float, np.floating)):
        return {"validation_fraction": cv}
    if isinstance(cv, (int, np.integer)) and not isinstance(cv, bool):
        return {"cv": int(cv)}
    return {} if cv is None else {"folds": _folds_of_splits(cv, X, tasks, ids, owner)}


def _keep_selection(est, result, name, extra):
    """The fitted attributes of a choice by validation (``best_params_``, ``cv_results_`` with scikit-learn's
    sign, ...) from a path result; its warnings become ``UserWarning``s."""
    import warnings

    from .model_selection import LOWER_IS_BETTER
    sel, path = result.selection, result.path
    sign = -1.0 if LOWER_IS_BETTER[sel["metric"]] else 1.0
    est.best_index_ = sel["chosen_index"]
    est.best_params_ = {name: sel[f"chosen_{name}"]}
    est.best_score_ = float(path["validation_score"][est.best_index_])
    scores = sign * path["validation_score"]
    est.cv_results_ = {f"param_{name}": np.asarray(path[name]).copy(), "mean_test_score": scores,
                       "rank_test_score": 1 + np.argsort(np.argsort(-scores, kind="stable"), kind="stable"),
                       f"mean_validation_{sel['metric']}": path["validation_score"].copy(),
                       "rounds": path["rounds"], "seconds": path["seconds"], **extra}
    for k in range(path["fold_scores"].shape[1]):
        est.cv_results_[f"split{k}_test_score"] = sign * path["fold_scores"][:, k]
    est.selection_ = sel
    for text in sel["warnings"]:
        warnings.warn(text, UserWarning, stacklevel=3)


def _folds_of_splits(splits, X, tasks, ids, owner):
    """Per task, each row's test fold from ``(train, test)`` index pairs over the stacked rows."""
    if isinstance(X, (list, tuple)):
        n = sum(x.shape[0] for x in X)
        tasks = np.concatenate([np.full(x.shape[0], i) for i, x in enumerate(X)])
    else:
        n = X.shape[0]
        tasks = np.zeros(n, dtype=np.int64) if tasks is None else np.asarray(tasks)
    fold = np.full(n, -1, dtype=np.int64)
    for k, pair in enumerate(splits):
        test = np.asarray(pair[1])
        if np.any(fold[test] >= 0):
            raise InputError(f"The 'cv' splits of {owner} must put every row in one test set: row "
                             f"{int(test[fold[test] >= 0][0])} is in two.")
        fold[test] = k
    if np.any(fold < 0):
        raise InputError(f"The 'cv' splits of {owner} must put every row in one test set: row "
                         f"{int(np.flatnonzero(fold < 0)[0])} is in none.")
    return [fold[tasks == t] for t in ids]


class JointSparseMTL(_MultiTaskLinear):
    """Joint-sparse multi-task learning (paper 002) as an estimator.

    Minimizes ``sum_i (1/n_i) sum_j l(w_i . x_ij, y_ij)`` subject to
    ``||W||_{1,inf} <= radius`` (or per-column l1 / l2 balls with
    ``projection='l1'`` / ``'l2'``) by projected subgradient steps
    ``eta0 / sqrt(t)``, keeping the best iterate.  ``radius`` may be a list: a
    regularization path, warm-started in order; ``path_`` then holds per radius
    the objective, the number of selected features and the solution.

    ``fit_intercept``: an unpenalized per-task intercept, not projected, stepped by
    ``intercept_eta0 / sqrt(t)``.

    ``cv`` (with a list of radii): choose the radius by validation
    (:func:`hpcmtl.model_selection.train_radius_path`; the values of
    :class:`DMTRLCV`'s ``cv``, ``metric`` alike): every fold solves the path,
    smallest radius first, the chosen radius is refit on all rows.  Fitted then
    also: ``radius_``, ``best_params_``, ``best_index_``, ``best_score_``,
    ``cv_results_`` (``param_radius``, ...), ``selection_``; ``path_`` is the
    selection's (``radius``, ``validation_score``, ``fold_scores``, ``rounds``,
    ``seconds``, ``selected`` a radius a fold).

    Fitted attributes: ``W_`` (d x m, at the last radius), ``intercept_``, ``history_``,
    ``path_``, ``selected_features_`` (rows of W_ that are not zero), ``tasks_``.
    """

    def __init__(self, loss="hinge", radius=1.0, projection="l1inf", eta0=1.0, max_rounds=200, gamma=1.0,
                 seed=0, rff_dim=0, rff_gamma=1.0, fit_intercept=True, intercept_eta0=1.0, cv=None, metric=None):
        keep_params(self, locals())

    def fit(self, X, y, tasks=None):
        from .cluster import Cluster
        from .joint_sparse import JointSparseConfig, train
        for radius in np.atleast_1d(self.radius):              # every radius of a path, as the last one
            validate({"radius": radius}, type(self).__name__)
        radii = list(np.atleast_1d(self.radius).astype(float))
        params = {k: v for k, v in self.get_params().items() if k not in ("cv", "metric")}
        config = JointSparseConfig(**dict(params, radius=radii[-1])).validate(type(self).__name__)
        source, ids = self._fit_source(X, y, tasks)
        if self.cv is not None or self.metric is not None:
            from .model_selection import Selection, train_radius_path
            owner = type(self).__name__
            selection = Selection(radii, metric=self.metric, name="radius",
                                  **_split_of(self.cv, X, tasks, ids, owner)).validate(config.loss, owner)
            result = train_radius_path(Cluster.serial(), source, config, selection)
            self.radius_ = result.selection["chosen_radius"]
            _keep_selection(self, result, "radius", {"selected": result.path["selected"]})
        else:
            result = train(Cluster.serial(), source, config, radii=radii)
        self._fitted(result.W, source, ids, _feature_map(config, source), result.intercept)
        self.history_ = result.history
        self.path_ = result.path
        self.selected_features_ = np.flatnonzero(np.abs(result.W).max(axis=1))
        return self


def _feature_map(config, source):
    if not config.rff_dim:
        return None
    from .features import rff_map
    return rff_map(source.n_features, config.rff_dim, config.rff_gamma, config.seed)


class GraphMTL(_MultiTaskLinear):
    """Graphical multi-task learning (paper 003): a task graph's kernel K couples the tasks.

    ``exact=True``: an SVM (scikit-learn's SVC, i.e. libsvm) on the precomputed
    product multi-task kernel ``K_st k(x, y)``, minimizing
    ``1/2 ||f||^2 + C sum_m hinge``; memory n x n, so for small data.
    ``exact=False``: the distributed DMTRL engine with K as its fixed task
    covariance, minimizing ``sum_t mean_j l + (lam/2) tr(W K^-1 W^T)`` over
    random Fourier features of the RBF base kernel (``rff_dim``) or linear x.

    ``graph``: a topology name (cycle, chain, complete, star, 'grid RxC', empty),
    an edge-list CSV path, or a weight matrix; ``alpha``: scalar or per task.

    Intercepts: ``exact=False`` as :class:`DMTRL` (``fit_intercept``,
    ``intercept_scaling``).  ``exact=True``: libsvm has one shared unpenalized
    bias; with ``fit_intercept`` the kernel also gets a per-task constant
    ``intercept_scaling^2 [s == t]``, i.e. a per-task bias penalized like the
    rest of f (``intercept_`` holds each task's total bias: its own plus the
    shared one).
    Fitted: ``K_`` (task kernel: m x m; ``exact=False`` at many tasks, from
    ``hpcmtl.task_graph.SPARSE_GRAPH_MIN_TASKS`` = 512 on, a :class:`hpcmtl.covariance.GraphSigma` held sparse,
    with ``.dense()``, ``.diag()``, ``.matmul(X)``, ``.rows(idx)``), ``tasks_``, ``intercept_``, and ``svc_`` or
    ``W_``.
    """

    def __init__(self, kernel="rbf", graph="cycle", alpha=2.0 ** -8, normalize=True, exact=True, C=1.0,
                 gamma=1.0, degree=3, coef0=1.0, lam=1e-3, loss="hinge", rff_dim=500, seed=0, tol=1e-4,
                 max_rounds=2000, fit_intercept=True, intercept_scaling=1.0):
        keep_params(self, locals())

    def _is_classifier(self):
        return self.exact or super()._is_classifier()      # exact: an SVM, whatever the loss

    def _kernel_params(self):
        if self.kernel == "rbf":
            return {"gamma": self.gamma}
        if self.kernel == "poly":
            return {"gamma": self.gamma, "degree": self.degree, "coef0": self.coef0}
        if self.kernel == "linear":
            return {}
        validate({"kernel": self.kernel}, type(self).__name__)

    def fit(self, X, y, tasks=None):
        from .task_graph import graph_adjacency, graph_covariance, task_kernel
        validate({name: getattr(self, name) for name in ("kernel", "normalize", "exact", "gamma", "degree", "coef0",
                                                         "lam", "tol", "max_rounds", "seed", "rff_dim")},
                 type(self).__name__)
        params = self._kernel_params()
        source, ids = self._fit_source(X, y, tasks)
        if self.exact:             # the product kernel's n x n Gram matrix: small data, the dense K
            self.K_ = task_kernel(graph_adjacency(self.graph, source.names), self.alpha, self.normalize, source.names)
        else:                      # the engine's fixed Sigma: held sparse from task_graph.SPARSE_GRAPH_MIN_TASKS on
            self.K_ = graph_covariance(graph_adjacency(self.graph, source.names, sparse=True), self.alpha,
                                       self.normalize, source.names)
        if self.exact:
            import scipy.sparse as sp
            from sklearn.svm import SVC

            from .task_graph import product_gram
            rows = [source.read_task(i) for i in range(source.n_tasks)]
            Xs = [r.X for r in rows]
            self.X_fit_ = sp.vstack(Xs, format="csr") if sp.issparse(Xs[0]) else np.vstack(Xs)
            self.task_index_fit_ = np.repeat(np.arange(source.n_tasks), source.n_samples)
            validate({"fit_intercept": self.fit_intercept, "intercept_scaling": self.intercept_scaling},
                     type(self).__name__)
            gram = product_gram(self.X_fit_, self.task_index_fit_, self.K_, self.kernel, **params)
            gram = gram + self._task_constant(self.task_index_fit_, self.task_index_fit_)
            self.svc_ = SVC(kernel="precomputed", C=self.C).fit(gram, np.concatenate([r.y for r in rows]))
            # each task's bias: s^2 sum of its rows' dual coefficients (the per-task constant) + libsvm's shared one
            coef = np.zeros(source.n_tasks)
            np.add.at(coef, self.task_index_fit_[self.svc_.support_], self.svc_.dual_coef_.ravel())
            scale = self.intercept_scaling ** 2 if self.fit_intercept else 0.0
            self._fitted(None, source, ids, intercept=scale * coef + float(self.svc_.intercept_[0]))
            return self
        from .cluster import Cluster
        from .dmtrl import DMTRLConfig, train
        if self.kernel not in ("rbf", "linear"):
            raise InputError("exact=False supports the rbf (random Fourier features) and linear base kernels")
        config = DMTRLConfig(loss=self.loss, lam=self.lam, relationship="fixed", tol=self.tol, seed=self.seed,
                             rff_dim=self.rff_dim if self.kernel == "rbf" else 0, rff_gamma=self.gamma,
                             max_rounds=self.max_rounds, fit_intercept=self.fit_intercept,
                             intercept_scaling=self.intercept_scaling).validate(type(self).__name__)
        result = train(Cluster.serial(), source, config, sigma_fixed=self.K_)
        self._fitted(result.W, source, ids, _feature_map(config, source), result.intercept)
        self.history_ = result.history
        return self

    def _scores(self, X, cols):
        if self.W_ is not None:                     # exact=False: linear in the features
            return super()._scores(X, cols)
        from .task_graph import product_gram
        gram = product_gram(X, cols, self.K_, self.kernel, Y=self.X_fit_, tasks_Y=self.task_index_fit_,
                            **self._kernel_params())
        return self.svc_.decision_function(gram + self._task_constant(cols, self.task_index_fit_))

    def _task_constant(self, tasks_a, tasks_b):
        """``intercept_scaling^2 [s == t]``: the per-task bias term of the exact kernel (0 without fit_intercept)."""
        if not self.fit_intercept:
            return 0.0
        return self.intercept_scaling ** 2 * (np.asarray(tasks_a)[:, None] == np.asarray(tasks_b)[None, :])


# ---------------------------------------------------------------------------
# Online multitask learning (paper 004): in-process learners over the rules of online_rules
# ---------------------------------------------------------------------------
def _instances(X, k, owner):
    """(rows, n_rounds, per_task) from shared instances (T x d) or per-task ones ((T, k, d) or k matrices)."""
    if isinstance(X, (list, tuple)):
        if len(X) != k:
            raise InputError(f"{owner}: per-task instances need one matrix per task ({k}), got {len(X)}")
        T = X[0].shape[0]
        if any(x.shape[0] != T for x in X):
            raise InputError(f"{owner}: every task's instance matrix needs the same number of rounds")
        order = (np.arange(k)[None, :] * T + np.arange(T)[:, None]).ravel()   # row t * k + j
        if any(sp.issparse(x) for x in X):
            stacked = sp.vstack([sp.csr_matrix(x) for x in X], format="csr")[order]
        else:
            stacked = np.vstack([np.asarray(x, dtype=np.float64) for x in X])[order]
        rows, Xc = rows_of(stacked)
        return rows, Xc, T, True
    if not sp.issparse(X) and np.ndim(X) == 3:
        X = np.asarray(X, dtype=np.float64)
        if X.shape[1] != k:
            raise InputError(f"{owner}: per-task instances of shape (T, k, d) need k = {k}, got {X.shape[1]}")
        rows, Xc = rows_of(X.reshape(-1, X.shape[2]))
        return rows, Xc, X.shape[0], True
    if not sp.issparse(X) and np.ndim(X) != 2:
        raise InputError(f"{owner}: X must be (T x d) shared instances, (T, k, d) or a list of k matrices")
    rows, Xc = rows_of(X)
    return rows, Xc, Xc.shape[0], False


def typical_round(X, Y):
    """(active tasks a round, mean ||x||^2 over instance rows) of a batch: what ``C="auto"`` scales with."""
    sq = np.asarray(X.multiply(X).sum(axis=1) if sp.issparse(X) else np.einsum("ij,ij->i", X, X)).ravel()
    return float(np.mean(np.sum(Y != 0, axis=1))) if len(Y) else 0.0, float(np.mean(sq)) if sq.size else 0.0


def _check_finite(Xc, owner):
    values = Xc.data if sp.issparse(Xc) else Xc
    if not np.all(np.isfinite(values)):
        raise InputError(f"{owner}: field 'X' contains NaN or Inf")


class OnlineMultitask(BaseEstimator):
    """k binary tasks learned online under a shared global loss (paper 004).

    Parameters
    ----------
    update : ``"implicit"`` (recommended, Sec. 5), ``"perceptron"`` (finite horizon, Sec. 3)
        or ``"infinite"`` (Sec. 4)
    norm : ``"rmax"`` (with ``r``; r = 1 is L-inf, r = k is L1), ``"linf"``, ``"l1"``, ``"l2"`` or
        ``"p"`` (with ``p``; Perceptron rules only unless p is 1, 2 or inf)
    C : aggressiveness, ``||tau||^* <= C``; ``"auto"``: :func:`hpcmtl.online_rules.auto_C` from the first
        ``partial_fit`` batch (its mean ``||x||^2`` and active tasks a round)
    R : bound on ``||x||`` (the infinite-horizon update)

    The rules are :mod:`hpcmtl.online_rules` (Corollary 5's C for a known number of
    rounds is :func:`hpcmtl.online_rules.horizon_C`: pass it as C).  ``__init__`` only
    stores the parameters; they are validated by the first ``partial_fit``, and ``fit`` starts over
    with the current ones.

    ``partial_fit(X, Y)`` runs rounds in order: X is (T x d) dense or sparse
    (one shared instance per round), (T, k, d), or a list of k (T x d)
    matrices (one instance per task); Y is (T x k) in {-1, +1}, 0 for a
    dormant task.  Learned: ``coef_`` (k x d), ``history_`` (per-round global
    loss, errors), ``n_rounds_``.
    """

    def __init__(self, update="implicit", norm="rmax", r=1, p=2.0, C=1.0, R=None):
        keep_params(self, locals())

    def _rule(self, k, typical):
        return make_rule(k, self.C, self.update, self.norm, self.p, self.r, self.R, owner=type(self).__name__,
                         typical=typical)

    def _prepare(self, X, Y):
        owner = type(self).__name__
        Y = np.ascontiguousarray(Y, dtype=np.float64)
        if Y.ndim != 2:
            raise InputError(f"{owner}: Y must be (T x k) with -1/+1 (0 for a dormant task), got shape {Y.shape}")
        if not np.all(np.isin(Y, (-1.0, 0.0, 1.0))):
            raise InputError(f"{owner}: field 'Y' must hold -1, +1 or 0 (dormant)")
        k = Y.shape[1]
        rows, Xc, T, per_task = _instances(X, k, owner)
        _check_finite(Xc, owner)
        if T != Y.shape[0]:
            raise InputError(f"{owner}: X has {T} rounds but Y has {Y.shape[0]}")
        if hasattr(self, "W_"):
            if self.W_.shape != (rows.n_features, k):
                raise InputError(f"{owner}: partial_fit got {rows.n_features} features and {k} tasks, "
                                 f"earlier calls had {self.W_.shape[0]} and {self.W_.shape[1]}")
        else:
            self.rule_ = self._rule(k, typical_round(Xc, Y))
            self.W_ = np.zeros((rows.n_features, k))
            self.metrics_ = self._new_metrics()
        return rows, Y, T, per_task

    def partial_fit(self, X, Y):
        rows, Y, T, per_task = self._prepare(X, Y)
        margins = np.empty((T, Y.shape[1]))
        gloss = np.empty(T)
        if T:
            _online.online_rounds(rows, per_task, Y, self.W_, *self.rule_.args(), margins, gloss)
        self._record(Y, margins, gloss)
        return self

    def _new_metrics(self):
        return RunningMetrics()

    def _record(self, Y, margins, gloss):
        self.metrics_.add(Y, margins, gloss)

    def fit(self, X, Y):
        for name in ("W_", "rule_", "metrics_"):
            self.__dict__.pop(name, None)
        return self.partial_fit(X, Y)

    @property
    def coef_(self):
        return self.W_.T

    @property
    def history_(self):
        return self.metrics_.arrays()

    @property
    def n_rounds_(self):
        return self.metrics_.n_rounds

    def decision_function(self, X):
        """Margins ``w_j . x`` ((T x k) for shared instances, per task for (T, k, d))."""
        check_is_fitted(self, "W_")
        k = self.W_.shape[1]
        if isinstance(X, (list, tuple)):
            return np.column_stack([np.asarray(X[j] @ self.W_[:, j]).ravel() for j in range(k)])
        if not sp.issparse(X) and np.ndim(X) == 3:
            return np.einsum("tkd,dk->tk", np.asarray(X, dtype=np.float64), self.W_)
        return np.asarray(X @ self.W_)

    def predict(self, X):
        """+1 where the margin is positive, else -1."""
        return np.where(self.decision_function(X) > 0, 1.0, -1.0)

    def rank(self, X):
        """Each round's tasks (labels) from the largest margin to the smallest, ties to the lower index (T x k).

        The ranking output of a multilabel stream (:func:`hpcmtl.output_codes.rank_labels`): a round
        whose margins are all negative still has a first label.
        """
        return rank_labels(self.decision_function(X))


class OnlineECOC(OnlineMultitask):
    """Multiclass online learning through an output code (paper 004, Sec. 8.2).

    The code's columns are the binary tasks, learned under the global norm
    (r-max by default: the paper recommends r slightly below half the code
    distance).  ``code``: ``"auto"`` (the default code for n_classes,
    :func:`hpcmtl.output_codes.auto_code`), ``"exhaustive"`` (for 5 classes the
    paper's 5 x 15 matrix), ``"one-vs-rest"``, ``"random:K"`` or an (s x K) +-1
    array.  ``decoder``: ``"loss"`` (loss-based decoding, the least summed hinge
    loss) or ``"hamming"`` (:func:`hpcmtl.output_codes.decode`), used by
    ``predict``, ``decision_function`` and the running multiclass error.
    ``partial_fit(X, classes)`` with classes in 0..n_classes-1.
    """

    def __init__(self, n_classes=5, code="auto", update="implicit", norm="rmax", r=3, p=2.0, C=1.0,
                 R=None, decoder="loss"):
        super().__init__(update, norm, r, p, C, R)
        self.n_classes = n_classes
        self.code = code
        self.decoder = decoder

    def _new_metrics(self):
        return RunningMetrics(self.decoder)

    def partial_fit(self, X, classes):
        if self.decoder not in DECODERS:
            raise InputError(f"The 'decoder' parameter of OnlineECOC must be one of {', '.join(DECODERS)}. "
                             f"Got {self.decoder!r} instead.")
        if not hasattr(self, "code_"):
            self.code_ = get_code(self.code, self.n_classes)
        classes = np.asarray(classes).reshape(-1)
        if not (np.issubdtype(classes.dtype, np.integer) and np.all((classes >= 0) & (classes < self.n_classes))):
            raise InputError(f"OnlineECOC: classes must be integers in 0..{self.n_classes - 1}")
        self._classes = classes
        return super().partial_fit(X, self.code_[classes])

    def _record(self, Y, margins, gloss):
        self.metrics_.add(Y, margins, gloss, self.code_, self._classes)

    def fit(self, X, classes):
        self.__dict__.pop("code_", None)
        return super().fit(X, classes)

    def code_margins(self, X):
        """The code columns' margins ``w_j . x`` (T x K), what the decoder reads."""
        return super().decision_function(X)

    def decision_function(self, X):
        """Class scores (T x n_classes), larger is better: minus the summed hinge loss of each class's code row
        (``decoder="loss"``) or minus its Hamming distance from the margins' signs (``"hamming"``)."""
        return class_scores(self.code_margins(X), self.code_, self.decoder)

    def predict(self, X):
        """The decoded class of each round (:func:`hpcmtl.output_codes.decode`, its documented tie rule)."""
        return decode(self.code_margins(X), self.code_, self.decoder)

