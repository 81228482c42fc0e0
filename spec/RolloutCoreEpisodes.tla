---------------------------- MODULE RolloutCoreEpisodes ----------------------------
\* Generated from spec/episodes.py by `rolloutcore spec tla`.
\* Do not edit: change the Python spec and regenerate.
EXTENDS Integers, FiniteSets, Sequences

CONSTANTS NumMembers, NumEpisodes, MaxGen, MaxLive, MinServing, MaxTurns

VARIABLES front, floor, mem, eps
vars == <<front, floor, mem, eps>>

Members == 1..NumMembers
Episodes == 1..NumEpisodes
Policies == {"wait", "abort", "segment"}

Init ==
    /\ front = 1 /\ floor = 1
    /\ mem = [n \in Members |-> [gen |-> 1, phase |-> "serve"]]
    /\ eps = [x \in Episodes |-> [status |-> "none", policy |-> "wait", member |-> 0, gen |-> 0,
                                 seg |-> 0, tgen |-> 0, late |-> FALSE, log |-> << >>]]

Live(x) == eps[x].status \in {"idle", "turn"}
\* A member holds what its update must not cross (spec/episodes.py _holds_member).
Holds(n) == \E x \in Episodes : eps[x].member = n /\
    (eps[x].status = "turn" \/ (Live(x) /\ eps[x].policy # "segment" /\ eps[x].gen = mem[n].gen))

\* start: A client admits an episode on a serving member with the policy it chose for an update: bound to that member's generation, its first segment.
Start(e, n, p) ==
    /\ eps[e].status = "none" /\ mem[n].phase = "serve"
    /\ eps' = [eps EXCEPT ![e].status = "idle", ![e].policy = p, ![e].member = n,
                            ![e].gen = mem[n].gen, ![e].seg = 1]
    /\ UNCHANGED <<front, floor, mem>>

\* turn_begin: A turn of an idle episode (its idle deadline not passed) starts on a serving member that serves the episode's generation.
TurnBegin(e, n) ==
    /\ eps[e].status = "idle" /\ ~eps[e].late /\ Len(eps[e].log) < MaxTurns
    /\ mem[n].phase = "serve" /\ mem[n].gen = eps[e].gen
    /\ eps' = [eps EXCEPT ![e].status = "turn", ![e].member = n, ![e].tgen = mem[n].gen]
    /\ UNCHANGED <<front, floor, mem>>

\* turn_end: The turn's answer ends: the record gains it, under its segment and the generation that served it; the episode waits on its tool.
TurnEnd(e) ==
    /\ eps[e].status = "turn"
    /\ eps' = [eps EXCEPT ![e].status = "idle", ![e].tgen = 0,
                            ![e].log = Append(eps[e].log, <<eps[e].seg, eps[e].tgen>>)]
    /\ UNCHANGED <<front, floor, mem>>

\* end: Its owner ends an idle episode (with its reward): done, its record whole.
End(e) ==
    /\ eps[e].status = "idle" /\ eps' = [eps EXCEPT ![e].status = "done"]
    /\ UNCHANGED <<front, floor, mem>>

\* idle_timeout: The clock passes an idle episode's idle deadline (its tool never answered).
IdleTimeout(e) ==
    /\ eps[e].status = "idle" /\ ~eps[e].late /\ eps' = [eps EXCEPT ![e].late = TRUE]
    /\ UNCHANGED <<front, floor, mem>>

\* expire: The controller ends an episode past its idle deadline and reports it (expired: its record says so).
Expire(e) ==
    /\ eps[e].status = "idle" /\ eps[e].late /\ eps' = [eps EXCEPT ![e].status = "expired"]
    /\ UNCHANGED <<front, floor, mem>>

\* drain: A serving member is asked to update to its next generation: one within K of the floor, while min_serving others serve. It admits no new episode or turn.
Drain(n) ==
    /\ mem[n].phase = "serve" /\ mem[n].gen < MaxGen /\ mem[n].gen + 1 <= floor + MaxLive - 1
    /\ Cardinality({k \in Members \ {n} : mem[k].phase = "serve"}) >= MinServing
    /\ mem' = [mem EXCEPT ![n].phase = "drain"]
    /\ UNCHANGED <<front, floor, eps>>

\* abort_episode: A live episode whose owner chose abort, bound to a draining member's generation, is aborted whole (a turn in flight with it): reported aborted, nothing of it delivered as one policy.
AbortEpisode(e) ==
    /\ eps[e].status \in {"idle", "turn"} /\ eps[e].policy = "abort"
    /\ mem[eps[e].member].phase = "drain" /\ mem[eps[e].member].gen = eps[e].gen
    /\ eps' = [eps EXCEPT ![e].status = "aborted", ![e].tgen = 0]
    /\ UNCHANGED <<front, floor, mem>>

