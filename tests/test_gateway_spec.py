"""The multi-gateway spec (spec/gateways.py): several gateways admit on their own views,
and a member mutates only once every gateway has closed it and drained its rollouts
there, or its lease has ended and the engines refuse it. Every invariant holds and every
action is reachable at 2 gateways x 2 members (TLC graph-equal) and 2 x 3 (explorer, deep);
a partitioned gateway really keeps admitting on its stale view (not vacuous); each mutant
is caught by the explorer and by TLC."""

from __future__ import annotations

import pytest
from conftest import require_tlc

from rolloutcore.proof import modelcheck
from rolloutcore.spec.gateways import GATEWAYS, GwBounds, explore_gateways

BREAKS = {
    "mutate_after_a_quorum_of_gateways": "NoRolloutCrossesMutation",
    "admit_after_lease_expired": "NoRolloutCrossesMutation",
    "ack_before_inflight_ended": "AckMeansDrained",
}


def test_every_invariant_holds_and_every_action_is_reachable() -> None:
    ex = explore_gateways()
    assert ex.ok, ex.violations
    assert ex.unreachable == ()
    assert ex.states == 4_959  # stated in spec/SPEC.md


def test_a_partitioned_gateway_is_waited_for_until_its_lease_ends() -> None:
    """Not vacuous: a gateway cut off from the controller admits on its stale view while
    the member closes; the member mutates only after its lease ended, and the pause ends
    the rollout it still had there."""
    ex = explore_gateways()
    stale_admit = [(f, g) for f, name, g in ex.graph if name == "admit"
                   and any(x.cut for x in f.gw) and any(m.phase == "closing" for m in f.mem)]
    assert stale_admit
    aborted = [(f, g) for f, name, g in ex.graph if name == "mutate"
               and any(x.expired and any(x.infl) for x in f.gw)]
    assert aborted and all(not any(x.infl[m] for x in g.gw if x.expired)
                           for _f, g in aborted for m in range(2)
                           if g.mem[m].phase == "mutating")


@pytest.mark.deep
def test_three_members_keep_every_invariant() -> None:
    ex = explore_gateways(GATEWAYS.with_bounds(GwBounds(members=3)))
    assert ex.ok, ex.violations
    assert ex.states == 277_595


@pytest.mark.deep
def test_tlc_agrees_at_three_members() -> None:
    """At 2 gateways x 3 members TLC finds no violation and the same number of states as
    the explorer (its graph is too large to dump and compare here in CI's time)."""
    require_tlc()
    r = modelcheck.GATEWAY_MODEL.tlc(GATEWAYS.with_bounds(GwBounds(members=3)),
                                     dump_graph=False, timeout_s=600)
    assert r.exit_code == 0, r.error_message
    assert r.distinct_states == 277_595
