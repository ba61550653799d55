"""Human approval before a tool runs: suspend a turn, resume it with decisions (issue 26).

Every test reads what the code under test did: the requests the model received, the calls each tool
got (a side-effect log), the conversation in the store, the pending record in the store, the events
in order. Where a waiting turn is found (memory ids, other builds) is in
test_approval_conversations.py, approval inside the tool loop (tool mode, limits, budgets) in
test_approval_loop.py, the streaming and Result views in test_approval_views.py, cross-process tests
in test_approval_processes.py, the stores' contract in test_memory_pending.py, the SSE and frontend
protocols in test_sse_approval.py.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import anyio
import anyio.lowlevel
import pytest

import agentrt
from agentrt import (
    ApprovalDecisionError,
    ApprovalNotFoundError,
    ApprovalPendingError,
    ApprovalRequested,
    ApprovalRequired,
    Approvals,
    Approve,
    AssistantMessage,
    Budget,
    BudgetExceededError,
    Completed,
    Deny,
    MemoryId,
    Result,
    Started,
    TextDelta,
    TokenStream,
    ToolCall,
    ToolCallRequested,
    ToolContext,
    ToolExecuted,
    ToolOutcome,
    ToolRequest,
    ToolResultMessage,
    UserMessage,
    tool,
)
from agentrt.memory import InMemoryStore, access
from agentrt.testing import CallTool, ScriptedModel

pytestmark = pytest.mark.anyio


class Shop:
    """Tools with a side-effect log: every call that ran, in order."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, Any]] = []
        self.checked: list[tuple[dict[str, Any], ToolContext]] = []

    @tool("Refund an order.", needs_approval=lambda args, ctx: args["amount"] > 100)
    async def refund(self, order: str, amount: float) -> str:
        self.ran.append(("refund", (order, amount)))
        return f"refunded {amount:g} on {order}"

    @tool("Look an order up.")
    def lookup(self, order: str) -> str:
        self.ran.append(("lookup", order))
        return f"{order}: delivered"

    @tool("Email the customer.", needs_approval=True)
    async def email(self, text: str) -> str:
        self.ran.append(("email", text))
        return "sent"


class Support:
    async def chat(self, conversation: Annotated[str, MemoryId], text: str) -> str: ...

    async def chat_result(self, conversation: Annotated[str, MemoryId], text: str) -> Result[str]: ...

    async def chat_stream(self, conversation: Annotated[str, MemoryId], text: str) -> TokenStream: ...


GATED_ROUND = [
    "Let me look.",
    CallTool("lookup", {"order": "A1"}, id="c1"),
    CallTool("refund", {"order": "A1", "amount": 250}, id="c2"),
    CallTool("lookup", {"order": "B2"}, id="c3"),
]
ANSWER = ["Done."]


def service(
    *script: Any, memory: bool = True, cls: type = Support, **kw: Any
) -> tuple[Any, ScriptedModel, Shop]:
    shop = kw.pop("shop", None) or Shop()
    model = ScriptedModel(*script)
    built = agentrt.build(
        cls,
        model=model,
        tools=kw.pop("tools", [shop]),
        memory=agentrt.memory.window(store=kw.pop("store", None)) if memory else None,
        **kw,
    )
    return built, model, shop


async def suspended(svc: Any, conversation: Any = "u1", text: str = "refund A1") -> ApprovalRequested:
    with pytest.raises(ApprovalRequired) as info:
        await svc.chat(conversation, text)
    return info.value.approval


def tool_results(messages: Any) -> list[tuple[str, str, bool]]:
    return [(m.tool_call_id, m.text, m.is_error) for m in messages if isinstance(m, ToolResultMessage)]


async def pending_of(svc: Any, conversation: Any = "u1") -> tuple[str, bytes] | None:
    store = access(svc)._memory.store  # type: ignore[attr-defined]
    key = access(svc)._memory.key(conversation, "test")  # type: ignore[attr-defined]
    return await store.load_pending(key)  # type: ignore[no-any-return]


# --- approve, deny, edit --------------------------------------------------------------------------


