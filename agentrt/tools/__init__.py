"""Tools: declare them with `@tool`, pass them to `build(..., tools=[...])`.

class OrderTools:
    @tool("Look up the shipping status of an order. Read-only.")
    async def order_status(self, order_id: Annotated[str, P("order number, e.g. SO-1")]) -> str:
        ...
"""

from __future__ import annotations

from ._declare import P, ToolContext, ToolDefinition, collect_tools, define_tool, tool
from ._run import (
    FailurePolicy,
    LoopLimit,
    ToolFailure,
    ToolLoop,
    ToolSettings,
    arguments_hash,
    result_text,
)

__all__ = [
    "FailurePolicy",
    "LoopLimit",
    "P",
    "ToolContext",
    "ToolDefinition",
    "ToolFailure",
    "ToolLoop",
    "ToolSettings",
    "arguments_hash",
    "collect_tools",
    "define_tool",
    "result_text",
    "tool",
]
