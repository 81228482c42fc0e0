"""The exit codes of every ``rolloutcore`` command (the one place they are stated)."""

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

__all__ = ["BAD_INPUT", "BROKEN_PIPE", "CANNOT_RUN", "INTERRUPTED", "NEGATIVE", "OK"]
