"""Finding the JSON in an answer, in time linear in its length.

Models without a JSON mode (and models that ignore it) wrap their JSON in prose, code fences and
`<think>` blocks. `candidates(text)` yields the places JSON may be, best first, each at most once:

1. the answer itself, stripped; then, if it has think markers, after the `<think>...</think>`
   blocks it starts with (the markers may be text inside the JSON, so the whole answer is tried
   first, and searched as below after the answer without them);
2. the contents of each fenced block (any language tag), in order;
3. each outermost balanced `{...}` or `[...]` span, in order (braces inside JSON strings do not
   count; an opener that is never closed does not hide the spans after it).

Nothing here backtracks: fences and think blocks are found with `str.find`, spans with one pass over
the structural characters (a `re.finditer` over a character class, which is linear). The spans are
disjoint, so validating each costs, in total, at most the text's length again.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["candidates", "strip_thinking"]

_THINK_OPEN: Final = "<think>"
_THINK_CLOSE: Final = "</think>"
_FENCE: Final = "```"
# Structural characters of JSON spans: runs of openers, runs of closers, quotes and backslashes.
_STRUCTURE: Final = re.compile(r'[{}\[\]"\\][{}\[\]]*')
_CLOSER: Final = {"}": "{", "]": "["}
_OPENERS: Final = re.compile(r"[{\[]+")
_OPENING: Final = frozenset("{[")
_MAX_DEPTH: Final = 256  # deeper than any JSON parser here accepts


def strip_thinking(text: str) -> str:
    """`text` without the `<think>...</think>` blocks it starts with (an unclosed one runs to the
    end), and without the reasoning before a `</think>` that no `<think>` opened (servers whose
    chat template opens the block in the prompt send only its end). Markers after the answer began
    are its text (a JSON string may hold `"<think>"`), as in a streamed answer's partial values."""
    close = text.find(_THINK_CLOSE)
    if close >= 0 and text.rfind(_THINK_OPEN, 0, close) < 0:
        text = text[close + len(_THINK_CLOSE) :]
    while True:
        lead = text.lstrip()
        if not lead.startswith(_THINK_OPEN):
            return text
        end = lead.find(_THINK_CLOSE, len(_THINK_OPEN))
        if end < 0:
            return ""
        text = lead[end + len(_THINK_CLOSE) :]


def _fenced(text: str) -> Iterator[str]:
    """The contents of each complete fenced block, in order (the language tag line dropped)."""
    at = 0
    while True:
        start = text.find(_FENCE, at)
        if start < 0:
            return
        line_end = text.find("\n", start + 3)
        if line_end < 0:
            return
        end = text.find(_FENCE, line_end)
        if end < 0:
            return  # an unclosed fence: its contents are still found as spans
        yield text[line_end + 1 : end].strip()
        at = end + 3


def _spans(text: str) -> Iterator[str]:
    """The outermost balanced `{...}`/`[...]` spans, in order."""
    kinds: list[str] = []  # the openers on the stack ...
    starts: list[int] = []  # ... and where they are
    open_count = {"{": 0, "[": 0}  # openers of each kind on the stack
    # Spans closed so far that no span closing later has enclosed yet, (start, end) in order: a span
    # that closes encloses the last ones here that start after it.
    outermost: list[tuple[int, int]] = []
    in_string = False
    escaped_at = -1
    for match in _STRUCTURE.finditer(text):
        run = match.group()  # a structural character, then any brackets right after it
        position = match.start()
        first = run[0]
        if first == '"' or first == "\\":
            if not in_string:
                in_string = first == '"' and bool(kinds)  # quotes in the prose are not strings
            elif first == "\\":
                if escaped_at != position:  # not itself escaped
                    escaped_at = position + 1
            elif escaped_at != position:
                in_string = False
            if in_string or len(run) == 1:
                continue
            run = run[1:]
            position += 1
        elif in_string:
            continue
        offset = -1
        size = len(run)
        while offset + 1 < size:
            offset += 1
            char = run[offset]
            if not kinds and (char == "}" or char == "]"):
                # Nothing is open: closers up to the next opener close nothing.
                following = [at for at in (run.find("{", offset), run.find("[", offset)) if at >= 0]
                if not following:
                    break
                offset = min(following)
                char = run[offset]
            if char == "{" or char == "[":
                if len(kinds) < _MAX_DEPTH and run[offset + 1 : offset + 2] not in _OPENING:
                    kinds.append(char)  # one opener
                    starts.append(position + offset)
                    open_count[char] += 1
                    continue
                # The openers from here on, pushed at once: past the depth limit, what is open
                # below is stray (nothing that deep is JSON a parser accepts).
                end = _OPENERS.match(run, offset).end()  # type: ignore[union-attr]
                if len(kinds) + end - offset > _MAX_DEPTH:
                    kinds.clear()
                    starts.clear()
                    open_count["{"] = open_count["["] = 0
                    offset = max(offset, end - _MAX_DEPTH)
                for at in range(offset, end):
                    opener = run[at]
                    kinds.append(opener)
                    starts.append(position + at)
                    open_count[opener] += 1
                offset = end - 1
                continue
            opener = _CLOSER[char]
            if not open_count[opener]:
                continue  # a stray closer
            # Unwind to the matching opener: openers left unclosed inside it were stray. Each
            # opener is unwound once, so all of this is linear.
            while True:
                kind = kinds.pop()
                start = starts.pop()
                open_count[kind] -= 1
                if kind == opener:
                    break
            if kinds:  # openers around it may still close: it may not be outermost
                while outermost and outermost[-1][0] > start:
                    outermost.pop()
                outermost.append((start, position + offset + 1))
                continue
            # Nothing is open: the spans kept so far lie inside this one or before it, and are final.
            for kept, end in outermost:
                if kept < start:
                    yield text[kept:end]
            outermost.clear()
            yield text[start : position + offset + 1]
    for start, end in outermost:
        yield text[start:end]


def candidates(text: str) -> Iterator[str]:
    """Where the JSON of an answer may be, best first, each distinct candidate once."""
    answer = strip_thinking(text).strip()
    whole = text.strip()
    # Think markers may be text inside the JSON itself (`{"tag": "<think>"}`): then the whole
    # answer is searched too, after the answer without them (twice the work, still linear).
    texts = (answer,) if whole == answer else (whole, answer)
    seen: set[str] = set()
    for source in texts:
        if source not in seen:
            seen.add(source)
            yield source
    for source in texts[::-1]:
        for block in _fenced(source):
            if block not in seen:
                seen.add(block)
                yield block
        for span in _spans(source):
            if span not in seen:
                seen.add(span)
                yield span
