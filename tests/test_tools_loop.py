"""The tool round-trip loop: one loop for await, Result and stream; concurrency, failures, limits,
cancellation."""

from __future__ import annotations

import contextvars
import logging
from typing import Annotated, Any

import anyio
import pytest
from pydantic import BaseModel

import agentrt
from agentrt import (
    AssistantMessage,
    Completed,
    LoopLimit,
    MemoryId,
    RequestIssued,
    ResponseReceived,
    Result,
    Started,
    SystemMessage,
    TextDelta,
    TokenStream,
    ToolArgumentsError,
    ToolCall,
    ToolCallRequested,
    ToolContext,
    ToolExecuted,
    ToolExecutionError,
    ToolLoopLimitError,
    ToolOutcome,
    ToolRequest,
    ToolResultMessage,
    ToolSettings,
    ToolTimeoutError,
    UnknownToolError,
    Usage,
    UserMessage,
    system_message,
    tool,
)
from agentrt.testing import CallTool, FunctionModel, ScriptedModel
from agentrt.tools import ToolFailure
from agentrt.tools._declare import define_tool
from agentrt.tools._run import JOURNAL, OUTCOME_UNKNOWN

REQUEST_CONTEXT: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="-")


class Weather:
    def __init__(self) -> None:
        self.seen_context: list[str] = []

    @tool("Current temperature in a city, in °C.")
    async def temperature(self, city: str) -> float:
        return {"Bern": 21.5, "Basel": 23.0}[city]

    @tool("Convert °C to °F.")
    def to_fahrenheit(self, celsius: float) -> float:
        # A sync tool: runs in a worker thread, and still sees the caller's context variables.
        self.seen_context.append(REQUEST_CONTEXT.get())
        return round(celsius * 9 / 5 + 32, 1)


@system_message("You answer weather questions.")
class Assistant:
    async def ask(self, question: str) -> str: ...

    async def ask_result(self, question: str) -> Result[str]: ...

    async def ask_stream(self, question: str) -> TokenStream: ...


TWO_ROUNDS = (
    [
        "Let me check.",
        CallTool("temperature", {"city": "Bern"}, id="c1"),
        CallTool("temperature", {"city": "Basel"}, id="c2"),
        Usage(20, 10),
    ],
    [CallTool("to_fahrenheit", {"celsius": 23.0}, id="c3"), Usage(40, 5)],
    ["Basel is warmer: ", "73.4 °F.", Usage(60, 8)],
)

EXPECTED_LAST_REQUEST = (
    SystemMessage(text="You answer weather questions."),
    UserMessage.of("Which city is warmer, in °F?"),
    AssistantMessage(
        text="Let me check.",
        tool_calls=(
            ToolCall(id="c1", name="temperature", arguments='{"city":"Bern"}'),
            ToolCall(id="c2", name="temperature", arguments='{"city":"Basel"}'),
        ),
    ),
    ToolResultMessage(tool_call_id="c1", tool_name="temperature", text="21.5"),
    ToolResultMessage(tool_call_id="c2", tool_name="temperature", text="23.0"),
    AssistantMessage(tool_calls=(ToolCall(id="c3", name="to_fahrenheit", arguments='{"celsius":23.0}'),)),
    ToolResultMessage(tool_call_id="c3", tool_name="to_fahrenheit", text="73.4"),
)


def assistant(
    *script: Any,
    settings: ToolSettings | None = None,
    capabilities: agentrt.Capabilities | None = None,
    **kw: Any,
) -> tuple[Assistant, ScriptedModel]:
    model = ScriptedModel(*script, capabilities=capabilities)
    built = agentrt.build(
        Assistant, model=model, tools=kw.pop("tools", [Weather()]), tool_settings=settings, **kw
    )
    return built, model


