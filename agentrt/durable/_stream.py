"""The text of a durable turn as it is made, through DBOS's stream of the turn's workflow.

A streamed turn's segments write to the workflow's stream `KEY` (DBOS streams: rows of its system
database, written from inside the segment's step, read from any process): at the start of each run of
a segment `{"segment": n}` (n counts the turn's segments), then lists of tokens as the pipeline
releases them (a `str` for a text delta, `None` for a `Reset`), and `{"approval": run_id}` where the
turn stops to wait for a human. A reader (`DurableStream`) turns that into a `TokenStream`'s tokens:
text, and `RESET` for a reset. A segment whose worker died after it had shown text is run again
from its start, so its text is shown twice: the reader sees its marker a second time and retracts
what the dead run showed, explicitly (`RESET`, then the text the turn had shown before that segment
since the last reset), and the new run's text follows. Live and late readers read the same values,
so they get the same tokens.

Writes coalesce: a write in flight takes every token that arrived while the one before it ran, so a
slow database delays the tokens (by at most one write) and does not slow the model stream down.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import anyio
from dbos import DBOS

from .._events import FailedEvent, Reset, TextDelta
from .._pipeline import StopAtBoundary
from .._pipeline._fold import _fold
from .._pipeline._runtime import notify
from .._stream import RESET

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
    from types import TracebackType

    from .._events import Event, Result
    from .._pipeline._turn import Turn

__all__ = ["KEY", "DurableStream", "checked", "fold"]

KEY: Final = "agentrt.text"
"""The key of a streamed turn's text in its workflow's streams."""


class Tokens:
    """What a segment shows, written to the turn's stream in the order it came by one writer task,
    one write at a time (the tokens that arrive during a write go in the next)."""

    __slots__ = ("_closed", "_parts", "_ready", "error")

    def __init__(self) -> None:
        self._parts: list[str | None] = []
        self._ready = anyio.Event()
        self._closed = False
        self.error: Exception | None = None

    def put(self, token: str | None) -> None:
        self._parts.append(token)
        self._ready.set()

    def close(self) -> None:
        """Nothing more comes: the writer writes what it has, and ends."""
        self._closed = True
        self._ready.set()

    async def write(self) -> None:
        """The writer task's body (it keeps a write's error in `error`, and writes no more)."""
        try:
            while True:
                if not self._parts:
                    if self._closed:
                        return
                    await self._ready.wait()
                    self._ready = anyio.Event()
                    continue
                parts, self._parts = self._parts, []
                await DBOS.write_stream_async(KEY, parts)
        except Exception as error:
            self.error = error


async def tapped(events: AsyncGenerator[Event, None], tokens: Tokens) -> AsyncGenerator[Event, None]:
    """`events`, each text delta and reset also put to `tokens`."""
    try:
        async for event in events:
            kind = type(event)
            if kind is TextDelta:
                tokens.put(event.text)  # type: ignore[union-attr]
            elif kind is Reset:
                tokens.put(None)
            yield event
    finally:
        await events.aclose()


async def fold(turn: Turn, events: AsyncGenerator[Event, None]) -> Result[Any]:
    """The fold of a streamed segment's `events` (as awaiting the method folds them), its text
    written to the turn's stream meanwhile; returns (or raises) once all of it is written."""
    tokens = Tokens()
    result: Result[Any] | None = None
    caught: BaseException | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(tokens.write)
        try:
            result = await _fold(turn, tapped(events, tokens))
        except BaseException as error:  # raised below, once the writer has written the rest
            caught = error
        finally:
            tokens.close()
    unwritten = tokens.error
    if caught is not None and (unwritten is None or not isinstance(caught, StopAtBoundary)):
        raise caught
    if unwritten is not None:
        # Some of the segment's text never reached the stream: the segment fails, even where the
        # turn itself stopped at a boundary, rather than readers missing text without a sign.
        if turn.runtime.listeners:
            notify(turn.runtime.listeners, FailedEvent(turn.id, unwritten))
        raise unwritten
    assert result is not None
    return result


def checked(offset: int) -> int:
    """A reader's `offset`, refused unless an int >= 0."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"agentrt.durable: a stream's offset is an int >= 0, got {offset!r}")
    return offset


_APPROVAL: Final = object()
"""Where the turn stopped to wait for approval, in a reader's sequence (`DurableStream._items`)."""


class DurableStream:
    """The text of a durable turn (`Engine.stream`, `Engine.read`, `Client.read`): its tokens as the
    turn releases them, `RESET` to discard the text so far (a reset of the turn's own, or the
    retraction of a segment whose worker died part way; the text it showed before that segment comes
    again after it). It ends when the turn ends (raising the turn's error, as `result` does, if it
    failed), or where the turn waits for approval (`waiting` is then true; read on from `offset` once
    it is decided). Read it in `async with`.

    Every reader of a turn reads the same sequence (tokens, and a stop at each approval), so a
    reader made with another's `offset` goes on exactly where that one stopped, mid-answer too: it
    reads the turn's stream from its start, silently up to `offset`, and so knows what to retract."""

    def __init__(
        self,
        values: AsyncGenerator[Any, None],
        turn_id: str,
        offset: int = 0,
        failed: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.turn_id = turn_id
        self.offset = checked(offset)
        """How far this reader's sequence was read (its tokens, and a stop at each approval): where
        another reader goes on (`Engine.read(turn_id, offset=...)`)."""
        self.waiting = False
        """The stream stopped where the turn waits for a human's decisions on an approval."""
        self._values = values  # the turn's stream, from its start
        self._failed = failed  # raises the turn's error if it failed (at the stream's end)
        self._tokens = self._read(offset)

    async def _read(self, skip: int) -> AsyncGenerator[str, None]:
        items = self._items()
        try:
            async for item in items:
                if skip:
                    skip -= 1
                    continue
                self.offset += 1
                if item is _APPROVAL:
                    self.waiting = True
                    return
                yield item  # type: ignore[misc]
        finally:
            await items.aclose()
        if self._failed is not None:
            await self._failed()

    async def _items(self) -> AsyncGenerator[object, None]:
        """The reader's sequence, from the stream's values: tokens, `RESET`, `_APPROVAL`."""
        segment: int | None = None
        held: list[str] = []  # what a reader holds: the text shown since the last reset
        before = ""  # what it held when the current segment started
        showed = False  # the current segment's run showed something (text or a reset)
        async for value in self._values:
            if isinstance(value, dict):
                if "approval" in value:
                    yield _APPROVAL
                    continue
                started = value["segment"]
                if started == segment and showed:
                    # The segment runs again: its worker died after it showed this. Retracted, and
                    # what the reader held before the segment comes again.
                    yield RESET
                    if before:
                        yield before
                    held = [before] if before else []
                else:
                    before = "".join(held)
                showed = False
                segment = started
                continue
            showed = True
            for token in value:
                if token is None:
                    held.clear()
                    yield RESET
                else:
                    held.append(token)
                    yield token

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        return await self._tokens.__anext__()

    async def aclose(self) -> None:
        await self._tokens.aclose()
        await self._values.aclose()

    async def __aenter__(self) -> DurableStream:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()
