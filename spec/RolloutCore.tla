---------------------------- MODULE RolloutCore ----------------------------
\* Generated from spec/lifecycle.py by `rolloutcore spec tla`.
\* Do not edit: change the Python spec and regenerate.
EXTENDS Integers, FiniteSets, Sequences

CONSTANTS NumSlots, MaxGen, MaxFaults

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

VARIABLES phase, committed, target, pending, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults
vars == <<phase, committed, target, pending, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

Init ==
    /\ phase = "UNINITIALIZED"
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
    /\ faults = 0

\* The effect on the engine of an outcome of the operation in flight.

BootstrapOkEffect ==
    /\ phase \in {"UNINITIALIZED"}
    /\ pending = "bootstrap"
    /\ weights = 1 /\ label = 1 /\ ~paused
    /\ UNCHANGED <<weights, label, paused, req, caches, amb, stale, replaced, doubt>>

BootstrapFailedEffect ==
    /\ phase \in {"UNINITIALIZED"}
    /\ pending = "bootstrap"
    /\ UNCHANGED <<weights, label, paused, req, caches, amb, stale, replaced, doubt>>

BootstrapMismatchEffect ==
    /\ phase \in {"UNINITIALIZED"}
    /\ pending = "bootstrap"
    /\ weights # 1 \/ label # 1
    /\ UNCHANGED <<weights, label, paused, req, caches, amb, stale, replaced, doubt>>

PauseOkEffect ==
    /\ phase \in {"DRAINING"}
    /\ pending = "pause"
    /\ \A j \in Slots : req[j] = 0
    /\ paused' = TRUE
    /\ UNCHANGED <<weights, label, req, caches, amb, stale, replaced, doubt>>

PauseFailedEffect ==
    /\ phase \in {"DRAINING"}
    /\ pending = "pause"
    /\ paused' \in {paused, TRUE}
    /\ UNCHANGED <<weights, label, req, caches, amb, stale, replaced, doubt>>

PauseAbortOkEffect ==
    /\ phase \in {"DRAINING"}
    /\ pending = "pause_abort"
    /\ \A j \in Slots : req[j] = 0
    /\ paused' = TRUE
    /\ UNCHANGED <<weights, label, req, caches, amb, stale, replaced, doubt>>

PauseAbortFailedEffect ==
    /\ phase \in {"DRAINING"}
    /\ pending = "pause_abort"
    /\ paused' \in {paused, TRUE}
    /\ UNCHANGED <<weights, label, req, caches, amb, stale, replaced, doubt>>

MutateOkEffect ==
    /\ phase \in {"UPDATING"}
    /\ pending = "mutate"
    /\ weights' = target
    /\ label' = target
    /\ UNCHANGED <<paused, req, caches, amb, stale, replaced, doubt>>

MutateOkUnlabelledEffect ==
    /\ phase \in {"UPDATING"}
    /\ pending = "mutate"
    /\ weights' = target
    /\ UNCHANGED <<label, paused, req, caches, amb, stale, replaced, doubt>>

MutateOkWrongWeightsEffect ==
    /\ phase \in {"UPDATING"}
    /\ pending = "mutate"
    /\ weights' = MIXED
    /\ label' = target
    /\ UNCHANGED <<paused, req, caches, amb, stale, replaced, doubt>>

MutateOkBrokenEffect ==
    /\ phase \in {"UPDATING"}
    /\ pending = "mutate"
    /\ weights' = BROKEN
    /\ label' = target
    /\ UNCHANGED <<paused, req, caches, amb, stale, replaced, doubt>>

MutateRefusedEffect ==
    /\ phase \in {"UPDATING"}
    /\ pending = "mutate"
    /\ label = committed /\ weights = committed
    /\ UNCHANGED <<weights, label, paused, req, caches, amb, stale, replaced, doubt>>

MutateAmbiguousEffect ==
    /\ phase \in {"UPDATING"}
    /\ pending = "mutate"
    /\ weights' \in {committed, target, MIXED}
    /\ label' \in {committed, target}
    /\ amb' = TRUE
    /\ UNCHANGED <<paused, req, caches, stale, replaced, doubt>>

ResetOkEffect(t) ==
    /\ phase \in {"INVALIDATING"}
    /\ pending = "reset_" \o t
    /\ caches' = [caches EXCEPT ![t] = {}]
    /\ UNCHANGED <<weights, label, paused, req, amb, stale, replaced, doubt>>

ResetFailedEffect(t) ==
    /\ phase \in {"INVALIDATING"}
    /\ pending = "reset_" \o t
    /\ caches' \in {caches, [caches EXCEPT ![t] = {}]}
    /\ UNCHANGED <<weights, label, paused, req, amb, stale, replaced, doubt>>

ValidateOkEffect ==
    /\ phase \in {"VALIDATING"}
    /\ pending = "validate"
    /\ label = target /\ weights \in {target, BROKEN}
    /\ UNCHANGED <<weights, label, paused, req, caches, amb, stale, replaced, doubt>>

ValidateFailedEffect ==
    /\ phase \in {"VALIDATING"}
    /\ pending = "validate"
    /\ UNCHANGED <<weights, label, paused, req, caches, amb, stale, replaced, doubt>>

ValidateMismatchEffect ==
    /\ phase \in {"VALIDATING"}
    /\ pending = "validate"
    /\ label # target \/ weights \notin {target, BROKEN}
    /\ amb' = TRUE
    /\ UNCHANGED <<weights, label, paused, req, caches, stale, replaced, doubt>>

ResumeOkEffect ==
    /\ phase \in {"DRAINING", "RESUMING"}
    /\ pending = "resume"
    /\ paused' = FALSE
    /\ UNCHANGED <<weights, label, req, caches, amb, stale, replaced, doubt>>

ResumeFailedEffect ==
    /\ phase \in {"DRAINING", "RESUMING"}
    /\ pending = "resume"
    /\ UNCHANGED <<weights, label, paused, req, caches, amb, stale, replaced, doubt>>

ProbeOkEffect ==
    /\ phase \in {"RESUMING"}
    /\ pending = "probe"
    /\ weights = target
    /\ stale' = (stale \/ \E t \in Tiers : caches[t] \ {weights} # {})
    /\ caches' = [t \in Tiers |-> caches[t] \cup {weights}]
    /\ UNCHANGED <<weights, label, paused, req, amb, replaced, doubt>>

