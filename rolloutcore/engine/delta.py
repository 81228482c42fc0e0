"""Delta updates: a directory that carries only the tensors that changed since a base
generation, and the identities of both.

A delta is applied on top of the base the engine holds (its worker keeps a host copy of
the weights it last installed from a staging): the result's identity is computed over
every tensor, unchanged ones included, with the one identity definition of
:mod:`rolloutcore.engine.identity`, so a delta-staged generation reads exactly as the same
generation staged in full. A delta whose base is not what a rank holds is refused before
anything is installed.

Layout: ``delta.safetensors`` (the changed tensors, whole), ``delta.json`` (``base``,
``identity``: the full target's, ``changed``, ``tensors``: how many the target has) and
the target's ``references.json`` (its probe reference).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rolloutcore.engine.identity import (
    CheckpointError,
    checkpoint_entries,
    checkpoint_identity,
    iter_tensor_bytes,
    write_safetensors,
)

DELTA_FILE = "delta.json"
DELTA_TENSORS = "delta.safetensors"
REFERENCES = "references.json"


@dataclass(frozen=True)
class DeltaInfo:
    base: str  # identity of the generation the delta applies to
    identity: str  # identity of the full result
    changed: int  # tensors the delta carries
    tensors: int  # tensors the result has
    nbytes: int  # bytes the delta carries


def read_delta(directory: str | os.PathLike[str]) -> DeltaInfo | None:
    """The delta a directory holds (None: it is a full checkpoint)."""
    p = Path(directory) / DELTA_FILE
    if not p.is_file():
        return None
    try:
        d = json.loads(p.read_text())
        return DeltaInfo(str(d["base"]), str(d["identity"]), int(d["changed"]),
                         int(d["tensors"]), int(d["nbytes"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{p}: not a delta description: {e}") from None


def write_delta(base: str | os.PathLike[str], target: str | os.PathLike[str],
                out: str | os.PathLike[str]) -> DeltaInfo:
    """Write the delta from checkpoint ``base`` to checkpoint ``target`` into ``out``
    (created): the tensors whose bytes differ. Both must have the same manifest."""
    b, t = checkpoint_entries(base), checkpoint_entries(target)
    if [(e.name, e.dtype, e.shape) for e in b] != [(e.name, e.dtype, e.shape) for e in t]:
        raise CheckpointError(f"{base} and {target} have different manifests: a delta "
                              "carries bytes, not shapes")
    changed: list[tuple[str, str, tuple[int, ...], bytes]] = []
    for (_eb, db), (et, dt) in zip(iter_tensor_bytes(b), iter_tensor_bytes(t), strict=True):
        if db != dt:
            changed.append((et.name, et.dtype, et.shape, dt))
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=False)
    write_safetensors(dest / DELTA_TENSORS, changed)
    info = DeltaInfo(checkpoint_identity(base), checkpoint_identity(target), len(changed),
                     len(t), sum(len(c[3]) for c in changed))
    (dest / DELTA_FILE).write_text(json.dumps(info.__dict__, indent=1) + "\n")
    refs = Path(target) / REFERENCES
    if refs.is_file():
        shutil.copyfile(refs, dest / REFERENCES)
    return info


__all__ = ["DELTA_FILE", "DELTA_TENSORS", "DeltaInfo", "read_delta", "write_delta"]
