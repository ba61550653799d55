"""Reading an accepted response: a streamed one chunk by chunk (`stream_chunks`, through a
`ChunkDecoder`), one JSON document whole (`fetch_json`), the start of an error body (`_read_limited`);
bounded by the request's deadline, and closed (or drained, so that its connection goes back to the
pool) however the reading ends. Sending, retries and listener events are `_http.HttpSession`'s.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

import anyio
import httpx
import orjson

from .._errors import ModelError
from .._watchdog import NEVER, WATCHED, Watchdog, read_before
from ._decoders import _PROBLEMS
from ._failures import error_from_payload, unreadable

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping

    from .._events import ModelChunk
    from .._watchdog import _Never
    from ._http import Exchange, HttpSession

__all__ = ["ChunkDecoder", "fetch_json", "stream_chunks"]

_ERROR_BODY_LIMIT: Final = 64 * 1024
_DRAIN_LIMIT: Final = 64 * 1024
_DRAIN_SECONDS: Final = 1.0


async def _read_limited(response: httpx.Response) -> bytes:
    """The start of an error response's body (error bodies are small; a huge one is cut)."""
    parts: list[bytes] = []
    size = 0
    body = response.aiter_bytes()
    try:
        async for part in body:
            parts.append(part)
            size += len(part)
            if size >= _ERROR_BODY_LIMIT:
                break
    except httpx.HTTPError:
        pass  # the status says enough; a body cut short is still worth keeping
    finally:
        with anyio.CancelScope(shield=True):
            await _release(body)
    return b"".join(parts)


class ChunkDecoder(Protocol):
    """Turns a response body, fed as it arrives, into model chunks (one per protocol and mode)."""

    done: bool
    """The body said its last word (`[DONE]`, `done: true`, an error): stop reading."""
    error: ModelError | None
    """An error the body reported; raised once the chunks decoded before it were yielded."""

    def feed(self, raw: bytes) -> list[ModelChunk]: ...

    def close(self) -> list[ModelChunk]:
        """The body ended (or `done`): the chunks still held back. May set `error`."""
        ...


async def stream_chunks(
    session: HttpSession,
    build: Callable[[], Mapping[str, Any]],
    decoder_for: Callable[[Exchange], ChunkDecoder],
    deadline: float | None = None,
) -> AsyncGenerator[ModelChunk, None]:
    """The chunks of one model call: build the body, open (with retries), decode, close.

    Closing this generator (the pipeline does, when it stops reading, is cancelled or fails) closes
    the HTTP response; the close is shielded so that it completes on trio too, where a cancelled
    task's every await would raise again. After the body's last event, the rest of the body is read
    (briefly, bounded) so that the connection can go back to the pool.

    With a `deadline` (the request's), opening stops there, and so does the body, with
    `ModelTimeoutError`: one `Watchdog` per response shuts its socket down at the deadline, which
    ends the pending read wherever it is (reads take no cancel scope: it cost 10 to 20 µs a token), and
    a body read on after it fired is cut at the next read. A body with no socket of its own (HTTP/2,
    a mock transport) is read under a cancel scope per read instead. Retries never sleep past the
    deadline either way.
    """
    body = build()
    # An awaited invocation's one scope at this deadline is around the whole call already: it cuts
    # opening and every read. Retries still never sleep past the deadline, nor does the drain.
    guard = None if deadline is not None and WATCHED.get() == deadline else deadline
    if guard is None:
        exchange = await session.open(body, deadline)
    else:
        with anyio.CancelScope(deadline=guard) as scope:
            exchange = await session.open(body, deadline)
        if scope.cancelled_caught:
            raise session.deadline_error(body, 1, mid_stream=False)
    response = exchange.response
    raw_chunks = response.aiter_bytes()
    ended = False  # the body was read to its end: nothing left to release
    watchdog: Watchdog | _Never = NEVER
    scoped = False  # reads under a cancel scope each (no socket to interrupt)
    if guard is not None:
        interrupt = _interrupter(response)
        if interrupt is None:
            scoped = True
        else:
            watchdog = Watchdog(guard, interrupt)
    try:
        decoder = decoder_for(exchange)
        feed = decoder.feed
        try:
            if not scoped:
                async for raw in raw_chunks:
                    if watchdog.fired:  # read on past the deadline (a socket's buffered bytes)
                        break
                    chunks = feed(raw)
                    for chunk in chunks:
                        yield chunk
                    if decoder.done:
                        break
                if watchdog.fired:  # the body may have been cut where the deadline found it
                    raise session.deadline_error(body, exchange.attempt, mid_stream=True)
            else:
                assert deadline is not None
                while True:
                    raw, cut = await read_before(raw_chunks, deadline, b"")
                    if cut:
                        raise session.deadline_error(body, exchange.attempt, mid_stream=True)
                    if not raw:  # httpx yields no empty reads: this is the end of the body
                        break
                    for chunk in feed(raw):
                        yield chunk
                    if decoder.done:
                        break
            for chunk in decoder.close():
                yield chunk
        except httpx.HTTPError as exc:
            if watchdog.fired:  # the watchdog shut the socket down under this read
                raise session.deadline_error(body, exchange.attempt, mid_stream=True) from exc
            error = session.stream_error(exc)
            session.report(error, body, exchange.attempt)
            raise error from exc
        if decoder.error is not None:
            session.report(decoder.error, body, exchange.attempt)
            raise decoder.error
        watchdog.close()  # the answer is complete: the drain has a bound of its own
        ended = await _drain(raw_chunks, deadline)
    finally:
        # Disarmed before the response goes back to the pool: its socket may serve another request.
        watchdog.close()
        # A body read to its end closed its response (httpx does, at the end): nothing is left to do.
        if not ended or not response.is_closed:
            with anyio.CancelScope(shield=True):
                if not ended:
                    await _release(raw_chunks)
                await response.aclose()


