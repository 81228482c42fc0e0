"""The engine refuses requests from a gateway whose lease ended (spec/gateways.py: after
``lease_expire`` every engine refuses requests stamped with that gateway's epoch).

An ASGI middleware for vLLM's OpenAI server, loaded with its own extension point
(``--middleware rolloutcore.adapters.gateway_fence.GatewayFence``, in
:data:`rolloutcore.adapters.vllm_worker.SERVER_ARGS`): nothing in vLLM is patched. A
gateway stamps every request it forwards with ``x-rolloutcore-gateway: <id>;<epoch>``
(its lease's epoch). The engine keeps, per gateway, the lowest epoch it still serves (its
*fence*) and decides each stamped request with the failover spec's rule
(:func:`rolloutcore.spec.failover.accepts`, the same as for fenced loads): below the
fence, it is refused with 409 ``gateway_fenced`` before vLLM sees it. Raising a fence
(``POST /rc/gateway_fence {"gateway", "epoch"}``, monotonic) also ends the requests of
that gateway below it still running (their tasks cancelled: vLLM aborts a request whose
handler is cancelled, as when a client goes away) and answers once none is left, so the
controller holds evidence that nothing of that gateway's old epoch runs or can start.
``GET /rc/gateway_fence`` reads the fences and what runs per gateway. The name
:data:`ANY_REMOTE` fences every remote gateway at once (a new leader's takeover).

A request without a stamp is not this middleware's business (a client talking to the
engine directly, the controller's own probes). The state lives in the API server process
(one per engine by default): a restarted engine has no fences, so a controller fences
every expired gateway again before it admits the engine (as it fences loads).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from rolloutcore.spec.failover import accepts

GATEWAY_HEADER = "x-rolloutcore-gateway"
FENCE_PATH = "/rc/gateway_fence"
#: The gateway a leading controller hosts (``rolloutcore serve``): its lease is the
#: leader's, so it stamps the leader's epoch, and a new leader's fence (the takeover's,
#: :meth:`HttpAdapter.fence_epoch`) ends what a deposed one's gateway still forwards.
LEADER_GATEWAY = "rolloutcore"
#: The fence of every remote gateway at once (:mod:`rolloutcore.gateway.registry`), the
#: leader's own excepted: a new leader raises it at takeover to :func:`remote_floor` of
#: its epoch, which ends whatever the remote gateways of every earlier leader still send.
ANY_REMOTE = "*"
#: A remote gateway's epoch under a leader with epoch L is ``(L << 32) + n``.
REMOTE_EPOCH_SHIFT = 32
#: How long raising a fence waits for the cancelled requests to end before it answers.
CANCEL_WAIT_S = 10.0


def remote_floor(leader_epoch: int) -> int:
    """The lowest remote-gateway epoch a leader at ``leader_epoch`` issues."""
    return int(leader_epoch) << REMOTE_EPOCH_SHIFT

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def stamp(gateway: str, epoch: int) -> str:
    """The header value a gateway sends with every request it forwards."""
    return f"{gateway};{int(epoch)}"


def parse_stamp(value: str) -> tuple[str, int] | None:
    gateway, sep, epoch = value.rpartition(";")
    if not sep or not gateway:
        return None
    try:
        e = int(epoch)
    except ValueError:
        return None
    return (gateway, e) if e >= 0 else None


class GatewayFence:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.fences: dict[str, int] = {}
        #: gateway -> the tasks of its requests running here, with their epochs
        self.running: dict[str, dict[asyncio.Task[None], int]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] == FENCE_PATH:
            return await self._fence_route(scope, receive, send)
        value = _header(scope, GATEWAY_HEADER)
        if value is None:
            return await self.app(scope, receive, send)
        parsed = parse_stamp(value)
        if parsed is None:
            return await _json(send, 400, _error(f"malformed {GATEWAY_HEADER}: {value!r} "
                                                 "(expected <gateway>;<epoch>)", "bad_stamp"))
        gateway, epoch = parsed
        if gateway == ANY_REMOTE:
            return await _json(send, 400, _error(f"{ANY_REMOTE!r} names every remote "
                                                 "gateway, never one", "bad_stamp"))
        fence = self._fence_of(gateway)
        if not accepts(epoch, fence):
            return await _json(send, 409, _error(
                f"gateway {gateway} at epoch {epoch} is fenced (this engine serves its "
                f"epoch {fence} and later)", "gateway_fenced"))
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        task: asyncio.Task[None] = asyncio.ensure_future(self.app(scope, receive, tracked_send))
        self.running.setdefault(gateway, {})[task] = epoch
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():  # our own caller was cancelled: take the request along
                task.cancel()
                raise
            if not started:  # ended by a fence before its answer began
                await _json(send, 409, _error(f"gateway {gateway} at epoch {epoch} was "
                                              "fenced while its request ran",
                                              "gateway_fenced"))
        finally:
            self.running[gateway].pop(task, None)

    async def _fence_route(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "GET":
            return await _json(send, 200, self._status())
        if scope["method"] != "POST":
            return await _json(send, 405, _error("GET or POST", "method_not_allowed"))
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            obj = json.loads(body)
            gateway, epoch = obj["gateway"], obj["epoch"]
            if not isinstance(gateway, str) or not gateway or isinstance(epoch, bool) or \
                    not isinstance(epoch, int) or epoch < 0:
                raise ValueError("gateway: a non-empty string, epoch: an integer >= 0")
        except (ValueError, KeyError, TypeError) as e:
            return await _json(send, 400, _error(f"expected {{gateway, epoch}}: {e}",
                                                 "bad_fence"))
        raised = epoch > self.fences.get(gateway, 0)
        if raised:
            self.fences[gateway] = epoch
        below = self._below(gateway)
        for t in below:
            t.cancel()
        if below:
            await asyncio.wait(below, timeout=CANCEL_WAIT_S)
        left = len(self._below(gateway))
        return await _json(send, 200, {"gateway": gateway,
                                       "fence": self.fences.get(gateway, 0), "raised": raised,
                                       "cancelled": len(below), "running_below": left})

    def _fence_of(self, gateway: str) -> int:
        """The lowest epoch of ``gateway`` served here: its own fence, and for a remote
        gateway (any but the leader's) the fence of every remote gateway."""
        own = self.fences.get(gateway, 0)
        return own if gateway == LEADER_GATEWAY else max(own, self.fences.get(ANY_REMOTE, 0))

    def _below(self, gateway: str) -> list[asyncio.Task[None]]:
        """The requests running here that ``gateway``'s fence (every remote gateway's, for
        :data:`ANY_REMOTE`) no longer serves."""
        names = [g for g in self.running if g != LEADER_GATEWAY] \
            if gateway == ANY_REMOTE else [gateway]
        return [t for g in names for t, e in self.running.get(g, {}).items()
                if not accepts(e, self._fence_of(g))]

    def _status(self) -> dict[str, Any]:
        return {"fences": dict(self.fences),
                "running": {g: len(ts) for g, ts in self.running.items() if ts}}


def _header(scope: Scope, name: str) -> str | None:
    key = name.encode()
    for k, v in scope.get("headers", ()):
        if k.lower() == key:
            return bytes(v).decode("latin-1")
    return None


def _error(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


async def _json(send: Send, status: int, obj: dict[str, Any]) -> None:
    body = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


__all__ = ["ANY_REMOTE", "FENCE_PATH", "GATEWAY_HEADER", "LEADER_GATEWAY", "GatewayFence",
           "parse_stamp", "remote_floor", "stamp"]
