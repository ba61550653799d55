"""End to end: the tool loop through the OpenAI-compatible adapter, on recorded wire bytes.

Round 1 replays a real recorded stream of two parallel tool calls (cassette 12: id and name on the
first delta of each call, arguments split mid-token); round 2 replays a real recorded text stream
(cassette 04). What the server received is asserted from its side: the JSON bodies.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import httpx
from cassettes import Parts, load, reference_sse

import agentrt
from agentrt import Description, Result, TokenStream, system_message, tool
from agentrt.models import OpenAIChatModel, RetryPolicy

TOOLS_STREAM = load("12")
TEXT_STREAM = load("04")


def recorded_calls() -> list[tuple[str, str, str]]:
    """(id, name, arguments) of each tool call in cassette 12, read with the tests' own SSE parser."""
    calls: dict[int, list[str]] = {}
    for _, data in reference_sse(TOOLS_STREAM.body.decode()):
        if data == "[DONE]":
            continue
        for choice in json.loads(data)["choices"]:
            for call in choice["delta"].get("tool_calls") or []:
                entry = calls.setdefault(call["index"], ["", "", ""])
                entry[0] = entry[0] or call.get("id", "")
                entry[1] = entry[1] or call["function"].get("name", "")
                entry[2] += call["function"].get("arguments", "")
    return [(i, n, a) for i, n, a in calls.values()]


def recorded_text() -> str:
    parts = []
    for _, data in reference_sse(TEXT_STREAM.body.decode()):
        if data != "[DONE]":
            for choice in json.loads(data)["choices"]:
                parts.append(choice["delta"].get("content") or "")
    return "".join(parts)


class WeatherTools:
    def __init__(self) -> None:
        self.asked: list[str] = []

    @tool("Get the current weather in a given location")
    async def get_current_weather(
        self, location: Annotated[str, Description("The city and state, e.g. Boston, MA")]
    ) -> str:
        self.asked.append(location)
        return f"{location}: 12 °C, light rain"


@system_message("You're a helpful assistant.")
class Assistant:
    async def ask(self, question: str) -> Result[str]: ...

    async def stream(self, question: str) -> TokenStream: ...


async def run(method: str) -> tuple[Result[str], list[str], list[dict[str, Any]], WeatherTools]:
    sent: list[dict[str, Any]] = []
    replies = [TOOLS_STREAM, TEXT_STREAM]

    def server(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        cassette = replies[len(sent) - 1]
        return httpx.Response(cassette.status, headers=cassette.headers, stream=Parts([cassette.body]))

    tools = WeatherTools()
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
        model = OpenAIChatModel(
            "gpt-4o-mini",
            base_url="https://llm.test/v1",
            api_key="sk-test",
            client=client,
            retry=RetryPolicy.never(),
        )
        svc = agentrt.build(Assistant, model=model, tools=[tools])
        question = "What's the weather in Seattle and San Francisco today?"
        if method == "ask":
            result, tokens = await svc.ask(question), []
        else:
            stream = await svc.stream(question)
            tokens = [token async for token in stream]
            result = await stream.result()
    return result, tokens, sent, tools


async def test_streamed_parallel_tool_calls_round_trip_through_the_openai_adapter() -> None:
    calls = recorded_calls()
    assert len(calls) == 2

    result, _, sent, tools = await run("ask")

    # The two calls ran concurrently (in either order); their results go back in the model's order.
    assert sorted(tools.asked) == sorted(json.loads(arguments)["location"] for _, _, arguments in calls)
    first, second = sent
    assert first["messages"] == [
        {"role": "system", "content": "You're a helpful assistant."},
        {"role": "user", "content": "What's the weather in Seattle and San Francisco today?"},
    ]
    assert first["tools"][0]["function"]["name"] == "get_current_weather"
    assert first["tools"][0]["function"]["parameters"]["properties"]["location"] == {
        "description": "The city and state, e.g. Boston, MA",
        "type": "string",
    }
    assert second["messages"][2:] == [
        {
            "role": "assistant",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                for call_id, name, arguments in calls
            ],
        },
        *(
            {
                "role": "tool",
                "tool_call_id": call_id,
                "content": f"{json.loads(arguments)['location']}: 12 °C, light rain",
            }
            for call_id, _, arguments in calls
        ),
    ]
    assert result.value == recorded_text()
    assert [e.call_id for e in result.tool_executions] == [c[0] for c in calls]


async def test_the_stream_view_sends_the_same_transcript_and_streams_the_answer() -> None:
    awaited, _, awaited_sent, _ = await run("ask")
    streamed, tokens, streamed_sent, _ = await run("stream")

    assert streamed_sent == awaited_sent
    assert streamed == awaited
    assert "".join(tokens) == recorded_text()
    assert len(tokens) > 1
