"""The gateway's own CPU per forwarded request over simulated engines, against a bare
proxy on the same stack, in one run.

* ``rolloutcore serve`` (its own process, as deployed: a fleet of two simulated vLLM
  servers, ``conformance/fixtures/sim_server.py``, each its own process; the fleet
  journal fsynced with group commit), driven by a client at concurrency 64 and 256 with
  greedy completions of 16 tokens; the gateway process's CPU seconds per request, from
  /proc (user and system apart), and its journal's records and fsyncs per request.
* The floor: a bare proxy on the gateway's own stack (uvicorn, a raw ASGI app, aiohttp
  to the same two servers, round robin) with no admission, no journal, no metrics: what
  forwarding alone costs on this machine.

Goal (issue 52): the gateway's CPU per forwarded request <= 0.5 ms. The engines and the
client share the machine's cores with the gateway: requests per second are printed for
scale only.

Run: ``.venv/bin/python benchmarks/bench_gateway_sim.py [--requests N] [--json]`` (about
two minutes on the 2-core machine).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from rolloutcore.adapters.launch import free_port
from rolloutcore.adapters.sim import SIM_PROBE_PROMPT
from rolloutcore.conformance.fixtures.sim_server import SimServer, write_checkpoint

GOAL_CPU_MS = 0.5
CONCURRENCY = (64, 256)
ROUNDS = 3
PROMPT = SIM_PROBE_PROMPT
REPO = Path(__file__).resolve().parents[1]


def cpu(pid: int) -> tuple[float, float]:
    """User and system CPU seconds process ``pid`` has used so far (Linux /proc)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def wait_up(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{url} did not start")
        time.sleep(0.2)


async def load(url: str | list[str], model: str, total: int, concurrency: int) -> float:
    """Requests per second of ``total`` greedy completions at ``concurrency`` (round robin
    over several gateways' URLs, if given)."""
    urls = [url] if isinstance(url, str) else url
    body = {"model": model, "prompt": list(PROMPT), "max_tokens": 16, "temperature": 0}
    limits = httpx.Limits(max_connections=concurrency * 2, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as c:
        async def worker(i: int) -> None:
            for k in range(i, total, concurrency):
                r = await c.post(f"{urls[k % len(urls)]}/v1/completions", json=body)
                r.raise_for_status()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return total / (time.perf_counter() - t0)


def measure(url: str, pid: int, model: str, total: int, concurrency: int
            ) -> dict[str, Any]:
    asyncio.run(load(url, model, concurrency, concurrency))  # warm: connections made
    user, system, rps = [], [], []
    for _ in range(ROUNDS):
        u0, s0 = cpu(pid)
        rps.append(asyncio.run(load(url, model, total, concurrency)))
        u1, s1 = cpu(pid)
        user.append((u1 - u0) / total * 1e3)
        system.append((s1 - s0) / total * 1e3)
    cpu_ms = [u + s for u, s in zip(user, system, strict=True)]
    return {"concurrency": concurrency, "requests": total, "rounds": ROUNDS,
            "cpu_ms": statistics.median(cpu_ms), "user_ms": statistics.median(user),
            "system_ms": statistics.median(system), "rps": statistics.median(rps),
            "cpu_ms_runs": cpu_ms}


def run(tmp: Path, total: int) -> dict[str, Any]:
    name = write_checkpoint(tmp / "v1")
    out: dict[str, Any] = {}
    with SimServer(initial=name) as a, SimServer(initial=name) as b:
        model = httpx.get(f"{a.url}/v1/models").json()["data"][0]["id"]
        for kind in ("gateway", "bare_proxy"):
            port = free_port()
            log = tmp / f"{kind}.log"
            if kind == "gateway":
                fleet = tmp / "fleet.toml"
                fleet.write_text(f'[fleet]\njournal = "{tmp / "fleet.jsonl"}"\n' + "".join(
                    f'[[engine]]\nname = "e{i}"\nurl = "{u}"\n'
                    for i, u in enumerate((a.url, b.url))))
                cmd = [sys.executable, "-m", "rolloutcore.cli", "serve", "--fleet", str(fleet),
                       "--port", str(port), "--initial", name, "--queue-depth", "1024",
                       "--no-watchdog"]
            else:
                cmd = [sys.executable, __file__, "--bare-proxy", str(port), a.url, b.url]
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=log.open("wb"),
                                    stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{port}"
            try:
                wait_up(url, proc, log)
                rows = [measure(url, proc.pid, model, max(total, 4 * c), c)
                        for c in CONCURRENCY]
                if kind == "gateway":
                    st = httpx.get(f"{url}/admin/status", timeout=10).json()["journal"]
                    served = sum(r["requests"] * ROUNDS + r["concurrency"] for r in rows)
                    out["journal"] = {"records": st["last_seq"], "fsyncs": st["fsyncs"],
                                      "requests": served}
                out[kind] = rows
            finally:
                proc.terminate()
                proc.wait(60)
    return out


def bare_proxy(port: int, upstreams: list[str]) -> None:
    """Forwarding alone on the gateway's stack: uvicorn, raw ASGI, aiohttp."""
    import aiohttp
    import uvicorn

    turn = itertools.cycle(upstreams)
    session: list[aiohttp.ClientSession] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                if m["type"] == "lifespan.startup":
                    session.append(aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)))
                    await send({"type": "lifespan.startup.complete"})
                elif m["type"] == "lifespan.shutdown":
                    await session[0].close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        async with session[0].request(scope["method"], next(turn) + scope["path"], data=body,
                                      headers={"content-type": "application/json"}) as r:
            data = await r.read()
            await send({"type": "http.response.start", "status": r.status,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": data})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                timeout_keep_alive=65, backlog=2048)


def render(r: dict[str, Any]) -> str:
    lines = [f"CPU per forwarded request (median of {ROUNDS} rounds; two simulated engines; "
             "16-token greedy completions):"]
    for g, p in zip(r["gateway"], r["bare_proxy"], strict=True):
        lines.append(
            f"  concurrency {g['concurrency']}: gateway {g['cpu_ms']:.2f} ms (user "
            f"{g['user_ms']:.2f}, system {g['system_ms']:.2f}; {g['rps']:.0f} req/s), bare "
            f"proxy {p['cpu_ms']:.2f} ms (user {p['user_ms']:.2f}, system "
            f"{p['system_ms']:.2f}); the gateway's own share {g['cpu_ms'] - p['cpu_ms']:.2f} "
            f"ms; goal <= {GOAL_CPU_MS} ms: {'met' if g['cpu_ms'] <= GOAL_CPU_MS else 'NOT met'}")
    j = r["journal"]
    lines.append(f"  the gateway's journal: {j['records'] / j['requests']:.2f} records and "
                 f"{j['fsyncs'] / j['requests']:.2f} fsyncs per request "
                 f"({j['records']} records, {j['fsyncs']} fsyncs, {j['requests']} requests)")
    lines.append(f"  per gateway core at that CPU: about "
                 f"{1e3 / r['gateway'][0]['cpu_ms']:.0f} admissions/s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--bare-proxy"]:  # the floor's own process (started by run)
        bare_proxy(int(argv[1]), argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--requests", type=int, default=2000, help="per round")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.requests < 1:
        ap.error("--requests must be at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-gateway-sim-") as tmp:
        result = run(Path(tmp), args.requests)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
