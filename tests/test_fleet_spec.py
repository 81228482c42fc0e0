"""The fleet spec: explored exhaustively, its TLA+ graph equal to the explorer's at two and
three members, every fleet mutant caught by both, and the lifting of member actions."""

from __future__ import annotations

import functools

import pytest
from conftest import require_tlc

from rolloutcore.proof import modelcheck
from rolloutcore.spec.fleet import (
    FLEET,
    JOURNAL_PROPERTIES,
    JOURNAL_PROPERTIES_IN_THE_MODEL,
    FleetBounds,
    FleetExploration,
    FleetPhase,
    FleetState,
    explore_fleet,
    held_back,
    lift_tla,
    quorum,
    serving,
)
from rolloutcore.spec.lifecycle import Phase
from rolloutcore.spec.mutants import (
    CRASHING,
    FLEET_MUTANTS,
    PARTIAL_QUORUM,
    ROLLING,
    ROLLING_CRASH,
    FleetMutant,
)

#: Bounds CI explores: the default (two members, both needed, one fault), a partial
#: quorum (a member may be left behind), and three members (no fault, no rollout slot:
#: with both, three members reach 68k states and their TLC graph comparison takes minutes
#: here; `benchmarks/bench_spec.py` runs it; faults and rollouts are covered with two).
THREE = FleetBounds(engines=3, min_serving=2, generations=2, faults=0, rollouts=0)
#: Rolling updates (two live generations, one member always serving): over three members,
#: and with a fault (a wave member quarantined, a member suspected mid-wave). With two
#: faults (358,728 states, no violation) the wave's abort is reached too; too slow for CI.
ROLLING_THREE = FleetBounds(engines=3, min_serving=1, generations=2, faults=0, rollouts=0,
                            max_live=2, min_admitting=1)
ROLLING_FAULT = FleetBounds(engines=2, min_serving=1, generations=2, faults=1, rollouts=0,
                            max_live=2, min_admitting=1)
ROLLINGS = [ROLLING, ROLLING_THREE, ROLLING_FAULT]
ROLLING_IDS = ["two", "three", "fault"]
DEEP = pytest.mark.deep
BOUNDS = [FLEET.bounds, pytest.param(PARTIAL_QUORUM, marks=DEEP),
          pytest.param(THREE, marks=DEEP), *ROLLINGS, ROLLING_CRASH,
          pytest.param(CRASHING, marks=DEEP)]


@functools.cache
def explored(bounds: FleetBounds) -> FleetExploration:
    return explore_fleet(FLEET.with_bounds(bounds))


@pytest.mark.parametrize("bounds", BOUNDS, ids=str)
def test_every_fleet_property_holds(bounds: FleetBounds) -> None:
    ex = explored(bounds)
    assert ex.violations == {}
    publish = {"fleet_roll", "fleet_publish_wave"} if bounds.max_live > 1 else {
        "fleet_request_update", "fleet_publish"}
    assert publish <= {n for _f, n, _g in ex.graph}


def test_the_default_bounds_reach_publish_abort_quarantine_and_readmission() -> None:
    ex = explored(FLEET.bounds)
    fired = {name for _f, name, _g in ex.graph}
    assert {"fleet_publish", "fleet_abort", "fleet_reopen", "give_up", "fence_ok",
            "readmit_ok", "readmit_mismatch", "mutate_ambiguous"} <= fired
    # A quarantined member never serves. A READY fleet has a quorum serving, unless an
    # audit or a suspicion just took one out: then it admits nothing and can only close.
    b = FLEET.bounds
    short = {f for f in ex.nodes if f.fphase == FleetPhase.READY and not quorum(f, b)}
    assert short, "an audit can cost a READY fleet its quorum"
    for f in ex.nodes:
        assert not any(serving(f, s) and s.phase is Phase.TAINTED for s in f.eng)
    for f, name, _g in ex.graph:
        if f in short:
            assert name != "admit" and name != "fleet_request_update"
    assert {"fleet_close", "audit_mismatch", "audit_failed", "suspect",
            "engine_restart"} <= fired
    assert {name for f, name, _g in ex.graph if f in short} >= {"fleet_close"}


