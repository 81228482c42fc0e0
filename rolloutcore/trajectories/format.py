"""Trajectory records: what one finished rollout produced, bound to the weights that made it.

A :class:`TrajectoryRecord` holds the rollout's :class:`~rolloutcore.engine.controller.Binding`
(rollout id, committed generation, identity of its weights, admission sequence number),
the generation's label, the prompt and response token ids, the behaviour log-probabilities
exactly as the engine reported them (vLLM's default ``logprobs_mode`` is ``raw_logprobs``:
log-softmax of the raw logits, before temperature, top-p or the ``min_tokens`` EOS mask),
the decoding configuration, the finish/stop reason and timing.

The record has no version field of its own: :attr:`TrajectoryRecord.version` *is*
``binding.generation``, so a record cannot claim a version its binding does not hold, and
:func:`record_from` takes the version from nowhere but the binding.

Two on-disk forms, both carrying :data:`SCHEMA_VERSION` and both round-tripping exactly
(float64 values are written with Python's shortest exact repr in JSON and as float64 in
Parquet): JSON lines (:func:`write_jsonl` / :func:`iter_jsonl`) and Parquet
(:func:`write_parquet` / :func:`iter_parquet`). The ``iter_*`` readers stream (a line or
a record batch at a time); the ``read_*`` ones are list-building wrappers for small files.
Readers refuse unknown schema versions, unknown or missing fields and ill-typed values with
a :class:`RecordError` naming the line or row.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rolloutcore.adapters.contract import GenerationResult
from rolloutcore.engine.controller import Binding
from rolloutcore.errors import BadInput
from rolloutcore.inputs import file_problem

#: 2: the binding says whether the drain aborted the rollout; 3: a migrated rollout's
#: segments; 4: the sample's index in its admission's group, and which logprobs these are;
#: 5: whether the rollout broke off (its engine failed mid-stream: a partial response);
#: 6: which turn of an agentic episode it is (null: none).
SCHEMA_VERSION = 6
SCHEMA_NAME = "rolloutcore.trajectory"
_PARQUET_META_KEY = b"rolloutcore.trajectory.schema_version"


class RecordError(BadInput, ValueError):
    """A record (or a file of records) is malformed or of an unsupported schema."""


# ------------------------------------------------------------------------- value checks


def _int(v: Any, what: str, *, minimum: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise RecordError(f"{what}: expected an integer, got {type(v).__name__} {v!r}")
    if minimum is not None and v < minimum:
        raise RecordError(f"{what}: must be >= {minimum}, got {v}")
    return v


def _float(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise RecordError(f"{what}: expected a number, got {type(v).__name__} {v!r}")
    f = float(v)
    if not math.isfinite(f):
        raise RecordError(f"{what}: must be finite, got {f!r}")
    return f


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise RecordError(f"{what}: expected a string, got {type(v).__name__} {v!r}")
    return v


def _opt_str(v: Any, what: str) -> str | None:
    return None if v is None else _str(v, what)


def _seq(v: Any, what: str) -> Sequence[Any]:
    if isinstance(v, str | bytes) or not isinstance(v, Sequence):
        raise RecordError(f"{what}: expected a list, got {type(v).__name__}")
    return v


def _ints(v: Any, what: str) -> tuple[int, ...]:
    return tuple(_int(x, f"{what}[{i}]", minimum=0) for i, x in enumerate(_seq(v, what)))


def _floats(v: Any, what: str) -> tuple[float, ...]:
    return tuple(_float(x, f"{what}[{i}]") for i, x in enumerate(_seq(v, what)))


def _exact_keys(d: Any, what: str, required: Iterable[str]) -> Mapping[str, Any]:
    if not isinstance(d, Mapping):
        raise RecordError(f"{what}: expected an object, got {type(d).__name__}")
    want = set(required)
    have = set(d)
    if have != want:
        parts = []
        if want - have:
            parts.append("missing " + ", ".join(sorted(want - have)))
        if have - want:
            parts.append("unknown " + ", ".join(sorted(map(str, have - want))))
        raise RecordError(f"{what}: {'; '.join(parts)}")
    return d


# ---------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class Decoding:
    """The sampling parameters the rollout was generated with."""

    temperature: float
    top_p: float = 1.0
    max_tokens: int = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if _float(self.temperature, "decoding.temperature") < 0:
            raise RecordError(f"decoding.temperature: must be >= 0, got {self.temperature}")
        if not 0 < _float(self.top_p, "decoding.top_p") <= 1:
            raise RecordError(f"decoding.top_p: must be in (0, 1], got {self.top_p}")
        _int(self.max_tokens, "decoding.max_tokens", minimum=1)
        _int(self.min_tokens, "decoding.min_tokens", minimum=0)
        for i, s in enumerate(self.stop):
            _str(s, f"decoding.stop[{i}]")
        if self.seed is not None:
            _int(self.seed, "decoding.seed")

    def to_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p,
                "max_tokens": self.max_tokens, "min_tokens": self.min_tokens,
                "stop": list(self.stop), "seed": self.seed}

    @classmethod
    def from_dict(cls, d: Any) -> Decoding:
        d = _exact_keys(d, "decoding", ("temperature", "top_p", "max_tokens", "min_tokens",
                                        "stop", "seed"))
        seed = d["seed"]
        return cls(_float(d["temperature"], "decoding.temperature"),
                   _float(d["top_p"], "decoding.top_p"),
                   _int(d["max_tokens"], "decoding.max_tokens"),
                   _int(d["min_tokens"], "decoding.min_tokens"),
                   tuple(_str(s, "decoding.stop[]") for s in _seq(d["stop"], "decoding.stop")),
                   None if seed is None else _int(seed, "decoding.seed"))

    def request_fields(self) -> dict[str, Any]:
        """These parameters as vLLM ``/v1/completions`` body fields."""
        out: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p,
                               "max_tokens": self.max_tokens, "min_tokens": self.min_tokens}
        if self.stop:
            out["stop"] = list(self.stop)
        if self.seed is not None:
            out["seed"] = self.seed
        return out


@dataclass(frozen=True)
class Timing:
    """When the generation started (unix seconds) and how long it took (seconds)."""

    started_at: float
    seconds: float

    def __post_init__(self) -> None:
        _float(self.started_at, "timing.started_at")
        if _float(self.seconds, "timing.seconds") < 0:
            raise RecordError(f"timing.seconds: must be >= 0, got {self.seconds}")

    def to_dict(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: Any) -> Timing:
        d = _exact_keys(d, "timing", ("started_at", "seconds"))
        return cls(_float(d["started_at"], "timing.started_at"),
                   _float(d["seconds"], "timing.seconds"))


@dataclass(frozen=True)
class Segment:
    """The part of a migrated rollout's response one member generated: tokens
    ``[start, end)``, under the admission at journal seq ``seq``, on generation
    ``generation`` (``records verify`` checks each against the journal)."""

    engine: str
    seq: int
    generation: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if not _str(self.engine, "segments[].engine"):
            raise RecordError("segments[].engine: must not be empty")
        _int(self.seq, "segments[].seq", minimum=0)
        _int(self.generation, "segments[].generation", minimum=1)
        _int(self.start, "segments[].start", minimum=0)
        if _int(self.end, "segments[].end", minimum=0) < self.start:
            raise RecordError(f"segments[]: end {self.end} is before start {self.start}")

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "seq": self.seq, "generation": self.generation,
                "start": self.start, "end": self.end}

    @classmethod
    def from_dict(cls, d: Any) -> Segment:
        d = _exact_keys(d, "segments[]", _SEGMENT_KEYS)
        return cls(_str(d["engine"], "segments[].engine"), _int(d["seq"], "segments[].seq"),
                   _int(d["generation"], "segments[].generation"),
                   _int(d["start"], "segments[].start"), _int(d["end"], "segments[].end"))


_SEGMENT_KEYS = ("engine", "seq", "generation", "start", "end")


@dataclass(frozen=True)
class EpisodeTurn:
    """Which turn of which agentic episode a record is: its segment (the episode's
    binding it ran under, from 1) and its number in the episode (from 1). A turn's record
    is bound to its segment's admission; several turns share one."""

    episode: str
    segment: int
    turn: int
    group: str | None = None  # the group whose hold it ran under (its admission's name)

    def __post_init__(self) -> None:
        if not _str(self.episode, "episode.episode"):
            raise RecordError("episode.episode: must not be empty")
        _int(self.segment, "episode.segment", minimum=1)
        _int(self.turn, "episode.turn", minimum=1)
        if self.group is not None and not _str(self.group, "episode.group"):
            raise RecordError("episode.group: must not be empty (null: no group)")

    @property
    def holder(self) -> str:
        """What its admission is named after: its group, or itself."""
        return self.group or self.episode

    def to_dict(self) -> dict[str, Any]:
        return {"episode": self.episode, "segment": self.segment, "turn": self.turn,
                "group": self.group}

    @classmethod
    def from_dict(cls, d: Any) -> EpisodeTurn:
        d = _exact_keys(d, "episode", ("episode", "segment", "turn", "group"))
        return cls(_str(d["episode"], "episode.episode"), _int(d["segment"], "episode.segment"),
                   _int(d["turn"], "episode.turn"), _opt_str(d["group"], "episode.group"))

