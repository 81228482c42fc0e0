"""The gateway in front of two real vLLM CPU servers (one pair for the module).

A Fleet of two ``HttpAdapter`` members, bootstrapped on the tiny model v1, behind the
gateway (in-process, uvicorn on a thread). Requests are greedy (temperature 0,
``min_tokens == max_tokens``) on the tiny model's reference prompts, so every answer's
tokens can be compared with the greedy reference of the checkpoint its
``X-RolloutCore-Generation`` names (as conformance/scenarios.py does). The last test
runs ``rolloutcore serve`` itself over the same engines, with a fleet journal of its own.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

import httpx  # noqa: E402
import openai  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from rolloutcore import cli  # noqa: E402
from rolloutcore.adapters.http import HttpAdapter  # noqa: E402
from rolloutcore.adapters.launch import free_port  # noqa: E402
from rolloutcore.check.fleet_trace import check_fleet_file  # noqa: E402
from rolloutcore.conformance.fixtures.server_pool import ServerPool  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models  # noqa: E402
from rolloutcore.conformance.fixtures.vllm_server import VllmServer  # noqa: E402
from rolloutcore.engine.identity import checkpoint_identity  # noqa: E402
from rolloutcore.engine.targets import checkpoint_target, load_references  # noqa: E402
from rolloutcore.fleet import Fleet  # noqa: E402
from rolloutcore.gateway.core import Gateway, GatewayConfig  # noqa: E402
from rolloutcore.gateway.server import ServerThread  # noqa: E402
from rolloutcore.journal import read_journal  # noqa: E402
from rolloutcore.spec.triggers import Trigger  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BOUND = 60.0  # a bound against a broken test, never a measurement
CLIENTS = 64  # concurrent clients in the load test
UPDATES = ("v2", "v1", "v2", "v1", "v2")  # five updates back to back, new generations
N_TOKENS = 16  # the references' length


@dataclass
class Env:
    url: str
    gw: Gateway
    fleet: Fleet
    servers: dict[str, VllmServer]
    models: dict[str, Path]
    journal: Path
    records: Path
    refs: dict[str, dict[str, list[int]]]  # checkpoint -> probe name -> tokens
    prompts: dict[str, list[int]]
    checkpoints: dict[int, str] = field(default_factory=dict)  # generation -> checkpoint
    load: Counter[tuple[int, int]] = field(default_factory=Counter)  # (gen, status) -> n

    def engine_metric(self, engine: str, name: str) -> float:
        text = httpx.get(f"{self.servers[engine].url}/metrics", timeout=10).text
        return sum(s.value for fam in text_string_to_metric_families(text)
                   for s in fam.samples if s.name == name)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, vllm_pool: ServerPool) -> Iterator[Env]:
    models = build_models(DEFAULT_OUT)
    work = tmp_path_factory.mktemp("gateway-vllm")
    with vllm_pool.leased(2) as leased:
        servers = dict(zip(("a", "b"), leased, strict=True))
        journal, records = work / "fleet.jsonl", work / "records.jsonl"
        # a quorum of one: with an engine gone the other keeps serving
        fleet = Fleet([(n, HttpAdapter(s.url), s.url) for n, s in servers.items()],
                      journal=journal, target_of=checkpoint_target, min_serving=1)
        out = fleet.bootstrap(checkpoint_target(models["v1"], 1, "default"))
        assert fleet.phase == "READY", out
        gw = Gateway(fleet, GatewayConfig(model="tiny", records=records, queue_depth=256,
                                          queue_wait_s=BOUND), target_of=checkpoint_target)
        refs = {v: {p["name"]: p["output_token_ids"] for p in
                    load_references(models[v])["probes"]} for v in ("v1", "v2")}
        prompts = {p["name"]: p["prompt_token_ids"] for p in
                   load_references(models["v1"])["probes"] if len(p["output_token_ids"])
                   == N_TOKENS}
        with ServerThread(gw) as url:
            yield Env(url, gw, fleet, servers, models, journal, records, refs, prompts,
                      {1: "v1"})
        gw.close()


def body(env: Env, name: str, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": env.prompts[name], "max_tokens": N_TOKENS,
            "min_tokens": N_TOKENS, "temperature": 0, "return_token_ids": True, **extra}


def test_openai_client_and_httpx_through_the_gateway(env: Env) -> None:
    client = openai.OpenAI(base_url=f"{env.url}/v1", api_key="unused", max_retries=0)
    v1 = checkpoint_identity(env.models["v1"])
    for name in env.prompts:
        raw = client.completions.with_raw_response.create(
            model="tiny", prompt=env.prompts[name], max_tokens=N_TOKENS, temperature=0,
            extra_body={"min_tokens": N_TOKENS, "return_token_ids": True})
        assert raw.headers["x-rolloutcore-generation"] == "1"
        assert raw.headers["x-rolloutcore-identity"] == v1
        assert raw.parse().choices[0].token_ids == env.refs["v1"][name]  # type: ignore[attr-defined]
        with client.completions.with_streaming_response.create(
                model="tiny", prompt=env.prompts[name], max_tokens=N_TOKENS, temperature=0,
                stream=True, extra_body={"min_tokens": N_TOKENS, "return_token_ids": True}
        ) as s:
            assert s.headers["x-rolloutcore-generation"] == "1"
            toks = [t for c in s.parse() for t in c.choices[0].token_ids]  # type: ignore[attr-defined]
        assert toks == env.refs["v1"][name]
    chat = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "the trainer sends"}],
        max_tokens=8, temperature=0)
    assert chat.headers["x-rolloutcore-engine"] in env.servers
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "the trainer sends"}],
        max_tokens=8, temperature=0, stream=True) if c.choices)
    assert streamed == chat.parse().choices[0].message.content
    r = httpx.post(f"{env.url}/v1/completions", json=body(env, "short"), timeout=BOUND)
    assert r.json()["choices"][0]["token_ids"] == env.refs["v1"]["short"]
    assert r.headers["x-rolloutcore-engine"] in env.servers
    models = httpx.get(f"{env.url}/v1/models", timeout=BOUND)
    assert models.json()["data"][0]["id"] == "tiny"
    assert sum(s.outstanding for s in env.fleet.status()) == 0


def test_concurrent_clients_across_five_updates(env: Env) -> None:
    """CLIENTS clients while five updates (v2, v1, v2, ...) run back to back: every
    answer's tokens equal the greedy reference of the checkpoint its generation names."""
    answers: list[tuple[int, str, str, list[int]]] = []  # gen, identity, prompt, tokens
    stop = threading.Event()
    names = sorted(env.prompts)

    async def client(i: int, c: httpx.AsyncClient) -> None:
        k = 0
        while not stop.is_set():
            name = names[(i + k) % len(names)]
            stream = (i + k) % 2 == 1
            r = await c.post(f"{env.url}/v1/completions", json=body(env, name, stream=stream))
            assert r.status_code == 200, r.text
            if stream:
                toks = [t for line in r.text.splitlines() if line.startswith("data: {")
                        for t in json.loads(line[6:])["choices"][0]["token_ids"]]
            else:
                toks = r.json()["choices"][0]["token_ids"]
            answers.append((int(r.headers["x-rolloutcore-generation"]),
                            r.headers["x-rolloutcore-identity"], name, toks))
            k += 1

    async def load() -> None:
        limits = httpx.Limits(max_connections=CLIENTS)
        async with httpx.AsyncClient(timeout=BOUND, limits=limits) as c:
            await asyncio.gather(*(client(i, c) for i in range(CLIENTS)))

    failed: list[BaseException] = []

    def run_load() -> None:
        try:
            asyncio.run(load())
        except BaseException as e:
            failed.append(e)
            raise

    t0 = time.monotonic()
    loader = threading.Thread(target=run_load)
    loader.start()
    try:
        for label in UPDATES:
            seen = len(answers)
            while len(answers) < seen + CLIENTS // 2:  # traffic before each update
                assert loader.is_alive(), f"the clients failed: {failed}"
                time.sleep(0.05)
            r = httpx.post(f"{env.url}/admin/update", timeout=BOUND, json={
                "checkpoint": str(env.models[label]),
                "label": f"{label}-g{env.fleet.committed + 1}"})
            assert r.status_code == 200 and r.json()["published"], r.text
            env.checkpoints[r.json()["committed"]] = label
        seen = len(answers)
        while len(answers) < seen + CLIENTS // 2:
            assert loader.is_alive(), f"the clients failed: {failed}"
            time.sleep(0.05)
    finally:
        stop.set()
        loader.join(BOUND)
    assert not failed, failed
    elapsed = time.monotonic() - t0
    gens = Counter(g for g, _, _, _ in answers)
    print(f"\n{len(answers)} answers from {CLIENTS} clients across {len(UPDATES)} updates in "
          f"{elapsed:.1f} s; per generation {dict(sorted(gens.items()))}")
    assert set(gens) == set(range(1, len(UPDATES) + 2))
    idents = {v: checkpoint_identity(env.models[v]) for v in ("v1", "v2")}
    for gen, ident, name, toks in answers:
        ckpt = env.checkpoints[gen]
        assert ident == idents[ckpt], (gen, ident)
        assert toks == env.refs[ckpt][name], (gen, name)
    for gen, n in gens.items():
        env.load[(gen, 200)] += n
    assert sum(s.outstanding for s in env.fleet.status()) == 0
    verdict = check_fleet_file(env.journal)
    assert verdict.accepted, verdict.message
    assert cli.main(["records", "verify", str(env.records), "--journal", str(env.journal)]) \
        == 0
    # zero requests crossed a mutation, from the journal: each member's mutate_begin
    # found none of its rollouts bound (the checker's NoRolloutCrossesMutation too)
    bound: dict[str, set[str]] = {n: set() for n in env.servers}
    for rec in read_journal(env.journal)[1]:
        engine, step = rec.get("engine"), rec.get("step")
        if step == "admit":
            bound[engine].add(rec["param"])
        elif step in ("release", "release_aborted"):
            bound[engine].discard(rec["param"])
        elif step == "mutate_begin":
            assert not bound[engine], (engine, rec["seq"])


