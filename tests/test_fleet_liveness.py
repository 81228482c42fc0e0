"""Liveness of the fleet (spec.fleet.FLEET_LIVENESS): its controller opens it, every fleet
update ends, a recovery ends, a quarantined member is fenced and re-admitted, the floor
rises, under the fleet's fairness
(FLEET_FAIRNESS, FleetSpec.member_fairness) in behaviours where the operator's steps are
finitely many. Checked by the explorer's fair-cycle search at the default, rolling and
crash bounds, and by TLC at the rolling bounds and a smaller one (make test), with equal
verdicts. Each fleet liveness mutant
passes every safety check and breaks its property, for both checkers; every lasso replays
in the fleet model. Negative controls: drop the operator assumption, or the strength of
the fairness, and the explorer finds the fleet waiting for ever."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import require_tlc

from rolloutcore.proof.explore import Lasso, check_fleet_liveness
from rolloutcore.proof.modelcheck import check_fleet_liveness_both, tlc_fleet_liveness
from rolloutcore.spec.fleet import (
    FLEET,
    LEAVE_STEPS,
    OPERATOR_STEPS,
    WATCHDOG_READMITS,
    FleetBounds,
    FleetSpec,
    explore_fleet,
)
from rolloutcore.spec.mutants import (
    FLEET_LIVENESS_MUTANTS,
    LIVENESS_FAULT,
    LIVENESS_HELD,
    LIVENESS_ROLLING,
    LIVENESS_ROLLING_FAULT,
    LIVENESS_WIDE,
    ROLLING,
    ROLLING_CRASH,
)

PROPERTIES = ["FleetOpens", "FleetUpdateEnds", "RecoveryEnds", "MemberTaintedIsFenced",
              "QuarantineEnds", "FloorRises"]
MUTANTS = {m.name: (m, prop) for m, prop in FLEET_LIVENESS_MUTANTS}


def replays(spec: FleetSpec, lasso: Lasso) -> bool:
    """Every step of the lasso is a successor in ``spec`` (a member action's label names
    its member) and its cycle comes back."""
    state = lasso.prefix[0].state
    if state not in spec.initial_states():
        return False
    for step in (*lasso.prefix[1:], *lasso.cycle):
        name = step.action.split("@", 1)[0]
        if (name, step.param, step.state) not in spec.successors(state):  # type: ignore[arg-type]
            return False
        state = step.state  # type: ignore[assignment]
    return not lasso.cycle or state == lasso.prefix[-1].state


def lassos(spec: FleetSpec) -> dict[str, Lasso | None]:
    ex = explore_fleet(spec, keep_steps=True)
    assert ex.violations == {}, ex.violations
    return check_fleet_liveness(spec, ex)


@pytest.mark.parametrize("bounds", [
    pytest.param(FLEET.bounds, marks=pytest.mark.deep, id="strict"),
    pytest.param(ROLLING, id="rolling"),
    pytest.param(ROLLING_CRASH, id="rolling-crash"),
    pytest.param(LIVENESS_WIDE, marks=pytest.mark.deep, id="wide")])
def test_every_fleet_liveness_property_holds(bounds: FleetBounds) -> None:
    assert [lp.name for lp in FLEET.liveness] == PROPERTIES
    assert lassos(FLEET.with_bounds(bounds)) == dict.fromkeys(PROPERTIES)


#: Mutants at bounds whose exploration is slow (tens of thousands of states with a fault):
#: in ``make test`` only.
SLOW = frozenset({"floor_waits_for_every_member"})


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.deep) if n in SLOW else n
                                  for n in sorted(MUTANTS)])
def test_a_fleet_liveness_mutant_passes_every_safety_check_and_fails_its_property(
        name: str) -> None:
    mutant, prop = MUTANTS[name]
    spec = mutant.apply(FLEET).with_bounds(mutant.bounds)
    found = lassos(spec)  # no safety violation: asserted there
    lasso = found[prop]
    assert lasso is not None, f"{name}: {prop} holds"
    assert replays(spec, lasso), lasso.describe()
    assert [p for p, v in found.items() if v is not None] == [prop]


def test_a_lasso_that_leaves_the_model_is_caught_by_the_replay() -> None:
    mutant, prop = MUTANTS["wave_waits_on_itself"]
    spec = mutant.apply(FLEET).with_bounds(mutant.bounds)
    lasso = lassos(spec)[prop]
    assert lasso is not None and replays(spec, lasso)
    broken = Lasso(lasso.prop, (*lasso.prefix[:-1], lasso.prefix[1]), lasso.cycle)
    assert not replays(spec, broken)


def test_with_the_operator_unbounded_a_rolling_wave_can_wait_for_ever() -> None:
    """Negative control for the stated assumption: if audits may come for ever, audits
    that overlap (one in flight at every moment) hold a wave's decision for ever."""
    spec = replace(FLEET.with_bounds(ROLLING), finite=frozenset())
    lasso = lassos(spec)["FleetUpdateEnds"]
    assert lasso is not None and replays(spec, lasso)
    assert any(s.action.startswith("audit_begin@") for s in lasso.cycle), lasso.describe()


