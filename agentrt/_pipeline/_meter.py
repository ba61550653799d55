"""The output meter: what a streamed chunk spends of a response's output-token allowance.

While a response streams, its output tokens are estimated exactly as the usage fold estimates them
(about four characters a token, each text or thinking delta at least one; tool calls' names and
arguments), or read from usage the provider reports mid-stream: a budget of N output tokens allows a
response the fold counts as N, and a response cut at it reports usage past N. The allowance is kept
in characters, in a local of the pipeline's chunk loop: a text delta, the common chunk, is metered
there inline (a subtraction and two comparisons); `spend` meters the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._budget import chars_for_tokens
from .._events import TextDelta, ThinkingDelta, ToolCallDelta, Usage

if TYPE_CHECKING:
    from .._events import ModelChunk

__all__ = ["TOKEN", "spend"]

TOKEN: Final = chars_for_tokens(1)
"""What a delta spends at least: servers stream about a token a delta, so short deltas of code or CJK
text must not stream four times the limit."""

_ALL: Final = 1 << 62


def spend(chunk: ModelChunk, allowance: int) -> int:
    """The characters `chunk` spends of a response allowed `allowance` output tokens (everything,
    for usage reported past it)."""
    kind = type(chunk)
    if kind is TextDelta or kind is ThinkingDelta:
        size = len(chunk.text)  # type: ignore[union-attr]
        return size if size > TOKEN else TOKEN
    if kind is ToolCallDelta:
        return len(chunk.arguments) + len(chunk.name or "")  # type: ignore[union-attr]
    if kind is Usage and chunk.output_tokens > allowance:  # type: ignore[union-attr]
        return _ALL
    return 0
