"""agentrt against a real LLM server (acceptance of the local-model issue).

The model is a tiny base model: its words are meaningless, so these tests assert the machinery (what
the server received, what came back, how it was streamed, closed and reported), never the prose.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import anyio
import httpx
import pytest
from pydantic import BaseModel, Field, StringConstraints

import agentrt
from agentrt import (
    Description,
    ModelSettings,
    PartialStream,
    Result,
    ServerError,
    TextDelta,
    TokenStream,
    ToolOutcome,
    ToolSettings,
    system_message,
    tool,
    user_message,
)
from agentrt.local import LOCAL_CAPABILITIES, local_chat_model
from agentrt.models import OpenAIChatModel, RetryPolicy

from .conftest import LocalServer

pytestmark = pytest.mark.e2e


class RecordingTransport(httpx.AsyncHTTPTransport):
    """A real HTTP transport that keeps every request body as it went on the wire."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(await request.aread()))
        return await super().handle_async_request(request)


class Ticket(BaseModel):
    # The server's grammar enforces types and string lengths (not numeric bounds); bounded strings
    # keep a base model from rambling past max_tokens inside a JSON string.
    origin: str = Field(max_length=40)
    destination: str = Field(max_length=40)
    passengers: int


class Lookup:
    def __init__(self) -> None:
        self.calls: list[str] = []

    @tool("Look up the shipping status of an order.")
    async def order_status(
        self, order_id: Annotated[str, Description("the order number"), StringConstraints(max_length=24)]
    ) -> str:
        self.calls.append(order_id)
        return f"Order {order_id}: shipped."


@system_message("You are a support assistant.")
class Support:
    async def stream(self, question: str) -> TokenStream: ...

    @user_message("Extract the train ticket from: {{it}}")
    async def ticket(self, text: str) -> Result[Ticket]: ...

    async def ask(self, question: str) -> Result[str]: ...


async def test_a_streamed_answer_arrives_token_by_token_with_estimated_usage(
    local_server: LocalServer,
) -> None:
    async with local_chat_model(local_server.base_url, settings=ModelSettings(max_tokens=24)) as model:
        support = agentrt.build(Support, model=model)

        stream = await support.stream("Tell me a story.")
        arrivals: list[float] = []
        deltas: list[str] = []
        async for event in stream.events():
            if isinstance(event, TextDelta):
                arrivals.append(anyio.current_time())
                deltas.append(event.text)
        result = await stream.result()

    assert len(deltas) > 5  # one event per generated token, not one block
    assert arrivals[-1] > arrivals[0]  # and they arrived over time
    assert result.text == "".join(deltas)
    assert result.usage.estimated  # the server sends no usage in streams: agentrt estimates, and says so
    assert result.usage.output_tokens >= len(deltas)
    assert result.usage.input_tokens > 0
    assert result.finish_reason is agentrt.FinishReason.LENGTH


async def test_non_streamed_usage_comes_from_the_server(local_server: LocalServer) -> None:
    async with local_chat_model(
        local_server.base_url, streaming=False, settings=ModelSettings(max_tokens=8)
    ) as model:
        result = await agentrt.build(Support, model=model).ask("Hello")

    assert not result.usage.estimated
    assert result.usage.output_tokens == 8


async def test_a_pydantic_return_gets_a_valid_instance_through_the_json_dialect(
    local_server: LocalServer,
) -> None:
    transport = RecordingTransport()
    async with httpx.AsyncClient(transport=transport, timeout=60) as client:
        model = local_chat_model(
            local_server.base_url, client=client, settings=ModelSettings(max_tokens=120, temperature=0)
        )
        result = await agentrt.build(Support, model=model).ticket("Two people from Bern to Basel.")

    assert isinstance(result.value, Ticket)
    assert isinstance(result.value.passengers, int)
    (body,) = transport.bodies
    assert body["response_format"] == {"type": "json_object", "schema": Ticket.model_json_schema()}
    assert "You must answer strictly with a JSON object" in body["messages"][-1]["content"]


async def test_a_tool_round_trip_as_the_server_received_it(local_server: LocalServer) -> None:
    transport = RecordingTransport()
    lookup = Lookup()
    async with httpx.AsyncClient(transport=transport, timeout=60) as client:
        model = local_chat_model(
            local_server.base_url, client=client, settings=ModelSettings(max_tokens=40, temperature=0)
        )
        support = agentrt.build(
            Support,
            model=model,
            tools=[lookup],
            tool_settings=ToolSettings(tool_choice="order_status"),
        )
        result = await support.ask("Where is order SO-7?")

    (execution,) = result.tool_executions
    assert execution.outcome is ToolOutcome.SUCCESS
    assert lookup.calls and execution.result == f"Order {lookup.calls[0]}: shipped."
    first, second = transport.bodies
    assert first["tool_choice"] == {"type": "function", "function": {"name": "order_status"}}
    assert first["tools"][0]["function"]["name"] == "order_status"
    assert "tools" not in second  # this server cannot choose tools itself: none are offered again
    call = second["messages"][-2]
    assert call["role"] == "assistant" and "content" not in call
    assert call["tool_calls"][0]["function"]["name"] == "order_status"
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {"order_id": lookup.calls[0]}
    assert second["messages"][-1] == {
        "role": "tool",
        "tool_call_id": call["tool_calls"][0]["id"],
        "content": execution.result,
    }
    assert isinstance(result.value, str)
    assert result.usage.input_tokens > 0