_BINDING_KEYS = ("rollout_id", "generation", "identity", "seq", "aborted")
_RECORD_KEYS = ("schema", "schema_version", "binding", "label", "prompt_token_ids",
                "response_token_ids", "logprobs", "logprobs_mode", "decoding", "finish_reason",
                "stop_reason", "timing", "segments", "sample", "broken", "episode")
#: vLLM's ``logprobs_mode`` values: ``raw_*`` before any processing (temperature, top-k,
#: top-p, penalties, the min_tokens mask), ``processed_*`` after it.
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits")


@dataclass(frozen=True)
class TrajectoryRecord:
    """One finished rollout. ``version`` is the binding's generation, never anything else."""

    binding: Binding
    label: str
    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None  # behaviour logprobs of the response tokens
    decoding: Decoding
    finish_reason: str | None
    stop_reason: str | int | None  # vLLM's: the stop string or token id that matched
    timing: Timing
    #: A migrated rollout's parts, in order (empty: it ran on its binding's admission
    #: alone). The first is the binding's admission; together they span the response.
    segments: tuple[Segment, ...] = ()
    #: Its index among the samples of one admission (a group of ``n`` samples of one
    #: prompt is one admission; ``records verify`` takes one record per sample).
    sample: int = 0
    #: Which values ``logprobs`` holds, as the writer observed it on the engine (one of
    #: :data:`LOGPROBS_MODES`); None: not observed (vLLM's default is raw_logprobs).
    logprobs_mode: str | None = None
    #: Its engine failed mid-stream: the response is what came before the break (never a
    #: finished rollout; a trainer leaves it out or treats it as truncated).
    broken: bool = False
    #: An agentic episode's turn (None: a rollout of its own).
    episode: EpisodeTurn | None = None
    schema_version: int = field(default=SCHEMA_VERSION)

    def __post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise RecordError(f"schema_version {self.schema_version!r} is not supported "
                              f"(this build reads {SCHEMA_VERSION})")
        b = self.binding
        if not isinstance(b, Binding):
            raise RecordError(f"binding: expected a Binding, got {type(b).__name__}")
        if not _str(b.rollout_id, "binding.rollout_id"):
            raise RecordError("binding.rollout_id: must not be empty")
        _int(b.generation, "binding.generation", minimum=1)
        _opt_str(b.identity, "binding.identity")
        _int(b.seq, "binding.seq", minimum=0)
        if not isinstance(b.aborted, bool):
            raise RecordError(f"binding.aborted: expected a boolean, got {b.aborted!r}")
        if not _str(self.label, "label"):
            raise RecordError("label: must not be empty")
        for name in ("prompt_token_ids", "response_token_ids"):
            v = getattr(self, name)
            if not isinstance(v, tuple):
                raise RecordError(f"{name}: expected a tuple")
            _ints(v, name)
        if not self.prompt_token_ids:
            raise RecordError("prompt_token_ids: must not be empty")
        if self.logprobs is not None:
            if not isinstance(self.logprobs, tuple):
                raise RecordError("logprobs: expected a tuple")
            _floats(self.logprobs, "logprobs")
            if len(self.logprobs) != len(self.response_token_ids):
                raise RecordError(f"logprobs: {len(self.logprobs)} values for "
                                  f"{len(self.response_token_ids)} response tokens")
        if not isinstance(self.decoding, Decoding):
            raise RecordError("decoding: expected a Decoding")
        if not isinstance(self.timing, Timing):
            raise RecordError("timing: expected a Timing")
        _opt_str(self.finish_reason, "finish_reason")
        _int(self.sample, "sample", minimum=0)
        if not isinstance(self.broken, bool):
            raise RecordError(f"broken: expected a boolean, got {self.broken!r}")
        if self.logprobs_mode is not None and self.logprobs_mode not in LOGPROBS_MODES:
            raise RecordError(f"logprobs_mode: must be one of {', '.join(LOGPROBS_MODES)} or "
                              f"null, got {self.logprobs_mode!r}")
        if self.logprobs_mode is not None and self.logprobs is None:
            raise RecordError("logprobs_mode: names the mode of logprobs the record lacks")
        sr = self.stop_reason
        if sr is not None and not isinstance(sr, str):
            _int(sr, "stop_reason")
        if self.episode is not None and not isinstance(self.episode, EpisodeTurn):
            raise RecordError("episode: expected an EpisodeTurn")
        self._check_segments()

    def _check_segments(self) -> None:
        """Their shape only; whether the journal admitted each, on which generation, is
        ``records verify``'s to say."""
        segs = self.segments
        if not isinstance(segs, tuple) or not all(isinstance(x, Segment) for x in segs):
            raise RecordError("segments: expected a tuple of Segment")
        if not segs:
            return
        if len(segs) < 2:
            raise RecordError("segments: a rollout that was not migrated has none")
        if segs[0].seq != self.binding.seq:
            raise RecordError(f"segments: the first is admission {segs[0].seq}, the "
                              f"binding's is {self.binding.seq}")
        at = 0
        for i, x in enumerate(segs):
            if x.start != at:
                raise RecordError(f"segments[{i}]: starts at token {x.start}, the one "
                                  f"before ends at {at}")
            if i and x.seq <= segs[i - 1].seq:
                raise RecordError(f"segments[{i}]: admission {x.seq} is not after "
                                  f"{segs[i - 1].seq}")
            at = x.end
        if at != len(self.response_token_ids):
            raise RecordError(f"segments: they end at token {at}, the response has "
                              f"{len(self.response_token_ids)}")

    @property
    def version(self) -> int:
        """The committed generation that produced this rollout (the binding's)."""
        return self.binding.generation

    @property
    def identity(self) -> str | None:
        return self.binding.identity

    @property
    def rollout_id(self) -> str:
        return self.binding.rollout_id

    def to_dict(self) -> dict[str, Any]:
        b = self.binding
        return {
            "schema": SCHEMA_NAME,
            "schema_version": self.schema_version,
            "binding": {"rollout_id": b.rollout_id, "generation": b.generation,
                        "identity": b.identity, "seq": b.seq, "aborted": b.aborted},
            "label": self.label,
            "prompt_token_ids": list(self.prompt_token_ids),
            "response_token_ids": list(self.response_token_ids),
            "logprobs": None if self.logprobs is None else list(self.logprobs),
            "logprobs_mode": self.logprobs_mode,
            "decoding": self.decoding.to_dict(),
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
            "timing": self.timing.to_dict(),
            "segments": [x.to_dict() for x in self.segments],
            "sample": self.sample,
            "broken": self.broken,
            "episode": None if self.episode is None else self.episode.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Any) -> TrajectoryRecord:
        if not isinstance(d, Mapping):
            raise RecordError(f"record: expected an object, got {type(d).__name__}")
        if d.get("schema") != SCHEMA_NAME:
            raise RecordError(f"schema: expected {SCHEMA_NAME!r}, got {d.get('schema')!r}")
        sv = d.get("schema_version")
        if sv != SCHEMA_VERSION or isinstance(sv, bool):
            raise RecordError(f"schema_version {sv!r} is not supported (this build reads "
                              f"{SCHEMA_VERSION})")
        d = _exact_keys(d, "record", _RECORD_KEYS)
        episode = d["episode"]
        b = _exact_keys(d["binding"], "binding", _BINDING_KEYS)
        binding = Binding(_str(b["rollout_id"], "binding.rollout_id"),
                          _int(b["generation"], "binding.generation"),
                          _opt_str(b["identity"], "binding.identity"),
                          _int(b["seq"], "binding.seq"), aborted=b["aborted"])
        lp = d["logprobs"]
        sr = d["stop_reason"]
        if sr is not None and not isinstance(sr, str):
            sr = _int(sr, "stop_reason")
        return cls(binding=binding, label=_str(d["label"], "label"),
                   prompt_token_ids=_ints(d["prompt_token_ids"], "prompt_token_ids"),
                   response_token_ids=_ints(d["response_token_ids"], "response_token_ids"),
                   logprobs=None if lp is None else _floats(lp, "logprobs"),
                   decoding=Decoding.from_dict(d["decoding"]),
                   finish_reason=_opt_str(d["finish_reason"], "finish_reason"),
                   stop_reason=sr, timing=Timing.from_dict(d["timing"]),
                   segments=tuple(Segment.from_dict(x)
                                  for x in _seq(d["segments"], "segments")),
                   sample=_int(d["sample"], "sample", minimum=0),
                   logprobs_mode=_opt_str(d["logprobs_mode"], "logprobs_mode"),
                   broken=d["broken"],
                   episode=None if episode is None else EpisodeTurn.from_dict(episode))


