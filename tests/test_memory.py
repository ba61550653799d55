"""Chat memory through services: what is sent, what is stored, and when nothing is.

The store is read back after each scenario, and the requests the model received are compared with it,
so these tests fail if a turn were stored partly, stored on failure, stored with format instructions
(`test_a_turn_is_stored_without_the_format_instructions_the_model_was_sent`),
or if turns on one conversation interleaved.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
import pytest
from pydantic import BaseModel

import agentrt
from agentrt import (
    AssistantMessage,
    Budget,
    ChatMessage,
    MemoryId,
    ModelRequest,
    SystemMessage,
    TokenStream,
    ToolCall,
    ToolResultMessage,
    ToolSettings,
    UserMessage,
    system_message,
    tool,
    user_message,
)
from agentrt.memory import ChatMemory, InMemoryStore, SQLiteStore
from agentrt.memory._memory import Memory
from agentrt.testing import CallTool, FunctionModel, Hang, Raise, ScriptedModel


@system_message("You are a concierge for {{guest}}.")
class Concierge:
    async def chat(self, conversation: Annotated[str, MemoryId], guest: str, question: str) -> str: ...

    async def stream(
        self, conversation: Annotated[str, MemoryId], guest: str, question: str
    ) -> TokenStream: ...

    @user_message("{{question}}")
    async def plain(self, guest: str, question: str) -> str: ...


class Other:
    async def chat(self, conversation: Annotated[Any, MemoryId], question: str) -> str: ...


def echo(request: ModelRequest) -> str:
    """Answers with the user text it was asked and how many messages of history came with it."""
    last = request.messages[-1]
    assert isinstance(last, UserMessage)
    history = [m for m in request.messages[:-1] if not isinstance(m, SystemMessage)]
    return f"{last.text}#{len(history)}"


def turn(question: str, answer: str) -> list[ChatMessage]:
    return [UserMessage.of(question), AssistantMessage(text=answer)]


async def test_a_second_turn_sees_the_first() -> None:
    model = ScriptedModel("Hello Ada.", "Your name is Ada.")
    svc = agentrt.build(Concierge, model=model, memory=agentrt.memory.window())

    await svc.chat("c1", "Ada", "My name is Ada.")
    answer = await svc.chat("c1", "Ada", "What is my name?")

    assert answer == "Your name is Ada."
    assert model.requests[1].messages == (
        SystemMessage(text="You are a concierge for Ada."),
        *turn("My name is Ada.", "Hello Ada."),
        UserMessage.of("What is my name?"),
    )
    # The system message is rendered per turn, never stored.
    assert await agentrt.memory.access(svc).read("c1") == [
        *turn("My name is Ada.", "Hello Ada."),
        *turn("What is my name?", "Your name is Ada."),
    ]


async def test_without_memory_nothing_is_remembered() -> None:
    model = ScriptedModel("one", "two")
    svc = agentrt.build(Concierge, model=model)

    await svc.chat("c1", "Ada", "first")
    await svc.chat("c1", "Ada", "second")

    assert model.requests[1].messages == (
        SystemMessage(text="You are a concierge for Ada."),
        UserMessage.of("second"),
    )
    with pytest.raises(agentrt.ConfigurationError, match="without memory="):
        agentrt.memory.access(svc)


async def test_the_system_message_is_rendered_each_turn_not_stored() -> None:
    model = FunctionModel(echo)
    svc = agentrt.build(Concierge, model=model, memory=agentrt.memory.window())

    await svc.chat("c1", "Ada", "hi")
    await svc.chat("c1", "Grace", "hi again")

    assert model.requests[1].messages[0] == SystemMessage(text="You are a concierge for Grace.")
    assert not any(isinstance(m, SystemMessage) for m in await agentrt.memory.access(svc).read("c1"))


async def test_conversations_are_per_memory_id_and_methods_without_one_share_the_default() -> None:
    model = FunctionModel(echo)
    svc = agentrt.build(Concierge, model=model, memory=agentrt.memory.window())
    access = agentrt.memory.access(svc)

    assert await svc.chat("a", "Ada", "a1") == "a1#0"
    assert await svc.chat("b", "Ada", "b1") == "b1#0"
    assert await svc.chat("a", "Ada", "a2") == "a2#2"
    assert await svc.plain("Ada", "p1") == "p1#0"
    assert await svc.plain("Ada", "p2") == "p2#2"

    assert await access.read("a") == [*turn("a1", "a1#0"), *turn("a2", "a2#2")]
    assert await access.read("b") == turn("b1", "b1#0")
    assert await access.read() == [*turn("p1", "p1#0"), *turn("p2", "p2#2")]
    assert await access.read(agentrt.memory.DEFAULT_MEMORY_ID) == await access.read()


async def test_ids_of_different_types_name_different_conversations() -> None:
    model = FunctionModel(echo)
    svc = agentrt.build(Other, model=model, memory=agentrt.memory.window())

    assert await svc.chat("1", "as text") == "as text#0"
    assert await svc.chat(1, "as number") == "as number#0"
    assert await svc.chat(("tenant", 7), "as tuple") == "as tuple#0"
    assert await svc.chat(("tenant", 7), "again") == "again#2"


@pytest.mark.parametrize(
    ("memory_id", "match"),
    [
        (None, "is None"),
        (["unhashable"], "hashable"),
        (object(), "JSON"),
        (float("nan"), "cannot name a conversation"),
        (("tenant", float("inf")), "cannot name a conversation"),  # ("tenant", None)'s, as JSON
    ],
    ids=["none", "list", "object", "nan", "inf in a tuple"],
)
async def test_a_bad_memory_id_is_a_type_error_naming_the_method(memory_id: Any, match: str) -> None:
    model = FunctionModel(echo)
    svc = agentrt.build(Other, model=model, memory=agentrt.memory.window())

    with pytest.raises(TypeError, match=match) as caught:
        await svc.chat(memory_id, "hi")
    assert "Other.chat" in str(caught.value)
    assert model.requests == []


async def test_a_none_memory_id_is_an_error_without_memory_too() -> None:
    svc = agentrt.build(Other, model=FunctionModel(echo))
    with pytest.raises(TypeError, match=r"Other\.chat\(\): the memory id 'conversation' is None"):
        await svc.chat(None, "hi")


async def test_services_do_not_share_conversations_unless_they_name_a_namespace() -> None:
    store = InMemoryStore()
    model = FunctionModel(echo)
    first = agentrt.build(Other, model=model, memory=ChatMemory(store))
    second = agentrt.build(Concierge, model=model, memory=ChatMemory(store))

    await first.chat("c", "one")
    assert await second.chat("c", "Ada", "two") == "two#0"

    shared_a = agentrt.build(Other, model=model, memory=ChatMemory(store, namespace="support"))
    shared_b = agentrt.build(Concierge, model=model, memory=ChatMemory(store, namespace="support"))
    await shared_a.chat("c", "three")
    assert await shared_b.chat("c", "Ada", "four") == "four#2"
    assert agentrt.memory.access(shared_a).namespace == "support"
    assert agentrt.memory.access(first).namespace == f"{__name__}.Other"


def _as_script(cls: type) -> type:
    """`cls` as if its module were run as a script (`python app.py`): a class of `__main__`."""
    return type(cls.__name__, (cls,), {"__module__": "__main__", "__qualname__": cls.__qualname__})


async def test_a_class_of_main_on_a_lasting_store_warns_that_its_conversations_are_its_own(
    tmp_path: Path,
) -> None:
    """Run as a script, a class names other conversations than the same class imported (by a
    worker, by a test): on a store that outlives the process, build() says so."""
    store = agentrt.memory.SQLiteStore(tmp_path / "chat.db")
    model = FunctionModel(echo)
    with pytest.warns(
        UserWarning, match=r"Other is defined in __main__.*'__main__\.Other'.*namespace="
    ) as seen:
        script = agentrt.build(_as_script(Other), model=model, memory=agentrt.memory.window(store=store))
    assert seen[0].filename == __file__  # points at the build() call
    imported = agentrt.build(Other, model=model, memory=agentrt.memory.window(store=store))
    await script.chat("c", "one")
    assert await imported.chat("c", "two") == "two#0"  # what the warning is about

    # Named, they share the conversation, and nothing warns (warnings are errors in this suite).
    memory = agentrt.memory.window(store=store, namespace="support")
    named_script = agentrt.build(_as_script(Other), model=model, memory=memory)
    named_imported = agentrt.build(Other, model=model, memory=memory)
    await named_script.chat("c", "three")
    assert await named_imported.chat("c", "four") == "four#2"
    # Conversations that end with the process have nothing to diverge from.
    agentrt.build(_as_script(Other), model=model, memory=agentrt.memory.window())
    store.close()


async def test_a_bare_store_keeps_whole_conversations() -> None:
    store = InMemoryStore()
    svc = agentrt.build(Other, model=FunctionModel(echo), memory=store)
    for index in range(30):
        await svc.chat("c", f"q{index}")
    assert len(await agentrt.memory.access(svc).read("c")) == 60


@pytest.mark.parametrize(
    "memory",
    ["a store", 3, ChatMemory],
    ids=["string", "int", "class"],
)
def test_memory_of_the_wrong_kind_is_a_configuration_error(memory: Any) -> None:
    with pytest.raises(agentrt.ConfigurationError, match="memory must be"):
        agentrt.build(Other, model=FunctionModel(echo), memory=memory)


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"store": object()}, "not a ChatMemoryStore"),
        ({"max_messages": 0}, "max_messages"),
        ({"max_tokens": True}, "max_tokens"),
        ({"namespace": ""}, "namespace"),
        ({"wait": -1}, "wait"),
        ({"wait": float("inf")}, "wait"),
        ({"counter": 3}, "counter"),
    ],
)
def test_bad_memory_settings_are_configuration_errors(arguments: dict[str, Any], match: str) -> None:
    with pytest.raises(agentrt.ConfigurationError, match=match):
        ChatMemory(**arguments)


def test_bad_in_memory_store_settings_are_value_errors() -> None:
    with pytest.raises(ValueError, match="max_conversations"):
        InMemoryStore(max_conversations=0)
    with pytest.raises(ValueError, match="ttl"):
        InMemoryStore(ttl=-1)


# --- what a turn stores ------------------------------------------------------------------------


class Shop:
    @tool("The status of an order.")
    async def order_status(self, order_id: str) -> str:
        return f"{order_id}: shipped"

    @tool("Fails.")
    async def broken(self) -> str:
        raise RuntimeError("the warehouse is down")


class Room(BaseModel):
    number: int


class Booking:
    async def room(self, conversation: Annotated[str, MemoryId], question: str) -> Room: ...


@pytest.mark.parametrize("mode", ["instructions", "schema"])
async def test_a_turn_is_stored_without_the_format_instructions_the_model_was_sent(mode: str) -> None:
    model = ScriptedModel('{"number": 12}', '{"number": 14}')
    svc = agentrt.build(Booking, model=model, memory=agentrt.memory.window(), output_mode=mode)

    assert await svc.room("c", "Which room?") == Room(number=12)
    assert await svc.room("c", "And now?") == Room(number=14)

    sent = model.requests[0].messages[-1]
    assert isinstance(sent, UserMessage)
    if mode == "instructions":  # (a schema goes in the request instead)
        assert sent.text.startswith("Which room?") and sent.text != "Which room?"
    stored = await agentrt.memory.access(svc).read("c")
    assert stored == [
        UserMessage.of("Which room?"),
        AssistantMessage(text='{"number": 12}'),
        UserMessage.of("And now?"),
        AssistantMessage(text='{"number": 14}'),
    ]
    # The second turn's history is what was stored, not what the first request carried.
    assert model.requests[1].messages[:2] == tuple(stored[:2])


async def test_a_turn_stores_its_tool_exchange_in_order() -> None:
    model = ScriptedModel(
        [CallTool("order_status", {"order_id": "SO-1"}, id="c1")],
        "It shipped.",
        "You asked about SO-1.",
    )
    svc = agentrt.build(Other, model=model, tools=[Shop()], memory=agentrt.memory.window())

    await svc.chat("c", "Where is SO-1?")
    await svc.chat("c", "What did I ask?")

    stored = await agentrt.memory.access(svc).read("c")
    assert [type(m) for m in stored] == [
        UserMessage,
        AssistantMessage,
        ToolResultMessage,
        AssistantMessage,
        UserMessage,
        AssistantMessage,
    ]
    assert stored[1].tool_calls[0].id == "c1"  # type: ignore[union-attr]
    assert stored[2] == ToolResultMessage(tool_call_id="c1", tool_name="order_status", text="SO-1: shipped")
    # The second request carried the first turn exactly as stored.
    assert list(model.requests[2].messages[:-1]) == stored[:4]


# --- nothing is stored on failure -------------------------------------------------------------

PRIOR = turn("before", "prior answer")


async def _seeded(**build: Any) -> tuple[Other, agentrt.memory.MemoryAccess]:
    svc = agentrt.build(Other, memory=agentrt.memory.window(), **build)
    access = agentrt.memory.access(svc)
    await access.replace("c", PRIOR)
    return svc, access


async def _next_turn_proceeds(svc: Other, model: ScriptedModel | FunctionModel) -> None:
    """The lock was released: a following turn on the conversation runs and sees only PRIOR."""
    with anyio.fail_after(5):
        await svc.chat("c", "after")
    history = [m for m in model.requests[-1].messages[:-1] if not isinstance(m, SystemMessage)]
    assert history == PRIOR


FAILURES: dict[str, tuple[list[Any], dict[str, Any], type[BaseException]]] = {
    "model error": ([[Raise(agentrt.ServerError("boom", status=500))]], {}, agentrt.ServerError),
    "model error mid-stream": (
        [["partial ", Raise(agentrt.ModelConnectionError("reset"))]],
        {},
        agentrt.ModelConnectionError,
    ),
    "tool error with on_error=raise": (
        [[CallTool("broken", {}, id="c1")]],
        {"tools": [Shop()], "tool_settings": ToolSettings(on_error="raise")},
        agentrt.ToolExecutionError,
    ),
    "tool loop limit": (
        [[CallTool("order_status", {"order_id": "1"})], [CallTool("order_status", {"order_id": "2"})]],
        {"tools": [Shop()], "tool_settings": ToolSettings(max_rounds=1, on_limit="raise")},
        agentrt.ToolLoopLimitError,
    ),
    "output tokens budget": (
        [["far too long " * 50]],
        {"budget": Budget(output_tokens=5)},
        agentrt.BudgetExceededError,
    ),
    "model requests budget": (
        [[CallTool("order_status", {"order_id": "1"})], "done"],
        {"tools": [Shop()], "budget": Budget(model_requests=1)},
        agentrt.BudgetExceededError,
    ),
    "tool calls budget": (
        [[CallTool("order_status", {"order_id": "1"}), CallTool("order_status", {"order_id": "2"})]],
        {"tools": [Shop()], "budget": Budget(tool_calls=1)},
        agentrt.BudgetExceededError,
    ),
}


@pytest.mark.parametrize("case", list(FAILURES))
async def test_a_failed_turn_leaves_the_conversation_as_it_was(case: str) -> None:
    script, build, error = FAILURES[case]
    model = ScriptedModel(*script, "after answer")
    svc, access = await _seeded(model=model, **build)

    with pytest.raises(error):
        await svc.chat("c", "this fails")

    assert await access.read("c") == PRIOR
    await _next_turn_proceeds(svc, model)


class Count(BaseModel):
    count: int


class Typed:
    async def number(self, conversation: Annotated[str, MemoryId], question: str) -> Count: ...

    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


async def test_a_parse_failure_leaves_the_conversation_as_it_was() -> None:
    model = ScriptedModel("not a number", "still not one", "after answer")  # the answer and its repair
    svc = agentrt.build(Typed, model=model, memory=agentrt.memory.window())
    access = agentrt.memory.access(svc)
    await access.replace("c", PRIOR)

    with pytest.raises(agentrt.OutputParsingError):
        await svc.number("c", "how many?")

    assert await access.read("c") == PRIOR
    await _next_turn_proceeds(svc, model)  # type: ignore[arg-type]


@pytest.mark.virtual_clock
async def test_a_time_budget_stop_leaves_the_conversation_as_it_was() -> None:
    model = ScriptedModel(["partial ", Hang()], "after answer")
    svc, access = await _seeded(model=model, budget=Budget(seconds=2))

    with anyio.fail_after(10), pytest.raises(agentrt.BudgetExceededError) as caught:
        await svc.chat("c", "this hangs")

    assert caught.value.limit == "seconds"
    assert await access.read("c") == PRIOR
    await _next_turn_proceeds(svc, model)


# Where a cancellation can land in a turn: waiting for the model, in mid-stream, in a tool.
class Gate:
    def __init__(self) -> None:
        self.entered = anyio.Event()

    @tool("Waits forever.")
    async def wait(self) -> str:
        self.entered.set()
        await anyio.sleep_forever()
        return "never"


@pytest.mark.parametrize("where", ["first chunk", "mid-stream", "tool"])
async def test_a_cancelled_turn_leaves_the_conversation_as_it_was(where: str) -> None:
    gate = Gate()
    scripts: dict[str, Any] = {
        "first chunk": [Hang()],
        "mid-stream": ["partial ", Hang()],
        "tool": [CallTool("wait", {})],
    }
    model = ScriptedModel(scripts[where], "after answer")
    svc, access = await _seeded(model=model, tools=[gate])

    async with anyio.create_task_group() as group:
        group.start_soon(svc.chat, "c", "cancelled")
        with anyio.fail_after(5):
            if where == "tool":
                await gate.entered.wait()
            await anyio.wait_all_tasks_blocked()
        assert len(model.streams) == 1
        group.cancel_scope.cancel()

    assert model.streams[0].ended
    assert await access.read("c") == PRIOR
    await _next_turn_proceeds(svc, model)


# --- serialization ------------------------------------------------------------------------------


def _turns_are_whole(stored: list[ChatMessage]) -> list[str]:
    """The questions of the stored turns, checking each is [user q, assistant 'q#h'] in one piece
    and that each turn saw exactly the turns before it (h = twice its position)."""
    assert len(stored) % 2 == 0
    questions = []
    for index in range(0, len(stored), 2):
        user, answer = stored[index], stored[index + 1]
        assert isinstance(user, UserMessage)
        assert isinstance(answer, AssistantMessage)
        assert answer.text == f"{user.text}#{index}"
        questions.append(user.text)
    return questions


async def test_concurrent_awaited_turns_on_one_id_run_one_after_another() -> None:
    rng = random.Random(3)

    async def interleaving(request: ModelRequest) -> str:
        for _ in range(rng.randrange(3)):  # let other turns run between this one's load and commit
            await anyio.lowlevel.checkpoint()
        return echo(request)

    model = FunctionModel(interleaving)
    svc = agentrt.build(Other, model=model, memory=agentrt.memory.window())

    async with anyio.create_task_group() as group:
        for index in range(1000):
            group.start_soon(svc.chat, "c", f"q{index}")

    stored = await agentrt.memory.access(svc).read("c")
    assert sorted(_turns_are_whole(stored)) == sorted(f"q{index}" for index in range(1000))


class Barrier:
    """Lets the model answer only once `parties` requests are in flight at the same time."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.all_in = anyio.Event()

    async def __call__(self, request: ModelRequest) -> str:
        self.arrived += 1
        if self.arrived == self.parties:
            self.all_in.set()
        await self.all_in.wait()
        return echo(request)