@pytest.mark.deep
def test_partial_quorum_leaves_a_member_behind_and_it_catches_up() -> None:
    ex = explored(PARTIAL_QUORUM)
    behind = [f for f in ex.nodes if f.fphase == FleetPhase.READY and any(
        s.phase is Phase.READY and s.committed < f.fcommitted for s in f.eng)]
    assert behind, "a member must be able to fall behind the fleet"
    caught_up = {name for f, name, _g in ex.graph if name == "publish"}
    assert caught_up == {"publish"}, "and catch up on its own"


#: A partial quorum over three generations: a member can fall two generations behind.
CATCH_UP = FleetBounds(engines=2, min_serving=1, generations=3, faults=1, rollouts=0)


def _changed(f: FleetState, g: FleetState) -> list[int]:
    return [n for n, (a, b) in enumerate(zip(f.eng, g.eng, strict=True)) if a != b]


@pytest.mark.deep
def test_a_member_two_generations_behind_catches_up_one_at_a_time() -> None:
    ex = explored(CATCH_UP)
    assert ex.violations == {}
    lone = [(f.eng[n].committed, f.fcommitted, f.fphase) for f, name, g in ex.graph
            if name == "publish" for n in _changed(f, g)]
    assert (1, 3, FleetPhase.READY) in lone, "from two generations behind"
    assert all(c < fc for c, fc, _p in lone)  # only onto a generation the fleet published
    starts = {f.fphase for f, name, g in ex.graph if name == "request_update"
              for n in _changed(f, g) if f.eng[n].committed < f.fcommitted}
    assert starts == {FleetPhase.READY, FleetPhase.ABORTING}  # never in the fleet's update


def test_a_held_back_member_aborts_the_update_and_keeps_serving() -> None:
    """A member whose drain timed out cancels its update with rollouts bound: the fleet
    cannot publish around it, but may abort, and it serves on."""
    ex = explored(FLEET.bounds)
    aborts = [(f, g) for f, name, g in ex.graph
              if name == "fleet_abort" and any(held_back(f, s) for s in f.eng)]
    assert aborts
    assert not [f for f, name, _g in ex.graph
                if name == "fleet_publish" and any(held_back(f, s) for s in f.eng)]
    for f, g in aborts:  # held-back members are left as they are, on the fleet's generation
        assert all(t == s for s, t in zip(f.eng, g.eng, strict=True) if held_back(f, s))
        assert g.fcommitted == f.fcommitted


def test_lift_tla_rewrites_variables_not_strings() -> None:
    assert lift_tla('pending = "none" /\\ "resumed" \\in evidence') == \
        'e.pending = "none" /\\ "resumed" \\in e.evidence'
    assert lift_tla("[bind EXCEPT ![i] = committed]") == "[e.bind EXCEPT ![i] = e.committed]"
    assert lift_tla("committed' \\in {committed, committed + 1}") == \
        "e2.committed \\in {e.committed, e.committed + 1}"


@pytest.mark.tlc
@pytest.mark.parametrize("bounds", [
    pytest.param(FLEET.bounds, marks=pytest.mark.deep), pytest.param(THREE, marks=DEEP),
    ROLLING, pytest.param(ROLLING_THREE, marks=DEEP), pytest.param(ROLLING_FAULT, marks=DEEP),
    pytest.param(ROLLING_CRASH, marks=DEEP), pytest.param(CRASHING, marks=DEEP)],
    ids=["two", "three", *(f"rolling-{i}" for i in ROLLING_IDS), "rolling-crash", "crash"])
def test_tlc_graph_equals_the_explorer_graph(bounds: FleetBounds) -> None:
    require_tlc()
    run = modelcheck.run_fleet_tlc(FLEET.with_bounds(bounds), exploration=explored(bounds))
    assert run.result.exit_code == 0, run.result.error_message
    assert run.graphs_equal, (run.only_python, run.only_tlc)
    assert run.tlc_states == run.python_states and run.tlc_edges == run.python_edges


@pytest.mark.parametrize("bounds", [ROLLING_CRASH, pytest.param(CRASHING, marks=DEEP)],
                         ids=["rolling", "strict"])
