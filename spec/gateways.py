"""Several gateways in front of one fleet: each admits rollouts on its own view of which
members are open, and a member mutates only after every live gateway has closed it and
drained its rollouts on it, or after the gateway's lease has ended, when the engine
refuses what that gateway sends. TLA+ module ``RolloutCoreGateways`` is generated from
this table.

Theory of operation
-------------------
Each gateway keeps its own view of the members it may admit to (``open``) and its own
admission journal; a rollout it admits is forwarded to the member's engine stamped with
the gateway's epoch (``admit``) and runs on the weights the engine serves, until it ends
(``finish``). To update a member the controller starts closing it (``close_begin``);
every gateway it can reach closes the member in its view (``close_seen``) and, once its
own rollouts on that member have ended, acknowledges (``ack``: the close journalled with
the gateway's journal position). The member mutates (``mutate``) only when every gateway
has acknowledged, or its lease has ended: a gateway the controller cannot reach
(``partition``) is waited for until its lease expires (``lease_expire``), and from then
on every engine refuses requests stamped with its epoch, as loads are fenced today, and
the abort-mode pause ends what it still had running. So a partitioned gateway, whose
view may still say open, can never admit a rollout to a mutating member. After the
update (``publish``) each gateway it can reach opens the member again (``reopen``).

At runtime (``rolloutcore serve --gateway-lease`` with ``serve --gateway-only`` gateways):
a gateway's open view of a member is a *hold*, a binding on the member's controller, so
``mutate`` waits for every hold as the single-engine chain waits for every rollout;
``close_begin`` is the member's ``request_update``, ``close_seen`` the gateway's long poll,
``ack`` the hold's release (journalled with the gateway's journal position), and
``lease_expire`` the controller fencing the gateway's epoch on every engine before it
releases its holds (``rolloutcore/gateway/registry.py``, ``follower.py``).
"""

from __future__ import annotations

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

SERVE, CLOSING, MUTATING = "serve", "closing", "mutating"


class Gw(NamedTuple):
    open: tuple[bool, ...]  # per member: this gateway admits to it
    ack: tuple[bool, ...]  # per member: it acknowledged the member's close
    infl: tuple[int, ...]  # per member: generation of its rollout in flight there (0: none)
    cut: bool  # the controller cannot reach it (partitioned, or crashed)
    expired: bool  # its lease ended: every engine refuses its epoch


class Mem(NamedTuple):
    phase: str
    gen: int


class GwState(NamedTuple):
    mem: tuple[Mem, ...]
    gw: tuple[Gw, ...]
    cuts: int  # partitions so far (bounded)


@dataclass(frozen=True)
class GwBounds:
    gateways: int = 2
    members: int = 2
    generations: int = 2
    cuts: int = 1

    def describe(self) -> str:
        return (f"{self.gateways} gateways, {self.members} members, {self.generations} "
                f"generations, {self.cuts} partition(s)")


GwAction = TableAction[GwState, GwBounds]
GwInvariant = TableInvariant[GwState, GwBounds]


def _i(p: Param, k: int) -> int:
    v = p[k]
    assert isinstance(v, int)
    return v


def _set(t: tuple[Any, ...], i: int, v: Any) -> tuple[Any, ...]:
    return (*t[:i], v, *t[i + 1:])


def _gw(f: GwState, g: int, **kw: Any) -> GwState:
    return f._replace(gw=_set(f.gw, g - 1, f.gw[g - 1]._replace(**kw)))


def _gm(f: GwState, p: Param) -> tuple[Gw, int]:
    """The gateway and member (index from 0) of a (g, m) parameter."""
    return f.gw[_i(p, 0) - 1], _i(p, 1) - 1


def _at(f: GwState, p: Param, name: str, v: Any) -> GwState:
    """Gateway g's per-member field ``name`` at member m set to ``v``."""
    g, m = _gm(f, p)
    return _gw(f, _i(p, 0), **{name: _set(getattr(g, name), m, v)})


def released(f: GwState, g: Gw, m: int) -> bool:
    """Member ``m`` (from 0) may mutate as far as gateway ``g`` goes: it acknowledged the
    close, or its lease ended (the engine refuses it)."""
    return g.ack[m] or g.expired


