"""One connection to an MCP server (`agentrt.mcp`): the SDK's client, held in one task of the
source's task group, and the transport's read stream watched for the server closing it."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import typing
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Final, TextIO

import anyio
import anyio.abc
import mcp_types
from mcp import Client
from mcp_types import Implementation, ToolListChangedNotification

if typing.TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from mcp.shared.message import SessionMessage

    from .mcp import _State

logger = logging.getLogger("agentrt.mcp")

_CLOSE_GRACE: Final = 5.0
_CLIENT: Final = Implementation(name="agentrt", version="0.1")


def stderr() -> TextIO:
    """This process's stderr for a server's, when it is a file (not when a test or a notebook
    replaced it with an object that has no file descriptor: then the original one)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return typing.cast("TextIO", subprocess.DEVNULL)


class Watched:
    """The transport's read stream, telling its link when the server closed it (a stdio server's
    process exited): the next call connects again instead of failing."""

    def __init__(self, stream: Any, link: Link) -> None:
        self._stream = stream
        self._link = link

    @property
    def last_context(self) -> Any:
        return getattr(self._stream, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._link.close()
            raise
        return item

    async def aclose(self) -> None:
        await self._stream.aclose()

    def __aiter__(self) -> Watched:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Watched:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class Link:
    """One connection to a server: the SDK's client, entered and left in one task of the source's
    task group, which waits until the link is closed."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.client: Client | None = None
        self.error: BaseException | None = None
        self.gone = anyio.Event()
        """Set once the link cannot carry another call: closed, failed, or its server closed it."""
        self._stop = anyio.Event()

    @property
    def closed(self) -> bool:
        return self.gone.is_set()

    def close(self) -> None:
        """Close the link (its task leaves the client: a stdio server's process is stopped)."""
        self.gone.set()
        self._stop.set()

    @asynccontextmanager
    async def _watched(self, transport: Any) -> AsyncIterator[tuple[Watched, Any]]:
        async with transport as (read, write):
            yield Watched(read, self), write

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect, report (`task_status.started()`, with `error` set when connecting failed), then
        hold the connection until `close()`. Never raises but cancellation: a server that fails
        must not take the source's task group, and the application in it, down."""
        server = self.state.server
        started = False
        # One scope around the whole connection (its transport's task groups are entered inside
        # it): its deadline bounds connecting, then it is lifted.
        with anyio.CancelScope(deadline=anyio.current_time() + server.connect_timeout) as scope:
            try:
                async with AsyncExitStack() as stack:
                    transport = self._watched(server._transport(stack))
                    client = Client(
                        transport,
                        mode=server.mode,
                        message_handler=self._on_message,
                        client_info=_CLIENT,
                        cache=None,
                    )
                    await stack.enter_async_context(client)
                    self.client = client
                    group = await stack.enter_async_context(anyio.create_task_group())
                    if client.protocol_version in mcp_types.version.MODERN_PROTOCOL_VERSIONS:
                        # Change notifications come on a `subscriptions/listen` stream only.
                        await group.start(self._listen, client)
                    scope.deadline = math.inf
                    started = True
                    task_status.started()
                    await self._stop.wait()
                    group.cancel_scope.cancel()
                    # Leaving may wait on the server (an HTTP session is ended with a request): a
                    # while, not forever (a stdio process is stopped in any case, shielded).
                    scope.deadline = anyio.current_time() + _CLOSE_GRACE
            except Exception as exc:
                self.error = exc
                if started:
                    logger.warning("MCP server %r: the connection failed: %r", server.label, exc)
            finally:
                self.client = None
                self.gone.set()
        if scope.cancelled_caught and not started:  # (cancelled by its deadline: not another's)
            self.error = TimeoutError(f"no connection within {server.connect_timeout:g} s")
        if not started:
            task_status.started()

    async def _listen(self, client: Client, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Hold a `subscriptions/listen` stream for tool list changes (2026-07-28 and later)."""
        listening = False
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                listening = True
                task_status.started()
                async for _ in subscription:
                    pass  # each change also reaches `_on_message`, which marks the list stale
        except Exception as exc:
            logger.info("MCP server %r: no tool list changes: %r", self.state.server.label, exc)
        if not listening:
            task_status.started()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, ToolListChangedNotification):
            self.state.changed()
        elif isinstance(message, Exception):
            logger.debug("MCP server %r: transport: %r", self.state.server.label, message)
