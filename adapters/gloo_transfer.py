"""A CPU weight-transfer backend for vLLM: a torch.distributed gloo group between the
trainer process and the vLLM worker, mirroring the NCCL engine's session.

Registered under the name ``gloo`` on both of vLLM's factories (worker side
``WeightTransferEngineFactory``, trainer side ``WeightTransferTrainerFactory``) by
:func:`register`, which vLLM runs through the ``vllm.general_plugins`` entry point of
this package (``pyproject.toml``); nothing in vLLM is patched. Start the server with::

    --weight-transfer-config '{"backend": "gloo"}'
    --worker-extension-cls rolloutcore.adapters.gloo_transfer.TransferWorkerExtension

The session is the NCCL one: ``init`` (the trainer opens a TCPStore as rank 0 and the
worker joins a gloo group at ``rank_offset``), ``start`` (layerwise reload begins),
``update`` (the trainer broadcasts the tensors packed into uint8 buffers of at most
``packed_buffer_size_bytes``; the worker cuts the same buffers from the update info and
loads each through ``model.load_weights``), ``finish`` (layerwise reload finalised).
Only the transport differs from NCCL: same HTTP calls, same trainer API
(``WeightTransferTrainerFactory.trainer_init(...).send_weights()``), same collective
semantics (a broadcast from rank 0 that both sides must enter).

The worker also digests the bytes it receives with
:class:`rolloutcore.engine.identity.IdentityHasher` (when they arrive in sorted name order), so
the worker extension can vouch for the identity of weights that came over the wire, as
``rc_reload_weights`` does for a checkpoint loaded from disk.
"""

from __future__ import annotations

import contextlib
import datetime
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from rolloutcore.adapters.epoch_gate import GATE, pop_epoch
from rolloutcore.adapters.vllm_worker import RolloutCoreWorkerExtension
from rolloutcore.engine.identity import IdentityHasher

# torch.distributed's c10d classes are not re-exported for type checkers.
dist: Any = torch.distributed

BACKEND = "gloo"
DEFAULT_BUFFER_BYTES = 8 * 1024 * 1024  # several buffers pipeline (bench_transfer.py)
DEFAULT_GROUP_TIMEOUT_S = 600.0

# torch dtype name -> safetensors dtype code (what the identity hashes).
ST_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
    "bool": "BOOL",
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def nbytes_of(dtype_name_: str, shape: Sequence[int]) -> int:
    n = getattr(torch, dtype_name_).itemsize
    for d in shape:
        n *= int(d)
    return int(n)


def plan_buffers(sizes: Sequence[int], buffer_bytes: int) -> list[list[int]]:
    """Indices of the tensors packed into each broadcast buffer, in order: a buffer
    takes tensors while they fit; a tensor larger than the limit travels alone. Both
    sides compute this from the same metadata, so they cut the stream alike."""
    out: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i, n in enumerate(sizes):
        if cur and used + n > buffer_bytes:
            out.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    if cur:
        out.append(cur)
    return out


