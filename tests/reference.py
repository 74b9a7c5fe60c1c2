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


# ---------------------------------------------------------------------------
# Online multitask learning (paper 004): independent solvers of the tau problems
# ---------------------------------------------------------------------------
def dual_norm(tau, norm, p=2.0, r=1):
    """||tau||^* of the global norm (Eq. 3 for r-max; the conjugate exponent for p-norms)."""
    tau = np.abs(np.asarray(tau, dtype=float))
    k = tau.size
    if norm == "linf":
        norm, r = "rmax", 1
    if norm == "l1":
        norm, r = "rmax", k
    if norm == "rmax":
        return max(tau.max(initial=0.0), tau.sum() / r)
    p = 2.0 if norm == "l2" else p
    q = p / (p - 1)
    return float(np.sum(tau ** q) ** (1 / q))


def global_norm(loss, norm, p=2.0, r=1):
    loss = np.abs(np.asarray(loss, dtype=float))
    if norm == "linf":
        return float(loss.max(initial=0.0))
    if norm == "l1":
        return float(loss.sum())
    if norm == "rmax":
        return float(np.sort(loss)[::-1][:r].sum())
    p = 2.0 if norm == "l2" else p
    return float(np.sum(loss ** p) ** (1 / p))


def implicit_objective(tau, loss, sq):
    """Lemma 8's objective sum_j 2 tau_j l_j - tau_j^2 ||x_j||^2."""
    return float(np.sum(2 * tau * loss - tau ** 2 * sq))


def implicit_rmax_enumerate(loss, sq, C, r):
    """Sec. 7's 'straightforward and excessively inefficient' solver: every (zero, free, capped) pattern.

    Free coordinates take ``(l_j - theta) / s_j`` with theta 0 (sum constraint slack)
    or given by Eq. 34 (sum constraint tight); the best feasible candidate is the
    optimum (the objective is strictly concave for s > 0).  Exponential in k.
    """
    import itertools
    loss, sq = np.asarray(loss, float), np.asarray(sq, float)
    k = loss.size
    best, best_tau = -np.inf, None
    for pattern in itertools.product((0, 1, 2), repeat=k):
        pattern = np.array(pattern)
        free, capped = pattern == 1, pattern == 2
        thetas = [0.0]
        if free.any():
            thetas.append((np.sum(loss[free] / sq[free]) + capped.sum() * C - r * C) / np.sum(1 / sq[free]))
        for theta in thetas:
            if theta < 0:
                continue
            t = np.zeros(k)
            t[capped] = C
            t[free] = (loss[free] - theta) / sq[free]
            if np.any(t < -1e-12) or np.any(t > C + 1e-12) or t.sum() > r * C * (1 + 1e-12):
                continue
            value = implicit_objective(t, loss, sq)
            if value > best:
                best, best_tau = value, t
    return best_tau


def implicit_l2_brentq(loss, sq, C):
    """Sec. 6 by a bracketing root finder on Eq. 27 (independent of the kernel's Newton iteration)."""
    from scipy.optimize import brentq
    loss, sq = np.asarray(loss, float), np.asarray(sq, float)
    free = loss / np.where(sq > 0, sq, np.nan)
    if np.all(sq[loss > 0] > 0) and np.sum(free[loss > 0] ** 2) <= C * C:
        return np.where(loss > 0, free, 0.0)
    pos = loss > 0                      # a task with no loss takes tau = 0 (and 0 / 0 when ||x||^2 = 0 too)
    phi = lambda th: np.sum((loss[pos] / (sq[pos] + th)) ** 2) - C * C  # noqa: E731
    hi = np.sqrt(np.sum(loss ** 2)) / C + 1.0
    while phi(hi) >= 0:                 # at hi the root can sit within rounding (huge losses): widen the bracket
        hi *= 2.0
    theta = brentq(phi, 1e-300 if np.any(sq[pos] == 0) else 0.0, hi, xtol=1e-15, rtol=1e-15, maxiter=500)
    return np.where(pos, loss / np.where(pos, sq + theta, 1.0), 0.0)


