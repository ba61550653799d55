"""`TokenStream`: the streaming view of one invocation.

The invocation's events are an async generator driven by whoever reads the stream, in the reader's own
task: no task group or cancel scope is held across a `yield` to the reader (DESIGN §3), so nothing needs
an enclosing `async with`. Closing rules:

- the stream is read to its end, or raises: the model stream is already closed;
- `await stream.aclose()` or `async with stream:`: closes at once;
- the reading task is cancelled: the cancellation unwinds the pipeline, which closes the model stream
  before the cancellation reaches the reader;
- `break` out of `async for`: the loop's iterator is dropped, and its finalizer (run by the event loop's
  async-generator hooks, on asyncio and on trio) closes the pipeline a moment later. Use `aclose()` or
  `async with` where the close must happen before the next line.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Self

from ._events import Completed, Event, Result, TextDelta, ThinkingDelta

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["TokenStream"]


class TokenStream(AsyncIterator[str]):
    """The text of an answer as it is released, over the invocation's full event stream.

    Iterate it for text deltas, or `events()` for every event; `await result()` for the final `Result`
    (reading the rest of the stream if needed). The stream can be read once; the views share it, so
    reading some tokens and then calling `result()` continues where the tokens stopped.
    """

    __slots__ = ("__weakref__", "_error", "_events", "_result")

    def __init__(self, events: AsyncGenerator[Event, None]) -> None:
        self._events = events
        self._result: Result[str] | None = None
        self._error: BaseException | None = None

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
        return self._iterate()

    async def _iterate(self) -> AsyncGenerator[str, None]:
        # A fresh generator per `async for`: when the loop breaks and drops it, its finalizer closes
        # the pipeline even if the caller still holds this TokenStream.
        try:
            while True:
                try:
                    token = await self.__anext__()
                except StopAsyncIteration:
                    return
                yield token
        finally:
            await self._events.aclose()

    async def events(self) -> AsyncGenerator[Event, None]:
        """Every remaining event, in order (the last one is `Completed`). Closing it closes the stream."""
        events = self._events
        try:
            while True:
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    return
                except BaseException as exc:
                    self._error = exc
                    raise
                if type(event) is Completed:
                    self._result = event.result
                yield event
        finally:
            await events.aclose()

    async def result(self) -> Result[str]:
        """The final result; reads (and discards) the rest of the stream first.

        Raises whatever the invocation raised; raises `RuntimeError` if the stream was closed before it
        completed.
        """
        if self._result is None and self._error is None:
            async for _ in self.events():
                pass
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
        try:
            async for event in self.events():
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
