"""`BM25Retriever`: keyword search over the user's documents, scored by the `bm25s` library.

Documents are split into chunks (`Splitter`), tokenized by `bm25s.tokenize` (lowercased words of two
or more letters, English stop words removed, a light English plural stemmer, no extra dependency) and
indexed by `bm25s.BM25` (Lucene's BM25 variant, k1=1.5, b=0.75). A query is tokenized the same way and
scored by `BM25.retrieve`.

An index is never changed once built: `add` builds a new one over every chunk and swaps it in, so
queries read whichever index was current when they began and need no lock (bm25s only reads its
arrays while retrieving, and `bm25s.tokenize` keeps no state). Builds are serialized by a
`threading.Lock` that the event loop never waits for: a build takes it on the loop only if it is free
at once, else in a worker thread. Large builds and queries over large indexes run in a worker thread
(`anyio.to_thread.run_sync`), which a cancellation lets finish: a build is swapped in whole or not
at all.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import anyio.lowlevel
import anyio.to_thread

from .._errors import ConfigurationError
from ._splitter import Document, Splitter
from ._types import Content
from ._vectors import require, run_writing

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from ._types import Query

__all__ = ["BM25Retriever"]

# Builds of more chunks than this, and queries over more, run in a worker thread (bench_rag.py:
# building costs about 100 µs a chunk of 60 words; a query over 10,000 chunks 0.2 ms at the median
# and 4 to 5 ms for the most frequent words; a hop to a worker thread costs about 0.1 ms).
_BUILD_IN_THREAD = 64
_QUERY_IN_THREAD = 5_000


def plural_stemmer(words: list[str]) -> list[str]:
    """Harman's S-stemmer (1991): English plurals to singular (`queries` → `query`, `horses` →
    `horse`, `cats` → `cat`), leaving `-us`, `-ss` and short words alone. Light and without
    dependencies; for a full stemmer pass e.g. PyStemmer's `Stemmer.Stemmer("english").stemWords`."""
    return [_singular(word) for word in words]


def _singular(word: str) -> str:
    if len(word) > 3 and word.endswith("ies") and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if len(word) > 2 and word.endswith("s") and not word.endswith(("us", "ss")):
        return word[:-1]
    return word


@dataclasses.dataclass(frozen=True, slots=True)
class _Index:
    contents: tuple[Content, ...]
    tokens: tuple[list[str], ...]  # of each content, kept so that `add` tokenizes only new ones
    bm25: Any  # bm25s.BM25, or None when no chunk has a single token
    vocabulary: Collection[str]


_EMPTY_INDEX = _Index((), (), None, frozenset())


