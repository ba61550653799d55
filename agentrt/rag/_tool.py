"""Retrieval as a tool: the model searches when it decides to, instead of before every call."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from .._errors import ConfigurationError
from ..tools._declare import Description, ToolContext, tool
from ._augment import _maybe, _Source
from ._types import Content, Query

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["retriever_tool"]

_DESCRIPTION = (
    "Search the documents for passages relevant to a query. Returns the best passages, most relevant "
    "first. Use it when the answer may be in the documents."
)


def retriever_tool(
    retriever: object,
    *,
    name: str = "search_documents",
    description: str = _DESCRIPTION,
    max_results: int = 5,
    metadata: Sequence[str] = (),
    timeout: float | None = None,
) -> Callable[..., Any]:
    """A tool (for `build(tools=[...])`) that runs `retriever` on the model's query and returns the
    first `max_results` contents as numbered passages, with the `metadata` keys named after each.

    The query the retriever sees carries the call's memory id and method (its history is empty: a
    tool does not see the conversation). A retriever that fails makes the tool fail, which the
    build's tool failure policy handles like any tool's (`ToolSettings`)."""
    source = _Source(retriever, "retriever_tool")
    if isinstance(max_results, bool) or not isinstance(max_results, int) or max_results < 1:
        raise ConfigurationError(f"retriever_tool: max_results must be an int >= 1, got {max_results!r}")
    keys = tuple(metadata)

    async def search(
        query: Annotated[str, Description("what to search for: a question or key words")],
        context: ToolContext,
    ) -> str:
        found = await _maybe(source.call(Query(query, (), context.memory_id, context.method)))
        contents = [c for c in found if isinstance(c, Content)][:max_results]
        if not contents:
            return "No relevant passages were found."
        parts = []
        for number, content in enumerate(contents, start=1):
            lines = [f"[{number}] {content.text}"]
            lines.extend(f"{key}: {content.metadata[key]}" for key in keys if key in content.metadata)
            parts.append("\n".join(lines))
        return "\n\n".join(parts)

    search.__name__ = search.__qualname__ = name
    return tool(description, name=name, timeout=timeout)(search)
