"""LoRA adapters inside a vLLM worker: staged copies RolloutCore can vouch for.

What vLLM 0.32 does with a runtime adapter (conformance/VLLM_OBSERVED.md, section 3b):
its prefix-cache blocks are keyed by (name, path), so loading new weights in place from
the same path reuses KV computed under the old weights; ``load_inplace`` keeps the request
re-reading the path from disk at every step; the worker's tensors are memory-mapped views
of the file, so a file overwritten where it lies changes the served weights with no call
at all; and an adapter evicted from the worker's cache is silently re-read from its path.

So RolloutCore never lets vLLM load an adapter from a path anyone else writes: the
worker copies the adapter's files into a fresh directory of its own (:func:`stage`),
makes them read-only, digests the copy (``rolloutcore.engine.identity``: name, dtype, shape and
bytes of every tensor) and refuses a copy whose digest is not the one the target names.
vLLM then loads the copy, under a path no earlier generation used (fresh prefix keys), and
every later re-read finds the same bytes. Every adapter load the worker does is recorded
(:func:`install_load_hook`), so :func:`identity_of` answers with the staged digest of the
adapter vLLM most recently loaded under a name, or with no identity (and why) when that
load came from a path RolloutCore did not stage.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from rolloutcore.engine.identity import CheckpointError, checkpoint_identity

BASIS_STAGED = "adapter bytes staged by rc_stage_lora"

_lock = threading.Lock()
#: staged directory -> digest of its (read-only) tensors
_STAGED: dict[str, str] = {}
#: every adapter load the worker did: (int id, name, path), in order
_LOADS: list[tuple[int, str, str]] = []


def stage_root() -> Path:
    """Where this worker stages adapters (``ROLLOUTCORE_LORA_STAGE``, else a directory of
    its own under the temporary directory, removed when the worker exits)."""
    configured = os.environ.get("ROLLOUTCORE_LORA_STAGE")
    root = Path(configured or os.path.join(tempfile.gettempdir(),
                                           f"rolloutcore-lora-{os.getpid()}"))
    if not root.is_dir():
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not configured:
            atexit.register(_remove, root)
    return root


def _remove(root: Path) -> None:
    for d in root.glob("adapter-*"):
        d.chmod(stat.S_IRWXU)  # staged directories are read-only
    shutil.rmtree(root, ignore_errors=True)


def stage(source: str, expected_identity: str) -> dict[str, Any]:
    """Copy the adapter at ``source`` into a fresh read-only directory and digest the copy;
    refuse (and remove it) unless the digest is ``expected_identity``."""
    src = Path(source)
    if not src.is_dir():
        return {"staged": None, "refused": f"{source}: not a directory"}
    target = Path(tempfile.mkdtemp(prefix="adapter-", dir=stage_root()))
    try:
        for f in sorted(src.iterdir()):
            if f.is_file():
                shutil.copyfile(f, target / f.name)
                os.chmod(target / f.name, stat.S_IRUSR | stat.S_IRGRP)
        identity = checkpoint_identity(target)
    except (CheckpointError, OSError) as e:
        shutil.rmtree(target, ignore_errors=True)
        return {"staged": None, "refused": f"cannot stage {source}: {e}"}
    if identity != expected_identity:
        shutil.rmtree(target, ignore_errors=True)
        return {"staged": None, "identity": identity,
                "refused": f"identity {identity[:16]} is not the expected "
                f"{str(expected_identity)[:16]}"}
    os.chmod(target, stat.S_IRWXU & ~stat.S_IWUSR)
    with _lock:
        _STAGED[str(target)] = identity
    return {"staged": str(target), "identity": identity}


def identity_of(name: str, held_ids: set[int] | None) -> dict[str, Any]:
    """The identity of the adapter vLLM most recently loaded under ``name``."""
    with _lock:
        loads = [entry for entry in _LOADS if entry[1] == name]
        if not loads:
            return {"name": name, "identity": None, "loaded": False,
                    "reason": f"no adapter {name!r} loaded"}
        # The last load, in the order the worker did them: an in-place reload keeps the
        # adapter's int id, so neither the id nor the path can order them.
        int_id, _name, path = loads[-1]
        identity = _STAGED.get(path)
    out: dict[str, Any] = {"name": name, "loaded": True, "int_id": int_id, "path": path,
                           "held": None if held_ids is None else int_id in held_ids}
    if identity is None:
        return {**out, "identity": None,
                "reason": "loaded from a path RolloutCore did not stage (others may write it)"}
    return {**out, "identity": identity, "basis": BASIS_STAGED}


def install_load_hook() -> None:
    """Record every adapter load of this worker (vLLM's ``WorkerLoRAManager``)."""
    if "vllm" not in sys.modules:
        return
    from vllm.lora import worker_manager as wm

    original = wm.WorkerLoRAManager._load_adapter
    if getattr(original, "_rolloutcore", False):
        return

    def _load_adapter(self: Any, lora_request: Any) -> Any:
        lora = original(self, lora_request)
        with _lock:
            _LOADS.append((int(lora_request.lora_int_id), str(lora_request.lora_name),
                           str(lora_request.lora_path)))
        return lora

    _load_adapter._rolloutcore = True  # type: ignore[attr-defined]
    wm.WorkerLoRAManager._load_adapter = _load_adapter  # type: ignore[method-assign]
