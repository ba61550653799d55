"""The conformance cassettes (../shared/conformance/cassettes) and what each one should decode to.

Expected values are derived here from the recorded bytes with a deliberately plain reference reader
(split the text into lines, fold the JSON payloads) that shares no code with agentrt's decoders, so a
test compares agentrt against the recording, not against itself.

Every cassette is classified: which adapter replays it, or why none does (`NOT_APPLICABLE`).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentrt import (
    AuthenticationError,
    BadRequestError,
    ContextLengthExceededError,
    FinishReason,
    ModelError,
    ModelNotFoundError,
    OverloadedError,
    RateLimitError,
    ServerError,
)

# A copy of ../shared/conformance/cassettes, kept in the repository so that a clean clone (CI) has them.
CASSETTES = Path(__file__).resolve().parent / "conformance" / "cassettes"

# --- classification ------------------------------------------------------------------------------

OPENAI = frozenset(
    {"01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12", "13", "14", "15", "16",
     "17", "18", "29", "30", "31", "32", "33", "34", "45", "46"}
)  # fmt: skip
"""Replayed through `OpenAIChatModel` (answers, and the two errors inside 200 streams)."""

OLLAMA = frozenset({"26", "27", "28"})
"""Replayed through `OllamaChatModel`."""

ANTHROPIC = frozenset({"19", "20", "21", "22", "23", "24", "25"})
"""Replayed through `AnthropicChatModel` (21's retry-after on a 200 is also used by the retry tests)."""

ERRORS = frozenset({"35", "36", "37", "38", "39", "40", "41", "42", "43", "44", "47", "48", "49", "50", "51"})
"""Error responses: status and body go through the error mapping the adapters share, so each is
replayed through every adapter (OpenAI-compatible gateways pass on other providers' envelopes)."""

NOT_APPLICABLE: dict[str, str] = {}
"""Cassettes no adapter replays, and why (none, now that Anthropic's have an adapter)."""

SCENARIO_ERRORS: dict[str, type[ModelError]] = {
    "error_400_invalid_request": BadRequestError,
    "error_400_tool_use_failed": BadRequestError,
    "error_400_context_length_exceeded": ContextLengthExceededError,
    "error_401_auth": AuthenticationError,
    "error_404_model_not_found": ModelNotFoundError,
    "error_404_model_not_found_stream": ModelNotFoundError,
    "error_429_rate_limit": RateLimitError,
    "error_529_overloaded": OverloadedError,
}
"""The error class each recorded scenario must produce (the cassette's own label, not agentrt's)."""

STATUS_ERRORS: dict[int, type[ModelError]] = {400: BadRequestError, 500: ServerError}
"""For errors reported inside a 200 stream: the class for the status the payload names."""

FINISH: dict[str, FinishReason] = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "tool_calls": FinishReason.TOOL_CALLS,
}


@dataclass(frozen=True)
class Cassette:
    number: str
    name: str
    data: dict[str, Any]

    @property
    def scenario(self) -> str:
        return str(self.data["scenario"])

    @property
    def request_body(self) -> dict[str, Any]:
        return self.data["request"].get("body") or {}

    @property
    def url(self) -> str | None:
        return self.data["request"].get("url")

    @property
    def status(self) -> int:
        return int(self.data["response"]["status"])

    @property
    def headers(self) -> dict[str, str]:
        return dict(self.data["response"]["headers"])

    @property
    def body(self) -> bytes:
        return self.data["response"]["body"].encode("utf-8")

    @property
    def streaming(self) -> bool:
        """The request asked for a stream."""
        return bool(self.request_body.get("stream"))

    def header(self, name: str) -> str | None:
        for key, value in self.headers.items():
            if key.lower() == name:
                return value
        return None

    def __repr__(self) -> str:
        return self.name


def load_all() -> list[Cassette]:
    cassettes = []
    for path in sorted(CASSETTES.glob("[0-9][0-9]_*.json")):
        cassettes.append(Cassette(path.name[:2], path.stem, json.loads(path.read_text("utf-8"))))
    return cassettes


def load(number: str) -> Cassette:
    return next(c for c in load_all() if c.number == number)


def pick(numbers: Iterable[str]) -> list[Cassette]:
    wanted = set(numbers)
    return [c for c in load_all() if c.number in wanted]


# --- replay --------------------------------------------------------------------------------------


