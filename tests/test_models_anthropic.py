"""`AnthropicChatModel`: what it sends, how it reads what comes back, its errors and its configuration.

The recorded exchanges (cassettes 19-25) are replayed in `test_models_cassettes.py`; here they are
also split at every byte offset, at random offsets (hypothesis), and their recorded requests are
rebuilt. Everything else is served by `httpx.MockTransport` handlers, among them
`anthropic_like.AnthropicLike`, which refuses (400) the requests the Messages API refuses.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import anthropic_like as like
import anyio
import depth
import httpx
import orjson
import pytest
from anthropic_like import AnthropicLike, anthropic, call_stream
from cassettes import ANTHROPIC, Cassette, Parts, load, pick, split_at
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import agentrt
from agentrt import (
    AgentError,
    AssistantMessage,
    AudioContent,
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    ContextLengthExceededError,
    Description,
    FinishReason,
    ImageContent,
    ModelError,
    ModelNotFoundError,
    ModelRequest,
    ModelResponseError,
    ModelSettings,
    OverloadedError,
    PdfContent,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
    SystemMessage,
    TextDelta,
    ThinkingDelta,
    TokenStream,
    ToolCall,
    ToolResultMessage,
    ToolSettings,
    Usage,
    UserMessage,
    VideoContent,
    messages_from_json,
    messages_to_json,
    tool,
)
from agentrt._messages import ThinkingBlock
from agentrt.models import AnthropicChatModel, JsonSchemaFormat, ModelChunk, RetryPolicy, ToolSpec, complete
from agentrt.models._failures import ErrorContext
from agentrt.models.anthropic import (
    DEFAULT_CAPABILITIES,
    THINKING_CAPABILITIES,
    EventStreamDecoder,
    MessagesMapper,
)
from agentrt.output._modes import resolve_mode

Handler = Callable[[httpx.Request], httpx.Response]
KEY = "sk-ant-api03-secret-key-0123456789"


# --- wire helpers ---------------------------------------------------------------------------------


def events(*payloads: dict[str, Any]) -> bytes:
    """An SSE body of Messages events, each named by its `type` as Anthropic sends them."""
    return b"".join(
        b"event: " + p["type"].encode() + b"\ndata: " + orjson.dumps(p) + b"\n\n" for p in payloads
    )


def start(**usage: int) -> dict[str, Any]:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": []}
    return {"type": "message_start", "message": {**message, "usage": usage or {"input_tokens": 5}}}


def block(index: int, content_block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": content_block}


def delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": fields}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def end(reason: str = "end_turn", **usage: int) -> list[dict[str, Any]]:
    return [
        {"type": "message_delta", "delta": {"stop_reason": reason}, "usage": usage or {"output_tokens": 3}},
        {"type": "message_stop"},
    ]


def text_stream(text: str = "Hello") -> bytes:
    return events(
        start(),
        block(0, {"type": "text", "text": ""}),
        delta(0, type="text_delta", text=text),
        stop(0),
        *end(),
    )


def responder(body: bytes, content_type: str = "text/event-stream", status: int = 200) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"content-type": content_type}, stream=Parts([body]))

    return handler


async def run(
    handler: Handler, request: ModelRequest | None = None, **options: Any
) -> tuple[list[ModelChunk], list[httpx.Request]]:
    """The chunks the model yields for `request`, and the HTTP requests it sent."""
    sent: list[httpx.Request] = []

    def recording(http_request: httpx.Request) -> httpx.Response:
        sent.append(http_request)
        return handler(http_request)

    options.setdefault("retry", RetryPolicy.never())
    options.setdefault("api_key", KEY)
    async with httpx.AsyncClient(transport=httpx.MockTransport(recording)) as client:
        model = AnthropicChatModel("claude-test", client=client, **options)
        chunks: list[ModelChunk] = []
        stream = model.stream(request or ModelRequest(messages=(UserMessage.of("hi"),)))
        try:
            async for item in stream:
                chunks.append(item)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
    return chunks, sent


async def read_into(model: AnthropicChatModel, chunks: list[ModelChunk]) -> None:
    """Read a stream into `chunks` (what arrived before an error stays there)."""
    stream = model.stream(ModelRequest(messages=(UserMessage.of("hi"),)))
    try:
        async for chunk in stream:
            chunks.append(chunk)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def body_for(request: ModelRequest, **options: Any) -> dict[str, Any]:
    _, sent = await run(responder(text_stream()), request, **options)
    return json.loads(sent[0].content)  # type: ignore[no-any-return]


async def complete_with(handler: Handler, request: ModelRequest | None = None, **options: Any) -> Any:
    options.setdefault("retry", RetryPolicy.never())
    options.setdefault("api_key", KEY)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = AnthropicChatModel("claude-test", client=client, **options)
        return await complete(model, request or ModelRequest(messages=(UserMessage.of("hi"),)))


# --- request ----------------------------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n"
PDF = b"%PDF-1.7\n"
LOOKUP = ToolSpec(
    "lookup",
    "Look a thing up.",
    {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)
SIGNATURE = "EqQBCkgIAxABGAIiQL+/3c0ffee==\n/+"  # opaque: any change to it must fail the test

TRANSCRIPT = (
    SystemMessage(text="Be brief."),
    UserMessage.of(
        "What is on these?",
        ImageContent.from_url("https://example.com/cat.png"),
        ImageContent.from_bytes(PNG, "image/png"),
        PdfContent.from_bytes(PDF, "application/pdf", filename="report.pdf"),
        PdfContent.from_url("https://example.com/b.pdf"),
    ),
    AssistantMessage(
        text="Let me look.",
        thinking="Two images, two files.",
        thinking_signature=SIGNATURE,
        tool_calls=(
            ToolCall(id="toolu_1", name="lookup", arguments='{"q": "cat"}'),
            ToolCall(id="toolu_2", name="lookup", arguments='{"q": "report"}'),
        ),
    ),
    ToolResultMessage(tool_call_id="toolu_1", tool_name="lookup", text="a cat"),
    ToolResultMessage(tool_call_id="toolu_2", tool_name="lookup", text="no such report", is_error=True),
    AssistantMessage(text="A cat, and a report I could not find."),
    SystemMessage(text="Answer in English."),
    UserMessage.of("Thanks. And the second file?"),
)


async def test_a_whole_transcript_is_sent_as_content_blocks_byte_for_byte() -> None:
    request = ModelRequest(
        messages=TRANSCRIPT,
        tools=(LOOKUP,),
        tool_choice="auto",
        settings=ModelSettings(stop=("END",), seed=7, presence_penalty=0.5, frequency_penalty=0.5),
    )
    _, sent = await run(responder(text_stream()), request, thinking=1024, beta=("a-2025", "b-2026"))

    expected = {
        "model": "claude-test",
        "max_tokens": 4096,
        "system": "Be brief.\n\nAnswer in English.",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is on these?"},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/png",
                            "data": base64.b64encode(PNG).decode(),
                        },
                    },
                    {
                        "type": "document",
                        "source": {
                            "type": "base64",
                            "media_type": "application/pdf",
                            "data": base64.b64encode(PDF).decode(),
                        },
                        "title": "report.pdf",
                    },
                    {"type": "document", "source": {"type": "url", "url": "https://example.com/b.pdf"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Two images, two files.", "signature": SIGNATURE},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "cat"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "lookup", "input": {"q": "report"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a cat"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": "no such report",
                        "is_error": True,
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "A cat, and a report I could not find."}],
            },
            {"role": "user", "content": "Thanks. And the second file?"},
        ],
        "stop_sequences": ["END"],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": [
            {
                "name": "lookup",
                "description": "Look a thing up.",
                "input_schema": {
                    "type": "object",
                    "properties": {"q": {"type": "string"}},
                    "required": ["q"],
                },
            }
        ],
        "tool_choice": {"type": "auto"},
        "stream": True,
    }
    assert json.loads(sent[0].content) == expected
    assert sent[0].content == orjson.dumps(expected)  # byte for byte: the signature goes back verbatim
    headers = sent[0].headers
    assert headers["x-api-key"] == KEY
    assert headers["anthropic-version"] == "2023-06-01"
    assert headers["anthropic-beta"] == "a-2025,b-2026"
    assert "authorization" not in headers
    assert sent[0].url == "https://api.anthropic.com/v1/messages"


def _recorded_request(cassette: Cassette) -> ModelRequest:
    """The agentrt request that the cassette's recorded request body stands for."""
    body = cassette.request_body
    messages: list[Any] = [SystemMessage(text=body["system"])] if "system" in body else []
    for message in body["messages"]:
        content = message["content"]
        text = content if isinstance(content, str) else "".join(part["text"] for part in content)
        messages.append(UserMessage.of(text))
    tools = tuple(ToolSpec(t["name"], t["description"], t["input_schema"]) for t in body.get("tools", ()))
    stop_sequences = tuple(body["stop_sequences"]) if "stop_sequences" in body else None
    model_settings = ModelSettings(
        max_tokens=body["max_tokens"], temperature=body.get("temperature"), stop=stop_sequences
    )
    return ModelRequest(messages=tuple(messages), tools=tools, settings=model_settings)


