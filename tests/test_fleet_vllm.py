"""Fleet scenarios on three real vLLM CPU servers (about 2 GiB each), each compared with
its run on a simulated fleet: the members' lifecycle steps must be identical, both
journals must pass the fleet trace checker, and every check must hold on both."""

from __future__ import annotations

import functools
import importlib.util
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

from rolloutcore import cli  # noqa: E402
from rolloutcore.adapters.contract import PauseMode  # noqa: E402
from rolloutcore.check.fleet_trace import check_fleet_file  # noqa: E402
from rolloutcore.conformance.fixtures.server_pool import ServerPool  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models  # noqa: E402
from rolloutcore.conformance.fleet_scenarios import (  # noqa: E402
    SCENARIOS,
    FleetResult,
    FleetRig,
    run_fleet_scenario,
)
from rolloutcore.conformance.harness import wait_until  # noqa: E402
from rolloutcore.gateway.core import Gateway, GatewayConfig  # noqa: E402
from rolloutcore.gateway.server import ServerThread  # noqa: E402
from rolloutcore.journal import read_journal  # noqa: E402
from rolloutcore.spec.fleet import FleetPhase  # noqa: E402
from rolloutcore.spec.lifecycle import Phase  # noqa: E402

BOUND = 120.0  # a bound against a broken test, never a measurement
#: Streams sent to hold one on a member in flight (one ends before its pause only when the
#: machine delays the test's pause by the whole generation).
HELD_ATTEMPTS = 3
#: The application's own steps interleave with the lifecycle as threads run; the
#: comparison is of the lifecycle.
APPLICATION = frozenset({"admit", "release"})


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory, vllm_pool: ServerPool) -> Iterator[FleetRig]:
    r = FleetRig.vllm(build_models(DEFAULT_OUT), tmp_path_factory.mktemp("fleet-vllm"),
                      pool=vllm_pool)
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def sim_rig(tmp_path_factory: pytest.TempPathFactory) -> FleetRig:
    return FleetRig.sim(tmp_path_factory.mktemp("fleet-sim"))


def lifecycle(r: FleetResult) -> dict[str, list[str]]:
    return {m: [s for s in steps if s not in APPLICATION] for m, steps in
            r.member_steps.items()}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fleet_scenario_on_three_vllm_servers(name: str, rig: FleetRig,
                                              sim_rig: FleetRig) -> None:
    real = run_fleet_scenario(name, rig, printer=print)
    sim = run_fleet_scenario(name, sim_rig)
    print({k: v for k, v in real.evidence.items()})
    assert real.passed, real.failures()
    assert sim.passed, sim.failures()
    assert lifecycle(real) == lifecycle(sim), "real vLLM and the simulated fleet differ"


def _pause_held(log: list[Any]) -> bool:
    """The runner's pause (vLLM: /sleep level 0, or /pause) held at the fault proxy."""
    return any(x.method == "POST" and x.path in ("/pause", "/sleep")
               and x.phase == "held_before" for x in log)


def _released(member: Any) -> bool:
    return bool(member.outstanding == 0)


def _idle(engine: Any) -> bool:
    return bool(engine.running_requests() == 0)


def _stream(url: str, prompt: list[int], n: int, first: threading.Event) -> dict[str, Any]:
    """A greedy streamed completion through the gateway; ``first`` is set once its first
    event is in. Its headers, events and token ids."""
    with httpx.stream("POST", f"{url}/v1/completions", json={
            "model": "tiny", "prompt": prompt, "max_tokens": n, "min_tokens": n,
            "temperature": 0, "stream": True, "return_token_ids": True},
            timeout=BOUND) as resp:
        events = []
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
                first.set()
        return {"status": resp.status_code, "headers": dict(resp.headers), "events": events,
                "tokens": [t for e in events for t in e["choices"][0]["token_ids"] or ()]}


