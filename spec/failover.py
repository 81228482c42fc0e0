"""Controller failover: controllers with epochs, leadership by lease, a shared journal
that only the leader of the current epoch can append to, and fencing where the effect
happens. TLA+ module ``RolloutCoreFailover`` is generated from this table.

Theory of operation
-------------------
Several controller processes can drive one fleet; at most one of them should. Leadership
is a key in the store (etcd) made in a transaction and attached to a lease: a controller
*campaigns* only while no leader key is live, and winning gives it a fresh *epoch*
(strictly greater than every epoch before it: the key's revision). A leader key lives
until its lease expires, which happens only once its holder has stopped renewing it: the
holder crashed, stepped down, or is frozen (a GC pause, SIGSTOP, a partition). The lease
alone is not mutual exclusion: a frozen leader that thaws carries on with the step it was
in, not knowing that a successor was elected meanwhile (a *zombie*), and an effect it sent
before it froze may land on an engine any time later. Two mechanisms make that harmless,
and both are checked where the effect happens, never by the sender:

* **The journal** is appended to only in a transaction that compares the leader key's
  revision with the writer's epoch (etcd's election does the same): a deposed
  controller's append is refused, so the journal is one history with one writer per
  epoch, in epoch order, and never forks (``JournalOneWriterPerEpoch``). Admissions are
  appends too: a deposed controller admits nothing.
* **Engines are fenced.** A new leader first raises every engine's *fence* to its epoch
  (``fence``: our worker extension's fencing token); the code that mutates weights (our
  worker extension's reload and our weight-transfer backend) refuses an effect whose
  epoch is below the engine's fence (``NoDeposedEffectLands``), so nothing a deposed
  controller sent can change an engine a newer epoch fenced.

vLLM's own routes (pause, resume, the label) cannot check an epoch. They need not: the
model lets a deposed controller's pause, resume and relabel land at any time, and every
invariant still holds, because none of them grants anything. Admissions are decided by
the journal (the current leader's own verified record), not by an engine's run state, so
a resumed engine serves no rollout that the current leader did not admit; a label is
never trusted alone (an audit that finds a label that is not the committed one closes the
engine until it is verified again), and the weights a rollout is bound to are the ones
the fenced mutation path installed.

After its fences, a new leader recovers each engine from the journal as the single-engine
restart actions do: an engine whose journal shows no update in progress and whose weights
are the committed generation's is verified (``verify``: the restart to READY, then
relabel, resume, ``ready``); one in doubt (an update begun and not concluded) that holds
the committed weights is re-admitted without a mutation (``readmit``: TAINTED, then
verified re-admission); one holding other weights is re-installed onto the committed
generation by the same fenced path (``repair``). A controller waiting for
an effect that did not answer (``reply``: the effect left the wire, landed or not) cannot
tell whether it landed: the engine is checked again before anything else.

The update cycle per engine is the single-engine one reduced to what failover changes:
request (admissions close, the journal names the target), drain, pause, mutate (fenced),
validate (the journal commits the target only once the engine holds it), relabel,
resume, ready; rollouts are admitted on an engine only while the current leader's own
record says it serves (``admit``), and end at any time (``release``).

Every effect may land at once or stay on the wire (``d`` = FALSE: the sender waits,
``deliver`` lands it later, in any order); controllers crash, freeze and thaw at any
step, leases expire once their holder stopped renewing them, and a controller that finds
it no longer holds the leader key (an append refused, or its own clock) stands down
(``deposed``).

Invariants: no rollout crosses a mutation, the journal's serving engines hold the
committed weights, and a controller that is neither frozen nor a zombie holds the leader
key (``LeaseHeldWhileActing``: the one property that rests on the lease's timing; with
the lease broken (mutant ``takeover_before_lease_expired``) it fails and every other
property still holds, which is what fencing buys).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, NamedTuple, TypeVar

from rolloutcore.spec.graph import GraphExploration, explore_graph
from rolloutcore.spec.lifecycle import Fairness

T = TypeVar("T")
STANDBY, LEAD, AWAIT = "standby", "lead", "await"
#: What a controller believes it must do next with each engine (``none``: standby).
VIEWS = ("none", "fence", "check", "pause", "mutate", "validate", "relabel", "resume",
         "ready", "serving", "drain")
#: Effects on an engine that its own code (ours) gates by epoch; the rest are vLLM's routes.
FENCED_KINDS = frozenset({"mutate"})


class Ctl(NamedTuple):
    pc: str  # standby, lead, await (an effect sent, its reply awaited)
    epoch: int  # the epoch it was elected in (0: standby)
    frozen: bool
    zombie: bool  # thawed after its leader key expired (it does not know yet)
    view: tuple[str, ...]  # per engine, see VIEWS
    on: int  # the engine whose reply it awaits (0: none)


class Jrn(NamedTuple):
    """The shared journal, as far as the model needs it: the epoch of its last append, and
    per engine the committed generation, the target of an update in progress (0: none)
    and the epoch whose leader last verified it serving (0: not serving)."""

    epoch: int
    committed: tuple[int, ...]
    target: tuple[int, ...]
    serve: tuple[int, ...]


class Eng(NamedTuple):
    weights: int  # the generation whose weights it holds
    label: int  # the version it reports (vLLM's weight_version)
    paused: bool
    seen: int  # its fence: the highest epoch it has accepted
    by: int  # the epoch of the last fenced effect it accepted


Msg = tuple[str, int, int, int]  # (kind, epoch, engine, generation) on the wire


class FoState(NamedTuple):
    leader: int  # the controller whose leader key is live (0: none)
    lepoch: int  # that key's epoch (0: none)
    issued: int  # the last epoch issued
    ctl: tuple[Ctl, ...]
    jrn: Jrn
    eng: tuple[Eng, ...]
    bound: tuple[int, ...]  # per engine, the generation of the rollout bound (0: none)
    net: frozenset[Msg]


@dataclass(frozen=True)
class FoBounds:
    controllers: int = 2
    engines: int = 1
    epochs: int = 2  # elections at most (one takeover)
    generations: int = 2

    def __post_init__(self) -> None:
        if min(self.controllers, self.engines, self.epochs, self.generations) < 1:
            raise ValueError(f"failover bounds out of range: {self}")


# --------------------------------------------------------------------------- helpers


def standby(b: FoBounds) -> Ctl:
    return Ctl(STANDBY, 0, False, False, ("none",) * b.engines, 0)


def leads(f: FoState, c: int) -> bool:
    """Controller ``c`` holds the live leader key of its epoch (the journal's compare)."""
    return f.leader == c and f.lepoch == f.ctl[c - 1].epoch


def acting(f: FoState, c: int) -> bool:
    k = f.ctl[c - 1]
    return k.pc == LEAD and not k.frozen


#: The fleet journal's records of a takeover and the failover spec's actions they stand
#: for: a new leader's campaign (an epoch above every earlier one) and its fence of every
#: engine (accepted, or refused by a newer fence); a later fence of an engine its
#: takeover could not reach. Neither changes a fleet variable of the fleet spec.
FLEET_JOURNAL_STEPS: dict[str, tuple[str, ...]] = {
    "fleet_takeover": ("campaign", "fence", "fence_refused"),
    "fleet_fenced": ("fence",),
}


def succeeds(epoch: int, previous: int | None) -> bool:
    """A campaign's epoch is above every earlier leader's (``previous``, None before the
    first): one writer per epoch, in epoch order, so the journal never forks."""
    return previous is None or epoch > previous


def accepts(epoch: int, seen: int) -> bool:
    """The engine-side rule of a fenced effect: its epoch is at least the engine's fence.
    Every gate that performs an effect (worker extension, transfer backend, simulator)
    decides with this function."""
    return epoch >= seen


def _set(t: tuple[T, ...], i: int, v: T) -> tuple[T, ...]:
    return (*t[:i], v, *t[i + 1:])


def _ctl(f: FoState, c: int, **kw: Any) -> FoState:
    return f._replace(ctl=_set(f.ctl, c - 1, f.ctl[c - 1]._replace(**kw)))


def _view(f: FoState, c: int, e: int, v: str) -> FoState:
    k = f.ctl[c - 1]
    return _ctl(f, c, view=_set(k.view, e - 1, v))


def _eng(f: FoState, e: int, **kw: Any) -> FoState:
    return f._replace(eng=_set(f.eng, e - 1, f.eng[e - 1]._replace(**kw)))


def _append(f: FoState, c: int, **kw: tuple[int, ...]) -> FoState:
    """A journal append by ``c``: the changed fields, stamped with its epoch."""
    return f._replace(jrn=f.jrn._replace(epoch=f.ctl[c - 1].epoch, **kw))


def _jset(f: FoState, name: str, e: int, v: int) -> tuple[int, ...]:
    return _set(getattr(f.jrn, name), e - 1, v)


def _msg_effect(sp: FailoverSpec, f: FoState, m: Msg) -> FoState:
    """Effect ``m`` landing on its engine: a fenced kind only if the spec's gate accepts
    its epoch against the engine's fence."""
    kind, epoch, e, gen = m
    if kind == "mutate":
        if not sp.accepts(epoch, f.eng[e - 1].seen):
            return f
        return _eng(f, e, weights=gen, seen=epoch, by=epoch)
    if kind == "pause":
        return _eng(f, e, paused=True)
    if kind == "resume":
        return _eng(f, e, paused=False)
    return _eng(f, e, label=gen)  # relabel


def _stall(f: FoState, c: int, m: Msg) -> FoState:
    """``c`` sent ``m`` and waits: the effect is on the wire."""
    return _ctl(f._replace(net=f.net | {m}), c, pc=AWAIT, on=m[2])


def _to_standby(f: FoState, c: int, sp: FailoverSpec) -> FoState:
    return f._replace(ctl=_set(f.ctl, c - 1, standby(sp.bounds)))


# --------------------------------------------------------------------------- actions

Param = tuple[object, ...]


@dataclass(frozen=True)
class FoAction:
    """One action: ``params`` its parameter tuples in a state (names ``tla_params``),
    ``when`` its guard, ``apply`` its effect; ``tla`` its TLA+ body over the same names."""

    name: str
    doc: str
    tla_params: tuple[str, ...]  # c (controller), e (engine), d (BOOLEAN), m (message)
    when: Callable[[FoState, FailoverSpec, Param], bool]
    apply: Callable[[FoState, FailoverSpec, Param], FoState]
    tla: str
    appends: bool = False  # a journal append: guarded by the leader key's compare


def _mutate_msg(f: FoState, c: int, e: int) -> Msg:
    return ("mutate", f.ctl[c - 1].epoch, e, f.jrn.target[e - 1])


def _send(kind: str, v_from: str, v_to: str, gen: Callable[[FoState, int], int],
          doc: str, landed_tla: str) -> FoAction:
    """A send of an unfenced effect (a vLLM route): it lands now (``d``) or stays on the
    wire while the sender waits."""
    def apply(f: FoState, sp: FailoverSpec, p: Param) -> FoState:
        c, e, d = p
        assert isinstance(c, int) and isinstance(e, int)
        m: Msg = (kind, f.ctl[c - 1].epoch, e, gen(f, e))
        if d:
            return _view(_msg_effect(sp, f, m), c, e, v_to)
        return _stall(f, c, m)

    gen_tla = {"relabel": "jrn.committed[e]"}.get(kind, "0")
    return FoAction(
        kind, doc, ("c", "e", "d"),
        lambda f, _b, p: _view_is(f, p, v_from),
        apply,
        f'/\\ Acting(c) /\\ ctl[c].view[e] = "{v_from}"\n'
        f'    /\\ IF d THEN /\\ {landed_tla}\n'
        f'                /\\ ctl\' = SetView(c, e, "{v_to}")\n'
        f'                /\\ UNCHANGED <<net>>\n'
        f'           ELSE /\\ net\' = net \\cup {{<<"{kind}", ctl[c].epoch, e, {gen_tla}>>}}\n'
        f'                /\\ ctl\' = Await(c, e)\n'
        f'                /\\ UNCHANGED <<eng>>\n'
        f'    /\\ UNCHANGED <<leader, lepoch, issued, jrn, bound>>')


def _p(*names: str) -> Callable[[FoState, FoBounds], Iterable[Param]]:
    def params(f: FoState, b: FoBounds) -> Iterable[Param]:
        out: list[Param] = [()]
        for n in names:
            dom: Iterable[object] = {"c": range(1, b.controllers + 1),
                                     "e": range(1, b.engines + 1),
                                     "d": (True, False), "m": sorted(f.net)}[n]
            out = [(*p, v) for p in out for v in dom]
        return out
    return params


def _campaign(f: FoState, sp: FailoverSpec, p: Param, first: str = "fence") -> FoState:
    c = p[0]
    assert isinstance(c, int)
    ep = f.issued + 1
    f = f._replace(leader=c, lepoch=ep, issued=ep)
    return f._replace(ctl=_set(f.ctl, c - 1, Ctl(LEAD, ep, False, False,
                                                 (first,) * sp.bounds.engines, 0)))


def _c(p: Param) -> int:
    c = p[0]
    assert isinstance(c, int)
    return c


def _ce(p: Param) -> tuple[int, int]:
    c, e = p[0], p[1]
    assert isinstance(c, int) and isinstance(e, int)
    return c, e


def _view_is(f: FoState, p: Param, v: str) -> bool:
    c, e = _ce(p)
    return acting(f, c) and f.ctl[c - 1].view[e - 1] == v


def _matches(f: FoState, e: int) -> bool:
    """The engine holds, and reports, the journal's committed generation."""
    g = f.jrn.committed[e - 1]
    return f.eng[e - 1].weights == g and f.eng[e - 1].label == g


ACTIONS: tuple[FoAction, ...] = (
    FoAction(
        "campaign",
        "A standby controller finds no live leader key and creates it in a transaction "
        "with its lease: it leads with a fresh epoch, and must fence every engine first.",
        ("c",),
        lambda f, sp, p: f.ctl[_c(p) - 1].pc == STANDBY and f.leader == 0
        and f.issued < sp.bounds.epochs,
        _campaign,
        '/\\ ctl[c].pc = "standby" /\\ leader = 0 /\\ issued < MaxEpoch\n'
        "    /\\ leader' = c /\\ lepoch' = issued + 1 /\\ issued' = issued + 1\n"
        '    /\\ ctl\' = [ctl EXCEPT ![c] = [pc |-> "lead", epoch |-> issued + 1, '
        'frozen |-> FALSE,\n'
        '                zombie |-> FALSE, view |-> [x \\in Engines |-> "fence"], on |-> 0]]\n'
        "    /\\ UNCHANGED <<jrn, eng, bound, net>>"),
    FoAction(
        "fence",
        "The leader raises an engine's fence to its epoch (accepted: the engine's fence "
        "was not above it); from then on the engine refuses every fenced effect from an "
        "older epoch.",
        ("c", "e"),
        lambda f, sp, p: _view_is(f, p, "fence")
        and sp.accepts(f.ctl[_c(p) - 1].epoch, f.eng[_ce(p)[1] - 1].seen),
        lambda f, _b, p: _view(_eng(f, _ce(p)[1], seen=f.ctl[_c(p) - 1].epoch),
                               *_ce(p), "check"),
        '/\\ Acting(c) /\\ ctl[c].view[e] = "fence" /\\ Accepts(ctl[c].epoch, eng[e].seen)\n'
        "    /\\ eng' = [eng EXCEPT ![e].seen = ctl[c].epoch]\n"
        '    /\\ ctl\' = SetView(c, e, "check")\n'
        "    /\\ UNCHANGED <<leader, lepoch, issued, jrn, bound, net>>"),
    FoAction(
        "fence_refused",
        "The engine's fence is above the controller's epoch: a newer leader fenced it, so "
        "this controller is deposed and stands down.",
        ("c", "e"),
        lambda f, sp, p: _view_is(f, p, "fence")
        and not sp.accepts(f.ctl[_c(p) - 1].epoch, f.eng[_ce(p)[1] - 1].seen),
        lambda f, sp, p: _to_standby(f, _c(p), sp),
        '/\\ Acting(c) /\\ ctl[c].view[e] = "fence" /\\ ~Accepts(ctl[c].epoch, eng[e].seen)\n'
        "    /\\ ctl' = [ctl EXCEPT ![c] = Standby]\n"
        "    /\\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>"),
    FoAction(
        "verify",
        "A fenced engine with no update in progress in the journal and the committed "
        "weights (the single-engine restart to READY): relabel if its label differs, then "
        "resume.",
        ("c", "e"),
        lambda f, _b, p: _view_is(f, p, "check") and f.jrn.target[_ce(p)[1] - 1] == 0
        and f.eng[_ce(p)[1] - 1].weights == f.jrn.committed[_ce(p)[1] - 1],
        lambda f, _b, p: _view(f, *_ce(p), "resume" if _matches(f, _ce(p)[1]) else "relabel"),
        '/\\ Acting(c) /\\ ctl[c].view[e] = "check" /\\ jrn.target[e] = 0\n'
        "    /\\ eng[e].weights = jrn.committed[e]\n"
        '    /\\ ctl\' = SetView(c, e, IF Matches(e) THEN "resume" ELSE "relabel")\n'
        "    /\\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>"),
    FoAction(
        "readmit",
        "A fenced engine in doubt (an update in progress in the journal) that holds the "
        "committed weights (the restart to TAINTED, then verified re-admission without a "
        "mutation): the journal ends the update; relabel if needed, then resume.",
        ("c", "e"),
        lambda f, _b, p: _view_is(f, p, "check") and f.jrn.target[_ce(p)[1] - 1] != 0
        and f.eng[_ce(p)[1] - 1].weights == f.jrn.committed[_ce(p)[1] - 1],
        lambda f, _b, p: _view(_append(f, _c(p), target=_jset(f, "target", _ce(p)[1], 0)),
                               *_ce(p), "resume" if _matches(f, _ce(p)[1]) else "relabel"),
        '/\\ Acting(c) /\\ ctl[c].view[e] = "check" /\\ jrn.target[e] # 0\n'
        "    /\\ eng[e].weights = jrn.committed[e]\n"
        "    /\\ jrn' = Append(c, [jrn EXCEPT !.target[e] = 0])\n"
        '    /\\ ctl\' = SetView(c, e, IF Matches(e) THEN "resume" ELSE "relabel")\n'
        "    /\\ UNCHANGED <<leader, lepoch, issued, eng, bound, net>>",
        appends=True),
    FoAction(
        "repair",
        "A fenced engine that holds other weights than committed (the restart to TAINTED, "
        "then re-admission by a mutation): the journal names the committed generation as "
        "its target and the engine is re-installed by the fenced path.",
        ("c", "e"),
        lambda f, _b, p: _view_is(f, p, "check")
        and f.eng[_ce(p)[1] - 1].weights != f.jrn.committed[_ce(p)[1] - 1],
        lambda f, _b, p: _view(_append(f, _c(p), target=_jset(
            f, "target", _ce(p)[1], f.jrn.committed[_ce(p)[1] - 1])), *_ce(p), "pause"),
        '/\\ Acting(c) /\\ ctl[c].view[e] = "check" /\\ eng[e].weights # jrn.committed[e]\n'
        "    /\\ jrn' = Append(c, [jrn EXCEPT !.target[e] = jrn.committed[e]])\n"
        '    /\\ ctl\' = SetView(c, e, "pause")\n'
        "    /\\ UNCHANGED <<leader, lepoch, issued, eng, bound, net>>",
        appends=True),
    _send("relabel", "relabel", "resume", lambda f, e: f.jrn.committed[e - 1],
          "The leader sets the engine's label to the committed generation (vLLM's route: "
          "no epoch).", "eng' = [eng EXCEPT ![e].label = jrn.committed[e]]"),
    _send("resume", "resume", "ready", lambda _f, _e: 0,
          "The leader resumes the engine (vLLM's route: no epoch).",
          "eng' = [eng EXCEPT ![e].paused = FALSE]"),
    FoAction(
        "ready",
        "The journal records the engine as serving, verified by this epoch's leader.",
        ("c", "e"),
        lambda f, _b, p: _view_is(f, p, "ready"),
        lambda f, _b, p: _view(_append(f, _c(p), serve=_jset(
            f, "serve", _ce(p)[1], f.ctl[_c(p) - 1].epoch)), *_ce(p), "serving"),
        '/\\ Acting(c) /\\ ctl[c].view[e] = "ready"\n'
        "    /\\ jrn' = Append(c, [jrn EXCEPT !.serve[e] = ctl[c].epoch])\n"
        '    /\\ ctl\' = SetView(c, e, "serving")\n'
        "    /\\ UNCHANGED <<leader, lepoch, issued, eng, bound, net>>",
        appends=True),
    FoAction(
        "admit",
        "A rollout is admitted on an engine the leader itself verified serving (an append: "
        "a deposed controller admits nothing), bound to the committed generation.",
        ("c", "e"),
        lambda f, _b, p: _view_is(f, p, "serving") and f.bound[_ce(p)[1] - 1] == 0
        and f.jrn.serve[_ce(p)[1] - 1] == f.ctl[_c(p) - 1].epoch,
        lambda f, _b, p: _append(f, _c(p))._replace(
            bound=_set(f.bound, _ce(p)[1] - 1, f.jrn.committed[_ce(p)[1] - 1])),
        '/\\ Acting(c) /\\ ctl[c].view[e] = "serving" /\\ bound[e] = 0\n'
        "    /\\ jrn.serve[e] = ctl[c].epoch\n"
        "    /\\ jrn' = Append(c, jrn)\n"
        "    /\\ bound' = [bound EXCEPT ![e] = jrn.committed[e]]\n"
        "    /\\ UNCHANGED <<leader, lepoch, issued, ctl, eng, net>>",
        appends=True),
    FoAction(
        "release",
        "A rollout ends (whoever admitted it).",
        ("e",),
        lambda f, _b, p: f.bound[_c(p) - 1] != 0,
        lambda f, _b, p: f._replace(bound=_set(f.bound, _c(p) - 1, 0)),
        "/\\ bound[e] # 0\n"
        "    /\\ bound' = [bound EXCEPT ![e] = 0]\n"
        "    /\\ UNCHANGED <<leader, lepoch, issued, ctl, jrn, eng, net>>"),
    FoAction(
        "audit",
        "The leader reads a serving engine again and finds other weights or another label "
        "than committed: it closes it (an append) and checks it anew.",
        ("c", "e"),
        lambda f, _b, p: _view_is(f, p, "serving") and not _matches(f, _ce(p)[1]),
        lambda f, _b, p: _view(_append(f, _c(p), serve=_jset(f, "serve", _ce(p)[1], 0)),
                               *_ce(p), "check"),
        '/\\ Acting(c) /\\ ctl[c].view[e] = "serving" /\\ ~Matches(e)\n'
        "    /\\ jrn' = Append(c, [jrn EXCEPT !.serve[e] = 0])\n"
        '    /\\ ctl\' = SetView(c, e, "check")\n'
        "    /\\ UNCHANGED <<leader, lepoch, issued, eng, bound, net>>",
        appends=True),
    FoAction(
        "request",
        "The leader starts an update of a serving engine: admissions close on it and the "
        "journal names the next generation as its target.",
        ("c", "e"),
        lambda f, sp, p: _view_is(f, p, "serving")
        and f.jrn.committed[_ce(p)[1] - 1] < sp.bounds.generations,
        lambda f, _b, p: _view(_append(
            f, _c(p), serve=_jset(f, "serve", _ce(p)[1], 0),
            target=_jset(f, "target", _ce(p)[1], f.jrn.committed[_ce(p)[1] - 1] + 1)),
            *_ce(p), "drain"),
        '/\\ Acting(c) /\\ ctl[c].view[e] = "serving" /\\ jrn.committed[e] < MaxGen\n'
        "    /\\ jrn' = Append(c, [jrn EXCEPT !.serve[e] = 0, "
        "!.target[e] = jrn.committed[e] + 1])\n"
        '    /\\ ctl\' = SetView(c, e, "drain")\n'
        "    /\\ UNCHANGED <<leader, lepoch, issued, eng, bound, net>>",
        appends=True),
    FoAction(
        "drained",
        "No rollout is bound on the engine any more.",
        ("c", "e"),
        lambda f, _b, p: _view_is(f, p, "drain") and f.bound[_ce(p)[1] - 1] == 0,
        lambda f, _b, p: _view(f, *_ce(p), "pause"),
        '/\\ Acting(c) /\\ ctl[c].view[e] = "drain" /\\ bound[e] = 0\n'
        '    /\\ ctl\' = SetView(c, e, "pause")\n'
        "    /\\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>"),
    _send("pause", "pause", "mutate", lambda _f, _e: 0,
          "The leader pauses the engine (vLLM's route: no epoch).",
          "eng' = [eng EXCEPT ![e].paused = TRUE]"),
    FoAction(
        "mutate",
        "The leader installs the journal's target through the fenced path, with its "
        "epoch: it lands now (accepted if the engine's fence allows it; refused: this "
        "controller is deposed) or stays on the wire while the sender waits.",
        ("c", "e", "d"),
        lambda f, _b, p: _view_is(f, p, "mutate") and f.jrn.target[_ce(p)[1] - 1] != 0,
        lambda f, sp, p: _mutate(f, sp, p),
        '/\\ Acting(c) /\\ ctl[c].view[e] = "mutate" /\\ jrn.target[e] # 0\n'
        '    /\\ LET m == <<"mutate", ctl[c].epoch, e, jrn.target[e]>> IN\n'
        "       IF ~d THEN /\\ net' = net \\cup {m}\n"
        "                  /\\ ctl' = Await(c, e)\n"
        "                  /\\ UNCHANGED <<eng>>\n"
        "       ELSE IF Accepts(ctl[c].epoch, eng[e].seen)\n"
        "            THEN /\\ eng' = Land(m)\n"
        '                 /\\ ctl\' = SetView(c, e, "validate")\n'
        "                 /\\ UNCHANGED <<net>>\n"
        "            ELSE /\\ ctl' = [ctl EXCEPT ![c] = Standby]\n"
        "                 /\\ UNCHANGED <<eng, net>>\n"
        "    /\\ UNCHANGED <<leader, lepoch, issued, jrn, bound>>"),
    FoAction(
        "validate",
        "The engine holds the target's weights: the journal commits the target.",
        ("c", "e"),
        lambda f, _b, p: _view_is(f, p, "validate") and f.jrn.target[_ce(p)[1] - 1] != 0
        and f.eng[_ce(p)[1] - 1].weights == f.jrn.target[_ce(p)[1] - 1],
        lambda f, _b, p: _view(_append(
            f, _c(p), committed=_jset(f, "committed", _ce(p)[1], f.jrn.target[_ce(p)[1] - 1]),
            target=_jset(f, "target", _ce(p)[1], 0)), *_ce(p), "relabel"),
        '/\\ Acting(c) /\\ ctl[c].view[e] = "validate" /\\ jrn.target[e] # 0\n'
        "    /\\ eng[e].weights = jrn.target[e]\n"
        "    /\\ jrn' = Append(c, [jrn EXCEPT !.committed[e] = jrn.target[e], "
        "!.target[e] = 0])\n"
        '    /\\ ctl\' = SetView(c, e, "relabel")\n'
        "    /\\ UNCHANGED <<leader, lepoch, issued, eng, bound, net>>",
        appends=True),
    FoAction(
        "reply",
        "The effect a controller waits for has left the wire (landed or refused); it "
        "cannot tell which, so it checks the engine again.",
        ("c",),
        lambda f, _b, p: f.ctl[_c(p) - 1].pc == AWAIT and not f.ctl[_c(p) - 1].frozen
        and not any(m[1] == f.ctl[_c(p) - 1].epoch and m[2] == f.ctl[_c(p) - 1].on
                    for m in f.net),
        lambda f, _b, p: _ctl(_view(f, _c(p), f.ctl[_c(p) - 1].on, "check"), _c(p),
                              pc=LEAD, on=0),
        '/\\ ctl[c].pc = "await" /\\ ~ctl[c].frozen\n'
        "    /\\ \\A m \\in net : m[2] # ctl[c].epoch \\/ m[3] # ctl[c].on\n"
        '    /\\ ctl\' = [ctl EXCEPT ![c].pc = "lead", ![c].on = 0, '
        '![c].view[ctl[c].on] = "check"]\n'
        "    /\\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>"),
    FoAction(
        "deliver",
        "An effect on the wire lands on its engine, at any later time and in any order "
        "(a fenced one only if its epoch is at least the engine's fence).",
        ("m",),
        lambda f, _b, p: p[0] in f.net,
        lambda f, sp, p: _msg_effect(sp, f, p[0])._replace(net=f.net - {p[0]}),  # type: ignore[arg-type]
        "/\\ m \\in net\n"
        "    /\\ eng' = Land(m)\n"
        "    /\\ net' = net \\ {m}\n"
        "    /\\ UNCHANGED <<leader, lepoch, issued, ctl, jrn, bound>>"),
    FoAction(
        "freeze",
        "A controller stops in the middle of whatever it was doing (a GC pause, SIGSTOP, "
        "a partition).",
        ("c",),
        lambda f, _b, p: f.ctl[_c(p) - 1].pc != STANDBY and not f.ctl[_c(p) - 1].frozen,
        lambda f, _b, p: _ctl(f, _c(p), frozen=True),
        '/\\ ctl[c].pc # "standby" /\\ ~ctl[c].frozen\n'
        "    /\\ ctl' = [ctl EXCEPT ![c].frozen = TRUE]\n"
        "    /\\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>"),
    FoAction(
        "thaw",
        "A frozen controller goes on with the step it was in; if its leader key expired "
        "meanwhile it is a zombie (it does not know yet).",
        ("c",),
        lambda f, _b, p: f.ctl[_c(p) - 1].frozen,
        lambda f, _b, p: _ctl(f, _c(p), frozen=False, zombie=not leads(f, _c(p))),
        "/\\ ctl[c].frozen\n"
        "    /\\ ctl' = [ctl EXCEPT ![c].frozen = FALSE, ![c].zombie = ~Leads(c)]\n"
        "    /\\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>"),
    FoAction(
        "expire",
        "The leader key's lease expires: its holder stopped renewing it (crashed, stood "
        "down, or frozen past the lease).",
        (),
        lambda f, _b, _p: f.leader != 0 and (f.ctl[f.leader - 1].frozen
                                             or f.ctl[f.leader - 1].pc == STANDBY),
        lambda f, _b, _p: f._replace(leader=0, lepoch=0),
        '/\\ leader # 0 /\\ (ctl[leader].frozen \\/ ctl[leader].pc = "standby")\n'
        "    /\\ leader' = 0 /\\ lepoch' = 0\n"
        "    /\\ UNCHANGED <<issued, ctl, jrn, eng, bound, net>>"),
    FoAction(
        "crash",
        "A controller process dies (kill -9) and is restarted as a standby; its effects "
        "on the wire may still land, and its key lives until its lease expires.",
        ("c",),
        lambda f, _b, p: f.ctl[_c(p) - 1].pc != STANDBY,
        lambda f, sp, p: _to_standby(f, _c(p), sp),
        '/\\ ctl[c].pc # "standby"\n'
        "    /\\ ctl' = [ctl EXCEPT ![c] = Standby]\n"
        "    /\\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>"),
    FoAction(
        "deposed",
        "A controller that no longer holds the leader key of its epoch finds out (an "
        "append refused by the compare, or its own lease clock) and stands down.",
        ("c",),
        lambda f, _b, p: acting(f, _c(p)) and not leads(f, _c(p)),
        lambda f, sp, p: _to_standby(f, _c(p), sp),
        "/\\ Acting(c) /\\ ~Leads(c)\n"
        "    /\\ ctl' = [ctl EXCEPT ![c] = Standby]\n"
        "    /\\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>"),
)


def _mutate(f: FoState, sp: FailoverSpec, p: Param) -> FoState:
    c, e = _ce(p)
    m = _mutate_msg(f, c, e)
    if not p[2]:
        return _stall(f, c, m)
    if sp.accepts(m[1], f.eng[e - 1].seen):
        return _view(_msg_effect(sp, f, m), c, e, "validate")
    return _to_standby(f, c, sp)


# ------------------------------------------------------------------------ properties


@dataclass(frozen=True)
class FoInvariant:
    name: str
    doc: str
    tla: str
    holds: Callable[[FoState], bool]


@dataclass(frozen=True)
class FoActionProperty:
    name: str
    doc: str
    tla: str
    holds: Callable[[FoState, FoState], bool]


INVARIANTS: tuple[FoInvariant, ...] = (
    FoInvariant(
        "NoRolloutCrossesMutation",
        "A rollout bound on an engine runs on the weights it was admitted under, whoever "
        "leads and whatever a deposed controller sent.",
        "\\A e \\in Engines : bound[e] # 0 => eng[e].weights = bound[e]",
        lambda f: all(b == 0 or s.weights == b for b, s in zip(f.bound, f.eng, strict=True))),
    FoInvariant(
        "ServingHoldsCommitted",
        "An engine the journal records as serving holds the weights the journal "
        "committed for it.",
        "\\A e \\in Engines : jrn.serve[e] # 0 => eng[e].weights = jrn.committed[e]",
        lambda f: all(v == 0 or s.weights == g
                      for v, s, g in zip(f.jrn.serve, f.eng, f.jrn.committed, strict=True))),
    FoInvariant(
        "LeaseHeldWhileActing",
        "A controller that acts and is neither frozen nor a zombie holds the live leader "
        "key of its epoch (at most one such controller: the lease's promise, which rests "
        "on its timing; nothing else here does).",
        '\\A c \\in Ctls : (ctl[c].pc # "standby" /\\ ~ctl[c].frozen /\\ ~ctl[c].zombie) '
        "=> Leads(c)",
        lambda f: all(k.pc == STANDBY or k.frozen or k.zombie or leads(f, c)
                      for c, k in enumerate(f.ctl, 1))),
)

ACTION_PROPERTIES: tuple[FoActionProperty, ...] = (
    FoActionProperty(
        "JournalOneWriterPerEpoch",
        "Every append is made by the holder of the live leader key, stamped with its "
        "epoch, and epochs never go back: one writer per epoch, one history, no fork.",
        "jrn' # jrn => (leader # 0 /\\ jrn'.epoch = lepoch /\\ jrn'.epoch >= jrn.epoch)",
        lambda f, g: g.jrn == f.jrn or (f.leader != 0 and g.jrn.epoch == f.lepoch
                                         and g.jrn.epoch >= f.jrn.epoch)),
    FoActionProperty(
        "NoDeposedEffectLands",
        "A fenced effect (a mutation) lands on an engine only from an epoch at least the "
        "engine's fence: nothing from a deposed epoch changes an engine a newer epoch "
        "fenced.",
        "\\A e \\in Engines : eng'[e].by # eng[e].by \\/ eng'[e].weights # eng[e].weights\n"
        "        => eng'[e].by >= eng[e].seen",
        lambda f, g: all(t.by >= s.seen for s, t in zip(f.eng, g.eng, strict=True)
                         if t.by != s.by or t.weights != s.weights)),
    FoActionProperty(
        "FencesOnlyRise",
        "An engine's fence never goes down.",
        "\\A e \\in Engines : eng'[e].seen >= eng[e].seen",
        lambda f, g: all(t.seen >= s.seen for s, t in zip(f.eng, g.eng, strict=True))),
)


# ---------------------------------------------------------------------------- the spec


# ---------------------------------------------------------------------------- liveness


@dataclass(frozen=True)
class FoLiveness:
    """``when ~> then`` under the failover fairness; a controller property
    (``per_controller``) holds for every controller ``c`` (from 1, as in TLA+, where it
    reads ``\\A c \\in Ctls : when ~> then``)."""

    name: str
    doc: str
    #: Over a state, a controller (a controller property's; else 1) and the bounds.
    when: Callable[[FoState, int, FoBounds], bool]
    then: Callable[[FoState, int, FoBounds], bool]
    when_tla: str
    then_tla: str
    per_controller: bool = False


#: Controller steps that are not the controller's own decision: a client's admission, the
#: operator's audit, the trainer's request, and what happens to a controller (it freezes,
#: thaws, crashes). Not fair.
NOT_OWN_STEPS = frozenset({"admit", "audit", "request", "freeze", "thaw", "crash"})
#: Fairness of every controller ``c``: it takes one of its own steps when one is enabled
#: again and again (strong: another controller's steps, or its own freezes, disable them
#: for a while); a frozen controller thaws (weak: a GC pause, a SIGSTOP, a partition end).
#: Not assumed: that it never freezes or crashes again, or that clients, the operator or
#: the trainer do anything.
FO_CONTROLLER_FAIRNESS: tuple[Fairness, ...] = (
    Fairness("ControllerMoves",
             "A controller takes one of its own steps (campaign, fence, recovery, the "
             "update's steps, its effects' sends and replies) whenever one is enabled "
             "again and again.",
             frozenset(a.name for a in ACTIONS if "c" in a.tla_params
                       and a.name not in NOT_OWN_STEPS | {"deposed"}),
             strong=True),
    Fairness("LeaseClockRunsOut",
             "A controller whose key is gone finds out (its own lease clock, or an append "
             "refused) whenever it acts again and again: a class of its own, or a zombie "
             "that keeps verifying and resuming (none of them an append) never would.",
             frozenset({"deposed"}), strong=True),
    Fairness("PausesEnd", "A frozen controller thaws.", frozenset({"thaw"})),
)
FO_FAIRNESS: tuple[Fairness, ...] = (
    Fairness("LeasesExpire", "A lease whose holder stopped renewing it expires.",
             frozenset({"expire"})),
)
#: Fairness of every epoch: an effect it sent lands (the network delivers, late). One class
#: per epoch, or a leader's effects that keep landing would starve a zombie's, which it
#: waits for before it can find out it was deposed.
FO_EPOCH_FAIRNESS: tuple[Fairness, ...] = (
    Fairness("EffectsLand", "An effect an epoch sent lands (the network delivers, late).",
             frozenset({"deliver"}), strong=True),
)
FO_LIVENESS: tuple[FoLiveness, ...] = (
    FoLiveness(
        "KeyFreedWhenHolderStops",
        "A leader key whose holder crashed or froze is freed (its lease expires) unless the "
        "holder comes back first: a dead leader does not hold the fleet for ever.",
        lambda f, _c, _b: f.leader != 0 and (f.ctl[f.leader - 1].pc == STANDBY
                                             or f.ctl[f.leader - 1].frozen),
        lambda f, _c, _b: f.leader == 0 or (f.ctl[f.leader - 1].pc != STANDBY
                                            and not f.ctl[f.leader - 1].frozen),
        'leader # 0 /\\ (ctl[leader].pc = "standby" \\/ ctl[leader].frozen)',
        'leader = 0 \\/ (ctl[leader].pc # "standby" /\\ ~ctl[leader].frozen)'),
    FoLiveness(
        "LeaderElected",
        "With no leader key, a standby up and an election left in the bound, a leader is "
        "elected.",
        lambda f, _c, b: f.leader == 0 and f.issued < b.epochs
        and any(k.pc == STANDBY for k in f.ctl),
        lambda f, _c, _b: f.leader != 0,
        'leader = 0 /\\ issued < MaxEpoch /\\ \\E c \\in Ctls : ctl[c].pc = "standby"',
        "leader # 0"),
    FoLiveness(
        "DeposedStandsDown",
        "A controller that no longer holds the leader key of its epoch stands down (its "
        "appends are refused, its fenced effects too; then it stops sending).",
        lambda f, c, _b: f.ctl[c - 1].pc != STANDBY and not leads(f, c),
        lambda f, c, _b: f.ctl[c - 1].pc == STANDBY,
        '(ctl[c].pc # "standby" /\\ ~Leads(c))', 'ctl[c].pc = "standby"',
        per_controller=True),
)


@dataclass(frozen=True)
class FailoverSpec:
    name: str = "RolloutCoreFailover"
    actions: tuple[FoAction, ...] = ACTIONS
    invariants: tuple[FoInvariant, ...] = INVARIANTS
    action_properties: tuple[FoActionProperty, ...] = ACTION_PROPERTIES
    bounds: FoBounds = field(default_factory=FoBounds)
    #: The engine-side gate of a fenced effect, (Python, TLA+ over ``epoch``, ``seen``).
    gate: tuple[Callable[[int, int], bool], str] = (accepts, "epoch >= seen")
    #: Appends compare the leader key's revision with the writer's epoch.
    compare: bool = True
    fairness: tuple[Fairness, ...] = FO_FAIRNESS
    epoch_fairness: tuple[Fairness, ...] = FO_EPOCH_FAIRNESS
    controller_fairness: tuple[Fairness, ...] = FO_CONTROLLER_FAIRNESS
    liveness: tuple[FoLiveness, ...] = FO_LIVENESS

    def accepts(self, epoch: int, seen: int) -> bool:
        return self.gate[0](epoch, seen)

    def with_bounds(self, bounds: FoBounds) -> FailoverSpec:
        return replace(self, bounds=bounds)

    def replace_action(self, name: str, **changes: Any) -> FailoverSpec:
        if name not in {a.name for a in self.actions}:
            raise KeyError(name)
        return replace(self, actions=tuple(replace(a, **changes) if a.name == name else a
                                           for a in self.actions))

    def action(self, name: str) -> FoAction:
        return next(a for a in self.actions if a.name == name)

    def initial_states(self) -> tuple[FoState, ...]:
        b = self.bounds
        n = b.engines
        return (FoState(0, 0, 0, (standby(b),) * b.controllers,
                        Jrn(0, (1,) * n, (0,) * n, (0,) * n),
                        (Eng(1, 1, False, 0, 0),) * n, (0,) * n, frozenset()),)

    @cached_property
    def _static_params(self) -> tuple[tuple[FoAction, tuple[Param, ...] | None], ...]:
        """Each action with its parameters, computed once (None: they depend on the
        state: a message on the wire)."""
        empty = FoState(0, 0, 0, (), Jrn(0, (), (), ()), (), (), frozenset())
        return tuple((a, None if "m" in a.tla_params else
                      tuple(_p(*a.tla_params)(empty, self.bounds))) for a in self.actions)

    def successors(self, f: FoState) -> list[tuple[str, Param, FoState]]:
        out: list[tuple[str, Param, FoState]] = []
        b = self.bounds
        for a, static in self._static_params:
            for p in static if static is not None else _p(*a.tla_params)(f, b):
                if a.appends and self.compare and not leads(f, _c(p)):
                    continue  # the append's compare refuses it
                if a.when(f, self, p):
                    out.append((a.name, p, a.apply(f, self, p)))
        return out


FAILOVER = FailoverSpec()


#: An exploration of the failover spec.
FoExploration = GraphExploration[FoState]


def explore_failover(spec: FailoverSpec = FAILOVER, *, max_states: int = 2_000_000,
                     stop_at_violation: bool = False, keep_steps: bool = False
                     ) -> FoExploration:
    """Breadth first over every reachable state: invariants in every state, action
    properties on every edge; each property's first violation is a shortest
    counterexample (its action path)."""
    return explore_graph(spec.initial_states(), spec.successors,
                         [a.name for a in spec.actions],
                         [(i.name, i.holds) for i in spec.invariants],
                         [(p.name, p.holds) for p in spec.action_properties],
                         what="failover", max_states=max_states,
                         stop_at_violation=stop_at_violation, keep_steps=keep_steps)


# ------------------------------------------------------------------------------- TLA+

VARIABLES = ("leader", "lepoch", "issued", "ctl", "jrn", "eng", "bound", "net")
#: Parameter domains; a message ranges over every possible one (TLC labels an action
#: whose parameter ranges over a variable as ``Next``).
_DOMAINS = {"c": "Ctls", "e": "Engines", "d": "BOOLEAN", "m": "Msgs"}


def _tla_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def failover_module(spec: FailoverSpec = FAILOVER) -> str:
    parts = [
        f"---------------------------- MODULE {spec.name} ----------------------------",
        "\\* Generated from spec/failover.py by `rolloutcore spec tla`.",
        "\\* Do not edit: change the Python spec and regenerate.",
        "EXTENDS Integers, FiniteSets",
        "",
        "CONSTANTS NumCtl, NumEngines, MaxEpoch, MaxGen",
        "",
        "Ctls == 1..NumCtl",
        "Engines == 1..NumEngines",
        'Msgs == {"mutate", "pause", "resume", "relabel"} \\X (1..MaxEpoch) \\X Engines '
        "\\X (0..MaxGen)",
        "",
        f"VARIABLES {', '.join(VARIABLES)}",
        f"vars == <<{', '.join(VARIABLES)}>>",
        "",
        'Standby == [pc |-> "standby", epoch |-> 0, frozen |-> FALSE, zombie |-> FALSE,',
        '            view |-> [x \\in Engines |-> "none"], on |-> 0]',
        "",
        "Init ==",
        "    /\\ leader = 0 /\\ lepoch = 0 /\\ issued = 0",
        "    /\\ ctl = [c \\in Ctls |-> Standby]",
        "    /\\ jrn = [epoch |-> 0, committed |-> [x \\in Engines |-> 1],",
        "              target |-> [x \\in Engines |-> 0], serve |-> [x \\in Engines |-> 0]]",
        "    /\\ eng = [x \\in Engines |-> [weights |-> 1, label |-> 1, paused |-> FALSE, "
        "seen |-> 0, by |-> 0]]",
        "    /\\ bound = [x \\in Engines |-> 0]",
        "    /\\ net = {}",
        "",
        "\\* The engine-side gate of a fenced effect (spec/failover.py accepts()).",
        f"Accepts(epoch, seen) == {spec.gate[1]}",
        "Leads(c) == leader = c /\\ lepoch = ctl[c].epoch",
        'Acting(c) == ctl[c].pc = "lead" /\\ ~ctl[c].frozen',
        "SetView(c, e, v) == [ctl EXCEPT ![c].view[e] = v]",
        'Await(c, e) == [ctl EXCEPT ![c].pc = "await", ![c].on = e]',
        "Append(c, j) == [j EXCEPT !.epoch = ctl[c].epoch]",
        "Matches(e) == eng[e].weights = jrn.committed[e] /\\ eng[e].label = jrn.committed[e]",
        "\\* Effect m landing on its engine.",
        "Land(m) ==",
        "    LET e == m[3] IN",
        '    CASE m[1] = "mutate" -> IF Accepts(m[2], eng[e].seen)',
        "                           THEN [eng EXCEPT ![e].weights = m[4], ![e].seen = m[2], "
        "![e].by = m[2]]",
        "                           ELSE eng",
        '      [] m[1] = "pause" -> [eng EXCEPT ![e].paused = TRUE]',
        '      [] m[1] = "resume" -> [eng EXCEPT ![e].paused = FALSE]',
        '      [] m[1] = "relabel" -> [eng EXCEPT ![e].label = m[4]]',
        "",
    ]
    for a in spec.actions:
        head = _tla_name(a.name) + (f"({', '.join(a.tla_params)})" if a.tla_params else "")
        guard = "    /\\ Leads(c)\n" if a.appends and spec.compare else ""
        parts.append(f"\\* {a.name}: {a.doc}\n{head} ==\n{guard}    {a.tla}\n")
    disj = []
    for a in spec.actions:
        name = _tla_name(a.name)
        if not a.tla_params:
            disj.append(name)
            continue
        binders = " : ".join(f"\\E {p} \\in {_DOMAINS[p]}" for p in a.tla_params)
        disj.append(f"{binders} : {name}({', '.join(a.tla_params)})")
    parts += ["Next ==\n" + "\n".join(f"    \\/ {d}" for d in disj), "",
              "Spec == Init /\\ [][Next]_vars", "", _fair_spec(spec), "",
              "\\* ---- invariants"]
    for inv in spec.invariants:
        parts.append(f"\\* {inv.doc}\n{inv.name} ==\n    {inv.tla}\n")
    parts.append("\\* ---- action properties")
    for prop in spec.action_properties:
        parts.append(f"\\* {prop.doc}\n{prop.name} ==\n    [][{prop.tla}]_vars\n")
    parts.append("\\* ---- liveness (under FairSpec)")
    for lp in spec.liveness:
        body = f"({lp.when_tla}) ~> ({lp.then_tla})"
        if lp.per_controller:
            body = f"\\A c \\in Ctls : {body}"
        parts.append(f"\\* {lp.doc}\n{lp.name} ==\n    {body}\n")
    parts.append("=" * 78)
    return "\n".join(parts) + "\n"


def _call(a: FoAction, bound: frozenset[str] = frozenset()) -> str:
    """Action ``a`` taken with any parameter not in ``bound`` (those are bound outside)."""
    free = [p for p in a.tla_params if p not in bound]
    head = _tla_name(a.name) + (f"({', '.join(a.tla_params)})" if a.tla_params else "")
    if not free:
        return head
    binders = " : ".join(f"\\E {p} \\in {_DOMAINS[p]}" for p in free)
    return f"({binders} : {head})"


def _fair_spec(spec: FailoverSpec) -> str:
    """``FairSpec``: one conjunct per fairness class; a controller's classes once per
    controller (TLC's liveness check grows with every conjunct: the classes are coarse)."""
    lines = ["\\* The spec with its fairness assumptions (liveness is checked under it).",
             "FairSpec == Spec"]
    for f in spec.fairness:
        acts = " \\/ ".join(_call(a) for a in spec.actions if a.name in f.actions)
        lines.append(f"    /\\ {'SF' if f.strong else 'WF'}_vars({acts})  \\* {f.name}")
    for f in spec.epoch_fairness:
        assert f.actions == {"deliver"}, f  # the one class TLA+ states per epoch
        lines.append(f"    /\\ \\A ep \\in 1..MaxEpoch : {'SF' if f.strong else 'WF'}_vars("
                     f"\\E m \\in net : m[2] = ep /\\ Deliver(m))  \\* {f.name}")
    lines.append("    /\\ \\A c \\in Ctls :")
    for f in spec.controller_fairness:
        acts = " \\/ ".join(_call(a, frozenset({"c"})) for a in spec.actions
                             if a.name in f.actions)
        lines.append(f"        /\\ {'SF' if f.strong else 'WF'}_vars({acts})  \\* {f.name}")
    return "\n".join(lines)


def failover_liveness_config(spec: FailoverSpec, prop: str) -> str:
    """A TLC configuration that checks the failover liveness property ``prop``."""
    head = failover_config(spec).split("SPECIFICATION", 1)[0]
    return head.replace("`rolloutcore spec tla`", "rolloutcore (a liveness run)") + (
        f"SPECIFICATION FairSpec\nPROPERTY {prop}\n")


def failover_config(spec: FailoverSpec = FAILOVER) -> str:
    b = spec.bounds
    return "\n".join([
        "\\* Generated by `rolloutcore spec tla`. Do not edit.",
        "CONSTANTS",
        f"    NumCtl = {b.controllers}",
        f"    NumEngines = {b.engines}",
        f"    MaxEpoch = {b.epochs}",
        f"    MaxGen = {b.generations}",
        "SPECIFICATION Spec",
        "INVARIANTS", *(f"    {i.name}" for i in spec.invariants),
        "PROPERTIES", *(f"    {p.name}" for p in spec.action_properties),
    ]) + "\n"


__all__ = [
    "ACTIONS",
    "FAILOVER",
    "FENCED_KINDS",
    "Ctl",
    "Eng",
    "FailoverSpec",
    "FoAction",
    "FoBounds",
    "FoExploration",
    "FoState",
    "Jrn",
    "accepts",
    "explore_failover",
    "failover_config",
    "failover_module",
    "leads",
]
