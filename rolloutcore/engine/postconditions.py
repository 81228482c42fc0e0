"""Postconditions: the only place where evidence becomes a spec outcome.

A :class:`Decision` holds everything an outcome is decided on: the operation, the
evidence the adapter returned (or the error that stopped the call before any), and what
the controller expected of the engine (the target's label, identity and probe
reference). :func:`decide` names the outcome trigger the controller takes, with the
reason in words. The runner journals the decision with its outcome, and the trace
checker calls :func:`decide` again on the journalled decision: an outcome that
disagrees with its own evidence is rejected. An HTTP 200 alone never yields an
``*_ok``: the body, a read-back or a counter must confirm it.

Only ``failed`` outcomes are retried by the runner: a definite answer (a refusal with
proof of no effect, a mismatch) does not change by asking again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from rolloutcore.adapters.contract import (
    EngineReport,
    EvidenceFormatError,
    FenceEvidence,
    MutationEvidence,
    MutationOutcome,
    PauseEvidence,
    ProbeEvidence,
    RankStage,
    ResetEvidence,
    ResumeEvidence,
    conforms,
    evidence_from_json,
    evidence_to_json,
    type_hints,
    type_name,
)
from rolloutcore.engine.identity import ADAPTER_JOIN, UNSTAGED
from rolloutcore.spec.lifecycle import TIERS, Result
from rolloutcore.spec.triggers import OUTCOMES, Op, Trigger

#: Default tolerance of the scored probe: max |log-probability difference| per position,
#: in nats. Same weights score identically (0.0 observed); vLLM against the source-side
#: reference differs by <= 3e-5; other weights by whole nats.
PROBE_TOLERANCE = 1e-3


class Outcome(NamedTuple):
    trigger: Trigger
    reason: str


@dataclass(frozen=True)
class Expected:
    """What the controller expects of the engine, from the target it installs."""

    label: str | None = None
    identity: str | None = None
    probe_tokens: tuple[int, ...] | None = None  # greedy probe: the reference output
    probe_logprobs: tuple[float, ...] | None = None  # scored probe: the reference scores
    tolerance: float = PROBE_TOLERANCE
    #: No request has run since the caches were verified clean, so any prefix hit can
    #: only be a stale entry.
    first_since_reset: bool = True


@dataclass(frozen=True)
class Decision:
    op: Op
    evidence: tuple[Any, ...] = ()
    expected: Expected | None = None
    error: str | None = None  # the call failed before returning evidence
    facts: Mapping[str, Any] = field(default_factory=dict)  # extra context (attempt, ...)


def _outcome(op: Op, result: Result, reason: str) -> Outcome:
    return Outcome(OUTCOMES[op][result], reason)


def _failed(op: Op, reason: str) -> Outcome:
    return _outcome(op, Result.FAILED, reason)


# ------------------------------------------------------------------------ per operation


def _pause(op: Op, ev: PauseEvidence) -> Outcome:
    if ev.paused_read_back is True and ev.running_after == 0:
        return _outcome(op, Result.OK, f"is_paused=true, running={ev.running_after}")
    return _failed(op, f"status={ev.http_status} paused={ev.paused_read_back} "
                       f"running={ev.running_after}")


def _resume(ev: ResumeEvidence) -> Outcome:
    if ev.paused_read_back is False:
        return _outcome(Op.RESUME, Result.OK, "is_paused=false")
    return _failed(Op.RESUME, f"status={ev.http_status} paused={ev.paused_read_back}")


def _mutation(d: Decision) -> Outcome:
    """A refusal is definite (the old evidence stands again) only if a read after it shows
    the engine still on the committed generation: its label and its weights' identity
    (``expected``). Whatever else it shows (a label set by hand, other weights, no
    answer), the committed evidence no longer stands: ambiguous, so TAINTED and fenced."""
    ev = d.evidence[0] if d.evidence else None
    rest = d.evidence[1:]
    if not isinstance(ev, MutationEvidence) or len(rest) > 1 or (
            rest and not isinstance(rest[0], EngineReport)):
        raise EvidenceFormatError(f"{d.op}: expected a MutationEvidence, then at most one "
                                  f"EngineReport, got {[type(e).__name__ for e in d.evidence]}")
    result = {
        MutationOutcome.COMPLETED: Result.OK,
        MutationOutcome.NOT_MUTATED: Result.REFUSED,
        MutationOutcome.AMBIGUOUS: Result.AMBIGUOUS,
    }[ev.outcome]
    if result is not Result.REFUSED:
        return _outcome(Op.MUTATE, result, ev.observed)
    report = rest[0] if rest else None
    if d.expected is None or report is None:
        return _outcome(Op.MUTATE, Result.AMBIGUOUS, f"{ev.observed}; the refusal was not "
                        "confirmed by a read of the engine")
    if report.label != d.expected.label or report.identity != d.expected.identity:
        return _outcome(Op.MUTATE, Result.AMBIGUOUS, f"{ev.observed}; but the engine reports "
                        f"label {report.label!r}, identity {str(report.identity)[:16]}, not "
                        f"the committed {d.expected.label!r}, "
                        f"{str(d.expected.identity)[:16]}")
    return _outcome(Op.MUTATE, result, f"{ev.observed}; the engine still reports the "
                    f"committed label {report.label!r} and identity")


def _reset(ev: ResetEvidence) -> Outcome:
    if ev.http_status != 200:
        return _failed(Op.RESET, f"{ev.tier}: HTTP {ev.http_status}")
    if ev.body_success is False:
        return _failed(Op.RESET, f"{ev.tier}: refused (success:false)")
    if ev.body_success is True:
        return _outcome(Op.RESET, Result.OK, f"{ev.tier}: body success:true")
    if ev.entries_after == 0:
        return _outcome(Op.RESET, Result.OK, f"{ev.tier}: engine reports 0 entries after the "
                        "reset")
    if ev.tier_absent:
        return _outcome(Op.RESET, Result.OK, f"{ev.tier}: the engine has no such cache")
    return _failed(Op.RESET, f"{ev.tier}: 200 with nothing to verify it by")


def identity_difference(held: str, expected: str) -> str:
    """Two identities that differ, in words: each part that differs (base, adapter), its
    first 16 characters, the adapter's in full when it names no digest."""
    def parts(identity: str) -> tuple[str, str | None]:
        base, sep, adapter = identity.partition(ADAPTER_JOIN)
        return base, adapter if sep else None

    (hb, ha), (eb, ea) = parts(held), parts(expected)
    out = [] if hb == eb else [f"base {hb[:16]} != {eb[:16]}"]
    if ha != ea:
        shown = ha if ha is None or ha.startswith(UNSTAGED) else ha[:16]
        out.append(f"adapter {shown} != {ea if ea is None else ea[:16]}")
    return "; ".join(out)


