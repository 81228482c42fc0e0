"""RolloutCore's exceptions: one root, and a small tree by what the caller can do next.

::

    RolloutCoreError
     ├── BadInput       the input is wrong (a file, a URL, a target, a record); nothing
     │                  was changed: fix it and ask again                     exit 2
     ├── Refused        valid input, but the spec (or an engine, or the gateway) says no
     │                  now; nothing was changed: a negative verdict          exit 1
     │    └── GatewayRefused   the gateway's refusal, its ``code`` and ``status`` kept
     ├── Ambiguous      a step's outcome is unknown (its deadline passed, its answer was
     │                  lost): the engine is treated as TAINTED and fenced    exit 3
     ├── Deposed        a newer controller leads (its epoch fenced this one out): this
     │                  controller changes nothing more                       exit 3
     ├── Unreachable    an engine or the control store did not answer in time exit 3
     └── JournalError   the journal cannot be used as asked (broken chain, closed, a
                        record it cannot hold)                                exit 1

Every class RolloutCore raises to its callers derives from one of these (most keep a
standard base too, ``ValueError`` for bad input, so existing ``except`` clauses hold).
:func:`rolloutcore.cli.exits.exit_code` maps them to exit codes: the one place a
command decides its exit status from an error.
"""

from __future__ import annotations


class RolloutCoreError(Exception):
    """The root of every error RolloutCore raises to its callers."""


class BadInput(RolloutCoreError):
    """The input cannot be used (missing, malformed, out of range); nothing changed."""


class Refused(RolloutCoreError):
    """Valid input the spec, an engine or the gateway refuses now; nothing changed."""


class GatewayRefused(Refused):
    """The gateway refused a request: its machine-readable ``code`` (``stale``,
    ``fleet_closed``, ``busy``, ...) and HTTP ``status`` are kept for the caller."""

    def __init__(self, message: str, *, code: str | None, status: int) -> None:
        super().__init__(message)
        self.code, self.status = code, status


class Ambiguous(RolloutCoreError):
    """A step whose outcome is unknown: the spec treats the engine as TAINTED."""


class Deposed(RolloutCoreError):
    """A newer controller leads: this one's writes and engine effects are fenced out."""


class Unreachable(RolloutCoreError):
    """An engine or the control store did not answer within its deadline."""


class JournalError(RolloutCoreError):
    """The journal cannot be used as asked (broken chain, closed, bad record)."""


__all__ = ["Ambiguous", "BadInput", "Deposed", "GatewayRefused", "JournalError", "Refused",
           "RolloutCoreError", "Unreachable"]
