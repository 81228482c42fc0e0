"""Spec-generated conformance: tours of the spec's state graph, replayed on an engine.

The spec's explored graph is the test plan. An *edge class* is an action the controller
can observe (every kind but the engine's own ``environment`` steps) taken from one
source phase: ``mutate_ambiguous`` from UPDATING, ``restart_tainted`` from QUIESCED. The
tour covers every class with as few schedules as a greedy cover finds, each one a path
of the graph from an initial state.

A path is executable because every step is either the controller's (fired as the spec
names it), the application's (admit and release a real rollout on the engine), the
engine's own (a request ends: the tour waits for it), a controller restart (the journal
reopened by a new controller), or an operation: the runner's one attempt of it
(:meth:`~rolloutcore.engine.runner.LifecycleRunner.perform`), with the fault that makes the
engine produce the outcome the path needs (:data:`MEANS`: a reply of 500 from the fault
proxy, a dropped connection, a checkpoint with other content than declared, a broken
checkpoint, another initial checkpoint). Where an outcome has several possible worlds
(a failed pause may or may not have paused the engine), the means says which world it
produces, and the cover only uses edges into that world.

At every step the run must agree with the path: the decided outcome is the one the path
predicts, the controller's state is the path's, and the engine's observable state
(label, weight identity, paused, nothing running) is the one the spec's ghost variables
say, where they are observable. At the end, the journal's steps equal the path's and
the trace checker accepts the journal. Some classes cannot be produced on a real vLLM
server without patching it; :func:`coverage` says which, and why.

Random walks (:func:`decode_walk`) pick among the same realisable edges from a list of
choices, so Hypothesis can shrink a failing walk to a minimal schedule, printed with the
command that replays it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.check.trace import check_file
from rolloutcore.conformance.engines import HarnessEngine
from rolloutcore.engine.controller import Controller, bindings_of, control_of, slot_id
from rolloutcore.engine.runner import LifecycleRunner, RunnerPolicy
from rolloutcore.journal import Journal, JournalReader, open_controller
from rolloutcore.spec.lifecycle import (
    BROKEN,
    MIXED,
    NO_OP,
    SPEC,
    TAINT,
    Action,
    Bounds,
    Kind,
    Param,
    Phase,
    Result,
    Spec,
    State,
)
from rolloutcore.spec.triggers import Op, Trigger

#: Bounds of the tour's graph: one rollout slot is enough for every edge class (a second
#: only multiplies interleavings); three generations let a path update twice.
TOUR_BOUNDS = Bounds(rollouts=1, generations=3, faults=2)
#: Checkpoints: generation -> checkpoint the tour declares for it; OTHER is content no
#: generation declares (a fresh engine holding other weights, a wrong checkpoint).
CHECKPOINTS = {1: "v1", 2: "v2", 3: "v1"}
OTHER = "v1neg"

EdgeClass = tuple[str, Phase]  # (action, source phase)


def edge_class(a: Action, s: State) -> EdgeClass:
    return (a.name, s.phase)


def class_name(c: EdgeClass) -> str:
    return f"{c[0]}@{c[1].value}"


def observable(a: Action) -> bool:
    """The controller sees it: everything but the engine's own steps."""
    return a.kind is not Kind.ENVIRONMENT


# ------------------------------------------------------------------------------ means


@dataclass(frozen=True)
class Means:
    """How an engine is made to produce one outcome: the faults to inject (an adapter
    operation and a cause from INJECTABLE), an armed mutation, and which of the outcome's
    possible worlds that produces (``world(before, after)``). ``vllm`` is None when the
    real engine can do it; otherwise why it cannot."""

    what: str
    faults: tuple[tuple[str, str], ...] = ()
    arm: str | None = None  # refused | wrong_checkpoint | sim:<kind>
    world: Callable[[State, State], bool] = lambda _s, _t: True
    vllm: str | None = None

    @property
    def unsafe(self) -> bool:
        """It points the engine at a deliberately broken checkpoint (refused before the
        load by the worker extension, but not what ``--safe`` promises)."""
        return self.arm == "refused"


@dataclass(frozen=True)
class Capability:
    """What the tour may do to the engine: its kind (``sim`` or ``vllm``) and, with
    ``safe``, only what leaves the server as it found it."""

    kind: str
    safe: bool = False


#: Why ``--safe`` leaves a class out.
SAFE_REASON = "--safe: it points the server at a deliberately broken checkpoint"


