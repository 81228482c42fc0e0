"""The RolloutCore lifecycle: the single source of truth.

Theory of operation
-------------------
The world is one inference engine plus the controller that gates it. A state of the
spec has two halves:

* controller variables (what RolloutCore knows and decides): the phase, the committed
  and target generations, the operation in flight (``pending``), the rollout bindings,
  the cache tiers verified clean in this cycle and the evidence gathered about the
  weights the engine should hold;
* ghost variables (what is really true in the engine, which the controller can only
  learn through evidence): the generation the weights hold (or MIXED), the label the
  engine reports, whether it is paused, which requests it still runs and under which
  weights they started, which generations each cache tier holds entries of, whether an
  ambiguous mutation happened, whether a stale cache entry was ever used, and a fault
  counter that bounds the model.

Every external operation is built by one constructor, :func:`operation`: a *begin*
action plus *outcome* actions, each with an explicit ``op`` and :class:`Result`: ok,
failed (unclassifiable: the only result an idempotent step retries), refused (proof of
no effect), mismatch (definite evidence against) or ambiguous (may or may not have
happened). Outcome actions carry a ``truth`` guard over the ghost variables: the
outcome the controller observes is constrained by what the engine really did. Several
outcomes can look the same to the controller (``observed_as``): a transfer that
"returned ok" but installed the wrong weights is observed as ``mutate_ok``; only later
evidence tells them apart.

A serving engine can change behind the controller's back: its process replaced out of
band (an orchestrator's restart, a relaunch after a crash, an operator), with other
weights or another label. The ``engine_restart`` environment action models it; the
controller cannot know until it looks, so the ``audit`` operation reads the engine again
(label, identity, run state, a probe) and a definite mismatch quarantines it, while an
unreachable engine loses its evidence (admissions wait) until an audit passes. The ghost
``replaced`` records a replacement not yet audited: the invariants about what a READY
engine holds speak of engines not replaced since the controller last verified them,
which is the strongest true statement (between a replacement and the next audit nobody
can know).

The controller's own crash is part of the spec: a *restart* action takes the controller
from whatever its journal last recorded to the state it may assume (READY only when
nothing was paused, mutated or in flight, otherwise TAINTED), while the operation that
was in flight may or may not have taken effect in the engine. Journal recovery and the
trace checker's handling of ``recover`` records are derived from these actions.

The controller is generated from the controller half of each action (``sources``,
``when``, ``control``, ``dest``); the model checker, the TLA+ module, the trigger enum
and the review document are generated from the whole table. Each action keeps its TLA+
text beside its Python, and TLC's state graph must equal the Python one edge for edge,
which proves the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from typing import Any, NamedTuple


class Phase(StrEnum):
    UNINITIALIZED = "UNINITIALIZED"
    READY = "READY"
    DRAINING = "DRAINING"
    QUIESCED = "QUIESCED"
    UPDATING = "UPDATING"
    INVALIDATING = "INVALIDATING"
    VALIDATING = "VALIDATING"
    RESUMING = "RESUMING"
    TAINTED = "TAINTED"


class Kind(StrEnum):
    CONTROL = "control"  # the controller starts it (begin steps, decisions, admission)
    OUTCOME = "outcome"  # the observed result of an operation in flight
    ENVIRONMENT = "environment"  # the engine acts on its own; invisible to the controller
    RESTART = "restart"  # the controller process restarts on its journal after a crash


class Result(StrEnum):
    """What an operation's action is: its begin, or one kind of outcome."""

    BEGIN = "begin"
    OK = "ok"
    FAILED = "failed"  # could not be classified (timeout, 5xx, unreadable): retry
    REFUSED = "refused"  # refused with proof that nothing changed: definite
    MISMATCH = "mismatch"  # the engine definitely holds something else: definite
    AMBIGUOUS = "ambiguous"  # a mutating step that may or may not have happened

    @property
    def jepsen(self) -> str:
        """The Jepsen history type of a journal record of this result."""
        return {Result.BEGIN: "invoke", Result.OK: "ok", Result.AMBIGUOUS: "info"}.get(
            self, "fail")

    @property
    def retried(self) -> bool:
        """Only an unclassifiable outcome is worth another attempt of an idempotent step:
        a definite answer (refused, mismatch) does not change by asking again."""
        return self is Result.FAILED


#: Cache tiers whose entries depend on the weights. Order is the reset order.
TIERS: tuple[str, ...] = ("prefix", "encoder", "mm")
#: Evidence that must be held, all of it, whenever the controller admits rollouts.
EVIDENCE: tuple[str, ...] = ("version", "identity", "resumed", "probe")
ALL_EVIDENCE = frozenset(EVIDENCE)
#: Evidence that survives pausing: it is about the weights, not about the run state.
WEIGHT_EVIDENCE = frozenset({"version", "identity", "probe"})
#: Held only in TAINTED: the engine was paused and relabelled so that nobody calling it
#: directly is served by (or misled about) weights that were never published.
FENCED = "fenced"
NO_OP = "none"
#: Ghost value of ``weights``/``label``: no single generation, and the digest shows it.
MIXED = -1
#: Ghost value of ``weights``: reads as the target to the identity digest but does not
#: compute as it (tensors left on the meta device, layers the digest cannot see). Only a
#: generation reveals it.
BROKEN = -2
#: Ghost value of ``label``: the fence's label (``tainted:<target>``), never a generation.
TAINT = -3
#: Phases in which the controller has closed admissions and the engine must be quiet.
QUIET_PHASES = frozenset({Phase.QUIESCED, Phase.UPDATING, Phase.INVALIDATING, Phase.VALIDATING})
#: Phases after a mutation in which evidence speaks about the target generation.
POST_MUTATION_PHASES = frozenset({Phase.INVALIDATING, Phase.VALIDATING, Phase.RESUMING})


@dataclass(frozen=True)
class Bounds:
    """Model bounds: rollout slots, generations (the initial one included), faults
    (fault outcomes and controller restarts, together)."""

    rollouts: int = 2
    generations: int = 3
    faults: int = 2

    def __post_init__(self) -> None:
        if self.rollouts < 0 or self.generations < 1 or self.faults < 0:
            raise ValueError(f"bounds out of range: {self}")


class State(NamedTuple):
    # controller variables
    phase: Phase
    committed: int
    target: int
    pending: str
    bind: tuple[int, ...]  # slot -> generation it was admitted under (0: free)
    cleared: frozenset[str]
    evidence: frozenset[str]
    # ghost variables (the engine's truth)
    weights: int
    label: int
    paused: bool
    req: tuple[int, ...]  # slot -> generation of the weights its engine request started on
    caches: tuple[frozenset[int], ...]  # tier (TIERS order) -> generations of its entries
    amb: bool
    stale: bool
    replaced: bool  # the engine process was replaced out of band since it was last verified
    doubt: bool  # the engine was seen unreachable (or suspected) and not verified since
    faults: int


CONTROL_VARS: tuple[str, ...] = (
    "phase", "committed", "target", "pending", "bind", "cleared", "evidence",
)
GHOST_VARS: tuple[str, ...] = (
    "weights", "label", "paused", "req", "caches", "amb", "stale", "replaced", "doubt",
    "faults",
)
VARIABLES: tuple[str, ...] = CONTROL_VARS + GHOST_VARS
assert State._fields == VARIABLES

#: What a fresh engine may hold before bootstrap: the declared initial weights, or other
#: weights under the same label (a label is not an identity).
INITIAL_WEIGHTS: tuple[int, ...] = (1, MIXED)


def initial_states(bounds: Bounds) -> tuple[State, ...]:
    """A fresh engine with empty caches, labelled as generation 1; nothing known yet."""
    free = (0,) * bounds.rollouts
    return tuple(State(
        phase=Phase.UNINITIALIZED, committed=0, target=0, pending=NO_OP, bind=free,
        cleared=frozenset(), evidence=frozenset(), weights=w, label=1, paused=False,
        req=free, caches=tuple(frozenset() for _ in TIERS), amb=False, stale=False,
        replaced=False, doubt=False, faults=0,
    ) for w in INITIAL_WEIGHTS)


