"""HTTP plumbing shared by the adapters: the pooled client, sending with retries, listener events.

`HttpSession` owns (or borrows) one `httpx.AsyncClient` and sends JSON requests to one endpoint.
`open` returns a response whose status is 2xx and whose body has not been read: everything before that
point (connection failures, error statuses) is mapped to agentrt errors and retried per the
`RetryPolicy`; everything after it belongs to the adapter, which must close the response. Chat models
read it with `stream_chunks`; endpoints that answer with one JSON document (embeddings, moderation)
with `fetch_json` (both in `_http_stream`).

The API key lives in a `SecretStr` and is put into the `Authorization` header of each request only;
listener events carry the request body and the redacted endpoint, never request headers, and every
error message, body and request id is scrubbed of the key. A server may echo the key back: response
headers given to `on_response` are scrubbed too, and so are the log records of the loggers a request
goes through (httpx, httpcore, hpack: at DEBUG, httpcore logs every response header and hpack every
request header). Their filter, `_scrub._KEY_FILTER`, knows the keys of the open sessions only: a session
holds its key there from its first request until it is closed (or dropped), and records of other
loggers, or logged when no session holds a key, pass unchanged.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import anyio
import httpx
import orjson

from .._errors import ModelError, ModelTimeoutError
from ._admission import AdmittedTransport
from ._failures import (
    ErrorContext,
    error_from_response,
    parse_retry_after,
    redact_url,
    transport_error,
)
from ._http_stream import _read_limited
from ._retry import Retryable, RetryPolicy
from ._scrub import _KEY_FILTER

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable

    import tenacity
    from pydantic import SecretStr

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_TIMEOUT",
    "Exchange",
    "HttpErrorEvent",
    "HttpRequestEvent",
    "HttpResponseEvent",
    "HttpSession",
]

logger = logging.getLogger("agentrt.models")

DEFAULT_TIMEOUT: Final = httpx.Timeout(600.0, connect=10.0)
"""Connect within 10 s; then up to 10 minutes between bytes (long generations, slow first tokens)."""

DEFAULT_LIMITS: Final = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
"""The pool of a client agentrt creates (the openai SDK's): up to 1,000 responses streaming at once, 100
idle connections kept. Requests beyond 1,000 wait in agentrt's FIFO queue (`AdmittedTransport`)."""

_USER_AGENT: Final = "agentrt/0.1"


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


def _notify(listener: Callable[[Any], None], event: object) -> None:
    try:
        listener(event)
    except Exception:
        logger.exception(
            "model listener %r raised on %s; the request goes on", listener, type(event).__name__
        )
