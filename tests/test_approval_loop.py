"""Approval inside the tool loop (issue 26): tool mode and its answer tool beside a gated call,
immediate tools that need approval, unknown tools, invalid arguments and repeated call ids beside
a gated call, the loop's limits and the budget carried across the wait (counted once, never the
human's time), and the resumed round's executions in the model's order. What carries over in the
plain case is in test_approval.py.
"""

from __future__ import annotations

from typing import Annotated

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel
from test_approval import ANSWER, GATED_ROUND, pending_of, service, suspended, tool_results
from test_approval_views import Ticket

import agentrt
from agentrt import ApprovalDecisionError, ApprovalRequired, Approvals, Approve, Budget, Deny, MemoryId, tool
from agentrt.memory import access
from agentrt.testing import CallTool

pytestmark = pytest.mark.anyio


# --- tool mode and its answer tool ----------------------------------------------------------------


class Desk:
    async def ticket(self, conversation: Annotated[str, MemoryId], text: str) -> Ticket: ...


async def test_tool_mode_a_gated_call_waits_and_the_answer_tool_answers_after_it() -> None:
    from agentrt.output import ANSWER_TOOL

    svc, model, shop = service(
        [CallTool("email", {"text": "hi"}, id="e1")],
        [CallTool(ANSWER_TOOL, {"title": "t", "priority": 3}, id="a1")],
        cls=Desk,
        output_mode="tool",
    )
    with pytest.raises(ApprovalRequired) as info:
        await svc.ticket("u1", "q")
    approval = info.value.approval
    assert [c.tool for c in approval.calls] == ["email"]
    value = await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1")
    assert value == Ticket(title="t", priority=3)
    assert shop.ran == [("email", "hi")]
    assert [s.name for s in model.requests[1].tools] == [s.name for s in model.requests[0].tools]
    assert model.requests[1].tool_choice == model.requests[0].tool_choice


async def test_tool_mode_the_answer_tool_beside_a_gated_call_answers_and_nothing_waits() -> None:
    from agentrt.output import ANSWER_TOOL

    svc, _, shop = service(
        [
            CallTool("email", {"text": "hi"}, id="e1"),
            CallTool(ANSWER_TOOL, {"title": "t", "priority": 3}, id="a1"),
        ],
        cls=Desk,
        output_mode="tool",
    )
    assert await svc.ticket("u1", "q") == Ticket(title="t", priority=3)
    assert shop.ran == [] and (await pending_of(svc)) is None


async def test_tool_mode_an_answer_tool_declared_gated_is_not_a_tool_that_waits() -> None:
    from agentrt.output import ANSWER_TOOL

    svc, _, _ = service(
        [CallTool(ANSWER_TOOL, {"title": "t", "priority": 3}, id="a1")],
        cls=Desk,
        output_mode="tool",
        approvals=Approvals(needs_approval={ANSWER_TOOL: True}),
    )
    assert await svc.ticket("u1", "q") == Ticket(title="t", priority=3)


# --- immediate tools ------------------------------------------------------------------------------


class Order(BaseModel):
    id: str


async def test_an_immediate_tool_that_is_gated_answers_once_approved() -> None:
    ran: list[str] = []

    @tool("Place an order; its result is the answer.", immediate=True, needs_approval=True)
    async def place(item: str) -> Order:
        ran.append(item)
        return Order(id=f"o-{item}")

    class Orders:
        async def order(self, conversation: Annotated[str, MemoryId], text: str) -> Order: ...

    svc, model, _ = service([CallTool("place", {"item": "pen"}, id="p1")], cls=Orders, tools=[place])
    with pytest.raises(ApprovalRequired) as info:
        await svc.order("u1", "a pen")
    value = await agentrt.resume(svc, info.value.approval.run_id, {"p1": Approve()}, memory_id="u1")
    assert value == Order(id="o-pen") and ran == ["pen"]
    assert len(model.requests) == 1  # the immediate tool's result is the answer: no second request


async def test_an_immediate_gated_tool_denied_asks_the_model_again() -> None:
    @tool("Place an order.", immediate=True, needs_approval=True)
    async def place(item: str) -> str:
        return "placed"

    svc, model, _ = service([CallTool("place", {"item": "pen"}, id="p1")], ["Not placed."], tools=[place])
    approval = await suspended(svc)
    assert await agentrt.resume(svc, approval.run_id, {"p1": Deny()}, memory_id="u1") == "Not placed."
    assert len(model.requests) == 2


