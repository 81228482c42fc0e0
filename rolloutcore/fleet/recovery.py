"""Recovery: a fleet restarted on its journal replays it, restarts every member as the
single-engine spec allows, and fences the members it restarts TAINTED."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rolloutcore.engine.controller import IllegalTransition
from rolloutcore.fleet.base import (
    AUDIT_OUTCOMES,
    FLEET_STEP,
    UNINITIALIZED,
    FleetBase,
    FleetDeposed,
    FleetError,
    Member,
    TargetFactory,
    fence_one,
    log,
)
from rolloutcore.journal import HEADER, SCHEMA, JournalReader, apply_record, restart_step
from rolloutcore.spec.fleet import CRASH, FLEET, FleetState, fleet_half, serving
from rolloutcore.spec.lifecycle import FENCED, Phase
from rolloutcore.spec.triggers import Trigger


class Recovery(FleetBase):
    """Replays the fleet journal and restarts the members it names."""

    def _replay(self, path: Path, target_of: TargetFactory | None) -> None:
        """Replay the fleet journal: each member's records through its own generated
        controller (every record must be a step the spec allows), the fleet's steps into
        the fleet's state, and the targets the journal names back into the runners."""
        reader = JournalReader(path)
        for line, rec in reader:
            if rec.get("type") == HEADER:
                if rec.get("spec") != FLEET.name or rec.get("schema") != SCHEMA:
                    raise FleetError(f"{path}:{line}: not a fleet journal of schema {SCHEMA}")
                continue
            engine = rec.get("engine")
            if engine is None:
                self._replay_fleet_step(rec)
                continue
            m = self.members.get(str(engine))
            if m is None:
                raise FleetError(f"{path}:{line}: member {engine!r} is not in the fleet file")
            try:
                apply_record(m.controller, rec)
            except IllegalTransition as e:
                raise FleetError(f"{path}:{line}: {engine}: the journal does not replay "
                                 f"through the spec: {e}") from None
            self._replay_target(m, rec, target_of, f"{path}:{line}: ")
            if rec.get("step") in AUDIT_OUTCOMES:
                m.last_audit = _audit_record(rec)
        report = reader.report
        if not report.ok and not report.truncated:
            raise FleetError(f"{path}: chain broken at line {report.first_bad_line} "
                             f"({report.reason}); move it aside and bootstrap a new fleet")

    def _replay_fleet_step(self, rec: Mapping[str, Any]) -> None:
        step = rec.get("step")
        fa = FLEET_STEP.get(str(step))
        if fa is not None:  # the floor is the spec's effect (records state it for readers)
            before = FleetState(self.phase, self.committed, self.target, (), 0, self.floor)
            self.floor = fleet_half(fa, before).ffloor
        self.phase = str(rec.get("phase"))
        self.committed = int(rec.get("committed") or 0)
        self.target = int(rec.get("target") or 0)
        detail = rec.get("detail") or {}
        if step == "fleet_open" and isinstance(detail, dict):
            self.min_serving = int(detail.get("min_serving", self.min_serving))
            self.max_live = int(detail.get("max_live", 1))
            self.min_admitting = int(detail.get("min_admitting", 0))

    @staticmethod
    def _replay_target(m: Member, rec: Mapping[str, Any], target_of: TargetFactory | None,
                       where: str = "") -> None:
        """The target a record names, rebuilt from its checkpoint path. The path is only
        where the bytes came from: recovery believes it only once the bytes there have
        the identity the journal verified for that generation (a forged or moved path:
        FleetError, nothing bound)."""
        detail = rec.get("detail")
        step = rec.get("step")
        if step == Trigger.REQUEST_UPDATE and isinstance(detail, dict):
            m.requested = detail.get("target")
        if not isinstance(detail, dict) or target_of is None:
            return
        gen = int(rec.get("committed") or 0)
        if step == Trigger.REQUEST_UPDATE:  # the target, known before it is published
            source, label, gen = (detail.get("checkpoint"), detail.get("target"),
                                  int(rec.get("target") or 0))
            if not (isinstance(source, str) and isinstance(label, str) and gen > 0):
                return
        elif step == Trigger.PUBLISH or (step == Trigger.BOOTSTRAP_OK and gen == 1):
            source, label = detail.get("checkpoint"), detail.get("label")
            if not (isinstance(source, str) and isinstance(label, str)):
                return
        else:
            return
        target = target_of(source, gen, label)
        journalled = _journalled_identity(rec)
        if journalled is not None and target.identity != journalled:
            raise FleetError(f"{where}{m.name}: generation {gen}'s checkpoint {source} holds "
                             f"identity {str(target.identity)[:16]}, the journal verified "
                             f"{journalled[:16]}: refusing to recover on it (nothing bound)")
        m.runner.targets[gen] = target
        if step != Trigger.REQUEST_UPDATE:
            m.controller.identity = target.identity

    def _restart(self) -> None:
        """After a replay: the previous controller crashed (the spec's ``fleet_crash``),
        so every member takes the restart the single-engine spec allows (a member left in
        doubt restarts TAINTED: quarantined until re-admitted); then the fleet takes the
        spec's recovery step: it reopens only with a quorum serving, else it stays closed."""
        opened = self.phase != UNINITIALIZED
        if opened:
            g = CRASH.apply(FleetState(self.phase, self.committed, self.target, (), 0,
                                       self.floor))
            self.phase, self.down = g.fphase, frozenset(self.members)
        for m in self.members.values():
            trigger = restart_step(m.controller)
            m.controller.restart(trigger, {"reason": "the fleet controller restarted"})
            self.down -= {m.name}
            self.recovered[m.name] = trigger
        if not opened:
            return
        serving_now = sum(serving(self._fleet(), m.view()) for m in self.members.values())
        self._take("fleet_recover" if self._enabled("fleet_recover") else
                   "fleet_recover_closed", serving=serving_now, min_serving=self.min_serving)

    def _take_over(self) -> None:
        """A leader with a new epoch (it won the store's leadership) fences every member
        with it before anything else (the failover spec's ``fence``): from then on each
        engine refuses the weight loads and transfers of every older epoch, so nothing a
        deposed controller sent can land. A member whose engine shows a newer epoch means
        this controller is already deposed: FleetError, nothing done. A member that could
        not be fenced (unreachable) stays out of service (suspected once restarted)
        until a later fence succeeds (:meth:`fence_unfenced`). Journalled as
        ``fleet_takeover`` (the etcd append itself is refused to a deposed leader)."""
        epoch = self.epoch
        assert epoch is not None
        for m in self.members.values():  # no effect once this controller stops leading
            if hasattr(m.adapter, "lease_check"):
                m.adapter.lease_check = self.store.holds
        results = self._parallel(
            lambda m: fence_one(m, epoch, self.policy.fence_timeout_s),
            list(self.members.values()))
        newer = {n: ev.seen for n, ev in results.items() if ev.error is None and not ev.accepted}
        if newer:
            raise FleetDeposed(f"deposed: epoch {epoch} is below the fence of {newer} (a newer "
                             "controller leads; nothing was changed)")
        self.unfenced = {n for n, ev in results.items() if not ev.accepted}
        for n in sorted(self.unfenced):
            log.warning("takeover: %s not fenced with epoch %d: %s", n, epoch,
                        results[n].error)
        with self._lock:
            self._step("fleet_takeover", epoch=epoch, controller=self.store.controller,
                       fenced=sorted(set(results) - self.unfenced),
                       unfenced=sorted(self.unfenced))

    def _suspect_unfenced(self) -> None:
        """A member restarted READY that the takeover could not fence serves nothing
        until an audit (which fences it first) passes: the spec's ``suspect``."""
        for n in sorted(self.unfenced):
            c = self.members[n].controller
            if c.enabled(Trigger.SUSPECT) is None:
                c.fire(Trigger.SUSPECT, None, {"error": f"not fenced with epoch {self.epoch}"})
        self._close_if_no_quorum()

    def _fence_recovered(self) -> None:
        """Every member recovered TAINTED and not fenced before the crash is fenced now,
        before anyone can use the fleet (its engine may run an unpublished generation,
        unpaused, under its label): what TAINTED leaves behind holds after a restart too.
        Best effort and bounded, as every fence; the journal says how it went."""
        def fence(m: Member) -> bool:
            c = m.controller.control
            label = m.requested if c.target else (
                t.label if (t := m.runner.targets.get(c.committed)) else None)
            if label is None:  # a journal that never named the generation: a bare fence
                label = f"generation {c.target or c.committed}"
            return m.runner.fence(label)

        todo = [m for m in self.members.values() if m.controller.phase is Phase.TAINTED
                and FENCED not in m.controller.control.evidence]
        for name, ok in self._parallel(fence, todo).items():
            log.info("recovery: %s was TAINTED: fence %s", name,
                     "confirmed" if ok else "not confirmed")


def _journalled_identity(rec: Mapping[str, Any]) -> str | None:
    """The identity a record verified (or, for an update request, asked for): the
    detail's, else the evidence's expected identity (a bootstrap's)."""
    detail, evidence = rec.get("detail"), rec.get("evidence")
    if isinstance(detail, dict) and isinstance(detail.get("identity"), str):
        return str(detail["identity"])
    expected = evidence.get("expected") if isinstance(evidence, dict) else None
    if isinstance(expected, dict) and isinstance(expected.get("identity"), str):
        return str(expected["identity"])
    return None


def _audit_record(rec: Mapping[str, Any]) -> dict[str, Any]:
    """A member's last audit as its journal record states it."""
    detail = rec.get("detail") or {}
    return {"outcome": str(rec.get("step")), "reason": detail.get("reason"),
            "at": rec.get("t"), "why": detail.get("why")}
