"""The control store: etcd, reached through its HTTP gateway (etcd3gw clients).

:func:`parse_store_url` reads ``etcd://host:port[,host:port...][/prefix]``; an
:class:`EtcdStore` is the few calls the controller needs (range, transaction, lease,
watch), each bounded by one deadline across every endpoint: a dead member of a cluster
costs a refused connection, not a hang, and a cluster without a quorum is
:class:`StoreUnavailable` once the deadline has passed.

A request that may have reached the server and got no clear answer (a read timeout, a
dropped connection, a server-side timeout) is retried on another member only when it is
idempotent (reads, lease refreshes); a write then raises :class:`StoreAmbiguous`: it
may or may not have been applied, and only its caller knows how to find out.
"""

from __future__ import annotations

import base64
import json
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests
from etcd3gw.client import Etcd3Client
from requests.adapters import HTTPAdapter

from rolloutcore.errors import BadInput, Refused, RolloutCoreError, Unreachable

SCHEME = "etcd"
DEFAULT_PORT = 2379
#: The key prefix when the URL has no path: the caller adds the fleet's name.
DEFAULT_PREFIX = "/rolloutcore"
# gRPC codes (the gateway's "code" field) that mean the member could not serve the
# request now: another member may, and a write may or may not have been applied
# (cancelled, unknown, deadline exceeded, resource exhausted, aborted, internal,
# unavailable).
_UNAVAILABLE_CODES = frozenset({1, 2, 4, 8, 10, 13, 14})
_NOT_FOUND = 5
_REFUSED_S = 2.0  # how long a member that refused a connection is tried last


class StoreUrlError(BadInput, ValueError):
    """A store URL that cannot be used (one line: what and why)."""


class StoreError(RolloutCoreError):
    """The store could not do what was asked."""


class StoreUnavailable(StoreError, Unreachable):
    """No endpoint answered in time, or the cluster has no quorum."""


class StoreAmbiguous(StoreUnavailable):
    """A write reached a member (or may have) and no clear answer came back: it may or
    may not have been applied."""


