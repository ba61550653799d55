"""Repair: an answer that does not parse into the return type is asked for again, with what was wrong,
up to `max_repairs` (build < method < call); the failed answers and repair prompts are never stored.

The model double records every request: tests assert the exact repair request, the memory contents,
the attempts counted and the errors raised.
"""

from __future__ import annotations

import threading
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel

import agentrt
from agentrt import (
    AssistantMessage,
    Budget,
    BudgetExceededError,
    Completed,
    ConfigurationError,
    MemoryId,
    OutputParsingError,
    RequestIssued,
    ResponseReceived,
    Result,
    ToolResultMessage,
    UserMessage,
    call_options,
    method_options,
    tool,
)
from agentrt.guardrails import OutputGuardrailRequest, retry, success
from agentrt.testing import CallTool, ScriptedModel


class Ticket(BaseModel):
    title: str
    priority: int


BAD = '{"title": "Printer on fire", "priority": "high"}'
GOOD = '{"title": "Printer on fire", "priority": 1}'
TICKET = Ticket(title="Printer on fire", priority=1)
PROMPT = (
    "Your answer could not be read as Ticket: priority: Input should be a valid integer, unable to parse "
    "string as an integer. Answer again, in the format asked for."
)


class Desk:
    async def file(self, conversation: Annotated[str, MemoryId], report: str) -> Ticket: ...

    async def file_result(self, conversation: Annotated[str, MemoryId], report: str) -> Result[Ticket]: ...

    async def count(self, report: str) -> int: ...


async def test_a_failed_answer_is_repaired_with_what_was_wrong_and_memory_keeps_one_clean_turn() -> None:
    model = ScriptedModel(BAD, GOOD)
    svc = agentrt.build(Desk, model=model, memory=agentrt.memory.window())

    result = await svc.file_result("c", "the printer is on fire")

    assert result.value == TICKET
    assert result.attempts == 2
    assert result.text == GOOD
    first, second = model.requests
    # The repair request: the request that got the failed answer, the answer, what was wrong with it.
    assert second.messages == (*first.messages, AssistantMessage(text=BAD), UserMessage.of(PROMPT))
    assert second.response_format == first.response_format
    # The result's transcript is what was sent last, then the answer.
    assert result.messages == (*second.messages, AssistantMessage(text=GOOD))
    # Memory: the user's own message and the answer that parsed, nothing of the repair.
    stored = await agentrt.memory.access(svc).read("c")
    assert stored == [UserMessage.of("the printer is on fire"), AssistantMessage(text=GOOD)]


async def test_the_next_turn_sends_only_the_clean_turn() -> None:
    model = ScriptedModel(BAD, GOOD, GOOD)
    svc = agentrt.build(Desk, model=model, memory=agentrt.memory.window())
    await svc.file("c", "first report")
    await svc.file("c", "second report")
    third = model.requests[2].messages
    assert AssistantMessage(text=BAD) not in third
    assert not any(PROMPT in (m.text or "") for m in third if isinstance(m, UserMessage))
    assert AssistantMessage(text=GOOD) in third


async def test_repairs_exhausted_raise_with_the_method_the_text_and_the_partial_result() -> None:
    model = ScriptedModel(BAD, "still not {json")
    svc = agentrt.build(Desk, model=model, memory=agentrt.memory.window())

    with pytest.raises(OutputParsingError) as caught:
        await svc.file("c", "report")

    error = caught.value
    assert str(error) == "Desk.file: the answer is not a valid Ticket: no JSON found in it (after 1 repair)"
    assert error.text == "still not {json"
    assert error.target == "Ticket"
    assert error.detail == "no JSON found in it"
    assert error.partial is not None
    assert error.partial.attempts == 2
    assert error.partial.text == "still not {json"
    assert error.partial.messages == (*model.requests[1].messages, AssistantMessage(text="still not {json"))
    assert len(model.requests) == 2
    assert await agentrt.memory.access(svc).read("c") == []  # nothing stored


