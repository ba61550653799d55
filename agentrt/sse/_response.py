"""The response of a stream, for every protocol: its one loop (`respond`), the response that runs
it (`StreamResponse`: a stop, and a stream closed however the response ends), and a run a stop
reaches (`Run`).

A client that disconnects cancels the invocation: sse-starlette cancels the task that reads it,
which closes the model stream; the turn is stored if and only if the answer's final event was
written to the connection before the server learned that the client was gone (see `DEFER_COMMIT`,
`_SETTLE`).
"""

from __future__ import annotations

import logging
import time
import typing
from typing import Any, Final

import anyio
import anyio.lowlevel
from sse_starlette import EventSourceResponse

from .._events import ApprovalRequested, Completed
from .._stream import PartialStream
from . import _encoder, _runs
from ._encoder import DONE, Encoder, Sent
from ._errors import error_json
from ._native import Native, result_json

if typing.TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from .._stream import TokenStream

logger = logging.getLogger("agentrt")

_WAITED: Final = 0.0005
"""Seconds between two events past which the response takes it that the event was waited for (a
model stream's next network read), so the event loop had its turns meanwhile and the count of frames
written without one starts again: a stream that arrives token by token needs no extra turn."""

_WRITES_PER_TURN: Final = 3
"""Frames written in a row before the event loop gets a turn. A server learns that its client is
gone only when its loop runs (uvicorn then drops further writes), and a stream's events may all be
ready at once: written on without a turn, each write past the fifth to a lost connection makes
asyncio log "socket.send() raised exception." (the loss may be seen just before a turn of ours,
and a keep-alive ping may write in the same turn: three keeps below five)."""


_SETTLE: Final = 2
"""Event-loop turns between the send of a stream's final frame and the commit it lets go (see
`DEFER_COMMIT`). A server's send returns also when nothing was written: once uvicorn's loop read
the client's end of file, the transport drops writes (and once the connection is lost, uvicorn drops
sends), and the response hears of it two turns later (the connection is closed, then the response's
disconnect listener is told and cancels it). So a hang-up read before the final send cancels the
response within these turns, and nothing is stored; one read after it lands after the commit
began: a turn is stored exactly when its final frame was written (tests/test_sse_cancel_rule.py
pins it on uvicorn's h11 protocol, iteration by iteration: 1 turn stores dropped answers, 3 drop
written ones)."""

clock = time.perf_counter


def stream_response(
    stream: TokenStream | PartialStream[Any],
    *,
    thinking: bool = False,
    tool_details: bool = False,
    ping: float | None = None,
    headers: dict[str, str] | None = None,
    send_timeout: float | None = None,
) -> EventSourceResponse:
    """The SSE response for a stream the caller already has (see the module docstring for the
    events; a `PartialStream` sends `partial` events, its values so far, where a `TokenStream` sends
    `token` events). The stream is closed however the response ends: done, failed, or the client
    gone."""
    encoder = Native(thinking, tool_details, isinstance(stream, PartialStream))
    return respond(stream, encoder, None, ping=ping, headers=headers, send_timeout=send_timeout)


def respond(
    stream: TokenStream | PartialStream[Any] | None,
    encoder: Encoder,
    run: Run | None,
    *,
    ping: float | None,
    headers: dict[str, str] | None,
    send_timeout: float | None,
    forget: Callable[[], Any] | None = None,
    tee: _runs.Tee | None = None,
) -> EventSourceResponse:
    """The one response loop of every protocol: the stream's events through `encoder`. `stream` is
    `None` for a run stopped before the model answered. The stream is closed however it ends; a
    `run` is stopped by cancelling the whole response (see `StreamResponse`), which costs the
    stream's reads nothing. A run is forgotten (no longer stoppable) once its end is sent.

    With a `tee` (a run manager's run) each frame is appended to the run's log before it is sent;
    under `"detach"`, a hang-up hands the stream to the manager (`_runs.adopt`) at the next
    event, or when the response is closed between two sends."""
    loop = _Loop(stream, encoder, run, forget, tee)
    return StreamResponse(
        loop,
        loop.frames(),
        ping=ping,
        headers={**encoder.headers, **(headers or {})},
        send_timeout=send_timeout,
        sep=encoder.sep,
    )


