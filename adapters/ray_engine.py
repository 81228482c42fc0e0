"""Engines hosted in Ray actors, as RL frameworks host them, governed through Ray handles.

:class:`EngineActor` is the actor class: one in-process vLLM engine
(:class:`~rolloutcore.adapters.inprocess.InProcessEngine`, with vLLM's OpenAI routes on
the same engine for the gateway's rollouts) and the adapter over it; every lifecycle
operation is one remote call that runs the in-process adapter inside the actor, where
the engine is, and returns its evidence. :class:`RayAdapter` is the controller's side:
the same adapter contract over the actor's handle. :func:`launch` places N actors with
a placement group as named actors (what ``rolloutcore fleet launch --ray`` does).

Ray's failure signals become the spec's evidence, never a decision of their own:

* a call on a dead actor (``RayActorError``, ``ActorUnavailableError``) or one that does
  not answer by its deadline is no answer (:class:`AdapterError`); during the mutation it
  is ambiguous, so TAINTED within the step's deadline even if the actor never answers;
* every answer names the actor's *incarnation* (a fresh one each time its constructor
  runs: Ray's ``max_restarts`` re-runs it, a fresh engine on its constructor's weights
  and label). An answer from another incarnation than the last one seen is the spec's
  engine replaced out of band: ``on_replaced`` is told (the fleet suspects the member,
  so it admits nothing, and audits it at once), and only an audit or a verified
  re-admission on the new incarnation lets it serve again. The answer itself is true
  evidence about the engine as it now is, judged like any other (a fresh engine reads
  as its constructor's weights and label, so no check of the old one's passes on it).
* the fencing token lives in the engine process (the worker extension's epoch gate), so
  a restarted actor starts unfenced; a controller with a store fences it again before it
  re-admits it (the takeover's fence). Every call carries its own controller's epoch
  (never one the actor remembers from whoever fenced last), so the gate refuses a
  deposed controller's load.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rolloutcore.adapters.contract import (
    AdapterError,
    EngineReport,
    EpochEvidence,
    FenceEvidence,
    GenerationResult,
    MutationEvidence,
    MutationOutcome,
    PauseEvidence,
    PauseMode,
    ProbeEvidence,
    ResetEvidence,
    ResumeEvidence,
    WeightTarget,
    remaining,
)
from rolloutcore.errors import Unreachable

if TYPE_CHECKING:
    from rolloutcore.adapters.inprocess import EngineHost, InProcessAdapter

#: The adapter operations an actor runs for its controller (each takes ``deadline``).
OPERATIONS = frozenset({"read_state", "pause", "resume", "mutate", "reset_cache", "probe",
                        "fence", "fence_epoch"})
#: The actor finishes a call this much before the caller's deadline (the reply's trip).
REPLY_MARGIN_S = 0.05
NAMESPACE = "rolloutcore"


class LifecycleEndpoint:
    """The methods a :class:`RayAdapter` calls on an engine actor (``info``, ``call``),
    over the actor's engine host (:meth:`attach`). Both are
    synchronous: an actor whose engine runs on its own loop (:class:`EngineActor`) runs
    them in Ray's threads; an async actor whose engine runs on the actor's loop uses
    :class:`AdoptedEngineActor`, which runs them off that loop."""

    host: EngineHost
    adapter: InProcessAdapter
    incarnation: str
    reconstructed: bool

    def attach(self, host: EngineHost) -> None:
        """Serve RolloutCore's lifecycle over ``host`` from now on (a new incarnation)."""
        from rolloutcore.adapters.inprocess import InProcessAdapter

        self.incarnation = f"{os.getpid()}-{time.time_ns()}"
        self.reconstructed = _reconstructed()
        self.host = host
        self.adapter = InProcessAdapter(host)
        self._holds: dict[str, threading.Event] = {}
        self._waiting: dict[str, int] = {}

    def info(self) -> dict[str, Any]:
        return {"incarnation": self.incarnation, "pid": os.getpid(), "url": self.host.url,
                "reconstructed": self.reconstructed, "alive": self.host.alive()}

    def call(self, op: str, seconds: float, args: tuple[Any, ...] = (),
             kwargs: dict[str, Any] | None = None, epoch: int | None = None
             ) -> tuple[str, str, Any]:
        """``(incarnation, "ok" | "error", evidence | (message, proven_no_effect))`` of the
        adapter's ``op(*args, deadline=..., **kwargs)`` within ``seconds``, sent with the
        calling controller's ``epoch`` (every controller's calls carry their own: the
        engine's gate then refuses a deposed one's load, whoever fenced last)."""
        if op not in OPERATIONS:
            return self.incarnation, "error", (f"no such operation {op!r}", True)
        hold = self._holds.get(op)
        if hold is not None:  # a test holds this operation here (its cause, not timing)
            self._waiting[op] = self._waiting.get(op, 0) + 1
            hold.wait()
            self._waiting[op] -= 1
        deadline = time.monotonic() + max(seconds - REPLY_MARGIN_S, 0.001)
        adapter = copy.copy(self.adapter)  # this call's epoch, beside concurrent ones
        adapter.epoch = epoch
        try:
            out = getattr(adapter, op)(*args, deadline=deadline, **(kwargs or {}))
        except AdapterError as e:
            return self.incarnation, "error", (str(e), e.proven_no_effect)
        return self.incarnation, "ok", out