INIT_TLA = r"""/\ phase = "UNINITIALIZED"
    /\ committed = 0
    /\ target = 0
    /\ pending = "none"
    /\ bind = [i \in Slots |-> 0]
    /\ cleared = {}
    /\ evidence = {}
    /\ weights \in {1, MIXED}
    /\ label = 1
    /\ paused = FALSE
    /\ req = [i \in Slots |-> 0]
    /\ caches = [t \in Tiers |-> {}]
    /\ amb = FALSE
    /\ stale = FALSE
    /\ replaced = FALSE
    /\ doubt = FALSE
    /\ faults = 0"""


# --------------------------------------------------------------------------- actions

Param = Any  # a slot index (1-based), a tier name, or None
Guard = Callable[[Any, Param], bool]
Updates = Mapping[str, object]
#: TLA+ effects on ghost variables: ``var -> expr`` means ``var' = expr``; a value that
#: starts with ``\in `` means ``var' \in <set>`` (a nondeterministic effect).
WorldTla = Mapping[str, str]


def _always(_s: Any, _p: Param) -> bool:
    return True


def _no_updates(_s: Any, _p: Param) -> Sequence[Updates]:
    return ({},)


def _no_control(_s: Any, _p: Param) -> Updates:
    return {}


@dataclass(frozen=True)
class Action:
    """One row of the transition table.

    ``when``/``control`` read and write controller variables only (the controller runs
    them); ``truth``/``world`` read the whole state and write ghost variables only (the
    model checker runs them). ``world`` returns the alternatives of a nondeterministic
    effect. ``*_tla`` hold the same meaning in TLA+. ``in_flight``: the world effect is
    that of the operation in flight, which may or may not have happened (a restart).
    """

    name: str
    doc: str
    kind: Kind
    sources: frozenset[Phase]
    dest: Phase | None = None
    param: str | None = None  # None, "slot" or "tier"
    op: str | None = None  # the operation this is the begin or an outcome of
    result: Result | None = None
    when: Guard = _always
    when_tla: str = "TRUE"
    truth: Guard = _always
    truth_tla: str = "TRUE"
    control: Callable[[Any, Param], Updates] = _no_control
    control_tla: Mapping[str, str] = field(default_factory=dict)
    world: Callable[[State, Param], Sequence[Updates]] = _no_updates
    world_tla: WorldTla = field(default_factory=dict)
    in_flight: bool = False
    fault: bool = False  # a fault outcome (or a restart): bounded by ``faults`` in the model
    needs_generation: bool = False  # model bound: a generation must be left to move to
    observed_as: str | None = None  # controller trigger; defaults to ``name``

    @property
    def trigger(self) -> str | None:
        """The controller trigger that performs this action (None: environment)."""
        if self.kind is Kind.ENVIRONMENT:
            return None
        return self.observed_as or self.name

    @property
    def world_writes(self) -> frozenset[str]:
        if self.in_flight:
            return frozenset(v for v in GHOST_VARS if v != "faults")
        return frozenset(self.world_tla)

    @property
    def writes(self) -> frozenset[str]:
        out = set(self.control_tla) | set(self.world_writes)
        if self.dest is not None:
            out.add("phase")
        if self.fault:
            out.add("faults")
        return frozenset(out)


def _set(seq: tuple[int, ...], slot: int, value: int) -> tuple[int, ...]:
    return (*seq[:slot - 1], value, *seq[slot:])


def _with_tier(caches: tuple[frozenset[int], ...], tier: str, value: frozenset[int]) -> tuple[
    frozenset[int], ...
]:
    i = TIERS.index(tier)
    return (*caches[:i], value, *caches[i + 1:])


def _idle(c: Any, _p: Param) -> bool:
    return bool(c.pending == NO_OP)


def verified(c: Any) -> bool:
    """Every piece of evidence in hand: what admitting a rollout, and starting an update,
    need. A failed audit (or a suspicion) drops it until an audit passes."""
    return bool(c.evidence == ALL_EVIDENCE)


VERIFIED_TLA = "evidence = AllEvidence"


def _unbound(c: Any, _p: Param) -> bool:
    return bool(c.pending == NO_OP and not any(c.bind))


def _compute(s: State) -> Updates:
    """A request runs on the engine: it reads every cache tier, then writes entries of
    the weights it runs on. Reading an entry of other weights is a stale use."""
    w = s.weights
    stale = s.stale or any(c - {w} for c in s.caches)
    return {"caches": tuple(c | {w} for c in s.caches), "stale": stale}


_COMPUTE_TLA: WorldTla = {
    "stale": r"(stale \/ \E t \in Tiers : caches[t] \ {weights} # {})",
    "caches": r"[t \in Tiers |-> caches[t] \cup {weights}]",
}


def param_var(param: str) -> str:
    return {"slot": "i", "tier": "t"}[param]


def param_domain(param: str) -> str:
    return {"slot": "Slots", "tier": "Tiers"}[param]


def pending_name(op: str, param: Param) -> str:
    """What ``pending`` holds while ``op`` (with a tier parameter, if any) is in flight."""
    return op if param is None else f"{op}_{param}"


def _settle(control: Callable[[Any, Param], Updates]) -> Callable[[Any, Param], Updates]:
    """An outcome's control effect: its own updates, and nothing pending any more."""
    return lambda c, p: {**control(c, p), "pending": NO_OP}


def operation(op: str, sources: frozenset[Phase], *, param: str | None = None,
              begin: Mapping[str, Any], **outcomes: Mapping[str, Any]) -> tuple[Action, ...]:
    """The one constructor of an operation: its begin action and its outcomes.

    ``outcomes`` maps a result name (``ok``, ``failed``, ``refused``, ``mismatch``,
    ``ambiguous``), optionally with a suffix (``ok_broken``: another way the engine can
    produce what the controller observes as ``ok``), to the action's other fields. Each
    outcome is enabled while ``op`` is pending, leaves nothing pending and journals as
    its result says; a suffixed variant is observed as the plain result.
    """
    pend_tla = f'"{op}"' if param is None else f'"{op}_" \\o {param_var(param)}'

    def is_pending(c: Any, p: Param) -> bool:
        return bool(c.pending == pending_name(op, p))

    begin_fields = dict(begin)
    control = begin_fields.pop("control", _no_control)
    control_tla = dict(begin_fields.pop("control_tla", {}))
    actions = [Action(
        name=f"{op}_begin", kind=Kind.CONTROL, sources=begin_fields.pop("sources", sources),
        param=param, op=op,
        result=Result.BEGIN,
        control=lambda c, p: {**control(c, p), "pending": pending_name(op, p)},
        control_tla={**control_tla, "pending": pend_tla}, **begin_fields,
    )]
    for key, fields in outcomes.items():
        result = Result(key.split("_", 1)[0])
        fields = dict(fields)
        o_control_tla = dict(fields.pop("control_tla", {}))
        actions.append(Action(
            name=f"{op}_{key}", kind=Kind.OUTCOME, sources=fields.pop("sources", sources),
            param=param, op=op, result=result, when=is_pending,
            when_tla=f"pending = {pend_tla}",
            control=_settle(fields.pop("control", _no_control)),
            control_tla={**o_control_tla, "pending": '"none"'},
            observed_as=f"{op}_{result.value}" if key != result.value else None,
            fault=fields.pop("fault", result is not Result.OK), **fields,
        ))
    return tuple(actions)


P = Phase
_CLOSE_RESUMED: Mapping[str, Any] = {
    "control": lambda c, _p: {"evidence": c.evidence - {"resumed"}},
    "control_tla": {"evidence": 'evidence \\ {"resumed"}'},
}
#: A pause that did not complete may have taken effect (a wait-mode pause does at once
#: on vLLM): the engine is no longer known to run.
_PAUSE_FAILED: Mapping[str, Any] = {
    **_CLOSE_RESUMED,
    "world": lambda s, _p: ({"paused": s.paused}, {"paused": True}),
    "world_tla": {"paused": r"\in {paused, TRUE}"},
}
_NO_REQUESTS = (lambda s, _p: not any(s.req), r"\A j \in Slots : req[j] = 0")
#: The restart decision: READY only if nothing was in flight and the engine is known to
#: run the committed generation unmutated (READY, or DRAINING never paused or resumed
#: since); everything else restarts TAINTED.
_READY_ON_RESTART_TLA = (r'(pending = "none" /\ (phase = "READY" \/ (phase = "DRAINING" '
                         r'/\ "resumed" \in evidence))) \/ (phase = "READY" '
                         r'/\ pending = "audit")')


