"""Windows: how much of a conversation is sent to the model, and kept in its store.

A window keeps the newest messages: at most `max_messages`, at most `max_tokens` (by a token counter,
an estimate by default), or both. Whatever the limits cut, the kept part starts with a user message:
it keeps whole turns from the oldest user message that fits, so a provider never sees a conversation
that opens with the assistant (Anthropic refuses it) or a tool result without its call (a 400 on
every later request otherwise). A window therefore keeps fewer messages than its limit rather than
half a turn, and none of a turn larger than the limit. The system message is not part of a
conversation: it is rendered for each turn and never stored, so no window drops it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from .._messages import AssistantMessage, ChatMessage, TextContent, ToolResultMessage, UserMessage

__all__ = ["TokenCounter", "estimate_message_tokens", "window_start"]

TokenCounter = Callable[[ChatMessage], int]
"""Counts the tokens of one message (for `max_tokens` windows)."""

_PER_MESSAGE: Final = 4  # role and framing tokens of one message, as chat formats spend them
_PER_ATTACHMENT: Final = 256  # an image, audio or document part, when nothing better is known


def estimate_message_tokens(message: ChatMessage) -> int:
    """About four characters a token, plus the framing of a message; a flat cost per attachment.

    An estimate: pass a real tokenizer's count as `counter` when the window must be exact.
    """
    chars = 0
    if isinstance(message, UserMessage):
        for content in message.contents:
            if isinstance(content, TextContent):
                chars += len(content.text)
            else:
                chars += 4 * _PER_ATTACHMENT
    elif isinstance(message, AssistantMessage):
        chars += len(message.text or "") + len(message.thinking or "") + len(message.refusal or "")
        for call in message.tool_calls:
            chars += len(call.name) + len(call.arguments) + len(call.id)
    elif isinstance(message, ToolResultMessage):
        chars += len(message.text) + 4 * _PER_ATTACHMENT * len(message.images)  # images a tool returned
    else:
        chars += len(message.text)
    return _PER_MESSAGE + (chars + 3) // 4


def window_start(
    messages: Sequence[ChatMessage],
    max_messages: int | None,
    max_tokens: int | None,
    counter: TokenCounter,
) -> int:
    """The index of the first message the window keeps: a user message, or `len(messages)` when it
    keeps none. With both limits `None`, the first user message."""
    end = len(messages)
    start = 0
    if max_messages is not None and end > max_messages:
        start = end - max_messages
    if max_tokens is not None:
        total = 0
        index = end
        while index > start:
            total += counter(messages[index - 1])
            if total > max_tokens:
                break
            index -= 1
        start = index
    # Only whole turns: never open with the answer, the calls or the results of a turn cut in two.
    while start < end and not isinstance(messages[start], UserMessage):
        start += 1
    return start