async def test_the_error_names_the_fields_that_were_wrong() -> None:
    model = ScriptedModel('{"priority": "x"}')
    svc = agentrt.build(Desk, model=model, max_repairs=0)
    with pytest.raises(OutputParsingError) as caught:
        await svc.file("c", "r")
    assert caught.value.detail == (
        "title: Field required; "
        "priority: Input should be a valid integer, unable to parse string as an integer"
    )
    assert str(caught.value).startswith("Desk.file: the answer is not a valid Ticket: title: Field required")
    assert caught.value.partial is not None and caught.value.partial.attempts == 1


async def test_a_wrapped_scalar_is_repaired_with_what_was_expected() -> None:
    model = ScriptedModel('{"value": "many"}', "3", capabilities=agentrt.Capabilities(json_object=True))
    svc = agentrt.build(Desk, model=model)
    assert await svc.count("r") == 3
    repair = model.requests[1].messages[-1]
    assert isinstance(repair, UserMessage)
    assert repair.text == (
        "Your answer could not be read as int: Input should be a valid integer, unable to parse string as an "
        "integer. Answer again, in the format asked for."
    )


def _desk(build: int | None, method: int | None) -> type:
    options = {} if method is None else {"max_repairs": method}

    class Counter:
        @method_options(**options)
        async def count(self, report: str) -> int: ...

    return Counter


@pytest.mark.parametrize(
    ("build", "method", "call", "requests"),
    [
        (None, None, None, 2),  # the default: one repair
        (0, None, None, 1),
        (3, None, None, 4),
        (0, 2, None, 3),  # the method's over the build's
        (3, 0, None, 1),
        (0, 2, 1, 2),  # the call's over the method's
        (2, None, 0, 1),
    ],
)
async def test_max_repairs_per_build_method_and_call(
    build: int | None, method: int | None, call: int | None, requests: int
) -> None:
    model = ScriptedModel(*["none"] * 6)
    kwargs: dict[str, Any] = {} if build is None else {"max_repairs": build}
    svc = agentrt.build(_desk(build, method), model=model, **kwargs)
    with pytest.raises(OutputParsingError) as caught, call_options(max_repairs=call):
        await svc.count("r")
    assert len(model.requests) == requests
    assert caught.value.partial is not None and caught.value.partial.attempts == requests
    assert str(caught.value).endswith("(after 1 repair)" if requests == 2 else "")


@pytest.mark.parametrize("bad", [-1, True, 1.0, "1"])
def test_a_bad_max_repairs_is_a_configuration_error(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="Desk: max_repairs must be an int >= 0"):
        agentrt.build(Desk, model=ScriptedModel(), max_repairs=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="@method_options: max_repairs must be an int >= 0"):
        method_options(max_repairs=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="call_options: max_repairs"), call_options(max_repairs=bad):  # type: ignore[arg-type]
        pass


async def test_a_repair_is_a_model_request_the_budget_counts() -> None:
    model = ScriptedModel(BAD, GOOD)
    svc = agentrt.build(Desk, model=model, budget=Budget(model_requests=1))
    with pytest.raises(BudgetExceededError, match="model request") as caught:
        await svc.file("c", "r")
    assert len(model.requests) == 1  # the repair was not sent
    assert caught.value.partial.text == BAD

    model = ScriptedModel(BAD, GOOD)
    svc = agentrt.build(Desk, model=model, budget=Budget(model_requests=2))
    result = await svc.file_result("c", "r")
    assert result.value == TICKET
    assert result.spent is not None and result.spent.model_requests == 2


class Lookup:
    def __init__(self) -> None:
        self.calls: list[str] = []

    @tool("Look a customer up.")
    def customer(self, name: str) -> str:
        self.calls.append(name)
        return "Ada, premium"


