"""Trainer-side weight-transfer adapter: ``mutate()`` moves a target's tensors from a
trainer-held source into the live vLLM server through vLLM's own trainer API
(``vllm.distributed.weight_transfer``: ``WeightTransferTrainerFactory.trainer_init``,
``HTTPVLLMWeightSyncClient``, a ``WeightSource``), over any registered backend: ``gloo``
on CPU (:mod:`rolloutcore.adapters.gloo_transfer`), ``nccl`` on GPU. Every other
lifecycle operation is delegated to an inner adapter::

    TransferAdapter(inner=HttpAdapter(url), base_url=url, source_for=CheckpointSource.of)

Guarantees of :meth:`TransferAdapter.mutate`:

* **Target-aware finalise.** The sync client is wrapped (:class:`TargetAwareClient`):
  RolloutCore sets the pending target before the transfer, and ``finish_weight_update``
  carries that target's label even though vLLM's trainer code finalises with none. A
  finalise asking for another label is refused (the session is then ambiguous); the label
  is never written afterwards to paper over a mismatch.
* **Identity before bytes.** Before anything is sent, the target's declared identity is
  compared with the source's declared provenance, and the source's metadata (names,
  dtypes, shapes) with the target checkpoint's manifest: any disagreement raises
  ``AdapterError(proven_no_effect=True)``.
* **Device pinning** (CUDA): the adapter records the device it was created on and refuses
  a transfer from a thread whose current device differs (the lookup is injectable).
* **Headroom.** Where the engine reports free memory (``rc_transfer_headroom``), an update
  whose receive buffers cannot fit is refused before any byte moves.
* **Watchdog.** The transfer runs on its own daemon thread under a deadline derived from
  the bytes to move. Past it the mutation is ambiguous (the runner latches TAINTED), the
  thread is left behind and reported in :attr:`TransferAdapter.stuck`, and nothing
  retries the collective. A failure before the session started (init refused, the
  server unreachable) is proven to have had no effect; anything from
  ``start_weight_update`` on is ambiguous unless the finalise completed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

from rolloutcore.adapters.contract import (
    AdapterError,
    EngineReport,
    EpochEvidence,
    FenceEvidence,
    GenerationResult,
    LifecycleAdapter,
    MutationEvidence,
    MutationOutcome,
    PauseEvidence,
    PauseMode,
    ProbeEvidence,
    ResetEvidence,
    ResumeEvidence,
    StageEvidence,
    WeightTarget,
    remaining,
)
from rolloutcore.adapters.epoch_gate import EPOCH_KEY
from rolloutcore.engine.identity import (
    CheckpointError,
    IdentityHasher,
    Manifest,
    checkpoint_entries,
    checkpoint_manifest,
    iter_tensor_bytes,
    manifest_difference,
)

_ST_TO_TORCH = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
    "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
    "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}
_TORCH_TO_ST = {v: k for k, v in _ST_TO_TORCH.items()}


# ---------------------------------------------------------------------- sources


class CheckpointSource(WeightSource):
    """A safetensors checkpoint directory as a vLLM ``WeightSource``, in sorted name
    order; its provenance is the content identity of the bytes it yields."""

    def __init__(self, directory: str | Path, *, provenance: str | None = None,
                 device: str | torch.device | None = None, preload: bool = False) -> None:
        self.directory = Path(directory)
        self.entries = checkpoint_entries(self.directory)
        self._provenance = provenance
        self.device = None if device is None else torch.device(device)
        # preload: hold the tensors in memory (as a trainer holds its weights), so that
        # a transfer does not re-read the files.
        self._held: list[tuple[str, torch.Tensor]] | None = None
        if preload:
            self._held = list(self._read())

    @classmethod
    def of(cls, target: WeightTarget) -> CheckpointSource:
        return cls(target.source)

    @property
    def provenance(self) -> str:
        """The identity of these weights (computed from the bytes unless declared)."""
        if self._provenance is None:
            h = IdentityHasher()
            for e, data in iter_tensor_bytes(self.entries):
                h.add(e.name, e.dtype, e.shape, data)
            self._provenance = h.hexdigest()
        return self._provenance

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(e.name, _ST_TO_TORCH[e.dtype], tuple(e.shape)) for e in self.entries]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self._held) if self._held is not None else self._read()

    def _read(self) -> Iterator[tuple[str, torch.Tensor]]:
        for e, data in iter_tensor_bytes(self.entries):
            buf = bytearray(data)
            dtype = _ST_TO_TORCH[e.dtype]
            t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
            t = t.reshape(e.shape)
            yield e.name, (t if self.device is None else t.to(self.device))

    def held_names(self) -> Collection[str] | None:
        return None


class TensorSource(WeightSource):
    """Tensors a trainer holds (a snapshot of its live model) as a vLLM ``WeightSource``,
    in sorted name order; its provenance is their identity, computed by the caller with
    :func:`rolloutcore.rl.weights.state_identity` over these very tensors."""

    def __init__(self, tensors: dict[str, torch.Tensor], *, provenance: str) -> None:
        self.tensors = {name: tensors[name] for name in sorted(tensors)}
        self._provenance = provenance

    @property
    def provenance(self) -> str:
        return self._provenance

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.tensors.items()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.tensors.items())

    def held_names(self) -> Collection[str] | None:
        return None


def source_manifest(meta: list[ParamMeta]) -> Manifest:
    return [(m.name, _TORCH_TO_ST.get(m.dtype, str(m.dtype)), tuple(int(d) for d in m.shape))
            for m in meta]


# ---------------------------------------------------------------- the sync client


@dataclass
class SessionLog:
    """What the session did on the wire, in order (for evidence and classification)."""

    calls: list[str] = field(default_factory=list)
    started: bool = False  # start_weight_update was sent: the engine may have changed
    finalised_label: str | None = None

    def add(self, what: str) -> None:
        self.calls.append(f"{time.monotonic():.3f} {what}")


class TargetAwareClient:
    """Wraps a ``VLLMWeightSyncClient``: the finalise carries the pending target's label.

    vLLM's trainer engines call ``finish_weight_update()`` with no version; this client
    sends the label of the target RolloutCore set before the transfer. A finalise that
    names a different label, or one without a pending target, is refused and never
    forwarded."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        #: The controller's epoch, sent with every update for the engine's fence (None:
        #: the controller has none, a fleet without a store).
        self.epoch: int | None = None
        #: Whether the controller still leads (None: no store): nothing is sent once not.
        self.lease_check: Callable[[], bool] | None = None
        self.pending: WeightTarget | None = None
        self.log = SessionLog()
        self._lock = threading.Lock()

    def set_pending(self, target: WeightTarget) -> None:
        with self._lock:
            self.pending = target
            self.log = SessionLog()

    def clear_pending(self) -> None:
        with self._lock:
            self.pending = None

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.log.add("init")
        self.inner.init_weight_transfer_engine(init_info)
        self.log.add("init ok")

    def _still_leading(self, what: str) -> None:
        if self.lease_check is not None and not self.lease_check():
            raise AdapterError(f"{what} not sent: this controller no longer holds the fleet's "
                               "leadership", proven_no_effect=True)

    def start_weight_update(self) -> None:
        self._still_leading("start_weight_update")
        if self.pending is None:
            raise AdapterError("start_weight_update without a pending target",
                               proven_no_effect=True)
        self.log.started = True
        self.log.add("start")
        self.inner.start_weight_update()

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self.log.add("update")
        if self.epoch is not None:
            update_info = ([{**u, EPOCH_KEY: self.epoch} for u in update_info]
                           if isinstance(update_info, list) else
                           {**update_info, EPOCH_KEY: self.epoch})
        self.inner.update_weights(update_info)
        self.log.add("update ok")

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        target = self.pending
        if target is None:
            raise AdapterError("finish_weight_update without a pending target")
        if weight_version is not None and weight_version != target.label:
            raise AdapterError(f"finalise asked for label {weight_version!r}, the pending "
                               f"target is {target.label!r}: not finalised")
        self._still_leading("finish_weight_update")
        self.log.add(f"finish {target.label}")
        self.inner.finish_weight_update(target.label)
        self.log.finalised_label = target.label


