"""Hypothesis stateful testing generated from a spec: the rules are the spec's actions.

The model is the spec state; the implementation is the controller generated from the
same spec. After every step the spec's invariants are checked on the model, its action
properties on the step, and the controller must agree with the model's controller half.
Shared by the test suite and by users who want these properties in their own CI.
"""

from __future__ import annotations

from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from rolloutcore.engine.controller import (
    HOT_PATH,
    Controller,
    TraceBuffer,
    bindings_of,
    control_of,
    slot_id,
)
from rolloutcore.proof.explore import format_state
from rolloutcore.spec.lifecycle import TIERS, Action, Kind, Param, Spec, State
from rolloutcore.spec.triggers import Trigger


def machine_for(spec: Spec) -> type[RuleBasedStateMachine]:
    """A RuleBasedStateMachine class for ``spec`` (a fresh class per spec)."""
    successors: dict[State, list[tuple[Action, Param, State]]] = {}

    def succ(s: State) -> list[tuple[Action, Param, State]]:
        out = successors.get(s)
        if out is None:
            out = successors[s] = spec.successors(s)
        return out

    class Lifecycle(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.model = spec.initial_states()[0]
            self.ctl = Controller(spec=spec, trace=TraceBuffer())

        @initialize(data=st.data())
        def start(self, data: Any) -> None:
            """Any initial state of the spec (the fresh engine may hold other weights)."""
            self.model = data.draw(st.sampled_from(spec.initial_states()), label="init")

        def take(self, action: Action, data: Any) -> None:
            options = [(p, t) for a, p, t in succ(self.model) if a.name == action.name]
            param, nxt = options[0] if len(options) == 1 else data.draw(
                st.sampled_from(options), label=action.name)
            note(f"{action.name}({param})" if param is not None else action.name)
            for prop in spec.action_properties:
                assert prop.holds(self.model, nxt), (
                    f"action property {prop.name} violated by {action.name}:\n"
                    f"  {format_state(self.model)}\n  -> {format_state(nxt)}")
            trigger = action.trigger
            if trigger == Trigger.ADMIT:
                self.ctl.admit(slot_id(int(param)))
            elif trigger == Trigger.RELEASE:
                self.ctl.release(slot_id(int(param)))
            elif trigger == Trigger.RELEASE_ABORTED:
                self.ctl.abort(slot_id(int(param)))
            elif action.kind is Kind.RESTART:
                self.ctl.restart(trigger or action.name)
            elif trigger is not None:
                self.ctl.fire(trigger, param)
            self.model = nxt
            assert self.ctl.control == control_of(nxt), "controller and model disagree"
            assert {k: b.generation for k, b in self.ctl.bindings.items()} == bindings_of(nxt)

        @precondition(lambda self: not succ(self.model))
        @rule()
        def terminal(self) -> None:
            """Nothing is enabled (TAINTED): the controller must refuse every step."""
            for trigger, t in self.ctl.triggers.items():
                if trigger == Trigger.ADMIT:
                    assert self.ctl.enabled(trigger, "fresh") is not None
                elif trigger not in HOT_PATH and t.kind is not Kind.RESTART:
                    for p in (None, *TIERS):
                        assert self.ctl.enabled(trigger, p) is not None, trigger

        @invariant()
        def spec_invariants(self) -> None:
            for inv in spec.invariants:
                assert inv.holds(self.model), (
                    f"invariant {inv.name} violated: {format_state(self.model)}")

    def step(self: Lifecycle, data: Any) -> None:
        # One rule drawing among the enabled spec actions: Hypothesis draws a single
        # index per step instead of filtering dozens of precondition-guarded rules.
        options = succ(self.model)
        # Half the draws prefer fault-free actions, so that long fault-free stretches
        # (a whole update cycle) are common; every action stays reachable.
        calm = [o for o in options if not o[0].fault]
        choice = st.sampled_from(options)
        if calm and len(calm) < len(options):
            choice = st.one_of(st.sampled_from(calm), choice)
        action, _p, _t = data.draw(choice, label="action")
        self.take(action, data)

    Lifecycle.step = precondition(lambda self: bool(succ(self.model)))(
        rule(data=st.data())(step))
    Lifecycle.__name__ = Lifecycle.__qualname__ = f"Lifecycle_{spec.name}"
    return Lifecycle