def _ready_on_restart(c: Any, _p: Param) -> bool:
    """Nothing in flight but a read-only audit, and the engine known to run the committed
    generation unmutated (READY, or DRAINING never paused or resumed since)."""
    if c.pending == "audit":
        return bool(c.phase is Phase.READY)
    return bool(c.pending == NO_OP and (
        c.phase is Phase.READY or (c.phase is Phase.DRAINING and "resumed" in c.evidence)))


def _gives_up(c: Any, _p: Param) -> bool:
    """Nothing in flight, and either the engine is not known to run (its pause or resume
    failed: "resumed" is not in hand) or a mutation is under way (past DRAINING)."""
    return bool(c.pending == NO_OP and (
        "resumed" not in c.evidence or (c.target != 0 and c.phase is not Phase.DRAINING)))


_GIVES_UP_TLA = (r'pending = "none" /\ ("resumed" \notin evidence '
                 r'\/ (target # 0 /\ phase # "DRAINING"))')


def _serves_committed(s: State, _p: Param) -> bool:
    return s.weights == s.committed and s.label == s.committed and not s.paused


_SERVES_COMMITTED_TLA = r"weights = committed /\ label = committed /\ ~paused"


_FREE_BIND_TLA = "[i \\in Slots |-> 0]"


def _free_bind(c: Any) -> tuple[int, ...]:
    return (0,) * len(c.bind)


def frees_bindings(a: Action) -> bool:
    """Whether ``a`` drops every binding (a restart: the rollouts died with the crashed
    process; an audit mismatch: they ran on an engine that is not the committed one and
    are released as aborted)."""
    return a.control_tla.get("bind") == _FREE_BIND_TLA


