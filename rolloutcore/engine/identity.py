"""Content identity of a checkpoint: one implementation for the source and the engine.

The identity is a sha256 over every tensor of a safetensors checkpoint in sorted name
order: name, dtype, shape and raw bytes, each length-framed so that no two different
checkpoints serialise alike. The manifest digest covers names, dtypes and shapes only
(two checkpoints of one architecture share it). The trainer side calls
:func:`checkpoint_identity` on a directory; the engine side
(:mod:`rolloutcore.adapters.vllm_worker`) feeds the very bytes it loads through the same
:class:`IdentityHasher`, so the two agree exactly when the engine loaded those bytes.

Pure Python (json, struct, hashlib): the safetensors format is an 8-byte little-endian
header length, a JSON header ``{name: {dtype, shape, data_offsets}}`` and the data.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rolloutcore.errors import BadInput
from rolloutcore.inputs import directory_problem

DOMAIN = b"rolloutcore-weights-v1\n"
MANIFEST_DOMAIN = b"rolloutcore-manifest-v1\n"
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit on the JSON header


class CheckpointError(BadInput, ValueError):
    """The directory is not a readable safetensors checkpoint."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str  # safetensors dtype string: F32, BF16, ...
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute byte offset in ``file``
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def _u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def _frame(text: str) -> bytes:
    raw = text.encode()
    return _u64(len(raw)) + raw


class IdentityHasher:
    """Streaming identity: ``add`` tensors in sorted name order, then ``hexdigest``."""

    def __init__(self, *, manifest_only: bool = False) -> None:
        self._h = hashlib.sha256(MANIFEST_DOMAIN if manifest_only else DOMAIN)
        self._manifest_only = manifest_only
        self._last: str | None = None
        self.tensors = 0
        self.nbytes = 0

    def add(self, name: str, dtype: str, shape: Sequence[int],
            data: bytes | bytearray | memoryview | None = None) -> None:
        if self._last is not None and name <= self._last:
            raise ValueError(f"tensors must come in strictly sorted name order: {name!r} "
                             f"after {self._last!r}")
        self._last = name
        h = self._h
        h.update(_frame(name))
        h.update(_frame(dtype))
        h.update(_u64(len(shape)))
        for d in shape:
            h.update(_u64(int(d)))
        self.tensors += 1
        if self._manifest_only:
            return
        if data is None:
            raise ValueError("the weights identity needs the tensor bytes")
        view = memoryview(data).cast("B")
        h.update(_u64(view.nbytes))
        h.update(view)
        self.nbytes += view.nbytes

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def safetensors_files(directory: str | os.PathLike[str]) -> list[Path]:
    d = Path(directory)
    problem = directory_problem(d)
    if problem:
        raise CheckpointError(problem)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{d}: no *.safetensors file")
    return files


