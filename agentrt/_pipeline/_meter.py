"""The output meter: what a streamed response spends of its output-token allowance.

While a response streams, its output tokens are estimated exactly as the usage fold estimates them
(about four characters a token, each text or thinking delta at least one; tool calls' names and
arguments), or read from usage the provider reports mid-stream: a budget of N output tokens allows a
response the fold counts as N, and a response cut at it reports usage past N. One `Meter` a response:
the driver's chunk loop spends every chunk with `spend` (which raises the cut's error once the
allowance is spent); a reader that only needs to stop reading asks `over`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._budget import chars_for_tokens
from .._events import TextDelta, ThinkingDelta, ToolCallDelta, Usage

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._events import ModelChunk

__all__ = ["TOKEN", "Meter"]

TOKEN: Final = chars_for_tokens(1)
"""What a delta spends at least: servers stream about a token a delta, so short deltas of code or CJK
text must not stream four times the limit."""

_ALL: Final = 1 << 62


class Meter:
    """The allowance of one response, `tokens` output tokens, kept in characters and spent chunk by
    chunk. `cut` makes the error `spend` raises once it is spent (the response stops within one chunk
    of the limit)."""

    __slots__ = ("_cut", "_left", "_most")

    def __init__(self, tokens: int, cut: Callable[[], Exception] | None = None) -> None:
        self._most = tokens
        self._left = chars_for_tokens(tokens)
        self._cut = cut

    def spend(self, chunk: ModelChunk) -> None:
        """Spend `chunk`; raise the cut's error once the allowance is spent (per chunk of a metered
        response: one call)."""
        kind = chunk.__class__
        if kind is TextDelta or kind is ThinkingDelta:
            size = len(chunk.text)  # type: ignore[union-attr]
            self._left -= size if size > TOKEN else TOKEN
        elif kind is ToolCallDelta:
            self._left -= len(chunk.arguments) + len(chunk.name or "")  # type: ignore[union-attr]
        elif kind is Usage and chunk.output_tokens > self._most:  # type: ignore[union-attr]
            self._left -= _ALL  # the provider counted past the limit
        if self._left < 0:
            raise _Spent if self._cut is None else self._cut()

    def over(self, chunk: ModelChunk) -> bool:
        """Spend `chunk`; whether the allowance is spent now (for a reader that only stops)."""
        cut, self._cut = self._cut, None  # (it only stops: no cut's error, whatever the meter has)
        try:
            self.spend(chunk)
        except _Spent:
            return True
        finally:
            self._cut = cut
        return False


class _Spent(Exception):
    """The allowance of a meter without a cut's error is spent (see `Meter.over`)."""
