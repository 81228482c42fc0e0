---------------------------- MODULE RolloutCoreFleet ----------------------------
\* Generated from spec/fleet.py and spec/lifecycle.py by `rolloutcore spec tla`.
\* Do not edit: change the Python spec and regenerate.
EXTENDS Integers, FiniteSets, Sequences

CONSTANTS NumEngines, NumSlots, MaxGen, MaxFaults, MinServing, MaxLive, MinAdmitting,
    MaxCrashes

Engines == 1..NumEngines
Slots == 1..NumSlots
Tiers == {"encoder", "mm", "prefix"}
Phases == {"DRAINING", "INVALIDATING", "QUIESCED", "READY", "RESUMING", "TAINTED", "UNINITIALIZED", "UPDATING", "VALIDATING"}
AllEvidence == {"identity", "probe", "resumed", "version"}
WeightEvidence == {"identity", "probe", "version"}
QuietPhases == {"INVALIDATING", "QUIESCED", "UPDATING", "VALIDATING"}
PostMutationPhases == {"INVALIDATING", "RESUMING", "VALIDATING"}
MIXED == -1
BROKEN == -2
TAINT == -3
TierOrder == <<"prefix", "encoder", "mm">>

VARIABLES fphase, fcommitted, ftarget, eng, faults, ffloor, fdown, fcrashes, fasked
vars == <<fphase, fcommitted, ftarget, eng, faults, ffloor, fdown, fcrashes, fasked>>

Init ==
    /\ fphase = "UNINITIALIZED"
    /\ fcommitted = 1
    /\ ftarget = 0
    /\ eng = [n \in Engines |-> [phase |-> "READY", committed |-> 1, target |-> 0, pending |-> "none", bind |-> [i \in Slots |-> 0], cleared |-> {}, evidence |-> AllEvidence, weights |-> 1, label |-> 1, paused |-> FALSE, req |-> [i \in Slots |-> 0], caches |-> [t \in Tiers |-> {}], amb |-> FALSE, stale |-> FALSE, replaced |-> FALSE, doubt |-> FALSE, faults |-> 0]]
    /\ faults = 0
    /\ ffloor = 1
    /\ fdown = {}
    /\ fcrashes = 0
    /\ fasked = {}

TierFirst(e, t) == \A k \in 1..Len(TierOrder) : TierOrder[k] = t =>
    \A j \in 1..(k - 1) : TierOrder[j] \in e.cleared
Settled(e) == (e.phase = "RESUMING" /\ ftarget # 0 /\ e.target = ftarget /\ e.evidence = AllEvidence /\ e.pending = "none") \/ e.phase = "TAINTED" \/ (e.pending = "none" /\ e.phase = "READY" /\ \A i \in Slots : e.bind[i] = 0)
Scheduled(n) == fphase # "UPDATING" \/ \A m \in 1..(n - 1) : Settled(eng[m])
Serving(e) == e.phase = "READY" /\ e.committed >= ffloor /\ e.committed <= fcommitted /\ e.evidence = AllEvidence

\* admit [member, control]
MAdmit(n, i) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"READY"}
    /\ e.bind[i] = 0 /\ e.evidence = AllEvidence
    /\ e.req[i] = 0
    /\ fphase \in {"READY", "ROLLING"} /\ e.committed >= ffloor /\ e.committed <= fcommitted /\ Cardinality({m \in Engines : Serving(eng[m])}) >= MinServing
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.bind = [e.bind EXCEPT ![i] = e.committed], !.req = [e.req EXCEPT ![i] = e.weights], !.stale = (e.stale \/ \E t \in Tiers : e.caches[t] \ {e.weights} # {}), !.caches = [t \in Tiers |-> e.caches[t] \cup {e.weights}]]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* engine_finish [member, environment]
MEngineFinish(n, i) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"UNINITIALIZED", "READY", "DRAINING", "QUIESCED", "UPDATING", "INVALIDATING", "VALIDATING", "RESUMING", "TAINTED"}
    /\ e.req[i] # 0
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.req = [e.req EXCEPT ![i] = 0]]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* release [member, control]
MRelease(n, i) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"READY", "DRAINING"}
    /\ e.bind[i] # 0
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.bind = [e.bind EXCEPT ![i] = 0]]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* request_update [member, control]
MRequestUpdate(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"READY"}
    /\ e.pending = "none" /\ e.evidence = AllEvidence
    /\ \/ (fphase = "UPDATING" /\ e.committed = fcommitted)
       \/ (fphase = "ROLLING" /\ e.committed = fcommitted
           /\ Cardinality({m \in Engines : Serving(eng[m])}) - (IF Serving(e) THEN 1 ELSE 0) >= MinAdmitting)
       \/ (fphase \in {"ABORTING", "READY"} /\ e.committed < fcommitted
           /\ Cardinality({m \in Engines : Serving(eng[m])}) - (IF Serving(e) THEN 1 ELSE 0) >= MinAdmitting)
    /\ Scheduled(n)
    /\ (fphase \in {"ROLLING", "UPDATING"} => n \notin fasked)
    /\ e.committed < MaxGen
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "DRAINING", !.target = e.committed + 1]]
    /\ faults' = faults
    /\ fasked' = IF fphase \in {"ROLLING", "UPDATING"} THEN fasked \cup {n} ELSE fasked
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes>>

\* cancel_update [member, control]
MCancelUpdate(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"DRAINING"}
    /\ e.pending = "none" /\ "resumed" \in e.evidence
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "READY", !.target = 0]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* pause_begin [member, control]
MPauseBegin(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"DRAINING"}
    /\ e.pending = "none" /\ \A j \in Slots : e.bind[j] = 0
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.pending = "pause"]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* pause_ok [member, outcome]
MPauseOk(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"DRAINING"}
    /\ e.pending = "pause"
    /\ \A j \in Slots : e.req[j] = 0
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "QUIESCED", !.evidence = e.evidence \ {"resumed"}, !.pending = "none", !.paused = TRUE]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* pause_failed [member, outcome]
MPauseFailed(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"DRAINING"}
    /\ e.pending = "pause"
    /\ Scheduled(n)
    /\ faults < MaxFaults
    /\ \E w0 \in {e.paused, TRUE} : eng' = [eng EXCEPT ![n] = [e EXCEPT !.evidence = e.evidence \ {"resumed"}, !.pending = "none", !.paused = w0]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* abandon_update [member, control]
MAbandonUpdate(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"QUIESCED"}
    /\ e.pending = "none"
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "RESUMING", !.target = 0]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* mutate_begin [member, control]
MMutateBegin(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"QUIESCED"}
    /\ e.pending = "none" /\ e.target # 0
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "UPDATING", !.evidence = {}, !.cleared = {}, !.pending = "mutate"]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* mutate_ok [member, outcome]
MMutateOk(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"UPDATING"}
    /\ e.pending = "mutate"
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "INVALIDATING", !.pending = "none", !.weights = e.target, !.label = e.target]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* mutate_ok_unlabelled [member, outcome]
MMutateOkUnlabelled(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"UPDATING"}
    /\ e.pending = "mutate"
    /\ Scheduled(n)
    /\ faults < MaxFaults
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "INVALIDATING", !.pending = "none", !.weights = e.target]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* mutate_ok_wrong_weights [member, outcome]
MMutateOkWrongWeights(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"UPDATING"}
    /\ e.pending = "mutate"
    /\ Scheduled(n)
    /\ faults < MaxFaults
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "INVALIDATING", !.pending = "none", !.weights = MIXED, !.label = e.target]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* mutate_ok_broken [member, outcome]
MMutateOkBroken(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"UPDATING"}
    /\ e.pending = "mutate"
    /\ Scheduled(n)
    /\ faults < MaxFaults
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "INVALIDATING", !.pending = "none", !.weights = BROKEN, !.label = e.target]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* mutate_refused [member, outcome]
MMutateRefused(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"UPDATING"}
    /\ e.pending = "mutate"
    /\ e.label = e.committed /\ e.weights = e.committed
    /\ Scheduled(n)
    /\ faults < MaxFaults
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "QUIESCED", !.target = 0, !.evidence = WeightEvidence, !.pending = "none"]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* mutate_ambiguous [member, outcome]
MMutateAmbiguous(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"UPDATING"}
    /\ e.pending = "mutate"
    /\ Scheduled(n)
    /\ faults < MaxFaults
    /\ \E w0 \in {e.committed, e.target, MIXED} : \E w1 \in {e.committed, e.target} : eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "TAINTED", !.pending = "none", !.weights = w0, !.label = w1, !.amb = TRUE]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* reset_begin [member, control]
