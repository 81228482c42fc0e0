"""SkyRL-Gym environments (``pip install skyrl-gym``; tested with 0.4.0) driven through
the gateway as agentic episodes: the library's multi-turn text environments, unmodified,
talk to the fleet over the OpenAI chat API; the only additions are the gateway's base
URL and the episode headers.

    env = skyrl_gym.make("gsm8k_multi_turn", env_config={}, extras={...})
    run = run_episode(gateway_url, "tiny", env, [{"role": "user", "content": q}],
                      policy="segment")
    run.reward, run.turns[k].generation, run.turns[k].segment, run.status

Each turn's answer names its binding (generation, identity, member, admission) and its
segment; the gateway's records hold its token ids for ``records verify``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from rolloutcore.gateway.wire import (
    H_ENGINE,
    H_EPISODE,
    H_EPISODE_POLICY,
    H_SEGMENT,
    H_TURN,
)
from rolloutcore.rl.client import (
    GroupError,
    GroupRefused,
    binding_from_headers,
    refusal_code,
)
from rolloutcore.rl.episode import segments_of

Messages = list[dict[str, Any]]


class TextEnv(Protocol):
    """What SkyRL-Gym's ``BaseTextEnv`` offers (``init``, ``step``)."""

    def init(self, prompt: Messages) -> tuple[Messages, dict[str, Any]]: ...

    def step(self, action: str) -> Any: ...


@dataclass(frozen=True)
class ChatTurn:
    index: int
    segment: int
    generation: int
    identity: str | None
    engine: str
    rollout_id: str
    seq: int
    reply: str
    reward: float


@dataclass
class EpisodeRun:
    episode: str
    policy: str
    turns: list[ChatTurn] = field(default_factory=list)
    reward: float = 0.0
    status: str = "live"  # done, or how the gateway ended it (aborted, expired, lost)
    messages: Messages = field(default_factory=list)

    @property
    def segments(self) -> list[tuple[int, int]]:
        """(segment, generation) per segment, in order."""
        return segments_of(self.turns)


def run_episode(base_url: str, model: str, env: TextEnv, prompt: Sequence[dict[str, Any]], *,
                policy: str = "wait", max_tokens: int = 16, temperature: float = 1.0,
                episode_id: str | None = None, timeout_s: float = 300.0,
                between_turns: Callable[[int], None] | None = None) -> EpisodeRun:
    """Run ``env`` to its end as one episode through the gateway at ``base_url``: each
    model turn a chat completion under the episode, each environment step's observations
    appended to the conversation. ``between_turns(k)`` runs after the environment's
    answer to turn ``k`` (a slow tool, an update the caller starts). An episode the
    gateway ends (an update aborted it) stops there, its status saying why."""
    run = EpisodeRun(episode_id or f"env-{uuid.uuid4().hex[:16]}", policy)
    messages, _ = env.init([dict(m) for m in prompt])
    run.messages = list(messages)
    headers = {H_EPISODE: run.episode, H_EPISODE_POLICY: policy}
    with httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s) as http:
        done = False
        while not done:
            r = http.post("/v1/chat/completions", headers=headers, json={
                "model": model, "messages": run.messages, "max_tokens": max_tokens,
                "temperature": temperature})
            if r.status_code != 200:
                code = refusal_code(r)
                if code is not None and code.startswith("episode_"):
                    run.status = code.removeprefix("episode_")
                    return run
                raise GroupRefused(f"turn {len(run.turns) + 1} refused: HTTP "
                                   f"{r.status_code}: {r.text[:300]}", code=code,
                                   status=r.status_code)
            reply = _reply(r)
            out = env.step(reply)
            reward = float(out["reward"])
            h = r.headers
            b = binding_from_headers(h)
            run.turns.append(ChatTurn(int(h[H_TURN]), int(h[H_SEGMENT]), b.generation,
                                      b.identity, h[H_ENGINE], b.rollout_id, b.seq, reply,
                                      reward))
            run.reward += reward
            run.messages += [{"role": "assistant", "content": reply}, *out["observations"]]
            done = bool(out["done"])
            if not done and between_turns is not None:
                between_turns(len(run.turns))
        end = http.post(f"/v1/episodes/{run.episode}/end")
        run.status = str(end.json()["status"]) if end.status_code == 200 else "lost"
    return run


def _reply(r: httpx.Response) -> str:
    try:
        content = r.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise GroupError(f"a chat answer without a message: {e}") from None
    return str(content or "")


__all__ = ["ChatTurn", "EpisodeRun", "TextEnv", "run_episode"]