# --- unknown tools, invalid arguments and repeated ids beside a gated call ------------------------


async def test_an_unknown_tool_and_invalid_arguments_beside_a_gated_call_are_reported_once() -> None:
    svc, model, shop = service(
        [
            CallTool("nope", {}, id="n1"),
            CallTool("email", {"text": "hi"}, id="e1"),
            CallTool("refund", {"order": "A1"}, id="r1"),  # amount missing: invalid, does not wait
        ],
        ANSWER,
    )
    approval = await suspended(svc)
    assert [c.id for c in approval.calls] == ["e1"]
    assert await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1") == "Done."
    results = tool_results(model.requests[1].messages)
    assert [r[0] for r in results] == ["n1", "e1", "r1"]
    assert results[0][2] and results[2][2] and not results[1][2]
    assert shop.ran == [("email", "hi")]


async def test_two_gated_calls_sharing_an_id_cannot_be_approved_by_one_decision() -> None:
    svc, _, shop = service(
        [
            CallTool("email", {"text": "to Ada"}, id="dup"),
            CallTool("email", {"text": "to everyone"}, id="dup"),
        ],
        ANSWER,
    )
    try:
        approval = await suspended(svc)
    except AssertionError:  # refused (or made unique) before it waits: fine
        return
    ids = [c.id for c in approval.calls]
    if len(set(ids)) == len(ids):
        return  # ids made unique: each decided on its own
    with pytest.raises(ApprovalDecisionError):
        await agentrt.resume(svc, approval.run_id, {"dup": Approve()}, memory_id="u1")
    assert shop.ran == []


async def test_a_gated_call_sharing_its_id_with_a_call_that_ran_is_decided_on_its_own() -> None:
    svc, _model, shop = service(
        [CallTool("lookup", {"order": "A1"}, id="dup"), CallTool("email", {"text": "hi"}, id="dup")], ANSWER
    )
    approval = await suspended(svc)
    assert shop.ran == [("lookup", "A1")]
    assert [(c.id, c.tool) for c in approval.calls] == [("dup", "email")]
    assert await agentrt.resume(svc, approval.run_id, {"dup": Deny()}, memory_id="u1") == "Done."
    assert shop.ran == [("lookup", "A1")]


# --- loop limits across the wait ------------------------------------------------------------------


async def test_max_calls_counts_the_gated_round_once_across_the_wait() -> None:
    svc, _, shop = service(
        GATED_ROUND,
        [CallTool("lookup", {"order": "C3"}, id="c4")],
        ANSWER,
        tool_settings=agentrt.ToolSettings(max_calls=4),
    )
    approval = await suspended(svc)
    assert await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."
    assert len(shop.ran) == 4


async def test_max_identical_calls_counts_the_gated_call_once_across_the_wait() -> None:
    svc, _, shop = service(
        [CallTool("email", {"text": "a"}, id="e1")],
        [CallTool("email", {"text": "a"}, id="e2")],
        ["Fine."],
        tool_settings=agentrt.ToolSettings(max_identical_calls=1, on_limit="final_answer"),
    )
    approval = await suspended(svc)
    # The second identical call breaks the limit (it was counted once, not twice): a final answer.
    assert await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1") == "Fine."
    assert shop.ran == [("email", "a")]


async def test_max_rounds_reached_by_the_gated_round_asks_for_a_final_answer_after_it() -> None:
    svc, model, shop = service(
        GATED_ROUND,
        [CallTool("lookup", {"order": "C3"}, id="c4")],
        ["Final."],
        tool_settings=agentrt.ToolSettings(max_rounds=1, on_limit="final_answer"),
    )
    approval = await suspended(svc)
    assert await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Final."
    assert len(shop.ran) == 3 and len(model.requests) == 3
    assert model.requests[2].tool_choice == "none"


async def test_max_rounds_with_raise_fails_the_resumed_turn_and_stores_nothing() -> None:
    svc, _, shop = service(
        GATED_ROUND,
        [CallTool("lookup", {"order": "C3"}, id="c4")],
        tool_settings=agentrt.ToolSettings(max_rounds=1),
    )
    approval = await suspended(svc)
    with pytest.raises(agentrt.ToolLoopLimitError):
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
    assert len(shop.ran) == 3
    assert await access(svc).read("u1") == [] and (await pending_of(svc)) is None


