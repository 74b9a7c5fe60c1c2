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
        margin = 1 - y * ux
        return y * np.clip((q * b + margin) / (gamma + q), 0, 1) - a
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
    """Algorithm 2 on Eq. 4, one coordinate at a time in the kernel's order (no shrinking)."""
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


class ShrinkingReference:
    """liblinear's shrinking around the same steps, state kept between rounds (hinge losses)."""

    def __init__(self, n):
        self.order = list(range(n))
        self.n_active, self.pg_max_old, self.pg_min_old, self.eps = n, np.inf, -np.inf, 0.1

    def end_of_pass(self, pg_max, pg_min, n):
        if pg_max - pg_min <= self.eps:
            if self.n_active == n and self.eps > 1e-12:
                self.eps *= 0.1
            self.n_active, self.pg_max_old, self.pg_min_old = n, np.inf, -np.inf
        else:
            self.pg_max_old = pg_max if pg_max > 0 else np.inf
            self.pg_min_old = pg_min if pg_min < 0 else -np.inf

    def round(self, X, y, alpha, w, c, n_task, local_iters, seed, loss, gamma=1.0):
        X = X.toarray() if hasattr(X, "toarray") else np.asarray(X)
        n = X.shape[0]
        rng = SplitMix64(seed)
        u = w.copy()
        n_steps = max(1, int(local_iters * self.n_active + 0.5))
        step, pos = 0, self.n_active
        pg_max, pg_min = -np.inf, np.inf
        while step < n_steps:
            if pos >= self.n_active:
                if step > 0:
                    self.end_of_pass(pg_max, pg_min, n)
                    pg_max, pg_min = -np.inf, np.inf
                for i in range(self.n_active - 1, 0, -1):
                    j = rng.bounded(i + 1)
                    self.order[i], self.order[j] = self.order[j], self.order[i]
                pos = 0
            j = self.order[pos]
            ux = 0.0
            for k in np.flatnonzero(X[j]):          # the kernel's summation order
                ux += X[j, k] * u[k]
            b = y[j] * alpha[j]
            G = y[j] * ux - 1 + (gamma * b if loss == "smoothed-hinge" else 0.0)
            PG = 0.0
            if b <= 0 and G > self.pg_max_old or b >= 1 and G < self.pg_min_old:
                self.n_active -= 1
                self.order[pos], self.order[self.n_active] = self.order[self.n_active], j
                continue
            if b <= 0:
                PG = min(G, 0.0)
            elif b >= 1:
                PG = max(G, 0.0)
            else:
                PG = G
            pg_max, pg_min = max(pg_max, PG), min(pg_min, PG)
            pos += 1
            step += 1
            sq = 0.0
            for k in np.flatnonzero(X[j]):
                sq += X[j, k] * X[j, k]
            delta = coordinate_step_reference(loss, y[j], alpha[j], ux, c * sq * (1.0 / n_task), gamma)
            alpha[j] += delta
            u += (c * delta * (1.0 / n_task)) * X[j]
        if pos >= self.n_active:
            self.end_of_pass(pg_max, pg_min, n)
        elif pg_max >= pg_min:
            self.pg_max_old = pg_max if pg_max > 0 else np.inf
            self.pg_min_old = pg_min if pg_min < 0 else -np.inf
        return (u - w) / c


def project_l1inf_bisection(W, C, iters=120):
    """An independent l1,inf projection: nested bisection, no sorting.

    For removed mass theta, each row's cap mu_i solves sum_j max(|W_ij| - mu_i, 0) = theta
    (bisection on mu_i; mu_i = 0 when the row holds less than theta); sum_i mu_i(theta)
    decreases in theta, and a bisection on theta makes it C.
    """
    A = np.abs(np.asarray(W, float))
    if A.max(axis=1).sum() <= C:
        return np.array(W, float)

    def caps(theta):
        # every row at once: bisection on mu_i of sum_j max(A_ij - mu_i, 0) = theta
        lo, hi = np.zeros(A.shape[0]), A.max(axis=1).copy()
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            above = np.maximum(A - mid[:, None], 0).sum(axis=1) > theta
            lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
        return np.where(A.sum(axis=1) <= theta, 0.0, 0.5 * (lo + hi))

    lo, hi = 0.0, A.sum(axis=1).max()
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if caps(mid).sum() > C else (lo, mid)
    mu = caps(0.5 * (lo + hi))
    return np.sign(W) * np.minimum(A, mu[:, None])


def project_l1_sort(v, C):
    """Duchi et al.'s O(n log n) sort-based l1 projection."""
    a = np.abs(v)
    if a.sum() <= C:
        return v.copy()
    u = np.sort(a)[::-1]
    css = np.cumsum(u)
    rho = np.nonzero(u * np.arange(1, len(u) + 1) > (css - C))[0][-1]
    theta = (css[rho] - C) / (rho + 1.0)
    return np.sign(v) * np.maximum(a - theta, 0)
