"""The lifecycle controller, generated from the spec's transition table.

States, triggers, guards and effects all come from :mod:`rolloutcore.spec.lifecycle`:
one ``transitions`` transition per (trigger, source phase), whose condition is the
action's ``when`` and whose effect is its ``control``. Spec actions that look the same
to the controller (``observed_as``) share a trigger; the generator checks that their
controller halves agree.

The machine is private to the facade, and the facade holds its own lock around every
access, so the default machine class is ``transitions.Machine``: a ``LockedMachine``
(supported, ``machine_class=LockedMachine``) adds a second, redundant lock and costs
~9x per trigger here (119 us vs 13 us), which alone would exceed the runner's 1 ms
budget per cycle. The edge tour runs against both.

The facade is the only way in: it takes one lock per step, raises
:class:`IllegalTransition` instead of returning False, does no I/O in callbacks and
emits exactly one trace record per accepted step. Admission and release are the hot
path: they use the same spec rows (``sources`` and ``when``) without a machine trigger.
An admission while admissions are closed can wait (bounded, cancellable) for them to
reopen instead of being refused. Restart triggers are taken only through
:meth:`Controller.restart`, by journal recovery.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from transitions import Machine
from transitions.extensions import LockedMachine

from rolloutcore.errors import Refused
from rolloutcore.spec.lifecycle import NO_OP, SPEC, Action, Kind, Phase, Spec, frees_bindings
from rolloutcore.spec.triggers import Trigger


class IllegalTransition(Refused):
    """A step the spec does not allow in the current state. Nothing was changed."""

    def __init__(self, step: str, phase: Phase, reason: str) -> None:
        super().__init__(f"{step} is not allowed in {phase.value}: {reason}")
        self.step = step
        self.phase = phase
        self.reason = reason


class ControlState(NamedTuple):
    """The controller half of a spec state (bindings are kept beside it)."""

    phase: Phase
    committed: int
    target: int
    pending: str
    cleared: frozenset[str]
    evidence: frozenset[str]


class GuardView(NamedTuple):
    """What a spec ``when``/``control`` function reads: ControlState plus bindings."""

    phase: Phase
    committed: int
    target: int
    pending: str
    bind: tuple[int, ...]
    cleared: frozenset[str]
    evidence: frozenset[str]


INITIAL_CONTROL = ControlState(Phase.UNINITIALIZED, 0, 0, NO_OP, frozenset(), frozenset())


class Binding(NamedTuple):
    """A rollout bound to the committed generation (and the identity behind it)."""

    rollout_id: str
    generation: int
    identity: str | None
    seq: int  # trace sequence number of its admission
    aborted: bool = False  # released as aborted by the drain (partial output)


class AdmissionTimeout(IllegalTransition):
    """Admissions stayed closed (or below the requested generation) for the whole wait."""


class AdmissionCancelled(IllegalTransition):
    """The caller cancelled a waiting admission."""


class TraceRecord(NamedTuple):
    seq: int
    step: str  # controller trigger (admit, release, mutate_ok, ...)
    param: str | None  # rollout id or cache tier
    phase: str  # phase after the step (a Phase, which is a str)
    committed: int
    target: int
    pending: str
    detail: Mapping[str, Any] | None

    def as_json_dict(self) -> dict[str, Any]:
        out = self._asdict()
        if out["detail"] is None:
            del out["detail"]
        return out


#: A sink may number the record itself (a journal shared by several controllers, a
#: fleet's): it returns the sequence number it wrote the record under, or None.
TraceSink = Callable[[TraceRecord], "int | None"]
_new = tuple.__new__


class TraceBuffer:
    """An in-memory trace sink (appending is the whole cost on the hot path)."""

    def __init__(self) -> None:
        self.records: list[TraceRecord] = []
        self.emit: TraceSink = self.records.append

    def __call__(self, record: TraceRecord) -> None:
        self.records.append(record)


@dataclass(frozen=True)
class TriggerSpec:
    """One controller trigger, generated from one or more spec actions."""

    name: str
    actions: tuple[Action, ...]
    sources: frozenset[Phase]
    dest: Phase | None
    param: str | None
    when: Callable[[Any, Any], bool]
    control: Callable[[Any, Any], Mapping[str, object]]
    kind: Kind
    frees: bool = False  # drops every binding (a restart, an audit mismatch)


#: Triggers that are not machine transitions: the hot path (admission and releases).
HOT_PATH = frozenset({Trigger.ADMIT, Trigger.RELEASE, Trigger.RELEASE_ABORTED})


def triggers_of(spec: Spec) -> dict[str, TriggerSpec]:
    """Group spec actions by the trigger the controller sees, checking they agree."""
    groups: dict[str, list[Action]] = {}
    for a in spec.actions:
        if a.trigger is not None:
            groups.setdefault(a.trigger, []).append(a)
    out: dict[str, TriggerSpec] = {}
    for name, acts in groups.items():
        first = next((a for a in acts if a.name == name), acts[0])
        for a in acts:
            same = (a.sources, a.dest, a.param, a.when_tla, dict(a.control_tla)) == (
                first.sources, first.dest, first.param, first.when_tla, dict(first.control_tla)
            )
            if not same:
                raise ValueError(f"{a.name} is observed as {name} but its controller half differs")
        out[name] = TriggerSpec(name, tuple(acts), first.sources, first.dest, first.param,
                                first.when, first.control, first.kind, frees_bindings(first))
    return out


class _Model:
    """The object ``transitions`` manages; it only carries the phase name."""

    state: str


@dataclass
class Controller:
    """Thread-safe facade over the generated machine."""

    spec: Spec = SPEC
    trace: TraceSink | None = None
    control: ControlState = INITIAL_CONTROL
    bindings: dict[str, Binding] = field(default_factory=dict)
    identity: str | None = None  # identity of the committed generation's weights
    machine_class: type[Machine] = Machine
    #: Held, outside the controller's own lock, across every machine step (not the hot
    #: path): a fleet's lock, so that its decisions, which read every member's state, and
    #: the members' steps are journalled in one order (no step lands inside a group).
    step_lock: AbstractContextManager[Any] = field(default_factory=nullcontext)
    #: An outer guard on every machine step, asked under ``step_lock`` with the step and
    #: this controller's state: None allows it, a reason refuses it (IllegalTransition,
    #: nothing changed). A fleet's member guards: checked where the step is taken, so no
    #: other step can change what they read in between.
    guard: Callable[[str, GuardView], str | None] | None = None
    #: Called, under the controller's lock, after every change of its state or bindings
    #: (a fleet marks the member's view stale instead of re-reading every member per step).
    on_change: Callable[[], None] | None = None
    _last_seq: int = 0  # sequence number of the last accepted step

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._step_view = self._view()
        self._released = threading.Condition(self._lock)
        self._opened = threading.Condition(self._lock)  # notified when admissions reopen
        self._aborted: dict[str, Binding] = {}  # released as aborted, not yet let go by the app
        self._triggers = triggers_of(self.spec)
        self._admit_phases = self._triggers[Trigger.ADMIT].sources
        self._admit_when = self._triggers[Trigger.ADMIT].when
        self._admit_for: ControlState | None = None  # the state _admit_ok was computed for
        self._admit_ok = False
        self._release_phases = self._triggers[Trigger.RELEASE].sources
        self._abort_phases = self._triggers[Trigger.RELEASE_ABORTED].sources
        self._model = _Model()
        self._machine = self.machine_class(
            model=self._model,
            states=[p.value for p in Phase],
            initial=self.control.phase.value,
            auto_transitions=False,
            send_event=True,
            ignore_invalid_triggers=False,
        )
        for t in self._triggers.values():
            if t.name in HOT_PATH:
                continue
            for src in sorted(t.sources, key=list(Phase).index):
                self._machine.add_transition(
                    trigger=t.name,
                    source=src.value,
                    dest=t.dest.value if t.dest is not None else None,  # None: internal
                    conditions=[self._condition(t)],
                    before=[self._effect(t)],
                )

    # ------------------------------------------------------------------ generated parts

    def _view(self) -> GuardView:
        c = self.control
        bind = tuple(b.generation for b in self.bindings.values())
        return GuardView(c.phase, c.committed, c.target, c.pending, bind, c.cleared, c.evidence)

    # ``fire`` builds the guard view once per step; the condition and the effect run
    # against it (nothing changes between them: conditions run before callbacks).

    def _condition(self, t: TriggerSpec) -> Callable[[Any], bool]:
        def condition(event: Any) -> bool:
            return bool(t.when(self._step_view, event.kwargs.get("param")))

        return condition

    def _effect(self, t: TriggerSpec) -> Callable[[Any], None]:
        def effect(event: Any) -> None:
            updates = dict(t.control(self._step_view, event.kwargs.get("param")))
            # Bindings live beside the control state; the machine steps that write them
            # drop them all (t.frees), which _fire does once the step is journalled.
            updates.pop("bind", None)
            if t.dest is not None:
                updates["phase"] = t.dest
            rebuild: Callable[..., ControlState] = self.control._replace
            self.control = rebuild(**updates)

        return effect

    # ------------------------------------------------------------------------ facade

    @property
    def phase(self) -> Phase:
        return self.control.phase

    @property
    def triggers(self) -> Mapping[str, TriggerSpec]:
        return self._triggers

    def enabled(self, trigger: str, param: Any = None) -> str | None:
        """None if ``trigger`` is allowed now, else the reason it is not."""
        with self._lock:
            return self._refusal(trigger, param)

    def _refusal(self, trigger: str, param: Any, *, guard: bool = True) -> str | None:
        t = self._triggers.get(trigger)
        if t is None:
            return f"unknown step {trigger!r}"
        if self.control.phase not in t.sources:
            allowed = ", ".join(sorted(p.value for p in t.sources))
            return f"allowed only in {allowed}"
        if t.name == Trigger.ADMIT:
            if param in self.bindings:
                return f"rollout {param!r} is already bound"
            return None if self._admissible() else self._guard_refusal()
        if t.name in (Trigger.RELEASE, Trigger.RELEASE_ABORTED):
            return None if param in self.bindings else f"rollout {param!r} is not bound"
        if t.param == "tier" and param not in ("prefix", "encoder", "mm"):
            return f"unknown cache tier {param!r}"
        if t.param is None and param is not None:
            return f"{trigger} takes no parameter"
        if guard and not t.when(self._view(), param):
            return self._guard_refusal()
        return None

    def _guard_refusal(self) -> str:
        return f"its guard does not hold (pending={self.control.pending}, " \
                f"target={self.control.target}, evidence={sorted(self.control.evidence)}, " \
                f"cleared={sorted(self.control.cleared)}, bound={len(self.bindings)})"

    def fire(self, trigger: str, param: Any = None, detail: Mapping[str, Any] | None = None) -> (
        ControlState
    ):
        """Take one step; raise :class:`IllegalTransition` (changing nothing) if illegal."""
        if trigger in HOT_PATH:
            raise IllegalTransition(trigger, self.phase, "use admit()/release()/abort()")
        t = self._triggers.get(trigger)
        if t is not None and t.kind is Kind.RESTART:
            raise IllegalTransition(trigger, self.phase, "a restart is taken by restart()")
        return self._fire(trigger, param, detail)

    def restart(self, trigger: str, detail: Mapping[str, Any] | None = None) -> ControlState:
        """The controller restarted on its journal: take the restart step the spec allows
        (journal recovery chooses it). The crashed process's bindings are dropped."""
        t = self._triggers.get(trigger)
        if t is None or t.kind is not Kind.RESTART:
            raise IllegalTransition(trigger, self.phase, "not a restart step")
        # The journal says where the restart came from (the checker holds it to the
        # journal): the phase the controller was recovered in, unless the caller knows
        # better (a continuing segment: the last phase of the one it continues).
        out = self._fire(trigger, None, {"from_phase": self.phase.value, **(detail or {})})
        with self._lock:
            self.bindings = {}
            self._aborted.clear()
            self._released.notify_all()
            self._changed()
        return out

    def note(self, step: str, param: Any = None,
             detail: Mapping[str, Any] | None = None) -> ControlState:
        """Journal a step that changes no lifecycle state (a staging step: the staged
        spec decides it, :mod:`rolloutcore.engine.staging`), in order with the others."""
        with self.step_lock, self._lock:
            return self._emit(step, param, detail)

    def _fire(self, trigger: str, param: Any, detail: Mapping[str, Any] | None) -> ControlState:
        with self.step_lock, self._lock:
            reason = self._refusal(trigger, param, guard=False)
            if reason is not None:
                raise IllegalTransition(trigger, self.control.phase, reason)
            before = self.control
            self._step_view = self._view()
            if self.guard is not None:
                outer = self.guard(trigger, self._step_view)
                if outer is not None:
                    raise IllegalTransition(trigger, before.phase, outer)
            if not getattr(self._model, trigger)(param=param):  # the spec guard said no
                raise IllegalTransition(trigger, before.phase, self._guard_refusal())
            if self._model.state != self.control.phase.value:
                raise AssertionError(f"machine and facade disagree on {trigger}")
            try:
                out = self._emit(trigger, param, detail)
            except BaseException:
                # The journal did not take the step: undo it so memory never runs ahead.
                self.control = before
                self._machine.set_state(before.phase.value, model=self._model)
                raise
            if self._triggers[trigger].frees and self.bindings:
                # An audit found the engine is not the one verified: its rollouts ran on
                # it and are released as aborted (the application lets them go).
                for rid, b in self.bindings.items():
                    self._aborted[rid] = b._replace(aborted=True)
                self.bindings = {}
                self._released.notify_all()
            c = self.control
            if (c.phase, c.committed, c.evidence) != (before.phase, before.committed,
                                                      before.evidence):
                self._opened.notify_all()
            self._changed()
            return out

    def admit(self, rollout_id: str, detail: Mapping[str, Any] | None = None, *,
              wait: float = 0.0, min_generation: int = 0,
              cancel: threading.Event | None = None) -> Binding:
        """Bind a rollout to the committed generation (hot path).

        ``wait``: while admissions are closed (or the committed generation is below
        ``min_generation``, a staleness bound), wait up to that many seconds for them to
        reopen, woken by the step that reopens them; ``cancel`` ends the wait early.
        """
        with self._lock:
            if wait > 0 and not self._open_for(min_generation):
                self._wait_open(rollout_id, wait, min_generation, cancel)
            c = self.control
            bindings = self.bindings
            if c.phase not in self._admit_phases:
                raise IllegalTransition("admit", c.phase, "admissions are closed")
            if not self._admissible():
                raise IllegalTransition("admit", c.phase, "admissions wait for evidence (an "
                                        "audit failed or the engine was suspected: an audit "
                                        "must pass first)")
            if c.committed < min_generation:
                raise IllegalTransition("admit", c.phase, f"committed generation {c.committed} "
                                        f"is below the required {min_generation}")
            if rollout_id in bindings:
                raise IllegalTransition(
                    "admit", c.phase, f"rollout {rollout_id!r} is already bound")
            seq = self._last_seq + 1
            if self.trace is not None:  # journal first: a failed write changes nothing
                seq = self.trace(_new(TraceRecord, (seq, "admit", rollout_id, c.phase,
                                                    c.committed, c.target, c.pending,
                                                    detail))) or seq
            # tuple.__new__ skips NamedTuple's Python-level __new__: this is the hot path.
            binding = _new(Binding, (rollout_id, c.committed, self.identity, seq, False))
            bindings[rollout_id] = binding
            if self._aborted:  # an id reused after its abort: the old one is let go
                self._aborted.pop(rollout_id, None)
            self._last_seq = seq
            self._changed()
            return binding

    def _open_for(self, min_generation: int) -> bool:
        c = self.control
        return c.phase in self._admit_phases and c.committed >= min_generation \
            and self._admissible()

    def _admissible(self) -> bool:
        """The admit row's guard on the control state, for a free slot (bindings are
        checked by rollout id); cached per control state: this is the hot path."""
        c = self.control
        if c is not self._admit_for:
            self._admit_ok = bool(self._admit_when(GuardView(
                c.phase, c.committed, c.target, c.pending, (0,), c.cleared, c.evidence), 1))
            self._admit_for = c
        return self._admit_ok

    def _wait_open(self, rollout_id: str, wait: float, min_generation: int,
                   cancel: threading.Event | None) -> None:
        """Wait (lock held by the caller) until admissions are open for ``min_generation``;
        the cancel event is polled at a coarse interval: it is a caller's give-up signal."""
        deadline = time.monotonic() + wait
        while not self._open_for(min_generation):
            if cancel is not None and cancel.is_set():
                raise AdmissionCancelled("admit", self.control.phase,
                                         f"admission of {rollout_id!r} cancelled while waiting")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AdmissionTimeout("admit", self.control.phase, f"admissions stayed closed "
                                       f"for {wait:.3f} s (min generation {min_generation})")
            self._opened.wait(left if cancel is None else min(left, 0.05))

    def release(self, rollout_id: str, detail: Mapping[str, Any] | None = None) -> Binding:
        """Release a rollout's binding (hot path). A rollout already released as aborted by
        the drain is let go without another record (it never counts as finished)."""
        return self._unbind(Trigger.RELEASE, self._release_phases, rollout_id, detail)

    def abort(self, rollout_id: str, detail: Mapping[str, Any] | None = None) -> Binding:
        """Release a bound rollout as aborted (drain policy wait-then-abort)."""
        return self._unbind(Trigger.RELEASE_ABORTED, self._abort_phases, rollout_id, detail)

    def _unbind(self, step: str, phases: frozenset[Phase], rollout_id: str,
                detail: Mapping[str, Any] | None) -> Binding:
        with self._lock:
            c = self.control
            if step == Trigger.RELEASE and rollout_id not in self.bindings:
                aborted = self._aborted.pop(rollout_id, None)
                if aborted is not None:
                    return aborted
            if c.phase not in phases:
                raise IllegalTransition(step, c.phase, "no rollout can be released so now")
            binding = self.bindings.get(rollout_id)
            if binding is None:
                raise IllegalTransition(step, c.phase, f"rollout {rollout_id!r} is not bound")
            seq = self._last_seq + 1
            if self.trace is not None:  # journal first: a failed write changes nothing
                seq = self.trace(_new(TraceRecord, (seq, step, rollout_id, c.phase,
                                                    c.committed, c.target, c.pending,
                                                    detail))) or seq
            del self.bindings[rollout_id]
            if step == Trigger.RELEASE_ABORTED:
                binding = binding._replace(aborted=True)
                self._aborted[rollout_id] = binding
            self._last_seq = seq
            self._released.notify_all()
            self._changed()
            return binding

    def was_aborted(self, rollout_id: str) -> bool:
        with self._lock:
            return rollout_id in self._aborted

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def snapshot(self) -> GuardView:
        """The controller state and the generations of its bindings, read together under
        the controller's lock (a release on another thread cannot change them mid-read)."""
        with self._lock:
            return self._view()

    def bound_ids(self) -> list[str]:
        with self._lock:
            return list(self.bindings)

    def wait_drained(self, timeout: float) -> bool:
        """Block until no rollout is bound (woken by each release, no polling), or until
        ``timeout`` seconds pass. True if drained."""
        with self._released:
            return self._released.wait_for(lambda: not self.bindings, timeout=timeout)

    def bound_count(self) -> int:
        return len(self.bindings)

    @contextmanager
    def rollout(self, rollout_id: str, *, wait: float = 0.0) -> Iterator[Binding]:
        binding = self.admit(rollout_id, wait=wait)
        try:
            yield binding
        finally:
            self.release(rollout_id)

    def _emit(self, step: str, param: Any, detail: Mapping[str, Any] | None) -> ControlState:
        c = self.control
        seq = self._last_seq + 1
        if self.trace is not None:
            seq = self.trace(TraceRecord(seq, step, None if param is None else str(param),
                                         c.phase, c.committed, c.target, c.pending,
                                         detail)) or seq
        self._last_seq = seq
        return c

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def restore(self, control: ControlState, bindings: Mapping[str, int] = (
        {}
    ), *, next_seq: int | None = None) -> None:
        """Put the controller in a given state (recovery and test tours only)."""
        with self._lock:
            self.control = control
            self.bindings = {
                rid: Binding(rid, gen, self.identity, 0) for rid, gen in bindings.items()
            }
            self._machine.set_state(control.phase.value, model=self._model)
            if next_seq is not None:
                self._last_seq = next_seq - 1
            self._changed()


__all__ = ["AdmissionCancelled", "AdmissionTimeout", "Binding", "Controller", "IllegalTransition",
           "LockedMachine", "TraceRecord"]


def control_of(state: Any) -> ControlState:
    """The controller half of a spec state."""
    return ControlState(state.phase, state.committed, state.target, state.pending,
                        state.cleared, state.evidence)


def bindings_of(state: Any) -> dict[str, int]:
    """The bindings of a spec state, keyed by the rollout ids the tours use."""
    return {slot_id(i): g for i, g in enumerate(state.bind, start=1) if g != 0}


def slot_id(slot: int) -> str:
    return f"r{slot}"
