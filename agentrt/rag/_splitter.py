"""`Splitter`: documents into chunks a retriever indexes, by paragraphs, then sentences, then words.

A document's text is first normalized (CRLF and lone CR become LF). It is then cut into *units*, each
at most `max_chars` long: with `by="paragraph"`, a paragraph (text between blank lines) when it fits,
else its sentences, else a sentence's words, else a word's `max_chars`-long pieces; with
`by="sentence"`, sentences (then words, then pieces) throughout. Units are packed greedily into chunks
of at most `max_chars` characters, from the first non-blank character of a unit to the last of the
last unit, so a chunk ends on the coarsest boundary that fits. Each chunk after the first starts with
up to `overlap` characters of the previous one, from the start of a word, so that a fact cut by a
chunk boundary is whole in one of the two.

Chunk ids are `"<document id>#<chunk index>"`; a document's id is its own `id`, or else the first 16
hex digits of the SHA-256 of its text, so that the same text gets the same ids in every process.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from .._errors import ConfigurationError
from ._types import Content

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["Document", "Splitter"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})

# A blank line (possibly with spaces) separates paragraphs.
_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n\s*")
# A sentence ends after terminal punctuation (and a closing quote or bracket) followed by whitespace,
# after a CJK full stop, or at a line break.
_SENTENCE_BREAK = re.compile(
    r"(?:(?<=[.!?\u2026])|(?<=[.!?\u2026][\"'\u201d\u2019)\]]))\s+|(?<=[\u3002\uff01\uff1f])\s*|\n\s*"
)
_WORD = re.compile(r"\S+")

Span = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Document:
    """A text to index, with the `metadata` its chunks carry (e.g. `{"source": "faq.md"}`) and an
    optional `id` that names its chunks (default: a hash of the text)."""

    text: str
    metadata: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    id: str | None = None

    def document_id(self) -> str:
        """`id`, or the first 16 hex digits of the SHA-256 of the text."""
        if self.id is not None:
            return self.id
        return hashlib.sha256(self.text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Splitter:
    """Splits documents into chunks of at most `max_chars` characters that overlap by up to
    `overlap` characters; `by` is the coarsest boundary a chunk prefers to end on.

    Raises `ConfigurationError` when built with `max_chars < 1`, a negative `overlap`, an `overlap`
    not smaller than `max_chars`, or an unknown `by`."""

    max_chars: int = 1000
    overlap: int = 100
    by: Literal["paragraph", "sentence"] = "paragraph"

    def __post_init__(self) -> None:
        if self.max_chars < 1:
            raise ConfigurationError(f"Splitter: max_chars must be at least 1, not {self.max_chars}")
        if self.overlap < 0 or self.overlap >= self.max_chars:
            raise ConfigurationError(
                f"Splitter: overlap must be at least 0 and smaller than max_chars ({self.max_chars}),"
                f" not {self.overlap}"
            )
        if self.by not in ("paragraph", "sentence"):
            raise ConfigurationError(f"Splitter: by must be 'paragraph' or 'sentence', not {self.by!r}")

    def split(self, documents: Iterable[Document | Content | str]) -> list[Content]:
        """The chunks of every document, in order: `Content` with the chunk's text, the document's
        metadata plus `document` (its id) and `chunk` (the chunk's index in it), and the id
        `"<document id>#<chunk index>"`. A document without text gives no chunks. A `str` is a
        document without metadata; a `Content` is a chunk already, kept as it is."""
        chunks: list[Content] = []
        for document in documents:
            if isinstance(document, Content):
                chunks.append(document)
                continue
            if isinstance(document, str):
                document = Document(document)
            text = normalize(document.text)
            document_id = document.document_id()
            for index, (start, end) in enumerate(self.spans(text)):
                metadata = MappingProxyType({**document.metadata, "document": document_id, "chunk": index})
                chunks.append(Content(text[start:end], metadata, id=f"{document_id}#{index}"))
        return chunks

    def spans(self, text: str) -> list[Span]:
        """Where the chunks of an already normalized `text` are: `(start, end)` offsets, starts and
        ends increasing, each span at most `max_chars` long, beginning and ending on non-blank
        characters, every non-blank character in at least one span."""
        units = list(self._units(text))
        if not units:
            return []
        # Where a chunk may start: a unit's or a word's first character.
        starts = sorted({start for start, _ in units} | {m.start() for m in _WORD.finditer(text)})
        spans: list[Span] = []
        start, end = units[0]
        for unit_start, unit_end in units[1:]:
            if unit_end - start <= self.max_chars:
                end = unit_end
                continue
            spans.append((start, end))
            start = self._overlap_start(starts, spans[-1], unit_start, unit_end)
            end = unit_end
        spans.append((start, end))
        return spans

    def _overlap_start(self, starts: list[int], previous: Span, unit_start: int, unit_end: int) -> int:
        """The first word start within the last `overlap` characters of `previous` (after its own
        start) from which the chunk still fits with the unit that follows; else the unit's start."""
        lowest = max(previous[1] - self.overlap, previous[0] + 1, unit_end - self.max_chars)
        i = bisect.bisect_left(starts, lowest)
        return starts[i] if i < len(starts) and starts[i] < unit_start else unit_start

    def _units(self, text: str) -> Iterable[Span]:
        for paragraph in _pieces(text, _PARAGRAPH_BREAK, 0, len(text)):
            if self.by == "paragraph" and paragraph[1] - paragraph[0] <= self.max_chars:
                yield paragraph
                continue
            for sentence in _pieces(text, _SENTENCE_BREAK, *paragraph):
                if sentence[1] - sentence[0] <= self.max_chars:
                    yield sentence
                    continue
                for word in _WORD.finditer(text, sentence[0], sentence[1]):
                    # A word longer than a chunk is cut into pieces of max_chars characters.
                    for piece in range(word.start(), word.end(), self.max_chars):
                        yield piece, min(piece + self.max_chars, word.end())


def normalize(text: str) -> str:
    """Line breaks as `\\n` (CRLF and lone CR included)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _pieces(text: str, separator: re.Pattern[str], start: int, end: int) -> Iterable[Span]:
    """The spans of `text[start:end]` between matches of `separator`, stripped of blanks, non-empty."""
    position = start
    for match in separator.finditer(text, start, end):
        yield from _stripped(text, position, match.start())
        position = match.end()
    yield from _stripped(text, position, end)


def _stripped(text: str, start: int, end: int) -> Iterable[Span]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if start < end:
        yield start, end