async def test_a_gated_call_waits_the_others_run_once_before_and_approving_runs_it_once() -> None:
    svc, model, shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)

    assert [(c.id, c.tool, c.arguments) for c in approval.calls] == [
        ("c2", "refund", {"order": "A1", "amount": 250.0})
    ]
    assert sorted(shop.ran) == [
        ("lookup", "A1"),
        ("lookup", "B2"),
    ]  # the two without approval, before it stopped
    assert len(model.requests) == 1
    assert await access(svc).read("u1") == []  # nothing of the turn in the history yet
    assert (await pending_of(svc)) is not None

    text = await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")

    assert text == "Done."
    assert shop.ran[2:] == [("refund", ("A1", 250.0))] and len(shop.ran) == 3
    sent = model.requests[1].messages
    assert tool_results(sent) == [
        ("c1", "A1: delivered", False),
        ("c2", "refunded 250 on A1", False),
        ("c3", "B2: delivered", False),
    ]
    stored = await access(svc).read("u1")
    assert [type(m).__name__ for m in stored] == [
        "UserMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "ToolResultMessage",
        "ToolResultMessage",
        "AssistantMessage",
    ]
    assert stored[-1].text == "Done."  # type: ignore[union-attr]
    assert (await pending_of(svc)) is None


async def test_deny_with_a_reason_is_what_the_model_sees_and_nothing_runs() -> None:
    svc, model, shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)

    result = await agentrt.resume(svc, approval.run_id, {"c2": Deny("over the limit")}, memory_id="u1")

    assert result == "Done."
    assert ("refund", ("A1", 250.0)) not in shop.ran
    results = tool_results(model.requests[1].messages)
    assert results[1] == (
        "c2",
        "The user denied this call of 'refund'; it was not run. Reason: over the limit",
        True,
    )


async def test_the_denied_execution_is_marked_denied_in_the_result() -> None:
    svc, _, _ = service(GATED_ROUND, ANSWER)
    with pytest.raises(ApprovalRequired) as info:
        await svc.chat("u1", "refund")
    result = await agentrt.resume(svc, info.value.approval.run_id, {"c2": Deny()}, memory_id="u1")
    assert result == "Done."
    # the Result view: the same turn again, on a Result method
    svc, _, _ = service(GATED_ROUND, ANSWER)
    first = await svc.chat_result("u1", "refund")
    assert first.value is None and first.approval is not None
    resumed = await agentrt.resume(svc, first.approval.run_id, {"c2": Deny()}, memory_id="u1")
    assert isinstance(resumed, Result)
    outcomes = {e.call_id: e.outcome for e in resumed.tool_executions}
    assert outcomes == {"c1": ToolOutcome.SUCCESS, "c3": ToolOutcome.SUCCESS, "c2": ToolOutcome.DENIED}


async def test_an_edit_runs_the_tool_with_the_edited_arguments_and_the_transcript_says_so() -> None:
    svc, model, shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)

    await agentrt.resume(
        svc, approval.run_id, {"c2": Approve(arguments={"order": "A1", "amount": 90})}, memory_id="u1"
    )

    assert shop.ran[-1] == ("refund", ("A1", 90.0))
    asked = next(m for m in model.requests[1].messages if isinstance(m, AssistantMessage))
    assert asked.tool_calls[1] == ToolCall(id="c2", name="refund", arguments='{"order":"A1","amount":90.0}')


async def test_an_invalid_edit_is_refused_nothing_runs_and_the_turn_still_waits() -> None:
    svc, model, shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)
    before = list(shop.ran)

    with pytest.raises(ApprovalDecisionError, match="amount"):
        await agentrt.resume(svc, approval.run_id, {"c2": Approve(arguments={"order": "A1"})}, memory_id="u1")
    with pytest.raises(ApprovalDecisionError, match="do not validate"):
        await agentrt.resume(
            svc, approval.run_id, {"c2": Approve(arguments={"order": "A1", "amount": "lots"})}, memory_id="u1"
        )

    assert shop.ran == before and len(model.requests) == 1
    assert (await pending_of(svc)) is not None
    assert await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."


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


async def test_an_edit_by_the_arguments_models_internal_field_names_is_refused() -> None:
    svc, _, shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)
    with pytest.raises(ApprovalDecisionError):
        await agentrt.resume(
            svc, approval.run_id, {"c2": Approve(arguments={"p0": "A1", "p1": 5})}, memory_id="u1"
        )
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