ACTIONS: tuple[Action, ...] = (
    # ---- bootstrap ------------------------------------------------------------------
    *operation(
        "bootstrap", frozenset({P.UNINITIALIZED}),
        begin={"doc": "Read the fresh engine: label, weight identity, a probe generation.",
               "when": _idle, "when_tla": 'pending = "none"'},
        ok={"dest": P.READY,
            "doc": "The engine reports the initial generation's label and identity, is "
            "running, and its probe output matches: generation 1 is committed and "
            "admissions open.",
            "truth": lambda s, _p: s.weights == 1 and s.label == 1 and not s.paused,
            "truth_tla": r"weights = 1 /\ label = 1 /\ ~paused",
            "control": lambda _c, _p: {"committed": 1, "evidence": ALL_EVIDENCE},
            "control_tla": {"committed": "1", "evidence": "AllEvidence"}},
        failed={"doc": "The engine could not be read; stay uninitialised (retried)."},
        mismatch={"fault": False,
                  "doc": "The engine definitely holds other weights (or another label) than "
                  "the declared initial ones: stay uninitialised; asking again cannot help.",
                  "truth": lambda s, _p: s.weights != 1 or s.label != 1,
                  "truth_tla": r"weights # 1 \/ label # 1"},
    ),
    # ---- rollouts (the application) ---------------------------------------------------
    Action(
        name="admit", kind=Kind.CONTROL, sources=frozenset({P.READY}), param="slot",
        doc="Admit a rollout: bind it to the committed generation; the engine starts it. "
        "Only with every piece of evidence in hand (not after a failed audit or a "
        "suspicion, until an audit passes).",
        when=lambda c, i: c.bind[i - 1] == 0 and verified(c),
        when_tla=f"bind[i] = 0 /\\ {VERIFIED_TLA}",
        truth=lambda s, i: s.req[i - 1] == 0, truth_tla="req[i] = 0",
        control=lambda c, i: {"bind": _set(c.bind, i, c.committed)},
        control_tla={"bind": "[bind EXCEPT ![i] = committed]"},
        world=lambda s, i: ({"req": _set(s.req, i, s.weights), **_compute(s)},),
        world_tla={"req": "[req EXCEPT ![i] = weights]", **_COMPUTE_TLA},
    ),
    Action(
        name="engine_finish", kind=Kind.ENVIRONMENT, sources=frozenset(P), param="slot",
        doc="The engine finishes a request (maybe before the application releases it); a "
        "wait-mode pause lets in-flight requests run to completion (observed on vLLM).",
        truth=lambda s, i: s.req[i - 1] != 0,
        truth_tla="req[i] # 0",
        world=lambda s, i: ({"req": _set(s.req, i, 0)},),
        world_tla={"req": "[req EXCEPT ![i] = 0]"},
    ),
    Action(
        name="release", kind=Kind.CONTROL, sources=frozenset({P.READY, P.DRAINING}),
        param="slot",
        doc="The application releases a rollout's binding. If the engine still runs the "
        "request (the client gave up), the request lives on as an orphan.",
        when=lambda c, i: c.bind[i - 1] != 0, when_tla="bind[i] # 0",
        control=lambda c, i: {"bind": _set(c.bind, i, 0)},
        control_tla={"bind": "[bind EXCEPT ![i] = 0]"},
    ),
    Action(
        name="release_aborted", kind=Kind.CONTROL, sources=frozenset({P.DRAINING}),
        param="slot",
        doc="Drain policy wait-then-abort: past the drain deadline a bound rollout is "
        "released as aborted (never as finished, never counted in the new generation). "
        "Its engine request lives on until the abort-mode pause ends it.",
        when=lambda c, i: c.bind[i - 1] != 0, when_tla="bind[i] # 0",
        control=lambda c, i: {"bind": _set(c.bind, i, 0)},
        control_tla={"bind": "[bind EXCEPT ![i] = 0]"},
    ),
    # ---- update request, drain, quiesce -------------------------------------------------
    Action(
        name="request_update", kind=Kind.CONTROL, sources=frozenset({P.READY}), dest=P.DRAINING,
        doc="The trainer asks for the next generation: admissions close, draining starts. "
        "Only from a verified engine (an update abandoned later restores the evidence it "
        "started with).",
        when=lambda c, _p: c.pending == NO_OP and verified(c),
        when_tla=f'pending = "none" /\\ {VERIFIED_TLA}',
        needs_generation=True,
        control=lambda c, _p: {"target": c.committed + 1},
        control_tla={"target": "committed + 1"},
    ),
    Action(
        name="cancel_update", kind=Kind.CONTROL, sources=frozenset({P.DRAINING}), dest=P.READY,
        doc="The pending update is cancelled while draining: admissions reopen, nothing moved. "
        "Only with the engine known to run (after a failed pause: resume it first).",
        when=lambda c, _p: c.pending == NO_OP and "resumed" in c.evidence,
        when_tla=r'pending = "none" /\ "resumed" \in evidence',
        control=lambda _c, _p: {"target": 0}, control_tla={"target": "0"},
    ),
    *operation(
        "pause", frozenset({P.DRAINING}),
        begin={"doc": "Every local binding is released: pause the engine in wait mode (it "
               "returns only once its own requests, orphans included, have finished).",
               "when": _unbound, "when_tla": r'pending = "none" /\ \A j \in Slots : bind[j] = 0'},
        ok={"dest": P.QUIESCED,
            "doc": "The engine reports paused with no request running: quiesced.",
            "truth": _NO_REQUESTS[0], "truth_tla": _NO_REQUESTS[1], **_CLOSE_RESUMED,
            "world": lambda _s, _p: ({"paused": True},), "world_tla": {"paused": "TRUE"}},
        failed={"doc": "The pause did not complete (timeout, requests still running): it may "
                "have taken effect, so the engine is no longer known to run: it must be "
                "resumed before admissions reopen.", **_PAUSE_FAILED},
    ),
    *operation(
        "pause_abort", frozenset({P.DRAINING}),
        begin={"doc": "Drain policy wait-then-abort: every binding is released (finished or "
               "aborted); pause the engine in abort mode, which ends the requests it still "
               "runs with partial output.",
               "when": _unbound, "when_tla": r'pending = "none" /\ \A j \in Slots : bind[j] = 0'},
        ok={"dest": P.QUIESCED,
            "doc": "The engine reports paused and its running count reads 0: every aborted "
            "request is gone before anything mutates.",
            "truth": _NO_REQUESTS[0], "truth_tla": _NO_REQUESTS[1], **_CLOSE_RESUMED,
            "world": lambda _s, _p: ({"paused": True},), "world_tla": {"paused": "TRUE"}},
        failed={"doc": "The abort-mode pause did not complete, or requests still run: it may "
                "have paused the engine.", **_PAUSE_FAILED},
    ),
    Action(
        name="abandon_update", kind=Kind.CONTROL, sources=frozenset({P.QUIESCED}),
        dest=P.RESUMING,
        doc="Give up the update before any mutation: resume the committed generation.",
        when=_idle, when_tla='pending = "none"',
        control=lambda _c, _p: {"target": 0}, control_tla={"target": "0"},
    ),
    # ---- mutation: never retried, ambiguity latches TAINTED -----------------------------
    *operation(
        "mutate", frozenset({P.UPDATING}),
        begin={"sources": frozenset({P.QUIESCED}), "dest": P.UPDATING,
               "doc": "Start the weight mutation (a collective: never retried).",
               "when": lambda c, _p: c.pending == NO_OP and c.target != 0,
               "when_tla": r'pending = "none" /\ target # 0',
               "control": lambda _c, _p: {"evidence": frozenset(), "cleared": frozenset()},
               "control_tla": {"evidence": "{}", "cleared": "{}"}},
        ok={"dest": P.INVALIDATING,
            "doc": "The transfer finalised with the target's label and the target's weights.",
            "world": lambda s, _p: ({"weights": s.target, "label": s.target},),
            "world_tla": {"weights": "target", "label": "target"}},
        ok_unlabelled={
            "dest": P.INVALIDATING, "fault": True,
            "doc": "Returned ok, weights moved, but finalised without the target label (the "
            "seed's bug): looks like mutate_ok; validation must catch it.",
            "world": lambda s, _p: ({"weights": s.target},), "world_tla": {"weights": "target"}},
        ok_wrong_weights={
            "dest": P.INVALIDATING, "fault": True,
            "doc": "Returned ok with the target label, but the engine holds other weights (a "
            "different checkpoint, a partial load): looks like mutate_ok.",
            "world": lambda s, _p: ({"weights": MIXED, "label": s.target},),
            "world_tla": {"weights": "MIXED", "label": "target"}},
        ok_broken={
            "dest": P.INVALIDATING, "fault": True,
            "doc": "Returned ok with the target label; the weights read as the target's to the "
            "identity digest but do not compute as them: only the probe can tell.",
            "world": lambda s, _p: ({"weights": BROKEN, "label": s.target},),
            "world_tla": {"weights": "BROKEN", "label": "target"}},
        refused={
            "dest": P.QUIESCED,
            "doc": "Refused with proof that nothing moved (identity mismatch, no headroom, "
            "init refused), and a read after it shows the engine still on the committed "
            "label and weights: the update is over, the old evidence stands again. A "
            "refusal that leaves the engine on anything else (a label set by hand) is "
            "ambiguous.",
            "truth": lambda s, _p: s.label == s.committed and s.weights == s.committed,
            "truth_tla": r"label = committed /\ weights = committed",
            "control": lambda _c, _p: {"target": 0, "evidence": WEIGHT_EVIDENCE},
            "control_tla": {"target": "0", "evidence": "WeightEvidence"}},
        ambiguous={
            "dest": P.TAINTED,
            "doc": "Timed out, died halfway or failed unclassifiably: the weights may be old, "
            "new or mixed. TAINTED, nothing retries the collective.",
            "world": lambda s, _p: tuple(
                {"weights": w, "label": lab, "amb": True}
                for w in sorted({s.committed, s.target, MIXED})
                for lab in sorted({s.committed, s.target})),
            "world_tla": {"weights": r"\in {committed, target, MIXED}",
                          "label": r"\in {committed, target}", "amb": "TRUE"}},
    ),
    # ---- invalidation: every tier, verified ---------------------------------------------
    *operation(
        "reset", frozenset({P.INVALIDATING}), param="tier",
        begin={"doc": "Ask the engine to reset one cache tier.",
               "when": lambda c, t: c.pending == NO_OP and t not in c.cleared,
               "when_tla": r'pending = "none" /\ t \notin cleared'},
        ok={"doc": "The reset is verified (response body and, for prefix KV, the hit counters).",
            "control": lambda c, t: {"cleared": c.cleared | {t}},
            "control_tla": {"cleared": r"cleared \cup {t}"},
            "world": lambda s, t: ({"caches": _with_tier(s.caches, t, frozenset())},),
            "world_tla": {"caches": "[caches EXCEPT ![t] = {}]"}},
        failed={"doc": "The reset was refused (success:false, blocks in use) or could not be "
                "verified (empty body): it may or may not have cleared; it does not count.",
                "world": lambda s, t: (
                    {"caches": s.caches}, {"caches": _with_tier(s.caches, t, frozenset())}),
                "world_tla": {"caches": r"\in {caches, [caches EXCEPT ![t] = {}]}"}},
    ),
    Action(
        name="invalidated", kind=Kind.CONTROL, sources=frozenset({P.INVALIDATING}),
        dest=P.VALIDATING,
        doc="Every tier is verified clean.",
        when=lambda c, _p: c.pending == NO_OP and c.cleared == frozenset(TIERS),
        when_tla=r'pending = "none" /\ cleared = Tiers',
    ),
    # ---- validation while paused -------------------------------------------------------
    *operation(
        "validate", frozenset({P.VALIDATING}),
        begin={"doc": "Read the engine's label and the identity of the weights it holds "
               "(paused).", "when": _idle, "when_tla": 'pending = "none"'},
        ok={"dest": P.RESUMING,
            "doc": "Label and weight identity read as the target's (the digest cannot see "
            "BROKEN weights).",
            "truth": lambda s, _p: s.label == s.target and s.weights in (s.target, BROKEN),
            "truth_tla": r"label = target /\ weights \in {target, BROKEN}",
            "control": lambda c, _p: {"evidence": c.evidence | {"version", "identity"}},
            "control_tla": {"evidence": r'evidence \cup {"version", "identity"}'}},
        failed={"doc": "The reads failed (timeout, connection reset): retry them."},
        mismatch={"dest": P.TAINTED, "fault": False,
                  "doc": "The engine holds something other than the target (label or "
                  "identity): the mutation's outcome is ambiguous after all. TAINTED.",
                  "truth": lambda s, _p: s.label != s.target
                  or s.weights not in (s.target, BROKEN),
                  "truth_tla": r"label # target \/ weights \notin {target, BROKEN}",
                  "world": lambda _s, _p: ({"amb": True},), "world_tla": {"amb": "TRUE"}},
    ),
    # ---- resume, probe generation, publish -----------------------------------------------
    *operation(
        "resume", frozenset({P.DRAINING, P.RESUMING}),
        begin={"doc": "Resume the engine (after a failed pause, or after validation); "
               "admissions stay closed.",
               "when": lambda c, _p: c.pending == NO_OP and "resumed" not in c.evidence,
               "when_tla": r'pending = "none" /\ "resumed" \notin evidence'},
        ok={"doc": "The engine reads as running.",
            "control": lambda c, _p: {"evidence": c.evidence | {"resumed"}},
            "control_tla": {"evidence": r'evidence \cup {"resumed"}'},
            "world": lambda _s, _p: ({"paused": False},), "world_tla": {"paused": "FALSE"}},
        failed={"doc": "The resume failed and the engine reads as paused: retry."},
    ),
    *operation(
        "probe", frozenset({P.RESUMING}),
        begin={"doc": "Run the post-update probe (admissions still closed).",
               "when": lambda c, _p: (c.pending == NO_OP and c.target != 0
                                      and "resumed" in c.evidence and "probe" not in c.evidence),
               "when_tla": r'pending = "none" /\ target # 0 /\ "resumed" \in evidence '
               r'/\ "probe" \notin evidence'},
        ok={"doc": "The probe's output equals the target's reference (token for token, or "
            "every scored position's log-probability within tolerance).",
            "truth": lambda s, _p: s.weights == s.target, "truth_tla": "weights = target",
            "control": lambda c, _p: {"evidence": c.evidence | {"probe"}},
            "control_tla": {"evidence": r'evidence \cup {"probe"}'},
            "world": lambda s, _p: (_compute(s),), "world_tla": _COMPUTE_TLA},
        failed={"doc": "The probe request failed (timeout, 5xx): retry."},
        mismatch={"dest": P.TAINTED, "fault": False,
                  "doc": "The probe computed something other than the target's reference: "
                  "TAINTED.",
                  "truth": lambda s, _p: s.weights != s.target, "truth_tla": "weights # target",
                  "world": lambda _s, _p: ({"amb": True},), "world_tla": {"amb": "TRUE"}},
    ),
    Action(
        name="publish", kind=Kind.CONTROL, sources=frozenset({P.RESUMING}), dest=P.READY,
        doc="All evidence is in: commit the target and reopen admissions.",
        when=lambda c, _p: c.pending == NO_OP and c.target != 0 and c.evidence == ALL_EVIDENCE,
        when_tla=r'pending = "none" /\ target # 0 /\ evidence = AllEvidence',
        control=lambda c, _p: {"committed": c.target, "target": 0},
        control_tla={"committed": "target", "target": "0"},
    ),
    Action(
        name="reopen", kind=Kind.CONTROL, sources=frozenset({P.RESUMING}), dest=P.READY,
        doc="An abandoned update: the engine runs the committed generation again; reopen.",
        when=lambda c, _p: c.pending == NO_OP and c.target == 0 and c.evidence == ALL_EVIDENCE,
        when_tla=r'pending = "none" /\ target = 0 /\ evidence = AllEvidence',
    ),
    Action(
        name="give_up", kind=Kind.CONTROL,
        sources=frozenset({P.DRAINING, P.INVALIDATING, P.VALIDATING, P.RESUMING}),
        dest=P.TAINTED,
        doc="Retries of an idempotent step are exhausted after a mutation, or the engine is "
        "no longer known to run (a pause that failed and the resume after it failed too: "
        "the process may be gone): fail closed, so that a fleet waiting on this member "
        "always has a decision to take.",
        when=_gives_up, when_tla=_GIVES_UP_TLA,
    ),
    # ---- TAINTED: fence the engine (best effort), nothing else ---------------------------
    *operation(
        "fence", frozenset({P.TAINTED}),
        begin={"doc": "Fence the tainted engine: pause it in abort mode and relabel it "
               "tainted:<target>, so that no direct caller is served by or misled about "
               "weights that were never published.",
               "when": lambda c, _p: c.pending == NO_OP and FENCED not in c.evidence,
               "when_tla": f'pending = "none" /\\ "{FENCED}" \\notin evidence'},
        ok={"doc": "The engine reads as paused, with no request running, under the taint "
            "label.",
            "truth": _NO_REQUESTS[0], "truth_tla": _NO_REQUESTS[1],
            "control": lambda c, _p: {"evidence": c.evidence | {FENCED}},
            "control_tla": {"evidence": f'evidence \\cup {{"{FENCED}"}}'},
            "world": lambda _s, _p: ({"paused": True, "label": TAINT},),
            "world_tla": {"paused": "TRUE", "label": "TAINT"}},
        failed={"doc": "The fence could not be confirmed (the engine may be dead, frozen or "
                "half-fenced); retried a bounded number of times, then left.",
                "world": lambda s, _p: tuple({"paused": p, "label": lab}
                                             for p in sorted({s.paused, True})
                                             for lab in sorted({s.label, TAINT})),
                "world_tla": {"paused": r"\in {paused, TRUE}", "label": r"\in {label, TAINT}"}},
    ),
    # ---- verified re-admission: the only way out of TAINTED, an explicit operation -------
    *operation(
        "readmit", frozenset({P.TAINTED}),
        begin={"doc": "An operator (or a fleet rolling a member back) re-admits the engine: "
               "pause it in abort mode, reload the committed generation's checkpoint, reset "
               "every cache tier; the reload may or may not produce the committed weights.",
               "when": _idle, "when_tla": 'pending = "none"',
               "control": lambda _c, _p: {"evidence": frozenset()},
               "control_tla": {"evidence": "{}"},
               "world": lambda s, _p: tuple(
                   {"weights": w, "label": lab, "paused": True, "req": (0,) * len(s.req),
                    "caches": tuple(frozenset() for _ in TIERS), "amb": False}
                   for w in sorted({s.committed, MIXED, BROKEN})
                   for lab in sorted({s.committed, s.label})),
               "world_tla": {"weights": r"\in {committed, MIXED, BROKEN}",
                             "label": r"\in {committed, label}", "paused": "TRUE",
                             "req": "[i \\in Slots |-> 0]", "caches": "[t \\in Tiers |-> {}]",
                             "amb": "FALSE"}},
        ok={"dest": P.READY,
            "doc": "Label, identity and a probe all read as the committed generation's; the "
            "engine resumed: it serves again, known to be the engine verified.",
            "truth": lambda s, _p: s.weights == s.committed and s.label == s.committed,
            "truth_tla": r"weights = committed /\ label = committed",
            "control": lambda _c, _p: {"target": 0, "evidence": ALL_EVIDENCE,
                                       "cleared": frozenset(TIERS)},
            "control_tla": {"target": "0", "evidence": "AllEvidence", "cleared": "Tiers"},
            "world": lambda s, _p: ({"paused": False, **_compute(s), "replaced": False,
                                     "doubt": False},),
            "world_tla": {"paused": "FALSE", **_COMPUTE_TLA, "replaced": "FALSE",
                          "doubt": "FALSE"}},
        mismatch={"fault": False,
                  "doc": "The engine does not hold the committed generation (label, identity or "
                  "probe): it stays quarantined, unfenced (the probe resumed it).",
                  "truth": lambda s, _p: s.weights != s.committed or s.label != s.committed,
                  "truth_tla": r"weights # committed \/ label # committed",
                  "control": lambda _c, _p: {"evidence": frozenset()},
                  "control_tla": {"evidence": "{}"},
                  "world": lambda _s, _p: ({"paused": False},), "world_tla": {"paused": "FALSE"}},
        failed={"doc": "The procedure could not be completed or verified: quarantined, state "
                "unknown (not fenced).",
                "control": lambda _c, _p: {"evidence": frozenset()},
                "control_tla": {"evidence": "{}"},
                "world": lambda s, _p: ({"paused": s.paused}, {"paused": False}),
                "world_tla": {"paused": r"\in {paused, FALSE}"}},
    ),
    # ---- a serving engine behind the controller's back: audit, suspicion, replacement ----
    *operation(
        "audit", frozenset({P.READY}),
        begin={"doc": "Audit a serving engine (the fleet's watchdog, an operator, a "
               "suspicion): read its label, weight identity and run state, and run a probe. "
               "Admissions go on meanwhile on the evidence in hand.",
               "when": _idle, "when_tla": 'pending = "none"'},
        ok={"doc": "Label, identity, run state and probe all read as the committed "
            "generation's: every piece of evidence is (again) in hand, and the engine is "
            "known to be the one verified, whatever happened to its process before.",
            "truth": _serves_committed, "truth_tla": _SERVES_COMMITTED_TLA,
            "control": lambda _c, _p: {"evidence": ALL_EVIDENCE},
            "control_tla": {"evidence": "AllEvidence"},
            # Its probe computes on the committed weights only (the truth above), caching
            # what an admitted rollout's request caches: admit models that effect.
            "world": lambda _s, _p: ({"replaced": False, "doubt": False},),
            "world_tla": {"replaced": "FALSE", "doubt": "FALSE"}},
        mismatch={"dest": P.TAINTED, "fault": False,
                  "doc": "The engine definitely is not the one verified (another label, "
                  "other weights, paused): it was replaced or changed behind the "
                  "controller's back. TAINTED (fenced; it serves again only after verified "
                  "re-admission); its bound rollouts ran on it and are released as aborted.",
                  "truth": lambda s, p: not _serves_committed(s, p),
                  "truth_tla": f"~({_SERVES_COMMITTED_TLA})",
                  "control": lambda c, _p: {"bind": _free_bind(c), "evidence": frozenset()},
                  "control_tla": {"bind": _FREE_BIND_TLA, "evidence": "{}"}},
        failed={"doc": "The engine could not be reached or read (timeout, connection "
                "refused, an unreadable answer): its state is unknown, so every piece of "
                "evidence is dropped and admissions and updates wait until an audit passes. "
                "Rollouts already bound stay bound (admitted on verified evidence, their "
                "requests end on their own).",
                "control": lambda _c, _p: {"evidence": frozenset()},
                "control_tla": {"evidence": "{}"},
                "world": lambda _s, _p: ({"doubt": True},), "world_tla": {"doubt": "TRUE"}},
    ),
    Action(
        name="suspect", kind=Kind.CONTROL, sources=frozenset({P.READY}), fault=True,
        doc="The application reports the engine unreachable (a rollout's request could not "
        "connect): every piece of evidence is dropped, so admissions and updates wait until "
        "an audit passes.",
        when=lambda c, _p: verified(c), when_tla=VERIFIED_TLA,
        control=lambda _c, _p: {"evidence": frozenset()}, control_tla={"evidence": "{}"},
        world=lambda _s, _p: ({"doubt": True},), world_tla={"doubt": "TRUE"},
    ),
    Action(
        name="engine_restart", kind=Kind.ENVIRONMENT,
        sources=frozenset(P) - {P.UNINITIALIZED}, fault=True,
        doc="The engine's process is replaced out of band (an orchestrator's restart, a "
        "relaunch, an operator): a fresh process, running, with nothing in flight and empty "
        "caches, holding the committed weights or others and reporting the initial label, "
        "the committed one or another. The controller cannot see it: its evidence speaks of "
        "the old process until an audit (or an update's own verification) reads the new one.",
        world=lambda s, _p: tuple(
            {"weights": w, "label": lab, "paused": False, "req": (0,) * len(s.req),
             "caches": tuple(frozenset() for _ in TIERS), "replaced": True}
            for w in sorted({s.committed, MIXED}) for lab in sorted({1, s.committed, MIXED})),
        world_tla={"weights": r"\in {committed, MIXED}", "label": r"\in {1, committed, MIXED}",
                   "paused": "FALSE", "req": "[i \\in Slots |-> 0]",
                   "caches": "[t \\in Tiers |-> {}]", "replaced": "TRUE"},
    ),
    # ---- the controller's own crash and restart -------------------------------------------
    Action(
        name="restart_uninitialized", kind=Kind.RESTART, sources=frozenset({P.UNINITIALIZED}),
        dest=P.UNINITIALIZED, fault=True,
        doc="Restarted before any bootstrap completed: the engine was only read.",
        control=lambda _c, _p: {"pending": NO_OP}, control_tla={"pending": '"none"'},
        in_flight=True,
    ),
    Action(
        name="restart_ready", kind=Kind.RESTART, sources=frozenset({P.READY, P.DRAINING}),
        dest=P.READY, fault=True,
        doc="Restarted with nothing in flight and the engine known to run the committed "
        "generation (READY, or DRAINING never paused, or resumed since): READY again with "
        "the evidence it held; the crashed process's rollouts are gone (the engine requests "
        "they left are orphans) and a pending update request is dropped. A crash during an "
        "audit (a read and a probe) restarts READY too, but without evidence: the audit's "
        "answer is lost, so admissions wait until an audit passes.",
        when=_ready_on_restart, when_tla=_READY_ON_RESTART_TLA,
        control=lambda c, _p: {"pending": NO_OP, "target": 0, "bind": _free_bind(c),
                               "evidence": c.evidence if c.pending == NO_OP else frozenset()},
        control_tla={"pending": '"none"', "target": "0", "bind": _FREE_BIND_TLA,
                     "evidence": 'IF pending = "none" THEN evidence ELSE {}'},
        in_flight=True,
    ),
    Action(
        name="restart_tainted", kind=Kind.RESTART,
        sources=frozenset(P) - {P.UNINITIALIZED}, dest=P.TAINTED, fault=True,
        doc="Restarted anywhere else (a pause or mutation may have happened, or an "
        "operation was in flight, whose effect may or may not have taken place): fail "
        "closed. A fence confirmed before the crash still stands.",
        when=lambda c, p: not _ready_on_restart(c, p),
        when_tla=f"~({_READY_ON_RESTART_TLA})",
        control=lambda c, _p: {
            "pending": NO_OP, "bind": _free_bind(c),
            "evidence": c.evidence & {FENCED} if c.phase is Phase.TAINTED else frozenset()},
        control_tla={"pending": '"none"', "bind": _FREE_BIND_TLA,
                     "evidence": f'IF phase = "TAINTED" THEN evidence \\cap {{"{FENCED}"}} '
                     'ELSE {}'},
        in_flight=True,
    ),
)