MResetBegin(n, t) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"INVALIDATING"}
    /\ e.pending = "none" /\ t \notin e.cleared
    /\ TierFirst(e, t)
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.pending = "reset_" \o t]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* reset_ok [member, outcome]
MResetOk(n, t) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"INVALIDATING"}
    /\ e.pending = "reset_" \o t
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.cleared = e.cleared \cup {t}, !.pending = "none", !.caches = [e.caches EXCEPT ![t] = {}]]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* reset_failed [member, outcome]
MResetFailed(n, t) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"INVALIDATING"}
    /\ e.pending = "reset_" \o t
    /\ Scheduled(n)
    /\ faults < MaxFaults
    /\ \E w0 \in {e.caches, [e.caches EXCEPT ![t] = {}]} : eng' = [eng EXCEPT ![n] = [e EXCEPT !.pending = "none", !.caches = w0]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* invalidated [member, control]
MInvalidated(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"INVALIDATING"}
    /\ e.pending = "none" /\ e.cleared = Tiers
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "VALIDATING"]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* validate_begin [member, control]
MValidateBegin(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"VALIDATING"}
    /\ e.pending = "none"
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.pending = "validate"]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* validate_ok [member, outcome]
MValidateOk(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"VALIDATING"}
    /\ e.pending = "validate"
    /\ e.label = e.target /\ e.weights \in {e.target, BROKEN}
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "RESUMING", !.evidence = e.evidence \cup {"version", "identity"}, !.pending = "none"]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* validate_failed [member, outcome]
MValidateFailed(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"VALIDATING"}
    /\ e.pending = "validate"
    /\ Scheduled(n)
    /\ faults < MaxFaults
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.pending = "none"]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* validate_mismatch [member, outcome]
MValidateMismatch(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"VALIDATING"}
    /\ e.pending = "validate"
    /\ e.label # e.target \/ e.weights \notin {e.target, BROKEN}
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "TAINTED", !.pending = "none", !.amb = TRUE]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* resume_begin [member, control]
MResumeBegin(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"DRAINING", "RESUMING"}
    /\ e.pending = "none" /\ "resumed" \notin e.evidence
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.pending = "resume"]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* resume_ok [member, outcome]
MResumeOk(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"DRAINING", "RESUMING"}
    /\ e.pending = "resume"
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.evidence = e.evidence \cup {"resumed"}, !.pending = "none", !.paused = FALSE]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* resume_failed [member, outcome]
MResumeFailed(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"DRAINING", "RESUMING"}
    /\ e.pending = "resume"
    /\ Scheduled(n)
    /\ faults < MaxFaults
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.pending = "none"]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* probe_begin [member, control]
MProbeBegin(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"RESUMING"}
    /\ e.pending = "none" /\ e.target # 0 /\ "resumed" \in e.evidence /\ "probe" \notin e.evidence
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.pending = "probe"]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* probe_ok [member, outcome]
MProbeOk(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"RESUMING"}
    /\ e.pending = "probe"
    /\ e.weights = e.target
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.evidence = e.evidence \cup {"probe"}, !.pending = "none", !.stale = (e.stale \/ \E t \in Tiers : e.caches[t] \ {e.weights} # {}), !.caches = [t \in Tiers |-> e.caches[t] \cup {e.weights}]]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* probe_failed [member, outcome]
MProbeFailed(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"RESUMING"}
    /\ e.pending = "probe"
    /\ Scheduled(n)
    /\ faults < MaxFaults
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.pending = "none"]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* probe_mismatch [member, outcome]
MProbeMismatch(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"RESUMING"}
    /\ e.pending = "probe"
    /\ e.weights # e.target
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "TAINTED", !.pending = "none", !.amb = TRUE]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* publish [member, control]
MPublish(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"RESUMING"}
    /\ e.pending = "none" /\ e.target # 0 /\ e.evidence = AllEvidence
    /\ e.target <= fcommitted
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "READY", !.committed = e.target, !.target = 0]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* reopen [member, control]
MReopen(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"RESUMING"}
    /\ e.pending = "none" /\ e.target = 0 /\ e.evidence = AllEvidence
    /\ Scheduled(n)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "READY"]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* give_up [member, control]
MGiveUp(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"DRAINING", "INVALIDATING", "VALIDATING", "RESUMING"}
    /\ e.pending = "none" /\ ("resumed" \notin e.evidence \/ (e.target # 0 /\ e.phase # "DRAINING"))
    /\ Scheduled(n)
    /\ faults < MaxFaults
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "TAINTED"]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* fence_begin [member, control]
MFenceBegin(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"TAINTED"}
    /\ e.pending = "none" /\ "fenced" \notin e.evidence
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.pending = "fence"]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* fence_ok [member, outcome]
MFenceOk(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"TAINTED"}
    /\ e.pending = "fence"
    /\ \A j \in Slots : e.req[j] = 0
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.evidence = e.evidence \cup {"fenced"}, !.pending = "none", !.paused = TRUE, !.label = TAINT]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* fence_failed [member, outcome]
MFenceFailed(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"TAINTED"}
    /\ e.pending = "fence"
    /\ faults < MaxFaults
    /\ \E w0 \in {e.paused, TRUE} : \E w1 \in {e.label, TAINT} : eng' = [eng EXCEPT ![n] = [e EXCEPT !.pending = "none", !.paused = w0, !.label = w1]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* readmit_begin [member, control]
MReadmitBegin(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"TAINTED"}
    /\ e.pending = "none"
    /\ fphase \notin {"UPDATING", "ROLLING"}
    /\ \E w0 \in {e.committed, MIXED, BROKEN} : \E w1 \in {e.committed, e.label} : eng' = [eng EXCEPT ![n] = [e EXCEPT !.evidence = {}, !.pending = "readmit", !.weights = w0, !.label = w1, !.paused = TRUE, !.req = [i \in Slots |-> 0], !.caches = [t \in Tiers |-> {}], !.amb = FALSE]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* readmit_ok [member, outcome]
MReadmitOk(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"TAINTED"}
    /\ e.pending = "readmit"
    /\ e.weights = e.committed /\ e.label = e.committed
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "READY", !.target = 0, !.evidence = AllEvidence, !.cleared = Tiers, !.pending = "none", !.paused = FALSE, !.stale = (e.stale \/ \E t \in Tiers : e.caches[t] \ {e.weights} # {}), !.caches = [t \in Tiers |-> e.caches[t] \cup {e.weights}], !.replaced = FALSE, !.doubt = FALSE]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* readmit_mismatch [member, outcome]
MReadmitMismatch(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"TAINTED"}
    /\ e.pending = "readmit"
    /\ e.weights # e.committed \/ e.label # e.committed
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.evidence = {}, !.pending = "none", !.paused = FALSE]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* readmit_failed [member, outcome]
MReadmitFailed(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"TAINTED"}
    /\ e.pending = "readmit"
    /\ faults < MaxFaults
    /\ \E w0 \in {e.paused, FALSE} : eng' = [eng EXCEPT ![n] = [e EXCEPT !.evidence = {}, !.pending = "none", !.paused = w0]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* audit_begin [member, control]