def test_a_crashed_controller_restarts_every_member_before_the_fleet_moves(
        bounds: FleetBounds) -> None:
    """After a crash only restarts happen, each member once, until the fleet recovers; a
    member the crash caught mid-update restarts TAINTED, and a fleet left without a quorum
    stays closed and reopens only after re-admission."""
    ex = explored(bounds)
    fired = {n for _f, n, _g in ex.graph}
    assert {"fleet_crash", "restart_ready", "restart_tainted", "fleet_recover",
            "fleet_recover_closed"} <= fired
    restarts = set(FLEET.restarts)
    for f, name, g in ex.graph:
        if f.fphase == FleetPhase.RECOVERING:
            assert name in restarts | {"fleet_recover", "fleet_recover_closed"}, name
            if name in restarts:
                (k,) = f.fdown - g.fdown  # one member, once
                assert g.eng[k - 1].phase in (Phase.READY, Phase.TAINTED)
                if f.eng[k - 1].phase not in (Phase.READY, Phase.DRAINING):
                    assert g.eng[k - 1].phase is Phase.TAINTED  # caught mid-update
        if name == "fleet_crash":
            assert g.fdown == frozenset(range(1, bounds.engines + 1)) and g.eng == f.eng
    closed = {g for _f, n, g in ex.graph if n == "fleet_recover_closed"}
    assert all(g.fphase == FleetPhase.ABORTING and not quorum(g, bounds) for g in closed)
    # From a closed recovery, the fleet reopens (its members re-admitted, or audited back).
    succ: dict[FleetState, list[tuple[str, FleetState]]] = {}
    for f, n, g in ex.graph:
        succ.setdefault(f, []).append((n, g))
    seen, todo, reopened = set(closed), list(closed), False
    while todo and not reopened:
        for n, g in succ.get(todo.pop(), []):
            reopened |= n == "fleet_reopen"
            if g not in seen:
                seen.add(g)
                todo.append(g)
    assert reopened


#: Mutants whose first violation lies deep in the default graph (8-18 s each here): make
#: check leaves them to make test's explorer-and-TLC run of every mutant (below).
_SLOW_MUTANTS = frozenset({"publish_before_settled", "member_publishes_alone",
                           "decision_waits_on_quarantined", "admit_on_stale_member",
                           "publish_unverified_members"})


@pytest.mark.parametrize("m", [pytest.param(m, marks=DEEP) if m.name in _SLOW_MUTANTS else m
                               for m in FLEET_MUTANTS], ids=lambda m: m.name)
def test_the_explorer_catches_fleet_mutant(m: FleetMutant) -> None:
    v = modelcheck.check_fleet_mutant(m, with_tlc=False)
    assert v.explorer, f"the explorer missed {m.name}"


@pytest.mark.tlc
@pytest.mark.deep
@pytest.mark.parametrize("m", FLEET_MUTANTS, ids=lambda m: m.name)
def test_explorer_and_tlc_catch_fleet_mutant(m: FleetMutant) -> None:
    require_tlc()
    v = modelcheck.check_fleet_mutant(m, with_tlc=True)
    assert v.explorer, f"the explorer missed {m.name}"
    assert v.tlc_violated is not None, f"TLC missed {m.name}"
    # Both report the shortest counterexample's property, or TLC a member property the
    # explorer also found (TLC checks invariants and properties in its own order).
    assert v.tlc_violated in v.explorer or v.tlc_violated.removeprefix("Member") in v.explorer
    assert v.tlc_trace_length == min(v.explorer.values()), (v.tlc_trace_length, v.explorer)


#: The mutant that breaks each fleet journal property's form in the model.
_JOURNAL_MUTANTS = {"OneIdentityPerGeneration": "publish_unverified_members",
                    "OneRolloutOneMember": "migration_copies",
                    "TakeoverAdoptsNothing": "takeover_adopts_outcome"}


@pytest.mark.parametrize("journal_property", [
    pytest.param(p, marks=DEEP) if _JOURNAL_MUTANTS[p] in _SLOW_MUTANTS else p
    for p in JOURNAL_PROPERTIES])
def test_every_journal_property_is_stated_in_the_model(journal_property: str) -> None:
    """What the fleet trace checker holds every journal to is a property of the model too
    (the explorer and TLC check it in every state and step), and a mutant breaks it: the
    journal check and the model agree on what a fleet must never do."""
    stated = JOURNAL_PROPERTIES_IN_THE_MODEL[journal_property]
    known = {p.name for p in (*FLEET.invariants, *FLEET.action_properties)}
    assert set(stated) <= known, set(stated) - known
    (mutant,) = [m for m in FLEET_MUTANTS if m.name == _JOURNAL_MUTANTS[journal_property]]
    v = modelcheck.check_fleet_mutant(mutant, with_tlc=False)
    assert set(v.explorer) & set(stated), (journal_property, v.explorer)


