"""Tool mode: a structured answer asked for through a forced `final_answer` tool whose parameters are
the schema (`output_mode="tool"`, or `"auto"` on a model that declares `Capabilities.tool_output`).

Tests assert the requests the model double received (tools on offer, `tool_choice`, messages), what
ran, what memory stored and the value returned. The last test runs through the OpenAI-compatible
adapter and asserts the JSON body the server received.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import httpx
import pytest
from cassettes import Parts
from pydantic import BaseModel

import agentrt
from agentrt import (
    AssistantMessage,
    Budget,
    Capabilities,
    ConfigurationError,
    MemoryId,
    PartialStream,
    Result,
    TokenStream,
    ToolLoopLimitError,
    ToolSettings,
    UserMessage,
    method_options,
    tool,
)
from agentrt.models import OpenAIChatModel, RetryPolicy, ToolCallDelta
from agentrt.output import ANSWER_TOOL
from agentrt.testing import CallTool, ScriptedModel


class Ticket(BaseModel):
    title: str
    priority: int


class Desk:
    async def ticket(self, conversation: Annotated[str, MemoryId], text: str) -> Ticket: ...

    async def priority(self, text: str) -> Result[int]: ...

    async def chat(self, text: str) -> TokenStream: ...

    async def tickets(self, text: str) -> PartialStream[list[Ticket]]: ...


class Lookup:
    def __init__(self) -> None:
        self.asked: list[str] = []

    @tool("Look up a customer's name.")
    def customer(self, customer_id: str) -> str:
        self.asked.append(customer_id)
        return "Ada"


def answer(arguments: Any, call_id: str = "call_a") -> CallTool:
    return CallTool(ANSWER_TOOL, arguments, id=call_id)


async def test_the_answer_tool_is_forced_by_name_and_its_arguments_are_the_value() -> None:
    model = ScriptedModel([answer({"value": 3})])
    result = await agentrt.build(Desk, model=model, output_mode="tool").priority("how urgent?")
    assert result.value == 3 and result.text == '{"value":3}'
    request = model.requests[0]
    assert [spec.name for spec in request.tools] == [ANSWER_TOOL]
    assert request.tool_choice == ANSWER_TOOL
    assert request.response_format is None
    assert request.messages[-1] == UserMessage.of("how urgent?")  # no format instructions
    assert result.tool_executions == ()  # the answer tool never runs


async def test_beside_other_tools_a_call_is_required_and_the_tools_run_first() -> None:
    lookup = Lookup()
    model = ScriptedModel(
        [CallTool("customer", {"customer_id": "c1"}, id="call_1")],
        [answer({"title": "Printer for Ada", "priority": 2})],
    )
    svc = agentrt.build(Desk, model=model, tools=[lookup], output_mode="tool", memory=agentrt.memory.window())
    value = await svc.ticket("m", "Ticket for c1's printer")
    assert value == Ticket(title="Printer for Ada", priority=2)
    assert lookup.asked == ["c1"]
    for request in model.requests:  # every request: both tools, a call required
        assert [spec.name for spec in request.tools] == ["customer", ANSWER_TOOL]
        assert request.tool_choice == "required"
    stored = await agentrt.memory.access(svc).read("m")
    # The user message, the tool exchange, the answer as text: no call of a tool that never ran.
    assert [type(message).__name__ for message in stored] == [
        "UserMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "AssistantMessage",
    ]
    final = stored[-1]
    assert isinstance(final, AssistantMessage) and not final.tool_calls
    assert json.loads(final.text or "") == {"title": "Printer for Ada", "priority": 2}


async def test_calls_beside_the_answer_do_not_run() -> None:
    lookup = Lookup()
    model = ScriptedModel(
        [CallTool("customer", {"customer_id": "c1"}, id="call_1"), answer({"title": "t", "priority": 1})]
    )
    svc = agentrt.build(Desk, model=model, tools=[lookup], output_mode="tool", memory=agentrt.memory.window())
    assert await svc.ticket("m", "q") == Ticket(title="t", priority=1)
    assert lookup.asked == []
    assert len(model.requests) == 1
    stored = await agentrt.memory.access(svc).read("m")
    assert stored == [UserMessage.of("q"), AssistantMessage(text='{"title":"t","priority":1}')]


async def test_a_repair_asks_again_with_the_failed_arguments_and_the_tool_still_forced() -> None:
    model = ScriptedModel(
        [answer({"title": "t", "priority": "high"})], [answer({"title": "t", "priority": 1})]
    )
    svc = agentrt.build(Desk, model=model, output_mode="tool", memory=agentrt.memory.window())
    assert await svc.ticket("m", "q") == Ticket(title="t", priority=1)
    first, second = model.requests
    assert second.messages[: len(first.messages)] == first.messages
    failed, prompt = second.messages[len(first.messages) :]
    assert failed == AssistantMessage(text='{"title":"t","priority":"high"}')
    assert isinstance(prompt, UserMessage) and prompt.text is not None
    assert prompt.text.startswith("Your answer could not be read as Ticket: priority: ")
    assert [spec.name for spec in second.tools] == [ANSWER_TOOL] and second.tool_choice == ANSWER_TOOL
    stored = await agentrt.memory.access(svc).read("m")
    assert stored == [UserMessage.of("q"), AssistantMessage(text='{"title":"t","priority":1}')]


async def test_a_model_that_answers_in_text_is_read_as_in_instructions_mode() -> None:
    model = ScriptedModel('Sure: {"title": "t", "priority": 4} Hope this helps!')
    svc = agentrt.build(Desk, model=model, output_mode="tool")
    assert await svc.ticket("m", "q") == Ticket(title="t", priority=4)


async def test_argument_fragments_stream_as_text_for_partial_snapshots() -> None:
    fragments = ['{"value": [{"title": "a", "priority": 1}, ', '{"title": "b", "priority": 2}', "]}"]
    model = ScriptedModel(
        [ToolCallDelta(0, "call_a", ANSWER_TOOL, "")] + [ToolCallDelta(0, None, None, f) for f in fragments]
    )
    stream = await agentrt.build(Desk, model=model, output_mode="tool").tickets("q")
    snapshots = [snapshot async for snapshot in stream]
    a, b = Ticket(title="a", priority=1), Ticket(title="b", priority=2)
    assert snapshots == [[a], [a, b]]
    assert (await stream.result()).text == "".join(fragments)


async def test_the_budget_for_tool_calls_does_not_count_the_answer() -> None:
    model = ScriptedModel(
        [CallTool("customer", {"customer_id": "c1"}, id="call_1")], [answer({"title": "t", "priority": 5})]
    )
    svc = agentrt.build(Desk, model=model, tools=[Lookup()], output_mode="tool", budget=Budget(tool_calls=1))
    assert await svc.ticket("m", "q") == Ticket(title="t", priority=5)


async def test_at_a_loop_limit_the_last_request_offers_the_answer_tool_alone() -> None:
    model = ScriptedModel(
        [CallTool("customer", {"customer_id": "c1"}, id="call_1")],
        [CallTool("customer", {"customer_id": "c2"}, id="call_2")],  # past the limit: never runs
        [answer({"title": "t", "priority": 1})],
    )
    settings = ToolSettings(max_rounds=1, on_limit="final_answer")
    svc = agentrt.build(Desk, model=model, tools=[Lookup()], tool_settings=settings, output_mode="tool")
    assert await svc.ticket("m", "q") == Ticket(title="t", priority=1)
    last = model.requests[-1]
    assert [spec.name for spec in last.tools] == [ANSWER_TOOL] and last.tool_choice == ANSWER_TOOL
    assert last.messages[-1] == UserMessage.of(
        "The tool budget for this request is used up. Call no other tool: give your answer now with "
        "final_answer, as well as you can, with the information you already have."
    )


async def test_at_a_loop_limit_that_raises_the_answer_tool_does_not_count_as_a_round() -> None:
    model = ScriptedModel(
        [CallTool("customer", {"customer_id": "c1"}, id="call_1")],
        [CallTool("customer", {"customer_id": "c2"}, id="call_2")],
    )
    svc = agentrt.build(
        Desk, model=model, tools=[Lookup()], tool_settings=ToolSettings(max_rounds=1), output_mode="tool"
    )
    with pytest.raises(ToolLoopLimitError):
        await svc.ticket("m", "q")


@pytest.mark.parametrize(
    ("capabilities", "choice", "instructed"),
    [
        (Capabilities(), ANSWER_TOOL, False),
        (Capabilities(tool_choice_named=False), "required", False),
        (Capabilities(tool_choice_named=False, tool_choice_required=False), None, True),
    ],
)
async def test_the_tool_is_forced_as_far_as_the_model_allows(
    capabilities: Capabilities, choice: str | None, instructed: bool
) -> None:
    model = ScriptedModel([answer({"value": 1})], capabilities=capabilities)
    await agentrt.build(Desk, model=model, output_mode="tool").priority("q")
    request = model.requests[0]
    assert request.tool_choice == choice
    said = request.messages[-1].text
    assert said == (
        "q\nGive your answer by calling the final_answer tool; do not answer in text." if instructed else "q"
    )


@pytest.mark.parametrize(
    ("capabilities", "tools", "choice", "format_"),
    [
        (Capabilities(tool_output=True), [ANSWER_TOOL], ANSWER_TOOL, None),  # auto: tool mode
        (Capabilities(tool_output=True, json_schema=True), [], None, "JsonSchemaFormat"),  # schema wins
        (Capabilities(), [], None, None),  # instructions
    ],
)
async def test_auto_picks_the_mode_from_the_declared_capabilities(
    capabilities: Capabilities, tools: list[str], choice: str | None, format_: str | None
) -> None:
    model = ScriptedModel([answer({"value": 1})] if tools else "1", capabilities=capabilities)
    assert (await agentrt.build(Desk, model=model).priority("q")).value == 1
    request = model.requests[0]
    assert [spec.name for spec in request.tools] == tools and request.tool_choice == choice
    assert type(request.response_format).__name__ == (format_ or "NoneType")


async def test_methods_that_return_text_ignore_the_build_s_mode() -> None:
    model = ScriptedModel("hello")
    stream = await agentrt.build(Desk, model=model, output_mode="tool").chat("q")
    assert [token async for token in stream] == ["hello"]
    assert model.requests[0].tools == () and model.requests[0].tool_choice is None


async def test_a_method_s_mode_wins_over_the_build_s() -> None:
    class Service:
        @method_options(output_mode="tool")
        async def ask(self, text: str) -> int: ...

        async def other(self, text: str) -> int: ...

    model = ScriptedModel([answer({"value": 1})], "2")
    svc = agentrt.build(Service, model=model, output_mode="instructions")
    assert await svc.ask("q") == 1
    assert await svc.other("q") == 2
    assert model.requests[0].tool_choice == ANSWER_TOOL
    assert model.requests[1].tools == () and model.requests[1].messages[-1].text != "q"


def test_declaration_errors_name_the_method() -> None:
    class One:
        async def ask(self, text: str) -> int: ...

    class Text:
        @method_options(output_mode="tool")
        async def ask(self, text: str) -> str: ...

    @tool("A tool that takes the answer tool's name.")
    def final_answer(text: str) -> str:
        return text

    with pytest.raises(ConfigurationError, match=r"One: output_mode must be one of 'auto', .*got 'xml'"):
        agentrt.build(One, model=ScriptedModel(), output_mode="xml")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"@method_options: output_mode must be one of"):
        method_options(output_mode="yaml")  # type: ignore[arg-type]
    with pytest.raises(
        ConfigurationError, match=r"One\.ask: output_mode 'schema' needs a model that declares"
    ):
        agentrt.build(One, model=ScriptedModel(capabilities=Capabilities()), output_mode="schema")
    with pytest.raises(ConfigurationError, match=r"One\.ask: output_mode 'json' needs"):
        agentrt.build(One, model=ScriptedModel(), output_mode="json")
    with pytest.raises(ConfigurationError, match=r"One\.ask: output_mode 'tool' needs"):
        agentrt.build(One, model=ScriptedModel(capabilities=Capabilities(tools=False)), output_mode="tool")
    with pytest.raises(
        ConfigurationError, match=r"Text\.ask: output_mode 'tool' is for structured return types"
    ):
        agentrt.build(Text, model=ScriptedModel())
    with pytest.raises(ConfigurationError, match=r"One\.ask: a tool is named 'final_answer'"):
        agentrt.build(One, model=ScriptedModel(), tools=[final_answer], output_mode="tool")
    agentrt.build(One, model=ScriptedModel(), tools=[final_answer])  # a tool of that name is fine otherwise


async def test_a_tool_provider_that_returns_the_answer_tool_s_name_is_an_error() -> None:
    @tool("A tool that takes the answer tool's name.")
    def final_answer(text: str) -> str:
        return text

    class One:
        async def ask(self, text: str) -> int: ...

    model = ScriptedModel([answer({"value": 1})])
    svc = agentrt.build(One, model=model, tool_provider=lambda request: [final_answer], output_mode="tool")
    with pytest.raises(
        ConfigurationError, match=r"One\.ask: the tool provider returned a tool named 'final_answer'"
    ):
        await svc.ask("q")
    assert model.requests == []


# --- through the OpenAI-compatible adapter --------------------------------------------------------------


def sse(*deltas: dict[str, Any], finish: str = "tool_calls") -> bytes:
    """A Chat Completions stream in the shape OpenAI sends (cassette 12): a role chunk, the deltas,
    a finish chunk, a usage chunk, `[DONE]`."""
    head = {
        "id": "chatcmpl-ASv9l0RKJrq2fTx2dK5jhJoIr4rMI",
        "object": "chat.completion.chunk",
        "created": 1731456257,
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_0ba0d124f1",
    }

    def chunk(delta: dict[str, Any], reason: str | None = None) -> str:
        body = {
            **head,
            "usage": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}],
        }
        return "data: " + json.dumps(body, separators=(",", ":")) + "\n\n"

    usage = {"prompt_tokens": 80, "completion_tokens": 17, "total_tokens": 97}
    events = [chunk({"role": "assistant", "content": None})]
    events += [chunk(delta) for delta in deltas]
    events.append(chunk({}, finish))
    events.append(
        "data: " + json.dumps({**head, "choices": [], "usage": usage}, separators=(",", ":")) + "\n\n"
    )
    events.append("data: [DONE]\n\n")
    return "".join(events).encode()


async def test_through_the_openai_adapter_the_server_is_asked_for_the_tool_and_its_call_is_the_value() -> (
    None
):
    body = sse(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_hqkL24CLEwnniv4GDrjk14Iu",
                    "type": "function",
                    "function": {"name": "final_answer", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"tit'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'le": "Printer", "pri'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'ority": 2}'}}]},
    )
    sent: list[dict[str, Any]] = []

    def server(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(
            200,
            headers={"Content-Type": "text/event-stream; charset=utf-8"},
            stream=Parts([body[:301], body[301:]]),
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
        model = OpenAIChatModel(
            "gpt-4o-mini",
            base_url="https://llm.test/v1",
            api_key="sk-test",
            client=client,
            retry=RetryPolicy(max_attempts=1),
        )
        svc = agentrt.build(Desk, model=model, output_mode="tool")
        assert await svc.ticket("m", "The printer is on fire") == Ticket(title="Printer", priority=2)

    (request,) = sent
    assert request["tool_choice"] == {"type": "function", "function": {"name": "final_answer"}}
    (offered,) = request["tools"]
    assert offered["type"] == "function"
    assert offered["function"]["name"] == "final_answer"
    assert offered["function"]["parameters"] == Ticket.model_json_schema()
    assert "response_format" not in request
    assert request["messages"][-1] == {"role": "user", "content": "The printer is on fire"}


# --- found by an outside review ------------------------------------------------------------------------


async def test_the_answer_is_the_first_answer_call_alone() -> None:
    model = ScriptedModel(
        [
            "Sure! Here it is: ",  # a preamble: not the answer
            answer({"value": [3, 4]}),
            answer({"value": [5]}, call_id="call_b"),  # a second answer: the first one stands
            " Hope this helps.",  # after the answer: not the answer
        ]
    )

    class Numbers:
        async def numbers(self, conversation: Annotated[str, MemoryId], text: str) -> Result[list[int]]: ...

    numbers = agentrt.build(Numbers, model=model, output_mode="tool", memory=agentrt.memory.window())
    result = await numbers.numbers("m", "q")
    assert result.value == [3, 4] and result.text == '{"value":[3,4]}'
    stored = await agentrt.memory.access(numbers).read("m")
    assert stored == [UserMessage.of("q"), AssistantMessage(text='{"value":[3,4]}')]


async def test_an_answer_in_text_in_tool_mode_is_released_whole_at_the_end() -> None:
    model = ScriptedModel(["[1, ", "2]"])

    class Numbers:
        async def numbers(self, text: str) -> PartialStream[list[int]]: ...

    stream = await agentrt.build(Numbers, model=model, output_mode="tool").numbers("q")
    deltas = [event.text async for event in stream.events() if isinstance(event, agentrt.TextDelta)]
    assert deltas == ["[1, 2]"]  # held while it could have been a preamble
    assert (await stream.result()).value == [1, 2]
