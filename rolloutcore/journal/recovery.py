"""Journal recovery: replay a journal through the spec and restart the controller on it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rolloutcore.engine.controller import (
    INITIAL_CONTROL,
    Controller,
    ControlState,
    IllegalTransition,
)
from rolloutcore.journal.codec import HEADER, SCHEMA, ZERO_HASH
from rolloutcore.journal.reader import ChainReport, JournalReader
from rolloutcore.journal.writer import Journal
from rolloutcore.spec.lifecycle import NO_OP, SPEC, Phase, Spec
from rolloutcore.spec.staged import JOURNAL_STEPS as STAGED_JOURNAL_STEPS
from rolloutcore.spec.triggers import RESTARTS, Trigger


@dataclass(frozen=True)
class Recovery:
    """In which state a controller restarts on a journal, and why that is safe.

    The decision is the spec's: the journal is replayed through the generated controller
    (every record must be a step the spec allows, with the phase and generations it
    names), and the restart step whose guard holds in the replayed state is taken
    (``restart_ready`` only with nothing in flight and the engine known to run the
    committed generation; ``restart_tainted`` otherwise). A journal that cannot be
    trusted (broken chain, a record the spec does not allow) restarts TAINTED in a new
    segment that names the last good hash of the old one.
    """

    control: ControlState  # the state the replay ended in (before the restart step)
    trigger: Trigger  # the restart step
    next_seq: int  # sequence number of the restart record
    reason: str
    from_phase: str | None
    chain: ChainReport | None = None
    trusted: bool = True  # False: the journal is moved aside, a new segment begins
    identity: str | None = None  # of the committed generation's weights, as journalled

    @property
    def tainted(self) -> bool:
        return self.trigger == Trigger.RESTART_TAINTED


def apply_record(ctl: Controller, rec: Mapping[str, Any]) -> None:
    """Take the step a journal record names on ``ctl`` (no sink attached): raises
    :class:`IllegalTransition` if the spec does not allow it, or if the controller ends
    in another phase or generation than the record says."""
    step, param = rec.get("step"), rec.get("param")
    if not isinstance(step, str) or not (param is None or isinstance(param, str)):
        raise IllegalTransition(str(step), ctl.phase, "malformed step or param")
    if step == Trigger.ADMIT:
        ctl.admit(param or "")
    elif step == Trigger.RELEASE:
        ctl.release(param or "")
    elif step == Trigger.RELEASE_ABORTED:
        ctl.abort(param or "")
    elif step in RESTARTS:
        ctl.restart(step)
    elif step in STAGED_JOURNAL_STEPS:  # a staging step changes no lifecycle state; a
        ctl.note(step, param)  # staging in progress is lost with the process (harmless)
    else:
        ctl.fire(step, param)
    identity = _committed_identity(step, rec)
    if identity is not None:  # what later bindings are bound to
        ctl.identity = identity
    c = ctl.control
    if (c.phase.value, c.committed, c.target, c.pending) != (
            rec.get("phase"), rec.get("committed"), rec.get("target"), rec.get("pending")):
        raise IllegalTransition(step, c.phase, f"the record says {rec.get('phase')} "
                                f"(committed {rec.get('committed')}, target "
                                f"{rec.get('target')}, pending {rec.get('pending')}); the "
                                f"spec's controller is in {c.phase.value} (committed "
                                f"{c.committed}, target {c.target}, pending {c.pending})")


def _committed_identity(step: str, rec: Mapping[str, Any]) -> str | None:
    """The identity of the weights a step commits, as the journal names it: a publish's
    detail, or the expected target of the verified bootstrap or re-admission."""
    if step == Trigger.PUBLISH:
        d = rec.get("detail")
        v = d.get("identity") if isinstance(d, Mapping) else None
    elif step in (Trigger.BOOTSTRAP_OK, Trigger.READMIT_OK):
        ev = rec.get("evidence")
        exp = ev.get("expected") if isinstance(ev, Mapping) else None
        v = exp.get("identity") if isinstance(exp, Mapping) else None
    else:
        return None
    return v if isinstance(v, str) else None


def restart_step(ctl: Controller) -> Trigger:
    """The restart step the spec allows in ``ctl``'s state (exactly one holds)."""
    allowed = [t for t in RESTARTS if ctl.enabled(t) is None]
    if len(allowed) != 1:
        raise AssertionError(f"the spec allows {allowed} on restart from {ctl.control}")
    return allowed[0]


