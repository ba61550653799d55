"""The shared store suite: every store (in-memory, SQLite, Redis) keeps the same promises.

Each test runs on the three stores and on asyncio and trio. A store is read back through a second
instance where the store can have one (the same file, the same server), so what is asserted is what
was written, not what one object remembers.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
import pytest
from tasks import in_another_task

import agentrt
from agentrt import (
    AssistantMessage,
    Budget,
    ChatMessage,
    ImageContent,
    MemoryId,
    ModelRequest,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from agentrt.memory import (
    ChatMemory,
    ChatMemoryStore,
    InMemoryStore,
    RedisStore,
    SharedChatMemoryStore,
    SQLiteStore,
)
from agentrt.memory._memory import Memory
from agentrt.memory._store import TURNS_REMEMBERED
from agentrt.testing import FunctionModel

Factory = Callable[[], ChatMemoryStore]
"""Makes another store on the same data (another process's view, for shared stores)."""

STORES = ["memory", "sqlite", "redis"]


@pytest.fixture(params=STORES)
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Factory]:
    kind = request.param
    made: list[Any] = []
    if kind == "memory":
        single = InMemoryStore()

        def factory() -> ChatMemoryStore:
            return single

    elif kind == "sqlite":
        path = tmp_path / "chat.db"

        def factory() -> ChatMemoryStore:
            store = SQLiteStore(path, lease_seconds=5)
            made.append(store)
            return store

    else:
        url = request.getfixturevalue("redis_url")
        prefix = f"test-{uuid.uuid4().hex}:"

        def factory() -> ChatMemoryStore:
            store = RedisStore(url, prefix=prefix, lease_seconds=5)
            made.append(store)
            return store

    yield factory
    for store in made:
        await store.aclose()


RICH: list[ChatMessage] = [
    UserMessage(
        contents=(
            TextContent(text='What is on this picture? ü ✓ \u0000 "quoted"'),
            ImageContent(url="https://example.com/cat.png", detail="low"),
        ),
        name="ada",
    ),
    AssistantMessage(
        text=None,
        thinking="Look it up first.",
        thinking_signature="sig==",
        tool_calls=(
            ToolCall(id="c1", name="lookup", arguments='{"q": "cat"}'),
            ToolCall(id="c2", name="lookup", arguments="{}"),
        ),
    ),
    ToolResultMessage(tool_call_id="c1", tool_name="lookup", text="a cat"),
    ToolResultMessage(tool_call_id="c2", tool_name="lookup", text="boom", is_error=True),
    AssistantMessage(text="A cat.", refusal=None),
    UserMessage.of("and now?"),
    AssistantMessage(refusal="I can't help with that."),
]


def qa(index: int) -> list[ChatMessage]:
    return [UserMessage.of(f"q{index}"), AssistantMessage(text=f"a{index}")]


async def test_a_conversation_never_written_is_empty(stores: Factory) -> None:
    assert await stores().load("nobody") == []


async def test_every_field_of_every_message_survives(stores: Factory) -> None:
    await stores().commit("k", RICH)
    loaded = await stores().load("k")
    assert loaded == RICH
    assert [type(m) for m in loaded] == [type(m) for m in RICH]


async def test_commits_append_in_order(stores: Factory) -> None:
    store = stores()
    await store.commit("k", qa(1))
    await store.commit("k", qa(2))
    assert await stores().load("k") == [*qa(1), *qa(2)]


async def test_a_commit_drops_the_oldest_and_appends_in_one_write(stores: Factory) -> None:
    store = stores()
    await store.commit("k", [*qa(1), *qa(2)])
    await store.commit("k", qa(3), drop=2)
    assert await stores().load("k") == [*qa(2), *qa(3)]
    await store.commit("k", [], drop=10)
    assert await stores().load("k") == []


async def test_conversations_are_independent(stores: Factory) -> None:
    store = stores()
    await store.commit("a", qa(1))
    await store.commit("b", qa(2))
    await store.delete("a")
    assert await stores().load("a") == []
    assert await stores().load("b") == qa(2)


async def test_replace_and_delete(stores: Factory) -> None:
    store = stores()
    await store.commit("k", [*qa(1), *qa(2)])
    await store.replace("k", qa(9))
    assert await stores().load("k") == qa(9)
    await store.replace("k", [])
    assert await stores().load("k") == []
    await store.delete("k")
    await store.delete("k")  # a missing conversation is not an error
    assert await stores().load("k") == []


async def test_keys_are_taken_literally(stores: Factory) -> None:
    store = stores()
    keys = ['ns:"a"', "ns:1", "ns:[1, 2]", "ns:*", "ns:%", "ns:ü"]
    for index, key in enumerate(keys):
        await store.commit(key, qa(index))
    for index, key in enumerate(keys):
        assert await stores().load(key) == qa(index)


# --- commits by turn id (durable turns) ----------------------------------------------------------


async def test_a_commit_with_a_turn_id_is_made_once(stores: Factory) -> None:
    # A durable turn's commit step run again after a crash between the store's write and the step's
    # record: the second write of the same turn changes nothing (drop included).
    store = stores()
    await store.commit("k", qa(0))
    await store.commit("k", qa(1), turn="t1")
    await stores().commit("k", qa(1), drop=2, turn="t1")  # another process's view, too
    assert await stores().load("k") == [*qa(0), *qa(1)]
    await store.commit("k", qa(2), drop=2, turn="t2")
    assert await stores().load("k") == [*qa(1), *qa(2)]
    # Ids are per conversation; a commit without one is never skipped.
    await store.commit("other", qa(1), turn="t1")
    await store.commit("k", qa(3))
    await store.commit("k", qa(3))
    assert await stores().load("other") == qa(1)
    assert await stores().load("k") == [*qa(1), *qa(2), *qa(3), *qa(3)]


