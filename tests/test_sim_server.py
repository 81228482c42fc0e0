"""The simulated vLLM server (conformance/fixtures/sim_server.py) driven by the real HTTP adapter:
a verified update cycle through the runner, the stale-KV negative control, the engine's
fencing token, the pause modes, streaming, bad input, and a server that outlives the
controller processes around it.

Every wait is for an observable condition (a gauge, a counter, a line of output) with a
deadline (:data:`BOUND`, a bound against a broken test, never a measurement); the only
time windows are the adapter's own read-back loop of a keep-mode pause and a client's
read timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import decided, dl, wait_until

from rolloutcore.adapters.contract import (
    EngineReport,
    MutationOutcome,
    PauseMode,
    WeightTarget,
)
from rolloutcore.adapters.gateway_fence import (
    FENCE_PATH,
    GATEWAY_HEADER,
    LEADER_GATEWAY,
    remote_floor,
    stamp,
)
from rolloutcore.adapters.http import HttpAdapter
from rolloutcore.adapters.sim import reference_logprobs, reference_tokens, sim_identity, sim_target
from rolloutcore.check.trace import check_file
from rolloutcore.conformance.fixtures.sim_server import SimServer
from rolloutcore.engine.controller import Controller
from rolloutcore.engine.postconditions import Expected
from rolloutcore.engine.runner import LifecycleRunner, ProbeMode, RunnerPolicy
from rolloutcore.journal import Journal
from rolloutcore.spec.lifecycle import Phase, Result
from rolloutcore.spec.triggers import OUTCOMES, Op

BOUND = 10.0
PROBE = (7, 1, 4, 9, 2, 8, 5, 3, 6)  # two full prefix-cache blocks
ROLLOUT = (3, 1, 4, 1, 5)
POLICY = RunnerPolicy(step_timeout_s=5, pause_timeout_s=5, retries=1, retry_backoff_s=0.0,
                      drain_timeout_s=BOUND, mutation_base_s=5)
WAITING = "vllm:num_requests_waiting"


def target(generation: int, version: str, label: str | None = None) -> WeightTarget:
    return sim_target(generation, version, probe_prompt=PROBE, probe_len=16,
                      label=label or f"{version}-gen{generation}")


def adapter(srv: SimServer, **kw: Any) -> HttpAdapter:
    # Simulated checkpoints are names, not directories: nothing to check on disk.
    return HttpAdapter(srv.url, check_source_exists=False, retry_backoff_s=0.0, **kw)


def gauge(http: HttpAdapter, name: str) -> float:
    text = http.read_metrics(dl(), (name,))
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{"))


def result(http: HttpAdapter, method: str, **kwargs: Any) -> dict[str, Any]:
    r = http.rpc(method, op="test", idempotent=False, **kwargs)
    assert r.status == 200, r.text
    (res,) = r.body["results"]
    assert isinstance(res, dict)
    return res


def ok(op: Op) -> str:
    return str(OUTCOMES[op][Result.OK])


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as ex:
        yield ex


@pytest.fixture
def srv() -> Iterator[SimServer]:
    with SimServer(in_thread=True, token_seconds=0.002) as s:
        yield s


@pytest.fixture
def http(srv: SimServer) -> Iterator[HttpAdapter]:
    with adapter(srv) as a:
        yield a


def stream(url: str, body: dict[str, Any], on_event: Callable[[dict[str, Any]], None]
           | None = None, stop_after: int | None = None) -> list[Any]:
    """POST a streamed completion; the parsed events ("[DONE]" as a string). With
    ``stop_after``: the client goes away after that many events."""
    events: list[Any] = []
    with httpx.Client(trust_env=False, timeout=BOUND) as c, c.stream(
            "POST", f"{url}/v1/completions", json={"model": "tiny", "stream": True, **body}
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith(
            "text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            ev = data if data == "[DONE]" else json.loads(data)
            events.append(ev)
            if on_event is not None and isinstance(ev, dict):
                on_event(ev)
            if stop_after is not None and len(events) >= stop_after:
                break
    return events


def streamed(events: list[Any]) -> tuple[list[int], list[float], str | None]:
    tokens: list[int] = []
    logprobs: list[float] = []
    finish = None
    for ev in events:
        for ch in ev.get("choices", ()) if isinstance(ev, dict) else ():
            tokens += ch["token_ids"]
            if ch.get("logprobs"):
                logprobs += ch["logprobs"]["token_logprobs"]
            finish = ch["finish_reason"] or finish
    return tokens, logprobs, finish


# --------------------------------------------------------------------------- the cycle


def test_the_runner_completes_a_verified_update_through_http(tmp_path: Path) -> None:
    """HttpAdapter + LifecycleRunner against a server in another process, as against the
    in-process simulator: a rollout in flight is drained on generation 1, every step is
    proven, the engine serves v2 as generation 2, and the journal passes the checker."""
    journal = tmp_path / "journal.jsonl"
    with SimServer(token_seconds=0.002) as srv, adapter(srv) as http, \
            ThreadPoolExecutor(1) as ex:
        runner = LifecycleRunner(Controller(trace=Journal(journal, fsync=False)), http, POLICY)
        boot = runner.bootstrap(target(1, "v1", label="default"))
        assert boot.trigger == ok(Op.BOOTSTRAP), boot.reason
        rollout = ex.submit(runner.generate, "r1", ROLLOUT, 100)
        wait_until(lambda: runner.controller.bound_count() == 1, "the rollout is admitted")
        report = runner.update(target(2, "v2"))
        binding, out = rollout.result(BOUND)
        assert binding.generation == 1 and not binding.aborted
        assert out.tokens == reference_tokens("v1", ROLLOUT, 100)  # it crossed no mutation
        assert report.published and report.final_phase is Phase.READY, report.steps
        steps = {s.step: s.outcome for s in report.steps}
        assert steps == {"drain": "drained", "pause": ok(Op.PAUSE), "mutate": ok(Op.MUTATE),
                         "reset(prefix)": ok(Op.RESET), "reset(encoder)": ok(Op.RESET),
                         "reset(mm)": ok(Op.RESET), "validate": ok(Op.VALIDATE),
                         "resume": ok(Op.RESUME), "probe": ok(Op.PROBE)}, report.steps
        assert http.read_state(dl()) == EngineReport("v2-gen2", sim_identity("v2"), False, 0)
        binding, out = runner.generate("r2", ROLLOUT, 8)
        assert binding.generation == 2 and out.tokens == reference_tokens("v2", ROLLOUT, 8)
        # The greedy probe: the first request after the verified resets reads no stale
        # prefix (its cached tokens are the evidence), and decodes v3's reference.
        runner.policy = replace(POLICY, probe_mode=ProbeMode.GREEDY)
        report = runner.update(target(3, "v3"))
        assert report.published and report.final_phase is Phase.READY, report.steps
        assert runner.controller.control.committed == 3
    verdict = check_file(journal)
    assert verdict.accepted, verdict.message


def test_stale_prefix_kv_is_really_reused_when_the_reset_is_skipped(
        http: HttpAdapter) -> None:
    """The negative control, through HTTP: the probe prompt's KV computed under v1 is
    served under v2 until the prefix cache is reset, and the probe's own reply says so."""
    assert http.generate(PROBE, 16).tokens == reference_tokens("v1", PROBE, 16)
    t = target(2, "v2")
    assert http.mutate(t, dl()).outcome is MutationOutcome.COMPLETED
    expected = Expected(label=t.label, identity=t.identity, probe_tokens=t.probe_tokens)
    stale = http.probe(PROBE, 16, dl())
    assert stale.prefix_hits == 8  # two full blocks of v1's KV
    assert stale.tokens != reference_tokens("v2", PROBE, 16)
    assert decided(Op.PROBE, stale, expected) == OUTCOMES[Op.PROBE][Result.MISMATCH]
    reset = http.reset_cache("prefix", dl())
    assert decided(Op.RESET, reset) == ok(Op.RESET) and reset.body_success is True
    clean = http.probe(PROBE, 16, dl())
    assert clean.prefix_hits == 0 and clean.tokens == reference_tokens("v2", PROBE, 16)
    assert decided(Op.PROBE, clean, expected) == ok(Op.PROBE)
    # A scored probe reads no prefix cache (as on vLLM): v2's scores even with v1's KV.
    http.generate(PROBE, 1)  # cached again, under v2 now; then v1's weights come back
    assert http.mutate(target(3, "v1"), dl()).outcome is MutationOutcome.COMPLETED
    scored = http.probe(PROBE, 1, dl(), scored=True)
    assert scored.prefix_hits == 0
    assert scored.prompt_logprobs == (None, *reference_logprobs("v1", PROBE))


