"""`TokenStream` and `PartialStream`: the streaming views of one invocation.

The invocation's events are an async generator driven by whoever reads the stream, in the reader's own
task: no task group or cancel scope is held across a `yield` to the reader (DESIGN §3), so any task may
read or close it. The form to use closes it by construction, whatever ends the block:

    async with await svc.stream(...) as tokens:
        async for token in tokens: ...

Closing rules:

- the stream is read to its end, or raises: the model stream is already closed;
- `await stream.aclose()` or leaving `async with stream:`: closes at once;
- the reading task is cancelled: the cancellation unwinds the pipeline, which closes the model stream
  before the cancellation reaches the reader; the stream is then finished;
- `break` out of `async for` leaves the stream open where it stopped, like a file (no Python async
  iterator is closed by `break`): read on, call `result()`, or close it. Until then its turn holds
  its conversation; the task that holds it gets `ConversationReentryError` for a turn on that
  conversation instead of waiting forever.
- a stream collected unclosed (dropped, or left in a reference cycle) warns with a `ResourceWarning`
  naming its method, and is closed from a fresh task of the event loop it was made in, in whatever
  thread the collector runs. Its pipeline is kept reachable from this module until then, so that
  the loop's own async-generator finalizer never sees it: it is closed exactly once, by agentrt.
  Since nothing else can reach a collected stream, that close never races a reader.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final, Generic, Self, TypeVar

from ._backend import Schedule, home, spawn
from ._events import (
    ApprovalRequested,
    Completed,
    Event,
    Reset,
    Result,
    TextDelta,
    ThinkingDelta,
    ToolCallRequested,
)

if TYPE_CHECKING:
    from types import TracebackType

    from .memory._memory import Conversation
    from .output._partial import Snapshots

__all__ = ["RESET", "PartialStream", "TokenStream"]

T = TypeVar("T")

logger = logging.getLogger("agentrt")

# The pipelines of streams not closed yet, and the streams' readers of them (`_text`, `_every`). A
# stream left in a reference cycle would otherwise take its pipeline into the same garbage, and the
# collector would run both the stream's finalizer and the loop's async-generator finalizer: two
# closes of one generator, the second failing with "aclose(): asynchronous generator is already
# running" at every level of the model stream (and trio warning for each). Held here, the pipeline
# is closed once, by the stream's finalizer, then dropped. (A loop that shuts down first closes it
# itself: it knows every live async generator.)
_open: set[AsyncGenerator[Any, None]] = set()


async def _close_quietly(events: AsyncGenerator[Event, None]) -> None:
    try:
        await events.aclose()
    except Exception:
        logger.exception("closing an abandoned agentrt stream failed")
    finally:
        _open.discard(events)


def _close_later(events: AsyncGenerator[Event, None], schedule: Schedule | None) -> None:
    """Close an abandoned pipeline from a fresh task of the event loop it was made in (from
    `__del__`, which may run in any thread: the garbage collector runs where it runs); `schedule` is
    that loop's `home()`."""
    if schedule is None:
        _open.discard(events)
        return  # made outside an event loop: nothing to clean up with
    try:
        schedule(lambda: spawn(_close_quietly, events))
    except RuntimeError:
        # The loop is closed (trio's RunFinishedError is a RuntimeError): it closed its live async
        # generators as it shut down. Nothing to clean up with.
        _open.discard(events)


def _close_now(reader: AsyncGenerator[Any, None]) -> None:
    """Close a reader of a stream's events (`_text`, `_every`) suspended at a `yield`: its cleanup does
    not await, so it closes at once, in whatever thread, without a task of its loop. A reader some
    task is resuming right now is left to that task."""
    if getattr(reader, "ag_frame", None) is None:
        return
    closing = reader.aclose()
    try:
        closing.send(None)
    except (StopIteration, RuntimeError):  # closed; or running ("already running")
        return
    closing.close()  # (it awaited: it cannot have, but never leave it half closed)


