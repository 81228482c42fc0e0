"""The worker's identity is the digest of the bytes it loaded, on every load path, on a
real vLLM CPU server (``--load-format rolloutcore`` and the worker extension).

One server for the module, started on a copy of v1. The steps build on each other and
run in file order: startup, the served folder overwritten behind the server's back,
vLLM's own reload without and with a path, ``rc_reload_weights``, refusals, and last the
failed vLLM reload that leaves the engine unusable.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

from rolloutcore.adapters.contract import AdapterError  # noqa: E402
from rolloutcore.adapters.http import HttpAdapter  # noqa: E402
from rolloutcore.adapters.vllm_worker import SERVER_ARGS  # noqa: E402
from rolloutcore.conformance.engines import checkpoint_target  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_model import (  # noqa: E402
    DEFAULT_OUT,
    build_models,
    load_references,
)
from rolloutcore.conformance.fixtures.vllm_server import VllmServer  # noqa: E402
from rolloutcore.engine.identity import (  # noqa: E402
    checkpoint_entries,
    checkpoint_identity,
    iter_tensor_bytes,
    write_safetensors,
)

STARTUP = "bytes loaded at startup"
RELOAD = "bytes loaded by reload_weights"
RC_RELOAD = "bytes loaded by rc_reload_weights"
PROBE = "medium"  # 14 prompt tokens (no full prefix block), 16 greedy output tokens


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    return {k: v.resolve() for k, v in build_models(DEFAULT_OUT).items()}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("worker-identity")


@pytest.fixture(scope="module")
def served(models: dict[str, Path], work: Path) -> Path:
    """The folder the server starts on: a copy of v1 (rewritten by a later step)."""
    out = work / "served"
    shutil.copytree(models["v1"], out)
    return out


@pytest.fixture(scope="module")
def http(served: Path, work: Path) -> Iterator[HttpAdapter]:
    # No vllm.general_plugins entry point runs (the allowlist names none): the load format
    # must be registered by the worker extension's import alone.
    srv = VllmServer(served, extra_args=list(SERVER_ARGS), log_path=work / "vllm.log",
                     env={"VLLM_PLUGINS": "none-of-them"})
    srv.start()
    adapter = HttpAdapter(srv.url, model=srv.served_model_name)
    try:
        yield adapter
    finally:
        adapter.close()
        srv.stop()


def identity(http: HttpAdapter) -> dict[str, Any]:
    r = http.rpc("rc_identity", op="test")
    assert r.status == 200, r.text
    res: dict[str, Any] = r.body["results"][0]
    return res


def vllm_reload(http: HttpAdapter, **kwargs: Any) -> Any:
    return http.rpc("reload_weights", op="test", idempotent=False, **kwargs)


def greedy_matches(http: HttpAdapter, version_dir: Path) -> bool:
    """The greedy probe equals ``version_dir``'s reference (prefix cache reset first)."""
    r = http.request("POST", "/reset_prefix_cache", op="test", idempotent=True)
    assert r.status == 200 and r.body.get("success") is True, r.text
    probe = next(p for p in load_references(version_dir)["probes"] if p["name"] == PROBE)
    out = http.generate(tuple(probe["prompt_token_ids"]), len(probe["output_token_ids"]))
    return list(out.tokens) == probe["output_token_ids"]


def test_startup_identity_is_the_digest_of_the_bytes_loaded(
        http: HttpAdapter, models: dict[str, Path], served: Path) -> None:
    res = identity(http)
    assert res["identity"] == checkpoint_identity(models["v1"]) == checkpoint_identity(served)
    assert res["basis"] == STARTUP and res["path"] == str(served)
    assert res["tensors"] == len(checkpoint_entries(served))
    assert greedy_matches(http, models["v1"])


def test_overwritten_files_do_not_change_the_identity(
        http: HttpAdapter, models: dict[str, Path], served: Path, work: Path) -> None:
    """The served folder now holds v2's bytes; the server still holds (and says) v1."""
    shutil.copyfile(models["v2"] / "model.safetensors", served / "model.safetensors")
    assert checkpoint_identity(served) == checkpoint_identity(models["v2"])
    res = identity(http)
    assert res["identity"] == checkpoint_identity(models["v1"]) and res["basis"] == STARTUP
    assert greedy_matches(http, models["v1"])
    # The answer does not come from the folder: it is the same with the folder gone.
    aside = work / "served-aside"
    served.rename(aside)
    try:
        assert identity(http)["identity"] == checkpoint_identity(models["v1"])
    finally:
        aside.rename(served)