@pytest.mark.parametrize("number", ["19", "21", "22", "23", "24", "25"])
async def test_recorded_requests_are_rebuilt(number: str) -> None:
    cassette = load(number)
    recorded = cassette.request_body
    thinking = recorded.get("thinking", {}).get("budget_tokens")
    sent = await body_for(_recorded_request(cassette), streaming=cassette.streaming, thinking=thinking)
    sent["model"] = recorded["model"]
    for message in recorded["messages"]:  # one text block, as a string: the same message
        if isinstance(message["content"], list) and len(message["content"]) == 1:
            message["content"] = message["content"][0]["text"]
    assert sent == recorded


async def test_thinking_is_sent_back_only_when_on_and_only_signed_or_redacted() -> None:
    blocks = (
        ThinkingBlock(text="First, ", signature="sig-1"),
        ThinkingBlock(signature="ENCRYPTED==", redacted=True),
        ThinkingBlock(text="then.", signature="sig-2"),
        ThinkingBlock(text="an unsigned tail"),
    )
    several = AssistantMessage(
        thinking="First, then.an unsigned tail",
        thinking_signature="sig-2",
        thinking_blocks=blocks,
        tool_calls=(ToolCall(id="t1", name="lookup", arguments="{}"),),
    )
    unsigned = AssistantMessage(text="ok", thinking="another provider's reasoning")
    request = ModelRequest(
        messages=(
            UserMessage.of("q"),
            unsigned,
            UserMessage.of("q2"),
            several,
            ToolResultMessage(tool_call_id="t1", tool_name="lookup", text="r"),
        ),
        tools=(LOOKUP,),
    )
    on = await body_for(request, thinking="adaptive")
    assert on["thinking"] == {"type": "adaptive"}
    assert on["messages"][1]["content"] == [{"type": "text", "text": "ok"}]
    assert on["messages"][3]["content"] == [
        {"type": "thinking", "thinking": "First, ", "signature": "sig-1"},
        {"type": "redacted_thinking", "data": "ENCRYPTED=="},
        {"type": "thinking", "thinking": "then.", "signature": "sig-2"},
        {"type": "tool_use", "id": "t1", "name": "lookup", "input": {}},
    ]
    off = await body_for(request)
    assert "thinking" not in off
    assert off["messages"][3]["content"] == [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}]
    # thinking switched on through extra_body counts as on
    extra = await body_for(request, extra_body={"thinking": {"type": "enabled", "budget_tokens": 2000}})
    assert extra["messages"][3]["content"][0]["signature"] == "sig-1"


