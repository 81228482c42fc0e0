"""The trace checker: a journal against the spec, plus linear-time history checks.

Spec conformance. The checker keeps the set of spec states consistent with the trace
so far. Between records the set is closed under environment actions (the engine
finishing requests, which the controller never sees). A record keeps every successor
reached by an action whose trigger is the record's step, with the record's parameter,
whose controller projection (phase, committed, target, pending) equals the record's.
An empty set rejects the record. Every state in the set must satisfy every invariant
and every step every action property of the spec.

Rollout ids become spec slots. Slots are interchangeable in the spec, so each state is
kept in a canonical slot order: the bound rollouts first, in sorted id order (so the id
-> slot map is the same for every state and kept once), then the free slots, those
whose request the engine still runs (orphans) first. An admit takes the last slot
(free if any slot is) and moves it into place. Fault counts are projected away (faults
are unbounded here). Each (state set, record) pair is memoised, so a steady trace costs
one dictionary lookup per record.

History checks, in one pass over the records: a rollout interval (admit..release) never
overlaps a mutation interval (mutate_begin..its outcome); a rollout is released under
the generation it was admitted under; nothing is admitted or published after an
ambiguous mutation or a mismatch; every cache tier was verified clean (reset_ok) since
the last mutate_begin before a publish; sequence numbers increase by one.

When both fail on the same record, the history property is reported: it names the
fault more precisely than "no spec state".
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rolloutcore.journal import HEADER, RECOVER, SCHEMA, jepsen_types, read_journal
from rolloutcore.spec.lifecycle import (
    ALL_EVIDENCE,
    NO_OP,
    SPEC,
    TIERS,
    Bounds,
    Kind,
    Phase,
    Spec,
    State,
)

SPEC_VIOLATION = "spec: no state of the spec is consistent with this step"
#: Faults are not bounded when checking a trace (the count is projected away).
UNBOUNDED_FAULTS = 10**9
_MEMO_LIMIT = 200_000
_PHASES = frozenset(p.value for p in Phase)


class TraceInputError(Exception):
    """The input is not a journal at all (missing, unreadable, not JSON lines)."""


@dataclass(frozen=True)
class TraceVerdict:
    accepted: bool
    records: int  # records checked, header not counted
    first_bad_line: int | None  # 1-based line in the file, header counted
    violated: str | None  # a property name, or SPEC_VIOLATION
    message: str
    states_max: int  # the largest consistent-state set seen

    def as_json(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "records": self.records,
                "first_bad_line": self.first_bad_line, "violated": self.violated,
                "message": self.message, "states_max": self.states_max}


@dataclass(frozen=True)
class Rejection:
    line: int
    violated: str
    message: str


# ------------------------------------------------------------------------- bounds


def bounds_for(records: Sequence[Mapping[str, Any]]) -> Bounds:
    """Model bounds that fit a trace: slots for the most rollouts ever bound at once
    plus two for orphans, one generation past the highest seen, unbounded faults."""
    bound: set[Any] = set()
    most, gen = 0, 1
    for r in records:
        step = r.get("step")
        if step == "admit":
            bound.add(r.get("param"))
            if len(bound) > most:
                most = len(bound)
        elif step == "release":
            bound.discard(r.get("param"))
        elif step == RECOVER:
            bound.clear()
        target = r.get("target")
        if type(target) is int and target > gen:
            gen = target
        committed = r.get("committed")
        if type(committed) is int and committed > gen:
            gen = committed
    return Bounds(rollouts=most + 2, generations=gen + 1, faults=UNBOUNDED_FAULTS)


# ---------------------------------------------------------------------- canonical


def _sorted_free(req: Sequence[int]) -> tuple[int, ...]:
    """Requests of free slots, orphans first (descending), then the idle ones."""
    busy = sorted((r for r in req if r), reverse=True)
    return (*busy, *(0,) * (len(req) - len(busy)))


def _canonical(s: State) -> State:
    k = len(s.bind) - s.bind.count(0)  # bound slots come first, so they are 0..k-1
    free = s.req[k:]
    if len(free) > 1:
        ordered = _sorted_free(free)
        if ordered != free:
            s = s._replace(req=(*s.req[:k], *ordered))
    return s if s.faults == 0 else s._replace(faults=0)


def _move_admitted(s: State, j: int) -> State:
    """The last slot was just admitted: move it to position ``j`` of the bound ones."""
    b, r = s.bind, s.req
    return _canonical(s._replace(bind=(*b[:j], b[-1], *b[j:-1]), req=(*r[:j], r[-1], *r[j:-1])))


def _move_released(s: State, j: int, k: int) -> State:
    """Slot ``j`` of ``k`` bound ones was just released: move it among the free ones."""
    b, r = s.bind, s.req
    bind = (*b[:j], *b[j + 1:k], 0, *b[k:])
    req = (*r[:j], *r[j + 1:k], *_sorted_free((r[j], *r[k:])))
    return s._replace(bind=bind, req=req, faults=0)


# ------------------------------------------------------------------------ history


class _History:
    """The linear-time history properties; state is O(bound rollouts)."""

    def __init__(self, spec: Spec) -> None:
        types = jepsen_types(spec)
        # Outcomes after which the engine's weights are unknown: ambiguous ones (info)
        # and mismatches (outcomes that latch TAINTED).
        self.doubtful = frozenset(
            t for a in spec.actions if (t := a.trigger) is not None and a.kind is Kind.OUTCOME
            and (types[t][0] == "info" or a.dest is Phase.TAINTED))
        self.mutation_outcomes = frozenset(
            t for t, (typ, op) in types.items() if op == "mutate" and typ != "invoke")
        self.last_seq = 0
        self.open: dict[Any, Any] = {}  # rollout id -> committed at its admission
        self.mutating: int | None = None  # line of the open mutate_begin
        self.doubt: int | None = None  # line of the first ambiguous outcome
        self.clean: set[Any] = set()

    def feed(self, r: Mapping[str, Any], line: int) -> tuple[str, str] | None:
        step, seq, param = r["step"], r["seq"], r["param"]
        bad: tuple[str, str] | None = None
        if step == RECOVER:
            if seq <= self.last_seq:
                bad = ("SequenceGap", f"recover seq {seq} does not continue {self.last_seq}")
            self.open.clear()  # the crashed process's rollouts are gone
            self.mutating = None
            self.clean.clear()
        elif seq != self.last_seq + 1:
            bad = ("SequenceGap", f"seq {seq} follows {self.last_seq}")
        self.last_seq = seq
        if step == "admit":
            if self.mutating is not None and bad is None:
                bad = ("RolloutCrossesMutation",
                       f"rollout {param!r} admitted during the mutation begun on line "
                       f"{self.mutating}")
            if self.doubt is not None and bad is None:
                bad = ("ActivityAfterAmbiguity",
                       f"rollout {param!r} admitted after the ambiguous outcome on line "
                       f"{self.doubt}")
            self.open[param] = r["committed"]
        elif step == "release":
            admitted = self.open.pop(param, None)
            if admitted is not None and admitted != r["committed"] and bad is None:
                bad = ("RolloutChangedGeneration",
                       f"rollout {param!r} admitted under generation {admitted} is released "
                       f"under {r['committed']}")
        elif step == "mutate_begin":
            if self.open and bad is None:
                ids = ", ".join(sorted(map(str, self.open)))
                bad = ("RolloutCrossesMutation", f"mutation begins while rollouts are bound: {ids}")
            self.mutating = line
            self.clean.clear()
        elif step in self.mutation_outcomes:
            self.mutating = None
        elif step == "reset_ok":
            self.clean.add(param)
        elif step == "publish":
            missing = [t for t in TIERS if t not in self.clean]
            if self.doubt is not None and bad is None:
                bad = ("ActivityAfterAmbiguity",
                       f"publish after the ambiguous outcome on line {self.doubt}")
            if missing and bad is None:
                bad = ("PublishWithoutCleanTiers",
                       f"publish without reset_ok since the last mutate_begin for: "
                       f"{', '.join(missing)}")
        if step in self.doubtful and self.doubt is None:
            self.doubt = line
        return bad


# ---------------------------------------------------------------------- the checker


Key = tuple[Any, ...]


class TraceChecker:
    """Incremental checker: :meth:`feed` records one by one; ``states`` is the set of
    spec states consistent with the trace so far."""

    def __init__(self, spec: Spec = SPEC, bounds: Bounds | None = None) -> None:
        b = bounds or Bounds(rollouts=4, generations=64, faults=UNBOUNDED_FAULTS)
        self.spec = spec.with_bounds(b)
        self.types = jepsen_types(spec)
        self._expect: dict[str, tuple[str, str | None]] = {**self.types, RECOVER: (RECOVER, None)}
        groups: dict[str, list[Any]] = {}
        for a in spec.actions:
            if a.trigger is not None:
                groups.setdefault(a.trigger, []).append(a)
        # One sub-spec per trigger: successors() then only tries that trigger's actions.
        self._by_trigger = {t: replace(self.spec, actions=tuple(acts))
                            for t, acts in groups.items()}
        self._params = {t: acts[0].param for t, acts in groups.items()}
        self._env = replace(self.spec, actions=tuple(
            a for a in spec.actions if a.kind is Kind.ENVIRONMENT))
        self._memo: dict[tuple[frozenset[State], Key], frozenset[State] | str] = {}
        self._closure: dict[State, frozenset[State]] = {}
        self._succ: dict[tuple[State, str, Any], tuple[State, ...]] = {}
        self._checked: set[State] = set()
        self.bound: list[str] = []  # sorted ids of bound rollouts = slots 0..k-1
        self.terminal = False  # recovered to TAINTED: nothing may follow
        self.steps = 0  # step records seen (recover records included)
        self.history = _History(spec)
        init = self._close_all([_canonical(self.spec.initial())])
        self.states: frozenset[State] = init
        self.states_max = len(init)
        bad = self._check_states(init)
        if bad:
            raise ValueError(f"the spec's initial state violates {bad[0]}")

    # ------------------------------------------------------------------ set algebra

    def _close(self, s: State) -> frozenset[State]:
        """Every state the engine reaches from ``s`` on its own (requests finishing)."""
        out = self._closure.get(s)
        if out is None:
            seen = {s}
            todo = [s]
            while todo:
                for _a, _p, t in self._env.successors(todo.pop()):
                    t = _canonical(t)
                    if t not in seen:
                        seen.add(t)
                        todo.append(t)
            out = self._closure[s] = frozenset(seen)
        return out

    def _close_all(self, states: Iterable[State]) -> frozenset[State]:
        out: set[State] = set()
        for s in states:
            out |= self._close(s)
        return frozenset(out)

    def _check_states(self, states: Iterable[State]) -> tuple[str, str] | None:
        for s in states:
            if s in self._checked:
                continue
            for inv in self.spec.invariants:
                if not inv.holds(s):
                    return inv.name, f"invariant {inv.name} fails in a consistent state: {s}"
            self._checked.add(s)
        return None

    # ------------------------------------------------------------------------- feed

    def feed(self, r: Mapping[str, Any], line: int) -> Rejection | None:
        """Check one record (``line``: its line in the file); None if it conforms."""
        bad = self._schema(r)
        if bad:
            return Rejection(line, "Schema", bad)
        hist = self.history.feed(r, line)
        spec_bad = self._spec_step(r)
        self.steps += 1
        if hist is not None:
            extra = f" (and the spec: {spec_bad[1]})" if spec_bad else ""
            return Rejection(line, hist[0], hist[1] + extra)
        if spec_bad is not None:
            return Rejection(line, spec_bad[0], spec_bad[1])
        return None

    def _schema(self, r: Mapping[str, Any]) -> str | None:
        try:
            step, typ, op, param, phase, pending = (
                r["step"], r["type"], r["op"], r["param"], r["phase"], r["pending"])
            ints = (r["seq"], r["committed"], r["target"])
        except KeyError as e:
            return f"record lacks {e.args[0]!r}"
        expect = self._expect.get(step)
        if expect is None:
            return f"unknown step {step!r}"
        if (typ, op) != expect:
            return f"{step} is journalled as type {expect[0]!r}, op {expect[1]!r}; " \
                f"found {typ!r}, {op!r}"
        for v in ints:  # type(), not isinstance(): a bool is no sequence number
            if type(v) is not int:
                return f"seq, committed or target is not an integer: {v!r}"
        if phase not in _PHASES:
            return f"unknown phase {phase!r}"
        if type(pending) is not str or (param is not None and type(param) is not str):
            return "pending or param is not a string"
        return None

    def _spec_step(self, r: Mapping[str, Any]) -> tuple[str, str] | None:
        step, param = r["step"], r["param"]
        if step == RECOVER:
            return self._recover(r)
        if self.terminal:
            return SPEC_VIOLATION, f"{step} after the controller recovered to TAINTED, " \
                "which is terminal"
        kind = self._params[step]
        j: int | None = None
        if kind == "slot":
            k = len(self.bound)
            j = bisect_left(self.bound, param)
            is_bound = j < k and self.bound[j] == param
            if step == "admit":
                if is_bound:
                    return SPEC_VIOLATION, f"admit of rollout {param!r}, which is already bound"
                sparam: Any = self.spec.bounds.rollouts  # the last slot
            else:
                if not is_bound:
                    return SPEC_VIOLATION, f"release of rollout {param!r}, which is not bound"
                sparam = j + 1
        elif kind == "tier":
            if param not in TIERS:
                return SPEC_VIOLATION, f"{step} names unknown cache tier {param!r}"
            sparam = param
        else:
            if param is not None:
                return SPEC_VIOLATION, f"{step} takes no parameter, got {param!r}"
            sparam = None
        proj = (r["phase"], r["committed"], r["target"], r["pending"])
        key: Key = (step, sparam, j, *proj)
        nxt = self._memo.get((self.states, key))
        if nxt is None:
            nxt = self._advance(step, sparam, j, proj)
            if len(self._memo) > _MEMO_LIMIT:  # old generations' sets do not come back
                self._memo.clear()
                self._succ.clear()
                self._closure.clear()
            self._memo[(self.states, key)] = nxt
        if isinstance(nxt, str):
            return self._explain(step, param, proj, nxt)
        self.states = nxt
        self.states_max = max(self.states_max, len(nxt))
        if step == "admit":
            self.bound.insert(j or 0, param)
        elif step == "release":
            del self.bound[j or 0]
        return None

    def _advance(self, step: str, sparam: Any, j: int | None, proj: tuple[Any, ...]) -> (
        frozenset[State] | str
    ):
        """The next consistent set, or (a str) the name of the property that failed."""
        sub = self._by_trigger[step]
        phase, committed, target, pending = proj
        k = len(self.bound)
        out: list[State] = []
        for s in self.states:
            succ = self._succ.get((s, step, sparam))
            if succ is None:
                succ = self._succ[(s, step, sparam)] = tuple(
                    t for _a, p, t in sub.successors(s) if p == sparam)
            for t in succ:
                if t.phase != phase or t.committed != committed or t.target != target \
                        or t.pending != pending:
                    continue
                for prop in self.spec.action_properties:
                    if not prop.holds(s, t):
                        return prop.name
                if step == "admit":
                    t = _move_admitted(t, j or 0)
                elif step == "release":
                    t = _move_released(t, j or 0, k)
                else:
                    t = _canonical(t)
                out.append(t)
        if not out:
            return SPEC_VIOLATION
        nxt = self._close_all(out)
        bad = self._check_states(nxt)
        return bad[0] if bad else nxt

    def _explain(self, step: str, param: Any, proj: tuple[Any, ...], prop: str) -> tuple[
        str, str
    ]:
        label = step if param is None else f"{step}({param})"
        if prop != SPEC_VIOLATION:
            return prop, f"{label} leads to a state violating {prop}"
        before = sorted({f"{s.phase.value} (committed {s.committed}, target {s.target}, "
                         f"pending {s.pending})" for s in self.states})
        sub = self._by_trigger[step]
        srcs = sorted({p.value for a in sub.actions for p in a.sources})
        dests = sorted({a.dest.value if a.dest else "(same phase)" for a in sub.actions})
        known = ""
        if self.states:
            s = next(iter(self.states))  # the controller half is the same in all of them
            known = (f" (evidence: {', '.join(sorted(s.evidence)) or 'none'}; tiers cleared: "
                     f"{', '.join(t for t in TIERS if t in s.cleared) or 'none'}; rollouts "
                     f"bound: {', '.join(self.bound) or 'none'})")
        return SPEC_VIOLATION, (
            f"{label} -> {proj[0]} (committed {proj[1]}, target {proj[2]}, pending {proj[3]}) "
            f"is not a step of the spec from the consistent state(s): {'; '.join(before)}"
            f"{known}; {step} is a step from {', '.join(srcs)} to {', '.join(dests)} when "
            "its guard holds")

    # ---------------------------------------------------------------------- recovery

    def _recover(self, r: Mapping[str, Any]) -> tuple[str, str] | None:
        to = Phase(r["phase"])
        proj = (r["committed"], r["target"], r["pending"])
        self.bound = []
        if to is Phase.TAINTED:
            self.terminal, self.states = True, frozenset()
            return None
        if self.terminal:
            return "RecoverReadyOnFaith", f"recovery to {to.value} after TAINTED (it latches)"
        prior = next(iter(self.states))  # all consistent states share the controller half
        fresh = self.steps == 0  # nothing before it: the segment starts here
        if to is Phase.UNINITIALIZED:
            if prior.phase is not Phase.UNINITIALIZED or proj != (0, 0, NO_OP):
                return "RecoverReadyOnFaith", f"recovery to UNINITIALIZED from {prior.phase.value}"
            base = [s._replace(pending=NO_OP) for s in self.states]
        elif to is Phase.READY:
            quiet = prior.phase is Phase.READY or (
                prior.phase is Phase.DRAINING and prior.pending == NO_OP)
            if not fresh and (not quiet or proj != (prior.committed, 0, NO_OP)):
                return "RecoverReadyOnFaith", (
                    f"recovery to READY (committed {proj[0]}) from {prior.phase.value} "
                    f"(committed {prior.committed}, pending {prior.pending}): the engine may "
                    "be paused or mutated")
            if proj[1:] != (0, NO_OP) or proj[0] < 1:
                return "RecoverReadyOnFaith", f"recovery to READY with {proj}"
            free = (0,) * self.spec.bounds.rollouts
            if fresh:
                # No history: any engine consistent with READY under that generation.
                c = proj[0]
                subsets: tuple[frozenset[int], ...] = (frozenset(), frozenset({c}))
                base = [
                    self.spec.initial()._replace(
                        phase=Phase.READY, committed=c, evidence=ALL_EVIDENCE, weights=c,
                        label=c, caches=(a, b, m))
                    for a in subsets for b in subsets for m in subsets]
            else:
                # The engine is as the crash left it; bound rollouts become orphans.
                base = [_canonical(s._replace(
                    phase=Phase.READY, target=0, pending=NO_OP, bind=free,
                    cleared=frozenset(), evidence=ALL_EVIDENCE, req=_sorted_free(s.req)))
                    for s in self.states]
        else:
            return "RecoverReadyOnFaith", f"recovery to {to.value}: only READY, " \
                "UNINITIALIZED or TAINTED are recovery states"
        nxt = self._close_all(base)
        bad = self._check_states(nxt)
        if bad:
            return bad
        self.states = nxt
        self.states_max = max(self.states_max, len(nxt))
        return None


# ---------------------------------------------------------------------------- entry


def check_trace(records: Iterable[Mapping[str, Any]], spec: Spec = SPEC) -> TraceVerdict:
    """Check parsed journal records (the header, if first, is line 1)."""
    recs = list(records)
    start = 0
    if recs and recs[0].get("type") == HEADER:
        h = recs[0]
        if h.get("schema") != SCHEMA or h.get("spec") != spec.name:
            return TraceVerdict(False, 0, 1, "Schema", f"header is for schema "
                                f"{h.get('schema')!r} of spec {h.get('spec')!r}, not schema "
                                f"{SCHEMA} of {spec.name}", 0)
        start = 1
    checker = TraceChecker(spec, bounds_for(recs[start:]))
    for i in range(start, len(recs)):
        bad = checker.feed(recs[i], i + 1)
        if bad is not None:
            return TraceVerdict(False, i + 1 - start, bad.line, bad.violated,
                                f"line {bad.line}: {bad.message}", checker.states_max)
    n = len(recs) - start
    return TraceVerdict(True, n, None, None, f"accepted: {n} records conform to "
                        f"{spec.name}", checker.states_max)


def check_file(path: str | os.PathLike[str], spec: Spec = SPEC) -> TraceVerdict:
    """Verify the hash chain, then check the records. A torn final line (a crash
    mid-write) is a step that did not happen: the records before it are checked."""
    p = Path(path)
    try:
        report, records = read_journal(p)
    except FileNotFoundError:
        raise TraceInputError(f"{p}: no such file") from None
    except OSError as e:
        raise TraceInputError(f"{p}: cannot read: {e.strerror or e}") from None
    if not records:  # not even a header verified: this is not a journal
        raise TraceInputError(f"{p}: not a RolloutCore journal (line 1: {report.reason})")
    if not report.ok and not report.truncated:
        return TraceVerdict(False, report.records - 1, report.first_bad_line, "HashChain",
                            f"line {report.first_bad_line}: {report.reason}", 0)
    verdict = check_trace(records, spec)
    if report.truncated and verdict.accepted:
        verdict = replace(verdict, message=verdict.message + f" (line "
                          f"{report.first_bad_line} is a torn final record: that step did "
                          "not happen)")
    return verdict
