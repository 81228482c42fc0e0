"""A fault-injecting HTTP/1.1 reverse proxy for conformance tests.

Conformance scenarios need a real vLLM engine to produce a precise outcome (a reply
past the caller's deadline, a dropped connection, a 500, an empty body, a
``{"success": false}`` body) from a *controlled cause*, not from how fast this machine
happens to be. The proxy sits between RolloutCore's HTTP adapter and the engine and
applies a programmable plan of faults to chosen requests.

Every fault says on which side of the engine it acts, because the two sides mean
different things to the control plane:

* **before** (``drop_before``, ``delay_before``, ``hang_before``, ``status``): the
  engine has not seen the request when the fault acts; a drop or a fixed status is a
  *proven no effect*. A delay or hang still forwards the request afterwards, even if
  the caller has given up: a late delivery, which is ambiguous to the caller.
* **after** (``drop_after``, ``delay_after``, ``hang_after``, ``status_after``,
  ``replace_body``, ``empty_body``): the engine has handled the request and produced
  its complete reply before the fault acts; the caller cannot tell what happened:
  *ambiguous*.

A drop resets the TCP connection (RST) with no HTTP response at all (httpx raises
``ReadError``), which is why the server side is asyncio streams plus ``h11``: an ASGI
server cannot do that cleanly. The exchange log records, per request, which fault
acted, whether the engine was contacted and what it answered, so that tests wait on
causes (``wait_for``), never on sleeps.

Example::

    with FaultProxy(server.url) as proxy:
        proxy.add(Fault.delay_after("POST", "/pause", 30.0))
        adapter = HttpAdapter(proxy.url)
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from types import TracebackType
from typing import Any, Literal, NoReturn

import h11
import httpx

__all__ = ["Action", "Exchange", "Fault", "FaultProxy", "Outcome", "Phase"]

# RFC 9110 7.6.1: meaningful for one hop only, never forwarded. Host and
# Content-Length are recomputed by httpx (upstream) and by us (client side).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)

UPSTREAM_TIMEOUT = 3600.0
_READ_SIZE = 65536


class Action(enum.StrEnum):
    DROP_BEFORE = "drop_before"
    DROP_AFTER = "drop_after"
    DELAY_BEFORE = "delay_before"
    DELAY_AFTER = "delay_after"
    HANG_BEFORE = "hang_before"
    HANG_AFTER = "hang_after"
    STATUS = "status"
    STATUS_AFTER = "status_after"
    REPLACE_BODY = "replace_body"
    EMPTY_BODY = "empty_body"

    @property
    def before(self) -> bool:
        """True if the fault acts before the request is forwarded."""
        return self in _BEFORE

    @property
    def contacts_upstream(self) -> bool:
        """False only for faults that never forward the request."""
        return self not in (Action.DROP_BEFORE, Action.STATUS)


_BEFORE = frozenset({Action.DROP_BEFORE, Action.DELAY_BEFORE, Action.HANG_BEFORE, Action.STATUS})
_TIMED = frozenset({Action.DELAY_BEFORE, Action.DELAY_AFTER})
_WITH_STATUS = frozenset({Action.STATUS, Action.STATUS_AFTER})
_WITH_BODY = frozenset({Action.STATUS, Action.STATUS_AFTER, Action.REPLACE_BODY})

BodyLike = bytes | str | Mapping[str, Any] | list[Any] | int | float | bool | None


def _encode_body(body: BodyLike) -> tuple[bytes, str | None]:
    """Bytes pass as they are; str is UTF-8 text; anything else is encoded as JSON."""
    if isinstance(body, bytes):
        return body, None
    if isinstance(body, str):
        return body.encode(), "text/plain; charset=utf-8"
    return json.dumps(body).encode(), "application/json"


@dataclass(frozen=True)
class Fault:
    """One rule of the fault plan.

    ``method`` is an HTTP method or ``"*"``; ``path`` is an exact path, or a prefix if it
    ends with ``*`` (the query string is never part of the match). Of the requests that
    match, counted from when the fault was added, the first ``skip`` pass untouched and
    the next ``times`` (``None``: all) get ``action``. Every fault counts every matching
    request; when several may act on one request, the one added first acts and only its
    ``times`` is consumed.

    Prefer the classmethod constructors (``Fault.drop_before("POST", "/pause")``).
    """

    method: str
    path: str
    action: Action
    seconds: float | None = None
    status_code: int | None = None
    body: bytes | None = None
    content_type: str | None = None
    skip: int = 0
    times: int | None = 1
    #: Only requests whose body contains these bytes match (e.g. one RPC method among the
    #: calls that share ``/collective_rpc``); see :meth:`when_body`.
    body_contains: bytes | None = None

    def __post_init__(self) -> None:
        try:
            action = Action(self.action)
        except ValueError:
            raise ValueError(f"unknown fault action {self.action!r}") from None
        object.__setattr__(self, "action", action)
        if not isinstance(self.method, str) or not self.method:
            raise ValueError("method must be a non-empty string")
        object.__setattr__(self, "method", self.method.upper())
        if not isinstance(self.path, str) or not self.path.startswith(("/", "*")):
            raise ValueError(f"path must start with '/' (or be '*'), got {self.path!r}")
        if "*" in self.path[:-1]:
            raise ValueError(f"'*' is only allowed at the end of a path, got {self.path!r}")
        if "?" in self.path:
            raise ValueError(f"path must not contain a query string, got {self.path!r}")
        if isinstance(self.skip, bool) or not isinstance(self.skip, int) or self.skip < 0:
            raise ValueError(f"skip must be an int >= 0, got {self.skip!r}")
        if self.times is not None and (
            isinstance(self.times, bool) or not isinstance(self.times, int) or self.times < 1
        ):
            raise ValueError(f"times must be an int >= 1 or None, got {self.times!r}")
        if action in _TIMED:
            s = self.seconds
            if isinstance(s, bool) or not isinstance(s, int | float) or not s >= 0:
                raise ValueError(f"{action}: seconds must be a number >= 0, got {s!r}")
            object.__setattr__(self, "seconds", float(s))
        elif self.seconds is not None:
            raise ValueError(f"{action} takes no seconds")
        if action in _WITH_STATUS:
            c = self.status_code
            if isinstance(c, bool) or not isinstance(c, int) or not 200 <= c <= 599:
                raise ValueError(f"{action}: status code must be an int in 200..599, got {c!r}")
        elif self.status_code is not None:
            raise ValueError(f"{action} takes no status code")
        if action in _WITH_BODY:
            if not isinstance(self.body, bytes):
                raise ValueError(f"{action}: body must be bytes, got {type(self.body).__name__}")
        elif self.body is not None or self.content_type is not None:
            raise ValueError(f"{action} takes no body")

    # -------------------------------------------------------------- constructors

    @classmethod
    def _make(
        cls,
        action: Action,
        method: str,
        path: str,
        skip: int,
        times: int | None,
        *,
        seconds: float | None = None,
        status_code: int | None = None,
        body: BodyLike | None = None,
        has_body: bool = False,
    ) -> Fault:
        data: bytes | None = None
        ctype: str | None = None
        if has_body:
            data, ctype = _encode_body(body)
        return cls(method, path, action, seconds, status_code, data, ctype, skip, times)

    @classmethod
    def drop_before(cls, method: str, path: str, *, skip: int = 0, times: int | None = 1) -> Fault:
        """Abort the client connection without forwarding: the engine never sees it."""
        return cls._make(Action.DROP_BEFORE, method, path, skip, times)

    @classmethod
    def drop_after(cls, method: str, path: str, *, skip: int = 0, times: int | None = 1) -> Fault:
        """Forward, wait for the complete reply, then abort the client connection."""
        return cls._make(Action.DROP_AFTER, method, path, skip, times)

    @classmethod
    def delay_before(
        cls, method: str, path: str, seconds: float, *, skip: int = 0, times: int | None = 1
    ) -> Fault:
        """Hold the request ``seconds`` (or until ``release()``), then forward it."""
        return cls._make(Action.DELAY_BEFORE, method, path, skip, times, seconds=seconds)

    @classmethod
    def delay_after(
        cls, method: str, path: str, seconds: float, *, skip: int = 0, times: int | None = 1
    ) -> Fault:
        """Forward, hold the complete reply ``seconds`` (or until ``release()``), send it."""
        return cls._make(Action.DELAY_AFTER, method, path, skip, times, seconds=seconds)

    @classmethod
    def hang_before(cls, method: str, path: str, *, skip: int = 0, times: int | None = 1) -> Fault:
        """Hold the request until ``release()`` (or ``stop()``), then forward it."""
        return cls._make(Action.HANG_BEFORE, method, path, skip, times)

    @classmethod
    def hang_after(cls, method: str, path: str, *, skip: int = 0, times: int | None = 1) -> Fault:
        """Forward, hold the complete reply until ``release()`` (or ``stop()``), send it."""
        return cls._make(Action.HANG_AFTER, method, path, skip, times)

    @classmethod
    def status(
        cls,
        method: str,
        path: str,
        code: int,
        body: BodyLike = b"",
        *,
        skip: int = 0,
        times: int | None = 1,
    ) -> Fault:
        """Reply ``code`` with ``body`` without forwarding: the engine never sees it."""
        return cls._make(
            Action.STATUS, method, path, skip, times, status_code=code, body=body, has_body=True
        )

    @classmethod
    def status_after(
        cls,
        method: str,
        path: str,
        code: int,
        body: BodyLike = b"",
        *,
        skip: int = 0,
        times: int | None = 1,
    ) -> Fault:
        """Forward, then reply ``code`` with ``body`` instead of the engine's reply."""
        return cls._make(
            Action.STATUS_AFTER,
            method,
            path,
            skip,
            times,
            status_code=code,
            body=body,
            has_body=True,
        )

    @classmethod
    def replace_body(
        cls, method: str, path: str, body: BodyLike, *, skip: int = 0, times: int | None = 1
    ) -> Fault:
        """Forward, then send the engine's status and headers with ``body`` instead.

        ``bytes`` are sent as they are (the engine's Content-Type kept); ``str`` as UTF-8
        text and anything else as JSON, with a matching Content-Type.
        """
        return cls._make(Action.REPLACE_BODY, method, path, skip, times, body=body, has_body=True)

    @classmethod
    def empty_body(cls, method: str, path: str, *, skip: int = 0, times: int | None = 1) -> Fault:
        """Forward, then send the engine's status and headers with an empty body."""
        return cls._make(Action.EMPTY_BODY, method, path, skip, times)

    # -------------------------------------------------------------- matching

    @property
    def before(self) -> bool:
        return self.action.before

    @property
    def contacts_upstream(self) -> bool:
        return self.action.contacts_upstream

    def matches(self, method: str, path: str, body: bytes = b"") -> bool:
        return _matches(self.method, self.path, method, path) and (
            self.body_contains is None or self.body_contains in body)

    def when_body(self, contains: bytes | str) -> Fault:
        """This fault, acting only on requests whose body contains ``contains``."""
        data = contains.encode() if isinstance(contains, str) else bytes(contains)
        if not data:
            raise ValueError("when_body needs a non-empty byte string")
        return replace(self, body_contains=data)


