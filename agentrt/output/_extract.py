"""Finding the JSON in an answer, in time linear in its length, in short steps.

Models without a JSON mode (and models that ignore it) wrap their JSON in prose, code fences and
`<think>` blocks. `candidates(text)` yields the places JSON may be, best first, each at most once:

1. the answer itself, stripped; then, if it has think markers, after the `<think>...</think>`
   blocks it starts with (the markers may be text inside the JSON, so the whole answer is tried
   first, and searched as below after the answer without them);
2. the contents of each fenced block (any language tag), in order;
3. each outermost balanced `{...}` or `[...]` span that may be JSON, in order: braces inside JSON
   strings do not count, and a bracket that JSON cannot have there (`{` not followed by `"` or `}`,
   `[` not followed by a value or `]`, a closer of the wrong kind) ends every span open around it,
   while the spans closed inside them are still found.

Reasoning is never the answer: nothing that lies inside a think block is a candidate. (A span that
holds a marker is not inside the block: in JSON, a marker can only be text in a string.)

Nothing here backtracks, and no step reads more than `SLICE` characters: fences and think blocks are
found with `str.find`, spans with regex searches bounded to a slice. A parse in a worker thread holds
the GIL for one such step at a time (Python switches threads between steps, not inside one), so the
event loop is never stopped for long, and text dense in brackets costs one search per slice
wherever nothing is open. The spans are disjoint, so validating each costs, in total, at most the
text's length again.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from itertools import chain
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = [
    "SLICE",
    "answer_start",
    "array_chunks",
    "candidates",
    "span_end",
    "strip_thinking",
    "trim",
]

SLICE: Final = 1 << 15
"""The most characters one search reads (about 0.1 ms of holding the GIL)."""
_THINK_OPEN: Final = "<think>"
_THINK_CLOSE: Final = "</think>"
_FENCE: Final = "```"
# A span with no bracket inside but in strings, matched whole (possessive: nothing backtracks).
_BODY: Final = r'(?:[^{}\[\]"\\]++|"(?:[^"\\]++|\\.)*+")*+'
_FLAT_SOURCE: Final = r'\{(?=\s*+["}])' + _BODY + r"\}|\[(?=\s*+[-\"0-9\]tfn])" + _BODY + r"\]"
_FLAT: Final = re.compile("(?s)" + _FLAT_SOURCE)
# A JSON array's items that hold no array: whole items and their commas, and the last item and the end.
_ITEM: Final = "(?:" + _FLAT_SOURCE + r'|"(?:[^"\\]++|\\.)*+"|[-+0-9.eE]++|true|false|null)'
_ITEMS: Final = re.compile(r"(?s)(?:\s*+" + _ITEM + r"\s*+,)*+")
_LAST_ITEM: Final = re.compile(r"(?s)\s*+(?:" + _ITEM + r"\s*+)?\]\s*+")
# Where nothing is open, what cannot change that: flat spans, text without openers, openers JSON
# cannot follow (seen to be followed by something, so a slice's end decides nothing).
_RUN: Final = re.compile(
    "(?s)(?:" + _FLAT_SOURCE + r'|[^{\[]++|\{(?=\s*+[^\s"}])|\[(?=\s*+[^\s"\-0-9\]tfn{\[]))*+'
)
_FLATS: Final = re.compile("(?s)(" + _FLAT_SOURCE + ")")
# Inside a span: text without brackets, and whole strings.
_SKIP: Final = re.compile(r'(?s)(?:[^{}\[\]"]++|"(?:[^"\\]++|\\.)*+")*+')
_STRING: Final = re.compile(r'["\\]')  # inside a string that a slice's end cut
_OPENERS: Final = re.compile(r"[{\[]+")
_CLOSER: Final = {"}": "{", "]": "["}
_ALONE: Final = {"{": frozenset('"}'), "[": frozenset('"-0123456789]tfn')}  # may follow, and no opener
_FIRST: Final = {"{": frozenset('"}'), "[": frozenset('"-0123456789{[]tfn')}  # what may follow an opener
_MAX_DEPTH: Final = 256  # deeper than any JSON parser here accepts
_SEEN_MAX: Final = 1 << 14  # candidates remembered at most (then once more, at worst, each)
_DEDUPE: Final = 1 << 12  # candidates up to this long are compared by their text, longer ones by place


def _find(text: str, needle: str, start: int, end: int) -> int:
    """`text.find(needle, start, end)`, a slice at a time."""
    while start < end:
        stop = min(start + SLICE, end)
        found = text.find(needle, start, min(stop + len(needle) - 1, end))
        if found >= 0:
            return found
        start = stop
    return -1


def array_chunks(array: str) -> Iterator[str] | None:
    """A long JSON array `[...]` as arrays of its items, each at most about `SLICE` characters, in
    order (so each can be validated by one short call); `None` when an item holds an array or an
    object with one inside, or is longer than a slice. That the chunks are JSON is not checked."""
    if array[:1] != "[":
        return None
    at, end, chunks = 1, len(array), []
    while True:
        stop = _ITEMS.match(array, at, min(at + SLICE, end)).end()  # type: ignore[union-attr]
        if stop == at:
            if end - at > SLICE or not _LAST_ITEM.fullmatch(array, at):
                return None
            chunks.append("[" + array[at:])
            return iter(chunks)
        chunks.append("[" + array[at : stop - 1] + "]")  # without the comma
        at = stop


def span_end(text: str) -> int:
    """Where the balanced span that `text` starts with ends (-1: it starts with none, or with one
    that cannot be JSON). Read a slice at a time, like the candidates."""
    for place in _spans(text, 0, len(text)):
        if isinstance(place, Batch):
            flat = _FLAT.match(text, 0, SLICE) if place.start == 0 else None
            return flat.end() if flat is not None else -1
        return place[1] if place[0] == 0 else -1
    return -1


def _thinking(text: str) -> list[tuple[int, int]]:
    """The think blocks the answer starts with, as (start, end) in `text`: the reasoning before a
    `</think>` that no `<think>` opened (servers whose chat template opens the block in the prompt
    send only its end), then each `<think>...</think>` block after white space (an unclosed one runs
    to the end). Markers after the answer began are its text (a JSON string may hold `"<think>"`)."""
    blocks = []
    at = 0
    close = _find(text, _THINK_CLOSE, 0, len(text))
    if close >= 0 and _find(text, _THINK_OPEN, 0, close) < 0:
        at = close + len(_THINK_CLOSE)
        blocks.append((0, at))
    while True:
        lead = _skip_space(text, at, len(text))
        if not text.startswith(_THINK_OPEN, lead):
            return blocks
        end = _find(text, _THINK_CLOSE, lead + len(_THINK_OPEN), len(text))
        at = len(text) if end < 0 else end + len(_THINK_CLOSE)
        blocks.append((lead, at))
        if end < 0:
            return blocks


def answer_start(text: str) -> int:
    """Where the answer begins: after the think blocks it starts with (see `_thinking`)."""
    blocks = _thinking(text)
    return blocks[-1][1] if blocks else 0


def strip_thinking(text: str) -> str:
    """`text` without the think blocks it starts with (an unclosed one runs to the end), and
    without the reasoning before a `</think>` that no `<think>` opened."""
    return text[answer_start(text) :]


def _skip_space(text: str, at: int, end: int) -> int:
    """The first position from `at` (up to `end`) that is not white space, a slice at a time."""
    if at < end and not text[at].isspace():
        return at  # the usual case, without copying a slice
    while at < end:
        piece = text[at : min(at + SLICE, end)]
        rest = len(piece.lstrip())
        if rest:
            return at + len(piece) - rest
        at += len(piece)
    return end


def trim(text: str, start: int, end: int) -> tuple[int, int]:
    """`text[start:end]` without white space around it, as a place (what `str.strip` keeps)."""
    start = _skip_space(text, start, end)
    while end > start:
        piece = text[max(start, end - SLICE) : end]
        rest = len(piece.rstrip())
        if rest:
            return start, end - len(piece) + rest
        end -= len(piece)
    return start, start


def _fenced(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    """Where the contents of each complete fenced block are (the language tag line dropped)."""
    at = start
    while True:
        opened = _find(text, _FENCE, at, end)
        if opened < 0:
            return
        line_end = _find(text, "\n", opened + 3, end)
        if line_end < 0:
            return
        closed = _find(text, _FENCE, line_end, end)
        if closed < 0:
            return  # an unclosed fence: its contents are still found as spans
        yield trim(text, line_end + 1, closed)
        at = closed + 3


def _may_open(text: str, at: int, end: int) -> bool:
    """Whether JSON may follow the opener at `at`: what comes after it, past white space."""
    after = _skip_space(text, at + 1, end)
    return after < end and text[after] in _FIRST[text[at]]


class Batch:
    """Flat spans that `_spans` found where nothing was open, `texts` in order, between `start`
    and `end`: matched by one search (`findall`), never one by one."""

    __slots__ = ("end", "start", "texts")

    def __init__(self, start: int, end: int, texts: list[str]) -> None:
        self.start, self.end, self.texts = start, end, texts


def _spans(text: str, start: int, end: int) -> Iterator[tuple[int, int] | Batch]:
    """Where the outermost balanced spans of `text[start:end]` that may be JSON are, in order.

    One pass; each step is one regex search or match bounded to `SLICE` characters. Where nothing
    is open, flat spans (no bracket inside but in strings) and prose are read a slice at a time, and
    given as a `Batch`; inside a span, text and whole strings are skipped by one match. An opener or
    closer that JSON cannot have where it is ends every span open around it (the openers pushed are
    dropped at once, so all of this stays linear)."""
    stack: list[int] = []  # where the open openers are
    # Spans closed inside what is open, outermost so far, in order: final once what encloses them
    # can no longer be JSON, dropped when it closes.
    held: list[tuple[int, int]] = []
    in_string = False
    run_match, skip_match, string_search = _RUN.match, _SKIP.match, _STRING.search
    flat_match, flats = _FLAT.match, _FLATS.findall
    at = start
    while at < end:
        limit = at + SLICE if at + SLICE < end else end
        if not stack:
            stop = run_match(text, at, limit).end()  # type: ignore[union-attr]
            if stop > at:
                found = flats(text, at, stop)
                if found:
                    yield Batch(at, stop, found)
                at = stop
                continue
            char = text[at]  # an opener JSON may follow, not flat, or one at the slice's end
        elif in_string:
            found_quote = string_search(text, at, limit)
            if found_quote is None:
                at = limit
                continue
            at = found_quote.end()
            if text[at - 1] == "\\":
                at += 1  # the escaped character, whatever it is
            else:
                in_string = False
            continue
        else:
            at = skip_match(text, at, limit).end()  # type: ignore[union-attr]
            if at >= limit:
                continue
            char = text[at]
            if char == '"':  # a string the slice's end cut
                in_string = True
                at += 1
                continue
        if char == "{" or char == "[":
            after = text[at + 1] if at + 1 < end else ""
            flat = None if after == "[" or after == "{" else flat_match(text, at, limit)
            if flat is not None:  # a span with no span inside, closed
                if stack:
                    held.append((at, flat.end()))  # inside what is open: held, like any span closed
                else:
                    yield at, flat.end()
                at = flat.end()
                continue
            if after in _ALONE[char] and after and len(stack) < _MAX_DEPTH:
                stack.append(at)  # one opener, a value or its end after it
                at += 1
            else:
                at, final = _open(text, at, end, stack, held)
                yield from final
            continue
        # A closer, with something open.
        opened = stack.pop()
        at += 1
        if text[opened] != _CLOSER[char]:
            yield from _drop(stack, held)
            continue
        while held and held[-1][0] > opened:
            held.pop()
        if stack:
            held.append((opened, at))
        else:
            yield opened, at
    yield from held


def _open(
    text: str, at: int, end: int, stack: list[int], held: list[tuple[int, int]]
) -> tuple[int, list[tuple[int, int]]]:
    """Push the run of openers at `at`: where the scan goes on, and the spans that became final.
    Inside a run each opener is followed by an opener, which only "[" may be; the last one's
    follower is looked at."""
    run_end = _OPENERS.match(text, at, min(at + SLICE, end)).end()  # type: ignore[union-attr]
    if not _may_open(text, run_end - 1, end):
        return run_end, _drop(stack, held)  # what is open holds a bracket JSON cannot have
    final: list[tuple[int, int]] = []
    last_brace = text.rfind("{", at, run_end - 1)
    if last_brace >= 0:
        final = _drop(stack, held)
        at = last_brace + 1
    if len(stack) + run_end - at > _MAX_DEPTH:
        final += _drop(stack, held)  # nothing that deep is JSON a parser accepts
        at = max(at, run_end - _MAX_DEPTH)
    stack.extend(range(at, run_end))
    return run_end, final


def _drop(stack: list[int], held: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Give up what is open (it cannot be JSON): the spans closed inside it are final."""
    stack.clear()
    final = held[:]
    held.clear()
    return final


