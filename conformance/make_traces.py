"""Generate the trace corpus in ``conformance/traces/{good,bad}``.

Good traces come from driving a real :class:`Controller` with a :class:`Journal` sink
through scripted scenarios (crash and restart included, through ``open_controller``).
Bad traces are good ones tampered with and re-chained, so that the hash chain is valid
and only the checker's spec and history checks can catch them (one is left with a
broken chain on purpose). A bad file is named ``<property>__<what>.jsonl``: the
property the checker must report (``spec`` for "no spec state is consistent").

A fixed clock makes the output byte-for-byte reproducible; the test suite regenerates
the corpus and compares. Run: ``python -m rolloutcore.conformance.make_traces``.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rolloutcore.adapters.contract import (
    EngineReport,
    FenceEvidence,
    MutationEvidence,
    MutationOutcome,
    PauseEvidence,
    PauseMode,
    ProbeEvidence,
    ResetEvidence,
    ResumeEvidence,
)
from rolloutcore.check.claims import request_detail
from rolloutcore.engine.controller import Controller, IllegalTransition
from rolloutcore.engine.postconditions import Decision, Expected, decision_to_json
from rolloutcore.journal import (
    DECISION,
    Journal,
    dumps_line,
    open_controller,
    read_journal,
    rechain,
)
from rolloutcore.spec.lifecycle import TIERS
from rolloutcore.spec.triggers import Op

TRACES = Path(__file__).resolve().parent / "traces"
Record = dict[str, Any]


class FixedClock:
    """Deterministic timestamps (quarter seconds: exact in binary, stable repr)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        self.t += 0.25
        return self.t


# ----------------------------------------------------------------------- evidence

PROBE_PROMPT = (5, 3, 8, 1, 9)


def _label(g: int) -> str:
    return f"gen-{g}"


def _identity(g: int) -> str:
    return hashlib.sha256(f"weights of generation {g}".encode()).hexdigest()


def _reference(g: int) -> tuple[int, ...]:
    return tuple((g * 7 + k * 3) % 1024 for k in range(4))


def _expected(g: int, **kw: Any) -> Expected:
    return Expected(label=_label(g), identity=_identity(g), probe_tokens=_reference(g), **kw)


def _audited(g: int) -> Expected:
    """What an audit expects: the committed generation (prefix hits are no sign of
    staleness on a serving engine)."""
    return _expected(g, first_since_reset=False)