async def test_two_round_transcript_is_identical_for_str_result_and_stream() -> None:
    question = "Which city is warmer, in °F?"
    as_str, str_model = assistant(*TWO_ROUNDS)
    as_result, result_model = assistant(*TWO_ROUNDS)
    as_stream, stream_model = assistant(*TWO_ROUNDS)

    REQUEST_CONTEXT.set("req-7")
    text = await as_str.ask(question)
    result = await as_result.ask_result(question)
    stream = await as_stream.ask_stream(question)
    tokens = [token async for token in stream]
    streamed = await stream.result()

    assert text == "Basel is warmer: 73.4 °F."
    assert result == streamed
    assert result.value == text
    assert tokens == ["Let me check.", "Basel is warmer: ", "73.4 °F."]
    for model in (str_model, result_model, stream_model):
        assert len(model.requests) == 3
        assert model.requests[2].messages == EXPECTED_LAST_REQUEST
        assert model.requests[1].messages == EXPECTED_LAST_REQUEST[:5]
        assert [t.name for t in model.requests[0].tools] == ["temperature", "to_fahrenheit"]
        assert all(stream.closed for stream in model.streams)
    assert str_model.requests == result_model.requests == stream_model.requests
    assert [(e.name, e.call_id, e.round, e.outcome) for e in result.tool_executions] == [
        ("temperature", "c1", 1, ToolOutcome.SUCCESS),
        ("temperature", "c2", 1, ToolOutcome.SUCCESS),
        ("to_fahrenheit", "c3", 2, ToolOutcome.SUCCESS),
    ]
    assert result.usage == Usage(120, 23)


async def test_tool_events_appear_between_rounds_in_the_stream() -> None:
    svc, _ = assistant(*TWO_ROUNDS)

    stream = await svc.ask_stream("Which city is warmer, in °F?")
    events = [type(e).__name__ for e in [e async for e in stream.events()] if not isinstance(e, Usage)]

    assert events == [
        "Started",
        "RequestIssued",
        "TextDelta",
        "ResponseReceived",
        "ToolCallRequested",
        "ToolCallRequested",
        "ToolExecuted",
        "ToolExecuted",
        "RequestIssued",
        "ResponseReceived",
        "ToolCallRequested",
        "ToolExecuted",
        "RequestIssued",
        "TextDelta",
        "TextDelta",
        "ResponseReceived",
        "Completed",
    ]


async def test_listeners_see_tool_events_with_hashes_and_logs_never_show_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[object] = []
    svc, _ = assistant(
        [CallTool("temperature", {"city": "Bern"}, id="c1")], "21.5 °C", listeners=[seen.append]
    )

    with caplog.at_level(logging.DEBUG, logger="agentrt"):
        await svc.ask("Bern?")

    requested = next(e for e in seen if isinstance(e, ToolCallRequested))
    executed = next(e for e in seen if isinstance(e, ToolExecuted))
    assert requested.round == 1 and requested.call.name == "temperature"
    assert requested.arguments_hash == executed.execution.arguments_hash
    assert len(requested.arguments_hash) == 16
    assert executed.execution.duration >= 0 and executed.execution.error_kind is None
    log = "\n".join(r.getMessage() for r in caplog.records)
    assert requested.arguments_hash in log
    assert "Bern" not in log
    # The event carries the call to code in this process (the SSE endpoint's `tool_details` needs
    # it); what a listener that logs its events prints shows the hash, as agentrt's logs do.
    assert requested.call.arguments == '{"city":"Bern"}'
    assert repr(requested) == (
        f"ToolCallRequested(invocation_id={requested.invocation_id!r}, name='temperature', "
        f"call_id='c1', arguments_hash={requested.arguments_hash!r}, round=1)"
    )
    assert "Bern" not in str(requested)


@pytest.mark.virtual_clock
async def test_calls_of_a_round_run_concurrently_and_the_limit_serializes_them() -> None:
    class Slow:
        @tool("Wait a second.")
        async def wait(self, label: str) -> str:
            await anyio.sleep(1)
            return label

    script = ([CallTool("wait", {"label": "a"}), CallTool("wait", {"label": "b"})], "done")
    together, _ = assistant(*script, tools=[Slow()])
    serial, serial_model = assistant(*script, tools=[Slow()], settings=ToolSettings(max_concurrency=1))

    start = anyio.current_time()
    await together.ask("go")
    parallel_time = anyio.current_time() - start
    start = anyio.current_time()
    await serial.ask("go")
    serial_time = anyio.current_time() - start

    assert parallel_time == pytest.approx(1, abs=0.05)
    assert serial_time == pytest.approx(2, abs=0.05)
    results = serial_model.requests[1].messages[-2:]
    assert [m.text for m in results] == ["a", "b"]  # type: ignore[union-attr]


