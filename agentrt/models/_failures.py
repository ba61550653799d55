"""How a failed model call becomes an agentrt error: HTTP status and body, in-stream error payloads,
transport exceptions, and the headers that describe a failure (`retry-after`, request ids).

Classification is by HTTP status first (OpenAI sends its 401 with `type: invalid_request_error`), then by
the provider's `code`/`type`, then by message where a provider has no dedicated code (Anthropic's
`prompt is too long: N tokens > M maximum`). The envelopes understood are OpenAI's
`{"error": {"message", "type", "code", "param"}}` (also vLLM, Groq, OpenRouter with an integer code and
`metadata.raw`), Anthropic's `{"type": "error", "error": {"type", "message"}}`, Gemini's
`{"error": {"code", "message", "status"}}`, Ollama's `{"error": "..."}` and bare
`{"message"|"detail": ...}` bodies. Secrets given by the caller are scrubbed from every message, body,
request id and code, also in their escaped forms (`_scrub.secret_forms`), and before any text is cut: a cut
through a secret would leave a piece of it that no scrubbing recognises.

This module and the adapters are the only places in agentrt that know httpx exceptions.
"""

from __future__ import annotations

import email.utils
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final

import httpx
import orjson

from .._errors import (
    AuthenticationError,
    BadRequestError,
    ContextLengthExceededError,
    ModelConnectionError,
    ModelError,
    ModelNotFoundError,
    ModelResponseError,
    ModelTimeoutError,
    OverloadedError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
)
from ._scrub import FORM_REACH, Forms, scrub, secret_forms

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "ErrorContext",
    "MalformedPayload",
    "error_from_payload",
    "error_from_response",
    "parse_retry_after",
    "redact_url",
    "request_id_of",
    "transport_error",
    "unreadable",
]

MAX_BODY: Final = 16 * 1024
"""Characters of a failed response's body kept on the error."""

_CONTEXT_CODES: Final = frozenset(
    {"context_length_exceeded", "exceed_context_size_error", "model_max_prompt_tokens_exceeded"}
)
# Real messages this recognises: OpenAI/OpenRouter/Mistral "maximum context length is N tokens",
# Anthropic "prompt is too long: N tokens > M maximum", vLLM "longer than the maximum model length",
# llama.cpp "exceeds the available context size", Bedrock "exceed context limit", Gemini "exceeds the
# maximum number of tokens allowed", Ollama "the input length exceeds the context length".
_CONTEXT_MESSAGE: Final = re.compile(
    r"context[ _-]?(?:length|window|size|limit)|maximum (?:context|model) length|prompt is too long"
    r"|too many tokens|input (?:is )?too long|exceeds? the maximum number of tokens",
    re.IGNORECASE,
)
_KINDS: Final[dict[str, type[ModelError]]] = {
    # OpenAI / Anthropic `type` and `code` values
    "authentication_error": AuthenticationError,
    "invalid_api_key": AuthenticationError,
    "permission_error": PermissionDeniedError,
    "permission_denied": PermissionDeniedError,
    "not_found_error": ModelNotFoundError,
    "model_not_found": ModelNotFoundError,
    "rate_limit_error": RateLimitError,
    "rate_limit_exceeded": RateLimitError,
    "overloaded_error": OverloadedError,
    "invalid_request_error": BadRequestError,
    "api_error": ServerError,
    "server_error": ServerError,
    "timeout_error": ModelTimeoutError,
    # Google status names
    "UNAUTHENTICATED": AuthenticationError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "NOT_FOUND": ModelNotFoundError,
    "RESOURCE_EXHAUSTED": RateLimitError,
    "INVALID_ARGUMENT": BadRequestError,
    "FAILED_PRECONDITION": BadRequestError,
    "UNAVAILABLE": OverloadedError,
    "INTERNAL": ServerError,
    "DEADLINE_EXCEEDED": ModelTimeoutError,
}