async def test_empty_answers_are_left_out_and_same_role_messages_merge() -> None:
    request = ModelRequest(
        messages=(
            UserMessage.of("q"),
            AssistantMessage(text=""),  # what the pipeline stores for a stray call's answer
            UserMessage.of("again"),
            AssistantMessage(refusal="I can't help with that."),
            AssistantMessage(text="Bad args", tool_calls=(ToolCall(id="t", name="f", arguments='{"a": '),)),
        )
    )
    body = await body_for(request)
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "text", "text": "again"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "I can't help with that."},
                {"type": "text", "text": "Bad args"},
                {"type": "tool_use", "id": "t", "name": "f", "input": {}},  # cut-short JSON: `{}`
            ],
        },
    ]


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        (None, None, None),
        ("auto", None, {"type": "auto"}),
        ("required", None, {"type": "any"}),
        ("none", None, {"type": "none"}),
        ("lookup", None, {"type": "tool", "name": "lookup"}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        ("lookup", True, {"type": "tool", "name": "lookup"}),
    ],
)
async def test_tool_choice_and_parallel_calls(
    choice: str | None, parallel: bool | None, expected: Any
) -> None:
    request = ModelRequest(messages=(UserMessage.of("q"),), tools=(LOOKUP,), tool_choice=choice)
    body = await body_for(request, parallel_tool_calls=parallel)
    assert body.get("tool_choice") == expected
    no_tools = await body_for(ModelRequest(messages=(UserMessage.of("q"),), tool_choice=choice))
    assert "tools" not in no_tools
    assert "tool_choice" not in no_tools


async def test_cache_markers_are_opt_in_and_placed_at_the_ends_of_stable_prefixes() -> None:
    request = ModelRequest(
        messages=(
            SystemMessage(text="sys"),
            UserMessage.of("q"),
            AssistantMessage(text="a"),
            UserMessage.of("q2"),
        ),
        tools=(LOOKUP, ToolSpec("other", "")),
    )
    plain = await body_for(request)
    assert b"cache_control" not in orjson.dumps(plain)
    assert plain["system"] == "sys"
    assert plain["tools"][1] == {"name": "other", "input_schema": {"type": "object", "properties": {}}}

    ephemeral = {"type": "ephemeral"}
    cached = await body_for(request, cache_tools=True, cache_system=True, cache_history=True)
    assert cached["system"] == [{"type": "text", "text": "sys", "cache_control": ephemeral}]
    assert "cache_control" not in cached["tools"][0]
    assert cached["tools"][1]["cache_control"] == ephemeral
    assert cached["messages"][:2] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
    ]
    assert cached["messages"][2] == {
        "role": "user",
        "content": [{"type": "text", "text": "q2", "cache_control": ephemeral}],
    }
    assert orjson.dumps(cached).count(b"cache_control") == 3
    only_history = await body_for(request, cache_history=True)
    assert orjson.dumps(only_history).count(b"cache_control") == 1


async def test_settings_max_tokens_and_what_has_no_wire_form() -> None:
    request = ModelRequest(
        messages=(UserMessage.of("q"),), settings=ModelSettings(temperature=0.2, top_p=0.9)
    )
    body = await body_for(request, max_tokens=1000)
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (1000, 0.2, 0.9)
    body = await body_for(request, settings=ModelSettings(max_tokens=300), max_tokens=1000)
    assert body["max_tokens"] == 300
    request = ModelRequest(messages=(UserMessage.of("q"),), settings=ModelSettings(max_tokens=50))
    assert (await body_for(request, settings=ModelSettings(max_tokens=300)))["max_tokens"] == 50
    assert (await body_for(request, extra_body={"top_k": 5}))["top_k"] == 5

    schema = JsonSchemaFormat("answer", {"type": "object"})
    for bad in (
        ModelRequest(messages=(UserMessage.of("q"),), response_format=schema),
        ModelRequest(messages=(UserMessage.of(AudioContent.from_bytes(b"RIFF", "audio/wav")),)),
        ModelRequest(messages=(UserMessage.of(VideoContent.from_url("https://x/v.mp4")),)),
    ):
        with pytest.raises(BadRequestError):
            await body_for(bad)


async def test_configuration_capabilities_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match=r"\(thinking=5000\): max_tokens \(4096\) is below 5001"):
        AnthropicChatModel("claude", thinking=5000, max_tokens=4096)
    with pytest.raises(ConfigurationError, match=r"\(thinking='adaptive'\): .* no temperature but 1"):
        AnthropicChatModel("claude", thinking="adaptive", settings=ModelSettings(temperature=0.5))
    with pytest.raises(ConfigurationError, match="max_tokens"):
        AnthropicChatModel("claude", max_tokens=0)
    with pytest.raises(ConfigurationError, match="model name"):
        AnthropicChatModel("")
    AnthropicChatModel("claude", thinking=5000, settings=ModelSettings(max_tokens=8000))

    plain = AnthropicChatModel("claude")
    assert plain.capabilities == DEFAULT_CAPABILITIES
    assert resolve_mode("auto", plain.capabilities) == "tool"  # structured output through final_answer
    assert not (DEFAULT_CAPABILITIES.json_schema or DEFAULT_CAPABILITIES.json_object)
    thinking = AnthropicChatModel("claude", thinking=1024)
    # the API refuses a forced tool with thinking, and max_tokens up to the budget, and a temperature but 1
    assert thinking.capabilities == dataclasses.replace(
        THINKING_CAPABILITIES, min_max_tokens=1025, fixed_temperature=1
    )
    assert AnthropicChatModel("claude", thinking="adaptive").capabilities == dataclasses.replace(
        THINKING_CAPABILITIES, fixed_temperature=1
    )
    assert resolve_mode("auto", thinking.capabilities) == "tool"

    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://proxy.test/anthropic/")
    monkeypatch.setenv("ANTHROPIC_API_KEY", f"  {KEY}\n")
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=text_stream())

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = AnthropicChatModel("claude", client=client, headers={"anthropic-version": "2099-01-01"})
        assert KEY not in repr(model)
        await complete(model, ModelRequest(messages=(UserMessage.of("q"),)))
    assert seen[0].url == "https://proxy.test/anthropic/v1/messages"
    assert seen[0].headers["x-api-key"] == KEY
    assert seen[0].headers["anthropic-version"] == "2099-01-01"


# --- response ---------------------------------------------------------------------------------------


