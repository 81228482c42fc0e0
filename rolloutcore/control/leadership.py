"""Controller leadership on etcd: etcd's election pattern, with an epoch per term.

A controller *campaigns* by creating ``<prefix>/leader`` in a transaction that requires
it not to exist, attached to a fresh lease. The key's create revision is the leader's
*epoch*: etcd's revisions only grow, so every epoch is greater than every epoch before
it. Every write the leader guards (journal appends) compares that revision, so a deposed
leader's write is refused by the store itself, whatever the deposed leader believes.

The leader keeps the lease alive from a thread. It *holds* leadership, in its own view,
only until ``deadline = (when the last acknowledged refresh was sent) + ttl - margin``:
the server starts the lease's new TTL only once it receives that refresh, so the
holder's belief always ends before the server can expire the key and elect another
(clock rates, not clocks, must agree). When the deadline passes, or a refresh finds the
lease or the key gone, leadership is lost for good: :attr:`Leadership.lost` is set and
the ``on_lost`` callbacks run once, from the keep-alive thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from rolloutcore.control.etcd import (
    EtcdStore,
    StoreAmbiguous,
    StoreError,
    StoreRejected,
    StoreUnavailable,
    cmp_create,
    op_delete,
    op_put,
    op_range,
)
from rolloutcore.errors import Refused

log = logging.getLogger(__name__)
_NOT_FOUND = 5  # the gRPC code of a lease that no longer exists

LEADER_KEY = "leader"


class CampaignTimeout(Refused, TimeoutError):
    """No leadership won within the campaign's timeout (one line: who holds it)."""


@dataclass(frozen=True)
class LeaderInfo:
    id: str
    host: str
    pid: int
    since: float  # wall-clock time of the election (time.time())
    epoch: int
    ttl_s: float  # seconds left on its lease (-1: expired, about to be deleted)

    def describe(self) -> str:
        return f"{self.id} (pid {self.pid} on {self.host}, epoch {self.epoch})"


def leader_key(store: EtcdStore) -> str:
    return store.key(LEADER_KEY)


def _parse_leader(value: bytes, epoch: int, ttl_s: float) -> LeaderInfo:
    try:
        d: dict[str, Any] = json.loads(value)
        return LeaderInfo(str(d["id"]), str(d.get("host", "?")), int(d.get("pid", 0)),
                          float(d.get("since", 0.0)), epoch, ttl_s)
    except (ValueError, KeyError, TypeError):
        return LeaderInfo(value[:40].decode(errors="replace"), "?", 0, 0.0, epoch, ttl_s)


def current_leader(store: EtcdStore) -> LeaderInfo | None:
    """Who holds the leader key now (None: nobody), with its lease's remaining TTL."""
    kv = store.get(leader_key(store))
    if kv is None:
        return None
    ttl = float(store.time_to_live(kv.lease)) if kv.lease else -1.0
    return _parse_leader(kv.value, kv.create_revision, ttl)


def describe_leader(store: EtcdStore, timeout_s: float = 0.5) -> str:
    """One phrase naming the current leader, for error messages (never raises)."""
    try:
        kv = store.get(leader_key(store), timeout_s=timeout_s)
    except StoreError as e:
        return f"current leader unknown ({e})"
    if kv is None:
        return "no leader now"
    return f"leader now {_parse_leader(kv.value, kv.create_revision, 0).describe()}"


