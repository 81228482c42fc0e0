"""The ASGI half of the gateway (Starlette): OpenAI routes passed through to the fleet's
engines under an admission, the admin API, ``/metrics``.

The OpenAI routes are served by raw ASGI code before Starlette's router (the gateway's
own CPU per request competes with the engines for the same cores); the rest goes
through Starlette. One exchange (:class:`_Exchange`): read and check the request
(nothing admitted for bad input), admit (bounded queue), forward with aiohttp, answer,
release. A watcher listens
for the client going away the whole time: queued, the wait is cancelled; forwarded, the
upstream stream is closed, which makes vLLM abort the request, and the rollout is then
released. The release and the record are written under a shield, so neither a
disconnect nor a shutdown can skip them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from rolloutcore.adapters.gateway_fence import GATEWAY_HEADER, LEADER_GATEWAY, stamp
from rolloutcore.adapters.http import is_loopback
from rolloutcore.engine.controller import Binding
from rolloutcore.fleet import FleetError, Lease, MigrationLost
from rolloutcore.gateway.collector import (
    Collector,
    blank_token_ids,
    event_data,
    parse_sse_events,
    rewrite_event,
    wants_injection,
)
from rolloutcore.gateway.core import Busy, Gateway, Refusal
from rolloutcore.gateway.episodes import (
    EpisodeRefused,
    TurnLease,
    check_episode_id,
    check_policy,
)
from rolloutcore.gateway.registry import GatewayRegistry, registry_routes
from rolloutcore.gateway.wire import (
    H_ENGINE,
    H_EPISODE,
    H_EPISODE_END,
    H_EPISODE_GROUP,
    H_EPISODE_POLICY,
    H_GENERATION,
    H_IDENTITY,
    H_LABEL,
    H_MAX_STALENESS,
    H_MIN_GENERATION,
    H_ROLLOUT,
    H_SEGMENT,
    H_SEQ,
    H_TURN,
)
from rolloutcore.trajectories.format import EpisodeTurn, Segment

log = logging.getLogger("rolloutcore.gateway")

#: Not forwarded either way: hop-by-hop, recomputed, or the gateway's own.
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                  "proxy-connection", "te", "trailer", "trailers", "transfer-encoding",
                  "upgrade", "host", "content-length", "accept-encoding", "date", "server"})
ADMIN_BODY_LIMIT = 64 << 10
CLIENT_GONE = 499  # nginx's "client closed request", for metrics only
#: path -> (method, endpoint label): served before Starlette's router, under an admission
OPENAI_ROUTES = {"/v1/completions": ("POST", "completions"),
                 "/v1/chat/completions": ("POST", "chat")}


def error_response(r: Refusal) -> JSONResponse:
    headers = {"retry-after": str(r.retry_after)} if r.retry_after is not None else {}
    if "committed_generation" in r.extra:
        headers["x-rolloutcore-committed-generation"] = str(r.extra["committed_generation"])
    if r.status == 401:
        headers["www-authenticate"] = "Bearer"
    return JSONResponse(r.body(), status_code=r.status, headers=headers)


def lease_headers(lease: Lease) -> list[tuple[bytes, bytes]]:
    return [(H_GENERATION.encode(), str(lease.generation).encode()),
            (H_IDENTITY.encode(), (lease.identity or "unknown").encode()),
            (H_ENGINE.encode(), lease.engine.encode()),
            (H_ROLLOUT.encode(), lease.rollout_id.encode()),
            (H_LABEL.encode(), lease.label.encode()),
            (H_SEQ.encode(), str(lease.seq).encode())]


def _bad(message: str, param: str | None = None, code: str = "invalid_request") -> Refusal:
    return Refusal(400, message, param=param, code=code)


#: Connection-level failures of the forwarded exchange (aiohttp's; a timeout is one too).
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
#: A pooled connection the engine closed as the request went out (its keep-alive ending,
#: seen under load): the request is sent once more, on another connection.
STALE_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


def engine_unreachable(e: BaseException) -> bool:
    """The engine was never reached: the connection could not be made."""
    return isinstance(e, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError)


def upstream_session(connect_s: float, read_s: float) -> aiohttp.ClientSession:
    """The one client to the engines (inside the event loop). aiohttp, not httpx: at
    concurrency 1 httpx's async client cost this gateway about 2 ms more per request, and
    at 64 in flight its pool did work in proportion to its connections on every event."""
    return aiohttp.ClientSession(
        # idle connections expire before vLLM's (uvicorn, 5 s) would close them
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_s, sock_read=read_s),
        auto_decompress=False, skip_auto_headers=("User-Agent", "Content-Type"))


class GatewayApp:
    """The Starlette application over a :class:`Gateway` (``.app``)."""

    def __init__(self, gateway: Gateway, registry: GatewayRegistry | None = None) -> None:
        """``registry``: remote gateways follow this fleet too (their routes are served)."""
        self.gw = gateway
        self.registry = registry
        self.upstream: aiohttp.ClientSession | None = None
        self.app = self
        remote = [] if registry is None else registry_routes(registry, self._refused)
        self.starlette = Starlette(
            routes=[*remote,
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/admin/status", self._admin_status, methods=["GET"]),
                Route("/admin/update", self._admin_update, methods=["POST"]),
                Route("/admin/readmit", self._admin_readmit, methods=["POST"]),
                Route("/admin/audit", self._admin_audit, methods=["POST"]),
                Route("/admin/floor", self._admin_floor, methods=["POST"]),
                Route("/v1/episodes/{episode}", self._episode, methods=["GET"]),
                Route("/v1/episodes/{episode}/end", self._episode_end, methods=["POST"]),
            ],
            exception_handlers={HTTPException: self._http_error, Exception: self._crash},
            lifespan=self._lifespan)

    @asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        cfg = self.gw.config
        self.upstream = upstream_session(cfg.connect_timeout_s, cfg.upstream_timeout_s)
        try:
            yield
        finally:
            await self.upstream.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = OPENAI_ROUTES.get(scope["path"]) if scope["type"] == "http" else None
        if route is None:
            await self.starlette(scope, receive, send)
            return
        method, endpoint = route
        if scope["method"] != method:
            r = Refusal(405, "Method Not Allowed", code="method_not_allowed")
            await error_response(r)(scope, receive, send)
            return
        try:
            await self._exchange(scope, receive, send, endpoint)
        except Exception as e:  # a bug: logged here, uvicorn answers 500 if nothing was sent
            log.error("internal error on %s: %s: %s", scope["path"], type(e).__name__, e)
            raise

    async def _http_error(self, _request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found" if exc.status_code == 404 else "method_not_allowed" \
            if exc.status_code == 405 else "invalid_request"
        return error_response(Refusal(exc.status_code, str(exc.detail), code=kind))

    async def _crash(self, _request: Request, exc: Exception) -> Response:
        log.error("internal error: %s: %s", type(exc).__name__, exc)
        return error_response(Refusal(500, f"internal error: {type(exc).__name__}",
                                      type="server_error", code="internal_error"))

    # -------------------------------------------------------------- OpenAI routes

    async def _exchange(self, scope: Scope, receive: Receive, send: Send, endpoint: str
                        ) -> None:
        """Check the request (a refusal admits nothing), then run the exchange."""
        cfg = self.gw.config
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        try:
            min_gen = _header_count(headers, H_MIN_GENERATION)
            staleness = _header_count(headers, H_MAX_STALENESS)
            episode = _episode_headers(headers)
            body, obj = b"", None
            if scope["method"] == "POST":
                body = await _read_body(receive, headers, cfg.max_body_bytes)
                obj = _check_body(body, cfg.model)
        except _ClientGone:
            return
        except Refusal as r:
            self.gw.metrics.requests.labels(endpoint, "none", str(r.status)).inc()
            log.info("refused %s: %d %s", scope["path"], r.status, r.message)
            await error_response(r)(scope, receive, send)
            return
        inject = False
        # only a rolling fleet ever has a member of the stream's generation to move it to
        # (an episode's turn never moves: its member's drain waits for it)
        movable = obj is not None and self.gw.fleet.rolling and episode is None \
            and movable_stream(endpoint, obj)
        if obj is not None and (self.gw.records is not None or movable) \
                and wants_injection(endpoint, obj):
            obj = {**obj, "return_token_ids": True}
            body, inject = json.dumps(obj).encode(), True
        await _Exchange(self, endpoint, scope, headers, body, obj, min_gen, inject,
                        None if H_MAX_STALENESS not in headers else staleness,
                        movable, episode)(receive, send)

    # ------------------------------------------------------------------ episodes

    async def _episode(self, request: Request) -> Response:
        """An episode's state: live or ended (why), its segment, its turns."""
        try:
            eid = check_episode_id(request.path_params["episode"])
            return JSONResponse(self.gw.episodes.get(eid))
        except EpisodeRefused as e:
            return error_response(_episode_refusal(e))

    async def _episode_end(self, request: Request) -> Response:
        """End an episode (idle: at once; a turn in flight: when it ends); its state."""
        try:
            eid = check_episode_id(request.path_params["episode"])
            out = await asyncio.get_running_loop().run_in_executor(
                self.gw.quick, self.gw.episodes.end, eid)
            return JSONResponse(out)
        except EpisodeRefused as e:
            return error_response(_episode_refusal(e))

    # ------------------------------------------------------------------ the rest

    async def _models(self, _request: Request) -> Response:
        """The served model, answered here: it generates nothing, so it takes no admission
        and never waits for an update (the header says the committed generation, not a
        binding)."""
        f, model = self.gw.fleet, self.gw.config.model
        self.gw.metrics.requests.labels("models", "none", "200").inc()
        return JSONResponse({"object": "list", "data": [{
            "id": model, "object": "model", "created": self.gw.started, "owned_by":
            "rolloutcore", "root": model, "parent": None}]},
            headers={H_GENERATION: str(f.committed)})

    async def _metrics(self, _request: Request) -> Response:
        return Response(self.gw.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def _health(self, _request: Request) -> Response:
        f = self.gw.fleet
        return JSONResponse({"status": "ok", "fleet": f.phase, "committed": f.committed})

    # ---------------------------------------------------------------- admin API

    def _authorize(self, request: Request) -> Refusal | None:
        token = self.gw.config.admin_token
        if token is None:  # no token: loopback clients only (and the CLI binds loopback)
            host = request.client.host if request.client else ""
            if not is_loopback(host):
                return Refusal(403, "the admin API has no token configured: loopback "
                               "clients only", code="forbidden")
            return None
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), token.encode()):
            return Refusal(401, "missing or wrong admin bearer token",
                           code="invalid_admin_token")
        return None

    def _refused(self, request: Request) -> Response | None:
        refused = self._authorize(request)
        return None if refused is None else error_response(refused)

    async def _admin_body(self, request: Request) -> dict[str, Any]:
        refused = self._authorize(request)
        if refused is not None:
            raise refused
        body = await _admin_body_bytes(request, ADMIN_BODY_LIMIT)
        if not body.strip():
            return {}
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            raise _bad("the body is not valid JSON") from None
        if not isinstance(obj, dict):
            raise _bad("the body must be a JSON object")
        return obj

    async def _admin(self, request: Request, op: Any) -> Response:
        try:
            obj = await self._admin_body(request)
            return await op(obj)  # type: ignore[no-any-return]
        except Refusal as r:
            log.info("admin %s refused: %d %s", request.url.path, r.status, r.message)
            return error_response(r)

    async def _admin_status(self, request: Request) -> Response:
        refused = self._authorize(request)
        if refused is not None:
            return error_response(refused)
        status = self.gw.status()
        if self.registry is not None:
            status["remote_gateways"] = self.registry.status()
        return JSONResponse(status)

    async def _admin_update(self, request: Request) -> Response:
        async def op(obj: dict[str, Any]) -> Response:
            _only(obj, {"checkpoint", "label", "min_serving", "wait"})
            wait = _flag(obj, "wait", True)
            try:
                fut = await anyio.to_thread.run_sync(
                    self.gw.start_update, obj.get("checkpoint"), obj.get("label"),
                    obj.get("min_serving"))
            except Busy as e:
                raise Refusal(409, str(e), code="busy") from None
            except ValueError as e:  # a bad checkpoint or field: nothing changed
                raise _bad(str(e), code="invalid_target") from None
            if not wait:
                return JSONResponse({"accepted": True}, status_code=202)
            try:
                report = await _wrap(fut)
            except FleetError as e:
                raise Refusal(409, str(e), code="fleet_not_ready") from None
            return JSONResponse({"published": report.published, "aborted": report.aborted,
                                 "committed": self.gw.fleet.committed,
                                 "report": report.as_json()})
        return await self._admin(request, op)

    async def _admin_readmit(self, request: Request) -> Response:
        async def op(obj: dict[str, Any]) -> Response:
            _only(obj, {"engine", "wait"})
            engine, wait = obj.get("engine"), _flag(obj, "wait", True)
            if not isinstance(engine, str) or engine not in self.gw.fleet.members:
                raise Refusal(404, f"no engine named {engine!r}; engines: "
                              f"{sorted(self.gw.fleet.members)}", param="engine",
                              code="unknown_engine")
            try:
                fut = self.gw.start_readmit(engine, who="gateway admin API")
            except Busy as e:
                raise Refusal(409, str(e), code="busy") from None
            if not wait:
                return JSONResponse({"accepted": True}, status_code=202)
            try:
                out = await _wrap(fut)
            except FleetError as e:
                raise Refusal(409, str(e), code="readmit_refused") from None
            return JSONResponse({"engine": engine, "outcome": out.trigger,
                                 "reason": out.reason, "committed": self.gw.fleet.committed})
        return await self._admin(request, op)

    async def _admin_audit(self, request: Request) -> Response:
        async def op(obj: dict[str, Any]) -> Response:
            _only(obj, {"engines"})
            try:
                fut = self.gw.start_audit(obj.get("engines"))
            except KeyError as e:
                raise Refusal(404, f"no engine named {e.args[0]}; engines: "
                              f"{sorted(self.gw.fleet.members)}", param="engines",
                              code="unknown_engine") from None
            except ValueError as e:
                raise _bad(str(e), param="engines") from None
            except Busy as e:
                raise Refusal(409, str(e), code="busy") from None
            try:
                out = await _wrap(fut)
            except FleetError as e:
                raise Refusal(409, str(e), code="audit_refused") from None
            return JSONResponse({"audits": {n: {"outcome": o.trigger, "reason": o.reason}
                                            for n, o in out.items()},
                                 "committed": self.gw.fleet.committed})
        return await self._admin(request, op)

    async def _admin_floor(self, request: Request) -> Response:
        async def op(obj: dict[str, Any]) -> Response:
            _only(obj, {"min_generation"})
            try:
                self.gw.set_floor(obj.get("min_generation"))  # type: ignore[arg-type]
            except ValueError as e:
                raise _bad(str(e), param="min_generation") from None
            return JSONResponse({"min_generation": self.gw.floor,
                                 "committed": self.gw.fleet.committed})
        return await self._admin(request, op)


