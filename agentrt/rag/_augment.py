"""Retrieval augmentation: what a call retrieves before the model is asked, and how the contents
reach the model.

    query ── transformer ──> queries ── router ──> (query, retriever) pairs, run concurrently
          ── aggregator (reciprocal-rank fusion) ──> contents[:max_results] ── injector ──> message

A `Retrieval` is declared at `build(retrieval=...)` or per method or class with `@retrieval(...)`.
The pipeline runs it after the input guardrails; the augmented message goes to the model only, and
memory stores the user's own message.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import anyio

from .._errors import ConfigurationError, RetrievalError
from .._messages import TextContent, UserMessage
from .._templates import Template
from ._types import Content, Query

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "DEFAULT_TEMPLATE",
    "RETRIEVAL_ATTR",
    "Aggregator",
    "Injector",
    "QueryTransformer",
    "Retrieval",
    "Router",
    "Skipped",
    "inject",
    "reciprocal_rank_fusion",
    "retrieval",
    "run",
]

_T = TypeVar("_T")

RETRIEVAL_ATTR: Final = "__agentrt_retrieval__"

DEFAULT_TEMPLATE: Final = "{{message}}\n\nAnswer using the following information:\n{{contents}}"
"""The default injection: the user's text, then the contents, one after the other."""

QueryTransformer = Callable[[Query], "Sequence[Query | str] | Awaitable[Sequence[Query | str]]"]
"""Turns the call's query into the queries to run (e.g. the question rewritten with the conversation
so far, or expanded into several); may be async. No queries: nothing is retrieved."""

Router = Callable[[Query], "Sequence[object] | Awaitable[Sequence[object]]"]
"""Chooses the retrievers for one query (from `Retrieval.retrievers` or any others); may be async."""

Aggregator = Callable[[Sequence[Sequence[Content]]], Sequence[Content]]
"""Merges the ranked lists of every (query, retriever) pair into one ranked list."""

Injector = Callable[[UserMessage, Sequence[Content]], UserMessage]
"""Makes the message the model sees from the user's message and the contents."""


def reciprocal_rank_fusion(results: Sequence[Sequence[Content]], k: int = 60) -> list[Content]:
    """Reciprocal-rank fusion (Cormack et al., 2009): each list gives its item at rank r (from 1) a
    score of 1 / (k + r); an item found by several lists (the same `Content.key()`) adds its scores.
    Ties keep the order of first appearance. Scores of different retrievers are not comparable;
    ranks are, which is why this is the default.

    The fused contents keep their own fields; `score` is replaced by the fused score. A single list
    (one query, one retriever) is returned as it is, its retriever's scores kept (repeats dropped)."""
    if len(results) == 1:
        kept: dict[str, Content] = {}
        for content in results[0]:
            kept.setdefault(content.key(), content)
        return list(kept.values())
    fused: dict[str, float] = {}
    first: dict[str, Content] = {}
    for ranked in results:
        for rank, content in enumerate(ranked, start=1):
            key = content.key()
            fused[key] = fused.get(key, 0.0) + 1.0 / (k + rank)
            first.setdefault(key, content)
    order = sorted(fused, key=fused.__getitem__, reverse=True)  # stable: ties keep first appearance
    return [_rescored(first[key], fused[key]) for key in order]


def _rescored(content: Content, score: float) -> Content:
    return Content(content.text, content.metadata, score, content.id)


def inject(
    template: str = DEFAULT_TEMPLATE, *, metadata: Sequence[str] = (), separator: str = "\n\n"
) -> Injector:
    """An injector from a template of `{{message}}` (the user's text) and `{{contents}}` (the
    contents' texts, joined by `separator`); `metadata` names metadata keys written after each
    content's text as `key: value` lines. The user's text and the contents are values: a `{{...}}`
    inside them is sent as it is. Attachments (images, ...) stay in the message, after the text."""
    parsed = Template(template, where="inject(template)")
    unknown = set(parsed.variables) - {"message", "contents"}
    if unknown or "contents" not in parsed.variables:
        raise ConfigurationError(
            "inject(template): the template takes {{message}} and {{contents}} (and needs {{contents}}), "
            f"got {parsed.source!r}"
        )
    keys = tuple(metadata)

    def render(content: Content) -> str:
        lines = [content.text]
        for key in keys:
            if key in content.metadata:
                lines.append(f"{key}: {content.metadata[key]}")
        return "\n".join(lines)

    def injector(message: UserMessage, contents: Sequence[Content]) -> UserMessage:
        text = parsed.render({"message": message.text, "contents": separator.join(map(render, contents))})
        rest = tuple(c for c in message.contents if not isinstance(c, TextContent))
        return message.model_copy(update={"contents": (TextContent(text=text), *rest)})

    return injector


_DEFAULT_INJECTOR: Final = inject()


