"""The trainer's side of agentic episodes: a multi-turn rollout through the gateway,
bound to one generation per segment, and its record with the policy/environment mask.

    with client.episode(policy="segment") as ep:
        ep.observe(task_ids)                  # environment tokens: not the policy's
        t = ep.turn(Sampling(max_tokens=8))   # the policy's tokens, one generation
        ep.observe(tool_result_ids)
        ep.turn(Sampling(max_tokens=4))
        ep.end(reward=1.0)
    rec = ep.record        # turns in order, tokens, mask, behaviour logprobs, provenance

A turn sends the whole context (every token so far) as the prompt, so the engine's
prefix cache (on the episode's member, under its generation) serves what came before.
``ep.record.records()`` gives one trajectory record per turn for ``records verify``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import httpx

from rolloutcore.engine.controller import Binding
from rolloutcore.gateway.wire import (
    H_ENGINE,
    H_EPISODE,
    H_EPISODE_GROUP,
    H_EPISODE_POLICY,
    H_LABEL,
    H_SEGMENT,
    H_TURN,
)
from rolloutcore.rl.client import (
    GroupError,
    GroupRefused,
    Sampling,
    binding_from_headers,
    refusal_code,
)
from rolloutcore.trajectories.format import EpisodeTurn, Timing, TrajectoryRecord


class EpisodeEnded(GroupRefused):
    """The gateway ended the episode (aborted by an update, idle past its deadline, lost):
    ``code`` says which; nothing more of it is served."""


@dataclass(frozen=True)
class Turn:
    """One policy turn: the tokens it sampled after ``start`` tokens of context."""

    index: int
    segment: int
    start: int  # where the turn's response begins in the episode's tokens
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str | None
    binding: Binding  # its segment's admission (several turns share one)
    engine: str
    label: str
    started_at: float
    seconds: float

    @property
    def generation(self) -> int:
        return self.binding.generation


class _SegmentTurn(Protocol):
    @property
    def segment(self) -> int: ...

    @property
    def generation(self) -> int: ...


def segments_of(turns: Sequence[_SegmentTurn]) -> list[tuple[int, int]]:
    """(segment, generation) of each segment of an episode's turns, in order."""
    out: list[tuple[int, int]] = []
    for t in turns:
        if not out or out[-1][0] != t.segment:
            out.append((t.segment, t.generation))
    return out


@dataclass
class EpisodeRecord:
    """An episode as the trainer keeps it: every token in order, which ones the policy
    sampled (``mask``) and their behaviour logprobs, its turns' provenance, how it
    ended."""

    episode: str
    policy: str
    sampling: Sampling
    logprobs_mode: str
    tokens: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)  # True: sampled by the policy
    logprobs: list[float | None] = field(default_factory=list)  # per token, None: not
    turns: list[Turn] = field(default_factory=list)
    status: str = "live"  # then done, aborted, expired or lost
    reward: float | None = None
    group: str | None = None  # the group it shares one hold with (n episodes of a task)

    @property
    def segments(self) -> list[tuple[int, int]]:
        """(segment, generation) of each segment, in order."""
        return segments_of(self.turns)

    @property
    def one_policy(self) -> bool:
        """Whether every turn was served by one generation (a single segment)."""
        return len({t.generation for t in self.turns}) <= 1

    def check(self) -> None:
        """The mask says exactly which tokens the turns sampled; GroupError otherwise."""
        want = [False] * len(self.tokens)
        for t in self.turns:
            if self.tokens[t.start:t.start + len(t.token_ids)] != list(t.token_ids):
                raise GroupError(f"turn {t.index}: its tokens are not where it says")
            want[t.start:t.start + len(t.token_ids)] = [True] * len(t.token_ids)
        if want != self.mask or len(self.logprobs) != len(self.tokens):
            raise GroupError("the mask does not match the turns' tokens")
        if any((lp is None) == m for lp, m in zip(self.logprobs, self.mask, strict=True)):
            raise GroupError("a logprob on a token the policy did not sample, or none on one "
                             "it did")

    def records(self) -> list[TrajectoryRecord]:
        """One trajectory record per turn: its context as the prompt, its tokens as the
        response, tagged with the episode, segment and turn (``records verify``)."""
        return [TrajectoryRecord(
            binding=t.binding, label=t.label, prompt_token_ids=tuple(self.tokens[:t.start]),
            response_token_ids=t.token_ids, logprobs=t.logprobs,
            logprobs_mode=self.logprobs_mode, decoding=self.sampling.decoding(),
            finish_reason=t.finish_reason, stop_reason=None,
            timing=Timing(t.started_at, t.seconds),
            episode=EpisodeTurn(self.episode, t.segment, t.index, self.group))
            for t in self.turns]


