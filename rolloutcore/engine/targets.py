"""What an update installs, described from a checkpoint directory.

A checkpoint directory RolloutCore installs holds its safetensors files and
``references.json``: the probe the engine must reproduce once it holds these weights,
computed on the source side with the same weights (the trainer's job):
``{"probes": [{"name", "prompt_token_ids", "output_token_ids", "prompt_logprobs"}, ...]}``
(``prompt_logprobs``: the log-probability of each prompt token after the first, one
prefill; the scored probe compares every position with it). The tiny models of
:mod:`rolloutcore.conformance.fixtures.tiny_model` are written this way.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.engine.delta import read_delta
from rolloutcore.engine.identity import checkpoint_identity, checkpoint_nbytes, with_adapter
from rolloutcore.errors import BadInput

REFERENCES = "references.json"
ADAPTER_CONFIG = "adapter_config.json"  # what makes a directory a (PEFT) LoRA adapter
#: The probe used by default: a prompt longer than two prefix-cache blocks.
PROBE = "long"


class TargetError(BadInput, ValueError):
    """A checkpoint directory that does not describe a target (no references, no probe)."""


def load_references(directory: str | Path) -> dict[str, Any]:
    """The parsed ``references.json`` of a checkpoint directory."""
    p = Path(directory) / REFERENCES
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise TargetError(f"{p}: missing (the probe reference of the checkpoint)") from None
    except (OSError, ValueError) as e:
        raise TargetError(f"{p}: unreadable: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("probes"), list):
        raise TargetError(f"{p}: no probes")
    return data


def check_checkpoint(path: str | Path, probe: str = PROBE) -> None:
    """Raise :class:`TargetError` unless ``path`` describes a target: safetensors files and a
    probe reference (cheap: nothing is digested)."""
    from rolloutcore.engine.identity import CheckpointError, safetensors_files

    try:
        safetensors_files(path)
    except CheckpointError as e:
        raise TargetError(str(e)) from None
    if not any(p.get("name") == probe for p in load_references(path)["probes"]
               if isinstance(p, dict)):
        raise TargetError(f"{path}: {REFERENCES} has no probe named {probe!r}")


def checkpoint_target(path: str | Path, generation: int, label: str, *,
                      identity: str | None = None, probe: str = PROBE) -> WeightTarget:
    """The target installing checkpoint ``path`` as ``generation`` under ``label``: its
    content identity (computed unless given), its size, and its probe reference."""
    entry = next((p for p in load_references(path)["probes"] if p.get("name") == probe), None)
    if entry is None:
        raise TargetError(f"{path}: {REFERENCES} has no probe named {probe!r}")
    delta = read_delta(path)  # a delta directory: the identity of the full result
    try:
        return WeightTarget(
            generation=generation, label=label,
            identity=identity or (delta.identity if delta is not None
                                  else checkpoint_identity(path)),
            source=str(Path(path).resolve()),
            probe_prompt=tuple(entry["prompt_token_ids"]),
            probe_tokens=tuple(entry["output_token_ids"]),
            nbytes=delta.nbytes if delta is not None else checkpoint_nbytes(path),
            probe_logprobs=tuple(entry["prompt_logprobs"]) if "prompt_logprobs" in entry
            else None)
    except (KeyError, TypeError) as e:
        raise TargetError(f"{path}: malformed probe {probe!r}: {e}") from None


def adapter_target(adapter_dir: str | Path, name: str, generation: int, label: str, *,
                   base_identity: str, probe: str = PROBE) -> WeightTarget:
    """The target serving the LoRA adapter at ``adapter_dir`` under ``name`` on base weights
    ``base_identity``; its probe reference (through the adapter) is the adapter's own
    ``references.json``."""
    base = checkpoint_target(adapter_dir, generation, label,
                             identity=checkpoint_identity(adapter_dir), probe=probe)
    return dataclasses.replace(base, identity=with_adapter(base_identity, base.identity),
                               adapter=name)


def target_factory(adapter: str | None = None, base: str | Path | None = None
                   ) -> Callable[[str, int, str], WeightTarget]:
    """How a fleet describes the generation a directory names: a checkpoint, or (with
    ``adapter``, the name engines serve the policy under, on the base checkpoint
    ``base``) a LoRA adapter directory (``adapter_config.json``) on those base weights."""
    base_identity: list[str] = []  # digested once, when an adapter first needs it

    def target_of(source: str, generation: int, label: str) -> WeightTarget:
        if not (Path(source) / ADAPTER_CONFIG).is_file():
            return checkpoint_target(source, generation, label)
        if adapter is None or base is None:
            raise TargetError(f"{source}: a LoRA adapter, but the fleet serves no adapter "
                              "(the fleet file has no [adapter])")
        if not base_identity:
            base_identity.append(checkpoint_identity(base))
        return adapter_target(source, adapter, generation, label,
                              base_identity=base_identity[0])

    return target_of
