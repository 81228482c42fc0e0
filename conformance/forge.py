"""The trace checkers' own mutation test: single-field forgeries of good journals.

Every good journal (the trace corpus, fleet journals written on simulated engines, one
journal of ``rolloutcore simulate``) is forged one field at a time: for every record and
every field of it, nested detail and evidence included, the value is replaced by other
plausible values (another value seen under the same key anywhere in the journals, the
next or previous integer, the negated boolean, a shortened or changed list), dropped, or
given a wrong type, and the hash chain is sealed again. Each variant goes to the checker
the journal belongs to (:mod:`rolloutcore.check.trace` or :mod:`rolloutcore.check.fleet_trace`).
A variant must be rejected unless its field is one that :mod:`rolloutcore.check.claims`
declares informational: a forgery of a claim that is accepted is a hole in the checker.

Run: ``python -m rolloutcore.conformance.forge [--json] [--limit N]`` (exit 0: no claim
forgery accepted; 1: some were, listed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rolloutcore.check.claims import (
    TIMING_SLACK_S,
    Claims,
    informational,
    informational_fields,
    path_name,
)
from rolloutcore.check.fleet_trace import FleetTraceChecker
from rolloutcore.check.trace import Rejection, TraceChecker
from rolloutcore.journal import read_journal, rechain

Record = dict[str, Any]
Path_ = tuple[str | int, ...]
#: Fields the chain itself owns: a changed one is resealed away by construction.
_CHAIN = frozenset({"hash", "prev"})
TRACES = Path(__file__).resolve().parent / "traces" / "good"


@dataclass(frozen=True)
class Journal_:
    name: str
    fleet: bool
    records: list[Record]
    after: list[Record] | None = None  # the segment this one continues, if any


@dataclass
class Tally:
    rejected: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    informational: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    accepted: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    examples: dict[tuple[str, str, str], str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.rejected.values()) + sum(self.informational.values()) + \
            sum(self.accepted.values())


# ------------------------------------------------------------------------ journals


def corpus() -> list[Journal_]:
    """The good trace corpus (a continuing segment with the one it continues)."""
    out = []
    by_hash: dict[str, list[Record]] = {}
    paths = sorted(TRACES.glob("*.jsonl"))
    loaded = {p.stem: read_journal(p)[1] for p in paths}
    for recs in loaded.values():
        if recs:
            by_hash[recs[-1]["hash"]] = recs
    for name, recs in loaded.items():
        cont = recs[0].get("continues") if recs else None
        prev = None
        if cont is not None:
            # The broken segment it continues is a prefix of another corpus journal.
            for other in loaded.values():
                k = next((i for i, r in enumerate(other) if r.get("hash") == cont), None)
                if k is not None:
                    prev = other[:k + 1]
                    break
        out.append(Journal_(name, False, recs, prev))
    return out


def fleet_journals(tmp: Path) -> list[Journal_]:
    """Fleet journals written by the fleet on simulated engines: a clean update with live
    rollouts, a load dying halfway (quarantine, re-admission, catch-up), an engine
    restarted out of band (audit, quarantine, re-admission), a rolling update whose
    draining members' rollouts migrate."""
    from rolloutcore.conformance.fleet_scenarios import FleetRig, run_fleet_scenario

    out = []
    for name in ("clean_update_live", "dies_halfway_quorum", "restarted_out_of_band",
                 "rolling_update_migrated"):
        (tmp / name).mkdir(parents=True, exist_ok=True)
        rig = FleetRig.sim(tmp / name)
        try:
            res = run_fleet_scenario(name, rig)
        finally:
            rig.close()
        if not res.passed or res.journal is None:
            raise RuntimeError(f"fleet scenario {name} failed: {res.failures()}")
        out.append(Journal_(f"fleet:{name}", True, read_journal(res.journal)[1]))
    return out