def sample_decision(c: Controller, trigger: str, param: str | None = None, *,
                    first_probe: bool = True) -> Decision:
    """Evidence that decides ``trigger`` for the state ``c`` is in: what the runner would
    journal had the engine answered so (``first_probe``: no probe was attempted since the
    invalidation)."""
    g = c.control.target or c.control.committed or 1
    paused_ok = PauseEvidence(PauseMode.WAIT, 200, {"status": "paused"}, True, 0)
    k = c.control.committed
    readmitted = (
        PauseEvidence(PauseMode.ABORT, 200, {"status": "paused"}, True, 0),
        MutationEvidence(MutationOutcome.COMPLETED, f"reloaded {_label(k)}", 0.25, 4096),
        *(ResetEvidence(t, 200, True) for t in TIERS),
        EngineReport(_label(k), _identity(k), True, 0),
        ResumeEvidence(200, {"status": "resumed"}, False),
        ProbeEvidence(PROBE_PROMPT, _reference(k), 200, "length", 0))
    table: dict[str, Decision] = {
        "bootstrap_ok": Decision(Op.BOOTSTRAP, (
            EngineReport(_label(1), _identity(1), False, 0),
            ProbeEvidence(PROBE_PROMPT, _reference(1), 200, "length", 0)), _expected(1)),
        "bootstrap_failed": Decision(Op.BOOTSTRAP, error="ConnectError: connection refused"),
        "bootstrap_mismatch": Decision(Op.BOOTSTRAP, (
            EngineReport(_label(1), _identity(0), False, 0),
            ProbeEvidence(PROBE_PROMPT, _reference(1), 200, "length", 0)), _expected(1)),
        "pause_ok": Decision(Op.PAUSE, (paused_ok,)),
        "pause_failed": Decision(Op.PAUSE, (PauseEvidence(PauseMode.WAIT, 503, None, None,
                                                          None),)),
        "pause_abort_ok": Decision(Op.PAUSE_ABORT, (
            PauseEvidence(PauseMode.ABORT, 200, {"status": "paused"}, True, 0),)),
        "pause_abort_failed": Decision(Op.PAUSE_ABORT, (
            PauseEvidence(PauseMode.ABORT, 200, {"status": "paused"}, True, 1),)),
        "mutate_ok": Decision(Op.MUTATE, (MutationEvidence(
            MutationOutcome.COMPLETED, f"loaded and finalised as {_label(g)}", 0.25, 4096),)),
        "mutate_refused": Decision(Op.MUTATE, (MutationEvidence(
            MutationOutcome.NOT_MUTATED, "refused before any byte moved", 0.25),
            EngineReport(_label(k), _identity(k), True, 0)), _expected(k)),
        "mutate_ambiguous": Decision(Op.MUTATE, (MutationEvidence(
            MutationOutcome.AMBIGUOUS, "mutate did not return within 10.00 s", 10.0),)),
        "reset_ok": Decision(Op.RESET, (ResetEvidence(str(param), 200, True) if param ==
                                        "prefix" else ResetEvidence(str(param), 200, None, 0),)),
        "reset_failed": Decision(Op.RESET, (ResetEvidence(str(param), 200, False),)),
        "validate_ok": Decision(Op.VALIDATE, (EngineReport(_label(g), _identity(g), True, 0),),
                                _expected(g)),
        "validate_failed": Decision(Op.VALIDATE, error="ReadTimeout: timed out"),
        "validate_mismatch": Decision(Op.VALIDATE, (
            EngineReport(_label(g - 1), _identity(g), True, 0),), _expected(g)),
        "resume_ok": Decision(Op.RESUME, (ResumeEvidence(200, {"status": "resumed"}, False),)),
        "resume_failed": Decision(Op.RESUME, error="ReadTimeout: timed out"),
        "probe_ok": Decision(Op.PROBE, (ProbeEvidence(PROBE_PROMPT, _reference(g), 200,
                                                      "length", 0),),
                             _expected(g, first_since_reset=first_probe)),
        "probe_failed": Decision(Op.PROBE, error="ReadTimeout: timed out"),
        "probe_mismatch": Decision(Op.PROBE, (ProbeEvidence(
            PROBE_PROMPT, _reference(g + 1), 200, "length", 0),), _expected(g)),
        "fence_ok": Decision(Op.FENCE, (FenceEvidence(
            f"tainted:{_label(g)}", 200, 200, True, f"tainted:{_label(g)}", 0),)),
        "fence_failed": Decision(Op.FENCE, (FenceEvidence(
            f"tainted:{_label(g)}", None, None, None, None, None, "ConnectError: refused"),)),
        "readmit_ok": Decision(Op.READMIT, readmitted, _expected(k)),
        "readmit_mismatch": Decision(Op.READMIT, (
            *readmitted[:5], EngineReport(_label(k), _identity(0), True, 0), *readmitted[6:]),
            _expected(k)),
        "readmit_failed": Decision(Op.READMIT, readmitted[:1], _expected(k)),
        # A serving engine's probe may hit its prefix cache: no sign of staleness there.
        "audit_ok": Decision(Op.AUDIT, (
            EngineReport(_label(k), _identity(k), False, 2),
            ProbeEvidence(PROBE_PROMPT, _reference(k), 200, "length", 3)), _audited(k)),
        "audit_failed": Decision(Op.AUDIT, error="ConnectError: connection refused"),
        # Relaunched out of band: the initial label and other weights.
        "audit_mismatch": Decision(Op.AUDIT, (EngineReport(_label(1), _identity(0), False, 0),),
                                   _audited(k)),
    }
    return table[trigger]