class EngineActor(LifecycleEndpoint):
    """The body of a Ray engine actor (``ray.remote(EngineActor)``, see :func:`actor_class`):
    an in-process engine started from ``args`` (a ``vllm serve`` command line) in the
    constructor, so a restart by Ray is a fresh engine on the same command line."""

    def __init__(self, args: Sequence[str], serve_http: bool = True) -> None:
        from rolloutcore.adapters.inprocess import InProcessEngine

        self.attach(InProcessEngine(args, serve_http=serve_http).start())

    def generate(self, prompt: tuple[int, ...], max_tokens: int) -> GenerationResult:
        return self.adapter.generate(prompt, max_tokens)

    def hold(self, op: str) -> None:
        """Make the next calls of ``op`` wait here until :meth:`release` (tests)."""
        self._holds[op] = threading.Event()
        self._waiting.setdefault(op, 0)

    def waiting(self, op: str) -> int:
        """How many calls of ``op`` wait at a hold now."""
        return self._waiting.get(op, 0)

    def release(self, op: str) -> None:
        ev = self._holds.pop(op, None)
        if ev is not None:
            ev.set()

    def set_interceptor(self, interceptor: Any) -> None:
        """Controlled causes inside the engine's host for tests (see
        :attr:`~rolloutcore.adapters.inprocess.InProcessEngine.interceptor`); None: none."""
        self.host.interceptor = interceptor

    def set_mutation_method(self, method: str) -> None:
        """``rc_reload_weights`` or vLLM's own ``reload_weights`` (a harness's armed
        mutation: it installs whatever it is pointed at)."""
        from rolloutcore.adapters.http import MUTATION_METHODS

        if method not in MUTATION_METHODS:
            raise ValueError(f"mutation method must be one of {MUTATION_METHODS}")
        self.adapter.mutation_method = method

    def set_label(self, label: str) -> str:
        """Set the engine's version label outside any lifecycle (what an orchestrator that
        relabels a restarted engine does); returns the label read back."""
        deadline = time.monotonic() + 30.0
        self.adapter.host.call("update_weight_version", 30.0, label)
        return self.adapter.read_label(deadline)


class AdoptedEngineActor(LifecycleEndpoint):
    """Mixed into a framework's own async engine actor (its ``AsyncLLM`` on the actor's
    event loop, as verl's and SkyRL's server actors hold it): once its engine runs, the
    actor calls ``self.adopt(self.engine)`` from the loop, and a :class:`RayAdapter` over
    its handle drives it like an :class:`EngineActor`. The engine needs the worker
    extension and loader (:data:`~rolloutcore.adapters.vllm_worker.ENGINE_ARGS`). Each
    call runs in a thread of its own, so the loop the engine needs stays free."""

    def adopt(self, engine: Any, url: str | None = None) -> None:
        import asyncio

        from rolloutcore.adapters.inprocess import HostedEngine

        self.attach(HostedEngine(engine, asyncio.get_running_loop(), url))

    async def info(self) -> dict[str, Any]:  # type: ignore[override]
        import asyncio

        return await asyncio.to_thread(LifecycleEndpoint.info, self)

    async def call(self, op: str, seconds: float,  # type: ignore[override]
                   args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
                   epoch: int | None = None) -> tuple[str, str, Any]:
        import asyncio

        return await asyncio.to_thread(LifecycleEndpoint.call, self, op, seconds, args, kwargs,
                                       epoch)