# ------------------------------------------------------------------------ invariants


@dataclass(frozen=True)
class Invariant:
    name: str
    doc: str
    tla: str
    holds: Callable[[State], bool]


@dataclass(frozen=True)
class ActionProperty:
    """A property of every step (s, s'): checked on each edge; a TLA+ ``[][P]_vars``."""

    name: str
    doc: str
    tla: str
    holds: Callable[[State, State], bool]


def _believed(s: State) -> int:
    """The generation the controller's evidence speaks about."""
    if s.phase in POST_MUTATION_PHASES and s.target != 0:
        return s.target
    return s.committed


INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "OneRolloutOnePolicy",
        "Every rollout, from admission to release, sees exactly the weights of the "
        "generation it was admitted under (on an engine not replaced out of band since it "
        "was last verified: a replacement is found by the next audit, which releases the "
        "rollouts bound to it as aborted); every engine request runs to its end on the "
        "weights it started on.",
        r"\A i \in Slots : (bind[i] # 0 /\ ~replaced => weights = bind[i]) "
        r"/\ (req[i] # 0 => weights = req[i])",
        lambda s: (s.replaced or all(b == 0 or s.weights == b for b in s.bind))
        and all(r == 0 or s.weights == r for r in s.req),
    ),
    Invariant(
        "BindingsUnderCommitted",
        "Every binding names the committed generation.",
        r"\A i \in Slots : bind[i] \in {0, committed}",
        lambda s: all(b in (0, s.committed) for b in s.bind),
    ),
    Invariant(
        "BindingsOnlyWhileOpen",
        "Rollouts are bound only in READY and while DRAINING them.",
        r'(\E i \in Slots : bind[i] # 0) => phase \in {"READY", "DRAINING"}',
        lambda s: not any(s.bind) or s.phase in (Phase.READY, Phase.DRAINING),
    ),
    Invariant(
        "AmbiguityLatchesTainted",
        "After an ambiguous outcome of a mutating step the controller is TAINTED: nothing "
        "is admitted or published.",
        'amb => phase = "TAINTED"',
        lambda s: not s.amb or s.phase is Phase.TAINTED,
    ),
    Invariant(
        "ReadyEngineServesCommitted",
        "In READY the engine runs, reports the committed label and holds exactly the "
        "committed generation's weights, unless its process was replaced out of band since "
        "it was last verified (nobody can know before the next audit).",
        r'(phase = "READY" /\ ~replaced) => (weights = committed /\ label = committed '
        r'/\ ~paused)',
        lambda s: s.phase is not Phase.READY or s.replaced
        or (s.weights == s.committed and s.label == s.committed and not s.paused),
    ),
    Invariant(
        "ReadyCachesCoherent",
        "In READY no cache tier holds an entry computed under another generation (on an "
        "engine not replaced since it was last verified).",
        r'(phase = "READY" /\ ~replaced) => \A t \in Tiers : caches[t] \subseteq {committed}',
        lambda s: s.phase is not Phase.READY or s.replaced
        or all(c <= {s.committed} for c in s.caches),
    ),
    Invariant(
        "NoStaleCacheUse",
        "No request ever reads a cache entry computed under other weights than its own.",
        "~stale",
        lambda s: not s.stale,
    ),
    Invariant(
        "EngineQuietWhileClosed",
        "From QUIESCED to VALIDATING the engine is paused (unless its process was replaced "
        "out of band: a fresh process runs), runs no request and no rollout is bound: "
        "mutation happens only when quiesced.",
        r"phase \in QuietPhases => ((paused \/ replaced) /\ \A i \in Slots : bind[i] = 0 "
        r"/\ req[i] = 0)",
        lambda s: s.phase not in QUIET_PHASES
        or ((s.paused or s.replaced) and not any(s.bind) and not any(s.req)),
    ),
    Invariant(
        "ResetCountsOnlyWhenVerified",
        "A tier counted as cleared holds no entry of other weights than the engine's.",
        r"\A t \in cleared : caches[t] \subseteq {weights}",
        lambda s: all(s.caches[TIERS.index(t)] <= {s.weights} for t in s.cleared),
    ),
    Invariant(
        "EvidenceIsTrue",
        "Outside TAINTED, evidence held by the controller is true of the engine: label, "
        "weights (up to what the digest can see) and run state are those of the generation "
        "the controller believes in; a passed probe means they compute as it. It speaks of "
        "the engine it was gathered on: a process replaced out of band since is unknown "
        "until the next audit.",
        r"""(phase # "TAINTED" /\ ~replaced) =>
    LET b == IF phase \in PostMutationPhases /\ target # 0 THEN target ELSE committed
    IN /\ ("version" \in evidence => label = b)
       /\ ("identity" \in evidence => weights \in {b, BROKEN})
       /\ ("probe" \in evidence => weights = b)
       /\ ("resumed" \in evidence => ~paused)""",
        lambda s: s.phase is Phase.TAINTED or s.replaced or (
            ("version" not in s.evidence or s.label == _believed(s))
            and ("identity" not in s.evidence or s.weights in (_believed(s), BROKEN))
            and ("probe" not in s.evidence or s.weights == _believed(s))
            and ("resumed" not in s.evidence or not s.paused)
        ),
    ),
    Invariant(
        "PublishedWasVerified",
        "In READY the controller holds every piece of evidence, or none: an audit failed, "
        "the engine was suspected unreachable, or the controller restarted during an audit, "
        "and admissions and updates wait until an audit passes.",
        'phase = "READY" => evidence \\in {AllEvidence, {}}',
        lambda s: s.phase is not Phase.READY or s.evidence in (ALL_EVIDENCE, frozenset()),
    ),
    Invariant(
        "TargetIsNext",
        "The target is none or the generation after the committed one; none while "
        "uninitialised or READY.",
        r'target \in {0, committed + 1} /\ (phase \in {"UNINITIALIZED", "READY"} => target = 0)',
        lambda s: s.target in (0, s.committed + 1)
        and (s.phase not in (Phase.UNINITIALIZED, Phase.READY) or s.target == 0),
    ),
    Invariant(
        "FencedTaintServesNothing",
        "A fenced TAINTED engine is paused, runs no request and reports the taint label: "
        "nobody calling it directly is served by, or misled about, unpublished weights "
        "(until someone replaces its process out of band: a fresh process is no longer "
        "fenced, and serves again only after verified re-admission).",
        f'(phase = "TAINTED" /\\ "{FENCED}" \\in evidence /\\ ~replaced) => '
        r"(paused /\ label = TAINT /\ \A i \in Slots : req[i] = 0)",
        lambda s: not (s.phase is Phase.TAINTED and FENCED in s.evidence and not s.replaced)
        or (s.paused and s.label == TAINT and not any(s.req)),
    ),
)

