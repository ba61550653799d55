"""The embedding adapters: `OpenAIEmbeddingModel` (`/v1/embeddings`) and `OllamaEmbeddingModel`
(`/api/embed`), against scripted endpoints answering with the bytes the real APIs send."""

from __future__ import annotations

import logging
from array import array
from typing import Any

import anyio
import httpx
import orjson
import pytest
from cassettes import load
from json_server import (
    SERVER_ERROR,
    Body,
    Script,
    check_error,
    echoing_key,
    key_shown,
    rate_limited,
    respond,
)

from agentrt import (
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    ContextLengthExceededError,
    ModelConnectionError,
    ModelError,
    ModelNotFoundError,
    ModelResponseError,
    RateLimitError,
    ServerError,
)
from agentrt.models import RetryPolicy
from agentrt.rag._types import EmbeddingModel
from agentrt.rag.ollama import OllamaEmbeddingModel
from agentrt.rag.openai import OpenAIEmbeddingModel

KEY = "sk-proj-EMBED-7c1d4f9a2b"
BASE = "https://api.openai.test/v1"
OLLAMA = "http://ollama.test:11434"

# Three unit vectors of text-embedding-3-small asked for 4 dimensions, as float32 (what the server
# computes): as OpenAI writes them in JSON, and the same bytes in base64.
FLOATS = [
    [0.46294805, -0.20112087, 0.85238844, 0.13661417],
    [-0.07119298, 0.618739, 0.33006746, -0.70933],
    [0.28808334, 0.51323926, -0.6029209, 0.5385906],
]
VECTORS = [array("f", vector).tolist() for vector in FLOATS]  # exactly what the base64 bytes hold
BASE64 = ["hwftPqHyTb4hNlo/luQLPg==", "oM2Rva5lHj+a/qg+p5Y1vw==", "qX+TPqZjAz8GWRq/E+EJPw=="]
HEADERS = {
    "content-type": "application/json",
    "access-control-allow-origin": "*",
    "openai-model": "text-embedding-3-small",
    "openai-organization": "user-3xkq7xj0pxqk2sdtq0bgyvjm",
    "openai-processing-ms": "21",
    "openai-version": "2020-10-01",
    "x-request-id": "req_5f6e0a3b2c9d4e8f9a1b2c3d4e5f6a7b",
}


def openai_body(vectors: list[str], order: list[int] | None = None, tokens: int = 9) -> bytes:
    """An `/embeddings` answer as OpenAI writes it (indented by two spaces); `vectors` are JSON texts."""
    items = []
    for index in order if order is not None else range(len(vectors)):
        items.append(
            "    {\n"
            '      "object": "embedding",\n'
            f'      "index": {index},\n'
            f'      "embedding": {vectors[index]}\n'
            "    }"
        )
    return (
        "{\n"
        '  "object": "list",\n'
        '  "data": [\n' + ",\n".join(items) + "\n  ],\n"
        '  "model": "text-embedding-3-small",\n'
        '  "usage": {\n'
        f'    "prompt_tokens": {tokens},\n'
        f'    "total_tokens": {tokens}\n'
        "  }\n"
        "}\n"
    ).encode()


def float_json(vector: list[float]) -> str:
    return "[\n" + ",\n".join(f"        {value!r}" for value in vector) + "\n      ]"


FLOAT_BODY = openai_body([float_json(v) for v in FLOATS[:2]])
BASE64_BODY = openai_body([f'"{text}"' for text in BASE64[:2]])

# Ollama's /api/embed answer for two texts, as Ollama (Go) writes it.
OLLAMA_BODY = (
    b'{"model":"nomic-embed-text","embeddings":[[0.46294805,-0.20112087,0.85238844,0.13661417],'
    b"[-0.07119298,0.618739,0.33006746,-0.70933]],"
    b'"total_duration":41587125,"load_duration":1219042,"prompt_eval_count":12}'
)
OLLAMA_HEADERS = {"content-type": "application/json; charset=utf-8", "date": "Tue, 01 Dec 2026 10:00:00 GMT"}


def openai_model(script: Script, client: httpx.AsyncClient, **options: Any) -> OpenAIEmbeddingModel:
    options.setdefault("api_key", KEY)
    return OpenAIEmbeddingModel(base_url=BASE, client=client, **options)


