"""The engine's fencing token: the code that performs an effect refuses one from a deposed
controller (issue: controller failover; spec: :mod:`rolloutcore.spec.failover`).

A controller wins leadership with an epoch strictly greater than every epoch before it.
Each engine process keeps the highest epoch it has accepted (its *fence*); a fenced effect
(a weight load, a weight transfer, a fence) carrying an epoch below it is refused with
nothing changed, and an accepted one raises the fence to its epoch. The rule itself is the
spec's :func:`~rolloutcore.spec.failover.accepts`; this module only keeps the state, one
gate per process (every vLLM worker has its own; collective RPCs reach them all alike).

An effect without an epoch counts as epoch 0: accepted only by an engine that no
controller with an epoch has fenced yet (a fleet without a store keeps working, and once
a leader fenced the engine nothing unfenced gets through).

The check and the effect are one critical section (:meth:`EpochGate.hold`): a fence that
arrives while a load runs waits for it, and a load never starts after a newer fence.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rolloutcore.errors import Deposed
from rolloutcore.spec.failover import accepts

#: The key a controller adds to a weight-transfer update (popped before vLLM parses it).
EPOCH_KEY = "rc_epoch"


class FencedOut(Deposed, RuntimeError):
    """A fenced effect refused: its epoch is below the engine's fence."""


def pop_epoch(update_info: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """``update_info`` without the controller's epoch, and the epoch (None: none sent)."""
    rest = dict(update_info)
    epoch = rest.pop(EPOCH_KEY, None)
    return rest, None if epoch is None else int(epoch)


class EpochGate:
    def __init__(self) -> None:
        self._seen = 0
        self._lock = threading.RLock()

    @property
    def seen(self) -> int:
        return self._seen

    @contextmanager
    def hold(self, epoch: int | None, timeout: float = -1) -> Iterator[bool]:
        """Yield whether an effect of ``epoch`` may happen; run the effect inside the
        block. Accepted: the fence rises to ``epoch`` (even if the effect then fails: the
        controller that sent it has shown it is alive at that epoch). ``timeout``: how
        long to wait for an effect in progress (TimeoutError past it; -1: forever)."""
        e = 0 if epoch is None else int(epoch)
        if not self._lock.acquire(timeout=timeout):
            raise TimeoutError("an effect in progress holds the engine's fence")
        try:
            ok = accepts(e, self._seen)
            if ok:
                self._seen = e
            yield ok
        finally:
            self._lock.release()

    def fence(self, epoch: int, timeout: float = -1) -> tuple[bool, int]:
        """Raise the fence to ``epoch``: (accepted, the fence after)."""
        with self.hold(epoch, timeout) as ok:
            return ok, self._seen

    @contextmanager
    def enter(self, epoch: int | None) -> Iterator[None]:
        """Run the block as a fenced effect of ``epoch``, or raise :class:`FencedOut`
        before it starts (for code that reports failures by raising: a transfer)."""
        with self.hold(epoch) as ok:
            if not ok:
                raise FencedOut(self.refusal(epoch))
            yield

    def refusal(self, epoch: int | None) -> str:
        return (f"fenced: epoch {0 if epoch is None else epoch} is below this engine's "
                f"fence {self._seen} (a newer controller leads)")


#: This process's gate.
GATE = EpochGate()

__all__ = ["EPOCH_KEY", "GATE", "EpochGate", "FencedOut", "pop_epoch"]