def _same_ghost(s: State, t: State) -> bool:
    return (s.weights, s.label, s.paused, s.caches) == (t.weights, t.label, t.paused,
                                                         t.caches)


def _committed_weights(s: State, _t: State) -> bool:
    return s.weights == s.committed and s.label == s.committed


NO_FAULT = Means("no fault")
_HTTP_500 = "the fault proxy answers 500 before the request reaches the engine"
_PAUSE_LOST = Means("pause: the engine pauses, the connection drops before its reply",
                    (("pause", "drop"),), world=lambda _s, t: t.paused)
#: Alternatives per outcome, each producing one of its worlds (the first that fits).
MEANS: dict[str, tuple[Means, ...]] = {
    "bootstrap_failed": (Means(f"read_state: {_HTTP_500}", (("read_state", "http_500"),)),),
    "pause_failed": (Means(f"pause: {_HTTP_500} (the engine keeps running)",
                           (("pause", "http_500"),), world=_same_ghost), _PAUSE_LOST),
    "pause_abort_failed": (Means(f"pause: {_HTTP_500} (the engine keeps running)",
                                 (("pause", "http_500"),), world=_same_ghost), _PAUSE_LOST),
    "mutate_ok_unlabelled": (Means(
        "the adapter finalises without the target's label (the original bug)",
        arm="sim:unlabelled",
        vllm="needs an adapter that skips the finalise; RolloutCore's HTTP adapter "
        "always finalises the label and checks the answer"),),
    "mutate_ok_wrong_weights": (Means(
        f"vLLM's own reload_weights pointed at {OTHER} (same names and shapes, other "
        "content) reports success; the adapter finalises the target's label",
        arm="wrong_checkpoint"),),
    "mutate_ok_broken": (Means(
        "weights that read as the target's to the identity digest but compute as others",
        arm="sim:miscompute",
        vllm="needs a loader that reports success and a digest of the target while other "
        "tensors compute (e.g. left on the meta device); the CPU build cannot be made to "
        "without patching vLLM"),),
    "mutate_refused": (Means("a checkpoint whose manifest the worker extension refuses "
                             "before touching the model", arm="refused"),),
    "mutate_ambiguous": (Means(
        "the connection is dropped before the request reaches the engine: the adapter "
        "cannot tell whether anything moved", (("mutate", "refuse"),), world=_same_ghost),),
    "reset_failed": (Means(f"the tier's reset: {_HTTP_500}", (("reset", "http_500"),),
                           world=_same_ghost),),
    "validate_failed": (Means(f"read_state: {_HTTP_500}", (("read_state", "http_500"),)),),
    # The resume's evidence is the engine's run state read back: a resume answered 500
    # on an engine that runs reads as resumed. Only a paused engine can fail to resume.
    "resume_failed": (Means(f"resume: {_HTTP_500} (the engine stays paused)",
                            (("resume", "http_500"),), world=lambda s, _t: s.paused),),
    "probe_failed": (Means(f"probe: {_HTTP_500}", (("probe", "http_500"),)),),
    "fence_failed": (Means(f"the fence's pause and relabel: {_HTTP_500}",
                           (("fence", "http_500"),), world=_same_ghost),),
    "readmit_ok": (Means("the committed checkpoint, reloaded", world=_committed_weights),),
    "readmit_mismatch": (Means(
        f"the reload installs {OTHER} although the committed checkpoint is declared",
        arm="wrong_checkpoint",
        world=lambda s, _t: s.weights == MIXED and s.label == s.committed),),
    "audit_failed": (Means(f"read_state: {_HTTP_500}", (("read_state", "http_500"),)),),
    # Not an outcome: the engine's process replaced behind the controller's back (what
    # an audit must find), onto content no generation declares, under the startup label.
    "engine_restart": (Means(
        f"the engine is replaced out of band by one on {OTHER} under its startup label",
        world=lambda s, t: t.weights == MIXED and t.label == 1 and not any(s.req)),),
    "readmit_failed": (Means(f"the probe after the reload: {_HTTP_500}",
                             (("probe", "http_500"),),
                             world=lambda s, t: _committed_weights(s, t) and not t.paused),),
}


def means_of(a: Action) -> tuple[Means, ...]:
    return MEANS.get(a.name, (NO_FAULT,))


