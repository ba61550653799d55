"""The output meter on its own (`agentrt._pipeline._meter.Meter`): what each kind of chunk spends of a
response's output-token allowance, and that `spend` raises the cut's error on the chunk that passes
it, not before. (Every path that meters through it is tried end to end in test_budgets_exact.py.)"""

from __future__ import annotations

import pytest

from agentrt import TextDelta, ThinkingDelta, Usage
from agentrt._events import ToolCallDelta
from agentrt._pipeline._meter import TOKEN, Meter


class Cut(Exception):
    pass


def meter(tokens: int) -> tuple[Meter, list[str]]:
    made: list[str] = []

    def cut() -> Exception:
        made.append("cut")
        return Cut()

    return Meter(tokens, cut), made


def test_a_delta_spends_a_token_per_four_characters_and_at_least_one() -> None:
    assert TOKEN == 4
    m, _ = meter(3)
    assert not m.over(TextDelta("a"))  # 1 token
    assert not m.over(ThinkingDelta("abcdefgh"))  # 2 tokens: 3 spent, none left
    assert m.over(TextDelta(""))  # an empty delta still spends one: past the allowance


def test_tool_call_fragments_spend_their_name_and_arguments() -> None:
    m, _ = meter(2)
    assert not m.over(ToolCallDelta(0, id="c1", name="look", arguments="{}"))  # 6 characters of 8
    assert not m.over(ToolCallDelta(0, arguments="ab"))  # 8 of 8
    assert m.over(ToolCallDelta(0, arguments="x"))


def test_usage_reported_past_the_allowance_spends_everything_and_within_it_nothing() -> None:
    m, _ = meter(10)
    assert not m.over(Usage(3, 10))
    assert m.over(Usage(3, 11))


def test_spend_raises_the_cut_s_error_on_the_chunk_that_passes_the_allowance() -> None:
    m, made = meter(2)
    m.spend(TextDelta("abcd"))
    m.spend(TextDelta("efgh"))  # exactly the allowance: allowed
    assert made == []
    with pytest.raises(Cut):
        m.spend(TextDelta("i"))
    assert made == ["cut"]