MAuditBegin(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"READY"}
    /\ e.pending = "none"
    /\ fphase # "UPDATING"
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.pending = "audit"]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* audit_ok [member, outcome]
MAuditOk(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"READY"}
    /\ e.pending = "audit"
    /\ e.weights = e.committed /\ e.label = e.committed /\ ~e.paused
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.evidence = AllEvidence, !.pending = "none", !.replaced = FALSE, !.doubt = FALSE]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* audit_mismatch [member, outcome]
MAuditMismatch(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"READY"}
    /\ e.pending = "audit"
    /\ ~(e.weights = e.committed /\ e.label = e.committed /\ ~e.paused)
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.phase = "TAINTED", !.bind = [i \in Slots |-> 0], !.evidence = {}, !.pending = "none"]]
    /\ faults' = faults
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* audit_failed [member, outcome]
MAuditFailed(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"READY"}
    /\ e.pending = "audit"
    /\ faults < MaxFaults
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.evidence = {}, !.pending = "none", !.doubt = TRUE]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* suspect [member, control]
MSuspect(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"READY"}
    /\ e.evidence = AllEvidence
    /\ faults < MaxFaults
    /\ eng' = [eng EXCEPT ![n] = [e EXCEPT !.evidence = {}, !.doubt = TRUE]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* engine_restart [member, environment]
MEngineRestart(n) ==
    LET e == eng[n] IN
    /\ fphase \notin {"UNINITIALIZED", "RECOVERING"}
    /\ e.phase \in {"READY", "DRAINING", "QUIESCED", "UPDATING", "INVALIDATING", "VALIDATING", "RESUMING", "TAINTED"}
    /\ faults < MaxFaults
    /\ \E w0 \in {e.committed, MIXED} : \E w1 \in {1, e.committed, MIXED} : eng' = [eng EXCEPT ![n] = [e EXCEPT !.weights = w0, !.label = w1, !.paused = FALSE, !.req = [i \in Slots |-> 0], !.caches = [t \in Tiers |-> {}], !.replaced = TRUE]]
    /\ faults' = faults + 1
    /\ UNCHANGED <<fphase, fcommitted, ftarget, ffloor, fdown, fcrashes, fasked>>

\* fleet_open [fleet]: At least min_serving members are verified on the first generation (their bootstrap adopted it): the fleet opens on it, its frontier and floor.
FleetOpen ==
    /\ fphase \in {"UNINITIALIZED"}
    /\ Cardinality({n \in Engines : eng[n].phase = "READY" /\ eng[n].committed = 1 /\ eng[n].evidence = AllEvidence}) >= MinServing
    /\ fphase' = "READY"
    /\ fcommitted' = 1
    /\ ftarget' = 0
    /\ ffloor' = 1
    /\ fasked' = IF fphase' \in {"ROLLING", "UPDATING"} THEN fasked ELSE {}
    /\ UNCHANGED <<eng, faults, fdown, fcrashes>>

\* fleet_request_update [fleet]: The trainer asks for the next generation (a quorum serving): admissions close on every member (the strict update: max_live 1).
FleetRequestUpdate ==
    /\ fphase \in {"READY"}
    /\ MaxLive = 1 /\ Cardinality({m \in Engines : Serving(eng[m])}) >= MinServing
    /\ fcommitted < MaxGen
    /\ fphase' = "UPDATING"
    /\ ftarget' = fcommitted + 1
    /\ fasked' = IF fphase' \in {"ROLLING", "UPDATING"} THEN fasked ELSE {}
    /\ UNCHANGED <<fcommitted, eng, faults, ffloor, fdown, fcrashes>>

