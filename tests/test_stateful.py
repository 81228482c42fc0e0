"""Property-based tests (Hypothesis) generated from the spec, and the mutants they catch."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from rolloutcore.spec.lifecycle import SPEC
from rolloutcore.spec.mutants import MUTANTS, Mutant
from rolloutcore.stateful import machine_for

CI = settings(max_examples=250, stateful_step_count=50, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))

TestLifecycle = machine_for(SPEC).TestCase
TestLifecycle.settings = CI


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.name)
def test_hypothesis_catches_mutant(m: Mutant) -> None:
    machine = machine_for(m.apply(SPEC))
    # No shrinking: the explorer already reports the shortest counterexample; here we
    # only need Hypothesis to find one at all.
    hunt = settings(max_examples=3000, stateful_step_count=60, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                    phases=[Phase.generate])
    with pytest.raises(AssertionError, match="violated"):
        run_state_machine_as_test(machine, settings=hunt)