async def test_streamed_blocks_become_chunks_and_fold_into_one_message() -> None:
    body = events(
        start(input_tokens=10, cache_read_input_tokens=100, cache_creation_input_tokens=50, output_tokens=1),
        {"type": "ping"},
        block(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, type="thinking_delta", thinking="Plan: "),
        delta(0, type="thinking_delta", thinking="look up."),
        delta(0, type="thinking_delta", thinking=""),
        delta(0, type="signature_delta", signature="sig-A"),
        stop(0),
        block(1, {"type": "redacted_thinking", "data": "REDACTED=="}),
        stop(1),
        block(2, {"type": "text", "text": ""}),
        delta(2, type="text_delta", text="Looking"),
        delta(2, type="citations_delta", citation={"type": "char_location"}),
        stop(2),
        block(3, {"type": "tool_use", "id": "toolu_a", "name": "lookup", "input": {}}),
        delta(3, type="input_json_delta", partial_json=""),
        delta(3, type="input_json_delta", partial_json='{"q": "c'),
        delta(3, type="input_json_delta", partial_json='at"}'),
        stop(3),
        block(4, {"type": "tool_use", "id": "toolu_b", "name": "now", "input": {}}),
        stop(4),
        block(5, {"type": "server_tool_use", "id": "srv", "name": "web_search", "input": {}}),
        delta(5, type="input_json_delta", partial_json='{"query": "x"}'),
        stop(5),
        *end("tool_use", output_tokens=42),
    )
    chunks, _ = await run(responder(body))
    assert [c for c in chunks if isinstance(c, ThinkingDelta)] == [
        ThinkingDelta("Plan: "),
        ThinkingDelta("look up."),
        ThinkingDelta("", "sig-A"),
        ThinkingDelta("", "REDACTED==", redacted=True),
    ]
    assert [c for c in chunks if isinstance(c, Usage)] == [Usage(160, 42, 100, 0)]

    response = await complete_with(responder(body))
    message = response.message
    assert message.text == "Looking"
    assert message.thinking == "Plan: look up."
    assert message.thinking_signature == "REDACTED=="  # the last seal; the blocks say which is which
    assert message.thinking_blocks == (
        ThinkingBlock(text="Plan: look up.", signature="sig-A"),
        ThinkingBlock(signature="REDACTED==", redacted=True),
    )
    assert message.tool_calls == (
        ToolCall(id="toolu_a", name="lookup", arguments='{"q": "cat"}'),
        ToolCall(id="toolu_b", name="now", arguments="{}"),
    )
    assert response.finish_reason is FinishReason.TOOL_CALLS
    assert (response.id, response.model) == ("msg_1", "claude-test")
    assert response.usage == Usage(160, 42, 100, 0)


async def test_one_signed_block_needs_no_block_list() -> None:
    body = events(
        start(),
        block(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, type="thinking_delta", thinking="Hm."),
        delta(0, type="signature_delta", signature=SIGNATURE),
        stop(0),
        block(1, {"type": "text", "text": ""}),
        delta(1, type="text_delta", text="Yes."),
        stop(1),
        *end(),
    )
    message = (await complete_with(responder(body))).message
    assert (message.thinking, message.thinking_signature, message.thinking_blocks) == ("Hm.", SIGNATURE, ())
    assert b"thinking_blocks" not in messages_to_json([message])  # stored as before


def _whole_message(**changes: Any) -> dict[str, Any]:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [
            {"type": "thinking", "thinking": "Plan.", "signature": "sig-A"},
            {"type": "redacted_thinking", "data": "REDACTED=="},
            {"type": "text", "text": "Looking"},
            {"type": "tool_use", "id": "toolu_a", "name": "lookup", "input": {"q": "cat"}, "caller": {}},
            {"type": "tool_use", "id": "toolu_b", "name": "now", "input": {}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "cache_read_input_tokens": 4, "output_tokens": 42},
    }
    return {**message, **changes}


async def test_a_whole_message_folds_like_its_stream() -> None:
    streamed = events(
        start(input_tokens=10, cache_read_input_tokens=4, output_tokens=1),
        block(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, type="thinking_delta", thinking="Plan."),
        delta(0, type="signature_delta", signature="sig-A"),
        stop(0),
        block(1, {"type": "redacted_thinking", "data": "REDACTED=="}),
        stop(1),
        block(2, {"type": "text", "text": ""}),
        delta(2, type="text_delta", text="Looking"),
        stop(2),
        block(3, {"type": "tool_use", "id": "toolu_a", "name": "lookup", "input": {}}),
        delta(3, type="input_json_delta", partial_json='{"q":"cat"}'),
        stop(3),
        block(4, {"type": "tool_use", "id": "toolu_b", "name": "now", "input": {}}),
        stop(4),
        *end("tool_use", output_tokens=42),
    )
    whole = orjson.dumps(_whole_message())
    from_stream = await complete_with(responder(streamed))
    from_json = await complete_with(responder(whole, "application/json"), streaming=False)
    assert from_json == from_stream
    _, sent = await run(responder(whole, "application/json"), streaming=False)
    assert json.loads(sent[0].content)["stream"] is False
    # A server that answers a stream request with a whole message is read all the same.
    assert await complete_with(responder(whole, "application/json")) == from_stream


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("end_turn", FinishReason.STOP),
        ("stop_sequence", FinishReason.STOP),
        ("max_tokens", FinishReason.LENGTH),
        ("model_context_window_exceeded", FinishReason.LENGTH),
        ("tool_use", FinishReason.TOOL_CALLS),
        ("refusal", FinishReason.CONTENT_FILTER),
        ("pause_turn", FinishReason.OTHER),
    ],
)
async def test_stop_reasons(raw: str, reason: FinishReason) -> None:
    body = events(start(), block(0, {"type": "text", "text": "x"}), stop(0), *end(raw))
    assert (await complete_with(responder(body))).finish_reason is reason
    whole = orjson.dumps(_whole_message(content=[{"type": "text", "text": "x"}], stop_reason=raw))
    assert (
        await complete_with(responder(whole, "application/json"), streaming=False)
    ).finish_reason is reason


# --- errors -----------------------------------------------------------------------------------------

