"""Text a model sends together with tool calls passes the output chain, under every release policy
and on awaited calls: it is not the answer, but memory stores it, the next request carries it and a
reader is shown it (DESIGN §5). Before, only `chunked` checked it (sentence by sentence).

Each test reads the method as its view does and asserts what the model was sent, what the reader got,
what ran and what memory stored.
"""

from __future__ import annotations

from typing import Annotated, Any

import pytest

import agentrt
from agentrt import (
    AssistantMessage,
    Budget,
    MemoryId,
    OutputGuardrailError,
    Result,
    TextDelta,
    TokenStream,
    ToolResultMessage,
    UserMessage,
    tool,
)
from agentrt.guardrails import (
    GuardrailResult,
    OutputGuardrailRequest,
    failure,
    output_guardrails,
    partial_text,
    reprompt,
    retry,
    success,
    success_with,
)
from agentrt.guardrails.builtin import JsonExtractor
from agentrt.testing import CallTool, ScriptedModel

SECRET = "ALPHA-7731"
VIEWS = ["await", "result", "buffer", "chunked", "optimistic"]


class Lookup:
    def __init__(self) -> None:
        self.calls: list[str] = []

    @tool("Look something up.")
    async def lookup(self, query: str) -> str:
        self.calls.append(query)
        return f"found {query}"


class Guard:
    """Answers `decide(request)`; records every request it was shown."""

    partial_text = True

    def __init__(self, decide: Any) -> None:
        self.name = "guard"
        self.decide = decide
        self.requests: list[OutputGuardrailRequest] = []

    def validate(self, request: OutputGuardrailRequest) -> GuardrailResult:
        self.requests.append(request)
        result: GuardrailResult = self.decide(request)
        return result


def refuse_secret(request: OutputGuardrailRequest) -> GuardrailResult:
    return failure("a code") if SECRET in request.text else success()


def service(view: str, model: ScriptedModel, guard: Guard, tools: Any, **options: Any) -> Any:
    """A service whose one method is read as `view` does, under its release policy."""
    if view == "await":

        class Chat:
            @output_guardrails(guard)  # type: ignore[arg-type]
            async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...

    elif view == "result":

        class Chat:  # type: ignore[no-redef]
            @output_guardrails(guard)  # type: ignore[arg-type]
            async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> Result[str]: ...

    else:

        class Chat:  # type: ignore[no-redef]
            @output_guardrails(guard, release=view)  # type: ignore[arg-type]
            async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

    return agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[tools], **options)


async def run(view: str, svc: Any, tokens: list[str]) -> str:
    """Call the method as `view` does; the reader's tokens go to `tokens` as they arrive."""
    if view == "await":
        text: str = await svc.ask("c", "q")
        return text
    if view == "result":
        result: Result[str] = await svc.ask("c", "q")
        return result.text
    stream = await svc.stream("c", "q")
    async with stream:
        async for event in stream.events():
            if type(event) is TextDelta:
                tokens.append(event.text)
        return (await stream.result()).text


@pytest.mark.parametrize("view", VIEWS)
async def test_refused_text_that_came_with_a_tool_call_stops_the_turn(view: str) -> None:
    lookup = Lookup()
    model = ScriptedModel([f"The code is {SECRET}.", CallTool("lookup", {"query": "x"})], ["Done."])
    guard = Guard(refuse_secret)
    svc = service(view, model, guard, lookup)
    tokens: list[str] = []

    with pytest.raises(OutputGuardrailError) as caught:
        await run(view, svc, tokens)

    assert [f.message for f in caught.value.failures] == ["a code"]
    assert lookup.calls == []  # the refused response's calls never ran
    assert len(model.requests) == 1
    assert await agentrt.memory.access(svc).read("c") == []
    if view in ("buffer", "chunked"):
        assert tokens == []  # held until it passed: the reader never saw it
    seen = [(r.partial, r.text, [c.name for c in r.tool_calls]) for r in guard.requests]
    if view == "chunked":  # refused at the sentence's end, as it streamed
        assert seen == [(True, f"The code is {SECRET}.", [])]
    else:
        assert seen == [(False, f"The code is {SECRET}.", ["lookup"])]


