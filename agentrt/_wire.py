"""The wire types: what a request to a model carries (`ModelRequest`, `ModelSettings`, tool specs,
response formats) and what retrieval injects into one (`Content`).

A leaf module (it imports only the messages), so that events, the model protocol and retrieval all
import these names from one place, none of them patching names into another.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from ._messages import ChatMessage

__all__ = [
    "Content",
    "JsonObjectFormat",
    "JsonSchemaFormat",
    "ModelRequest",
    "ModelSettings",
    "ResponseFormat",
    "ToolChoice",
    "ToolSpec",
]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """Request parameters. `None` means "the model's default"; `merge` lets later values win."""

    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def merge(self, other: ModelSettings | None) -> ModelSettings:
        """These settings overridden by every non-`None` field of `other`."""
        if other is None:
            return self
        changes = {
            f.name: getattr(other, f.name)
            for f in dataclasses.fields(other)
            if getattr(other, f.name) is not None
        }
        return dataclasses.replace(self, **changes) if changes else self


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the model sees it: name, description and a JSON schema for its arguments."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False


@dataclass(frozen=True, slots=True)
class JsonSchemaFormat:
    """Ask for JSON matching `schema` (structured output)."""

    name: str
    schema: Mapping[str, Any]
    strict: bool = False


@dataclass(frozen=True, slots=True)
class JsonObjectFormat:
    """Ask for any JSON object (JSON mode); `schema` is passed along where the server accepts one."""

    schema: Mapping[str, Any] | None = None


ResponseFormat = JsonSchemaFormat | JsonObjectFormat
ToolChoice = Literal["auto", "required", "none"] | str
"""`"auto"`, `"required"`, `"none"`, or the name of the one tool the model must call."""


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """Everything sent to the model for one response."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice | None = None
    response_format: ResponseFormat | None = None
    settings: ModelSettings | None = None
    deadline: float | None = field(default=None, compare=False)
    """When the response must be complete, on the async backend's clock (`anyio.current_time()`): set
    when the invocation has a time budget. Not sent to the provider."""


@dataclass(frozen=True, slots=True)
class Content:
    """A piece of text a retriever found: its `text`, the `metadata` of the document it came from
    (e.g. `{"source": "faq.md", "chunk": 3}`), and the retriever's `score` (higher is better; scales
    differ between retrievers, which is why results are fused by rank). `id` identifies the chunk
    across retrievers, so that fusion counts the same chunk found twice once."""

    text: str
    metadata: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    score: float | None = None
    id: str | None = None

    def key(self) -> str:
        """What makes two contents the same chunk: `id` when set, else the text."""
        return self.id if self.id is not None else self.text
