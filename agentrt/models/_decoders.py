"""Response bodies to model chunks: framing (SSE, SSE of named events, NDJSON, one JSON document) over
a payload mapper.

A decoder is fed the body's bytes as they arrive and returns the chunks they complete. It never raises:
an error the body reports, or a body that does not follow the protocol, is stored in `error` (and
`done` set) so that the chunks decoded before it still reach the caller, in the same order however the
body was split into network reads. The mapper (one per protocol) turns one parsed payload into chunks.

A payload that is not of its protocol's shape (not JSON, not an object, a field of the wrong type) makes
the mapper raise: `MalformedPayload` where it checks a shape itself, or whatever Python raises where it
reads one of the wrong type. The decoder translates that, in one place (`_unreadable`), into a
`ModelResponseError` that says what was wrong and carries the payload as its `body`; the mapper's
exception is its `__cause__`, unless the payload holds the key (`_failures.unreadable`). The checks
cost nothing on the way of a well-formed payload: a `try` around the mapper is free while nothing
raises.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Protocol

import orjson

from .._errors import ModelError
from .._events import FinishReason
from ._failures import MalformedPayload, error_from_payload, unreadable
from ._ndjson import NDJSONDecoder
from ._sse import SSEDecoder

if TYPE_CHECKING:
    from .._events import ModelChunk
    from ._failures import ErrorContext

__all__ = [
    "FINISH_REASONS",
    "EventStreamDecoder",
    "JSONChunkDecoder",
    "MalformedPayload",
    "NDJSONChunkDecoder",
    "PayloadMapper",
    "SSEChunkDecoder",
    "finish_reason",
    "json_type",
]

FINISH_REASONS: Final[dict[str, FinishReason]] = {
    "stop": FinishReason.STOP,
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "eos": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "max_tokens": FinishReason.LENGTH,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
    "tool_use": FinishReason.TOOL_CALLS,
    "content_filter": FinishReason.CONTENT_FILTER,
}


def finish_reason(raw: str, *, called_tools: bool) -> FinishReason:
    """A provider's finish reason as agentrt's; a "stop" that ended with tool calls is `TOOL_CALLS`
    (OpenAI with a forced tool choice, Ollama always)."""
    reason = FINISH_REASONS.get(raw, FinishReason.OTHER)
    if called_tools and reason is FinishReason.STOP:
        return FinishReason.TOOL_CALLS
    return reason


_loads: Final = orjson.loads

_PROBLEMS: Final = (ValueError, TypeError, AttributeError, LookupError, ArithmeticError)
"""What reading a payload of the wrong shape raises (orjson's decode error and `MalformedPayload` are
`ValueError`s)."""


def json_type(value: Any) -> str:
    """The JSON type of a parsed value, for messages: "a number", "a list", "null", ..."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _unreadable(
    mapper: PayloadMapper, what: str, exc: Exception, data: bytes | None, *, mid_stream: bool
) -> ModelError:
    """The error for a payload `exc` found malformed: what was wrong (`_failures.unreadable` adds what
    `exc` says, as far as it can without showing a piece of the key), and the payload itself."""
    return mapper.unreadable(what, mid_stream=mid_stream, data=data, cause=exc)


class PayloadMapper(Protocol):
    """Maps a protocol's parsed payloads to chunks."""

    @property
    def finished(self) -> bool:
        """The response's end was seen (a finish reason, `done: true`)."""
        ...

    def feed(self, payload: Any, out: list[ModelChunk], *, mid_stream: bool = True) -> None:
        """Append the chunks of one payload; raise `ModelError` for an error payload. A whole
        (non-streamed) response is fed with `mid_stream=False`."""

    def flush(self, out: list[ModelChunk]) -> None:
        """The answer ended: append what was held back."""

    def error(self, payload: Any, *, mid_stream: bool) -> ModelError: ...

    def unreadable(
        self, what: str, *, mid_stream: bool, data: bytes | None = None, cause: BaseException | None = None
    ) -> ModelError:
        """The error for a response that does not follow the protocol: `data` is the offending payload,
        `cause` what found it malformed (the error says what it found)."""


