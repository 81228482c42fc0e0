"""Liveness in the proof chain: the engine spec's liveness properties (spec.lifecycle.
LIVENESS) hold under its fairness assumptions, by the explorer's fair-cycle search and by
TLC under the generated FairSpec, with equal verdicts; each liveness mutant breaks its
property and no safety property (the negative control: only a liveness check catches
it), and is caught by both; every lasso the explorer prints replays in the model."""

from __future__ import annotations

import pytest
from conftest import require_tlc

from rolloutcore.proof.explore import Exploration, Lasso, check_liveness, explore
from rolloutcore.proof.modelcheck import check_liveness_both, tlc_liveness
from rolloutcore.spec.lifecycle import SPEC, Spec
from rolloutcore.spec.mutants import LIVENESS_MUTANTS

MUTANTS = {m.name: (m, prop) for m, prop in LIVENESS_MUTANTS}


def replays(spec: Spec, lasso: Lasso) -> bool:
    """Every step of the lasso is a transition of ``spec`` and its cycle comes back."""
    states = [lasso.prefix[0].state]
    if lasso.prefix[0].state not in spec.initial_states():
        return False
    for step in (*lasso.prefix[1:], *lasso.cycle):
        if step.state not in spec.step(spec.action(step.action), states[-1], step.param):
            return False
        states.append(step.state)
    return not lasso.cycle or states[-1] == lasso.prefix[-1].state


def test_the_liveness_properties_hold_by_the_explorer(exploration: Exploration) -> None:
    assert {p.name for p in SPEC.liveness} == {"UpdateEnds", "TaintedIsFenced", "ReadmitServes"}
    assert check_liveness(exploration) == dict.fromkeys(
        ["UpdateEnds", "TaintedIsFenced", "ReadmitServes"])


@pytest.mark.deep  # make test; make check keeps the explorer's verdicts (make check was 324 s)
def test_tlc_agrees_on_every_liveness_property(exploration: Exploration) -> None:
    require_tlc()
    verdicts = check_liveness_both(SPEC, exploration=exploration, timeout_s=300)
    assert all(v.agree and v.explorer_holds and v.tlc_holds for v in verdicts), [
        v.as_json() for v in verdicts]


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_a_liveness_mutant_passes_every_safety_check_and_fails_its_property(
        name: str) -> None:
    mutant, prop = MUTANTS[name]
    spec = mutant.apply(SPEC)
    ex = explore(spec)
    assert ex.violations == {}, ex.violations  # no safety check can catch it
    lassos = check_liveness(ex)
    lasso = lassos[prop]
    assert lasso is not None, f"{name}: {prop} holds"
    assert replays(spec, lasso), lasso.describe()
    assert lasso.prop == prop and prop in lasso.describe()


@pytest.mark.deep
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_tlc_catches_every_liveness_mutant(name: str) -> None:
    require_tlc()
    mutant, prop = MUTANTS[name]
    result = tlc_liveness(mutant.apply(SPEC), prop, timeout_s=300)
    assert result.violation == "property", (name, result.violation, result.error_message)
    assert result.trace_back_to is not None or result.trace_stutters, "TLC printed no lasso"


def test_a_lasso_that_leaves_the_model_is_caught_by_the_replay() -> None:
    """The replay check can fail: a lasso with one step changed does not replay."""
    mutant, prop = MUTANTS["fence_never_starts"]
    spec = mutant.apply(SPEC)
    lasso = check_liveness(explore(spec))[prop]
    assert lasso is not None and replays(spec, lasso)
    broken = Lasso(lasso.prop, (*lasso.prefix[:-1], lasso.prefix[1]), lasso.cycle)
    assert not replays(spec, broken)
