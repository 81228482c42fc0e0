"""The fleet's trace checker: a fleet journal against the fleet spec.

A fleet journal holds every member's records (tagged with the member) and the fleet's own
steps (untagged) in one chain and one sequence. The check is compositional, as the fleet
spec is: each member's records are checked against the single-engine spec by its own
:class:`~rolloutcore.check.trace.TraceChecker` (the member's controller half exactly, its
engine as the set of states its evidence allows), and the fleet's records, and the fleet
guards on member steps, against :mod:`rolloutcore.spec.fleet`, evaluated with the spec's
own predicates on the members' controller halves:

* a member step must satisfy its fleet guard (admission only on a serving member of a
  READY fleet, an update request only for the fleet's update or a catch-up, a lone
  publish only to catch up);
* a fleet step must be one the fleet spec takes from the fleet's state, with the phase
  and generations the record states; ``fleet_publish`` must name exactly the validated
  members, and their ``publish`` records follow it before anything else (one group)
  but the steps of a member quarantined all along (a fence still in flight: they
  commute with the publish);
* after every record (every group), the fleet invariants that speak of the controller
  halves hold: no member ahead of the fleet, rollouts only on serving members, a READY
  fleet has a quorum; invariants about the engines' weights are the members' own
  (ReadyEngineServesCommitted and the rest), checked by their checkers.

Not checked here: the spec's serialisation of members during an update (a modelling
reduction, see ``FleetSpec.scheduled``: the fleet runs members in parallel), and the
fleet's bootstrap, journalled as ``fleet_open`` once a quorum of members is verified.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rolloutcore.check.claims import FLEET_DETAIL, detail_problem
from rolloutcore.check.trace import (
    Memo,
    TraceChecker,
    TraceInputError,
    TraceVerdict,
    chain_verdict,
    header_problem,
    timing_warnings,
)
from rolloutcore.inputs import unreadable
from rolloutcore.journal import HEADER, SCHEMA, JournalReader, not_a_journal
from rolloutcore.spec.episodes import (
    HOLD_ENDS,
    HOLD_LET_GO,
    one_policy_per_segment,
    segments_in_order,
)
from rolloutcore.spec.failover import FLEET_JOURNAL_STEPS, succeeds
from rolloutcore.spec.fleet import (
    ASKING_PHASES,
    CRASH,
    FLEET,
    FLEET_ACTIONS,
    JOURNAL_PROPERTIES,
    LIFTED,
    MEMBER_GUARDS,
    MIGRATION,
    ROLLING_STEPS,
    FleetAction,
    FleetPhase,
    FleetSnapshot,
    FleetState,
    MemberSnapshot,
    Policy,
    bootstrapped,
    fleet_half,
    held_back,
    may_restart,
    serving,
    update_policy_error,
    validated,
    wave_width,
)
from rolloutcore.spec.lifecycle import SPEC, Kind, Phase

FLEET_OPEN = "fleet_open"
#: The fleet controller restarted: its members took their restarts (single-engine spec),
#: and the fleet reopened (or stayed closed) by the spec's recovery steps.
FLEET_RECOVERS = frozenset({"fleet_recover", "fleet_recover_closed"})
#: A controller with a new epoch took over (the failover spec's campaign and fence): it
#: fenced the members named (their engines refuse every older epoch from then on);
#: ``fleet_fenced`` names those its takeover could not fence, fenced later (fence).
FLEET_TAKEOVER, FLEET_FENCED = "fleet_takeover", "fleet_fenced"
assert {FLEET_TAKEOVER, FLEET_FENCED} == set(FLEET_JOURNAL_STEPS)
_FLEET_STEPS = frozenset({*FLEET_JOURNAL_STEPS, MIGRATION.name,
                          *(a.name for a in FLEET_ACTIONS)})
#: The single-engine spec's restart steps: a controller (re)started on the journal.
_RESTARTS = frozenset(a.name for a in SPEC.actions if a.kind is Kind.RESTART)
#: Member steps that read or use an engine: not on one this epoch has not fenced.
_NEED_FENCE = frozenset({"admit", "audit_begin"})
_FLEET_PHASES = frozenset({FleetPhase.READY, FleetPhase.UPDATING, FleetPhase.ABORTING,
                           FleetPhase.ROLLING})  # RECOVERING is never journalled
_AUDIT_OUTCOMES = frozenset({"audit_ok", "audit_failed", "audit_mismatch"})
_FLEET_STEP = {a.name: a for a in FLEET_ACTIONS}
_ONE_IDENTITY, _ONE_MEMBER, _TAKEOVER = JOURNAL_PROPERTIES
#: Member steps that name an identity, and the record field holding its generation.
_IDENTITY_OF = {"request_update": "target", "cancel_update": "target",
                "mutate_begin": "target", "publish": "committed", "readmit_begin": "committed"}


@dataclass
class FleetTraceChecker:
    fphase: str = FleetPhase.UNINITIALIZED
    fcommitted: int = 0
    ftarget: int = 0
    ffloor: int = 0
    min_serving: int = 0
    max_live: int = 1
    min_admitting: int = 0
    members: dict[str, TraceChecker] = field(default_factory=dict)
    member_seq: dict[str, int] = field(default_factory=dict)
    group: list[str] = field(default_factory=list)  # members whose publish must follow
    last_audit: dict[str, dict[str, Any]] = field(default_factory=dict)  # member -> its last
    last_seq: int = -1
    records: int = 0
    _views: dict[str, MemberSnapshot] = field(default_factory=dict)
    _memo: Memo = field(default_factory=Memo)  # one memo for every member
    flabel: str | None = None  # the label the fleet's update names
    quorum: int | None = None  # the quorum of the update being decided
    #: Tracking (see Claims.on_unused): the open's quorum, reported if nothing compared it.
    on_unused: Any = None
    _quorum_origin: int | None = None
    participants: list[str] = field(default_factory=list)  # the fleet update's members
    asked: set[str] = field(default_factory=set)  # members the update under way asked
    #: rollout -> (member it leaves, member it joins, generation, released yet) of each
    #: migration announced and not yet admitted where it goes.
    moves: dict[str, tuple[str, str, int, bool]] = field(default_factory=dict)
    epoch: int | None = None  # the epoch of the last takeover (None: no store)
    unfenced: set[str] = field(default_factory=set)  # members this epoch has not fenced
    named: set[str] = field(default_factory=set)  # every member the last takeover named
    #: generation -> (its identity, the member that first named it)
    identities: dict[int, tuple[Any, str]] = field(default_factory=dict)
    restarting: set[str] = field(default_factory=set)  # taken over, not yet restarted
    fdown: frozenset[str] = frozenset()  # members the recovery under way has yet to restart
    strict_timing: bool = False  # late outcomes rejected (else: a warning)
    #: Live agentic episodes: id -> (segment, generation, member, its hold's rollout id
    #: or None once let go). A hold a restart or a fence freed is no longer held.
    episodes: dict[str, tuple[int, int, str, str | None]] = field(default_factory=dict)

    def clone(self) -> FleetTraceChecker:
        """An independent checker in this one's state."""
        out = copy.copy(self)
        out.members = {n: c.clone() for n, c in self.members.items()}
        out.member_seq, out.group = dict(self.member_seq), list(self.group)
        out.last_audit = dict(self.last_audit)
        out.participants, out.asked = list(self.participants), set(self.asked)
        out.moves = dict(self.moves)
        out.identities, out.restarting = dict(self.identities), set(self.restarting)
        out.episodes = dict(self.episodes)
        out._views = {}
        out.on_unused = out._quorum_origin = None
        return out

    def finish(self) -> None:
        """The journal ended (tracking: see TraceChecker.finish)."""
        for m in self.members.values():
            m.finish()
        if self.on_unused is not None and self._quorum_origin is not None:
            self.on_unused(self._quorum_origin, ("detail", "min_serving"))

    # ------------------------------------------------------------------ views

    def _view(self, name: str) -> MemberSnapshot:
        """A member's controller half as the fleet spec reads it (cached until the member
        takes its next step)."""
        view = self._views.get(name)
        if view is None:
            m = self.members[name]
            c = m.control
            # The fleet spec reads bindings only as "any bound" and their generations.
            view = self._views[name] = MemberSnapshot(
                c.phase, c.committed, c.target, c.pending, c.evidence, tuple(sorted(m.counts)))
        return view

    def _fleet(self) -> FleetSnapshot:
        return FleetSnapshot(self.fphase, self.fcommitted, self.ftarget, self.ffloor,
                             tuple(self._view(n) for n in sorted(self.members)),
                             frozenset(self.fdown))

    def _bounds(self) -> Policy:
        """The quorum of the update being decided (its request names it), else the
        fleet's."""
        return Policy(self.quorum or self.min_serving, self.max_live, self.min_admitting)

    def serving(self, name: str) -> bool:
        return name in self.members and serving(self._fleet(), self._view(name))

    # ------------------------------------------------------------------ feeding

    def feed(self, r: Mapping[str, Any], line: int) -> tuple[str, str] | None:
        """Check one record; None if it conforms, else (violated, message)."""
        if r.get("type") == HEADER:
            if r.get("schema") != SCHEMA or r.get("spec") != FLEET.name:
                return "Schema", (f"header is for schema {r.get('schema')!r} of spec "
                                  f"{r.get('spec')!r}, not schema {SCHEMA} of {FLEET.name}")
            bad = header_problem(r)
            if bad:
                return "Schema", bad
            self.last_seq = 0
            return None
        seq = r.get("seq")
        if type(seq) is not int or seq != self.last_seq + 1:
            return "SequenceGap", f"seq {seq!r} follows {self.last_seq}"
        self.last_seq = seq
        self.records += 1
        engine = r.get("engine")
        if engine is None:
            return self._fleet_step(r, line)
        if not isinstance(engine, str) or not engine:
            return "Schema", f"engine is not a member name: {engine!r}"
        return self._member_step(engine, r, line)

    def _member_step(self, name: str, r: Mapping[str, Any], line: int) -> tuple[str, str] | None:
        step = r.get("step")
        checker = self.members.get(name)
        # Inside a publish group only the group's publishes, and the steps of a member
        # quarantined all along (its fence, still in flight when the fleet decided: it
        # reads and writes that member alone, so it commutes with the publish).
        quarantined = checker is not None and checker.control.phase is Phase.TAINTED \
            and str(r.get("phase")) == Phase.TAINTED.value and name not in self.group
        # A release elsewhere commutes with the publish too (a rolling fleet serves on
        # while a wave publishes; releases do not take the fleet's lock).
        bystander = step == "release" and name not in self.group
        if name in self.restarting and not (isinstance(step, str) and step in _RESTARTS):
            return _TAKEOVER, (f"{name} {step} after the takeover of epoch {self.epoch} "
                               "before its restart (an outcome of a call the deposed leader "
                               "made)")
        self.restarting.discard(name)
        if self.group and isinstance(step, str) and step in _RESTARTS:
            # The controller died in the middle of the group (its successor, or itself
            # restarted, replays the journal): the members not yet published restart by
            # their own records, as the single-engine spec allows (validated: TAINTED).
            self.group = []
        if self.group and not quarantined and not bystander and (
                step != "publish" or name not in self.group):
            return "PublishNotAtomic", (f"{name} {step} before every member of the publish "
                                        f"group {self.group} published")
        if checker is None:
            if self.fphase != FleetPhase.UNINITIALIZED:
                return "Schema", f"member {name!r} appears after the fleet opened"
            if self.epoch is not None and name not in self.named:
                return "DetailContradictsFleet", (f"member {name!r} was not named by the "
                                                  f"takeover of epoch {self.epoch}")
            checker = self.members[name] = TraceChecker(memo=self._memo, window_check=False,
                                                        strict_timing=self.strict_timing)
            checker.feed({"type": HEADER, "schema": SCHEMA, "spec": checker.spec.name, "seq": 0,
                          "t": r.get("t")}, 0)
            self.member_seq[name] = 0
        if isinstance(step, str) and step in _NEED_FENCE and name in self.unfenced:
            return "NoDeposedEffectLands", (f"{name} {step} before epoch {self.epoch} fenced "
                                            "it (an older controller could still change it)")
        if self.fphase == FleetPhase.UNINITIALIZED and step in LIFTED:
            return "FleetGuard", (f"{name} {step} before fleet_open (the fleet spec takes no "
                                  "member step before the fleet opens)")
        if isinstance(step, str) and step in _RESTARTS \
                and self.fphase != FleetPhase.UNINITIALIZED:
            if not may_restart(self._fleet(), name):  # the controller crashed (again)
                g = CRASH.apply(FleetState(self.fphase, self.fcommitted, self.ftarget,
                                           (), 0, self.ffloor))
                self.fphase, self.fdown = g.fphase, frozenset(self.members)
                self.quorum = None  # the crashed controller's update is dropped
            self.fdown -= {name}
        elif self.fphase == FleetPhase.RECOVERING:
            return "FleetGuard", (f"{name} {step} while the fleet recovers (the spec takes "
                                  "only member restarts until fleet_recover)")
        if self.fphase != FleetPhase.UNINITIALIZED and isinstance(step, str) \
                and step in MEMBER_GUARDS:
            guard, tla = MEMBER_GUARDS[step]
            if not guard(self._fleet(), self._view(name), self._bounds()):
                return "FleetGuard", (f"{name} {step} where the fleet spec requires {tla} "
                                      f"(fleet {self.fphase}, committed {self.fcommitted}, "
                                      f"member committed {self.members[name].control.committed})")
        self.member_seq[name] += 1
        self._views.pop(name, None)
        param, before = r.get("param"), checker.control.phase
        released = checker.bound.get(param) if isinstance(param, str) else None
        if step == "admit" and isinstance(param, str):
            elsewhere = [n for n, c in self.members.items() if n != name and param in c.bound]
            if elsewhere:
                return _ONE_MEMBER, (f"{name} admits rollout {param!r}, still bound on "
                                     f"{elsewhere[0]} (only a migrate moves it)")
        bad = checker.feed({**r, "seq": self.member_seq[name]}, line)
        if bad is not None:
            return bad.violated, f"member {name}: {bad.message}"
        move = self.moves.get(param) if isinstance(param, str) else None
        if move is not None and step in ("release", "admit"):
            bad_move = self._moved(name, str(step), str(param), move, released, before,
                                   checker.bound.get(str(param)))
            if bad_move:
                return "MigrationKeepsGeneration", bad_move
        if step == "request_update" and self.fphase in ASKING_PHASES:
            if name in self.asked:
                return "spec", (f"{name} request_update again in the same update (the fleet "
                                "spec asks each member once: fasked)")
            self.asked.add(name)
            if name in self.participants and r["detail"]["target"] != self.flabel:
                return "DetailContradictsFleet", (f"{name} request_update names "
                                                  f"{r['detail']['target']!r}; the fleet's "
                                                  f"update is {self.flabel!r}")
        bad_identity = self._identity(name, str(step), r)
        if bad_identity:
            return _ONE_IDENTITY, bad_identity
        detail = r.get("detail")
        if isinstance(detail, Mapping) and "episode" in detail and step in ("admit",
                                                                          "release"):
            bad_episode = self._episode(name, str(step), str(param), detail,
                                        checker.bound.get(str(param)), released)
            if bad_episode:
                return bad_episode
        if step == "publish" and name in self.group:
            self.group.remove(name)
        if step in _AUDIT_OUTCOMES:
            detail = r.get("detail") or {}
            self.last_audit[name] = {"outcome": step, "reason": detail.get("reason"),
                                     "at": r.get("t"), "why": detail.get("why")}
        return None if self.group else self._invariants()

    def _fleet_step(self, r: Mapping[str, Any], line: int) -> tuple[str, str] | None:
        step = r.get("step")
        bad = _fleet_schema(r)
        if bad:
            return "Schema", bad
        assert isinstance(step, str)
        if self.group and step == FLEET_TAKEOVER:
            self.group = []  # a successor took over mid-group: see _member_step
        if self.group:
            return "PublishNotAtomic", f"{step} before the publish group {self.group} ended"
        detail = r.get("detail") or {}
        claimed = self._fleet_claims(step, detail)
        if claimed:
            return "DetailContradictsFleet", claimed
        if step == FLEET_OPEN:
            k = detail.get("min_serving") if isinstance(detail, dict) else None
            if self.fphase != FleetPhase.UNINITIALIZED or not isinstance(k, int) or k < 1:
                return "Schema", "fleet_open once, with min_serving"
            self.min_serving = k
            kk, c = detail.get("max_live", 1), detail.get("min_admitting", 0)
            bad_policy = (update_policy_error(kk, c, len(self.members))
                          if isinstance(kk, int) and isinstance(c, int)
                          else f"max_live {kk!r}, min_admitting {c!r}: not integers")
            if bad_policy:
                return "Schema", f"fleet_open with {bad_policy}"
            self.max_live, self.min_admitting = kk, c
            self._quorum_origin = line if self.on_unused is not None else None
            fa = _FLEET_STEP[FLEET_OPEN]
            if not fa.when(self._fleet(), self._bounds()):
                return "OpenOnlyWithQuorum", (f"fleet_open with {len(self._names(bootstrapped))}"
                                              " members verified on the first generation")
            self._take_half(fa)
        elif step in (FLEET_TAKEOVER, FLEET_FENCED):
            bad_epoch = self._epoch_step(step, detail)
            if bad_epoch:
                return bad_epoch
        elif step == MIGRATION.name:
            bad_move = self._migration(detail)
            if bad_move:
                return "MigrationKeepsGeneration", bad_move
        else:
            if step in FLEET_RECOVERS and self.restarting:
                return _TAKEOVER, (f"{step} before {sorted(self.restarting)} restarted after "
                                   f"the takeover of epoch {self.epoch}")
            if step in FLEET_RECOVERS and self.fdown:
                return "spec", f"{step} before {sorted(self.fdown)} restarted"
            fa = _FLEET_STEP[step]
            f = self._fleet()
            if self.fphase not in fa.sources or not fa.when(f, self._bounds()):
                return "spec", (f"{step} is not a step of the fleet spec from {self.fphase} "
                                f"(committed {self.fcommitted}, target {self.ftarget})")
            if step in ("fleet_publish", "fleet_publish_wave"):
                names = sorted(n for n in self.members if validated(f, self._view(n)))
                named = detail.get("members") if isinstance(detail, dict) else None
                if sorted(named or []) != names:
                    return "PublishNotAtomic", (f"{step} names {named}, the validated "
                                                f"members are {names}")
                self.group = names
            elif step in ("fleet_request_update", "fleet_roll"):
                self.flabel = detail["target"]
                self.participants, self.asked = list(detail["members"]), set()
            self._take_half(fa)
            if step in ("fleet_publish", "fleet_abort"):
                self.quorum = None  # decided: the fleet's own quorum again
            if step in ROLLING_STEPS and detail.get("floor") != self.ffloor:
                return "DetailContradictsFleet", (f"{step} says floor {detail.get('floor')!r}; "
                                                  f"the fleet spec says {self.ffloor}")
        if (r.get("phase"), r.get("committed"), r.get("target")) != (
                self.fphase, self.fcommitted, self.ftarget):
            return "spec", (f"{step} -> {r.get('phase')} (committed {r.get('committed')}, target "
                            f"{r.get('target')}), the fleet spec says {self.fphase} (committed "
                            f"{self.fcommitted}, target {self.ftarget})")
        return None if self.group else self._invariants()

    def _identity(self, name: str, step: str, r: Mapping[str, Any]) -> str | None:
        """Why ``name``'s ``step`` names another identity for its generation than the one
        the fleet published it with (None: it does not, names none, or the generation is
        not published yet: an update aborted before any publish may be retried with
        other weights). The first publish of a generation fixes its identity."""
        field = _IDENTITY_OF.get(step)
        detail = r.get("detail")
        if field is None or not isinstance(detail, dict) or "identity" not in detail:
            return None
        gen = r.get(field)
        if not isinstance(gen, int) or gen < 1:
            return None
        identity, held = detail["identity"], self.identities.get(gen)
        if held is None:
            if step == "publish":
                self.identities[gen] = (identity, name)
            return None
        if held[0] != identity:
            return (f"{name} {step} names identity {str(identity)[:24]} for generation {gen};"
                    f" {held[1]} named {str(held[0])[:24]}")
        return None

    def _take_half(self, fa: FleetAction) -> None:
        """The fleet's half of the spec's step ``fa`` (its guard already checked)."""
        g = fleet_half(fa, FleetState(self.fphase, self.fcommitted, self.ftarget, (), 0,
                                      self.ffloor))
        self.fphase, self.fcommitted, self.ftarget, self.ffloor = (
            g.fphase, g.fcommitted, g.ftarget, g.ffloor)

    def _epoch_step(self, step: str, d: Mapping[str, Any]) -> tuple[str, str] | None:
        """A takeover's epoch exceeds every earlier one (one writer per epoch, in epoch
        order: the journal never forks); it names every member once, fenced or not. A
        later ``fleet_fenced`` is of the same epoch and names members still unfenced."""
        epoch, fenced = d["epoch"], set(d["fenced"])
        named = [*d["fenced"], *d.get("unfenced", [])]
        if len(set(named)) != len(named):
            return "DetailContradictsFleet", f"{step} names a member twice: {sorted(named)}"
        if step == FLEET_TAKEOVER:
            if not succeeds(epoch, self.epoch):
                return "JournalOneWriterPerEpoch", (f"takeover by epoch {epoch} after epoch "
                                                    f"{self.epoch}")
            unfenced = set(d["unfenced"])
            if fenced & unfenced or (self.members and fenced | unfenced != set(self.members)):
                return "DetailContradictsFleet", (f"{step} names fenced {sorted(fenced)} and "
                                                  f"unfenced {sorted(unfenced)}: every member "
                                                  f"once ({sorted(self.members)})")
            self.epoch, self.unfenced, self.named = epoch, unfenced, fenced | unfenced
            self.restarting = set(self.members)  # each member's next step: its restart
            return None
        if epoch != self.epoch or not fenced or not fenced <= self.unfenced:
            return "DetailContradictsFleet", (f"{step} by epoch {epoch} names {sorted(fenced)}; "
                                              f"epoch {self.epoch} left {sorted(self.unfenced)} "
                                              "unfenced")
        self.unfenced -= fenced
        return None

    def _names(self, pred: Any) -> list[str]:
        f = self._fleet()
        return sorted(n for n in self.members if pred(f, self._view(n)))

    def _fleet_claims(self, step: str, d: Mapping[str, Any]) -> str | None:
        """Why a fleet step's detail contradicts the fleet's state (None: it does not)."""
        want: dict[str, Any] = {}
        if step == FLEET_OPEN:
            want["members"] = self._names(bootstrapped)
        elif step == "fleet_roll":
            want["members"] = sorted(d.get("members") or [])  # checked member by member
            bad = [n for n in want["members"] if n not in self.members
                   or self.members[n].control.committed != self.fcommitted]
            if bad:
                return f"fleet_roll names {bad}, not members on the frontier"
            for key, opened in (("max_live", self.max_live),
                                ("min_admitting", self.min_admitting)):
                if d.get(key) != opened:
                    return (f"fleet_roll says {key} {d.get(key)!r}; the fleet opened with "
                            f"{opened}")
            named = d.get("members") or []
            now = self._names(serving)
            on_frontier = [n for n in now if self.members[n].control.committed
                           == self.fcommitted]
            width = wave_width(len(now), len(on_frontier), self.min_admitting)
            if len(set(named)) != len(named) or len(named) != width:
                return (f"fleet_roll names {len(named)} member(s) {sorted(named)}; the wave is "
                        f"{width} ({len(now)} serving, {len(on_frontier)} on the frontier, "
                        f"min_admitting {self.min_admitting})")
        elif step == "fleet_publish_wave":
            want["label"] = self.flabel
        elif step == "fleet_end_wave":
            want["members"] = self._names(validated)
        elif step == "fleet_abort_wave":
            want.update(validated=self._names(validated), needed=self._bounds().min_serving)
        elif step == "fleet_request_update":
            want["members"] = self._names(serving)
            k = d.get("min_serving")
            if not (isinstance(k, int) and 1 <= k <= len(self.members)):
                return f"{step} names quorum {k!r}, not one of 1..{len(self.members)}"
            self.quorum = k  # the request's guard is evaluated with its own quorum
        elif step == "fleet_publish":
            want.update(label=self.flabel, min_serving=self.quorum)
        elif step == "fleet_abort":
            want.update(validated=self._names(validated), needed=self.quorum)
            held = self._names(held_back)
            if held or "held_back" in d:
                want["held_back"] = held
        elif step in ("fleet_reopen", "fleet_close"):
            want["serving"] = self._names(serving)
            if step == "fleet_close":
                want["min_serving"] = self.min_serving
        elif step in FLEET_RECOVERS:
            want.update(serving=len(self._names(serving)), min_serving=self.min_serving)
        if step == "fleet_close" or step in FLEET_RECOVERS:
            self._quorum_origin = None  # the fleet's own quorum compared: used
        for key, value in want.items():
            got = d.get(key)
            if (sorted(got) if isinstance(got, list) else got) != value:
                return f"{step} says {key} {got!r:.60}; the fleet's journal says {value!r:.60}"
        return None

    def _migration(self, d: Mapping[str, Any]) -> str | None:
        """Why a ``migrate`` record (it announces the move: the release and the admission
        it is made of follow) is malformed (None: it is not)."""
        names, rollout, gen = d.get("members"), d.get("rollout"), d.get("generation")
        if not (isinstance(names, list) and len(names) == 2 and names[0] != names[1]
                and all(n in self.members for n in names)):
            return f"migrate names members {names!r:.60}, not the two it moves between"
        if not isinstance(rollout, str) or rollout in self.moves or type(gen) is not int:
            return f"migrate of {rollout!r:.40}: not a rollout, already moving, or no generation"
        if self.members[str(names[0])].bound.get(rollout) != gen:
            return (f"migrate of {rollout!r:.40} off {names[0]}: not bound there on "
                    f"generation {gen}")
        self.moves[rollout] = (str(names[0]), str(names[1]), gen, False)
        return None

    def _moved(self, name: str, step: str, rollout: str, move: tuple[str, str, int, bool],
               released: int | None, before: Phase, bound: int | None) -> str | None:
        """Why member ``name``'s ``step`` of a moving rollout breaks the announced move
        (None: it does not): it leaves the member it was on while that member drains, on
        the generation announced, and joins the other on that same generation."""
        src, dst, gen, gone = move
        if step == "release" and name == src and not gone:
            if before is not Phase.DRAINING or released != gen:
                return (f"rollout {rollout!r} left {src} ({before.value}, generation "
                        f"{released}); the move says a draining member on generation {gen}")
            self.moves[rollout] = (src, dst, gen, True)
        elif step == "admit" and name == dst and gone:
            del self.moves[rollout]
            if bound != gen:
                return (f"rollout {rollout!r} joined {dst} on generation {bound}; it left "
                        f"{src} on generation {gen}: one rollout, two policies")
        else:
            return f"{name} {step} of rollout {rollout!r} is not the move {src} -> {dst}"
        return None

    def _episode(self, name: str, step: str, rollout: str, d: Mapping[str, Any],
                 bound: int | None, released: int | None) -> tuple[str, str] | None:
        """An agentic episode's hold taken or let go (the gateway's episodes): the
        episode spec's OneEpisodeOnePolicy and SegmentsInOrder over its admissions, one
        hold at a time."""
        e, seg = d["episode"], d.get("segment")
        if not isinstance(e, str):
            return "spec", f"episode {e!r:.40}: not an episode id"
        last = self.episodes.get(e)
        if step == "release":
            if last is None or last[3] != rollout or released is None:
                return "spec", f"episode {e!r} lets go of a hold it did not take"
            if d.get(HOLD_ENDS) == HOLD_LET_GO:
                self.episodes[e] = (*last[:3], None)
            else:
                del self.episodes[e]
            return None
        if type(seg) is not int or seg < 1 or bound is None:
            return "spec", f"episode {e!r}: segment {seg!r:.20} is not a segment number"
        if last is None and seg != 1:
            return "SegmentsInOrder", f"episode {e!r} starts at segment {seg}, not 1"
        if last is not None and last[3] is not None and last[3] in self.members[last[2]].bound:
            return "OneEpisodeOnePolicy", (f"episode {e!r} takes a second hold (segment "
                                           f"{seg}) while it holds one on {last[2]}")
        if last is not None:
            pair = ((last[0], last[1]), (seg, bound))
            if not one_policy_per_segment(pair):
                return "OneEpisodeOnePolicy", (f"episode {e!r}: segment {seg} admitted under "
                                               f"generation {bound}, it was under {last[1]}")
            if not segments_in_order(pair):
                return "SegmentsInOrder", (f"episode {e!r}: segment {seg} under generation "
                                           f"{bound} follows segment {last[0]} under "
                                           f"{last[1]}")
        self.episodes[e] = (seg, bound, name, rollout)
        return None

    def _invariants(self) -> tuple[str, str] | None:
        if self.fphase == FleetPhase.UNINITIALIZED:
            return None
        f, b = self._fleet(), self._bounds()
        for inv in FLEET.invariants:
            if inv.control_only and not inv.holds(f, b):
                serving_n = sum(serving(f, s) for s in f.eng)
                return inv.name, (f"{inv.doc} (fleet {self.fphase}, committed "
                                  f"{self.fcommitted}, {serving_n} serving)")
        return None