def test_gateway_streams_move_off_draining_vllm_members_with_the_greedy_tokens(
        rig: FleetRig, tmp_path: Path) -> None:
    """A rolling update (K=2, C=2) of three real servers under three streams through
    the gateway, one per member, each part-way through 256 greedy tokens: the wave
    member hands its stream to a member on generation 1, the first member caught up
    hands its own, the last keeps all three (no member of generation 1 is left). Every
    client sees one stream whose token ids are exactly the v1 greedy reference; every
    record lists its segments and verifies against the journal; the journal checks.

    Every step is held by a cause the test controls: each engine is paused (keep) right
    after its stream's first event, so no stream can end before the update; the runner's
    own pause of the members that hand streams on is held at their fault proxy until the
    test has resumed the engine (its aborted part ends) and lets it go."""
    rig.restore()
    engines = rig.engines
    fleet = rig.open("gateway_migration", min_serving=2, max_live=2, min_admitting=2)
    records = tmp_path / "records.jsonl"
    boot = fleet.bootstrap(rig.targets(1))
    assert fleet.phase == FleetPhase.READY, boot
    gw = Gateway(fleet, GatewayConfig(model="tiny", records=records, queue_wait_s=BOUND),
                 target_of=rig.target_of)

    def moved() -> float:
        return sum(x.value for fam in text_string_to_metric_families(
            gw.metrics.exposition().decode()) for x in fam.samples
            if x.name == "rolloutcore_gateway_migrations_total"
            and x.labels.get("outcome") == "moved")
    e0 = engines["a"]
    prompt, n = list(e0.prompt("rollout")), e0.rollout_tokens
    reference = list(e0.reference("v1", "rollout"))
    try:
        with ServerThread(gw) as url, ThreadPoolExecutor(4) as pool:
            streams = []
            for name in ("a", "b", "c"):  # admitted least loaded first: one each
                for _attempt in range(HELD_ATTEMPTS):
                    first = threading.Event()
                    stream = pool.submit(_stream, url, prompt, n, first)
                    assert first.wait(BOUND)
                    engines[name].pause_raw(PauseMode.KEEP)
                    # The engine's own count says whether the stream is held in flight:
                    # between its first event and the pause it may have generated all n
                    # tokens (a machine busy elsewhere delays the pause, not the engine).
                    if engines[name].running_requests() == 1:
                        streams.append(stream)
                        break
                    engines[name].resume_raw()  # not this test's state: send another
                    assert stream.result(timeout=BOUND)["tokens"] == reference
                    assert wait_until(functools.partial(_released, fleet.members[name]),
                                      BOUND)
                else:
                    pytest.fail(f"no stream held on {name} in {HELD_ATTEMPTS} attempts")
            assert {m.name: m.outstanding for m in fleet.members.values()} == {
                "a": 1, "b": 1, "c": 1}
            for name in ("a", "c"):
                engines[name].inject("pause", "hang")
            rolling = pool.submit(fleet.update, rig.targets(2))
            for name, moves in (("a", 1), ("c", 2)):
                proxy = engines[name].proxy  # type: ignore[attr-defined]
                proxy.wait_for(_pause_held, timeout=BOUND)  # its drain ended
                assert moved() == moves
                engines[name].resume_raw()  # the part it no longer serves is aborted
                assert wait_until(functools.partial(_idle, engines[name]), BOUND)
                engines[name].clear_faults()  # its pause goes through
            b = fleet.members["b"]
            assert wait_until(lambda: b.controller.phase is Phase.DRAINING, BOUND)
            assert b.outstanding == 3  # nowhere left to go: the drain waits for them
            engines["b"].resume_raw()
            outs: list[dict[str, Any]] = [s.result(timeout=BOUND) for s in streams]
            rep = rolling.result(timeout=3 * BOUND)
    finally:
        for e in engines.values():
            e.clear_faults()
            if e.is_paused_raw():
                e.resume_raw()
        gw.close()
        fleet.close()
    assert rep.published and rep.waves == [["a"], ["c"], ["b"]], rep.as_json()
    for out in outs:
        assert out["status"] == 200 and out["headers"]["x-rolloutcore-generation"] == "1"
        assert out["tokens"] == reference, out["headers"]["x-rolloutcore-engine"]
        assert [e["choices"][0].get("prompt_token_ids") is not None
                for e in out["events"]].count(True) == 1  # the client's prompt, once
    recs = {r["binding"]["rollout_id"]: r for r in map(json.loads,
                                                       records.read_text().splitlines())}
    by_member = {o["headers"]["x-rolloutcore-engine"]: recs[
        o["headers"]["x-rolloutcore-rollout-id"]]["segments"] for o in outs}
    assert [s["engine"] for s in by_member["a"]] == ["a", "b"]
    assert [s["engine"] for s in by_member["c"]] == ["c", "b"]
    assert by_member["b"] == []
    for segs in (by_member["a"], by_member["c"]):
        assert 0 < segs[0]["end"] < n and segs[-1]["end"] == n  # moved part-way
    print({m: [(s["engine"], s["start"], s["end"]) for s in segs]
           for m, segs in by_member.items()})
    verdict = check_fleet_file(Path(fleet.journal.path))
    assert verdict.accepted, verdict.message
    from rolloutcore import cli

    assert cli.main(["records", "verify", str(records), "--journal",
                     str(fleet.journal.path)]) == 0