def slsqp_max(objective, constraint, k, C, x0=None):
    """A general-purpose solver: maximize objective(tau) over tau >= 0 with constraint(tau) >= 0 (SLSQP)."""
    from scipy.optimize import minimize
    res = minimize(lambda t: -objective(t), np.full(k, C / (2 * k)) if x0 is None else x0, method="SLSQP",
                   bounds=[(0, None)] * k, constraints=[{"type": "ineq", "fun": constraint}],
                   options={"ftol": 1e-15, "maxiter": 1000})
    return res.x


def online_reference(X, Y, tau_rule):
    """Fig. 1 written out with NumPy: margins, hinge losses, tau_rule(loss, sq), additive update."""
    T, k = Y.shape
    W = np.zeros((X.shape[1], k))
    margins = np.zeros((T, k))
    for t in range(T):
        x = np.asarray(X[t].todense()).ravel() if hasattr(X, "todense") else X[t]
        m = x @ W
        margins[t] = m
        loss = np.where(Y[t] != 0, np.maximum(0, 1 - Y[t] * m), 0.0)
        tau = tau_rule(loss, np.full(k, x @ x))
        W += np.outer(x, tau * Y[t])
    return W, margins


# ---------------------------------------------------------------------------
# Local SDCA written as liblinear's loop (issue 12: exhausted active sets restart)
# ---------------------------------------------------------------------------
def _float_bisect(f, lo, hi):
    """The float t in [lo, hi] where the decreasing f changes sign, to one ulp: bisection on the bit patterns."""
    a, b = np.float64(lo).view(np.int64), np.float64(hi).view(np.int64)   # order-preserving for t >= 0
    while b - a > 1:
        mid = a + (b - a) // 2
        if f(float(np.int64(mid).view(np.float64))) > 0:
            a = mid
        else:
            b = mid
    return float(np.int64(b).view(np.float64))


def coordinate_step_exact(loss, y, a, ux, q, gamma=1.0):
    """The coordinate maximizer for every q >= 0: a zero row (q = 0) included, logistic to one ulp.

    Hinge with q = 0: the objective is linear in b = y (a + delta), so b goes to the
    edge its slope 1 - y ux points to (and stays where it is on a zero slope).
    Logistic: the root of log((1 - t) / t) - y ux - q (t - y a) by bisection on the
    floats of (0, 1) (no Newton iteration, no tolerance).
    """
    if loss == "hinge" and q == 0:
        margin = 1 - y * ux
        b = 1.0 if margin > 0 else (0.0 if margin < 0 else y * a)
        return y * b - a
    if loss == "logistic":
        z, b = y * ux, y * a

        def g(t):
            return np.log1p(-t) - np.log(t) - z - q * (t - b) if t > 0 else np.inf
        return y * _float_bisect(g, 0.0, np.nextafter(1.0, 0.0)) - a
    with np.errstate(over="ignore"):                     # margin / q = inf at a tiny q: clipped to the box
        return coordinate_step_reference(loss, y, a, ux, q, gamma)


def sequential_dot(x, v):
    """sum_k x_k v_k over the non-zeros of x in index order (the kernels' summation order)."""
    s = 0.0
    for k in np.flatnonzero(x):
        s += x[k] * v[k]
    return s