def _validation(op: Op, report: EngineReport | None, expected: Expected) -> Outcome:
    if report is None or report.label is None or report.identity is None:
        return _failed(op, "label or identity could not be read")
    if report.label != expected.label:
        return _outcome(op, Result.MISMATCH, f"label {report.label!r} != {expected.label!r}")
    if report.identity != expected.identity:
        return _outcome(op, Result.MISMATCH, "identity " + identity_difference(
            report.identity, str(expected.identity)))
    return _outcome(op, Result.OK, f"label {expected.label}, identity "
                    f"{str(expected.identity)[:16]}")


def _probe(op: Op, ev: ProbeEvidence | None, expected: Expected) -> Outcome:
    if ev is None or (ev.tokens is None and ev.prompt_logprobs is None):
        return _failed(op, (ev.error if ev else None) or f"HTTP {ev.http_status if ev else None}")
    if ev.prefix_hits and expected.first_since_reset:
        return _outcome(op, Result.MISMATCH, f"{ev.prefix_hits} prefix-cache hits on the first "
                        "post-update request: stale KV was reused")
    if expected.probe_logprobs is not None:
        return _scored(op, ev, expected.probe_logprobs, expected.tolerance)
    ref = expected.probe_tokens or ()
    tokens = tuple(ev.tokens or ())
    if tokens != tuple(ref):
        first = next((i for i, (a, b) in enumerate(zip(tokens, ref, strict=False)) if a != b),
                     min(len(tokens), len(ref)))
        return _outcome(op, Result.MISMATCH, f"tokens differ from the reference at position "
                        f"{first}")
    return _outcome(op, Result.OK, f"{len(ref)} tokens equal the reference")