def test_gateway_episodes_across_a_rolling_update_of_vllm_members(
        rig: FleetRig, tmp_path: Path) -> None:
    """Three agentic episodes (one per member: wait, abort, segment) through the gateway
    while a rolling update (K=2, one member leaving at a time) moves the fleet to v2.
    The waiting episode's member drains and waits: its second turn runs there under v1
    and continues the v1 greedy reference exactly (turn 1 gave its first half); once it
    ends, the member updates. The aborting one is aborted by its member's drain; the
    segmenting one lets its member go and goes on as segment 2 under v2. Its records
    and the gateway's verify against the journal, which checks (episodes included)."""
    from rolloutcore.rl import EpisodeEnded, RolloutClient, Sampling
    from rolloutcore.trajectories.format import write_jsonl

    rig.restore()
    e0 = rig.engines["a"]
    prompt, reference = list(e0.prompt("probe")), list(e0.reference("v1", "probe"))
    half = len(reference) // 2
    sampling = Sampling(temperature=0.0, max_tokens=half, min_tokens=half)
    fleet = rig.open("gateway_episodes", min_serving=1, max_live=2, min_admitting=2)
    records = tmp_path / "records.jsonl"
    assert fleet.bootstrap(rig.targets(1)) is not None and fleet.phase == FleetPhase.READY
    gw = Gateway(fleet, GatewayConfig(model="tiny", records=records, queue_wait_s=BOUND),
                 target_of=rig.target_of)
    try:
        with ServerThread(gw) as url, ThreadPoolExecutor(2) as pool:
            client = RolloutClient(url, "tiny", logprobs_mode="raw_logprobs",
                                   timeout_s=BOUND)
            eps = {p: client.episode(policy=p, sampling=sampling)
                   for p in ("wait", "abort", "segment")}
            for ep in eps.values():
                ep.observe(prompt)
                assert list(ep.turn().token_ids) == reference[:half]
            where = {p: ep.record.turns[0].engine for p, ep in eps.items()}
            assert sorted(where.values()) == ["a", "b", "c"]  # one hold each
            rolling = pool.submit(fleet.update, rig.targets(2))
            waiting = fleet.members[where["wait"]]
            assert wait_until(lambda: waiting.controller.phase is Phase.DRAINING, BOUND)
            second = eps["wait"].turn()  # on its draining member, under v1
            assert (second.engine, second.generation) == (where["wait"], 1)
            assert list(second.token_ids) == reference[half:]
            assert waiting.controller.phase is Phase.DRAINING  # it waited
            assert eps["wait"].end(1.0) == "done"
            rep = rolling.result(timeout=3 * BOUND)
            assert rep.published and sorted(rep.committed_on) == ["a", "b", "c"], \
                rep.as_json()
            with pytest.raises(EpisodeEnded) as aborted:
                eps["abort"].turn()
            assert aborted.value.code == "episode_aborted"
            seg = eps["segment"]
            seg.observe(prompt[:3])  # a tool's answer: environment tokens
            third = seg.turn()
            assert (third.segment, third.generation) == (2, 2)
            assert third.binding.identity == rig.targets(2)[third.engine].identity
            assert seg.end(0.0) == "done"
            client.close()
    finally:
        gw.close()
        fleet.close()
    rec = seg.record
    assert rec.segments == [(1, 1), (2, 2)]
    assert rec.mask == [False] * len(prompt) + [True] * half + [False] * 3 + [True] * half
    rec.check()
    mine = tmp_path / "episodes.jsonl"
    write_jsonl(mine, [r for ep in eps.values() for r in ep.record.records()])
    for path in (mine, records):
        assert cli.main(["records", "verify", str(path), "--journal",
                         str(fleet.journal.path)]) == 0
    verdict = check_fleet_file(fleet.journal.path)
    assert verdict.accepted, verdict.message
    ends = [x["detail"]["hold_ends"] for x in read_journal(fleet.journal.path)[1]
            if x.get("step") == "release" and "hold_ends" in (x.get("detail") or {})]
    assert sorted(ends) == ["aborted", "done", "done", "drain"]