class _ResetToken(str):
    """A one-of-a-kind `str`: equal only to itself (so `token == RESET`, `RESET in tokens` and a
    `match` on it never confuse it with an empty text delta), empty as text (so `"".join(tokens)`
    still gives what was streamed), and the same object after `copy`, `deepcopy` and `pickle`."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "agentrt.RESET"

    def __reduce__(self) -> str:
        return "RESET"  # pickled by name: the module's one instance


RESET: Final[str] = _ResetToken()
"""The token a `TokenStream` yields for a `Reset` event: discard the text shown so far (since the
previous reset); the text after it replaces it. It is equal only to itself (`token == RESET` or
`token is RESET`; never to an empty text delta); as text it is empty. Only streams whose output
guardrails release text early (`release="chunked"` or `"optimistic"`) yield it."""


def _stopped(approval: ApprovalRequested) -> Result[Any]:
    """The result of a stream that stopped for approval (`Result.approval`)."""
    assert approval.partial is not None
    return replace(approval.partial, approval=approval)


async def _text(
    events: AsyncGenerator[Event, None], stream: weakref.ref[TokenStream]
) -> AsyncGenerator[str, None]:
    """A `TokenStream`'s tokens: the text deltas of its events, and `RESET` for a reset. What the
    stream keeps (its result, an error for `result()`) is set through a weak reference: the stream
    holds this generator, which must not hold the stream (it would make a cycle of every stream)."""
    try:
        async for event in events:
            kind = type(event)
            if kind is TextDelta:
                yield event.text  # type: ignore[union-attr]
            elif kind is Reset:
                yield RESET
            elif kind is Completed or kind is ApprovalRequested:
                _keep_result(stream, event)
    except Exception as exc:
        _keep_error(stream, exc)
        raise


def _keep_result(stream: weakref.ref[Any], event: Event) -> None:
    """Keep the result a stream ended with (`Completed`, or `ApprovalRequested`) for `result()`."""
    view = stream()
    if view is not None:
        view._result = event.result if type(event) is Completed else _stopped(event)  # type: ignore[arg-type]


def _keep_error(stream: weakref.ref[Any], exc: Exception) -> None:
    """Keep the error a stream raised for `result()` (cancellation is not kept: it belongs to its
    scope)."""
    view = stream()
    if view is not None:
        view._error = exc


class _Tokens:
    """What `async for` reads a `TokenStream` with: the stream's one reader of its events (`_text`),
    resumed directly. Its `__anext__` is a slot holding the reader's own `__anext__`, which the
    interpreter finds and calls in C: a token then costs a generator resumed, not a coroutine made
    and run for it (about 900 instructions less). It holds the stream while the loop runs: the
    reader holds it only weakly, and the stream holds the reader."""

    if TYPE_CHECKING:
        __slots__ = ("_stream",)

        def __anext__(self) -> Awaitable[str]: ...

    else:
        __slots__ = ("__anext__", "_stream")

    def __init__(self, stream: TokenStream, reader: AsyncGenerator[str, None]) -> None:
        self._stream = stream
        self.__anext__ = reader.__anext__  # type: ignore[method-assign]

    def __aiter__(self) -> _Tokens:
        return self

    async def aclose(self) -> None:
        """Close the stream (idempotent): `aiter(stream)` closes as the stream does."""
        await self._stream.aclose()


async def _every(
    events: AsyncGenerator[Event, None], before: list[Event] | None, stream: weakref.ref[_View[Any]]
) -> AsyncGenerator[Event, None]:
    """A stream's events for `events()` and `result()`: those read before it was handed over
    (`before`, see `_View`), then the rest. What the stream keeps is set as `_text` sets it."""
    try:
        while before:
            yield before.pop(0)
        async for event in events:
            kind = type(event)
            if kind is Completed or kind is ApprovalRequested:
                _keep_result(stream, event)
            yield event
    except Exception as exc:
        _keep_error(stream, exc)
        raise


class _Events(AsyncIterator[Event]):
    """`TokenStream.events()`: every remaining event of the stream, through the stream's one reader
    of every event (`_every`), resumed directly (see `_Tokens`)."""

    if TYPE_CHECKING:
        __slots__ = ("_stream",)

        def __anext__(self) -> Awaitable[Event]: ...

    else:
        __slots__ = ("__anext__", "_stream")

    def __init__(self, stream: _View[Any]) -> None:
        self._stream = stream
        stream._claim()
        self.__anext__ = stream._reader_of_every().__anext__  # type: ignore[method-assign]

    async def aclose(self) -> None:
        """Close the stream (idempotent)."""
        await self._stream.aclose()


class _View(Generic[T]):
    """What the streaming views share: the invocation's events, read once; `events()`, `result()`,
    `aclose()`, `async with`, and the close of an abandoned stream.

    `where` names the method (`Class.method`) in the warning for a stream collected unclosed;
    `conversation` is the one its turn holds, if any: it follows the task that reads the stream;
    `before` are the events read from `events` before it was handed over (`Started`,
    `RequestIssued`, ...: none of them text), which `events()` gives first and the text views skip.
    """

    __slots__ = (
        "__weakref__",
        "_before",
        "_conversation",
        "_error",
        "_events",
        "_every",
        "_home",
        "_result",
        "_text",
        "_where",
    )

    def __init__(
        self,
        events: AsyncGenerator[Event, None],
        *,
        where: str = "an agentrt stream",
        conversation: Conversation | None = None,
        before: list[Event] | None = None,
    ) -> None:
        self._events = events
        self._before = before
        self._result: Result[T] | None = None
        self._error: Exception | None = None
        self._home = home()
        self._where = where
        self._conversation = conversation
        self._text: AsyncGenerator[str, None] | None = None  # a TokenStream's reader of its events
        self._every: AsyncGenerator[Event, None] | None = None  # the reader for `events()`
        _open.add(events)

    def __del__(self) -> None:
        for reader in self._readers():
            _open.discard(reader)
            _close_now(reader)
        events = self._events
        if getattr(events, "ag_frame", None) is None:
            _open.discard(events)  # finished or closed: nothing to clean up
            return
        conversation = self._conversation
        if conversation is not None:
            conversation.abandon()
        _close_later(events, self._home)
        # Last: under an "error" warnings filter the warning is raised (and reported as unraisable).
        if self._result is None:  # read up to `Completed`, it holds nothing: no need to warn
            warnings.warn(
                f"{self._where}: a stream was collected without being closed or read to its end; "
                "closing it now. Use `async with await service.method(...) as stream:`",
                ResourceWarning,
                stacklevel=1,
                source=self,
            )

    def __aiter__(self) -> Self:
        self._claim()
        before = self._before
        if before:  # read for text: the events before it are not text, and not read later
            before.clear()  # (the list `_every` reads them from, if it was made)
        return self

    def _readers(self) -> list[AsyncGenerator[Any, None]]:
        """The readers of the stream's events made so far (`_text`, `_every`)."""
        return [reader for reader in (self._text, self._every) if reader is not None]

    def _reader_of_every(self) -> AsyncGenerator[Event, None]:
        every = self._every
        if every is None:
            every = self._every = _every(self._events, self._before, weakref.ref(self))
            _open.add(every)  # (see `_open`)
        return every

    def _claim(self) -> None:
        """The running task reads the stream: its turn's conversation is that task's to close."""
        conversation = self._conversation
        if conversation is not None and conversation.held:
            conversation.claim()

    def events(self) -> AsyncIterator[Event]:
        """Every remaining event, in order (the last one is `Completed`)."""
        return _Events(self)

    async def result(self) -> Result[T]:
        """The final result; reads (and discards) the rest of the stream first.

        Raises whatever the invocation raised; raises `RuntimeError` if the stream was closed or
        cancelled before it completed. A stream that stopped for a human's approval (it ended with
        `ApprovalRequested`) gives a `Result` whose `approval` is set and whose value is `None`.
        """
        if self._result is None and self._error is None:
            async for _ in _Events(self):
                pass
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise RuntimeError("the stream was closed before the invocation completed")
        return self._result

    @property
    def approval(self) -> ApprovalRequested | None:
        """The `ApprovalRequested` the stream ended with, once read to it (see `agentrt.resume`)."""
        result = self._result
        return result.approval if result is not None else None

    async def aclose(self) -> None:
        """Stop the invocation, close the model stream and release the conversation. Idempotent.

        Must not be called while another task is reading the stream: cancel that task instead.
        """
        readers = self._readers()
        try:
            for reader in readers:
                await reader.aclose()
            await self._events.aclose()
        finally:
            _open.discard(self._events)
            for reader in readers:
                _open.discard(reader)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class TokenStream(_View[str], AsyncIterator[str]):
    """The text of an answer as it is released, over the invocation's full event stream.

    Read it in `async with`, which closes it however the block ends (`break` included) and so
    releases the model stream and the conversation at once::

        async with await svc.stream(...) as tokens:
            async for token in tokens:
                ...

    Iterate it for text deltas (and `RESET`, under a `chunked` or `optimistic` output guardrail
    release, or when an answer that did not parse is asked for again: discard the text so far), or
    `events()` for every event; `await result()` for the final `Result` (reading the rest of the
    stream if needed). The stream can be read once; the views share it, so reading some tokens and
    then calling `result()` continues where the tokens stopped.
    """

    __slots__ = ()

    def __aiter__(self) -> AsyncIterator[str]:  # type: ignore[override]
        super().__aiter__()
        return _Tokens(self, self._reader())

    async def __anext__(self) -> str:
        # A coroutine, not the reader's own awaitable: it holds the stream while it waits (the reader
        # holds it only weakly), so a stream named nowhere else is not collected (and closed) under
        # `anext(stream)`. `async for` resumes the reader directly (`_Tokens`).
        return await self._reader().__anext__()

    def _reader(self) -> AsyncGenerator[str, None]:
        """The one generator that reads the stream's events for text, for the stream's life."""
        text = self._text
        if text is None:
            text = self._text = _text(self._events, weakref.ref(self))
            _open.add(text)  # (see `_open`)
        return text

    async def run(
        self,
        *,
        on_partial: Callable[[str], Any] | None = None,
        on_thinking: Callable[[str], Any] | None = None,
        on_reset: Callable[[], Any] | None = None,
        on_complete: Callable[[Result[str]], Any] | None = None,
        on_error: Callable[[Exception], Any] | None = None,
    ) -> Result[str] | None:
        """Read the whole stream, calling the callbacks: sugar over `events()`. `on_reset` is
        called for a `Reset`: discard the text and thinking passed to the callbacks since the
        previous one.

        Without `on_error`, errors are raised; with it, an `Exception` is passed to it and `None`
        returned. Cancellation is always raised. The stream is closed when this returns.
        """
        try:
            async for event in _Events(self):
                kind = type(event)
                if kind is TextDelta:
                    if on_partial is not None:
                        on_partial(event.text)  # type: ignore[union-attr]
                elif kind is ThinkingDelta:
                    if on_thinking is not None:
                        on_thinking(event.text)  # type: ignore[union-attr]
                elif kind is Reset:
                    if on_reset is not None:
                        on_reset()
            result = await self.result()
        except Exception as exc:
            if on_error is None:
                raise
            on_error(exc)
            return None
        finally:
            await self.aclose()
        if on_complete is not None:
            on_complete(result)
        return result


