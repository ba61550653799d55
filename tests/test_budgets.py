"""Per-request budgets: every limit, on awaited calls and streams, with tools; the partial result;
the model stream closed by the pipeline; nothing left running; the precedence of build, method and
call options.

Time limits run on the virtual clock (tests/conftest.py): deadlines and sleeps take no real time, and
`anyio.current_time()` tells exactly when the pipeline stopped.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio
import pytest
from tasks import in_another_task

import agentrt
from agentrt import (
    Budget,
    BudgetExceededError,
    Completed,
    FailedEvent,
    LifecycleEvent,
    ModelSettings,
    Result,
    TextDelta,
    TokenStream,
    ToolResultMessage,
    Usage,
    call_options,
    method_options,
    tool,
)
from agentrt.testing import CallTool, Delay, FunctionModel, Hang, ScriptedModel


class Chat:
    async def ask(self, question: str) -> str: ...

    async def ask_result(self, question: str) -> Result[str]: ...

    async def stream(self, question: str) -> TokenStream: ...


class Probe:
    """Tools that record what the pipeline did to them."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.finished: list[str] = []

    @tool("Look something up (slowly).")
    async def lookup(self, query: str) -> str:
        self.started.append(query)
        try:
            await anyio.sleep(10)
        except anyio.get_cancelled_exc_class():
            self.cancelled.append(query)
            raise
        self.finished.append(query)
        return f"found {query}"


class Quick:
    """A tool that answers at once."""

    @tool("Look up.")
    async def lookup(self, query: str) -> str:
        return "ok"


def build(
    model: Any, *, budget: Budget | None = None, tools: list[object] | None = None
) -> tuple[Chat, list[LifecycleEvent]]:
    events: list[LifecycleEvent] = []
    service = agentrt.build(Chat, model=model, budget=budget, tools=tools or [], listeners=[events.append])
    return service, events


async def call(service: Chat, view: str) -> Any:
    """Run one call through a view: awaited, `Result`, or a stream read to its end."""
    if view == "ask":
        return await service.ask("go")
    if view == "result":
        return await service.ask_result("go")
    stream = await service.stream("go")
    return "".join([token async for token in stream])


VIEWS = ["ask", "result", "stream"]


def assert_failed_once(events: list[LifecycleEvent], error: BaseException) -> None:
    terminal = [e for e in events if isinstance(e, FailedEvent | Completed | agentrt.CancelledEvent)]
    assert len(terminal) == 1
    assert isinstance(terminal[0], FailedEvent) and terminal[0].error is error


# --- time -------------------------------------------------------------------------------------


@pytest.mark.virtual_clock
@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("handles_deadline", [True, False])
async def test_a_silent_model_stream_is_cut_at_the_deadline(view: str, handles_deadline: bool) -> None:
    model = ScriptedModel(["Hello ", "wor", Hang()], handles_deadline=handles_deadline)
    service, events = build(model, budget=Budget(seconds=30))
    start = anyio.current_time()

    with anyio.fail_after(1000), pytest.raises(BudgetExceededError) as info:  # fails fast if not cut
        await call(service, view)

    assert anyio.current_time() - start == pytest.approx(30)  # at the deadline, not later
    error = info.value
    assert error.limit == "seconds"
    assert error.partial.text == "Hello wor"
    assert error.partial.usage.output_tokens > 0 and error.partial.usage.estimated
    assert error.partial.spent is not None and error.partial.spent.seconds == pytest.approx(30)
    assert model.streams[0].closed and not model.streams[0].completed
    assert_failed_once(events, error)


@pytest.mark.virtual_clock
@pytest.mark.parametrize("view", VIEWS)
async def test_a_running_tool_is_cut_at_the_deadline(view: str) -> None:
    probe = Probe()
    model = ScriptedModel([CallTool("lookup", {"query": "q1"})], "never reached")
    service, events = build(model, budget=Budget(seconds=5), tools=[probe])
    tasks_before = len(anyio.get_running_tasks())
    start = anyio.current_time()

    with pytest.raises(BudgetExceededError) as info:
        await call(service, view)

    assert anyio.current_time() - start == pytest.approx(5)
    assert probe.started == ["q1"] and probe.cancelled == ["q1"] and probe.finished == []
    assert info.value.limit == "seconds"
    assert info.value.partial.tool_executions == ()  # the round did not finish
    assert len(model.requests) == 1 and model.streams[0].closed
    assert len(anyio.get_running_tasks()) == tasks_before
    assert_failed_once(events, info.value)


