"""A vLLM model loader that digests the bytes it loads: ``--load-format rolloutcore``.

vLLM 0.32 picks its model loader by ``--load-format`` from a registry that
:func:`vllm.model_executor.model_loader.register_model_loader` extends; every load path
that reads a checkpoint from disk asks that registry for the loader of the configured
format: the startup load (``BaseModelLoader.load_model`` -> ``load_weights`` ->
``get_all_weights``) and the worker's own ``reload_weights`` with or without
``weights_path`` (``reload.inplace.reload_weights`` -> ``get_all_weights``).
:class:`RolloutCoreModelLoader` (a :class:`DefaultModelLoader`) answers both with
:class:`DigestingWeights`: it lists the checkpoint with :mod:`rolloutcore.engine.identity`
(every ``*.safetensors`` of a local directory, tensors in sorted name order), reads each
tensor's bytes once, feeds those bytes to :class:`~rolloutcore.engine.identity.IdentityHasher`
and hands vLLM a tensor over a private copy of the same bytes. The digest of a load that
ran to its end therefore equals :func:`rolloutcore.engine.identity.checkpoint_identity` of the
directory as it was read, and nothing written to the directory afterwards changes it.

Why not wrap vLLM's own safetensors iterator: it yields file after file, so a sharded
checkpoint does not come in the sorted name order the identity is defined over (one pass
could not digest it without holding the whole model), and its tensors are views of a
memory map of the file, which a later in-place write changes under the digest.

What is recorded, per model object (:func:`load_state`): the record of the last load that
finished (identity, manifest, tensors, bytes, path, basis) or why there is none. A load
is marked unfinished before vLLM touches the model (:func:`begin_load`) and finished only
when its weights iterator is exhausted (:func:`complete_load`); a load that raises leaves
it unfinished, and an in-place load whose manifest differs from that of the weights it
replaced is not vouched for (vLLM keeps the old tensors of layers it lacks).
:func:`watch` wraps the model's ``load_weights`` on the instance so that weights reaching
the model through any other path (another load format after ``update_config``, a
weight-transfer engine, a caller's own iterator) void the record: the worker then
vouches for nothing rather than for stale bytes.

Registered by :func:`register`: the worker extension (:mod:`.vllm_worker`) calls it when
it is imported inside a vLLM process, which vLLM does in ``init_worker`` before it builds
the worker and loads the model; an entry point in ``vllm.general_plugins`` pointing at
:func:`register` registers it in every vLLM process as well. Limits: local directories
of safetensors only (no hub download, no ``.bin``/``.pt``, no secondary weight sources),
dtypes in :data:`TORCH_DTYPES`.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from vllm.config import ModelConfig
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from rolloutcore.engine.identity import (
    CheckpointError,
    IdentityHasher,
    TensorEntry,
    checkpoint_entries,
    iter_tensor_bytes,
)
from rolloutcore.engine.peer import PeerEntry

LOAD_FORMAT = "rolloutcore"

BASIS_STARTUP = "bytes loaded at startup"
BASIS_LOADER = "bytes loaded by vLLM's model loader (in place)"
BASIS_RELOAD = "bytes loaded by reload_weights"
BASIS_RC_RELOAD = "bytes loaded by rc_reload_weights"
BASIS_RC_STAGED = "bytes staged by rc_stage while serving, installed by rc_install_staged"

# safetensors dtype code -> torch dtype name.
TORCH_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "BOOL": "bool",
}


# ------------------------------------------------------------------ reading and digesting


def manifest_of(entries: Iterable[TensorEntry | PeerEntry]) -> str:
    """Manifest digest (names, dtypes, shapes) of sorted checkpoint entries."""
    h = IdentityHasher(manifest_only=True)
    for e in entries:
        h.add(e.name, e.dtype, e.shape)
    return h.hexdigest()


def unsupported_dtypes(entries: Iterable[TensorEntry | PeerEntry]) -> list[str]:
    return sorted({e.dtype for e in entries} - TORCH_DTYPES.keys())


def read_tensors(entries: Iterable[TensorEntry],
                 hasher: IdentityHasher) -> Iterator[tuple[TensorEntry, torch.Tensor]]:
    """Each entry's bytes, read once: digested by ``hasher``, then returned as a tensor
    over a private copy of exactly those bytes (nothing maps the file)."""
    for ent, data in iter_tensor_bytes(entries):
        hasher.add(ent.name, ent.dtype, ent.shape, data)
        yield ent, tensor_of(ent.dtype, ent.shape, data)


def tensor_of(dtype_code: str, shape: Sequence[int], data: bytes) -> torch.Tensor:
    """A tensor over a private copy of ``data`` (safetensors dtype code, shape)."""
    dtype = getattr(torch, TORCH_DTYPES[dtype_code])
    buf = bytearray(data)
    return (torch.frombuffer(buf, dtype=dtype) if buf else
            torch.empty(0, dtype=dtype)).reshape(tuple(shape))


def checkpoint_dir(model_or_path: str) -> str:
    """The local checkpoint directory vLLM was pointed at (absolute)."""
    path = os.path.abspath(str(model_or_path))
    if not os.path.isdir(path):
        raise CheckpointError(f"load format {LOAD_FORMAT!r} loads a local directory of "
                              f"safetensors files; {model_or_path!r} is not a directory")
    return path


# ------------------------------------------------------------------ what each model holds


@dataclass(frozen=True)
class LoadState:
    """What RolloutCore saw load into one model object.

    ``loaded``: the record of the last load that finished, None while a load is under
    way, after one failed or after weights came in through a path RolloutCore does not
    digest (``broken`` says which). ``manifest``: that of the last finished load, kept
    when a later one fails (what a replacement must match)."""

    loaded: dict[str, Any] | None = None
    broken: str | None = None
    manifest: str | None = None
    loads: int = 0  # finished loads
    watched: bool = False


_LOCK = threading.Lock()
_STATES: weakref.WeakKeyDictionary[nn.Module, LoadState] = weakref.WeakKeyDictionary()


def load_state(model: nn.Module) -> LoadState | None:
    """The load state of ``model``; None if RolloutCore never saw a load into it."""
    with _LOCK:
        return _STATES.get(model)


def _update(model: nn.Module, **changes: Any) -> None:
    with _LOCK:
        _STATES[model] = replace(_STATES.get(model) or LoadState(), **changes)


def begin_load(model: nn.Module, reason: str) -> None:
    """The model is about to change: vouch for nothing until the load finishes."""
    _update(model, loaded=None, broken=reason)


def complete_load(model: nn.Module, record: dict[str, Any]) -> None:
    with _LOCK:
        st = _STATES.get(model) or LoadState()
        _STATES[model] = replace(st, loaded=dict(record), broken=None,
                                 manifest=record.get("manifest"), loads=st.loads + 1)


class RolloutCoreWeights:
    """Marker: weights whose bytes RolloutCore read and digested itself. Anything else
    given to a watched model's ``load_weights`` voids the record."""


