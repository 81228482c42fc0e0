"""Staged updates: the weights travel while the engine serves, every rank proves it holds
exactly the target's bytes before anything is installed, and the closed window only
installs. TLA+ module ``RolloutCoreStaged`` is generated from this table.

Theory of operation
-------------------
An update is split into *stage* and *install*. Staging (``stage_begin``, ``receive``,
``prepare``) happens while the engine serves its committed generation, into inactive
buffers: each rank receives its shard (from the trainer, as a delta on the generation it
holds, or from a peer that installed it), digests it as it arrives, and reports
*prepared* only once its buffer's manifest (tensor names, shapes, dtypes, digests)
equals the trainer's for the target. A staging that fails (a chunk corrupt, a sender or
peer source gone mid-stream, another generation's bytes or a delta on the wrong base, a
rank refusing, the deadline) is refused (``stage_fail``): what is served was never
touched, so the refusal is a proof of no effect, never TAINTED.

Only when every participant is prepared (prepare-then-commit: every rank of the engine,
as every member of a fleet in the fleet's two-phase commit) does the controller close
admissions (``close``) and install from the prepared buffers (``install``): vLLM's own
``load_weights`` from the staged tensors, then the verified reset, validation and probe
as in the lifecycle spec (``publish`` stands for them here). Only an ambiguous install
latches TAINTED (a rank's install that may have half happened: mixed weights); an
install refused with proof before any rank installed (``abandon``) reopens on the
committed generation, as the lifecycle's refused mutation does.

The unstaged path (the mutation writing straight into served weights) is the lifecycle
spec's, unchanged; its journals check as before.
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
    TableProperty,
    TableSpec,
    table_config,
    table_module,
)

SERVING, STAGING, CLOSED, TAINTED = "serving", "staging", "closed", "tainted"
#: What a rank's buffer may hold besides a generation's exact bytes (0: nothing yet).
MIXED, CORRUPT, PARTIAL, OTHER = -1, -2, -3, -4
#: What a rank's receive brings: the target's exact bytes, another generation's (a wrong
#: checkpoint, a delta on the wrong base), a corrupt chunk, or a stream cut short.
KINDS = ("exact", "other", "corrupt", "partial")
_RECEIVED = {"exact": 0, "other": OTHER, "corrupt": CORRUPT, "partial": PARTIAL}


class StState(NamedTuple):
    phase: str
    committed: int
    target: int  # 0: no update under way
    served: tuple[int, ...]  # per rank: the generation its served weights hold, or MIXED
    buf: tuple[int, ...]  # per rank: its staging buffer
    prep: tuple[bool, ...]  # per rank: reported prepared (its manifest checked)
    inst: tuple[bool, ...]  # per rank: installed from its buffer
    faults: int


@dataclass(frozen=True)
class StBounds:
    ranks: int = 3
    generations: int = 3
    faults: int = 1  # ambiguous installs per behaviour

    def describe(self) -> str:
        return (f"{self.ranks} ranks, {self.generations} generations, {self.faults} "
                "ambiguous install(s)")


StAction = TableAction[StState, StBounds]
StInvariant = TableInvariant[StState, StBounds]
StProperty = TableProperty[StState, StBounds]


def _r(p: Param, k: int = 0) -> int:
    v = p[k]
    assert isinstance(v, int)
    return v


def _set(t: tuple[Any, ...], i: int, v: Any) -> tuple[Any, ...]:
    return (*t[:i], v, *t[i + 1:])


def _cleared(f: StState, **kw: Any) -> StState:
    n = len(f.served)
    return f._replace(target=0, buf=(0,) * n, prep=(False,) * n, inst=(False,) * n, **kw)


def _received(f: StState, kind: object) -> int:
    return f.target if kind == "exact" else _RECEIVED[str(kind)]


_ALL_PREPARED = "\\A r \\in Ranks : prep[r]"

ACTIONS: tuple[StAction, ...] = (
    StAction(
        "stage_begin",
        "The trainer starts the next generation's staging while the engine serves: every "
        "rank's buffer empty.",
        (),
        lambda f, b, _p: f.phase == SERVING and f.committed < b.generations,
        lambda f, _b, _p: _cleared(f, phase=STAGING)._replace(target=f.committed + 1),
        '/\\ phase = "serving" /\\ committed < MaxGen\n'
        '    /\\ phase\' = "staging" /\\ target\' = committed + 1\n'
        "    /\\ buf' = [r \\in Ranks |-> 0] /\\ prep' = [r \\in Ranks |-> FALSE]\n"
        "    /\\ inst' = [r \\in Ranks |-> FALSE]\n"
        "    /\\ UNCHANGED <<committed, served, faults>>"),
    StAction(
        "receive",
        "A rank's shard arrives in its staging buffer, digested as it arrives: the "
        "target's exact bytes, another generation's, a corrupt chunk, or cut short.",
        ("r", "k"),
        lambda f, _b, p: f.phase == STAGING and f.buf[_r(p) - 1] == 0,
        lambda f, _b, p: f._replace(buf=_set(f.buf, _r(p) - 1, _received(f, p[1]))),
        '/\\ phase = "staging" /\\ buf[r] = 0\n'
        "    /\\ buf' = [buf EXCEPT ![r] = Received(k)]\n"
        "    /\\ UNCHANGED <<phase, committed, target, served, prep, inst, faults>>"),
    StAction(
        "prepare",
        "A rank reports prepared: its buffer's manifest equals the trainer's for the "
        "target (names, shapes, dtypes, digests), its evidence.",
        ("r",),
        lambda f, _b, p: f.phase == STAGING and f.buf[_r(p) - 1] == f.target
        and not f.prep[_r(p) - 1],
        lambda f, _b, p: f._replace(prep=_set(f.prep, _r(p) - 1, True)),
        '/\\ phase = "staging" /\\ buf[r] = target /\\ ~prep[r]\n'
        "    /\\ prep' = [prep EXCEPT ![r] = TRUE]\n"
        "    /\\ UNCHANGED <<phase, committed, target, served, buf, inst, faults>>"),
    StAction(
        "stage_fail",
        "The staging is refused (a rank's manifest differs, a sender is gone, a rank "
        "refuses, the deadline passes): buffers discarded, nothing served touched.",
        (),
        lambda f, _b, _p: f.phase == STAGING,
        lambda f, _b, _p: _cleared(f, phase=SERVING),
        '/\\ phase = "staging" /\\ phase\' = "serving" /\\ target\' = 0\n'
        "    /\\ buf' = [r \\in Ranks |-> 0] /\\ prep' = [r \\in Ranks |-> FALSE]\n"
        "    /\\ UNCHANGED <<committed, served, inst, faults>>"),
    StAction(
        "close",
        "Every rank is prepared: admissions close (the engine drained) for the install.",
        (),
        lambda f, _b, _p: f.phase == STAGING and all(f.prep),
        lambda f, _b, _p: f._replace(phase=CLOSED),
        f'/\\ phase = "staging" /\\ {_ALL_PREPARED}\n'
        '    /\\ phase\' = "closed"\n'
        "    /\\ UNCHANGED <<committed, target, served, buf, prep, inst, faults>>"),
    StAction(
        "install",
        "A rank installs its staged buffer (load_weights from the staged tensors): done "
        "(``d``), or ambiguous (a fault: it may have half happened), which latches "
        "TAINTED with mixed weights.",
        ("r", "d"),
        lambda f, b, p: f.phase == CLOSED and not f.inst[_r(p) - 1]
        and (p[1] is True or f.faults < b.faults),
        lambda f, _b, p: f._replace(
            served=_set(f.served, _r(p) - 1, f.buf[_r(p) - 1]),
            inst=_set(f.inst, _r(p) - 1, True)) if p[1] is True else f._replace(
            phase=TAINTED, served=_set(f.served, _r(p) - 1, MIXED), faults=f.faults + 1),
        '/\\ phase = "closed" /\\ ~inst[r] /\\ (d \\/ faults < MaxFaults)\n'
        "    /\\ IF d THEN /\\ served' = [served EXCEPT ![r] = buf[r]]\n"
        "               /\\ inst' = [inst EXCEPT ![r] = TRUE]\n"
        "               /\\ UNCHANGED <<phase, faults>>\n"
        '          ELSE /\\ phase\' = "tainted" /\\ served\' = [served EXCEPT ![r] = -1]\n'
        "               /\\ faults' = faults + 1 /\\ UNCHANGED <<inst>>\n"
        "    /\\ UNCHANGED <<committed, target, buf, prep>>"),
    StAction(
        "abandon",
        "The install is refused with proof before any rank installed (a rank's buffer "
        "was gone, the epoch fenced): admissions reopen on the committed generation, "
        "buffers discarded, nothing served changed.",
        (),
        lambda f, _b, _p: f.phase == CLOSED and not any(f.inst),
        lambda f, _b, _p: _cleared(f, phase=SERVING),
        '/\\ phase = "closed" /\\ \\A r \\in Ranks : ~inst[r]\n'
        '    /\\ phase\' = "serving" /\\ target\' = 0\n'
        "    /\\ buf' = [r \\in Ranks |-> 0] /\\ prep' = [r \\in Ranks |-> FALSE]\n"
        "    /\\ UNCHANGED <<committed, served, inst, faults>>"),
    StAction(
        "publish",
        "Every rank installed: the verified reset, validation and probe pass (the "
        "lifecycle spec's steps) and the target is committed; admissions reopen.",
        (),
        lambda f, _b, _p: f.phase == CLOSED and all(f.inst),
        lambda f, _b, _p: _cleared(f, phase=SERVING, committed=f.target),
        '/\\ phase = "closed" /\\ \\A r \\in Ranks : inst[r]\n'
        '    /\\ phase\' = "serving" /\\ committed\' = target /\\ target\' = 0\n'
        "    /\\ buf' = [r \\in Ranks |-> 0] /\\ prep' = [r \\in Ranks |-> FALSE]\n"
        "    /\\ inst' = [r \\in Ranks |-> FALSE]\n"
        "    /\\ UNCHANGED <<served, faults>>"),
)

INVARIANTS: tuple[StInvariant, ...] = (
    StInvariant(
        "ServedUntouchedOutsideInstall",
        "While the engine serves or stages, every rank's served weights are the committed "
        "generation's: staging touches only inactive buffers, and no mixed group resumes.",
        '(phase \\in {"serving", "staging"}) => \\A r \\in Ranks : served[r] = committed',
        lambda f, _b: f.phase not in (SERVING, STAGING)
        or all(g == f.committed for g in f.served)),
    StInvariant(
        "PreparedIsExact",
        "A rank reported prepared holds exactly the target's bytes.",
        "\\A r \\in Ranks : prep[r] => buf[r] = target",
        lambda f, _b: all(b == f.target for b, p in zip(f.buf, f.prep, strict=True) if p)),
    StInvariant(
        "InstallOnlyWhenAllPrepared",
        "Admissions close for an install only once every rank is prepared.",
        f'phase = "closed" => {_ALL_PREPARED}',
        lambda f, _b: f.phase != CLOSED or all(f.prep)),
    StInvariant(
        "InstallsOnlyTheTarget",
        "A rank that installed serves exactly the target's bytes.",
        "\\A r \\in Ranks : inst[r] => served[r] = target",
        lambda f, _b: all(g == f.target for g, i in zip(f.served, f.inst, strict=True) if i)),
)

PROPERTIES: tuple[StProperty, ...] = (
    StProperty(
        "TaintedOnlyByInstall",
        "Only an ambiguous install latches TAINTED: a staging failure never does.",
        "(phase' = \"tainted\" /\\ phase # \"tainted\") => phase = \"closed\"",
        lambda f, g, _b: g.phase != TAINTED or f.phase in (TAINTED, CLOSED)),
    StProperty(
        "RefusedStagingChangesNothingServed",
        "A refused staging leaves the served weights and the committed generation as "
        "they were: a proof of no effect.",
        "(phase = \"staging\" /\\ phase' = \"serving\") => "
        "(served' = served /\\ committed' = committed)",
        lambda f, g, _b: not (f.phase == STAGING and g.phase == SERVING)
        or (g.served == f.served and g.committed == f.committed)),
)


@dataclass(frozen=True)
class StagedSpec(TableSpec):
    name: str = "RolloutCoreStaged"
    what: str = "staged"
    actions: tuple[StAction, ...] = ACTIONS
    invariants: tuple[StInvariant, ...] = INVARIANTS
    properties: tuple[StProperty, ...] = PROPERTIES
    bounds: StBounds = field(default_factory=StBounds)

    def initial_states(self) -> tuple[StState, ...]:
        n = self.bounds.ranks
        return (StState(SERVING, 1, 0, (1,) * n, (0,) * n, (False,) * n, (False,) * n, 0),)

    def domains(self) -> dict[str, Iterable[object]]:
        return {"r": range(1, self.bounds.ranks + 1), "k": KINDS, "d": (True, False)}


STAGED = StagedSpec()

#: The staging steps a journal records (the Jepsen type and operation each journals as):
#: the spec action each names. The install is the lifecycle's mutation of a staged target
#: (``mutate_begin`` with ``staged``): its begin is ``close``, its outcomes ``install``
#: (ok: every rank; ambiguous: TAINTED) and ``abandon`` (refused with proof).
JOURNAL_STEPS: dict[str, tuple[str, str, str]] = {
    "stage_begin": ("stage_begin", "invoke", "stage"),
    "stage_receive": ("receive", "step", "stage"),
    "stage_prepare": ("prepare", "step", "stage"),
    "stage_fail": ("stage_fail", "fail", "stage"),
}
#: An exploration of the staged spec.
StExploration = GraphExploration[StState]


def explore_staged(spec: StagedSpec = STAGED, *, max_states: int = 2_000_000,
                   stop_at_violation: bool = False) -> StExploration:
    """Every reachable state; invariants in every state, step properties on every edge."""
    return spec.explore(max_states=max_states, stop_at_violation=stop_at_violation)


VARIABLES = ("phase", "committed", "target", "served", "buf", "prep", "inst", "faults")


def staged_module(spec: StagedSpec = STAGED) -> str:
    return table_module(
        spec.name, "spec/staged.py", extends="Integers",
        constants=("NumRanks", "MaxGen", "MaxFaults"),
        preamble=[
            "Ranks == 1..NumRanks",
            f"Kinds == {{{', '.join(chr(34) + k + chr(34) for k in KINDS)}}}",
            "\\* What a receive of kind k leaves in a buffer (spec/staged.py _received).",
            'Received(k) == CASE k = "exact" -> target '
            + " ".join(f'[] k = "{k}" -> {v}' for k, v in _RECEIVED.items() if v),
            "",
            "Init ==",
            '    /\\ phase = "serving" /\\ committed = 1 /\\ target = 0 /\\ faults = 0',
            "    /\\ served = [r \\in Ranks |-> 1] /\\ buf = [r \\in Ranks |-> 0]",
            "    /\\ prep = [r \\in Ranks |-> FALSE] /\\ inst = [r \\in Ranks |-> FALSE]"],
        variables=VARIABLES, actions=spec.actions,
        domains={"r": "Ranks", "k": "Kinds", "d": "BOOLEAN"},
        invariants=spec.invariants, properties=spec.properties)


def staged_config(spec: StagedSpec = STAGED) -> str:
    b = spec.bounds
    return table_config({"NumRanks": b.ranks, "MaxGen": b.generations,
                         "MaxFaults": b.faults}, spec.invariants, spec.properties)


__all__ = [
    "ACTIONS",
    "INVARIANTS",
    "JOURNAL_STEPS",
    "KINDS",
    "PROPERTIES",
    "STAGED",
    "StBounds",
    "StExploration",
    "StState",
    "StagedSpec",
    "explore_staged",
    "staged_config",
    "staged_module",
]