@pytest.mark.virtual_clock
async def test_a_slow_system_message_provider_is_cut_at_the_deadline() -> None:
    async def slow(memory_id: object) -> str:
        await anyio.sleep(60)
        return "never"

    model = ScriptedModel("never")
    service = agentrt.build(Chat, model=model, system_message=slow, budget=Budget(seconds=2))

    with pytest.raises(BudgetExceededError, match="time budget of 2 s"):
        await service.ask("go")
    assert model.requests == []


@pytest.mark.virtual_clock
async def test_the_deadline_counts_from_the_call_over_every_step() -> None:
    # 4 s of model, a 3 s tool, then a model that would take 4 s more: the budget of 9 s ends
    # in the second response.
    class Timer:
        @tool("Wait three seconds.")
        async def wait(self) -> str:
            await anyio.sleep(3)
            return "waited"

    model = ScriptedModel(["a", Delay(4), CallTool("wait")], ["b", Delay(4), "c"])
    service, _ = build(model, budget=Budget(seconds=9), tools=[Timer()])
    start = anyio.current_time()

    with pytest.raises(BudgetExceededError) as info:
        await service.ask("go")

    assert anyio.current_time() - start == pytest.approx(9)
    partial = info.value.partial
    assert partial.text == "b"
    assert [e.name for e in partial.tool_executions] == ["wait"]
    assert isinstance(partial.messages[-2], ToolResultMessage)
    assert all(s.closed for s in model.streams)


# --- tokens -----------------------------------------------------------------------------------


def chatter(n: int) -> list[Any]:
    """A response of `n` text deltas of four characters (one estimated token each)."""
    return [f"w{i:02d} " for i in range(n)]


@pytest.mark.parametrize("view", VIEWS)
async def test_an_output_token_limit_stops_the_stream_within_one_chunk(view: str) -> None:
    model = ScriptedModel(chatter(50))
    service, events = build(model, budget=Budget(output_tokens=10))

    with pytest.raises(BudgetExceededError) as info:
        await call(service, view)

    error = info.value
    assert error.limit == "output_tokens"
    assert error.partial.text == "".join(chatter(11))  # the chunk that crossed the limit, no more
    assert error.partial.usage.output_tokens == 11 and error.partial.usage.estimated
    assert model.streams[0].closed and not model.streams[0].completed
    assert_failed_once(events, error)


async def test_a_stream_reader_gets_the_tokens_before_the_limit_then_the_error() -> None:
    model = ScriptedModel(chatter(50))
    service, _ = build(model, budget=Budget(output_tokens=3))
    received: list[str] = []

    async def read(stream: TokenStream) -> None:
        async for token in stream:
            received.append(token)

    stream = await service.stream("go")
    with pytest.raises(BudgetExceededError):
        await read(stream)

    assert received == chatter(3)
    with pytest.raises(BudgetExceededError):
        await stream.result()


async def test_a_total_token_limit_counts_every_request_and_the_next_input() -> None:
    # The first response reports 40 + 5 tokens; the second request's input is estimated, and its
    # output is stopped when the total would pass 60.
    model = ScriptedModel(
        [CallTool("lookup", {"query": "q"}), Usage(40, 5)],
        chatter(40),
    )

    service, _ = build(model, budget=Budget(total_tokens=60), tools=[Quick()])

    with pytest.raises(BudgetExceededError) as info:
        await service.ask("go")

    error = info.value
    assert error.limit == "total_tokens"
    spent = error.partial.spent
    assert spent is not None
    assert spent.model_requests == 2 and spent.tool_calls == 1
    second_input = error.partial.usage.input_tokens - 40
    assert 0 < second_input < 20
    streamed = error.partial.usage.output_tokens - 5
    assert streamed == 60 - 45 - second_input + 1  # stopped at the first chunk past the total
    assert model.streams[1].closed and not model.streams[1].completed


async def test_an_input_token_limit_stops_before_the_next_request() -> None:
    model = ScriptedModel([CallTool("lookup", {"query": "q"}), Usage(500, 5)], "never")

    service, _ = build(model, budget=Budget(input_tokens=100), tools=[Quick()])

    with pytest.raises(BudgetExceededError) as info:
        await service.ask("go")

    assert info.value.limit == "input_tokens"
    assert info.value.partial.usage == Usage(500, 5)
    assert len(model.requests) == 1  # the tool call was not run, no second request was sent


