"""The fleet controller: one transactional policy update across N engines, quarantine,
verified re-admission, and admission of rollouts onto serving members only.

It executes the fleet spec (:mod:`rolloutcore.spec.fleet`): every member is a
single-engine :class:`~rolloutcore.controller.Controller` driven by its own
:class:`~rolloutcore.runner.LifecycleRunner` (so each member's steps are the ones the
single-engine spec proves), and the fleet's own decisions use the spec's predicates
(:func:`~rolloutcore.spec.fleet.validated`, :func:`~rolloutcore.spec.fleet.settled`,
:func:`~rolloutcore.spec.fleet.serving`) on the members' controller states.

One journal holds the whole fleet: every member's records tagged with its name, the
fleet's own steps untagged, one hash chain and one sequence. A publish is one group:
the ``fleet_publish`` record names the members it commits, and their ``publish``
records follow it before anything else (the fleet's lock is held across the group).

The fleet decides an update (publish or abort) once every participant has ended its
cycle or is TAINTED (settled, in the spec): a tainted member's fence may still be in
flight, bounded by its deadline, and holds nobody closed; :meth:`Fleet.update` returns its
report once that fence has ended too, with admissions open meanwhile. A fleet recovered
from its journal fences every member it restarts TAINTED before it is returned.

Members are addressed by URL (any launcher: Kubernetes, Ray, a shell script); a fleet
file (TOML) names them: ``[[engine]] name, url, model, token, transfer``.

An engine whose process is replaced behind the fleet's back (a new process, possibly
other weights) looks the same to the controllers until someone looks: :meth:`Fleet.audit`
reads every READY member again (label, identity, run state, a probe; see
:meth:`LifecycleRunner.audit`), and the optional watchdog (``watchdog_s``) does so periodically.
A member whose audit finds another engine is quarantined (fenced; served again only
after verified re-admission), one that cannot be reached stops serving until an audit
passes, and so does one the application reports unreachable
(:meth:`Fleet.report_unreachable`, which also audits it at once). Between a replacement
and the next audit nobody can know: the watchdog's period bounds that window.

Locks, and the one order they are taken in (never the other way round, so no deadlock):

1. ``Fleet._update_lock``: one update, re-admission or audit at a time; held across
   engine calls (it orders fleet operations, it guards no data read elsewhere);
2. ``Fleet._lock`` (``_changed`` is its condition): the fleet's phase, generations,
   members' ``outstanding`` counts and every fleet journal step (a publish group among
   them);
3. a member ``Controller``'s lock: its control state and bindings. Everything that reads
   a member's state for a decision reads it once, with its bindings, under that lock
   (:meth:`Member.view`, i.e. :meth:`Controller.snapshot`): a release on another thread
   cannot change the bindings mid-read;
4. an update's :class:`_Decision` lock: a member's trace sink settles it, under the
   member's controller lock;
5. the ``Journal``'s lock, innermost (a controller journals its steps under its own lock).

A thread holding one of these takes only later ones.
"""

from __future__ import annotations

import logging
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rolloutcore.adapters.contract import LifecycleAdapter, WeightTarget
from rolloutcore.controller import (
    AdmissionCancelled,
    AdmissionTimeout,
    Binding,
    Controller,
    IllegalTransition,
    TraceRecord,
    TraceSink,
)
from rolloutcore.inputs import unreadable
from rolloutcore.journal import HEADER, SCHEMA, Journal, JournalReader, apply_record, restart_step
from rolloutcore.postconditions import Outcome
from rolloutcore.runner import CycleReport, LifecycleRunner, RunnerPolicy
from rolloutcore.spec.fleet import (
    FLEET,
    FLEET_ACTIONS,
    MEMBER_GUARDS,
    FleetPhase,
    FleetState,
    held_back,
    quorum,
    serving,
    validated,
)
from rolloutcore.spec.lifecycle import FENCED, Phase, Result, verified
from rolloutcore.spec.triggers import OUTCOMES, Trigger

UNINITIALIZED = "UNINITIALIZED"
TRANSFERS = ("reload", "gloo", "nccl")
#: The outcomes of an audit, as journalled.
AUDIT_OUTCOMES = frozenset({Trigger.AUDIT_OK, Trigger.AUDIT_FAILED, Trigger.AUDIT_MISMATCH})
log = logging.getLogger(__name__)


