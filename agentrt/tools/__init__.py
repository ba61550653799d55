"""Tools: declare them with `agentrt.tool`, pass them to `build(..., tools=[...])`; what a failing
tool does is a `FailurePolicy` (in `agentrt.ToolSettings`).

class OrderTools:
    @agentrt.tool("Look up the shipping status of an order. Read-only.")
    async def order_status(self, order_id: Annotated[str, agentrt.Description("e.g. SO-1")]) -> str:
        ...
"""

from __future__ import annotations

from ._run import FailurePolicy, ToolFailure

__all__ = [
    "FailurePolicy",
    "ToolFailure",
]
