"""Tiny, fully offline Llama checkpoints for conformance tests against a real vLLM.

No model hub is reachable, so the test models are built here from nothing:

* a byte-level BPE tokenizer trained with ``tokenizers`` on deterministic text
  generated in this module, saved as a ``PreTrainedTokenizerFast``;
* a ``LlamaConfig`` (vocab 1024, hidden 128, intermediate 256, 2 layers, 4 heads,
  4 kv heads, head size 32, 512 positions, untied embeddings) with seeded random
  float32 weights saved as safetensors.

Versions (sibling directories under the output directory, default ``models/``):

``v1``     seed 1.
``v2``     seed 2; its greedy output differs from v1's.
``v1neg``  v1 with layer 0's residual writes (``self_attn.o_proj`` and
           ``mlp.down_proj``) negated: the same manifest (names, dtypes, shapes) as v1,
           different content and different greedy output.
``large``/``large_v2``  (only with ``large=True``) a ~56 MB model (hidden 512,
           4 layers) for transfer benchmarks.

Each version directory holds ``references.json``: greedy token ids computed with
``transformers`` on CPU for fixed probe prompts, with ``min_tokens == max_tokens``
(the EOS logit is masked until the end, exactly what vLLM's ``min_tokens`` does),
so every reference has exactly ``max_tokens`` tokens. Per step it also records the
raw (unmasked) log-probability of the chosen token and the margin between the best
and second-best raw logits, so a test can tell a real mismatch from a float tie.

Building is idempotent: a version directory with a ``recipe.json`` whose hash
matches the current recipe is left alone.

Usage: ``python -m rolloutcore.conformance.tiny_model [--out DIR] [--large] [--force]``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rolloutcore.targets import load_references

if TYPE_CHECKING:
    import torch

# Bump when anything that changes the bytes of a built model changes.
RECIPE_VERSION = 2  # 2: references carry prompt log-probabilities (the scored probe)

REPO_ROOT = Path(__file__).resolve().parent.parent
# The repo's git-ignored models/ (editable install); override with ROLLOUTCORE_MODELS_DIR.
DEFAULT_OUT = Path(os.environ.get("ROLLOUTCORE_MODELS_DIR", str(REPO_ROOT / "models")))

VOCAB_SIZE = 1024
SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<pad>")
BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, PAD_TOKEN = SPECIAL_TOKENS

# Block size used by the conformance server (--block-size 32): the long prompt
# must span more than two full blocks so that prefix-cache hits are visible.
PREFIX_BLOCK_SIZE = 32
SHORT_MAX_TOKENS = 16
LONG_ROLLOUT_TOKENS = 256

_SUBJECTS = (
    "the trainer",
    "the policy",
    "the rollout worker",
    "the engine",
    "a replica",
    "the scheduler",
    "the fleet",
    "the controller",
    "the learner",
    "the sampler",
    "every shard",
    "the cache",
    "the checkpoint",
    "the gateway",
    "the verifier",
)
_VERBS = (
    "sends",
    "loads",
    "pauses",
    "resumes",
    "checks",
    "streams",
    "rejects",
    "commits",
    "aborts",
    "drains",
    "updates",
    "hashes",
    "records",
    "replays",
    "measures",
    "signs",
    "releases",
    "queues",
    "retries",
    "compares",
)
_OBJECTS = (
    "the new weights",
    "a stale prefix",
    "the version label",
    "every request",
    "the block table",
    "a partial tensor",
    "the manifest",
    "the old policy",
    "a long prompt",
    "the token ids",
    "the health probe",
    "the metrics",
    "an ambiguous update",
    "the kv cache",
    "the whole batch",
    "a fresh seed",
)
_TAILS = (
    "before the next step",
    "after the barrier",
    "without a gap",
    "while the fleet is paused",
    "in a single transaction",
    "on every replica",
    "once the hash matches",
    "when the lease expires",
    "at the end of the epoch",
    "if nothing else fails",
    "so that no rollout spans two policies",
    "and then waits",
    "with exactly one writer",
    "under a fixed seed",
)
_EXTRA = (
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 32 64 128 256 512 1024 appear in logs.",
    "Punctuation: commas, periods. Questions? Answers! (parentheses) [brackets] {braces}.",
    "Code: def update(weights): return hash(weights) == manifest['sha256']",
    "Paths such as /models/v1/model.safetensors and URLs like http://127.0.0.1:8000/health.",
    'JSON: {"weight_version": "v2", "status": "paused", "success": true}',
)

PROBE_PROMPTS: tuple[tuple[str, str], ...] = (
    ("short", "The trainer sends"),
    ("medium", "While the fleet is paused, the controller checks the manifest and"),
    (
        "long",
        "A rollout worker receives a long prompt. The scheduler queues every request "
        "while the fleet is paused, and the controller compares the hash of the new "
        "weights with the manifest before it resumes the engine. If the hash does not "
        "match, the update is ambiguous: the controller records the failure, aborts "
        "the whole batch, and the trainer streams the checkpoint again. Once the hash "
        "matches on every replica, the cache is reset, the version label is committed "
        "in a single transaction, and the engine resumes so that no rollout spans two "
        "policies. Then the learner measures the stale prefix and the sampler replays",
    ),
    ("numbers", "Numbers like 0 1 2 3 4 5"),
)


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of one checkpoint family."""

    vocab_size: int = VOCAB_SIZE
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 512
    # Larger than Llama's default 0.02 so that logits are well separated and
    # float32 kernels of vLLM and transformers agree on every greedy argmax.
    initializer_range: float = 0.25


