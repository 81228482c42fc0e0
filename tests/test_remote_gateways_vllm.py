"""Remote gateways on a real vLLM CPU server (the reduced run of the multi-gateway
scenarios, tests/test_remote_gateways_sim.py has them all): a gateway of its own admits on
generation 1; partitioned from the leader it is waited for until its lease ends, then the
real server's gateway fence (vLLM's ``--middleware``) refuses its epoch and the update
publishes; healed, it registers anew and admits on generation 2. The joined journals
pass the checker."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from helpers import wait_until

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

import httpx  # noqa: E402

from rolloutcore.adapters.gateway_fence import FENCE_PATH, GATEWAY_HEADER, stamp  # noqa: E402
from rolloutcore.adapters.http import HttpAdapter  # noqa: E402
from rolloutcore.check.gateway_join import check_join  # noqa: E402
from rolloutcore.conformance.fault_proxy import Fault, FaultProxy  # noqa: E402
from rolloutcore.conformance.fixtures.server_pool import ServerPool  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models  # noqa: E402
from rolloutcore.conformance.fixtures.vllm_server import VllmServer  # noqa: E402
from rolloutcore.engine.identity import checkpoint_identity  # noqa: E402
from rolloutcore.engine.targets import checkpoint_target  # noqa: E402
from rolloutcore.fleet import Fleet  # noqa: E402
from rolloutcore.gateway.core import Gateway, GatewayConfig  # noqa: E402
from rolloutcore.gateway.follower import Follower, FollowerConfig, follower_server  # noqa: E402
from rolloutcore.gateway.registry import GatewayRegistry  # noqa: E402
from rolloutcore.gateway.server import AppThread, ServerThread  # noqa: E402

LEASE_S = 3.0  # long enough that a loaded machine never lets a live lease end
BODY = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def server(vllm_pool: ServerPool) -> Iterator[VllmServer]:
    with vllm_pool.leased(1) as (srv,):
        yield srv


def test_a_partitioned_gateway_is_fenced_by_a_real_server(server: VllmServer,
                                                          tmp_path: Path) -> None:
    models = build_models(DEFAULT_OUT)
    journal = tmp_path / "fleet.jsonl"
    fleet = Fleet([("a", HttpAdapter(server.url), server.url)], journal=journal,
                  target_of=checkpoint_target, min_serving=1)
    assert fleet.bootstrap(checkpoint_target(models["v1"], 1, "default"))
    gw = Gateway(fleet, GatewayConfig(model="tiny"), target_of=checkpoint_target)
    registry = GatewayRegistry(fleet, lease_s=LEASE_S)
    held = partial(_holds, registry)
    try:
        with ServerThread(gw, registry=registry) as leader, FaultProxy(leader) as proxy:
            f = Follower(FollowerConfig("g1", proxy.url, tmp_path / "g1.jsonl",
                                        queue_wait_s=0.5))
            with AppThread(follower_server(f)) as url:
                wait_until(partial(held, 1), "g1 holds the member")
                r = httpx.post(f"{url}/v1/completions", json=BODY, timeout=60)
                assert r.status_code == 200, r.text
                assert r.headers["x-rolloutcore-identity"] == checkpoint_identity(models["v1"])
                old_epoch = registry.status()["gateways"]["g1"]["epoch"]
                proxy.add(Fault.drop_before("*", "*", times=None))  # the partition
                report = fleet.update(checkpoint_target(models["v2"], 2, "v2"))
                assert report.published, report
                assert [x["failed"] for x in registry.fences if x["gateway"] == "g1"] == [{}]
                # The real server refuses the expired epoch, serves the stamp-less.
                stale = httpx.post(f"{server.url}/v1/completions", json=BODY, timeout=60,
                                   headers={GATEWAY_HEADER: stamp("g1", old_epoch)})
                assert stale.status_code == 409, stale.text
                assert stale.json()["error"]["code"] == "gateway_fenced"
                assert httpx.get(f"{server.url}{FENCE_PATH}").json()["fences"]["g1"] == \
                    old_epoch + 1
                proxy.clear()
                wait_until(partial(held, 2), "g1 registered anew and holds generation 2")
                r = httpx.post(f"{url}/v1/completions", json=BODY, timeout=60)
                assert r.status_code == 200, r.text
                assert r.headers["x-rolloutcore-generation"] == "2"
                assert r.headers["x-rolloutcore-identity"] == checkpoint_identity(models["v2"])
    finally:
        registry.close()
        gw.close()
    v = check_join(journal, {"g1": tmp_path / "g1.jsonl"})
    assert v.accepted, v.message
    assert v.gateways["g1"]["admitted"] == 2 and v.gateways["g1"]["holds_expired"] == 1


def _holds(registry: GatewayRegistry, generation: int) -> bool:
    g = registry.status()["gateways"].get("g1")
    return g is not None and g["holds"] == ["a"] and all(
        m.controller.control.committed == generation
        for m in registry.fleet.members.values())
