"""The model protocol: one async streaming primitive plus declared capabilities.

A `ChatModel` implements `stream(request)`, an async iterator of chunks (see `agentrt._events`). A
non-streaming call is `complete(model, request)`, the fold of that stream, implemented once here. The
same `ResponseAccumulator` is what the pipeline uses while it forwards chunks, so both agree.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from .._errors import ConfigurationError
from .._events import (
    Finish,
    FinishReason,
    ModelChunk,
    ModelResponse,
    RefusalDelta,
    ResponseMeta,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    Usage,
)
from .._messages import (
    AssistantMessage,
    ChatMessage,
    SystemMessage,
    TextContent,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from .._wire import (
    JsonObjectFormat,
    JsonSchemaFormat,
    ModelRequest,
    ModelSettings,
    ResponseFormat,
    ToolChoice,
    ToolSpec,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

__all__ = [
    "Capabilities",
    "ChatModel",
    "JsonObjectFormat",
    "JsonSchemaFormat",
    "ModelRequest",
    "ModelSettings",
    "ResponseAccumulator",
    "ResponseFormat",
    "ToolChoice",
    "ToolSpec",
    "aclose_iterator",
    "complete",
    "estimate_tokens",
]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a model (and the server in front of it) supports, and what it declares about itself.

    Declared by each adapter and overridable by the user (`dataclasses.replace`), because compatible
    servers differ. The pipeline never probes: it reads these fields, once, at `build()`.
    """

    tools: bool = True
    parallel_tool_calls: bool = True
    tool_choice_required: bool = True
    """`tool_choice: "required"` works."""
    tool_choice_named: bool = True
    """A `tool_choice` naming one tool forces a call of that tool."""
    tool_choice_auto: bool = True
    """The model may be offered tools and choose itself; when false, tools are offered only while one
    is forced by name (`ToolSettings.tool_choice`)."""
    json_schema: bool = False
    """`response_format` with a JSON schema (structured output)."""
    json_object: bool = False
    """A JSON mode without (or with a server-specific) schema."""
    tool_output: bool = False
    """Structured answers are best asked for through a forced `final_answer` tool whose parameters
    are the schema (`output_mode="auto"` picks it where the model has no `json_schema`)."""
    image_input: bool = False
    audio_input: bool = False
    video_input: bool = False
    pdf_input: bool = False
    thinking: bool = False
    usage_in_stream: bool = True
    """The server reports usage in streamed responses (otherwise usage is estimated)."""
    handles_deadline: bool = False
    """The model stops waiting at `ModelRequest.deadline` itself: no retry sleep past it, no read
    that outlasts it, and `ModelTimeoutError` there. Otherwise the pipeline reads every chunk of a
    stream under a cancel scope at the deadline (an awaited call runs under one scope either way).
    The HTTP adapters declare it whatever `capabilities=` they are given (it describes their code,
    not the server): one watchdog per response (see `agentrt._watchdog`)."""
    provider: str | None = None
    """Who serves the model (`"openai"`, `"anthropic"`, `"ollama"`): `Started.provider` and
    OpenTelemetry's `gen_ai.provider.name`. The HTTP adapters name their API where `capabilities=`
    names none; name the actual server there (e.g. `"groq"` behind `OpenAIChatModel`)."""
    min_max_tokens: int | None = None
    """The least `ModelSettings.max_tokens` the model takes (Anthropic with a thinking budget: one
    more than the budget). `build()` refuses the build's and each method's settings under it."""
    fixed_temperature: float | None = None
    """The one `ModelSettings.temperature` the model takes, when it takes no other (Anthropic with
    thinking on: 1). `build()` refuses the build's and each method's settings with another."""


class ChatModel(Protocol):
    """A chat model: one streaming primitive and its capabilities.

    `stream` returns an async iterator of chunks. The pipeline closes it (`aclose()`, when it has one)
    as soon as it stops reading, whether the stream ended, failed, or was cancelled; an adapter releases
    its connection there. An adapter translates its transport errors into `agentrt.ModelError` kinds.

    Everything else a model says about itself is data in its `capabilities`, read once at `build()`:
    whether it stops at `request.deadline` itself (`Capabilities.handles_deadline`; otherwise the
    pipeline reads each chunk under a cancel scope), who serves it (`Capabilities.provider`, for
    `Started.provider`), and the settings it refuses on every request (`min_max_tokens`,
    `fixed_temperature`, checked at `build()`). A model needs no member beyond these three.
    """

    @property
    def name(self) -> str:
        """The model name (for results, events and logs)."""
        ...

    @property
    def capabilities(self) -> Capabilities: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]: ...


