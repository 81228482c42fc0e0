"""RolloutCore governing engines hosted in Ray actors: a local Ray cluster started here,
two real in-process vLLM engines placed by :func:`rolloutcore.adapters.ray_engine.launch`
(a placement group, named actors, Ray restarts), driven through their Ray handles.

On one of them, the in-process adapter running inside the actor: the spec-generated
tour (faults injected inside the actor, :mod:`rolloutcore.conformance.inprocess_engine`)
and the scenario corpus, each scenario beside its simulator run.

Fleet scenarios over both (each ends with the fleet journal passing the fleet checker):

* a verified update on both actors, driven through their handles;
* an actor's process killed in the middle of its mutation (held there by the test):
  the call dies with the actor, so the mutation is ambiguous: quarantined; the other
  member publishes; Ray restarts the actor, and a verified re-admission brings it back;
* an actor's process killed between its validation and the publish: the next call is
  answered by a new incarnation (an engine replaced out of band), the member is
  quarantined, the other publishes, the restarted actor is re-admitted;
* an actor restarted while serving and relabelled with the committed label by its host
  (what a framework's init does): its first answer names a new incarnation (suspected,
  audited at once), and the audit finds its weights are not the committed ones
  (identity): quarantined, then re-admitted.
"""

from __future__ import annotations

import importlib.util
import json
import os
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

if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("ray") is None:
    pytest.skip("vllm or ray is not installed (pip install -e '.[vllm]')",
                allow_module_level=True)

import httpx  # noqa: E402
import ray  # noqa: E402
from vllm_helpers import (  # noqa: E402
    SCENARIO_ORDER,
    check_real_vllm_tour,
    check_scenario_against_simulator,
)

from rolloutcore.adapters.contract import MutationOutcome, PauseMode  # noqa: E402
from rolloutcore.adapters.launch import free_port  # noqa: E402
from rolloutcore.adapters.ray_engine import (  # noqa: E402
    NAMESPACE,
    LaunchedEngine,
    RayAdapter,
    launch,
    placement_bundles,
)
from rolloutcore.check.fleet_trace import check_fleet_file  # noqa: E402
from rolloutcore.conformance.engines import INITIAL_LABEL, checkpoint_target  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_model import build_models  # noqa: E402
from rolloutcore.conformance.harness import EnginePool, wait_until  # noqa: E402
from rolloutcore.conformance.inprocess_engine import (  # noqa: E402
    ActorServer,
    InProcessHarnessEngine,
)
from rolloutcore.conformance.tour import TourGraph, tour  # noqa: E402
from rolloutcore.engine.runner import RunnerPolicy  # noqa: E402
from rolloutcore.fleet import Fleet  # noqa: E402
from rolloutcore.spec.lifecycle import TIERS, Phase  # noqa: E402

BOUND = 240.0  # a bound against a broken test, never a measurement
POLICY = RunnerPolicy(step_timeout_s=60.0, pause_timeout_s=60.0, drain_timeout_s=60.0,
                      mutation_base_s=5.0)


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, LaunchedEngine]]:
    ray.init(num_cpus=3, include_dashboard=False, namespace=NAMESPACE,
             log_to_driver=False, configure_logging=False)
    try:
        _pg, launched = launch(build_models()["v1"], ["a", "b"], max_restarts=4)
        yield {e.name: e for e in launched}
    finally:
        ray.shutdown()


def _pid(e: LaunchedEngine) -> int:
    return int(ray.get(e.handle.info.remote(), timeout=BOUND)["pid"])


def _kill(e: LaunchedEngine) -> str:
    """SIGKILL the actor's process; the incarnation it had."""
    info = ray.get(e.handle.info.remote(), timeout=BOUND)
    os.kill(int(info["pid"]), signal.SIGKILL)
    return str(info["incarnation"])


def _restarted(e: LaunchedEngine, old: str) -> dict[str, Any]:
    """The actor's info once Ray has it running again as a new incarnation."""
    out: dict[str, Any] = {}

    def up() -> bool:
        try:
            out.update(ray.get(e.handle.info.remote(), timeout=5))
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False
        return out.get("incarnation") != old

    assert wait_until(up, BOUND, interval=0.2), f"{e.name} was not restarted by Ray"
    return out


