"""Controller hot path: admit+release pairs per second with trace records on, 1 and 8
threads, against a bare Lock+dict (the floor) and one transitions LockedMachine trigger
per admission, all in one run.
Usage: .venv/bin/python benchmarks/bench_controller.py [--json]"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from transitions.extensions import LockedMachine

from rolloutcore.engine.controller import Controller, TraceBuffer

N = 200_000


def _rate(pair: Callable[[str], None], threads: int, n: int = N) -> float:
    ids = [[f"t{t}-{i}" for i in range(n // threads)] for t in range(threads)]

    def run(chunk: list[str]) -> None:
        for rid in chunk:
            pair(rid)

    workers = [threading.Thread(target=run, args=(c,)) for c in ids]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return (n // threads) * threads / (time.perf_counter() - t0)


def controller_pair() -> Callable[[str], None]:
    c = Controller(trace=TraceBuffer().emit)
    c.fire("bootstrap_begin")
    c.fire("bootstrap_ok")

    def pair(rid: str) -> None:
        c.admit(rid)
        c.release(rid)

    return pair


def floor_pair() -> Callable[[str], None]:
    lock = threading.Lock()
    bound: dict[str, int] = {}
    trace: list[str] = []

    def pair(rid: str) -> None:
        with lock:
            bound[rid] = 1
            trace.append(rid)
        with lock:
            del bound[rid]
            trace.append(rid)

    return pair


def machine_pair() -> Callable[[str], None]:
    class M:
        state: str

    m = M()
    machine = LockedMachine(model=m, states=["READY"], initial="READY", auto_transitions=False)
    machine.add_transition("admit", "READY", None)
    machine.add_transition("release", "READY", None)
    bound: dict[str, int] = {}

    def pair(rid: str) -> None:
        m.admit()  # type: ignore[attr-defined]
        bound[rid] = 1
        m.release()  # type: ignore[attr-defined]
        del bound[rid]

    return pair


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for name, make in (("controller", controller_pair), ("Lock+dict floor", floor_pair),
                       ("LockedMachine trigger", machine_pair)):
        for threads in (1, 8):
            n = N if name != "LockedMachine trigger" else N // 10
            rows.append((name, threads, _rate(make(), threads, n)))
    ctl1, ctl8 = rows[0][2], rows[1][2]
    if args.json:
        out: dict[str, Any] = {
            "pairs_per_s": [{"variant": v, "threads": t, "rate": r, "vs_controller": r / ctl1}
                            for v, t, r in rows],
            "controller_8_over_1_thread": ctl8 / ctl1, "goal_pairs_per_s": 100_000,
            "goal_met": ctl1 >= 100_000}
        print(json.dumps(out, indent=2))
        return 0
    print(f"{'variant':24s} {'threads':>7s} {'pairs/s':>12s} {'vs controller':>14s}")
    for name, threads, rate in rows:
        print(f"{name:24s} {threads:7d} {rate:12,.0f} {rate / ctl1:14.2f}")
    print(f"controller 8 threads / 1 thread: {ctl8 / ctl1:.2f} (no collapse if close to 1)")
    print(f"goal >= 100,000 pairs/s on one thread: measured {ctl1:,.0f}: "
          f"{'met' if ctl1 >= 100_000 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
