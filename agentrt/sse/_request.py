"""Reading a request: its body (JSON only, bounded), a stop's body, and the client's disconnect."""

from __future__ import annotations

import contextlib
import typing

from pydantic import BaseModel, ConfigDict

if typing.TYPE_CHECKING:
    import anyio
    from starlette.requests import Request

__all__ = ["StopRequest", "cancel_on_disconnect", "is_json", "read_body"]


class StopRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    runId: str
    threadId: str | None = None


def is_json(request: Request) -> bool:
    """Whether the request's body is JSON by its content type. Only JSON is read: a form or
    text/plain POST needs no CORS preflight, so any site could make a signed-in user's browser send
    one (and write into the user's conversation, or stop the user's run)."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


async def read_body(request: Request, limit: int) -> bytes | None:
    """The request body, or `None` when it is longer than `limit` bytes (read no further)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async with contextlib.aclosing(request.stream()) as body:  # closed when left early, too
        async for chunk in body:
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
    return b"".join(chunks)


async def cancel_on_disconnect(request: Request, scope: anyio.CancelScope) -> None:
    """Cancel `scope` when the client disconnects (the body was read: the next message says so)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return
