"""The lifecycle runner: executes an update cycle step by step through the controller
and an adapter, never trusting a call's return for a postcondition.

Deadlines. The policy states one deadline per step (:meth:`RunnerPolicy.step_deadline`);
the adapter receives it with every call and derives its transport timeouts from it, and
an idempotent step's retries happen inside it. So the time a stuck engine can cost is
the policy's, not a transport default's:

* time from a frozen engine to TAINTED <= the deadline of the step in progress (the
  mutation's, or ``step_timeout_s`` for an idempotent step after the mutation) plus the
  runner's own bookkeeping (milliseconds), whatever the engine does after;
* a frozen engine before the mutation (the pause) costs at most ``pause_timeout_s`` plus
  ``step_timeout_s`` for the resume attempts, then gives up (TAINTED, fenced best
  effort) if the engine cannot be shown to run again: every cycle ends in a phase a
  fleet can decide on.

Idempotent steps (pause, resume, reads, cache resets, probe) run on the caller's thread
(the adapter honours the deadline) and are retried only while their outcome is
``failed`` (unclassifiable); a definite answer (refused, mismatch) is final. The
mutation is a collective whose call may never return: it alone runs on a supervised
worker, is never retried, and a timeout or an unclassifiable error there is ambiguous
and latches TAINTED at the deadline. On TAINTED the engine is fenced, best effort: paused
in abort mode and relabelled ``tainted:<target>``.

Every outcome is journalled with the :class:`~rolloutcore.engine.postconditions.Decision` it was
decided on, so that the trace checker can decide it again.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from rolloutcore.adapters.contract import (
    AdapterError,
    GenerationResult,
    LifecycleAdapter,
    MutationEvidence,
    MutationOutcome,
    PauseMode,
    RankStage,
    Stager,
    WeightTarget,
    evidence_to_json,
    remaining,
)
from rolloutcore.check.claims import request_detail
from rolloutcore.engine import postconditions as post
from rolloutcore.engine.controller import Binding, Controller, IllegalTransition
from rolloutcore.engine.postconditions import Decision, Expected, Outcome
from rolloutcore.engine.staging import Staging
from rolloutcore.errors import Ambiguous
from rolloutcore.spec.lifecycle import TIERS, Phase, Result
from rolloutcore.spec.triggers import OUTCOMES, Op, Trigger

if TYPE_CHECKING:
    from rolloutcore.trajectories.format import Decoding, TrajectoryRecord

T = TypeVar("T")


class DrainPolicy(StrEnum):
    WAIT = "wait"  # wait for every bound rollout, up to drain_timeout_s, else cancel
    WAIT_THEN_ABORT = "wait-then-abort"  # wait up to abort_after_s, then abort the rest


class ProbeMode(StrEnum):
    SCORED = "scored"  # one prefill: every prompt position's log-probability (default)
    GREEDY = "greedy"  # a greedy decode of the reference's length, token for token


@dataclass(frozen=True)
class RunnerPolicy:
    step_timeout_s: float = 30.0  # each idempotent step, all its attempts included
    pause_timeout_s: float = 120.0  # a wait-mode pause returns once in-flight requests end
    retries: int = 3  # extra attempts of a failed idempotent step, within its deadline
    retry_backoff_s: float = 0.05
    drain_timeout_s: float = 600.0
    drain_policy: DrainPolicy = DrainPolicy.WAIT
    abort_after_s: float = 0.5  # wait-then-abort: how long bound rollouts may still run
    probe_mode: ProbeMode = ProbeMode.SCORED
    probe_tolerance: float = post.PROBE_TOLERANCE
    fence_timeout_s: float = 10.0
    # Mutation deadline: base plus the time to move the target's bytes at a floor rate.
    mutation_base_s: float = 10.0
    mutation_floor_bytes_per_s: float = 50e6
    #: Stage updates while the engine serves (spec/staged.py) where the adapter can: the
    #: closed window then only installs prepared buffers, and a failed staging is refused
    #: with the engine still serving its generation (never TAINTED).
    staged: bool = False

    def mutation_deadline(self, target: WeightTarget) -> float:
        return self.mutation_base_s + target.nbytes / self.mutation_floor_bytes_per_s

    def step_timeout(self, op: Op) -> float:
        """The one deadline (seconds) the policy states for a step of ``op``."""
        if op is Op.PAUSE:
            return self.pause_timeout_s
        if op is Op.FENCE:
            return self.fence_timeout_s
        return self.step_timeout_s


class DeadlineExceeded(Ambiguous):
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
    aborted: list[str] = field(default_factory=list)  # rollouts released as aborted
    tainted_after_s: float | None = None  # from the cycle's start to TAINTED
    fenced: bool | None = None  # None: not tainted
    prepared: bool = False  # verified up to the publish, not yet published
    started: float = 0.0  # perf_counter at the start
    staged: bool = False  # every rank prepared the target before admissions closed
    staging_s: float = 0.0  # the staging, while the engine served
    staged_bytes: int = 0
    staging_refused: str | None = None  # why a staging was refused (nothing served changed)
    peer: str | None = None  # the member it staged from (None: the target's own source)
    window_s: float = 0.0  # admissions closed: from the request to the reopening or TAINTED

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
    """Reusable daemon workers for calls that may never return (a thread per call costs
    more than the whole control logic). A call past its deadline keeps its worker; a new
    worker is started when none is idle, so stuck calls never starve the runner."""

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
    time. A call that never returns is left behind (contained, reported in ``stuck``)."""
    call = _Call(fn)
    threading.Thread(target=call.run, name=f"rolloutcore-{what}", daemon=True).start()
    return call.wait(seconds, what, stuck)  # type: ignore[no-any-return]


