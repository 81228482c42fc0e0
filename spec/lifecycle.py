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

Every external operation is a *begin* action plus *outcome* actions: ok, failed with
proof of no effect, or ambiguous (may or may not have happened). Outcome actions carry
a ``truth`` guard over the ghost variables: the outcome the controller observes is
constrained by what the engine really did. Several outcomes can look the same to the
controller (``observed_as``): a transfer that "returned ok" but installed the wrong
weights is observed as ``mutate_ok``; only later evidence tells them apart.

The controller is generated from the controller half of each action (``sources``,
``when``, ``control``, ``dest``); the model checker, the TLA+ module and the review
document are generated from the whole table. Each action keeps its TLA+ text beside
its Python, and TLC's state graph must equal the Python one edge for edge, which
proves the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
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


#: Cache tiers whose entries depend on the weights. Order is the reset order.
TIERS: tuple[str, ...] = ("prefix", "encoder", "mm")
#: Evidence that must be held, all of it, whenever the controller admits rollouts.
EVIDENCE: tuple[str, ...] = ("version", "identity", "resumed", "probe")
ALL_EVIDENCE = frozenset(EVIDENCE)
#: Evidence that survives pausing: it is about the weights, not about the run state.
WEIGHT_EVIDENCE = frozenset({"version", "identity", "probe"})
NO_OP = "none"
#: Ghost value of ``weights``/``label``: no single generation, and the digest shows it.
MIXED = -1
#: Ghost value of ``weights``: reads as the target to the identity digest but does not
#: compute as it (tensors left on the meta device, layers the digest cannot see). Only a
#: generation reveals it.
BROKEN = -2
#: Phases in which the controller has closed admissions and the engine must be quiet.
QUIET_PHASES = frozenset({Phase.QUIESCED, Phase.UPDATING, Phase.INVALIDATING, Phase.VALIDATING})
#: Phases after a mutation in which evidence speaks about the target generation.
POST_MUTATION_PHASES = frozenset({Phase.INVALIDATING, Phase.VALIDATING, Phase.RESUMING})


@dataclass(frozen=True)
class Bounds:
    """Model bounds: rollout slots, generations (the initial one included), faults."""

    rollouts: int = 2
    generations: int = 3
    faults: int = 2

    def __post_init__(self) -> None:
        if self.rollouts < 1 or self.generations < 1 or self.faults < 0:
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
    faults: int


CONTROL_VARS: tuple[str, ...] = (
    "phase", "committed", "target", "pending", "bind", "cleared", "evidence",
)
GHOST_VARS: tuple[str, ...] = (
    "weights", "label", "paused", "req", "caches", "amb", "stale", "faults",
)
VARIABLES: tuple[str, ...] = CONTROL_VARS + GHOST_VARS
assert State._fields == VARIABLES


def initial_state(bounds: Bounds) -> State:
    """A fresh engine holding generation 1 with empty caches; nothing known yet."""
    free = (0,) * bounds.rollouts
    return State(
        phase=Phase.UNINITIALIZED, committed=0, target=0, pending=NO_OP, bind=free,
        cleared=frozenset(), evidence=frozenset(), weights=1, label=1, paused=False,
        req=free, caches=tuple(frozenset() for _ in TIERS), amb=False, stale=False, faults=0,
    )


INIT_TLA = r"""/\ phase = "UNINITIALIZED"
    /\ committed = 0
    /\ target = 0
    /\ pending = "none"
    /\ bind = [i \in Slots |-> 0]
    /\ cleared = {}
    /\ evidence = {}
    /\ weights = 1
    /\ label = 1
    /\ paused = FALSE
    /\ req = [i \in Slots |-> 0]
    /\ caches = [t \in Tiers |-> {}]
    /\ amb = FALSE
    /\ stale = FALSE
    /\ faults = 0"""


# --------------------------------------------------------------------------- actions

