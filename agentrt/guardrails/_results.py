"""What a guardrail says about a user message or an answer: a `GuardrailResult`.

Input guardrails answer `success()`, `success_with(text)` (the user message becomes `text`; later
guardrails see it), `failure(message)` (the chain goes on; the call fails at its end with every
failure) or `fatal(message)` (the chain stops; the call fails). Output guardrails may also answer
`retry(message)` (ask the same request again), `reprompt(message, prompt)` (ask again, with the
rejected answer and then `prompt` as a user message), the `*_with_message_removal` forms (ask again
without the rejected answer in the request) and `success_with(text, value)`, whose `value` is the
method's result, unparsed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "NO_VALUE",
    "GuardrailResult",
    "Verdict",
    "failure",
    "fatal",
    "reprompt",
    "reprompt_with_message_removal",
    "retry",
    "retry_with_message_removal",
    "success",
    "success_with",
]


class _NoValue:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_VALUE"


NO_VALUE: Final = _NoValue()
"""`success_with` without a value: the (rewritten) text is parsed as usual."""


class Verdict(enum.StrEnum):
    """What a guardrail decided."""

    SUCCESS = "success"
    SUCCESS_WITH = "success_with"
    FAILURE = "failure"
    FATAL = "fatal"
    RETRY = "retry"
    REPROMPT = "reprompt"


@dataclass(frozen=True, slots=True)
class GuardrailResult:
    """A guardrail's verdict; make one with the functions of this module."""

    verdict: Verdict
    message: str | None = None
    """Why it failed (failure, fatal, retry, reprompt)."""
    text: str | None = None
    """The rewritten text (`success_with`)."""
    value: Any = NO_VALUE
    """The method's result, unparsed (`success_with(text, value)` of an output guardrail)."""
    prompt: str | None = None
    """The reprompt text (`reprompt`)."""
    remove_message: bool = False
    """Re-ask without the rejected answer in the request (`*_with_message_removal`)."""

    def __post_init__(self) -> None:
        # Made directly, a result must still carry what its verdict needs (the functions below do).
        verdict = self.verdict
        if not isinstance(verdict, Verdict):
            raise TypeError(f"GuardrailResult: verdict must be a Verdict, got {verdict!r}")
        needs = {
            Verdict.SUCCESS_WITH: ("text",),
            Verdict.FAILURE: ("message",),
            Verdict.FATAL: ("message",),
            Verdict.RETRY: ("message",),
            Verdict.REPROMPT: ("message", "prompt"),
        }.get(verdict, ())
        for name in needs:
            if not isinstance(getattr(self, name), str):
                raise TypeError(
                    f"GuardrailResult({verdict.value}) needs a str {name}, got {getattr(self, name)!r}"
                )

    @property
    def passed(self) -> bool:
        return self.verdict in (Verdict.SUCCESS, Verdict.SUCCESS_WITH)


_SUCCESS: Final = GuardrailResult(Verdict.SUCCESS)


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"a guardrail's {what} must be a str, got {value!r}")
    return value


def success() -> GuardrailResult:
    """The text passes as it is."""
    return _SUCCESS


def success_with(text: str, value: Any = NO_VALUE) -> GuardrailResult:
    """The text passes as `text`; an output guardrail may give the method's result as `value`."""
    return GuardrailResult(Verdict.SUCCESS_WITH, text=_text(text, "text"), value=value)


def failure(message: str) -> GuardrailResult:
    """The text fails; the chain goes on, and the call fails at its end with every failure."""
    return GuardrailResult(Verdict.FAILURE, message=_text(message, "message"))


def fatal(message: str) -> GuardrailResult:
    """The text fails; the chain stops and the call fails."""
    return GuardrailResult(Verdict.FATAL, message=_text(message, "message"))


def retry(message: str) -> GuardrailResult:
    """Output only: ask the model the same request again."""
    return GuardrailResult(Verdict.RETRY, message=_text(message, "message"))


def retry_with_message_removal(message: str) -> GuardrailResult:
    """Output only: ask again; `retry` never sends the rejected answer, so this is `retry`, named for
    those who port guardrails that use it."""
    return GuardrailResult(Verdict.RETRY, message=_text(message, "message"), remove_message=True)


def reprompt(message: str, prompt: str) -> GuardrailResult:
    """Output only: ask again with the rejected answer and then `prompt` as a user message."""
    return GuardrailResult(
        Verdict.REPROMPT, message=_text(message, "message"), prompt=_text(prompt, "prompt")
    )


def reprompt_with_message_removal(message: str, prompt: str) -> GuardrailResult:
    """Output only: ask again with `prompt` as a user message, without the rejected answer."""
    return GuardrailResult(
        Verdict.REPROMPT,
        message=_text(message, "message"),
        prompt=_text(prompt, "prompt"),
        remove_message=True,
    )