# --------------------------------------------------------------------------- fencing


def test_the_fence_refuses_older_and_unfenced_loads(srv: SimServer, http: HttpAdapter) -> None:
    assert result(http, "rc_epoch") == {"seen": 0}
    assert result(http, "rc_fence", epoch=5) == {"accepted": True, "seen": 5}
    assert result(http, "rc_fence", epoch=3) == {"accepted": False, "seen": 5}
    v2 = sim_identity("v2")
    for epoch in (4, None):  # a deposed controller's load, and one that names no epoch
        kwargs = {} if epoch is None else {"epoch": epoch}
        res = result(http, "rc_reload_weights", weights_path="v2", expected_identity=v2,
                     **kwargs)
        assert res["loaded"] is False and res["fenced"] is True and res["seen"] == 5
        assert "fenced" in res["refused"]
        assert http.read_identity(dl()) == sim_identity("v1")  # nothing changed
    res = result(http, "rc_reload_weights", weights_path="v2", expected_identity=v2, epoch=5)
    assert res["loaded"] is True and res["identity"] == v2
    res = result(http, "rc_reload_weights", weights_path="v3", epoch=6)
    assert res["loaded"] is True and http.read_identity(dl()) == sim_identity("v3")
    assert result(http, "rc_epoch") == {"seen": 6}
    assert srv.sim is not None and srv.sim.engine.gate.seen == 6  # the engine's own gate
    # vLLM's own routes carry no epoch: they are not fenced.
    assert http.pause(PauseMode.ABORT, dl()).paused_read_back is True
    assert http.resume(dl()).paused_read_back is False
    assert http.request("POST", "/update_weight_version", op="test", idempotent=True,
                        json_body={"new_version": "x"}).status == 200


