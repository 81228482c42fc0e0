"""The gateway without vLLM, and the journal's group commit.

A :class:`Fleet` of simulated engines (adapters/sim.py) stands behind the gateway; each
engine's OpenAI API is played by a fake upstream (Starlette, on a real socket) that
answers with the simulator's reference tokens for the weights its engine holds at that
moment, and notes any request that arrived while the engine was paused or that saw the
weights change under it. Every timing here comes from a cause the test controls (a
stream held open by a gate it opens, a rollout it keeps bound, an injected clock, the
configured queue wait), never from the machine's speed; waits are bounded by
:data:`BOUND`, a bound against a broken test, never a measurement.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from helpers import wait_until
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rolloutcore import cli
from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.adapters.gateway_fence import FENCE_PATH, LEADER_GATEWAY, GatewayFence
from rolloutcore.adapters.sim import (
    FaultPlan,
    SimAdapter,
    SimEngine,
    reference_tokens,
    sim_identity,
    sim_target,
)
from rolloutcore.check.fleet_trace import check_fleet_file
from rolloutcore.engine.targets import TargetError
from rolloutcore.fleet import Fleet, Lease
from rolloutcore.gateway.app import GatewayApp
from rolloutcore.gateway.core import Gateway, GatewayConfig, StaleMode
from rolloutcore.gateway.server import ServerThread
from rolloutcore.journal import Journal, JournalError, read_journal
from rolloutcore.spec.lifecycle import Phase

BOUND = 10.0
MODEL = "tiny"
PROMPT = [7, 1, 4, 9, 2]
FAKE_LOGPROB = -0.5  # the logprob a fake engine reports for every token


# --------------------------------------------------------------------- fake upstream


class FakeEngine:
    """One engine's OpenAI API over its simulated engine's weights."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.lock = threading.Lock()
        self.received = 0
        self.running = 0
        self.completed = 0
        self.aborted = 0
        self.violations: list[str] = []

    def start(self) -> str:
        with self.lock:
            self.received += 1
            self.running += 1
            if self.engine.paused:
                self.violations.append("a request reached a paused engine")
        return self.engine.weights

    def sent(self, weights: str) -> None:
        """A token goes out: under the weights the request started on, or a violation."""
        if self.engine.weights != weights:
            with self.lock:
                self.violations.append("a token was sent across a mutation")

    def end(self, weights: str, ok: bool) -> None:
        # An aborted request (its client gone) may be torn down after its engine moved
        # on; what matters is that nothing it generated went out (``sent``).
        with self.lock:
            self.running -= 1
            if ok:
                self.completed += 1
            else:
                self.aborted += 1
            if ok and self.engine.weights != weights:
                self.violations.append("a request crossed a mutation")


class EngineDied(Exception):
    """Raised inside a fake engine's stream: the server cuts the connection mid-body."""


class FakeUpstream:
    """Engines at ``/e/<name>/v1/...``. ``x-test-hold: KEY`` holds an answer (after the
    first stream chunk) until the test opens gate KEY, ``x-test-hold-end: KEY`` a stream
    after its last event; ``x-test-fail: STATUS`` answers that status with an OpenAI
    error; ``x-test-die-longer-than: N`` cuts the connection after the first event of a
    prompt longer than N tokens (a migrated stream's continuation: its member died)."""

    def __init__(self) -> None:
        self.engines: dict[str, FakeEngine] = {}
        self.gates: defaultdict[str, threading.Event] = defaultdict(threading.Event)
        self.app = Starlette(routes=[
            Route("/e/{name}/v1/completions", self.completions, methods=["POST"]),
            Route("/e/{name}/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/e/{name}/v1/models", self.models, methods=["GET"])],
            middleware=[Middleware(GatewayFence)])  # as on a real engine
        self.url = ""

    def open_all(self) -> None:
        for g in list(self.gates.values()):
            g.set()

    async def _hold(self, request: Request, header: str = "x-test-hold") -> None:
        key = request.headers.get(header)
        if key:
            await anyio.to_thread.run_sync(self.gates[key].wait, 3 * BOUND,
                                           abandon_on_cancel=True)

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        fe = self.engines[request.path_params["name"]]
        fail = request.headers.get("x-test-fail")
        if fail:
            return JSONResponse({"error": {"message": "injected", "type": "InternalServerError",
                                           "param": None, "code": int(fail)}},
                                status_code=int(fail))
        body = await request.json()
        if chat:
            text = " ".join(m["content"] for m in body["messages"])
            prompt = [b % 1000 for b in text.encode()]
        else:
            prompt = list(body["prompt"])
        n = int(body.get("max_tokens", 16))
        ids = body.get("return_token_ids") is True
        weights = fe.start()
        toks = reference_tokens(weights, tuple(prompt), n)
        kind = "chat.completion" if chat else "text_completion"

        def choice(k: int | None, tokens: list[int], last: bool) -> dict[str, Any]:
            text = "".join(f" t{t}" for t in tokens)
            c: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None,
                                 "token_ids": tokens if ids else None}
            if chat:
                c["delta" if k is not None else "message"] = {"role": "assistant",
                                                              "content": text}
            else:
                c["text"] = text
                c["prompt_token_ids"] = prompt if ids and not k else None
                if body.get("logprobs") is not None:  # a fixed value: what is read back
                    c["logprobs"] = {"token_logprobs": [FAKE_LOGPROB] * len(tokens),
                                     "tokens": [f" t{t}" for t in tokens]}
            return c

        def top(obj: dict[str, Any], first: bool) -> dict[str, Any]:
            if chat:
                obj["prompt_token_ids"] = prompt if ids and first else None
            return obj

        if not body.get("stream"):
            ok = False
            try:
                await self._hold(request)
                ok = True
            finally:
                fe.end(weights, ok)
            return JSONResponse(top({"object": kind, "model": MODEL,
                                     "choices": [choice(None, list(toks), True)]}, True))

        async def events() -> AsyncIterator[bytes]:
            ok = False
            try:
                for k, t in enumerate(toks):
                    fe.sent(weights)
                    chunk = top({"object": kind + ".chunk" if chat else kind, "model": MODEL,
                                 "choices": [choice(k, [t], k == n - 1)]}, k == 0)
                    yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
                    if k == 0 and len(prompt) > int(request.headers.get(
                            "x-test-die-longer-than", 10**9)):
                        raise EngineDied("the engine died mid-stream")  # connection cut
                    if k == 0:
                        await self._hold(request)
                yield b"data: [DONE]\n\n"
                ok = True
                await self._hold(request, "x-test-hold-end")
            finally:
                fe.end(weights, ok)

        return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with fake_upstream() as up:
        yield up


