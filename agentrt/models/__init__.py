"""Chat models: the protocol every adapter implements, the non-streaming fold, and the adapters.

`OpenAIChatModel` talks to OpenAI-compatible Chat Completions endpoints, `OllamaChatModel` to Ollama's
native `/api/chat`, `AnthropicChatModel` to Anthropic's Messages API; all share `RetryPolicy` and
report HTTP exchanges to listeners as `HttpRequestEvent`, `HttpResponseEvent` and `HttpErrorEvent`, and
take the same `ConnectionOptions` keywords (as do the embedding and moderation adapters).
"""

from __future__ import annotations

from .._events import (
    Finish,
    ModelChunk,
    ModelResponse,
    ResponseMeta,
    ToolCallDelta,
)
from ._base import ConnectionOptions
from ._http import HttpErrorEvent, HttpRequestEvent, HttpResponseEvent
from ._protocol import (
    JsonObjectFormat,
    JsonSchemaFormat,
    ResponseAccumulator,
    ResponseFormat,
    ToolChoice,
    ToolSpec,
    complete,
    estimate_tokens,
)
from ._retry import RetryPolicy
from .anthropic import AnthropicChatModel
from .ollama import OllamaChatModel
from .openai import OpenAIChatModel

__all__ = [
    "AnthropicChatModel",
    "ConnectionOptions",
    "Finish",
    "HttpErrorEvent",
    "HttpRequestEvent",
    "HttpResponseEvent",
    "JsonObjectFormat",
    "JsonSchemaFormat",
    "ModelChunk",
    "ModelResponse",
    "OllamaChatModel",
    "OpenAIChatModel",
    "ResponseAccumulator",
    "ResponseFormat",
    "ResponseMeta",
    "RetryPolicy",
    "ToolCallDelta",
    "ToolChoice",
    "ToolSpec",
    "anthropic",
    "complete",
    "estimate_tokens",
    "ollama",
    "openai",
]
