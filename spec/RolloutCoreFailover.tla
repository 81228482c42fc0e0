---------------------------- MODULE RolloutCoreFailover ----------------------------
\* Generated from spec/failover.py by `rolloutcore spec tla`.
\* Do not edit: change the Python spec and regenerate.
EXTENDS Integers, FiniteSets

CONSTANTS NumCtl, NumEngines, MaxEpoch, MaxGen

Ctls == 1..NumCtl
Engines == 1..NumEngines
Msgs == {"mutate", "pause", "resume", "relabel"} \X (1..MaxEpoch) \X Engines \X (0..MaxGen)

VARIABLES leader, lepoch, issued, ctl, jrn, eng, bound, net
vars == <<leader, lepoch, issued, ctl, jrn, eng, bound, net>>

Standby == [pc |-> "standby", epoch |-> 0, frozen |-> FALSE, zombie |-> FALSE,
            view |-> [x \in Engines |-> "none"], on |-> 0]

Init ==
    /\ leader = 0 /\ lepoch = 0 /\ issued = 0
    /\ ctl = [c \in Ctls |-> Standby]
    /\ jrn = [epoch |-> 0, committed |-> [x \in Engines |-> 1],
              target |-> [x \in Engines |-> 0], serve |-> [x \in Engines |-> 0]]
    /\ eng = [x \in Engines |-> [weights |-> 1, label |-> 1, paused |-> FALSE, seen |-> 0, by |-> 0]]
    /\ bound = [x \in Engines |-> 0]
    /\ net = {}

\* The engine-side gate of a fenced effect (spec/failover.py accepts()).
Accepts(epoch, seen) == epoch >= seen
Leads(c) == leader = c /\ lepoch = ctl[c].epoch
Acting(c) == ctl[c].pc = "lead" /\ ~ctl[c].frozen
SetView(c, e, v) == [ctl EXCEPT ![c].view[e] = v]
Await(c, e) == [ctl EXCEPT ![c].pc = "await", ![c].on = e]
Append(c, j) == [j EXCEPT !.epoch = ctl[c].epoch]
Matches(e) == eng[e].weights = jrn.committed[e] /\ eng[e].label = jrn.committed[e]
\* Effect m landing on its engine.
Land(m) ==
    LET e == m[3] IN
    CASE m[1] = "mutate" -> IF Accepts(m[2], eng[e].seen)
                           THEN [eng EXCEPT ![e].weights = m[4], ![e].seen = m[2], ![e].by = m[2]]
                           ELSE eng
      [] m[1] = "pause" -> [eng EXCEPT ![e].paused = TRUE]
      [] m[1] = "resume" -> [eng EXCEPT ![e].paused = FALSE]
      [] m[1] = "relabel" -> [eng EXCEPT ![e].label = m[4]]

\* campaign: A standby controller finds no live leader key and creates it in a transaction with its lease: it leads with a fresh epoch, and must fence every engine first.
Campaign(c) ==
    /\ ctl[c].pc = "standby" /\ leader = 0 /\ issued < MaxEpoch
    /\ leader' = c /\ lepoch' = issued + 1 /\ issued' = issued + 1
    /\ ctl' = [ctl EXCEPT ![c] = [pc |-> "lead", epoch |-> issued + 1, frozen |-> FALSE,
                zombie |-> FALSE, view |-> [x \in Engines |-> "fence"], on |-> 0]]
    /\ UNCHANGED <<jrn, eng, bound, net>>

\* fence: The leader raises an engine's fence to its epoch (accepted: the engine's fence was not above it); from then on the engine refuses every fenced effect from an older epoch.
Fence(c, e) ==
    /\ Acting(c) /\ ctl[c].view[e] = "fence" /\ Accepts(ctl[c].epoch, eng[e].seen)
    /\ eng' = [eng EXCEPT ![e].seen = ctl[c].epoch]
    /\ ctl' = SetView(c, e, "check")
    /\ UNCHANGED <<leader, lepoch, issued, jrn, bound, net>>

