"""Rollout throughput kept while the policy changes: a fleet of real vLLM servers behind
the gateway (default, ``--servers 3``), or one server and its runner (``--servers 1``).

**Fleet** (``--servers N >= 2``): ``--clients`` threads stream greedy completions through
the gateway, each starting the next as soon as its last one ended, lengths from
``--load``: ``heavy`` (default: 32-128 tokens, one in fifty 2,000-4,000; the servers run
the tiny model with its context raised to 4,608 by ``--hf-overrides``) or ``uniform``
(16-256). Four windows, one after the other on the same servers, each a fresh fleet and
gateway bootstrapped on the checkpoint the servers hold:

* ``none``: no update;
* ``wait``: a strict fleet-wide update every ``--every`` seconds (admissions close, the
  drain waits for every bound rollout);
* ``wait-then-abort``: the same, the drain waiting at most ``--abort-after`` seconds and
  aborting the rest (their tokens thrown away);
* ``rolling``: a rolling update (max_live 2, min_admitting N-1) every ``--every``
  seconds; the gateway moves each stream off a member that drains onto one of its
  generation.

Counted per window: tokens of streams that ended inside it with all their tokens, per
second; tokens of aborted streams (thrown away); per update, the time from its request
to the new generation being served (strict: the publish; rolling: the first wave's
publish); for ``rolling``, the staleness of each request (the frontier when its answer
began minus the generation that served it) and the streams moved. Ratios: tokens/s
over ``none``'s; goal (issue 24): rolling >= 0.98x on the heavy-tailed load.

**One server** (``--servers 1``, the earlier benchmark): a steady rollout load
(``--clients`` threads, each admitting a rollout through the runner
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

Run: ``.venv/bin/python benchmarks/bench_throughput.py [--servers 3] [--load heavy]
[--window 40] [--every 10] [--clients 12] [--json]`` (fleet: about 5 minutes, three
server starts and four windows; one server: about 3).
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
from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models
from rolloutcore.conformance.fixtures.vllm_server import VllmServer
from rolloutcore.engine.runner import DrainPolicy, LifecycleRunner, RunnerPolicy
from rolloutcore.journal import open_controller

GOAL = 0.9
ROLLING_GOAL = 0.98
MIN_TOKENS, MAX_TOKENS = 16, 256
#: The heavy-tailed load: most rollouts short, one in TAIL_EVERY a straggler.
SHORT, TAIL, TAIL_EVERY = (32, 128), (2000, 4000), 50
LONG_CONTEXT = 4608
LONG_ARGS = ("--max-model-len", str(LONG_CONTEXT), "--hf-overrides",
             json.dumps({"max_position_embeddings": LONG_CONTEXT}),
             "--kv-cache-memory-bytes", "256M")
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


def draw_length(rng: random.Random, load: str) -> int:
    if load == "uniform":
        return rng.randint(MIN_TOKENS, MAX_TOKENS)
    return rng.randint(*TAIL) if rng.randrange(TAIL_EVERY) == 0 else rng.randint(*SHORT)


class FleetWindow:
    """One window of streamed load through a gateway over a fresh fleet."""

    def __init__(self, servers: list[Any], regime: str, current: Path, other: Path,
                 label: str, work: Path, args: argparse.Namespace, seed: int) -> None:
        from rolloutcore.fleet import Fleet

        self.regime, self.args, self.seed = regime, args, seed
        self.paths = [current, other]  # the checkpoint for generation g: paths[(g - 1) % 2]
        rolling = regime == "rolling"
        names = [f"e{i}" for i in range(len(servers))]
        drain = DrainPolicy.WAIT_THEN_ABORT if regime == "wait-then-abort" else \
            DrainPolicy.WAIT
        policy = RunnerPolicy(step_timeout_s=120.0, drain_timeout_s=600.0,
                              abort_after_s=args.abort_after, drain_policy=drain)
        self.adapters = [HttpAdapter(s.url) for s in servers]
        self.fleet = Fleet([(n, a, s.url) for n, a, s in zip(names, self.adapters, servers,
                                                              strict=True)],
                           journal=work / f"fleet-{regime}.jsonl", min_serving=len(names) - 1,
                           policy=policy, fsync=False, max_live=2 if rolling else 1,
                           min_admitting=len(names) - 1 if rolling else 0)
        # bootstrapped on what the servers hold: the last window's checkpoint and label
        out = self.fleet.bootstrap(checkpoint_target(current, 1, label))
        if self.fleet.committed != 1:
            raise RuntimeError(f"bootstrap failed: {out}")
        self.lock = threading.Lock()
        self.tally = {"kept": 0, "thrown": 0, "streams": 0, "aborted": 0, "failed": 0}
        self.staleness: dict[int, int] = {}
        self.frontier_s: list[float] = []

    def client(self, url: str, k: int, end: float) -> None:
        import httpx

        rng = random.Random(self.seed * 1000 + k)
        with httpx.Client(timeout=600.0) as http:
            while time.monotonic() < end:
                n = draw_length(rng, self.args.load)
                got, finish, served, frontier = 0, None, 0, 0
                try:
                    with http.stream("POST", f"{url}/v1/completions", json={
                            "model": "tiny", "prompt": list(PROMPT), "max_tokens": n,
                            "min_tokens": n, "temperature": 0, "stream": True,
                            "return_token_ids": True}) as resp:
                        frontier = self.fleet.committed
                        served = int(resp.headers.get("x-rolloutcore-generation", 0))
                        for line in resp.iter_lines():
                            if time.monotonic() > end:
                                break  # closed: the gateway has the engine abort it
                            if not line.startswith("data: {"):
                                continue
                            choice = json.loads(line[6:])["choices"][0]
                            got += len(choice.get("token_ids") or ())
                            finish = choice.get("finish_reason") or finish
                except Exception:  # counted; the load goes on
                    with self.lock:
                        self.tally["failed"] += 1
                    continue
                with self.lock:
                    if time.monotonic() > end:
                        continue  # ended outside the window: not counted
                    if got == n and finish == "length":
                        self.tally["streams"] += 1
                        self.tally["kept"] += got
                        lag = frontier - served
                        self.staleness[lag] = self.staleness.get(lag, 0) + 1
                    else:
                        self.tally["aborted"] += 1
                        self.tally["thrown"] += got

    def updates(self, start: float, end: float) -> int:
        published, gen = 0, 2
        nxt = start + self.args.every
        while nxt < end:
            time.sleep(max(0.0, nxt - time.monotonic()))
            target = checkpoint_target(self.paths[(gen - 1) % 2], gen, f"gen{gen}")
            t0 = time.monotonic()
            watch = threading.Thread(target=self._watch, args=(gen, t0), daemon=True)
            watch.start()
            report = self.fleet.update(target)
            watch.join(600.0)
            if not report.published:
                raise RuntimeError(f"update {gen} not published: {report.as_json()}")
            published += 1
            gen += 1
            nxt = max(nxt + self.args.every, time.monotonic())
        return published

    def _watch(self, gen: int, t0: float) -> None:
        while self.fleet.committed < gen:
            time.sleep(0.005)
        self.frontier_s.append(round(time.monotonic() - t0, 3))

    def run(self) -> dict[str, Any]:
        from rolloutcore.check.fleet_trace import check_fleet_file
        from rolloutcore.gateway.core import Gateway, GatewayConfig
        from rolloutcore.gateway.server import ServerThread

        gw = Gateway(self.fleet, GatewayConfig(model="tiny", queue_depth=1024,
                                               queue_wait_s=600.0),
                     target_of=checkpoint_target)
        try:
            with ServerThread(gw) as url:
                start = time.monotonic()
                end = start + self.args.window
                threads = [threading.Thread(target=self.client, args=(url, k, end),
                                            daemon=True) for k in range(self.args.clients)]
                for t in threads:
                    t.start()
                published = self.updates(start, end) if self.regime != "none" else 0
                for t in threads:
                    t.join(max(0.0, end - time.monotonic()) + 120.0)
                moved = sum(x.value for m in gw.metrics.migrations.collect()
                            for x in m.samples if x.labels.get("outcome") == "moved"
                            and x.name.endswith("_total"))
        finally:
            gw.close()
            self.fleet.close()
            for a in self.adapters:
                a.close()
        verdict = check_fleet_file(self.fleet.journal.path)
        if not verdict.accepted:
            raise RuntimeError(f"{self.regime}: the fleet journal: {verdict.message}")
        return {"regime": self.regime, "tokens_per_s": self.tally["kept"] / self.args.window,
                **self.tally, "updates": published, "frontier_s": self.frontier_s,
                "moved": int(moved), "staleness": dict(sorted(self.staleness.items())),
                "holds": self.paths[published % 2],
                "label": self.fleet.committed_target().label}  # type: ignore[union-attr]


def run_fleet(args: argparse.Namespace, work: Path, log: Any) -> dict[str, Any]:
    models = build_models(DEFAULT_OUT)
    paths = [models["v1"].resolve(), models["v2"].resolve()]
    extra = [*SERVER_ARGS, *(LONG_ARGS if args.load == "heavy" else ())]
    servers = [VllmServer(paths[0], extra_args=extra, log_path=work / f"vllm-{i}.log")
               for i in range(args.servers)]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=s.start) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not all(s.is_running() for s in servers):
        raise RuntimeError("a server did not start (see its log)")
    print(f"{args.servers} servers up in {time.perf_counter() - t0:.1f} s", file=log)
    rows = []
    try:
        current, label = paths[0], INITIAL_LABEL
        for regime in ("none", "wait", "wait-then-abort", "rolling"):
            other = paths[1] if current == paths[0] else paths[0]
            # the same seed in every window: each sees the same sequence of lengths
            row = FleetWindow(servers, regime, current, other, label, work, args, 0).run()
            current, label = Path(row.pop("holds")), row.pop("label")
            rows.append(row)
            print(f"{regime}: {row['tokens_per_s']:.0f} tokens/s, {row['updates']} updates, "
                  f"frontier after {row['frontier_s']} s", file=log)
    finally:
        for s in servers:
            s.stop()
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["over_none"] = round(r["tokens_per_s"] / base, 3) if base else None
    rolling = rows[-1]["over_none"] or 0.0
    return {"servers": args.servers, "load": args.load, "window_s": args.window,
            "update_every_s": args.every, "clients": args.clients,
            "abort_after_s": args.abort_after, "rows": rows, "rolling_over_none": rolling,
            "goal": ROLLING_GOAL, "met": rolling >= ROLLING_GOAL}


def render_fleet(r: dict[str, Any]) -> str:
    load = (f"{SHORT[0]}-{SHORT[1]} tokens, 1 in {TAIL_EVERY} {TAIL[0]}-{TAIL[1]}"
            if r["load"] == "heavy" else f"{MIN_TOKENS}-{MAX_TOKENS} tokens")
    lines = [f"{r['servers']} servers behind the gateway, {r['clients']} streaming clients, "
             f"{load}, window {r['window_s']:.0f} s, an update every "
             f"{r['update_every_s']:.0f} s",
             f"{'regime':<16} {'tokens/s':>9} {'x none':>7} {'streams':>7} {'updates':>7} "
             f"{'aborted':>7} {'thrown':>7} {'moved':>5}  new generation served after (s); "
             "staleness"]
    for x in r["rows"]:
        lines.append(f"{x['regime']:<16} {x['tokens_per_s']:>9.0f} {x['over_none']:>7.3f} "
                     f"{x['streams']:>7} {x['updates']:>7} {x['aborted']:>7} "
                     f"{x['thrown']:>7} {x['moved']:>5}  {x['frontier_s']}; "
                     f"{x['staleness']}")
    lines.append(f"rolling / none: {r['rolling_over_none']:.3f}x (goal >= {r['goal']}x: "
                 f"{'met' if r['met'] else 'NOT met'})")
    return "\n".join(lines)


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
    ap.add_argument("--servers", type=int, default=3,
                    help="1: one server and its runner; 2 or more: a fleet behind the gateway")
    ap.add_argument("--load", choices=("heavy", "uniform"), default=None,
                    help="rollout lengths (default: heavy for a fleet, uniform for one server)")
    ap.add_argument("--window", type=float, default=40.0)
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=None,
                    help="default: 12 for a fleet, 8 for one server")
    ap.add_argument("--abort-after", type=float, default=0.5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.servers < 1 or args.window <= 0 or args.every <= 0 or (
            args.clients is not None and args.clients < 1):
        ap.error("--servers and --clients must be >= 1, --window and --every > 0")
    fleet = args.servers >= 2
    if args.load is None:
        args.load = "heavy" if fleet else "uniform"
    if args.clients is None:
        args.clients = 12 if fleet else 8
    if not fleet and args.load != "uniform":
        ap.error("--servers 1 runs the uniform load only")
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
        if fleet:
            result = run_fleet(args, Path(tmp), sys.stderr)
        else:
            result = run(args.window, args.every, args.clients, args.abort_after, Path(tmp),
                         sys.stderr)
    rendered = render_fleet(result) if fleet else render(result)
    print(json.dumps(result, indent=2, default=str) if args.json else rendered)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