async def test_turns_on_different_ids_do_not_wait_for_each_other() -> None:
    barrier = Barrier(50)
    svc = agentrt.build(Other, model=FunctionModel(barrier), memory=agentrt.memory.window())

    with anyio.fail_after(5):  # with turns serialized across ids, the barrier would never open
        async with anyio.create_task_group() as group:
            for index in range(50):
                group.start_soon(svc.chat, f"id{index}", "hi")

    assert barrier.arrived == 50


async def test_turns_on_one_id_wait_for_each_other() -> None:
    barrier = Barrier(2)
    svc = agentrt.build(Other, model=FunctionModel(barrier), memory=agentrt.memory.window(wait=0.5))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(svc.chat, "same", "first")
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(agentrt.ConversationBusyError) as caught:
                await svc.chat("same", "second")
            barrier.all_in.set()

    assert caught.value.memory_id == "same"
    assert barrier.arrived == 1
    assert _turns_are_whole(await agentrt.memory.access(svc).read("same")) == ["first"]


@pytest.mark.virtual_clock
async def test_waiting_for_the_conversation_counts_against_the_time_budget() -> None:
    release = anyio.Event()

    async def slow(request: ModelRequest) -> str:
        await release.wait()
        return echo(request)

    model = FunctionModel(slow)
    svc = agentrt.build(Other, model=model, memory=agentrt.memory.window())

    async with anyio.create_task_group() as group:
        group.start_soon(svc.chat, "c", "holder")
        await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(60), pytest.raises(agentrt.BudgetExceededError) as caught:
            with agentrt.call_options(budget=Budget(seconds=3)):
                await svc.chat("c", "waiter")
        release.set()

    assert caught.value.limit == "seconds"
    assert len(model.requests) == 1  # the waiter never reached the model
    assert _turns_are_whole(await agentrt.memory.access(svc).read("c")) == ["holder"]


