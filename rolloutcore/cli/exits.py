"""The exit codes of every ``rolloutcore`` command (the one place they are stated), and
the one map from an error of :mod:`rolloutcore.errors` to the code a command exits with."""

from rolloutcore.errors import Ambiguous, BadInput, Deposed, JournalError, Refused, Unreachable

#: The checked property holds (or the command did what it was asked).
OK = 0
#: A negative verdict on valid input (rejected, broken, mismatch, stale; another
#: controller leads the fleet).
NEGATIVE = 1
#: Bad input: nothing was written or changed.
BAD_INPUT = 2
#: The command could not run for another reason (a tool missing, the control store
#: unusable, deposed in mid-command, a bug).
CANNOT_RUN = 3
INTERRUPTED = 130  # Ctrl-C
BROKEN_PIPE = 141  # the reader of standard output went away



def exit_code(err: BaseException) -> int | None:
    """The exit status a command ends with on ``err``: bad input 2; a refusal or an
    unusable journal 1 (a negative verdict); deposed, ambiguous or unreachable 3; None for
    an error outside the tree (a bug: the caller reports it as one)."""
    if isinstance(err, BadInput):
        return BAD_INPUT
    if isinstance(err, (Ambiguous, Deposed, Unreachable)):  # before JournalError: Deposed is one
        return CANNOT_RUN
    if isinstance(err, (Refused, JournalError)):
        return NEGATIVE
    return None


__all__ = ["BAD_INPUT", "BROKEN_PIPE", "CANNOT_RUN", "INTERRUPTED", "NEGATIVE", "OK",
           "exit_code"]
