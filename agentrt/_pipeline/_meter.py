"""The output meter: a response accumulator that stops a response at a token allowance.

While a response streams, its output tokens are estimated at about four characters a token, or read
from usage the provider reports mid-stream. The check rides on the accumulator's own dispatch, so a
token budget costs the per-token path one subtraction and one comparison.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._budget import chars_for_tokens
from .._events import TextDelta, ThinkingDelta, ToolCallDelta, Usage
from ..models._protocol import ResponseAccumulator

if TYPE_CHECKING:
    from .._budget import BudgetLimit
    from .._events import ModelChunk

__all__ = ["Exhausted", "MeteredAccumulator"]


class Exhausted(Exception):
    """Raised by `MeteredAccumulator.add` when the response passed its allowance (caught inside the
    pipeline, which turns it into `BudgetExceededError`)."""


class MeteredAccumulator(ResponseAccumulator):
    """A `ResponseAccumulator` whose `add` raises `Exhausted` past `allowance` output tokens.

    One counter, `_left`, holds the allowance in characters (four a token, the estimate the usage
    fold makes); text, thinking and tool-call arguments spend it. Usage the provider reports while
    streaming is compared as it is.
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
            self._left -= len(text)
            if self._left < 0:
                raise Exhausted
            return
        ResponseAccumulator.add(self, chunk)
        kind = type(chunk)
        if kind is ThinkingDelta:
            self._left -= len(chunk.text)  # type: ignore[union-attr]
        elif kind is ToolCallDelta:
            self._left -= len(chunk.arguments)  # type: ignore[union-attr]
        elif kind is Usage:
            if chunk.output_tokens > self.allowance:  # type: ignore[union-attr]
                raise Exhausted
            return
        if self._left < 0:
            raise Exhausted