def _staged_detail(session: Staging | None) -> dict[str, Any]:
    """What a step of a staged update adds to its record (the checker steps the staged
    spec on it)."""
    return {} if session is None else {"staged": True}


def taint_label(target: WeightTarget | str) -> str:
    """The label a fenced engine carries (of a target, or of a generation's label): never
    a generation's label."""
    return f"tainted:{target if isinstance(target, str) else target.label}"


#: How late (past its deadline) an idempotent call may return before it is reported as
#: not honouring its deadline (an adapter bug: the runner cannot interrupt it).
LATE_GRACE_S = 0.25


class LifecycleRunner:
    """Drives the controller through bootstrap, update cycles and audits against one adapter."""

    def __init__(self, controller: Controller, adapter: LifecycleAdapter,
                 policy: RunnerPolicy = RunnerPolicy(),
                 on_step: StepListener | None = None) -> None:
        self.controller = controller
        self.adapter = adapter
        self.policy = policy
        self.on_step = on_step
        self.targets: dict[int, WeightTarget] = {}  # generation -> what it is
        self.requested: WeightTarget | None = None  # the last update requested
        self.stuck_calls: list[str] = []
        self._collective = CallPool()  # a stuck transfer blocks nothing else

    # ------------------------------------------------------------------ building blocks

    def _fire(self, trigger: Trigger, param: str | None = None, *,
              evidence: Decision | None = None, **detail: Any) -> None:
        if evidence is not None:
            detail["decision"] = post.decision_to_json(evidence)
        self.controller.fire(trigger, param, detail or None)

    def _idempotent(self, report: CycleReport | None, op: Op, param: str | None,
                    attempt: Callable[[float], Decision],
                    detail: dict[str, Any] | None = None, *, retry: bool = True) -> Outcome:
        """begin -> outcome, retried while the outcome is ``failed`` and the step's one
        deadline (stated by the policy) has time left; definite outcomes are final."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.policy.step_timeout(op)
        outcome = Outcome(OUTCOMES[op][Result.FAILED], "not attempted")
        n = 0
        for n in range(1, (self.policy.retries if retry else 0) + 2):
            self._fire(OUTCOMES[op][Result.BEGIN], param,
                       deadline_s=round(max(deadline - time.monotonic(), 0.0), 3))
            started = time.monotonic()
            try:
                decision = attempt(deadline)
            except (AdapterError, DeadlineExceeded, OSError) as e:
                decision = Decision(op, error=f"{type(e).__name__}: {e}")
            if time.monotonic() > deadline + LATE_GRACE_S:
                self.stuck_calls.append(f"{op} attempt {n} returned "
                                        f"{time.monotonic() - deadline:.2f} s past its deadline")
            decision = Decision(decision.op, decision.evidence, decision.expected,
                                decision.error, {"attempt": n,
                                                 "seconds": round(time.monotonic() - started, 4)})
            outcome = post.decide(decision)
            self._fire(outcome.trigger, param, evidence=decision, reason=outcome.reason,
                       **(detail or {}))
            if outcome.trigger != OUTCOMES[op][Result.FAILED]:
                break
            pause_s = self.policy.retry_backoff_s * n
            if time.monotonic() + pause_s >= deadline:
                break  # the step's deadline is spent: no attempt could finish in time
            time.sleep(pause_s)
        step = op.value if param is None else f"{op.value}({param})"
        self._record(report, step, outcome.trigger, outcome.reason, t0, n)
        return outcome

    def _record(self, report: CycleReport | None, step: str, outcome: str, reason: str,
                t0: float, attempts: int) -> None:
        seconds = time.perf_counter() - t0
        if report is not None:
            report.steps.append(StepRecord(step, outcome, seconds, attempts, reason))
        if self.on_step is not None:
            self.on_step(step, outcome, seconds)

    def _expected(self, target: WeightTarget, *, first_since_reset: bool = True) -> Expected:
        scored = self._scored(target)
        return Expected(label=target.label, identity=target.identity,
                        probe_tokens=None if scored else target.probe_tokens,
                        probe_logprobs=target.probe_logprobs if scored else None,
                        tolerance=self.policy.probe_tolerance,
                        first_since_reset=first_since_reset)

    def request_detail(self, target: WeightTarget) -> dict[str, Any]:
        """What an update request names: the target's label, identity and probe (every
        later step about the target must name the same: rolloutcore.check.claims)."""
        e = self._expected(target)
        # The checkpoint too: a controller that recovers from the journal (a successor
        # after a failover) can then catch members up to a generation decided but not yet
        # published on them.
        # And how long the drain may wait for bound rollouts: the closed window's first
        # term (the trace checker holds the window to it plus the attempts' deadlines).
        drain = self.policy.abort_after_s if self.policy.drain_policy is \
            DrainPolicy.WAIT_THEN_ABORT else self.policy.drain_timeout_s
        return {**request_detail(target.label, target.identity, target.probe_prompt,
                                 e.probe_tokens, e.probe_logprobs, e.tolerance),
                "checkpoint": target.source, "drain_s": float(drain),
                **({"adapter": target.adapter} if target.adapter is not None else {})}

    @staticmethod
    def named(target: WeightTarget) -> dict[str, Any]:
        """How a step that acts on a target names it."""
        return {"target": target.label, "identity": target.identity}

    def _probe_call(self, target: WeightTarget, deadline: float) -> Any:
        scored = self._scored(target)
        return self.adapter.probe(target.probe_prompt, 1 if scored else len(target.probe_tokens),
                                  deadline, scored=scored)

    def _scored(self, target: WeightTarget) -> bool:
        """Whether ``target``'s probe is scored: the policy asks for it, the target has a
        scored reference and the engine takes scored probes (an adapter that says
        ``scored_probes = False``, a LoRA engine's, is probed greedily, every time: its
        audits run beside served requests)."""
        return (self.policy.probe_mode is ProbeMode.SCORED and target.probe_logprobs is not None
                and bool(getattr(self.adapter, "scored_probes", True)))

    # ----------------------------------------------------------------------- bootstrap

    def bootstrap(self, initial: WeightTarget) -> Outcome:
        """Read a fresh engine; commit ``initial`` as generation 1 only if it is verified.
        A definite mismatch is not retried."""
        if initial.generation != 1:
            raise ValueError("the bootstrap target is generation 1")

        outcome = self._idempotent(None, Op.BOOTSTRAP, None,
                                   self.attempt_of(Op.BOOTSTRAP, target=initial),
                                   self._bootstrap_detail(initial))
        self._bootstrapped(initial, outcome)
        return outcome

    @staticmethod
    def _bootstrap_detail(initial: WeightTarget) -> dict[str, Any]:
        return {"checkpoint": initial.source, "label": initial.label}

    def _bootstrapped(self, initial: WeightTarget, outcome: Outcome) -> None:
        if outcome.trigger == Trigger.BOOTSTRAP_OK:
            self.targets[1] = initial
            self.controller.identity = initial.identity

    # ---------------------------------------------------------- one step at a time

    def attempt_of(self, op: Op, param: str | None = None, target: WeightTarget | None = None,
                   *, first_since_reset: bool = True) -> Callable[[float], Decision]:
        """One attempt of idempotent operation ``op``: the adapter calls and the decision
        they are judged by (``target``: what bootstrap, validate, probe and fence are
        about, for an audit the committed generation; ``first_since_reset``: whether prefix
        hits may prove stale reuse)."""
        a = self.adapter
        if op in (Op.PAUSE, Op.PAUSE_ABORT):
            mode = PauseMode.ABORT if op is Op.PAUSE_ABORT else PauseMode.WAIT
            return lambda d: Decision(op, (a.pause(mode, d),))
        if op is Op.RESUME:
            return lambda d: Decision(Op.RESUME, (a.resume(d),))
        if op is Op.RESET:
            tier = str(param)
            return lambda d: Decision(Op.RESET, (a.reset_cache(tier, d),))
        if target is None:
            raise ValueError(f"{op} needs the target it is about")
        t = target
        if op is Op.BOOTSTRAP:
            return lambda d: Decision(Op.BOOTSTRAP, (a.read_state(d), self._probe_call(t, d)),
                                      self._expected(t))
        if op is Op.VALIDATE:
            return lambda d: Decision(Op.VALIDATE, (a.read_state(d),), self._expected(t))
        if op is Op.PROBE:
            return lambda d: Decision(Op.PROBE, (self._probe_call(t, d),), self._expected(
                t, first_since_reset=first_since_reset))
        if op is Op.FENCE:
            return self._fence_attempt(t)
        if op is Op.AUDIT:
            return self._audit_attempt(t)
        raise ValueError(f"{op} is not an idempotent operation")

    def _fence_attempt(self, target: WeightTarget | str) -> Callable[[float], Decision]:
        label = taint_label(target)
        return lambda d: Decision(Op.FENCE, (self.adapter.fence(label, d),))

    def _audit_attempt(self, target: WeightTarget) -> Callable[[float], Decision]:
        """One attempt of the audit against ``target`` (the committed generation): the
        read, then the probe unless the read decided already."""
        expected = self._expected(target, first_since_reset=False)

        def attempt(deadline: float) -> Decision:
            report = self.adapter.read_state(deadline)
            read_only = Decision(Op.AUDIT, (report,), expected)
            if report.paused is None or report.label is None or report.identity is None \
                    or post.decide(read_only).trigger == Trigger.AUDIT_MISMATCH:
                return read_only
            return Decision(Op.AUDIT, (report, self._probe_call(target, deadline)), expected)

        return attempt

    def perform(self, op: Op, param: str | None = None, target: WeightTarget | None = None,
                *, first_since_reset: bool = True) -> Outcome:
        """One attempt of one operation, journalled: begin, the calls, the decision, the
        outcome; no retry, no follow-up. The spec-generated tours drive the runner step
        by step with it (the cycle above strings the same attempts together)."""
        if op is Op.MUTATE:
            if target is None:
                raise ValueError("mutate needs its target")
            return self._mutate(target, None)
        if op is Op.READMIT:
            raise ValueError("re-admission is one procedure: call readmit()")
        outcome = self._idempotent(None, op, param, self.attempt_of(
            op, param, target, first_since_reset=first_since_reset),
            self._bootstrap_detail(target) if op is Op.BOOTSTRAP and target else None,
            retry=False)
        if op is Op.BOOTSTRAP and target is not None:
            self._bootstrapped(target, outcome)
        return outcome

    def publish(self, target: WeightTarget) -> None:
        """Commit a verified target (the controller checks the spec allows it)."""
        self.targets[target.generation] = target
        with self._identity_swap(target):
            self._fire(Trigger.PUBLISH, label=target.label, identity=target.identity,
                       checkpoint=target.source)

    # -------------------------------------------------------------------- update cycle

    def update(self, target: WeightTarget, *, source: str | None = None) -> CycleReport:
        """One full transition to ``target``; returns what happened, step by step.
        ``source``: where a staging reads the target's bytes instead (a peer)."""
        report = self.prepare(target, source=source)
        if report.prepared:
            self.commit(report)
        return report

    def prepare(self, target: WeightTarget, report: CycleReport | None = None, *,
                staging: Staging | None = None, source: str | None = None) -> CycleReport:
        """Every step of the transition up to the publish: on success the engine runs the
        verified target, admissions still closed (RESUMING with all evidence). A fleet
        prepares all its members, then commits the ones it publishes on; it passes a
        ``report`` of its own to read while the cycle runs (a tainted member's fence may
        still be in flight when the fleet decides). ``staging``: the target staged already
        (:meth:`stage`: a fleet stages every member before any closes); else a runner
        that stages does so first."""
        c = self.controller
        self._check_next(target)
        if report is None:
            report = CycleReport(target, published=False, final_phase=c.phase)
        report.started = time.perf_counter()
        try:
            session = staging if staging is not None else (
                self.stage(target, report, source=source) if self.stages else None)
            if session is not None or not self.stages:
                self._cycle(target, report, session)
        finally:
            self._settle(report)
        return report

    @property
    def stages(self) -> bool:
        """Whether this runner stages its updates (the policy asks, the adapter can)."""
        return (self.policy.staged and isinstance(self.adapter, Stager)
                and bool(getattr(self.adapter, "stages_updates", True)))

    def _check_next(self, target: WeightTarget) -> None:
        committed = self.controller.control.committed
        if target.generation != committed + 1:
            raise ValueError(f"target generation {target.generation} is not the next one "
                             f"after {committed}")

    def stage(self, target: WeightTarget, report: CycleReport, *,
              source: str | None = None) -> Staging | None:
        """Stage ``target`` on every rank while the engine serves; the session with every
        rank prepared, or None: the staging was refused (journalled ``stage_fail``),
        nothing served touched, the engine still READY on its generation. Each rank's
        receive kind is decided from its evidence (postconditions), each step taken by
        the staged spec's table. ``source``: where the bytes are read instead of the
        target's checkpoint (a peer engine: :class:`PeerSource`); journalled, while the
        target (its checkpoint, which a successor recovers from) stays the trainer's."""
        adapter = self.adapter
        assert isinstance(adapter, Stager)
        self._check_next(target)
        read = target if source is None else replace(target, source=source)
        t0 = time.perf_counter()
        seconds = self.policy.mutation_deadline(target)
        deadline = time.monotonic() + seconds
        try:
            ranks = int(call_with_deadline(lambda: adapter.stage_ranks(deadline), seconds,
                                           "stage_ranks"))
        except Exception as e:
            self.refuse_stage(report, f"the engine's ranks could not be read: {e}", t0)
            return None
        session = Staging(ranks, self.controller.control.committed)
        session.step("stage_begin")
        self.controller.note("stage_begin", None, {
            **self.named(target), "source": read.source,
            "generation": target.generation, "ranks": ranks,
            "deadline_s": round(seconds, 3)})
        why = ""
        try:
            ev = call_with_deadline(lambda: adapter.stage(read, deadline), seconds,
                                    "stage", self.stuck_calls)
            by_rank = {s.rank: s for s in ev.stages}
        except Exception as e:
            by_rank, why = {}, f"{type(e).__name__}: {e}"
        kinds: dict[int, str] = {}
        for r in range(1, ranks + 1):
            st = by_rank.get(r) or RankStage(r, None, False, error=why or "no answer")
            kinds[r] = post.receive_kind(target.identity, st)
            session.step("receive", r, kinds[r])
            self.controller.note("stage_receive", str(r), {
                "kind": kinds[r], "rank_stage": evidence_to_json(st)})
            report.staged_bytes += st.nbytes
        bad = {r: k for r, k in kinds.items() if k != "exact"}
        if bad:
            def why_not(r: int) -> str:
                st = by_rank.get(r)
                return (st.error if st is not None else why) or "another identity"
            self._stage_refused(report, session, ", ".join(
                f"rank {r}: {k} ({why_not(r)})" for r, k in bad.items()), t0)
            return None
        for r in range(1, ranks + 1):
            session.step("prepare", r)
            self.controller.note("stage_prepare", str(r), None)
        report.staging_s = time.perf_counter() - t0
        report.staged = True
        self._record(report, "stage", "prepared", f"{ranks} rank(s) hold the target's "
                     f"{report.staged_bytes} bytes", t0, 1)
        return session

    def refuse_stage(self, report: CycleReport, reason: str, t0: float | None = None) -> None:
        """A staging refused before it began: nothing asked of the engine, no staging
        step taken (so none journalled), the engine READY on its generation."""
        report.staging_refused = reason
        self._record(report, "stage", "refused", reason,
                     time.perf_counter() if t0 is None else t0, 1)

    def cancel_stage(self, report: CycleReport, session: Staging, reason: str) -> None:
        """A prepared staging that will not be installed (another member's was refused):
        refused all the same (``stage_fail``), its buffers discarded."""
        self._stage_refused(report, session, reason, time.perf_counter())

    def _stage_refused(self, report: CycleReport, session: Staging, reason: str,
                       t0: float) -> None:
        session.step("stage_fail")
        self.controller.note("stage_fail", None, {"reason": reason})
        report.staging_refused = reason
        self._discard_stage()
        report.staging_s = time.perf_counter() - t0
        self._record(report, "stage", "refused", reason, t0, 1)

    def _discard_stage(self) -> None:
        """Drop staged buffers, best effort: they are inactive, so one left behind costs
        memory, never correctness (the next staging replaces it)."""
        adapter = self.adapter
        if isinstance(adapter, Stager):
            with suppress(Exception):  # best effort, see above
                adapter.discard_stage(time.monotonic() + self.policy.step_timeout_s)

    def commit(self, report: CycleReport) -> None:
        """Publish a prepared target: admissions reopen on the new generation."""
        if not report.prepared:
            raise ValueError("the transition was not prepared")
        self.publish(report.target)
        report.published = True
        report.prepared = False
        self._settle(report)

    def withdraw(self, report: CycleReport, reason: str) -> None:
        """A prepared target that will not be published (the fleet aborted): the engine
        holds it, so it gives up (TAINTED, fenced) and waits for a verified re-admission
        onto the committed generation."""
        if not report.prepared:
            raise ValueError("the transition was not prepared")
        report.prepared = False
        self._fire(Trigger.GIVE_UP, reason=reason)
        self._settle(report)

    def _settle(self, report: CycleReport) -> None:
        c = self.controller
        if c.phase is Phase.TAINTED and report.tainted_after_s is None:
            report.tainted_after_s = time.perf_counter() - report.started
            report.fenced = self.fence(report.target, report)
        report.final_phase = c.phase
        report.total_s = time.perf_counter() - report.started
        report.stuck_calls = list(self.stuck_calls)

    def _drain(self, report: CycleReport) -> bool:
        """Wait for bound rollouts per the drain policy; True once none is bound."""
        c, policy = self.controller, self.policy
        t0 = time.perf_counter()
        abort = policy.drain_policy is DrainPolicy.WAIT_THEN_ABORT
        drained = c.wait_drained(policy.abort_after_s if abort else policy.drain_timeout_s)
        if not drained and abort:
            for rid in c.bound_ids():
                try:
                    c.abort(rid, {"reason": f"still running {policy.abort_after_s} s into the "
                                            "drain"})
                except IllegalTransition:  # released meanwhile by its own thread
                    continue
                report.aborted.append(rid)
            drained = c.bound_count() == 0
        report.drain_wait_s = time.perf_counter() - t0
        what = "drained" if drained else "timeout"
        if report.aborted:
            what = f"aborted {len(report.aborted)}"
        self._record(report, "drain", what, f"{c.bound_count()} bound", t0, 1)
        return drained

    def _cycle(self, target: WeightTarget, report: CycleReport,
               session: Staging | None = None) -> None:
        opened = time.perf_counter()
        try:
            self._cycle_steps(target, report, session)
        finally:
            report.window_s = time.perf_counter() - opened

    def _cycle_steps(self, target: WeightTarget, report: CycleReport,
                     session: Staging | None) -> None:
        try:
            self._fire(Trigger.REQUEST_UPDATE, **self.request_detail(target),
                       **_staged_detail(session))
            self.requested = target  # what a later fence names while it is in doubt
        except IllegalTransition as e:  # not now (a fleet's guard, read as the step is
            # taken: the member may not leave service): the update never began
            self._record(report, "request_update", "refused", e.reason,
                         time.perf_counter(), 1)
            if session is not None:
                self._stage_refused(report, session, f"the update was not requested: "
                                    f"{e.reason}", time.perf_counter())
            return
        if session is not None:
            session.step("close")  # admissions closed with every rank prepared
        if not self._drain(report):
            self._fire(Trigger.CANCEL_UPDATE, reason="drain timeout", **self.named(target))
            self._abandon(session)
            return
        op = Op.PAUSE_ABORT if report.aborted else Op.PAUSE
        pause = self._idempotent(report, op, None, self.attempt_of(op))
        if pause.trigger != OUTCOMES[op][Result.OK]:
            # A failed pause may have taken effect: the engine must run again before
            # admissions reopen (the spec's cancel_update requires it).
            if self._resume(report):
                self._fire(Trigger.CANCEL_UPDATE, reason=pause.reason, **self.named(target))
                self._abandon(session)
            return
        if self._mutate(target, report, session).trigger != Trigger.MUTATE_OK:
            if self._in(Phase.QUIESCED):  # refused with proof: resume the old generation
                self._fire(Trigger.ABANDON_UPDATE)
                if self._resume(report):
                    self._fire(Trigger.REOPEN)
            return
        for tier in TIERS:
            r = self._idempotent(report, Op.RESET, tier, self.attempt_of(Op.RESET, tier))
            if r.trigger != Trigger.RESET_OK:
                self._fire(Trigger.GIVE_UP, reason=r.reason)
                return
        self._fire(Trigger.INVALIDATED)
        v = self._idempotent(report, Op.VALIDATE, None, self.attempt_of(Op.VALIDATE,
                                                                         target=target))
        if v.trigger == Trigger.VALIDATE_MISMATCH:
            return
        if v.trigger != Trigger.VALIDATE_OK:
            self._fire(Trigger.GIVE_UP, reason=v.reason)
            return
        if not self._resume(report):
            return
        attempts: list[int] = []
        first = self.attempt_of(Op.PROBE, target=target)
        later = self.attempt_of(Op.PROBE, target=target, first_since_reset=False)

        def probe_attempt(deadline: float) -> Decision:
            # Prefix hits prove stale reuse only on the first request after invalidation:
            # a failed earlier attempt may have cached blocks under the new weights.
            attempts.append(1)
            return (first if len(attempts) == 1 else later)(deadline)

        p = self._idempotent(report, Op.PROBE, None, probe_attempt)
        if p.trigger == Trigger.PROBE_MISMATCH:
            return
        if p.trigger != Trigger.PROBE_OK:
            self._fire(Trigger.GIVE_UP, reason=p.reason)
            return
        report.prepared = True

    def fence(self, target: WeightTarget | str, report: CycleReport | None = None) -> bool:
        """TAINTED: pause the engine in abort mode and relabel it, best effort (bounded by
        the fence deadline); True if the fence is confirmed. ``target`` may be the label
        alone (after a restart the journal names it; the weights need not be known)."""
        outcome = self._idempotent(report, Op.FENCE, None, self._fence_attempt(target))
        return outcome.trigger == Trigger.FENCE_OK

    def audit(self, target: WeightTarget | None = None, *, why: str = "audit") -> Outcome:
        """Is the engine still the one verified? Its process can be replaced behind the
        controller's back (a restart, a relaunch, an operator) with other weights or
        another label, and nothing the controller holds shows it. So read it again, as the
        spec's ``audit`` says: label, weight identity and run state, then a probe (skipped
        when the read already decides). One attempt (deadline: the policy's
        ``step_timeout_s``), journalled with ``why``, decided by
        :func:`rolloutcore.engine.postconditions.decide`:

        * ``audit_ok``: every piece of evidence is (again) in hand;
        * ``audit_mismatch``: definitely not the engine verified: TAINTED, and the engine
          is fenced at once (its bound rollouts are released as aborted);
        * ``audit_failed``: unreachable or unreadable: the evidence is dropped, no
          admission and no update until an audit passes.

        ``target`` describes the committed generation (default: the one the runner
        committed). The fleet audits its members with it (:meth:`rolloutcore.fleet.Fleet.audit`).
        """
        c = self.controller
        if target is None:
            target = self.targets.get(c.control.committed)
            if target is None:
                raise ValueError(f"no target known for generation {c.control.committed}")
        if target.generation != c.control.committed:
            raise ValueError(f"an audit is against the committed generation "
                             f"{c.control.committed}, not {target.generation}")
        outcome = self._idempotent(None, Op.AUDIT, None, self._audit_attempt(target),
                                   {"why": why}, retry=False)
        if c.phase is Phase.TAINTED:
            self.fence(target)
        return outcome

    def readmit(self, target: WeightTarget, *, who: str) -> Outcome:
        """Verified re-admission of a TAINTED engine onto the committed generation
        (``target`` describes it: label, identity, checkpoint, probe): pause in abort mode,
        close any transfer session a failed update left open, reload, reset every tier,
        read label and identity, resume, probe. Only if every
        piece of evidence holds does the engine serve again. One attempt, never automatic:
        ``who`` asked for it, and the journal says so."""
        c = self.controller
        if target.generation != c.control.committed:
            raise ValueError(f"re-admission is onto the committed generation "
                             f"{c.control.committed}, not {target.generation}")
        deadline_s = self.policy.mutation_deadline(target) + 4 * self.policy.step_timeout_s
        self._fire(Trigger.READMIT_BEGIN, who=who, target=target.label,
                   identity=target.identity, checkpoint=target.source,
                   deadline_s=round(deadline_s, 3))
        deadline = time.monotonic() + deadline_s
        evidence: list[Any] = []
        error: str | None = None
        try:
            evidence.append(self.adapter.pause(PauseMode.ABORT, deadline))
            # A transfer session a failed update left open would refuse the reload.
            close = getattr(self.adapter, "close_transfer_session", None)
            if close is not None:
                close(deadline)
            evidence.append(self._collective.call(
                lambda: self.adapter.mutate(target, deadline), remaining(deadline),
                "readmit_reload", self.stuck_calls))
            evidence += [self.adapter.reset_cache(t, deadline) for t in TIERS]
            evidence.append(self.adapter.read_state(deadline))
            evidence.append(self.adapter.resume(deadline))
            evidence.append(self._probe_call(target, deadline))
        except (AdapterError, DeadlineExceeded, OSError) as e:
            error = f"{type(e).__name__}: {e}"
        decision = Decision(Op.READMIT, tuple(evidence), self._expected(target))
        outcome = post.decide(decision)
        if error is not None and outcome.trigger == Trigger.READMIT_FAILED:
            outcome = Outcome(outcome.trigger, f"{outcome.reason} ({error})")
        self._fire(outcome.trigger, evidence=decision, reason=outcome.reason)
        if outcome.trigger == Trigger.READMIT_OK:
            self.targets[target.generation] = target
            self.controller.identity = target.identity
        elif c.phase is Phase.TAINTED:
            # Still out: fenced again (the reload may have left other weights under a
            # serving label), labelled after the update in doubt if there is one.
            pending = c.control.target
            doubt = self.requested if pending else target
            if doubt is not None and doubt.generation == (pending or target.generation):
                self.fence(doubt)
        return outcome

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

    def _resume(self, report: CycleReport) -> bool:
        r = self._idempotent(report, Op.RESUME, None, self.attempt_of(Op.RESUME))
        if r.trigger != Trigger.RESUME_OK:
            # Every attempt within the step's deadline failed: the engine is not known to
            # run (after a failed pause it may be paused, or gone). Fail closed now, so
            # that the cycle ends in a phase a fleet can decide on (the spec's give_up).
            self._fire(Trigger.GIVE_UP, reason=f"resume: {r.reason}")
            return False
        return True

    def _abandon(self, session: Staging | None) -> None:
        """The staged update ends before any rank installed (spec/staged.py abandon)."""
        if session is not None:
            session.step("abandon")
            self._discard_stage()

    def _mutate(self, target: WeightTarget, report: CycleReport | None,
                session: Staging | None = None) -> Outcome:
        """The collective: never retried; a timeout or unknown error is ambiguous. A
        staged target's mutation installs its prepared buffers (``Stager.install``)."""
        seconds = self.policy.mutation_deadline(target)
        t0 = time.perf_counter()
        self._fire(Trigger.MUTATE_BEGIN, **self.named(target), deadline_s=round(seconds, 3),
                   **_staged_detail(session))
        deadline = time.monotonic() + seconds
        adapter = self.adapter
        call: Callable[[], MutationEvidence] = (
            (lambda: adapter.install(target, deadline)) if session is not None
            and isinstance(adapter, Stager) else (lambda: adapter.mutate(target, deadline)))
        try:
            ev = self._collective.call(call, seconds, "mutate", self.stuck_calls)
        except DeadlineExceeded as e:
            ev = MutationEvidence(MutationOutcome.AMBIGUOUS, str(e), time.perf_counter() - t0)
        except AdapterError as e:
            kind = MutationOutcome.NOT_MUTATED if e.proven_no_effect else MutationOutcome.AMBIGUOUS
            ev = MutationEvidence(kind, f"{type(e).__name__}: {e}", time.perf_counter() - t0)
        except Exception as e:  # unclassifiable: may or may not have happened
            ev = MutationEvidence(MutationOutcome.AMBIGUOUS, f"{type(e).__name__}: {e}",
                                  time.perf_counter() - t0)
        decision = Decision(Op.MUTATE, (ev,))
        if ev.outcome is MutationOutcome.NOT_MUTATED:
            decision = self._refusal_read(ev)
        outcome = post.decide(decision)
        self._fire(outcome.trigger, evidence=decision, reason=outcome.reason)
        self._record(report, "mutate", outcome.trigger, outcome.reason, t0, 1)
        if session is not None:  # the staged spec's install outcome, from the same one
            if outcome.trigger == Trigger.MUTATE_OK:
                session.install_all()
            elif outcome.trigger == Trigger.MUTATE_AMBIGUOUS:
                session.step("install", 1, False)
            else:
                self._abandon(session)
        return outcome

    def _refusal_read(self, ev: MutationEvidence) -> Decision:
        """A refusal counts only with a read showing the engine still on the committed
        generation (postconditions decide): the engine's label and identity, read within a
        step's deadline, against the committed generation's reference."""
        committed = self.targets.get(self.controller.control.committed)
        expected = None if committed is None else self._expected(committed)
        try:
            read = self.adapter.read_state(time.monotonic() + self.policy.step_timeout_s)
        except (AdapterError, DeadlineExceeded, OSError) as e:
            observed = f"{ev.observed}; the read after it failed: {type(e).__name__}: {e}"
            return Decision(Op.MUTATE, (replace(ev, observed=observed),), expected)
        return Decision(Op.MUTATE, (ev, read), expected)

    # ---------------------------------------------------------------- rollouts (the app)

    @contextmanager
    def rollout(self, rollout_id: str, *, wait: float = 0.0) -> Iterator[Binding]:
        """Bind a rollout to the committed generation for the duration of the block; with
        ``wait``, an admission while admissions are closed waits for them to reopen."""
        with self.controller.rollout(rollout_id, wait=wait) as binding:
            yield binding

    def generate(self, rollout_id: str, prompt: tuple[int, ...], max_tokens: int, *,
                 wait: float = 0.0) -> tuple[Binding, GenerationResult]:
        """Admit, generate, release: the result is bound to one committed generation. A
        rollout the drain aborted comes back with ``binding.aborted`` set (its output is
        partial, never counted in the next generation)."""
        self.controller.admit(rollout_id, wait=wait)
        try:
            result = self.adapter.generate(prompt, max_tokens)
        finally:
            binding = self.controller.release(rollout_id)
        return binding, result

    def label_of(self, generation: int) -> str:
        return self.targets[generation].label


def rollout_record(runner: LifecycleRunner, rollout_id: str, prompt: Sequence[int],
                   max_tokens: int, decoding: Decoding | None = None) -> TrajectoryRecord:
    """Run one rollout through the runner (admit, generate, release) and record it: the
    binding is the controller's, the label the runner's for that very generation."""
    from rolloutcore.trajectories.format import Timing, greedy, record_from

    prompt_t = tuple(prompt)
    started, t0 = time.time(), time.monotonic()
    binding, result = runner.generate(rollout_id, prompt_t, max_tokens)
    timing = Timing(started, time.monotonic() - t0)
    return record_from(binding, runner.label_of(binding.generation), prompt_t, result,
                       decoding if decoding is not None else greedy(max_tokens), timing)


__all__ = ["CallPool", "CycleReport", "DeadlineExceeded", "DrainPolicy", "LifecycleRunner",
           "ProbeMode", "RunnerPolicy", "call_with_deadline", "rollout_record", "taint_label"]
