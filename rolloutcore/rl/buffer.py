"""Produced-but-unconsumed rollouts between generation and the trainer, bounded.

The trainer decides what staleness is legal, never the serving layer: a group's lag is
the trainer's generation (the policy it is about to update) minus the group's behaviour
generation; past ``max_lag`` a group is dropped or handed over flagged, as the caller
chose. The bound covers everything produced and not yet acknowledged (queued or taken),
in samples and in bytes, and the groups being generated (a producer reserves
its samples before it asks for a group): generation of new groups waits at the bound, so
it is throttled to the trainer's rate (Little's law: work in flight = rate x time in the
system), and nothing is generated that could not be queued.

Metrics (prometheus-client, a registry of the buffer's own unless one is given):
``rolloutcore_rl_lag_generations`` (histogram, per group taken or dropped),
``rolloutcore_rl_queued_samples`` / ``_queued_bytes`` (gauges, unacknowledged work),
``rolloutcore_rl_stale_total{action=dropped|flagged}``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rolloutcore.rl.client import Group


class Stale(StrEnum):
    DROP = "drop"
    FLAG = "flag"


@dataclass(frozen=True)
class Taken:
    """A group handed to the trainer, with its lag when taken."""

    group: Group
    lag: int
    stale: bool  # lag > max_lag (only with Stale.FLAG: dropped ones are never handed out)


class RolloutBuffer:
    def __init__(self, *, max_lag: int, stale: Stale = Stale.DROP,
                 max_samples: int | None = None, max_bytes: int | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 0:
            raise ValueError(f"max_lag must be an integer >= 0, got {max_lag!r}")
        if max_samples is None and max_bytes is None:
            raise ValueError("a buffer needs a bound: max_samples or max_bytes")
        for name, v in (("max_samples", max_samples), ("max_bytes", max_bytes)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.max_lag, self.stale = max_lag, Stale(stale)
        self.max_samples, self.max_bytes = max_samples, max_bytes
        self._queue: collections.deque[Group] = collections.deque()
        self._samples = self._bytes = 0  # unacknowledged: queued + taken
        self._cond = threading.Condition()
        self._closed = False
        self.registry = registry or CollectorRegistry()
        self.lag = Histogram("rolloutcore_rl_lag_generations", "Trainer generation minus the "
                             "behaviour generation of each group taken or dropped",
                             buckets=(0, 1, 2, 3, 4, 8, 16), registry=self.registry)
        self.queued_samples = Gauge("rolloutcore_rl_queued_samples", "Samples produced and "
                                    "not yet acknowledged", registry=self.registry)
        self.queued_bytes = Gauge("rolloutcore_rl_queued_bytes", "Bytes of samples produced "
                                  "and not yet acknowledged", registry=self.registry)
        self.stale_total = Counter("rolloutcore_rl_stale", "Groups past max_lag",
                                   ["action"], registry=self.registry)
        self.lags: collections.Counter[int] = collections.Counter()  # for the pictures
        self.dropped = 0

    def _full(self, samples: int, nbytes: int) -> bool:
        if not self._samples:  # one group always fits, or a big one could never enter
            return False
        return ((self.max_samples is not None and self._samples + samples > self.max_samples)
                or (self.max_bytes is not None and self._bytes + nbytes > self.max_bytes))

    def _wait_for_room(self, samples: int, nbytes: int, timeout: float | None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        while not self._closed and self._full(samples, nbytes):
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._cond.wait(left)
        return not self._closed

    def reserve(self, samples: int, timeout: float | None = None) -> bool:
        """Room for a group of ``samples`` about to be generated, waiting at the bound
        (its bytes are counted when it is put). False: closed, or the bound held for the
        whole ``timeout``; True: :meth:`put` it with ``reserved=True`` or
        :meth:`cancel` the reservation."""
        with self._cond:
            if not self._wait_for_room(samples, 0, timeout):
                return False
            self._account(samples, 0)
            return True

    def cancel(self, samples: int) -> None:
        """A reserved group that will not come (its generation failed)."""
        with self._cond:
            self._account(-samples, 0)
            self._cond.notify_all()

    def put(self, group: Group, timeout: float | None = None, *,
            reserved: bool = False) -> bool:
        """Queue a group (its samples reserved already, or waiting here while the
        unacknowledged work is at its bound). False: closed, or the bound held for the
        whole ``timeout`` (a reservation is then given back)."""
        n = len(group.samples)
        with self._cond:
            if reserved:
                self._account(-n, 0)  # the reservation becomes the group itself
            if self._closed or (not reserved and not self._wait_for_room(n, group.nbytes,
                                                                         timeout)):
                self._cond.notify_all()
                return False
            self._queue.append(group)
            self._account(n, group.nbytes)
            self._cond.notify_all()
            return True

    def _account(self, samples: int, nbytes: int) -> None:
        self._samples += samples
        self._bytes += nbytes
        self.queued_samples.set(self._samples)
        self.queued_bytes.set(self._bytes)

    def take(self, k: int, trained_generation: int, timeout: float | None = None
             ) -> list[Taken]:
        """Up to ``k`` groups, oldest first, judged against ``trained_generation``; waits
        for at least one (or the timeout, or close)."""
        end = None if timeout is None else time.monotonic() + timeout
        out: list[Taken] = []
        with self._cond:
            while len(out) < k:
                if not self._queue:
                    if out or self._closed:
                        break
                    left = None if end is None else end - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._cond.wait(left)
                    continue
                g = self._queue.popleft()
                lag = trained_generation - g.generation
                if lag < 0:
                    raise ValueError(f"a group of generation {g.generation} is newer than "
                                     f"the trainer's {trained_generation}")
                self.lag.observe(lag)
                self.lags[lag] += 1
                stale = lag > self.max_lag
                if stale and self.stale is Stale.DROP:
                    self.stale_total.labels("dropped").inc()
                    self.dropped += 1
                    self._account(-len(g.samples), -g.nbytes)
                    self._cond.notify_all()
                    continue
                if stale:
                    self.stale_total.labels("flagged").inc()
                out.append(Taken(g, lag, stale))
        return out

    def ack(self, taken: Sequence[Taken]) -> None:
        """The trainer consumed these: their room is free again."""
        with self._cond:
            for t in taken:
                self._account(-len(t.group.samples), -t.group.nbytes)
            self._cond.notify_all()

    @property
    def unacknowledged(self) -> tuple[int, int]:
        with self._cond:
            return self._samples, self._bytes

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


__all__ = ["RolloutBuffer", "Stale", "Taken"]