SMALL_SPEC = ModelSpec()
LARGE_SPEC = ModelSpec(
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=8,
    initializer_range=0.1,
)


@dataclass(frozen=True)
class VersionRecipe:
    """How one version directory is produced."""

    name: str
    spec: ModelSpec
    seed: int
    negate_layer0: bool = False
    long_rollout: bool = True
    prompts: tuple[tuple[str, str], ...] = PROBE_PROMPTS

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe_version": RECIPE_VERSION,
            "name": self.name,
            "spec": asdict(self.spec),
            "seed": self.seed,
            "negate_layer0": self.negate_layer0,
            "long_rollout": self.long_rollout,
            "prompts": [list(p) for p in self.prompts],
            "short_max_tokens": SHORT_MAX_TOKENS,
            "long_rollout_tokens": LONG_ROLLOUT_TOKENS,
            "tokenizer": _tokenizer_recipe(),
            "libraries": _library_versions(),
        }

    def digest(self) -> str:
        blob = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


SMALL_RECIPES = (
    VersionRecipe("v1", SMALL_SPEC, seed=1),
    VersionRecipe("v2", SMALL_SPEC, seed=2),
    VersionRecipe("v1neg", SMALL_SPEC, seed=1, negate_layer0=True),
)
LARGE_RECIPES = (
    VersionRecipe("large", LARGE_SPEC, seed=11, long_rollout=False),
    VersionRecipe("large_v2", LARGE_SPEC, seed=12, long_rollout=False),
)


# --------------------------------------------------------------------------- tokenizer