def recover(path: str | os.PathLike[str], spec: Spec = SPEC) -> Recovery:
    """Replay the journal at ``path`` and decide the restart step (see :class:`Recovery`).
    Raises OSError if the file cannot be read."""
    reader = JournalReader(path)
    ctl = Controller(spec=spec)
    last: Mapping[str, Any] | None = None
    bad: str | None = None
    for line, rec in reader:
        if rec.get("type") == HEADER:
            if rec.get("schema") != SCHEMA:
                bad = f"line {line}: journal schema {rec.get('schema')!r} (this is {SCHEMA})"
                break
            continue
        if last is None and rec.get("step") in RESTARTS:
            # A segment that continues a broken one: its restart set the state.
            ctl.restore(ControlState(Phase(str(rec["phase"])), int(rec["committed"]),
                                     int(rec["target"]), NO_OP, frozenset(), frozenset()))
            last = rec
            continue
        try:
            apply_record(ctl, rec)
        except (IllegalTransition, ValueError) as e:
            bad = f"line {line}: the journal does not replay through the spec: {e}"
            break
        last = rec
    report = reader.report
    next_seq = max(report.last_seq, 0) + 1
    from_phase = str(last["phase"]) if last else None
    if bad is None and not report.ok and not report.truncated:
        bad = f"journal chain broken at line {report.first_bad_line}: {report.reason}"
    if bad is not None:
        c = ctl.control
        return Recovery(ControlState(Phase.TAINTED, c.committed, c.target, NO_OP, frozenset(),
                                     frozenset()), Trigger.RESTART_TAINTED, 1,
                        f"{bad}: fail closed", from_phase, report, trusted=False)
    torn = " (a torn final record was ignored: that step did not happen)" \
        if report.truncated and report.records else ""
    trigger = restart_step(ctl)
    return Recovery(ctl.control, trigger, next_seq, spec.action(trigger).doc + torn,
                    from_phase, report, identity=ctl.identity)


def open_controller(
    path: str | os.PathLike[str], spec: Spec = SPEC, *, fsync: bool = True,
    clock: Callable[[], float] = time.time,
) -> tuple[Controller, Journal, Recovery]:
    """A controller whose trace sink is the journal at ``path``.

    A new (or empty) journal starts fresh. An existing one is recovered: the restart step
    the spec allows is journalled and taken. A journal that cannot be trusted is moved
    aside (``<name>.broken``, kept as evidence) and a new segment, whose header names
    the last good hash of the old one, starts with the restart to TAINTED.
    """
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        journal = Journal(p, fsync=fsync, clock=clock, spec=spec)
        ctl = Controller(spec=spec, trace=journal)
        return ctl, journal, Recovery(INITIAL_CONTROL, Trigger.RESTART_UNINITIALIZED, 1,
                                      "new journal", None)
    rec = recover(p, spec)
    continues: str | None = None
    if not rec.trusted:
        aside = p.with_name(p.name + ".broken")
        n = 1
        while aside.exists():
            n += 1
            aside = p.with_name(f"{p.name}.broken{n}")
        p.rename(aside)
        continues = rec.chain.last_hash if rec.chain is not None else ZERO_HASH
        rec = replace(rec, reason=f"{rec.reason} (moved to {aside.name})")
    journal = Journal(p, fsync=fsync, clock=clock, spec=spec, continues=continues)
    ctl = Controller(spec=spec, trace=journal, identity=rec.identity)
    ctl.restore(rec.control, next_seq=rec.next_seq)
    ctl.restart(rec.trigger, {"reason": rec.reason, **(
        {"from_phase": rec.from_phase} if rec.from_phase is not None else {})})
    return ctl, journal, rec