def pipelined(items: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """``items`` produced on a daemon thread, at most ``depth`` ahead of the consumer
    (double buffering: packing or receiving buffer k+1 overlaps the use of buffer k).
    An exception of the producer is raised in the consumer."""
    q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for x in items:
                if not put(("item", x)):
                    return
            put(("end", None))
        except BaseException as e:
            put(("error", e))

    threading.Thread(target=produce, name="rolloutcore-gloo-pipeline", daemon=True).start()
    try:
        while True:
            kind, value = q.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()


def _broadcast(group: Any, tensor: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


def _open_group(address: str, port: int, rank: int, world_size: int, timeout_s: float,
                *, master: bool) -> tuple[Any, Any]:
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(address, port, world_size, master, timeout=timeout,
                          wait_for_workers=False)
    group = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    return store, group


# --------------------------------------------------------------------- worker side


@dataclass(kw_only=True)
class GlooWeightTransferInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    packed_buffer_size_bytes: int = DEFAULT_BUFFER_BYTES
    timeout_s: float = DEFAULT_GROUP_TIMEOUT_S


@dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not (len(self.names) == len(self.dtype_names) == len(self.shapes)):
            raise ValueError("names, dtype_names and shapes must have the same length")
        bad = sorted({d for d in self.dtype_names if d not in ST_DTYPES})
        if bad:
            raise ValueError(f"unsupported dtype(s) {bad}")


# What the worker received, per process (the engine and the worker extension live in
# the same worker process; the extension reads it to vouch for the weights' identity).
_RECEIVED: dict[str, Any] = {"session": None}
_RECEIVED_LOCK = threading.Lock()


def received_state() -> dict[str, Any]:
    with _RECEIVED_LOCK:
        return dict(_RECEIVED)


class GlooWeightTransferEngine(
    WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]
):
    """Worker side: joins the trainer's gloo group and receives packed broadcasts."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device,
                 model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: Any = None
        self.store: Any = None
        self.buffer_bytes = DEFAULT_BUFFER_BYTES
        self._hasher: IdentityHasher | None = None
        self._manifest: IdentityHasher | None = None
        self._received = 0
        self._bytes = 0
        self._timings: dict[str, float] = {"recv_s": 0.0, "digest_s": 0.0, "load_s": 0.0}

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        if not 0 < int(init_info.rank_offset) < int(init_info.world_size):
            raise ValueError(f"rank_offset {init_info.rank_offset} is not a receiver rank of "
                             f"a world of {init_info.world_size} (rank 0 is the trainer)")
        if int(init_info.packed_buffer_size_bytes) <= 0:
            raise ValueError("packed_buffer_size_bytes must be positive")
        self.shutdown()
        self.buffer_bytes = int(init_info.packed_buffer_size_bytes)
        self.store, self.group = _open_group(
            init_info.master_address, int(init_info.master_port), int(init_info.rank_offset),
            int(init_info.world_size), float(init_info.timeout_s), master=False)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self._hasher = IdentityHasher()
        self._manifest = IdentityHasher(manifest_only=True)
        self._received = 0
        self._bytes = 0
        self._timings = {"recv_s": 0.0, "digest_s": 0.0, "load_s": 0.0}
        with _RECEIVED_LOCK:
            _RECEIVED.update(session="receiving", identity=None, manifest=None,
                             tensors=0, bytes=0, started=time.time())
        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which raises on a
        # machine without an accelerator; gloo's broadcast has completed on return.
        # A controller's epoch below this process's fence refuses it before any byte is
        # received (controller failover: see epoch_gate).
        info, epoch = pop_epoch(update_info)
        with GATE.enter(epoch):
            self.receive_weights(self.parse_update_info(info))
        if self.device.type != "cpu":
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer not initialised: call "
                               "init_weight_transfer_engine first")
        from vllm.model_executor.model_loader.mtp_validation import (
            disable_mtp_completeness_check,
        )

        names, dtypes, shapes = update_info.names, update_info.dtype_names, update_info.shapes
        sizes = [nbytes_of(d, s) for d, s in zip(dtypes, shapes, strict=True)]
        timings = self._timings
        digesting: threading.Thread | None = None

        def digest(items: list[tuple[int, torch.Tensor]]) -> None:
            t0 = time.perf_counter()
            for i, raw in items:
                self._digest(names[i], dtypes[i], shapes[i], raw)
            timings["digest_s"] += time.perf_counter() - t0

        group = self.group

        def received() -> Iterator[tuple[list[int], torch.Tensor]]:
            for idx in plan_buffers(sizes, self.buffer_bytes):
                t0 = time.perf_counter()
                buf = torch.empty(sum(sizes[i] for i in idx), dtype=torch.uint8)
                _broadcast(group, buf)
                timings["recv_s"] += time.perf_counter() - t0
                yield idx, buf

        try:
            with disable_mtp_completeness_check():
                for idx, buf in pipelined(received()):
                    raws: list[tuple[int, torch.Tensor]] = []
                    batch: list[tuple[str, torch.Tensor]] = []
                    off = 0
                    for i in idx:
                        raw = buf[off:off + sizes[i]]
                        off += sizes[i]
                        raws.append((i, raw))
                        t = raw.view(getattr(torch, dtypes[i])).reshape(shapes[i])
                        batch.append((names[i], t.to(self.device) if self.device.type != "cpu"
                                      else t))
                    # The digest (sha256 releases the GIL) overlaps the load; digests
                    # stay in order: one buffer's digest ends before the next one's starts.
                    if digesting is not None:
                        digesting.join()
                    digesting = threading.Thread(target=digest, args=(raws,), daemon=True)
                    digesting.start()
                    t0 = time.perf_counter()
                    model: Any = self.model
                    model.load_weights(batch)
                    timings["load_s"] += time.perf_counter() - t0
        finally:
            if digesting is not None:
                digesting.join()

    def _digest(self, name: str, dtype: str, shape: list[int], raw: torch.Tensor) -> None:
        self._received += 1
        self._bytes += int(raw.numel())
        if self._hasher is None or self._manifest is None:
            return
        try:
            data = raw.numpy().data if raw.numel() else b""
            self._hasher.add(name, ST_DTYPES[dtype], shape, data)
            self._manifest.add(name, ST_DTYPES[dtype], shape)
        except ValueError:  # not in sorted order: no identity for this session
            self._hasher = self._manifest = None

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)  # type: ignore[no-untyped-call]
        identity = self._hasher.hexdigest() if self._hasher else None
        if identity is not None and self._manifest is not None:
            # The received bytes are what the model holds now: recorded where every load
            # is, so that a later load of any kind supersedes it.
            from rolloutcore.adapters import vllm_loader

            vllm_loader.complete_load(self.model, {
                "identity": identity, "manifest": self._manifest.hexdigest(),
                "tensors": self._received, "bytes": self._bytes, "path": None,
                "basis": "bytes received by the gloo weight-transfer engine",
                "timings": {k: round(v, 4) for k, v in self._timings.items()}})
        with _RECEIVED_LOCK:
            _RECEIVED.update(
                session=None if identity is not None else "complete",
                identity=identity, tensors=self._received, bytes=self._bytes,
                finished=time.time(),
                timings={k: round(v, 4) for k, v in self._timings.items()})

    def shutdown(self) -> None:
        group, self.group, self.store = self.group, None, None
        if group is not None:
            with contextlib.suppress(AttributeError, RuntimeError):
                group.shutdown()


def abort_layerwise_reload(model: torch.nn.Module, model_config: Any) -> int:
    """Drop the tensors a failed load buffered in vLLM's layerwise reload and end it:
    each layer still waiting is given back its previous tensors (vLLM's own finalise
    does that for a layer that loaded nothing). Returns how many layers were waiting."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    waiting = [info for layer in model.modules()
               if (info := LAYERWISE_INFO.get(layer)) is not None and info.can_load()]
    for info in waiting:
        info.loaded_weights.clear()
        info.load_numel = 0
    if waiting:
        finalize_layerwise_reload(model, model_config)  # type: ignore[no-untyped-call]
    return len(waiting)