def test_skyrl_gym_episodes_through_the_gateway_across_updates(
        rig: FleetRig, tmp_path: Path) -> None:
    """A library no one here wrote, SkyRL-Gym's ``gsm8k_multi_turn`` (3 turns, unmodified),
    drives episodes over the chat API through the gateway in front of three vLLM CPU
    servers. A segmenting episode with an update to v2 between its first two turns goes
    on as segment 2 under generation 2; a waiting one keeps its member on generation 2
    while the next update drains it, its later turns served there, and the update ends
    after it. The gateway's records (one per turn) and the journal verify."""
    skyrl_gym = pytest.importorskip("skyrl_gym")
    from rolloutcore.integrations.skyrl_gym import run_episode

    def env() -> Any:
        return skyrl_gym.make("gsm8k_multi_turn", env_config={}, extras={
            "reward_spec": {"ground_truth": "42"}, "max_turns": 3, "extra_info": {}})

    question = [{"role": "user", "content": "What is 40 + 2? End with #### ANSWER."}]
    rig.restore()
    fleet = rig.open("skyrl_gym", min_serving=1, max_live=2, min_admitting=2)
    records = tmp_path / "records.jsonl"
    assert fleet.bootstrap(rig.targets(1)) is not None and fleet.phase == FleetPhase.READY
    gw = Gateway(fleet, GatewayConfig(model="tiny", records=records, queue_wait_s=BOUND),
                 target_of=rig.target_of)
    update: dict[str, Any] = {}
    try:
        with ServerThread(gw) as url, ThreadPoolExecutor(1) as pool:
            def roll_now(k: int) -> None:
                if k == 1:
                    update["v2"] = fleet.update(rig.targets(2))

            seg = run_episode(url, "tiny", env(), question, policy="segment",
                              max_tokens=8, between_turns=roll_now)

            def drain_under_it(k: int) -> None:
                if k == 1:
                    member = fleet.members[waiting_on()]
                    update["v3"] = pool.submit(fleet.update, {
                        n: e.target(3, "v1") for n, e in rig.engines.items()})
                    assert wait_until(lambda: member.controller.phase is Phase.DRAINING,
                                      BOUND)

            def waiting_on() -> str:
                held = [m.name for m in fleet.members.values() if m.outstanding == 1]
                assert len(held) == 1, held
                return held[0]

            wait = run_episode(url, "tiny", env(), question, policy="wait", max_tokens=8,
                               between_turns=drain_under_it)
            rep3 = update["v3"].result(timeout=3 * BOUND)
    finally:
        gw.close()
        fleet.close()
    assert update["v2"].published and rep3.published, (update["v2"].as_json(), rep3.as_json())
    assert seg.status == wait.status == "done"
    assert len(seg.turns) == len(wait.turns) == 3 or 1.0 in (
        t.reward for t in seg.turns + wait.turns)  # (it ends early only if answered)
    assert seg.segments == [(1, 1), (2, 2)]
    assert wait.segments == [(1, 2)] and len({t.engine for t in wait.turns}) == 1
    recs = [json.loads(x) for x in records.read_text().splitlines()]
    turns = [(x["episode"]["episode"], x["episode"]["segment"], x["binding"]["generation"])
             for x in recs]
    assert turns == [(seg.episode, t.segment, t.generation) for t in seg.turns] + [
        (wait.episode, t.segment, t.generation) for t in wait.turns]
    assert cli.main(["records", "verify", str(records), "--journal",
                     str(fleet.journal.path)]) == 0
    verdict = check_fleet_file(fleet.journal.path)
    assert verdict.accepted, verdict.message