def record_from(binding: Binding, label: str, prompt: Sequence[int], result: GenerationResult,
                decoding: Decoding, timing: Timing) -> TrajectoryRecord:
    """The record of a rollout. Its version is ``binding.generation``: there is no other
    way to give one. ``result`` must be the generation of ``prompt``."""
    prompt_t = tuple(prompt)
    if tuple(result.prompt) != prompt_t:
        raise RecordError("the result is the generation of a different prompt")
    stop_reason = result.extra.get("stop_reason") if result.extra else None
    return TrajectoryRecord(
        binding=binding, label=label, prompt_token_ids=prompt_t,
        response_token_ids=tuple(result.tokens),
        logprobs=None if result.logprobs is None else tuple(result.logprobs),
        decoding=decoding, finish_reason=result.finish_reason, stop_reason=stop_reason,
        timing=timing)


def greedy(max_tokens: int) -> Decoding:
    """The decoding of :meth:`LifecycleAdapter.generate` as the HTTP and simulated adapters
    implement it: temperature 0 with ``min_tokens == max_tokens``."""
    return Decoding(0.0, 1.0, max_tokens, max_tokens)


# ------------------------------------------------------------------------------ JSON lines


def dumps(record: TrajectoryRecord) -> str:
    """One JSON line (no newline). Floats use Python's shortest exact repr."""
    return json.dumps(record.to_dict(), separators=(",", ":"), allow_nan=False)