ACTION_PROPERTIES: tuple[ActionProperty, ...] = (
    ActionProperty(
        "GenerationsMoveForward",
        "The committed generation never goes back and moves one step at a time.",
        r"committed' \in {committed, committed + 1}",
        lambda s, t: t.committed in (s.committed, s.committed + 1),
    ),
    ActionProperty(
        "TaintedIsAbsorbing",
        "Once TAINTED, the controller stays TAINTED (no admission, no publish) unless an "
        "explicit, verified re-admission onto the committed generation succeeds.",
        r"""phase = "TAINTED" =>
            /\ committed' = committed /\ bind' = bind
            /\ (phase' = "TAINTED" \/ pending = "readmit")""",
        lambda s, t: s.phase is not Phase.TAINTED
        or (t.committed == s.committed and t.bind == s.bind
            and (t.phase is Phase.TAINTED or s.pending == "readmit")),
    ),
    ActionProperty(
        "NoAdmissionInDoubt",
        "A rollout is never admitted on an engine seen unreachable (a failed audit, a "
        "suspicion) and not verified since (a passed audit or re-admission).",
        r"""(\E i \in Slots : bind[i] = 0 /\ bind'[i] # 0) => ~doubt""",
        lambda s, t: not s.doubt
        or not any(a == 0 and b != 0 for a, b in zip(s.bind, t.bind, strict=True)),
    ),
    ActionProperty(
        "AdmissionOnlyInReady",
        "A rollout is admitted only in READY.",
        r"""(\E i \in Slots : bind[i] = 0 /\ bind'[i] # 0) => phase = "READY" """,
        lambda s, t: s.phase is Phase.READY
        or not any(a == 0 and b != 0 for a, b in zip(s.bind, t.bind, strict=True)),
    ),
    ActionProperty(
        "BindingsKeepTheirGeneration",
        "History: a rollout is released under the generation it was admitted under; its "
        "binding never changes while it is held.",
        r"\A i \in Slots : (bind[i] # 0 /\ bind'[i] # 0) => bind'[i] = bind[i]",
        lambda s, t: all(a == 0 or b == 0 or a == b for a, b in zip(s.bind, t.bind, strict=True)),
    ),
    ActionProperty(
        "NoRolloutCrossesMutation",
        "History: a mutation begins only with no rollout bound, and nothing is admitted "
        "while it is in flight.",
        r"""(pending' = "mutate" /\ pending # "mutate") => \A i \in Slots : bind[i] = 0""",
        lambda s, t: not (t.pending == "mutate" and s.pending != "mutate") or not any(s.bind),
    ),
    ActionProperty(
        "WeightsChangeOnlyWhenQuiesced",
        "The engine's weights change only in UPDATING, paused, with nothing running or bound "
        "(or by a re-admission, whose abort-mode pause ends every request first), unless its "
        "process is, or was since it was last verified, replaced out of band.",
        r"""weights' # weights =>
            \/ /\ phase = "UPDATING"
               /\ paused
               /\ \A i \in Slots : bind[i] = 0 /\ req[i] = 0
            \/ /\ pending' = "readmit"
               /\ paused'
               /\ \A i \in Slots : bind[i] = 0 /\ req'[i] = 0
            \/ replaced'""",
        lambda s, t: t.weights == s.weights or t.replaced
        or (s.phase is Phase.UPDATING and s.paused and not any(s.bind) and not any(s.req))
        or (t.pending == "readmit" and t.paused and not any(s.bind) and not any(t.req)),
    ),
    ActionProperty(
        "PublishOnlyVerified",
        "History: a new generation is published only from RESUMING with every piece of "
        "evidence, every cache tier verified clean since the mutation, and no rollout bound.",
        r"""(committed' # committed /\ phase # "UNINITIALIZED") =>
            /\ phase = "RESUMING"
            /\ evidence = AllEvidence
            /\ cleared = Tiers
            /\ \A i \in Slots : bind[i] = 0""",
        lambda s, t: t.committed == s.committed or s.phase is Phase.UNINITIALIZED
        or (s.phase is Phase.RESUMING and s.evidence == ALL_EVIDENCE
            and s.cleared == frozenset(TIERS) and not any(s.bind)),
    ),
    ActionProperty(
        "EvidenceOnlyWhileClosed",
        "Evidence about the weights is gathered only while admissions are closed and no "
        "rollout is bound (re-confirming that the engine runs is allowed while draining), "
        "or by an audit of a READY engine, which reads all of it anew.",
        r"""(evidence' \ evidence) \ {"resumed"} # {} =>
            \/ /\ phase \notin {"READY", "DRAINING"}
               /\ \A i \in Slots : bind[i] = 0
            \/ /\ phase = "READY" /\ pending = "audit"
               /\ evidence' = AllEvidence""",
        lambda s, t: not (t.evidence - s.evidence - {"resumed"})
        or (s.phase not in (Phase.READY, Phase.DRAINING) and not any(s.bind))
        or (s.phase is Phase.READY and s.pending == "audit" and t.evidence == ALL_EVIDENCE),
    ),
)


