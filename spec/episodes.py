"""Agentic episodes under one verified policy: a multi-turn rollout (model turns with tool
waits between them) bound to one generation as one unit, in a rolling fleet of K live
generations. TLA+ module ``RolloutCoreEpisodes`` is generated from this table.

Theory of operation
-------------------
An *episode* is admitted once (``start``) on a serving member and bound to that member's
generation: its binding outlives its requests. A *turn* is a request under the binding
(``turn_begin`` .. ``turn_end``), served only by a member that serves the episode's
generation; between turns the episode is idle (waiting on a tool or the environment):
it holds its generation, and the floor, but no engine slot. Its record is the sequence of
its turns, each with the segment it was journalled under and the generation that served
it.

A member that holds a live episode leaves service for an update (``drain`` then
``mutate``) only in the way the episode's owner chose when it started it:

- ``wait``: the member waits for the episode to end (its owner ends it, or its idle
  deadline does); a drain that waits too long is cancelled (``cancel_drain``);
- ``abort``: the episode is aborted whole (``abort_episode``), reported as aborted, and
  nothing of it is delivered as one policy;
- ``segment``: the member updates under it; the episode continues as a new segment under
  the member's new generation (``segment``: the boundary journalled, the trainer told),
  every turn still served by one policy per segment.

A turn in flight always finishes (or is aborted with its episode) before its member
mutates. An idle episode whose idle deadline passed (``idle_timeout``, the clock) starts
no turn: the controller ends it and reports it (``expire``). Live episodes count toward
K: the floor rises past a generation only once no member serves it and no live episode is
bound to it, and no member updates beyond ``floor + K - 1``.

What the model leaves out: the engine's own lifecycle (drain, verified publish, faults:
the engine and fleet specs prove those), so ``publish`` here stands for a member's whole
verified update; which member a turn's prefix cache lives on (a turn may run on any
member serving the episode's generation; the gateway prefers the one before).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from rolloutcore.spec.graph import (
    GraphExploration,
    Param,
    TableAction,
    TableInvariant,
    TableSpec,
    table_config,
    table_module,
)

#: An episode's status: not started, waiting between turns, a turn in flight, or ended
#: (by its owner, aborted for an update, or past its idle deadline).
NONE, IDLE, TURN, DONE, ABORTED, EXPIRED = "none", "idle", "turn", "done", "aborted", "expired"
LIVE = frozenset({IDLE, TURN})
#: What an episode's owner chose for an update of its member.
POLICIES = ("wait", "abort", "segment")
#: A member: serving, draining for an update (admits nothing new), or mutating.
SERVE, DRAIN, MUTATE = "serve", "drain", "mutate"



class Mem(NamedTuple):
    gen: int
    phase: str


class Ep(NamedTuple):
    status: str
    policy: str
    member: int  # where its binding lives (its last turn's member), from 1; 0: none
    gen: int  # the generation its current segment is bound to
    seg: int  # its current segment, from 1, as journalled
    tgen: int  # the generation serving its turn in flight (0: none)
    late: bool  # its idle deadline has passed
    log: tuple[tuple[int, int], ...]  # its record: (segment, generation) per turn


class EpState(NamedTuple):
    front: int  # the frontier: the newest generation a member serves
    floor: int  # the oldest generation still live (served, or bound to an episode)
    mem: tuple[Mem, ...]
    eps: tuple[Ep, ...]


@dataclass(frozen=True)
class EpBounds:
    """Default: two members, one episode of up to three turns (two on one side of a
    segment boundary, one on the other), three generations, K 2 (9,035 states). Two
    episodes at two generations: 358,909 states, the explorer's alone (13 s)."""

    members: int = 2
    episodes: int = 1
    generations: int = 3
    max_live: int = 2  # K
    min_serving: int = 1  # members that keep serving while one leaves for an update
    turns: int = 3  # turns per episode

    def describe(self) -> str:
        return (f"{self.members} members, {self.episodes} episode(s) of up to {self.turns} "
                f"turns, {self.generations} generations, K {self.max_live}, min_serving "
                f"{self.min_serving}")