class Parts(httpx.AsyncByteStream):
    """A response body delivered in the given parts; records whether it was closed."""

    def __init__(self, parts: Sequence[bytes]) -> None:
        self.parts = list(parts)
        self.closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _PartsIterator(self.parts)

    async def aclose(self) -> None:
        self.closed = True


class _PartsIterator:
    # A class, not an async generator: nothing here is left for the garbage collector to finalize.
    def __init__(self, parts: list[bytes]) -> None:
        self._parts = iter(parts)

    def __aiter__(self) -> _PartsIterator:
        return self

    async def __anext__(self) -> bytes:
        try:
            return next(self._parts)
        except StopIteration:
            raise StopAsyncIteration from None


def replay(
    cassette: Cassette,
    *,
    parts: Sequence[bytes] | None = None,
    requests: list[httpx.Request] | None = None,
) -> httpx.MockTransport:
    """A transport answering every request with the cassette's status, headers and body bytes."""

    def handler(request: httpx.Request) -> httpx.Response:
        if requests is not None:
            requests.append(request)
        return httpx.Response(
            cassette.status,
            headers=cassette.headers,
            stream=Parts(parts if parts is not None else [cassette.body]),
        )

    return httpx.MockTransport(handler)


def split_at(body: bytes, offset: int) -> list[bytes]:
    return [body[:offset], body[offset:]]


def one_byte_parts(body: bytes) -> list[bytes]:
    return [body[i : i + 1] for i in range(len(body))]


# --- reference readers ---------------------------------------------------------------------------

_LINE_END = re.compile(r"\r\n|\r|\n")


def reference_sse(text: str) -> list[tuple[str, str]]:
    """(event, data) pairs: a plain reading of the SSE format (blank line ends an event)."""
    events: list[tuple[str, str]] = []
    event, data = "", []
    for line in _LINE_END.split(text):
        if line == "":
            if data:
                events.append((event or "message", "\n".join(data)))
            event, data = "", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value
    return events


@dataclass
class Expected:
    """What a response should fold to, read from the recording."""

    text: str = ""
    thinking: str = ""
    refusal: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    usage: tuple[int, int, int, int] | None = None
    finish: str | None = None
    id: str | None = None
    model: str | None = None
    error: dict[str, Any] | None = None
    """The error payload the body reported (inside a 200), if any."""
    signature: str | None = None
    """The signature of the (last) signed thinking block (Anthropic)."""

    @property
    def finish_reason(self) -> FinishReason | None:
        if self.finish is None:
            return FinishReason.TOOL_CALLS if self.calls else None
        reason = FINISH.get(self.finish, FinishReason.OTHER)
        return FinishReason.TOOL_CALLS if self.calls and reason is FinishReason.STOP else reason

    def error_class(self) -> type[ModelError]:
        assert self.error is not None
        inner = self.error.get("error", self.error)
        status = inner.get("status_code") or inner.get("code")
        return STATUS_ERRORS[int(status)]

    def error_message(self) -> str:
        assert self.error is not None
        inner = self.error.get("error", self.error)
        return inner if isinstance(inner, str) else inner["message"]