class Episode:
    """A live episode through the gateway (a context manager: leaving it ends the
    episode if it is still live)."""

    def __init__(self, http: httpx.Client, model: str, *, policy: str, logprobs_mode: str,
                 sampling: Sampling, episode_id: str | None = None,
                 group: str | None = None) -> None:
        self.http, self.model = http, model
        self.id = episode_id or f"ep-{uuid.uuid4().hex[:16]}"
        self.record = EpisodeRecord(self.id, policy, sampling, logprobs_mode, group=group)

    def __enter__(self) -> Episode:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.record.status == "live" and self.record.turns:
            self.end(None)

    def observe(self, token_ids: Sequence[int]) -> None:
        """Tokens from the environment or the prompt: context, not the policy's."""
        ids = [int(t) for t in token_ids]
        self.record.tokens += ids
        self.record.mask += [False] * len(ids)
        self.record.logprobs += [None] * len(ids)

    def turn(self, sampling: Sampling | None = None) -> Turn:
        """The policy's next turn on the whole context; :class:`EpisodeEnded` if the
        gateway ended the episode (an update aborted it, its idle deadline passed)."""
        rec = self.record
        if rec.status != "live":
            raise EpisodeEnded(f"episode {self.id} has ended ({rec.status})",
                               code=f"episode_{rec.status}", status=409)
        if not rec.tokens:
            raise ValueError("observe the prompt before the first turn")
        s = sampling or rec.sampling
        headers = {H_EPISODE: self.id, H_EPISODE_POLICY: rec.policy}
        if rec.group is not None:
            headers[H_EPISODE_GROUP] = rec.group
        body: dict[str, Any] = {"model": self.model, "prompt": list(rec.tokens),
                                "logprobs": 0, "return_token_ids": True, **s.body()}
        started, t0 = time.time(), time.monotonic()
        try:
            r = self.http.post("/v1/completions", json=body, headers=headers)
        except httpx.HTTPError as e:
            raise GroupError(f"the gateway did not answer: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            code = refusal_code(r)
            if code is not None and code.startswith("episode_") and code != \
                    "episode_policy_fixed":
                rec.status = code.removeprefix("episode_")
                raise EpisodeEnded(f"episode {self.id}: {r.text[:300]}", code=code,
                                   status=r.status_code)
            raise GroupRefused(f"the gateway refused the turn: HTTP {r.status_code}: "
                               f"{r.text[:300]}", code=code, status=r.status_code)
        h = r.headers
        try:
            binding = binding_from_headers(h)
            segment, index = int(h[H_SEGMENT]), int(h[H_TURN])
            c = r.json()["choices"][0]
            tokens = tuple(int(t) for t in c["token_ids"])
            lps = tuple(float(v) for v in c["logprobs"]["token_logprobs"])
        except (KeyError, ValueError, TypeError, IndexError) as e:
            raise GroupError(f"the gateway's answer lacks its binding or tokens: {e}") from None
        if len(lps) != len(tokens):
            raise GroupError(f"turn {index}: {len(lps)} logprobs for {len(tokens)} tokens")
        t = Turn(index, segment, len(rec.tokens), tokens, lps, c.get("finish_reason"),
                 binding, h[H_ENGINE], h[H_LABEL], started, time.monotonic() - t0)
        rec.turns.append(t)
        rec.tokens += tokens
        rec.mask += [True] * len(tokens)
        rec.logprobs += list(lps)
        return t

    def end(self, reward: float | None) -> str:
        """End the episode (its hold released); its final status."""
        rec = self.record
        rec.reward = reward
        if rec.status != "live":
            return rec.status
        if not rec.turns:  # never admitted: nothing to release
            rec.status = "done"
            return rec.status
        try:
            r = self.http.post(f"/v1/episodes/{self.id}/end")
            rec.status = str(r.json()["status"]) if r.status_code == 200 else "lost"
        except (httpx.HTTPError, ValueError, KeyError) as e:
            raise GroupError(f"ending episode {self.id}: {type(e).__name__}: {e}") from None
        return rec.status


__all__ = ["Episode", "EpisodeEnded", "EpisodeRecord", "Turn", "segments_of"]