def live(x: Ep) -> bool:
    return x.status in LIVE


def _set(t: tuple[Any, ...], i: int, v: Any) -> tuple[Any, ...]:
    return (*t[:i], v, *t[i + 1:])


def _ep(f: EpState, e: int, **kw: Any) -> EpState:
    return f._replace(eps=_set(f.eps, e - 1, f.eps[e - 1]._replace(**kw)))


def _mem(f: EpState, n: int, **kw: Any) -> EpState:
    return f._replace(mem=_set(f.mem, n - 1, f.mem[n - 1]._replace(**kw)))


#: An action of the episode spec (parameters: e an episode, n a member, p a policy).
EpAction = TableAction[EpState, EpBounds]


def _i(p: Param, k: int = 0) -> int:
    v = p[k]
    assert isinstance(v, int)
    return v


def _x(f: EpState, p: Param) -> Ep:
    return f.eps[_i(p) - 1]


#: What a member's drain does to an idle live episode bound to its generation, by the
#: policy its owner chose: the drain waits for it (None), aborts it (``abort_episode``),
#: or lets it go on, idle, to continue as a new segment under a newer generation
#: (``segment``). The runtime (the gateway's episodes) reads it from here.
ON_DRAIN: dict[str, str | None] = {"wait": None, "abort": "abort_episode",
                                   "segment": "segment"}
assert set(ON_DRAIN) == set(POLICIES)
#: The journal's names: an episode's hold (its admission) is released with
#: ``{HOLD_ENDS: why}``, ``why`` being HOLD_LET_GO (its member drains, the episode goes
#: on, a segmenting one) or how the episode ended.
HOLD_ENDS, HOLD_LET_GO = "hold_ends", "drain"


def _holds_member(f: EpState, n: int) -> bool:
    """Member ``n`` holds what its update must not cross: a turn in flight, or a live
    episode bound to its generation that its drain does not let go (it waits for it, or
    aborts it first)."""
    g = f.mem[n - 1].gen
    return any(x.member == n and (x.status == TURN or (
        live(x) and ON_DRAIN[x.policy] != "segment" and x.gen == g)) for x in f.eps)


_UNCHANGED_EPS = "/\\ UNCHANGED <<front, floor, mem>>"
_UNCHANGED_MEM = "/\\ UNCHANGED <<front, floor, eps>>"

