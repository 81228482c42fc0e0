"""Rolling waves, migration, quarantine and re-admission: a model-vs-implementation machine
(Hypothesis) over simulated fleets of 3 to 5 members with their own K and C.

The model is a few lines of plain state (the frontier, the floor, each member's generation
and whether it is quarantined, the rollouts the application holds); every rule acts on the
real :class:`~rolloutcore.fleet.Fleet` and checks it against the model, and every rollout
is checked on the engine that serves it (its tokens are the reference of its own
generation's checkpoint). A rolling update runs on a thread while the machine plays the
application: it migrates or releases each rollout a draining member holds, and checks at
every look that the fleet keeps C members serving and at most K generations live. Every
example's journal must pass the fleet trace checker. Each example tells its run as a story
(printed on failure with the shrunk counterexample)."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from rolloutcore.adapters.sim import SimAdapter, SimEngine, reference_tokens, sim_target
from rolloutcore.check.fleet_trace import check_fleet_file
from rolloutcore.engine.controller import AdmissionTimeout
from rolloutcore.engine.runner import RunnerPolicy
from rolloutcore.fleet import Fleet, FleetCycleReport, FleetError, Lease, MigrationLost
from rolloutcore.spec.fleet import FleetPhase
from rolloutcore.spec.lifecycle import Phase
from rolloutcore.spec.triggers import Trigger

#: Generous deadlines: every wait is on a rollout the machine itself holds.
POLICY = RunnerPolicy(step_timeout_s=30.0, pause_timeout_s=30.0, fence_timeout_s=30.0,
                      drain_timeout_s=30.0, retries=1, retry_backoff_s=0.0)
PROMPT = (3, 1, 4, 1, 5, 9, 2, 6)
BOUND = 60.0  # far above any roll here: only a wedged fleet reaches it


def ckpt(g: int) -> str:
    return f"ckpt-{g}"


class RollingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory(prefix="rc-rolling-")
        self.path = Path(self.tmp.name) / "f.jsonl"
        self.fleet: Fleet | None = None
        self.adapters: dict[str, SimAdapter] = {}
        self.n = 0
        # ---- the model
        self.k = self.c = self.min_serving = 0
        self.frontier = self.floor = 1
        self.gen: dict[str, int] = {}
        self.quarantined: set[str] = set()
        self.held: dict[str, Lease] = {}
        self.aborted: dict[str, Lease] = {}  # released as aborted by an audit, not let go
        self.closed = False  # the fleet closed for lack of a quorum

    def say(self, line: str) -> None:
        if currently_in_test_context():
            note(line)

    @property
    def f(self) -> Fleet:
        assert self.fleet is not None
        return self.fleet

    def serving(self) -> list[str]:
        return sorted(n for n in self.adapters if n not in self.quarantined
                      and self.floor <= self.gen[n] <= self.frontier)

    # ------------------------------------------------------------------- set-up

    @initialize(size=st.integers(3, 5), data=st.data())
    def start(self, size: int, data: st.DataObject) -> None:
        self.k = data.draw(st.integers(2, min(3, size)), label="K")
        self.c = data.draw(st.integers(0, size - 2), label="C")
        self.min_serving = data.draw(st.integers(1, size - 1), label="min_serving")
        names = [f"e{i}" for i in range(size)]
        self.adapters = {n: SimAdapter(SimEngine(ckpt(1), label="rc-1")) for n in names}
        self.fleet = Fleet([(n, a, None) for n, a in self.adapters.items()], journal=self.path,
                           min_serving=self.min_serving, policy=POLICY, fsync=False,
                           max_live=self.k, min_admitting=self.c)
        self.f.bootstrap(sim_target(1, ckpt(1)))
        self.gen = dict.fromkeys(names, 1)
        self.say(f"fleet of {size}: K {self.k}, C {self.c}, min_serving {self.min_serving}")

    def teardown(self) -> None:
        if self.fleet is not None:
            try:
                verdict = check_fleet_file(self.path)
                assert verdict.accepted, verdict
            finally:
                self.fleet.close()
        self.tmp.cleanup()

    # ------------------------------------------------------------------ rollouts

    def _check_served(self, lease: Lease) -> None:
        out = self.adapters[lease.engine].generate(PROMPT, 4)
        assert out.tokens == reference_tokens(ckpt(lease.generation), PROMPT, 4), (
            f"{lease.engine} does not serve generation {lease.generation}")

    @precondition(lambda self: not self.closed and len(self.held) < 4)
    @rule(data=st.data())
    def admit_and_hold(self, data: st.DataObject) -> None:
        min_gen = data.draw(st.integers(self.floor, self.frontier), label="min_generation")
        self.n += 1
        rid = f"r{self.n}"
        lease = self.f.admit(rid, min_generation=min_gen)
        self.say(f"admit {rid} (min generation {min_gen}) -> {lease.engine} on generation "
                 f"{lease.generation}")
        assert lease.engine in self.serving()
        assert min_gen <= lease.generation == self.gen[lease.engine] <= self.frontier
        self._check_served(lease)
        self.held[rid] = lease

    @precondition(lambda self: bool(self.held or self.aborted))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted({**self.held, **self.aborted})), label="rollout")
        aborted = rid in self.aborted
        lease = (self.aborted if aborted else self.held).pop(rid)
        self.say(f"release {rid} on {lease.engine}{' (aborted)' if aborted else ''}")
        binding = self.f.release(lease)
        assert binding.generation == lease.generation and binding.aborted is aborted

    @precondition(lambda self: self.closed)
    @rule()
    def closed_fleet_admits_nothing(self) -> None:
        self.say("the fleet is closed: an admission is refused")
        with pytest.raises(AdmissionTimeout):
            self.f.admit("refused")

    # ------------------------------------------------------------ rolling update

    def _wave_possible(self) -> bool:
        serving = self.serving()
        return (not self.closed and self.frontier + 1 - self.floor < self.k
                and len(serving) >= self.min_serving and len(serving) - self.c > 0)

    # A roll only while nobody is quarantined: a member re-admitted after missing a roll
    # comes back on its own generation, below the floor, and how the next rolls catch it
    # up is the runtime's choice, not the spec's (this model does not predict it).
    @precondition(lambda self: not self.closed and not self.quarantined)
    @rule(data=st.data())
    def roll(self, data: st.DataObject) -> None:
        new = self.frontier + 1
        possible = self._wave_possible()
        self.say(f"roll to generation {new} ({'a wave can leave' if possible else 'no wave'}"
                 f"; holding {sorted(self.held)})")
        box: list[Any] = []

        def run() -> None:
            try:
                box.append(self.f.update(sim_target(new, ckpt(new))))
            except BaseException as e:  # surfaced below
                box.append(e)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        give_up = time.monotonic() + BOUND
        while worker.is_alive():
            self._look_while_rolling()
            if not self._play_the_application(data):
                worker.join(0.005)
            assert time.monotonic() < give_up, "the roll wedged"
        result = box[0]
        if not possible:
            assert isinstance(result, FleetError), result
            self.say(f"  refused: {result}")
            return
        assert isinstance(result, FleetCycleReport), result
        self.say(f"  -> published {result.published}, on {result.committed_on}")
        assert result.published and self.f.committed == new
        self.frontier = new
        for n in self.adapters:
            if n not in self.quarantined:
                self.gen[n] = new  # the wave and every member behind caught up
        assert self.f.floor == new  # nobody serves or holds a rollout below the frontier
        self.floor = new

    def _look_while_rolling(self) -> None:
        """What holds at every look during a roll: C members keep serving (no member
        fails here), and at most K generations are served."""
        status = self.f.status()
        serving = [s for s in status if s.serving]
        assert len(serving) >= min(self.c, len(self.serving())), status
        assert len({s.committed for s in serving}) <= self.k, status

    def _play_the_application(self, data: st.DataObject) -> bool:
        """Each rollout held on a draining member migrates (where a member serves its
        generation) or is released; the machine draws which. True if one moved."""
        for rid, lease in sorted(self.held.items()):
            m = self.f.members[lease.engine]
            if m.controller.phase is not Phase.DRAINING:
                continue
            if data.draw(st.booleans(), label=f"migrate {rid}"):
                try:
                    new = self.f.migrate(lease)
                except MigrationLost:
                    self.say(f"  {rid}: lost in the move (released as aborted)")
                    del self.held[rid]
                    return True
                except FleetError as e:
                    self.say(f"  {rid} cannot move ({e}): released")
                else:
                    self.say(f"  {rid} migrates {lease.engine} -> {new.engine} "
                             f"(generation {new.generation})")
                    assert new.generation == lease.generation and new.engine != lease.engine
                    self._check_served(new)
                    self.held[rid] = new
                    return True
            else:
                self.say(f"  {rid} released on draining {lease.engine}")
            self.f.release(self.held.pop(rid))
            return True
        return False

    # ---------------------------------------------------- quarantine, re-admission

    @precondition(lambda self: not self.closed and len(self.serving()) > 0)
    @rule(data=st.data())
    def replaced_behind_the_fleet_then_audited(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(self.serving()), label="member")
        self.say(f"{name}'s engine is replaced with other weights; an audit round")
        self.adapters[name].reconnect(SimEngine("garbage", label=f"rc-{self.gen[name]}"))
        out = self.f.audit()
        assert out[name].trigger == Trigger.AUDIT_MISMATCH, out
        assert all(o.trigger == Trigger.AUDIT_OK for n, o in out.items() if n != name), out
        self.quarantined.add(name)
        for rid, lease in list(self.held.items()):
            if lease.engine == name:
                self.aborted[rid] = self.held.pop(rid)
        if len(self.serving()) < self.min_serving:
            self.closed = True
        assert (self.f.phase == FleetPhase.ABORTING) is self.closed, self.f.phase

    @precondition(lambda self: bool(self.quarantined))
    @rule(data=st.data())
    def readmit(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.quarantined)), label="member")
        self.say(f"readmit {name} (fleet frontier {self.frontier}, floor {self.floor})")
        self.adapters[name].reconnect(SimEngine(ckpt(self.gen[name]),
                                                label=f"rc-{self.gen[name]}"))
        out = self.f.readmit(name, who="operator")
        self.say(f"  -> {out.trigger}, on generation "
                 f"{self.f.members[name].controller.control.committed}")
        assert out.trigger == Trigger.READMIT_OK, out
        self.quarantined.discard(name)
        self.gen[name] = self.f.members[name].controller.control.committed
        assert self.gen[name] == self.frontier  # (no roll ran while it was out)
        if self.closed and len(self.serving()) >= self.min_serving:
            self.closed = False
        assert (self.f.phase == FleetPhase.READY) is not self.closed, self.f.phase

    # ---------------------------------------------------------------- invariants

    @invariant()
    def fleet_agrees_with_the_model(self) -> None:
        if self.fleet is None:
            return
        assert (self.f.committed, self.f.floor) == (self.frontier, self.floor)
        for s in self.f.status():
            assert s.serving is (s.name in self.serving()), (s, self.serving())
            assert s.quarantined is (s.name in self.quarantined), s


_SETTINGS: dict[str, Any] = {
    "stateful_step_count": 12, "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}

#: make check's size; make test runs the deeper search below too.
TestRollingFleet = RollingMachine.TestCase
TestRollingFleet.settings = settings(max_examples=10, **_SETTINGS)


@pytest.mark.deep
class TestRollingFleetDeep(RollingMachine.TestCase):
    settings = settings(max_examples=60, **_SETTINGS)
