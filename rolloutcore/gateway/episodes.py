"""Agentic episodes at the gateway: a multi-turn rollout bound to one generation as one
unit (the episode spec, ``spec/episodes.py``, is the rule; this is its runtime).

An episode holds one fleet admission (its *hold*) on a member for as long as its segment
lives there: its turns are forwarded under that binding, no admission of their own, so
the member's drain cannot cross a turn or an idle episode it holds, and every turn of a
segment is served by the segment's generation. The owner's policy, chosen when the
episode starts, says what a drain of its member does (:data:`ON_DRAIN`, read from the
spec): ``wait``, the drain waits for it (its deadline cancels the update otherwise);
``abort``, the episode is aborted whole; ``segment``, its hold is let go and its next turn
runs on a member serving the segment's generation if one still does, else as a new
segment under a newer generation. A turn in flight always ends first. An idle episode
past its idle deadline is ended and reported (``expired``); a turn whose engine failed
ends its episode as ``lost``.

Journal: each hold is an admission whose detail names the episode, its segment and
policy; its release names why it ended (``hold_ends``: ``drain``, the episode goes on, or
the episode's end). The fleet trace checker checks every episode's admissions against the
spec's OneEpisodeOnePolicy and SegmentsInOrder. Rollout ids: ``<episode>#<segment>.<hold>``.
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
class Episode:
    id: str
    policy: str
    idle_s: float
    idle_since: float
    status: str = IDLE  # the spec's: idle, turn, done, aborted, expired; or lost
    segment: int = 1
    generation: int | None = None  # the current segment's (None: not yet admitted)
    member: str | None = None  # where its last turn ran (its prefix is cached there)
    hold: Lease | None = None  # the admission it holds now
    holds: int = 0  # admissions taken so far (for unique rollout ids)
    turns: list[dict[str, Any]] = field(default_factory=list)
    pending: str | None = None  # what a drain or an end asked while a turn ran
    why: str | None = None  # why it ended

    def as_json(self) -> dict[str, Any]:
        return {"episode": self.id, "status": self.status, "policy": self.policy,
                "segment": self.segment, "generation": self.generation,
                "member": self.member, "turns": list(self.turns), "why": self.why}


@dataclass(frozen=True)
class TurnLease:
    """A turn admitted under its episode's hold."""

    lease: Lease
    segment: int
    index: int  # the turn's number in its episode, from 1


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
        self._ended: OrderedDict[str, Episode] = OrderedDict()
        self.counts: dict[str, int] = dict.fromkeys(
            ("started", "segments", DONE, ABORTED, EXPIRED, LOST), 0)
        fleet.drain_listeners.append(self._draining)

    # ------------------------------------------------------------------ turns

    def begin_turn(self, eid: str, policy: str | None, endpoint: str,
                   cancel: threading.Event) -> TurnLease:
        """Start a turn of episode ``eid`` (started by its first turn, with ``policy``):
        under its hold, taking one if it has none (the segment's generation if a member
        still serves it, else a new segment). Returns once the admission, if any, is
        durable. :class:`EpisodeRefused` if the episode cannot take a turn now."""
        self.expire_due()
        with self._lock:
            ep = self._live.get(eid)
            if ep is None:
                old = self._ended.get(eid)
                if old is not None:
                    raise _refused(409, f"episode_{old.status}", f"episode {eid!r} has "
                                   f"ended ({old.status}: {old.why})")
                ep = Episode(eid, check_policy(policy), self.idle_s, self.clock())
                self._live[eid] = ep
                self.counts["started"] += 1
            elif policy is not None and check_policy(policy) != ep.policy:
                raise _refused(409, "episode_policy_fixed", f"episode {eid!r} was started "
                               f"with policy {ep.policy}; it cannot change")
            if ep.status == TURN:
                raise _refused(409, "turn_in_flight", f"episode {eid!r} has a turn in "
                               "flight: one turn at a time")
            ep.status = TURN
            hold = ep.hold
        if hold is None:
            try:
                hold = self._take_hold(ep, endpoint, cancel)
            except BaseException:
                with self._lock:
                    if ep.status == TURN:
                        ep.status = IDLE
                        ep.idle_since = self.clock()
                    if not ep.turns and ep.hold is None and ep.generation is None:
                        self._live.pop(eid, None)  # never admitted: it never started
                        self.counts["started"] -= 1
                raise
        with self._lock:
            return TurnLease(hold, ep.segment, len(ep.turns) + 1)

    def _take_hold(self, ep: Episode, endpoint: str, cancel: threading.Event) -> Lease:
        """Admit the episode's hold: on its segment's generation (its last member first)
        at once if one serves it; else, a new segment on a newer one, waiting like a
        queued request."""
        gen, segment = ep.generation, ep.segment
        journal = self.fleet.journal
        try:
            if gen is not None:
                try:
                    with journal.deferred():
                        return self._admit(ep, endpoint, segment, cancel, wait=0.0,
                                           generation=gen)
                except AdmissionTimeout:
                    segment += 1  # no member serves it any more: the next segment
            with journal.deferred():
                floor = admission_floor(self.fleet.committed, 0 if gen is None else gen + 1)
                return self._admit(ep, endpoint, segment, cancel, wait=self.queue_wait_s,
                                   min_generation=floor)
        except AdmissionTimeout as e:
            raise _refused(503, "queue_timeout", f"no member could take episode "
                           f"{ep.id!r} for {self.queue_wait_s:g} s ({e})") from None
        except AdmissionCancelled:
            raise _refused(503, "cancelled", "cancelled while the episode's turn waited "
                           "for admission") from None

    def _admit(self, ep: Episode, endpoint: str, segment: int, cancel: threading.Event,
               **how: Any) -> Lease:
        rid = f"{ep.id}#{segment}.{ep.holds + 1}"
        lease = self.fleet.admit(rid, cancel=cancel, prefer=ep.member, detail={
            "via": "gateway", "endpoint": endpoint, "episode": ep.id, "segment": segment,
            "policy": ep.policy}, **how)
        with self._lock:
            ep.holds += 1
            if segment != ep.segment:
                self.counts["segments"] += 1
            ep.hold, ep.segment, ep.generation = lease, segment, lease.generation
        return lease

    def end_turn(self, eid: str, *, ok: bool, end: bool, tokens: int | None = None) -> None:
        """A turn's answer ended (``ok``: the engine answered it; else the episode is
        lost). ``end``: the client ended the episode with it. Then whatever a drain asked
        meanwhile."""
        with self._lock:
            ep = self._live.get(eid)
            if ep is None or ep.status != TURN:
                return
            hold = ep.hold
            assert hold is not None
            ep.turns.append({"segment": ep.segment, "generation": hold.generation,
                             "member": hold.engine, "seq": hold.seq, "tokens": tokens})
            ep.member, ep.status, ep.idle_since = hold.engine, IDLE, self.clock()
            then = DONE if end or ep.pending == DONE else LOST if not ok else ep.pending
            ep.pending = None
        if then is not None:
            self._settle(ep, then)

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
                ep.pending = DONE
                return ep.as_json()
        self._settle(ep, DONE)
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
        live episode it holds meets its owner's policy, on the pool."""
        with self._lock:
            for ep in self._live.values():
                if ep.hold is None or ep.hold.engine != engine:
                    continue
                action = ON_DRAIN[ep.policy]
                if action is None:
                    continue  # the drain waits for it
                then = ABORTED if action == "abort_episode" else DRAIN
                if ep.status == TURN:
                    ep.pending = ep.pending or then
                else:
                    self.pool.submit(self._settle, ep, then)

    def expire_due(self) -> list[str]:
        """End every idle episode past its idle deadline (the spec's ``expire``)."""
        now = self.clock()
        with self._lock:
            due = [ep for ep in self._live.values()
                   if ep.status == IDLE and now - ep.idle_since >= ep.idle_s]
        for ep in due:
            self._settle(ep, EXPIRED)
        return [ep.id for ep in due]

    def _settle(self, ep: Episode, then: str) -> None:
        """Let go of the hold (``then``: ``drain``, the episode goes on) or end the
        episode; journalled with why. Only an idle episode settles."""
        with self._lock:
            if ep.status != IDLE or self._live.get(ep.id) is not ep:
                return
            if then == EXPIRED and self.clock() - ep.idle_since < ep.idle_s:
                return  # a turn ran meanwhile
            hold, ep.hold = ep.hold, None
            if then != DRAIN:
                ep.status, ep.why = then, _WHY[then]
                del self._live[ep.id]
                self._ended[ep.id] = ep
                while len(self._ended) > ENDED_KEPT:
                    self._ended.popitem(last=False)
                self.counts[then] += 1
        if hold is not None:
            try:
                with self.fleet.journal.deferred():
                    self.fleet.release(hold, {"episode": ep.id, HOLD_ENDS: then})
            except (FleetError, IllegalTransition) as e:
                log.warning("episode %s: its hold on %s: %s", ep.id, hold.engine, e)
        log.info("episode %s: %s", ep.id, _WHY[then])

    # ---------------------------------------------------------------- recovery

    def recover(self, records: Iterable[Mapping[str, Any]]) -> list[str]:
        """A gateway that starts on a fleet's journal: every episode live when the last
        one stopped (a hold taken and never ended) lost its gateway, and its hold went
        with the controller's restart. Each is ended as lost, explicitly: its next turn
        is refused (``409 episode_lost``) and ``GET`` says why. Streams the records."""
        live: dict[str, dict[str, Any]] = {}
        for r in records:
            d = r.get("detail")
            if not isinstance(d, Mapping) or not isinstance(d.get("episode"), str):
                continue
            eid = d["episode"]
            if r.get("step") == "admit":
                live[eid] = {"segment": d.get("segment"), "policy": d.get("policy"),
                             "member": r.get("engine")}
            elif r.get("step") == "release" and d.get(HOLD_ENDS) != DRAIN:
                live.pop(eid, None)
        with self._lock:
            for eid, x in live.items():
                policy = x["policy"] if x["policy"] in POLICIES else "wait"
                ep = Episode(eid, policy, self.idle_s, self.clock(), status=LOST,
                             segment=x["segment"] if isinstance(x["segment"], int) else 1,
                             member=x["member"] if isinstance(x["member"], str) else None,
                             why="its gateway stopped while it was live (found in the "
                                 "journal on restart)")
                self._ended[eid] = ep
                self.counts[LOST] += 1
        for eid in live:
            log.warning("episode %s was live when the gateway stopped: ended as lost", eid)
        return sorted(live)

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        with self._lock:
            live = list(self._live.values())
            return {"live": len(live), "turns_in_flight": sum(e.status == TURN for e in live),
                    "holding": sum(e.hold is not None for e in live),
                    "idle_s": self.idle_s, **self.counts}

    def close(self) -> None:
        """Shutdown: every live episode is ended as lost (its hold released)."""
        with self._lock:
            live = list(self._live.values())
            for ep in live:
                ep.status = IDLE  # a turn still running was cut by the shutdown
        for ep in live:
            self._settle(ep, LOST)


_WHY = {DRAIN: "its member drains: the hold is let go, the episode goes on",
        DONE: "ended by its owner", ABORTED: "aborted: its member drained for an update",
        EXPIRED: "its idle deadline passed", LOST: "its turn's engine failed, or the "
        "gateway shut down under it"}

__all__ = ["ENDED", "LOST", "Episode", "EpisodeRefused", "Episodes",
           "TurnLease", "check_episode_id", "check_policy"]
