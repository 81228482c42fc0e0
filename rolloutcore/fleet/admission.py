"""Admission: rollouts bound to the fleet's committed generation on serving members only
(the fleet spec's admit guard), least outstanding first."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from rolloutcore.controller import AdmissionCancelled, AdmissionTimeout, Binding, IllegalTransition
from rolloutcore.fleet.base import FleetBase, Lease, Member
from rolloutcore.spec.fleet import FleetPhase, quorum, serving
from rolloutcore.spec.lifecycle import Phase


class Admission(FleetBase):
    """Admits and releases rollouts."""

    def admit(self, rollout_id: str, *, wait: float = 0.0, min_generation: int = 0,
              cancel: threading.Event | None = None, detail: Mapping[str, Any] | None = None,
              exclude: Sequence[str] = ()) -> Lease:
        """Bind a rollout to the committed generation on the serving member with the
        fewest outstanding rollouts. While admissions are closed (an update), or the
        committed generation is below ``min_generation`` (a staleness bound, checked
        against the committed generation itself), wait up to ``wait`` seconds, woken by
        the step that opens them; ``cancel`` ends the wait. ``exclude``: members not to
        bind it to (they failed this request already)."""
        deadline = time.monotonic() + wait
        refused = set(exclude)  # and members that refused it (suspected meanwhile)
        with self._changed:
            while True:
                candidates = [m for m in self._admissible() if m.name not in refused]
                if candidates and self.committed >= min_generation:
                    m = min(candidates, key=lambda x: (x.outstanding, x.name))
                    try:
                        b = m.controller.admit(rollout_id, detail)
                    except IllegalTransition:
                        if rollout_id in m.controller.bindings:
                            raise
                        refused.add(m.name)
                        continue
                    break
                if cancel is not None and cancel.is_set():
                    raise AdmissionCancelled("admit", Phase.READY, f"admission of "
                                             f"{rollout_id!r} cancelled while waiting")
                left = deadline - time.monotonic()
                if left <= 0:
                    why = (f"committed generation {self.committed} is below {min_generation}"
                           if candidates else f"the fleet is {self.phase}" if self.phase !=
                           FleetPhase.READY else "fewer than min_serving members serve")
                    raise AdmissionTimeout("admit", Phase.READY, why)
                self._changed.wait(left if cancel is None else min(left, 0.05))
            m.outstanding += 1
            label = m.runner.targets[b.generation].label if b.generation in m.runner.targets \
                else str(b.generation)
            return Lease(rollout_id, m.name, m.url, b.generation, b.identity, label, b.seq)

    def _admissible(self) -> list[Member]:
        """Serving members, if the fleet admits (READY, a quorum serving: the spec's
        admit guard)."""
        if self.phase != FleetPhase.READY:
            return []
        f = self._fleet_state()
        serving_now = [m for m, v in zip(self.members.values(), f.eng, strict=True)
                       if serving(f, v)]
        return serving_now if quorum(f, self._bounds()) else []

    def release(self, lease: Lease, detail: Mapping[str, Any] | None = None) -> Binding:
        """Release a lease; IllegalTransition (the count untouched) if the member refuses
        it (released already, or bound by a controller that has since restarted)."""
        m = self.members[lease.engine]
        binding = m.controller.release(lease.rollout_id, detail)
        with self._lock:
            m.outstanding -= 1
            self._changed.notify_all()
        return binding

    @contextmanager
    def rollout(self, rollout_id: str, *, wait: float = 0.0,
                min_generation: int = 0) -> Iterator[Lease]:
        lease = self.admit(rollout_id, wait=wait, min_generation=min_generation)
        try:
            yield lease
        finally:
            self.release(lease)