def test_client_disconnect_mid_stream_aborts_the_engine_request(env: Env) -> None:
    big = {"model": "tiny", "prompt": env.prompts["short"], "max_tokens": 500,
           "min_tokens": 500, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{env.url}/v1/completions", json=big, timeout=BOUND) as r:
        engine = r.headers["x-rolloutcore-engine"]
        rollout = r.headers["x-rolloutcore-rollout-id"]
        tokens_before = env.engine_metric(engine, "vllm:generation_tokens_total")
        # Its first token came: the request runs on the engine (reading on while polling
        # the engine's metrics raced the 500 tokens against the polls). The client leaves
        # at once, 499 tokens before the end.
        assert next(line for line in r.iter_lines() if line.startswith("data: {"))
    # the client left: the gateway closes its upstream stream, vLLM aborts the request
    deadline = time.monotonic() + BOUND
    while env.engine_metric(engine, "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline, "the engine request was not aborted"
        time.sleep(0.05)
    generated = env.engine_metric(engine, "vllm:generation_tokens_total") - tokens_before
    assert generated < 500, generated  # aborted, not run to its end
    deadline = time.monotonic() + BOUND
    while sum(s.outstanding for s in env.fleet.status()) != 0:
        assert time.monotonic() < deadline, "the rollout was not released"
        time.sleep(0.01)
    release = [x for x in read_journal(env.journal)[1]
               if x.get("step") == "release" and x.get("param") == rollout]
    assert release and release[0]["detail"]["outcome"] == "client disconnected"
    env.load[(env.fleet.committed, 499)] += 1


def test_metrics_after_the_load(env: Env) -> None:
    m = env.metrics()
    final = len(UPDATES) + 1
    assert m[("rolloutcore_committed_generation", ())] == final
    assert m[("rolloutcore_update_cycle_duration_seconds_count",
              (("outcome", "published"),))] == len(UPDATES)
    for (gen, code), n in env.load.items():
        got = m[("rolloutcore_gateway_requests_total", (
            ("code", str(code)), ("endpoint", "completions"), ("generation", str(gen))))]
        assert got >= n, (gen, code, got, n)  # >=: the first test's requests count too
    for engine in env.servers:
        assert m[("rolloutcore_engine_phase", (("engine", engine), ("phase", "READY")))] == 1
        assert m[("rolloutcore_engine_serving", (("engine", engine),))] == 1
        assert m[("rolloutcore_engine_generation", (("engine", engine),))] == final
        assert m[("rolloutcore_engine_paused_seconds", (("engine", engine),))] == 0
        assert m[("rolloutcore_drain_wait_seconds_count", (("engine", engine),))] == \
            len(UPDATES)
        assert m[("rolloutcore_step_duration_seconds_count", (
            ("engine", engine), ("outcome", "mutate_ok"), ("step", "mutate")))] == len(UPDATES)
    assert m[("rolloutcore_gateway_client_disconnects_total", ())] == 1
    assert m[("rolloutcore_gateway_queue_depth", ())] == 0
    sample = httpx.get(f"{env.url}/metrics", timeout=10).text
    out = os.environ.get("ROLLOUTCORE_METRICS_SAMPLE")
    if out:  # the report's sample, when asked for
        Path(out).write_text(sample)


WATCHDOG_S = 2.0  # the watchdog's period in the replacement test
LOAD_CLIENTS = 4


def test_member_replaced_under_load_is_found_within_the_bound(env: Env) -> None:
    """Under load through the gateway, engine b is SIGKILLed, restarted out of band on the
    other checkpoint and relabelled with the committed label (a launcher reusing a stale
    path and the current version name). Its connection failures suspect it (no admission
    until an audit passes; the requests are admitted again on a), and the watchdog's
    audit finds it by its weight identity within the bound (period + one audit): no
    answer with wrong tokens, before the bound or after it. Then the watchdog re-admits it
    (fenced, reloaded onto the committed checkpoint, verified: the fleet spec's
    QuarantineEnds) with nobody asking, and it serves the right tokens again."""
    fleet, victim = env.fleet, "b"
    committed = fleet.committed
    ckpt = env.checkpoints[committed]
    other = "v1" if ckpt == "v2" else "v2"
    label = fleet.committed_target().label  # type: ignore[union-attr]
    want = env.refs[ckpt]["medium"]
    assert env.refs[other]["medium"] != want  # a replaced engine would answer otherwise
    bound = WATCHDOG_S + fleet.policy.step_timeout_s
    answers: list[tuple[float, str | None, int, Any]] = []  # (t, engine, status, tokens)
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=BOUND) as c:
            while not stop.is_set():
                try:
                    r = c.post(f"{env.url}/v1/completions", json=body(env, "medium"))
                except httpx.HTTPError as e:  # counted: the assertions below say what holds
                    answers.append((time.monotonic(), None, 0, type(e).__name__))
                    continue
                tokens = r.json()["choices"][0]["token_ids"] if r.status_code == 200 else None
                answers.append((time.monotonic(), r.headers.get("x-rolloutcore-engine"),
                                r.status_code, tokens))

    def until(what: str, cond: Any) -> float:
        deadline = time.monotonic() + BOUND
        while not cond():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)
        return time.monotonic()

    member = fleet.members[victim]
    fleet.start_watchdog(WATCHDOG_S)
    clients = [threading.Thread(target=client) for _ in range(LOAD_CLIENTS)]
    for t in clients:
        t.start()
    try:
        until("b answers", lambda: any(a[1] == victim for a in answers))
        server = env.servers[victim]
        server.kill()
        until("b suspected by its connection failures",
              lambda: not any(s.serving for s in fleet.status() if s.name == victim))
        server.restart(env.models[other])
        r = httpx.post(f"{server.url}/update_weight_version", json={"new_version": label},
                       timeout=BOUND)
        assert r.status_code == 200, r.text
        back = time.monotonic()
        found = until("the audit finds b", lambda: member.last_audit is not None
                      and member.last_audit["outcome"] == "audit_mismatch")
        readmitted = until("the watchdog re-admits b", lambda: any(
            s.serving for s in fleet.status() if s.name == victim))
        until("b answers again", lambda: any(
            a[1] == victim and a[0] > readmitted and a[2] == 200 for a in answers))
    finally:
        stop.set()
        for t in clients:
            t.join(BOUND)
        fleet.stop_watchdog()
    wrong = [a for a in answers if a[2] == 200 and a[3] != want]
    statuses = Counter(a[2] for a in answers)
    print(f"replaced member: {len(answers)} answers {dict(statuses)}, {len(wrong)} wrong; "
          f"found {found - back:.2f} s after its restart (bound {bound:g} s: watchdog "
          f"{WATCHDOG_S:g} s + one audit); re-admitted by the watchdog "
          f"{readmitted - found:.2f} s later")
    assert found - back <= bound
    assert wrong == [], wrong[:3]
    assert statuses[200] >= 10 * LOAD_CLIENTS and not statuses[0], statuses  # a kept serving
    steps = [(r.get("step"), r.get("detail", {}).get("who"))
             for r in read_journal(env.journal)[1] if r.get("engine") == victim]
    assert (Trigger.READMIT_BEGIN, "watchdog") in steps, steps[-8:]
    engine_failures = env.metrics()
    assert sum(v for (n, labels), v in engine_failures.items()
               if n == "rolloutcore_gateway_engine_failures_total"
               and ("engine", victim) in labels) >= 1
    r = httpx.post(f"{env.url}/v1/completions", json=body(env, "medium"), timeout=BOUND)
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == want
    assert check_fleet_file(env.journal).accepted