def _episode_refusal(e: EpisodeRefused) -> Refusal:
    return Refusal(e.status, str(e), code=e.code,
                   type="invalid_request_error" if e.status < 500 else "server_error")


@dataclass(frozen=True)
class EpisodeAsk:
    """An episode's turn as its request names it."""

    episode: str
    policy: str | None  # as named (on its first turn)
    end: bool  # the turn ends the episode
    group: str | None  # the group it starts in


def _episode_headers(headers: Mapping[str, str]) -> EpisodeAsk | None:
    raw = headers.get(H_EPISODE)
    if raw is None:
        extra = [h for h in (H_EPISODE_POLICY, H_EPISODE_END, H_EPISODE_GROUP)
                 if h in headers]
        if extra:
            raise _bad(f"{', '.join(extra)} need {H_EPISODE}", param=H_EPISODE)
        return None
    end = headers.get(H_EPISODE_END, "false").strip().lower()
    if end not in ("true", "false"):
        raise _bad(f"{H_EPISODE_END} must be true or false", param=H_EPISODE_END)
    policy, group = headers.get(H_EPISODE_POLICY), headers.get(H_EPISODE_GROUP)
    try:
        eid = check_episode_id(raw.strip())
        if policy is not None:
            check_policy(policy)
        if group is not None:
            group = check_episode_id(group.strip())
    except EpisodeRefused as e:
        raise _episode_refusal(e) from None
    return EpisodeAsk(eid, policy, end == "true", group)


