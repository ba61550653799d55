"""Guardrails that come with agentrt: examples to use as they are or to copy and adapt.

- `JsonExtractor` (output): the answer must read as the method's return type; otherwise the model is
  asked again with the reason (a reprompt).
- `MaxLength` (input): refuses user text longer than a limit.
- `PromptInjection` (input): refuses user text that matches common prompt-injection phrases. Patterns
  catch the careless; they are not a defence on their own.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from .._errors import ConfigurationError, OutputParsingError
from ._results import GuardrailResult, fatal, reprompt, success, success_with

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._declare import InputGuardrailRequest, OutputGuardrailRequest

__all__ = ["INJECTION_PATTERNS", "JsonExtractor", "MaxLength", "PromptInjection"]


class JsonExtractor:
    """Output: read the answer as the method's return type (a pydantic model: the JSON object in the
    answer, code fences and prose around it ignored). When it reads, the value is the result (not
    parsed twice); when not, reprompt with the parse error."""

    name = "JsonExtractor"

    def __init__(
        self,
        prompt: str = "Your answer could not be read: {error}. Answer again with only the JSON object.",
    ) -> None:
        if "{error}" not in prompt:
            raise ConfigurationError("JsonExtractor: the prompt must contain {error}")
        self.prompt = prompt

    def validate(self, request: OutputGuardrailRequest) -> GuardrailResult:
        if request.tool_calls or request.partial:
            return success()  # not the answer (yet): nothing to read
        try:
            value = request.parse(request.text)
        except OutputParsingError as error:
            return reprompt(str(error), self.prompt.format(error=error))
        return success_with(request.text, value)


class MaxLength:
    """Input: at most `chars` characters of user text (attachments are not counted)."""

    name = "MaxLength"

    def __init__(self, chars: int) -> None:
        if isinstance(chars, bool) or not isinstance(chars, int) or chars < 1:
            raise ConfigurationError(f"MaxLength: chars must be a positive int, got {chars!r}")
        self.chars = chars

    def validate(self, request: InputGuardrailRequest) -> GuardrailResult:
        size = len(request.text)
        if size > self.chars:
            return fatal(f"the message has {size} characters; at most {self.chars} are allowed")
        return success()


INJECTION_PATTERNS: Final = (
    r"\b(ignore|disregard|forget)\b.{0,20}\b(previous|prior|above|earlier|all)\b.{0,20}"
    r"\b(instructions?|prompts?|rules|messages?)\b",
    r"\byou are now\b.{0,30}\b(developer mode|dan|jailbroken|unrestricted)\b",
    r"\b(reveal|show|print|repeat|output)\b.{0,20}\b(system prompt|your instructions|hidden instructions)\b",
    r"\bact as\b.{0,30}\bwithout (any )?(restrictions|rules|filters)\b",
)
"""Common prompt-injection phrasings (case-insensitive)."""


class PromptInjection:
    """Input: refuse user text that matches one of `patterns` (regular expressions, case-insensitive)."""

    name = "PromptInjection"

    def __init__(self, patterns: Iterable[str] = INJECTION_PATTERNS) -> None:
        try:
            self.patterns = tuple(re.compile(p, re.IGNORECASE | re.DOTALL) for p in patterns)
        except re.error as error:
            raise ConfigurationError(f"PromptInjection: a pattern does not compile: {error}") from None
        if not self.patterns:
            raise ConfigurationError("PromptInjection: give at least one pattern")

    def validate(self, request: InputGuardrailRequest) -> GuardrailResult:
        text = request.text
        for pattern in self.patterns:
            found = pattern.search(text)
            if found:
                return fatal(f"the message looks like a prompt injection ({found.group(0)!r})")
        return success()