def _scored(op: Op, ev: ProbeEvidence, ref: tuple[float, ...], tolerance: float) -> Outcome:
    got = ev.prompt_logprobs
    if got is None:
        return _failed(op, "the engine returned no prompt log-probabilities")
    scores = got[1:] if len(got) == len(ref) + 1 else got  # position 0 has no score
    if len(scores) != len(ref):
        return _failed(op, f"{len(scores)} scored positions, expected {len(ref)}")
    worst, where = 0.0, -1
    for i, (a, b) in enumerate(zip(scores, ref, strict=True)):
        if a is None or not math.isfinite(a):
            return _outcome(op, Result.MISMATCH, f"position {i + 1} has no finite score")
        d = abs(a - b)
        if d > worst:
            worst, where = d, i + 1
    if worst > tolerance:
        return _outcome(op, Result.MISMATCH, f"log-probability at position {where} differs by "
                        f"{worst:.3g} nats (tolerance {tolerance:g})")
    return _outcome(op, Result.OK, f"{len(ref)} positions within {tolerance:g} nats "
                    f"(max |d| {worst:.2g})")


def _bootstrap(report: EngineReport | None, ev: ProbeEvidence | None,
               expected: Expected) -> Outcome:
    op = Op.BOOTSTRAP
    if report is None or ev is None:
        return _failed(op, "engine could not be read")
    if report.paused is not False:
        return _failed(op, f"engine paused={report.paused}")
    v = _validation(op, report, expected)
    if v.trigger != Trigger.BOOTSTRAP_OK:
        return v
    # Hits are no sign of staleness here: nothing has changed the weights yet.
    p = _probe(op, replace(ev, prefix_hits=None), expected)
    if p.trigger != Trigger.BOOTSTRAP_OK:
        return p
    return _outcome(op, Result.OK, f"{v.reason}; {p.reason}")


def _fence(ev: FenceEvidence) -> Outcome:
    if ev.paused_read_back is True and ev.label_read_back == ev.label \
            and ev.running_after == 0:
        return _outcome(Op.FENCE, Result.OK, f"paused, running 0, label {ev.label!r}")
    return _failed(Op.FENCE, ev.error or f"paused={ev.paused_read_back} label="
                   f"{ev.label_read_back!r} running={ev.running_after}")


def _readmit(d: Decision) -> Outcome:
    """A re-admission: every step of the procedure must have succeeded, the engine must
    read as the committed generation (label, identity) and compute as it (probe)."""
    op, expected = Op.READMIT, _expected(d)
    evs = {type(e).__name__: [x for x in d.evidence if type(x) is type(e)] for e in d.evidence}
    needed = ("PauseEvidence", "MutationEvidence", "ResetEvidence", "EngineReport",
              "ResumeEvidence", "ProbeEvidence")
    missing = [n for n in needed if n not in evs]
    if missing:
        return _failed(op, f"the procedure stopped before: {', '.join(missing)}")
    if _pause(Op.PAUSE_ABORT, evs["PauseEvidence"][0]).trigger != Trigger.PAUSE_ABORT_OK:
        return _failed(op, "the engine could not be shown paused and idle")
    m = _mutation(Decision(Op.MUTATE, (evs["MutationEvidence"][0],)))
    if m.trigger != Trigger.MUTATE_OK:
        return _failed(op, f"reload: {m.reason}")
    resets = evs["ResetEvidence"]
    bad = [r.reason for r in map(_reset, resets) if r.trigger != Trigger.RESET_OK]
    if bad or len(resets) != len(TIERS):
        return _failed(op, f"caches not verified clean: {bad or len(resets)}")
    v = _validation(op, evs["EngineReport"][0], expected)
    if v.trigger != Trigger.READMIT_OK:
        return v
    if _resume(evs["ResumeEvidence"][0]).trigger != Trigger.RESUME_OK:
        return _failed(op, "the engine could not be shown running")
    p = _probe(op, evs["ProbeEvidence"][0], expected)
    if p.trigger != Trigger.READMIT_OK:
        return p
    return _outcome(op, Result.OK, f"{v.reason}; {p.reason}")


