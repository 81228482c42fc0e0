"""The controller's side of remote gateways (the protocol of :mod:`rolloutcore.spec.gateways`).

A remote gateway (``rolloutcore serve --gateway-only``, :mod:`rolloutcore.gateway.follower`)
admits rollouts on its own view and journals them in its own journal; the controller never
sees them one by one. What it sees is one *hold* per gateway and member: a binding on the
member's controller (:meth:`Fleet.hold`) that the gateway takes before it admits anything
there. A member cannot mutate while any binding is left, so a hold stands for everything
that gateway runs there, with the single-engine proof chain unchanged:

- ``close_begin``/``close_seen``: a member that starts to drain (its ``request_update``) is
  marked closing for every gateway holding it; the gateways learn it from their view
  (a long poll, woken at once).
- ``ack``: a gateway that has closed the member and whose own rollouts on it have ended
  releases its hold, journalled with its journal position then (what the checker joins
  the journals by, :mod:`rolloutcore.check.gateway_join`).
- ``lease_expire``: a gateway that has not polled for ``lease_s`` is fenced on every engine
  (``POST /rc/gateway_fence``, :mod:`rolloutcore.adapters.gateway_fence`: nothing of its
  epoch runs there or can start) and only then are its holds released. An engine that
  cannot be fenced keeps that gateway's hold: its member cannot mutate (fail closed).
- ``reopen``: after the update a gateway takes a new hold, bound to the new generation.

A gateway that registers again under its name (restarted) is fenced at its old epoch
first, the same way. Epochs grow across controllers (:meth:`GatewayRegistry._next_epoch`),
and a new leader's takeover fences every remote gateway of the leaders before it at once.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from anyio import to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rolloutcore.adapters.gateway_fence import remote_floor
from rolloutcore.engine.runner import DrainPolicy
from rolloutcore.fleet import Fleet, FleetError, Lease
from rolloutcore.journal.gateway_records import HOLD_PREFIX


def check_gateway_name(name: str) -> None:
    """ValueError unless ``name`` can name a gateway: its rollout ids are ``<name>-...`` and
    its stamp ``<name>;<epoch>``, so neither character may be in it."""
    if not name or "-" in name or ";" in name or len(name) > 64:
        raise ValueError(f"gateway name {name!r}: 1-64 characters, no '-' or ';'")


class GatewayFencing(Protocol):
    def fence_gateway(self, gateway: str, epoch: int, deadline: float) -> str | None: ...


log = logging.getLogger("rolloutcore.gateway.registry")

#: The error code of a call whose epoch has no lease (the gateway registers again).
LEASE_LOST = "gateway_lease_lost"


class RegistryRefused(Exception):
    """A gateway's call the registry refuses: 409 with the message and ``code``."""

    code = "gateway_refused"


class LeaseEnded(RegistryRefused):
    """The gateway's epoch has no lease here (expired, or replaced by a restart)."""

    code = LEASE_LOST


@dataclass
class Remote:
    name: str
    epoch: int
    seen: float  # monotonic: its last poll
    holds: dict[str, Lease] = field(default_factory=dict)
    closing: set[str] = field(default_factory=set)
    polls: int = 0


