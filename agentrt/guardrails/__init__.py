"""Guardrails: checks on the user message before the model is asked, and on its answers.

    @input_guardrails(no_secrets)
    @output_guardrails(polite, max_retries=2)
    class Support: ...

A guardrail is a function of its request (or an object with a `validate(request)` method), sync or
async, returning a `GuardrailResult`: `success()`, `success_with(text)`, `failure(message)`,
`fatal(message)`, and for output guardrails `retry`, `reprompt` and their `*_with_message_removal`
forms. Declared on a method, on the class, or at `build(...)`: the method's win, then the class's.
"""

from __future__ import annotations

from . import builtin
from ._declare import (
    InputGuardrailRequest,
    OutputGuardrailRequest,
    Release,
    input_guardrails,
    output_guardrails,
    partial_text,
)
from ._results import (
    NO_VALUE,
    GuardrailResult,
    Verdict,
    failure,
    fatal,
    reprompt,
    reprompt_with_message_removal,
    retry,
    retry_with_message_removal,
    success,
    success_with,
)

__all__ = [
    "NO_VALUE",
    "GuardrailResult",
    "InputGuardrailRequest",
    "OutputGuardrailRequest",
    "Release",
    "Verdict",
    "builtin",
    "failure",
    "fatal",
    "input_guardrails",
    "output_guardrails",
    "partial_text",
    "reprompt",
    "reprompt_with_message_removal",
    "retry",
    "retry_with_message_removal",
    "success",
    "success_with",
]
