"""Chat models: the protocol every adapter implements, and the non-streaming fold."""

from __future__ import annotations

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
from ._protocol import (
    Capabilities,
    ChatModel,
    JsonObjectFormat,
    JsonSchemaFormat,
    ModelRequest,
    ModelSettings,
    ResponseAccumulator,
    ResponseFormat,
    ToolChoice,
    ToolSpec,
    complete,
    estimate_tokens,
)

__all__ = [
    "Capabilities",
    "ChatModel",
    "Finish",
    "FinishReason",
    "JsonObjectFormat",
    "JsonSchemaFormat",
    "ModelChunk",
    "ModelRequest",
    "ModelResponse",
    "ModelSettings",
    "RefusalDelta",
    "ResponseAccumulator",
    "ResponseFormat",
    "ResponseMeta",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallDelta",
    "ToolChoice",
    "ToolSpec",
    "Usage",
    "complete",
    "estimate_tokens",
]