class LocalSDCAReference:
    """``sdca_local`` as liblinear's ``solve_l2r_l1l2_svc`` loop, with its state kept between calls.

    A call is a sequence of passes.  A pass permutes the active set
    ``order[:n_active]`` and walks it with ``s``; with shrinking (hinge losses only) a
    coordinate at a bound whose gradient points out of the box further than the last
    pass's extreme leaves the set (swapped with the last active one, ``s`` stays).  At
    the end of a pass, ``PG_max - PG_min <= eps`` -- which includes the pass that shrank
    every coordinate (no step: -inf - inf) -- brings every coordinate back with no
    thresholds; otherwise the pass's extremes become the thresholds.  A call stops after
    ``max(1, round(local_iters * n_active))`` steps, possibly mid-pass (then the partial
    pass's extremes are kept).  Without shrinking each pass is a fresh permutation of
    ``0..n-1``.  ``restarts`` counts the exhausted active sets seen.
    """

    def __init__(self, n, shrinking, order=None, state=None):
        self.n = n
        self.shrinking = bool(shrinking)
        self.order = list(range(n)) if order is None else [int(v) for v in order]
        count, self.pg_max_old, self.pg_min_old, eps = (n, np.inf, -np.inf, 0.1) if state is None \
            else (float(state[1]), float(state[2]), float(state[3]), float(state[4]))
        self.n_active = int(count) if 1 <= count <= n else n          # NaN / out of range: all active
        self.eps = eps if 0 <= eps < np.inf else 0.1
        self.restarts = 0

    def _end_of_pass(self, pg_max, pg_min):
        if pg_max - pg_min <= self.eps:
            if self.n_active == 0:
                self.restarts += 1
            if self.n_active == self.n and self.eps > 1e-12:
                self.eps *= 0.1
            self.n_active, self.pg_max_old, self.pg_min_old = self.n, np.inf, -np.inf
        else:
            self.pg_max_old = pg_max if pg_max > 0 else np.inf
            self.pg_min_old = pg_min if pg_min < 0 else -np.inf

    def call(self, X, y, alpha, w, c, n_task, local_iters, seed, loss, gamma=1.0):
        """One ``sdca_local`` call: returns ``(alpha, delta_b, steps)`` (alpha a new array)."""
        X = X.toarray() if hasattr(X, "toarray") else np.asarray(X, dtype=float)
        n = X.shape[0]
        alpha = np.array(alpha, dtype=float)
        if n == 0:
            return alpha, np.zeros(X.shape[1]), 0
        shrinking = self.shrinking and loss in ("hinge", "smoothed-hinge")
        rng = SplitMix64(seed)
        u = np.array(w, dtype=float)
        sq = [sequential_dot(X[j], X[j]) for j in range(n)]
        n_steps = max(1, int(local_iters * (self.n_active if shrinking else n) + 0.5))
        steps = 0
        while True:
            if shrinking:                                   # one pass over a permuted active set
                for i in range(self.n_active - 1, 0, -1):
                    j = rng.bounded(i + 1)
                    self.order[i], self.order[j] = self.order[j], self.order[i]
            else:
                self.order = rng.permutation(n)
            active = self.n_active if shrinking else n
            pg_max, pg_min, s = -np.inf, np.inf, 0
            while s < active and steps < n_steps:
                j = self.order[s]
                ux = sequential_dot(X[j], u)
                if shrinking:
                    b = y[j] * alpha[j]
                    G = y[j] * ux - 1.0 + (gamma * b if loss == "smoothed-hinge" else 0.0)
                    if (b <= 0 and G > self.pg_max_old) or (b >= 1 and G < self.pg_min_old):
                        active -= 1
                        self.order[s], self.order[active] = self.order[active], self.order[s]
                        continue
                    PG = min(G, 0.0) if b <= 0 else (max(G, 0.0) if b >= 1 else G)
                    pg_max, pg_min = max(pg_max, PG), min(pg_min, PG)
                s += 1
                steps += 1
                delta = coordinate_step_exact(loss, y[j], alpha[j], ux, c * sq[j] * (1.0 / n_task), gamma)
                if delta != 0.0:
                    alpha[j] += delta
                    u += (c * delta * (1.0 / n_task)) * X[j]
            if shrinking:
                self.n_active = active
                if s >= active:
                    self._end_of_pass(pg_max, pg_min)
                elif pg_max >= pg_min:
                    self.pg_max_old = pg_max if pg_max > 0 else np.inf
                    self.pg_min_old = pg_min if pg_min < 0 else -np.inf
            if steps >= n_steps:
                return alpha, (u - w) / c, steps

    def state(self):
        """``shrink_state[1:]`` as the kernel keeps it."""
        return [self.n_active, self.pg_max_old, self.pg_min_old, self.eps]