def means_for(a: Action, s: State, t: State, cap: Capability) -> Means | None:
    """The first means that makes the engine take edge (s, a, t), if any."""
    return next((m for m in means_of(a)
                 if m.world(s, t) and not (cap.kind == "vllm" and m.vllm is not None)
                 and not (cap.safe and m.unsafe)), None)


def _op_of(a: Action) -> Op | None:
    return Op(a.op) if a.op is not None else None


def realisable(a: Action, s: State, t: State, cap: Capability) -> bool:
    """Whether the tour can make the engine take edge (s, a, t)."""
    if a.kind is Kind.RESTART:
        # The tour crashes the controller with the call in flight not yet made, so the
        # engine is as it was; re-admission changes the engine at its begin: never
        # interrupted (its outcome follows its begin).
        return s.pending != Op.READMIT.value and _same_ghost(s, t)
    if a.name == "readmit_begin":
        return t.weights in (s.committed, MIXED) and t.label == s.committed
    if a.kind is Kind.CONTROL and s.pending != NO_OP:
        # The tour makes an operation's one call at once (begin, call, outcome): what the
        # controller does meanwhile (admissions during an audit) the fleet tests exercise.
        return False
    return means_for(a, s, t, cap) is not None


def initial_checkpoint(s0: State) -> str:
    return CHECKPOINTS[1] if s0.weights == 1 else OTHER


# ------------------------------------------------------------------------------ graph


@dataclass(frozen=True)
class Edge:
    action: Action
    param: Param
    source: State
    dest: State

    def label(self) -> str:
        return self.action.name if self.param is None else f"{self.action.name}({self.param})"


@dataclass(frozen=True)
class Schedule:
    """A path of the spec graph from an initial state, and what it was chosen to cover."""

    initial: State
    edges: tuple[Edge, ...]
    covers: tuple[EdgeClass, ...] = ()

    def labels(self) -> list[str]:
        return [e.label() for e in self.edges]

    def classes(self) -> set[EdgeClass]:
        return {edge_class(e.action, e.source) for e in self.edges if observable(e.action)}


class TourGraph:
    """The spec's reachable graph under the tour's bounds, with realisability per engine."""

    def __init__(self, spec: Spec = SPEC, bounds: Bounds = TOUR_BOUNDS) -> None:
        self.spec = spec.with_bounds(bounds)
        self._succ: dict[State, list[Edge]] = {}
        order: list[State] = list(self.spec.initial_states())
        seen = set(order)
        queue = deque(order)
        while queue:
            s = queue.popleft()
            out = [Edge(a, p, s, t) for a, p, t in self.spec.successors(s)]
            self._succ[s] = out
            for e in out:
                if e.dest not in seen:
                    seen.add(e.dest)
                    queue.append(e.dest)

    def successors(self, s: State) -> list[Edge]:
        return self._succ[s]

    @property
    def states(self) -> int:
        return len(self._succ)

    def classes(self) -> list[EdgeClass]:
        """Every observable edge class of the graph, in the spec's action order."""
        found = {edge_class(e.action, e.source) for out in self._succ.values() for e in out
                 if observable(e.action)}
        order = {a.name: i for i, a in enumerate(self.spec.actions)}
        return sorted(found, key=lambda c: (order[c[0]], c[1].value))

    def allowed(self, cap: Capability) -> Callable[[Edge], bool]:
        return lambda e: realisable(e.action, e.source, e.dest, cap)

    def shortest_paths(self, allowed: Callable[[Edge], bool]) -> dict[State, tuple[Edge, ...]]:
        """Breadth-first over allowed edges: a shortest path to every state it reaches."""
        paths: dict[State, tuple[Edge, ...]] = {s: () for s in self.spec.initial_states()}
        queue = deque(paths)
        while queue:
            s = queue.popleft()
            for e in self._succ[s]:
                if e.dest not in paths and allowed(e):
                    paths[e.dest] = (*paths[s], e)
                    queue.append(e.dest)
        return paths


def _initial_of(paths: dict[State, tuple[Edge, ...]], s: State) -> State:
    path = paths[s]
    return path[0].source if path else s


def _completed(graph: TourGraph, path: tuple[Edge, ...],
               allowed: Callable[[Edge], bool]) -> tuple[Edge, ...]:
    """A path ending with an operation in flight gets that operation's outcome (the tour
    makes the call at the begin), the first the engine can be made to produce."""
    while path and path[-1].dest.pending != NO_OP:
        nxt = [e for e in graph.successors(path[-1].dest)
               if e.action.kind is Kind.OUTCOME and allowed(e)]
        if not nxt:
            break
        path = (*path, nxt[0])
    return path


