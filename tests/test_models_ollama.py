"""`OllamaChatModel`: the native `/api/chat` request and its NDJSON (or JSON) answer."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import orjson
import pytest
from cassettes import Parts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agentrt import (
    AgentError,
    AssistantMessage,
    BadRequestError,
    FinishReason,
    ImageContent,
    ModelRequest,
    ModelResponseError,
    ModelSettings,
    PdfContent,
    ServerError,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from agentrt.models import (
    JsonObjectFormat,
    JsonSchemaFormat,
    ModelChunk,
    OllamaChatModel,
    RetryPolicy,
    ToolSpec,
    complete,
)

Handler = Callable[[httpx.Request], httpx.Response]
REQUEST = ModelRequest(messages=(UserMessage.of("hi"),))


def ndjson(*objects: dict[str, Any]) -> bytes:
    return b"".join(orjson.dumps(o) + b"\n" for o in objects)


def line(content: str = "", **extra: Any) -> dict[str, Any]:
    return {"model": "qwen3", "message": {"role": "assistant", "content": content, **extra}, "done": False}


def last(reason: str = "stop", **counts: Any) -> dict[str, Any]:
    return {
        "model": "qwen3",
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": reason,
        **counts,
    }


def responder(body: bytes, content_type: str = "application/x-ndjson", status: int = 200) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"content-type": content_type}, stream=Parts([body]))

    return handler


async def run(
    handler: Handler, request: ModelRequest = REQUEST, **options: Any
) -> tuple[Any, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def recording(http_request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(http_request.content))
        return handler(http_request)

    options.setdefault("retry", RetryPolicy.never())
    async with httpx.AsyncClient(transport=httpx.MockTransport(recording)) as client:
        model = OllamaChatModel("qwen3", base_url="http://ollama.test:11434", client=client, **options)
        return await complete(model, request), sent


async def chunks_of(handler: Handler, **options: Any) -> list[ModelChunk]:
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OllamaChatModel("qwen3", base_url="http://ollama.test:11434", client=client, **options)
        stream = model.stream(REQUEST)
        try:
            return [c async for c in stream]
        finally:
            await stream.aclose()  # type: ignore[attr-defined]


async def read_into(chunks: list[ModelChunk], model: OllamaChatModel) -> None:
    async for item in model.stream(REQUEST):
        chunks.append(item)


OK = responder(ndjson(line("ok"), last(prompt_eval_count=3, eval_count=1)))


async def test_messages_map_to_ollama_messages() -> None:
    jpeg = ImageContent.from_bytes(b"\xff\xd8", "image/jpeg")
    as_data_url = ImageContent.from_url("data:image/png;base64,iVBOR")
    request = ModelRequest(
        messages=(
            SystemMessage(text="Be brief."),
            UserMessage.of("What is on", jpeg, "these images?", as_data_url),
            AssistantMessage(
                text=None,
                thinking="look up the weather",
                tool_calls=(ToolCall(id="call_1", name="weather", arguments='{"city": "Paris"}'),),
            ),
            ToolResultMessage(tool_call_id="call_1", tool_name="weather", text="sunny"),
        )
    )
    _, sent = await run(OK, request)
    assert sent[0]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": "What is on\nthese images?",
            "images": [base64.b64encode(b"\xff\xd8").decode(), "iVBOR"],
        },
        {
            "role": "assistant",
            "content": "",
            "thinking": "look up the weather",
            "tool_calls": [{"id": "call_1", "function": {"name": "weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny", "tool_name": "weather", "tool_call_id": "call_1"},
    ]
    assert sent[0]["stream"] is True
    assert sent[0]["model"] == "qwen3"


@pytest.mark.parametrize(
    "content",
    [ImageContent.from_url("https://img.test/cat.png"), PdfContent.from_bytes(b"%PDF", "application/pdf")],
)
async def test_contents_ollama_cannot_take_raise(content: Any) -> None:
    with pytest.raises(BadRequestError):
        await run(OK, ModelRequest(messages=(UserMessage.of("x", content),)))


async def test_options_tools_format_think_keep_alive() -> None:
    class City(BaseModel):
        name: str

    tool = ToolSpec("weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}}})
    request = ModelRequest(
        messages=(UserMessage.of("hi"),),
        tools=(tool,),
        tool_choice="auto",
        response_format=JsonSchemaFormat(name="City", schema=City.model_json_schema()),
        settings=ModelSettings(max_tokens=64, stop=("END",)),
    )
    _, sent = await run(
        OK,
        request,
        settings=ModelSettings(temperature=0.0, seed=42, top_p=0.5),
        think="high",
        keep_alive="5m",
    )
    body = sent[0]
    assert body["options"] == {
        "temperature": 0.0,
        "num_predict": 64,
        "top_p": 0.5,
        "seed": 42,
        "stop": ["END"],
    }
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "weather", "description": "Weather", "parameters": dict(tool.parameters)},
        }
    ]
    assert body["format"] == City.model_json_schema()
    assert body["think"] == "high"
    assert body["keep_alive"] == "5m"
    _, sent = await run(OK, ModelRequest(messages=request.messages, response_format=JsonObjectFormat()))
    assert sent[0]["format"] == "json"
    assert "options" not in sent[0]


async def test_tool_choice_none_sends_no_tools_and_forcing_is_refused() -> None:
    tools = (ToolSpec("weather", "Weather"),)
    _, sent = await run(OK, ModelRequest(messages=REQUEST.messages, tools=tools, tool_choice="none"))
    assert "tools" not in sent[0]
    with pytest.raises(BadRequestError, match="cannot force"):
        await run(OK, ModelRequest(messages=REQUEST.messages, tools=tools, tool_choice="required"))
    assert not OllamaChatModel("m", base_url="http://o.test").capabilities.tool_choice_required


def test_base_url_from_ollama_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_HOST", "0.0.0.0:11500")
    assert OllamaChatModel("m").endpoint == "http://0.0.0.0:11500/api/chat"
    monkeypatch.delenv("OLLAMA_HOST")
    assert OllamaChatModel("m").endpoint == "http://localhost:11434/api/chat"


async def test_thinking_text_tool_calls_usage_and_finish() -> None:
    body = ndjson(
        line(thinking="Need the weather."),
        line(tool_calls=[{"function": {"name": "weather", "arguments": {"city": "Paris"}}}]),
        line(tool_calls=[{"id": "call_b", "function": {"name": "time", "arguments": {}}}]),
        last("stop", prompt_eval_count=30, eval_count=12),
    )
    response, _ = await run(responder(body))
    assert response.message.thinking == "Need the weather."
    calls = [(c.id, c.name, c.arguments) for c in response.message.tool_calls]
    assert calls == [("call_0", "weather", '{"city":"Paris"}'), ("call_b", "time", "{}")]
    assert response.usage == Usage(30, 12)
    assert response.finish_reason is FinishReason.TOOL_CALLS
    assert response.model == "qwen3"
    assert response.id is None


async def test_missing_counts() -> None:
    # A fully cached prompt: Ollama omits prompt_eval_count; the input side is estimated.
    response, _ = await run(responder(ndjson(line("hello"), last("length", eval_count=9))))
    assert response.usage.output_tokens == 9
    assert response.usage.estimated
    assert response.usage.input_tokens > 0
    assert response.finish_reason is FinishReason.LENGTH
    chunks = await chunks_of(responder(ndjson(line("hello"), last())))
    assert not any(isinstance(c, Usage) for c in chunks)  # no counts at all: nothing made up


async def test_think_tags_in_content() -> None:
    body = ndjson(
        line("<thi"), line("nk>plan</th"), line("ink>\n\nDone."), last(eval_count=1, prompt_eval_count=1)
    )
    response, _ = await run(responder(body))
    assert (response.message.thinking, response.message.text) == ("plan", "Done.")


async def test_a_non_streaming_json_answer() -> None:
    body = orjson.dumps(
        {**last(prompt_eval_count=5, eval_count=2), "message": {"role": "assistant", "content": "Hi!"}}
    )
    response, sent = await run(responder(body, "application/json; charset=utf-8"), streaming=False)
    assert sent[0]["stream"] is False
    assert response.message.text == "Hi!"
    assert response.usage == Usage(5, 2)


async def test_an_error_line_inside_the_stream() -> None:
    body = ndjson(line("partial")) + b'{"error":"an error was encountered while running the model"}\n'
    async with httpx.AsyncClient(transport=httpx.MockTransport(responder(body))) as client:
        model = OllamaChatModel("qwen3", base_url="http://ollama.test:11434", client=client)
        seen: list[ModelChunk] = []
        with pytest.raises(ServerError) as info:
            await read_into(seen, model)
    assert info.value.mid_stream
    assert "while running the model" in info.value.message
    assert [getattr(c, "text", None) for c in seen][1:] == ["partial"]


@pytest.mark.parametrize(
    ("body", "content_type", "streaming"),
    [
        (ndjson(line("cut")), "application/x-ndjson", True),  # no done: true
        (b"{not json}\n", "application/x-ndjson", True),
        (b"[]\n", "application/x-ndjson", True),
        (orjson.dumps(line("not done")), "application/json", False),
    ],
)
async def test_unreadable_answers_are_typed_errors(body: bytes, content_type: str, streaming: bool) -> None:
    with pytest.raises(ModelResponseError) as info:
        await run(responder(body, content_type), streaming=streaming)
    assert info.value.mid_stream is streaming


async def test_blank_lines_are_skipped() -> None:
    body = b"\r\n" + ndjson(line("a")) + b"  \n\n" + ndjson(last(eval_count=1, prompt_eval_count=1))
    response, _ = await run(responder(body))
    assert response.message.text == "a"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(
        st.binary(max_size=300),
        st.lists(
            st.sampled_from(
                [
                    b"{",
                    b"}",
                    b'"message"',
                    b":",
                    b'"done"',
                    b"true",
                    b"\n",
                    b'"error"',
                    b'"content"',
                    b'"x"',
                    b",",
                    b"null",
                    b"\xc3",
                ]
            ),
            max_size=40,
        ).map(b"".join),
    ),
    streaming=st.booleans(),
)
async def test_any_body_ends_in_chunks_or_an_agentrt_error(body: bytes, streaming: bool) -> None:
    with anyio.fail_after(10):
        try:
            await run(
                responder(body, "application/x-ndjson" if streaming else "application/json"),
                streaming=streaming,
            )
        except AgentError:
            pass
