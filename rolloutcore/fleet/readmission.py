"""Re-admission: a quarantined or lagging member brought back to serve the fleet's
generation, verified (an audit first for a READY member, then catch-up updates); and the
watchdog, which audits serving members and re-admits fenced quarantined ones."""

from __future__ import annotations

import threading

from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.engine.postconditions import Outcome
from rolloutcore.fleet.audits import Audits
from rolloutcore.fleet.base import FleetError, Member, failures_of, log
from rolloutcore.journal import JournalError
from rolloutcore.spec.fleet import WATCHDOG_READMITS
from rolloutcore.spec.lifecycle import Phase, verified
from rolloutcore.spec.triggers import Trigger


class Readmission(Audits):
    """Verified re-admission and catch-up (a READY member is audited first), and the
    watchdog."""

    def readmit(self, name: str, *, who: str,
                target: WeightTarget | None = None) -> Outcome:
        """Bring member ``name`` back to serve the fleet's committed generation: a
        quarantined member by verified re-admission onto its committed generation, then,
        if the fleet moved on meanwhile, catch-up updates of its own, one verified update
        per missing generation (while the fleet is READY or ABORTING: the fleet spec's
        guard). ``target`` describes the fleet's committed generation for this member
        (default: what the fleet last committed); the generations between come from the
        checkpoints the fleet knows.

        A READY member is verified first, by an audit: one that serves and passes it is
        left as it is (``audit_ok``: nothing to re-admit); one the audit finds replaced is
        quarantined, then re-admitted; one that cannot be reached stays out
        (``audit_failed``).

        Raises :class:`FleetError`, changing nothing, if the member is in the middle of
        something else (an update) or a checkpoint is missing. Returns the outcome:
        ``readmit_ok`` only if the member serves the fleet's generation, or (its catch-up
        deferred by the fleet's phase) its own verified generation; else what failed, with
        what was done before it."""
        m = self.members.get(name)
        if m is None:
            raise FleetError(f"no member named {name!r}; members: {sorted(self.members)}")
        with self._update_lock:
            if self.fence_unfenced([name]):
                raise FleetError(f"{name} could not be fenced with epoch {self.epoch}: not "
                                 "re-admitted (nothing was changed)")
            c = m.controller.control
            if c.phase not in (Phase.TAINTED, Phase.READY) or c.pending != "none":
                raise FleetError(f"{name} is {c.phase.value}: only a READY or quarantined "
                                 "member is re-admitted (nothing was changed)")
            plan = self._catch_up_plan(c.committed, target)  # FleetError before any change
            done: list[str] = []
            if c.phase is Phase.READY and (c.committed >= self.committed or not verified(c)):
                out = self._audit_members([m], f"re-admission asked by {who}")[name]
                c = m.controller.control
                if out.trigger == Trigger.AUDIT_FAILED:
                    self._settled_readmission()
                    return out
                if c.phase is Phase.READY and c.committed >= self.committed:
                    self._settled_readmission()
                    return Outcome(Trigger.AUDIT_OK, f"{name} serves generation "
                                   f"{c.committed}: its audit passed, nothing to re-admit")
                done.append(f"audited: {out.trigger}")
            if c.phase is Phase.TAINTED:
                own = m.runner.targets.get(c.committed) or self._known_target(c.committed)
                if own is None:
                    raise FleetError(f"no checkpoint known for generation {c.committed} "
                                     "(nothing was changed)")
                out = m.runner.readmit(self._retarget(own, c.committed), who=who)
                if out.trigger != Trigger.READMIT_OK:
                    return out
                done.append(f"re-admitted onto generation {c.committed}")
            for t in plan:
                if not self._member_may(Trigger.REQUEST_UPDATE, m):
                    if not done:
                        raise FleetError(f"{name} is behind the fleet (generation "
                                         f"{c.committed} of {self.committed}) and the fleet "
                                         f"is {self.phase}: no catch-up now (nothing was "
                                         "changed)")
                    self._settled_readmission()
                    return Outcome(Trigger.READMIT_OK, f"{name}: {'; '.join(done)}; behind "
                                   f"the fleet (generation {self.committed}, {self.phase}): "
                                   "its catch-up waits until the fleet allows it")
                rep = m.runner.update(t)
                if not rep.published:
                    self._settled_readmission()
                    return Outcome(Trigger.READMIT_FAILED, f"{name}: {'; '.join(done) or '-'}; "
                                   f"catch-up to generation {t.generation} ended "
                                   f"{rep.final_phase.value} ({failures_of(rep)})")
                done.append(f"caught up to generation {t.generation}")
            self._settled_readmission()
            return Outcome(Trigger.READMIT_OK, f"{name} serves generation {self.committed} "
                           f"({'; '.join(done)})")

    def _settled_readmission(self) -> None:
        with self._lock:
            self._reopen_if_quorum()
            self._changed.notify_all()

    def readmit_quarantined(self, *, why: str = "watchdog") -> dict[str, Outcome]:
        """Re-admit every member the fleet spec's watchdog re-admits now
        (:data:`~rolloutcore.spec.fleet.WATCHDOG_READMITS`: quarantined, its fence
        confirmed, re-admission allowed by the fleet's phase), one after the other, ahead
        of the trainer's next update: that class is strongly fair, and updates back to back
        must not starve it. Returns each one's outcome (a member that moved on meanwhile is
        left out)."""
        due = [m for m in self.members.values() if self._watchdog_readmits(m)]
        if not due:
            return {}
        with self._changed:
            self._readmissions_due += 1
        try:
            out: dict[str, Outcome] = {}
            for m in due:
                try:
                    out[m.name] = self.readmit(m.name, who=why)
                except FleetError as e:  # re-admitted by someone else, or an update began
                    log.info("re-admission of %s (%s) skipped: %s", m.name, why, e)
            return out
        finally:
            with self._changed:
                self._readmissions_due -= 1
                self._changed.notify_all()

    def _watchdog_readmits(self, m: Member) -> bool:
        """The spec's watchdog class counts a re-admission of ``m`` now, and its guards
        (the member's and the fleet's) allow one."""
        return (WATCHDOG_READMITS.counts(m.controller.control, Trigger.READMIT_BEGIN)
                and m.controller.enabled(Trigger.READMIT_BEGIN) is None
                and self._member_may(Trigger.READMIT_BEGIN, m))

    def start_watchdog(self, period_s: float, *, readmit: bool = True) -> None:
        """Every ``period_s`` seconds, in a background thread: audit every READY member
        (skipping the audit while an update or re-admission runs), then, with ``readmit``,
        re-admit every fenced quarantined member (:meth:`readmit_quarantined`). The period
        bounds how long an engine replaced out of band can go unnoticed, and how long a
        quarantined member waits to be brought back. Without ``readmit`` a quarantined
        member stays out until the operator re-admits it (the fleet spec's QuarantineEnds
        then rests on the operator). Outcomes are journalled and kept per member
        (:meth:`status`)."""
        if not period_s > 0:
            raise ValueError(f"watchdog period must be positive, not {period_s}")
        self.stop_watchdog()
        self._watchdog_stop = stop = threading.Event()

        def loop() -> None:
            while not stop.wait(period_s):
                try:
                    self.audit(why="watchdog", blocking=False)
                    if readmit:
                        self.readmit_quarantined()
                except JournalError as e:  # nothing more can be journalled (deposed, or
                    log.warning("watchdog stopped: %s", e)  # its store failed): stop
                    return
                except Exception:  # keep watching: the next round may succeed
                    log.exception("watchdog round failed")

        self._watchdog = threading.Thread(target=loop, name="fleet-watchdog", daemon=True)
        self._watchdog.start()

    def stop_watchdog(self) -> None:
        self._watchdog_stop.set()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=60.0)
        self._watchdog = None
