"""LoRA adapter updates without vLLM: the worker's staging (a digested, read-only copy
loaded from a fresh path) and the HTTP adapter's sequence over vLLM's routes (stage,
unload, load, finalise the label), each failure classified by what it can have changed.
The same sequence runs on a real server in tests/test_cache_controls_vllm.py."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutcore.adapters import vllm_lora
from rolloutcore.adapters.contract import AdapterError, MutationOutcome, WeightTarget
from rolloutcore.adapters.http import HttpAdapter
from rolloutcore.engine.identity import (
    ADAPTER_JOIN,
    UNSTAGED,
    checkpoint_identity,
    with_adapter,
    write_safetensors,
)

URL = "http://127.0.0.1:8000"
BASE = "b" * 64


def _adapter(directory: Path, fill: int) -> Path:
    directory.mkdir()
    write_safetensors(directory / "adapter_model.safetensors", [
        ("base_model.model.layers.0.q_proj.lora_A.weight", "F32", [2, 2], bytes([fill] * 16))])
    (directory / "adapter_config.json").write_text('{"r": 2, "lora_alpha": 4}')
    return directory


@pytest.fixture
def adapters(tmp_path: Path) -> dict[str, Path]:
    return {"a1": _adapter(tmp_path / "a1", 1), "a2": _adapter(tmp_path / "a2", 2)}


@pytest.fixture(autouse=True)
def _stage_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("ROLLOUTCORE_LORA_STAGE", str(tmp_path / "stage"))
    monkeypatch.setattr(vllm_lora, "_STAGED", {})
    monkeypatch.setattr(vllm_lora, "_LOADS", [])
    yield


# ------------------------------------------------------------------ worker staging


def test_staging_copies_read_only_and_vouches_for_the_copy(adapters: dict[str, Path]) -> None:
    want = checkpoint_identity(adapters["a1"])
    out = vllm_lora.stage(str(adapters["a1"]), want)
    staged = Path(out["staged"])
    assert out["identity"] == want and staged != adapters["a1"]
    assert sorted(p.name for p in staged.iterdir()) == ["adapter_config.json",
                                                       "adapter_model.safetensors"]
    assert not os.access(staged / "adapter_model.safetensors", os.W_OK) or os.geteuid() == 0
    # two stagings of the same bytes: two paths (fresh prefix-cache keys every time)
    assert vllm_lora.stage(str(adapters["a1"]), want)["staged"] != str(staged)


def test_staging_refuses_other_bytes_and_leaves_nothing(adapters: dict[str, Path]) -> None:
    out = vllm_lora.stage(str(adapters["a2"]), checkpoint_identity(adapters["a1"]))
    assert out["staged"] is None and "not the expected" in out["refused"]
    assert out["identity"] == checkpoint_identity(adapters["a2"])
    assert list(vllm_lora.stage_root().iterdir()) == []
    assert vllm_lora.stage("/nonexistent", "x")["staged"] is None


def test_identity_is_the_newest_load_under_the_name_and_only_if_staged(
        adapters: dict[str, Path]) -> None:
    assert vllm_lora.identity_of("pol", None)["identity"] is None
    staged = vllm_lora.stage(str(adapters["a2"]), checkpoint_identity(adapters["a2"]))["staged"]
    vllm_lora._LOADS.extend([(1, "pol", str(adapters["a1"])), (4, "pol", staged),
                             (3, "other", staged)])
    got = vllm_lora.identity_of("pol", {1, 4})
    assert got["identity"] == checkpoint_identity(adapters["a2"]) and got["int_id"] == 4
    assert got["held"] is True and got["basis"] == vllm_lora.BASIS_STAGED
    vllm_lora._LOADS.append((5, "pol", str(adapters["a1"])))  # someone loaded a user path
    unvouched = vllm_lora.identity_of("pol", None)
    assert unvouched["identity"] is None and "did not stage" in unvouched["reason"]
    # An in-place reload keeps the int id; a path that sorts before the staged one must
    # still count as the newest load (the order of loads decides, not the path).
    vllm_lora._LOADS.extend([(6, "pol", staged), (6, "pol", "/a/user/path")])
    assert vllm_lora.identity_of("pol", None)["identity"] is None


# ------------------------------------------------------------------ the HTTP sequence


Route = Callable[[httpx.Request], httpx.Response]


class FakeLoraServer:
    """vLLM's LoRA routes and the extension's RPCs, backed by the real staging code."""

    def __init__(self) -> None:
        self.label = "default"
        self.loaded: dict[str, tuple[int, str]] = {}
        self.next_id = 1
        self.calls: list[str] = []
        self.override: dict[str, Route] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body: Any = json.loads(request.content) if request.content else None
        key = f"{path}:{body.get('method')}" if path == "/collective_rpc" else path
        self.calls.append(key)
        if key in self.override:
            return self.override[key](request)
        if key == "/collective_rpc:rc_identity":
            return httpx.Response(200, json={"results": [{"identity": BASE}]})
        if key == "/collective_rpc:rc_stage_lora":
            return httpx.Response(200, json={"results": [vllm_lora.stage(**body["kwargs"])]})
        if key == "/collective_rpc:rc_lora_identity":
            return httpx.Response(200, json={"results": [
                vllm_lora.identity_of(body["kwargs"]["name"], None)]})
        if path == "/v1/unload_lora_adapter":
            if self.loaded.pop(body["lora_name"], None) is None:
                return httpx.Response(404, json={"error": {"message": "cannot be found"}})
            return httpx.Response(200, text="Success")
        if path == "/v1/load_lora_adapter":
            if body["lora_name"] in self.loaded:
                return httpx.Response(400, json={"error": {"message": "already loaded"}})
            self.loaded[body["lora_name"]] = (self.next_id, body["lora_path"])
            vllm_lora._LOADS.append((self.next_id, body["lora_name"], body["lora_path"]))
            self.next_id += 1
            return httpx.Response(200, text="Success: added")
        if path == "/update_weight_version":
            self.label = body["new_version"]
            return httpx.Response(200, json={"success": True, "new_version": self.label})
        return httpx.Response(404, json={"detail": "Not Found"})


@pytest.fixture
def server() -> FakeLoraServer:
    return FakeLoraServer()


def http_for(server: FakeLoraServer, lora: str | None = "pol") -> HttpAdapter:
    return HttpAdapter(URL, transport=httpx.MockTransport(server), lora=lora,
                       retry_backoff_s=0.0)


def target(adapter: Path, generation: int, name: str | None = "pol") -> WeightTarget:
    return WeightTarget(generation, f"pol-g{generation}",
                        with_adapter(BASE, checkpoint_identity(adapter)), str(adapter),
                        (1, 2, 3), (4, 5), adapter=name)


def dl() -> float:
    return time.monotonic() + 10.0


def test_update_stages_unloads_loads_and_finalises(server: FakeLoraServer,
                                                   adapters: dict[str, Path]) -> None:
    http = http_for(server)
    # a fresh engine: nothing under the name yet, the base weights serve (and are probed)
    assert http.read_identity(dl()) == BASE and http.model == "tiny"
    first = http.mutate(target(adapters["a1"], 1), dl())  # the first install: unload 404
    assert first.outcome is MutationOutcome.COMPLETED
    assert http.read_identity(dl()) == target(adapters["a1"], 1).identity
    server.calls.clear()
    ev = http.mutate(target(adapters["a2"], 2), dl())
    assert ev.outcome is MutationOutcome.COMPLETED and server.label == "pol-g2"
    assert server.calls == ["/collective_rpc:rc_stage_lora", "/v1/unload_lora_adapter",
                            "/v1/load_lora_adapter", "/update_weight_version"]
    assert http.read_identity(dl()) == target(adapters["a2"], 2).identity
    path = server.loaded["pol"][1]
    assert path not in (str(adapters["a1"]), str(adapters["a2"]))  # the staged copy
    assert http.model == "pol"  # probes go through the adapter


def test_a_refused_staging_changes_nothing(server: FakeLoraServer,
                                           adapters: dict[str, Path]) -> None:
    http = http_for(server)
    wrong = WeightTarget(2, "pol-g2", with_adapter(BASE, checkpoint_identity(adapters["a1"])),
                         str(adapters["a2"]), (1,), (2,), adapter="pol")
    ev = http.mutate(wrong, dl())
    assert ev.outcome is MutationOutcome.NOT_MUTATED and "not the expected" in ev.observed
    assert server.calls == ["/collective_rpc:rc_stage_lora"] and server.label == "default"
    server.override["/collective_rpc:rc_stage_lora"] = lambda r: httpx.Response(500, json={})
    with pytest.raises(AdapterError) as err:
        http.mutate(target(adapters["a2"], 2), dl())
    assert err.value.proven_no_effect


@pytest.mark.parametrize("route", ["/v1/unload_lora_adapter", "/v1/load_lora_adapter"])
def test_a_failure_after_staging_is_ambiguous(server: FakeLoraServer, adapters: dict[str, Path],
                                              route: str) -> None:
    http = http_for(server)
    assert http.mutate(target(adapters["a1"], 1), dl()).outcome is MutationOutcome.COMPLETED
    server.override[route] = lambda r: httpx.Response(500, json={"error": {"message": "boom"}})
    ev = http.mutate(target(adapters["a2"], 2), dl())
    assert ev.outcome is MutationOutcome.AMBIGUOUS and "HTTP 500" in ev.observed
    assert server.label == "pol-g1"  # never finalised


def test_a_target_for_another_adapter_or_none_is_refused_before_anything(
        server: FakeLoraServer, adapters: dict[str, Path]) -> None:
    for name in ("other", None):
        with pytest.raises(AdapterError, match="refused") as err:
            http_for(server).mutate(target(adapters["a1"], 1, name=name), dl())
        assert err.value.proven_no_effect
    with pytest.raises(AdapterError, match="refused"):
        http_for(server, lora=None).mutate(target(adapters["a1"], 1), dl())
    assert server.calls == []


def test_an_adapter_loaded_from_a_path_nobody_staged_reads_as_no_target(
        server: FakeLoraServer, adapters: dict[str, Path]) -> None:
    """vLLM loaded an adapter under the name from a path RolloutCore never staged (in
    place, behind its back): definite evidence of other weights, so the identity names
    that path and equals no target's (an audit's mismatch, not an unreadable engine)."""
    vllm_lora._LOADS.append((7, "pol", str(adapters["a1"])))  # loaded behind our back
    identity = http_for(server).read_identity(dl())
    base, _, adapter = identity.partition(ADAPTER_JOIN)
    assert adapter == f"{UNSTAGED}{adapters['a1']}" and base
    assert identity != with_adapter(base, checkpoint_identity(adapters["a1"]))


# ------------------------------------------------------------------ the fleet's targets


def _checkpoint(directory: Path) -> Path:
    directory.mkdir()
    write_safetensors(directory / "model.safetensors", [("w", "F32", [2], bytes(8))])
    (directory / "references.json").write_text(json.dumps({"probes": [{
        "name": "long", "prompt_token_ids": [1, 2], "output_token_ids": [3]}]}))
    return directory


def test_a_fleet_file_adapter_table_and_its_targets(tmp_path: Path,
                                                    adapters: dict[str, Path]) -> None:
    from rolloutcore.cli.fleet_commands import policy_targets
    from rolloutcore.engine.targets import TargetError
    from rolloutcore.fleet import FleetFileError, load_fleet_file

    base = _checkpoint(tmp_path / "base")
    (adapters["a1"] / "references.json").write_text((base / "references.json").read_text())
    engine = '[[engine]]\nname = "a"\nurl = "http://127.0.0.1:1"\n'
    f = tmp_path / "fleet.toml"
    f.write_text(f'[adapter]\nname = "pol"\nbase = "base"\n{engine}')
    cfg = load_fleet_file(f)
    assert cfg.adapter is not None and cfg.adapter.base == base and cfg.served_model == "pol"
    target_of = policy_targets(cfg)
    t = target_of(str(adapters["a1"]), 2, "pol-a1")
    assert t.adapter == "pol" and t.identity == with_adapter(
        checkpoint_identity(base), checkpoint_identity(adapters["a1"]))
    assert target_of(str(base), 1, "default").adapter is None  # the bootstrap: the base
    f.write_text(engine)
    with pytest.raises(TargetError, match="no \\[adapter\\]"):
        policy_targets(load_fleet_file(f))(str(adapters["a1"]), 2, "x")
    for bad, why in (('[adapter]\nname = "pol"\n' + engine, "takes name and base"),
                     ('[adapter]\nname = ""\nbase = "b"\n' + engine, "non-empty strings"),
                     (f'[adapter]\nname = "pol"\nbase = "b"\n{engine}transfer = "gloo"\n',
                      "not sent by a weight transfer")):
        f.write_text(bad)
        with pytest.raises(FleetFileError, match=why):
            load_fleet_file(f)
