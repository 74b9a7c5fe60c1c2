"""The radius of joint-sparse (paper 002) chosen by validation: the hooks of the driver, and the command that
scores a fold's validation rows at every radius.

Each fold solves the whole path on its training rows, smallest radius first, each
radius warm-started from the previous one's best iterate (as ``--path`` does), and
scores its validation rows at every radius.  The refit solves the chosen radius on
all the rows, warm-started from the last fold's solution there (``max_rounds``
steps, like every radius).  A subgradient method has no certificate: every point
runs ``max_rounds``.

A checkpoint (a signal, ``--checkpoint-every`` / ``--checkpoint-seconds``) holds the finished folds'
scores and selections and, during the refit, the chosen radius's warm start; a fold or the refit that was
running restarts on resume (each is a deterministic function of its rows, so the result is the same).
"""
from __future__ import annotations

import numpy as np

from .. import joint_sparse
from ..engine import Command, Down, Up
from .driver import Search, ServerMaker, cross_validate, edge_warning
from .split import Selection, score_of


class RadiusCommand(Command):
    """``ID = id, down, up, control fields, computation (a RadiusBlocks method)``."""
    # every block's [w, b] of the radius just solved -> the scores of its validation rows, per rank
    VALIDATE_COLUMNS = 112, Down.SCATTER_ROWS, Up.GATHER_VECTORS, ("width",), "validation_scores_of"


class RadiusBlocks(joint_sparse.LocalGradients):
    """:class:`hpcmtl.joint_sparse.LocalGradients` that also hold each block's validation rows (``held_out``)."""

    COMMANDS = joint_sparse.LocalGradients.COMMANDS + (RadiusCommand,)

    def __init__(self, cluster, blocks, config, held_out):
        super().__init__(cluster, blocks, config)
        self.held_out = held_out

    def validation_scores_of(self, ctrl, rows):
        """VALIDATE_COLUMNS: ``X w + b`` of every block's validation rows at the given columns, in plan order."""
        w = rows[:, :self.d]
        b = rows[:, self.d] if rows.shape[1] > self.d else np.zeros(len(self.blocks))
        parts = [h.decision(w[k]) + b[k] for k, h in enumerate(self.held_out) if h is not None]
        return np.concatenate(parts) if parts else np.zeros(0)


class RadiusServer(joint_sparse.Server):
    """A joint-sparse server that scores the validation rows after every radius of its path."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.validation, self.marks = [], [(0, 0.0)]

    def radius_solved(self):
        columns = np.hstack([self.W.T, self.b[:, None]]) if self.with_b else self.W.T
        self.validation.append(self.command(RadiusCommand.VALIDATE_COLUMNS, payload=columns[self.block_task],
                                            width=columns.shape[1]))
        self.marks.append((self.round, self.elapsed()))


class RadiusSearch(Search):
    """The hooks of :func:`hpcmtl.model_selection.driver.cross_validate` for the radius of the ball."""

    def __init__(self, config, selection, test_source=None, progress=None, note=None):
        self.config, self.selection, self.test_source, self.progress, self.note = (config, selection, test_source,
                                                                                   progress, note)
        self.last = self.warm = None

    def start(self, split):
        G = len(split.grid)
        self.selected = np.zeros((G, split.n_folds), dtype=np.int64)

    def path_arrays(self, server):
        """The folds' selections; in the refit, its warm start (the last fold's solution at the chosen radius)."""
        out = {"selected": self.selected}
        if self.position["phase"] == "refit" and self.warm is not None:
            out.update(refit_W0=self.warm[0], refit_b0=self.warm[1])
        return out

    def restore_path(self, arrays):
        self.selected[...] = arrays["selected"]
        if "refit_W0" in arrays:
            self.warm = (arrays["refit_W0"], arrays["refit_b0"])

    def fit_fold(self, split, f, fold, rows, train_blocks, held, table, first=0):
        """The whole path on fold f's training rows; its validation rows scored after every radius (a resumed
        fold runs from its start: ``first`` is 0)."""
        config, grid, n_folds, metric = self.config, split.grid, split.n_folds, self.selection.metric
        self.position["point"] = 0
        if self.checkpointer is not None:
            self.checkpointer.point_started()
        maker = ServerMaker(RadiusServer)
        result = joint_sparse.train(fold, rows, config, radii=grid,
                                    make_local=lambda: RadiusBlocks(fold, train_blocks, config, held),
                                    server_class=maker, checkpointer=self.checkpointer)
        if result is None:
            return
        server, self.last = maker.server, result
        marks = np.asarray(server.marks)
        table["rounds"] += np.diff(marks[:, 0]).astype(np.int64)
        table["seconds"] += np.diff(marks[:, 1])
        self.selected[:, f] = result.path["selected"]
        for g in range(len(grid)):
            table["fold_scores"][g, f] = score_of(server, split.info, f, metric, server.validation[g])
            if self.note is not None:
                self.note(f"radius {grid[g]:.4g} (fold {f + 1}/{n_folds}): {int(self.selected[g, f])} features "
                          f"selected, validation {metric} {table['fold_scores'][g, f]:.6g}")

    def refit(self, split, chosen):
        """The chosen radius on every row, from the last fold's solution there."""
        config, whole, blocks, tests = self.config, split.whole, split.blocks, split.tests
        if self.last is not None and self.selection.warm_start:
            self.warm = (self.last.path["W"][chosen], self.last.path["intercept"][chosen])
        W0, b0 = self.warm if self.warm is not None else (None, None)     # a resumed refit: the checkpoint's
        if self.checkpointer is not None:
            self.checkpointer.point_started()
        return joint_sparse.train(whole, split.source, config, self.test_source, W0=W0, b0=b0,
                                  progress=self.progress, radii=[split.grid[chosen]], checkpointer=self.checkpointer,
                                  make_local=lambda: joint_sparse.LocalGradients(whole, blocks, config, tests))

    def finish(self, split, result, chosen, table):
        selection, grid = self.selection, split.grid
        edge = edge_warning("radius", grid, chosen)
        warnings = [edge] if edge is not None else []
        chosen_info = dict(split.how(), parameter="radius", chosen_radius=grid[chosen], chosen_index=chosen,
                           metric=selection.metric, warm_start=selection.warm_start,
                           split_digest=split.info["digest"], warnings=warnings)
        result.path = {"radius": np.asarray(grid), "validation_score": table["validation_score"],
                       "fold_scores": table["fold_scores"], "rounds": table["rounds"], "seconds": table["seconds"],
                       "selected": self.selected, "refit_selected": np.asarray(result.path["selected"])}
        result.selection = chosen_info
        result.config = dict(result.config, radius=grid[chosen], selection=chosen_info)
        return result


def train_radius_path(cluster, source, config, selection: Selection, test_source=None, progress=None, note=None,
                      checkpointer=None, resume=None):
    """Joint-sparse (paper 002): choose the ball's radius from ``selection.grid`` by validation, refit on all rows
    (server: a :class:`hpcmtl.joint_sparse.JointSparseResult` whose ``path`` is the selection's and whose
    ``selection`` says what was chosen; workers: None)."""
    if selection.name != "radius":
        raise ValueError(f"train_radius_path chooses a radius, not {selection.name!r}")
    search = RadiusSearch(config, selection, test_source, progress=progress, note=note)
    return cross_validate(cluster, source, config, selection, search, test_source, checkpointer, resume)
