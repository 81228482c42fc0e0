"""Peer sources: an engine that holds a generation's bytes (its verified staging, or what
it installed from one) serves them to another engine's staging, so the trainer sends each
update once per fleet rather than once per member.

The stream is a safetensors file (an 8-byte header length, a JSON header, the tensors'
bytes in sorted name order), so the receiver reads it as it reads a checkpoint: it checks
the header against its model's manifest before it keeps anything, digests every tensor as
it arrives, and the staging's identity must equal the target's, as from any source. A
source that dies mid-stream is a staging that did not complete (refused, never TAINTED):
the receiver's served weights are not touched by a staging.

The server is the standard library's threading HTTP server on the interface the
controller reaches the engine at; a request must carry the fleet's peer token (a shared
secret the controller hands every member), so the weights are not served to anyone who
can reach the port. Nothing here imports vLLM or torch: the worker passes raw bytes.
"""

from __future__ import annotations

import hmac
import http.client
import json
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from rolloutcore.engine.identity import safetensors_header
from rolloutcore.errors import RolloutCoreError

#: Where a source serves the bytes of one identity: ``PEER_PATH + identity``.
PEER_PATH = "/rc/peer/"
TOKEN_HEADER = "X-RolloutCore-Peer-Token"
#: The safetensors format's own limit on its JSON header.
_MAX_HEADER = 100 * 1024 * 1024

#: One tensor as it travels: name, safetensors dtype, shape, its raw bytes.
PeerTensor = tuple[str, str, tuple[int, ...], "bytes | bytearray | memoryview"]


class PeerSourceError(RolloutCoreError):
    """A peer source could not be read to the end: refused, unreachable, or a stream that
    ended early or is malformed. Raised while staging, so nothing served was touched."""


@dataclass(frozen=True)
class PeerEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def peer_url(host: str, port: int, identity: str) -> str:
    """Where a source at ``host:port`` serves the bytes whose identity is ``identity``."""
    bracketed = f"[{host}]" if ":" in host else host
    return f"http://{bracketed}:{port}{PEER_PATH}{identity}"


def is_peer_url(source: str) -> bool:
    return source.startswith("http://") and PEER_PATH in source


class PeerServer:
    """Serves ``lookup(identity)`` (the tensors of that identity, or None: not held) on
    ``host`` to requests that carry ``token``; ``port`` 0 picks a free one."""

    def __init__(self, lookup: Callable[[str], Sequence[PeerTensor] | None], *,
                 token: str, host: str = "127.0.0.1", port: int = 0) -> None:
        if not token:
            raise ValueError("a peer source needs a token")
        self.token = token
        self.served_bytes = 0  # what left this source (egress), over its lifetime
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return  # the engine's log is not the place for every transfer

            def do_GET(self) -> None:
                server._answer(self, lookup)

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.host, self.port = host, int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="rolloutcore-peer-source", daemon=True)
        self._thread.start()

    def _answer(self, h: BaseHTTPRequestHandler,
                lookup: Callable[[str], Sequence[PeerTensor] | None]) -> None:
        def refuse(status: int, why: str) -> None:
            body = why.encode()
            h.send_response(status)
            h.send_header("Content-Type", "text/plain")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)

        if not hmac.compare_digest(h.headers.get(TOKEN_HEADER, ""), self.token):
            return refuse(403, "no or another peer token")
        path = urlsplit(h.path).path
        if not path.startswith(PEER_PATH):
            return refuse(404, f"not a peer path: {path}")
        tensors = lookup(path[len(PEER_PATH):])
        if tensors is None:
            return refuse(404, f"this source holds no bytes of identity "
                          f"{path[len(PEER_PATH):][:16]}")
        head = safetensors_header(tensors)
        total = len(head) + sum(memoryview(t[3]).nbytes for t in tensors)
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(total))
        h.end_headers()
        h.wfile.write(head)
        for _name, _dtype, _shape, raw in tensors:
            h.wfile.write(raw)
        self.served_bytes += total

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class PeerStream:
    """One peer source read as a stream: :attr:`entries` (from its header) first, then
    :meth:`tensors` yields each tensor's bytes as they arrive. Every failure is a
    :class:`PeerSourceError` naming how far the stream got."""

    def __init__(self, url: str, token: str, timeout_s: float) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or not parts.path.startswith(
                PEER_PATH):
            raise PeerSourceError(f"not a peer source URL: {url!r}")
        self.url = url
        self.received = 0  # bytes read, header included
        self._conn = http.client.HTTPConnection(parts.hostname, parts.port or 80,
                                                timeout=timeout_s)
        try:
            self._conn.request("GET", parts.path, headers={TOKEN_HEADER: token})
            self._resp = self._conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise PeerSourceError(f"peer source {url}: {type(e).__name__}: {e}") from None
        if self._resp.status != 200:
            why = self._resp.read(300).decode(errors="replace")
            self.close()
            raise PeerSourceError(f"peer source {url}: HTTP {self._resp.status}: {why}")
        self.total = int(self._resp.getheader("Content-Length") or -1)
        self.entries = self._read_header()

    def _read(self, n: int) -> bytes:
        try:
            data = self._resp.read(n)
        except (OSError, http.client.HTTPException) as e:
            raise PeerSourceError(self._cut(f"{type(e).__name__}: {e}")) from None
        self.received += len(data)
        if len(data) != n:
            raise PeerSourceError(self._cut("the source closed the stream"))
        return data

    def _cut(self, what: str) -> str:
        return f"peer source {self.url}: {what} after {self.received} of {self.total} bytes"

    def _read_header(self) -> list[PeerEntry]:
        (n,) = struct.unpack("<Q", self._read(8))
        if n > _MAX_HEADER or (self.total >= 0 and 8 + n > self.total):
            raise PeerSourceError(f"peer source {self.url}: header length {n} does not fit")
        try:
            header = json.loads(self._read(n))
            entries: list[tuple[int, PeerEntry]] = []
            for name, meta in header.items():
                if name == "__metadata__":
                    continue
                begin, end = (int(x) for x in meta["data_offsets"])
                entries.append((begin, PeerEntry(str(name), str(meta["dtype"]),
                                                 tuple(int(d) for d in meta["shape"]),
                                                 end - begin)))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise PeerSourceError(f"peer source {self.url}: malformed header: {e}") from None
        entries.sort(key=lambda be: be[0])
        out = [entry for _b, entry in entries]
        offset = 0
        for begin, entry in entries:
            if begin != offset or entry.nbytes < 0:
                raise PeerSourceError(f"peer source {self.url}: {entry.name!r} is not "
                                      "where the stream has it (offsets not back to back)")
            offset += entry.nbytes
        if [x.name for x in out] != sorted(x.name for x in out):
            raise PeerSourceError(f"peer source {self.url}: tensors not in name order")
        if self.total >= 0 and 8 + n + offset != self.total:
            raise PeerSourceError(f"peer source {self.url}: the header's {offset} data "
                                  f"bytes do not fill the stream ({self.total} bytes)")
        return out

    def tensors(self) -> Iterator[tuple[PeerEntry, bytes]]:
        for e in self.entries:
            yield e, self._read(e.nbytes)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> PeerStream:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


__all__ = [
    "PEER_PATH",
    "TOKEN_HEADER",
    "PeerEntry",
    "PeerServer",
    "PeerSourceError",
    "PeerStream",
    "PeerTensor",
    "is_peer_url",
    "peer_url",
]
