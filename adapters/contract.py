"""The adapter contract: one operation per external step, each returning typed evidence.

Adapters observe; they never decide. Evidence records what was seen (HTTP status, the
body, counters, read-backs); :mod:`rolloutcore.postconditions` turns it into the
spec outcome the controller takes. No field of any evidence type means "ok": an
adapter cannot advance the controller by saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable


class PauseMode(StrEnum):
    ABORT = "abort"  # in-flight requests end now with partial output
    WAIT = "wait"  # the call returns once in-flight requests have finished
    KEEP = "keep"  # in-flight requests freeze and continue after resume (on new weights!)


class MutationOutcome(StrEnum):
    COMPLETED = "completed"  # the mutation's own finalisation ran and reported success
    NOT_MUTATED = "not_mutated"  # proof that nothing moved (refused before any byte)
    AMBIGUOUS = "ambiguous"  # may or may not have happened: timeout, death, unclassifiable


class AdapterError(Exception):
    """An operation could not be carried out. ``proven_no_effect`` says whether the adapter
    can prove the engine was not changed (e.g. refused before sending anything)."""

    def __init__(self, message: str, *, proven_no_effect: bool = False) -> None:
        super().__init__(message)
        self.proven_no_effect = proven_no_effect


@dataclass(frozen=True)
class WeightTarget:
    """What an update installs: the generation, its label, the identity of its weights, where
    its tensors come from, and the probe the engine must then reproduce."""

    generation: int
    label: str
    identity: str  # content identity of the weights (see rolloutcore.identity)
    source: str  # checkpoint directory, or a transfer source description
    probe_prompt: tuple[int, ...]
    probe_tokens: tuple[int, ...]  # greedy reference output of the target weights
    nbytes: int = 0  # bytes the mutation moves (sizes the mutation's deadline)

    def __post_init__(self) -> None:
        if self.generation < 1:
            raise ValueError(f"generation must be >= 1, got {self.generation}")
        if not self.label or not self.identity:
            raise ValueError("a target needs a label and an identity")
        if not self.probe_prompt or not self.probe_tokens:
            raise ValueError("a target needs a probe prompt and its reference tokens")


@dataclass(frozen=True)
class EngineReport:
    """A read of the engine's version, identity and run state."""

    label: str | None  # the version label the engine reports
    identity: str | None  # identity of the weights as the engine holds them (None: unknown)
    paused: bool | None  # None: could not be read
    running_requests: int | None


@dataclass(frozen=True)
class PauseEvidence:
    mode: PauseMode
    http_status: int | None
    body: Mapping[str, Any] | None
    paused_read_back: bool | None  # is_paused read after the call
    running_after: int | None  # requests the engine still runs after the call


@dataclass(frozen=True)
class ResumeEvidence:
    http_status: int | None
    body: Mapping[str, Any] | None
    paused_read_back: bool | None


@dataclass(frozen=True)
class MutationEvidence:
    outcome: MutationOutcome
    observed: str  # what was seen, in words (for the journal)
    seconds: float
    bytes_moved: int | None = None


@dataclass(frozen=True)
class ResetEvidence:
    tier: str
    http_status: int | None
    body_success: bool | None  # None: empty or unreadable body
    entries_after: int | None = None  # tier size read from the engine after the reset
    tier_absent: bool = False  # the engine proves it has no such cache (e.g. text-only)


@dataclass(frozen=True)
class ProbeEvidence:
    prompt: tuple[int, ...]
    tokens: tuple[int, ...] | None  # None: the request failed
    http_status: int | None
    finish_reason: str | None
    prefix_hits: int | None = None  # prefix-cache hits caused by this request (counters)
    logprobs: tuple[float, ...] | None = None
    error: str | None = None


@dataclass(frozen=True)
class GenerationResult:
    """A rollout's generation as the engine returned it."""

    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    finish_reason: str | None
    logprobs: tuple[float, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class LifecycleAdapter(Protocol):
    """Effects and observations of one engine. Every call has its own deadline; idempotent
    calls may be retried by the runner, ``mutate`` never is."""

    def read_state(self) -> EngineReport: ...

    def pause(self, mode: PauseMode) -> PauseEvidence: ...

    def resume(self) -> ResumeEvidence: ...

    def mutate(self, target: WeightTarget) -> MutationEvidence: ...

    def reset_cache(self, tier: str) -> ResetEvidence: ...

    def probe(self, prompt: tuple[int, ...], max_tokens: int) -> ProbeEvidence: ...

    def generate(self, prompt: tuple[int, ...], max_tokens: int) -> GenerationResult: ...
