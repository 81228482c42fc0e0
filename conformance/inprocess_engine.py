"""The conformance harness on an in-process vLLM engine hosted in a Ray actor
(:mod:`rolloutcore.adapters.ray_engine`): the runner drives it through its Ray handle
(:class:`~rolloutcore.adapters.ray_engine.RayAdapter`, the in-process adapter running
inside the actor), the harness reads and arranges it through the OpenAI routes the
actor serves on the same engine, as it does a server.

Controlled causes cannot sit on a wire here: :class:`EngineFaults` is the fault proxy's
twin inside the engine's host, an interceptor of the in-process engine's calls
(:attr:`~rolloutcore.adapters.inprocess.InProcessEngine.interceptor`), with the same
kinds and the same meaning (:data:`~rolloutcore.conformance.engines.INJECTABLE`): a
500 is an engine call that raises before it runs, ``drop`` one that ran and whose answer
is lost, ``late`` one that answers after the caller's deadline, ``refuse`` one lost
before it ran (the caller cannot tell), ``hang`` one that never runs.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.conformance.engines import VllmHarnessEngine

#: Adapter operations (the harness's names, as ``engines.WIRE_OPS``) and the engine calls
#: a fault on each strikes: (``AsyncLLM`` method, a marker its call must carry: the
#: ``collective_rpc`` method's name, or the request id of a generation).
ENGINE_OPS: dict[str, tuple[tuple[str, str | None], ...]] = {
    "pause": (("pause_generation", None),),
    "resume": (("resume_generation", None),),
    "reset_prefix": (("reset_prefix_cache", None),),
    "reset_encoder": (("reset_encoder_cache", None),),
    "reset_mm": (("reset_mm_cache", None),),
    "read_state": (("get_weight_version", None),),
    "probe": (("generate", "probe"),),
    "mutate": (("collective_rpc", "reload_weights"),),
    "fence": (("pause_generation", None), ("update_weight_version", None)),
}


@dataclass
class Rule:
    method: str
    marker: str | None
    kind: str
    times: int | None  # None: every call


@dataclass
class EngineFaults:
    """The interceptor: the first rule that matches a call (and has times left) names its
    fault. It travels to the actor by value, so its counts are the actor's."""

    rules: list[Rule] = field(default_factory=list)

    def add(self, op: str, kind: str, times: int | None) -> None:
        for method, marker in ENGINE_OPS[op]:
            self.rules.append(Rule(method, marker, kind, times))

    def __call__(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
                 ) -> str | None:
        for r in self.rules:
            if r.method != method or r.times == 0:
                continue
            if r.marker is not None:
                carried = str(args[0]) if method == "collective_rpc" else (
                    str(args[2]) if len(args) > 2 else "")
                if r.marker not in carried:
                    continue
            if r.times is not None:
                r.times -= 1
            return r.kind
        return None


class ActorServer:
    """An engine actor as the harness sees a server: its URL, its process, a restart
    (Ray's: the actor's process killed, its constructor run again)."""

    served_model_name = "tiny"

    def __init__(self, handle: Any, url: str) -> None:
        self.handle = handle
        self.url = url
        self.info = self._info(300.0)

    def _info(self, timeout: float) -> dict[str, Any]:
        import ray

        out: dict[str, Any] = ray.get(self.handle.info.remote(), timeout=timeout)
        return out

    @property
    def pid(self) -> int:
        return int(self.info["pid"])

    def is_running(self) -> bool:
        import ray

        try:
            self.info = self._info(10.0)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False
        return bool(self.info["alive"])

    def restart(self, timeout: float = 300.0) -> None:
        """SIGKILL the actor's process and wait for Ray's restart (a new incarnation)."""
        import ray

        old = self.info["incarnation"]
        os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.info = self._info(10.0)
                if self.info["incarnation"] != old and self.info["alive"]:
                    return
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the engine actor was not restarted within {timeout:.0f} s")

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:  # the launcher owns the actor
        pass


class InProcessHarnessEngine(VllmHarnessEngine):
    """The harness engine of an in-process vLLM engine in a Ray actor (kind ``vllm``: the
    same real engine, so the same plan of realisable classes). The runner's adapter is
    the actor's :class:`~rolloutcore.adapters.ray_engine.RayAdapter`; faults and armed
    mutations are set inside the actor."""

    def __init__(self, handle: Any, url: str, models: Mapping[str, Path], *,
                 work_dir: Path) -> None:
        from rolloutcore.adapters.ray_engine import RayAdapter

        server = ActorServer(handle, url)
        if not server.is_running():  # a previous run killed its engine: Ray restarts it
            server.restart()
        super().__init__(server, models, work_dir=work_dir)
        self.handle = handle
        self.ray_adapter = RayAdapter(handle)
        self.ray_adapter.info()
        self.adapter = self.ray_adapter
        self.faults = EngineFaults()

    def _remote(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self.handle, method).remote(*args), timeout=60.0)

    def inject(self, op: str, fault: str, *, times: int | None = 1) -> None:
        self.faults.add(op, fault, times)
        self._remote("set_interceptor", self.faults)

    def clear_faults(self) -> None:
        self.faults = EngineFaults()
        self._remote("set_interceptor", None)

    def _mutation_method(self, method: str) -> None:
        self._remote("set_mutation_method", method)

    def arm_refused_mutation(self, target: WeightTarget) -> WeightTarget:
        self._mutation_method("rc_reload_weights")  # refuses the broken manifest
        return self._broken_target(target)

    def arm_failing_mutation(self, target: WeightTarget) -> WeightTarget:
        self._mutation_method("reload_weights")  # vLLM's own: dies halfway
        return self._broken_target(target)

    def arm_wrong_checkpoint(self, target: WeightTarget, installs: str) -> WeightTarget:
        from dataclasses import replace

        self._mutation_method("reload_weights")  # installs whatever it is pointed at
        return replace(target, source=str(self.models[installs]))

    def disarm(self) -> None:
        self._mutation_method("rc_reload_weights")

    def restart_process(self, initial: str = "v1") -> None:
        self.clear_faults()
        assert isinstance(self.server, ActorServer)
        self.server.restart()
        self.ray_adapter.info()
        if initial != "v1":
            self._reload(self.models[initial])

    def close(self) -> None:
        self.proxy.stop()
        self.http.close()
        self.direct.close()


__all__ = ["ENGINE_OPS", "ActorServer", "EngineFaults", "InProcessHarnessEngine"]