ERROR_TYPES = [
    (400, "invalid_request_error", "messages: roles must alternate", BadRequestError),
    (
        400,
        "invalid_request_error",
        "prompt is too long: 210000 tokens > 200000 maximum",
        ContextLengthExceededError,
    ),
    (401, "authentication_error", "invalid x-api-key", AuthenticationError),
    (403, "permission_error", "Your API key does not have permission", PermissionDeniedError),
    (404, "not_found_error", "model: claude-nope", ModelNotFoundError),
    (413, "request_too_large", "Request exceeds the maximum allowed number of bytes.", BadRequestError),
    (429, "rate_limit_error", "Number of request tokens has exceeded your rate limit", RateLimitError),
    (500, "api_error", "Internal server error", ServerError),
    (529, "overloaded_error", "Overloaded", OverloadedError),
]


def _envelope(kind: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_1"})


@pytest.mark.parametrize(("status", "kind", "text", "error_class"), ERROR_TYPES)
async def test_error_bodies_become_typed_errors(
    status: int, kind: str, text: str, error_class: type[ModelError]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "application/json", "request-id": "req_1", "retry-after": "3"}
        return httpx.Response(status, headers=headers, content=_envelope(kind, text))

    with pytest.raises(ModelError) as info:
        await complete_with(handler)
    error = info.value
    assert type(error) is error_class
    assert (error.status, error.request_id, error.mid_stream) == (status, "req_1", False)
    assert text in error.message
    assert error.endpoint == "https://api.anthropic.com/v1/messages"
    if isinstance(error, RateLimitError):
        assert error.retry_after == 3.0


async def test_an_overloaded_529_is_retried() -> None:
    answers = [
        httpx.Response(
            529,
            headers={"content-type": "application/json"},
            content=_envelope("overloaded_error", "Overloaded"),
        ),
        httpx.Response(200, headers={"content-type": "text/event-stream"}, content=text_stream("Back.")),
    ]
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return answers[len(sent) - 1]

    retry = RetryPolicy(max_attempts=2, initial_delay=0, jitter=0)
    response = await complete_with(handler, retry=retry)
    assert response.message.text == "Back."
    assert len(sent) == 2
    assert sent[0].content == sent[1].content


async def test_an_error_event_inside_a_200_stream() -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    body = events(
        start(),
        block(0, {"type": "text", "text": ""}),
        delta(0, type="text_delta", text="Hal"),
        error,
        delta(0, type="text_delta", text="lo"),  # nothing after the error counts
        *end(),
    )
    collected: list[ModelChunk] = []

    async with httpx.AsyncClient(transport=httpx.MockTransport(responder(body))) as client:
        model = AnthropicChatModel("claude-test", api_key=KEY, client=client, retry=RetryPolicy.never())
        with pytest.raises(OverloadedError) as info:
            await read_into(model, collected)
    assert [c for c in collected if isinstance(c, TextDelta)] == [TextDelta("Hal")]  # delivered first
    assert info.value.mid_stream
    assert "Overloaded" in info.value.message

    not_json = b"event: error\ndata: upstream connect error\n\n"
    with pytest.raises(ModelError, match="upstream connect error") as info:
        await complete_with(responder(events(start()) + not_json))
    assert info.value.mid_stream

    in_json = orjson.dumps({"type": "error", "error": {"type": "api_error", "message": "Internal"}})
    with pytest.raises(ServerError) as info:
        await complete_with(responder(in_json, "application/json"), streaming=False)
    assert not info.value.mid_stream


async def test_a_last_event_without_its_blank_line_still_counts() -> None:
    body = text_stream("Hello").rstrip(b"\n")
    assert body.endswith(b'"message_stop"}')
    assert (await complete_with(responder(body))).message.text == "Hello"


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (text_stream()[: text_stream().index(b"event: message_delta")], "ended before"),
        (events(start(), delta(0, type="input_json_delta", partial_json="{")), "never started"),
        (events(start(), block(0, {"type": "text", "text": 5})), "not a string"),
        (events({"type": "message_start", "message": {"usage": {"input_tokens": "many"}}}), "not an integer"),
        (b"event: message_start\ndata: {not json\n\n", "not a valid chunk"),
    ],
)
async def test_unreadable_streams_are_response_errors(body: bytes, what: str) -> None:
    with pytest.raises(ModelResponseError, match=what) as info:
        await complete_with(responder(body))
    assert info.value.mid_stream


async def test_the_key_never_shows() -> None:
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    keep = Keep(logging.DEBUG)
    watched = [logging.getLogger(name) for name in ("httpx", "httpcore.http11", "agentrt.models")]
    levels = [logger.level for logger in watched]
    for logger in watched:
        logger.addHandler(keep)
        logger.setLevel(logging.DEBUG)
    events_seen: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        echoed = request.headers["x-api-key"]
        body = _envelope("authentication_error", f"invalid x-api-key: {echoed}")
        return httpx.Response(
            401, headers={"content-type": "application/json", "x-echo": echoed}, content=body
        )

    try:
        with pytest.raises(AuthenticationError) as info:
            await complete_with(handler, on_request=events_seen.append, on_error=events_seen.append)
    finally:
        for logger, level in zip(watched, levels, strict=True):
            logger.removeHandler(keep)
            logger.setLevel(level)
    error = info.value
    assert KEY not in str(error)
    assert KEY not in (error.body or "")
    assert "invalid x-api-key: ***" in error.message
    assert events_seen
    assert all(KEY not in repr(event) for event in events_seen)
    assert all(KEY not in record for record in records)


# --- the cassettes, split -----------------------------------------------------------------------------

STREAMED = [c for c in pick(ANTHROPIC) if c.streaming]


def decode(body: bytes, parts: list[bytes]) -> tuple[list[ModelChunk], str | None]:
    decoder = EventStreamDecoder(MessagesMapper(ErrorContext("http://test/"), None))
    chunks: list[ModelChunk] = []
    for part in parts:
        chunks += decoder.feed(part)
        if decoder.done:
            break
    chunks += decoder.close()
    error = decoder.error
    return chunks, None if error is None else f"{type(error).__name__}: {error}"


