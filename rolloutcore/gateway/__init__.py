"""The version-binding OpenAI-compatible gateway (``rolloutcore serve``).

RL frameworks talk to vLLM over its OpenAI API; the gateway stands in front of a
:class:`~rolloutcore.fleet.Fleet` so that this traffic goes through RolloutCore: every
request is admitted (bound to the committed generation, on a serving engine) before it
is forwarded and released when its answer ends, and every answer names the generation,
the identity of the weights and the engine that produced it.

* :mod:`.core`: admission through a bounded queue, the staleness floor, admin operations;
* :mod:`.app`: the Starlette application (OpenAI routes, admin API, ``/metrics``);
* :mod:`.metrics`: Prometheus metrics in a registry of their own;
* :mod:`.collector`: trajectory records of answered requests;
* :mod:`.wire`: the headers a client sends and every answer carries;
* :mod:`.server`: uvicorn with a clean stop, on the main thread or a thread of its own;
* :mod:`.standby`: what answers while another controller leads (the ``serve`` command
  is :mod:`rolloutcore.cli.serve`).

Nothing is imported here, so that the command line stays quick to start.
"""