class GatewayRegistry:
    """Leases, holds and closes of the remote gateways in front of one fleet."""

    def __init__(self, fleet: Fleet, *, lease_s: float = 10.0, fence_timeout_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if fleet.policy.drain_policy is DrainPolicy.WAIT_THEN_ABORT:
            raise ValueError("remote gateways need the wait drain policy: an aborted hold "
                             "would let a gateway admit to a mutating member")
        if not lease_s < fleet.policy.drain_timeout_s:
            raise ValueError(f"the gateway lease ({lease_s} s) must be shorter than the "
                             f"drain timeout ({fleet.policy.drain_timeout_s} s), or a drain "
                             "gives up before an unreachable gateway's lease ends")
        for m in fleet.members.values():
            if not callable(getattr(m.adapter, "fence_gateway", None)):
                raise ValueError(f"{m.name}: its adapter cannot fence a gateway (remote "
                                 "gateways need HTTP engines)")
        self.fleet = fleet
        self.lease_s = lease_s
        self.fence_timeout_s = fence_timeout_s
        self._clock = clock
        self._cond = threading.Condition()
        self._remotes: dict[str, Remote] = {}
        self._expired: list[Remote] = []  # leases ended, holds not yet all released
        self._settling = threading.Lock()
        self._last_epoch = 0
        self._ids = itertools.count(1)
        self.version = 0  # bumped on every change a gateway's view shows
        self.fences: list[dict[str, Any]] = []  # what was fenced where (status, tests)
        fleet.drain_listeners.append(self._draining)
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="gateway-leases", daemon=True)
        self._reaper.start()

    # ------------------------------------------------------------- gateway calls

    def register(self, name: str) -> dict[str, Any]:
        """A gateway starts (or restarts): a new epoch. Its previous epoch, if any, is
        fenced on every engine first, and that one's holds are released after."""
        check_gateway_name(name)
        with self._cond:
            old = self._remotes.pop(name, None)
            if old is not None:
                self._expired.append(old)
        if old is not None:
            self._settle_expired()
            with self._cond:
                if any(r.name == name for r in self._expired):
                    raise RegistryRefused(f"gateway {name}: its previous epoch could not be "
                                          "fenced on every engine yet; try again")
        with self._cond:
            epoch = self._next_epoch()
            self._last_epoch = epoch
            self._remotes[name] = Remote(name, epoch, self._clock())
            self._bump()
        return {"gateway": name, "epoch": epoch, "lease_s": self.lease_s}

    def view(self, name: str, epoch: int, after: int, wait: float) -> dict[str, Any]:
        """The gateway's view (and its lease renewed): waits up to ``wait`` seconds for a
        change after version ``after``."""
        deadline = self._clock() + max(0.0, min(wait, self.lease_s / 2))
        with self._cond:
            r = self._current(name, epoch)
            r.seen, r.polls = self._clock(), r.polls + 1
            while self.version <= after:
                left = deadline - self._clock()
                if left <= 0:
                    break
                self._cond.wait(left)
                r = self._current(name, epoch)
            r.seen = self._clock()
            version, holds, closing = self.version, dict(r.holds), set(r.closing)
        admitting = self.fleet.admitting()
        members = {m.name: {"url": m.url, "admitting": m.name in admitting}
                   for m in self.fleet.members.values()}
        return {"version": version, "lease_s": self.lease_s, "members": members,
                "holds": {n: _lease_json(h) for n, h in holds.items()},
                "closing": sorted(closing)}

    def hold(self, name: str, epoch: int, member: str, position: int) -> dict[str, Any]:
        """The gateway may admit to ``member`` (bound to its generation) from journal
        position ``position`` on."""
        with self._cond:
            r = self._current(name, epoch)
            if member in r.holds:
                return _lease_json(r.holds[member])
            rollout = f"{HOLD_PREFIX}{name}:{member}:{epoch}:{next(self._ids)}"
        detail = {"gateway": name, "gateway_epoch": epoch, "position": int(position)}
        try:
            lease = self.fleet.hold(member, rollout, detail)
        except FleetError as e:
            raise RegistryRefused(str(e)) from None
        # Never into the fleet with the condition held (a member's drain listener takes
        # it under the member's lock): what to give back is decided here, done after.
        with self._cond:
            ended = self._remotes.get(name) is not r  # expired or re-registered meanwhile
            other = None if ended else r.holds.get(member)  # a concurrent call's
            if not ended and other is None:
                r.holds[member] = lease
                self._bump()
        if ended or other is not None:
            self._release(lease, {**detail, "unused": True})
            if ended:
                raise LeaseEnded(f"gateway {name}: epoch {epoch} ended while its hold on "
                                 f"{member} was taken")
            assert other is not None
            return _lease_json(other)
        if member not in self.fleet.admitting():
            # It began to drain (or stopped admitting) between the binding and the line
            # above, so its drain listener did not see this hold: closing, or it waits.
            with self._cond:
                if r.holds.get(member) is lease:
                    r.closing.add(member)
                    self._bump()
        return _lease_json(lease)

    def ack(self, name: str, epoch: int, member: str, position: int) -> dict[str, Any]:
        """The gateway has closed ``member`` and nothing it admitted there runs: its hold
        ends, journalled with the gateway's journal position."""
        with self._cond:
            r = self._current(name, epoch)
            lease = r.holds.pop(member, None)
            r.closing.discard(member)
            if lease is None:
                return {"member": member, "released": False}
            self._bump()
        self._release(lease, {"gateway": name, "gateway_epoch": epoch,
                              "position": int(position)})
        return {"member": member, "released": True}

    # ------------------------------------------------------------------ internals

    def _next_epoch(self) -> int:
        """Under a leadership (etcd) ``(leader epoch << 32) + n``: above every epoch an
        earlier leader issued, whose gateways its takeover fenced all at once
        (:func:`~rolloutcore.adapters.gateway_fence.remote_floor`). Without one, the
        wall clock's milliseconds: a restarted controller issues epochs above the ones
        before it (one controller, one clock)."""
        leader = self.fleet.epoch
        if leader is not None:
            return max(self._last_epoch + 1, remote_floor(leader) + 1)
        return max(self._last_epoch + 1, int(time.time() * 1000))

    def _current(self, name: str, epoch: int) -> Remote:
        r = self._remotes.get(name)
        if r is None or r.epoch != epoch:
            raise LeaseEnded(f"gateway {name} at epoch {epoch} has no lease here "
                                  "(it expired or was replaced): register again")
        return r

    def _bump(self) -> None:
        self.version += 1
        self._cond.notify_all()

    def _draining(self, member: str) -> None:
        """A member starts to drain (called from its journal write: signal only). The
        condition's lock is never held while calling into the fleet, so taking it here
        cannot deadlock."""
        with self._cond:
            for r in self._remotes.values():
                if member in r.holds:
                    r.closing.add(member)
            self._bump()

    def _release(self, lease: Lease, detail: dict[str, Any]) -> None:
        try:
            self.fleet.unhold(lease, detail)
        except Exception as e:  # a member whose controller restarted: the hold is gone
            log.warning("the hold %s on %s was not released: %s", lease.rollout_id,
                        lease.engine, e)
        with self._cond:
            self._bump()

    def _reap(self) -> None:
        while not self._stop.wait(self.lease_s / 4):
            now = self._clock()
            with self._cond:
                for name, r in list(self._remotes.items()):
                    if now - r.seen > self.lease_s:
                        del self._remotes[name]
                        self._expired.append(r)
                        self._bump()
            self._settle_expired()

    def _settle_expired(self) -> None:
        """Fence every expired epoch on every engine; release its holds once all took it."""
        with self._settling:  # the reaper and a re-registration may both settle
            with self._cond:
                pending = list(self._expired)
            for r in pending:
                self._fence_expired(r)

    def _fence_expired(self, r: Remote) -> None:
        """Raise ``r``'s fence above its epoch on every engine; only if every one took it
        (and ended what ran below it) are its holds released."""
        deadline = time.monotonic() + self.fence_timeout_s
        why = {}
        for m in self.fleet.members.values():
            fence: GatewayFencing = m.adapter  # type: ignore[assignment]
            err = fence.fence_gateway(r.name, r.epoch + 1, deadline)
            if err is not None:
                why[m.name] = err
        self.fences.append({"gateway": r.name, "fence": r.epoch + 1,
                            "failed": dict(why), "at": time.time()})
        if why:
            return  # tried again on the next round: the holds stay, nothing mutates
        for member, lease in list(r.holds.items()):
            self._release(lease, {"gateway": r.name, "gateway_epoch": r.epoch,
                                  "expired": True, "fence": r.epoch + 1})
            r.holds.pop(member, None)
        with self._cond:
            self._expired.remove(r)
            self._bump()

    def status(self) -> dict[str, Any]:
        now = self._clock()
        with self._cond:
            return {"lease_s": self.lease_s, "version": self.version,
                    "gateways": {r.name: {"epoch": r.epoch, "age_s": round(now - r.seen, 3),
                                          "holds": sorted(r.holds),
                                          "closing": sorted(r.closing)}
                                 for r in self._remotes.values()},
                    "expired": [{"gateway": r.name, "epoch": r.epoch,
                                 "holds": sorted(r.holds)} for r in self._expired],
                    "fences": self.fences[-20:]}

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._reaper.join(timeout=5)


