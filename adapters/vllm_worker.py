"""A vLLM worker extension: weight reloads whose identity the engine itself computes.

Loaded with ``--worker-extension-cls rolloutcore.adapters.vllm_worker.RolloutCoreWorkerExtension``;
vLLM mixes it into its worker class and each method is callable by name through
``POST /collective_rpc {"method": "rc_...", "kwargs": {...}}``. Every result is a dict
of plain JSON types: the route passes dicts through, and in single-process mode a
result that cannot be serialised wedges the server for good (REFERENCE.md).

* ``rc_reload_weights(weights_path, expected_identity="")`` reads the checkpoint's
  safetensors itself, digests (name, dtype, shape, bytes) with
  :class:`rolloutcore.identity.IdentityHasher` and loads exactly those bytes through
  the worker's own in-place ``reload_weights(weights_iterator=...)``. Before touching
  the model it refuses (``loaded: false``, nothing changed) a checkpoint whose manifest
  differs from the one loaded, or whose identity is not ``expected_identity``: vLLM's
  own ``reload_weights`` would instead die halfway and leave the engine broken.
* ``rc_identity()`` reports the identity of what the worker holds. After an
  ``rc_reload_weights`` it is the digest of the loaded bytes. Before any (startup) it is
  computed lazily from the files at ``model_config.model``, the path vLLM loaded at
  startup (or the one its own ``reload_weights`` last pointed it at): a digest of the
  files, not of the load, which is the best a worker can say about weights it did not
  load itself; ``basis`` says which. A failed load, or any parameter left on the meta
  device, yields no identity at all.
* ``rc_param_digest()`` digests the parameters as the worker holds them, listing those
  it cannot read (on CPU, linear layers are repacked for oneDNN and read as empty).
* ``rc_cache_info()`` what the engine says about its cache tiers: whether the model has
  a multimodal encoder at all, and the worker's encoder-cache entry count.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rolloutcore.identity import (
    CheckpointError,
    IdentityHasher,
    TensorEntry,
    checkpoint_entries,
    iter_tensor_bytes,
)

_TORCH_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "BOOL": "bool",
}


def _manifest(entries: list[TensorEntry]) -> str:
    h = IdentityHasher(manifest_only=True)
    for e in entries:
        h.add(e.name, e.dtype, e.shape)
    return h.hexdigest()


def _files_key(path: str) -> tuple[tuple[str, int, int], ...]:
    out = []
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            st = os.stat(os.path.join(path, name))
            out.append((name, st.st_size, st.st_mtime_ns))
    return tuple(out)


class RolloutCoreWorkerExtension:
    """Mixed into vLLM's worker class; every name starts with ``rc_`` (no clashes)."""

    # Provided by the worker class this is mixed into.
    model_runner: Any
    vllm_config: Any

    # ------------------------------------------------------------------ helpers

    def _rc_state(self) -> dict[str, Any]:
        st: dict[str, Any] | None = self.__dict__.get("_rc_state_dict")
        if st is None:
            st = {"loaded": None, "broken": None, "files_cache": {}}
            self.__dict__["_rc_state_dict"] = st
        return st

    def _rc_model(self) -> Any:
        return self.model_runner.get_model()

    def _rc_meta_params(self) -> list[str]:
        return [n for n, p in self._rc_model().named_parameters() if p.device.type == "meta"]

    def _rc_files_identity(self, path: str) -> dict[str, Any]:
        cache: dict[Any, dict[str, Any]] = self._rc_state()["files_cache"]
        key = (path, _files_key(path))
        hit = cache.get(key)
        if hit is None:
            entries = checkpoint_entries(path)
            h = IdentityHasher()
            for e, data in iter_tensor_bytes(entries):
                h.add(e.name, e.dtype, e.shape, data)
            hit = {"identity": h.hexdigest(), "manifest": _manifest(entries),
                   "tensors": h.tensors, "bytes": h.nbytes}
            cache.clear()
            cache[key] = hit
        return hit

    # ------------------------------------------------------------------ rpc methods

    def rc_reload_weights(self, weights_path: str, expected_identity: str = "") -> dict[str, Any]:
        """Load ``weights_path`` in place; refuse (nothing changed) if it cannot fit."""
        import torch

        t0 = time.perf_counter()
        st = self._rc_state()
        path = os.path.abspath(str(weights_path))
        try:
            entries = checkpoint_entries(path)
        except (CheckpointError, OSError) as e:
            return {"loaded": False, "refused": f"unreadable checkpoint: {e}"}
        current = self.rc_identity()
        manifest = _manifest(entries)
        if current.get("manifest") and current["manifest"] != manifest:
            return {"loaded": False, "refused": "manifest (names, dtypes, shapes) differs from "
                    "the loaded checkpoint's"}
        bad = sorted({e.dtype for e in entries} - _TORCH_DTYPES.keys())
        if bad:
            return {"loaded": False, "refused": f"unsupported dtype(s) {bad}"}
        # Read and digest every byte before the model is touched: a torn or wrong file is
        # refused here, while refusing still proves that nothing changed.
        h = IdentityHasher()
        tensors: list[tuple[str, Any]] = []
        try:
            for ent, data in iter_tensor_bytes(entries):
                h.add(ent.name, ent.dtype, ent.shape, data)
                dtype = getattr(torch, _TORCH_DTYPES[ent.dtype])
                buf = bytearray(data)
                t = (torch.frombuffer(buf, dtype=dtype) if buf else
                     torch.empty(0, dtype=dtype)).reshape(ent.shape)
                tensors.append((ent.name, t))
        except (CheckpointError, OSError, ValueError, RuntimeError) as e:
            return {"loaded": False, "refused": f"cannot read the checkpoint: {e}"}
        identity = h.hexdigest()
        if expected_identity and identity != expected_identity:
            return {"loaded": False, "refused": f"identity {identity[:16]} is not the expected "
                    f"{str(expected_identity)[:16]}", "identity": identity}
        read_s = time.perf_counter() - t0
        # From here on the model changes; a failure leaves it broken and says so.
        st["broken"] = f"load of {path} did not finish"
        st["loaded"] = None
        reload: Any = getattr(self, "reload_weights")  # noqa: B009 - the worker's method
        reload(weights_iterator=iter(tensors), is_checkpoint_format=True)
        # vLLM's own no-argument reload re-reads model_config.model: keep it truthful.
        cfg = self.vllm_config.model_config
        cfg.model = path
        st["loaded"] = {"path": path, "identity": identity, "manifest": manifest,
                        "tensors": h.tensors, "bytes": h.nbytes}
        st["broken"] = None
        return {"loaded": True, "identity": identity, "manifest": manifest,
                "tensors": h.tensors, "bytes": h.nbytes, "read_s": round(read_s, 4),
                "seconds": round(time.perf_counter() - t0, 4)}

    def rc_identity(self) -> dict[str, Any]:
        """Identity of the weights this worker holds (None if it cannot vouch for any)."""
        st = self._rc_state()
        if st["broken"]:
            return {"identity": None, "reason": st["broken"]}
        meta = self._rc_meta_params()
        if meta:
            return {"identity": None, "reason": f"{len(meta)} parameter(s) on the meta device "
                    f"(a failed load), e.g. {meta[0]}"}
        path = str(self.vllm_config.model_config.model)
        loaded = st["loaded"]
        if loaded is not None and loaded["path"] == path:
            return {**loaded, "basis": "bytes loaded by rc_reload_weights"}
        try:
            files = self._rc_files_identity(path)
        except (CheckpointError, OSError) as e:
            return {"identity": None, "reason": f"cannot digest {path}: {e}"}
        return {**files, "path": path,
                "basis": "files at model_config.model (loaded by vLLM, not by this extension)"}

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
        """What the engine itself says about its cache tiers."""
        cfg = self.vllm_config.model_config
        enc = getattr(self.model_runner, "encoder_cache", None)
        return {"multimodal": bool(cfg.is_multimodal_model),
                "encoder_cache_entries": len(enc) if isinstance(enc, dict) else None}
