"""What the conformance harness drives: one engine interface, implemented over the real
vLLM server (:class:`VllmHarnessEngine`: a
:class:`~rolloutcore.conformance.fixtures.vllm_server.VllmServer` plus the
:class:`~rolloutcore.adapters.http.HttpAdapter`) and over the simulator
(:class:`SimHarnessEngine`: :class:`~rolloutcore.adapters.sim.SimEngine` plus
:class:`~rolloutcore.adapters.sim.SimAdapter`).

A scenario needs more of an engine than the adapter contract: a mutation outside
RolloutCore, the prefix hit counter, the server PID, a naive resume after a failed load.
:class:`HarnessEngine` names those needs once; :class:`RecordingAdapter` records every
adapter call a scenario's runner makes (operation, latency, evidence).
"""

from __future__ import annotations

import abc
import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rolloutcore.adapters.contract import (
    EngineReport,
    FenceEvidence,
    GenerationResult,
    LifecycleAdapter,
    MutationEvidence,
    PauseEvidence,
    PauseMode,
    ProbeEvidence,
    ResetEvidence,
    ResumeEvidence,
    WeightTarget,
)
from rolloutcore.engine.targets import checkpoint_target

INITIAL_LABEL = "default"  # what a freshly started vLLM (and SimEngine) reports
PROMPTS = ("probe", "rollout")  # probe: cacheable (> 2 prefix blocks); rollout: long output

# ------------------------------------------------------------------ recording adapter


@dataclass
class OpRecord:
    op: str
    seconds: float
    evidence: Any  # the evidence object, or the exception raised