def local_dual_objective(loss, X, y, alpha0, alpha, w, c, n_task, gamma=1.0):
    """The local subproblem of a call (paper 001, Eq. 4) at alpha, up to a constant:
    ``sum_j -l*(-alpha_j) - w . (X^T (alpha - alpha0)) - (c n_task / 2) ||X^T (alpha - alpha0) / n_task||^2``.
    Each coordinate step maximizes it along one coordinate, so a call never lowers it."""
    X = X.toarray() if hasattr(X, "toarray") else np.asarray(X, dtype=float)
    db = X.T @ (alpha - alpha0) / n_task
    return float(-conjugate_reference(loss, alpha, y, gamma).sum() - n_task * (w @ db) - 0.5 * c * n_task * (db @ db))


def ssdca_epoch_reference(X, y, alpha, task_of_row, n_of_task, WT, BT, Sigma, lam, n_steps, seed, loss, gamma=1.0):
    """Single-machine SDCA with exact W: a fresh permutation of all rows per pass; returns new arrays."""
    X = X.toarray() if hasattr(X, "toarray") else np.asarray(X, dtype=float)
    alpha, WT, BT = np.array(alpha, float), np.array(WT, float), np.array(BT, float)
    n = X.shape[0]
    rng = SplitMix64(seed)
    perm, steps = [], 0
    while steps < n_steps and n:
        if not perm:
            perm = rng.permutation(n)
        j = perm.pop(0)
        steps += 1
        i = task_of_row[j]
        q = Sigma[i, i] * sequential_dot(X[j], X[j]) / (lam * n_of_task[i])
        delta = coordinate_step_exact(loss, y[j], alpha[j], sequential_dot(X[j], WT[i]), q, gamma)
        alpha[j] += delta
        BT[i] += delta * X[j] / n_of_task[i]
        WT += np.outer(Sigma[i], delta * X[j] / n_of_task[i]) / lam
    return alpha, WT, BT, steps


def implicit_rmax_kkt_violation(tau, loss, sq, C, r):
    """How far tau is from optimal for max sum 2 tau_j l_j - tau_j^2 s_j over 0 <= tau_j <= C,
    sum tau_j <= r C (Lemma 8 on the r-max dual ball): 0 at the optimum, relative to the loss scale.

    With v_j = l_j - tau_j s_j, optimality means one theta >= 0 (0 unless the sum is tight)
    with theta >= v_j where tau_j = 0, theta <= v_j where tau_j = C and theta = v_j where
    tau_j is free.  Zero instances (s_j = 0) and ties need no special case: no division.
    """
    tau, loss, sq = (np.asarray(a, float) for a in (tau, loss, sq))
    scale = max(loss.max(initial=0.0), (sq * C).max(initial=0.0), 1e-300)
    infeasible = max(0.0, -tau.min(initial=0.0), tau.max(initial=0.0) - C, tau.sum() - r * C) / C
    at0, atC = tau <= C * 1e-12, tau >= C * (1 - 1e-12)
    free = ~at0 & ~atC
    v = loss - tau * sq
    lower = max(0.0, v[at0].max(initial=0.0), v[free].max(initial=0.0))
    upper = min(v[atC].min(initial=np.inf), v[free].min(initial=np.inf))
    # tau_j = (l_j - theta) / s_j with theta close to l_j: eps l_j / s_j of tau_j is rounding, so the
    # sum tells a slack budget from a tight one only to eps max(l / s) / C relative
    cond = np.max(loss / np.where(sq > 0, sq, np.inf), initial=0.0) / C
    if tau.sum() < r * C * (1 - 1e-9 - 1e-14 * cond):      # the budget is slack: theta = 0
        upper = min(upper, 0.0)
    return max(infeasible, max(0.0, lower - upper) / scale)


