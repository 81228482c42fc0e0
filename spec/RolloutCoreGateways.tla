---------------------------- MODULE RolloutCoreGateways ----------------------------
\* Generated from spec/gateways.py by `rolloutcore spec tla`.
\* Do not edit: change the Python spec and regenerate.
EXTENDS Integers, FiniteSets

CONSTANTS NumGateways, NumMembers, MaxGen, MaxCuts

VARIABLES mem, gw, cuts
vars == <<mem, gw, cuts>>

Gateways == 1..NumGateways
Members == 1..NumMembers

Init ==
    /\ mem = [m \in Members |-> [phase |-> "serve", gen |-> 1]]
    /\ gw = [x \in Gateways |-> [open |-> [m \in Members |-> TRUE],
                                 ack |-> [m \in Members |-> FALSE],
                                 infl |-> [m \in Members |-> 0],
                                 cut |-> FALSE, expired |-> FALSE]]
    /\ cuts = 0

\* Member m may mutate as far as gateway x goes (spec/gateways.py released).
Released(x, m) == gw[x].ack[m] \/ gw[x].expired

\* admit: Gateway g admits a rollout on member m, open in its view, and forwards it stamped with its epoch; the engine takes it unless that epoch's lease ended.
Admit(g, m) ==
    /\ gw[g].open[m] /\ gw[g].infl[m] = 0 /\ ~gw[g].expired
    /\ gw' = [gw EXCEPT ![g].infl[m] = mem[m].gen]
    /\ UNCHANGED <<mem, cuts>>

\* finish: A rollout gateway g admitted on member m ends (its answer, or the client gone).
Finish(g, m) ==
    /\ gw[g].infl[m] # 0 /\ gw' = [gw EXCEPT ![g].infl[m] = 0]
    /\ UNCHANGED <<mem, cuts>>

\* close_begin: The controller starts closing a serving member for its update (while another serves): every acknowledgement is still to come.
CloseBegin(m) ==
    /\ mem[m].phase = "serve" /\ mem[m].gen < MaxGen
    /\ \E k \in Members \ {m} : mem[k].phase = "serve"
    /\ mem' = [mem EXCEPT ![m].phase = "closing"]
    /\ gw' = [x \in Gateways |-> [gw[x] EXCEPT !.ack[m] = FALSE]]
    /\ UNCHANGED <<cuts>>

\* close_seen: A gateway the controller reaches closes the member in its view: it admits no more rollouts there.
CloseSeen(g, m) ==
    /\ mem[m].phase = "closing" /\ gw[g].open[m] /\ ~gw[g].cut
    /\ gw' = [gw EXCEPT ![g].open[m] = FALSE]
    /\ UNCHANGED <<mem, cuts>>

\* ack: A gateway that closed the member, its own rollouts there ended, acknowledges the close (journalled with its journal position).
Ack(g, m) ==
    /\ mem[m].phase = "closing" /\ ~gw[g].open[m] /\ gw[g].infl[m] = 0
    /\ ~gw[g].ack[m] /\ ~gw[g].cut
    /\ gw' = [gw EXCEPT ![g].ack[m] = TRUE]
    /\ UNCHANGED <<mem, cuts>>

\* partition: The controller loses a gateway (a partition, a crash): the gateway may go on admitting on its last view.
Partition(g) ==
    /\ ~gw[g].cut /\ cuts < MaxCuts
    /\ gw' = [gw EXCEPT ![g].cut = TRUE] /\ cuts' = cuts + 1
    /\ UNCHANGED <<mem>>

\* lease_expire: An unreachable gateway's lease ends: from now on every engine refuses requests stamped with its epoch.
LeaseExpire(g) ==
    /\ gw[g].cut /\ ~gw[g].expired /\ gw' = [gw EXCEPT ![g].expired = TRUE]
    /\ UNCHANGED <<mem, cuts>>

\* mutate: Every gateway acknowledged the close or its lease ended: the member mutates; its abort-mode pause ends the rollouts expired gateways still had there.
Mutate(m) ==
    /\ mem[m].phase = "closing" /\ \A x \in Gateways : Released(x, m)
    /\ mem' = [mem EXCEPT ![m].phase = "mutating"]
    /\ gw' = [x \in Gateways |-> IF gw[x].expired THEN [gw[x] EXCEPT !.infl[m] = 0] ELSE gw[x]]
    /\ UNCHANGED <<cuts>>

\* publish: The member's verified update ends: it serves its next generation.
Publish(m) ==
    /\ mem[m].phase = "mutating"
    /\ mem' = [mem EXCEPT ![m] = [phase |-> "serve", gen |-> mem[m].gen + 1]]
    /\ UNCHANGED <<gw, cuts>>

\* reopen: A gateway the controller reaches opens a serving member again in its view.
Reopen(g, m) ==
    /\ mem[m].phase = "serve" /\ ~gw[g].open[m] /\ ~gw[g].cut
    /\ gw' = [gw EXCEPT ![g].open[m] = TRUE]
    /\ UNCHANGED <<mem, cuts>>

Next ==
    \/ \E g \in Gateways : \E m \in Members : Admit(g, m)
    \/ \E g \in Gateways : \E m \in Members : Finish(g, m)
    \/ \E m \in Members : CloseBegin(m)
    \/ \E g \in Gateways : \E m \in Members : CloseSeen(g, m)
    \/ \E g \in Gateways : \E m \in Members : Ack(g, m)
    \/ \E g \in Gateways : Partition(g)
    \/ \E g \in Gateways : LeaseExpire(g)
    \/ \E m \in Members : Mutate(m)
    \/ \E m \in Members : Publish(m)
    \/ \E g \in Gateways : \E m \in Members : Reopen(g, m)

Spec == Init /\ [][Next]_vars

\* ---- invariants
\* A rollout any gateway admitted runs on the generation its member served when it was admitted, and never on a mutating member, across all gateways.
NoRolloutCrossesMutation ==
    \A x \in Gateways, m \in Members : gw[x].infl[m] # 0 =>
        (gw[x].infl[m] = mem[m].gen /\ mem[m].phase # "mutating")

\* A gateway's acknowledgement of a member's close that is not yet over means it admits nothing there and has nothing in flight there.
AckMeansDrained ==
    \A x \in Gateways, m \in Members : (gw[x].ack[m] /\ mem[m].phase # "serve") =>
        (~gw[x].open[m] /\ gw[x].infl[m] = 0)

==============================================================================
