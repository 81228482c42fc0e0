"""Publishing the trainer's live weights to the fleet: ``publish(model, label)``.

The weights are snapshotted (what is sent cannot change under the transfer), their
identity is the digest of those bytes, and the probe reference is computed with those
very weights on the trainer's side. The snapshot is sent through the fleet's transfer
adapters (gloo on CPU, NCCL on GPU: ``source_for`` is :meth:`LiveSources.source_for`)
under one fleet update (or roll): each member's validation compares the digest its
engine computed from the bytes it loaded with the target's identity, and its probe with
the reference. Published only when the fleet committed it; otherwise
:class:`PublishError` carries the fleet's report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rolloutcore.engine.identity import CheckpointError, manifest_difference
from rolloutcore.errors import Refused
from rolloutcore.rl.weights import (
    LiveSources,
    LiveWeights,
    LiveWeightsError,
    probe_reference,
    snapshot,
    state_identity,
    state_manifest,
)

if TYPE_CHECKING:
    from rolloutcore.fleet import Fleet, FleetCycleReport
    from rolloutcore.gateway.core import Gateway


class PublishError(Refused, RuntimeError):
    """The fleet did not commit the weights; ``report`` says what each member did."""

    def __init__(self, message: str, report: FleetCycleReport | None = None) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class Published:
    generation: int
    identity: str
    label: str
    committed_on: tuple[str, ...]
    quarantined: tuple[str, ...]
    seconds: float


class Publisher:
    """Publishes snapshots of a trainer's model to ``fleet`` (through ``gateway`` when
    the fleet is behind one, so that its admin worker and metrics see the update)."""

    def __init__(self, fleet: Fleet, sources: LiveSources, *, probe_prompt: Sequence[int],
                 probe_tokens: int, eos_id: int | None,
                 reference_model: Callable[[], torch.nn.Module] | None = None,
                 gateway: Gateway | None = None) -> None:
        self.fleet, self.sources, self.gateway = fleet, sources, gateway
        self.probe_prompt = tuple(probe_prompt)
        self.probe_tokens = probe_tokens
        self.eos_id = eos_id
        self.reference_model = reference_model  # for a state dict: a model to load it into

    def _reference(self, model_or_state: torch.nn.Module | Mapping[str, torch.Tensor],
                   tensors: dict[str, torch.Tensor]) -> tuple[tuple[int, ...],
                                                              tuple[float, ...]]:
        model: Any = model_or_state
        if not isinstance(model_or_state, torch.nn.Module):
            if self.reference_model is None:
                raise ValueError("publishing a state dict needs reference_model (a model "
                                 "to compute the probe reference with)")
            model = self.reference_model()
            model.load_state_dict(tensors, strict=True)
        with torch.no_grad():
            return probe_reference(model, self.probe_prompt, self.probe_tokens, self.eos_id)

    def _check_manifest(self, tensors: Mapping[str, torch.Tensor], label: str) -> None:
        """The snapshot must have the served model's tensors, each with its dtype and
        shape: a model of another shape (an embedding with extra rows) would fail in the
        middle of the transfer on every member (ambiguous: all quarantined). Compared with
        the committed generation's weights, which the engines serve."""
        served = self.fleet.committed_target()
        if served is None:
            raise PublishError(f"{label}: the fleet knows no committed generation to compare "
                               "the snapshot with: nothing was sent")
        try:
            expected = self.sources.manifest_of(served)
        except (LiveWeightsError, CheckpointError) as e:
            raise PublishError(f"{label}: cannot read the served generation's manifest "
                               f"({e}): nothing was sent") from None
        diff = manifest_difference(expected, state_manifest(tensors))
        if diff is not None:
            raise PublishError(f"{label}: the snapshot does not match the served model "
                               f"(generation {served.generation}, {served.label}): {diff}: "
                               "nothing was sent")

    def publish(self, model_or_state: torch.nn.Module | Mapping[str, torch.Tensor],
                label: str) -> Published:
        if not isinstance(label, str) or not label:
            raise ValueError("label must be a non-empty string")
        t0 = time.perf_counter()
        tensors = snapshot(model_or_state)
        self._check_manifest(tensors, label)  # before anything is sent or journalled
        weights = LiveWeights(label, state_identity(tensors), tensors)
        tokens, logprobs = self._reference(model_or_state, tensors)
        target = weights.target(self.fleet.committed + 1, self.probe_prompt, tokens, logprobs)
        self.sources.add(weights, target.generation)
        if self.gateway is not None:
            report = self.gateway.start_update_to(target).result()
        else:
            report = self.fleet.update(target)
        # Every member holds at least the oldest generation still committed on one of
        # them (a quarantined member's included): older snapshots are never sent again.
        self.sources.prune(min(m.controller.control.committed
                               for m in self.fleet.members.values()))
        if not report.published:
            raise PublishError(f"generation {target.generation} ({label}) was not published: "
                               f"committed on {report.committed_on}, quarantined "
                               f"{report.quarantined}, aborted={report.aborted}", report)
        return Published(target.generation, weights.identity, label,
                         tuple(report.committed_on), tuple(report.quarantined),
                         time.perf_counter() - t0)


__all__ = ["PublishError", "Published", "Publisher"]
