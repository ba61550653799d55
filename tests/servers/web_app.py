"""The web example (examples/web/app.py) served by uvicorn for the browser tests, on a model double
that streams 200 tokens 50 ms apart (so that the test can press Stop mid-stream), except for a
question that starts with "Refund order SO-7": that one is answered with a call of the example's
`refund` tool for 250 (over 100: it waits for the page's Allow or Deny), and the tool's result with
one sentence saying what came of it (the result as the tool gave it, or the denial's reason).

`GET /test/cancelled` answers once an invocation was cancelled (a long poll on the service's
`CancelledEvent`), saying whether the model double saw its stream closed. `GET /test/refunds` is
the refund tool's side-effect counter: each refund that ran, `[order_id, amount]`. `GET /test/stored`
is the last invocation's conversation as memory holds it, with the count of model requests and
invocations so far.

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
from agentrt import ModelRequest
from agentrt.testing import CallTool, Delay, FunctionModel, Script
from examples.web.app import create_app

SLOW: Script = [step for index in range(200) for step in (Delay(0.05), f"word{index} ")]
DENIED = "The user denied this call of 'refund'; it was not run."


def answer(request: ModelRequest) -> Script:
    last = request.messages[-1]
    if last.role == "tool":  # the refund's result (run or denied): what came of it, in one sentence
        if last.text.startswith(DENIED):
            reason = last.text.removeprefix(DENIED).strip().removeprefix("Reason:").strip()
            return f"I did not refund SO-7 (your reason: {reason or 'none given'})."
        return f"Done: {last.text}"
    if last.role == "user" and last.text.startswith("Refund order SO-7"):
        return [CallTool("refund", {"order_id": "SO-7", "amount": 250}, id="call_refund_1")]
    return SLOW


model = FunctionModel(answer)
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


async def stored(request: Request) -> JSONResponse:
    """The last invocation's conversation as memory holds it, and how many model requests were made."""
    messages = await agentrt.memory.access(app.state.service).read(conversations[-1])
    return JSONResponse(
        {
            "messages": [[m.role, m.text] for m in messages],
            "requests": len(model.requests),
            "invocations": len(conversations),
        }
    )


async def refunds(request: Request) -> JSONResponse:
    return JSONResponse(app.state.refunds.refunded)


app = create_app(model, listeners=(listen,))
app.router.routes.append(Route("/test/cancelled", was_cancelled))
app.router.routes.append(Route("/test/conversation", conversation))
app.router.routes.append(Route("/test/refunds", refunds))
app.router.routes.append(Route("/test/stored", stored))

if __name__ == "__main__":
    listener = socket.socket(fileno=int(sys.argv[1]))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    uvicorn.Server(config).run(sockets=[listener])