@pytest.mark.exhaustive
@pytest.mark.parametrize("cassette", STREAMED, ids=repr)
def test_every_streamed_cassette_split_at_every_byte_decodes_the_same(cassette: Cassette) -> None:
    body = cassette.body
    whole = decode(body, [body])
    assert whole[0]
    assert whole[1] is None
    for offset in depth.offsets(body):
        assert decode(body, split_at(body, offset)) == whole, offset


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    number=st.sampled_from(sorted(c.number for c in STREAMED)),
    cuts=st.lists(st.floats(0, 1), max_size=12),
)
async def test_cassettes_split_anywhere_through_the_adapter(number: str, cuts: list[float]) -> None:
    cassette = load(number)
    body = cassette.body
    offsets = sorted({int(cut * len(body)) for cut in cuts})
    parts = [body[a:b] for a, b in zip([0, *offsets], [*offsets, len(body)], strict=True)]
    whole = await complete_with(responder(body))
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(
            lambda request: httpx.Response(
                200, headers=cassette.headers, stream=Parts([p for p in parts if p])
            )
        )
    ) as client:
        model = AnthropicChatModel("claude", api_key=KEY, client=client, retry=RetryPolicy.never())
        assert await complete(model, ModelRequest(messages=(UserMessage.of("hi"),))) == whole


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.lists(
        st.sampled_from(
            [
                b"event: message_start\n",
                b"data: ",
                orjson.dumps(start()),
                orjson.dumps(block(0, {"type": "tool_use", "id": "t", "name": "f", "input": {}})),
                orjson.dumps(delta(0, type="input_json_delta", partial_json="{")),
                orjson.dumps(delta(0, type="text_delta", text="x")),
                orjson.dumps(end()[0]),
                orjson.dumps(end()[1]),
                b'{"type": "error", "error": {"type": "overloaded_error"}}',
                b"\n\n",
                b"\n",
                b"null",
                b"[]",
                b"\xff",
            ]
        ),
        max_size=30,
    ).map(b"".join),
    streaming=st.booleans(),
    content_type=st.sampled_from(["text/event-stream", "application/json", ""]),
)
async def test_any_body_ends_in_chunks_or_an_agentrt_error(
    body: bytes, streaming: bool, content_type: str
) -> None:
    with anyio.fail_after(10):
        try:
            await complete_with(responder(body, content_type), streaming=streaming)
        except AgentError:
            pass


# --- thinking through memory --------------------------------------------------------------------------


class Lookup:
    def __init__(self) -> None:
        self.asked: list[str] = []

    @tool("Look a thing up.")
    async def lookup(self, q: Annotated[str, Description("what to look up")]) -> str:
        self.asked.append(q)
        return f"{q}: found"


@agentrt.system_message("You are terse.")
class Assistant:
    async def chat(self, conversation: Annotated[str, agentrt.MemoryId], question: str) -> str: ...


def _thinking_then_call() -> bytes:
    return events(
        start(),
        block(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, type="thinking_delta", thinking="I should look it up."),
        delta(0, type="signature_delta", signature=SIGNATURE),
        stop(0),
        block(1, {"type": "redacted_thinking", "data": "ENCRYPTED+/=="}),
        stop(1),
        block(2, {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}),
        delta(2, type="input_json_delta", partial_json='{"q": "cats"}'),
        stop(2),
        *end("tool_use"),
    )


async def test_signed_thinking_goes_back_unchanged_in_the_next_round_and_the_next_turn() -> None:
    replies = [_thinking_then_call(), text_stream("Cats: found."), text_stream("You asked about cats.")]
    sent: list[httpx.Request] = []

    def server(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=replies[len(sent) - 1]
        )

    store = agentrt.memory.InMemoryStore()
    tools = Lookup()
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
        model = AnthropicChatModel(
            "claude-test", api_key=KEY, client=client, thinking=1024, retry=RetryPolicy.never()
        )
        service = agentrt.build(
            Assistant, model=model, tools=[tools], memory=agentrt.memory.window(max_messages=20, store=store)
        )
        assert await service.chat("c1", "What about cats?") == "Cats: found."
        assert await service.chat("c1", "What did I ask?") == "You asked about cats."
    assert tools.asked == ["cats"]

    replayed = [
        {"type": "thinking", "thinking": "I should look it up.", "signature": SIGNATURE},
        {"type": "redacted_thinking", "data": "ENCRYPTED+/=="},
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "cats"}},
    ]
    exchange = [
        {"role": "user", "content": "What about cats?"},
        {"role": "assistant", "content": replayed},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "cats: found"}],
        },
    ]
    second_round = json.loads(sent[1].content)
    assert second_round["system"] == "You are terse."
    assert second_round["messages"] == exchange
    next_turn = json.loads(sent[2].content)
    assert next_turn["messages"] == [
        *exchange,
        {"role": "assistant", "content": [{"type": "text", "text": "Cats: found."}]},
        {"role": "user", "content": "What did I ask?"},
    ]
    # The signature's bytes, exactly as the server sent them, in both requests.
    sealed = orjson.dumps({"signature": SIGNATURE})[1:-1]
    assert sent[1].content.count(sealed) == sent[2].content.count(sealed) == 1

    # What a persistent store would write and read back keeps the blocks too.
    stored = await agentrt.memory.access(service).read("c1")
    assert stored[1].thinking_blocks  # type: ignore[union-attr]
    assert messages_from_json(messages_to_json(stored)) == stored


# --- structured output through the answer tool ----------------------------------------------------------


class Ticket(BaseModel):
    origin: str
    destination: str


class Extractor:
    async def ticket(self, text: str) -> Ticket: ...


@pytest.mark.parametrize("thinking", [None, 1024])
async def test_structured_output_goes_through_a_forced_answer_tool(thinking: int | None) -> None:
    answer = events(
        start(),
        block(0, {"type": "tool_use", "id": "toolu_f", "name": "final_answer", "input": {}}),
        delta(0, type="input_json_delta", partial_json='{"origin": "Paris", '),
        delta(0, type="input_json_delta", partial_json='"destination": "Lyon"}'),
        stop(0),
        *end("tool_use"),
    )
    sent: list[dict[str, Any]] = []

    def server(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=answer)

    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
        model = AnthropicChatModel(
            "claude-test", api_key=KEY, client=client, thinking=thinking, retry=RetryPolicy.never()
        )
        service = agentrt.build(Extractor, model=model)  # output_mode "auto"
        assert await service.ticket("Paris to Lyon, Friday") == Ticket(origin="Paris", destination="Lyon")
    (body,) = sent
    assert [t["name"] for t in body["tools"]] == ["final_answer"]
    assert body["tools"][0]["input_schema"]["required"] == ["origin", "destination"]
    assert "response_format" not in body
    if thinking is None:
        assert body["tool_choice"] == {"type": "tool", "name": "final_answer"}
    else:  # a forced tool is refused with thinking on: offered, and asked for in the message
        assert "tool_choice" not in body
        assert "final_answer" in body["messages"][-1]["content"]