def test_gateway_episodes_idle_deadline_restart_and_killed_member_on_vllm(
        rig: FleetRig, tmp_path: Path) -> None:
    """The episode scenarios that end an episode, on three vLLM servers: one idle past
    its deadline (the gateway's clock injected) is expired and refused; a gateway that
    stops under a live episode and starts again on the fleet's journal ends it as lost;
    one whose member's server is SIGKILLed is lost at its next turn (a 502, its hold
    released) while other episodes go on. The journal checks."""
    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    rig.restore()
    fleet = rig.open("episode_ends", min_serving=1, max_live=2, min_admitting=1)
    assert fleet.bootstrap(rig.targets(1)) is not None and fleet.phase == FleetPhase.READY
    gw = Gateway(fleet, GatewayConfig(model="tiny", queue_wait_s=BOUND, episode_idle_s=60.0),
                 target_of=rig.target_of, clock=clock)
    prompt = list(rig.engines["a"].prompt("probe"))

    def turn(url: str, eid: str) -> httpx.Response:
        return httpx.post(f"{url}/v1/completions", headers={"x-rolloutcore-episode": eid},
                          json={"model": "tiny", "prompt": prompt, "max_tokens": 4,
                                "temperature": 0}, timeout=BOUND)

    with ServerThread(gw) as url:
        assert turn(url, "idle").status_code == 200
        clock.now += 61.0
        assert gw.episodes.expire_due() == ["idle"]
        assert turn(url, "idle").json()["error"]["code"] == "episode_expired"
        assert turn(url, "live").status_code == 200
    # the gateway's process dies under "live": nothing of it is written any more
    gw.begin_shutdown()
    gw.episodes.close = lambda: None  # type: ignore[method-assign]
    fleet.close = lambda: None  # type: ignore[method-assign]
    again = rig.open("episode_ends", min_serving=1, max_live=2, min_admitting=1,
                     recover=True)
    gw2 = Gateway(again, GatewayConfig(model="tiny", queue_wait_s=BOUND),
                  target_of=rig.target_of)
    victim = ""
    try:
        with ServerThread(gw2) as url:
            after = turn(url, "live")
            assert after.status_code == 409 and after.json()["error"]["code"] == \
                "episode_lost", after.text
            first = turn(url, "doomed")
            assert first.status_code == 200
            victim = first.headers["x-rolloutcore-engine"]
            rig.engines[victim].kill()
            broken = turn(url, "doomed")
            assert broken.status_code == 502, broken.text
            assert gw2.episodes.get("doomed")["status"] == "lost"
            other = turn(url, "other")  # a member that serves takes new episodes
            assert other.status_code == 200 and \
                other.headers["x-rolloutcore-engine"] != victim
    finally:
        gw2.close()
        again.close()
        if victim:
            rig.engines[victim].restart_process("v1")
    verdict = check_fleet_file(again.journal.path)
    assert verdict.accepted, verdict.message