def _reconstructed() -> bool:
    import ray

    return ray.is_initialized() and bool(
        ray.get_runtime_context().was_current_actor_reconstructed)


def actor_class(**options: Any) -> Any:
    """``ray.remote(EngineActor)`` with ``options`` (threaded: calls of one actor run
    concurrently, as a server's requests do)."""
    import ray

    return ray.remote(**{"max_concurrency": 16, **options})(EngineActor)


class RayAdapter:
    """The lifecycle adapter over an :class:`EngineActor`'s handle (see the module's
    docstring for what Ray's failures mean here). ``on_replaced(why)`` is called when an
    answer comes from a new incarnation of the actor."""

    def __init__(self, handle: Any, *, on_replaced: Callable[[str], None] | None = None
                 ) -> None:
        self.handle = handle
        self.on_replaced = on_replaced
        self.incarnation: str | None = None
        self.replacements = 0  # new incarnations seen
        self.url: str | None = None
        self.epoch: int | None = None
        self.lease_check: Callable[[], bool] | None = None

    def _get(self, op: str, ref: Any, deadline: float) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return ray.get(ref, timeout=remaining(deadline))
        except GetTimeoutError:
            raise AdapterError(f"{op}: the engine actor gave no answer by the step's "
                               "deadline") from None
        except RayActorError as e:  # ActorDiedError, ActorUnavailableError
            raise AdapterError(f"{op}: the engine actor is gone ({type(e).__name__}: "
                               f"{str(e).splitlines()[0][:200]})") from None

    def _call(self, op: str, deadline: float, *args: Any, **kwargs: Any) -> Any:
        if op not in ("read_state",) and self.lease_check is not None \
                and not self.lease_check():
            raise AdapterError(f"{op}: not sent: this controller no longer holds the fleet's "
                               "leadership", proven_no_effect=True)
        ref = self.handle.call.remote(op, remaining(deadline), args, kwargs or None, self.epoch)
        incarnation, kind, value = self._get(op, ref, deadline)
        self._seen(incarnation, op)
        if kind == "error":
            message, proven = value
            raise AdapterError(str(message), proven_no_effect=bool(proven))
        return value

    def _seen(self, incarnation: str, op: str) -> None:
        """Note the incarnation that answered; a new one is told to ``on_replaced`` (from
        its own thread: the fleet suspects and audits the member). The answer itself
        stands: it is evidence about the engine as it is now, and every postcondition
        reads the engine afresh, so a replacement can never pass for the old engine."""
        previous, self.incarnation = self.incarnation, incarnation
        if previous is not None and previous != incarnation:
            self.replacements += 1
            self.epoch = None  # the new engine process holds no fencing token
            why = (f"{op} was answered by a restarted engine actor (incarnation {previous} "
                   f"-> {incarnation}): an engine replaced out of band")
            if self.on_replaced is not None:
                threading.Thread(target=self.on_replaced, args=(why,), daemon=True,
                                 name="rolloutcore-ray-replaced").start()

    def info(self, deadline: float | None = None) -> dict[str, Any]:
        d = deadline if deadline is not None else time.monotonic() + 30.0
        out: dict[str, Any] = self._get("info", self.handle.info.remote(), d)
        self._seen(str(out["incarnation"]), "info")
        self.url = out.get("url")
        return out

    # ------------------------------------------------------------------ the contract

    def read_state(self, deadline: float) -> EngineReport:
        out: EngineReport = self._call("read_state", deadline)
        return out

    def pause(self, mode: PauseMode, deadline: float) -> PauseEvidence:
        out: PauseEvidence = self._call("pause", deadline, PauseMode(mode))
        return out

    def resume(self, deadline: float) -> ResumeEvidence:
        out: ResumeEvidence = self._call("resume", deadline)
        return out

    def reset_cache(self, tier: str, deadline: float) -> ResetEvidence:
        out: ResetEvidence = self._call("reset_cache", deadline, tier)
        return out

    def probe(self, prompt: tuple[int, ...], max_tokens: int, deadline: float, *,
              scored: bool = False) -> ProbeEvidence:
        try:
            out: ProbeEvidence = self._call("probe", deadline, prompt, max_tokens,
                                            scored=scored)
        except AdapterError as e:
            return ProbeEvidence(prompt, None, None, None, error=str(e))
        return out

    def fence(self, label: str, deadline: float) -> FenceEvidence:
        try:
            out: FenceEvidence = self._call("fence", deadline, label)
        except AdapterError as e:
            return FenceEvidence(label, None, None, None, None, None, str(e))
        return out

    def fence_epoch(self, epoch: int, deadline: float) -> EpochEvidence:
        try:
            out: EpochEvidence = self._call("fence_epoch", deadline, int(epoch))
        except AdapterError as e:
            return EpochEvidence(epoch, False, None, str(e))
        if out.accepted:
            self.epoch = int(epoch)
        return out

    def mutate(self, target: WeightTarget, deadline: float) -> MutationEvidence:
        """The actor's in-process mutation; an actor that dies or does not answer by the
        deadline leaves it ambiguous (only a refusal proven before anything was sent is
        not)."""
        t0 = time.perf_counter()
        try:
            out: MutationEvidence = self._call("mutate", deadline, target)
        except AdapterError as e:
            if e.proven_no_effect:
                raise
            return MutationEvidence(MutationOutcome.AMBIGUOUS, f"mutate: {e}",
                                    time.perf_counter() - t0)
        return out

    def generate(self, prompt: tuple[int, ...], max_tokens: int) -> GenerationResult:
        import ray

        out: GenerationResult = ray.get(self.handle.generate.remote(prompt, max_tokens))
        return out