class BM25Retriever:
    """A `Retriever` that ranks chunks of `documents` by BM25 for the query's words.

    `documents` are `Document`s or strings, split by `splitter`, or `Content`s, indexed as they are
    (their `id` and `metadata` kept). `retrieve` returns at most `k` chunks, best first, each with its
    BM25 `score`; chunks that share no word with the query (score 0) and, with `min_score`, chunks
    scoring below it are left out. An empty index, or a query of stop words only, finds nothing (`[]`).

    `stopwords` is a language code bm25s knows (`"en"`, `"de"`, `"fr"`, ...), a collection of words,
    or `None`; `stemmer` maps a list of words to their stems (`None`: no stemming). `in_thread`: `None`
    moves large builds and queries to a worker thread, `True` always, `False` never.

    Building in the constructor blocks the caller: in async code, build with `await add(...)`.
    Raises `ImportError` without bm25s (`pip install 'agentrt[rag]'`), `ConfigurationError` for a
    `k` below 1 or unknown `stopwords`.
    """

    def __init__(
        self,
        documents: Iterable[Document | Content | str] = (),
        *,
        k: int = 4,
        min_score: float | None = None,
        splitter: Splitter | None = None,
        stopwords: str | Collection[str] | None = "en",
        stemmer: Callable[[list[str]], list[str]] | None = plural_stemmer,
        k1: float = 1.5,
        b: float = 0.75,
        in_thread: bool | None = None,
    ) -> None:
        self._bm25s = _import_bm25s()
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigurationError(f"BM25Retriever: k must be at least 1, not {k}")
        if k1 < 0 or not 0 <= b <= 1:
            raise ConfigurationError(
                f"BM25Retriever: k1 must be at least 0 and b within [0, 1], not {k1}, {b}"
            )
        self.k = k
        self.min_score = min_score
        self._splitter = splitter if splitter is not None else Splitter()
        self._stopwords = stopwords if stopwords is None or isinstance(stopwords, str) else list(stopwords)
        self._stemmer = stemmer
        self._k1, self._b = k1, b
        self._in_thread = in_thread
        try:
            self._tokenize(["stop words check"])
        except ValueError as exc:
            raise ConfigurationError(f"BM25Retriever: stopwords: {exc}") from exc
        self._writing = threading.Lock()
        self._index = _EMPTY_INDEX
        contents = self._splitter.split(documents)
        if contents:
            self._index = self._build(_EMPTY_INDEX, contents)

    def __len__(self) -> int:
        """The number of chunks indexed."""
        return len(self._index.contents)

    async def add(self, documents: Iterable[Document | Content | str]) -> None:
        """Split `documents` and index them with the chunks already indexed; a chunk with the `key()`
        of an indexed one replaces it. The index is rebuilt over every chunk (only new ones are
        tokenized again): add in bulk rather than one document at a time. Queries running meanwhile
        use the index they began with. Large builds run in a worker thread; cancelled, a build that
        started finishes and is kept."""
        documents = list(documents)

        def build() -> None:
            contents = self._splitter.split(documents)
            if contents:
                self._index = self._build(self._index, contents)

        size = len(self._index.contents) + len(documents)
        await anyio.lowlevel.checkpoint()
        await run_writing(self._writing, build, in_thread=self._thread(size, _BUILD_IN_THREAD))

    async def retrieve(self, query: Query) -> list[Content]:
        """The best `k` chunks for `query.text` (see the class)."""
        index = self._index
        if self._thread(len(index.contents), _QUERY_IN_THREAD):
            return await anyio.to_thread.run_sync(self._search, index, query.text)
        await anyio.lowlevel.checkpoint()
        return self._search(index, query.text)

    def _thread(self, size: int, threshold: int) -> bool:
        return self._in_thread if self._in_thread is not None else size > threshold

    def _search(self, index: _Index, text: str) -> list[Content]:
        tokens = [token for token in self._tokenize([text])[0] if token in index.vocabulary]
        if not tokens:
            return []
        found = index.bm25.retrieve(
            [tokens],
            k=min(self.k, len(index.contents)),
            show_progress=False,
            n_threads=0,
            backend_selection="numpy",
        )
        results = []
        for position, score in zip(found.documents[0].tolist(), found.scores[0].tolist(), strict=True):
            if score <= 0.0 or (self.min_score is not None and score < self.min_score):
                continue
            results.append(dataclasses.replace(index.contents[position], score=score))
        return results

    def _tokenize(self, texts: Sequence[str]) -> list[list[str]]:
        tokens: list[list[str]] = self._bm25s.tokenize(
            list(texts),
            stopwords=self._stopwords,
            stemmer=self._stemmer,
            return_ids=False,
            show_progress=False,
        )
        return tokens

    def _build(self, index: _Index, contents: Sequence[Content]) -> _Index:
        """A new index of `index`'s chunks and `contents`; a content whose `key()` is indexed already
        takes its place."""
        all_contents, all_tokens = list(index.contents), list(index.tokens)
        positions = {content.key(): i for i, content in enumerate(all_contents)}
        for content, tokens in zip(contents, self._tokenize([c.text for c in contents]), strict=True):
            position = positions.setdefault(content.key(), len(all_contents))
            if position == len(all_contents):
                all_contents.append(content)
                all_tokens.append(tokens)
            else:
                all_contents[position], all_tokens[position] = content, tokens
        if not any(all_tokens):
            # bm25s cannot index a corpus without a single token; such an index finds nothing.
            return _Index(tuple(all_contents), tuple(all_tokens), None, frozenset())
        bm25 = self._bm25s.BM25(k1=self._k1, b=self._b, backend="numpy", csc_backend="numpy")
        bm25.index(all_tokens, show_progress=False)
        return _Index(tuple(all_contents), tuple(all_tokens), bm25, frozenset(bm25.vocab_dict))


def _import_bm25s() -> Any:
    require("numpy", "BM25Retriever")
    bm25s = require("bm25s", "BM25Retriever")
    # bm25s sets its own logger to DEBUG when imported, so that an application's root handlers print
    # a line for every index it builds; give the level back to the application's configuration.
    logger = logging.getLogger("bm25s")
    if logger.level == logging.DEBUG:
        logger.setLevel(logging.NOTSET)
    return bm25s
