"""A turn saved at any step boundary and restored in a fresh build goes on exactly as it would have.

The property (DESIGN §2, "The turn is data"): for random scripted runs — tool rounds, preambles
with tool calls, guardrail re-asks, repairs of answers that do not parse, budgets that stop the turn —
stopping at any step boundary, writing the turn as JSON, restoring it in a fresh `build()` of the same
class (same conversation store, the model's script going on from the request it had reached) and
reading it on gives the same events, the same result (or error) and the same memory as the run that
was never interrupted; each tool ran once.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentrt
from agentrt import (
    Budget,
    Completed,
    GuardrailVerdict,
    MemoryId,
    Result,
    TokenStream,
    tool,
)
from agentrt._pipeline import Invocation, StopAtBoundary
from agentrt._pipeline._checkpoint import VERSION, CheckpointError
from agentrt._service import _RUNTIMES
from agentrt.guardrails import (
    GuardrailResult,
    OutputGuardrailRequest,
    output_guardrails,
    reprompt,
    retry,
    success,
)
from agentrt.testing import CallTool, ScriptedModel


class Lookup:
    """A tool with a side effect: the calls it ran, over every build it serves."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    @tool("Look something up.")
    async def lookup(self, query: str) -> str:
        self.ran.append(query)
        return f"found {query}"


class Judge:
    """Asks again about text with BAD (reprompt) or WORSE (retry)."""

    partial_text = True
    name = "judge"

    def validate(self, request: OutputGuardrailRequest) -> GuardrailResult:
        if "BAD" in request.text:
            return reprompt("bad", "No BAD, please.")
        if "WORSE" in request.text:
            return retry("worse")
        return success()


JUDGE = Judge()


class Text:
    async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> Result[str]: ...

    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


class Number:
    async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> int: ...


def guarded(release: str) -> type:
    class Guarded:
        @output_guardrails(JUDGE, release=release, max_retries=1)  # type: ignore[arg-type]
        async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

        @output_guardrails(JUDGE, max_retries=1)
        async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> Result[str]: ...

    return Guarded


VIEWS = {
    "result": (Text, "ask"),
    "stream": (Text, "stream"),
    "number": (Number, "ask"),
    "guarded-result": (guarded("buffer"), "ask"),
    "buffer": (guarded("buffer"), "stream"),
    "chunked": (guarded("chunked"), "stream"),
    "optimistic": (guarded("optimistic"), "stream"),
}

# --- scripts -------------------------------------------------------------------------------------

answers = st.sampled_from(["Fine. All done.", "It is 42.", "42", "BAD answer.", "WORSE one.", "not a number"])
queries = st.sampled_from(["a", "b", "c"])


@st.composite
def rounds(draw: st.DrawFn, index: int) -> list[Any]:
    calls = draw(st.lists(queries, min_size=1, max_size=3))
    step: list[Any] = []
    preamble = draw(st.sampled_from(["", "Let me look. ", "BAD words. "]))
    if preamble:
        step.append(preamble)
    step.extend(CallTool("lookup", {"query": q}, id=f"r{index}c{i}") for i, q in enumerate(calls))
    return step


@st.composite
def scripts(draw: st.DrawFn) -> list[Any]:
    """Responses, one per request: tool rounds and answers, ending with a plain answer (enough for
    every re-ask and repair the run may make)."""
    script: list[Any] = []
    for index in range(draw(st.integers(min_value=0, max_value=6))):
        if draw(st.booleans()):
            script.append(draw(rounds(index)))
        else:
            script.append([draw(answers)])
    script.extend([["42"], ["42"], ["42"]])
    return script


budgets = st.sampled_from(
    [None, Budget(tool_calls=3), Budget(model_requests=4), Budget(output_tokens=40), Budget(seconds=600)]
)

# --- running -----------------------------------------------------------------------------------


class Stop(Exception):
    """Raised at the chosen boundary, once the turn was saved."""


