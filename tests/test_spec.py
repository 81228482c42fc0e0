"""The spec explored exhaustively: every invariant, every action, terminal states."""

from __future__ import annotations

import pytest

from rolloutcore.proof.explore import Exploration, explore
from rolloutcore.spec.lifecycle import (
    ACTIONS,
    ALL_EVIDENCE,
    FENCED,
    MIXED,
    SPEC,
    TAINT,
    TIERS,
    Bounds,
    Kind,
    Phase,
    Result,
    initial_states,
)
from rolloutcore.spec.mutants import mutant


def test_default_bounds_hold_every_property(exploration: Exploration) -> None:
    assert exploration.violations == {}
    assert exploration.unreachable_actions == ()
    assert exploration.states > 1000 and exploration.edges > exploration.states


@pytest.mark.parametrize("bounds", [Bounds(1, 2, 0), Bounds(3, 3, 1),
                                    pytest.param(Bounds(2, 4, 3), marks=pytest.mark.deep)])
def test_other_bounds_hold(bounds: Bounds) -> None:
    ex = explore(SPEC.with_bounds(bounds))
    assert ex.violations == {}


def test_no_state_is_a_dead_end(exploration: Exploration) -> None:
    """Even TAINTED has a way on: an explicit, verified re-admission."""
    assert all(exploration.graph.out_degree(s) > 0 for s in exploration.graph.nodes)


def test_tainted_leaves_only_by_verified_readmission(exploration: Exploration) -> None:
    left = set()
    for u, v, (name, _p) in exploration.graph.edges(keys=True):
        if u.phase is Phase.TAINTED and v.phase is not Phase.TAINTED:
            left.add(name)
            assert v.phase is Phase.READY and v.weights == v.committed == u.committed
    assert left == {"readmit_ok"}


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


@pytest.mark.deep
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
    for bad in ((-1, 3, 1), (1, 0, 1), (1, 3, -1)):
        with pytest.raises(ValueError):
            Bounds(*bad)


def test_initial_states_are_fresh_engines_labelled_one() -> None:
    """A fresh engine reports label 1 whatever it holds: the declared weights, or others."""
    states = initial_states(Bounds())
    assert {s.weights for s in states} == {1, MIXED}
    for s in states:
        assert s.phase is Phase.UNINITIALIZED and s.label == 1 and not s.paused
        assert s.caches == tuple(frozenset() for _ in TIERS)


def test_bootstrap_adopts_only_the_declared_weights(exploration: Exploration) -> None:
    adopted = {u.weights for u, v, k in exploration.graph.edges(keys=True)
               if k[0] == "bootstrap_ok"}
    refused = {u.weights for u, v, k in exploration.graph.edges(keys=True)
               if k[0] == "bootstrap_mismatch"}
    assert adopted == {1} and MIXED in refused


def test_exactly_one_restart_step_in_every_state(exploration: Exploration) -> None:
    """The restart decision is total and deterministic: whatever the journal last
    recorded, exactly one restart step applies (fault bound aside)."""
    restarts = [a for a in ACTIONS if a.kind is Kind.RESTART]
    for s in exploration.graph.nodes:
        allowed = [a.name for a in restarts if s.phase in a.sources and a.when(s, None)]
        assert len(allowed) == 1, (s, allowed)


def test_restart_ready_only_without_doubt(exploration: Exploration) -> None:
    """READY again only with nothing in flight but a read-only audit (whose lost answer
    leaves no evidence), on an engine known to run the committed generation (unless
    replaced out of band since it was verified: nobody knows until the next audit)."""
    for u, v, (name, _p) in exploration.graph.edges(keys=True):
        if name == "restart_ready":
            assert u.pending in ("none", "audit")
            assert u.replaced or (not u.paused and u.weights == u.committed)
            assert v.phase is Phase.READY and not any(v.bind)
            assert v.evidence == (u.evidence if u.pending == "none" else frozenset())


def test_a_crash_mid_mutation_may_have_done_anything(exploration: Exploration) -> None:
    """The in-flight mutation's effect may or may not have taken place: old, new or mixed
    weights after a restart with the mutation pending, and always TAINTED."""
    after = {(v.phase, v.weights) for u, v, (name, _p) in exploration.graph.edges(keys=True)
             if name == "restart_tainted" and u.pending == "mutate"}
    assert {w for _ph, w in after} >= {1, 2, MIXED}
    assert {ph for ph, _w in after} == {Phase.TAINTED}


def test_a_fenced_engine_serves_nothing(exploration: Exploration) -> None:
    fenced = [s for s in exploration.graph.nodes
              if s.phase is Phase.TAINTED and FENCED in s.evidence and not s.replaced]
    assert fenced
    assert all(s.paused and s.label == TAINT and not any(s.req) for s in fenced)
    # A process replaced out of band is no longer fenced; only re-admission leaves TAINTED.
    assert any(s.phase is Phase.TAINTED and FENCED in s.evidence and not s.paused
               for s in exploration.graph.nodes)


def test_an_audit_finds_an_engine_replaced_out_of_band(exploration: Exploration) -> None:
    """After an out-of-band restart onto other weights (or another label) an audit never
    passes: it quarantines the engine, releasing its rollouts as aborted; after a passed
    audit the engine is the committed one."""
    for u, v, (name, _p) in exploration.graph.edges(keys=True):
        if name == "audit_ok":
            assert (v.weights, v.label, v.paused) == (v.committed, v.committed, False)
            assert not v.replaced and v.evidence == ALL_EVIDENCE
        if name == "audit_mismatch":
            assert u.replaced and v.phase is Phase.TAINTED and not any(v.bind)
    foreign = [u for u, v, (name, _p) in exploration.graph.edges(keys=True)
               if name == "audit_mismatch" and u.weights == MIXED and u.label == u.committed]
    assert foreign, "a foreign engine under the committed label is found by its identity"


def test_no_admission_until_an_audit_passes(exploration: Exploration) -> None:
    """A failed audit or a suspicion drops every piece of evidence in READY: no admission
    and no update until an audit passes (or the engine is re-admitted)."""
    doubtful = [s for s in exploration.graph.nodes if s.phase is Phase.READY and s.doubt]
    assert doubtful and all(s.evidence == frozenset() for s in doubtful)
    for u, _v, (name, _p) in exploration.graph.edges(keys=True):
        if name in ("admit", "request_update"):
            assert u.evidence == ALL_EVIDENCE and not u.doubt


def test_only_failed_outcomes_are_retried() -> None:
    """Definite answers (refused, mismatch) and ambiguity end the step; only an
    unclassifiable failure is worth another attempt (the runner derives this)."""
    assert {r for r in Result if r.retried} == {Result.FAILED}
    assert {a.result for a in ACTIONS if a.op == "bootstrap"} >= {Result.MISMATCH}


def test_environment_actions_are_invisible() -> None:
    env = [a for a in ACTIONS if a.kind is Kind.ENVIRONMENT]
    assert env and all(a.trigger is None for a in env)
    assert all(not a.control_tla for a in env)
