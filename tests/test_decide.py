"""The turn's decisions about an answer, as pure functions (`_pipeline/_decide.py`), and the release
state's one transition (`Release.again`): unit tests, apart from any model or stream."""

from __future__ import annotations

import pytest

from agentrt._events import GuardrailVerdict
from agentrt._pipeline._decide import Decision, after_chain, after_parse
from agentrt._pipeline._finish import Outcome
from agentrt._pipeline._release import Mode, Release
from agentrt.guardrails import reprompt, retry

FAILED = GuardrailVerdict("i", "g", "output", "failure", "no", 0.0)


@pytest.mark.parametrize("asks", [retry("again"), reprompt("again", "Again.")])
def test_a_reask_asks_again_while_reasks_are_left(asks: object) -> None:
    outcome = Outcome("text", failures=[FAILED], reask=asks)  # type: ignore[arg-type]
    assert after_chain(outcome, askable=True, reasks=0, max_retries=2) is Decision.REASK
    assert after_chain(outcome, askable=True, reasks=1, max_retries=2) is Decision.REASK
    assert after_chain(outcome, askable=True, reasks=2, max_retries=2) is Decision.REFUSE  # used up
    assert after_chain(outcome, askable=True, reasks=0, max_retries=0) is Decision.REFUSE


def test_an_answer_no_model_wrote_is_never_asked_for_again() -> None:
    outcome = Outcome("tool result", failures=[FAILED], reask=retry("again"))
    assert after_chain(outcome, askable=False, reasks=0, max_retries=2) is Decision.REFUSE


def test_failures_refuse_and_a_clean_outcome_goes_on_to_parse() -> None:
    assert (
        after_chain(Outcome("t", failures=[FAILED]), askable=True, reasks=0, max_retries=2) is Decision.REFUSE
    )
    assert after_chain(Outcome("t"), askable=True, reasks=0, max_retries=2) is Decision.ACCEPT


def test_parse_repairs_while_repairs_are_left() -> None:
    assert after_parse(False, askable=True, repairs=5, max_repairs=1) is Decision.ACCEPT
    assert after_parse(True, askable=True, repairs=0, max_repairs=1) is Decision.REPAIR
    assert after_parse(True, askable=True, repairs=1, max_repairs=1) is Decision.UNPARSED
    assert after_parse(True, askable=True, repairs=0, max_repairs=0) is Decision.UNPARSED
    assert after_parse(True, askable=False, repairs=0, max_repairs=3) is Decision.UNPARSED


@pytest.mark.parametrize(
    ("policy", "streams", "mode", "holds", "shows"),
    [
        ("plain", False, Mode.PLAIN, False, False),
        ("plain", True, Mode.PLAIN, False, False),
        ("buffer", True, Mode.HOLD, True, False),
        ("chunked", True, Mode.CHUNKED, True, True),
        ("optimistic", True, Mode.OPTIMISTIC, False, True),
    ],
)
def test_each_policy_starts_in_its_mode(
    policy: str, streams: bool, mode: Mode, holds: bool, shows: bool
) -> None:
    release = Release(policy, streams, None)
    assert release.mode is mode
    assert (release.pending is not None) is holds  # events held with the text
    assert (release.released is not None) is shows  # what the reader has, to withdraw


@pytest.mark.parametrize(
    ("policy", "streams", "after"),
    [
        ("plain", False, Mode.PLAIN),  # an awaited call shows nothing before its value
        ("plain", True, Mode.HOLD),  # a stream replays the next answer stream-to-sync
        ("buffer", True, Mode.HOLD),
        ("chunked", True, Mode.HOLD),  # re-asked, a chunked stream holds the next answer
        ("optimistic", True, Mode.OPTIMISTIC),  # shows it at once again, withdrawing if need be
    ],
)
def test_asked_again_each_policy_holds_or_shows_the_next_answer(
    policy: str, streams: bool, after: Mode
) -> None:
    release = Release(policy, streams, None)
    release.again()
    assert release.mode is after
    if after is Mode.HOLD:
        assert release.pending is not None
