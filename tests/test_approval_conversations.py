"""Where a turn waiting for approval is found, and what it keeps (issue 26): the memory id it waits
under, of any type the method takes (text, int, tuple, UUID) and only as that type; another build
of the same class on the same store (a new process), or in the same process without memory; any
text of the model's; and nothing once its conversation is evicted. The feature's own tests are in
test_approval.py, across real processes in test_approval_processes.py.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import pytest
from test_approval import ANSWER, GATED_ROUND, pending_of, service, suspended, tool_results

import agentrt
from agentrt import ApprovalDecisionError, ApprovalNotFoundError, Approve, MemoryId, tool
from agentrt.memory import InMemoryStore, access
from agentrt.testing import CallTool

pytestmark = pytest.mark.anyio


# --- memory ids -----------------------------------------------------------------------------------


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


# --- another build of the same class (a new process) ----------------------------------------------


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


async def test_without_memory_another_build_in_the_same_process_resumes_the_run() -> None:
    first, _, _ = service(GATED_ROUND, memory=False)
    approval = await suspended(first)
    second, _, shop = service(ANSWER, memory=False)
    assert await agentrt.resume(second, approval.run_id, {"c2": Approve()}, memory_id="u1") == "Done."
    assert shop.ran == [("refund", ("A1", 250.0))]


# --- what the waiting turn keeps, and what eviction removes ---------------------------------------


async def test_text_with_a_lone_surrogate_before_a_gated_call_suspends_and_resumes() -> None:
    # (the model's text only: arguments with a lone surrogate do not validate, and fail closed)
    svc, _, shop = service(["Let me look \ud800.", CallTool("email", {"text": "hi"}, id="e1")], ANSWER)
    approval = await suspended(svc)
    assert approval.calls[0].arguments == {"text": "hi"}
    assert await agentrt.resume(svc, approval.run_id, {"e1": Approve()}, memory_id="u1") == "Done."
    assert shop.ran == [("email", "hi")]
    assert (await access(svc).read("u1"))[1].text == "Let me look \ud800."


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
