"""The failover spec: explored exhaustively, its TLA+ graph equal to the explorer's, every
failover mutant caught by both, and the lease's promise as the one property that rests on
its timing (fencing keeps the rest with the lease broken)."""

from __future__ import annotations

import functools

import pytest
from conftest import require_tlc

from rolloutcore.proof import modelcheck
from rolloutcore.spec.failover import (
    FAILOVER,
    FoBounds,
    FoExploration,
    FoState,
    accepts,
    explore_failover,
)
from rolloutcore.spec.mutants import FAILOVER_MUTANTS, FailoverMutant

ONE_ELECTION = FoBounds(epochs=1)


@functools.cache
def explored(bounds: FoBounds = FAILOVER.bounds) -> FoExploration:
    return explore_failover(FAILOVER.with_bounds(bounds))


def test_every_failover_property_holds_and_every_action_fires() -> None:
    ex = explored()
    assert ex.violations == {}
    assert ex.unreachable == ()


def test_one_election_never_fences_out_anyone() -> None:
    """With a single epoch nobody is ever deposed by a fence: the refusal needs a takeover."""
    ex = explored(ONE_ELECTION)
    assert ex.violations == {}
    assert "fence_refused" in ex.unreachable


def _reached(ex: FoExploration, pred: object) -> list[FoState]:
    return [f for f in ex.nodes if pred(f)]  # type: ignore[operator]


def test_a_zombie_and_a_new_leader_coexist_and_stale_mutations_are_refused() -> None:
    """The hazard the spec is about is reachable: a thawed zombie with a mutation of its
    epoch on the wire while a newer epoch serves the engine; and the refusal is too (a
    delivered stale mutation changes nothing)."""
    ex = explored()
    assert _reached(ex, lambda f: any(k.zombie for k in f.ctl) and f.leader != 0)
    stale_refused = [
        (f, g) for f, name, g in ex.graph if name == "deliver"
        and any(m[0] == "mutate" and not accepts(m[1], f.eng[m[2] - 1].seen)
                for m in f.net - g.net)]
    assert stale_refused
    assert all(f.eng == g.eng for f, g in stale_refused)


def test_the_journal_is_appended_only_under_the_live_key() -> None:
    ex = explored()
    for f, _name, g in ex.graph:
        if g.jrn != f.jrn:
            assert f.leader != 0 and g.jrn.epoch == f.lepoch >= f.jrn.epoch


def test_fence_gate_is_the_spec_rule() -> None:
    assert accepts(3, 3) and accepts(4, 3) and not accepts(2, 3)


@pytest.mark.tlc
@pytest.mark.parametrize("bounds", [ONE_ELECTION, pytest.param(FAILOVER.bounds,
                                                                 marks=pytest.mark.deep)],
                         ids=["one", "default"])
def test_tlc_graph_equals_the_explorer_graph(bounds: FoBounds) -> None:
    require_tlc()
    run = modelcheck.run_failover_tlc(FAILOVER.with_bounds(bounds), exploration=explored(bounds))
    assert run.result.exit_code == 0, run.result.error_message
    assert run.graphs_equal, (run.only_python, run.only_tlc)
    assert run.tlc_states == run.python_states and run.tlc_edges == run.python_edges


@pytest.mark.parametrize("m", FAILOVER_MUTANTS, ids=lambda m: m.name)
def test_the_explorer_catches_failover_mutant(m: FailoverMutant) -> None:
    v = modelcheck.check_failover_mutant(m, with_tlc=False)
    assert v.explorer, f"the explorer missed {m.name}"


@pytest.mark.tlc
@pytest.mark.deep
@pytest.mark.parametrize("m", FAILOVER_MUTANTS, ids=lambda m: m.name)
def test_explorer_and_tlc_catch_failover_mutant(m: FailoverMutant) -> None:
    require_tlc()
    v = modelcheck.check_failover_mutant(m, with_tlc=True)
    assert v.explorer, f"the explorer missed {m.name}"
    assert v.tlc_violated is not None, f"TLC missed {m.name}"
    assert v.tlc_violated in v.explorer
    assert v.tlc_trace_length == min(v.explorer.values()), (v.tlc_trace_length, v.explorer)


@pytest.mark.deep
@pytest.mark.parametrize("name", ["takeover_before_lease_expired", "leader_never_renews"])
def test_with_the_lease_broken_only_the_lease_property_fails(name: str) -> None:
    """Two controllers act at once, each believing it leads (a takeover before the old
    lease expired, or a leader that stopped renewing): the journal's compare and the
    engines' fences keep every other property, so safety does not rest on the lease's
    timing."""
    m = next(m for m in FAILOVER_MUTANTS if m.name == name)
    ex = explore_failover(m.apply(FAILOVER))
    assert set(ex.violations) == {"LeaseHeldWhileActing"}
