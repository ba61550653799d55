"""Releasing a guarded stream's text before the whole answer passed (`chunked` and `optimistic`).

`Released` is what a reader has of the current response since the last `Reset`: the text and the
thinking. A `chunked` stream checks the answer so far at each chunk's end (`check`) and releases what
passed; an `optimistic` one shows everything as it comes. Either way, when what the reader has is not
the start of the accepted answer (the chain asked again, a guardrail rewrote released text, or the
response turned out to call tools), a `Reset` withdraws it.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Final

from .._events import Reset, ResetReason, TextDelta, ThinkingDelta
from . import _finish

if TYPE_CHECKING:
    from .._events import Event
    from .._messages import AssistantMessage
    from ..guardrails._declare import OutputChain
    from ..models._protocol import ResponseAccumulator
    from ._turn import Turn

__all__ = ["MAY_END", "Mode", "Release", "Released", "check"]

# A chunk ends with a text delta that ends a sentence or a line (a number's "3." ends one too: a
# chunk boundary is only where a check runs), in Latin or CJK punctuation.
_ENDS: Final = frozenset(".!?\n\u2026\u3002\uff01\uff1f")
_SPACE: Final = frozenset(" \t\r\n")
MAY_END: Final = _ENDS | _SPACE
"""The last characters of a text delta that may end a sentence (a gate before `crossed`)."""


class Mode(enum.Enum):
    """How the text of a turn's current answer reaches a stream's reader."""

    PLAIN = "plain"
    """As it comes (no output guardrails; and every awaited call, whose reader gets the value)."""
    HOLD = "buffer"
    """Held until the chain passed the answer, then released with its events."""
    CHUNKED = "chunked"
    """Released chunk by chunk, each once the chain passed the answer so far."""
    OPTIMISTIC = "optimistic"
    """Released at once; withdrawn with a `Reset` when the chain refuses it."""


# Members read as constants: on 3.11 a class attribute of an enum goes through `EnumType.__getattr__`.
_PLAIN: Final = Mode.PLAIN
_HOLD: Final = Mode.HOLD
_CHUNKED: Final = Mode.CHUNKED
_OPTIMISTIC: Final = Mode.OPTIMISTIC


class Release:
    """The release state of one turn: its mode, what the reader has (`released`, for `chunked` and
    `optimistic`), and the response and tool events held with the text (`pending`, while held).

    Part of the turn's data: a checkpoint saves it."""

    __slots__ = ("mode", "pending", "released", "streams")

    def __init__(self, policy: str, streams: bool, every: int | None) -> None:
        self.streams = streams
        self.mode = Mode(policy) if policy != "plain" else _PLAIN
        mode = self.mode
        self.released = Released(every) if mode is _CHUNKED or mode is _OPTIMISTIC else None
        self.pending: list[Event] | None = [] if mode is _HOLD or mode is _CHUNKED else None

    def again(self) -> None:
        """The answer was asked for again: the next one is replayed stream-to-sync (held until it
        passed), unless the policy shows answers at once and withdraws them (`optimistic`)."""
        mode = self.mode
        if mode is _CHUNKED:
            self.mode = _HOLD
        elif mode is _PLAIN and self.streams:
            self.mode = _HOLD
            self.pending = []


class Released:
    """What the reader has of the current response, and (for `chunked`) where its next chunk starts."""

    __slots__ = ("every", "size", "text", "text_at", "thinking", "thought_at")

    def __init__(self, every: int | None) -> None:
        self.every = every
        """Characters per chunk; `None`: sentences and lines."""
        self.text = ""
        self.thinking = ""
        self.text_at = 0  # text deltas of the response checked so far
        self.thought_at = 0  # thinking deltas of the response released so far
        self.size = 0  # characters since the last check (with `every`)

    def restart(self) -> None:
        """A new response streams (what was released of the last one was withdrawn or accepted)."""
        self.text = self.thinking = ""
        self.text_at = self.thought_at = self.size = 0

    def saw(self, message: AssistantMessage) -> None:
        """An optimistic stream showed all of `message`."""
        self.text = message.text or ""
        self.thinking = message.thinking or ""

    def crossed(self, text: str) -> bool:
        """Whether a text delta ends a chunk (per token: keep it cheap)."""
        every = self.every
        if every is not None:
            self.size += len(text)
            return self.size >= every
        last = text[-1:]
        if last in _ENDS:
            return True
        return last in _SPACE and ("\n" in text or text.rstrip()[-1:] in _ENDS)

    def withdraw(
        self, invocation_id: str, reason: ResetReason, attempt: int, shown: AssistantMessage | None
    ) -> Reset | None:
        """The `Reset` that withdraws what the reader has of the response (all of `shown`, for an
        optimistic stream), if it has anything; the next response starts afresh."""
        if shown is not None:
            self.saw(shown)
        had = self.text or self.thinking
        self.restart()
        return Reset(invocation_id, reason, attempt) if had else None

    def release(self, invocation_id: str, attempt: int, text: str, thought: str) -> list[Event]:
        """The events that bring the reader to `text` (the answer so far, accepted) and `thought`
        more thinking: the rest of the text, or, when what it has is not the start of `text`, a
        `Reset` and everything again."""
        events: list[Event] = []
        have = self.text
        if text.startswith(have):
            if thought:
                events.append(ThinkingDelta(thought))
            tail = text[len(have) :]
        else:
            events.append(Reset(invocation_id, ResetReason.REWRITTEN, attempt))
            if self.thinking or thought:
                events.append(ThinkingDelta(self.thinking + thought))
            tail = text
        if tail:
            events.append(TextDelta(tail))
        self.text = text
        self.thinking += thought
        return events


async def check(
    turn: Turn, chain: OutputChain, accumulator: ResponseAccumulator, released: Released, attempt: int
) -> tuple[_finish.Outcome, list[Event]]:
    """Check the answer so far (a `chunked` stream at a chunk's end): the chain's outcome, and when it
    passed, the events that release the chunk (with the thinking that came before it)."""
    new, released.text_at = accumulator.text_from(released.text_at)
    thought, thought_at = accumulator.thinking_from(released.thought_at)
    released.size = 0
    have = released.text
    text = have + new
    outcome = await _finish.output_guardrails(
        turn, chain, text, attempt, (released.thinking + thought) or None, released=len(have)
    )
    if outcome.failures:
        return outcome, []
    released.thought_at = thought_at
    if outcome.text is not text:  # rewritten
        return outcome, released.release(turn.id, attempt, outcome.text, thought)
    released.text = text
    released.thinking += thought
    events: list[Event] = [ThinkingDelta(thought)] if thought else []
    if new:
        events.append(TextDelta(new))
    return outcome, events