def _audit(d: Decision) -> Outcome:
    """An audit of a serving engine: its label, identity and run state read as the
    committed generation's, and a probe computes as it. A definite answer against (other
    label or identity, paused, another computation) is a mismatch; anything unread is a
    failure (the engine's state is unknown). Prefix hits are no sign of staleness: the
    engine serves, its caches hold this generation's entries."""
    op, expected = Op.AUDIT, _expected(d)
    report, probe = _pair(d)
    if report is None or report.paused is None:
        return _failed(op, "the engine's state could not be read")
    if report.paused:
        return _outcome(op, Result.MISMATCH, "the engine reads as paused: it does not serve")
    v = _validation(op, report, expected)
    if v.trigger != Trigger.AUDIT_OK:
        return v
    p = _probe(op, probe, replace(expected, first_since_reset=False))
    if p.trigger != Trigger.AUDIT_OK:
        return p
    return _outcome(op, Result.OK, f"{v.reason}, running; {p.reason}")


def _one(d: Decision, kind: type[Any]) -> Any:
    ev = d.evidence[0] if len(d.evidence) == 1 else None
    if not isinstance(ev, kind):
        raise EvidenceFormatError(f"{d.op}: expected one {kind.__name__}, got "
                                  f"{[type(e).__name__ for e in d.evidence]}")
    return ev


def _expected(d: Decision) -> Expected:
    if d.expected is None:
        raise EvidenceFormatError(f"{d.op}: the decision names no expected target")
    return d.expected


_DECIDERS: dict[Op, Callable[[Decision], Outcome]] = {
    Op.PAUSE: lambda d: _pause(Op.PAUSE, _one(d, PauseEvidence)),
    Op.PAUSE_ABORT: lambda d: _pause(Op.PAUSE_ABORT, _one(d, PauseEvidence)),
    Op.RESUME: lambda d: _resume(_one(d, ResumeEvidence)),
    Op.MUTATE: _mutation,
    Op.RESET: lambda d: _reset(_one(d, ResetEvidence)),
    Op.VALIDATE: lambda d: _validation(Op.VALIDATE, _one(d, EngineReport), _expected(d)),
    Op.PROBE: lambda d: _probe(Op.PROBE, _one(d, ProbeEvidence), _expected(d)),
    Op.FENCE: lambda d: _fence(_one(d, FenceEvidence)),
    Op.BOOTSTRAP: lambda d: _bootstrap(*_pair(d), _expected(d)),
    Op.READMIT: _readmit,
    Op.AUDIT: _audit,
}


def _pair(d: Decision) -> tuple[EngineReport | None, ProbeEvidence | None]:
    report = next((e for e in d.evidence if isinstance(e, EngineReport)), None)
    probe = next((e for e in d.evidence if isinstance(e, ProbeEvidence)), None)
    return report, probe