ProbeFailedEffect ==
    /\ phase \in {"RESUMING"}
    /\ pending = "probe"
    /\ UNCHANGED <<weights, label, paused, req, caches, amb, stale, replaced, doubt>>

ProbeMismatchEffect ==
    /\ phase \in {"RESUMING"}
    /\ pending = "probe"
    /\ weights # target
    /\ amb' = TRUE
    /\ UNCHANGED <<weights, label, paused, req, caches, stale, replaced, doubt>>

FenceOkEffect ==
    /\ phase \in {"TAINTED"}
    /\ pending = "fence"
    /\ \A j \in Slots : req[j] = 0
    /\ paused' = TRUE
    /\ label' = TAINT
    /\ UNCHANGED <<weights, req, caches, amb, stale, replaced, doubt>>

FenceFailedEffect ==
    /\ phase \in {"TAINTED"}
    /\ pending = "fence"
    /\ paused' \in {paused, TRUE}
    /\ label' \in {label, TAINT}
    /\ UNCHANGED <<weights, req, caches, amb, stale, replaced, doubt>>

ReadmitOkEffect ==
    /\ phase \in {"TAINTED"}
    /\ pending = "readmit"
    /\ weights = committed /\ label = committed
    /\ paused' = FALSE
    /\ stale' = (stale \/ \E t \in Tiers : caches[t] \ {weights} # {})
    /\ caches' = [t \in Tiers |-> caches[t] \cup {weights}]
    /\ replaced' = FALSE
    /\ doubt' = FALSE
    /\ UNCHANGED <<weights, label, req, amb>>

ReadmitMismatchEffect ==
    /\ phase \in {"TAINTED"}
    /\ pending = "readmit"
    /\ weights # committed \/ label # committed
    /\ paused' = FALSE
    /\ UNCHANGED <<weights, label, req, caches, amb, stale, replaced, doubt>>

ReadmitFailedEffect ==
    /\ phase \in {"TAINTED"}
    /\ pending = "readmit"
    /\ paused' \in {paused, FALSE}
    /\ UNCHANGED <<weights, label, req, caches, amb, stale, replaced, doubt>>

AuditOkEffect ==
    /\ phase \in {"READY"}
    /\ pending = "audit"
    /\ weights = committed /\ label = committed /\ ~paused
    /\ replaced' = FALSE
    /\ doubt' = FALSE
    /\ UNCHANGED <<weights, label, paused, req, caches, amb, stale>>

AuditMismatchEffect ==
    /\ phase \in {"READY"}
    /\ pending = "audit"
    /\ ~(weights = committed /\ label = committed /\ ~paused)
    /\ UNCHANGED <<weights, label, paused, req, caches, amb, stale, replaced, doubt>>

AuditFailedEffect ==
    /\ phase \in {"READY"}
    /\ pending = "audit"
    /\ doubt' = TRUE
    /\ UNCHANGED <<weights, label, paused, req, caches, amb, stale, replaced>>

InFlight ==
    \/ UNCHANGED <<weights, label, paused, req, caches, amb, stale, replaced, doubt>>
    \/ BootstrapOkEffect
    \/ BootstrapFailedEffect
    \/ BootstrapMismatchEffect
    \/ PauseOkEffect
    \/ PauseFailedEffect
    \/ PauseAbortOkEffect
    \/ PauseAbortFailedEffect
    \/ MutateOkEffect
    \/ MutateOkUnlabelledEffect
    \/ MutateOkWrongWeightsEffect
    \/ MutateOkBrokenEffect
    \/ MutateRefusedEffect
    \/ MutateAmbiguousEffect
    \/ \E t \in Tiers : ResetOkEffect(t)
    \/ \E t \in Tiers : ResetFailedEffect(t)
    \/ ValidateOkEffect
    \/ ValidateFailedEffect
    \/ ValidateMismatchEffect
    \/ ResumeOkEffect
    \/ ResumeFailedEffect
    \/ ProbeOkEffect
    \/ ProbeFailedEffect
    \/ ProbeMismatchEffect
    \/ FenceOkEffect
    \/ FenceFailedEffect
    \/ ReadmitOkEffect
    \/ ReadmitMismatchEffect
    \/ ReadmitFailedEffect
    \/ AuditOkEffect
    \/ AuditMismatchEffect
    \/ AuditFailedEffect

\* bootstrap_begin [control]: Read the fresh engine: label, weight identity, a probe generation.
BootstrapBegin ==
    /\ phase \in {"UNINITIALIZED"}
    /\ pending = "none"
    /\ pending' = "bootstrap"
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* bootstrap_ok [outcome]: The engine reports the initial generation's label and identity, is running, and its probe output matches: generation 1 is committed and admissions open.
BootstrapOk ==
    /\ phase \in {"UNINITIALIZED"}
    /\ pending = "bootstrap"
    /\ weights = 1 /\ label = 1 /\ ~paused
    /\ phase' = "READY"
    /\ committed' = 1
    /\ evidence' = AllEvidence
    /\ pending' = "none"
    /\ UNCHANGED <<target, bind, cleared, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* bootstrap_failed [outcome]: The engine could not be read; stay uninitialised (retried).
BootstrapFailed ==
    /\ phase \in {"UNINITIALIZED"}
    /\ pending = "bootstrap"
    /\ faults < MaxFaults
    /\ pending' = "none"
    /\ faults' = faults + 1
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt>>

\* bootstrap_mismatch [outcome]: The engine definitely holds other weights (or another label) than the declared initial ones: stay uninitialised; asking again cannot help.
BootstrapMismatch ==
    /\ phase \in {"UNINITIALIZED"}
    /\ pending = "bootstrap"
    /\ weights # 1 \/ label # 1
    /\ pending' = "none"
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* admit [control]: Admit a rollout: bind it to the committed generation; the engine starts it. Only with every piece of evidence in hand (not after a failed audit or a suspicion, until an audit passes).
Admit(i) ==
    /\ phase \in {"READY"}
    /\ bind[i] = 0 /\ evidence = AllEvidence
    /\ req[i] = 0
    /\ bind' = [bind EXCEPT ![i] = committed]
    /\ req' = [req EXCEPT ![i] = weights]
    /\ stale' = (stale \/ \E t \in Tiers : caches[t] \ {weights} # {})
    /\ caches' = [t \in Tiers |-> caches[t] \cup {weights}]
    /\ UNCHANGED <<phase, committed, target, pending, cleared, evidence, weights, label, paused, amb, replaced, doubt, faults>>

