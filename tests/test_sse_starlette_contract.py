"""What `agentrt.sse._response.StreamResponse` relies on in sse-starlette beyond its documented API
(pyproject.toml bounds the version to the releases this holds for; a new release that changes one
of these fails here first, not in a stopped run's last chunks):

- each `http.response.body` message carries the bytes the body iterator yielded, unchanged, one
  message a chunk: `StreamResponse` knows which chunk a send carried by comparing them (`Sent`);
- the response's start is sent before the body iterator is first asked (`Tee.began`);
- `_ping(self, send)` is the keep-alive task, a method a subclass overrides (a `"detach"` run's
  failed ping marks its client gone instead of ending the response), cancelled when the body ends;
- the client's disconnect is read through the `receive` given to `__call__` (`_runs.Detaching`
  wraps it), and it ends the response;
- a send that outlasts `send_timeout` raises a `TimeoutError` out of `__call__`, not wrapped in an
  exception group.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sse_starlette import EventSourceResponse

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

SCOPE = {"type": "http", "method": "POST", "path": "/", "headers": []}


def test_the_installed_version_is_within_the_bounds_pyproject_gives() -> None:
    # 3.4.1 is the first release all of the below holds for (3.4.0 wraps a send timeout in an
    # exception group); a 4.x may change any of it.
    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    assert "sse-starlette>=3.4.1,<4" in project["dependencies"]
    version = tuple(int(part) for part in importlib.metadata.version("sse-starlette").split(".")[:3])
    assert (3, 4, 1) <= version < (4,)


async def test_each_body_message_carries_the_yielded_bytes_after_the_start() -> None:
    log: list[Any] = []
    chunks = [b"data: one\n\n", b"data: two\n\n"]

    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            log.append(("asked", chunk))
            yield chunk

    async def send(message: dict[str, Any]) -> None:
        log.append(message)

    async def receive() -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError

    await EventSourceResponse(body(), ping=None, sep="\n")(SCOPE, receive, send)

    assert log[0]["type"] == "http.response.start"
    assert log[1] == ("asked", chunks[0])
    sent = [m for m in log if isinstance(m, dict) and m["type"] == "http.response.body"]
    assert [m["body"] for m in sent] == [*chunks, b""]
    assert all(m["body"] is c for m, c in zip(sent, chunks, strict=False))
    assert [m["more_body"] for m in sent] == [True, True, False]


async def test_the_ping_task_is_the_overridable_ping_method_and_ends_with_the_body() -> None:
    pinged = anyio.Event()
    finished = anyio.Event()

    class Pinging(EventSourceResponse):
        async def _ping(self, send: Any) -> None:
            try:
                pinged.set()
                await anyio.sleep_forever()
            finally:
                finished.set()

    async def body() -> AsyncIterator[bytes]:
        await pinged.wait()  # the ping task runs while the body is read
        yield b"data: x\n\n"

    async def send(message: dict[str, Any]) -> None:
        pass

    async def receive() -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError

    await Pinging(body(), ping=1000)(SCOPE, receive, send)
    assert finished.is_set()


async def test_a_disconnect_read_through_receive_ends_the_response() -> None:
    closed = anyio.Event()

    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"data: x\n\n"
            await anyio.sleep_forever()
            yield b"never"
        finally:
            closed.set()

    async def send(message: dict[str, Any]) -> None:
        pass

    read = False

    async def receive() -> dict[str, Any]:
        nonlocal read
        read = True
        return {"type": "http.disconnect"}

    with anyio.fail_after(30):  # (only if the response would hang: no timing asserted)
        await EventSourceResponse(body(), ping=None)(SCOPE, receive, send)
    assert read
    assert closed.is_set()  # the body was cancelled where it waited


async def test_a_send_past_send_timeout_raises_a_timeout_error_out_of_the_call() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b"data: x\n\n"

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            await anyio.sleep_forever()

    async def receive() -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError

    with pytest.raises(TimeoutError):
        await EventSourceResponse(body(), ping=None, send_timeout=0.01)(SCOPE, receive, send)