def _library_versions() -> dict[str, str]:
    """Versions that could change the built bytes (read without importing torch)."""
    out: dict[str, str] = {}
    for dist in ("torch", "transformers", "tokenizers", "safetensors"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "missing"
    return out


def _tokenizer_recipe() -> dict[str, Any]:
    return {
        "kind": "byte-level-bpe",
        "vocab_size": VOCAB_SIZE,
        "special_tokens": list(SPECIAL_TOKENS),
        "corpus_sha256": hashlib.sha256("\n".join(corpus_lines()).encode()).hexdigest(),
    }


def corpus_lines(n_sentences: int = 4000, seed: int = 1234) -> list[str]:
    """Deterministic English-like training text for the tokenizer."""
    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(n_sentences):
        sentence = (
            f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
            f"{rng.choice(_TAILS)}."
        )
        if rng.random() < 0.5:
            sentence = sentence[0].upper() + sentence[1:]
        if i % 7 == 0:
            sentence += f" Step {rng.randint(0, 9999)} of version v{rng.randint(1, 99)}."
        lines.append(sentence)
    lines.extend(_EXTRA)
    lines.extend(text for _, text in PROBE_PROMPTS)
    return lines


def _iter_batches(lines: Sequence[str], size: int = 256) -> Iterator[list[str]]:
    for start in range(0, len(lines), size):
        yield list(lines[start : start + size])


def build_tokenizer(out_dir: Path) -> None:
    """Train the byte-level BPE tokenizer and save it as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_iter_batches(corpus_lines()), trainer=trainer)
    fast_cls: Any = PreTrainedTokenizerFast  # its __init__ is untyped
    fast = fast_cls(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=SMALL_SPEC.max_position_embeddings,
    )
    fast.save_pretrained(str(out_dir))


# --------------------------------------------------------------------------- model


def _llama_config(spec: ModelSpec, tokenizer_dir: Path) -> Any:
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype="float32",
    )


def _make_model(recipe: VersionRecipe, config: Any) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(recipe.seed)
    model_cls: Any = LlamaForCausalLM  # its __init__ is untyped
    model = model_cls(config).to(torch.float32)
    model.eval()
    with torch.no_grad():
        # Seeded re-initialisation independent of transformers' init order.
        gen = torch.Generator().manual_seed(recipe.seed)
        std = recipe.spec.initializer_range
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            else:
                param.copy_(std * torch.randn(param.shape, generator=gen))
        if recipe.negate_layer0:
            layer0 = model.model.layers[0]
            layer0.self_attn.o_proj.weight.neg_()
            layer0.mlp.down_proj.weight.neg_()
    return model


@dataclass
class _Greedy:
    token_ids: list[int]
    logprobs: list[float]
    margins: list[float]


def greedy_reference(
    model: Any, prompt_ids: Sequence[int], max_tokens: int, eos_id: int | None
) -> _Greedy:
    """Greedy decoding with ``min_tokens == max_tokens``: EOS is masked at every step.

    Equivalent to transformers' ``generate(do_sample=False, max_new_tokens=N,
    min_new_tokens=N)`` and to vLLM's ``temperature=0, max_tokens=N, min_tokens=N``.
    Log-probabilities and margins are of the raw logits (before the EOS mask),
    which is what vLLM returns by default (``logprobs_mode=raw_logprobs``).
    """
    import torch

    out = _Greedy([], [], [])
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    past: Any = None
    with torch.no_grad():
        for _ in range(max_tokens):
            res = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = res.past_key_values
            logits: torch.Tensor = res.logits[0, -1].to(torch.float32)
            logp = torch.log_softmax(logits, dim=-1)
            masked = logits.clone()
            if eos_id is not None:
                masked[eos_id] = float("-inf")
            tok = int(torch.argmax(masked).item())
            top2 = torch.topk(masked, 2).values
            out.token_ids.append(tok)
            out.logprobs.append(float(logp[tok].item()))
            out.margins.append(float((top2[0] - top2[1]).item()))
            ids = torch.tensor([[tok]], dtype=torch.long)
    return out


def prompt_logprobs(model: Any, prompt_ids: Sequence[int]) -> list[float]:
    """Log-probability of each prompt token after the first, from one forward pass (what
    vLLM returns for ``prompt_logprobs: 0``): the reference of the scored probe."""
    import torch

    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].to(torch.float32)
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[i - 1, prompt_ids[i]].item()) for i in range(1, len(prompt_ids))]


def _compute_references(model: Any, tokenizer_dir: Path, recipe: VersionRecipe) -> dict[str, Any]:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    eos_id = tok.eos_token_id
    entries: list[dict[str, Any]] = []

    def add(name: str, text: str, ids: list[int], max_tokens: int) -> None:
        g = greedy_reference(model, ids, max_tokens, eos_id)
        entries.append(
            {
                "name": name,
                "prompt": text,
                "prompt_token_ids": ids,
                "max_tokens": max_tokens,
                "min_tokens": max_tokens,
                "output_token_ids": g.token_ids,
                "output_text": tok.decode(g.token_ids),
                "output_logprobs": g.logprobs,
                "min_margin": min(g.margins),
                "prompt_logprobs": prompt_logprobs(model, ids),
            }
        )

    for name, text in recipe.prompts:
        ids = tok.encode(text, add_special_tokens=False)
        if name == "long" and len(ids) <= 2 * PREFIX_BLOCK_SIZE:
            raise RuntimeError(f"long prompt is only {len(ids)} tokens")
        add(name, text, ids, SHORT_MAX_TOKENS)
    if recipe.long_rollout:
        name, text = recipe.prompts[0]
        ids = tok.encode(text, add_special_tokens=False)
        add(f"{name}_rollout{LONG_ROLLOUT_TOKENS}", text, ids, LONG_ROLLOUT_TOKENS)
    return {
        "version": recipe.name,
        "recipe_sha256": recipe.digest(),
        "sampling": {"temperature": 0.0, "min_tokens": "== max_tokens", "eos_masked": True},
        "eos_token_id": eos_id,
        "bos_token_id": tok.bos_token_id,
        "add_special_tokens": False,
        "probes": entries,
    }


def _manifest(state: dict[str, torch.Tensor]) -> list[list[Any]]:
    return [
        [k, str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in sorted(state.items())
    ]


def _build_version(out_dir: Path, recipe: VersionRecipe) -> Path:
    from safetensors.torch import load_file
    from transformers.utils import logging as _hf_logging

    hf_logging: Any = _hf_logging  # untyped functions
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    target = out_dir / recipe.name
    tmp = out_dir / f".{recipe.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    build_tokenizer(tmp)
    config = _llama_config(recipe.spec, tmp)
    model = _make_model(recipe, config)
    model.save_pretrained(str(tmp), safe_serialization=True)
    refs = _compute_references(model, tmp, recipe)
    state = load_file(str(tmp / "model.safetensors"))
    refs["manifest"] = _manifest(state)
    (tmp / "references.json").write_text(json.dumps(refs, indent=1) + "\n")
    (tmp / "recipe.json").write_text(
        json.dumps({"sha256": recipe.digest(), "recipe": recipe.to_json()}, indent=1) + "\n"
    )
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def _quiet_transformers() -> None:
    """No progress bars or info chatter while building (safe if not imported yet)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _is_current(target: Path, recipe: VersionRecipe) -> bool:
    marker = target / "recipe.json"
    needed = ("config.json", "model.safetensors", "tokenizer.json", "references.json")
    if not marker.is_file() or not all((target / f).is_file() for f in needed):
        return False
    try:
        return bool(json.loads(marker.read_text()).get("sha256") == recipe.digest())
    except (OSError, ValueError):
        return False