def _interrupter(response: httpx.Response) -> Callable[[], None] | None:
    """What ends a pending read of `response`'s body at once: shutting its socket down. `None` for
    a response without a connection of its own (HTTP/2 multiplexes other requests on its socket; a
    mock transport has none). The connection is not reused after it: httpcore drops a connection
    whose response did not end cleanly."""
    if response.http_version != "HTTP/1.1":
        return None
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is None:
        return None

    def interrupt() -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed: nothing is waiting on it
            pass

    return interrupt


async def _drain(raw_chunks: AsyncIterator[bytes], deadline: float | None) -> bool:
    """Read what is left of a body whose last event arrived (usually nothing but its end), so that
    the connection goes back to the pool: for at most `_DRAIN_SECONDS`, and with a `deadline`, at
    most half the time left (the answer is complete: the call ends well before the deadline, inside
    any scope that watches it). Whether the body ended (then there is nothing left for `_release` to
    do, and it is skipped: its expired scope costs more than the rest)."""
    size = 0
    now = anyio.current_time()
    limit = now + _DRAIN_SECONDS
    if deadline is not None:
        limit = min(limit, now + max(0.0, deadline - now) / 2)
    with anyio.CancelScope(deadline=limit):
        try:
            async for part in raw_chunks:
                size += len(part)
                if size > _DRAIN_LIMIT:
                    return False
        except httpx.HTTPError:
            return False
        return True
    return False


async def _release(raw_chunks: AsyncIterator[bytes]) -> None:
    """Let httpx's chain of body generators end from the inside, without waiting for the network.

    Closing only the outermost generator would leave the inner ones to the garbage collector, which
    trio reports with a ResourceWarning (encode/httpx#3686). Reading on under an expired deadline
    takes only what is already buffered: the first wait for the network is cancelled, and that
    cancellation unwinds every generator of the chain. A finished chain returns at once.
    """
    with anyio.move_on_after(0):
        try:
            async for _ in raw_chunks:
                pass
        except httpx.HTTPError:
            pass


_T = TypeVar("_T")


async def fetch_json(session: HttpSession, body: Mapping[str, Any], read: Callable[[Any], _T]) -> _T:
    """One request whose answer is one JSON document: send (with retries), read it whole, close, map.

    `read` maps the parsed document; it raises `MalformedPayload` (or whatever reading a payload of
    the wrong shape raises) for a document that does not follow the protocol. Raises the `ModelError`
    kind for a failure before the response was accepted (retried per the session's policy); once a
    2xx arrived nothing is retried: a transport failure while the body is read is a `mid_stream`
    error, a body that is not JSON or that `read` refuses a `ModelResponseError` carrying the body
    (scrubbed), an `error` object in the body the error it names. Every final failure is reported to
    `on_error`. Cancellation closes the response (shielded, so that the close completes on trio too)
    and propagates unchanged.
    """
    exchange = await session.open(body)
    response = exchange.response
    try:
        raw = await response.aread()
    except httpx.HTTPError as exc:
        error = session.stream_error(exc)
        session.report(error, body, exchange.attempt)
        raise error from exc
    finally:
        with anyio.CancelScope(shield=True):
            await response.aclose()
    failure: ModelError
    try:
        payload = orjson.loads(raw)
        if payload.__class__ is dict and payload.get("error"):
            failure = error_from_payload(
                payload, session.context, request_id=exchange.request_id, mid_stream=False
            )
        else:
            return read(payload)
    except ModelError as error:
        failure = error
    except _PROBLEMS as exc:
        what = "the response is not JSON" if isinstance(exc, orjson.JSONDecodeError) else "malformed response"
        failure = unreadable(
            what, session.context, request_id=exchange.request_id, mid_stream=False, body=raw, cause=exc
        )
    session.report(failure, body, exchange.attempt)
    raise failure