async def test_streams_half_cancelled_at_random_points_leave_whole_turns_only() -> None:
    rng = random.Random(7)
    completed: list[str] = []

    class Streams:
        async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

    async def chars(request: ModelRequest) -> list[str]:
        for _ in range(rng.randrange(3)):  # let other turns run between this one's load and commit
            await anyio.lowlevel.checkpoint()
        return list(echo(request))

    streams = agentrt.build(
        Streams,
        model=FunctionModel(chars),
        memory=ChatMemory(agentrt.memory.InMemoryStore(), namespace="s"),
    )

    async def one(index: int) -> None:
        question = f"q{index}"
        stop_after = rng.randrange(1, 4) if index % 2 else None
        if stop_after is None:
            text = "".join([token async for token in await streams.stream("c", question)])
            completed.append(question)
            assert text.startswith(f"{question}#")
            return
        with anyio.CancelScope() as scope:
            read = 0
            async with await streams.stream("c", question) as tokens:
                async for _ in tokens:
                    read += 1
                    if read == stop_after:
                        scope.cancel()
                        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as group:
        for index in range(200):
            group.start_soon(one, index)

    stored = await agentrt.memory.access(streams).read("c")
    assert sorted(_turns_are_whole(stored)) == sorted(completed)
    assert len(completed) == 100