\* fence_refused: The engine's fence is above the controller's epoch: a newer leader fenced it, so this controller is deposed and stands down.
FenceRefused(c, e) ==
    /\ Acting(c) /\ ctl[c].view[e] = "fence" /\ ~Accepts(ctl[c].epoch, eng[e].seen)
    /\ ctl' = [ctl EXCEPT ![c] = Standby]
    /\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>

\* verify: A fenced engine with no update in progress in the journal and the committed weights (the single-engine restart to READY): relabel if its label differs, then resume.
Verify(c, e) ==
    /\ Acting(c) /\ ctl[c].view[e] = "check" /\ jrn.target[e] = 0
    /\ eng[e].weights = jrn.committed[e]
    /\ ctl' = SetView(c, e, IF Matches(e) THEN "resume" ELSE "relabel")
    /\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>

\* readmit: A fenced engine in doubt (an update in progress in the journal) that holds the committed weights (the restart to TAINTED, then verified re-admission without a mutation): the journal ends the update; relabel if needed, then resume.
Readmit(c, e) ==
    /\ Leads(c)
    /\ Acting(c) /\ ctl[c].view[e] = "check" /\ jrn.target[e] # 0
    /\ eng[e].weights = jrn.committed[e]
    /\ jrn' = Append(c, [jrn EXCEPT !.target[e] = 0])
    /\ ctl' = SetView(c, e, IF Matches(e) THEN "resume" ELSE "relabel")
    /\ UNCHANGED <<leader, lepoch, issued, eng, bound, net>>

\* repair: A fenced engine that holds other weights than committed (the restart to TAINTED, then re-admission by a mutation): the journal names the committed generation as its target and the engine is re-installed by the fenced path.
Repair(c, e) ==
    /\ Leads(c)
    /\ Acting(c) /\ ctl[c].view[e] = "check" /\ eng[e].weights # jrn.committed[e]
    /\ jrn' = Append(c, [jrn EXCEPT !.target[e] = jrn.committed[e]])
    /\ ctl' = SetView(c, e, "pause")
    /\ UNCHANGED <<leader, lepoch, issued, eng, bound, net>>

\* relabel: The leader sets the engine's label to the committed generation (vLLM's route: no epoch).
Relabel(c, e, d) ==
    /\ Acting(c) /\ ctl[c].view[e] = "relabel"
    /\ IF d THEN /\ eng' = [eng EXCEPT ![e].label = jrn.committed[e]]
                /\ ctl' = SetView(c, e, "resume")
                /\ UNCHANGED <<net>>
           ELSE /\ net' = net \cup {<<"relabel", ctl[c].epoch, e, jrn.committed[e]>>}
                /\ ctl' = Await(c, e)
                /\ UNCHANGED <<eng>>
    /\ UNCHANGED <<leader, lepoch, issued, jrn, bound>>

