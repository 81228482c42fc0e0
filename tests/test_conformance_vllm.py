"""The conformance corpus against a real vLLM CPU server, each scenario compared with
its run on the simulator, the adapter's wire behaviour, and the end-to-end demo.

One server (with the RolloutCore worker extension) serves every scenario; the one that
kills its engine (failed_load) runs last and the pool would start a fresh server for
anything after it. The demo starts its own server once the pool's is stopped: one vLLM
server at a time on this machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

from vllm_helpers import check_real_vllm_tour  # noqa: E402

from rolloutcore.adapters.contract import AdapterError  # noqa: E402
from rolloutcore.conformance.engines import SimHarnessEngine, VllmHarnessEngine  # noqa: E402
from rolloutcore.conformance.fixtures.server_pool import ServerPool  # noqa: E402
from rolloutcore.conformance.harness import EnginePool, compare, run_scenario  # noqa: E402
from rolloutcore.conformance.scenarios import SCENARIOS  # noqa: E402
from rolloutcore.conformance.tour import (  # noqa: E402
    TourGraph,
    tour,
)

# Non-destructive first, in corpus order; the destructive ones last.
ORDER = sorted(SCENARIOS, key=lambda n: SCENARIOS[n].destructive)
#: Scenarios that fail because of a bug outside the harness (strict: a fix turns them red
#: here so that the marker goes away with the bug).
KNOWN_BUGS: dict[str, str] = {}  # pause_timeout was here: fixed in the spec (pause_failed)
PARAMS = [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[n]))
          if n in KNOWN_BUGS else n for n in ORDER]


@pytest.fixture(scope="module")
def pool(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory,
         vllm_pool: ServerPool) -> Iterator[EnginePool]:
    work = tmp_path_factory.mktemp("vllm-conformance")
    p = EnginePool(lambda: VllmHarnessEngine.leased(vllm_pool, models, work))
    try:
        yield p
    finally:
        p.close()


def test_adapter_survives_the_connection_reset_after_an_engine_500(pool: EnginePool) -> None:
    engine = pool.get()
    assert isinstance(engine, VllmHarnessEngine)
    http = engine.http
    for _ in range(3):
        r = http.rpc("no_such_method", op="test")  # a harmless engine-side 500
        assert r.status == 500 and "not implemented" in r.text
        assert http.read_label()  # the next idempotent call works (fresh connection)
    r = http.rpc("rc_cache_info", op="test")
    assert r.status == 200 and r.body["results"][0]["multimodal"] is False


def test_worker_extension_reports_identity_and_unreadable_params(pool: EnginePool) -> None:
    engine = pool.get()
    assert isinstance(engine, VllmHarnessEngine)
    engine.restore()
    assert engine.http.read_identity() == engine.checkpoint_identity("v1")
    r = engine.http.rpc("rc_param_digest", op="test")
    res = r.body["results"][0]
    # CPU repacks linear layers for oneDNN: they read as empty and are reported.
    assert res["readable"] > 0 and any("repacked" in u for u in res["unreadable"])
    # A missing path is refused by the worker before anything changes.
    r = engine.http.rpc("rc_reload_weights", op="test", idempotent=False,
                        weights_path="/nonexistent/dir")
    assert r.body["results"][0]["loaded"] is False
    assert engine.http.read_identity() == engine.checkpoint_identity("v1")


def test_tour_on_real_vllm_realises_every_realisable_class(pool: EnginePool,
                                                          tmp_path: Path) -> None:
    """The spec-generated cover, replayed on the real server (faults through the proxy),
    then seeded random walks; what it cannot realise is exactly what the plan says."""
    graph = TourGraph()
    report = tour(pool.get(), tmp_path, graph=graph, walks=4, seed=0, printer=print)
    # probe_mismatch is realised by a server replaced out of band before the probe.
    check_real_vllm_tour(report, graph)


def _cli(*args: str, env_dir: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ROLLOUTCORE_ARTIFACTS": str(env_dir)}
    return subprocess.run([sys.executable, "-m", "rolloutcore.cli", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def test_tour_against_an_existing_server(pool: EnginePool, models: dict[str, Path],
                                         tmp_path: Path) -> None:
    """--url: the harness attaches to a server it did not start (here the pool's), checks
    it first, runs the --safe tour, and leaves it as it found it."""
    engine = pool.get()
    assert isinstance(engine, VllmHarnessEngine)
    engine.restore()
    url = engine.server.url
    ckpts = [f"--checkpoint={k}={models[k]}" for k in ("v1", "v2", "v1neg")]
    r = _cli("conformance", "tour", "--url", url, *ckpts, "--safe", "--walks", "2", "--json",
             env_dir=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["safe"] and rep["passed"] and rep["walks"]["failure"] is None
    assert rep["classes"]["mutate_refused@UPDATING"].startswith("--safe")
    assert engine.label() == "default" and engine.identity() == engine.checkpoint_identity("v1")
    assert not engine.is_paused_raw()
    # The preflight refuses, with one line naming what is missing, before touching it.
    for args, words in (
        (["--url", url, "--model", "nope", *ckpts], "not --model nope"),
        (["--url", url, *ckpts[:2]], "checkpoint v1neg is not given"),
        (["--url", "http://127.0.0.1:9", *ckpts], "cannot reach"),
        (["--url", url, f"--checkpoint=v1={models['v2']}", *ckpts[1:]], "must serve"),
    ):
        r = _cli("conformance", "tour", *args, env_dir=tmp_path, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 3 and len(lines) == 1 and words in lines[0], (args, r.stderr)


@pytest.mark.parametrize("name", PARAMS)
def test_scenario_on_vllm_matches_the_simulator(name: str, pool: EnginePool,
                                               tmp_path: Path) -> None:
    real = run_scenario(SCENARIOS[name], pool.get(), tmp_path, printer=print)
    sim = run_scenario(SCENARIOS[name], SimHarnessEngine(), tmp_path)
    assert compare([sim], [real]) == [], "simulator and real vLLM disagree"
    assert real.passed, real.failures()
    assert real.trace is not None and real.trace["accepted"] and real.trace["chain_ok"]
    assert sim.passed, sim.failures()


def test_failed_load_left_no_usable_engine(pool: EnginePool) -> None:
    """The naive resume after the failed load killed the server (observed: exit 0)."""
    engine = pool.engine
    assert engine is not None and not engine.alive()
    with pytest.raises(AdapterError):
        engine.adapter.read_state()


def test_demo_end_to_end(pool: EnginePool, tmp_path: Path) -> None:
    from rolloutcore.conformance.demos.lifecycle_story import run_demo

    pool.close()  # one server at a time
    out = tmp_path / "demo.out"
    with open(out, "w") as fh:
        demo = run_demo(fh, tmp_path)
    text = out.read_text()
    assert demo.passed, text
    assert "trajectory bindings" in text and "journal:" in text
    assert len({r.generation for r in demo.rollouts}) == 3
    assert demo.info["trace"]["accepted"]