class TransferWorkerExtension(RolloutCoreWorkerExtension):
    """The RolloutCore worker extension, aware of weights received by the gloo engine.

    After a completed transfer session the identity is the digest of the received bytes;
    during a session (or after one that did not finish) the worker vouches for none. A
    later ``rc_reload_weights`` supersedes the transfer."""

    def rc_reload_weights(self, weights_path: str, expected_identity: str = "",
                          epoch: int | None = None) -> dict[str, Any]:
        out = super().rc_reload_weights(weights_path, expected_identity, epoch)
        if out.get("loaded") is True:
            with _RECEIVED_LOCK:
                _RECEIVED["session"] = None
        return out

    def rc_identity(self) -> dict[str, Any]:
        """A finished transfer is recorded like any load (see finish_weight_update); only
        a session in progress, or one that ended without a digest, vouches for nothing."""
        rec = received_state()
        if rec.get("session") is None:
            return super().rc_identity()
        if rec["session"] != "complete":
            return {"identity": None, "reason": "a weight-transfer session did not finish"}
        return {"identity": None, "reason": "transfer not in sorted name order: no digest"}

    def rc_end_weight_update(self) -> dict[str, Any]:
        """Close what a failed transfer left open, before a re-admission reloads: the
        worker's session (vLLM refuses to start another while one is active) and vLLM's
        layerwise reload state (layers still on the meta device with the failed load's
        tensors buffered: the next session would replay them, and a tensor of the wrong
        shape fails every later load). Layers waiting for weights get their previous
        tensors back; what the model then holds is unknown (the identity vouches for
        none): the verified re-admission follows."""
        engine = getattr(self, "weight_transfer_engine", None)
        was = bool(getattr(self, "_weight_update_active", False))
        if was:
            if engine is not None:
                engine.reset_weight_update_target()
            self._weight_update_active = False
        stale = 0 if engine is None else abort_layerwise_reload(engine.model,
                                                                engine.model_config)
        return {"closed": was or stale > 0, "session": was, "stale_layers": stale}

    def rc_stage_receive(self, master_address: str, master_port: int, world_size: int,
                         names: list[str], dtype_names: list[str], shapes: list[list[int]],
                         packed_buffer_size_bytes: int = DEFAULT_BUFFER_BYTES,
                         timeout_s: float = DEFAULT_GROUP_TIMEOUT_S,
                         epoch: int | None = None) -> dict[str, Any]:
        """Stage weights sent over gloo (staged updates): a background thread of this
        worker joins the trainer's group (as rank ``self rank``: 1 + its worker rank),
        receives the packed broadcasts into host-memory buffers and digests each tensor
        as it arrives, while the engine serves; the call returns at once. Nothing is
        loaded: ``rc_install_staged`` installs in the closed window. Refused, nothing
        staged, below the fence, on malformed metadata, on a manifest other than the
        model's, or when the buffers would not fit in available memory."""
        from rolloutcore.adapters.vllm_worker import STAGE, _available_bytes

        with GATE.hold(epoch) as ok:
            rank = self._rc_rank()
            if not ok:
                return {"started": False, "rank": rank, "fenced": True,
                        "refused": GATE.refusal(epoch)}
            try:
                info = GlooWeightTransferUpdateInfo(list(names), list(dtype_names),
                                                    [list(x) for x in shapes])
            except ValueError as e:
                return {"started": False, "rank": rank, "refused": str(e)}
            manifest = IdentityHasher(manifest_only=True)
            try:
                for n, d, sh in zip(info.names, info.dtype_names, info.shapes, strict=True):
                    manifest.add(n, ST_DTYPES[d], sh)
            except ValueError as e:  # not in sorted order
                return {"started": False, "rank": rank, "refused": str(e)}
            held = self._rc_held_manifest()
            if held is not None and held != manifest.hexdigest():
                return {"started": False, "rank": rank, "refused": "manifest (names, dtypes, "
                        "shapes) differs from the loaded weights'"}
            sizes = [nbytes_of(d, sh) for d, sh in zip(info.dtype_names, info.shapes,
                                                        strict=True)]
            free = _available_bytes()
            if free is not None and sum(sizes) > free:
                return {"started": False, "rank": rank, "refused": (
                    f"staging buffers need {sum(sizes)} bytes of host memory, {free} are "
                    "available")}

            def receive(h: IdentityHasher) -> Iterator[tuple[str, str, torch.Tensor]]:
                store, group = _open_group(master_address, int(master_port), rank,
                                           int(world_size), float(timeout_s), master=False)
                try:
                    for idx in plan_buffers(sizes, int(packed_buffer_size_bytes)):
                        buf = torch.empty(sum(sizes[i] for i in idx), dtype=torch.uint8)
                        _broadcast(group, buf)
                        off = 0
                        for i in idx:
                            raw = buf[off:off + sizes[i]]
                            off += sizes[i]
                            h.add(info.names[i], ST_DTYPES[info.dtype_names[i]],
                                  info.shapes[i], raw.numpy().data if raw.numel() else b"")
                            yield info.names[i], ST_DTYPES[info.dtype_names[i]], raw.view(
                                getattr(torch, info.dtype_names[i])).reshape(info.shapes[i])
                finally:
                    with contextlib.suppress(AttributeError, RuntimeError):
                        group.shutdown()
                    del store

            STAGE.start_fill(f"gloo://{master_address}:{master_port}", len(sizes),
                             manifest.hexdigest(), receive)
            return {"started": True, "rank": rank, "bytes": sum(sizes)}

    def rc_transfer_headroom(self) -> dict[str, Any]:
        """Bytes the worker can still allocate for receive buffers (None: unknown)."""
        device = getattr(self, "device", None)
        if device is not None and getattr(device, "type", "cpu") == "cuda":
            free, _total = torch.cuda.mem_get_info(device)
            return {"free_bytes": int(free), "device": str(device)}
        try:
            with open("/proc/meminfo") as fh:
                for line in fh:
                    if line.startswith("MemAvailable:"):
                        return {"free_bytes": int(line.split()[1]) * 1024, "device": "cpu"}
        except OSError:
            pass
        return {"free_bytes": None, "device": "cpu"}


