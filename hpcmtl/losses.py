"""Loss registry: the one place a loss name becomes a kernel id (``_sdca.LossId``).

Each loss knows its kernel id, whether labels must be exactly -1/+1, and which
metrics make sense for it.  Primal values and conjugates are computed by the
compiled kernels; the slow NumPy versions here are the reference the tests
compare against.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np

from ._sdca import LossId
from .errors import InputError


@dataclass(frozen=True)
class Loss:
    name: str
    kernel_id: LossId
    binary_labels: bool
    smooth: bool
    description: str


LOSSES = {
    "hinge": Loss("hinge", LossId.HINGE, True, False, "max(0, 1 - y z)"),
    "smoothed-hinge": Loss("smoothed-hinge", LossId.SMOOTHED_HINGE, True, True,
                           "0 if yz >= 1; 1 - yz - gamma/2 if yz <= 1 - gamma; (1 - yz)^2 / (2 gamma)"),
    "squared": Loss("squared", LossId.SQUARED, False, True, "0.5 (z - y)^2"),
    "logistic": Loss("logistic", LossId.LOGISTIC, True, True, "log(1 + exp(-y z))"),
}


def closest(name: str, choices) -> str:
    """' Did you mean X?' for a misspelt choice, or ''."""
    match = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.5)
    return f" Did you mean '{match[0]}'?" if match else ""


def get_loss(name: str) -> Loss:
    """Validated lookup; unknown names get the closest valid one suggested."""
    try:
        return LOSSES[name]
    except KeyError:
        raise InputError(
            f"unknown loss '{name}'; valid losses: {', '.join(LOSSES)}.{closest(name, LOSSES)}"
        ) from None


def check_choice(name: str, value, choices, owner: str):
    """Estimator-style message for a parameter outside its choices, with the closest suggestion."""
    if value not in choices:
        raise InputError(f"The '{name}' parameter of {owner} must be one of {', '.join(choices)}. "
                         f"Got {value!r} instead.{closest(value, choices)}")


def check_labels(loss: Loss, y: np.ndarray, where: str) -> None:
    """Hinge-type and logistic losses need labels exactly -1 or +1 (see :func:`signed_labels` for others)."""
    if loss.binary_labels:
        bad = ~((y == 1.0) | (y == -1.0))
        if np.any(bad):
            value = float(y[np.argmax(bad)])
            n_values = np.unique(y).size
            if n_values <= 2:
                hint = (f" (two other classes: pass --positive-label, e.g. --positive-label {value:g} if {value:g} is "
                        f"the positive class)")
            elif np.all(np.isfinite(y)):
                # real-valued targets: a regression, which only the squared loss fits
                hint = (f" ({n_values} distinct values: for real-valued targets use --loss squared; for one class "
                        f"against the rest, --positive-label)")
            else:
                hint = ""
            raise InputError(f"{where}: field 'y': the {loss.name} loss needs labels -1/+1, found {value!r}{hint}")


def signed_labels(loss: Loss, y: np.ndarray, positive_label, where: str) -> np.ndarray:
    """Labels as the solvers read them: ``y == positive_label`` -> +1, the other class -> -1.

    ``positive_label`` None leaves ``y`` as it is (-1/+1 files, or the squared loss).
    A block may hold at most two label values (the positive one and one other);
    anything else is an :class:`InputError` naming ``where`` and the field.
    Then :func:`check_labels`.
    """
    if positive_label is None or not loss.binary_labels:
        check_labels(loss, y, where)
        return y
    others = np.unique(y[y != positive_label])
    if others.size > 1:
        raise InputError(f"{where}: field 'y': --positive-label {positive_label:g} needs two classes, found "
                         f"{np.unique(y).size} label values ({', '.join(f'{v:g}' for v in np.unique(y)[:5])}"
                         f"{', ...' if np.unique(y).size > 5 else ''})")
    return np.where(y == positive_label, 1.0, -1.0)


def loss_and_derivative(name: str, z, y, gamma: float = 1.0):
    """Per-example loss values and derivatives dl/dz (a subgradient for hinge), vectorized."""
    z = np.asarray(z, float)
    y = np.asarray(y, float)
    if name == "hinge":
        active = y * z < 1.0
        return np.maximum(0.0, 1.0 - y * z), np.where(active, -y, 0.0)
    if name == "smoothed-hinge":
        m = 1.0 - y * z
        values = np.where(m <= 0, 0.0, np.where(m >= gamma, m - gamma / 2, m * m / (2 * gamma)))
        return values, -y * np.clip(m / gamma, 0.0, 1.0)
    if name == "squared":
        return 0.5 * (z - y) ** 2, z - y
    if name == "logistic":
        t = -y * z
        return np.logaddexp(0.0, t), -y * 0.5 * (1.0 + np.tanh(0.5 * t))     # -y sigmoid(-y z)
    raise KeyError(name)


# --- slow NumPy references (tests only compare the kernels with these) -------

def primal_reference(name: str, z, y, gamma: float = 1.0):
    z = np.asarray(z, float)
    y = np.asarray(y, float)
    if name == "hinge":
        return np.maximum(0.0, 1.0 - y * z)
    if name == "smoothed-hinge":
        m = 1.0 - y * z
        return np.where(m <= 0, 0.0, np.where(m >= gamma, m - gamma / 2, m * m / (2 * gamma)))
    if name == "squared":
        return 0.5 * (z - y) ** 2
    if name == "logistic":
        return np.logaddexp(0.0, -y * z)
    raise KeyError(name)


def conjugate_reference(name: str, a, y, gamma: float = 1.0):
    """l*(-a) for feasible a."""
    a = np.asarray(a, float)
    y = np.asarray(y, float)
    if name == "hinge":
        return -y * a
    if name == "smoothed-hinge":
        return -y * a + 0.5 * gamma * a * a
    if name == "squared":
        return 0.5 * a * a - a * y
    if name == "logistic":
        # every log's argument is in (0, 1] (a NaN b takes the 1.0 branch), so no floating-point warning can
        # arise and no np.errstate is entered: the server's step problems call this some 4 times a round a
        # task, and the context manager was a fifth of its time on Landmine-sized tasks
        b = np.clip(y * a, 0.0, 1.0)
        t1 = np.where(b > 0, b * np.log(np.where(b > 0, b, 1.0)), 0.0)
        t2 = np.where(b < 1, (1 - b) * np.log(np.where(b < 1, 1 - b, 1.0)), 0.0)
        return t1 + t2
    raise KeyError(name)