async def _wrap(fut: Any) -> Any:
    return await asyncio.wrap_future(fut)


def _only(obj: Mapping[str, Any], keys: set[str]) -> None:
    extra = set(obj) - keys
    if extra:
        raise _bad(f"unknown field(s) {sorted(extra)}; this takes {sorted(keys)}")


def _flag(obj: Mapping[str, Any], key: str, default: bool) -> bool:
    v = obj.get(key, default)
    if not isinstance(v, bool):
        raise _bad(f"{key} must be true or false", param=key)
    return v


def _header_count(headers: Mapping[str, str], name: str) -> int:
    """A header holding a generation count (0 if absent); a 400 if it is not one."""
    raw = headers.get(name)
    if raw is None:
        return 0
    try:
        n = int(raw.strip())
    except ValueError:
        n = -1
    if n < 0:
        raise _bad(f"{name} must be an integer >= 0, got {raw!r}", param=name)
    return n


def movable_stream(endpoint: str, obj: Mapping[str, Any]) -> bool:
    """Can this request's stream move to another member mid-way (in-flight migration)? A
    streamed completion of one prompt with one choice: it is continued elsewhere as the
    prompt plus the tokens so far, as token ids. Not with echo or prompt logprobs (the
    continuation's prompt is longer), nor with several choices or prompts."""
    prompt = obj.get("prompt")
    one_prompt = isinstance(prompt, str) or (
        isinstance(prompt, list) and bool(prompt)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt))
    return (endpoint == "completions" and obj.get("stream") is True and one_prompt
            and obj.get("n") in (None, 1) and obj.get("best_of") in (None, 1)
            and not obj.get("echo") and obj.get("prompt_logprobs") is None)


