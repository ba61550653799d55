"""What a model adapter raises when a `MockTransport` server answers badly, and every text that error shows.

Shared by the tests of malformed payloads (test_models_malformed.py), retries (test_models_retry.py) and
the key scrubber (test_models_secrets.py): `raised_by` returns the exception `complete` raised, whatever
its class, so that a foreign exception shows up as itself; `texts_of` and `fragments` find any piece of a
key that survived in it.
"""

from __future__ import annotations

import traceback
from typing import Any

import httpx
from cassettes import Parts

from agentrt import ModelRequest, UserMessage
from agentrt.models import OllamaChatModel, OpenAIChatModel, RetryPolicy, complete

OPENAI_URL = "http://llm.test/v1"
OLLAMA_URL = "http://ollama.test:11434"
ENDPOINT = "http://llm.test/v1/chat/completions"
REQUEST = ModelRequest(messages=(UserMessage.of("hi"),))
SSE = "text/event-stream; charset=utf-8"
JSON = "application/json; charset=utf-8"
NDJSON = "application/x-ndjson"

ECHOED_KEY = "sk-proj-Zq7SECRETx9Kw4mNbV2-4f9a2b7cD1eF"
"""A key with no 8-character run in common with anything else the tests write."""
SLASHED_KEY = "gw-AbCdEf0123/GhIjKl4567+MnOp=="
"""A base64-style key (gateways, self-hosted proxies): `/`, `+` and `=` are escaped by some encoders."""


def adapter_model(adapter: str, client: httpx.AsyncClient, *, key: str = ECHOED_KEY, **options: Any) -> Any:
    options.setdefault("retry", RetryPolicy.never())
    if adapter == "openai":
        return OpenAIChatModel("m", base_url=OPENAI_URL, api_key=key, client=client, **options)
    return OllamaChatModel("m", base_url=OLLAMA_URL, api_key=key, client=client, **options)


def serving(status: int, content_type: str, body: bytes, **headers: str) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"content-type": content_type, **headers}, stream=Parts([body]))

    return httpx.MockTransport(handler)


async def raised_by(adapter: str, transport: httpx.MockTransport, **options: Any) -> Exception:
    """What `complete` raised (any exception: a foreign one must show up as itself)."""
    async with httpx.AsyncClient(transport=transport) as client:
        try:
            await complete(adapter_model(adapter, client, **options), REQUEST)
        except Exception as exc:
            return exc
    raise AssertionError("the call succeeded")


def chain(error: BaseException) -> list[BaseException]:
    """`error` and every exception it is chained to (cause or context)."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def texts_of(error: BaseException) -> list[str]:
    """Every text the error shows: str, repr, fields, traceback, and each chained exception's own."""
    texts = ["".join(traceback.format_exception(error))]
    for exc in chain(error):
        texts += [str(exc), repr(exc), repr(exc.args), repr(getattr(exc, "__dict__", {}))]
        texts += [repr(getattr(exc, name, None)) for name in ("body", "message", "doc", "object")]
    return texts


def fragments(key: str, texts: list[str], size: int = 8) -> list[str]:
    """The pieces of `key` (`size` characters or more) that some text shows."""
    pieces = {key[i : i + size] for i in range(len(key) - size + 1)}
    return sorted({piece for text in texts for piece in pieces if piece in text})