#: The controller's routes for remote gateways (under the admin token).
REGISTRY_PATH = "/rc/gateways"


def registry_routes(registry: GatewayRegistry,
                    authorize: Callable[[Request], Response | None]) -> list[Route]:
    """Starlette routes of the protocol: ``register``, ``view`` (a long poll that renews
    the lease), ``hold`` and ``ack``; each a JSON object in, a JSON object out, 409 with
    the reason for a call refused (the gateway registers again), 400 for bad input."""

    async def call(request: Request, fn: Callable[..., dict[str, Any]],
                   keys: tuple[str, ...]) -> Response:
        refused = authorize(request)
        if refused is not None:
            return refused
        try:
            obj = await request.json()
            if not isinstance(obj, dict):
                raise ValueError("a JSON object")
            args = [obj[k] for k in keys]
            for k, v in zip(keys, args, strict=True):
                names = k in ("gateway", "member")
                if not isinstance(v, str) if names else (
                        isinstance(v, bool) or not isinstance(v, int | float)):
                    raise ValueError(f"{k}: {v!r}")
            out = await to_thread.run_sync(lambda: fn(*args))
        except (ValueError, KeyError, TypeError) as e:
            return _error(400, f"bad request: {e}", "bad_request")
        except RegistryRefused as e:
            return _error(409, str(e), e.code)
        return JSONResponse(out)

    async def register(request: Request) -> Response:
        return await call(request, registry.register, ("gateway",))

    async def view(request: Request) -> Response:
        return await call(request, registry.view, ("gateway", "epoch", "after", "wait"))

    async def hold(request: Request) -> Response:
        return await call(request, registry.hold, ("gateway", "epoch", "member", "position"))

    async def ack(request: Request) -> Response:
        return await call(request, registry.ack, ("gateway", "epoch", "member", "position"))

    return [Route(f"{REGISTRY_PATH}/{name}", fn, methods=["POST"])
            for name, fn in (("register", register), ("view", view), ("hold", hold),
                             ("ack", ack))]


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error",
                                   "code": code}}, status_code=status)


def _lease_json(lease: Lease) -> dict[str, Any]:
    return {"member": lease.engine, "url": lease.url, "generation": lease.generation,
            "identity": lease.identity, "label": lease.label, "rollout": lease.rollout_id}


__all__ = [
    "LEASE_LOST",
    "REGISTRY_PATH",
    "GatewayRegistry",
    "LeaseEnded",
    "RegistryRefused",
    "check_gateway_name",
    "registry_routes",
]
