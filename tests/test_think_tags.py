"""`<think>` blocks inlined in an answer's content (`agentrt.models._think.ThinkTagSplitter`): what
becomes thinking, what stays text, and that the work stays linear however the text is cut.

Synchronous: the splitter is plain computation. Its speed over 20k to 80k deltas is measured by
benchmarks/bench_extract.py; here the work is counted, not timed.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentrt._events import TextDelta, ThinkingDelta
from agentrt.models._think import ThinkTagSplitter


def split(deltas: list[str]) -> tuple[str, str]:
    """(thinking, text) the splitter makes of `deltas`."""
    splitter = ThinkTagSplitter()
    out: list[Any] = []
    for delta in deltas:
        splitter.feed(delta, out)
    splitter.close(out)
    thinking = "".join(c.text for c in out if isinstance(c, ThinkingDelta))
    text = "".join(c.text for c in out if isinstance(c, TextDelta))
    return thinking, text


@pytest.mark.parametrize(
    ("deltas", "expected"),
    [
        ([" ", "\n", " ", "<th", "ink>", "plan", "</think>", "\n", "Done."], ("plan", "Done.")),
        ([" ", "\n", " ", "Done."], ("", " \n Done.")),  # whitespace before text is the text's
        ([" ", "\n", "<th", " x"], ("", " \n<th x")),  # a tag's start that was not one
        ([" ", "\t", " "], ("", " \t ")),  # only whitespace, released at the end
        ([" ", "<thi"], ("", " <thi")),
    ],
)
def test_leading_whitespace_is_kept_or_dropped(deltas: list[str], expected: tuple[str, str]) -> None:
    assert split(deltas) == expected


class Counted(str):
    """A delta that counts the characters of every concatenation it takes part in."""

    copied = 0

    def __add__(self, other: str) -> str:
        Counted.copied += len(self) + len(other)
        return str.__add__(self, other)

    def __radd__(self, other: str) -> str:
        Counted.copied += len(other) + len(self)
        return str.__add__(other, self)


@pytest.mark.parametrize("then", ["<think>plan</think>answer", "answer"])
def test_leading_whitespace_in_one_character_deltas_is_read_once(then: str) -> None:
    # Each whitespace delta used to be appended to all the whitespace before it and stripped again:
    # 80k deltas took 1.8 s. Now no delta is concatenated with the whitespace held before it.
    Counted.copied = 0
    size = 20_000
    thinking, text = split([Counted(" ")] * size + [Counted(then)])
    assert Counted.copied <= 4 * (size + len(then))
    if then == "answer":
        assert (thinking, text) == ("", " " * size + "answer")
    else:
        assert (thinking, text) == ("plan", "answer")