@dataclass(frozen=True)
class LaunchedEngine:
    name: str  # the member's name; the actor is named ``{prefix}{name}`` in NAMESPACE
    actor_name: str
    handle: Any
    url: str  # its OpenAI routes (the gateway's rollouts go there)


class RayUnavailable(Unreachable, ConnectionError):
    """No Ray cluster answers at the address (one line: where and why)."""


def connect(address: str, namespace: str = NAMESPACE, *, timeout: float = 5.0) -> None:
    """Join the Ray cluster whose GCS is at ``address`` (host:port) as a driver in
    ``namespace`` (a no-op when this process already has); RayUnavailable within
    ``timeout`` when nothing listens there (``ray.init`` alone would retry for a minute)."""
    import socket

    import ray

    if ray.is_initialized():
        return
    host, _sep, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as e:
        raise RayUnavailable(f"no Ray cluster at {address}: {e}") from None
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False,
                 configure_logging=False)
    except Exception as e:  # ray raises ConnectionError, RuntimeError, ...
        raise RayUnavailable(f"cannot join the Ray cluster at {address}: "
                             f"{str(e).splitlines()[0][:200]}") from None


def engine_handle(actor: str, namespace: str = NAMESPACE) -> Any:
    """The handle of the named engine actor; RayUnavailable if the cluster has none."""
    import ray

    try:
        return ray.get_actor(actor, namespace=namespace)
    except ValueError:
        raise RayUnavailable(f"the Ray cluster has no actor {actor!r} in namespace "
                             f"{namespace!r}") from None


