"""A standby gateway: what ``rolloutcore serve`` answers while another controller leads
the fleet (controller failover). It admits nothing and changes nothing: every OpenAI and
admin route answers 503 naming the leader (a client retries on the leader, or here once
this one has taken over); ``/health`` and ``/admin/status`` say it is a standby."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def standby_app(leader: Callable[[], dict[str, Any] | None], controller: str) -> Starlette:
    """``leader()``: the current leader as the store shows it (None: none right now)."""

    def body() -> dict[str, Any]:
        return {"role": "standby", "controller": controller, "leader": leader()}

    async def status(_request: Request) -> Response:
        return JSONResponse(body())

    async def refuse(_request: Request) -> Response:
        info = body()
        who = info["leader"]
        where = (f"controller {who.get('id')!r} leads at epoch {who.get('epoch')}"
                 if isinstance(who, dict) else "no controller leads right now")
        return JSONResponse({"error": {"message": f"this gateway is a standby: {where}",
                                       "type": "standby", "code": 503}, **info},
                            status_code=503, headers={"retry-after": "1"})

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
    return Starlette(routes=[
        Route("/health", status, methods=["GET"]),
        Route("/admin/status", status, methods=["GET"]),
        Route("/{path:path}", refuse, methods=methods),
    ])


class StandbyServer:
    """The standby app served by uvicorn on a thread, on a duplicate of the gateway's
    socket (the gateway serves the original once this one is stopped)."""

    def __init__(self, sock: Any, app: Starlette) -> None:
        import uvicorn

        self.sock = sock.dup()
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="standby-uvicorn", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


__all__ = ["StandbyServer", "standby_app"]
