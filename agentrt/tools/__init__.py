"""Tools: declare them with `@tool`, pass them to `build(..., tools=[...])`.

class OrderTools:
    @tool("Look up the shipping status of an order. Read-only.")
    async def order_status(self, order_id: Annotated[str, Description("order number, e.g. SO-1")]) -> str:
        ...
"""

from __future__ import annotations

from ._declare import Description, ToolContext, tool
from ._run import FailurePolicy, LoopLimit, ToolFailure, ToolReturn, ToolSettings

__all__ = [
    "Description",
    "FailurePolicy",
    "LoopLimit",
    "ToolContext",
    "ToolFailure",
    "ToolReturn",
    "ToolSettings",
    "tool",
]
