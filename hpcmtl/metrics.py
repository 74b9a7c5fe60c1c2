"""Test metrics per task and over tasks (scikit-learn does the arithmetic)."""
from __future__ import annotations

import numpy as np
from sklearn.metrics import mean_squared_error, roc_auc_score


def task_metrics(y: np.ndarray, scores: np.ndarray, regression: bool) -> dict:
    """Metrics of one task's predictions; sums are kept so tasks can be pooled."""
    y = np.asarray(y, float)
    scores = np.asarray(scores, float)
    out = {"n": int(y.size)}
    if regression:
        mse = float(mean_squared_error(y, scores))
        out.update(mse=mse, rmse=float(np.sqrt(mse)), sse=mse * y.size,
                   sum_y=float(y.sum()), sum_y2=float(np.dot(y, y)),
                   explained_variance=float(1.0 - mse / y.var()) if y.var() > 0 else float("nan"))
    else:
        errors = int(np.count_nonzero(np.where(scores >= 0, 1.0, -1.0) != y))
        out.update(errors=errors, error_rate=errors / max(1, y.size))
        out["auc"] = float(roc_auc_score(y, scores)) if len(np.unique(y)) == 2 else float("nan")
    return out


def summarize(per_task: list, regression: bool) -> dict:
    """Pool per-task metrics: sample-weighted (pooled) and plain task averages."""
    n = sum(t["n"] for t in per_task)
    out = {"n_tasks": len(per_task), "n_samples": n}
    if regression:
        sse = sum(t["sse"] for t in per_task)
        sum_y = sum(t["sum_y"] for t in per_task)
        sum_y2 = sum(t["sum_y2"] for t in per_task)
        var = sum_y2 / n - (sum_y / n) ** 2
        out.update(rmse=float(np.sqrt(sse / n)), mse=sse / n,
                   explained_variance=float(1.0 - (sse / n) / var) if var > 0 else float("nan"),
                   task_mean_rmse=float(np.mean([t["rmse"] for t in per_task])),
                   task_mean_explained_variance=float(np.nanmean([t["explained_variance"] for t in per_task])))
    else:
        errors = sum(t["errors"] for t in per_task)
        aucs = [t["auc"] for t in per_task if not np.isnan(t["auc"])]
        out.update(error_rate=float(np.mean([t["error_rate"] for t in per_task])),
                   pooled_error_rate=errors / max(1, n),
                   auc=float(np.mean(aucs)) if aucs else float("nan"))
    return out
