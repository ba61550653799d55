"""The SSE side of runs that outlive their connection (`agentrt.runs`): the run that writes a
stream's frames to its log, and the response that reads a log to a client.

The writer runs in the `Runs` manager's task group; the reader is a request's response: the one that
started the run, or one that resumes it (`Last-Event-ID`, on any worker sharing the log).

With `on_disconnect="cancel"` the first reader is the run's client: its hang-up cancels the run, and
the turn is stored only once the answer's final frame was sent to it (the writer waits for the reader
to say so, see `Live.delivered`). With `"detach"` the run goes on without it, and stores its turn as
an awaited call would.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Final, Literal

import anyio
import anyio.lowlevel
from pydantic_core import to_jsonable_python
from sse_starlette import EventSourceResponse

from . import _frontends
from ._events import ApprovalRequested, Completed, Reset, TextDelta, ToolCallRequested
from ._stream import PartialStream, TokenStream
from .runs import RunGone, RunLog

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

logger = logging.getLogger("agentrt.sse")

Disconnect = Literal["cancel", "detach"]

SETTLE: Final = 2
"""Event-loop turns between the send of the answer's final frame and telling the writer that it
was sent (it then stores the turn): a hang-up the server read before the send cancels the response
within them (see `agentrt.sse._SETTLE`)."""

MAX_RUN_ID: Final = 200
"""The longest run id a `Last-Event-ID` names (`parse_event_id`): AG-UI's client-named ids too."""

_WAITED: Final = 0.0005
_WRITES_PER_TURN: Final = 3


class Live:
    """A run this process writes: how to stop it, and (with `"cancel"`) the handshake with the
    reader that started it: `final` is the seq of the answer's final frame, `delivered` says that
    its send returned (the writer then stores the turn)."""

    __slots__ = ("delivered", "final", "scope", "sent", "stopped", "told")

    def __init__(self, sent: _frontends.Sent | None) -> None:
        self.scope: anyio.CancelScope | None = None
        self.stopped = False
        self.sent = sent
        self.final = -1
        self.delivered = False
        self.told: anyio.Event | None = None

    def stop(self) -> None:
        self.stopped = True
        if self.scope is not None:
            self.scope.cancel()

    def deliver(self) -> None:
        self.delivered = True
        if self.told is not None:
            self.told.set()

    def abandon(self) -> None:
        """The run's client hung up (`"cancel"`): stop the run unless its answer reached it."""
        if not self.delivered:
            self.stop()


async def write(
    stream: TokenStream | PartialStream[Any] | None,
    encoder: _frontends.Encoder,
    log: RunLog,
    run: str,
    live: Live,
    policy: Disconnect,
    result_json: Callable[[Any], dict[str, Any]],
    error_json: Callable[[BaseException], dict[str, Any]],
) -> None:
    """Run `stream` to its end, its frames appended to `run`'s log as they are made (`stream` is
    `None` for a run stopped before the model answered)."""
    snapshots = stream.snapshots if isinstance(stream, PartialStream) else None
    frame = encoder.frame
    append = log.append
    sent = live.sent
    seq = 0
    prefix = run + ":"

    def put(chunks: Sequence[Any]) -> None:
        nonlocal seq
        for chunk in chunks:
            event = frame(chunk)
            seq += 1
            event.id = prefix + str(seq)
            append(run, seq, event.encode())
            if sent is not None:
                sent.confirm(chunk)

    try:
        try:
            # Stopped before it began (a stop while the model accepted it, or while its log opened):
            # its stream is not read at all (a pre-cancelled scope stops it only at a checkpoint,
            # and a stream's buffered events may all come without one).
            early = live.stopped
            with anyio.CancelScope() as scope:
                live.scope = scope
                put(encoder.opened())
                if stream is not None and not early:
                    try:
                        async for event in stream.events():
                            kind = type(event)
                            if kind is Completed:
                                result = event.result  # type: ignore[union-attr]
                                chunks = encoder.completed(result, result_json(result))
                                if policy == "cancel":
                                    live.final = seq + len(chunks)
                                    live.told = anyio.Event()
                                    put(chunks)
                                    await log.flush(run)
                                    if not live.delivered:
                                        await live.told.wait()
                                    # delivered: reading on stores the turn (see `DEFER_COMMIT`)
                                    with anyio.CancelScope(shield=True):
                                        async for _ in stream.events():
                                            pass
                                    break
                                put(chunks)
                            elif kind is ApprovalRequested:
                                put(encoder.approval(event))  # type: ignore[arg-type]
                            else:
                                put(encoder.event(event))
                                if snapshots is not None:
                                    if kind is TextDelta:
                                        if snapshots.feed(event.text):  # type: ignore[union-attr]
                                            value = to_jsonable_python(snapshots.value, fallback=str)
                                            put(encoder.partial(value))
                                    elif kind is Reset or kind is ToolCallRequested:
                                        snapshots.reset()
                    except Exception as error:
                        logger.exception("agentrt.sse: the stream failed")
                        put(encoder.failed(error_json(error)))
        except anyio.get_cancelled_exc_class():
            # The manager is closing (the app shuts down): the run ends as a stopped one.
            put(encoder.stopped(sent if sent is not None else _frontends.Sent()))
            if encoder.done_marker:
                put([_frontends.DONE])
            raise
        live.scope = None
        if scope.cancelled_caught or early:
            if stream is not None:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
            put(encoder.stopped(sent if sent is not None else _frontends.Sent()))
        if encoder.done_marker:
            put([_frontends.DONE])
    finally:
        if stream is not None:
            with anyio.CancelScope(shield=True):
                await stream.aclose()
        with anyio.CancelScope(shield=True):
            await log.end(run)