async def test_an_abandoned_stream_releases_its_conversation() -> None:
    model = ScriptedModel(["one ", "two ", Hang()], "second turn")
    svc = agentrt.build(Concierge, model=model, memory=agentrt.memory.window())

    async def read_one() -> None:
        async for token in await svc.stream("c", "Ada", "hi"):
            assert token == "one "
            break

    # Nothing holds the stream: it warns, and its finalizer closes it from another task.
    with pytest.warns(ResourceWarning, match=r"^Concierge\.stream: a stream was collected"):
        await read_one()

    with anyio.fail_after(5):
        assert await svc.chat("c", "Ada", "next") == "second turn"
    assert await agentrt.memory.access(svc).read("c") == turn("next", "second turn")


async def test_a_stream_dropped_without_reading_releases_its_conversation() -> None:
    model = ScriptedModel(["one ", "two ", Hang()], "second turn")
    svc = agentrt.build(Concierge, model=model, memory=agentrt.memory.window())
    stream = await svc.stream("c", "Ada", "hi")
    assert await stream.__anext__() == "one "
    holder = [stream]
    del stream

    def drop() -> None:
        holder.pop()
        gc.collect()

    with pytest.warns(ResourceWarning, match=r"^Concierge\.stream: a stream was collected"):
        await anyio.to_thread.run_sync(drop)  # collected in a worker thread: closed in its own loop

    with anyio.fail_after(5):
        assert await svc.chat("c", "Ada", "next") == "second turn"