class Faulty:
    @tool("Look up a record.")
    def lookup(self, record_id: int) -> str:
        raise ValueError("database password is hunter2")

    @tool("Slow report.", timeout=1)
    async def report(self) -> str:
        await anyio.sleep(10)
        return "late"

    @tool("Fine.")
    async def fine(self) -> str:
        await anyio.sleep(2)
        return "fine"


FAILING_ROUND = [
    CallTool("lookup", {"record_id": "not a number"}, id="f1"),
    CallTool("missing_tool", {}, id="f2"),
    CallTool("lookup", {"record_id": 7}, id="f3"),
    CallTool("report", {}, id="f4"),
    CallTool("fine", {}, id="f5"),
]


@pytest.mark.virtual_clock
async def test_failures_become_sanitized_tool_results_and_the_loop_continues() -> None:
    svc, model = assistant(FAILING_ROUND, "Sorry.", tools=[Faulty()])

    result = await svc.ask_result("go")

    results = model.requests[1].messages[-5:]
    texts = [m.text for m in results]  # type: ignore[union-attr]
    assert texts == [
        "Error: tool 'lookup' was called with invalid arguments (ValidationError).",
        "Error: there is no tool named 'missing_tool'.",
        "Error: tool 'lookup' failed (ValueError).",
        "Error: tool 'report' timed out after 1 s.",
        "fine",
    ]
    assert [m.is_error for m in results] == [True, True, True, True, False]  # type: ignore[union-attr]
    assert [e.outcome for e in result.tool_executions] == [
        ToolOutcome.INVALID_ARGUMENTS,
        ToolOutcome.UNKNOWN_TOOL,
        ToolOutcome.ERROR,
        ToolOutcome.TIMEOUT,
        ToolOutcome.SUCCESS,
    ]
    assert result.tool_executions[2].error_kind == "ValueError"
    assert result.value == "Sorry."


@pytest.mark.virtual_clock
async def test_error_detail_is_opt_in() -> None:
    svc, model = assistant(
        FAILING_ROUND, "Sorry.", tools=[Faulty()], settings=ToolSettings(error_detail=True)
    )

    await svc.ask("go")

    texts = [m.text for m in model.requests[1].messages[-5:]]  # type: ignore[union-attr]
    assert "Input should be a valid integer" in texts[0]
    assert texts[2] == "Error: tool 'lookup' failed (ValueError): database password is hunter2."


@pytest.mark.virtual_clock
@pytest.mark.parametrize(
    ("setting", "error", "tool_name"),
    [
        ("on_invalid_arguments", ToolArgumentsError, "lookup"),
        ("on_unknown_tool", UnknownToolError, "missing_tool"),
        ("on_error", ToolExecutionError, "lookup"),
        ("on_timeout", ToolTimeoutError, "report"),
    ],
)
async def test_raise_policy_raises_the_typed_error(
    setting: str, error: type[Exception], tool_name: str
) -> None:
    svc, model = assistant(FAILING_ROUND, tools=[Faulty()], settings=ToolSettings(**{setting: "raise"}))

    with pytest.raises(error) as info:
        await svc.ask("go")

    assert info.value.tool == tool_name  # type: ignore[attr-defined]
    assert len(model.requests) == 1
    if error is ToolExecutionError:
        assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.virtual_clock
async def test_handler_policy_replaces_the_text() -> None:
    failures: list[ToolFailure] = []

    async def explain(failure: ToolFailure) -> str:
        failures.append(failure)
        return f"{failure.tool} is unavailable, try later"

    svc, model = assistant(FAILING_ROUND, "ok", tools=[Faulty()], settings=ToolSettings(on_error=explain))

    await svc.ask("go")

    assert model.requests[1].messages[-3].text == "lookup is unavailable, try later"  # type: ignore[union-attr]
    assert [f.call.id for f in failures] == ["f3"]
    assert isinstance(failures[0].error, ValueError)


def repeating(*, distinct: bool, rounds: int = 20) -> list[list[Any]]:
    return [
        [CallTool("temperature", {"city": "Bern" if not distinct or i % 2 else "Basel"}, id=f"r{i}")]
        for i in range(rounds)
    ]


