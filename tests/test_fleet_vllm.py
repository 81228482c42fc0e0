"""Fleet scenarios on three real vLLM CPU servers (about 2 GiB each), each compared with
its run on a simulated fleet: the members' lifecycle steps must be identical, both
journals must pass the fleet trace checker, and every check must hold on both."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

from rolloutcore.conformance.fleet_scenarios import (  # noqa: E402
    SCENARIOS,
    FleetResult,
    FleetRig,
    run_fleet_scenario,
)
from rolloutcore.conformance.server_pool import ServerPool  # noqa: E402
from rolloutcore.conformance.tiny_model import DEFAULT_OUT, build_models  # noqa: E402

#: The application's own steps interleave with the lifecycle as threads run; the
#: comparison is of the lifecycle.
APPLICATION = frozenset({"admit", "release"})


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory, vllm_pool: ServerPool) -> Iterator[FleetRig]:
    r = FleetRig.vllm(build_models(DEFAULT_OUT), tmp_path_factory.mktemp("fleet-vllm"),
                      pool=vllm_pool)
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def sim_rig(tmp_path_factory: pytest.TempPathFactory) -> FleetRig:
    return FleetRig.sim(tmp_path_factory.mktemp("fleet-sim"))


def lifecycle(r: FleetResult) -> dict[str, list[str]]:
    return {m: [s for s in steps if s not in APPLICATION] for m, steps in
            r.member_steps.items()}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fleet_scenario_on_three_vllm_servers(name: str, rig: FleetRig,
                                              sim_rig: FleetRig) -> None:
    real = run_fleet_scenario(name, rig, printer=print)
    sim = run_fleet_scenario(name, sim_rig)
    print({k: v for k, v in real.evidence.items()})
    assert real.passed, real.failures()
    assert sim.passed, sim.failures()
    assert lifecycle(real) == lifecycle(sim), "real vLLM and the simulated fleet differ"