ACTIONS: tuple[EpAction, ...] = (
    EpAction(
        "start",
        "A client admits an episode on a serving member with the policy it chose for an "
        "update: bound to that member's generation, its first segment.",
        ("e", "n", "p"),
        lambda f, _b, p: _x(f, p).status == NONE and f.mem[_i(p, 1) - 1].phase == SERVE,
        lambda f, _b, p: _ep(f, _i(p), status=IDLE, policy=p[2], member=_i(p, 1),
                             gen=f.mem[_i(p, 1) - 1].gen, seg=1),
        '/\\ eps[e].status = "none" /\\ mem[n].phase = "serve"\n'
        '    /\\ eps\' = [eps EXCEPT ![e].status = "idle", ![e].policy = p, '
        "![e].member = n,\n                            ![e].gen = mem[n].gen, ![e].seg = 1]\n"
        f"    {_UNCHANGED_EPS}"),
    EpAction(
        "turn_begin",
        "A turn of an idle episode (its idle deadline not passed) starts on a serving "
        "member that serves the episode's generation.",
        ("e", "n"),
        lambda f, b, p: (x := _x(f, p)).status == IDLE and not x.late and len(x.log) < b.turns
        and f.mem[_i(p, 1) - 1].phase == SERVE and f.mem[_i(p, 1) - 1].gen == x.gen,
        lambda f, _b, p: _ep(f, _i(p), status=TURN, member=_i(p, 1),
                             tgen=f.mem[_i(p, 1) - 1].gen),
        '/\\ eps[e].status = "idle" /\\ ~eps[e].late /\\ Len(eps[e].log) < MaxTurns\n'
        '    /\\ mem[n].phase = "serve" /\\ mem[n].gen = eps[e].gen\n'
        '    /\\ eps\' = [eps EXCEPT ![e].status = "turn", ![e].member = n, '
        "![e].tgen = mem[n].gen]\n"
        f"    {_UNCHANGED_EPS}"),
    EpAction(
        "turn_end",
        "The turn's answer ends: the record gains it, under its segment and the "
        "generation that served it; the episode waits on its tool.",
        ("e",),
        lambda f, _b, p: _x(f, p).status == TURN,
        lambda f, _b, p: _ep(f, _i(p), status=IDLE, tgen=0,
                             log=(*_x(f, p).log, (_x(f, p).seg, _x(f, p).tgen))),
        '/\\ eps[e].status = "turn"\n'
        '    /\\ eps\' = [eps EXCEPT ![e].status = "idle", ![e].tgen = 0,\n'
        "                            ![e].log = Append(eps[e].log, <<eps[e].seg, "
        "eps[e].tgen>>)]\n"
        f"    {_UNCHANGED_EPS}"),
    EpAction(
        "end",
        "Its owner ends an idle episode (with its reward): done, its record whole.",
        ("e",),
        lambda f, _b, p: _x(f, p).status == IDLE,
        lambda f, _b, p: _ep(f, _i(p), status=DONE),
        '/\\ eps[e].status = "idle" /\\ eps\' = [eps EXCEPT ![e].status = "done"]\n'
        f"    {_UNCHANGED_EPS}"),
    EpAction(
        "idle_timeout",
        "The clock passes an idle episode's idle deadline (its tool never answered).",
        ("e",),
        lambda f, _b, p: _x(f, p).status == IDLE and not _x(f, p).late,
        lambda f, _b, p: _ep(f, _i(p), late=True),
        '/\\ eps[e].status = "idle" /\\ ~eps[e].late /\\ eps\' = [eps EXCEPT ![e].late = TRUE]\n'
        f"    {_UNCHANGED_EPS}"),
    EpAction(
        "expire",
        "The controller ends an episode past its idle deadline and reports it (expired: "
        "its record says so).",
        ("e",),
        lambda f, _b, p: _x(f, p).status == IDLE and _x(f, p).late,
        lambda f, _b, p: _ep(f, _i(p), status=EXPIRED),
        '/\\ eps[e].status = "idle" /\\ eps[e].late /\\ eps\' = [eps EXCEPT ![e].status = '
        '"expired"]\n'
        f"    {_UNCHANGED_EPS}"),
    EpAction(
        "drain",
        "A serving member is asked to update to its next generation: one within K of the "
        "floor, while min_serving others serve. It admits no new episode or turn.",
        ("n",),
        lambda f, b, p: (m := f.mem[_i(p) - 1]).phase == SERVE and m.gen < b.generations
        and m.gen + 1 <= f.floor + b.max_live - 1
        and sum(1 for k, o in enumerate(f.mem, 1) if k != _i(p) and o.phase == SERVE)
        >= b.min_serving,
        lambda f, _b, p: _mem(f, _i(p), phase=DRAIN),
        '/\\ mem[n].phase = "serve" /\\ mem[n].gen < MaxGen '
        "/\\ mem[n].gen + 1 <= floor + MaxLive - 1\n"
        '    /\\ Cardinality({k \\in Members \\ {n} : mem[k].phase = "serve"}) >= MinServing\n'
        '    /\\ mem\' = [mem EXCEPT ![n].phase = "drain"]\n'
        f"    {_UNCHANGED_MEM}"),
    EpAction(
        "abort_episode",
        "A live episode whose owner chose abort, bound to a draining member's generation, "
        "is aborted whole (a turn in flight with it): reported aborted, nothing of it "
        "delivered as one policy.",
        ("e",),
        lambda f, _b, p: live(x := _x(f, p)) and x.policy == "abort"
        and f.mem[x.member - 1].phase == DRAIN and f.mem[x.member - 1].gen == x.gen,
        lambda f, _b, p: _ep(f, _i(p), status=ABORTED, tgen=0),
        '/\\ eps[e].status \\in {"idle", "turn"} /\\ eps[e].policy = "abort"\n'
        '    /\\ mem[eps[e].member].phase = "drain" /\\ mem[eps[e].member].gen = eps[e].gen\n'
        '    /\\ eps\' = [eps EXCEPT ![e].status = "aborted", ![e].tgen = 0]\n'
        f"    {_UNCHANGED_EPS}"),
    EpAction(
        "cancel_drain",
        "The drain's deadline passes (an episode waited for outlasts it): the member "
        "serves its generation again.",
        ("n",),
        lambda f, _b, p: f.mem[_i(p) - 1].phase == DRAIN,
        lambda f, _b, p: _mem(f, _i(p), phase=SERVE),
        '/\\ mem[n].phase = "drain" /\\ mem\' = [mem EXCEPT ![n].phase = "serve"]\n'
        f"    {_UNCHANGED_MEM}"),
    EpAction(
        "mutate",
        "A drained member mutates: no turn in flight on it, no live episode bound to its "
        "generation that waits or aborts (only segmenting ones stay, idle).",
        ("n",),
        lambda f, _b, p: f.mem[_i(p) - 1].phase == DRAIN and not _holds_member(f, _i(p)),
        lambda f, _b, p: _mem(f, _i(p), phase=MUTATE),
        '/\\ mem[n].phase = "drain" /\\ ~Holds(n)\n'
        '    /\\ mem\' = [mem EXCEPT ![n].phase = "mutate"]\n'
        f"    {_UNCHANGED_MEM}"),
    EpAction(
        "publish",
        "The member's verified update ends: it serves its next generation (the frontier "
        "moves if it led).",
        ("n",),
        lambda f, _b, p: f.mem[_i(p) - 1].phase == MUTATE,
        lambda f, _b, p: _mem(f, _i(p), phase=SERVE, gen=f.mem[_i(p) - 1].gen + 1)._replace(
            front=max(f.front, f.mem[_i(p) - 1].gen + 1)),
        '/\\ mem[n].phase = "mutate"\n'
        '    /\\ mem\' = [mem EXCEPT ![n].phase = "serve", ![n].gen = mem[n].gen + 1]\n'
        "    /\\ front' = IF mem[n].gen + 1 > front THEN mem[n].gen + 1 ELSE front\n"
        "    /\\ UNCHANGED <<floor, eps>>"),
    EpAction(
        "segment",
        "An idle episode whose owner chose segment, whose member now serves a newer "
        "generation, continues under it as a new segment: the boundary journalled, the "
        "trainer told.",
        ("e",),
        lambda f, _b, p: (x := _x(f, p)).status == IDLE and x.policy == "segment"
        and f.mem[x.member - 1].phase == SERVE and f.mem[x.member - 1].gen > x.gen,
        lambda f, _b, p: _ep(f, _i(p), gen=f.mem[_x(f, p).member - 1].gen,
                             seg=_x(f, p).seg + 1),
        '/\\ eps[e].status = "idle" /\\ eps[e].policy = "segment"\n'
        '    /\\ mem[eps[e].member].phase = "serve" /\\ mem[eps[e].member].gen > eps[e].gen\n'
        "    /\\ eps' = [eps EXCEPT ![e].gen = mem[eps[e].member].gen, "
        "![e].seg = eps[e].seg + 1]\n"
        f"    {_UNCHANGED_EPS}"),
    EpAction(
        "raise_floor",
        "The floor rises past a generation no member serves and no live episode is bound "
        "to.",
        (),
        lambda f, _b, _p: f.floor < f.front and all(m.gen > f.floor for m in f.mem)
        and all(x.gen > f.floor for x in f.eps if live(x)),
        lambda f, _b, _p: f._replace(floor=f.floor + 1),
        "/\\ floor < front /\\ \\A n \\in Members : mem[n].gen > floor\n"
        "    /\\ \\A x \\in Episodes : Live(x) => eps[x].gen > floor\n"
        "    /\\ floor' = floor + 1 /\\ UNCHANGED <<front, mem, eps>>"),
)


