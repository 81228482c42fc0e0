"""The conformance harness: one scenario corpus, two engines (the real vLLM server and
the simulator), every run journalled and trace-checked.

A scenario is a function of a :class:`ScenarioContext`; it drives a
:class:`~rolloutcore.runner.LifecycleRunner` (whose controller journals to a
:class:`~rolloutcore.journal.Journal`) against a :class:`HarnessEngine` and records
checks (description, ok, observed) and evidence (tokens, counters, timings). What a
scenario needs beyond the adapter contract (a mutation outside RolloutCore, the prefix
hit counter, the server PID, a naive resume after a failed load) is the engine
interface here, implemented once over a :class:`~rolloutcore.conformance.server.VllmServer`
plus :class:`~rolloutcore.adapters.http.HttpAdapter` and once over
:class:`~rolloutcore.adapters.sim.SimEngine` plus :class:`~rolloutcore.adapters.sim.SimAdapter`.

A scenario passes when every check holds, nothing raised, and its journal's chain is
intact and accepted by the trace checker. A scenario whose verdict (or any check's)
differs between the engines is reported by :func:`compare`: a bug in the simulator or
the spec, never smoothed over here.
"""

from __future__ import annotations

import abc
import json
import os
import shutil
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rolloutcore.adapters.contract import (
    EngineReport,
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
from rolloutcore.conformance.trace_check import check_file
from rolloutcore.journal import Journal, open_controller, read_journal, verify_chain
from rolloutcore.runner import CycleReport, LifecycleRunner, RunnerPolicy
from rolloutcore.spec.lifecycle import Phase

INITIAL_LABEL = "default"  # what a freshly started vLLM (and SimEngine) reports
PROMPTS = ("probe", "rollout")  # probe: cacheable (> 2 prefix blocks); rollout: long output


# --------------------------------------------------------------------------- results


@dataclass
class Check:
    description: str
    ok: bool
    observed: Any

    def as_json(self) -> dict[str, Any]:
        return {"description": self.description, "ok": self.ok, "observed": self.observed}


@dataclass
class ScenarioResult:
    name: str
    engine: str
    passed: bool
    checks: list[Check]
    evidence: dict[str, Any]
    journal: str | None
    trace: dict[str, Any] | None  # the trace checker's verdict (and the chain's)
    seconds: float
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "engine": self.engine, "passed": self.passed,
                "checks": [c.as_json() for c in self.checks], "evidence": self.evidence,
                "journal": self.journal, "trace": self.trace,
                "seconds": round(self.seconds, 3), "error": self.error}

    def failures(self) -> list[str]:
        out = [f"{c.description}: observed {c.observed!r}" for c in self.checks if not c.ok]
        if self.error:
            out.append(f"error: {self.error}")
        if self.trace is not None and not self.trace.get("accepted"):
            out.append(f"trace: {self.trace.get('message')}")
        return out


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

    def read_state(self) -> EngineReport:
        out: EngineReport = self._rec("read_state", self.inner.read_state)
        return out

    def pause(self, mode: PauseMode) -> PauseEvidence:
        out: PauseEvidence = self._rec("pause", lambda: self.inner.pause(mode))
        return out

    def resume(self) -> ResumeEvidence:
        out: ResumeEvidence = self._rec("resume", self.inner.resume)
        return out

    def mutate(self, target: WeightTarget) -> MutationEvidence:
        out: MutationEvidence = self._rec("mutate", lambda: self.inner.mutate(target))
        return out

    def reset_cache(self, tier: str) -> ResetEvidence:
        out: ResetEvidence = self._rec(f"reset_{tier}", lambda: self.inner.reset_cache(tier))
        return out

    def probe(self, prompt: tuple[int, ...], max_tokens: int) -> ProbeEvidence:
        out: ProbeEvidence = self._rec("probe", lambda: self.inner.probe(prompt, max_tokens))
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
    probe_tokens: int  # greedy tokens of the probe prompt (the targets' probe)
    rollout_tokens: int  # tokens of a long rollout

    @abc.abstractmethod
    def target(self, generation: int, version: str, *, label: str | None = None) -> (
        WeightTarget):
        """A WeightTarget installing checkpoint ``version`` (v1, v2, v1neg) as
        ``generation``; its probe is the cacheable probe prompt."""

    def initial_target(self) -> WeightTarget:
        return self.target(1, "v1", label=INITIAL_LABEL)

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
    def alive(self) -> bool:
        ...

    @abc.abstractmethod
    def restore(self) -> None:
        """Back to a freshly started engine's state (initial weights, label, clean
        prefix cache, running): a test fixture step, outside RolloutCore."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the engine owns (stop a server it started)."""


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

    def _fresh(self) -> None:
        self.engine = self._sim.SimEngine("v1", token_seconds=self.token_seconds,
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

    def pid(self) -> int:
        return id(self.engine)

    def identity(self) -> str | None:
        return self.engine.identity_reads_as

    def label(self) -> str | None:
        return self.engine.label

    def mutate_outside(self, version: str) -> None:
        self.engine.load(version)

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

    def restore(self) -> None:
        self.sim_adapter.release_hangs()
        self._fresh()


class EngineDied(RuntimeError):
    """The engine is gone (its process exited, or the simulated core died)."""


# ---- real vLLM


PROBE_NAMES = {"probe": "long", "rollout": "short_rollout256"}  # in references.json


def checkpoint_target(path: Path, generation: int, label: str, *,
                      identity: str | None = None) -> WeightTarget:
    """The WeightTarget installing a tiny-model checkpoint directory: its content
    identity, and as probe the cacheable long prompt with its greedy reference."""
    from rolloutcore.conformance.tiny_model import load_references
    from rolloutcore.identity import checkpoint_identity, checkpoint_nbytes

    entry = next(p for p in load_references(path)["probes"] if p["name"] == PROBE_NAMES["probe"])
    return WeightTarget(
        generation=generation, label=label,
        identity=identity or checkpoint_identity(path), source=str(Path(path).resolve()),
        probe_prompt=tuple(entry["prompt_token_ids"]),
        probe_tokens=tuple(entry["output_token_ids"]), nbytes=checkpoint_nbytes(path))


class VllmHarnessEngine(HarnessEngine):
    """A real vLLM CPU server (started with the worker extension) and the HTTP adapter.

    ``server`` is a started :class:`VllmServer`; with ``own_server`` it is stopped by
    :meth:`close`. ``work_dir`` holds the broken checkpoint of the failed-load scenario.
    """

    kind = "vllm"

    def __init__(self, server: Any, models: Mapping[str, Path], *, work_dir: Path,
                 own_server: bool = False) -> None:
        from rolloutcore.adapters.http import HttpAdapter
        from rolloutcore.conformance.tiny_model import LONG_ROLLOUT_TOKENS, SHORT_MAX_TOKENS

        self.server = server
        self.models = {k: Path(v).resolve() for k, v in models.items()}
        self.work_dir = Path(work_dir)
        self.own_server = own_server
        self.http = HttpAdapter(server.url, model=server.served_model_name)
        self.adapter = self.http
        self.probe_tokens = SHORT_MAX_TOKENS
        self.rollout_tokens = LONG_ROLLOUT_TOKENS
        self._refs: dict[str, dict[str, Any]] = {}
        self._identity: dict[str, str] = {}

    @classmethod
    def start(cls, models: Mapping[str, Path], work_dir: Path, *,
              initial: str = "v1") -> VllmHarnessEngine:
        """Start a server on ``models[initial]`` with the worker extension."""
        from rolloutcore.adapters.http import EXTENSION_CLS
        from rolloutcore.conformance.server import VllmServer

        work_dir.mkdir(parents=True, exist_ok=True)
        srv = VllmServer(Path(models[initial]).resolve(),
                         extra_args=["--worker-extension-cls", EXTENSION_CLS],
                         log_path=work_dir / f"vllm-{int(time.time() * 1000)}.log")
        srv.start()
        return cls(srv, models, work_dir=work_dir, own_server=True)

    # ---- references and targets

    def _ref(self, version: str) -> dict[str, Any]:
        if version not in self._refs:
            from rolloutcore.conformance.tiny_model import load_references

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
            from rolloutcore.identity import checkpoint_identity

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
            return self.http.generate(prompt, max_tokens)
        except AdapterError as e:
            if not self.server.is_running():
                raise EngineDied(str(e)) from e
            raise

    def prefix_hits(self) -> int:
        return self.http.prefix_counters()[1]

    def running_requests(self) -> int:
        return self.http.running_requests() or 0

    def pid(self) -> int:
        pid: int = self.server.pid
        return pid

    def identity(self) -> str | None:
        from rolloutcore.adapters.contract import AdapterError

        try:
            return self.http.read_identity()
        except AdapterError:
            return None

    def label(self) -> str | None:
        return self.http.read_label()

    def _reload(self, path: Path) -> None:
        r = self.http.rpc("rc_reload_weights", op="harness_reload", idempotent=False,
                          weights_path=str(path))
        results = r.body.get("results") if isinstance(r.body, dict) else None
        if r.status != 200 or not results or results[0].get("loaded") is not True:
            raise RuntimeError(f"harness reload of {path} failed: {r.status} {r.text[:300]}")

    def mutate_outside(self, version: str) -> None:
        self._reload(self.models[version])

    def pause_raw(self, mode: PauseMode) -> None:
        r = self.http.request("POST", "/pause", op="pause_raw", idempotent=True,
                              timeout=120.0, params={"mode": mode.value,
                                                     "clear_cache": "false"})
        if r.status != 200:
            raise RuntimeError(f"pause {mode.value}: HTTP {r.status} {r.text[:200]}")

    def resume_raw(self) -> None:
        r = self.http.request("POST", "/resume", op="resume_raw", idempotent=True)
        if r.status != 200:
            raise RuntimeError(f"resume: HTTP {r.status} {r.text[:200]}")

    def is_paused_raw(self) -> bool:
        return self.http.read_paused()

    def broken_checkpoint(self) -> Path:
        """v2 with one layer-1 tensor a column short: same names, a different shape. vLLM's
        in-place reload loads layer 0 and dies in layer 1 (observed with other shapes)."""
        from rolloutcore.identity import checkpoint_entries, iter_tensor_bytes, write_safetensors

        out = self.work_dir / "broken_v2"
        if (out / "model.safetensors").exists():
            return out
        out.mkdir(parents=True, exist_ok=True)
        src = self.models["v2"]
        for f in src.iterdir():
            if f.is_file() and f.suffix != ".safetensors":
                shutil.copy2(f, out / f.name)
        victim = "model.layers.1.mlp.down_proj.weight"
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
            res = self.http.generate(self.prompt("probe"), self.probe_tokens)
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
            return self.http.read_identity() is not None
        except Exception:
            return False

    def restore(self) -> None:
        self.http.mutation_method = "rc_reload_weights"
        if self.is_paused_raw():
            self.resume_raw()
        self._reload(self.models["v1"])
        r = self.http.request("POST", "/update_weight_version", op="harness_label",
                              idempotent=True, json_body={"new_version": INITIAL_LABEL})
        if r.status != 200:
            raise RuntimeError(f"restore: label: HTTP {r.status}")
        r = self.http.request("POST", "/reset_prefix_cache", op="harness_reset",
                              idempotent=True)
        if r.status != 200 or not (isinstance(r.body, dict) and r.body.get("success")):
            raise RuntimeError(f"restore: prefix reset not verified: {r.text[:200]}")

    def close(self) -> None:
        self.http.close()
        if self.own_server:
            self.server.stop()


# ------------------------------------------------------------------------ contexts


StepPrinter = Callable[[str], None]


@dataclass
class ScenarioContext:
    """What a scenario function gets: the engine, where to journal, and its records."""

    engine: HarnessEngine
    name: str
    journal_path: Path
    policy: RunnerPolicy = field(default_factory=lambda: RunnerPolicy(
        step_timeout_s=60.0, drain_timeout_s=120.0))
    printer: StepPrinter | None = None
    checks: list[Check] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    recorder: RecordingAdapter | None = None
    runner: LifecycleRunner | None = None
    journal: Journal | None = None

    def check(self, description: str, ok: bool, observed: Any = None) -> bool:
        self.checks.append(Check(description, bool(ok), _plain(observed)))
        if self.printer is not None:
            self.printer(f"    [{'ok' if ok else 'FAIL'}] {description}: {_short(observed)}")
        return bool(ok)

    def say(self, text: str) -> None:
        if self.printer is not None:
            self.printer(text)

    def open_runner(self) -> LifecycleRunner:
        """A fresh controller journalling to this scenario's journal, over a recording
        adapter; the engine is expected in its fresh state (label, weights)."""
        if self.runner is not None:
            raise RuntimeError("one runner per scenario (one journal)")
        self.journal_path.parent.mkdir(parents=True, exist_ok=True)
        if self.journal_path.exists():
            self.journal_path.unlink()
        controller, journal, _rec = open_controller(self.journal_path)
        self.journal = journal
        self.recorder = RecordingAdapter(self.engine.adapter)

        def on_step(step: str, outcome: str, seconds: float) -> None:
            self.say(f"    {step:<16} -> {outcome:<18} {seconds * 1000:8.1f} ms   "
                     f"phase {controller.phase.value}")

        self.runner = LifecycleRunner(controller, self.recorder, self.policy, on_step=on_step)
        return self.runner

    def bootstrap(self) -> LifecycleRunner:
        runner = self.open_runner()
        initial = self.engine.initial_target()
        outcome = runner.bootstrap(initial)
        self.say(f"    bootstrap -> {outcome.trigger}: {outcome.reason}")
        self.check("bootstrap: the fresh engine is adopted as generation 1",
                   outcome.trigger == "bootstrap_ok", outcome.reason)
        return runner

    def cycle_evidence(self, key: str, report: CycleReport) -> None:
        self.evidence[key] = cycle_json(report)
        self.say(f"    cycle -> {'published' if report.published else 'NOT published'} "
                 f"{report.target.label} in {report.total_s * 1000:.0f} ms "
                 f"(drain wait {report.drain_wait_s * 1000:.0f} ms), "
                 f"phase {report.final_phase.value}")
        if report.final_phase is Phase.READY:
            # The spec's ReadyEngineServesCommitted, checked against the engine itself.
            paused = self.engine.is_paused_raw()
            self.check(f"{key}: READY with the engine running (not left paused)", not paused,
                       {"is_paused": paused})

    def journal_steps(self) -> list[dict[str, Any]]:
        _report, records = read_journal(self.journal_path)
        return records[1:]

    def probes(self) -> list[ProbeEvidence]:
        assert self.recorder is not None
        return [c.evidence for c in self.recorder.of("probe")
                if isinstance(c.evidence, ProbeEvidence)]


def cycle_json(report: CycleReport) -> dict[str, Any]:
    return {"target": report.target.label, "published": report.published,
            "final_phase": report.final_phase.value,
            "total_s": round(report.total_s, 4), "drain_wait_s": round(report.drain_wait_s, 4),
            "steps": [{"step": s.step, "outcome": s.outcome, "seconds": round(s.seconds, 4),
                       "attempts": s.attempts, "reason": s.reason} for s in report.steps],
            "stuck_calls": report.stuck_calls}


def _plain(v: Any) -> Any:
    """JSON-ready observed values (tuples to lists, enums to strings)."""
    try:
        return json.loads(json.dumps(v, default=str))
    except (TypeError, ValueError):
        return repr(v)


def _short(v: Any, n: int = 100) -> str:
    s = json.dumps(_plain(v), default=str)
    return s if len(s) <= n else s[:n - 3] + "..."


# ------------------------------------------------------------------------ running


ScenarioFn = Callable[[ScenarioContext], None]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    fn: ScenarioFn
    destructive: bool = False  # may kill the engine: runs last, on its own engine


def run_scenario(scenario: Scenario, engine: HarnessEngine, out_dir: Path, *,
                 printer: StepPrinter | None = None, restore: bool = True) -> ScenarioResult:
    """Run one scenario on ``engine`` (restored to its fresh state first), then verify
    its journal: hash chain and trace check."""
    journal = out_dir / engine.kind / f"{scenario.name}.jsonl"
    ctx = ScenarioContext(engine, scenario.name, journal, printer=printer)
    if printer is not None:
        printer(f"[{engine.kind}] {scenario.name}: {scenario.description}")
    t0 = time.perf_counter()
    error: str | None = None
    try:
        if restore:
            engine.restore()
        scenario.fn(ctx)
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
        ctx.evidence["traceback"] = traceback.format_exc(limit=8)
        if printer is not None:
            printer(f"    ERROR {error}")
    finally:
        if ctx.journal is not None:
            ctx.journal.close()
    seconds = time.perf_counter() - t0
    trace: dict[str, Any] | None = None
    if ctx.runner is not None and journal.exists():
        chain = verify_chain(journal)
        verdict = check_file(journal)
        trace = {**verdict.as_json(), "chain_ok": chain.ok}
        if printer is not None:
            why = "" if verdict.accepted else f": {verdict.message}"
            printer(f"    journal {journal}: chain {'intact' if chain.ok else 'BROKEN'}, "
                    f"trace {'accepted' if verdict.accepted else 'REJECTED'} "
                    f"({verdict.records} records){why}")
    else:
        trace = {"accepted": False, "message": "the scenario recorded no journal"}
    passed = (error is None and bool(ctx.checks) and all(c.ok for c in ctx.checks)
              and bool(trace.get("accepted")) and trace.get("chain_ok", False) is True)
    return ScenarioResult(scenario.name, engine.kind, passed, ctx.checks, ctx.evidence,
                          str(journal) if journal.exists() else None, trace, seconds, error)


EngineFactory = Callable[[], HarnessEngine]


class EnginePool:
    """One shared engine for every scenario; a replacement when a scenario killed it."""

    def __init__(self, factory: EngineFactory) -> None:
        self.factory = factory
        self.engine: HarnessEngine | None = None
        self.started = 0

    def get(self) -> HarnessEngine:
        if self.engine is not None and not self.engine.alive():
            self.engine.close()
            self.engine = None
        if self.engine is None:
            self.engine = self.factory()
            self.started += 1
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None


def run_corpus(factory: EngineFactory, out_dir: Path, names: list[str] | None = None, *,
               printer: StepPrinter | None = None) -> list[ScenarioResult]:
    """Run the named scenarios (all by default), destructive ones last."""
    from rolloutcore.conformance.scenarios import SCENARIOS

    chosen = [SCENARIOS[n] for n in (names or list(SCENARIOS))]
    chosen.sort(key=lambda s: s.destructive)  # stable: corpus order otherwise
    pool = EnginePool(factory)
    results: list[ScenarioResult] = []
    try:
        for s in chosen:
            results.append(run_scenario(s, pool.get(), out_dir, printer=printer))
    finally:
        pool.close()
    return results


def sim_factory(**kwargs: Any) -> EngineFactory:
    return lambda: SimHarnessEngine(**kwargs)


def vllm_factory(out_dir: Path, models: Mapping[str, Path] | None = None) -> EngineFactory:
    def make() -> HarnessEngine:
        from rolloutcore.conformance.tiny_model import DEFAULT_OUT, build_models

        m = models if models is not None else build_models(DEFAULT_OUT)
        return VllmHarnessEngine.start(m, out_dir / "vllm")
    return make


@dataclass(frozen=True)
class Discrepancy:
    scenario: str
    what: str
    sim: Any
    vllm: Any

    def as_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "what": self.what, "sim": self.sim,
                "vllm": self.vllm}


