"""Replay validator against the real vLLM CPU server (issue 6, scenarios 4 and 5).

One server: records are made under generation 1 (v1) -- greedy, run concurrently so that
the engine batches them, and sampled with seeds -- and replay clean against v1. After
``reload_weights`` to v2 and a prefix-cache reset every record is flagged, while records
made under generation 2 replay clean. v1neg has v1's manifest but other bytes: its
identity differs and v1's records are flagged against it; back on v1 they are clean again.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

from rolloutcore.adapters.contract import GenerationResult  # noqa: E402
from rolloutcore.adapters.http import HttpAdapter  # noqa: E402
from rolloutcore.cli import main as cli_main  # noqa: E402
from rolloutcore.conformance.engines import checkpoint_target  # noqa: E402
from rolloutcore.conformance.fixtures.server_pool import ServerPool  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_model import (  # noqa: E402
    DEFAULT_OUT,
    build_models,
    load_references,
)
from rolloutcore.conformance.fixtures.vllm_server import VllmServer  # noqa: E402
from rolloutcore.conformance.replay import DEFAULT_TOLERANCE, ReplayVerdict, replay  # noqa: E402
from rolloutcore.engine.controller import Controller, ControlState  # noqa: E402
from rolloutcore.engine.identity import checkpoint_identity, manifest_digest  # noqa: E402
from rolloutcore.engine.runner import LifecycleRunner, rollout_record  # noqa: E402
from rolloutcore.spec.lifecycle import ALL_EVIDENCE, NO_OP, Phase  # noqa: E402
from rolloutcore.trajectories.format import (  # noqa: E402
    Decoding,
    Timing,
    TrajectoryRecord,
    read_records,
    record_from,
    write_jsonl,
    write_parquet,
)

GREEDY = Decoding(0.0, 1.0, 24, 24)


def _sampled(seed: int) -> Decoding:
    return Decoding(0.8, 0.9, 24, 0, seed=seed)


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    return build_models(DEFAULT_OUT)


@pytest.fixture(scope="module")
def server(vllm_pool: ServerPool) -> Iterator[VllmServer]:
    # with the worker extension, for the runner test (it changes no plain vLLM route)
    with vllm_pool.leased(1) as (srv,):
        yield srv


def _prompts(models: dict[str, Path]) -> list[tuple[int, ...]]:
    probes = load_references(models["v1"])["probes"]
    return [tuple(p["prompt_token_ids"]) for p in probes if len(p["prompt_token_ids"]) < 200]


def _generate(url: str, prompt: tuple[int, ...], dec: Decoding) -> tuple[
        GenerationResult, Timing]:
    body: dict[str, Any] = {"model": "tiny", "prompt": list(prompt), "return_token_ids": True,
                            "logprobs": 0, **dec.request_fields()}
    t0, m0 = time.time(), time.monotonic()
    with httpx.Client(base_url=url, trust_env=False, timeout=120) as c:
        resp = c.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    ch = resp.json()["choices"][0]
    assert ch["prompt_token_ids"] == list(prompt)
    result = GenerationResult(prompt, tuple(ch["token_ids"]), ch["finish_reason"],
                              tuple(ch["logprobs"]["token_logprobs"]),
                              extra={"stop_reason": ch["stop_reason"]})
    return result, Timing(t0, time.monotonic() - m0)


def _make_records(ctl: Controller, url: str, label: str, prompts: list[tuple[int, ...]],
                  tag: str) -> list[TrajectoryRecord]:
    """Greedy rollouts run concurrently (batched), then seeded sampled ones."""
    jobs = [(f"{tag}-greedy-{i}", p, GREEDY) for i, p in enumerate(prompts)] + [
        (f"{tag}-sampled-{i}", p, _sampled(100 + i)) for i, p in enumerate(prompts)]

    def one(job: tuple[str, tuple[int, ...], Decoding]) -> TrajectoryRecord:
        rid, prompt, dec = job
        with ctl.rollout(rid) as binding:
            result, timing = _generate(url, prompt, dec)
        return record_from(binding, label, prompt, result, dec, timing)

    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(one, jobs))


def _commit(ctl: Controller, generation: int, identity: str) -> None:
    # What the runner's publish leaves behind: READY at the new committed generation.
    ctl.identity = identity
    ctl.restore(ControlState(Phase.READY, generation, generation, NO_OP, frozenset(),
                             ALL_EVIDENCE))


def _reload(url: str, model: Path) -> None:
    with httpx.Client(base_url=url, trust_env=False, timeout=120) as c:
        r = c.post("/collective_rpc", json={"method": "reload_weights",
                                            "kwargs": {"weights_path": str(model)}})
        assert r.status_code == 200, r.text
        r = c.post("/reset_prefix_cache")
        assert r.json() == {"success": True}, r.text


def _summary(tag: str, vs: list[ReplayVerdict]) -> str:
    mx = max(v.max_abs_diff or 0.0 for v in vs)
    mins = min(v.max_abs_diff or 0.0 for v in vs)
    med = sorted(v.median_abs_diff or 0.0 for v in vs)
    return (f"{tag}: {[v.verdict for v in vs].count('match')}/{len(vs)} match; per-record "
            f"max|d| in [{mins:.3g}, {mx:.3g}], median|d| in [{med[0]:.3g}, {med[-1]:.3g}]")


def test_replay_clean_on_same_weights_flagged_after_update(
        server: VllmServer, models: dict[str, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    ids = {name: checkpoint_identity(models[name]) for name in ("v1", "v2", "v1neg")}
    # the seed's pitfall: v1 and v1neg have one manifest, but they are different weights
    assert manifest_digest(models["v1"]) == manifest_digest(models["v1neg"])
    assert ids["v1"] != ids["v1neg"]
    prompts = _prompts(models)
    ctl = Controller()
    _commit(ctl, 1, ids["v1"])
    t0 = time.monotonic()
    recs = _make_records(ctl, server.url, "v1", prompts, "g1")
    assert all(r.version == 1 and r.identity == ids["v1"] for r in recs)
    assert {r.decoding.temperature for r in recs} == {0.0, 0.8}
    jsonl, parquet = tmp_path / "g1.jsonl", tmp_path / "g1.parquet"
    write_jsonl(jsonl, recs)
    write_parquet(parquet, recs)
    assert read_records(jsonl) == recs == read_records(parquet)
    made = time.monotonic() - t0

    lines: list[str] = []
    same = replay(read_records(parquet), server.url)
    lines.append(_summary("v1 records vs v1", same))
    assert all(v.verdict == "match" for v in same), [v.as_json() for v in same]
    assert all(v.tokens == len(r.response_token_ids) for v, r in zip(same, recs, strict=True))
    assert cli_main(["records", "replay", str(jsonl), "--engine", server.url, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [v["verdict"] for v in out["verdicts"]] == ["match"] * len(recs)

    # generation 2: v2 loaded in place, prefix cache reset, published
    _reload(server.url, models["v2"])
    _commit(ctl, 2, ids["v2"])
    other = replay(recs, server.url)
    lines.append(_summary("v1 records vs v2", other))
    assert all(v.verdict == "mismatch" for v in other), [v.as_json() for v in other]
    # clearly, not marginally: most tokens of every record are far out of tolerance
    assert all(v.over_tolerance >= v.tokens // 2 for v in other)
    assert min(v.max_abs_diff or 0.0 for v in other) > 100 * DEFAULT_TOLERANCE
    assert cli_main(["records", "replay", str(parquet), "--engine", server.url]) == 1
    assert "mismatch" in capsys.readouterr().out
    recs2 = _make_records(ctl, server.url, "v2", prompts, "g2")
    assert all(r.version == 2 and r.identity == ids["v2"] for r in recs2)
    same2 = replay(recs2, server.url)
    lines.append(_summary("v2 records vs v2", same2))
    assert all(v.verdict == "match" for v in same2)

    # equal manifest, different content: v1's records are flagged against v1neg
    _reload(server.url, models["v1neg"])
    neg = replay(recs, server.url)
    lines.append(_summary("v1 records vs v1neg", neg))
    assert all(v.verdict == "mismatch" for v in neg)

    # and back on v1's bytes they replay clean again
    _reload(server.url, models["v1"])
    back = replay(recs, server.url)
    lines.append(_summary("v1 records vs v1 again", back))
    assert all(v.verdict == "match" for v in back)
    with capsys.disabled():
        print(f"\n  records made in {made:.2f} s ({len(recs)} rollouts)")
        for line in lines:
            print("  " + line)


def test_runner_records_replay_across_updates(server: VllmServer,
                                              models: dict[str, Path]) -> None:
    """Through RolloutCore itself: bootstrap on v1 (generation 1), record rollouts, update
    to v2 (generation 2) with the HTTP adapter, record again, then update back to v1's
    bytes as generation 3. Replay follows the weights' identity, not the number."""
    prompts = _prompts(models)[:3]
    with HttpAdapter(server.url) as adapter:
        runner = LifecycleRunner(Controller(), adapter)
        boot = runner.bootstrap(checkpoint_target(models["v1"], 1, "default"))
        assert boot.trigger == "bootstrap_ok", boot.reason
        g1 = [rollout_record(runner, f"g1-{i}", p, 16) for i, p in enumerate(prompts)]
        assert runner.update(checkpoint_target(models["v2"], 2, "v2")).published
        g2 = [rollout_record(runner, f"g2-{i}", p, 16) for i, p in enumerate(prompts)]
        assert {r.version for r in g1} == {1} and {r.version for r in g2} == {2}
        assert {r.label for r in g2} == {"v2"}
        assert [v.verdict for v in replay(g1, server.url)] == ["mismatch"] * len(g1)
        assert [v.verdict for v in replay(g2, server.url)] == ["match"] * len(g2)
        assert runner.update(checkpoint_target(models["v1"], 3, "v1-again")).published
        assert [v.verdict for v in replay(g1, server.url)] == ["match"] * len(g1)
        assert [v.verdict for v in replay(g2, server.url)] == ["mismatch"] * len(g2)
        assert g1[0].identity == runner.targets[3].identity != g2[0].identity