EpInvariant = TableInvariant[EpState, EpBounds]


def one_policy_per_segment(log: tuple[tuple[int, int], ...]) -> bool:
    """An episode's record, as (segment, generation) per turn: one generation per
    segment. The journal checker applies it to each episode's admissions."""
    gens: dict[int, int] = {}
    return all(gens.setdefault(s, g) == g for s, g in log)


def segments_in_order(log: tuple[tuple[int, int], ...]) -> bool:
    """Segments follow one another in order, each under a newer generation."""
    return all((s1 < s2 and g1 < g2) or s1 == s2 for (s1, g1), (s2, g2)
               in itertools.pairwise(log))


def _one_policy_per_segment(x: Ep) -> bool:
    return one_policy_per_segment(x.log) and (x.status != TURN or x.tgen == x.gen)


def _segments_in_order(x: Ep) -> bool:
    return segments_in_order(x.log)


INVARIANTS: tuple[EpInvariant, ...] = (
    EpInvariant(
        "OneEpisodeOnePolicy",
        "Every turn of an episode's segment, as its record journals it, was served by one "
        "generation, its segment's (a turn in flight included).",
        "\\A x \\in Episodes :\n"
        "        /\\ \\A i, j \\in DOMAIN eps[x].log : "
        "eps[x].log[i][1] = eps[x].log[j][1] => eps[x].log[i][2] = eps[x].log[j][2]\n"
        '        /\\ eps[x].status = "turn" => eps[x].tgen = eps[x].gen',
        lambda f, _b: all(_one_policy_per_segment(x) for x in f.eps)),
    EpInvariant(
        "TurnServedByItsGeneration",
        "A turn in flight runs on a member that serves its generation and is not "
        "mutating: no member's update crosses a turn.",
        '\\A x \\in Episodes : eps[x].status = "turn" => '
        '(mem[eps[x].member].gen = eps[x].tgen /\\ mem[eps[x].member].phase # "mutate")',
        lambda f, _b: all(f.mem[x.member - 1].gen == x.tgen
                          and f.mem[x.member - 1].phase != MUTATE
                          for x in f.eps if x.status == TURN)),
    EpInvariant(
        "OwnersChoiceKept",
        "A live episode whose owner chose to wait or to abort keeps its member on its "
        "generation: that member has not mutated under it (one that chose to segment may "
        "lag its member's, until its next segment).",
        '\\A x \\in Episodes : (Live(x) /\\ eps[x].policy # "segment") => '
        '(mem[eps[x].member].gen = eps[x].gen /\\ mem[eps[x].member].phase # "mutate")',
        lambda f, _b: all(f.mem[x.member - 1].gen == x.gen
                          and f.mem[x.member - 1].phase != MUTATE
                          for x in f.eps if live(x) and x.policy != "segment")),
    EpInvariant(
        "EpisodesCountTowardK",
        "Every live episode's generation is live (from the floor to the frontier), and "
        "at most K generations are.",
        "/\\ front - floor + 1 <= MaxLive\n"
        "    /\\ \\A x \\in Episodes : Live(x) => (eps[x].gen >= floor /\\ eps[x].gen <= front)",
        lambda f, b: f.front - f.floor + 1 <= b.max_live
        and all(f.floor <= x.gen <= f.front for x in f.eps if live(x))),
    EpInvariant(
        "IdleDeadlineHonoured",
        "No turn runs on an episode past its idle deadline: it is ended and reported "
        "instead.",
        '\\A x \\in Episodes : eps[x].status = "turn" => ~eps[x].late',
        lambda f, _b: all(not x.late for x in f.eps if x.status == TURN)),
    EpInvariant(
        "SegmentsInOrder",
        "An episode's record goes through its segments in order, each under a newer "
        "generation than the one before.",
        "\\A x \\in Episodes : \\A i \\in 1..(Len(eps[x].log) - 1) :\n"
        "        \\/ eps[x].log[i][1] = eps[x].log[i + 1][1]\n"
        "        \\/ (eps[x].log[i][1] < eps[x].log[i + 1][1] "
        "/\\ eps[x].log[i][2] < eps[x].log[i + 1][2])",
        lambda f, _b: all(_segments_in_order(x) for x in f.eps)),
)