def placement_bundles(engines: int, *, cpus_per_engine: float = 1.0,
                      gpus_per_engine: float = 0.0,
                      trainer: Mapping[str, float] | None = None) -> list[dict[str, float]]:
    """The placement group's bundles for ``engines`` engine actors, then the trainer's
    (its index is ``engines``; None: no trainer bundle). An engine's bundle is what its
    actor holds: ``cpus_per_engine`` CPUs and, on GPU, ``gpus_per_engine`` GPUs (its
    tensor-parallel size: :func:`launch` runs vLLM's workers as the actor's child
    processes, on the GPUs Ray gave the actor).
    ValueError on a size a placement group cannot hold."""
    if engines < 1:
        raise ValueError(f"engines must be at least 1, not {engines}")
    if not cpus_per_engine > 0:
        raise ValueError(f"cpus per engine must be above 0, not {cpus_per_engine:g}")
    if gpus_per_engine < 0 or gpus_per_engine % 1:
        raise ValueError(f"GPUs per engine must be 0 or a whole number, not "
                         f"{gpus_per_engine:g} (an engine does not share a GPU)")
    engine = {"CPU": float(cpus_per_engine)}
    if gpus_per_engine:
        engine["GPU"] = float(gpus_per_engine)
    bundles = [dict(engine) for _ in range(engines)]
    if trainer is not None:
        if not trainer or any(not v > 0 for v in trainer.values()):
            raise ValueError(f"the trainer's bundle needs resources above 0, not "
                             f"{dict(trainer)}")
        bundles.append({k: float(v) for k, v in trainer.items()})
    return bundles


def launch(model: str | Path, names: Sequence[str], *, prefix: str = "rolloutcore-engine-",
           max_restarts: int = 1, cpus_per_engine: float = 1.0, gpus_per_engine: float = 0.0,
           trainer: Mapping[str, float] | None = None, strategy: str = "PACK",
           extra_args: Sequence[str] = (), startup_timeout: float = 300.0,
           detached: bool = False) -> tuple[Any, list[LaunchedEngine]]:
    """Place one engine actor per name on ``model`` with a placement group (the bundles
    of :func:`placement_bundles`, in the order of ``names``, then the trainer's when
    ``trainer`` is given: schedule the trainer with bundle index ``len(names)``;
    ``strategy`` PACK or SPREAD over the nodes), named ``{prefix}{name}`` in
    :data:`NAMESPACE`, restarted by Ray up to ``max_restarts`` times, each serving its
    OpenAI routes on a port fixed at launch (a restart comes back on the same URL).
    Returns the placement group and the engines once every one answers. ``detached``:
    the actors and their placement group outlive this driver (``rolloutcore fleet
    launch``; ``ray stop`` ends them)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from rolloutcore.adapters.inprocess import ENGINE_ENV, engine_args
    from rolloutcore.adapters.launch import free_port

    bundles = placement_bundles(len(names), cpus_per_engine=cpus_per_engine,
                                gpus_per_engine=gpus_per_engine, trainer=trainer)
    have: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    for resource in sorted({k for b in bundles for k in b}):
        need = sum(b.get(resource, 0.0) for b in bundles)
        if need > have.get(resource, 0.0):  # else pg.ready() would wait out the timeout
            raise RuntimeError(f"the placement group needs {need:g} {resource} and the Ray "
                               f"cluster has {have.get(resource, 0.0):g}")
    lifetime = {"lifetime": "detached"} if detached else {}
    pg = placement_group(bundles, strategy=strategy, **lifetime)
    ray.get(pg.ready(), timeout=startup_timeout)
    cls = actor_class(num_cpus=cpus_per_engine, num_gpus=gpus_per_engine,
                      max_restarts=max_restarts,
                      runtime_env={"env_vars": dict(ENGINE_ENV)}, **lifetime)
    if gpus_per_engine > 1:  # TP inside the actor: vLLM's workers as its child processes
        extra_args = ["--tensor-parallel-size", f"{gpus_per_engine:.0f}",
                      "--distributed-executor-backend", "mp", *extra_args]
    handles = []
    for i, name in enumerate(names):
        port = free_port()
        handles.append((name, port, cls.options(
            name=f"{prefix}{name}", namespace=NAMESPACE,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=i)).remote(
            engine_args(Path(model).resolve(), port=port, extra_args=extra_args))))
    infos = ray.get([h.info.remote() for _n, _p, h in handles], timeout=startup_timeout)
    return pg, [LaunchedEngine(name, f"{prefix}{name}", h, str(info["url"]))
                for (name, _port, h), info in zip(handles, infos, strict=True)]


__all__ = ["NAMESPACE", "OPERATIONS", "AdoptedEngineActor", "EngineActor", "LaunchedEngine",
           "LifecycleEndpoint", "RayAdapter",
           "RayUnavailable", "actor_class", "connect", "engine_handle", "launch",
           "placement_bundles"]
