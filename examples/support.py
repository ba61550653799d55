"""A small support service: the declaration style agentrt is built around.

`mypy --strict` checks this file and `demo.py` (see `make check`): calling a built service's methods
type-checks against the stubs below.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel

import agentrt
from agentrt import MemoryId, Result, TokenStream, system_message, user_message


class Ticket(BaseModel):
    """A train ticket extracted from free text."""

    origin: str
    destination: str


@system_message("You are a concise support assistant for {{shop}}.")
class Support(agentrt.AiService):
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...

    async def chat_result(self, conversation: Annotated[str, MemoryId], question: str) -> Result[str]: ...

    @user_message("Extract the train ticket from: {{it}}")
    async def ticket(self, text: str) -> Ticket: ...

    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...