def test_a_deposed_controllers_mutation_is_not_mutated(srv: SimServer) -> None:
    """Two HttpAdapters as two controllers: once the newer one fenced the engine, the
    older one's load is refused before anything moved (and it does not relabel)."""
    with adapter(srv) as old, adapter(srv) as new:
        assert old.fence_epoch(1, dl()).accepted and old.epoch == 1
        assert new.fence_epoch(2, dl()).accepted and new.epoch == 2
        refused = old.mutate(target(2, "v2"), dl())
        assert refused.outcome is MutationOutcome.NOT_MUTATED, refused.observed
        assert new.read_state(dl()) == EngineReport("default", sim_identity("v1"), False, 0)
        assert new.mutate(target(2, "v2"), dl()).outcome is MutationOutcome.COMPLETED
        assert new.read_label(dl()) == "v2-gen2"


def test_a_new_leaders_fence_ends_what_the_deposed_leaders_gateway_sends(
        srv: SimServer, pool: ThreadPoolExecutor) -> None:
    """The leader's gateway stamps its requests with the leader's epoch; a successor's
    fence (``fence_epoch``) raises the engine's gateway fences too, its own gateway's and
    every remote gateway's at once: the requests the deposed leader's gateways still have
    running (ones the paused engine holds) are ended before their answers began (409
    ``gateway_fenced``), new ones stamped with the old epochs are refused, and the fence
    is accepted only once nothing of the old epochs runs."""
    body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 4}
    old_stamp = {GATEWAY_HEADER: stamp(LEADER_GATEWAY, 1)}
    # A remote gateway the deposed leader registered (serve --gateway-only): its epoch
    # lies above the old leader's floor, below the new one's.
    old_remote = {GATEWAY_HEADER: stamp("g1", remote_floor(1) + 7)}
    with adapter(srv) as old, adapter(srv) as new, httpx.Client(base_url=srv.url) as c:
        assert old.fence_epoch(1, dl()).accepted
        assert c.post("/v1/completions", json=body, headers=old_stamp).status_code == 200
        assert c.post("/v1/completions", json=body, headers=old_remote).status_code == 200
        assert old.pause(PauseMode.KEEP, dl()).paused_read_back
        held = pool.submit(c.post, "/v1/completions", json=body, headers=old_stamp)
        held_remote = pool.submit(c.post, "/v1/completions", json=body, headers=old_remote)
        wait_until(lambda: c.get(FENCE_PATH).json()["running"] == {LEADER_GATEWAY: 1,
                                                                   "g1": 1},
                   "the held requests run")
        ev = new.fence_epoch(2, dl())
        assert ev.accepted and new.epoch == 2, ev
        for fut in (held, held_remote):
            answer = fut.result(BOUND)
            assert answer.status_code == 409 and \
                answer.json()["error"]["code"] == "gateway_fenced", answer.text
        assert new.resume(dl()).paused_read_back is False
        for headers in (old_stamp, old_remote):
            refused = c.post("/v1/completions", json=body, headers=headers)
            assert refused.status_code == 409, refused.text
        for headers in ({GATEWAY_HEADER: stamp(LEADER_GATEWAY, 2)},
                        {GATEWAY_HEADER: stamp("g1", remote_floor(2) + 1)}):
            assert c.post("/v1/completions", json=body, headers=headers).status_code == 200
        # The old leader cannot fence its way back: its workers refuse epoch 1.
        assert not old.fence_epoch(1, dl()).accepted