# --- decisions that do not fit, and runs that are not there ---------------------------------------


@pytest.mark.parametrize(
    ("decisions", "match"),
    [
        ({}, "no decision"),
        ({"c2": Approve(), "c1": Approve()}, "not pending"),  # c1 ran already: not the client's to approve
        ({"c2": Approve(), "forged": Approve()}, "not pending"),
        ({"c2": True}, "not Approve"),
        ({"c2": Deny(reason=7)}, "not text"),  # type: ignore[arg-type]
    ],
)
async def test_decisions_that_do_not_fit_are_refused_and_nothing_runs(decisions: Any, match: str) -> None:
    svc, model, shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)
    before = list(shop.ran)

    with pytest.raises(ApprovalDecisionError, match=match):
        await agentrt.resume(svc, approval.run_id, decisions, memory_id="u1")

    assert shop.ran == before and len(model.requests) == 1
    assert (await pending_of(svc)) is not None


async def test_a_stale_or_unknown_run_or_another_conversations_is_not_found() -> None:
    svc, _, shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)

    with pytest.raises(ApprovalNotFoundError):
        await agentrt.resume(svc, "0" * 32, {"c2": Approve()}, memory_id="u1")
    with pytest.raises(ApprovalNotFoundError):  # the right run, asked for on another conversation
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u2")
    assert await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."
    ran = list(shop.ran)
    with pytest.raises(ApprovalNotFoundError):  # resumed already
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
    assert shop.ran == ran


async def test_resume_refuses_what_is_not_a_service() -> None:
    with pytest.raises(TypeError, match="not a service"):
        await agentrt.resume(object(), "run", {})
    svc, _, _ = service(GATED_ROUND, ANSWER)
    with pytest.raises(ApprovalDecisionError):
        await agentrt.resume(svc, "run", [("c2", Approve())], memory_id="u1")  # type: ignore[arg-type]


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


@pytest.mark.parametrize(
    "decision", [{"approve": True}, {"approve": True, "arguments": {}}, "approve", None, Approve, Deny, 1]
)
async def test_a_decision_that_is_not_an_approve_or_deny_is_refused(decision: Any) -> None:
    svc, _, shop = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)
    with pytest.raises(ApprovalDecisionError, match="not Approve"):
        await agentrt.resume(svc, approval.run_id, {"c2": decision}, memory_id="u1")
    assert len(shop.ran) == 2 and (await pending_of(svc)) is not None


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


# --- more rounds, parallel calls --------------------------------------------------------------------


async def test_a_second_gated_round_in_the_same_turn_waits_again_with_a_new_run() -> None:
    svc, _model, shop = service(
        GATED_ROUND,
        [CallTool("email", {"text": "refund done"}, id="e1")],
        ANSWER,
    )
    first = await suspended(svc)
    with pytest.raises(ApprovalRequired) as info:
        await agentrt.resume(svc, first.run_id, {"c2": Approve()}, memory_id="u1")
    second = info.value.approval
    assert second.run_id != first.run_id
    assert [c.tool for c in second.calls] == ["email"]
    assert await access(svc).read("u1") == []  # still nothing stored: the turn is not over

    with pytest.raises(ApprovalNotFoundError):
        await agentrt.resume(svc, first.run_id, {"c2": Approve()}, memory_id="u1")
    assert await agentrt.resume(svc, second.run_id, {"e1": Approve()}, memory_id="u1") == "Done."

    assert [name for name, _ in shop.ran] == ["lookup", "lookup", "refund", "email"]
    stored = await access(svc).read("u1")
    assert [m.tool_call_id for m in stored if isinstance(m, ToolResultMessage)] == ["c1", "c2", "c3", "e1"]
    assert sum(isinstance(m, UserMessage) for m in stored) == 1


async def test_every_call_of_a_round_waiting_runs_none_before_it_stops() -> None:
    svc, _, shop = service(
        [CallTool("email", {"text": "a"}, id="e1"), CallTool("email", {"text": "b"}, id="e2")], ANSWER
    )
    approval = await suspended(svc)
    assert [c.id for c in approval.calls] == ["e1", "e2"] and shop.ran == []
    await agentrt.resume(svc, approval.run_id, {"e1": Deny(), "e2": Approve()}, memory_id="u1")
    assert shop.ran == [("email", "b")]


