# cython: language_level=3
"""The losses' arithmetic that every kernel module shares: the kernel ids, the primal value l(z), the
conjugate l*(-a) and the slope l'(z).  Everything here is ``inline`` (as in ``_rows.pxd`` and
``_random.pxd``): it compiles into each kernel module that cimports it (``_sdca``, ``_joint_terms``) with
that module's directives, so a bounds-checked build never imports an optimized one, and a loss gives the
same bits in every module.  Python sees the ids as ``hpcmtl._sdca.LossId`` (``hpcmtl.losses`` maps a
validated name to one, once).
"""
from libc.math cimport exp, log, log1p


cdef enum:
    # the loss of every kernel
    HINGE = 0
    SMOOTHED_HINGE = 1             # parameter gamma
    SQUARED = 2
    LOGISTIC = 3


cdef inline int check_loss(int loss) except -1:
    if loss < HINGE or loss > LOGISTIC:
        raise ValueError(f"unknown loss id {loss} (0 hinge, 1 smoothed hinge, 2 squared, 3 logistic)")
    return 0


cdef inline double primal_loss(int loss, double z, double y, double gamma) noexcept nogil:
    cdef double m, t
    if loss == HINGE:
        m = 1.0 - y * z
        return m if m > 0.0 else 0.0
    elif loss == SMOOTHED_HINGE:
        m = 1.0 - y * z
        if m <= 0.0:
            return 0.0
        if m >= gamma:
            return m - 0.5 * gamma
        return 0.5 * m * m / gamma
    elif loss == SQUARED:
        t = z - y
        return 0.5 * t * t
    else:  # LOGISTIC: log(1 + exp(-y z)), stable
        t = -y * z
        if t > 0.0:
            return t + log1p(exp(-t))
        return log1p(exp(t))


cdef inline double xlogx(double b) noexcept nogil:
    return b * log(b) if b > 0.0 else 0.0


cdef inline double conjugate_neg(int loss, double a, double y, double gamma) noexcept nogil:
    """l*(-a) for a dual variable a with label y (a feasible: y a in [0, 1])."""
    cdef double b
    if loss == HINGE:
        return -y * a
    elif loss == SMOOTHED_HINGE:
        return -y * a + 0.5 * gamma * a * a
    elif loss == SQUARED:
        return 0.5 * a * a - a * y
    else:  # LOGISTIC
        b = y * a
        if b < 0.0:
            b = 0.0
        elif b > 1.0:
            b = 1.0
        return xlogx(b) + xlogx(1.0 - b)


cdef inline double clip01(double b) noexcept nogil:
    if b < 0.0:
        return 0.0
    if b > 1.0:
        return 1.0
    return b


cdef inline double sigmoid(double u) noexcept nogil:
    # 1 / (1 + exp(-u)), without overflow
    cdef double e
    if u >= 0.0:
        return 1.0 / (1.0 + exp(-u))
    e = exp(u)
    return e / (1.0 + e)


cdef inline double loss_slope(int loss, double z, double y, double gamma) noexcept nogil:
    """dl/dz (smooth losses; a subgradient for the hinge)."""
    cdef double m
    if loss == HINGE:
        return -y if y * z < 1.0 else 0.0
    elif loss == SMOOTHED_HINGE:
        m = 1.0 - y * z
        return -y * clip01(m / gamma)
    elif loss == SQUARED:
        return z - y
    else:  # LOGISTIC: -y sigmoid(-y z)
        return -y * sigmoid(-y * z)
