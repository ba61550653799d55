"""The seams of retrieval: `Content` (what a retriever finds), `Query` (what it is asked), and the
protocols a user's retriever and embedding model implement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .._messages import ChatMessage
from .._wire import Content

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Content", "EmbeddingModel", "Query", "Retriever"]


@dataclass(frozen=True, slots=True)
class Query:
    """What retrieval is asked: the `text` to search for, with the call it serves (the
    conversation's `history` as sent to the model, its `memory_id`, the `method`'s qualified name).
    A query transformer returns new queries with other text and the same context."""

    text: str
    history: tuple[ChatMessage, ...] = ()
    memory_id: Any = None
    method: str = ""

    def with_text(self, text: str) -> Query:
        return Query(text, self.history, self.memory_id, self.method)


@runtime_checkable
class Retriever(Protocol):
    """Finds contents for a query. `retrieve` may be cancelled at any await (the call's deadline, the
    caller's cancellation) and must then leave nothing running; an exception it raises becomes a
    `RetrievalError` (or, where the retrieval's policy says so, the call goes on without it)."""

    async def retrieve(self, query: Query) -> Sequence[Content]: ...


@runtime_checkable
class EmbeddingModel(Protocol):
    """Turns texts into vectors, one per text, in order. Adapters batch large inputs and raise the
    chat adapters' `ModelError` kinds (`RateLimitError`, `ModelConnectionError`, ...)."""

    @property
    def name(self) -> str: ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...
