"""`TokenStream`: the streaming view of one invocation.

The invocation's events are an async generator driven by whoever reads the stream, in the reader's own
task: no task group or cancel scope is held across a `yield` to the reader (DESIGN §3), so nothing needs
an enclosing `async with`. Closing rules:

- the stream is read to its end, or raises: the model stream is already closed;
- `await stream.aclose()` or `async with stream:`: closes at once;
- the reading task is cancelled: the cancellation unwinds the pipeline, which closes the model stream
  before the cancellation reaches the reader;
- `break` out of `async for` (or dropping an unfinished stream): the loop's iterator is dropped, and
  its finalizer starts a fresh task that closes the pipeline a moment later, as the event loops' own
  async-generator finalizers do, but without relying on them (trio warns when it has to). Use
  `aclose()` or `async with` where the close must happen before the next line.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Self

from ._events import Completed, Event, Result, TextDelta, ThinkingDelta

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["TokenStream"]


def _close_later(events: AsyncGenerator[Event, None]) -> None:
    """Close an abandoned pipeline from a fresh task of the running event loop (from `__del__`)."""
    if getattr(events, "ag_frame", None) is None or getattr(events, "ag_running", False):
        return  # already finished, or being driven right now
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        trio = sys.modules.get("trio")
        if trio is None:
            return
        try:
            trio.lowlevel.spawn_system_task(events.aclose)
        except RuntimeError:
            return  # no trio run in this thread: nothing left to clean up with
    else:
        # What asyncio's own async-generator finalizer does, deferred out of `__del__`.
        loop.call_soon(loop.create_task, events.aclose())


class _Tokens(AsyncIterator[str]):
    """The iterator of one `async for` over a TokenStream; abandoning it closes the stream."""

    __slots__ = ("_done", "_stream")

    def __init__(self, stream: TokenStream) -> None:
        self._stream = stream
        self._done = False

    async def __anext__(self) -> str:
        try:
            return await self._stream.__anext__()
        except BaseException:
            self._done = True
            raise

    def __del__(self) -> None:
        if not self._done:
            self._stream._abandon()


class _Events(AsyncIterator[Event]):
    """`TokenStream.events()`: every remaining event; abandoning it closes the stream."""

    __slots__ = ("_done", "_stream")

    def __init__(self, stream: TokenStream) -> None:
        self._stream = stream
        self._done = False

    async def __anext__(self) -> Event:
        stream = self._stream
        try:
            event = await stream._events.__anext__()
        except BaseException as exc:
            self._done = True
            if not isinstance(exc, StopAsyncIteration):
                stream._error = exc
            raise
        if type(event) is Completed:
            stream._result = event.result
        return event

    async def aclose(self) -> None:
        self._done = True
        await self._stream.aclose()

    def __del__(self) -> None:
        if not self._done:
            self._stream._abandon()


class TokenStream(AsyncIterator[str]):
    """The text of an answer as it is released, over the invocation's full event stream.

    Iterate it for text deltas, or `events()` for every event; `await result()` for the final `Result`
    (reading the rest of the stream if needed). The stream can be read once; the views share it, so
    reading some tokens and then calling `result()` continues where the tokens stopped.
    """

    __slots__ = ("__weakref__", "_abandoned", "_error", "_events", "_result")

    def __init__(self, events: AsyncGenerator[Event, None]) -> None:
        self._events = events
        self._result: Result[str] | None = None
        self._error: BaseException | None = None
        self._abandoned = False

    def _abandon(self) -> None:
        if not self._abandoned:
            self._abandoned = True
            _close_later(self._events)

    async def __anext__(self) -> str:
        events = self._events
        while True:
            try:
                event = await events.__anext__()
            except StopAsyncIteration:
                raise
            except BaseException as exc:
                self._error = exc
                raise
            kind = type(event)
            if kind is TextDelta:
                return event.text  # type: ignore[union-attr]
            if kind is Completed:
                self._result = event.result  # type: ignore[union-attr]

    def __aiter__(self) -> AsyncIterator[str]:
        # A fresh iterator per `async for`: when the loop breaks and drops it, the pipeline is
        # closed even if the caller still holds this TokenStream.
        return _Tokens(self)

    def __del__(self) -> None:
        self._abandon()

    def events(self) -> AsyncIterator[Event]:
        """Every remaining event, in order (the last one is `Completed`).

        Closing it (`aclose()`) or abandoning it closes the stream, like the token iterator.
        """
        return _Events(self)

    async def result(self) -> Result[str]:
        """The final result; reads (and discards) the rest of the stream first.

        Raises whatever the invocation raised; raises `RuntimeError` if the stream was closed before it
        completed.
        """
        if self._result is None and self._error is None:
            events = _Events(self)
            try:
                async for _ in events:
                    pass
            finally:
                await events.aclose()
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise RuntimeError("the stream was closed before the invocation completed")
        return self._result

    async def run(
        self,
        *,
        on_partial: Callable[[str], Any] | None = None,
        on_thinking: Callable[[str], Any] | None = None,
        on_complete: Callable[[Result[str]], Any] | None = None,
        on_error: Callable[[Exception], Any] | None = None,
    ) -> Result[str] | None:
        """Read the whole stream, calling the callbacks: sugar over `events()`.

        Without `on_error`, errors are raised; with it, an `Exception` is passed to it and `None`
        returned. Cancellation is always raised.
        """
        events = _Events(self)
        try:
            async for event in events:
                kind = type(event)
                if kind is TextDelta:
                    if on_partial is not None:
                        on_partial(event.text)  # type: ignore[union-attr]
                elif kind is ThinkingDelta:
                    if on_thinking is not None:
                        on_thinking(event.text)  # type: ignore[union-attr]
            result = await self.result()
        except Exception as exc:
            if on_error is None:
                raise
            on_error(exc)
            return None
        finally:
            await events.aclose()
        if on_complete is not None:
            on_complete(result)
        return result

    async def aclose(self) -> None:
        """Stop the invocation and close the model stream. Idempotent.

        Must not be called while another task is reading the stream: cancel that task instead.
        """
        await self._events.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