class MapperBase:
    """What a protocol's `PayloadMapper` starts from: the call's `ErrorContext` and the request id,
    which its errors carry (`error`, `unreadable`); `_meta` (the response's metadata was read) and
    `finished`, both false."""

    __slots__ = ("_context", "_meta", "_request_id", "finished")

    def __init__(self, context: ErrorContext, request_id: str | None) -> None:
        self._context = context
        self._request_id = request_id
        self._meta = False
        self.finished = False

    def error(self, payload: Any, *, mid_stream: bool) -> ModelError:
        return error_from_payload(payload, self._context, request_id=self._request_id, mid_stream=mid_stream)

    def unreadable(
        self, what: str, *, mid_stream: bool, data: bytes | None = None, cause: BaseException | None = None
    ) -> ModelError:
        return unreadable(
            what, self._context, request_id=self._request_id, mid_stream=mid_stream, body=data, cause=cause
        )


class SSEChunkDecoder:
    """An SSE body of JSON chunks ending with `data: [DONE]`; `event: error` fails the call.

    Named events other than `message` and `error` are skipped. A stream that ends without `[DONE]`
    is accepted once the response finished; one that ends before is an error (a cut connection).
    """

    __slots__ = ("_mapper", "_sse", "done", "error")

    def __init__(self, mapper: PayloadMapper) -> None:
        self._mapper = mapper
        self._sse = SSEDecoder()
        self.done = False
        self.error: ModelError | None = None

    def feed(self, raw: bytes) -> list[ModelChunk]:
        out: list[ModelChunk] = []
        sse = self._sse
        if (
            sse.idle
            and raw.startswith(b"data: {")
            and raw.endswith(b"\n\n")
            and raw.find(b"\n", 7) == len(raw) - 2
            and 13 not in raw
        ):
            # The common read: exactly one event of one JSON data line, between events. Same result
            # as the SSE decoder's, without its bookkeeping. A "\r" anywhere is a line end too (or
            # half of one): such a read goes to the SSE decoder.
            try:
                self._mapper.feed(_loads(raw[6:-2]), out)
            except ModelError as exc:
                self.error, self.done = exc, True
            except _PROBLEMS as exc:
                self._fail(raw[6:-2], exc)
            return out
        plain = sse.feed_plain(raw)
        if plain is not None:
            self._payloads(plain, out)
            return out
        events = sse.feed(raw)
        if events:
            self._events(events, out)
        return out

    def close(self) -> list[ModelChunk]:
        out: list[ModelChunk] = []
        if not self.done:
            self._events(self._sse.close(), out)
        _finish(self, self._mapper, out)
        return out

    def _payloads(self, payloads: list[bytes], out: list[ModelChunk]) -> None:
        feed = self._mapper.feed
        loads = orjson.loads
        for data in payloads:
            if data.startswith(b"[DONE]"):
                self.done = True
                return
            try:
                feed(loads(data), out)
            except ModelError as exc:
                self.error, self.done = exc, True
                return
            except _PROBLEMS as exc:
                self._fail(data, exc)
                return

    def _events(self, events: list[tuple[str, bytes]], out: list[ModelChunk]) -> None:
        payloads: list[bytes] = []
        for event, data in events:
            if event and event != "message":
                if event == "error":
                    self._payloads(payloads, out)  # what came before the error is delivered
                    if not self.done:
                        self._fail(data, None)
                    return
                continue  # pings and other named events carry no chunk
            payloads.append(data)
        self._payloads(payloads, out)

    def _fail(self, data: bytes, exc: Exception | None) -> None:
        """End with an error: the payload `data` is malformed (`exc` says why), or, without `exc`, the
        data of an `error` event."""
        mapper = self._mapper
        self.done = True
        if exc is not None:
            self.error = _unreadable(
                mapper, "a stream event is not a valid chunk", exc, data, mid_stream=True
            )
            return
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            payload = None
        reported = payload if payload is not None else data.decode("utf-8", "replace")
        self.error = mapper.error(reported, mid_stream=True)