# ----------------------------------------------------------------------- rolling waves


@pytest.mark.deep
def test_strict_bounds_never_roll_and_keep_the_floor_on_the_frontier() -> None:
    """max_live 1 is the strict update exactly: no rolling step fires, and the floor is
    the committed generation in every state."""
    for b in (FLEET.bounds, PARTIAL_QUORUM, THREE):
        ex = explored(b)
        fired = {n for _f, n, _g in ex.graph}
        assert not fired & {"fleet_roll", "fleet_publish_wave", "fleet_end_wave",
                            "fleet_raise_floor"}
        assert all(f.ffloor == f.fcommitted for f in ex.nodes)


@pytest.mark.parametrize("bounds", ROLLINGS, ids=ROLLING_IDS)
def test_a_rolling_update_keeps_min_admitting_members_serving(bounds: FleetBounds) -> None:
    ex = explored(bounds)
    fired = {n for _f, n, _g in ex.graph}
    # A wave publishes; the members left on the old generation catch up alone (publish).
    assert {"fleet_roll", "fleet_publish_wave", "fleet_raise_floor", "publish"} <= fired
    assert "fleet_request_update" not in fired  # max_live 2: updates roll
    if bounds.faults:
        assert {"fleet_end_wave", "give_up", "suspect"} <= fired
    rolling = [f for f in ex.nodes if f.fphase == FleetPhase.ROLLING]
    assert rolling
    # No bubble: no step of a rolling update takes the members serving below
    # min_admitting (only a fault does), and rollouts are admitted while a wave prepares.
    for f, n, g in ex.graph:
        if f.fphase == FleetPhase.ROLLING and n == "request_update":
            assert sum(serving(g, s) for s in g.eng) >= bounds.min_admitting
    if bounds.rollouts:
        assert any(any(s.phase is not Phase.READY for s in f.eng)
                   for f, n, _g in ex.graph if n == "admit" and f.fphase == FleetPhase.ROLLING)
    # Two generations are served at once after a wave publishes, never three.
    two = [f for f in ex.nodes if len({s.committed for s in f.eng if serving(f, s)}) == 2]
    assert two
    assert all(len({s.committed for s in f.eng if serving(f, s)}) <= 2 for f in ex.nodes)


def test_a_draining_member_migrates_its_rollout_instead_of_waiting() -> None:
    """A member that must update moves its rollout to a member serving the rollout's own
    generation, then quiesces without waiting for it to end; a rollout never moves to
    another generation, nor onto a member that is not serving."""
    ex = explored(ROLLING)
    moves = _migrations(ROLLING)
    assert moves
    for f, (src, i, dst, j), g in moves:
        s, t = f.eng[src - 1], f.eng[dst - 1]
        assert s.phase is Phase.DRAINING and serving(f, t)
        assert t.committed == s.bind[i - 1] == g.eng[dst - 1].bind[j - 1]
        assert g.eng[src - 1].bind[i - 1] == 0
    # After a move the member it left can quiesce at once (its engine request, an orphan,
    # ends first: the wait-mode pause waits for it), while the rollout goes on elsewhere.
    after = {g for _f, _p, g in moves}
    paused = {f for f, n, _g in ex.graph if n == "pause_begin"}
    assert any(g in paused for g in after) or any(
        f in after and n == "engine_finish" and h in paused for f, n, h in ex.graph)
    # Both generations are served when a migration happens in some state, and every
    # move stays on its own generation.
    assert {g.eng[dst - 1].committed for _f, (_s, _i, dst, _j), g in moves} == {1, 2}


def _migrations(bounds: FleetBounds) -> list[tuple[FleetState, tuple[int, ...], FleetState]]:
    """Every migration edge with its parameter (the explored graph keeps names only)."""
    spec = FLEET.with_bounds(bounds)
    out = []
    for f in explored(bounds).nodes:
        for _n, p, g in spec.migrations(f):
            assert isinstance(p, tuple)
            out.append((f, p, g))
    return out
