"""How long an update waits for a straggler: the strict fleet-wide update against a
rolling one with in-flight migration, on three simulated engines whose generation takes
real time (``--token-ms`` per token).

One straggler of L tokens (``--lengths``) is bound when the update is requested, a
quarter of it already generated; the other members are idle. Its client generates in
chunks of 16 tokens and, as the gateway does, moves the rollout (``Fleet.migrate``) when
its member starts to drain (``Fleet.drain_listeners``) if a member of its generation is
left. Reported per L, as ratios to one bare strict update cycle measured in the same run:

* frontier: from the update's request to the new generation being served (strict: the
  publish, after a drain that waits for the straggler, admissions closed all along;
  rolling: the first wave's publish, admissions open all along);
* rolling total: the whole rolling update. The last member on generation 1 has to wait
  for a rollout of generation 1 still running (one rollout, one policy: it cannot move
  forward), so this part grows with L while the fleet serves generation 2 elsewhere.

Goal (issue 24): rolling's frontier within a small constant number of cycles,
independent of L; strict's grows with L. Every straggler's tokens are checked against
the greedy reference of its generation; every journal must pass the fleet trace
checker.

Usage: .venv/bin/python benchmarks/bench_straggler.py [--lengths 256,1024,4096]
       [--token-ms 1.0] [--json]"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rolloutcore.adapters.sim import SimAdapter, SimEngine, reference_tokens, sim_target
from rolloutcore.check.fleet_trace import check_fleet_file
from rolloutcore.engine.runner import RunnerPolicy
from rolloutcore.fleet import Fleet, FleetError, Lease

NAMES = ("a", "b", "c")
PROMPT = (5, 3, 8, 1, 9)
CHUNK = 16
POLICY = RunnerPolicy(step_timeout_s=600.0, pause_timeout_s=600.0, drain_timeout_s=600.0,
                      mutation_base_s=600.0, retry_backoff_s=0.0)


def ckpt(g: int) -> str:
    return f"ckpt-{g}"


def make_fleet(tmp: Path, name: str, token_s: float, rolling: bool
               ) -> tuple[Fleet, dict[str, SimEngine]]:
    engines = {n: SimEngine(ckpt(1), token_seconds=token_s, label="rc-1") for n in NAMES}
    fleet = Fleet([(n, SimAdapter(e), None) for n, e in engines.items()],
                  journal=tmp / f"{name}.jsonl", min_serving=2, policy=POLICY, fsync=False,
                  max_live=2 if rolling else 1, min_admitting=2 if rolling else 0)
    fleet.bootstrap(sim_target(1, ckpt(1)))
    return fleet, engines


class Straggler:
    """One rollout generated chunk by chunk; moved when its member drains (if it can)."""

    def __init__(self, fleet: Fleet, engines: dict[str, SimEngine], n: int) -> None:
        self.fleet, self.engines, self.n = fleet, engines, n
        self.lease: Lease = fleet.admit("straggler")
        self.tokens: list[int] = []
        self.moves = 0
        self.draining = threading.Event()
        fleet.drain_listeners.append(self._on_drain)
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _on_drain(self, member: str) -> None:
        if member == self.lease.engine:
            self.draining.set()

    def _run(self) -> None:
        while len(self.tokens) < self.n:
            if self.draining.is_set():
                self.draining.clear()
                try:
                    self.lease = self.fleet.migrate(self.lease)
                    self.moves += 1
                except FleetError:
                    pass  # nowhere to go: it ends where it is, the drain waits for it
            k = min(CHUNK, self.n - len(self.tokens))
            out = self.engines[self.lease.engine].generate((*PROMPT, *self.tokens), k)
            self.tokens.extend(out.tokens)
            if len(self.tokens) >= self.n // 4:
                self.started.set()
        self.fleet.release(self.lease)

    def ok(self) -> bool:
        return tuple(self.tokens) == reference_tokens(ckpt(self.lease.generation), PROMPT,
                                                      self.n)


def one(tmp: Path, name: str, token_s: float, n: int | None, rolling: bool
        ) -> dict[str, Any]:
    fleet, engines = make_fleet(tmp, name, token_s, rolling)
    try:
        s = Straggler(fleet, engines, n) if n else None
        if s is not None:
            s.thread.start()
            s.started.wait()
        frontier: list[float] = []

        def watch() -> None:  # the moment generation 2 is served (1 ms resolution)
            while fleet.committed < 2:
                time.sleep(0.001)
            frontier.append(time.perf_counter())

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        t0 = time.perf_counter()
        rep = fleet.update(sim_target(2, ckpt(2)))
        seconds = time.perf_counter() - t0
        watcher.join()
        if s is not None:
            s.thread.join()
        assert rep.published, rep.as_json()
    finally:
        fleet.close()
    verdict = check_fleet_file(tmp / f"{name}.jsonl")
    assert verdict.accepted, verdict.message
    return {"seconds": seconds, "frontier_s": frontier[0] - t0,
            "moves": s.moves if s else 0, "tokens_ok": s.ok() if s else True}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--lengths", default="256,1024,4096",
                    help="straggler lengths in tokens, comma-separated")
    ap.add_argument("--token-ms", type=float, default=1.0, help="simulated decode step (ms)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        ap.error(f"--lengths: integers, comma-separated, got {args.lengths!r}")
    if not lengths or min(lengths) < 4 * CHUNK or args.token_ms <= 0:
        ap.error(f"--lengths must each be >= {4 * CHUNK} and --token-ms > 0")
    token_s = args.token_ms / 1e3
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-straggler-") as d:
        tmp = Path(d)
        bare = {mode: one(tmp, f"bare-{mode}", token_s, None, mode == "rolling")["seconds"]
                for mode in ("strict", "rolling")}
        for n in lengths:
            strict = one(tmp, f"strict-{n}", token_s, n, False)
            rolling = one(tmp, f"rolling-{n}", token_s, n, True)
            cycle = bare["strict"]
            rows.append({"tokens": n, "generation_s": n * token_s,
                         "strict_frontier_s": strict["frontier_s"],
                         "rolling_frontier_s": rolling["frontier_s"],
                         "rolling_total_s": rolling["seconds"],
                         "strict_frontier_vs_cycle": strict["frontier_s"] / cycle,
                         "rolling_frontier_vs_cycle": rolling["frontier_s"] / cycle,
                         "rolling_total_vs_cycle": rolling["seconds"] / cycle,
                         "moves": rolling["moves"],
                         "tokens_ok": strict["tokens_ok"] and rolling["tokens_ok"]})
    out = {"token_ms": args.token_ms, "bare_cycle_s": bare, "rows": rows,
           "all_tokens_ok": all(r["tokens_ok"] for r in rows)}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"one straggler, three simulated engines, {args.token_ms:g} ms per token; ratios "
          f"to one bare strict cycle ({bare['strict'] * 1e3:.1f} ms; a bare rolling "
          f"update of all three: {bare['rolling'] * 1e3:.1f} ms)")
    print(f"  {'tokens':>7} {'strict frontier':>16} {'rolling frontier':>17} "
          f"{'rolling total':>14} {'moves':>6} tokens   (x one cycle)")
    for r in rows:
        print(f"  {r['tokens']:>7} {r['strict_frontier_vs_cycle']:>16.1f} "
              f"{r['rolling_frontier_vs_cycle']:>17.1f} {r['rolling_total_vs_cycle']:>14.1f} "
              f"{r['moves']:>6} {'ok' if r['tokens_ok'] else 'WRONG'}")
    return 0 if out["all_tokens_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
