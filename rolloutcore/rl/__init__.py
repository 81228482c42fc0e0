"""The trainer-facing API: groups of samples bound to one generation, a bounded buffer
with the trainer's staleness rule, and publishing from a live torch model.

    client = RolloutClient(gateway_url, "tiny", logprobs_mode=engine_logprobs_mode(urls))
    group = client.generate_group(prompt_ids, n=8, sampling=Sampling(max_tokens=17))
    buffer.put(group); taken = buffer.take(16, trained_generation); ...; buffer.ack(taken)
    published = publisher.publish(model, label="step-12")   # generation, identity

Submodules import torch (weights, publish) or only httpx (client, buffer); nothing here
imports vLLM.
"""

from rolloutcore.rl.buffer import RolloutBuffer, Stale, Taken
from rolloutcore.rl.client import (
    Group,
    GroupError,
    GroupRefused,
    Partial,
    RolloutClient,
    Sample,
    Sampling,
    engine_logprobs_mode,
)
from rolloutcore.rl.episode import Episode, EpisodeEnded, EpisodeRecord, Turn

__all__ = ["Episode", "EpisodeEnded", "EpisodeRecord", "Group", "GroupError", "GroupRefused",
           "Partial", "RolloutBuffer", "RolloutClient", "Sample", "Sampling", "Stale", "Taken",
           "Turn", "engine_logprobs_mode"]
