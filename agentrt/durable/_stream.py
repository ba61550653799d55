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

from .._events import Reset, TextDelta
from .._pipeline._fold import _fold
from .._stream import RESET

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator
    from types import TracebackType

    from .._events import Event, Result
    from .._pipeline._turn import Turn

__all__ = ["KEY", "DurableStream", "fold"]

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
    if caught is not None:
        raise caught
    if tokens.error is not None:
        raise tokens.error
    assert result is not None
    return result


class DurableStream:
    """The text of a durable turn (`Engine.stream`, `Engine.read`, `Client.read`): its tokens as the
    turn releases them, `RESET` to discard the text so far (a reset of the turn's own, or the
    retraction of a segment whose worker died part way; the text it showed before that segment comes
    again after it). It ends when the turn ends, or where the turn waits for approval (`waiting` is
    then true; read on from `offset` once it is decided). Read it in `async with`."""

    def __init__(self, values: AsyncGenerator[Any, None], turn_id: str, offset: int = 0) -> None:
        self.turn_id = turn_id
        self.offset = offset
        """The position in the turn's stream after the last value read: where a reader goes on."""
        self.waiting = False
        """The stream stopped where the turn waits for a human's decisions on an approval."""
        self._values = values
        self._tokens = self._read()

    async def _read(self) -> AsyncGenerator[str, None]:
        segment: int | None = None
        held: list[str] = []  # what a reader holds: the text shown since the last reset
        before = ""  # what it held when the current segment started
        showed = False  # the current segment's run showed something (text or a reset)
        async for value in self._values:
            self.offset += 1
            if isinstance(value, dict):
                if "approval" in value:
                    self.waiting = True
                    return
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
