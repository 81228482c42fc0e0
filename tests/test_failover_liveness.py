"""Liveness of controller failover (spec.failover.FO_LIVENESS): a key whose holder died
is freed, a leader is elected while elections remain, a deposed controller stands down;
under the failover fairness (each controller's own steps, its lease clock, thawing;
leases expire; each epoch's effects land), however often controllers freeze and crash.
The explorer checks them at the default bounds and TLC agrees at small
ones; each failover liveness mutant passes every safety check and breaks its property,
for both checkers. Negative control: without its lease clock's own fairness, a zombie
never stands down."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import require_tlc

from rolloutcore.proof.explore import check_failover_liveness
from rolloutcore.proof.modelcheck import check_failover_liveness_both, tlc_failover_liveness
from rolloutcore.spec.failover import FAILOVER, FailoverSpec, explore_failover
from rolloutcore.spec.mutants import FAILOVER_LIVENESS_MUTANTS, LIVENESS_FAILOVER

PROPERTIES = ["KeyFreedWhenHolderStops", "LeaderElected", "DeposedStandsDown"]
MUTANTS = {m.name: (m, prop) for m, prop in FAILOVER_LIVENESS_MUTANTS}


def lassos(spec: FailoverSpec) -> dict[str, object]:
    ex = explore_failover(spec, keep_steps=True)
    assert ex.violations == {}, ex.violations
    return dict(check_failover_liveness(spec, ex))


@pytest.mark.parametrize("bounds", [
    pytest.param(FAILOVER.bounds, marks=pytest.mark.deep, id="default"),
    pytest.param(LIVENESS_FAILOVER, id="small")])
def test_every_failover_liveness_property_holds(bounds: object) -> None:
    assert [lp.name for lp in FAILOVER.liveness] == PROPERTIES
    assert lassos(FAILOVER.with_bounds(bounds)) == dict.fromkeys(PROPERTIES)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_a_failover_liveness_mutant_passes_every_safety_check_and_fails_its_property(
        name: str) -> None:
    mutant, prop = MUTANTS[name]
    found = lassos(mutant.apply(FAILOVER.with_bounds(LIVENESS_FAILOVER)))
    assert [p for p, v in found.items() if v is not None] == [prop], found


def test_with_the_lease_clock_one_of_many_steps_a_zombie_may_never_stand_down() -> None:
    """Negative control for the lease clock's own class: folded into the controller's
    other steps, a zombie that keeps verifying and resuming (none of them an append)
    takes those for ever and never finds out it was deposed."""
    spec = FAILOVER.with_bounds(LIVENESS_FAILOVER)
    moves, clock, *rest = spec.controller_fairness
    merged = replace(moves, actions=moves.actions | clock.actions)
    found = lassos(replace(spec, controller_fairness=(merged, *rest)))
    assert found["DeposedStandsDown"] is not None


@pytest.mark.deep
def test_tlc_agrees_on_every_failover_liveness_property() -> None:
    require_tlc()
    verdicts = check_failover_liveness_both(FAILOVER.with_bounds(LIVENESS_FAILOVER),
                                            timeout_s=300)
    assert [v.prop for v in verdicts] == PROPERTIES
    assert all(v.agree and v.explorer_holds and v.tlc_holds for v in verdicts), [
        v.as_json() for v in verdicts]


@pytest.mark.deep
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_tlc_catches_every_failover_liveness_mutant(name: str) -> None:
    require_tlc()
    mutant, prop = MUTANTS[name]
    result = tlc_failover_liveness(mutant.apply(FAILOVER.with_bounds(LIVENESS_FAILOVER)),
                                   prop, timeout_s=300)
    assert result.violation == "property", (name, result.violation, result.error_message)
