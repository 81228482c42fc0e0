"""Several gateways in front of one fleet (issue 52), in one run: CPU per admission and
admissions per second at 1, 2 and 4 remote gateways, and how long an update's drain
takes with 1, 2 and 4 gateways and with one of them unreachable.

* A fleet of two simulated vLLM servers (``conformance/fixtures/sim_server.py``, each its
  own process), led by ``rolloutcore serve --gateway-lease`` (its own process), with N
  remote gateways (``rolloutcore serve --gateway-only``, each its own process, each with
  its own fsynced journal). A client at concurrency 64 sends 16-token greedy completions
  round robin over the gateways; each gateway process's CPU seconds (from /proc) per
  request it forwarded. The leader's own gateway is measured the same way beside them.
* The floor: a bare proxy on the same stack (uvicorn, a raw ASGI app, aiohttp), no
  admission and no journal (``bench_gateway_sim.py``'s): what forwarding alone costs here.
* Drains: with the gateways idle, one update through the admin API per row; its wall time
  and the longest drain among the members, and the leader's CPU during it (its cost per
  drain as gateways are added). "1 frozen": one of the gateways is stopped
  (SIGSTOP) first, so the drain waits for its lease (``--lease``), then fences it.

On 2 cores the admissions per second cannot grow with gateways (the engines, the client and
every gateway share them): the CPU per admission, and the drain's cost per gateway, are
the numbers to read. Goal: a remote gateway's CPU per forwarded request <= 0.5 ms.

Run: ``.venv/bin/python benchmarks/bench_gateways.py [--requests N] [--json]`` (about two
minutes on the 2-core machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from bench_gateway_sim import cpu, load, wait_up

from rolloutcore.adapters.launch import free_port
from rolloutcore.conformance.fixtures.sim_server import SimServer, write_checkpoint

GOAL_CPU_MS = 0.5
GATEWAYS = (1, 2, 4)
CONCURRENCY = 64
ROUNDS = 3
REPO = Path(__file__).resolve().parents[1]


def measure(urls: list[str], pids: list[int], model: str, total: int) -> dict[str, Any]:
    asyncio.run(load(urls, model, CONCURRENCY * len(urls), CONCURRENCY))  # warm
    cpu_ms, rps = [], []
    for _ in range(ROUNDS):
        before = [sum(cpu(p)) for p in pids]
        rps.append(asyncio.run(load(urls, model, total, CONCURRENCY)))
        spent = sum(sum(cpu(p)) - b for p, b in zip(pids, before, strict=True))
        cpu_ms.append(spent / total * 1e3)
    return {"gateways": len(urls), "requests": total, "cpu_ms": statistics.median(cpu_ms),
            "cpu_ms_runs": cpu_ms, "rps": statistics.median(rps)}


def spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def holds(leader: str, n: int) -> bool:
    st = httpx.get(f"{leader}/admin/status", timeout=10).json()["remote_gateways"]
    return sum(len(g["holds"]) == 2 for g in st["gateways"].values()) >= n


def wait_for(pred: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def run(tmp: Path, total: int, lease_s: float) -> dict[str, Any]:
    names = [write_checkpoint(tmp / f"v{i}") for i in range(1, 3 + 2 * len(GATEWAYS))]
    out: dict[str, Any] = {"lease_s": lease_s, "load": [], "drains": []}
    with SimServer(initial=names[0]) as a, SimServer(initial=names[0]) as b, \
            ExitStack() as stack:
        model = httpx.get(f"{a.url}/v1/models").json()["data"][0]["id"]
        fleet = tmp / "fleet.toml"
        fleet.write_text(f'[fleet]\njournal = "{tmp / "fleet.jsonl"}"\n' + "".join(
            f'[[engine]]\nname = "e{i}"\nurl = "{u}"\n' for i, u in enumerate((a.url, b.url))))
        port = free_port()
        leader = f"http://127.0.0.1:{port}"
        lead = spawn([sys.executable, "-m", "rolloutcore.cli", "serve", "--fleet", str(fleet),
                      "--port", str(port), "--initial", names[0], "--queue-depth", "1024",
                      "--no-watchdog", "--gateway-lease", str(lease_s)], tmp / "leader.log")
        stack.callback(stop, lead)
        wait_up(leader, lead, tmp / "leader.log")
        out["leader"] = measure([leader], [lead.pid], model, total)
        p = free_port()  # the floor: forwarding alone on the same stack
        bare = spawn([sys.executable, str(Path(__file__).with_name("bench_gateway_sim.py")),
                      "--bare-proxy", str(p), a.url, b.url], tmp / "bare.log")
        try:
            wait_up(f"http://127.0.0.1:{p}", bare, tmp / "bare.log")
            out["bare_proxy"] = measure([f"http://127.0.0.1:{p}"], [bare.pid], model, total)
        finally:
            stop(bare)
        followers: list[tuple[str, subprocess.Popen[bytes]]] = []
        for i in range(max(GATEWAYS)):
            p = free_port()
            log = tmp / f"g{i}.log"
            proc = spawn([sys.executable, "-m", "rolloutcore.cli", "serve", "--fleet",
                          str(fleet), "--port", str(p), "--gateway-only", f"g{i}",
                          "--controller", leader, "--gateway-journal",
                          str(tmp / f"g{i}.jsonl")], log)
            stack.callback(stop, proc)
            wait_up(f"http://127.0.0.1:{p}", proc, log)
            followers.append((f"http://127.0.0.1:{p}", proc))
        wait_for(lambda: holds(leader, len(followers)), "every gateway holds both members")
        for n in GATEWAYS:
            some = followers[:n]
            out["load"].append(measure([u for u, _ in some], [p.pid for _, p in some], model,
                                       total))
        version = iter(names[1:])
        for n, frozen in [*((n, False) for n in GATEWAYS), (max(GATEWAYS), True)]:
            for _u, proc in followers[n:]:  # only the first n follow: the rest stopped
                os.kill(proc.pid, signal.SIGSTOP)
            wait_for(lambda n=n: not holds(leader, n + 1) if n < len(followers) else True,
                     "the stopped gateways' leases to end", timeout=lease_s * 4 + 30)
            wait_for(lambda n=n: holds(leader, n), f"{n} gateways holding")
            if frozen:
                os.kill(followers[0][1].pid, signal.SIGSTOP)
            t0, c0 = time.perf_counter(), sum(cpu(lead.pid))
            ckpt = next(version)
            r = httpx.post(f"{leader}/admin/update", json={
                "checkpoint": ckpt, "label": Path(ckpt).name}, timeout=600).json()
            wall, leader_cpu = time.perf_counter() - t0, sum(cpu(lead.pid)) - c0
            if not r.get("published"):
                raise RuntimeError(f"update not published: {str(r)[:400]}")
            drains = [m.get("drain_wait_s", 0.0) for m in r["report"]["members"].values()]
            out["drains"].append({"gateways": n, "frozen": int(frozen), "update_s": wall,
                                  "drain_s": max(drains), "leader_cpu_s": leader_cpu})
            for _u, proc in followers:
                os.kill(proc.pid, signal.SIGCONT)
            wait_for(lambda: holds(leader, len(followers)), "every gateway holds again",
                     timeout=lease_s * 4 + 30)
        j = [sum(1 for _ in (tmp / f"g{i}.jsonl").open()) for i in range(len(followers))]
        out["gateway_journal_lines"] = j
    return out


def render(r: dict[str, Any]) -> str:
    ld = r["leader"]
    lines = [f"Remote gateways over two simulated engines (concurrency {CONCURRENCY}, "
             f"16-token greedy completions, median of {ROUNDS} rounds):",
             f"  the leader's own gateway: {ld['cpu_ms']:.2f} ms CPU per request, "
             f"{ld['rps']:.0f} req/s",
             f"  the floor, a bare proxy on the same stack (uvicorn, raw ASGI, aiohttp; no "
             f"admission, no journal): {r['bare_proxy']['cpu_ms']:.2f} ms"]
    for row in r["load"]:
        ok = "met" if row["cpu_ms"] <= GOAL_CPU_MS else "NOT met"
        lines.append(f"  {row['gateways']} remote gateway(s): {row['cpu_ms']:.2f} ms CPU per "
                     f"request (summed over them), {row['rps']:.0f} req/s in all; goal <= "
                     f"{GOAL_CPU_MS} ms: {ok}; vs the leader's gateway "
                     f"{row['cpu_ms'] / ld['cpu_ms']:.2f}x, its own share above the floor "
                     f"{row['cpu_ms'] - r['bare_proxy']['cpu_ms']:.2f} ms")
    lines.append(f"Updates through the admin API, gateways idle (lease {r['lease_s']:g} s):")
    for d in r["drains"]:
        what = f"{d['gateways']} gateway(s)" + (", one frozen" if d["frozen"] else "")
        lines.append(f"  {what}: update {d['update_s']:.2f} s, longest drain "
                     f"{d['drain_s']:.2f} s, the leader's CPU {d['leader_cpu_s'] * 1e3:.0f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--requests", type=int, default=1500, help="per round")
    ap.add_argument("--lease", type=float, default=3.0, help="the gateways' lease, seconds")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.requests < 1 or args.lease <= 0:
        ap.error("--requests >= 1 and --lease > 0")
    with tempfile.TemporaryDirectory(prefix="bench-gateways-") as tmp:
        result = run(Path(tmp), args.requests, args.lease)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
