"""What every job of the fleet shares: its members, its state as the fleet spec reads it,
and the one way a fleet step is taken (:meth:`FleetBase._take`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from rolloutcore.adapters.contract import EpochEvidence, LifecycleAdapter, WeightTarget
from rolloutcore.engine.controller import Controller, GuardView, TraceRecord, TraceSink
from rolloutcore.engine.runner import CycleReport, LifecycleRunner, RunnerPolicy
from rolloutcore.errors import Deposed, Refused
from rolloutcore.fleet.store import JournalStore
from rolloutcore.journal import Journal
from rolloutcore.spec.fleet import (
    FLEET_ACTIONS,
    LIFTED,
    MEMBER_GUARDS,
    ROLLING_STEPS,
    FleetPhase,
    FleetSnapshot,
    FleetState,
    Policy,
    fleet_half,
    may_restart,
    serving,
)
from rolloutcore.spec.lifecycle import Phase, Result
from rolloutcore.spec.triggers import OUTCOMES, RESTARTS, Trigger

UNINITIALIZED = FleetPhase.UNINITIALIZED
#: The outcomes of an audit, as journalled.
AUDIT_OUTCOMES = frozenset({Trigger.AUDIT_OK, Trigger.AUDIT_FAILED, Trigger.AUDIT_MISMATCH})
log = logging.getLogger("rolloutcore.fleet")


class FleetError(Refused):
    """A fleet operation that cannot be carried out as asked (nothing was changed)."""


class FleetDeposed(FleetError, Deposed):
    """The takeover met a newer epoch's fence on an engine: this controller is deposed
    before it began (nothing was changed)."""


class MigrationLost(FleetError):
    """A migration whose rollout left its member but was refused where it went (that
    member changed since the guard read it): the rollout ended, released; the caller
    reports it as aborted. The one FleetError after which something changed."""


FLEET_STEP = {a.name: a for a in FLEET_ACTIONS}
_OK_OUTCOMES = frozenset({o[Result.OK] for o in OUTCOMES.values()} | {"drained"})


def failures_of(report: CycleReport) -> str:
    """The steps of a member's cycle that did not succeed, in words."""
    bad = [f"{s.step}: {s.outcome} ({s.reason})" for s in report.steps
           if s.outcome not in _OK_OUTCOMES]
    return "; ".join(bad) or "no step failed"


class PendingDecision:
    """The participants of an update the fleet still waits for before it decides: one
    leaves when its cycle ends or when it turns TAINTED (settled in the spec: its fence
    may still be in flight, and a member that does not answer it costs the others only
    its own step's deadline, once). Woken by those two events, never polled."""

    def __init__(self, names: set[str]) -> None:
        self._left = names
        self._settled = threading.Condition(threading.Lock())

    def settle(self, name: str) -> None:
        with self._settled:
            self._left.discard(name)
            if not self._left:
                self._settled.notify_all()

    def settler(self, name: str) -> Callable[[Future[Any]], None]:
        """A done-callback for ``name``'s cycle."""
        return lambda _work: self.settle(name)

    def wait(self) -> None:
        with self._settled:
            self._settled.wait_for(lambda: not self._left)


@dataclass
class Member:
    name: str
    adapter: LifecycleAdapter
    url: str | None
    controller: Controller
    runner: LifecycleRunner
    outstanding: int = 0  # rollouts admitted and not yet released
    last_audit: dict[str, Any] | None = None  # outcome, reason, at (wall clock), why
    requested: str | None = None  # the label of the last update requested (journal)
    work: Future[Any] | None = None  # its cycle, if still running after the decision

    def settle_work(self, timeout: float) -> None:
        """Wait (bounded) for a cycle the fleet decided without: a tainted member's fence."""
        work = self.work
        if work is not None:
            try:
                work.result(timeout=timeout)
            except TimeoutError:
                log.warning("%s: its cycle still runs %.1f s later", self.name, timeout)
            except Exception:  # its report says what happened
                log.exception("%s: the cycle left running failed", self.name)

    def view(self) -> GuardView:
        """The member's controller state, as the fleet spec's predicates read it: one
        snapshot under the controller's lock (see the lock order in the module doc)."""
        return self.controller.snapshot()


def fence_one(m: Member, epoch: int, seconds: float) -> EpochEvidence:
    fence = getattr(m.adapter, "fence_epoch", None)
    if fence is None:
        return EpochEvidence(epoch, False, None, "its adapter cannot fence (its engine does "
                             "not check epochs)")
    try:
        ev: EpochEvidence = fence(epoch, time.monotonic() + seconds)
    except Exception as e:  # an adapter bug must not stop the takeover of the others
        return EpochEvidence(epoch, False, None, f"{type(e).__name__}: {e}")
    return ev


