"""The in-memory store's own promises: a bound on conversations (least recently used out first), a
TTL for idle ones, a bound by default, and a warning when an unbounded store grows large. Its clock
is replaced by a counter the test moves, so no time passes."""

from __future__ import annotations

import logging

import pytest

import agentrt
from agentrt import AssistantMessage, ChatMessage, UserMessage
from agentrt.memory import DEFAULT_MAX_CONVERSATIONS, ChatMemory, InMemoryStore
from agentrt.memory._inmemory import LARGE


def qa(index: int) -> list[ChatMessage]:
    return [UserMessage.of(f"q{index}"), AssistantMessage(text=f"a{index}")]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_least_recently_used_conversation_is_evicted_past_the_bound() -> None:
    store = InMemoryStore(max_conversations=2)
    await store.commit("a", qa(1))
    await store.commit("b", qa(2))
    assert await store.load("a") == qa(1)  # a is now more recently used than b
    await store.commit("c", qa(3))

    assert len(store) == 2
    assert await store.load("b") == []
    assert await store.load("a") == qa(1)
    assert await store.load("c") == qa(3)


async def test_idle_conversations_expire_and_use_renews_them() -> None:
    store = InMemoryStore(ttl=10)
    clock = store._clock = Clock()  # type: ignore[assignment]
    await store.commit("kept", qa(1))
    await store.commit("idle", qa(2))

    clock.now = 8
    assert await store.load("kept") == qa(1)  # used: lives another 10 s from now
    clock.now = 15
    assert await store.load("idle") == []
    assert await store.load("kept") == qa(1)
    clock.now = 26
    assert await store.load("kept") == []


async def test_expired_conversations_are_dropped_when_others_are_written() -> None:
    store = InMemoryStore(ttl=10)
    clock = store._clock = Clock()  # type: ignore[assignment]
    for index in range(5):
        await store.commit(f"old{index}", qa(index))
    clock.now = 11
    await store.commit("new", qa(9))

    assert len(store) == 1  # the expired ones went without being touched again


async def test_a_commit_to_an_expired_conversation_starts_it_afresh() -> None:
    store = InMemoryStore(ttl=10)
    clock = store._clock = Clock()  # type: ignore[assignment]
    await store.commit("k", [*qa(1), *qa(2)])
    clock.now = 11
    await store.commit("k", qa(3), drop=2)
    assert await store.load("k") == qa(3)


async def test_the_default_store_forgets_the_least_recently_used_past_its_bound() -> None:
    """`memory.window()` without a store (and `ChatMemory()`) must not keep every conversation a
    long-running server ever saw."""
    for memory in (agentrt.memory.window(max_messages=20), ChatMemory()):
        store = memory.store
        assert isinstance(store, InMemoryStore)
        await store.commit("first", qa(0))
        for index in range(1, DEFAULT_MAX_CONVERSATIONS):
            await store.commit(f"c{index}", qa(index))
        assert await store.load("first") == qa(0)  # used again: now the most recent
        await store.commit("one more", qa(-1))

        assert len(store) == DEFAULT_MAX_CONVERSATIONS == 10_000
        assert await store.load("c1") == []  # the least recently used went first
        assert await store.load("first") == qa(0)


async def test_an_unbounded_store_warns_once_when_it_grows_large(caplog: pytest.LogCaptureFixture) -> None:
    store = InMemoryStore()
    messages = qa(0)
    with caplog.at_level(logging.WARNING, logger="agentrt.memory"):
        for index in range(LARGE):
            await store.commit(f"c{index}", messages)
        assert not caplog.records
        for index in range(LARGE, LARGE + 100):
            await store.commit(f"c{index}", messages)

    assert len(store) == LARGE + 100  # still forgets nothing: it was asked not to
    assert [r.getMessage() for r in caplog.records] == [
        f"an InMemoryStore without max_conversations or ttl holds {LARGE + 1} conversations and forgets "
        "none of them; bound it (InMemoryStore(max_conversations=..., ttl=...))"
    ]


async def test_a_bounded_or_expiring_store_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    messages = qa(0)
    with caplog.at_level(logging.WARNING, logger="agentrt.memory"):
        for store in (InMemoryStore(max_conversations=LARGE + 10), InMemoryStore(ttl=3600)):
            for index in range(LARGE + 1):
                await store.commit(f"c{index}", messages)
    assert not caplog.records