async def test_usage_reported_mid_stream_is_compared_as_it_is() -> None:
    model = ScriptedModel(["a", Usage(3, 90), "b", "c"])
    service, _ = build(model, budget=Budget(output_tokens=50))

    with pytest.raises(BudgetExceededError) as info:
        await service.ask("go")

    assert info.value.partial.text == "a"
    assert model.streams[0].closed and not model.streams[0].completed


# --- requests and tool calls ------------------------------------------------------------------


@pytest.mark.parametrize("view", VIEWS)
async def test_a_model_request_limit_counts_every_tool_round(view: str) -> None:
    probe_calls: list[str] = []

    class Quick:
        @tool("Look up.")
        async def lookup(self, query: str) -> str:
            probe_calls.append(query)
            return "ok"

    model = ScriptedModel([CallTool("lookup", {"query": "1"})], [CallTool("lookup", {"query": "2"})], "never")
    service, events = build(model, budget=Budget(model_requests=2), tools=[Quick()])

    with pytest.raises(BudgetExceededError, match="budget of 2 model requests") as info:
        await call(service, view)

    assert len(model.requests) == 2 and probe_calls == ["1", "2"]
    assert [e.name for e in info.value.partial.tool_executions] == ["lookup", "lookup"]
    assert info.value.partial.spent is not None and info.value.partial.spent.model_requests == 2
    assert all(s.closed for s in model.streams)
    assert_failed_once(events, info.value)


@pytest.mark.parametrize("view", VIEWS)
async def test_a_tool_call_limit_stops_before_the_round_that_would_pass_it(view: str) -> None:
    probe = Probe()
    model = ScriptedModel(
        [
            CallTool("lookup", {"query": "a"}),
            CallTool("lookup", {"query": "b"}),
            CallTool("lookup", {"query": "c"}),
        ],
        "never",
    )
    service, _ = build(model, budget=Budget(tool_calls=2), tools=[probe])

    with pytest.raises(BudgetExceededError) as info:
        await call(service, view)

    assert info.value.limit == "tool_calls"
    assert probe.started == []  # no call of the round ran
    assert len(model.requests) == 1


async def test_spent_is_reported_on_success() -> None:
    model = ScriptedModel(["Hi", Usage(7, 1)])
    service, _ = build(model, budget=Budget(total_tokens=100, model_requests=3))

    result = await service.ask_result("go")

    assert result.budget == Budget(total_tokens=100, model_requests=3)
    assert result.spent is not None
    assert (result.spent.input_tokens, result.spent.output_tokens, result.spent.total_tokens) == (7, 1, 8)
    assert result.spent.model_requests == 1 and result.spent.tool_calls == 0
    assert not result.spent.estimated


async def test_without_a_budget_nothing_is_reported() -> None:
    service, _ = build(ScriptedModel("Hi"))
    result = await service.ask_result("go")
    assert result.budget is None and result.spent is None


# --- precedence -------------------------------------------------------------------------------


def test_method_options_apply_to_methods_only() -> None:
    with pytest.raises(agentrt.ConfigurationError, match="applies to an `async def` service method"):
        method_options(budget=Budget(seconds=1))(Chat)


def test_budget_values_are_checked() -> None:
    for bad in ({"seconds": 0}, {"seconds": -1.0}, {"tool_calls": 1.5}, {"total_tokens": True}):
        with pytest.raises(agentrt.ConfigurationError, match="Budget"):
            Budget(**bad)


class Layered:
    @method_options(
        budget=Budget(seconds=20, model_requests=4), settings=ModelSettings(temperature=0.5, max_tokens=200)
    )
    async def tuned(self, question: str, budget: Budget | None = None) -> Result[str]: ...

    async def plain(self, question: str, settings: ModelSettings | None = None) -> Result[str]: ...