# ---------------------------------------------------------------------------- the spec


# ------------------------------------------------------------------- liveness

@dataclass(frozen=True)
class Fairness:
    """A weak-fairness assumption: a behaviour in which one of ``actions`` (any
    parameter) stays enabled from some point on takes one of them eventually."""

    name: str
    doc: str
    actions: frozenset[str]
    #: Strong: one of ``actions`` enabled again and again (not necessarily all along) is
    #: eventually taken.
    strong: bool = False
    #: Only from states where this holds (over the state of the unit that takes the
    #: actions: an engine's, a member's): a step the controller takes of its own accord in
    #: some states and only when asked in others (TLA+: ``WF_vars(when /\ A)``).
    when: Callable[[Any], bool] | None = None
    when_tla: str = ""

    def counts(self, s: Any, action: str) -> bool:
        """A step of ``action`` from ``s`` is one of this class's."""
        return action in self.actions and (self.when is None or self.when(s))


@dataclass(frozen=True)
class Liveness:
    """``when ~> then``: whenever ``when`` holds, ``then`` holds then or later, in every
    behaviour that meets the spec's fairness assumptions (each over a state and the
    bounds, as TLA+ reads the constants)."""

    name: str
    doc: str
    when: Callable[[State, Bounds], bool]
    then: Callable[[State, Bounds], bool]
    when_tla: str
    then_tla: str


