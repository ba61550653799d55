"""Query transformers that ask a chat model: a follow-up question made to stand alone, or a question
expanded into several phrasings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._errors import ConfigurationError
from .._messages import AssistantMessage, SystemMessage, UserMessage
from ..models._protocol import ModelRequest, ModelSettings, complete

if TYPE_CHECKING:
    from ..models._protocol import ChatModel
    from ._augment import QueryTransformer
    from ._types import Query

__all__ = ["compressing_transformer", "expanding_transformer"]

_COMPRESS: Final = (
    "Rewrite the user's last question so that it can be understood without the conversation: replace "
    "pronouns and references with what they refer to. Reply with the rewritten question only."
)
_EXPAND: Final = (
    "Write {n} different phrasings of the user's question for a search engine, one per line, with no "
    "numbering and nothing else."
)
_DEFAULT_SETTINGS: Final = ModelSettings(temperature=0.0, max_tokens=200)


def _transcript(query: Query) -> str:
    lines = []
    for message in query.history:
        if isinstance(message, UserMessage | AssistantMessage) and message.text:
            lines.append(f"{message.role}: {message.text}")
    lines.append(f"user: {query.text}")
    return "\n".join(lines)


def _check(model: object, where: str) -> None:
    if not callable(getattr(model, "stream", None)):
        raise ConfigurationError(f"{where}: {model!r} is not a ChatModel")


def compressing_transformer(
    model: ChatModel, *, instructions: str = _COMPRESS, settings: ModelSettings | None = None
) -> QueryTransformer:
    """A transformer that makes a follow-up ("and how much does it cost?") stand alone, by asking
    `model` with the conversation so far. Without history the query is used as it is (no request).

    Its requests are not part of the call's `Result.usage`, nor of its token budget; they run under
    the call's deadline like every stage before the model."""
    _check(model, "compressing_transformer")
    settings = settings or _DEFAULT_SETTINGS

    async def compress(query: Query) -> list[str]:
        if not query.history:
            return [query.text]
        request = ModelRequest(
            messages=(SystemMessage(text=instructions), UserMessage.of(_transcript(query))), settings=settings
        )
        text = ((await complete(model, request)).message.text or "").strip()
        return [text or query.text]

    return compress


def expanding_transformer(
    model: ChatModel, *, n: int = 3, instructions: str = _EXPAND, settings: ModelSettings | None = None
) -> QueryTransformer:
    """A transformer that runs the user's question and up to `n` other phrasings of it, written by
    `model` (one per line of its answer; blank and repeated lines dropped). Its requests are not part
    of the call's `Result.usage` (see `compressing_transformer`)."""
    _check(model, "expanding_transformer")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigurationError(f"expanding_transformer: n must be an int >= 1, got {n!r}")
    settings = settings or _DEFAULT_SETTINGS
    system = instructions.replace("{n}", str(n))

    async def expand(query: Query) -> list[str]:
        request = ModelRequest(
            messages=(SystemMessage(text=system), UserMessage.of(query.text)), settings=settings
        )
        text = (await complete(model, request)).message.text or ""
        queries = [query.text]
        for line in text.splitlines():
            line = line.strip().lstrip("-*• ").strip()
            if line and line not in queries:
                queries.append(line)
        return queries[: n + 1]

    return expand