def write_jsonl(path: str | os.PathLike[str], records: Iterable[TrajectoryRecord], *,
                append: bool = False) -> int:
    n = 0
    with open(path, "a" if append else "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(dumps(r) + "\n")
            n += 1
    return n


def _reject_constant(name: str) -> Any:
    raise RecordError(f"non-finite number {name} is not allowed")


#: The longest JSON line read (bytes): a record with a million-token context is well
#: below it. Longer lines are refused before being parsed, so memory stays bounded.
MAX_LINE = 16 << 20


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, TrajectoryRecord]]:
    """Stream ``(line number, record)`` from a JSON-lines file, one line in memory at a
    time; blank lines are skipped. The first bad line raises :class:`RecordError`."""
    with open(path, "rb") as fh:
        lineno = 0
        while raw := fh.readline(MAX_LINE + 1):
            lineno += 1
            if len(raw) > MAX_LINE:
                raise RecordError(f"{path}:{lineno}: line longer than {MAX_LINE} bytes")
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
                rec = TrajectoryRecord.from_dict(obj)
            except RecordError as e:
                raise RecordError(f"{path}:{lineno}: {e}") from None
            except UnicodeDecodeError:
                raise RecordError(f"{path}:{lineno}: not UTF-8 text") from None
            except (ValueError, RecursionError) as e:
                raise RecordError(f"{path}:{lineno}: not JSON: {e}") from None
            yield lineno, rec