\* cancel_drain: The drain's deadline passes (an episode waited for outlasts it): the member serves its generation again.
CancelDrain(n) ==
    /\ mem[n].phase = "drain" /\ mem' = [mem EXCEPT ![n].phase = "serve"]
    /\ UNCHANGED <<front, floor, eps>>

\* mutate: A drained member mutates: no turn in flight on it, no live episode bound to its generation that waits or aborts (only segmenting ones stay, idle).
Mutate(n) ==
    /\ mem[n].phase = "drain" /\ ~Holds(n)
    /\ mem' = [mem EXCEPT ![n].phase = "mutate"]
    /\ UNCHANGED <<front, floor, eps>>

\* publish: The member's verified update ends: it serves its next generation (the frontier moves if it led).
Publish(n) ==
    /\ mem[n].phase = "mutate"
    /\ mem' = [mem EXCEPT ![n].phase = "serve", ![n].gen = mem[n].gen + 1]
    /\ front' = IF mem[n].gen + 1 > front THEN mem[n].gen + 1 ELSE front
    /\ UNCHANGED <<floor, eps>>

\* segment: An idle episode whose owner chose segment, whose member now serves a newer generation, continues under it as a new segment: the boundary journalled, the trainer told.
Segment(e) ==
    /\ eps[e].status = "idle" /\ eps[e].policy = "segment"
    /\ mem[eps[e].member].phase = "serve" /\ mem[eps[e].member].gen > eps[e].gen
    /\ eps' = [eps EXCEPT ![e].gen = mem[eps[e].member].gen, ![e].seg = eps[e].seg + 1]
    /\ UNCHANGED <<front, floor, mem>>

\* raise_floor: The floor rises past a generation no member serves and no live episode is bound to.
RaiseFloor ==
    /\ floor < front /\ \A n \in Members : mem[n].gen > floor
    /\ \A x \in Episodes : Live(x) => eps[x].gen > floor
    /\ floor' = floor + 1 /\ UNCHANGED <<front, mem, eps>>

Next ==
    \/ \E e \in Episodes : \E n \in Members : \E p \in Policies : Start(e, n, p)
    \/ \E e \in Episodes : \E n \in Members : TurnBegin(e, n)
    \/ \E e \in Episodes : TurnEnd(e)
    \/ \E e \in Episodes : End(e)
    \/ \E e \in Episodes : IdleTimeout(e)
    \/ \E e \in Episodes : Expire(e)
    \/ \E n \in Members : Drain(n)
    \/ \E e \in Episodes : AbortEpisode(e)
    \/ \E n \in Members : CancelDrain(n)
    \/ \E n \in Members : Mutate(n)
    \/ \E n \in Members : Publish(n)
    \/ \E e \in Episodes : Segment(e)
    \/ RaiseFloor

Spec == Init /\ [][Next]_vars

\* ---- invariants
\* Every turn of an episode's segment, as its record journals it, was served by one generation, its segment's (a turn in flight included).
OneEpisodeOnePolicy ==
    \A x \in Episodes :
        /\ \A i, j \in DOMAIN eps[x].log : eps[x].log[i][1] = eps[x].log[j][1] => eps[x].log[i][2] = eps[x].log[j][2]
        /\ eps[x].status = "turn" => eps[x].tgen = eps[x].gen

\* A turn in flight runs on a member that serves its generation and is not mutating: no member's update crosses a turn.
TurnServedByItsGeneration ==
    \A x \in Episodes : eps[x].status = "turn" => (mem[eps[x].member].gen = eps[x].tgen /\ mem[eps[x].member].phase # "mutate")

\* A live episode whose owner chose to wait or to abort keeps its member on its generation: that member has not mutated under it (one that chose to segment may lag its member's, until its next segment).
OwnersChoiceKept ==
    \A x \in Episodes : (Live(x) /\ eps[x].policy # "segment") => (mem[eps[x].member].gen = eps[x].gen /\ mem[eps[x].member].phase # "mutate")

\* Every live episode's generation is live (from the floor to the frontier), and at most K generations are.
EpisodesCountTowardK ==
    /\ front - floor + 1 <= MaxLive
    /\ \A x \in Episodes : Live(x) => (eps[x].gen >= floor /\ eps[x].gen <= front)

\* No turn runs on an episode past its idle deadline: it is ended and reported instead.
IdleDeadlineHonoured ==
    \A x \in Episodes : eps[x].status = "turn" => ~eps[x].late

\* An episode's record goes through its segments in order, each under a newer generation than the one before.
SegmentsInOrder ==
    \A x \in Episodes : \A i \in 1..(Len(eps[x].log) - 1) :
        \/ eps[x].log[i][1] = eps[x].log[i + 1][1]
        \/ (eps[x].log[i][1] < eps[x].log[i + 1][1] /\ eps[x].log[i][2] < eps[x].log[i + 1][2])

==============================================================================
