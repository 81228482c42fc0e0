"""Runner + controller + simulated engine: faults at every step, the journal always
passes the trace checker, and no rollout ever crosses a mutation."""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import LATE_S
from hypothesis import HealthCheck, currently_in_test_context, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rolloutcore.adapters.contract import PauseMode
from rolloutcore.adapters.sim import (
    FaultPlan,
    SimAdapter,
    SimEngine,
    reference_tokens,
    sim_identity,
    sim_target,
)
from rolloutcore.check.trace import check_file
from rolloutcore.engine.controller import Controller, IllegalTransition, TraceRecord
from rolloutcore.engine.runner import (
    CycleReport,
    DrainPolicy,
    LifecycleRunner,
    RunnerPolicy,
    call_with_deadline,
    taint_label,
)
from rolloutcore.engine.simulate import simulate
from rolloutcore.journal import Journal, open_controller, read_journal
from rolloutcore.spec.lifecycle import Phase, Result
from rolloutcore.spec.triggers import OUTCOMES, Op, Trigger

#: A hang holds a call to its step's deadline (0.5 s); an instant failure leaves the step
#: its whole deadline for the retries.
FAST = RunnerPolicy(step_timeout_s=0.5, pause_timeout_s=0.5, retries=2, retry_backoff_s=0.0,
                    drain_timeout_s=5, mutation_base_s=0.3, mutation_floor_bytes_per_s=1e12)

#: (operation, fault) -> the phase the cycle must end in, and whether it publishes.
FAULT_MATRIX: dict[tuple[str, str], tuple[Phase, bool]] = {
    ("pause", "timeout"): (Phase.READY, True),  # retried
    ("pause", "connection_error"): (Phase.READY, True),
    ("pause", "http_500"): (Phase.READY, True),
    ("pause", "fail_body"): (Phase.READY, True),
    # A hang holds the call to the step's one deadline: the step has failed, no time is
    # left to retry it. Before the mutation that cancels the update (the engine is
    # resumed); after it, the controller fails closed.
    ("pause", "hang"): (Phase.READY, False),
    ("mutate", "timeout"): (Phase.TAINTED, False),
    ("mutate", "connection_error"): (Phase.TAINTED, False),
    ("mutate", "http_500"): (Phase.TAINTED, False),
    ("mutate", "hang"): (Phase.TAINTED, False),
    ("mutate", "die_halfway"): (Phase.TAINTED, False),
    ("mutate", "wrong_weights"): (Phase.TAINTED, False),
    ("mutate", "unlabelled"): (Phase.TAINTED, False),
    ("mutate", "broken"): (Phase.TAINTED, False),
    ("mutate", "refuse"): (Phase.READY, False),  # proof of no mutation: old gen resumes
    ("reset_prefix", "fail_body"): (Phase.READY, True),
    ("reset_prefix", "empty_body"): (Phase.READY, True),
    ("reset_prefix", "http_500"): (Phase.READY, True),
    ("reset_prefix", "timeout"): (Phase.READY, True),
    ("reset_encoder", "empty_body"): (Phase.READY, True),
    ("reset_encoder", "connection_error"): (Phase.READY, True),
    ("reset_mm", "hang"): (Phase.TAINTED, False),
    ("reset_mm", "http_500"): (Phase.READY, True),
    ("read_state", "timeout"): (Phase.READY, True),
    ("read_state", "empty_body"): (Phase.READY, True),
    ("read_state", "wrong_label"): (Phase.TAINTED, False),
    ("read_state", "http_500"): (Phase.READY, True),
    ("resume", "fail_body"): (Phase.READY, True),
    ("resume", "connection_error"): (Phase.READY, True),
    ("resume", "hang"): (Phase.TAINTED, False),
    ("probe", "http_500"): (Phase.READY, True),
    ("probe", "timeout"): (Phase.READY, True),
}