def read_jsonl(path: str | os.PathLike[str]) -> list[TrajectoryRecord]:
    return [r for _, r in iter_jsonl(path)]


# --------------------------------------------------------------------------------- Parquet


def _arrow_schema() -> Any:
    import pyarrow as pa

    binding = pa.struct([("rollout_id", pa.string()), ("generation", pa.int64()),
                         ("identity", pa.string()), ("seq", pa.int64()),
                         ("aborted", pa.bool_())])
    decoding = pa.struct([("temperature", pa.float64()), ("top_p", pa.float64()),
                          ("max_tokens", pa.int64()), ("min_tokens", pa.int64()),
                          ("stop", pa.list_(pa.string())), ("seed", pa.int64())])
    timing = pa.struct([("started_at", pa.float64()), ("seconds", pa.float64())])
    return pa.schema(
        [("schema", pa.string()), ("schema_version", pa.int64()), ("binding", binding),
         ("label", pa.string()), ("prompt_token_ids", pa.list_(pa.int64())),
         ("response_token_ids", pa.list_(pa.int64())), ("logprobs", pa.list_(pa.float64())),
         ("logprobs_mode", pa.string()), ("decoding", decoding), ("finish_reason", pa.string()),
         # a stop reason is a string or a token id: one column each, at most one set
         ("stop_reason_text", pa.string()), ("stop_reason_token", pa.int64()),
         ("timing", timing),
         ("segments", pa.list_(pa.struct([
             ("engine", pa.string()), ("seq", pa.int64()), ("generation", pa.int64()),
             ("start", pa.int64()), ("end", pa.int64())]))),
         ("sample", pa.int64()), ("broken", pa.bool_()),
         ("episode", pa.struct([("episode", pa.string()), ("segment", pa.int64()),
                                ("turn", pa.int64()), ("group", pa.string())]))],
        metadata={_PARQUET_META_KEY: str(SCHEMA_VERSION).encode()},
    )