Param = Any  # a slot index (1-based), a tier name, or None
Guard = Callable[[Any, Param], bool]
Updates = Mapping[str, object]


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
    effect. ``*_tla`` hold the same meaning in TLA+.
    """

    name: str
    doc: str
    kind: Kind
    sources: frozenset[Phase]
    dest: Phase | None = None
    param: str | None = None  # None, "slot" or "tier"
    when: Guard = _always
    when_tla: str = "TRUE"
    truth: Guard = _always
    truth_tla: str = "TRUE"
    control: Callable[[Any, Param], Updates] = _no_control
    control_tla: Mapping[str, str] = field(default_factory=dict)
    world: Callable[[State, Param], Sequence[Updates]] = _no_updates
    world_tla: str = "TRUE"
    world_writes: frozenset[str] = frozenset()
    fault: bool = False  # a fault outcome: bounded by ``faults`` in the model
    needs_generation: bool = False  # model bound: a generation must be left to move to
    observed_as: str | None = None  # controller trigger; defaults to ``name``

    @property
    def trigger(self) -> str | None:
        """The controller trigger that performs this action (None: environment)."""
        if self.kind is Kind.ENVIRONMENT:
            return None
        return self.observed_as or self.name

    @property
    def op(self) -> str | None:
        """The operation this begin/outcome belongs to (``mutate`` for ``mutate_ok``)."""
        for op in OPS:
            if self.name.startswith(op + "_"):
                return op
        return None

    @property
    def writes(self) -> frozenset[str]:
        out = set(self.control_tla) | set(self.world_writes)
        if self.dest is not None:
            out.add("phase")
        if self.fault:
            out.add("faults")
        return frozenset(out)


OPS = ("bootstrap", "pause", "mutate", "reset", "validate", "resume", "probe")


def _set(seq: tuple[int, ...], slot: int, value: int) -> tuple[int, ...]:
    return (*seq[:slot - 1], value, *seq[slot:])


def _with_tier(caches: tuple[frozenset[int], ...], tier: str, value: frozenset[int]) -> tuple[
    frozenset[int], ...
]:
    i = TIERS.index(tier)
    return (*caches[:i], value, *caches[i + 1:])


def _pending_is(op: str) -> Guard:
    return lambda c, _p: bool(c.pending == op)


def _idle(c: Any, _p: Param) -> bool:
    return bool(c.pending == NO_OP)


def _compute(s: State) -> Updates:
    """A request runs on the engine: it reads every cache tier, then writes entries of
    the weights it runs on. Reading an entry of other weights is a stale use."""
    w = s.weights
    stale = s.stale or any(c - {w} for c in s.caches)
    return {"caches": tuple(c | {w} for c in s.caches), "stale": stale}


_COMPUTE_TLA = r"""/\ stale' = (stale \/ \E t \in Tiers : caches[t] \ {weights} # {})
        /\ caches' = [t \in Tiers |-> caches[t] \cup {weights}]"""

P = Phase
_ops: list[Action] = []


def _op_outcomes(
    op: str,
    sources: frozenset[Phase],
    back: Phase | None,
    ok: Action,
    *,
    failed_doc: str,
    failed_world: Callable[[State, Param], Sequence[Updates]] = _no_updates,
    failed_world_tla: str = "TRUE",
    failed_writes: frozenset[str] = frozenset(),
    failed_control: Callable[[Any, Param], Updates] | None = None,
    failed_control_tla: Mapping[str, str] | None = None,
    param: str | None = None,
) -> list[Action]:
    """An idempotent operation's begin is written by hand; its ``failed`` outcome is
    uniform: the operation is proven to have had no effect, nothing advances."""
    pend = f'"{op}"' if param is None else f'"{op}_" \\o {param_var(param)}'
    failed = Action(
        name=f"{op}_failed", doc=failed_doc, kind=Kind.OUTCOME, sources=sources, dest=back,
        param=param,
        when=(lambda c, p: bool(c.pending == f"{op}_{p}")) if param else _pending_is(op),
        when_tla=f"pending = {pend}",
        control=failed_control or (lambda _c, _p: {"pending": NO_OP}),
        control_tla=failed_control_tla or {"pending": '"none"'},
        world=failed_world, world_tla=failed_world_tla, world_writes=failed_writes, fault=True,
    )
    return [ok, failed]


def param_var(param: str) -> str:
    return {"slot": "i", "tier": "t"}[param]


def param_domain(param: str) -> str:
    return {"slot": "Slots", "tier": "Tiers"}[param]


