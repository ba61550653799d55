"""Anthropic's Messages API (`POST {base_url}/v1/messages`) over httpx.

The wire format is content blocks: the request's `system` is a top-level field, tool calls are
`tool_use` blocks of an assistant message and their results `tool_result` blocks of the next user
message, thinking comes back as `thinking` blocks sealed with a `signature` (or as `redacted_thinking`
blocks of encrypted data), which must be sent back unchanged. The key goes in `x-api-key`, the API
version in `anthropic-version`, and `max_tokens` is required.

A stream is a sequence of named SSE events (`message_start`, `content_block_start`/`_delta`/`_stop`,
`message_delta`, `message_stop`, `ping`, `error`) whose data repeats the event's name as `type`; a
non-streaming response is one `message` object. `MessagesMapper` reads both into the same chunks: a
whole message is read as the events that would have streamed it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Final, Literal, Unpack

import orjson

from .._errors import BadRequestError, ConfigurationError
from .._events import (
    Finish,
    FinishReason,
    ResponseMeta,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    Usage,
)
from ._anthropic_request import (
    EPHEMERAL,
    compact,
    mark_last_block,
    thinking_enabled,
    wire_messages,
    wire_tool,
    wire_tool_choice,
)
from ._base import ConnectionOptions, HttpChatModel, Server, tool_images_apart
from ._decoders import EventStreamDecoder, MalformedPayload, MapperBase, json_type
from ._protocol import Capabilities, ModelSettings, check_declared_settings

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from .._events import ModelChunk
    from .._messages import ChatMessage
    from ._failures import ErrorContext
    from ._protocol import ModelRequest

__all__ = ["AnthropicChatModel", "MessagesMapper"]

DEFAULT_BASE_URL: Final = "https://api.anthropic.com"
SERVER: Final = Server(
    "anthropic", DEFAULT_BASE_URL, "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", key_header="x-api-key"
)
"""Anthropic's API, or where `ANTHROPIC_BASE_URL` says; the key, in `ANTHROPIC_API_KEY`, goes in
`x-api-key`."""

API_VERSION: Final = "2023-06-01"
DEFAULT_MAX_TOKENS: Final = 4096
"""Sent when neither the request's nor the model's settings name `max_tokens` (the API requires one)."""
MIN_THINKING_BUDGET: Final = 1024
"""The least thinking budget the Messages API takes."""

DEFAULT_CAPABILITIES: Final = Capabilities(
    tool_output=True,
    image_input=True,
    pdf_input=True,
    thinking=True,
    handles_deadline=True,
    provider="anthropic",
)
"""What the Messages API takes. Structured answers go through a forced `final_answer` tool: the API
has no JSON mode (`json_schema`, `json_object` are false), and follows a tool's schema well."""

THINKING_CAPABILITIES: Final = Capabilities(
    tool_choice_required=False,
    tool_choice_named=False,
    tool_output=True,
    image_input=True,
    pdf_input=True,
    thinking=True,
    handles_deadline=True,
    provider="anthropic",
)
"""With thinking on, the API refuses a forced tool choice (`any` or a named tool): the answer tool is
then offered with `auto` and asked for in the instructions."""

STOP_REASONS: Final[dict[str, FinishReason]] = {
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "max_tokens": FinishReason.LENGTH,
    "model_context_window_exceeded": FinishReason.LENGTH,
    "tool_use": FinishReason.TOOL_CALLS,
    "refusal": FinishReason.CONTENT_FILTER,
}
"""Anthropic's `stop_reason`s as agentrt's; any other (`pause_turn`, ...) is `FinishReason.OTHER`."""

_USAGE_COUNTS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


