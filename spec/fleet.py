"""The fleet: one transactional policy update across N engines, quarantine and verified
re-admission. Each member runs the single-engine lifecycle of :mod:`.lifecycle`
unchanged: its actions are *lifted* (the same rows, applied to one member's state) and the
fleet only adds guards and a handful of fleet steps.

Theory of operation
-------------------
The state is the fleet's phase, its committed generation (the *frontier*), its *floor*
(the oldest generation still served: the frontier itself, except in a rolling update) and
target, one single-engine :class:`~rolloutcore.spec.lifecycle.State` per member, and one
fault budget for the whole fleet.

A member *serves* when it is READY on a generation from the floor to the frontier (in a
strict update: at the fleet's committed generation) with every piece of evidence in hand;
a member whose audit failed, or that was suspected unreachable, or
whose audit found it replaced (quarantined), stops serving at once. Rollouts are admitted
only on serving members, only while the fleet is READY and at least ``min_serving``
serve; a READY fleet whose serving members fall below that closes (``fleet_close``) and
reopens once a quorum serves again. Members are audited only outside the fleet's update
(whose own verification reads every member anew).

Two-phase commit of a generation. ``fleet_request_update`` closes admissions fleet-wide
and names the target; every serving member then runs its own cycle (drain, quiesce,
mutate, invalidate, validate, resume, probe), in parallel, up to RESUMING with every
piece of evidence, where it waits: a member may not publish on its own. Once every
member has *settled* (validated and waiting, READY, or TAINTED: a quarantined member's
fence holds nobody closed), ``fleet_publish`` commits the target on every validated
member at once, if there are at least
``min_serving`` of them; with fewer, ``fleet_abort`` keeps the fleet on its generation:
validated members give up (TAINTED, quarantined) and are brought back to the committed
generation by verified re-admission, members whose mutation was refused reopen on it.

A member that cannot take part stops the publish: one still READY on the fleet's
generation with rollouts bound (its drain timed out and it cancelled its own update) is
*held back*; once every member has settled or is held back, ``fleet_abort`` may end the
update (publishing would leave those rollouts on a member that no longer serves), and the
held-back member simply keeps serving the committed generation. An update asks each
member once (``fasked``, the members it asked; forgotten when it ends), as the runtime
does: a member that cancelled or abandoned it stays out of it, so members taking turns to
leave cannot keep its decision waiting (a liveness property, FleetUpdateEnds, shows it).

Quarantine is the member's TAINTED: it gets no rollout and takes no part in an update
until it is re-admitted (``readmit``, an explicit operation that verifies label,
identity and a probe against the member's committed generation). A member that is READY
on an older generation than the fleet's (it was quarantined, or refused, during an
update) is not serving; it catches up by updates of its own, one generation at a time,
up to the fleet's generation, publishing each alone because nobody is bound to it. It may
catch up while the fleet is READY or ABORTING (an aborted fleet may need it to regain its
quorum), never during the fleet's own update.

The controller's own crash (``fleet_crash``, an environment step: nothing is journalled;
the bound ``crashes`` says how many the model explores). Its recovery replays the journal
and restarts every member once, in any order, each by the single-engine spec's restart
actions: a member left in doubt restarts TAINTED (it serves again only after
re-admission), and whatever its call in flight did to its engine may or may not have
happened. Nothing else happens meanwhile (RECOVERING). Once every member has restarted,
``fleet_recover`` reopens the fleet if a quorum serves, ``fleet_recover_closed`` keeps it
closed (ABORTING) if not; frontier and floor are kept, an update in progress is dropped.

Rolling updates (``max_live`` K >= 2, ``min_admitting`` C). The fleet's committed
generation is its *frontier*; its *floor* (``ffloor``) is the oldest generation still
served, and members serve any generation from the floor to the frontier. With K = 1 the
floor is the frontier and everything above is the strict update, unchanged. With K >= 2
the trainer's update rolls instead (``fleet_roll``, only while the next frontier stays
within K of the floor): members on the frontier join the *wave* one at a time, each only
while at least C others keep serving (they go on admitting rollouts on their generation
meanwhile), and run their own cycle up to RESUMING as in the strict update. Once no
member is in the middle of it, ``fleet_publish_wave`` commits the target on every
validated member at once: the frontier moves, the floor stays, and two generations are
served. The members left on the old generation catch up alone (the strict update's catch-
up, with the same C guard), and once none serves or holds rollouts below the frontier,
``fleet_raise_floor`` moves the floor up to the frontier; a rolling update starts only
while the next frontier stays within K of the floor, so at most K generations are ever
served. A wave that validated nothing ends (``fleet_end_wave``) on the generations
served; one that would leave fewer than ``min_serving`` serving aborts
(``fleet_abort_wave``) as a strict update does.

In-flight migration (``migrate``, one step over two members). A member that must update
need not wait for its rollouts: while it drains, a rollout bound on it moves to a member
that serves the rollout's own generation (the gateway resubmits the prompt and the tokens
generated so far to it). In one step the rollout is released on the member it leaves (its
engine request lives on as an orphan until that engine ends it, as after a client that
gave up) and admitted on the other, exactly as ``admit`` would there; it keeps its
generation (``MigrationKeepsGeneration``) and joins only a serving member
(``RolloutsJoinOnlyServingMembers``). With no member left on its generation, the drain
waits, as before.

The fleet opens (``fleet_open``, from UNINITIALIZED, where no member takes a step) once
at least ``min_serving`` members are verified on the first generation, as the
single-engine bootstrap leaves them (the bootstrap itself is the engine spec's).

Not modelled here: the drain policy's abort path. A takeover by a new epoch
(``fleet_takeover``, ``fleet_fenced``) is the failover spec's ``campaign`` and ``fence``
(:data:`rolloutcore.spec.failover.FLEET_JOURNAL_STEPS`): it changes no fleet variable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, NamedTuple, Protocol

from rolloutcore.spec.lifecycle import (
    ACTIONS,
    ALL_EVIDENCE,
    FENCED,
    SPEC,
    TIERS,
    VARIABLES,
    VERIFIED_TLA,
    Action,
    Bounds,
    Fairness,
    Kind,
    Param,
    Phase,
    Spec,
    State,
    param_domain,
    param_var,
    verified,
)
from rolloutcore.spec.tla import module as tla_module
from rolloutcore.spec.tla import tla_name

#: Single-engine actions a member takes in the fleet (bootstrap, restarts and the abort
#: drain are outside the fleet model; see the module doc).
LIFTED: tuple[str, ...] = tuple(
    a.name for a in ACTIONS
    if a.op not in ("bootstrap", "pause_abort") and a.kind is not Kind.RESTART
    and a.name != "release_aborted")
UNBOUNDED = 10**9


class FleetPhase:
    UNINITIALIZED = "UNINITIALIZED"  # members bootstrapping; nothing admitted, audited or updated
    READY = "READY"
    UPDATING = "UPDATING"
    ABORTING = "ABORTING"
    ROLLING = "ROLLING"  # a rolling update: a wave prepares while the rest serve
    RECOVERING = "RECOVERING"  # the controller crashed: members restart, then the fleet


#: Fleet phases in which a member behind the fleet may catch up (not during the fleet's
#: own update, whose decision waits for every member to settle).
CATCH_UP_PHASES = frozenset({FleetPhase.READY, FleetPhase.ABORTING})
#: Fleet phases of an update that asks its members to update, each once (its decision
#: waits for each answer; a member that cancelled or abandoned stays out of it).
ASKING_PHASES = frozenset({FleetPhase.UPDATING, FleetPhase.ROLLING})


def _asking_tla(var: str = "fphase") -> str:
    """TLA+: fleet phase ``var`` (``fphase`` or ``fphase'``) is one of ASKING_PHASES."""
    return f"{var} \\in {{" + ", ".join(f'"{p}"' for p in sorted(ASKING_PHASES)) + "}"


def update_policy_error(max_live: int, min_admitting: int, members: int) -> str | None:
    """Why (``max_live`` K, ``min_admitting`` C) is not an update policy for a fleet of
    ``members``, or None: K in 1..members (more live generations than members cannot be
    served), C in 0..members-1 (a wave needs a member to leave), and C = 0 with K = 1 (the
    strict update closes every member). The one statement of the rule: the fleet file,
    the fleet and the fleet checker all ask it."""
    if not 1 <= max_live <= members or not 0 <= min_admitting < members \
            or (max_live == 1 and min_admitting):
        return (f"max_live {max_live} and min_admitting {min_admitting} with {members} "
                f"members: K in 1..{members}, C in 0..{members - 1}, and C = 0 with K = 1")
    return None


class MemberView(Protocol):
    """What the fleet's predicates read of a member: the spec's :class:`State`, the
    runtime controller's snapshot and the trace checker's replayed view all are one."""

    @property
    def phase(self) -> Phase: ...
    @property
    def committed(self) -> int: ...
    @property
    def target(self) -> int: ...
    @property
    def pending(self) -> str: ...
    @property
    def evidence(self) -> frozenset[str]: ...
    @property
    def bind(self) -> tuple[int, ...]: ...


class SlotsView(MemberView, Protocol):
    """A member with its engine requests per slot (what the migration guard reads of the
    member a rollout joins)."""

    @property
    def req(self) -> tuple[int, ...]: ...


class FleetView(Protocol):
    """What the fleet's predicates read of the fleet: :class:`FleetState` in the model,
    :class:`FleetSnapshot` in the runtime and the trace checker."""

    @property
    def fphase(self) -> str: ...
    @property
    def fcommitted(self) -> int: ...
    @property
    def ftarget(self) -> int: ...
    @property
    def ffloor(self) -> int: ...
    @property
    def eng(self) -> Sequence[MemberView]: ...
    @property
    def fdown(self) -> frozenset[object]: ...


class UpdatePolicy(Protocol):
    """What the fleet's guards read of its bounds: the quorum and the rolling K and C
    (:class:`FleetBounds` in the model, :class:`Policy` in the runtime and checker)."""

    @property
    def min_serving(self) -> int: ...
    @property
    def max_live(self) -> int: ...
    @property
    def min_admitting(self) -> int: ...


@dataclass(frozen=True)
class FleetSnapshot:
    """A fleet as the runtime and the trace checker hold it, read by the spec's predicates
    (typed: the fleet's half, and one view per member, in member order)."""

    fphase: str
    fcommitted: int
    ftarget: int
    ffloor: int
    eng: tuple[MemberView, ...] = ()
    #: The members (by name) a recovery has yet to restart.
    fdown: frozenset[object] = frozenset()


@dataclass(frozen=True)
class Policy:
    """The update policy the runtime and the checker decide with."""

    min_serving: int
    max_live: int = 1
    min_admitting: int = 0


@dataclass(frozen=True)
class MemberSnapshot:
    """A member as the trace checker replays it (and, with its request slots, as the
    migration guard reads the member a rollout joins)."""

    phase: Phase
    committed: int
    target: int
    pending: str
    evidence: frozenset[str]
    bind: tuple[int, ...]
    req: tuple[int, ...] = ()

    @classmethod
    def with_free_slot(cls, v: MemberView) -> MemberSnapshot:
        """``v`` with one more slot, free of a rollout and of an engine request, as slot
        1: the controller has no slots, only bindings, and a migration joins a free one."""
        return cls(v.phase, v.committed, v.target, v.pending, v.evidence, (0, *v.bind),
                   (0,) * (len(v.bind) + 1))


@dataclass(frozen=True)
class FleetBounds:
    engines: int = 2
    min_serving: int = 2
    generations: int = 2  # the initial one included
    faults: int = 1  # fault outcomes across the whole fleet
    rollouts: int = 1  # slots per member
    max_live: int = 1  # K: generations served at once (1: the strict fleet-wide update)
    min_admitting: int = 0  # C: members that keep admitting through a rolling update
    crashes: int = 0  # crashes of the fleet controller (each followed by its recovery)

    def __post_init__(self) -> None:
        if not (1 <= self.min_serving <= self.engines) or self.rollouts < 0 \
                or self.generations < 1 or self.faults < 0 or self.crashes < 0:
            raise ValueError(f"fleet bounds out of range: {self}")
        bad = update_policy_error(self.max_live, self.min_admitting, self.engines)
        if bad:
            raise ValueError(bad)


class FleetState(NamedTuple):
    fphase: str
    fcommitted: int  # the frontier: the newest generation published
    ftarget: int
    eng: tuple[State, ...]
    faults: int
    ffloor: int  # the oldest generation still served (the frontier, with max_live 1)
    fdown: frozenset[int] = frozenset()  # members (from 1) a recovery has yet to restart
    fcrashes: int = 0  # controller crashes so far (bounded by FleetBounds.crashes)
    fasked: frozenset[int] = frozenset()  # members (from 1) the update under way asked


def _asked_kept(f: FleetState) -> FleetState:
    """The members asked are the update's: forgotten once the fleet leaves it."""
    return f if f.fphase in ASKING_PHASES or not f.fasked else f._replace(fasked=frozenset())


def next_tier(s: State) -> str | None:
    """The first tier, in reset order, not yet verified clean in this cycle."""
    return next((t for t in TIERS if t not in s.cleared), None)


def serving(f: FleetView, s: MemberView) -> bool:
    """READY on a generation the fleet serves (from its floor to its frontier; with
    max_live 1 both are its committed generation) with every piece of evidence in hand."""
    return s.phase is Phase.READY and f.ffloor <= s.committed <= f.fcommitted \
        and verified(s)


def quorum(f: FleetView, b: UpdatePolicy) -> bool:
    """At least min_serving members serve."""
    return _count(f, serving) >= b.min_serving


#: The generation every member's bootstrap adopts, on which the fleet opens.
FIRST_GENERATION = 1


def admission_floor(frontier: int, min_generation: int = 0, max_staleness: int | None = None,
                    floor: int = 0) -> int:
    """The oldest generation a rollout may be admitted under: the caller's minimum, at
    most ``max_staleness`` generations behind the ``frontier``, and never below a
    ``floor`` (the gateway's fleet-wide one). The one statement of the minimum-generation
    and staleness rule: the fleet's admission and the gateway's refusal both ask it."""
    return max(min_generation, floor, 0 if max_staleness is None else frontier - max_staleness)


def wave_width(serving_now: int, on_frontier: int, min_admitting: int) -> int:
    """How many members a rolling update's wave takes at once: every member on the
    frontier that can leave while ``min_admitting`` others keep serving (the spec lets
    them join one by one under that guard; the runtime takes them together). The runtime
    picks its wave by it, and the fleet checker holds a ``fleet_roll``'s member list to
    it (a list that is shorter, or a C forged lower, shows)."""
    return max(0, min(on_frontier, serving_now - min_admitting))


def _serves_frontier(f: FleetView, s: MemberView) -> bool:
    return serving(f, s) and s.committed == f.fcommitted


def bootstrapped(_f: FleetView, s: MemberView) -> bool:
    """A member its bootstrap left READY on the first generation, every piece of evidence
    in hand: what the fleet opens on."""
    return s.phase is Phase.READY and s.committed == FIRST_GENERATION and verified(s)


def may_restart(f: FleetView, member: object) -> bool:
    """Whether ``member`` may take its restart step: the fleet controller crashed and its
    recovery has not restarted that member yet (each member restarts once per recovery)."""
    return f.fphase == FleetPhase.RECOVERING and member in f.fdown


def validated(f: FleetView, s: MemberView) -> bool:
    """A member that completed the fleet's update and waits for the fleet's decision."""
    return (s.phase is Phase.RESUMING and f.ftarget != 0 and s.target == f.ftarget
            and s.evidence == ALL_EVIDENCE and s.pending == "none")


def held_back(f: FleetView, s: MemberView) -> bool:
    """A member still READY on the fleet's generation with rollouts bound (its drain timed
    out and it cancelled its own update, or it has not started it): the fleet cannot
    publish while it holds them, but may abort the update around it."""
    return (s.phase is Phase.READY and s.pending == "none" and s.committed == f.fcommitted
            and any(s.bind))


def settled(f: FleetView, s: MemberView) -> bool:
    """A member the fleet's decision can go ahead without: validated; quarantined (TAINTED,
    even while its fence is still in flight: nothing it does from there changes the
    decision, so a member that does not answer its fence holds nobody else closed); or
    READY with nothing bound (its update refused, or behind the fleet). A READY member
    still holding rollouts of the committed generation has not settled: publishing would
    leave them on a member that no longer serves."""
    return validated(f, s) or s.phase is Phase.TAINTED or (
        s.pending == "none" and s.phase is Phase.READY and not any(s.bind))


def wave_settled(f: FleetView, s: MemberView) -> bool:
    """A member a rolling wave's decision can go ahead without: validated, or READY or
    TAINTED with nothing pending (it never joined the wave, cancelled, or was quarantined).
    A READY member may hold rollouts: it serves the generation it has."""
    return validated(f, s) or (s.pending == "none" and s.phase in (Phase.READY, Phase.TAINTED))


def floor_free(f: FleetView, s: MemberView) -> bool:
    """A member that keeps the floor where it is no longer: on the frontier, or neither
    serving below it nor holding rollouts of an older generation."""
    return s.committed >= f.fcommitted or (not serving(f, s) and not any(s.bind))


# ---------------------------------------------------------------------- fleet guards

#: Extra guard per lifted action (Python, TLA+): ``f`` the fleet, ``s`` the member, ``b``
#: the bounds (min_serving).
MemberGuard = tuple[Callable[[FleetView, MemberView, UpdatePolicy], bool], str]
_TRUE: MemberGuard = (lambda _f, _s, _b: True, "TRUE")
#: TLA+: how many members serve (``Serving`` is defined in the module).
N_SERVING_TLA = "Cardinality({m \\in Engines : Serving(eng[m])})"
#: TLA+: how many would serve without member ``e`` (its update takes it out).
_SERVING_WITHOUT_E_TLA = f"{N_SERVING_TLA} - (IF Serving(e) THEN 1 ELSE 0) >= MinAdmitting"


def _capacity_kept(f: FleetView, s: MemberView, b: UpdatePolicy) -> bool:
    """Member ``s`` may leave service for an update: at least min_admitting others serve."""
    return _count(f, serving) - int(serving(f, s)) >= b.min_admitting


MEMBER_GUARDS: Mapping[str, MemberGuard] = {
    # Rollouts only on serving members (a generation from the floor to the frontier) of a
    # READY or rolling fleet, while a quorum serves.
    "admit": (lambda f, s, b: f.fphase in (FleetPhase.READY, FleetPhase.ROLLING)
              and f.ffloor <= s.committed <= f.fcommitted and quorum(f, b),
              f'fphase \\in {{"READY", "ROLLING"}} /\\ e.committed >= ffloor '
              f'/\\ e.committed <= fcommitted /\\ {N_SERVING_TLA} >= MinServing'),
    # A serving member joins the fleet's update; in a rolling update, a member on the
    # frontier joins the wave while min_admitting others serve; a member behind catches
    # up alone, one generation per update, outside the fleet's own update (and, serving
    # an older generation, while min_admitting others serve).
    "request_update": (
        lambda f, s, b: (f.fphase == FleetPhase.UPDATING and s.committed == f.fcommitted)
        or (f.fphase == FleetPhase.ROLLING and s.committed == f.fcommitted
            and _capacity_kept(f, s, b))
        or (f.fphase in CATCH_UP_PHASES and s.committed < f.fcommitted
            and _capacity_kept(f, s, b)),
        '\\/ (fphase = "UPDATING" /\\ e.committed = fcommitted)\n'
        '       \\/ (fphase = "ROLLING" /\\ e.committed = fcommitted\n'
        f'           /\\ {_SERVING_WITHOUT_E_TLA})\n'
        '       \\/ (fphase \\in {"ABORTING", "READY"} /\\ e.committed < fcommitted\n'
        f'           /\\ {_SERVING_WITHOUT_E_TLA})'),
    # A member publishes alone only a generation the fleet has published (it catches up:
    # nobody is bound to it); the fleet's target is committed by fleet_publish, on every
    # validated member at once.
    "publish": (lambda f, s, _b: s.target <= f.fcommitted, "e.target <= fcommitted"),
    # The fleet runner resets the tiers in their order; the model follows it.
    "reset_begin": _TRUE,
    # Audits outside the fleet's update (its own verification reads every member anew).
    "audit_begin": (lambda f, _s, _b: f.fphase != FleetPhase.UPDATING, 'fphase # "UPDATING"'),
    # Re-admission outside the fleet's update and rolling wave (the runtime orders them
    # behind one lock): the update's decision never waits for one, it counts a
    # quarantined member as settled instead.
    "readmit_begin": (lambda f, _s, _b: f.fphase not in (FleetPhase.UPDATING,
                                                          FleetPhase.ROLLING),
                      'fphase \\notin {"UPDATING", "ROLLING"}'),
}
#: Member steps that spend the fleet's fault budget although the single-engine spec does
#: not count them: giving up follows exhausted retries, that is, failures.
FAULT_IN_FLEET = frozenset({"give_up"})
#: Member actions the update schedule orders (see FleetSpec.successors): the steps of a
#: member's own update cycle.
CYCLE_OPS = frozenset({"pause", "mutate", "reset", "validate", "resume", "probe"})


@dataclass(frozen=True)
class FleetAction:
    name: str
    doc: str
    sources: frozenset[str]
    dest: str
    when: Callable[[FleetView, UpdatePolicy], bool]
    when_tla: str
    apply: Callable[[FleetState], FleetState]
    apply_tla: Mapping[str, str]  # fleet variable -> new value (TLA+)
    needs_generation: bool = False


def _publish_validated(f: FleetState, *, rolling: bool = False,
                       commits: Callable[[FleetState, State], bool] | None = None
                       ) -> FleetState:
    """Commit the target on every validated member at once; a strict update moves the
    floor with the frontier, a rolling wave leaves it (the others serve the old one).
    ``commits``: which members commit (a mutant's rule; the spec's is ``validated``)."""
    pub = SPEC.action("publish")
    which = commits or validated
    eng: list[State] = []
    for s in f.eng:
        upd: dict[str, Any] = {**pub.control(s, None), "phase": Phase.READY}
        eng.append(s._replace(**upd) if which(f, s) else s)
    return f._replace(fphase=FleetPhase.READY, fcommitted=f.ftarget, ftarget=0, eng=tuple(eng),
                      ffloor=f.ffloor if rolling else f.ftarget)


def _count(f: FleetView, pred: Callable[[FleetView, MemberView], bool]) -> int:
    return sum(1 for s in f.eng if pred(f, s))


def _admitted(f: FleetState, g: FleetState) -> bool:
    """Some rollout was admitted by the step from ``f`` to ``g``."""
    return any(a == 0 and b != 0 for s, t in zip(f.eng, g.eng, strict=True)
               for a, b in zip(s.bind, t.bind, strict=True))


_VALIDATED_TLA = ('e.phase = "RESUMING" /\\ ftarget # 0 /\\ e.target = ftarget '
                  '/\\ e.evidence = AllEvidence /\\ e.pending = "none"')
#: TAINTED settles whatever is pending (its fence may be in flight), as in settled().
_SETTLED_TLA = (f'\\A n \\in Engines : LET e == eng[n] IN ({_VALIDATED_TLA}) '
                '\\/ e.phase = "TAINTED" \\/ (e.pending = "none" /\\ e.phase = "READY" '
                '/\\ \\A i \\in Slots : e.bind[i] = 0)')
_HELD_BACK_TLA = ('eng[n].phase = "READY" /\\ eng[n].pending = "none" '
                  '/\\ eng[n].committed = fcommitted /\\ \\E i \\in Slots : eng[n].bind[i] # 0')
N_VALIDATED_TLA = f"Cardinality({{n \\in Engines : LET e == eng[n] IN {_VALIDATED_TLA}}})"
#: Every member settled or held back, and no publish possible: fewer than min_serving
#: validated, or a member held back.
FLEET_ABORT_WHEN_TLA = (
    f"(\\A n \\in Engines : Settled(eng[n]) \\/ ({_HELD_BACK_TLA}))\n"
    f"    /\\ ({N_VALIDATED_TLA} < MinServing \\/ \\E n \\in Engines : {_HELD_BACK_TLA})")
_N_SERVING_TLA = N_SERVING_TLA
#: How many members serve after the step (TLA+, inside an action property).
_N_SERVING_AFTER_TLA = ("Cardinality({m \\in Engines : eng'[m].phase = \"READY\" "
                        "/\\ eng'[m].committed >= ffloor' /\\ eng'[m].committed <= fcommitted' "
                        "/\\ " + VERIFIED_TLA.replace("evidence", "eng'[m].evidence") + "})")
FLEET_PUBLISH_WHEN_TLA = f"({_SETTLED_TLA}) /\\ {N_VALIDATED_TLA} >= MinServing"
_WAVE_SETTLED_TLA = (f'\\A n \\in Engines : LET e == eng[n] IN ({_VALIDATED_TLA}) '
                     '\\/ (e.pending = "none" /\\ e.phase \\in {"READY", "TAINTED"})')
FLEET_PUBLISH_WAVE_WHEN_TLA = (f"({_WAVE_SETTLED_TLA})\n    /\\ {N_VALIDATED_TLA} >= 1 "
                               f"/\\ {N_SERVING_TLA} + {N_VALIDATED_TLA} >= MinServing")
FLEET_RAISE_FLOOR_WHEN_TLA = (
    'ffloor < fcommitted /\\ \\A n \\in Engines : eng[n].committed >= fcommitted '
    '\\/ (~Serving(eng[n]) /\\ \\A i \\in Slots : eng[n].bind[i] = 0)')
_PUBLISH_TLA = ('[n \\in Engines |-> LET e == eng[n] IN IF ' + _VALIDATED_TLA +
                ' THEN [e EXCEPT !.phase = "READY", !.committed = e.target, !.target = 0] '
                'ELSE e]')
FLEET_REOPEN_WHEN_TLA = ('(\\A n \\in Engines : eng[n].phase \\in {"READY", "TAINTED"} '
                         '/\\ eng[n].pending = "none") /\\ ' + _N_SERVING_TLA + ' >= MinServing')

FLEET_RECOVER_WHEN_TLA = f"fdown = {{}} /\\ {N_SERVING_TLA} >= MinServing"
N_BOOTSTRAPPED_TLA = (f"Cardinality({{n \\in Engines : eng[n].phase = \"READY\" "
                      f"/\\ eng[n].committed = {FIRST_GENERATION} /\\ "
                      + VERIFIED_TLA.replace("evidence", "eng[n].evidence") + "})")

FLEET_ACTIONS: tuple[FleetAction, ...] = (
    FleetAction(
        "fleet_open",
        "At least min_serving members are verified on the first generation (their "
        "bootstrap adopted it): the fleet opens on it, its frontier and floor.",
        frozenset({FleetPhase.UNINITIALIZED}), FleetPhase.READY,
        lambda f, b: _count(f, bootstrapped) >= b.min_serving,
        f"{N_BOOTSTRAPPED_TLA} >= MinServing",
        lambda f: f._replace(fphase=FleetPhase.READY, fcommitted=FIRST_GENERATION, ftarget=0,
                             ffloor=FIRST_GENERATION),
        {"fphase": '"READY"', "fcommitted": str(FIRST_GENERATION), "ftarget": "0",
         "ffloor": str(FIRST_GENERATION)}),
    FleetAction(
        "fleet_request_update",
        "The trainer asks for the next generation (a quorum serving): admissions close on "
        "every member (the strict update: max_live 1).",
        frozenset({FleetPhase.READY}), FleetPhase.UPDATING,
        lambda f, b: b.max_live == 1 and quorum(f, b),
        f"MaxLive = 1 /\\ {N_SERVING_TLA} >= MinServing",
        lambda f: f._replace(fphase=FleetPhase.UPDATING, ftarget=f.fcommitted + 1),
        {"fphase": '"UPDATING"', "ftarget": "fcommitted + 1"}, needs_generation=True),
    FleetAction(
        "fleet_publish",
        "Every member has settled and at least min_serving validated the target: commit it "
        "on every validated member at once.",
        frozenset({FleetPhase.UPDATING}), FleetPhase.READY,
        lambda f, b: all(settled(f, s) for s in f.eng) and _count(f, validated) >= b.min_serving,
        FLEET_PUBLISH_WHEN_TLA,
        _publish_validated,
        {"fphase": '"READY"', "fcommitted": "ftarget", "ftarget": "0", "ffloor": "ftarget",
         "eng": _PUBLISH_TLA}),
    FleetAction(
        "fleet_abort",
        "Every member has settled or is held back (READY with rollouts bound: its drain "
        "timed out), and fewer than min_serving validated or a member is held back: the "
        "fleet stays on its generation; validated members give up and are re-admitted onto "
        "it, held-back members keep serving it.",
        frozenset({FleetPhase.UPDATING}), FleetPhase.ABORTING,
        lambda f, b: all(settled(f, s) or held_back(f, s) for s in f.eng)
        and (_count(f, validated) < b.min_serving or _count(f, held_back) > 0),
        FLEET_ABORT_WHEN_TLA,
        lambda f: f._replace(fphase=FleetPhase.ABORTING), {"fphase": '"ABORTING"'}),
    FleetAction(
        "fleet_close",
        "Fewer than min_serving members serve (audits found members replaced or "
        "unreachable, or they were suspected): admissions close until a quorum serves again "
        "(fleet_reopen).",
        frozenset({FleetPhase.READY}), FleetPhase.ABORTING,
        lambda f, b: not quorum(f, b), f"{_N_SERVING_TLA} < MinServing",
        lambda f: f._replace(fphase=FleetPhase.ABORTING), {"fphase": '"ABORTING"'}),
    FleetAction(
        "fleet_reopen",
        "The aborted update is undone (or the fleet was closed): no member is left on the "
        "target, and at least min_serving members serve the committed generation again: "
        "admissions reopen.",
        frozenset({FleetPhase.ABORTING}), FleetPhase.READY,
        lambda f, b: all(s.phase in (Phase.READY, Phase.TAINTED) and s.pending == "none"
                         for s in f.eng) and _count(f, serving) >= b.min_serving,
        FLEET_REOPEN_WHEN_TLA,
        lambda f: f._replace(fphase=FleetPhase.READY, ftarget=0),
        {"fphase": '"READY"', "ftarget": "0"}),
    FleetAction(
        "fleet_roll",
        "The trainer asks for the next generation as a rolling update (max_live >= 2, the "
        "next frontier still within max_live of the floor, a quorum serving, and a wave "
        "to take: a member on the frontier that may leave while min_admitting others "
        "serve): members on the frontier join the wave one by one while min_admitting "
        "others keep admitting.",
        frozenset({FleetPhase.READY}), FleetPhase.ROLLING,
        lambda f, b: b.max_live >= 2 and f.fcommitted + 1 - f.ffloor < b.max_live
        and quorum(f, b) and wave_width(_count(f, serving), _count(f, _serves_frontier),
                                        b.min_admitting) >= 1,
        f"MaxLive >= 2 /\\ fcommitted + 1 - ffloor < MaxLive /\\ {N_SERVING_TLA} >= MinServing\n"
        f"    /\\ {N_SERVING_TLA} > MinAdmitting\n"
        "    /\\ \\E n \\in Engines : Serving(eng[n]) /\\ eng[n].committed = fcommitted",
        lambda f: f._replace(fphase=FleetPhase.ROLLING, ftarget=f.fcommitted + 1),
        {"fphase": '"ROLLING"', "ftarget": "fcommitted + 1"}, needs_generation=True),
    FleetAction(
        "fleet_publish_wave",
        "No member is in the middle of the wave and at least one validated the target (with "
        "a quorum serving after it): commit it on every validated member at once; the "
        "frontier moves, the floor stays (the others serve the old generation until they "
        "catch up).",
        frozenset({FleetPhase.ROLLING}), FleetPhase.READY,
        lambda f, b: all(wave_settled(f, s) for s in f.eng) and _count(f, validated) >= 1
        and _count(f, serving) + _count(f, validated) >= b.min_serving,
        FLEET_PUBLISH_WAVE_WHEN_TLA,
        lambda f: _publish_validated(f, rolling=True),
        {"fphase": '"READY"', "fcommitted": "ftarget", "ftarget": "0", "eng": _PUBLISH_TLA}),
    FleetAction(
        "fleet_end_wave",
        "No member is in the middle of the wave, none validated the target, and a quorum "
        "serves: the rolling update ends on the generations served.",
        frozenset({FleetPhase.ROLLING}), FleetPhase.READY,
        lambda f, b: all(wave_settled(f, s) for s in f.eng) and _count(f, validated) == 0
        and quorum(f, b),
        f"({_WAVE_SETTLED_TLA})\n    /\\ {N_VALIDATED_TLA} = 0 /\\ {N_SERVING_TLA} >= MinServing",
        lambda f: f._replace(fphase=FleetPhase.READY, ftarget=0),
        {"fphase": '"READY"', "ftarget": "0"}),
    FleetAction(
        "fleet_abort_wave",
        "No member is in the middle of the wave and fewer than min_serving would serve after "
        "it (faults took members out): admissions close as in an aborted strict update; "
        "validated members give up and are re-admitted, and the fleet reopens with a "
        "quorum (fleet_reopen).",
        frozenset({FleetPhase.ROLLING}), FleetPhase.ABORTING,
        lambda f, b: all(wave_settled(f, s) for s in f.eng)
        and _count(f, serving) + _count(f, validated) < b.min_serving,
        f"({_WAVE_SETTLED_TLA})\n    /\\ {N_SERVING_TLA} + {N_VALIDATED_TLA} < MinServing",
        lambda f: f._replace(fphase=FleetPhase.ABORTING), {"fphase": '"ABORTING"'}),
    FleetAction(
        "fleet_recover",
        "The controller restarted after a crash and every member took the restart the "
        "single-engine spec gives it (a member left in doubt restarts TAINTED), and a "
        "quorum serves: the fleet reopens on the journal's frontier and floor; any update "
        "in progress is dropped.",
        frozenset({FleetPhase.RECOVERING}), FleetPhase.READY,
        lambda f, b: not f.fdown and quorum(f, b),
        FLEET_RECOVER_WHEN_TLA,
        lambda f: f._replace(fphase=FleetPhase.READY, ftarget=0),
        {"fphase": '"READY"', "ftarget": "0"}),
    FleetAction(
        "fleet_recover_closed",
        "As fleet_recover, but fewer than min_serving members serve: the fleet stays closed "
        "(re-admission brings members back, and fleet_reopen opens it).",
        frozenset({FleetPhase.RECOVERING}), FleetPhase.ABORTING,
        lambda f, b: not f.fdown and not quorum(f, b),
        f"fdown = {{}} /\\ {N_SERVING_TLA} < MinServing",
        lambda f: f._replace(fphase=FleetPhase.ABORTING, ftarget=0),
        {"fphase": '"ABORTING"', "ftarget": "0"}),
    FleetAction(
        "fleet_raise_floor",
        "No member serves, or holds rollouts of, a generation below the frontier any more "
        "(each caught up, or is out of service): the floor moves up to the frontier.",
        frozenset({FleetPhase.READY}), FleetPhase.READY,
        lambda f, _b: f.ffloor < f.fcommitted and all(floor_free(f, s) for s in f.eng),
        FLEET_RAISE_FLOOR_WHEN_TLA,
        lambda f: f._replace(ffloor=f.fcommitted), {"ffloor": "fcommitted"}),
)


# ------------------------------------------------------------------------ migration


@dataclass(frozen=True)
class Migration:
    """In-flight migration: the rollout in slot ``i`` of a member moves to slot ``j`` of
    another, in one step. Its effect is two engine spec actions' (their guards aside:
    ``when`` decides): ``leave``'s on the member it leaves (its controller half: the engine
    goes on with its request until it notices) and ``join``'s on the member it joins;
    ``when`` reads the fleet, the member it leaves and the one it joins."""

    name: str
    doc: str
    when: Callable[[FleetView, MemberView, int, SlotsView, int, UpdatePolicy], bool]
    #: TLA+ over ``e`` (the member it leaves), slot ``i``, ``t`` (the member it joins), slot
    #: ``j``, and the fleet's variables.
    when_tla: str
    leave: str = "release"
    join: str = "admit"


MIGRATION = Migration(
    "migrate",
    "A rollout bound on a member that drains for an update moves to a member serving its "
    "own generation (an open fleet with a quorum): released on the one, admitted on the "
    "other; the drain need not wait for it.",
    lambda f, s, i, t, j, b: f.fphase in (FleetPhase.READY, FleetPhase.ROLLING)
    and quorum(f, b) and s.phase is Phase.DRAINING and s.bind[i - 1] != 0
    and serving(f, t) and t.committed == s.bind[i - 1] and t.bind[j - 1] == 0
    and t.req[j - 1] == 0,
    f'fphase \\in {{"READY", "ROLLING"}} /\\ {N_SERVING_TLA} >= MinServing\n'
    '    /\\ e.phase = "DRAINING" /\\ e.bind[i] # 0\n'
    '    /\\ Serving(t) /\\ t.committed = e.bind[i] /\\ t.bind[j] = 0 /\\ t.req[j] = 0')


# ----------------------------------------------------------------- controller crash


@dataclass(frozen=True)
class ControllerCrash:
    """The fleet controller's process dies (an environment step: nothing is journalled).
    Its recovery replays the journal and restarts every member once (each takes the one
    restart step the single-engine spec allows it: :data:`MEMBER_RESTARTS`), then takes
    ``fleet_recover`` or ``fleet_recover_closed``. The controller is down in between: no
    other member or fleet step is taken (an engine's own faults while it is down commute
    with the restarts, which read only the controller's state)."""

    name: str
    doc: str
    sources: frozenset[str]

    def apply(self, f: FleetState) -> FleetState:
        return f._replace(fphase=FleetPhase.RECOVERING, fcrashes=f.fcrashes + 1,
                          fdown=frozenset(range(1, len(f.eng) + 1)))


CRASH = ControllerCrash(
    "fleet_crash",
    "The fleet controller crashes (in any phase after the fleet opened, its recovery "
    "included): every member is left to restart.",
    frozenset({FleetPhase.READY, FleetPhase.UPDATING, FleetPhase.ABORTING, FleetPhase.ROLLING,
               FleetPhase.RECOVERING}))

#: The single-engine restart steps a member takes in a recovery (the fleet's members are
#: past their bootstrap: restart_uninitialized is the bootstrap's).
MEMBER_RESTARTS: tuple[str, ...] = tuple(
    a.name for a in ACTIONS if a.kind is Kind.RESTART
    and a.sources != frozenset({Phase.UNINITIALIZED}))


def _bound(f: FleetState) -> int:
    """Rollouts bound on the fleet's members."""
    return sum(b != 0 for s in f.eng for b in s.bind)


_BOUND_TLA = "Cardinality({x \\in Engines \\X Slots : eng[x[1]].bind[x[2]] # 0})"
_BOUND_NEXT_TLA = _BOUND_TLA.replace("eng[", "eng'[")


def _moved(f: FleetState, g: FleetState) -> list[tuple[int, int]]:
    """(generation it left with, generation it joined with) of every rollout that left one
    member and joined another in the step from ``f`` to ``g``."""
    left = [b for s, t in zip(f.eng, g.eng, strict=True)
            for b, c in zip(s.bind, t.bind, strict=True) if b != 0 and c == 0]
    joined = [c for s, t in zip(f.eng, g.eng, strict=True)
              for b, c in zip(s.bind, t.bind, strict=True) if b == 0 and c != 0]
    return [(a, c) for a in left for c in joined]


#: Fleet-wide properties of a fleet journal: the fleet trace checker checks them on every
#: journal (each name is the verdict it gives). The model states each in its own terms
#: (JOURNAL_PROPERTIES_IN_THE_MODEL), for it names a generation's weights by the
#: generation's number, a rollout by its slot and a takeover by a crash and its recovery.
JOURNAL_PROPERTIES: Mapping[str, str] = {
    "OneIdentityPerGeneration":
        "Every member that requests, publishes or is re-admitted onto generation g names "
        "g's one identity (the base's and the adapter's together when an adapter is served): "
        "two members never serve two policies under one generation number.",
    "OneRolloutOneMember":
        "A rollout id is bound on at most one member at a time; it moves to another only by "
        "migrate.",
    "TakeoverAdoptsNothing":
        "After a takeover every member's next step is its restart: no outcome of a call made "
        "under an older epoch is taken as an outcome under the new one.",
}
#: The model's invariants and action properties that state each journal property there
#: (the first named is the one its mutant breaks).
JOURNAL_PROPERTIES_IN_THE_MODEL: Mapping[str, tuple[str, ...]] = {
    "OneIdentityPerGeneration": ("ServingMembersAgree", "NoPublishAfterAmbiguity"),
    "OneRolloutOneMember": ("MigrationMovesTheRollout", "MigrationKeepsGeneration"),
    "TakeoverAdoptsNothing": ("InDoubtMembersOnlyRestart", "RecoveryLeavesNothingInDoubt"),
}

#: The fleet steps of a rolling update (their records state the floor).
ROLLING_STEPS = frozenset({"fleet_roll", "fleet_publish_wave", "fleet_end_wave",
                           "fleet_abort_wave", "fleet_raise_floor"})


def fleet_half(fa: FleetAction, f: FleetState) -> FleetState:
    """The fleet's own half of step ``fa`` (phase, frontier, target, floor) from ``f``: what
    the runtime and the trace checker take from the spec; the members' half (a publish
    commits the validated members) is each member's own step."""
    return fa.apply(f._replace(eng=()))


# ------------------------------------------------------------------------ properties


@dataclass(frozen=True)
class FleetInvariant:
    name: str
    doc: str
    tla: str
    #: Over a FleetState and FleetBounds in the model; an invariant that reads only the
    #: controller's half (``control_only``) also holds of a FleetView and UpdatePolicy,
    #: which the fleet trace checker asks it of.
    holds: Callable[[Any, Any], bool]
    control_only: bool = True


@dataclass(frozen=True)
class FleetActionProperty:
    name: str
    doc: str
    tla: str
    holds: Callable[[FleetState, FleetState, FleetBounds], bool]
    #: The fleet step it speaks of (None: every step): a property of what one step does.
    step: str | None = None


FLEET_INVARIANTS: tuple[FleetInvariant, ...] = (
    FleetInvariant(
        "ServingMembersAgree",
        "Every member READY on a generation the fleet serves holds that generation's "
        "weights: after a publish no two engines serving one generation hold different "
        "weights (an engine replaced out of band since it was last verified aside: the next "
        "audit finds it).",
        "\\A n \\in Engines : (eng[n].phase = \"READY\" /\\ eng[n].committed >= ffloor "
        "/\\ eng[n].committed <= fcommitted /\\ ~eng[n].replaced) "
        "=> eng[n].weights = eng[n].committed",
        lambda f, _b: all(s.weights == s.committed for s in f.eng
                          if s.phase is Phase.READY and f.ffloor <= s.committed <= f.fcommitted
                          and not s.replaced), control_only=False),
    FleetInvariant(
        "NoMemberAhead",
        "No member has committed a generation the fleet has not published.",
        "\\A n \\in Engines : eng[n].committed <= fcommitted",
        lambda f, _b: all(s.committed <= f.fcommitted for s in f.eng)),
    FleetInvariant(
        "RolloutsOnlyOnServingMembers",
        "A rollout is bound only on a member serving a generation the fleet serves (or "
        "draining it for an update, or whose audit failed after it was admitted).",
        "\\A n \\in Engines : \\A i \\in Slots : eng[n].bind[i] # 0 => "
        "(eng[n].bind[i] >= ffloor /\\ eng[n].bind[i] <= fcommitted "
        "/\\ eng[n].phase \\in {\"READY\", \"DRAINING\"})",
        lambda f, _b: all(b == 0 or (f.ffloor <= b <= f.fcommitted
                                     and s.phase in (Phase.READY, Phase.DRAINING))
                          for s in f.eng for b in s.bind)),
    FleetInvariant(
        "AtMostKLiveGenerations",
        "The members that serve serve at most max_live generations, and the floor is at "
        "most max_live - 1 behind the frontier.",
        "fcommitted - ffloor < MaxLive /\\ Cardinality({eng[n].committed : "
        "n \\in {m \\in Engines : Serving(eng[m])}}) <= MaxLive",
        lambda f, b: f.fcommitted - f.ffloor < b.max_live
        and len({s.committed for s in f.eng if serving(f, s)}) <= b.max_live),
)

FLEET_ACTION_PROPERTIES: tuple[FleetActionProperty, ...] = (
    FleetActionProperty(
        "FleetGenerationsMoveForward",
        "The fleet's committed generation (its frontier) never goes back and moves one step "
        "at a time; its floor never goes back.",
        "fcommitted' \\in {fcommitted, fcommitted + 1} /\\ ffloor' >= ffloor",
        lambda f, g, _b: g.fcommitted in (f.fcommitted, f.fcommitted + 1)
        and g.ffloor >= f.ffloor),
    FleetActionProperty(
        "OpenOnlyWithQuorum",
        "The fleet opens (reopens, or publishes) only with at least min_serving members "
        "serving, and admits a rollout only while they do. (A READY fleet can lose its "
        "quorum at any time, to an audit or a suspicion: it admits nothing more, and closes.)",
        "((fphase # \"READY\" /\\ fphase' = \"READY\") => "
        f"{_N_SERVING_AFTER_TLA} >= MinServing)\n"
        "    /\\ ((\\E n \\in Engines : \\E i \\in Slots : eng[n].bind[i] = 0 "
        "/\\ eng'[n].bind[i] # 0) => (fphase \\in {\"READY\", \"ROLLING\"} /\\ "
        + N_SERVING_TLA + " >= MinServing))",
        lambda f, g, b: (f.fphase == FleetPhase.READY or g.fphase != FleetPhase.READY
                         or quorum(g, b))
        and (not _admitted(f, g) or (f.fphase in (FleetPhase.READY, FleetPhase.ROLLING)
                                     and quorum(f, b)))),
    FleetActionProperty(
        "PublishOnQuorum",
        "A generation is published only onto at least min_serving members at once.",
        f"fcommitted' # fcommitted => {_N_SERVING_AFTER_TLA} >= MinServing",
        lambda f, g, b: g.fcommitted == f.fcommitted or _count(g, serving) >= b.min_serving),
    FleetActionProperty(
        "NoPublishAfterAmbiguity",
        "A member that had an ambiguous outcome is never published onto.",
        "\\A n \\in Engines : eng[n].amb => eng'[n].committed = eng[n].committed",
        lambda f, g, _b: all(not a.amb or b.committed == a.committed
                             for a, b in zip(f.eng, g.eng, strict=True))),
    FleetActionProperty(
        "CapacityKeptThroughUpdates",
        "A serving member leaves service for an update only while at least min_admitting "
        "members go on serving.",
        "(\\E n \\in Engines : Serving(eng[n]) /\\ eng'[n].phase = \"DRAINING\") => "
        + _N_SERVING_AFTER_TLA + " >= MinAdmitting",
        lambda f, g, b: not any(serving(f, s) and t.phase is Phase.DRAINING
                                for s, t in zip(f.eng, g.eng, strict=True))
        or _count(g, serving) >= b.min_admitting),
    FleetActionProperty(
        "RecoveryLeavesNothingInDoubt",
        "A recovery (after the controller crashed) ends only with every member READY or "
        "TAINTED with nothing in flight: no call the crashed controller made, and no update "
        "cycle it left half done, survives into the recovered fleet.",
        f'(fphase = "{FleetPhase.RECOVERING}" /\\ fphase\' # "{FleetPhase.RECOVERING}") => '
        '\\A n \\in Engines : eng\'[n].pending = "none" '
        '/\\ eng\'[n].phase \\in {"READY", "TAINTED"}',
        lambda f, g, _b: f.fphase != FleetPhase.RECOVERING or g.fphase == FleetPhase.RECOVERING
        or all(t.pending == "none" and t.phase in (Phase.READY, Phase.TAINTED) for t in g.eng)),
    FleetActionProperty(
        "MigrationKeepsGeneration",
        "A rollout that leaves one member and joins another in one step (a migration) "
        "keeps the generation it was admitted under: one rollout, one policy.",
        "\\A n, m \\in Engines : \\A i, j \\in Slots :\n"
        "        (eng[n].bind[i] # 0 /\\ eng'[n].bind[i] = 0 /\\ eng[m].bind[j] = 0 "
        "/\\ eng'[m].bind[j] # 0)\n"
        "        => eng'[m].bind[j] = eng[n].bind[i]",
        lambda f, g, _b: all(a == c for a, c in _moved(f, g))),
    FleetActionProperty(
        "RolloutsJoinOnlyServingMembers",
        "A rollout is bound (admitted, or migrated) only on a member serving a generation "
        "the fleet serves: never on one that prepares an update.",
        "\\A n \\in Engines : \\A i \\in Slots : (eng[n].bind[i] = 0 /\\ eng'[n].bind[i] # 0) "
        "=> Serving(eng[n])",
        lambda f, g, _b: all(serving(f, s) for s, t in zip(f.eng, g.eng, strict=True)
                             if any(b == 0 and c != 0
                                    for b, c in zip(s.bind, t.bind, strict=True)))),
    FleetActionProperty(
        "MigrationMovesTheRollout",
        "A migration releases the rollout where it was as it binds it where it goes: the "
        "fleet holds as many rollouts after it as before, and no rollout is bound on two "
        "members at once (in the journal: OneRolloutOneMember).",
        f"{_BOUND_NEXT_TLA} = {_BOUND_TLA}",
        lambda f, g, _b: _bound(f) == _bound(g), step=MIGRATION.name),
    FleetActionProperty(
        "InDoubtMembersOnlyRestart",
        "After a controller crash (a takeover), a member the recovery has yet to restart "
        "moves only by its restart, which leaves it READY or TAINTED with nothing in flight: "
        "no outcome of a call the crashed controller made is taken as the new one's (in the "
        "journal: TakeoverAdoptsNothing).",
        "\\A n \\in Engines : (n \\in fdown /\\ eng'[n] # eng[n])\n"
        "        => (n \\notin fdown' /\\ eng'[n].pending = \"none\" "
        "/\\ eng'[n].phase \\in {\"READY\", \"TAINTED\"})",
        lambda f, g, _b: all(n not in f.fdown or s == t
                             or (n not in g.fdown and t.pending == "none"
                                 and t.phase in (Phase.READY, Phase.TAINTED))
                             for n, (s, t) in enumerate(zip(f.eng, g.eng, strict=True), 1))),
)


# ------------------------------------------------------------------------- liveness


@dataclass(frozen=True)
class FleetLiveness:
    """``when ~> then`` over the fleet, in every behaviour that meets its fairness; a
    member property (``member``) holds for every member ``n`` (counted from 0 here, from
    1 in TLA+, where it reads ``\\A n \\in Engines : when ~> then``)."""

    name: str
    doc: str
    #: Over a state, a member (a member property's; else 0) and the bounds.
    when: Callable[[FleetState, int, FleetBounds], bool]
    then: Callable[[FleetState, int, FleetBounds], bool]
    when_tla: str
    then_tla: str
    member: bool = False


#: The trainer's requests: not fair (a trainer may stop asking); everything else the
#: fleet's controller decides of its own accord, each decision within its deadline.
TRAINER_REQUESTS = frozenset({"fleet_request_update", "fleet_roll"})
#: What each member does of its own accord, on top of the engine spec's fair steps (its
#: controller's steps, its operations' returns, the engine finishing a request): the steps
#: the fleet's controller takes for it, asking it to update (its own update, a rolling
#: wave, a catch-up: in the engine spec the trainer's request, not fair) and restarting
#: it in a recovery. Not fair: the clients' admit and release, the operator's audits,
#: suspicion and re-admission, faults (the fleet's budget bounds them), migration and the
#: controller's crash (at most ``crashes``).
FLEET_MEMBER_STEPS = frozenset({"request_update", *MEMBER_RESTARTS})
#: The fairness is coarse, two classes per member (FleetSpec.member_fairness) and one for
#: the fleet's decisions, and weak. Coarse: a weaker assumption than one class per step
#: (whatever holds under it holds under those), and TLC's liveness check grows fast with
#: fairness conjuncts (45 were too many for it). Weak: a step that stays enabled is taken.
#: Strong fairness was needed (and assumed) while the model could ask a member again
#: after it cancelled and take cancels and audits for ever: each round disabled the
#: fleet's decision for a moment. An update asks each member once now, as the runtime
#: does (FleetSpec.asks_once), and liveness speaks of finitely many audits and cancels
#: (FleetSpec.finite), so nothing disables a decision for ever and weak fairness does.
FLEET_FAIRNESS: tuple[Fairness, ...] = (
    Fairness("FleetDecides",
             "The fleet's controller takes one of its decisions (all but the trainer's "
             "requests) when one stays enabled.",
             frozenset(fa.name for fa in FLEET_ACTIONS if fa.name not in TRAINER_REQUESTS)),
)
#: The operator's steps: audits, suspicion and re-admission. A liveness property speaks of
#: the behaviours that take them finitely often (a property reads
#: ``([]<><<FiniteStep>>_vars) \\/ (P ~> Q)``), the honest assumption for each: audits
#: that overlap for ever (one in flight on some member at every moment) would hold a
#: wave's decision for ever, and the runtime's audits are periodic, not back to back.
OPERATOR_STEPS = frozenset({"audit_begin", "suspect", "readmit_begin"})
#: A member leaving an update it was asked for: cancelled while draining, or abandoned
#: after a refusal. The model lets its controller take them at any moment (a superset of
#: the runtime's, for safety); the runtime cancels only past the drain deadline with
#: rollouts still bound or after a failed pause (a fault), and abandons only after the
#: engine refused the weights with proof that nothing moved. Liveness speaks of
#: behaviours with finitely many: an update asks each member once (FleetSpec.asks_once),
#: so an update sees finitely many anyway; a catch-up asked again and again and cancelled
#: each time by a rollout held for ever leaves the floor to that rollout (FloorRises
#: allows for it); what is left out is a member that refuses every update for ever
#: (no headroom, say), which keeps the floor down: it is not healthy.
LEAVE_STEPS = frozenset({"cancel_update", "abandon_update"})
#: The fleet's watchdog re-admits a quarantined member once its fence is confirmed (the
#: operator may re-admit any member at any time; that is not fair). Fenced only: an
#: unfenced member is fenced first (MemberTaintedIsFenced), or a re-admission would hide
#: a fence that never comes. A re-admission whose reload fails leaves the member TAINTED,
#: to be fenced and re-admitted again; liveness speaks of finitely many re-admissions
#: (``readmit_begin`` is an operator step), so a member whose every reload fails is not
#: healthy and may stay out.
WATCHDOG_READMITS = Fairness(
    "WatchdogReadmits",
    "The fleet's watchdog re-admits a quarantined member whose fence is confirmed. "
    "Strong: the trainer's updates and waves shut re-admission out, so it is possible "
    "again and again rather than all along; the runtime lets a due re-admission go "
    "before the next update.",
    frozenset({"readmit_begin"}), strong=True,
    when=lambda s: FENCED in s.evidence, when_tla=f'"{FENCED}" \\in evidence')
_OLD_ROLLOUT_LIVE_TLA = ("(\\E n \\in Engines, i \\in Slots : "
                         "eng[n].bind[i] # 0 /\\ eng[n].bind[i] < fcommitted)")


def _old_rollout_live(f: FleetState) -> bool:
    """A rollout bound under a generation below the frontier is live on some member."""
    return any(0 < g < f.fcommitted for s in f.eng for g in s.bind)


FLEET_LIVENESS: tuple[FleetLiveness, ...] = (
    FleetLiveness(
        "FleetOpens",
        "The fleet opens on its first generation: its members start verified on it.",
        lambda f, _n, _b: f.fphase == FleetPhase.UNINITIALIZED,
        lambda f, _n, _b: f.fphase != FleetPhase.UNINITIALIZED,
        f'fphase = "{FleetPhase.UNINITIALIZED}"', f'fphase # "{FleetPhase.UNINITIALIZED}"'),
    FleetLiveness(
        "FleetUpdateEnds",
        "Every fleet update the trainer asks for ends (published, ended, or aborted; or "
        "dropped by a controller crash, whose recovery ends: RecoveryEnds), whatever the "
        "clients do with their rollouts and whichever members fail, die or are suspected: "
        "a fleet never waits for ever on one member.",
        lambda f, _n, _b: f.fphase in ASKING_PHASES,
        lambda f, _n, _b: f.fphase not in ASKING_PHASES,
        _asking_tla(), f"~({_asking_tla()})"),
    FleetLiveness(
        "RecoveryEnds",
        "A controller restarted after a crash reopens the fleet, or keeps it closed by a "
        "recorded decision (fleet_recover_closed): it does not wait for ever.",
        lambda f, _n, _b: f.fphase == FleetPhase.RECOVERING,
        lambda f, _n, _b: f.fphase != FleetPhase.RECOVERING,
        f'fphase = "{FleetPhase.RECOVERING}"', f'fphase # "{FleetPhase.RECOVERING}"'),
    FleetLiveness(
        "MemberTaintedIsFenced",
        "A TAINTED member is fenced (its fence confirmed) unless it leaves TAINTED first, "
        "during the fleet's update as outside it.",
        lambda f, n, _b: f.eng[n].phase is Phase.TAINTED and FENCED not in f.eng[n].evidence,
        lambda f, n, _b: f.eng[n].phase is not Phase.TAINTED or FENCED in f.eng[n].evidence,
        f'eng[n].phase = "TAINTED" /\\ "{FENCED}" \\notin eng[n].evidence',
        f'eng[n].phase # "TAINTED" \\/ "{FENCED}" \\in eng[n].evidence', member=True),
    FleetLiveness(
        "QuarantineEnds",
        "A fenced quarantined member comes back: the fleet's watchdog re-admits it, "
        "verified (a member whose every re-admission fails is not healthy: liveness "
        "speaks of finitely many re-admissions). With MemberTaintedIsFenced: every "
        "quarantined member leaves TAINTED.",
        lambda f, n, _b: f.eng[n].phase is Phase.TAINTED and FENCED in f.eng[n].evidence,
        lambda f, n, _b: f.eng[n].phase is not Phase.TAINTED,
        f'eng[n].phase = "TAINTED" /\\ "{FENCED}" \\in eng[n].evidence',
        'eng[n].phase # "TAINTED"', member=True),
    FleetLiveness(
        "FloorRises",
        "In a rolling fleet the floor rises to the frontier, whichever members fail, "
        "unless it waits for something only a client or the operator gives: a live "
        "rollout of a generation below the frontier (clients are not fair: one held for "
        "ever holds the floor; the drain's deadline, not the floor, bounds an update), "
        "capacity (no member may leave service to catch up: min_admitting or fewer "
        "serve, the others quarantined until re-admitted) or a closed fleet (ABORTING, "
        "until audited). So K live generations never leave a fleet stuck on its oldest.",
        lambda f, _n, _b: f.ffloor < f.fcommitted,
        lambda f, _n, b: f.ffloor == f.fcommitted or _old_rollout_live(f)
        or _count(f, serving) <= b.min_admitting or f.fphase == FleetPhase.ABORTING,
        "ffloor < fcommitted",
        f"ffloor = fcommitted \\/ {_OLD_ROLLOUT_LIVE_TLA} "
        f"\\/ {N_SERVING_TLA} <= MinAdmitting \\/ fphase = \"{FleetPhase.ABORTING}\""),
)


# ---------------------------------------------------------------------------- the spec


#: A member action as the fleet explorer runs it: the action, its fleet guard, and
#: whether it spends the fault budget.
_MemberAction = tuple[Action, Callable[..., bool], bool]


@dataclass(frozen=True)
class FleetSpec:
    name: str = "RolloutCoreFleet"
    engine: Spec = SPEC
    lifted: tuple[str, ...] = LIFTED
    member_guards: Mapping[str, MemberGuard] = field(default_factory=lambda: MEMBER_GUARDS)
    actions: tuple[FleetAction, ...] = FLEET_ACTIONS
    invariants: tuple[FleetInvariant, ...] = FLEET_INVARIANTS
    action_properties: tuple[FleetActionProperty, ...] = FLEET_ACTION_PROPERTIES
    migration: Migration = MIGRATION
    crash: ControllerCrash = CRASH
    restarts: tuple[str, ...] = MEMBER_RESTARTS
    #: Member steps a recovery lets a member it has yet to restart take: none, it only
    #: restarts it (InDoubtMembersOnlyRestart; a mutant adopts a call's outcome).
    adopted: frozenset[str] = frozenset()
    #: Fleet-wide fairness (one class each) and fairness of every member (one class per
    #: member each, after the engine spec's own: ``member_fairness``).
    fairness: tuple[Fairness, ...] = FLEET_FAIRNESS
    member_steps: frozenset[str] = FLEET_MEMBER_STEPS
    #: Whether an update asks each member once (``fasked``), as the runtime does: its
    #: decision then waits for one answer per member. Off (a negative control), a member
    #: that cancelled or abandoned may be asked again and again, and members that take
    #: turns leaving the update keep its decision disabled for ever.
    asks_once: bool = True
    #: What a member's controller does in some states only (one class per member each).
    watchdog: tuple[Fairness, ...] = (WATCHDOG_READMITS,)
    liveness: tuple[FleetLiveness, ...] = FLEET_LIVENESS
    #: Member steps a liveness property assumes finitely many (``FiniteStep``).
    finite: frozenset[str] = OPERATOR_STEPS | LEAVE_STEPS
    bounds: FleetBounds = FleetBounds()

    def with_bounds(self, bounds: FleetBounds) -> FleetSpec:
        return replace(self, bounds=bounds)

    @cached_property
    def member_fairness(self) -> tuple[Fairness, ...]:
        """Every member's fairness, two (weak) classes. Its controller takes one of its
        steps, or its call in flight returns (the engine spec's fair steps a member takes
        in the fleet, and the fleet's own steps for it: ``member_steps``): one class, for
        while a call is in flight none of its controller's steps is enabled, so neither
        starves the other. And its engine finishes a request it runs (a drain that waits
        for one ends; with the fault budget spent, its deadline cannot): a class of its
        own, or requests that keep finishing would starve an audit's return."""
        env = frozenset(a.name for a in self.engine.actions if a.kind is Kind.ENVIRONMENT)
        lifted = frozenset(self.lifted)
        fair = frozenset().union(*(f.actions for f in self.engine.fairness)) & lifted
        return (
            Fairness("MemberMoves",
                     "A member's controller takes one of its steps, or its call in flight "
                     "returns, when one stays enabled.",
                     (fair - env) | self.member_steps),
            Fairness("EngineFinishes", "A member's engine finishes a request it runs.",
                     fair & env),
            *self.watchdog,
        )

    @cached_property
    def member_spec(self) -> Spec:
        """The single-engine spec as a member runs it: its slots, generations, and no fault
        bound of its own (the fleet's budget applies)."""
        b = self.bounds
        return self.engine.with_bounds(Bounds(rollouts=b.rollouts, generations=b.generations,
                                              faults=UNBOUNDED))

    def scheduled(self, f: FleetState, n: int, a: Action) -> bool:
        """The update schedule: during the fleet's update, member ``n`` takes the steps of
        its own cycle only once every member before it has settled.

        The fleet runner moves members in parallel; the model serialises them, and loses
        nothing the fleet can observe by it: a member's steps read and write that
        member's state only (and the fault budget, which every order spends alike), so
        they commute with every other member's steps, and the fleet's own steps wait
        until every member has settled, when the order no longer shows. The invariants
        are conjunctions over members, or speak of settled members only."""
        if f.fphase != FleetPhase.UPDATING or a.name not in SCHEDULED:
            return True
        return all(settled(f, s) for s in f.eng[:n])

    @cached_property  # read once per explored state
    def _member_actions(self) -> tuple[Action, ...]:
        return tuple(self.engine.action(n) for n in self.lifted)

    def member_actions(self) -> tuple[Action, ...]:
        return self._member_actions

    def _enabled_by_phase(self, phases: frozenset[Phase]) -> list[_MemberAction]:
        """The member actions some member in ``phases`` may take, in table order, each
        with its fleet guard and whether it spends the fault budget (one lookup per
        explored state instead of one per action and member)."""
        cache = self._phase_index
        hit = cache.get(phases)
        if hit is None:
            hit = cache[phases] = [
                (a, self.member_guards.get(a.name, _TRUE)[0], a.fault or a.name in FAULT_IN_FLEET)
                for a in self._member_actions if a.sources & phases]
        return hit

    @cached_property
    def _phase_index(self) -> dict[frozenset[Phase], list[_MemberAction]]:
        return {}

    def initial_states(self) -> tuple[FleetState, ...]:
        b = self.bounds
        s0 = self.engine.with_bounds(Bounds(b.rollouts, b.generations, 0)).initial_states()[0]
        member = s0._replace(phase=Phase.READY, committed=FIRST_GENERATION,
                             evidence=ALL_EVIDENCE)
        return (FleetState(FleetPhase.UNINITIALIZED, FIRST_GENERATION, 0,
                           (member,) * b.engines, 0, FIRST_GENERATION),)

    def successors(self, f: FleetState, memo: dict[tuple[str, State, Param], list[State]]
                   | None = None) -> list[tuple[str, Param, FleetState]]:
        """Every (action name, parameter, next state); a member action's parameter is
        ``(member index, its own parameter)``. ``memo`` caches single-engine steps (member
        states repeat across fleet states)."""
        out: list[tuple[str, Param, FleetState]] = []
        ms, b = self.member_spec, self.bounds
        memo = {} if memo is None else memo
        opened = f.fphase != FleetPhase.UNINITIALIZED
        if f.fphase == FleetPhase.RECOVERING:
            out += self.recovery_steps(f, memo)
        up = opened and f.fphase != FleetPhase.RECOVERING  # the controller takes steps
        for a, guard, fault in (self._enabled_by_phase(frozenset(s.phase for s in f.eng))
                                if up or (self.adopted and opened) else ()):
            for n, s in enumerate(f.eng):
                if s.phase not in a.sources or not guard(f, s, b):
                    continue
                if not up and (a.name not in self.adopted or n + 1 not in f.fdown):
                    continue
                if fault and f.faults >= b.faults:
                    continue
                if not self.scheduled(f, n, a):
                    continue
                asks = self.asks_once and a.name == ASK and f.fphase in ASKING_PHASES
                if asks and n + 1 in f.fasked:
                    continue
                g = f._replace(fasked=f.fasked | {n + 1}) if asks else f
                for p in ms.params(a):
                    if a.name == "reset_begin" and p != next_tier(s):
                        continue
                    key = (a.name, s, p)
                    nxt = memo.get(key)
                    if nxt is None:
                        nxt = memo[key] = ms.step(a, s, p)
                    for t in nxt:
                        eng = (*f.eng[:n], t._replace(faults=0), *f.eng[n + 1:])
                        out.append((a.name, (n + 1, p),
                                    g._replace(eng=eng, faults=f.faults + int(fault))))
        for fa in self.actions:
            if f.fphase not in fa.sources or not fa.when(f, b):
                continue
            if fa.needs_generation and f.fcommitted >= b.generations:
                continue
            out.append((fa.name, None, _asked_kept(fa.apply(f))))
        if f.fphase in self.crash.sources and f.fcrashes < b.crashes:
            out.append((self.crash.name, None, _asked_kept(self.crash.apply(f))))
        if up:
            out += self.migrations(f)
        return out

    def recovery_steps(self, f: FleetState, memo: dict[tuple[str, State, Param], list[State]]
                       ) -> list[tuple[str, Param, FleetState]]:
        """Every member restart a recovery may take next: each member not yet restarted
        takes the restart the single-engine spec allows it (with whatever its call in
        flight may have done to its engine), in any order; no fault budget is spent (the
        crash was the fault)."""
        out: list[tuple[str, Param, FleetState]] = []
        ms = self.member_spec
        for n, s in enumerate(f.eng):
            if not may_restart(f, n + 1):
                continue
            for name in self.restarts:
                a = self.engine.action(name)
                key = (name, s, None)
                nxt = memo.get(key)
                if nxt is None:
                    nxt = memo[key] = ms.step(a, s, None)
                for t in nxt:
                    eng = (*f.eng[:n], t._replace(faults=0), *f.eng[n + 1:])
                    out.append((name, (n + 1, None),
                                f._replace(eng=eng, fdown=f.fdown - {n + 1})))
        return out

    def migrations(self, f: FleetState) -> list[tuple[str, Param, FleetState]]:
        """Every migration: its parameter is (member it leaves, slot, member it joins,
        slot), members and slots counted from 1."""
        out: list[tuple[str, Param, FleetState]] = []
        mig, b = self.migration, self.bounds
        leave_a, join_a = self.engine.action(mig.leave), self.engine.action(mig.join)
        for n, s in enumerate(f.eng):
            for i in range(1, len(s.bind) + 1):
                if s.bind[i - 1] == 0:
                    continue
                for m, t in enumerate(f.eng):
                    for j in range(1, len(t.bind) + 1):
                        if m == n or not mig.when(f, s, i, t, j, b):
                            continue
                        # updates are checked by TLC parity, as in Spec.step
                        leave: Callable[..., State] = s._replace
                        join: Callable[..., State] = t._replace
                        left = leave(**leave_a.control(s, i))
                        joined = join(**{**join_a.world(t, j)[0], **join_a.control(t, j)})
                        eng = list(f.eng)
                        eng[n], eng[m] = left, joined
                        out.append((mig.name, (n + 1, i, m + 1, j), f._replace(eng=tuple(eng))))
        return out


FLEET = FleetSpec()


# ------------------------------------------------------------------------- explorer


@dataclass
class FleetExploration:
    states: int
    edges: int
    violations: dict[str, list[tuple[str, Param]]]
    unreachable: tuple[str, ...]
    graph: set[tuple[FleetState, str, FleetState]]
    nodes: set[FleetState]
    initial: tuple[FleetState, ...]
    seconds: float
    #: Every edge with its parameter (a member action's names its member), kept when asked
    #: for: the liveness check tells members apart.
    steps: list[tuple[FleetState, str, Param, FleetState]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def explore_fleet(spec: FleetSpec = FLEET, *, max_states: int = 3_000_000,
                  stop_at_violation: bool = False, keep_steps: bool = False
                  ) -> FleetExploration:
    """Breadth first over every reachable fleet state: fleet and member invariants in
    every state, fleet and member action properties on every edge; the first violation of
    each property is a shortest counterexample (its action path). ``stop_at_violation``
    ends at the first one (a mutant check needs no more); ``keep_steps`` keeps every edge
    with its parameter (for the liveness check)."""
    import time
    from collections import deque

    t0 = time.perf_counter()
    init = spec.initial_states()
    parent: dict[FleetState, tuple[FleetState, str, Param] | None] = dict.fromkeys(init)
    queue: deque[FleetState] = deque(init)
    edges: set[tuple[FleetState, str, FleetState]] = set()
    steps: list[tuple[FleetState, str, Param, FleetState]] = []
    violations: dict[str, list[tuple[str, Param]]] = {}
    fired: set[str] = set()
    b = spec.bounds
    member = spec.engine

    def path(f: FleetState) -> list[tuple[str, Param]]:
        out: list[tuple[str, Param]] = []
        cur: FleetState | None = f
        while cur is not None and parent[cur] is not None:
            prev, name, p = parent[cur]  # type: ignore[misc]
            out.append((name, p))
            cur = prev
        return out[::-1]

    def check(f: FleetState) -> None:
        for inv in spec.invariants:
            if inv.name not in violations and not inv.holds(f, b):
                violations[inv.name] = path(f)
        for s in f.eng:
            for mi in member.invariants:
                if mi.name not in violations and not mi.holds(s):
                    violations[mi.name] = path(f)

    for f0 in init:
        check(f0)
    memo: dict[tuple[str, State, Param], list[State]] = {}
    while queue and not (stop_at_violation and violations):
        f = queue.popleft()
        succ = spec.successors(f, memo)
        if not succ and "Deadlock" not in violations:
            # No step at all, the fleet's own decisions included: a fleet that can never
            # decide (every fleet state has a successor; none is an intended end).
            violations["Deadlock"] = path(f)
        for name, p, g in succ:
            fired.add(name)
            edges.add((f, name, g))
            if keep_steps:
                steps.append((f, name, p, g))
            for prop in spec.action_properties:
                if prop.step not in (None, name):
                    continue
                if prop.name not in violations and not prop.holds(f, g, b):
                    violations[prop.name] = [*path(f), (name, p)]
            for s, t in zip(f.eng, g.eng, strict=True):
                if s is t:  # an unchanged member is the same object
                    continue
                for mp in member.action_properties:
                    if mp.name not in violations and not mp.holds(s, t):
                        violations[mp.name] = [*path(f), (name, p)]
            if g not in parent:
                parent[g] = (f, name, p)
                check(g)
                queue.append(g)
                if len(parent) > max_states:
                    raise RuntimeError(f"more than {max_states} fleet states")
    names = [*spec.lifted, *(a.name for a in spec.actions), spec.migration.name]
    if b.crashes:
        names += [spec.crash.name, *spec.restarts]
    else:  # nothing recovers without a crash
        names = [n for n in names if not n.startswith("fleet_recover")]
    return FleetExploration(len(parent), len(edges), violations,
                            tuple(n for n in names if n not in fired), edges, set(parent),
                            init, time.perf_counter() - t0, steps)


__all__ = [
    "CRASH",
    "FIRST_GENERATION",
    "FLEET",
    "JOURNAL_PROPERTIES",
    "JOURNAL_PROPERTIES_IN_THE_MODEL",
    "MEMBER_RESTARTS",
    "MIGRATION",
    "ROLLING_STEPS",
    "ControllerCrash",
    "FleetAction",
    "FleetBounds",
    "FleetExploration",
    "FleetLiveness",
    "FleetSnapshot",
    "FleetSpec",
    "FleetState",
    "FleetView",
    "MemberSnapshot",
    "MemberView",
    "Migration",
    "Policy",
    "SlotsView",
    "UpdatePolicy",
    "admission_floor",
    "bootstrapped",
    "explore_fleet",
    "fleet_half",
    "floor_free",
    "held_back",
    "may_restart",
    "quorum",
    "serving",
    "settled",
    "update_policy_error",
    "validated",
    "wave_settled",
]




# ------------------------------------------------------------------------------- TLA+

_TLA_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def lift_tla(expr: str, var: str = "e", primed: str = "e2") -> str:
    """A single-engine TLA+ expression about one member: every spec variable ``x``
    becomes ``e.x`` and every ``x'`` becomes ``e2.x`` (string literals untouched)."""
    names = "|".join(VARIABLES)
    pat = re.compile(rf"(?<![\w.])({names})(')?(?![\w])")

    def sub(text: str) -> str:
        return pat.sub(lambda m: f"{primed if m.group(2) else var}.{m.group(1)}", text)

    out, last = [], 0
    for m in _TLA_STRING.finditer(expr):
        out.append(sub(expr[last:m.start()]))
        out.append(m.group())
        last = m.end()
    out.append(sub(expr[last:]))
    return "".join(out)


def _member_operator(spec: FleetSpec, a: Action) -> str:
    """One member action as a TLA+ operator over member ``n`` (and its own parameter)."""
    head = f"M{tla_name(a.name)}(n" + (f", {param_var(a.param)})" if a.param else ")")
    sources = "{" + ", ".join(f'"{p.value}"' for p in Phase if p in a.sources) + "}"
    guard = spec.member_guards.get(a.name, _TRUE)[1]
    fault = a.fault or a.name in FAULT_IN_FLEET
    up = f'fphase \\notin {{"{FleetPhase.UNINITIALIZED}", "{FleetPhase.RECOVERING}"}}'
    if a.name in spec.adopted:
        up = f'({up} \\/ (fphase = "{FleetPhase.RECOVERING}" /\\ n \\in fdown))'
    lines = [f"\\* {a.name} [member, {a.kind}]", f"{head} ==", "    LET e == eng[n] IN",
             f"    /\\ {up}", f"    /\\ e.phase \\in {sources}"]
    for g in (a.when_tla, a.truth_tla, guard):
        if g.strip() != "TRUE":
            lines.append(f"    /\\ {lift_tla(g)}")
    if a.name == "reset_begin":
        lines.append("    /\\ TierFirst(e, t)")
    if a.name in SCHEDULED:
        lines.append("    /\\ Scheduled(n)")
    asks = spec.asks_once and a.name == ASK
    if asks:
        lines.append(f"    /\\ ({_asking_tla()} => n \\notin fasked)")
    if fault:
        lines.append("    /\\ faults < MaxFaults")
    if a.needs_generation:
        lines.append("    /\\ e.committed < MaxGen")
    updates: list[str] = []
    if a.dest is not None:
        updates.append(f'!.phase = "{a.dest.value}"')
    updates += [f"!.{v} = {lift_tla(x)}" for v, x in a.control_tla.items()]
    chosen: list[str] = []
    for k, (v, x) in enumerate(a.world_tla.items()):
        if x.startswith("\\in "):
            chosen.append(f"\\E w{k} {lift_tla(x)} :")
            updates.append(f"!.{v} = w{k}")
        else:
            updates.append(f"!.{v} = {lift_tla(x)}")
    rec = f"[e EXCEPT {', '.join(updates)}]" if updates else "e"
    lines.append(f"    /\\ {' '.join(chosen)} eng' = [eng EXCEPT ![n] = {rec}]".replace(
        "/\\  eng'", "/\\ eng'"))
    lines.append("    /\\ faults' = faults + 1" if fault else "    /\\ faults' = faults")
    if asks:
        lines.append(f"    /\\ fasked' = IF {_asking_tla()} THEN fasked \\cup {{n}} ELSE fasked")
    lines.append("    /\\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes"
                 + (">>" if asks else ", fasked>>"))
    return "\n".join(lines)


def _in_flight_worlds(spec: FleetSpec) -> str:
    """``InFlightWorlds(e)``: member ``e`` with whatever its call in flight may have done to
    its engine when the controller crashed (itself, or the world effect of an outcome the
    engine can produce: :meth:`Spec.in_flight_worlds`), as a set of records."""
    sets = ["{e}"]
    for o in spec.engine.actions:
        if o.kind is not Kind.OUTCOME:
            continue
        srcs = "{" + ", ".join(f'"{p.value}"' for p in Phase if p in o.sources) + "}"
        guard = " /\\ ".join(["e.pending # \"none\"", f"e.phase \\in {srcs}"] + [
            f"({lift_tla(g)})" for g in (o.when_tla, o.truth_tla) if g.strip() != "TRUE"])
        chosen, updates = [], []
        for k, (v, x) in enumerate(o.world_tla.items()):
            if x.startswith("\\in "):
                chosen.append(f"w{k} \\in {lift_tla(x[4:])}")
                updates.append(f"!.{v} = w{k}")
            else:
                updates.append(f"!.{v} = {lift_tla(x)}")
        rec = f"[e EXCEPT {', '.join(updates)}]" if updates else "e"
        worlds = f"{{{rec} : {', '.join(chosen)}}}" if chosen else f"{{{rec}}}"
        one = f"IF {guard} THEN {worlds} ELSE {{}}"
        if o.param is not None:
            v = param_var(o.param)
            one = f"UNION {{({one}) : {v} \\in {param_domain(o.param)}}}"
        sets.append(f"({one})")
    return "InFlightWorlds(e) ==\n    " + "\n    \\cup ".join(sets)


def _restart_operator(spec: FleetSpec, a: Action) -> str:
    """A member's restart in a recovery, over member ``n``."""
    sources = "{" + ", ".join(f'"{p.value}"' for p in Phase if p in a.sources) + "}"
    updates = ([f'!.phase = "{a.dest.value}"'] if a.dest is not None else []) + [
        f"!.{v} = {lift_tla(x)}" for v, x in a.control_tla.items()]
    lines = [f"\\* {a.name} [member, {a.kind}, in a recovery]", f"M{tla_name(a.name)}(n) ==",
             "    LET e == eng[n] IN", f'    /\\ fphase = "{FleetPhase.RECOVERING}"',
             "    /\\ n \\in fdown", f"    /\\ e.phase \\in {sources}"]
    for g in (a.when_tla, a.truth_tla):
        if g.strip() != "TRUE":
            lines.append(f"    /\\ {lift_tla(g)}")
    world = "InFlightWorlds(e)" if a.in_flight else "{e}"
    lines += [f"    /\\ \\E w \\in {world} : eng' = [eng EXCEPT ![n] = "
              f"[w EXCEPT {', '.join(updates)}]]",
              "    /\\ fdown' = fdown \\ {n}",
              "    /\\ UNCHANGED <<fphase, fcommitted, ftarget, faults, ffloor, fcrashes, fasked>>"]
    return "\n".join(lines)


def _crash_operator(spec: FleetSpec) -> str:
    c = spec.crash
    sources = "{" + ", ".join(f'"{p}"' for p in sorted(c.sources)) + "}"
    return "\n".join([
        f"\\* {c.name} [fleet, environment]: {c.doc}", f"{tla_name(c.name)} ==",
        f"    /\\ fphase \\in {sources}", "    /\\ fcrashes < MaxCrashes",
        f'    /\\ fphase\' = "{FleetPhase.RECOVERING}"', "    /\\ fdown' = Engines",
        "    /\\ fcrashes' = fcrashes + 1", "    /\\ fasked' = {}",
        "    /\\ UNCHANGED <<fcommitted, ftarget, eng, faults, ffloor>>"])


def _effect_operator(name: str, a: Action, *, world: bool) -> str:
    """``name(e, i)``: member ``e`` after action ``a``'s effect on slot ``i`` (its control
    updates, and its world updates if ``world``: the migration's halves)."""
    updates = dict(a.control_tla)
    if world:
        assert not any(x.startswith("\\in ") for x in a.world_tla.values()), a.name
        updates = {**a.world_tla, **updates}
    body = ", ".join(f"!.{v} = {lift_tla(x)}" for v, x in updates.items())
    return f"{name}(e, i) == [e EXCEPT {body}]" if body else f"{name}(e, i) == e"


def _migration_operator(spec: FleetSpec) -> str:
    mig = spec.migration
    return "\n".join([
        f"\\* {mig.name} [fleet, two members]: {mig.doc}",
        _effect_operator("MigrateLeave", spec.engine.action(mig.leave), world=False),
        _effect_operator("MigrateJoin", spec.engine.action(mig.join), world=True),
        f"{tla_name(mig.name)}(src, i, dst, j) ==",
        "    LET e == eng[src]",
        "        t == eng[dst] IN",
        "    /\\ src # dst",
        f"    /\\ {mig.when_tla}",
        "    /\\ eng' = [eng EXCEPT ![src] = MigrateLeave(e, i), ![dst] = MigrateJoin(t, j)]",
        "    /\\ UNCHANGED <<fphase, fcommitted, ftarget, faults, ffloor, fdown, fcrashes, "
        "fasked>>"])


def _fleet_operator(fa: FleetAction) -> str:
    sources = "{" + ", ".join(f'"{p}"' for p in sorted(fa.sources)) + "}"
    lines = [f"\\* {fa.name} [fleet]: {fa.doc}", f"{tla_name(fa.name)} ==",
             f"    /\\ fphase \\in {sources}"]
    if fa.when_tla != "TRUE":
        lines.append(f"    /\\ {fa.when_tla}")
    if fa.needs_generation:
        lines.append("    /\\ fcommitted < MaxGen")
    for v, x in fa.apply_tla.items():
        lines.append(f"    /\\ {v}' = {x}")
    if "fphase" not in fa.apply_tla:
        lines.append(f'    /\\ fphase\' = "{fa.dest}"')
    next_asking = _asking_tla("fphase'")
    lines.append(f"    /\\ fasked' = IF {next_asking} THEN fasked ELSE {{}}")
    rest = [v for v in FLEET_VARIABLES if v not in fa.apply_tla and v not in ("fphase", "fasked")]
    lines.append(f"    /\\ UNCHANGED <<{', '.join(rest)}>>")
    return "\n".join(lines)


FLEET_VARIABLES = ("fphase", "fcommitted", "ftarget", "eng", "faults", "ffloor", "fdown",
                   "fcrashes", "fasked")
#: The member step by which an update asks a member (FleetSpec.asks_once).
ASK = "request_update"
#: Member actions the update schedule orders (FleetSpec.scheduled).
SCHEDULED = frozenset(
    a.name for a in ACTIONS
    if a.op in CYCLE_OPS or a.name in ("request_update", "invalidated", "give_up",
                                       "cancel_update", "abandon_update", "reopen"))


def fleet_module(spec: FleetSpec = FLEET) -> str:
    """The fleet's TLA+ module: member actions lifted from the single-engine table."""
    init_member = ", ".join([
        'phase |-> "READY"', "committed |-> 1", "target |-> 0", 'pending |-> "none"',
        "bind |-> [i \\in Slots |-> 0]", "cleared |-> {}", "evidence |-> AllEvidence",
        "weights |-> 1", "label |-> 1", "paused |-> FALSE", "req |-> [i \\in Slots |-> 0]",
        "caches |-> [t \\in Tiers |-> {}]", "amb |-> FALSE", "stale |-> FALSE",
        "replaced |-> FALSE", "doubt |-> FALSE", "faults |-> 0"])
    engine_module = tla_module(spec.engine)
    defs = engine_module[engine_module.index("Slots =="):engine_module.index("VARIABLES")]
    tiers = ", ".join(f'"{t}"' for t in TIERS)
    parts = [
        f"---------------------------- MODULE {spec.name} ----------------------------",
        "\\* Generated from spec/fleet.py and spec/lifecycle.py by `rolloutcore spec tla`.",
        "\\* Do not edit: change the Python spec and regenerate.",
        "EXTENDS Integers, FiniteSets, Sequences",
        "",
        "CONSTANTS NumEngines, NumSlots, MaxGen, MaxFaults, MinServing, MaxLive, MinAdmitting,",
        "    MaxCrashes",
        "",
        "Engines == 1..NumEngines",
        defs.rstrip(),
        f"TierOrder == <<{tiers}>>",
        "",
        f"VARIABLES {', '.join(FLEET_VARIABLES)}",
        f"vars == <<{', '.join(FLEET_VARIABLES)}>>",
        "",
        "Init ==",
        f'    /\\ fphase = "{FleetPhase.UNINITIALIZED}"',
        "    /\\ fcommitted = 1",
        "    /\\ ftarget = 0",
        f"    /\\ eng = [n \\in Engines |-> [{init_member}]]",
        "    /\\ faults = 0",
        "    /\\ ffloor = 1",
        "    /\\ fdown = {}",
        "    /\\ fcrashes = 0",
        "    /\\ fasked = {}",
        "",
        "TierFirst(e, t) == \\A k \\in 1..Len(TierOrder) : TierOrder[k] = t =>",
        "    \\A j \\in 1..(k - 1) : TierOrder[j] \\in e.cleared",
        f"Settled(e) == ({_VALIDATED_TLA}) \\/ e.phase = \"TAINTED\" \\/ (e.pending = \"none\" "
        "/\\ e.phase = \"READY\" /\\ \\A i \\in Slots : e.bind[i] = 0)",
        'Scheduled(n) == fphase # "UPDATING" \\/ \\A m \\in 1..(n - 1) : Settled(eng[m])',
        'Serving(e) == e.phase = "READY" /\\ e.committed >= ffloor /\\ e.committed <= fcommitted'
        ' /\\ ' + lift_tla(VERIFIED_TLA),
        "",
    ]
    parts += [_member_operator(spec, a) + "\n" for a in spec.member_actions()]
    parts += [_fleet_operator(fa) + "\n" for fa in spec.actions]
    parts.append(_migration_operator(spec) + "\n")
    parts += [_crash_operator(spec) + "\n", _in_flight_worlds(spec) + "\n"]
    parts += [_restart_operator(spec, spec.engine.action(n)) + "\n" for n in spec.restarts]
    disj = []
    for a in spec.member_actions():
        if a.param:
            v = param_var(a.param)
            disj.append(f"\\E n \\in Engines : \\E {v} \\in {param_domain(a.param)} : "
                        f"M{tla_name(a.name)}(n, {v})")
        else:
            disj.append(f"\\E n \\in Engines : M{tla_name(a.name)}(n)")
    disj += [tla_name(fa.name) for fa in spec.actions]
    disj.append(f"\\E src, dst \\in Engines : \\E i, j \\in Slots : "
                f"{tla_name(spec.migration.name)}(src, i, dst, j)")
    disj.append(tla_name(spec.crash.name))
    disj += [f"\\E n \\in Engines : M{tla_name(n)}(n)" for n in spec.restarts]
    parts += ["Next ==\n" + "\n".join(f"    \\/ {d}" for d in disj), "",
              "Spec == Init /\\ [][Next]_vars", "", _fleet_fair_spec(spec), "",
              "\\* ---- fleet invariants"]
    for inv in spec.invariants:
        parts.append(f"\\* {inv.doc}\n{inv.name} ==\n    {inv.tla}\n")
    parts.append("\\* ---- every member's invariants")
    for mi in spec.engine.invariants:
        body = lift_tla(mi.tla).replace("\n", "\n        ")
        parts.append(f"Member{mi.name} ==\n    \\A n \\in Engines : LET e == eng[n] IN\n"
                     f"        {body}\n")
    parts.append("\\* ---- action properties")
    for prop in spec.action_properties:
        body = prop.tla if prop.step is None else f"{_step_taken(spec, prop.step)} => ({prop.tla})"
        parts.append(f"\\* {prop.doc}\n{prop.name} ==\n    [][{body}]_vars\n")
    for mp in spec.engine.action_properties:
        body = lift_tla(mp.tla).replace("\n", "\n        ")
        parts.append(f"Member{mp.name} ==\n    [][\\A n \\in Engines : LET e == eng[n]\n"
                     f"                                  e2 == eng'[n] IN\n"
                     f"        {body}]_vars\n")
    parts.append("\\* ---- liveness (under FairSpec, with finitely many FiniteStep)")
    for lp in spec.liveness:
        body = f"({lp.when_tla}) ~> ({lp.then_tla})"
        if lp.member:
            body = f"\\A n \\in Engines : {body}"
        parts.append(f"\\* {lp.doc}\n{lp.name} ==\n"
                     f"    ([]<><<FiniteStep>>_vars) \\/ ({body})\n")
    parts.append("=" * 78)
    return "\n".join(parts) + "\n"


def _step_taken(spec: FleetSpec, name: str) -> str:
    """TLA+: the step is one of fleet step ``name`` (the migration or a fleet action)."""
    if name == spec.migration.name:
        return (f"(\\E src, dst \\in Engines : \\E i, j \\in Slots : "
                f"{tla_name(name)}(src, i, dst, j))")
    if any(fa.name == name for fa in spec.actions):
        return tla_name(name)
    raise KeyError(name)


def _member_call(spec: FleetSpec, name: str) -> str:
    """Member ``n`` takes member action ``name`` (with any parameter of its own)."""
    a = spec.engine.action(name)
    if a.param is None or name in spec.restarts:
        return f"M{tla_name(name)}(n)"
    v = param_var(a.param)
    return f"(\\E {v} \\in {param_domain(a.param)} : M{tla_name(name)}(n, {v}))"


def _fleet_fair_spec(spec: FleetSpec) -> str:
    """``FairSpec``: the fleet with its fairness (one conjunct per fleet decision, one per
    member class and member), and ``FiniteStep``, the steps liveness assumes finite."""
    member_steps = {*spec.lifted, *spec.restarts}
    lines = ["\\* The fleet with its fairness assumptions (liveness is checked under it).",
             "FairSpec == Spec"]
    for f in spec.fairness:
        acts = " \\/ ".join(tla_name(fa.name) for fa in spec.actions if fa.name in f.actions)
        lines.append(f"    /\\ {'SF' if f.strong else 'WF'}_vars({acts})  \\* {f.name}")
    lines.append("    /\\ \\A n \\in Engines :")
    for f in spec.member_fairness:
        acts = " \\/ ".join(_member_call(spec, a.name) for a in spec.engine.actions
                             if a.name in f.actions and a.name in member_steps)
        if f.when_tla:
            acts = f"(LET e == eng[n] IN {lift_tla(f.when_tla)}) /\\ ({acts})"
        lines.append(f"        /\\ {'SF' if f.strong else 'WF'}_vars({acts})  \\* {f.name}")
    finite = " \\/ ".join(_member_call(spec, n) for n in spec.lifted if n in spec.finite)
    lines += ["", "\\* The operator's steps and a member leaving an update: a liveness property",
              "\\* speaks of behaviours that take them finitely often.",
              f"FiniteStep == \\E n \\in Engines : {finite}"]
    return "\n".join(lines)


def fleet_liveness_config(spec: FleetSpec, prop: str) -> str:
    """A TLC configuration that checks the fleet's liveness property ``prop``."""
    head, _spec, _rest = fleet_config(spec).partition("SPECIFICATION Spec")
    return head.replace("`rolloutcore spec tla`", "rolloutcore (a liveness run)") + (
        f"SPECIFICATION FairSpec\nPROPERTY {prop}\n")


def fleet_config(spec: FleetSpec = FLEET) -> str:
    b = spec.bounds
    invs = [i.name for i in spec.invariants] + [f"Member{i.name}"
                                                for i in spec.engine.invariants]
    props = [p.name for p in spec.action_properties] + [
        f"Member{p.name}" for p in spec.engine.action_properties]
    return "\n".join([
        "\\* Generated by `rolloutcore spec tla`. Do not edit.",
        "CONSTANTS",
        f"    NumEngines = {b.engines}",
        f"    NumSlots = {b.rollouts}",
        f"    MaxGen = {b.generations}",
        f"    MaxFaults = {b.faults}",
        f"    MinServing = {b.min_serving}",
        f"    MaxLive = {b.max_live}",
        f"    MinAdmitting = {b.min_admitting}",
        f"    MaxCrashes = {b.crashes}",
        "SPECIFICATION Spec",
        "INVARIANTS", *(f"    {n}" for n in invs),
        "PROPERTIES", *(f"    {n}" for n in props),
    ]) + "\n"
