"""Adapter updates as scenarios on one real vLLM CPU server (``--enable-lora``): the
runner drives the LoRA policy ``pol`` on the tiny Llama's base weights through every
outcome an adapter update can have, each observed from the engine and checked in the
journal:

1. base -> a1: published; the engine vouches for base + a1 and answers a1's reference;
2. a target declaring a1's digest for a2's bytes: the worker's staging refuses before
   anything is loaded; the read after it shows a1 still served: refused, READY on a1;
3. an adapter vLLM cannot load (rank 16 on a server of max rank 8): the old adapter is
   already unloaded when the load fails, so the engine serves neither: ambiguous,
   TAINTED and fenced; a verified re-admission brings a1 back (reference again);
4. a1 -> a2: published; a2's reference, from a fresh staged path.

The simulated engine covers the same outcomes in ``tests/test_lora_adapter.py``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

from rolloutcore.adapters.http import HttpAdapter  # noqa: E402
from rolloutcore.check.trace import check_file  # noqa: E402
from rolloutcore.conformance.cache_controls import (  # noqa: E402
    LORA_ENV,
    LORA_SERVER_ARGS,
    POLICY,
)
from rolloutcore.conformance.engines import INITIAL_LABEL, checkpoint_target  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_lora import build_lora_adapters  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_model import build_models  # noqa: E402
from rolloutcore.conformance.fixtures.vllm_server import VllmServer  # noqa: E402
from rolloutcore.engine.identity import checkpoint_identity, with_adapter  # noqa: E402
from rolloutcore.engine.runner import LifecycleRunner  # noqa: E402
from rolloutcore.engine.targets import adapter_target  # noqa: E402
from rolloutcore.journal import open_controller  # noqa: E402
from rolloutcore.spec.lifecycle import Phase  # noqa: E402

NAME = "pol"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    base = build_models()["v1"].resolve()
    srv = VllmServer(base, extra_args=LORA_SERVER_ARGS, env=LORA_ENV,
                     log_path=tmp_path_factory.mktemp("lora-scenarios") / "vllm.log")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _reference(adapter: Path) -> dict[str, Any]:
    refs = json.loads((adapter / "references.json").read_text())
    return {p["name"]: p for p in refs["probes"]}["long"]


def _served(http: HttpAdapter, ref: dict[str, Any]) -> list[int] | None:
    ev = http.probe(tuple(ref["prompt_token_ids"]), ref["max_tokens"], time.monotonic() + 60)
    return None if ev.tokens is None else list(ev.tokens)


def test_adapter_updates_refusal_ambiguity_and_readmission(server: VllmServer,
                                                           tmp_path: Path) -> None:
    base = build_models()["v1"].resolve()
    adapters = {k: v.resolve() for k, v in build_lora_adapters().items()}
    base_identity = checkpoint_identity(base)
    # An adapter vLLM refuses to load: a2 declaring rank 16 (the server allows 8).
    too_big = tmp_path / "a2-rank16"
    shutil.copytree(adapters["a2"], too_big)
    config = json.loads((too_big / "adapter_config.json").read_text())
    (too_big / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))

    def target(src: Path, generation: int, label: str) -> Any:
        return adapter_target(src, NAME, generation, label, base_identity=base_identity)

    t_a1, t_a2 = target(adapters["a1"], 2, "pol-a1"), target(adapters["a2"], 3, "pol-a2")
    http = HttpAdapter(server.url, lora=NAME)
    controller, journal, _rec = open_controller(tmp_path / "journal.jsonl")
    try:
        runner = LifecycleRunner(controller, http, POLICY)
        boot = runner.bootstrap(checkpoint_target(base, 1, INITIAL_LABEL))
        assert boot.trigger == "bootstrap_ok", boot.reason  # nothing under "pol": the base

        # 1. base -> a1
        rep = runner.update(t_a1)
        assert rep.published, [(s.step, s.outcome, s.reason) for s in rep.steps]
        assert http.read_identity() == with_adapter(base_identity,
                                                    checkpoint_identity(adapters["a1"]))
        assert _served(http, _reference(adapters["a1"])) == \
            _reference(adapters["a1"])["output_token_ids"]

        # 2. other bytes than declared: refused at staging, a1 still served
        forged = dataclasses.replace(target(adapters["a2"], 3, "pol-a2"),
                                     identity=t_a1.identity)
        rep = runner.update(forged)
        mutate = [s for s in rep.steps if s.step == "mutate"]
        assert [s.outcome for s in mutate] == ["mutate_refused"], mutate
        assert "refused" in mutate[0].reason and "still reports the committed" in \
            mutate[0].reason, mutate[0].reason
        assert not rep.published and controller.phase is Phase.READY
        assert controller.control.committed == 2
        assert _served(http, _reference(adapters["a1"])) == \
            _reference(adapters["a1"])["output_token_ids"]

        # 3. an adapter the engine cannot load after the old one was unloaded: TAINTED
        rep = runner.update(target(too_big, 3, "pol-a2r16"))
        mutate = [s for s in rep.steps if s.step == "mutate"]
        assert [s.outcome for s in mutate] == ["mutate_ambiguous"], mutate
        assert "load of 'pol'" in mutate[0].reason and "rank" in mutate[0].reason, \
            mutate[0].reason
        assert controller.phase is Phase.TAINTED and rep.fenced is True
        assert http.read_paused() is True and http.read_label().startswith("tainted")
        out = runner.readmit(t_a1, who="test")
        assert out.trigger == "readmit_ok", out.reason
        assert controller.phase is Phase.READY and controller.control.committed == 2
        assert _served(http, _reference(adapters["a1"])) == \
            _reference(adapters["a1"])["output_token_ids"]

        # 4. a1 -> a2, from a fresh staged path
        rep = runner.update(t_a2)
        assert rep.published, [(s.step, s.outcome, s.reason) for s in rep.steps]
        assert controller.control.committed == 3
        assert _served(http, _reference(adapters["a2"])) == \
            _reference(adapters["a2"])["output_token_ids"]
        loaded = http._worker_results(http.rpc("rc_lora_identity", op="test", name=NAME),
                                      "test")[0]
        assert loaded.get("path") not in (str(adapters["a2"]), None), loaded
    finally:
        journal.close()
        http.close()
    verdict = check_file(tmp_path / "journal.jsonl")
    assert verdict.accepted, verdict.message
