"""Exceptions with a meaning for the command line and the cluster layer."""


class InputError(ValueError):
    """Bad input (file, field, option value).  The CLI prints it on one line and exits 2."""

    exit_code = 2


class ConvergenceError(RuntimeError):
    """A numerical invariant was violated (e.g. a negative duality gap beyond rounding)."""

    exit_code = 1


class Preempted(Exception):
    """A termination signal arrived; a checkpoint was written.  Exit code 75 (EX_TEMPFAIL)."""

    exit_code = 75