def plan(graph: TourGraph, cap: Capability) -> tuple[list[Schedule], dict[EdgeClass, str]]:
    """A greedy cover of every edge class the engine can realise: for each class not yet
    covered, the shortest allowed path to its nearest edge. Also returns, for each class
    of the graph left uncovered, why."""
    allowed = graph.allowed(cap)
    paths = graph.shortest_paths(allowed)
    covered: set[EdgeClass] = set()
    schedules: list[Schedule] = []
    nearest: dict[EdgeClass, Edge] = {}
    for s in sorted(paths, key=lambda x: len(paths[x])):
        for e in graph.successors(s):
            c = edge_class(e.action, e.source)
            if observable(e.action) and c not in nearest and allowed(e):
                nearest[c] = e
    for c in graph.classes():
        if c in covered or c not in nearest:
            continue
        e = nearest[c]
        path = _completed(graph, (*paths[e.source], e), allowed)
        sched = Schedule(_initial_of(paths, e.source), path, (c,))
        covered |= sched.classes()
        schedules.append(sched)
    reasons = {c: unrealisable_reason(graph, c, cap) for c in graph.classes()
               if c not in covered}
    return schedules, reasons


def unrealisable_reason(graph: TourGraph, c: EdgeClass, cap: Capability) -> str:
    own = MEANS.get(c[0], ())
    if own and cap.kind == "vllm" and all(m.vllm is not None for m in own):
        return "; ".join(str(m.vllm) for m in own)
    if own and cap.safe and all(m.unsafe or (cap.kind == "vllm" and m.vllm) for m in own):
        return SAFE_REASON
    # Reachable only through edges the engine cannot be made to take: name them.
    full = graph.shortest_paths(lambda _e: True)
    allowed = graph.allowed(cap)
    for s in sorted(full, key=lambda x: len(full[x])):
        for e in graph.successors(s):
            if edge_class(e.action, e.source) == c:
                blocked = sorted({x.action.name for x in (*full[s], e) if not allowed(x)})
                return "reachable only through " + ", ".join(blocked)
    return "not reachable within the tour's bounds"


# ------------------------------------------------------------------------- random walks


def decode_walk(graph: TourGraph, cap: Capability, choices: Sequence[int]) -> Schedule:
    """A walk over realisable edges: ``choices[0]`` picks the initial state, each next
    one the step among the edges enabled there. Shrinking the list (fewer, smaller
    choices) shrinks the schedule."""
    allowed = graph.allowed(cap)
    init = graph.spec.initial_states()
    s0 = init[choices[0] % len(init)] if choices else init[0]
    s = s0
    path: list[Edge] = []
    for k in choices[1:]:
        options = [e for e in graph.successors(s) if allowed(e)]
        if not options:
            break
        e = options[k % len(options)]
        path.append(e)
        s = e.dest
    return Schedule(s0, _completed(graph, tuple(path), allowed))


def walk_command(cap: Capability, choices: Sequence[int]) -> str:
    """The command line that replays one walk."""
    safe = " --safe" if cap.safe else ""
    return (f"rolloutcore conformance tour --engine {cap.kind}{safe} --walk "
            f"{','.join(str(c) for c in choices)}")


# --------------------------------------------------------------------------- execution


@dataclass
class StepResult:
    index: int
    step: str
    ok: bool
    message: str = ""


@dataclass
class ScheduleResult:
    schedule: Schedule
    passed: bool
    steps: list[StepResult] = field(default_factory=list)
    diverged_at: int | None = None
    message: str = ""
    journal: str | None = None
    trace: str | None = None
    seconds: float = 0.0

    def realised(self) -> set[EdgeClass]:
        """The classes this run took as the path says, up to where it diverged."""
        end = len(self.schedule.edges) if self.diverged_at is None else self.diverged_at
        return {edge_class(e.action, e.source) for e in self.schedule.edges[:end]
                if observable(e.action)}

    def as_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "steps": self.schedule.labels(),
                "covers": [class_name(c) for c in self.schedule.covers],
                "diverged_at": self.diverged_at, "message": self.message,
                "journal": self.journal, "trace": self.trace,
                "seconds": round(self.seconds, 3)}


class Diverged(Exception):
    """The run left the path: what the path predicted and what happened."""