@pytest.fixture(scope="module")
def harness(engines: dict[str, LaunchedEngine],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnginePool]:
    work = tmp_path_factory.mktemp("inprocess")
    a = engines["a"]
    pool = EnginePool(lambda: InProcessHarnessEngine(a.handle, a.url, build_models(),
                                                     work_dir=work))
    try:
        yield pool
    finally:
        pool.close()


def test_tour_on_an_in_process_engine_in_a_ray_actor(harness: EnginePool,
                                                     tmp_path: Path) -> None:
    """The spec-generated cover and seeded walks through the actor's handle: what the
    in-process engine cannot realise is exactly what the plan says of a real vLLM."""
    graph = TourGraph()
    report = tour(harness.get(), tmp_path, graph=graph, walks=4, seed=0, printer=print)
    check_real_vllm_tour(report, graph)


@pytest.mark.parametrize("name", SCENARIO_ORDER)
def test_scenario_on_an_in_process_engine_matches_the_simulator(
        name: str, harness: EnginePool, tmp_path: Path) -> None:
    check_scenario_against_simulator(name, harness.get(), tmp_path)


@pytest.fixture
def fleet(engines: dict[str, LaunchedEngine], tmp_path: Path) -> Iterator[Fleet]:
    models = build_models()
    for e in engines.values():  # a scenario that killed its engine: Ray restarts it
        server = ActorServer(e.handle, e.url)
        if not server.is_running():
            server.restart()
    adapters = {n: RayAdapter(e.handle) for n, e in engines.items()}
    for a in adapters.values():
        a.info()
    f = Fleet([(n, a, engines[n].url) for n, a in adapters.items()],
              journal=tmp_path / "fleet.jsonl", min_serving=1, policy=POLICY)
    for n, a in adapters.items():
        a.on_replaced = (lambda name: lambda why: f.report_replaced(name, why))(n)
    for e in engines.values():  # each test starts from a fresh engine on v1
        ray.get(e.handle.release.remote("mutate"))
    boot = f.bootstrap(checkpoint_target(models["v1"], 1, INITIAL_LABEL))
    assert all(o.trigger == "bootstrap_ok" for o in boot.values()), boot
    try:
        yield f
    finally:
        f.close()
        _restore_v1(engines, list(engines))
    assert check_fleet_file(tmp_path / "fleet.jsonl").accepted


def _target(name: str, generation: int) -> Any:
    return checkpoint_target(build_models()[name], generation, f"{name}-gen{generation}")


def _restore_v1(engines: dict[str, LaunchedEngine], names: list[str]) -> None:
    """Put the engines back on v1 under the startup label, caches empty, running (what a
    fresh actor shows), outside any fleet: the next test's fleet bootstraps on that."""
    v1 = checkpoint_target(build_models()["v1"], 1, INITIAL_LABEL)
    for n in names:
        adapter = RayAdapter(engines[n].handle)
        deadline = time.monotonic() + 60
        adapter.pause(PauseMode.ABORT, deadline)
        assert adapter.mutate(v1, deadline).outcome is MutationOutcome.COMPLETED
        for tier in TIERS:
            adapter.reset_cache(tier, deadline)
        assert adapter.resume(deadline).paused_read_back is False


def test_a_verified_update_through_ray_handles(fleet: Fleet,
                                               engines: dict[str, LaunchedEngine]) -> None:
    rep = fleet.update(_target("v2", 2))
    assert rep.published and fleet.committed == 2, rep
    for m in fleet.members.values():
        assert m.controller.phase is Phase.READY and m.controller.control.committed == 2
        state = m.adapter.read_state(time.monotonic() + 30)
        assert state.label == "v2-gen2"
        assert state.identity == _target("v2", 2).identity


