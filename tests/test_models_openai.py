"""`OpenAIChatModel`: what it sends, how it reads what comes back, and its configuration."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import orjson
import pytest
from cassettes import Parts, load
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agentrt import (
    AgentError,
    AssistantMessage,
    AudioContent,
    BadRequestError,
    Capabilities,
    ConfigurationError,
    FinishReason,
    ImageContent,
    ModelRequest,
    ModelResponseError,
    ModelSettings,
    PdfContent,
    SystemMessage,
    TextContent,
    ThinkingDelta,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    VideoContent,
)
from agentrt.models import (
    JsonObjectFormat,
    JsonSchemaFormat,
    ModelChunk,
    OpenAIChatModel,
    RetryPolicy,
    ToolSpec,
    complete,
)
from agentrt.models._schema import strict_schema
from agentrt.models.openai import DEFAULT_CAPABILITIES

Handler = Callable[[httpx.Request], httpx.Response]


def sse(*payloads: Any, done: bool = True) -> bytes:
    events = [b"data: " + (p if isinstance(p, bytes) else orjson.dumps(p)) + b"\n\n" for p in payloads]
    return b"".join(events) + (b"data: [DONE]\n\n" if done else b"")


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "chatcmpl-1", "model": "m-1", "choices": choices, **extra}


def responder(body: bytes, content_type: str = "text/event-stream", status: int = 200) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"content-type": content_type}, stream=Parts([body]))

    return handler


async def run(
    handler: Handler, request: ModelRequest | None = None, **options: Any
) -> tuple[list[ModelChunk], list[dict[str, Any]]]:
    """The chunks the model yields for `request`, and the JSON bodies it sent."""
    sent: list[dict[str, Any]] = []

    def recording(http_request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(http_request.content))
        return handler(http_request)

    options.setdefault("retry", RetryPolicy.never())
    async with httpx.AsyncClient(transport=httpx.MockTransport(recording)) as client:
        model = OpenAIChatModel("gpt-test", base_url="https://llm.test/v1", client=client, **options)
        chunks: list[ModelChunk] = []
        stream = model.stream(request or ModelRequest(messages=(UserMessage.of("hi"),)))
        try:
            async for item in stream:
                chunks.append(item)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
    return chunks, sent


async def body_for(request: ModelRequest, **options: Any) -> dict[str, Any]:
    _, sent = await run(responder(sse(chunk({"content": "ok"}, "stop"))), request, **options)
    return sent[0]


# --- request ----------------------------------------------------------------------------------------


async def test_messages_map_to_chat_completions_roles() -> None:
    request = ModelRequest(
        messages=(
            SystemMessage(text="Be brief."),
            UserMessage.of("What is the weather in Paris?"),
            AssistantMessage(
                tool_calls=(ToolCall(id="call_1", name="weather", arguments='{"city": "Paris"}'),)
            ),
            ToolResultMessage(tool_call_id="call_1", tool_name="weather", text="sunny"),
            AssistantMessage(text="Sunny.", thinking="(not sent)"),
            UserMessage(contents=(TextContent(text="thanks"),), name="ann"),
        )
    )
    body = await body_for(request)
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",  # no "content": some compatible servers reject null
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "thanks", "name": "ann"},
    ]
    assert body["model"] == "gpt-test"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


async def test_user_contents_map_to_content_parts() -> None:
    png = ImageContent.from_bytes(b"\x89PNG", "image/png", detail="low")
    wav = AudioContent.from_bytes(b"RIFF", "audio/wav")
    pdf = PdfContent.from_bytes(b"%PDF", "application/pdf", filename="a.pdf")
    request = ModelRequest(
        messages=(UserMessage.of("look", png, ImageContent.from_url("https://img.test/cat.jpg"), wav, pdf),)
    )
    body = await body_for(request)
    png64, wav64, pdf64 = (base64.b64encode(b).decode() for b in (b"\x89PNG", b"RIFF", b"%PDF"))
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png64}", "detail": "low"}},
        {"type": "image_url", "image_url": {"url": "https://img.test/cat.jpg"}},
        {"type": "input_audio", "input_audio": {"data": wav64, "format": "wav"}},
        {"type": "file", "file": {"filename": "a.pdf", "file_data": f"data:application/pdf;base64,{pdf64}"}},
    ]


@pytest.mark.parametrize(
    "content",
    [
        VideoContent.from_url("https://v.test/a.mp4"),
        AudioContent.from_url("https://a.test/a.wav"),
        PdfContent.from_url("https://p.test/a.pdf"),
    ],
)
async def test_contents_without_a_wire_form_raise_before_sending(content: Any) -> None:
    request = ModelRequest(messages=(UserMessage.of("x", content),))
    with pytest.raises(BadRequestError):
        await run(responder(b""), request)


async def test_settings_merge_and_map_to_request_fields() -> None:
    request = ModelRequest(
        messages=(UserMessage.of("hi"),),
        settings=ModelSettings(temperature=0.2, stop=("END",)),
    )
    defaults = ModelSettings(temperature=1.0, max_tokens=50, top_p=0.9, seed=7, presence_penalty=0.1)
    body = await body_for(request, settings=defaults)
    assert {
        k: body[k] for k in ("temperature", "max_tokens", "top_p", "seed", "stop", "presence_penalty")
    } == {
        "temperature": 0.2,
        "max_tokens": 50,
        "top_p": 0.9,
        "seed": 7,
        "stop": ["END"],
        "presence_penalty": 0.1,
    }
    body = await body_for(request, settings=defaults, max_tokens_field="max_completion_tokens")
    assert body["max_completion_tokens"] == 50
    assert "max_tokens" not in body


async def test_tools_and_tool_choice() -> None:
    closed = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    open_ = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = (
        ToolSpec("weather", "Weather in a city", closed, strict=True),
        ToolSpec("search", "Search", open_, strict=True),
        ToolSpec("time", "The time"),
    )
    messages = (UserMessage.of("hi"),)
    body = await body_for(
        ModelRequest(messages=messages, tools=tools, tool_choice="required"), parallel_tool_calls=False
    )
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Weather in a city",
                "strict": True,
                "parameters": {**closed, "additionalProperties": False},
            },
        },
        # An optional property cannot be strict without changing the tool: sent as declared.
        {"type": "function", "function": {"name": "search", "description": "Search", "parameters": open_}},
        {
            "type": "function",
            "function": {
                "name": "time",
                "description": "The time",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    ]
    assert body["tool_choice"] == "required"
    assert body["parallel_tool_calls"] is False
    body = await body_for(ModelRequest(messages=messages, tools=tools, tool_choice="weather"))
    assert body["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert "parallel_tool_calls" not in body
    assert "tools" not in await body_for(ModelRequest(messages=messages, tool_choice="auto"))


class Strict(BaseModel):
    city: str
    days: list[int]


class Loose(BaseModel):
    city: str
    note: str | None = None


async def test_json_schema_is_strict_only_when_the_schema_allows() -> None:
    messages = (UserMessage.of("hi"),)
    fmt = JsonSchemaFormat(name="Strict answer!", schema=Strict.model_json_schema())
    body = await body_for(ModelRequest(messages=messages, response_format=fmt))
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "Strict_answer_",
            "strict": True,
            "schema": {**Strict.model_json_schema(), "additionalProperties": False},
        },
    }
    fmt = JsonSchemaFormat(name="Loose", schema=Loose.model_json_schema())
    body = await body_for(ModelRequest(messages=messages, response_format=fmt))
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Loose", "schema": Loose.model_json_schema()},
    }
    body = await body_for(ModelRequest(messages=messages, response_format=JsonObjectFormat()))
    assert body["response_format"] == {"type": "json_object"}
    with_schema = JsonObjectFormat(schema=Loose.model_json_schema())
    body = await body_for(ModelRequest(messages=messages, response_format=with_schema))
    assert body["response_format"] == {"type": "json_object"}
    body = await body_for(
        ModelRequest(messages=messages, response_format=with_schema), json_object_schema=True
    )
    assert body["response_format"] == {"type": "json_object", "schema": Loose.model_json_schema()}


def test_strict_schema_rules() -> None:
    assert strict_schema({"type": "object", "properties": {}}) == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    assert strict_schema({"type": "object"}) is None  # a free-form mapping
    assert strict_schema({"type": "object", "additionalProperties": {"type": "integer"}}) is None
    nested = {
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
        "required": ["items"],
        "$defs": {"Item": {"type": "object", "properties": {"x": {"type": "integer"}}}},
    }
    assert strict_schema(nested) is None  # Item.x is optional
    nested["$defs"]["Item"]["required"] = ["x"]  # type: ignore[index]
    strict = strict_schema(nested)
    assert strict is not None
    assert strict["$defs"]["Item"]["additionalProperties"] is False
    assert "additionalProperties" not in nested  # the input is not modified


@pytest.mark.parametrize("number", ["15", "16"])
async def test_structured_output_request_matches_the_recorded_one(number: str) -> None:
    # The recorded request came from the OpenAI SDK's `parse` for the same pydantic models.
    recorded = load(number).request_body
    fmt = recorded["response_format"]["json_schema"]
    schema = {k: v for k, v in fmt["schema"].items()}

    def without_extra(node: Any) -> Any:  # the user's pydantic schema, before strictness was added
        if isinstance(node, dict):
            return {k: without_extra(v) for k, v in node.items() if k != "additionalProperties"}
        return node

    request = ModelRequest(
        messages=(UserMessage.of("q"),),
        response_format=JsonSchemaFormat(name=fmt["name"], schema=without_extra(schema)),
    )
    body = await body_for(request)
    assert body["response_format"] == recorded["response_format"]


async def test_tool_round_trip_request_matches_the_recorded_one() -> None:
    recorded = load("09").request_body
    turn = recorded["messages"]
    calls = tuple(
        ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
        for c in turn[0]["tool_calls"]
    )
    names = {c.id: c.name for c in calls}
    request = ModelRequest(
        messages=(
            AssistantMessage(tool_calls=calls),
            *(
                ToolResultMessage(
                    tool_call_id=m["tool_call_id"], tool_name=names[m["tool_call_id"]], text=m["content"]
                )
                for m in turn[1:3]
            ),
            AssistantMessage(text=turn[3]["content"]),
            UserMessage.of(turn[4]["content"]),
        ),
        tools=tuple(
            ToolSpec(t["function"]["name"], t["function"]["description"], t["function"]["parameters"])
            for t in recorded["tools"]
        ),
    )
    body = await body_for(request, capabilities=Capabilities(usage_in_stream=False))
    sent = [{k: v for k, v in m.items() if v is not None} for m in body["messages"]]
    assert sent == turn
    assert body["tools"] == recorded["tools"]


async def test_stream_options_follow_the_capability_and_streaming_can_be_off() -> None:
    request = ModelRequest(messages=(UserMessage.of("hi"),))
    body = await body_for(request, capabilities=Capabilities(usage_in_stream=False))
    assert body["stream"] is True
    assert "stream_options" not in body
    completion = load("01").body
    _, sent = await run(responder(completion, "application/json"), request, streaming=False)
    assert sent[0]["stream"] is False
    assert "stream_options" not in sent[0]


async def test_extra_body_headers_and_system_role() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return responder(sse(chunk({"content": "ok"}, "stop")))(request)

    request = ModelRequest(messages=(SystemMessage(text="rules"), UserMessage.of("hi")))
    _, sent = await run(
        handler,
        request,
        extra_body={"top_k": 5},
        headers={"X-Team": "a"},
        system_role="developer",
        api_key="sk-abc",
    )
    assert sent[0]["top_k"] == 5
    assert sent[0]["messages"][0] == {"role": "developer", "content": "rules"}
    assert seen[0].headers["x-team"] == "a"
    assert seen[0].headers["authorization"] == "Bearer sk-abc"
    assert seen[0].headers["content-type"] == "application/json"


async def test_configuration_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://env.test:8000/v1/")
    model = OpenAIChatModel("m")
    assert model.endpoint == "http://env.test:8000/v1/chat/completions"
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("OPENAI_BASE_URL")
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return responder(sse(chunk({"content": "ok"}, "stop")))(request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        local = OpenAIChatModel("m", client=client)
        assert local.endpoint == "https://api.openai.com/v1/chat/completions"
        await complete(local, ModelRequest(messages=(UserMessage.of("hi"),)))
    assert "authorization" not in seen[0].headers  # no key: local servers need none


def test_capabilities_default_and_override() -> None:
    assert OpenAIChatModel("m", base_url="http://x.test").capabilities == DEFAULT_CAPABILITIES
    assert DEFAULT_CAPABILITIES.json_schema and DEFAULT_CAPABILITIES.image_input
    own = Capabilities(json_schema=False, usage_in_stream=False)
    # The adapter declares what describes its own code, whatever the given capabilities say: it stops
    # at deadlines itself. It names its API as the provider where they name none.
    declared = OpenAIChatModel("m", base_url="http://x.test", capabilities=own).capabilities
    assert declared == dataclasses.replace(own, handles_deadline=True, provider="openai")
    groq = dataclasses.replace(DEFAULT_CAPABILITIES, provider="groq")
    assert OpenAIChatModel("m", base_url="http://x.test", capabilities=groq).capabilities is groq


@pytest.mark.parametrize("base_url", ["not a url", "ftp://x.test/v1", "localhost:8000"])
def test_bad_configuration_is_rejected_up_front(base_url: str) -> None:
    with pytest.raises(ConfigurationError):
        OpenAIChatModel("m", base_url=base_url)


def test_a_model_name_is_required() -> None:
    with pytest.raises(ConfigurationError):
        OpenAIChatModel("", base_url="http://x.test")


# --- response -------------------------------------------------------------------------------------


async def test_reasoning_fields_become_thinking() -> None:
    body = sse(
        chunk({"role": "assistant", "reasoning_content": "Let me "}),
        chunk({"reasoning": "think."}),
        chunk({"content": "Answer"}, "stop"),
    )
    response = await complete_with(responder(body))
    assert response.message.thinking == "Let me think."
    assert response.message.text == "Answer"


async def test_content_given_as_parts() -> None:
    parts = [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Hi"}, {"type": "image"}]
    response = await complete_with(responder(sse(chunk({"content": parts}, "stop"))))
    assert (response.message.thinking, response.message.text) == ("hmm", "Hi")


THINK = "<think>\nStep 1: add.\n</think>\n\nThe sum is 4."


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(1, len(THINK) - 1), unique=True, max_size=6))
async def test_think_tags_split_anywhere_become_thinking(cuts: list[int]) -> None:
    pieces = [THINK[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(THINK)], strict=True)]
    body = sse(*(chunk({"content": p}) for p in pieces), chunk({}, "stop"))
    chunks, _ = await run(responder(body))
    thinking = "".join(c.text for c in chunks if isinstance(c, ThinkingDelta))
    inner = THINK[len("<think>") : THINK.index("</think>")]
    assert thinking == inner
    response = await complete_with(responder(body))
    assert response.message.text == THINK.split("</think>")[1].lstrip()


@pytest.mark.parametrize(
    "content",
    ["<thinking>not ours</thinking> text", "  plain", "a <think>late</think>", "<thi", "<think>never closed"],
)
async def test_text_that_only_looks_like_a_think_block(content: str) -> None:
    response = await complete_with(responder(sse(chunk({"content": content}, "stop"))))
    if content.startswith("<think>"):
        assert (response.message.thinking, response.message.text) == ("never closed", None)
    else:
        assert response.message.text == content
        assert response.message.thinking is None
    off = await complete_with(responder(sse(chunk({"content": THINK}, "stop"))), think_tags=False)
    assert off.message.text == THINK


async def test_tool_calls_without_index_are_keyed_by_id() -> None:
    body = sse(
        chunk({"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": '{"x":'}}]}),
        chunk({"tool_calls": [{"function": {"arguments": "1}"}}]}),
        chunk({"tool_calls": [{"id": "b", "function": {"name": "g", "arguments": {"y": 2}}}]}),
        chunk({}, "stop"),
    )
    response = await complete_with(responder(body))
    calls = [(c.id, c.name, c.parsed_arguments()) for c in response.message.tool_calls]
    assert calls == [("a", "f", {"x": 1}), ("b", "g", {"y": 2})]
    assert response.finish_reason is FinishReason.TOOL_CALLS  # "stop" with tool calls (forced choice)


async def test_a_server_that_ignores_stream_true_and_answers_json() -> None:
    cassette = load("29")
    response = await complete_with(responder(cassette.body, "application/json"))
    assert response.message.text == json.loads(cassette.body)["choices"][0]["message"]["content"]


async def test_an_error_object_in_a_200_json_body() -> None:
    body = orjson.dumps({"error": {"message": "upstream failed", "code": 502}})
    with pytest.raises(AgentError) as info:
        await complete_with(responder(body, "application/json"), streaming=False)
    assert info.value.__class__.__name__ == "ServerError"
    assert not info.value.mid_stream  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("body", "content_type", "streaming"),
    [
        (sse(chunk({"content": "cut"}), done=False), "text/event-stream", True),  # neither finish nor [DONE]
        (b"data: {not json}\n\n", "text/event-stream", True),
        (b"data: [1, 2]\n\n", "text/event-stream", True),
        (b'data: {"choices": 5}\n\n', "text/event-stream", True),
        (b"", "text/event-stream", True),
        (b'{"id": "x", "choices": []}', "application/json", False),
        (b"<html>oops</html>", "text/html", False),
    ],
)
async def test_unreadable_responses_are_typed_errors(body: bytes, content_type: str, streaming: bool) -> None:
    with pytest.raises(ModelResponseError) as info:
        await complete_with(responder(body, content_type), streaming=streaming)
    assert info.value.mid_stream is streaming
    assert info.value.endpoint == "https://llm.test/v1/chat/completions"


async def test_a_missing_done_is_accepted_after_the_finish_reason() -> None:
    body = sse(chunk({"content": "fine"}, "stop"), done=False)
    assert (await complete_with(responder(body))).message.text == "fine"


async def test_named_events_other_than_error_are_skipped() -> None:
    body = b"event: ping\ndata: {}\n\n" + sse(chunk({"content": "ok"}, "stop"))
    assert (await complete_with(responder(body))).message.text == "ok"


async def test_later_choices_are_ignored() -> None:
    body = sse(
        {"id": "c", "choices": [{"index": 1, "delta": {"content": "second"}, "finish_reason": None}]},
        chunk({"content": "first"}, "stop"),
    )
    assert (await complete_with(responder(body))).message.text == "first"


async def complete_with(handler: Handler, **options: Any) -> Any:
    options.setdefault("retry", RetryPolicy.never())
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel("gpt-test", base_url="https://llm.test/v1", client=client, **options)
        return await complete(model, ModelRequest(messages=(UserMessage.of("hi"),)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(
        st.binary(max_size=300),
        st.lists(
            st.sampled_from(
                [
                    b"data: ",
                    b"{",
                    b"}",
                    b'"choices"',
                    b":",
                    b"[",
                    b"]",
                    b"\n",
                    b"\r",
                    b"[DONE]",
                    b"event: error",
                    b'"delta"',
                    b'"content"',
                    b"null",
                    b",",
                    b'"x"',
                    b"\xff",
                    b"1",
                ]
            ),
            max_size=40,
        ).map(b"".join),
    ),
    content_type=st.sampled_from(["text/event-stream", "application/json", ""]),
    streaming=st.booleans(),
)
async def test_any_body_ends_in_chunks_or_an_agentrt_error(
    body: bytes, content_type: str, streaming: bool
) -> None:
    with anyio.fail_after(10):
        try:
            await complete_with(responder(body, content_type), streaming=streaming)
        except AgentError:
            pass


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": "many"},
        {"prompt_tokens_details": 5, "prompt_tokens": 1},
        [],
    ],
)
async def test_malformed_usage_is_a_response_error(usage: Any) -> None:
    body = sse(chunk({"content": "x"}, "stop"), {"id": "c", "choices": [], "usage": usage})
    if not usage:
        assert (await complete_with(responder(body))).usage.estimated  # an empty usage is no usage
        return
    with pytest.raises(ModelResponseError):
        await complete_with(responder(body))
