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

__all__ = ["H_ENGINE", "H_GENERATION", "H_IDENTITY", "H_LABEL", "H_MAX_STALENESS",
           "H_MIN_GENERATION", "H_ROLLOUT", "H_SEQ"]
