"""Windows over random histories (hypothesis): never a tool result without its call, never a call
without its results, within the limits, and as long as the limits allow.

The window function is pure (no event loop); the store test runs on asyncio and trio. The same
properties hold for what a store keeps after commits: trimming turn by turn keeps exactly
the window of the whole history.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt import AssistantMessage, ChatMessage, ToolCall, ToolResultMessage, UserMessage
from agentrt.memory import ChatMemory, InMemoryStore, estimate_tokens
from agentrt.memory._memory import Memory
from agentrt.memory._window import window_start


@st.composite
def turns(draw: st.DrawFn) -> list[ChatMessage]:
    """One turn: the user, zero to three tool rounds (a call message and its results), an answer
    (or, for a turn whose tool results were the answer, none)."""
    number = draw(st.integers(0, 10**6))
    messages: list[ChatMessage] = [UserMessage.of(draw(st.text(max_size=40)) or f"u{number}")]
    for round_ in range(draw(st.integers(0, 3))):
        calls = tuple(
            ToolCall(id=f"c{number}-{round_}-{index}", name="t", arguments="{}")
            for index in range(draw(st.integers(1, 3)))
        )
        messages.append(AssistantMessage(text=draw(st.none() | st.text(max_size=20)), tool_calls=calls))
        messages.extend(ToolResultMessage(tool_call_id=c.id, tool_name="t", text="r" * 10) for c in calls)
    if len(messages) == 1 or draw(st.booleans()):
        messages.append(AssistantMessage(text=draw(st.text(max_size=60))))
    return messages


histories = st.lists(turns(), max_size=12)
limits = st.tuples(st.none() | st.integers(1, 30), st.none() | st.integers(1, 400))


def check_window(
    messages: list[ChatMessage], start: int, max_messages: int | None, max_tokens: int | None
) -> None:
    kept = messages[start:]
    # Within the limits.
    if max_messages is not None:
        assert len(kept) <= max_messages
    if max_tokens is not None:
        assert sum(estimate_tokens(m) for m in kept) <= max_tokens
    # Never a result without its call, never a call without its results.
    calls: dict[str, bool] = {}
    for message in kept:
        if isinstance(message, AssistantMessage):
            calls.update((call.id, False) for call in message.tool_calls)
        elif isinstance(message, ToolResultMessage):
            assert message.tool_call_id in calls, "a tool result without its call"
            calls[message.tool_call_id] = True
    assert all(calls.values()), "a tool call without its result"
    assert not kept or not isinstance(kept[0], ToolResultMessage)
    # As long as the limits allow: every longer suffix breaks a limit or starts with a tool result.
    for earlier in range(start):
        suffix = messages[earlier:]
        too_long = max_messages is not None and len(suffix) > max_messages
        too_big = max_tokens is not None and sum(estimate_tokens(m) for m in suffix) > max_tokens
        assert too_long or too_big or isinstance(suffix[0], ToolResultMessage)


@given(histories, limits)
@settings(max_examples=300, deadline=None)
def test_the_window_of_any_history_keeps_whole_tool_exchanges(
    history: list[list[ChatMessage]], limit: tuple[int | None, int | None]
) -> None:
    messages = [m for t in history for m in t]
    max_messages, max_tokens = limit
    start = window_start(messages, max_messages, max_tokens, estimate_tokens)
    check_window(messages, start, max_messages, max_tokens)


@given(histories, limits)
@settings(max_examples=150, deadline=None)
async def test_a_store_trimmed_turn_by_turn_keeps_the_window_of_the_whole_history(
    history: list[list[ChatMessage]], limit: tuple[int | None, int | None]
) -> None:
    max_messages, max_tokens = limit
    memory = Memory(ChatMemory(InMemoryStore(), max_messages=max_messages, max_tokens=max_tokens), "test")

    whole: list[ChatMessage] = []
    for messages in history:
        conversation = await memory.open("c", "test")
        sent = conversation.history()
        check_window(conversation.stored, len(conversation.stored) - len(sent), max_messages, max_tokens)
        await conversation.commit(messages)
        conversation.release_local()
        whole.extend(messages)
        stored = await memory.store.load(memory.key("c", "test"))
        assert stored == whole[window_start(whole, max_messages, max_tokens, estimate_tokens) :]
