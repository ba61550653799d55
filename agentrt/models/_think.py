"""Reasoning text inlined in the answer as `<think>…</think>` (DeepSeek-R1, Qwen3 and others served
without a reasoning parser) becomes thinking deltas.

Only a block that opens the answer counts (leading whitespace allowed): a `<think>` later in an
answer is the answer's own text. Tags may be split across deltas anywhere; text that could still be
the start of a tag is held back until the next delta decides it. Whitespace between `</think>` and the
answer is dropped. Once the answer is known to have no (more) tag, the splitter reports `settled` and the
caller maps content directly, so ordinary answers pay for it on their first delta only.

Work is linear in the text: leading whitespace is kept as the deltas that brought it (joined once, if
it turns out to be answer text), and only the few characters after it that may begin `<think>` are
examined again when the next delta arrives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._events import TextDelta, ThinkingDelta

if TYPE_CHECKING:
    from .._events import ModelChunk

__all__ = ["ThinkTagSplitter"]

_OPEN: Final = "<think>"
_CLOSE: Final = "</think>"

_LEADING, _THINKING, _AFTER, _SETTLED = range(4)


class ThinkTagSplitter:
    """Splits one answer's content deltas into `ThinkingDelta` and `TextDelta` chunks."""

    __slots__ = ("_pending", "_space", "_state")

    def __init__(self) -> None:
        self._state = _LEADING
        self._pending = ""  # before the answer: what may begin the tag, after the whitespace
        self._space: list[str] = []  # the leading whitespace, as it came (not re-read per delta)

    @property
    def settled(self) -> bool:
        """True once every further delta is plain answer text."""
        return self._state == _SETTLED

    def feed(self, text: str, out: list[ModelChunk]) -> None:
        """Append the chunks `text` completes to `out`."""
        state = self._state
        if state == _SETTLED:
            out.append(TextDelta(text))
            return
        if state == _LEADING:
            pending = self._pending
            if not pending:  # still in the leading whitespace: keep it aside, unread again
                stripped = text.lstrip()
                if len(stripped) < len(text):
                    self._space.append(text[: len(text) - len(stripped)])
                text = stripped
            pending += text
            if pending.startswith(_OPEN):
                self._state = _THINKING
                self._pending = ""
                self._space = []
                self.feed(pending[len(_OPEN) :], out)
            elif _OPEN.startswith(pending):
                self._pending = pending  # empty or a prefix of the tag (at most 6 characters): undecided
            else:
                self._state = _SETTLED
                self._pending = ""
                out.append(TextDelta("".join(self._space) + pending))
                self._space = []
        elif state == _THINKING:
            pending = self._pending + text
            end = pending.find(_CLOSE)
            if end >= 0:
                if end:
                    out.append(ThinkingDelta(pending[:end]))
                self._state = _AFTER
                self._pending = ""
                self.feed(pending[end + len(_CLOSE) :], out)
                return
            keep = _partial_suffix(pending, _CLOSE)
            if len(pending) > keep:
                out.append(ThinkingDelta(pending[: len(pending) - keep]))
            self._pending = pending[len(pending) - keep :]
        else:  # _AFTER: drop the whitespace between the block and the answer
            answer = text.lstrip()
            if answer:
                self._state = _SETTLED
                out.append(TextDelta(answer))

    def close(self, out: list[ModelChunk]) -> None:
        """The answer ended: release what was held back."""
        pending, self._pending = self._pending, ""
        if self._state == _LEADING:
            pending = "".join(self._space) + pending
            self._space = []
        if pending:
            if self._state == _THINKING:
                out.append(ThinkingDelta(pending))
            elif self._state == _LEADING:
                out.append(TextDelta(pending))
        self._state = _SETTLED


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0