# -------------------------------------------------------------------- trainer side


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    backend = BACKEND
    master_address: str = "127.0.0.1"
    master_port: int = 0  # 0: the trainer's store picks a free port
    world_size: int = 2
    packed_buffer_size_bytes: int = DEFAULT_BUFFER_BYTES
    timeout_s: float = DEFAULT_GROUP_TIMEOUT_S
    rank: int = field(default=0, kw_only=True)


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer side (rank 0): opens the store and group, drives the session over the
    client while it broadcasts, exactly like ``NCCLTrainerWeightTransferEngine``."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: VLLMWeightSyncClient, source: WeightSource | None = None,
                 is_sender: bool = True, buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.buffer_bytes = buffer_bytes
        self.store: Any = None
        self.group: Any = None
        self.bytes_sent = 0

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client: VLLMWeightSyncClient,
                     source: WeightSource | None = None) -> GlooTrainerWeightTransferEngine:
        if source is None:
            raise ValueError("gloo trainer weight transfer requires a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender,
                     buffer_bytes=init_info.packed_buffer_size_bytes)
        if not engine.is_sender:
            return engine
        timeout = datetime.timedelta(seconds=init_info.timeout_s)
        engine.store = dist.TCPStore(init_info.master_address, init_info.master_port,
                                     init_info.world_size, True, timeout=timeout,
                                     wait_for_workers=False)
        worker_info = GlooWeightTransferInitInfo(
            master_address=init_info.master_address, master_port=int(engine.store.port),
            rank_offset=1, world_size=init_info.world_size,
            packed_buffer_size_bytes=init_info.packed_buffer_size_bytes,
            timeout_s=init_info.timeout_s)
        # The worker blocks in init until the group forms: run its RPC on a side thread.
        # The group constructor blocks until every rank joined; it runs on a second
        # thread so that an init the engine refuses surfaces at once instead of after
        # the rendezvous timeout.
        exe = ThreadPoolExecutor(max_workers=2)
        try:
            fut = exe.submit(client.init_weight_transfer_engine, asdict(worker_info))
            grp = exe.submit(dist.ProcessGroupGloo, engine.store, 0, init_info.world_size,
                             timeout)
            pending: list[Future[Any]] = [fut, grp]
            wait(pending, return_when=FIRST_EXCEPTION)
            if fut.done() and fut.exception() is not None:
                # Refused before the rendezvous: the engine never joined. Stand in for
                # the absent ranks so that our half-built group does not sit in its
                # constructor until the timeout, then surface the refusal.
                _complete_rendezvous(engine.store, init_info.world_size, grp)
                fut.result()
            engine.group = grp.result()
            fut.result()
        finally:
            exe.shutdown(wait=False)
        return engine

    def send_weights(self) -> None:
        assert self.source is not None
        meta = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:
                pass
            return
        update = GlooWeightTransferUpdateInfo(
            names=[m.name for m in meta], dtype_names=[dtype_name(m.dtype) for m in meta],
            shapes=[list(m.shape) for m in meta])
        self.client.start_weight_update()
        exe = ThreadPoolExecutor(max_workers=1)
        try:
            fut = exe.submit(self.client.update_weights, asdict(update))
            if fut.done():
                fut.result()
            self._broadcast(meta)
            fut.result()
        finally:
            exe.shutdown(wait=False)  # never join a peer stuck in the collective
        self.client.finish_weight_update()

    def _broadcast(self, meta: list[ParamMeta]) -> None:
        assert self.source is not None and self.group is not None
        self.bytes_sent += broadcast_source(self.group, self.source, meta, self.buffer_bytes)

    def shutdown(self) -> None:
        group, self.group, self.store = self.group, None, None
        if group is not None:
            with contextlib.suppress(AttributeError, RuntimeError):
                group.shutdown()


