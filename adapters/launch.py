"""How RolloutCore starts a vLLM engine of its own (an in-process engine, a Ray actor, the
test servers): the engine flags it starts one with, and a free port to serve on."""

from __future__ import annotations

import socket

#: vLLM flags of an engine RolloutCore starts (the tiny models' size: float32 weights,
#: room for 512 tokens, prefix caching, eager mode, a small KV cache).
DEFAULT_FLAGS: tuple[str, ...] = (
    "--dtype",
    "float32",
    "--max-model-len",
    "512",
    "--enable-prefix-caching",
    "--max-num-seqs",
    "8",
    "--enforce-eager",
    "--kv-cache-memory-bytes",
    "64M",
)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual small race applies)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


__all__ = ["DEFAULT_FLAGS", "free_port"]
