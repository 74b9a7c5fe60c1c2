"""Slow, obviously-correct NumPy references for the compiled kernels."""
import numpy as np

from hpcmtl.losses import conjugate_reference

MASK = (1 << 64) - 1


class SplitMix64:
    """The kernel's generator, in Python integers."""

    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def bounded(self, n):
        return int(float(self.next() >> 11) * (1.0 / 9007199254740992.0) * n)

    def permutation(self, n):
        perm = list(range(n))
        for i in range(n - 1, 0, -1):
            j = self.bounded(i + 1)
            perm[i], perm[j] = perm[j], perm[i]
        return perm


def coordinate_step_reference(loss, y, a, ux, q, gamma=1.0):
    """argmax_delta -l*(-(a+delta)) - delta ux - q/2 delta^2, by the closed forms of DESIGN.md."""
    if loss == "squared":
        return (y - ux - a) / (1 + q)
    b = y * a
    if loss == "hinge":
        return y * np.clip(b + (1 - y * ux) / q, 0, 1) - a
    if loss == "smoothed-hinge":
        return y * np.clip((q * b + 1 - y * ux) / (gamma + q), 0, 1) - a
    # logistic: bisection on the monotone optimality condition (100 halvings)
    z = y * ux
    lo, hi = 0.0, 1.0
    for _ in range(200):
        t = 0.5 * (lo + hi)
        g = np.log1p(-t) - np.log(t) - z - q * (t - b) if 0 < t < 1 else (np.inf if t <= 0 else -np.inf)
        lo, hi = (t, hi) if g > 0 else (lo, t)
    return y * 0.5 * (lo + hi) - a


def local_objective(loss, y, a, ux, q, delta, gamma=1.0):
    return -conjugate_reference(loss, a + delta, y, gamma) - delta * ux - 0.5 * q * delta ** 2


def sdca_local_reference(X, y, alpha, w, rho_sigma_over_lam, n_task, n_steps, seed, loss, gamma=1.0):
    """Algorithm 2 on Eq. 4, one coordinate at a time in the kernel's order."""
    X = X.toarray() if hasattr(X, "toarray") else np.asarray(X)
    alpha = alpha.copy()
    n = X.shape[0]
    rng = SplitMix64(seed)
    delta_b = np.zeros(X.shape[1])
    steps, perm = 0, []
    while steps < n_steps:
        if not perm:
            perm = rng.permutation(n)
        j = perm.pop(0)
        steps += 1
        u = w + rho_sigma_over_lam * delta_b
        q = rho_sigma_over_lam * X[j] @ X[j] / n_task
        delta = coordinate_step_reference(loss, y[j], alpha[j], X[j] @ u, q, gamma)
        alpha[j] += delta
        delta_b += delta * X[j] / n_task
    return alpha, delta_b
