"""Several gateways in front of one fleet (spec/gateways.py at runtime): remote gateways
(``serve --gateway-only``) admit on their own view and journal, the controller closes a
member only once every gateway acknowledged (or its lease ended and every engine fenced
it), and the checker joins their journals to the fleet's. Simulated vLLM servers over
HTTP (with the engine-side gateway fence vLLM loads as middleware)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import wait_until

from rolloutcore import cli
from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.adapters.gateway_fence import FENCE_PATH, GATEWAY_HEADER, stamp
from rolloutcore.adapters.http import HttpAdapter
from rolloutcore.adapters.sim import sim_target
from rolloutcore.check.fleet_trace import check_fleet_file
from rolloutcore.check.gateway_join import check_join
from rolloutcore.conformance.fault_proxy import Fault, FaultProxy
from rolloutcore.conformance.fixtures.sim_server import SimServer
from rolloutcore.engine.runner import DrainPolicy, RunnerPolicy
from rolloutcore.fleet import Fleet
from rolloutcore.gateway.core import Gateway, GatewayConfig
from rolloutcore.gateway.follower import Follower, FollowerConfig, follower_server
from rolloutcore.gateway.registry import GatewayRegistry
from rolloutcore.gateway.server import AppThread, ServerThread
from rolloutcore.journal import JournalReader

REPO = Path(__file__).resolve().parents[1]
LEASE_S = 3.0  # long enough that a loaded machine never lets a live lease end
POLICY = RunnerPolicy(step_timeout_s=10, pause_timeout_s=10, retries=1, retry_backoff_s=0.0,
                      drain_timeout_s=60, mutation_base_s=10)
BODY = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 4}


def target(generation: int, version: str) -> WeightTarget:
    # the servers start on v1, labelled as vLLM labels what it loaded at start
    label = "default" if generation == 1 else f"{version}-gen{generation}"
    return sim_target(generation, version, label=label)


def target_of(checkpoint: str, generation: int, label: str) -> WeightTarget:
    return sim_target(generation, checkpoint, label=label)


@dataclass
class Rig:
    fleet: Fleet
    registry: GatewayRegistry
    controller: str
    engines: dict[str, str]
    journal: Path
    tmp: Path

    def follower(self, name: str) -> Follower:
        return Follower(FollowerConfig(name, self.controller, self.tmp / f"{name}.jsonl",
                                       fsync=False, queue_wait_s=30))

    def holds_all(self, gateway: str, generation: int | None = None) -> bool:
        g = self.registry.status()["gateways"].get(gateway)
        if g is None or sorted(g["holds"]) != sorted(self.engines):
            return False
        return generation is None or all(
            m.controller.control.committed == generation for m in self.fleet.members.values())

    def fleet_file(self) -> Path:
        path = self.tmp / "fleet.toml"
        path.write_text("[fleet]\nmin_serving = 2\n" + "".join(
            f'[[engine]]\nname = "{n}"\nurl = "{u}"\n' for n, u in self.engines.items()))
        return path

    def joined(self, gateways: list[str]) -> dict[str, dict[str, int]]:
        fleet_verdict = check_fleet_file(self.journal)
        assert fleet_verdict.accepted, fleet_verdict.message
        v = check_join(self.journal, {g: self.tmp / f"{g}.jsonl" for g in gateways})
        assert v.accepted, v.message
        return v.gateways


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with SimServer(in_thread=True, token_seconds=0.02) as a, \
            SimServer(in_thread=True, token_seconds=0.02) as b:
        engines = {"a": a.url, "b": b.url}
        fleet = Fleet([(n, HttpAdapter(u, check_source_exists=False, retry_backoff_s=0.0), u)
                       for n, u in engines.items()], journal=tmp_path / "fleet.jsonl",
                      min_serving=2, policy=POLICY, fsync=False, target_of=target_of)
        fleet.bootstrap(target(1, "v1"))
        assert fleet.phase == "READY"
        gw = Gateway(fleet, GatewayConfig(model="tiny"), target_of=target_of)
        registry = GatewayRegistry(fleet, lease_s=LEASE_S)
        try:
            with ServerThread(gw, registry=registry) as url:
                yield Rig(fleet, registry, url, engines, tmp_path / "fleet.jsonl", tmp_path)
        finally:
            registry.close()
            gw.close()


@contextmanager
def followers(rig: Rig, *names: str) -> Iterator[dict[str, str]]:
    with ExitStack() as stack:
        urls = {n: stack.enter_context(AppThread(follower_server(rig.follower(n))))
                for n in names}
        for n in names:
            wait_until(partial(rig.holds_all, n), f"{n} holds every member")
        yield urls


def stream_in_background(url: str, max_tokens: int) -> tuple[threading.Thread,
                                                             dict[str, Any]]:
    """A streamed completion through a gateway, read to its end on a thread."""
    out: dict[str, Any] = {"chunks": 0}

    def run() -> None:
        try:
            with httpx.Client(timeout=60) as c, c.stream("POST", f"{url}/v1/completions", json={
                    **BODY, "max_tokens": max_tokens, "stream": True}) as r:
                out["status"], out["headers"] = r.status_code, dict(r.headers)
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        out["chunks"] += 1
                        out.setdefault("first", line)
        except httpx.HTTPError as e:
            out["error"] = f"{type(e).__name__}: {e}"

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_an_update_waits_for_every_gateway_and_reopens_on_all(rig: Rig) -> None:
    """Two gateways hold both members. A stream through g1 runs while the update starts:
    the member it runs on mutates only after g1 acknowledged (its stream ended, in full,
    on generation 1); afterwards both gateways hold both members on generation 2 and
    admit there. The joined journals pass the checker."""
    with followers(rig, "g1", "g2") as urls:
        for u in urls.values():  # each admits before the update
            r = httpx.post(f"{u}/v1/completions", json=BODY, timeout=30)
            assert r.status_code == 200 and r.headers["x-rolloutcore-generation"] == "1"
        t, out = stream_in_background(urls["g1"], 150)  # about 3 s of tokens
        wait_until(lambda: "status" in out, "the stream began")
        assert out["chunks"] < 150  # in flight as the update begins
        report = rig.fleet.update(target(2, "v2"))
        assert report.published, report
        t.join(30)
        assert out.get("status") == 200 and out["chunks"] == 150, out
        assert out["headers"]["x-rolloutcore-generation"] == "1"
        # That its member mutated only after it ended is the join's DrainedAtAck (below):
        # g1's hold there was released at a journal position after the stream's release.
        for n in ("g1", "g2"):
            wait_until(partial(rig.holds_all, n, 2), f"{n} holds every member again")
        for u in urls.values():
            r = httpx.post(f"{u}/v1/completions", json=BODY, timeout=30)
            assert r.status_code == 200 and r.headers["x-rolloutcore-generation"] == "2", \
                r.headers
    counts = rig.joined(["g1", "g2"])
    assert counts["g1"]["admitted"] == 3 and counts["g2"]["admitted"] == 2, counts
    assert counts["g1"]["holds"] == 4 and counts["g1"]["holds_expired"] == 0, counts


def test_a_client_that_goes_away_ends_its_engine_request(rig: Rig) -> None:
    """A client that disconnects mid-stream has its engine request closed (the engine
    aborts it) and its rollout released, journalled as the client's doing."""
    with followers(rig, "g1") as urls:
        with httpx.Client(timeout=30) as c, c.stream("POST", f"{urls['g1']}/v1/completions",
                                                     json={**BODY, "max_tokens": 400,
                                                           "stream": True}) as r:
            assert r.status_code == 200
            next(r.iter_lines())  # the first event: then the client goes away
        wait_until(lambda: _release_of(rig.tmp / "g1.jsonl") is not None,
                   "the rollout's release")
        rec = _release_of(rig.tmp / "g1.jsonl")
        assert rec is not None and rec["detail"]["status"] == 499 and \
            rec["detail"]["outcome"] == "client disconnected", rec
        for u in rig.engines.values():  # nothing left running on the engines
            wait_until(partial(_idle, u), "the engine request ended")


