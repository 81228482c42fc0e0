"""Runner + controller + simulated engine: faults at every step, the journal always
passes the trace checker, and no rollout ever crosses a mutation."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
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
from rolloutcore.controller import Controller, IllegalTransition
from rolloutcore.journal import Journal
from rolloutcore.runner import LifecycleRunner, RunnerPolicy, call_with_deadline
from rolloutcore.simulate import simulate
from rolloutcore.spec.lifecycle import Phase
from rolloutcore.trace_check import check_file

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
    assert mutate.outcome == "mutate_ambiguous"
    assert deadline <= mutate.seconds < deadline + 0.25
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
TIGHT = RunnerPolicy(step_timeout_s=0.05, retries=2, retry_backoff_s=0.0, drain_timeout_s=5,
                     mutation_base_s=0.05, mutation_floor_bytes_per_s=1e12)


class RunnerWithFaults(RuleBasedStateMachine):
    """Random interleavings of rollouts and update cycles with a fault injected at a
    random step; after every step the runtime counterparts of the spec invariants hold
    and the journal so far passes the trace checker."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="rc-stateful-"))
        self.path = self.dir / "j.jsonl"
        self.engine = SimEngine("ckpt-1", label="rc-1")
        self.adapter = SimAdapter(self.engine, hang_seconds=5)
        self.runner = LifecycleRunner(Controller(trace=Journal(self.path, fsync=False)),
                                      self.adapter, TIGHT)
        assert self.runner.bootstrap(sim_target(1, "ckpt-1")).trigger == "bootstrap_ok"
        self.ambiguous = False
        self.open: list[str] = []
        self.n = 0

    @property
    def ctl(self) -> Controller:
        return self.runner.controller

    @precondition(lambda self: self.ctl.phase is Phase.READY)
    @rule(prompt=st.lists(st.integers(0, 50), min_size=1, max_size=12))
    def rollout(self, prompt: list[int]) -> None:
        self.n += 1
        binding, out = self.runner.generate(f"r{self.n}", tuple(prompt), 5)
        assert out.extra["weights_seen"] == [f"ckpt-{binding.generation}"]
        assert binding.identity == sim_identity(f"ckpt-{binding.generation}")

    @precondition(lambda self: self.ctl.phase is Phase.READY)
    @rule()
    def admit_and_hold(self) -> None:
        self.n += 1
        self.ctl.admit(f"h{self.n}")
        self.open.append(f"h{self.n}")

    @precondition(lambda self: bool(self.open))
    @rule()
    def release_held(self) -> None:
        self.ctl.release(self.open.pop())

    @precondition(lambda self: self.ctl.phase is Phase.READY and not self.open)
    @rule(fault=st.one_of(st.none(), FAULTS))
    def update(self, fault: tuple[str, str] | None) -> None:
        self.adapter.faults = FaultPlan({fault[0]: [fault[1]]} if fault else {})
        g = self.ctl.control.committed + 1
        report = self.runner.update(sim_target(g, f"ckpt-{g}"))
        if fault is not None:
            assert report.final_phase is FAULT_MATRIX[fault][0]
        verdict = check_file(self.path)  # the journal so far conforms to the spec
        assert verdict.accepted, verdict.message

    @precondition(lambda self: self.ctl.phase is Phase.TAINTED)
    @rule()
    def tainted_refuses(self) -> None:
        with pytest.raises(IllegalTransition):
            self.ctl.admit("late")
        with pytest.raises(IllegalTransition):
            self.ctl.fire("request_update")

    @invariant()
    def runtime_invariants(self) -> None:
        ctl, e = self.ctl, self.engine
        if ctl.phase is Phase.READY:
            held = f"ckpt-{ctl.control.committed}"
            assert e.weights == held and e.label == f"rc-{ctl.control.committed}"
            assert not e.paused
            assert set(e.prefix.values()) <= {held}
        if ctl.phase is Phase.TAINTED:
            assert ctl.enabled("admit", "x") is not None

    def teardown(self) -> None:
        self.adapter.release_hangs()
        verdict = check_file(self.path)
        assert verdict.accepted, verdict.message


TestRunnerWithFaults = RunnerWithFaults.TestCase
TestRunnerWithFaults.settings = settings(max_examples=40, stateful_step_count=10, deadline=None,
                                         database=None, suppress_health_check=list(HealthCheck))
