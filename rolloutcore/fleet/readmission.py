"""Re-admission: a quarantined or lagging member brought back to serve the fleet's
generation, verified (an audit first for a READY member, then catch-up updates)."""

from __future__ import annotations

from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.engine.postconditions import Outcome
from rolloutcore.fleet.audits import Audits
from rolloutcore.fleet.base import FleetError, failures_of
from rolloutcore.spec.lifecycle import Phase, verified
from rolloutcore.spec.triggers import Trigger


class Readmission(Audits):
    """Verified re-admission and catch-up (a READY member is audited first)."""

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
