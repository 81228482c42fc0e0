"""The lifecycle runner: executes an update cycle step by step through the controller
and an adapter, never trusting a call's return for a postcondition.

Every adapter call runs under a deadline. Idempotent steps (pause, resume, reads, cache
resets, probe) are retried a bounded number of times; the mutation is a collective and
is never retried: a timeout or an unclassifiable error there is ambiguous and latches
TAINTED within the deadline plus a small margin, whatever the stuck call does after.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rolloutcore import postconditions as post
from rolloutcore.adapters.contract import (
    AdapterError,
    GenerationResult,
    LifecycleAdapter,
    MutationEvidence,
    MutationOutcome,
    PauseMode,
    WeightTarget,
)
from rolloutcore.controller import Binding, Controller
from rolloutcore.spec.lifecycle import TIERS, Phase

T = TypeVar("T")


@dataclass(frozen=True)
class RunnerPolicy:
    step_timeout_s: float = 30.0  # each idempotent call
    retries: int = 3  # extra attempts of an idempotent step
    retry_backoff_s: float = 0.05
    drain_timeout_s: float = 600.0
    pause_mode: PauseMode = PauseMode.WAIT
    # Run idempotent calls on watchdog workers so that even a hung call is bounded. An
    # adapter whose every call carries its own timeout (httpx) may turn this off to save
    # the thread hand-offs; the mutation is always supervised.
    supervise_idempotent: bool = True
    # Mutation deadline: base plus the time to move the target's bytes at a floor rate.
    mutation_base_s: float = 10.0
    mutation_floor_bytes_per_s: float = 50e6

    def mutation_deadline(self, target: WeightTarget) -> float:
        return self.mutation_base_s + target.nbytes / self.mutation_floor_bytes_per_s


class DeadlineExceeded(Exception):
    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(f"{what} did not return within {seconds:.2f} s")
        self.what = what
        self.seconds = seconds


@dataclass
class StepRecord:
    step: str
    outcome: str
    seconds: float
    attempts: int
    reason: str


@dataclass
class CycleReport:
    target: WeightTarget
    published: bool
    final_phase: Phase
    drain_wait_s: float = 0.0
    total_s: float = 0.0
    steps: list[StepRecord] = field(default_factory=list)
    stuck_calls: list[str] = field(default_factory=list)

    def timings(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.steps:
            out[s.step] = out.get(s.step, 0.0) + s.seconds
        return out


StepListener = Callable[[str, str, float], None]  # (step, outcome, seconds)


class _Call:
    """One call handed to another thread: its result, or its error, and when it ended."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.box: dict[str, Any] = {}
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.box["value"] = self.fn()
        except BaseException as e:  # re-raised in the caller
            self.box["error"] = e
        finally:
            self.done.set()

    def wait(self, seconds: float, what: str, stuck: list[str] | None) -> Any:
        if not self.done.wait(seconds):
            if stuck is not None:
                stuck.append(f"{what} still running after {seconds:.2f} s (left behind)")
            raise DeadlineExceeded(what, seconds)
        if "error" in self.box:
            raise self.box["error"]
        return self.box["value"]


