"""Property-based tests (Hypothesis) generated from the spec, and the mutants they catch."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from rolloutcore.proof.stateful import machine_for
from rolloutcore.spec.lifecycle import SPEC
from rolloutcore.spec.mutants import MUTANTS, Mutant, mutant

#: make check's size; make test runs the deeper search below too.
CI = settings(max_examples=120, stateful_step_count=50, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))

TestLifecycle = machine_for(SPEC).TestCase
TestLifecycle.settings = CI


@pytest.mark.deep
class TestLifecycleDeep(machine_for(SPEC).TestCase):  # type: ignore[misc]
    settings = settings(CI, max_examples=500)

#: The mutant CI hunts on every run: its explorer counterexample is the shortest of all
#: (init, bootstrap_begin, bootstrap_ok: READY without the probe's evidence), so
#: Hypothesis meets it within its first examples.
FAST_MUTANT = "skip_probe"


def _hunt(*, max_examples: int, steps: int) -> settings:
    # No shrinking: the explorer already reports the shortest counterexample; here we
    # only need Hypothesis to find one at all. Derandomized: the same search every run.
    return settings(max_examples=max_examples, stateful_step_count=steps, deadline=None,
                    database=None, derandomize=True, suppress_health_check=list(HealthCheck),
                    report_multiple_bugs=False, phases=[Phase.generate])


def test_hypothesis_catches_the_fast_mutant() -> None:
    m = mutant(FAST_MUTANT)
    with pytest.raises(AssertionError, match="invariant PublishedWasVerified violated"):
        run_state_machine_as_test(machine_for(m.apply(SPEC)),
                                  settings=_hunt(max_examples=50, steps=10))


@pytest.mark.slow_hypothesis
@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.name)
def test_hypothesis_catches_mutant(m: Mutant) -> None:
    """Opt-in (``--slow-hypothesis``, ~18 min on 2 cores): the search stops at its first
    violation, so the budget costs only for hard mutants. label_only_validation needs
    several thousand walks (mutate_ok_wrong_weights, then a clean invalidation and
    validation; ~11 min): a budget of 3000 misses it."""
    with pytest.raises(AssertionError, match="violated"):
        run_state_machine_as_test(machine_for(m.apply(SPEC)),
                                  settings=_hunt(max_examples=20_000, steps=60))
