"""OpenAI-compatible embeddings (`POST {base_url}/embeddings`) over httpx.

The request is `{"model", "input": [texts], "encoding_format", "dimensions"?}`; the answer
`{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage":
{"prompt_tokens", "total_tokens"}}`. Each `embedding` is a JSON array of numbers (`"float"`) or a base64
string of little-endian float32 values (`"base64"`); both are read whatever was asked, since some
compatible servers (llama-cpp-python) ignore `encoding_format` and always send arrays. Vectors are put
in input order by `index` (in the order sent where a server gives none).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal, Unpack

from ..models._decoders import MalformedPayload, json_type
from ..models._http_stream import fetch_json
from ..models.openai import SERVER
from ._embedding import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CONCURRENCY,
    Embeddings,
    HttpEmbeddingModel,
    dimension_mismatch,
    vector,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..models._base import ConnectionOptions

__all__ = ["OpenAIEmbeddingModel"]

DEFAULT_MODEL: Final = "text-embedding-3-small"


class OpenAIEmbeddingModel(HttpEmbeddingModel):
    """An embedding model behind an OpenAI-compatible `/embeddings` endpoint (OpenAI, vLLM, llama.cpp,
    llama-cpp-python, Ollama's `/v1`, LM Studio, OpenRouter, ...).

    - `model`: the model name sent with every request (default `text-embedding-3-small`).
    - `base_url`, `api_key`: default to `OPENAI_BASE_URL` and `OPENAI_API_KEY` (then to OpenAI's URL and
      no key), as for `OpenAIChatModel`. The key is kept as a `SecretStr`, only ever put into the
      `Authorization` header.
    - `dimensions`: ask for shorter vectors (OpenAI's `text-embedding-3` models); not sent when `None`.
    - `encoding_format`: `"base64"` (default) has the server send each vector as the bytes of its
      float32 values in base64, about half the size of the same numbers written as JSON text, decoded
      exactly (no decimal rounding) and without parsing thousands of numbers; OpenAI's own SDK asks
      for it too. `"float"` asks for JSON arrays, for a server that refuses base64. Either form is read
      whatever was asked.
    - `batch_size`: texts per request (default 256; OpenAI takes at most 2,048); `max_concurrency`:
      requests in flight at once (default 4) when the texts make several batches.
    - `extra_body`: extra top-level request fields (e.g. `user`, or a server's own `truncate`).
    - `headers`, `timeout`, `retry`, `client`, `on_request`, `on_response`, `on_error`: how to reach
      the server, as for every HTTP adapter (see `agentrt.models.ConnectionOptions`).

    `embed(texts)` returns one vector per text, in order; `embed_with_usage(texts)` also the tokens the
    server counted. Errors are `agentrt.ModelError` kinds; an answer that does not fit the texts is a
    `ModelResponseError`.
    """

    _server = SERVER
    _path = "/embeddings"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        dimensions: int | None = None,
        encoding_format: Literal["float", "base64"] = "base64",
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_concurrency: int = DEFAULT_CONCURRENCY,
        extra_body: Mapping[str, Any] | None = None,
        **connection: Unpack[ConnectionOptions],
    ) -> None:
        super().__init__(model, connection, batch_size=batch_size, max_concurrency=max_concurrency)
        self._dimensions = dimensions
        self._encoding_format = encoding_format
        self._extra_body = dict(extra_body or {})

    def request_body(self, texts: list[str]) -> dict[str, Any]:
        """The JSON body for one batch (what listeners see)."""
        body: dict[str, Any] = {
            "model": self._model,
            "input": texts,
            "encoding_format": self._encoding_format,
        }
        if self._dimensions is not None:
            body["dimensions"] = self._dimensions
        body.update(self._extra_body)
        return body

    async def _embed_batch(self, texts: list[str]) -> Embeddings:
        return await fetch_json(self._session, self.request_body(texts), partial(read_embeddings, len(texts)))


def read_embeddings(count: int, payload: Any) -> Embeddings:
    """The vectors of an `/embeddings` answer to `count` texts, by `index`; raises `MalformedPayload`
    (or what reading a payload of the wrong shape raises) for an answer that does not fit."""
    if payload.__class__ is not dict:
        raise MalformedPayload(f"the response is {json_type(payload)}, not an object")
    data = payload.get("data")
    if data.__class__ is not list:
        raise MalformedPayload(f"`data` is {json_type(data)}, not a list")
    if len(data) != count:
        raise MalformedPayload(f"{len(data)} embeddings for {count} inputs")
    vectors: list[list[float] | None] = [None] * count
    for position, item in enumerate(data):
        if item.__class__ is not dict:
            raise MalformedPayload(f"an item of `data` is {json_type(item)}, not an object")
        index = item.get("index", position)
        if index.__class__ is not int or not 0 <= index < count:
            shown = index if index.__class__ is int else json_type(index)
            raise MalformedPayload(f"an embedding's index is {shown}, not one of 0 to {count - 1}")
        if vectors[index] is not None:
            raise MalformedPayload(f"two embeddings have the index {index}")
        vectors[index] = vector(item.get("embedding"))
    found = [item for item in vectors if item is not None]
    mismatch = dimension_mismatch(found)
    if mismatch is not None:
        raise MalformedPayload(mismatch)
    usage = payload.get("usage")
    tokens = usage.get("prompt_tokens") if usage.__class__ is dict else None
    model = payload.get("model")
    return Embeddings(
        found,
        tokens if tokens.__class__ is int else None,
        model if model.__class__ is str else None,
    )
