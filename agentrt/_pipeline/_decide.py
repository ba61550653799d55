"""What the turn does with an answer: one pure function per check, of the check's outcome and the
turn's counts.

After the output chain (`after_chain`): ask again (a retry or reprompt, while re-asks are left and the
answer came from the model), refuse (failures, or re-asks used up), or go on to parse. After parsing
(`after_parse`): accept, repair (asked again with what was wrong, while repairs are left), or fail.
Text sent with tool calls is decided like an answer (`after_chain`); it is never parsed.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from ._finish import Outcome

__all__ = ["Decision", "after_chain", "after_parse"]


class Decision(enum.Enum):
    ACCEPT = "accept"
    """The chain passed it (go on to parse), or it parsed: the answer."""
    REASK = "reask"
    """A guardrail asked again (retry or reprompt)."""
    REPAIR = "repair"
    """It did not parse: ask again with what was wrong."""
    REFUSE = "refuse"
    """The chain refused it, or kept asking past its re-asks: `OutputGuardrailError`."""
    UNPARSED = "unparsed"
    """It did not parse and cannot be repaired: `OutputParsingError`."""


# Members read as constants: on 3.11 a class attribute of an enum goes through `EnumType.__getattr__`.
_ACCEPT: Final = Decision.ACCEPT
_REASK: Final = Decision.REASK
_REFUSE: Final = Decision.REFUSE
_REPAIR: Final = Decision.REPAIR
_UNPARSED: Final = Decision.UNPARSED


def after_chain(outcome: Outcome, *, askable: bool, reasks: int, max_retries: int) -> Decision:
    """What an output chain's `outcome` means for an answer (`askable`: the model wrote it, so it can
    be asked for again; an immediate tool's result cannot), after `reasks` of `max_retries` re-asks."""
    if outcome.reask is not None and askable and reasks < max_retries:
        return _REASK
    if outcome.failures:
        return _REFUSE
    return _ACCEPT


def after_parse(failed: bool, *, askable: bool, repairs: int, max_repairs: int) -> Decision:
    """What a parse means: `failed` to parse, after `repairs` of `max_repairs` repairs."""
    if not failed:
        return _ACCEPT
    if askable and repairs < max_repairs:
        return _REPAIR
    return _UNPARSED
