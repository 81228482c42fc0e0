"""The gateway against direct requests, and the journal's group commit, in one run over
the same two vLLM CPU servers (tiny model v1, the test fixture's flags).

* Added latency: sequential greedy completions (concurrency 1, 4 tokens), direct to an
  engine and through ``rolloutcore serve`` (its own process, as deployed: a fleet of the
  two servers, its fleet journal fsynced with group commit), interleaved pair by pair so
  that drift hits both alike; p50 and p99 of each, and the difference.
* Throughput at concurrency 64 and 256: the same greedy requests (16 tokens), direct
  (the client spreads them over the two engines, round robin) and through the gateway
  (it chooses, least outstanding first); requests per second, three rounds alternated
  (the machine is shared: one run is noisy), the median of each; the ratio gateway /
  direct. Both paths share two cores with the engines, so the gateway's own CPU per
  request comes straight out of the engines' share: it is measured (the gateway
  process's CPU seconds per request, from /proc) and printed beside the bound it sets.

Goals (issue 23): added latency p50 <= 2 ms and p99 <= 10 ms; throughput >= 0.98x
direct at both concurrencies.
* Durable journal records per second, 64 writer threads: one fsync per record (the
  default) against group commit; and the gateway's own path (admit + release of a
  fleet, each awaited durable outside the fleet's locks) with group commit against the
  same fleet calls with one fsync per record.

``--remote``: the same through a remote gateway (``serve --gateway-only``, its own
process and journal, following the leader) instead of the leader's.

Run: ``.venv/bin/python benchmarks/bench_gateway.py [--requests N] [--remote] [--json]``
(about four minutes on the 2-core machine: two server starts, then twelve throughput
runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.adapters.launch import free_port
from rolloutcore.adapters.sim import SimAdapter, SimEngine, sim_target
from rolloutcore.adapters.vllm_worker import SERVER_ARGS
from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models
from rolloutcore.conformance.fixtures.vllm_server import VllmServer
from rolloutcore.engine.controller import TraceRecord
from rolloutcore.engine.targets import load_references
from rolloutcore.fleet import Fleet
from rolloutcore.gateway.core import Gateway, GatewayConfig
from rolloutcore.journal import Journal

CONCURRENCY = 64  # the journal's writer threads
THROUGHPUT_CONCURRENCY = (64, 256)
GOAL_ADDED_P50_MS = 2.0
GOAL_ADDED_P99_MS = 10.0
GOAL_THROUGHPUT_RATIO = 0.98
ROUNDS = 3  # throughput runs per path: the machine is shared, one run is noisy
REPO = Path(__file__).resolve().parents[1]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def request(prompt: list[int], n: int) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, "max_tokens": n, "min_tokens": n,
            "temperature": 0}


def added_latency(direct: str, gateway: str, prompt: list[int], pairs: int) -> dict[str, Any]:
    lat: dict[str, list[float]] = {"direct": [], "gateway": []}
    with httpx.Client(timeout=60) as c:
        for url in (direct, gateway):  # warm both paths (connections, first requests)
            for _ in range(5):
                c.post(f"{url}/v1/completions", json=request(prompt, 4)).raise_for_status()
        for i in range(pairs):
            order = (("direct", direct), ("gateway", gateway))
            for name, url in order if i % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                c.post(f"{url}/v1/completions", json=request(prompt, 4)).raise_for_status()
                lat[name].append(time.perf_counter() - t0)
    out: dict[str, Any] = {"pairs": pairs}
    for q in ("p50", "p99"):
        f = 0.5 if q == "p50" else 0.99
        d, g = pct(lat["direct"], f), pct(lat["gateway"], f)
        out[q] = {"direct_ms": d * 1e3, "gateway_ms": g * 1e3, "added_ms": (g - d) * 1e3}
    return out


async def _throughput(urls: list[str], prompts: list[list[int]], total: int,
                      concurrency: int, dropped: list[str]) -> float:
    """Requests per second; a request whose connection closes without an answer
    (``httpx.TransportError``) is noted in ``dropped`` (the error, and the server's log
    tells which side closed it) and sent once more on a new connection."""
    done = 0
    # idle connections expire before a server (vLLM's uvicorn: 5 s) closes them
    limits = httpx.Limits(max_connections=concurrency * 2, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as c:
        async def worker(i: int) -> None:
            nonlocal done
            k = i
            while k < total:
                url = f"{urls[k % len(urls)]}/v1/completions"
                body = request(prompts[k % len(prompts)], 16)
                try:
                    r = await c.post(url, json=body)
                except httpx.TransportError as e:
                    dropped.append(f"{url}: {type(e).__name__}: {e}")
                    async with httpx.AsyncClient(timeout=120) as fresh:
                        r = await fresh.post(url, json=body)
                r.raise_for_status()
                done += 1
                k += concurrency

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        seconds = time.perf_counter() - t0
    assert done == total
    return total / seconds


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds process ``pid`` has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throughput(direct: list[str], gateway: str, gateway_pid: int, prompts: list[list[int]],
               total: int, concurrency: int) -> dict[str, Any]:
    runs: dict[str, list[float]] = {"direct": [], "gateway": []}
    gateway_cpu: list[float] = []  # the gateway process's CPU seconds per request
    dropped: dict[str, list[str]] = {"direct": [], "gateway": []}
    asyncio.run(_throughput(direct, prompts, concurrency, concurrency,
                            dropped["direct"]))  # warm-up
    for i in range(ROUNDS):  # alternated, the order swapped each round
        order = [("direct", direct), ("gateway", [gateway])]
        for name, urls in order if i % 2 == 0 else order[::-1]:
            cpu0 = cpu_seconds(gateway_pid)
            runs[name].append(asyncio.run(_throughput(urls, prompts, total, concurrency,
                                                      dropped[name])))
            if name == "gateway":
                gateway_cpu.append((cpu_seconds(gateway_pid) - cpu0) / total)
    d, g = statistics.median(runs["direct"]), statistics.median(runs["gateway"])
    # Engines and gateway share this machine's cores: with the engines saturating them,
    # the gateway's CPU per request comes out of theirs, which bounds the ratio.
    cores = os.cpu_count() or 1
    direct_core_ms = cores / d * 1e3
    gw_ms = statistics.median(gateway_cpu) * 1e3
    return {"concurrency": concurrency, "requests": total, "direct_rps": d,
            "gateway_rps": g, "ratio": g / d, "rounds": ROUNDS, "runs": runs,
            "gateway_cpu_ms_per_request": gw_ms,
            "direct_core_ms_per_request": direct_core_ms,
            "cpu_bound_ratio": direct_core_ms / (direct_core_ms + gw_ms),
            "dropped": dropped,
            "pair_ratios": [b / a for a, b in zip(runs["direct"], runs["gateway"],
                                                  strict=True)]}


def _threads(n: int, fn: Any) -> float:
    start = threading.Barrier(n + 1)

    def run(i: int) -> None:
        start.wait()
        fn(i)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def _no_updates(checkpoint: str, generation: int, label: str) -> WeightTarget:
    raise ValueError("no updates in this benchmark")


def journal_rates(tmp: Path, per_thread: int) -> dict[str, Any]:
    out: dict[str, Any] = {"threads": CONCURRENCY}
    for mode in ("fsync_per_record", "group_commit"):
        j = Journal(tmp / f"{mode}.jsonl", spec_name="RolloutCoreFleet",
                    group_commit=mode == "group_commit")
        sink = j.member("a")

        def write(i: int, sink: Any = sink) -> None:
            for k in range(per_thread):
                sink(TraceRecord(0, "admit", f"r{i}-{k}", "READY", 1, 0, "none", None))

        seconds = _threads(CONCURRENCY, write)
        n = CONCURRENCY * per_thread
        out[mode] = {"records_per_s": n / seconds, "fsyncs": j.fsyncs or n}
        j.close()
    out["ratio"] = out["group_commit"]["records_per_s"] / out["fsync_per_record"][
        "records_per_s"]
    # The gateway's path: admit and release through a fleet (of simulated engines).
    for mode in ("fleet_fsync_per_record", "fleet_group_commit"):
        engines = {n: SimEngine("ckpt-1") for n in ("a", "b")}
        fleet = Fleet([(n, SimAdapter(e), None) for n, e in engines.items()],
                      journal=tmp / f"{mode}.jsonl")
        fleet.bootstrap(sim_target(1, "ckpt-1", label="default"))
        gw = Gateway(fleet, GatewayConfig(model="tiny"), target_of=_no_updates) if (
            mode == "fleet_group_commit") else None

        def rollouts(i: int, gw: Gateway | None = gw, fleet: Fleet = fleet) -> None:
            cancel = threading.Event()
            for k in range(per_thread // 2):
                if gw is not None:
                    gw.release(gw.admit(f"r{i}-{k}", "completions", 0, cancel))
                else:
                    fleet.release(fleet.admit(f"r{i}-{k}"))

        seconds = _threads(CONCURRENCY, rollouts)
        n = CONCURRENCY * (per_thread // 2) * 2
        out[mode] = {"records_per_s": n / seconds, "fsyncs": fleet.journal.fsyncs or n}
        fleet.close()
    out["fleet_ratio"] = out["fleet_group_commit"]["records_per_s"] / out[
        "fleet_fsync_per_record"]["records_per_s"]
    return out


def serve(fleet_file: Path, port: int, initial: Path | None, log: Path, *extra: str
          ) -> subprocess.Popen[bytes]:
    """``rolloutcore serve`` in its own process (``extra``: its other options; a remote
    gateway's instead of ``--initial``), once it answers ``/health``."""
    start = [] if initial is None else ["--initial", str(initial), "--queue-depth", "1024"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rolloutcore.cli", "serve", "--fleet", str(fleet_file),
         "--port", str(port), *start, *extra],
        cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited with {proc.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("serve did not start")
        time.sleep(0.2)


def run(tmp: Path, requests: int, pairs: int, records: int, remote: bool = False
        ) -> dict[str, Any]:
    models = build_models(DEFAULT_OUT)
    probes = {p["name"]: p["prompt_token_ids"] for p in
              load_references(models["v1"])["probes"]}
    prompts = [probes[n] for n in ("short", "medium", "numbers", "long")]
    result: dict[str, Any] = {"journal": journal_rates(tmp, records)}
    servers = [VllmServer(models["v1"], extra_args=SERVER_ARGS,
                          log_path=tmp / f"vllm-{i}.log") for i in range(2)]
    starters = [threading.Thread(target=s.start) for s in servers]
    for t in starters:
        t.start()
    for t in starters:
        t.join()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        fleet_file = tmp / "fleet.toml"
        fleet_file.write_text("".join(f'[[engine]]\nname = "e{i}"\nurl = "{s.url}"\n'
                                      for i, s in enumerate(servers)))
        port = free_port()
        procs.append(serve(fleet_file, port, models["v1"], tmp / "serve.log",
                           *(("--gateway-lease", "10") if remote else ())))
        gateway = leader = f"http://127.0.0.1:{port}"
        if remote:  # measured through a remote gateway (serve --gateway-only) instead
            port = free_port()
            procs.append(serve(fleet_file, port, None, tmp / "remote.log", "--gateway-only",
                               "g0", "--controller", leader, "--gateway-journal",
                               str(tmp / "g0.jsonl")))
            gateway = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while len(httpx.get(f"{gateway}/health", timeout=10).json()["held"]) < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError("the remote gateway holds no member")
                time.sleep(0.1)
        proc = procs[-1]
        result["remote"] = remote
        result["latency"] = added_latency(servers[0].url, gateway, probes["short"], pairs)
        result["throughput"] = [
            throughput([s.url for s in servers], gateway, proc.pid, prompts,
                       max(requests, 4 * c), c) for c in THROUGHPUT_CONCURRENCY]
        if remote:
            status = httpx.get(f"{gateway}/health", timeout=10).json()
            result["gateway_journal"] = {"records": status["journal_seq"],
                                         "fsyncs": status["fsyncs"]}
        else:
            status = httpx.get(f"{gateway}/admin/status", timeout=10).json()["journal"]
            result["gateway_journal"] = {"records": status["last_seq"],
                                         "fsyncs": status["fsyncs"]}
        # Which side closed a connection without an answer: the gateway says so in its log
        log = tmp / ("remote.log" if remote else "serve.log")
        errors = [line for line in log.read_text(errors="replace").splitlines()
                  if "Traceback" in line or "ERROR" in line or "Exception" in line]
        result["gateway_log_errors"] = {"count": len(errors), "first": errors[:3]}
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(60)
        for s in servers:
            s.stop()
    return result


def render(r: dict[str, Any]) -> str:
    lat, j = r["latency"], r["journal"]
    lines = [f"added latency per request (concurrency 1, {lat['pairs']} interleaved pairs, "
             "4 tokens)" + (", the gateway a remote one (serve --gateway-only)"
                            if r.get("remote") else "") + ":"]
    for q, goal in (("p50", GOAL_ADDED_P50_MS), ("p99", GOAL_ADDED_P99_MS)):
        x = lat[q]
        lines.append(f"  {q}: direct {x['direct_ms']:7.2f} ms, gateway {x['gateway_ms']:7.2f}"
                     f" ms, added {x['added_ms']:6.2f} ms (goal <= {goal} ms: "
                     f"{'met' if x['added_ms'] <= goal else 'NOT met'})")
    for thr in r["throughput"]:
        met = thr["ratio"] >= GOAL_THROUGHPUT_RATIO
        lines.append(f"throughput at concurrency {thr['concurrency']} ({thr['requests']} "
                     f"requests, 16 tokens, median of {thr['rounds']}): direct "
                     f"{thr['direct_rps']:.1f} req/s, gateway {thr['gateway_rps']:.1f} req/s, "
                     f"ratio {thr['ratio']:.3f}x (goal >= {GOAL_THROUGHPUT_RATIO}: "
                     f"{'met' if met else 'NOT met'}); per round: "
                     + ", ".join(f"{x:.2f}" for x in thr["pair_ratios"]))
        lines.append(f"  the gateway's own CPU: {thr['gateway_cpu_ms_per_request']:.2f} ms per "
                     f"request, against {thr['direct_core_ms_per_request']:.2f} core-ms per "
                     f"direct request ({os.cpu_count()} cores, saturated): the cores they "
                     f"share allow at most {thr['cpu_bound_ratio']:.3f}x")
        for path, errors in thr["dropped"].items():
            if errors:
                lines.append(f"  {path}: {len(errors)} connection(s) closed without an answer "
                             f"(sent again on a new connection), first: {errors[0]}")
    lines.append(f"durable journal records/s, {j['threads']} threads:")
    for k in ("fsync_per_record", "group_commit", "fleet_fsync_per_record",
              "fleet_group_commit"):
        lines.append(f"  {k:<24} {j[k]['records_per_s']:10.0f} records/s "
                     f"({j[k]['fsyncs']} fsyncs)")
    lines.append(f"  group commit ratio: {j['ratio']:.1f}x (journal), "
                 f"{j['fleet_ratio']:.1f}x (fleet admit+release)")
    e = r["gateway_log_errors"]
    lines.append(f"errors in the gateway's log: {e['count']}"
                 + (f", first: {e['first'][0]}" if e["first"] else ""))
    g = r["gateway_journal"]
    lines.append(f"the gateway's own journal in this run: {g['records']} records, "
                 f"{g['fsyncs']} fsyncs")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--requests", type=int, default=640, help="per throughput run")
    ap.add_argument("--pairs", type=int, default=200, help="latency pairs")
    ap.add_argument("--records", type=int, default=64, help="journal records per thread")
    ap.add_argument("--remote", action="store_true", help="measure a remote gateway "
                    "(serve --gateway-only, following the leader) instead of the leader's")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        result = run(Path(tmp), args.requests, args.pairs, args.records, args.remote)
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