def normalized(events: list[Any]) -> list[Any]:
    """Events as compared between two runs: one invocation's id, and a guardrail's duration, are not
    part of what happened."""
    out = []
    for event in events:
        if type(event) is GuardrailVerdict:
            event = dataclasses.replace(event, seconds=0.0)
        if dataclasses.is_dataclass(event) and hasattr(event, "invocation_id"):
            event = dataclasses.replace(event, invocation_id="")  # type: ignore[call-arg]
        out.append(event)
    return out


class Run:
    def __init__(self, view: str, script: list[Any], store: Any, tool: Lookup, budget: Budget | None) -> None:
        cls, name = VIEWS[view]
        self.model = ScriptedModel(*script)
        self.service = agentrt.build(
            cls, model=self.model, memory=agentrt.memory.window(store=store), tools=[tool], budget=budget
        )
        self.name = name
        self.spec = getattr(self.service, name).__agentrt_spec__
        self.runtime = _RUNTIMES[type(self.service)]
        self.budget = budget

    async def stored(self) -> list[Any]:
        return await agentrt.memory.access(self.service).read("c")

    def invocation(self) -> Invocation:
        return Invocation(self.runtime, self.spec, {"conversation": "c", "question": "q"}, budget=self.budget)

    def restored(self, checkpoint: dict[str, Any]) -> Invocation:
        return Invocation.restore(self.runtime, self.spec, checkpoint)


async def drive(invocation: Invocation, events: list[Any]) -> tuple[Any, BaseException | None]:
    """Read the invocation as its view does: its result (or error); a stream's events into `events`."""
    try:
        if invocation._turn.plan.streams:
            result = None
            stream = invocation.events()
            try:
                async for event in stream:
                    events.append(event)
                    if type(event) is Completed:
                        result = event.result
            finally:
                await stream.aclose()
            return result, None
        return await invocation.result(), None
    except Stop:
        raise
    except Exception as error:
        return None, error


def outcome(result: Any, error: BaseException | None) -> Any:
    if error is not None:
        return (type(error).__name__, str(error), getattr(error, "limit", None))
    assert result is not None
    return (result.value, result.text, result.usage, result.attempts, result.messages, result.tool_executions)


@pytest.mark.parametrize("view", list(VIEWS))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=scripts(), budget=budgets)
async def test_a_turn_restored_at_any_boundary_goes_on_as_if_never_stopped(
    view: str, script: list[Any], budget: Budget | None
) -> None:
    # The run never interrupted, and its step boundaries.
    store = agentrt.memory.InMemoryStore()
    tool = Lookup()
    whole = Run(view, script, store, tool, budget)
    invocation = whole.invocation()
    phases: list[Any] = []
    invocation.on_boundary(phases.append)
    events: list[Any] = []
    result, error = await drive(invocation, events)
    expected = (normalized(events), outcome(result, error), await whole.stored(), sorted(tool.ran))

    for stop_at in range(len(phases)):
        store = agentrt.memory.InMemoryStore()
        tool = Lookup()
        first = Run(view, script, store, tool, budget)
        invocation = first.invocation()
        saved: list[dict[str, Any]] = []
        seen = 0

        def boundary(
            phase: Any, invocation: Invocation = invocation, saved: list[Any] = saved, stop_at: int = stop_at
        ) -> None:
            nonlocal seen
            if seen == stop_at:
                saved.append(orjson.loads(orjson.dumps(invocation.checkpoint())))  # through JSON text
                raise Stop
            seen += 1

        invocation.on_boundary(boundary)
        before: list[Any] = []
        with pytest.raises(Stop):
            await drive(invocation, before)
        assert await first.stored() == []  # stopped: nothing stored
        (checkpoint,) = saved
        assert checkpoint["version"] == VERSION

        second = Run(view, script[len(first.model.requests) :], store, tool, budget)
        after: list[Any] = []
        result, error = await drive(second.restored(checkpoint), after)
        assert {e.invocation_id for e in before + after if hasattr(e, "invocation_id")} <= {invocation.id}
        got = (normalized(before + after), outcome(result, error), await second.stored(), sorted(tool.ran))
        assert got == expected, f"stopped at boundary {stop_at} ({phases[stop_at]})"