def box_qp_reference(A, g, upper, start=None, max_iter=60, rtol=1e-12):
    """``hpcmtl.dmtrl.box_qp`` in NumPy (the active-set Newton method before it moved to ``_box_qp.box_qp``)."""
    from scipy.linalg import LinAlgError, cho_factor, cho_solve
    m = g.size
    if m == 0:
        return np.zeros(0)
    upper = np.broadcast_to(np.asarray(upper, dtype=np.float64), (m,)).copy()
    top = float(np.max(upper))
    diag = np.diag(A).copy()
    scale = max(float(np.max(np.abs(diag))), float(np.max(np.abs(g))) / max(top, 1e-300), 1e-300)
    dscale = np.where(diag > 1e-12 * scale, diag, 1e-12 * scale)
    snap = 1e-12 * upper

    def snapped(v):          # a coordinate a rounding error away from a bound is at the bound
        return np.where(v <= snap, 0.0, np.where(v >= upper - snap, upper, v))

    def gain(v):
        return float(g @ v - 0.5 * v @ (A @ v))

    x, best = np.zeros(m), 0.0
    alone = np.clip(g / dscale, 0.0, upper)
    slope, curv = float(g @ alone), float(alone @ (A @ alone))
    candidates = [alone * (slope / curv) if curv > slope > 0 else alone]
    if start is not None and np.shape(start) == (m,) and np.all(np.isfinite(start)):
        candidates.append(np.clip(np.asarray(start, dtype=np.float64), 0.0, upper))
    for c in candidates:
        c = snapped(c)
        value = gain(c)
        if value > best:
            x, best = c, value
    for _ in range(max_iter):
        grad = g - A @ x
        free = ~(((x <= 0.0) & (grad <= 0.0)) | ((x >= upper) & (grad >= 0.0)))
        if not free.any() or float(np.max(np.abs(grad[free]))) <= rtol * scale * max(top, 1.0):
            break
        step = np.zeros(m)
        ray = False
        while free.any():
            F = np.flatnonzero(free)
            AF = A[np.ix_(F, F)]
            step[:] = 0.0
            try:
                factor = cho_factor(AF, check_finite=False)
                if float(np.min(np.abs(np.diag(factor[0])))) ** 2 < 1e-12 * float(np.max(np.diag(AF))):
                    raise LinAlgError("nearly singular")
                step[F] = cho_solve(factor, grad[F], check_finite=False)
                ray = False
            except LinAlgError:
                w, V = np.linalg.eigh(AF)
                keep = w > 1e-9 * max(float(w[-1]), 1e-300)
                coef = V.T @ grad[F]
                null = V[:, ~keep] @ coef[~keep]      # where the objective is linear: climb to a bound
                ray = float(np.max(np.abs(null), initial=0.0)) > 1e-9 * float(np.max(np.abs(grad[F])))
                step[F] = null if ray else V[:, keep] @ (coef[keep] / w[keep])
            blocked = free & (((x <= 0.0) & (step < 0.0)) | ((x >= upper) & (step > 0.0)))
            if not blocked.any():
                break
            free &= ~blocked
        if not free.any():
            break
        if not ray:
            trial = snapped(np.clip(x + step, 0.0, upper))      # many bounds at once
            value = gain(trial)
            if value > best:
                x, best = trial, value
                continue
        with np.errstate(divide="ignore", invalid="ignore"):
            room = np.where(step > 0, (upper - x) / step, np.where(step < 0, -x / step, np.inf))
        t = float(np.min(room)) if ray else min(1.0, float(np.min(room)))
        if not np.isfinite(t):
            break
        trial = snapped(np.clip(x + t * step, 0.0, upper))      # up to the first bound: gains for t > 0
        value = gain(trial)
        if not value > best:
            break
        x, best = trial, value
    return x


def trace_norm_squared_prox(Z, t):
    """``argmin_W ||W - Z||^2 / 2 + (t/2) ||W||_*^2`` by bisection on S = ||W||_* (the shrunk singular values
    ``max(z - t S, 0)`` must sum to S): independent of the closed form in hpcmtl.dmtrl.joint."""
    U, z, Vt = np.linalg.svd(Z, full_matrices=False)
    lo, hi = 0.0, float(z.sum())
    for _ in range(200):
        S = 0.5 * (lo + hi)
        if np.maximum(z - t * S, 0.0).sum() > S:
            lo = S
        else:
            hi = S
    return (U * np.maximum(z - t * 0.5 * (lo + hi), 0.0)) @ Vt