@pytest.mark.parametrize("view", VIEWS)
async def test_a_reprompt_about_text_with_tool_calls_asks_again_and_the_calls_do_not_run(view: str) -> None:
    lookup = Lookup()
    model = ScriptedModel(
        [f"The code is {SECRET}.", CallTool("lookup", {"query": "x"}, id="c1")],
        ["Let me look.", CallTool("lookup", {"query": "y"}, id="c2")],
        ["Found y."],
    )
    guard = Guard(lambda r: reprompt("a code", "Do not say codes.") if SECRET in r.text else success())
    svc = service(view, model, guard, lookup)
    tokens: list[str] = []

    text = await run(view, svc, tokens)

    assert text == "Found y."
    assert lookup.calls == ["y"]  # the rejected response's call never ran
    rejected = AssistantMessage(text=f"The code is {SECRET}.")  # its calls dropped: they never ran
    assert model.requests[1].messages[-2:] == (rejected, UserMessage.of("Do not say codes."))
    stored = await agentrt.memory.access(svc).read("c")
    assert SECRET not in str(stored)
    assert [type(m) for m in stored] == [UserMessage, AssistantMessage, ToolResultMessage, AssistantMessage]
    assert stored[1].text == "Let me look."  # type: ignore[union-attr]
    if view in ("buffer", "chunked"):
        assert SECRET not in "".join(tokens)
    if view != "await" and view != "result":
        assert "".join(tokens).endswith("Found y.")


@pytest.mark.parametrize("view", VIEWS)
async def test_a_retry_about_text_with_tool_calls_sends_the_same_request_again(view: str) -> None:
    lookup = Lookup()
    model = ScriptedModel(
        [f"The code is {SECRET}.", CallTool("lookup", {"query": "x"}, id="c1")],
        [CallTool("lookup", {"query": "y"}, id="c2")],
        ["Found y."],
    )
    guard = Guard(lambda r: retry("a code") if SECRET in r.text else success())
    svc = service(view, model, guard, lookup, budget=Budget(tool_calls=1))
    tokens: list[str] = []

    assert await run(view, svc, tokens) == "Found y."
    assert model.requests[1] == model.requests[0]
    # The rejected round's call was not counted: a budget of one tool call allows the one that ran.
    assert lookup.calls == ["y"]


@pytest.mark.parametrize("view", VIEWS)
async def test_a_rewrite_of_text_with_tool_calls_is_what_is_stored_and_sent(view: str) -> None:
    lookup = Lookup()
    model = ScriptedModel(
        [f"The code is {SECRET}.", CallTool("lookup", {"query": "x"}, id="c1")],
        ["Found x."],
    )
    guard = Guard(lambda r: success_with(r.text.replace(SECRET, "[code]")) if SECRET in r.text else success())
    svc = service(view, model, guard, lookup)
    tokens: list[str] = []

    assert await run(view, svc, tokens) == "Found x."
    assert lookup.calls == ["x"]
    sent = model.requests[1].messages
    assert [m.text for m in sent if type(m) is AssistantMessage] == ["The code is [code]."]
    stored = await agentrt.memory.access(svc).read("c")
    assert SECRET not in str(stored)
    assert stored[1].text == "The code is [code]."  # type: ignore[union-attr]
    assert [c.name for c in stored[1].tool_calls] == ["lookup"]  # type: ignore[union-attr]
    if view in ("buffer", "chunked"):
        assert SECRET not in "".join(tokens)


@pytest.mark.parametrize("view", VIEWS)
async def test_a_guardrail_value_for_text_with_tool_calls_is_an_error(view: str) -> None:
    lookup = Lookup()
    model = ScriptedModel(["Let me look.", CallTool("lookup", {"query": "x"})], ["Found x."])
    guard = Guard(lambda r: success_with(r.text, "value") if r.tool_calls else success())
    svc = service(view, model, guard, lookup)
    with pytest.raises(TypeError, match="gave a value for text that came with tool calls"):
        await run(view, svc, [])
    assert lookup.calls == []


@pytest.mark.parametrize("view", VIEWS)
async def test_blank_text_with_tool_calls_is_not_checked(view: str) -> None:
    lookup = Lookup()
    model = ScriptedModel([" ", CallTool("lookup", {"query": "x"})], ["Found x."])
    guard = Guard(lambda r: success())
    svc = service(view, model, guard, lookup)
    assert await run(view, svc, []) == "Found x."
    assert [r.text for r in guard.requests if not r.partial] == ["Found x."]


async def test_json_extractor_passes_text_that_came_with_tool_calls() -> None:
    @partial_text
    def anything(request: OutputGuardrailRequest) -> GuardrailResult:
        return success()

    lookup = Lookup()
    model = ScriptedModel(["Let me look.", CallTool("lookup", {"query": "x"})], ['{"a": 1}'])

    class Chat:
        @output_guardrails(JsonExtractor(), anything)
        async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> dict[str, int]: ...

    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[lookup])
    assert await svc.ask("c", "q") == {"a": 1}
    assert lookup.calls == ["x"]
    assert len(model.requests) == 2  # no reprompt about "Let me look."
