"""A vLLM worker extension: the engine's own word on which weights it holds.

Loaded with ``--worker-extension-cls rolloutcore.adapters.vllm_worker.RolloutCoreWorkerExtension``
together with ``--load-format rolloutcore`` (both in :data:`SERVER_ARGS`); vLLM mixes the
class into its worker class and each method is callable by name through
``POST /collective_rpc {"method": "rc_...", "kwargs": {...}}``. Every result is a dict
of plain JSON types: the route passes dicts through, and in single-process mode a
``collective_rpc`` result that cannot be serialised wedges the server for good (``/health``
still answers 200, SIGTERM is ignored).

The identity of the weights is captured when they are loaded, never re-read from disk
when asked: reading the files at ``model_config.model`` would vouch for whatever was
written there since, not for what the worker holds.

* ``rc_identity()`` reports the :class:`rolloutcore.engine.identity.IdentityHasher` digest of
  the bytes the last finished load fed into the model, with its ``basis``: ``"bytes
  loaded at startup"`` and ``"bytes loaded by reload_weights"`` (vLLM's own reload, with
  or without ``weights_path``) come from the ``rolloutcore`` load format
  (:mod:`rolloutcore.adapters.vllm_loader`), ``"bytes loaded by rc_reload_weights"``
  from the method below. It reports no identity (``identity: None`` and a ``reason``)
  when RolloutCore saw no load (vLLM started with another load format), while a load is
  unfinished or after it failed, after weights came in through a path that RolloutCore
  does not digest, with any parameter on the meta device, or while a layerwise reload
  is not finalised.
* ``rc_reload_weights(weights_path, expected_identity="")`` reads the checkpoint's
  safetensors itself, digests (name, dtype, shape, bytes) in one pass and loads exactly
  those bytes through the worker's own in-place ``reload_weights(weights_iterator=...)``.
  Before touching the model it refuses (``loaded: false``, nothing changed) an
  unreadable checkpoint, one whose manifest differs from the one loaded, or whose
  identity is not ``expected_identity``: vLLM's own ``reload_weights`` would instead die
  halfway and leave the engine broken.
* ``rc_param_digest()`` digests the parameters as the worker holds them, listing those
  it cannot read (on CPU, linear layers are repacked for oneDNN and read as empty).
* ``rc_cache_info()`` what the engine says about its cache tiers: whether the model has
  a multimodal encoder at all, the encoder cache's keys in the worker and in the
  scheduler (both halves: a reset counts only when both are empty), and the engine's
  multimodal receiver-cache size.
* ``rc_stage_lora(source, expected_identity, epoch=None)`` copies a LoRA adapter into a
  fresh read-only directory and digests it; ``rc_lora_identity(name)`` reports the digest
  of the adapter vLLM last loaded under ``name`` if RolloutCore staged it
  (:mod:`.vllm_lora`).
* ``rc_peer_serve(host, token)`` makes this worker a peer source
  (:mod:`rolloutcore.engine.peer`): it serves the bytes of its complete staging, or of
  what it installed from one, to another engine's ``rc_stage`` of the source's URL.
* ``rc_fence(epoch)`` raises the worker's fencing token (:mod:`.epoch_gate`) and
  ``rc_epoch()`` reads it: ``rc_reload_weights(..., epoch=e)`` below the fence is refused
  before the model is touched (controller failover: a deposed controller's load never
  lands once a newer leader fenced the engine).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from rolloutcore.adapters import vllm_lora
from rolloutcore.adapters.epoch_gate import GATE
from rolloutcore.engine.delta import read_delta
from rolloutcore.engine.identity import CheckpointError, IdentityHasher, checkpoint_entries
from rolloutcore.engine.peer import (
    PeerServer,
    PeerSourceError,
    PeerStream,
    PeerTensor,
    is_peer_url,
)

EXTENSION_CLS = "rolloutcore.adapters.vllm_worker.RolloutCoreWorkerExtension"
GATEWAY_FENCE_CLS = "rolloutcore.adapters.gateway_fence.GatewayFence"
LOAD_FORMAT = "rolloutcore"  # = rolloutcore.adapters.vllm_loader.LOAD_FORMAT (no vLLM import)
#: What a vLLM server needs on its command line for this extension to vouch for weights;
#: ``--enable-prompt-tokens-details`` makes every completion report the prompt tokens it
#: took from the prefix cache (``usage.prompt_tokens_details.cached_tokens``): the probe's
#: own stale-cache evidence, without reading the counters around it.
#: ``--middleware`` adds the gateway fence (:mod:`.gateway_fence`): a request stamped by a
#: gateway whose lease ended is refused before vLLM sees it.
SERVER_ARGS: tuple[str, ...] = ("--worker-extension-cls", EXTENSION_CLS,
                                "--load-format", LOAD_FORMAT,
                                "--enable-prompt-tokens-details",
                                "--middleware", GATEWAY_FENCE_CLS)
#: The same for an engine built in Python (``AsyncEngineArgs(**ENGINE_ARGS, ...)``: a
#: framework's own engine actor adopting RolloutCore).
ENGINE_ARGS: dict[str, str] = {"worker_extension_cls": EXTENSION_CLS, "load_format": LOAD_FORMAT}
#: How long a peer source's stream may stay silent before the staging fails (the stage
#: deadline bounds the whole; this frees the background reader of a source gone silent).
PEER_READ_TIMEOUT_S = 30.0


def _register_loader() -> None:
    """Inside a vLLM process (vLLM imports this module in ``init_worker``, before it
    builds the worker and loads the model) register the ``rolloutcore`` load format.
    Elsewhere (a harness reading :data:`SERVER_ARGS`) import nothing heavy."""
    if "vllm" in sys.modules:
        from rolloutcore.adapters.vllm_loader import register

        register()


_register_loader()
vllm_lora.install_load_hook()


class RolloutCoreWorkerExtension:
    """Mixed into vLLM's worker class; every name starts with ``rc_`` (no clashes)."""

    # Provided by the worker class this is mixed into.
    model_runner: Any
    vllm_config: Any

    # ------------------------------------------------------------------ helpers

    def _rc_model(self) -> Any:
        return self.model_runner.get_model()

    def _rc_meta_params(self) -> list[str]:
        return [n for n, p in self._rc_model().named_parameters() if p.device.type == "meta"]

    # ------------------------------------------------------------------ rpc methods

    def rc_fence(self, epoch: int) -> dict[str, Any]:
        """Raise this worker's fence to ``epoch`` (refused below it): from then on every
        fenced effect from an older epoch is refused here (see :mod:`.epoch_gate`)."""
        accepted, seen = GATE.fence(int(epoch))
        return {"accepted": accepted, "seen": seen}

    def rc_epoch(self) -> dict[str, Any]:
        return {"seen": GATE.seen}

    def rc_reload_weights(self, weights_path: str, expected_identity: str = "",
                          epoch: int | None = None) -> dict[str, Any]:
        """Load ``weights_path`` in place; refuse (nothing changed) if it cannot fit, or if
        ``epoch`` is below this worker's fence (a deposed controller sent it)."""
        with GATE.hold(epoch) as ok:
            if not ok:
                return {"loaded": False, "fenced": True, "seen": GATE.seen,
                        "refused": GATE.refusal(epoch)}
            return self._rc_reload_weights(weights_path, expected_identity)

    def _rc_held_manifest(self) -> str | None:
        """The manifest the model holds: the current identity's, else (a failed load since)
        that of the last load that finished."""
        from rolloutcore.adapters import vllm_loader as vl

        state = vl.load_state(self._rc_model())
        held = self.rc_identity().get("manifest") or (
            state.manifest if state is not None else None)
        return str(held) if held else None

    def _rc_checked_entries(self, path: str) -> tuple[list[Any], str] | str:
        """The checkpoint's entries and manifest if the model can take them; else why not
        (nothing read, nothing changed)."""
        from rolloutcore.adapters import vllm_loader as vl

        try:
            entries = checkpoint_entries(path)
        except (CheckpointError, OSError) as e:
            return f"unreadable checkpoint: {e}"
        held = self._rc_held_manifest()
        manifest = vl.manifest_of(entries)
        if held and held != manifest:
            return "manifest (names, dtypes, shapes) differs from the loaded checkpoint's"
        bad = vl.unsupported_dtypes(entries)
        if bad:
            return f"unsupported dtype(s) {bad}"
        return entries, manifest

    def _rc_reload_weights(self, weights_path: str, expected_identity: str) -> dict[str, Any]:
        from rolloutcore.adapters import vllm_loader as vl

        t0 = time.perf_counter()
        path = os.path.abspath(str(weights_path))
        checked = self._rc_checked_entries(path)
        if isinstance(checked, str):
            return {"loaded": False, "refused": checked}
        entries, manifest = checked
        # Read and digest every byte before the model is touched: a torn or wrong file is
        # refused here, while refusing still proves that nothing changed.
        h = IdentityHasher()
        tensors: list[tuple[str, Any]] = []
        try:
            for ent, t in vl.read_tensors(entries, h):
                tensors.append((ent.name, t))
        except (CheckpointError, OSError, ValueError, RuntimeError) as e:
            return {"loaded": False, "refused": f"cannot read the checkpoint: {e}"}
        identity = h.hexdigest()
        if expected_identity and identity != expected_identity:
            return {"loaded": False, "refused": f"identity {identity[:16]} is not the expected "
                    f"{str(expected_identity)[:16]}", "identity": identity}
        return self._rc_install(path, tensors, h, manifest, t0, time.perf_counter() - t0)

    def _rc_install(self, path: str, tensors: list[tuple[str, Any]], h: IdentityHasher,
                    manifest: str, t0: float, read_s: float,
                    basis: str = "") -> dict[str, Any]:
        """Load digested tensors in place (vLLM's own reload, post-load processing
        included) and record what the model now holds."""
        from rolloutcore.adapters import vllm_loader as vl

        identity = h.hexdigest()
        model = self._rc_model()
        # From here on the model changes; a failure leaves it unvouched for and says so.
        vl.watch(model)
        vl.begin_load(model, f"rc_reload_weights of {path} did not finish")
        reload: Any = getattr(self, "reload_weights")  # noqa: B009 - the worker's method
        reload(weights_iterator=vl.PreDigested(tensors), is_checkpoint_format=True)
        # vLLM's own no-argument reload re-reads model_config.model: keep it truthful.
        cfg = self.vllm_config.model_config
        cfg.model = path
        vl.complete_load(model, {"path": path, "identity": identity, "manifest": manifest,
                                 "tensors": h.tensors, "bytes": h.nbytes,
                                 "basis": basis or vl.BASIS_RC_RELOAD})
        return {"loaded": True, "identity": identity, "manifest": manifest,
                "tensors": h.tensors, "bytes": h.nbytes, "read_s": round(read_s, 4),
                "seconds": round(time.perf_counter() - t0, 4)}

    # ------------------------------------------------------------ staged updates

    def rc_stage(self, weights_path: str, epoch: int | None = None,
                 rank_paths: dict[str, str] | None = None,
                 peer_token: str | None = None) -> dict[str, Any]:
        """Start staging ``weights_path`` into a host-memory buffer of this worker, on a
        background thread: the call returns at once and the engine keeps serving (a
        ``collective_rpc`` that ran for the whole read would stop generation). Refused,
        nothing staged, below the fence, when the model could not take the checkpoint
        (manifest, dtypes) or when the copy would not fit in available memory.
        ``rank_paths``: where a rank reads instead (1-based rank -> directory: ranks on
        other hosts reading local copies); vLLM's loader takes each rank's shard of the
        full tensors at install, so every rank stages the whole checkpoint. A peer
        source's URL (another engine's ``rc_peer_serve``) is read with ``peer_token``."""
        with GATE.hold(epoch) as ok:
            if not ok:
                return {"started": False, "fenced": True, "refused": GATE.refusal(epoch)}
            own = (rank_paths or {}).get(str(self._rc_rank()), weights_path)
            if is_peer_url(str(own)):
                return self._rc_stage_peer(str(own), str(peer_token or ""))
            path = os.path.abspath(str(own))
            try:
                delta = read_delta(path)
            except CheckpointError as e:
                return {"started": False, "rank": self._rc_rank(), "refused": str(e)}
            if delta is not None:
                return self._rc_stage_delta(path, delta)
            checked = self._rc_checked_entries(path)
            if isinstance(checked, str):
                return {"started": False, "rank": self._rc_rank(), "refused": checked}
            entries, manifest = checked
            need = sum(int(e.nbytes) for e in entries)
            free = _available_bytes()
            if free is not None and need > free:
                return {"started": False, "rank": self._rc_rank(), "refused": (
                    f"a staging copy needs {need} bytes of host memory, {free} are "
                    "available")}
            STAGE.start(path, entries, manifest)
            return {"started": True, "rank": self._rc_rank(), "bytes": need}

    def _rc_stage_peer(self, url: str, token: str) -> dict[str, Any]:
        """Stage what a peer source streams: its header checked against the model's
        manifest before anything is kept, every tensor digested as it arrives (the
        identity decides, as from any source); a source gone mid-stream leaves the
        staging incomplete, with what it got that far as the error."""
        from rolloutcore.adapters import vllm_loader as vl

        rank = self._rc_rank()
        try:
            stream = PeerStream(url, token, PEER_READ_TIMEOUT_S)
        except PeerSourceError as e:
            return {"started": False, "rank": rank, "refused": str(e)}
        held, manifest = self._rc_held_manifest(), vl.manifest_of(stream.entries)
        need = sum(e.nbytes for e in stream.entries)
        free = _available_bytes()
        why = ("manifest (names, dtypes, shapes) differs from the loaded checkpoint's"
               if held and held != manifest else
               f"unsupported dtype(s) {vl.unsupported_dtypes(stream.entries)}"
               if vl.unsupported_dtypes(stream.entries) else
               f"a staging copy needs {need} bytes of host memory, {free} are available"
               if free is not None and need > free else None)
        if why is not None:
            stream.close()
            return {"started": False, "rank": rank, "refused": why}

        def fill(h: IdentityHasher) -> Iterator[tuple[str, str, Any]]:
            with stream:
                for e, data in stream.tensors():
                    h.add(e.name, e.dtype, e.shape, data)
                    yield e.name, e.dtype, vl.tensor_of(e.dtype, e.shape, data)

        STAGE.start_fill(url, len(stream.entries), manifest, fill)
        return {"started": True, "rank": rank, "bytes": need, "peer": True}

    def rc_peer_serve(self, host: str, token: str) -> dict[str, Any]:
        """Serve this worker's complete staging, or what it installed from one, to other
        engines' stagings (:mod:`rolloutcore.engine.peer`) on ``host`` (the interface the
        controller reaches this engine at) to requests carrying ``token``. Idempotent:
        the server already running for that host and token answers."""
        return {"rank": self._rc_rank(), "port": PEER.serve(host, token)}

    def _rc_stage_delta(self, path: str, delta: Any) -> dict[str, Any]:
        """Stage a delta on the base this worker holds: the changed tensors are read, the
        rest taken from the base, and every tensor digested in order, so the staged
        identity is the full target's (or not: then the controller refuses it)."""
        from rolloutcore.adapters import vllm_loader as vl

        rank = self._rc_rank()
        base = STAGE.base()
        if base is None or base.identity != delta.base:
            held = "no staged base" if base is None else base.identity[:16]
            return {"started": False, "rank": rank, "refused": (
                f"a delta on base {delta.base[:16]}; this rank holds {held}")}
        try:
            entries = checkpoint_entries(path)
        except (CheckpointError, OSError) as e:
            return {"started": False, "rank": rank, "refused": f"unreadable delta: {e}"}
        shapes = {name: (dtype, tuple(t.shape)) for name, dtype, t in base.tensors}
        bad = [e.name for e in entries if shapes.get(e.name) != (e.dtype, tuple(e.shape))]
        if bad:
            return {"started": False, "rank": rank, "refused": f"the delta's tensors "
                    f"{bad[:3]} are not the base's (name, dtype, shape)"}

        def fill(h: IdentityHasher) -> Iterator[tuple[str, str, Any]]:
            changed = {e.name: t for e, t in vl.read_tensors(entries, IdentityHasher())}
            for name, dtype, t in base.tensors:
                out = changed.get(name, t)
                raw = out.reshape(-1).view(_uint8()).numpy().data if out.numel() else b""
                h.add(name, dtype, tuple(out.shape), raw)
                yield name, dtype, out

        STAGE.start_fill(path, len(base.tensors), base.manifest, fill,
                         received=sum(e.nbytes for e in entries))
        return {"started": True, "rank": rank, "bytes": delta.nbytes, "delta": True}

    def rc_stage_status(self) -> dict[str, Any]:
        """What this worker's staging buffer holds: done or not, its digest, and what
        went wrong (the controller decides from it; nothing here decides)."""
        return {"rank": self._rc_rank(), **STAGE.status()}

    def rc_stage_discard(self) -> dict[str, Any]:
        STAGE.discard()
        return {"rank": self._rc_rank(), "discarded": True}

    def rc_install_staged(self, expected_identity: str, epoch: int | None = None,
                          check_identity: bool = True) -> dict[str, Any]:
        """Install the staged buffer (the closed window's only mutation). Refused, nothing
        changed, below the fence or unless the buffer is complete with identity
        ``expected_identity`` and the model's manifest. ``check_identity=False`` installs
        whatever the buffer holds: the conformance suite's negative control (an install
        without prepared evidence mixes weights across ranks), never the runner's path."""
        with GATE.hold(epoch) as ok:
            if not ok:
                return {"loaded": False, "fenced": True, "seen": GATE.seen,
                        "refused": GATE.refusal(epoch)}
            t0 = time.perf_counter()
            staged = STAGE.take(str(expected_identity) if check_identity else None)
            if isinstance(staged, str):
                return {"loaded": False, "refused": staged}
            path, tensors, h, manifest = staged
            if self._rc_held_manifest() not in (None, manifest):
                return {"loaded": False, "refused": "the staged manifest (names, dtypes, "
                        "shapes) is not the model's"}
            from rolloutcore.adapters.vllm_loader import BASIS_RC_STAGED

            return self._rc_install(path, tensors, h, manifest, t0, 0.0, BASIS_RC_STAGED)

    def _rc_rank(self) -> int:
        return int(getattr(self, "rank", 0) or 0) + 1

    def rc_stage_lora(self, source: str, expected_identity: str,
                      epoch: int | None = None) -> dict[str, Any]:
        """Copy the LoRA adapter at ``source`` into a fresh read-only directory of this
        worker, digested; the path vLLM should load it from (:mod:`.vllm_lora`). Refused
        (nothing staged) below the fence or when the digest is not ``expected_identity``."""
        with GATE.hold(epoch) as ok:
            if not ok:
                return {"staged": None, "fenced": True, "seen": GATE.seen,
                        "refused": GATE.refusal(epoch)}
            return vllm_lora.stage(source, expected_identity)

    def rc_lora_identity(self, name: str) -> dict[str, Any]:
        """The staged digest of the adapter vLLM last loaded under ``name``, or none."""
        manager = getattr(getattr(self.model_runner, "lora_manager", None),
                          "_adapter_manager", None)
        held = {int(i) for i in manager.list_adapters()} if manager is not None else None
        return vllm_lora.identity_of(str(name), held)

    def rc_identity(self) -> dict[str, Any]:
        """Identity of the weights this worker holds, as recorded when they were loaded
        (None, with a reason, if it cannot vouch for any). Reads no checkpoint file."""
        from rolloutcore.adapters import vllm_loader as vl

        model = self._rc_model()
        state = vl.load_state(model)
        if state is None or (state.loaded is None and state.broken is None):
            fmt = getattr(self.vllm_config.load_config, "load_format", None)
            return {"identity": None, "reason": "no load observed by RolloutCore: vLLM "
                    f"loaded these weights itself (load format {fmt!r}); start it with "
                    f"--load-format {vl.LOAD_FORMAT} or load with rc_reload_weights"}
        if state.broken:
            return {"identity": None, "reason": state.broken}
        meta = self._rc_meta_params()
        if meta:
            return {"identity": None, "reason": f"{len(meta)} parameter(s) on the meta device "
                    f"(a failed load), e.g. {meta[0]}"}
        pending = vl.unfinished_layerwise(model)
        if pending:
            return {"identity": None, "reason": f"{pending} layer(s) of a layerwise reload "
                    "were not finalised (a failed load)"}
        assert state.loaded is not None
        return dict(state.loaded)

    def rc_param_digest(self) -> dict[str, Any]:
        """sha256 over the parameters as held; lists what cannot be read."""
        import torch

        h = IdentityHasher()
        unreadable: list[str] = []
        for name, p in sorted(self._rc_model().named_parameters()):
            t = p.detach()
            if t.device.type == "meta":
                unreadable.append(f"{name} (meta)")
                continue
            if t.numel() == 0:
                unreadable.append(f"{name} (empty: repacked)")
                continue
            try:
                raw = t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
            except (RuntimeError, TypeError) as e:
                unreadable.append(f"{name} ({type(e).__name__})")
                continue
            h.add(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), raw)
        return {"digest": h.hexdigest(), "readable": h.tensors, "bytes": h.nbytes,
                "unreadable": unreadable}

    def rc_cache_info(self) -> dict[str, Any]:
        """What the engine itself says about its cache tiers.

        The encoder cache has two halves that must agree: the worker's tensors
        (``model_runner.encoder_cache``) and the scheduler's bookkeeping
        (``EncoderCacheManager.cached``). vLLM's ``reload_weights`` clears only the
        former; the scheduler then believes an image is cached, skips the encoder and
        the engine dies with "Encoder cache miss". So both are counted. The multimodal
        tier's engine half is the receiver cache of processed inputs (P1). The scheduler
        and receiver cache live in the engine-core process; they are reachable here only
        when the worker runs in that process (the uniprocess executor: the RPC is then
        called synchronously from ``EngineCore.collective_rpc``, whose ``self`` is on
        this stack). Elsewhere they are ``None``: unknown, never assumed empty.
        """
        cfg = self.vllm_config.model_config
        enc = getattr(self.model_runner, "encoder_cache", None)
        core = _engine_core_on_stack()
        scheduler_keys: list[str] | None = None
        receiver: int | None = None
        if core is not None:
            manager = getattr(core.scheduler, "encoder_cache_manager", None)
            cached = getattr(manager, "cached", None)
            scheduler_keys = sorted(cached) if isinstance(cached, dict) else None
            rcache = getattr(core, "mm_receiver_cache", "unreadable")
            if rcache is None:
                receiver = 0  # this engine keeps no receiver cache at all
            else:
                inner = getattr(rcache, "_cache", None)
                receiver = len(inner) if inner is not None else None
        worker_keys = sorted(enc) if isinstance(enc, dict) else None
        return {"multimodal": bool(cfg.is_multimodal_model),
                "encoder_cache_entries": len(worker_keys) if worker_keys is not None
                else None,
                "encoder_cache_keys": worker_keys,
                "encoder_scheduler_entries": len(scheduler_keys)
                if scheduler_keys is not None else None,
                "encoder_scheduler_keys": scheduler_keys,
                "mm_receiver_entries": receiver}