async def test_call_over_method_over_build_field_by_field() -> None:
    model = FunctionModel(lambda request: "ok")
    service = agentrt.build(
        Layered,
        model=model,
        budget=Budget(seconds=60, total_tokens=1000, tool_calls=5),
        settings=ModelSettings(temperature=0.0, seed=7),
    )

    # build < method: the method's seconds and requests, the build's tokens and tool calls.
    result = await service.tuned("q")
    assert result.budget == Budget(seconds=20, total_tokens=1000, tool_calls=5, model_requests=4)
    assert model.requests[-1].settings == ModelSettings(temperature=0.5, max_tokens=200, seed=7)

    # method < call parameter.
    result = await service.tuned("q", budget=Budget(model_requests=2))
    assert result.budget == Budget(seconds=20, total_tokens=1000, tool_calls=5, model_requests=2)

    # method < call_options < call parameter.
    with call_options(budget=Budget(seconds=3, model_requests=9), settings=ModelSettings(max_tokens=10)):
        result = await service.tuned("q", budget=Budget(model_requests=1))
    assert result.budget == Budget(seconds=3, total_tokens=1000, tool_calls=5, model_requests=1)
    assert model.requests[-1].settings == ModelSettings(temperature=0.5, max_tokens=10, seed=7)

    # A method without its own options: build < call; nested blocks lay theirs over the outer.
    with call_options(settings=ModelSettings(top_p=0.9)), call_options(settings=ModelSettings(seed=1)):
        result = await service.plain("q", settings=ModelSettings(temperature=1.0))
    assert result.budget == Budget(seconds=60, total_tokens=1000, tool_calls=5)
    assert model.requests[-1].settings == ModelSettings(temperature=1.0, seed=1, top_p=0.9)

    # Outside the blocks, the options are gone; the option parameters never reach the prompt.
    result = await service.plain("q")
    assert model.requests[-1].settings == ModelSettings(temperature=0.0, seed=7)
    assert model.requests[-1].messages[-1] == agentrt.UserMessage.of("q")


async def test_a_stream_takes_the_options_in_force_when_it_is_called() -> None:
    model = ScriptedModel(chatter(20))
    service, _ = build(model)

    with call_options(budget=Budget(output_tokens=2)):
        stream = await service.stream("go")
    with pytest.raises(BudgetExceededError):
        async for _ in stream:
            pass


def test_option_parameters_are_checked_at_build() -> None:
    class Twice:
        async def ask(self, question: str, a: Budget | None = None, b: Budget | None = None) -> str: ...

    with pytest.raises(
        agentrt.ConfigurationError, match=r"Twice\.ask: two parameters are typed as the call's budget"
    ):
        agentrt.build(Twice, model=ScriptedModel())


async def test_a_wrong_option_argument_is_a_type_error() -> None:
    service = agentrt.build(Layered, model=ScriptedModel("ok"))
    with pytest.raises(TypeError, match=r"Layered\.tuned\(\): 'budget' must be a Budget"):
        await service.tuned("q", budget=5)  # type: ignore[arg-type]


async def test_text_delta_counts_are_not_lost_on_the_way() -> None:
    # The forwarded deltas are the model's own objects: the meter does not copy them.
    model = ScriptedModel([TextDelta("abcd")])
    service, _ = build(model, budget=Budget(output_tokens=5))
    events = [e async for e in (await service.stream("go")).events()]
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("abcd")]


# --- found by an outside review -----------------------------------------------------------------


async def test_short_deltas_count_a_token_each_while_streaming() -> None:
    # One character a delta (code, CJK text, a server streaming a token a delta without usage):
    # four characters a token would let four times the limit through.
    model = ScriptedModel(["字"] * 100)
    service, _ = build(model, budget=Budget(output_tokens=30))

    with pytest.raises(BudgetExceededError) as info:
        await service.ask("go")

    assert info.value.partial.text == "字" * 31
    assert model.streams[0].closed and not model.streams[0].completed


async def test_usage_reported_early_does_not_undercount_a_cut_response() -> None:
    # Some providers report usage at the start of a stream (input and one output token).
    model = ScriptedModel([Usage(10, 1), *chatter(40)])
    service, _ = build(model, budget=Budget(output_tokens=20))

    with pytest.raises(BudgetExceededError) as info:
        await service.ask("go")

    usage = info.value.partial.usage
    assert usage.input_tokens == 10  # reported input counts are kept
    assert usage.output_tokens == 21 and usage.estimated
    spent = info.value.partial.spent
    assert spent is not None and spent.output_tokens == 21 and spent.estimated


