"""The trainer-facing API without vLLM: the buffer's bound and staleness rule, the identity
of live weights, the client's reading of the gateway's answers, records of groups.

Timing here comes from causes the test controls (a bound reached, an acknowledgement
given); waits are bounded by :data:`BOUND`, a bound against a broken test.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from prometheus_client import generate_latest

from rolloutcore.engine.controller import Binding
from rolloutcore.engine.identity import checkpoint_identity
from rolloutcore.rl import (
    Group,
    GroupError,
    Partial,
    RolloutBuffer,
    RolloutClient,
    Sample,
    Sampling,
    Stale,
)
from rolloutcore.rl.weights import (
    LiveSources,
    LiveWeights,
    LiveWeightsError,
    snapshot,
    state_identity,
)
from rolloutcore.trajectories.format import (
    RecordError,
    TrajectoryRecord,
    read_records,
    write_records,
)
from rolloutcore.trajectories.provenance import CONSISTENT, REJECTED, JournalIndex

BOUND = 10.0


def group(generation: int, n: int = 2, tokens: int = 3, *, rid: str = "r", seq: int = 1,
          aborted: bool = False) -> Group:
    samples = tuple(Sample(i, tuple(range(tokens)), tuple([-0.5] * tokens), "length", aborted)
                    for i in range(n))
    return Group((1, 2, 3), samples, Binding(rid, generation, f"id{generation}", seq,
                                             aborted=aborted), "a", f"g{generation}",
                 "raw_logprobs", Sampling(max_tokens=tokens), 0.0, 0.1)


# ------------------------------------------------------------------------------ buffer


def test_buffer_waits_at_its_bound_until_the_trainer_acknowledges() -> None:
    buf = RolloutBuffer(max_lag=1, max_samples=4)
    assert buf.put(group(1)) and buf.put(group(1))
    assert buf.unacknowledged == (4, 2 * group(1).nbytes)
    assert not buf.put(group(1), timeout=0)  # full: the producer would wait
    taken = buf.take(2, trained_generation=1)
    assert len(taken) == 2 and not buf.put(group(1), timeout=0)  # taken is not consumed
    done = threading.Event()
    t = threading.Thread(target=lambda: (buf.put(group(1)), done.set()), daemon=True)
    t.start()
    assert not done.wait(0.2)  # still waiting: nothing acknowledged
    buf.ack(taken[:1])
    assert done.wait(BOUND)
    t.join(BOUND)
    metrics = generate_latest(buf.registry).decode()
    assert "rolloutcore_rl_queued_samples 4.0" in metrics


def test_generation_waits_for_room_before_it_starts() -> None:
    buf = RolloutBuffer(max_lag=1, max_samples=4)
    assert buf.reserve(2) and buf.reserve(2)
    assert not buf.reserve(2, timeout=0)  # two groups being generated fill the bound
    assert buf.put(group(1), reserved=True) and buf.unacknowledged[0] == 4
    buf.cancel(2)  # the other one failed: its room comes back
    assert buf.reserve(2, timeout=0)
    assert buf.put(group(1), reserved=True) and buf.unacknowledged == (4, 2 * group(1).nbytes)
    buf.close()
    assert not buf.reserve(1) and not buf.put(group(1), reserved=True)


def test_buffer_drops_or_flags_groups_older_than_max_lag() -> None:
    for stale, expect in ((Stale.DROP, [(3, 0, False), (2, 1, False)]),
                          (Stale.FLAG, [(1, 2, True), (3, 0, False), (2, 1, False)])):
        buf = RolloutBuffer(max_lag=1, stale=stale, max_samples=100)
        for g in (1, 3, 2):
            buf.put(group(g))
        got = buf.take(5, trained_generation=3, timeout=0)
        assert [(t.group.generation, t.lag, t.stale) for t in got] == expect
        assert buf.dropped == (1 if stale is Stale.DROP else 0)
        assert buf.lags == {2: 1, 0: 1, 1: 1}
        metrics = generate_latest(buf.registry).decode()
        action = "dropped" if stale is Stale.DROP else "flagged"
        assert f'rolloutcore_rl_stale_total{{action="{action}"}} 1.0' in metrics
        assert "rolloutcore_rl_lag_generations_count 3.0" in metrics
    # a dropped group's room is free again; the others' after their ack
    buf = RolloutBuffer(max_lag=0, max_samples=2)
    buf.put(group(1))
    assert buf.take(1, trained_generation=2, timeout=0) == []
    assert buf.unacknowledged == (0, 0)


def test_buffer_refuses_bad_configuration_and_a_group_newer_than_the_trainer() -> None:
    for kw in ({"max_lag": -1, "max_samples": 1}, {"max_lag": 1},
               {"max_lag": 1, "max_samples": 0}, {"max_lag": True, "max_samples": 1}):
        with pytest.raises(ValueError):
            RolloutBuffer(**kw)  # type: ignore[arg-type]
    buf = RolloutBuffer(max_lag=1, max_bytes=10_000)
    buf.put(group(5))
    with pytest.raises(ValueError, match="newer than the trainer"):
        buf.take(1, trained_generation=4)


def test_a_closed_buffer_wakes_producers_and_the_trainer() -> None:
    buf = RolloutBuffer(max_lag=1, max_samples=2)
    buf.put(group(1))
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.setdefault("put", buf.put(group(1))), daemon=True)
    t.start()
    buf.close()
    t.join(BOUND)
    assert out == {"put": False}
    assert len(buf.take(3, 1)) == 1 and buf.take(3, 1) == []


# ----------------------------------------------------------------------------- weights


def test_live_identity_is_the_checkpoint_identity_of_the_same_bytes(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    state = {"b.weight": torch.randn(3, 4, generator=gen),
             "a.bias": torch.randn(5, generator=gen).to(torch.bfloat16),
             "c.idx": torch.arange(6, dtype=torch.int64).reshape(2, 3)}
    save_file(state, str(tmp_path / "model.safetensors"))
    assert state_identity(snapshot(state)) == checkpoint_identity(tmp_path)
    state["b.weight"][0, 0] += 1.0  # one value changed: another identity
    assert state_identity(snapshot(state)) != checkpoint_identity(tmp_path)


def test_a_snapshot_does_not_follow_the_training_model() -> None:
    model = torch.nn.Linear(4, 2)
    snap = snapshot(model)
    before = state_identity(snap)
    with torch.no_grad():
        model.weight.add_(1.0)
    assert state_identity(snap) == before != state_identity(snapshot(model))
    assert list(snap) == sorted(snap)
    with pytest.raises(LiveWeightsError, match="no tensors"):
        snapshot({})
    with pytest.raises(LiveWeightsError, match="dtype"):
        snapshot({"x": torch.zeros(2, dtype=torch.complex64)})


def test_live_sources_hold_every_generation_a_member_may_still_need(tmp_path: Path) -> None:
    sources = LiveSources()
    ws = [LiveWeights(f"w{i}", f"{i:064x}", {"x": torch.full((2,), float(i))})
          for i in range(3)]
    for g, w in enumerate(ws, start=2):
        sources.add(w, g)
    assert sources.prune(3) == 1 and len(sources) == 2  # a member still holds generation 3
    assert sources.get(ws[2].identity) is ws[2] and sources.get(ws[1].identity) is ws[1]
    with pytest.raises(LiveWeightsError, match="no snapshot held"):
        sources.get(ws[0].identity)
    target = ws[2].target(4, (1, 2), (3,), (-0.1,))
    assert (target.identity, target.nbytes, target.label) == (ws[2].identity, 8, "w2")
    src = sources.source_for(target)
    assert src.provenance == ws[2].identity
    assert [(m.name, tuple(m.shape)) for m in src.metadata()] == [("x", (2,))]
    assert [n for n, _ in src] == ["x"]
    with pytest.raises(LiveWeightsError, match="no snapshot held"):
        sources.source_for(ws[0].target(2, (1,), (2,), (-0.1,)))
    # a checkpoint target (the fleet's first generation) is read from its directory
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    ckpt = dataclasses.replace(target, identity=checkpoint_identity(tmp_path),
                               source=str(tmp_path))
    assert sources.source_for(ckpt).provenance == checkpoint_identity(tmp_path)


# ------------------------------------------------------------------------------ client


HEADERS = {"x-rolloutcore-generation": "4", "x-rolloutcore-identity": "f" * 64,
           "x-rolloutcore-engine": "b", "x-rolloutcore-rollout-id": "gw-7",
           "x-rolloutcore-label": "step-3", "x-rolloutcore-admission-seq": "42"}


def answer(n: int = 2, *, finish: str = "length", headers: dict[str, str] | None = None,
           drop: str | None = None) -> httpx.Response:
    choices = []
    for i in range(n):
        c: dict[str, Any] = {"index": i, "text": "", "token_ids": [5 + i, 6],
                             "logprobs": {"token_logprobs": [-1.0, -2.0 - i]},
                             "finish_reason": finish}
        if drop:
            c.pop(drop)
        choices.append(c)
    return httpx.Response(200, json={"choices": choices},
                          headers=HEADERS if headers is None else headers)


def client_with(*responses: httpx.Response) -> tuple[RolloutClient, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    queue = list(responses)

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append({"body": json.loads(request.content), "headers": dict(request.headers)})
        return queue.pop(0)

    return RolloutClient("http://gw", "tiny", logprobs_mode="raw_logprobs",
                         transport=httpx.MockTransport(handle)), seen


def test_a_group_is_one_request_bound_to_one_admission() -> None:
    client, seen = client_with(answer(2))
    g = client.generate_group([1, 2, 3], 2, Sampling(max_tokens=2, seed=9), max_staleness=1)
    body = seen[0]["body"]
    assert (body["n"], body["prompt"], body["logprobs"], body["return_token_ids"],
            body["max_tokens"], body["seed"]) == (2, [1, 2, 3], 0, True, 2, 9)
    assert seen[0]["headers"]["x-rolloutcore-max-staleness"] == "1"
    assert g.binding == Binding("gw-7", 4, "f" * 64, 42)
    assert (g.engine, g.label, g.generation) == ("b", "step-3", 4)
    assert [s.token_ids for s in g.samples] == [(5, 6), (6, 6)]
    assert g.samples[1].logprobs == (-1.0, -3.0) and not g.aborted
    recs = g.records()
    assert [r.sample for r in recs] == [0, 1]
    assert {r.binding for r in recs} == {g.binding}
    assert all(r.logprobs_mode == "raw_logprobs" for r in recs)


def test_an_interrupted_group_is_resubmitted_whole_or_returned_marked() -> None:
    client, seen = client_with(answer(2, finish="abort"), answer(2))
    g = client.generate_group([1], 2, Sampling(), partial=Partial.RESUBMIT)
    assert len(seen) == 2 and g.attempts == 2 and not g.aborted and client.resubmitted == 1
    client, _ = client_with(answer(2, finish="abort"))
    g = client.generate_group([1], 2, Sampling(), partial=Partial.WAIT)
    assert g.aborted and all(s.aborted for s in g.samples) and g.binding.aborted
    client, _ = client_with(*[answer(1, finish="abort")] * 3)
    with pytest.raises(GroupError, match="aborted by a drain 3 times"):
        client.generate_group([1], 1, Sampling(), partial=Partial.RESUBMIT)


@pytest.mark.parametrize("response, match", [
    (httpx.Response(503, json={"error": "busy"}), "refused the group: HTTP 503"),
    (answer(2, headers={}), "lacks its binding"),
    (answer(1), r"asked for 2 samples, the answer has \[0\]"),
    (answer(2, drop="token_ids"), "without token ids"),
    (httpx.Response(200, text="not json", headers=HEADERS), "lacks its binding or choices"),
])
def test_a_broken_answer_is_an_error_never_a_group(response: httpx.Response,
                                                    match: str) -> None:
    client, _ = client_with(response)
    with pytest.raises(GroupError, match=match):
        client.generate_group([1], 2, Sampling())


def test_bad_requests_are_refused_before_anything_is_sent() -> None:
    client, seen = client_with()
    for prompt, n in (([], 1), ([1], 0), ([1], True)):
        with pytest.raises(ValueError):
            client.generate_group(prompt, n, Sampling())  # type: ignore[arg-type]
    for kw in ({"top_k": 0}, {"temperature": -1.0}, {"top_p": 0.0}):
        with pytest.raises((ValueError, RecordError)):
            Sampling(**kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RolloutClient("http://gw", "tiny", logprobs_mode="softmax")
    assert seen == []


# ----------------------------------------------------------------------------- records


def test_group_records_round_trip_and_are_verified_one_per_sample(tmp_path: Path) -> None:
    from test_records_verify import ID2, _steps, _write_journal

    path = _write_journal(tmp_path / "j.jsonl", _steps())
    g = group(2, n=3, rid="c", seq=8)  # the journal admits "c" at seq 8 under generation 2
    g = Group(g.prompt_ids, g.samples, Binding("c", 2, ID2, 8), g.engine, g.label,
              g.logprobs_mode, g.sampling, g.started_at, g.seconds)
    recs = g.records()
    for name in ("r.jsonl", "r.parquet"):
        write_records(tmp_path / name, recs)
        assert read_records(tmp_path / name) == recs
    index = JournalIndex(path)
    assert [index.check(i, r).verdict for i, r in enumerate(recs)] == [CONSISTENT] * 3
    again = index.check(3, recs[1])
    assert again.verdict == REJECTED and "second record for sample 1" in again.reasons[0]


def test_a_record_names_a_known_logprobs_mode_or_none() -> None:
    r = group(1).records()[0]
    d = r.to_dict()
    d["logprobs_mode"] = "softmax"
    with pytest.raises(RecordError, match="logprobs_mode"):
        TrajectoryRecord.from_dict(d)
    d["logprobs_mode"], d["logprobs"] = "raw_logprobs", None
    with pytest.raises(RecordError, match="lacks"):
        TrajectoryRecord.from_dict(d)
    d = r.to_dict()
    d["sample"] = -1
    with pytest.raises(RecordError, match="sample"):
        TrajectoryRecord.from_dict(d)


# ----------------------------------------------------------------------------- publish


def test_a_snapshot_of_another_shape_is_refused_before_anything_is_sent(
        tmp_path: Path) -> None:
    """A trainer publishing a model whose embedding has extra rows: the publisher compares
    the snapshot's manifest with the served generation's (its checkpoint here) and raises
    PublishError naming the tensor; the fleet's journal gains nothing, nobody is
    quarantined, no snapshot is kept."""
    from safetensors.torch import save_file

    from rolloutcore.adapters.sim import SimAdapter, SimEngine, sim_target
    from rolloutcore.fleet import Fleet
    from rolloutcore.journal import read_journal
    from rolloutcore.rl.publish import Publisher, PublishError

    gen = torch.Generator().manual_seed(1)
    served = {"embed.weight": torch.randn(8, 4, generator=gen),
              "head.weight": torch.randn(8, 4, generator=gen)}
    save_file(served, str(tmp_path / "model.safetensors"))
    ckpt = str(tmp_path)
    engines = {n: SimEngine(ckpt, label="v1") for n in ("a", "b")}
    fleet = Fleet([(n, SimAdapter(e), None) for n, e in engines.items()],
                  journal=tmp_path / "f.jsonl", fsync=False)
    fleet.bootstrap(sim_target(1, ckpt, label="v1"))
    before = read_journal(tmp_path / "f.jsonl")[1]
    pub = Publisher(fleet, LiveSources(), probe_prompt=(1, 2, 3), probe_tokens=2, eos_id=None,
                    reference_model=lambda: torch.nn.Module())
    wider = {**served, "embed.weight": torch.randn(9, 4, generator=gen)}
    with pytest.raises(PublishError, match=r"'embed\.weight': declared F32 \(8, 4\), "
                                           r"source F32 \(9, 4\): nothing was sent"):
        pub.publish(wider, "step-1")
    fewer = {"embed.weight": served["embed.weight"]}
    with pytest.raises(PublishError, match=r"source lacks 1 tensor.*'head\.weight'"):
        pub.publish(fewer, "step-1")
    assert read_journal(tmp_path / "f.jsonl")[1] == before  # nothing journalled or sent
    assert all(s.serving and not s.quarantined for s in fleet.status())
    assert len(pub.sources) == 0
    fleet.close()