async def test_a_store_remembers_the_last_turn_ids_of_a_conversation(stores: Factory) -> None:
    store = stores()
    for index in range(TURNS_REMEMBERED):
        await store.commit("k", [], turn=f"t{index}")
    await store.commit("k", qa(0), turn="t0")  # remembered: skipped
    assert await stores().load("k") == []
    await store.commit("k", [], turn="newest")  # t0 is now the one too many
    await store.commit("k", qa(1), turn="t1")  # still remembered
    await store.commit("k", qa(0), turn="t0")
    assert await stores().load("k") == qa(0)


async def test_a_deleted_conversation_forgets_its_turn_ids(stores: Factory) -> None:
    store = stores()
    await store.commit("k", qa(1), turn="t1")
    await store.replace("k", qa(2))  # replaced, the conversation still remembers
    await store.commit("k", qa(1), turn="t1")
    assert await stores().load("k") == qa(2)
    await store.delete("k")
    await store.commit("k", qa(1), turn="t1")
    assert await stores().load("k") == qa(1)


async def test_a_turn_committed_once_is_skipped_even_by_a_holder_that_lost_the_lock(
    stores: Factory,
) -> None:
    # The recovered commit of a turn another worker stored (then died holding the lock): nothing
    # to write, so no lock to check. A turn not stored yet still needs the lock.
    # (A store of one process has no lock: it ignores owners.)
    store = stores()
    shared = isinstance(store, SharedChatMemoryStore)
    if shared:
        assert await store.try_lock("k", "dead")
    try:
        await store.commit("k", qa(1), owner="dead", turn="t1")
        await stores().commit("k", qa(1), owner="zombie", turn="t1")
        assert await stores().load("k") == qa(1)
        if shared:
            with pytest.raises(agentrt.ConversationLockLostError):
                await stores().commit("k", qa(2), owner="zombie", turn="t2")
            assert await stores().load("k") == qa(1)
    finally:
        if shared:
            await store.unlock("k", "dead")


# --- through a service ---------------------------------------------------------------------------


class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


def counting(request: ModelRequest) -> str:
    last = request.messages[-1]
    assert isinstance(last, UserMessage)
    return f"{last.text}#{len(request.messages) - 1}"


async def test_a_service_remembers_through_the_store(stores: Factory) -> None:
    svc = agentrt.build(Chat, model=FunctionModel(counting), memory=ChatMemory(stores(), max_messages=4))

    assert await svc.chat("c", "one") == "one#0"
    assert await svc.chat("c", "two") == "two#2"
    assert await svc.chat("c", "three") == "three#4"
    assert await svc.chat("c", "four") == "four#4"  # the window keeps four messages

    stored = await stores().load(f"{__name__}.Chat:" + '"c"')
    assert [m.text for m in stored if isinstance(m, UserMessage)] == ["three", "four"]


async def test_turns_on_one_conversation_are_serialized_across_store_instances(stores: Factory) -> None:
    # Two services on two instances of one store: for shared stores, two processes' views, which
    # only the store's own lock serializes.
    memory_a = ChatMemory(stores(), namespace="shared")
    memory_b = ChatMemory(stores(), namespace="shared")

    async def slow(request: ModelRequest) -> str:
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        return counting(request)

    a = agentrt.build(Chat, model=FunctionModel(slow), memory=memory_a)
    b = agentrt.build(Chat, model=FunctionModel(slow), memory=memory_b)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            for index in range(20):
                group.start_soon((a if index % 2 else b).chat, "c", f"q{index}")

    stored = await agentrt.memory.access(a).read("c")
    assert len(stored) == 40
    for position in range(0, 40, 2):
        user, answer = stored[position], stored[position + 1]
        assert isinstance(user, UserMessage)
        assert isinstance(answer, AssistantMessage)
        assert answer.text == f"{user.text}#{position}"  # each turn saw every turn before it


async def test_a_conversation_held_elsewhere_makes_a_turn_wait_within_its_limits(stores: Factory) -> None:
    # Held through another instance of the store: for shared stores, another process's turn.
    held = Memory(ChatMemory(stores(), namespace="held"), "holder")
    holder = await in_another_task(lambda: held.open("c", "holder"))
    try:
        model = FunctionModel(counting)
        busy = agentrt.build(Chat, model=model, memory=ChatMemory(stores(), namespace="held", wait=0.2))
        with anyio.fail_after(10), pytest.raises(agentrt.ConversationBusyError) as caught:
            await busy.chat("c", "waits")
        assert caught.value.memory_id == "c"

        budgeted = agentrt.build(
            Chat, model=model, memory=ChatMemory(stores(), namespace="held"), budget=Budget(seconds=0.3)
        )
        with anyio.fail_after(10), pytest.raises(agentrt.BudgetExceededError) as exceeded:
            await budgeted.chat("c", "waits")
        assert exceeded.value.limit == "seconds"
        assert model.requests == []
    finally:
        with anyio.CancelScope(shield=True):
            await holder.release()

    with anyio.fail_after(10):
        assert await budgeted.chat("c", "now") == "now#0"


async def test_text_with_a_lone_surrogate_survives(stores: Factory) -> None:
    # A model's JSON may escape half a surrogate pair ("\ud800"): not UTF-8, still the model's text.
    odd: list[ChatMessage] = [UserMessage.of("a\ud800b"), AssistantMessage(text="\udfff", thinking="x\ud83d")]
    await stores().commit("k", odd)
    assert await stores().load("k") == odd