async def test_a_stream_releases_its_conversation_at_completed_not_at_close() -> None:
    model = ScriptedModel(["Hel", "lo"], "again")
    svc = agentrt.build(Concierge, model=model, memory=agentrt.memory.window())
    stream = await svc.stream("c", "Ada", "hi")
    async for event in stream.events():
        if isinstance(event, agentrt.Completed):
            break  # the stream is held, not closed: its reader may never close it

    assert await agentrt.memory.access(svc).read("c") == turn("hi", "Hello")
    with anyio.fail_after(5):
        assert await svc.chat("c", "Ada", "next") == "again"
    await stream.aclose()


# --- access ------------------------------------------------------------------------------------


async def test_access_reads_replaces_clears_and_evicts() -> None:
    store = InMemoryStore()
    model = FunctionModel(echo)
    svc = agentrt.build(Other, model=model, memory=ChatMemory(store))
    access = agentrt.memory.access(svc)

    await svc.chat("c", "one")
    summary = turn("summary please", "We talked about one thing.")
    await access.replace("c", summary)
    assert await svc.chat("c", "two") == "two#2"
    assert list(model.requests[-1].messages[:-1]) == summary

    await access.clear("c")
    assert await access.read("c") == []
    assert len(store) == 1  # cleared, still there

    await svc.chat("c", "three")
    await access.evict("c")
    assert await access.read("c") == []
    assert len(store) == 0


async def test_access_refuses_histories_a_provider_would_reject() -> None:
    access = agentrt.memory.access(agentrt.build(Other, model=FunctionModel(echo), memory=InMemoryStore()))
    with pytest.raises(ValueError, match="system message"):
        await access.replace("c", [SystemMessage(text="no")])
    with pytest.raises(ValueError, match="did not make"):
        await access.replace("c", [ToolResultMessage(tool_call_id="x", tool_name="t", text="orphan")])
    with pytest.raises(ValueError, match="starts with a user message"):  # Anthropic refuses it
        await access.replace("c", [AssistantMessage(text="Summary: ..."), UserMessage.of("go on")])
    with pytest.raises(TypeError, match="is None"):
        await access.read(None)
    assert await access.read("c") == []


