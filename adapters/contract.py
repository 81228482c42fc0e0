"""The adapter contract: one operation per external step, each returning typed evidence.

Adapters observe; they never decide. Evidence records what was seen (HTTP status, the
body, counters, read-backs); :mod:`rolloutcore.engine.postconditions` turns it into the
spec outcome the controller takes. No field of any evidence type means "ok": an
adapter cannot advance the controller by saying so.

Every call but ``generate`` takes the step's ``deadline`` (an absolute
``time.monotonic()`` value): the one deadline the runner's policy states for the step,
from which the adapter derives its transport timeouts, so that no transport default
outlives (or cuts short) what the user asked for. Evidence types encode to and from
JSON (:func:`evidence_to_json`, :func:`evidence_from_json`): the journal keeps the
evidence each outcome was decided on, and the trace checker decides again from it.
"""

from __future__ import annotations

import dataclasses
import math
import time
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from rolloutcore.errors import RolloutCoreError


class PauseMode(StrEnum):
    ABORT = "abort"  # in-flight requests end now with partial output
    WAIT = "wait"  # the call returns once in-flight requests have finished
    KEEP = "keep"  # in-flight requests freeze and continue after resume (on new weights!)


class MutationOutcome(StrEnum):
    COMPLETED = "completed"  # the mutation's own finalisation ran and reported success
    NOT_MUTATED = "not_mutated"  # proof that nothing moved (refused before any byte)
    AMBIGUOUS = "ambiguous"  # may or may not have happened: timeout, death, unclassifiable


class AdapterError(RolloutCoreError):
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
    identity: str  # content identity of the weights (see rolloutcore.engine.identity)
    source: str  # checkpoint directory, or a transfer source description
    probe_prompt: tuple[int, ...]
    probe_tokens: tuple[int, ...]  # greedy reference output of the target weights
    nbytes: int = 0  # bytes the mutation moves (sizes the mutation's deadline)
    #: Reference log-probability of each prompt token after the first (one prefill of
    #: the target weights, computed on the source side): the scored probe's reference.
    probe_logprobs: tuple[float, ...] | None = None
    #: A LoRA adapter update: the name the engine serves the adapter under; ``source`` is
    #: then the adapter's directory and ``identity`` names base and adapter
    #: (:func:`rolloutcore.engine.identity.with_adapter`). None: the base weights change.
    adapter: str | None = None

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
    #: Scored probe: the engine's log-probability of each prompt token after the first.
    prompt_logprobs: tuple[float | None, ...] | None = None


@dataclass(frozen=True)
class FenceEvidence:
    """What a TAINTED engine reads as after the fence (pause in abort mode, relabel)."""

    label: str  # the taint label asked for
    pause_status: int | None
    label_status: int | None
    paused_read_back: bool | None
    label_read_back: str | None
    running_after: int | None
    error: str | None = None


@dataclass(frozen=True)
class EpochEvidence:
    """An engine's answer to a controller's fence (controller failover): whether it took
    ``epoch`` as its fencing token, and its token after the call."""

    epoch: int
    accepted: bool
    seen: int | None  # None: the engine's token could not be read
    error: str | None = None


@dataclass(frozen=True)
class RankStage:
    """What one rank of an engine says its staging buffer holds (staged updates): the
    digest of the bytes it received (names, dtypes, shapes and bytes, the identity
    definition of :mod:`rolloutcore.engine.identity`), whether every byte arrived, and
    what went wrong on the way. Its receive kind is decided from this
    (:func:`rolloutcore.engine.postconditions.receive_kind`), never reported."""

    rank: int  # 1-based
    identity: str | None  # digest of the staged bytes (None: none, or unreadable)
    complete: bool  # the whole shard arrived (a stream cut short: False)
    tensors: int = 0
    nbytes: int = 0
    error: str | None = None  # a chunk that failed its digest, a refusal, the deadline
    seconds: float = 0.0


@dataclass(frozen=True)
class StageEvidence:
    """Every rank's staging buffer after a staging (one :class:`RankStage` per rank the
    engine has; ``ranks`` is how many it has, as it reports itself)."""

    ranks: int
    stages: tuple[RankStage, ...]
    observed: str
    seconds: float


