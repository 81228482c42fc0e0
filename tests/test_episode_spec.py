"""The episode spec (spec/episodes.py): agentic episodes bound to one generation per
segment in a rolling fleet. Every invariant holds at the default bounds and every action
is reachable; each of the three ways an owner may choose for an update really happens
(the checks are not vacuous); each mutant breaks its invariant for the explorer and for
TLC, and TLC's graph of the generated module equals the explorer's edge for edge."""

from __future__ import annotations

import pytest
from conftest import require_tlc

from rolloutcore.proof import modelcheck
from rolloutcore.spec.episodes import (
    ABORTED,
    DONE,
    EPISODES,
    EXPIRED,
    EpBounds,
    EpState,
    explore_episodes,
)
from rolloutcore.spec.mutants import EPISODE_MUTANTS

#: The invariant each mutant breaks first (the explorer's shortest counterexample).
BREAKS = {
    "turn_on_other_generation": "OneEpisodeOnePolicy",
    "floor_passes_live_episode": "EpisodesCountTowardK",
    "segment_not_journalled": "OneEpisodeOnePolicy",
    "mutate_under_waited_episode": "OwnersChoiceKept",
    "mutate_mid_turn": "TurnServedByItsGeneration",
    "turn_past_idle_deadline": "IdleDeadlineHonoured",
}


def test_every_invariant_holds_and_every_action_is_reachable() -> None:
    ex = explore_episodes()
    assert ex.ok, ex.violations
    assert ex.unreachable == ()
    assert ex.states == 9_035  # stated in spec/SPEC.md and EpBounds' docstring


def test_every_way_an_owner_may_choose_happens() -> None:
    """Not vacuous: an episode waited for ends done after an update of its member's
    fleet; one that chose abort is aborted; one that chose segment spans two
    generations in two segments of its record; one past its idle deadline expires."""
    nodes = explore_episodes().nodes

    def some(pred: object) -> bool:
        return any(pred(f) for f in nodes)  # type: ignore[operator]

    def segmented(f: EpState) -> bool:
        return any(len({s for s, _g in x.log}) == 2 and len({g for _s, g in x.log}) == 2
                   for x in f.eps)

    assert some(lambda f: any(x.status == ABORTED and x.policy == "abort" for x in f.eps))
    assert some(lambda f: any(x.status == EXPIRED for x in f.eps))
    assert some(segmented)
    assert some(lambda f: f.floor == 2 and any(
        x.status == DONE and x.policy == "wait" and x.log and x.gen == 1 for x in f.eps))


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_mutant_breaks_its_invariant(name: str) -> None:
    mutant = next(m for m in EPISODE_MUTANTS if m.name == name)
    ex = explore_episodes(mutant.apply(EPISODES))
    assert BREAKS[name] in ex.violations, (name, ex.violations)
    first = min(ex.violations, key=lambda k: len(ex.violations[k]))
    assert len(ex.violations[first]) == len(ex.violations[BREAKS[name]])


def test_tlc_graph_equals_the_explorers() -> None:
    require_tlc()
    run = modelcheck.EPISODE_MODEL.run_tlc()
    assert run.result.exit_code == 0, run.result.error_message
    assert run.graphs_equal, (run.only_python[:3], run.only_tlc[:3])
    assert (run.tlc_states, run.tlc_edges) == (run.python_states, run.python_edges)


@pytest.mark.deep  # make test: TLC once per mutant
def test_tlc_catches_every_mutant() -> None:
    require_tlc()
    verdicts = modelcheck.EPISODE_MODEL.check_mutants(with_tlc=True)
    assert {v.mutant.name for v in verdicts} == set(BREAKS)
    for v in verdicts:
        assert v.caught and v.tlc_violated in v.explorer, v.as_json()


@pytest.mark.deep
def test_two_episodes_share_members_safely() -> None:
    """Two episodes at once (each with its own owner's choice) at two generations: every
    invariant still holds (358,909 states, the explorer's alone)."""
    ex = explore_episodes(EPISODES.with_bounds(EpBounds(episodes=2, turns=2, generations=2)))
    assert ex.ok, ex.violations
    assert ex.states == 358_909