async def test_a_checkpoint_is_refused_off_a_boundary_and_for_another_method() -> None:
    store = agentrt.memory.InMemoryStore()
    run = Run("stream", [["Hi."]], store, Lookup(), None)
    invocation = run.invocation()
    with pytest.raises(CheckpointError, match="step boundary"):
        invocation.checkpoint()  # not started: still preparing
    saved: list[dict[str, Any]] = []
    invocation.on_boundary(lambda phase: saved.append(invocation.checkpoint()))
    events: list[Any] = []
    await drive(invocation, events)
    other = Run("result", [["Hi."]], store, Lookup(), None)
    with pytest.raises(CheckpointError, match=r"is of 'Text\.stream'"):
        other.restored(saved[0])
    with pytest.raises(CheckpointError, match="version"):
        run.restored({**saved[0], "version": VERSION + 1})
    with pytest.raises(CheckpointError, match="does not validate"):
        run.restored({**saved[0], "attempt": "many"})
    with pytest.raises(CheckpointError, match="does not validate"):
        run.restored({**saved[0], "phase": "prepare"})


@pytest.mark.virtual_clock
async def test_time_between_save_and_restore_is_not_spent() -> None:
    import anyio

    store = agentrt.memory.InMemoryStore()
    run = Run("result", [["Hi."]], store, Lookup(), Budget(seconds=10))
    invocation = run.invocation()
    saved: list[dict[str, Any]] = []

    def stop(phase: Any) -> None:
        saved.append(invocation.checkpoint())
        raise Stop

    invocation.on_boundary(stop)
    with pytest.raises(Stop):
        await invocation.result()
    await anyio.sleep(60)  # on the virtual clock: far past the budget
    restored = Run("result", [["Hi."]], store, Lookup(), Budget(seconds=10)).restored(saved[0])
    result = await restored.result()
    assert result.text == "Hi."
    assert result.spent is not None
    assert result.spent.seconds < 10


def test_a_held_tool_call_keeps_its_tools_annotations_through_json() -> None:
    from agentrt._pipeline._checkpoint import _event, _loaded

    call = agentrt.ToolCall(id="c1", name="delete_note", arguments='{"title": "x"}')
    annotated = agentrt.ToolCallRequested("inv", call, "h", 2, {"destructiveHint": True})
    plain = agentrt.ToolCallRequested("inv", call, "h", 2)
    for event in (annotated, plain):
        assert _loaded(orjson.loads(orjson.dumps(_event(event))), "inv") == event
    assert "annotations" not in _event(plain)  # nothing stored for a tool without them


@pytest.mark.parametrize("stop", [StopAtBoundary, Stop])
async def test_a_stop_at_a_boundary_is_a_failure_for_listeners_unless_the_owner_stops(
    stop: type[Exception],
) -> None:
    """`StopAtBoundary` (a durable turn's segment ends) is no failure: listeners see none; any other
    error the boundary callback raises is one."""
    seen: list[Any] = []
    service = agentrt.build(Text, model=ScriptedModel(["Hi."]), listeners=[seen.append])
    invocation = Invocation(
        _RUNTIMES[type(service)], service.ask.__agentrt_spec__, {"conversation": "c", "question": "q"}
    )

    def boundary(phase: Any) -> None:
        raise stop

    invocation.on_boundary(boundary)
    with pytest.raises(stop):
        await invocation.result()
    names = [type(event).__name__ for event in seen]
    assert names == (["Started"] if stop is StopAtBoundary else ["Started", "FailedEvent"])