# ---------------------------------------------------------------------- the adapter


@dataclass(frozen=True)
class TransferPolicy:
    """Deadline of one transfer: base plus the bytes at a floor rate. Keep it below the
    runner's mutation deadline so that the adapter's own evidence is what the runner sees."""

    base_s: float = 9.0
    floor_bytes_per_s: float = 50e6

    def deadline(self, nbytes: int) -> float:
        return self.base_s + nbytes / self.floor_bytes_per_s


def cuda_device_select(device: int | None) -> None:
    """Make ``device`` the calling thread's current CUDA device (no-op without CUDA)."""
    if device is None:
        return
    import torch

    torch.cuda.set_device(device)


def cuda_device_lookup() -> int | None:
    """The calling thread's current CUDA device, None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.current_device())


InitInfoFactory = Callable[[], Any]


def gloo_init_info() -> Any:
    from rolloutcore.adapters.gloo_transfer import GlooTrainerInitInfo

    return GlooTrainerInitInfo(master_address="127.0.0.1", master_port=0, world_size=2, rank=0)


class TransferAdapter:
    """A :class:`LifecycleAdapter` whose ``mutate`` is a weight transfer; every other
    operation goes to ``inner``."""

    def __init__(
        self,
        inner: LifecycleAdapter,
        *,
        client: Any | None = None,
        base_url: str | None = None,
        source_for: Callable[[WeightTarget], WeightSource] = CheckpointSource.of,
        init_info: InitInfoFactory = gloo_init_info,
        policy: TransferPolicy = TransferPolicy(),
        device_lookup: Callable[[], int | None] = cuda_device_lookup,
        device_select: Callable[[int | None], None] | None = cuda_device_select,
        headroom: Callable[[], int | None] | None = None,
        check_manifest: bool = True,
        http_timeout_s: float = 300.0,
    ) -> None:
        if client is None:
            if base_url is None:
                raise ValueError("TransferAdapter needs a sync client or a base_url")
            from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient

            client = HTTPVLLMWeightSyncClient(base_url, timeout=http_timeout_s)
        # The trainer process registers plugin backends (gloo) the way vLLM's own
        # processes do: through the vllm.general_plugins entry points.
        from vllm.plugins import load_general_plugins

        load_general_plugins()  # type: ignore[no-untyped-call]
        self.inner = inner
        self.client = TargetAwareClient(client)
        self.source_for = source_for
        self.init_info = init_info
        self.policy = policy
        self.device_lookup = device_lookup
        self.device = device_lookup()  # the device this driver was initialised on
        # The runner calls mutate() on its own watchdog thread, whose current CUDA device
        # is the default one: pin the recorded device there first (the seed's "invalid
        # resource handle"). None: leave the thread as it is and only check.
        self.device_select = device_select
        self.headroom = headroom if headroom is not None else self._engine_headroom
        self.check_manifest = check_manifest
        self.stuck: list[str] = []
        self.last_session: SessionLog | None = None
        self.last_timings: dict[str, float] = {}
        self.active_engine: Any = None  # the trainer engine of the running transfer
        self.staging_sent = 0  # bytes the running staging has broadcast so far

    # ------------------------------------------------------------ delegated operations

    def read_state(self, deadline: float) -> EngineReport:
        return self.inner.read_state(deadline)

    def pause(self, mode: PauseMode, deadline: float) -> PauseEvidence:
        return self.inner.pause(mode, deadline)

    def resume(self, deadline: float) -> ResumeEvidence:
        return self.inner.resume(deadline)

    def reset_cache(self, tier: str, deadline: float) -> ResetEvidence:
        return self.inner.reset_cache(tier, deadline)

    def probe(self, prompt: tuple[int, ...], max_tokens: int, deadline: float, *,
              scored: bool = False) -> ProbeEvidence:
        return self.inner.probe(prompt, max_tokens, deadline, scored=scored)

    def fence(self, label: str, deadline: float) -> FenceEvidence:
        return self.inner.fence(label, deadline)

    def generate(self, prompt: tuple[int, ...], max_tokens: int) -> GenerationResult:
        return self.inner.generate(prompt, max_tokens)

    @property
    def epoch(self) -> int | None:
        return self.client.epoch

    @epoch.setter
    def epoch(self, epoch: int | None) -> None:
        """Sent with every transfer (the engine's transfer backend checks it) and with the
        inner adapter's loads."""
        self.client.epoch = epoch
        inner: Any = self.inner  # an EpochFenced adapter (HttpAdapter)
        inner.epoch = epoch

    @property
    def lease_check(self) -> Callable[[], bool] | None:
        inner: Any = self.inner
        check: Callable[[], bool] | None = inner.lease_check
        return check

    @lease_check.setter
    def lease_check(self, check: Callable[[], bool] | None) -> None:
        inner: Any = self.inner  # its requests, and the transfer's own, are stopped
        inner.lease_check = check
        self.client.lease_check = check

    def fence_epoch(self, epoch: int, deadline: float) -> EpochEvidence:
        inner: Any = self.inner
        ev: EpochEvidence = inner.fence_epoch(epoch, deadline)
        if ev.accepted:
            self.client.epoch = epoch
        return ev

    def __getattr__(self, name: str) -> Any:  # rpc, read_label, close, ... of the inner
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def close_transfer_session(self, deadline: float) -> bool:
        """Close a transfer session an earlier, failed update left open on the engine (the
        re-admission's first step after its abort-mode pause). True if one was open;
        AdapterError if the engine cannot say."""
        rpc = getattr(self.inner, "rpc", None)
        if rpc is None:  # an inner adapter without worker calls: nothing to close there
            return False
        reply = rpc("rc_end_weight_update", op="end_weight_update", deadline=deadline)
        results = reply.body.get("results") if isinstance(reply.body, dict) else None
        if reply.status != 200 or not isinstance(results, list) or not all(
                isinstance(r, dict) for r in results):
            raise AdapterError(f"end_weight_update: HTTP {reply.status}: {reply.text[:200]!r}")
        return any(r.get("closed") is True for r in results)

    # ---------------------------------------------------------------- pre-flight checks

    def _engine_headroom(self) -> int | None:
        rpc = getattr(self.inner, "rpc", None)
        if rpc is None:
            return None
        try:
            reply = rpc("rc_transfer_headroom", op="headroom")
            results = reply.body.get("results") if isinstance(reply.body, dict) else None
            values = [r.get("free_bytes") for r in results or [] if isinstance(r, dict)]
        except (AdapterError, AttributeError):
            return None
        ints = [v for v in values if isinstance(v, int)]
        if not ints or len(ints) != len(values):
            return None
        return min(ints)

    def preflight(self, target: WeightTarget, source: WeightSource) -> int:
        """Every refusal that proves nothing moved; returns the bytes to move."""
        meta = source.metadata()
        actual = source_manifest(meta)
        nbytes = sum(m.dtype.itemsize * _numel(m.shape) for m in meta)
        provenance = getattr(source, "provenance", None)
        if not isinstance(provenance, str) or not provenance:
            raise AdapterError("mutate: the source declares no provenance: refused before "
                               "any byte moved", proven_no_effect=True)
        if provenance != target.identity:
            raise AdapterError(f"mutate: the source holds {provenance[:16]}, the target "
                               f"declares {target.identity[:16]}: refused before any byte "
                               "moved", proven_no_effect=True)
        if self.check_manifest and Path(target.source).is_dir():
            try:
                declared = checkpoint_manifest(target.source)
            except CheckpointError as e:
                raise AdapterError(f"mutate: cannot read the target's manifest: {e}",
                                   proven_no_effect=True) from None
            diff = manifest_difference(declared, actual)
            if diff is not None:
                raise AdapterError(f"mutate: source metadata disagrees with the target: "
                                   f"{diff}: refused before any byte moved",
                                   proven_no_effect=True)
        if self.device_select is not None:
            self.device_select(self.device)
        current = self.device_lookup()
        if current != self.device:
            raise AdapterError(f"mutate: driver initialised on device {self.device}, called "
                               f"from a thread whose current device is {current}: refused",
                               proven_no_effect=True)
        free = self.headroom()
        if free is not None:
            info = self.init_info()
            buf = int(getattr(info, "packed_buffer_size_bytes", 0) or 0)
            need = nbytes + min(buf, nbytes)  # staged tensors + one receive buffer
            if free < need:
                raise AdapterError(f"mutate: the engine has {free} bytes free, the update "
                                   f"needs {need}: refused before any byte moved",
                                   proven_no_effect=True)
        return nbytes

    # ---------------------------------------------------------------- staged updates

    @property
    def stages_updates(self) -> bool:
        """Staged over gloo (the CPU backend) where the inner adapter stages; NCCL staging
        (a background receive on its own stream) is GPU work not built here."""
        inner: Any = self.inner
        return bool(getattr(inner, "stages_updates", False)) and \
            getattr(self.init_info(), "backend", None) == "gloo"

    def stage_ranks(self, deadline: float) -> int:
        inner: Any = self.inner
        return int(inner.stage_ranks(deadline))

    def stage(self, target: WeightTarget, deadline: float) -> StageEvidence:
        """Send the target's tensors into every worker's staging buffer while the engine
        serves: the workers receive on a background thread (``rc_stage_receive``) and
        digest as bytes arrive; the trainer broadcasts from its own. Each worker's buffer
        is then read back (``rc_stage_status``) as the evidence."""
        from rolloutcore.adapters.gloo_transfer import stage_over_gloo

        t0 = time.perf_counter()
        source = self.source_for(target)
        self.preflight(target, source)
        inner: Any = self.inner
        ranks = int(inner.stage_ranks(deadline))
        info = self.init_info()
        epoch = {} if self.epoch is None else {"epoch": self.epoch}

        def call(**kwargs: Any) -> list[dict[str, Any]]:
            reply = inner.rpc("rc_stage_receive", op="stage", idempotent=False, fresh=True,
                              deadline=deadline, **kwargs, **epoch)
            results: list[dict[str, Any]] = inner._worker_results(reply, "stage")
            started.extend(results)
            return results

        error = ""
        self.staging_sent = 0
        started: list[dict[str, Any]] = []  # the workers' answers, even if sending fails

        def progress(sent: int) -> None:
            self.staging_sent = sent

        try:
            sent, _answers = stage_over_gloo(
                call, source, master_address=str(getattr(info, "master_address", "127.0.0.1")),
                world_size=ranks + 1, buffer_bytes=int(getattr(
                    info, "packed_buffer_size_bytes", 8 << 20)),
                timeout_s=max(remaining(deadline), 1.0), progress=progress)
        except Exception as e:  # the workers' buffers say what arrived
            sent, error = 0, f"{type(e).__name__}: {e}"
        finally:
            self.staging_sent = 0
        self.last_timings = {"stage_send_s": time.perf_counter() - t0}
        if not started:
            raise AdapterError(f"stage: no worker started: {error}")
        return cast(StageEvidence, inner.stage_evidence(
            started, deadline, t0, f"gloo staging of {target.label}: {sent} bytes sent"
            + (f"; the sender failed: {error}" if error else "")))

    def install(self, target: WeightTarget, deadline: float) -> MutationEvidence:
        inner: Any = self.inner
        return cast(MutationEvidence, inner.install(target, deadline))

    def discard_stage(self, deadline: float) -> None:
        inner: Any = self.inner
        inner.discard_stage(deadline)

    # ------------------------------------------------------------------------ mutation

    def mutate(self, target: WeightTarget, deadline: float) -> MutationEvidence:
        """The transfer, bounded by the earlier of the runner's deadline and the transfer
        policy's own (a collective may never return: the runner contains it as well)."""
        t0 = time.perf_counter()
        try:
            source = self.source_for(target)
        except (CheckpointError, OSError) as e:
            raise AdapterError(f"mutate: no source for {target.label}: {e}",
                               proven_no_effect=True) from None
        try:
            nbytes = self.preflight(target, source)
        except (CheckpointError, OSError, ValueError) as e:  # nothing was sent yet
            raise AdapterError(f"mutate: pre-flight check failed, nothing sent: {e}",
                               proven_no_effect=True) from None
        self.last_timings = {"preflight_s": time.perf_counter() - t0}
        client = self.client
        client.set_pending(target)
        self.active_engine = None
        log = client.log
        self.last_session = log
        seconds = min(self.policy.deadline(max(nbytes, target.nbytes)), remaining(deadline))
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

            engine = None
            try:
                t1 = time.perf_counter()
                engine = WeightTransferTrainerFactory.trainer_init(
                    self.init_info(), client=client, source=source)
                box["init_s"] = time.perf_counter() - t1
                self.active_engine = engine
                t1 = time.perf_counter()
                engine.send_weights()
                box["send_s"] = time.perf_counter() - t1
            except BaseException as e:
                box["error"] = e
            finally:
                done.set()
                if engine is not None and "error" not in box:
                    engine.shutdown()

        thread = threading.Thread(target=run, name=f"rolloutcore-transfer-{target.label}",
                                  daemon=True)
        thread.start()
        if not done.wait(seconds):
            self.stuck.append(f"transfer to {target.label} (thread {thread.name}) still running "
                              f"after {seconds:.2f} s; calls: {log.calls}")
            return MutationEvidence(MutationOutcome.AMBIGUOUS,
                                    f"transfer did not finish within {seconds:.2f} s "
                                    f"(started={log.started}); left behind, not retried",
                                    time.perf_counter() - t0)
        client.clear_pending()
        self.active_engine = None
        self.last_timings.update({k: v for k, v in box.items() if k.endswith("_s")})
        err = box.get("error")
        if err is not None:
            if not log.started:
                raise AdapterError(f"mutate: transfer failed before the session started "
                                   f"({type(err).__name__}: {err}); weights untouched",
                                   proven_no_effect=True) from None
            return MutationEvidence(MutationOutcome.AMBIGUOUS,
                                    f"transfer failed after start_weight_update: "
                                    f"{type(err).__name__}: {err}", time.perf_counter() - t0)
        if log.finalised_label != target.label:
            return MutationEvidence(MutationOutcome.AMBIGUOUS,
                                    f"session ended without finalising {target.label!r}",
                                    time.perf_counter() - t0)
        return MutationEvidence(MutationOutcome.COMPLETED,
                                f"transferred {nbytes} bytes from {target.source} and finalised "
                                f"as {target.label!r}", time.perf_counter() - t0, nbytes)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


__all__ = ["CheckpointSource", "TargetAwareClient", "TensorSource", "TransferAdapter",
           "TransferPolicy", "checkpoint_manifest", "cuda_device_lookup", "manifest_difference",
           "source_manifest"]