#: Per controller (by id, with a weak reference to tell a reused id): whether it attempted
#: a probe since its caches were last invalidated (what the runner's first_since_reset
#: says).
_PROBED: dict[int, tuple[weakref.ref[Controller], bool]] = {}


def _probed(c: Controller) -> bool:
    ref, probed = _PROBED.get(id(c), (None, False))
    return probed and ref is not None and ref() is c


def _set_probed(c: Controller, probed: bool) -> None:
    _PROBED[id(c)] = (weakref.ref(c), probed)


def out(c: Controller, trigger: str, param: str | None = None, **detail: str) -> None:
    """Take an outcome step, journalled with the decision it stands for (and, as the
    runner does, a bootstrap's outcome with the initial generation it is about)."""
    if trigger.startswith("bootstrap_"):
        detail = {"checkpoint": "/checkpoints/gen-1", "label": _label(1), **detail}
    c.fire(trigger, param, {DECISION: decision_to_json(sample_decision(
        c, trigger, param, first_probe=not _probed(c))), **detail})
    if trigger.startswith("probe_"):
        _set_probed(c, True)


def control_step(c: Controller, trigger: str, param: str | None = None) -> None:
    """Take a control step with the detail the runner journals it with."""
    if trigger == "request_update":
        request_update(c)
        return
    detail: dict[str, Any] | None = None
    if trigger == "publish":
        detail = publish_detail(c.control.target)
    elif trigger in ("mutate_begin", "cancel_update"):
        detail = mutate_detail(c)
    elif trigger == "readmit_begin":
        k = c.control.committed
        detail = {"who": "operator", "target": _label(k), "identity": _identity(k)}
    c.fire(trigger, param, detail)
    if trigger == "invalidated":
        _set_probed(c, False)


# --------------------------------------------------------------------- scenarios


def bootstrap(c: Controller, *, fail_first: bool = False) -> None:
    if fail_first:
        c.fire("bootstrap_begin")
        out(c, "bootstrap_failed")
    c.fire("bootstrap_begin")
    out(c, "bootstrap_ok")


def request_update(c: Controller) -> None:
    g = c.control.committed + 1
    e = _expected(g)
    c.fire("request_update", detail=request_detail(
        _label(g), _identity(g), PROBE_PROMPT, e.probe_tokens, e.probe_logprobs, e.tolerance))


def mutate_detail(c: Controller) -> dict[str, Any]:
    """How a step that acts on the target names it (the mutation, a cancel)."""
    g = c.control.target
    return {"target": _label(g), "identity": _identity(g)}


def cancel_update(c: Controller) -> None:
    c.fire("cancel_update", detail=mutate_detail(c))


def drain_and_pause(c: Controller, *, pause_fails: bool = False) -> None:
    request_update(c)
    if pause_fails:
        c.fire("pause_begin")
        out(c, "pause_failed")
        c.fire("resume_begin")
        out(c, "resume_ok")
    c.fire("pause_begin")
    out(c, "pause_ok")


def mutate(c: Controller, outcome: str = "mutate_ok") -> None:
    # The detail carries credentials on purpose: the journal must redact them.
    c.fire("mutate_begin", detail={**mutate_detail(c), "backend": "nccl", "headers": {
        "Authorization": "Bearer abc123", "X-Api-Key": "k-456"}})
    out(c, outcome)


def invalidate(c: Controller, *, fail: tuple[str, ...] = ()) -> None:
    for tier in TIERS:
        if tier in fail:
            c.fire("reset_begin", tier)
            out(c, "reset_failed", tier)
        c.fire("reset_begin", tier)
        out(c, "reset_ok", tier)
    control_step(c, "invalidated")