def test_an_actor_killed_mid_mutation_is_quarantined_and_readmitted(
        fleet: Fleet, engines: dict[str, LaunchedEngine]) -> None:
    a = engines["a"]
    ray.get(a.handle.hold.remote("mutate"))
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(report=fleet.update(_target("v2", 2))))
    t.start()
    assert wait_until(lambda: ray.get(a.handle.waiting.remote("mutate")) == 1, BOUND)
    old = _kill(a)
    t.join(BOUND)
    rep = result["report"]
    ma, mb = fleet.members["a"], fleet.members["b"]
    assert rep.published and fleet.committed == 2, rep
    assert ma.controller.phase is Phase.TAINTED, ma.controller.phase
    assert mb.controller.phase is Phase.READY and mb.controller.control.committed == 2
    mutate = [s for s in rep.members["a"].steps if s.step == "mutate"]
    assert [str(s.outcome) for s in mutate] == ["mutate_ambiguous"], mutate
    info = _restarted(a, old)
    assert info["reconstructed"] is True
    out = fleet.readmit("a", who="test")
    assert out.trigger == "readmit_ok", out.reason
    print(f"evidence: {mutate[0].reason[:160]}; published on {rep.committed_on}; Ray "
          f"restarted the actor (reconstructed={info['reconstructed']}); {out.reason}")
    assert ma.controller.phase is Phase.READY and ma.controller.control.committed == 2
    assert ma.adapter.read_state(time.monotonic() + 30).identity == _target("v2", 2).identity


def test_a_mutation_that_never_answers_is_ambiguous_within_its_deadline(
        fleet: Fleet, engines: dict[str, LaunchedEngine]) -> None:
    """The actor lives but its load does not answer (held inside the actor, as a hung
    collective would be): the call times out at the mutation's deadline, so the load may
    or may not land: ambiguous, TAINTED within that deadline, fenced; the other member
    publishes. Released, the load does land late: the member stays out until re-admitted."""
    a, target = engines["a"], _target("v2", 2)
    ray.get(a.handle.hold.remote("mutate"))
    try:
        rep = fleet.update(target)
    finally:
        ray.get(a.handle.release.remote("mutate"))
    ra = rep.members["a"]
    mutate = [s for s in ra.steps if s.step == "mutate"]
    assert [str(s.outcome) for s in mutate] == ["mutate_ambiguous"], mutate
    # Whichever notices first at the one deadline: the adapter's Ray call or the runner.
    assert any(why in mutate[0].reason for why in (
        "no answer by the step's deadline", "did not return within")), mutate[0].reason
    deadline = POLICY.mutation_deadline(target)
    assert ra.tainted_after_s is not None and ra.tainted_after_s < deadline + 10.0
    print(f"evidence: {mutate[0].reason}; TAINTED {ra.tainted_after_s:.2f} s after the "
          f"cycle began (mutation deadline {deadline:.2f} s)")
    assert rep.published and rep.committed_on == ["b"] and rep.quarantined == ["a"], rep
    ma = fleet.members["a"]
    assert ma.controller.phase is Phase.TAINTED
    # The load that timed out lands now (it may have: it did), on a fenced engine.
    assert wait_until(lambda: ma.adapter.read_state(time.monotonic() + 30).identity
                      == target.identity, BOUND, interval=0.1)
    assert ma.controller.phase is Phase.TAINTED and "a" not in [
        s.name for s in fleet.status() if s.serving]
    out = fleet.readmit("a", who="test")
    assert out.trigger == "readmit_ok", out.reason


