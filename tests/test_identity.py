"""Weight identity: the seed's pitfall (equal manifests, different weights) is told apart."""

from __future__ import annotations

import struct
from pathlib import Path

from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models
from rolloutcore.engine.identity import (
    checkpoint_identity,
    checkpoint_nbytes,
    manifest_digest,
    write_safetensors,
)


def _ckpt(d: Path, values: list[float]) -> Path:
    d.mkdir()
    data = struct.pack(f"<{len(values)}f", *values)
    write_safetensors(d / "model.safetensors", [
        ("a.weight", "F32", (2, 2), data), ("b.bias", "F32", (4,), data)])
    return d


def test_equal_manifests_different_identities(tmp_path: Path) -> None:
    a = _ckpt(tmp_path / "a", [1, 2, 3, 4])
    b = _ckpt(tmp_path / "b", [1, 2, 3, -4])
    assert manifest_digest(a) == manifest_digest(b)
    assert checkpoint_identity(a) != checkpoint_identity(b)
    assert checkpoint_nbytes(a) == 32


def test_same_bytes_same_identity_wherever_they_live(tmp_path: Path) -> None:
    a = _ckpt(tmp_path / "a", [1, 2, 3, 4])
    b = _ckpt(tmp_path / "b", [1, 2, 3, 4])
    assert checkpoint_identity(a) == checkpoint_identity(b)


def test_tiny_models_v1_v1neg() -> None:
    models = build_models(DEFAULT_OUT)  # idempotent; never an order-dependent skip
    dirs = {n: models[n] for n in ("v1", "v1neg", "v2")}
    assert len({manifest_digest(d) for d in dirs.values()}) == 1
    assert len({checkpoint_identity(d) for d in dirs.values()}) == 3
