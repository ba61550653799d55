"""The web example (examples/web/app.py) served by uvicorn for the browser test, on a model double
that streams 200 tokens 50 ms apart (so that the test can press Stop mid-stream).

`GET /test/cancelled` answers once an invocation was cancelled (a long poll on the service's
`CancelledEvent`), saying whether the model double saw its stream closed.

Run as `python web_app.py <fd>` to serve on an already listening socket inherited as `<fd>`.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import anyio
import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `examples`

import agentrt
from agentrt.testing import Delay, ScriptedModel
from examples.web.app import create_app

model = ScriptedModel([step for index in range(200) for step in (Delay(0.05), f"word{index} ")])
cancelled = anyio.Event()
conversations: list[object] = []  # the memory id of each invocation


def listen(event: agentrt.LifecycleEvent) -> None:
    if isinstance(event, agentrt.Started):
        conversations.append(event.memory_id)
    if isinstance(event, agentrt.CancelledEvent):
        cancelled.set()


async def was_cancelled(request: Request) -> JSONResponse:
    with anyio.move_on_after(20):
        await cancelled.wait()
        stream = model.streams[-1]
        stored = await agentrt.memory.access(app.state.service).read(conversations[-1])
        return JSONResponse(
            {"cancelled": True, "closed": stream.closed, "completed": stream.completed, "stored": len(stored)}
        )
    return JSONResponse({"cancelled": False}, status_code=504)


async def conversation(request: Request) -> JSONResponse:
    return JSONResponse({"memory_id": conversations[-1]})


app = create_app(model, listeners=(listen,))
app.router.routes.append(Route("/test/cancelled", was_cancelled))
app.router.routes.append(Route("/test/conversation", conversation))

if __name__ == "__main__":
    listener = socket.socket(fileno=int(sys.argv[1]))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[listener])