async def embed_openai(script: Script, texts: list[str], **options: Any) -> list[list[float]]:
    async with httpx.AsyncClient(transport=script.transport()) as client:
        return await openai_model(script, client, **options).embed(texts)


def split_answer(texts_per_vector: dict[str, list[float]], order: str = "reversed") -> Any:
    """A handler embedding each text of a request by `texts_per_vector`, listing the items in
    reversed order (each with its index)."""

    def handler(request: httpx.Request) -> httpx.Response:
        texts = orjson.loads(request.content)["input"]
        indices = list(range(len(texts)))
        if order == "reversed":
            indices.reverse()
        data = [{"object": "embedding", "index": i, "embedding": texts_per_vector[texts[i]]} for i in indices]
        usage = {"prompt_tokens": len(texts), "total_tokens": len(texts)}
        return respond({"object": "list", "data": data, "model": "m", "usage": usage})

    return handler


# --- the request and the answer ---------------------------------------------------------------------


async def test_the_request_is_byte_exact_and_base64_is_asked_for_and_decoded() -> None:
    script = Script(respond(BASE64_BODY, headers=HEADERS))
    async with httpx.AsyncClient(transport=script.transport()) as client:
        model = openai_model(script, client, dimensions=4)
        result = await model.embed_with_usage(["The food was delicious.", "The waiter was rude."])
    assert result.vectors == VECTORS[:2]
    assert all(type(value) is float for vector in result.vectors for value in vector)
    assert (result.input_tokens, result.model) == (9, "text-embedding-3-small")
    [request] = script.requests
    assert request.method == "POST"
    assert str(request.url) == "https://api.openai.test/v1/embeddings"
    assert request.content == (
        b'{"model":"text-embedding-3-small","input":["The food was delicious.","The waiter was rude."],'
        b'"encoding_format":"base64","dimensions":4}'
    )
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["accept"] == "application/json"
    assert script.bodies[0].closed


async def test_float_vectors_are_asked_for_and_read() -> None:
    script = Script(respond(FLOAT_BODY, headers=HEADERS))
    vectors = await embed_openai(script, ["a", "b"], model="text-embedding-3-large", encoding_format="float")
    assert vectors == FLOATS[:2]
    assert script.requests[0].content == (
        b'{"model":"text-embedding-3-large","input":["a","b"],"encoding_format":"float"}'
    )


async def test_base64_is_smaller_on_the_wire_and_decodes_to_the_same_float32_values() -> None:
    base64_body = openai_body([f'"{text}"' for text in BASE64])
    float_body = openai_body([float_json(v) for v in FLOATS])
    assert len(base64_body) < 0.8 * len(float_body)
    from_base64 = await embed_openai(Script(respond(base64_body)), ["a", "b", "c"])
    from_floats = await embed_openai(Script(respond(float_body)), ["a", "b", "c"], encoding_format="float")
    assert from_base64 == VECTORS
    assert from_floats == FLOATS
    assert [array("f", v).tolist() for v in from_floats] == from_base64  # the same float32 values


async def test_a_server_that_ignores_encoding_format_is_read_too() -> None:
    # llama-cpp-python answers with JSON arrays whatever was asked; integers may appear among floats.
    body = {"object": "list", "data": [{"object": "embedding", "embedding": [0, 1.5, -2], "index": 0}]}
    assert await embed_openai(Script(respond(body)), ["x"]) == [[0.0, 1.5, -2.0]]


async def test_no_texts_make_no_request_and_one_str_is_refused() -> None:
    script = Script(respond(FLOAT_BODY))
    async with httpx.AsyncClient(transport=script.transport()) as client:
        model = openai_model(script, client)
        assert await model.embed([]) == []
        with pytest.raises(TypeError):
            await model.embed("one text")
    assert script.requests == []


async def test_the_models_implement_the_protocol_and_show_no_key() -> None:
    openai = OpenAIEmbeddingModel(base_url=BASE, api_key=KEY)
    ollama = OllamaEmbeddingModel("nomic-embed-text", base_url="ollama.test:11434")
    assert isinstance(openai, EmbeddingModel)
    assert isinstance(ollama, EmbeddingModel)
    assert (openai.name, ollama.name) == ("text-embedding-3-small", "nomic-embed-text")
    assert repr(openai) == (
        "OpenAIEmbeddingModel(model='text-embedding-3-small', endpoint='https://api.openai.test/v1/embeddings')"
    )
    assert ollama.endpoint == "http://ollama.test:11434/api/embed"
    assert KEY not in repr(openai) + repr(vars(openai))
    await openai.aclose()
    await ollama.aclose()