_FLEET_RECORD = {"type": "str", "step": "str", "op": None, "param": None, "phase": "str",
                 "pending": "str", "seq": "int", "committed": "int", "target": "int",
                 "t": "num", "hash": "str", "prev": "str"}


def _fleet_schema(r: Mapping[str, Any]) -> str | None:
    """Why a fleet step's record is malformed (None: it is not)."""
    step = r.get("step")
    if type(step) is not str or step not in _FLEET_STEPS:
        return f"unknown fleet step {step!r:.40}"
    unknown = set(r) - set(_FLEET_RECORD) - {"detail"}
    if unknown:
        return f"{step}: unknown field(s) {sorted(unknown)}"
    for key, kind in _FLEET_RECORD.items():
        v = r.get(key)
        ok = key in r and (v is None if kind is None else (
            type(v) in (int, float) if kind == "num" else type(v).__name__ == kind))
        if not ok:
            return f"{step}: {key} is not {kind or 'null'}: {v!r:.40}"
    phases = _FLEET_PHASES | ({FleetPhase.UNINITIALIZED} if step in (FLEET_TAKEOVER, FLEET_FENCED)
                              else set())
    if r["type"] != "step" or r["pending"] != "none" or r["phase"] not in phases:
        return f"{step}: a fleet step is of type step, with nothing pending, in a fleet phase"
    return detail_problem(step, r.get("detail"), FLEET_DETAIL)


