"""The gateway's HTTP headers: what a client may send (its minimum generation, the
staleness it accepts) and what every answer names (the binding). Stated once, read by the
gateway and by the trainer's client; imports nothing."""

H_GENERATION = "x-rolloutcore-generation"
H_IDENTITY = "x-rolloutcore-identity"
H_ENGINE = "x-rolloutcore-engine"
H_ROLLOUT = "x-rolloutcore-rollout-id"
H_LABEL = "x-rolloutcore-label"
H_SEQ = "x-rolloutcore-admission-seq"
H_MIN_GENERATION = "x-rolloutcore-min-generation"
H_MAX_STALENESS = "x-rolloutcore-max-staleness"
#: An agentic episode's turn: its id (the first turn starts it), the policy its owner
#: chose for an update of its member (wait, abort or segment; on the first turn), and
#: ``true`` to end the episode with this turn. Answers name its segment and turn too.
H_EPISODE = "x-rolloutcore-episode"
H_EPISODE_POLICY = "x-rolloutcore-episode-policy"
H_EPISODE_END = "x-rolloutcore-episode-end"
#: Episodes naming one group (on their first turn) share one hold: one member, one
#: generation per segment, as n samples of one prompt share one admission.
H_EPISODE_GROUP = "x-rolloutcore-episode-group"
H_SEGMENT = "x-rolloutcore-episode-segment"
H_TURN = "x-rolloutcore-episode-turn"

__all__ = ["H_ENGINE", "H_EPISODE", "H_EPISODE_END", "H_EPISODE_GROUP", "H_EPISODE_POLICY",
           "H_GENERATION", "H_IDENTITY", "H_LABEL", "H_MAX_STALENESS", "H_MIN_GENERATION",
           "H_ROLLOUT", "H_SEGMENT", "H_SEQ", "H_TURN"]