@pytest.mark.parametrize(
    ("settings", "script", "reason", "executed"),
    [
        (ToolSettings(max_rounds=2), repeating(distinct=True), LoopLimit.MAX_ROUNDS, 2),
        (
            ToolSettings(max_calls=3),
            [[CallTool("temperature", {"city": "Bern"}), CallTool("temperature", {"city": "Basel"})]] * 2,
            LoopLimit.MAX_CALLS,
            2,
        ),
        (ToolSettings(max_identical_calls=2), repeating(distinct=False), LoopLimit.REPEATED_CALL, 2),
        (
            ToolSettings(max_failed_rounds=2),
            [[CallTool("temperature", {"city": "Paris"})]] * 5,
            LoopLimit.FAILED_ROUNDS,
            2,
        ),
    ],
)
async def test_every_loop_limit_raises_its_reason_with_the_partial_result(
    settings: ToolSettings, script: list[Any], reason: LoopLimit, executed: int
) -> None:
    svc, model = assistant(*script, settings=settings)

    with pytest.raises(ToolLoopLimitError) as info:
        await svc.ask("loop")

    assert info.value.reason is reason
    partial = info.value.partial
    assert partial.value is None
    assert len(partial.tool_executions) == executed
    assert partial.usage.output_tokens > 0
    assert len(model.requests) == len(model.streams)
    assert all(s.closed for s in model.streams)


async def test_final_answer_policy_makes_exactly_one_more_request_that_rules_out_tools() -> None:
    svc, model = assistant(
        *repeating(distinct=True, rounds=2),
        "Bern is 21.5 °C.",
        settings=ToolSettings(max_rounds=1, on_limit="final_answer"),
    )

    result = await svc.ask_result("Bern?")

    assert result.value == "Bern is 21.5 °C."
    assert len(model.requests) == 3
    final = model.requests[2]
    # The tools stay defined (a transcript of tool calls without them is refused by Anthropic), and
    # tool_choice "none" rules out another call.
    assert final.tools == model.requests[1].tools and final.tool_choice == "none"
    assert final.messages[:-1] == model.requests[1].messages
    assert final.messages[-1] == UserMessage.of(agentrt.tools._run.FINAL_ANSWER_PROMPT)
    assert len(result.tool_executions) == 1


@pytest.mark.parametrize("view", ["ask", "ask_stream"])
@pytest.mark.parametrize("blank", ["", " ", "\n\n"])
async def test_final_answer_that_calls_tools_again_is_a_typed_error_not_an_empty_answer(
    view: str, blank: str
) -> None:
    svc, model = assistant(
        *repeating(distinct=True, rounds=2),
        [blank, CallTool("temperature", {"city": "Basel"})],  # ignores "answer without tools"
        settings=ToolSettings(max_rounds=1, on_limit="final_answer"),
    )

    async def call() -> None:
        if view == "ask":
            await svc.ask("Bern?")
        else:
            async for _ in await svc.ask_stream("Bern?"):
                pass

    with pytest.raises(ToolLoopLimitError, match="called tools again") as info:
        await call()

    assert info.value.reason is LoopLimit.MAX_ROUNDS
    partial = info.value.partial
    assert len(partial.tool_executions) == 1  # the stray call did not run
    # The transcript: the final request as sent (ending with the prompt), then its response.
    assert partial.messages[-2] == UserMessage.of(agentrt.tools._run.FINAL_ANSWER_PROMPT)
    assert partial.messages[-1].tool_calls  # type: ignore[union-attr]
    assert len(model.requests) == 3 and all(s.closed for s in model.streams)


async def test_final_answer_with_text_and_stray_tool_calls_keeps_the_text() -> None:
    svc, model = assistant(
        *repeating(distinct=True, rounds=2),
        ["Bern is 21.5 °C.", CallTool("temperature", {"city": "Basel"})],
        settings=ToolSettings(max_rounds=1, on_limit="final_answer"),
    )

    result = await svc.ask_result("Bern?")

    assert result.value == "Bern is 21.5 °C."
    assert len(result.tool_executions) == 1 and len(model.requests) == 3


