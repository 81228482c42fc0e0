"""The fault proxy against a tiny in-test upstream (and, marked vllm, a real server).

Every timing claim here comes from a cause the test controls (an injected delay, a
hold it releases, an event it sets), never from how fast the machine is.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from rolloutcore.conformance.fault_proxy import Action, Exchange, Fault, FaultProxy

# A bound against a broken test, never a measurement.
BOUND = 10.0


class Upstream:
    """A threaded HTTP/1.1 server that counts hits per (method, path)."""

    def __init__(self) -> None:
        self.hits: Counter[tuple[str, str]] = Counter()
        self.lock = threading.Lock()
        # /stream sends its first chunk, then waits for this before the second.
        self.stream_gate = threading.Event()
        self.stream_finished = threading.Event()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.handle_any()

            def do_POST(self) -> None:
                self.handle_any()

            def do_PUT(self) -> None:
                self.handle_any()

            def handle_any(self) -> None:
                parts = urlsplit(self.path)
                with upstream.lock:
                    upstream.hits[(self.command, parts.path)] += 1
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if parts.path == "/stream":
                    self.stream()
                    return
                if parts.path.startswith("/status/"):
                    code = int(parts.path.rsplit("/", 1)[1])
                    self.send(code, b"upstream says " + str(code).encode(), "text/plain")
                    return
                echo = {
                    "method": self.command,
                    "path": parts.path,
                    "query": parts.query,
                    "body": body.decode(),
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "success": True,
                }
                self.send(200, json.dumps(echo).encode(), "application/json")

            def send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Upstream", "yes")
                self.end_headers()
                self.wfile.write(body)

            def stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.chunk(b"data: one\n\n")
                upstream.stream_gate.wait(BOUND)
                self.chunk(b"data: two\n\n")
                self.chunk(b"")
                upstream.stream_finished.set()

            def chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def count(self, method: str, path: str) -> int:
        with self.lock:
            return self.hits[(method, path)]


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    up.thread.start()
    try:
        yield up
    finally:
        up.server.shutdown()
        up.server.server_close()


@pytest.fixture
def proxy(upstream: Upstream) -> Iterator[FaultProxy]:
    upstream.hits.clear()
    upstream.stream_gate.clear()
    upstream.stream_finished.clear()
    with FaultProxy(upstream.url) as p:
        yield p


def client(proxy: FaultProxy, read: float = BOUND) -> httpx.Client:
    """Only the read deadline varies: that is what the delays are aimed at."""
    return httpx.Client(
        base_url=proxy.url, trust_env=False, timeout=httpx.Timeout(BOUND, read=read)
    )


def last(proxy: FaultProxy) -> Exchange:
    return proxy.wait_for(lambda xs: bool(xs) and xs[-1].done, BOUND)[-1]


# ---------------------------------------------------------------------- pass-through


def test_pass_through_and_keep_alive(proxy: FaultProxy, upstream: Upstream) -> None:
    with client(proxy) as c:
        r = c.post("/echo?a=1&b=%20x", content=b"hello", headers={"X-Test": "t1"})
        assert r.status_code == 200
        echo = r.json()
        assert echo["method"] == "POST"
        assert echo["path"] == "/echo"
        assert echo["query"] == "a=1&b=%20x"
        assert echo["body"] == "hello"
        assert echo["headers"]["x-test"] == "t1"
        assert echo["headers"]["host"] == urlsplit(upstream.url).netloc
        assert r.headers["x-upstream"] == "yes"
        assert r.headers["content-type"] == "application/json"
        r2 = c.get("/status/404")
        assert (r2.status_code, r2.content) == (404, b"upstream says 404")
        r3 = c.put("/echo", json={"k": [1, 2]})
        assert json.loads(r3.json()["body"]) == {"k": [1, 2]}
    xs = proxy.exchanges()
    assert [(x.method, x.path, x.query) for x in xs] == [
        ("POST", "/echo", "a=1&b=%20x"),
        ("GET", "/status/404", ""),
        ("PUT", "/echo", ""),
    ]
    # One client connection carried all three requests.
    assert len({x.connection for x in xs}) == 1
    assert all(x.fault is None and x.upstream_contacted and x.outcome == "replied" for x in xs)
    assert [(x.upstream_status, x.client_status) for x in xs] == [
        (200, 200),
        (404, 404),
        (200, 200),
    ]
    assert proxy.count("POST", "/echo") == 1 and proxy.count(path="/echo") == 2
    assert proxy.count() == 3


def test_stream_is_forwarded_chunk_by_chunk(proxy: FaultProxy, upstream: Upstream) -> None:
    with client(proxy) as c, c.stream("POST", "/stream") as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream"
        chunks = r.iter_raw()
        # The upstream cannot finish until the gate is set: this chunk came through
        # while the upstream's reply was still open.
        assert next(chunks) == b"data: one\n\n"
        assert not upstream.stream_finished.is_set()
        assert proxy.exchanges()[-1].upstream_done_at is None
        upstream.stream_gate.set()
        assert b"".join(chunks) == b"data: two\n\n"
    x = last(proxy)
    assert x.outcome == "replied" and x.upstream_done_at is not None


# ---------------------------------------------------------------------- actions


def test_drop_before_never_reaches_upstream(proxy: FaultProxy, upstream: Upstream) -> None:
    proxy.add(Fault.drop_before("POST", "/echo"))
    with client(proxy) as c:
        with pytest.raises(httpx.ReadError):
            c.post("/echo", content=b"x")
        assert c.post("/echo", content=b"x").status_code == 200  # times=1: used up
    assert upstream.count("POST", "/echo") == 1
    first, second = proxy.exchanges()
    assert first.fault is not None and first.fault.action is Action.DROP_BEFORE
    assert (first.outcome, first.upstream_contacted, first.upstream_status) == (
        "dropped",
        False,
        None,
    )
    assert first.client_status is None
    assert second.fault is None and second.outcome == "replied"


def test_drop_after_reaches_upstream_then_aborts(proxy: FaultProxy, upstream: Upstream) -> None:
    proxy.add(Fault.drop_after("POST", "/echo"))
    with client(proxy) as c, pytest.raises(httpx.ReadError):
        c.post("/echo", content=b"x")
    assert upstream.count("POST", "/echo") == 1
    x = last(proxy)
    assert (x.outcome, x.upstream_contacted, x.upstream_status, x.client_status) == (
        "dropped",
        True,
        200,
        None,
    )
    assert x.upstream_done_at is not None


def test_delay_before_client_times_out_and_request_arrives_late(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    proxy.add(Fault.delay_before("POST", "/echo", 60.0))
    with client(proxy, read=0.3) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/echo", content=b"x")
    x = proxy.wait_for(lambda xs: xs[-1].client_closed, BOUND)[-1]
    assert x.phase == "held_before" and not x.upstream_contacted
    assert upstream.count("POST", "/echo") == 0
    # Released (instead of waiting the 60 s): the request still reaches the engine,
    # after its caller gave up.
    assert proxy.release() == 1
    x = last(proxy)
    assert x.upstream_contacted and x.upstream_status == 200
    assert x.outcome == "client_gone" and x.client_status is None
    assert upstream.count("POST", "/echo") == 1


def test_delay_before_within_deadline(proxy: FaultProxy, upstream: Upstream) -> None:
    proxy.add(Fault.delay_before("GET", "/echo", 0.2))
    with client(proxy) as c:
        assert c.get("/echo").status_code == 200
    x = last(proxy)
    assert x.upstream_sent_at is not None
    assert x.upstream_sent_at - x.started_at >= 0.2  # the injected cause, a lower bound


def test_delay_after_effect_happened_but_client_times_out(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    proxy.add(Fault.delay_after("POST", "/echo", 60.0))
    with client(proxy, read=0.3) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/echo", content=b"x")
    x = proxy.wait_for(lambda xs: xs[-1].held, BOUND)[-1]
    assert x.phase == "held_after" and x.upstream_status == 200
    assert upstream.count("POST", "/echo") == 1
    assert proxy.release() == 1
    x = last(proxy)
    assert x.outcome == "client_gone" and x.client_closed and x.client_status is None


def test_delay_after_within_deadline(proxy: FaultProxy) -> None:
    proxy.add(Fault.delay_after("GET", "/echo", 0.2))
    with client(proxy) as c:
        assert c.get("/echo").json()["success"] is True
    x = last(proxy)
    assert x.finished_at is not None and x.upstream_done_at is not None
    assert x.finished_at - x.upstream_done_at >= 0.2


def test_hang_before_and_after_until_release(proxy: FaultProxy, upstream: Upstream) -> None:
    proxy.add(Fault.hang_before("POST", "/a"))
    proxy.add(Fault.hang_after("POST", "/b"))
    results: dict[str, int] = {}

    def call(path: str) -> None:
        with client(proxy) as c:
            results[path] = c.post(path).status_code

    threads = [threading.Thread(target=call, args=(p,)) for p in ("/a", "/b")]
    for t in threads:
        t.start()
    xs = proxy.wait_for(lambda xs: len(xs) == 2 and all(x.held for x in xs), BOUND)
    by_path = {x.path: x for x in xs}
    assert by_path["/a"].phase == "held_before" and not by_path["/a"].upstream_contacted
    assert by_path["/b"].phase == "held_after" and by_path["/b"].upstream_status == 200
    assert upstream.count("POST", "/a") == 0 and upstream.count("POST", "/b") == 1
    assert results == {}
    assert proxy.release() == 2
    for t in threads:
        t.join(BOUND)
    assert results == {"/a": 200, "/b": 200}
    assert upstream.count("POST", "/a") == 1
    assert proxy.release() == 0


def test_status_without_forwarding(proxy: FaultProxy, upstream: Upstream) -> None:
    proxy.add(Fault.status("POST", "/echo", 503, {"error": "injected"}))
    with client(proxy) as c:
        r = c.post("/echo")
        assert r.status_code == 503
        assert r.json() == {"error": "injected"}
        assert r.headers["content-type"] == "application/json"
        assert c.post("/echo").status_code == 200  # same connection still usable
    assert upstream.count("POST", "/echo") == 1
    x = proxy.exchanges()[0]
    assert (x.upstream_contacted, x.client_status, x.outcome) == (False, 503, "replied")


def test_status_after_forwards_then_replaces(proxy: FaultProxy, upstream: Upstream) -> None:
    proxy.add(Fault.status_after("POST", "/echo", 500, b"boom"))
    with client(proxy) as c:
        r = c.post("/echo")
    assert (r.status_code, r.content) == (500, b"boom")
    assert "x-upstream" not in r.headers
    assert upstream.count("POST", "/echo") == 1
    x = last(proxy)
    assert (x.upstream_status, x.client_status) == (200, 500)


def test_replace_body_keeps_status_and_fixes_length(proxy: FaultProxy, upstream: Upstream) -> None:
    proxy.add(Fault.replace_body("POST", "/echo", {"success": False}))
    proxy.add(Fault.replace_body("GET", "/status/404", b"raw"))
    with client(proxy) as c:
        r = c.post("/echo")
        assert r.status_code == 200 and r.json() == {"success": False}
        assert r.headers["content-length"] == str(len(r.content))
        assert r.headers["x-upstream"] == "yes"
        r = c.get("/status/404")
        assert (r.status_code, r.content) == (404, b"raw")
        assert r.headers["content-type"] == "text/plain"  # bytes keep the engine's type
    assert upstream.count("POST", "/echo") == 1


def test_empty_body(proxy: FaultProxy, upstream: Upstream) -> None:
    proxy.add(Fault.empty_body("POST", "/echo"))
    with client(proxy) as c:
        r = c.post("/echo")
        with pytest.raises(json.JSONDecodeError):
            r.json()
    assert (r.status_code, r.content, r.headers["content-length"]) == (200, b"", "0")
    assert upstream.count("POST", "/echo") == 1


def test_after_actions_buffer_a_stream(proxy: FaultProxy, upstream: Upstream) -> None:
    upstream.stream_gate.set()
    proxy.add(Fault.replace_body("POST", "/stream", "replaced"))
    with client(proxy) as c:
        r = c.post("/stream")
    assert (r.status_code, r.text) == (200, "replaced")
    assert r.headers["content-type"] == "text/plain; charset=utf-8"


# ---------------------------------------------------------------------- matching


def test_skip_and_times(proxy: FaultProxy, upstream: Upstream) -> None:
    proxy.add(Fault.status("GET", "/echo", 503, skip=1, times=2))
    with client(proxy) as c:
        codes = [c.get("/echo").status_code for _ in range(4)]
    assert codes == [200, 503, 503, 200]
    assert upstream.count("GET", "/echo") == 2
    assert proxy.faults() == []


def test_times_none_prefix_and_method(proxy: FaultProxy) -> None:
    proxy.add(Fault.status("GET", "/status/*", 418, times=None))
    with client(proxy) as c:
        assert [c.get(f"/status/{n}").status_code for n in (200, 201, 202)] == [418] * 3
        assert c.post("/status/200").status_code == 200  # other method
        assert c.get("/echo?x=/status/").status_code == 200  # query is not matched
    assert len(proxy.faults()) == 1
    proxy.clear()
    with client(proxy) as c:
        assert c.get("/status/200").status_code == 200


def test_first_added_fault_wins_and_every_fault_counts(proxy: FaultProxy) -> None:
    proxy.add(Fault.status("GET", "/echo", 501))
    proxy.add(Fault.status("*", "/echo", 502, skip=1))
    with client(proxy) as c:
        assert [c.get("/echo").status_code for _ in range(3)] == [501, 502, 200]


def test_wait_count(proxy: FaultProxy) -> None:
    proxy.add(Fault.hang_before("GET", "/echo", times=None))
    results: list[int] = []

    def call() -> None:
        with client(proxy) as c:
            results.append(c.get("/echo").status_code)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    proxy.wait_count(3, "GET", "/echo", timeout=BOUND)
    proxy.wait_for(lambda xs: sum(x.held for x in xs) == 3, BOUND)
    assert proxy.release() == 3
    for t in threads:
        t.join(BOUND)
    assert results == [200, 200, 200]
    with pytest.raises(TimeoutError):
        proxy.wait_count(4, timeout=0.05)


# ---------------------------------------------------------------------- isolation, log


def test_held_request_does_not_block_others(proxy: FaultProxy, upstream: Upstream) -> None:
    proxy.add(Fault.hang_after("POST", "/pause"))
    done = threading.Event()

    def pause() -> None:
        with client(proxy) as c:
            c.post("/pause?mode=wait")
        done.set()

    t = threading.Thread(target=pause)
    t.start()
    proxy.wait_for(lambda xs: any(x.held for x in xs), BOUND)
    with client(proxy) as c:
        for _ in range(3):
            assert c.get("/metrics").status_code == 200
    assert not done.is_set()
    held = next(x for x in proxy.exchanges() if x.path == "/pause")
    assert held.held and held.query == "mode=wait"
    proxy.release()
    t.join(BOUND)
    assert done.is_set()


def test_exchange_log_and_clear_log(proxy: FaultProxy) -> None:
    fault = proxy.add(Fault.drop_before("GET", "/echo"))
    with client(proxy) as c:
        with pytest.raises(httpx.ReadError):
            c.get("/echo?q=1")
        c.get("/echo")
    a, b = proxy.exchanges()
    assert (a.index, b.index) == (0, 1)
    assert a.fault == fault and a.fault.before and b.fault is None
    assert a.connection != b.connection  # the dropped connection is not reused
    assert a.query == "q=1" and a.finished_at is not None and a.duration is not None
    assert b.upstream_sent_at is not None and b.upstream_done_at is not None
    assert a.started_at <= b.started_at
    proxy.clear_log()
    assert proxy.exchanges() == []
    with client(proxy) as c:
        c.get("/echo")
    assert [x.index for x in proxy.exchanges()] == [2]


def test_upstream_unreachable_drops(upstream: Upstream) -> None:
    with FaultProxy("http://127.0.0.1:9") as p, client(p) as c:
        with pytest.raises(httpx.ReadError):
            c.get("/echo")
        x = last(p)
    assert x.outcome == "upstream_error" and x.upstream_contacted and x.error


def test_stop_ends_a_hang_without_forwarding(upstream: Upstream) -> None:
    upstream.hits.clear()
    p = FaultProxy(upstream.url).start()
    p.add(Fault.hang_before("POST", "/echo"))
    errors: list[BaseException] = []

    def call() -> None:
        try:
            with client(p) as c:
                c.post("/echo")
        except httpx.TransportError as err:
            errors.append(err)

    t = threading.Thread(target=call)
    t.start()
    p.wait_for(lambda xs: any(x.held for x in xs), BOUND)
    p.stop()
    t.join(BOUND)
    assert len(errors) == 1
    assert p.exchanges()[0].outcome == "stopped"
    assert upstream.count("POST", "/echo") == 0
    p.stop()  # idempotent


# ---------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "make",
    [
        lambda: Fault("GET", "/x", "bogus"),  # type: ignore[arg-type]
        lambda: Fault.delay_before("GET", "/x", -1.0),
        lambda: Fault.delay_after("GET", "/x", float("nan")),
        lambda: Fault.status("GET", "/x", 99),
        lambda: Fault.status_after("GET", "/x", 600),
        lambda: Fault.drop_before("GET", "x"),
        lambda: Fault.drop_before("GET", "/a*b"),
        lambda: Fault.drop_before("GET", "/a?b=1"),
        lambda: Fault.drop_before("", "/a"),
        lambda: Fault.drop_before("GET", "/a", skip=-1),
        lambda: Fault.drop_before("GET", "/a", times=0),
        lambda: Fault("GET", "/x", Action.DROP_BEFORE, seconds=1.0),
        lambda: Fault("GET", "/x", Action.DELAY_BEFORE),
        lambda: Fault("GET", "/x", Action.EMPTY_BODY, body=b"x"),
    ],
)
def test_bad_faults_raise(make: Any) -> None:
    with pytest.raises(ValueError):
        make()


def test_fault_properties() -> None:
    assert Fault.drop_before("get", "/x").method == "GET"
    assert Fault.status("GET", "/x", 500).before
    assert not Fault.empty_body("GET", "/x").before
    assert Fault("GET", "/x", "hang_after").action is Action.HANG_AFTER  # type: ignore[arg-type]
    assert Fault.replace_body("GET", "/x", "é").body == "é".encode()
    assert Fault.drop_before("GET", "/v1/*").matches("get", "/v1/completions")
    with pytest.raises(ValueError):
        FaultProxy("not a url")


# ---------------------------------------------------------------------- real vLLM


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_pause_held_after_takes_effect_and_stream_passes(vllm_pool: Any) -> None:
    with (
        vllm_pool.leased(1) as (srv,),
        FaultProxy(srv.url) as proxy,
        client(proxy, read=60.0) as c,
    ):
        proxy.add(Fault.delay_after("POST", "/pause", 600.0))
        with client(proxy, read=0.5) as short, pytest.raises(httpx.ReadTimeout):
            short.post("/pause", params={"mode": "wait"})
        held = proxy.wait_for(lambda xs: any(x.held for x in xs), 60.0)[-1]
        assert held.upstream_status == 200 and held.query == "mode=wait"
        # The caller timed out, yet the engine is paused: the ambiguous case.
        assert c.get("/is_paused").json() == {"is_paused": True}
        proxy.release()
        assert c.post("/resume").status_code == 200
        assert c.get("/is_paused").json() == {"is_paused": False}

        body = {"model": "tiny", "prompt": "hello", "max_tokens": 8, "stream": True}
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert len(events) >= 2
        assert json.loads(events[0][len("data: ") :])["choices"][0]["index"] == 0
