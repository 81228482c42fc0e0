"""What a Ray-hosted fleet of two engines costs here against two HTTP servers: time until
both engines answer, memory (the resident set of every process each setup adds: the
servers and their engine cores; the Ray cluster, its actors and their engine cores), and
a verified fleet update v1 -> v2 -> v1 through each (HTTP adapters against Ray handles).
Both start their two engines side by side.

The two setups run one after the other (two cores here: never side by side). Ratios are
Ray over HTTP in the same run.

Run: ``.venv/bin/python benchmarks/bench_ray_fleet.py [--json]`` (about two minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from rolloutcore.conformance.engines import INITIAL_LABEL, checkpoint_target
from rolloutcore.conformance.fixtures.tiny_model import build_models
from rolloutcore.engine.runner import RunnerPolicy
from rolloutcore.fleet import Fleet

POLICY = RunnerPolicy(step_timeout_s=60.0, pause_timeout_s=60.0, drain_timeout_s=60.0)


def _rss_mib(pids: set[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):  # ended meanwhile
            total += psutil.Process(pid).memory_info().rss
    return total / 2**20


def _added_pids(before: set[int]) -> set[int]:
    """Every process now alive that was not before (what the setup started)."""
    me = os.getpid()
    return {p.pid for p in psutil.process_iter() if p.pid not in before and p.pid != me}


def _cycles(members: Sequence[tuple[str, Any, str]], work: Path, rounds: int) -> list[float]:
    models = build_models()
    fleet = Fleet(list(members), journal=work / f"fleet-{time.monotonic_ns()}.jsonl",
                  policy=POLICY)
    try:
        boot = fleet.bootstrap(checkpoint_target(models["v1"], 1, INITIAL_LABEL))
        if not all(o.trigger == "bootstrap_ok" for o in boot.values()):
            raise SystemExit(f"bootstrap failed: {boot}")
        out = []
        for g in range(2, 2 + 2 * rounds):
            name = "v2" if g % 2 == 0 else "v1"
            t0 = time.perf_counter()
            rep = fleet.update(checkpoint_target(models[name], g, f"{name}-gen{g}"))
            out.append(time.perf_counter() - t0)
            if not rep.published:
                raise SystemExit(f"update to generation {g} not published: {rep}")
        return out
    finally:
        fleet.close()


def measure(start: Callable[[], tuple[Sequence[tuple[str, Any, str]], Callable[[], None]]],
            work: Path, rounds: int) -> dict[str, Any]:
    before = {p.pid for p in psutil.process_iter()}
    t0 = time.perf_counter()
    members, stop = start()
    ready = time.perf_counter() - t0
    try:
        pids = _added_pids(before)
        rss = _rss_mib(pids)
        cycles = _cycles(members, work, rounds)
    finally:
        stop()
    return {"ready_s": round(ready, 2), "processes": len(pids), "rss_mib": round(rss),
            "cycle_s": round(statistics.median(cycles), 3)}


def http_setup(work: Path) -> tuple[list[tuple[str, Any, str]], Callable[[], None]]:
    from rolloutcore.adapters.http import HttpAdapter
    from rolloutcore.adapters.vllm_worker import SERVER_ARGS
    from rolloutcore.conformance.fixtures.vllm_server import VllmServer

    servers = [VllmServer(build_models()["v1"].resolve(), extra_args=list(SERVER_ARGS),
                          log_path=work / f"vllm-{n}.log") for n in ("a", "b")]
    with ThreadPoolExecutor(len(servers)) as pool:  # side by side, as Ray starts its actors
        list(pool.map(lambda s: s.start(), servers))
    members = [(n, HttpAdapter(s.url), s.url) for n, s in zip("ab", servers, strict=True)]

    def stop() -> None:
        for s in servers:
            s.stop()
    return members, stop


def ray_setup(_work: Path) -> tuple[list[tuple[str, Any, str]], Callable[[], None]]:
    import ray

    from rolloutcore.adapters.ray_engine import NAMESPACE, RayAdapter, launch

    ray.init(num_cpus=3, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False,
             configure_logging=False)
    _pg, engines = launch(build_models()["v1"], ["a", "b"])
    members = [(e.name, RayAdapter(e.handle), e.url) for e in engines]
    return members, ray.shutdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3, help="update pairs per setup")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        work = Path(tmp)
        http = measure(lambda: http_setup(work), work, args.rounds)
        ray_ = measure(lambda: ray_setup(work), work, args.rounds)
    ratios = {k: round(ray_[k] / http[k], 2) for k in ("ready_s", "rss_mib", "cycle_s")}
    out = {"http": http, "ray": ray_, "ray_over_http": ratios}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{'':8} {'ready':>8} {'processes':>10} {'RSS MiB':>9} {'update cycle':>13}")
        for name, row in (("HTTP", http), ("Ray", ray_)):
            print(f"{name:8} {row['ready_s']:7.1f}s {row['processes']:>10} "
                  f"{row['rss_mib']:>9} {row['cycle_s']:12.3f}s")
        print(f"Ray / HTTP: ready {ratios['ready_s']}x, memory {ratios['rss_mib']}x, "
              f"update cycle {ratios['cycle_s']}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
