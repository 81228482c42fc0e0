"""Staged updates on a GPU: the check prepared for a CUDA machine (torch only, no vLLM;
never run on the CPU CI machines, where staging runs over gloo into host memory).

What the CPU build shows with gloo (tests/test_staged_vllm.py, the transfer scenarios),
this shows for the GPU transport a staged update would use: the weights arrive in an
inactive device buffer on a side CUDA stream while the "engine" (a matmul loop on the
default stream, standing in for decode steps) keeps running, every byte is digested
against the sender's, and the install is a device-to-device copy into the live tensors.

* one GPU: the sender is a pinned host buffer copied on a side stream
  (``cudaMemcpyAsync``: what a CUDA-IPC or host-staged receive does);
* two or more GPUs (``--nccl``): rank 0 on ``cuda:0`` broadcasts over NCCL on its own
  stream to rank 1 on ``cuda:1``, which runs the matmul loop meanwhile.

It prints one JSON object: the engine loop's steps/s alone and during the staging
(``kept``: their ratio; a staging that blocked the loop would read near 0), the staging
time, the install (device copy) time against the staging time, and whether the digest
of the staged bytes equals the sender's. Exit 0 when the digest matches and ``kept`` is
at least ``--min-kept`` (default 0.5), 1 otherwise, 2 without CUDA.

Run: ``python -m rolloutcore.conformance.gpu_staging_check [--mb 1024] [--nccl]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import Any


def _loop_rate(torch: Any, device: str, seconds: float, stop: Any = None) -> float:
    """Matmul steps per second on ``device``'s default stream for ``seconds`` (or until
    ``stop()`` says so)."""
    a = torch.randn(2048, 2048, device=device)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds and not (stop is not None and stop()):
        a = (a @ a).tanh_()
        torch.cuda.synchronize(device)
        n += 1
    return n / (time.perf_counter() - t0)


def _digest(torch: Any, t: Any) -> str:
    return hashlib.sha256(t.detach().to("cpu").view(torch.uint8).numpy().tobytes()).hexdigest()


def single_gpu(torch: Any, nbytes: int) -> dict[str, Any]:
    dev = "cuda:0"
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8).pin_memory()
    want = hashlib.sha256(src.numpy().tobytes()).hexdigest()
    live = torch.zeros(nbytes, dtype=torch.uint8, device=dev)  # the served weights
    staged = torch.empty(nbytes, dtype=torch.uint8, device=dev)  # the inactive buffer
    alone = _loop_rate(torch, dev, 2.0)
    side = torch.cuda.Stream(device=dev)
    done = torch.cuda.Event()
    t0 = time.perf_counter()
    with torch.cuda.stream(side):
        staged.copy_(src, non_blocking=True)
        done.record(side)
    during = _loop_rate(torch, dev, 30.0, stop=done.query)
    done.synchronize()
    staging_s = time.perf_counter() - t0
    ok = _digest(torch, staged) == want
    untouched = bool((live == 0).all())
    t1 = time.perf_counter()
    live.copy_(staged)
    torch.cuda.synchronize(dev)
    install_s = time.perf_counter() - t1
    return {"mode": "host-staged", "bytes": nbytes, "loop_alone_per_s": alone,
            "loop_during_staging_per_s": during, "kept": during / alone,
            "staging_s": staging_s, "install_s": install_s,
            "install_over_staging": install_s / staging_s, "digest_matches": ok,
            "served_untouched_while_staging": untouched}


def _nccl_rank(rank: int, nbytes: int, port: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=2)
    dev = f"cuda:{rank}"
    torch.cuda.set_device(dev)
    gen = torch.Generator(device="cpu").manual_seed(7)
    payload = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    want = hashlib.sha256(payload.numpy().tobytes()).hexdigest()
    buf = payload.to(dev) if rank == 0 else torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dist.barrier()
    if rank == 0:
        dist.broadcast(buf, 0)
        torch.cuda.synchronize(dev)
        dist.barrier()
        dist.destroy_process_group()
        return
    alone = _loop_rate(torch, dev, 2.0)
    cuda: Any = torch.cuda  # its Stream is untyped
    side = cuda.Stream(device=dev)
    t0 = time.perf_counter()
    with cuda.stream(side):
        work = dist.broadcast(buf, 0, async_op=True)
    during = _loop_rate(torch, dev, 30.0, stop=work.is_completed)
    work.wait()
    torch.cuda.synchronize(dev)
    staging_s = time.perf_counter() - t0
    live = torch.zeros_like(buf)
    t1 = time.perf_counter()
    live.copy_(buf)
    torch.cuda.synchronize(dev)
    install_s = time.perf_counter() - t1
    out.put({"mode": "nccl", "bytes": nbytes, "loop_alone_per_s": alone,
             "loop_during_staging_per_s": during, "kept": during / alone,
             "staging_s": staging_s, "install_s": install_s,
             "install_over_staging": install_s / staging_s,
             "digest_matches": _digest(torch, buf) == want})
    dist.barrier()
    dist.destroy_process_group()


def nccl(nbytes: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from rolloutcore.adapters.launch import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_nccl_rank, args=(r, nbytes, port, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    result: dict[str, Any] = out.get(timeout=600)
    for p in procs:
        p.join(60)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1024, help="bytes staged, in MiB")
    ap.add_argument("--nccl", action="store_true", help="two GPUs: NCCL broadcast")
    ap.add_argument("--min-kept", type=float, default=0.5)
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_staging_check: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or (args.nccl and torch.cuda.device_count() < 2):
        print("gpu_staging_check: needs CUDA (two GPUs with --nccl)", file=sys.stderr)
        return 2
    res = nccl(args.mb << 20) if args.nccl else single_gpu(torch, args.mb << 20)
    print(json.dumps(res, indent=1))
    return 0 if res["digest_matches"] and res["kept"] >= args.min_kept else 1


if __name__ == "__main__":
    sys.exit(main())