# --- predicates --------------------------------------------------------------------------------------


async def test_a_predicate_decides_per_call_and_sees_the_validated_arguments_and_context() -> None:
    seen: list[tuple[dict[str, Any], ToolContext]] = []

    async def over_100(args: Any, ctx: ToolContext) -> bool:
        seen.append((dict(args), ctx))
        await anyio.lowlevel.checkpoint()
        return bool(args["amount"] > 100)

    @tool("Refund.", needs_approval=over_100)
    async def refund(order: str, amount: float) -> str:
        return "ok"

    svc, _model, _ = service(
        [CallTool("refund", {"order": "A", "amount": 20}, id="r1")], ANSWER, tools=[refund]
    )
    assert await svc.chat("u1", "small refund") == "Done."  # needed none
    assert seen[0][0] == {"order": "A", "amount": 20.0}
    assert (seen[0][1].call_id, seen[0][1].memory_id, seen[0][1].round) == ("r1", "u1", 1)


async def test_a_predicate_that_raises_refuses_the_call_and_the_model_is_told() -> None:
    def broken(args: Any, ctx: ToolContext) -> bool:
        raise KeyError("amount")

    ran: list[str] = []

    @tool("Refund.", needs_approval=broken)
    async def refund(order: str) -> str:
        ran.append(order)
        return "ok"

    svc, model, _ = service([CallTool("refund", {"order": "A"}, id="r1")], ANSWER, tools=[refund])
    assert await svc.chat("u1", "refund") == "Done."
    assert ran == []
    [(call_id, text, is_error)] = tool_results(model.requests[1].messages)
    assert call_id == "r1" and is_error and "not run" in text and "KeyError" in text


async def test_arguments_that_do_not_validate_fail_closed_without_waiting() -> None:
    svc, model, shop = service([CallTool("email", {"txt": "typo"}, id="e1")], ANSWER)
    assert await svc.chat("u1", "mail") == "Done."
    assert shop.ran == []
    [(_, text, is_error)] = tool_results(model.requests[1].messages)
    assert is_error and "invalid arguments" in text


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


# --- where approvals are declared -------------------------------------------------------------------


async def test_approvals_name_tools_a_provider_returns_and_a_method_can_turn_them_off() -> None:
    ran: list[str] = []

    @tool("Delete a file.")
    async def delete(path: str) -> str:
        ran.append(path)
        return "deleted"

    def provider(request: ToolRequest) -> list[object]:
        return [delete]

    @Approvals(needs_approval={"delete": False})
    class Trusted:
        async def chat(self, conversation: Annotated[str, MemoryId], text: str) -> str: ...

    script = ([CallTool("delete", {"path": "/tmp/x"}, id="d1")], ANSWER)
    gated = agentrt.build(
        Support,
        model=ScriptedModel(*script),
        tool_provider=provider,
        memory=agentrt.memory.window(),
        approvals=Approvals(needs_approval={"delete": True}),
    )
    approval = await suspended(gated)
    assert [c.tool for c in approval.calls] == ["delete"] and ran == []

    trusted = agentrt.build(
        Trusted,
        model=ScriptedModel(*script),
        tool_provider=provider,
        memory=agentrt.memory.window(),
        approvals=Approvals(needs_approval={"delete": True}),
    )
    assert await trusted.chat("u1", "delete it") == "Done."
    assert ran == ["/tmp/x"]


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


def test_bad_declarations_are_refused_at_build() -> None:
    with pytest.raises(agentrt.ConfigurationError, match="needs_approval"):
        tool("x", needs_approval="yes")  # type: ignore[arg-type]
    with pytest.raises(agentrt.ConfigurationError, match="expires_after"):
        Approvals(expires_after=0)
    with pytest.raises(agentrt.ConfigurationError, match="while_pending"):
        Approvals(while_pending="ignore")  # type: ignore[arg-type]
    with pytest.raises(agentrt.ConfigurationError, match="approvals must be"):
        agentrt.build(Support, model=ScriptedModel(), approvals={"refund": True})  # type: ignore[arg-type]

    with pytest.raises(agentrt.ConfigurationError, match="keeps no pending turns"):
        agentrt.build(Support, model=ScriptedModel(), tools=[Shop()], memory=NoPendingStore())


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


