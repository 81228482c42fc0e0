"""An RL framework's own engine actor adopting RolloutCore: the example the tests run.

:class:`FrameworkServer` is shaped like verl's ``vLLMHttpServer`` and SkyRL's
``VLLMServerActor``: an async Ray actor that builds its ``AsyncLLM`` on the actor's own
event loop in ``launch_server`` and generates for its trainer with its own methods. It
knows nothing of RolloutCore but two engine arguments
(:data:`~rolloutcore.adapters.vllm_worker.ENGINE_ARGS`: the worker extension and the
identity loader). :class:`RolloutCoreFrameworkServer` is the whole adoption: the
:class:`~rolloutcore.adapters.ray_engine.AdoptedEngineActor` mixin and one line after the
engine runs; a :class:`~rolloutcore.adapters.ray_engine.RayAdapter` over its handle then
drives its lifecycle, and the framework keeps calling its own ``generate``.
"""

from __future__ import annotations

from typing import Any

from rolloutcore.adapters.ray_engine import AdoptedEngineActor
from rolloutcore.adapters.vllm_worker import ENGINE_ARGS


class FrameworkServer:
    """The framework's engine actor (``ray.remote`` it as an async actor)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.engine: Any = None

    async def launch_server(self) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs: dict[str, Any] = {**ENGINE_ARGS}  # what RolloutCore needs of the engine
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
            model=self.model, served_model_name=["tiny"], dtype="float32", max_model_len=512,
            enable_prefix_caching=True, max_num_seqs=8, enforce_eager=True,
            kv_cache_memory_bytes=64 << 20, block_size=32,
            distributed_executor_backend="uni", **kwargs))

    async def generate(self, prompt_ids: list[int], max_tokens: int, request_id: str
                       ) -> list[int]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, temperature=0.0)
        final = None
        async for out in self.engine.generate(TokensPrompt(prompt_token_ids=prompt_ids),
                                              params, request_id):
            final = out
        assert final is not None
        return list(final.outputs[0].token_ids)


class RolloutCoreFrameworkServer(AdoptedEngineActor, FrameworkServer):
    """The same actor, governed by RolloutCore."""

    async def launch_server(self) -> None:
        await super().launch_server()
        self.adopt(self.engine)


__all__ = ["FrameworkServer", "RolloutCoreFrameworkServer"]
