"""vLLM CPU servers shared across a test session: each start costs 10-15 s of both cores,
so a server a test module leaves as it found it serves the next module too.

Every pooled server runs one configuration that covers every suite that borrows from
the pool (:func:`pool_args`: the gloo weight-transfer backend and its worker extension,
which includes RolloutCore's worker extension and load-time identity, the prompt-token
details, a chat template) on the tiny model's ``v1`` checkpoint. A module leases servers
and gives them back; a server comes back into the pool only when it is *verifiably* as
found (:meth:`ServerPool.why_not_as_found`: running, not paused, nothing running, the
startup label, the identity of ``v1``'s bytes, the greedy reference of ``v1`` on a fresh
prefix cache); otherwise it is stopped and the next lease starts a fresh one. A module
that must leave a server changed (killed, restarted elsewhere) simply gives it back: the
check discards it. A module that needs another configuration starts its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rolloutcore.conformance.engines import INITIAL_LABEL
from rolloutcore.conformance.server import VllmServer
from rolloutcore.identity import checkpoint_identity

CHECK_PROBE = "medium"  # references.json probe the give-back check generates greedily

#: The tiny model's chat template for /v1/chat/completions (the tokenizer has none).
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def pool_args(chat_template: Path) -> list[str]:
    """The pooled servers' command-line arguments (see the module docstring)."""
    from rolloutcore.conformance.transfer_scenarios import GLOO

    return [*GLOO.server_args(), "--enable-prompt-tokens-details",
            "--chat-template", str(chat_template)]


@dataclass
class ServerPool:
    """Servers on ``models["v1"]`` with :func:`pool_args`, logs under ``work_dir``."""

    models: Mapping[str, Path]
    work_dir: Path
    max_idle: int = 3  # each idle server holds about 2 GiB
    started: int = 0
    reused: int = 0
    discarded: list[tuple[str, str]] = field(default_factory=list)  # (log, why)
    _idle: list[VllmServer] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.chat_template = self.work_dir / "chat.jinja"
        self.chat_template.write_text(CHAT_TEMPLATE)
        self.model = Path(self.models["v1"]).resolve()
        self._identity = checkpoint_identity(self.model)  # once: every give-back compares it

    def lease(self, n: int = 1) -> list[VllmServer]:
        """``n`` healthy servers: idle ones first, the rest started in parallel."""
        with self._lock:
            out, self._idle = self._idle[:n], self._idle[n:]
            self.reused += len(out)
        fresh = [VllmServer(self.model, extra_args=pool_args(self.chat_template),
                            log_path=self.work_dir / f"vllm-{time.monotonic_ns()}-{i}.log")
                 for i in range(n - len(out))]
        errors: list[BaseException] = []

        def start(s: VllmServer) -> None:
            try:
                s.start()
            except BaseException as e:  # re-raised below, in the caller's thread
                errors.append(e)

        threads = [threading.Thread(target=start, args=(s,)) for s in fresh]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.started += len(fresh)
        if errors:
            for s in out + fresh:
                s.stop()
            raise errors[0]
        return out + fresh

    @contextmanager
    def leased(self, n: int = 1) -> Iterator[list[VllmServer]]:
        """``n`` servers, restored to ``v1`` (best effort) and given back afterwards."""
        from rolloutcore.conformance.engines import VllmHarnessEngine

        servers = self.lease(n)
        try:
            yield servers
        finally:
            for i, s in enumerate(servers):
                VllmHarnessEngine(s, self.models, work_dir=self.work_dir / f"restore-{i}",
                                  release=self.release).close()

    def why_not_as_found(self, server: VllmServer) -> str | None:
        """None if ``server`` shows exactly what a fresh pooled server shows, else what
        differs. Resets the prefix cache first (verified), so that the probe computes."""
        from rolloutcore.adapters.contract import AdapterError
        from rolloutcore.adapters.http import HttpAdapter
        from rolloutcore.targets import load_references

        if not server.is_running():
            return "not running"
        if server.model.resolve() != self.model or server.extra_args != tuple(
                pool_args(self.chat_template)):
            return f"restarted on {server.model} with other arguments"
        probe = next(p for p in load_references(self.model)["probes"]
                     if p["name"] == CHECK_PROBE)
        http = HttpAdapter(server.url, model=server.served_model_name)
        try:
            deadline = time.monotonic() + 30.0
            state = http.read_state(deadline)
            if state.paused is not False or state.running_requests != 0:
                return f"paused={state.paused}, running={state.running_requests}"
            if state.label != INITIAL_LABEL:
                return f"label {state.label!r}"
            if state.identity != self._identity:
                return f"identity {state.identity}"
            # A fenced engine refuses every load without an epoch (controller failover).
            fence = http.rpc("rc_epoch", op="pool_check")
            seen = [w.get("seen") for w in http._worker_results(fence, "pool_check")]
            if seen != [0] * len(seen):
                return f"fenced at epoch(s) {seen}"
            r = http.request("POST", "/reset_prefix_cache", op="pool_check", idempotent=True)
            if r.status != 200 or not (isinstance(r.body, dict) and r.body.get("success")):
                return f"prefix reset not verified: {r.text[:120]}"
            out = http.generate(tuple(probe["prompt_token_ids"]),
                                len(probe["output_token_ids"]))
            if list(out.tokens) != probe["output_token_ids"]:
                return "greedy output differs from v1's reference"
        except (AdapterError, OSError) as e:
            return f"unreadable: {e}"
        finally:
            http.close()
        return None

    def release(self, server: VllmServer) -> None:
        """Give one server back (a harness engine's ``release``)."""
        self.give_back([server])

    def give_back(self, servers: list[VllmServer]) -> None:
        """Keep each server that is as found (up to ``max_idle``), stop the others."""
        for s in servers:
            why = self.why_not_as_found(s)
            with self._lock:
                if why is None and len(self._idle) < self.max_idle:
                    self._idle.append(s)
                    continue
            self.discarded.append((str(s.log_path), why or "pool full"))
            s.stop()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for s in idle:
            s.stop()

    def summary(self) -> str:
        return (f"vLLM server pool: {self.started} started, {self.reused} leases served by a "
                f"reused server, {len(self.discarded)} discarded")


__all__ = ["CHAT_TEMPLATE", "ServerPool", "pool_args"]