# --- a new message while a turn waits ----------------------------------------------------------------


async def test_a_new_message_while_pending_is_refused_by_default_and_nothing_is_sent() -> None:
    svc, model, _ = service(GATED_ROUND, ANSWER)
    approval = await suspended(svc)

    with pytest.raises(ApprovalPendingError) as info:
        await svc.chat("u1", "hello?")
    assert info.value.approval.run_id == approval.run_id
    assert len(model.requests) == 1
    assert await svc.chat_result("u2", "another conversation") is not None  # others are not held


async def test_the_deny_policy_stores_the_waiting_turn_with_denials_and_goes_on() -> None:
    svc, model, shop = service(GATED_ROUND, ["Sure, hello."], approvals=Approvals(while_pending="deny"))
    approval = await suspended(svc)

    assert await svc.chat("u1", "hello?") == "Sure, hello."

    stored = await access(svc).read("u1")
    assert [type(m).__name__ for m in stored] == [
        "UserMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "ToolResultMessage",
        "ToolResultMessage",
        "UserMessage",
        "AssistantMessage",
    ]
    denial = tool_results(stored)[1]
    assert denial[0] == "c2" and denial[2] and "sent a new message" in denial[1]
    assert model.requests[1].messages[:5] == tuple(stored[:5])  # the new turn saw it as history
    assert ("refund", ("A1", 250.0)) not in shop.ran
    with pytest.raises(ApprovalNotFoundError):
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")


async def test_a_new_message_under_deny_first_then_the_resume_is_not_found_and_nothing_runs() -> None:
    svc, _, shop = service(GATED_ROUND, ["Hello."], approvals=Approvals(while_pending="deny"))
    approval = await suspended(svc)
    assert await svc.chat("u1", "hello?") == "Hello."
    with pytest.raises(ApprovalNotFoundError):
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
    assert ("refund", ("A1", 250.0)) not in shop.ran


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


# --- two resumes of one run at once ---------------------------------------------------------------


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


# --- expiry -----------------------------------------------------------------------------------------


async def test_an_expired_approval_denies_its_calls_with_a_reason_the_model_sees(clock: list[float]) -> None:
    svc, model, shop = service(GATED_ROUND, ANSWER, approvals=Approvals(expires_after=60))
    approval = await suspended(svc)
    assert approval.expires_at == 1_000_060.0

    clock[0] += 61
    assert await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."

    assert ("refund", ("A1", 250.0)) not in shop.ran
    denial = tool_results(model.requests[1].messages)[1]
    assert denial[0] == "c2" and "expired" in denial[1]


async def test_a_new_message_after_expiry_goes_on_whatever_the_policy(clock: list[float]) -> None:
    svc, _model, _ = service(GATED_ROUND, ["Hello."], approvals=Approvals(expires_after=60))
    await suspended(svc)
    clock[0] += 59
    with pytest.raises(ApprovalPendingError):
        await svc.chat("u1", "hello?")
    clock[0] += 2
    assert await svc.chat("u1", "hello?") == "Hello."
    assert "expired" in tool_results(await access(svc).read("u1"))[1][1]


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


# --- views, events, listeners -----------------------------------------------------------------------


async def test_a_stream_ends_with_the_approval_event_and_its_resume_is_a_stream() -> None:
    heard: list[Any] = []
    svc, _, shop = service(GATED_ROUND, ANSWER, listeners=[heard.append])
    async with await svc.chat_stream("u1", "refund") as stream:
        events = [event async for event in stream.events()]
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "Started",
        "RequestIssued",
        "TextDelta",
        "ResponseReceived",
        "ToolCallRequested",
        "ToolCallRequested",
        "ToolCallRequested",
        "ToolExecuted",
        "ToolExecuted",
        "ApprovalRequested",
    ]
    approval = events[-1]
    assert isinstance(approval, ApprovalRequested)
    assert stream.approval is approval
    result = await stream.result()
    assert result.approval is approval and result.value is None
    assert heard[-1] is approval

    resumed = await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
    assert isinstance(resumed, TokenStream)
    async with resumed:
        again = [event async for event in resumed.events()]
    assert [type(e) for e in again[:2]] == [Started, ToolExecuted]
    assert isinstance(again[-1], Completed)
    assert [e.text for e in again if isinstance(e, TextDelta)] == ["Done."]
    assert again[0].invocation_id == approval.invocation_id
    assert shop.ran.count(("refund", ("A1", 250.0))) == 1