def validate_resume_probe(c: Controller, *, retries: bool = False) -> None:
    for step in ("validate", "resume", "probe"):
        if retries:
            c.fire(f"{step}_begin")
            out(c, f"{step}_failed")
        c.fire(f"{step}_begin")
        out(c, f"{step}_ok")


def full_cycle(c: Controller, *, retries: bool = False) -> None:
    drain_and_pause(c, pause_fails=retries)
    mutate(c)
    invalidate(c, fail=("encoder",) if retries else ())
    validate_resume_probe(c, retries=retries)
    publish(c)


def publish(c: Controller) -> None:
    c.fire("publish", detail=publish_detail(c.control.target))


def publish_detail(g: int) -> dict[str, Any]:
    return {"label": _label(g), "identity": _identity(g)}


def fence(c: Controller) -> None:
    c.fire("fence_begin")
    out(c, "fence_ok")


def rollouts(c: Controller, *ids: str) -> None:
    for rid in ids:
        c.admit(rid)
    for rid in ids:
        c.release(rid, detail={"tokens": 17})  # a token count: kept (redaction is by key name)


def s_bootstrap(c: Controller) -> None:
    bootstrap(c, fail_first=True)


def s_admit_release(c: Controller) -> None:
    bootstrap(c)
    c.admit("a")
    c.admit("b")
    c.release("a")
    c.admit("c")
    c.release("b")
    c.release("c")


def s_update_cycle(c: Controller) -> None:
    bootstrap(c)
    rollouts(c, "r1", "r2")
    full_cycle(c)
    rollouts(c, "r3")
    full_cycle(c)
    rollouts(c, "r4")


def s_update_while_bound(c: Controller) -> None:
    bootstrap(c)
    c.admit("r1")
    request_update(c)
    try:  # the drain holds: refused, and nothing is journalled
        c.fire("pause_begin")
        raise AssertionError("pause_begin must be refused while r1 is bound")
    except IllegalTransition:
        pass
    c.release("r1")
    c.fire("pause_begin")
    out(c, "pause_ok")
    mutate(c)
    invalidate(c)
    validate_resume_probe(c)
    publish(c)
    rollouts(c, "r2")


def s_abort_drain(c: Controller) -> None:
    """Drain policy wait-then-abort: a rollout still running is released as aborted; the
    abort-mode pause shows it gone before the mutation."""
    bootstrap(c)
    c.admit("r1")
    c.admit("r2")
    request_update(c)
    c.release("r1")
    c.abort("r2", {"reason": "still running 0.5 s into the drain"})
    c.fire("pause_abort_begin")
    out(c, "pause_abort_ok")
    mutate(c)
    invalidate(c)
    validate_resume_probe(c)
    publish(c)
    c.release("r2")  # the application lets the aborted rollout go: nothing journalled
    rollouts(c, "r3")


def s_cancel_while_draining(c: Controller) -> None:
    bootstrap(c)
    c.admit("r1")
    request_update(c)
    cancel_update(c)
    c.release("r1")
    rollouts(c, "r2")


def s_refused_then_reopen(c: Controller) -> None:
    bootstrap(c)
    rollouts(c, "r1")
    drain_and_pause(c)
    mutate(c, "mutate_refused")
    c.fire("abandon_update")
    c.fire("resume_begin")
    out(c, "resume_ok")
    c.fire("reopen")
    rollouts(c, "r2")


def s_retries(c: Controller) -> None:
    bootstrap(c)
    rollouts(c, "r1")
    full_cycle(c, retries=True)
    rollouts(c, "r2")


def _to_mutation(c: Controller) -> None:
    bootstrap(c)
    rollouts(c, "r1")
    drain_and_pause(c)


def s_mutate_ambiguous(c: Controller) -> None:
    _to_mutation(c)
    mutate(c, "mutate_ambiguous")
    fence(c)