class PreDigested(RolloutCoreWeights):
    """Tensors read and digested in full before the load (``rc_reload_weights``)."""

    def __init__(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        self._tensors = tensors

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self._tensors)


class DigestingWeights(RolloutCoreWeights):
    """The weights iterator of one load: reads, digests and yields each tensor; records
    the load as finished when it is exhausted (and only then)."""

    def __init__(self, model: nn.Module, path: str, entries: list[TensorEntry],
                 basis: str) -> None:
        self._model = weakref.ref(model)
        self.path = path
        self.basis = basis
        self._manifest = manifest_of(entries)
        self._hasher = IdentityHasher()
        self._it = read_tensors(entries, self._hasher)
        self._done = False
        begin_load(model, f"a load of {path} did not finish "
                          f"({basis.removeprefix('bytes loaded ')})")

    def __iter__(self) -> DigestingWeights:
        return self

    def __next__(self) -> tuple[str, torch.Tensor]:
        try:
            ent, t = next(self._it)
        except StopIteration:
            self._finish()
            raise
        return ent.name, t

    def _finish(self) -> None:
        model = self._model()
        if self._done or model is None:
            return
        self._done = True
        st = load_state(model)
        held = st.manifest if st is not None else None
        if held is not None and held != self._manifest:
            # In place, vLLM keeps the old tensors of layers this checkpoint lacks: the
            # model may now hold a mix that no single checkpoint describes.
            begin_load(model, f"the load of {self.path} had other names, dtypes or shapes "
                       "than the weights it replaced: the model may hold a mix")
            return
        complete_load(model, {"path": self.path, "identity": self._hasher.hexdigest(),
                              "manifest": self._manifest, "tensors": self._hasher.tensors,
                              "bytes": self._hasher.nbytes, "basis": self.basis})


