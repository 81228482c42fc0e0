"""A LoRA fleet end to end on two real vLLM CPU servers: ``rolloutcore serve`` over a fleet
file with an ``[adapter]`` table bootstraps on the base weights, installs adapter a1 and
then a2 through the admin API (every member verified: base and adapter identity, a probe
through the adapter), answers through the adapter with the generation that served it,
and its journal and trajectory records check (each record bound to base + adapter). Its
watchdog audits throughout: under the load of four clients every audit passes and both
engines live; an adapter reloaded in place behind its back is a mismatch (quarantined,
fenced) and a verified re-admission brings the member back."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

import httpx  # noqa: E402

from rolloutcore import cli  # noqa: E402
from rolloutcore.adapters.launch import free_port  # noqa: E402
from rolloutcore.check.fleet_trace import check_fleet_file  # noqa: E402
from rolloutcore.conformance.cache_controls import LORA_ENV, LORA_SERVER_ARGS  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_lora import build_lora_adapters  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_model import build_models  # noqa: E402
from rolloutcore.conformance.fixtures.vllm_server import VllmServer  # noqa: E402
from rolloutcore.engine.identity import ADAPTER_JOIN, checkpoint_identity  # noqa: E402
from rolloutcore.journal import read_journal  # noqa: E402

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


#: The watchdog's period here: the default watchdog (audits with a probe through the
#: adapter), run often so that a few seconds of load meet several audits.
WATCHDOG_S = 1.0
CLIENTS = 4


def _status(url: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/admin/status", timeout=BOUND)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _watchdog_under_load(url: str, servers: list[VllmServer]) -> None:
    """Four clients keep both engines busy through the adapter while the watchdog audits
    every member each second: every request is answered, both engines live, and each
    member's audits pass (their probe decodes greedily: a scored probe through the
    adapter beside other requests kills vLLM CPU's engine)."""
    stop = time.monotonic() + 6 * WATCHDOG_S
    codes: list[int] = []

    def client(k: int) -> None:
        while time.monotonic() < stop:
            r = httpx.post(f"{url}/v1/completions", timeout=BOUND, json={
                "model": "pol", "prompt": [k + 3] * 40, "max_tokens": 24,
                "temperature": 1.0, "seed": k})
            codes.append(r.status_code)

    t0 = time.time()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    assert codes and set(codes) == {200}, sorted(set(codes))
    assert all(s.is_running() for s in servers)
    for e in _status(url)["engines"]:
        assert e["serving"], e
        audit = e["last_audit"]
        assert audit["outcome"] == "audit_ok" and audit["at"] > t0, e


def _member_steps(journal: Path, name: str) -> list[tuple[str, Any]]:
    """Member ``name``'s journalled steps so far, with who asked (a re-admission's)."""
    return [(str(r.get("step")), (r.get("detail") or {}).get("who"))
            for r in read_journal(journal)[1] if r.get("engine") == name]


def _adapter_reloaded_in_place(url: str, a: VllmServer, adapters: dict[str, Path],
                               a2_tokens: list[int], journal: Path) -> None:
    """An operator reloads the served adapter's name in place from a1's directory on
    member a, behind the controller's back: the next audit finds an adapter RolloutCore
    did not stage (a mismatch, not an unreadable engine): a is quarantined and fenced;
    then the watchdog re-admits it, verified (a2 staged again), with nobody asking, and
    a serves a2 (the journal says so, step by step)."""
    before = len(_member_steps(journal, "a"))
    r = httpx.post(f"{a.url}/v1/load_lora_adapter", timeout=BOUND, json={
        "lora_name": "pol", "lora_path": str(adapters["a1"]), "load_inplace": True})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + BOUND
    while "readmit_ok" not in (steps := [s for s, _ in _member_steps(journal, "a")[before:]]):
        assert time.monotonic() < deadline, steps
        time.sleep(0.1)
    steps_who = _member_steps(journal, "a")[before:]
    names = [s for s, _ in steps_who]
    mismatch = names.index("audit_mismatch")
    assert names[mismatch:mismatch + 5] == [
        "audit_mismatch", "fence_begin", "fence_ok", "readmit_begin", "readmit_ok"], names
    assert steps_who[mismatch + 3][1] == "watchdog", steps_who
    row = next(e for e in _status(url)["engines"] if e["name"] == "a")
    assert row["serving"] and not row["quarantined"], row
    ref = _reference(adapters["a2"])
    for _ in range(4):  # least outstanding first: both members answer, a among them
        c = httpx.post(f"{url}/v1/completions", timeout=BOUND, json={
            "model": "pol", "prompt": ref["prompt_token_ids"], "max_tokens": 16,
            "min_tokens": 16, "temperature": 0.0, "return_token_ids": True})
        assert c.status_code == 200 and c.json()["choices"][0]["token_ids"] == a2_tokens


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
         "--records", str(records), "--watchdog", str(WATCHDOG_S)], cwd=REPO,
        stdout=subprocess.PIPE,
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
        _watchdog_under_load(url, servers)
        _adapter_reloaded_in_place(url, servers[0], adapters, served["a2"],
                                   fleet_file.with_suffix(".journal.jsonl"))
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=BOUND)
    assert proc.returncode == 0, (out, err)
    journal = fleet_file.with_suffix(".journal.jsonl")
    assert check_fleet_file(journal).accepted
    assert cli.main(["records", "verify", str(records), "--journal", str(journal)]) == 0
    bound = [json.loads(line) for line in records.read_text().splitlines()]
    a2 = checkpoint_identity(adapters["a2"])
    gens = [r["binding"]["generation"] for r in bound]  # a1's, a2's, then the load's
    assert gens[:2] == [2, 3] and set(gens[2:]) == {3} and len(gens) > 2 + CLIENTS, gens
    assert bound[-1]["binding"]["identity"] == f"{checkpoint_identity(base)}{ADAPTER_JOIN}{a2}"
