"""A grid chosen by validation, solved in one job on the same ranks: lam or a graph kernel's alpha over DMTRL
fits, the radius over joint-sparse fits.

Every selection runs under one driver (:func:`hpcmtl.model_selection.driver.cross_validate`):
every rank reads its blocks of the whole plan once (:func:`hpcmtl.engine.load_blocks`);
each task's rows get a fold id, a pure function of (seed, task, the task's labels), so
the split is the same at any rank count and with ``--split-tasks``:

* hold-out (``validation_fraction F``): ``clip(round(F n_i), 1, n_i - 1)`` rows of
  every task are held out (fold 0), the others (fold ``HOLDOUT``) are always
  trained on;
* K-fold (``cv K``): every row gets a fold in ``0..K-1``.

Classification splits are stratified: the task's rows are put in a random order
(seeded by ``SeedSequence([seed, task, SPLIT_STREAM])``), grouped by label, and
each label gets its share of validation rows (largest remainder) or its rows
dealt round-robin over the folds.

For each fold the rank cuts its blocks into training rows (a new block whose
``n_task`` is the task's training count) and validation rows; the fold's plan is
passed to its fits as a planned cluster.  The method's hooks fit the grid on the
fold (:mod:`.lam`, :mod:`.radius`) and score its validation rows.  The score of a
point is the metric over all validation rows of a fold (``rmse``, ``error``,
``logloss``: rows pooled over tasks; ``auc``: the mean over tasks of each task's
AUC), averaged over folds; the best point (the most regularized among equal
scores: the grid is solved in that order) is refit on all the training rows,
warm-started from that point's solution.

Modules: :mod:`.split` (the selection, the fold ids and plans, the scores),
:mod:`.driver` (the skeleton and its hooks), :mod:`.lam` (:func:`train_path`),
:mod:`.radius` (:func:`train_radius_path`).
"""
from .driver import Search, ServerMaker, Split, cross_validate, edge_warning  # noqa: F401
from .lam import LamSearch, PathBlocks, PathCommand, PathServer, PathTrainResult, fit, train_path  # noqa: F401
from .radius import RadiusBlocks, RadiusCommand, RadiusSearch, RadiusServer, train_radius_path  # noqa: F401
from .split import (DEFAULT_FRACTION, HOLDOUT, LOWER_IS_BETTER, SPLIT_STREAM, Selection, TrainingRows,  # noqa: F401
                    best_index, cut, fold_means, fold_plans, labels_of, local_folds, score_of, server_task_folds,
                    task_folds, validation_score)