class MalformedPayload(ValueError):
    """A mapper found a payload of the wrong shape; the message says what (never quoting the payload:
    `unreadable` adds it to the error, scrubbed)."""


@dataclass(frozen=True, slots=True)
class ErrorContext:
    """What every error of one endpoint carries: the redacted endpoint and the secrets to scrub."""

    endpoint: str
    secrets: tuple[str, ...] = field(default=(), repr=False)
    forms: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "forms", secret_forms(self.secrets))

    def scrub(self, text: str) -> str:
        """`text` with every secret replaced, also in the escaped forms messages, bodies and logs use."""
        return scrub(text, self.forms)

    def shows_secret(self, data: str | bytes) -> bool:
        """Whether `data` (all of it) holds a secret, in any of the forms `scrub` knows."""
        forms = self.forms
        if not isinstance(forms, Forms) or not forms:
            return False
        if isinstance(data, bytes):
            data = data.decode("utf-8", "replace")
        return forms.pattern.search(data) is not None


def redact_url(url: httpx.URL | str) -> str:
    """The URL without credentials, query or fragment (a query may carry an API key)."""
    url = httpx.URL(url)
    return str(url.copy_with(userinfo=b"", query=None, fragment=None))


def request_id_of(headers: Mapping[str, str]) -> str | None:
    """The provider's request id from the response headers."""
    return headers.get("x-request-id") or headers.get("request-id") or None


