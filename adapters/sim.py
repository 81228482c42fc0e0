"""A simulated engine faithful to what conformance/VLLM_OBSERVED.md records of real vLLM,
and an adapter over it with fault injection at every step.

It exists for speed (exhaustive and property tests); every scenario it covers also runs
against the real server. What it reproduces:

* generation token by token on the calling thread; output is a deterministic function
  of the weights the prompt's KV was computed under and the weights computing now, so
  reused stale KV really changes the output (as it did on the real server);
* a prefix cache keyed by prompt tokens only (full blocks), with vLLM's hit counters;
* pause modes: abort (partial output, finish_reason "abort"), wait (returns once
  in-flight requests finish), keep (freezes them; they continue on whatever weights
  are there after resume); requests arriving while paused are queued;
* ``reset_prefix_cache`` refused (success:false) while requests hold blocks; the
  encoder/multimodal resets answer with an empty body;
* a weight load that dies halfway leaves mixed weights, and the next generation kills
  the engine (the "meta device" hazard); the label is whatever the caller finalises.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rolloutcore.adapters.contract import (
    AdapterError,
    EngineReport,
    EpochEvidence,
    FenceEvidence,
    GenerationResult,
    MutationEvidence,
    MutationOutcome,
    PauseEvidence,
    PauseMode,
    ProbeEvidence,
    RankStage,
    ResetEvidence,
    ResumeEvidence,
    StageEvidence,
    WeightTarget,
    remaining,
)
from rolloutcore.adapters.epoch_gate import EpochGate
from rolloutcore.errors import Unreachable

VOCAB = 1024
BLOCK = 4  # tokens per prefix-cache block (small: sim prompts are short)


def sim_identity(checkpoint: str) -> str:
    """Content identity of a simulated checkpoint (its "tensors" are its name). A name
    that is a directory holding safetensors files is digested as a real checkpoint is
    (what a fleet file's engines are described by), so that a simulated engine loaded
    from it reports what the command line expects of those bytes."""
    p = Path(checkpoint)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else []
    if files:
        return _directory_identity(str(p.resolve()), tuple(f.stat().st_mtime_ns for f in files))
    return hashlib.sha256(f"sim-weights:{checkpoint}".encode()).hexdigest()


@functools.lru_cache(maxsize=64)
def _directory_identity(path: str, _stamp: tuple[int, ...]) -> str:
    from rolloutcore.engine.identity import checkpoint_identity

    return checkpoint_identity(path)


def _extend(context: bytes, tokens: tuple[int, ...] | list[int]) -> bytes:
    """The digest of a token sequence, extended token by token (weights apart)."""
    for t in tokens:
        context = hashlib.blake2b(context + t.to_bytes(4, "big"), digest_size=8).digest()
    return context


def _token(kv_weights: str, weights: str, context: bytes) -> int:
    """The next token after ``context`` (a sequence's digest): autoregressive, as a model
    is, so a rollout continued from its prompt and the tokens so far goes on exactly as
    it would have (greedy), on the same weights."""
    h = hashlib.blake2b(f"{kv_weights}|{weights}|".encode() + context, digest_size=4)
    return int.from_bytes(h.digest(), "big") % VOCAB


def reference_tokens(checkpoint: str, prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
    """Greedy output of a clean engine holding ``checkpoint`` (no stale KV)."""
    out: list[int] = []
    context = _extend(b"", prompt)
    for _ in range(n):
        out.append(_token(checkpoint, checkpoint, context))
        context = _extend(context, out[-1:])
    return tuple(out)


def _score(weights: str, prompt: tuple[int, ...], i: int) -> float:
    h = hashlib.blake2b(f"score|{weights}|{prompt[:i + 1]}".encode(), digest_size=4)
    return -(int.from_bytes(h.digest(), "big") % 100_000) / 10_000.0


def reference_logprobs(checkpoint: str, prompt: tuple[int, ...]) -> tuple[float, ...]:
    """Log-probability of each prompt token after the first under ``checkpoint`` (one
    prefill of a clean engine; like vLLM's prompt_logprobs, it reads no cache)."""
    return tuple(_score(checkpoint, prompt, i) for i in range(1, len(prompt)))


class EngineDead(Unreachable, RuntimeError):
    """The engine core died (the next generation after a failed load)."""


@dataclass
class _Request:
    prompt: tuple[int, ...]
    max_tokens: int
    tokens: list[int] = field(default_factory=list)
    weights_seen: set[str] = field(default_factory=set)
    aborted: bool = False


class SimEngine:
    """The engine: thread-safe; ``token_seconds`` paces generation."""

    def __init__(self, checkpoint: str, *, token_seconds: float = 0.0, label: str = "default",
                 ranks: int = 1):
        self._cv = threading.Condition()
        #: Tensor-parallel ranks: each stages its own shard (staged updates).
        self.ranks = ranks
        #: Each rank's staging buffer (rank -> the checkpoint it holds): inactive, never
        #: what computes until installed.
        self.staged: dict[int, str] = {}
        self.weights = checkpoint  # what computes
        self.identity_reads_as = sim_identity(checkpoint)  # what a digest of the weights shows
        self.label = label
        self.paused = False
        self.pause_mode: PauseMode | None = None
        self.dead = False
        self._broken_load = False  # next generation kills the engine
        self.running: list[_Request] = []
        self.prefix: dict[tuple[int, ...], str] = {}  # block (by tokens only) -> weights
        self.encoder: dict[str, str] = {}
        self.mm: dict[str, str] = {}
        self.token_seconds = token_seconds
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.completed = 0
        self.generated = 0  # tokens generated, cumulative (vLLM's generation_tokens_total)
        #: The engine's fencing token (controller failover): loads of an older epoch are
        #: refused, as our worker extension refuses them.
        self.gate = EpochGate()

    # ------------------------------------------------------------------- generation

    def generate(self, prompt: tuple[int, ...], max_tokens: int,
                 mm_key: str | None = None,
                 on_token: Callable[[int, str], None] | None = None) -> GenerationResult:
        """``on_token(token, weights)`` sees each token as it is made, outside the lock (the
        simulated server streams with it); an exception from it ends the request (its
        client went away). ``extra["cached_tokens"]``: prompt tokens read from the cache."""
        req = _Request(tuple(prompt), max_tokens)
        with self._cv:
            self._cv.wait_for(lambda: not self.paused or self.dead)  # queued while paused
            if self.dead:
                raise EngineDead("engine core is dead")
            if self._broken_load:
                self.dead = True  # the engine dies on the first generation after it
                self._cv.notify_all()
                raise EngineDead("EngineCore encountered an issue (weights not loaded)")
            hits = self.prefix_hits
            kv = self._prefill(req.prompt, mm_key)
            cached = self.prefix_hits - hits
            self.running.append(req)
        context = _extend(b"", req.prompt)
        try:
            for _ in range(max_tokens):
                if self.token_seconds:
                    time.sleep(self.token_seconds)
                with self._cv:
                    self._cv.wait_for(lambda: self.pause_mode is not PauseMode.KEEP
                                      or not self.paused or req.aborted or self.dead)
                    if self.dead:
                        raise EngineDead("engine core is dead")
                    if req.aborted:
                        return GenerationResult(req.prompt, tuple(req.tokens), "abort",
                                                extra={"cached_tokens": cached})
                    req.weights_seen.add(self.weights)
                    req.tokens.append(_token(kv, self.weights, context))
                    self.generated += 1
                    context = _extend(context, req.tokens[-1:])
                    made = (req.tokens[-1], self.weights)
                if on_token is not None:
                    on_token(*made)
            return GenerationResult(req.prompt, tuple(req.tokens), "length",
                                    extra={"weights_seen": sorted(req.weights_seen),
                                           "cached_tokens": cached})
        finally:
            with self._cv:
                self.running.remove(req)
                self.completed += 1
                self._cv.notify_all()

    def score(self, prompt: tuple[int, ...]) -> tuple[float | None, ...]:
        """One prefill returning each prompt token's log-probability (position 0 has none).
        Like vLLM, a request asking for prompt log-probabilities reads no prefix cache; it
        writes its blocks as any prefill does."""
        with self._cv:
            self._cv.wait_for(lambda: not self.paused or self.dead)
            if self.dead:
                raise EngineDead("engine core is dead")
            if self._broken_load:
                self.dead = True
                self._cv.notify_all()
                raise EngineDead("EngineCore encountered an issue (weights not loaded)")
            blocks = [prompt[: i + BLOCK] for i in range(0, len(prompt) - BLOCK + 1, BLOCK)]
            self.prefix_queries += len(prompt)
            for b in blocks:
                self.prefix.setdefault(b, self.weights)
            self.completed += 1
            return (None, *(_score(self.weights, prompt, i) for i in range(1, len(prompt))))

    def _prefill(self, prompt: tuple[int, ...], mm_key: str | None) -> str:
        """Look up full blocks by tokens only; returns the weights the prompt's KV is from."""
        blocks = [prompt[: i + BLOCK] for i in range(0, len(prompt) - BLOCK + 1, BLOCK)]
        kv = self.weights
        hit_weights = [self.prefix[b] for b in blocks if b in self.prefix]
        self.prefix_queries += len(prompt)
        if hit_weights:
            self.prefix_hits += BLOCK * len(hit_weights)
            kv = hit_weights[0]  # the reused KV decides the continuation
        for b in blocks:
            self.prefix.setdefault(b, self.weights)
        if mm_key is not None:
            kv = self.encoder.setdefault(mm_key, self.weights)
            self.mm.setdefault(mm_key, self.weights)
        return kv

    # ----------------------------------------------------------------- control plane

    def pause(self, mode: PauseMode) -> None:
        with self._cv:
            self.paused = True
            self.pause_mode = mode
            if mode is PauseMode.ABORT:
                for r in self.running:
                    r.aborted = True
                self._cv.notify_all()
            elif mode is PauseMode.WAIT:
                self._cv.wait_for(lambda: not self.running or self.dead)
            self._cv.notify_all()

    def resume(self) -> None:
        with self._cv:
            self.paused = False
            self.pause_mode = None
            self._cv.notify_all()

    def reset_prefix_cache(self) -> bool:
        with self._cv:
            if any(not r.aborted for r in self.running):
                return False  # blocks in use
            self.prefix.clear()
            return True

    def reset_encoder_cache(self) -> None:
        with self._cv:
            self.encoder.clear()

    def reset_mm_cache(self) -> None:
        with self._cv:
            self.mm.clear()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no request runs (aborted ones end at their next token)."""
        with self._cv:
            return self._cv.wait_for(lambda: not self.running or self.dead, timeout=timeout)

    def cache_sizes(self) -> dict[str, int]:
        with self._cv:
            return {"prefix": len(self.prefix), "encoder": len(self.encoder), "mm": len(self.mm)}

    def load(self, checkpoint: str, *, fail_halfway: bool = False, broken: bool = False,
             miscompute: bool = False) -> None:
        """Load weights in place. ``fail_halfway``: mixed weights, then raise; ``broken``:
        the digest reads as the checkpoint but nothing computes (meta device);
        ``miscompute``: the digest reads as the checkpoint, other weights compute (only a
        generation tells)."""
        with self._cv:
            if self.dead:
                raise EngineDead("engine core is dead")
            if fail_halfway:
                self.weights = f"mixed({self.weights}+{checkpoint})"
                self.identity_reads_as = sim_identity(self.weights)
                self._broken_load = True
                raise RuntimeError("weight load failed halfway")
            self.weights = (f"broken({checkpoint})" if broken else
                            f"miscomputed({checkpoint})" if miscompute else checkpoint)
            self.identity_reads_as = sim_identity(checkpoint)
            self._broken_load = broken

    def stage(self, rank: int, checkpoint: str) -> None:
        """Fill ``rank``'s staging buffer: the served weights are not touched."""
        with self._cv:
            if self.dead:
                raise EngineDead("engine core is dead")
            self.staged[rank] = checkpoint

    def staged_checkpoint(self) -> str | None:
        """The one checkpoint every rank's buffer holds, or None."""
        with self._cv:
            held = {self.staged.get(r) for r in range(1, self.ranks + 1)}
            one = next(iter(held)) if len(held) == 1 else None
            return one

    def kill(self) -> None:
        """The process dies (SIGKILL): every call from now on fails, nothing runs."""
        with self._cv:
            self.dead = True
            self._cv.notify_all()

    def set_label(self, label: str) -> None:
        with self._cv:
            self.label = label


# --------------------------------------------------------------------------- adapter

FAULT_KINDS = ("timeout", "connection_error", "http_500", "fail_body", "empty_body",
               "wrong_label", "hang", "die_halfway", "wrong_weights", "refuse", "broken",
               "unlabelled", "late", "drop", "miscompute", "crash", "corrupt", "partial",
               "other", "one_rank")
#: Faults that strike after the engine carried the operation out (its reply is lost).
AFTER_KINDS = frozenset({"late", "drop"})
OPS = ("read_state", "pause", "resume", "mutate", "reset_prefix", "reset_encoder",
       "reset_mm", "probe", "fence", "fence_epoch", "stage", "install", "peer_source",
       "serve_peer")
#: A simulated peer source's URL: this prefix, the source adapter's key, its checkpoint.
SIM_PEER = "sim-peer://"
#: Every simulated adapter another can stage from, by key (see SimAdapter.peer_source).
_PEERS: weakref.WeakValueDictionary[str, SimAdapter] = weakref.WeakValueDictionary()


@dataclass
class FaultPlan:
    """Faults to inject, consumed in order per operation: {"mutate": ["hang"], ...}; a
    sticky fault strikes every call of its operation once the queue is empty."""

    faults: dict[str, list[str]] = field(default_factory=dict)
    injected: list[tuple[str, str]] = field(default_factory=list)
    sticky: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for op, kinds in self.faults.items():
            if op not in OPS:
                raise ValueError(f"unknown operation {op!r}; known: {', '.join(OPS)}")
            for k in kinds:
                if k not in FAULT_KINDS:
                    raise ValueError(f"unknown fault {k!r}; known: {', '.join(FAULT_KINDS)}")

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """``"mutate=hang,reset_prefix=fail_body+empty_body"`` -> a plan."""
        faults: dict[str, list[str]] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            op, _, kinds = part.partition("=")
            if not kinds:
                raise ValueError(f"expected OP=FAULT[+FAULT...], got {part!r}")
            faults.setdefault(op.strip(), []).extend(k.strip() for k in kinds.split("+"))
        return cls(faults)

    def add(self, op: str, kind: str, times: int | None = 1) -> None:
        """``times`` more calls of ``op`` meet ``kind`` (None: every call from now on)."""
        FaultPlan({op: [kind]})  # validates
        if times is None:
            self.sticky[op] = kind
        else:
            self.faults.setdefault(op, []).extend([kind] * times)

    def take(self, op: str) -> str | None:
        queue = self.faults.get(op)
        kind = queue.pop(0) if queue else self.sticky.get(op)
        if kind is None:
            return None
        self.injected.append((op, kind))
        return kind


class SimAdapter:
    """The adapter contract over a :class:`SimEngine`, as the HTTP adapter would see it.

    Like the HTTP adapter, every idempotent call honours its deadline: an injected
    ``hang`` holds it until the deadline (or :meth:`release_hangs`) and then times out.
    A hung mutation (the collective) ignores its deadline, as a stuck NCCL call would:
    the runner must contain it.
    """

    def __init__(self, engine: SimEngine, faults: FaultPlan | None = None,
                 hang_seconds: float = 3600.0) -> None:
        self.engine = engine
        self.faults = faults or FaultPlan()
        self.hang_seconds = hang_seconds
        self._release_hangs = threading.Event()
        self.epoch: int | None = None  # sent with every load (see fence_epoch)
        #: The engine's process was killed: every call is refused (connection refused),
        #: until :meth:`reconnect` to a new one.
        self.gone = False
        #: Kill the process as a call of this operation arrives (a kill mid-cycle).
        self.kill_at: str | None = None
        self.killed_at: float | None = None  # perf_counter of the kill
        self.peer_token = f"sim-{id(self):x}"
        self.peer_served_bytes = 0  # what other engines staged from this one

    def release_hangs(self) -> None:
        """Let calls stuck in an injected hang return (test clean-up)."""
        self._release_hangs.set()

    def reconnect(self, engine: SimEngine) -> None:
        """Talk to a new engine (its process was replaced at the same address): calls held
        by the old one are let go, faults dropped."""
        self._release_hangs.set()
        self._release_hangs = threading.Event()
        self.engine = engine
        self.faults = FaultPlan()
        self.gone, self.kill_at = False, None

    def kill_process(self) -> None:
        """SIGKILL the engine's process: nothing runs any more, every call is refused."""
        self.gone = True
        self.killed_at = time.perf_counter()
        self.engine.kill()

    def _after(self, op: str, kind: str | None, deadline: float | None) -> None:
        """The engine has done it; the reply is lost (drop) or held past the deadline."""
        if kind == "drop":
            raise ConnectionResetError(f"{op}: connection reset by peer after the request")
        if kind == "late":
            wait = self.hang_seconds if deadline is None else min(self.hang_seconds,
                                                                  remaining(deadline))
            self._release_hangs.wait(wait)
            raise TimeoutError(f"{op}: no reply within the deadline")

    def _transport_fault(self, op: str, deadline: float | None) -> str | None:
        if self.kill_at == op and not self.gone:
            self.kill_process()
        if self.gone:
            raise ConnectionRefusedError(f"{op}: connection refused (the engine's process "
                                         "is gone)")
        kind = self.faults.take(op)
        if kind == "timeout":
            raise TimeoutError(f"{op}: read timed out")
        if kind == "connection_error":
            raise ConnectionResetError(f"{op}: connection reset by peer")
        if kind == "hang":
            wait = self.hang_seconds if deadline is None else min(self.hang_seconds,
                                                                  remaining(deadline))
            self._release_hangs.wait(wait)
            raise TimeoutError(f"{op}: hung")
        return kind

    def read_state(self, deadline: float) -> EngineReport:
        kind = self._transport_fault("read_state", deadline)
        if kind == "http_500":
            raise AdapterError("read_state: HTTP 500")
        e = self.engine
        label = "not-the-label" if kind == "wrong_label" else e.label
        identity = None if kind == "empty_body" else e.identity_reads_as
        return EngineReport(label, identity, e.paused, len(e.running))

    def pause(self, mode: PauseMode, deadline: float) -> PauseEvidence:
        kind = self._transport_fault("pause", deadline)
        if kind == "http_500":
            return PauseEvidence(mode, 500, None, self.engine.paused, len(self.engine.running))
        if kind != "fail_body":
            self.engine.pause(mode)
            if mode is PauseMode.ABORT:  # aborted requests end at their next token
                self.engine.wait_idle(remaining(deadline))
        self._after("pause", kind, deadline)
        return PauseEvidence(mode, 200, {"status": "paused"}, self.engine.paused,
                             len(self.engine.running))

    def resume(self, deadline: float) -> ResumeEvidence:
        kind = self._transport_fault("resume", deadline)
        if kind == "http_500":
            return ResumeEvidence(500, None, self.engine.paused)
        if kind != "fail_body":
            self.engine.resume()
        self._after("resume", kind, deadline)
        return ResumeEvidence(200, {"status": "resumed"}, self.engine.paused)

    def mutate(self, target: WeightTarget, deadline: float) -> MutationEvidence:
        t0 = time.perf_counter()
        kind = self._transport_fault("mutate", None)  # a collective: no deadline of its own
        if kind == "refuse":
            raise AdapterError("mutate: refused before any byte moved", proven_no_effect=True)
        if kind == "http_500":
            raise AdapterError("mutate: HTTP 500 from the engine")
        if kind == "crash":  # the engine process is killed in the middle of the load
            self.engine.kill()
            raise ConnectionResetError("mutate: connection reset (the engine died)")
        with self.engine.gate.hold(self.epoch) as ok:
            if not ok:
                return MutationEvidence(MutationOutcome.NOT_MUTATED,
                                        self.engine.gate.refusal(self.epoch),
                                        time.perf_counter() - t0)
            return self._load(target, kind, t0)

    def _load(self, target: WeightTarget, kind: str | None, t0: float) -> MutationEvidence:
        try:
            self.engine.load(
                "some-other-checkpoint" if kind == "wrong_weights" else target.source,
                fail_halfway=kind == "die_halfway", broken=kind == "broken",
                miscompute=kind == "miscompute")
        except (RuntimeError, EngineDead) as e:
            return MutationEvidence(MutationOutcome.AMBIGUOUS, f"load failed: {e}",
                                    time.perf_counter() - t0)
        if kind != "unlabelled":  # the seed's bug: finalised without the target label
            self.engine.set_label(target.label)
        self._after("mutate", kind, None)
        return MutationEvidence(MutationOutcome.COMPLETED, "loaded and finalised",
                                time.perf_counter() - t0, target.nbytes)

    # ------------------------------------------------------------ staged updates

    def stage_ranks(self, deadline: float) -> int:
        if self.gone:
            raise ConnectionRefusedError("stage_ranks: connection refused")
        return self.engine.ranks

    def stage(self, target: WeightTarget, deadline: float) -> StageEvidence:
        """Every rank stages ``target.source`` into its buffer while the engine serves. A
        fault strikes the last rank (one rank's staging fails): ``corrupt`` (a chunk
        fails its digest), ``partial`` (the sender is gone mid-stream), ``other`` (another
        generation's bytes), ``refuse`` (the rank has no room for a staging copy),
        ``hang`` (no answer by the deadline)."""
        t0 = time.perf_counter()
        kind = self._transport_fault("stage", deadline)
        e = self.engine
        out: list[RankStage] = []
        source, peer_error = target.source, None
        if source.startswith(SIM_PEER):
            source, peer_error = self._read_peer(source, target.nbytes)
        for r in range(1, e.ranks + 1):
            if peer_error is not None:
                out.append(RankStage(r, None, False, error=peer_error))
                continue
            src = "some-other-checkpoint" if kind == "other" and r == e.ranks \
                else source
            if r == e.ranks and kind in ("corrupt", "partial", "refuse"):
                error = {"corrupt": "chunk 3 of the shard failed its digest",
                         "partial": "the sender closed the stream after 40% of the shard",
                         "refuse": "the rank refused: no room for a staging copy"}[kind]
                out.append(RankStage(r, None, kind != "partial", error=error))
                continue
            e.stage(r, src)
            out.append(RankStage(r, sim_identity(src), True, tensors=1,
                                 nbytes=target.nbytes // e.ranks))
        return StageEvidence(e.ranks, tuple(out), f"staged {target.source} on {e.ranks} "
                             "rank(s)", time.perf_counter() - t0)

    def peer_source(self, identity: str, deadline: float) -> str:
        """Where another simulated engine stages ``identity`` from this one: what every
        rank staged, or the weights it serves."""
        self._transport_fault("peer_source", deadline)
        e = self.engine
        held = next((c for c in (e.staged_checkpoint(), e.weights)
                     if c is not None and sim_identity(c) == identity), None)
        if held is None:
            raise AdapterError(f"peer_source: this engine holds no bytes of identity "
                               f"{identity[:16]}")
        key = f"{id(self):x}"
        _PEERS[key] = self
        return f"{SIM_PEER}{key}/{held}"

    def _read_peer(self, url: str, nbytes: int) -> tuple[str, str | None]:
        """The checkpoint a peer source streams, or why the stream did not complete (its
        process gone before or while it streamed: ``serve_peer`` is the source's side)."""
        key, _, checkpoint = url[len(SIM_PEER):].partition("/")
        src = _PEERS.get(key)
        if src is None:
            return checkpoint, f"peer source {url}: connection refused"
        if src.peer_token != self.peer_token:
            return checkpoint, f"peer source {url}: HTTP 403: no or another peer token"
        try:
            src._transport_fault("serve_peer", None)
        except OSError as e:
            return checkpoint, (f"peer source {url}: {e} after {nbytes * 2 // 5} of "
                                f"{nbytes} bytes")
        src.peer_served_bytes += nbytes
        return checkpoint, None

    def install(self, target: WeightTarget, deadline: float) -> MutationEvidence:
        """Install the staged buffers (the closed window's only mutation). ``refuse``: no
        buffer (proof of no effect); ``die_halfway``: ambiguous, mixed weights;
        ``one_rank`` (negative control): one rank installs, the other keeps its weights,
        and the install reports success: mixed weights only a generation tells."""
        t0 = time.perf_counter()
        kind = self._transport_fault("install", None)
        if kind == "refuse":
            raise AdapterError("install: refused, no staged buffer", proven_no_effect=True)
        e = self.engine
        with e.gate.hold(self.epoch) as ok:
            if not ok:
                return MutationEvidence(MutationOutcome.NOT_MUTATED, e.gate.refusal(self.epoch),
                                        time.perf_counter() - t0)
            staged = e.staged_checkpoint()
            if staged is None or sim_identity(staged) != target.identity:
                return MutationEvidence(MutationOutcome.NOT_MUTATED, "install: no rank's "
                                        "buffer holds the target (nothing loaded)",
                                        time.perf_counter() - t0)
            e.staged.clear()
            return self._load(target, "miscompute" if kind == "one_rank" else kind, t0)

    def discard_stage(self, deadline: float) -> None:
        with self.engine._cv:
            self.engine.staged.clear()

    def fence_epoch(self, epoch: int, deadline: float) -> EpochEvidence:
        """Raise the engine's fencing token (see adapters/epoch_gate.py)."""
        kind = self._transport_fault("fence_epoch", deadline)
        if kind is not None:
            return EpochEvidence(epoch, False, None, f"fence_epoch: {kind}")
        if self.engine.dead:
            return EpochEvidence(epoch, False, None, "fence_epoch: the engine is dead")
        try:
            accepted, seen = self.engine.gate.fence(epoch, timeout=remaining(deadline))
        except TimeoutError as e:  # a load holds the engine (a stuck collective)
            return EpochEvidence(epoch, False, None, f"fence_epoch: {e}")
        if accepted:
            self.epoch = epoch
        return EpochEvidence(epoch, accepted, seen)

    def reset_cache(self, tier: str, deadline: float) -> ResetEvidence:
        kind = self._transport_fault(f"reset_{tier}", deadline)
        if kind == "http_500":
            return ResetEvidence(tier, 500, None)
        e = self.engine
        if tier == "prefix":
            if kind == "fail_body":
                return ResetEvidence(tier, 200, False)
            ok = e.reset_prefix_cache()
            self._after(f"reset_{tier}", kind, deadline)
            return ResetEvidence(tier, 200, None if kind == "empty_body" else ok)
        if tier == "encoder":
            if kind != "fail_body":
                e.reset_encoder_cache()
        elif tier == "mm":
            if kind != "fail_body":
                e.reset_mm_cache()
        else:
            raise AdapterError(f"unknown cache tier {tier!r}", proven_no_effect=True)
        self._after(f"reset_{tier}", kind, deadline)
        # vLLM answers these with an empty body: verify by reading the tier's size.
        size = None if kind == "empty_body" else e.cache_sizes()[tier]
        return ResetEvidence(tier, 200, None, entries_after=size)

    def probe(self, prompt: tuple[int, ...], max_tokens: int, deadline: float, *,
              scored: bool = False) -> ProbeEvidence:
        kind = self._transport_fault("probe", deadline)
        if kind == "http_500":
            return ProbeEvidence(prompt, None, 500, None, error="HTTP 500")
        before = self.engine.prefix_hits
        try:
            if scored:
                scores = self.engine.score(prompt)
                self._after("probe", kind, deadline)
                return ProbeEvidence(prompt, None, 200, "length", prefix_hits=0,
                                     prompt_logprobs=scores)
            out = self.engine.generate(prompt, max_tokens)
        except EngineDead as e:
            return ProbeEvidence(prompt, None, 500, None, error=str(e))
        self._after("probe", kind, deadline)
        return ProbeEvidence(prompt, out.tokens, 200, out.finish_reason,
                             prefix_hits=self.engine.prefix_hits - before)

    def fence(self, label: str, deadline: float) -> FenceEvidence:
        kind = self._transport_fault("fence", deadline)
        e = self.engine
        if kind == "http_500":
            return FenceEvidence(label, 500, None, e.paused, e.label, len(e.running))
        if not e.dead:
            e.pause(PauseMode.ABORT)
            e.set_label(label)
        e.wait_idle(remaining(deadline))
        return FenceEvidence(label, 200, 200, e.paused, e.label, len(e.running))

    def generate(self, prompt: tuple[int, ...], max_tokens: int) -> GenerationResult:
        if self.gone:
            raise ConnectionRefusedError("generate: connection refused (the engine's "
                                         "process is gone)")
        return self.engine.generate(prompt, max_tokens)


#: The probe prompt a simulated target is verified with unless told otherwise.
SIM_PROBE_PROMPT = (7, 1, 4, 9, 2, 8, 5, 3, 6)


def sim_target(generation: int, checkpoint: str, *,
               probe_prompt: Iterable[int] = SIM_PROBE_PROMPT, probe_len: int = 8,
               label: str | None = None) -> WeightTarget:
    """A WeightTarget for a simulated checkpoint, with its true reference probe."""
    prompt = tuple(probe_prompt)
    return WeightTarget(
        generation=generation, label=label or f"rc-{generation}",
        identity=sim_identity(checkpoint), source=checkpoint, probe_prompt=prompt,
        probe_tokens=reference_tokens(checkpoint, prompt, probe_len), nbytes=1 << 20,
        probe_logprobs=reference_logprobs(checkpoint, prompt),
    )