def compare(sim: list[ScenarioResult], real: list[ScenarioResult]) -> list[Discrepancy]:
    """Scenario and check verdicts that differ between the simulator and real vLLM."""
    out: list[Discrepancy] = []
    by_name = {r.name: r for r in real}
    for s in sim:
        r = by_name.get(s.name)
        if r is None:
            continue
        if s.passed != r.passed:
            out.append(Discrepancy(s.name, "scenario verdict", s.passed, r.passed))
        sc = {c.description: c.ok for c in s.checks}
        rc = {c.description: c.ok for c in r.checks}
        for d in sorted(sc.keys() | rc.keys()):
            if sc.get(d) != rc.get(d):
                out.append(Discrepancy(s.name, d, sc.get(d), rc.get(d)))
        steps_s, steps_r = _outcome_steps(s), _outcome_steps(r)
        if steps_s is not None and steps_r is not None and steps_s != steps_r:
            out.append(Discrepancy(s.name, "journal step sequence", steps_s, steps_r))
    return out


def _outcome_steps(r: ScenarioResult) -> list[str] | None:
    """The journal's step names, admissions and releases aside (their interleaving with
    the cycle depends on timing, which the trace checker judges on its own)."""
    if r.journal is None or not os.path.exists(r.journal):
        return None
    _rep, records = read_journal(r.journal)
    return [str(x.get("step")) for x in records[1:] if x.get("step") not in ("admit", "release")]