def decide(d: Decision) -> Outcome:
    """The outcome ``d`` stands for. Raises :class:`EvidenceFormatError` if the decision
    does not carry the evidence its operation is decided on."""
    if d.error is not None:
        if d.op is Op.MUTATE:  # a collective that failed to report: may have happened
            return _outcome(Op.MUTATE, Result.AMBIGUOUS, d.error)
        return _failed(d.op, d.error)
    decider = _DECIDERS.get(d.op)
    if decider is None:
        raise EvidenceFormatError(f"no postcondition for operation {d.op!r}")
    return decider(d)


# ------------------------------------------------------------------------ JSON form


def decision_to_json(d: Decision) -> dict[str, Any]:
    out: dict[str, Any] = {"op": d.op.value,
                           "evidence": [evidence_to_json(e) for e in d.evidence]}
    if d.expected is not None:
        e = d.expected
        out["expected"] = {
            "label": e.label, "identity": e.identity,
            "probe_tokens": None if e.probe_tokens is None else list(e.probe_tokens),
            "probe_logprobs": None if e.probe_logprobs is None else list(e.probe_logprobs),
            "tolerance": e.tolerance, "first_since_reset": e.first_since_reset}
    if d.error is not None:
        out["error"] = d.error
    if d.facts:
        out["facts"] = dict(d.facts)
    return out


def decision_from_json(obj: Any) -> Decision:
    """The decision a journal record carries; :class:`EvidenceFormatError` if malformed."""
    if not isinstance(obj, Mapping):
        raise EvidenceFormatError(f"evidence is not an object: {type(obj).__name__}")
    unknown = set(obj) - {"op", "evidence", "expected", "error", "facts"}
    if unknown:
        raise EvidenceFormatError(f"unknown evidence field(s) {sorted(unknown)}")
    try:
        op = Op(str(obj.get("op")))
    except ValueError:
        raise EvidenceFormatError(f"unknown operation {obj.get('op')!r}") from None
    if "evidence" not in obj:
        raise EvidenceFormatError("the decision has no evidence list")
    evs = obj["evidence"]
    if not isinstance(evs, list):
        raise EvidenceFormatError("evidence.evidence is not a list")
    expected: Expected | None = None
    raw = obj.get("expected")
    if raw is not None:
        if not isinstance(raw, Mapping) or set(raw) != {f.name for f in _EXPECTED_FIELDS}:
            raise EvidenceFormatError("evidence.expected does not have exactly the fields of "
                                      "an expectation")
        hints = type_hints(Expected)
        for k, v in raw.items():
            if not conforms(v, hints[k]):
                raise EvidenceFormatError(f"evidence.expected.{k} is not "
                                          f"{type_name(hints[k])}: {v!r:.40}")
        kw: dict[str, Any] = {str(k): (tuple(v) if isinstance(v, list) else v)
                              for k, v in raw.items()}
        try:
            expected = Expected(**kw)
        except TypeError as e:
            raise EvidenceFormatError(f"evidence.expected: {e}") from None
    error = obj.get("error")
    facts = obj.get("facts", {})
    if (error is not None and not isinstance(error, str)) or not isinstance(facts, Mapping):
        raise EvidenceFormatError("evidence.error or evidence.facts is malformed")
    return Decision(op, tuple(evidence_from_json(e) for e in evs), expected, error, facts)


_EXPECTED_FIELDS = Expected.__dataclass_fields__.values()


# ------------------------------------------------------------------ staged updates


def receive_kind(target_identity: str, stage: RankStage) -> str:
    """What a rank's staging buffer holds, decided from its evidence (a kind of
    spec/staged.py ``KINDS``): ``partial`` (cut short), ``corrupt`` (a chunk failed, the
    rank refused, or it cannot name a digest), ``other`` (complete, but another
    generation's bytes: a wrong checkpoint, a delta on the wrong base), or ``exact`` (the
    target's identity: every name, dtype, shape and byte)."""
    if not stage.complete:
        return "partial"
    if stage.error or stage.identity is None:
        return "corrupt"
    return "exact" if stage.identity == target_identity else "other"
