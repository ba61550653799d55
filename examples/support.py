"""A small support service: the declaration style agentrt is built around.

`mypy --strict` checks this file and `demo.py` (see `make check`): calling a built service's methods
type-checks against the stubs below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, Field, StringConstraints

from agentrt import Description, MemoryId, Result, TokenStream, system_message, tool, user_message
from agentrt.moderation import Moderation, moderate

if TYPE_CHECKING:
    from collections.abc import Sequence


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
        order_id: Annotated[
            str, Description("order number, e.g. SO-2026-0001"), StringConstraints(max_length=24)
        ],
    ) -> str:
        self.looked_up.append(order_id)
        return f"Order {order_id} left the warehouse yesterday; delivery expected Friday."


@system_message("You are a concise support assistant for {{shop}}.")
class Support:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> Result[str]: ...

    @user_message("Extract the train ticket from: {{it}}")
    async def ticket(self, text: str) -> Result[Ticket]: ...

    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


# The passenger handbook the support service answers from (retrieval, `make demo` step 5).
HANDBOOK = {
    "refunds.md": "Flexible tickets can be refunded in full up to 24 hours before departure. Saver "
    "tickets cannot be refunded, but they can be exchanged once for a fee of 12 euros.",
    "bicycles.md": "Bicycles can be taken on regional trains outside the morning rush hour for a flat "
    "bicycle ticket of 5 euros. On intercity trains a bicycle space must be reserved in advance.",
    "pets.md": "Small pets in a closed carrier travel free. Dogs on a lead travel at half the adult "
    "fare and must wear a muzzle on night trains.",
    "wifi.md": "All intercity trains have free Wi-Fi: connect to the network called AcmeNet and accept "
    "the terms on the welcome page.",
}


class WordListModeration:
    """A moderation model for the demo: flags texts with a listed word. A real service would use
    `agentrt.moderation.OpenAIModerationModel` against an OpenAI-compatible `/v1/moderations`."""

    name = "word-list"

    def __init__(self, *words: str) -> None:
        self.words = words

    async def moderate(self, texts: Sequence[str]) -> list[Moderation]:
        verdicts = []
        for text in texts:
            hit = any(word in text.lower() for word in self.words)
            verdicts.append(Moderation(hit, {"violence": hit}, {"violence": 1.0 if hit else 0.0}, self.name))
        return verdicts


@moderate
@system_message("You are a concise support assistant for {{shop}}.")
class ModeratedSupport:
    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...
