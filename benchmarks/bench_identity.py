"""Identity benchmarks.

* Source-side content digest (:func:`rolloutcore.engine.identity.checkpoint_identity`): seconds per
  GB of weights, on the built tiny/large models and on a synthetic checkpoint of
  ``--synthetic-mb`` MB (random bytes, several tensors), each timed warm (page cache hot,
  best of ``--repeat``), against a floor in the same run: plain sha256 over the same
  files' bytes (``hashlib.file_digest``). The manifest digest is timed too (header only).
* Fingerprint probe latency on a live engine (``--engine URL``, or ``--serve`` to start a
  vLLM CPU server on ``models/v1`` with ``SERVER_ARGS``: the RolloutCore worker extension
  and load format): the engine-side identity read (``collective_rpc rc_identity``), a
  teacher-forced scoring request of a 16+16-token sequence (what the replay validator
  sends per record; the runner's default, scored, probe is the same kind of request: one
  prefill with ``prompt_logprobs``), and a 16-token greedy probe (the runner's greedy
  probe mode). Median and max of ``--probes`` calls; ratios to the identity read.

Run: ``.venv/bin/python benchmarks/bench_identity.py [--serve | --engine URL] [--json]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from rolloutcore.adapters.vllm_worker import SERVER_ARGS
from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT
from rolloutcore.conformance.replay import score_request
from rolloutcore.engine.identity import (
    checkpoint_identity,
    checkpoint_nbytes,
    manifest_digest,
    safetensors_files,
    write_safetensors,
)


def _best(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _sha256_files(directory: Path) -> None:
    """The floor: sha256 of every safetensors file's bytes, nothing parsed."""
    for path in safetensors_files(directory):
        with open(path, "rb") as fh:
            hashlib.file_digest(fh, "sha256")


def digest_rate(directory: Path, repeat: int) -> dict[str, Any]:
    nbytes = checkpoint_nbytes(directory)
    checkpoint_identity(directory)  # warm the page cache
    s = _best(lambda: checkpoint_identity(directory), repeat)
    f = _best(lambda: _sha256_files(directory), repeat)
    m = _best(lambda: manifest_digest(directory), repeat)
    return {"checkpoint": str(directory), "mb": round(nbytes / 1e6, 2),
            "content_s": round(s, 4), "s_per_gb": round(s / (nbytes / 1e9), 3),
            "gb_per_s": round(nbytes / 1e9 / s, 3), "manifest_s": round(m, 5),
            "sha256_floor_s": round(f, 4), "content_over_floor": round(s / f, 2)}


def synthetic(directory: Path, mb: int, tensors: int = 8) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    per = mb * 1_000_000 // tensors // 4 * 4
    write_safetensors(directory / "model.safetensors",
                      [(f"layer.{i}.weight", "F32", (per // 4,), os.urandom(per))
                       for i in range(tensors)])
    return directory


def probe_latency(url: str, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"engine": url}
    seq = list(range(100, 132))
    calls: dict[str, Callable[[httpx.Client], httpx.Response]] = {
        "rc_identity": lambda c: c.post("/collective_rpc", json={"method": "rc_identity"}),
        "score_16+16": lambda c: c.post("/v1/completions", json=score_request(seq, "tiny")),
        "greedy_16": lambda c: c.post("/v1/completions", json={
            "model": "tiny", "prompt": seq[:16], "max_tokens": 16, "min_tokens": 16,
            "temperature": 0.0, "return_token_ids": True, "logprobs": 0}),
    }
    with httpx.Client(base_url=url, trust_env=False, timeout=60) as c:
        for name, call in calls.items():
            first = call(c)
            if first.status_code != 200:
                out[name] = {"error": f"HTTP {first.status_code}: {first.text[:120]}"}
                continue
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                r = call(c)
                times.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
            out[name] = {"median_ms": round(statistics.median(times) * 1e3, 2),
                         "max_ms": round(max(times) * 1e3, 2)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--synthetic-mb", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--engine", help="base URL of a running engine (model name 'tiny')")
    ap.add_argument("--serve", action="store_true", help="start a server on models/v1")
    ap.add_argument("--probes", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    result: dict[str, Any] = {"digest": []}
    for name in ("v1", "large"):
        d = DEFAULT_OUT / name
        if (d / "model.safetensors").exists():
            result["digest"].append(digest_rate(d, args.repeat))
    with tempfile.TemporaryDirectory() as tmp:
        result["digest"].append(digest_rate(synthetic(Path(tmp) / "synth", args.synthetic_mb),
                                            args.repeat))
    if args.engine:
        result["probe"] = probe_latency(args.engine, args.probes)
    elif args.serve:
        from rolloutcore.conformance.fixtures.vllm_server import VllmServer

        with VllmServer(DEFAULT_OUT / "v1", extra_args=list(SERVER_ARGS)) as srv:
            result["probe"] = probe_latency(srv.url, args.probes)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for r in result["digest"]:
        print(f"content digest {r['checkpoint']}: {r['mb']} MB in {r['content_s']} s = "
              f"{r['s_per_gb']} s/GB ({r['gb_per_s']} GB/s) = {r['content_over_floor']}x "
              f"plain sha256 of the files ({r['sha256_floor_s']} s); manifest "
              f"{r['manifest_s']} s")
    probe = result.get("probe", {})
    for name, v in probe.items():
        if name != "engine":
            print(f"probe {name}: {v}")
    base = probe.get("rc_identity", {}).get("median_ms")
    for name in ("score_16+16", "greedy_16"):
        med = probe.get(name, {}).get("median_ms")
        if base and med:
            print(f"probe {name} / rc_identity (median): {med / base:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