@contextmanager
def fake_upstream() -> Iterator[FakeUpstream]:
    import uvicorn

    from rolloutcore.gateway.server import bind

    up = FakeUpstream()
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(up.app, log_level="warning", lifespan="off"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    wait_until(lambda: server.started, "the fake upstream to start")
    up.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield up
    finally:
        up.open_all()
        server.should_exit = True
        t.join(BOUND)
        sock.close()


# ------------------------------------------------------------------------- the rig


def target_of(checkpoint: str, generation: int, label: str) -> WeightTarget:
    if not checkpoint.startswith("ckpt-"):
        raise TargetError(f"{checkpoint}: no such checkpoint")
    return sim_target(generation, checkpoint, label=label)


@dataclass
class Rig:
    url: str
    gw: Gateway
    fleet: Fleet
    fakes: dict[str, FakeEngine]
    adapters: dict[str, SimAdapter]
    journal: Path
    records: Path
    upstream: FakeUpstream
    checkpoints: dict[int, str]  # generation -> checkpoint

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = httpx.get(f"{self.url}/metrics").text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)

    def update(self, checkpoint: str, label: str, **extra: Any) -> httpx.Response:
        r = httpx.post(f"{self.url}/admin/update", json={"checkpoint": checkpoint,
                                                          "label": label, **extra},
                       timeout=BOUND)
        if r.status_code == 200 and r.json()["published"]:
            self.checkpoints[r.json()["committed"]] = checkpoint
        return r

    def reference(self, generation: int, prompt: list[int], n: int) -> list[int]:
        return list(reference_tokens(self.checkpoints[generation], tuple(prompt), n))

    def bound(self) -> int:
        return sum(s.outstanding for s in self.fleet.status())

    def journal_records(self) -> list[dict[str, Any]]:
        return [x for x in read_journal(self.journal)[1] if x["type"] != "header"]

    def check(self) -> None:
        """What every test ends with: no engine saw a violation, nothing stays bound,
        the journal passes the fleet trace checker, the records verify against it."""
        for name, fe in self.fakes.items():
            assert fe.violations == [], (name, fe.violations)
        assert self.bound() == 0
        verdict = check_fleet_file(self.journal)
        assert verdict.accepted, verdict.message
        if self.records.exists() and self.records.stat().st_size:
            assert cli.main(["records", "verify", str(self.records), "--journal",
                             str(self.journal)]) == 0


@contextmanager
def rig(tmp_path: Path, upstream: FakeUpstream, *, names: tuple[str, ...] = ("a", "b"),
        min_serving: int | None = None, faults: dict[str, FaultPlan] | None = None,
        dead: tuple[str, ...] = (), clock: Callable[[], float] = time.monotonic,
        records: bool = True, max_live: int = 1, min_admitting: int = 0,
        **config: Any) -> Iterator[Rig]:
    prefix = uuid.uuid4().hex[:8]
    engines = {n: SimEngine("ckpt-1") for n in names}
    adapters = {n: SimAdapter(engines[n], (faults or {}).get(n)) for n in names}
    fakes = {n: FakeEngine(engines[n]) for n in names}
    members = []
    for n in names:
        upstream.engines[f"{prefix}{n}"] = fakes[n]
        url = "http://127.0.0.1:9" if n in dead else f"{upstream.url}/e/{prefix}{n}"
        members.append((n, adapters[n], url))
    journal = tmp_path / f"fleet-{prefix}.jsonl"
    rec_path = tmp_path / f"records-{prefix}.jsonl"
    fleet = Fleet(members, journal=journal, min_serving=min_serving, target_of=target_of,
                  max_live=max_live, min_admitting=min_admitting)
    fleet.bootstrap(sim_target(1, "ckpt-1", label="default"))
    assert fleet.phase == "READY"
    gw = Gateway(fleet, GatewayConfig(model=MODEL, records=rec_path if records else None,
                                      **config), target_of=target_of, clock=clock)
    server = ServerThread(gw)
    url = server.__enter__()
    try:
        yield Rig(url, gw, fleet, fakes, adapters, journal, rec_path, upstream,
                  {1: "ckpt-1"})
    finally:
        upstream.open_all()
        for a in adapters.values():
            a.release_hangs()
        server.__exit__(None, None, None)
        gw.close()


def completion(url: str, prompt: list[int] = PROMPT, n: int = 4, *,
               headers: dict[str, str] | None = None, **extra: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={
        "model": MODEL, "prompt": prompt, "max_tokens": n, "min_tokens": n,
        "temperature": 0, **extra}, headers=headers, timeout=BOUND)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised by the test when it looks
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


@contextmanager
def admissions_closed(r: Rig, checkpoint: str = "ckpt-2", label: str = "v2"
                      ) -> Iterator[None]:
    """Hold an update open: a rollout the test keeps bound makes the update's drain wait,
    so the fleet stays UPDATING (admissions closed) until the block ends."""
    lease = r.fleet.admit("held-by-the-test")
    t, box = in_thread(lambda: r.update(checkpoint, label))
    wait_until(lambda: r.fleet.phase == "UPDATING", "the update to close admissions")
    try:
        yield
    finally:
        r.fleet.release(lease)
        t.join(BOUND)
        assert box["value"].json()["published"], box


# ------------------------------------------------------------------ pass-through


def test_openai_client_streaming_and_not_bound_and_released(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    with rig(tmp_path, upstream) as r:
        client = openai.OpenAI(base_url=f"{r.url}/v1", api_key="unused", max_retries=0)
        ref = r.reference(1, PROMPT, 4)
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
            extra_body={"return_token_ids": True})
        out = raw.parse()
        assert raw.headers["x-rolloutcore-generation"] == "1"
        assert raw.headers["x-rolloutcore-identity"] == sim_identity("ckpt-1")
        assert raw.headers["x-rolloutcore-engine"] in ("a", "b")
        assert out.choices[0].token_ids == ref  # type: ignore[attr-defined]
        # streaming: the same tokens, the binding headers on the stream's response
        with client.completions.with_streaming_response.create(
                model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, stream=True) as s:
            assert s.headers["x-rolloutcore-generation"] == "1"
            text = "".join(c.choices[0].text for c in s.parse())
        assert text == "".join(f" t{t}" for t in ref)
        chat = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert chat.headers["x-rolloutcore-generation"] == "1"
        assert chat.parse().choices[0].message.content
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
            stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
            chat.parse().choices[0].message.content
        models = client.models.with_raw_response.list()
        assert [m.id for m in models.parse()] == [MODEL]
        assert models.headers["x-rolloutcore-generation"] == "1"
        # records asked for token ids the client did not: it still sees what vLLM
        # sends without them
        plain = completion(r.url).json()["choices"][0]
        assert plain["token_ids"] is None and plain["prompt_token_ids"] is None
        admits = [x for x in r.journal_records() if x["step"] == "admit"]
        releases = [x for x in r.journal_records() if x["step"] == "release"]
        assert len(admits) == len(releases) == 5  # the model list generates nothing
        assert all(x["detail"]["via"] == "gateway" for x in admits)
        records = [json.loads(line) for line in r.records.read_text().splitlines()]
        assert len(records) == 5
        first = records[0]
        assert first["response_token_ids"] == ref and first["prompt_token_ids"] == PROMPT
        assert first["binding"]["seq"] == admits[0]["seq"]
        assert first["binding"]["identity"] == sim_identity("ckpt-1")
        r.check()