async def test_a_request_whose_input_alone_would_pass_the_total_is_not_sent() -> None:
    class Verbose:
        @tool("Return a long text.")
        async def lookup(self, query: str) -> str:
            return "x" * 400  # about 100 tokens of input for the next request

    model = ScriptedModel([CallTool("lookup", {"query": "q"}), Usage(40, 5)], "never")
    service, _ = build(model, budget=Budget(total_tokens=100), tools=[Verbose()])

    with pytest.raises(BudgetExceededError, match="before a model request") as info:
        await service.ask("go")

    assert info.value.limit == "total_tokens"
    assert len(model.requests) == 1
    spent = info.value.partial.spent
    assert spent is not None and spent.model_requests == 1


async def test_the_partial_transcript_is_what_happened() -> None:
    # A limit found after a response: the transcript ends with that response.
    model = ScriptedModel(["Hello there", Usage(3, 500)])
    service, _ = build(model, budget=Budget(output_tokens=100))
    with pytest.raises(BudgetExceededError) as info:
        await service.ask("go")
    partial = info.value.partial
    assert partial.text == "Hello there"
    assert partial.messages[-1] == agentrt.AssistantMessage(text="Hello there")

    # A request that was not sent (here, the loop's final-answer request) is not in it.
    model = ScriptedModel([CallTool("lookup", {"query": "1"})], "never")
    service = agentrt.build(
        Chat,
        model=model,
        tools=[Quick()],
        budget=Budget(model_requests=1),
        tool_settings=agentrt.ToolSettings(max_rounds=1, on_limit="final_answer"),
    )
    with pytest.raises(BudgetExceededError) as info:
        await service.ask("go")
    messages = info.value.partial.messages
    assert messages == (*model.requests[0].messages, *messages[-2:])
    assert isinstance(messages[-1], ToolResultMessage)


async def test_a_function_model_s_slow_response_function_is_cut_at_the_deadline() -> None:
    async def slow(request: agentrt.ModelRequest) -> str:
        await anyio.sleep(60)
        return "late"

    service, _ = build(FunctionModel(slow), budget=Budget(seconds=0.05))

    with anyio.fail_after(10), pytest.raises(BudgetExceededError, match="time budget"):
        await service.ask("go")


def test_out_of_range_seconds_are_a_configuration_error() -> None:
    with pytest.raises(agentrt.ConfigurationError, match=r"Budget\.seconds"):
        Budget(seconds=10**400)


async def test_a_stub_s_default_options_are_the_method_s() -> None:
    # A default in the stub is the method's option: call_options and a passed argument win over it.
    hour = Budget(seconds=60, tool_calls=1)

    class Defaults:
        @method_options(budget=Budget(model_requests=5))
        async def ask(self, question: str, budget: Budget = hour) -> Result[str]: ...

    service = agentrt.build(
        Defaults, model=FunctionModel(lambda request: "ok"), budget=Budget(total_tokens=99)
    )

    assert (await service.ask("q")).budget == Budget(
        seconds=60, tool_calls=1, model_requests=5, total_tokens=99
    )
    with call_options(budget=Budget(seconds=1)):
        assert (await service.ask("q")).budget == Budget(
            seconds=1, tool_calls=1, model_requests=5, total_tokens=99
        )
        passed = await service.ask("q", budget=Budget(seconds=2))
    assert passed.budget == Budget(seconds=2, tool_calls=1, model_requests=5, total_tokens=99)


async def test_short_thinking_deltas_count_a_token_each_too() -> None:
    model = ScriptedModel([*[agentrt.ThinkingDelta("a")] * 50, "answer"])
    service, _ = build(model, budget=Budget(output_tokens=10))

    with pytest.raises(BudgetExceededError) as info:
        await service.ask("go")

    assert info.value.partial.thinking == "a" * 11
    assert model.streams[0].closed and not model.streams[0].completed


async def test_a_stream_s_first_chunk_is_metered_too() -> None:
    # The first chunk arrives while `await service.stream()` waits for the model's acceptance. Past
    # the limit on its own, it is not shown: a reader gets the tokens before the limit, as from any
    # other chunk (see above), and the partial result has it.
    model = ScriptedModel(["a long first chunk of text", "more"])
    service, _ = build(model, budget=Budget(output_tokens=2))

    stream = await service.stream("go")
    received: list[str] = []

    async def read() -> None:
        async for token in stream:
            received.append(token)

    with pytest.raises(BudgetExceededError) as info:
        await read()
    assert received == []
    assert info.value.partial is not None and info.value.partial.text == "a long first chunk of text"
    assert model.streams[0].closed and not model.streams[0].completed


