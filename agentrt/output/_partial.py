"""Partial values of a structured answer as it streams in (what a `PartialStream` yields).

The JSON received so far is read with pydantic-core's partial JSON parser (`from_json(...,
allow_partial=True)`, which drops an unfinished string, number or literal at the end) and validated
with pydantic's partial validation (`experimental_allow_partial`, which drops an unfinished last item);
no partial JSON parser of our own. The text is read only up to the last character after which a value
may have ended (`"`, `,`, `]`, `}`): a number is taken once it is followed by one, never while it may
still grow. So a snapshot only holds values that are final, and each one extends the one before.

Reading costs one pass over the answer so far: it is done only when a chunk may have ended a value,
and, for a long answer, only once it has grown by a sixteenth since the last read, so the total stays
linear in the answer's length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from pydantic import ValidationError
from pydantic_core import from_json

from ._parsers import WRAPPER

if TYPE_CHECKING:
    from pydantic import TypeAdapter

    from ._parsers import TypeParser

__all__ = ["Snapshots"]

_NOTHING: Final = object()
_UNKNOWN: Final = -1  # where the JSON starts is not known yet
_OFF: Final = -2  # no snapshots from this answer (it is not JSON first, or its JSON has ended)


class Snapshots:
    """The partial values of one streamed answer: `feed` it text deltas; `value` is the latest."""

    __slots__ = (
        "_adapter",
        "_boundary",
        "_enabled",
        "_parsed_at",
        "_parts",
        "_raw",
        "_size",
        "_start",
        "_unwrap",
        "value",
    )

    def __init__(self, parser: TypeParser) -> None:
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
        self._raw: Any = _NOTHING
        self.value: Any = _NOTHING

    def feed(self, text: str) -> bool:
        """Add a text delta; whether it gave a new snapshot (then in `value`)."""
        start = self._start
        if start == _OFF:
            return False
        size = self._size
        self._size = size + len(text)
        parts = self._parts
        parts.append(text)
        at = max(text.rfind('"'), text.rfind(","), text.rfind("}"), text.rfind("]"))
        if at < 0:
            return False
        boundary = self._boundary = size + at
        if start == _UNKNOWN:
            whole = "".join(parts)
            self._parts = [whole]
            start = self._start = _json_start(whole)
            if start < 0:
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


def _json_start(text: str) -> int:
    """Where the answer's JSON starts: after a `<think>` block and a fence line, if any;
    `_UNKNOWN` while that cannot be told yet, `_OFF` when the answer starts with prose."""
    at = len(text) - len(text.lstrip())
    if text.startswith("<think>", at):
        end = text.find("</think>", at)
        if end < 0:
            return _UNKNOWN
        at = end + len("</think>")
        at += len(text[at:]) - len(text[at:].lstrip())
    if text.startswith("```", at):
        end = text.find("\n", at)
        if end < 0:
            return _UNKNOWN
        at = end + 1
        at += len(text[at:]) - len(text[at:].lstrip())
    if at >= len(text):
        return _UNKNOWN
    return at if text[at] in "{[" else _OFF