def broadcast_source(group: Any, source: WeightSource, meta: list[ParamMeta],
                     buffer_bytes: int, progress: Callable[[int], None] | None = None) -> int:
    """Broadcast ``source``'s tensors (checked against ``meta``) from rank 0, packed into
    uint8 buffers as :func:`plan_buffers` cuts them; the bytes sent."""
    sizes = [nbytes_of(dtype_name(m.dtype), m.shape) for m in meta]
    plan = plan_buffers(sizes, buffer_bytes)
    pairs = checked_iter(source, meta)

    def packed() -> Iterator[torch.Tensor]:
        for idx in plan:
            buf = torch.empty(sum(sizes[i] for i in idx), dtype=torch.uint8)
            off = 0
            for i in idx:
                _name, t = next(pairs)
                flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
                buf[off:off + sizes[i]].copy_(flat)
                off += sizes[i]
            yield buf
        for extra, _t in pairs:  # metadata declared fewer than iteration yields
            raise ValueError(f"WeightSource yielded more parameters than declared: "
                             f"{extra!r}")

    sent = 0
    for buf in pipelined(packed()):
        _broadcast(group, buf)
        sent += int(buf.numel())
        if progress is not None:
            progress(sent)
    return sent


def stage_over_gloo(stage_call: Any, source: WeightSource, *, master_address: str,
                    world_size: int, buffer_bytes: int, timeout_s: float,
                    progress: Callable[[int], None] | None = None
                    ) -> tuple[int, list[dict[str, Any]]]:
    """The trainer's half of a staged update over gloo: open the store (rank 0), ask the
    engine's workers to join and receive in the background (``stage_call(**kwargs)``
    returns each worker's answer at once), broadcast ``source``, close the group. The
    bytes sent and the workers' answers (nothing is sent unless every worker started).
    An error (the source failing mid-stream included) is raised after the group is shut
    down, so that the workers' receive fails at once rather than at its timeout."""
    meta = source.metadata()
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(master_address, 0, world_size, True, timeout=timeout,
                          wait_for_workers=False)
    started: list[dict[str, Any]] = stage_call(
        master_address=master_address, master_port=int(store.port), world_size=world_size,
        names=[m.name for m in meta], dtype_names=[dtype_name(m.dtype) for m in meta],
        shapes=[list(m.shape) for m in meta], packed_buffer_size_bytes=buffer_bytes,
        timeout_s=timeout_s)
    if len(started) != world_size - 1 or not all(r.get("started") is True for r in started):
        return 0, started
    group = dist.ProcessGroupGloo(store, 0, world_size, timeout)
    try:
        return broadcast_source(group, source, meta, buffer_bytes, progress), started
    finally:
        with contextlib.suppress(AttributeError, RuntimeError):
            group.shutdown()


