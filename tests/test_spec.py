"""The spec explored exhaustively: every invariant, every action, terminal states."""

from __future__ import annotations

import pytest

from rolloutcore.explore import Exploration, explore
from rolloutcore.spec.lifecycle import (
    ACTIONS,
    MIXED,
    SPEC,
    TIERS,
    Bounds,
    Kind,
    Phase,
    initial_state,
)
from rolloutcore.spec.mutants import mutant


def test_default_bounds_hold_every_property(exploration: Exploration) -> None:
    assert exploration.violations == {}
    assert exploration.unreachable_actions == ()
    assert exploration.states > 1000 and exploration.edges > exploration.states


@pytest.mark.parametrize("bounds", [Bounds(1, 2, 0), Bounds(3, 3, 1), Bounds(2, 4, 3)])
def test_other_bounds_hold(bounds: Bounds) -> None:
    ex = explore(SPEC.with_bounds(bounds))
    assert ex.violations == {}


def test_terminal_states_are_only_tainted(exploration: Exploration) -> None:
    terminal = [s for s in exploration.graph.nodes if exploration.graph.out_degree(s) == 0]
    assert terminal, "TAINTED must be reachable and absorbing"
    assert {s.phase for s in terminal} == {Phase.TAINTED}


def test_tainted_never_leaves(exploration: Exploration) -> None:
    for u, v in exploration.graph.edges():
        if u.phase is Phase.TAINTED:
            assert v.phase is Phase.TAINTED


def test_every_phase_reachable(exploration: Exploration) -> None:
    assert {s.phase for s in exploration.graph.nodes} == set(Phase)


def test_ambiguous_mutation_covers_old_new_and_mixed(exploration: Exploration) -> None:
    after = {v.weights for u, v, k in exploration.graph.edges(keys=True)
             if k[0] == "mutate_ambiguous"}
    assert {1, 2, MIXED} <= after


def test_drain_waits_for_engine_side_orphans(exploration: Exploration) -> None:
    """The race of the seed: the binding is released while the engine still runs the
    request. pause_ok must not be reachable until the engine has finished it."""
    orphan_pauses = [u for u, v, k in exploration.graph.edges(keys=True)
                     if k[0] == "pause_ok" and any(u.req)]
    assert orphan_pauses == []
    orphans = [s for s in exploration.graph.nodes
               if s.phase is Phase.DRAINING and s.pending == "pause" and any(s.req)]
    assert orphans, "the model must reach a pending pause while an orphan still runs"


def test_counterexample_is_shortest() -> None:
    """BFS: the admit_outside_ready mutant is violated 4 steps in (bootstrap 2, request, admit)."""
    ex = explore(mutant("admit_outside_ready").apply(SPEC))
    cex = ex.shortest_counterexample()
    assert cex is not None
    assert [s.label() for s in cex.trace] == [
        "init", "bootstrap_begin", "bootstrap_ok", "request_update", "admit(1)"]


def test_successors_respect_declared_writes() -> None:
    """Every action writes only the variables its TLA+ text declares (UNCHANGED is right)."""
    ex = explore(SPEC)
    by_name = {a.name: a for a in ACTIONS}
    for u, v, (name, _p) in ex.graph.edges(keys=True):
        changed = {f for f in u._fields if getattr(u, f) != getattr(v, f)}
        assert changed <= by_name[name].writes, (name, changed)


def test_bad_bounds_rejected() -> None:
    with pytest.raises(ValueError):
        Bounds(0, 3, 1)


def test_initial_state_is_fresh_engine() -> None:
    s = initial_state(Bounds())
    assert s.phase is Phase.UNINITIALIZED and s.weights == 1 and not s.paused
    assert s.caches == tuple(frozenset() for _ in TIERS)


def test_environment_actions_are_invisible() -> None:
    env = [a for a in ACTIONS if a.kind is Kind.ENVIRONMENT]
    assert env and all(a.trigger is None for a in env)
    assert all(not a.control_tla for a in env)
