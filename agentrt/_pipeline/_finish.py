"""The stages after the loop: output guardrails, parse, commit. Each is a small function over the turn."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._errors import ContentRefusedError

if TYPE_CHECKING:
    from ._turn import Turn

__all__ = ["answer_text", "commit", "output_guardrails", "parse"]


def answer_text(turn: Turn) -> str:
    """The answer's text: the final response's, or the immediate tools' results."""
    if turn.immediate is not None:
        return "\n".join(execution.result for execution in turn.immediate)
    response = turn.response
    assert response is not None
    return response.message.text or ""


def output_guardrails(turn: Turn, text: str) -> str:
    """Seam: output guardrails over the final answer (retry and reprompt run the loop again). Plain
    until guardrails exist: the invocation awaits it, under the deadline, once they can wait."""
    return text


def parse(turn: Turn, text: str) -> Any:
    """The answer as the declared return type (`OutputParsingError` when it does not parse)."""
    parser = turn.spec.parser
    immediate = turn.immediate
    if immediate is not None:
        only = immediate[0].value if len(immediate) == 1 else None
        return only if parser.accepts(only) else parser.parse(text)
    response = turn.response
    assert response is not None
    if response.message.refusal and not text:
        raise ContentRefusedError(response.message.refusal)
    return parser.parse(text)


async def commit(turn: Turn) -> None:
    """Write the turn to its conversation in one atomic write: the user's own message (without format
    instructions or retrieved text), then the exchange (assistant messages and tool results, the
    answer last). Only a turn that succeeded gets here; re-asks and repairs are not in the exchange.

    The invocation awaits it shielded: a write that started is finished, so a turn is either stored
    whole and reported, or not stored (a cancellation that arrives meanwhile takes effect after it).
    """
    conversation = turn.conversation
    assert conversation is not None
    assert turn.user is not None
    await conversation.commit([turn.user, *turn.exchange])
