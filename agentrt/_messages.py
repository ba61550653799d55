"""Chat messages and their contents: one pydantic discriminated union, one JSON round trip.

Messages are immutable values. `ChatMessage` is discriminated by `role`, user contents by `kind`; the
same shapes are what memory stores persist and what model adapters translate to their wire formats.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "AssistantMessage",
    "AudioContent",
    "ChatMessage",
    "ImageContent",
    "PdfContent",
    "SystemMessage",
    "TextContent",
    "ThinkingBlock",
    "ToolCall",
    "ToolResultMessage",
    "UserContent",
    "UserMessage",
    "VideoContent",
    "message_from_json",
    "message_to_json",
    "messages_from_json",
    "messages_to_json",
]


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TextContent(_Value):
    """A piece of text in a user message."""

    kind: Literal["text"] = "text"
    text: str


class _MediaContent(_Value):
    """Media given either by `url` or inline as base64 `data` with its `media_type`."""

    url: str | None = None
    data: str | None = None
    media_type: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.url is None) == (self.data is None):
            raise ValueError(f"{type(self).__name__} needs exactly one of `url` or `data`")
        if self.data is not None and not self.media_type:
            raise ValueError(f"{type(self).__name__} with inline `data` needs a `media_type`")
        return self

    @classmethod
    def from_bytes(cls, data: bytes, media_type: str, **fields: Any) -> Self:
        """Inline content from raw bytes (stored base64-encoded)."""
        return cls(data=base64.b64encode(data).decode("ascii"), media_type=media_type, **fields)

    @classmethod
    def from_url(cls, url: str, **fields: Any) -> Self:
        """Content the model fetches (or the adapter inlines) from `url`."""
        return cls(url=url, **fields)

    def data_url(self) -> str:
        """The content as a URL: `url` itself, or a `data:` URL built from the inline bytes."""
        if self.url is not None:
            return self.url
        return f"data:{self.media_type};base64,{self.data}"


class ImageContent(_MediaContent):
    """An image; `detail` is a hint some providers honour."""

    kind: Literal["image"] = "image"
    detail: Literal["auto", "low", "high"] | None = None


class AudioContent(_MediaContent):
    """An audio clip (e.g. `audio/wav`, `audio/mpeg`)."""

    kind: Literal["audio"] = "audio"


class VideoContent(_MediaContent):
    """A video clip."""

    kind: Literal["video"] = "video"


class PdfContent(_MediaContent):
    """A PDF document; `filename` is passed to providers that want one."""

    kind: Literal["pdf"] = "pdf"
    media_type: str | None = "application/pdf"
    filename: str | None = None


UserContent = Annotated[
    TextContent | ImageContent | AudioContent | VideoContent | PdfContent,
    Field(discriminator="kind"),
]
"""One content of a user message."""

CONTENT_TYPES: tuple[type[_Value], ...] = (
    TextContent,
    ImageContent,
    AudioContent,
    VideoContent,
    PdfContent,
)


class SystemMessage(_Value):
    """Instructions to the model."""

    role: Literal["system"] = "system"
    text: str


class UserMessage(_Value):
    """What the user says: text and attached contents, in order."""

    role: Literal["user"] = "user"
    contents: tuple[UserContent, ...]
    name: str | None = None

    @classmethod
    def of(cls, *parts: str | UserContent) -> UserMessage:
        """A message from strings (each becomes a `TextContent`) and contents, in order."""
        return cls(contents=tuple(TextContent(text=p) if isinstance(p, str) else p for p in parts))

    @property
    def text(self) -> str:
        """The text contents joined by newlines (attachments are not included)."""
        return "\n".join(c.text for c in self.contents if isinstance(c, TextContent))


class ToolCall(_Value):
    """A tool call requested by the model. `arguments` is the JSON text the model produced."""

    id: str
    name: str
    arguments: str = "{}"

    def parsed_arguments(self) -> Any:
        """The arguments decoded from JSON (an empty text decodes as `{}`)."""
        return orjson.loads(self.arguments) if self.arguments.strip() else {}


class ThinkingBlock(_Value):
    """One block of a model's reasoning, kept as the provider sent it so that it can go back unchanged.

    `signature` is the provider's seal on `text` (Anthropic checks it when the block is sent back). A
    `redacted` block's reasoning was encrypted by the provider: its `text` is empty and `signature`
    holds the encrypted data.
    """

    text: str = ""
    signature: str | None = None
    redacted: bool = False


def _no_blocks(blocks: tuple[ThinkingBlock, ...]) -> bool:
    return not blocks


class AssistantMessage(_Value):
    """What the model answered: text, optional thinking text, tool calls, or a refusal.

    `thinking` is the reasoning text, `thinking_signature` the signature of its (single) signed block.
    `thinking_blocks` is set only when that pair cannot describe the reasoning: several signed blocks,
    or redacted ones (Anthropic); providers that check signatures need each block back as it was. It is
    left out of the JSON when empty, so messages stored before it existed read and write unchanged.
    """

    role: Literal["assistant"] = "assistant"
    text: str | None = None
    thinking: str | None = None
    thinking_signature: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    refusal: str | None = None
    thinking_blocks: tuple[ThinkingBlock, ...] = Field(default=(), exclude_if=_no_blocks)


def _no_images(images: tuple[ImageContent, ...]) -> bool:
    return not images


class ToolResultMessage(_Value):
    """The result of one tool call, sent back to the model.

    `images` are images the tool returned (`ToolReturn`, an MCP tool's image content): adapters whose
    API takes images in tool results send them there (Anthropic), others in a user message right
    after the round's results when the model takes image input (OpenAI-compatible), else they are
    named in the text. Left out of the JSON when empty.
    """

    role: Literal["tool"] = "tool"
    tool_call_id: str
    tool_name: str
    text: str
    is_error: bool = False
    images: tuple[ImageContent, ...] = Field(default=(), exclude_if=_no_images)


ChatMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolResultMessage,
    Field(discriminator="role"),
]
"""Any message of a conversation."""

_MESSAGES: TypeAdapter[list[ChatMessage]] = TypeAdapter(list[ChatMessage])


def _dumps(value: Any) -> bytes:
    """JSON bytes. Text a model produced may hold a lone surrogate (a `\\ud800` escape in its JSON),
    which is not UTF-8: such text is written as a `\\u` escape, as the model sent it."""
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        if "surrogates" not in str(exc):
            raise
        return json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode()


def _loads(data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        # orjson refuses a `\\ud800` escape without its pair; the standard library reads it. Any other
        # bad input (not UTF-8, not JSON) is reported as orjson reported it.
        try:
            return json.loads(data.decode() if isinstance(data, bytes) else data)
        except ValueError:
            raise exc from None


def messages_to_json(messages: Iterable[ChatMessage]) -> bytes:
    """Serialize messages to JSON bytes (the format memory stores persist)."""
    return _dumps(_MESSAGES.dump_python(list(messages), mode="json"))


def messages_from_json(data: bytes | str) -> list[ChatMessage]:
    """Parse what `messages_to_json` produced; raises `pydantic.ValidationError` on bad input."""
    return _MESSAGES.validate_python(_loads(data))


_MESSAGE: TypeAdapter[ChatMessage] = TypeAdapter(ChatMessage)


def message_to_json(message: ChatMessage) -> bytes:
    """Serialize one message to JSON bytes (for stores that keep one item per message)."""
    return _dumps(_MESSAGE.dump_python(message, mode="json"))


def message_from_json(data: bytes | str) -> ChatMessage:
    """Parse what `message_to_json` produced; raises `pydantic.ValidationError` on bad input."""
    return _MESSAGE.validate_python(_loads(data))
