"""The trace checker: a journal against the spec, in one streaming pass.

What is checked, per record, in this order:

1. **Schema** (file level): every field has its type, the step is a trigger of the spec
   journalled with its Jepsen type and operation, sequence numbers increase by one, the
   journal starts with a header and then a bootstrap (or, if the header names the
   segment it continues, with a restart to TAINTED).
2. **Evidence**: an outcome record carries the decision it was taken on (evidence,
   expected target); :func:`rolloutcore.engine.postconditions.decide` is run on it again and
   must name the record's own step; the expected label and identity must be the target
   the update request named. The checker does not trust the code it checks.
3. **Spec**: some behaviour of the spec takes exactly this step, with the phase,
   generations and pending operation the record states, and every state it can be in
   satisfies every invariant, every step every action property. Violations are named by
   the first spec property the record's claimed step breaks, when one does.

Why it scales: the state of the spec splits into a controller half, which the trace
determines exactly (every controller effect is a function of the controller state and
the step: actions observed alike have equal controller halves, which the controller
generator checks), and the engine's ghost half, which only evidence constrains. The
checker keeps the controller half once, with the bound rollouts as an exact map from id
to generation, and a *set* of ghost states consistent with the trace. The ghost half
depends on rollouts only through which generations still have a request running (R), a
symmetry reduction that accepts exactly the traces the full slot-by-slot product accepts:

* slots are interchangeable: every guard, invariant and action property mentions a slot
  only as "this slot" (the step's parameter) or under one quantifier over slots
  (``\\A i``, ``\\E i``), comparing a slot's ``bind``/``req`` with constants, with
  ``committed``/``weights`` or with the same slot after the step;
* so a representative state with, per distinct bound generation, min(count, 2) bound slots
  (two, so that releasing one leaves one), one slot per generation in R (requests run
  under bound and released rollouts alike; which rollout a request belongs to is never
  read), and one free idle slot (for an admission) evaluates every such predicate as
  the full state does;
* the environment finishes any running request at any time, unseen: the consistent set
  is closed under it, so for every R it holds every subset of R (kept explicitly; R has
  a handful of generations at most). Predicates on requests are "no request runs" or
  "every running request satisfies P", so the verdict on the set is the verdict on its
  R-projection;
* the environment's other steps (an engine process replaced out of band) are unseen
  too: the consistent set is closed under them after every record, so that a later
  audit's mismatch is explained by them (the invariants they would break are stated for
  engines not replaced since they were verified, so they hold in every such state).

Hence the cost of a record does not depend on how many rollouts are bound or how many
requests run: a journal with a thousand rollouts bound at once checks as fast per record
as one with ten. Fault outcomes and restarts are not bounded (the fault counter is
projected away), nor are generations.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any, NamedTuple

from rolloutcore.adapters.contract import EvidenceFormatError, RankStage, evidence_from_json
from rolloutcore.check.claims import TIMING_SLACK_S, TOP_LEVEL, Claims
from rolloutcore.engine import postconditions as post
from rolloutcore.engine.controller import triggers_of
from rolloutcore.engine.staging import ACTION_OF_STEP, Staging, StagingViolation
from rolloutcore.errors import BadInput
from rolloutcore.inputs import unreadable
from rolloutcore.journal import (
    CONTINUES,
    HEADER,
    SCHEMA,
    JournalReader,
    jepsen_types,
    not_a_journal,
)
from rolloutcore.spec.lifecycle import (
    BROKEN,
    MIXED,
    NO_OP,
    SPEC,
    TAINT,
    TIERS,
    Action,
    Bounds,
    Kind,
    Phase,
    Spec,
    State,
)
from rolloutcore.spec.staged import STAGING as ST_STAGING
from rolloutcore.spec.triggers import RESTARTS, Trigger

SPEC_VIOLATION = "spec: no state of the spec is consistent with this step"
UNBOUNDED = 10**9
#: The memo's bound, in ghost states held (keys and values; a ghost state is a few hundred
#: bytes): memory does not grow with the journal.
_MEMO_GHOSTS = 50_000
#: Where the shift puts the committed generation (far above the spec's literal 1).
_SHIFT_BASE = 1_000
_RELEASES = frozenset({Trigger.RELEASE, Trigger.RELEASE_ABORTED})
_PHASES = frozenset(p.value for p in Phase)
_OUTCOME_TYPES = frozenset({"ok", "fail", "info"})


_HEADER_FIELDS = frozenset({"type", "schema", "spec", "seq", "t", "hash", "prev", CONTINUES})
_RECORD_FIELDS = frozenset({"type", "step", "op", "param", "phase", "pending", "seq",
                            "committed", "target", "t", "hash", "prev", "detail", "evidence",
                            "engine"})


def header_problem(r: Mapping[str, Any]) -> str | None:
    """Why a header record (schema and spec aside) is malformed (None: it is not)."""
    if r.get("seq") != 0 or type(r.get("seq")) is not int or set(r) - _HEADER_FIELDS:
        return "a header is seq 0 with schema, spec, t and the journal it continues, if any"
    return _top_level_problem(r)


def _top_level_problem(r: Mapping[str, Any]) -> str | None:
    for key, f in TOP_LEVEL.items():
        if key not in r or not f.conforms(r[key]):
            return f"{key} is not {f.kind}: {r.get(key)!r:.40}"
    return None


class TraceInputError(BadInput):
    """The input is not a journal this checker reads (missing, unreadable, not JSON lines,
    another schema version)."""


@dataclass(frozen=True)
class TraceVerdict:
    accepted: bool
    records: int  # records checked, header not counted
    first_bad_line: int | None  # 1-based line in the file, header counted
    violated: str | None  # a property name, Schema, Evidence..., or SPEC_VIOLATION
    message: str
    states_max: int  # the largest consistent ghost-state set seen
    warnings: tuple[str, ...] = ()  # accepted, but said: a torn final record

    def as_json(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "records": self.records,
                "first_bad_line": self.first_bad_line, "violated": self.violated,
                "message": self.message, "states_max": self.states_max,
                "warnings": list(self.warnings)}


@dataclass(frozen=True)
class Rejection:
    line: int
    violated: str
    message: str


class Ghost(NamedTuple):
    """The engine half of a spec state, with requests as the set of generations running."""

    weights: int
    label: int
    paused: bool
    running: frozenset[int]
    caches: tuple[frozenset[int], ...]
    amb: bool
    stale: bool
    replaced: bool
    doubt: bool


class Control(NamedTuple):
    phase: Phase
    committed: int
    target: int
    pending: str
    cleared: frozenset[str]
    evidence: frozenset[str]


def _ghost(s: State) -> Ghost:
    return Ghost(s.weights, s.label, s.paused, frozenset(r for r in s.req if r), s.caches,
                 s.amb, s.stale, s.replaced, s.doubt)


def _closed(g: Ghost) -> Iterator[Ghost]:
    """``g`` and every ghost state the engine reaches by finishing running requests."""
    r = sorted(g.running)
    for k in range(len(r) + 1):
        for keep in combinations(r, k):
            yield g._replace(running=frozenset(keep))


BoundKey = tuple[tuple[int, int], ...]  # (generation, min(count, 2)) per bound generation


@dataclass(frozen=True)
class _Shift:
    """Every generation above 1 moved by ``delta``; 0 (none), 1 and the negative ghost
    constants stay. The spec compares generations only with each other, with
    ``committed + 1`` and with the literal 1 (the initial weights and label), so a step
    from a shifted state is the shifted step, and the memo can key states relative to the
    committed generation. Nothing moves while nothing is committed (the bootstrap
    compares with 1 itself); a state holding a generation so old that it would land on 1
    or below is not shifted at all (:meth:`ghosts` says None)."""

    delta: int

    @staticmethod
    def around(committed: int) -> _Shift:
        return _Shift(_SHIFT_BASE - committed if committed >= 2 else 0)

    def gen(self, g: Any) -> Any:
        return g + self.delta if type(g) is int and g > 1 else g

    def _gens(self, gs: frozenset[int]) -> frozenset[int]:
        return frozenset(g + self.delta if g > 1 else g for g in gs) if gs else gs

    def ghosts(self, gs: frozenset[Ghost]) -> frozenset[Ghost] | None:
        if not self.delta:
            return gs
        out = set()
        for g in gs:
            every = (g.weights, g.label, *g.running, *(x for c in g.caches for x in c))
            if any(1 < x <= 1 - self.delta for x in every):
                return None  # older than the shift can carry
            out.add(g._replace(weights=self.gen(g.weights), label=self.gen(g.label),
                               running=self._gens(g.running),
                               caches=tuple(self._gens(c) for c in g.caches)))
        return frozenset(out)

    def undo(self, gs: frozenset[Ghost]) -> frozenset[Ghost]:
        back = _Shift(-self.delta)
        return frozenset(g._replace(weights=back.gen(g.weights), label=back.gen(g.label),
                                    running=back._gens(g.running),
                                    caches=tuple(back._gens(c) for c in g.caches))
                         for g in gs) if self.delta else gs

    def control(self, c: Control) -> Control:
        return c._replace(committed=self.gen(c.committed), target=self.gen(c.target))

    def bound_key(self, bk: BoundKey) -> BoundKey:
        return tuple((self.gen(g), n) for g, n in bk)

    def proj(self, proj: tuple[Any, ...]) -> tuple[Any, ...]:
        return (proj[0], self.gen(proj[1]), self.gen(proj[2]), proj[3])


# ---------------------------------------------------------------------------- checker


@dataclass
class Memo:
    """Spec steps already taken, keyed by shifted state (see :class:`_Shift`), bounded in
    ghost states held (keys and values): cleared when full."""

    #: shifted state and step -> (shifted ghost set after, shifted controller half after)
    table: dict[tuple[Any, ...], tuple[frozenset[Ghost], Control]] = field(
        default_factory=dict)
    size: int = 0

    def put(self, key: tuple[Any, ...], value: tuple[frozenset[Ghost], Control],
            size: int) -> None:
        if self.size + size > _MEMO_GHOSTS:
            self.table.clear()
            self.size = 0
        self.table[key] = value
        self.size += size


@dataclass
class _Segment:
    started: bool = False  # a first step was seen
    continues: str | None = None


@dataclass
class TraceChecker:
    """Incremental checker: :meth:`feed` records one by one (the header first)."""

    spec: Spec = SPEC
    states_max: int = 0
    steps: int = 0
    bound: dict[str, int] = field(default_factory=dict)  # rollout id -> generation
    counts: dict[int, int] = field(default_factory=dict)  # generation -> rollouts bound
    #: The segment this journal continues, checked to its end: the continuing segment's
    #: restart must start where it ended, and inherits what it established.
    previous: TraceChecker | None = None
    #: The memo of spec steps (a pure cache: checkers of one spec may share one, as a
    #: fleet's members do).
    memo: Memo | None = None
    #: Reject (True) or report (False: warnings) an outcome written later than its
    #: attempt's declared deadline plus TIMING_SLACK_S.
    strict_timing: bool = False
    #: Hold each closed window (admissions closed for an update) to its attempts' declared
    #: deadlines. Off for a fleet's members: a member waits for the fleet's decision too.
    window_check: bool = True
    late: list[str] = field(default_factory=list)  # the first few late outcomes, in words
    late_count: int = 0

    def __post_init__(self) -> None:
        self._began: tuple[int, float, float] | None = None  # (line, t, deadline_s)
        #: The closed window under way: (line, t, its attempts' deadlines, attempts).
        self._window: tuple[int, float, float, int] | None = None
        self.spec = self.spec.with_bounds(Bounds(rollouts=1, generations=UNBOUNDED,
                                                 faults=UNBOUNDED))
        self.types = jepsen_types(self.spec)
        self.triggers = triggers_of(self.spec)
        self._actions: dict[str, tuple[Action, ...]] = {
            t: ts.actions for t, ts in self.triggers.items()}
        # The engine's own unseen steps other than finishing a request (that one is the
        # running set's closure): an out-of-band replacement of its process.
        self._env = tuple(a for a in self.spec.actions
                          if a.kind is Kind.ENVIRONMENT and a.param is None)
        self._frees = frozenset(t for t, ts in self.triggers.items() if ts.frees)
        init = self.spec.initial_states()
        c0 = init[0]
        self.control = Control(c0.phase, c0.committed, c0.target, c0.pending, c0.cleared,
                               c0.evidence)
        self._ghosts: frozenset[Ghost] | None = frozenset(_ghost(s) for s in init)
        #: The same ghost set as the memo stores it, with its shift (either may be None:
        #: a memo hit leaves the set shifted, converted back only when something reads it).
        self._shifted: tuple[int, frozenset[Ghost]] | None = None
        self.states_max = len(self.ghosts)
        self.last_seq = -1
        self.header_seen = False
        self.segment = _Segment()
        self.claims = Claims()  # what the journal established about its generations
        self._admitted: dict[str, int] = {}  # rollout id -> its admission's line (tracking)
        self._line = 0
        if self.memo is None:
            self.memo = Memo()
        #: The staged update under way (spec/staged.py), and the identity it stages.
        self._staging: Staging | None = None
        self._staging_identity = ""

    def clone(self) -> TraceChecker:
        """An independent checker in this one's state (the memo, a pure cache, shared)."""
        out = copy.copy(self)
        out.bound, out.counts = dict(self.bound), dict(self.counts)
        out.segment = copy.copy(self.segment)
        out.claims = self.claims.copy()
        out._admitted = {}
        out.late = list(self.late)
        if self._staging is not None:
            out._staging = copy.copy(self._staging)
        return out  # (the timing fields are tuples: shared safely)

    # ------------------------------------------------------------------ representation

    @property
    def ghosts(self) -> frozenset[Ghost]:
        """The ghost states consistent with the trace so far."""
        if self._ghosts is None:
            assert self._shifted is not None
            self._ghosts = _Shift(self._shifted[0]).undo(self._shifted[1])
        return self._ghosts

    @ghosts.setter
    def ghosts(self, value: frozenset[Ghost]) -> None:
        self._ghosts, self._shifted = value, None

    def _ghosts_at(self, shift: _Shift) -> frozenset[Ghost] | None:
        """The ghost set shifted by ``shift`` (None: it cannot be)."""
        if self._shifted is not None:
            delta, shifted = self._shifted
            if delta == shift.delta:
                return shifted
            out = _Shift(shift.delta - delta).ghosts(shifted)
        else:
            out = shift.ghosts(self.ghosts)
        if out is not None:
            self._ghosts = self.ghosts  # keep the real set before dropping the old shift
            self._shifted = (shift.delta, out)
        return out

    def _one_ghost(self) -> Ghost:
        """Any one consistent ghost state (the controller half's effects read none)."""
        if self._ghosts is not None:
            return next(iter(self._ghosts))
        assert self._shifted is not None
        return next(iter(_Shift(self._shifted[0]).undo(frozenset(
            [next(iter(self._shifted[1]))]))))

    def _bound_key(self) -> BoundKey:
        return tuple(sorted((g, min(n, 2)) for g, n in self.counts.items() if n))

    def _rep(self, g: Ghost, c: Control, bk: BoundKey, extra_bound: int = 0) -> State:
        """A representative full state (see the module doc); the last slot is free."""
        binds = [gen for gen, n in bk for _ in range(n)]
        bind = (*binds, *(0,) * len(g.running), 0)
        req = (*(0,) * len(binds), *sorted(g.running), 0)
        return State(c.phase, c.committed, c.target, c.pending, bind, c.cleared,
                     c.evidence, g.weights, g.label, g.paused, req, g.caches, g.amb, g.stale,
                     g.replaced, g.doubt, 0)

    @staticmethod
    def _slot_of_generation(bk: BoundKey, gen: int) -> int:
        """1-based index of a representative bound slot of generation ``gen``."""
        i = 1
        for g, n in bk:
            if g == gen:
                return i
            i += n
        raise KeyError(gen)

    # ----------------------------------------------------------------------- feeding

    def feed(self, r: Mapping[str, Any], line: int) -> Rejection | None:
        """Check one record (``line``: its line in the file); None if it conforms."""
        self._line = line
        if r.get("type") == HEADER:
            return self._header(r, line)
        if type(r.get("step")) is str and r["step"] in ACTION_OF_STEP:
            return self._staging_record(r, line)
        bad = self._schema(r)
        if bad:
            return Rejection(line, "Schema", bad)
        step, seq = r["step"], r["seq"]
        if not self.header_seen:
            return Rejection(line, "Schema", "the journal does not begin with a header")
        if seq != self.last_seq + 1:
            return Rejection(line, "SequenceGap", f"seq {seq} follows {self.last_seq}")
        self.last_seq = seq
        if not self.segment.started:
            self.segment.started = True
            if self.segment.continues is not None:
                if step != Trigger.RESTART_TAINTED:
                    return Rejection(line, "SegmentStart", "a segment that continues another "
                                     "must begin with its restart to TAINTED, not " + step)
                bad_claim = self.claims.problem(
                    r, self.previous.control.phase if self.previous is not None else None)
                if bad_claim is not None:
                    return Rejection(line, bad_claim[0], bad_claim[1])
                return self._forced_restart(r, line)
            if step not in (Trigger.BOOTSTRAP_BEGIN, Trigger.RESTART_UNINITIALIZED):
                return Rejection(line, "SegmentStart", f"the journal begins with {step}: a "
                                 "journal begins with a bootstrap (or a restart before it), "
                                 "or with a restart to TAINTED in a segment whose header "
                                 "names the journal it continues")
        ev = self._evidence(r) or self.claims.problem(r, self.control.phase)
        if ev is not None:
            return Rejection(line, ev[0], ev[1])
        self.steps += 1
        spec_bad = self._spec_step(r) or self._staged_lifecycle(r)
        if spec_bad is not None:
            return Rejection(line, spec_bad[0], spec_bad[1])
        self.claims.advance(r, line, self.control.committed, self.control.target)
        late = self._timing(r, line)
        if late is not None:
            if self.strict_timing:
                return Rejection(line, "DeadlineExceeded", late)
            self.late_count += 1
            if len(self.late) < 3:
                self.late.append(late)
        return None

    def _timing(self, r: Mapping[str, Any], line: int) -> str | None:
        """Why record ``r`` came too late (None: in time, or nothing declared): an outcome
        later than its attempt's declared deadline plus the slack (a begin with
        ``deadline_s`` starts the clock; the next outcome or restart stops it), or the end
        of a closed window later than the sum of its attempts' deadlines plus the slack
        per attempt and one more (:meth:`_closed_window`)."""
        return self._attempt_timing(r, line) or self._closed_window(r, line)

    def _closed_window(self, r: Mapping[str, Any], line: int) -> str | None:
        """Admissions close at ``request_update`` and reopen (READY) or latch TAINTED
        after the drain (bounded by the request's ``drain_s``) and the cycle's attempts
        (each bounded by its declared deadline): the window may last their sum, plus the
        slack once per attempt and once for the steps between them. A restart ends the
        window unchecked (the controller was down)."""
        if not self.window_check:
            return None
        t, step, window = r.get("t"), r.get("step"), self._window
        if not isinstance(t, (int, float)):
            return None
        if window is None:
            if step == Trigger.REQUEST_UPDATE:
                drain = (r.get("detail") or {}).get("drain_s")
                self._window = (line, float(t), float(drain) if isinstance(
                    drain, (int, float)) else 0.0, 0)
            return None
        start, t0, budget, attempts = window
        if r.get("type") == "invoke":
            d = (r.get("detail") or {}).get("deadline_s")
            self._window = (start, t0, budget + float(d) if isinstance(d, (int, float))
                            else budget, attempts + 1)
            return None
        if r.get("type") == "recover":
            self._window = None
            return None
        if self.control.phase not in (Phase.READY, Phase.TAINTED):
            return None
        self._window = None
        took, bound = float(t) - t0, budget + TIMING_SLACK_S * (attempts + 1)
        if took <= bound:
            return None
        return (f"admissions were closed for {took:.3f} s (line {start} to {step}): longer "
                f"than its drain and {attempts} attempts' deadlines ({budget:g} s) plus the "
                f"slack of {TIMING_SLACK_S:g} s per attempt and one more")

    def _attempt_timing(self, r: Mapping[str, Any], line: int) -> str | None:
        detail, t = r.get("detail"), r.get("t")
        kind = r.get("type")
        if kind == "invoke":
            d = detail.get("deadline_s") if isinstance(detail, dict) else None
            self._began = (line, float(t), float(d)) if isinstance(d, (int, float)) \
                and isinstance(t, (int, float)) else None
            return None
        began, self._began = self._began, None
        if began is None or kind in ("step", "recover") or not isinstance(t, (int, float)):
            return None
        at, t0, deadline = began
        took = float(t) - t0
        if took <= deadline + TIMING_SLACK_S:
            return None
        return (f"{r.get('step')} came {took:.3f} s after its begin (line {at}): past its "
                f"deadline of {deadline:g} s plus the slack of {TIMING_SLACK_S:g} s")

    def _header(self, r: Mapping[str, Any], line: int) -> Rejection | None:
        if self.header_seen:
            return Rejection(line, "Schema", "a second header")
        self.header_seen = True
        if r.get("schema") != SCHEMA or r.get("spec") != self.spec.name:
            return Rejection(line, "Schema", f"header is for schema {r.get('schema')!r} of "
                             f"spec {r.get('spec')!r}, not schema {SCHEMA} of {self.spec.name}")
        cont = r.get(CONTINUES)
        if cont is not None and not (isinstance(cont, str) and len(cont) == 64):
            return Rejection(line, "Schema", f"{CONTINUES} is not a hash: {cont!r}")
        bad = header_problem(r)
        if bad:
            return Rejection(line, "Schema", bad)
        self.segment.continues = cont
        if cont is not None and self.previous is not None:
            self.control = self.previous.control
            self.claims = self.previous.claims.copy()
        self.last_seq = 0
        return None

    def _schema(self, r: Mapping[str, Any]) -> str | None:
        try:
            step, typ, op, param, phase, pending = (
                r["step"], r["type"], r["op"], r["param"], r["phase"], r["pending"])
            ints = (r["seq"], r["committed"], r["target"])
        except KeyError as e:
            return f"record lacks {e.args[0]!r}"
        if type(step) is not str:
            return f"step is not a string: {step!r:.40}"
        expect = self.types.get(step)
        if expect is None:
            return f"unknown step {step!r:.60}"
        if (typ, op) != expect:
            return f"{step} is journalled as type {expect[0]!r}, op {expect[1]!r}; " \
                f"found {typ!r:.20}, {op!r:.20}"
        for v in ints:  # type(), not isinstance(): a bool is no sequence number
            if type(v) is not int:
                return f"seq, committed or target is not an integer: {v!r:.40}"
        if type(phase) is not str or phase not in _PHASES:
            return f"unknown phase {phase!r:.40}"
        if type(pending) is not str or (param is not None and type(param) is not str):
            return "pending or param is not a string"
        kind = self.triggers[step].param
        if kind is None and param is not None:
            return f"{step} takes no parameter, got {param!r:.40}"
        if kind == "tier" and param not in TIERS:
            return f"{step} names unknown cache tier {param!r:.40}"
        if kind == "slot" and not param:
            return f"{step} names no rollout"
        if "detail" in r and not isinstance(r["detail"], dict):
            return "detail is not an object"
        if set(r) - _RECORD_FIELDS:
            return f"unknown record field(s) {sorted(set(r) - _RECORD_FIELDS)}"
        return _top_level_problem(r)

    # ---------------------------------------------------------------------- evidence

    def _evidence(self, r: Mapping[str, Any]) -> tuple[str, str] | None:
        step = r["step"]
        if r["type"] not in _OUTCOME_TYPES:
            if "evidence" in r:
                return "Schema", f"{step} is no outcome and carries no evidence"
            return None
        if "evidence" not in r:
            return "Evidence", f"outcome {step} carries no evidence to decide it by"
        try:
            decision = post.decision_from_json(r["evidence"])
            decided = post.decide(decision)
        except (EvidenceFormatError, TypeError, ValueError, KeyError, AttributeError) as e:
            return "Schema", f"{step}: malformed evidence: {e}"
        if decision.op.value != self.types[step][1]:
            return "Evidence", f"{step} carries the evidence of another operation " \
                f"({decision.op.value})"
        if decided.trigger != step:
            return "EvidenceContradictsOutcome", (
                f"the record says {step} but its evidence decides {decided.trigger} "
                f"({decided.reason})")
        return None

    # -------------------------------------------------------------------------- spec

    def _spec_step(self, r: Mapping[str, Any]) -> tuple[str, str] | None:
        step, param = r["step"], r["param"]
        proj = (r["phase"], r["committed"], r["target"], r["pending"])
        bk = self._bound_key()
        sparam: Any = param
        gen: int | None = None
        if step == Trigger.ADMIT:
            if param in self.bound:
                return SPEC_VIOLATION, f"admit of rollout {param!r}, which is already bound"
            sparam = None  # the representative's free slot, resolved below
        elif step in (Trigger.RELEASE, Trigger.RELEASE_ABORTED):
            gen = self.bound.get(param)
            if gen is None:
                return SPEC_VIOLATION, f"{step} of rollout {param!r}, which is not bound"
            sparam = gen
        bad = self._memoised_advance(step, sparam, proj, bk)
        if bad is not None:
            return bad
        tracking = self.claims.on_unused is not None
        if step == Trigger.ADMIT:
            self.bound[param] = self.control.committed
            self.counts[self.control.committed] = self.counts.get(self.control.committed, 0) + 1
            if tracking:
                self._admitted[param] = self._line
        elif gen is not None:
            del self.bound[param]
            self.counts[gen] -= 1
            if not self.counts[gen]:
                del self.counts[gen]
            self._admitted.pop(param, None)
        elif step in self._frees:
            self.bound.clear()
            self.counts.clear()
            self._unbound()
        return None

    # ------------------------------------------------------------------ staged updates

    def _staging_record(self, r: Mapping[str, Any], line: int) -> Rejection | None:
        """A staging step (spec/staged.py): it changes no lifecycle state; the staged
        spec's table, stepped here as the runner steps it, decides whether it may be
        taken, and each rank's receive kind is decided again from its evidence."""
        step, seq, detail = r["step"], r.get("seq"), r.get("detail") or {}
        if not self.header_seen:
            return Rejection(line, "Schema", "the journal does not begin with a header")
        if type(seq) is not int or not isinstance(detail, Mapping):
            return Rejection(line, "Schema", f"{step}: seq or detail malformed")
        if seq != self.last_seq + 1:
            return Rejection(line, "SequenceGap", f"seq {seq} follows {self.last_seq}")
        self.last_seq = seq
        if (r.get("type"), r.get("op")) != self.types[step]:
            return Rejection(line, "Schema", f"{step} is journalled as {self.types[step]}")
        if (r.get("phase"), r.get("committed")) != (self.control.phase, self.control.committed):
            return Rejection(line, "Schema", f"{step} names phase {r.get('phase')} at "
                             f"{r.get('committed')}; the lifecycle is {self.control.phase} at "
                             f"{self.control.committed}")
        try:
            return self._staging_step(step, r.get("param"), detail, line)
        except StagingViolation as e:
            return Rejection(line, SPEC_VIOLATION, f"staged spec: {e}")
        except (EvidenceFormatError, KeyError, TypeError, ValueError) as e:
            return Rejection(line, "Schema", f"{step}: malformed detail: {e}")

    def _staging_step(self, step: str, param: Any, detail: Mapping[str, Any],
                      line: int) -> Rejection | None:
        if step == "stage_begin":
            ranks, identity = detail["ranks"], detail["identity"]
            if type(ranks) is not int or ranks < 1 or not isinstance(identity, str):
                raise ValueError("stage_begin needs ranks >= 1 and the target's identity")
            if self._staging is not None:
                raise StagingViolation("a staging began while another was under way")
            if self.control.phase != Phase.READY:
                raise StagingViolation(f"a staging began in {self.control.phase}: it runs "
                                       "only while the engine serves")
            self._staging = Staging(ranks, self.control.committed)
            self._staging_identity = identity
            self._staging.step("stage_begin")
            return None
        session = self._staging
        if session is None:
            raise StagingViolation(f"{step} with no staging under way")
        if step == "stage_receive":
            rank = int(str(param))
            st = evidence_from_json(detail["rank_stage"])
            if not isinstance(st, RankStage) or st.rank != rank:
                raise ValueError(f"rank_stage is not rank {rank}'s staging evidence")
            kind = post.receive_kind(self._staging_identity, st)
            if detail.get("kind") != kind:
                return Rejection(line, "EvidenceContradictsOutcome", f"rank {rank}'s "
                                 f"receive says {detail.get('kind')!r}, its evidence {kind!r}")
            session.step("receive", rank, kind)
        elif step == "stage_prepare":
            session.step("prepare", int(str(param)))
        else:
            session.step(ACTION_OF_STEP[step])
            self._staging = None
        return None

    def _staged_lifecycle(self, r: Mapping[str, Any]) -> tuple[str, str] | None:
        """What a lifecycle step means for the staged update under way: the request of a
        staged update closes admissions (only with every rank prepared, on the staged
        identity), the mutation's outcome installs (or abandons), a cancel abandons."""
        step, detail = r["step"], r.get("detail") or {}
        session = self._staging
        staged = bool(detail.get("staged"))
        try:
            if session is None:
                if staged:
                    raise StagingViolation(f"{step} of a staged update with no staging "
                                           "prepared")
                return None
            if step == Trigger.REQUEST_UPDATE:
                if not staged or detail.get("identity") != self._staging_identity:
                    raise StagingViolation("an update other than the staged one was "
                                           "requested while a staging was under way")
                session.step("close")
            elif step == Trigger.MUTATE_BEGIN and not staged:
                raise StagingViolation("an unstaged mutation in a staged update")
            elif step == Trigger.MUTATE_OK:
                session.install_all()
                self._staging = None
            elif step == Trigger.MUTATE_AMBIGUOUS:
                session.step("install", 1, False)
                self._staging = None
            elif step in (Trigger.MUTATE_REFUSED, Trigger.CANCEL_UPDATE):
                session.step("abandon")
                self._staging = None
            elif step in RESTARTS or (step == Trigger.GIVE_UP and session.phase != ST_STAGING):
                self._staging = None  # the lifecycle spec governs what follows
        except StagingViolation as e:
            return SPEC_VIOLATION, f"staged spec: {e}"
        return None

    def _unbound(self) -> None:
        """Rollouts freed without a release (tracking, see Claims.on_unused): their ids
        were never named again."""
        if self.claims.on_unused is not None:
            for line in self._admitted.values():
                self.claims.on_unused(line, ("param",))
        self._admitted.clear()

    def finish(self) -> None:
        """The journal ended (tracking: report what nothing later compared)."""
        self._unbound()
        self.claims.finish()

    def _memoised_advance(self, step: str, sparam: Any, proj: tuple[Any, ...],
                          bk: BoundKey) -> tuple[str, str] | None:
        """:meth:`_advance`, memoised up to a shift of the generations (see
        :class:`_Shift`): the same step from the same state relative to the committed
        generation recurs every cycle, whatever the cycle's number, so a memo bounded in
        size serves a run of any length. Sets the ghost set and the controller half;
        returns a rejection or None."""
        shift = _Shift.around(self.control.committed)
        ghosts = self._ghosts_at(shift)
        key = None
        if ghosts is not None:
            key = (ghosts, shift.control(self.control), shift.bound_key(bk), step,
                   shift.gen(sparam) if step in _RELEASES else sparam, shift.proj(proj))
            hit = self.memo.table.get(key)  # type: ignore[union-attr]
            if hit is not None:
                stored, control = hit
                self._ghosts, self._shifted = None, (shift.delta, stored)
                self.control = _Shift(-shift.delta).control(control)
                self.states_max = max(self.states_max, len(stored))
                return None
        c_after = self._control_after(step, sparam, proj, bk)
        nxt = self._advance(step, sparam, proj, bk)
        if isinstance(nxt, tuple):
            return nxt
        self.ghosts, self.control = nxt, c_after
        self.states_max = max(self.states_max, len(nxt))
        stored = shift.ghosts(nxt) if key is not None else None
        if key is not None and stored is not None:
            self.memo.put(key, (stored, shift.control(c_after)),  # type: ignore[union-attr]
                          len(key[0]) + len(stored))
            self._shifted = (shift.delta, stored)
        return None

    def _slot(self, step: str, sparam: Any, bk: BoundKey, s: State) -> Any:
        if step == Trigger.ADMIT:
            return len(s.bind)  # the free slot
        if step in (Trigger.RELEASE, Trigger.RELEASE_ABORTED):
            return self._slot_of_generation(bk, int(sparam))
        return sparam

    def _successors(self, step: str, sparam: Any, proj: tuple[Any, ...],
                    bk: BoundKey) -> list[tuple[State, State]]:
        out: list[tuple[State, State]] = []
        for g in self.ghosts:
            s = self._rep(g, self.control, bk)
            p = self._slot(step, sparam, bk, s)
            for a in self._actions[step]:
                for t in self.spec.step(a, s, p):
                    if (t.phase.value, t.committed, t.target, t.pending) == proj:
                        out.append((s, t))
        return out

    def _advance(self, step: str, sparam: Any, proj: tuple[Any, ...],
                 bk: BoundKey) -> frozenset[Ghost] | tuple[str, str]:
        pairs = self._successors(step, sparam, proj, bk)
        if not pairs:
            return self._name(step, sparam, proj, bk)
        out: set[Ghost] = set()
        after_bk = self._bound_after(step, sparam, bk)
        c_after = self._control_after(step, sparam, proj, bk)
        for s, t in pairs:
            for prop in self.spec.action_properties:
                if not prop.holds(s, t):
                    return prop.name, f"{step} leads to a step violating {prop.name}"
            for g in _closed(_ghost(t)):
                out.add(g)
        out = self._unseen(out, c_after, after_bk)
        for g in out:
            rep = self._rep(g, c_after, after_bk)
            for inv in self.spec.invariants:
                if not inv.holds(rep):
                    return inv.name, (f"{step} leads to a state violating {inv.name} "
                                      f"({self._describe(rep)})")
        return frozenset(out)

    def _unseen(self, ghosts: set[Ghost], c: Control, bk: BoundKey) -> set[Ghost]:
        """``ghosts`` closed under the engine's unseen steps (see the module doc)."""
        out, todo = set(ghosts), list(ghosts)
        while todo:
            s = self._rep(todo.pop(), c, bk)
            for a in self._env:
                for t in self.spec.step(a, s, None):
                    for g in _closed(_ghost(t)):
                        if g not in out:
                            out.add(g)
                            todo.append(g)
        return out

    def _control_after(self, step: str, sparam: Any, proj: tuple[Any, ...],
                       bk: BoundKey) -> Control:
        """The controller half after the step: a function of the step (see module doc)."""
        s = self._rep(self._one_ghost(), self.control, bk)
        a = self._actions[step][0]
        upd: dict[str, Any] = dict(a.control(s, self._slot(step, sparam, bk, s)))
        c = self.control._replace(**{k: v for k, v in upd.items() if k in Control._fields})
        return c._replace(phase=Phase(proj[0]))

    def _bound_after(self, step: str, sparam: Any, bk: BoundKey) -> BoundKey:
        counts = dict(self.counts)
        if step == Trigger.ADMIT:
            counts[self.control.committed] = counts.get(self.control.committed, 0) + 1
        elif step in (Trigger.RELEASE, Trigger.RELEASE_ABORTED):
            counts[int(sparam)] -= 1
        elif step in self._frees:
            counts = {}
        return tuple(sorted((gen, min(n, 2)) for gen, n in counts.items() if n))

    def _name(self, step: str, sparam: Any, proj: tuple[Any, ...], bk: BoundKey) -> tuple[
            str, str]:
        """No spec behaviour takes this step: name the first spec property the step, as
        the record claims it (its controller effect, its phase and generations, whatever
        the guards say), would break; else say why no behaviour takes it."""
        a = self._actions[step][0]
        for g in self.ghosts:
            s = self._rep(g, self.control, bk)
            p = self._slot(step, sparam, bk, s)
            upd: dict[str, Any] = dict(a.control(s, p))
            upd.update(phase=Phase(proj[0]), committed=proj[1], target=proj[2], pending=proj[3])
            t = s._replace(**upd)
            for prop in self.spec.action_properties:
                if not prop.holds(s, t):
                    return prop.name, f"{step} as journalled would violate {prop.name}"
            for inv in self.spec.invariants:
                if not inv.holds(t):
                    return inv.name, f"{step} as journalled would violate {inv.name}"
        return SPEC_VIOLATION, self._explain(step, proj)

    def _explain(self, step: str, proj: tuple[Any, ...]) -> str:
        c = self.control
        ts = self.triggers[step]
        srcs = ", ".join(sorted(p.value for p in ts.sources))
        dests = sorted({a.dest.value if a.dest else "(same phase)" for a in ts.actions})
        return (f"{step} -> {proj[0]} (committed {proj[1]}, target {proj[2]}, pending "
                f"{proj[3]}) is not a step of the spec from {c.phase.value} (committed "
                f"{c.committed}, target {c.target}, pending {c.pending}; evidence: "
                f"{', '.join(sorted(c.evidence)) or 'none'}; tiers cleared: "
                f"{', '.join(t for t in TIERS if t in c.cleared) or 'none'}; rollouts bound: "
                f"{len(self.bound)}); {step} is a step from {srcs} to {', '.join(dests)} when "
                "its guard holds and the engine can produce it")

    @staticmethod
    def _describe(s: State) -> str:
        return (f"phase {s.phase.value}, weights {s.weights}, label {s.label}, paused "
                f"{s.paused}, running {sorted(set(s.req) - {0})}")

    def _forced_restart(self, r: Mapping[str, Any], line: int) -> Rejection | None:
        """The first step of a segment continuing an untrusted journal: TAINTED, whatever
        the engine holds (its previous segment is not trusted, so not assumed)."""
        if r["phase"] != Phase.TAINTED or r["pending"] != NO_OP:
            return Rejection(line, "SegmentStart", "the restart of a continuing segment is "
                             "to TAINTED with nothing pending")
        c, t = r["committed"], r["target"]
        prev = self.previous
        if prev is not None and (c, t) != (prev.control.committed, prev.control.target):
            return Rejection(line, "SegmentStart", f"the restart is at committed {c}, target "
                             f"{t}; the segment it continues ended at committed "
                             f"{prev.control.committed}, target {prev.control.target}")
        gens = sorted({c, t, MIXED, BROKEN} - {0})
        labels = sorted({c, t, MIXED, TAINT} - {0})
        empty: tuple[frozenset[int], ...] = tuple(frozenset() for _ in TIERS)
        self.control = Control(Phase.TAINTED, c, t, NO_OP, frozenset(), frozenset())
        # Any engine the spec's invariants allow beside a TAINTED controller.
        self.ghosts = frozenset(
            g for g in (Ghost(w, lab, paused, frozenset(run), empty, amb, False, swapped, doubt)
                        for w in gens for lab in labels for paused in (False, True)
                        for run in ((), (c,)) for amb in (False, True)
                        for swapped in (False, True) for doubt in (False, True))
            if all(inv.holds(self._rep(g, self.control, ())) for inv in self.spec.invariants))
        if not self.ghosts:
            return Rejection(line, "SegmentStart", f"no engine the spec allows is consistent "
                             f"with a restart to TAINTED at committed {c}, target {t}")
        self.states_max = max(self.states_max, len(self.ghosts))
        self.steps += 1
        return None