def takeover_journal(tmp: Path) -> Journal_:
    """A fleet journal written by two controllers in turn (controller failover, with
    epochs, on a local file standing in for etcd): the first bootstraps and updates; the
    second takes over, cannot fence one member at first (suspected), then fences and
    audits it (``fleet_takeover``, ``fleet_fenced``)."""
    from rolloutcore.adapters.sim import FaultPlan, SimAdapter, SimEngine, sim_target
    from rolloutcore.fleet import Fleet
    from rolloutcore.fleet.store import FileJournalStore

    path = tmp / "takeover.jsonl"
    engines = {n: SimEngine("ckpt-1", label="rc-1") for n in ("a", "b")}

    def target_of(source: str, generation: int, label: str) -> Any:
        return sim_target(generation, source, label=label)

    first = Fleet([(n, SimAdapter(e), None) for n, e in engines.items()],
                  journal=FileJournalStore(path, epoch=3, controller="first"), fsync=False,
                  target_of=target_of)
    first.bootstrap(sim_target(1, "ckpt-1"))
    first.update(sim_target(2, "ckpt-2"))
    first.close()
    faults = FaultPlan()
    faults.add("fence_epoch", "connection_error")
    second = Fleet([("a", SimAdapter(engines["a"]), None),
                    ("b", SimAdapter(engines["b"], faults), None)],
                   journal=FileJournalStore(path, epoch=5, controller="second"), fsync=False,
                   target_of=target_of)
    try:
        if second.unfenced != {"b"}:
            raise RuntimeError(f"takeover journal: unfenced {second.unfenced}, not b")
        second.audit(["b"])
    finally:
        second.close()
    return Journal_("takeover", True, read_journal(path)[1])


def simulated_journal(tmp: Path) -> Journal_:
    from rolloutcore.engine.simulate import simulate

    path = tmp / "simulate.jsonl"
    res = simulate(2, journal=path, faults="read_state=timeout,reset_encoder=empty_body")
    if not res.trace.accepted:
        raise RuntimeError(f"simulate's journal is rejected: {res.trace.message}")
    return Journal_("simulate", False, read_journal(path)[1])


# ------------------------------------------------------------------------ variants