def check_declared_settings(capabilities: Capabilities, settings: ModelSettings, where: str) -> None:
    """Raise `ConfigurationError`, prefixed with `where`, for settings that `capabilities` declare
    the model refuses on every request (`min_max_tokens`, `fixed_temperature`)."""
    least = capabilities.min_max_tokens
    if least is not None and settings.max_tokens is not None and settings.max_tokens < least:
        raise ConfigurationError(
            f"{where}: max_tokens ({settings.max_tokens}) is below {least}, the least the model takes "
            "(its Capabilities.min_max_tokens)"
        )
    fixed = capabilities.fixed_temperature
    if fixed is not None and settings.temperature is not None and settings.temperature != fixed:
        raise ConfigurationError(
            f"{where}: the model takes no temperature but {fixed:g} (its Capabilities.fixed_temperature), "
            f"got {settings.temperature}"
        )


async def aclose_iterator(iterator: AsyncIterator[Any]) -> None:
    """Close an async iterator if it can be closed (async generators and httpx-style streams)."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


def estimate_tokens(text: str) -> int:
    """A rough token count for text (about four characters a token), used when a server sends none."""
    return _tokens_for_chars(len(text))


def _tokens_for_chars(chars: int) -> int:
    return math.ceil(chars / 4)


def _message_chars(message: ChatMessage) -> int:
    if isinstance(message, UserMessage):
        contents = message.contents
        if len(contents) == 1:  # the common case, without a generator
            only = contents[0]
            return len(only.text) if isinstance(only, TextContent) else 256
        return sum(len(c.text) if isinstance(c, TextContent) else 256 for c in contents)
    if isinstance(message, ToolResultMessage):
        return len(message.text) + 256 * len(message.images)  # (images a tool returned)
    if isinstance(message, SystemMessage):
        return len(message.text)
    size = len(message.text or "") + len(message.thinking or "")
    return size + sum(len(c.name) + len(c.arguments) for c in message.tool_calls)


_DELTA_CHARS: Final = 4
"""What a text or thinking delta counts at least, in characters (a token: servers stream about a
token a delta, so short deltas of code or CJK text are not a quarter of a token each)."""


def _delta_chars(deltas: list[str]) -> int:
    """The characters `deltas` count for the output estimate: each at least `_DELTA_CHARS`. The
    pipeline's meter (`_pipeline/_meter.py`) counts the same way, so a response stopped at an
    output-token limit reports usage past the limit, and one within it never is stopped."""
    total = 0
    for delta in deltas:
        size = len(delta)
        total += size if size > _DELTA_CHARS else _DELTA_CHARS
    return total


def _calls_chars(calls: tuple[ToolCall, ...]) -> int:
    return sum(len(call.name) + len(call.arguments) for call in calls)


class ResponseAccumulator:
    """Folds chunks into a `ModelResponse`. Used by `complete` and by the pipeline while it streams.

    Tool-call fragments are assembled by `index` in order of first appearance; usage reported several
    times is replaced by the latest report (providers send cumulative counts). Thinking is also kept
    as blocks, each closed by a chunk with a `signature`, for `AssistantMessage.thinking_blocks`.
    """

    __slots__ = (
        "_block_start",
        "_blocks",
        "_calls",
        "_finish",
        "_meta",
        "_refusal",
        "_signature",
        "_text",
        "_thinking",
        "_usage",
    )

    def __init__(self) -> None:
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._refusal: list[str] = []
        self._signature: str | None = None
        self._blocks: list[ThinkingBlock] = []
        self._block_start = 0
        self._calls: dict[int, list[Any]] = {}
        self._usage: Usage | None = None
        self._finish: Finish | None = None
        self._meta: ResponseMeta | None = None

    def add(self, chunk: ModelChunk) -> None:
        kind = type(chunk)
        if kind is TextDelta:
            self._text.append(chunk.text)  # type: ignore[union-attr]
        elif kind is ThinkingDelta:
            assert isinstance(chunk, ThinkingDelta)
            self._thinking.append(chunk.text)
            if chunk.signature is not None:
                self._signature = chunk.signature
                self._close_block(chunk)
        elif kind is ToolCallDelta:
            assert isinstance(chunk, ToolCallDelta)
            call = self._calls.get(chunk.index)
            if call is None:
                self._calls[chunk.index] = [chunk.id, chunk.name, [chunk.arguments]]
            else:
                if chunk.id and not call[0]:
                    call[0] = chunk.id
                if chunk.name and not call[1]:
                    call[1] = chunk.name
                call[2].append(chunk.arguments)
        elif kind is Usage:
            assert isinstance(chunk, Usage)
            self._usage = chunk
        elif kind is Finish:
            assert isinstance(chunk, Finish)
            self._finish = chunk
        elif kind is RefusalDelta:
            assert isinstance(chunk, RefusalDelta)
            self._refusal.append(chunk.text)
        elif kind is ResponseMeta:
            assert isinstance(chunk, ResponseMeta)
            self._meta = chunk
        else:
            raise TypeError(f"a chat model yielded {chunk!r}, which is not a model chunk")

    def _close_block(self, chunk: ThinkingDelta) -> None:
        """A signed (or redacted) block ends with `chunk`: keep it as the provider sent it."""
        pieces = self._thinking
        text = "" if chunk.redacted else "".join(pieces[self._block_start :])
        self._blocks.append(ThinkingBlock(text=text, signature=chunk.signature, redacted=chunk.redacted))
        self._block_start = len(pieces)

    def _thinking_blocks(self, thinking: str) -> tuple[ThinkingBlock, ...]:
        """The blocks, unless `thinking` and the one signature say all of it (the common case)."""
        blocks = self._blocks
        if not blocks:
            return ()
        if len(blocks) == 1 and not blocks[0].redacted and blocks[0].text == thinking:
            return ()
        return tuple(blocks)

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def started(self) -> bool:
        """Whether any chunk arrived."""
        return bool(
            self._text
            or self._thinking
            or self._refusal
            or self._calls
            or self._usage is not None
            or self._finish is not None
            or self._meta is not None
        )

    def text_from(self, start: int) -> tuple[str, int]:
        """The text from its `start`-th delta on, and the number of deltas so far."""
        pieces = self._text
        return "".join(pieces[start:]), len(pieces)

    def thinking_from(self, start: int) -> tuple[str, int]:
        """The thinking from its `start`-th delta on, and the number of deltas so far."""
        pieces = self._thinking
        count = len(pieces)
        if start >= count:  # none since (checked at every chunk of a `chunked` stream; most think none)
            return "", count
        return "".join(pieces[start:]), count

    def text_sink(self) -> Callable[[str], None]:
        """What `add` does with a `TextDelta`'s text, for a reader's per-token loop that dispatches
        on the chunk's type itself (it saves a method call per token)."""
        return self._text.append

    def build(self, request: ModelRequest, *, cut: bool = False) -> ModelResponse:
        """The response so far; usage is estimated (and marked so) when the model reported none.

        The estimate is about four characters a token, each text and thinking delta counting at least
        one token (as the pipeline's meter counts them). For a response `cut` short (a budget stopped
        it), reported output tokens are raised to the estimate where they are lower: a provider may
        have reported only early counts.
        """
        text = "".join(self._text)
        thinking = "".join(self._thinking)
        calls = (
            tuple(
                ToolCall(id=c[0] or f"call_{i}", name=c[1] or "", arguments="".join(c[2]))
                for i, c in enumerate(self._calls.values())
            )
            if self._calls
            else ()  # (most responses: no generator made for none)
        )
        refusal = self._refusal
        message = AssistantMessage(
            text=text or None,
            thinking=thinking or None,
            thinking_signature=self._signature,
            tool_calls=calls,
            refusal=("".join(refusal) or None) if refusal else None,
            thinking_blocks=self._thinking_blocks(thinking),
        )
        usage = self._usage
        if cut and usage is not None and self._finish is not None:
            cut = False  # it ran to its end (its finish came): the usage it reported is its own
        if usage is None or cut:
            estimate = Usage(
                input_tokens=_tokens_for_chars(request_text_chars(request.messages)),
                # Servers that stream send about one token a delta: never estimate fewer.
                # (one list item a delta: no counter on the per-token path)
                output_tokens=_tokens_for_chars(
                    _delta_chars(self._text) + _delta_chars(self._thinking) + _calls_chars(calls)
                ),
                estimated=True,
            )
            if usage is None:
                usage = estimate
            elif usage.output_tokens < estimate.output_tokens:
                # (reported input counts are exact from the start; output counts may be early ones)
                usage = dataclasses.replace(usage, output_tokens=estimate.output_tokens, estimated=True)
        finish = self._finish
        reason = finish.reason if finish is not None else None
        if reason is None and calls:
            reason = FinishReason.TOOL_CALLS
        meta = self._meta
        return ModelResponse(
            message=message,
            usage=usage,
            finish_reason=reason,
            id=meta.id if meta else None,
            model=meta.model if meta else None,
        )


async def complete(model: ChatModel, request: ModelRequest) -> ModelResponse:
    """One whole response: the fold of `model.stream(request)`. The stream is always closed."""
    accumulator = ResponseAccumulator()
    chunks = model.stream(request)
    try:
        async for chunk in chunks:
            accumulator.add(chunk)
    finally:
        await aclose_iterator(chunks)
    return accumulator.build(request)


def request_text_chars(messages: Sequence[ChatMessage]) -> int:
    """Characters of text in `messages` (attachments count as a fixed amount)."""
    return sum(map(_message_chars, messages))
