"""A fleet that never wedges: a member's engine process killed at each step of an update,
in a strict and in a rolling fleet of three simulated engines.

Whatever step the kill meets, the member's cycle ends in a phase the fleet can decide on
(a pause and the resume after it that both fail give up: TAINTED), the fleet decides
(publishes on the others, or rolls on), admissions reopen, and the journal passes the
fleet checker. Killed "while draining" means: the member drains for the update with a
rollout of its own still bound when its process dies, and the client lets go of the
rollout after (its request failed).

The kill is caused by the test (the simulated adapter refuses every call from the moment
the step's first call arrives: connection refused, as from a dead process); every wait is
bounded by :data:`BOUND`, a bound against a broken test, never a measurement.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from rolloutcore.adapters.sim import SimAdapter, SimEngine, sim_target
from rolloutcore.check.fleet_trace import check_fleet_file
from rolloutcore.engine.runner import RunnerPolicy
from rolloutcore.fleet import Fleet
from rolloutcore.spec.fleet import FleetPhase
from rolloutcore.spec.lifecycle import Phase

BOUND = 30.0
#: Where the member's process dies: as the drain waits for its rollout, or as the named
#: call of its cycle arrives (in cycle order; ``read_state`` is the validation's read).
KILL_POINTS = ("drain", "pause", "mutate", "reset_prefix", "reset_encoder", "reset_mm",
               "read_state", "resume", "probe")
POLICY = RunnerPolicy(step_timeout_s=BOUND, pause_timeout_s=BOUND, fence_timeout_s=BOUND,
                      retries=2, retry_backoff_s=0.0, drain_timeout_s=BOUND,
                      mutation_base_s=BOUND, mutation_floor_bytes_per_s=1e12)
NAMES = ("a", "b", "c")


def target(g: int):  # type: ignore[no-untyped-def]
    return sim_target(g, f"ckpt-{g}", label=f"rc-{g}")


def fleet_of(tmp: Path, mode: str) -> tuple[Fleet, dict[str, SimAdapter]]:
    adapters = {n: SimAdapter(SimEngine("ckpt-1", label="rc-1")) for n in NAMES}
    rolling = {"max_live": 2, "min_admitting": 1} if mode == "rolling" else {}
    fleet = Fleet([(n, a, None) for n, a in adapters.items()], journal=tmp / "f.jsonl",
                  min_serving=2, policy=POLICY, fsync=False, **rolling)
    fleet.bootstrap(target(1))
    assert fleet.phase == FleetPhase.READY
    return fleet, adapters


#: Who dies: in a strict update any member (a); in a rolling one (waves of two: a and b,
#: then c catches up) a member of the wave, or the one catching up after it.
CASES = [("strict", "a", at) for at in KILL_POINTS] + [
    ("rolling", who, at) for who in ("a", "c") for at in KILL_POINTS]


@pytest.mark.parametrize(("mode", "who", "at"), CASES,
                         ids=[f"{m}-{w}-{at}" for m, w, at in CASES])
def test_a_member_killed_at_any_step_ends_in_a_decision(tmp_path: Path, mode: str, who: str,
                                                        at: str) -> None:
    fleet, adapters = fleet_of(tmp_path, mode)
    victim = adapters[who]
    if at == "drain":  # a rollout on every member (so the waves are a, b, then c); the
        leases = {x.engine: x for x in (fleet.admit(f"r{k}") for k in range(len(NAMES)))}
        assert set(leases) == set(NAMES)  # victim drains with its own still bound

        def on_drain(name: str) -> None:
            if name == who:
                victim.kill_process()  # only signals (the listener's contract)

        fleet.drain_listeners.append(on_drain)
        for name, lease in leases.items():  # the others' requests end at once
            if name != who:
                fleet.release(lease)

        def let_go() -> None:  # the victim's request failed: its client lets it go
            deadline = time.monotonic() + BOUND
            while victim.killed_at is None and time.monotonic() < deadline:
                time.sleep(0.001)
            fleet.release(leases[who])

        threading.Thread(target=let_go, daemon=True).start()
    else:
        victim.kill_at = at
    t0 = time.perf_counter()
    report = fleet.update(target(2))
    decided = time.perf_counter()
    assert victim.killed_at is not None, "the kill never happened"
    print(f"{mode:<8} {who} killed at {at:<14} decision {decided - victim.killed_at:.3f} s "
          f"after the kill; published on {report.committed_on}, quarantined "
          f"{report.quarantined}")
    # the decision: the victim quarantined, the generation published on the others
    assert decided - t0 < BOUND
    assert report.published and who in report.quarantined, report.as_json()
    assert fleet.members[who].controller.phase is Phase.TAINTED
    assert fleet.phase == FleetPhase.READY and fleet.committed == 2
    serving = {s.name for s in fleet.status() if s.serving}
    assert serving == set(NAMES) - {who}, fleet.status()
    if mode == "rolling":
        assert fleet.floor == 2  # nobody serves, or holds rollouts of, generation 1
    # admissions are open, on the others only
    lease = fleet.admit("after", wait=BOUND)
    assert lease.engine != who and lease.generation == 2
    fleet.release(lease)
    fleet.close()
    verdict = check_fleet_file(tmp_path / "f.jsonl")
    assert verdict.accepted, verdict.message


def test_the_killed_member_is_readmitted_once_its_process_is_back(tmp_path: Path) -> None:
    """After the decision, the member's process is restarted (on the committed weights of
    generation 1, as its launcher would): a verified re-admission, then its catch-up to
    generation 2, and it serves again."""
    fleet, adapters = fleet_of(tmp_path, "strict")
    adapters["a"].kill_at = "pause"
    report = fleet.update(target(2))
    assert report.published and report.quarantined == ["a"]
    adapters["a"].reconnect(SimEngine("ckpt-1", label="rc-1"))
    out = fleet.readmit("a", who="test")
    assert out.trigger == "readmit_ok", out
    assert {s.name for s in fleet.status() if s.serving} == set(NAMES)
    fleet.close()
    assert check_fleet_file(tmp_path / "f.jsonl").accepted