def response(
    log: RunLog,
    run: str,
    after: int,
    encoder: _frontends.Encoder,
    live: Live | None,
    policy: Disconnect,
    *,
    ping: float | None,
    headers: dict[str, str],
    send_timeout: float | None,
) -> EventSourceResponse:
    """The response that reads `run`'s log after `after` to its end. `live` is given to the reader
    that started the run: with `"cancel"`, its hang-up stops the run and it tells the writer when
    the answer's final frame was sent."""

    async def frames() -> AsyncIterator[bytes]:
        written = 0
        resumed = 0.0
        clock = time.perf_counter
        batches = getattr(log, "read_batches", None)
        reading = batches(run, after) if batches is not None else _one_by_one(log.read(run, after))
        try:
            # A batch is every frame there was when the reader woke: one write, not one each.
            async for first, batch in reading:
                if clock() - resumed > _WAITED:
                    written = 0
                if live is not None and first <= live.final < first + len(batch):
                    # The answer's final frame goes alone: the frames before it, the final frame,
                    # the turns in which a hang-up read before its send lands, then the rest.
                    at = live.final - first
                    head, final, tail = batch[:at], batch[at], batch[at + 1 :]
                    if head:
                        if written == _WRITES_PER_TURN:
                            await anyio.lowlevel.checkpoint()
                        yield b"".join(head)
                    yield final
                    for _ in range(SETTLE):  # a hang-up read before the send lands first
                        await anyio.lowlevel.checkpoint()
                    live.deliver()  # it was written: the writer stores the turn
                    written = 0
                    if tail:
                        written = 1
                        yield b"".join(tail)
                    resumed = clock()
                    continue
                if written == _WRITES_PER_TURN:
                    await anyio.lowlevel.checkpoint()
                    written = 0
                written += 1
                yield batch[0] if len(batch) == 1 else b"".join(batch)
                resumed = clock()
        except RunGone as gone:
            failed: list[Any] = encoder.failed({"type": f"run_{gone.reason}", "message": str(gone)})
            if encoder.done_marker:
                failed = [*failed, _frontends.DONE]
            for chunk in failed:
                yield encoder.frame(chunk).encode()
        except Exception:  # the log itself failed (Redis down): the client resumes later
            logger.exception("agentrt.sse: reading run %r from its log failed", run)
            for frame in _unavailable(encoder):
                yield frame
        finally:
            if live is not None and policy == "cancel":
                live.abandon()
            aclose = getattr(reading, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
        await anyio.lowlevel.checkpoint()  # the response's end is one more write: the loop's turn first

    return _Response(
        live if policy == "cancel" else None,
        frames(),
        ping=ping,
        headers={**encoder.headers, **headers},
        send_timeout=send_timeout,
        sep=encoder.sep,
    )


def _unavailable(encoder: _frontends.Encoder) -> list[bytes]:
    """The frames that end a response whose log could not be read: the protocol's error
    `runs_unavailable` (and Vercel's `[DONE]`)."""
    failed: list[Any] = encoder.failed(
        {"type": "runs_unavailable", "message": "the run log could not be read; resume later"}
    )
    if encoder.done_marker:
        failed.append(_frontends.DONE)
    return [encoder.frame(chunk).encode() for chunk in failed]


class _Response(EventSourceResponse):
    """A log's reader that stops its run (`"cancel"`) however the response ends, even cancelled
    before its body was read (the frames' own `finally` runs only once they were)."""

    def __init__(self, live: Live | None, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._agentrt_live = live

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._agentrt_live is not None:
                self._agentrt_live.abandon()


async def _one_by_one(reading: AsyncIterator[tuple[int, bytes]]) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A log's `read` as batches of one frame (a log without `read_batches`)."""
    try:
        async for seq, frame in reading:
            yield seq, [frame]
    finally:
        aclose = getattr(reading, "aclose", None)
        if aclose is not None:
            await aclose()


def parse_event_id(value: str) -> tuple[str, int] | None:
    """A `Last-Event-ID` of a logged run (`{run}:{seq}`), or `None` if it is not one."""
    run, colon, seq = value.strip().rpartition(":")
    # ASCII digits only: str.isdigit() also takes "²" (a latin-1 header byte), which int() refuses.
    if (
        not colon
        or not run
        or not (seq.isascii() and seq.isdigit())
        or len(seq) > 18
        or len(run) > MAX_RUN_ID
    ):
        return None
    return run, int(seq)