def _idle(engine: str) -> bool:
    return bool(httpx.get(f"{engine}{FENCE_PATH}").json()["running"] == {})


def _release_of(path: Path) -> dict[str, Any] | None:
    return next((rec for _l, rec in JournalReader(path) if rec.get("step") == "gw_release"),
                None)


def _cli_follower(rig: Rig, name: str, fleet_file: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rolloutcore.cli", "serve", "--fleet", str(fleet_file),
         "--port", "0", "--gateway-only", name, "--controller", rig.controller,
         "--gateway-journal", str(rig.tmp / f"{name}.jsonl")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(f"rolloutcore gateway {name} on http://"), line
    url = line.split(" on ", 1)[1].split(",", 1)[0]
    wait_until(lambda: rig.holds_all(name), f"{name} holds every member")
    return proc, url


@pytest.mark.deep  # its own process; make check has the partitioned one, in-process
def test_a_frozen_gateway_is_waited_for_until_its_lease_ends_then_fenced(rig: Rig) -> None:
    """A gateway (its own process) is frozen (SIGSTOP) with a stream running: the update
    waits for its lease, every engine fences its epoch (the stream is ended there), its
    holds are released and the update publishes. Thawed, it finds its lease gone,
    registers anew and admits on generation 2; its old epoch's stamp is refused by the
    engines. The joined journals pass the checker."""
    proc, url = _cli_follower(rig, "g1", rig.fleet_file())
    try:
        t, out = stream_in_background(url, 400)  # 8 s of tokens, far longer than the lease
        wait_until(lambda: "status" in out, "the stream began")
        old_epoch = rig.registry.status()["gateways"]["g1"]["epoch"]
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            report = rig.fleet.update(target(2, "v2"))
            assert report.published, report
            fences = [f for f in rig.registry.fences if f["gateway"] == "g1"]
            assert fences and fences[-1]["fence"] == old_epoch + 1 and not fences[-1]["failed"]
            for u in rig.engines.values():  # the engines refuse its old epoch from now on
                r = httpx.post(f"{u}/v1/completions", json=BODY,
                               headers={GATEWAY_HEADER: stamp("g1", old_epoch)}, timeout=30)
                assert r.status_code == 409 and r.json()["error"]["code"] == \
                    "gateway_fenced", r.text
                assert httpx.get(f"{u}{FENCE_PATH}").json()["fences"]["g1"] == old_epoch + 1
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        t.join(60)
        assert out.get("chunks", 0) < 400, out  # ended by the fence, not run to its end
        wait_until(lambda: rig.holds_all("g1", 2), "g1 registered anew and holds both")
        new_epoch = rig.registry.status()["gateways"]["g1"]["epoch"]
        assert new_epoch > old_epoch
        r = httpx.post(f"{url}/v1/completions", json=BODY, timeout=30)
        assert r.status_code == 200 and r.headers["x-rolloutcore-generation"] == "2"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    counts = rig.joined(["g1"])
    assert counts["g1"]["holds_expired"] == 2 and counts["g1"]["admitted"] == 2, counts


def test_a_partitioned_gateway_stops_admitting_and_is_fenced(rig: Rig) -> None:
    """The leader cannot reach a gateway (every call it makes is reset, a fault proxy
    between them) while its stream runs: the update waits for its lease, fences it on
    every engine (the stream is ended there) and publishes; the gateway, unable to renew,
    admits nothing more (503) rather than forward what the engines would refuse. Healed,
    it finds its lease gone, registers anew and admits on generation 2."""
    with FaultProxy(rig.controller) as proxy:
        f = Follower(FollowerConfig("g1", proxy.url, rig.tmp / "g1.jsonl", fsync=False,
                                    queue_wait_s=0.5))
        with AppThread(follower_server(f)) as url:
            wait_until(partial(rig.holds_all, "g1"), "g1 holds every member")
            t, out = stream_in_background(url, 400)
            wait_until(lambda: "status" in out, "the stream began")
            proxy.add(Fault.drop_before("*", "*", times=None))
            report = rig.fleet.update(target(2, "v2"))
            assert report.published, report
            t.join(30)
            assert out.get("chunks", 0) < 400, out  # ended by the fence on its engine
            wait_until(lambda: not f.held, "g1 closed every member by itself")
            refused = httpx.post(f"{url}/v1/completions", json=BODY, timeout=30)
            assert refused.status_code == 503, refused.text
            proxy.clear()
            wait_until(partial(rig.holds_all, "g1", 2), "g1 registered anew and holds both")
            r = httpx.post(f"{url}/v1/completions", json=BODY, timeout=30)
            assert r.status_code == 200 and r.headers["x-rolloutcore-generation"] == "2"
    counts = rig.joined(["g1"])
    assert counts["g1"]["holds_expired"] == 2 and counts["g1"]["admitted"] == 2, counts


@pytest.mark.deep  # its own process, killed and restarted on its journal
def test_a_killed_gateway_restarted_on_its_journal(rig: Rig) -> None:
    """A gateway killed (SIGKILL) mid-stream holds up no update past its lease; restarted
    on its journal, it abandons what its predecessor left admitted, registers anew (its
    old epoch fenced first) and serves generation 2."""
    fleet_file = rig.fleet_file()
    proc, url = _cli_follower(rig, "g1", fleet_file)
    t, out = stream_in_background(url, 400)
    wait_until(lambda: "status" in out, "the stream began")
    proc.kill()
    proc.communicate(timeout=30)
    t.join(30)
    report = rig.fleet.update(target(2, "v2"))
    assert report.published, report
    proc, url = _cli_follower(rig, "g1", fleet_file)
    try:
        r = httpx.post(f"{url}/v1/completions", json=BODY, timeout=30)
        assert r.status_code == 200 and r.headers["x-rolloutcore-generation"] == "2"
        status = httpx.get(f"{url}/health").json()
        assert status["abandoned_at_start"] == 1, status
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    steps = [rec.get("step") for _l, rec in JournalReader(rig.tmp / "g1.jsonl")]
    assert steps.count("gw_abandon") == 1 and steps.count("gw_start") == 2, steps
    counts = rig.joined(["g1"])
    assert counts["g1"]["abandoned"] == 1 and counts["g1"]["admitted"] == 2, counts


def test_the_registry_refuses_what_would_break_the_protocol(rig: Rig) -> None:
    """An abort-mode drain (it would end a hold, not the gateway's rollouts) and a lease
    longer than the drain timeout are refused; a call with a stale epoch gets 409
    ``gateway_lease_lost``; bad input 400."""
    with pytest.raises(ValueError, match="wait drain policy"):
        GatewayRegistry(_with_policy(rig.fleet, DrainPolicy.WAIT_THEN_ABORT), lease_s=1)
    with pytest.raises(ValueError, match="shorter than the drain timeout"):
        GatewayRegistry(rig.fleet, lease_s=600)
    reg = httpx.post(f"{rig.controller}/rc/gateways/register", json={"gateway": "g9"})
    assert reg.status_code == 200, reg.text
    stale = httpx.post(f"{rig.controller}/rc/gateways/hold", json={
        "gateway": "g9", "epoch": reg.json()["epoch"] - 1, "member": "a", "position": 0})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "gateway_lease_lost"
    bad = httpx.post(f"{rig.controller}/rc/gateways/hold", json={"gateway": "g9"})
    assert bad.status_code == 400, bad.text
    assert httpx.post(f"{rig.controller}/rc/gateways/register",
                      json={"gateway": "has-dash"}).status_code == 400


def test_a_hold_taken_as_its_member_begins_to_drain_is_closed(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The member's drain listener fires between the binding of a hold and its entry in
    the registry (it cannot see the hold): the registry finds the member no longer
    admitting and marks the hold closing, so the gateway is told to close it and the
    drain does not wait for it until it times out."""
    reg = rig.registry.register("g9")
    real_hold = rig.fleet.hold

    def hold_then_drain(member: str, rollout: str, detail: dict[str, Any]) -> Any:
        lease = real_hold(member, rollout, detail)
        rig.registry._draining(member)  # the listener, as the member's drain begins
        monkeypatch.setattr(rig.fleet, "admitting", dict)  # it admits no more
        return lease

    monkeypatch.setattr(rig.fleet, "hold", hold_then_drain)
    rig.registry.hold("g9", reg["epoch"], "a", 0)
    monkeypatch.undo()
    assert rig.registry.status()["gateways"]["g9"]["closing"] == ["a"]
    rig.registry.ack("g9", reg["epoch"], "a", 0)  # released: the fleet is as it was
    assert rig.registry.status()["gateways"]["g9"]["holds"] == []


def test_two_calls_taking_one_hold_leave_one_binding(rig: Rig,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway's hold call sent twice (a retry) whose second call binds while the first
    is binding: one hold stands, the other binding is given back (a leaked one would hold
    its member's drain for ever)."""
    reg = rig.registry.register("g9")
    real_hold = rig.fleet.hold
    inner: list[dict[str, Any]] = []
    calls = []

    def hold_with_a_retry_inside(member: str, rollout: str, detail: dict[str, Any]) -> Any:
        lease = real_hold(member, rollout, detail)
        calls.append(rollout)
        if len(calls) == 1:  # the retry arrives while the first call is in the fleet
            inner.append(rig.registry.hold("g9", reg["epoch"], member, 0))
        return lease

    monkeypatch.setattr(rig.fleet, "hold", hold_with_a_retry_inside)
    outer = rig.registry.hold("g9", reg["epoch"], "a", 0)
    monkeypatch.undo()
    assert outer == inner[0]
    bound = [r for r in rig.fleet.members["a"].controller.bindings if "g9" in r]
    assert bound == [outer["rollout"]], bound


def _with_policy(fleet: Fleet, drain: DrainPolicy) -> Any:
    class View:
        policy = RunnerPolicy(drain_policy=drain)
        members = fleet.members
    return View()


def test_the_join_rejects_an_ack_before_the_gateways_rollout_ended(tmp_path: Path,
                                                                   rig: Rig) -> None:
    """Negative controls: a gateway journal whose release comes after the position the
    fleet journal says it acknowledged at is rejected (DrainedAtAck); one whose admission
    lies before its first hold is rejected (AdmittedUnderHold)."""
    with followers(rig, "g1") as urls:
        t, out = stream_in_background(urls["g1"], 30)
        wait_until(lambda: "status" in out, "the stream began")
        assert rig.fleet.update(target(2, "v2")).published
        t.join(30)
    rig.joined(["g1"])
    lines = (rig.tmp / "g1.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    admit = next(i for i, r in enumerate(recs) if r.get("step") == "gw_admit")
    release = next(i for i, r in enumerate(recs) if r.get("step") == "gw_release"
                   and r["detail"]["rollout"] == recs[admit]["detail"]["rollout"])
    # One more record before the release: the ack's position then falls before it.
    start = next(r for r in recs if r.get("step") == "gw_start")
    bad = tmp_path / "bad.jsonl"
    _rewrite(bad, [*recs[:release], start, *recs[release:]])
    v = check_join(rig.journal, {"g1": bad})
    assert not v.accepted and v.violated == "DrainedAtAck", v
    assert cli.main(["trace", "join", str(rig.journal), f"g1={bad}"]) == 1
    assert cli.main(["trace", "join", str(rig.journal), f"g1={rig.tmp / 'g1.jsonl'}"]) == 0
    # An admission before the first hold's position.
    early = [*recs[:1], recs[admit], *recs[1:admit], *recs[admit + 1:]]
    _rewrite(bad, early)
    v = check_join(rig.journal, {"g1": bad})
    assert not v.accepted and v.violated == "AdmittedUnderHold", v


def _rewrite(path: Path, recs: list[dict[str, Any]]) -> None:
    """Renumber and re-seal a reordered journal (a well-formed chain, a wrong history)."""
    from rolloutcore.journal.codec import dumps_line, rechain

    fixed = rechain([{**r, "seq": i} for i, r in enumerate(recs)])
    path.write_text("".join(dumps_line(r) for r in fixed))
