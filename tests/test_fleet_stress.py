"""One lock discipline for fleet, member controllers and bindings (rolloutcore/fleet's
header), under stress: admissions and releases, status reads, audits, reports of an
unreachable engine (each a suspicion and a background audit) and updates from many
threads at once with a tiny thread switch interval, on a strict and on a rolling
simulated fleet. Zero errors, and the fleet journal passes the fleet checker (no member
step lands inside a publish group, no fleet step is taken on a state read twice)."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from rolloutcore.adapters.sim import SimAdapter, SimEngine, sim_target
from rolloutcore.check.fleet_trace import check_fleet_file
from rolloutcore.engine.controller import AdmissionTimeout, IllegalTransition
from rolloutcore.engine.runner import DrainPolicy, RunnerPolicy
from rolloutcore.fleet import Fleet, FleetError

NAMES = ("a", "b", "c")
PAIRS = 30_000  # admit/release pairs (the race this guards was seen about once per 1,100)
POLICY = RunnerPolicy(step_timeout_s=30, pause_timeout_s=30, fence_timeout_s=30, retries=2,
                      retry_backoff_s=0.0, drain_timeout_s=30,
                      drain_policy=DrainPolicy.WAIT_THEN_ABORT, abort_after_s=0.05,
                      mutation_base_s=30, mutation_floor_bytes_per_s=1e12)


@pytest.fixture
def tiny_switch_interval() -> Iterator[None]:
    """Threads switch every 10 microseconds: races that need a switch between two
    bytecodes happen within a few thousand operations (the interval is a cause the test
    sets, not the machine's speed)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _fleet(tmp: Path, mode: str) -> Fleet:
    adapters = {n: SimAdapter(SimEngine("ckpt-1", label="v1")) for n in NAMES}
    rolling = {"max_live": 2, "min_admitting": 1} if mode == "rolling" else {}
    fleet = Fleet([(n, a, None) for n, a in adapters.items()], journal=tmp / "f.jsonl",
                  min_serving=2, policy=POLICY, fsync=False, **rolling)
    fleet.bootstrap(sim_target(1, "ckpt-1", label="v1"))
    return fleet


#: One unreachable report per this many rollouts done (paced by the count, not a clock).
REPORT_EVERY = 400


@pytest.mark.parametrize("mode", ("strict", pytest.param("rolling", marks=pytest.mark.deep)))
def test_many_threads_admit_release_read_audit_report_and_update(
        tmp_path: Path, tiny_switch_interval: None, mode: str) -> None:
    fleet = _fleet(tmp_path, mode)
    errors: Counter[str] = Counter()
    done = Counter[str]()
    stop = threading.Event()

    def guarded(kind: str, fn: object) -> None:
        assert callable(fn)
        while not stop.is_set():
            try:
                fn()
                done[kind] += 1
            except (AdmissionTimeout, IllegalTransition):
                done[f"{kind} refused"] += 1  # closed for an update: the spec's answer
            except Exception as e:  # a race: counted, the test fails on any
                errors[f"{kind}: {type(e).__name__}: {e}"] += 1

    def rollouts(worker: int) -> None:
        n = 0

        def one() -> None:
            nonlocal n
            n += 1
            lease = fleet.admit(f"w{worker}-{n}", wait=5.0)
            fleet.release(lease)
        guarded("admit+release", one)

    def status() -> None:
        fleet.status()

    def audit() -> None:
        fleet.audit()

    def report() -> None:
        # A client's request failed to connect: the member is suspected and audited in
        # the background (it serves again once that audit passes).
        while not stop.is_set() and done["admit+release"] < REPORT_EVERY * (
                done["report"] + 1):
            stop.wait(0.005)
        if stop.is_set():
            return
        lease = fleet.admit(f"rep-{done['report']}", wait=5.0)
        try:
            fleet.report_unreachable(lease, "connection refused (the test's report)")
        finally:
            fleet.release(lease)

    updates = iter(range(2, 6))

    def update() -> None:
        g = next(updates, None)
        # Each update waits for its share of the load: updates interleave with it, paced
        # by the count of rollouts done, not by a clock.
        while not stop.is_set() and done["admit+release"] < PAIRS // 5 * ((g or 6) - 1):
            stop.wait(0.01)
        if g is None or stop.is_set():
            return
        while not stop.is_set():
            try:  # suspicions may leave fewer than min_serving serving for a moment
                rep = fleet.update(sim_target(g, f"ckpt-{g}", label=f"v{g}"))
            except FleetError:
                done["update refused"] += 1
                stop.wait(0.01)
                continue
            if rep.published:
                return
            # Suspicions left too few serving for the wave (the spec's abort, rolled back
            # by verified re-admission): once their audits pass, the next attempt.
            assert rep.aborted, rep.as_json()
            done["update aborted"] += 1

    threads = [threading.Thread(target=rollouts, args=(i,)) for i in range(6)]
    threads += [threading.Thread(target=guarded, args=(k, f)) for k, f in (
        ("status", status), ("status", status), ("audit", audit), ("report", report),
        ("update", update))]
    for t in threads:
        t.start()
    # Stop once PAIRS rollouts were done, four updates published among them and the
    # reports caught up with the rollouts (a report waits for its share of them, and may
    # lag behind by more than one when the threads it waits on run ahead): the counts,
    # not a clock, end the test.
    while (done["update"] < 4 or done["admit+release"] < PAIRS
           or done["report"] < PAIRS // REPORT_EVERY - 1) and not errors:
        stop.wait(0.05)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    fleet.close()
    print(f"\n{dict(done)}")
    assert not errors, errors.most_common(5)
    assert done["admit+release"] >= PAIRS and done["status"] > 100 and done["audit"] > 1
    assert done["report"] >= PAIRS // REPORT_EVERY - 1
    assert fleet.committed == 5
    v = check_fleet_file(tmp_path / "f.jsonl")
    assert v.accepted, v.message
