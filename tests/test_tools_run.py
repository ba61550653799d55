"""`ToolLoop` directly: the shortcuts of the one-call round and the precomputed per-tool parts behave
as the general path does."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from agentrt import LoopLimit, MemoryId, ToolCall, ToolContext, ToolOutcome, ToolSettings, tool
from agentrt.tools._declare import collect_tools, define_tool
from agentrt.tools._loop import ToolLoop
from agentrt.tools._run import arguments_hash
from agentrt.tools._threads import ThreadLimiter

seen: list[Any] = []


@tool("Echo the text.")
def echo(text: str) -> str:
    return text


@tool("Who is asking.")
def whoami(memory: Annotated[str, MemoryId], context: ToolContext) -> str:
    seen.append((memory, context))
    return f"{memory}:{context.call_id}:{context.round}"


def loop(settings: ToolSettings | None = None) -> ToolLoop:
    def context(call: ToolCall, round_: int) -> ToolContext:
        return ToolContext("inv", "Svc.ask", "user-1", call.id, round_)

    tools = collect_tools([echo, whoami], where="test")
    return ToolLoop(tools, settings or ToolSettings(), context, ThreadLimiter(2))


def call(id: str, text: str = "hi", name: str = "echo") -> ToolCall:
    return ToolCall(id=id, name=name, arguments=f'{{"text": "{text}"}}')


def test_a_definition_offers_one_spec_object_and_a_copy_its_own_equal_one() -> None:
    definition = define_tool(echo)
    assert definition.spec is definition.spec
    assert (definition.spec.name, definition.spec.parameters) == ("echo", definition.parameters)
    copy = dataclasses.replace(definition, function=len)
    assert copy.spec == definition.spec
    assert copy == dataclasses.replace(definition, function=len)


def test_arguments_hash_depends_on_the_text_only() -> None:
    text = '{"text": "hi"}'
    same = "".join(['{"text": ', '"hi"}'])
    assert same is not text
    assert arguments_hash(text) == arguments_hash(same) == arguments_hash(text)
    assert arguments_hash('{"text": "ho"}') != arguments_hash(text)
    assert len(arguments_hash("")) == 16


async def test_identical_calls_count_within_a_round_and_across_rounds() -> None:
    tools = loop(ToolSettings(max_identical_calls=2))
    # Within one round, as a tuple (shared with run_round) and as a list.
    assert tools.limit_before((call("a"), call("b"), call("c"))) is LoopLimit.REPEATED_CALL
    assert tools.limit_before([call("a"), call("b"), call("c")]) is LoopLimit.REPEATED_CALL
    assert tools.limit_before([call("a"), call("b"), call("c", "ho")]) is None
    # Key order and spacing do not make arguments different.
    first = (call("a"), ToolCall(id="b", name="echo", arguments='{ "text":"hi" }'))
    assert tools.limit_before(first) is None
    await tools.run_round(first)
    again = (call("c"),)
    assert tools.limit_before(again) is LoopLimit.REPEATED_CALL
    assert tools.limit_before((call("d", "other"),)) is None
    assert tools.limit_before(first) is LoopLimit.REPEATED_CALL  # the same tuple, counted anew


async def test_a_single_call_under_a_concurrency_limit_runs_and_counts() -> None:
    tools = loop(ToolSettings(max_concurrency=1, max_calls=2))
    calls = (call("a"),)
    assert tools.limit_before(calls) is None
    executions = await tools.run_round(calls)
    assert [(e.call_id, e.result, e.outcome, e.round) for e in executions] == [
        ("a", "hi", ToolOutcome.SUCCESS, 1)
    ]
    assert executions[0].arguments_hash == arguments_hash(calls[0].arguments)
    assert tools.executions == executions and tools.rounds == 1
    assert tools.limit_before((call("b"), call("c", "x"))) is LoopLimit.MAX_CALLS


async def test_injected_memory_id_and_context_come_from_one_context() -> None:
    seen.clear()
    tools = loop()
    executions = await tools.run_round((ToolCall(id="w1", name="whoami", arguments=""),))
    assert executions[0].result == "user-1:w1:1"
    [(memory, context)] = seen
    assert memory == "user-1"
    assert context == ToolContext("inv", "Svc.ask", "user-1", "w1", 1)


async def test_invalid_arguments_and_unknown_tools_in_a_one_call_round() -> None:
    tools = loop(ToolSettings(error_detail=True))
    [bad] = await tools.run_round((ToolCall(id="x", name="echo", arguments='{"txt": 1}'),))
    assert bad.outcome is ToolOutcome.INVALID_ARGUMENTS
    assert bad.result == (
        "Error: tool 'echo' was called with invalid arguments (ValidationError): "
        "text: Field required; txt: Extra inputs are not permitted."
    )
    [unknown] = await tools.run_round((ToolCall(id="y", name="nope", arguments="{}"),))
    assert unknown.outcome is ToolOutcome.UNKNOWN_TOOL
    assert tools.limit_after() is None
    await tools.run_round((ToolCall(id="z", name="nope", arguments="{}"),))
    assert tools.limit_after() is LoopLimit.FAILED_ROUNDS