def test_an_actor_killed_between_validation_and_publish(
        fleet: Fleet, engines: dict[str, LaunchedEngine]) -> None:
    a = engines["a"]
    killed: list[str] = []

    def on_step(member: str, step: str, outcome: str, _seconds: float) -> None:
        if member == "a" and outcome == "validate_ok" and not killed:
            killed.append(_kill(a))  # the publish has not happened yet

    fleet.on_step = on_step
    rep = fleet.update(_target("v2", 2))
    fleet.on_step = None
    assert killed, "a never validated"
    ma, mb = fleet.members["a"], fleet.members["b"]
    assert rep.published and rep.committed_on == ["b"] and rep.quarantined == ["a"], rep
    assert ma.controller.phase is Phase.TAINTED
    assert mb.controller.phase is Phase.READY and mb.controller.control.committed == 2
    steps = [(s.step, str(s.outcome), s.reason) for s in rep.members["a"].steps]
    # Every step up to validation verified on the engine that was there; the first step
    # after it that did not succeed is the resume (the actor gone) or the probe (answered
    # by the fresh engine Ray restarted, on its constructor's weights). The fence after it
    # may reach either (how soon Ray restarts the actor is not this test's cause).
    names = [st for st, _o, _r in steps]
    i = names.index("validate")
    assert all(o.endswith("_ok") or st == "drain" for st, o, _r in steps[:i + 1]), steps
    after = steps[i + 1:]
    failed = [(st, o) for st, o, _r in after if not o.endswith("_ok")]
    assert after and after[0][0] == "resume" and failed and failed[0] in (
        ("resume", "resume_failed"), ("probe", "probe_mismatch"), ("probe", "probe_failed")
    ), after
    print("evidence:", [(st, o, r[:90]) for st, o, r in after])
    _restarted(a, killed[0])
    out = fleet.readmit("a", who="test")
    assert out.trigger == "readmit_ok", out.reason
    assert ma.controller.phase is Phase.READY and ma.controller.control.committed == 2


def test_a_restarted_actor_relabelled_as_committed_is_caught_by_identity(
        fleet: Fleet, engines: dict[str, LaunchedEngine]) -> None:
    rep = fleet.update(_target("v2", 2))
    assert rep.published and rep.committed_on == ["a", "b"], rep
    a = engines["a"]
    _restarted(a, _kill(a))
    # Its host relabels the fresh engine with the label it served before (a framework's
    # init setting the trainer's step): only the weights tell it apart.
    assert ray.get(a.handle.set_label.remote("v2-gen2")) == "v2-gen2"
    ma = fleet.members["a"]
    out = fleet.audit(["a"], why="test")["a"]
    assert out.trigger == "audit_mismatch", out.reason
    assert "identity" in out.reason and "label" not in out.reason.split("identity")[0], \
        out.reason
    print(f"evidence: {out.reason}")
    assert ma.controller.phase is Phase.TAINTED
    assert isinstance(ma.adapter, RayAdapter) and ma.adapter.replacements == 1
    out = fleet.readmit("a", who="test")
    assert out.trigger == "readmit_ok", out.reason
    assert ma.adapter.read_state(time.monotonic() + 30).identity == _target("v2", 2).identity


def test_a_framework_actor_adopts_rolloutcore(tmp_path: Path,
                                              engines: dict[str, LaunchedEngine]) -> None:
    """A framework's own async engine actor (shaped like verl's and SkyRL's server actors,
    :mod:`rolloutcore.conformance.framework_actor`) with the adoption mixin: a fleet of
    it alone bootstraps, publishes a verified update through its handle, and the
    framework's own ``generate`` then answers with the new weights' reference."""
    from rolloutcore.adapters.inprocess import ENGINE_ENV
    from rolloutcore.conformance.framework_actor import RolloutCoreFrameworkServer

    models = build_models()
    cls = ray.remote(num_cpus=1, max_concurrency=16,
                     runtime_env={"env_vars": dict(ENGINE_ENV)})(RolloutCoreFrameworkServer)
    actor = cls.remote(str(models["v1"].resolve()))
    try:
        ray.get(actor.launch_server.remote(), timeout=BOUND)
        adapter = RayAdapter(actor)
        f = Fleet([("fw", adapter, "")], journal=tmp_path / "fleet.jsonl", policy=POLICY)
        try:
            boot = f.bootstrap(checkpoint_target(models["v1"], 1, INITIAL_LABEL))
            assert boot["fw"].trigger == "bootstrap_ok", boot
            rep = f.update(_target("v2", 2))
            assert rep.published, [(s.step, s.outcome, s.reason)
                                   for s in rep.members["fw"].steps]
        finally:
            f.close()
        ref = _target("v2", 2)
        tokens = ray.get(actor.generate.remote(list(ref.probe_prompt), 8, "trainer-1"),
                         timeout=BOUND)
        assert tokens == list(ref.probe_tokens[:8])
        assert check_fleet_file(tmp_path / "fleet.jsonl").accepted
    finally:
        ray.kill(actor)


