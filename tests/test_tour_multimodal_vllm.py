"""The spec-generated conformance tour and the scenario corpus on a real multimodal vLLM
server (the tiny BLIP-2 of :mod:`rolloutcore.conformance.fixtures.tiny_mm_model`), with the
encoder cache holding an image's output whenever they reset the encoder tier.

:class:`~rolloutcore.conformance.engines.MultimodalHarnessEngine` sends one image chat
(fresh cache salt) before every pause of a running engine, so the mutation and the
resets after it happen on a non-empty encoder cache, and records every encoder and mm
reset the runner makes: the engine's entries (worker and scheduler halves) just before,
and the reset's own evidence (entries read back after it). The tour must pass exactly as
on the text model, and every encoder reset must have met a non-empty cache; every one
that succeeded must have been verified down to zero entries. Each scenario must agree
with its run on the simulator, as on the text model; the destructive ones run last (a
killed engine is replaced by a fresh multimodal server).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

from vllm_helpers import (  # noqa: E402
    SCENARIO_ORDER,
    check_real_vllm_tour,
    check_scenario_against_simulator,
)

from rolloutcore.conformance.engines import MultimodalHarnessEngine  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_mm_model import (  # noqa: E402
    DEFAULT_OUT,
    build_mm_models,
    harness_models,
)
from rolloutcore.conformance.harness import EnginePool  # noqa: E402
from rolloutcore.conformance.tour import TourGraph, tour  # noqa: E402


@pytest.fixture(scope="module")
def mm_models() -> dict[str, Path]:
    return harness_models(build_mm_models(DEFAULT_OUT))


@pytest.fixture(scope="module")
def pool(mm_models: dict[str, Path],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnginePool]:
    work = tmp_path_factory.mktemp("vllm-mm")
    p = EnginePool(lambda: MultimodalHarnessEngine.start_mm(mm_models, work))
    try:
        yield p
    finally:
        p.close()


def _mm(pool: EnginePool) -> MultimodalHarnessEngine:
    engine = pool.get()
    assert isinstance(engine, MultimodalHarnessEngine)
    return engine


def test_tour_on_a_multimodal_server_resets_a_non_empty_encoder_cache(
        pool: EnginePool, tmp_path: Path) -> None:
    engine = _mm(pool)
    t0 = time.monotonic()
    graph = TourGraph()
    report = tour(engine, tmp_path, graph=graph, walks=4, seed=0, printer=print)
    print(f"multimodal tour: {time.monotonic() - t0:.1f} s")
    check_real_vllm_tour(report, graph)

    # Every warming chat was served (none skipped: the halves always agreed at a pause).
    assert engine.chats and all(c.get("status") == 200 for c in engine.chats), [
        c for c in engine.chats if c.get("status") != 200][:3]
    encoder = [r for r in engine.resets if r.tier == "encoder"]
    planned = sum(1 for r in report.schedules for e in r.schedule.edges
                  if e.action.name == "reset_begin" and e.param == "encoder")
    assert len(encoder) >= planned > 0
    def halves(state: dict[str, object]) -> tuple[object, object]:
        return state.get("encoder_cache_entries"), state.get("encoder_scheduler_entries")

    print(f"encoder resets: {len(encoder)} ({planned} planned reset(encoder) steps); "
          f"before (worker, scheduler): {sorted({halves(r.before) for r in encoder})}; "
          f"after each of {len(engine.chats)} warming chats: "
          f"{sorted({halves(c['after']) for c in engine.chats})}; "
          f"verified to 0: {sum(r.verified_empty for r in encoder)}")
    # Non-empty before every one (worker + scheduler halves: after a reload the worker's
    # half is already empty, the scheduler's still lists the image).
    empty = [r.as_json() for r in encoder if not (r.before.get("encoder_entries") or 0) > 0]
    assert empty == []
    assert all(r.warmed for r in encoder)  # filled by a warming chat, not left over
    # Every reset the engine carried out (200, not refused) was verified down to zero
    # entries in both halves (its body has no success field: the count is the evidence).
    done = [r for r in encoder if r.status == 200 and r.success is not False]
    assert done and all(r.verified_empty for r in done), [r.as_json() for r in done]
    # The others are the tour's injected reset_failed (a 500 before the engine).
    assert [r.status for r in encoder if r not in done] == [500] * (len(encoder) - len(done))
    mm = [r for r in engine.resets if r.tier == "mm" and r.status == 200]
    print(f"mm resets: {len(mm)}; receiver entries before: "
          f"{sorted({r.before.get('mm_receiver_entries') for r in mm})}")
    assert mm and all(r.verified_empty for r in mm), [r.as_json() for r in mm]


@pytest.mark.parametrize("name", SCENARIO_ORDER)
def test_scenario_on_a_multimodal_server_matches_the_simulator(name: str, pool: EnginePool,
                                                               tmp_path: Path) -> None:
    engine = _mm(pool)
    seen = len(engine.resets)
    check_scenario_against_simulator(name, engine, tmp_path)
    # Every encoder reset the scenario's cycles made met a filled cache and, where the
    # engine carried it out, was verified down to zero entries.
    encoder = [r for r in engine.resets[seen:] if r.tier == "encoder"]
    assert all(r.warmed and (r.before.get("encoder_entries") or 0) > 0 for r in encoder), [
        r.as_json() for r in encoder]
    assert all(r.verified_empty for r in encoder if r.status == 200), [
        r.as_json() for r in encoder]
