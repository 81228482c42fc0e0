"""A gateway of its own (``rolloutcore serve --gateway-only``): it admits rollouts to the
fleet's engines on its own view, journals them in its own journal, and follows the
controller's closes (the protocol of :mod:`rolloutcore.spec.gateways`; the controller's
side is :mod:`rolloutcore.gateway.registry`). Several run behind any L4 balancer.

Per member it admits only while it holds the member (the controller bound a hold there:
the member cannot mutate until it is released) and the controller has not asked it to
close. A close stops new admissions there at once; once its last rollout there has ended
(released in the journal) it acknowledges with its journal position, which releases its
hold. The view is a long poll that also renews its lease: a gateway that cannot poll for
the lease's length stops admitting by itself, and the controller, once the lease has ended,
has every engine refuse its epoch (the stamp it sends, ``<name>;<epoch>``) before any
member it held mutates.

The request path reads no JSON: the body's bytes are forwarded as they came, the answer's
bytes streamed back, and two journal lines (admit, release; group commit) are the whole
record. What the leader's gateway adds on top (trajectory records, episodes, migrating
streams, the admin API) is not served here.

Journal records (a :class:`~rolloutcore.journal.Journal`, steps of the gateway itself):
``gw_admit`` ``{rollout, member, generation, identity}``, ``gw_release`` ``{rollout,
member, status[, outcome]}``, and ``gw_start`` ``{gateway, epoch}`` once per registration
(a restart abandons what its predecessor journalled as admitted: ``gw_abandon``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import uvicorn
from starlette.types import Receive, Scope, Send

from rolloutcore.adapters.gateway_fence import GATEWAY_HEADER, stamp
from rolloutcore.fleet import Lease
from rolloutcore.gateway.app import (
    _HOP,
    CLIENT_GONE,
    OPENAI_ROUTES,
    lease_headers,
    upstream_session,
)
from rolloutcore.gateway.registry import LEASE_LOST, REGISTRY_PATH
from rolloutcore.gateway.wire import H_MIN_GENERATION
from rolloutcore.journal import Journal, JournalError, JournalReader
from rolloutcore.journal.gateway_records import ABANDON, ADMIT, JOURNAL_SPEC, RELEASE, START

log = logging.getLogger("rolloutcore.gateway.follower")



@dataclass
class Held:
    url: str
    generation: int
    identity: str | None
    label: str
    hold: str  # the hold's rollout id on the controller
    open: bool = True  # admits here (False once asked to close)
    inflight: int = 0
    acking: bool = False


@dataclass(frozen=True)
class FollowerConfig:
    name: str
    controller: str  # the leader's gateway URL (its /rc/gateways routes)
    journal: Path
    admin_token: str | None = field(default=None, repr=False)  # the controller's
    engine_tokens: dict[str, str] = field(default_factory=dict, repr=False)
    queue_wait_s: float = 30.0  # how long a request waits for a member to admit
    max_body_bytes: int = 16 << 20
    connect_timeout_s: float = 5.0
    upstream_timeout_s: float = 600.0
    fsync: bool = True


class Follower:
    """The ASGI app (``.app``) and its control loop (started by the lifespan)."""

    def __init__(self, config: FollowerConfig) -> None:
        self.config = config
        # Lines are written on the event loop (no thread hop per record) and made durable
        # by one flusher thread for every record written meanwhile (:class:`Durability`).
        self.journal = Journal(config.journal, spec_name=JOURNAL_SPEC, fsync=config.fsync)
        self.abandoned = self._abandon_predecessors()
        self.journal.fsync = False
        self._durability: Durability | None = None
        self.epoch: int | None = None
        self.lease_s = 10.0
        self.version = -1
        self.held: dict[str, Held] = {}
        self.last_ok = 0.0  # monotonic: the last view the controller answered
        self.admitted = self.refused = 0
        self._changed = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None  # to the engines
        self._control: aiohttp.ClientSession | None = None  # to the controller
        self._task: asyncio.Task[None] | None = None
        self.app = self

    # ------------------------------------------------------------------ journal

    def _abandon_predecessors(self) -> int:
        """A restart on its journal: what was admitted and never released ran under an
        epoch the controller has fenced by now (it registers anew); say so, once."""
        if self.journal.last_seq <= 0:
            return 0
        open_ones: dict[str, dict[str, Any]] = {}
        for _line, rec in JournalReader(self.journal.path):
            d = rec.get("detail") or {}
            if rec.get("step") == ADMIT:
                open_ones[d["rollout"]] = d
            elif rec.get("step") in (RELEASE, ABANDON):
                open_ones.pop(str(d.get("rollout")), None)
        for rollout, d in open_ones.items():
            self.journal.fleet_step(ABANDON, "restart", d["generation"], d["generation"],
                                    {"rollout": rollout, "member": d["member"]})
        return len(open_ones)

    async def _journal(self, step: str, generation: int, detail: dict[str, Any]) -> int:
        """Append a record and return its seq once it is durable."""
        assert self._durability is not None
        seq = self.journal.fleet_step(step, "serving", generation, generation, detail)
        await self._durability.durable(seq)
        return seq

    # -------------------------------------------------------------- control loop

    async def _call(self, what: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self._control is not None
        headers = {"authorization": f"Bearer {self.config.admin_token}"} \
            if self.config.admin_token else {}
        async with self._control.post(f"{self.config.controller.rstrip('/')}"
                                      f"{REGISTRY_PATH}/{what}", json=body, headers=headers,
                                      timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            obj = await r.json(content_type=None)
            if r.status == 409 and _code(obj) == LEASE_LOST:
                raise LeaseLost(str(obj))
            if r.status != 200 or not isinstance(obj, dict):
                raise RuntimeError(f"{what}: HTTP {r.status}: {str(obj)[:200]}")
            return obj

    async def _run_control(self) -> None:
        while True:
            try:
                if self.epoch is None:
                    reg = await self._call("register", {"gateway": self.config.name}, 30)
                    self.epoch, self.lease_s = int(reg["epoch"]), float(reg["lease_s"])
                    await self._journal(START, 0, {"gateway": self.config.name,
                                                   "epoch": self.epoch})
                    log.info("%s: registered at epoch %d", self.config.name, self.epoch)
                wait = self.lease_s / 3
                view = await self._call("view", {"gateway": self.config.name,
                                                 "epoch": self.epoch, "after": self.version,
                                                 "wait": wait}, wait + self.lease_s)
                self.last_ok = time.monotonic()
                self.version = int(view["version"])
                await self._apply(view)
            except LeaseLost as e:
                log.warning("%s: lease lost (%s): registering again", self.config.name, e)
                self._close_all()
                self.epoch = None
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the controller unreachable: retried, bounded below
                log.info("%s: controller call failed: %s", self.config.name, e)
                if time.monotonic() - self.last_ok > self.lease_s * 0.8:
                    self._close_all()  # its lease is about to end: admit nothing more
                await asyncio.sleep(min(0.2, self.lease_s / 10))

    def _close_all(self) -> None:
        """The lease is (about to be) gone: nothing more is admitted; the holds with it."""
        self.held.clear()
        self._changed.set()

    async def _apply(self, view: dict[str, Any]) -> None:
        holds = view["holds"]
        for name in [n for n in self.held if n not in holds]:
            del self.held[name]  # released on the controller (an expired epoch's)
        for name in view["closing"]:
            h = self.held.get(name)
            if h is not None and h.open:
                h.open = False
                self._maybe_ack(name)
        for name, m in view["members"].items():
            if m["admitting"] and name not in self.held and name not in view["closing"]:
                try:
                    got = await self._call("hold", {
                        "gateway": self.config.name, "epoch": self.epoch, "member": name,
                        "position": self.journal.last_seq}, 30)
                except RuntimeError as e:  # refused: it started to drain meanwhile
                    log.info("%s: no hold on %s: %s", self.config.name, name, e)
                    continue
                self.held[name] = Held(m["url"], int(got["generation"]), got["identity"],
                                       str(got["label"]), str(got["rollout"]))
        self._changed.set()

    def _maybe_ack(self, name: str) -> None:
        h = self.held.get(name)
        if h is None or h.open or h.inflight or h.acking:
            return
        h.acking = True
        asyncio.get_running_loop().create_task(self._ack(name, h))

    async def _ack(self, name: str, h: Held) -> None:
        epoch = self.epoch
        while self.held.get(name) is h and epoch == self.epoch:
            position = self.journal.last_seq
            assert self._durability is not None
            try:  # the journal holds everything up to the position it names
                await self._durability.durable(position)
                await self._call("ack", {"gateway": self.config.name, "epoch": epoch,
                                         "member": name, "position": position}, 30)
            except LeaseLost:
                return  # the control loop re-registers; the hold went with the lease
            except Exception as e:
                log.info("%s: ack of %s failed: %s; again", self.config.name, name, e)
                await asyncio.sleep(0.2)
                continue
            if self.held.get(name) is h:
                del self.held[name]
            return

    # ---------------------------------------------------------------------- ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path in OPENAI_ROUTES and scope["method"] == "POST":
            return await self._exchange(scope, receive, send)
        if path == "/health" and scope["method"] == "GET":
            return await _json(send, 200, self.status())
        return await _json(send, 404, _error("not found", "not_found"))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                cfg = self.config
                self._durability = Durability(self.journal, asyncio.get_running_loop(),
                                              fsync=cfg.fsync)
                self._session = upstream_session(cfg.connect_timeout_s, cfg.upstream_timeout_s)
                self._control = aiohttp.ClientSession()
                self._task = asyncio.get_running_loop().create_task(self._run_control())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._task is not None:
                    self._task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._task
                for s in (self._session, self._control):
                    if s is not None:
                        await s.close()
                if self._durability is not None:
                    self._durability.close()
                self.journal.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def status(self) -> dict[str, Any]:
        return {"gateway": self.config.name, "epoch": self.epoch, "version": self.version,
                "admitted": self.admitted, "refused": self.refused,
                "abandoned_at_start": self.abandoned, "journal_seq": self.journal.last_seq,
                "fsyncs": 0 if self._durability is None else self._durability.fsyncs,
                "held": {n: {"generation": h.generation, "open": h.open,
                             "inflight": h.inflight} for n, h in self.held.items()}}

    def _pick(self, floor: int) -> tuple[str, Held] | None:
        if time.monotonic() - self.last_ok > self.lease_s * 0.8:
            # Not heard from the leader for most of a lease (a thawed process, a cut
            # link): its holds may be gone; the control loop finds out before anything
            # more is admitted, whatever an engine that lost its fences would accept.
            return None
        best = [(n, h) for n, h in self.held.items() if h.open and h.generation >= floor]
        if not best:
            return None
        return min(best, key=lambda x: (-x[1].generation, x[1].inflight, x[0]))

    async def _exchange(self, scope: Scope, receive: Receive, send: Send) -> None:
        cfg = self.config
        headers = [(k, v) for k, v in scope["headers"]]
        floor = 0
        for k, v in headers:
            if k.lower() == H_MIN_GENERATION.encode():
                try:
                    floor = int(v)
                except ValueError:
                    return await _json(send, 400, _error(f"{H_MIN_GENERATION}: an integer",
                                                         "bad_header"))
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > cfg.max_body_bytes:
                return await _json(send, 413, _error("request body too large", "too_large"))
            if not message.get("more_body"):
                break
        deadline = time.monotonic() + cfg.queue_wait_s
        while (pick := self._pick(floor)) is None:
            left = deadline - time.monotonic()
            if left <= 0 or self._task is None:
                self.refused += 1
                return await _json(send, 503, _error(
                    f"gateway {cfg.name}: no member admits generation {floor} or newer "
                    "now", "not_admitting"), [(b"retry-after", b"1")])
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(left, 1.0))
        name, h = pick
        h.inflight += 1  # counted before any await: a close now waits for it
        rollout = f"{cfg.name}-{uuid.uuid4().hex[:20]}"
        epoch = self.epoch
        assert epoch is not None
        status, outcome = 502, "error"
        try:
            seq = await self._journal(ADMIT, h.generation, {
                "rollout": rollout, "member": name, "generation": h.generation,
                "identity": h.identity})
            self.admitted += 1
            lease = Lease(rollout, name, h.url, h.generation, h.identity, h.label, seq)
            forward = asyncio.ensure_future(self._forward(scope, bytes(body), headers, lease,
                                                          epoch, send))
            gone = asyncio.ensure_future(_disconnect(receive))
            await asyncio.wait((forward, gone), return_when=asyncio.FIRST_COMPLETED)
            if forward.done():
                gone.cancel()
                status, outcome = forward.result()
            else:  # uvicorn drops what is sent to a client gone: close the engine's answer,
                forward.cancel()  # which makes vLLM abort the request
                with contextlib.suppress(asyncio.CancelledError):
                    await forward
                status, outcome = CLIENT_GONE, "client disconnected"
        finally:
            detail: dict[str, Any] = {"rollout": rollout, "member": name, "status": status}
            if outcome != "ok":
                detail["outcome"] = outcome
            await asyncio.shield(self._journal(RELEASE, h.generation, detail))
            h.inflight -= 1
            self._maybe_ack(name)

    async def _forward(self, scope: Scope, body: bytes, headers: list[tuple[bytes, bytes]],
                       lease: Lease, epoch: int, send: Send) -> tuple[int, str]:
        assert self._session is not None
        out = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers
               if k.decode("latin-1").lower() not in _HOP
               and not k.lower().startswith(b"x-rolloutcore-")}
        token = self.config.engine_tokens.get(lease.engine)
        if token:
            out["authorization"] = f"Bearer {token}"
        out[GATEWAY_HEADER] = stamp(self.config.name, epoch)
        assert lease.url is not None
        url = lease.url.rstrip("/") + scope["path"]
        started = False
        try:
            async with self._session.post(url, data=body, headers=out) as up:
                resp_headers = [(k.encode(), v.encode()) for k, v in up.headers.items()
                                if k.lower() not in _HOP and k.lower() != "content-length"
                                ] + lease_headers(lease)
                if not up.headers.get("content-type", "").startswith("text/event-stream"):
                    data = await up.read()  # one answer: sent whole, with its length
                    await send({"type": "http.response.start", "status": up.status,
                                "headers": [*resp_headers, (b"content-length",
                                                            str(len(data)).encode())]})
                    started = True
                    await send({"type": "http.response.body", "body": data})
                    if up.status == 409:  # the engine's fence refused this epoch, or vLLM
                        return up.status, "fenced" if b"gateway_fenced" in data \
                            else "refused"
                    return up.status, "ok" if up.status == 200 else "refused"
                await send({"type": "http.response.start", "status": up.status,
                            "headers": resp_headers})
                started = True
                async for chunk in up.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk,
                                "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                return up.status, "ok" if up.status == 200 else "refused"
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            if not started:
                await _json(send, 502, _error(f"engine {lease.engine}: {type(e).__name__}",
                                              "engine_error"))
            return 502, "error"


class Durability:
    """Journal lines written on the event loop, made durable by one flusher thread: it
    fsyncs everything written so far, once for every record waiting, and wakes their
    waiters on the loop. A failed fsync fails every waiter and every later one (what
    reached the disk is unknown), as the journal's own group commit does."""

    def __init__(self, journal: Journal, loop: asyncio.AbstractEventLoop, *,
                 fsync: bool) -> None:
        self.journal, self.loop, self.fsync = journal, loop, fsync
        self.synced = journal.last_seq if fsync else 1 << 62
        self.error: BaseException | None = None
        self.fsyncs = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._want = 0
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="journal-flusher",
                                        daemon=True)
        if fsync:
            self._thread.start()

    async def durable(self, seq: int) -> None:
        if self.error is not None:
            raise JournalError(f"{self.journal.path}: an earlier fsync failed "
                               f"({self.error}): nothing more is acknowledged")
        if seq <= self.synced:
            return
        fut = self.loop.create_future()
        self._waiters.append((seq, fut))
        with self._cond:
            self._want = max(self._want, seq)
            self._cond.notify()
        await fut

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._want <= self.synced and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
            upto = self.journal.last_seq  # every line written before the fsync starts
            try:
                self.journal.sync()
            except (OSError, JournalError) as e:
                self.error = e
                self.loop.call_soon_threadsafe(self._wake, upto, e)
                return
            self.fsyncs += 1
            self.synced = upto
            self.loop.call_soon_threadsafe(self._wake, upto, None)

    def _wake(self, upto: int, error: BaseException | None) -> None:
        keep = []
        for seq, fut in self._waiters:
            if fut.done():
                continue
            if error is not None:
                fut.set_exception(JournalError(f"{self.journal.path}: fsync failed: {error}"))
            elif seq <= upto:
                fut.set_result(None)
            else:
                keep.append((seq, fut))
        self._waiters = keep

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(10)


def follower_server(follower: Follower) -> uvicorn.Server:
    """The uvicorn server the CLI runs a follower in (and tests, on a thread)."""
    return uvicorn.Server(uvicorn.Config(follower.app, lifespan="on", log_level="warning",
                                         timeout_keep_alive=65, timeout_graceful_shutdown=30))


async def _disconnect(receive: Receive) -> None:
    """Return once the client has gone away (its request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class LeaseLost(Exception):
    """The controller refused the call: this gateway's epoch has no lease there."""


def _code(obj: Any) -> Any:
    error = obj.get("error") if isinstance(obj, dict) else None
    return error.get("code") if isinstance(error, dict) else None


def _error(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


async def _json(send: Send, status: int, obj: dict[str, Any],
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


__all__ = ["Follower", "FollowerConfig", "follower_server"]