class _Loop:
    """The loop of one response (`respond`): the stream's events through the encoder, as the frames
    the response writes, and what its `StreamResponse` reads (the stream, the run, the tee). Its
    phases: the start (`_opened`), the events (inline, the per-token path), the stream's end (done:
    `_settle`; failed: `_failed`; closed between two sends: `_closed`; and always `aclose`), then
    the last frames."""

    __slots__ = ("encoder", "forget", "frame", "hold", "run", "stream", "tee")

    def __init__(
        self,
        stream: TokenStream | PartialStream[Any] | None,
        encoder: Encoder,
        run: Run | None,
        forget: Callable[[], Any] | None,
        tee: _runs.Tee | None,
    ) -> None:
        self.stream = stream
        self.encoder = encoder
        self.run = run
        self.forget = forget
        self.tee = tee
        self.frame = encoder.frame
        self.hold = tee is not None and tee.policy == "cancel"

    async def frames(self) -> AsyncIterator[bytes]:
        stream, encoder, tee, hold = self.stream, self.encoder, self.tee, self.hold
        snapshots = stream.snapshots if isinstance(stream, PartialStream) else None
        # What the client got, chunk by chunk (a stop's end is made from it); a run's log has its own.
        sent = self.run.sent if self.run is not None and tee is None else None
        chunks_of = _encoder.chunks_of
        put = self._encode if tee is None else tee.put
        written = 0  # frames written since the event loop last had a turn
        resumed = 0.0  # when the last batch was written
        reading = False  # between two events of the stream: a detached run's may be handed over
        try:
            out = self._opened()
            if stream is not None:
                reading = True
                async for event in stream.events():
                    if clock() - resumed > _WAITED:
                        written = 0  # the event was waited for: the loop had its turns meanwhile
                    kind = type(event)
                    if kind is Completed or kind is ApprovalRequested:
                        self._ended()  # the run ended (or waits for a human): a stop comes too late
                    chunks = chunks_of(event, encoder, snapshots, result_json)
                    batch, out = ([*out, *chunks] if out else chunks), ()
                    # Into the log first (whole: a close between two sends loses none of it); the
                    # final frames of a `"cancel"` run only once they were written (`_settle`).
                    datas = tee.hold(batch) if hold and kind is Completed else put(batch)  # type: ignore[union-attr]
                    for chunk, data in zip(batch, datas, strict=True):
                        if written == _WRITES_PER_TURN:
                            await anyio.lowlevel.checkpoint()
                            written = 0
                        written += 1
                        if sent is not None:
                            sent.pending = (data, chunk)
                        yield data
                    resumed = clock()
                    if kind is Completed:
                        reading = False
                        await self._settle()
                        written = 0
                    elif tee is not None and tee.gone and self._handed_over(kind, tee, stream):
                        return
                reading = False
        except GeneratorExit:
            if reading:
                self._closed()
            raise
        except Exception as error:
            reading = False
            out = [*out, *self._failed(error)]  # what an error cut off, first
        finally:
            await self.aclose()
        out, datas = self._last(out, put)
        for chunk, data in zip(out, datas, strict=True):
            if written == _WRITES_PER_TURN:
                await anyio.lowlevel.checkpoint()
                written = 0
            written += 1
            if sent is not None:
                sent.pending = (data, chunk)
            yield data
        # The response's end is one more write (the server's): the loop's turn first, as above.
        await anyio.lowlevel.checkpoint()

    def _encode(self, chunks: Sequence[Any]) -> list[bytes]:
        # A loop, not a comprehension: one would make `frame` a cell, one more object a call.
        frame = self.frame
        datas = []
        for chunk in chunks:
            datas.append(frame(chunk).encode())
        return datas

    def _opened(self) -> Sequence[Any]:
        """The response's first chunks (those a run's log has already are not sent again)."""
        tee = self.tee
        encoder = self.encoder
        if tee is not None:
            tee.began = True  # sse-starlette sent the response's start before it asked
        out = encoder.opened()
        if tee is not None and encoder.replay:
            # The log's start rebuilds the message a resumed run continues (Vercel): a resume
            # replays it; this client has the message already.
            tee.put(out[: len(encoder.replay)])
            out = out[len(encoder.replay) :]
        return out

    def _ended(self) -> None:
        """The run ended (its answer, an approval, an error): a stop no longer reaches it, neither
        the endpoint's nor its manager's (here or from another worker)."""
        if self.forget is not None:
            self.forget()
        tee = self.tee
        if tee is not None:
            tee.runs.release(tee.run, tee.stop)

    async def _settle(self) -> None:
        """After the final frames' sends returned: asked on, the stream stores the turn (see
        `DEFER_COMMIT`), so a hang-up read before them lands first; a `"cancel"` run's final
        frames go into its log only now."""
        for _ in range(_SETTLE):
            await anyio.lowlevel.checkpoint()
        if self.hold:
            self.tee.release()  # type: ignore[union-attr]

    def _handed_over(self, kind: type, tee: _runs.Tee, stream: TokenStream | PartialStream[Any]) -> bool:
        """A `"detach"` run's client hung up: the manager reads on, unless the event was an approval
        (it ended the stream: it was stored, and the run is no longer stoppable)."""
        return kind is not ApprovalRequested and _runs.adopt(tee, stream, self.run, result_json, error_json)

    def _closed(self) -> None:
        """Closed between two sends (a send failed or timed out, the server shuts down): a
        detached run goes on in its manager."""
        tee, run = self.tee, self.run
        if tee is not None and tee.policy == "detach" and not (run and run.stopped):
            assert self.stream is not None
            _runs.adopt(tee, self.stream, run, result_json, error_json)

    def _failed(self, error: Exception) -> Sequence[Any]:
        """The chunks that tell the client the stream failed (the error is logged)."""
        self._ended()
        logger.exception("agentrt.sse: the stream failed")
        return self.encoder.failed(error_json(error))

    def _last(
        self, out: Sequence[Any], put: Callable[[Sequence[Any]], list[bytes]]
    ) -> tuple[Sequence[Any], list[bytes]]:
        """The last chunks (what the end left, and the protocol's end marker) and their frames: the
        run's log is then whole."""
        if self.encoder.done_marker:
            out = [*out, DONE]
        datas = put(out)
        if self.tee is not None:
            self.tee.clean = True
        return out, datas

    async def aclose(self) -> None:
        """Close the stream however the loop ends (unless a run manager took it over)."""
        stream, tee = self.stream, self.tee
        if stream is not None and not (tee is not None and tee.adopted):
            with anyio.CancelScope(shield=True):
                await stream.aclose()