@pytest.mark.parametrize(
    "options",
    [{"batch_size": 0}, {"max_concurrency": 0}, {"model": ""}, {"base_url": "llm.test/v1"}],
)
def test_bad_configuration_is_refused(options: dict[str, Any]) -> None:
    options.setdefault("base_url", BASE)
    with pytest.raises(ConfigurationError):
        OpenAIEmbeddingModel(**options)


# --- batches ----------------------------------------------------------------------------------------


@pytest.mark.virtual_clock
async def test_batches_are_sent_concurrently_and_put_back_in_input_order() -> None:
    texts = [f"text {n}" for n in range(5)]
    table = {text: [float(n), 0.5] for n, text in enumerate(texts)}
    first_batch_may_answer = anyio.Event()
    answered = split_answer(table)

    async def handler(request: httpx.Request) -> httpx.Response:
        batch = orjson.loads(request.content)["input"]
        if batch[0] != "text 4":  # the last batch answers first
            await first_batch_may_answer.wait()
        else:
            await anyio.sleep(1)
            first_batch_may_answer.set()
        return answered(request)

    script = Script(handler)
    async with httpx.AsyncClient(transport=script.transport()) as client:
        model = openai_model(script, client, batch_size=2, max_concurrency=3)
        result = await model.embed_with_usage(texts)
    assert result.vectors == [[float(n), 0.5] for n in range(5)]
    assert result.input_tokens == 5
    assert sorted(body["input"][0] for body in script.sent) == ["text 0", "text 2", "text 4"]
    assert [len(body["input"]) for body in sorted(script.sent, key=lambda b: b["input"][0])] == [2, 2, 1]
    assert script.most_in_flight == 3
    assert all(body.closed for body in script.bodies)


@pytest.mark.virtual_clock
async def test_at_most_max_concurrency_requests_are_in_flight() -> None:
    texts = [f"t{n}" for n in range(10)]
    answered = split_answer({text: [1.0] for text in texts})

    async def slow(request: httpx.Request) -> httpx.Response:
        await anyio.sleep(1)
        return answered(request)

    script = Script(slow)
    assert await embed_openai(script, texts, batch_size=1, max_concurrency=3) == [[1.0]] * 10
    assert len(script.requests) == 10
    assert script.most_in_flight == 3


@pytest.mark.virtual_clock
async def test_a_failed_batch_cancels_the_others_and_raises_its_own_error() -> None:
    texts = [f"t{n}" for n in range(3)]
    hanging: list[Body] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if orjson.loads(request.content)["input"] == ["t1"]:
            return respond(load("37").body, 401, load("37").headers)
        response = respond(b'{"object": "list", "data": [', hang=True)  # a server that stalls mid-body
        assert isinstance(response.stream, Body)
        hanging.append(response.stream)
        return response

    with anyio.fail_after(60), pytest.raises(AuthenticationError) as info:  # not an exception group
        await embed_openai(Script(handler), texts, batch_size=1, max_concurrency=3)
    assert info.value.status == 401
    assert len(hanging) == 2
    assert all(body.closed for body in hanging)


async def test_batches_of_different_dimensions_are_a_response_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        [text] = orjson.loads(request.content)["input"]
        embedding = [1.0, 2.0] if text == "a" else [1.0, 2.0, 3.0]
        return respond({"data": [{"index": 0, "embedding": embedding}]})

    with pytest.raises(ModelResponseError) as info:
        await embed_openai(Script(handler), ["a", "b"], batch_size=1)
    assert "different dimensions: [2, 3]" in str(info.value)


# --- retries ----------------------------------------------------------------------------------------


RATE_LIMITED = rate_limited("text-embedding-3-small")


