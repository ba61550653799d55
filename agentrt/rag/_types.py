"""The seams of retrieval: `Content` (what a retriever finds), `Query` (what it is asked), and the
protocols a user's retriever and embedding model implement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from .. import _events
from .._messages import ChatMessage

__all__ = ["Content", "EmbeddingModel", "Query", "Retriever"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Content:
    """A piece of text a retriever found: its `text`, the `metadata` of the document it came from
    (e.g. `{"source": "faq.md", "chunk": 3}`), and the retriever's `score` (higher is better; scales
    differ between retrievers, which is why results are fused by rank). `id` identifies the chunk
    across retrievers, so that fusion counts the same chunk found twice once."""

    text: str
    metadata: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    score: float | None = None
    id: str | None = None

    def key(self) -> str:
        """What makes two contents the same chunk: `id` when set, else the text."""
        return self.id if self.id is not None else self.text


# _events cannot import this module (agentrt.rag imports the pipeline); bind Content there, so that
# typing.get_type_hints(Result) resolves.
_events.Content = Content  # type: ignore[attr-defined]


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
