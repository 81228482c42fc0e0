---------------------------- MODULE RolloutCoreStaged ----------------------------
\* Generated from spec/staged.py by `rolloutcore spec tla`.
\* Do not edit: change the Python spec and regenerate.
EXTENDS Integers

CONSTANTS NumRanks, MaxGen, MaxFaults

VARIABLES phase, committed, target, served, buf, prep, inst, faults
vars == <<phase, committed, target, served, buf, prep, inst, faults>>

Ranks == 1..NumRanks
Kinds == {"exact", "other", "corrupt", "partial"}
\* What a receive of kind k leaves in a buffer (spec/staged.py _received).
Received(k) == CASE k = "exact" -> target [] k = "other" -> -4 [] k = "corrupt" -> -2 [] k = "partial" -> -3

Init ==
    /\ phase = "serving" /\ committed = 1 /\ target = 0 /\ faults = 0
    /\ served = [r \in Ranks |-> 1] /\ buf = [r \in Ranks |-> 0]
    /\ prep = [r \in Ranks |-> FALSE] /\ inst = [r \in Ranks |-> FALSE]

\* stage_begin: The trainer starts the next generation's staging while the engine serves: every rank's buffer empty.
StageBegin ==
    /\ phase = "serving" /\ committed < MaxGen
    /\ phase' = "staging" /\ target' = committed + 1
    /\ buf' = [r \in Ranks |-> 0] /\ prep' = [r \in Ranks |-> FALSE]
    /\ inst' = [r \in Ranks |-> FALSE]
    /\ UNCHANGED <<committed, served, faults>>

\* receive: A rank's shard arrives in its staging buffer, digested as it arrives: the target's exact bytes, another generation's, a corrupt chunk, or cut short.
Receive(r, k) ==
    /\ phase = "staging" /\ buf[r] = 0
    /\ buf' = [buf EXCEPT ![r] = Received(k)]
    /\ UNCHANGED <<phase, committed, target, served, prep, inst, faults>>

\* prepare: A rank reports prepared: its buffer's manifest equals the trainer's for the target (names, shapes, dtypes, digests), its evidence.
Prepare(r) ==
    /\ phase = "staging" /\ buf[r] = target /\ ~prep[r]
    /\ prep' = [prep EXCEPT ![r] = TRUE]
    /\ UNCHANGED <<phase, committed, target, served, buf, inst, faults>>

\* stage_fail: The staging is refused (a rank's manifest differs, a sender is gone, a rank refuses, the deadline passes): buffers discarded, nothing served touched.
StageFail ==
    /\ phase = "staging" /\ phase' = "serving" /\ target' = 0
    /\ buf' = [r \in Ranks |-> 0] /\ prep' = [r \in Ranks |-> FALSE]
    /\ UNCHANGED <<committed, served, inst, faults>>

\* close: Every rank is prepared: admissions close (the engine drained) for the install.
Close ==
    /\ phase = "staging" /\ \A r \in Ranks : prep[r]
    /\ phase' = "closed"
    /\ UNCHANGED <<committed, target, served, buf, prep, inst, faults>>

\* install: A rank installs its staged buffer (load_weights from the staged tensors): done (``d``), or ambiguous (a fault: it may have half happened), which latches TAINTED with mixed weights.
Install(r, d) ==
    /\ phase = "closed" /\ ~inst[r] /\ (d \/ faults < MaxFaults)
    /\ IF d THEN /\ served' = [served EXCEPT ![r] = buf[r]]
               /\ inst' = [inst EXCEPT ![r] = TRUE]
               /\ UNCHANGED <<phase, faults>>
          ELSE /\ phase' = "tainted" /\ served' = [served EXCEPT ![r] = -1]
               /\ faults' = faults + 1 /\ UNCHANGED <<inst>>
    /\ UNCHANGED <<committed, target, buf, prep>>

\* abandon: The install is refused with proof before any rank installed (a rank's buffer was gone, the epoch fenced): admissions reopen on the committed generation, buffers discarded, nothing served changed.
Abandon ==
    /\ phase = "closed" /\ \A r \in Ranks : ~inst[r]
    /\ phase' = "serving" /\ target' = 0
    /\ buf' = [r \in Ranks |-> 0] /\ prep' = [r \in Ranks |-> FALSE]
    /\ UNCHANGED <<committed, served, inst, faults>>

\* publish: Every rank installed: the verified reset, validation and probe pass (the lifecycle spec's steps) and the target is committed; admissions reopen.
Publish ==
    /\ phase = "closed" /\ \A r \in Ranks : inst[r]
    /\ phase' = "serving" /\ committed' = target /\ target' = 0
    /\ buf' = [r \in Ranks |-> 0] /\ prep' = [r \in Ranks |-> FALSE]
    /\ inst' = [r \in Ranks |-> FALSE]
    /\ UNCHANGED <<served, faults>>

Next ==
    \/ StageBegin
    \/ \E r \in Ranks : \E k \in Kinds : Receive(r, k)
    \/ \E r \in Ranks : Prepare(r)
    \/ StageFail
    \/ Close
    \/ \E r \in Ranks : \E d \in BOOLEAN : Install(r, d)
    \/ Abandon
    \/ Publish

Spec == Init /\ [][Next]_vars

\* ---- invariants
\* While the engine serves or stages, every rank's served weights are the committed generation's: staging touches only inactive buffers, and no mixed group resumes.
ServedUntouchedOutsideInstall ==
    (phase \in {"serving", "staging"}) => \A r \in Ranks : served[r] = committed

\* A rank reported prepared holds exactly the target's bytes.
PreparedIsExact ==
    \A r \in Ranks : prep[r] => buf[r] = target

\* Admissions close for an install only once every rank is prepared.
InstallOnlyWhenAllPrepared ==
    phase = "closed" => \A r \in Ranks : prep[r]

\* A rank that installed serves exactly the target's bytes.
InstallsOnlyTheTarget ==
    \A r \in Ranks : inst[r] => served[r] = target

\* ---- action properties
\* Only an ambiguous install latches TAINTED: a staging failure never does.
TaintedOnlyByInstall ==
    [][(phase' = "tainted" /\ phase # "tainted") => phase = "closed"]_vars

\* A refused staging leaves the served weights and the committed generation as they were: a proof of no effect.
RefusedStagingChangesNothingServed ==
    [][(phase = "staging" /\ phase' = "serving") => (served' = served /\ committed' = committed)]_vars

==============================================================================
