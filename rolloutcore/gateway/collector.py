"""Trajectory records of gateway requests: what the engine answered, bound to the
binding the journal holds (rollout id, generation, identity, admission seq).

The tokens come from the engine itself: with records on, the gateway asks vLLM for
token ids (``return_token_ids: true``) when the client did not, and then blanks them
(``null``, what vLLM sends without the flag) in the answer the client sees. A record is
written for an answer with exactly one choice (one rollout, one record: ``records
verify`` rejects a second record for one admission); others are counted as skipped.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from rolloutcore.engine.controller import Binding
from rolloutcore.trajectories.format import (
    Decoding,
    EpisodeTurn,
    RecordError,
    Segment,
    Timing,
    TrajectoryRecord,
    dumps,
)

#: Response fields vLLM fills only when asked for token ids.
TOKEN_FIELDS = ("token_ids", "prompt_token_ids")


def wants_injection(endpoint: str, body: dict[str, Any]) -> bool:
    """Must the gateway ask for token ids itself (the client did not)?"""
    return endpoint in ("completions", "chat") and body.get("return_token_ids") is not True


def blank_token_ids(obj: Any) -> None:
    """Undo the injected flag in one answer (or stream chunk), in place."""
    if not isinstance(obj, dict):
        return
    for key in TOKEN_FIELDS:
        if obj.get(key) is not None:
            obj[key] = None
    for choice in obj.get("choices") or ():
        if isinstance(choice, dict):
            for key in TOKEN_FIELDS:
                if choice.get(key) is not None:
                    choice[key] = None


class Collector:
    """Accumulates one request's answer (whole, or chunk by chunk) into a record."""

    def __init__(self, endpoint: str, request: dict[str, Any]) -> None:
        self.endpoint = endpoint
        self.request = request
        self.prompt: list[int] | None = None
        self.tokens: list[int] = []
        self.logprobs: list[float] | None = [] if request.get("logprobs") else None
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.multi = False  # more than one choice: no record
        self.broken: str | None = None

    def feed(self, obj: Any) -> None:
        """One answer body (non-streaming) or one stream chunk."""
        if not isinstance(obj, dict):
            return
        top = obj.get("prompt_token_ids")  # chat: on the answer / the first chunk
        if isinstance(top, list):
            self.prompt = top
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                self.multi = True
                continue
            ptoks = choice.get("prompt_token_ids")
            if isinstance(ptoks, list):
                self.prompt = ptoks
            toks = choice.get("token_ids")
            if isinstance(toks, list):
                self.tokens.extend(toks)
            self._logprobs(choice.get("logprobs"))
            if choice.get("finish_reason") is not None:
                self.finish_reason = str(choice["finish_reason"])
                sr = choice.get("stop_reason")
                self.stop_reason = sr if isinstance(sr, str | int) else None

    def _logprobs(self, lp: Any) -> None:
        if self.logprobs is None or not isinstance(lp, dict):
            return
        if self.endpoint == "chat":
            values = [c.get("logprob") for c in lp.get("content") or () if isinstance(c, dict)]
        else:
            values = list(lp.get("token_logprobs") or ())
        for v in values:
            if not isinstance(v, int | float):
                self.broken = "a logprob that is not a number"
                return
            self.logprobs.append(float(v))

    def max_tokens(self) -> int:
        """The request's token limit; vLLM's default if it names none: 16 for completions,
        the model's room for chat (here: what it generated)."""
        max_tokens = self.request.get("max_tokens", self.request.get("max_completion_tokens"))
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
            return max_tokens
        return 16 if self.endpoint == "completions" else max(1, len(self.tokens))

    def decoding(self) -> Decoding:
        r = self.request
        temperature = r.get("temperature")
        top_p = r.get("top_p")
        max_tokens = self.max_tokens()
        stop = r.get("stop")
        stops = (stop,) if isinstance(stop, str) else tuple(s for s in stop or ()
                                                            if isinstance(s, str))
        seed = r.get("seed")
        min_tokens = r.get("min_tokens", 0)
        return Decoding(
            1.0 if temperature is None else float(temperature),
            1.0 if top_p is None else float(top_p), max_tokens,
            min_tokens if isinstance(min_tokens, int) and not isinstance(min_tokens, bool)
            else 0, stops, seed if isinstance(seed, int) and not isinstance(seed, bool)
            else None)

    def record(self, binding: Binding, label: str, started_at: float, seconds: float,
               segments: tuple[Segment, ...] = (), *, broken: bool = False,
               episode: EpisodeTurn | None = None) -> TrajectoryRecord | str:
        """The record, or why there is none (``broken``: the stream broke off mid-way,
        the record holds what came before the break)."""
        if self.multi:
            return "more than one choice"
        if self.broken:
            return self.broken
        if not self.prompt:
            return "the engine sent no prompt token ids"
        if binding.aborted:
            return "released as aborted by the drain (partial output)"
        logprobs = self.logprobs
        if logprobs is not None and len(logprobs) != len(self.tokens):
            logprobs = None  # the engine did not give one per token: keep none
        try:
            return TrajectoryRecord(
                binding=Binding(binding.rollout_id, binding.generation, binding.identity,
                                binding.seq),
                label=label, prompt_token_ids=tuple(self.prompt),
                response_token_ids=tuple(self.tokens),
                logprobs=None if logprobs is None else tuple(logprobs),
                decoding=self.decoding(), finish_reason=self.finish_reason,
                stop_reason=self.stop_reason, timing=Timing(started_at, max(0.0, seconds)),
                segments=segments, broken=broken, episode=episode)
        except (RecordError, TypeError, ValueError) as e:
            return f"not a valid record: {e}"


class RecordWriter:
    """Appends JSON-lines records (thread-safe; each line flushed as written)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        self.written = 0

    def write(self, record: TrajectoryRecord) -> None:
        line = dumps(record) + "\n"
        with self._lock:
            self._fh.write(line)
            self._fh.flush()
            self.written += 1

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def parse_sse_events(buffer: bytearray) -> list[bytes]:
    """Cut complete SSE events (ending with a blank line) off the front of ``buffer``."""
    out: list[bytes] = []
    while True:
        i = buffer.find(b"\n\n")
        if i < 0:
            return out
        out.append(bytes(buffer[:i + 2]))
        del buffer[:i + 2]


def event_data(event: bytes) -> bytes | None:
    """The ``data:`` payload of one SSE event (vLLM sends one data line per event)."""
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None


def rewrite_event(event: bytes, obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() \
        + b"\n\n"


__all__ = ["Collector", "RecordWriter", "blank_token_ids", "event_data", "parse_sse_events",
           "rewrite_event", "wants_injection"]