class AnthropicChatModel(HttpChatModel):
    """A Claude model behind Anthropic's Messages API.

    - `model`: the model name (e.g. `"claude-sonnet-4-5"`).
    - `base_url`, `api_key`: default to `ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY` (then to
      `https://api.anthropic.com`). The key is kept as a `SecretStr` and only ever put into the
      `x-api-key` header; errors, listener events and the HTTP loggers' records never show it.
    - `settings`: default request parameters. `max_tokens` defaults to `max_tokens` here (the API
      requires one); `stop` becomes `stop_sequences`; `seed` and the penalties have no Messages API
      field and are not sent.
    - `thinking`: extended thinking: a token budget (`{"type": "enabled", "budget_tokens": n}`; it
      must be below `max_tokens`), or `"adaptive"` for the models that decide themselves. Thinking
      blocks come back as `ThinkingDelta` chunks with their signature and are sent back unchanged;
      with thinking off, no thinking block is sent (the API refuses one in the last assistant message).
      Thinking on also changes the default capabilities (`THINKING_CAPABILITIES`), and declares in
      them what the API then refuses on every request, which `build()` checks: `max_tokens` not above
      the budget (`min_max_tokens`), a temperature other than 1 (`fixed_temperature`).
    - `cache_tools`, `cache_system`, `cache_history`: prompt caching (see below).
    - `parallel_tool_calls`: `False` sends `disable_parallel_tool_use` with the tool choice.
    - `api_version`, `beta`: the `anthropic-version` header and the `anthropic-beta` features.
    - `streaming`, `capabilities`, `extra_body`: as for `OpenAIChatModel`.
    - `headers`, `timeout`, `retry`, `client`, `on_request`, `on_response`, `on_error`: how to reach
      the server, as for every HTTP adapter (see `ConnectionOptions`); `headers` win over the
      `anthropic-version` and `anthropic-beta` headers made of `api_version` and `beta`.

    Prompt caching is three switches rather than a list of breakpoints, because the places worth a
    `cache_control: {"type": "ephemeral"}` marker are fixed by the request's layout, and a caller
    cannot name message positions in advance (a memory window shifts them every turn). The API caches
    prefixes in the order tools, system, messages: `cache_tools` marks the last tool (the tool list is
    the same on every request of a service), `cache_system` the system prompt (tools and system
    together when both are on), and `cache_history` the last block of the last message, so that the
    next request (the next tool round, the next turn) reads the whole conversation so far from the
    cache. That is at most three of the four breakpoints the API allows. Caching is opt-in: a cache
    write costs more than plain input, and prompts under the model's minimum are not cached anyway.

    Structured output uses a forced `final_answer` tool (`output_mode="auto"` picks it); a request
    with a `response_format` raises `BadRequestError`. Errors are `agentrt.ModelError` kinds: the
    `{"type": "error", "error": {...}}` envelope by status and `error.type` (`overloaded_error`, also
    as HTTP 529, is `OverloadedError`), an `error` event inside a stream by its type.
    """

    _server = SERVER
    _default_capabilities = DEFAULT_CAPABILITIES
    _path = "/v1/messages"
    _stream_type = "text/event-stream"
    _stream_decoder = EventStreamDecoder

    def __init__(
        self,
        model: str,
        *,
        settings: ModelSettings | None = None,
        capabilities: Capabilities | None = None,
        streaming: bool = True,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        thinking: int | Literal["adaptive"] | None = None,
        cache_tools: bool = False,
        cache_system: bool = False,
        cache_history: bool = False,
        parallel_tool_calls: bool | None = None,
        api_version: str = API_VERSION,
        beta: Sequence[str] = (),
        extra_body: Mapping[str, Any] | None = None,
        **connection: Unpack[ConnectionOptions],
    ) -> None:
        kind = type(self).__name__
        if max_tokens < 1:
            raise ConfigurationError(f"{kind}: max_tokens must be positive, got {max_tokens}")
        if isinstance(thinking, int) and thinking < MIN_THINKING_BUDGET:
            raise ConfigurationError(
                f"{kind}: the thinking budget ({thinking} tokens) must be at least {MIN_THINKING_BUDGET}"
            )
        self._max_tokens = max_tokens
        self._thinking = thinking
        declared = capabilities or (DEFAULT_CAPABILITIES if thinking is None else THINKING_CAPABILITIES)
        if thinking is not None:
            declared = _thinking_limits(declared, thinking)
            own = settings or ModelSettings()
            check_declared_settings(
                declared,
                dataclasses.replace(own, max_tokens=own.max_tokens or max_tokens),
                f"{kind}(thinking={thinking!r})",
            )
        headers = {"anthropic-version": api_version}
        if beta:
            headers["anthropic-beta"] = ",".join(beta)
        super().__init__(
            model, connection, settings=settings, capabilities=declared, streaming=streaming, headers=headers
        )
        self._cache_tools = cache_tools
        self._cache_system = cache_system
        self._cache_history = cache_history
        self._parallel_tool_calls = parallel_tool_calls
        self._extra_body = dict(extra_body or {})

    # --- request ---------------------------------------------------------------------------------

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body for `request` (what listeners see). Raises `BadRequestError` for what the
        Messages API cannot carry (a `response_format`, audio or video)."""
        if request.response_format is not None:
            raise BadRequestError(
                "the Messages API has no response_format: ask for structured output with "
                "output_mode='tool' (or 'auto')"
            )
        settings = self._settings.merge(request.settings)
        body: dict[str, Any] = {
            "model": self._model,
            "max_tokens": settings.max_tokens or self._max_tokens,
        }
        thinking = self._thinking
        thinking_on = thinking is not None or thinking_enabled(self._extra_body.get("thinking"))
        sent: Sequence[ChatMessage] = request.messages
        if not self.capabilities.image_input:  # a tool's images are named in its result's text
            sent = tool_images_apart(sent, image_input=False)
        system, messages = wire_messages(sent, thinking=thinking_on)
        if system:
            if self._cache_system:
                body["system"] = [{"type": "text", "text": system, "cache_control": EPHEMERAL}]
            else:
                body["system"] = system
        if self._cache_history and messages:
            mark_last_block(messages[-1])
        body["messages"] = [compact(m) for m in messages]
        if settings.temperature is not None:
            body["temperature"] = settings.temperature
        if settings.top_p is not None:
            body["top_p"] = settings.top_p
        if settings.stop:
            body["stop_sequences"] = list(settings.stop)
        if thinking is not None:
            body["thinking"] = (
                {"type": "adaptive"}
                if thinking == "adaptive"
                else {"type": "enabled", "budget_tokens": thinking}
            )
        if request.tools:
            tools = [wire_tool(spec) for spec in request.tools]
            if self._cache_tools:
                tools[-1]["cache_control"] = EPHEMERAL
            body["tools"] = tools
            choice = wire_tool_choice(request.tool_choice, self._parallel_tool_calls)
            if choice is not None:
                body["tool_choice"] = choice
        body["stream"] = self._streaming
        body.update(self._extra_body)
        return body

    # --- response --------------------------------------------------------------------------------

    def _mapper(self, request: ModelRequest, request_id: str | None) -> MessagesMapper:
        return MessagesMapper(self._session.context, request_id)


def _thinking_limits(capabilities: Capabilities, thinking: int | Literal["adaptive"]) -> Capabilities:
    """What the Messages API refuses on every request with thinking on, declared where the
    capabilities leave it open: `max_tokens` not above the budget, a temperature other than 1."""
    least = capabilities.min_max_tokens
    if least is None and isinstance(thinking, int):
        least = thinking + 1
    fixed = capabilities.fixed_temperature
    return dataclasses.replace(
        capabilities, min_max_tokens=least, fixed_temperature=1.0 if fixed is None else fixed
    )


# --- response mapping ------------------------------------------------------------------------------


class MessagesMapper(MapperBase):
    """Maps Messages API payloads (stream events, or one whole `message`) to model chunks.

    Content blocks are tracked by their `index`: text deltas become `TextDelta`s, `tool_use` blocks
    `ToolCallDelta`s numbered in order of appearance (their `input_json_delta` fragments are the
    arguments; a call with none gets `{}`), `thinking` deltas `ThinkingDelta`s (the signature on a
    chunk of its own, closing the block), a `redacted_thinking` block one redacted `ThinkingDelta`.
    Blocks of other kinds (server tools, their results) are skipped. Usage is reported once, at
    `message_delta`: input counts from `message_start` (updated by `message_delta` where it repeats
    them), output from `message_delta`; `input_tokens` is the whole prompt, cache reads and writes
    included (as OpenAI counts it), `cached_input_tokens` the cache reads.
    """

    __slots__ = ("_blocks", "_tools", "_usage")

    def __init__(self, context: ErrorContext, request_id: str | None) -> None:
        super().__init__(context, request_id)
        self._blocks: dict[int, list[Any]] = {}
        """Per content block index: [tool index (-1 for other blocks), whether arguments came]."""
        self._tools = 0
        self._usage: dict[str, int] = {}

    def flush(self, out: list[ModelChunk]) -> None:
        """Nothing is held back."""

    def feed(self, payload: Any, out: list[ModelChunk], *, mid_stream: bool = True) -> None:
        """Append the chunks of one payload to `out`; raises `ModelError` for an error payload and
        `MalformedPayload` (or what reading it raised) for a payload of the wrong shape."""
        if payload.__class__ is not dict:
            raise MalformedPayload(f"the payload is {json_type(payload)}, not an object")
        kind = payload.get("type")
        if kind == "content_block_delta":  # the per-token path
            self._delta(payload["index"], payload["delta"], out)
        elif kind == "message_start":
            self._start(payload["message"], out)
        elif kind == "content_block_start":
            self._block_start(payload["index"], payload["content_block"], out)
        elif kind == "content_block_stop":
            self._block_stop(payload["index"], out)
        elif kind == "message_delta":
            self._message_delta(payload.get("delta") or {}, payload.get("usage"), out)
        elif kind == "message_stop":
            self.finished = True
        elif kind == "message" and not mid_stream:
            self._whole(payload, out)
        elif kind == "error" or payload.get("error"):
            raise self.error(payload, mid_stream=mid_stream)
        elif not mid_stream:
            raise MalformedPayload(f"the response is of type {kind!r}, not a message")
        # `ping` and event types added later carry nothing to read

    def _start(self, message: dict[str, Any], out: list[ModelChunk]) -> None:
        if not self._meta:
            self._meta = True
            response_id, model = message.get("id"), message.get("model")
            out.append(
                ResponseMeta(
                    response_id if response_id.__class__ is str else None,
                    model if model.__class__ is str else None,
                )
            )
        self._count(message.get("usage"))

    def _count(self, usage: Any) -> None:
        if not usage:
            return
        if usage.__class__ is not dict:
            raise MalformedPayload(f"`usage` is {json_type(usage)}, not an object")
        for name in _USAGE_COUNTS:
            value = usage.get(name)
            if value is not None:
                if value.__class__ is not int:
                    raise MalformedPayload(f"`usage.{name}` is {json_type(value)}, not an integer")
                self._usage[name] = value

    def _block_start(self, index: int, block: dict[str, Any], out: list[ModelChunk]) -> None:
        kind = block["type"]
        tool = -1
        arguments = ""
        if kind == "text":
            text = block.get("text")
            if text:
                out.append(TextDelta(_text(text, "text")))
        elif kind == "thinking":
            text = block.get("thinking") or ""
            signature = block.get("signature") or None
            if text or signature:
                sealed = None if signature is None else _text(signature, "signature")
                out.append(ThinkingDelta(_text(text, "thinking"), sealed))
        elif kind == "redacted_thinking":
            out.append(ThinkingDelta("", _text(block["data"], "data"), redacted=True))
        elif kind == "tool_use":
            tool = self._tools
            self._tools += 1
            given = block.get("input")
            if given:  # streamed calls start with `{}` and send their arguments as deltas
                arguments = orjson.dumps(given).decode()
            out.append(ToolCallDelta(tool, _text(block["id"], "id"), _text(block["name"], "name"), arguments))
        self._blocks[index] = [tool, bool(arguments)]

    def _delta(self, index: int, delta: dict[str, Any], out: list[ModelChunk]) -> None:
        kind = delta["type"]
        if kind == "text_delta":
            text = delta["text"]
            if text:
                out.append(TextDelta(_text(text, "text")))
        elif kind == "input_json_delta":
            part = delta["partial_json"]
            block = self._blocks.get(index)
            if block is None:
                raise MalformedPayload(f"arguments for content block {index}, which never started")
            if part and block[0] >= 0:
                block[1] = True
                out.append(ToolCallDelta(block[0], None, None, _text(part, "partial_json")))
        elif kind == "thinking_delta":
            text = delta["thinking"]
            if text:
                out.append(ThinkingDelta(_text(text, "thinking")))
        elif kind == "signature_delta":
            out.append(ThinkingDelta("", _text(delta["signature"], "signature")))
        # citations and deltas added later carry no text of their own

    def _block_stop(self, index: int, out: list[ModelChunk]) -> None:
        block = self._blocks.get(index)
        if block is not None and block[0] >= 0 and not block[1]:
            block[1] = True
            out.append(ToolCallDelta(block[0], None, None, "{}"))  # a call without arguments

    def _message_delta(self, delta: dict[str, Any], usage: Any, out: list[ModelChunk]) -> None:
        raw = delta.get("stop_reason")
        if raw:
            raw = _text(raw, "stop_reason")
            out.append(Finish(STOP_REASONS.get(raw, FinishReason.OTHER), raw))
        self._count(usage)
        counts = self._usage
        if counts:
            read = counts.get("cache_read_input_tokens", 0)
            prompt = counts.get("input_tokens", 0) + read + counts.get("cache_creation_input_tokens", 0)
            out.append(Usage(prompt, counts.get("output_tokens", 0), read, 0))

    def _whole(self, message: dict[str, Any], out: list[ModelChunk]) -> None:
        """A non-streamed response, read as the events that would have streamed it."""
        content = message.get("content")
        if content.__class__ is not list:
            raise MalformedPayload(f"the message's `content` is {json_type(content)}, not a list")
        self._start(message, out)
        for index, block in enumerate(content):
            if block.__class__ is not dict:
                raise MalformedPayload(f"a content block is {json_type(block)}, not an object")
            self._block_start(index, block, out)
            self._block_stop(index, out)
        self._message_delta({"stop_reason": message.get("stop_reason")}, None, out)
        self.finished = True


def _text(value: Any, field: str) -> str:
    if value.__class__ is not str:
        raise MalformedPayload(f"`{field}` is {json_type(value)}, not a string")
    return value
