"""The same service gives the same results through both adapters fed equivalent traffic
(acceptance item 2): text, a token stream, a JSON answer, an image input, two parallel tool calls.

One script of model turns is rendered into each wire format (OpenAI SSE or JSON, Ollama NDJSON or
JSON) by a small fake server; the two adapters must fold both renderings into equal results.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from pydantic import BaseModel

import agentrt
from agentrt import (
    ImageContent,
    ModelRequest,
    Result,
    TokenStream,
    UserMessage,
    system_message,
    tool,
    user_message,
)
from agentrt.models import ModelResponse, OllamaChatModel, OpenAIChatModel, ToolSpec, complete

MODEL = "llama3.2"
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYPgPAAEDAQAIicLsAAAAAElFTkSuQmCC"
)


@dataclass(frozen=True)
class Turn:
    """One model answer, protocol-neutral."""

    text: tuple[str, ...] = ()
    thinking: tuple[str, ...] = ()
    calls: tuple[tuple[str, str, dict[str, Any]], ...] = ()
    usage: tuple[int, int] = (21, 7)
    finish: str = "stop"


def openai_wire(turn: Turn, streaming: bool) -> tuple[str, bytes]:
    finish = "tool_calls" if turn.calls else turn.finish
    usage = {
        "prompt_tokens": turn.usage[0],
        "completion_tokens": turn.usage[1],
        "total_tokens": sum(turn.usage),
    }
    if not streaming:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(turn.text) or None}
        if turn.thinking:
            message["reasoning_content"] = "".join(turn.thinking)
        if turn.calls:
            message["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": orjson.dumps(a).decode()}}
                for i, n, a in turn.calls
            ]
        body = {
            "id": "chatcmpl-9",
            "object": "chat.completion",
            "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        }
        return "application/json", orjson.dumps(body)
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"reasoning_content": t} for t in turn.thinking]
    deltas += [{"content": t} for t in turn.text]
    for index, (call_id, name, arguments) in enumerate(turn.calls):
        text = orjson.dumps(arguments).decode()
        head = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        deltas.append({"tool_calls": [head]})
        half = len(text) // 2
        for piece in (text[:half], text[half:]):
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    chunks = [{"index": 0, "delta": d, "finish_reason": None} for d in deltas]
    chunks.append({"index": 0, "delta": {}, "finish_reason": finish})
    events = [{"id": "chatcmpl-9", "model": MODEL, "choices": [c]} for c in chunks]
    events.append({"id": "chatcmpl-9", "model": MODEL, "choices": [], "usage": usage})
    body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return "text/event-stream", body


def ollama_wire(turn: Turn, streaming: bool) -> tuple[str, bytes]:
    done = {
        "model": MODEL,
        "done": True,
        "done_reason": turn.finish,
        "prompt_eval_count": turn.usage[0],
        "eval_count": turn.usage[1],
    }
    calls = [{"id": i, "function": {"name": n, "arguments": a}} for i, n, a in turn.calls]
    if not streaming:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(turn.text)}
        if turn.thinking:
            message["thinking"] = "".join(turn.thinking)
        if calls:
            message["tool_calls"] = calls
        return "application/json", orjson.dumps({**done, "message": message})
    lines = [{"role": "assistant", "content": "", "thinking": t} for t in turn.thinking]
    lines += [{"role": "assistant", "content": t} for t in turn.text]
    lines += [{"role": "assistant", "content": "", "tool_calls": [c]} for c in calls]
    objects = [{"model": MODEL, "message": m, "done": False} for m in lines]
    objects.append({**done, "message": {"role": "assistant", "content": ""}})
    return "application/x-ndjson", b"".join(orjson.dumps(o) + b"\n" for o in objects)


@dataclass
class FakeServer:
    """Serves the scripted turns in order, in whichever protocol is asked; keeps the requests."""

    turns: Iterator[Turn]
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        wire = ollama_wire if request.url.path == "/api/chat" else openai_wire
        content_type, content = wire(next(self.turns), body["stream"])
        return httpx.Response(200, headers={"content-type": content_type}, content=content)


class City(BaseModel):
    name: str
    country: str


@system_message("You are terse.")
class Assistant:
    async def ask(self, question: str) -> str: ...

    async def ask_result(self, question: str) -> Result[str]: ...

    async def stream(self, question: str) -> TokenStream: ...

    @user_message("Which city is this about: {{text}}")
    async def city(self, text: str) -> City: ...

    @user_message("Describe the image in one word.")
    async def describe(self, image: ImageContent) -> str: ...


SCRIPT = [
    Turn(text=("Paris", " is", " lovely.")),
    Turn(text=("Four",), thinking=("2+2", " is 4."), usage=(30, 12)),
    Turn(text=("Once", " upon", " a", " time"), finish="length"),
    Turn(
        text=('{"name": "Lyon",', ' "country": "France"}'),
    ),
    Turn(text=("Pixel.",)),
    Turn(calls=(("call_a", "weather", {"city": "Paris"}), ("call_b", "time", {"zone": "Europe/Paris"}))),
]


async def run_service(kind: str, streaming: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    server = FakeServer(iter(SCRIPT))
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
        model: OpenAIChatModel | OllamaChatModel
        if kind == "openai":
            model = OpenAIChatModel(
                MODEL, base_url="http://gateway.test/v1", client=client, streaming=streaming
            )
        else:
            model = OllamaChatModel(
                MODEL, base_url="http://ollama.test:11434", client=client, streaming=streaming
            )
        service = agentrt.build(Assistant, model=model)
        results: dict[str, Any] = {"ask": await service.ask("Where?")}
        results["ask_result"] = await service.ask_result("What is 2+2?")
        stream = await service.stream("Tell a story.")
        results["tokens"] = [token async for token in stream]
        results["stream_result"] = await stream.result()
        results["city"] = await service.city("the silk capital")
        results["describe"] = await service.describe(ImageContent.from_bytes(PIXEL, "image/png"))
        tools = (
            ToolSpec(
                "weather", "Weather in a city", {"type": "object", "properties": {"city": {"type": "string"}}}
            ),
            ToolSpec(
                "time", "Time in a zone", {"type": "object", "properties": {"zone": {"type": "string"}}}
            ),
        )
        request = ModelRequest(messages=(UserMessage.of("Weather and time in Paris?"),), tools=tools)
        results["tool_calls"] = await complete(model, request)
    return results, server.requests


def without_id(response: ModelResponse) -> ModelResponse:
    return dataclasses.replace(response, id=None)  # Ollama's native API has no response id


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "non-streaming"])
async def test_both_adapters_give_the_same_results(streaming: bool) -> None:
    openai_results, openai_requests = await run_service("openai", streaming)
    ollama_results, ollama_requests = await run_service("ollama", streaming)

    assert openai_results["ask"] == ollama_results["ask"] == "Paris is lovely."
    assert openai_results["ask_result"] == ollama_results["ask_result"]
    assert openai_results["ask_result"].thinking == "2+2 is 4."
    assert openai_results["ask_result"].usage.total_tokens == 42
    assert openai_results["tokens"] == ollama_results["tokens"]
    assert "".join(openai_results["tokens"]) == "Once upon a time"
    assert openai_results["stream_result"] == ollama_results["stream_result"]
    assert openai_results["stream_result"].finish_reason is agentrt.FinishReason.LENGTH
    assert openai_results["city"] == ollama_results["city"] == City(name="Lyon", country="France")
    assert openai_results["describe"] == ollama_results["describe"] == "Pixel."
    openai_calls, ollama_calls = openai_results["tool_calls"], ollama_results["tool_calls"]
    assert without_id(openai_calls) == without_id(ollama_calls)
    assert [(c.id, c.name, c.parsed_arguments()) for c in openai_calls.message.tool_calls] == [
        (i, n, a) for i, n, a in SCRIPT[-1].calls
    ]
    assert openai_calls.finish_reason is agentrt.FinishReason.TOOL_CALLS

    # The requests say the same thing in each protocol.
    for sent_openai, sent_ollama in zip(openai_requests, ollama_requests, strict=True):
        assert [m["role"] for m in sent_openai["messages"]] == [m["role"] for m in sent_ollama["messages"]]
    city_openai, city_ollama = openai_requests[3], ollama_requests[3]
    schema = city_ollama["format"]
    assert schema == City.model_json_schema()
    assert city_openai["response_format"]["json_schema"]["schema"] == {
        **schema,
        "additionalProperties": False,
    }
    image_openai = openai_requests[4]["messages"][1]["content"][1]["image_url"]["url"]
    image_ollama = ollama_requests[4]["messages"][1]["images"][0]
    assert image_openai == f"data:image/png;base64,{image_ollama}"
    assert base64.b64decode(image_ollama) == PIXEL
    assert [t["function"]["name"] for t in openai_requests[5]["tools"]] == ["weather", "time"]
    assert openai_requests[5]["tools"] == ollama_requests[5]["tools"]


class Local:
    @tool("Current weather in a city.")
    async def weather(self, city: str) -> str:
        return f"sunny in {city}"

    @tool("Current time in a time zone.")
    async def time(self, zone: str) -> str:
        return f"12:00 in {zone}"


class Planner:
    async def plan(self, question: str) -> Result[str]: ...


TOOL_SCRIPT = [
    Turn(
        thinking=("Need both.",),
        calls=(("call_a", "weather", {"city": "Paris"}), ("call_b", "time", {"zone": "Europe/Paris"})),
        usage=(40, 9),
    ),
    Turn(text=("Sunny", ", noon."), usage=(80, 4)),
]


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "non-streaming"])
async def test_a_tool_round_gives_the_same_result_through_both_adapters(streaming: bool) -> None:
    results: list[Result[str]] = []
    requests: list[list[dict[str, Any]]] = []
    for kind in ("openai", "ollama"):
        server = FakeServer(iter(TOOL_SCRIPT))
        async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
            model: OpenAIChatModel | OllamaChatModel
            if kind == "openai":
                model = OpenAIChatModel(
                    MODEL, base_url="http://gw.test/v1", client=client, streaming=streaming
                )
            else:
                model = OllamaChatModel(
                    MODEL, base_url="http://ollama.test", client=client, streaming=streaming
                )
            service = agentrt.build(Planner, model=model, tools=[Local()])
            results.append(await service.plan("Weather and time in Paris?"))
        requests.append(server.requests)
    openai_result, ollama_result = results
    assert openai_result == ollama_result
    assert openai_result.value == "Sunny, noon."
    assert [(e.name, e.result) for e in openai_result.tool_executions] == [
        ("weather", "sunny in Paris"),
        ("time", "12:00 in Europe/Paris"),
    ]
    assert openai_result.usage.total_tokens == 133
    # The second request carries the calls and their results, in each protocol's own shape.
    openai_second, ollama_second = requests[0][1]["messages"], requests[1][1]["messages"]
    assert [m["role"] for m in openai_second] == [m["role"] for m in ollama_second]
    assert [m["role"] for m in openai_second][-3:] == ["assistant", "tool", "tool"]
    assert [m["tool_call_id"] for m in openai_second[-2:]] == ["call_a", "call_b"]
    assert [m["tool_name"] for m in ollama_second[-2:]] == ["weather", "time"]
    assert [m["content"] for m in openai_second[-2:]] == [m["content"] for m in ollama_second[-2:]]
    assert ollama_second[-3]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