def read_header(path: Path) -> list[TensorEntry]:
    """The tensors of one safetensors file (offsets checked against the file size)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        raw_len = fh.read(8)
        if len(raw_len) != 8:
            raise CheckpointError(f"{path}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw_len)
        if n > _MAX_HEADER or 8 + n > size:
            raise CheckpointError(f"{path}: header length {n} does not fit the file ({size} B)")
        try:
            header = json.loads(fh.read(n))
        except ValueError as e:
            raise CheckpointError(f"{path}: header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    base = 8 + n
    out: list[TensorEntry] = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(meta["dtype"])
            shape = tuple(int(d) for d in meta["shape"])
            begin, end = (int(x) for x in meta["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: malformed entry for {name!r}") from None
        if not 0 <= begin <= end or base + end > size:
            raise CheckpointError(f"{path}: {name!r} data [{begin}, {end}) lies outside the "
                                  f"file ({size - base} data bytes)")
        out.append(TensorEntry(name, dtype, shape, path, base + begin, base + end))
    return out


def checkpoint_entries(directory: str | os.PathLike[str]) -> list[TensorEntry]:
    """Every tensor of a checkpoint directory, sorted by name; duplicate names refused."""
    entries: dict[str, TensorEntry] = {}
    for f in safetensors_files(directory):
        for e in read_header(f):
            if e.name in entries:
                raise CheckpointError(f"{directory}: tensor {e.name!r} appears twice")
            entries[e.name] = e
    return [entries[k] for k in sorted(entries)]


#: What a set of tensors is, bytes apart: (name, safetensors dtype code, shape), by name.
Manifest = list[tuple[str, str, tuple[int, ...]]]


def checkpoint_manifest(directory: str | os.PathLike[str]) -> Manifest:
    return [(e.name, e.dtype, tuple(e.shape)) for e in checkpoint_entries(directory)]


def manifest_difference(declared: Manifest, actual: Manifest) -> str | None:
    """The first disagreement between two manifests, in words (None: they agree):
    a tensor ``actual`` lacks, one it has that ``declared`` does not, or the first by name
    whose dtype or shape differs."""
    d, a = {n: (t, s) for n, t, s in declared}, {n: (t, s) for n, t, s in actual}
    missing, extra = sorted(d.keys() - a.keys()), sorted(a.keys() - d.keys())
    if missing:
        return f"source lacks {len(missing)} tensor(s), e.g. {missing[0]!r}"
    if extra:
        return f"source has {len(extra)} undeclared tensor(s), e.g. {extra[0]!r}"
    for name in sorted(d):
        if d[name] != a[name]:
            return f"{name!r}: declared {d[name][0]} {d[name][1]}, source {a[name][0]} {a[name][1]}"
    return None


def iter_tensor_bytes(entries: Iterable[TensorEntry]) -> Iterator[tuple[TensorEntry, bytes]]:
    """Each entry with its raw bytes, read from disk (one open file at a time)."""
    current: Path | None = None
    fh = None
    try:
        for e in entries:
            if e.file != current:
                if fh is not None:
                    fh.close()
                fh = open(e.file, "rb")  # noqa: SIM115 - closed below
                current = e.file
            assert fh is not None
            fh.seek(e.start)
            data = fh.read(e.nbytes)
            if len(data) != e.nbytes:
                raise CheckpointError(f"{e.file}: {e.name!r} is truncated")
            yield e, data
    finally:
        if fh is not None:
            fh.close()


def manifest_digest(directory: str | os.PathLike[str]) -> str:
    """sha256 over (name, dtype, shape) of every tensor, in sorted name order."""
    h = IdentityHasher(manifest_only=True)
    for e in checkpoint_entries(directory):
        h.add(e.name, e.dtype, e.shape)
    return h.hexdigest()


def checkpoint_identity(directory: str | os.PathLike[str]) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor, in sorted name order."""
    h = IdentityHasher()
    for e, data in iter_tensor_bytes(checkpoint_entries(directory)):
        h.add(e.name, e.dtype, e.shape, data)
    return h.hexdigest()


#: Joins the base weights' identity and a LoRA adapter's (both digests as above).
ADAPTER_JOIN = "+lora:"
#: The adapter part of an identity when vLLM serves an adapter RolloutCore did not stage
#: (followed by the paths it was loaded from): it equals no target's identity.
UNSTAGED = "unstaged:"


def with_adapter(base: str, adapter: str) -> str:
    """The identity of base weights served through a LoRA adapter: a rollout binds to
    both (a new adapter on the same base is another policy)."""
    return f"{base}{ADAPTER_JOIN}{adapter}"


def checkpoint_nbytes(directory: str | os.PathLike[str]) -> int:
    return sum(e.nbytes for e in checkpoint_entries(directory))


def safetensors_header(tensors: Iterable[tuple[str, str, Sequence[int], Any]]) -> bytes:
    """The safetensors framing of raw tensors (name, dtype, shape, bytes-like), their bytes
    back to back in the order given: the 8-byte header length, then the JSON header."""
    header: dict[str, object] = {}
    offset = 0
    for name, dtype, shape, data in tensors:
        n = memoryview(data).nbytes
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format aligns the data section to 8 bytes
    return _u64(len(blob)) + blob


def write_safetensors(path: str | os.PathLike[str],
                      tensors: Iterable[tuple[str, str, Sequence[int], bytes]]) -> None:
    """Write a safetensors file from raw tensors (test fixtures: torn checkpoints)."""
    tensors = list(tensors)
    with open(path, "wb") as fh:
        fh.write(safetensors_header(tensors))
        for _name, _dtype, _shape, data in tensors:
            fh.write(data)


__all__ = ["CheckpointError", "IdentityHasher", "TensorEntry", "checkpoint_entries",
           "checkpoint_identity", "checkpoint_nbytes", "iter_tensor_bytes", "manifest_digest",
           "read_header", "safetensors_files", "safetensors_header", "write_safetensors"]
