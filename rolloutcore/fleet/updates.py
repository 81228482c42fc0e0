"""Updates: bootstrap; the fleet's two-phase commit of a generation (prepare every serving
member in parallel, then publish on a quorum of validated members, or abort); and the
rolling update (max_live >= 2: a wave prepares and publishes while the rest serve, then
the rest catch up, while min_admitting members serve throughout)."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any

from rolloutcore.adapters.contract import PeerSource, WeightTarget
from rolloutcore.engine.postconditions import Outcome
from rolloutcore.engine.runner import CycleReport, call_with_deadline
from rolloutcore.engine.staging import Staging
from rolloutcore.fleet.base import (
    FleetBase,
    FleetCycleReport,
    FleetError,
    Member,
    PendingDecision,
)
from rolloutcore.spec.fleet import FleetPhase, bootstrapped, held_back, validated, wave_width
from rolloutcore.spec.lifecycle import Phase


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
                if self._enabled("fleet_open"):
                    rolling = {"max_live": self.max_live, "min_admitting": self.min_admitting
                               } if self.max_live > 1 else {}
                    f = self._fleet_state()
                    self._take("fleet_open", members=sorted(
                        n for n, v in zip(self.members, f.eng, strict=True)
                        if bootstrapped(f, v)), min_serving=self.min_serving, **rolling)
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
        """The next generation, as the fleet's update policy says (the one public update
        call). A strict fleet (max_live 1): one fleet cycle: close admissions, prepare
        every serving member in parallel, then publish on the validated members at once if
        they are a quorum, else abort (validated members withdraw and are re-admitted onto
        the committed generation); ``min_serving`` is this update's quorum (default the
        fleet's), journalled with its request and its decision. A rolling fleet (max_live
        >= 2): see :meth:`_rolling_update`; it keeps its own quorum and refuses
        ``min_serving`` (FleetError, nothing changed). A mapping gives each member its own
        target (its own checkpoint path). The report says what was decided."""
        if self.rolling:
            if min_serving is not None:
                raise FleetError("min_serving: a rolling fleet (max_live >= 2) keeps its "
                                 "quorum")
            return self._rolling_update(target)
        if min_serving is not None and not 1 <= min_serving <= len(self.members):
            raise FleetError(f"min_serving must be in 1..{len(self.members)}")
        with self._trainer_turn():
            self._quorum = min_serving
            try:
                return self._update(target)
            finally:
                self._quorum = None

    def _stage_members(self, target: WeightTarget | Mapping[str, WeightTarget]
                       ) -> tuple[dict[str, CycleReport], dict[str, Staging], str | None]:
        """Prepare-then-commit across the fleet (spec/staged.py): every serving member
        whose runner stages stages the target while it serves, in parallel, before any
        member closes. A member whose staging is refused sits this update out (READY on
        its generation, nothing touched: behind the fleet once it publishes, caught up by
        its re-admission); if too few are left for the quorum, every other's staging is
        cancelled (refused too, buffers discarded) and the update is refused: nothing
        closed anywhere. Returns the members' reports, the prepared stagings, and why
        the update was refused (None: it goes on)."""
        with self._lock:
            participants = self._serving()
            targets = self._targets_for(target, participants)
            quorum = self._bounds().min_serving
        stagers = [m for m in participants if m.runner.stages]
        reports = {m.name: CycleReport(targets[m.name], published=False,
                                       final_phase=m.controller.phase) for m in participants}
        if not stagers:
            return reports, {}, None
        if self.peer_sources and len(stagers) > 1:
            staged = self._stage_from_peer(stagers, targets, reports)
        else:
            staged = self._parallel(
                lambda m: m.runner.stage(targets[m.name], reports[m.name]), stagers)
        refused = {n: reports[n].staging_refused for n, s in staged.items() if s is None}
        sessions: dict[str, Staging] = {n: s for n, s in staged.items() if s is not None}
        if len(participants) - len(refused) >= quorum:
            return reports, sessions, None
        why = "; ".join(f"{n}: {r}" for n, r in sorted(refused.items()))
        for name, session in sessions.items():
            self.members[name].runner.cancel_stage(
                reports[name], session, f"the fleet's staging was refused ({why})")
        return reports, {}, f"staging refused on {sorted(refused)}: {why}"

    def _stage_from_peer(self, stagers: list[Member], targets: Mapping[str, WeightTarget],
                         reports: Mapping[str, CycleReport]) -> dict[str, Staging | None]:
        """Inference to inference: the trainer's bytes go to one member (the first in
        name order whose staging prepares), and every other stages from it in parallel,
        verified against the same identity. A source that cannot serve, or dies while it
        streams, is a failed staging of its readers (refused, never TAINTED), as the
        trainer's would be; they do not turn to the trainer behind the report's back."""
        staged: dict[str, Staging | None] = {}
        left = sorted(stagers, key=lambda m: m.name)
        while left:
            seed = left.pop(0)
            staged[seed.name] = seed.runner.stage(targets[seed.name], reports[seed.name])
            if staged[seed.name] is not None:
                break
        if not left:
            return staged
        for m in left:
            reports[m.name].peer = seed.name
        try:
            url = self._peer_url(seed, targets[seed.name].identity)
        except FleetError as e:  # each reader's staging is refused, with the reason
            for m in left:
                m.runner.refuse_stage(reports[m.name], str(e))
                staged[m.name] = None
            return staged
        staged.update(self._parallel(
            lambda m: m.runner.stage(targets[m.name], reports[m.name], source=url), left))
        return staged

    def _peer_url(self, source: Member, identity: str) -> str:
        """Where other members stage ``identity`` from ``source`` (FleetError: it cannot
        serve them, with why)."""
        adapter = source.adapter
        assert isinstance(adapter, PeerSource)
        seconds = self.policy.step_timeout_s
        try:
            return str(call_with_deadline(
                lambda: adapter.peer_source(identity, time.monotonic() + seconds), seconds,
                "peer_source"))
        except Exception as e:
            raise FleetError(f"the peer source {source.name} cannot serve: "
                             f"{type(e).__name__}: {e}") from None

    def _update(self, target: WeightTarget | Mapping[str, WeightTarget]) -> FleetCycleReport:
        t0 = time.perf_counter()
        reports, sessions, refused = self._stage_members(target)
        if refused is not None:
            first = next(iter(reports.values())).target
            report = FleetCycleReport(first, published=False, aborted=False,
                                      members=reports, refused=refused, phase=self.phase,
                                      total_s=time.perf_counter() - t0)
            self.last_report = report
            return report
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
            changed = bool(sessions) and not set(sessions) <= {
                m.name for m in participants if m.runner.stages}
            if gens != {self.committed + 1} or changed:
                for name, session in sessions.items():
                    self.members[name].runner.cancel_stage(
                        reports[name], session, "the fleet changed while it staged")
                if changed:
                    raise FleetError("the serving members changed while the fleet staged: "
                                     "nothing was changed (the stagings were discarded)")
                raise FleetError(f"target generation(s) {sorted(gens)} are not the next "
                                 f"one after {self.committed}")
            first = next(iter(targets.values()))
            self._take("fleet_request_update", target=first.label,
                       identity=first.identity, members=[m.name for m in participants],
                       min_serving=quorum)
        report = FleetCycleReport(first, published=False, aborted=False)
        report.members = {m.name: reports.get(m.name) or CycleReport(
            targets[m.name], published=False, final_phase=m.controller.phase)
            for m in participants}
        self._deciding = deciding = PendingDecision({m.name for m in participants})
        try:
            for m in participants:
                if m.runner.stages and m.name not in sessions and reports:
                    deciding.settle(m.name)  # its staging was refused: it sits this out
                    continue
                m.work = self._pool.submit(m.runner.prepare, targets[m.name],
                                           report.members[m.name],
                                           staging=sessions.get(m.name))
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

    @property
    def rolling(self) -> bool:
        """Whether this fleet's updates roll (max_live >= 2) instead of closing every
        member at once."""
        return self.max_live > 1

    def _rolling_update(self, target: WeightTarget | Mapping[str, WeightTarget]
                        ) -> FleetCycleReport:
        """A rolling update (max_live >= 2) to the next generation; admissions never close.
        A wave of members on the frontier (as many as can leave while min_admitting others
        serve) prepares in parallel while the rest serve their generation; the wave's
        validated members publish at once (the frontier moves, the floor stays); then
        every member left behind catches up, as many at a time as min_admitting allows,
        and the floor moves up to the frontier once none serves or holds a rollout below
        it. A wave that validated nothing ends on the generations served; one that leaves
        fewer than min_serving serving aborts and rolls its members back."""
        with self._trainer_turn():
            return self._roll(target)

    def _roll(self, target: WeightTarget | Mapping[str, WeightTarget]) -> FleetCycleReport:
        t0 = time.perf_counter()
        if self.floor < self.committed:  # the last rolling update left members behind
            self._catch_up_behind({}, FleetCycleReport(target if isinstance(
                target, WeightTarget) else next(iter(target.values())), False, False))
        with self._lock:
            if self.phase != FleetPhase.READY:
                raise FleetError(f"the fleet is {self.phase}: a rolling update needs READY")
            if not self._enabled("fleet_roll"):
                raise FleetError(
                    f"no rolling update now (nothing was changed): generation "
                    f"{self.committed + 1} would be more than {self.max_live} above the "
                    f"floor {self.floor}, fewer than {self.min_serving} members serve, or "
                    f"no member on the frontier may leave while min_admitting "
                    f"{self.min_admitting} keep serving")
            serving_now = self._serving()
            frontier = [m for m in serving_now if m.view().committed == self.committed]
            width = wave_width(len(serving_now), len(frontier), self.min_admitting)
            wave = sorted(frontier, key=lambda m: (m.outstanding, m.name))[:width]
            assert wave, "fleet_roll's guard (the spec's) promises a member that may leave"
            targets = self._targets_for(target, self.members.values())
            if {t.generation for t in targets.values()} != {self.committed + 1}:
                raise FleetError(f"the target is not generation {self.committed + 1}")
            first = targets[wave[0].name]
            self._take("fleet_roll", target=first.label, identity=first.identity,
                       members=[m.name for m in wave], max_live=self.max_live,
                       min_admitting=self.min_admitting)
        report = FleetCycleReport(first, published=False, aborted=False)
        report.waves.append([m.name for m in wave])
        report.members = {m.name: CycleReport(targets[m.name], published=False,
                                              final_phase=m.controller.phase) for m in wave}
        self._deciding = deciding = PendingDecision({m.name for m in wave})
        try:
            for m in wave:
                with self._lock:  # the spec's guard, as each member leaves service
                    if not self._member_may("request_update", m):
                        deciding.settle(m.name)
                        continue
                m.work = self._pool.submit(m.runner.prepare, targets[m.name],
                                           report.members[m.name])
                m.work.add_done_callback(deciding.settler(m.name))
            deciding.wait()
        finally:
            self._deciding = None
        for m in wave:  # a wave decides once a quarantined member's fence ended (the spec's
            m.settle_work(self.policy.fence_timeout_s + 5.0)  # wave_settled); others serve
        for m in wave:
            if m.work is not None and m.work.done():
                m.work.result()
                m.work = None
        with self._lock:
            f = self._fleet()
            views = {m.name: m.view() for m in self.members.values()}
            ok = [n for n, v in views.items() if validated(f, v)]
            report.quarantined = [n for n in report.members if views[n].phase is Phase.TAINTED]
            if self._enabled("fleet_publish_wave"):
                self._take("fleet_publish_wave", members=ok, label=first.label,
                           identity=first.identity)
                for name in ok:
                    self.members[name].runner.commit(report.members[name])
                report.published, report.committed_on = True, ok
            elif self._enabled("fleet_end_wave"):
                self._take("fleet_end_wave", members=[])
            elif self._enabled("fleet_abort_wave"):
                self._take("fleet_abort_wave", validated=ok, needed=self._bounds().min_serving)
                report.aborted = True
            else:
                raise AssertionError(f"no wave decision the spec allows: {views}")
        if report.aborted:
            for name in ok:
                m = self.members[name]
                m.runner.withdraw(report.members[name], "the fleet aborted the wave")
                out = m.runner.readmit(m.runner.targets[self.committed],
                                       who="wave abort: roll back to its generation")
                report.rolled_back[name] = out.trigger
            with self._lock:
                self._reopen_if_quorum()
        if report.published:
            self._catch_up_behind(targets, report)
        for m in wave:
            m.settle_work(self.policy.fence_timeout_s + 5.0)
        report.phase = self.phase
        report.total_s = time.perf_counter() - t0
        self.last_report = report
        return report

    def _catch_up_behind(self, targets: Mapping[str, WeightTarget],
                         report: FleetCycleReport) -> None:
        """Every member serving below the frontier catches up, as many at a time as
        min_admitting allows (each its own update, published alone); then the floor
        moves up once nothing is served or bound below the frontier."""
        while True:
            with self._lock:
                serving_now = self._serving()
                behind = sorted((m for m in serving_now if m.view().committed < self.committed),
                                key=lambda m: (m.outstanding, m.name))
                batch: list[Member] = []
                for m in behind[:max(len(serving_now) - self.min_admitting, 0)]:
                    if self._member_may("request_update", m):
                        batch.append(m)
            if not batch:
                break
            report.waves.append([m.name for m in batch])
            plans = {m.name: self._catch_up_plan(m.view().committed, targets.get(m.name))
                     for m in batch}
            peer = self._catch_up_peer(report)
            if isinstance(peer, str):  # the source cannot serve: nobody stages, all wait
                for m in batch:
                    refused = CycleReport(plans[m.name][-1], published=False,
                                          final_phase=m.controller.phase)
                    m.runner.refuse_stage(refused, peer)
                    report.members[m.name] = refused
                break
            reports = self._parallel(functools.partial(
                _updates, plans=plans, frontier=self.committed,
                source=None if peer is None else peer[1]), batch)
            for name, reps in reports.items():
                report.members[name] = reps[-1]
                if peer is not None and reps[-1].target.generation == self.committed:
                    reps[-1].peer = peer[0]
                if reps[-1].published:
                    report.committed_on.append(name)
                elif reps[-1].final_phase is Phase.TAINTED:
                    report.quarantined.append(name)
            if not any(r[-1].published for r in reports.values()):
                break  # nobody moved: the next batch would be the same
        with self._lock:
            if self._enabled("fleet_raise_floor"):
                self._take("fleet_raise_floor")

    def _catch_up_peer(self, report: FleetCycleReport) -> tuple[str, str] | str | None:
        """With peer sources, members catching up to the frontier stage it from a member
        that installed it in this update: that member's name and URL; why not, if it
        cannot serve; None when there is no such member or no peer sources."""
        sources = [n for n in report.committed_on
                   if self.members[n].view().committed == self.committed]
        if not self.peer_sources or not sources:
            return None
        frontier = self._known_target(self.committed)
        assert frontier is not None, "a member published it"
        try:
            return sources[0], self._peer_url(self.members[sources[0]], frontier.identity)
        except FleetError as e:
            return str(e)

    def _publish(self, report: FleetCycleReport, names: list[str], quorum: int) -> None:
        """One group in the journal: the fleet's record, then each member's publish."""
        self._take("fleet_publish", members=names, label=report.target.label,
                   identity=report.target.identity, min_serving=quorum)
        for name in names:
            self.members[name].runner.commit(report.members[name])
        report.published = True
        report.committed_on = names
        self._changed.notify_all()


def _updates(m: Member, plans: Mapping[str, list[WeightTarget]], frontier: int = 0,
             source: str | None = None) -> list[CycleReport]:
    """Member ``m``'s own updates through its plan, up to the first that does not publish;
    the ``frontier`` generation's bytes read from ``source`` if given (a peer)."""
    out: list[CycleReport] = []
    for t in plans[m.name]:
        out.append(m.runner.update(t, source=source if t.generation == frontier else None))
        if not out[-1].published:
            break
    return out
