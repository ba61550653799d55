"""The in-memory store's own promises: a bound on conversations (least recently used out first) and
a TTL for idle ones. Its clock is replaced by a counter the test moves, so no time passes."""

from __future__ import annotations

from agentrt import AssistantMessage, ChatMessage, UserMessage
from agentrt.memory import InMemoryStore


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
