"""WeightVersion / WeightIdentity: the seed's pitfall (equal manifests, different weights)
is told apart; generations only go forward."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from rolloutcore.conformance.tiny_model import DEFAULT_OUT
from rolloutcore.identity import write_safetensors
from rolloutcore.versions import Provenance, VersionLedger, WeightIdentity, WeightVersion


def _ckpt(d: Path, values: list[float]) -> Path:
    d.mkdir()
    data = struct.pack(f"<{len(values)}f", *values)
    write_safetensors(d / "model.safetensors", [
        ("a.weight", "F32", (2, 2), data), ("b.bias", "F32", (4,), data)])
    return d


def test_equal_manifests_different_identities(tmp_path: Path) -> None:
    a = WeightIdentity.of_checkpoint(_ckpt(tmp_path / "a", [1, 2, 3, 4]), run="r", step=10)
    b = WeightIdentity.of_checkpoint(_ckpt(tmp_path / "b", [1, 2, 3, -4]), run="r", step=10)
    assert a.same_architecture(b) and a.manifest == b.manifest
    assert not a.same_weights(b) and a != b and a.key != b.key
    assert a.nbytes == 32


def test_provenance_is_declared_not_identity(tmp_path: Path) -> None:
    a = WeightIdentity.of_checkpoint(_ckpt(tmp_path / "a", [1, 2, 3, 4]), run="r1", step=1)
    b = WeightIdentity.of_checkpoint(_ckpt(tmp_path / "b", [1, 2, 3, 4]), run="r2", step=2)
    assert a == b and hash(a) == hash(b)  # same bytes are the same weights
    assert a.provenance != b.provenance
    assert a.as_json()["provenance"] == {"checkpoint": str(tmp_path / "a"), "run": "r1",
                                         "step": 1}


def test_tiny_models_v1_v1neg() -> None:
    if not (DEFAULT_OUT / "v1neg" / "model.safetensors").exists():
        pytest.skip(f"tiny models not built in {DEFAULT_OUT}")
    v1 = WeightIdentity.of_checkpoint(DEFAULT_OUT / "v1")
    neg = WeightIdentity.of_checkpoint(DEFAULT_OUT / "v1neg")
    v2 = WeightIdentity.of_checkpoint(DEFAULT_OUT / "v2")
    assert v1.manifest == neg.manifest == v2.manifest
    assert len({v1.content, neg.content, v2.content}) == 3


def test_bad_digests_and_versions_refused() -> None:
    with pytest.raises(ValueError, match="64 lowercase hex"):
        WeightIdentity("x", "a" * 64, Provenance("c"))
    ident = WeightIdentity("a" * 64, "b" * 64, Provenance("c"))
    with pytest.raises(ValueError, match="generation"):
        WeightVersion(0, "v0", ident)
    with pytest.raises(ValueError, match="label"):
        WeightVersion(1, "", ident)
    with pytest.raises(ValueError, match="step"):
        Provenance("c", step=-1)


def test_ledger_is_monotonic_and_targets_carry_the_content_digest() -> None:
    ledger = VersionLedger()
    i1 = WeightIdentity("a" * 64, "b" * 64, Provenance("/ckpt/1"), nbytes=10)
    i2 = WeightIdentity("a" * 64, "c" * 64, Provenance("/ckpt/2"), nbytes=10)
    v1 = ledger.next_version("v1", i1)
    v2 = ledger.next_version("v2", i2)
    assert (v1.generation, v2.generation) == (1, 2) and ledger.latest == v2
    with pytest.raises(ValueError, match="only go forward"):
        ledger.add(WeightVersion(2, "again", i1))
    with pytest.raises(ValueError, match="only go forward"):
        ledger.add(WeightVersion(1, "back", i1))
    t = v2.target((1, 2), (3,))
    assert (t.generation, t.label, t.identity, t.source, t.nbytes) == (
        2, "v2", "c" * 64, "/ckpt/2", 10)
