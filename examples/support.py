"""A small support service: the declaration style agentrt is built around.

`mypy --strict` checks this file and `demo.py` (see `make check`): calling a built service's methods
type-checks against the stubs below.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints

import agentrt
from agentrt import MemoryId, P, Result, TokenStream, system_message, tool, user_message


class Ticket(BaseModel):
    """A train ticket extracted from free text."""

    origin: str = Field(max_length=40)
    destination: str = Field(max_length=40)


class OrderTools:
    """Tools the support assistant may call."""

    def __init__(self) -> None:
        self.looked_up: list[str] = []

    @tool("Look up the shipping status of an order. Read-only.")
    async def order_status(
        self,
        # A length bound keeps a small model's constrained output from running on.
        order_id: Annotated[str, P("order number, e.g. SO-2026-0001"), StringConstraints(max_length=24)],
    ) -> str:
        self.looked_up.append(order_id)
        return f"Order {order_id} left the warehouse yesterday; delivery expected Friday."


@system_message("You are a concise support assistant for {{shop}}.")
class Support(agentrt.AiService):
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> Result[str]: ...

    @user_message("Extract the train ticket from: {{it}}")
    async def ticket(self, text: str) -> Result[Ticket]: ...

    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...
