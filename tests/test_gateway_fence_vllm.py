"""The engine's gateway fence on a real vLLM CPU server (adapters/gateway_fence.py, loaded
by vLLM's own ``--middleware``): a request stamped by a gateway below its fence is refused
before vLLM sees it, raising the fence ends that gateway's requests still running (one
the paused engine holds: the test's own cause) and answers once none is left; a newer epoch of the
gateway, another gateway, and an unstamped request are served."""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from helpers import wait_until

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

from rolloutcore.adapters.contract import PauseMode  # noqa: E402
from rolloutcore.adapters.gateway_fence import FENCE_PATH, GATEWAY_HEADER, stamp  # noqa: E402
from rolloutcore.adapters.http import HttpAdapter  # noqa: E402
from rolloutcore.conformance.fixtures.server_pool import ServerPool  # noqa: E402
from rolloutcore.conformance.fixtures.vllm_server import VllmServer  # noqa: E402

BODY = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def server(vllm_pool: ServerPool) -> Iterator[VllmServer]:
    with vllm_pool.leased(1) as (srv,):
        yield srv


def _complete(c: httpx.Client, who: str | None) -> httpx.Response:
    headers = {} if who is None else {GATEWAY_HEADER: who}
    return c.post("/v1/completions", json=BODY, headers=headers)


def test_a_fenced_gateway_is_refused_and_its_running_requests_end(server: VllmServer) -> None:
    gw = f"gw-{time.monotonic_ns()}"  # the pooled server may have met other gateways
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert _complete(c, stamp(gw, 1)).status_code == 200
        assert _complete(c, f"{gw};x").status_code == 400

        # A request of epoch 1 is held by the engine (paused, keeping what runs) when the
        # fence rises to 2: it is ended, answered 409 (its answer had not begun), and the
        # fence answers once nothing of epoch 1 runs.
        answers: list[httpx.Response] = []
        with HttpAdapter(server.url) as engine:
            assert engine.pause(PauseMode.KEEP, time.monotonic() + 30).paused_read_back
            try:
                t = threading.Thread(target=lambda: answers.append(
                    _complete(c, stamp(gw, 1))), daemon=True)
                t.start()
                wait_until(lambda: c.get(FENCE_PATH).json()["running"].get(gw) == 1,
                           "the held request runs")
                fenced = c.post(FENCE_PATH, json={"gateway": gw, "epoch": 2}).json()
                assert fenced == {"gateway": gw, "fence": 2, "raised": True, "cancelled": 1,
                                  "running_below": 0}, fenced
                t.join(30)
            finally:
                engine.resume(time.monotonic() + 30)
        assert answers and answers[0].status_code == 409, answers
        assert answers[0].json()["error"]["code"] == "gateway_fenced"
        assert gw not in c.get(FENCE_PATH).json()["running"]

        refused = _complete(c, stamp(gw, 1))
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "gateway_fenced"
        assert _complete(c, stamp(gw, 2)).status_code == 200  # its new lease
        assert _complete(c, stamp(f"{gw}-other", 0)).status_code == 200
        assert _complete(c, None).status_code == 200  # not stamped: not its business
        # A fence never goes down; a bad one is refused with nothing changed.
        assert c.post(FENCE_PATH, json={"gateway": gw, "epoch": 1}).json()["fence"] == 2
        assert c.post(FENCE_PATH, json={"gateway": gw, "epoch": -1}).status_code == 400
        assert c.get(FENCE_PATH).json()["fences"][gw] == 2