@pytest.mark.virtual_clock
async def test_a_429_is_retried_after_its_retry_after_with_the_same_body() -> None:
    events: list[Any] = []
    script = Script(respond(RATE_LIMITED, 429, {"retry-after": "2"}), respond(FLOAT_BODY, headers=HEADERS))
    vectors = await embed_openai(
        script, ["a", "b"], encoding_format="float", on_error=events.append, on_response=events.append
    )
    assert vectors == FLOATS[:2]
    assert len(script.requests) == 2
    assert script.waits == [pytest.approx(2.0)]
    assert script.requests[0].content == script.requests[1].content
    assert [type(e).__name__ for e in events] == ["HttpErrorEvent", "HttpResponseEvent"]
    assert events[0].will_retry and events[0].delay == 2
    assert events[1].request_id == HEADERS["x-request-id"]


@pytest.mark.virtual_clock
@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_are_retried_with_backoff_then_raised(status: int) -> None:
    script = Script(lambda request: respond(SERVER_ERROR, status))
    policy = RetryPolicy(max_attempts=3, initial_delay=1.0, jitter=0)
    with pytest.raises(ServerError) as info:
        await embed_openai(script, ["a"], retry=policy)
    assert info.value.status == status
    assert script.waits == [pytest.approx(1.0), pytest.approx(2.0)]


@pytest.mark.virtual_clock
async def test_ollama_is_retried_the_same_way() -> None:
    busy = b'{"error":"server busy, please try again.  maximum pending requests exceeded"}'
    script = Script(
        respond(busy, 503, {"retry-after-ms": "1500"}), respond(OLLAMA_BODY, headers=OLLAMA_HEADERS)
    )
    async with httpx.AsyncClient(transport=script.transport()) as client:
        model = OllamaEmbeddingModel("nomic-embed-text", base_url=OLLAMA, client=client)
        assert await model.embed(["a", "b"]) == FLOATS[:2]
    assert script.waits == [pytest.approx(1.5)]


@pytest.mark.virtual_clock
async def test_nothing_is_retried_after_a_2xx() -> None:
    script = Script(lambda request: respond(b'{"object": "list", "data": []}'))
    with pytest.raises(ModelResponseError):
        await embed_openai(script, ["a"])
    assert len(script.requests) == 1

    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self) -> Any:
            yield b'{"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1'
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    script = Script(lambda request: httpx.Response(200, headers=HEADERS, stream=Broken()))
    with pytest.raises(ModelConnectionError) as info:
        await embed_openai(script, ["a"])
    assert info.value.mid_stream
    assert len(script.requests) == 1


# --- errors -----------------------------------------------------------------------------------------


INVALID_INPUT = (
    b"{\n"
    b'  "error": {\n'
    b'    "message": "\'$.input\' is invalid. Please check the API reference: '
    b'https://platform.openai.com/docs/api-reference.",\n'
    b'    "type": "invalid_request_error",\n'
    b'    "param": null,\n'
    b'    "code": null\n'
    b"  }\n"
    b"}\n"
)
TOO_LONG = (
    b"{\n"
    b'  "error": {\n'
    b'    "message": "This model\'s maximum context length is 8192 tokens, however you requested 8693 '
    b"tokens (8693 in your prompt; 0 for the completion). "
    b'Please reduce your prompt; or completion length.",\n'
    b'    "type": "invalid_request_error",\n'
    b'    "param": null,\n'
    b'    "code": null\n'
    b"  }\n"
    b"}\n"
)


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (400, INVALID_INPUT, BadRequestError),
        (400, TOO_LONG, ContextLengthExceededError),
        (401, load("37").body, AuthenticationError),
        (404, load("38").body, ModelNotFoundError),
        (429, RATE_LIMITED, RateLimitError),
        (500, SERVER_ERROR, ServerError),
    ],
)
async def test_error_statuses_map_to_their_kinds(status: int, body: bytes, kind: type[ModelError]) -> None:
    errors: list[Any] = []
    script = Script(respond(body, status, {"x-request-id": "req_e1"}))
    with pytest.raises(kind) as info:
        await embed_openai(script, ["a"], retry=RetryPolicy.never(), on_error=errors.append)
    check_error(info.value, kind, body, status=status, endpoint=f"{BASE}/embeddings", reported=errors)


