"""An outside review of approvals (issue 26): bad input to resume, memory ids, other builds, views,
guardrail releases, tool mode, limits, budgets, cancellation and concurrency.

Each defect the review found (20 of them, all fixed since) is a test of what should happen; the others
are guarantees that held up under the same attacks.
"""

from __future__ import annotations

import math
import uuid
from typing import Annotated, Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel
from test_approval import (  # the same tools, service and helpers as the feature's own tests
    ANSWER,
    GATED_ROUND,
    Shop,
    Support,
    pending_of,
    service,
    suspended,
    tool_results,
)

import agentrt
from agentrt import (
    ApprovalDecisionError,
    ApprovalNotFoundError,
    ApprovalPendingError,
    ApprovalRequested,
    ApprovalRequired,
    Approvals,
    Approve,
    Budget,
    Completed,
    Deny,
    MemoryId,
    Result,
    TokenStream,
    ToolCallRequested,
    ToolContext,
    tool,
)
from agentrt.memory import InMemoryStore, access
from agentrt.testing import CallTool, Hang, ScriptedModel

pytestmark = pytest.mark.anyio


# --- bad input to resume ------------------------------------------------------------------------


@pytest.mark.parametrize("run_id", [None, 7, b"run", "", ["r"]])
async def test_a_run_id_that_is_not_text_is_not_found_and_nothing_runs(run_id: Any) -> None:
    svc, model, shop = service(GATED_ROUND, ANSWER)
    await suspended(svc)
    with pytest.raises(ApprovalNotFoundError):
        await agentrt.resume(svc, run_id, {"c2": Approve()}, memory_id="u1")
    assert len(shop.ran) == 2 and len(model.requests) == 1
    assert (await pending_of(svc)) is not None


async def test_decision_keys_of_mixed_types_are_a_decision_error() -> None:
    svc, _model, shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)
    with pytest.raises(ApprovalDecisionError):
        await agentrt.resume(
            svc, approval.run_id, {"c2": Approve(), 1: Approve(), "forged": Approve()}, memory_id="u1"
        )
    assert len(shop.ran) == 2 and (await pending_of(svc)) is not None


@pytest.mark.parametrize("arguments", ["{}", [("order", "A1"), ("amount", 5)], 5, Approve()])
async def test_edited_arguments_that_are_not_a_mapping_are_refused(arguments: Any) -> None:
    svc, _, shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)
    with pytest.raises(ApprovalDecisionError, match="mapping"):
        await agentrt.resume(svc, approval.run_id, {"c2": Approve(arguments=arguments)}, memory_id="u1")
    assert len(shop.ran) == 2 and (await pending_of(svc)) is not None


@pytest.mark.parametrize(
    "arguments",
    [
        {"order": "A1", "amount": 5, "extra": 1},  # unknown field: the arguments model forbids extras
        {"order": "A1", "amount": 5, "ctx": None},
        {"order": 5, "amount": 5},  # strict enough? an int is not an order number
    ],
)
async def test_an_edit_with_fields_the_schema_forbids_is_refused(arguments: dict[str, Any]) -> None:
    svc, _, shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)
    with pytest.raises(ApprovalDecisionError):
        await agentrt.resume(svc, approval.run_id, {"c2": Approve(arguments=arguments)}, memory_id="u1")
    assert len(shop.ran) == 2 and (await pending_of(svc)) is not None


async def test_an_edit_cannot_set_injected_parameters() -> None:
    seen: list[Any] = []

    @tool("Transfer.", needs_approval=True)
    async def transfer(amount: float, owner: Annotated[str, MemoryId], context: ToolContext) -> str:
        seen.append((amount, owner, context.memory_id))
        return "ok"

    svc, _, _ = service([CallTool("transfer", {"amount": 5}, id="t1")], ANSWER, tools=[transfer])
    approval = await suspended(svc)
    assert approval.calls[0].arguments == {"amount": 5.0}
    for forged in ({"amount": 5, "owner": "u2"}, {"amount": 5, "context": {"memory_id": "u2"}}):
        with pytest.raises(ApprovalDecisionError):
            await agentrt.resume(svc, approval.run_id, {"t1": Approve(arguments=forged)}, memory_id="u1")
    assert seen == []
    assert await agentrt.resume(svc, approval.run_id, {"t1": Approve()}, memory_id="u1") == "Done."
    assert seen == [(5.0, "u1", "u1")]