class Leadership:
    """One controller's candidacy and, once elected, term. Single use: after it is lost
    or resigned, campaign with a new object (a new epoch).

    ``with Leadership(store, "ctl-a") as lead:`` campaigns (forever) and resigns on exit.
    """

    def __init__(self, store: EtcdStore, controller_id: str, ttl_s: float = 5.0) -> None:
        if ttl_s < 1.0:
            raise ValueError(f"ttl_s must be at least 1 s (etcd's lease granularity), "
                             f"not {ttl_s}")
        self.store = store
        self.controller_id = controller_id
        self.ttl_s = ttl_s
        #: Belief ends this long before the lease could expire on the server.
        self.margin_s = max(0.1 * ttl_s, 0.2)
        self.lost = threading.Event()
        self.lost_reason = ""
        self._epoch = 0
        self._lease = 0
        self._deadline = 0.0  # time.monotonic() until which it holds leadership
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._suspended = threading.Event()  # test hook: stop refreshing (a frozen holder)
        self._thread: threading.Thread | None = None
        self._done = False  # campaigned and then lost or resigned
        self.refreshes = 0

    # ------------------------------------------------------------------ state

    @property
    def epoch(self) -> int:
        """The epoch it was elected in (0: not elected)."""
        return self._epoch

    @property
    def key(self) -> str:
        return leader_key(self.store)

    def holds(self) -> bool:
        """Does it hold leadership now, by its own clock (see the module doc)?"""
        return (self._epoch > 0 and not self.lost.is_set()
                and time.monotonic() < self._deadline)

    @property
    def deadline(self) -> float:
        """The ``time.monotonic()`` at which its belief ends unless a refresh extends it."""
        return self._deadline

    def remaining_s(self) -> float:
        """Seconds its belief has left (0 when it does not hold)."""
        return max(0.0, self._deadline - time.monotonic()) if self.holds() else 0.0

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once when leadership is lost (from the keep-alive thread: it
        must not block); at once, here, if it is lost already."""
        with self._lock:
            if not self.lost.is_set():
                self._callbacks.append(callback)
                return
        callback()

    # --------------------------------------------------------------- campaign

    def _value(self) -> bytes:
        return json.dumps({"id": self.controller_id, "host": socket.gethostname(),
                           "pid": os.getpid(), "since": time.time()},
                          sort_keys=True).encode()

    def campaign(self, timeout_s: float | None = None) -> int:
        """Become the leader: wait while another holds the key (watching for its
        delete), then create it. Returns the epoch. Raises :class:`CampaignTimeout` after
        ``timeout_s`` (None: wait forever; the store being unreachable meanwhile is
        retried, not raised)."""
        with self._lock:
            if self._epoch or self._done:
                raise RuntimeError(f"{self.controller_id}: already campaigned (epoch "
                                   f"{self._epoch}); a new term needs a new Leadership")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        backoff = 0.05
        last = "nobody answered"
        while True:
            if self._stop.is_set():
                raise CampaignTimeout(f"{self.controller_id}: campaign cancelled (resigned)")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise CampaignTimeout(f"{self.controller_id}: not elected within "
                                      f"{timeout_s:.1f} s ({last})")
            try:
                holder = self._try_once(left)
            except StoreUnavailable as e:
                last = str(e)
                pause = backoff if left is None else min(backoff, max(left, 0.0))
                self._stop.wait(pause)
                backoff = min(backoff * 2, 1.0)
                continue
            backoff = 0.05
            if holder is None:
                return self._epoch
            revision, who = holder
            last = who
            # Re-read every second: a watch on a member cut off from the quorum would
            # never see the delete, and a resign() must not wait for long.
            wait = 1.0 if left is None else min(1.0, left)
            try:
                self.store.wait_deleted(self.key, revision, wait)
            except StoreUnavailable as e:
                last = str(e)
                self._stop.wait(min(backoff, wait))

    def _try_once(self, left: float | None) -> tuple[int, str] | None:
        """One attempt: None if elected, else (revision read, who holds the key)."""
        budget = self.store.timeout_s if left is None else max(min(self.store.timeout_s,
                                                                   left), 0.05)
        sent = time.monotonic()  # the lease's TTL starts after this
        lease, granted = self.store.grant(self.ttl_s, timeout_s=budget)
        ttl = min(self.ttl_s, float(granted))
        try:
            res = self.store.txn([cmp_create(self.key, 0)],
                                 [op_put(self.key, self._value(), lease)],
                                 [op_range(self.key)], timeout_s=budget)
        except StoreAmbiguous:
            # It may have landed: the key says whose lease it carries.
            kv = self.store.get(self.key)
            if kv is not None and kv.lease == lease:
                self._elected(kv.create_revision, lease, sent, ttl)
                return None
            self._revoke_quietly(lease)
            raise
        except StoreRejected as e:
            self._revoke_quietly(lease)
            if e.code != _NOT_FOUND:
                raise
            # The lease expired between its grant and the transaction: start again.
            raise StoreUnavailable(f"{self.controller_id}: {e}; retrying") from None
        if res.succeeded:
            self._elected(res.revision, lease, sent, ttl)
            return None
        self._revoke_quietly(lease)
        kvs = res.kvs(0)
        if not kvs:  # deleted between the compare and the read: cannot be; look again
            return res.revision, "no leader"
        kv = kvs[0]
        return res.revision, f"held by {_parse_leader(kv.value, kv.create_revision, 0).describe()}"

    def _elected(self, epoch: int, lease: int, sent: float, ttl: float) -> None:
        with self._lock:
            cancelled = self._stop.is_set()
            if not cancelled:
                self._epoch, self._lease = epoch, lease
                self.ttl_s = ttl
                self._deadline = sent + ttl - self.margin_s
        if cancelled:  # resign() came while the transaction was in flight: give it back
            self._release(epoch, lease)
            raise CampaignTimeout(f"{self.controller_id}: campaign cancelled (resigned)")
        self._thread = threading.Thread(target=self._keepalive, daemon=True,
                                        name=f"leadership-{self.controller_id}")
        self._thread.start()
        log.info("%s elected: epoch %d", self.controller_id, epoch)

    def _revoke_quietly(self, lease: int) -> None:
        with contextlib.suppress(StoreError):  # an unattached lease expires by itself
            self.store.revoke(lease, timeout_s=0.5)

    # -------------------------------------------------------------- keep-alive

    def suspend_keepalive(self) -> None:
        """Test hook: stop refreshing the lease, as a frozen controller would. The
        deadline is still watched: leadership lapses when it passes."""
        self._suspended.set()

    def _keepalive(self) -> None:
        interval = self.ttl_s / 3
        next_refresh = time.monotonic() + interval
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= self._deadline:
                self._lose(f"lease not refreshed for {self.ttl_s - self.margin_s:.1f} s "
                           "(deadline passed)")
                return
            if self._suspended.is_set():
                next_refresh = self._deadline
            if self._stop.wait(max(0.0, min(next_refresh, self._deadline) - now)):
                return
            sent = time.monotonic()
            if sent >= self._deadline or sent < next_refresh or self._suspended.is_set():
                continue
            budget = min(self.store.timeout_s, self._deadline - sent)
            try:
                ttl = self.store.keepalive(self._lease, timeout_s=budget)
                if ttl <= 0:
                    self._lose("lease expired on the server")
                    return
                kv = self.store.get(self.key, timeout_s=max(self._deadline - time.monotonic(),
                                                            0.05))
            except StoreError as e:
                log.warning("%s: lease refresh failed: %s", self.controller_id, e)
                next_refresh = time.monotonic() + min(interval / 4, 0.25)
                continue
            if kv is None or kv.create_revision != self._epoch:
                self._lose("leader key deleted" if kv is None else
                           f"leader key replaced (epoch {kv.create_revision})")
                return
            with self._lock:
                if not self.lost.is_set():
                    self._deadline = max(self._deadline, sent + self.ttl_s - self.margin_s)
            self.refreshes += 1
            next_refresh = sent + interval

    def _lose(self, reason: str) -> None:
        with self._lock:
            if self.lost.is_set():
                return
            self.lost_reason = reason
            self.lost.set()
            self._done = True
            callbacks, self._callbacks = self._callbacks, []
        log.warning("%s lost leadership (epoch %d): %s", self.controller_id, self._epoch,
                    reason)
        for cb in callbacks:
            try:
                cb()
            except Exception:  # a callback's bug must not stop the others
                log.exception("%s: on_lost callback failed", self.controller_id)

    # ------------------------------------------------------------------ resign

    def resign(self) -> bool:
        """Step down: stop refreshing, delete the key if it is still this epoch's, revoke
        the lease. Idempotent. True if the store confirmed; False if it could not be
        reached (the key then goes when the lease expires). ``lost`` is set; the
        ``on_lost`` callbacks do not run (nothing was lost). Before election it cancels
        a campaign in progress (which raises :class:`CampaignTimeout`)."""
        with self._lock:
            if self._epoch == 0:  # not elected: a campaign in progress gives up
                self._done = True
                self._stop.set()
                return True
            if self._done and self._lease == 0:
                return True
            self._done = True
            self.lost_reason = self.lost_reason or "resigned"
            self.lost.set()
            self._callbacks = []
            lease, self._lease = self._lease, 0
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.store.timeout_s * 2 + 1)
        return self._release(self._epoch, lease)

    def _release(self, epoch: int, lease: int) -> bool:
        """Delete the leader key if it is still ``epoch``'s, and revoke ``lease``."""
        try:
            self.store.txn([cmp_create(self.key, epoch)], [op_delete(self.key)],
                           idempotent=True)
            self.store.revoke(lease)
        except StoreError as e:
            log.warning("%s: resign not confirmed (%s); the key expires with its lease",
                        self.controller_id, e)
            return False
        return True

    def __enter__(self) -> Leadership:
        if not self._epoch:
            self.campaign()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.resign()