def _walk(value: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Every (path, value) below ``value``: dict members, list elements, and the
    containers themselves."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not path and k in _CHAIN:
                continue
            yield (*path, k), v
            yield from _walk(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, dict | list):
                yield (*path, i), v
                yield from _walk(v, (*path, i))


def pools(journals: list[Journal_]) -> dict[str, list[Any]]:
    """Scalar values seen under each key name, in every journal: the plausible
    substitutes."""
    seen: dict[str, set[str]] = {}
    for j in journals:
        for r in j.records:
            for path, v in _walk(r):
                key = next((p for p in reversed(path) if isinstance(p, str)), "")
                if v is None or isinstance(v, str | int | float | bool) or (
                        isinstance(v, list) and all(isinstance(x, int) for x in v)):
                    seen.setdefault(key, set()).add(json.dumps(v))
    return {k: [json.loads(x) for x in sorted(v)] for k, v in seen.items()}


def substitutes(key: str, value: Any, pool: list[Any]) -> Iterator[tuple[str, Any]]:
    """(substitution kind, new value) for ``value`` under ``key``; ``_DROP`` drops it."""
    others = [v for v in pool if v != value and type(v) is type(value)]
    if value is None:
        others = [v for v in pool if v is not None]
    for v in others[:2]:
        yield "other", v
    if type(value) is bool:
        yield "negated", not value
        yield "wrong type", int(value)
    elif type(value) is int:
        yield "next", value + 1
        if value > 0:
            yield "previous", value - 1
        yield "wrong type", str(value)
    elif type(value) is float:
        yield "changed", value * 2 + 1
        yield "wrong type", str(value)
    elif type(value) is str:
        if not others:
            yield "changed", value + "x"
        yield "wrong type", [value]
    elif value is None:
        if not others:
            yield "wrong type", 0
    elif isinstance(value, list):
        if value and all(type(x) is int for x in value):
            yield "element changed", [value[0] + 1, *value[1:]]
        if value:
            yield "shortened", value[:-1]
        yield "wrong type", {"value": value}
    elif isinstance(value, dict):
        yield "wrong type", [value]
    yield "dropped", _DROP


_DROP = object()


def _set(rec: Record, path: Path_, value: Any) -> Record:
    out: Any = json.loads(json.dumps(rec))
    node = out
    for p in path[:-1]:
        node = node[p]
    if value is _DROP:
        if isinstance(node, list):
            node.pop(path[-1])  # type: ignore[arg-type]
        else:
            del node[path[-1]]
    else:
        node[path[-1]] = value
    return out  # type: ignore[no-any-return]


def variants(j: Journal_, pool: dict[str, list[Any]]) -> Iterator[
        tuple[int, Path_, str, list[Record]]]:
    """(record index, field path, substitution, the forged journal, chain resealed)."""
    for i, rec in enumerate(j.records):
        for path, value in _walk(rec):
            key = next((p for p in reversed(path) if isinstance(p, str)), "")
            for kind, new in substitutes(key, value, pool.get(key, [])):
                forged = [*j.records[:i], _set(rec, path, new), *j.records[i + 1:]]
                yield i, path, kind, forged


# ------------------------------------------------------------------------ checking


Checker = TraceChecker | FleetTraceChecker


def _fresh(j: Journal_) -> Checker:
    return FleetTraceChecker() if j.fleet else TraceChecker()


def _ends_well(checker: Checker) -> bool:
    if isinstance(checker, FleetTraceChecker):
        return not checker.group
    return checker.header_seen


def _seeded(j: Journal_) -> Checker:
    """A fresh checker for ``j``; for a continuing segment, one that has read the segment
    it continues (as ``trace check --after`` does)."""
    if j.after is None:
        return _fresh(j)
    prev = TraceChecker()
    for line, rec in enumerate(j.after, start=1):
        prev.feed(rec, line)
    return TraceChecker(previous=prev)


def snapshots(j: Journal_) -> tuple[list[Checker], dict[int, set[Path_]]]:
    """The checker's state before each record of the good journal ``j``, and per record
    the reference fields nothing later compared (rolloutcore.check.claims.UNUSED_REASON)."""
    checker, out = _seeded(j), []
    unused: dict[int, set[Path_]] = {}

    def report(line: int, path: Path_) -> None:
        unused.setdefault(line - 1, set()).add(path)

    for c in _claims_of(checker):
        c.on_unused = report
    if isinstance(checker, FleetTraceChecker):
        checker.on_unused = report
    for line, rec in enumerate(j.records, start=1):
        out.append(checker.clone())
        if checker.feed(rec, line) is not None:
            raise RuntimeError(f"{j.name}:{line}: the good journal itself is rejected")
        for c in _claims_of(checker):  # members appear as the journal goes
            if c.on_unused is None:
                c.on_unused = report
    if not _ends_well(checker):
        raise RuntimeError(f"{j.name}: the good journal itself is rejected at its end")
    checker.finish()
    return out, unused


def _claims_of(checker: Checker) -> list[Claims]:
    if isinstance(checker, FleetTraceChecker):
        return [m.claims for m in checker.members.values()]
    return [checker.claims]


def accepted(j: Journal_, i: int, forged: list[Record], before: Checker) -> bool:
    """Whether the checker of ``j`` accepts ``forged`` (resealed from record ``i`` on, as a
    file would be), continuing from ``before``, its state before record ``i``."""
    if i == 0 and j.after is not None and forged[0].get("continues") != j.after[-1]["hash"]:
        return False  # the link check_file makes with --after
    checker = before.clone()
    sealed = rechain(forged, start=i)
    for line in range(i, len(sealed)):
        if checker.feed(sealed[line], line + 1) is not None:
            return False
    return _ends_well(checker)


def run(journals: list[Journal_], *, limit: int | None = None, stride: int = 1,
        progress: Callable[[str], None] | None = None) -> Tally:
    """Check every variant of every journal (``limit``: the first ones of each;
    ``stride``: every stride-th one, a sample spread over the whole journal)."""
    pool = pools(journals)
    tally = Tally()
    for j in journals:
        snaps, unused = snapshots(j)
        n = 0
        for i, path, kind, forged in variants(j, pool):
            n += 1
            if limit is not None and n > limit:
                break
            if n % stride:
                continue
            rec = j.records[i]
            name = path_name(rec, path)
            key = (str(rec.get("step", rec.get("type"))), name, kind)
            if not accepted(j, i, forged, snaps[i]):
                tally.rejected[key] += 1
            elif informational(rec, path) or path in unused.get(i, ()):
                tally.informational[key] += 1
            else:
                tally.accepted[key] += 1
                tally.examples.setdefault(key, f"{j.name}:{i + 1}")
        if progress is not None:
            progress(f"{j.name}: {n} variants")
    return tally


# ----------------------------------------------------------- cross-record forgeries

#: Forgeries of two or more records, each valid alone and inconsistent together, and the
#: fleet journal property (spec.fleet.JOURNAL_PROPERTIES) that must reject each.
CROSS_RECORD: dict[str, str] = {
    "identity_split": "OneIdentityPerGeneration",
    "rollout_on_two_members": "OneRolloutOneMember",
    "outcome_adopted_after_takeover": "TakeoverAdoptsNothing",
}
_OTHER_IDENTITY = "f" * 64


def _resealed(records: list[Record]) -> list[Record]:
    """Records renumbered (seq) and sealed again (the chain): a forger's best effort."""
    out = [dict(r, seq=i) for i, r in enumerate(records)]
    return rechain(out)


def _replaced(value: Any, old: str, new: str) -> Any:
    if value == old:
        return new
    if isinstance(value, dict):
        return {k: _replaced(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_replaced(v, old, new) for v in value]
    return value


def identity_split(records: list[Record]) -> tuple[list[Record], int] | None:
    """The second member to publish a generation publishes it under another identity,
    consistently in every record of its own from its update request on (its own cycle
    is self-consistent): two policies under one generation number. Returns the forged
    journal and the 1-based line of the forged publish, or None (no such generation)."""
    firsts: dict[int, tuple[str, int]] = {}  # generation -> (first publisher, its index)
    for i, r in enumerate(records):
        if r.get("step") != "publish" or not isinstance(r.get("engine"), str):
            continue
        gen, name = int(r.get("committed") or 0), r["engine"]
        if gen in firsts and firsts[gen][0] != name:
            old = r["detail"]["identity"]
            start = max(k for k in range(i) if records[k].get("engine") == name
                        and records[k].get("step") == "request_update")
            out = [(_replaced(x, old, _OTHER_IDENTITY) if k >= start
                    and x.get("engine") == name else x) for k, x in enumerate(records)]
            # Caught at its first record naming the identity once the generation is
            # published: its publish, or its request if it catches up after the publish.
            first = next(k for k in range(max(start, firsts[gen][1] + 1), i + 1)
                         if records[k].get("engine") == name
                         and old in json.dumps(records[k].get("detail")))
            return _resealed(out), first + 1
        firsts.setdefault(gen, (name, i))
    return None


def rollout_on_two_members(records: list[Record]) -> tuple[list[Record], int] | None:
    """A rollout admitted on one member is admitted again on another, with no migrate."""
    engines = sorted({r["engine"] for r in records if isinstance(r.get("engine"), str)})
    for i, r in enumerate(records):
        if r.get("step") == "admit" and isinstance(r.get("engine"), str) and len(engines) > 1:
            other = next(e for e in engines if e != r["engine"])
            twin = dict(r, engine=other)
            return _resealed([*records[:i + 1], twin, *records[i + 1:]]), i + 2
    return None


def outcome_adopted_after_takeover(records: list[Record]) -> tuple[list[Record], int] | None:
    """After a takeover a member's restart is left out: the fleet recovers, or the member
    takes its next step, as if it had not been in the deposed leader's hands."""
    takeovers = [i for i, r in enumerate(records) if r.get("step") == "fleet_takeover"]
    for after in reversed(takeovers):
        for restart in range(after + 1, len(records)):
            if not str(records[restart].get("step", "")).startswith("restart_"):
                continue
            name = records[restart]["engine"]
            # The first record that needs the restart: the member's next one, or the
            # fleet's recovery (which waits for every member's restart).
            nxt = next((i for i in range(restart + 1, len(records))
                        if records[i].get("engine") == name
                        or str(records[i].get("step", "")).startswith("fleet_recover")), None)
            if nxt is not None:  # its 1-based line once the restart is gone
                return _resealed([*records[:restart], *records[restart + 1:]]), nxt
    return None


CROSS_FORGERS: dict[str, Callable[[list[Record]], tuple[list[Record], int] | None]] = {
    "identity_split": identity_split,
    "rollout_on_two_members": rollout_on_two_members,
    "outcome_adopted_after_takeover": outcome_adopted_after_takeover,
}


# ------------------------------------------------------------------ timestamp forgeries


def late_outcomes(j: Journal_) -> Iterator[tuple[int, list[Record]]]:
    """Timestamp forgeries of ``j``: for every begin that declares its deadline
    (``deadline_s``) and has a record after it, every later record dated
    ``TIMING_SLACK_S`` + 1 s past that deadline (the clock shifted whole, so it stays
    monotone), sealed again: the call's outcome comes too late. ``--strict`` must reject
    each (DeadlineExceeded), the default check accept it with a warning."""
    for i, r in enumerate(j.records[:-1]):
        deadline = (r.get("detail") or {}).get("deadline_s") if r.get("type") == "invoke" \
            else None
        if not isinstance(deadline, int | float):
            continue
        shift = deadline + TIMING_SLACK_S + 1.0
        later = [{**x, "t": x["t"] + shift} for x in j.records[i + 1:]]
        yield i, rechain([*j.records[:i + 1], *later])


def timing_verdict(j: Journal_, records: list[Record], *, strict: bool
                   ) -> tuple[str | None, int]:
    """What the checker of ``j`` (``strict``: holding outcomes to their deadlines) says of
    ``records``: the property it rejects them by (None: accepted), and how many late
    outcomes it reported."""
    checker = _seeded(j)
    checker.strict_timing = strict
    for line, rec in enumerate(records, start=1):
        bad = checker.feed(rec, line)
        if bad is not None:
            return (bad.violated if isinstance(bad, Rejection) else bad[0]), len(_lates(checker))
    return (None if _ends_well(checker) else "End"), len(_lates(checker))


def _lates(checker: Checker) -> list[str]:
    if isinstance(checker, FleetTraceChecker):
        return [x for m in checker.members.values() for x in m.late]
    return checker.late


def all_journals(tmp: Path) -> list[Journal_]:
    return [*corpus(), *fleet_journals(tmp), takeover_journal(tmp), simulated_journal(tmp)]


def render(t: Tally) -> str:
    fields = sorted({(k[0], k[1]) for c in (t.rejected, t.informational, t.accepted)
                     for k in c})
    lines = [f"{'record':<22} {'field':<52} {'rejected':>8} {'info':>5} {'accepted':>8}"]
    for step, name in fields:
        def n(c: Counter[tuple[str, str, str]], s: str = step, f: str = name) -> int:
            return sum(v for k, v in c.items() if k[0] == s and k[1] == f)
        lines.append(f"{step:<22} {name:<52} {n(t.rejected):>8} {n(t.informational):>5} "
                     f"{n(t.accepted):>8}")
    kinds = sorted({k[2] for c in (t.rejected, t.informational, t.accepted) for k in c})
    lines.append("")
    lines.append(f"{'substitution':<22} {'rejected':>8} {'info':>5} {'accepted':>8}")
    for kind in kinds:
        def m(c: Counter[tuple[str, str, str]], s: str = kind) -> int:
            return sum(v for k, v in c.items() if k[2] == s)
        lines.append(f"{kind:<22} {m(t.rejected):>8} {m(t.informational):>5} "
                     f"{m(t.accepted):>8}")
    lines.append(f"\n{t.total} single-field forgeries: {sum(t.rejected.values())} rejected, "
                 f"{sum(t.informational.values())} in informational fields, "
                 f"{sum(t.accepted.values())} claims accepted")
    for key, where in sorted(t.examples.items()):
        lines.append(f"  ACCEPTED {key[0]} {key[1]} ({key[2]}): e.g. {where}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--limit", type=int, default=None, help="variants per journal at most")
    ap.add_argument("--corpus-only", action="store_true",
                    help="the trace corpus only (no fleet or simulate journals)")
    ap.add_argument("--fields", action="store_true",
                    help="list the declared informational fields with their reasons")
    args = ap.parse_args(argv)
    if args.fields:
        for where, name, why in informational_fields():
            print(f"{name}  ({where}): {why}")
        return 0
    with tempfile.TemporaryDirectory(prefix="forge-") as tmp:
        journals = corpus() if args.corpus_only else all_journals(Path(tmp))
        tally = run(journals, limit=args.limit,
                    progress=lambda s: print(s, file=sys.stderr))
    if args.json:
        print(json.dumps({"total": tally.total,
                          "rejected": sum(tally.rejected.values()),
                          "informational": sum(tally.informational.values()),
                          "accepted": [{"record": k[0], "field": k[1], "substitution": k[2],
                                        "count": v, "example": tally.examples[k]}
                                       for k, v in sorted(tally.accepted.items())]}, indent=2))
    else:
        print(render(tally))
    return 1 if tally.accepted else 0


if __name__ == "__main__":
    raise SystemExit(main())