def s_validate_mismatch(c: Controller) -> None:
    _to_mutation(c)
    mutate(c)
    invalidate(c)
    c.fire("validate_begin")
    out(c, "validate_mismatch")
    fence(c)


def s_probe_mismatch(c: Controller) -> None:
    _to_mutation(c)
    mutate(c)
    invalidate(c)
    c.fire("validate_begin")
    out(c, "validate_ok")
    c.fire("resume_begin")
    out(c, "resume_ok")
    c.fire("probe_begin")
    out(c, "probe_mismatch")
    fence(c)


def s_audit(c: Controller) -> None:
    """A serving engine audited: passes; then unreachable (no admission until an audit
    passes again), suspected by the application, and at last found replaced out of band
    with a rollout bound: quarantined (the rollout released as aborted), fenced and
    re-admitted."""
    bootstrap(c)
    rollouts(c, "r1")
    c.admit("r2")
    c.fire("audit_begin")
    out(c, "audit_ok")
    c.release("r2")
    c.fire("audit_begin")
    out(c, "audit_failed")
    c.fire("audit_begin")
    out(c, "audit_ok")
    c.fire("suspect", detail={"rollout": "r3", "error": "ConnectError: connection refused"})
    c.fire("audit_begin")
    out(c, "audit_ok")
    c.admit("r4")
    c.fire("audit_begin")
    out(c, "audit_mismatch")
    c.release("r4")  # released as aborted by the mismatch: let go, nothing journalled
    fence(c)
    k = c.control.committed
    c.fire("readmit_begin", detail={"who": "operator", "target": _label(k),
                                    "identity": _identity(k)})
    out(c, "readmit_ok")
    rollouts(c, "r5")


def s_give_up(c: Controller) -> None:
    _to_mutation(c)
    mutate(c)
    for _ in range(2):
        c.fire("reset_begin", "prefix")
        out(c, "reset_failed", "prefix")
    c.fire("give_up", detail={"after": "2 failed resets"})


Scenario = Callable[[Controller], None]
SCENARIOS: dict[str, Scenario] = {
    "bootstrap": s_bootstrap,
    "admit_release": s_admit_release,
    "update_cycle": s_update_cycle,
    "update_while_bound": s_update_while_bound,
    "abort_drain": s_abort_drain,
    "cancel_while_draining": s_cancel_while_draining,
    "refused_then_reopen": s_refused_then_reopen,
    "retries": s_retries,
    "mutate_ambiguous": s_mutate_ambiguous,
    "validate_mismatch": s_validate_mismatch,
    "probe_mismatch": s_probe_mismatch,
    "give_up": s_give_up,
    "audit": s_audit,
}


def run_scenario(path: Path, scenario: Scenario, clock: Callable[[], float]) -> None:
    with Journal(path, fsync=False, clock=clock) as j:
        scenario(Controller(trace=j))


def recover_ready(path: Path, clock: Callable[[], float]) -> None:
    """Crash in READY with rollouts bound, and in DRAINING before the pause: both
    restart READY (the bindings of the dead process are dropped)."""
    ctl, j, _ = open_controller(path, fsync=False, clock=clock)
    bootstrap(ctl)
    ctl.admit("r1")
    ctl.admit("r2")
    ctl.release("r1")
    j.close()  # crash: r2 is still bound
    ctl, j, rec = open_controller(path, fsync=False, clock=clock)
    assert not rec.tainted, rec
    rollouts(ctl, "r3")
    ctl.admit("r4")
    request_update(ctl)
    ctl.release("r4")
    j.close()  # crash while draining, nothing in flight
    ctl, j, rec = open_controller(path, fsync=False, clock=clock)
    assert not rec.tainted, rec
    full_cycle(ctl)
    rollouts(ctl, "r5")
    j.close()


