"""Ollama's native embeddings (`POST {base_url}/api/embed`) over httpx.

The request is `{"model", "input": [texts], "truncate"?, "keep_alive"?, "dimensions"?}`; the answer
`{"model", "embeddings": [[...], ...], "total_duration", "load_duration", "prompt_eval_count"}`, the
vectors in input order.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Unpack

from ..models._decoders import MalformedPayload, json_type
from ..models._http_stream import fetch_json
from ..models.ollama import SERVER
from ._embedding import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CONCURRENCY,
    Embeddings,
    HttpEmbeddingModel,
    dimension_mismatch,
    vector,
)

if TYPE_CHECKING:
    from ..models._base import ConnectionOptions

__all__ = ["OllamaEmbeddingModel"]


class OllamaEmbeddingModel(HttpEmbeddingModel):
    """An embedding model served by Ollama, through its native `/api/embed` endpoint.

    - `model`: the model name (e.g. `"nomic-embed-text"`, `"embeddinggemma"`).
    - `base_url`, `api_key`: default to `OLLAMA_HOST` (with `http://` added when it has no scheme), then
      `http://localhost:11434`, and `OLLAMA_API_KEY`, as for `OllamaChatModel`.
    - `truncate`: `False` makes Ollama refuse a text longer than the model's context (a
      `BadRequestError`) instead of cutting it; `None` (default) leaves Ollama's default (cut).
    - `keep_alive`: how long Ollama keeps the model loaded after the request (e.g. `"10m"`, `0`).
    - `dimensions`: ask for shorter vectors, for models that support it; not sent when `None`.
    - `batch_size`, `max_concurrency`: as for `OpenAIEmbeddingModel`.
    - `headers`, `timeout`, `retry`, `client`, `on_request`, `on_response`, `on_error`: how to reach
      the server, as for every HTTP adapter (see `agentrt.models.ConnectionOptions`).
    """

    _server = SERVER
    _path = "/api/embed"

    def __init__(
        self,
        model: str,
        *,
        truncate: bool | None = None,
        keep_alive: str | float | None = None,
        dimensions: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_concurrency: int = DEFAULT_CONCURRENCY,
        **connection: Unpack[ConnectionOptions],
    ) -> None:
        super().__init__(model, connection, batch_size=batch_size, max_concurrency=max_concurrency)
        self._truncate = truncate
        self._keep_alive = keep_alive
        self._dimensions = dimensions

    def request_body(self, texts: list[str]) -> dict[str, Any]:
        """The JSON body for one batch (what listeners see)."""
        body: dict[str, Any] = {"model": self._model, "input": texts}
        if self._truncate is not None:
            body["truncate"] = self._truncate
        if self._keep_alive is not None:
            body["keep_alive"] = self._keep_alive
        if self._dimensions is not None:
            body["dimensions"] = self._dimensions
        return body

    async def _embed_batch(self, texts: list[str]) -> Embeddings:
        return await fetch_json(
            self._session, self.request_body(texts), partial(read_ollama_embeddings, len(texts))
        )


def read_ollama_embeddings(count: int, payload: Any) -> Embeddings:
    """The vectors of an `/api/embed` answer to `count` texts; raises `MalformedPayload` (or what
    reading a payload of the wrong shape raises) for an answer that does not fit."""
    if payload.__class__ is not dict:
        raise MalformedPayload(f"the response is {json_type(payload)}, not an object")
    embeddings = payload.get("embeddings")
    if embeddings.__class__ is not list:
        raise MalformedPayload(f"`embeddings` is {json_type(embeddings)}, not a list")
    if len(embeddings) != count:
        raise MalformedPayload(f"{len(embeddings)} embeddings for {count} inputs")
    vectors = [vector(item) for item in embeddings]
    mismatch = dimension_mismatch(vectors)
    if mismatch is not None:
        raise MalformedPayload(mismatch)
    tokens = payload.get("prompt_eval_count")
    model = payload.get("model")
    return Embeddings(
        vectors,
        tokens if tokens.__class__ is int else None,
        model if model.__class__ is str else None,
    )
