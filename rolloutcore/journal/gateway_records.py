"""The records remote gateways leave (one place for the names the gateways write and the
checker reads, :mod:`rolloutcore.check.gateway_join`).

In the fleet's journal, a gateway's *hold* on a member is a binding whose rollout id begins
with :data:`HOLD_PREFIX`; its admit names the gateway and its journal ``position``, its
release the position of the gateway's acknowledgement, or ``expired`` and the ``fence``.

A gateway's own journal (a :class:`~rolloutcore.journal.Journal` under spec name
:data:`JOURNAL_SPEC`) holds steps of the gateway itself: :data:`START` ``{gateway,
epoch}`` per registration, :data:`ADMIT` ``{rollout, member, generation, identity}``,
:data:`RELEASE` ``{rollout, member, status[, outcome]}``, and :data:`ABANDON` ``{rollout,
member}`` for what a restarted gateway's predecessor left admitted.
"""

HOLD_PREFIX = "gw-hold:"
JOURNAL_SPEC = "RolloutCoreGatewayJournal"
START, ADMIT, RELEASE, ABANDON = "gw_start", "gw_admit", "gw_release", "gw_abandon"

__all__ = ["ABANDON", "ADMIT", "HOLD_PREFIX", "JOURNAL_SPEC", "RELEASE", "START"]