def recover_tainted(path: Path, clock: Callable[[], float]) -> None:
    """Crash with a mutation in flight: restart TAINTED, and TAINTED again."""
    ctl, j, _ = open_controller(path, fsync=False, clock=clock)
    _to_mutation(ctl)
    ctl.fire("mutate_begin", detail=mutate_detail(ctl))
    j.close()
    for _ in range(2):
        ctl, j, rec = open_controller(path, fsync=False, clock=clock)
        assert rec.tainted, rec
        j.close()
    ctl, j, rec = open_controller(path, fsync=False, clock=clock)
    fence(ctl)  # fenced once; a later restart keeps the fence
    j.close()
    ctl, j, rec = open_controller(path, fsync=False, clock=clock)
    assert "fenced" in ctl.control.evidence, ctl.control
    j.close()


def recover_broken_chain(path: Path, clock: Callable[[], float]) -> None:
    """A journal whose chain is broken is moved aside; the new segment names its last good
    hash and restarts TAINTED (only that segment is kept in the corpus)."""
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / path.name
        run_scenario(old, s_update_cycle, clock)
        lines = old.read_bytes().splitlines(keepends=True)
        lines[5] = lines[5].replace(b'"committed":1', b'"committed":7')
        old.write_bytes(b"".join(lines))
        ctl, j, rec = open_controller(old, fsync=False, clock=clock)
        assert rec.tainted and not rec.trusted, rec
        fence(ctl)
        j.close()
        path.write_bytes(old.read_bytes())


