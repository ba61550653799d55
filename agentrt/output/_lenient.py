"""Readings of an answer that is not the JSON asked for, where only one reading is possible: a bare
scalar ("yes", "42.", "POSITIVE"), the one number or yes/no of a short sentence, and an Enum member
named by its value or its name in any case (`TypeParser` validates what they give)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final

from ._extract import answer_start, trim

if TYPE_CHECKING:
    import enum

_BARE_MAX: Final = 200  # a longer answer is not a bare scalar
# A number in a sentence: what looks like one, with any letters, digits or % stuck to it (then it is
# no plain number: "3rd", "v2", "10km", "42%").
_NUMBER_LIKE: Final = re.compile(r"\w*[-+]?\d[\d.,']*\w*%?")
_PLAIN_NUMBER: Final = re.compile(r"[-+]?\d+(?:\.\d+)?")
_JSONISH: Final = re.compile(r'[{}\[\]"]')
_WORD: Final = re.compile(r"[^\W\d_]+")
_POLAR: Final = {"yes": "true", "true": "true", "no": "false", "false": "false"}


def bare_scalar(text: str) -> str | None:
    """A short answer (after its think blocks) as a bare scalar: without quotes, backticks and a
    final full stop. A long one is not stripped whole (10 MB of white space would be one call)."""
    start, end = trim(text, answer_start(text), len(text))
    answer = text[start:end]
    if not answer or len(answer) > _BARE_MAX or "\n" in answer:
        return None
    answer = answer.strip("`").strip()
    if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "\"'":
        answer = answer[1:-1]
    if answer.endswith(".") and not answer.endswith(".."):  # "42." is 42; an ellipsis stays
        answer = answer[:-1]
    return answer.strip() or None


def said_in(sentence: str, kinds: frozenset[str]) -> str | None:
    """The one number, or the yes or no it starts with, of a short sentence, as JSON writes it
    ("42", "true"), if `kinds` has "number" or "boolean"; `None` when there is none, or more than one
    reading."""
    if _JSONISH.search(sentence):
        return None  # JSON that did not validate is no sentence: {"error": 500} is no 500
    found = []
    if "boolean" in kinds:
        words = _WORD.findall(sentence.casefold())
        said = {_POLAR[word] for word in words if word in _POLAR}
        if words and words[0] in _POLAR and len(said) == 1:  # "Yes, it is."; not "Yes and no."
            found.append(said.pop())
    if "number" in kinds:
        numbers = _NUMBER_LIKE.findall(sentence)
        if len(numbers) == 1:
            number = numbers[0].rstrip(".,")
            if _PLAIN_NUMBER.fullmatch(number):  # not "3rd", "v2", "42%", "1,250.50"
                found.append(number)
    return found[0] if len(found) == 1 else None


def member_named(enums: tuple[type[enum.Enum], ...], word: str, expected: str) -> enum.Enum | None:
    """The member `word` names, by value, then by name, case-insensitively; among the Enums whose
    values pydantic listed as `expected` first."""
    listed = [e for e in enums if all(repr(member.value) in expected for member in e)]
    folded = word.strip().casefold()
    for choices in (listed, enums):
        for member in (m for e in choices for m in e):
            if str(member.value).casefold() == folded:
                return member
        for member in (m for e in choices for m in e):
            if member.name.casefold() == folded:
                return member
    return None


def replaced(data: Any, loc: tuple[int | str, ...], word: str, value: Any) -> tuple[Any, bool]:
    """`data` with the `word` at `loc` (a validation error's location) replaced by `value`. Parts of
    `loc` that are not keys or indexes of `data` name union members and are skipped."""
    path: list[tuple[Any, int | str]] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            path.append((node, part))
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append((node, part))
            node = node[part]
    if node != word:
        return data, False
    if not path:
        return value, True
    container, key = path[-1]
    container[key] = value
    return data, True
