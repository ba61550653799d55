"""What the HTTP embedding adapters share: batches sent concurrently and put back in input order,
reading a vector (a JSON array of numbers, or base64 little-endian float32), and the result with usage.
"""

from __future__ import annotations

import base64
import binascii
import sys
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import anyio

from .._errors import ConfigurationError
from ..models._base import HttpModel
from ..models._decoders import MalformedPayload, json_type
from ..models._failures import unreadable

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..models._base import ConnectionOptions

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_CONCURRENCY",
    "Embeddings",
    "HttpEmbeddingModel",
    "dimension_mismatch",
    "vector",
]

DEFAULT_BATCH_SIZE: Final = 256
"""Texts per request: far below OpenAI's 2,048 inputs (and its 300,000 tokens) per request, small enough
that one failed request does not cost much, large enough that a few thousand chunks take a few
requests."""

DEFAULT_CONCURRENCY: Final = 4
"""Requests in flight at once when the texts make several batches."""


@dataclass(frozen=True, slots=True)
class Embeddings:
    """The vectors of one `embed_with_usage` call, one per text in order; the `input_tokens` the
    server counted (summed over the batches; `None` when a batch did not say), and the `model` it
    named."""

    vectors: list[list[float]]
    input_tokens: int | None = None
    model: str | None = None


class HttpEmbeddingModel(HttpModel):
    """The common part of an HTTP embedding model: `embed` splits the texts into batches of
    `batch_size`, sends up to `max_concurrency` of them at once, and puts the vectors back in input
    order. Subclasses pass their connection and batching options to `__init__` and implement
    `_embed_batch`."""

    _batch_size: int
    _max_concurrency: int

    def __init__(
        self, model: str, connection: ConnectionOptions, *, batch_size: int, max_concurrency: int
    ) -> None:
        super().__init__(model, connection)
        kind = type(self).__name__
        if batch_size < 1:
            raise ConfigurationError(f"{kind}: batch_size must be at least 1, got {batch_size}")
        if max_concurrency < 1:
            raise ConfigurationError(f"{kind}: max_concurrency must be at least 1, got {max_concurrency}")
        self._batch_size = batch_size
        self._max_concurrency = max_concurrency

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order (see `embed_with_usage`)."""
        return (await self.embed_with_usage(texts)).vectors

    async def embed_with_usage(self, texts: Sequence[str]) -> Embeddings:
        """One vector per text, in order, with the tokens the server counted.

        No texts make no request. Several batches run concurrently (at most `max_concurrency`); the
        first that fails cancels the others, and its `ModelError` is raised (never an exception
        group). Each request is retried per the model's `RetryPolicy` before its response started.
        Raises `ModelResponseError` when the server's vectors do not fit the texts (a count, an
        index or a dimension that does not match). Cancellation closes every open response.
        """
        if isinstance(texts, str):
            raise TypeError("embed takes a sequence of texts, not one str")
        items = list(texts)
        if not items:
            return Embeddings([], 0, None)
        size = self._batch_size
        batches = [items[start : start + size] for start in range(0, len(items), size)]
        if len(batches) == 1:
            return await self._embed_batch(batches[0])
        results: list[Embeddings | None] = [None] * len(batches)
        failures: list[Exception] = []
        limiter = anyio.CapacityLimiter(self._max_concurrency)

        async def run(number: int, batch: list[str]) -> None:
            async with limiter:
                try:
                    results[number] = await self._embed_batch(batch)
                except Exception as exc:  # cancellation is a BaseException: it passes
                    failures.append(exc)
                    group.cancel_scope.cancel()

        async with anyio.create_task_group() as group:
            for number, batch in enumerate(batches):
                group.start_soon(run, number, batch)
        if failures:
            raise failures[0]
        done = [result for result in results if result is not None]
        assert len(done) == len(batches)
        vectors = [vector for result in done for vector in result.vectors]
        mismatch = dimension_mismatch(vectors)
        if mismatch is not None:
            context = self._session.context
            raise unreadable(f"{mismatch} (across batches)", context, request_id=None, mid_stream=False)
        counts = [result.input_tokens for result in done]
        tokens = None if None in counts else sum(count for count in counts if count is not None)
        return Embeddings(vectors, tokens, done[0].model)

    async def _embed_batch(self, texts: list[str]) -> Embeddings:
        """The vectors of one batch, in order (one request)."""
        raise NotImplementedError


_BIG_ENDIAN: Final = sys.byteorder == "big"


def vector(value: Any) -> list[float]:
    """An embedding as the server sent it: a JSON array of numbers, or a base64 string of
    little-endian float32 values. Raises `MalformedPayload` for anything else, or an empty one."""
    if value.__class__ is list:
        if not value:
            raise MalformedPayload("an embedding is empty")
        for item in value:
            if item.__class__ is not float:
                return _numbers(value)
        return value
    if value.__class__ is str:
        return _decode(value)
    raise MalformedPayload(f"an embedding is {json_type(value)}, not a list of numbers or base64")


def _numbers(values: list[Any]) -> list[float]:
    """A list with integers among its floats (`0`, `1`), as floats; anything else is malformed."""
    numbers: list[float] = []
    for item in values:
        if item.__class__ is float:
            numbers.append(item)
        elif item.__class__ is int:
            numbers.append(float(item))
        else:
            raise MalformedPayload(f"an embedding holds {json_type(item)}, not only numbers")
    return numbers


def _decode(text: str) -> list[float]:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedPayload("an embedding is a string that is not base64") from None
    if not raw or len(raw) % 4:
        raise MalformedPayload(f"a base64 embedding has {len(raw)} bytes, not a multiple of 4 float32 bytes")
    values = array("f")
    values.frombytes(raw)
    if _BIG_ENDIAN:
        values.byteswap()
    return values.tolist()


def dimension_mismatch(vectors: list[list[float]]) -> str | None:
    """What is wrong when the vectors do not all have the same length, else `None`."""
    sizes = {len(item) for item in vectors}
    return f"the embeddings have different dimensions: {sorted(sizes)}" if len(sizes) > 1 else None
