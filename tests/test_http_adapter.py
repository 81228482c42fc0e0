"""The HTTP adapter against a fake vLLM behind httpx.MockTransport: status and body
checks, unverifiable resets, bounded retries on a fresh connection for idempotent calls
only, the mutation never retried, loopback-only plain http, the bearer token, timeouts
on every call, and identity/label read separately."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import decided, dl

from rolloutcore.adapters.contract import AdapterError, MutationOutcome, PauseMode, WeightTarget
from rolloutcore.adapters.http import HttpAdapter, Timeouts, check_url
from rolloutcore.engine.controller import Controller
from rolloutcore.engine.identity import (
    checkpoint_identity,
    manifest_digest,
    write_safetensors,
)
from rolloutcore.engine.postconditions import Expected
from rolloutcore.engine.runner import LifecycleRunner, RunnerPolicy
from rolloutcore.journal import Journal, read_journal
from rolloutcore.spec.lifecycle import Phase
from rolloutcore.spec.triggers import Op

URL = "http://127.0.0.1:8000"
Handler = Callable[[httpx.Request], httpx.Response]


class FakeVllm:
    """Just enough of vLLM 0.32's dev-mode surface; ``override[path]`` replaces a route
    with a function (or a list of functions, consumed one per call)."""

    def __init__(self, checkpoint: Path) -> None:
        self.label = "default"
        self.paused = False
        self.identity = checkpoint_identity(checkpoint)
        self.hits = 0
        self.queries = 0
        self.running = 0
        self.calls: list[httpx.Request] = []
        self.override: dict[str, Any] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request)
        path = request.url.path
        o = self.override.get(path)
        if isinstance(o, list):
            if o:
                return o.pop(0)(request)  # type: ignore[no-any-return]
        elif o is not None:
            return o(request)  # type: ignore[no-any-return]
        return self.route(request)

    def route(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body: Any = json.loads(request.content) if request.content else None
        if path == "/weight_info":
            return httpx.Response(200, json={"weight_version": self.label})
        if path == "/is_paused":
            return httpx.Response(200, json={"is_paused": self.paused})
        if path == "/metrics":
            return httpx.Response(200, text=(
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {self.running}.0\n'
                f'vllm:prefix_cache_queries_total{{engine="0",model_name="tiny"}} '
                f"{self.queries}.0\n"
                f'vllm:prefix_cache_hits_total{{engine="0",model_name="tiny"}} {self.hits}.0\n'))
        if path == "/pause":
            self.paused = True
            return httpx.Response(200, json={"status": "paused"})
        if path == "/resume":
            self.paused = False
            return httpx.Response(200, json={"status": "resumed"})
        if path == "/reset_prefix_cache":
            return httpx.Response(200, json={"success": True})
        if path in ("/reset_encoder_cache", "/reset_mm_cache"):
            return httpx.Response(200)
        if path == "/update_weight_version":
            self.label = body["new_version"]
            return httpx.Response(200, json={"success": True, "new_version": self.label})
        if path == "/collective_rpc":
            m = body["method"]
            if m == "rc_identity":
                return httpx.Response(200, json={"results": [{"identity": self.identity}]})
            if m == "rc_cache_info":
                return httpx.Response(200, json={"results": [
                    {"multimodal": False, "encoder_cache_entries": 0,
                     "encoder_scheduler_entries": 0, "mm_receiver_entries": 0}]})
            if m == "rc_reload_weights":
                self.identity = body["kwargs"]["expected_identity"]
                return httpx.Response(200, json={"results": [
                    {"loaded": True, "identity": self.identity, "bytes": 123}]})
            return httpx.Response(500, json={"error": {"message": f"Method {m!r} is not "
                                                       "implemented.", "code": 500}})
        if path == "/v1/completions":
            prompt = body["prompt"]
            n = body["max_tokens"]
            self.queries += len(prompt)
            return httpx.Response(200, json={"choices": [{
                "index": 0, "token_ids": list(range(n)), "prompt_token_ids": prompt,
                "finish_reason": "length", "logprobs": {"token_logprobs": [-1.0] * n}}]})
        return httpx.Response(404, json={"detail": "Not Found"})

    def paths(self) -> list[str]:
        return [r.url.path for r in self.calls]


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    write_safetensors(d / "model.safetensors", [
        ("a.weight", "F32", [2, 2], bytes(range(16))),
        ("b.bias", "F32", [2], bytes(8)),
    ])
    return d


@pytest.fixture
def fake(checkpoint: Path) -> FakeVllm:
    return FakeVllm(checkpoint)


def adapter_for(fake: FakeVllm, **kw: Any) -> HttpAdapter:
    kw.setdefault("retry_backoff_s", 0.0)
    return HttpAdapter(URL, transport=httpx.MockTransport(fake), **kw)


def target_for(checkpoint: Path, label: str = "v2") -> WeightTarget:
    return WeightTarget(2, label, checkpoint_identity(checkpoint), str(checkpoint), (1, 2, 3),
                        (0, 1, 2, 3))


def raise_(exc: type[Exception]) -> Handler:
    def h(request: httpx.Request) -> httpx.Response:
        raise exc("boom", request=request)  # type: ignore[call-arg]
    return h


def respond(status: int, text: str = "", **kw: Any) -> Handler:
    return lambda request: httpx.Response(status, text=text, **kw)


# ----------------------------------------------------------------------- identity


def test_identity_is_content_not_manifest(tmp_path: Path, checkpoint: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    write_safetensors(other / "model.safetensors", [
        ("a.weight", "F32", [2, 2], bytes(range(1, 17))), ("b.bias", "F32", [2], bytes(8))])
    assert manifest_digest(other) == manifest_digest(checkpoint)
    assert checkpoint_identity(other) != checkpoint_identity(checkpoint)
    assert len(checkpoint_identity(checkpoint)) == 64


# ------------------------------------------------------------------------ URL, token


@pytest.mark.parametrize("url", ["http://10.0.0.5:8000", "http://engine.internal:8000",
                                 "http://[2001:db8::1]:8000"])
def test_plain_http_to_a_remote_host_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="refusing plain-http"):
        HttpAdapter(url)
    check_url(url, allow_insecure_remote=True)  # explicitly allowed


@pytest.mark.parametrize("url", ["http://127.0.0.1:1", "http://localhost:1", "http://[::1]:1",
                                 "https://engine.internal:443"])
def test_loopback_and_https_are_accepted(url: str) -> None:
    HttpAdapter(url).close()


def test_bearer_token_is_sent_on_every_call(fake: FakeVllm, checkpoint: Path) -> None:
    a = adapter_for(fake, token="s3cret")
    a.read_state(dl())
    a.pause(PauseMode.WAIT, dl())
    a.mutate(target_for(checkpoint), dl())
    assert fake.calls and all(r.headers.get("authorization") == "Bearer s3cret"
                              for r in fake.calls)
    b = adapter_for(fake)
    fake.calls.clear()
    b.read_state(dl())
    assert all("authorization" not in r.headers for r in fake.calls)


def test_every_lifecycle_call_takes_its_timeouts_from_the_step_deadline(
        fake: FakeVllm, checkpoint: Path) -> None:
    """One deadline per step: every transport timeout of a lifecycle call is what is left
    of it (never a longer adapter default); the application's generations, which carry
    no step deadline, use the configured generation timeout."""
    a = adapter_for(fake, timeouts=Timeouts(read=3.0, generate=9.0))
    for call in (lambda d: a.read_state(d), lambda d: a.pause(PauseMode.WAIT, d),
                 lambda d: a.mutate(target_for(checkpoint), d), lambda d: a.resume(d),
                 lambda d: a.probe((1, 2, 3), 4, d),
                 *(lambda d, t=tier: a.reset_cache(t, d) for tier in ("prefix", "encoder", "mm"))):
        fake.calls.clear()
        call(dl(60.0))
        for r in fake.calls:
            t = r.extensions["timeout"]
            assert 59.0 < t["read"] <= 60.0 and t["connect"] == Timeouts().connect, r.url
        fake.calls.clear()
        call(dl(0.5))  # a deadline shorter than the connect timeout bounds that too
        assert all(r.extensions["timeout"]["connect"] <= 0.5 for r in fake.calls)
    fake.calls.clear()
    a.generate((1, 2, 3), 4)
    assert [r.extensions["timeout"]["read"] for r in fake.calls] == [9.0]


def test_a_timeout_is_an_error_not_a_retry(fake: FakeVllm) -> None:
    fake.override["/weight_info"] = raise_(httpx.ReadTimeout)
    a = adapter_for(fake)
    with pytest.raises(AdapterError, match="timed out") as ei:
        a.read_state(dl())
    assert not ei.value.proven_no_effect
    assert fake.paths().count("/weight_info") == 1


# ------------------------------------------------------------------------ reads


def test_read_state_reads_label_and_identity_separately(fake: FakeVllm) -> None:
    fake.label = "anything-goes"
    fake.running = 2
    r = adapter_for(fake).read_state(dl())
    assert (r.label, r.identity, r.paused, r.running_requests) == (
        "anything-goes", fake.identity, False, 2)


def test_unreadable_identity_is_an_error_with_the_engines_reason(fake: FakeVllm) -> None:
    fake.override["/collective_rpc"] = lambda req: httpx.Response(200, json={"results": [
        {"identity": None, "reason": "3 parameter(s) on the meta device"}]})
    with pytest.raises(AdapterError, match="meta device"):
        adapter_for(fake).read_state(dl())


def test_workers_that_disagree_give_no_identity(fake: FakeVllm) -> None:
    fake.override["/collective_rpc"] = lambda req: httpx.Response(200, json={"results": [
        {"identity": "a" * 64}, {"identity": "b" * 64}]})
    with pytest.raises(AdapterError, match="no single identity"):
        adapter_for(fake).read_identity()


@pytest.mark.parametrize("status,text", [(500, '{"error": {"message": "x"}}'), (200, "{}"),
                                         (200, '{"weight_version": 3}')])
def test_label_read_checks_status_and_body(fake: FakeVllm, status: int, text: str) -> None:
    fake.override["/weight_info"] = respond(status, text)
    with pytest.raises(AdapterError, match="read_label"):
        adapter_for(fake).read_state(dl())


def test_non_json_body_is_a_clear_error_and_changes_nothing(fake: FakeVllm,
                                                           tmp_path: Path) -> None:
    """Bootstrap against an engine whose label route answers HTML: bootstrap_failed with
    the reason in the journal, the controller still UNINITIALIZED."""
    fake.override["/weight_info"] = respond(200, "<html>proxy error</html>")
    path = tmp_path / "j.jsonl"
    with Journal(path, fsync=False) as j:
        c = Controller(trace=j)
        runner = LifecycleRunner(c, adapter_for(fake), RunnerPolicy(retries=0,
                                                                    retry_backoff_s=0.0))
        ckpt = tmp_path / "ck"
        ckpt.mkdir()
        write_safetensors(ckpt / "model.safetensors", [("w", "F32", [1], bytes(4))])
        initial = WeightTarget(1, "default", fake.identity, str(ckpt), (1,), (0,))
        outcome = runner.bootstrap(initial)
    assert outcome.trigger == "bootstrap_failed"
    assert "non-JSON body" in outcome.reason and "proxy error" in outcome.reason
    assert c.phase is Phase.UNINITIALIZED and c.control.committed == 0
    _rep, recs = read_journal(path)
    assert [r["step"] for r in recs[1:]] == ["bootstrap_begin", "bootstrap_failed"]
    assert "non-JSON" in recs[-1]["detail"]["reason"]


# ------------------------------------------------------------------ pause, resume


def test_pause_reads_back_paused_and_running(fake: FakeVllm) -> None:
    ev = adapter_for(fake).pause(PauseMode.WAIT, dl())
    assert (ev.http_status, ev.body, ev.paused_read_back, ev.running_after) == (
        200, {"status": "paused"}, True, 0)
    req = next(r for r in fake.calls if r.url.path == "/pause")
    assert req.url.params["mode"] == "wait" and req.url.params["clear_cache"] == "false"
    assert decided(Op.PAUSE, ev) == "pause_ok"


def test_the_sleep_route_pauses_at_level_0_and_wakes_scheduling(fake: FakeVllm) -> None:
    def sleep(req: httpx.Request) -> httpx.Response:
        fake.paused = True
        return httpx.Response(200, json={"status": "sleeping", "level": 0})

    def wake(req: httpx.Request) -> httpx.Response:
        fake.paused = False
        return httpx.Response(200, json={"status": "awake"})

    fake.override.update({"/sleep": sleep, "/wake_up": wake})
    a = adapter_for(fake, pause_route="sleep")
    assert decided(Op.PAUSE, a.pause(PauseMode.WAIT, dl())) == "pause_ok"
    assert decided(Op.RESUME, a.resume(dl())) == "resume_ok"
    req = next(r for r in fake.calls if r.url.path == "/sleep")
    assert (req.url.params["level"], req.url.params["mode"]) == ("0", "wait")
    wake_req = next(r for r in fake.calls if r.url.path == "/wake_up")
    assert wake_req.url.params.get_list("tags") == ["scheduling"]
    assert "/pause" not in fake.paths() and "/resume" not in fake.paths()


def test_a_server_without_sleep_is_paused_through_pause(fake: FakeVllm) -> None:
    a = adapter_for(fake, pause_route="sleep")
    assert decided(Op.PAUSE, a.pause(PauseMode.WAIT, dl())) == "pause_ok"
    assert fake.paths()[:2] == ["/sleep", "/pause"] and a.pause_route == "pause"
    assert decided(Op.RESUME, a.resume(dl())) == "resume_ok"
    assert "/wake_up" not in fake.paths()


def test_an_unknown_pause_route_is_refused(fake: FakeVllm) -> None:
    with pytest.raises(ValueError, match="pause_route"):
        adapter_for(fake, pause_route="nap")


def test_a_200_pause_that_did_not_pause_is_not_ok(fake: FakeVllm) -> None:
    fake.override["/pause"] = lambda req: httpx.Response(200, json={"status": "paused"})
    ev = adapter_for(fake).pause(PauseMode.WAIT, dl())
    assert ev.paused_read_back is False
    assert decided(Op.PAUSE, ev) == "pause_failed"


def test_resume_reads_back(fake: FakeVllm) -> None:
    fake.paused = True
    ev = adapter_for(fake).resume(dl())
    assert ev.paused_read_back is False and decided(Op.RESUME, ev) == "resume_ok"


# ------------------------------------------------------------------------ resets


@pytest.mark.parametrize("status,body,trigger", [
    (200, {"success": True}, "reset_ok"),
    (200, {"success": False}, "reset_failed"),  # refused: blocks in use
    (200, None, "reset_failed"),  # empty body (other vLLM versions): not verified
    (200, {"success": "yes"}, "reset_failed"),
    (500, {"error": {"message": "x"}}, "reset_failed"),
])
def test_prefix_reset_counts_only_with_success_true(fake: FakeVllm, status: int,
                                                    body: Any, trigger: str) -> None:
    fake.override["/reset_prefix_cache"] = (
        lambda req: httpx.Response(status) if body is None else
        httpx.Response(status, json=body))
    ev = adapter_for(fake).reset_cache("prefix", dl())
    assert decided(Op.RESET, ev) == trigger
    req = next(r for r in fake.calls if r.url.path == "/reset_prefix_cache")
    assert req.url.params["reset_running_requests"] == "false"


def test_encoder_and_mm_resets_are_verified_by_the_engines_word(fake: FakeVllm) -> None:
    a = adapter_for(fake)
    enc, mm = a.reset_cache("encoder", dl()), a.reset_cache("mm", dl())
    assert enc.body_success is None and enc.entries_after == 0 and enc.tier_absent
    assert mm.body_success is None and mm.tier_absent
    assert decided(Op.RESET, enc) == decided(Op.RESET, mm) == "reset_ok"


def test_empty_reset_without_the_engines_word_is_not_verified(fake: FakeVllm) -> None:
    fake.override["/collective_rpc"] = respond(500, '{"error": {"message": "no extension"}}')
    a = adapter_for(fake)
    for tier in ("encoder", "mm"):
        ev = a.reset_cache(tier, dl())
        assert not ev.tier_absent and ev.entries_after is None
        assert decided(Op.RESET, ev) == "reset_failed"


def test_multimodal_engine_tier_is_not_claimed_absent(fake: FakeVllm) -> None:
    fake.override["/collective_rpc"] = lambda req: httpx.Response(200, json={"results": [
        {"multimodal": True, "encoder_cache_entries": 3}]})
    ev = adapter_for(fake).reset_cache("mm", dl())
    assert not ev.tier_absent and decided(Op.RESET, ev) == "reset_failed"
    enc = adapter_for(fake).reset_cache("encoder", dl())
    # the scheduler's half is unknown: the worker's count alone proves nothing
    assert enc.entries_after is None and decided(Op.RESET, enc) == "reset_failed"


@pytest.mark.parametrize(("worker", "scheduler", "receiver", "encoder_ok", "mm_ok"), [
    (0, 0, 0, True, True),
    # vLLM's reload_weights empties the worker but not the scheduler: the engine would
    # skip the encoder for a listed image and die on the miss
    (0, 1, 0, False, True),
    (1, 0, 2, False, False),
    (0, None, None, False, False),  # not reachable (another process): unknown
])
def test_multimodal_resets_count_both_encoder_halves_and_the_receiver_cache(
        fake: FakeVllm, worker: int, scheduler: int | None, receiver: int | None,
        encoder_ok: bool, mm_ok: bool) -> None:
    fake.override["/collective_rpc"] = lambda req: httpx.Response(200, json={"results": [
        {"multimodal": True, "encoder_cache_entries": worker,
         "encoder_scheduler_entries": scheduler, "mm_receiver_entries": receiver}]})
    a = adapter_for(fake)
    enc, mm = a.reset_cache("encoder", dl()), a.reset_cache("mm", dl())
    assert (decided(Op.RESET, enc) == "reset_ok") is encoder_ok
    assert (decided(Op.RESET, mm) == "reset_ok") is mm_ok
    assert not enc.tier_absent and not mm.tier_absent


# ------------------------------------------------------------- connection resets


def test_idempotent_call_survives_a_connection_reset_on_a_fresh_connection(
        fake: FakeVllm) -> None:
    fake.override["/weight_info"] = [raise_(httpx.ReadError)]
    a = adapter_for(fake)
    created = a.clients_created
    assert a.read_label() == "default"
    assert fake.paths().count("/weight_info") == 2
    assert a.clients_created == created + 1  # the failed connection was not reused


def test_retries_are_bounded(fake: FakeVllm) -> None:
    fake.override["/is_paused"] = raise_(httpx.RemoteProtocolError)
    a = adapter_for(fake, retries=2)
    with pytest.raises(AdapterError, match="after 3 attempts"):
        a.read_paused()
    assert fake.paths().count("/is_paused") == 3


def test_the_pool_is_replaced_after_an_engine_500(fake: FakeVllm) -> None:
    a = adapter_for(fake)
    created = a.clients_created
    r = a.rpc("no_such_method", op="test")
    assert r.status == 500
    assert a.clients_created == created + 1


def test_generation_is_not_retried(fake: FakeVllm) -> None:
    fake.override["/v1/completions"] = raise_(httpx.ReadError)
    a = adapter_for(fake)
    with pytest.raises(AdapterError):
        a.generate((1, 2), 3)
    ev = a.probe((1, 2), 3, dl())
    assert ev.tokens is None and ev.error
    assert fake.paths().count("/v1/completions") == 2


# ------------------------------------------------------------------------ mutation


def test_mutation_loads_then_finalises_the_label(fake: FakeVllm, checkpoint: Path) -> None:
    a = adapter_for(fake)
    t = target_for(checkpoint, "v2")
    ev = a.mutate(t, dl())
    assert ev.outcome is MutationOutcome.COMPLETED and ev.bytes_moved == 123
    paths = fake.paths()
    rpc = next(r for r in fake.calls if r.url.path == "/collective_rpc")
    kwargs = json.loads(rpc.content)["kwargs"]
    assert kwargs == {"weights_path": str(checkpoint), "expected_identity": t.identity}
    assert paths.index("/collective_rpc") < paths.index("/update_weight_version")
    assert fake.label == "v2"


def test_mutation_starts_on_a_fresh_connection(fake: FakeVllm, checkpoint: Path) -> None:
    a = adapter_for(fake)
    created = a.clients_created
    a.mutate(target_for(checkpoint), dl())
    assert a.clients_created == created + 1


@pytest.mark.parametrize("exc", [httpx.ReadError, httpx.RemoteProtocolError, httpx.ReadTimeout])
def test_mutation_is_never_retried_and_a_dropped_call_is_ambiguous(
        fake: FakeVllm, checkpoint: Path, exc: type[Exception]) -> None:
    fake.override["/collective_rpc"] = raise_(exc)
    ev = adapter_for(fake, retries=5).mutate(target_for(checkpoint), dl())
    assert ev.outcome is MutationOutcome.AMBIGUOUS
    assert fake.paths().count("/collective_rpc") == 1
    assert "/update_weight_version" not in fake.paths()  # no label without a load
    assert fake.label == "default"


def test_mutation_500_is_ambiguous(fake: FakeVllm, checkpoint: Path) -> None:
    fake.override["/collective_rpc"] = respond(
        500, '{"error": {"message": "Call to collective_rpc method failed: "}}')
    ev = adapter_for(fake).mutate(target_for(checkpoint), dl())
    assert ev.outcome is MutationOutcome.AMBIGUOUS and "HTTP 500" in ev.observed
    assert "/update_weight_version" not in fake.paths()


def test_mutation_non_json_body_is_ambiguous_and_not_finalised(fake: FakeVllm,
                                                              checkpoint: Path) -> None:
    fake.override["/collective_rpc"] = respond(200, "Internal Server Error")
    ev = adapter_for(fake).mutate(target_for(checkpoint), dl())
    assert ev.outcome is MutationOutcome.AMBIGUOUS and "non-JSON" in ev.observed
    assert fake.label == "default"


def test_connection_never_made_proves_no_mutation(fake: FakeVllm, checkpoint: Path) -> None:
    fake.override["/collective_rpc"] = raise_(httpx.ConnectError)
    with pytest.raises(AdapterError) as ei:
        adapter_for(fake).mutate(target_for(checkpoint), dl())
    assert ei.value.proven_no_effect


def test_missing_source_is_refused_before_sending_anything(fake: FakeVllm,
                                                          tmp_path: Path) -> None:
    t = WeightTarget(2, "v2", "a" * 64, str(tmp_path / "nope"), (1,), (1,))
    with pytest.raises(AdapterError, match="refused before sending") as ei:
        adapter_for(fake).mutate(t, dl())
    assert ei.value.proven_no_effect and fake.calls == []


def test_worker_refusal_is_not_mutated(fake: FakeVllm, checkpoint: Path) -> None:
    fake.override["/collective_rpc"] = lambda req: httpx.Response(200, json={"results": [
        {"loaded": False, "refused": "manifest differs"}]})
    ev = adapter_for(fake).mutate(target_for(checkpoint), dl())
    assert ev.outcome is MutationOutcome.NOT_MUTATED and "manifest differs" in ev.observed
    assert "/update_weight_version" not in fake.paths()


def test_loaded_identity_other_than_the_targets_is_ambiguous(fake: FakeVllm,
                                                            checkpoint: Path) -> None:
    fake.override["/collective_rpc"] = lambda req: httpx.Response(200, json={"results": [
        {"loaded": True, "identity": "f" * 64}]})
    ev = adapter_for(fake).mutate(target_for(checkpoint), dl())
    assert ev.outcome is MutationOutcome.AMBIGUOUS
    assert "/update_weight_version" not in fake.paths()


@pytest.mark.parametrize("handler", [
    respond(200, '{"success": false}'),
    respond(200, '{"success": true, "new_version": "something-else"}'),
    respond(500, "{}"),
])
def test_unfinalised_label_is_ambiguous(fake: FakeVllm, checkpoint: Path,
                                        handler: Handler) -> None:
    fake.override["/update_weight_version"] = handler
    ev = adapter_for(fake).mutate(target_for(checkpoint), dl())
    assert ev.outcome is MutationOutcome.AMBIGUOUS and "label not finalised" in ev.observed


def test_finalisation_is_retried_on_a_fresh_connection(fake: FakeVllm,
                                                       checkpoint: Path) -> None:
    fake.override["/update_weight_version"] = [raise_(httpx.ReadError)]
    ev = adapter_for(fake).mutate(target_for(checkpoint, "v9"), dl())
    assert ev.outcome is MutationOutcome.COMPLETED and fake.label == "v9"
    assert fake.paths().count("/collective_rpc") == 1


def test_builtin_reload_method(fake: FakeVllm, checkpoint: Path) -> None:
    fake.override["/collective_rpc"] = lambda req: httpx.Response(200, json={"results": [None]})
    ev = adapter_for(fake, mutation_method="reload_weights").mutate(target_for(checkpoint), dl())
    assert ev.outcome is MutationOutcome.COMPLETED
    rpc = next(r for r in fake.calls if r.url.path == "/collective_rpc")
    assert json.loads(rpc.content) == {"method": "reload_weights",
                                       "kwargs": {"weights_path": str(checkpoint)}}


# ------------------------------------------------------------------------ probe


def test_probe_reports_the_prefix_hits_it_caused(fake: FakeVllm) -> None:
    def completion(req: httpx.Request) -> httpx.Response:
        fake.hits += 96
        return fake.route(req)

    fake.override["/v1/completions"] = completion
    ev = adapter_for(fake).probe((5, 6, 7), 4, dl())
    assert ev.tokens == (0, 1, 2, 3) and ev.prefix_hits == 96
    # stale reuse: hits on the first request after invalidation
    assert decided(Op.PROBE, ev, Expected(probe_tokens=(0, 1, 2, 3))) == "probe_mismatch"
    body = json.loads(next(r for r in fake.calls if r.url.path == "/v1/completions").content)
    assert body["min_tokens"] == body["max_tokens"] == 4 and body["temperature"] == 0.0
    assert body["return_token_ids"] is True and body["prompt"] == [5, 6, 7]


def test_aborted_probe_is_no_evidence(fake: FakeVllm) -> None:
    fake.override["/v1/completions"] = lambda req: httpx.Response(200, json={"choices": [{
        "token_ids": [0, 1], "prompt_token_ids": [1], "finish_reason": "abort"}]})
    ev = adapter_for(fake).probe((1,), 4, dl())
    assert ev.tokens is None and "abort" in (ev.error or "")
    assert decided(Op.PROBE, ev, Expected(probe_tokens=(0, 1, 2, 3))) == "probe_failed"


def test_probe_on_a_different_prompt_is_an_error(fake: FakeVllm) -> None:
    fake.override["/v1/completions"] = lambda req: httpx.Response(200, json={"choices": [{
        "token_ids": [0], "prompt_token_ids": [9], "finish_reason": "length"}]})
    assert adapter_for(fake).probe((1,), 1, dl()).tokens is None