\* fleet_publish [fleet]: Every member has settled and at least min_serving validated the target: commit it on every validated member at once.
FleetPublish ==
    /\ fphase \in {"UPDATING"}
    /\ (\A n \in Engines : LET e == eng[n] IN (e.phase = "RESUMING" /\ ftarget # 0 /\ e.target = ftarget /\ e.evidence = AllEvidence /\ e.pending = "none") \/ e.phase = "TAINTED" \/ (e.pending = "none" /\ e.phase = "READY" /\ \A i \in Slots : e.bind[i] = 0)) /\ Cardinality({n \in Engines : LET e == eng[n] IN e.phase = "RESUMING" /\ ftarget # 0 /\ e.target = ftarget /\ e.evidence = AllEvidence /\ e.pending = "none"}) >= MinServing
    /\ fphase' = "READY"
    /\ fcommitted' = ftarget
    /\ ftarget' = 0
    /\ ffloor' = ftarget
    /\ eng' = [n \in Engines |-> LET e == eng[n] IN IF e.phase = "RESUMING" /\ ftarget # 0 /\ e.target = ftarget /\ e.evidence = AllEvidence /\ e.pending = "none" THEN [e EXCEPT !.phase = "READY", !.committed = e.target, !.target = 0] ELSE e]
    /\ fasked' = IF fphase' \in {"ROLLING", "UPDATING"} THEN fasked ELSE {}
    /\ UNCHANGED <<faults, fdown, fcrashes>>

\* fleet_abort [fleet]: Every member has settled or is held back (READY with rollouts bound: its drain timed out), and fewer than min_serving validated or a member is held back: the fleet stays on its generation; validated members give up and are re-admitted onto it, held-back members keep serving it.
FleetAbort ==
    /\ fphase \in {"UPDATING"}
    /\ (\A n \in Engines : Settled(eng[n]) \/ (eng[n].phase = "READY" /\ eng[n].pending = "none" /\ eng[n].committed = fcommitted /\ \E i \in Slots : eng[n].bind[i] # 0))
    /\ (Cardinality({n \in Engines : LET e == eng[n] IN e.phase = "RESUMING" /\ ftarget # 0 /\ e.target = ftarget /\ e.evidence = AllEvidence /\ e.pending = "none"}) < MinServing \/ \E n \in Engines : eng[n].phase = "READY" /\ eng[n].pending = "none" /\ eng[n].committed = fcommitted /\ \E i \in Slots : eng[n].bind[i] # 0)
    /\ fphase' = "ABORTING"
    /\ fasked' = IF fphase' \in {"ROLLING", "UPDATING"} THEN fasked ELSE {}
    /\ UNCHANGED <<fcommitted, ftarget, eng, faults, ffloor, fdown, fcrashes>>

\* fleet_close [fleet]: Fewer than min_serving members serve (audits found members replaced or unreachable, or they were suspected): admissions close until a quorum serves again (fleet_reopen).
FleetClose ==
    /\ fphase \in {"READY"}
    /\ Cardinality({m \in Engines : Serving(eng[m])}) < MinServing
    /\ fphase' = "ABORTING"
    /\ fasked' = IF fphase' \in {"ROLLING", "UPDATING"} THEN fasked ELSE {}
    /\ UNCHANGED <<fcommitted, ftarget, eng, faults, ffloor, fdown, fcrashes>>

\* fleet_reopen [fleet]: The aborted update is undone (or the fleet was closed): no member is left on the target, and at least min_serving members serve the committed generation again: admissions reopen.
FleetReopen ==
    /\ fphase \in {"ABORTING"}
    /\ (\A n \in Engines : eng[n].phase \in {"READY", "TAINTED"} /\ eng[n].pending = "none") /\ Cardinality({m \in Engines : Serving(eng[m])}) >= MinServing
    /\ fphase' = "READY"
    /\ ftarget' = 0
    /\ fasked' = IF fphase' \in {"ROLLING", "UPDATING"} THEN fasked ELSE {}
    /\ UNCHANGED <<fcommitted, eng, faults, ffloor, fdown, fcrashes>>

\* fleet_roll [fleet]: The trainer asks for the next generation as a rolling update (max_live >= 2, the next frontier still within max_live of the floor, a quorum serving, and a wave to take: a member on the frontier that may leave while min_admitting others serve): members on the frontier join the wave one by one while min_admitting others keep admitting.
FleetRoll ==
    /\ fphase \in {"READY"}
    /\ MaxLive >= 2 /\ fcommitted + 1 - ffloor < MaxLive /\ Cardinality({m \in Engines : Serving(eng[m])}) >= MinServing
    /\ Cardinality({m \in Engines : Serving(eng[m])}) > MinAdmitting
    /\ \E n \in Engines : Serving(eng[n]) /\ eng[n].committed = fcommitted
    /\ fcommitted < MaxGen
    /\ fphase' = "ROLLING"
    /\ ftarget' = fcommitted + 1
    /\ fasked' = IF fphase' \in {"ROLLING", "UPDATING"} THEN fasked ELSE {}
    /\ UNCHANGED <<fcommitted, eng, faults, ffloor, fdown, fcrashes>>

\* fleet_publish_wave [fleet]: No member is in the middle of the wave and at least one validated the target (with a quorum serving after it): commit it on every validated member at once; the frontier moves, the floor stays (the others serve the old generation until they catch up).
FleetPublishWave ==
    /\ fphase \in {"ROLLING"}
    /\ (\A n \in Engines : LET e == eng[n] IN (e.phase = "RESUMING" /\ ftarget # 0 /\ e.target = ftarget /\ e.evidence = AllEvidence /\ e.pending = "none") \/ (e.pending = "none" /\ e.phase \in {"READY", "TAINTED"}))
    /\ Cardinality({n \in Engines : LET e == eng[n] IN e.phase = "RESUMING" /\ ftarget # 0 /\ e.target = ftarget /\ e.evidence = AllEvidence /\ e.pending = "none"}) >= 1 /\ Cardinality({m \in Engines : Serving(eng[m])}) + Cardinality({n \in Engines : LET e == eng[n] IN e.phase = "RESUMING" /\ ftarget # 0 /\ e.target = ftarget /\ e.evidence = AllEvidence /\ e.pending = "none"}) >= MinServing
    /\ fphase' = "READY"
    /\ fcommitted' = ftarget
    /\ ftarget' = 0
    /\ eng' = [n \in Engines |-> LET e == eng[n] IN IF e.phase = "RESUMING" /\ ftarget # 0 /\ e.target = ftarget /\ e.evidence = AllEvidence /\ e.pending = "none" THEN [e EXCEPT !.phase = "READY", !.committed = e.target, !.target = 0] ELSE e]
    /\ fasked' = IF fphase' \in {"ROLLING", "UPDATING"} THEN fasked ELSE {}
    /\ UNCHANGED <<faults, ffloor, fdown, fcrashes>>

\* fleet_end_wave [fleet]: No member is in the middle of the wave, none validated the target, and a quorum serves: the rolling update ends on the generations served.
FleetEndWave ==
    /\ fphase \in {"ROLLING"}
    /\ (\A n \in Engines : LET e == eng[n] IN (e.phase = "RESUMING" /\ ftarget # 0 /\ e.target = ftarget /\ e.evidence = AllEvidence /\ e.pending = "none") \/ (e.pending = "none" /\ e.phase \in {"READY", "TAINTED"}))
    /\ Cardinality({n \in Engines : LET e == eng[n] IN e.phase = "RESUMING" /\ ftarget # 0 /\ e.target = ftarget /\ e.evidence = AllEvidence /\ e.pending = "none"}) = 0 /\ Cardinality({m \in Engines : Serving(eng[m])}) >= MinServing
    /\ fphase' = "READY"
    /\ ftarget' = 0
    /\ fasked' = IF fphase' \in {"ROLLING", "UPDATING"} THEN fasked ELSE {}
    /\ UNCHANGED <<fcommitted, eng, faults, ffloor, fdown, fcrashes>>

\* fleet_abort_wave [fleet]: No member is in the middle of the wave and fewer than min_serving would serve after it (faults took members out): admissions close as in an aborted strict update; validated members give up and are re-admitted, and the fleet reopens with a quorum (fleet_reopen).
FleetAbortWave ==
    /\ fphase \in {"ROLLING"}
    /\ (\A n \in Engines : LET e == eng[n] IN (e.phase = "RESUMING" /\ ftarget # 0 /\ e.target = ftarget /\ e.evidence = AllEvidence /\ e.pending = "none") \/ (e.pending = "none" /\ e.phase \in {"READY", "TAINTED"}))
    /\ Cardinality({m \in Engines : Serving(eng[m])}) + Cardinality({n \in Engines : LET e == eng[n] IN e.phase = "RESUMING" /\ ftarget # 0 /\ e.target = ftarget /\ e.evidence = AllEvidence /\ e.pending = "none"}) < MinServing
    /\ fphase' = "ABORTING"
    /\ fasked' = IF fphase' \in {"ROLLING", "UPDATING"} THEN fasked ELSE {}
    /\ UNCHANGED <<fcommitted, ftarget, eng, faults, ffloor, fdown, fcrashes>>

\* fleet_recover [fleet]: The controller restarted after a crash and every member took the restart the single-engine spec gives it (a member left in doubt restarts TAINTED), and a quorum serves: the fleet reopens on the journal's frontier and floor; any update in progress is dropped.
FleetRecover ==
    /\ fphase \in {"RECOVERING"}
    /\ fdown = {} /\ Cardinality({m \in Engines : Serving(eng[m])}) >= MinServing
    /\ fphase' = "READY"
    /\ ftarget' = 0
    /\ fasked' = IF fphase' \in {"ROLLING", "UPDATING"} THEN fasked ELSE {}
    /\ UNCHANGED <<fcommitted, eng, faults, ffloor, fdown, fcrashes>>

\* fleet_recover_closed [fleet]: As fleet_recover, but fewer than min_serving members serve: the fleet stays closed (re-admission brings members back, and fleet_reopen opens it).
FleetRecoverClosed ==
    /\ fphase \in {"RECOVERING"}
    /\ fdown = {} /\ Cardinality({m \in Engines : Serving(eng[m])}) < MinServing
    /\ fphase' = "ABORTING"
    /\ ftarget' = 0
    /\ fasked' = IF fphase' \in {"ROLLING", "UPDATING"} THEN fasked ELSE {}
    /\ UNCHANGED <<fcommitted, eng, faults, ffloor, fdown, fcrashes>>

\* fleet_raise_floor [fleet]: No member serves, or holds rollouts of, a generation below the frontier any more (each caught up, or is out of service): the floor moves up to the frontier.
FleetRaiseFloor ==
    /\ fphase \in {"READY"}
    /\ ffloor < fcommitted /\ \A n \in Engines : eng[n].committed >= fcommitted \/ (~Serving(eng[n]) /\ \A i \in Slots : eng[n].bind[i] = 0)
    /\ ffloor' = fcommitted
    /\ fphase' = "READY"
    /\ fasked' = IF fphase' \in {"ROLLING", "UPDATING"} THEN fasked ELSE {}
    /\ UNCHANGED <<fcommitted, ftarget, eng, faults, fdown, fcrashes>>

\* migrate [fleet, two members]: A rollout bound on a member that drains for an update moves to a member serving its own generation (an open fleet with a quorum): released on the one, admitted on the other; the drain need not wait for it.
MigrateLeave(e, i) == [e EXCEPT !.bind = [e.bind EXCEPT ![i] = 0]]
MigrateJoin(e, i) == [e EXCEPT !.req = [e.req EXCEPT ![i] = e.weights], !.stale = (e.stale \/ \E t \in Tiers : e.caches[t] \ {e.weights} # {}), !.caches = [t \in Tiers |-> e.caches[t] \cup {e.weights}], !.bind = [e.bind EXCEPT ![i] = e.committed]]
Migrate(src, i, dst, j) ==
    LET e == eng[src]
        t == eng[dst] IN
    /\ src # dst
    /\ fphase \in {"READY", "ROLLING"} /\ Cardinality({m \in Engines : Serving(eng[m])}) >= MinServing
    /\ e.phase = "DRAINING" /\ e.bind[i] # 0
    /\ Serving(t) /\ t.committed = e.bind[i] /\ t.bind[j] = 0 /\ t.req[j] = 0
    /\ eng' = [eng EXCEPT ![src] = MigrateLeave(e, i), ![dst] = MigrateJoin(t, j)]
    /\ UNCHANGED <<fphase, fcommitted, ftarget, faults, ffloor, fdown, fcrashes, fasked>>

\* fleet_crash [fleet, environment]: The fleet controller crashes (in any phase after the fleet opened, its recovery included): every member is left to restart.
FleetCrash ==
    /\ fphase \in {"ABORTING", "READY", "RECOVERING", "ROLLING", "UPDATING"}
    /\ fcrashes < MaxCrashes
    /\ fphase' = "RECOVERING"
    /\ fdown' = Engines
    /\ fcrashes' = fcrashes + 1
    /\ fasked' = {}
    /\ UNCHANGED <<fcommitted, ftarget, eng, faults, ffloor>>

InFlightWorlds(e) ==
    {e}
    \cup (IF e.pending # "none" /\ e.phase \in {"UNINITIALIZED"} /\ (e.pending = "bootstrap") /\ (e.weights = 1 /\ e.label = 1 /\ ~e.paused) THEN {e} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"UNINITIALIZED"} /\ (e.pending = "bootstrap") THEN {e} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"UNINITIALIZED"} /\ (e.pending = "bootstrap") /\ (e.weights # 1 \/ e.label # 1) THEN {e} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"DRAINING"} /\ (e.pending = "pause") /\ (\A j \in Slots : e.req[j] = 0) THEN {[e EXCEPT !.paused = TRUE]} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"DRAINING"} /\ (e.pending = "pause") THEN {[e EXCEPT !.paused = w0] : w0 \in {e.paused, TRUE}} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"DRAINING"} /\ (e.pending = "pause_abort") /\ (\A j \in Slots : e.req[j] = 0) THEN {[e EXCEPT !.paused = TRUE]} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"DRAINING"} /\ (e.pending = "pause_abort") THEN {[e EXCEPT !.paused = w0] : w0 \in {e.paused, TRUE}} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"UPDATING"} /\ (e.pending = "mutate") THEN {[e EXCEPT !.weights = e.target, !.label = e.target]} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"UPDATING"} /\ (e.pending = "mutate") THEN {[e EXCEPT !.weights = e.target]} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"UPDATING"} /\ (e.pending = "mutate") THEN {[e EXCEPT !.weights = MIXED, !.label = e.target]} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"UPDATING"} /\ (e.pending = "mutate") THEN {[e EXCEPT !.weights = BROKEN, !.label = e.target]} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"UPDATING"} /\ (e.pending = "mutate") /\ (e.label = e.committed /\ e.weights = e.committed) THEN {e} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"UPDATING"} /\ (e.pending = "mutate") THEN {[e EXCEPT !.weights = w0, !.label = w1, !.amb = TRUE] : w0 \in {e.committed, e.target, MIXED}, w1 \in {e.committed, e.target}} ELSE {})
    \cup (UNION {(IF e.pending # "none" /\ e.phase \in {"INVALIDATING"} /\ (e.pending = "reset_" \o t) THEN {[e EXCEPT !.caches = [e.caches EXCEPT ![t] = {}]]} ELSE {}) : t \in Tiers})
    \cup (UNION {(IF e.pending # "none" /\ e.phase \in {"INVALIDATING"} /\ (e.pending = "reset_" \o t) THEN {[e EXCEPT !.caches = w0] : w0 \in {e.caches, [e.caches EXCEPT ![t] = {}]}} ELSE {}) : t \in Tiers})
    \cup (IF e.pending # "none" /\ e.phase \in {"VALIDATING"} /\ (e.pending = "validate") /\ (e.label = e.target /\ e.weights \in {e.target, BROKEN}) THEN {e} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"VALIDATING"} /\ (e.pending = "validate") THEN {e} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"VALIDATING"} /\ (e.pending = "validate") /\ (e.label # e.target \/ e.weights \notin {e.target, BROKEN}) THEN {[e EXCEPT !.amb = TRUE]} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"DRAINING", "RESUMING"} /\ (e.pending = "resume") THEN {[e EXCEPT !.paused = FALSE]} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"DRAINING", "RESUMING"} /\ (e.pending = "resume") THEN {e} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"RESUMING"} /\ (e.pending = "probe") /\ (e.weights = e.target) THEN {[e EXCEPT !.stale = (e.stale \/ \E t \in Tiers : e.caches[t] \ {e.weights} # {}), !.caches = [t \in Tiers |-> e.caches[t] \cup {e.weights}]]} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"RESUMING"} /\ (e.pending = "probe") THEN {e} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"RESUMING"} /\ (e.pending = "probe") /\ (e.weights # e.target) THEN {[e EXCEPT !.amb = TRUE]} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"TAINTED"} /\ (e.pending = "fence") /\ (\A j \in Slots : e.req[j] = 0) THEN {[e EXCEPT !.paused = TRUE, !.label = TAINT]} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"TAINTED"} /\ (e.pending = "fence") THEN {[e EXCEPT !.paused = w0, !.label = w1] : w0 \in {e.paused, TRUE}, w1 \in {e.label, TAINT}} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"TAINTED"} /\ (e.pending = "readmit") /\ (e.weights = e.committed /\ e.label = e.committed) THEN {[e EXCEPT !.paused = FALSE, !.stale = (e.stale \/ \E t \in Tiers : e.caches[t] \ {e.weights} # {}), !.caches = [t \in Tiers |-> e.caches[t] \cup {e.weights}], !.replaced = FALSE, !.doubt = FALSE]} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"TAINTED"} /\ (e.pending = "readmit") /\ (e.weights # e.committed \/ e.label # e.committed) THEN {[e EXCEPT !.paused = FALSE]} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"TAINTED"} /\ (e.pending = "readmit") THEN {[e EXCEPT !.paused = w0] : w0 \in {e.paused, FALSE}} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"READY"} /\ (e.pending = "audit") /\ (e.weights = e.committed /\ e.label = e.committed /\ ~e.paused) THEN {[e EXCEPT !.replaced = FALSE, !.doubt = FALSE]} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"READY"} /\ (e.pending = "audit") /\ (~(e.weights = e.committed /\ e.label = e.committed /\ ~e.paused)) THEN {e} ELSE {})
    \cup (IF e.pending # "none" /\ e.phase \in {"READY"} /\ (e.pending = "audit") THEN {[e EXCEPT !.doubt = TRUE]} ELSE {})

\* restart_ready [member, restart, in a recovery]
MRestartReady(n) ==
    LET e == eng[n] IN
    /\ fphase = "RECOVERING"
    /\ n \in fdown
    /\ e.phase \in {"READY", "DRAINING"}
    /\ (e.pending = "none" /\ (e.phase = "READY" \/ (e.phase = "DRAINING" /\ "resumed" \in e.evidence))) \/ (e.phase = "READY" /\ e.pending = "audit")
    /\ \E w \in InFlightWorlds(e) : eng' = [eng EXCEPT ![n] = [w EXCEPT !.phase = "READY", !.pending = "none", !.target = 0, !.bind = [i \in Slots |-> 0], !.evidence = IF e.pending = "none" THEN e.evidence ELSE {}]]
    /\ fdown' = fdown \ {n}
    /\ UNCHANGED <<fphase, fcommitted, ftarget, faults, ffloor, fcrashes, fasked>>

\* restart_tainted [member, restart, in a recovery]
MRestartTainted(n) ==
    LET e == eng[n] IN
    /\ fphase = "RECOVERING"
    /\ n \in fdown
    /\ e.phase \in {"READY", "DRAINING", "QUIESCED", "UPDATING", "INVALIDATING", "VALIDATING", "RESUMING", "TAINTED"}
    /\ ~((e.pending = "none" /\ (e.phase = "READY" \/ (e.phase = "DRAINING" /\ "resumed" \in e.evidence))) \/ (e.phase = "READY" /\ e.pending = "audit"))
    /\ \E w \in InFlightWorlds(e) : eng' = [eng EXCEPT ![n] = [w EXCEPT !.phase = "TAINTED", !.pending = "none", !.bind = [i \in Slots |-> 0], !.evidence = IF e.phase = "TAINTED" THEN e.evidence \cap {"fenced"} ELSE {}]]
    /\ fdown' = fdown \ {n}
    /\ UNCHANGED <<fphase, fcommitted, ftarget, faults, ffloor, fcrashes, fasked>>

Next ==
    \/ \E n \in Engines : \E i \in Slots : MAdmit(n, i)
    \/ \E n \in Engines : \E i \in Slots : MEngineFinish(n, i)
    \/ \E n \in Engines : \E i \in Slots : MRelease(n, i)
    \/ \E n \in Engines : MRequestUpdate(n)
    \/ \E n \in Engines : MCancelUpdate(n)
    \/ \E n \in Engines : MPauseBegin(n)
    \/ \E n \in Engines : MPauseOk(n)
    \/ \E n \in Engines : MPauseFailed(n)
    \/ \E n \in Engines : MAbandonUpdate(n)
    \/ \E n \in Engines : MMutateBegin(n)
    \/ \E n \in Engines : MMutateOk(n)
    \/ \E n \in Engines : MMutateOkUnlabelled(n)
    \/ \E n \in Engines : MMutateOkWrongWeights(n)
    \/ \E n \in Engines : MMutateOkBroken(n)
    \/ \E n \in Engines : MMutateRefused(n)
    \/ \E n \in Engines : MMutateAmbiguous(n)
    \/ \E n \in Engines : \E t \in Tiers : MResetBegin(n, t)
    \/ \E n \in Engines : \E t \in Tiers : MResetOk(n, t)
    \/ \E n \in Engines : \E t \in Tiers : MResetFailed(n, t)
    \/ \E n \in Engines : MInvalidated(n)
    \/ \E n \in Engines : MValidateBegin(n)
    \/ \E n \in Engines : MValidateOk(n)
    \/ \E n \in Engines : MValidateFailed(n)
    \/ \E n \in Engines : MValidateMismatch(n)
    \/ \E n \in Engines : MResumeBegin(n)
    \/ \E n \in Engines : MResumeOk(n)
    \/ \E n \in Engines : MResumeFailed(n)
    \/ \E n \in Engines : MProbeBegin(n)
    \/ \E n \in Engines : MProbeOk(n)
    \/ \E n \in Engines : MProbeFailed(n)
    \/ \E n \in Engines : MProbeMismatch(n)
    \/ \E n \in Engines : MPublish(n)
    \/ \E n \in Engines : MReopen(n)
    \/ \E n \in Engines : MGiveUp(n)
    \/ \E n \in Engines : MFenceBegin(n)
    \/ \E n \in Engines : MFenceOk(n)
    \/ \E n \in Engines : MFenceFailed(n)
    \/ \E n \in Engines : MReadmitBegin(n)
    \/ \E n \in Engines : MReadmitOk(n)
    \/ \E n \in Engines : MReadmitMismatch(n)
    \/ \E n \in Engines : MReadmitFailed(n)
    \/ \E n \in Engines : MAuditBegin(n)
    \/ \E n \in Engines : MAuditOk(n)
    \/ \E n \in Engines : MAuditMismatch(n)
    \/ \E n \in Engines : MAuditFailed(n)
    \/ \E n \in Engines : MSuspect(n)
    \/ \E n \in Engines : MEngineRestart(n)
    \/ FleetOpen
    \/ FleetRequestUpdate
    \/ FleetPublish
    \/ FleetAbort
    \/ FleetClose
    \/ FleetReopen
    \/ FleetRoll
    \/ FleetPublishWave
    \/ FleetEndWave
    \/ FleetAbortWave
    \/ FleetRecover
    \/ FleetRecoverClosed
    \/ FleetRaiseFloor
    \/ \E src, dst \in Engines : \E i, j \in Slots : Migrate(src, i, dst, j)
    \/ FleetCrash
    \/ \E n \in Engines : MRestartReady(n)
    \/ \E n \in Engines : MRestartTainted(n)

Spec == Init /\ [][Next]_vars

\* The fleet with its fairness assumptions (liveness is checked under it).
FairSpec == Spec
    /\ WF_vars(FleetOpen \/ FleetPublish \/ FleetAbort \/ FleetClose \/ FleetReopen \/ FleetPublishWave \/ FleetEndWave \/ FleetAbortWave \/ FleetRecover \/ FleetRecoverClosed \/ FleetRaiseFloor)  \* FleetDecides
    /\ \A n \in Engines :
        /\ WF_vars(MRequestUpdate(n) \/ MCancelUpdate(n) \/ MPauseBegin(n) \/ MPauseOk(n) \/ MPauseFailed(n) \/ MAbandonUpdate(n) \/ MMutateBegin(n) \/ MMutateOk(n) \/ MMutateOkUnlabelled(n) \/ MMutateOkWrongWeights(n) \/ MMutateOkBroken(n) \/ MMutateRefused(n) \/ MMutateAmbiguous(n) \/ (\E t \in Tiers : MResetBegin(n, t)) \/ (\E t \in Tiers : MResetOk(n, t)) \/ (\E t \in Tiers : MResetFailed(n, t)) \/ MInvalidated(n) \/ MValidateBegin(n) \/ MValidateOk(n) \/ MValidateFailed(n) \/ MValidateMismatch(n) \/ MResumeBegin(n) \/ MResumeOk(n) \/ MResumeFailed(n) \/ MProbeBegin(n) \/ MProbeOk(n) \/ MProbeFailed(n) \/ MProbeMismatch(n) \/ MPublish(n) \/ MReopen(n) \/ MGiveUp(n) \/ MFenceBegin(n) \/ MFenceOk(n) \/ MFenceFailed(n) \/ MReadmitOk(n) \/ MReadmitMismatch(n) \/ MReadmitFailed(n) \/ MAuditOk(n) \/ MAuditMismatch(n) \/ MAuditFailed(n) \/ MRestartReady(n) \/ MRestartTainted(n))  \* MemberMoves
        /\ WF_vars((\E i \in Slots : MEngineFinish(n, i)))  \* EngineFinishes
        /\ SF_vars((LET e == eng[n] IN "fenced" \in e.evidence) /\ (MReadmitBegin(n)))  \* WatchdogReadmits

\* The operator's steps and a member leaving an update: a liveness property
\* speaks of behaviours that take them finitely often.
FiniteStep == \E n \in Engines : MCancelUpdate(n) \/ MAbandonUpdate(n) \/ MReadmitBegin(n) \/ MAuditBegin(n) \/ MSuspect(n)

\* ---- fleet invariants
\* Every member READY on a generation the fleet serves holds that generation's weights: after a publish no two engines serving one generation hold different weights (an engine replaced out of band since it was last verified aside: the next audit finds it).
ServingMembersAgree ==
    \A n \in Engines : (eng[n].phase = "READY" /\ eng[n].committed >= ffloor /\ eng[n].committed <= fcommitted /\ ~eng[n].replaced) => eng[n].weights = eng[n].committed

\* No member has committed a generation the fleet has not published.
NoMemberAhead ==
    \A n \in Engines : eng[n].committed <= fcommitted

\* A rollout is bound only on a member serving a generation the fleet serves (or draining it for an update, or whose audit failed after it was admitted).
RolloutsOnlyOnServingMembers ==
    \A n \in Engines : \A i \in Slots : eng[n].bind[i] # 0 => (eng[n].bind[i] >= ffloor /\ eng[n].bind[i] <= fcommitted /\ eng[n].phase \in {"READY", "DRAINING"})

\* The members that serve serve at most max_live generations, and the floor is at most max_live - 1 behind the frontier.
AtMostKLiveGenerations ==
    fcommitted - ffloor < MaxLive /\ Cardinality({eng[n].committed : n \in {m \in Engines : Serving(eng[m])}}) <= MaxLive

\* ---- every member's invariants
MemberOneRolloutOnePolicy ==
    \A n \in Engines : LET e == eng[n] IN
        \A i \in Slots : (e.bind[i] # 0 /\ ~e.replaced => e.weights = e.bind[i]) /\ (e.req[i] # 0 => e.weights = e.req[i])

MemberBindingsUnderCommitted ==
    \A n \in Engines : LET e == eng[n] IN
        \A i \in Slots : e.bind[i] \in {0, e.committed}

MemberBindingsOnlyWhileOpen ==
    \A n \in Engines : LET e == eng[n] IN
        (\E i \in Slots : e.bind[i] # 0) => e.phase \in {"READY", "DRAINING"}

MemberAmbiguityLatchesTainted ==
    \A n \in Engines : LET e == eng[n] IN
        e.amb => e.phase = "TAINTED"

MemberReadyEngineServesCommitted ==
    \A n \in Engines : LET e == eng[n] IN
        (e.phase = "READY" /\ ~e.replaced) => (e.weights = e.committed /\ e.label = e.committed /\ ~e.paused)

MemberReadyCachesCoherent ==
    \A n \in Engines : LET e == eng[n] IN
        (e.phase = "READY" /\ ~e.replaced) => \A t \in Tiers : e.caches[t] \subseteq {e.committed}

MemberNoStaleCacheUse ==
    \A n \in Engines : LET e == eng[n] IN
        ~e.stale

MemberEngineQuietWhileClosed ==
    \A n \in Engines : LET e == eng[n] IN
        e.phase \in QuietPhases => ((e.paused \/ e.replaced) /\ \A i \in Slots : e.bind[i] = 0 /\ e.req[i] = 0)

MemberResetCountsOnlyWhenVerified ==
    \A n \in Engines : LET e == eng[n] IN
        \A t \in e.cleared : e.caches[t] \subseteq {e.weights}

MemberEvidenceIsTrue ==
    \A n \in Engines : LET e == eng[n] IN
        (e.phase # "TAINTED" /\ ~e.replaced) =>
            LET b == IF e.phase \in PostMutationPhases /\ e.target # 0 THEN e.target ELSE e.committed
            IN /\ ("version" \in e.evidence => e.label = b)
               /\ ("identity" \in e.evidence => e.weights \in {b, BROKEN})
               /\ ("probe" \in e.evidence => e.weights = b)
               /\ ("resumed" \in e.evidence => ~e.paused)

MemberPublishedWasVerified ==
    \A n \in Engines : LET e == eng[n] IN
        e.phase = "READY" => e.evidence \in {AllEvidence, {}}

MemberTargetIsNext ==
    \A n \in Engines : LET e == eng[n] IN
        e.target \in {0, e.committed + 1} /\ (e.phase \in {"UNINITIALIZED", "READY"} => e.target = 0)

MemberFencedTaintServesNothing ==
    \A n \in Engines : LET e == eng[n] IN
        (e.phase = "TAINTED" /\ "fenced" \in e.evidence /\ ~e.replaced) => (e.paused /\ e.label = TAINT /\ \A i \in Slots : e.req[i] = 0)

\* ---- action properties
\* The fleet's committed generation (its frontier) never goes back and moves one step at a time; its floor never goes back.
FleetGenerationsMoveForward ==
    [][fcommitted' \in {fcommitted, fcommitted + 1} /\ ffloor' >= ffloor]_vars

\* The fleet opens (reopens, or publishes) only with at least min_serving members serving, and admits a rollout only while they do. (A READY fleet can lose its quorum at any time, to an audit or a suspicion: it admits nothing more, and closes.)
OpenOnlyWithQuorum ==
    [][((fphase # "READY" /\ fphase' = "READY") => Cardinality({m \in Engines : eng'[m].phase = "READY" /\ eng'[m].committed >= ffloor' /\ eng'[m].committed <= fcommitted' /\ eng'[m].evidence = AllEvidence}) >= MinServing)
    /\ ((\E n \in Engines : \E i \in Slots : eng[n].bind[i] = 0 /\ eng'[n].bind[i] # 0) => (fphase \in {"READY", "ROLLING"} /\ Cardinality({m \in Engines : Serving(eng[m])}) >= MinServing))]_vars

\* A generation is published only onto at least min_serving members at once.
PublishOnQuorum ==
    [][fcommitted' # fcommitted => Cardinality({m \in Engines : eng'[m].phase = "READY" /\ eng'[m].committed >= ffloor' /\ eng'[m].committed <= fcommitted' /\ eng'[m].evidence = AllEvidence}) >= MinServing]_vars

\* A member that had an ambiguous outcome is never published onto.
NoPublishAfterAmbiguity ==
    [][\A n \in Engines : eng[n].amb => eng'[n].committed = eng[n].committed]_vars

\* A serving member leaves service for an update only while at least min_admitting members go on serving.
CapacityKeptThroughUpdates ==
    [][(\E n \in Engines : Serving(eng[n]) /\ eng'[n].phase = "DRAINING") => Cardinality({m \in Engines : eng'[m].phase = "READY" /\ eng'[m].committed >= ffloor' /\ eng'[m].committed <= fcommitted' /\ eng'[m].evidence = AllEvidence}) >= MinAdmitting]_vars

\* A recovery (after the controller crashed) ends only with every member READY or TAINTED with nothing in flight: no call the crashed controller made, and no update cycle it left half done, survives into the recovered fleet.
RecoveryLeavesNothingInDoubt ==
    [][(fphase = "RECOVERING" /\ fphase' # "RECOVERING") => \A n \in Engines : eng'[n].pending = "none" /\ eng'[n].phase \in {"READY", "TAINTED"}]_vars

\* A rollout that leaves one member and joins another in one step (a migration) keeps the generation it was admitted under: one rollout, one policy.
MigrationKeepsGeneration ==
    [][\A n, m \in Engines : \A i, j \in Slots :
        (eng[n].bind[i] # 0 /\ eng'[n].bind[i] = 0 /\ eng[m].bind[j] = 0 /\ eng'[m].bind[j] # 0)
        => eng'[m].bind[j] = eng[n].bind[i]]_vars

\* A rollout is bound (admitted, or migrated) only on a member serving a generation the fleet serves: never on one that prepares an update.
RolloutsJoinOnlyServingMembers ==
    [][\A n \in Engines : \A i \in Slots : (eng[n].bind[i] = 0 /\ eng'[n].bind[i] # 0) => Serving(eng[n])]_vars

\* A migration releases the rollout where it was as it binds it where it goes: the fleet holds as many rollouts after it as before, and no rollout is bound on two members at once (in the journal: OneRolloutOneMember).
MigrationMovesTheRollout ==
    [][(\E src, dst \in Engines : \E i, j \in Slots : Migrate(src, i, dst, j)) => (Cardinality({x \in Engines \X Slots : eng'[x[1]].bind[x[2]] # 0}) = Cardinality({x \in Engines \X Slots : eng[x[1]].bind[x[2]] # 0}))]_vars

\* After a controller crash (a takeover), a member the recovery has yet to restart moves only by its restart, which leaves it READY or TAINTED with nothing in flight: no outcome of a call the crashed controller made is taken as the new one's (in the journal: TakeoverAdoptsNothing).
InDoubtMembersOnlyRestart ==
    [][\A n \in Engines : (n \in fdown /\ eng'[n] # eng[n])
        => (n \notin fdown' /\ eng'[n].pending = "none" /\ eng'[n].phase \in {"READY", "TAINTED"})]_vars

MemberGenerationsMoveForward ==
    [][\A n \in Engines : LET e == eng[n]
                                  e2 == eng'[n] IN
        e2.committed \in {e.committed, e.committed + 1}]_vars

MemberTaintedIsAbsorbing ==
    [][\A n \in Engines : LET e == eng[n]
                                  e2 == eng'[n] IN
        e.phase = "TAINTED" =>
                    /\ e2.committed = e.committed /\ e2.bind = e.bind
                    /\ (e2.phase = "TAINTED" \/ e.pending = "readmit")]_vars

MemberNoAdmissionInDoubt ==
    [][\A n \in Engines : LET e == eng[n]
                                  e2 == eng'[n] IN
        (\E i \in Slots : e.bind[i] = 0 /\ e2.bind[i] # 0) => ~e.doubt]_vars

MemberAdmissionOnlyInReady ==
    [][\A n \in Engines : LET e == eng[n]
                                  e2 == eng'[n] IN
        (\E i \in Slots : e.bind[i] = 0 /\ e2.bind[i] # 0) => e.phase = "READY" ]_vars

MemberBindingsKeepTheirGeneration ==
    [][\A n \in Engines : LET e == eng[n]
                                  e2 == eng'[n] IN
        \A i \in Slots : (e.bind[i] # 0 /\ e2.bind[i] # 0) => e2.bind[i] = e.bind[i]]_vars

MemberNoRolloutCrossesMutation ==
    [][\A n \in Engines : LET e == eng[n]
                                  e2 == eng'[n] IN
        (e2.pending = "mutate" /\ e.pending # "mutate") => \A i \in Slots : e.bind[i] = 0]_vars

MemberWeightsChangeOnlyWhenQuiesced ==
    [][\A n \in Engines : LET e == eng[n]
                                  e2 == eng'[n] IN
        e2.weights # e.weights =>
                    \/ /\ e.phase = "UPDATING"
                       /\ e.paused
                       /\ \A i \in Slots : e.bind[i] = 0 /\ e.req[i] = 0
                    \/ /\ e2.pending = "readmit"
                       /\ e2.paused
                       /\ \A i \in Slots : e.bind[i] = 0 /\ e2.req[i] = 0
                    \/ e2.replaced]_vars

MemberPublishOnlyVerified ==
    [][\A n \in Engines : LET e == eng[n]
                                  e2 == eng'[n] IN
        (e2.committed # e.committed /\ e.phase # "UNINITIALIZED") =>
                    /\ e.phase = "RESUMING"
                    /\ e.evidence = AllEvidence
                    /\ e.cleared = Tiers
                    /\ \A i \in Slots : e.bind[i] = 0]_vars

MemberEvidenceOnlyWhileClosed ==
    [][\A n \in Engines : LET e == eng[n]
                                  e2 == eng'[n] IN
        (e2.evidence \ e.evidence) \ {"resumed"} # {} =>
                    \/ /\ e.phase \notin {"READY", "DRAINING"}
                       /\ \A i \in Slots : e.bind[i] = 0
                    \/ /\ e.phase = "READY" /\ e.pending = "audit"
                       /\ e2.evidence = AllEvidence]_vars

\* ---- liveness (under FairSpec, with finitely many FiniteStep)
\* The fleet opens on its first generation: its members start verified on it.
FleetOpens ==
    ([]<><<FiniteStep>>_vars) \/ ((fphase = "UNINITIALIZED") ~> (fphase # "UNINITIALIZED"))

\* Every fleet update the trainer asks for ends (published, ended, or aborted; or dropped by a controller crash, whose recovery ends: RecoveryEnds), whatever the clients do with their rollouts and whichever members fail, die or are suspected: a fleet never waits for ever on one member.
FleetUpdateEnds ==
    ([]<><<FiniteStep>>_vars) \/ ((fphase \in {"ROLLING", "UPDATING"}) ~> (~(fphase \in {"ROLLING", "UPDATING"})))

\* A controller restarted after a crash reopens the fleet, or keeps it closed by a recorded decision (fleet_recover_closed): it does not wait for ever.
RecoveryEnds ==
    ([]<><<FiniteStep>>_vars) \/ ((fphase = "RECOVERING") ~> (fphase # "RECOVERING"))

\* A TAINTED member is fenced (its fence confirmed) unless it leaves TAINTED first, during the fleet's update as outside it.
MemberTaintedIsFenced ==
    ([]<><<FiniteStep>>_vars) \/ (\A n \in Engines : (eng[n].phase = "TAINTED" /\ "fenced" \notin eng[n].evidence) ~> (eng[n].phase # "TAINTED" \/ "fenced" \in eng[n].evidence))

\* A fenced quarantined member comes back: the fleet's watchdog re-admits it, verified (a member whose every re-admission fails is not healthy: liveness speaks of finitely many re-admissions). With MemberTaintedIsFenced: every quarantined member leaves TAINTED.
QuarantineEnds ==
    ([]<><<FiniteStep>>_vars) \/ (\A n \in Engines : (eng[n].phase = "TAINTED" /\ "fenced" \in eng[n].evidence) ~> (eng[n].phase # "TAINTED"))

\* In a rolling fleet the floor rises to the frontier, whichever members fail, unless it waits for something only a client or the operator gives: a live rollout of a generation below the frontier (clients are not fair: one held for ever holds the floor; the drain's deadline, not the floor, bounds an update), capacity (no member may leave service to catch up: min_admitting or fewer serve, the others quarantined until re-admitted) or a closed fleet (ABORTING, until audited). So K live generations never leave a fleet stuck on its oldest.
FloorRises ==
    ([]<><<FiniteStep>>_vars) \/ ((ffloor < fcommitted) ~> (ffloor = fcommitted \/ (\E n \in Engines, i \in Slots : eng[n].bind[i] # 0 /\ eng[n].bind[i] < fcommitted) \/ Cardinality({m \in Engines : Serving(eng[m])}) <= MinAdmitting \/ fphase = "ABORTING"))

==============================================================================
