"""Conformance against a server someone else operates (``--url``): a CPU box, a GPU node.

The harness attaches to the server instead of starting one. Before anything touches it,
:func:`preflight` checks what the conformance needs, and refuses with one line naming
what is missing: the server answers, serves the model named, runs in dev mode (the
pause/resume and RPC endpoints), has the RolloutCore worker extension, and holds the
``v1`` checkpoint it was given; the checkpoints ``v1``, ``v2`` and ``v1neg`` (with their
recorded references) are readable here and, at the same paths, by the server (a shared
filesystem, or the same machine).

Build the checkpoints with ``python -m rolloutcore.conformance.fixtures.tiny_model`` (or bring
your own with ``references.json``); start the server with the arguments
:data:`rolloutcore.adapters.vllm_worker.SERVER_ARGS` on ``v1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx

#: Checkpoints the conformance needs, by role.
ROLES = ("v1", "v2", "v1neg")


@dataclass
class ExistingServer:
    """A server the harness did not start: never stopped or signalled by it."""

    url: str
    served_model_name: str
    token: str | None = None
    pid: int = -1  # not ours to know: checks about the process are skipped

    def is_running(self) -> bool:
        try:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            r = httpx.get(f"{self.url.rstrip('/')}/health", headers=headers, timeout=5.0,
                          trust_env=False)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def stop(self) -> None:  # pragma: no cover - guarded: the harness never owns it
        raise RuntimeError("the harness does not stop a server it did not start")


class PreflightError(Exception):
    """What the server or the checkpoints lack (one line)."""


def parse_checkpoints(items: list[str] | None) -> dict[str, Path]:
    """``NAME=PATH`` pairs (repeatable ``--checkpoint``)."""
    out: dict[str, Path] = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        if not sep or name not in ROLES or not path:
            raise ValueError(f"--checkpoint takes NAME=PATH with NAME one of "
                             f"{', '.join(ROLES)}, got {item!r}")
        out[name] = Path(path)
    return out


def preflight(server: ExistingServer, checkpoints: dict[str, Path]) -> None:
    """Raise :class:`PreflightError` naming the first thing missing."""
    from rolloutcore.adapters.contract import AdapterError
    from rolloutcore.adapters.http import HttpAdapter
    from rolloutcore.engine.identity import checkpoint_identity
    from rolloutcore.engine.targets import TargetError, load_references

    for role in ROLES:
        path = checkpoints.get(role)
        if path is None:
            raise PreflightError(f"checkpoint {role} is not given (--checkpoint {role}=PATH)")
        try:
            load_references(path)
        except (TargetError, OSError, ValueError) as e:
            raise PreflightError(f"checkpoint {role} at {path}: {e}") from None
    try:
        r = httpx.get(f"{server.url.rstrip('/')}/v1/models", timeout=10.0, trust_env=False,
                      headers={"Authorization": f"Bearer {server.token}"}
                      if server.token else {})
    except httpx.HTTPError as e:
        raise PreflightError(f"cannot reach {server.url}: {e}") from None
    if r.status_code in (401, 403):
        raise PreflightError(f"{server.url} refuses the token (HTTP {r.status_code}); "
                             "pass --token")
    try:
        served = [m.get("id") for m in r.json().get("data", [])]
    except ValueError:
        raise PreflightError(f"{server.url}/v1/models is not JSON: is this a vLLM "
                             "server?") from None
    if server.served_model_name not in served:
        raise PreflightError(f"{server.url} serves {served}, not --model "
                             f"{server.served_model_name}")
    http = HttpAdapter(server.url, model=server.served_model_name, token=server.token,
                       allow_insecure_remote=True)
    try:
        try:
            http.read_paused()
        except AdapterError:
            raise PreflightError(f"{server.url} has no /is_paused: dev mode is off (start "
                                 "vLLM with VLLM_SERVER_DEV_MODE=1)") from None
        reply = http.rpc("rc_identity", op="preflight")
        if reply.status != 200:
            raise PreflightError(f"{server.url} lacks the RolloutCore worker extension "
                                 "(start vLLM with the arguments of "
                                 "rolloutcore.adapters.vllm_worker.SERVER_ARGS)")
        try:
            held = http.read_identity()
        except AdapterError as e:
            raise PreflightError(f"{server.url} cannot report its weight identity: {e} "
                                 "(start vLLM with --load-format rolloutcore)") from None
        want = checkpoint_identity(checkpoints["v1"])
        if held != want:
            raise PreflightError(f"{server.url} must serve checkpoint v1 "
                                 f"({checkpoints['v1']}) at the start; its weights read as "
                                 f"{held[:16]}, v1 as {want[:16]}")
    finally:
        http.close()


__all__ = ["ROLES", "ExistingServer", "PreflightError", "parse_checkpoints", "preflight"]
