"""Hot update cycle versus a full restart, control-plane overhead versus the floor of raw
round trips, and per-operation latency, measured in one run on one real vLLM server.

* Hot cycles: RolloutCore update cycles (journal fsynced, as in production) alternating
  v2 / v1 on a server started on v1, nothing in flight (drain wait ~0). Idempotent calls
  run inline (each honours its step deadline); only the mutation is on a supervised
  worker. (The runner used to offer ``supervise_idempotent``, and alternate cycles
  measured the overhead without watchdog hand-offs; with the option gone, so is that
  figure: every cycle is measured the same way.)
* Control-plane overhead of a cycle: total - drain wait - the mutation (load plus its
  label finalisation). The floor: the same HTTP requests the cycle made outside the
  mutation (pause, read-backs, resets, reads, resume, the probe completion and its
  counter reads), replayed in order with a plain keep-alive httpx client.
* Full restart: stop the server, start a new one on the target checkpoint with the same
  ``SERVER_ARGS`` (worker extension and digesting load format, as every server the
  project starts), until the first completed greedy request (its output checked against
  the reference).
* Per-operation latency: median and p90 of every runner step over the hot cycles, and
  of every raw endpoint over the replays.

Run: ``.venv/bin/python benchmarks/bench_vllm_cycle.py [--cycles N] [--replays N] [--json]``
(about 2 minutes on the 2-core machine: two server starts dominate).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from rolloutcore.adapters.http import HttpAdapter, RequestLog
from rolloutcore.adapters.vllm_worker import SERVER_ARGS
from rolloutcore.conformance.engines import INITIAL_LABEL, checkpoint_target
from rolloutcore.conformance.server import VllmServer
from rolloutcore.conformance.tiny_model import DEFAULT_OUT, build_models
from rolloutcore.journal import open_controller
from rolloutcore.runner import LifecycleRunner, RunnerPolicy
from rolloutcore.targets import load_references

MUTATION_OPS = ("mutate", "finalise")  # the mutation itself: load + label finalisation


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "median_ms": round(statistics.median(values) * 1e3, 3),
            "p90_ms": round(pct(values, 0.9) * 1e3, 3),
            "min_ms": round(min(values) * 1e3, 3)}


def replay(client: httpx.Client, requests: list[RequestLog]) -> list[float]:
    """The requests again, in order, raw: per-request wall time."""
    out = []
    for r in requests:
        t0 = time.perf_counter()
        resp = client.request(r.method, r.path, params=r.params or None, json=r.json_body)
        resp.read()
        out.append(time.perf_counter() - t0)
        if resp.status_code != 200:
            raise RuntimeError(f"replay {r.method} {r.path}: HTTP {resp.status_code}")
    return out


def run(cycles: int, replays: int, work: Path, log: Any) -> dict[str, Any]:
    models = build_models(DEFAULT_OUT)
    v1, v2 = models["v1"].resolve(), models["v2"].resolve()
    out: dict[str, Any] = {"cycles": cycles, "replays": replays}

    srv = VllmServer(v1, extra_args=list(SERVER_ARGS),
                     log_path=work / "vllm-hot.log")
    t0 = time.perf_counter()
    srv.start()
    out["hot_server_startup_s"] = round(time.perf_counter() - t0, 3)
    print(f"server up in {out['hot_server_startup_s']} s (pid {srv.pid})", file=log)
    requests: list[RequestLog] = []
    adapter = HttpAdapter(srv.url, on_request=requests.append)
    steps: dict[str, list[float]] = defaultdict(list)
    totals: list[float] = []
    overheads: list[float] = []
    mutations: list[float] = []
    cycle_requests: list[list[RequestLog]] = []
    try:
        controller, journal, _ = open_controller(work / "journal.jsonl")
        runner = LifecycleRunner(controller, adapter, RunnerPolicy(step_timeout_s=60.0))
        boot = runner.bootstrap(checkpoint_target(v1, 1, INITIAL_LABEL))
        if boot.trigger != "bootstrap_ok":
            raise RuntimeError(f"bootstrap failed: {boot.reason}")
        for i in range(cycles + 1):  # the first: warm-up
            gen = i + 2
            path = v2 if gen % 2 == 0 else v1
            target = checkpoint_target(path, gen, f"gen{gen}")
            requests.clear()
            report = runner.update(target)
            if not report.published:
                raise RuntimeError(f"cycle {gen} not published: {report.steps}")
            if i == 0:
                continue
            t = report.timings()
            mutate = t.get("mutate", 0.0)
            totals.append(report.total_s)
            mutations.append(mutate)
            overheads.append(report.total_s - report.drain_wait_s - mutate)
            for s in report.steps:
                steps[s.step].append(s.seconds)
            cycle_requests.append([r for r in requests if r.op not in MUTATION_OPS])
        journal.close()
        # The floor: the cycle's non-mutation requests, replayed raw on a keep-alive client.
        template = cycle_requests[-1]
        raw: dict[str, list[float]] = defaultdict(list)
        floors: list[float] = []
        with httpx.Client(base_url=srv.url, trust_env=False, timeout=60.0) as client:
            replay(client, template)  # warm the connection
            for _ in range(replays):
                times = replay(client, template)
                floors.append(sum(times))
                for r, secs in zip(template, times, strict=True):
                    key = f"{r.method} {r.path}" + (
                        f" ({r.json_body['method']})" if r.path == "/collective_rpc" else "")
                    raw[key].append(secs)
        out["cycle_requests"] = [f"{r.op}: {r.method} {r.path}" for r in template]
        out["raw_endpoints"] = {k: summary(v) for k, v in sorted(raw.items())}
        out["floor"] = summary(floors)
    finally:
        adapter.close()
        t0 = time.perf_counter()
        srv.stop()
        stop_s = time.perf_counter() - t0

    out["steps"] = {k: summary(v) for k, v in steps.items()}
    out["hot_cycle"] = summary(totals)
    out["mutation"] = summary(mutations)
    out["control_plane_overhead"] = summary(overheads)

    # Full restart onto the target checkpoint, until the first completed request.
    probe = next(p for p in load_references(v2)["probes"] if p["name"] == "long")
    srv2 = VllmServer(v2, extra_args=list(SERVER_ARGS), log_path=work / "vllm-restart.log")
    t0 = time.perf_counter()
    srv2.start()
    t_healthy = time.perf_counter()
    try:
        with httpx.Client(base_url=srv2.url, trust_env=False, timeout=120.0) as client:
            n = probe["max_tokens"]
            resp = client.post("/v1/completions", json={
                "model": "tiny", "prompt": probe["prompt_token_ids"], "max_tokens": n,
                "min_tokens": n, "temperature": 0.0, "return_token_ids": True})
            t_first = time.perf_counter()
            tokens = resp.json()["choices"][0]["token_ids"]
    finally:
        srv2.stop()
    restart_s = stop_s + (t_first - t0)
    out["restart"] = {
        "stop_s": round(stop_s, 3), "startup_to_healthy_s": round(t_healthy - t0, 3),
        "first_request_s": round(t_first - t_healthy, 3), "total_s": round(restart_s, 3),
        "first_output_equals_reference": tokens == probe["output_token_ids"]}
    hot = statistics.median(totals)
    out["restart_over_hot_cycle"] = round(restart_s / hot, 1)
    over, floor = statistics.median(overheads), statistics.median(floors)
    out["overhead_over_floor"] = round(over / floor, 3)
    out["overhead_minus_floor_ms"] = round((over - floor) * 1e3, 3)
    return out


def render(r: dict[str, Any]) -> str:
    lines = []
    hc, ov, fl, mu = (r["hot_cycle"], r["control_plane_overhead"], r["floor"], r["mutation"])
    rs = r["restart"]
    lines.append(f"hot update cycle (median of {hc['n']}): {hc['median_ms']:.1f} ms "
                 f"(p90 {hc['p90_ms']:.1f})")
    lines.append(f"full restart onto the target, to the first completed request: "
                 f"{rs['total_s'] * 1e3:.0f} ms (stop {rs['stop_s']:.1f} s + start "
                 f"{rs['startup_to_healthy_s']:.1f} s + first request "
                 f"{rs['first_request_s']:.2f} s; output equals reference: "
                 f"{rs['first_output_equals_reference']})")
    lines.append(f"restart / hot cycle: {r['restart_over_hot_cycle']}x")
    lines.append(f"mutation (load + label finalisation): median {mu['median_ms']:.1f} ms")
    lines.append(f"control-plane overhead (total - drain - mutation): median "
                 f"{ov['median_ms']:.1f} ms (p90 {ov['p90_ms']:.1f})")
    lines.append(f"floor (the same {len(r['cycle_requests'])} requests replayed raw): median "
                 f"{fl['median_ms']:.1f} ms (p90 {fl['p90_ms']:.1f})")
    lines.append(f"overhead / floor: {r['overhead_over_floor']} "
                 f"(+{r['overhead_minus_floor_ms']:.1f} ms of RolloutCore per cycle)")
    lines.append("")
    lines.append(f"{'runner step':<28} {'median ms':>10} {'p90 ms':>10}")
    for k, v in r["steps"].items():
        lines.append(f"{k:<28} {v['median_ms']:>10.2f} {v['p90_ms']:>10.2f}")
    lines.append("")
    lines.append(f"{'raw endpoint':<45} {'median ms':>10} {'p90 ms':>10} {'n':>5}")
    for k, v in r["raw_endpoints"].items():
        lines.append(f"{k:<45} {v['median_ms']:>10.2f} {v['p90_ms']:>10.2f} {v['n']:>5}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        result = run(args.cycles, args.replays, Path(tmp), sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
