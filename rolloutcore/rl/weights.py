"""The trainer's live weights as a fleet target: a snapshot of the tensors, its identity,
and the probe reference computed with those very weights.

The identity is :class:`rolloutcore.engine.identity.IdentityHasher` over the snapshot in sorted
name order with safetensors dtype codes: exactly :func:`checkpoint_identity` of the same
tensors written as a checkpoint, and exactly what the engine's transfer backend digests as
it receives them. So "identity" is the digest of the bytes sent, and validation compares it
with the digest each engine computed from what it loaded.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.engine.identity import IdentityHasher, Manifest, checkpoint_manifest
from rolloutcore.errors import BadInput
from rolloutcore.rl.reference import greedy_reference, prompt_logprobs

#: torch dtype -> safetensors dtype code (what the identity hashes).
ST_CODES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}


class LiveWeightsError(BadInput, ValueError):
    """A model or state dict that cannot be sent (a tensor of an unsupported dtype...)."""


def snapshot(model_or_state: torch.nn.Module | Mapping[str, torch.Tensor]
             ) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU copies of the weights, in sorted name order: what is sent
    does not change while the trainer goes on training."""
    state = (model_or_state.state_dict() if isinstance(model_or_state, torch.nn.Module)
             else model_or_state)
    out: dict[str, torch.Tensor] = {}
    for name in sorted(state):
        t = state[name]
        if not isinstance(t, torch.Tensor):
            raise LiveWeightsError(f"{name!r}: not a tensor ({type(t).__name__})")
        if t.dtype not in ST_CODES:
            raise LiveWeightsError(f"{name!r}: dtype {t.dtype} cannot be sent")
        out[name] = t.detach().to("cpu", copy=True).contiguous()
    if not out:
        raise LiveWeightsError("no tensors to send")
    return out


def state_identity(state: Mapping[str, torch.Tensor]) -> str:
    """The content identity of these tensors (see the module's docstring)."""
    h = IdentityHasher()
    for name in sorted(state):
        t = state[name].contiguous()
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        h.add(name, ST_CODES[t.dtype], tuple(t.shape), data)
    return h.hexdigest()


def state_manifest(state: Mapping[str, torch.Tensor]) -> Manifest:
    """Names, dtypes and shapes of these tensors (what the identity frames, bytes apart)."""
    return [(name, ST_CODES[state[name].dtype], tuple(state[name].shape))
            for name in sorted(state)]


def state_nbytes(state: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def probe_reference(model: Any, prompt: Sequence[int], max_tokens: int,
                    eos_id: int | None) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Greedy tokens (EOS masked, as ``min_tokens == max_tokens``) and prompt logprobs of
    ``model``: what an engine holding its weights must reproduce (the scored probe)."""
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        greedy = greedy_reference(model, prompt, max_tokens, eos_id)
        scored = prompt_logprobs(model, prompt)
    finally:
        model.train(was_training)
    return tuple(greedy.token_ids), tuple(scored)


@dataclass(frozen=True)
class LiveWeights:
    """One published (or to-be-published) snapshot of the trainer's weights."""

    label: str
    identity: str
    tensors: dict[str, torch.Tensor]

    @property
    def nbytes(self) -> int:
        return state_nbytes(self.tensors)

    def target(self, generation: int, probe_prompt: Sequence[int],
               probe_tokens: Sequence[int], probe_logprobs: Sequence[float]) -> WeightTarget:
        return WeightTarget(generation=generation, label=self.label, identity=self.identity,
                            source=f"trainer:{self.label}", probe_prompt=tuple(probe_prompt),
                            probe_tokens=tuple(probe_tokens), nbytes=self.nbytes,
                            probe_logprobs=tuple(probe_logprobs))


class LiveSources:
    """The snapshots a fleet may still need, by identity: every generation from the oldest
    one a member still holds (a quarantined member is re-admitted onto its own committed
    generation, then catches up one verified generation at a time) to the one being
    published. The transfer adapters' ``source_for``."""

    def __init__(self) -> None:
        self._by_identity: dict[str, tuple[int, LiveWeights]] = {}
        self._lock = threading.Lock()

    def add(self, weights: LiveWeights, generation: int) -> None:
        with self._lock:
            self._by_identity[weights.identity] = (generation, weights)

    def prune(self, oldest_needed: int) -> int:
        """Forget the snapshots of generations before ``oldest_needed``; how many."""
        with self._lock:
            old = [i for i, (g, _) in self._by_identity.items() if g < oldest_needed]
            for i in old:
                del self._by_identity[i]
            return len(old)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_identity)

    def get(self, identity: str) -> LiveWeights:
        with self._lock:
            held = self._by_identity.get(identity)
        if held is None:
            raise LiveWeightsError(f"no snapshot held for identity {identity[:16]}")
        return held[1]

    def manifest_of(self, target: WeightTarget) -> Manifest:
        """The manifest of the weights ``target`` names: its snapshot's, or its checkpoint
        directory's (the fleet's initial generation). LiveWeightsError if neither is held."""
        with self._lock:
            held = self._by_identity.get(target.identity)
        if held is not None:
            return state_manifest(held[1].tensors)
        if Path(target.source).is_dir():
            return checkpoint_manifest(target.source)
        raise LiveWeightsError(f"no snapshot or checkpoint held for {target.label} "
                               f"({target.identity[:16]})")

    def source_for(self, target: WeightTarget) -> Any:
        """A vLLM ``WeightSource`` over the snapshot the target names; a target that names
        a checkpoint directory (the fleet's initial generation) is read from it."""
        from rolloutcore.adapters.weight_transfer import CheckpointSource, TensorSource

        with self._lock:
            held = self._by_identity.get(target.identity)
        if held is None and Path(target.source).is_dir():
            return CheckpointSource.of(target)
        w = self.get(target.identity)
        return TensorSource(w.tensors, provenance=w.identity)


__all__ = ["LiveSources", "LiveWeights", "LiveWeightsError", "probe_reference", "snapshot",
           "state_identity", "state_manifest", "state_nbytes"]