async def test_cancelling_the_invocation_cancels_running_tools_and_ends_the_stream() -> None:
    started = anyio.Event()
    observed: list[str] = []

    class Blocking:
        @tool("Wait for a signal that never comes.")
        async def wait(self) -> str:
            started.set()
            try:
                await anyio.sleep_forever()
            finally:
                observed.append("cancelled")
            return "never"  # pragma: no cover

    svc, model = assistant([CallTool("wait"), CallTool("wait")], tools=[Blocking()])
    stream = await svc.ask_stream("go")
    seen: list[object] = []

    async def consume() -> None:
        async for event in stream.events():
            seen.append(event)

    async with anyio.create_task_group() as group:
        group.start_soon(consume)
        await started.wait()
        group.cancel_scope.cancel()

    assert observed == ["cancelled", "cancelled"]
    assert not any(isinstance(e, ToolExecuted | Completed) for e in seen)
    assert model.streams[0].closed
    assert [t async for t in stream] == []


class Ticket(BaseModel):
    code: str


async def test_immediate_tools_end_the_invocation_with_their_result() -> None:
    class Booking:
        @tool("Book a ticket.", immediate=True)
        async def book(self, destination: str) -> Ticket:
            return Ticket(code=f"T-{destination}")

    class Service:
        async def book(self, request: str) -> Ticket: ...

        async def book_text(self, request: str) -> TokenStream: ...

    model = ScriptedModel(
        [CallTool("book", {"destination": "Basel"})], [CallTool("book", {"destination": "Bern"})]
    )
    svc = agentrt.build(Service, model=model, tools=[Booking()])

    ticket = await svc.book("Basel please")
    stream = await svc.book_text("Bern please")
    tokens = [t async for t in stream]

    assert ticket == Ticket(code="T-Basel")
    assert tokens == ['{"code":"T-Bern"}']
    assert (await stream.result()).tool_executions[0].value == Ticket(code="T-Bern")
    assert len(model.requests) == 2


async def test_memory_id_and_context_are_injected_and_hidden_from_the_model() -> None:
    calls: list[tuple[str, ToolContext]] = []

    class Orders:
        @tool("List the user's orders.")
        async def orders(self, user: Annotated[str, MemoryId], context: ToolContext) -> list[str]:
            calls.append((user, context))
            return ["SO-1"]

    class Service:
        async def chat(self, user: Annotated[str, MemoryId], question: str) -> str: ...

    model = ScriptedModel([CallTool("orders", id="o1")], "You have SO-1.")
    svc = agentrt.build(Service, model=model, tools=[Orders()])

    await svc.chat("user-42", "my orders?")

    assert model.requests[0].tools[0].parameters["properties"] == {}
    ((user, context),) = calls
    assert user == "user-42"
    assert (context.memory_id, context.call_id, context.round, context.method) == (
        "user-42",
        "o1",
        1,
        "Service.chat",
    )
    assert model.requests[1].messages[-1].text == '["SO-1"]'  # type: ignore[union-attr]


async def test_dynamic_tool_provider_is_consulted_once_per_invocation() -> None:
    asked: list[ToolRequest] = []

    @tool("Secret admin tool.")
    async def admin() -> str:
        return "admin"

    async def provider(request: ToolRequest) -> list[object]:
        asked.append(request)
        return [admin] if request.memory_id == "root" else []

    class Service:
        async def chat(self, user: Annotated[str, MemoryId], question: str) -> str: ...

    model = ScriptedModel("hi", [CallTool("admin")], "done")
    svc = agentrt.build(Service, model=model, tools=[Weather()], tool_provider=provider)

    await svc.chat("guest", "hello")
    await svc.chat("root", "hello")

    assert [r.memory_id for r in asked] == ["guest", "root"]
    assert asked[0].user_message == UserMessage.of("hello")
    assert [t.name for t in model.requests[0].tools] == ["temperature", "to_fahrenheit"]
    assert [t.name for t in model.requests[1].tools] == ["temperature", "to_fahrenheit", "admin"]
    assert model.requests[2].messages[-1].text == "admin"  # type: ignore[union-attr]


async def test_sync_tools_get_context_variables() -> None:
    weather = Weather()
    svc, _ = assistant(*TWO_ROUNDS, tools=[weather])
    token = REQUEST_CONTEXT.set("req-42")
    try:
        await svc.ask("go")
    finally:
        REQUEST_CONTEXT.reset(token)

    assert weather.seen_context == ["req-42"]


async def test_no_tools_configured_sends_none_and_treats_tool_calls_as_final() -> None:
    model = ScriptedModel(["text", CallTool("temperature", {"city": "Bern"})])
    svc = agentrt.build(Assistant, model=model)

    stream = await svc.ask_stream("?")
    kinds = [type(e) async for e in stream.events()]
    result = await stream.result()

    assert model.requests[0].tools == ()
    assert result.value == "text"
    assert kinds == [Started, RequestIssued, TextDelta, ResponseReceived, Completed]