class StoreRejected(StoreError, Refused):
    """The store answered and refused the request (its gRPC code and message)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# ------------------------------------------------------------------------------ URLs


@dataclass(frozen=True)
class StoreUrl:
    endpoints: tuple[str, ...]  # "host:port", in the URL's order
    prefix: str  # "/a/b": no trailing slash

    @property
    def url(self) -> str:
        return f"{SCHEME}://{','.join(self.endpoints)}{self.prefix}"


_HOST = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9](?:[A-Za-z0-9.-]*"
                   r"[A-Za-z0-9])?))(?::(?P<port>[0-9]{1,5}))?$")
_PREFIX = re.compile(r"^(?:/[A-Za-z0-9._-]+)+$")


def is_store_url(s: str) -> bool:
    """Does ``s`` name a store (``etcd://...``) rather than a file?"""
    return s.lower().startswith(f"{SCHEME}://")


def parse_store_url(url: str, default_prefix: str = DEFAULT_PREFIX) -> StoreUrl:
    """``etcd://host:port[,host:port...][/prefix]`` as endpoints and a key prefix
    (``default_prefix`` when the URL has no path). A host without a port gets etcd's
    2379. Anything else raises :class:`StoreUrlError` with one line."""
    if not isinstance(url, str) or not url.strip():
        raise StoreUrlError("empty store URL: expected etcd://host:port[,host:port...][/prefix]")
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() != SCHEME:
        raise StoreUrlError(f"{text!r}: not an etcd URL (expected etcd://host:port[/prefix])")
    if any(c in rest for c in "?#@ "):
        raise StoreUrlError(f"{text!r}: no user, query or fragment allowed in an etcd URL")
    hosts, slash, path = rest.partition("/")
    if not hosts:
        raise StoreUrlError(f"{text!r}: no endpoint (expected etcd://host:port)")
    endpoints = []
    for part in hosts.split(","):
        m = _HOST.match(part)
        port = int(m.group("port")) if m and m.group("port") else DEFAULT_PORT
        if m is None or not 0 < port < 65536:
            raise StoreUrlError(f"{text!r}: bad endpoint {part!r} (expected host:port)")
        host = f"[{m.group('v6')}]" if m.group("v6") else m.group("name")
        endpoints.append(f"{host}:{port}")
    if len(set(endpoints)) != len(endpoints):
        raise StoreUrlError(f"{text!r}: an endpoint is listed twice")
    prefix = ("/" + path).rstrip("/") if slash else ""
    if not prefix:
        prefix = default_prefix.rstrip("/")
    if not _PREFIX.match(prefix):
        raise StoreUrlError(f"{text!r}: bad key prefix {prefix!r} (expected /name[/name...] "
                            "of letters, digits, '.', '_', '-')")
    return StoreUrl(tuple(endpoints), prefix)


# ----------------------------------------------------------------------- encoding


def b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(data: str) -> bytes:
    return base64.b64decode(data)


def prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with ``prefix`` (ASCII keys)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


@dataclass(frozen=True)
class KV:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def parse(cls, kv: Mapping[str, Any]) -> KV:
        # The gateway omits proto3 defaults (0, empty) and writes int64 as strings.
        return cls(unb64(kv["key"]).decode(), unb64(kv.get("value", "")),
                   int(kv.get("create_revision", 0)), int(kv.get("mod_revision", 0)),
                   int(kv.get("version", 0)), int(kv.get("lease", 0)))


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the transaction (its own, if it wrote)
    responses: list[dict[str, Any]]

    def kvs(self, i: int) -> list[KV]:
        """The keys of the ``i``-th response, a range."""
        r = self.responses[i].get("response_range", {})
        return [KV.parse(kv) for kv in r.get("kvs", [])]


# Transaction operations (the gateway's JSON for etcd's Compare and RequestOp).

def cmp_create(key: str, revision: int) -> dict[str, Any]:
    """The key's create revision equals ``revision`` (0: the key does not exist)."""
    return {"key": b64(key), "result": "EQUAL", "target": "CREATE",
            "create_revision": revision}


def cmp_version(key: str, version: int) -> dict[str, Any]:
    return {"key": b64(key), "result": "EQUAL", "target": "VERSION", "version": version}


def op_put(key: str, value: bytes, lease: int = 0) -> dict[str, Any]:
    put: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        put["lease"] = lease
    return {"request_put": put}


def op_delete(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(key)}}


def op_range(key: str) -> dict[str, Any]:
    return {"request_range": {"key": b64(key)}}


# -------------------------------------------------------------------------- store


class _NotSent(Exception):
    """The request never left this process (no connection): safe to send elsewhere."""


class _NoAnswer(Exception):
    """The request may have reached the member; no usable answer came back."""