def _runner(tmp_path: Path, faults: FaultPlan | None = None) -> tuple[LifecycleRunner, SimAdapter]:
    engine = SimEngine("ckpt-1", label="rc-1")
    adapter = SimAdapter(engine, faults, hang_seconds=5)
    runner = LifecycleRunner(Controller(trace=Journal(tmp_path / "j.jsonl", fsync=False)),
                             adapter, FAST)
    assert runner.bootstrap(sim_target(1, "ckpt-1")).trigger == "bootstrap_ok"
    return runner, adapter


@pytest.mark.parametrize(("op", "fault"), sorted(FAULT_MATRIX), ids=lambda x: str(x))
def test_fault_at_every_step(tmp_path: Path, op: str, fault: str) -> None:
    runner, adapter = _runner(tmp_path)
    adapter.faults = FaultPlan({op: [fault]})
    report = runner.update(sim_target(2, "ckpt-2"))
    adapter.release_hangs()
    phase, published = FAULT_MATRIX[(op, fault)]
    assert adapter.faults.injected == [(op, fault)]
    assert report.final_phase is phase and report.published is published, report.steps
    ctl = runner.controller
    engine = adapter.engine
    if phase is Phase.READY:
        held = "ckpt-2" if published else "ckpt-1"
        assert engine.weights == held and not engine.paused
        assert engine.label == f"rc-{ctl.control.committed}"
        assert set(engine.prefix.values()) <= {held}, "stale prefix KV in READY"
        _binding, out = runner.generate("after", (1, 2, 3, 4, 5, 6), 6)
        assert out.tokens == reference_tokens(held, (1, 2, 3, 4, 5, 6), 6)
    else:
        with pytest.raises(IllegalTransition):
            ctl.admit("nope")
        assert ctl.control.committed == 1
    verdict = check_file(tmp_path / "j.jsonl")
    assert verdict.accepted, verdict.message


def test_hung_collective_taints_within_deadline(tmp_path: Path) -> None:
    runner, adapter = _runner(tmp_path, FaultPlan({"mutate": ["hang"]}))
    report = runner.update(sim_target(2, "ckpt-2"))
    adapter.release_hangs()
    mutate = next(s for s in report.steps if s.step == "mutate")
    deadline = FAST.mutation_deadline(sim_target(2, "ckpt-2"))
    assert mutate.outcome == "mutate_ambiguous" and mutate.attempts == 1
    # The hang is released only after update() returned, so returning at all shows the
    # runner gave up on the call; when it did comes from the deadline, never earlier.
    assert deadline <= mutate.seconds < deadline + LATE_S
    assert report.stuck_calls and "mutate" in report.stuck_calls[0]


def test_drain_holds_a_live_rollout(tmp_path: Path) -> None:
    engine = SimEngine("ckpt-1", label="rc-1", token_seconds=0.002)
    buf_path = tmp_path / "j.jsonl"
    runner = LifecycleRunner(Controller(trace=Journal(buf_path, fsync=False)),
                             SimAdapter(engine), FAST)
    runner.bootstrap(sim_target(1, "ckpt-1"))
    prompt = (5, 4, 3, 2, 1, 9, 8, 7)
    started = threading.Event()
    out: dict[str, object] = {}

    def long_rollout() -> None:
        with runner.rollout("long") as binding:
            started.set()
            out["binding"] = binding
            out["result"] = engine.generate(prompt, 100)

    t = threading.Thread(target=long_rollout)
    t.start()
    started.wait()
    report = runner.update(sim_target(2, "ckpt-2"))
    t.join()
    assert report.published and report.drain_wait_s > 0.05
    result = out["result"]
    assert result.tokens == reference_tokens("ckpt-1", prompt, 100)  # type: ignore[attr-defined]
    steps = [json.loads(line).get("step") for line in buf_path.read_text().splitlines()]
    assert steps.index("release") < steps.index("mutate_begin")
    assert check_file(buf_path).accepted


def test_skipping_invalidation_really_reuses_stale_kv() -> None:
    """Negative control: the simulator reproduces the hazard the lifecycle prevents."""
    engine = SimEngine("ckpt-1")
    prompt = (1, 2, 3, 4, 5, 6, 7, 8)
    engine.generate(prompt, 4)
    engine.pause(PauseMode.WAIT)
    engine.load("ckpt-2")  # no invalidation
    engine.resume()
    hits = engine.prefix_hits
    stale = engine.generate(prompt, 8)
    assert engine.prefix_hits > hits
    assert stale.tokens != reference_tokens("ckpt-2", prompt, 8)
    assert engine.reset_prefix_cache()
    assert engine.generate(prompt, 8).tokens == reference_tokens("ckpt-2", prompt, 8)


