"""Agentic episodes through the gateway, without vLLM: a multi-turn chat bound to one
generation as one unit (the episode spec's runtime), on the simulated fleet and fake
upstreams of ``test_gateway``.

Each scenario runs an episode across a rolling update (K=2, two members, one leaving at
a time): the owner's policy decides what the drain of the episode's member does (wait,
abort, segment). Every turn's answer is checked against the greedy tokens of the
generation its headers name, every journal against the fleet trace checker (which checks
the episode spec's OneEpisodeOnePolicy and SegmentsInOrder over the holds), every record
file by ``records verify``. Timing comes from causes the tests control: the episode is
ended by the test, the idle deadline by an injected clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import wait_until
from test_gateway import (
    BOUND,
    FAKE_LOGPROB,
    MODEL,
    FakeUpstream,
    Rig,
    fake_upstream,
    in_thread,
    rig,
    target_of,
)

from rolloutcore import cli
from rolloutcore.adapters.sim import reference_tokens
from rolloutcore.check.fleet_trace import check_fleet_records
from rolloutcore.fleet import Fleet
from rolloutcore.gateway.core import Gateway, GatewayConfig
from rolloutcore.gateway.server import ServerThread
from rolloutcore.journal import read_journal
from rolloutcore.rl import EpisodeEnded, GroupError, RolloutClient, Sampling
from rolloutcore.spec.lifecycle import Phase
from rolloutcore.trajectories.format import write_jsonl

EPISODE = "x-rolloutcore-episode"


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with fake_upstream() as up:
        yield up


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def turn(r: Rig, eid: str, text: str, *, policy: str | None = None, end: bool = False,
         n: int = 3, headers: dict[str, str] | None = None) -> httpx.Response:
    h = {EPISODE: eid, **(headers or {})}
    if policy is not None:
        h["x-rolloutcore-episode-policy"] = policy
    if end:
        h["x-rolloutcore-episode-end"] = "true"
    return httpx.post(f"{r.url}/v1/chat/completions", headers=h, timeout=BOUND, json={
        "model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": n,
        "temperature": 0})


def served(r: Rig, resp: httpx.Response, text: str, n: int = 3) -> tuple[int, int, str]:
    """(segment, generation, member) of a turn, its answer checked against the greedy
    tokens of the generation its headers name."""
    assert resp.status_code == 200, resp.text
    gen = int(resp.headers["x-rolloutcore-generation"])
    prompt = [b % 1000 for b in text.encode()]
    want = "".join(f" t{t}" for t in r.reference(gen, prompt, n))
    assert resp.json()["choices"][0]["message"]["content"] == want
    return (int(resp.headers["x-rolloutcore-episode-segment"]), gen,
            resp.headers["x-rolloutcore-engine"])


def rolling(tmp_path: Path, upstream: FakeUpstream, **kw: Any) -> Any:
    return rig(tmp_path, upstream, min_serving=1, max_live=2, min_admitting=1, **kw)


def start_update(r: Rig, checkpoint: str = "ckpt-2", label: str = "v2"
                 ) -> tuple[Any, dict[str, Any]]:
    return in_thread(lambda: r.update(checkpoint, label))


def finish(r: Rig, t: Any, box: dict[str, Any]) -> dict[str, Any]:
    t.join(3 * BOUND)
    assert "value" in box, box
    rep: dict[str, Any] = box["value"].json()
    assert rep["published"], rep
    return rep


def records(r: Rig) -> list[dict[str, Any]]:
    return [json.loads(x) for x in r.records.read_text().splitlines()]


def holds(r: Rig) -> list[dict[str, Any]]:
    return [x for x in r.journal_records() if x["step"] in ("admit", "release")
            and "episode" in (x.get("detail") or {})]


def test_wait_keeps_the_member_on_the_episodes_generation_until_it_ends(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    """The drain of the episode's member waits for it: turns go on under generation 1 on
    that member while the other member already serves 2; once the owner ends it, the
    member updates. One admission for the whole episode."""
    with rolling(tmp_path, upstream) as r:
        seg, gen, member = served(r, turn(r, "ep1", "plan the trip", policy="wait"),
                                  "plan the trip")
        assert (seg, gen) == (1, 1)
        t, box = start_update(r)
        m = r.fleet.members[member]
        wait_until(lambda: m.controller.phase is Phase.DRAINING, "its member to drain")
        for k in range(2):  # turns while its member drains: still generation 1, there
            assert served(r, turn(r, "ep1", f"tool said {k}"), f"tool said {k}") == (
                1, 1, member)
        assert m.controller.phase is Phase.DRAINING  # it waited for the episode
        out = httpx.post(f"{r.url}/v1/episodes/ep1/end", timeout=BOUND).json()
        assert out["status"] == "done" and len(out["turns"]) == 3
        rep = finish(r, t, box)
        assert sorted(rep["report"]["committed_on"]) == ["a", "b"]
        h = holds(r)
        assert [x["step"] for x in h] == ["admit", "release"]  # one hold, all turns
        assert h[1]["detail"]["hold_ends"] == "done"
        recs = records(r)
        assert [x["episode"]["turn"] for x in recs] == [1, 2, 3]
        assert {x["binding"]["seq"] for x in recs} == {h[0]["seq"]}
        r.check()


def test_abort_ends_the_episode_when_its_member_drains(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    with rolling(tmp_path, upstream) as r:
        served(r, turn(r, "ep2", "search for it", policy="abort"), "search for it")
        t, box = start_update(r)
        finish(r, t, box)  # nobody ended the episode: its member's drain aborted it
        after = turn(r, "ep2", "the search result")
        assert after.status_code == 409
        assert after.json()["error"]["code"] == "episode_aborted"
        state = httpx.get(f"{r.url}/v1/episodes/ep2", timeout=BOUND).json()
        assert state["status"] == "aborted" and len(state["turns"]) == 1
        assert holds(r)[-1]["detail"]["hold_ends"] == "aborted"
        # its owner restarts it whole, as a new episode: all of it on generation 2
        for k, text in enumerate(("search for it", "the search result")):
            resp = turn(r, "ep2-again", text, policy="abort", end=k == 1)
            assert served(r, resp, text)[:2] == (1, 2)
        r.check()


def test_segment_lets_the_member_go_and_goes_on_as_a_new_segment(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    """The drain lets the hold go; the next turn finds no member on generation 1 and
    starts segment 2 under generation 2, the boundary in the journal and the records."""
    with rolling(tmp_path, upstream) as r:
        assert served(r, turn(r, "ep3", "step one", policy="segment"), "step one")[:2] == (
            1, 1)
        t, box = start_update(r)
        finish(r, t, box)
        seg, gen, _ = served(r, turn(r, "ep3", "step two"), "step two")
        assert (seg, gen) == (2, 2)
        assert served(r, turn(r, "ep3", "step three", end=True), "step three")[:2] == (2, 2)
        assert httpx.get(f"{r.url}/v1/episodes/ep3", timeout=BOUND).json()["status"] == "done"
        h = holds(r)
        assert [(x["step"], x["detail"].get("segment"), x["detail"].get("hold_ends"))
                for x in h] == [("admit", 1, None), ("release", None, "drain"),
                                ("admit", 2, None), ("release", None, "done")]
        recs = records(r)
        assert [(x["episode"]["segment"], x["binding"]["generation"]) for x in recs] == [
            (1, 1), (2, 2), (2, 2)]
        r.check()
        # negative controls: the checker and records verify catch a segment boundary
        # that is not one (segment 2's hold journalled as segment 1)
        journal = [x for x in read_journal(r.journal)[1]]
        k = next(i for i, x in enumerate(journal) if x.get("step") == "admit"
                 and (x.get("detail") or {}).get("segment") == 2)
        journal[k] = {**journal[k], "detail": {**journal[k]["detail"], "segment": 1}}
        verdict = check_fleet_records(enumerate(journal, 1))
        assert not verdict.accepted and verdict.violated == "OneEpisodeOnePolicy", verdict
        forged = tmp_path / "forged.jsonl"
        recs[1]["episode"]["segment"] = 1
        forged.write_text("".join(json.dumps(x) + "\n" for x in recs))
        assert cli.main(["records", "verify", str(forged), "--journal",
                         str(r.journal)]) == 1


def test_idle_deadline_ends_the_episode_and_says_so(tmp_path: Path,
                                                   upstream: FakeUpstream) -> None:
    clock = Clock()
    with rolling(tmp_path, upstream, clock=clock, episode_idle_s=30.0) as r:
        served(r, turn(r, "ep4", "call the tool"), "call the tool")
        clock.now += 29.0
        assert r.gw.episodes.expire_due() == []
        served(r, turn(r, "ep4", "it answered"), "it answered")  # a turn: idle anew
        clock.now += 30.0
        wait_until(lambda: r.gw.episodes.status()["live"] == 0, "the reaper to end it")
        after = turn(r, "ep4", "too late")
        assert after.status_code == 409 and after.json()["error"]["code"] == \
            "episode_expired"
        assert holds(r)[-1]["detail"]["hold_ends"] == "expired"
        assert r.gw.status()["episodes"]["expired"] == 1
        r.check()


def test_bad_episode_input_is_refused_and_changes_nothing(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    with rolling(tmp_path, upstream) as r:
        before = len(r.journal_records())
        for headers, code in [({EPISODE: "bad id!"}, "invalid_episode"),
                              ({EPISODE: "e", "x-rolloutcore-episode-policy": "later"},
                               "invalid_episode_policy"),
                              ({EPISODE: "e", "x-rolloutcore-episode-end": "yes"},
                               "invalid_request"),
                              ({"x-rolloutcore-episode-end": "true"}, "invalid_request")]:
            resp = httpx.post(f"{r.url}/v1/chat/completions", headers=headers, json={
                "model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                timeout=BOUND)
            assert resp.status_code == 400 and resp.json()["error"]["code"] == code, headers
        assert httpx.get(f"{r.url}/v1/episodes/nope", timeout=BOUND).status_code == 404
        assert httpx.post(f"{r.url}/v1/episodes/nope/end", timeout=BOUND).status_code == 404
        assert len(r.journal_records()) == before
        # a started episode keeps its policy, and takes one turn at a time
        served(r, turn(r, "ep5", "one", policy="segment"), "one")
        assert turn(r, "ep5", "two", policy="wait").json()["error"]["code"] == \
            "episode_policy_fixed"
        t, box = in_thread(lambda: turn(r, "ep5", "held", headers={"x-test-hold": "g"}))
        wait_until(lambda: r.gw.episodes.status()["turns_in_flight"] == 1, "a turn")
        assert turn(r, "ep5", "meanwhile").json()["error"]["code"] == "turn_in_flight"
        upstream.gates["g"].set()
        t.join(BOUND)
        assert box["value"].status_code == 200
        assert httpx.post(f"{r.url}/v1/episodes/ep5/end", timeout=BOUND).json()[
            "status"] == "done"
        r.check()


@pytest.mark.parametrize("policy", ["wait", "segment"])
def test_shutdown_ends_live_episodes_as_lost(tmp_path: Path, upstream: FakeUpstream,
                                             policy: str) -> None:
    """A gateway that shuts down under a live episode releases its hold, journalled as
    lost (the journal then passes the checker with nothing bound)."""
    with rolling(tmp_path, upstream) as r:
        served(r, turn(r, "ep6", "begin", policy=policy), "begin")
        gw = r.gw
    assert gw.episodes.get("ep6")["status"] == "lost"
    assert holds(r)[-1]["detail"]["hold_ends"] == "lost"
    assert check_fleet_records(enumerate(
        [x for x in read_journal(r.journal)[1]], 1)).accepted


def test_the_trainers_episode_handle_keeps_tokens_mask_and_provenance(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    """``RolloutClient.episode``: environment tokens masked out, the policy's tokens with
    their behaviour logprobs, each turn's segment and generation; a segmenting episode
    across an update keeps one generation per segment; its per-turn records verify
    against the journal. An aborting one is told it ended."""
    with rolling(tmp_path, upstream) as r:
        client = RolloutClient(r.url, MODEL, logprobs_mode="raw_logprobs")
        sampling = Sampling(temperature=0.0, max_tokens=3)
        with client.episode(policy="segment", sampling=sampling) as ep:
            ep.observe([5, 6, 7])
            first = ep.turn()
            assert (first.segment, first.generation) == (1, 1)
            assert list(first.token_ids) == list(reference_tokens(
                r.checkpoints[1], (5, 6, 7), 3))
            t, box = start_update(r)
            finish(r, t, box)
            ep.observe([8, 9])
            second = ep.turn(Sampling(temperature=0.0, max_tokens=2))
            ep.end(reward=1.0)
        rec = ep.record
        assert rec.status == "done" and rec.reward == 1.0
        assert rec.segments == [(1, 1), (2, 2)] and not rec.one_policy
        assert rec.mask == [False] * 3 + [True] * 3 + [False] * 2 + [True] * 2
        assert rec.logprobs[3:6] == [FAKE_LOGPROB] * 3 and rec.logprobs[:3] == [None] * 3
        assert list(second.token_ids) == list(reference_tokens(
            r.checkpoints[2], tuple(rec.tokens[:second.start]), 2))
        rec.check()
        out = tmp_path / "episode.jsonl"
        write_jsonl(out, rec.records())
        assert cli.main(["records", "verify", str(out), "--journal", str(r.journal)]) == 0
        rec.mask[0] = True  # negative control: a mask that claims an environment token
        with pytest.raises(GroupError, match="mask"):
            rec.check()
        with client.episode(policy="abort", sampling=sampling) as ab:
            ab.observe([1, 2])
            ab.turn()
            t, box = start_update(r, "ckpt-3", "v3")  # its member drains
            finish(r, t, box)
            with pytest.raises(EpisodeEnded) as e:
                ab.turn()
            assert e.value.code == "episode_aborted"
        assert ab.record.status == "aborted"
        client.close()
        r.check()


def test_a_restarted_gateway_ends_the_episodes_live_when_it_stopped_as_lost(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    """The gateway's process dies under a live episode (nothing of it runs on). A new
    one on the fleet's journal recovers the fleet (the members' restarts drop the dead
    process's holds) and finds the episode in the journal: ended as lost, its next turn
    refused, GET saying why; new episodes run; the journal checks."""
    with rolling(tmp_path, upstream) as r:
        served(r, turn(r, "ep7", "begin", policy="wait"), "begin")
        served(r, turn(r, "ep8", "other", policy="segment", end=True), "other")
        # a dead process: nothing more of it is written
        r.gw.episodes.close = lambda: None
        r.fleet.close = lambda: None
        members = [(n, r.adapters[n], m.url) for n, m in r.fleet.members.items()]
        fleet = Fleet(members, journal=r.journal, min_serving=1, target_of=target_of,
                      max_live=2, min_admitting=1)
        assert fleet.recovered and fleet.phase == "READY"
        gw = Gateway(fleet, GatewayConfig(model=MODEL), target_of=target_of)
        try:
            with ServerThread(gw) as url:
                again = httpx.post(f"{url}/v1/chat/completions", headers={EPISODE: "ep7"},
                                   json={"model": MODEL, "messages": [
                                       {"role": "user", "content": "x"}]}, timeout=BOUND)
                assert again.status_code == 409
                assert again.json()["error"]["code"] == "episode_lost"
                state = httpx.get(f"{url}/v1/episodes/ep7", timeout=BOUND).json()
                assert state["status"] == "lost" and "restart" in state["why"]
                assert httpx.get(f"{url}/v1/episodes/ep8", timeout=BOUND).status_code == 404
                fresh = httpx.post(f"{url}/v1/chat/completions", headers={
                    EPISODE: "ep9", "x-rolloutcore-episode-end": "true"}, json={
                    "model": MODEL, "messages": [{"role": "user", "content": "y"}]},
                    timeout=BOUND)
                assert fresh.status_code == 200, fresh.text
        finally:
            gw.close()
    verdict = check_fleet_records(enumerate(list(read_journal(r.journal)[1]), 1))
    assert verdict.accepted, verdict.message


def test_an_engine_that_fails_mid_turn_ends_its_episode_as_lost(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    """A turn whose engine answers 5xx: the client gets the error, the episode is ended
    as lost (its hold released, journalled), and its member is suspected."""
    with rolling(tmp_path, upstream) as r:
        served(r, turn(r, "ep10", "begin"), "begin")
        bad = turn(r, "ep10", "then", headers={"x-test-fail": "500"})
        assert bad.status_code == 500
        state = httpx.get(f"{r.url}/v1/episodes/ep10", timeout=BOUND).json()
        assert state["status"] == "lost"
        assert turn(r, "ep10", "again").json()["error"]["code"] == "episode_lost"
        assert holds(r)[-1]["detail"]["hold_ends"] == "lost"
        r.check()


@pytest.mark.deep
def test_the_episode_benchmark_runs_and_its_checks_hold(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """benchmarks/bench_episodes.py at a small size: every turn's tokens are its serving
    generation's greedy reference, every journal checks (exit 0)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_episodes", Path(__file__).resolve().parents[1] / "benchmarks" /
        "bench_episodes.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--seconds", "3", "--scale", "0.05", "--workers", "8",
                       "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in rows] == list(bench.MODES)
    assert all(r["wrong"] == 0 and r["journal_ok"] and r["turns"] > 0 for r in rows)