@dataclass(frozen=True)
class Lease:
    """A rollout admitted on one member, bound to the fleet's committed generation."""

    rollout_id: str
    engine: str
    url: str | None
    generation: int
    identity: str | None
    label: str
    seq: int


@dataclass
class FleetCycleReport:
    target: WeightTarget
    published: bool
    aborted: bool
    members: dict[str, CycleReport] = field(default_factory=dict)
    committed_on: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    rolled_back: dict[str, str] = field(default_factory=dict)  # member -> readmit outcome
    waves: list[list[str]] = field(default_factory=list)  # a rolling update's, in order
    phase: str = FleetPhase.READY
    total_s: float = 0.0
    #: A staged update refused before any member closed (prepare-then-commit: a member's
    #: staging failed): why; every member still serves the committed generation.
    refused: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "target": self.target.label, "generation": self.target.generation,
            "published": self.published, "aborted": self.aborted, "phase": self.phase,
            "committed_on": self.committed_on, "quarantined": self.quarantined,
            "rolled_back": self.rolled_back, "waves": self.waves,
            "total_s": round(self.total_s, 4), "refused": self.refused,
            "members": {n: {"final_phase": r.final_phase.value, "prepared": r.prepared,
                            "published": r.published, "total_s": round(r.total_s, 4),
                            "drain_wait_s": round(r.drain_wait_s, 4),
                            "tainted_after_s": r.tainted_after_s, "fenced": r.fenced,
                            "staged_bytes": r.staged_bytes, "peer": r.peer,
                            "steps": [(s.step, s.outcome, round(s.seconds, 4), s.attempts)
                                      for s in r.steps]}
                        for n, r in self.members.items()}}


@dataclass(frozen=True)
class MemberStatus:
    name: str
    url: str | None
    phase: str
    committed: int
    label: str | None
    identity: str | None
    serving: bool
    quarantined: bool
    outstanding: int
    last_audit: dict[str, Any] | None = None  # outcome, reason, at, why (None: never)

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


StepHook = Callable[[str, str, str, float], None]  # (member, step, outcome, seconds)
#: (checkpoint source, generation, label) -> the target it describes (for recovery).
TargetFactory = Callable[[str, int, str], WeightTarget]