async def test_ollama_errors_map_to_their_kinds() -> None:
    cassette = load("47")  # {"error":"model 'nonexistent-model:latest' not found"}
    script = Script(respond(cassette.body, 404))
    async with httpx.AsyncClient(transport=script.transport()) as client:
        model = OllamaEmbeddingModel("nonexistent-model", base_url=OLLAMA, client=client)
        with pytest.raises(ModelNotFoundError) as info:
            await model.embed(["a"])
    assert info.value.message == "model 'nonexistent-model:latest' not found"


async def test_the_key_reaches_no_error_no_event_and_no_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    events: list[Any] = []
    script = Script(echoing_key(KEY))
    async with httpx.AsyncClient(transport=script.transport()) as client:
        model = openai_model(script, client, on_request=events.append, on_error=events.append)
        with pytest.raises(AuthenticationError) as info:
            await model.embed(["a"])
    assert script.requests[0].headers["authorization"] == f"Bearer {KEY}"  # sent, only there
    assert info.value.message == "Incorrect API key provided: ***."
    assert key_shown(KEY, info.value, model, caplog.text, *events) == []


# --- cancellation -----------------------------------------------------------------------------------


@pytest.mark.virtual_clock
async def test_cancelling_while_the_body_arrives_closes_the_response() -> None:
    script = Script(respond(b'{"object": "list", "data": [', hang=True))
    async with httpx.AsyncClient(transport=script.transport()) as client:
        model = openai_model(script, client)
        with anyio.move_on_after(5) as scope:
            await model.embed(["a"])
        # No await between the cancellation unwinding and this line: closed within the same turn.
        [body] = script.bodies
        assert body.closed
    assert scope.cancelled_caught


@pytest.mark.virtual_clock
async def test_cancelling_during_a_retry_wait_sends_nothing_more() -> None:
    script = Script(respond(RATE_LIMITED, 429, {"retry-after": "30"}), respond(FLOAT_BODY))
    async with httpx.AsyncClient(transport=script.transport()) as client:
        model = openai_model(script, client)
        with anyio.move_on_after(10) as scope:
            await model.embed(["a"])
    assert scope.cancelled_caught
    assert len(script.requests) == 1
    assert script.bodies[0].closed


@pytest.mark.virtual_clock
async def test_cancelling_concurrent_batches_closes_every_response() -> None:
    script = Script(lambda request: respond(b'{"object": "list", "data": [', hang=True))
    async with httpx.AsyncClient(transport=script.transport()) as client:
        model = openai_model(script, client, batch_size=1, max_concurrency=4)
        with anyio.move_on_after(5) as scope:
            await model.embed(["a", "b", "c", "d", "e"])
        assert len(script.bodies) == 4  # the fifth batch waited for a free slot and never went out
        assert all(body.closed for body in script.bodies)
    assert scope.cancelled_caught


# --- malformed answers ------------------------------------------------------------------------------


def item(index: Any, embedding: Any) -> dict[str, Any]:
    return {"object": "embedding", "index": index, "embedding": embedding}


@pytest.mark.parametrize(
    ("body", "found"),
    [
        (b"", "not JSON"),
        (b"<html><body>502 Bad Gateway</body></html>", "not JSON"),
        (b"[]", "the response is a list, not an object"),
        (b'{"object": "list"}', "`data` is null, not a list"),
        (orjson.dumps({"data": []}), "0 embeddings for 2 inputs"),
        (orjson.dumps({"data": [item(0, [1.0])]}), "1 embeddings for 2 inputs"),
        (orjson.dumps({"data": [item(0, [1.0]), item(0, [2.0])]}), "two embeddings have the index 0"),
        (orjson.dumps({"data": [item(0, [1.0]), item(2, [2.0])]}), "index is 2, not one of 0 to 1"),
        (orjson.dumps({"data": [item(0, [1.0]), item("1", [2.0])]}), "index is a string"),
        (orjson.dumps({"data": [item(0, [1.0]), item(1, [])]}), "an embedding is empty"),
        (orjson.dumps({"data": [item(0, [1.0]), item(1, ["1.0"])]}), "holds a string, not only numbers"),
        (orjson.dumps({"data": [item(0, [1.0]), item(1, None)]}), "an embedding is null"),
        (orjson.dumps({"data": [item(0, [1.0]), item(1, [1.0, 2.0])]}), "different dimensions: [1, 2]"),
        (orjson.dumps({"data": [item(0, "AACAPw=="), item(1, "not base64!")]}), "not base64"),
        (orjson.dumps({"data": [item(0, "AACAPw=="), item(1, "AACA")]}), "3 bytes, not a multiple of 4"),
        (orjson.dumps({"data": [item(0, [1.0]), "x"]}), "an item of `data` is a string"),
    ],
)
async def test_malformed_answers_are_response_errors(body: bytes, found: str) -> None:
    errors: list[Any] = []
    script = Script(lambda request: respond(body, headers={"x-request-id": "req_m1"}))
    with pytest.raises(ModelResponseError) as info:
        await embed_openai(script, ["a", "b"], on_error=errors.append)
    error = info.value
    assert found in str(error)
    assert error.body == (body.decode() or None)
    assert error.request_id == "req_m1"
    assert not error.mid_stream
    assert [event.error for event in errors] == [error]
    assert len(script.requests) == 1  # never retried


