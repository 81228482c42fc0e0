"""Cache-tier controls on real vLLM, each negative control next to its positive twin:
on a multimodal model (tiny BLIP-2) a stale encoder output reused after a transfer and
an engine killed by a reload that empties only the worker's half of the encoder cache;
under a LoRA adapter, the old adapter's prefix KV reused after vLLM's in-place reload.
The twins: RolloutCore's cycle (weights or adapter) gives the new reference, every reset
verified from what the engine holds."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

from rolloutcore.conformance import cache_controls as mc  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_mm_model import DEFAULT_OUT, build_mm_models  # noqa: E402


@pytest.fixture(scope="module")
def mm_models() -> dict[str, Path]:
    return build_mm_models(DEFAULT_OUT)


@pytest.mark.parametrize("control", mc.CONTROLS, ids=lambda c: c.__name__)
def test_control_and_its_positive_twin(control: mc.Control, mm_models: dict[str, Path],
                                       tmp_path: Path) -> None:
    row = control(mm_models, tmp_path)
    assert row.passed, "\n".join(row.failures())
    assert [r[:2] for r in row.evidence["twin_resets"]] == [
        ["reset(prefix)", "reset_ok"], ["reset(encoder)", "reset_ok"], ["reset(mm)", "reset_ok"]]
    if "cache_warm" in row.evidence:  # the encoder tier: the engine's count of both halves
        assert row.evidence["cache_warm"]["encoder_entries"] == 2
        assert row.evidence["cache_after_cycle"]["encoder_entries"] == 0
    else:  # the adapter: the control reused the old adapter's KV, the twin did not
        assert row.evidence["control_after"]["cached_tokens"] == 128
        assert row.evidence["twin_after"]["tokens"] != row.evidence["control_after"]["tokens"]


def test_the_models_differ_only_in_the_vision_tower_and_only_on_images(
        mm_models: dict[str, Path]) -> None:
    import json

    refs = {v: {p["name"]: p for p in json.loads(
        (mm_models[v] / "references.json").read_text())["probes"]} for v in ("v1", "v2")}
    for name, p1 in refs["v1"].items():
        same = p1["output_token_ids"] == refs["v2"][name]["output_token_ids"]
        assert same is (p1["image"] is None), name