class FleetError(Exception):
    """A fleet operation that cannot be carried out as asked (nothing was changed)."""


_FLEET_STEP = {a.name: a for a in FLEET_ACTIONS}
_OK_OUTCOMES = frozenset({o[Result.OK] for o in OUTCOMES.values()} | {"drained"})


def _failures(report: CycleReport) -> str:
    """The steps of a member's cycle that did not succeed, in words."""
    bad = [f"{s.step}: {s.outcome} ({s.reason})" for s in report.steps
           if s.outcome not in _OK_OUTCOMES]
    return "; ".join(bad) or "no step failed"


class FleetFileError(ValueError):
    """A fleet file that is not what the fleet reads (where and why)."""


# ------------------------------------------------------------------------ fleet file


@dataclass(frozen=True)
class EngineConfig:
    name: str
    url: str
    model: str = "tiny"
    token: str | None = None
    transfer: str = "reload"


@dataclass(frozen=True)
class FleetConfig:
    engines: tuple[EngineConfig, ...]
    min_serving: int
    journal: Path | None = None
    watchdog_s: float | None = None  # None: not given (``serve`` has a default)


def load_fleet_file(path: str | Path) -> FleetConfig:
    """Read and check a fleet file::

        [fleet]
        min_serving = 2          # optional, default: every engine
        journal = "fleet.jsonl"  # optional, relative to the file
        watchdog_s = 10          # optional: audit every serving engine this often

        [[engine]]
        name = "a"
        url = "http://127.0.0.1:8001"
        model = "tiny"           # optional
        token = "..."            # optional (sent as a bearer token)
        transfer = "reload"      # optional: reload | gloo | nccl
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise FleetFileError(unreadable(p, err)) from None
    except tomllib.TOMLDecodeError as err:
        raise FleetFileError(f"{p}: not TOML: {err}") from None
    unknown = set(data) - {"fleet", "engine"}
    if unknown:
        raise FleetFileError(f"{p}: unknown table(s) {sorted(unknown)}")
    raw = data.get("engine")
    if not isinstance(raw, list) or not raw:
        raise FleetFileError(f"{p}: no [[engine]] entries")
    engines: list[EngineConfig] = []
    for n, e in enumerate(raw, 1):
        where = f"{p}: engine {n}"
        if not isinstance(e, dict):
            raise FleetFileError(f"{where}: not a table")
        extra = set(e) - {"name", "url", "model", "token", "transfer"}
        if extra:
            raise FleetFileError(f"{where}: unknown key(s) {sorted(extra)}")
        for key in ("name", "url"):
            if not isinstance(e.get(key), str) or not e[key]:
                raise FleetFileError(f"{where}: {key} must be a non-empty string")
        for key in ("model", "token", "transfer"):
            if key in e and not isinstance(e[key], str):
                raise FleetFileError(f"{where}: {key} must be a string")
        transfer = e.get("transfer", "reload")
        if transfer not in TRANSFERS:
            raise FleetFileError(f"{where}: transfer must be one of {', '.join(TRANSFERS)}")
        engines.append(EngineConfig(e["name"], e["url"], e.get("model", "tiny"),
                                    e.get("token"), transfer))
    names = [e.name for e in engines]
    if len(set(names)) != len(names):
        raise FleetFileError(f"{p}: engine names must be distinct: {names}")
    fleet = data.get("fleet", {})
    if not isinstance(fleet, dict) or set(fleet) - {"min_serving", "journal", "watchdog_s"}:
        raise FleetFileError(f"{p}: [fleet] takes min_serving, journal and watchdog_s only")
    k = fleet.get("min_serving", len(engines))
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(engines):
        raise FleetFileError(f"{p}: min_serving must be an integer in 1..{len(engines)}")
    journal = fleet.get("journal")
    if journal is not None and not isinstance(journal, str):
        raise FleetFileError(f"{p}: journal must be a path string")
    watchdog = fleet.get("watchdog_s")
    if watchdog is not None and (isinstance(watchdog, bool) or not isinstance(
            watchdog, int | float) or not 0 < watchdog < float("inf")):
        raise FleetFileError(f"{p}: watchdog_s must be a positive number of seconds")
    return FleetConfig(tuple(engines), k, (p.parent / journal) if journal else None,
                       None if watchdog is None else float(watchdog))


# --------------------------------------------------------------------------- runtime


class _Decision:
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

    def view(self) -> Any:
        """The member's controller state, as the fleet spec's predicates read it: one
        snapshot under the controller's lock (see the lock order in the module doc)."""
        return self.controller.snapshot()


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
    phase: str = FleetPhase.READY
    total_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "target": self.target.label, "generation": self.target.generation,
            "published": self.published, "aborted": self.aborted, "phase": self.phase,
            "committed_on": self.committed_on, "quarantined": self.quarantined,
            "rolled_back": self.rolled_back, "total_s": round(self.total_s, 4),
            "members": {n: {"final_phase": r.final_phase.value, "prepared": r.prepared,
                            "published": r.published, "total_s": round(r.total_s, 4),
                            "tainted_after_s": r.tainted_after_s, "fenced": r.fenced,
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


class Fleet:
    """N members, one fleet state, one journal. Thread-safe."""

    def __init__(self, members: Sequence[tuple[str, LifecycleAdapter, str | None]], *,
                 journal: str | Path, min_serving: int | None = None,
                 policy: RunnerPolicy | None = None, fsync: bool = True,
                 clock: Callable[[], float] = time.time,
                 on_step: StepHook | None = None,
                 target_of: TargetFactory | None = None,
                 watchdog_s: float | None = None) -> None:
        """A fleet over ``members`` (name, adapter, URL). A new journal starts a fresh
        fleet (to bootstrap); an existing one is recovered (see :meth:`_recover`), which
        needs ``target_of`` to describe the generations it names. ``watchdog_s``: audit
        every READY member that often (see :meth:`start_watchdog`)."""
        names = [n for n, _a, _u in members]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"members need distinct names: {names}")
        self.min_serving = len(names) if min_serving is None else min_serving
        if not 1 <= self.min_serving <= len(names):
            raise ValueError(f"min_serving must be in 1..{len(names)}")
        path = Path(journal)
        existing = path.exists() and path.stat().st_size > 0
        self.policy = policy = policy or RunnerPolicy()
        self._clock = clock
        self.on_step = on_step
        self.members: dict[str, Member] = {}
        for name, adapter, url in members:
            ctl = Controller()
            runner = LifecycleRunner(ctl, adapter, policy, on_step=self._hook(name))
            self.members[name] = Member(name, adapter, url, ctl, runner)
        self.phase = UNINITIALIZED
        self.committed = 0
        self.target = 0
        self.last_report: FleetCycleReport | None = None
        self.recovered: dict[str, Trigger] = {}  # member -> the restart the spec allowed
        if existing:
            self._replay(path, target_of)
        self.journal = Journal(path, fsync=fsync, clock=clock, spec_name=FLEET.name)
        self._deciding: _Decision | None = None  # the update being decided, if any
        for m in self.members.values():
            m.controller.trace = self._member_sink(m.name)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._pool = ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="fleet")
        self._update_lock = threading.Lock()  # one update, readmission or audit at a time
        self._quorum: int | None = None  # the quorum of the update being decided, if any
        self._watchdog: threading.Thread | None = None
        self._watchdog_stop = threading.Event()
        if existing:
            with self._lock:
                self._restart()
            self._fence_recovered()
        if watchdog_s is not None:
            self.start_watchdog(watchdog_s)

    # --------------------------------------------------------------------- recovery

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
            self._replay_target(m, rec, target_of)
            if rec.get("step") in AUDIT_OUTCOMES:
                m.last_audit = _audit_record(rec)
        report = reader.report
        if not report.ok and not report.truncated:
            raise FleetError(f"{path}: chain broken at line {report.first_bad_line} "
                             f"({report.reason}); move it aside and bootstrap a new fleet")

    def _replay_fleet_step(self, rec: Mapping[str, Any]) -> None:
        self.phase = str(rec.get("phase"))
        self.committed = int(rec.get("committed") or 0)
        self.target = int(rec.get("target") or 0)
        detail = rec.get("detail") or {}
        if rec.get("step") == "fleet_open" and isinstance(detail, dict):
            self.min_serving = int(detail.get("min_serving", self.min_serving))

    @staticmethod
    def _replay_target(m: Member, rec: Mapping[str, Any], target_of: TargetFactory | None
                       ) -> None:
        detail = rec.get("detail")
        step = rec.get("step")
        if step == Trigger.REQUEST_UPDATE and isinstance(detail, dict):
            m.requested = detail.get("target")
        if not isinstance(detail, dict) or target_of is None:
            return
        gen = int(rec.get("committed") or 0)
        if step == Trigger.PUBLISH or (step == Trigger.BOOTSTRAP_OK and gen == 1):
            source, label = detail.get("checkpoint"), detail.get("label")
            if isinstance(source, str) and isinstance(label, str):
                m.runner.targets[gen] = target_of(source, gen, label)
                m.controller.identity = m.runner.targets[gen].identity

    def _restart(self) -> None:
        """After a replay: every member takes the restart the single-engine spec allows
        (a member left in doubt restarts TAINTED: quarantined until re-admitted); the
        fleet reopens only with a quorum serving, else it stays closed."""
        for m in self.members.values():
            trigger = restart_step(m.controller)
            m.controller.restart(trigger, {"reason": "the fleet controller restarted"})
            self.recovered[m.name] = trigger
        if self.phase == UNINITIALIZED:
            return
        n = len(self._serving_now())
        self.phase = FleetPhase.READY if n >= self.min_serving else FleetPhase.ABORTING
        self.target = 0
        self._step("fleet_recover", serving=n, min_serving=self.min_serving)

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

    def _serving_now(self) -> list[Member]:
        f: Any = SimpleNamespace(fphase=FleetPhase.READY, fcommitted=self.committed, ftarget=0)
        return [m for m in self.members.values() if serving(f, m.view())]

    def _member_sink(self, name: str) -> TraceSink:
        """The member's journal sink; a step that leaves it TAINTED settles the update
        being decided for it (its fence may still run: the fleet need not wait for it)."""
        journal = self.journal.member(name)

        def sink(record: TraceRecord) -> int:
            seq = journal(record)
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

    def close(self) -> None:
        """Stop the watchdog, let cycles the fleet decided without end (a tainted member's
        fence, bounded by its deadline), close the journal."""
        self.stop_watchdog()
        for m in self.members.values():
            m.settle_work(self.policy.fence_timeout_s + 5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.journal.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ fleet state

    def _fleet(self) -> Any:
        return SimpleNamespace(fphase=self.phase, fcommitted=self.committed,
                               ftarget=self.target)

    def _fleet_state(self) -> Any:
        """The fleet's state as the fleet spec's predicates read it, members included."""
        f = self._fleet()
        f.eng = tuple(m.view() for m in self.members.values())
        return f

    def _enabled(self, step: str) -> bool:
        """Whether the fleet spec takes fleet step ``step`` from the fleet's state now."""
        fa = _FLEET_STEP[step]
        return self.phase in fa.sources and fa.when(self._fleet_state(), self._bounds())

    def _member_may(self, step: str, m: Member) -> bool:
        """Whether the fleet spec's guard lets member ``m`` take ``step`` now."""
        guard = MEMBER_GUARDS.get(step)
        return guard is None or guard[0](self._fleet_state(), m.view(), self._bounds())

    def _bounds(self) -> Any:
        """The fleet spec's bounds: the quorum of the update being decided, else the
        fleet's."""
        return SimpleNamespace(min_serving=self._quorum or self.min_serving)

    def _serving(self) -> list[Member]:
        f = self._fleet()
        return [m for m in self.members.values() if serving(f, m.view())]

    def _take(self, step: str, **detail: Any) -> None:
        """Take the fleet spec's step ``step``: its guard must hold, its effect sets the
        fleet's phase and generations (the only place an update, abort, close or reopen
        changes them), and it is journalled. The members' half of its effect (a publish
        commits the validated members) is each member's own step, taken by the caller."""
        fa = _FLEET_STEP[step]
        f = self._fleet_state()
        if self.phase not in fa.sources or not fa.when(f, self._bounds()):
            raise AssertionError(f"{step} is not enabled in the fleet's state: a fleet bug")
        g = fa.apply(FleetState(f.fphase, f.fcommitted, f.ftarget, f.eng, 0))
        self.phase, self.committed, self.target = g.fphase, g.fcommitted, g.ftarget
        self._step(step, **detail)

    def _step(self, step: str, **detail: Any) -> None:
        self.journal.fleet_step(step, self.phase, self.committed, self.target, detail or None)
        self._changed.notify_all()

    def _parallel(self, fn: Callable[[Member], Any], members: Sequence[Member]) -> dict[
            str, Any]:
        futures = {m.name: self._pool.submit(fn, m) for m in members}
        return {name: fut.result() for name, fut in futures.items()}

    # -------------------------------------------------------------------- bootstrap

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

    # ----------------------------------------------------------------------- update

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
        self._deciding = deciding = _Decision({m.name for m in participants})
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

    def _reopen_if_quorum(self) -> None:
        if self._enabled("fleet_reopen"):
            self._take("fleet_reopen", serving=[m.name for m in self._serving()])

    def _close_if_no_quorum(self) -> None:
        if self._enabled("fleet_close"):
            self._take("fleet_close", serving=[m.name for m in self._serving()],
                       min_serving=self.min_serving)

    # ------------------------------------------------------------------- readmission

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
                                   f"{rep.final_phase.value} ({_failures(rep)})")
                done.append(f"caught up to generation {t.generation}")
            self._settled_readmission()
            return Outcome(Trigger.READMIT_OK, f"{name} serves generation {self.committed} "
                           f"({'; '.join(done)})")

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

    def _settled_readmission(self) -> None:
        with self._lock:
            self._reopen_if_quorum()
            self._changed.notify_all()

    # ------------------------------------------------------------------------ audits

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
        m = self.members[lease.engine]
        if m.controller.enabled(Trigger.SUSPECT) is not None:
            return False
        try:
            m.controller.fire(Trigger.SUSPECT, None, {"rollout": lease.rollout_id,
                                                     "error": error[:500]})
        except IllegalTransition:  # lost a race with another report or an audit
            return False
        with self._lock:
            self._close_if_no_quorum()
            self._changed.notify_all()
        if audit:
            threading.Thread(target=self._audit_quietly, args=([m.name], "unreachable"),
                             name=f"fleet-audit-{m.name}", daemon=True).start()
        return True

    def _audit_quietly(self, names: list[str] | None, why: str) -> None:
        try:
            self.audit(names, why=why)
        except FleetError as e:  # the member moved on (an update, a re-admission)
            log.info("audit (%s) skipped: %s", why, e)
        except Exception:  # a background audit must not die silently
            log.exception("audit (%s) failed", why)

    def start_watchdog(self, period_s: float) -> None:
        """Audit every READY member every ``period_s`` seconds in a background thread
        (skipping a round while an update or re-admission runs): the period bounds how
        long an engine replaced out of band can go unnoticed. Its outcomes are journalled
        and kept per member (:meth:`status`)."""
        if not period_s > 0:
            raise ValueError(f"watchdog period must be positive, not {period_s}")
        self.stop_watchdog()
        self._watchdog_stop = stop = threading.Event()

        def loop() -> None:
            while not stop.wait(period_s):
                try:
                    self.audit(why="watchdog", blocking=False)
                except Exception:  # keep watching: the next round may succeed
                    log.exception("watchdog audit failed")

        self._watchdog = threading.Thread(target=loop, name="fleet-watchdog", daemon=True)
        self._watchdog.start()

    def stop_watchdog(self) -> None:
        self._watchdog_stop.set()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=60.0)
        self._watchdog = None

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

    # -------------------------------------------------------------------- admission

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

    # ----------------------------------------------------------------------- status

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

    def committed_target(self) -> WeightTarget | None:
        return self._known_target(self.committed)


def _audit_record(rec: Mapping[str, Any]) -> dict[str, Any]:
    """A member's last audit as its journal record states it."""
    detail = rec.get("detail") or {}
    return {"outcome": str(rec.get("step")), "reason": detail.get("reason"),
            "at": rec.get("t"), "why": detail.get("why")}


__all__ = ["EngineConfig", "Fleet", "FleetConfig", "FleetCycleReport", "FleetError",
           "FleetFileError", "Lease", "Member", "MemberStatus", "load_fleet_file"]