@dataclass(frozen=True)
class EpisodeSpec(TableSpec):
    name: str = "RolloutCoreEpisodes"
    what: str = "episode"
    actions: tuple[EpAction, ...] = ACTIONS
    invariants: tuple[EpInvariant, ...] = INVARIANTS
    bounds: EpBounds = field(default_factory=EpBounds)

    def initial_states(self) -> tuple[EpState, ...]:
        b = self.bounds
        return (EpState(1, 1, (Mem(1, SERVE),) * b.members,
                        (Ep(NONE, "wait", 0, 0, 0, 0, False, ()),) * b.episodes),)

    def domains(self) -> dict[str, Iterable[object]]:
        b = self.bounds
        return {"e": range(1, b.episodes + 1), "n": range(1, b.members + 1), "p": POLICIES}


EPISODES = EpisodeSpec()


#: An exploration of the episode spec.
EpExploration = GraphExploration[EpState]


def explore_episodes(spec: EpisodeSpec = EPISODES, *, max_states: int = 2_000_000,
                     stop_at_violation: bool = False) -> EpExploration:
    """Breadth first over every reachable state, every invariant in every state; each
    invariant's first violation is a shortest counterexample (its action path)."""
    return spec.explore(max_states=max_states, stop_at_violation=stop_at_violation)