def tour_policy(engine: HarnessEngine) -> RunnerPolicy:
    """Deadlines generous enough never to decide an outcome: the tour's outcomes come
    from injected causes, not from how fast the machine is."""
    return RunnerPolicy(step_timeout_s=60.0, pause_timeout_s=120.0, fence_timeout_s=60.0,
                        mutation_base_s=120.0, retries=0)


class TourRun:
    """Executes one schedule on an engine, checking it against the path at every step."""

    def __init__(self, engine: HarnessEngine, schedule: Schedule, work_dir: Path, *,
                 safe: bool = False) -> None:
        self.engine = engine
        self.cap = Capability(engine.kind, safe)
        self.schedule = schedule
        self.work_dir = work_dir
        self.journal_path = work_dir / "journal.jsonl"
        self.targets: dict[int, WeightTarget] = {
            g: (engine.initial_target() if g == 1 else engine.target(g, v))
            for g, v in CHECKPOINTS.items()}
        self.rollouts: dict[int, threading.Thread] = {}
        self.first_probe = True
        self.ctl: Controller
        self.journal: Journal
        self.runner: LifecycleRunner

    # ---- set-up

    def _open(self) -> str:
        self.ctl, self.journal, rec = open_controller(self.journal_path, fsync=False)
        carried = getattr(self, "runner", None)
        self.runner = LifecycleRunner(self.ctl, self.engine.adapter, tour_policy(self.engine))
        if carried is not None:
            self.runner.targets.update(carried.targets)
        return str(rec.trigger)

    def run(self) -> ScheduleResult:
        t0 = time.perf_counter()
        res = ScheduleResult(self.schedule, passed=False, journal=str(self.journal_path))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.journal_path.unlink(missing_ok=True)
        self.engine.restore(initial_checkpoint(self.schedule.initial))
        self._open()
        try:
            self._run(res)
            self._finish(res)
        except Diverged as e:
            res.message = str(e)
        finally:
            self.engine.clear_faults()
            self.engine.disarm()
            self.journal.close()
            self._join_all()
            res.seconds = time.perf_counter() - t0
        res.passed = res.diverged_at is None and not res.message
        return res

    def _run(self, res: ScheduleResult) -> None:
        edges = self.schedule.edges
        k = 0
        while k < len(edges):
            e = edges[k]
            try:
                k = self._step(k)
            except Diverged as err:
                res.diverged_at = k
                res.steps.append(StepResult(k, e.label(), False, str(err)))
                raise Diverged(f"step {k} ({e.label()}): {err}") from None
            res.steps.append(StepResult(k, e.label(), True))

    def _finish(self, res: ScheduleResult) -> None:
        self.journal.close()
        steps = [(str(r["step"]), r.get("param")) for _, r in JournalReader(self.journal_path)
                 if r.get("type") != "header"]
        want = [(e.action.trigger, self._param(e)) for e in self.schedule.edges
                if observable(e.action)]
        if steps != want:
            res.diverged_at = len(self.schedule.edges)
            n = next((i for i, (a, b) in enumerate(zip(steps, want, strict=False)) if a != b),
                     min(len(steps), len(want)))
            raise Diverged(f"the journal's steps differ from the path's at record {n + 1}: "
                           f"journal {steps[n:n + 2]}, path {want[n:n + 2]}")
        verdict = check_file(self.journal_path)
        res.trace = verdict.message
        if not verdict.accepted:
            res.diverged_at = len(self.schedule.edges)
            raise Diverged(f"the trace checker rejects the journal: {verdict.message}")

    # ---- one step

    @staticmethod
    def _param(e: Edge) -> str | None:
        if e.param is None:
            return None
        return slot_id(e.param) if e.action.param == "slot" else str(e.param)

    def _step(self, k: int) -> int:
        """Execute edge ``k``; returns the index of the next edge to execute."""
        edges = self.schedule.edges
        e = edges[k]
        a = e.action
        if a.kind is Kind.ENVIRONMENT:
            self._environment(e)
        elif a.kind is Kind.RESTART:
            self.journal.close()
            got = self._open()
            if got != a.trigger:
                raise Diverged(f"the recovered controller took {got}, the path {a.trigger}")
        elif a.result is Result.BEGIN:
            return self._operation(k)
        else:
            self._control(e)
        self._check(e.dest)
        return k + 1

    def _control(self, e: Edge) -> None:
        a, s = e.action, e.source
        fire = self.ctl.fire
        if a.name == "admit":
            self._join(e.param)  # the slot's previous request ended (the path says so)
            self.ctl.admit(slot_id(e.param))
            self._start_rollout(e.param)
        elif a.name == "release":
            self.ctl.release(slot_id(e.param))
        elif a.name == "release_aborted":
            self.ctl.abort(slot_id(e.param))
        elif a.name == "request_update":
            nxt = self.targets[s.committed + 1]
            fire(Trigger.REQUEST_UPDATE, None, self.runner.request_detail(nxt))
        elif a.name == "publish":
            self.runner.publish(self.targets[s.target])
        elif a.name == "cancel_update":
            fire(Trigger.CANCEL_UPDATE, None, {"reason": "tour",
                                               **self.runner.named(self.targets[s.target])})
        else:
            if a.name == "invalidated":
                self.first_probe = True
            fire(str(a.trigger), None, {"reason": "tour"} if a.name == "give_up" else None)

    def _operation(self, k: int) -> int:
        """A begin: find what follows it in the path (its outcome, after any of the
        engine's own steps, or a controller restart), inject the outcome's means and make
        the one attempt; the decided outcome must be the path's."""
        edges = self.schedule.edges
        e = edges[k]
        op = _op_of(e.action)
        assert op is not None
        j = k + 1
        while j < len(edges) and edges[j].action.kind is Kind.ENVIRONMENT:
            j += 1
        nxt = edges[j] if j < len(edges) else None
        if nxt is None or nxt.action.kind is Kind.RESTART:
            # Crash with the call not yet made: the begin is journalled (named as the
            # runner names it), nothing else.
            target = self._target_of(op, e.source)
            detail = None
            if op is Op.MUTATE and target is not None:
                detail = self.runner.named(target)
            elif op is Op.READMIT and target is not None:
                detail = {"who": "tour", **self.runner.named(target)}
            self.ctl.fire(str(e.action.trigger), self._param(e), detail)
            self._check(e.dest)
            return k + 1
        if nxt.action.op != e.action.op or nxt.action.kind is not Kind.OUTCOME:
            raise Diverged(f"the path follows {e.label()} with {nxt.label()}")
        m = means_for(nxt.action, nxt.source, nxt.dest, self.cap)
        if m is None:
            raise Diverged(f"{self.engine.kind} cannot be made to take {nxt.label()} here")
        for mid in edges[k + 1:j]:  # a replacement happens before the call it answers
            if mid.action.name == "engine_restart":
                self._environment(mid)
        target = self._target_of(op, e.source)
        target = self._arm(m, target)
        for fop, cause in m.faults:  # "reset": the tier this step resets
            self.engine.inject(fop if fop != "reset" else f"reset_{e.param}", cause,
                               times=None)  # every request of this attempt: retries too
        try:
            if op is Op.READMIT:
                assert target is not None
                outcome = self.runner.readmit(target, who="tour")
            else:
                outcome = self.runner.perform(op, self._param(e), target,
                                              first_since_reset=self.first_probe)
        finally:
            self.engine.clear_faults()
            self.engine.disarm()
        if op is Op.PROBE:
            self.first_probe = False
        if outcome.trigger != nxt.action.trigger:
            raise Diverged(f"outcome {outcome.trigger} ({outcome.reason}); the path "
                           f"predicts {nxt.action.trigger} by {m.what}")
        for mid in edges[k + 1:j]:  # the engine's own steps the path puts in between
            if mid.action.name != "engine_restart":
                self._environment(mid)
        self._check(nxt.dest)
        return j + 1

    def _target_of(self, op: Op, s: State) -> WeightTarget | None:
        if op is Op.BOOTSTRAP:
            return self.targets[1]
        if op in (Op.READMIT, Op.AUDIT):
            return self.targets[s.committed]
        if op in (Op.MUTATE, Op.VALIDATE, Op.PROBE):
            return self.targets[s.target]
        if op is Op.FENCE:
            return self.targets[s.target or s.committed or 1]
        return None

    def _arm(self, m: Means, target: WeightTarget | None) -> WeightTarget | None:
        if m.arm is None or target is None:
            return target
        e = self.engine
        if m.arm == "refused":
            return e.arm_refused_mutation(target)
        if m.arm == "wrong_checkpoint":
            return e.arm_wrong_checkpoint(target, OTHER)
        kind = m.arm.removeprefix("sim:")
        inject_sim = getattr(e, "inject_sim", None)
        if inject_sim is None:
            raise Diverged(f"{m.arm} needs the simulator")
        inject_sim("mutate", kind)
        return target

    # ---- rollouts on the engine

    def _start_rollout(self, slot: int) -> None:
        e = self.engine
        before = e.running_requests()
        t = threading.Thread(target=self._generate, name=f"tour-{slot_id(slot)}", daemon=True)
        self.rollouts[slot] = t
        t.start()
        # The spec's admit starts the engine request: wait until it is running (or done).
        deadline = time.monotonic() + 60.0
        while (e.running_requests() <= before and t.is_alive()
               and time.monotonic() < deadline):
            time.sleep(0.005)

    def _generate(self) -> None:
        e = self.engine
        try:
            e.raw_generate(e.prompt("rollout"), e.rollout_tokens)
        except Exception:  # an aborted or failed request ends it: what the tour waits for
            return

    def _environment(self, e: Edge) -> None:
        """The engine's own step: a request ends, or its process is replaced."""
        if e.action.name == "engine_restart":
            self.engine.replace_out_of_band(OTHER)
        else:
            self._join(e.param)

    def _join(self, slot: Param) -> None:
        t = self.rollouts.pop(slot, None) if slot is not None else None
        if t is not None:
            t.join(300.0)
            if t.is_alive():
                raise Diverged(f"the request of {slot_id(slot)} did not end")

    def _join_all(self) -> None:
        for slot in list(self.rollouts):
            t = self.rollouts.pop(slot)
            t.join(30.0)

    # ---- agreement with the path

    def _check(self, t: State) -> None:
        c = self.ctl
        if c.control != control_of(t):
            raise Diverged(f"controller state {c.control} differs from the path's "
                           f"{control_of(t)}")
        bound = {rid: b.generation for rid, b in c.bindings.items()}
        if bound != bindings_of(t):
            raise Diverged(f"bindings {bound} differ from the path's {bindings_of(t)}")
        for what, ok, seen in self._observe(t):
            if not ok:
                raise Diverged(f"the engine's {what} disagrees with the spec: {seen}")

    def _observe(self, t: State) -> Iterator[tuple[str, bool, Any]]:
        e = self.engine
        label = e.label()
        if t.label == TAINT:
            yield "label", bool(label and label.startswith("tainted:")), label
        elif t.label in self.targets:
            yield "label", label == self.targets[t.label].label, label
        ident = e.identity()
        if t.weights in self.targets:
            yield "identity", ident == self.targets[t.weights].identity, (ident or "")[:16]
        elif t.weights == MIXED:
            declared = {tg.identity for tg in self.targets.values()}
            yield "identity", ident not in declared, (ident or "")[:16]
        elif t.weights == BROKEN:
            pass  # reads as the target's to the digest by definition: only a probe tells
        paused = e.is_paused_raw()
        yield "paused state", paused == t.paused, {"paused": paused}
        if not any(t.req):
            idle = _wait(lambda: e.running_requests() == 0, 30.0)
            yield "running requests", idle, {"running": e.running_requests()}