@pytest.mark.parametrize("amount", [math.nan, math.inf])
async def test_an_edit_the_tool_cannot_take_is_refused_before_anything_is_claimed(amount: float) -> None:
    svc, model, _shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)
    with pytest.raises(ApprovalDecisionError):
        await agentrt.resume(
            svc, approval.run_id, {"c2": Approve(arguments={"order": "A1", "amount": amount})}, memory_id="u1"
        )
    assert len(model.requests) == 1 and (await pending_of(svc)) is not None


async def test_an_edit_whose_values_are_not_json_is_a_decision_error() -> None:
    @tool("Store data.", needs_approval=True)
    async def store(data: dict[str, Any]) -> str:
        return "ok"

    svc, _, _ = service([CallTool("store", {"data": {"a": 1}}, id="s1")], ANSWER, tools=[store])
    approval = await suspended(svc)
    with pytest.raises(ApprovalDecisionError):
        await agentrt.resume(
            svc, approval.run_id, {"s1": Approve(arguments={"data": {"a": object()}})}, memory_id="u1"
        )
    assert (await pending_of(svc)) is not None


async def test_a_huge_nested_edit_runs_once_with_what_was_approved() -> None:
    got: list[Any] = []

    @tool("Store data.", needs_approval=True)
    async def store(data: dict[str, Any]) -> str:
        got.append(data)
        return "ok"

    nested: dict[str, Any] = {"leaf": "x" * 100_000}
    for _ in range(50):
        nested = {"n": nested, "list": list(range(100))}
    svc, _model, _ = service([CallTool("store", {"data": {"a": 1}}, id="s1")], ANSWER, tools=[store])
    approval = await suspended(svc)
    assert (
        await agentrt.resume(
            svc, approval.run_id, {"s1": Approve(arguments={"data": nested})}, memory_id="u1"
        )
        == "Done."
    )
    assert got == [nested]


# --- memory ids ---------------------------------------------------------------------------------


async def test_resume_on_another_conversation_without_memory_is_not_found() -> None:
    svc, model, shop = service(GATED_ROUND, ANSWER, memory=False)
    approval = await suspended(svc, conversation="u1")
    with pytest.raises(ApprovalNotFoundError):
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u2")
    assert len(shop.ran) == 2 and len(model.requests) == 1


async def test_an_int_memory_id_resumed_as_text_is_not_found_and_nothing_runs() -> None:
    class ByInt:
        async def chat(self, user: Annotated[int, MemoryId], text: str) -> str: ...

    svc, _model, shop = service(GATED_ROUND, ANSWER, cls=ByInt)
    approval = await suspended(svc, conversation=7)
    assert approval.memory_id == 7
    with pytest.raises(ApprovalNotFoundError):
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="7")
    assert len(shop.ran) == 2
    assert await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id=7) == "Done."


async def test_the_approval_event_carries_a_tuple_memory_id_as_the_method_got_it() -> None:
    class ByPair:
        async def chat(self, user: Annotated[tuple[str, int], MemoryId], text: str) -> str: ...

    svc, _, _shop = service(GATED_ROUND, ANSWER, cls=ByPair)
    approval = await suspended(svc, conversation=("acme", 7))
    assert approval.memory_id == ("acme", 7)


async def test_a_tuple_memory_id_resumes_from_the_approval_events_own_memory_id() -> None:
    class ByPair:
        async def chat(self, user: Annotated[tuple[str, int], MemoryId], text: str) -> str: ...

    svc, _, _shop = service(GATED_ROUND, ANSWER, cls=ByPair)
    approval = await suspended(svc, conversation=("acme", 7))
    assert (
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id=approval.memory_id) == "Done."
    )


async def test_a_tuple_memory_id_resumes_and_commits_on_its_conversation() -> None:
    class ByPair:
        async def chat(self, user: Annotated[tuple[str, int], MemoryId], text: str) -> str: ...

    svc, _, shop = service(GATED_ROUND, ANSWER, cls=ByPair)
    await suspended(svc, conversation=("acme", 7))
    found = await pending_of(svc, ("acme", 7))
    assert found is not None
    assert await agentrt.resume(svc, found[0], {"c2": Approve()}, memory_id=("acme", 7)) == "Done."
    assert len(await access(svc).read(("acme", 7))) == 6
    assert shop.ran.count(("refund", ("A1", 250.0))) == 1


