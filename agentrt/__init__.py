"""agentrt: declarative async LLM services on one streaming event pipeline.

Declare a class of `async def` stubs, `build` it with a model, and await, stream or serve its methods.
"""

from __future__ import annotations

from . import models, output, testing, tools
from ._errors import (
    AgentError,
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    ContentRefusedError,
    ContextLengthExceededError,
    ModelConnectionError,
    ModelError,
    ModelNotFoundError,
    ModelResponseError,
    ModelTimeoutError,
    OutputParsingError,
    OverloadedError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
    ToolArgumentsError,
    ToolError,
    ToolExecutionError,
    ToolLoopLimitError,
    ToolTimeoutError,
    UnknownToolError,
)
from ._events import (
    Cancelled,
    Completed,
    Event,
    Failed,
    FinishReason,
    LifecycleEvent,
    RefusalDelta,
    RequestIssued,
    ResponseReceived,
    Result,
    Started,
    TextDelta,
    ThinkingDelta,
    ToolCallRequested,
    ToolExecuted,
    ToolExecution,
    ToolOutcome,
    Usage,
)
from ._invocation import Listener, SystemMessageProvider, ToolProvider, ToolRequest
from ._messages import (
    AssistantMessage,
    AudioContent,
    ChatMessage,
    ImageContent,
    PdfContent,
    SystemMessage,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserContent,
    UserMessage,
    VideoContent,
    messages_from_json,
    messages_to_json,
)
from ._service import build, create
from ._spec import AiService, MemoryId, V, system_message, user_message
from ._stream import TokenStream
from .models import Capabilities, ChatModel, ModelRequest, ModelSettings
from .tools import LoopLimit, P, ToolContext, ToolSettings, tool

__version__ = "0.1.0.dev0"

__all__ = [
    "AgentError",
    "AiService",
    "AssistantMessage",
    "AudioContent",
    "AuthenticationError",
    "BadRequestError",
    "Cancelled",
    "Capabilities",
    "ChatMessage",
    "ChatModel",
    "Completed",
    "ConfigurationError",
    "ContentRefusedError",
    "ContextLengthExceededError",
    "Event",
    "Failed",
    "FinishReason",
    "ImageContent",
    "LifecycleEvent",
    "Listener",
    "LoopLimit",
    "MemoryId",
    "ModelConnectionError",
    "ModelError",
    "ModelNotFoundError",
    "ModelRequest",
    "ModelResponseError",
    "ModelSettings",
    "ModelTimeoutError",
    "OutputParsingError",
    "OverloadedError",
    "P",
    "PdfContent",
    "PermissionDeniedError",
    "RateLimitError",
    "RefusalDelta",
    "RequestIssued",
    "ResponseReceived",
    "Result",
    "ServerError",
    "Started",
    "SystemMessage",
    "SystemMessageProvider",
    "TextContent",
    "TextDelta",
    "ThinkingDelta",
    "TokenStream",
    "ToolArgumentsError",
    "ToolCall",
    "ToolCallRequested",
    "ToolContext",
    "ToolError",
    "ToolExecuted",
    "ToolExecution",
    "ToolExecutionError",
    "ToolLoopLimitError",
    "ToolOutcome",
    "ToolProvider",
    "ToolRequest",
    "ToolResultMessage",
    "ToolSettings",
    "ToolTimeoutError",
    "UnknownToolError",
    "Usage",
    "UserContent",
    "UserMessage",
    "V",
    "VideoContent",
    "build",
    "create",
    "local",
    "messages_from_json",
    "messages_to_json",
    "models",
    "output",
    "system_message",
    "testing",
    "tool",
    "tools",
    "user_message",
]


def __getattr__(name: str) -> object:
    # `agentrt.local` (the local model server) is imported on first use: `python -m agentrt.local`
    # must not find it imported already, and most programs never need it.
    if name == "local":
        import importlib

        return importlib.import_module("agentrt.local")
    raise AttributeError(f"module 'agentrt' has no attribute {name!r}")
