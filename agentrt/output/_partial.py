"""Partial values of a structured answer as it streams in (what a `PartialStream` yields).

The JSON received so far is read with pydantic-core's partial JSON parser (`from_json(...,
allow_partial=True)`, which drops an unfinished string, number or literal at the end) and validated
with pydantic's partial validation (`experimental_allow_partial`, which drops an unfinished last item);
no partial JSON parser of our own. The text is read only up to the last character after which a value
may have ended (`"`, `,`, `]`, `}`): a number is taken once it is followed by one, never while it may
still grow. So a snapshot only holds values that are final, and each one extends the one before (a
model's fields not yet received show their defaults).

Where the JSON starts (after white space, a `<think>` block, a fence line) is found by reading each
delta once. Reading the JSON costs one pass over the answer so far: it is done only when a chunk may
have ended a value, and, for a long answer, only once it has grown by a sixteenth since the last
read, so the total stays linear in the answer's length.
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any, Final

from pydantic import ValidationError
from pydantic_core import from_json

from ._parsers import NOTHING, WRAPPER

if TYPE_CHECKING:
    from pydantic import TypeAdapter

    from ._parsers import TypeParser

__all__ = ["Snapshots"]

_NOTHING: Final = NOTHING
_UNKNOWN: Final = -1  # where the JSON starts is not known yet
_OFF: Final = -2  # no snapshots from this answer (it is not JSON first, or its JSON has ended)
# What `_locate` reads before the JSON: the start, a think block, after it, a fence line, after it.
_LEAD, _THINK, _AFTER_THINK, _FENCE, _AFTER_FENCE = range(5)
_THINK_OPEN: Final = "<think>"
_THINK_CLOSE: Final = "</think>"
_FENCE_OPEN: Final = "```"
_SPACE: Final = re.compile(r"\s*")


class Snapshots:
    """The partial values of one streamed answer: `feed` it text deltas; `value` is the latest."""

    __slots__ = (
        "_adapter",
        "_boundary",
        "_carry",
        "_enabled",
        "_lead",
        "_parsed_at",
        "_parser",
        "_parts",
        "_raw",
        "_size",
        "_start",
        "_unwrap",
        "value",
    )

    def __init__(self, parser: TypeParser) -> None:
        self._parser = parser
        self._adapter: TypeAdapter[Any] = parser.adapter
        self._unwrap = not parser.is_object  # asked for as {"value": ...} on JSON-mode paths
        self._enabled = not parser.is_scalar  # a scalar is complete only at the end
        self.reset()

    def reset(self) -> None:
        """Start over (a new answer replaces the one fed so far)."""
        self._parts: list[str] = []
        self._size = 0
        self._boundary = -1  # where, in the answer, a value may have ended last
        self._parsed_at = 0
        self._start = _UNKNOWN if self._enabled else _OFF
        self._lead = _LEAD  # what is being read before the JSON (see `_locate`)
        self._carry = ""  # the end of the text so far that may begin a marker
        self._raw: Any = _NOTHING
        self.value: Any = _NOTHING

    def feed(self, text: str) -> bool:
        """Add a text delta; whether it gave a new snapshot (then in `value`)."""
        start = self._start
        if start == _OFF:
            return False
        size = self._size
        self._size = size + len(text)
        self._parts.append(text)
        if start == _UNKNOWN:
            start = self._start = self._locate(text)
            if start < 0:
                return False
        at = max(text.rfind('"'), text.rfind(","), text.rfind("}"), text.rfind("]"))
        if at < 0:
            return False
        boundary = self._boundary = size + at
        if boundary < start:
            return False
        if boundary - self._parsed_at < (boundary - start) >> 4:
            return False  # a long answer is read again once it grew by a sixteenth
        self._parsed_at = boundary
        whole = "".join(self._parts)
        self._parts = [whole]
        try:
            raw = from_json(whole[start : boundary + 1], allow_partial=True)
        except ValueError:  # the JSON ended (prose after it), or it is not JSON after all
            self._start = _OFF
            return False
        if self._unwrap and isinstance(raw, dict):
            if not raw:
                return False
            if raw.keys() == {WRAPPER}:
                raw = raw[WRAPPER]
        if raw == self._raw:
            return False
        self._raw = raw
        try:
            value = self._adapter.validate_python(raw, experimental_allow_partial=True)
        except ValidationError as exc:
            fixed = self._parser.by_name(copy.deepcopy(raw), exc)  # Enums named, not valued
            if fixed is _NOTHING:
                return False
            try:
                value = self._adapter.validate_python(fixed, experimental_allow_partial=True)
            except ValidationError:
                return False
        if self.value is not _NOTHING and value == self.value:
            return False
        self.value = value
        return True

    def final(self, value: Any) -> bool:
        """Whether the final `value` is still to be yielded (it is not the last snapshot)."""
        last = self.value
        return last is _NOTHING or bool(last != value)

    def _locate(self, text: str) -> int:
        """Read the delta `text` on from where the search for the JSON's start stopped: leading
        white space, a `<think>...</think>` block, a fence line (three backticks, a language tag, a
        line end), white space again. Where the JSON starts (`{` or `[`), `_UNKNOWN` while that
        cannot be told yet, `_OFF` when the answer starts with prose. Each character is read once
        (what may begin a marker is carried to the next delta), so this is linear."""
        buffer = self._carry + text
        base = self._size - len(buffer)  # where `buffer` starts in the answer
        self._carry = ""
        at = 0
        size = len(buffer)
        while True:
            lead = self._lead
            if lead == _THINK or lead == _FENCE:
                marker = _THINK_CLOSE if lead == _THINK else "\n"
                end = buffer.find(marker, at)
                if end < 0:
                    self._carry = buffer[max(at, size - len(marker) + 1) :]
                    return _UNKNOWN
                at = end + len(marker)
                self._lead = _AFTER_THINK if lead == _THINK else _AFTER_FENCE
                continue
            at = _SPACE.match(buffer, at).end()  # type: ignore[union-attr]
            if at == size:
                return _UNKNOWN
            rest = buffer[at:]
            if lead == _LEAD:
                if rest.startswith(_THINK_OPEN):
                    self._lead = _THINK
                    at += len(_THINK_OPEN)
                    continue
                if len(rest) < len(_THINK_OPEN) and _THINK_OPEN.startswith(rest):
                    self._carry = rest
                    return _UNKNOWN
            if lead != _AFTER_FENCE:
                if rest.startswith(_FENCE_OPEN):
                    self._lead = _FENCE
                    at += len(_FENCE_OPEN)
                    continue
                if len(rest) < len(_FENCE_OPEN) and _FENCE_OPEN.startswith(rest):
                    self._carry = rest
                    return _UNKNOWN
            return base + at if buffer[at] in "{[" else _OFF