async def test_a_repair_keeps_the_turns_tool_exchange_and_does_not_run_tools_again() -> None:
    lookup = Lookup()
    model = ScriptedModel([CallTool("customer", {"name": "Ada"}, id="c1")], BAD, GOOD)
    svc = agentrt.build(Desk, model=model, tools=[lookup], memory=agentrt.memory.window())

    result = await svc.file_result("c", "Ada's printer")

    assert result.value == TICKET
    assert lookup.calls == ["Ada"]
    _, answered, repaired = model.requests
    assert isinstance(answered.messages[-1], ToolResultMessage)  # the tool exchange is in the request
    assert repaired.messages == (*answered.messages, AssistantMessage(text=BAD), UserMessage.of(PROMPT))
    stored = await agentrt.memory.access(svc).read("c")
    assert stored[0] == UserMessage.of("Ada's printer")
    assert [type(m) for m in stored] == [UserMessage, AssistantMessage, ToolResultMessage, AssistantMessage]
    assert stored[-1] == AssistantMessage(text=GOOD)


class Seen:
    def __init__(self, first: Any = None) -> None:
        self.seen: list[tuple[int, str]] = []
        self.first = first

    def validate(self, request: OutputGuardrailRequest) -> Any:
        self.seen.append((request.attempt, request.text))
        return self.first if self.first is not None and request.attempt == 1 else success()


async def test_output_guardrails_check_the_repaired_answer_and_re_asks_and_repairs_count_apart() -> None:
    guard = Seen(first=retry("once more"))
    model = ScriptedModel("not json", BAD, GOOD)
    # One re-ask allowed and one repair allowed: both are used, in that order.
    svc = agentrt.build(Desk, model=model, output_guardrails=[guard], max_repairs=1)

    result = await svc.file_result("c", "r")

    assert result.value == TICKET
    assert result.attempts == 3
    assert guard.seen == [(1, "not json"), (2, BAD), (3, GOOD)]
    first, second, third = model.requests
    assert second.messages == first.messages  # a retry asks the same request again
    assert third.messages == (*second.messages, AssistantMessage(text=BAD), UserMessage.of(PROMPT))


async def test_listeners_see_each_request_and_the_completed_result_counts_attempts() -> None:
    events: list[object] = []
    svc = agentrt.build(Desk, model=ScriptedModel(BAD, GOOD), listeners=[events.append])
    await svc.file("c", "r")
    kinds = [type(e) for e in events if type(e) in (RequestIssued, ResponseReceived, Completed)]
    assert kinds == [RequestIssued, ResponseReceived, RequestIssued, ResponseReceived, Completed]
    completed = events[-1]
    assert isinstance(completed, Completed)
    assert completed.result.value == TICKET and completed.result.attempts == 2


THREADS: list[int] = []


def record_thread(value: list[int]) -> list[int]:
    THREADS.append(threading.get_ident())
    return value


class Numbers:
    async def numbers(self, report: str) -> Annotated[list[int], AfterValidator(record_thread)]: ...


async def test_a_long_answer_is_parsed_off_the_event_loop() -> None:
    THREADS.clear()
    long = "[" + ", ".join(["7"] * 100_000) + "]"  # 300 kB: past the off-loop size (16 KiB)
    short = "[1, 2]"
    svc = agentrt.build(Numbers, model=ScriptedModel(short, long))
    loop_thread = threading.get_ident()
    assert await svc.numbers("r") == [1, 2]
    assert await svc.numbers("r") == [7] * 100_000
    assert THREADS[0] == loop_thread
    assert THREADS[-1] != loop_thread


async def test_a_long_answer_that_does_not_parse_is_repaired_from_the_thread() -> None:
    long = "[" + ", ".join(["7"] * 100_000) + ', "x"]'
    model = ScriptedModel(long, "[1]")
    assert await agentrt.build(Numbers, model=model).numbers("r") == [1]
    repair = model.requests[1].messages[-1]
    assert isinstance(repair, UserMessage)
    assert repair.text is not None and repair.text.startswith(
        "Your answer could not be read as list[int]: 100000: Input should be a valid integer"
    )