def check_fleet_records(records: Iterable[tuple[int, Mapping[str, Any]]], *,
                        strict: bool = False) -> TraceVerdict:
    checker = FleetTraceChecker(strict_timing=strict)
    for line, rec in records:
        bad = checker.feed(rec, line)
        if bad is not None:
            return TraceVerdict(False, checker.records, line, bad[0], f"line {line}: {bad[1]}",
                                max((c.states_max for c in checker.members.values()), default=0))
    if checker.group:
        return TraceVerdict(False, checker.records, None, "PublishNotAtomic",
                            f"the journal ends inside the publish group {checker.group}", 0)
    sm = max((c.states_max for c in checker.members.values()), default=0)
    return TraceVerdict(True, checker.records, None, None,
                        f"accepted: {checker.records} records conform to {FLEET.name} "
                        f"({len(checker.members)} members)", sm,
                        timing_warnings(checker.members.values()))


def check_fleet_file(path: str | os.PathLike[str], *, strict: bool = False) -> TraceVerdict:
    """Verify the chain and check a fleet journal, streaming (a torn final record: a
    warning; ``strict``: a rejection)."""
    p = Path(path)
    try:
        reader = JournalReader(p)
        it = iter(reader)
        first = next(it, None)
    except OSError as e:
        raise TraceInputError(unreadable(p, e)) from None
    if first is None:
        raise TraceInputError(not_a_journal(p, reader.report))

    def records() -> Iterator[tuple[int, Mapping[str, Any]]]:
        yield first
        yield from it

    verdict = check_fleet_records(records(), strict=strict)
    if not verdict.accepted:
        return verdict
    return chain_verdict(verdict, reader.report, strict=strict)


def fleet_state(path: str | os.PathLike[str]) -> FleetTraceChecker:
    """The fleet's state as its journal leaves it (read only): the checker, fed every
    record. Raises TraceInputError if it is not a fleet journal or does not conform."""
    checker = FleetTraceChecker()
    try:
        for line, rec in JournalReader(path):
            bad = checker.feed(rec, line)
            if bad is not None:
                raise TraceInputError(f"{path}:{line}: {bad[0]}: {bad[1]}")
    except OSError as e:
        raise TraceInputError(unreadable(path, e)) from None
    if checker.last_seq < 0:
        raise TraceInputError(f"{path}: not a fleet journal")
    return checker


def is_fleet_journal(path: str | os.PathLike[str]) -> bool:
    """Whether the header of ``path`` names the fleet spec (False if unreadable)."""
    try:
        reader = JournalReader(path)
        first = next(iter(reader), None)
    except OSError:
        return False
    return first is not None and first[1].get("spec") == FLEET.name


__all__ = ["FleetTraceChecker", "check_fleet_file", "check_fleet_records", "fleet_state",
           "is_fleet_journal"]