def _complete_rendezvous(store: Any, world_size: int, pending: Any) -> None:
    def join(rank: int) -> None:
        try:
            timeout = datetime.timedelta(seconds=10)
            client = dist.TCPStore(store.host, store.port, world_size, False, timeout=timeout)
            g = dist.ProcessGroupGloo(client, rank, world_size, timeout)
            g.shutdown()
        except (RuntimeError, AttributeError):
            pass

    threads = [threading.Thread(target=join, args=(r,), daemon=True)
               for r in range(1, world_size)]
    for t in threads:
        t.start()
    try:
        g0 = pending.result(timeout=15)
        g0.shutdown()
    except Exception:
        pass


def checked_iter(source: WeightSource, meta: list[ParamMeta]) -> Iterator[
        tuple[str, torch.Tensor]]:
    """The source's pairs, each checked against the declared metadata (as NCCL does)."""
    i = 0
    for name, t in source:
        if i >= len(meta):
            yield name, t
            return
        m = meta[i]
        if name != m.name or t.dtype != m.dtype or tuple(t.shape) != tuple(m.shape):
            raise ValueError(f"WeightSource disagrees with its metadata at {i}: declared "
                             f"{m.name!r} {m.dtype} {tuple(m.shape)}, got {name!r} {t.dtype} "
                             f"{tuple(t.shape)}")
        i += 1
        yield name, t
    if i != len(meta):
        raise ValueError(f"WeightSource yielded {i} parameters, metadata declared {len(meta)}")


# ----------------------------------------------------------------------- registration


def register() -> None:
    """The ``vllm.general_plugins`` entry point: registers ``gloo`` (and ``nccl_rc``,
    lazily) on both factories.
    vLLM calls it in several processes, sometimes more than once: repeats are no-ops."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    pairs: list[tuple[Any, Any]] = [(WeightTransferEngineFactory, GlooWeightTransferEngine),
                                     (WeightTransferTrainerFactory,
                                      GlooTrainerWeightTransferEngine)]
    for factory, cls in pairs:
        registry: dict[str, Any] = getattr(factory, "_registry", {})
        if BACKEND in registry:
            continue
        with contextlib.suppress(ValueError):  # registered concurrently
            factory.register_engine(BACKEND, cls)
    # The digesting NCCL variant, by module path: nothing CUDA-only is imported here.
    from rolloutcore.adapters.nccl_transfer import register_nccl_rc

    register_nccl_rc()


__all__ = ["BACKEND", "GlooTrainerInitInfo", "GlooTrainerWeightTransferEngine",
           "GlooWeightTransferEngine", "GlooWeightTransferInitInfo",
           "GlooWeightTransferUpdateInfo", "TransferWorkerExtension", "plan_buffers",
           "register"]