async def test_access_writes_wait_for_the_running_turn() -> None:
    release = anyio.Event()

    async def slow(request: ModelRequest) -> str:
        await release.wait()
        return echo(request)

    svc = agentrt.build(Other, model=FunctionModel(slow), memory=agentrt.memory.window())
    access = agentrt.memory.access(svc)
    order: list[str] = []

    async def clear() -> None:
        await access.clear("c")
        order.append("cleared")

    async def chat() -> None:
        await svc.chat("c", "running")
        order.append("turn")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(chat)
            await anyio.wait_all_tasks_blocked()
            group.start_soon(clear)
            await anyio.wait_all_tasks_blocked()
            assert order == []
            release.set()

    assert order == ["turn", "cleared"]
    assert await access.read("c") == []


def test_access_of_something_else_is_a_configuration_error() -> None:
    with pytest.raises(agentrt.ConfigurationError, match="not a service"):
        agentrt.memory.access(object())


# --- the lock's queue and the store's failures ------------------------------------------------


async def test_a_waiter_cancelled_in_the_queue_does_not_keep_the_lock_from_the_next() -> None:
    release = anyio.Event()

    async def slow(request: ModelRequest) -> str:
        if "holder" in str(request.messages[-1]):
            await release.wait()
        return echo(request)

    svc = agentrt.build(Other, model=FunctionModel(slow), memory=agentrt.memory.window())

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(svc.chat, "c", "holder")
            await anyio.wait_all_tasks_blocked()
            cancelled = anyio.CancelScope()
            group.start_soon(_chat_in, cancelled, svc, "cancelled")
            await anyio.wait_all_tasks_blocked()
            group.start_soon(svc.chat, "c", "next")
            await anyio.wait_all_tasks_blocked()
            cancelled.cancel()
            await anyio.wait_all_tasks_blocked()
            release.set()

    assert _turns_are_whole(await agentrt.memory.access(svc).read("c")) == ["holder", "next"]


async def _chat_in(scope: anyio.CancelScope, svc: Other, question: str) -> None:
    with scope:
        await svc.chat("c", question)