def test_settings_the_api_refuses_with_thinking_are_build_errors_naming_the_method() -> None:
    class Desk:
        async def ask(self, question: str) -> str: ...

        @agentrt.method_options(settings=ModelSettings(temperature=0.2))
        async def creative(self, question: str) -> str: ...

    class Plain:
        async def ask(self, question: str) -> str: ...

    model = AnthropicChatModel("claude", api_key="k", thinking=2048, max_tokens=8192)
    with pytest.raises(ConfigurationError, match=r"Desk\.creative: the model takes no temperature but 1"):
        agentrt.build(Desk, model=model)
    with pytest.raises(ConfigurationError, match=r"Desk: max_tokens \(1024\) is below 2049"):
        agentrt.build(Desk, model=model, settings=ModelSettings(max_tokens=1024))
    with pytest.raises(ConfigurationError, match=r"Plain: max_tokens \(2048\) is below 2049"):
        agentrt.build(Plain, model=model, settings=ModelSettings(max_tokens=2048))
    agentrt.build(Plain, model=model, settings=ModelSettings(max_tokens=2049, temperature=1))
    # without thinking, any temperature goes
    agentrt.build(Desk, model=AnthropicChatModel("claude", api_key="k"))


# --- requests the Messages API accepts: after a tool limit, after a blank answer, with thinking -------------


# Served by `anthropic_like.AnthropicLike`, which refuses what the real API refuses (400).
@agentrt.system_message("You are terse.")
class Terse:
    async def chat(self, conversation: Annotated[str, agentrt.MemoryId], question: str) -> str: ...

    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


async def test_a_final_answer_after_a_tool_limit_is_a_request_anthropic_accepts() -> None:
    # ToolSettings(on_limit="final_answer") promises "one more request without tools that asks the
    # model to answer with what it has". Against Anthropic that request carries the round's
    # tool_use and tool_result blocks with no `tools` field: "Requests which include tool_use or
    # tool_result blocks must define tools." Expected: the answer ("Final.") — e.g. keep the tools
    # and send tool_choice {"type": "none"}, which the adapter already maps. Actual: BadRequestError.
    server = AnthropicLike(
        call_stream("toolu_1", "a"), call_stream("toolu_2", "b"), like.text_stream("Final.")
    )
    model = anthropic(server)
    async with model:
        service = agentrt.build(
            Terse,
            model=model,
            tools=[Lookup()],
            tool_settings=ToolSettings(max_rounds=1, on_limit="final_answer"),
        )
        assert await service.ask("Find a and b") == "Final."


async def test_a_whitespace_answer_does_not_break_the_conversation() -> None:
    # The adapter drops empty answers ("nothing the API accepts: the neighbours merge instead"), but
    # not answers of whitespace only, which Claude does return (e.g. "\n\n" around a server tool).
    # Replayed, `[{"type": "text", "text": " \n"}]` is refused: "text content blocks must contain
    # non-whitespace text". Expected: the second turn answers. Actual: BadRequestError on every
    # later turn (the memory is poisoned).
    server = AnthropicLike(like.text_stream(" \n"), like.text_stream("second"))
    model = anthropic(server)
    async with model:
        service = agentrt.build(Terse, model=model, memory=agentrt.memory.window(max_messages=20))
        assert await service.chat("c1", "first") == " \n"
        assert await service.chat("c1", "again") == "second"


@pytest.mark.parametrize(
    ("thinking", "settings", "why"),
    [
        pytest.param(
            2048,
            ModelSettings(max_tokens=1024),
            "max_tokens",
            id="build-max_tokens-below-budget",
        ),
        pytest.param(
            512,
            None,
            "budget",
            id="budget-below-1024",
        ),
        pytest.param(
            2048,
            ModelSettings(temperature=0.2),
            "temperature",
            id="temperature-with-thinking",
        ),
    ],
)
async def test_thinking_settings_the_api_refuses_fail_at_build_not_on_every_call(
    thinking: int, settings: ModelSettings | None, why: str
) -> None:
    # DESIGN §3 "Definition-time validation" (and _check_tool_choice: "Tool choices the model cannot
    # honour are build errors, not failures of every call"). The constructor checks the budget only
    # against the model's own max_tokens. Expected: ConfigurationError when the model or the service
    # is built — or a request the API takes. Actual: built fine, and every call is a 400.
    server = AnthropicLike(like.text_stream("ok"))
    try:
        model = anthropic(server, thinking=thinking)
        service = agentrt.build(Terse, model=model, settings=settings)
    except ConfigurationError:
        return
    async with model:
        assert await service.ask("q") == "ok", why


# --- errors the API sends: any `event: error`, a 402, a 529 -------------------------------------------------


async def test_an_error_event_is_an_error_whatever_its_json_says() -> None:
    # The OpenAI decoder (SSEChunkDecoder) fails on any `event: error`; this one tells events apart by
    # the data's `type` only, so `event: error` + `{"message": "upstream connect error"}` (what a
    # proxy or gateway in front of the API sends) is ignored like a ping. Expected: a ModelError
    # carrying "upstream connect error" (as for non-JSON error data, which works). Actual:
    # ModelResponseError "the stream ended before the response was complete".
    body = like.events(
        like.start(), block(0, {"type": "text", "text": ""}), delta(0, type="text_delta", text="Hal")
    )
    body += b'event: error\ndata: {"message": "upstream connect error"}\n\n'

    def server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    async with anthropic(server) as model:
        with pytest.raises(ModelError, match="upstream connect error"):
            await complete(model, ModelRequest(messages=(UserMessage.of("hi"),)))