\* engine_finish [environment]: The engine finishes a request (maybe before the application releases it); a wait-mode pause lets in-flight requests run to completion (observed on vLLM).
EngineFinish(i) ==
    /\ phase \in {"DRAINING", "INVALIDATING", "QUIESCED", "READY", "RESUMING", "TAINTED", "UNINITIALIZED", "UPDATING", "VALIDATING"}
    /\ req[i] # 0
    /\ req' = [req EXCEPT ![i] = 0]
    /\ UNCHANGED <<phase, committed, target, pending, bind, cleared, evidence, weights, label, paused, caches, amb, stale, replaced, doubt, faults>>

\* release [control]: The application releases a rollout's binding. If the engine still runs the request (the client gave up), the request lives on as an orphan.
Release(i) ==
    /\ phase \in {"DRAINING", "READY"}
    /\ bind[i] # 0
    /\ bind' = [bind EXCEPT ![i] = 0]
    /\ UNCHANGED <<phase, committed, target, pending, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* release_aborted [control]: Drain policy wait-then-abort: past the drain deadline a bound rollout is released as aborted (never as finished, never counted in the new generation). Its engine request lives on until the abort-mode pause ends it.
ReleaseAborted(i) ==
    /\ phase \in {"DRAINING"}
    /\ bind[i] # 0
    /\ bind' = [bind EXCEPT ![i] = 0]
    /\ UNCHANGED <<phase, committed, target, pending, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* request_update [control]: The trainer asks for the next generation: admissions close, draining starts. Only from a verified engine (an update abandoned later restores the evidence it started with).
RequestUpdate ==
    /\ phase \in {"READY"}
    /\ pending = "none" /\ evidence = AllEvidence
    /\ committed < MaxGen
    /\ phase' = "DRAINING"
    /\ target' = committed + 1
    /\ UNCHANGED <<committed, pending, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* cancel_update [control]: The pending update is cancelled while draining: admissions reopen, nothing moved. Only with the engine known to run (after a failed pause: resume it first).
CancelUpdate ==
    /\ phase \in {"DRAINING"}
    /\ pending = "none" /\ "resumed" \in evidence
    /\ phase' = "READY"
    /\ target' = 0
    /\ UNCHANGED <<committed, pending, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* pause_begin [control]: Every local binding is released: pause the engine in wait mode (it returns only once its own requests, orphans included, have finished).
PauseBegin ==
    /\ phase \in {"DRAINING"}
    /\ pending = "none" /\ \A j \in Slots : bind[j] = 0
    /\ pending' = "pause"
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* pause_ok [outcome]: The engine reports paused with no request running: quiesced.
PauseOk ==
    /\ phase \in {"DRAINING"}
    /\ pending = "pause"
    /\ \A j \in Slots : req[j] = 0
    /\ phase' = "QUIESCED"
    /\ evidence' = evidence \ {"resumed"}
    /\ pending' = "none"
    /\ paused' = TRUE
    /\ UNCHANGED <<committed, target, bind, cleared, weights, label, req, caches, amb, stale, replaced, doubt, faults>>

\* pause_failed [outcome]: The pause did not complete (timeout, requests still running): it may have taken effect, so the engine is no longer known to run: it must be resumed before admissions reopen.
PauseFailed ==
    /\ phase \in {"DRAINING"}
    /\ pending = "pause"
    /\ faults < MaxFaults
    /\ evidence' = evidence \ {"resumed"}
    /\ pending' = "none"
    /\ paused' \in {paused, TRUE}
    /\ faults' = faults + 1
    /\ UNCHANGED <<phase, committed, target, bind, cleared, weights, label, req, caches, amb, stale, replaced, doubt>>

\* pause_abort_begin [control]: Drain policy wait-then-abort: every binding is released (finished or aborted); pause the engine in abort mode, which ends the requests it still runs with partial output.
PauseAbortBegin ==
    /\ phase \in {"DRAINING"}
    /\ pending = "none" /\ \A j \in Slots : bind[j] = 0
    /\ pending' = "pause_abort"
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* pause_abort_ok [outcome]: The engine reports paused and its running count reads 0: every aborted request is gone before anything mutates.
PauseAbortOk ==
    /\ phase \in {"DRAINING"}
    /\ pending = "pause_abort"
    /\ \A j \in Slots : req[j] = 0
    /\ phase' = "QUIESCED"
    /\ evidence' = evidence \ {"resumed"}
    /\ pending' = "none"
    /\ paused' = TRUE
    /\ UNCHANGED <<committed, target, bind, cleared, weights, label, req, caches, amb, stale, replaced, doubt, faults>>

\* pause_abort_failed [outcome]: The abort-mode pause did not complete, or requests still run: it may have paused the engine.
PauseAbortFailed ==
    /\ phase \in {"DRAINING"}
    /\ pending = "pause_abort"
    /\ faults < MaxFaults
    /\ evidence' = evidence \ {"resumed"}
    /\ pending' = "none"
    /\ paused' \in {paused, TRUE}
    /\ faults' = faults + 1
    /\ UNCHANGED <<phase, committed, target, bind, cleared, weights, label, req, caches, amb, stale, replaced, doubt>>

\* abandon_update [control]: Give up the update before any mutation: resume the committed generation.
AbandonUpdate ==
    /\ phase \in {"QUIESCED"}
    /\ pending = "none"
    /\ phase' = "RESUMING"
    /\ target' = 0
    /\ UNCHANGED <<committed, pending, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* mutate_begin [control]: Start the weight mutation (a collective: never retried).
MutateBegin ==
    /\ phase \in {"QUIESCED"}
    /\ pending = "none" /\ target # 0
    /\ phase' = "UPDATING"
    /\ evidence' = {}
    /\ cleared' = {}
    /\ pending' = "mutate"
    /\ UNCHANGED <<committed, target, bind, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* mutate_ok [outcome]: The transfer finalised with the target's label and the target's weights.