class StreamResponse(EventSourceResponse):
    """An `EventSourceResponse` that closes its stream however the response ends, even when it is
    cancelled before its body started (the events' own `finally` runs only once they were read).

    With a `run`, the whole response runs under a scope that `stop` cancels, and each chunk counts
    as sent once its send returned (`run.sent`): after a stop the model stream is closed, then the
    protocol's last chunks for what the client has end the body. With a `tee` (a run manager's run)
    the run's log is ended too, unless the manager took the run over."""

    def __init__(self, loop: _Loop, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._agentrt = loop

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        loop = self._agentrt
        run = loop.run
        tee = loop.tee
        try:
            if run is None:
                await super().__call__(scope, receive, send)
                return
            sent = run.sent
            started = False

            async def sending(message: Any) -> None:
                nonlocal started
                pending = sent.pending
                body = message.get("body")
                if pending is None or body is None or not (body is pending[0] or body == pending[0]):
                    await send(message)  # the start, a ping, the end
                    started = True
                    return
                try:
                    await send(message)
                except BaseException:
                    sent.unsure(pending[1])
                    raise
                sent.pending = None
                sent.confirm(pending[1])

            if run.stopped:  # stopped between the model's answer and here: its stream is not read
                await self._stopped(send, False, sent)  # (its events may all come without a checkpoint)
                return
            if tee is not None and tee.policy == "detach":
                receive = _runs.Detaching(receive, tee)
            with anyio.CancelScope() as stopping:
                run.scope = stopping
                try:
                    await super().__call__(scope, receive, sending if tee is None else send)
                except TimeoutError:  # sse-starlette's `send_timeout`: the client stalled
                    if tee is None or not tee.adopted:
                        raise
                    # A detached run goes on in its manager: nothing failed (no error to log).
            if run.scope is stopping:  # (a manager that took the run over has its own)
                run.scope = None
            if stopping.cancelled_caught:
                await self._stopped(send, started if tee is None else tee.began, sent)
        finally:
            if loop.forget is not None:
                loop.forget()
            if tee is None or not tee.adopted:
                await loop.aclose()
                if tee is not None:
                    await tee.finish()

    async def _ping(self, send: Any) -> None:
        # sse-starlette's keep-alive pings. One that fails or times out (`send_timeout`: a stalled
        # connection) ends the response, which would cancel a `"detach"` run's stream while the
        # response waits for its next event: the client is gone instead (the stream is handed to the
        # manager at that event). Not a return either: sse-starlette ends the response when its ping
        # task returns.
        tee = self._agentrt.tee
        if tee is None or tee.policy != "detach":
            await super()._ping(send)
            return
        try:
            await super()._ping(send)
        except Exception:
            tee.gone = True
            await anyio.sleep_forever()

    async def _stopped(self, send: Any, started: bool, sent: Sent) -> None:
        """End a stopped run's body: the model stream closed first, then the protocol's last chunks
        for what the client has."""
        loop = self._agentrt
        if loop.stream is not None:
            with anyio.CancelScope(shield=True):
                await loop.stream.aclose()
        encoder = loop.encoder
        tee = loop.tee
        if tee is not None:  # the log's end, which a resume reads too
            body = b"".join(tee.end_stopped())
        else:
            chunks: list[Any] = [] if started else list(encoder.opened())
            for chunk in chunks:
                sent.confirm(chunk)  # sent with the end
            chunks += encoder.stopped(sent)
            if encoder.done_marker and not sent.done:
                chunks.append(DONE)
            body = b"".join(encoder.frame(chunk).encode() for chunk in chunks)
        if not started:
            start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": False})


class Run:
    """A streaming run of a client protocol: what `stop` cancels."""

    __slots__ = ("scope", "sent", "stopped")

    def __init__(self) -> None:
        self.scope: anyio.CancelScope | None = None
        self.stopped = False
        self.sent = Sent()

    def stop(self) -> None:
        self.stopped = True
        if self.scope is not None:
            self.scope.cancel()
