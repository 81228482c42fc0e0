"""Agentic episodes at the gateway: a multi-turn rollout bound to one generation as one
unit (the episode spec, ``spec/episodes.py``, is the rule; this is its runtime).

An episode holds one fleet admission (its *hold*) on a member for as long as its segment
lives there: its turns are forwarded under that binding, no admission of their own, so
the member's drain cannot cross a turn or an idle episode it holds, and every turn of a
segment is served by the segment's generation. A *group* of episodes (n episodes of one
task, named by the same group id) shares one hold, as a group of samples shares one
admission: all of them on one member and one generation per segment. The owner's
policy, chosen when the episode (or group) starts, says what a drain of its member does
(:data:`ON_DRAIN`, read from the spec): ``wait``, the drain waits for it (its deadline
cancels the update otherwise); ``abort``, the episode (every episode of the group) is
aborted; ``segment``, the hold is let go and the next turn runs on a member serving the
segment's generation if one still does, else as a new segment under a newer generation.
Turns in flight always end first. An idle episode past its idle deadline is ended and
reported (``expired``); a turn whose engine failed ends what its hold binds as ``lost``.

Journal: each hold is an admission whose detail names the episode (or group), its
segment and policy; its release names why it ended (``hold_ends``: ``drain``, the
episodes go on, or how they ended). The fleet trace checker checks every hold sequence
against the spec's OneEpisodeOnePolicy and SegmentsInOrder. Rollout ids:
``<episode or group>#<segment>.<hold>``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from rolloutcore.engine.controller import (
    AdmissionCancelled,
    AdmissionTimeout,
    IllegalTransition,
)
from rolloutcore.errors import GatewayRefused
from rolloutcore.fleet import Fleet, FleetError, Lease
from rolloutcore.spec.episodes import (
    ABORTED,
    DONE,
    EXPIRED,
    HOLD_ENDS,
    HOLD_LET_GO,
    IDLE,
    ON_DRAIN,
    POLICIES,
    TURN,
)
from rolloutcore.spec.fleet import admission_floor

log = logging.getLogger("rolloutcore.gateway")

#: Why an episode ended, beyond the spec's statuses: its turn's engine failed, or the
#: gateway restarted under it.
LOST = "lost"
DRAIN = HOLD_LET_GO
ENDED = frozenset({DONE, ABORTED, EXPIRED, LOST})
#: Ended episodes kept for ``GET /v1/episodes/{id}`` (the newest).
ENDED_KEPT = 10_000
_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class EpisodeRefused(GatewayRefused):
    """A turn or an end the episode's state refuses (nothing was changed)."""


def _refused(status: int, code: str, message: str) -> EpisodeRefused:
    return EpisodeRefused(message, code=code, status=status)


def check_episode_id(raw: str) -> str:
    if not _ID.fullmatch(raw):
        raise _refused(400, "invalid_episode", "the episode id must be 1-128 characters "
                       "of letters, digits and ._:-")
    return raw


def check_policy(raw: str | None) -> str:
    policy = "wait" if raw is None else raw.strip().lower()
    if policy not in POLICIES:
        raise _refused(400, "invalid_episode_policy", f"the episode policy must be one of "
                       f"{', '.join(POLICIES)}, got {raw!r}")
    return policy


@dataclass
class Binding:
    """What an episode holds, or a group of episodes together (n episodes of one task,
    admitted whole as a group of samples is): one admission at a time on one member, its
    segment's generation, the member its prefix is cached on."""

    key: str  # the episode's id, or its group's: the journal's ``episode``
    policy: str
    grouped: bool = False
    segment: int = 1
    generation: int | None = None  # the current segment's (None: not yet admitted)
    member: str | None = None  # where its last turn ran
    hold: Lease | None = None  # the admission it holds now
    holds: int = 0  # admissions taken so far (for unique rollout ids)
    in_flight: int = 0  # turns in flight under it
    live: set[str] = field(default_factory=set)  # its live episodes
    pending: str | None = None  # what a drain asked while turns ran (aborted or drain)
    taking: threading.Lock = field(default_factory=threading.Lock)  # one admission


@dataclass
class Episode:
    id: str
    binding: Binding
    idle_s: float
    idle_since: float
    status: str = IDLE  # the spec's: idle, turn, done, aborted, expired; or lost
    turns: list[dict[str, Any]] = field(default_factory=list)
    end_after_turn: bool = False  # its owner ended it while its turn ran
    why: str | None = None  # why it ended

    @property
    def policy(self) -> str:
        return self.binding.policy

    def as_json(self) -> dict[str, Any]:
        b = self.binding
        return {"episode": self.id, "group": b.key if b.grouped else None,
                "status": self.status, "policy": b.policy, "segment": b.segment,
                "generation": b.generation, "member": b.member, "turns": list(self.turns),
                "why": self.why}


