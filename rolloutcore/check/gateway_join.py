"""Join remote gateways' admission journals to the fleet's journal and check the run as one.

The fleet journal holds, per remote gateway and member, the gateway's *holds*
(:mod:`rolloutcore.gateway.registry`): bindings whose admit record carries the gateway's
journal position when it took the hold, and whose release carries its position when it
acknowledged the close (or, for a lease that ended, the fence every engine took). The
fleet checker (:mod:`rolloutcore.check.fleet_trace`) already checks that no hold spans a
mutation; this join checks that every rollout a gateway journalled lies inside one of its
holds on that member, in journal positions:

- *Admitted under a hold*: a gateway's ``gw_admit`` at position q on member m lies in an
  interval (open, close] of one of its holds on m, and names that hold's generation.
- *Drained at its ack*: an acknowledged hold has none of its rollouts still running at
  the position the gateway acknowledged with (all released or abandoned by then).
- *One gateway per admission*: every rollout id a gateway journals begins with its name.
- *The journals agree*: no position the fleet journal names lies beyond the gateway
  journal's end, and each hold's rollouts ran on one identity.

A hold whose lease ended has no acknowledgement: its rollouts may be unreleased (the
gateway died) or end refused (the engine's fence); they are counted, not rejected, since
the fence, journalled in the fleet journal before the release, ended them.

Memory: the holds (one per gateway, member and update) and the rollouts in flight, never
the admissions themselves; the gateway journals are streamed.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rolloutcore.check.fleet_trace import check_fleet_file, is_fleet_journal
from rolloutcore.check.trace import TraceInputError
from rolloutcore.inputs import unreadable
from rolloutcore.journal import JournalReader
from rolloutcore.journal.gateway_records import (
    ABANDON,
    ADMIT,
    HOLD_PREFIX,
    JOURNAL_SPEC,
    RELEASE,
)
from rolloutcore.journal.reader import not_a_journal


class JoinInputError(TraceInputError):
    """A file that is not the journal it should be (bad input: exit 2)."""


@dataclass
class Hold:
    gateway: str
    member: str
    generation: int
    opened: int  # the gateway's journal position when it took the hold
    closed: int | None = None  # ... when it acknowledged the close
    expired: bool = False  # its lease ended: fenced, not acknowledged
    running: int = 0  # its rollouts admitted and not yet released (while streaming)
    identity: str | None = None
    admitted: int = 0


@dataclass
class JoinVerdict:
    accepted: bool
    violated: str | None
    message: str
    gateways: dict[str, dict[str, int]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "violated": self.violated,
                "message": self.message, "gateways": self.gateways}


class _Rejected(Exception):
    def __init__(self, violated: str, message: str) -> None:
        super().__init__(message)
        self.violated = violated
        self.message = message


def holds_of(records: Iterable[tuple[int, Mapping[str, Any]]]) -> dict[str, dict[str, list[Hold]]]:
    """gateway -> member -> its holds, in order, from the fleet journal's records."""
    out: dict[str, dict[str, list[Hold]]] = {}
    live: dict[str, Hold] = {}
    for _line, rec in records:
        param = rec.get("param")
        if not isinstance(param, str) or not param.startswith(HOLD_PREFIX):
            continue
        d = rec.get("detail") or {}
        gateway, member = d.get("gateway"), rec.get("engine")
        if not isinstance(gateway, str) or not isinstance(member, str):
            continue
        if rec.get("step") == "admit":
            h = Hold(gateway, member, int(rec["committed"]), int(d["position"]))
            live[param] = h
            out.setdefault(gateway, {}).setdefault(member, []).append(h)
        elif rec.get("step") == "release" and param in live:
            h = live.pop(param)
            if d.get("expired"):
                h.expired = True
            elif "position" in d:
                h.closed = int(d["position"])
    return out


def check_join(fleet_journal: str | os.PathLike[str],
               gateways: Mapping[str, str | os.PathLike[str]]) -> JoinVerdict:
    """Check every gateway journal against the fleet journal's holds (see the module)."""
    fleet_path = Path(fleet_journal)
    try:
        reader = JournalReader(fleet_path)
        holds = holds_of(reader)
    except OSError as e:
        raise JoinInputError(unreadable(fleet_path, e)) from None
    if reader.report.records == 0:
        raise JoinInputError(not_a_journal(fleet_path, reader.report))
    if not is_fleet_journal(fleet_path):
        raise JoinInputError(f"{fleet_path}: not a fleet's journal")
    fleet_verdict = check_fleet_file(fleet_path)
    if not fleet_verdict.accepted:
        return JoinVerdict(False, fleet_verdict.violated, f"the fleet journal, line "
                           f"{fleet_verdict.first_bad_line}: {fleet_verdict.message}")
    verdict = JoinVerdict(True, None, "")
    try:
        for name, path in gateways.items():
            verdict.gateways[name] = _check_gateway(name, Path(path),
                                                    holds.get(name, {}))
    except _Rejected as r:
        return JoinVerdict(False, r.violated, r.message, verdict.gateways)
    unknown = sorted(set(holds) - set(gateways))
    n = sum(v["admitted"] for v in verdict.gateways.values())
    verdict.message = (f"the fleet journal conforms; {n} admissions of {len(gateways)} "
                       "gateway(s) joined to it: each inside a hold, each acknowledged hold "
                       "drained")
    if unknown:
        verdict.message += f" (holds of gateways not given: {', '.join(unknown)})"
    return verdict