def test_a_fence_waits_for_the_load_in_progress(pool: ThreadPoolExecutor) -> None:
    with SimServer(in_thread=True, load_seconds=0.5) as srv, adapter(srv) as http:
        load = pool.submit(result, http, "rc_reload_weights", weights_path="v2", epoch=1)
        wait_until(lambda: result(http, "rc_epoch")["seen"] == 1, "the load holds the gate")
        assert http.read_identity(dl()) == sim_identity("v1")  # still loading
        assert result(http, "rc_fence", epoch=2) == {"accepted": True, "seen": 2}
        # The fence took effect only after the load: the load had finished by then.
        assert http.read_identity(dl()) == sim_identity("v2")
        assert load.result(BOUND)["loaded"] is True


def test_unknown_checkpoints_are_refused_by_the_worker_and_kill_vllms_reload() -> None:
    """With --checkpoints, the worker extension refuses a missing one (nothing changed);
    vLLM's own reload dies halfway on it: /health stays 200, the next generation fails,
    and the server exits with rc 0 a moment later, as observed on the real server."""
    with SimServer(checkpoints=["v1", "v2"]) as srv, adapter(srv) as http:
        refused = http.mutate(target(2, "nope"), dl())
        assert refused.outcome is MutationOutcome.NOT_MUTATED, refused.observed
        assert http.read_state(dl()) == EngineReport("default", sim_identity("v1"), False, 0)
        r = http.rpc("reload_weights", op="test", idempotent=False,
                     weights_path="/nonexistent/dir")
        assert r.status == 500 and "Call to collective_rpc method failed" in r.text
        assert httpx.get(f"{srv.url}/health", trust_env=False).status_code == 200
        assert result(http, "rc_identity")["identity"] is None
        probe = http.probe(PROBE, 4, dl())
        assert probe.http_status == 500 and "EngineCore" in str(probe.error)
        assert srv.proc is not None and srv.proc.wait(BOUND) == 0


# --------------------------------------------------------------------------- pauses


@pytest.mark.parametrize("route", ["sleep", "pause"])
def test_abort_pause_ends_requests_in_flight_and_queues_new_ones(
        srv: SimServer, pool: ThreadPoolExecutor, route: str) -> None:
    with adapter(srv, pause_route=route) as http:
        running = pool.submit(http.generate, ROLLOUT, 400)  # 0.8 s at 2 ms a token
        wait_until(lambda: http.running_requests() == 1, "the request runs")
        ev = http.pause(PauseMode.ABORT, dl())
        assert http.pause_route == route  # the route exists: no fallback
        assert ev.http_status == 200 and ev.paused_read_back is True and ev.running_after == 0
        assert decided(Op.PAUSE_ABORT, ev) == ok(Op.PAUSE_ABORT)
        out = running.result(BOUND)
        assert out.finish_reason == "abort" and len(out.tokens) < 400
        assert out.tokens == reference_tokens("v1", ROLLOUT, len(out.tokens))
        queued = pool.submit(http.generate, ROLLOUT, 4)
        wait_until(lambda: gauge(http, WAITING) == 1, "the new request waits")
        assert not queued.done() and http.running_requests() == 0
        assert http.resume(dl()).paused_read_back is False
        late = queued.result(BOUND)
        assert late.finish_reason == "length" and late.tokens == reference_tokens("v1",
                                                                                   ROLLOUT, 4)


def test_wait_pause_returns_once_requests_in_flight_finish(
        http: HttpAdapter, pool: ThreadPoolExecutor) -> None:
    running = pool.submit(http.generate, ROLLOUT, 100)
    wait_until(lambda: http.running_requests() == 1, "the request runs")
    ev = http.pause(PauseMode.WAIT, dl())
    assert ev.http_status == 200 and ev.paused_read_back is True and ev.running_after == 0
    out = running.result(BOUND)  # whole, not cut short
    assert out.finish_reason == "length" and out.tokens == reference_tokens("v1", ROLLOUT, 100)