class RecordingAdapter:
    """Delegates to an adapter and records every call: op, latency, evidence."""

    def __init__(self, inner: LifecycleAdapter) -> None:
        self.inner = inner
        self.calls: list[OpRecord] = []
        self._lock = threading.Lock()

    def _rec(self, op: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            out = fn()
        except Exception as e:
            with self._lock:
                self.calls.append(OpRecord(op, time.perf_counter() - t0, e))
            raise
        with self._lock:
            self.calls.append(OpRecord(op, time.perf_counter() - t0, out))
        return out

    def read_state(self, deadline: float) -> EngineReport:
        out: EngineReport = self._rec("read_state", lambda: self.inner.read_state(deadline))
        return out

    def pause(self, mode: PauseMode, deadline: float) -> PauseEvidence:
        out: PauseEvidence = self._rec("pause", lambda: self.inner.pause(mode, deadline))
        return out

    def resume(self, deadline: float) -> ResumeEvidence:
        out: ResumeEvidence = self._rec("resume", lambda: self.inner.resume(deadline))
        return out

    def mutate(self, target: WeightTarget, deadline: float) -> MutationEvidence:
        out: MutationEvidence = self._rec("mutate", lambda: self.inner.mutate(target, deadline))
        return out

    def reset_cache(self, tier: str, deadline: float) -> ResetEvidence:
        out: ResetEvidence = self._rec(f"reset_{tier}",
                                       lambda: self.inner.reset_cache(tier, deadline))
        return out

    def probe(self, prompt: tuple[int, ...], max_tokens: int, deadline: float, *,
              scored: bool = False) -> ProbeEvidence:
        out: ProbeEvidence = self._rec("probe", lambda: self.inner.probe(
            prompt, max_tokens, deadline, scored=scored))
        return out

    def fence(self, label: str, deadline: float) -> FenceEvidence:
        out: FenceEvidence = self._rec("fence", lambda: self.inner.fence(label, deadline))
        return out

    def generate(self, prompt: tuple[int, ...], max_tokens: int) -> GenerationResult:
        out: GenerationResult = self._rec("generate",
                                          lambda: self.inner.generate(prompt, max_tokens))
        return out

    def of(self, op: str) -> list[OpRecord]:
        with self._lock:
            return [c for c in self.calls if c.op == op]


# ------------------------------------------------------------------------- engines


class HarnessEngine(abc.ABC):
    """What scenarios need of an engine, beyond the adapter contract."""

    kind: str
    adapter: LifecycleAdapter
    initial_label: str = INITIAL_LABEL  # what the engine reports before any update
    probe_tokens: int  # greedy tokens of the probe prompt (the targets' probe)
    rollout_tokens: int  # tokens of a long rollout

    @abc.abstractmethod
    def target(self, generation: int, version: str, *, label: str | None = None) -> (
        WeightTarget):
        """A WeightTarget installing checkpoint ``version`` (v1, v2, v1neg) as
        ``generation``; its probe is the cacheable probe prompt."""

    def initial_target(self) -> WeightTarget:
        return self.target(1, "v1", label=self.initial_label)

    @abc.abstractmethod
    def prompt(self, name: str) -> tuple[int, ...]:
        """``probe`` (spans several prefix-cache blocks) or ``rollout``."""

    def max_tokens(self, name: str) -> int:
        return self.probe_tokens if name == "probe" else self.rollout_tokens

    @abc.abstractmethod
    def reference(self, version: str, name: str) -> tuple[int, ...]:
        """Greedy reference output of checkpoint ``version`` for prompt ``name``."""

    @abc.abstractmethod
    def raw_generate(self, prompt: tuple[int, ...], max_tokens: int) -> GenerationResult:
        """A request outside RolloutCore (no admission): orphans, negative controls."""

    @abc.abstractmethod
    def prefix_hits(self) -> int:
        """The engine's cumulative prefix-cache hit counter (tokens)."""

    @abc.abstractmethod
    def running_requests(self) -> int:
        ...

    @abc.abstractmethod
    def generated_tokens(self) -> int:
        """Tokens generated so far, cumulative over every request (a test waits on its
        progress, never on the machine's speed)."""

    @abc.abstractmethod
    def pid(self) -> int:
        """The serving process (constant while the same server serves)."""

    @abc.abstractmethod
    def identity(self) -> str | None:
        """The identity of the weights the engine holds, as the engine reports it."""

    @abc.abstractmethod
    def label(self) -> str | None:
        ...

    @abc.abstractmethod
    def mutate_outside(self, version: str) -> None:
        """Load ``version`` in place outside RolloutCore: no pause, no invalidation,
        label untouched (what a naive updater does)."""

    @abc.abstractmethod
    def relabel_outside(self, label: str) -> None:
        """Set the engine's version label outside RolloutCore (a launcher's
        ``--weight-version``, an operator)."""

    @abc.abstractmethod
    def pause_raw(self, mode: PauseMode) -> None:
        ...

    @abc.abstractmethod
    def resume_raw(self) -> None:
        ...

    @abc.abstractmethod
    def is_paused_raw(self) -> bool:
        ...

    @abc.abstractmethod
    def arm_refused_mutation(self, target: WeightTarget) -> WeightTarget:
        """A variant of ``target`` whose mutation is refused with proof of no effect."""

    @abc.abstractmethod
    def arm_failing_mutation(self, target: WeightTarget) -> WeightTarget:
        """A variant of ``target`` whose mutation dies halfway through the load."""

    @abc.abstractmethod
    def arm_wrong_checkpoint(self, target: WeightTarget, installs: str) -> WeightTarget:
        """``target`` unchanged in what it declares (label, identity, probe), but its
        mutation installs checkpoint ``installs`` and reports success."""

    @abc.abstractmethod
    def naive_resume(self) -> dict[str, Any]:
        """Resume and generate as if a failed load had not happened; what was seen
        (``died``: the engine died; ``tokens``: what it served)."""

    @abc.abstractmethod
    def inject(self, op: str, fault: str, *, times: int | None = 1) -> None:
        """Make the next ``times`` (None: every) call of adapter operation ``op`` meet
        ``fault``, a controlled cause from :data:`INJECTABLE` (the real server: through
        the fault proxy in front of it)."""

    @abc.abstractmethod
    def clear_faults(self) -> None:
        """Drop pending faults and let go of anything they hold."""

    @abc.abstractmethod
    def restart_process(self, initial: str = "v1") -> None:
        """Replace the engine's process by a fresh one on checkpoint ``initial`` (outside
        RolloutCore): same address, new process, startup label."""

    def replace_out_of_band(self, initial: str) -> None:
        """What a replaced process looks like to RolloutCore (checkpoint ``initial``, the
        startup label, empty caches, running, nothing in flight), made outside it."""
        self.restart_process(initial)

    @abc.abstractmethod
    def alive(self) -> bool:
        ...

    @abc.abstractmethod
    def restore(self, initial: str = "v1") -> None:
        """Back to a freshly started engine's state (checkpoint ``initial``, the startup
        label, clean prefix cache, running): a test fixture step, outside RolloutCore."""

    def disarm(self) -> None:  # noqa: B027 - engines without armed mutations
        """Mutations install what their target declares again (undo ``arm_*``)."""

    def kill(self) -> None:
        """SIGKILL the engine's process: every call is refused from now on (undone by
        :meth:`restart_process`)."""
        raise NotImplementedError(f"{self.kind}: this engine cannot be killed here")

    @abc.abstractmethod
    def freeze(self) -> None:
        """The engine stops answering anything (a SIGSTOP, a GC pause, a hung driver);
        connections stay open. Undone by :meth:`thaw`."""

    @abc.abstractmethod
    def thaw(self) -> None:
        ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the engine owns (stop a server it started)."""


#: Controlled causes a scenario can inject into one adapter operation, the same on both
#: engines: what the adapter sees, and whether the engine carried the operation out.
INJECTABLE: dict[str, str] = {
    "late": "the engine does it; the reply is held past the step's deadline",
    "hang": "held before it reaches the engine, past the step's deadline",
    "drop": "the engine does it; the connection drops before the reply",
    "refuse": "the connection drops before the request reaches the engine",
    "http_500": "answered 500 before the request reaches the engine",
    "empty_body": "the engine does it; the reply comes back with an empty body",
    "fail_body": 'the engine does it; the reply says {"success": false}',
}
Wire = tuple[str, str, str | None]  # (method, path, body marker)
#: Adapter operations and the requests on the wire a fault on each one strikes (the fence
#: pauses and relabels: a fault on it strikes both, so that nothing of it happens; pause
#: and resume go through either route of ``HttpAdapter.pause_route``).
WIRE_OPS: dict[str, tuple[Wire, ...]] = {
    "pause": (("POST", "/pause", None), ("POST", "/sleep", None)),
    "resume": (("POST", "/resume", None), ("POST", "/wake_up", None)),
    "reset_prefix": (("POST", "/reset_prefix_cache", None),),
    "reset_encoder": (("POST", "/reset_encoder_cache", None),),
    "reset_mm": (("POST", "/reset_mm_cache", None),),
    "read_state": (("GET", "/weight_info", None),),
    "probe": (("POST", "/v1/completions", "rolloutcore:probe"),),
    "mutate": (("POST", "/collective_rpc", "reload_weights"),),
    "fence": (("POST", "/pause", None), ("POST", "/sleep", None),
              ("POST", "/update_weight_version", None)),
}


# ---- simulator


SIM_PROMPTS = {"probe": (7, 1, 4, 9, 2, 8, 5, 3, 6), "rollout": (3, 1, 4)}


class SimHarnessEngine(HarnessEngine):
    """The lead's simulator; ``token_seconds`` paces generation so that drains and
    in-flight pauses take real time."""

    kind = "sim"

    def __init__(self, *, token_seconds: float = 0.002, probe_tokens: int = 16,
                 rollout_tokens: int = 256) -> None:
        from rolloutcore.adapters import sim

        self._sim = sim
        self.token_seconds = token_seconds
        self.probe_tokens = probe_tokens
        self.rollout_tokens = rollout_tokens
        self._fresh()

    def _fresh(self, initial: str = "v1") -> None:
        self.engine = self._sim.SimEngine(initial, token_seconds=self.token_seconds,
                                          label=INITIAL_LABEL)
        self.sim_adapter = self._sim.SimAdapter(self.engine)
        self.adapter = self.sim_adapter

    def target(self, generation: int, version: str, *, label: str | None = None) -> (
        WeightTarget):
        return self._sim.sim_target(generation, version, probe_prompt=SIM_PROMPTS["probe"],
                                    probe_len=self.probe_tokens,
                                    label=label or f"{version}-gen{generation}")

    def prompt(self, name: str) -> tuple[int, ...]:
        return SIM_PROMPTS[name]

    def reference(self, version: str, name: str) -> tuple[int, ...]:
        return self._sim.reference_tokens(version, SIM_PROMPTS[name], self.max_tokens(name))

    def raw_generate(self, prompt: tuple[int, ...], max_tokens: int) -> GenerationResult:
        try:
            return self.engine.generate(prompt, max_tokens)
        except self._sim.EngineDead as e:
            raise EngineDied(str(e)) from e

    def prefix_hits(self) -> int:
        return self.engine.prefix_hits

    def running_requests(self) -> int:
        return len(self.engine.running)

    def generated_tokens(self) -> int:
        return self.engine.generated

    def pid(self) -> int:
        return id(self.engine)

    def identity(self) -> str | None:
        return self.engine.identity_reads_as

    def label(self) -> str | None:
        return self.engine.label

    def mutate_outside(self, version: str) -> None:
        self.engine.load(version)

    def relabel_outside(self, label: str) -> None:
        self.engine.label = label

    def pause_raw(self, mode: PauseMode) -> None:
        self.engine.pause(mode)

    def resume_raw(self) -> None:
        self.engine.resume()

    def is_paused_raw(self) -> bool:
        return self.engine.paused

    def arm_refused_mutation(self, target: WeightTarget) -> WeightTarget:
        self.sim_adapter.faults.faults.setdefault("mutate", []).append("refuse")
        return target

    def arm_failing_mutation(self, target: WeightTarget) -> WeightTarget:
        self.sim_adapter.faults.faults.setdefault("mutate", []).append("die_halfway")
        return target

    def arm_wrong_checkpoint(self, target: WeightTarget, installs: str) -> WeightTarget:
        from dataclasses import replace

        return replace(target, source=installs)  # the sim installs what `source` names

    def naive_resume(self) -> dict[str, Any]:
        self.engine.resume()
        try:
            out = self.engine.generate(SIM_PROMPTS["probe"], self.probe_tokens)
        except self._sim.EngineDead as e:
            return {"died": True, "error": str(e), "tokens": None}
        return {"died": self.engine.dead, "error": None, "tokens": list(out.tokens)}

    def alive(self) -> bool:
        return not self.engine.dead

    _SIM_KINDS: ClassVar[dict[str, str]] = {
        "late": "late", "hang": "hang", "drop": "drop", "refuse": "connection_error",
        "http_500": "http_500", "empty_body": "empty_body", "fail_body": "fail_body"}

    def inject(self, op: str, fault: str, *, times: int | None = 1) -> None:
        kind = self._SIM_KINDS[fault]
        self.sim_adapter.faults.add(op, kind, times)

    def clear_faults(self) -> None:
        self.sim_adapter.faults.faults.clear()
        self.sim_adapter.faults.sticky.clear()
        self.sim_adapter.release_hangs()

    def restore(self, initial: str = "v1") -> None:
        self.sim_adapter.release_hangs()
        self._fresh(initial)

    def restart_process(self, initial: str = "v1") -> None:
        """A new engine process on checkpoint ``initial`` (the adapter object stays, as a
        client's would; it now talks to the new engine)."""
        self.engine = self._sim.SimEngine(initial, token_seconds=self.token_seconds,
                                          label=INITIAL_LABEL)
        self.sim_adapter.reconnect(self.engine)

    def kill(self) -> None:
        self.sim_adapter.kill_process()

    def freeze(self) -> None:
        for op in self._sim.OPS:
            self.sim_adapter.faults.add(op, "hang", None)

    def thaw(self) -> None:
        self.clear_faults()

    def inject_sim(self, op: str, kind: str) -> None:
        """A simulator-only fault (a buggy adapter's or loader's behaviour that the real
        engine cannot be made to show without patching it): ``unlabelled``, ``broken``."""
        self.sim_adapter.faults.add(op, kind, 1)


class EngineDied(RuntimeError):
    """The engine is gone (its process exited, or the simulated core died)."""


# ---- real vLLM


PROBE_NAMES = {"probe": "long", "rollout": "short_rollout256"}  # in references.json


class VllmHarnessEngine(HarnessEngine):
    """A real vLLM CPU server (started with the worker extension) and the HTTP adapter.

    ``server`` is a started :class:`VllmServer`; with ``own_server`` it is stopped by
    :meth:`close`, with ``release`` handed to it instead (a server pool's give-back).
    ``work_dir`` holds the broken checkpoint of the failed-load scenario.
    """

    kind = "vllm"

    def __init__(self, server: Any, models: Mapping[str, Path], *, work_dir: Path,
                 own_server: bool = False, token: str | None = None,
                 release: Callable[[Any], None] | None = None) -> None:
        from rolloutcore.adapters.http import HttpAdapter
        from rolloutcore.conformance.fault_proxy import FaultProxy
        from rolloutcore.conformance.fixtures.tiny_model import (
            LONG_ROLLOUT_TOKENS,
            SHORT_MAX_TOKENS,
        )

        self.server = server
        self.models = {k: Path(v).resolve() for k, v in models.items()}
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.own_server = own_server
        self.release = release
        # The runner's adapter talks through a fault proxy (controlled causes); the
        # harness's own reads and raw operations go straight to the server.
        self.proxy = FaultProxy(server.url).start()
        self.http = HttpAdapter(self.proxy.url, model=server.served_model_name, token=token)
        self.direct = HttpAdapter(server.url, model=server.served_model_name, token=token,
                                  allow_insecure_remote=True)
        self.adapter = self.http
        self.probe_tokens = SHORT_MAX_TOKENS
        self.rollout_tokens = LONG_ROLLOUT_TOKENS
        self._refs: dict[str, dict[str, Any]] = {}
        self._identity: dict[str, str] = {}

    @classmethod
    def start(cls, models: Mapping[str, Path], work_dir: Path, *, initial: str = "v1",
              server_args: list[str] | None = None) -> VllmHarnessEngine:
        """Start a server on ``models[initial]`` with the worker extension (or
        ``server_args``: e.g. a weight-transfer backend's)."""
        from rolloutcore.adapters.vllm_worker import SERVER_ARGS
        from rolloutcore.conformance.fixtures.vllm_server import VllmServer

        work_dir.mkdir(parents=True, exist_ok=True)
        srv = VllmServer(Path(models[initial]).resolve(),
                         extra_args=list(SERVER_ARGS if server_args is None else server_args),
                         log_path=work_dir / f"vllm-{time.monotonic_ns()}.log")
        srv.start()
        return cls(srv, models, work_dir=work_dir, own_server=True)

    @classmethod
    def leased(cls, pool: Any, models: Mapping[str, Path], work_dir: Path) -> (
            VllmHarnessEngine):
        """An engine on a server leased from ``pool`` (a :class:`~rolloutcore.conformance.
        server_pool.ServerPool`), given back when the engine is closed."""
        return cls(pool.lease(1)[0], models, work_dir=work_dir, release=pool.release)

    def restart_process(self, initial: str = "v1") -> None:
        """The server process is replaced (an operator, a supervisor): a new PID on
        checkpoint ``initial``, the startup label; nothing RolloutCore did survives."""
        self.clear_faults()
        self.disarm()
        self.server.restart(self.models[initial])

    def replace_out_of_band(self, initial: str) -> None:
        """The state a fresh process on ``initial`` shows (weights, startup label, empty
        prefix cache, running), installed in place: a real restart takes a minute, and a
        server someone else runs (``--url``) cannot be restarted at all. The fleet
        scenarios restart real processes."""
        self.restore(initial)

    @classmethod
    def attach(cls, server: Any, models: Mapping[str, Path], work_dir: Path, *,
               token: str | None = None) -> VllmHarnessEngine:
        """A server someone else started (see :mod:`rolloutcore.conformance.remote`): its
        current label is its startup label, restored after every run."""
        work_dir.mkdir(parents=True, exist_ok=True)
        engine = cls(server, models, work_dir=work_dir, token=token)
        engine.initial_label = engine.direct.read_label()
        return engine

    # ---- references and targets

    def _ref(self, version: str) -> dict[str, Any]:
        if version not in self._refs:
            from rolloutcore.engine.targets import load_references

            self._refs[version] = load_references(self.models[version])
        return self._refs[version]

    def _probe_entry(self, version: str, name: str) -> dict[str, Any]:
        probe_name = PROBE_NAMES[name]
        for p in self._ref(version)["probes"]:
            if p["name"] == probe_name:
                return dict(p)
        raise KeyError(f"{version} has no {probe_name} probe")

    def checkpoint_identity(self, version: str) -> str:
        if version not in self._identity:
            from rolloutcore.engine.identity import checkpoint_identity

            self._identity[version] = checkpoint_identity(self.models[version])
        return self._identity[version]

    def target(self, generation: int, version: str, *, label: str | None = None) -> (
        WeightTarget):
        return checkpoint_target(self.models[version], generation,
                                 label or f"{version}-gen{generation}",
                                 identity=self.checkpoint_identity(version))

    def prompt(self, name: str) -> tuple[int, ...]:
        return tuple(self._probe_entry("v1", name)["prompt_token_ids"])

    def reference(self, version: str, name: str) -> tuple[int, ...]:
        return tuple(self._probe_entry(version, name)["output_token_ids"])

    # ---- engine operations

    def raw_generate(self, prompt: tuple[int, ...], max_tokens: int) -> GenerationResult:
        from rolloutcore.adapters.contract import AdapterError

        try:
            return self.direct.generate(prompt, max_tokens)
        except AdapterError as e:
            if not self.server.is_running():
                raise EngineDied(str(e)) from e
            raise

    def prefix_hits(self) -> int:
        return self.direct.prefix_counters()[1]

    def running_requests(self) -> int:
        return self.direct.running_requests() or 0

    def generated_tokens(self) -> int:
        return self.direct.generated_tokens()

    def pid(self) -> int:
        pid: int = self.server.pid
        return pid

    def identity(self) -> str | None:
        from rolloutcore.adapters.contract import AdapterError

        try:
            return self.direct.read_identity()
        except AdapterError:
            return None

    def label(self) -> str | None:
        return self.direct.read_label()

    def _reload(self, path: Path) -> None:
        r = self.direct.rpc("rc_reload_weights", op="harness_reload", idempotent=False,
                          weights_path=str(path))
        results = r.body.get("results") if isinstance(r.body, dict) else None
        if r.status != 200 or not results or results[0].get("loaded") is not True:
            raise RuntimeError(f"harness reload of {path} failed: {r.status} {r.text[:300]}")

    def mutate_outside(self, version: str) -> None:
        self._reload(self.models[version])

    def relabel_outside(self, label: str) -> None:
        r = self.direct.request("POST", "/update_weight_version", op="harness_label",
                                idempotent=True, json_body={"new_version": label})
        if r.status != 200:
            raise RuntimeError(f"relabel: HTTP {r.status} {r.text[:200]}")

    def pause_raw(self, mode: PauseMode) -> None:
        r = self.direct.request("POST", "/pause", op="pause_raw", idempotent=True,
                              timeout=120.0, params={"mode": mode.value,
                                                     "clear_cache": "false"})
        if r.status != 200:
            raise RuntimeError(f"pause {mode.value}: HTTP {r.status} {r.text[:200]}")

    def resume_raw(self) -> None:
        r = self.direct.request("POST", "/resume", op="resume_raw", idempotent=True)
        if r.status != 200:
            raise RuntimeError(f"resume: HTTP {r.status} {r.text[:200]}")

    def is_paused_raw(self) -> bool:
        return self.direct.read_paused()

    def broken_checkpoint(self) -> Path:
        """v2 with one layer-1 tensor a column short: same names, a different shape. vLLM's
        in-place reload loads layer 0 and dies in layer 1 (observed with other shapes)."""
        from rolloutcore.engine.identity import (
            checkpoint_entries,
            iter_tensor_bytes,
            write_safetensors,
        )

        out = self.work_dir / "broken_v2"
        if (out / "model.safetensors").exists():
            return out
        out.mkdir(parents=True, exist_ok=True)
        src = self.models["v2"]
        for f in src.iterdir():
            if f.is_file() and f.suffix != ".safetensors":
                shutil.copy2(f, out / f.name)
        # The text model's layer-1 tensor (a multimodal model nests it: language_model.*).
        victim = min((e.name for e in checkpoint_entries(src)
                      if e.name.endswith("model.layers.1.mlp.down_proj.weight")), key=len)
        tensors: list[tuple[str, str, list[int], bytes]] = []
        for e, data in iter_tensor_bytes(checkpoint_entries(src)):
            if e.name == victim:
                rows, cols = e.shape
                item = e.nbytes // (rows * cols)
                data = b"".join(data[r * cols * item:(r * cols + cols - 1) * item]
                                for r in range(rows))
                tensors.append((e.name, e.dtype, [rows, cols - 1], data))
            else:
                tensors.append((e.name, e.dtype, list(e.shape), data))
        write_safetensors(out / "model.safetensors", tensors)
        return out

    def _broken_target(self, target: WeightTarget) -> WeightTarget:
        from dataclasses import replace

        return replace(target, source=str(self.broken_checkpoint()))

    def arm_refused_mutation(self, target: WeightTarget) -> WeightTarget:
        # The worker extension checks the manifest before touching the model: refused.
        self.http.mutation_method = "rc_reload_weights"
        return self._broken_target(target)

    def arm_failing_mutation(self, target: WeightTarget) -> WeightTarget:
        # vLLM's own reload_weights has no such check: it dies halfway.
        self.http.mutation_method = "reload_weights"
        return self._broken_target(target)

    def arm_wrong_checkpoint(self, target: WeightTarget, installs: str) -> WeightTarget:
        from dataclasses import replace

        # vLLM's own reload_weights installs whatever it is pointed at, without checking.
        self.http.mutation_method = "reload_weights"
        return replace(target, source=str(self.models[installs]))

    def naive_resume(self) -> dict[str, Any]:
        from rolloutcore.adapters.contract import AdapterError

        out: dict[str, Any] = {"died": False, "tokens": None, "error": None}
        try:
            self.resume_raw()
            res = self.direct.generate(self.prompt("probe"), self.probe_tokens)
            out["tokens"] = list(res.tokens)
        except (AdapterError, RuntimeError) as e:
            out["error"] = str(e)
        deadline = time.monotonic() + 10.0
        while out["error"] and self.server.is_running() and time.monotonic() < deadline:
            time.sleep(0.2)  # observed: the server exits about a second after the 500
        out["died"] = not self.server.is_running()
        return out

    def alive(self) -> bool:
        if not self.server.is_running():
            return False
        try:
            return self.direct.read_identity() is not None
        except Exception:
            return False

    def disarm(self) -> None:
        self.http.mutation_method = "rc_reload_weights"

    def kill(self) -> None:
        self.server.kill()

    def freeze(self) -> None:
        self.server.freeze()

    def thaw(self) -> None:
        self.server.thaw()

    def restore(self, initial: str = "v1") -> None:
        self.clear_faults()
        self.disarm()
        if self.is_paused_raw():
            self.resume_raw()
        self._reload(self.models[initial])
        self.relabel_outside(self.initial_label)
        r = self.direct.request("POST", "/reset_prefix_cache", op="harness_reset",
                              idempotent=True)
        if r.status != 200 or not (isinstance(r.body, dict) and r.body.get("success")):
            raise RuntimeError(f"restore: prefix reset not verified: {r.text[:200]}")

    def inject(self, op: str, fault: str, *, times: int | None = 1) -> None:
        from rolloutcore.conformance.fault_proxy import Fault

        makers: dict[str, Callable[[str, str], Fault]] = {
            "late": lambda m, p: Fault.hang_after(m, p, times=times),
            "hang": lambda m, p: Fault.hang_before(m, p, times=times),
            "drop": lambda m, p: Fault.drop_after(m, p, times=times),
            "refuse": lambda m, p: Fault.drop_before(m, p, times=times),
            "http_500": lambda m, p: Fault.status(m, p, 500, times=times),
            "empty_body": lambda m, p: Fault.empty_body(m, p, times=times),
            "fail_body": lambda m, p: Fault.replace_body(m, p, {"success": False},
                                                         times=times)}
        for method, path, marker in WIRE_OPS[op]:
            f = makers[fault](method, path)
            self.proxy.add(f.when_body(marker) if marker else f)

    def clear_faults(self) -> None:
        self.proxy.clear()
        self.proxy.release()

    def close(self) -> None:
        if self.release is not None:
            # Best effort only: the pool's own check decides whether the server is reused.
            with contextlib.suppress(Exception):
                if self.alive():
                    self.restore()
        self.proxy.stop()
        self.http.close()
        self.direct.close()
        if self.release is not None:
            self.release(self.server)
        elif self.own_server:
            self.server.stop()


# ---- real vLLM, multimodal


@dataclass
class EncoderResetRecord:
    """One encoder or multimodal reset the runner made on a :class:`MultimodalHarness
    Engine`: what the engine held just before (read straight from the server, both
    halves of the encoder cache) and the reset's own evidence."""

    tier: str
    before: dict[str, Any]  # encoder_entries (worker + scheduler), per half, mm receiver
    warmed: bool  # an image chat filled the cache since the last verified reset
    status: int | None = None
    success: bool | None = None
    entries_after: int | None = None
    error: str | None = None

    @property
    def verified_empty(self) -> bool:
        """Carried out (200, not refused) and read back as empty: the reset's own check
        (the encoder reset's body carries no ``success``; the count read after it does)."""
        return self.status == 200 and self.success is not False and self.entries_after == 0

    def as_json(self) -> dict[str, Any]:
        return {"tier": self.tier, "before": self.before, "warmed": self.warmed,
                "status": self.status, "success": self.success,
                "entries_after": self.entries_after, "error": self.error}


class _WarmingAdapter:
    """The runner's adapter on a multimodal engine: before every pause (the runner's, the
    fence's, a re-admission's) on a running engine, one image chat with a fresh cache
    salt, so that the encoder cache holds an entry when the resets after the mutation
    run (a request sent while paused would only queue); around every encoder and mm
    reset, what the engine held before it and the reset's evidence. Everything else is
    the wrapped adapter's."""

    def __init__(self, engine: MultimodalHarnessEngine) -> None:
        self._engine = engine
        self.inner = engine.http

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def pause(self, mode: PauseMode, deadline: float) -> PauseEvidence:
        self._engine.warm()
        return self.inner.pause(mode, deadline)

    def fence(self, label: str, deadline: float) -> FenceEvidence:
        self._engine.warm()
        return self.inner.fence(label, deadline)

    def reset_cache(self, tier: str, deadline: float) -> ResetEvidence:
        if tier not in ("encoder", "mm"):
            return self.inner.reset_cache(tier, deadline)
        rec = EncoderResetRecord(tier, self._engine.encoder_state(), self._engine.warmed)
        self._engine.resets.append(rec)
        try:
            ev = self.inner.reset_cache(tier, deadline)
        except Exception as e:
            rec.error = f"{type(e).__name__}: {e}"
            raise
        rec.status, rec.success, rec.entries_after = ev.http_status, ev.body_success, \
            ev.entries_after
        if rec.verified_empty and tier == "encoder":
            self._engine.warmed = False
        return ev


class MultimodalHarnessEngine(VllmHarnessEngine):
    """:class:`VllmHarnessEngine` on a multimodal model (the tiny BLIP-2 of
    :mod:`.tiny_mm_model`, served with ``cache_controls.MM_SERVER_ARGS``) whose encoder
    cache is never empty when the runner resets it: the runner's adapter
    (:class:`_WarmingAdapter`) sends one image chat before every pause of a running
    engine and records every encoder and mm reset (:attr:`resets`): the entries before
    (worker and scheduler halves) and the verified count after.

    An in-place reload (RolloutCore's or vLLM's) empties only the worker's half of the
    encoder cache; the scheduler's half still lists the image until the encoder reset
    (an image then would crash the engine: ``cache_controls.control_encoder_crash``). So
    the warming chat is only sent while both halves agree, and :meth:`restore` resets
    the encoder and mm tiers too: a schedule that ends between a reload and a verified
    encoder reset leaves nothing behind for the next one."""

    kind = "vllm"

    def __init__(self, server: Any, models: Mapping[str, Path], **kw: Any) -> None:
        from rolloutcore.conformance.cache_controls import MMClient

        super().__init__(server, models, **kw)
        self.client = MMClient(server.url, self.models["v1"])
        self.resets: list[EncoderResetRecord] = []
        self.chats: list[dict[str, Any]] = []  # every warming chat: status, cache after
        self.warmed = False
        self._salt = 0
        self.adapter = _WarmingAdapter(self)

    @classmethod
    def start_mm(cls, models: Mapping[str, Path], work_dir: Path, *,
                 initial: str = "v1") -> MultimodalHarnessEngine:
        """Start a multimodal server on ``models[initial]`` (``MM_SERVER_ARGS``)."""
        from rolloutcore.conformance.cache_controls import MM_SERVER_ARGS
        from rolloutcore.conformance.fixtures.vllm_server import VllmServer

        work_dir.mkdir(parents=True, exist_ok=True)
        srv = VllmServer(Path(models[initial]).resolve(), extra_args=list(MM_SERVER_ARGS),
                         log_path=work_dir / f"vllm-mm-{time.monotonic_ns()}.log")
        srv.start()
        try:
            return cls(srv, models, work_dir=work_dir, own_server=True)
        except BaseException:
            srv.stop()
            raise

    def encoder_state(self) -> dict[str, Any]:
        """Both halves of the encoder cache and the mm receiver cache, read directly."""
        try:
            info = self.direct.cache_info(time.monotonic() + 30.0)
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}"}
        return {k: info[k] for k in ("encoder_entries", "encoder_cache_entries",
                                     "encoder_scheduler_entries", "mm_receiver_entries")}

    def warm(self) -> None:
        """One image chat (fresh salt: no prefix hit), if the engine runs and both halves
        of the encoder cache agree; recorded in :attr:`chats`."""
        if self.is_paused_raw():
            return
        before = self.encoder_state()
        if before.get("encoder_cache_entries") != before.get("encoder_scheduler_entries"):
            self.chats.append({"skipped": "split encoder cache", "before": before})
            return
        self._salt += 1
        chat = self.client.chat("img_a", f"tour-warm-{self._salt}")
        after = self.encoder_state()
        self.chats.append({"status": chat.status, "error": chat.error, "after": after})
        if chat.status == 200 and (after.get("encoder_entries") or 0) > 0:
            self.warmed = True

    def restore(self, initial: str = "v1") -> None:
        super().restore(initial)
        for path in ("/reset_encoder_cache", "/reset_mm_cache"):
            r = self.direct.request("POST", path, op="harness_reset", idempotent=True)
            if r.status != 200:
                raise RuntimeError(f"restore: {path}: HTTP {r.status} {r.text[:200]}")
        self.warmed = False

    def close(self) -> None:
        self.client.close()
        super().close()


__all__ = ["INITIAL_LABEL", "EncoderResetRecord", "EngineDied", "HarnessEngine",
           "MultimodalHarnessEngine", "OpRecord", "RecordingAdapter", "SimHarnessEngine",
           "VllmHarnessEngine", "checkpoint_target"]