MutateOk ==
    /\ phase \in {"UPDATING"}
    /\ pending = "mutate"
    /\ phase' = "INVALIDATING"
    /\ pending' = "none"
    /\ weights' = target
    /\ label' = target
    /\ UNCHANGED <<committed, target, bind, cleared, evidence, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* mutate_ok_unlabelled [outcome]: Returned ok, weights moved, but finalised without the target label (the seed's bug): looks like mutate_ok; validation must catch it.
MutateOkUnlabelled ==
    /\ phase \in {"UPDATING"}
    /\ pending = "mutate"
    /\ faults < MaxFaults
    /\ phase' = "INVALIDATING"
    /\ pending' = "none"
    /\ weights' = target
    /\ faults' = faults + 1
    /\ UNCHANGED <<committed, target, bind, cleared, evidence, label, paused, req, caches, amb, stale, replaced, doubt>>

\* mutate_ok_wrong_weights [outcome]: Returned ok with the target label, but the engine holds other weights (a different checkpoint, a partial load): looks like mutate_ok.
MutateOkWrongWeights ==
    /\ phase \in {"UPDATING"}
    /\ pending = "mutate"
    /\ faults < MaxFaults
    /\ phase' = "INVALIDATING"
    /\ pending' = "none"
    /\ weights' = MIXED
    /\ label' = target
    /\ faults' = faults + 1
    /\ UNCHANGED <<committed, target, bind, cleared, evidence, paused, req, caches, amb, stale, replaced, doubt>>

\* mutate_ok_broken [outcome]: Returned ok with the target label; the weights read as the target's to the identity digest but do not compute as them: only the probe can tell.
MutateOkBroken ==
    /\ phase \in {"UPDATING"}
    /\ pending = "mutate"
    /\ faults < MaxFaults
    /\ phase' = "INVALIDATING"
    /\ pending' = "none"
    /\ weights' = BROKEN
    /\ label' = target
    /\ faults' = faults + 1
    /\ UNCHANGED <<committed, target, bind, cleared, evidence, paused, req, caches, amb, stale, replaced, doubt>>

\* mutate_refused [outcome]: Refused with proof that nothing moved (identity mismatch, no headroom, init refused), and a read after it shows the engine still on the committed label and weights: the update is over, the old evidence stands again. A refusal that leaves the engine on anything else (a label set by hand) is ambiguous.
MutateRefused ==
    /\ phase \in {"UPDATING"}
    /\ pending = "mutate"
    /\ label = committed /\ weights = committed
    /\ faults < MaxFaults
    /\ phase' = "QUIESCED"
    /\ target' = 0
    /\ evidence' = WeightEvidence
    /\ pending' = "none"
    /\ faults' = faults + 1
    /\ UNCHANGED <<committed, bind, cleared, weights, label, paused, req, caches, amb, stale, replaced, doubt>>

\* mutate_ambiguous [outcome]: Timed out, died halfway or failed unclassifiably: the weights may be old, new or mixed. TAINTED, nothing retries the collective.
MutateAmbiguous ==
    /\ phase \in {"UPDATING"}
    /\ pending = "mutate"
    /\ faults < MaxFaults
    /\ phase' = "TAINTED"
    /\ pending' = "none"
    /\ weights' \in {committed, target, MIXED}
    /\ label' \in {committed, target}
    /\ amb' = TRUE
    /\ faults' = faults + 1
    /\ UNCHANGED <<committed, target, bind, cleared, evidence, paused, req, caches, stale, replaced, doubt>>

\* reset_begin [control]: Ask the engine to reset one cache tier.
ResetBegin(t) ==
    /\ phase \in {"INVALIDATING"}
    /\ pending = "none" /\ t \notin cleared
    /\ pending' = "reset_" \o t
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* reset_ok [outcome]: The reset is verified (response body and, for prefix KV, the hit counters).
ResetOk(t) ==
    /\ phase \in {"INVALIDATING"}
    /\ pending = "reset_" \o t
    /\ cleared' = cleared \cup {t}
    /\ pending' = "none"
    /\ caches' = [caches EXCEPT ![t] = {}]
    /\ UNCHANGED <<phase, committed, target, bind, evidence, weights, label, paused, req, amb, stale, replaced, doubt, faults>>

\* reset_failed [outcome]: The reset was refused (success:false, blocks in use) or could not be verified (empty body): it may or may not have cleared; it does not count.
ResetFailed(t) ==
    /\ phase \in {"INVALIDATING"}
    /\ pending = "reset_" \o t
    /\ faults < MaxFaults
    /\ pending' = "none"
    /\ caches' \in {caches, [caches EXCEPT ![t] = {}]}
    /\ faults' = faults + 1
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, amb, stale, replaced, doubt>>

\* invalidated [control]: Every tier is verified clean.
Invalidated ==
    /\ phase \in {"INVALIDATING"}
    /\ pending = "none" /\ cleared = Tiers
    /\ phase' = "VALIDATING"
    /\ UNCHANGED <<committed, target, pending, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* validate_begin [control]: Read the engine's label and the identity of the weights it holds (paused).
ValidateBegin ==
    /\ phase \in {"VALIDATING"}
    /\ pending = "none"
    /\ pending' = "validate"
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* validate_ok [outcome]: Label and weight identity read as the target's (the digest cannot see BROKEN weights).
ValidateOk ==
    /\ phase \in {"VALIDATING"}
    /\ pending = "validate"
    /\ label = target /\ weights \in {target, BROKEN}
    /\ phase' = "RESUMING"
    /\ evidence' = evidence \cup {"version", "identity"}
    /\ pending' = "none"
    /\ UNCHANGED <<committed, target, bind, cleared, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* validate_failed [outcome]: The reads failed (timeout, connection reset): retry them.
ValidateFailed ==
    /\ phase \in {"VALIDATING"}
    /\ pending = "validate"
    /\ faults < MaxFaults
    /\ pending' = "none"
    /\ faults' = faults + 1
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt>>

\* validate_mismatch [outcome]: The engine holds something other than the target (label or identity): the mutation's outcome is ambiguous after all. TAINTED.
ValidateMismatch ==
    /\ phase \in {"VALIDATING"}
    /\ pending = "validate"
    /\ label # target \/ weights \notin {target, BROKEN}
    /\ phase' = "TAINTED"
    /\ pending' = "none"
    /\ amb' = TRUE
    /\ UNCHANGED <<committed, target, bind, cleared, evidence, weights, label, paused, req, caches, stale, replaced, doubt, faults>>

\* resume_begin [control]: Resume the engine (after a failed pause, or after validation); admissions stay closed.
ResumeBegin ==
    /\ phase \in {"DRAINING", "RESUMING"}
    /\ pending = "none" /\ "resumed" \notin evidence
    /\ pending' = "resume"
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* resume_ok [outcome]: The engine reads as running.
ResumeOk ==
    /\ phase \in {"DRAINING", "RESUMING"}
    /\ pending = "resume"
    /\ evidence' = evidence \cup {"resumed"}
    /\ pending' = "none"
    /\ paused' = FALSE
    /\ UNCHANGED <<phase, committed, target, bind, cleared, weights, label, req, caches, amb, stale, replaced, doubt, faults>>

\* resume_failed [outcome]: The resume failed and the engine reads as paused: retry.
ResumeFailed ==
    /\ phase \in {"DRAINING", "RESUMING"}
    /\ pending = "resume"
    /\ faults < MaxFaults
    /\ pending' = "none"
    /\ faults' = faults + 1
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt>>

\* probe_begin [control]: Run the post-update probe (admissions still closed).
ProbeBegin ==
    /\ phase \in {"RESUMING"}
    /\ pending = "none" /\ target # 0 /\ "resumed" \in evidence /\ "probe" \notin evidence
    /\ pending' = "probe"
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* probe_ok [outcome]: The probe's output equals the target's reference (token for token, or every scored position's log-probability within tolerance).
ProbeOk ==
    /\ phase \in {"RESUMING"}
    /\ pending = "probe"
    /\ weights = target
    /\ evidence' = evidence \cup {"probe"}
    /\ pending' = "none"
    /\ stale' = (stale \/ \E t \in Tiers : caches[t] \ {weights} # {})
    /\ caches' = [t \in Tiers |-> caches[t] \cup {weights}]
    /\ UNCHANGED <<phase, committed, target, bind, cleared, weights, label, paused, req, amb, replaced, doubt, faults>>

\* probe_failed [outcome]: The probe request failed (timeout, 5xx): retry.
ProbeFailed ==
    /\ phase \in {"RESUMING"}
    /\ pending = "probe"
    /\ faults < MaxFaults
    /\ pending' = "none"
    /\ faults' = faults + 1
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt>>

\* probe_mismatch [outcome]: The probe computed something other than the target's reference: TAINTED.
ProbeMismatch ==
    /\ phase \in {"RESUMING"}
    /\ pending = "probe"
    /\ weights # target
    /\ phase' = "TAINTED"
    /\ pending' = "none"
    /\ amb' = TRUE
    /\ UNCHANGED <<committed, target, bind, cleared, evidence, weights, label, paused, req, caches, stale, replaced, doubt, faults>>

\* publish [control]: All evidence is in: commit the target and reopen admissions.
Publish ==
    /\ phase \in {"RESUMING"}
    /\ pending = "none" /\ target # 0 /\ evidence = AllEvidence
    /\ phase' = "READY"
    /\ committed' = target
    /\ target' = 0
    /\ UNCHANGED <<pending, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* reopen [control]: An abandoned update: the engine runs the committed generation again; reopen.
Reopen ==
    /\ phase \in {"RESUMING"}
    /\ pending = "none" /\ target = 0 /\ evidence = AllEvidence
    /\ phase' = "READY"
    /\ UNCHANGED <<committed, target, pending, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* give_up [control]: Retries of an idempotent step are exhausted after a mutation, or the engine is no longer known to run (a pause that failed and the resume after it failed too: the process may be gone): fail closed, so that a fleet waiting on this member always has a decision to take.
GiveUp ==
    /\ phase \in {"DRAINING", "INVALIDATING", "RESUMING", "VALIDATING"}
    /\ pending = "none" /\ ("resumed" \notin evidence \/ (target # 0 /\ phase # "DRAINING"))
    /\ phase' = "TAINTED"
    /\ UNCHANGED <<committed, target, pending, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* fence_begin [control]: Fence the tainted engine: pause it in abort mode and relabel it tainted:<target>, so that no direct caller is served by or misled about weights that were never published.
FenceBegin ==
    /\ phase \in {"TAINTED"}
    /\ pending = "none" /\ "fenced" \notin evidence
    /\ pending' = "fence"
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* fence_ok [outcome]: The engine reads as paused, with no request running, under the taint label.
FenceOk ==
    /\ phase \in {"TAINTED"}
    /\ pending = "fence"
    /\ \A j \in Slots : req[j] = 0
    /\ evidence' = evidence \cup {"fenced"}
    /\ pending' = "none"
    /\ paused' = TRUE
    /\ label' = TAINT
    /\ UNCHANGED <<phase, committed, target, bind, cleared, weights, req, caches, amb, stale, replaced, doubt, faults>>

\* fence_failed [outcome]: The fence could not be confirmed (the engine may be dead, frozen or half-fenced); retried a bounded number of times, then left.
FenceFailed ==
    /\ phase \in {"TAINTED"}
    /\ pending = "fence"
    /\ faults < MaxFaults
    /\ pending' = "none"
    /\ paused' \in {paused, TRUE}
    /\ label' \in {label, TAINT}
    /\ faults' = faults + 1
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, req, caches, amb, stale, replaced, doubt>>

\* readmit_begin [control]: An operator (or a fleet rolling a member back) re-admits the engine: pause it in abort mode, reload the committed generation's checkpoint, reset every cache tier; the reload may or may not produce the committed weights.
ReadmitBegin ==
    /\ phase \in {"TAINTED"}
    /\ pending = "none"
    /\ evidence' = {}
    /\ pending' = "readmit"
    /\ weights' \in {committed, MIXED, BROKEN}
    /\ label' \in {committed, label}
    /\ paused' = TRUE
    /\ req' = [i \in Slots |-> 0]
    /\ caches' = [t \in Tiers |-> {}]
    /\ amb' = FALSE
    /\ UNCHANGED <<phase, committed, target, bind, cleared, stale, replaced, doubt, faults>>

\* readmit_ok [outcome]: Label, identity and a probe all read as the committed generation's; the engine resumed: it serves again, known to be the engine verified.
ReadmitOk ==
    /\ phase \in {"TAINTED"}
    /\ pending = "readmit"
    /\ weights = committed /\ label = committed
    /\ phase' = "READY"
    /\ target' = 0
    /\ evidence' = AllEvidence
    /\ cleared' = Tiers
    /\ pending' = "none"
    /\ paused' = FALSE
    /\ stale' = (stale \/ \E t \in Tiers : caches[t] \ {weights} # {})
    /\ caches' = [t \in Tiers |-> caches[t] \cup {weights}]
    /\ replaced' = FALSE
    /\ doubt' = FALSE
    /\ UNCHANGED <<committed, bind, weights, label, req, amb, faults>>

\* readmit_mismatch [outcome]: The engine does not hold the committed generation (label, identity or probe): it stays quarantined, unfenced (the probe resumed it).
ReadmitMismatch ==
    /\ phase \in {"TAINTED"}
    /\ pending = "readmit"
    /\ weights # committed \/ label # committed
    /\ evidence' = {}
    /\ pending' = "none"
    /\ paused' = FALSE
    /\ UNCHANGED <<phase, committed, target, bind, cleared, weights, label, req, caches, amb, stale, replaced, doubt, faults>>

\* readmit_failed [outcome]: The procedure could not be completed or verified: quarantined, state unknown (not fenced).
ReadmitFailed ==
    /\ phase \in {"TAINTED"}
    /\ pending = "readmit"
    /\ faults < MaxFaults
    /\ evidence' = {}
    /\ pending' = "none"
    /\ paused' \in {paused, FALSE}
    /\ faults' = faults + 1
    /\ UNCHANGED <<phase, committed, target, bind, cleared, weights, label, req, caches, amb, stale, replaced, doubt>>

\* audit_begin [control]: Audit a serving engine (the fleet's watchdog, an operator, a suspicion): read its label, weight identity and run state, and run a probe. Admissions go on meanwhile on the evidence in hand.
AuditBegin ==
    /\ phase \in {"READY"}
    /\ pending = "none"
    /\ pending' = "audit"
    /\ UNCHANGED <<phase, committed, target, bind, cleared, evidence, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* audit_ok [outcome]: Label, identity, run state and probe all read as the committed generation's: every piece of evidence is (again) in hand, and the engine is known to be the one verified, whatever happened to its process before.
AuditOk ==
    /\ phase \in {"READY"}
    /\ pending = "audit"
    /\ weights = committed /\ label = committed /\ ~paused
    /\ evidence' = AllEvidence
    /\ pending' = "none"
    /\ replaced' = FALSE
    /\ doubt' = FALSE
    /\ UNCHANGED <<phase, committed, target, bind, cleared, weights, label, paused, req, caches, amb, stale, faults>>

\* audit_mismatch [outcome]: The engine definitely is not the one verified (another label, other weights, paused): it was replaced or changed behind the controller's back. TAINTED (fenced; it serves again only after verified re-admission); its bound rollouts ran on it and are released as aborted.
AuditMismatch ==
    /\ phase \in {"READY"}
    /\ pending = "audit"
    /\ ~(weights = committed /\ label = committed /\ ~paused)
    /\ phase' = "TAINTED"
    /\ bind' = [i \in Slots |-> 0]
    /\ evidence' = {}
    /\ pending' = "none"
    /\ UNCHANGED <<committed, target, cleared, weights, label, paused, req, caches, amb, stale, replaced, doubt, faults>>

\* audit_failed [outcome]: The engine could not be reached or read (timeout, connection refused, an unreadable answer): its state is unknown, so every piece of evidence is dropped and admissions and updates wait until an audit passes. Rollouts already bound stay bound (admitted on verified evidence, their requests end on their own).
AuditFailed ==
    /\ phase \in {"READY"}
    /\ pending = "audit"
    /\ faults < MaxFaults
    /\ evidence' = {}
    /\ pending' = "none"
    /\ doubt' = TRUE
    /\ faults' = faults + 1
    /\ UNCHANGED <<phase, committed, target, bind, cleared, weights, label, paused, req, caches, amb, stale, replaced>>

\* suspect [control]: The application reports the engine unreachable (a rollout's request could not connect): every piece of evidence is dropped, so admissions and updates wait until an audit passes.
Suspect ==
    /\ phase \in {"READY"}
    /\ evidence = AllEvidence
    /\ faults < MaxFaults
    /\ evidence' = {}
    /\ doubt' = TRUE
    /\ faults' = faults + 1
    /\ UNCHANGED <<phase, committed, target, pending, bind, cleared, weights, label, paused, req, caches, amb, stale, replaced>>

\* engine_restart [environment]: The engine's process is replaced out of band (an orchestrator's restart, a relaunch, an operator): a fresh process, running, with nothing in flight and empty caches, holding the committed weights or others and reporting the initial label, the committed one or another. The controller cannot see it: its evidence speaks of the old process until an audit (or an update's own verification) reads the new one.
EngineRestart ==
    /\ phase \in {"DRAINING", "INVALIDATING", "QUIESCED", "READY", "RESUMING", "TAINTED", "UPDATING", "VALIDATING"}
    /\ faults < MaxFaults
    /\ weights' \in {committed, MIXED}
    /\ label' \in {1, committed, MIXED}
    /\ paused' = FALSE
    /\ req' = [i \in Slots |-> 0]
    /\ caches' = [t \in Tiers |-> {}]
    /\ replaced' = TRUE
    /\ faults' = faults + 1
    /\ UNCHANGED <<phase, committed, target, pending, bind, cleared, evidence, amb, stale, doubt>>

\* restart_uninitialized [restart]: Restarted before any bootstrap completed: the engine was only read.
RestartUninitialized ==
    /\ phase \in {"UNINITIALIZED"}
    /\ faults < MaxFaults
    /\ phase' = "UNINITIALIZED"
    /\ pending' = "none"
    /\ InFlight
    /\ faults' = faults + 1
    /\ UNCHANGED <<committed, target, bind, cleared, evidence>>

\* restart_ready [restart]: Restarted with nothing in flight and the engine known to run the committed generation (READY, or DRAINING never paused, or resumed since): READY again with the evidence it held; the crashed process's rollouts are gone (the engine requests they left are orphans) and a pending update request is dropped. A crash during an audit (a read and a probe) restarts READY too, but without evidence: the audit's answer is lost, so admissions wait until an audit passes.
RestartReady ==
    /\ phase \in {"DRAINING", "READY"}
    /\ (pending = "none" /\ (phase = "READY" \/ (phase = "DRAINING" /\ "resumed" \in evidence))) \/ (phase = "READY" /\ pending = "audit")
    /\ faults < MaxFaults
    /\ phase' = "READY"
    /\ pending' = "none"
    /\ target' = 0
    /\ bind' = [i \in Slots |-> 0]
    /\ evidence' = IF pending = "none" THEN evidence ELSE {}
    /\ InFlight
    /\ faults' = faults + 1
    /\ UNCHANGED <<committed, cleared>>

\* restart_tainted [restart]: Restarted anywhere else (a pause or mutation may have happened, or an operation was in flight, whose effect may or may not have taken place): fail closed. A fence confirmed before the crash still stands.
RestartTainted ==
    /\ phase \in {"DRAINING", "INVALIDATING", "QUIESCED", "READY", "RESUMING", "TAINTED", "UPDATING", "VALIDATING"}
    /\ ~((pending = "none" /\ (phase = "READY" \/ (phase = "DRAINING" /\ "resumed" \in evidence))) \/ (phase = "READY" /\ pending = "audit"))
    /\ faults < MaxFaults
    /\ phase' = "TAINTED"
    /\ pending' = "none"
    /\ bind' = [i \in Slots |-> 0]
    /\ evidence' = IF phase = "TAINTED" THEN evidence \cap {"fenced"} ELSE {}
    /\ InFlight
    /\ faults' = faults + 1
    /\ UNCHANGED <<committed, target, cleared>>

Next ==
    \/ BootstrapBegin
    \/ BootstrapOk
    \/ BootstrapFailed
    \/ BootstrapMismatch
    \/ \E i \in Slots : Admit(i)
    \/ \E i \in Slots : EngineFinish(i)
    \/ \E i \in Slots : Release(i)
    \/ \E i \in Slots : ReleaseAborted(i)
    \/ RequestUpdate
    \/ CancelUpdate
    \/ PauseBegin
    \/ PauseOk
    \/ PauseFailed
    \/ PauseAbortBegin
    \/ PauseAbortOk
    \/ PauseAbortFailed
    \/ AbandonUpdate
    \/ MutateBegin
    \/ MutateOk
    \/ MutateOkUnlabelled
    \/ MutateOkWrongWeights
    \/ MutateOkBroken
    \/ MutateRefused
    \/ MutateAmbiguous
    \/ \E t \in Tiers : ResetBegin(t)
    \/ \E t \in Tiers : ResetOk(t)
    \/ \E t \in Tiers : ResetFailed(t)
    \/ Invalidated
    \/ ValidateBegin
    \/ ValidateOk
    \/ ValidateFailed
    \/ ValidateMismatch
    \/ ResumeBegin
    \/ ResumeOk
    \/ ResumeFailed
    \/ ProbeBegin
    \/ ProbeOk
    \/ ProbeFailed
    \/ ProbeMismatch
    \/ Publish
    \/ Reopen
    \/ GiveUp
    \/ FenceBegin
    \/ FenceOk
    \/ FenceFailed
    \/ ReadmitBegin
    \/ ReadmitOk
    \/ ReadmitMismatch
    \/ ReadmitFailed
    \/ AuditBegin
    \/ AuditOk
    \/ AuditMismatch
    \/ AuditFailed
    \/ Suspect
    \/ EngineRestart
    \/ RestartUninitialized
    \/ RestartReady
    \/ RestartTainted

Spec == Init /\ [][Next]_vars

\* The spec with its fairness assumptions (liveness is checked under it).
FairSpec == Spec
    /\ WF_vars(BootstrapOk \/ BootstrapFailed \/ BootstrapMismatch \/ PauseOk \/ PauseFailed \/ PauseAbortOk \/ PauseAbortFailed \/ MutateOk \/ MutateOkUnlabelled \/ MutateOkWrongWeights \/ MutateOkBroken \/ MutateRefused \/ MutateAmbiguous \/ (\E t \in Tiers : ResetOk(t)) \/ (\E t \in Tiers : ResetFailed(t)) \/ ValidateOk \/ ValidateFailed \/ ValidateMismatch \/ ResumeOk \/ ResumeFailed \/ ProbeOk \/ ProbeFailed \/ ProbeMismatch \/ FenceOk \/ FenceFailed \/ ReadmitOk \/ ReadmitMismatch \/ ReadmitFailed \/ AuditOk \/ AuditMismatch \/ AuditFailed)  \* OperationsReturn
    /\ WF_vars((\E i \in Slots : EngineFinish(i)))  \* EngineFinishes
    /\ WF_vars(AbandonUpdate)  \* Controller_abandon_update
    /\ WF_vars(BootstrapBegin)  \* Controller_bootstrap_begin
    /\ WF_vars(CancelUpdate)  \* Controller_cancel_update
    /\ WF_vars(GiveUp)  \* Controller_give_up
    /\ WF_vars(Invalidated)  \* Controller_invalidated
    /\ WF_vars(MutateBegin)  \* Controller_mutate_begin
    /\ WF_vars(PauseAbortBegin)  \* Controller_pause_abort_begin
    /\ WF_vars(PauseBegin)  \* Controller_pause_begin
    /\ WF_vars(ProbeBegin)  \* Controller_probe_begin
    /\ WF_vars(Publish)  \* Controller_publish
    /\ WF_vars((\E i \in Slots : ReleaseAborted(i)))  \* Controller_release_aborted
    /\ WF_vars(Reopen)  \* Controller_reopen
    /\ WF_vars((\E t \in Tiers : ResetBegin(t)))  \* Controller_reset_begin
    /\ WF_vars(ResumeBegin)  \* Controller_resume_begin
    /\ WF_vars(ValidateBegin)  \* Controller_validate_begin
    /\ SF_vars(FenceBegin)  \* Controller_fence_begin

\* ---- invariants
\* Every rollout, from admission to release, sees exactly the weights of the generation it was admitted under (on an engine not replaced out of band since it was last verified: a replacement is found by the next audit, which releases the rollouts bound to it as aborted); every engine request runs to its end on the weights it started on.
OneRolloutOnePolicy ==
    \A i \in Slots : (bind[i] # 0 /\ ~replaced => weights = bind[i]) /\ (req[i] # 0 => weights = req[i])

\* Every binding names the committed generation.
BindingsUnderCommitted ==
    \A i \in Slots : bind[i] \in {0, committed}

\* Rollouts are bound only in READY and while DRAINING them.
BindingsOnlyWhileOpen ==
    (\E i \in Slots : bind[i] # 0) => phase \in {"READY", "DRAINING"}

\* After an ambiguous outcome of a mutating step the controller is TAINTED: nothing is admitted or published.
AmbiguityLatchesTainted ==
    amb => phase = "TAINTED"

\* In READY the engine runs, reports the committed label and holds exactly the committed generation's weights, unless its process was replaced out of band since it was last verified (nobody can know before the next audit).
ReadyEngineServesCommitted ==
    (phase = "READY" /\ ~replaced) => (weights = committed /\ label = committed /\ ~paused)

\* In READY no cache tier holds an entry computed under another generation (on an engine not replaced since it was last verified).
ReadyCachesCoherent ==
    (phase = "READY" /\ ~replaced) => \A t \in Tiers : caches[t] \subseteq {committed}

\* No request ever reads a cache entry computed under other weights than its own.
NoStaleCacheUse ==
    ~stale

\* From QUIESCED to VALIDATING the engine is paused (unless its process was replaced out of band: a fresh process runs), runs no request and no rollout is bound: mutation happens only when quiesced.
EngineQuietWhileClosed ==
    phase \in QuietPhases => ((paused \/ replaced) /\ \A i \in Slots : bind[i] = 0 /\ req[i] = 0)

\* A tier counted as cleared holds no entry of other weights than the engine's.
ResetCountsOnlyWhenVerified ==
    \A t \in cleared : caches[t] \subseteq {weights}

\* Outside TAINTED, evidence held by the controller is true of the engine: label, weights (up to what the digest can see) and run state are those of the generation the controller believes in; a passed probe means they compute as it. It speaks of the engine it was gathered on: a process replaced out of band since is unknown until the next audit.
EvidenceIsTrue ==
    (phase # "TAINTED" /\ ~replaced) =>
    LET b == IF phase \in PostMutationPhases /\ target # 0 THEN target ELSE committed
    IN /\ ("version" \in evidence => label = b)
       /\ ("identity" \in evidence => weights \in {b, BROKEN})
       /\ ("probe" \in evidence => weights = b)
       /\ ("resumed" \in evidence => ~paused)

\* In READY the controller holds every piece of evidence, or none: an audit failed, the engine was suspected unreachable, or the controller restarted during an audit, and admissions and updates wait until an audit passes.
PublishedWasVerified ==
    phase = "READY" => evidence \in {AllEvidence, {}}

\* The target is none or the generation after the committed one; none while uninitialised or READY.
TargetIsNext ==
    target \in {0, committed + 1} /\ (phase \in {"UNINITIALIZED", "READY"} => target = 0)

\* A fenced TAINTED engine is paused, runs no request and reports the taint label: nobody calling it directly is served by, or misled about, unpublished weights (until someone replaces its process out of band: a fresh process is no longer fenced, and serves again only after verified re-admission).
FencedTaintServesNothing ==
    (phase = "TAINTED" /\ "fenced" \in evidence /\ ~replaced) => (paused /\ label = TAINT /\ \A i \in Slots : req[i] = 0)

\* ---- action properties
\* The committed generation never goes back and moves one step at a time.
GenerationsMoveForward ==
    [][committed' \in {committed, committed + 1}]_vars

\* Once TAINTED, the controller stays TAINTED (no admission, no publish) unless an explicit, verified re-admission onto the committed generation succeeds.
TaintedIsAbsorbing ==
    [][phase = "TAINTED" =>
            /\ committed' = committed /\ bind' = bind
            /\ (phase' = "TAINTED" \/ pending = "readmit")]_vars

\* A rollout is never admitted on an engine seen unreachable (a failed audit, a suspicion) and not verified since (a passed audit or re-admission).
NoAdmissionInDoubt ==
    [][(\E i \in Slots : bind[i] = 0 /\ bind'[i] # 0) => ~doubt]_vars

\* A rollout is admitted only in READY.
AdmissionOnlyInReady ==
    [][(\E i \in Slots : bind[i] = 0 /\ bind'[i] # 0) => phase = "READY" ]_vars

\* History: a rollout is released under the generation it was admitted under; its binding never changes while it is held.
BindingsKeepTheirGeneration ==
    [][\A i \in Slots : (bind[i] # 0 /\ bind'[i] # 0) => bind'[i] = bind[i]]_vars

\* History: a mutation begins only with no rollout bound, and nothing is admitted while it is in flight.
NoRolloutCrossesMutation ==
    [][(pending' = "mutate" /\ pending # "mutate") => \A i \in Slots : bind[i] = 0]_vars

\* The engine's weights change only in UPDATING, paused, with nothing running or bound (or by a re-admission, whose abort-mode pause ends every request first), unless its process is, or was since it was last verified, replaced out of band.
WeightsChangeOnlyWhenQuiesced ==
    [][weights' # weights =>
            \/ /\ phase = "UPDATING"
               /\ paused
               /\ \A i \in Slots : bind[i] = 0 /\ req[i] = 0
            \/ /\ pending' = "readmit"
               /\ paused'
               /\ \A i \in Slots : bind[i] = 0 /\ req'[i] = 0
            \/ replaced']_vars

\* History: a new generation is published only from RESUMING with every piece of evidence, every cache tier verified clean since the mutation, and no rollout bound.
PublishOnlyVerified ==
    [][(committed' # committed /\ phase # "UNINITIALIZED") =>
            /\ phase = "RESUMING"
            /\ evidence = AllEvidence
            /\ cleared = Tiers
            /\ \A i \in Slots : bind[i] = 0]_vars

\* Evidence about the weights is gathered only while admissions are closed and no rollout is bound (re-confirming that the engine runs is allowed while draining), or by an audit of a READY engine, which reads all of it anew.
EvidenceOnlyWhileClosed ==
    [][(evidence' \ evidence) \ {"resumed"} # {} =>
            \/ /\ phase \notin {"READY", "DRAINING"}
               /\ \A i \in Slots : bind[i] = 0
            \/ /\ phase = "READY" /\ pending = "audit"
               /\ evidence' = AllEvidence]_vars

\* ---- liveness (under FairSpec's fairness)
\* Every update requested ends: published (READY with no target) or TAINTED (fenced, to be re-admitted), whatever the clients do with their rollouts.
UpdateEnds ==
    (target # 0 /\ phase # "TAINTED") ~> ((phase = "READY" /\ target = 0) \/ phase = "TAINTED")

\* A TAINTED engine is fenced (its fence confirmed) unless it leaves TAINTED first (re-admitted): failing closed ends in a fence, not in a wait.
TaintedIsFenced ==
    (phase = "TAINTED" /\ "fenced" \notin evidence) ~> (phase # "TAINTED" \/ "fenced" \in evidence)

\* A TAINTED engine that is healthy and re-admitted serves again: once its reload holds the committed generation (weights and label) and nothing fails any more (the fault budget spent), the re-admission ends READY with every piece of evidence, whatever the clients do.
ReadmitServes ==
    (pending = "readmit" /\ weights = committed /\ label = committed /\ faults = MaxFaults) ~> (phase = "READY")

==============================================================================