def test_serve_command_over_the_same_engines(env: Env, tmp_path: Path) -> None:
    """``rolloutcore serve`` with a journal of its own: bootstraps on what the engines
    hold now, serves, and closes cleanly on SIGTERM (exit 0)."""
    ckpt = env.checkpoints[env.fleet.committed]
    label = env.fleet.committed_target().label  # type: ignore[union-attr]
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text("".join(f'[[engine]]\nname = "{n}"\nurl = "{s.url}"\n'
                                  for n, s in env.servers.items()))
    port = free_port()
    records = tmp_path / "records.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rolloutcore.cli", "serve", "--fleet", str(fleet_file),
         "--port", str(port), "--initial", str(env.models[ckpt]), "--initial-label", label,
         "--records", str(records)], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + BOUND
        while True:
            assert proc.poll() is None, proc.communicate()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.1)
        r = httpx.post(f"{url}/v1/completions", json=body(env, "medium"), timeout=BOUND)
        assert r.headers["x-rolloutcore-generation"] == "1"  # its own fleet's generation 1
        assert r.json()["choices"][0]["token_ids"] == env.refs[ckpt]["medium"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=BOUND)
    assert proc.returncode == 0, (out, err)
    assert "listening on loopback only" in out and "closed cleanly" in out, out
    journal = fleet_file.with_suffix(".journal.jsonl")
    assert check_fleet_file(journal).accepted
    assert cli.main(["records", "verify", str(records), "--journal", str(journal)]) == 0