def _stream_tokens(url: str, prompt: list[int], n: int, gate: str,
                   headers: dict[str, str] | None = None) -> dict[str, Any]:
    """A streamed completion held by the engine after each part's first chunk (gate);
    its headers, events and the tokens its text spells."""
    with httpx.stream("POST", f"{url}/v1/completions",
                      headers={"x-test-hold": gate, **(headers or {})},
                      json={"model": MODEL, "prompt": prompt, "max_tokens": n,
                            "temperature": 0, "stream": True}, timeout=3 * BOUND) as resp:
        events = [json.loads(line[6:]) for line in resp.iter_lines()
                  if line.startswith("data: {")]
        text = "".join(e["choices"][0]["text"] for e in events if "choices" in e)
        return {"status": resp.status_code, "headers": dict(resp.headers), "events": events,
                "tokens": [int(t[1:]) for t in text.split()]}


def test_a_stream_moves_off_a_draining_member_and_goes_on_without_a_seam(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    """A rolling update (K=2, C=2) under three held streams, one per member: each
    member that drains hands its streams to a member still on generation 1 instead of
    waiting for them; a client sees one stream with the greedy tokens of generation 1;
    the record lists every segment (member, admission, span) and verifies against the
    journal. The streams are held by a gate the test opens once the last member on
    generation 1 drains: there, no move is left and the drain waits for them."""
    n = 6
    prompts = {k: [k + 1, *PROMPT] for k in range(3)}
    with rig(tmp_path, upstream, names=("a", "b", "c"), min_serving=2, max_live=2,
             min_admitting=2) as r:
        threads = []
        for k in range(3):
            threads.append(in_thread(functools.partial(_stream_tokens, r.url, prompts[k], n,
                                                       "g")))
            wait_until(lambda k=k: r.bound() == k + 1, "the stream to be admitted")
        wait_until(lambda: all(fe.running == 1 for fe in r.fakes.values()),
                   "one held stream on every member")
        upd, box = in_thread(lambda: r.update("ckpt-2", "v2"))
        # a (the wave) hands its stream to b; c (caught up first: fewer rollouts) hands
        # its own to b; b, last on generation 1, keeps all three
        b = r.fleet.members["b"]
        wait_until(lambda: b.controller.phase is Phase.DRAINING and b.outstanding == 3,
                   "the last member on generation 1 to drain, holding every stream")
        assert r.metric("rolloutcore_gateway_migrations_total", outcome="moved") == 2
        upstream.gates["g"].set()
        outs = []
        for t, out in threads:
            t.join(3 * BOUND)
            outs.append(out["value"])
        upd.join(3 * BOUND)
        rep = box["value"].json()
        assert rep["published"] and rep["report"]["waves"] == [["a"], ["c"], ["b"]], rep
        for k, out in enumerate(outs):
            assert out["status"] == 200
            assert out["headers"]["x-rolloutcore-generation"] == "1"
            assert out["tokens"] == r.reference(1, prompts[k], n), (k, out)
            # the client never sees the continuation's longer prompt, nor token ids it
            # did not ask for
            assert all(e["choices"][0].get("prompt_token_ids") is None and
                       e["choices"][0].get("token_ids") is None for e in out["events"])
        records = {x["binding"]["rollout_id"]: x for x in map(
            json.loads, r.records.read_text().splitlines())}
        assert len(records) == 3
        by_start = {out["headers"]["x-rolloutcore-engine"]: records[
            out["headers"]["x-rolloutcore-rollout-id"]] for out in outs}
        assert [(x["engine"], x["start"], x["end"]) for x in by_start["a"]["segments"]] == [
            ("a", 0, 1), ("b", 1, n)]
        assert [(x["engine"], x["start"], x["end"]) for x in by_start["c"]["segments"]] == [
            ("c", 0, 1), ("b", 1, n)]
        assert by_start["b"]["segments"] == []
        for rec in records.values():
            assert rec["binding"]["generation"] == 1
            assert rec["response_token_ids"] == r.reference(1, rec["prompt_token_ids"], n)
        moves = [x for x in r.journal_records() if x["step"] == "migrate"]
        assert [x["detail"]["members"] for x in moves] == [["a", "b"], ["c", "b"]]
        assert r.fakes["a"].aborted == r.fakes["c"].aborted == 1  # the parts left behind
        r.check()  # the journal checks; records verify accepts every segment


def test_a_moved_stream_whose_new_member_dies_ends_with_an_error_event_and_a_record(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    """The stream on a moves to b when a drains (as above); b dies after the
    continuation's first event. The client's stream still ends cleanly: the tokens of
    both parts, then an SSE error event (never a cut connection); its trajectory record
    is marked broken, holds both segments and verifies against the journal; b is
    suspected, and the update goes on around it."""
    n = 6
    prompts = {k: [k + 1, *PROMPT] for k in range(3)}
    with rig(tmp_path, upstream, names=("a", "b", "c"), min_serving=2, max_live=2,
             min_admitting=2) as r:
        threads = []
        for k in range(3):
            die = {"x-test-die-longer-than": str(len(prompts[k]))} if k == 0 else None
            threads.append(in_thread(functools.partial(_stream_tokens, r.url, prompts[k], n,
                                                       "g", die)))
            wait_until(lambda k=k: r.bound() == k + 1, "the stream to be admitted")
        wait_until(lambda: all(fe.running == 1 for fe in r.fakes.values()),
                   "one held stream on every member")
        upd, box = in_thread(lambda: r.update("ckpt-2", "v2"))
        threads[0][0].join(3 * BOUND)
        out = threads[0][1]["value"]
        assert out["status"] == 200 and out["headers"]["x-rolloutcore-engine"] == "a"
        assert out["tokens"] == r.reference(1, prompts[0], n)[:2], out  # one from each
        assert out["events"][-1]["error"]["code"] == "engine_error", out["events"][-1]
        assert "failed mid-stream" in out["events"][-1]["error"]["message"]
        upstream.gates["g"].set()
        for t, _ in threads[1:]:
            t.join(3 * BOUND)
        upd.join(3 * BOUND)
        assert box["value"].status_code == 200, box
        rec = next(x for x in map(json.loads, r.records.read_text().splitlines())
                   if x["binding"]["rollout_id"] == out["headers"]["x-rolloutcore-rollout-id"])
        assert rec["broken"] is True and rec["finish_reason"] is None
        assert [(x["engine"], x["start"], x["end"]) for x in rec["segments"]] == [
            ("a", 0, 1), ("b", 1, 2)]
        assert rec["response_token_ids"] == r.reference(1, prompts[0], n)[:2]
        assert r.metric("rolloutcore_gateway_engine_failures_total", engine="b",
                        retried="false") == 1
        r.check()


def test_stream_headers_come_before_the_first_chunk(tmp_path: Path,
                                                    upstream: FakeUpstream) -> None:
    with rig(tmp_path, upstream) as r:
        with httpx.stream("POST", f"{r.url}/v1/completions", headers={"x-test-hold": "h1"},
                          json={"model": MODEL, "prompt": PROMPT, "max_tokens": 3,
                                "stream": True}, timeout=BOUND) as resp:
            # the engine holds the answer after its first chunk: nothing more has come
            assert resp.status_code == 200, resp.read()
            assert resp.headers["x-rolloutcore-generation"] == "1"
            assert resp.headers["x-rolloutcore-engine"] == "a"
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
            assert r.bound() == 1
            upstream.gates["h1"].set()
            rest = [line for line in lines if line]
            assert len(rest) == 3 and rest[-1] == "data: [DONE]"
        wait_until(lambda: r.bound() == 0, "the release")
        r.check()


def test_least_outstanding_first(tmp_path: Path, upstream: FakeUpstream) -> None:
    with rig(tmp_path, upstream) as r:
        t, box = in_thread(lambda: completion(r.url, headers={"x-test-hold": "g"}))
        wait_until(lambda: r.fakes["a"].running == 1, "the held request on a")
        for _ in range(3):  # a is busy: every other request goes to b
            assert completion(r.url).headers["x-rolloutcore-engine"] == "b"
        upstream.gates["g"].set()
        t.join(BOUND)
        assert box["value"].headers["x-rolloutcore-engine"] == "a"
        r.check()


# ------------------------------------------------------------------ updates


def test_concurrent_clients_across_updates(tmp_path: Path, upstream: FakeUpstream) -> None:
    """Clients hammer the gateway while three updates run back to back: every answer's
    generation header names the checkpoint whose reference its tokens are."""
    with rig(tmp_path, upstream) as r:
        stop = threading.Event()
        answers: list[tuple[int, list[int], list[int]]] = []
        lock = threading.Lock()

        def client(i: int) -> None:
            with httpx.Client(timeout=BOUND) as c:
                k = 0
                while not stop.is_set() or k < 3:
                    prompt = [i, k % 7, 3]
                    resp = c.post(f"{r.url}/v1/completions", json={
                        "model": MODEL, "prompt": prompt, "max_tokens": 5,
                        "return_token_ids": True, "stream": k % 2 == 1})
                    assert resp.status_code == 200, resp.text
                    gen = int(resp.headers["x-rolloutcore-generation"])
                    if k % 2:
                        toks = [t for line in resp.text.splitlines()
                                if line.startswith("data: {")
                                for t in json.loads(line[6:])["choices"][0]["token_ids"]]
                    else:
                        toks = resp.json()["choices"][0]["token_ids"]
                    with lock:
                        answers.append((gen, prompt, toks))
                    k += 1

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for gen, ckpt in ((2, "ckpt-2"), (3, "ckpt-3"), (4, "ckpt-2b")):
            seen = len(answers)
            wait_until(lambda s=seen: len(answers) >= s + 8, "traffic before the update")
            resp = r.update(ckpt, f"v{gen}")
            assert resp.json()["published"] and resp.json()["committed"] == gen
        stop.set()
        for t in threads:
            t.join(BOUND)
        gens = {g for g, _, _ in answers}
        assert gens == {1, 2, 3, 4}, gens
        for gen, prompt, toks in answers:
            assert toks == r.reference(gen, prompt, 5), (gen, prompt)
        per_gen = {g: sum(1 for a in answers if a[0] == g) for g in gens}
        for g, n in per_gen.items():
            assert r.metric("rolloutcore_gateway_requests_total", code="200",
                            endpoint="completions", generation=str(g)) == n
        assert r.metric("rolloutcore_update_cycle_duration_seconds_count",
                        outcome="published") == 3
        r.check()


def test_queued_requests_are_admitted_after_the_publish(tmp_path: Path,
                                                        upstream: FakeUpstream) -> None:
    with rig(tmp_path, upstream, queue_depth=4) as r:
        with admissions_closed(r):
            waiting = [in_thread(lambda: completion(r.url, return_token_ids=True))
                       for _ in range(3)]
            wait_until(lambda: r.gw.queued == 3, "three queued requests")
            assert sum(f.received for f in r.fakes.values()) == 0  # nothing forwarded
            assert r.metric("rolloutcore_gateway_queue_depth") == 3
        r.checkpoints[2] = "ckpt-2"
        for t, box in waiting:
            t.join(BOUND)
            resp = box["value"]
            assert resp.status_code == 200
            assert resp.headers["x-rolloutcore-generation"] == "2"
            assert resp.json()["choices"][0]["token_ids"] == r.reference(2, PROMPT, 4)
        assert r.metric("rolloutcore_gateway_queue_wait_seconds_count",
                        outcome="admitted") == 3
        r.check()


def test_queue_full_and_wait_exceeded_get_503(tmp_path: Path, upstream: FakeUpstream) -> None:
    with rig(tmp_path, upstream, queue_depth=1, queue_wait_s=0.3, retry_after_s=2) as r:
        with admissions_closed(r):
            t, box = in_thread(lambda: completion(r.url))
            wait_until(lambda: r.gw.queued == 1, "the queued request")
            full = completion(r.url)
            assert full.status_code == 503 and full.headers["retry-after"] == "2"
            assert full.json()["error"]["code"] == "queue_full"
            assert set(full.json()["error"]) == {"message", "type", "param", "code"}
            t.join(BOUND)  # its wait (0.3 s, configured) runs out while the update is held
            late = box["value"]
            assert late.status_code == 503 and late.headers["retry-after"] == "2"
            assert late.json()["error"]["code"] == "queue_timeout"
            assert sum(f.received for f in r.fakes.values()) == 0
        assert r.metric("rolloutcore_gateway_queue_rejections_total", reason="full") == 1
        assert r.metric("rolloutcore_gateway_queue_rejections_total", reason="timeout") == 1
        assert r.metric("rolloutcore_gateway_requests_total", code="503",
                        endpoint="completions", generation="none") == 2
        assert not any(x.get("step") == "admit" and x["param"].startswith("gw-")
                       for x in r.journal_records())
        r.check()


def test_stale_request_refused_with_409(tmp_path: Path, upstream: FakeUpstream) -> None:
    with rig(tmp_path, upstream, stale=StaleMode.REFUSE) as r:
        before = r.journal.stat().st_size
        resp = completion(r.url, headers={"X-RolloutCore-Min-Generation": "2"})
        assert resp.status_code == 409
        body = resp.json()
        assert body["error"]["code"] == "stale_generation"
        assert body["rolloutcore"] == {"committed_generation": 1, "min_generation": 2}
        assert resp.headers["x-rolloutcore-committed-generation"] == "1"
        assert r.journal.stat().st_size == before  # nothing journalled
        assert completion(r.url, headers={"X-RolloutCore-Min-Generation": "1"}
                          ).status_code == 200
        assert r.metric("rolloutcore_gateway_stale_refusals_total") == 1
        r.check()


def test_stale_request_waits_for_the_generation(tmp_path: Path,
                                                upstream: FakeUpstream) -> None:
    with rig(tmp_path, upstream) as r:
        t, box = in_thread(lambda: completion(
            r.url, headers={"X-RolloutCore-Min-Generation": "2"}, return_token_ids=True))
        wait_until(lambda: r.gw.queued == 1, "the request to wait for generation 2")
        assert completion(r.url).headers["x-rolloutcore-generation"] == "1"  # others flow
        assert r.update("ckpt-2", "v2").json()["published"]
        t.join(BOUND)
        resp = box["value"]
        assert resp.headers["x-rolloutcore-generation"] == "2"
        assert resp.json()["choices"][0]["token_ids"] == r.reference(2, PROMPT, 4)
        # the fleet-wide floor, through the admin API, binds every request
        assert httpx.post(f"{r.url}/admin/floor", json={"min_generation": 3}).json() == {
            "min_generation": 3, "committed": 2}
        t, box = in_thread(lambda: completion(r.url))
        wait_until(lambda: r.gw.queued == 1, "a request below the floor to wait")
        assert r.update("ckpt-3", "v3").json()["published"]
        t.join(BOUND)
        assert box["value"].headers["x-rolloutcore-generation"] == "3"
        assert r.metric("rolloutcore_min_generation_floor") == 3
        r.check()


# ------------------------------------------------------------------ disconnects


def test_client_disconnect_mid_stream_aborts_then_releases(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    with rig(tmp_path, upstream) as r:
        with httpx.stream("POST", f"{r.url}/v1/completions", headers={"x-test-hold": "d"},
                          json={"model": MODEL, "prompt": PROMPT, "max_tokens": 50,
                                "stream": True}, timeout=BOUND) as resp:
            assert resp.status_code == 200, resp.read()
            assert resp.headers["x-rolloutcore-engine"] == "a"
            # Hold the line iterator until the client leaves: a discarded one, once the
            # garbage collector frees it, closes the connection (httpcore closes a stream
            # left unread), a disconnect at a moment the test does not choose.
            lines = resp.iter_lines()
            next(lines)
            wait_until(lambda: r.fakes["a"].running == 1, "the engine to run it")
            assert r.bound() == 1
            gc.collect()  # (the negative control of the comment above: nothing is freed)
            assert r.fakes["a"].running == 1 and r.bound() == 1
            del lines
        # the client left while the engine held the stream: the gateway closes the
        # upstream stream (the engine aborts the request), then releases the rollout
        wait_until(lambda: r.fakes["a"].running == 0, "the engine request to end")
        assert r.fakes["a"].aborted == 1 and r.fakes["a"].completed == 0
        wait_until(lambda: r.bound() == 0, "the release")
        release = [x for x in r.journal_records() if x["step"] == "release"][-1]
        assert release["detail"]["outcome"] == "client disconnected"
        assert r.metric("rolloutcore_gateway_client_disconnects_total") == 1
        assert r.metric("rolloutcore_gateway_requests_total", code="499",
                        endpoint="completions", generation="1") == 1
        assert not r.records.exists() or r.records.read_text() == ""  # partial: no record
        r.check()


def test_client_leaving_after_the_last_event_lost_nothing(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    """The openai client closes its stream at ``data: [DONE]``; the engine may not have
    ended its stream yet: the answer is complete, recorded, and not a disconnect."""
    with rig(tmp_path, upstream) as r:
        with httpx.stream("POST", f"{r.url}/v1/completions", headers={
                "x-test-hold-end": "e"}, json={"model": MODEL, "prompt": PROMPT,
                                               "max_tokens": 3, "stream": True},
                timeout=BOUND) as resp:
            for line in resp.iter_lines():  # up to the last event, as the openai client
                if line == "data: [DONE]":
                    break
            else:
                raise AssertionError("no [DONE]")
            wait_until(lambda: r.fakes["a"].completed == 1, "the engine to send it all")
        # the client left while the engine's stream was still open
        wait_until(lambda: r.bound() == 0, "the release")
        release = [x for x in r.journal_records() if x["step"] == "release"][-1]
        assert release["detail"] == {"status": 200}
        assert r.metric("rolloutcore_gateway_client_disconnects_total") == 0
        assert len(r.records.read_text().splitlines()) == 1
        r.check()


def test_client_disconnect_while_queued(tmp_path: Path, upstream: FakeUpstream) -> None:
    import socket
    from urllib.parse import urlsplit

    with rig(tmp_path, upstream) as r:
        with admissions_closed(r):
            u = urlsplit(r.url)
            body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 2}).encode()
            with socket.create_connection((u.hostname, u.port), timeout=BOUND) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/json\r\nContent-Length: "
                          + str(len(body)).encode() + b"\r\n\r\n" + body)
                wait_until(lambda: r.gw.queued == 1, "the queued request")
            # the client closed its connection while queued: its wait ends
            wait_until(lambda: r.gw.queued == 0, "the queue to empty")
            wait_until(lambda: r.metric("rolloutcore_gateway_requests_total", code="499",
                                        endpoint="completions", generation="none") == 1,
                       "the request to be counted")
        assert r.metric("rolloutcore_gateway_queue_wait_seconds_count",
                        outcome="cancelled") == 1
        assert not any(x.get("step") == "admit" and x["param"].startswith("gw-")
                       for x in r.journal_records())
        assert sum(f.received for f in r.fakes.values()) == 0
        r.check()


# ------------------------------------------------------------------ bad input


BAD_REQUESTS: list[tuple[str, dict[str, Any], int, str]] = [
    ("malformed json", {"content": b'{"model": "tiny", '}, 400, "invalid_json"),
    ("not an object", {"json": [1, 2]}, 400, "invalid_json"),
    ("no model", {"json": {"prompt": [1]}}, 400, "invalid_request"),
    ("unknown model", {"json": {"model": "gpt-4", "prompt": [1]}}, 404, "model_not_found"),
    ("stream not a bool", {"json": {"model": MODEL, "prompt": [1], "stream": "yes"}}, 400,
     "invalid_request"),
    ("body over the limit", {"json": {"model": MODEL, "prompt": [1] * 600}}, 413,
     "request_too_large"),
    ("chunked body over the limit", {"content": iter([b'{"model": "tiny", "prompt": [',
                                                      b"1," * 600, b"1]}"])}, 413,
     "request_too_large"),
    ("bad min generation", {"json": {"model": MODEL, "prompt": [1]},
                            "headers": {"X-RolloutCore-Min-Generation": "-1"}}, 400,
     "invalid_request"),
    ("bad max staleness", {"json": {"model": MODEL, "prompt": [1]},
                           "headers": {"X-RolloutCore-Max-Staleness": "one"}}, 400,
     "invalid_request"),
]


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_requests_are_refused_and_change_nothing(
        tmp_path: Path, upstream: FakeUpstream, case: tuple[str, dict[str, Any], int, str]
        ) -> None:
    _what, kwargs, status, code = case
    with rig(tmp_path, upstream, max_body_bytes=1000) as r:
        before = r.journal.read_bytes()
        resp = httpx.post(f"{r.url}/v1/completions", timeout=BOUND, **kwargs)
        assert resp.status_code == status, resp.text
        err = resp.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == code
        assert r.journal.read_bytes() == before  # nothing admitted, nothing journalled
        assert sum(f.received for f in r.fakes.values()) == 0  # nothing forwarded
        assert r.metric("rolloutcore_gateway_requests_total", code=str(status),
                        endpoint="completions", generation="none") == 1


def test_unknown_route_and_method_answer_in_openai_shape(tmp_path: Path,
                                                         upstream: FakeUpstream) -> None:
    with rig(tmp_path, upstream) as r:
        for resp, status in ((httpx.get(f"{r.url}/v1/nope"), 404),
                             (httpx.get(f"{r.url}/v1/completions"), 405)):
            assert resp.status_code == status
            assert set(resp.json()["error"]) == {"message", "type", "param", "code"}


# ------------------------------------------------------------------ engine errors


def test_engine_errors_are_passed_on_and_released(tmp_path: Path,
                                                  upstream: FakeUpstream) -> None:
    with rig(tmp_path, upstream) as r:
        resp = completion(r.url, headers={"x-test-fail": "500"})
        assert resp.status_code == 500 and resp.json()["error"]["message"] == "injected"
        assert resp.headers["x-rolloutcore-generation"] == "1"
        assert r.bound() == 0
        # a 5xx answer suspects the engine (no admission until an audit passes)
        engine = resp.headers["x-rolloutcore-engine"]
        assert any(x["step"] == "suspect" and x["engine"] == engine
                   for x in r.journal_records())
        wait_until(lambda: r.fleet.members[engine].last_audit is not None, "its audit")
        r.check()
    with rig(tmp_path, upstream, names=("dead",), dead=("dead",)) as r:
        resp = completion(r.url)
        assert resp.status_code == 502 and resp.json()["error"]["code"] == "engine_error"
        assert r.bound() == 0
        release = [x for x in r.journal_records() if x["step"] == "release"][-1]
        assert release["detail"]["status"] == 502
        r.check()


def test_a_leaders_gateway_stamps_its_epoch_and_a_fenced_one_is_refused(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    """Under a leadership (the fleet has an epoch) the gateway stamps every request it
    forwards with it; once the engines' gateway fence is above it (a successor took
    over), the engine refuses them and the client gets the engine's 409, released."""
    with rig(tmp_path, upstream) as r:
        r.fleet.epoch = 3  # as a fleet on a store under a won leadership has
        assert completion(r.url).status_code == 200
        fence = httpx.post(f"{upstream.url}{FENCE_PATH}", json={
            "gateway": LEADER_GATEWAY, "epoch": 4}, timeout=BOUND).json()
        assert fence["fence"] == 4 and fence["running_below"] == 0, fence
        refused = completion(r.url)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "gateway_fenced"
        assert r.bound() == 0
        r.fleet.epoch = 4
        assert completion(r.url).status_code == 200
        r.check()


def test_a_fault_of_the_gateway_is_answered_released_and_recorded(
        tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault inside the gateway after admission (injected: building the answer's
    headers, then forwarding a stream's chunk) never leaves a connection closed without
    an answer: before anything was sent the client gets a 500 in OpenAI's shape; mid-
    stream, an error event ends the stream. Either way the rollout is released, its
    record written (the stream's marked broken) and the journal checks."""
    from rolloutcore.gateway import app as app_module

    real_headers = app_module.lease_headers
    with rig(tmp_path, upstream) as r:
        def broken_headers(lease: Lease) -> list[tuple[bytes, bytes]]:
            raise RuntimeError("injected gateway fault")
        monkeypatch.setattr(app_module, "lease_headers", broken_headers)
        resp = completion(r.url)
        assert resp.status_code == 500, resp.text
        assert resp.json()["error"]["code"] == "internal_error"
        assert r.bound() == 0
        release = [x for x in r.journal_records() if x["step"] == "release"][-1]
        assert release["detail"]["status"] == 500
        monkeypatch.setattr(app_module, "lease_headers", real_headers)

        real_chunk = app_module._Exchange._send_chunk
        sent = {"n": 0}

        async def broken_chunk(self: Any, send: Any, chunk: bytes, tail: bytes) -> None:
            sent["n"] += 1
            if sent["n"] == 1:  # the headers went out: the stream has started
                raise RuntimeError("injected gateway fault mid-stream")
            await real_chunk(self, send, chunk, tail)
        monkeypatch.setattr(app_module._Exchange, "_send_chunk", broken_chunk)
        with httpx.stream("POST", f"{r.url}/v1/completions", timeout=BOUND, json={
                "model": MODEL, "prompt": PROMPT, "max_tokens": 6, "min_tokens": 6,
                "temperature": 0, "stream": True}) as resp:
            assert resp.status_code == 200
            body = "".join(resp.iter_text())  # read to its end: no connection cut
        assert "the gateway failed mid-stream: RuntimeError" in body, body
        assert r.bound() == 0
        r.check()


def test_unreachable_member_is_suspected_and_the_request_admitted_again(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    """b's address refuses connections: the request admitted on it is released, b is
    suspected (its admissions stop until an audit passes; the audit starts at once) and
    the request is admitted again on a, which answers it: the client sees a 200."""
    with rig(tmp_path, upstream, dead=("b",)) as r:
        t, held = in_thread(lambda: completion(r.url, headers={"x-test-hold": "a"}))
        wait_until(lambda: r.fakes["a"].running == 1, "a busy")  # so b is least loaded
        resp = completion(r.url, return_token_ids=True)
        upstream.gates["a"].set()
        t.join(BOUND)
        assert held["value"].status_code == 200
        assert resp.status_code == 200 and resp.headers["x-rolloutcore-engine"] == "a"
        assert resp.json()["choices"][0]["token_ids"] == r.reference(1, PROMPT, 4)
        recs = r.journal_records()
        suspect = [x for x in recs if x["step"] == "suspect"]
        assert [x["engine"] for x in suspect] == ["b"]
        assert "ClientConnectorError" in suspect[0]["detail"]["error"]
        released_b = [x for x in recs if x["step"] == "release" and x["engine"] == "b"]
        assert [x["detail"]["status"] for x in released_b] == [502]
        assert r.metric("rolloutcore_gateway_engine_failures_total", engine="b",
                        retried="true") == 1
        answered = {k: v for k, v in r.metrics().items()
                    if k[0] == "rolloutcore_gateway_requests_total" and v}
        assert sum(answered.values()) == 2 and all(  # one per client request
            ("code", "200") in labels for _n, labels in answered), answered
        wait_until(lambda: r.fleet.members["b"].last_audit is not None, "b's audit")
        r.check()


def test_admin_audit(tmp_path: Path, upstream: FakeUpstream) -> None:
    """POST /admin/audit audits the named engines (default: every READY one): label,
    identity, run state, a probe; an engine replaced out of band is quarantined."""
    with rig(tmp_path, upstream, min_serving=1) as r:
        url = f"{r.url}/admin/audit"
        for bad, status in (({"engines": "a"}, 400), ({"engines": []}, 400),
                            ({"engines": ["zz"]}, 404), ({"other": 1}, 400)):
            assert httpx.post(url, json=bad, timeout=BOUND).status_code == status, bad
        assert not any(x["step"].startswith("audit") for x in r.journal_records())
        out = httpx.post(url, json={"engines": ["a"]}, timeout=BOUND).json()
        assert out["audits"] == {"a": {"outcome": "audit_ok", "reason": out["audits"]["a"][
            "reason"]}}
        r.adapters["b"].reconnect(SimEngine("ckpt-9"))  # replaced behind the fleet's back
        out = httpx.post(url, timeout=BOUND).json()["audits"]
        assert out["a"]["outcome"] == "audit_ok" and out["b"]["outcome"] == "audit_mismatch"
        assert r.metric("rolloutcore_audits_total", engine="b", outcome="audit_mismatch") == 1
        for _ in range(3):
            assert completion(r.url).headers["x-rolloutcore-engine"] == "a"
        r.check()


# ------------------------------------------------------------------ admin API


def test_admin_api_needs_its_token_and_never_shows_it(
        tmp_path: Path, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture) -> None:
    token = "s3cret-admin-token-" + uuid.uuid4().hex
    with rig(tmp_path, upstream, admin_token=token) as r:
        before = r.journal.read_bytes()
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token},
                        {"Authorization": f"Basic {token}"}):
            for method, path, body in (("GET", "/admin/status", None),
                                       ("POST", "/admin/floor", {"min_generation": 5}),
                                       ("POST", "/admin/update", {"checkpoint": "ckpt-2",
                                                                  "label": "v2"}),
                                       ("POST", "/admin/readmit", {"engine": "a"})):
                resp = httpx.request(method, f"{r.url}{path}", json=body, headers=headers,
                                     timeout=BOUND)
                assert resp.status_code == 401, (path, headers)
                assert resp.headers["www-authenticate"] == "Bearer"
                assert resp.json()["error"]["code"] == "invalid_admin_token"
        assert r.journal.read_bytes() == before and r.gw.floor == 0
        good = {"Authorization": f"Bearer {token}"}
        status = httpx.get(f"{r.url}/admin/status", headers=good).json()
        assert status["fleet"]["committed"] == 1 and len(status["engines"]) == 2
        resp = httpx.post(f"{r.url}/admin/update", headers=good, timeout=BOUND,
                          json={"checkpoint": "ckpt-2", "label": "v2"})
        assert resp.json()["published"]
        everything = (r.journal.read_text() + httpx.get(f"{r.url}/metrics").text
                      + caplog.text + json.dumps(httpx.get(f"{r.url}/admin/status",
                                                           headers=good).json()))
        assert token not in everything


def test_admin_api_without_token_serves_loopback_only() -> None:
    from starlette.requests import Request as StarletteRequest

    app = GatewayApp.__new__(GatewayApp)
    app.gw = type("G", (), {"config": GatewayConfig(model=MODEL)})()  # type: ignore[assignment]
    for host, allowed in (("127.0.0.1", True), ("::1", True), ("10.1.2.3", False)):
        req = StarletteRequest({"type": "http", "client": (host, 1234), "headers": []})
        refused = app._authorize(req)
        assert (refused is None) == allowed, host
        if refused is not None:
            assert refused.status == 403


@pytest.mark.parametrize("body,status,code", [
    ({"checkpoint": "nowhere", "label": "v2"}, 400, "invalid_target"),
    ({"checkpoint": "ckpt-2"}, 400, "invalid_target"),
    ({"checkpoint": "ckpt-2", "label": "v2", "min_serving": 3}, 400, "invalid_target"),
    ({"checkpoint": "ckpt-2", "label": "v2", "colour": "blue"}, 400, "invalid_request"),
    ({"checkpoint": "ckpt-2", "label": "v2", "wait": "yes"}, 400, "invalid_request"),
])
def test_admin_update_bad_input_changes_nothing(
        tmp_path: Path, upstream: FakeUpstream, body: dict[str, Any], status: int,
        code: str) -> None:
    with rig(tmp_path, upstream) as r:
        before = r.journal.read_bytes()
        resp = httpx.post(f"{r.url}/admin/update", json=body, timeout=BOUND)
        assert resp.status_code == status and resp.json()["error"]["code"] == code
        assert r.journal.read_bytes() == before and r.fleet.committed == 1
        for bad in (b"{not json", b"[1]"):
            resp = httpx.post(f"{r.url}/admin/floor", content=bad)
            assert resp.status_code == 400
        for floor in (-1, "2", True):
            assert httpx.post(f"{r.url}/admin/floor", json={"min_generation": floor}
                              ).status_code == 400
        assert httpx.post(f"{r.url}/admin/readmit", json={"engine": "zz"}).status_code == 404
        assert r.gw.floor == 0 and r.journal.read_bytes() == before


def test_admin_update_one_at_a_time_and_not_waiting(tmp_path: Path,
                                                    upstream: FakeUpstream) -> None:
    with rig(tmp_path, upstream) as r:
        lease = r.fleet.admit("held")  # the update's drain waits for it
        resp = httpx.post(f"{r.url}/admin/update", json={"checkpoint": "ckpt-2",
                                                          "label": "v2", "wait": False})
        assert resp.status_code == 202
        wait_until(lambda: r.fleet.phase == "UPDATING", "the update to start")
        busy = httpx.post(f"{r.url}/admin/update", json={"checkpoint": "ckpt-3",
                                                          "label": "v3"})
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "busy"
        assert httpx.get(f"{r.url}/admin/status").json()["admin"]["running"] == \
            "update to v2"
        r.fleet.release(lease)
        wait_until(lambda: r.fleet.committed == 2, "the publish")
        wait_until(lambda: httpx.get(f"{r.url}/admin/status").json()["admin"]["running"]
                   is None, "the admin worker to be free")
        status = httpx.get(f"{r.url}/admin/status").json()
        assert status["admin"]["last_cycle"]["published"] is True
        r.check()


def test_quarantine_readmission_and_routing(tmp_path: Path, upstream: FakeUpstream) -> None:
    """b loads the wrong weights in the update: quarantined, it gets nothing; re-admitted
    through the admin API it serves the committed generation again."""
    faults = {"b": FaultPlan({"mutate": ["wrong_weights"]})}
    with rig(tmp_path, upstream, min_serving=1, faults=faults) as r:
        resp = r.update("ckpt-2", "v2").json()
        assert resp["published"] and resp["report"]["quarantined"] == ["b"]
        for _ in range(4):
            assert completion(r.url).headers["x-rolloutcore-engine"] == "a"
        m = r.metrics()
        assert m[("rolloutcore_engine_quarantined", (("engine", "b"),))] == 1
        assert m[("rolloutcore_engine_serving", (("engine", "b"),))] == 0
        assert m[("rolloutcore_engine_phase", (("engine", "b"), ("phase", "TAINTED")))] == 1
        assert m[("rolloutcore_quarantines_total", (("engine", "b"),))] == 1
        out = httpx.post(f"{r.url}/admin/readmit", json={"engine": "b"}, timeout=BOUND).json()
        assert out.get("outcome") == "readmit_ok" and out["committed"] == 2, out
        assert r.metric("rolloutcore_readmissions_total", engine="b",
                        outcome="readmit_ok") == 1
        assert r.metric("rolloutcore_engine_serving", engine="b") == 1
        t, box = in_thread(lambda: completion(r.url, headers={"x-test-hold": "q"}))
        wait_until(lambda: r.fakes["a"].running == 1, "a busy")
        assert completion(r.url).headers["x-rolloutcore-engine"] == "b"
        upstream.gates["q"].set()
        t.join(BOUND)
        assert box["value"].headers["x-rolloutcore-engine"] == "a"
        r.check()


# ------------------------------------------------------------------ metrics


def test_metrics_name_what_happened(tmp_path: Path, upstream: FakeUpstream) -> None:
    now = [1000.0]
    faults = {"a": FaultPlan({"resume": ["hang"]})}
    with rig(tmp_path, upstream, faults=faults, clock=lambda: now[0]) as r:
        for _ in range(3):
            completion(r.url)
        # a's resume hangs: a stays paused, the paused-time gauge counts (on the
        # injected clock) until the hang is let go
        t, box = in_thread(lambda: r.update("ckpt-2", "v2"))
        wait_until(lambda: r.fakes["a"].engine.paused and r.fleet.members["a"]
                   .controller.control.pending == "resume", "a paused, resuming")
        r.metrics()  # first seen paused at 1000
        now[0] += 42.5
        assert r.metric("rolloutcore_engine_paused_seconds", engine="a") == 42.5
        r.adapters["a"].release_hangs()
        t.join(BOUND)
        assert box["value"].json()["published"]
        m = r.metrics()
        assert m[("rolloutcore_engine_paused_seconds", (("engine", "a"),))] == 0
        assert m[("rolloutcore_committed_generation", ())] == 2
        assert m[("rolloutcore_engine_generation", (("engine", "b"),))] == 2
        assert m[("rolloutcore_engine_phase", (("engine", "a"), ("phase", "READY")))] == 1
        assert m[("rolloutcore_fleet_phase", (("phase", "READY"),))] == 1
        assert m[("rolloutcore_gateway_requests_total", (
            ("code", "200"), ("endpoint", "completions"), ("generation", "1")))] == 3
        assert m[("rolloutcore_update_cycle_duration_seconds_count",
                  (("outcome", "published"),))] == 1
        for engine in ("a", "b"):
            assert m[("rolloutcore_drain_wait_seconds_count", (("engine", engine),))] == 1
            assert m[("rolloutcore_step_duration_seconds_count", (
                ("engine", engine), ("outcome", "mutate_ok"), ("step", "mutate")))] == 1
        # a's resume: one failed attempt (the hang), then resume_ok
        assert m[("rolloutcore_step_duration_seconds_count", (
            ("engine", "a"), ("outcome", "resume_ok"), ("step", "resume")))] == 1
        r.check()


# ------------------------------------------------------------------ group commit


@pytest.fixture
def fsync_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every fsync, as the size of the file it made durable."""
    real, sizes = os.fsync, []

    def fsync(fd: int) -> None:
        real(fd)
        sizes.append(os.fstat(fd).st_size)

    monkeypatch.setattr(os, "fsync", fsync)
    yield sizes


def _member_record(sink: Callable[..., int], i: int) -> int:
    from rolloutcore.engine.controller import TraceRecord

    return sink(TraceRecord(0, "admit", f"r{i}", "READY", 1, 0, "none", None))


def test_journal_default_fsyncs_every_record(tmp_path: Path, fsync_log: list[int]) -> None:
    j = Journal(tmp_path / "j.jsonl", spec_name="RolloutCoreFleet")
    sink = j.member("a")
    n0 = len(fsync_log)
    for i in range(5):
        _member_record(sink, i)
        assert fsync_log[-1] == j.path.stat().st_size  # durable when the call returns
    assert len(fsync_log) - n0 == 5 and not j.group_commit and j.fsyncs == 0
    j.close()


def test_group_commit_one_fsync_for_a_deferred_batch(tmp_path: Path,
                                                     fsync_log: list[int]) -> None:
    j = Journal(tmp_path / "j.jsonl", spec_name="RolloutCoreFleet", group_commit=True)
    sink = j.member("a")
    n0 = len(fsync_log)
    _member_record(sink, 0)
    assert len(fsync_log) - n0 == 1 and fsync_log[-1] == j.path.stat().st_size
    with j.deferred():
        for i in range(1, 11):
            _member_record(sink, i)
        assert len(fsync_log) - n0 == 1  # written, not yet acknowledged as durable
    assert len(fsync_log) - n0 == 2 and fsync_log[-1] == j.path.stat().st_size
    assert j.fsyncs == 2
    j.close()
    report, recs = read_journal(j.path)
    assert report.ok and [r["seq"] for r in recs] == list(range(12))


def test_unawaited_records_are_covered_by_the_next_awaited_flush(
        tmp_path: Path, fsync_log: list[int]) -> None:
    """A release is not waited for: written at once (a reader sees it), no fsync of its
    own; the next record anyone waits for is fsynced with it, in order."""
    j = Journal(tmp_path / "j.jsonl", spec_name="RolloutCoreFleet", group_commit=True)
    sink = j.member("a")
    _member_record(sink, 0)
    n0, size0 = len(fsync_log), j.path.stat().st_size
    with j.unawaited():
        _member_record(sink, 1)
    assert len(fsync_log) == n0 and j.path.stat().st_size > size0  # written, not synced
    with j.deferred():  # an outer deferred block still waits for its own records
        _member_record(sink, 2)
        with j.unawaited():
            _member_record(sink, 3)
        assert len(fsync_log) == n0
    assert len(fsync_log) == n0 + 1 and fsync_log[-1] == j.path.stat().st_size
    j.close()
    report, recs = read_journal(j.path)
    assert report.ok and [r["seq"] for r in recs] == list(range(5))


def test_group_commit_concurrent_writers_share_one_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first fsync is held until every other writer has written its line: they all
    wait, outside the lock, and the next fsync (one) covers them all. No writer returns
    before an fsync that started after its line was written has completed."""
    j = Journal(tmp_path / "j.jsonl", spec_name="RolloutCoreFleet", group_commit=True)
    sink = j.member("a")
    real = os.fsync
    first_started, let_go = threading.Event(), threading.Event()
    durable: list[int] = []  # file size made durable by each completed fsync

    def fsync(fd: int) -> None:
        size = os.fstat(fd).st_size
        if not first_started.is_set():
            first_started.set()
            let_go.wait(BOUND)
        real(fd)
        durable.append(size)

    monkeypatch.setattr(os, "fsync", fsync)
    seqs: dict[int, int] = {}
    acked: dict[int, int] = {}  # what was durable when the writer's call returned

    def writer(i: int) -> None:
        seqs[i] = _member_record(sink, i)
        acked[i] = max(durable)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    threads[0].start()
    assert first_started.wait(BOUND)
    for t in threads[1:]:
        t.start()
    wait_until(lambda: j.last_seq == 16, "every line written")
    assert acked == {}  # all written, none acknowledged: the first fsync is still held
    let_go.set()
    for t in threads:
        t.join(BOUND)
    assert j.fsyncs == 2 and len(durable) == 2  # one for the first, one for the 15 others
    assert durable[-1] == j.path.stat().st_size
    ends, offset = {}, 0
    for line in j.path.read_bytes().splitlines(keepends=True):
        offset += len(line)
        ends[json.loads(line)["seq"]] = offset
    for i, seq in seqs.items():
        assert acked[i] >= ends[seq], (i, seq)  # acknowledged only once durable
    j.close()


def test_group_commit_failed_fsync_fails_closed(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    j = Journal(tmp_path / "j.jsonl", spec_name="RolloutCoreFleet", group_commit=True)
    sink = j.member("a")
    _member_record(sink, 0)

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(JournalError, match="fsync failed"):
        _member_record(sink, 1)
    monkeypatch.undo()
    size = j.path.stat().st_size
    with pytest.raises(JournalError, match="an earlier fsync failed"):
        _member_record(sink, 2)
    assert j.path.stat().st_size == size  # nothing more written
    j.close()
