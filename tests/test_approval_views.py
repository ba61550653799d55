"""Approval on each view of a method (issue 26): a `PartialStream` or `Result` method resumes as
itself; a guarded stream (every release mode) withdraws the text that came with the gated calls and
resumes with the answer; a resumed stream, left open, closed mid-way, read by another task, cut by
the deadline or cancelled before its first chunk, runs the approved call once and frees the
conversation. The stream's own approval event is tested in test_approval.py.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel
from test_approval import ANSWER, GATED_ROUND, pending_of, service

import agentrt
from agentrt import (
    ApprovalNotFoundError,
    ApprovalRequested,
    Approve,
    Budget,
    Completed,
    Deny,
    MemoryId,
    Result,
    TokenStream,
    ToolCallRequested,
    tool,
)
from agentrt.memory import access
from agentrt.testing import CallTool, Hang

pytestmark = pytest.mark.anyio


# --- PartialStream and Result methods resume as themselves ----------------------------------------


class Ticket(BaseModel):
    title: str
    priority: int


class Desk:
    async def ticket(
        self, conversation: Annotated[str, MemoryId], text: str
    ) -> agentrt.PartialStream[Ticket]: ...

    async def ticket_result(self, conversation: Annotated[str, MemoryId], text: str) -> Result[Ticket]: ...


async def test_a_partial_stream_resumes_as_a_partial_stream_ending_with_the_value() -> None:
    svc, _, shop = service(
        ["Checking.", CallTool("email", {"text": "hi"}, id="e1")],
        ['{"title": "Printer", "priority": 2}'],
        cls=Desk,
    )
    async with await svc.ticket("u1", "file it") as stream:
        snapshots = [value async for value in stream]
        assert snapshots == []
        approval = stream.approval
    assert approval is not None and shop.ran == []
    resumed = await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1")
    assert isinstance(resumed, agentrt.PartialStream)
    async with resumed:
        values = [value async for value in resumed]
    assert values[-1] == Ticket(title="Printer", priority=2)
    assert (await resumed.result()).value == Ticket(title="Printer", priority=2)
    assert shop.ran == [("email", "hi")]


async def test_a_result_method_resumed_into_a_second_gated_round_returns_the_approval_again() -> None:
    svc, _, shop = service(
        [CallTool("email", {"text": "a"}, id="e1")],
        [CallTool("email", {"text": "b"}, id="e2")],
        ['{"title": "t", "priority": 1}'],
        cls=Desk,
    )
    first = await svc.ticket_result("u1", "q")
    assert first.approval is not None and first.value is None
    second = await agentrt.resume(svc, first.approval.run_id, {"e1": Approve()}, memory_id="u1")
    assert isinstance(second, Result) and second.approval is not None
    assert [c.id for c in second.approval.calls] == ["e2"]
    done = await agentrt.resume(svc, second.approval.run_id, {"e2": Deny("no")}, memory_id="u1")
    assert done.value == Ticket(title="t", priority=1) and done.approval is None
    assert shop.ran == [("email", "a")]
    assert [e.call_id for e in done.tool_executions] == ["e1", "e2"]


# --- output guardrails: what a stream shows and withdraws around a gated round --------------------


def passes(request: Any) -> Any:
    return agentrt.guardrails.success()


@agentrt.guardrails.partial_text
def passes_partly(request: Any) -> Any:
    return agentrt.guardrails.success()


async def read_text(stream: Any) -> tuple[str, list[Any]]:
    """The text a reader keeps (RESET discards what came before it), and every event."""
    events = [event async for event in stream.events()]
    kept = ""
    for event in events:
        if type(event).__name__ == "Reset":
            kept = ""
        elif type(event).__name__ == "TextDelta":
            kept += event.text
    return kept, events


@pytest.mark.parametrize("release", ["buffer", "chunked", "optimistic"])
async def test_a_guarded_stream_withdraws_the_text_before_the_calls_and_resumes_with_the_answer(
    release: str,
) -> None:
    guardrail = passes_partly if release == "chunked" else passes

    class Guarded:
        @agentrt.guardrails.output_guardrails(guardrail, release=release)
        async def chat_stream(self, conversation: Annotated[str, MemoryId], text: str) -> TokenStream: ...

    svc, _, shop = service(
        ["Let me look. ", CallTool("email", {"text": "hi"}, id="e1")], ["All done. Bye."], cls=Guarded
    )
    async with await svc.chat_stream("u1", "q") as stream:
        kept, events = await read_text(stream)
    assert isinstance(events[-1], ApprovalRequested)
    assert kept == ""  # the text that came with the calls is not the answer
    assert sum(isinstance(e, ToolCallRequested) for e in events) == 1
    resumed = await agentrt.resume(svc, events[-1].run_id, {"e1": Approve()}, memory_id="u1")
    async with resumed:
        kept, again = await read_text(resumed)
    assert kept == "All done. Bye."
    assert isinstance(again[-1], Completed) and again[-1].result.text == "All done. Bye."
    assert [type(e).__name__ for e in again].count("ToolExecuted") == 1
    assert shop.ran == [("email", "hi")]
    assert (await access(svc).read("u1"))[-1].text == "All done. Bye."


# --- a resumed stream: left open, closed mid-way, read elsewhere, cut, cancelled ------------------


async def test_a_stream_left_open_after_its_approval_event_does_not_hold_the_conversation() -> None:
    svc, _, shop = service(GATED_ROUND, ANSWER)
    stream = await svc.chat_stream("u1", "q")
    approval = None
    async for event in stream.events():
        if isinstance(event, ApprovalRequested):
            approval = event
            break  # left open, not closed, in this task
    assert approval is not None
    with anyio.fail_after(5):
        resumed = await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
        async with resumed:
            assert [token async for token in resumed] == ["Done."]
    await stream.aclose()
    assert shop.ran.count(("refund", ("A1", 250.0))) == 1


async def test_closing_the_resumed_stream_mid_way_frees_the_conversation_and_never_runs_twice() -> None:
    svc, _model, shop = service(
        ["Checking.", CallTool("email", {"text": "hi"}, id="e1")], ["All ", "done ", "now."], ["Hi."]
    )
    async with await svc.chat_stream("u1", "q") as stream:
        await stream.result()
    approval = stream.approval
    assert approval is not None
    resumed = await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1")
    async with resumed:
        first = await resumed.__anext__()
        assert first == "All "
    assert shop.ran == [("email", "hi")]
    assert (await pending_of(svc)) is None and await access(svc).read("u1") == []
    with pytest.raises(ApprovalNotFoundError):
        await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1")
    with anyio.fail_after(5):
        assert await svc.chat("u1", "hello") == "Hi."


async def test_a_resumed_stream_read_by_another_task_holds_the_conversation_until_closed() -> None:
    svc, _, _shop = service(GATED_ROUND, ANSWER, ["Hi."])
    async with await svc.chat_stream("u1", "q") as stream:
        await stream.result()
    assert stream.approval is not None
    resumed = await agentrt.resume(svc, stream.approval.run_id, {"c2": Approve()}, memory_id="u1")
    texts: list[str] = []

    async def read() -> None:
        async with resumed:
            async for token in resumed:
                texts.append(token)

    async with anyio.create_task_group() as group:
        group.start_soon(read)
    assert texts == ["Done."]
    with anyio.fail_after(5):
        assert await svc.chat("u1", "hello") == "Hi."


@pytest.mark.virtual_clock
async def test_the_deadline_during_an_approved_stream_resume_is_raised_by_the_await() -> None:
    from agentrt.testing import Delay

    @tool("Email.", needs_approval=True)
    async def email(text: str) -> str:
        await anyio.sleep(5)
        return "sent"

    svc, _, _ = service(
        [Delay(6), CallTool("email", {"text": "a"}, id="e1")],
        ANSWER,
        tools=[email],
        budget=Budget(seconds=10),
    )
    async with await svc.chat_stream("u1", "q") as stream:
        await stream.result()
    approval = stream.approval
    assert approval is not None
    with pytest.raises(agentrt.BudgetExceededError):
        await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1")
    assert (await pending_of(svc)) is None


async def test_a_primed_stream_resume_cancelled_before_the_first_chunk_ran_the_call_once_and_frees_all() -> (
    None
):
    svc, model, shop = service(["Checking.", CallTool("email", {"text": "hi"}, id="e1")], [Hang()], ["Hi."])
    async with await svc.chat_stream("u1", "q") as stream:
        await stream.result()
    approval = stream.approval
    assert approval is not None
    with anyio.move_on_after(1) as scope:  # (Hang: the model never answers)
        await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1")
    assert scope.cancelled_caught
    assert shop.ran == [("email", "hi")]
    assert model.streams[1].closed
    assert (await pending_of(svc)) is None
    with pytest.raises(ApprovalNotFoundError):
        await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1")
    with anyio.fail_after(5):
        assert await svc.chat("u1", "hello") == "Hi."
    assert shop.ran == [("email", "hi")]