class _ClientGone(Exception):
    """The client went away before its request was read."""


def _too_big(limit: int) -> Refusal:
    return Refusal(413, f"the request body exceeds {limit} bytes", code="request_too_large")


async def _read_body(receive: Receive, headers: Mapping[str, str], limit: int) -> bytes:
    declared = headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise _bad("Content-Length is not a number")
        if int(declared) > limit:
            raise _too_big(limit)
    body = bytearray()
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _ClientGone
        body += msg.get("body", b"")
        if len(body) > limit:
            raise _too_big(limit)
        if not msg.get("more_body"):
            return bytes(body)


async def _admin_body_bytes(request: Request, limit: int) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_big(limit)
    return bytes(body)


def _check_body(body: bytes, model: str) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        raise _bad("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise _bad("the request body must be a JSON object", code="invalid_json")
    name = obj.get("model")
    if not isinstance(name, str) or not name:
        raise _bad("model is required (a string)", param="model")
    if name != model:
        raise Refusal(404, f"The model `{name}` does not exist; this gateway serves "
                      f"`{model}`", param="model", code="model_not_found")
    if "stream" in obj and not isinstance(obj["stream"], bool | None):
        raise _bad("stream must be true or false", param="stream")
    return obj


class _Exchange:
    """One checked request: admit, forward, answer, release."""

    def __init__(self, owner: GatewayApp, endpoint: str, scope: Scope,
                 headers: dict[str, str], body: bytes, obj: dict[str, Any] | None,
                 min_generation: int, inject: bool, max_staleness: int | None = None,
                 movable: bool = False, episode: EpisodeAsk | None = None) -> None:
        self.owner, self.gw = owner, owner.gw
        self.endpoint, self.path = endpoint, scope["path"]
        self.method = scope["method"]
        self.query = scope.get("query_string", b"").decode("latin-1")
        self.headers_in = headers
        self.body_out = body
        self.stream = bool(obj and obj.get("stream"))
        self.min_generation = min_generation
        self.max_staleness = max_staleness
        self.inject = inject
        self.movable = movable
        self.episode = episode  # an episode's turn: as its request names it
        self.turn: TurnLease | None = None
        self.collector = Collector(endpoint, obj) if (
            obj is not None and (self.gw.records is not None or movable)) else None
        self.segments: list[Segment] = []  # a migrated stream's parts left behind
        self.seam = 0  # tokens generated before the current part
        self.stream_id: tuple[Any, Any] | None = None  # the first part's id and created
        self.lease: Lease | None = None  # held until released
        self.bound: Lease | None = None  # the last lease, kept after its release
        self.failed_on: list[str] = []  # engines that could not be reached for it
        self.upstream: aiohttp.ClientResponse | None = None
        self.status: int | None = None  # what the client is sent
        self.outcome = "ok"
        self.done = False  # the engine's answer was read to its end
        self.cut = False  # the stream broke off mid-way (its engine failed, or its move)
        self.started = False  # the response's status and headers were sent
        self.complete = False  # the last message to the client is (being) sent
        self.gone = False  # the client went away before that
        self.t0 = self.started_at = 0.0

    async def __call__(self, receive: Receive, send: Send) -> None:
        cancel = threading.Event()  # ends a queued wait: the client left, or shutdown
        async with anyio.create_task_group() as tg:
            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                if not self.complete:  # (after the answer, receive says disconnect too)
                    self.gone = True
                    cancel.set()
                    tg.cancel_scope.cancel()

            tg.start_soon(watch)
            try:
                await self._run(send, cancel)
            finally:
                tg.cancel_scope.cancel()

    async def _run(self, send: Send, cancel: threading.Event) -> None:
        gw = self.gw
        self.t0, self.started_at = time.perf_counter(), time.time()
        # An engine that cannot be reached never saw the request: it is suspected (no
        # admission until an audit passes) and the request admitted anew, on another
        # member, at most once per other member.
        retries = 0 if self.episode else len(gw.fleet.members) - 1
        while await self._admit(send, cancel):
            try:
                await self._forward(send)
                return
            except UPSTREAM_ERRORS as e:
                lease = self.lease
                assert lease is not None
                retry = retries > 0 and not self.started and engine_unreachable(e)
                self.outcome = f"engine error: {type(e).__name__}"
                log.warning("%s on %s: %s: %s%s", lease.rollout_id, lease.engine,
                            type(e).__name__, e, " (admitted again)" if retry else "")
                await self._suspect(f"{type(e).__name__}: {e}", retried=retry)
                if retry:  # released (journalled 502), counted as an engine failure only
                    retries -= 1
                    self.failed_on.append(lease.engine)
                    self.status = 502
                    await self._finish_shielded(count=False)
                    self.outcome, self.status, self.upstream = "ok", None, None
                    continue
                if not self.started:  # nothing sent yet: say so
                    self.status = 502
                    await self._finish_shielded()
                    await self._send_refusal(send, Refusal(
                        502, f"engine {lease.engine} failed: {type(e).__name__}",
                        type="server_error", code="engine_error"))
                else:  # mid-stream: the record (marked broken) first, then the error event
                    self.cut = True
                    await self._finish_shielded()
                    await self._break_off(send, f"engine {lease.engine} failed mid-stream: "
                                                f"{type(e).__name__}")
                return
            except Exception as e:  # a fault of the gateway's own: the rollout is released
                # and recorded, and the client answered (an error, or an error event
                # mid-stream), never left with a connection closed without an answer
                log.exception("%s: the exchange failed", getattr(self.lease, "rollout_id", "?"))
                self.outcome = f"gateway error: {type(e).__name__}"
                self.cut = self.started
                if not self.started:
                    self.status = 500
                await self._finish_shielded()
                if self.gone:
                    return
                if not self.started:
                    await self._send_refusal(send, Refusal(
                        500, f"the gateway failed: {type(e).__name__}", type="server_error",
                        code="internal_error"))
                else:
                    await self._break_off(send, f"the gateway failed mid-stream: "
                                                f"{type(e).__name__}")
                return
            finally:
                if self.gone and not self.done:  # (after the last event, nothing was lost)
                    self.outcome = "client disconnected"
                await self._finish_shielded()

    async def _admit(self, send: Send, cancel: threading.Event) -> bool:
        """Admit (now, or from the queue); False if refused (the refusal is sent)."""
        gw = self.gw
        loop = asyncio.get_running_loop()
        try:
            with anyio.CancelScope(shield=True):  # a lease, once made, is never dropped
                if self.episode is not None:
                    ask = self.episode
                    try:
                        self.turn = await loop.run_in_executor(
                            gw.waits, gw.episodes.begin_turn, ask.episode, ask.policy,
                            self.endpoint, cancel, ask.group)
                    except EpisodeRefused as e:
                        raise _episode_refusal(e) from None
                    self.lease = self.bound = self.turn.lease
                    return True
                first = await loop.run_in_executor(
                    gw.quick, gw.admit_now, gw.new_rollout_id(), self.endpoint,
                    self.min_generation, tuple(self.failed_on), self.max_staleness)
                self.lease = self.bound = first if isinstance(first, Lease) else \
                    await loop.run_in_executor(gw.waits, gw.admit_queued, first, cancel)
            return True
        except Refusal as r:
            code = CLIENT_GONE if self.gone else r.status
            gw.metrics.requests.labels(self.endpoint, "none", str(code)).inc()
            if not self.gone:
                await self._send_refusal(send, r)
        except Exception as e:  # the journal failed: nothing was admitted that can be used
            log.error("admission failed: %s: %s", type(e).__name__, e)
            gw.metrics.requests.labels(self.endpoint, "none", "500").inc()
            await self._send_refusal(send, Refusal(
                500, f"admission failed: {type(e).__name__}", type="server_error",
                code="internal_error"))
        return False

    async def _suspect(self, error: str, *, retried: bool) -> None:
        lease = self.bound
        assert lease is not None
        await asyncio.get_running_loop().run_in_executor(
            self.gw.quick, lambda: self.gw.report_engine_failure(lease, error,
                                                                 retried=retried))

    async def _forward(self, send: Send) -> None:
        lease = self.lease
        assert lease is not None and lease.url is not None
        session = self.owner.upstream
        assert session is not None
        url = lease.url.rstrip("/") + self.path + (f"?{self.query}" if self.query else "")
        headers_out = self._upstream_headers(lease.engine)
        data_out = self.body_out or None
        try:
            self.upstream = up = await session.request(
                self.method, url, data=data_out, headers=headers_out, allow_redirects=False)
        except STALE_CONNECTION as e:
            if engine_unreachable(e):
                raise
            # Once more, on another connection. At worst the engine saw it twice, under
            # this one binding, and aborts the first as its connection is gone.
            log.info("%s: %s on a pooled connection to %s: retried once", lease.rollout_id,
                     type(e).__name__, lease.engine)
            self.upstream = up = await session.request(
                self.method, url, data=data_out, headers=headers_out, allow_redirects=False)
        headers = [(k.encode(), v.encode()) for k, v in up.headers.items()
                   if k.lower() not in _HOP] + lease_headers(lease) + self._turn_headers()
        streaming = self.stream and up.status == 200 and up.headers.get(
            "content-type", "").startswith("text/event-stream")
        self.status = up.status
        if up.status >= 500:  # suspected before the answer goes out
            await self._suspect(f"answered HTTP {up.status}", retried=False)
        if not streaming:
            data = await up.read()
            self.done = True
            if up.status == 200 and self.collector is not None:
                data = self._collect_body(data)
            await self._finish_shielded()  # released before the answer goes out
            await self._send(send, up.status, data, headers)
            return
        self.started = True
        await send({"type": "http.response.start", "status": up.status,
                    "headers": headers})  # the binding headers, before the first chunk
        parse = self.collector is not None
        buf = bytearray()
        if self.movable:
            if not await self._stream_movable(up, send, buf):
                self.cut = True  # broken off mid-way (the outcome says why)
                await self._finish_shielded()
                await self._break_off(send, self.outcome)
                return
        else:
            tail = b""
            async for chunk in up.content.iter_any():
                if parse:
                    buf += chunk
                    chunk = self._collect_events(buf)
                    if not chunk:
                        continue
                await self._send_chunk(send, chunk, tail)
                tail = chunk[-16:]
        self.done = True
        await self._finish_shielded()
        self.complete = True
        await send({"type": "http.response.body", "body": bytes(buf), "more_body": False})

    async def _break_off(self, send: Send, why: str) -> None:
        """End a stream that broke off mid-way with an error event (the form vLLM and
        OpenAI use for an error inside a stream), never a connection cut."""
        if self.complete or self.gone:
            return
        self.complete = True
        event = json.dumps({"error": {"message": why, "type": "server_error",
                                      "code": "engine_error"}})
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body",
                        "body": f"data: {event}\n\n".encode(), "more_body": False})

    async def _send_chunk(self, send: Send, chunk: bytes, tail: bytes) -> None:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        # the last event sent: a client may leave now (the openai client does)
        if not self.done and b"data: [DONE]" in tail + chunk:
            self.done = True

    async def _stream_movable(self, up: aiohttp.ClientResponse, send: Send,
                              buf: bytearray) -> bool:
        """Forward a movable stream. When its member starts to drain for an update, the
        rollout moves (the fleet's ``migrate``) to a member on its own generation and the
        stream goes on from there without a seam: the prompt plus the tokens sent so far,
        as token ids, with the same sampling parameters; the updating member does not
        wait for it. Where the spec allows no move, it stays and the drain waits. True
        once the stream has ended; False if it broke off (the outcome says why)."""
        gw = self.gw
        loop = asyncio.get_running_loop()
        drained = asyncio.Event()

        def signal() -> None:
            loop.call_soon_threadsafe(drained.set)

        lease = self.lease
        assert lease is not None
        token = gw.watch_drain(lease.engine, signal)
        try:
            while not await self._pump(up, send, buf, drained):
                drained.clear()
                body = self._continuation()
                lease = self.lease
                assert lease is not None  # (None only after a lost move, which returned)
                if body is None:
                    continue  # nothing left to move: it ends where it is
                try:
                    with anyio.CancelScope(shield=True):  # a move, once made, is kept
                        moved = await loop.run_in_executor(gw.quick, gw.migrate, lease)
                except MigrationLost as e:
                    self.lease = None  # released where it was; admitted nowhere
                    self.outcome = f"migration lost: {e}"
                    log.warning("%s", e)
                    return False
                if moved is None:
                    continue  # no member serves its generation: the drain waits for it
                assert self.collector is not None
                at = len(self.collector.tokens)
                self.segments.append(Segment(lease.engine, lease.seq, lease.generation,
                                             self.seam, at))
                self.seam = at
                self.lease = self.bound = moved
                gw.unwatch_drain(token)
                token = gw.watch_drain(moved.engine, signal)
                up.close()  # the member it left aborts what it still generates
                buf.clear()  # (an event cut in two is generated again)
                went_on = await self._open_continuation(moved, body)
                if went_on is None:
                    return False
                up = went_on
            return True
        finally:
            gw.unwatch_drain(token)

    async def _pump(self, up: aiohttp.ClientResponse, send: Send, buf: bytearray,
                    drained: asyncio.Event) -> bool:
        """Forward ``up``'s events until the stream ends (True) or ``drained`` is set
        (False; every event read so far is sent)."""
        waiter = asyncio.ensure_future(drained.wait())
        read: asyncio.Future[bytes] | None = None
        tail = b""
        try:
            while True:
                read = asyncio.ensure_future(up.content.readany())
                await asyncio.wait({read, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if read.done():
                    chunk = read.result()
                    if not chunk:
                        return True
                    buf += chunk
                    out = self._collect_events(buf)
                    if out:
                        await self._send_chunk(send, out, tail)
                        tail = out[-16:]
                    if self.done:
                        return True
                if waiter.done():
                    return False
        finally:
            for fut in (read, waiter):
                if fut is not None and not fut.done():
                    fut.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await fut

    def _continuation(self) -> bytes | None:
        """The request that goes on from the tokens sent so far; None if none is left
        to generate or the prompt's token ids are not known yet."""
        c = self.collector
        if c is None or not c.prompt:
            return None
        req = dict(c.request)
        done = len(c.tokens)
        left = c.max_tokens() - done
        if left < 1:
            return None
        req["prompt"] = [*c.prompt, *c.tokens]
        req["max_tokens"] = left
        if isinstance(req.get("min_tokens"), int):
            req["min_tokens"] = max(0, req["min_tokens"] - done)
        return json.dumps(req).encode()

    async def _open_continuation(self, lease: Lease, body: bytes
                                 ) -> aiohttp.ClientResponse | None:
        """Send the continuation to the member the rollout moved to; None (the stream
        breaks off, said in the outcome) unless it streams."""
        session = self.owner.upstream
        assert session is not None and lease.url is not None
        url = lease.url.rstrip("/") + self.path
        self.upstream = up = await session.request(
            "POST", url, data=body, headers=self._upstream_headers(lease.engine),
            allow_redirects=False)
        if up.status == 200 and up.headers.get("content-type", "").startswith(
                "text/event-stream"):
            return up
        self.status = up.status
        self.outcome = f"the continuation on {lease.engine} answered HTTP {up.status}"
        log.warning("%s: %s", lease.rollout_id, self.outcome)
        if up.status >= 500:
            await self._suspect(f"answered HTTP {up.status}", retried=False)
        return None

    def _turn_headers(self) -> list[tuple[bytes, bytes]]:
        if self.turn is None or self.episode is None:
            return []
        out = [(H_EPISODE.encode(), self.episode.episode.encode()),
               (H_SEGMENT.encode(), str(self.turn.segment).encode()),
               (H_TURN.encode(), str(self.turn.index).encode())]
        if self.turn.group is not None:
            out.append((H_EPISODE_GROUP.encode(), self.turn.group.encode()))
        return out

    def _upstream_headers(self, engine: str) -> dict[str, str]:
        out = {k: v for k, v in self.headers_in.items()
               if k.lower() not in _HOP and not k.lower().startswith("x-rolloutcore-")}
        out["accept-encoding"] = "identity"  # the stream is parsed for records
        token = self.gw.config.engine_tokens.get(engine)
        if token:
            out["authorization"] = f"Bearer {token}"
        epoch = self.gw.fleet.epoch
        if epoch is not None:  # a leader's gateway: a successor's fence ends what it sends
            out[GATEWAY_HEADER] = stamp(LEADER_GATEWAY, epoch)
        return out

    def _collect_body(self, data: bytes) -> bytes:
        assert self.collector is not None
        try:
            obj = json.loads(data)
        except ValueError:
            return data
        self.collector.feed(obj)
        if not self.inject:
            return data
        blank_token_ids(obj)
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    def _collect_events(self, buf: bytearray) -> bytes:
        assert self.collector is not None
        out = bytearray()
        for event in parse_sse_events(buf):
            payload = event_data(event)
            if payload is None or payload == b"[DONE]":
                out += event
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                out += event
                continue
            seam = self.movable and self._seam(obj)
            self.collector.feed(obj)
            if self.inject:
                blank_token_ids(obj)
            if self.inject or seam:
                event = rewrite_event(event, obj)
            out += event
        return bytes(out)

    def _seam(self, obj: Any) -> bool:
        """Make a continuation's event read as the first part's (its id and created; its
        longer prompt's token ids dropped; usage counted from the client's prompt).
        Whether the event was changed."""
        if not isinstance(obj, dict):
            return False
        if self.stream_id is None:
            self.stream_id = (obj.get("id"), obj.get("created"))
        if not self.seam and not self.segments:
            return False
        for key, value in zip(("id", "created"), self.stream_id, strict=True):
            if value is not None:
                obj[key] = value
        for choice in obj.get("choices") or ():
            if isinstance(choice, dict) and "prompt_token_ids" in choice:
                choice["prompt_token_ids"] = None
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int) \
                and isinstance(usage.get("completion_tokens"), int):
            usage["prompt_tokens"] -= self.seam
            usage["completion_tokens"] += self.seam
        return True

    async def _send_refusal(self, send: Send, r: Refusal) -> None:
        resp = error_response(r)
        await self._send(send, r.status, bytes(resp.body), [
            (k.encode(), v.encode()) for k, v in resp.headers.items()
            if k.lower() != "content-length"])

    async def _send(self, send: Send, status: int, body: bytes,
                    headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.started = True
        await send({"type": "http.response.start", "status": status, "headers": [
            *headers, (b"content-length", str(len(body)).encode())]})
        self.complete = True
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _finish_shielded(self, *, count: bool = True) -> None:
        with anyio.CancelScope(shield=True):
            await self._finish(count)

    async def _finish(self, count: bool) -> None:
        """Close the engine's answer (an unfinished one: vLLM aborts the request), then
        release the lease and write the record (``count``: in the requests answered).
        Runs once per lease."""
        lease, self.lease = self.lease, None
        if lease is None:
            return
        gw = self.gw
        if self.upstream is not None:
            if self.done:  # read to its end: the connection goes back to the pool
                self.upstream.release()
            else:  # closed under the engine, which aborts the request
                self.upstream.close()
        gone = self.outcome == "client disconnected"
        code = CLIENT_GONE if gone else self.status
        detail: dict[str, Any] = {"status": code}
        if self.outcome != "ok":
            detail["outcome"] = self.outcome
        if gone:
            gw.metrics.client_disconnects.inc()
        collector = self.collector if (self.done or self.cut) and self.status == 200 \
            else None
        cut = self.cut and not self.done
        seconds = time.perf_counter() - self.t0
        started_at = self.started_at

        first = self.segments[0] if self.segments else None
        segments = self.segments
        turn, episode = self.turn, self.episode

        def release() -> None:
            if turn is not None and episode is not None:  # the hold stays; the turn ends
                gw.episodes.end_turn(episode.episode, ok=self.status == 200 and not cut,
                                     end=episode.end, tokens=None if collector is None
                                     else len(collector.tokens))
                binding = Binding(lease.rollout_id, lease.generation, lease.identity,
                                  lease.seq)
            else:
                binding = gw.release(lease, detail)
            if collector is None or gw.records is None:
                return
            parts: tuple[Segment, ...] = ()
            if first is not None:  # the record is bound to where the rollout began
                parts = (*segments, Segment(lease.engine, lease.seq, lease.generation,
                                            segments[-1].end, len(collector.tokens)))
                binding = Binding(binding.rollout_id, binding.generation, binding.identity,
                                  first.seq, aborted=binding.aborted)
            rec = collector.record(binding, lease.label, started_at, seconds, parts,
                                   broken=cut, episode=None if turn is None or episode is None
                                   else EpisodeTurn(episode.episode, turn.segment, turn.index,
                                                    turn.group))
            if isinstance(rec, str):
                gw.metrics.records.labels("skipped").inc()
                log.info("no record for %s: %s", lease.rollout_id, rec)
            else:
                gw.records.write(rec)
                gw.metrics.records.labels("written").inc()

        await asyncio.get_running_loop().run_in_executor(gw.quick, release)
        if count:
            gw.metrics.requests.labels(self.endpoint, str(lease.generation), str(code)).inc()


__all__ = ["GatewayApp", "error_response"]