# --- budgets across the wait ----------------------------------------------------------------------


async def test_a_denied_call_does_not_spend_the_tool_call_budget() -> None:
    svc, _, shop = service(
        [CallTool("email", {"text": "a"}, id="e1")],
        [CallTool("lookup", {"order": "A1"}, id="l1")],
        ANSWER,
        budget=Budget(tool_calls=1),
    )
    approval = await suspended(svc)
    # Nothing ran yet; the human said no. One tool call is still within the budget.
    assert await agentrt.resume(svc, approval.run_id, {"e1": Deny()}, memory_id="u1") == "Done."
    assert shop.ran == [("lookup", "A1")]


@pytest.mark.virtual_clock
async def test_the_time_budget_carries_the_seconds_before_the_wait_not_the_wait() -> None:
    from agentrt.testing import Delay

    @tool("Email.", needs_approval=True)
    async def email(text: str) -> str:
        await anyio.sleep(3)
        return "sent"

    svc, _, _ = service(
        [Delay(6), CallTool("email", {"text": "a"}, id="e1")],
        ANSWER,
        tools=[email],
        budget=Budget(seconds=10),
    )
    approval = await suspended(svc)
    await anyio.sleep(3600)  # a human takes an hour
    result = await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1")
    assert result == "Done."


@pytest.mark.virtual_clock
async def test_the_deadline_during_the_approved_tool_cuts_it_stores_nothing_and_frees_the_conversation() -> (
    None
):
    from agentrt.testing import Delay

    ran: list[str] = []

    @tool("Email.", needs_approval=True)
    async def email(text: str) -> str:
        ran.append(text)
        await anyio.sleep(5)
        ran.append("finished")
        return "sent"

    svc, _model, _ = service(
        [Delay(6), CallTool("email", {"text": "a"}, id="e1")],
        ["Hi."],
        tools=[email],
        budget=Budget(seconds=10),
    )
    approval = await suspended(svc)
    with pytest.raises(agentrt.BudgetExceededError) as info:
        await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1")
    assert info.value.limit == "seconds"
    assert ran == ["a"]
    assert (await pending_of(svc)) is None and await access(svc).read("u1") == []
    assert await svc.chat("u1", "hello") == "Hi."  # not held, not pending


@pytest.mark.virtual_clock
async def test_a_resume_waiting_for_a_busy_conversation_is_bounded_by_the_time_budget() -> None:
    svc, _, shop = service([CallTool("email", {"text": "hi"}, id="e1")], ANSWER, budget=Budget(seconds=10))
    approval = await suspended(svc)
    memory = agentrt._service.runtime_of(svc).memory  # type: ignore[union-attr]
    assert memory is not None
    taken, done = anyio.Event(), anyio.Event()

    async def hold() -> None:  # another task holds the conversation (a long write, say)
        conversation = await memory.open("u1", "a long write")
        taken.set()
        await done.wait()
        await conversation.release()

    async with anyio.create_task_group() as group:
        group.start_soon(hold)
        await taken.wait()
        with anyio.move_on_after(60) as scope:  # virtual time: far past the 10 s budget
            with pytest.raises(agentrt.BudgetExceededError) as info:
                await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1")
        done.set()
    assert not scope.cancelled_caught
    assert isinstance(info.value.__cause__, agentrt.ConversationBusyError)
    assert shop.ran == []
    assert await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1") == "Done."


# --- the resumed round's executions ---------------------------------------------------------------


async def test_a_resumed_rounds_executions_are_in_the_models_order_as_in_an_uninterrupted_turn() -> None:
    svc, _, _ = service(GATED_ROUND, ANSWER)
    first = await svc.chat_result("u1", "refund")
    assert first.approval is not None
    done = await agentrt.resume(svc, first.approval.run_id, {"c2": Approve()}, memory_id="u1")
    plain, _, _ = service(GATED_ROUND, ANSWER, approvals=Approvals(needs_approval={"refund": False}))
    uninterrupted = await plain.chat_result("u1", "refund")
    assert [e.call_id for e in uninterrupted.tool_executions] == ["c1", "c2", "c3"]
    assert [e.call_id for e in done.tool_executions] == ["c1", "c2", "c3"]