def _check_distinct(paths: dict[str, Path]) -> None:
    """v2 and v1neg must give different greedy output than v1; v1neg the same manifest."""
    if not {"v1", "v2", "v1neg"} <= paths.keys():
        return
    ref = {k: load_references(paths[k]) for k in ("v1", "v2", "v1neg")}

    def outputs(r: dict[str, Any]) -> list[list[int]]:
        return [p["output_token_ids"] for p in r["probes"]]

    if outputs(ref["v1"]) == outputs(ref["v2"]):
        raise RuntimeError("v2 greedy output equals v1's")
    if outputs(ref["v1"]) == outputs(ref["v1neg"]):
        raise RuntimeError("v1neg greedy output equals v1's")
    if ref["v1"]["manifest"] != ref["v1neg"]["manifest"]:
        raise RuntimeError("v1neg manifest differs from v1's")


def build_models(
    out_dir: Path = DEFAULT_OUT, *, large: bool = False, force: bool = False
) -> dict[str, Path]:
    """Build (or reuse) every version directory; return ``{name: path}``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _quiet_transformers()
    recipes = SMALL_RECIPES + (LARGE_RECIPES if large else ())
    paths: dict[str, Path] = {}
    # One builder at a time per output directory (parallel test sessions).
    with _locked(out_dir / ".build.lock"):
        for recipe in recipes:
            target = out_dir / recipe.name
            if force or not _is_current(target, recipe):
                _build_version(out_dir, recipe)
            paths[recipe.name] = target
        _check_distinct(paths)
    return paths


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--large", action="store_true", help="also build the ~56 MB models")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    paths = build_models(args.out, large=args.large, force=args.force)
    for name, path in paths.items():
        size = (path / "model.safetensors").stat().st_size
        print(f"{name}\t{path}\t{size} bytes")
    print(f"done in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