async def test_a_forced_tool_choice_applies_to_the_first_request_only() -> None:
    svc, model = assistant(
        [CallTool("temperature", {"city": "Bern"})],
        "21.5 °C",
        settings=ToolSettings(tool_choice="temperature"),
    )

    await svc.ask("Bern?")

    assert model.requests[0].tool_choice == "temperature"
    assert model.requests[1].tool_choice is None
    assert [t.name for t in model.requests[1].tools] == ["temperature", "to_fahrenheit"]


async def test_a_model_without_auto_tool_choice_gets_tools_only_while_one_is_forced() -> None:
    capabilities = agentrt.Capabilities(tool_choice_auto=False, tool_choice_required=False)
    forced, forced_model = assistant(
        [CallTool("temperature", {"city": "Bern"})],
        "21.5 °C",
        settings=ToolSettings(tool_choice="temperature"),
        capabilities=capabilities,
    )

    assert await forced.ask("Bern?") == "21.5 °C"

    assert forced_model.requests[0].tool_choice == "temperature"
    assert forced_model.requests[1].tools == ()
    # Without a forced tool such a model would never be offered its tools: a build error.
    with pytest.raises(agentrt.ConfigurationError, match="cannot choose tools itself"):
        assistant("never", capabilities=capabilities)


def test_tool_choice_is_checked_at_build() -> None:
    with pytest.raises(agentrt.ConfigurationError, match="tool_choice 'nope' names no configured tool"):
        assistant(settings=ToolSettings(tool_choice="nope"))
    with pytest.raises(agentrt.ConfigurationError, match=r"Capabilities\.tool_choice_named"):
        assistant(
            settings=ToolSettings(tool_choice="temperature"),
            capabilities=agentrt.Capabilities(tool_choice_named=False),
        )
    model = ScriptedModel(capabilities=agentrt.Capabilities(tool_choice_required=False))
    with pytest.raises(agentrt.ConfigurationError, match=r"Capabilities\.tool_choice_required"):
        agentrt.build(
            Assistant, model=model, tools=[Weather()], tool_settings=ToolSettings(tool_choice="required")
        )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout": -5}, "timeout must be positive"),
        ({"max_concurrency": 0}, "max_concurrency must be at least 1"),
        ({"max_rounds": 0}, "max_rounds must be at least 1"),
        ({"on_limit": "final-answer"}, "on_limit must be"),
        ({"on_error": "Raise"}, "on_error must be 'report', 'raise' or a handler"),
        ({"on_timeout": 3}, "on_timeout must be"),
    ],
)
def test_tool_settings_are_validated(options: dict[str, Any], message: str) -> None:
    with pytest.raises(agentrt.ConfigurationError, match=message):
        ToolSettings(**options)


class Awkward:
    def __init__(self) -> None:
        self.sibling_finished = False

    @tool("Returns something JSON cannot carry.")
    async def unserializable(self) -> object:
        return object()

    @tool("Takes a while, then succeeds.")
    async def slow(self) -> str:
        await anyio.sleep(1)
        self.sibling_finished = True
        return "slow done"

    @tool("Parameters named like pydantic's own attributes.")
    async def clash(self, json: str, schema: int, model_config: bool = False) -> str:
        return f"{json}/{schema}/{model_config}"


@pytest.mark.virtual_clock
async def test_failures_outside_the_tool_body_do_not_cancel_siblings() -> None:
    tools = Awkward()

    def broken_handler(failure: ToolFailure) -> str:
        raise RuntimeError("handler bug")

    svc, model = assistant(
        [CallTool("unserializable", id="u"), CallTool("slow", id="s"), CallTool("missing", id="m")],
        "ok",
        tools=[tools],
        settings=ToolSettings(on_unknown_tool=broken_handler),
    )

    result = await svc.ask_result("go")

    assert tools.sibling_finished
    texts = [m.text for m in model.requests[1].messages[-3:]]  # type: ignore[union-attr]
    assert texts == [
        "Error: tool 'unserializable' failed (TypeError).",
        "slow done",
        "Error: there is no tool named 'missing'.",
    ]
    assert [e.outcome for e in result.tool_executions] == [
        ToolOutcome.ERROR,
        ToolOutcome.SUCCESS,
        ToolOutcome.UNKNOWN_TOOL,
    ]