_UNCHANGED_GW = "/\\ UNCHANGED <<mem, cuts>>"

ACTIONS: tuple[GwAction, ...] = (
    GwAction(
        "admit",
        "Gateway g admits a rollout on member m, open in its view, and forwards it "
        "stamped with its epoch; the engine takes it unless that epoch's lease ended.",
        ("g", "m"),
        lambda f, _b, p: (gm := _gm(f, p))[0].open[gm[1]] and gm[0].infl[gm[1]] == 0
        and not gm[0].expired,
        lambda f, _b, p: _at(f, p, "infl", f.mem[_i(p, 1) - 1].gen),
        "/\\ gw[g].open[m] /\\ gw[g].infl[m] = 0 /\\ ~gw[g].expired\n"
        "    /\\ gw' = [gw EXCEPT ![g].infl[m] = mem[m].gen]\n"
        f"    {_UNCHANGED_GW}"),
    GwAction(
        "finish",
        "A rollout gateway g admitted on member m ends (its answer, or the client gone).",
        ("g", "m"),
        lambda f, _b, p: (gm := _gm(f, p))[0].infl[gm[1]] != 0,
        lambda f, _b, p: _at(f, p, "infl", 0),
        "/\\ gw[g].infl[m] # 0 /\\ gw' = [gw EXCEPT ![g].infl[m] = 0]\n"
        f"    {_UNCHANGED_GW}"),
    GwAction(
        "close_begin",
        "The controller starts closing a serving member for its update (while another "
        "serves): every acknowledgement is still to come.",
        ("m",),
        lambda f, b, p: f.mem[_i(p, 0) - 1].phase == SERVE
        and f.mem[_i(p, 0) - 1].gen < b.generations
        and any(o.phase == SERVE for k, o in enumerate(f.mem) if k != _i(p, 0) - 1),
        lambda f, _b, p: f._replace(
            mem=_set(f.mem, _i(p, 0) - 1, f.mem[_i(p, 0) - 1]._replace(phase=CLOSING)),
            gw=tuple(g._replace(ack=_set(g.ack, _i(p, 0) - 1, False)) for g in f.gw)),
        '/\\ mem[m].phase = "serve" /\\ mem[m].gen < MaxGen\n'
        '    /\\ \\E k \\in Members \\ {m} : mem[k].phase = "serve"\n'
        '    /\\ mem\' = [mem EXCEPT ![m].phase = "closing"]\n'
        "    /\\ gw' = [x \\in Gateways |-> [gw[x] EXCEPT !.ack[m] = FALSE]]\n"
        "    /\\ UNCHANGED <<cuts>>"),
    GwAction(
        "close_seen",
        "A gateway the controller reaches closes the member in its view: it admits no "
        "more rollouts there.",
        ("g", "m"),
        lambda f, _b, p: f.mem[_i(p, 1) - 1].phase == CLOSING
        and (gm := _gm(f, p))[0].open[gm[1]] and not gm[0].cut,
        lambda f, _b, p: _at(f, p, "open", False),
        '/\\ mem[m].phase = "closing" /\\ gw[g].open[m] /\\ ~gw[g].cut\n'
        "    /\\ gw' = [gw EXCEPT ![g].open[m] = FALSE]\n"
        f"    {_UNCHANGED_GW}"),
    GwAction(
        "ack",
        "A gateway that closed the member, its own rollouts there ended, acknowledges the "
        "close (journalled with its journal position).",
        ("g", "m"),
        lambda f, _b, p: f.mem[_i(p, 1) - 1].phase == CLOSING
        and not (gm := _gm(f, p))[0].open[gm[1]] and gm[0].infl[gm[1]] == 0
        and not gm[0].ack[gm[1]] and not gm[0].cut,
        lambda f, _b, p: _at(f, p, "ack", True),
        '/\\ mem[m].phase = "closing" /\\ ~gw[g].open[m] /\\ gw[g].infl[m] = 0\n'
        "    /\\ ~gw[g].ack[m] /\\ ~gw[g].cut\n"
        "    /\\ gw' = [gw EXCEPT ![g].ack[m] = TRUE]\n"
        f"    {_UNCHANGED_GW}"),
    GwAction(
        "partition",
        "The controller loses a gateway (a partition, a crash): the gateway may go on "
        "admitting on its last view.",
        ("g",),
        lambda f, b, p: not f.gw[_i(p, 0) - 1].cut and f.cuts < b.cuts,
        lambda f, _b, p: _gw(f, _i(p, 0), cut=True)._replace(cuts=f.cuts + 1),
        "/\\ ~gw[g].cut /\\ cuts < MaxCuts\n"
        "    /\\ gw' = [gw EXCEPT ![g].cut = TRUE] /\\ cuts' = cuts + 1\n"
        "    /\\ UNCHANGED <<mem>>"),
    GwAction(
        "lease_expire",
        "An unreachable gateway's lease ends: from now on every engine refuses requests "
        "stamped with its epoch.",
        ("g",),
        lambda f, _b, p: f.gw[_i(p, 0) - 1].cut and not f.gw[_i(p, 0) - 1].expired,
        lambda f, _b, p: _gw(f, _i(p, 0), expired=True),
        "/\\ gw[g].cut /\\ ~gw[g].expired /\\ gw' = [gw EXCEPT ![g].expired = TRUE]\n"
        f"    {_UNCHANGED_GW}"),
    GwAction(
        "mutate",
        "Every gateway acknowledged the close or its lease ended: the member mutates; its "
        "abort-mode pause ends the rollouts expired gateways still had there.",
        ("m",),
        lambda f, _b, p: f.mem[_i(p, 0) - 1].phase == CLOSING
        and all(released(f, g, _i(p, 0) - 1) for g in f.gw),
        lambda f, _b, p: f._replace(
            mem=_set(f.mem, _i(p, 0) - 1, f.mem[_i(p, 0) - 1]._replace(phase=MUTATING)),
            gw=tuple(g._replace(infl=_set(g.infl, _i(p, 0) - 1, 0)) if g.expired else g
                     for g in f.gw)),
        '/\\ mem[m].phase = "closing" /\\ \\A x \\in Gateways : Released(x, m)\n'
        '    /\\ mem\' = [mem EXCEPT ![m].phase = "mutating"]\n'
        "    /\\ gw' = [x \\in Gateways |-> IF gw[x].expired THEN [gw[x] EXCEPT !.infl[m] = 0]"
        " ELSE gw[x]]\n"
        "    /\\ UNCHANGED <<cuts>>"),
    GwAction(
        "publish",
        "The member's verified update ends: it serves its next generation.",
        ("m",),
        lambda f, _b, p: f.mem[_i(p, 0) - 1].phase == MUTATING,
        lambda f, _b, p: f._replace(mem=_set(f.mem, _i(p, 0) - 1, Mem(
            SERVE, f.mem[_i(p, 0) - 1].gen + 1))),
        '/\\ mem[m].phase = "mutating"\n'
        '    /\\ mem\' = [mem EXCEPT ![m] = [phase |-> "serve", gen |-> mem[m].gen + 1]]\n'
        "    /\\ UNCHANGED <<gw, cuts>>"),
    GwAction(
        "reopen",
        "A gateway the controller reaches opens a serving member again in its view.",
        ("g", "m"),
        lambda f, _b, p: f.mem[_i(p, 1) - 1].phase == SERVE
        and not (gm := _gm(f, p))[0].open[gm[1]] and not gm[0].cut,
        lambda f, _b, p: _at(f, p, "open", True),
        '/\\ mem[m].phase = "serve" /\\ ~gw[g].open[m] /\\ ~gw[g].cut\n'
        "    /\\ gw' = [gw EXCEPT ![g].open[m] = TRUE]\n"
        f"    {_UNCHANGED_GW}"),
)