def mtrl_squared_objective(W, Xs, ys, lam):
    """MTRL's objective minimized over Sigma: ``sum_i ||X_i w_i - y_i||^2 / (2 n_i) + (lam/2) ||W||_*^2``."""
    loss = sum(0.5 * np.sum((X @ W[:, i] - y) ** 2) / len(y) for i, (X, y) in enumerate(zip(Xs, ys)))
    return loss + 0.5 * lam * np.linalg.svd(W, compute_uv=False).sum() ** 2


def mtrl_squared_optimum(Xs, ys, lam, iters=20000, tol=1e-13):
    """The global MTRL optimum (squared loss, no intercept) by accelerated proximal gradient (FISTA) on
    :func:`mtrl_squared_objective`; slow and plain."""
    d, m = Xs[0].shape[1], len(Xs)
    step = 1.0 / max(np.linalg.norm(X, 2) ** 2 / len(X) for X in Xs)
    W = np.zeros((d, m))
    Y, t, last = W.copy(), 1.0, np.inf
    for k in range(iters):
        G = np.column_stack([X.T @ (X @ Y[:, i] - y) / len(y) for i, (X, y) in enumerate(zip(Xs, ys))])
        W_next = trace_norm_squared_prox(Y - step * G, step * lam)
        t_next = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
        Y = W_next + (t - 1.0) / t_next * (W_next - W)
        W, t = W_next, t_next
        if k % 200 == 199:
            value = mtrl_squared_objective(W, Xs, ys, lam)
            if last - value <= tol * abs(value):
                break
            last = value
    return W


def _loss_slope(loss, z, y, gamma):
    """dl/dz of the smooth losses, written out here (not hpcmtl.losses')."""
    if loss == "squared":
        return z - y
    if loss == "logistic":
        return -y / (1.0 + np.exp(y * z))
    if loss == "smoothed-hinge":
        return -y * np.clip((1.0 - y * z) / gamma, 0.0, 1.0)
    raise KeyError(loss)


def mtrl_objective(W, Xs, ys, lam, loss, gamma=1.0):
    """MTRL's objective minimized over Sigma for any loss: ``sum_i mean_j l(x_ij . w_i, y_ij) + (lam/2) ||W||_*^2``."""
    from hpcmtl.losses import primal_reference
    value = sum(np.mean(primal_reference(loss, X @ W[:, i], y, gamma)) for i, (X, y) in enumerate(zip(Xs, ys)))
    return value + 0.5 * lam * np.linalg.svd(W, compute_uv=False).sum() ** 2


def mtrl_optimum(Xs, ys, lam, loss, gamma=1.0, iters=40000, tol=1e-14):
    """The global MTRL optimum of a smooth loss (no intercept) by plain FISTA with the loss's global Lipschitz
    step (1 / (curvature max_i ||X_i||_2^2 / n_i)) and the bisection prox; slow and plain."""
    d, m = Xs[0].shape[1], len(Xs)
    curvature = {"squared": 1.0, "logistic": 0.25, "smoothed-hinge": 1.0 / gamma}[loss]
    step = 1.0 / (curvature * max(np.linalg.norm(X, 2) ** 2 / len(X) for X in Xs))
    W = np.zeros((d, m))
    Y, t, last = W.copy(), 1.0, np.inf
    for k in range(iters):
        G = np.column_stack([X.T @ _loss_slope(loss, X @ Y[:, i], y, gamma) / len(y)
                             for i, (X, y) in enumerate(zip(Xs, ys))])
        W_next = trace_norm_squared_prox(Y - step * G, step * lam)
        t_next = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
        Y = W_next + (t - 1.0) / t_next * (W_next - W)
        W, t = W_next, t_next
        if k % 500 == 499:
            value = mtrl_objective(W, Xs, ys, lam, loss, gamma)
            if last - value <= tol * abs(value):
                break
            last = value
    return W