class CallPool:
    """Reusable daemon workers for idempotent calls (a thread per call costs more than the
    whole control logic). A call past its deadline keeps its worker; a new worker is
    started when none is idle, so stuck calls never starve the runner."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def _work(self) -> None:
        while True:
            self._tasks.get().run()
            with self._lock:
                self._idle += 1

    def call(self, fn: Callable[[], T], seconds: float, what: str,
             stuck: list[str] | None = None) -> T:
        call = _Call(fn)
        with self._lock:
            if self._idle == 0:
                threading.Thread(target=self._work, name="rolloutcore-call", daemon=True).start()
            else:
                self._idle -= 1
        self._tasks.put(call)
        return call.wait(seconds, what, stuck)  # type: ignore[no-any-return]


def call_with_deadline(fn: Callable[[], T], seconds: float, what: str,
                       stuck: list[str] | None = None) -> T:
    """Run ``fn`` in its own daemon thread; raise DeadlineExceeded if it has not returned in
    time. Used for the collective: a call that never returns is left behind (contained,
    reported in ``stuck``), and the controller moves on."""
    call = _Call(fn)
    threading.Thread(target=call.run, name=f"rolloutcore-{what}", daemon=True).start()
    return call.wait(seconds, what, stuck)  # type: ignore[no-any-return]


class LifecycleRunner:
    """Drives the controller through bootstrap and update cycles against one adapter."""

    def __init__(self, controller: Controller, adapter: LifecycleAdapter,
                 policy: RunnerPolicy = RunnerPolicy(),
                 on_step: StepListener | None = None) -> None:
        self.controller = controller
        self.adapter = adapter
        self.policy = policy
        self.on_step = on_step
        self.targets: dict[int, WeightTarget] = {}  # generation -> what it is
        self.stuck_calls: list[str] = []
        self._pool = CallPool()
        self._collective = CallPool()  # its own workers: a stuck transfer blocks nothing else

    # ------------------------------------------------------------------ building blocks

    def _fire(self, trigger: str, param: str | None = None, **detail: Any) -> None:
        self.controller.fire(trigger, param, detail or None)

    def _call(self, what: str, fn: Callable[[], T], seconds: float | None = None) -> T:
        if not self.policy.supervise_idempotent:
            return fn()
        return self._pool.call(fn, seconds or self.policy.step_timeout_s, what,
                               self.stuck_calls)

    def _idempotent(self, report: CycleReport | None, op: str, param: str | None,
                    attempt: Callable[[], post.Outcome]) -> post.Outcome:
        """begin -> outcome, retried while the outcome is ``*_failed``."""
        t0 = time.perf_counter()
        outcome = post.Outcome(f"{op}_failed", "not attempted")
        for n in range(1, self.policy.retries + 2):
            self._fire(f"{op}_begin", param)
            try:
                outcome = attempt()
            except (AdapterError, DeadlineExceeded, OSError) as e:
                outcome = post.Outcome(f"{op}_failed", f"{type(e).__name__}: {e}")
            self._fire(outcome.trigger, param, reason=outcome.reason, attempt=n)
            if not outcome.trigger.endswith("_failed"):
                break
            time.sleep(self.policy.retry_backoff_s * n)
        self._record(report, op if param is None else f"{op}({param})", outcome, t0, n)
        return outcome

    def _record(self, report: CycleReport | None, step: str, outcome: post.Outcome,
                t0: float, attempts: int) -> None:
        seconds = time.perf_counter() - t0
        if report is not None:
            report.steps.append(StepRecord(step, outcome.trigger, seconds, attempts,
                                           outcome.reason))
        if self.on_step is not None:
            self.on_step(step, outcome.trigger, seconds)

    # ----------------------------------------------------------------------- bootstrap

    def bootstrap(self, initial: WeightTarget) -> post.Outcome:
        """Read a fresh engine; commit ``initial`` as generation 1 only if it is verified."""
        if initial.generation != 1:
            raise ValueError("the bootstrap target is generation 1")

        def attempt() -> post.Outcome:
            report = self._call("read_state", self.adapter.read_state)
            ev = self._call("probe", lambda: self.adapter.probe(initial.probe_prompt,
                                                                len(initial.probe_tokens)))
            return post.bootstrap(report, ev, initial)

        outcome = self._idempotent(None, "bootstrap", None, attempt)
        if outcome.trigger == "bootstrap_ok":
            self.targets[1] = initial
            self.controller.identity = initial.identity
        return outcome

    # -------------------------------------------------------------------- update cycle

    def update(self, target: WeightTarget) -> CycleReport:
        """One full transition to ``target``; returns what happened, step by step."""
        c = self.controller
        if target.generation != c.control.committed + 1:
            raise ValueError(f"target generation {target.generation} is not the next one "
                             f"after {c.control.committed}")
        report = CycleReport(target, published=False, final_phase=c.phase)
        t_start = time.perf_counter()
        try:
            self._cycle(target, report)
        finally:
            report.final_phase = c.phase
            report.total_s = time.perf_counter() - t_start
            report.stuck_calls = list(self.stuck_calls)
        return report

    def _cycle(self, target: WeightTarget, report: CycleReport) -> None:
        c = self.controller
        self._fire("request_update", target=target.label)
        # Drain: woken by each release; the engine-side orphans are drained by pause(wait).
        t0 = time.perf_counter()
        drained = c.wait_drained(self.policy.drain_timeout_s)
        report.drain_wait_s = time.perf_counter() - t0
        self._record(report, "drain", post.Outcome("drained" if drained else "timeout",
                                                   f"{c.bound_count()} bound"), t0, 1)
        if not drained:
            self._fire("cancel_update", reason="drain timeout")
            return
        mode = self.policy.pause_mode
        pause = self._idempotent(report, "pause", None, lambda: post.pause(
            self._call("pause", lambda: self.adapter.pause(mode))))
        if pause.trigger != "pause_ok":
            # A failed pause may have taken effect: the engine must run again before
            # admissions reopen (the spec's cancel_update requires it).
            if self._resume(report):
                self._fire("cancel_update", reason=pause.reason)
            return
        if self._mutate(target, report) != "mutate_ok":
            if self._in(Phase.QUIESCED):  # refused with proof: resume the old generation
                self._fire("abandon_update")
                if self._resume(report):
                    self._fire("reopen")
            return
        for tier in TIERS:
            r = self._idempotent(report, "reset", tier, self._reset_attempt(tier))
            if r.trigger != "reset_ok":
                self._fire("give_up", reason=r.reason)
                return
        self._fire("invalidated")
        v = self._idempotent(report, "validate", None, lambda: post.validation(
            self._call("read_state", self.adapter.read_state), target))
        if v.trigger == "validate_mismatch":
            return
        if v.trigger != "validate_ok":
            self._fire("give_up", reason=v.reason)
            return
        if not self._resume(report):
            return
        attempts: list[int] = []

        def probe_attempt() -> post.Outcome:
            # Prefix hits prove stale reuse only on the first request after invalidation:
            # a failed earlier attempt may have cached blocks under the new weights.
            attempts.append(1)
            ev = self._call("probe", lambda: self.adapter.probe(target.probe_prompt,
                                                                len(target.probe_tokens)))
            return post.probe(ev, target.probe_tokens, first_since_reset=len(attempts) == 1)

        p = self._idempotent(report, "probe", None, probe_attempt)
        if p.trigger == "probe_mismatch":
            return
        if p.trigger != "probe_ok":
            self._fire("give_up", reason=p.reason)
            return
        self.targets[target.generation] = target
        with self._identity_swap(target):
            self._fire("publish", label=target.label, identity=target.identity)
        report.published = True

    @contextmanager
    def _identity_swap(self, target: WeightTarget) -> Iterator[None]:
        previous = self.controller.identity
        self.controller.identity = target.identity
        try:
            yield
        except BaseException:
            self.controller.identity = previous
            raise

    def _in(self, phase: Phase) -> bool:
        return self.controller.phase is phase

    def _reset_attempt(self, tier: str) -> Callable[[], post.Outcome]:
        return lambda: post.reset(self._call(f"reset_{tier}",
                                             lambda: self.adapter.reset_cache(tier)))

    def _resume(self, report: CycleReport) -> bool:
        r = self._idempotent(report, "resume", None, lambda: post.resume(
            self._call("resume", self.adapter.resume)))
        if r.trigger != "resume_ok":
            if self._in(Phase.RESUMING) and self.controller.control.target != 0:
                self._fire("give_up", reason=r.reason)
            # Otherwise admissions stay closed (DRAINING, or RESUMING an abandoned update)
            # with the engine's run state unknown: fail closed, report, let the caller retry.
            return False
        return True

    def _mutate(self, target: WeightTarget, report: CycleReport) -> str:
        """The collective: never retried; a timeout or unknown error is ambiguous."""
        deadline = self.policy.mutation_deadline(target)
        t0 = time.perf_counter()
        self._fire("mutate_begin", target=target.label, deadline_s=round(deadline, 3))
        try:
            ev = self._collective.call(lambda: self.adapter.mutate(target), deadline, "mutate",
                                       self.stuck_calls)
        except DeadlineExceeded as e:
            ev = MutationEvidence(MutationOutcome.AMBIGUOUS, str(e), time.perf_counter() - t0)
        except AdapterError as e:
            kind = MutationOutcome.NOT_MUTATED if e.proven_no_effect else MutationOutcome.AMBIGUOUS
            ev = MutationEvidence(kind, f"{type(e).__name__}: {e}", time.perf_counter() - t0)
        except Exception as e:  # unclassifiable: may or may not have happened
            ev = MutationEvidence(MutationOutcome.AMBIGUOUS, f"{type(e).__name__}: {e}",
                                  time.perf_counter() - t0)
        outcome = post.mutation(ev)
        self._fire(outcome.trigger, reason=outcome.reason, seconds=round(ev.seconds, 4),
                   bytes=ev.bytes_moved)
        self._record(report, "mutate", outcome, t0, 1)
        return outcome.trigger

    # ---------------------------------------------------------------- rollouts (the app)

    @contextmanager
    def rollout(self, rollout_id: str) -> Iterator[Binding]:
        """Bind a rollout to the committed generation for the duration of the block."""
        with self.controller.rollout(rollout_id) as binding:
            yield binding

    def generate(self, rollout_id: str, prompt: tuple[int, ...], max_tokens: int) -> tuple[
        Binding, GenerationResult
    ]:
        """Admit, generate, release: the result is bound to one committed generation."""
        with self.rollout(rollout_id) as binding:
            result = self.adapter.generate(prompt, max_tokens)
        return binding, result

    def label_of(self, generation: int) -> str:
        return self.targets[generation].label


__all__ = ["CallPool", "CycleReport", "DeadlineExceeded", "LifecycleRunner", "RunnerPolicy",
           "call_with_deadline"]