def _to_row(r: TrajectoryRecord) -> dict[str, Any]:
    d = r.to_dict()
    sr = d.pop("stop_reason")
    d["stop_reason_text"] = sr if isinstance(sr, str) else None
    d["stop_reason_token"] = sr if isinstance(sr, int) else None
    return d


def _from_row(row: dict[str, Any]) -> TrajectoryRecord:
    text = row.pop("stop_reason_text", None)
    token = row.pop("stop_reason_token", None)
    if text is not None and token is not None:
        raise RecordError("stop reason is both a string and a token id")
    row["stop_reason"] = text if text is not None else token
    return TrajectoryRecord.from_dict(row)


#: Rows per Parquet row group written (a reader buffers one row group's column chunks).
PARQUET_ROW_GROUP = 1024
#: Rows per record batch read. A reader holds one batch as Python objects at a time:
#: with a few thousand tokens per record that is ~100 kB per row, so it is kept small.
PARQUET_BATCH = 64


def write_parquet(path: str | os.PathLike[str], records: Iterable[TrajectoryRecord]) -> int:
    import itertools

    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _arrow_schema()
    n = 0
    with pq.ParquetWriter(str(path), schema) as writer:
        it = iter(records)
        while chunk := [_to_row(r) for r in itertools.islice(it, PARQUET_ROW_GROUP)]:
            writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
            n += len(chunk)
    return n