def parse_retry_after(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """Seconds the server asked to wait: `retry-after-ms`, or `retry-after` in seconds or as HTTP-date."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        seconds = _seconds(millis)
        if seconds is not None:
            return seconds / 1000
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _seconds(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    except _BAD_VALUE:  # not a date; or a year, day, time or zone out of range (`OverflowError`)
        return None
    return seconds if seconds > 0 else 0.0


_BAD_VALUE: Final = (TypeError, ValueError, LookupError, ArithmeticError)


def _seconds(value: str) -> float | None:
    try:
        seconds = float(value.strip())
    except _BAD_VALUE:
        return None
    if not math.isfinite(seconds):
        return None
    return seconds if seconds > 0 else 0.0


@dataclass(slots=True)
class _Details:
    message: str | None = None
    code: str | None = None
    kind: str | None = None
    status: int | None = None
    request_id: str | None = None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    try:
        return orjson.dumps(value, default=str).decode()
    except orjson.JSONEncodeError:  # nested deeper than orjson writes (254 levels; it reads 1024)
        return orjson.dumps(_pruned(value, _MAX_DEPTH), default=str, option=orjson.OPT_NON_STR_KEYS).decode()


_MAX_DEPTH: Final = 32
"""Levels of a too deeply nested payload that its text shows."""


def _pruned(value: Any, depth: int) -> Any:
    """`value` with what is nested deeper than `depth` levels replaced by a marker (and integers
    orjson does not write, as text)."""
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        return str(value)
    if isinstance(value, dict | list):
        if depth <= 0:
            return "..."
        if isinstance(value, dict):
            return {key: _pruned(item, depth - 1) for key, item in value.items()}
        return [_pruned(item, depth - 1) for item in value]
    return value


def _details(payload: Any) -> _Details:
    """The message, code, type and status hint of an error envelope (any of the known shapes)."""
    details = _Details()
    if isinstance(payload, list) and payload:
        payload = payload[0]
    if not isinstance(payload, dict):
        return details
    if isinstance(payload.get("request_id"), str):
        details.request_id = payload["request_id"]
    error = payload.get("error", payload)
    if isinstance(error, str):
        details.message = error
        return details
    if not isinstance(error, dict):
        return details
    details.message = _text(error.get("message")) or _text(error.get("detail"))
    code, kind = error.get("code"), error.get("type") or error.get("status")
    for hint in (error.get("status_code"), code, error.get("status")):
        if isinstance(hint, int) and not isinstance(hint, bool) and 100 <= hint <= 599:
            details.status = hint
            break
    if isinstance(code, str) and code:
        details.code = code
    if isinstance(kind, str) and kind:
        details.kind = kind
        if details.code is None and kind.endswith("_error"):
            details.code = kind  # Anthropic's envelope has a `type` (billing_error, ...) and no code
    metadata = error.get("metadata")
    raw = metadata.get("raw") if isinstance(metadata, dict) else None
    if isinstance(raw, str) and raw and raw not in (details.message or ""):
        # OpenRouter: "Provider returned error" says nothing; the upstream's own words are in `raw`.
        details.message = f"{details.message}: {raw}" if details.message else raw
    if details.request_id is None and isinstance(error.get("request_id"), str):
        details.request_id = error["request_id"]
    return details


def _is_context_length(details: _Details) -> bool:
    if details.code in _CONTEXT_CODES:
        return True
    return bool(details.message and _CONTEXT_MESSAGE.search(details.message))


def _is_overloaded(details: _Details) -> bool:
    return details.kind == "overloaded_error" or "overloaded" in (details.message or "").lower()


def _classify(status: int | None, details: _Details) -> type[ModelError]:
    if status is not None:
        if status == 401:
            return AuthenticationError
        if status == 403:
            return PermissionDeniedError
        if status == 404:
            return ModelNotFoundError
        if status == 429:
            return RateLimitError
        if status == 408:
            return ModelTimeoutError
        if status in (400, 413, 422):
            return ContextLengthExceededError if _is_context_length(details) else BadRequestError
        if status in (503, 529) or (status >= 500 and _is_overloaded(details)):
            return OverloadedError
        if status >= 500:
            return ServerError
        return ModelError
    for hint in (details.code, details.kind):
        kind = _KINDS.get(hint or "")
        if kind is not None:
            if kind is BadRequestError and _is_context_length(details):
                return ContextLengthExceededError
            return kind
    if _is_context_length(details):
        return ContextLengthExceededError
    return OverloadedError if _is_overloaded(details) else ServerError


def _build(
    kind: type[ModelError],
    message: str,
    *,
    status: int | None,
    body: str | None,
    request_id: str | None,
    code: str | None,
    context: ErrorContext,
    mid_stream: bool,
    retry_after: float | None = None,
) -> ModelError:
    message = context.scrub(message)
    body = excerpt(body, context) if body else None  # scrubbed before the cut: no half key
    # A server may echo the key anywhere, a request id made of the request's headers included.
    request_id = context.scrub(request_id) if request_id else None
    code = context.scrub(code) if code else None
    if kind is RateLimitError:
        return RateLimitError(
            message,
            retry_after=retry_after,
            status=status,
            body=body,
            request_id=request_id,
            endpoint=context.endpoint,
            mid_stream=mid_stream,
            code=code,
        )
    return kind(
        message,
        status=status,
        body=body,
        request_id=request_id,
        endpoint=context.endpoint,
        mid_stream=mid_stream,
        code=code,
    )


def error_from_response(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    context: ErrorContext,
) -> ModelError:
    """The error for a failed HTTP response (status ≥ 400, body read)."""
    text = body.decode("utf-8", "replace")
    try:
        payload = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        payload = None
    details = _details(payload)
    # Scrubbed before it is cut (as everywhere): a cut through a secret would leave half of it.
    message = details.message or excerpt(text.strip(), context, 500) or _reason(status)
    kind = _classify(status, details)
    return _build(
        kind,
        message,
        status=status,
        body=text,
        request_id=request_id_of(headers) or details.request_id,
        code=details.code,
        context=context,
        mid_stream=False,
        retry_after=parse_retry_after(headers) if kind is RateLimitError else None,
    )


def error_from_payload(
    payload: Any,
    context: ErrorContext,
    *,
    request_id: str | None,
    mid_stream: bool,
) -> ModelError:
    """The error for an error object the endpoint sent inside a successful response or stream."""
    details = _details(payload)
    body = _text(payload)
    return _build(
        _classify(details.status, details),
        details.message or body or "the endpoint reported an error",
        status=details.status,
        body=body,
        request_id=request_id or details.request_id,
        code=details.code,
        context=context,
        mid_stream=mid_stream,
    )


def transport_error(exc: httpx.HTTPError, context: ErrorContext, *, mid_stream: bool) -> ModelError:
    """The error for an httpx exception (connection, timeout, protocol)."""
    detail = context.scrub(str(exc)) or type(exc).__name__
    where = "while the response streamed" if mid_stream else "before a response arrived"
    kind: type[ModelError]
    if isinstance(exc, httpx.TimeoutException):
        kind, message = ModelTimeoutError, f"the endpoint timed out {where} ({type(exc).__name__})"
    elif isinstance(exc, httpx.DecodingError):
        kind, message = ModelResponseError, f"the response could not be decoded: {detail}"
    elif isinstance(exc, httpx.TransportError):
        kind, message = ModelConnectionError, f"the connection failed {where}: {detail}"
    else:
        kind, message = ModelConnectionError, f"the request failed {where}: {detail}"
    return kind(message, endpoint=context.endpoint, mid_stream=mid_stream)


def unreadable(
    what: str,
    context: ErrorContext,
    *,
    request_id: str | None,
    mid_stream: bool,
    body: bytes | None = None,
    cause: BaseException | None = None,
) -> ModelResponseError:
    """The error for a response that does not follow the protocol.

    `body` is the offending payload or response, kept as a scrubbed excerpt. `cause` is what found it
    malformed: the message says what it found (see `_found`), and it becomes the error's `__cause__`
    unless the payload holds a secret.
    """
    chained = None
    if cause is not None:
        found, chained = _found(cause, context, body)
        what = f"{what} ({found})"
    error = ModelResponseError(
        excerpt(what, context, _MAX_MESSAGE),
        body=excerpt(body, context) if body else None,
        request_id=request_id,
        endpoint=context.endpoint,
        mid_stream=mid_stream,
    )
    if cause is not None:
        error.__cause__ = chained
    return error


def _found(
    cause: BaseException, context: ErrorContext, payload: bytes | None
) -> tuple[str, BaseException | None]:
    """What `cause` found wrong with `payload`, and the exception to chain to the error, if any.

    A `MalformedPayload` says it in its own words, which never quote the payload. Any other exception's
    message may quote a piece of the payload, and Python cuts what it quotes (`int()` keeps 200
    characters): a secret in the payload could show half of it, past what scrubbing recognises. So when
    the payload holds a secret, the exception is not chained (orjson's decode error even keeps the
    whole payload, as `doc`) and only its type is named, with orjson's (fixed) reason and position.
    """
    if isinstance(cause, MalformedPayload):
        return str(cause), cause
    name = type(cause).__name__
    decoding = isinstance(cause, orjson.JSONDecodeError)
    found = f"not JSON: {cause}" if decoding else f"{name}: {cause}"  # orjson's: never the text there
    if not context.secrets or (payload is not None and not context.shows_secret(payload)):
        return found, cause
    if decoding:
        return found, None
    return f"{name}; its message is withheld, as the payload holds a secret", None


_MAX_MESSAGE: Final = 1000
"""Characters of an unreadable response's message (it may quote a piece of the payload)."""


def excerpt(data: bytes | str, context: ErrorContext, limit: int = MAX_BODY) -> str:
    """The start of `data` as text, at most `limit` characters, scrubbed of the context's secrets.

    Scrubbed before it is cut, so that a secret the cut would split is not left half shown; only the
    part of `data` that can reach the excerpt is decoded and searched.
    """
    longest = max((len(secret.encode(errors="surrogatepass")) for secret in context.secrets), default=0)
    reach = limit + FORM_REACH * longest
    if isinstance(data, bytes):
        data = data[: 4 * reach].decode("utf-8", "replace")
    return context.scrub(data[:reach])[:limit]


def _reason(status: int) -> str:
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"