class _Source:
    """A retriever as the pipeline calls it: a name for events and errors, and the call."""

    __slots__ = ("call", "name", "target")

    def __init__(self, target: object, where: str) -> None:
        method = getattr(target, "retrieve", None)
        if callable(method) and not isinstance(target, type):
            call = method
            own = getattr(target, "name", None)
            name = own if isinstance(own, str) and own else type(target).__qualname__
        elif callable(target) and not isinstance(target, type):
            call = target
            name = getattr(target, "__qualname__", None) or type(target).__qualname__
        else:
            raise ConfigurationError(
                f"{where}: {target!r} is not a retriever: give an object with an async "
                "retrieve(query) method, or an async function of the query, returning contents"
            )
        self.target = target
        self.call: Callable[[Query], Any] = call
        self.name: str = name


@dataclass(frozen=True, slots=True)
class Skipped:
    """A retriever whose contents a call went without (`on_error="skip"`): its name, the query, and
    why (`"timeout"`, or the exception's class name)."""

    retriever: str
    query: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Retrieval:
    """How a call retrieves contents before the model is asked.

    - `retrievers`: what to search (objects with `async retrieve(query)`, or async functions of the
      query), all of them for every query unless a `router` chooses.
    - `transformer`: turns the call's query into the queries to run (default: the user's text).
    - `router`: chooses the retrievers of each query.
    - `aggregator`: merges the lists of every (query, retriever) pair (default:
      `reciprocal_rank_fusion`); the first `max_results` are injected.
    - `injector`: the message the model sees (default: `inject()`); memory keeps the user's own.
    - `when`: a predicate of the query (may be async); false skips retrieval for that call.
    - `timeout`: seconds one retriever may take for one query (within the call's time budget).
    - `on_error`: `"fail"` raises `RetrievalError` when a retriever fails or times out; `"skip"` goes
      on without its contents (the `Retrieved` event lists what was skipped).

    Every (query, retriever) pair runs concurrently in one task group: two 1 s retrievers take 1 s.
    """

    retrievers: Sequence[object] = ()
    transformer: QueryTransformer | None = None
    router: Router | None = None
    aggregator: Aggregator = reciprocal_rank_fusion
    injector: Injector = _DEFAULT_INJECTOR
    when: Callable[[Query], bool | Awaitable[bool]] | None = None
    max_results: int = 5
    timeout: float | None = None
    on_error: Literal["fail", "skip"] = "fail"
    _sources: tuple[_Source, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = "Retrieval"
        retrievers = self.retrievers
        if isinstance(retrievers, str | bytes) or not isinstance(retrievers, Sequence):
            retrievers = (retrievers,)
        sources = tuple(_Source(r, where) for r in retrievers)
        if not sources and self.router is None:
            raise ConfigurationError(f"{where}: give retrievers, or a router that chooses them")
        for name in ("transformer", "router", "when"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ConfigurationError(f"{where}: {name} must be callable, got {value!r}")
        for name in ("aggregator", "injector"):
            if not callable(getattr(self, name)):
                raise ConfigurationError(f"{where}: {name} must be callable, got {getattr(self, name)!r}")
        if (
            isinstance(self.max_results, bool)
            or not isinstance(self.max_results, int)
            or self.max_results < 1
        ):
            raise ConfigurationError(f"{where}: max_results must be an int >= 1, got {self.max_results!r}")
        timeout = self.timeout
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ConfigurationError(
                f"{where}: timeout must be a positive number of seconds, got {timeout!r}"
            )
        if self.on_error not in ("fail", "skip"):
            raise ConfigurationError(f"{where}: on_error must be 'fail' or 'skip', got {self.on_error!r}")
        object.__setattr__(self, "retrievers", tuple(retrievers))
        object.__setattr__(self, "_sources", sources)


_OFF: Final[tuple[()]] = ()


def retrieval(config: Retrieval | None) -> Callable[[_T], _T]:
    """Declare the retrieval of a method, or of every method of a class (method > class > build);
    `@retrieval(None)` turns the build's retrieval off for it."""
    if config is not None and not isinstance(config, Retrieval):
        raise ConfigurationError(f"@retrieval: give an agentrt.rag.Retrieval or None, got {config!r}")

    def decorate(target: _T) -> _T:
        setattr(target, RETRIEVAL_ATTR, config if config is not None else _OFF)
        return target

    return decorate


async def _maybe(value: _T | Awaitable[_T]) -> _T:
    if inspect.isawaitable(value):
        return await value
    return value


def _queries(produced: object, query: Query, where: str) -> list[Query]:
    if isinstance(produced, str | Query):
        produced = (produced,)
    if not isinstance(produced, Sequence):
        raise TypeError(f"{where}: the query transformer returned {produced!r}, not a list of queries")
    out = []
    for item in produced:
        if isinstance(item, str):
            out.append(query.with_text(item))
        elif isinstance(item, Query):
            out.append(item)
        else:
            raise TypeError(f"{where}: the query transformer returned {item!r}, not a Query or a str")
    return out


def _contents(found: object, who: str) -> list[Content]:
    if not isinstance(found, Sequence) or isinstance(found, str | bytes):
        raise TypeError(f"{who} returned {found!r}, not a list of Content")
    for item in found:
        if not isinstance(item, Content) or not isinstance(item.text, str):
            raise TypeError(f"{who} returned {item!r}, not an agentrt.rag.Content with text")
    return list(found)


_TIMEOUT: Final = "timeout"


async def run(
    config: Retrieval, query: Query, where: str
) -> tuple[list[Query], list[Content], list[Skipped]] | None:
    """Retrieve for one call: the queries run, the contents to inject (at most `max_results`) and the
    retrievers skipped; `None` when `when` says not to retrieve.

    Every (query, retriever) pair runs in its own task of one task group, under `timeout` each; a
    failure is caught in its task and raised (as `RetrievalError`, the first in order) after the group
    closed, so no sibling is cancelled by another's error and no exception group reaches the caller.
    Cancellation (the call's deadline, the caller's) cancels every retriever; nothing is left running.
    """
    if config.when is not None:
        try:
            wanted = await _maybe(config.when(query))
        except Exception as exc:
            raise _stage_failed(where, "when", exc) from exc
        if not wanted:
            return None
    queries = [query]
    if config.transformer is not None:
        try:
            queries = _queries(await _maybe(config.transformer(query)), query, where)
        except Exception as exc:
            raise _stage_failed(where, "transformer", exc) from exc
    pairs: list[tuple[Query, _Source]] = []
    for one in queries:
        sources: Iterable[_Source] = config._sources
        if config.router is not None:
            try:
                chosen = await _maybe(config.router(one))
                if isinstance(chosen, str | bytes) or not isinstance(chosen, Sequence):
                    chosen = (chosen,)
                known = {id(s.target): s for s in config._sources}
                sources = [known.get(id(r)) or _Source(r, f"{where}: the router") for r in chosen]
            except Exception as exc:
                raise _stage_failed(where, "router", exc) from exc
        pairs.extend((one, source) for source in sources)
    outcomes: list[list[Content] | BaseException | str | None] = [None] * len(pairs)
    timeout = config.timeout

    async def one_pair(index: int, one: Query, source: _Source) -> None:
        try:
            with anyio.move_on_after(timeout) as scope:
                outcomes[index] = _contents(await _maybe(source.call(one)), f"retriever {source.name}")
            if scope.cancelled_caught:
                outcomes[index] = _TIMEOUT
        except Exception as exc:  # a failure stays in its task; cancellation is not caught
            outcomes[index] = exc

    if len(pairs) == 1:  # no task group for one retriever: it costs more than the rest
        await one_pair(0, *pairs[0])
    else:
        async with anyio.create_task_group() as group:
            for index, (one, source) in enumerate(pairs):
                group.start_soon(one_pair, index, one, source)
    ranked: list[list[Content]] = []
    skipped: list[Skipped] = []
    for (one, source), outcome in zip(pairs, outcomes, strict=True):
        if isinstance(outcome, list):
            ranked.append(outcome)
            continue
        reason = _TIMEOUT if outcome == _TIMEOUT else type(outcome).__name__
        if config.on_error == "skip":
            skipped.append(Skipped(source.name, one.text, reason))
            continue
        if outcome == _TIMEOUT:
            raise RetrievalError(
                f"{where}: retriever {source.name} did not answer within {timeout} s", retriever=source.name
            )
        assert isinstance(outcome, BaseException)
        raise RetrievalError(
            f"{where}: retriever {source.name} failed ({type(outcome).__name__})", retriever=source.name
        ) from outcome
    contents: list[Content] = []
    if ranked:
        try:
            fused = config.aggregator(ranked)
            contents = _contents(fused, "the aggregator")[: config.max_results]
        except Exception as exc:
            raise _stage_failed(where, "aggregator", exc) from exc
    return queries, contents, skipped


def _stage_failed(where: str, stage: str, exc: Exception) -> RetrievalError:
    """The error for a failure of a retrieval stage other than a retriever (its `retriever` names
    the stage: `when`, `transformer`, `router`, `aggregator`, `injector`)."""
    return RetrievalError(f"{where}: the retrieval's {stage} failed ({type(exc).__name__})", retriever=stage)


def augmented(
    config: Retrieval, message: UserMessage, contents: Sequence[Content], where: str
) -> UserMessage:
    """The message the model sees: the injector's, checked."""
    if not contents:
        return message
    try:
        out = config.injector(message, contents)
        if not isinstance(out, UserMessage):
            raise TypeError(f"the injector returned {out!r}, not an agentrt.UserMessage")
    except Exception as exc:
        raise _stage_failed(where, "injector", exc) from exc
    return out
