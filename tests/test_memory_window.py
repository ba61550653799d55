"""Windows over random histories (hypothesis): whole turns only (what is kept starts with a user
message, so no provider sees a conversation that opens with the assistant, and never a tool result
without its call or a call without its results), within the limits, and as long as the limits allow.

The window function is pure (no event loop); the store test runs on asyncio and trio. The same
properties hold for what a store keeps after commits: trimming turn by turn keeps exactly
the window of the whole history.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentrt
from agentrt import (
    AssistantMessage,
    ChatMessage,
    MemoryId,
    ModelRequest,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    system_message,
    tool,
)
from agentrt.memory import ChatMemory, InMemoryStore, estimate_message_tokens
from agentrt.memory._memory import Memory
from agentrt.memory._window import window_start
from agentrt.models import AnthropicChatModel, RetryPolicy
from agentrt.testing import CallTool, FunctionModel, Script


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
        assert sum(estimate_message_tokens(m) for m in kept) <= max_tokens
    # Never a result without its call, never a call without its results.
    calls: dict[str, bool] = {}
    for message in kept:
        if isinstance(message, AssistantMessage):
            calls.update((call.id, False) for call in message.tool_calls)
        elif isinstance(message, ToolResultMessage):
            assert message.tool_call_id in calls, "a tool result without its call"
            calls[message.tool_call_id] = True
    assert all(calls.values()), "a tool call without its result"
    assert not kept or isinstance(kept[0], UserMessage), "a window that opens with the assistant"
    # As long as the limits allow: every longer suffix breaks a limit or does not start a turn.
    for earlier in range(start):
        suffix = messages[earlier:]
        too_long = max_messages is not None and len(suffix) > max_messages
        too_big = max_tokens is not None and sum(estimate_message_tokens(m) for m in suffix) > max_tokens
        assert too_long or too_big or not isinstance(suffix[0], UserMessage)


@given(histories, limits)
@settings(max_examples=300, deadline=None)
def test_the_window_of_any_history_keeps_whole_tool_exchanges(
    history: list[list[ChatMessage]], limit: tuple[int | None, int | None]
) -> None:
    messages = [m for t in history for m in t]
    max_messages, max_tokens = limit
    start = window_start(messages, max_messages, max_tokens, estimate_message_tokens)
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
        assert stored == whole[window_start(whole, max_messages, max_tokens, estimate_message_tokens) :]


# --- what a provider is sent ----------------------------------------------------------------------


@system_message("You are terse.")
class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


class Lookup:
    @tool("Look a word up.")
    async def look_up(self, word: str) -> str:
        return word.upper()


def _anthropic_answer(text: str) -> bytes:
    """A streamed Anthropic Messages answer of one text block."""
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": []}
    payloads: list[dict[str, Any]] = [
        {"type": "message_start", "message": {**message, "usage": {"input_tokens": 5}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
        {"type": "message_stop"},
    ]
    return b"".join(
        b"event: " + p["type"].encode() + b"\ndata: " + orjson.dumps(p) + b"\n\n" for p in payloads
    )


@pytest.mark.parametrize("limit", [{"max_messages": 3}, {"max_tokens": 20}], ids=["messages", "tokens"])
async def test_anthropic_requests_open_with_the_user_after_the_window_cut_a_turn(
    limit: dict[str, int],
) -> None:
    """The reported case: a window of three messages made every request from the third turn on open
    with the assistant's earlier answer, which Anthropic refuses."""
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(orjson.loads(request.content))
        body = _anthropic_answer(f"answer {len(bodies)}")
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = AnthropicChatModel(
            "claude-test", client=client, api_key="sk-ant-test", retry=RetryPolicy.never()
        )
        svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(**limit))
        for number in range(1, 5):
            assert await svc.chat("c", f"question {number}") == f"answer {number}"

    assert [body["messages"][0]["role"] for body in bodies] == ["user"] * 4
    assert [body["system"] for body in bodies] == ["You are terse."] * 4
    # Whole turns: the last request carries the previous turn and the new question.
    assert [m["role"] for m in bodies[-1]["messages"]] == ["user", "assistant", "user"]
    assert "answer 3" in orjson.dumps(bodies[-1]["messages"][1]).decode()


def _answering(plan: list[int]) -> Callable[[ModelRequest], Script]:
    """A model that, on the n-th question, calls `look_up` `plan[n]` times (one round each) first."""

    def answer(request: ModelRequest) -> Script:
        question = next(m for m in reversed(request.messages) if isinstance(m, UserMessage))
        number = int(question.text.split()[-1])
        rounds = sum(
            1
            for m in request.messages[request.messages.index(question) :]
            if isinstance(m, AssistantMessage) and m.tool_calls
        )
        if rounds < plan[number]:
            return [CallTool("look_up", {"word": f"w{number}-{rounds}"}, id=f"c{number}-{rounds}")]
        return f"answer {number}"

    return answer


@given(st.lists(st.integers(0, 3), min_size=1, max_size=8), limits)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
async def test_every_request_opens_with_the_system_message_then_a_user_message(
    plan: list[int], limit: tuple[int | None, int | None]
) -> None:
    max_messages, max_tokens = limit
    model = FunctionModel(_answering(plan))
    memory = agentrt.memory.window(max_messages=max_messages, max_tokens=max_tokens)
    svc = agentrt.build(Chat, model=model, tools=[Lookup()], memory=memory)
    for number in range(len(plan)):
        await svc.chat("c", f"question {number}")

    for request in model.requests:
        first, second, *_ = request.messages
        assert first == SystemMessage(text="You are terse.")
        assert isinstance(second, UserMessage)
        check_window(list(request.messages[1:]), 0, None, None)  # whole tool exchanges


async def test_a_stored_conversation_that_opens_with_the_assistant_is_sent_from_its_first_user_message() -> (
    None
):
    """A conversation stored before windows kept whole turns may open with an answer: it is sent
    from its first user message, or every request on it would be refused."""
    store = InMemoryStore()
    model = FunctionModel(lambda request: "fine")
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(store=store, max_messages=3))
    key = f"{Chat.__module__}.{Chat.__qualname__}:" + orjson.dumps("c").decode()
    await store.replace(
        key, [AssistantMessage(text="old answer"), UserMessage.of("q"), AssistantMessage(text="a")]
    )

    await svc.chat("c", "next")

    assert [m.role for m in model.requests[0].messages] == ["system", "user", "assistant", "user"]
    assert await agentrt.memory.access(svc).read("c") == [
        UserMessage.of("next"),
        AssistantMessage(text="fine"),
    ]