class PartialStream(_View[T], AsyncIterator[T]):
    """A structured answer as it streams in: validated partial snapshots of the value, then the final,
    fully validated value (`-> PartialStream[T]` or `-> AsyncIterator[T]` for a type that is not
    `str`).

    Each snapshot is the whole value so far, validated with pydantic's partial validation over the
    complete JSON values received (a string or number appears once it is complete; a list grows by
    whole items; a model appears once its required fields are in): later ones supersede earlier ones.
    Equal snapshots are not repeated, and the last item is always the final value, the same as
    `(await stream.result()).value`. After a `Reset` (an answer that did not parse is asked for again,
    and replayed whole) and after a response that called tools, the snapshots start over from the
    next answer. `events()`, `result()`,
    `aclose()` and `async with` are as on `TokenStream`: read it as
    `async with await svc.method(...) as values:`.
    """

    __slots__ = ("_snapshots",)

    def __init__(
        self,
        events: AsyncGenerator[Event, None],
        snapshots: Snapshots,
        *,
        where: str = "an agentrt stream",
        conversation: Conversation | None = None,
        before: list[Event] | None = None,
    ) -> None:
        super().__init__(events, where=where, conversation=conversation, before=before)
        self._snapshots = snapshots

    @property
    def snapshots(self) -> Snapshots:
        """The partial values of the text read so far (for a reader of `events()`, e.g. `agentrt.sse`)."""
        return self._snapshots

    async def __anext__(self) -> T:
        events = self._events
        snapshots = self._snapshots
        while True:
            try:
                event = await events.__anext__()
            except Exception as exc:
                if not isinstance(exc, StopAsyncIteration):
                    self._error = exc
                raise
            kind = type(event)
            if kind is TextDelta:
                if snapshots.feed(event.text):  # type: ignore[union-attr]
                    return snapshots.value  # type: ignore[no-any-return]
            elif kind is Completed:
                result: Result[T] = event.result  # type: ignore[union-attr]
                self._result = result
                if snapshots.final(result.value):
                    return result.value
            elif kind is ApprovalRequested:
                self._result = _stopped(event)  # type: ignore[arg-type]
            elif kind is Reset or kind is ToolCallRequested:
                snapshots.reset()  # what came before is withdrawn, or was no answer (it called tools)
