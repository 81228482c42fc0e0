"""The weight-transfer scenarios on GPU with the NCCL backend (prepared; needs a machine
with two GPUs and a CUDA build of vLLM; never run on the CPU CI machines).

Same scenarios and code as the CPU path (:mod:`rolloutcore.conformance.transfer_scenarios`,
``gloo``); only the backend and devices differ:

* the vLLM server runs on GPU 1 (``CUDA_VISIBLE_DEVICES=1`` in its environment);
* this process is the trainer, on GPU 0: the checkpoint's tensors are moved to ``cuda:0``
  by the source and broadcast over NCCL by vLLM's own ``NCCLTrainerWeightTransferEngine``;
* the backend name is ``nccl_rc``: vLLM's NCCL engines, registered under a second name
  (by this package's ``vllm.general_plugins`` entry point, lazily, nothing imported on
  CPU) with a worker engine that also digests what it receives, so the worker extension
  can vouch for the identity of the transferred weights (the validation step checks it).
  The wire protocol, HTTP calls and collective are vLLM's NCCL ones, unchanged.

Run (from the repository root, in a venv with CUDA vLLM and this package installed with
``pip install -e . --no-deps`` so that the plugin entry point exists)::

    python -m rolloutcore.conformance.gpu_nccl_check [--json FILE] [--large]

It builds the tiny models (``models/``), starts two servers one after the other, and
prints one line per scenario (``refuse_identity``, ``init_refused``, ``full_cycle``,
``frozen``, ``killed``): PASS/FAIL and its evidence (cycle and transfer timings, time from
the frozen/killed collective to TAINTED against the deadline), then any failed check.
Exit status 0 when every scenario passed. Not verified here: ``init_refused`` relies on
the NCCL worker refusing a world of one (rank 1 of 1); if your vLLM build hangs there
instead, the scenario reports it as a failure after the transfer deadline.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

BACKEND = "nccl_rc"
SERVER_GPU = "1"
TRAINER_DEVICE = "cuda:0"


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
        return _trainer_info_cls()
    raise AttributeError(name)


_CACHE: dict[str, Any] = {}


def _trainer_info_cls() -> Any:
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
    from rolloutcore.identity import IdentityHasher

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

        def receive_weights(self, update_info: Any) -> None:
            model = self.model
            self.model = _Digesting(model, self)  # type: ignore[assignment]
            try:
                super().receive_weights(update_info)
            finally:
                self.model = model

        def finish_weight_update(self) -> None:
            super().finish_weight_update()
            with gt._RECEIVED_LOCK:
                gt._RECEIVED.update(
                    session="complete",
                    identity=self._rc_h.hexdigest() if self._rc_h else None,
                    manifest=self._rc_m.hexdigest() if self._rc_m else None,
                    tensors=self._rc_n, bytes=self._rc_b)

    _CACHE["engine"] = DigestingNCCLWeightTransferEngine
    return DigestingNCCLWeightTransferEngine


def nccl_backend() -> Any:
    from rolloutcore.conformance.server import free_port
    from rolloutcore.conformance.transfer_scenarios import Backend

    def info(world_size: int = 2) -> Any:
        return _trainer_info_cls()(master_address="127.0.0.1", master_port=free_port(),
                                   world_size=world_size, rank=0)

    return Backend(BACKEND, "rolloutcore.adapters.gloo_transfer.TransferWorkerExtension",
                   info, server_env={"CUDA_VISIBLE_DEVICES": SERVER_GPU})


def main(argv: list[str] | None = None) -> int:
    import torch

    from rolloutcore.adapters import weight_transfer as wt
    from rolloutcore.conformance import transfer_scenarios as ts
    from rolloutcore.conformance.tiny_model import DEFAULT_OUT, build_models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--large", action="store_true", help="models/large and large_v2")
    args = ap.parse_args(argv)
    if torch.cuda.device_count() < 2:
        print(f"needs two GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    torch.cuda.set_device(0)
    register_nccl_rc()
    # The trainer's source lives on its GPU; everything else is the CPU path's code.
    original = wt.CheckpointSource.of
    wt.CheckpointSource.of = classmethod(  # type: ignore[method-assign,assignment]
        lambda cls, target: cls(target.source, device=TRAINER_DEVICE))
    try:
        models = build_models(DEFAULT_OUT, large=args.large)
        with tempfile.TemporaryDirectory(prefix="rc-nccl-") as tmp:
            rows = ts.run_all(nccl_backend(), models, Path(tmp), large=args.large, echo=True)
    finally:
        wt.CheckpointSource.of = original  # type: ignore[method-assign]
    print()
    ts.print_table(rows)
    if args.json:
        args.json.write_text(json.dumps([r.as_json() for r in rows], indent=2))
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