def test_keep_pause_freezes_requests_that_resume_intact(
        srv: SimServer, http: HttpAdapter, pool: ThreadPoolExecutor) -> None:
    seen: list[int] = []
    body = {"prompt": list(ROLLOUT), "max_tokens": 200, "return_token_ids": True}
    kept = pool.submit(stream, srv.url, body,
                       lambda ev: seen.extend(ev["choices"][0]["token_ids"]))
    wait_until(lambda: len(seen) >= 3, "the stream is under way")
    # The adapter reads the running gauge until its deadline: the kept request stays.
    ev = http.pause(PauseMode.KEEP, dl(0.3))
    assert ev.http_status == 200 and ev.paused_read_back is True and ev.running_after == 1
    frozen = len(seen)
    assert 0 < frozen < 200 and http.running_requests() == 1
    assert http.read_paused(dl()) is True and len(seen) == frozen  # no token while kept
    assert http.resume(dl()).paused_read_back is False
    tokens, _lps, finish = streamed(kept.result(BOUND))
    assert finish == "length" and tokens == list(reference_tokens("v1", ROLLOUT, 200))


def test_sleep_levels_and_wake_up_tags(srv: SimServer, http: HttpAdapter) -> None:
    def post(path: str, **params: str) -> Any:
        r = http.request("POST", path, op="test", idempotent=True, params=params)
        assert r.status == 200, r.text
        return r.body

    http.generate(PROBE, 1)
    assert post("/sleep", level="0", mode="abort") == {"status": "sleeping", "level": 0}
    assert post("/wake_up", tags="scheduling") == {"status": "awake", "tags": ["scheduling"]}
    # Level 1 also drops the KV cache and sleeps memory: scheduling resumes only once
    # every tag woke.
    assert post("/sleep", level="1", mode="wait") == {"status": "sleeping", "level": 1}
    assert post("/wake_up", tags="scheduling") == {"status": "sleeping",
                                                   "tags": ["scheduling"]}
    assert http.read_paused(dl()) is True
    assert post("/wake_up") == {"status": "awake", "tags": None}
    assert http.read_paused(dl()) is False
    assert http.probe(PROBE, 1, dl()).prefix_hits == 0


# --------------------------------------------------------------------------- streaming


