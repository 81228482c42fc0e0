"""The weight-transfer scenarios on GPU with the NCCL backend (prepared; needs a machine
with two GPUs and a CUDA build of vLLM; never run on the CPU CI machines).

Same scenarios and code as the CPU path (:mod:`rolloutcore.conformance.transfer_scenarios`,
``gloo``); only the backend and devices differ:

* the vLLM server runs on GPU 1 (``CUDA_VISIBLE_DEVICES=1`` in its environment);
* this process is the trainer, on GPU 0: the checkpoint's tensors are moved to ``cuda:0``
  by the source and broadcast over NCCL by vLLM's own ``NCCLTrainerWeightTransferEngine``;
* the backend is ``nccl_rc`` (:mod:`rolloutcore.adapters.nccl_transfer`): vLLM's NCCL
  engines under a second name, with a worker engine that also digests what it receives.

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
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from rolloutcore.adapters.nccl_transfer import BACKEND, register_nccl_rc, trainer_info_cls

SERVER_GPU = "1"
TRAINER_DEVICE = "cuda:0"


def nccl_backend() -> Any:
    from rolloutcore.adapters.launch import free_port
    from rolloutcore.conformance.transfer_scenarios import Backend

    def info(world_size: int = 2) -> Any:
        return trainer_info_cls()(master_address="127.0.0.1", master_port=free_port(),
                                   world_size=world_size, rank=0)

    return Backend(BACKEND, "rolloutcore.adapters.gloo_transfer.TransferWorkerExtension",
                   info, server_env={"CUDA_VISIBLE_DEVICES": SERVER_GPU})


def main(argv: list[str] | None = None) -> int:
    import torch

    from rolloutcore.adapters import weight_transfer as wt
    from rolloutcore.conformance import transfer_scenarios as ts
    from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models

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