def _wait(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


# ------------------------------------------------------------------------------ report


@dataclass
class WalkFailure:
    """The minimal failing walk Hypothesis shrank to, and how to replay it."""

    choices: list[int]
    result: ScheduleResult
    command: str

    def as_json(self) -> dict[str, Any]:
        return {"choices": self.choices, "command": self.command, **self.result.as_json()}


@dataclass
class TourReport:
    engine: str
    classes: list[EdgeClass]
    schedules: list[ScheduleResult]
    unrealisable: dict[EdgeClass, str]
    walks: int = 0  # random walks run
    walk_failure: WalkFailure | None = None
    safe: bool = False
    seconds: float = 0.0

    @property
    def realised(self) -> set[EdgeClass]:
        out: set[EdgeClass] = set()
        for r in self.schedules:
            if r.passed:
                out |= r.realised()
        return out

    def missing(self) -> list[EdgeClass]:
        """Classes the engine can realise that no passing schedule took."""
        realised = self.realised
        return [c for c in self.classes if c not in realised and c not in self.unrealisable]

    @property
    def passed(self) -> bool:
        return (all(r.passed for r in self.schedules) and self.walk_failure is None
                and not self.missing())

    def as_json(self) -> dict[str, Any]:
        realised = self.realised
        return {
            "engine": self.engine, "passed": self.passed, "safe": self.safe,
            "seconds": round(self.seconds, 2),
            "coverage": {"classes": len(self.classes), "realised": len(realised),
                         "unrealisable": len(self.unrealisable),
                         "missing": [class_name(c) for c in self.missing()]},
            "classes": {class_name(c): ("realised" if c in realised else
                                        self.unrealisable.get(c, "NOT REALISED"))
                        for c in self.classes},
            "schedules": [r.as_json() for r in self.schedules],
            "steps": sum(len(r.schedule.edges) for r in self.schedules),
            "walks": {"ran": self.walks, "failure": (self.walk_failure.as_json()
                                                     if self.walk_failure else None)},
        }


Printer = Callable[[str], None]


def run_schedules(engine: HarnessEngine, schedules: Iterable[Schedule], work_dir: Path, *,
                  safe: bool = False, printer: Printer | None = None,
                  prefix: str = "schedule") -> list[ScheduleResult]:
    out: list[ScheduleResult] = []
    for n, sched in enumerate(schedules):
        r = TourRun(engine, sched, work_dir / f"{prefix}-{n:03d}", safe=safe).run()
        out.append(r)
        if printer is not None:
            what = ", ".join(class_name(c) for c in sched.covers) or " ".join(sched.labels())
            verdict = "pass" if r.passed else f"FAIL at step {r.diverged_at}: {r.message}"
            printer(f"{prefix} {n:3d} {len(sched.edges):3d} steps {r.seconds:6.2f}s  "
                    f"{what}: {verdict}")
    return out


def run_walks(engine: HarnessEngine, graph: TourGraph, work_dir: Path, *, count: int,
              seed: int, safe: bool = False, length: int = 24,
              printer: Printer | None = None) -> WalkFailure | None:
    """``count`` random walks of up to ``length`` steps, seeded; a failing walk is shrunk
    by Hypothesis to a minimal one (fewer steps, smaller choices), which is returned with
    the command that replays it."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import Phase as HPhase
    from hypothesis import seed as hseed
    from hypothesis import strategies as st

    cap = Capability(engine.kind, safe)
    failing: list[tuple[list[int], ScheduleResult]] = []
    n = [0]

    @hseed(seed)
    @settings(max_examples=count, database=None, deadline=None, print_blob=False,
              phases=(HPhase.generate, HPhase.shrink),
              suppress_health_check=list(HealthCheck))
    @given(st.lists(st.integers(0, 63), min_size=2, max_size=length))
    def walk(choices: list[int]) -> None:
        sched = decode_walk(graph, cap, choices)
        r = TourRun(engine, sched, work_dir / f"walk-{n[0]:04d}", safe=safe).run()
        n[0] += 1
        if not r.passed:
            failing.append((list(choices), r))
            raise AssertionError(r.message)

    with contextlib.suppress(AssertionError):  # the failing walk is in ``failing``
        walk()
    if printer is not None:
        printer(f"random walks: {n[0]} run (seed {seed}), "
                f"{'one failed' if failing else 'all passed'}")
    if not failing:
        return None
    choices, r = failing[-1]  # Hypothesis replays the minimal failing example last
    return WalkFailure(choices, r, walk_command(cap, choices))


def tour(engine: HarnessEngine, work_dir: Path, *, graph: TourGraph | None = None,
         safe: bool = False, walks: int = 0, seed: int = 0,
         printer: Printer | None = None) -> TourReport:
    """Plan the cover for ``engine``, run every schedule of it, then ``walks`` random
    walks."""
    t0 = time.perf_counter()
    g = graph or TourGraph()
    cap = Capability(engine.kind, safe)
    schedules, reasons = plan(g, cap)
    results = run_schedules(engine, schedules, work_dir, safe=safe, printer=printer)
    failure = (run_walks(engine, g, work_dir, count=walks, seed=seed, safe=safe,
                         printer=printer) if walks > 0 else None)
    return TourReport(engine.kind, g.classes(), results, reasons, walks=walks,
                      walk_failure=failure, safe=safe, seconds=time.perf_counter() - t0)


__all__ = ["CHECKPOINTS", "MEANS", "TOUR_BOUNDS", "Capability", "Edge", "Means", "Schedule",
           "ScheduleResult", "TourGraph", "TourReport", "TourRun", "WalkFailure",
           "class_name", "decode_walk", "plan", "realisable", "run_schedules", "run_walks",
           "tour", "walk_command"]