def test_naive_resume_after_failed_load_kills_engine() -> None:
    """Negative control: resuming after a load that died halfway does not serve the old
    weights; the engine dies on the next generation (as the real server did)."""
    engine = SimEngine("ckpt-1")
    engine.pause(PauseMode.WAIT)
    with pytest.raises(RuntimeError):
        engine.load("ckpt-2", fail_halfway=True)
    engine.resume()
    with pytest.raises(RuntimeError, match="EngineCore"):
        engine.generate((1, 2, 3, 4), 4)


def test_keep_mode_makes_a_rollout_span_two_policies() -> None:
    engine = SimEngine("ckpt-1", token_seconds=0.002)
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.setdefault("r", engine.generate((1, 2, 3), 60)))
    t.start()
    while not (engine.running and engine.running[0].tokens):
        pass  # some tokens generated under ckpt-1
    engine.pause(PauseMode.KEEP)
    engine.load("ckpt-2")
    engine.resume()
    t.join()
    assert box["r"].extra["weights_seen"] == ["ckpt-1", "ckpt-2"]  # type: ignore[attr-defined]


def test_abort_mode_returns_partial_output() -> None:
    engine = SimEngine("ckpt-1", token_seconds=0.002)
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.setdefault("r", engine.generate((1, 2, 3), 200)))
    t.start()
    while not engine.running:
        pass
    engine.pause(PauseMode.ABORT)
    t.join()
    r = box["r"]
    assert r.finish_reason == "abort" and len(r.tokens) < 200  # type: ignore[attr-defined]


def test_reset_refused_while_blocks_in_use() -> None:
    engine = SimEngine("ckpt-1", token_seconds=0.002)
    t = threading.Thread(target=lambda: engine.generate((1, 2, 3, 4, 5), 40))
    t.start()
    while not engine.running:
        pass
    assert engine.reset_prefix_cache() is False
    t.join()
    assert engine.reset_prefix_cache() is True


