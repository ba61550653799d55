"""MCP tools and results in agentrt's terms (`agentrt.mcp`): whether a model provider would take a
tool's input schema, the check of a call's arguments, and a call's result as the loop's return value
or as text."""

from __future__ import annotations

import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from jsonschema import SchemaError  # type: ignore[import-untyped]
from jsonschema.validators import validator_for  # type: ignore[import-untyped]
from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
)
from referencing import Registry

from ._messages import ImageContent as _Image
from .tools._declare import ToolDefinition, schema_tool
from .tools._run import ToolReturn

if typing.TYPE_CHECKING:
    from jsonschema.protocols import Validator  # type: ignore[import-untyped]

    from ._mcp_server import _Approval
    from .mcp import MCPTool

_COMBINATORS: Final = ("anyOf", "oneOf", "allOf", "not", "enum", "const")


def tool_definition(
    info: MCPTool,
    schema: dict[str, Any],
    annotations: dict[str, Any],
    call: Callable[[dict[str, Any]], Awaitable[Any]],
    *,
    needs_approval: _Approval,
    timeout: float | None,
) -> ToolDefinition:
    """The definition of an MCP server's tool `info`: `call` with the arguments checked against its
    input `schema`; a destructive tool (`needs_approval="destructive"`) waits for approval."""
    approval = info.destructive if needs_approval == "destructive" else needs_approval
    validator = validator_for(schema)(schema, registry=Registry())
    return schema_tool(
        info.name,
        info.description,
        schema,
        call,
        check=check_arguments(validator),
        timeout=timeout,
        needs_approval=approval,
        annotations=annotations,
    )


def check_arguments(validator: Validator) -> Callable[[dict[str, Any]], None]:
    """`ValueError` saying where the arguments break the schema, without their values (a message
    may reach the model, and values may be data it should not see)."""

    def check(arguments: dict[str, Any]) -> None:
        problems = []
        for error in sorted(validator.iter_errors(arguments), key=lambda e: list(map(str, e.path)))[:5]:
            where = ".".join(map(str, error.absolute_path))
            if error.validator in ("required", "additionalProperties", "dependentRequired"):
                problem = error.message  # (names only)
            else:
                problem = f"does not match {{{error.validator!r}: {error.validator_value!r}}}"
            problems.append(f"{where}: {problem}" if where else problem)
        if problems:
            raise ValueError("; ".join(problems))

    return check


def schema_refusal(schema: Any) -> str | None:
    """Why a model provider would refuse `schema` as a tool's parameters, or `None`."""
    if not isinstance(schema, Mapping):
        return "its input schema is not a JSON object"
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        return f"its input schema is not a valid JSON Schema: {exc.message}"
    if schema.get("type") != "object":
        return 'its input schema must have "type": "object" at the top (model providers refuse others)'
    top = [key for key in _COMBINATORS if key in schema]
    if top:
        return f"its input schema has {', '.join(top)} at the top (model providers refuse that)"
    return None


_SENDABLE: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""The image types every provider agentrt speaks to takes. Others (SVG, TIFF, no type at all) are
named in the text: stored in a conversation, one would make each later request of it fail."""


def sendable(content: object) -> bool:
    return isinstance(content, ImageContent) and content.mime_type.lower() in _SENDABLE


def return_value(result: CallToolResult) -> Any:
    """What a successful call returns to the loop: its structured content when there is one, else
    its text; with the images it holds as a `ToolReturn` (they go to the model as images)."""
    images = tuple(
        _Image(data=content.data, media_type=content.mime_type.lower())
        for content in result.content
        if isinstance(content, ImageContent) and sendable(content)
    )
    if result.structured_content is not None:
        value: Any = result.structured_content
    else:
        value = as_text(result, images_apart=True) if result.content else None
    return ToolReturn(value, images) if images else value


def as_text(result: CallToolResult, *, images_apart: bool = False) -> str:
    """The contents of a result as text: text as is, embedded text resources by their text, and
    what a tool result message cannot carry (audio, binary resources; images unless they go apart)
    named."""
    parts = []
    for content in result.content:
        if isinstance(content, TextContent):
            parts.append(content.text)
        elif images_apart and sendable(content):
            continue
        elif isinstance(content, ImageContent | AudioContent):
            parts.append(f"[{content.type} {content.mime_type}, not shown]")
        elif isinstance(content, EmbeddedResource):
            resource = content.resource
            if isinstance(resource, BlobResourceContents):
                parts.append(f"[resource {resource.uri} ({resource.mime_type or 'binary'}), not shown]")
            else:
                parts.append(resource.text)
        elif isinstance(content, ResourceLink):
            parts.append(f"[resource {content.uri}]")
    return "\n".join(parts)
