"""Negative controls: every broken spec variant is caught by the explorer and by TLC."""

from __future__ import annotations

from itertools import pairwise

import pytest
from conftest import require_tlc

from rolloutcore.proof import modelcheck
from rolloutcore.proof.explore import explore
from rolloutcore.spec.lifecycle import SPEC, Param, Spec, State
from rolloutcore.spec.mutants import MUTANTS, Mutant


def test_every_mutant_is_named_once_and_changes_the_spec() -> None:
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    for m in MUTANTS:
        changed = [a.name for a, b in zip(m.apply(SPEC).actions, SPEC.actions, strict=True)
                   if a != b]
        assert changed, f"{m.name} leaves the spec as it is"


def _moves(spec: Spec, s: State) -> set[tuple[str, Param, State]]:
    return {(a.name, p, t) for a, p, t in spec.successors(s)}


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.name)
def test_explorer_catches(m: Mutant) -> None:
    spec = m.apply(SPEC)
    ex = explore(spec, stop_at_violation=True)
    cex = ex.shortest_counterexample()
    assert cex is not None, f"{m.name} was not caught"
    # A run of the mutant from an initial state, which the real spec cannot take whole ...
    assert cex.trace[0].action == "init" and cex.trace[0].state in spec.initial_states()
    outside_spec = 0
    for prev, step in pairwise(cex.trace):
        assert (step.action, step.param, step.state) in _moves(spec, prev.state), step.label()
        outside_spec += (step.action, step.param, step.state) not in _moves(SPEC, prev.state)
    assert outside_spec, f"the real spec takes every step of {cex.describe()}"
    # ... that ends where the property it names really fails.
    last = cex.trace[-1].state
    if cex.kind == "invariant":
        assert not next(i for i in spec.invariants if i.name == cex.prop).holds(last)
    elif cex.kind == "action property":
        prop = next(p for p in spec.action_properties if p.name == cex.prop)
        assert not prop.holds(cex.trace[-2].state, last)
    else:
        assert cex.kind == "deadlock" and not spec.successors(last), cex.describe()


#: Mutants whose full exploration is cheap (a few seconds each), for the test below.
EARLY_STOP_CHECKED = ("publish_before_validation", "retry_collective", "unverified_reset_counts")


@pytest.mark.parametrize("name", [EARLY_STOP_CHECKED[0], *(
    pytest.param(n, marks=pytest.mark.deep) for n in EARLY_STOP_CHECKED[1:])])
def test_stopping_at_the_first_violation_finds_the_shortest_counterexample(name: str) -> None:
    """The early stop the tests above use loses nothing: the same property, as short, as
    the exhaustive search finds (and a partial graph says that it is partial)."""
    spec = next(m for m in MUTANTS if m.name == name).apply(SPEC)
    full, early = explore(spec), explore(spec, stop_at_violation=True)
    assert full.complete and not early.complete and early.states < full.states
    f, e = full.shortest_counterexample(), early.shortest_counterexample()
    assert f is not None and e is not None
    assert (e.prop, len(e.trace)) == (f.prop, len(f.trace))


@pytest.mark.tlc
@pytest.mark.deep
def test_tlc_catches_every_mutant() -> None:
    require_tlc()
    verdicts = modelcheck.check_mutants(with_tlc=True)
    assert [v.mutant.name for v in verdicts] == [m.name for m in MUTANTS]
    missed = [v.mutant.name for v in verdicts if not v.caught]
    assert missed == []
    for v in verdicts:
        assert v.tlc_violated is not None and v.tlc_trace_length
        assert v.explorer is not None
        # Both checkers search breadth first: the shortest counterexamples agree in length.
        assert v.tlc_trace_length == len(v.explorer.trace) - 1, v.mutant.name
