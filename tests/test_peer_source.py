"""Peer sources (rolloutcore.engine.peer) without an engine: a source serves the bytes of
one identity as a safetensors stream to readers with the token, and a reader gets exactly
those bytes (their identity is the checkpoint's) or an error that says how far it got."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import dying_source, wait_until

from rolloutcore.engine.identity import (
    IdentityHasher,
    checkpoint_entries,
    checkpoint_identity,
    iter_tensor_bytes,
    safetensors_header,
    write_safetensors,
)
from rolloutcore.engine.peer import (
    PEER_PATH,
    TOKEN_HEADER,
    PeerServer,
    PeerSourceError,
    PeerStream,
    PeerTensor,
    is_peer_url,
    peer_url,
)


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[str, list[PeerTensor]]:
    """A small checkpoint (an empty tensor among them), its identity and its tensors."""
    shapes = {"a.weight": (4, 8), "b.bias": (8,), "c.empty": (0,), "d.weight": (64, 32)}
    raw = [(name, "F32", shape, struct.pack(f"<{n}f", *(float(i + k) for k in range(n))))
           for i, (name, shape) in enumerate(sorted(shapes.items()))
           for n in [shape[0] * (shape[1] if len(shape) > 1 else 1)]]
    write_safetensors(tmp_path / "model.safetensors", raw)
    tensors: list[PeerTensor] = [(e.name, e.dtype, e.shape, data) for e, data in
                                 iter_tensor_bytes(checkpoint_entries(tmp_path))]
    return checkpoint_identity(tmp_path), tensors


@pytest.fixture
def source(checkpoint: tuple[str, list[PeerTensor]]) -> Iterator[PeerServer]:
    identity, tensors = checkpoint
    srv = PeerServer(lambda ident: tensors if ident == identity else None, token="tok")
    yield srv
    srv.close()


def test_a_reader_gets_exactly_the_sources_bytes(
        source: PeerServer, checkpoint: tuple[str, list[PeerTensor]]) -> None:
    identity, tensors = checkpoint
    url = peer_url(source.host, source.port, identity)
    assert is_peer_url(url) and not is_peer_url("/models/v2")
    h = IdentityHasher()
    with PeerStream(url, "tok", 5) as stream:
        assert [(e.name, e.shape) for e in stream.entries] == [(t[0], t[2]) for t in tensors]
        for e, data in stream.tensors():
            h.add(e.name, e.dtype, e.shape, data)
        assert stream.received == stream.total
    assert h.hexdigest() == identity
    # The source counts a stream once its last write returned, which may be after the
    # reader has every byte: wait for it (bounded), never for a time.
    wait_until(lambda: source.served_bytes == stream.total, "the source counted its stream")


def test_a_source_refuses_a_wrong_token_and_an_identity_it_does_not_hold(
        source: PeerServer, checkpoint: tuple[str, list[PeerTensor]]) -> None:
    identity, _ = checkpoint
    url = peer_url(source.host, source.port, identity)
    with pytest.raises(PeerSourceError, match="HTTP 403"):
        PeerStream(url, "another", 5)
    with pytest.raises(PeerSourceError, match="HTTP 404: this source holds no bytes"):
        PeerStream(peer_url(source.host, source.port, "0" * 64), "tok", 5)
    with pytest.raises(PeerSourceError, match="not a peer source URL"):
        PeerStream("file:///models/v2", "tok", 5)
    assert source.served_bytes == 0


def test_a_source_that_dies_mid_stream_says_how_far_it_got(
        source: PeerServer, checkpoint: tuple[str, list[PeerTensor]]) -> None:
    identity, _ = checkpoint
    raw = httpx.get(peer_url(source.host, source.port, identity),
                    headers={TOKEN_HEADER: "tok"}, timeout=5).content
    prefix, thread = dying_source(raw, len(raw) // 2)
    with PeerStream(prefix + PEER_PATH + identity, "tok", 5) as stream, \
            pytest.raises(PeerSourceError, match=rf"closed the stream after \d+ of "
                                                 rf"{len(raw)} bytes"):
        for _ in stream.tensors():
            pass
    thread.join(5)


def test_a_malformed_stream_is_refused_before_any_tensor(tmp_path: Path) -> None:
    """A header whose offsets leave a gap (bytes no tensor claims) is refused as read."""
    head = safetensors_header([("a", "F32", (1,), b"\0" * 4), ("b", "F32", (1,), b"\0" * 4)])
    gap = head.replace(b'"data_offsets":[4,8]', b'"data_offsets":[5,9]')
    assert gap != head
    prefix, thread = dying_source(gap + b"\0" * 9, len(gap) + 9)
    with pytest.raises(PeerSourceError, match="not where the stream has it"):
        PeerStream(prefix + PEER_PATH + "x", "tok", 5)
    thread.join(5)
