"""The vLLM server pool's own bookkeeping (no vLLM: its servers are stand-ins): an idle
server whose process died meanwhile is never handed out (its port may belong to another
process by then, as an etcd a later test started did in a CI run); a fresh one is."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from rolloutcore.conformance.fixtures import server_pool
from rolloutcore.engine.identity import write_safetensors

#: With the real-server tests: the pool's server arguments import vLLM's transfer backends
#: (seconds of imports that process has already paid), though no server starts here.
pytestmark = pytest.mark.vllm


class StandIn:
    def __init__(self, *_args: Any, log_path: Path | None = None, **_kw: Any) -> None:
        self.log_path = log_path
        self.running = False
        self.stopped = False

    def start(self) -> None:
        self.running = True

    def is_running(self) -> bool:
        return self.running

    def stop(self) -> None:
        self.running, self.stopped = False, True


def test_an_idle_server_that_died_is_discarded_not_leased(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_pool, "VllmServer", StandIn)
    (tmp_path / "v1").mkdir()
    write_safetensors(tmp_path / "v1" / "model.safetensors",
                      [("w", "F32", (1,), struct.pack("<f", 1.0))])
    pool = server_pool.ServerPool({"v1": tmp_path / "v1"}, tmp_path / "work")
    dead, alive = StandIn(log_path=tmp_path / "dead.log"), StandIn(log_path=tmp_path / "a")
    alive.start()
    pool._idle = [dead, alive]  # type: ignore[list-item]
    got: list[Any] = pool.lease(2)
    assert got[0] is alive and got[1] not in (dead, alive) and got[1].running
    assert dead.stopped and (str(dead.log_path), "died while idle") in pool.discarded
    assert (pool.reused, pool.started) == (1, 1)