#: Steps the controller takes of its own accord (its runner does, each within its
#: deadline): every one is weakly fair. Not fair, so that a liveness property cannot lean
#: on them: the clients' admit and release (an agentic episode may hold a rollout for
#: ever; the drain's deadline, not the client, ends an update), the trainer's update
#: request, the operator's audit and re-admission, suspicion, and faults (an engine's
#: replacement, the controller's crash), which the fault budget bounds instead: a run
#: has finitely many, the honest assumption for a controller whose retries are bounded.
CONTROLLER_STEPS = frozenset({
    "bootstrap_begin", "cancel_update", "pause_begin", "pause_abort_begin", "abandon_update",
    "mutate_begin", "reset_begin", "invalidated", "validate_begin", "resume_begin",
    "probe_begin", "publish", "reopen", "give_up", "fence_begin", "release_aborted"})
FAIRNESS: tuple[Fairness, ...] = (
    Fairness("OperationsReturn",
             "An operation in flight returns: an answer, or its deadline's (the outcomes of "
             "the operation pending, together).",
             frozenset(a.name for a in ACTIONS if a.kind is Kind.OUTCOME)),
    Fairness("EngineFinishes", "The engine finishes a request it runs.",
             frozenset({"engine_finish"})),
    *(Fairness(f"Controller_{n}", f"The controller takes {n} when it may.", frozenset({n}))
      for n in sorted(CONTROLLER_STEPS - {"fence_begin"})),
    Fairness("Controller_fence_begin",
             "The controller fences a TAINTED engine whenever it may, again after every "
             "failed re-admission (the runner fences right after one): strong, so that an "
             "operator retrying re-admission cannot starve the fence.",
             frozenset({"fence_begin"}), strong=True),
)
LIVENESS: tuple[Liveness, ...] = (
    Liveness(
        "UpdateEnds",
        "Every update requested ends: published (READY with no target) or TAINTED "
        "(fenced, to be re-admitted), whatever the clients do with their rollouts.",
        lambda s, _b: s.target != 0 and s.phase is not Phase.TAINTED,
        lambda s, _b: (s.phase is Phase.READY and s.target == 0) or s.phase is Phase.TAINTED,
        'target # 0 /\\ phase # "TAINTED"',
        '(phase = "READY" /\\ target = 0) \\/ phase = "TAINTED"'),
    Liveness(
        "TaintedIsFenced",
        "A TAINTED engine is fenced (its fence confirmed) unless it leaves TAINTED first "
        "(re-admitted): failing closed ends in a fence, not in a wait.",
        lambda s, _b: s.phase is Phase.TAINTED and FENCED not in s.evidence,
        lambda s, _b: s.phase is not Phase.TAINTED or FENCED in s.evidence,
        f'phase = "TAINTED" /\\ "{FENCED}" \\notin evidence',
        f'phase # "TAINTED" \\/ "{FENCED}" \\in evidence'),
    Liveness(
        "ReadmitServes",
        "A TAINTED engine that is healthy and re-admitted serves again: once its reload "
        "holds the committed generation (weights and label) and nothing fails any more "
        "(the fault budget spent), the re-admission ends READY with every piece of "
        "evidence, whatever the clients do.",
        lambda s, b: s.pending == "readmit" and s.weights == s.committed
        and s.label == s.committed and s.faults == b.faults,
        lambda s, _b: s.phase is Phase.READY,
        'pending = "readmit" /\\ weights = committed /\\ label = committed '
        '/\\ faults = MaxFaults',
        'phase = "READY"'),
)


@dataclass(frozen=True)
class Spec:
    """A complete, named specification: the table, the properties and the bounds."""

    name: str = "RolloutCore"
    actions: tuple[Action, ...] = ACTIONS
    invariants: tuple[Invariant, ...] = INVARIANTS
    action_properties: tuple[ActionProperty, ...] = ACTION_PROPERTIES
    fairness: tuple[Fairness, ...] = FAIRNESS
    liveness: tuple[Liveness, ...] = LIVENESS
    bounds: Bounds = Bounds()
    #: Phases in which the system may legitimately stop for good: none (a TAINTED engine
    #: can always be fenced or re-admitted), so every state without a successor is a
    #: deadlock, for the explorer and for TLC alike.
    terminal_phases: frozenset[Phase] = frozenset()

    def with_bounds(self, bounds: Bounds) -> Spec:
        return replace(self, bounds=bounds)

    @cached_property  # explorers look actions up by name millions of times
    def _by_name(self) -> Mapping[str, Action]:
        return {a.name: a for a in self.actions}

    def action(self, name: str) -> Action:
        return self._by_name[name]  # KeyError on an unknown name

    def replace_action(self, name: str, **changes: Any) -> Spec:
        self.action(name)  # KeyError on a typo
        acts = tuple(replace(a, **changes) if a.name == name else a for a in self.actions)
        return replace(self, actions=acts)

    def params(self, action: Action) -> Sequence[Param]:
        if action.param == "slot":
            return range(1, self.bounds.rollouts + 1)
        if action.param == "tier":
            return TIERS
        return (None,)

    def initial_states(self) -> tuple[State, ...]:
        return initial_states(self.bounds)

    def in_flight_worlds(self, s: State) -> list[Updates]:
        """What the operation in flight may have done to the engine: nothing, or the world
        effect of any of its outcomes the engine can produce (a crash loses the answer)."""
        out: list[Updates] = [{}]
        if s.pending == NO_OP:
            return out
        for o in self.actions:
            if o.kind is not Kind.OUTCOME or s.phase not in o.sources:
                continue
            for p in self.params(o):
                if o.when(s, p) and o.truth(s, p):
                    out.extend(o.world(s, p))
        return out

    def step(self, a: Action, s: State, p: Param) -> list[State]:
        """The states action ``a`` with parameter ``p`` leads to from ``s`` (none if it is
        not enabled there, bounds included)."""
        if s.phase not in a.sources:
            return []
        if a.fault and s.faults >= self.bounds.faults:
            return []
        if a.needs_generation and s.committed >= self.bounds.generations:
            return []
        if not (a.when(s, p) and a.truth(s, p)):
            return []
        ctl = dict(a.control(s, p))
        if a.dest is not None:
            ctl["phase"] = a.dest
        if a.fault:
            ctl["faults"] = s.faults + 1
        out: list[State] = []
        rebuild: Callable[..., State] = s._replace  # updates are checked by TLC parity
        for world in (self.in_flight_worlds(s) if a.in_flight else a.world(s, p)):
            nxt = rebuild(**{**world, **ctl})
            if nxt not in out:
                out.append(nxt)
        return out

    def successors(self, s: State) -> list[tuple[Action, Param, State]]:
        """Every (action, parameter, next state) enabled in ``s``."""
        return [(a, p, t) for a in self.actions if s.phase in a.sources
                for p in self.params(a) for t in self.step(a, s, p)]


SPEC = Spec()
