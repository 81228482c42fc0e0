"""Deliberately broken variants of the spec: negative controls for every checker.

Each mutant is a bug that real RL stacks ship (several frameworks resume generation in
a ``finally`` even after a failed update, one retries the collective on timeout, several
ignore the boolean of ``reset_prefix_cache``), or a regression found on a real server.
The exhaustive explorer, TLC and the property-based tests must each catch every one of
them with a counterexample.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from rolloutcore.spec.episodes import EpBounds, EpisodeSpec, EpState
from rolloutcore.spec.failover import FailoverSpec, FoBounds
from rolloutcore.spec.failover import _campaign as _failover_campaign
from rolloutcore.spec.fleet import (
    FLEET,
    FLEET_ABORT_WHEN_TLA,
    FLEET_PUBLISH_WHEN_TLA,
    FLEET_RECOVER_WHEN_TLA,
    FLEET_REOPEN_WHEN_TLA,
    N_VALIDATED_TLA,
    FleetAction,
    FleetBounds,
    FleetSpec,
    FleetState,
    FleetView,
    MemberGuard,
    MemberView,
    SlotsView,
    UpdatePolicy,
    _publish_validated,
    held_back,
    quorum,
    serving,
    settled,
    validated,
)
from rolloutcore.spec.gateways import GatewaySpec, released
from rolloutcore.spec.lifecycle import (
    ALL_EVIDENCE,
    FENCED,
    NO_OP,
    TAINT,
    TIERS,
    Phase,
    Spec,
    State,
)
from rolloutcore.spec.staged import StagedSpec


@dataclass(frozen=True)
class Mutant:
    name: str
    doc: str
    apply: Callable[[Spec], Spec]


def _drop_drain_guard(spec: Spec) -> Spec:
    return spec.replace_action(
        "pause_begin", when=lambda c, _p: c.pending == NO_OP, when_tla='pending = "none"'
    )


def _publish_before_validation(spec: Spec) -> Spec:
    without = frozenset({"resumed", "probe"})
    return spec.replace_action("invalidated", dest=Phase.RESUMING).replace_action(
        "publish",
        when=lambda c, _p: c.pending == NO_OP and c.target != 0 and without <= c.evidence,
        when_tla=r'pending = "none" /\ target # 0 /\ {"resumed", "probe"} \subseteq evidence',
    )


def _skip_encoder_tier(spec: Spec) -> Spec:
    rest = frozenset(TIERS) - {"encoder"}
    return spec.replace_action(
        "invalidated",
        when=lambda c, _p: c.pending == NO_OP and rest <= c.cleared,
        when_tla=r'pending = "none" /\ Tiers \ {"encoder"} \subseteq cleared',
    )


def _resume_after_ambiguous(spec: Spec) -> Spec:
    return spec.replace_action("mutate_ambiguous", dest=Phase.INVALIDATING)


def _unverified_reset_counts(spec: Spec) -> Spec:
    return spec.replace_action(
        "reset_failed",
        control=lambda c, t: {"pending": NO_OP, "cleared": c.cleared | {t}},
        control_tla={"pending": '"none"', "cleared": r"cleared \cup {t}"},
    )


def _retry_collective(spec: Spec) -> Spec:
    return spec.replace_action("mutate_ambiguous", dest=Phase.QUIESCED)


def _admit_outside_ready(spec: Spec) -> Spec:
    return spec.replace_action(
        "admit", sources=frozenset({Phase.READY, Phase.DRAINING, Phase.QUIESCED})
    )


def _label_only_validation(spec: Spec) -> Spec:
    return spec.replace_action(
        "validate_ok", truth=lambda s, _p: s.label == s.target, truth_tla="label = target"
    ).replace_action(
        "validate_mismatch", truth=lambda s, _p: s.label != s.target, truth_tla="label # target"
    )


def _skip_probe(spec: Spec) -> Spec:
    needed = ALL_EVIDENCE - {"probe"}
    return spec.replace_action(
        "publish",
        when=lambda c, _p: c.pending == NO_OP and c.target != 0 and needed <= c.evidence,
        when_tla=r'pending = "none" /\ target # 0 /\ {"version", "identity", "resumed"} '
        r"\subseteq evidence",
    ).replace_action(
        "bootstrap_ok",
        control=lambda _c, _p: {"pending": NO_OP, "committed": 1, "evidence": needed},
        control_tla={"pending": '"none"', "committed": "1",
                     "evidence": '{"version", "identity", "resumed"}'},
    ).replace_action(
        "reopen",
        when=lambda c, _p: c.pending == NO_OP and c.target == 0 and needed <= c.evidence,
        when_tla=r'pending = "none" /\ target = 0 /\ {"version", "identity", "resumed"} '
        r"\subseteq evidence",
    )


def _cancel_over_paused_engine(spec: Spec) -> Spec:
    return spec.replace_action(
        "cancel_update", when=lambda c, _p: c.pending == NO_OP, when_tla='pending = "none"'
    )


def _pause_keep_mode(spec: Spec) -> Spec:
    return spec.replace_action("pause_ok", truth=lambda _s, _p: True, truth_tla="TRUE")


def _recover_ready_after_pause(spec: Spec) -> Spec:
    return spec.replace_action(
        "restart_ready", when=lambda c, _p: c.pending == NO_OP, when_tla='pending = "none"')


def _admit_during_resume(spec: Spec) -> Spec:
    return spec.replace_action(
        "admit", sources=frozenset({Phase.READY, Phase.RESUMING}))


def _fence_leaves_engine_serving(spec: Spec) -> Spec:
    return spec.replace_action(
        "fence_ok", world=lambda _s, _p: ({"label": TAINT},), world_tla={"label": "TAINT"})


def _readmit_on_label_only(spec: Spec) -> Spec:
    return spec.replace_action(
        "readmit_ok", truth=lambda s, _p: s.label == s.committed, truth_tla="label = committed")


def _abort_before_requests_gone(spec: Spec) -> Spec:
    return spec.replace_action("pause_abort_ok", truth=lambda _s, _p: True, truth_tla="TRUE")


def _audit_on_label_only(spec: Spec) -> Spec:
    passes = r"label = committed /\ ~paused"
    return spec.replace_action(
        "audit_ok", truth=lambda s, _p: s.label == s.committed and not s.paused,
        truth_tla=passes,
    ).replace_action(
        "audit_mismatch", truth=lambda s, _p: s.label != s.committed or s.paused,
        truth_tla=f"~({passes})")


def _audit_failure_keeps_evidence(spec: Spec) -> Spec:
    return spec.replace_action(
        "audit_failed", control=lambda _c, _p: {"pending": NO_OP},
        control_tla={"pending": '"none"'})


def _never(spec: Spec, *names: str) -> Spec:
    """``spec`` with actions ``names`` never enabled."""
    for name in names:
        spec = spec.replace_action(name, when=lambda _c, _p: False, when_tla="FALSE")
    return spec


#: Liveness mutants: each breaks a liveness property (named) and no safety property, so
#: that only the liveness checks (the explorer's fair-cycle search, TLC under FairSpec)
#: can catch it; the safety checks passing on them is their negative control.
LIVENESS_MUTANTS: tuple[tuple[Mutant, str], ...] = (
    (Mutant("retry_without_budget",
            "A cache reset that fails is retried for ever: its failure no longer spends the "
            "fault budget (a retry loop without a bound).",
            lambda spec: spec.replace_action("reset_failed", fault=False)),
     "UpdateEnds"),
    (Mutant("drain_without_deadline",
            "The drain waits for its rollouts with no deadline: the controller neither "
            "cancels the update nor aborts the rollouts that are not released.",
            lambda spec: _never(spec, "cancel_update", "release_aborted")),
     "UpdateEnds"),
    (Mutant("fence_never_starts",
            "A TAINTED engine is never fenced: the controller waits for an operator instead.",
            lambda spec: _never(spec, "fence_begin")),
     "TaintedIsFenced"),
    (Mutant("readmit_never_passes",
            "The re-admission's check never accepts the engine (it compares with a "
            "generation the reload cannot hold): a healthy engine stays quarantined, safely, "
            "for ever.",
            lambda spec: _never(spec, "readmit_ok").replace_action(
                "readmit_mismatch", truth=lambda _s, _p: True, truth_tla="TRUE")),
     "ReadmitServes"),
)


MUTANTS: tuple[Mutant, ...] = (
    Mutant("drop_drain_guard",
           "Pause (and so mutate) without waiting for bound rollouts to be released.",
           _drop_drain_guard),
    Mutant("publish_before_validation",
           "Skip VALIDATING: publish on the transfer's word without label or identity.",
           _publish_before_validation),
    Mutant("skip_encoder_tier",
           "Invalidate prefix KV and multimodal caches but forget the encoder cache.",
           _skip_encoder_tier),
    Mutant("resume_after_ambiguous",
           "Carry on after an ambiguous mutation as if it had succeeded (fail open).",
           _resume_after_ambiguous),
    Mutant("unverified_reset_counts",
           "Count a refused or unverifiable cache reset (200 with success:false or an "
           "empty body) as done.",
           _unverified_reset_counts),
    Mutant("retry_collective",
           "Retry the weight transfer after an ambiguous failure instead of latching.",
           _retry_collective),
    Mutant("admit_outside_ready",
           "Admit rollouts while draining or quiesced.",
           _admit_outside_ready),
    Mutant("label_only_validation",
           "Validate by the version label alone: a label is not an identity.",
           _label_only_validation),
    Mutant("skip_probe",
           "Publish without the post-update probe generation.",
           _skip_probe),
    Mutant("cancel_over_paused_engine",
           "Regression (found on real vLLM by the pause_timeout scenario): cancel the update "
           "after a failed pause without resuming; a wait-mode pause had already taken "
           "effect, so READY sits over a paused engine.",
           _cancel_over_paused_engine),
    Mutant("pause_keep_mode",
           "Pause in keep mode: in-flight requests freeze and finish on the new weights.",
           _pause_keep_mode),
    Mutant("recover_ready_after_pause",
           "Restart READY from DRAINING after a pause attempt that was never followed by a "
           "confirmed resume: the engine may be paused.",
           _recover_ready_after_pause),
    Mutant("admit_during_resume",
           "Reopen admissions as soon as the engine resumes, before the probe and publish: "
           "a rollout bound under N runs on N+1, and publish changes its generation.",
           _admit_during_resume),
    Mutant("fence_leaves_engine_serving",
           "Fence a TAINTED engine by relabelling it only: direct callers are still served "
           "by weights that were never published.",
           _fence_leaves_engine_serving),
    Mutant("readmit_on_label_only",
           "Re-admit a quarantined engine because it reports the committed label, without "
           "checking the identity of its weights and a probe.",
           _readmit_on_label_only),
    Mutant("abort_before_requests_gone",
           "Drain by aborting, and mutate as soon as the abort-mode pause returns, without "
           "the running count showing the aborted requests gone.",
           _abort_before_requests_gone),
    Mutant("audit_on_label_only",
           "Audit a serving engine by its label and run state, without the identity of its "
           "weights and a probe: a process relaunched out of band on other weights under "
           "the committed label passes and keeps serving.",
           _audit_on_label_only),
    Mutant("audit_failure_keeps_evidence",
           "Treat an audit that could not reach the engine as inconclusive and keep "
           "admitting on the old evidence: rollouts go to an engine in doubt.",
           _audit_failure_keeps_evidence),
)


def mutant(name: str) -> Mutant:
    for m in MUTANTS:
        if m.name == name:
            return m
    raise KeyError(f"no mutant named {name!r}; known: {', '.join(m.name for m in MUTANTS)}")


# ----------------------------------------------------------------------------- fleet


#: Fleet bounds at which a quorum smaller than the fleet shows (a member left behind).
#: A fleet controller that crashes once (two members, both needed, no other fault).
CRASHING = FleetBounds(engines=2, min_serving=2, generations=2, faults=0, rollouts=0,
                       crashes=1)
#: A rolling fleet (K 2, C 1) whose controller crashes once.
ROLLING_CRASH = FleetBounds(engines=2, min_serving=1, generations=2, faults=0, rollouts=0,
                            max_live=2, min_admitting=1, crashes=1)
PARTIAL_QUORUM = FleetBounds(engines=2, min_serving=1, generations=2, faults=1, rollouts=1)
#: Fleet bounds of a rolling update: two live generations, one member always admitting.
ROLLING = FleetBounds(engines=2, min_serving=1, generations=3, faults=0, rollouts=1,
                      max_live=2, min_admitting=1)
#: Three members, two of them in one wave at once (one keeps admitting).
ROLLING_WIDE = FleetBounds(engines=3, min_serving=1, generations=2, faults=0, rollouts=1,
                           max_live=2, min_admitting=1)


@dataclass(frozen=True)
class FleetMutant:
    name: str
    doc: str
    apply: Callable[[FleetSpec], FleetSpec]
    bounds: FleetBounds = FLEET.bounds


def _fleet_action(spec: FleetSpec, name: str, **changes: object) -> FleetSpec:
    acts = tuple(replace(a, **changes) if a.name == name else a for a in spec.actions)  # type: ignore[arg-type]
    if acts == spec.actions:
        raise KeyError(name)
    return replace(spec, actions=acts)


def _member_guard(spec: FleetSpec, action: str, guard: MemberGuard) -> FleetSpec:
    return replace(spec, member_guards={**spec.member_guards, action: guard})


def _migration_target(spec: FleetSpec, target: Callable[..., bool], target_tla: str) -> FleetSpec:
    """The migration with its own rules for the member it leaves, and ``target`` (fleet,
    member, slot, generation) for the one it joins."""
    def when(f: FleetView, s: MemberView, i: int, t: SlotsView, j: int, b: UpdatePolicy) -> bool:
        return (f.fphase in ("READY", "ROLLING") and quorum(f, b)
                and s.phase is Phase.DRAINING and s.bind[i - 1] != 0
                and target(f, t, j, s.bind[i - 1]))
    head = spec.migration.when_tla.split("\n    /\\ Serving(t)", 1)[0]
    return replace(spec, migration=replace(spec.migration, when=when,
                                           when_tla=f"{head}\n    /\\ {target_tla}"))


def _publish_every_member(spec: FleetSpec) -> FleetSpec:
    """fleet_publish commits the target on every member that took part in the update,
    validated or not."""
    def apply(f: FleetState) -> FleetState:
        return _publish_validated(f, commits=lambda g, s: g.ftarget != 0
                                  and s.target == g.ftarget)
    every = ('[n \\in Engines |-> LET e == eng[n] IN IF ftarget # 0 /\\ e.target = ftarget '
             'THEN [e EXCEPT !.phase = "READY", !.committed = e.target, !.target = 0] ELSE e]')
    return _fleet_action(spec, "fleet_publish", apply=apply,
                         apply_tla={**next(a.apply_tla for a in spec.actions
                                           if a.name == "fleet_publish"), "eng": every})


def _decision_waits_on_quarantined(spec: FleetSpec) -> FleetSpec:
    """The fleet's decision waits until no member is TAINTED (a member that failed must
    "finish" first), while a quarantined member is re-admitted only outside the update."""
    def done(f: FleetState, m: State) -> bool:
        return settled(f, m) and m.phase is not Phase.TAINTED

    spec = _fleet_action(
        spec, "fleet_publish",
        when=lambda f, b: all(done(f, m) for m in f.eng)
        and sum(validated(f, m) for m in f.eng) >= b.min_serving,
        when_tla=FLEET_PUBLISH_WHEN_TLA.replace(' \\/ e.phase = "TAINTED"', ""))
    return _fleet_action(
        spec, "fleet_abort",
        when=lambda f, b: all(done(f, m) or held_back(f, m) for m in f.eng)
        and (sum(validated(f, m) for m in f.eng) < b.min_serving
             or any(held_back(f, m) for m in f.eng)),
        when_tla=FLEET_ABORT_WHEN_TLA.replace(
            "Settled(eng[n])", '(Settled(eng[n]) /\\ eng[n].phase # "TAINTED")'))


FLEET_MUTANTS: tuple[FleetMutant, ...] = (
    FleetMutant(
        "decision_waits_on_quarantined",
        "The fleet decides an update only once no member is TAINTED (\"every member must "
        "finish its cycle\"), as the runtime did for a member that could neither pause nor "
        "resume: a quarantined member cannot move during the update, so the fleet never "
        "decides and admissions stay closed for good (a deadlock).",
        _decision_waits_on_quarantined),
    FleetMutant(
        "publish_without_quorum",
        "Publish the target as soon as one member validated it, whatever min_serving says.",
        lambda s: _fleet_action(
            s, "fleet_publish",
            when=lambda f, _b: all(settled(f, m) for m in f.eng)
            and any(validated(f, m) for m in f.eng),
            when_tla=FLEET_PUBLISH_WHEN_TLA.replace(">= MinServing", ">= 1"))),
    FleetMutant(
        "member_publishes_alone",
        "Let each member publish as soon as its own cycle is verified (what frameworks do: "
        "resume each engine when it is updated): the fleet serves two generations.",
        lambda s: _member_guard(s, "publish", (lambda _f, _m, _b: True, "TRUE"))),
    FleetMutant(
        "admit_on_stale_member",
        "Route rollouts to any READY member, including one left on the old generation.",
        lambda s: _member_guard(s, "admit", (lambda f, _m, _b: f.fphase == "READY",
                                              'fphase = "READY"')), PARTIAL_QUORUM),
    FleetMutant(
        "publish_before_settled",
        "Publish once enough members validated, without waiting for the others to settle: "
        "a member still draining keeps rollouts of the old generation.",
        lambda s: _fleet_action(
            s, "fleet_publish",
            when=lambda f, b: sum(validated(f, m) for m in f.eng) >= b.min_serving,
            when_tla=f"{N_VALIDATED_TLA} >= MinServing"), PARTIAL_QUORUM),
    FleetMutant(
        "admit_below_quorum",
        "Admit on any serving member of a READY fleet, without counting them: after an audit "
        "or a suspicion took one out, rollouts go on although fewer than min_serving serve.",
        lambda s: _member_guard(s, "admit", (
            lambda f, m, _b: f.fphase == "READY" and m.committed == f.fcommitted,
            'fphase = "READY" /\\ e.committed = fcommitted'))),
    FleetMutant(
        "reopen_without_quorum",
        "Reopen admissions after an aborted update even if fewer than min_serving members "
        "serve.",
        lambda s: _fleet_action(
            s, "fleet_reopen",
            when=lambda f, _b: all(m.phase in (Phase.READY, Phase.TAINTED)
                                   and m.pending == "none" for m in f.eng),
            when_tla=FLEET_REOPEN_WHEN_TLA.split(" /\\ Cardinality", 1)[0])),
    FleetMutant(
        "wave_below_capacity",
        "Let members on the frontier join a rolling wave without counting who keeps "
        "serving: the whole fleet stops admitting (the bubble the rolling update exists to "
        "remove).",
        lambda s: _member_guard(s, "request_update", (
            lambda f, m, b: (f.fphase in ("UPDATING", "ROLLING") and m.committed == f.fcommitted)
            or (f.fphase in ("READY", "ABORTING") and m.committed < f.fcommitted),
            '\\/ (fphase \\in {"UPDATING", "ROLLING"} /\\ e.committed = fcommitted)\n'
            '       \\/ (fphase \\in {"ABORTING", "READY"} /\\ e.committed < fcommitted)')),
        ROLLING),
    FleetMutant(
        "roll_past_the_floor",
        "Start the next rolling update while members still serve the previous generation: "
        "a third generation goes live beside two (max_live 2).",
        lambda s: _fleet_action(
            s, "fleet_roll", when=lambda f, b: b.max_live >= 2 and quorum(f, b),
            when_tla="MaxLive >= 2 /\\ Cardinality({m \\in Engines : Serving(eng[m])}) "
                     ">= MinServing"), ROLLING),
    FleetMutant(
        "floor_raised_under_rollouts",
        "Raise the floor to the frontier as soon as the wave published, while members still "
        "serve (and hold rollouts of) the old generation.",
        lambda s: _fleet_action(
            s, "fleet_raise_floor", when=lambda f, _b: f.ffloor < f.fcommitted,
            when_tla="ffloor < fcommitted"), ROLLING),
    FleetMutant(
        "migrate_across_generations",
        "Move a draining member's rollout to any serving member, whatever generation it "
        "serves (a router that sees only 'healthy'): the rollout continues under the new "
        "policy, one rollout, two policies (what partial-rollout frameworks do).",
        lambda s: _migration_target(
            s, lambda f, t, j, _g: serving(f, t) and t.bind[j - 1] == 0 and t.req[j - 1] == 0,
            "Serving(t) /\\ t.bind[j] = 0 /\\ t.req[j] = 0"), ROLLING),
    FleetMutant(
        "migrate_into_the_wave",
        "Move a rollout to any member whose committed label is its generation, including one "
        "preparing the update in the same wave (its label changes only at publish): the "
        "rollout lands on an engine that mutates under it.",
        lambda s: _migration_target(
            s, lambda _f, t, j, g: t.phase is not Phase.TAINTED and t.committed == g
            and t.bind[j - 1] == 0 and t.req[j - 1] == 0,
            't.phase # "TAINTED" /\\ t.committed = e.bind[i] /\\ t.bind[j] = 0 '
            "/\\ t.req[j] = 0"), ROLLING_WIDE),
    FleetMutant(
        "recover_before_restarts",
        "Reopen a recovered fleet as soon as a quorum serves, without waiting for every "
        "member's restart: a member the crashed controller left in the middle of its update "
        "goes on as if the new controller knew what its last call did.",
        lambda s: _fleet_action(
            s, "fleet_recover", when=lambda f, b: quorum(f, b),
            when_tla=FLEET_RECOVER_WHEN_TLA.split(" /\\ ", 1)[1]), CRASHING),
    FleetMutant(
        "recover_without_quorum",
        "Reopen a recovered fleet once every member restarted, however few serve (members "
        "left in doubt restart TAINTED and do not).",
        lambda s: _fleet_action(s, "fleet_recover", when=lambda f, _b: not f.fdown,
                                when_tla="fdown = {}"), CRASHING),
    FleetMutant(
        "publish_unverified_members",
        "Publish commits the target on every member that took part in the update, whether "
        "or not its own cycle verified it (a fleet that counts its verified members but "
        "commits them all): a member whose load failed its check serves the generation on "
        "other weights, two policies under one generation number.",
        _publish_every_member, PARTIAL_QUORUM),
    FleetMutant(
        "migration_copies",
        "A migration admits the rollout on the member it joins but leaves it bound on the one "
        "it leaves (a router that retries a rollout elsewhere without cancelling it): one "
        "rollout, two members.",
        lambda s: replace(s, migration=replace(s.migration, leave="engine_finish")), ROLLING),
    FleetMutant(
        "takeover_adopts_outcome",
        "A recovering controller takes the answer to its predecessor's validation as its own "
        "(the member goes on to resume from validate_ok instead of restarting): the new "
        "controller continues a call it never made.",
        lambda s: replace(s, adopted=frozenset({"validate_ok"})), CRASHING),
    FleetMutant(
        "floor_moves_backwards",
        "A wave that validated nothing ends by widening the window again (the floor one "
        "generation below the frontier, so members left behind may serve): the floor, "
        "already raised, moves back.",
        lambda s: _fleet_action(
            s, "fleet_end_wave",
            apply=lambda f: f._replace(fphase="READY", ftarget=0,
                                       ffloor=max(1, f.fcommitted - 1)),
            apply_tla={"fphase": '"READY"', "ftarget": "0",
                       "ffloor": "IF fcommitted > 1 THEN fcommitted - 1 ELSE 1"}), ROLLING),
)


# -------------------------------------------------------------------------- failover


@dataclass(frozen=True)
class FailoverMutant:
    name: str
    doc: str
    apply: Callable[[FailoverSpec], FailoverSpec]


def _fence_skipped(spec: FailoverSpec) -> FailoverSpec:
    camp = spec.action("campaign")
    return spec.replace_action(
        "campaign", apply=lambda f, sp, p: _failover_campaign(f, sp, p, "check"),
        tla=camp.tla.replace('[x \\in Engines |-> "fence"]', '[x \\in Engines |-> "check"]'))


def _takeover_early(spec: FailoverSpec) -> FailoverSpec:
    camp = spec.action("campaign")
    return spec.replace_action(
        "campaign",
        when=lambda f, sp, p: f.ctl[int(str(p[0])) - 1].pc == "standby"
        and f.issued < sp.bounds.epochs,
        tla=camp.tla.replace(" /\\ leader = 0", ""))


FAILOVER_MUTANTS: tuple[FailoverMutant, ...] = (
    FailoverMutant(
        "fence_skipped_at_takeover",
        "A new leader verifies and serves the engines without raising their fences first "
        "(what every RL stack that restarts its driver does): a mutation its deposed "
        "predecessor sent lands under a rollout the new leader admitted.",
        _fence_skipped),
    FailoverMutant(
        "epoch_not_checked_at_engine",
        "The engine takes a mutation whatever its epoch (vLLM sets its weight version "
        "blindly): the new leader's fence stops nothing.",
        lambda s: replace(s, gate=(lambda _epoch, _seen: True, "TRUE"))),
    FailoverMutant(
        "deposed_append_accepted",
        "Journal appends do not compare the leader key's revision (a lease lock alone): a "
        "deposed leader, thawed, appends after its successor and the journal forks.",
        lambda s: replace(s, compare=False)),
    FailoverMutant(
        "takeover_before_lease_expired",
        "A standby takes the leader key while its holder's lease still runs (a lease "
        "shorter on the server than the holder's own clock, or a forced takeover): two "
        "controllers act, each believing it leads. Fencing keeps every other property.",
        _takeover_early),
    FailoverMutant(
        "leader_never_renews",
        "The leader never renews its lease (its keep-alive stopped): the key expires under "
        "it while it is up and acting, and a standby may take over while it still acts. "
        "In this model renewal is a safety matter (LeaseHeldWhileActing, the one property "
        "that rests on the lease's timing); fencing keeps every other property.",
        lambda s: s.replace_action("expire", when=lambda f, _sp, _p: f.leader != 0, tla=(
            "/\\ leader # 0\n    /\\ leader' = 0 /\\ lepoch' = 0\n"
            "    /\\ UNCHANGED <<issued, ctl, jrn, eng, bound, net>>"))),
)


# ------------------------------------------------------------------- fleet liveness


def _wave_waits_on_itself(spec: FleetSpec) -> FleetSpec:
    """Every wave decision waits until no member is between steps *or validated*: the
    members that validated the target wait for the decision, and it for them."""
    def idle(_f: FleetView, m: MemberView) -> bool:
        return m.pending == NO_OP and m.phase in (Phase.READY, Phase.TAINTED)

    def waits(fa: FleetAction) -> FleetAction:
        old = fa.when
        return replace(fa, when=lambda f, b: all(idle(f, m) for m in f.eng) and old(f, b),
                       when_tla='(\\A n \\in Engines : eng[n].pending = "none" '
                                '/\\ eng[n].phase \\in {"READY", "TAINTED"})\n    /\\ '
                                + fa.when_tla)

    wave = ("fleet_publish_wave", "fleet_end_wave", "fleet_abort_wave")
    return replace(spec, actions=tuple(waits(a) if a.name in wave else a
                                       for a in spec.actions))


#: Small bounds for the fleet's liveness (TLC's liveness check grows fast with states): a
#: rolling fleet without rollouts or faults; a strict one with a rollout slot; a strict
#: one with a fault.
LIVENESS_ROLLING = FleetBounds(engines=2, min_serving=1, generations=2, faults=0,
                               rollouts=0, max_live=2, min_admitting=1)
LIVENESS_HELD = FleetBounds(engines=2, min_serving=2, generations=2, faults=0, rollouts=1)
LIVENESS_FAULT = FleetBounds(engines=2, min_serving=2, generations=2, faults=1, rollouts=0)
#: Three members, two of them in one wave at once: where members may take turns to leave an
#: update (FleetSpec.asks_once, LEAVE_STEPS).
LIVENESS_WIDE = FleetBounds(engines=3, min_serving=1, generations=2, faults=0, rollouts=0,
                            max_live=2, min_admitting=1)
#: A rolling fleet with a fault, where a member quarantined below the frontier may leave
#: one other serving (min_admitting 0): the floor's liveness.
LIVENESS_ROLLING_FAULT = FleetBounds(engines=2, min_serving=1, generations=2, faults=1,
                                     rollouts=0, max_live=2, min_admitting=0)

#: Fleet liveness mutants: each passes every safety check of the fleet (the negative
#: control) and breaks the named liveness property.
FLEET_LIVENESS_MUTANTS: tuple[tuple[FleetMutant, str], ...] = (
    (FleetMutant(
        "wave_waits_on_itself",
        "A rolling wave's decision waits until every member is idle and READY or TAINTED, "
        "its own validated members (which wait, RESUMING, for that decision) included: the "
        "wave never ends, and the members it took out never serve again.",
        _wave_waits_on_itself, LIVENESS_ROLLING),
     "FleetUpdateEnds"),
    (FleetMutant(
        "update_waits_on_held_back",
        "The strict update's abort waits for every member to settle: a member whose drain "
        "timed out (held back, READY with rollouts bound) settles only when its clients "
        "release them, so one client that holds a rollout holds the fleet's update for "
        "ever (the fleet that wedged when a member died while it drained).",
        lambda s: _fleet_action(
            s, "fleet_abort",
            when=lambda f, b: all(settled(f, m) for m in f.eng)
            and sum(validated(f, m) for m in f.eng) < b.min_serving,
            when_tla=f"(\\A n \\in Engines : Settled(eng[n])) /\\ {N_VALIDATED_TLA} "
                     "< MinServing"), LIVENESS_HELD),
     "FleetUpdateEnds"),
    (FleetMutant(
        "quarantine_never_fenced",
        "The fleet leaves a quarantined (TAINTED) member to an operator: it never fences it.",
        lambda s: _member_guard(s, "fence_begin", (lambda _f, _s, _b: False, "FALSE")),
        LIVENESS_FAULT),
     "MemberTaintedIsFenced"),
    (FleetMutant(
        "readmit_never_starts",
        "The watchdog re-admits a quarantined member only once its label names its "
        "committed generation again, which the fence replaced: no re-admission ever "
        "starts, and a fenced member stays out for ever (the operator may still re-admit "
        "it: the same steps, so every safety check passes).",
        lambda s: replace(s, watchdog=tuple(
            replace(w, when=lambda m: FENCED in m.evidence and m.label == m.committed,
                    when_tla=f"{w.when_tla} /\\ label = committed") for w in s.watchdog)),
        LIVENESS_FAULT),
     "QuarantineEnds"),
    (FleetMutant(
        "floor_waits_for_every_member",
        "The floor rises only once every member is on the frontier: a member quarantined "
        "below it (out of service, holding nothing) holds the floor for ever, and with it "
        "every later rolling update (the next frontier must stay within K of the floor).",
        lambda s: _fleet_action(
            s, "fleet_raise_floor",
            when=lambda f, _b: f.ffloor < f.fcommitted
            and all(m.committed >= f.fcommitted for m in f.eng),
            when_tla="ffloor < fcommitted /\\ \\A n \\in Engines : "
                     "eng[n].committed >= fcommitted"),
        LIVENESS_ROLLING_FAULT),
     "FloorRises"),
)


# ---------------------------------------------------------------- failover liveness

#: Failover bounds for liveness: one engine, one generation, one takeover (TLC's liveness
#: check at the default bounds does not finish in five minutes).
LIVENESS_FAILOVER = FoBounds(controllers=2, engines=1, epochs=2, generations=1)

#: Failover liveness mutants: each passes every safety check of the failover spec and
#: breaks the named liveness property.
FAILOVER_LIVENESS_MUTANTS: tuple[tuple[FailoverMutant, str], ...] = (
    (FailoverMutant(
        "lease_never_expires",
        "A leader key lives until its holder deletes it: a leader that crashed or froze "
        "holds the fleet for ever (no standby can campaign).",
        lambda s: s.replace_action("expire", when=lambda _f, _sp, _p: False, tla=(
            "/\\ FALSE\n    /\\ UNCHANGED <<leader, lepoch, issued, ctl, jrn, eng, bound, "
            "net>>"))),
     "KeyFreedWhenHolderStops"),
    (FailoverMutant(
        "zombie_never_stands_down",
        "A controller deposed while it was frozen never finds out (no lease clock, and it "
        "makes no append that the compare could refuse): it acts for ever.",
        lambda s: s.replace_action("deposed", when=lambda _f, _sp, _p: False, tla=(
            "/\\ FALSE\n    /\\ UNCHANGED <<leader, lepoch, issued, ctl, jrn, eng, bound, "
            "net>>"))),
     "DeposedStandsDown"),
    (FailoverMutant(
        "no_second_election",
        "A standby campaigns only for the first epoch: once a leader is gone, none is ever "
        "elected again.",
        lambda s: s.replace_action(
            "campaign",
            when=lambda f, _sp, p: f.ctl[p[0] - 1].pc == "standby"
            and f.leader == 0 and f.issued == 0,
            tla=s.action("campaign").tla.replace("issued < MaxEpoch", "issued = 0"))),
     "LeaderElected"),
)


# ------------------------------------------------------------------------------ episodes


_T = TypeVar("_T")


@dataclass(frozen=True)
class TableMutant(Generic[_T]):
    """A broken table spec (spec/graph.py): episodes, staged updates, gateways."""

    name: str
    doc: str
    apply: Callable[[_T], _T]


EpisodeMutant = TableMutant[EpisodeSpec]


def _turn_on_any_generation(s: EpisodeSpec) -> EpisodeSpec:
    def when(f: EpState, b: EpBounds, p: tuple[object, ...]) -> bool:
        x, n = f.eps[int(str(p[0])) - 1], int(str(p[1]))
        return x.status == "idle" and not x.late and len(x.log) < b.turns \
            and f.mem[n - 1].phase == "serve"
    return s.replace_action("turn_begin", when=when, tla=s.tla_replaced(
        "turn_begin", "mem[n].gen = eps[e].gen", "TRUE"))


def _floor_ignores_episodes(s: EpisodeSpec) -> EpisodeSpec:
    return s.replace_action(
        "raise_floor",
        when=lambda f, _b, _p: f.floor < f.front and all(m.gen > f.floor for m in f.mem),
        tla=s.tla_replaced("raise_floor",
                           "\\A x \\in Episodes : Live(x) => eps[x].gen > floor", "TRUE"))


def _segment_unjournalled(s: EpisodeSpec) -> EpisodeSpec:
    seg = s.action("segment")
    return s.replace_action(
        "segment",
        apply=lambda f, b, p: (g := seg.apply(f, b, p))._replace(eps=tuple(
            y._replace(seg=x.seg) for x, y in zip(f.eps, g.eps, strict=True))),
        tla=seg.tla.replace(", ![e].seg = eps[e].seg + 1", ""))


def _mutate_ignoring(s: EpisodeSpec, ignored: str) -> EpisodeSpec:
    """``mutate`` that does not wait for the turns in flight (``ignored`` "turns") or for
    the live episodes waited for ("episodes") on its member."""
    def holds(f: EpState, n: int) -> bool:
        g = f.mem[n - 1].gen
        turn = ignored != "turns"
        waited = ignored != "episodes"
        return any(x.member == n and (
            (turn and x.status == "turn")
            or (waited and x.status in ("idle", "turn") and x.policy != "segment"
                and x.gen == g)) for x in f.eps)
    tla = s.action("mutate").tla.replace("~Holds(n)", {
        "turns": "~\\E x \\in Episodes : eps[x].member = n /\\ Live(x) /\\ "
                 'eps[x].policy # "segment" /\\ eps[x].gen = mem[n].gen',
        "episodes": '~\\E x \\in Episodes : eps[x].member = n /\\ eps[x].status = '
                    '"turn"'}[ignored])
    return s.replace_action(
        "mutate", tla=tla,
        when=lambda f, _b, p: f.mem[int(str(p[0])) - 1].phase == "drain"
        and not holds(f, int(str(p[0]))))


def _turn_past_deadline(s: EpisodeSpec) -> EpisodeSpec:
    def when(f: EpState, b: EpBounds, p: tuple[object, ...]) -> bool:
        x, n = f.eps[int(str(p[0])) - 1], int(str(p[1]))
        return x.status == "idle" and len(x.log) < b.turns \
            and f.mem[n - 1].phase == "serve" and f.mem[n - 1].gen == x.gen
    return s.replace_action("turn_begin", when=when, tla=s.tla_replaced(
        "turn_begin", "~eps[e].late", "TRUE"))


#: Episode mutants: each breaks an invariant of the episode spec at its default bounds.
EPISODE_MUTANTS: tuple[EpisodeMutant, ...] = (
    EpisodeMutant(
        "turn_on_other_generation",
        "A turn is admitted on any serving member, whatever generation it serves: an "
        "episode's turns are served by two policies in one segment.",
        _turn_on_any_generation),
    EpisodeMutant(
        "floor_passes_live_episode",
        "The floor rises once no member serves a generation, ignoring live episodes "
        "bound to it: an idle episode is left on a generation no longer live.",
        _floor_ignores_episodes),
    EpisodeMutant(
        "segment_not_journalled",
        "An episode continues under its member's new generation without journalling a "
        "segment boundary: its record claims one policy for turns of two.",
        _segment_unjournalled),
    EpisodeMutant(
        "mutate_under_waited_episode",
        "A member mutates under a live episode whose owner chose to wait (or to abort) "
        "for its update: the episode's generation is gone from under it.",
        lambda s: _mutate_ignoring(s, "episodes")),
    EpisodeMutant(
        "mutate_mid_turn",
        "A member mutates with a segmenting episode's turn still in flight: the turn "
        "crosses the update.",
        lambda s: _mutate_ignoring(s, "turns")),
    EpisodeMutant(
        "turn_past_idle_deadline",
        "An episode past its idle deadline may still start a turn: its tool's answer, "
        "however late, is served, instead of the episode being ended and reported.",
        _turn_past_deadline),
)


# ------------------------------------------------------------------------ staged updates


StagedMutant = TableMutant[StagedSpec]


#: Staged-update mutants: each breaks an invariant or step property of the staged spec.
STAGED_MUTANTS: tuple[StagedMutant, ...] = (
    StagedMutant(
        "install_without_every_rank_prepared",
        "Admissions close, and ranks install, once some rank is prepared: a rank whose "
        "shard is corrupt or missing installs it.",
        lambda s: s.replace_action(
            "close", when=lambda f, _b, _p: f.phase == "staging" and any(f.prep),
            tla=s.tla_replaced("close", "\\A r \\in Ranks : prep[r]",
                            "\\E r \\in Ranks : prep[r]"))),
    StagedMutant(
        "install_of_other_manifest",
        "A rank reports prepared once its shard is complete, without comparing its "
        "manifest with the trainer's: another generation's bytes (a delta on the wrong "
        "base) are installed.",
        lambda s: s.replace_action(
            "prepare", when=lambda f, _b, p: f.phase == "staging"
            and f.buf[int(str(p[0])) - 1] not in (0, -2, -3) and not f.prep[int(str(p[0])) - 1],
            tla=s.tla_replaced("prepare", "buf[r] = target", "buf[r] \\notin {0, -2, -3}"))),
    StagedMutant(
        "staging_failure_taints",
        "A refused staging latches TAINTED, as an ambiguous mutation would: a member "
        "that never touched its served weights is quarantined.",
        lambda s: s.replace_action(
            "stage_fail", apply=lambda f, b, p: s.action("stage_fail").apply(f, b, p)
            ._replace(phase="tainted"),
            tla=s.tla_replaced("stage_fail", "phase' = \"serving\"", "phase' = \"tainted\""))),
    StagedMutant(
        "staging_touches_served",
        "A rank receives straight into its served weights (the unstaged path's transfer "
        "kept under the staged protocol): a staging that fails leaves them changed.",
        lambda s: s.replace_action(
            "receive", apply=lambda f, b, p: (g := s.action("receive").apply(f, b, p))
            ._replace(served=tuple(v if i != int(str(p[0])) - 1 else g.buf[i]
                                   for i, v in enumerate(f.served))),
            tla=s.tla_replaced("receive", "/\\ UNCHANGED <<phase, committed, target, served,",
                            "/\\ served' = [served EXCEPT ![r] = Received(k)]\n"
                            "    /\\ UNCHANGED <<phase, committed, target,"))),
)


# ---------------------------------------------------------------------------- gateways


GatewayMutant = TableMutant[GatewaySpec]


def _gw_index(p: tuple[object, ...], k: int) -> int:
    return int(str(p[k])) - 1


#: Gateway mutants: each lets a rollout cross a mutation.
GATEWAY_MUTANTS: tuple[GatewayMutant, ...] = (
    GatewayMutant(
        "mutate_after_a_quorum_of_gateways",
        "The member mutates once a majority (here one of two) of the gateways released "
        "it: the other still admits there.",
        lambda s: s.replace_action(
            "mutate", when=lambda f, _b, p: f.mem[_gw_index(p, 0)].phase == "closing"
            and 2 * sum(released(f, g, _gw_index(p, 0)) for g in f.gw) >= len(f.gw),
            tla=s.tla_replaced("mutate", "\\A x \\in Gateways : Released(x, m)",
                        "2 * Cardinality({x \\in Gateways : Released(x, m)}) >= NumGateways")
            )),
    GatewayMutant(
        "admit_after_lease_expired",
        "The engine takes requests stamped with an expired gateway epoch: a partitioned "
        "gateway, its view stale, admits to a member mutating since its lease ended.",
        lambda s: s.replace_action(
            "admit", when=lambda f, _b, p: f.gw[_gw_index(p, 0)].open[_gw_index(p, 1)]
            and f.gw[_gw_index(p, 0)].infl[_gw_index(p, 1)] == 0,
            tla=s.tla_replaced("admit", " /\\ ~gw[g].expired", ""))),
    GatewayMutant(
        "ack_before_inflight_ended",
        "A gateway acknowledges a close as soon as it closed the member in its view, its "
        "rollouts there still running: the member mutates under them.",
        lambda s: s.replace_action(
            "ack", when=lambda f, _b, p: f.mem[_gw_index(p, 1)].phase == "closing"
            and not (g := f.gw[_gw_index(p, 0)]).open[_gw_index(p, 1)]
            and not g.ack[_gw_index(p, 1)] and not g.cut,
            tla=s.tla_replaced("ack", " /\\ gw[g].infl[m] = 0", ""))),
)