class EtcdStore:
    """The etcd calls the controller needs, on the cluster at ``endpoints`` (``host:port``)
    under the key ``prefix``. Every call takes at most ``timeout_s`` in all (or the
    call's own ``timeout_s``), trying the members in turn from the one that last
    answered; thread-safe (one HTTP session per member, shared)."""

    def __init__(self, endpoints: Sequence[str], prefix: str = DEFAULT_PREFIX,
                 timeout_s: float = 2.0) -> None:
        if not endpoints:
            raise StoreUrlError("an etcd store needs at least one endpoint")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s}")
        self.endpoints = tuple(endpoints)
        self.prefix = prefix.rstrip("/")
        self.timeout_s = timeout_s
        self._clients = []
        for ep in self.endpoints:
            host, _, port = ep.rpartition(":")
            # /v3/ is etcd >= 3.4's gateway; naming it skips etcd3gw's discovery request
            # (which would not be bounded by our deadline).
            c = Etcd3Client(host=host.strip("[]"), port=int(port), api_path="/v3/")
            adapter = HTTPAdapter(pool_connections=1, pool_maxsize=32, max_retries=0)
            c.session.mount("http://", adapter)
            self._clients.append(c)
        self._preferred = 0  # the member that answered last
        self._refused: dict[int, float] = {}  # member -> when it last refused a connection

    @classmethod
    def from_url(cls, url: str, default_prefix: str = DEFAULT_PREFIX,
                 timeout_s: float = 2.0) -> EtcdStore:
        u = parse_store_url(url, default_prefix)
        return cls(u.endpoints, u.prefix, timeout_s)

    @property
    def url(self) -> str:
        return StoreUrl(self.endpoints, self.prefix).url

    def describe(self) -> str:
        """For messages: the store's URL (members and prefix)."""
        return self.url

    @property
    def current_endpoint(self) -> str:
        """The member tried first: the one that answered last."""
        return self.endpoints[self._preferred]

    def key(self, *parts: str) -> str:
        return "/".join((self.prefix, *parts))

    def close(self) -> None:
        for c in self._clients:
            c.session.close()

    def __enter__(self) -> EtcdStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------------- requests

    def _order(self) -> list[int]:
        """The member that answered last first, then the others; those that refused a
        connection in the last seconds last (a dead member costs nothing but a refused
        connect, and no share of the deadline)."""
        p, n = self._preferred, len(self._clients)
        now = time.monotonic()
        order = [(p + k) % n for k in range(n)]
        return sorted(order, key=lambda i: now - self._refused.get(i, -1e9) < _REFUSED_S)

    def _live_left(self, order: list[int], k: int) -> int:
        now = time.monotonic()
        return max(1, sum(1 for i in order[k:]
                          if now - self._refused.get(i, -1e9) >= _REFUSED_S))

    def _attempt(self, i: int, path: str, payload: Mapping[str, Any], connect: float,
                 read: float, *, stream: bool = False) -> requests.Response:
        c = self._clients[i]
        try:
            return c.session.post(c.get_url(path), data=json.dumps(payload),
                                  timeout=(connect, read), stream=stream)
        except requests.exceptions.ConnectTimeout as e:
            raise _NotSent(f"no connection in {connect:.2f} s") from e
        except requests.exceptions.ConnectionError as e:
            if _never_connected(e):
                raise _NotSent("connection refused") from e
            raise _NoAnswer(f"connection lost ({_short(e)})") from e
        except requests.exceptions.Timeout as e:
            raise _NoAnswer(f"no answer in {read:.2f} s") from e
        except requests.exceptions.RequestException as e:
            raise _NoAnswer(_short(e)) from e

    def request(self, path: str, payload: Mapping[str, Any], *, idempotent: bool,
                timeout_s: float | None = None) -> dict[str, Any]:
        """POST ``payload`` to the gateway's ``/v3/<path>`` and return the JSON answer.

        Members are tried in turn within one deadline. An idempotent request moves on
        after any failure (its budget shared among the members left); a write moves on
        only when it was never sent, and raises :class:`StoreAmbiguous` otherwise."""
        budget = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        order = self._order()
        failures: list[str] = []
        for k, i in enumerate(order):
            remaining = deadline - time.monotonic()
            if remaining <= 0.001:
                break
            # An idempotent request shares the time left among the members still to try
            # (a slow one must not starve the others); a write gets it all.
            share = remaining / self._live_left(order, k) if idempotent else remaining
            connect = min(max(share / 4, 0.05), 0.5, share)  # a live member accepts at once
            ep = self.endpoints[i]
            try:
                resp = self._attempt(i, path, payload, connect, max(share - connect, 0.001))
            except _NotSent as e:
                self._refused[i] = time.monotonic()
                failures.append(f"{ep}: {e}")
                continue
            except _NoAnswer as e:
                if not idempotent:
                    raise StoreAmbiguous(f"etcd {ep}: {path.strip('/')}: {e}; the write "
                                         "may or may not have been applied") from None
                failures.append(f"{ep}: {e}")
                continue
            try:
                body: dict[str, Any] = resp.json()
            except ValueError:
                body = {}
            if resp.status_code == 200:
                if not isinstance(body, dict) or not body:
                    if not idempotent:
                        raise StoreAmbiguous(f"etcd {ep}: {path.strip('/')}: an answer that "
                                             "is not JSON; the write may or may not have "
                                             "been applied")
                    failures.append(f"{ep}: an answer that is not JSON")
                    continue
                self._preferred = i
                return body
            code = int(body.get("code", 14 if resp.status_code >= 500 else 3))
            message = str(body.get("message") or body.get("error") or resp.reason)
            if code in _UNAVAILABLE_CODES:
                if not idempotent:
                    raise StoreAmbiguous(f"etcd {ep}: {path.strip('/')}: {message}; the write "
                                         "may or may not have been applied")
                failures.append(f"{ep}: {message}")
                continue
            raise StoreRejected(f"etcd {ep}: {path.strip('/')}: {message}", code)
        if not failures:
            failures.append("no time left")
        raise StoreUnavailable(f"etcd {','.join(self.endpoints)} unavailable within "
                               f"{budget:.1f} s: {'; '.join(failures)}")

    # ----------------------------------------------------------------- key-value

    def range(self, key: str, range_end: str | None = None, *, limit: int = 0,
              revision: int = 0, timeout_s: float | None = None
              ) -> tuple[list[KV], bool, int]:
        """Keys in ``[key, range_end)`` (just ``key`` without an end), ascending, at most
        ``limit`` (0: all), at ``revision`` (0: the latest; linearizable). Returns the
        keys, whether there are more, and the store's revision of the read."""
        payload: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            payload["range_end"] = b64(range_end)
        if limit:
            payload["limit"] = limit
        if revision:
            payload["revision"] = revision
        body = self.request("/kv/range", payload, idempotent=True, timeout_s=timeout_s)
        kvs = [KV.parse(kv) for kv in body.get("kvs", [])]
        return kvs, bool(body.get("more", False)), int(body["header"]["revision"])

    def get(self, key: str, *, timeout_s: float | None = None) -> KV | None:
        kvs, _, _ = self.range(key, timeout_s=timeout_s)
        return kvs[0] if kvs else None

    def txn(self, compare: Iterable[Mapping[str, Any]], success: Iterable[Mapping[str, Any]],
            failure: Iterable[Mapping[str, Any]] = (), *, idempotent: bool = False,
            timeout_s: float | None = None) -> TxnResult:
        """One transaction: ``success`` if every comparison holds, else ``failure``.
        ``idempotent``: sending it twice does no harm (it may then be retried)."""
        payload = {"compare": list(compare), "success": list(success),
                   "failure": list(failure)}
        body = self.request("/kv/txn", payload, idempotent=idempotent, timeout_s=timeout_s)
        return TxnResult(bool(body.get("succeeded", False)), int(body["header"]["revision"]),
                         list(body.get("responses", [])))

    # -------------------------------------------------------------------- leases

    def grant(self, ttl_s: float, *, timeout_s: float | None = None) -> tuple[int, int]:
        """A new lease of at least ``ttl_s`` (whole seconds, rounded up): (id, granted TTL).
        Retried like a read: a lease granted twice leaves one unused, expiring alone."""
        body = self.request("/lease/grant", {"TTL": max(1, math.ceil(ttl_s)), "ID": 0},
                            idempotent=True, timeout_s=timeout_s)
        if body.get("error"):
            raise StoreRejected(f"etcd lease grant: {body['error']}", 9)
        return int(body["ID"]), int(body["TTL"])

    def keepalive(self, lease: int, *, timeout_s: float | None = None) -> int:
        """Refresh a lease; its new TTL in seconds, or -1 if it no longer exists."""
        body = self.request("/lease/keepalive", {"ID": lease}, idempotent=True,
                            timeout_s=timeout_s)
        return int(body.get("result", {}).get("TTL", -1))  # no TTL: not found

    def time_to_live(self, lease: int, *, timeout_s: float | None = None) -> int:
        """Whole seconds left on a lease (-1: it does not exist)."""
        body = self.request("/lease/timetolive", {"ID": lease}, idempotent=True,
                            timeout_s=timeout_s)
        return int(body.get("TTL", 0))  # the gateway omits a 0; an expired lease says -1

    def revoke(self, lease: int, *, timeout_s: float | None = None) -> None:
        """Revoke a lease (its keys are deleted); a lease already gone is no error."""
        try:
            self.request("/lease/revoke", {"ID": lease}, idempotent=True, timeout_s=timeout_s)
        except StoreRejected as e:
            if e.code != _NOT_FOUND:
                raise

    # --------------------------------------------------------------------- watch

    def wait_deleted(self, key: str, after_revision: int, timeout_s: float) -> bool:
        """Wait until ``key`` is deleted after ``after_revision`` (a watch from the next
        revision, so a delete in between is not missed). True: deleted (or the watch was
        cancelled or compacted: look again); False: ``timeout_s`` passed first. Raises
        :class:`StoreUnavailable` if no member accepts the watch."""
        deadline = time.monotonic() + timeout_s
        payload = {"create_request": {"key": b64(key), "start_revision": after_revision + 1,
                                      "filters": ["NOPUT"]}}
        failures = []
        for i in self._order():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                resp = self._attempt(i, "/watch", payload, min(remaining, 0.5), remaining,
                                     stream=True)
            except (_NotSent, _NoAnswer) as e:
                failures.append(f"{self.endpoints[i]}: {e}")
                continue
            try:
                if resp.status_code != 200:
                    failures.append(f"{self.endpoints[i]}: HTTP {resp.status_code}")
                    continue
                return _watch_for_delete(resp)
            except requests.exceptions.RequestException:
                return False  # the read timed out (our deadline) or the stream broke
            finally:
                resp.close()
        raise StoreUnavailable(f"etcd {','.join(self.endpoints)}: cannot watch {key}: "
                               f"{'; '.join(failures)}")

    # --------------------------------------------------------------------- health

    def check(self, timeout_s: float | None = None) -> None:
        """Raise :class:`StoreUnavailable` unless a member answers and the cluster has a
        leader and serves a linearizable read (a quorum). A member that says it has no
        leader fails fast instead of waiting for the read to time out."""
        budget = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        notes = []
        for i in self._order():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            share = min(remaining, max(budget / len(self.endpoints), 0.2))
            try:
                resp = self._attempt(i, "/maintenance/status", {}, min(share / 2, 0.5),
                                     share / 2)
                status = resp.json() if resp.status_code == 200 else {}
            except (_NotSent, _NoAnswer, ValueError) as e:
                notes.append(f"{self.endpoints[i]}: {e}")
                continue
            errors = status.get("errors") or []
            if not status or int(status.get("leader", 0) or 0) == 0 or errors:
                notes.append(f"{self.endpoints[i]}: "
                             f"{'; '.join(errors) if errors else 'no leader'}")
                continue
            self._preferred = i
            self.range(self.key("leader"), timeout_s=max(deadline - time.monotonic(), 0.05))
            return
        raise StoreUnavailable(f"etcd {','.join(self.endpoints)} unavailable: "
                               f"{'; '.join(notes) or 'no time left'}")


def _watch_for_delete(resp: requests.Response) -> bool:
    for line in resp.iter_lines():
        if not line.strip():
            continue
        result = json.loads(line).get("result", {})
        if result.get("canceled") or int(result.get("compact_revision", 0) or 0):
            return True
        for ev in result.get("events", ()):
            if ev.get("type") == "DELETE":
                return True
    return True  # the stream ended: look again


def _never_connected(e: requests.exceptions.ConnectionError) -> bool:
    """Did this connection error happen before the request was sent (refused, no route,
    name not resolved)? urllib3 reports those as a NewConnectionError reason."""
    from urllib3.exceptions import MaxRetryError, NewConnectionError

    reason = e.args[0] if e.args else None
    if isinstance(reason, MaxRetryError):
        reason = reason.reason
    return isinstance(reason, NewConnectionError)


def _short(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."
