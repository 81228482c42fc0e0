"""The episode spec (spec/episodes.py): agentic episodes bound to one generation per
segment in a rolling fleet. Every invariant holds at the default bounds and every action
is reachable; each of the three ways an owner may choose for an update really happens
(the checks are not vacuous); each mutant breaks its invariant for the explorer and for
TLC, and TLC's graph of the generated module equals the explorer's edge for edge."""

from __future__ import annotations

import pytest

from rolloutcore.spec.episodes import (
    ABORTED,
    DONE,
    EPISODES,
    EXPIRED,
    EpBounds,
    EpState,
    explore_episodes,
)

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


@pytest.mark.deep
def test_two_episodes_share_members_safely() -> None:
    """Two episodes at once (each with its own owner's choice) at two generations: every
    invariant still holds (358,909 states, the explorer's alone)."""
    ex = explore_episodes(EPISODES.with_bounds(EpBounds(episodes=2, turns=2, generations=2)))
    assert ex.ok, ex.violations
    assert ex.states == 358_909