async def test_an_error_object_in_a_2xx_answer_is_raised_as_its_kind() -> None:
    body = orjson.dumps({"error": {"message": "Rate limit exceeded", "type": "rate_limit_error"}})
    with pytest.raises(RateLimitError):
        await embed_openai(Script(respond(body)), ["a"])


async def test_a_key_in_a_malformed_answer_is_scrubbed() -> None:
    body = orjson.dumps({"data": [item(0, [1.0, KEY])]})
    with pytest.raises(ModelResponseError) as info:
        await embed_openai(Script(respond(body)), ["a"])
    assert KEY not in str(info.value) + (info.value.body or "") + repr(vars(info.value))


# --- Ollama -----------------------------------------------------------------------------------------


async def test_ollama_request_and_answer_are_byte_exact() -> None:
    script = Script(respond(OLLAMA_BODY, headers=OLLAMA_HEADERS))
    async with httpx.AsyncClient(transport=script.transport()) as client:
        model = OllamaEmbeddingModel(
            "nomic-embed-text",
            base_url=OLLAMA,
            client=client,
            truncate=False,
            keep_alive="10m",
            dimensions=4,
        )
        result = await model.embed_with_usage(["Why is the sky blue?", "Why is the grass green?"])
    assert result.vectors == FLOATS[:2]
    assert (result.input_tokens, result.model) == (12, "nomic-embed-text")
    [request] = script.requests
    assert str(request.url) == "http://ollama.test:11434/api/embed"
    assert request.content == (
        b'{"model":"nomic-embed-text","input":["Why is the sky blue?","Why is the grass green?"],'
        b'"truncate":false,"keep_alive":"10m","dimensions":4}'
    )
    assert "authorization" not in request.headers
    assert script.bodies[0].closed


async def test_ollama_batches_keep_the_input_order() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        texts = orjson.loads(request.content)["input"]
        return respond({"model": "m", "embeddings": [[float(t)] for t in texts], "prompt_eval_count": 1})

    script = Script(handler)
    async with httpx.AsyncClient(transport=script.transport()) as client:
        model = OllamaEmbeddingModel("m", base_url=OLLAMA, client=client, batch_size=3)
        result = await model.embed_with_usage([str(n) for n in range(7)])
    assert result.vectors == [[float(n)] for n in range(7)]
    assert result.input_tokens == 3
    assert sorted(script.sent, key=lambda body: body["input"]) == [
        {"model": "m", "input": ["0", "1", "2"]},
        {"model": "m", "input": ["3", "4", "5"]},
        {"model": "m", "input": ["6"]},
    ]


@pytest.mark.parametrize(
    ("body", "found"),
    [
        (b'{"model":"m"}', "`embeddings` is null, not a list"),
        (b'{"model":"m","embeddings":[[1.0]]}', "1 embeddings for 2 inputs"),
        (b'{"model":"m","embeddings":[[1.0],[1.0,2.0]]}', "different dimensions"),
        (b'{"model":"m","embeddings":[[1.0],{"x":1}]}', "an embedding is an object"),
    ],
)
async def test_malformed_ollama_answers_are_response_errors(body: bytes, found: str) -> None:
    script = Script(respond(body))
    async with httpx.AsyncClient(transport=script.transport()) as client:
        model = OllamaEmbeddingModel("m", base_url=OLLAMA, client=client)
        with pytest.raises(ModelResponseError) as info:
            await model.embed(["a", "b"])
    assert found in str(info.value)