INVARIANTS: tuple[GwInvariant, ...] = (
    GwInvariant(
        "NoRolloutCrossesMutation",
        "A rollout any gateway admitted runs on the generation its member served when it "
        "was admitted, and never on a mutating member, across all gateways.",
        "\\A x \\in Gateways, m \\in Members : gw[x].infl[m] # 0 =>\n"
        '        (gw[x].infl[m] = mem[m].gen /\\ mem[m].phase # "mutating")',
        lambda f, _b: all(v == 0 or (v == f.mem[m].gen and f.mem[m].phase != MUTATING)
                          for g in f.gw for m, v in enumerate(g.infl))),
    GwInvariant(
        "AckMeansDrained",
        "A gateway's acknowledgement of a member's close that is not yet over means it "
        "admits nothing there and has nothing in flight there.",
        '\\A x \\in Gateways, m \\in Members : (gw[x].ack[m] /\\ mem[m].phase # "serve") =>\n'
        "        (~gw[x].open[m] /\\ gw[x].infl[m] = 0)",
        lambda f, _b: all(not g.ack[m] or f.mem[m].phase == SERVE
                          or (not g.open[m] and g.infl[m] == 0)
                          for g in f.gw for m in range(len(f.mem)))),
)


@dataclass(frozen=True)
class GatewaySpec(TableSpec):
    name: str = "RolloutCoreGateways"
    what: str = "gateway"
    actions: tuple[GwAction, ...] = ACTIONS
    invariants: tuple[GwInvariant, ...] = INVARIANTS
    bounds: GwBounds = field(default_factory=GwBounds)

    def initial_states(self) -> tuple[GwState, ...]:
        b = self.bounds
        n = b.members
        return (GwState((Mem(SERVE, 1),) * n,
                        (Gw((True,) * n, (False,) * n, (0,) * n, False, False),) * b.gateways,
                        0),)

    def domains(self) -> dict[str, Iterable[object]]:
        return {"g": range(1, self.bounds.gateways + 1), "m": range(1, self.bounds.members + 1)}