@dataclass(frozen=True)
class GenerationResult:
    """A rollout's generation as the engine returned it."""

    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    finish_reason: str | None
    logprobs: tuple[float, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


def remaining(deadline: float, floor: float = 0.001) -> float:
    """Seconds left until ``deadline`` (a ``time.monotonic()`` value), at least ``floor``."""
    return max(deadline - time.monotonic(), floor)


@runtime_checkable
class LifecycleAdapter(Protocol):
    """Effects and observations of one engine. Every call returns by its ``deadline``
    (transport timeouts derived from it); idempotent calls may be retried by the runner
    within the same deadline, ``mutate`` never is."""

    def read_state(self, deadline: float) -> EngineReport: ...

    def pause(self, mode: PauseMode, deadline: float) -> PauseEvidence: ...

    def resume(self, deadline: float) -> ResumeEvidence: ...

    def mutate(self, target: WeightTarget, deadline: float) -> MutationEvidence: ...

    def reset_cache(self, tier: str, deadline: float) -> ResetEvidence: ...

    def probe(self, prompt: tuple[int, ...], max_tokens: int, deadline: float, *,
              scored: bool = False) -> ProbeEvidence:
        """Greedy: ``max_tokens`` tokens of output. Scored: one prefill returning the
        log-probability of every prompt token (``prompt_logprobs``), one token out."""
        ...

    def fence(self, label: str, deadline: float) -> FenceEvidence: ...

    def generate(self, prompt: tuple[int, ...], max_tokens: int) -> GenerationResult: ...


@runtime_checkable
class Stager(Protocol):
    """An engine that takes staged updates (spec/staged.py): ``stage`` fills inactive
    buffers on every rank while the engine serves (it never touches served weights, so
    any failure is a proof of no effect), ``install`` loads the staged buffers in the
    closed window (the lifecycle's mutation of a staged target), ``discard_stage`` drops
    them (best effort: they are inactive)."""

    def stage_ranks(self, deadline: float) -> int:
        """How many ranks the engine has (each stages its shard and reports on it)."""
        ...

    def stage(self, target: WeightTarget, deadline: float) -> StageEvidence: ...

    def install(self, target: WeightTarget, deadline: float) -> MutationEvidence: ...

    def discard_stage(self, deadline: float) -> None: ...


@runtime_checkable
class PeerSource(Protocol):
    """A stager other engines can stage from (inference to inference): ``peer_source``
    says where they read the bytes of ``identity`` this engine holds (its complete
    staging, or what it installed from one; AdapterError if it cannot serve them), and a
    staging of such a source shows ``peer_token``, which a fleet makes the same on all
    its members. Readers check what arrives against the target's identity, as from any
    source."""

    peer_token: str

    def peer_source(self, identity: str, deadline: float) -> str: ...


class EpochFenced(Protocol):
    """An adapter whose engine checks a controller's epoch where its effects happen (our
    worker extension and transfer backends): ``epoch`` goes with every fenced effect it
    sends; ``fence_epoch`` raises the engine's token."""

    epoch: int | None

    def fence_epoch(self, epoch: int, deadline: float) -> EpochEvidence: ...


# ------------------------------------------------------------------ JSON encoding

_EVIDENCE_TYPES: dict[str, type[Any]] = {c.__name__: c for c in (
    EngineReport, PauseEvidence, ResumeEvidence, MutationEvidence, ResetEvidence,
    ProbeEvidence, FenceEvidence, RankStage)}


def evidence_to_json(ev: Any) -> dict[str, Any]:
    """``{"type": <class name>, **fields}`` with tuples as lists and enums as strings."""
    if type(ev).__name__ not in _EVIDENCE_TYPES:
        raise TypeError(f"not an evidence type: {type(ev).__name__}")
    out: dict[str, Any] = {"type": type(ev).__name__}
    for f in dataclasses.fields(ev):
        v = getattr(ev, f.name)
        out[f.name] = list(v) if isinstance(v, tuple) else (
            dict(v) if isinstance(v, Mapping) else v)
    return out


_HINTS: dict[type[Any], dict[str, Any]] = {}


def type_hints(cls: type[Any]) -> dict[str, Any]:
    """``cls``'s field types, resolved once."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def conforms(v: Any, hint: Any) -> bool:
    """Whether JSON value ``v`` is of the field type ``hint`` (the evidence classes' own
    annotations: a bool is no int, an int is a float, a tuple is a JSON list)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return any(conforms(v, a) for a in args)
    if hint is type(None):
        return v is None
    if hint is bool:
        return type(v) is bool
    if hint is int:
        return type(v) is int
    if hint is float:
        return type(v) in (int, float) and math.isfinite(v)
    if hint is str:
        return type(v) is str
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return type(v) is str and v in {m.value for m in hint}
    if origin is tuple:
        return isinstance(v, list) and all(conforms(x, args[0]) for x in v)
    if origin in (Mapping, dict) or hint is Mapping:
        return isinstance(v, dict)
    return True  # Any


def type_name(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("collections.abc.", "")


class EvidenceFormatError(RolloutCoreError, ValueError):
    """A journalled evidence object that is not one of the contract's evidence types."""


def evidence_from_json(d: Any) -> Any:
    """The evidence object ``d`` encodes; :class:`EvidenceFormatError` if it encodes none."""
    if not isinstance(d, Mapping):
        raise EvidenceFormatError(f"evidence is not an object: {type(d).__name__}")
    cls = _EVIDENCE_TYPES.get(str(d.get("type")))
    if cls is None:
        raise EvidenceFormatError(f"unknown evidence type {d.get('type')!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names - {"type"}
    if unknown:
        raise EvidenceFormatError(f"{cls.__name__}: unknown field(s) {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    hints = type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in d:
            if f.default is dataclasses.MISSING:
                raise EvidenceFormatError(f"{cls.__name__}: missing field {f.name!r}")
            continue
        v = d[f.name]
        if not conforms(v, hints[f.name]):
            raise EvidenceFormatError(f"{cls.__name__}.{f.name} is not "
                                      f"{type_name(hints[f.name])}: {v!r:.40}")
        kwargs[f.name] = tuple(v) if isinstance(v, list) else v
    if cls is PauseEvidence:
        kwargs["mode"] = PauseMode(kwargs["mode"])
    if cls is MutationEvidence:
        kwargs["outcome"] = MutationOutcome(kwargs["outcome"])
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise EvidenceFormatError(f"{cls.__name__}: {e}") from None
