"""The trainer's side of rollouts: groups of samples of one prompt through the gateway.

A group of ``n`` samples is ONE request (``n`` choices) and therefore one admission: one
member, one generation, the shared prompt's prefix computed once; released when the last
sample ends. Nothing can split it across generations: the binding is the admission's, and
a group an update interrupted (a sample aborted by the drain) is either returned whole
with its samples marked aborted (``Partial.WAIT``: the fleet waits for groups, so this
happens only under a drain that aborts) or resubmitted whole (``Partial.RESUBMIT``).

Each sample carries its token ids and the behaviour logprob of every sampled token as the
engine reported it; :attr:`Group.logprobs_mode` says which values those are (read from the
engines, see :func:`engine_logprobs_mode`). For temperature 1, top-p 1 and no top-k,
``raw_logprobs`` is the policy's own log-softmax: what the trainer recomputes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import httpx

from rolloutcore.engine.controller import Binding
from rolloutcore.errors import GatewayRefused, Refused
from rolloutcore.gateway.wire import (
    H_ENGINE,
    H_GENERATION,
    H_IDENTITY,
    H_LABEL,
    H_MAX_STALENESS,
    H_MIN_GENERATION,
    H_ROLLOUT,
    H_SEQ,
)
from rolloutcore.trajectories.format import LOGPROBS_MODES, Decoding, Timing, TrajectoryRecord

if TYPE_CHECKING:
    from rolloutcore.rl.episode import Episode


class Partial(StrEnum):
    """What happens to a group an update interrupts."""

    WAIT = "wait"          # the drain waits for it: it ends on its generation
    RESUBMIT = "resubmit"  # aborted by the drain: thrown away and generated again, whole


class GroupError(Refused, RuntimeError):
    """A group that could not be served whole (refused, broken, aborted too often)."""


class GroupRefused(GroupError, GatewayRefused):
    """The gateway refused the group: its refusal ``code`` (``stale``, ``fleet_closed``,
    ...) and HTTP ``status`` as the gateway sent them, for the trainer to act on."""


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_tokens: int = 16
    seed: int | None = None
    min_tokens: int = 0  # vLLM's: no end-of-sequence before that many tokens

    def __post_init__(self) -> None:
        # The record's Decoding checks the shared fields; top_k is ours.
        self.decoding()
        if self.top_k is not None and (isinstance(self.top_k, bool) or self.top_k < 1):
            raise ValueError(f"top_k must be a positive integer or None, got {self.top_k!r}")

    def decoding(self) -> Decoding:
        return Decoding(self.temperature, self.top_p, self.max_tokens, self.min_tokens, (),
                        self.seed)

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p,
                               "max_tokens": self.max_tokens}
        if self.top_k is not None:
            out["top_k"] = self.top_k
        if self.seed is not None:
            out["seed"] = self.seed
        if self.min_tokens:
            out["min_tokens"] = self.min_tokens
        return out


@dataclass(frozen=True)
class Sample:
    index: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # behaviour logprob of each sampled token
    finish_reason: str | None
    aborted: bool


@dataclass(frozen=True)
class Group:
    """``n`` samples of one prompt, bound to one admission."""

    prompt_ids: tuple[int, ...]
    samples: tuple[Sample, ...]
    binding: Binding
    engine: str
    label: str
    logprobs_mode: str
    sampling: Sampling
    started_at: float
    seconds: float
    attempts: int = 1

    @property
    def generation(self) -> int:
        return self.binding.generation

    @property
    def identity(self) -> str | None:
        return self.binding.identity

    @property
    def aborted(self) -> bool:
        return self.binding.aborted

    @property
    def nbytes(self) -> int:
        """What the group holds while queued: 8 bytes per token id and logprob."""
        return 8 * (len(self.prompt_ids) + sum(2 * len(s.token_ids) for s in self.samples))

    def records(self) -> list[TrajectoryRecord]:
        """One trajectory record per sample (``records verify`` checks each)."""
        timing = Timing(self.started_at, self.seconds)
        return [TrajectoryRecord(
            binding=self.binding, label=self.label, prompt_token_ids=self.prompt_ids,
            response_token_ids=s.token_ids, logprobs=s.logprobs,
            logprobs_mode=self.logprobs_mode, decoding=self.sampling.decoding(),
            finish_reason=s.finish_reason, stop_reason=None, timing=timing, sample=s.index)
            for s in self.samples]


def engine_logprobs_mode(urls: Iterable[str], *, timeout_s: float = 30.0) -> str:
    """The ``logprobs_mode`` every engine runs with, read from vLLM's ``/server_info``
    (development mode); raises :class:`GroupError` if one cannot be read or they differ."""
    modes: dict[str, Any] = {}
    for url in urls:
        try:
            r = httpx.get(f"{url.rstrip('/')}/server_info", params={"config_format": "json"},
                          timeout=timeout_s)
            cfg = r.json()["vllm_config"]["model_config"]
            modes[url] = cfg["logprobs_mode"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            raise GroupError(f"{url}: cannot read its logprobs_mode from /server_info "
                             f"({type(e).__name__}: {e})") from None
    found = set(modes.values())
    if len(found) != 1 or next(iter(found)) not in LOGPROBS_MODES:
        raise GroupError(f"engines disagree on logprobs_mode or name an unknown one: {modes}")
    return str(next(iter(found)))


class RolloutClient:
    """Groups through the gateway at ``base_url``."""

    def __init__(self, base_url: str, model: str, *, logprobs_mode: str,
                 timeout_s: float = 300.0, max_attempts: int = 3,
                 transport: httpx.BaseTransport | None = None) -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.logprobs_mode = logprobs_mode
        self.max_attempts = max_attempts
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout_s, transport=transport)
        self.resubmitted = 0  # groups thrown away and generated again

    def close(self) -> None:
        self.http.close()

    def episode(self, *, policy: str = "wait", sampling: Sampling | None = None,
                episode_id: str | None = None, group: str | None = None) -> Episode:
        """A multi-turn agentic episode (see :mod:`rolloutcore.rl.episode`); ``policy``:
        what an update of its member does to it (wait, abort or segment); ``group``: the
        episodes naming one group share one hold (one member, one generation per
        segment), as a group's samples share one admission."""
        from rolloutcore.rl.episode import Episode
        return Episode(self.http, self.model, policy=policy, logprobs_mode=self.logprobs_mode,
                       sampling=sampling or Sampling(), episode_id=episode_id, group=group)

    def generate_group(self, prompt_ids: Sequence[int], n: int, sampling: Sampling, *,
                       partial: Partial = Partial.WAIT, min_generation: int | None = None,
                       max_staleness: int | None = None) -> Group:
        """``n`` samples of ``prompt_ids``, served whole under one generation."""
        prompt = tuple(int(t) for t in prompt_ids)
        if not prompt:
            raise ValueError("prompt_ids must not be empty")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        headers = {}
        if min_generation is not None:
            headers[H_MIN_GENERATION] = str(min_generation)
        if max_staleness is not None:
            headers[H_MAX_STALENESS] = str(max_staleness)
        body = {"model": self.model, "prompt": list(prompt), "n": n, "logprobs": 0,
                "return_token_ids": True, **sampling.body()}
        for attempt in range(1, self.max_attempts + 1):
            started, t0 = time.time(), time.monotonic()
            try:
                r = self.http.post("/v1/completions", json=body, headers=headers)
            except httpx.HTTPError as e:
                raise GroupError(f"the gateway did not answer: {type(e).__name__}: {e}") from None
            group = self._group(r, prompt, n, sampling, started, time.monotonic() - t0,
                                attempt)
            if not group.aborted or partial is Partial.WAIT:
                return group
            self.resubmitted += 1
        raise GroupError(f"the group was aborted by a drain {self.max_attempts} times")

    def _group(self, r: httpx.Response, prompt: tuple[int, ...], n: int, sampling: Sampling,
               started: float, seconds: float, attempt: int) -> Group:
        if r.status_code != 200:
            raise GroupRefused(f"the gateway refused the group: HTTP {r.status_code}: "
                               f"{r.text[:300]}", code=refusal_code(r), status=r.status_code)
        h = r.headers
        try:
            binding = binding_from_headers(h)
            engine, label = h[H_ENGINE], h[H_LABEL]
            choices = r.json()["choices"]
        except (KeyError, ValueError) as e:
            raise GroupError(f"the gateway's answer lacks its binding or choices: {e}") from None
        samples: dict[int, Sample] = {}
        for c in choices:
            try:
                idx = int(c["index"])
                tokens = tuple(int(t) for t in c["token_ids"])
                lps = tuple(float(v) for v in c["logprobs"]["token_logprobs"])
                finish = c.get("finish_reason")
            except (KeyError, TypeError, ValueError) as e:
                raise GroupError(f"a choice without token ids or logprobs: {e}") from None
            if len(lps) != len(tokens):
                raise GroupError(f"choice {idx}: {len(lps)} logprobs for {len(tokens)} tokens")
            samples[idx] = Sample(idx, tokens, lps, finish, finish == "abort")
        if sorted(samples) != list(range(n)):
            raise GroupError(f"asked for {n} samples, the answer has {sorted(samples)}")
        aborted = any(s.aborted for s in samples.values())
        return Group(prompt, tuple(samples[i] for i in range(n)),
                     binding._replace(aborted=aborted), engine,
                     label, self.logprobs_mode, sampling, started, seconds, attempt)


def binding_from_headers(h: Mapping[str, str]) -> Binding:
    """The admission a gateway's answer names in its headers (rollout, generation, the
    weights' identity, the journal sequence number); KeyError or ValueError if it names
    none. Every client of the gateway reads it here."""
    return Binding(h[H_ROLLOUT], int(h[H_GENERATION]), h.get(H_IDENTITY) or None,
                   int(h[H_SEQ]))


def refusal_code(r: httpx.Response) -> str | None:
    """The OpenAI-style ``error.code`` of a refusal's body, if it has one."""
    try:
        code = r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) else None


__all__ = ["Group", "GroupError", "GroupRefused", "Partial", "RolloutClient", "Sample", "Sampling",
           "engine_logprobs_mode"]

