"""The Ray engine actor's lifecycle endpoint without Ray or vLLM: an engine host that
records what reaches the engine stands in for ``AsyncLLM``, and the handle's remote
calls are made directly.

Every call carries its own controller's epoch to the engine: two controllers driving one
actor (a deposed one still sending) never borrow each other's fencing token, so the
engine's gate can refuse the deposed one's load. And the placement group's bundles for
engines (on GPU too) and a trainer. ``fleet status`` reads a Ray-hosted engine through
its actor only."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rolloutcore.adapters.contract import MutationOutcome, WeightTarget
from rolloutcore.adapters.inprocess import EngineHost
from rolloutcore.adapters.ray_engine import LifecycleEndpoint, RayAdapter, placement_bundles


def a_target(tmp_path: Path) -> WeightTarget:
    (tmp_path / "model.safetensors").write_bytes(b"")  # a checkpoint as far as mutate checks
    return WeightTarget(2, "v2", "identity-of-v2", str(tmp_path), (1, 2, 3), (4, 5))


class RecordingHost(EngineHost):
    """Answers as an engine with the worker extension does; records every load's epoch."""

    def __init__(self) -> None:
        self.engine = object()
        self.url = None
        self.interceptor = None
        self._ids = itertools.count()
        self.label = "default"
        self.loads: list[int | None] = []

    def alive(self) -> bool:
        return True

    def call(self, method: str, seconds: float, *args: Any, **kwargs: Any) -> Any:
        if method == "collective_rpc" and args[0] == "rc_fence":
            return [{"accepted": True, "seen": kwargs["kwargs"]["epoch"]}]
        if method == "collective_rpc" and args[0] == "rc_reload_weights":
            self.loads.append(kwargs["kwargs"].get("epoch"))
            return [{"loaded": True, "identity": kwargs["kwargs"]["expected_identity"],
                     "bytes": 8}]
        if method == "update_weight_version":
            self.label = args[0]
            return None
        if method == "get_weight_version":
            return self.label
        raise AssertionError(f"unexpected engine call {method}{args}")


class Handle:
    """A handle whose remote calls run at once (what Ray would run in the actor)."""

    class _Method:
        def __init__(self, fn: Any) -> None:
            self.remote = fn

    def __init__(self, endpoint: LifecycleEndpoint) -> None:
        self.call = self._Method(endpoint.call)
        self.info = self._Method(endpoint.info)


@pytest.fixture
def endpoint() -> LifecycleEndpoint:
    e = LifecycleEndpoint()
    e.attach(RecordingHost())
    return e


def _direct(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RayAdapter, "_get", lambda self, op, ref, deadline: ref)


def test_each_controller_loads_with_its_own_epoch(endpoint: LifecycleEndpoint,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    _direct(monkeypatch)
    target: WeightTarget = a_target(tmp_path)
    old, new = RayAdapter(Handle(endpoint)), RayAdapter(Handle(endpoint))
    assert old.fence_epoch(5, 1e12).accepted and new.fence_epoch(7, 1e12).accepted
    # The new leader's load, then the deposed one's (the engine's gate refuses it: 5 < 7).
    assert new.mutate(target, 1e12).outcome is MutationOutcome.COMPLETED
    assert old.mutate(target, 1e12).outcome is MutationOutcome.COMPLETED
    host = endpoint.host
    assert isinstance(host, RecordingHost)
    assert host.loads == [7, 5]
    assert endpoint.adapter.epoch is None  # the actor remembers nobody's token
    # A controller without a store sends none.
    RayAdapter(Handle(endpoint)).mutate(target, 1e12)
    assert host.loads == [7, 5, None]


def test_an_answer_from_a_new_incarnation_is_reported_once(endpoint: LifecycleEndpoint,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    _direct(monkeypatch)
    seen: list[str] = []
    adapter = RayAdapter(Handle(endpoint), on_replaced=seen.append)
    adapter.info()
    adapter.epoch = 3
    endpoint.attach(RecordingHost())  # the actor's constructor ran again (Ray's restart)
    adapter.info()
    adapter.info()
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(seen) == 1 and "restarted engine actor" in seen[0], seen
    assert adapter.replacements == 1 and adapter.epoch is None


def test_placement_bundles_for_engines_and_a_trainer() -> None:
    assert placement_bundles(2) == [{"CPU": 1.0}, {"CPU": 1.0}]
    # On GPU: one bundle per engine with its tensor-parallel GPUs, then the trainer's.
    assert placement_bundles(2, cpus_per_engine=8, gpus_per_engine=2,
                             trainer={"GPU": 4, "CPU": 16}) == [
        {"CPU": 8.0, "GPU": 2.0}, {"CPU": 8.0, "GPU": 2.0}, {"GPU": 4.0, "CPU": 16.0}]


@pytest.mark.parametrize("kwargs, why", [
    ({"engines": 0}, "engines must be at least 1"),
    ({"engines": 1, "cpus_per_engine": 0}, "cpus per engine must be above 0"),
    ({"engines": 1, "gpus_per_engine": 0.5}, "a whole number"),
    ({"engines": 1, "gpus_per_engine": -1}, "a whole number"),
    ({"engines": 1, "trainer": {}}, "the trainer's bundle"),
    ({"engines": 1, "trainer": {"GPU": 0}}, "the trainer's bundle"),
])
def test_placement_bundles_refuse_sizes_a_group_cannot_hold(kwargs: dict[str, Any],
                                                           why: str) -> None:
    with pytest.raises(ValueError, match=why):
        placement_bundles(**kwargs)


class Listener:
    """A TCP port that accepts and closes every connection, counting them."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _addr = self.sock.accept()
            except OSError:  # closed
                return
            self.accepted += 1
            conn.close()


def test_status_reads_a_ray_engine_through_its_actor_never_over_http(tmp_path: Path) -> None:
    """``fleet status`` reads an engine hosted in Ray the way the controller drives it,
    through its actor. With no Ray cluster at the fleet's address, that engine's row says
    so, and its HTTP URL is never tried in its place. The HTTP member beside it is read at
    its URL."""
    pytest.importorskip("ray")
    refusing = socket.socket()  # bound, not listening: a Ray address that refuses
    refusing.bind(("127.0.0.1", 0))
    ray_address = f"127.0.0.1:{refusing.getsockname()[1]}"
    in_ray, over_http = Listener(), Listener()
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(f'[ray]\naddress = "{ray_address}"\nnamespace = "rolloutcore"\n\n'
                     f'[[engine]]\nname = "a"\nurl = "{in_ray.url}"\nray = "engine-a"\n\n'
                     f'[[engine]]\nname = "b"\nurl = "{over_http.url}"\n')
    try:
        out = subprocess.run([sys.executable, "-m", "rolloutcore.cli", "fleet", "status",
                              "--fleet", str(fleet), "--json"],
                             capture_output=True, text=True, timeout=60)
    finally:
        refusing.close()
        in_ray.sock.close()
        over_http.sock.close()
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)["members"]}
    assert rows["a"]["engine_via"] == "ray"
    assert rows["a"]["engine_error"].startswith(f"no Ray cluster at {ray_address}"), rows["a"]
    assert in_ray.accepted == 0
    assert rows["b"]["engine_via"] == "http" and "engine_error" in rows["b"], rows["b"]
    assert over_http.accepted >= 1