def _matches(want_method: str, want_path: str, method: str, path: str) -> bool:
    if want_method != "*" and want_method != method.upper():
        return False
    if want_path.endswith("*"):
        return path.startswith(want_path[:-1])
    return path == want_path


Phase = Literal["received", "held_before", "upstream", "held_after", "replying", "done"]
Outcome = Literal["replied", "dropped", "client_gone", "upstream_error", "stopped", "proxy_error"]


@dataclass(frozen=True)
class Exchange:
    """One request as the proxy saw it (a snapshot; times are ``time.monotonic()``).

    ``upstream_contacted``: the request was sent to the engine (it may have had an
    effect). ``client_status``: the status sent to the client, ``None`` if nothing was
    sent (dropped, client gone, or not yet). ``client_closed``: the client closed its
    connection before the reply began (e.g. it timed out during a hold).
    """

    index: int
    connection: int
    method: str
    path: str
    query: str
    fault: Fault | None
    phase: Phase
    outcome: Outcome | None
    upstream_contacted: bool
    upstream_status: int | None
    client_status: int | None
    client_closed: bool
    error: str | None
    started_at: float
    upstream_sent_at: float | None
    upstream_done_at: float | None
    finished_at: float | None

    @property
    def held(self) -> bool:
        """Currently held by a delay or hang."""
        return self.phase in ("held_before", "held_after")

    @property
    def done(self) -> bool:
        return self.phase == "done"

    @property
    def duration(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.started_at


@dataclass
class _Rule:
    fault: Fault
    seen: int = 0
    applied: int = 0

    def eligible(self) -> bool:
        return self.seen >= self.fault.skip and (
            self.fault.times is None or self.applied < self.fault.times
        )


@dataclass
class _Record:
    """The live, mutable side of an ``Exchange``: changed by the loop thread, read by
    others, always under the proxy's lock."""

    index: int
    connection: int
    method: str
    path: str
    query: str
    fault: Fault | None
    started_at: float
    phase: Phase = "received"
    outcome: Outcome | None = None
    upstream_contacted: bool = False
    upstream_status: int | None = None
    client_status: int | None = None
    client_closed: bool = False
    error: str | None = None
    upstream_sent_at: float | None = None
    upstream_done_at: float | None = None
    finished_at: float | None = None

    def snapshot(self) -> Exchange:
        return Exchange(**{f.name: getattr(self, f.name) for f in fields(Exchange)})


@dataclass
class _Conn:
    """One client connection: its h11 state and whether the client has closed it."""

    ident: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    h11: h11.Connection
    closed_by_client: bool = False
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)


