"""agentrt's lifecycle events, results and messages as the attributes of OpenTelemetry's GenAI
semantic conventions, for `agentrt.otel` (which holds the spans and the metrics). Content (prompts,
answers, guardrail messages, retrieved text) only with `capture_content`."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final

import orjson

from ._messages import AssistantMessage, SystemMessage, TextContent, ToolResultMessage, UserMessage

if TYPE_CHECKING:
    from ._events import GuardrailVerdict, ModelResponse, Result, Retrieved, Usage
    from ._messages import ChatMessage
    from .rag import Content

# The conventions' output-message finish reasons, where agentrt's differ.
OUTPUT_FINISH: Final = {"tool_calls": "tool_call"}

Attributes = dict[str, Any]


def result_attributes(result: Result[Any], capture_content: bool) -> Attributes:
    """An invocation's result, on its span."""
    attributes: Attributes = {"agentrt.attempts": result.attempts}
    if result.model:
        attributes["gen_ai.response.model"] = result.model
    if result.finish_reason is not None:
        attributes["gen_ai.response.finish_reasons"] = (result.finish_reason.value,)
    attributes.update(usage_attributes(result.usage))
    if capture_content:
        reason = result.finish_reason.value if result.finish_reason is not None else "stop"
        output = {
            "role": "assistant",
            "parts": [{"type": "text", "content": result.text}],
            "finish_reason": OUTPUT_FINISH.get(reason, reason),
        }
        attributes["gen_ai.output.messages"] = to_json([output])
    return attributes


def response_attributes(response: ModelResponse, capture_content: bool) -> Attributes:
    """A model response, on its request's span."""
    attributes: Attributes = {}
    if response.id:
        attributes["gen_ai.response.id"] = response.id
    if response.model:
        attributes["gen_ai.response.model"] = response.model
    if response.finish_reason is not None:
        attributes["gen_ai.response.finish_reasons"] = (response.finish_reason.value,)
    attributes.update(usage_attributes(response.usage))
    if capture_content:
        attributes["gen_ai.output.messages"] = to_json([output_message(response)])
    return attributes


def guardrail_attributes(event: GuardrailVerdict, capture_content: bool) -> Attributes:
    """A guardrail's verdict, as the event on the invocation span."""
    attributes: Attributes = {
        "gen_ai.guardrail.component.name": event.guardrail,
        "gen_ai.guardrail.source": event.kind,
        "gen_ai.guardrail.result.type": "verdict",
        "gen_ai.guardrail.result.value": event.verdict,
        "agentrt.guardrail.attempt": event.attempt,
        "agentrt.guardrail.partial": event.partial,
        "agentrt.guardrail.seconds": event.seconds,
    }
    if capture_content and event.message is not None:
        attributes["agentrt.guardrail.message"] = event.message  # may quote the checked text
    return attributes


def retrieval_attributes(event: Retrieved, capture_content: bool) -> Attributes:
    """A retrieval, as the event on the invocation span."""
    attributes: Attributes = {
        "gen_ai.operation.name": "retrieval",
        "agentrt.retrieval.count": len(event.contents),
    }
    skipped = [getattr(s, "retriever", None) for s in event.skipped]
    if skipped:  # the retrievers' names (configuration, not content)
        attributes["agentrt.retrieval.skipped"] = tuple(str(name) for name in skipped)
    if capture_content:
        attributes["gen_ai.retrieval.query.text"] = "\n".join(event.queries)
        attributes["gen_ai.retrieval.documents"] = to_json([document(c) for c in event.contents])
    return attributes


def usage_attributes(usage: Usage) -> Attributes:
    """Token counts as the conventions name them, when the provider reported them."""
    if usage.estimated:
        return {"agentrt.usage.estimated": True}
    attributes: Attributes = {
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
    }
    if usage.cached_input_tokens:
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached_input_tokens
    if usage.reasoning_tokens:
        attributes["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens
    return attributes


def error_type(error: BaseException) -> str:
    return type(error).__qualname__


def qualified(error: BaseException) -> str:
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def to_json(value: object) -> str:
    return orjson.dumps(value, default=str).decode()


def input_message(message: ChatMessage) -> dict[str, Any]:
    """A message in the conventions' input-message form (role and parts)."""
    if isinstance(message, SystemMessage):
        return {"role": "system", "parts": [{"type": "text", "content": message.text}]}
    if isinstance(message, UserMessage):
        parts: list[dict[str, Any]] = []
        for content in message.contents:
            if isinstance(content, TextContent):
                parts.append({"type": "text", "content": content.text})
            elif content.url is not None:
                parts.append({"type": "uri", "modality": content.kind, "mime_type": content.media_type,
                              "uri": content.url})  # fmt: skip
            else:
                parts.append({"type": "blob", "modality": content.kind, "mime_type": content.media_type,
                              "content": content.data})  # fmt: skip
        return {"role": "user", "parts": parts}
    if isinstance(message, ToolResultMessage):
        part = {"type": "tool_call_response", "id": message.tool_call_id, "response": message.text}
        return {"role": "tool", "parts": [part]}
    return {"role": "assistant", "parts": assistant_parts(message)}


def assistant_parts(message: AssistantMessage) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if message.thinking:
        parts.append({"type": "reasoning", "content": message.thinking})
    if message.text:
        parts.append({"type": "text", "content": message.text})
    if message.refusal:
        parts.append({"type": "refusal", "content": message.refusal})
    for call in message.tool_calls:
        try:
            arguments: Any = call.parsed_arguments()
        except ValueError:
            arguments = call.arguments
        parts.append({"type": "tool_call", "id": call.id, "name": call.name, "arguments": arguments})
    return parts


def output_message(response: ModelResponse) -> dict[str, Any]:
    reason = response.finish_reason.value if response.finish_reason is not None else "stop"
    return {
        "role": "assistant",
        "parts": assistant_parts(response.message),
        "finish_reason": OUTPUT_FINISH.get(reason, reason),
    }


def document(content: Content) -> dict[str, Any]:
    """A retrieved content as the conventions' retrieval document (id and score, then the rest)."""
    document: dict[str, Any] = {"id": content.id, "score": content.score, "content": content.text}
    if content.metadata:
        document["metadata"] = dict(content.metadata)
    return document


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
