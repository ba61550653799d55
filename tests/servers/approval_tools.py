"""The tools and service the approval tests over SSE share (the ASGI tests, the Node clients' server
`approval_app.py`): a refund that waits for approval, a lookup that does not, each recording its calls."""

from __future__ import annotations

from typing import Annotated

from agentrt import MemoryId, TokenStream, tool


class Shop:
    def __init__(self) -> None:
        self.refunds: list[tuple[str, float]] = []
        self.looks: list[str] = []

    @tool("Refund an order.", needs_approval=True)
    def refund(self, order: str, amount: float = 1.0) -> str:
        self.refunds.append((order, amount))
        return f"refunded {amount} on {order}"

    @tool("Look up an order.")
    def look(self, order: str) -> str:
        self.looks.append(order)
        return f"{order}: shipped"


class Desk:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...