async def test_a_uuid_memory_id_resumes_and_the_tools_get_the_uuid() -> None:
    got: list[Any] = []

    @tool("Email.", needs_approval=True)
    async def email(text: str, user: Annotated[uuid.UUID, MemoryId]) -> str:
        got.append(user)
        return "sent"

    class ByUuid:
        async def chat(self, user: Annotated[uuid.UUID, MemoryId], text: str) -> str: ...

    who = uuid.uuid4()
    svc, _, _ = service([CallTool("email", {"text": "hi"}, id="e1")], ANSWER, cls=ByUuid, tools=[email])
    approval = await suspended(svc, conversation=who)
    assert await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id=who) == "Done."
    assert got == [who]
    assert len(await access(svc).read(who)) == 4


async def test_the_approval_event_carries_a_uuid_memory_id_as_the_method_got_it() -> None:
    class ByUuid:
        async def chat(self, user: Annotated[uuid.UUID, MemoryId], text: str) -> str: ...

    who = uuid.uuid4()
    svc, _, _ = service(GATED_ROUND, ANSWER, cls=ByUuid)
    approval = await suspended(svc, conversation=who)
    assert approval.memory_id == who


# --- another build of the same class (a new process) --------------------------------------------


async def test_another_build_with_the_same_store_resumes_and_runs_the_call_once_there() -> None:
    store = InMemoryStore()
    first, _first_model, first_shop = service(GATED_ROUND, store=store)
    approval = await suspended(first)
    second, second_model, second_shop = service(ANSWER, store=store)

    assert await agentrt.resume(second, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."

    assert second_shop.ran == [("refund", ("A1", 250.0))]
    assert [name for name, _ in first_shop.ran] == ["lookup", "lookup"]
    assert tool_results(second_model.requests[0].messages)[1] == ("c2", "refunded 250 on A1", False)
    with pytest.raises(ApprovalNotFoundError):
        await agentrt.resume(first, approval.run_id, {"c2": Approve()}, memory_id="u1")
    assert len(await access(first).read("u1")) == 6


async def test_another_build_whose_tool_no_longer_exists_is_not_found_or_refused() -> None:
    store = InMemoryStore()
    first, _, _ = service(GATED_ROUND, store=store)
    approval = await suspended(first)

    @tool("Look an order up.")
    def lookup(order: str) -> str:
        return "?"

    second, model, _ = service(ANSWER, store=store, tools=[lookup])  # no refund tool any more
    with pytest.raises((ApprovalNotFoundError, ApprovalDecisionError)):
        await agentrt.resume(second, approval.run_id, {"c2": Approve()}, memory_id="u1")
    assert model.requests == []
    assert (await pending_of(second)) is not None


# --- the views: PartialStream and Result ---------------------------------------------------------


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


# --- output guardrails: what a stream shows and withdraws around a gated round ----------------------


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


# --- tool mode, immediate tools, unknown tools, invalid arguments, duplicate ids -------------------


class Order(BaseModel):
    id: str


class Desk2:
    async def ticket(self, conversation: Annotated[str, MemoryId], text: str) -> Ticket: ...


async def test_tool_mode_a_gated_call_waits_and_the_answer_tool_answers_after_it() -> None:
    from agentrt.output import ANSWER_TOOL

    svc, model, shop = service(
        [CallTool("email", {"text": "hi"}, id="e1")],
        [CallTool(ANSWER_TOOL, {"title": "t", "priority": 3}, id="a1")],
        cls=Desk2,
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
        cls=Desk2,
        output_mode="tool",
    )
    assert await svc.ticket("u1", "q") == Ticket(title="t", priority=3)
    assert shop.ran == [] and (await pending_of(svc)) is None


async def test_tool_mode_an_answer_tool_declared_gated_is_not_a_tool_that_waits() -> None:
    from agentrt.output import ANSWER_TOOL

    svc, _, _ = service(
        [CallTool(ANSWER_TOOL, {"title": "t", "priority": 3}, id="a1")],
        cls=Desk2,
        output_mode="tool",
        approvals=Approvals(needs_approval={ANSWER_TOOL: True}),
    )
    assert await svc.ticket("u1", "q") == Ticket(title="t", priority=3)


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


# --- predicates ---------------------------------------------------------------------------------


async def test_an_async_predicate_that_returns_no_bool_fails_closed_as_a_sync_one_does() -> None:
    ran: list[str] = []

    def sync_none(args: Any, ctx: ToolContext) -> Any:
        return None

    async def async_none(args: Any, ctx: ToolContext) -> Any:
        return None

    for predicate in (sync_none, async_none):

        @tool("Email.", needs_approval=predicate)
        async def email(text: str) -> str:
            ran.append(text)
            return "sent"

        svc, _, _ = service([CallTool("email", {"text": predicate.__name__}, id="e1")], ANSWER, tools=[email])
        try:
            await svc.chat("u1", "mail")
        except ApprovalRequired:
            pass
    assert ran == []  # neither ran without a human: the sync one is refused, the async one too


# --- loop limits and budgets across the wait ------------------------------------------------------


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


# --- concurrency: exactly once ----------------------------------------------------------------------


@pytest.mark.parametrize("memory", [True, False])
async def test_two_tasks_resuming_the_same_run_run_it_exactly_once(
    memory: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    load = InMemoryStore.load_pending

    async def interleaved(self: InMemoryStore, key: str) -> tuple[str, bytes] | None:
        found = await load(self, key)
        await anyio.lowlevel.checkpoint()  # let the other resume load it too (trio runs on otherwise)
        return found

    monkeypatch.setattr(InMemoryStore, "load_pending", interleaved)
    gate = anyio.Event()
    ran: list[str] = []

    @tool("Email.", needs_approval=True)
    async def email(text: str) -> str:
        ran.append(text)
        await gate.wait()
        return "sent"

    svc, _, _ = service(
        [CallTool("email", {"text": "hi"}, id="e1")], ANSWER, ANSWER, tools=[email], memory=memory
    )
    approval = await suspended(svc)
    outcomes: list[Any] = []

    async def resume() -> None:
        try:
            outcomes.append(await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1"))
        except ApprovalNotFoundError as error:
            outcomes.append(type(error))

    async with anyio.create_task_group() as group:
        group.start_soon(resume)
        group.start_soon(resume)
        for _ in range(50):
            await anyio.lowlevel.checkpoint()
        gate.set()
    assert ran == ["hi"]
    assert sorted(map(str, outcomes)) == sorted(["Done.", str(ApprovalNotFoundError)])


async def test_a_new_message_under_deny_racing_a_resume_waits_for_it_and_nothing_runs_twice() -> None:
    entered, release = anyio.Event(), anyio.Event()
    ran: list[str] = []

    @tool("Email.", needs_approval=True)
    async def email(text: str) -> str:
        ran.append(text)
        entered.set()
        await release.wait()
        return "sent"

    svc, _model, _ = service(
        [CallTool("email", {"text": "hi"}, id="e1")],
        ["Done."],
        ["Hello again."],
        tools=[email],
        approvals=Approvals(while_pending="deny"),
    )
    approval = await suspended(svc)
    got: dict[str, Any] = {}

    async def resume() -> None:
        got["resume"] = await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1")

    async def new_message() -> None:
        got["new"] = await svc.chat("u1", "hello?")

    async with anyio.create_task_group() as group:
        group.start_soon(resume)
        await entered.wait()
        group.start_soon(new_message)
        for _ in range(20):
            await anyio.lowlevel.checkpoint()
        release.set()
    assert got == {"resume": "Done.", "new": "Hello again."}
    assert ran == ["hi"]
    stored = await access(svc).read("u1")
    assert [r[1] for r in tool_results(stored)] == ["sent"]  # the approved result, not a denial
    assert [type(m).__name__ for m in stored] == [
        "UserMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "AssistantMessage",
        "UserMessage",
        "AssistantMessage",
    ]


async def test_a_new_message_under_deny_first_then_the_resume_is_not_found_and_nothing_runs() -> None:
    svc, _, shop = service(GATED_ROUND, ["Hello."], approvals=Approvals(while_pending="deny"))
    approval = await suspended(svc)
    assert await svc.chat("u1", "hello?") == "Hello."
    with pytest.raises(ApprovalNotFoundError):
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
    assert ("refund", ("A1", 250.0)) not in shop.ran


async def test_a_refused_new_message_leaves_the_conversation_free_for_the_resume() -> None:
    svc, _, shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)
    with pytest.raises(ApprovalPendingError):
        await svc.chat_stream("u1", "hello?")  # the stream's await raises it
    with pytest.raises(ApprovalPendingError):
        await svc.chat("u1", "hello?")
    with anyio.fail_after(5):
        assert await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."
    assert shop.ran.count(("refund", ("A1", 250.0))) == 1


# --- cancellation at odd points ----------------------------------------------------------------------


async def test_cancelled_during_the_predicate_nothing_ran_nothing_is_stored_the_conversation_is_free() -> (
    None
):
    entered = anyio.Event()

    async def slow(args: Any, ctx: ToolContext) -> bool:
        entered.set()
        await anyio.sleep_forever()
        return True

    shop = Shop()

    @tool("Refund.", needs_approval=slow)
    async def refund(order: str, amount: float) -> str:
        shop.ran.append(("refund", order))
        return "ok"

    svc, _, _ = service(
        [
            CallTool("lookup", {"order": "A1"}, id="c1"),
            CallTool("refund", {"order": "A1", "amount": 5}, id="c2"),
        ],
        ["Hi."],
        tools=[refund, shop.lookup],
    )
    async with anyio.create_task_group() as group:
        group.start_soon(svc.chat, "u1", "refund")
        await entered.wait()
        group.cancel_scope.cancel()
    assert shop.ran == []  # the round's other calls run only after the gate
    assert (await pending_of(svc)) is None
    with anyio.fail_after(5):
        assert await svc.chat("u1", "hello") == "Hi."


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


async def test_a_listener_that_raises_on_the_approval_event_changes_nothing() -> None:
    def broken(event: Any) -> None:
        if isinstance(event, ApprovalRequested):
            raise RuntimeError("listener bug")

    svc, _, shop = service(GATED_ROUND, ANSWER, listeners=[broken])
    approval = await suspended(svc)
    assert await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."
    assert shop.ran.count(("refund", ("A1", 250.0))) == 1


# --- expiry at the boundary ----------------------------------------------------------------------------


async def test_at_exactly_its_expiry_the_approval_is_expired_for_resume_and_for_a_new_message(
    clock: list[float],
) -> None:
    svc, _model, shop = service(GATED_ROUND, ANSWER, approvals=Approvals(expires_after=60))
    approval = await suspended(svc)
    clock[0] = approval.expires_at  # type: ignore[assignment]
    assert await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."
    assert ("refund", ("A1", 250.0)) not in shop.ran

    svc, _, shop = service(GATED_ROUND, ["Hi."], approvals=Approvals(expires_after=60))
    approval = await suspended(svc)
    clock[0] = approval.expires_at  # type: ignore[assignment]
    assert await svc.chat("u1", "hello") == "Hi."  # refuse does not apply: it expired


async def test_just_before_its_expiry_the_approval_runs(clock: list[float]) -> None:
    svc, _, shop = service(GATED_ROUND, ANSWER, approvals=Approvals(expires_after=60))
    approval = await suspended(svc)
    clock[0] = math.nextafter(approval.expires_at, 0)  # type: ignore[arg-type]
    assert await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."
    assert shop.ran.count(("refund", ("A1", 250.0))) == 1


# --- the stores: the pending contract, and a lost reply ---------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def pending_store(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    from agentrt.memory import RedisStore, SQLiteStore

    if request.param == "memory":
        yield InMemoryStore()
        return
    if request.param == "sqlite":
        store: Any = SQLiteStore(tmp_path / "db.sqlite")
    else:
        store = RedisStore(request.getfixturevalue("redis_url"), prefix=f"review-{uuid.uuid4().hex[:8]}:")
    yield store
    await store.aclose()


async def test_the_pending_contract_save_load_take_once(pending_store: Any) -> None:
    store = pending_store
    assert await store.load_pending("k") is None
    assert await store.take_pending("k", "r1") is None
    await store.save_pending("k", "r1", b"one")
    await store.save_pending("k2", "r9", b"other conversation")
    assert await store.load_pending("k") == ("r1", b"one")
    assert await store.take_pending("k", "r2") is None  # another run: nothing taken
    assert await store.load_pending("k") == ("r1", b"one")
    await store.save_pending("k", "r2", b"two")  # a newer turn replaces the waiting one
    assert await store.take_pending("k", "r1") is None
    assert await store.take_pending("k", "r2") == b"two"
    assert await store.take_pending("k", "r2") is None  # once
    assert await store.load_pending("k") is None
    assert await store.load_pending("k2") == ("r9", b"other conversation")
    big = bytes(range(256)) * 40_000  # 10 MB, every byte value
    await store.save_pending("k", "r3", big)
    assert await store.take_pending("k", "r3") == big


@pytest.fixture
def lost_reply(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Drop the reply of the next EVALSHA of a script (the server ran it): what a timeout or a dropped
    connection does; a client with retries sends the command again."""
    import redis
    import redis.connection

    state: dict[str, Any] = {"sha": None}
    send, read = (
        redis.connection.AbstractConnection.send_command,
        redis.connection.AbstractConnection.read_response,
    )

    def sending(self: Any, *args: Any, **kw: Any) -> Any:
        self._review_last = args
        return send(self, *args, **kw)

    def reading(self: Any, *args: Any, **kw: Any) -> Any:
        reply = read(self, *args, **kw)
        last = getattr(self, "_review_last", ())
        if state["sha"] is not None and last[:2] == ("EVALSHA", state["sha"]):
            state["sha"] = None
            self.disconnect()
            raise redis.ConnectionError("the reply was lost")
        return reply

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_command", sending)
    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", reading)
    return state


async def test_a_redis_claim_whose_reply_was_lost_and_retried_still_runs_the_approved_call(
    redis_url: str, lost_reply: Any
) -> None:
    import redis

    from agentrt.memory import RedisStore

    host, port = redis_url.split("//")[1].split("/")[0].split(":")
    # A client of the user's own, as RedisStore(client=...) takes it: redis-py retries 3 times.
    store = RedisStore(
        client=redis.Redis(host=host, port=int(port)), prefix=f"review-{uuid.uuid4().hex[:8]}:"
    )
    try:
        svc, _, shop = service(GATED_ROUND, ANSWER, store=store)
        approval = await suspended(svc)
        lost_reply["sha"] = store._take_pending.sha
        try:
            result = await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
        except ApprovalNotFoundError:
            result = None
        # Either the claim counts (the call runs once) or the run still waits: never lost.
        assert result == "Done." or (await pending_of(svc)) is not None
        assert shop.ran.count(("refund", ("A1", 250.0))) == (1 if result == "Done." else 0)
    finally:
        await store.aclose()


async def test_a_redis_claim_whose_reply_was_lost_without_retries_puts_the_run_back(
    redis_url: str, lost_reply: Any
) -> None:
    import redis

    from agentrt.memory import RedisStore

    store = RedisStore(redis_url, prefix=f"review-{uuid.uuid4().hex[:8]}:")  # its own client: no retries
    try:
        svc, _, shop = service(GATED_ROUND, ANSWER, store=store)
        approval = await suspended(svc)
        lost_reply["sha"] = store._take_pending.sha
        with pytest.raises(redis.ConnectionError):
            await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
        assert (await pending_of(svc)) is not None and len(shop.ran) == 2
        assert await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."
        assert shop.ran.count(("refund", ("A1", 250.0))) == 1
    finally:
        await store.aclose()


# --- across processes: suspended in one, resumed in another ------------------------------------------


class LoggedShop:
    """Tools whose side effects are lines of a file, so that two processes can be counted."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _log(self, line: str) -> None:
        with open(self.path, "a") as log:
            log.write(line + "\n")

    @tool("Refund an order.", needs_approval=lambda args, ctx: args["amount"] > 100)
    async def refund(self, order: str, amount: float) -> str:
        self._log(f"refund {order} {amount:g}")
        return f"refunded {amount:g} on {order}"

    @tool("Look an order up.")
    def lookup(self, order: str) -> str:
        self._log(f"lookup {order}")
        return f"{order}: delivered"


def shared_store(kind: str, where: str) -> Any:
    from agentrt.memory import RedisStore, SQLiteStore

    return SQLiteStore(where) if kind == "sqlite" else RedisStore(where, prefix="review-processes:")


def process_service(kind: str, where: str, log: str, *script: Any) -> tuple[Any, Any]:
    store = shared_store(kind, where)
    svc = agentrt.build(
        Support,
        model=ScriptedModel(*script),
        tools=[LoggedShop(log)],
        memory=agentrt.memory.window(store=store, namespace="review-processes"),
    )
    return svc, store


async def suspend_in_this_process(kind: str, where: str, log: str, conversation: str) -> str:
    svc, store = process_service(kind, where, log, GATED_ROUND)
    try:
        with pytest.raises(ApprovalRequired) as info:
            await svc.chat(conversation, "refund A1")
        return info.value.approval.run_id
    finally:
        await store.aclose()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_a_turn_suspended_in_one_process_is_resumed_in_another_once(
    kind: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    import os
    import sys

    where = str(tmp_path / "db.sqlite") if kind == "sqlite" else request.getfixturevalue("redis_url")
    log = str(tmp_path / "log")
    conversation = f"c-{uuid.uuid4().hex[:8]}"
    code = (
        "import sys, anyio\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from test_approval_review import suspend_in_this_process\n"
        f"print(anyio.run(suspend_in_this_process, {kind!r}, {where!r}, {log!r}, {conversation!r}))\n"
    )
    done = await anyio.run_process([sys.executable, "-c", code], check=True)
    run_id = done.stdout.decode().strip().splitlines()[-1]
    assert sorted((await anyio.Path(log).read_text()).splitlines()) == ["lookup A1", "lookup B2"]

    svc, store = process_service(kind, where, log, ANSWER)
    try:
        assert await agentrt.resume(svc, run_id, {"c2": Approve()}, memory_id=conversation) == "Done."
        with pytest.raises(ApprovalNotFoundError):
            await agentrt.resume(svc, run_id, {"c2": Approve()}, memory_id=conversation)
        stored = await access(svc).read(conversation)
        assert [r[0] for r in tool_results(stored)] == ["c1", "c2", "c3"]
    finally:
        await store.aclose()
    lines = (await anyio.Path(log).read_text()).splitlines()
    assert sorted(lines[:2]) == ["lookup A1", "lookup B2"] and lines[2:] == ["refund A1 250"]


async def test_bad_decisions_on_a_stream_resume_are_raised_by_the_await_and_free_the_conversation() -> None:
    svc, model, shop = service(GATED_ROUND, ANSWER)
    async with await svc.chat_stream("u1", "q") as stream:
        await stream.result()
    approval = stream.approval
    assert approval is not None
    with pytest.raises(ApprovalDecisionError):
        await agentrt.resume(svc, approval.run_id, {"c2": Approve(arguments={"order": 1})}, memory_id="u1")
    assert len(model.requests) == 1 and (await pending_of(svc)) is not None
    with anyio.fail_after(5):
        resumed = await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
    async with resumed:
        assert [token async for token in resumed] == ["Done."]
    assert shop.ran.count(("refund", ("A1", 250.0))) == 1


async def test_an_edit_by_the_arguments_models_internal_field_names_is_refused() -> None:
    svc, _, shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)
    with pytest.raises(ApprovalDecisionError):
        await agentrt.resume(
            svc, approval.run_id, {"c2": Approve(arguments={"p0": "A1", "p1": 5})}, memory_id="u1"
        )
    assert len(shop.ran) == 2 and (await pending_of(svc)) is not None


async def test_after_an_edit_the_partial_transcript_of_an_error_shows_the_call_as_it_ran() -> None:
    svc, _, shop = service(GATED_ROUND, ANSWER, budget=Budget(model_requests=1))
    approval = await suspended(svc)
    with pytest.raises(agentrt.BudgetExceededError) as info:
        await agentrt.resume(
            svc, approval.run_id, {"c2": Approve(arguments={"order": "A1", "amount": 90})}, memory_id="u1"
        )
    assert shop.ran[-1] == ("refund", ("A1", 90.0))
    [asked] = [
        m for m in info.value.partial.messages if isinstance(m, agentrt.AssistantMessage) and m.tool_calls
    ]
    assert asked.tool_calls[1].arguments == '{"order":"A1","amount":90.0}'


async def test_a_resumed_rounds_executions_are_in_the_models_order_as_in_an_uninterrupted_turn() -> None:
    svc, _, _ = service(GATED_ROUND, ANSWER)
    first = await svc.chat_result("u1", "refund")
    assert first.approval is not None
    done = await agentrt.resume(svc, first.approval.run_id, {"c2": Approve()}, memory_id="u1")
    plain, _, _ = service(GATED_ROUND, ANSWER, approvals=Approvals(needs_approval={"refund": False}))
    uninterrupted = await plain.chat_result("u1", "refund")
    assert [e.call_id for e in uninterrupted.tool_executions] == ["c1", "c2", "c3"]
    assert [e.call_id for e in done.tool_executions] == ["c1", "c2", "c3"]


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


async def test_text_with_a_lone_surrogate_before_a_gated_call_suspends_and_resumes() -> None:
    # (the model's text only: arguments with a lone surrogate do not validate, and fail closed)
    svc, _, shop = service(["Let me look \ud800.", CallTool("email", {"text": "hi"}, id="e1")], ANSWER)
    approval = await suspended(svc)
    assert approval.calls[0].arguments == {"text": "hi"}
    assert await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1") == "Done."
    assert shop.ran == [("email", "hi")]
    assert (await access(svc).read("u1"))[1].text == "Let me look \ud800."


class NoPendingStore:
    """A store with the four message methods only (keeps no pending turns)."""

    async def load(self, key: str) -> list[Any]:
        return []

    async def commit(self, key: str, messages: Any, *, drop: int = 0, owner: str | None = None) -> None:
        pass

    async def replace(self, key: str, messages: Any, *, owner: str | None = None) -> None:
        pass

    async def delete(self, key: str, *, owner: str | None = None) -> None:
        pass


async def test_a_provider_tool_needing_approval_on_a_store_without_pending_runs_nothing_of_its_round() -> (
    None
):
    shop = Shop()

    def provider(request: Any) -> list[object]:
        return [shop.email]

    svc = agentrt.build(
        Support,
        model=ScriptedModel(
            [CallTool("lookup", {"order": "A1"}, id="c1"), CallTool("email", {"text": "hi"}, id="e1")], ANSWER
        ),
        tools=[shop.lookup],
        tool_provider=provider,
        memory=NoPendingStore(),
    )
    with pytest.raises(agentrt.ConfigurationError):
        await svc.chat("u1", "x")
    assert shop.ran == []


async def test_evicting_a_conversation_removes_its_waiting_turn() -> None:
    svc, _, _ = service([*GATED_ROUND], ["Hi."])
    await access(svc).replace(
        "u1", [agentrt.UserMessage.of("my card is 4111"), agentrt.AssistantMessage(text="ok")]
    )
    await suspended(svc)
    await access(svc).evict("u1")
    found = await pending_of(svc)
    assert found is None or b"4111" not in found[1]
    assert await svc.chat("u1", "hello") == "Hi."


@pytest.mark.parametrize(
    "decision", [{"approve": True}, {"approve": True, "arguments": {}}, "approve", None, Approve, Deny, 1]
)
async def test_a_decision_that_is_not_an_approve_or_deny_is_refused(decision: Any) -> None:
    svc, _, shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)
    with pytest.raises(ApprovalDecisionError, match="not Approve"):
        await agentrt.resume(svc, approval.run_id, {"c2": decision}, memory_id="u1")
    assert len(shop.ran) == 2 and (await pending_of(svc)) is not None


async def test_listeners_see_each_call_requested_and_executed_once_across_the_wait() -> None:
    heard: list[Any] = []
    svc, _, _ = service(GATED_ROUND, ANSWER, listeners=[heard.append])
    approval = await suspended(svc)
    await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
    requested = [e.call.id for e in heard if isinstance(e, ToolCallRequested)]
    executed = [e.execution.call_id for e in heard if isinstance(e, agentrt.ToolExecuted)]
    assert sorted(requested) == ["c1", "c2", "c3"]
    assert sorted(executed) == ["c1", "c2", "c3"]
    kinds = [type(e).__name__ for e in heard]
    assert kinds.count("Started") == 2 and kinds.count("Completed") == 1
    assert kinds.count("ApprovalRequested") == 1 and "CancelledEvent" not in kinds


async def test_without_memory_another_build_in_the_same_process_resumes_the_run() -> None:
    first, _, _ = service(GATED_ROUND, memory=False)
    approval = await suspended(first)
    second, _, shop = service(ANSWER, memory=False)
    assert await agentrt.resume(second, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."
    assert shop.ran == [("refund", ("A1", 250.0))]
