"""HTTP plumbing shared by the adapters: the pooled client, sending with retries, listener events.

`HttpSession` owns (or borrows) one `httpx.AsyncClient` and sends JSON requests to one endpoint.
`open` returns a response whose status is 2xx and whose body has not been read: everything before that
point (connection failures, error statuses) is mapped to agentrt errors and retried per the
`RetryPolicy`; everything after it belongs to the adapter, which must close the response. Chat models
read it with `stream_chunks`; endpoints that answer with one JSON document (embeddings, moderation)
with `fetch_json`.

The API key lives in a `SecretStr` and is put into the `Authorization` header of each request only;
listener events carry the request body and the redacted endpoint, never request headers, and every
error message, body and request id is scrubbed of the key. A server may echo the key back: response
headers given to `on_response` are scrubbed too, and so are the log records of the loggers a request
goes through (httpx, httpcore, hpack: at DEBUG, httpcore logs every response header and hpack every
request header). Their filter, `_KEY_FILTER`, knows the keys of the open sessions only: a session
holds its key there from its first request until it is closed (or dropped), and records of other
loggers, or logged when no session holds a key, pass unchanged.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

import anyio
import httpx
import orjson

from .._errors import ModelError, ModelTimeoutError
from .._watchdog import NEVER, WATCHED, Watchdog, read_before
from ._admission import AdmittedTransport
from ._decoders import _PROBLEMS
from ._failures import (
    ErrorContext,
    error_from_payload,
    error_from_response,
    parse_retry_after,
    redact_url,
    transport_error,
    unreadable,
)
from ._retry import Retryable, RetryPolicy
from ._scrub import scrub, secret_forms

if TYPE_CHECKING:
    import ssl
    from collections.abc import AsyncGenerator, AsyncIterator, Callable

    import tenacity
    from pydantic import SecretStr

    from .._events import ModelChunk
    from .._watchdog import _Never

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_TIMEOUT",
    "ChunkDecoder",
    "Exchange",
    "HttpErrorEvent",
    "HttpRequestEvent",
    "HttpResponseEvent",
    "HttpSession",
    "fetch_json",
    "stream_chunks",
]

logger = logging.getLogger("agentrt.models")

DEFAULT_TIMEOUT: Final = httpx.Timeout(600.0, connect=10.0)
"""Connect within 10 s; then up to 10 minutes between bytes (long generations, slow first tokens)."""

DEFAULT_LIMITS: Final = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
"""The pool of a client agentrt creates (the openai SDK's): up to 1,000 responses streaming at once, 100
idle connections kept. Requests beyond 1,000 wait in agentrt's FIFO queue (`AdmittedTransport`)."""

_ERROR_BODY_LIMIT: Final = 64 * 1024
_DRAIN_LIMIT: Final = 64 * 1024
_DRAIN_SECONDS: Final = 1.0
_USER_AGENT: Final = "agentrt/0.1"
_SCRUBBED_LOGGERS: Final = (
    "httpx",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
    "hpack.hpack",
    "hpack.table",
    "agentrt.models",
)
"""The loggers an agentrt request goes through (a filter applies to its own logger's records only)."""
_FORMATTER: Final = logging.Formatter()


class _SSLContexts:
    """httpx's default SSL context, built once per process (and per CA setting) instead of per client.

    Loading the CA bundle takes 20-100 ms: an app that builds a model per user would pay it at each
    user's first request. The context follows httpx's own rules (`SSL_CERT_FILE`, `SSL_CERT_DIR`, else
    certifi's bundle), read when a client is built, so a changed setting gets its own context. Built
    in a worker thread (the lock keeps two threads from building the same one); an `SSLContext` may
    be shared by any number of connections.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._built: dict[tuple[str | None, str | None], ssl.SSLContext] = {}

    def get(self) -> ssl.SSLContext:
        key = (os.environ.get("SSL_CERT_FILE") or None, os.environ.get("SSL_CERT_DIR") or None)
        with self._lock:
            context = self._built.get(key)
            if context is None:
                context = self._built[key] = httpx.create_ssl_context()
            return context


_SSL_CONTEXTS: Final = _SSLContexts()


class _KeyFilter(logging.Filter):
    """Replaces the keys of open sessions in the records of `_SCRUBBED_LOGGERS`; never drops one.

    Installed on those loggers (only) by the first session that sends a request with a key; it stays,
    inert, once no session holds a key. A record's message is formatted (only when a key is held and
    the record was not discarded by its level) and, if it showed a key, replaced by its scrubbed text;
    so are its exception and stack texts.
    """

    def __init__(self) -> None:
        super().__init__()
        # Reentrant: `release` also runs from a garbage collection, which may start inside `hold`.
        # An update it interrupts can only end with a count too high (a key scrubbed for longer).
        self._lock = threading.RLock()
        self._held: dict[str, int] = {}
        self.forms: tuple[str, ...] = ()

    def hold(self, secret: str) -> None:
        with self._lock:
            self._held[secret] = self._held.get(secret, 0) + 1
            self.forms = secret_forms(self._held)
        for name in _SCRUBBED_LOGGERS:
            logging.getLogger(name).addFilter(self)  # a no-op once installed

    def release(self, secret: str) -> None:
        with self._lock:
            count = self._held.get(secret, 0) - 1
            if count > 0:
                self._held[secret] = count
            else:
                self._held.pop(secret, None)
            self.forms = secret_forms(self._held)

    def filter(self, record: logging.LogRecord) -> bool:
        forms = self.forms
        if forms:
            try:
                _scrub_record(record, forms)
            except Exception:  # a record that cannot be formatted: its handler reports it
                pass
        return True


def _scrub_record(record: logging.LogRecord, forms: tuple[str, ...]) -> None:
    message = record.getMessage()
    clean = scrub(message, forms)
    if clean != message:
        record.msg, record.args = clean, ()
    if record.exc_info and record.exc_info[1] is not None:
        text = record.exc_text or _FORMATTER.formatException(record.exc_info)
        clean = scrub(text, forms)
        if clean != text:
            record.exc_info, record.exc_text = None, clean
    if record.stack_info:
        record.stack_info = scrub(record.stack_info, forms)


_KEY_FILTER: Final = _KeyFilter()


@dataclass(frozen=True, slots=True)
class HttpRequestEvent:
    """A request is being sent (`attempt` counts from 1; retries repeat the same body)."""

    endpoint: str
    body: Mapping[str, Any]
    attempt: int


@dataclass(frozen=True, slots=True)
class HttpResponseEvent:
    """A successful response started: its status and headers arrived, its body is about to stream."""

    endpoint: str
    body: Mapping[str, Any]
    attempt: int
    status: int
    request_id: str | None
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class HttpErrorEvent:
    """A request failed; `will_retry` tells whether another attempt follows after `delay` seconds."""

    endpoint: str
    body: Mapping[str, Any]
    attempt: int
    error: ModelError
    will_retry: bool = False
    delay: float | None = None


@dataclass(slots=True)
class Exchange:
    """One accepted response and what errors raised while reading it need to know."""

    response: httpx.Response
    body: Mapping[str, Any]
    attempt: int
    request_id: str | None


def _retryable_transport(exc: httpx.HTTPError) -> bool:
    # Nothing reached the server (connect, pool) or the server dropped a pooled connection before
    # answering; a read timeout is not retried: the model may be generating, at the user's expense.
    return isinstance(
        exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout | httpx.RemoteProtocolError
    )


class HttpSession:
    """Sends JSON requests to one endpoint, with a pooled client, retries and listener events."""

    __slots__ = (
        "__weakref__",
        "_client",
        "_headers",
        "_key_header",
        "_key_hold",
        "_owned",
        "_secret",
        "_timeout",
        "context",
        "endpoint",
        "on_error",
        "on_request",
        "on_response",
        "retry",
        "url",
    )

    def __init__(
        self,
        base_url: str,
        path: str,
        *,
        secret: SecretStr | None,
        headers: Mapping[str, str] | None,
        timeout: httpx.Timeout | float | None,
        retry: RetryPolicy,
        client: httpx.AsyncClient | None,
        on_request: Callable[[HttpRequestEvent], None] | None,
        on_response: Callable[[HttpResponseEvent], None] | None,
        on_error: Callable[[HttpErrorEvent], None] | None,
        key_header: str | None = None,
    ) -> None:
        base = httpx.URL(base_url)
        if base.scheme not in ("http", "https") or not base.host:
            raise ValueError("the URL must be absolute, with an http or https scheme")
        # The query stays (Azure wants its `api-version` on every request); the shown endpoint drops it.
        self.url = base.copy_with(path=base.path.rstrip("/") + path, fragment=None)
        self.endpoint = redact_url(self.url)
        self._secret = secret
        self._key_header = key_header
        """The header the key goes in as it is (Anthropic's `x-api-key`); `None`: a bearer token."""
        self._key_hold: weakref.finalize[[str], HttpSession] | None = None
        self.context = ErrorContext(self.endpoint, (secret.get_secret_value(),) if secret else ())
        self._headers = {"content-type": "application/json", "accept": "application/json"}
        self._headers.update({k.lower(): v for k, v in (headers or {}).items()})
        self._timeout = httpx.Timeout(timeout) if timeout is not None else None
        self.retry = retry
        self._client = client
        self._owned = client is None
        self.on_request = on_request
        self.on_response = on_response
        self.on_error = on_error

    async def client(self) -> httpx.AsyncClient:
        """The pooled client, created on first use unless the user gave one.

        It is built in a worker thread: the first build in a process loads the CA bundle (tens of
        milliseconds that would stall every other stream on the event loop). Cancellation (a request's
        deadline) stops the wait at once; the thread finishes on its own and its client is dropped
        (it has no connection yet), the SSL context it built is kept.
        """
        client = self._client
        if client is None:
            built = await anyio.to_thread.run_sync(self._new_client, abandon_on_cancel=True)
            client = self._client
            if client is None:  # else another request built one first: it has the connections
                client = self._client = built
        return client

    def _new_client(self) -> httpx.AsyncClient:
        """A client whose pool has `DEFAULT_LIMITS`, with agentrt's FIFO admission in front of it."""
        limits = DEFAULT_LIMITS
        context = _SSL_CONTEXTS.get()
        assert limits.max_connections is not None
        pool = httpx.AsyncHTTPTransport(verify=context, limits=limits)
        return httpx.AsyncClient(
            transport=AdmittedTransport(pool, limits.max_connections),
            # for the transports httpx mounts for proxies named in the environment
            verify=context,
            limits=limits,
            timeout=self._timeout or DEFAULT_TIMEOUT,
            headers={"user-agent": _USER_AGENT},
        )

    async def aclose(self) -> None:
        """Close the client if this session created it (a user's own client stays open). Idempotent."""
        hold, self._key_hold = self._key_hold, None
        if hold is not None:
            hold()
        if self._owned and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    def _hold_key(self) -> None:
        """Have the HTTP loggers scrub the key until `aclose` (or until this session is dropped)."""
        if self._secret is not None and self._key_hold is None:
            secret = self._secret.get_secret_value()
            _KEY_FILTER.hold(secret)
            hold = self._key_hold = weakref.finalize(self, _KEY_FILTER.release, secret)
            hold.atexit = False

    def _request_headers(self) -> dict[str, str]:
        headers = dict(self._headers)
        secret = self._secret
        if secret is not None:
            if self._key_header is None:
                headers["authorization"] = f"Bearer {secret.get_secret_value()}"
            else:
                headers[self._key_header] = secret.get_secret_value()
        return headers

    async def open(self, body: Mapping[str, Any], deadline: float | None = None) -> Exchange:
        """Send `body` and return the accepted (2xx) response, its body unread.

        Raises the `ModelError` kind for the failure once retries are over; a retry whose wait would
        end past `deadline` is not made (the failure is raised at once). The caller closes the
        response. Cancellation while waiting or retrying propagates unchanged.
        """
        self._hold_key()
        client = await self.client()
        request = client.build_request(
            "POST",
            self.url,
            content=orjson.dumps(body),
            headers=self._request_headers(),
            timeout=self._timeout if self._timeout is not None else httpx.USE_CLIENT_DEFAULT,
        )
        attempt = 0

        async def send() -> httpx.Response:
            nonlocal attempt
            attempt += 1
            if self.on_request is not None:
                _notify(self.on_request, HttpRequestEvent(self.endpoint, body, attempt))
            try:
                response = await client.send(request, stream=True)
            except httpx.HTTPError as exc:
                error = transport_error(exc, self.context, mid_stream=False)
                if _retryable_transport(exc):
                    raise Retryable(error) from exc
                raise error from exc
            status = response.status_code
            if 200 <= status < 300:
                return response
            try:
                content = await _read_limited(response)
            finally:
                with anyio.CancelScope(shield=True):
                    await response.aclose()
            headers = response.headers
            error = error_from_response(status, headers, content, self.context)
            hint = headers.get("x-should-retry")
            retry = hint == "true" if hint in ("true", "false") else RetryPolicy.retries_status(status)
            if retry and error.code != "insufficient_quota":
                raise Retryable(error, parse_retry_after(headers))
            raise error

        def before_sleep(state: tenacity.RetryCallState) -> None:
            failure = state.outcome.exception() if state.outcome is not None else None
            assert isinstance(failure, Retryable)
            delay = state.upcoming_sleep
            logger.info(
                "model request failed (%s); retrying in %.2f s (attempt %d of %d)",
                failure.error,
                delay,
                attempt + 1,
                self.retry.max_attempts,
            )
            if self.on_error is not None:
                _notify(
                    self.on_error,
                    HttpErrorEvent(self.endpoint, body, attempt, failure.error, will_retry=True, delay=delay),
                )

        try:
            try:
                # The common case, a first attempt that succeeds, does not pay for tenacity.
                response: httpx.Response = await send()
            except Retryable as failure:
                if self.retry.max_attempts == 1:
                    raise
                first: Retryable | None = failure

                async def again() -> httpx.Response:
                    # Tenacity's first attempt replays the failure that already happened, so its
                    # counting, waits and stop rules cover the whole request.
                    nonlocal first
                    if first is not None:
                        replayed, first = first, None
                        raise replayed
                    return await send()

                response = await self.retry.retrying(before_sleep, deadline)(again)
        except Retryable as exc:
            self.report(exc.error, body, attempt)
            raise exc.error from exc.__cause__
        except ModelError as error:
            self.report(error, body, attempt)
            raise
        headers, request_id = _shown(response.headers, self.context if self._secret is not None else None)
        if self.on_response is not None:
            _notify(
                self.on_response,
                HttpResponseEvent(self.endpoint, body, attempt, response.status_code, request_id, headers),
            )
        return Exchange(response, body, attempt, request_id)

    def report(self, error: ModelError, body: Mapping[str, Any], attempt: int) -> None:
        """Tell `on_error` about a final failure (also used for errors inside a streamed response)."""
        if self.on_error is not None:
            _notify(self.on_error, HttpErrorEvent(self.endpoint, body, attempt, error))

    def stream_error(self, exc: httpx.HTTPError) -> ModelError:
        """The error for a transport failure while a response body streams."""
        return transport_error(exc, self.context, mid_stream=True)

    def deadline_error(self, body: Mapping[str, Any], attempt: int, *, mid_stream: bool) -> ModelError:
        """The error for a request cut at its deadline (the invocation's time budget)."""
        where = "while the response streamed" if mid_stream else "before a response arrived"
        error = ModelTimeoutError(
            f"the request reached its deadline {where}", endpoint=self.endpoint, mid_stream=mid_stream
        )
        self.report(error, body, attempt)
        return error


def _shown(headers: httpx.Headers, context: ErrorContext | None) -> tuple[httpx.Headers, str | None]:
    """The headers listeners see, scrubbed with `context` if given (a copy, if the server echoed the
    key in one), and the request id among them (as `request_id_of` finds it), in one pass.

    Scrubbing starts with one search over all the headers (no match: no header holds the key); the
    request id is looked up in the same items (httpx's lookup of an absent header raises and
    catches a `KeyError`).
    """
    items = headers.multi_items()
    if context is not None and context.shows_secret("\x00".join(map("\x00".join, items))):
        scrub = context.scrub
        clean = [(scrub(name), scrub(value)) for name, value in items]
        if clean != items:
            # in the encoding they came in (a non-ASCII header beside the echoed key failed to encode)
            headers = httpx.Headers(clean, encoding=headers.encoding)
            items = headers.multi_items()
    request_id = (
        ", ".join([value for name, value in items if name == "x-request-id"])
        or ", ".join([value for name, value in items if name == "request-id"])
        or None
    )
    return headers, request_id


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


def _notify(listener: Callable[[Any], None], event: object) -> None:
    try:
        listener(event)
    except Exception:
        logger.exception(
            "model listener %r raised on %s; the request goes on", listener, type(event).__name__
        )