class FleetBase:
    """The fleet's shared state and its bridge to the fleet spec; the jobs (recovery,
    updates, re-admission, audits, admission) are its subclasses, composed by
    :class:`~rolloutcore.fleet.composed.Fleet`."""

    members: dict[str, Member]
    min_serving: int
    policy: RunnerPolicy
    on_step: StepHook | None
    #: Called with a member's name as it starts to drain for an update (from the step's
    #: journal write, under the member's lock: a listener must only signal, never block
    #: or call back into the fleet). Rollouts held elsewhere (the gateway's streams)
    #: learn from it that they may move (:meth:`migrate`) instead of being waited for.
    drain_listeners: list[Callable[[str], None]]
    phase: str
    committed: int  # the frontier: the newest generation published
    target: int
    floor: int  # the oldest generation still served (the frontier, with max_live 1)
    down: frozenset[str]  # members the recovery under way has yet to restart
    max_live: int  # K: generations served at once (1: the strict fleet-wide update)
    min_admitting: int  # C: members that keep serving through a rolling update
    peer_sources: bool  # a staged update travels once: members stage from a peer
    last_report: FleetCycleReport | None
    recovered: dict[str, Trigger]  # member -> the restart the spec allowed
    journal: Journal
    store: JournalStore  # where the journal lives, and the leadership's epoch
    epoch: int | None  # this controller's epoch (None: no store)
    unfenced: set[str]  # members its takeover could not fence yet (out of service)
    _clock: Callable[[], float]
    _deciding: PendingDecision | None  # the update being decided, if any
    _lock: threading.RLock
    _changed: threading.Condition
    _pool: ThreadPoolExecutor
    _update_lock: threading.Lock  # one update, readmission or audit at a time
    _readmissions_due: int  # watchdog re-admissions the trainer's next update lets go first
    _quorum: int | None  # the quorum of the update being decided, if any
    _watchdog: threading.Thread | None
    _watchdog_stop: threading.Event
    _order: list[Member]  # the members, in order (their index in _views)
    _index: dict[str, int]
    _views: list[GuardView]  # each member's view as last read (see _watch_views)
    _stale: set[int]  # members changed since their view was read

    def _member_sink(self, name: str) -> TraceSink:
        """The member's journal sink; a step that leaves it TAINTED settles the update
        being decided for it (its fence may still run: the fleet need not wait for it)."""
        journal = self.journal.member(name)

        def sink(record: TraceRecord) -> int:
            seq = journal(record)
            if record.step == "request_update":
                for listener in self.drain_listeners:
                    listener(name)
            if record.phase is Phase.TAINTED:
                deciding = self._deciding
                if deciding is not None:
                    deciding.settle(name)
            return seq
        return sink

    def _hook(self, name: str) -> Callable[[str, str, float], None]:
        def hook(step: str, outcome: str, seconds: float) -> None:
            if self.on_step is not None:
                self.on_step(name, step, outcome, seconds)
        return hook

    def _fleet(self) -> FleetSnapshot:
        """The fleet's own half (phase, frontier, target, floor), without its members."""
        return FleetSnapshot(self.phase, self.committed, self.target, self.floor, (),
                             self.down)

    def _fleet_state(self) -> FleetSnapshot:
        """The fleet's state as the fleet spec's predicates read it, members included."""
        return replace(self._fleet(), eng=self._eng())

    def _watch_views(self) -> None:
        """Keep one view per member, re-read only once the member has changed (its
        controller marks it): a member's step reads every member's state, and re-reading
        them all made a fleet update's cost grow with the square of its size."""
        self._order = list(self.members.values())
        self._index = {m.name: i for i, m in enumerate(self._order)}
        self._views = [m.view() for m in self._order]
        self._stale = set()
        for i, m in enumerate(self._order):
            m.controller.on_change = partial(self._stale.add, i)

    def _eng(self, own: str | None = None, view: GuardView | None = None
             ) -> tuple[GuardView, ...]:
        """Every member's view, in member order (under the fleet's lock: two readers never
        write one member's view out of order). ``own``: the member taking a step, with the
        ``view`` its step passes (its lock is held: it is not re-read)."""
        with self._lock:
            stale, views = self._stale, self._views
            mine = -1 if own is None else self._index[own]
            skipped = False
            while stale:
                i = stale.pop()  # popped before the read: a change after it marks it again
                if i == mine:
                    skipped = True
                    continue
                views[i] = self._order[i].view()
            if skipped:
                stale.add(mine)
            if mine < 0 or view is None:
                return tuple(views)
            return (*views[:mine], view, *views[mine + 1:])

    def _enabled(self, step: str) -> bool:
        """Whether the fleet spec takes fleet step ``step`` from the fleet's state now."""
        fa = FLEET_STEP[step]
        return self.phase in fa.sources and fa.when(self._fleet_state(), self._bounds())

    @contextmanager
    def _trainer_turn(self) -> Iterator[None]:
        """The update lock for one of the trainer's updates, taken once no watchdog
        re-admission is due (they go first: the spec's WatchdogReadmits is strongly fair,
        and updates back to back would otherwise shut re-admission out for ever)."""
        with self._changed:
            self._changed.wait_for(lambda: self._readmissions_due == 0)
        with self._update_lock:
            yield

    def _member_may(self, step: str, m: Member) -> bool:
        """Whether the fleet spec's guard lets member ``m`` take ``step`` now."""
        return self._member_guard(m.name)(step, m.view()) is None

    def _member_guard(self, name: str) -> Callable[[str, Any], str | None]:
        """Member ``name``'s controller guard: the fleet spec's guard of each step, read
        where the step is taken (under the fleet's lock, the controller's step lock, with
        the member's own state as the step sees it), so nothing changes in between."""
        def guard(step: str, view: Any) -> str | None:
            if self.phase == UNINITIALIZED and step in LIFTED:
                return "the fleet spec takes no member step before fleet_open"
            if step in RESTARTS:
                if self.phase != UNINITIALIZED and not may_restart(self._fleet(), name):
                    return "a member restarts once, in a recovery"
                return None
            if self.phase == FleetPhase.RECOVERING:
                return "the fleet spec takes only member restarts while the fleet recovers"
            g = MEMBER_GUARDS.get(step)
            if g is None:
                return None
            f = replace(self._fleet(), eng=self._eng(name, view))
            if g[0](f, view, self._bounds()):
                return None
            return f"the fleet spec requires {' '.join(g[1].split())} (fleet {self.phase})"
        return guard

    def _bounds(self) -> Policy:
        """The fleet spec's bounds: the quorum of the update being decided, else the
        fleet's."""
        return Policy(self._quorum or self.min_serving, self.max_live, self.min_admitting)

    def _serving(self) -> list[Member]:
        f = self._fleet()
        return [m for m, v in zip(self._order, self._eng(), strict=True) if serving(f, v)]


    def _take(self, step: str, **detail: Any) -> None:
        """Take the fleet spec's step ``step``: its guard must hold, its effect sets the
        fleet's phase and generations (the only place an update, abort, close or reopen
        changes them), and it is journalled. The members' half of its effect (a publish
        commits the validated members) is each member's own step, taken by the caller."""
        fa = FLEET_STEP[step]
        f = self._fleet_state()
        if self.phase not in fa.sources or not fa.when(f, self._bounds()):
            raise AssertionError(f"{step} is not enabled in the fleet's state: a fleet bug")
        g = fleet_half(fa, FleetState(f.fphase, f.fcommitted, f.ftarget, (), 0, f.ffloor))
        self.phase, self.committed, self.target = g.fphase, g.fcommitted, g.ftarget
        self.floor = g.ffloor
        self._step(step, **detail)

    def _step(self, step: str, **detail: Any) -> None:
        if self.max_live > 1 and step in ROLLING_STEPS:  # the floor, for the reader
            detail["floor"] = self.floor
        self.journal.fleet_step(step, self.phase, self.committed, self.target, detail or None)
        self._changed.notify_all()

    def _parallel(self, fn: Callable[[Member], Any], members: Sequence[Member]) -> dict[
            str, Any]:
        futures = {m.name: self._pool.submit(fn, m) for m in members}
        return {name: fut.result() for name, fut in futures.items()}

    def _reopen_if_quorum(self) -> None:
        if self._enabled("fleet_reopen"):
            self._take("fleet_reopen", serving=[m.name for m in self._serving()])

    def _close_if_no_quorum(self) -> None:
        if self._enabled("fleet_close"):
            self._take("fleet_close", serving=[m.name for m in self._serving()],
                       min_serving=self.min_serving)

    def _known_target(self, generation: int) -> WeightTarget | None:
        for m in self.members.values():
            t = m.runner.targets.get(generation)
            if t is not None:
                return t
        return None

    @staticmethod
    def _retarget(t: WeightTarget, generation: int) -> WeightTarget:
        from dataclasses import replace

        return t if t.generation == generation else replace(t, generation=generation)

    def status(self) -> list[MemberStatus]:
        with self._lock:
            f = self._fleet()
            out = []
            for m in self.members.values():
                c = m.view()  # one read: phase, generation and bindings agree
                t = m.runner.targets.get(c.committed)
                out.append(MemberStatus(
                    m.name, m.url, c.phase.value, c.committed, t.label if t else None,
                    m.controller.identity, serving(f, c), c.phase is Phase.TAINTED,
                    m.outstanding, m.last_audit))
            return out

    def _catch_up_plan(self, committed: int, target: WeightTarget | None) -> list[WeightTarget]:
        """The targets of the generations after ``committed`` up to the fleet's, in order
        (``target`` for the last); FleetError if the fleet knows no checkpoint of one."""
        plan: list[WeightTarget] = []
        for g in range(committed + 1, self.committed + 1):
            t = target if target is not None and g == self.committed else self._known_target(g)
            if t is None:
                raise FleetError(f"no checkpoint known for generation {g}, needed to catch "
                                 f"up from {committed} to {self.committed} (nothing was "
                                 "changed)")
            if t.generation != g:
                raise FleetError(f"the target given describes generation {t.generation}, not "
                                 f"the fleet's {g} (nothing was changed)")
            plan.append(t)
        return plan

    def fence_unfenced(self, names: Sequence[str]) -> list[str]:
        """Fence, with this leader's epoch, those of ``names`` that its takeover could not
        (before they are audited or re-admitted); returns those still unfenced."""
        epoch = self.epoch
        todo = [self.members[n] for n in names if n in self.unfenced]
        if epoch is None or not todo:
            return []
        results = self._parallel(
            lambda m: fence_one(m, epoch, self.policy.fence_timeout_s), todo)
        newer = {n: ev.seen for n, ev in results.items() if ev.error is None and not ev.accepted}
        if newer:
            raise FleetDeposed(f"deposed: epoch {epoch} is below the fence of {newer}")
        done = sorted(n for n, ev in results.items() if ev.accepted)
        if done:
            self.unfenced -= set(done)
            with self._lock:
                self._step("fleet_fenced", epoch=epoch, fenced=done)
        return sorted(self.unfenced & set(names))

    def committed_target(self) -> WeightTarget | None:
        return self._known_target(self.committed)
