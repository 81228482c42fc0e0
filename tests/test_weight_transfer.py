"""The weight-transfer adapter without a vLLM server: a fake vLLM worker joins the real
gloo group in-process (the trainer side is the real vLLM trainer API and our engine)."""

from __future__ import annotations

import struct
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import LATE_S, dl

pytest.importorskip("vllm.distributed.weight_transfer")

import torch

from rolloutcore.adapters.contract import AdapterError, MutationOutcome, WeightTarget
from rolloutcore.adapters.gloo_transfer import (
    GlooTrainerInitInfo,
    GlooWeightTransferInitInfo,
    _broadcast,
    _open_group,
    nbytes_of,
    plan_buffers,
    register,
)
from rolloutcore.adapters.sim import SimAdapter, SimEngine
from rolloutcore.adapters.weight_transfer import (
    CheckpointSource,
    TargetAwareClient,
    TransferAdapter,
    TransferPolicy,
)
from rolloutcore.engine.controller import Controller, IllegalTransition
from rolloutcore.engine.identity import checkpoint_identity, write_safetensors
from rolloutcore.engine.runner import LifecycleRunner, RunnerPolicy
from rolloutcore.journal import Journal
from rolloutcore.spec.lifecycle import Phase


def _ckpt(d: Path, seed: float, shapes: dict[str, tuple[int, ...]] | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    shapes = shapes or {"a.weight": (4, 8), "b.bias": (8,), "c.weight": (300, 200)}
    tensors = []
    for i, (name, shape) in enumerate(sorted(shapes.items())):
        n = 1
        for s in shape:
            n *= s
        data = struct.pack(f"<{n}f", *((seed + i + k * 1e-3) for k in range(n)))
        tensors.append((name, "F32", shape, data))
    write_safetensors(d / "model.safetensors", tensors)
    return d


def _target(d: Path, gen: int = 2, label: str = "v2", identity: str | None = None) -> WeightTarget:
    return WeightTarget(generation=gen, label=label, identity=identity or checkpoint_identity(d),
                        source=str(d), probe_prompt=(1, 2, 3), probe_tokens=(4, 5))


class FakeWorker:
    """A VLLMWeightSyncClient that plays the vLLM worker: joins the gloo group on init
    and receives the packed broadcasts exactly as GlooWeightTransferEngine does."""

    def __init__(self, *, refuse_init: bool = False, hang_update: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.refuse_init = refuse_init
        self.hang_update = hang_update
        self.release = threading.Event()
        self.group: Any = None
        self.buffer_bytes = 0
        self.received: dict[str, torch.Tensor] = {}
        self.version: str | None = None

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.calls.append(("init", init_info))
        if self.refuse_init:
            raise RuntimeError("500 Server Error: init refused")
        info = GlooWeightTransferInitInfo(**init_info)
        self.buffer_bytes = info.packed_buffer_size_bytes
        self._store, self.group = _open_group(info.master_address, info.master_port,
                                              info.rank_offset, info.world_size, 30.0,
                                              master=False)

    def start_weight_update(self) -> None:
        self.calls.append(("start", None))

    def update_weights(self, update_info: Any) -> None:
        self.calls.append(("update", update_info))
        if self.hang_update:
            self.release.wait(30)
            return
        names, dtypes, shapes = (update_info["names"], update_info["dtype_names"],
                                 update_info["shapes"])
        sizes = [nbytes_of(d, s) for d, s in zip(dtypes, shapes, strict=True)]
        for idx in plan_buffers(sizes, self.buffer_bytes):
            buf = torch.empty(sum(sizes[i] for i in idx), dtype=torch.uint8)
            _broadcast(self.group, buf)
            off = 0
            for i in idx:
                raw = buf[off:off + sizes[i]]
                off += sizes[i]
                self.received[names[i]] = raw.view(getattr(torch, dtypes[i])).reshape(shapes[i])

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.calls.append(("finish", weight_version))
        self.version = weight_version


def _adapter(worker: FakeWorker, **kw: Any) -> TransferAdapter:
    kw.setdefault("headroom", lambda: None)
    kw.setdefault("init_info", lambda: GlooTrainerInitInfo(packed_buffer_size_bytes=64 * 1024,
                                                           timeout_s=20.0, rank=0))
    return TransferAdapter(SimAdapter(SimEngine("ckpt-1")), client=worker, **kw)


def test_plan_buffers_cuts_alike() -> None:
    assert plan_buffers([10, 10, 10], 25) == [[0, 1], [2]]
    assert plan_buffers([100, 1, 1], 10) == [[0], [1, 2]]
    assert plan_buffers([], 10) == []


def test_register_is_idempotent() -> None:
    register()
    register()
    from vllm.distributed.weight_transfer import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    assert "gloo" in WeightTransferEngineFactory._registry
    assert "gloo" in WeightTransferTrainerFactory._registry


def test_full_transfer_moves_every_byte_and_finalises_with_the_label(tmp_path: Path) -> None:
    d = _ckpt(tmp_path / "v2", 2.0)
    worker = FakeWorker()
    ev = _adapter(worker).mutate(_target(d, label="v2-gen2"), dl())
    assert ev.outcome is MutationOutcome.COMPLETED, ev
    assert [c[0] for c in worker.calls] == ["init", "start", "update", "finish"]
    assert worker.version == "v2-gen2"  # vLLM's trainer finalises with no version
    for name, t in CheckpointSource(d):
        assert torch.equal(worker.received[name], t), name
    assert ev.bytes_moved == sum(t.numel() * 4 for _n, t in CheckpointSource(d))


def test_target_aware_finalise() -> None:
    sent: list[str | None] = []

    class Inner:
        def finish_weight_update(self, weight_version: str | None = None) -> None:
            sent.append(weight_version)

    c = TargetAwareClient(Inner())
    with pytest.raises(AdapterError):
        c.finish_weight_update()  # no pending target: nothing to finalise
    t = WeightTarget(2, "gen2", "id2", "/x", (1,), (2,))
    c.set_pending(t)
    with pytest.raises(AdapterError, match="not finalised"):
        c.finish_weight_update("someone-else")
    assert sent == []  # a mismatch is refused, never forwarded nor papered over
    c.finish_weight_update()
    c.finish_weight_update("gen2")
    assert sent == ["gen2", "gen2"] and c.log.finalised_label == "gen2"


def test_identity_mismatch_refused_before_any_byte(tmp_path: Path) -> None:
    a = _ckpt(tmp_path / "a", 1.0)
    b = _ckpt(tmp_path / "b", 2.0)
    worker = FakeWorker()
    ad = _adapter(worker, source_for=lambda t: CheckpointSource(a))  # the source holds A
    with pytest.raises(AdapterError) as ei:
        ad.mutate(_target(b), dl())  # the target declares B
    assert ei.value.proven_no_effect and "refused before any byte" in str(ei.value)
    assert worker.calls == []


def test_metadata_mismatch_refused_before_any_byte(tmp_path: Path) -> None:
    b = _ckpt(tmp_path / "b", 2.0)
    other = _ckpt(tmp_path / "o", 2.0, {"a.weight": (8, 4), "b.bias": (8,),
                                         "c.weight": (300, 200)})
    worker = FakeWorker()
    # Declared provenance equal to the target's identity, but the shapes disagree.
    ad = _adapter(worker, source_for=lambda t: CheckpointSource(
        other, provenance=checkpoint_identity(b)))
    with pytest.raises(AdapterError, match=r"a\.weight") as ei:
        ad.mutate(_target(b), dl())
    assert ei.value.proven_no_effect and worker.calls == []


def test_device_check_with_injected_lookup(tmp_path: Path) -> None:
    d = _ckpt(tmp_path / "v2", 2.0)
    current = {"dev": 1}
    worker = FakeWorker()
    ad = _adapter(worker, device_lookup=lambda: current["dev"], device_select=None)
    assert ad.device == 1
    current["dev"] = 0  # the calling thread's current device is not the driver's
    with pytest.raises(AdapterError, match=r"device 1.*current device is 0") as ei:
        ad.mutate(_target(d), dl())
    assert ei.value.proven_no_effect and worker.calls == []
    current["dev"] = 1
    assert ad.mutate(_target(d), dl()).outcome is MutationOutcome.COMPLETED


def test_device_pinned_in_the_calling_thread(tmp_path: Path) -> None:
    """The runner calls mutate() on its own thread (current device 0): the adapter pins
    the device it was created on in that thread, then checks it."""
    d = _ckpt(tmp_path / "v2", 2.0)
    current = {"dev": 1}
    selected: list[int | None] = []

    def select(dev: int | None) -> None:
        selected.append(dev)
        current["dev"] = dev  # type: ignore[assignment]

    worker = FakeWorker()
    ad = _adapter(worker, device_lookup=lambda: current["dev"], device_select=select)
    current["dev"] = 0
    assert ad.mutate(_target(d), dl()).outcome is MutationOutcome.COMPLETED
    assert selected == [1]


def test_headroom_refusal(tmp_path: Path) -> None:
    d = _ckpt(tmp_path / "v2", 2.0)
    worker = FakeWorker()
    with pytest.raises(AdapterError, match="bytes free") as ei:
        _adapter(worker, headroom=lambda: 1000).mutate(_target(d), dl())
    assert ei.value.proven_no_effect and worker.calls == []


def test_init_refused_is_proven_no_effect(tmp_path: Path) -> None:
    d = _ckpt(tmp_path / "v2", 2.0)
    worker = FakeWorker(refuse_init=True)
    t0 = time.monotonic()
    with pytest.raises(AdapterError, match="before the session started") as ei:
        _adapter(worker).mutate(_target(d), dl())
    assert ei.value.proven_no_effect and [c[0] for c in worker.calls] == ["init"]
    assert time.monotonic() - t0 < 5.0  # not the rendezvous timeout


def test_hung_collective_is_ambiguous_within_the_deadline(tmp_path: Path) -> None:
    d = _ckpt(tmp_path / "v2", 2.0)
    worker = FakeWorker(hang_update=True)
    ad = _adapter(worker, policy=TransferPolicy(base_s=0.5, floor_bytes_per_s=1e9))
    t0 = time.monotonic()
    ev = ad.mutate(_target(d), dl())
    took = time.monotonic() - t0
    worker.release.set()
    deadline = ad.policy.deadline(1 << 20)  # above the bytes of this checkpoint
    assert ev.outcome is MutationOutcome.AMBIGUOUS and "not retried" in ev.observed
    assert 0.5 <= took < deadline + LATE_S  # released only after it returned
    assert ad.stuck and "still running" in ad.stuck[0]
    assert [c[0] for c in worker.calls].count("update") == 1  # never retried


def test_runner_latches_tainted_on_a_hung_transfer(tmp_path: Path) -> None:
    from rolloutcore.adapters.sim import sim_target

    d = _ckpt(tmp_path / "v2", 2.0)
    engine = SimEngine("ckpt-1", label="rc-1")
    worker = FakeWorker(hang_update=True)
    ad = TransferAdapter(SimAdapter(engine), client=worker, headroom=lambda: None,
                         init_info=lambda: GlooTrainerInitInfo(timeout_s=20.0, rank=0),
                         policy=TransferPolicy(base_s=0.6, floor_bytes_per_s=1e12))
    policy = RunnerPolicy(step_timeout_s=2.0, retries=0, mutation_base_s=1.0,
                          mutation_floor_bytes_per_s=1e12)
    runner = LifecycleRunner(Controller(trace=Journal(tmp_path / "j.jsonl", fsync=False)),
                             ad, policy)
    assert runner.bootstrap(sim_target(1, "ckpt-1")).trigger == "bootstrap_ok"
    target = replace(_target(d), probe_prompt=(1, 2, 3), probe_tokens=(4, 5))
    t0 = time.monotonic()
    report = runner.update(target)
    took = time.monotonic() - t0
    worker.release.set()
    assert report.final_phase is Phase.TAINTED and not report.published
    assert took < policy.mutation_deadline(target) + LATE_S
    assert runner.controller.control.committed == 1
    with pytest.raises(IllegalTransition):
        runner.controller.admit("late")