class EventStreamDecoder:
    """An SSE body of named events (Anthropic's Messages stream), until the mapper has finished
    (`message_stop`); an `error` event fails the call, whatever its data.

    The mapper tells events apart by their data's `type` (which repeats the event's name). A stream
    that ends before the mapper finished is an error (a cut connection).
    """

    __slots__ = ("_mapper", "_sse", "done", "error")

    def __init__(self, mapper: PayloadMapper) -> None:
        self._mapper = mapper
        self._sse = SSEDecoder()
        self.done = False
        self.error: ModelError | None = None

    def feed(self, raw: bytes) -> list[ModelChunk]:
        out: list[ModelChunk] = []
        events = self._sse.feed(raw)
        if events:
            self._events(events, out)
        return out

    def close(self) -> list[ModelChunk]:
        out: list[ModelChunk] = []
        if not self.done:
            self._events(self._sse.close(), out)
        mapper = self._mapper
        if self.error is None and not mapper.finished:
            self.error = mapper.unreadable(
                "the stream ended before the response was complete", mid_stream=True
            )
        self.done = True
        return out

    def _events(self, events: list[tuple[str, bytes]], out: list[ModelChunk]) -> None:
        mapper = self._mapper
        loads = orjson.loads
        for name, data in events:
            try:
                payload = loads(data)
                if name == "error" and (payload.__class__ is not dict or payload.get("type") != "error"):
                    # an `error` event is an error whatever its data says (a gateway's own shape)
                    raise mapper.error(payload, mid_stream=True)
                mapper.feed(payload, out)
            except ModelError as exc:
                self.error, self.done = exc, True
                return
            except _PROBLEMS as exc:
                self.done = True
                if name == "error":  # an error event whose data is not JSON: its text is the message
                    self.error = mapper.error(data.decode("utf-8", "replace"), mid_stream=True)
                else:
                    self.error = mapper.unreadable(
                        "a stream event is not a valid chunk", mid_stream=True, data=data, cause=exc
                    )
                return
            if mapper.finished:
                self.done = True
                return


class NDJSONChunkDecoder:
    """A newline-delimited JSON body (Ollama): one payload a line, until the mapper has finished."""

    __slots__ = ("_lines", "_mapper", "done", "error")

    def __init__(self, mapper: PayloadMapper) -> None:
        self._mapper = mapper
        self._lines = NDJSONDecoder()
        self.done = False
        self.error: ModelError | None = None

    def feed(self, raw: bytes) -> list[ModelChunk]:
        out: list[ModelChunk] = []
        lines = self._lines.feed(raw)
        if lines:
            self._payloads(lines, out)
        return out

    def close(self) -> list[ModelChunk]:
        out: list[ModelChunk] = []
        if not self.done:
            self._payloads(self._lines.close(), out)
        _finish(self, self._mapper, out)
        return out

    def _payloads(self, lines: list[bytes], out: list[ModelChunk]) -> None:
        mapper = self._mapper
        feed = mapper.feed
        loads = orjson.loads
        for line in lines:
            try:
                feed(loads(line), out)
            except ModelError as exc:
                self.error, self.done = exc, True
                return
            except _PROBLEMS as exc:
                if line.isspace():
                    continue  # a blank line holding a "\r" or spaces
                self.error = _unreadable(
                    mapper, "a stream line is not a valid chunk", exc, line, mid_stream=True
                )
                self.done = True
                return
            if mapper.finished:
                self.done = True
                return


def _finish(
    decoder: SSEChunkDecoder | NDJSONChunkDecoder, mapper: PayloadMapper, out: list[ModelChunk]
) -> None:
    mapper.flush(out)
    if decoder.error is None and not mapper.finished and not decoder.done:
        decoder.error = mapper.unreadable(
            "the stream ended before the response was complete", mid_stream=True
        )
    decoder.done = True


class JSONChunkDecoder:
    """A whole JSON response (a non-streaming request): read to the end, then mapped in one go."""

    __slots__ = ("_mapper", "_parts", "done", "error")

    def __init__(self, mapper: PayloadMapper) -> None:
        self._mapper = mapper
        self._parts: list[bytes] = []
        self.done = False
        self.error: ModelError | None = None

    def feed(self, raw: bytes) -> list[ModelChunk]:
        self._parts.append(raw)
        return []

    def close(self) -> list[ModelChunk]:
        out: list[ModelChunk] = []
        body = b"".join(self._parts)
        mapper = self._mapper
        self.done = True
        try:
            mapper.feed(orjson.loads(body), out, mid_stream=False)
        except ModelError as exc:
            self.error = exc
            return []
        except _PROBLEMS as exc:
            self.error = _unreadable(mapper, "the response is not valid", exc, body, mid_stream=False)
            return []
        mapper.flush(out)
        return out