def test_deadline_helper_returns_and_raises() -> None:
    assert call_with_deadline(lambda: 3, 1.0, "x") == 3
    with pytest.raises(ZeroDivisionError):
        call_with_deadline(lambda: 1 // 0, 1.0, "x")


def test_wrong_target_generation_rejected(tmp_path: Path) -> None:
    runner, _ = _runner(tmp_path)
    with pytest.raises(ValueError, match="not the next one"):
        runner.update(sim_target(3, "ckpt-3"))
    assert runner.controller.phase is Phase.READY


def test_stress_many_threads_zero_crossings(tmp_path: Path) -> None:
    result = simulate(12, journal=tmp_path / "stress.jsonl", workers=6, fsync=False)
    assert result.rollouts > 20 and result.crossings == 0 and result.mismatched == 0
    assert result.committed == 13 and result.final_phase == "READY"
    assert result.trace.accepted, result.trace.message


# ------------------------------------------------------------------ stateful, with faults

FAULTS = st.sampled_from(sorted(FAULT_MATRIX))
#: The stateful test's one step deadline: an injected hang costs exactly one of these, and
#: a step without a fault must never reach it, however loaded the machine (at 0.25 s a
#: CI run's crash rule saw a fault-free step time out, took another path and never
#: reached its crash point).
STEP_S = 1.0
TIGHT = RunnerPolicy(step_timeout_s=STEP_S, pause_timeout_s=STEP_S, fence_timeout_s=STEP_S,
                     retries=2, retry_backoff_s=0.0, drain_timeout_s=5,
                     mutation_base_s=STEP_S, mutation_floor_bytes_per_s=1e12)
#: With a rollout held by the test the drain cannot finish: these only bound how long the
#: runner waits for a release that never comes (the held rollout is the cause, not speed).
CANCELLING = replace(TIGHT, drain_timeout_s=0.05)
ABORTING = replace(TIGHT, drain_policy=DrainPolicy.WAIT_THEN_ABORT, abort_after_s=0.05)

#: (operation, fault) of a cycle from generation g to n = g + 1 that ends TAINTED -> the
#: weights the engine holds afterwards (``{old}``: ckpt-g, ``{new}``: ckpt-n) and whether
#: the engine died. A live engine is fenced: paused, relabelled ``tainted:rc-n``; a dead
#: one cannot be fenced and keeps its label and run state.
TAINTED_ENGINE: dict[tuple[str, str], tuple[str, bool]] = {
    ("mutate", "timeout"): ("{old}", False),  # the call failed before any byte moved
    ("mutate", "connection_error"): ("{old}", False),
    ("mutate", "http_500"): ("{old}", False),
    ("mutate", "hang"): ("{old}", False),  # the collective is stuck, it loads nothing
    ("mutate", "die_halfway"): ("mixed({old}+{new})", False),
    ("mutate", "wrong_weights"): ("some-other-checkpoint", False),
    ("mutate", "unlabelled"): ("{new}", False),
    ("mutate", "broken"): ("broken({new})", True),  # the first probe kills the engine
    ("reset_mm", "hang"): ("{new}", False),
    ("read_state", "wrong_label"): ("{new}", False),
    ("resume", "hang"): ("{new}", False),
}

#: The journalled steps of a fault-free update cycle with nothing bound, in order (a reset
#: step once for its three tiers); the crash rule dies before journalling one of them (at
#: its first occurrence).
CYCLE: tuple[Trigger, ...] = (
    Trigger.REQUEST_UPDATE, Trigger.PAUSE_BEGIN, Trigger.PAUSE_OK, Trigger.MUTATE_BEGIN,
    Trigger.MUTATE_OK, Trigger.RESET_BEGIN, Trigger.RESET_OK, Trigger.INVALIDATED,
    Trigger.VALIDATE_BEGIN, Trigger.VALIDATE_OK, Trigger.RESUME_BEGIN, Trigger.RESUME_OK,
    Trigger.PROBE_BEGIN, Trigger.PROBE_OK, Trigger.PUBLISH,
)
READMIT_OUTCOMES = frozenset(t for r, t in OUTCOMES[Op.READMIT].items() if r is not Result.BEGIN)


def test_every_tainting_fault_has_an_engine_model() -> None:
    tainting = {k for k, (phase, _published) in FAULT_MATRIX.items() if phase is Phase.TAINTED}
    assert tainting == set(TAINTED_ENGINE)


class Crash(BaseException):
    """The controller's process dies (a BaseException: nothing in the runner catches it)."""


class CrashBefore:
    """A trace sink that kills the controller when it is about to journal one of ``steps``:
    that step did not happen, everything journalled before it did."""

    def __init__(self, journal: Journal, steps: frozenset[str]) -> None:
        self.journal = journal
        self.steps = steps

    def __call__(self, record: TraceRecord) -> None:
        if record.step in self.steps:
            raise Crash(f"crashed before journalling {record.step}")
        self.journal(record)


class RunnerWithFaults(RuleBasedStateMachine):
    """The implementation (runner + generated controller + simulated engine + journal)
    against an explicit model kept in plain attributes: the controller's phase and
    committed generation, the engine's weights, label, run state and death, the rollouts
    the application holds and those a drain released as aborted. Each rule updates the
    model from what it did and the fault it injected (FAULT_MATRIX, TAINTED_ENGINE, the
    spec's restart rule); after every step the implementation must equal the model, and
    after every cycle, restart and example the journal must pass the trace checker."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory(prefix="rc-stateful-")
        self.path = Path(self.tmp.name) / "j.jsonl"
        self.engine = SimEngine("ckpt-1", label="rc-1")
        self.adapter = SimAdapter(self.engine, hang_seconds=5)
        ctl, self.journal, _rec = open_controller(self.path, fsync=False)
        self.runner = LifecycleRunner(ctl, self.adapter, TIGHT)
        assert self.runner.bootstrap(sim_target(1, "ckpt-1")).trigger == Trigger.BOOTSTRAP_OK
        self.n = 0
        self.story: list[str] = []  # what note() reported, also outside Hypothesis
        # ---- the model
        self.phase = Phase.READY
        self.committed = 1
        self.weights, self.label, self.paused, self.dead = "ckpt-1", "rc-1", False, False
        self.held: dict[str, int] = {}  # rollout id -> generation it was admitted under
        self.aborted: dict[str, int] = {}  # released as aborted, not yet let go by the app

    @property
    def ctl(self) -> Controller:
        return self.runner.controller

    def _new_id(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def _engine_is(self, weights: str, label: str, *, paused: bool, dead: bool = False) -> None:
        self.weights, self.label, self.paused, self.dead = weights, label, paused, dead

    def _serves(self, generation: int) -> None:
        self._engine_is(f"ckpt-{generation}", f"rc-{generation}", paused=False)

    def say(self, line: str) -> None:
        """Note a step of the story (a shrunk failure reads as the list of them)."""
        self.story.append(line)
        if currently_in_test_context():
            note(line)

    def _journal_accepted(self) -> None:
        verdict = check_file(self.path)
        assert verdict.accepted, verdict.message

    # ------------------------------------------------------------------ the application

    @precondition(lambda self: self.phase is Phase.READY)
    @rule(prompt=st.lists(st.integers(0, 50), min_size=1, max_size=12))
    def rollout(self, prompt: list[int]) -> None:
        rid = self._new_id("r")
        binding, out = self.runner.generate(rid, tuple(prompt), 5)
        self.say(f"rollout {rid} under gen {binding.generation} (model: gen {self.committed})")
        ckpt = f"ckpt-{self.committed}"
        assert binding.generation == self.committed and not binding.aborted
        assert binding.identity == sim_identity(ckpt)
        assert out.extra["weights_seen"] == [ckpt]
        assert out.tokens == reference_tokens(ckpt, tuple(prompt), 5)  # no stale KV

    @precondition(lambda self: self.phase is Phase.READY and len(self.held) < 2)
    @rule()
    def admit_and_hold(self) -> None:
        rid = self._new_id("h")
        binding = self.ctl.admit(rid)
        self.say(f"admit {rid} under gen {binding.generation}, held open")
        assert binding.generation == self.committed
        self.held[rid] = self.committed

    @precondition(lambda self: bool(self.held or self.aborted))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.release_one(
            data.draw(st.sampled_from(sorted({**self.held, **self.aborted})), label="rollout"))

    def release_one(self, rid: str) -> None:
        was_aborted = rid in self.aborted
        generation = (self.aborted if was_aborted else self.held).pop(rid)
        self.say(f"release {rid} (gen {generation}"
                 f"{', aborted by the drain' if was_aborted else ''}) in {self.phase}")
        binding = self.ctl.release(rid)  # never raises, even for an aborted rollout
        assert binding.rollout_id == rid and binding.generation == generation
        assert binding.aborted is was_aborted

    # ---------------------------------------------------------------- update cycles

    def _cycle(self, policy: RunnerPolicy, fault: tuple[str, str] | None) -> CycleReport:
        self.adapter.faults = FaultPlan({fault[0]: [fault[1]]} if fault else {})
        self.runner.policy = policy
        n = self.committed + 1
        report = self.runner.update(sim_target(n, f"ckpt-{n}"))
        assert self.adapter.faults.injected == ([fault] if fault else [])
        self._journal_accepted()
        return report

    def _expect(self, report: CycleReport, fault: tuple[str, str] | None, what: str) -> None:
        """The model's prediction for a cycle that got past the drain (FAULT_MATRIX)."""
        g, n = self.committed, self.committed + 1
        phase, published = FAULT_MATRIX[fault] if fault else (Phase.READY, True)
        self.say(f"{what}: update to gen {n}{f' with {fault[0]}={fault[1]}' if fault else ''}"
                 f" -> {phase}{', published' if published else ''} (runner: {report.final_phase}"
                 f"{', published' if report.published else ''})")
        assert (report.final_phase, report.published) == (phase, published), report.steps
        self.phase = phase
        if phase is Phase.READY:
            self.committed = n if published else g
            self._serves(self.committed)
            assert report.fenced is None
            return
        assert fault is not None
        weights, dead = TAINTED_ENGINE[fault]
        weights = weights.format(old=f"ckpt-{g}", new=f"ckpt-{n}")
        if dead:
            self._engine_is(weights, f"rc-{n}", paused=False, dead=True)
        else:
            self._engine_is(weights, taint_label(report.target), paused=True)
        assert report.fenced is not dead

    @precondition(lambda self: self.phase is Phase.READY and not self.held)
    @rule(fault=st.one_of(st.none(), FAULTS))
    def update(self, fault: tuple[str, str] | None) -> None:
        seq = self.ctl.last_seq
        report = self._cycle(TIGHT, fault)
        self._expect(report, fault, "nothing held")
        if fault is None:  # the crash rule's list of steps is the runner's real cycle
            _chain, records = read_journal(self.path)
            steps = [r["step"] for r in records if r["seq"] > seq]
            assert tuple(dict.fromkeys(steps)) == CYCLE

    @precondition(lambda self: self.phase is Phase.READY and bool(self.held))
    @rule()
    def update_cancelled_by_held_rollout(self) -> None:
        report = self._cycle(CANCELLING, None)
        self.say(f"update to gen {self.committed + 1} while {sorted(self.held)} held: the drain "
                 f"times out, cancelled -> {report.final_phase}")
        assert report.final_phase is Phase.READY and not report.published
        assert [(s.step, s.outcome) for s in report.steps] == [("drain", "timeout")]
        assert report.aborted == []
        # The model does not move: same phase, generation, engine, held rollouts.

    @precondition(lambda self: self.phase is Phase.READY and bool(self.held))
    @rule(fault=st.one_of(st.none(), FAULTS))
    def update_aborting_held_rollouts(self, fault: tuple[str, str] | None) -> None:
        held = dict(self.held)
        report = self._cycle(ABORTING, fault)
        assert sorted(report.aborted) == sorted(held)
        self.aborted.update(held)
        self.held.clear()
        self._expect(report, fault, f"wait-then-abort {sorted(held)}")

    # ----------------------------------------------------------- the controller's crash

    def _crash_and_recover(self, *, ready: bool) -> None:
        """The process is gone: reopen its journal with a new controller over the same
        engine. The model predicts the restart (READY or TAINTED); the crashed process's
        bindings are dropped, released-as-aborted ones too."""
        old = self.runner
        self.journal.close()
        ctl, self.journal, rec = open_controller(self.path, fsync=False)
        self.say(f"  restart on the journal -> {rec.trigger} (model: "
                 f"{'READY' if ready else 'TAINTED'})")
        assert rec.trigger == (Trigger.RESTART_READY if ready else Trigger.RESTART_TAINTED)
        self.runner = LifecycleRunner(ctl, self.adapter, TIGHT)
        committed = old.targets[self.committed]
        self.runner.targets[self.committed] = committed
        # Recovery restores the committed identity from the journal itself.
        assert ctl.identity == committed.identity
        self.phase = Phase.READY if ready else Phase.TAINTED
        self.held.clear()
        self.aborted.clear()
        self._journal_accepted()

    @precondition(lambda self: bool(self.held or self.aborted) or self.phase is Phase.TAINTED)
    @rule()
    def crash_at_rest(self) -> None:
        # (READY with nothing held: that is crash_during_update before request_update.)
        self.say(f"controller crashes in {self.phase} with {sorted(self.held)} held")
        self._crash_and_recover(ready=self.phase is Phase.READY)

    @precondition(lambda self: self.phase is Phase.READY and not self.held)
    @rule(at=st.sampled_from(CYCLE))
    def crash_during_update(self, at: Trigger) -> None:
        g, n = self.committed, self.committed + 1
        self.say(f"update to gen {n}: the controller crashes before journalling {at}")
        self.adapter.faults = FaultPlan()
        self.ctl.trace = CrashBefore(self.journal, frozenset({at}))
        with pytest.raises(Crash):
            self.runner.update(sim_target(n, f"ckpt-{n}"))
        k = CYCLE.index(at)
        # What reached the engine: each call happens between its begin and its outcome.
        mutated = k > CYCLE.index(Trigger.MUTATE_BEGIN)
        paused = CYCLE.index(Trigger.PAUSE_BEGIN) < k <= CYCLE.index(Trigger.RESUME_BEGIN)
        self._engine_is(f"ckpt-{n if mutated else g}", f"rc-{n if mutated else g}",
                        paused=paused)
        # The spec's restart: READY from READY (nothing of the cycle journalled) or from
        # DRAINING with nothing in flight and the engine known to run (only request_update
        # journalled); any later crash leaves an operation in flight, or the engine paused
        # or mutated: TAINTED.
        last = CYCLE[k - 1] if k else None
        self._crash_and_recover(ready=last in (None, Trigger.REQUEST_UPDATE))

    # -------------------------------------------------------------------- TAINTED

    @precondition(lambda self: self.phase is Phase.TAINTED)
    @rule()
    def tainted_refuses(self) -> None:
        self.say("TAINTED refuses an admission and an update request")
        with pytest.raises(IllegalTransition):
            self.ctl.admit("late")
        with pytest.raises(IllegalTransition):
            self.ctl.fire(Trigger.REQUEST_UPDATE)

    def _readmitted(self) -> None:
        """What a re-admission does to the engine: reloaded and serving the committed
        generation, unless it is dead (then the reload fails; the resume still ran)."""
        if self.dead:
            self.paused = False
        else:
            self._serves(self.committed)

    @precondition(lambda self: self.phase is Phase.TAINTED)
    @rule()
    def readmit(self) -> None:
        self.adapter.faults = FaultPlan()
        outcome = self.runner.readmit(self.runner.targets[self.committed], who="test")
        expected = Phase.TAINTED if self.dead else Phase.READY
        self.say(f"readmit onto gen {self.committed}{' (dead engine)' if self.dead else ''} -> "
                 f"{outcome.trigger} (model: {expected})")
        assert (outcome.trigger == Trigger.READMIT_OK) is (expected is Phase.READY), outcome
        self.phase = expected
        self._readmitted()
        self._journal_accepted()

    @precondition(lambda self: self.phase is Phase.TAINTED)
    @rule(outcome=st.booleans())
    def crash_during_readmit(self, outcome: bool) -> None:
        at = READMIT_OUTCOMES if outcome else frozenset({Trigger.READMIT_BEGIN})
        self.say(f"readmit onto gen {self.committed}: the controller crashes before journalling "
                 f"{'its outcome' if outcome else 'readmit_begin'}")
        self.adapter.faults = FaultPlan()
        self.ctl.trace = CrashBefore(self.journal, at)
        with pytest.raises(Crash):
            self.runner.readmit(self.runner.targets[self.committed], who="test")
        if outcome:  # the engine went through the whole procedure
            self._readmitted()
        self._crash_and_recover(ready=False)  # readmit was in flight, or never began

    # ---------------------------------------------------------------- the comparison

    @invariant()
    def implementation_matches_model(self) -> None:
        ctl, e, c = self.ctl, self.engine, self.committed
        assert (ctl.phase, ctl.control.committed) == (self.phase, c)
        assert {rid: b.generation for rid, b in ctl.bindings.items()} == self.held
        assert all(ctl.was_aborted(rid) for rid in self.aborted)
        assert (e.weights, e.label, e.paused, e.dead) == (
            self.weights, self.label, self.paused, self.dead)
        if self.phase is Phase.READY:  # the model itself: ReadyEngineServesCommitted
            assert (self.weights, self.label, self.paused) == (f"ckpt-{c}", f"rc-{c}", False)
            entries = {*e.prefix.values(), *e.encoder.values(), *e.mm.values()}
            assert entries <= {f"ckpt-{c}"}, "stale cache entries in READY"
        else:
            assert self.phase is Phase.TAINTED and not self.held
            assert ctl.enabled(Trigger.ADMIT, "x") is not None

    def teardown(self) -> None:
        try:
            self.adapter.release_hangs()
            self.journal.close()
            self._journal_accepted()
        finally:
            self.tmp.cleanup()


_FAULT_SETTINGS: dict[str, Any] = {
    "stateful_step_count": 12, "deadline": None, "database": None, "derandomize": True,
    "suppress_health_check": list(HealthCheck)}
#: make check's size; make test runs the deeper search below too.
TestRunnerWithFaults = RunnerWithFaults.TestCase
TestRunnerWithFaults.settings = settings(max_examples=15, **_FAULT_SETTINGS)


@pytest.mark.deep
class TestRunnerWithFaultsDeep(RunnerWithFaults.TestCase):
    settings = settings(max_examples=60, **_FAULT_SETTINGS)


# The same model, toured deterministically: every fault of FAULT_MATRIX in a
# wait-then-abort cycle and every crash point of a cycle, each followed by re-admission
# (when TAINTED) and a clean update, so that no branch of the model depends on what
# Hypothesis happens to draw.


@contextmanager
def _tour() -> Iterator[RunnerWithFaults]:
    m = RunnerWithFaults()
    try:
        yield m
        m.implementation_matches_model()
    except AssertionError as e:
        raise AssertionError("story:\n  " + "\n  ".join(m.story)) from e
    finally:
        m.teardown()


def _step(m: RunnerWithFaults, rule: Callable[..., None], *args: object) -> None:
    rule(*args)
    m.implementation_matches_model()


def _back_to_ready(m: RunnerWithFaults) -> None:
    """Re-admit a TAINTED engine (a dead one stays TAINTED), then a clean update."""
    if m.phase is Phase.TAINTED:
        _step(m, m.readmit)
    if m.phase is Phase.READY:
        _step(m, m.update, None)
        assert m.phase is Phase.READY


@pytest.mark.parametrize("fault", sorted(FAULT_MATRIX), ids=lambda f: "=".join(f))
def test_model_tour_fault_while_aborting(fault: tuple[str, str]) -> None:
    with _tour() as m:
        _step(m, m.admit_and_hold)
        (rid,) = m.held
        _step(m, m.update_aborting_held_rollouts, fault)
        _step(m, m.release_one, rid)  # the application lets the aborted rollout go
        _back_to_ready(m)
        if m.dead:
            _step(m, m.crash_at_rest)
            assert m.phase is Phase.TAINTED


@pytest.mark.parametrize("at", CYCLE, ids=str)
def test_model_tour_crash_before_step(at: Trigger) -> None:
    with _tour() as m:
        _step(m, m.crash_during_update, at)
        if m.phase is Phase.TAINTED:
            _step(m, m.crash_during_readmit, False)
            _step(m, m.crash_during_readmit, True)
        _back_to_ready(m)


def test_model_tour_cancel_then_crash_with_rollouts_held() -> None:
    with _tour() as m:
        _step(m, m.admit_and_hold)
        _step(m, m.update_cancelled_by_held_rollout)
        _step(m, m.admit_and_hold)
        _step(m, m.crash_at_rest)  # READY again; the held rollouts are gone
        assert m.phase is Phase.READY and not m.held
        _back_to_ready(m)

def test_recovered_controller_binds_the_committed_identity(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    ctl, journal, _rec = open_controller(path, fsync=False)
    runner = LifecycleRunner(ctl, SimAdapter(SimEngine("ckpt-1", label="rc-1")), FAST)
    assert runner.bootstrap(sim_target(1, "ckpt-1")).trigger == Trigger.BOOTSTRAP_OK
    assert runner.update(sim_target(2, "ckpt-2")).published
    assert ctl.admit("before").identity == sim_identity("ckpt-2")
    journal.close()
    ctl, journal, rec = open_controller(path, fsync=False)
    try:
        assert rec.trigger == Trigger.RESTART_READY and ctl.control.committed == 2
        assert ctl.admit("after").identity == sim_identity("ckpt-2")
    finally:
        journal.close()
