"""Embeddings from the real local server (llama-cpp-python, Gemma 3 270M under `EMBEDDING_ALIAS`).

Gemma 3 270M is no embedding model, but its mean-pooled hidden states still place a paraphrase far
nearer to its sentence than an unrelated sentence (cosine about 0.92 to 0.94 against about 0.6, seen
on this build); these tests assert that with a wide margin, and what else holds exactly: the shape,
the usage, that a repeated request gives the very same numbers, and that a chat request still works
when the server has to switch from the embedding entry back to the chat entry. What does not hold
exactly: a text's vector depends slightly on the other texts of its batch (cosine 0.99994 rather
than 1), so vectors from different batchings are compared by cosine, not for equality.
"""

from __future__ import annotations

import math

import pytest

from agentrt import ModelRequest, ModelSettings, UserMessage
from agentrt.local import EMBEDDING_ALIAS, local_chat_model, local_embedding_model
from agentrt.models import complete
from agentrt.rag.openai import OpenAIEmbeddingModel

from .conftest import LocalServer

pytestmark = pytest.mark.e2e

TEXTS = [
    "The cat sat on the mat.",
    "A cat was sitting on the mat.",
    "Quarterly revenue rose by eight percent.",
    "Dogs love to play fetch in the park.",
    "Puppies enjoy chasing balls outside.",
    "The stock market fell sharply today.",
]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


async def test_vectors_have_the_models_shape_and_the_servers_usage(local_server: LocalServer) -> None:
    async with local_embedding_model(local_server.base_url) as model:
        result = await model.embed_with_usage(TEXTS)
    assert len(result.vectors) == len(TEXTS)
    assert {len(vector) for vector in result.vectors} == {640}  # Gemma 3 270M's hidden size
    assert all(math.isfinite(value) for vector in result.vectors for value in vector)
    assert result.model == EMBEDDING_ALIAS
    assert result.input_tokens is not None and result.input_tokens >= len(TEXTS) * 5


async def test_the_same_request_gives_the_same_numbers(local_server: LocalServer) -> None:
    async with local_embedding_model(local_server.base_url) as model:
        first = await model.embed(TEXTS)
        second = await model.embed(TEXTS)
        alone = await model.embed(TEXTS[:1])
    assert first == second
    assert cosine(alone[0], first[0]) > 0.9999


async def test_a_paraphrase_is_nearer_than_an_unrelated_text(local_server: LocalServer) -> None:
    async with local_embedding_model(local_server.base_url) as model:
        cat, cat_again, revenue, dogs, puppies, stocks = await model.embed(TEXTS)
    assert cosine(cat, cat_again) > cosine(cat, revenue) + 0.15
    assert cosine(dogs, puppies) > cosine(dogs, stocks) + 0.15
    assert cosine(puppies, dogs) > cosine(puppies, cat_again)


async def test_batches_and_base64_requests_give_the_same_vectors(local_server: LocalServer) -> None:
    async with (
        local_embedding_model(local_server.base_url) as whole,
        local_embedding_model(local_server.base_url, batch_size=2, max_concurrency=3) as batched,
        # the adapter's default asks for base64; this server ignores that and sends numbers
        OpenAIEmbeddingModel(EMBEDDING_ALIAS, base_url=local_server.base_url, api_key="local") as default,
    ):
        reference = await whole.embed(TEXTS)
        in_batches = await batched.embed(TEXTS)
        from_default = await default.embed(TEXTS)
    assert from_default == reference
    assert all(cosine(a, b) > 0.9999 for a, b in zip(in_batches, reference, strict=True))


async def test_chat_still_answers_after_embeddings(local_server: LocalServer) -> None:
    request = ModelRequest(messages=(UserMessage.of("Hello"),))
    async with (
        local_embedding_model(local_server.base_url) as embedder,
        local_chat_model(local_server.base_url, settings=ModelSettings(max_tokens=4)) as chat,
    ):
        await embedder.embed(TEXTS[:2])
        answer = await complete(chat, request)
        vectors = await embedder.embed(TEXTS[:2])
    assert answer.usage.output_tokens > 0
    assert len(vectors) == 2