class Trips:
    @user_message("Extract the train ticket from: {{it}}")
    async def ticket(self, text: str) -> Result[Ticket]: ...

    @user_message("Extract the train ticket from: {{it}}")
    async def partial(self, text: str) -> PartialStream[Ticket]: ...


async def test_tool_mode_gets_a_valid_instance_from_a_forced_final_answer_call(
    local_server: LocalServer,
) -> None:
    transport = RecordingTransport()
    async with httpx.AsyncClient(transport=transport, timeout=60) as client:
        model = local_chat_model(
            local_server.base_url, client=client, settings=ModelSettings(max_tokens=120, temperature=0)
        )
        trips = agentrt.build(Trips, model=model, output_mode="tool")
        result = await trips.ticket("Two people from Bern to Basel.")
        stream = await trips.partial("Two people from Bern to Basel.")
        snapshots = [snapshot async for snapshot in stream]

    assert isinstance(result.value, Ticket)
    assert result.value == Ticket.model_validate_json(result.text)  # the call's arguments, as text
    first = transport.bodies[0]
    assert first["tool_choice"] == {"type": "function", "function": {"name": "final_answer"}}
    assert [tool["function"]["name"] for tool in first["tools"]] == ["final_answer"]
    assert first["tools"][0]["function"]["parameters"] == Ticket.model_json_schema()
    assert "response_format" not in first
    assert first["messages"][-1]["content"] == "Extract the train ticket from: Two people from Bern to Basel."
    # Streamed, the arguments arrive as partial values; the last is the final, validated one.
    assert snapshots and isinstance(snapshots[-1], Ticket)
    assert snapshots[-1] == (await stream.result()).value


async def test_cancelling_a_long_generation_closes_the_connection_and_stops_the_server(
    local_server: LocalServer,
) -> None:
    async with local_chat_model(
        local_server.base_url, settings=ModelSettings(max_tokens=2000, temperature=0.8, seed=1)
    ) as model:
        support = agentrt.build(Support, model=model)
        stream = await support.stream("Write a very long story.")
        tokens: list[str] = []
        with anyio.CancelScope() as scope:
            async for token in stream:
                tokens.append(token)
                if len(tokens) == 3:
                    scope.cancel()
        assert len(tokens) == 3

        # The server handles one request at a time. Had it gone on generating 2,000 tokens (30 s or
        # more here, longer on a loaded machine), this short request would wait for it; served well
        # within that, it shows generation stopped. The server's log says so too.
        started = time.monotonic()
        short = ModelSettings(max_tokens=8)
        quick = await agentrt.build(Support, model=model, settings=short).ask("Hi")
        waited = time.monotonic() - started

    assert quick.finish_reason is not None
    assert waited < 20, f"the next request waited {waited:.1f} s: the server kept generating"
    assert "disconnect" in local_server.log.read_text(errors="replace").lower()


async def test_a_rejected_request_is_a_typed_error_with_the_servers_message(
    local_server: LocalServer,
) -> None:
    # Claiming a capability the server lacks: it rejects `response_format: json_schema`.
    import dataclasses

    model = OpenAIChatModel(
        "gemma-agent",
        base_url=local_server.base_url,
        api_key="local",
        capabilities=dataclasses.replace(LOCAL_CAPABILITIES, json_schema=True),
        settings=ModelSettings(max_tokens=16),
        retry=RetryPolicy.never(),
    )
    async with model:
        with pytest.raises(ServerError) as info:
            await agentrt.build(Support, model=model).ticket("Bern to Basel")

    error = info.value
    assert error.status == 500
    assert "Input should be 'text' or 'json_object'" in error.message
    assert error.endpoint == f"{local_server.base_url}/chat/completions"
    assert "local" not in str(error).replace("localhost", "")  # the key never shows


async def test_a_prompt_beyond_the_context_is_context_length_exceeded(local_server: LocalServer) -> None:
    async with local_chat_model(
        local_server.base_url, streaming=False, settings=ModelSettings(max_tokens=8)
    ) as model:
        with pytest.raises(agentrt.ContextLengthExceededError) as info:
            await agentrt.build(Support, model=model).ask("word " * 3000)

    assert "maximum context length" in info.value.message


async def test_the_demos_approval_step_on_the_real_model(
    local_server: LocalServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make demo`'s step 4 on the real server: the forced call waits, nothing is stored or run, and
    on Approve it runs once and the turn is stored whole."""
    from examples import demo

    async with local_chat_model(
        local_server.base_url, settings=ModelSettings(max_tokens=40, temperature=0)
    ) as model:
        await demo.approve(model)
    out = capsys.readouterr().out
    assert "waiting for approval: order_status(" in out
    assert "the tool has run 0 time(s); the conversation holds 0 messages" in out
    assert "the tool ran 1 time(s); the conversation now holds" in out


async def test_the_demos_mcp_step_on_the_real_model(
    local_server: LocalServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make demo`'s step 5 on the real server: the forced call reaches the timetable server the demo
    starts over stdio, and what it answered goes back to the model."""
    from examples import demo

    async with local_chat_model(
        local_server.base_url, settings=ModelSettings(max_tokens=40, temperature=0)
    ) as model:
        await demo.mcp_tool(model)
    out = capsys.readouterr().out
    assert "the server offers ['rail_next_train']; read-only: True" in out
    assert "tool rail_next_train ran on the server -> '" in out