def test_an_update_that_asks_a_member_again_hides_a_wedge() -> None:
    """Negative control for FleetSpec.asks_once: if an update may ask a member again after
    it cancelled, the model re-asks the held-back member and drains it at last, and the
    update that waits on it (the fleet that wedged) passes; asked once, as the runtime
    asks, it is caught."""
    mutant, prop = MUTANTS["update_waits_on_held_back"]
    spec = mutant.apply(FLEET).with_bounds(mutant.bounds)
    assert spec.bounds == LIVENESS_HELD and lassos(spec)[prop] is not None
    assert lassos(replace(spec, asks_once=False))[prop] is None


@pytest.mark.deep  # three members: make test
def test_with_members_leaving_for_ever_the_floor_can_wait_for_ever() -> None:
    """Negative control for LEAVE_STEPS: if a member may cancel (or abandon after a
    refusal) every catch-up for ever with nothing bound, the floor never rises: members
    that are not healthy hold it, as the property's assumption says."""
    spec = replace(FLEET.with_bounds(LIVENESS_WIDE), finite=OPERATOR_STEPS)
    lasso = lassos(spec)["FloorRises"]
    assert lasso is not None and replays(spec, lasso)
    assert any(s.action.split("@")[0] in LEAVE_STEPS for s in lasso.cycle), lasso.describe()


def test_fairness_is_weak_and_needed() -> None:
    """Weak fairness is enough for all but the watchdog's re-admission (below), and some
    is needed: with the fleet's decisions not fair, an update whose members all validated
    waits for ever."""
    spec = FLEET.with_bounds(ROLLING)
    assert [f.name for f in (*spec.fairness, *spec.member_fairness) if f.strong] == [
        WATCHDOG_READMITS.name]
    unfair = replace(spec, fairness=())
    lasso = lassos(unfair)["FleetUpdateEnds"]
    assert lasso is not None and replays(unfair, lasso)
    assert lasso.cycle == (), lasso.describe()  # it stutters with a decision enabled


@pytest.mark.deep
def test_a_weakly_fair_watchdog_is_starved_by_back_to_back_waves() -> None:
    """Negative control for WatchdogReadmits' strength: the trainer's waves shut
    re-admission out (readmit_begin's fleet guard), so a watchdog that is only weakly fair
    may find it possible between every two waves and never take it. The runtime lets a
    due re-admission go before the next update (Fleet.readmit_quarantined)."""
    spec = replace(FLEET, watchdog=(replace(WATCHDOG_READMITS, strong=False),)
                   ).with_bounds(LIVENESS_ROLLING_FAULT)
    lasso = lassos(spec)["QuarantineEnds"]
    assert lasso is not None and replays(spec, lasso)
    assert any(s.action == "fleet_roll" for s in lasso.cycle), lasso.describe()


@pytest.mark.deep  # two explorations with a fault: make test
def test_a_watchdog_that_readmits_unfenced_members_hides_a_fence_that_never_comes() -> None:
    """Negative control for WatchdogReadmits' condition (fenced only): a watchdog that
    re-admits any quarantined member takes it out of TAINTED without its fence, and the
    fleet that never fences passes MemberTaintedIsFenced."""
    mutant, prop = MUTANTS["quarantine_never_fenced"]
    assert mutant.bounds == LIVENESS_FAULT
    eager = replace(FLEET, watchdog=(replace(WATCHDOG_READMITS, when=None, when_tla=""),))
    assert lassos(mutant.apply(FLEET).with_bounds(LIVENESS_FAULT))[prop] is not None
    assert lassos(mutant.apply(eager).with_bounds(LIVENESS_FAULT))[prop] is None


@pytest.mark.parametrize("bounds", [
    pytest.param(LIVENESS_ROLLING, marks=pytest.mark.deep, id="small"),
    pytest.param(ROLLING, marks=pytest.mark.deep, id="rolling")])
def test_tlc_agrees_on_every_fleet_liveness_property(bounds: FleetBounds) -> None:
    require_tlc()
    verdicts = check_fleet_liveness_both(FLEET.with_bounds(bounds), timeout_s=300)
    assert [v.prop for v in verdicts] == PROPERTIES
    assert all(v.agree and v.explorer_holds and v.tlc_holds for v in verdicts), [
        v.as_json() for v in verdicts]


@pytest.mark.deep
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_tlc_catches_every_fleet_liveness_mutant(name: str) -> None:
    require_tlc()
    mutant, prop = MUTANTS[name]
    result = tlc_fleet_liveness(mutant.apply(FLEET).with_bounds(mutant.bounds), prop,
                                timeout_s=300)
    assert result.violation == "property", (name, result.violation, result.error_message)