# ---------------------------------------------------------------------------- entry


def _chain_fault(reason: str) -> bool:
    """Whether the reader stopped on the chain itself (hash, prev, order) rather than on a
    record that is not a well-formed journal record (a Schema rejection)."""
    return any(w in reason for w in ("hash", "prev", "seq", "header"))


def check_records(records: Iterable[tuple[int, Mapping[str, Any]]],
                  spec: Spec = SPEC, *, checker: TraceChecker | None = None) -> TraceVerdict:
    """Check ``(line, record)`` pairs (the header first) in one pass (``checker``: one
    to feed, e.g. one continuing a previous segment)."""
    checker = checker if checker is not None else TraceChecker(spec)
    n = 0
    for line, rec in records:
        bad = checker.feed(rec, line)
        if rec.get("type") != HEADER:
            n += 1
        if bad is not None:
            return TraceVerdict(False, n, bad.line, bad.violated,
                                f"line {bad.line}: {bad.message}", checker.states_max)
    if not checker.header_seen:
        return TraceVerdict(False, 0, 1, "Schema", "line 1: the journal has no header", 0)
    return TraceVerdict(True, n, None, None, f"accepted: {n} records conform to "
                        f"{spec.name}", checker.states_max, timing_warnings([checker]))


def timing_warnings(checkers: Iterable[TraceChecker]) -> tuple[str, ...]:
    """One warning for the outcomes (and closed windows) the checkers saw come past their
    deadlines."""
    late = [x for c in checkers for x in c.late]
    count = sum(c.late_count for c in checkers)
    if not count:
        return ()
    return (f"{count} record(s) came past their deadline plus {TIMING_SLACK_S:g} s "
            f"(--strict rejects them); first: {late[0]}",)