def test_vllm_reload_without_a_path_reports_the_bytes_it_read(
        http: HttpAdapter, models: dict[str, Path], served: Path) -> None:
    """vLLM's no-argument reload re-reads model_config.model: now v2's bytes."""
    r = vllm_reload(http)
    assert r.status == 200, r.text
    res = identity(http)
    assert res["identity"] == checkpoint_identity(models["v2"]) and res["basis"] == RELOAD
    assert res["path"] == str(served)
    assert greedy_matches(http, models["v2"])


def test_vllm_reload_with_a_path_reports_that_checkpoint(
        http: HttpAdapter, models: dict[str, Path]) -> None:
    r = vllm_reload(http, weights_path=str(models["v1"]))
    assert r.status == 200, r.text
    res = identity(http)
    assert res["identity"] == checkpoint_identity(models["v1"]) and res["basis"] == RELOAD
    assert res["path"] == str(models["v1"])
    assert greedy_matches(http, models["v1"])


def test_rc_reload_identity_is_what_validation_expects(
        http: HttpAdapter, models: dict[str, Path]) -> None:
    target = checkpoint_target(models["v2"], 2, "v2-gen2")  # what the harness validates
    r = http.rpc("rc_reload_weights", op="test", idempotent=False,
                 weights_path=str(models["v2"]))
    loaded = r.body["results"][0]
    assert loaded["loaded"] is True and loaded["identity"] == target.identity
    res = identity(http)
    assert res["identity"] == target.identity and res["basis"] == RC_RELOAD
    assert res["path"] == str(models["v2"])
    assert greedy_matches(http, models["v2"])


def broken_checkpoint(src: Path, out: Path) -> Path:
    """``src`` with one layer-1 tensor a column short (as the harness builds it)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    victim = "model.layers.1.mlp.down_proj.weight"
    tensors: list[tuple[str, str, list[int], bytes]] = []
    for e, data in iter_tensor_bytes(checkpoint_entries(src)):
        if e.name == victim:
            rows, cols = e.shape
            item = e.nbytes // (rows * cols)
            data = b"".join(data[r * cols * item:(r * cols + cols - 1) * item]
                            for r in range(rows))
            tensors.append((e.name, e.dtype, [rows, cols - 1], data))
        else:
            tensors.append((e.name, e.dtype, list(e.shape), data))
    write_safetensors(out / "model.safetensors", tensors)
    return out


def test_refused_and_harmless_failures_keep_the_identity(
        http: HttpAdapter, models: dict[str, Path], work: Path) -> None:
    v2 = checkpoint_identity(models["v2"])
    broken = broken_checkpoint(models["v2"], work / "broken_v2")
    # rc_reload_weights refuses another manifest before touching the model.
    r = http.rpc("rc_reload_weights", op="test", idempotent=False, weights_path=str(broken))
    assert r.body["results"][0]["loaded"] is False
    # ... and an unexpected identity.
    r = http.rpc("rc_reload_weights", op="test", idempotent=False,
                 weights_path=str(models["v1"]), expected_identity=v2)
    assert r.body["results"][0]["loaded"] is False
    # vLLM's own reload of a missing folder fails while listing it, before the model is
    # touched (the default loader fails inside the load and kills the engine).
    r = vllm_reload(http, weights_path=str(work / "no-such-dir"))
    assert r.status == 500
    res = identity(http)
    assert res["identity"] == v2 and res["basis"] == RC_RELOAD
    assert greedy_matches(http, models["v2"])


def test_partial_vllm_reload_is_not_vouched_for(
        http: HttpAdapter, models: dict[str, Path], work: Path) -> None:
    """A checkpoint lacking a tensor: vLLM keeps the old one, the model holds a mix."""
    partial = work / "v1_without_norm"
    partial.mkdir()
    write_safetensors(partial / "model.safetensors",
                      [(e.name, e.dtype, e.shape, data) for e, data in
                       iter_tensor_bytes(checkpoint_entries(models["v1"]))
                       if e.name != "model.norm.weight"])
    r = vllm_reload(http, weights_path=str(partial))
    assert r.status == 200, r.text
    res = identity(http)
    assert res["identity"] is None and "may hold a mix" in res["reason"], res


def test_failed_vllm_reload_reports_no_identity(
        http: HttpAdapter, work: Path) -> None:
    """Last: vLLM's own reload of a checkpoint one column short dies halfway."""
    r = vllm_reload(http, weights_path=str(work / "broken_v2"))
    assert r.status == 500
    res = identity(http)
    assert res["identity"] is None and "did not finish (by reload_weights)" in res["reason"], res
    with pytest.raises(AdapterError, match="vouches for no single identity"):
        http.read_identity()