def _check_gateway(name: str, path: Path, by_member: dict[str, list[Hold]]
                   ) -> dict[str, int]:
    starts = {m: [h.opened for h in hs] for m, hs in by_member.items()}
    running: dict[str, Hold] = {}  # rollout -> its hold
    due: list[tuple[int, int, Hold]] = []  # (closed, tie, hold): drained by then?
    counts = {"admitted": 0, "released": 0, "abandoned": 0, "refused_by_fence": 0,
              "holds": sum(len(hs) for hs in by_member.values()),
              "holds_expired": sum(h.expired for hs in by_member.values() for h in hs)}
    for hs in by_member.values():
        for each in hs:
            if each.closed is not None:
                bisect.insort(due, (each.closed, id(each), each))
    try:
        reader = JournalReader(path)
        last = 0
        for line, rec in reader:
            seq = int(rec.get("seq", 0))
            if seq == 0 and rec.get("spec") != JOURNAL_SPEC:
                raise JoinInputError(f"{path}: not a gateway's journal (its header names "
                                     f"{rec.get('spec')!r})")
            last = seq
            while due and due[0][0] < seq:
                _drained(name, due.pop(0)[2])
            step, d = rec.get("step"), rec.get("detail") or {}
            where = f"{path}:{line}"
            if step == ADMIT:
                counts["admitted"] += 1
                rollout, member = str(d.get("rollout")), str(d.get("member"))
                if not rollout.startswith(f"{name}-"):
                    raise _Rejected("OneGatewayPerAdmission", f"{where}: rollout {rollout!r} "
                                    f"is not one of gateway {name}'s")
                h = _hold_at(by_member.get(member, []), starts.get(member, []), seq)
                if h is None:
                    raise _Rejected("AdmittedUnderHold", f"{where}: gateway {name} admitted "
                                    f"{rollout} to {member} at position {seq}, outside "
                                    "every hold it had there")
                if d.get("generation") != h.generation:
                    raise _Rejected("AdmittedUnderHold", f"{where}: {rollout} names "
                                    f"generation {d.get('generation')}, its hold on {member} "
                                    f"is on {h.generation}")
                ident = d.get("identity")
                if h.identity is None:
                    h.identity = ident
                elif ident != h.identity:
                    raise _Rejected("OneIdentityPerHold", f"{where}: {rollout} ran on "
                                    f"identity {ident}, its hold's other rollouts on "
                                    f"{h.identity}")
                h.running += 1
                h.admitted += 1
                running[rollout] = h
            elif step in (RELEASE, ABANDON):
                h2 = running.pop(str(d.get("rollout")), None)
                if h2 is not None:
                    h2.running -= 1
                counts["released" if step == RELEASE else "abandoned"] += 1
                if d.get("outcome") == "fenced":
                    counts["refused_by_fence"] += 1
    except OSError as e:
        raise JoinInputError(unreadable(path, e)) from None
    report = reader.report
    if report.records == 0:
        raise JoinInputError(not_a_journal(path, report))
    if not report.ok and not report.truncated:
        raise _Rejected("Chain", f"{path}: chain broken at line {report.first_bad_line}: "
                        f"{report.reason}")
    for closed, _tie, late in due:
        if closed > last:
            raise _Rejected("JournalsAgree", f"the fleet journal says gateway {name} "
                            f"acknowledged {late.member} at position {closed}, beyond its "
                            f"journal's end ({last})")
        _drained(name, late)
    for hs in by_member.values():
        for each in hs:
            if each.opened > last:
                raise _Rejected("JournalsAgree", f"the fleet journal says gateway {name} "
                                f"took a hold on {each.member} at position {each.opened}, beyond "
                                f"its journal's end ({last})")
    return counts


def _hold_at(hs: list[Hold], starts: list[int], seq: int) -> Hold | None:
    i = bisect.bisect_left(starts, seq) - 1  # the last hold opened before seq
    if i < 0:
        return None
    h = hs[i]
    if h.closed is not None and seq > h.closed:
        return None
    return h


def _drained(name: str, h: Hold) -> None:
    if h.running:
        raise _Rejected("DrainedAtAck", f"gateway {name} acknowledged the close of "
                        f"{h.member} at position {h.closed} with {h.running} of its "
                        "rollouts there still running")


__all__ = ["JoinInputError", "JoinVerdict", "check_join", "holds_of"]