# ------------------------------------------------------------------------------- TLA+

VARIABLES = ("front", "floor", "mem", "eps")


def episodes_module(spec: EpisodeSpec = EPISODES) -> str:
    return table_module(
        spec.name, "spec/episodes.py", extends="Integers, FiniteSets, Sequences",
        constants=("NumMembers", "NumEpisodes", "MaxGen", "MaxLive", "MinServing",
                   "MaxTurns"),
        preamble=[
            "Members == 1..NumMembers",
            "Episodes == 1..NumEpisodes",
            f"Policies == {{{', '.join(f'{chr(34)}{p}{chr(34)}' for p in POLICIES)}}}",
            "",
            "Init ==",
            "    /\\ front = 1 /\\ floor = 1",
            '    /\\ mem = [n \\in Members |-> [gen |-> 1, phase |-> "serve"]]',
            '    /\\ eps = [x \\in Episodes |-> [status |-> "none", policy |-> "wait", '
            "member |-> 0, gen |-> 0,",
            "                                 seg |-> 0, tgen |-> 0, late |-> FALSE, "
            "log |-> << >>]]",
            "",
            'Live(x) == eps[x].status \\in {"idle", "turn"}',
            "\\* A member holds what its update must not cross (spec/episodes.py "
            "_holds_member).",
            "Holds(n) == \\E x \\in Episodes : eps[x].member = n /\\",
            '    (eps[x].status = "turn" \\/ (Live(x) /\\ eps[x].policy # "segment" '
            "/\\ eps[x].gen = mem[n].gen))"],
        variables=VARIABLES, actions=spec.actions,
        domains={"e": "Episodes", "n": "Members", "p": "Policies"},
        invariants=spec.invariants)


def episodes_config(spec: EpisodeSpec = EPISODES) -> str:
    b = spec.bounds
    return table_config({"NumMembers": b.members, "NumEpisodes": b.episodes,
                         "MaxGen": b.generations, "MaxLive": b.max_live,
                         "MinServing": b.min_serving, "MaxTurns": b.turns}, spec.invariants)


__all__ = [
    "ACTIONS",
    "EPISODES",
    "HOLD_ENDS",
    "HOLD_LET_GO",
    "INVARIANTS",
    "ON_DRAIN",
    "POLICIES",
    "Ep",
    "EpBounds",
    "EpExploration",
    "EpState",
    "EpisodeSpec",
    "Mem",
    "episodes_config",
    "episodes_module",
    "explore_episodes",
    "one_policy_per_segment",
    "segments_in_order",
]
