"""Negative controls: every broken spec variant is caught by the explorer and by TLC."""

from __future__ import annotations

import pytest
from conftest import require_tlc

from rolloutcore import modelcheck
from rolloutcore.explore import explore
from rolloutcore.spec.lifecycle import SPEC
from rolloutcore.spec.mutants import MUTANTS, Mutant


def test_at_least_eight_mutants() -> None:
    assert len(MUTANTS) >= 8
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.name)
def test_explorer_catches(m: Mutant) -> None:
    ex = explore(m.apply(SPEC))
    cex = ex.shortest_counterexample()
    assert cex is not None, f"{m.name} was not caught"
    assert cex.trace[0].action == "init" and len(cex.trace) >= 2


@pytest.mark.tlc
def test_tlc_catches_every_mutant() -> None:
    require_tlc()
    verdicts = modelcheck.check_mutants(with_tlc=True)
    missed = [v.mutant.name for v in verdicts if not v.caught]
    assert missed == []
    for v in verdicts:
        assert v.tlc_violated is not None and v.tlc_trace_length
        assert v.explorer is not None
        # Both checkers search breadth first: the shortest counterexamples agree in length.
        assert v.tlc_trace_length == len(v.explorer.trace) - 1, v.mutant.name