def torn_tail(path: Path, clock: Callable[[], float]) -> None:
    """A crash in the middle of writing a record: the torn line did not happen."""
    run_scenario(path, s_admit_release, clock)
    data = path.read_bytes()
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[1]
    path.write_bytes(data + last[: len(last) // 2])


# ---------------------------------------------------------------------- tampering


def load(path: Path) -> list[Record]:
    report, records = read_journal(path)
    assert report.ok, (path, report)
    return records


def write(path: Path, records: list[Record], *, chain: bool = True) -> None:
    recs = rechain(records) if chain else records
    path.write_text("".join(dumps_line(r) for r in recs))


def renumber(records: list[Record]) -> list[Record]:
    return [{**r, "seq": i} for i, r in enumerate(records)]


def find(records: list[Record], step: str, param: Any = None, start: int = 0) -> int:
    for i in range(start, len(records)):
        if records[i].get("step") == step and (param is None or records[i]["param"] == param):
            return i
    raise KeyError(step)


def like(rec: Record, step: str, typ: str, param: Any = None, **fields: Any) -> Record:
    """A record with ``rec``'s projection, for another step."""
    out = {**rec, "step": step, "type": typ, "op": None, "param": param}
    out.pop("detail", None)
    out.pop("evidence", None)
    return {**out, **fields}


def _evidence_swap(rec: Record, **changes: Any) -> Record:
    """``rec`` with fields of its first evidence object changed."""
    ev = json.loads(json.dumps(rec["evidence"]))
    ev["evidence"][0].update(changes)
    return {**rec, "evidence": ev}


def make_bad(good: Path, bad: Path) -> None:
    g = {name: load(good / f"{name}.jsonl") for name in (
        "mutate_ambiguous", "validate_mismatch", "update_while_bound", "update_cycle",
        "admit_release", "recover_tainted", "audit")}

    # A rollout admitted on an engine that could not be audited, before any audit passed.
    r = g["audit"]
    i = find(r, "audit_failed")
    write(bad / "NoAdmissionInDoubt__admit_after_failed_audit.jsonl",
          renumber([*r[:i + 1], like(r[i], "admit", "step", "r9"), *r[i + 1:]]))
    # An audit journalled as passed although the identity it read is another one.
    i = find(r, "audit_ok")
    write(bad / "EvidenceContradictsOutcome__audit_ok_other_identity.jsonl",
          [*r[:i], _evidence_swap(r[i], identity="0" * 64), *r[i + 1:]])

    r = g["mutate_ambiguous"]
    i = find(r, "mutate_ambiguous")
    write(bad / "TaintedIsAbsorbing__admit_after_mutate_ambiguous.jsonl",
          renumber([*r[:i + 1], like(r[i], "admit", "step", "r9")]))

    r = g["validate_mismatch"]
    i = find(r, "validate_mismatch")
    write(bad / "TaintedIsAbsorbing__publish_after_validate_mismatch.jsonl",
          renumber([*r[:i + 1], like(r[i], "publish", "step", phase="READY",
                                     committed=r[i]["target"], target=0,
                                     detail=publish_detail(r[i]["target"]))]))

    # A controller that mutates with r1 still bound (no drain, no pause at all).
    r = g["update_while_bound"]
    i, k = find(r, "request_update"), find(r, "mutate_begin")
    write(bad / "NoRolloutCrossesMutation__mutate_begin_while_bound.jsonl",
          renumber(r[:i] + r[k:]))

    # A rollout admitted while the weights are being transferred.
    r = g["update_cycle"]
    k = find(r, "mutate_begin")
    write(bad / "AdmissionOnlyInReady__admit_during_mutation.jsonl",
          renumber([*r[:k + 1], like(r[k], "admit", "step", "r9"), *r[k + 1:]]))

    # A controller that pauses with r1 bound: the spec rejects the pause.
    r = g["update_while_bound"]
    i = find(r, "release", "r1")
    rel = r[i]
    rest = r[:i] + r[i + 1:]
    p = find(rest, "publish")
    write(bad / "spec__pause_while_bound.jsonl", renumber(
        [*rest[:p + 1], {**rel, "committed": rest[p]["committed"], "phase": "READY",
                         "target": 0}, *rest[p + 1:]]))

    r = g["update_cycle"]
    i, k = find(r, "reset_begin", "mm"), find(r, "publish")
    write(bad / "PublishOnlyVerified__publish_missing_mm_reset.jsonl",
          renumber(r[:i] + r[k:]))

    i = find(r, "probe_begin")
    write(bad / "PublishOnlyVerified__publish_without_probe.jsonl", renumber(r[:i] + r[i + 2:]))

    i = find(r, "validate_begin")
    write(bad / "spec__skipped_validate.jsonl", renumber(r[:i] + r[i + 2:]))

    r = g["update_while_bound"]
    i = find(r, "release", "r1")
    tampered = [*r[:i], {**r[i], "committed": r[i]["target"]}, *r[i + 1:]]
    write(bad / "PublishOnlyVerified__release_under_other_generation.jsonl", tampered)

    r = g["admit_release"]
    write(bad / "SequenceGap__skipped_seq.jsonl",
          [*r[:5], *({**x, "seq": x["seq"] + 1} for x in r[5:])])

    r = g["update_cycle"]
    i = find(r, "publish")
    write(bad / "HashChain__edited_record.jsonl",
          [*r[:i], {**r[i], "committed": r[i]["committed"] + 1}, *r[i + 1:]], chain=False)

    r = g["mutate_ambiguous"]
    i = find(r, "mutate_ambiguous")
    write(bad / "Schema__ambiguous_journalled_as_fail.jsonl",
          [*r[:i], {**r[i], "type": "fail"}, *r[i + 1:]])

    # A restart READY after a crash with the mutation in flight.
    r = g["recover_tainted"]
    i = find(r, "restart_tainted")
    fake = {**r[i], "step": "restart_ready", "phase": "READY", "target": 0}
    write(bad / "ReadyEngineServesCommitted__ready_after_crash_mid_mutation.jsonl",
          [*r[:i], fake, *r[i + 1:]])

    # Outcomes that disagree with their own evidence.
    r = g["update_cycle"]
    i = find(r, "reset_ok", "prefix")
    write(bad / "EvidenceContradictsOutcome__reset_ok_with_empty_body.jsonl",
          [*r[:i], _evidence_swap(r[i], body_success=None), *r[i + 1:]])
    i = find(r, "validate_ok")
    other = "0" * 64
    write(bad / "EvidenceContradictsOutcome__validate_ok_other_identity.jsonl",
          [*r[:i], _evidence_swap(r[i], identity=other), *r[i + 1:]])
    ev = json.loads(json.dumps(r[i]["evidence"]))
    ev["evidence"][0]["identity"] = ev["expected"]["identity"] = other
    write(bad / "EvidenceContradictsTarget__validate_ok_against_another_target.jsonl",
          [*r[:i], {**r[i], "evidence": ev}, *r[i + 1:]])
    i = find(r, "mutate_ok")
    write(bad / "Evidence__outcome_without_evidence.jsonl",
          [*r[:i], {k: v for k, v in r[i].items() if k != "evidence"}, *r[i + 1:]])

    # A journal that begins with a restart to READY at generation 5, no bootstrap.
    r = g["admit_release"]
    start = {**like(r[1], "restart_ready", "recover", phase="READY", committed=5, target=0,
                    pending="none", seq=1)}
    write(bad / "SegmentStart__restart_ready_without_bootstrap.jsonl",
          [r[0], start, {**like(start, "admit", "step", "r1"), "seq": 2}])

    # Records with a valid chain but ill-typed fields.
    r = g["admit_release"]
    i = find(r, "admit")
    write(bad / "Schema__param_is_an_object.jsonl", [*r[:i], {**r[i], "param": {}}, *r[i + 1:]])
    write(bad / "Schema__step_is_a_list.jsonl", [*r[:i], {**r[i], "step": ["admit"]},
                                                  *r[i + 1:]])
    write(bad / "Schema__phase_is_an_object.jsonl", [*r[:i], {**r[i], "phase": {"x": 1}},
                                                     *r[i + 1:]])


# ------------------------------------------------------------------------- driver


def generate(root: Path = TRACES) -> list[Path]:
    """Write the whole corpus under ``root`` (good/ and bad/); return the files."""
    good, bad = root / "good", root / "bad"
    for d in (good, bad):
        d.mkdir(parents=True, exist_ok=True)
        for old in d.glob("*.jsonl"):
            old.unlink()
    for name, scenario in SCENARIOS.items():
        run_scenario(good / f"{name}.jsonl", scenario, FixedClock())
    recover_ready(good / "recover_ready.jsonl", FixedClock())
    recover_tainted(good / "recover_tainted.jsonl", FixedClock())
    recover_broken_chain(good / "recover_broken_chain.jsonl", FixedClock())
    torn_tail(good / "torn_tail.jsonl", FixedClock())
    make_bad(good, bad)
    return sorted([*good.glob("*.jsonl"), *bad.glob("*.jsonl")])


def write_long_trace(path: Path, records: int, *, seed: int = 0, fsync: bool = False,
                     concurrency: int = 2) -> int:
    """A long, valid journal: rollouts (up to ``concurrency`` bound at once) with an
    update cycle (sometimes with retries) every few hundred steps. Returns the number
    of records written after the header."""
    rng = random.Random(seed)
    with Journal(path, fsync=fsync, clock=FixedClock()) as j:
        c = Controller(trace=j)
        bootstrap(c)
        n = 0
        while j.last_seq < records:
            bound = list(c.bindings)
            if rng.random() < 0.004 and not bound:
                full_cycle(c, retries=rng.random() < 0.3)
            elif bound and (len(bound) >= concurrency or rng.random() < 0.5):
                c.release(rng.choice(bound))
            else:
                n += 1
                c.admit(f"r{n}")
        return j.last_seq


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--long"]:
        n = int(args[1]) if len(args) > 1 else 100_000
        out = Path(args[2]) if len(args) > 2 else Path(tempfile.gettempdir()) / "long.jsonl"
        out.unlink(missing_ok=True)
        print(f"wrote {write_long_trace(out, n)} records to {out}")
        return 0
    for p in generate():
        print(f"wrote {p.relative_to(TRACES.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

