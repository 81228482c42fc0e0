"""Admission: rollouts bound to a serving member's generation (the fleet spec's admit
guard; the newest served first, then least outstanding), and in-flight migration of a
rollout off a member that drains onto one serving its generation."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from rolloutcore.engine.controller import (
    AdmissionCancelled,
    AdmissionTimeout,
    Binding,
    IllegalTransition,
)
from rolloutcore.fleet.base import FleetBase, FleetError, Lease, Member, MigrationLost
from rolloutcore.spec.fleet import (
    MIGRATION,
    FleetPhase,
    MemberSnapshot,
    admission_floor,
    quorum,
    serving,
)
from rolloutcore.spec.lifecycle import Phase

#: Fleet phases that admit rollouts (the spec's admit guard).
_ADMITTING = frozenset({FleetPhase.READY, FleetPhase.ROLLING})


class Admission(FleetBase):
    """Admits and releases rollouts."""

    def admit(self, rollout_id: str, *, wait: float = 0.0, min_generation: int = 0,
              max_staleness: int | None = None, cancel: threading.Event | None = None,
              detail: Mapping[str, Any] | None = None, exclude: Sequence[str] = (),
              generation: int | None = None, prefer: str | None = None) -> Lease:
        """Bind a rollout to its member's committed generation on a serving member: the
        newest generation served, then the fewest outstanding rollouts. Only members
        whose generation is at least ``min_generation`` and at most ``max_staleness``
        behind the frontier qualify. While none does (admissions closed by an update, or
        no member new enough), wait up to ``wait`` seconds, woken by the step that opens
        them; ``cancel`` ends the wait. ``exclude``: members not to bind it to (they
        failed this request already). ``generation``: only a member serving exactly that
        one (an episode's segment); ``prefer``: that member first, when it qualifies (where
        the episode's prefix is cached)."""
        deadline = time.monotonic() + wait
        refused = set(exclude)  # and members that refused it (suspected meanwhile)
        with self._changed:
            holder = next((m.name for m in self.members.values()
                           if rollout_id in m.controller.bindings), None)
            if holder is not None:  # one rollout, one member (it moves only by migrate)
                raise FleetError(f"rollout {rollout_id!r} is already bound on {holder}")
            while True:
                floor = admission_floor(self.committed, min_generation, max_staleness)
                open_now = [m for m in self._admissible() if m.name not in refused]
                candidates = [m for m in open_now
                              if m.controller.control.committed >= floor and (
                                  generation is None
                                  or m.controller.control.committed == generation)]
                if candidates:
                    m = min(candidates, key=lambda x: (x.name != prefer,
                                                       -x.controller.control.committed,
                                                       x.outstanding, x.name))
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
                    why = ((f"no member serves generation {generation}"
                            if generation is not None else
                            f"committed generation {self.committed} is below {floor}"
                            if self.committed < floor else f"no member serves generation "
                            f"{floor} or newer (frontier {self.committed})")
                           if open_now else f"the fleet is {self.phase}"
                           if self.phase not in _ADMITTING else
                           "fewer than min_serving members serve")
                    raise AdmissionTimeout("admit", Phase.READY, why)
                self._changed.wait(left if cancel is None else min(left, 0.05))
            m.outstanding += 1
            return _lease(m, rollout_id, b)

    def hold(self, member: str, rollout_id: str, detail: Mapping[str, Any]) -> Lease:
        """Bind a placeholder for another gateway's rollouts on ``member`` (a remote
        gateway's *hold*, :mod:`rolloutcore.gateway.registry`): while it is bound the member
        cannot mutate, as for any rollout, and the gateway admits to the member only while
        it holds it. Refused (FleetError, nothing bound) unless the member admits now. Not
        counted as outstanding: it carries no load of its own."""
        with self._changed:
            m = self.members.get(member)
            if m is None:
                raise FleetError(f"no member {member!r}")
            if m not in self._admissible():
                raise FleetError(f"{member} does not admit now")
            try:
                b = m.controller.admit(rollout_id, detail)
            except IllegalTransition as e:
                raise FleetError(f"{member} refused the hold: {e}") from None
            return _lease(m, rollout_id, b)

    def admitting(self) -> dict[str, int]:
        """The members that admit now, with the generation each serves."""
        with self._lock:
            return {m.name: m.controller.control.committed for m in self._admissible()}

    def unhold(self, lease: Lease, detail: Mapping[str, Any]) -> Binding:
        """Release a hold (:meth:`hold`): the member may then drain without it."""
        binding = self.members[lease.engine].controller.release(lease.rollout_id, detail)
        with self._lock:
            self._changed.notify_all()
        return binding

    def _admissible(self) -> list[Member]:
        """Serving members, if the fleet admits (READY, a quorum serving: the spec's
        admit guard)."""
        if self.phase not in _ADMITTING:
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

    def migrate(self, lease: Lease, detail: Mapping[str, Any] | None = None) -> Lease:
        """Move a rollout off a member that drains for an update onto a member serving the
        rollout's own generation (the fleet spec's ``migrate``): journalled as one move
        naming both, then released there and admitted here (the trace checker checks both
        against the move: the generation is kept). The caller continues the rollout on the
        new lease's member (resubmitting its prompt and the tokens so far, as token ids);
        the member it left no longer waits for it. FleetError, with nothing changed, if
        the spec allows no move now (no other member serves its generation: the drain
        waits for it); :class:`MigrationLost` if it left but was refused there."""
        extra = dict(detail or {})
        with self._changed:
            src = self.members[lease.engine]
            if lease.rollout_id not in src.controller.bindings:
                raise FleetError(f"rollout {lease.rollout_id!r} is not bound on {src.name}")
            f, b = self._fleet_state(), self._bounds()
            leaving = src.view()._replace(bind=(lease.generation,))
            dst = min((m for m in self.members.values() if m is not src and MIGRATION.when(
                f, leaving, 1, MemberSnapshot.with_free_slot(m.view()), 1, b)),
                      key=lambda m: (m.outstanding, m.name), default=None)
            if dst is None:
                raise FleetError(f"no move for {lease.rollout_id!r} now: {src.name} is "
                                 f"{leaving.phase.value}, and no other member serves "
                                 f"generation {lease.generation} (nothing was changed)")
            # Announced first: the member it leaves moves on as soon as it is released.
            self._step("migrate", rollout=lease.rollout_id, members=[src.name, dst.name],
                       generation=lease.generation)
            src.controller.release(lease.rollout_id, {**extra, "migrated_to": dst.name})
            src.outstanding -= 1
            try:
                bound = dst.controller.admit(lease.rollout_id,
                                             {**extra, "migrated_from": src.name})
            except IllegalTransition as e:  # dst changed since the guard read it
                raise MigrationLost(f"rollout {lease.rollout_id!r} left {src.name} but "
                                    f"{dst.name} refused it ({e}): it ended there, "
                                    "aborted") from None
            dst.outstanding += 1
            return _lease(dst, lease.rollout_id, bound)

    @contextmanager
    def rollout(self, rollout_id: str, *, wait: float = 0.0,
                min_generation: int = 0) -> Iterator[Lease]:
        lease = self.admit(rollout_id, wait=wait, min_generation=min_generation)
        try:
            yield lease
        finally:
            self.release(lease)


def _lease(m: Member, rollout_id: str, b: Binding) -> Lease:
    """The lease of a rollout (or hold) ``b`` bound on member ``m``, with its label."""
    target = m.runner.targets.get(b.generation)
    label = target.label if target is not None else str(b.generation)
    return Lease(rollout_id, m.name, m.url, b.generation, b.identity, label, b.seq)
