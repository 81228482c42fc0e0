"""A LoRA fleet end to end on two real vLLM CPU servers: ``rolloutcore serve`` over a fleet
file with an ``[adapter]`` table bootstraps on the base weights, installs adapter a1 and
then a2 through the admin API (every member verified: base and adapter identity, a probe
through the adapter), answers through the adapter with the generation that served it,
and its journal and trajectory records check (each record bound to base + adapter)."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

import httpx  # noqa: E402

from rolloutcore import cli  # noqa: E402
from rolloutcore.conformance.cache_controls import LORA_ENV, LORA_SERVER_ARGS  # noqa: E402
from rolloutcore.conformance.server import VllmServer, free_port  # noqa: E402
from rolloutcore.conformance.tiny_lora import build_lora_adapters  # noqa: E402
from rolloutcore.conformance.tiny_model import build_models  # noqa: E402
from rolloutcore.fleet_check import check_fleet_file  # noqa: E402
from rolloutcore.identity import ADAPTER_JOIN, checkpoint_identity  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BOUND = 120.0  # a bound against a broken test, never a measurement


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmServer]]:
    base = build_models()["v1"].resolve()
    work = tmp_path_factory.mktemp("lora-fleet")
    out = [VllmServer(base, extra_args=LORA_SERVER_ARGS, env=LORA_ENV,
                      log_path=work / f"vllm-{n}.log") for n in ("a", "b")]
    try:
        for s in out:
            s.start()
        yield out
    finally:
        for s in out:
            s.stop()


def _reference(adapter: Path) -> dict[str, list[int]]:
    refs = json.loads((adapter / "references.json").read_text())
    return {p["name"]: p for p in refs["probes"]}["long"]


def test_a_lora_fleet_behind_the_gateway(servers: list[VllmServer], tmp_path: Path) -> None:
    base = build_models()["v1"].resolve()
    adapters = {k: v.resolve() for k, v in build_lora_adapters().items()}
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(
        f'[adapter]\nname = "pol"\nbase = "{base}"\n' +
        "".join(f'[[engine]]\nname = "{n}"\nurl = "{s.url}"\n'
                for n, s in zip("ab", servers, strict=True)))
    port = free_port()
    records = tmp_path / "records.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rolloutcore.cli", "serve", "--fleet", str(fleet_file),
         "--port", str(port), "--initial", str(base), "--initial-label", "default",
         "--records", str(records), "--no-watchdog"], cwd=REPO, stdout=subprocess.PIPE,
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
        served = {}
        for gen, name in ((2, "a1"), (3, "a2")):
            r = httpx.post(f"{url}/admin/update", json={
                "checkpoint": str(adapters[name]), "label": f"pol-{name}"}, timeout=BOUND)
            assert r.status_code == 200 and r.json()["published"], r.text
            assert r.json()["committed"] == gen
            ref = _reference(adapters[name])
            c = httpx.post(f"{url}/v1/completions", timeout=BOUND, json={
                "model": "pol", "prompt": ref["prompt_token_ids"], "max_tokens": 16,
                "min_tokens": 16, "temperature": 0.0, "return_token_ids": True})
            assert c.status_code == 200, c.text
            assert c.headers["x-rolloutcore-generation"] == str(gen)
            served[name] = c.json()["choices"][0]["token_ids"]
            assert served[name] == ref["output_token_ids"], name
        assert served["a1"] != served["a2"]
        wrong = httpx.post(f"{url}/v1/completions", timeout=BOUND, json={
            "model": "tiny", "prompt": [1, 2], "max_tokens": 1})
        assert wrong.status_code == 404  # the gateway serves the adapter's name only
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=BOUND)
    assert proc.returncode == 0, (out, err)
    journal = fleet_file.with_suffix(".journal.jsonl")
    assert check_fleet_file(journal).accepted
    assert cli.main(["records", "verify", str(records), "--journal", str(journal)]) == 0
    bound = [json.loads(line) for line in records.read_text().splitlines()]
    a2 = checkpoint_identity(adapters["a2"])
    assert [r["binding"]["generation"] for r in bound] == [2, 3]
    assert bound[-1]["binding"]["identity"] == f"{checkpoint_identity(base)}{ADAPTER_JOIN}{a2}"