\* resume: The leader resumes the engine (vLLM's route: no epoch).
Resume(c, e, d) ==
    /\ Acting(c) /\ ctl[c].view[e] = "resume"
    /\ IF d THEN /\ eng' = [eng EXCEPT ![e].paused = FALSE]
                /\ ctl' = SetView(c, e, "ready")
                /\ UNCHANGED <<net>>
           ELSE /\ net' = net \cup {<<"resume", ctl[c].epoch, e, 0>>}
                /\ ctl' = Await(c, e)
                /\ UNCHANGED <<eng>>
    /\ UNCHANGED <<leader, lepoch, issued, jrn, bound>>

\* ready: The journal records the engine as serving, verified by this epoch's leader.
Ready(c, e) ==
    /\ Leads(c)
    /\ Acting(c) /\ ctl[c].view[e] = "ready"
    /\ jrn' = Append(c, [jrn EXCEPT !.serve[e] = ctl[c].epoch])
    /\ ctl' = SetView(c, e, "serving")
    /\ UNCHANGED <<leader, lepoch, issued, eng, bound, net>>

\* admit: A rollout is admitted on an engine the leader itself verified serving (an append: a deposed controller admits nothing), bound to the committed generation.
Admit(c, e) ==
    /\ Leads(c)
    /\ Acting(c) /\ ctl[c].view[e] = "serving" /\ bound[e] = 0
    /\ jrn.serve[e] = ctl[c].epoch
    /\ jrn' = Append(c, jrn)
    /\ bound' = [bound EXCEPT ![e] = jrn.committed[e]]
    /\ UNCHANGED <<leader, lepoch, issued, ctl, eng, net>>

\* release: A rollout ends (whoever admitted it).
Release(e) ==
    /\ bound[e] # 0
    /\ bound' = [bound EXCEPT ![e] = 0]
    /\ UNCHANGED <<leader, lepoch, issued, ctl, jrn, eng, net>>

\* audit: The leader reads a serving engine again and finds other weights or another label than committed: it closes it (an append) and checks it anew.
Audit(c, e) ==
    /\ Leads(c)
    /\ Acting(c) /\ ctl[c].view[e] = "serving" /\ ~Matches(e)
    /\ jrn' = Append(c, [jrn EXCEPT !.serve[e] = 0])
    /\ ctl' = SetView(c, e, "check")
    /\ UNCHANGED <<leader, lepoch, issued, eng, bound, net>>

\* request: The leader starts an update of a serving engine: admissions close on it and the journal names the next generation as its target.
Request(c, e) ==
    /\ Leads(c)
    /\ Acting(c) /\ ctl[c].view[e] = "serving" /\ jrn.committed[e] < MaxGen
    /\ jrn' = Append(c, [jrn EXCEPT !.serve[e] = 0, !.target[e] = jrn.committed[e] + 1])
    /\ ctl' = SetView(c, e, "drain")
    /\ UNCHANGED <<leader, lepoch, issued, eng, bound, net>>

\* drained: No rollout is bound on the engine any more.
Drained(c, e) ==
    /\ Acting(c) /\ ctl[c].view[e] = "drain" /\ bound[e] = 0
    /\ ctl' = SetView(c, e, "pause")
    /\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>

\* pause: The leader pauses the engine (vLLM's route: no epoch).
Pause(c, e, d) ==
    /\ Acting(c) /\ ctl[c].view[e] = "pause"
    /\ IF d THEN /\ eng' = [eng EXCEPT ![e].paused = TRUE]
                /\ ctl' = SetView(c, e, "mutate")
                /\ UNCHANGED <<net>>
           ELSE /\ net' = net \cup {<<"pause", ctl[c].epoch, e, 0>>}
                /\ ctl' = Await(c, e)
                /\ UNCHANGED <<eng>>
    /\ UNCHANGED <<leader, lepoch, issued, jrn, bound>>

\* mutate: The leader installs the journal's target through the fenced path, with its epoch: it lands now (accepted if the engine's fence allows it; refused: this controller is deposed) or stays on the wire while the sender waits.
Mutate(c, e, d) ==
    /\ Acting(c) /\ ctl[c].view[e] = "mutate" /\ jrn.target[e] # 0
    /\ LET m == <<"mutate", ctl[c].epoch, e, jrn.target[e]>> IN
       IF ~d THEN /\ net' = net \cup {m}
                  /\ ctl' = Await(c, e)
                  /\ UNCHANGED <<eng>>
       ELSE IF Accepts(ctl[c].epoch, eng[e].seen)
            THEN /\ eng' = Land(m)
                 /\ ctl' = SetView(c, e, "validate")
                 /\ UNCHANGED <<net>>
            ELSE /\ ctl' = [ctl EXCEPT ![c] = Standby]
                 /\ UNCHANGED <<eng, net>>
    /\ UNCHANGED <<leader, lepoch, issued, jrn, bound>>

\* validate: The engine holds the target's weights: the journal commits the target.
Validate(c, e) ==
    /\ Leads(c)
    /\ Acting(c) /\ ctl[c].view[e] = "validate" /\ jrn.target[e] # 0
    /\ eng[e].weights = jrn.target[e]
    /\ jrn' = Append(c, [jrn EXCEPT !.committed[e] = jrn.target[e], !.target[e] = 0])
    /\ ctl' = SetView(c, e, "relabel")
    /\ UNCHANGED <<leader, lepoch, issued, eng, bound, net>>

\* reply: The effect a controller waits for has left the wire (landed or refused); it cannot tell which, so it checks the engine again.
Reply(c) ==
    /\ ctl[c].pc = "await" /\ ~ctl[c].frozen
    /\ \A m \in net : m[2] # ctl[c].epoch \/ m[3] # ctl[c].on
    /\ ctl' = [ctl EXCEPT ![c].pc = "lead", ![c].on = 0, ![c].view[ctl[c].on] = "check"]
    /\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>

\* deliver: An effect on the wire lands on its engine, at any later time and in any order (a fenced one only if its epoch is at least the engine's fence).
Deliver(m) ==
    /\ m \in net
    /\ eng' = Land(m)
    /\ net' = net \ {m}
    /\ UNCHANGED <<leader, lepoch, issued, ctl, jrn, bound>>

\* freeze: A controller stops in the middle of whatever it was doing (a GC pause, SIGSTOP, a partition).
Freeze(c) ==
    /\ ctl[c].pc # "standby" /\ ~ctl[c].frozen
    /\ ctl' = [ctl EXCEPT ![c].frozen = TRUE]
    /\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>

\* thaw: A frozen controller goes on with the step it was in; if its leader key expired meanwhile it is a zombie (it does not know yet).
Thaw(c) ==
    /\ ctl[c].frozen
    /\ ctl' = [ctl EXCEPT ![c].frozen = FALSE, ![c].zombie = ~Leads(c)]
    /\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>

\* expire: The leader key's lease expires: its holder stopped renewing it (crashed, stood down, or frozen past the lease).
Expire ==
    /\ leader # 0 /\ (ctl[leader].frozen \/ ctl[leader].pc = "standby")
    /\ leader' = 0 /\ lepoch' = 0
    /\ UNCHANGED <<issued, ctl, jrn, eng, bound, net>>

\* crash: A controller process dies (kill -9) and is restarted as a standby; its effects on the wire may still land, and its key lives until its lease expires.
Crash(c) ==
    /\ ctl[c].pc # "standby"
    /\ ctl' = [ctl EXCEPT ![c] = Standby]
    /\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>

\* deposed: A controller that no longer holds the leader key of its epoch finds out (an append refused by the compare, or its own lease clock) and stands down.
Deposed(c) ==
    /\ Acting(c) /\ ~Leads(c)
    /\ ctl' = [ctl EXCEPT ![c] = Standby]
    /\ UNCHANGED <<leader, lepoch, issued, jrn, eng, bound, net>>

Next ==
    \/ \E c \in Ctls : Campaign(c)
    \/ \E c \in Ctls : \E e \in Engines : Fence(c, e)
    \/ \E c \in Ctls : \E e \in Engines : FenceRefused(c, e)
    \/ \E c \in Ctls : \E e \in Engines : Verify(c, e)
    \/ \E c \in Ctls : \E e \in Engines : Readmit(c, e)
    \/ \E c \in Ctls : \E e \in Engines : Repair(c, e)
    \/ \E c \in Ctls : \E e \in Engines : \E d \in BOOLEAN : Relabel(c, e, d)
    \/ \E c \in Ctls : \E e \in Engines : \E d \in BOOLEAN : Resume(c, e, d)
    \/ \E c \in Ctls : \E e \in Engines : Ready(c, e)
    \/ \E c \in Ctls : \E e \in Engines : Admit(c, e)
    \/ \E e \in Engines : Release(e)
    \/ \E c \in Ctls : \E e \in Engines : Audit(c, e)
    \/ \E c \in Ctls : \E e \in Engines : Request(c, e)
    \/ \E c \in Ctls : \E e \in Engines : Drained(c, e)
    \/ \E c \in Ctls : \E e \in Engines : \E d \in BOOLEAN : Pause(c, e, d)
    \/ \E c \in Ctls : \E e \in Engines : \E d \in BOOLEAN : Mutate(c, e, d)
    \/ \E c \in Ctls : \E e \in Engines : Validate(c, e)
    \/ \E c \in Ctls : Reply(c)
    \/ \E m \in Msgs : Deliver(m)
    \/ \E c \in Ctls : Freeze(c)
    \/ \E c \in Ctls : Thaw(c)
    \/ Expire
    \/ \E c \in Ctls : Crash(c)
    \/ \E c \in Ctls : Deposed(c)

Spec == Init /\ [][Next]_vars

\* The spec with its fairness assumptions (liveness is checked under it).
FairSpec == Spec
    /\ WF_vars(Expire)  \* LeasesExpire
    /\ \A ep \in 1..MaxEpoch : SF_vars(\E m \in net : m[2] = ep /\ Deliver(m))  \* EffectsLand
    /\ \A c \in Ctls :
        /\ SF_vars(Campaign(c) \/ (\E e \in Engines : Fence(c, e)) \/ (\E e \in Engines : FenceRefused(c, e)) \/ (\E e \in Engines : Verify(c, e)) \/ (\E e \in Engines : Readmit(c, e)) \/ (\E e \in Engines : Repair(c, e)) \/ (\E e \in Engines : \E d \in BOOLEAN : Relabel(c, e, d)) \/ (\E e \in Engines : \E d \in BOOLEAN : Resume(c, e, d)) \/ (\E e \in Engines : Ready(c, e)) \/ (\E e \in Engines : Drained(c, e)) \/ (\E e \in Engines : \E d \in BOOLEAN : Pause(c, e, d)) \/ (\E e \in Engines : \E d \in BOOLEAN : Mutate(c, e, d)) \/ (\E e \in Engines : Validate(c, e)) \/ Reply(c))  \* ControllerMoves
        /\ SF_vars(Deposed(c))  \* LeaseClockRunsOut
        /\ WF_vars(Thaw(c))  \* PausesEnd

\* ---- invariants
\* A rollout bound on an engine runs on the weights it was admitted under, whoever leads and whatever a deposed controller sent.
NoRolloutCrossesMutation ==
    \A e \in Engines : bound[e] # 0 => eng[e].weights = bound[e]

\* An engine the journal records as serving holds the weights the journal committed for it.
ServingHoldsCommitted ==
    \A e \in Engines : jrn.serve[e] # 0 => eng[e].weights = jrn.committed[e]

\* A controller that acts and is neither frozen nor a zombie holds the live leader key of its epoch (at most one such controller: the lease's promise, which rests on its timing; nothing else here does).
LeaseHeldWhileActing ==
    \A c \in Ctls : (ctl[c].pc # "standby" /\ ~ctl[c].frozen /\ ~ctl[c].zombie) => Leads(c)

\* ---- action properties
\* Every append is made by the holder of the live leader key, stamped with its epoch, and epochs never go back: one writer per epoch, one history, no fork.
JournalOneWriterPerEpoch ==
    [][jrn' # jrn => (leader # 0 /\ jrn'.epoch = lepoch /\ jrn'.epoch >= jrn.epoch)]_vars

\* A fenced effect (a mutation) lands on an engine only from an epoch at least the engine's fence: nothing from a deposed epoch changes an engine a newer epoch fenced.
NoDeposedEffectLands ==
    [][\A e \in Engines : eng'[e].by # eng[e].by \/ eng'[e].weights # eng[e].weights
        => eng'[e].by >= eng[e].seen]_vars

\* An engine's fence never goes down.
FencesOnlyRise ==
    [][\A e \in Engines : eng'[e].seen >= eng[e].seen]_vars

\* ---- liveness (under FairSpec)
\* A leader key whose holder crashed or froze is freed (its lease expires) unless the holder comes back first: a dead leader does not hold the fleet for ever.
KeyFreedWhenHolderStops ==
    (leader # 0 /\ (ctl[leader].pc = "standby" \/ ctl[leader].frozen)) ~> (leader = 0 \/ (ctl[leader].pc # "standby" /\ ~ctl[leader].frozen))

\* With no leader key, a standby up and an election left in the bound, a leader is elected.
LeaderElected ==
    (leader = 0 /\ issued < MaxEpoch /\ \E c \in Ctls : ctl[c].pc = "standby") ~> (leader # 0)

\* A controller that no longer holds the leader key of its epoch stands down (its appends are refused, its fenced effects too; then it stops sending).
DeposedStandsDown ==
    \A c \in Ctls : ((ctl[c].pc # "standby" /\ ~Leads(c))) ~> (ctl[c].pc = "standby")

==============================================================================
