"""An agentrt `ModelRequest`'s parts in the Messages API's terms, for `agentrt.models.anthropic`:
the system text apart, messages as content blocks (tool calls as `tool_use` blocks, their results
as `tool_result` blocks of the next user message, thinking blocks sent back as they came), tools
and the tool choice, and the cache breakpoint on the last block."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import orjson

from .._errors import BadRequestError
from .._messages import (
    AssistantMessage,
    ImageContent,
    PdfContent,
    SystemMessage,
    TextContent,
    ToolResultMessage,
    UserMessage,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._messages import ChatMessage, ThinkingBlock, UserContent
    from ._protocol import ToolChoice, ToolSpec

EPHEMERAL: Final = {"type": "ephemeral"}


def thinking_enabled(setting: Any) -> bool:
    return isinstance(setting, dict) and setting.get("type", "enabled") != "disabled"


def wire_messages(messages: Sequence[ChatMessage], *, thinking: bool) -> tuple[str, list[dict[str, Any]]]:
    """The system text and the messages as content blocks. Messages of the same role in a row are
    merged into one (a turn's tool results must all be in the user message after the calls)."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            system.append(message.text)
            continue
        if isinstance(message, AssistantMessage):
            role, blocks = "assistant", _assistant_blocks(message, thinking=thinking)
        elif isinstance(message, ToolResultMessage):
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.text,
            }
            if message.images:  # a tool result's content may hold images: text first, then them
                text = [{"type": "text", "text": message.text}] if message.text else []
                result["content"] = [*text, *(_content_block(image) for image in message.images)]
            if message.is_error:
                result["is_error"] = True
            role, blocks = "user", [result]
        else:
            assert isinstance(message, UserMessage)
            role, blocks = "user", [_content_block(c) for c in message.contents]
        if not blocks:
            continue  # nothing the API accepts (an empty answer): the neighbours merge instead
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return "\n\n".join(system), out


def _content_block(content: UserContent) -> dict[str, Any]:
    if isinstance(content, TextContent):
        return {"type": "text", "text": content.text}
    if isinstance(content, ImageContent):
        return {"type": "image", "source": _source(content.url, content.data, content.media_type)}
    if isinstance(content, PdfContent):
        document: dict[str, Any] = {
            "type": "document",
            "source": _source(content.url, content.data, content.media_type or "application/pdf"),
        }
        if content.filename:
            document["title"] = content.filename
        return document
    raise BadRequestError(f"the Messages API takes no {content.kind} input")


def _source(url: str | None, data: str | None, media_type: str | None) -> dict[str, Any]:
    if url is not None:
        return {"type": "url", "url": url}
    return {"type": "base64", "media_type": media_type, "data": data}


def _assistant_blocks(message: AssistantMessage, *, thinking: bool) -> list[dict[str, Any]]:
    """Thinking first (the API wants it so), then text, then tool calls. Thinking is sent only when
    it is on, and only signed or redacted blocks: unsigned reasoning (another provider's) would be
    refused."""
    blocks = _thinking_blocks(message) if thinking else []
    text = message.text or (message.refusal if not message.tool_calls else None)
    if text and not text.isspace():  # the API refuses a text block of white space only
        blocks.append({"type": "text", "text": text})
    for call in message.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)})
    if blocks and blocks[-1]["type"] in ("thinking", "redacted_thinking"):
        return []  # the API refuses an assistant message that ends in thinking
    return blocks


def _thinking_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    if message.thinking_blocks:
        return [_thinking_block(b) for b in message.thinking_blocks if b.signature is not None]
    if message.thinking_signature is not None:
        return [
            {"type": "thinking", "thinking": message.thinking or "", "signature": message.thinking_signature}
        ]
    return []


def _thinking_block(block: ThinkingBlock) -> dict[str, Any]:
    if block.redacted:
        return {"type": "redacted_thinking", "data": block.signature}
    return {"type": "thinking", "thinking": block.text, "signature": block.signature}


def _input(arguments: str) -> Any:
    """A call's arguments as the JSON object `tool_use.input` must be (arguments cut short by
    `max_tokens`, or not an object, are sent as `{}`: the call already failed, its result says so)."""
    try:
        value = orjson.loads(arguments) if arguments.strip() else {}
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def mark_last_block(message: dict[str, Any]) -> None:
    last = message["content"][-1]
    message["content"][-1] = {**last, "cache_control": EPHEMERAL}


def compact(message: dict[str, Any]) -> dict[str, Any]:
    """A user message of one plain text block as a string (what most clients send)."""
    content = message["content"]
    if message["role"] == "user" and len(content) == 1:
        only = content[0]
        if only["type"] == "text" and len(only) == 2:
            return {"role": "user", "content": only["text"]}
    return message


def wire_tool(spec: ToolSpec) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": spec.name}
    if spec.description:
        tool["description"] = spec.description
    tool["input_schema"] = dict(spec.parameters)
    return tool


def wire_tool_choice(choice: ToolChoice | None, parallel: bool | None) -> dict[str, Any] | None:
    if choice is None and parallel is not False:
        return None
    if choice is None or choice == "auto":
        result: dict[str, Any] = {"type": "auto"}
    elif choice == "required":
        result = {"type": "any"}
    elif choice == "none":
        return {"type": "none"}
    else:
        result = {"type": "tool", "name": choice}
    if parallel is False:
        result["disable_parallel_tool_use"] = True
    return result