ACTIONS: tuple[Action, ...] = (
    # ---- bootstrap ------------------------------------------------------------------
    Action(
        name="bootstrap_begin", kind=Kind.CONTROL, sources=frozenset({P.UNINITIALIZED}),
        doc="Read the fresh engine: label, weight identity, a probe generation.",
        when=_idle, when_tla='pending = "none"',
        control=lambda _c, _p: {"pending": "bootstrap"}, control_tla={"pending": '"bootstrap"'},
    ),
    Action(
        name="bootstrap_ok", kind=Kind.OUTCOME, sources=frozenset({P.UNINITIALIZED}),
        dest=P.READY,
        doc="The engine reports the initial generation's label and identity, is running, and "
        "its probe output matches: generation 1 is committed and admissions open.",
        when=_pending_is("bootstrap"), when_tla='pending = "bootstrap"',
        truth=lambda s, _p: s.weights == 1 and s.label == 1 and not s.paused,
        truth_tla=r"weights = 1 /\ label = 1 /\ ~paused",
        control=lambda _c, _p: {"pending": NO_OP, "committed": 1, "evidence": ALL_EVIDENCE},
        control_tla={"pending": '"none"', "committed": "1", "evidence": "AllEvidence"},
    ),
    Action(
        name="bootstrap_failed", kind=Kind.OUTCOME, sources=frozenset({P.UNINITIALIZED}),
        doc="The engine could not be read (or disagreed); stay uninitialised.",
        when=_pending_is("bootstrap"), when_tla='pending = "bootstrap"',
        control=lambda _c, _p: {"pending": NO_OP}, control_tla={"pending": '"none"'},
        fault=True,
    ),
    # ---- rollouts (the application) ---------------------------------------------------
    Action(
        name="admit", kind=Kind.CONTROL, sources=frozenset({P.READY}), param="slot",
        doc="Admit a rollout: bind it to the committed generation; the engine starts it.",
        when=lambda c, i: c.bind[i - 1] == 0, when_tla="bind[i] = 0",
        truth=lambda s, i: s.req[i - 1] == 0, truth_tla="req[i] = 0",
        control=lambda c, i: {"bind": _set(c.bind, i, c.committed)},
        control_tla={"bind": "[bind EXCEPT ![i] = committed]"},
        world=lambda s, i: ({"req": _set(s.req, i, s.weights), **_compute(s)},),
        world_tla="/\\ req' = [req EXCEPT ![i] = weights]\n        " + _COMPUTE_TLA,
        world_writes=frozenset({"req", "caches", "stale"}),
    ),
    Action(
        name="engine_finish", kind=Kind.ENVIRONMENT, sources=frozenset(P), param="slot",
        doc="The engine finishes a request (maybe before the application releases it); a "
        "wait-mode pause lets in-flight requests run to completion (observed on vLLM).",
        truth=lambda s, i: s.req[i - 1] != 0,
        truth_tla="req[i] # 0",
        world=lambda s, i: ({"req": _set(s.req, i, 0)},),
        world_tla="req' = [req EXCEPT ![i] = 0]", world_writes=frozenset({"req"}),
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
    # ---- update request, drain, quiesce -------------------------------------------------
    Action(
        name="request_update", kind=Kind.CONTROL, sources=frozenset({P.READY}), dest=P.DRAINING,
        doc="The trainer asks for the next generation: admissions close, draining starts.",
        when=_idle, when_tla='pending = "none"',
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
    Action(
        name="pause_begin", kind=Kind.CONTROL, sources=frozenset({P.DRAINING}),
        doc="Every local binding is released: pause the engine in wait mode (it returns "
        "only once its own requests, orphans included, have finished).",
        when=lambda c, _p: c.pending == NO_OP and not any(c.bind),
        when_tla=r'pending = "none" /\ \A j \in Slots : bind[j] = 0',
        control=lambda _c, _p: {"pending": "pause"}, control_tla={"pending": '"pause"'},
    ),
    *_op_outcomes(
        "pause", frozenset({P.DRAINING}), P.DRAINING,
        Action(
            name="pause_ok", kind=Kind.OUTCOME, sources=frozenset({P.DRAINING}),
            dest=P.QUIESCED,
            doc="The engine reports paused with no request running: quiesced.",
            when=_pending_is("pause"), when_tla='pending = "pause"',
            truth=lambda s, _p: not any(s.req), truth_tla=r"\A j \in Slots : req[j] = 0",
            control=lambda c, _p: {"pending": NO_OP, "evidence": c.evidence - {"resumed"}},
            control_tla={"pending": '"none"', "evidence": 'evidence \\ {"resumed"}'},
            world=lambda _s, _p: ({"paused": True},), world_tla="paused' = TRUE",
            world_writes=frozenset({"paused"}),
        ),
        failed_doc="The pause did not complete (timeout, requests still running): it may "
        "have taken effect (a wait-mode pause does at once on vLLM), so the engine is no "
        "longer known to run: it must be resumed before admissions reopen.",
        failed_control=lambda c, _p: {"pending": NO_OP, "evidence": c.evidence - {"resumed"}},
        failed_control_tla={"pending": '"none"', "evidence": 'evidence \\ {"resumed"}'},
        failed_world=lambda s, _p: ({"paused": s.paused}, {"paused": True}),
        failed_world_tla=r"paused' \in {paused, TRUE}",
        failed_writes=frozenset({"paused"}),
    ),
    Action(
        name="abandon_update", kind=Kind.CONTROL, sources=frozenset({P.QUIESCED}),
        dest=P.RESUMING,
        doc="Give up the update before any mutation: resume the committed generation.",
        when=_idle, when_tla='pending = "none"',
        control=lambda _c, _p: {"target": 0}, control_tla={"target": "0"},
    ),
    # ---- mutation: never retried, ambiguity latches TAINTED -----------------------------
    Action(
        name="mutate_begin", kind=Kind.CONTROL, sources=frozenset({P.QUIESCED}),
        dest=P.UPDATING,
        doc="Start the weight mutation (a collective: never retried).",
        when=lambda c, _p: c.pending == NO_OP and c.target != 0,
        when_tla=r'pending = "none" /\ target # 0',
        control=lambda _c, _p: {"pending": "mutate", "evidence": frozenset(),
                                "cleared": frozenset()},
        control_tla={"pending": '"mutate"', "evidence": "{}", "cleared": "{}"},
    ),
    Action(
        name="mutate_ok", kind=Kind.OUTCOME, sources=frozenset({P.UPDATING}),
        dest=P.INVALIDATING,
        doc="The transfer finalised with the target's label and the target's weights.",
        when=_pending_is("mutate"), when_tla='pending = "mutate"',
        control=lambda _c, _p: {"pending": NO_OP}, control_tla={"pending": '"none"'},
        world=lambda s, _p: ({"weights": s.target, "label": s.target},),
        world_tla=r"weights' = target /\ label' = target",
        world_writes=frozenset({"weights", "label"}),
    ),
    Action(
        name="mutate_ok_unlabelled", kind=Kind.OUTCOME, sources=frozenset({P.UPDATING}),
        dest=P.INVALIDATING, observed_as="mutate_ok", fault=True,
        doc="Returned ok, weights moved, but finalised without the target label (the seed's "
        "bug): looks like mutate_ok; validation must catch it.",
        when=_pending_is("mutate"), when_tla='pending = "mutate"',
        control=lambda _c, _p: {"pending": NO_OP}, control_tla={"pending": '"none"'},
        world=lambda s, _p: ({"weights": s.target},), world_tla="weights' = target",
        world_writes=frozenset({"weights"}),
    ),
    Action(
        name="mutate_ok_wrong_weights", kind=Kind.OUTCOME, sources=frozenset({P.UPDATING}),
        dest=P.INVALIDATING, observed_as="mutate_ok", fault=True,
        doc="Returned ok with the target label, but the engine holds other weights (a "
        "different checkpoint, a partial load): looks like mutate_ok.",
        when=_pending_is("mutate"), when_tla='pending = "mutate"',
        control=lambda _c, _p: {"pending": NO_OP}, control_tla={"pending": '"none"'},
        world=lambda s, _p: ({"weights": MIXED, "label": s.target},),
        world_tla=r"weights' = MIXED /\ label' = target",
        world_writes=frozenset({"weights", "label"}),
    ),
    Action(
        name="mutate_ok_broken", kind=Kind.OUTCOME, sources=frozenset({P.UPDATING}),
        dest=P.INVALIDATING, observed_as="mutate_ok", fault=True,
        doc="Returned ok with the target label; the weights read as the target's to the "
        "identity digest but do not compute as them: only the probe can tell.",
        when=_pending_is("mutate"), when_tla='pending = "mutate"',
        control=lambda _c, _p: {"pending": NO_OP}, control_tla={"pending": '"none"'},
        world=lambda s, _p: ({"weights": BROKEN, "label": s.target},),
        world_tla=r"weights' = BROKEN /\ label' = target",
        world_writes=frozenset({"weights", "label"}),
    ),
    Action(
        name="mutate_refused", kind=Kind.OUTCOME, sources=frozenset({P.UPDATING}),
        dest=P.QUIESCED, fault=True,
        doc="Refused with proof that nothing moved (identity mismatch, no headroom, init "
        "refused): the update is over, the old evidence stands again.",
        when=_pending_is("mutate"), when_tla='pending = "mutate"',
        control=lambda _c, _p: {"pending": NO_OP, "target": 0, "evidence": WEIGHT_EVIDENCE},
        control_tla={"pending": '"none"', "target": "0", "evidence": "WeightEvidence"},
    ),
    Action(
        name="mutate_ambiguous", kind=Kind.OUTCOME, sources=frozenset({P.UPDATING}),
        dest=P.TAINTED, fault=True,
        doc="Timed out, died halfway or failed unclassifiably: the weights may be old, new "
        "or mixed. TAINTED, nothing retries the collective.",
        when=_pending_is("mutate"), when_tla='pending = "mutate"',
        control=lambda _c, _p: {"pending": NO_OP}, control_tla={"pending": '"none"'},
        world=lambda s, _p: tuple(
            {"weights": w, "label": lab, "amb": True}
            for w in sorted({s.committed, s.target, MIXED})
            for lab in sorted({s.committed, s.target})
        ),
        world_tla=r"""/\ weights' \in {committed, target, MIXED}
        /\ label' \in {committed, target}
        /\ amb' = TRUE""",
        world_writes=frozenset({"weights", "label", "amb"}),
    ),
    # ---- invalidation: every tier, verified ---------------------------------------------
    Action(
        name="reset_begin", kind=Kind.CONTROL, sources=frozenset({P.INVALIDATING}),
        param="tier",
        doc="Ask the engine to reset one cache tier.",
        when=lambda c, t: c.pending == NO_OP and t not in c.cleared,
        when_tla=r'pending = "none" /\ t \notin cleared',
        control=lambda _c, t: {"pending": f"reset_{t}"},
        control_tla={"pending": '"reset_" \\o t'},
    ),
    *_op_outcomes(
        "reset", frozenset({P.INVALIDATING}), P.INVALIDATING,
        Action(
            name="reset_ok", kind=Kind.OUTCOME, sources=frozenset({P.INVALIDATING}),
            param="tier",
            doc="The reset is verified (response body and, for prefix KV, the hit counters).",
            when=lambda c, t: c.pending == f"reset_{t}", when_tla='pending = "reset_" \\o t',
            control=lambda c, t: {"pending": NO_OP, "cleared": c.cleared | {t}},
            control_tla={"pending": '"none"', "cleared": r"cleared \cup {t}"},
            world=lambda s, t: ({"caches": _with_tier(s.caches, t, frozenset())},),
            world_tla="caches' = [caches EXCEPT ![t] = {}]",
            world_writes=frozenset({"caches"}),
        ),
        failed_doc="The reset was refused (success:false, blocks in use) or could not be "
        "verified (empty body): it may or may not have cleared; it does not count.",
        failed_world=lambda s, t: (
            {"caches": s.caches}, {"caches": _with_tier(s.caches, t, frozenset())},
        ),
        failed_world_tla=r"caches' \in {caches, [caches EXCEPT ![t] = {}]}",
        failed_writes=frozenset({"caches"}),
        param="tier",
    ),
    Action(
        name="invalidated", kind=Kind.CONTROL, sources=frozenset({P.INVALIDATING}),
        dest=P.VALIDATING,
        doc="Every tier is verified clean.",
        when=lambda c, _p: c.pending == NO_OP and c.cleared == frozenset(TIERS),
        when_tla=r'pending = "none" /\ cleared = Tiers',
    ),
    # ---- validation while paused -------------------------------------------------------
    Action(
        name="validate_begin", kind=Kind.CONTROL, sources=frozenset({P.VALIDATING}),
        doc="Read the engine's label and the identity of the weights it holds (paused).",
        when=_idle, when_tla='pending = "none"',
        control=lambda _c, _p: {"pending": "validate"}, control_tla={"pending": '"validate"'},
    ),
    *_op_outcomes(
        "validate", frozenset({P.VALIDATING}), P.VALIDATING,
        Action(
            name="validate_ok", kind=Kind.OUTCOME, sources=frozenset({P.VALIDATING}),
            dest=P.RESUMING,
            doc="Label and weight identity read as the target's (the digest cannot see "
            "BROKEN weights).",
            when=_pending_is("validate"), when_tla='pending = "validate"',
            truth=lambda s, _p: s.label == s.target and s.weights in (s.target, BROKEN),
            truth_tla=r"label = target /\ weights \in {target, BROKEN}",
            control=lambda c, _p: {
                "pending": NO_OP, "evidence": c.evidence | {"version", "identity"}},
            control_tla={"pending": '"none"',
                         "evidence": r'evidence \cup {"version", "identity"}'},
        ),
        failed_doc="The reads failed (timeout, connection reset): retry them.",
    ),
    Action(
        name="validate_mismatch", kind=Kind.OUTCOME, sources=frozenset({P.VALIDATING}),
        dest=P.TAINTED,
        doc="The engine holds something other than the target (label or identity): the "
        "mutation's outcome is ambiguous after all. TAINTED.",
        when=_pending_is("validate"), when_tla='pending = "validate"',
        truth=lambda s, _p: s.label != s.target or s.weights not in (s.target, BROKEN),
        truth_tla=r"label # target \/ weights \notin {target, BROKEN}",
        control=lambda _c, _p: {"pending": NO_OP}, control_tla={"pending": '"none"'},
        world=lambda _s, _p: ({"amb": True},), world_tla="amb' = TRUE",
        world_writes=frozenset({"amb"}),
    ),
    # ---- resume, probe generation, publish -----------------------------------------------
    Action(
        name="resume_begin", kind=Kind.CONTROL,
        sources=frozenset({P.DRAINING, P.RESUMING}),
        doc="Resume the engine (after a failed pause, or after validation); admissions stay "
        "closed.",
        when=lambda c, _p: c.pending == NO_OP and "resumed" not in c.evidence,
        when_tla=r'pending = "none" /\ "resumed" \notin evidence',
        control=lambda _c, _p: {"pending": "resume"}, control_tla={"pending": '"resume"'},
    ),
    *_op_outcomes(
        "resume", frozenset({P.DRAINING, P.RESUMING}), None,
        Action(
            name="resume_ok", kind=Kind.OUTCOME, sources=frozenset({P.DRAINING, P.RESUMING}),
            doc="The engine reads as running.",
            when=_pending_is("resume"), when_tla='pending = "resume"',
            control=lambda c, _p: {"pending": NO_OP, "evidence": c.evidence | {"resumed"}},
            control_tla={"pending": '"none"', "evidence": r'evidence \cup {"resumed"}'},
            world=lambda _s, _p: ({"paused": False},), world_tla="paused' = FALSE",
            world_writes=frozenset({"paused"}),
        ),
        failed_doc="The resume failed and the engine reads as paused: retry.",
    ),
    Action(
        name="probe_begin", kind=Kind.CONTROL, sources=frozenset({P.RESUMING}),
        doc="Run the post-update probe generation (admissions still closed).",
        when=lambda c, _p: (
            c.pending == NO_OP and c.target != 0 and "resumed" in c.evidence
            and "probe" not in c.evidence
        ),
        when_tla=r'pending = "none" /\ target # 0 /\ "resumed" \in evidence '
        r'/\ "probe" \notin evidence',
        control=lambda _c, _p: {"pending": "probe"}, control_tla={"pending": '"probe"'},
    ),
    *_op_outcomes(
        "probe", frozenset({P.RESUMING}), P.RESUMING,
        Action(
            name="probe_ok", kind=Kind.OUTCOME, sources=frozenset({P.RESUMING}),
            doc="The probe's greedy tokens equal the target's reference.",
            when=_pending_is("probe"), when_tla='pending = "probe"',
            truth=lambda s, _p: s.weights == s.target, truth_tla="weights = target",
            control=lambda c, _p: {"pending": NO_OP, "evidence": c.evidence | {"probe"}},
            control_tla={"pending": '"none"', "evidence": r'evidence \cup {"probe"}'},
            world=lambda s, _p: (_compute(s),), world_tla=_COMPUTE_TLA,
            world_writes=frozenset({"caches", "stale"}),
        ),
        failed_doc="The probe request failed (timeout, 5xx): retry.",
    ),
    Action(
        name="probe_mismatch", kind=Kind.OUTCOME, sources=frozenset({P.RESUMING}),
        dest=P.TAINTED,
        doc="The probe generated something other than the target's reference: TAINTED.",
        when=_pending_is("probe"), when_tla='pending = "probe"',
        truth=lambda s, _p: s.weights != s.target, truth_tla="weights # target",
        control=lambda _c, _p: {"pending": NO_OP}, control_tla={"pending": '"none"'},
        world=lambda _s, _p: ({"amb": True},), world_tla="amb' = TRUE",
        world_writes=frozenset({"amb"}),
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
        sources=frozenset({P.INVALIDATING, P.VALIDATING, P.RESUMING}), dest=P.TAINTED,
        doc="Retries of an idempotent step after a mutation are exhausted: fail closed.",
        when=lambda c, _p: c.pending == NO_OP and c.target != 0,
        when_tla=r'pending = "none" /\ target # 0',
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
        "Every rollout, from admission to release and for as long as the engine runs it, "
        "sees exactly the weights of the generation it was admitted under.",
        r"\A i \in Slots : (bind[i] # 0 => weights = bind[i]) /\ (req[i] # 0 => weights = req[i])",
        lambda s: all(b == 0 or s.weights == b for b in s.bind)
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
        "committed generation's weights.",
        r'phase = "READY" => (weights = committed /\ label = committed /\ ~paused)',
        lambda s: s.phase is not Phase.READY
        or (s.weights == s.committed and s.label == s.committed and not s.paused),
    ),
    Invariant(
        "ReadyCachesCoherent",
        "In READY no cache tier holds an entry computed under another generation.",
        r'phase = "READY" => \A t \in Tiers : caches[t] \subseteq {committed}',
        lambda s: s.phase is not Phase.READY or all(c <= {s.committed} for c in s.caches),
    ),
    Invariant(
        "NoStaleCacheUse",
        "No request ever reads a cache entry computed under other weights than its own.",
        "~stale",
        lambda s: not s.stale,
    ),
    Invariant(
        "EngineQuietWhileClosed",
        "From QUIESCED to VALIDATING the engine is paused, runs no request and no rollout "
        "is bound: mutation happens only when quiesced.",
        r"phase \in QuietPhases => (paused /\ \A i \in Slots : bind[i] = 0 /\ req[i] = 0)",
        lambda s: s.phase not in QUIET_PHASES or (s.paused and not any(s.bind) and not any(s.req)),
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
        "the controller believes in; a passed probe means they compute as it.",
        r"""phase # "TAINTED" =>
    LET b == IF phase \in PostMutationPhases /\ target # 0 THEN target ELSE committed
    IN /\ ("version" \in evidence => label = b)
       /\ ("identity" \in evidence => weights \in {b, BROKEN})
       /\ ("probe" \in evidence => weights = b)
       /\ ("resumed" \in evidence => ~paused)""",
        lambda s: s.phase is Phase.TAINTED or (
            ("version" not in s.evidence or s.label == _believed(s))
            and ("identity" not in s.evidence or s.weights in (_believed(s), BROKEN))
            and ("probe" not in s.evidence or s.weights == _believed(s))
            and ("resumed" not in s.evidence or not s.paused)
        ),
    ),
    Invariant(
        "PublishedWasVerified",
        "Admissions are open only with all evidence in hand.",
        'phase = "READY" => evidence = AllEvidence',
        lambda s: s.phase is not Phase.READY or s.evidence == ALL_EVIDENCE,
    ),
    Invariant(
        "TargetIsNext",
        "The target is none or the generation after the committed one; none while "
        "uninitialised or READY.",
        r'target \in {0, committed + 1} /\ (phase \in {"UNINITIALIZED", "READY"} => target = 0)',
        lambda s: s.target in (0, s.committed + 1)
        and (s.phase not in (Phase.UNINITIALIZED, Phase.READY) or s.target == 0),
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
        "Once TAINTED, the controller stays TAINTED: no admission, no publish.",
        r"""phase = "TAINTED" => (phase' = "TAINTED" /\ committed' = committed /\ bind' = bind)""",
        lambda s, t: s.phase is not Phase.TAINTED
        or (t.phase is Phase.TAINTED and t.committed == s.committed and t.bind == s.bind),
    ),
    ActionProperty(
        "AdmissionOnlyInReady",
        "A rollout is admitted only in READY.",
        r"""(\E i \in Slots : bind[i] = 0 /\ bind'[i] # 0) => phase = "READY" """,
        lambda s, t: s.phase is Phase.READY
        or not any(a == 0 and b != 0 for a, b in zip(s.bind, t.bind, strict=True)),
    ),
    ActionProperty(
        "WeightsChangeOnlyWhenQuiesced",
        "The engine's weights change only in UPDATING, paused, with nothing running or bound.",
        r"""weights' # weights =>
            /\ phase = "UPDATING"
            /\ paused
            /\ \A i \in Slots : bind[i] = 0 /\ req[i] = 0""",
        lambda s, t: t.weights == s.weights
        or (s.phase is Phase.UPDATING and s.paused and not any(s.bind) and not any(s.req)),
    ),
    ActionProperty(
        "PublishOnlyVerified",
        "A new generation is published only from RESUMING with every piece of evidence, "
        "every cache tier verified clean since the mutation, and no rollout bound.",
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
        "rollout is bound (re-confirming that the engine runs is allowed while draining).",
        r"""(evidence' \ evidence) \ {"resumed"} # {} =>
            /\ phase \notin {"READY", "DRAINING"}
            /\ \A i \in Slots : bind[i] = 0""",
        lambda s, t: not (t.evidence - s.evidence - {"resumed"})
        or (s.phase not in (Phase.READY, Phase.DRAINING) and not any(s.bind)),
    ),
)


# ---------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class Spec:
    """A complete, named specification: the table, the properties and the bounds."""

    name: str = "RolloutCore"
    actions: tuple[Action, ...] = ACTIONS
    invariants: tuple[Invariant, ...] = INVARIANTS
    action_properties: tuple[ActionProperty, ...] = ACTION_PROPERTIES
    bounds: Bounds = Bounds()
    #: Phases in which the system may legitimately stop for good.
    terminal_phases: frozenset[Phase] = frozenset({Phase.TAINTED})

    def with_bounds(self, bounds: Bounds) -> Spec:
        return replace(self, bounds=bounds)

    def action(self, name: str) -> Action:
        for a in self.actions:
            if a.name == name:
                return a
        raise KeyError(name)

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

    def initial(self) -> State:
        return initial_state(self.bounds)

    def successors(self, s: State) -> list[tuple[Action, Param, State]]:
        """Every (action, parameter, next state) enabled in ``s``."""
        out: list[tuple[Action, Param, State]] = []
        for a in self.actions:
            if s.phase not in a.sources:
                continue
            if a.fault and s.faults >= self.bounds.faults:
                continue
            if a.needs_generation and s.committed >= self.bounds.generations:
                continue
            for p in self.params(a):
                if not (a.when(s, p) and a.truth(s, p)):
                    continue
                ctl = dict(a.control(s, p))
                if a.dest is not None:
                    ctl["phase"] = a.dest
                if a.fault:
                    ctl["faults"] = s.faults + 1
                seen: set[State] = set()
                rebuild: Callable[..., State] = s._replace  # updates are checked by TLC parity
                for world in a.world(s, p):
                    nxt = rebuild(**ctl, **world)
                    if nxt not in seen:
                        seen.add(nxt)
                        out.append((a, p, nxt))
        return out


SPEC = Spec()
