"""Rollout throughput kept while the policy changes, on one real vLLM server.

A steady rollout load (``--clients`` threads, each admitting a rollout through the runner
as soon as its last one ended; lengths drawn uniformly from 16 to 256 tokens, seeded)
runs for a fixed window under three regimes, one after the other on the same server:

* ``none``: no update;
* ``wait``: a verified update every ``--every`` seconds, the drain waiting for every
  bound rollout;
* ``wait-then-abort``: the same, the drain waiting at most ``--abort-after`` seconds
  (default 0.5) and then aborting the rollouts still running (released as aborted, their
  partial tokens thrown away, to be resubmitted under the new generation).

Counted: tokens of rollouts that ended inside the window and were not aborted, per
second; the tokens aborted rollouts had generated (thrown away); updates published.
Ratios: each policy's tokens per second over ``none``'s (goal of issue 13: at least 0.9x
for the better policy).

Run: ``.venv/bin/python benchmarks/bench_throughput.py [--window 40] [--every 10]
[--clients 8] [--json]`` (about 3 minutes: a server start and three windows).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rolloutcore.adapters.http import HttpAdapter
from rolloutcore.adapters.vllm_worker import SERVER_ARGS
from rolloutcore.conformance.engines import INITIAL_LABEL, checkpoint_target
from rolloutcore.conformance.server import VllmServer
from rolloutcore.conformance.tiny_model import DEFAULT_OUT, build_models
from rolloutcore.journal import open_controller
from rolloutcore.runner import DrainPolicy, LifecycleRunner, RunnerPolicy

GOAL = 0.9
MIN_TOKENS, MAX_TOKENS = 16, 256
PROMPT = (3, 1, 4, 1, 5, 9, 2, 6)


def window(runner: LifecycleRunner, regime: str, seconds: float, every: float,
           clients: int, seed: int, targets: list[Any], first_gen: int) -> dict[str, Any]:
    """One window of steady load; updates every ``every`` seconds unless ``none``."""
    if regime != "none":
        runner.policy = dataclasses.replace(runner.policy, drain_policy=DrainPolicy(regime))
    start = time.monotonic()
    end = start + seconds
    lock = threading.Lock()
    tally = {"kept": 0, "thrown": 0, "rollouts": 0, "aborted": 0, "failed": 0}
    n = [0]

    def client(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        while time.monotonic() < end:
            with lock:
                n[0] += 1
                rid = f"{regime}-{n[0]}"
            length = rng.randint(MIN_TOKENS, MAX_TOKENS)
            try:
                binding, res = runner.generate(rid, PROMPT, length,
                                               wait=max(0.1, end - time.monotonic()))
            except Exception:  # an aborted request may end in an error: counted
                with lock:
                    tally["failed"] += 1
                continue
            done = time.monotonic()
            with lock:
                if binding.aborted:
                    tally["aborted"] += 1
                    tally["thrown"] += len(res.tokens)
                elif done <= end:
                    tally["rollouts"] += 1
                    tally["kept"] += len(res.tokens)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    published, cycle_s = 0, []
    gen = first_gen
    if regime != "none":
        nxt = start + every
        while nxt < end:
            time.sleep(max(0.0, nxt - time.monotonic()))
            target = dataclasses.replace(targets[gen % 2], generation=gen, label=f"gen{gen}")
            report = runner.update(target)
            if not report.published:
                raise RuntimeError(f"update {gen} not published: {report.steps}")
            published += 1
            cycle_s.append(round(report.total_s, 3))
            gen += 1
            nxt += every
    for t in threads:
        t.join(end - time.monotonic() + 120.0)
    return {"regime": regime, "tokens_per_s": tally["kept"] / seconds, **tally,
            "updates": published, "cycle_s": cycle_s, "next_generation": gen}


def run(seconds: float, every: float, clients: int, abort_after: float, work: Path,
        log: Any) -> dict[str, Any]:
    models = build_models(DEFAULT_OUT)
    paths = (models["v1"].resolve(), models["v2"].resolve())
    srv = VllmServer(paths[0], extra_args=list(SERVER_ARGS), log_path=work / "vllm.log")
    t0 = time.perf_counter()
    srv.start()
    print(f"server up in {time.perf_counter() - t0:.1f} s", file=log)
    adapter = HttpAdapter(srv.url)
    out: dict[str, Any] = {"window_s": seconds, "update_every_s": every, "clients": clients,
                           "abort_after_s": abort_after, "lengths": [MIN_TOKENS, MAX_TOKENS]}
    try:
        controller, journal, _ = open_controller(work / "journal.jsonl")
        runner = LifecycleRunner(controller, adapter, RunnerPolicy(
            step_timeout_s=60.0, abort_after_s=abort_after))
        boot = runner.bootstrap(checkpoint_target(paths[0], 1, INITIAL_LABEL))
        if boot.trigger != "bootstrap_ok":
            raise RuntimeError(f"bootstrap failed: {boot.reason}")
        targets = [checkpoint_target(p, 2, "x") for p in (paths[1], paths[0])]
        gen = 2
        rows = []
        for i, regime in enumerate(("none", "wait", "wait-then-abort")):
            row = window(runner, regime, seconds, every, clients, i, targets, gen)
            gen = row.pop("next_generation")
            rows.append(row)
            print(f"{regime}: {row['tokens_per_s']:.0f} tokens/s, {row['updates']} updates",
                  file=log)
        journal.close()
    finally:
        adapter.close()
        srv.stop()
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["over_none"] = round(r["tokens_per_s"] / base, 3) if base else None
    best = max(r["over_none"] or 0.0 for r in rows[1:])
    out.update(rows=rows, best_over_none=best, goal=GOAL, met=best >= GOAL)
    return out


def render(r: dict[str, Any]) -> str:
    lines = [f"{r['clients']} clients, {r['lengths'][0]}-{r['lengths'][1]} tokens, window "
             f"{r['window_s']:.0f} s, an update every {r['update_every_s']:.0f} s",
             f"{'regime':<16} {'tokens/s':>9} {'x none':>7} {'rollouts':>8} {'updates':>7} "
             f"{'aborted':>7} {'thrown':>7} {'failed':>6}  cycle s"]
    for x in r["rows"]:
        lines.append(f"{x['regime']:<16} {x['tokens_per_s']:>9.0f} {x['over_none']:>7.3f} "
                     f"{x['rollouts']:>8} {x['updates']:>7} {x['aborted']:>7} "
                     f"{x['thrown']:>7} {x['failed']:>6}  {x['cycle_s']}")
    lines.append(f"better policy / none: {r['best_over_none']:.3f}x (goal >= {r['goal']}x: "
                 f"{'met' if r['met'] else 'NOT met'})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--window", type=float, default=40.0)
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--abort-after", type=float, default=0.5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
        result = run(args.window, args.every, args.clients, args.abort_after, Path(tmp),
                     sys.stderr)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