def test_a_streamed_completion(srv: SimServer, http: HttpAdapter) -> None:
    body = {"prompt": list(PROBE), "max_tokens": 12, "return_token_ids": True, "logprobs": 0,
            "stream_options": {"include_usage": True}}
    events = stream(srv.url, body)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    assert len(chunks) == 12 and chunks[0]["choices"][0]["prompt_token_ids"] == list(PROBE)
    assert all(c["choices"][0]["prompt_token_ids"] is None for c in chunks[1:])
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 11 + ["length"]
    tokens, logprobs, _ = streamed(events)
    assert tokens == list(reference_tokens("v1", PROBE, 12))
    usage = events[-2]["usage"]
    assert events[-2]["choices"] == [] and usage["completion_tokens"] == 12
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    again = stream(srv.url, body)
    assert again[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
    # The behaviour logprobs are what a scored prefill of the sequence gives: as a
    # trainer's recomputation would.
    r = http.request("POST", "/v1/completions", op="test", idempotent=False, json_body={
        "prompt": [*PROBE, *tokens], "max_tokens": 1, "prompt_logprobs": 0})
    scores = [next(iter(e.values()))["logprob"] for e in r.body["choices"][0]
              ["prompt_logprobs"][len(PROBE):]]
    assert scores == logprobs
    # The non-streamed answer is the same.
    out = http.generate(PROBE, 12)
    assert list(out.tokens) == tokens and list(out.logprobs or ()) == logprobs


def test_a_client_that_goes_away_ends_its_request() -> None:
    with SimServer(in_thread=True, token_seconds=0.02) as srv, adapter(srv) as http:
        body = {"prompt": list(ROLLOUT), "max_tokens": 400, "return_token_ids": True}
        stream(srv.url, body, stop_after=3)  # 8 s of tokens left when it leaves
        wait_until(lambda: http.running_requests() == 0, "the request ended", timeout=4.0)
        assert srv.sim is not None and srv.sim.engine.completed == 1
        with pytest.raises(httpx.ReadTimeout):  # not streamed: the client gives up
            httpx.post(f"{srv.url}/v1/completions", json=body, timeout=0.3, trust_env=False)
        wait_until(lambda: http.running_requests() == 0, "the request ended", timeout=4.0)
        assert srv.sim.engine.completed == 2


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_answered_like_vllm(srv: SimServer, http: HttpAdapter) -> None:
    def post(path: str, content: bytes | None = None, **kw: Any) -> httpx.Response:
        return httpx.post(f"{srv.url}{path}", content=content, trust_env=False, **kw)

    for path in ("/v1/completions", "/collective_rpc", "/update_weight_version"):
        r = post(path, b"{not json")
        assert r.status_code == 400 and r.json()["error"]["code"] == 400, (path, r.text)
    assert post("/collective_rpc", json={"kwargs": {}}).status_code == 400  # no method
    reply = http.rpc("no_such_method", op="test")
    assert reply.status == 500 and "not implemented" in reply.text
    assert http.read_label(dl()) == "default"  # the next call works (fresh connection)
    reply = http.rpc("rc_reload_weights", op="test", idempotent=False, path="v2")
    assert reply.status == 500 and "unexpected keyword argument 'path'" in reply.text
    assert http.read_identity(dl()) == sim_identity("v1")
    r = post("/pause", params={"mode": "bogus"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "query.mode"
    assert post("/sleep", params={"level": "3"}).status_code == 400
    assert post("/update_weight_version", json={}).status_code == 400
    for body, status in (({"model": "other", "prompt": [1]}, 404),
                         ({"prompt": [1], "stream": True, "prompt_logprobs": 0}, 400),
                         ({"prompt": [1], "max_tokens": 0}, 400),
                         ({"prompt": [1, 5000]}, 400),
                         ({"prompt": [1] * 500, "max_tokens": 100}, 400),
                         ({"prompt": []}, 400)):
        r = post("/v1/completions", json=body)
        assert r.status_code == status and "message" in r.json()["error"], (body, r.text)
    assert http.read_state(dl()) == EngineReport("default", sim_identity("v1"), False, 0)


def test_reads_that_other_clients_make(srv: SimServer) -> None:
    """/v1/models, /server_info (the RL client's logprobs mode), the metrics filter."""
    from rolloutcore.rl.client import engine_logprobs_mode

    models = httpx.get(f"{srv.url}/v1/models", trust_env=False).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert engine_logprobs_mode([srv.url]) == "raw_logprobs"
    text = httpx.get(f"{srv.url}/metrics/", params={"name[]": "vllm:prefix_cache_hits_total"},
                     trust_env=False).text
    assert "vllm:prefix_cache_hits_total{" in text and "queries" not in text
    assert "vllm:prefix_cache_queries_total{" in httpx.get(f"{srv.url}/metrics",
                                                           trust_env=False).text


# --------------------------------------------------------------------------- processes


CONTROLLER = """
import sys, httpx
body = {"model": "tiny", "prompt": [3, 1, 4], "max_tokens": 400, "stream": True}
with httpx.stream("POST", sys.argv[1] + "/v1/completions", json=body, timeout=60) as r:
    for line in r.iter_lines():
        if line.startswith("data: "):
            print("streaming", flush=True)
            sys.stdin.read()  # holds the stream open until it is killed
"""


def test_the_server_outlives_a_killed_controller_and_stops_cleanly() -> None:
    with SimServer(token_seconds=0.02) as srv, adapter(srv) as http:
        assert srv.pid is not None and srv.pid != os.getpid()
        ctl = subprocess.Popen([sys.executable, "-c", CONTROLLER, srv.url], text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert ctl.stdout is not None and ctl.stdout.readline().strip() == "streaming"
            assert http.running_requests() == 1
            ctl.send_signal(signal.SIGKILL)
            assert ctl.wait(BOUND) == -signal.SIGKILL
        finally:
            ctl.kill()
        # Its request ends with it (the client went away); the engine serves on.
        wait_until(lambda: http.running_requests() == 0, "the orphaned request ended",
                   timeout=4.0)
        assert srv.alive() and http.generate(PROBE, 4).tokens == reference_tokens("v1",
                                                                                   PROBE, 4)
        assert srv.stop() == 0  # SIGTERM: a clean exit, as vLLM's
    assert not srv.alive()


def test_the_launcher_prints_its_url_and_serves_the_flags(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "rolloutcore.conformance.fixtures.sim_server",
                             "--port", "0", "--initial", "v7", "--model", "m",
                             "--label", "boot"], stdout=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        with HttpAdapter(url, model="m") as http:
            assert http.read_state(dl()) == EngineReport("boot", sim_identity("v7"), False, 0)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(BOUND) == 0