def test_a_group_of_episodes_shares_one_hold_on_one_generation(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    """Three episodes of one task named in one group (policy wait) hold one admission:
    one member, generation 1, however their turns interleave; the drain of that member
    waits until the last of them ends; the hold is released once, when it does. A
    segmenting group lets go at the drain and goes on together as segment 2. Records of
    several episodes under one admission (equal turn numbers) all verify."""
    group = "x-rolloutcore-episode-group"
    with rolling(tmp_path, upstream) as r:
        members = set()
        for k in range(3):
            resp = turn(r, f"g1-{k}", "task", policy="wait", headers={group: "g1"})
            assert resp.headers[group] == "g1"
            members.add(served(r, resp, "task")[2])
        assert len(members) == 1 and len(holds(r)) == 1  # one admission for the group
        member = r.fleet.members[members.pop()]
        t, box = start_update(r)
        wait_until(lambda: member.controller.phase is Phase.DRAINING, "its member to drain")
        for k in range(3):
            assert served(r, turn(r, f"g1-{k}", "tool said", end=k < 2), "tool said")[:2] == (
                1, 1)
        assert member.controller.phase is Phase.DRAINING  # one episode of it still lives
        assert httpx.post(f"{r.url}/v1/episodes/g1-2/end", timeout=BOUND).json()[
            "status"] == "done"
        finish(r, t, box)
        h = holds(r)
        assert [(x["step"], x["param"]) for x in h] == [("admit", "g1#1.1"),
                                                      ("release", "g1#1.1")]
        assert h[0]["detail"]["group"] is True and h[1]["detail"]["hold_ends"] == "done"
        # its id cannot start a group again
        again = turn(r, "g1-9", "task", headers={group: "g1"})
        assert again.status_code == 409 and again.json()["error"]["code"] == \
            "episode_group_ended"
        # a segmenting group: let go at the drain, on together as segment 2
        for k in range(2):
            assert served(r, turn(r, f"g2-{k}", "task", policy="segment",
                                  headers={group: "g2"}), "task")[:2] == (1, 2)
        wrong = turn(r, "g2-9", "task", policy="wait", headers={group: "g2"})
        assert wrong.json()["error"]["code"] == "episode_policy_fixed"
        t, box = start_update(r, "ckpt-3", "v3")
        finish(r, t, box)
        for k in range(2):
            assert served(r, turn(r, f"g2-{k}", "next", end=True), "next")[:2] == (2, 3)
        g2 = [(x["step"], x["param"], x["detail"].get("hold_ends")) for x in holds(r)
              if x["param"].startswith("g2#")]
        assert g2 == [("admit", "g2#1.1", None), ("release", "g2#1.1", "drain"),
                      ("admit", "g2#2.2", None), ("release", "g2#2.2", "done")]
        recs = records(r)
        assert {(x["episode"]["group"], x["episode"]["turn"]) for x in recs} >= {
            ("g1", 1), ("g1", 2), ("g2", 1), ("g2", 2)}
        r.check()
