"""Defects an outside review of chat memory found, each pinned by a test that failed before its fix.

`Gated` is an in-memory store with a shared store's lock protocol whose operations can be held "in
flight" at a gate, like a SQLite or Redis call running in a worker thread: it records the locks it
holds, so a test sees exactly what the memory did to it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import anyio
import orjson
import pytest

import agentrt
from agentrt import (
    AssistantMessage,
    ChatMessage,
    MemoryId,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    tool,
)
from agentrt._messages import message_from_json
from agentrt.memory import ChatMemory, InMemoryStore, RedisStore, SQLiteStore
from agentrt.models import ModelRequest
from agentrt.testing import CallTool, FunctionModel, ScriptedModel
from agentrt.tools import ToolSettings

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


def echo(request: ModelRequest) -> str:
    last = request.messages[-1]
    assert isinstance(last, UserMessage)
    return f"{last.text}#{len(request.messages) - 1}"


# --- a native asyncio cancellation while a store operation is in flight --------------------------
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


# --- answers with tool calls that never ran -----------------------------------------------------


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


# --- a failed unlock after the commit ------------------------------------------------------------


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


# --- stores checked at build --------------------------------------------------------------------


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


# --- wait= on a shared store --------------------------------------------------------------------


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


# --- what access writes accept ------------------------------------------------------------------


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


# --- lease lengths ------------------------------------------------------------------------------


@pytest.mark.parametrize("lease", [True, float("nan"), float("inf"), 1e-9, 0, -1, "30"])
def test_a_lease_length_that_cannot_work_is_a_configuration_error(lease: Any, tmp_path: Any) -> None:
    with pytest.raises(agentrt.ConfigurationError, match="lease_seconds must be a finite number"):
        SQLiteStore(tmp_path / "chat.db", lease_seconds=lease)
    with pytest.raises(agentrt.ConfigurationError, match="lease_seconds must be a finite number"):
        RedisStore("redis://127.0.0.1:1/0", lease_seconds=lease)


# --- a second review ----------------------------------------------------------------------------


async def test_an_answer_of_stray_calls_only_is_stored_as_an_empty_text() -> None:
    model = ScriptedModel([CallTool("missing", {}, id="c1")], "next")
    svc = agentrt.build(Chat, model=model, memory=InMemoryStore())

    assert await svc.chat("c", "q") == ""
    await svc.chat("c", "again")

    # Neither text nor calls would be a message providers reject (OpenAI: content null, no calls).
    assert model.requests[1].messages[1] == AssistantMessage(text="")


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


def test_bytes_that_are_not_utf8_are_a_json_error_as_before() -> None:
    with pytest.raises(orjson.JSONDecodeError):
        message_from_json(b'{"role": "user", "contents": [\xff]}')
