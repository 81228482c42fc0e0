"""Audits: members read again outside the fleet's update (on demand, when reported
unreachable, and by the watchdog); a mismatch quarantines, a failure stops serving."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.engine.controller import IllegalTransition
from rolloutcore.engine.postconditions import Outcome
from rolloutcore.fleet.base import FleetBase, FleetError, Lease, Member, log
from rolloutcore.journal import JournalError
from rolloutcore.spec.lifecycle import Phase
from rolloutcore.spec.triggers import Trigger


class Audits(FleetBase):
    """Audits and unreachable reports."""

    def audit(self, names: Sequence[str] | None = None, *, why: str = "operator",
              blocking: bool = True) -> dict[str, Outcome]:
        """Audit members (default: every READY member the fleet spec lets audit: not
        during the fleet's update), in parallel, each bounded by the policy's
        ``step_timeout_s``, journalled; a mismatch quarantines and fences the member, a
        failure stops it serving until an audit passes. The fleet closes if fewer than
        min_serving serve after it, and reopens if a closed fleet has a quorum again.
        ``blocking=False``: return ``{}`` at once if an update or re-admission runs."""
        if names is not None:
            unknown = sorted(set(names) - set(self.members))
            if unknown:
                raise FleetError(f"no member named {unknown}; members: {sorted(self.members)}")
        if not self._update_lock.acquire(blocking=blocking):
            return {}
        try:
            chosen = [self.members[n] for n in names] if names is not None else [
                m for m in self.members.values() if m.controller.phase is Phase.READY]
            # A member the takeover could not fence is fenced first; one still unfenced
            # is not read (an older controller could still change it).
            still = set(self.fence_unfenced([m.name for m in chosen]))
            if names is None:
                chosen = [m for m in chosen if m.name not in still]
            out = self._audit_members(chosen, why)
            with self._lock:
                self._reopen_if_quorum()
            return out
        finally:
            self._update_lock.release()

    def _audit_members(self, members: Sequence[Member], why: str) -> dict[str, Outcome]:
        """Audit ``members`` (update lock held) where the spec allows it now; FleetError,
        changing nothing, for one that is not READY and idle or not auditable now."""
        for m in members:
            if m.name in self.unfenced:
                raise FleetError(f"{m.name} could not be fenced with epoch {self.epoch} (an "
                                 "older controller could still change it): not audited "
                                 "(nothing was changed)")
            c = m.controller.control
            if c.phase is not Phase.READY or c.pending != "none" \
                    or not self._member_may(Trigger.AUDIT_BEGIN, m):
                raise FleetError(f"{m.name} is {c.phase.value} (fleet {self.phase}): only a "
                                 "READY member is audited, outside the fleet's update "
                                 "(nothing was changed)")
            if self._audit_target(m) is None:
                raise FleetError(f"no checkpoint known for generation {c.committed} of "
                                 f"{m.name} (nothing was changed)")

        def one(m: Member) -> Outcome:
            out = m.runner.audit(self._audit_target(m), why=why)
            m.last_audit = {"outcome": str(out.trigger), "reason": out.reason,
                            "at": self._clock(), "why": why}
            return out

        out = self._parallel(one, members)
        with self._lock:
            self._close_if_no_quorum()
            self._changed.notify_all()
        return out

    def _audit_target(self, m: Member) -> WeightTarget | None:
        g = m.controller.control.committed
        t = m.runner.targets.get(g) or self._known_target(g)
        return None if t is None else self._retarget(t, g)

    def report_unreachable(self, lease: Lease, error: str, *, audit: bool = True) -> bool:
        """The application could not reach the engine of ``lease`` (a connection error):
        the member stops serving (its evidence is dropped: the spec's ``suspect``) until an
        audit passes; with ``audit``, one is started at once in the background. Returns
        whether the member was serving until now (a later report changes nothing)."""
        return self._suspect(lease.engine, {"rollout": lease.rollout_id, "error": error[:500]},
                             "unreachable" if audit else None)

    def report_replaced(self, name: str, why: str, *, audit: bool = True) -> bool:
        """The host of member ``name``'s engine says the engine is gone or was replaced
        (a Ray actor that died or was restarted): as :meth:`report_unreachable`, the
        member stops serving until an audit passes, and one starts at once."""
        return self._suspect(name, {"error": why[:500]}, "replaced" if audit else None)

    def _suspect(self, name: str, detail: dict[str, str], audit_why: str | None) -> bool:
        m = self.members[name]
        with self._lock:  # the suspicion and the decision it may cause, in one order
            if m.controller.enabled(Trigger.SUSPECT) is not None:
                return False
            try:
                m.controller.fire(Trigger.SUSPECT, None, detail)
            except IllegalTransition:  # lost a race with another report or an audit
                return False
            self._close_if_no_quorum()
            self._changed.notify_all()
        if audit_why is not None:
            threading.Thread(target=self._audit_quietly, args=([m.name], audit_why),
                             name=f"fleet-audit-{m.name}", daemon=True).start()
        return True

    def _audit_quietly(self, names: list[str] | None, why: str) -> None:
        try:
            self.audit(names, why=why)
        except FleetError as e:  # the member moved on (an update, a re-admission)
            log.info("audit (%s) skipped: %s", why, e)
        except JournalError as e:  # deposed, or the store failed: said once, by its owner
            log.warning("audit (%s) not journalled: %s", why, e)
        except Exception:  # a background audit must not die silently
            log.exception("audit (%s) failed", why)
