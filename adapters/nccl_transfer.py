"""The ``nccl_rc`` weight-transfer backend: vLLM's NCCL engines under a second name, with a
worker engine that also digests what it receives (so that the worker extension can vouch
for the identity of transferred weights; the validation step checks it).

The wire protocol, HTTP calls and collective are vLLM's NCCL ones, unchanged. Registered
by this package's ``vllm.general_plugins`` entry point (``gloo_transfer.register``) by
module path: nothing CUDA-only is imported until the backend is used, so registration is
harmless on CPU machines. Used by :mod:`rolloutcore.conformance.gpu_nccl_check`.
"""

from __future__ import annotations

import contextlib
from typing import Any

BACKEND = "nccl_rc"


def register_nccl_rc() -> None:
    """Register ``nccl_rc`` on both factories by module path (nothing imported now)."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    for factory, module, cls in (
            (WeightTransferEngineFactory, __name__, "DigestingNCCLWeightTransferEngine"),
            (WeightTransferTrainerFactory, "vllm.distributed.weight_transfer.nccl_engine",
             "NCCLTrainerWeightTransferEngine")):
        f: Any = factory
        if BACKEND not in getattr(f, "_registry", {}):
            with contextlib.suppress(ValueError):
                f.register_engine(BACKEND, module, cls)


def __getattr__(name: str) -> Any:
    """``DigestingNCCLWeightTransferEngine`` and ``NCCLRCTrainerInitInfo`` are built on
    first use: importing vLLM's NCCL engine needs a CUDA build."""
    if name == "DigestingNCCLWeightTransferEngine":
        return _digesting_engine()
    if name == "NCCLRCTrainerInitInfo":
        return trainer_info_cls()
    raise AttributeError(name)


_CACHE: dict[str, Any] = {}


def trainer_info_cls() -> Any:
    if "info" not in _CACHE:
        from dataclasses import dataclass

        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        @dataclass
        class NCCLRCTrainerInitInfo(NCCLTrainerInitInfo):
            backend = BACKEND

        _CACHE["info"] = NCCLRCTrainerInitInfo
    return _CACHE["info"]


def _digesting_engine() -> Any:
    if "engine" in _CACHE:
        return _CACHE["engine"]
    import torch
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

    from rolloutcore.adapters import gloo_transfer as gt
    from rolloutcore.adapters.epoch_gate import GATE, pop_epoch
    from rolloutcore.engine.identity import IdentityHasher

    class _Digesting:
        def __init__(self, model: Any, owner: Any) -> None:
            self._model, self._owner = model, owner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._model, name)

        def load_weights(self, weights: Any) -> Any:
            batch = list(weights)
            for name, t in batch:
                self._owner._rc_digest(name, t)
            return self._model.load_weights(batch)

    class DigestingNCCLWeightTransferEngine(NCCLWeightTransferEngine):
        def start_weight_update(self) -> None:
            self._rc_h: Any = IdentityHasher()
            self._rc_m: Any = IdentityHasher(manifest_only=True)
            self._rc_n = 0
            self._rc_b = 0
            with gt._RECEIVED_LOCK:
                gt._RECEIVED.update(session="receiving", identity=None)
            super().start_weight_update()

        def _rc_digest(self, name: str, t: Any) -> None:
            raw = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
            self._rc_n += 1
            self._rc_b += int(raw.numel())
            dt = gt.ST_DTYPES[gt.dtype_name(t.dtype)]
            try:
                if self._rc_h is not None:
                    self._rc_h.add(name, dt, tuple(t.shape), raw.numpy().data)
                    self._rc_m.add(name, dt, tuple(t.shape))
            except ValueError:
                self._rc_h = self._rc_m = None

        def update_weights(self, update_info: dict[str, Any]) -> None:
            # The controller's epoch is gated here, before any byte (see epoch_gate).
            info, epoch = pop_epoch(update_info)
            with GATE.enter(epoch):
                super().update_weights(info)

        def receive_weights(self, update_info: Any) -> None:
            model = self.model
            self.model = _Digesting(model, self)  # type: ignore[assignment]
            try:
                super().receive_weights(update_info)
            finally:
                self.model = model

        def finish_weight_update(self) -> None:
            from rolloutcore.adapters import vllm_loader

            super().finish_weight_update()
            identity = self._rc_h.hexdigest() if self._rc_h else None
            if identity is not None and self._rc_m is not None:
                vllm_loader.complete_load(self.model, {
                    "identity": identity, "manifest": self._rc_m.hexdigest(),
                    "tensors": self._rc_n, "bytes": self._rc_b, "path": None,
                    "basis": "bytes received by the NCCL weight-transfer engine"})
            with gt._RECEIVED_LOCK:
                gt._RECEIVED.update(session=None if identity else "complete",
                                    identity=identity, tensors=self._rc_n, bytes=self._rc_b)

    _CACHE["engine"] = DigestingNCCLWeightTransferEngine
    return DigestingNCCLWeightTransferEngine