class _Dropped(Exception):
    """The exchange ended without a reply (aborted or client gone); the connection is
    not used again."""


class FaultProxy:
    """A loopback HTTP/1.1 reverse proxy to ``upstream`` that applies a fault plan.

    The asyncio loop runs in a daemon thread; every public method is thread-safe and
    may be called while requests are in flight.
    """

    def __init__(self, upstream: str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.upstream = httpx.URL(upstream)
        if self.upstream.scheme not in ("http", "https") or not self.upstream.host:
            raise ValueError(f"upstream must be an http(s) URL, got {upstream!r}")
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._rules: list[_Rule] = []
        self._log: list[_Record] = []
        self._next_conn = 0
        self._next_index = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._stopping: asyncio.Event | None = None
        # Replaced by a fresh event on each release(): a hold waits on the event that
        # was current when it began, so a release ends exactly the holds in progress.
        self._release: asyncio.Event | None = None
        self._holding = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._client: httpx.AsyncClient | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("proxy not started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> FaultProxy:
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"fault proxy did not start within {timeout} s")
        if self._startup_error is not None:
            self._thread.join()
            raise RuntimeError("fault proxy failed to start") from self._startup_error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener, end holds, abort open connections. Idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        with contextlib.suppress(RuntimeError):  # the loop may have closed meanwhile
            loop.call_soon_threadsafe(self._set_stopping)
        thread.join(timeout)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ fault plan

    def add(self, fault: Fault) -> Fault:
        if not isinstance(fault, Fault):
            raise TypeError(f"expected a Fault, got {type(fault).__name__}")
        with self._lock:
            self._rules.append(_Rule(fault))
        return fault

    def clear(self) -> None:
        """Remove every fault (holds in progress go on until released)."""
        with self._lock:
            self._rules.clear()

    def faults(self) -> list[Fault]:
        """The faults that may still act."""
        with self._lock:
            return [
                r.fault for r in self._rules if r.fault.times is None or r.applied < r.fault.times
            ]

    def release(self) -> int:
        """End every delay and hang in progress; returns how many were held.

        Holds that begin later wait for the next release. To release a given request,
        first ``wait_for`` its exchange to be ``held``.
        """
        loop = self._loop
        if loop is None or not self._ready.is_set():
            return 0
        if threading.get_ident() == getattr(self._thread, "ident", None):
            return self._do_release()

        async def _go() -> int:
            return self._do_release()

        try:
            return asyncio.run_coroutine_threadsafe(_go(), loop).result(10.0)
        except RuntimeError:  # loop already closed: nothing is held any more
            return 0

    # ------------------------------------------------------------------ exchange log

    def exchanges(self) -> list[Exchange]:
        """Every request received since start (or ``clear_log()``), in arrival order."""
        with self._lock:
            return [r.snapshot() for r in self._log]

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def count(self, method: str = "*", path: str = "*", *, upstream: bool = False) -> int:
        """Requests received that match ``method``/``path`` (same rules as ``Fault``);
        with ``upstream=True`` only those forwarded to the engine."""
        with self._lock:
            return sum(
                1
                for x in self._log
                if _matches(method.upper(), path, x.method, x.path)
                and (x.upstream_contacted or not upstream)
            )

    def wait_for(
        self, predicate: Callable[[list[Exchange]], bool], timeout: float = 10.0
    ) -> list[Exchange]:
        """Block until ``predicate(exchanges())`` holds; return that list.

        Raises ``TimeoutError`` after ``timeout`` s (a bound against a broken test, not a
        measurement)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                log = [r.snapshot() for r in self._log]
                if predicate(log):
                    return log
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"exchange log condition not met in {timeout} s; last: {log[-5:]}"
                    )
                self._changed.wait(left)

    def wait_count(
        self, n: int, method: str = "*", path: str = "*", *, timeout: float = 10.0
    ) -> list[Exchange]:
        """Block until at least ``n`` matching requests have been received."""
        m = method.upper()
        return self.wait_for(
            lambda log: sum(1 for x in log if _matches(m, path, x.method, x.path)) >= n,
            timeout,
        )

    # ------------------------------------------------------------------ loop thread

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:
            if self._ready.is_set():
                raise
            self._startup_error = err
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._release = asyncio.Event()
        server = await asyncio.start_server(self._on_connect, self.host, self._requested_port)
        # No proxy variables from the environment, no deadline short of "forever" (the
        # caller's timeouts are what is under test) and no client default headers
        # (requests are built with httpx.Request and sent with send()).
        self._client = httpx.AsyncClient(
            trust_env=False,
            timeout=httpx.Timeout(UPSTREAM_TIMEOUT),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=20),
        )
        self._port = int(server.sockets[0].getsockname()[1])
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            server.close()
            # Cancelling (not releasing) ends the holds: a held request must not reach
            # the engine because the proxy was stopped.
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()
            await self._client.aclose()

    def _set_stopping(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    def _do_release(self) -> int:
        held = self._holding
        if self._release is not None:
            self._release.set()
            self._release = asyncio.Event()
        return held

    @contextlib.contextmanager
    def _edit(self) -> Iterator[None]:
        """Change records under the lock, then wake ``wait_for``."""
        with self._changed:
            yield
            self._changed.notify_all()

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        with self._lock:
            self._next_conn += 1
            ident = self._next_conn
        conn = _Conn(ident, reader, writer, h11.Connection(h11.SERVER))
        try:
            await self._serve(conn)
        except _Dropped:
            pass
        except h11.RemoteProtocolError:
            # A malformed request: answer 400 like any HTTP server, then close.
            with contextlib.suppress(Exception):
                await self._send(conn, h11.Response(status_code=400, headers=[]))
                await self._send(conn, h11.EndOfMessage())
        except (asyncio.CancelledError, Exception):
            _abort(writer)
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            self._tasks.discard(task)

    async def _serve(self, conn: _Conn) -> None:
        while True:
            got = await self._read_request(conn)
            if got is None:
                return
            await self._exchange(conn, *got)
            if (
                conn.closed_by_client
                or conn.h11.our_state is not h11.DONE
                or conn.h11.their_state is not h11.DONE
            ):
                return
            conn.h11.start_next_cycle()

    async def _read_request(self, conn: _Conn) -> tuple[h11.Request, bytes] | None:
        request: h11.Request | None = None
        parts: list[bytes] = []
        while True:
            event = conn.h11.next_event()
            if event is h11.NEED_DATA:
                if conn.h11.they_are_waiting_for_100_continue:
                    await self._send(conn, h11.InformationalResponse(status_code=100, headers=[]))
                conn.h11.receive_data(await conn.reader.read(_READ_SIZE))
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                return request, b"".join(parts)
            else:  # ConnectionClosed
                return None

    def _watch_client(self, conn: _Conn, rec: _Record) -> None:
        """While a request is held or forwarded, notice a client that gives up and closes
        (a caller's timeout); bytes it sends meanwhile (pipelining) are kept for h11."""

        async def watch() -> None:
            while True:
                try:
                    data = await conn.reader.read(_READ_SIZE)
                except OSError:  # a reset is a close too
                    data = b""
                if not data:
                    conn.closed_by_client = True
                    with self._edit():
                        rec.client_closed = True
                    return
                conn.h11.receive_data(data)

        conn.watcher = asyncio.create_task(watch())

    async def _exchange(self, conn: _Conn, request: h11.Request, body: bytes) -> None:
        method = request.method.decode("ascii", "replace").upper()
        target = bytes(request.target)
        path_b, _, query_b = target.partition(b"?")
        rec = self._begin(conn.ident, method, path_b.decode("latin-1"), query_b.decode("latin-1"),
                          body)
        fault = rec.fault
        self._watch_client(conn, rec)
        try:
            if fault is not None and fault.action is Action.DROP_BEFORE:
                self._drop(conn, rec)
            if fault is not None and fault.action is Action.STATUS:
                await self._reply_fixed(conn, rec, fault)
                return
            if fault is not None and fault.action in (Action.DELAY_BEFORE, Action.HANG_BEFORE):
                await self._hold(rec, "held_before", fault.seconds)
            response = await self._forward(conn, rec, request, method, target, body)
            try:
                if fault is None or fault.before:
                    await self._stream_back(conn, rec, method, response)
                else:
                    await self._after(conn, rec, fault, response)
            finally:
                await response.aclose()
        except asyncio.CancelledError:
            self._finish(rec, "stopped", error="proxy stopped")
            raise
        except (_Dropped, h11.RemoteProtocolError):
            raise
        except Exception as err:
            self._finish(rec, "proxy_error", error=f"{type(err).__name__}: {err}")
            raise
        finally:
            if conn.watcher is not None:
                conn.watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await conn.watcher
                conn.watcher = None

    async def _forward(
        self,
        conn: _Conn,
        rec: _Record,
        request: h11.Request,
        method: str,
        target: bytes,
        body: bytes,
    ) -> httpx.Response:
        assert self._client is not None
        base = self.upstream.raw_path.partition(b"?")[0].rstrip(b"/")
        # raw_path keeps the query string byte for byte (no re-encoding).
        url = self.upstream.copy_with(raw_path=base + target)
        headers = _end_to_end(request.headers.raw_items(), also=(b"host", b"content-length"))
        upstream_request = httpx.Request(method, url, headers=headers, content=body)
        with self._edit():
            rec.phase = "upstream"
            rec.upstream_contacted = True
            rec.upstream_sent_at = time.monotonic()
        try:
            return await self._client.send(upstream_request, stream=True)
        except httpx.HTTPError as err:
            # What the caller would see had the engine died mid-request: an aborted
            # connection; whether the engine acted is as unknown to it as to us.
            self._drop(conn, rec, "upstream_error", error=err)

    async def _stream_back(
        self, conn: _Conn, rec: _Record, method: str, response: httpx.Response
    ) -> None:
        status = response.status_code
        with self._edit():
            rec.upstream_status = status
        if conn.closed_by_client:
            await self._read_all(conn, rec, response)
            self._gone(rec)
        headers = _end_to_end(response.headers.raw)
        length = _body_length(method, status, headers)
        with self._edit():
            rec.phase = "replying"
            rec.client_status = status
        sent = 0
        try:
            if length == 0:
                self._complete(rec)
            await self._send(conn, h11.Response(status_code=status, headers=headers))
            # Chunk by chunk as the engine produces them (Server-Sent Events), not buffered.
            async for chunk in response.aiter_raw():
                if conn.closed_by_client:
                    self._gone(rec)
                if not chunk:
                    continue
                sent += len(chunk)
                if length is not None and sent >= length:
                    self._complete(rec)
                await self._send(conn, h11.Data(data=chunk))
            self._complete(rec)
            await self._send(conn, h11.EndOfMessage())
        except OSError as err:
            self._gone(rec, err)
        except httpx.HTTPError as err:
            # The engine broke off mid-reply: abort, so that the client cannot take a
            # truncated body for a complete one.
            self._drop(conn, rec, "upstream_error", error=err)

    async def _read_all(self, conn: _Conn, rec: _Record, response: httpx.Response) -> bytes:
        try:
            raw = b"".join([chunk async for chunk in response.aiter_raw()])
        except httpx.HTTPError as err:
            self._drop(conn, rec, "upstream_error", error=err)
        with self._edit():
            rec.upstream_done_at = time.monotonic()
        return raw

    async def _after(
        self, conn: _Conn, rec: _Record, fault: Fault, response: httpx.Response
    ) -> None:
        with self._edit():
            rec.upstream_status = response.status_code
        body = await self._read_all(conn, rec, response)
        action = fault.action
        if action is Action.DROP_AFTER:
            self._drop(conn, rec)
        if action in (Action.DELAY_AFTER, Action.HANG_AFTER):
            await self._hold(rec, "held_after", fault.seconds)
        if action is Action.STATUS_AFTER:
            await self._reply_fixed(conn, rec, fault)
            return
        headers = _end_to_end(response.headers.raw)
        if action in (Action.REPLACE_BODY, Action.EMPTY_BODY):
            # The new body is sent as it is: no stale length or encoding may describe it.
            dropped = {b"content-length", b"content-encoding"}
            body = fault.body if fault.body is not None else b""
            if fault.content_type is not None:
                dropped.add(b"content-type")
            headers = [(k, v) for k, v in headers if k.lower() not in dropped]
            if fault.content_type is not None:
                headers.append((b"content-type", fault.content_type.encode()))
            headers.append((b"content-length", str(len(body)).encode()))
        await self._reply(conn, rec, response.status_code, headers, body)

    async def _reply_fixed(self, conn: _Conn, rec: _Record, fault: Fault) -> None:
        assert fault.status_code is not None and fault.body is not None
        headers = [(b"content-length", str(len(fault.body)).encode())]
        if fault.content_type is not None:
            headers.append((b"content-type", fault.content_type.encode()))
        await self._reply(conn, rec, fault.status_code, headers, fault.body)

    async def _reply(
        self,
        conn: _Conn,
        rec: _Record,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> None:
        if conn.closed_by_client:
            self._gone(rec)
        with self._edit():
            rec.phase = "replying"
            rec.client_status = status
        data = conn.h11.send(h11.Response(status_code=status, headers=headers)) or b""
        if body:
            data += conn.h11.send(h11.Data(data=body)) or b""
        data += conn.h11.send(h11.EndOfMessage()) or b""
        self._complete(rec)
        try:
            conn.writer.write(data)
            await conn.writer.drain()
        except OSError as err:
            self._gone(rec, err)

    async def _send(self, conn: _Conn, event: h11.Event) -> None:
        data = conn.h11.send(event)
        if data:
            conn.writer.write(data)
            await conn.writer.drain()

    async def _hold(self, rec: _Record, phase: Phase, seconds: float | None) -> None:
        assert self._release is not None
        # Taken in the same loop step that marks the record held: a release() that sees
        # it held always ends this hold.
        released = self._release
        with self._edit():
            rec.phase = phase
        self._holding += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(released.wait(), seconds)
        finally:
            self._holding -= 1

    def _drop(
        self,
        conn: _Conn,
        rec: _Record,
        outcome: Outcome = "dropped",
        *,
        error: BaseException | None = None,
    ) -> NoReturn:
        _abort(conn.writer)
        self._finish(rec, outcome, None if error is None else _describe(error), amend=True)
        raise _Dropped

    def _gone(self, rec: _Record, error: BaseException | None = None) -> NoReturn:
        self._finish(rec, "client_gone", None if error is None else _describe(error), amend=True)
        raise _Dropped

    # ------------------------------------------------------------------ records

    def _begin(self, conn: int, method: str, path: str, query: str, body: bytes) -> _Record:
        with self._edit():
            fault: Fault | None = None
            for rule in self._rules:
                if not rule.fault.matches(method, path, body):
                    continue
                if fault is None and rule.eligible():
                    fault = rule.fault
                    rule.applied += 1
                rule.seen += 1
            rec = _Record(self._next_index, conn, method, path, query, fault, time.monotonic())
            self._next_index += 1
            self._log.append(rec)
            return rec

    def _complete(self, rec: _Record) -> None:
        """Mark the reply sent just *before* writing the bytes that complete it, so that a
        client holding a complete reply always finds its exchange done in the log (a
        failed write then amends the outcome)."""
        with self._edit():
            if rec.upstream_done_at is None and rec.upstream_contacted:
                # Only called once the engine's whole body is in hand.
                rec.upstream_done_at = time.monotonic()
        self._finish(rec, "replied")

    def _finish(
        self, rec: _Record, outcome: Outcome, error: str | None = None, *, amend: bool = False
    ) -> None:
        with self._edit():
            if rec.phase == "done" and not amend:
                return
            rec.phase = "done"
            rec.outcome = outcome
            rec.finished_at = time.monotonic()
            if error is not None:
                rec.error = error
            if outcome != "replied":
                rec.client_status = None


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def _body_length(method: str, status: int, headers: list[tuple[bytes, bytes]]) -> int | None:
    """Body bytes the client will expect, or None when only the end of the chunked (or
    close-delimited) body tells."""
    if method == "HEAD" or status in (204, 304) or status < 200:
        return 0
    for name, value in headers:
        if name.lower() == b"content-length":
            with contextlib.suppress(ValueError):
                return int(value)
    return None


def _end_to_end(
    raw: Iterable[tuple[bytes, bytes]], also: Iterable[bytes] = ()
) -> list[tuple[bytes, bytes]]:
    """The headers minus hop-by-hop ones (including those the Connection header names)."""
    items = [(bytes(k), bytes(v)) for k, v in raw]
    skip = {h.encode() for h in HOP_BY_HOP} | set(also)
    for name, value in items:
        if name.lower() == b"connection":
            skip |= {v.strip().lower() for v in value.split(b",") if v.strip()}
    return [(k, v) for k, v in items if k.lower() not in skip]


def _abort(writer: asyncio.StreamWriter) -> None:
    """Reset the TCP connection: with SO_LINGER 0, close() sends RST instead of FIN, so
    the client gets neither a response nor an orderly end, as when a server dies."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
