"""The output meter: a response accumulator that stops a response at a token allowance.

While a response streams, its output tokens are estimated as the usage fold estimates them (about
four characters a token, and never fewer tokens than deltas), or read from usage the provider reports
mid-stream. The check rides on the accumulator's own dispatch, so a token budget costs the per-token
path a subtraction and two comparisons.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._budget import chars_for_tokens
from .._events import TextDelta, ThinkingDelta, ToolCallDelta, Usage
from ..models._protocol import ResponseAccumulator

if TYPE_CHECKING:
    from .._budget import BudgetLimit
    from .._events import ModelChunk

__all__ = ["Exhausted", "MeteredAccumulator"]

_TOKEN: Final = chars_for_tokens(1)


class Exhausted(Exception):
    """Raised by `MeteredAccumulator.add` when the response passed its allowance (caught inside the
    pipeline, which turns it into `BudgetExceededError`)."""


class MeteredAccumulator(ResponseAccumulator):
    """A `ResponseAccumulator` whose `add` raises `Exhausted` past `allowance` output tokens.

    One counter, `_left`, holds the allowance in characters (four a token, the estimate the usage
    fold makes); text and thinking deltas spend their length but at least a token each (servers
    stream about a token a delta: short deltas of code or CJK text must not stream four times the
    limit), tool-call arguments their length. Usage the provider reports while streaming is compared
    as it is.
    """

    __slots__ = ("_left", "allowance", "limit")

    def __init__(self, allowance: int, limit: BudgetLimit) -> None:
        super().__init__()
        self.allowance = allowance
        self.limit = limit
        self._left = chars_for_tokens(allowance)

    def add(self, chunk: ModelChunk) -> None:
        if type(chunk) is TextDelta:
            text = chunk.text
            self._text.append(text)
            size = len(text)
            self._left -= size if size > _TOKEN else _TOKEN
            if self._left < 0:
                raise Exhausted
            return
        ResponseAccumulator.add(self, chunk)
        kind = type(chunk)
        if kind is ThinkingDelta:
            size = len(chunk.text)  # type: ignore[union-attr]
            self._left -= size if size > _TOKEN else _TOKEN
        elif kind is ToolCallDelta:
            self._left -= len(chunk.arguments)  # type: ignore[union-attr]
        elif kind is Usage:
            if chunk.output_tokens > self.allowance:  # type: ignore[union-attr]
                raise Exhausted
            return
        if self._left < 0:
            raise Exhausted