class Base(NamedTuple):
    """A host copy of the weights a worker installed last (what a delta applies to)."""

    identity: str
    manifest: str
    tensors: tuple[tuple[str, str, Any], ...]  # (name, safetensors dtype, tensor), sorted


class _Stage:
    """This worker's staging buffer: tensors read and digested by a background thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gen = 0  # a newer staging (or a discard) supersedes a running one
        self._state: dict[str, Any] = {"done": True, "complete": False, "identity": None,
                                       "error": "nothing staged"}
        self._held: tuple[str, list[tuple[str, Any]], IdentityHasher, str] | None = None
        self._dtypes: list[str] = []
        self._base: Base | None = None

    def start(self, path: str, entries: list[Any], manifest: str) -> None:
        """Stage the checkpoint ``entries`` (read from ``path``)."""
        from rolloutcore.adapters import vllm_loader as vl

        def read(h: IdentityHasher) -> Iterator[tuple[str, str, Any]]:
            for ent, t in vl.read_tensors(entries, h):
                yield ent.name, ent.dtype, t

        self.start_fill(path, len(entries), manifest, read)

    def start_fill(self, source: str, count: int, manifest: str,
                   fill: Callable[[IdentityHasher], Iterator[tuple[str, str, Any]]],
                   received: int | None = None) -> None:
        """Stage what ``fill`` yields (``count`` tensors as (name, safetensors dtype,
        tensor), each digested into the hasher it is given as it arrives), on a background
        thread; ``source`` names where from, ``received`` the bytes that travelled (a
        delta's: the rest come from the base)."""
        with self._lock:
            self._gen += 1
            gen = self._gen
            self._held = None
            self._state = {"done": False, "complete": False, "identity": None,
                           "error": None, "tensors": 0, "bytes": 0, "path": source,
                           "started": time.time()}
        threading.Thread(target=self._fill, args=(gen, source, count, manifest, fill,
                                                  received),
                         name="rolloutcore-stage", daemon=True).start()

    def _fill(self, gen: int, path: str, count: int, manifest: str,
              fill: Callable[[IdentityHasher], Iterator[tuple[str, str, Any]]],
              received: int | None) -> None:
        t0 = time.perf_counter()
        h = IdentityHasher()
        tensors: list[tuple[str, Any]] = []
        dtypes: list[str] = []
        error: str | None = None
        try:
            for name, dtype, t in fill(h):
                tensors.append((name, t))
                dtypes.append(dtype)
                if gen != self._gen:
                    return  # superseded: let the buffer go
        except Exception as e:  # any failure of a staging is its evidence
            error = f"{type(e).__name__}: {e}"
        with self._lock:
            if gen != self._gen:
                return
            complete = error is None and len(tensors) == count
            self._state = {"done": True, "complete": complete,
                           "identity": h.hexdigest() if complete else None, "error": error,
                           "tensors": h.tensors,
                           "bytes": h.nbytes if received is None else received,
                           "path": path, "seconds": round(time.perf_counter() - t0, 4)}
            self._held = (path, tensors, h, manifest) if complete else None
            self._dtypes = dtypes

    def status(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._state)

    def discard(self) -> None:
        with self._lock:
            self._gen += 1
            self._held = None
            self._state = {"done": True, "complete": False, "identity": None,
                           "error": "discarded"}

    def take(self, identity: str | None
             ) -> tuple[str, list[tuple[str, Any]], IdentityHasher, str] | str:
        """The staged buffer if it is complete with ``identity`` (any, with None; it is
        handed over: the buffer is empty after), else why not."""
        with self._lock:
            held = self._held
            if held is None or not self._state.get("done"):
                return "no complete staged buffer"
            if identity is not None and held[2].hexdigest() != identity:
                return f"the staged identity {held[2].hexdigest()[:16]} is not {identity[:16]}"
            self._gen += 1
            self._held = None
            self._state = {"done": True, "complete": False, "identity": None,
                           "error": "installed"}
            # What is installed becomes the base a delta applies to (a host copy).
            self._base = Base(held[2].hexdigest(), held[3], tuple(
                (name, dtype, t) for (name, t), dtype in zip(held[1], self._dtypes,
                                                             strict=True)))
            return held

    def base(self) -> Base | None:
        """The weights this worker last installed from a staging (a delta's base)."""
        with self._lock:
            return self._base

    def peer_tensors(self, identity: str) -> list[PeerTensor] | None:
        """The bytes of ``identity`` this worker holds for a peer: its complete staging's,
        or those it installed from one; None if it holds neither."""
        with self._lock:
            if self._held is not None and self._held[2].hexdigest() == identity:
                named = [(name, dtype, t) for (name, t), dtype in zip(
                    self._held[1], self._dtypes, strict=True)]
            elif self._base is not None and self._base.identity == identity:
                named = list(self._base.tensors)
            else:
                return None
        return [(name, dtype, tuple(t.shape),
                 t.reshape(-1).view(_uint8()).numpy().data if t.numel() else b"")
                for name, dtype, t in named]


STAGE = _Stage()


class _Peer:
    """This worker's peer source server (one per worker process, started on demand)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: PeerServer | None = None

    def serve(self, host: str, token: str) -> int:
        with self._lock:
            srv = self._server
            if srv is not None and (srv.host, srv.token) != (host, token):
                srv.close()
                srv = None
            if srv is None:
                srv = self._server = PeerServer(STAGE.peer_tensors, token=token, host=host)
            return srv.port


PEER = _Peer()


def _uint8() -> Any:
    import torch

    return torch.uint8


def _available_bytes() -> int | None:
    """Host memory available for a staging copy (``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _engine_core_on_stack() -> Any:
    """The vLLM ``EngineCore`` that called this RPC in this process, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and hasattr(owner, "scheduler") and \
                hasattr(owner, "mm_receiver_cache"):
            return owner
        frame = frame.f_back  # type: ignore[assignment]
    return None
