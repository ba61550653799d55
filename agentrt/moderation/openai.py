"""OpenAI-compatible moderation (`POST {base_url}/moderations`) over httpx.

The request is `{"model", "input": [texts]}`; the answer `{"id", "model", "results": [{"flagged",
"categories": {name: bool}, "category_scores": {name: number}, "category_applied_input_types": {name:
["text", ...]}}]}`, one result per text, in order. Category names are the provider's own
(`"harassment/threatening"`, `"self-harm/intent"`, ...) and kept in its order. Older text models send
`null` for the categories they do not judge (`illicit`); those are left out of the verdict. Input types
say which kind of input (text, image) a score came from: with text only, always `["text"]`, so they
are not kept.
"""

from __future__ import annotations

from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Unpack

from ..models._base import HttpModel
from ..models._decoders import MalformedPayload, json_type
from ..models._http_stream import fetch_json
from ..models.openai import SERVER
from ._types import Moderation

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..models._base import ConnectionOptions

__all__ = ["OpenAIModerationModel"]

DEFAULT_MODEL: Final = "omni-moderation-latest"


class OpenAIModerationModel(HttpModel):
    """A moderation model behind an OpenAI-compatible `/moderations` endpoint.

    - `model`: the model name sent with every request (default `omni-moderation-latest`).
    - `base_url`, `api_key`: default to `OPENAI_BASE_URL` and `OPENAI_API_KEY` (then to OpenAI's URL and
      no key), as for `OpenAIChatModel`. The key is kept as a `SecretStr`, only ever put into the
      `Authorization` header.
    - `headers`, `timeout`, `retry`, `client`, `on_request`, `on_response`, `on_error`: how to reach
      the server, as for every HTTP adapter (see `agentrt.models.ConnectionOptions`).

    `moderate(texts)` sends all texts in one request and returns one `Moderation` per text, in order.
    Errors are `agentrt.ModelError` kinds; an answer that does not fit the texts is a
    `ModelResponseError`. Cancellation closes the response.
    """

    _server = SERVER
    _path = "/moderations"

    def __init__(self, model: str = DEFAULT_MODEL, **connection: Unpack[ConnectionOptions]) -> None:
        super().__init__(model, connection)

    def request_body(self, texts: list[str]) -> dict[str, Any]:
        """The JSON body for `texts` (what listeners see)."""
        return {"model": self._model, "input": texts}

    async def moderate(self, texts: Sequence[str]) -> list[Moderation]:
        """One verdict per text, in order; no texts make no request. Retried per the `RetryPolicy`
        before the response started; raises the `ModelError` kinds."""
        if isinstance(texts, str):
            raise TypeError("moderate takes a sequence of texts, not one str")
        items = list(texts)
        if not items:
            return []
        read = partial(read_moderations, len(items), self._model)
        return await fetch_json(self._session, self.request_body(items), read)


def read_moderations(count: int, model: str, payload: Any) -> list[Moderation]:
    """The verdicts of a `/moderations` answer to `count` texts (`model` where the answer names none);
    raises `MalformedPayload` (or what reading a payload of the wrong shape raises) for an answer that
    does not fit."""
    if payload.__class__ is not dict:
        raise MalformedPayload(f"the response is {json_type(payload)}, not an object")
    results = payload.get("results")
    if results.__class__ is not list:
        raise MalformedPayload(f"`results` is {json_type(results)}, not a list")
    if len(results) != count:
        raise MalformedPayload(f"{len(results)} results for {count} inputs")
    named = payload.get("model")
    judge = named if named.__class__ is str and named else model
    return [_moderation(result, judge) for result in results]


def _moderation(result: Any, model: str) -> Moderation:
    if result.__class__ is not dict:
        raise MalformedPayload(f"a result is {json_type(result)}, not an object")
    flagged = result.get("flagged")
    if flagged.__class__ is not bool:
        raise MalformedPayload(f"a result's `flagged` is {json_type(flagged)}, not a boolean")
    categories: dict[str, bool] = {}
    for name, flag in _mapping(result, "categories").items():
        if flag is None:
            continue
        if flag.__class__ is not bool:
            raise MalformedPayload(f"a category's flag is {json_type(flag)}, not a boolean")
        categories[name] = flag
    scores: dict[str, float] = {}
    for name, score in _mapping(result, "category_scores").items():
        if score is None:
            continue
        if score.__class__ is not float and score.__class__ is not int:
            raise MalformedPayload(f"a category's score is {json_type(score)}, not a number")
        scores[name] = float(score)
    return Moderation(flagged, MappingProxyType(categories), MappingProxyType(scores), model)


def _mapping(result: dict[str, Any], key: str) -> dict[str, Any]:
    value = result.get(key)
    if value is None:
        return {}
    if value.__class__ is not dict:
        raise MalformedPayload(f"a result's `{key}` is {json_type(value)}, not an object")
    return value