async def test_parameters_may_be_named_like_pydantic_attributes() -> None:
    svc, model = assistant(
        [CallTool("clash", {"json": "j", "schema": 2, "model_config": True})], "ok", tools=[Awkward()]
    )

    await svc.ask("go")

    properties = model.requests[0].tools[0].parameters["properties"]
    assert list(properties) == ["json", "schema", "model_config"]
    assert model.requests[1].messages[-1].text == "j/2/True"  # type: ignore[union-attr]


async def test_raised_argument_errors_do_not_carry_the_arguments() -> None:
    svc, _ = assistant(
        [CallTool("temperature", {"city": 12345678})],
        settings=ToolSettings(on_invalid_arguments="raise"),
    )

    with pytest.raises(ToolArgumentsError) as info:
        await svc.ask("go")

    assert "city: Input should be a valid string" in str(info.value)
    assert "12345678" not in str(info.value)


async def test_final_answer_after_failing_rounds_keeps_the_failed_results() -> None:
    failing = [CallTool("temperature", {"city": "Paris"}, id=f"p{i}") for i in range(2)]
    svc, model = assistant(
        [failing[0]],
        [failing[1]],
        "I could not find Paris.",
        settings=ToolSettings(max_failed_rounds=2, on_limit="final_answer"),
    )

    result = await svc.ask_result("Paris?")

    assert result.value == "I could not find Paris."
    final = model.requests[2]
    assert final.tools == model.requests[1].tools and final.tool_choice == "none"
    # The last round ran: its call and result stay, then the request for an answer.
    assert [m.role for m in final.messages[-5:]] == ["assistant", "tool", "assistant", "tool", "user"]
    assert final.messages[-1] == UserMessage.of(agentrt.tools._run.FINAL_ANSWER_PROMPT)


async def test_the_partial_result_of_a_limit_carries_the_transcript() -> None:
    svc, model = assistant(*repeating(distinct=True, rounds=3), settings=ToolSettings(max_rounds=1))

    with pytest.raises(ToolLoopLimitError) as info:
        await svc.ask("loop")

    partial = info.value.partial
    # Everything the model saw, and its last answer (the tool calls that were not run).
    assert partial.messages[:-1] == model.requests[-1].messages
    last = partial.messages[-1]
    assert isinstance(last, AssistantMessage) and last.tool_calls[0].id == "r1"


async def test_sync_tools_of_all_invocations_share_one_thread_limit() -> None:
    # Three concurrent invocations of a service limited to two tool threads. Each tool call waits
    # (bounded) for a third to run beside it: that must never happen. With one limiter per invocation
    # (500 concurrent calls -> 4,000 threads) the third starts at once and releases the other two.
    import threading

    lock = threading.Lock()
    overflow = threading.Event()
    running = 0
    most = 0

    class Slow:
        @tool("Blocks a worker thread.")
        def block(self) -> str:
            nonlocal running, most
            with lock:
                running += 1
                most = max(most, running)
                if running > 2:
                    overflow.set()
            overflow.wait(timeout=0.3)  # a bound on a wait for what must not happen, not a sync point
            with lock:
                running -= 1
            return "done"

    def respond(request: agentrt.ModelRequest) -> Any:
        return "ok" if isinstance(request.messages[-1], ToolResultMessage) else [CallTool("block")]

    model = FunctionModel(respond)
    service = agentrt.build(
        Assistant, model=model, tools=[Slow()], tool_settings=ToolSettings(thread_limit=2)
    )
    answers: list[str] = []

    async def ask() -> None:
        answers.append(await service.ask("go"))

    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(ask)

    assert answers == ["ok"] * 3
    assert sum(len(r.messages) == 4 for r in model.requests) == 3  # three tool results went back
    assert most == 2
    assert not overflow.is_set()


class Payments:
    def __init__(self) -> None:
        self.runs: list[str] = []

    @tool("Pay an order.")
    async def pay(self, order: str) -> str:
        self.runs.append(f"pay {order}")
        return "paid"

    @tool("Look an order up.", idempotent=True)
    async def look(self, order: str) -> str:
        self.runs.append(f"look {order}")
        return "open"


