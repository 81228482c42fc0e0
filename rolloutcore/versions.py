"""Weight versions and weight identities.

* :class:`WeightVersion` is *which* generation the engine serves: the committed generation,
  a positive integer owned by RolloutCore (monotonic: :class:`VersionLedger` refuses to go
  back or repeat), with its human label.
* :class:`WeightIdentity` is *what* that generation is: the manifest digest (tensor names,
  dtypes, shapes), the content digest of the tensor bytes computed on the source side
  (:func:`rolloutcore.identity.checkpoint_identity`), and declared provenance (checkpoint,
  run, training step), which is recorded but never trusted for equality.

The seed's pitfall: a manifest digest alone cannot tell two checkpoints of one
architecture apart (``models/v1`` and ``models/v1neg`` share it). Identity equality is
content equality; :meth:`WeightIdentity.same_architecture` is the weaker question.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.identity import checkpoint_identity, checkpoint_nbytes, manifest_digest

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Provenance:
    """Declared, not verified: where the weights are said to come from."""

    checkpoint: str
    run: str | None = None
    step: int | None = None

    def __post_init__(self) -> None:
        if self.step is not None and (isinstance(self.step, bool) or self.step < 0):
            raise ValueError(f"provenance step must be a non-negative int, got {self.step!r}")


@dataclass(frozen=True)
class WeightIdentity:
    """What a generation's weights are. Equality and hashing use the two digests only:
    the same bytes declared under another run are the same weights."""

    manifest: str  # sha256 over (name, dtype, shape) of every tensor
    content: str  # sha256 over (name, dtype, shape, bytes) of every tensor (source side)
    provenance: Provenance = field(compare=False)
    nbytes: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        for what, v in (("manifest", self.manifest), ("content", self.content)):
            if not _HEX64.fullmatch(v):
                raise ValueError(f"{what} digest must be 64 lowercase hex digits, got {v!r}")

    @classmethod
    def of_checkpoint(cls, directory: str | os.PathLike[str], *, run: str | None = None,
                      step: int | None = None) -> WeightIdentity:
        """Digest a safetensors checkpoint directory (reads every tensor byte)."""
        d = Path(directory)
        return cls(manifest_digest(d), checkpoint_identity(d), Provenance(str(d), run, step),
                   checkpoint_nbytes(d))

    @property
    def key(self) -> str:
        """The string that bindings, targets and records carry (the content digest)."""
        return self.content

    def same_weights(self, other: WeightIdentity) -> bool:
        return self.content == other.content

    def same_architecture(self, other: WeightIdentity) -> bool:
        """Equal manifests: the weaker question, true for v1 and v1neg alike."""
        return self.manifest == other.manifest

    def short(self) -> str:
        return self.content[:12]

    def as_json(self) -> dict[str, Any]:
        p = self.provenance
        return {"manifest": self.manifest, "content": self.content, "nbytes": self.nbytes,
                "provenance": {"checkpoint": p.checkpoint, "run": p.run, "step": p.step}}


@dataclass(frozen=True)
class WeightVersion:
    """A committed generation and what it is."""

    generation: int
    label: str
    identity: WeightIdentity

    def __post_init__(self) -> None:
        if isinstance(self.generation, bool) or self.generation < 1:
            raise ValueError(f"generation must be an int >= 1, got {self.generation!r}")
        if not self.label:
            raise ValueError("a version needs a label")

    def target(self, probe_prompt: Sequence[int], probe_tokens: Sequence[int],
               source: str | None = None) -> WeightTarget:
        """The runner's update target for this version."""
        return WeightTarget(self.generation, self.label, self.identity.key,
                            source if source is not None else self.identity.provenance.checkpoint,
                            tuple(probe_prompt), tuple(probe_tokens), self.identity.nbytes)

    def as_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "label": self.label,
                "identity": self.identity.as_json()}


class VersionLedger:
    """Generation -> version, strictly increasing. The generation number is RolloutCore's:
    ``next_version`` hands out the successor of the newest one."""

    def __init__(self) -> None:
        self._versions: dict[int, WeightVersion] = {}

    @property
    def latest(self) -> WeightVersion | None:
        return self._versions[max(self._versions)] if self._versions else None

    def next_version(self, label: str, identity: WeightIdentity) -> WeightVersion:
        last = self.latest
        v = WeightVersion(1 if last is None else last.generation + 1, label, identity)
        self.add(v)
        return v

    def add(self, version: WeightVersion) -> None:
        last = self.latest
        if last is not None and version.generation <= last.generation:
            raise ValueError(f"generation {version.generation} is not after the latest "
                             f"({last.generation}): generations only go forward")
        self._versions[version.generation] = version

    def __getitem__(self, generation: int) -> WeightVersion:
        return self._versions[generation]

    def __len__(self) -> int:
        return len(self._versions)


__all__ = ["Provenance", "VersionLedger", "WeightIdentity", "WeightVersion"]
