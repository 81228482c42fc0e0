"""Small helpers shared by tests: a step deadline, a bounded wait for a condition the test
itself causes, and an outcome decided from evidence."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from rolloutcore.engine import postconditions as post
from rolloutcore.spec.triggers import Op

#: Any wait on a condition: far above what it takes, so only a failure reaches it.
BOUND = 30.0

#: How late a bounded-time claim may come past its own deadline: the scheduling of a loaded
#: machine (CI runs these tests beside TLC). Far below what such a test rules out, a hang
#: the test releases only after the call returned, or a timeout of BOUND.
LATE_S = 5.0


def wait_until(pred: Callable[[], Any], what: str, timeout: float = BOUND) -> Any:
    """Poll a condition the test itself causes until it holds (returning what ``pred``
    returned); fail, never hang, past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.005)


def dl(seconds: float = 30.0) -> float:
    """A step deadline ``seconds`` from now (what the runner hands an adapter call)."""
    return time.monotonic() + seconds


def decided(op: Op, evidence: Any, expected: post.Expected | None = None) -> str:
    """The outcome trigger the postconditions name for one piece of evidence."""
    return post.decide(post.Decision(op, (evidence,), expected)).trigger


def dying_source(stream: bytes, keep: int) -> tuple[str, threading.Thread]:
    """An HTTP source that answers one request with the first ``keep`` bytes of ``stream``
    (its length declared in full) and closes: a source process that died while it
    streamed. Returns ``http://host:port`` and the thread serving it."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                             + f"Content-Length: {len(stream)}\r\n\r\n".encode()
                             + stream[:keep])

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", t