@contextmanager
def background(fn: Callable[[], Any], join_timeout: float = 120.0) -> Iterator[
        dict[str, Any]]:
    """Run ``fn`` on a thread; the dict gets ``result``/``error`` and ``t_end``
    (perf_counter) once it finishes; joined on exit."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:
            box["error"] = e
        finally:
            box["t_end"] = time.perf_counter()

    th = threading.Thread(target=run, daemon=True)
    box["thread"] = th
    th.start()
    try:
        yield box
    finally:
        th.join(join_timeout)
        if th.is_alive():  # left behind (daemon): the scenario reports it
            box.setdefault("error", TimeoutError(f"still running after {join_timeout} s"))


def wait_until(cond: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


# ------------------------------------------------------------------------------ CLI


def artifacts_dir() -> Path:
    """Where runs write journals and logs: $ROLLOUTCORE_ARTIFACTS or the repo's
    git-ignored ``artifacts/``."""
    env = os.environ.get("ROLLOUTCORE_ARTIFACTS")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "artifacts"


def cli_run(engine: str, names: list[str] | None, *, as_json: bool,
            out_dir: Path | None = None) -> int:
    """``rolloutcore conformance run``: exit 0 only if every scenario passed on every
    engine run and (with both) no verdict differs between them."""
    import importlib.util
    import sys

    from rolloutcore.conformance.scenarios import SCENARIOS

    stream = sys.stderr if as_json else sys.stdout
    unknown = [n for n in names or [] if n not in SCENARIOS]
    if unknown:
        print(f"error: unknown scenario(s) {', '.join(unknown)}; known: "
              f"{', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    kinds = ["sim", "vllm"] if engine == "both" else [engine]
    if "vllm" in kinds and importlib.util.find_spec("vllm") is None:
        print("error: vllm is not installed (pip install -e '.[vllm]')", file=sys.stderr)
        return 2
    out = out_dir or artifacts_dir() / time.strftime("conformance-%Y%m%d-%H%M%S")

    def printer(text: str) -> None:
        print(text, file=stream, flush=True)

    results: dict[str, list[ScenarioResult]] = {}
    for kind in kinds:
        factory = sim_factory() if kind == "sim" else vllm_factory(out)
        results[kind] = run_corpus(factory, out, names, printer=printer)
    discrepancies = compare(results["sim"], results["vllm"]) if len(kinds) == 2 else []
    passed = all(r.passed for rs in results.values() for r in rs) and not discrepancies
    if as_json:
        print(json.dumps({"passed": passed, "out_dir": str(out),
                          "engines": {k: [r.as_json() for r in rs] for k, rs in results.items()},
                          "discrepancies": [d.as_json() for d in discrepancies]},
                         indent=2, sort_keys=True, default=str))
        return 0 if passed else 1
    order = list(dict.fromkeys(r.name for rs in results.values() for r in rs))
    printer("")
    printer(f"{'scenario':<18}" + "".join(f" {k:>14}" for k in kinds) + "   journal trace check")
    for name in order:
        row = f"{name:<18}"
        traces = []
        for k in kinds:
            r = next((x for x in results[k] if x.name == name), None)
            row += f" {('PASS' if r.passed else 'FAIL') + f' {r.seconds:6.1f}s':>14}" if r \
                else f" {'-':>14}"
            if r is not None and r.trace is not None:
                traces.append(f"{k}: {'accepted' if r.trace.get('accepted') else 'REJECTED'}")
        printer(row + "   " + ", ".join(traces))
        for k in kinds:
            for r in results[k]:
                if r.name == name:
                    for f in r.failures():
                        printer(f"    [{k}] {f}")
    for d in discrepancies:
        printer(f"DISCREPANCY {d.scenario}: {d.what}: sim={d.sim!r} vllm={d.vllm!r}")
    printer(f"journals under {out}")
    printer("PASS" if passed else "FAIL")
    return 0 if passed else 1


__all__ = ["Check", "EngineDied", "EnginePool", "HarnessEngine", "RecordingAdapter",
           "Scenario", "ScenarioContext", "ScenarioResult", "SimHarnessEngine",
           "VllmHarnessEngine", "cli_run", "compare", "run_corpus", "run_scenario", "sim_factory",
           "vllm_factory"]