def iter_parquet(path: str | os.PathLike[str]) -> Iterator[tuple[int, TrajectoryRecord]]:
    """Stream ``(row index, record)`` from a Parquet file, one record batch in memory at a
    time (row indices from 0). A bad file or row raises :class:`RecordError`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(str(path))
    except (OSError, pa.ArrowException) as e:
        raise RecordError(f"{path}: not a readable Parquet file: {e}") from None
    with pf:
        meta = pf.schema_arrow.metadata or {}
        sv = meta.get(_PARQUET_META_KEY)
        if sv != str(SCHEMA_VERSION).encode():
            raise RecordError(f"{path}: schema_version {sv.decode() if sv else None!r} is not "
                              f"supported (this build reads {SCHEMA_VERSION})")
        expected = _arrow_schema()
        if not pf.schema_arrow.remove_metadata().equals(expected.remove_metadata()):
            raise RecordError(f"{path}: columns differ from the trajectory schema "
                              f"v{SCHEMA_VERSION}: {pf.schema_arrow.names}")
        batches = pf.iter_batches(batch_size=PARQUET_BATCH)
        i = 0
        while True:
            try:
                batch = next(batches, None)
            except (OSError, pa.ArrowException) as e:
                raise RecordError(f"{path}: row {i}: not readable: {e}") from None
            if batch is None:
                return
            for row in batch.to_pylist():
                try:
                    rec = _from_row(row)
                except RecordError as e:
                    raise RecordError(f"{path}: row {i}: {e}") from None
                yield i, rec
                i += 1


def read_parquet(path: str | os.PathLike[str]) -> list[TrajectoryRecord]:
    return [r for _, r in iter_parquet(path)]


# ---------------------------------------------------------------------------- any format


def is_parquet(path: str | os.PathLike[str]) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"PAR1"
    except OSError:
        return False


def iter_records_at(path: str | os.PathLike[str]) -> Iterator[tuple[int, TrajectoryRecord]]:
    """Stream ``(position, record)`` from a JSON-lines or Parquet file (told apart by the
    Parquet magic): the position is the line number (JSON lines) or the row index
    (Parquet). Memory does not grow with the file."""
    p = Path(path)
    problem = file_problem(p)
    if problem:
        raise RecordError(problem)
    yield from (iter_parquet(p) if is_parquet(p) else iter_jsonl(p))


def iter_records(path: str | os.PathLike[str]) -> Iterator[TrajectoryRecord]:
    """The records of a JSON-lines or Parquet file, streamed."""
    return (r for _, r in iter_records_at(path))


def read_records(path: str | os.PathLike[str]) -> list[TrajectoryRecord]:
    """Records from a JSON-lines or Parquet file, as a list (small files)."""
    return list(iter_records(path))


def write_records(path: str | os.PathLike[str], records: Iterable[TrajectoryRecord]) -> int:
    """Parquet for ``*.parquet``, JSON lines otherwise."""
    if str(path).endswith(".parquet"):
        return write_parquet(path, records)
    return write_jsonl(path, records)


__all__ = ["SCHEMA_VERSION", "Decoding", "EpisodeTurn", "RecordError", "Segment", "Timing",
           "TrajectoryRecord", "dumps", "greedy", "iter_jsonl", "iter_parquet", "iter_records",
           "iter_records_at", "read_jsonl", "read_parquet", "read_records", "record_from",
           "write_jsonl", "write_parquet", "write_records"]