async def test_a_billing_error_is_a_typed_error() -> None:
    # Anthropic documents 402 billing_error. README: typed errors (AuthenticationError,
    # RateLimitError, ... never a bare ModelError for a documented status). Anthropic's `error.type`
    # is not kept as `code` either, so the caller cannot tell billing from any other failure without
    # parsing `body`. Expected: a ModelError subclass (or at least code == "billing_error").
    def server(request: httpx.Request) -> httpx.Response:
        body = {"type": "error", "error": {"type": "billing_error", "message": "credit balance too low"}}
        return httpx.Response(402, headers={"content-type": "application/json"}, json=body)

    async with anthropic(server) as model:
        with pytest.raises(ModelError) as info:
            await complete(model, ModelRequest(messages=(UserMessage.of("hi"),)))
    assert type(info.value) is not ModelError or info.value.code == "billing_error"


@pytest.mark.virtual_clock
async def test_a_529_waits_for_its_retry_after_and_x_should_retry_false_is_final() -> None:
    overloaded = orjson.dumps(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )
    seen: list[float] = []
    answers = [
        httpx.Response(
            529, headers={"content-type": "application/json", "retry-after": "20"}, content=overloaded
        ),
        httpx.Response(200, headers={"content-type": "text/event-stream"}, content=like.text_stream("Back.")),
    ]

    def server(request: httpx.Request) -> httpx.Response:
        seen.append(anyio.current_time())
        return answers[len(seen) - 1]

    async with anthropic(server, retry=RetryPolicy(max_attempts=3)) as model:
        response = await complete(model, ModelRequest(messages=(UserMessage.of("hi"),)))
    assert response.message.text == "Back."
    assert seen[1] - seen[0] >= 20

    calls: list[int] = []

    def refusing(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        headers = {"content-type": "application/json", "x-should-retry": "false", "request-id": "req_9"}
        return httpx.Response(529, headers=headers, content=overloaded)

    async with anthropic(refusing, retry=RetryPolicy(max_attempts=3, initial_delay=0)) as model:
        with pytest.raises(OverloadedError) as info:
            await complete(model, ModelRequest(messages=(UserMessage.of("hi"),)))
    assert len(calls) == 1
    assert (info.value.status, info.value.request_id) == (529, "req_9")


# --- thinking with tools goes back byte for byte through SQLite memory --------------------------------------


ODD_SIGNATURE = "EqQBCkgIAxABGAIiQL+/3c0ffee==\n/+\u2028é"  # opaque; unusual bytes on purpose


def _thinking_of_each_kind_then_call() -> bytes:
    return like.events(
        like.start(),
        {"type": "ping"},
        block(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, type="thinking_delta", thinking="Look it up ☃\u2028"),
        delta(0, type="thinking_delta", thinking=""),
        delta(0, type="signature_delta", signature=ODD_SIGNATURE),
        stop(0),
        block(1, {"type": "redacted_thinking", "data": "ENCRYPTED+/=="}),
        stop(1),
        block(2, {"type": "thinking", "thinking": "", "signature": ""}),  # display "omitted"
        delta(2, type="signature_delta", signature="SIG-omitted"),
        stop(2),
        block(3, {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}),
        delta(3, type="input_json_delta", partial_json=""),
        delta(3, type="input_json_delta", partial_json='{"q": "ca'),
        delta(3, type="input_json_delta", partial_json='ts"}'),
        stop(3),
        *like.end("tool_use"),
    )


async def test_thinking_with_tools_goes_back_byte_for_byte_through_sqlite_memory(tmp_path: Path) -> None:
    server = AnthropicLike(
        _thinking_of_each_kind_then_call(), like.text_stream("Cats: found."), like.text_stream("Cats.")
    )
    store = agentrt.memory.SQLiteStore(tmp_path / "memory.db")
    lookup = Lookup()
    model = anthropic(server, thinking=1024)
    async with model:
        service = agentrt.build(
            Terse, model=model, tools=[lookup], memory=agentrt.memory.window(max_messages=20, store=store)
        )
        assert await service.chat("c1", "What about cats?") == "Cats: found."
        assert await service.chat("c1", "And?") == "Cats."
    assert lookup.asked == ["cats"]
    second_round, next_turn = server.bodies()[1:]
    replayed = [
        {"type": "thinking", "thinking": "Look it up ☃\u2028", "signature": ODD_SIGNATURE},
        {"type": "redacted_thinking", "data": "ENCRYPTED+/=="},
        {"type": "thinking", "thinking": "", "signature": "SIG-omitted"},
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "cats"}},
    ]
    assert second_round["messages"][1] == {"role": "assistant", "content": replayed}
    assert next_turn["messages"][1] == second_round["messages"][1]
    sealed = orjson.dumps(replayed[0])
    assert server.sent[1].content.count(sealed) == server.sent[2].content.count(sealed) == 1


# --- wire corners: pings, unknown events and deltas, server tools, any split --------------------------------


async def test_wire_corners_fold_to_the_answer() -> None:
    body = like.events(
        like.start(),
        {"type": "ping"},
        {"type": "some_future_event", "x": 1},
        block(0, {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}),
        delta(0, type="input_json_delta", partial_json='{"query": "x"}'),
        stop(0),
        block(1, {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}),
        stop(1),
        block(2, {"type": "text", "text": ""}),
        delta(2, type="text_delta", text="Gr"),
        delta(2, type="citations_delta", citation={"type": "web_search_result_location"}),
        delta(2, type="some_future_delta"),
        delta(2, type="text_delta", text="üße ✓"),
        stop(2),
        *like.end("stop_sequence", stop_sequence="END"),
    )
    # every byte split, unicode included: the same as whole
    for cut in (1, 7, len(body) // 2, body.index("ü".encode()) + 1, len(body) - 1):

        def server(request: httpx.Request, cut: int = cut) -> httpx.Response:
            return httpx.Response(
                200, headers={"content-type": "text/event-stream"}, stream=Parts([body[:cut], body[cut:]])
            )

        async with anthropic(server) as model:
            response = await complete(model, ModelRequest(messages=(UserMessage.of("hi"),)))
        assert response.message == AssistantMessage(text="Grüße ✓")
        assert response.finish_reason is FinishReason.STOP