class FlakyStore(InMemoryStore):
    """An in-memory store whose load or commit can be made to raise, or to hang."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_load: BaseException | None = None
        self.fail_commit: BaseException | None = None
        self.hang_load = False
        self.loading = anyio.Event()

    async def load(self, key: str) -> list[ChatMessage]:
        self.loading.set()
        if self.hang_load:
            await anyio.sleep_forever()
        if self.fail_load is not None:
            raise self.fail_load
        return await super().load(key)

    async def commit(self, key: str, messages: Any, *, drop: int = 0, owner: str | None = None) -> None:
        if self.fail_commit is not None:
            raise self.fail_commit
        await super().commit(key, messages, drop=drop, owner=owner)


@pytest.mark.parametrize("where", ["load", "commit"])
async def test_a_store_error_reaches_the_caller_and_releases_the_conversation(where: str) -> None:
    store = FlakyStore()
    model = ScriptedModel("not stored", "after answer")
    svc = agentrt.build(Other, model=model, memory=ChatMemory(store))
    access = agentrt.memory.access(svc)
    await access.replace("c", PRIOR)
    setattr(store, f"fail_{where}", OSError(f"disk full in {where}"))

    with pytest.raises(OSError, match=f"disk full in {where}"):
        await svc.chat("c", "fails")

    setattr(store, f"fail_{where}", None)
    assert await access.read("c") == PRIOR
    await _next_turn_proceeds(svc, model)


async def test_a_turn_cancelled_while_its_store_loads_releases_the_conversation() -> None:
    store = FlakyStore()
    model = ScriptedModel("after answer")
    svc = agentrt.build(Other, model=model, memory=ChatMemory(store))
    await agentrt.memory.access(svc).replace("c", PRIOR)
    store.hang_load = True

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(svc.chat, "c", "cancelled")
            await store.loading.wait()
            group.cancel_scope.cancel()

    store.hang_load = False
    assert model.requests == []
    await _next_turn_proceeds(svc, model)


async def test_a_waiter_cancelled_just_after_it_was_handed_the_lock_passes_it_on() -> None:
    memory = Memory(ChatMemory(InMemoryStore()), "test")
    holder = await memory.open("c", "test")
    scope = anyio.CancelScope()

    async def waiter() -> None:
        with scope:
            conversation = await memory.open("c", "test")
            conversation.release_local()  # the wake-up won over the cancellation (trio): give it back

    async with anyio.create_task_group() as group:
        group.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        scope.cancel()  # the waiter is cancelled, and before it runs again...
        holder.release_local()  # ...the lock is handed to it
    with anyio.fail_after(5):
        (await memory.open("c", "test")).release_local()
    assert memory.locks.table() == {}


# --- a store with a shared store's lock protocol, held in flight ----------------------------------
# `Gated` is an in-memory store with a shared store's lock protocol whose operations can be held "in
# flight" at a gate, like a SQLite or Redis call running in a worker thread: it records the locks it
# holds, so a test sees exactly what the memory did to it. `Chat` and `KEY` are the service these
# sections build and the store key of its conversation "c".


_T = TypeVar("_T")


class Gated(InMemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.locks: dict[str, str] = {}
        self.gates: dict[str, threading.Event] = {}
        self.entered: dict[str, anyio.Event] = {}
        self.fail_unlock: BaseException | None = None

    def hold(self, operation: str) -> threading.Event:
        """Hold `operation` at a gate until the returned event is set."""
        self.gates[operation] = threading.Event()
        self.entered[operation] = anyio.Event()
        return self.gates[operation]

    async def _in_thread(self, operation: str, work: Callable[[], _T]) -> _T:
        """Run `work` in a worker thread, as SQLite and Redis stores do: a caller cancelled meanwhile
        does not stop it. With a gate, the thread waits there first."""
        gate, entered = self.gates.get(operation), self.entered.get(operation)

        def run() -> _T:
            if gate is not None and entered is not None:
                anyio.from_thread.run_sync(entered.set)
                gate.wait()
            return work()

        return await anyio.to_thread.run_sync(run)

    async def try_lock(self, key: str, owner: str) -> bool:
        def take() -> bool:
            if key in self.locks:
                return False
            self.locks[key] = owner
            return True

        return await self._in_thread("try_lock", take)

    async def unlock(self, key: str, owner: str) -> None:
        if self.fail_unlock is not None:
            raise self.fail_unlock
        if self.locks.get(key) == owner:
            del self.locks[key]

    async def commit(self, key: str, messages: Any, *, drop: int = 0, owner: str | None = None) -> None:
        def write() -> None:
            if owner is not None and self.locks.get(key) != owner:
                raise agentrt.ConversationLockLostError(f"{key} is not {owner}'s")
            stored = self._get(key)
            self._put(key, (*stored[drop:], *messages))

        await self._in_thread("commit", write)


class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


KEY = f'{Chat.__module__}.Chat:"c"'
"""The store key of conversation "c" of `Chat` services."""


# --- the conversation lock under a native asyncio cancellation ----------------------------------------------


# asyncio only by nature: trio has no cancellation outside its cancel scopes, which anyio's shield covers.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_native_cancellation_while_the_lock_is_taken_gives_the_lock_back() -> None:
    store = Gated()
    gate = store.hold("try_lock")
    svc = agentrt.build(Chat, model=FunctionModel(echo), memory=ChatMemory(store))

    call = asyncio.ensure_future(svc.chat("c", "cancelled"))
    with anyio.fail_after(5):
        await store.entered["try_lock"].wait()
    call.cancel()  # as asyncio.wait_for / asyncio.timeout do
    await anyio.wait_all_tasks_blocked()
    gate.set()  # the attempt in flight takes the lock after all

    with pytest.raises(asyncio.CancelledError):
        await call
    assert store.locks == {}
    del store.gates["try_lock"]
    with anyio.fail_after(5):
        assert await svc.chat("c", "next") == "next#0"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_native_cancellation_during_the_commit_lets_the_write_finish_first() -> None:
    store = Gated()
    gate = store.hold("commit")
    svc = agentrt.build(Chat, model=FunctionModel(echo), memory=ChatMemory(store))

    call = asyncio.ensure_future(svc.chat("c", "first"))
    with anyio.fail_after(5):
        await store.entered["commit"].wait()
    call.cancel()
    await anyio.wait_all_tasks_blocked()
    assert len(store.locks) == 1  # still held while the write runs
    gate.set()

    with pytest.raises(asyncio.CancelledError):
        await call
    # The write was in flight: it finished, under the lock, and the cancellation came after it.
    stored = await agentrt.memory.access(svc).read("c")
    assert stored == [UserMessage.of("first"), AssistantMessage(text="first#0")]
    assert store.locks == {}
    del store.gates["commit"]
    with anyio.fail_after(5):
        assert await svc.chat("c", "second") == "second#2"


# --- answers with tool calls that never ran are stored without them -----------------------------------------


class Lookup:
    @tool("Look something up.")
    async def lookup(self, query: str) -> str:
        return f"found {query}"


async def test_an_answer_with_calls_of_tools_the_service_lacks_is_stored_without_them() -> None:
    model = ScriptedModel(["The answer.", CallTool("missing", {}, id="c1")], "next answer")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())

    assert await svc.chat("c", "q") == "The answer."
    await svc.chat("c", "next")

    answer = AssistantMessage(text="The answer.")
    assert await agentrt.memory.access(svc).read("c") == [
        UserMessage.of("q"),
        answer,
        UserMessage.of("next"),
        AssistantMessage(text="next answer"),
    ]
    assert model.requests[1].messages[1] == answer


async def test_a_final_answer_with_stray_calls_is_stored_without_them() -> None:
    model = ScriptedModel(
        [CallTool("lookup", {"query": "a"}, id="c1")],
        [CallTool("lookup", {"query": "b"}, id="c2")],  # past max_rounds: not run; asked to answer
        ["Enough.", CallTool("lookup", {"query": "c"}, id="c3")],  # an answer, with a stray call
    )
    settings = ToolSettings(max_rounds=1, on_limit="final_answer")
    svc = agentrt.build(Chat, model=model, tools=[Lookup()], tool_settings=settings, memory=InMemoryStore())

    assert await svc.chat("c", "q") == "Enough."

    stored = await agentrt.memory.access(svc).read("c")
    assert stored[-1] == AssistantMessage(text="Enough.")
    assert [m.tool_call_id for m in stored if isinstance(m, ToolResultMessage)] == ["c1"]


async def test_an_answer_of_stray_calls_only_is_stored_as_an_empty_text() -> None:
    model = ScriptedModel([CallTool("missing", {}, id="c1")], "next")
    svc = agentrt.build(Chat, model=model, memory=InMemoryStore())

    assert await svc.chat("c", "q") == ""
    await svc.chat("c", "again")

    # Neither text nor calls would be a message providers reject (OpenAI: content null, no calls).
    assert model.requests[1].messages[1] == AssistantMessage(text="")


# --- a failed unlock after the commit -----------------------------------------------------------------------


async def test_an_unlock_that_fails_after_the_commit_does_not_fail_the_stored_turn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Gated()
    svc = agentrt.build(Chat, model=FunctionModel(echo), memory=ChatMemory(store))
    store.fail_unlock = ConnectionError("the store went away")

    with caplog.at_level(logging.WARNING, logger="agentrt.memory"):
        assert await svc.chat("c", "stored") == "stored#0"

    assert await store.load(KEY) == [
        UserMessage.of("stored"),
        AssistantMessage(text="stored#0"),
    ]
    assert "expires with its lease" in caplog.text


# --- stores that cannot work are refused at build -----------------------------------------------------------


class SyncStore:
    def load(self, key: str) -> list[ChatMessage]:
        return []

    def commit(self, key: str, messages: Any, *, drop: int = 0, owner: str | None = None) -> None: ...

    def replace(self, key: str, messages: Any, *, owner: str | None = None) -> None: ...

    def delete(self, key: str, *, owner: str | None = None) -> None: ...


class SyncLock(Gated):
    def try_lock(self, key: str, owner: str) -> bool:  # type: ignore[override]
        return True


@pytest.mark.parametrize(
    ("store", "match"),
    [
        (InMemoryStore, "is a class: pass an instance, e.g. InMemoryStore()"),
        (SQLiteStore, "is a class"),
        (SyncStore(), "load must be an async method"),
        (SyncLock(), "try_lock must be an async method"),
    ],
    ids=["class", "shared class", "sync methods", "sync lock"],
)
def test_a_store_that_cannot_work_is_a_configuration_error_at_build(store: Any, match: str) -> None:
    with pytest.raises(agentrt.ConfigurationError, match=match):
        agentrt.build(Chat, model=FunctionModel(echo), memory=store)
    with pytest.raises(agentrt.ConfigurationError, match=match):
        ChatMemory(store)


# --- wait= bounds the whole wait for a shared lock ----------------------------------------------------------


@pytest.mark.virtual_clock
@pytest.mark.parametrize("wait", [0.05, 0.2, 1.0])
async def test_wait_bounds_the_whole_wait_for_a_shared_lock(wait: float) -> None:
    store = Gated()
    store.locks[KEY] = "another process"
    svc = agentrt.build(Chat, model=FunctionModel(echo), memory=ChatMemory(store, wait=wait))

    async with anyio.create_task_group() as group:
        # A second turn of this process waits for the first in the process's own queue: its wait
        # and the first's lease polling share one limit.
        started = anyio.current_time()
        ended: list[float] = []

        async def turn() -> None:
            with pytest.raises(agentrt.ConversationBusyError):
                await svc.chat("c", "waits")
            ended.append(anyio.current_time() - started)

        group.start_soon(turn)
        group.start_soon(turn)

    assert len(ended) == 2
    assert all(wait <= elapsed <= wait + 0.001 for elapsed in ended), ended


# --- what access writes accept ------------------------------------------------------------------------------


CALL = AssistantMessage(tool_calls=(ToolCall(id="c1", name="t"),))


RESULT = ToolResultMessage(tool_call_id="c1", tool_name="t", text="r")


@pytest.mark.parametrize(
    ("history", "match"),
    [
        ([UserMessage.of("q"), CALL], "of the last message have no result"),
        ([UserMessage.of("q"), CALL, UserMessage.of("between"), RESULT], "have no result before message 2"),
        ([UserMessage.of("q"), CALL, RESULT, RESULT], "answered already"),
        ([UserMessage.of("q"), RESULT], "did not make"),
    ],
    ids=["unanswered call", "result after another message", "two results", "orphan result"],
)
async def test_access_refuses_tool_exchanges_a_provider_rejects(
    history: list[ChatMessage], match: str
) -> None:
    access = agentrt.memory.access(agentrt.build(Chat, model=FunctionModel(echo), memory=InMemoryStore()))
    with pytest.raises(ValueError, match=match) as caught:
        await access.replace("c", history)
    assert str(caught.value).startswith("agentrt.memory.access(Chat).replace: ")
    await access.replace("c", [UserMessage.of("q"), CALL, RESULT, AssistantMessage(text="a")])


async def test_a_conversation_with_repeated_call_ids_reads_back_into_replace() -> None:
    # Some OpenAI-compatible servers give parallel calls the same id; both run, both results stored.
    model = ScriptedModel(
        [CallTool("lookup", {"query": "a"}, id="x"), CallTool("lookup", {"query": "b"}, id="x")], "done"
    )
    svc = agentrt.build(Chat, model=model, tools=[Lookup()], memory=InMemoryStore())
    await svc.chat("c", "q")
    access = agentrt.memory.access(svc)
    stored = await access.read("c")
    assert [m.tool_call_id for m in stored if isinstance(m, ToolResultMessage)] == ["x", "x"]

    await access.replace("c", stored)
    assert await access.read("c") == stored
    with pytest.raises(ValueError, match="answered already"):
        await access.replace("c", [*stored[:-1], stored[-2], stored[-1]])