def openai_payloads(cassette: Cassette) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The JSON payloads before `[DONE]` (or an error), and the error payload if one came."""
    text = cassette.body.decode("utf-8")
    if "event-stream" not in (cassette.header("content-type") or "") and not cassette.streaming:
        return [json.loads(text)], None
    payloads: list[dict[str, Any]] = []
    for event, data in reference_sse(text):
        if event == "error":
            return payloads, json.loads(data)
        if data == "[DONE]":
            break
        payload = json.loads(data)
        if payload.get("error"):
            return payloads, payload
        payloads.append(payload)
    return payloads, None


def expected_openai(cassette: Cassette) -> Expected:
    payloads, error = openai_payloads(cassette)
    expected = Expected(error=error)
    calls: dict[int, dict[str, Any]] = {}
    for payload in payloads:
        if expected.id is None and expected.model is None:
            expected.id, expected.model = payload.get("id"), payload.get("model")
        for choice in payload.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or choice.get("message") or {}
            expected.text += delta.get("content") or ""
            expected.thinking += delta.get("reasoning_content") or delta.get("reasoning") or ""
            expected.refusal += delta.get("refusal") or ""
            for position, call in enumerate(delta.get("tool_calls") or []):
                entry = calls.setdefault(
                    call.get("index", position), {"id": None, "name": "", "arguments": ""}
                )
                entry["id"] = entry["id"] or call.get("id")
                entry["name"] += call.get("function", {}).get("name") or ""
                entry["arguments"] += call.get("function", {}).get("arguments") or ""
            expected.finish = choice.get("finish_reason") or expected.finish
        if payload.get("usage"):
            usage = payload["usage"]
            expected.usage = (
                usage["prompt_tokens"],
                usage["completion_tokens"],
                (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                (usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0),
            )
    expected.calls = [
        {"id": c["id"], "name": c["name"], "arguments": json.loads(c["arguments"] or "{}")}
        for c in calls.values()
    ]
    return expected


def expected_ollama(cassette: Cassette) -> Expected:
    expected = Expected()
    for line in cassette.body.decode("utf-8").split("\n"):
        if not line.strip():
            continue
        payload = json.loads(line)
        if payload.get("error"):
            expected.error = payload
            break
        expected.model = expected.model or payload.get("model")
        message = payload.get("message") or {}
        expected.text += message.get("content") or ""
        expected.thinking += message.get("thinking") or ""
        for call in message.get("tool_calls") or []:
            function = call["function"]
            expected.calls.append(
                {"id": call.get("id"), "name": function["name"], "arguments": function["arguments"]}
            )
        if payload.get("done"):
            expected.finish = payload.get("done_reason") or "stop"
            if "eval_count" in payload:
                expected.usage = (payload["prompt_eval_count"], payload["eval_count"], 0, 0)
            break
    return expected


def error_details(cassette: Cassette) -> tuple[str, str | None]:
    """The provider's message and request id, read from the recorded error response."""
    body = json.loads(cassette.body)
    error = body["error"]
    message = error if isinstance(error, str) else error["message"]
    request_id = cassette.header("x-request-id") or cassette.header("request-id") or body.get("request_id")
    return message, request_id


ANTHROPIC_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}
"""Anthropic's stop reasons under the names `FINISH` knows."""


def anthropic_payloads(cassette: Cassette) -> list[dict[str, Any]]:
    """A Messages response as stream events: each SSE event's data, or the events a whole (non-streamed)
    message stands for."""
    text = cassette.body.decode("utf-8")
    if "event-stream" in (cassette.header("content-type") or "") or cassette.streaming:
        return [json.loads(data) for _, data in reference_sse(text)]
    message = json.loads(text)
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    for index, block in enumerate(message["content"]):
        events.append({"type": "content_block_start", "index": index, "content_block": block})
    events.append({"type": "message_delta", "delta": {"stop_reason": message["stop_reason"]}})
    return events


def expected_anthropic(cassette: Cassette) -> Expected:
    expected = Expected()
    calls: dict[int, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    for event in anthropic_payloads(cassette):
        kind = event["type"]
        if kind == "error":
            expected.error = event
            break
        if kind == "message_start":
            message = event["message"]
            expected.id, expected.model = message["id"], message["model"]
            counts.update(message.get("usage") or {})
        elif kind == "content_block_start":
            block = event["content_block"]
            if block["type"] == "text":
                expected.text += block["text"]
            elif block["type"] == "thinking":
                expected.thinking += block["thinking"]
                expected.signature = block.get("signature") or expected.signature
            elif block["type"] == "tool_use":
                given = json.dumps(block["input"]) if block["input"] else ""
                calls[event["index"]] = {"id": block["id"], "name": block["name"], "arguments": given}
        elif kind == "content_block_delta":
            delta = event["delta"]
            if delta["type"] == "text_delta":
                expected.text += delta["text"]
            elif delta["type"] == "thinking_delta":
                expected.thinking += delta["thinking"]
            elif delta["type"] == "signature_delta":
                expected.signature = delta["signature"]
            elif delta["type"] == "input_json_delta":
                calls[event["index"]]["arguments"] += delta["partial_json"]
        elif kind == "message_delta":
            expected.finish = ANTHROPIC_STOP.get(event["delta"]["stop_reason"], event["delta"]["stop_reason"])
            counts.update(event.get("usage") or {})
            read = counts.get("cache_read_input_tokens") or 0
            prompt = counts["input_tokens"] + read + (counts.get("cache_creation_input_tokens") or 0)
            expected.usage = (prompt, counts["output_tokens"], read, 0)
    expected.calls = [
        {"id": c["id"], "name": c["name"], "arguments": json.loads(c["arguments"] or "{}")}
        for c in calls.values()
    ]
    return expected