async def test_a_round_run_again_after_its_worker_died_runs_only_the_calls_safe_to_run_again() -> None:
    # What a durable turn (agentrt.durable) does to a tool round that started in a worker that died:
    # the unsafe call is not run, and the model reads that its outcome is unknown.
    round_ = [CallTool("pay", {"order": "A1"}, id="c1"), CallTool("look", {"order": "A1"}, id="c2")]
    payments = Payments()
    svc, model = assistant(round_, "Done.", tools=[payments])
    assert define_tool(payments.look).annotations == {"idempotentHint": True}
    assert define_tool(payments.pay).annotations == {}

    marked = OUTCOME_UNKNOWN.set(True)
    try:
        result = await svc.ask_result("go")
    finally:
        OUTCOME_UNKNOWN.reset(marked)

    assert payments.runs == ["look A1"]
    texts = [m.text for m in model.requests[1].messages[-2:]]  # type: ignore[union-attr]
    assert texts == ["Error: tool 'pay' failed (OutcomeUnknownError).", "open"]
    assert result.tool_executions[0].error_kind == "OutcomeUnknownError"

    # Not marked (every turn that is not a durable one run again): both run.
    svc, _ = assistant(round_, "Done.", tools=[payments])
    await svc.ask_result("go")
    # (in either order: the round's calls run concurrently, and trio randomizes which starts first)
    assert payments.runs[0] == "look A1"
    assert sorted(payments.runs[1:]) == ["look A1", "pay A1"]


class Journal:
    """A durable turn's record of unsafe calls (`CallJournal`), in a dict: by call id (the key is
    `round:call id:tool:arguments hash`), "started" or the recorded outcome."""

    def __init__(self, records: dict[str, Any]) -> None:
        self.records = records
        self.seen: list[str] = []
        self.settled: list[list[str]] = []  # the keys of each round's unsafe calls, before they run

    async def settle(self, calls: Any) -> None:
        assert self.seen == [], "settled after a call of its round started"  # (one round here)
        self.settled.append([key.rsplit(":", 1)[0] for key, _ in calls])

    async def before(self, key: str) -> dict[str, Any] | bool:
        self.seen.append(key)
        known = self.records.get(key.split(":")[1])
        if isinstance(known, dict):
            return known
        if known is not None:
            return True
        self.records[key.split(":")[1]] = "started"
        return False

    async def after(self, key: str, outcome: dict[str, Any]) -> None:
        self.records[key.split(":")[1]] = outcome


async def test_a_call_journal_runs_each_unsafe_call_once_and_reports_only_an_unfinished_one_unknown() -> None:
    # What a durable turn does per call: a call recorded finished is not run again (its text stands),
    # a call recorded started only is of unknown outcome, a call never started runs and is recorded;
    # a call safe to run again is not recorded at all.
    calls = [
        CallTool("pay", {"order": "A1"}, id="c1"),
        CallTool("pay", {"order": "B2"}, id="c2"),
        CallTool("pay", {"order": "C3"}, id="c3"),
        CallTool("look", {"order": "A1"}, id="c4"),
    ]
    payments = Payments()
    svc, model = assistant(calls, "Done.", tools=[payments])
    finished = {"result": "paid earlier", "outcome": "success", "error_kind": None, "images": []}
    journal = Journal({"c1": finished, "c2": "started"})
    marked = JOURNAL.set(journal)
    try:
        result = await svc.ask_result("go")
    finally:
        JOURNAL.reset(marked)

    assert sorted(payments.runs) == ["look A1", "pay C3"]  # (in any order: trio randomizes it)
    texts = [m.text for m in model.requests[1].messages[-4:]]  # type: ignore[union-attr]
    assert texts == ["paid earlier", "Error: tool 'pay' failed (OutcomeUnknownError).", "paid", "open"]
    assert sorted(key.rsplit(":", 1)[0] for key in journal.seen) == ["1:c1:pay", "1:c2:pay", "1:c3:pay"]
    assert journal.settled == [["1:c1:pay", "1:c2:pay", "1:c3:pay"]]  # once, the unsafe calls only
    assert journal.records["c3"] == {"result": "paid", "outcome": "success", "error_kind": None, "images": []}
    assert [e.outcome for e in result.tool_executions] == ["success", "error", "success", "success"]