def watch(model: nn.Module) -> None:
    """Wrap ``model.load_weights`` (on the instance, idempotent): weights that are not
    :class:`RolloutCoreWeights` void the model's record before they are loaded."""
    with _LOCK:
        st = _STATES.get(model) or LoadState()
        if st.watched:
            return
        _STATES[model] = replace(st, watched=True)
    ref = weakref.ref(model)
    inner = model.__dict__.get("load_weights")  # an instance-level wrapper already there
    cls: Any = type(model)
    func = cls.load_weights

    def load_weights(*args: Any, **kwargs: Any) -> Any:
        m = ref()
        if m is None:
            raise RuntimeError("model was freed")
        weights = args[0] if args else kwargs.get("weights")
        if not isinstance(weights, RolloutCoreWeights):
            begin_load(m, f"weights were loaded through model.load_weights from a "
                       f"{type(weights).__name__} that RolloutCore did not read or digest "
                       "(another load format, a weight-transfer engine or a caller's own "
                       "iterator)")
        if inner is not None:
            return inner(*args, **kwargs)
        return func(m, *args, **kwargs)

    load_weights.__doc__ = func.__doc__
    object.__setattr__(model, "load_weights", load_weights)


def unfinished_layerwise(model: nn.Module) -> int:
    """Layers of ``model`` that vLLM's layerwise reload began and did not finalise."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except ImportError:  # pragma: no cover - another vLLM layout
        return 0
    n = 0
    for layer in model.modules():
        info = LAYERWISE_INFO.get(layer)
        if info is not None and info.can_load():
            n += 1
    return n


# ------------------------------------------------------------------ the loader


class RolloutCoreModelLoader(DefaultModelLoader):
    """vLLM's default loader, reading local safetensors through :func:`read_tensors`."""

    def __init__(self, load_config: LoadConfig) -> None:
        super().__init__(load_config)
        self._rc_basis = BASIS_RELOAD  # get_all_weights outside load_weights: a reload

    def download_model(self, model_config: ModelConfig) -> None:
        checkpoint_entries(checkpoint_dir(model_config.model))  # nothing to download

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        st = load_state(model)
        self._rc_basis = BASIS_STARTUP if st is None or st.loads == 0 else BASIS_LOADER
        watch(model)
        try:
            super().load_weights(model, model_config)
        finally:
            self._rc_basis = BASIS_RELOAD

    def get_all_weights(  # type: ignore[override]
        self, model_config: ModelConfig, model: nn.Module
    ) -> DigestingWeights:
        """Lists and checks the checkpoint now (a missing or malformed one raises here,
        before vLLM touches the model); the bytes are read as vLLM iterates."""
        if tuple(getattr(model, "secondary_weights", ()) or ()):
            raise NotImplementedError(f"load format {LOAD_FORMAT!r}: models with secondary "
                                      "weight sources are not supported")
        path = checkpoint_dir(model_config.model)
        entries = checkpoint_entries(path)
        bad = unsupported_dtypes(entries)
        if bad:
            raise CheckpointError(f"{path}: unsupported dtype(s) {bad}")
        watch(model)
        if self.counter_before_loading_weights == 0.0:  # vLLM's "Loading weights took"
            self.counter_before_loading_weights = time.perf_counter()
        return DigestingWeights(model, path, entries, self._rc_basis)


def register() -> None:
    """Register :class:`RolloutCoreModelLoader` as ``--load-format rolloutcore``
    (idempotent: vLLM may run its plugins several times per process)."""
    from vllm.model_executor import model_loader as ml

    table = getattr(ml, "_LOAD_FORMAT_TO_MODEL_LOADER", None)
    if isinstance(table, dict) and table.get(LOAD_FORMAT) is RolloutCoreModelLoader:
        return
    register_model_loader(LOAD_FORMAT)(RolloutCoreModelLoader)


__all__ = ["BASIS_LOADER", "BASIS_RC_RELOAD", "BASIS_RC_STAGED", "BASIS_RELOAD",
           "BASIS_STARTUP", "LOAD_FORMAT",
           "TORCH_DTYPES", "DigestingWeights", "LoadState", "PreDigested",
           "RolloutCoreModelLoader", "RolloutCoreWeights", "begin_load", "checkpoint_dir",
           "complete_load", "load_state", "manifest_of", "read_tensors", "register",
           "unfinished_layerwise", "unsupported_dtypes", "watch"]