@dataclass(frozen=True)
class TurnLease:
    """A turn admitted under its episode's hold."""

    lease: Lease
    segment: int
    index: int  # the turn's number in its episode, from 1
    group: str | None = None  # the group whose hold it runs under


class Episodes:
    """The gateway's live episodes; all their state changes here, under one lock."""

    def __init__(self, fleet: Fleet, *, idle_s: float, queue_wait_s: float,
                 pool: Executor, clock: Callable[[], float] = time.monotonic) -> None:
        self.fleet = fleet
        self.idle_s = idle_s
        self.queue_wait_s = queue_wait_s
        self.pool = pool  # where a drain's releases run (never in the journal's sink)
        self.clock = clock
        self._lock = threading.Lock()
        self._live: dict[str, Episode] = {}
        self._groups: dict[str, Binding] = {}  # live groups by id
        self._ended: OrderedDict[str, Episode] = OrderedDict()
        self._ended_groups: OrderedDict[str, None] = OrderedDict()
        self.counts: dict[str, int] = dict.fromkeys(
            ("started", "segments", DONE, ABORTED, EXPIRED, LOST), 0)
        fleet.drain_listeners.append(self._draining)

    # ------------------------------------------------------------------ turns

    def begin_turn(self, eid: str, policy: str | None, endpoint: str,
                   cancel: threading.Event, group: str | None = None) -> TurnLease:
        """Start a turn of episode ``eid`` (started by its first turn, with ``policy``,
        and in ``group`` if named: the group's episodes share one hold): under its hold,
        taking one if there is none (the segment's generation if a member still serves
        it, else a new segment). Returns once the admission, if any, is durable.
        :class:`EpisodeRefused` if the episode cannot take a turn now."""
        self.expire_due(eid)  # its own deadline; the reaper sees to the others
        with self._lock:
            ep = self._live.get(eid)
            if ep is None:
                ep = self._start(eid, policy, group)
            elif policy is not None and check_policy(policy) != ep.policy:
                raise _refused(409, "episode_policy_fixed", f"episode {eid!r} was started "
                               f"with policy {ep.policy}; it cannot change")
            elif group is not None and (not ep.binding.grouped or ep.binding.key != group):
                raise _refused(409, "episode_group_fixed", f"episode {eid!r} was started "
                               "outside that group")
            if ep.status == TURN:
                raise _refused(409, "turn_in_flight", f"episode {eid!r} has a turn in "
                               "flight: one turn at a time")
            b = ep.binding
            ep.status = TURN
            b.in_flight += 1
            hold = b.hold
        if hold is None:
            try:
                with b.taking:  # one admission per binding; the others of a group wait
                    hold = b.hold or self._take_hold(b, endpoint, cancel)
            except BaseException:
                with self._lock:
                    ep.status, ep.idle_since = IDLE, self.clock()
                    b.in_flight -= 1
                    if not ep.turns and b.generation is None:  # never admitted: never began
                        self._forget(ep)
                    then = b.pending if b.in_flight == 0 else None
                if then is not None:  # a drain asked while this turn waited
                    self._settle(b, then)
                raise
        with self._lock:
            return TurnLease(hold, b.segment, len(ep.turns) + 1,
                             b.key if b.grouped else None)

    def _start(self, eid: str, policy: str | None, group: str | None) -> Episode:
        old = self._ended.get(eid)
        if old is not None:
            raise _refused(409, f"episode_{old.status}", f"episode {eid!r} has ended "
                           f"({old.status}: {old.why})")
        if group is None:
            b = Binding(eid, check_policy(policy))
        else:
            b = self._groups.get(group) or Binding(group, check_policy(policy), grouped=True)
            if policy is not None and check_policy(policy) != b.policy:
                raise _refused(409, "episode_policy_fixed", f"group {group!r} was started "
                               f"with policy {b.policy}; its episodes share it")
            if group in self._ended_groups:
                raise _refused(409, "episode_group_ended", f"group {group!r} has ended")
            self._groups[group] = b
        ep = Episode(eid, b, self.idle_s, self.clock())
        b.live.add(eid)
        self._live[eid] = ep
        self.counts["started"] += 1
        return ep

    def _forget(self, ep: Episode) -> None:
        """An episode that never began (its first admission failed)."""
        b = ep.binding
        self._live.pop(ep.id, None)
        b.live.discard(ep.id)
        self.counts["started"] -= 1
        if b.grouped and not b.live and b.hold is None:
            self._groups.pop(b.key, None)

    def _take_hold(self, b: Binding, endpoint: str, cancel: threading.Event) -> Lease:
        """Admit the binding's hold: on its segment's generation (its last member first)
        at once if one serves it; else, a new segment on a newer one, waiting like a
        queued request."""
        gen, segment = b.generation, b.segment
        journal = self.fleet.journal
        try:
            if gen is not None:
                try:
                    with journal.deferred():
                        return self._admit(b, endpoint, segment, cancel, wait=0.0,
                                           generation=gen)
                except AdmissionTimeout:
                    segment += 1  # no member serves it any more: the next segment
            with journal.deferred():
                floor = admission_floor(self.fleet.committed, 0 if gen is None else gen + 1)
                return self._admit(b, endpoint, segment, cancel, wait=self.queue_wait_s,
                                   min_generation=floor)
        except AdmissionTimeout as e:
            raise _refused(503, "queue_timeout", f"no member could take episode "
                           f"{b.key!r} for {self.queue_wait_s:g} s ({e})") from None
        except AdmissionCancelled:
            raise _refused(503, "cancelled", "cancelled while the episode's turn waited "
                           "for admission") from None

    def _admit(self, b: Binding, endpoint: str, segment: int, cancel: threading.Event,
               **how: Any) -> Lease:
        rid = f"{b.key}#{segment}.{b.holds + 1}"
        detail = {"via": "gateway", "endpoint": endpoint, "episode": b.key,
                  "segment": segment, "policy": b.policy}
        if b.grouped:
            detail["group"] = True
        lease = self.fleet.admit(rid, cancel=cancel, prefer=b.member, detail=detail, **how)
        with self._lock:
            b.holds += 1
            if segment != b.segment:
                self.counts["segments"] += 1
            b.hold, b.segment, b.generation = lease, segment, lease.generation
        return lease

    def end_turn(self, eid: str, *, ok: bool, end: bool, tokens: int | None = None) -> None:
        """A turn's answer ended (``ok``: the engine answered it; else its hold's member
        failed and what it holds is lost). ``end``: the client ended the episode with it.
        Then whatever a drain asked meanwhile, once no turn of the binding runs."""
        with self._lock:
            ep = self._live.get(eid)
            if ep is None or ep.status != TURN:
                return
            b = ep.binding
            hold = b.hold
            assert hold is not None
            ep.turns.append({"segment": b.segment, "generation": hold.generation,
                             "member": hold.engine, "seq": hold.seq, "tokens": tokens})
            b.member, ep.status, ep.idle_since = hold.engine, IDLE, self.clock()
            b.in_flight -= 1
            if not ok:
                b.pending = LOST
            elif end or ep.end_after_turn:
                self._end_one(ep, DONE)
            then = b.pending if b.in_flight == 0 else None
            if then is None and b.in_flight == 0 and not b.live:
                then = DONE  # its last episode ended
        if then is not None:
            self._settle(b, then)

    def end(self, eid: str) -> dict[str, Any]:
        """The client ends the episode: at once if idle, else when its turn ends."""
        with self._lock:
            ep = self._live.get(eid)
            if ep is None:
                old = self._ended.get(eid)
                if old is None:
                    raise _refused(404, "episode_not_found", f"no episode {eid!r}")
                return old.as_json()
            if ep.status == TURN:
                ep.end_after_turn = True
                return ep.as_json()
            b = ep.binding
            self._end_one(ep, DONE)
            last = not b.live and b.in_flight == 0
        if last:
            self._settle(b, DONE)
        return ep.as_json()

    def get(self, eid: str) -> dict[str, Any]:
        with self._lock:
            ep = self._live.get(eid) or self._ended.get(eid)
            if ep is None:
                raise _refused(404, "episode_not_found", f"no episode {eid!r}")
            return ep.as_json()

    # ------------------------------------------------------------ drains, deadlines

    def _draining(self, engine: str) -> None:
        """A member starts to drain (called in the journal's sink: must not block): each
        binding it holds meets its owner's policy, on the pool, once no turn of it
        runs."""
        with self._lock:
            bindings = {id(ep.binding): ep.binding for ep in self._live.values()}
            for b in bindings.values():
                if b.hold is None or b.hold.engine != engine:
                    continue
                action = ON_DRAIN[b.policy]
                if action is None:
                    continue  # the drain waits for it
                then = ABORTED if action == "abort_episode" else DRAIN
                if b.in_flight:
                    b.pending = b.pending or then
                else:
                    self.pool.submit(self._settle, b, then)

    def expire_due(self, only: str | None = None) -> list[str]:
        """End every idle episode past its idle deadline (the spec's ``expire``), or only
        episode ``only`` if it is; a binding none of whose episodes lives any more is
        released."""
        now = self.clock()
        released: dict[int, Binding] = {}
        with self._lock:
            pool: Iterable[Episode] = self._live.values() if only is None else (
                [self._live[only]] if only in self._live else [])
            due = [ep for ep in pool if ep.status == IDLE and now - ep.idle_since >= ep.idle_s]
            for ep in due:
                self._end_one(ep, EXPIRED)
                b = ep.binding
                if not b.live and b.in_flight == 0:
                    released[id(b)] = b
        for b in released.values():
            self._settle(b, EXPIRED)
        return [ep.id for ep in due]

    def _end_one(self, ep: Episode, status: str) -> None:
        """End one episode (under the lock); its binding's hold is the caller's."""
        ep.status, ep.why = status, _WHY[status]
        b = ep.binding
        del self._live[ep.id]
        b.live.discard(ep.id)
        self._ended[ep.id] = ep
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)
        self.counts[status] += 1
        if b.grouped and not b.live:  # a group ended: its id may not start again
            self._groups.pop(b.key, None)
            self._ended_groups[b.key] = None
            while len(self._ended_groups) > ENDED_KEPT:
                self._ended_groups.popitem(last=False)

    def _settle(self, b: Binding, then: str) -> None:
        """Let go of the binding's hold (``then``: ``drain``, its episodes go on) or end
        every episode it binds with ``then``; journalled with why. Only once no turn of
        it runs (else it waits for the last one: ``pending``)."""
        with self._lock:
            if b.in_flight:
                b.pending = b.pending or then
                return
            b.pending = None
            hold, b.hold = b.hold, None
            if then != DRAIN:
                for eid in list(b.live):
                    self._end_one(self._live[eid], then)
        if hold is not None:
            try:
                with self.fleet.journal.deferred():
                    self.fleet.release(hold, {"episode": b.key, HOLD_ENDS: then})
            except (FleetError, IllegalTransition) as e:
                log.warning("episode %s: its hold on %s: %s", b.key, hold.engine, e)
        log.info("episode %s: %s", b.key, _WHY[then])

    # ---------------------------------------------------------------- recovery

    def recover(self, records: Iterable[Mapping[str, Any]]) -> list[str]:
        """A gateway that starts on a fleet's journal: every episode (or group) live when
        the last one stopped (a hold taken and never ended) lost its gateway, and its hold
        went with the controller's restart. Each is ended as lost, explicitly: its next
        turn is refused (``409 episode_lost``) and ``GET`` says why. Streams the
        records. (A group's episodes are known by the group's id.)"""
        live: dict[str, dict[str, Any]] = {}
        for r in records:
            d = r.get("detail")
            if not isinstance(d, Mapping) or not isinstance(d.get("episode"), str):
                continue
            key = d["episode"]
            if r.get("step") == "admit":
                live[key] = {"segment": d.get("segment"), "policy": d.get("policy"),
                             "member": r.get("engine"), "group": d.get("group") is True}
            elif r.get("step") == "release" and d.get(HOLD_ENDS) != DRAIN:
                live.pop(key, None)
        with self._lock:
            for key, x in live.items():
                b = Binding(key, x["policy"] if x["policy"] in POLICIES else "wait",
                            grouped=x["group"],
                            segment=x["segment"] if isinstance(x["segment"], int) else 1,
                            member=x["member"] if isinstance(x["member"], str) else None)
                self._ended[key] = Episode(
                    key, b, self.idle_s, self.clock(), status=LOST,
                    why="its gateway stopped while it was live (found in the journal on "
                        "restart)")
                self.counts[LOST] += 1
        for key in live:
            log.warning("episode %s was live when the gateway stopped: ended as lost", key)
        return sorted(live)

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        with self._lock:
            live = list(self._live.values())
            bindings = {id(e.binding): e.binding for e in live}.values()
            return {"live": len(live), "turns_in_flight": sum(e.status == TURN for e in live),
                    "holding": sum(b.hold is not None for b in bindings),
                    "groups": sum(b.grouped for b in bindings), "idle_s": self.idle_s,
                    **self.counts}

    def close(self) -> None:
        """Shutdown: every live episode is ended as lost (its hold released)."""
        with self._lock:
            bindings = list({id(e.binding): e.binding for e in self._live.values()}.values())
            for ep in self._live.values():
                ep.status = IDLE  # a turn still running was cut by the shutdown
            for b in bindings:
                b.in_flight = 0
        for b in bindings:
            self._settle(b, LOST)


_WHY = {DRAIN: "its member drains: the hold is let go, the episode goes on",
        DONE: "ended by its owner", ABORTED: "aborted: its member drained for an update",
        EXPIRED: "its idle deadline passed", LOST: "its turn's engine failed, or the "
        "gateway shut down under it"}

__all__ = ["ENDED", "LOST", "Binding", "Episode", "EpisodeRefused", "Episodes",
           "TurnLease", "check_episode_id", "check_policy"]