async def test_a_buffered_stream_releases_what_it_held_before_the_approval_event() -> None:
    def passes(request: Any) -> Any:
        return agentrt.guardrails.success()

    svc, _, _ = service(GATED_ROUND, ANSWER, output_guardrails=[passes])
    async with await svc.chat_stream("u1", "refund") as stream:
        events = [event async for event in stream.events()]
    assert isinstance(events[-1], ApprovalRequested)
    assert sum(isinstance(e, ToolCallRequested) for e in events) == 3  # held, then released


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


async def test_a_listener_that_raises_on_the_approval_event_changes_nothing() -> None:
    def broken(event: Any) -> None:
        if isinstance(event, ApprovalRequested):
            raise RuntimeError("listener bug")

    svc, _, shop = service(GATED_ROUND, ANSWER, listeners=[broken])
    approval = await suspended(svc)
    assert await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."
    assert shop.ran.count(("refund", ("A1", 250.0))) == 1


# --- budgets -------------------------------------------------------------------------------------------


async def test_requests_and_tool_calls_carry_over_the_wait() -> None:
    svc, model, _ = service(GATED_ROUND, ANSWER, budget=Budget(model_requests=1))
    approval = await suspended(svc)
    with pytest.raises(BudgetExceededError) as info:
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
    assert info.value.limit == "model_requests"
    assert len(model.requests) == 1

    svc, _, _ = service(GATED_ROUND, ANSWER, budget=Budget(tool_calls=3, model_requests=2))
    approval = await suspended(svc)
    result = await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
    assert result == "Done."


async def test_time_waiting_for_a_human_is_not_spent(clock: list[float]) -> None:
    svc, _, _ = service(GATED_ROUND, ANSWER, budget=Budget(seconds=5))
    first = await svc.chat_result("u1", "refund")
    assert first.approval is not None
    await anyio.lowlevel.checkpoint()  # (the waiting itself: any length; the clock of the turn is its own)
    result = await agentrt.resume(svc, first.approval.run_id, {"c2": Approve()}, memory_id="u1")
    assert result.spent is not None and result.spent.seconds < 5


# --- a service without memory ---------------------------------------------------------------------


async def test_a_service_without_memory_keeps_its_waiting_turns_in_process() -> None:
    svc, _model, shop = service(GATED_ROUND, ANSWER, memory=False)
    approval = await suspended(svc, conversation="anything")
    with pytest.raises(ApprovalNotFoundError):  # another conversation's caller, with the run id
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="someone else")
    again, _, _ = service(ANSWER, memory=False, shop=shop)  # another build in the process: one store
    assert await agentrt.resume(again, approval.run_id, {"c2": Approve()}, memory_id="anything") == "Done."
    assert shop.ran.count(("refund", ("A1", 250.0))) == 1
    with pytest.raises(ApprovalNotFoundError):
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="anything")


# --- cancellation at each step of suspend and resume ------------------------------------------------


class CancellingStore(InMemoryStore):
    """An in-memory store that cancels the caller's scope inside one operation (once) and records
    the operations it was asked for, so a test sees what the code under test did to it."""

    def __init__(self) -> None:
        super().__init__()
        self.scope: anyio.CancelScope | None = None
        self.cancel_in: str | None = None
        self.calls: list[str] = []

    def _maybe_cancel(self, name: str) -> None:
        self.calls.append(name)
        if self.cancel_in == name and self.scope is not None:
            self.cancel_in = None
            self.scope.cancel()

    async def save_pending(self, key: str, run: str, data: bytes, *, owner: str | None = None) -> None:
        self._maybe_cancel("save_pending")
        await anyio.lowlevel.checkpoint()
        await super().save_pending(key, run, data, owner=owner)

    async def load_pending(self, key: str) -> tuple[str, bytes] | None:
        self._maybe_cancel("load_pending")
        await anyio.lowlevel.checkpoint()
        return await super().load_pending(key)

    async def take_pending(self, key: str, run: str, *, owner: str | None = None) -> bytes | None:
        self._maybe_cancel("take_pending")
        await anyio.lowlevel.checkpoint()
        return await super().take_pending(key, run, owner=owner)


