"""Updates: bootstrap, and the fleet's two-phase commit of a generation (prepare every
serving member in parallel, then publish on a quorum of validated members, or abort)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.fleet.base import FleetBase, FleetCycleReport, FleetError, PendingDecision
from rolloutcore.postconditions import Outcome
from rolloutcore.runner import CycleReport
from rolloutcore.spec.fleet import FleetPhase, held_back, validated
from rolloutcore.spec.lifecycle import Phase
from rolloutcore.spec.triggers import Trigger


class Updates(FleetBase):
    """Bootstrap and fleet updates."""

    def bootstrap(self, initial: WeightTarget | Mapping[str, WeightTarget]) -> dict[
            str, Outcome]:
        """Adopt every member's fresh engine as generation 1; the fleet opens once at
        least ``min_serving`` members are verified."""
        with self._update_lock:
            targets = self._targets_for(initial, self.members.values())
            out = self._parallel(lambda m: m.runner.bootstrap(targets[m.name]),
                                 list(self.members.values()))
            with self._lock:
                ok = [n for n, o in out.items() if o.trigger == Trigger.BOOTSTRAP_OK]
                if len(ok) >= self.min_serving:
                    self.phase, self.committed = FleetPhase.READY, 1
                    self._step("fleet_open", members=sorted(ok), min_serving=self.min_serving)
            return out

    @staticmethod
    def _targets_for(target: WeightTarget | Mapping[str, WeightTarget],
                     members: Any) -> dict[str, WeightTarget]:
        if isinstance(target, WeightTarget):
            return {m.name: target for m in members}
        missing = [m.name for m in members if m.name not in target]
        if missing:
            raise FleetError(f"no target for member(s) {missing}")
        return {m.name: target[m.name] for m in members}

    def update(self, target: WeightTarget | Mapping[str, WeightTarget], *,
               min_serving: int | None = None) -> FleetCycleReport:
        """One fleet cycle: close admissions, prepare every serving member in parallel,
        then publish on the validated members at once if they are a quorum, else abort
        (validated members withdraw and are re-admitted onto the committed generation).
        A mapping gives each member its own target (its own checkpoint path).
        ``min_serving``: this update's quorum (default the fleet's), journalled with its
        request and its decision."""
        if min_serving is not None and not 1 <= min_serving <= len(self.members):
            raise FleetError(f"min_serving must be in 1..{len(self.members)}")
        with self._update_lock:
            self._quorum = min_serving
            try:
                return self._update(target)
            finally:
                self._quorum = None

    def _update(self, target: WeightTarget | Mapping[str, WeightTarget]) -> FleetCycleReport:
        t0 = time.perf_counter()
        with self._lock:
            if self.phase != FleetPhase.READY:
                raise FleetError(f"the fleet is {self.phase}: an update needs READY")
            quorum = self._bounds().min_serving
            if not self._enabled("fleet_request_update"):
                raise FleetError(f"fewer than {quorum} members serve: an update "
                                 "needs a quorum (nothing was changed)")
            participants = self._serving()
            targets = self._targets_for(target, participants)
            gens = {t.generation for t in targets.values()}
            if gens != {self.committed + 1}:
                raise FleetError(f"target generation(s) {sorted(gens)} are not the next "
                                 f"one after {self.committed}")
            first = next(iter(targets.values()))
            self._take("fleet_request_update", target=first.label,
                       identity=first.identity, members=[m.name for m in participants],
                       min_serving=quorum)
        report = FleetCycleReport(first, published=False, aborted=False)
        report.members = {m.name: CycleReport(targets[m.name], published=False,
                                              final_phase=m.controller.phase)
                          for m in participants}
        self._deciding = deciding = PendingDecision({m.name for m in participants})
        try:
            for m in participants:
                m.work = self._pool.submit(m.runner.prepare, targets[m.name],
                                           report.members[m.name])
                m.work.add_done_callback(deciding.settler(m.name))
            deciding.wait()
        finally:
            self._deciding = None
        for m in participants:
            if m.work is not None and m.work.done():
                m.work.result()  # a runner bug surfaces here
                m.work = None
        with self._lock:
            f = self._fleet()
            views = {m.name: m.view() for m in self.members.values()}
            ok = [n for n, v in views.items() if validated(f, v)]
            report.quarantined = [n for n, v in views.items()
                                  if v.phase is Phase.TAINTED]
            if self._enabled("fleet_publish"):
                self._publish(report, ok, quorum)
            elif self._enabled("fleet_abort"):
                held = [n for n, v in views.items() if held_back(f, v)]
                self._take("fleet_abort", validated=ok, needed=quorum,
                           **({"held_back": held} if held else {}))
                report.aborted = True
            else:  # every member's cycle ends settled or held back: a runner bug
                raise AssertionError(f"no fleet decision the spec allows: {views}")
            self._quorum = None  # decided: the fleet's own quorum again
        if report.aborted:
            for name in ok:  # the engine holds the target: withdraw it, then roll back
                m = self.members[name]
                m.runner.withdraw(report.members[name], "the fleet aborted the update")
                out = m.runner.readmit(m.runner.targets[self.committed],
                                       who="fleet abort: roll back to the committed "
                                           "generation")
                report.rolled_back[name] = out.trigger
            with self._lock:
                self._reopen_if_quorum()
        for m in participants:  # admissions are open: the report waits for late fences
            m.settle_work(self.policy.fence_timeout_s + 5.0)
        report.phase = self.phase
        report.total_s = time.perf_counter() - t0
        self.last_report = report
        return report

    def _publish(self, report: FleetCycleReport, names: list[str], quorum: int) -> None:
        """One group in the journal: the fleet's record, then each member's publish."""
        self._take("fleet_publish", members=names, label=report.target.label,
                   identity=report.target.identity, min_serving=quorum)
        for name in names:
            self.members[name].runner.commit(report.members[name])
        report.published = True
        report.committed_on = names
        self._changed.notify_all()