GATEWAYS = GatewaySpec()
#: An exploration of the gateway spec.
GwExploration = GraphExploration[GwState]


def explore_gateways(spec: GatewaySpec = GATEWAYS, *, max_states: int = 2_000_000,
                     stop_at_violation: bool = False) -> GwExploration:
    """Every reachable state, every invariant in every state."""
    return spec.explore(max_states=max_states, stop_at_violation=stop_at_violation)


VARIABLES = ("mem", "gw", "cuts")


def gateways_module(spec: GatewaySpec = GATEWAYS) -> str:
    return table_module(
        spec.name, "spec/gateways.py", extends="Integers, FiniteSets",
        constants=("NumGateways", "NumMembers", "MaxGen", "MaxCuts"),
        preamble=[
            "Gateways == 1..NumGateways",
            "Members == 1..NumMembers",
            "",
            "Init ==",
            '    /\\ mem = [m \\in Members |-> [phase |-> "serve", gen |-> 1]]',
            "    /\\ gw = [x \\in Gateways |-> [open |-> [m \\in Members |-> TRUE],",
            "                                 ack |-> [m \\in Members |-> FALSE],",
            "                                 infl |-> [m \\in Members |-> 0],",
            "                                 cut |-> FALSE, expired |-> FALSE]]",
            "    /\\ cuts = 0",
            "",
            "\\* Member m may mutate as far as gateway x goes (spec/gateways.py released).",
            "Released(x, m) == gw[x].ack[m] \\/ gw[x].expired"],
        variables=VARIABLES, actions=spec.actions,
        domains={"g": "Gateways", "m": "Members"}, invariants=spec.invariants)


def gateways_config(spec: GatewaySpec = GATEWAYS) -> str:
    b = spec.bounds
    return table_config({"NumGateways": b.gateways, "NumMembers": b.members,
                         "MaxGen": b.generations, "MaxCuts": b.cuts}, spec.invariants)


__all__ = [
    "ACTIONS",
    "GATEWAYS",
    "INVARIANTS",
    "GatewaySpec",
    "Gw",
    "GwBounds",
    "GwExploration",
    "GwState",
    "Mem",
    "explore_gateways",
    "gateways_config",
    "gateways_module",
    "released",
]