async def test_cancelled_while_storing_the_waiting_turn_leaves_nothing_stored() -> None:
    store = CancellingStore()
    svc, _, shop = service(GATED_ROUND, ANSWER, store=store)
    store.cancel_in = "save_pending"
    with anyio.CancelScope() as scope:
        store.scope = scope
        await svc.chat("u1", "refund")
    assert scope.cancelled_caught
    assert store.calls == ["load_pending", "save_pending", "take_pending"]  # written, then taken back
    assert (await pending_of(svc)) is None
    assert await access(svc).read("u1") == []
    assert [name for name, _ in shop.ran] == ["lookup", "lookup"]


async def test_cancelled_while_the_others_run_stores_nothing_and_the_conversation_is_free() -> None:
    started = anyio.Event()

    class Slow(Shop):
        @tool("Look an order up.")
        async def lookup(self, order: str) -> str:  # type: ignore[override]
            started.set()
            await anyio.sleep_forever()
            return ""

    slow = Slow()
    svc, _, _ = service(GATED_ROUND, ["Hi."], shop=slow)
    async with anyio.create_task_group() as group:
        group.start_soon(svc.chat, "u1", "refund")
        await started.wait()
        group.cancel_scope.cancel()
    assert (await pending_of(svc)) is None
    assert slow.ran == []


async def test_cancelled_while_claiming_puts_the_run_back_and_nothing_ran() -> None:
    store = CancellingStore()
    svc, _, shop = service(GATED_ROUND, ANSWER, store=store)
    approval = await suspended(svc)
    store.cancel_in = "take_pending"
    with anyio.CancelScope() as scope:
        store.scope = scope
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
    assert scope.cancelled_caught
    assert store.calls[-2:] == ["take_pending", "save_pending"]  # taken, then put back
    assert ("refund", ("A1", 250.0)) not in shop.ran
    assert await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."
    assert shop.ran.count(("refund", ("A1", 250.0))) == 1


async def test_cancelled_before_the_claim_leaves_the_run_waiting() -> None:
    store = CancellingStore()
    svc, model, shop = service(GATED_ROUND, ANSWER, store=store)
    approval = await suspended(svc)
    store.cancel_in = "load_pending"
    with anyio.CancelScope() as scope:
        store.scope = scope
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1")
    assert scope.cancelled_caught
    assert "take_pending" not in store.calls[store.calls.index("load_pending", 1) :]
    assert (await pending_of(svc)) is not None and len(model.requests) == 1
    assert ("refund", ("A1", 250.0)) not in shop.ran
    assert (
        await agentrt.resume(svc, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."
    )  # not held


async def test_cancelled_while_an_approved_call_runs_it_never_runs_again() -> None:
    entered = anyio.Event()
    ran: list[str] = []

    @tool("Email.", needs_approval=True)
    async def email(text: str) -> str:
        ran.append(text)
        entered.set()
        await anyio.sleep_forever()
        return ""

    svc, _, _ = service([CallTool("email", {"text": "hi"}, id="e1")], ANSWER, tools=[email])
    approval = await suspended(svc)
    async with anyio.create_task_group() as group:

        async def resume() -> None:
            await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1")

        group.start_soon(resume)
        await entered.wait()
        group.cancel_scope.cancel()
    assert ran == ["hi"]
    with pytest.raises(ApprovalNotFoundError):  # claimed before it ran: never runs twice
        await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1")
    assert ran == ["hi"]
    assert await access(svc).read("u1") == []  # and nothing of the turn was stored


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


async def test_a_round_whose_every_call_was_denied_is_not_a_failed_round() -> None:
    svc, model, _ = service(
        [CallTool("email", {"text": "a"}, id="e1")],
        ANSWER,
        tool_settings=agentrt.ToolSettings(max_failed_rounds=1),
    )
    approval = await suspended(svc)
    # A failed round would stop the loop here (max_failed_rounds=1); a human's "no" is not a failure.
    assert await agentrt.resume(svc, approval.run_id, {"e1": Deny()}, memory_id="u1") == "Done."
    assert len(model.requests) == 2