def test_the_placement_group_holds_one_bundle_per_engine(
        engines: dict[str, LaunchedEngine]) -> None:
    """The engines' placement group is :func:`placement_bundles`' (one CPU each here); a
    placement the cluster cannot hold (a GPU per engine on this CPU cluster) is refused
    at once, naming what is missing, and places nothing."""
    from ray.util import placement_group_table

    before = placement_group_table()
    groups = [g for g in before.values() if g["state"] == "CREATED"]
    assert [list(g["bundles"].values()) for g in groups] == [placement_bundles(2)], groups
    with pytest.raises(RuntimeError, match="needs 2 GPU and the Ray cluster has 0"):
        launch(build_models()["v1"], ["x", "y"], gpus_per_engine=1, prefix="never-")
    assert placement_group_table().keys() == before.keys()
    with pytest.raises(ValueError):
        ray.get_actor("never-x", namespace=NAMESPACE)


def test_the_ray_launch_in_two_commands(engines: dict[str, LaunchedEngine],
                                        tmp_path: Path) -> None:
    """``rolloutcore fleet launch --ray`` places an engine actor on the cluster (here this
    module's) and writes the fleet file; ``rolloutcore serve`` drives it through its Ray
    handle: a verified update through the admin API, then a completion through the
    gateway bound to the new generation; the journal checks. ``fleet status`` then reads
    the engine through its actor: the new generation, served, with its identity."""
    models = build_models()
    fleet_file = tmp_path / "fleet.toml"
    address = ray.get_runtime_context().gcs_address
    launched = subprocess.run(
        [sys.executable, "-m", "rolloutcore.cli", "fleet", "launch", "--ray", "--engines", "1",
         "--model", str(models["v1"]), "--out", str(fleet_file), "--address", address,
         "--json"], capture_output=True, text=True, timeout=BOUND)
    assert launched.returncode == 0, launched.stderr[-2000:]
    (engine,) = json.loads(launched.stdout)["engines"]
    assert f'ray = "{engine["actor"]}"' in fleet_file.read_text()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rolloutcore.cli", "serve", "--fleet", str(fleet_file),
         "--port", str(port), "--initial", str(models["v1"]), "--no-watchdog"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def healthy() -> bool:
            assert proc.poll() is None, proc.communicate()
            try:
                return httpx.get(f"{url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(healthy, BOUND, interval=0.1), "serve did not start"
        r = httpx.post(f"{url}/admin/update", timeout=BOUND, json={
            "checkpoint": str(models["v2"]), "label": "v2"})
        assert r.status_code == 200 and r.json()["published"], r.text
        ref = _target("v2", 2)
        c = httpx.post(f"{url}/v1/completions", timeout=BOUND, json={
            "model": "tiny", "prompt": list(ref.probe_prompt), "max_tokens": 8,
            "min_tokens": 8, "temperature": 0.0, "return_token_ids": True})
        assert c.status_code == 200, c.text
        assert c.headers["x-rolloutcore-generation"] == "2"
        assert c.headers["x-rolloutcore-identity"] == ref.identity
        assert c.json()["choices"][0]["token_ids"] == list(ref.probe_tokens[:8])
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=BOUND)
    assert proc.returncode == 0, (out, err[-3000:])
    assert check_fleet_file(fleet_file.with_suffix(".journal.jsonl")).accepted
    status = subprocess.run(
        [sys.executable, "-m", "rolloutcore.cli", "fleet", "status", "--fleet",
         str(fleet_file), "--json"], capture_output=True, text=True, timeout=BOUND)
    assert status.returncode == 0, status.stderr[-2000:]
    (row,) = json.loads(status.stdout)["members"]
    assert row["engine_via"] == "ray" and row["engine_incarnation"], row
    assert (row["committed"], row["serving"]) == (2, True), row
    assert (row["engine_label"], row["engine_identity"], row["engine_paused"]) == (
        "v2", ref.identity, False), row
