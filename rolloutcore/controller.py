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
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from transitions import Machine
from transitions.extensions import LockedMachine

from rolloutcore.spec.lifecycle import NO_OP, SPEC, Action, Phase, Spec


class IllegalTransition(Exception):
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


TraceSink = Callable[[TraceRecord], None]
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
        out[name] = TriggerSpec(
            name, tuple(acts), first.sources, first.dest, first.param, first.when, first.control
        )
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
    _last_seq: int = 0  # sequence number of the last accepted step

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._step_view = self._view()
        self._released = threading.Condition(self._lock)
        self._triggers = triggers_of(self.spec)
        admit = self._triggers["admit"]
        release = self._triggers["release"]
        self._admit_phases = admit.sources
        self._release_phases = release.sources
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
            if t.name in ("admit", "release"):
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
        if t.name == "admit":
            return f"rollout {param!r} is already bound" if param in self.bindings else None
        if t.name == "release":
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
        if trigger in ("admit", "release"):
            raise IllegalTransition(trigger, self.phase, "use admit()/release()")
        with self._lock:
            reason = self._refusal(trigger, param, guard=False)
            if reason is not None:
                raise IllegalTransition(trigger, self.control.phase, reason)
            before = self.control
            self._step_view = self._view()
            if not getattr(self._model, trigger)(param=param):  # the spec guard said no
                raise IllegalTransition(trigger, before.phase, self._guard_refusal())
            if self._model.state != self.control.phase.value:
                raise AssertionError(f"machine and facade disagree on {trigger}")
            try:
                return self._emit(trigger, param, detail)
            except BaseException:
                # The journal did not take the step: undo it so memory never runs ahead.
                self.control = before
                self._machine.set_state(before.phase.value, model=self._model)
                raise

    def admit(self, rollout_id: str, detail: Mapping[str, Any] | None = None) -> Binding:
        """Bind a rollout to the committed generation (hot path)."""
        with self._lock:
            c = self.control
            bindings = self.bindings
            if c.phase not in self._admit_phases:
                raise IllegalTransition("admit", c.phase, "admissions are closed")
            if rollout_id in bindings:
                raise IllegalTransition(
                    "admit", c.phase, f"rollout {rollout_id!r} is already bound")
            seq = self._last_seq + 1
            # tuple.__new__ skips NamedTuple's Python-level __new__: this is the hot path.
            binding = _new(Binding, (rollout_id, c.committed, self.identity, seq))
            if self.trace is not None:  # journal first: a failed write changes nothing
                self.trace(_new(TraceRecord, (seq, "admit", rollout_id, c.phase, c.committed,
                                              c.target, c.pending, detail)))
            bindings[rollout_id] = binding
            self._last_seq = seq
            return binding

    def release(self, rollout_id: str, detail: Mapping[str, Any] | None = None) -> Binding:
        """Release a rollout's binding (hot path)."""
        with self._lock:
            c = self.control
            if c.phase not in self._release_phases:
                raise IllegalTransition("release", c.phase, "no rollout can be bound now")
            binding = self.bindings.get(rollout_id)
            if binding is None:
                raise IllegalTransition("release", c.phase, f"rollout {rollout_id!r} is not bound")
            seq = self._last_seq + 1
            if self.trace is not None:  # journal first: a failed write changes nothing
                self.trace(_new(TraceRecord, (seq, "release", rollout_id, c.phase, c.committed,
                                              c.target, c.pending, detail)))
            del self.bindings[rollout_id]
            self._last_seq = seq
            self._released.notify_all()
            return binding

    def wait_drained(self, timeout: float) -> bool:
        """Block until no rollout is bound (woken by each release, no polling), or until
        ``timeout`` seconds pass. True if drained."""
        with self._released:
            return self._released.wait_for(lambda: not self.bindings, timeout=timeout)

    def bound_count(self) -> int:
        return len(self.bindings)

    @contextmanager
    def rollout(self, rollout_id: str) -> Iterator[Binding]:
        binding = self.admit(rollout_id)
        try:
            yield binding
        finally:
            self.release(rollout_id)

    def _emit(self, step: str, param: Any, detail: Mapping[str, Any] | None) -> ControlState:
        c = self.control
        seq = self._last_seq + 1
        if self.trace is not None:
            self.trace(TraceRecord(seq, step, None if param is None else str(param),
                                   c.phase, c.committed, c.target, c.pending, detail))
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


__all__ = ["Binding", "Controller", "IllegalTransition", "LockedMachine", "TraceRecord"]


def control_of(state: Any) -> ControlState:
    """The controller half of a spec state."""
    return ControlState(state.phase, state.committed, state.target, state.pending,
                        state.cleared, state.evidence)


def bindings_of(state: Any) -> dict[str, int]:
    """The bindings of a spec state, keyed by the rollout ids the tours use."""
    return {slot_id(i): g for i, g in enumerate(state.bind, start=1) if g != 0}


def slot_id(slot: int) -> str:
    return f"r{slot}"