@pytest.mark.virtual_clock
@pytest.mark.parametrize("outer", [4.0, 5.0, 6.0])
async def test_the_caller_s_own_deadline_and_the_budget_s_report_one_terminal_event(outer: float) -> None:
    # An awaited call holds its budget's scope itself; the caller's own scope may fire first, at the
    # same instant, or after. Whichever stops the call, listeners hear of it exactly once.
    model = ScriptedModel(["a", Hang()])
    service, events = build(model, budget=Budget(seconds=5))

    with pytest.raises((TimeoutError, BudgetExceededError)) as info:
        with anyio.fail_after(outer):
            await service.ask("go")

    terminal = [e for e in events if isinstance(e, FailedEvent | Completed | agentrt.CancelledEvent)]
    assert len(terminal) == 1
    if isinstance(info.value, BudgetExceededError):
        assert outer >= 5
        assert isinstance(terminal[0], FailedEvent) and terminal[0].error is info.value
    else:
        assert outer <= 5
        assert isinstance(terminal[0], agentrt.CancelledEvent)
    assert model.streams[0].closed


async def test_a_budget_cap_holds_over_every_level_and_only_tightens() -> None:
    model = FunctionModel(lambda request: "ok")
    service = agentrt.build(Layered, model=model, budget=Budget(seconds=60, total_tokens=1000))

    # The cap wins over the build, the method, an inner block and the call's own parameter where
    # it is stricter; a limit it does not set, or sets looser, is the call's as before.
    with call_options(budget_cap=Budget(seconds=10, model_requests=3, total_tokens=5000)):
        with call_options(budget=Budget(seconds=100, model_requests=50)):
            result = await service.tuned("q", budget=Budget(model_requests=2, tool_calls=7))
    assert result.budget == Budget(seconds=10, total_tokens=1000, tool_calls=7, model_requests=2)

    # Nested caps: the stricter of each limit. A cap alone is the budget of a call without one.
    with (
        call_options(budget_cap=Budget(seconds=10, tool_calls=4)),
        call_options(budget_cap=Budget(seconds=30, tool_calls=2)),
    ):
        plain = await service.plain("q")
    assert plain.budget == Budget(seconds=10, total_tokens=1000, tool_calls=2)
    unbudgeted = agentrt.build(Layered, model=model)
    with call_options(budget_cap=Budget(output_tokens=9)):
        capped = await unbudgeted.plain("q")
    assert capped.budget == Budget(output_tokens=9)

    # Outside the block, the cap is gone.
    assert (await service.plain("q")).budget == Budget(seconds=60, total_tokens=1000)
    with pytest.raises(agentrt.ConfigurationError, match=r"budget_cap must be an agentrt\.Budget"):
        with call_options(budget_cap={"seconds": 1}):  # type: ignore[arg-type]
            pass


class Remembering:
    async def chat(self, conversation: Annotated[str, agentrt.MemoryId], question: str) -> TokenStream: ...

    async def ask(self, conversation: Annotated[str, agentrt.MemoryId], question: str) -> str: ...


@pytest.mark.parametrize("view", ["stream", "ask"])
async def test_a_time_budget_spent_waiting_for_the_conversation_says_it_was_busy(view: str) -> None:
    model = ScriptedModel(["first", Hang()], "never asked")
    service = agentrt.build(Remembering, model=model, memory=agentrt.memory.window())
    holding = await in_another_task(lambda: service.chat("ada", "q1"))  # held until closed
    try:
        call = service.chat("ada", "q2") if view == "stream" else service.ask("ada", "q2")
        with call_options(budget=Budget(seconds=0.05)), pytest.raises(BudgetExceededError) as caught:
            await call
    finally:
        await holding.aclose()
    assert caught.value.limit == "seconds"
    assert "waiting for its conversation" in str(caught.value)
    busy = caught.value.__cause__
    assert isinstance(busy, agentrt.ConversationBusyError) and busy.memory_id == "ada"
    assert len(model.requests) == 1


async def test_a_time_budget_spent_on_the_model_does_not_blame_the_conversation() -> None:
    model = ScriptedModel([Hang()])
    service = agentrt.build(Remembering, model=model, memory=agentrt.memory.window())
    with call_options(budget=Budget(seconds=0.05)), pytest.raises(BudgetExceededError) as caught:
        await service.ask("ada", "q")
    assert caught.value.__cause__ is None and "conversation" not in str(caught.value)
