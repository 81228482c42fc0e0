"""Agentic load across updates: what each way of handling live episodes costs in tokens/s.

The gateway's episode runtime (``rolloutcore.gateway.episodes``, no HTTP) over a fleet of
three simulated engines whose generation takes real time (``--token-ms`` per token).
``--workers`` agents each run episodes back to back: 2-6 turns of ``--turn-tokens``
tokens, a tool wait between turns drawn heavy-tailed (most 0.05-0.5 s, one in twenty
5-20 s; every wait times ``--scale``). An update starts every ``10 s x scale`` (while
none runs). Modes, each run for ``--seconds`` in one process, reported as ratios to the
first:

* none: a rolling fleet (K=2) that never updates: the baseline;
* strict-wait: every update closes the whole fleet (K=1) and drains waiting for the
  episodes pinned to each member;
* rolling-pinned: K=2, one member leaving at a time; its drain waits for its episodes
  (policy ``wait``): no episode is ever served by two generations;
* rolling-segment: K=2; a draining member lets its episodes go, which continue as a new
  segment on a newer generation (policy ``segment``).

Reported per mode: tokens/s and its ratio to ``none``, episodes ended, segments opened,
updates published, the mean time a member's drain waited on episodes, and two checks
that must hold: every turn's tokens are the greedy reference of the generation that
served it (``wrong``: 0), and the fleet journal passes the trace checker (which checks
every episode's holds against the spec's OneEpisodeOnePolicy and SegmentsInOrder).

Goal (issue 49): rolling-pinned >= 0.95x of none, with zero episodes served by two
generations in one segment.

Usage: .venv/bin/python benchmarks/bench_episodes.py [--seconds 20] [--scale 0.25]
       [--workers 24] [--json]"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rolloutcore.adapters.sim import SimAdapter, SimEngine, reference_tokens, sim_target
from rolloutcore.check.fleet_trace import check_fleet_file
from rolloutcore.engine.runner import RunnerPolicy
from rolloutcore.fleet import Fleet
from rolloutcore.gateway.episodes import EpisodeRefused, Episodes

NAMES = ("a", "b", "c")
MODES = {"none": (2, "wait", False), "strict-wait": (1, "wait", True),
         "rolling-pinned": (2, "wait", True), "rolling-segment": (2, "segment", True)}


def ckpt(g: int) -> str:
    return f"ckpt-{(g - 1) % 2 + 1}"


def tool_wait(rng: random.Random, scale: float) -> float:
    long = rng.random() < 0.05
    return scale * (rng.uniform(5.0, 20.0) if long else rng.uniform(0.05, 0.5))


def run_mode(tmp: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    max_live, policy, updating = MODES[mode]
    engines = {n: SimEngine(ckpt(1), token_seconds=args.token_ms / 1000, label="rc-1")
               for n in NAMES}
    # The drain's deadline outlasts the longest tool wait: a waiting drain ends with its
    # episodes, never by cancelling the update.
    runner = RunnerPolicy(step_timeout_s=600.0, pause_timeout_s=600.0,
                          drain_timeout_s=600.0, mutation_base_s=600.0, retry_backoff_s=0.0)
    journal = tmp / f"{mode}.jsonl"
    fleet = Fleet([(n, SimAdapter(e), None) for n, e in engines.items()], journal=journal,
                  min_serving=1, policy=runner, fsync=False, max_live=max_live,
                  min_admitting=2 if max_live > 1 else 0)
    fleet.bootstrap(sim_target(1, ckpt(1)))
    pool = ThreadPoolExecutor(4)
    eps = Episodes(fleet, idle_s=3600.0, queue_wait_s=600.0, pool=pool)
    stop = threading.Event()
    lock = threading.Lock()
    totals = {"tokens": 0, "wrong": 0, "turns": 0}
    drain_waits: list[float] = []
    published = [0]

    def agent(k: int) -> None:
        rng = random.Random(k)
        n_ep = 0
        while not stop.is_set():
            n_ep += 1
            eid, context = f"w{k}-{n_ep}", [k % 7 + 1, n_ep % 5 + 1]
            turns = rng.randint(2, 6)
            for t in range(turns):
                try:
                    lease = eps.begin_turn(eid, policy, "bench", stop).lease
                except EpisodeRefused:
                    break  # aborted, or stopped while waiting
                out = engines[lease.engine].generate(tuple(context), args.turn_tokens)
                ok = out.tokens == reference_tokens(ckpt(lease.generation), tuple(context),
                                                    args.turn_tokens)
                eps.end_turn(eid, ok=True, end=t == turns - 1 or stop.is_set())
                with lock:
                    totals["tokens"] += len(out.tokens)
                    totals["turns"] += 1
                    totals["wrong"] += not ok
                if t == turns - 1 or stop.is_set():
                    break
                context += [*out.tokens, 3]  # the tool's answer, then the next turn
                stop.wait(tool_wait(rng, args.scale))

    def updater() -> None:
        g = 1
        while not stop.wait(10.0 * args.scale):
            g += 1
            rep = fleet.update(sim_target(g, ckpt(g)))
            published[0] += rep.published
            drain_waits.extend(m.drain_wait_s for m in rep.members.values())

    threads = [threading.Thread(target=agent, args=(k,), daemon=True)
               for k in range(args.workers)]
    up = threading.Thread(target=updater, daemon=True)
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    if updating:
        up.start()
    time.sleep(args.seconds)
    with lock:
        tokens, seconds = totals["tokens"], time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    if updating:
        up.join()
    eps.close()
    pool.shutdown(wait=True)
    fleet.close()
    verdict = check_fleet_file(journal)
    return {"mode": mode, "tokens_per_s": tokens / seconds, "turns": totals["turns"],
            "wrong": totals["wrong"], "episodes_done": eps.counts["done"],
            "segments": eps.counts["segments"], "aborted": eps.counts["aborted"],
            "updates": published[0],
            "drain_wait_s": sum(drain_waits) / len(drain_waits) if drain_waits else 0.0,
            "journal_ok": verdict.accepted, "journal": verdict.message}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--scale", type=float, default=0.25, help="times every wait")
    p.add_argument("--workers", type=int, default=24)
    p.add_argument("--token-ms", type=float, default=2.0)
    p.add_argument("--turn-tokens", type=int, default=16)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    if modes[0] != "none" or not set(modes) <= set(MODES):
        p.error(f"--modes: 'none' first, then any of {', '.join(MODES)}")
    with tempfile.TemporaryDirectory() as d:
        rows = [run_mode(Path(d), m, args) for m in modes]
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["ratio"] = r["tokens_per_s"] / base if base else 0.0
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{args.workers} agents, {args.seconds:g} s per mode, waits x{args.scale:g}, "
              f"{args.token_ms:g} ms/token, {args.turn_tokens} tokens/turn")
        print(f"{'mode':16} {'tokens/s':>9} {'ratio':>6} {'turns':>6} {'done':>5} "
              f"{'segs':>5} {'abort':>5} {'upd':>4} {'drain wait':>10} {'wrong':>5} journal")
        for r in rows:
            print(f"{r['mode']:16} {r['tokens_per_s']:9.0f} {r['ratio']:6.3f} "
                  f"{r['turns']:6d} {r['episodes_done']:5d} {r['segments']:5d} "
                  f"{r['aborted']:5d} {r['updates']:4d} {r['drain_wait_s']:9.2f}s "
                  f"{r['wrong']:5d} {'ok' if r['journal_ok'] else r['journal']}")
    bad = [r["mode"] for r in rows if r["wrong"] or not r["journal_ok"]]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