def check_trace(records: Iterable[Mapping[str, Any]], spec: Spec = SPEC) -> TraceVerdict:
    """Check parsed journal records (the header first, as line 1)."""
    return check_records(enumerate(records, start=1), spec)


def torn_warning(line: int) -> str:
    return f"line {line} is a torn final record (a crash in mid-write), ignored"


def check_file(path: str | os.PathLike[str], spec: Spec = SPEC, *,
               after: str | os.PathLike[str] | None = None,
               strict: bool = False) -> TraceVerdict:
    """Verify the hash chain and check the records, streaming. A torn final line (a crash
    mid-write) is a step that did not happen: the records before it are checked and the
    verdict warns of it (``strict``: rejects it). With ``after`` (the journal segment this
    one continues), that segment is checked too, the link verified (its last good hash
    must be the one this header names) and this segment must start where it ended (the
    restart's generations, what it established about them).
    Raises :class:`TraceInputError` for input that is not a journal of this schema."""
    verdict, _ = _check_path(Path(path), spec, after=after, strict=strict)
    return verdict


def _check_path(p: Path, spec: Spec, *, after: str | os.PathLike[str] | None = None,
                strict: bool = False) -> tuple[TraceVerdict, TraceChecker]:
    link: str | None = None
    checker = TraceChecker(spec, strict_timing=strict)
    if after is not None:
        prev, prev_checker = _check_path(Path(after), spec)
        if not prev.accepted and prev.violated != "HashChain":
            return TraceVerdict(False, 0, None, "PreviousSegment",
                                f"the segment it continues ({after}) is rejected: "
                                f"{prev.message}", 0), checker
        prev_reader = JournalReader(after)
        for _ in prev_reader:
            pass
        link = prev_reader.report.last_hash
        checker = TraceChecker(spec, previous=prev_checker, strict_timing=strict)
    try:
        reader = JournalReader(p)
        it = iter(reader)
        first = next(it, None)
    except OSError as e:
        raise TraceInputError(unreadable(p, e)) from None
    if first is None:  # not even a header verified: this is not a journal
        raise TraceInputError(not_a_journal(p, reader.report))
    header = first[1]
    if header.get("type") == HEADER and header.get("schema") != SCHEMA:
        raise TraceInputError(f"{p}:1: journal schema {header.get('schema')!r}; this checker "
                              f"reads schema {SCHEMA} (re-record the journal)")
    if link is not None and header.get(CONTINUES) != link:
        return TraceVerdict(False, 0, 1, "SegmentLink", f"line 1: the header continues "
                            f"{str(header.get(CONTINUES))[:16]}, but {after} ends with "
                            f"{link[:16]}", 0), checker

    def records() -> Iterator[tuple[int, Mapping[str, Any]]]:
        yield first
        yield from it

    verdict = check_records(records(), spec, checker=checker)
    if not verdict.accepted:
        # The reader yields a record only once its hash verified: every line up to the
        # rejected one is intact, so the rejection stands whatever follows it.
        return verdict, checker
    return chain_verdict(verdict, reader.report, strict=strict), checker


def chain_verdict(verdict: TraceVerdict, report: Any, *, strict: bool) -> TraceVerdict:
    """An accepted ``verdict`` on the records, given how the chain itself ended."""
    if not report.ok and not report.truncated:
        return TraceVerdict(False, verdict.records, report.first_bad_line,
                            "HashChain" if _chain_fault(report.reason) else "Schema",
                            f"line {report.first_bad_line}: {report.reason}",
                            verdict.states_max)
    if report.truncated:
        warning = torn_warning(report.first_bad_line)
        if strict:
            return TraceVerdict(False, verdict.records, report.first_bad_line, "TornRecord",
                                f"line {report.first_bad_line}: a torn final record "
                                "(--strict)", verdict.states_max)
        return TraceVerdict(True, verdict.records, None, None, verdict.message,
                            verdict.states_max, (*verdict.warnings, warning))
    return verdict


__all__ = ["SPEC_VIOLATION", "TraceChecker", "TraceInputError", "TraceVerdict", "chain_verdict",
           "check_file", "check_records", "check_trace", "torn_warning"]