def candidates(text: str) -> Iterator[str]:
    """Where the JSON of an answer may be, best first, each distinct candidate once."""
    blocks = _thinking(text)
    begin = blocks[-1][1] if blocks else 0
    whole = trim(text, 0, len(text))
    answer = trim(text, begin, len(text))
    # Short candidates are told apart by their text (a thousand `{"a": 1}` are validated once), long
    # ones by their place (hashing 10 MB would hold the GIL for milliseconds).
    seen: set[object] = set()

    def new(place: tuple[int, int]) -> bool:
        key: object = text[place[0] : place[1]] if place[1] - place[0] <= _DEDUPE else place
        if key in seen:
            return False
        seen.add(key)
        return True

    if whole != answer and new(whole):
        yield text[whole[0] : whole[1]]
    if new(answer):
        yield text[answer[0] : answer[1]]
    sources: tuple[tuple[int, int], ...]
    if not blocks:
        sources = ((0, len(text)),)
    else:
        # Think markers may be text inside the JSON itself (`{"tag": "<think>"}`): then the whole
        # answer is searched too, after the answer without them (twice the work, still linear).
        sources = ((begin, len(text)), (0, len(text)))
    starts = [block[0] for block in blocks]
    for start, end in sources:
        for place in chain(_fenced(text, start, end), _spans(text, start, end)):
            if isinstance(place, Batch):
                batch = place
                if not blocks or not _meets(blocks, batch.start, batch.end):
                    # Told apart in C, in order (a slice of "{}{}{}..." is one candidate).
                    if len(seen) > _SEEN_MAX:
                        seen.clear()  # growing a set of a million strings holds the GIL for long
                    for span in dict.fromkeys(batch.texts):
                        if span not in seen:
                            seen.add(span)
                            yield span
                    continue
                places = [found.span() for found in _FLAT.finditer(text, batch.start, batch.end)]
            else:
                places = [place]
            for found_place in places:
                if blocks and _inside(blocks, starts, found_place):
                    continue  # reasoning, never the answer
                if new(found_place):
                    yield text[found_place[0] : found_place[1]]


def _meets(blocks: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether `text[start:end]` meets a think block."""
    return any(block_start < end and start < block_end for block_start, block_end in blocks)


def _inside(blocks: list[tuple[int, int]], starts: list[int], place: tuple[int, int]) -> bool:
    """Whether `place` lies within one think block (holding none of its markers)."""
    index = bisect_right(starts, place[0]) - 1
    return index >= 0 and place[1] <= blocks[index][1]
