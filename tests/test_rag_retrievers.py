"""The embedded retrievers of agentrt.rag: `Splitter`, `BM25Retriever`, `InMemoryVectorIndex`,
`SQLiteVectorIndex` and `EmbeddingRetriever`.

The corpus is inline. The embedding model is a fake: hashed bag-of-words vectors (deterministic,
similar texts share words), that records its calls and can be held inside `embed` to cancel it there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import logging
import re
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt._errors import ConfigurationError
from agentrt.rag._bm25 import BM25Retriever, plural_stemmer
from agentrt.rag._splitter import Document, Splitter, normalize
from agentrt.rag._sqlite_vectors import SQLiteVectorIndex
from agentrt.rag._types import Content, Query, Retriever
from agentrt.rag._vectors import EmbeddingRetriever, InMemoryVectorIndex, Rows, VectorIndex

CORPUS = [
    Document(
        "Refunds are paid to the original card within 14 days of the return reaching our warehouse.\n\n"
        "Gift cards cannot be refunded.",
        {"source": "refunds.md"},
    ),
    Document(
        "Parcels to Europe travel 3 to 5 working days. Express parcels arrive the next morning.",
        {"source": "shipping.md"},
    ),
    Document(
        "Small pets travel free in a closed basket. Larger dogs need a muzzle and a ticket.",
        {"source": "pets.md"},
    ),
    Document(
        "The onboard wifi network is called TrainNet; the password is printed on your seat reservation.",
        {"source": "wifi.md"},
    ),
    Document(
        "Bicycles ride in the bicycle carriage at the front of the train; folding bicycles count as luggage.",
        {"source": "bicycles.md"},
        id="bikes",
    ),
]

QUESTIONS = {
    "How many days until my refund is paid?": "refunds.md",
    "What is the wifi password?": "wifi.md",
    "Can I take my dog on board?": "pets.md",
    "Where do bicycles go?": "bicycles.md",
    "How long do parcels to Europe take?": "shipping.md",
}


def sources(contents: Sequence[Content]) -> list[str]:
    return [content.metadata["source"] for content in contents]


def ranking(contents: Sequence[Content]) -> list[tuple[str | None, float]]:
    return [(content.id, round(content.score or 0.0, 5)) for content in contents]


# -- the splitter

texts = st.lists(
    st.one_of(
        st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12),
        st.sampled_from(
            [
                "\n",
                "\n\n",
                "\r\n",
                "\r\n\r\n",
                "\r",
                " ",
                ". ",
                "! ",
                "。",
                "\t",
                "word",
                "x" * 40,
                '." ',
                "!) ",
                "?\u201d ",
            ]
        ),
    ),
    max_size=40,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(
    text=texts,
    max_chars=st.integers(1, 50),
    overlap_fraction=st.floats(0, 0.99),
    by=st.sampled_from(["paragraph", "sentence"]),
)
def test_chunks_fit_cover_the_text_in_order_and_overlap_as_configured(
    text: str, max_chars: int, overlap_fraction: float, by: Any
) -> None:
    """Every chunk is at most `max_chars` long (a word longer than that is cut into pieces, so there
    is no exception), starts and ends on non-blank characters, the chunks cover every non-blank
    character in order, and each overlaps the previous one by at most `overlap` characters."""
    overlap = int(overlap_fraction * max_chars)
    splitter = Splitter(max_chars=max_chars, overlap=overlap, by=by)
    normalized = normalize(text)
    spans = splitter.spans(normalized)
    covered = [False] * len(normalized)
    for start, end in spans:
        assert 0 < end - start <= max_chars
        assert not normalized[start].isspace() and not normalized[end - 1].isspace()
        for i in range(start, end):
            covered[i] = True
    assert all(covered[i] for i, char in enumerate(normalized) if not char.isspace())
    for (start, end), (next_start, next_end) in itertools.pairwise(spans):
        assert start < next_start and end < next_end
        assert next_start >= end - overlap  # shares at most `overlap` characters
        if overlap == 0:
            assert next_start >= end
    chunks = splitter.split([Document(text, {"source": "t"}, id="doc")])
    assert [chunk.text for chunk in chunks] == [normalized[start:end] for start, end in spans]
    assert [chunk.id for chunk in chunks] == [f"doc#{i}" for i in range(len(spans))]
    assert [dict(chunk.metadata) for chunk in chunks] == [
        {"source": "t", "document": "doc", "chunk": i} for i in range(len(spans))
    ]


def test_overlap_starts_at_a_word_of_the_previous_chunk() -> None:
    splitter = Splitter(max_chars=15, overlap=6, by="sentence")
    chunks = splitter.split(["one two three four five six seven"])
    assert [chunk.text for chunk in chunks] == ["one two three", "three four five", "five six seven"]
    no_overlap = Splitter(max_chars=15, overlap=0, by="sentence").split(["one two three four five six seven"])
    assert [chunk.text for chunk in no_overlap] == ["one two three", "four five six", "seven"]


def test_chunks_end_on_paragraphs_then_sentences() -> None:
    text = "Alpha one. Alpha two.\n\nBeta one. Beta two. Beta three.\n\nGamma."
    by_paragraph = Splitter(max_chars=40, overlap=0).split([text])
    assert [chunk.text for chunk in by_paragraph] == [
        "Alpha one. Alpha two.",
        "Beta one. Beta two. Beta three.\n\nGamma.",
    ]
    by_sentence = Splitter(max_chars=40, overlap=0, by="sentence").split([text])
    assert [chunk.text for chunk in by_sentence] == [
        "Alpha one. Alpha two.\n\nBeta one.",
        "Beta two. Beta three.\n\nGamma.",
    ]
    # A paragraph too long for a chunk falls back to its sentences, a sentence to its words.
    long = "First sentence is here. " + "word " * 12
    assert [chunk.text for chunk in Splitter(max_chars=25, overlap=0).split([long])] == [
        "First sentence is here.",
        "word word word word word",
        "word word word word word",
        "word word",
    ]


def test_edge_cases_empty_giant_word_crlf_unicode() -> None:
    splitter = Splitter(max_chars=10, overlap=3)
    assert splitter.split(["", "  \r\n\r\n \t ", Document("")]) == []
    assert [chunk.text for chunk in splitter.split(["x" * 25])] == ["x" * 10, "x" * 10, "x" * 5]
    # CRLF and CR are line breaks; "cd" is the overlap.
    assert [chunk.text for chunk in splitter.split(["ab\r\ncd\r\n\r\nef\rgh"])] == ["ab\ncd", "cd\n\nef\ngh"]
    emoji = "🙂" * 12  # one code point each: chunks count characters, not bytes
    assert [chunk.text for chunk in splitter.split([emoji])] == ["🙂" * 10, "🙂" * 2]
    chinese = "你好。世界\uff01今天天气很好。"  # sentences end at CJK full stops, without spaces
    assert [chunk.text for chunk in Splitter(max_chars=7, overlap=0).split([chinese])] == [
        "你好。世界\uff01",
        "今天天气很好。",
    ]


def test_chunk_ids_are_stable_and_metadata_kept() -> None:
    text = "Same text, same ids."
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    first = Splitter().split([Document(text, {"source": "a.md", "chunk": "theirs"})])
    again = Splitter().split([text])
    assert [chunk.id for chunk in first] == [chunk.id for chunk in again] == [f"{digest}#0"]
    assert dict(first[0].metadata) == {"source": "a.md", "document": digest, "chunk": 0}
    with pytest.raises(TypeError):
        first[0].metadata["source"] = "b.md"  # type: ignore[index]


@pytest.mark.parametrize(
    "kwargs", [{"max_chars": 0}, {"overlap": -1}, {"max_chars": 10, "overlap": 10}, {"by": "word"}]
)
def test_splitter_settings_are_checked(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="Splitter"):
        Splitter(**kwargs)


# -- BM25


@pytest.mark.parametrize("in_thread", [False, True])
async def test_bm25_ranks_the_right_chunk_first(in_thread: bool) -> None:
    retriever = BM25Retriever(CORPUS, k=3, in_thread=in_thread)
    for question, source in QUESTIONS.items():
        found = await retriever.retrieve(Query(question))
        assert found, question
        assert sources(found)[0] == source, (question, found)
        assert all(a.score >= b.score > 0 for a, b in itertools.pairwise(found))  # type: ignore[operator]
    # The document's metadata and chunk ids come back.
    (bikes,) = await BM25Retriever(CORPUS, k=1).retrieve(Query("folding bicycles"))
    assert bikes.id == "bikes#0"
    assert dict(bikes.metadata) == {"source": "bicycles.md", "document": "bikes", "chunk": 0}


async def test_bm25_leaves_out_zero_scores_and_below_min_score() -> None:
    retriever = BM25Retriever(CORPUS, k=5)
    # Only one document mentions a muzzle: the others score 0 and are left out.
    assert sources(await retriever.retrieve(Query("muzzle"))) == ["pets.md"]
    assert await retriever.retrieve(Query("the and of")) == []  # stop words only
    assert await retriever.retrieve(Query("zeppelin")) == []  # no word of the corpus
    assert await retriever.retrieve(Query("")) == []
    scores = [content.score for content in await retriever.retrieve(Query("parcels travel days"))]
    assert len(scores) >= 2
    limited = BM25Retriever(CORPUS, k=5, min_score=scores[0])
    assert len(await limited.retrieve(Query("parcels travel days"))) == 1


async def test_bm25_stems_plurals_by_default() -> None:
    assert plural_stemmer(["queries", "horses", "cats", "bus", "glass", "is"]) == [
        "query",
        "horse",
        "cat",
        "bus",
        "glass",
        "is",
    ]
    retriever = BM25Retriever(CORPUS)
    assert sources(await retriever.retrieve(Query("refund")))[:1] == ["refunds.md"]  # "Refunds", "refunded"
    assert await BM25Retriever(CORPUS, stemmer=None).retrieve(Query("muzzles")) == []


async def test_bm25_empty_corpus_finds_nothing_and_add_indexes() -> None:
    retriever = BM25Retriever(k=2)
    assert len(retriever) == 0
    assert await retriever.retrieve(Query("refund")) == []
    stop_words_only = BM25Retriever(["the and of", "a an"])  # bm25s cannot index no tokens at all
    assert await stop_words_only.retrieve(Query("the")) == []
    await retriever.add(CORPUS[:2])
    await retriever.add([Content("Lost property is kept for 30 days.", {"source": "lost.md"}, id="lost")])
    assert len(retriever) == 3
    (found,) = await retriever.retrieve(Query("lost property"))
    assert (found.id, dict(found.metadata)) == ("lost", {"source": "lost.md"})  # a Content is kept as is
    assert sources(await retriever.retrieve(Query("refund paid")))[:1] == ["refunds.md"]
    # A chunk with the key of an indexed one replaces it, as in the vector indexes.
    await retriever.add([Content("Lost umbrellas are kept for 7 days.", {"source": "lost.md"}, id="lost")])
    assert len(retriever) == 3
    assert await retriever.retrieve(Query("lost property")) == await retriever.retrieve(Query("lost"))
    assert [c.text for c in await retriever.retrieve(Query("umbrellas"))] == [
        "Lost umbrellas are kept for 7 days."
    ]


async def test_bm25_prints_nothing_and_leaves_logging_alone(capsys: pytest.CaptureFixture[str]) -> None:
    retriever = BM25Retriever(CORPUS * 3)
    await retriever.add(CORPUS)
    await retriever.retrieve(Query("wifi password"))
    assert capsys.readouterr() == ("", "")
    assert logging.getLogger("bm25s").getEffectiveLevel() > logging.DEBUG


async def asked_at_once(retriever: Retriever, questions: list[str]) -> list[list[tuple[str | None, float]]]:
    """The rankings of `questions` asked by one task each, all at once."""
    answers: dict[int, list[tuple[str | None, float]]] = {}

    async def ask(i: int) -> None:
        answers[i] = ranking(await retriever.retrieve(Query(questions[i])))

    async with anyio.create_task_group() as group:
        for i in range(len(questions)):
            group.start_soon(ask, i)
    return [answers[i] for i in range(len(questions))]


def generated_corpus(size: int) -> list[Document]:
    words = "train ticket refund parcel wifi seat dog bicycle luggage delay station platform".split()
    return [
        Document(" ".join(words[(i * 7 + j * 3) % len(words)] + str(j % (i % 5 + 1)) for j in range(12)))
        for i in range(size)
    ]


@pytest.mark.parametrize("in_thread", [False, True])
async def test_bm25_concurrent_queries_match_sequential_ones(in_thread: bool) -> None:
    retriever = BM25Retriever(generated_corpus(2_000), k=5, in_thread=in_thread)
    questions = [f"refund{i % 3} wifi{i % 4} delay{i % 5}" for i in range(20)]
    sequential = [ranking(await retriever.retrieve(Query(q))) for q in questions]
    assert all(sequential)
    assert await asked_at_once(retriever, questions) == sequential


async def test_bm25_concurrent_adds_all_land() -> None:
    """Builds are serialized: twenty adds at once (in worker threads) keep every chunk."""
    retriever = BM25Retriever(in_thread=True)
    async with anyio.create_task_group() as group:
        for i in range(20):
            group.start_soon(retriever.add, [Content(f"topic{i} text", id=str(i))])
    assert len(retriever) == 20
    for i in range(20):
        assert [c.id for c in await retriever.retrieve(Query(f"topic{i}"))] == [str(i)]


@pytest.mark.parametrize("kwargs", [{"k": 0}, {"stopwords": "klingon"}, {"b": 2.0}])
def test_bm25_settings_are_checked(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="BM25Retriever"):
        BM25Retriever(**kwargs)


# -- vector indexes and the embedding retriever


class HashEmbeddings:
    """Bag-of-words vectors: each lowercased word adds 1 to the dimension its hash picks. With `gate`
    set, `embed` waits for it, after setting `entered`; `events` records what each call did."""

    def __init__(self, dimension: int = 64, *, gate: anyio.Event | None = None) -> None:
        self.dimension = dimension
        self.gate = gate
        self.entered = anyio.Event()
        self.calls: list[list[str]] = []
        self.events: list[str] = []
        self.running = 0
        self.answer: Any = None  # what to return instead, for malformed answers

    @property
    def name(self) -> str:
        return "hash-bow"

    def release(self) -> None:
        assert self.gate is not None
        self.gate.set()

    def vector(self, text: str) -> list[float]:
        vector = [0.0] * self.dimension
        for word in re.findall(r"\w+", text.lower()):
            vector[int(hashlib.sha256(word.encode()).hexdigest(), 16) % self.dimension] += 1.0
        return vector

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        self.running += 1
        try:
            if self.gate is not None:
                self.entered.set()
                await self.gate.wait()
        except BaseException:
            self.events.append("cancelled")
            raise
        finally:
            self.running -= 1
        self.events.append("done")
        if self.answer is not None:
            return self.answer  # type: ignore[no-any-return]
        return [self.vector(text) for text in texts]


@pytest.fixture
async def sqlite_index(tmp_path: Path) -> AsyncIterator[SQLiteVectorIndex]:
    index = SQLiteVectorIndex(tmp_path / "vectors.db")
    yield index
    await index.aclose()


async def test_in_memory_and_sqlite_indexes_rank_alike(sqlite_index: SQLiteVectorIndex) -> None:
    model = HashEmbeddings()
    splitter = Splitter(max_chars=60, overlap=10)
    memory = EmbeddingRetriever(model, k=4, splitter=splitter)
    stored = EmbeddingRetriever(model, sqlite_index, k=4, splitter=splitter)
    chunks = splitter.split(CORPUS)
    # Equal vectors tie: both rank ties by the order contents were first added.
    duplicate = Content(chunks[0].text, {"source": "copy"}, id="!copy")
    for retriever in (memory, stored):
        await retriever.add([*CORPUS, duplicate])
        await retriever.add([dataclasses.replace(chunks[3], text="Express parcels arrive tomorrow.")])
        await retriever.index.delete([chunks[5].key(), "unknown"])
    assert await memory.index.count() == await sqlite_index.count() == len(chunks)
    questions = [*QUESTIONS, chunks[0].text]
    expected = [ranking(await memory.retrieve(Query(question))) for question in questions]
    assert all(len(found) == 4 for found in expected)
    assert [found[0] for found in expected[-1][:2]] == [chunks[0].id, "!copy"]
    assert [ranking(await stored.retrieve(Query(question))) for question in questions] == expected
    await sqlite_index.aclose()  # and as loaded from the file
    assert [ranking(await stored.retrieve(Query(question))) for question in questions] == expected


def test_a_snapshot_is_never_changed_by_later_writes() -> None:
    """What a search holds (in a worker thread, say) stays as it was: appends go past its rows,
    replacements and deletions write new arrays."""
    rows = Rows(None, "test")

    def write(contents: list[Content], vectors: list[list[float]]) -> None:
        rows.upsert(contents, rows.check(contents, vectors))

    write([Content("a", id="a"), Content("b", id="b")], [[1, 0], [0, 1]])
    held = rows.snapshot
    query = rows.query([1.0, 1.0])
    assert query is not None
    before = held.search(query, 5, None)
    write([Content("c", id="c")], [[1, 1]])  # appended
    write([Content("a2", id="a")], [[0, 1]])  # replaced
    assert held.search(query, 5, None) == before
    rows.delete(["b"])
    assert held.search(query, 5, None) == before
    assert [c.text for c in rows.snapshot.contents] == ["a2", "c"]


async def test_sqlite_index_persists_across_reopen(tmp_path: Path) -> None:
    model = HashEmbeddings()
    path = tmp_path / "vectors.db"
    first = SQLiteVectorIndex(path)
    await EmbeddingRetriever(model, first).add(CORPUS)
    before = await EmbeddingRetriever(model, first, k=3).retrieve(Query("wifi password"))
    await first.aclose()
    with contextlib.closing(sqlite3.connect(path)) as raw:  # (a connection's own `with` does not close)
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    again = SQLiteVectorIndex(path)
    try:
        after = await EmbeddingRetriever(model, again, k=3).retrieve(Query("wifi password"))
        assert after == before  # texts, metadata, ids and scores
        assert await again.count() == len(Splitter().split(CORPUS))
        assert isinstance(after[0].metadata["chunk"], int)
    finally:
        again.close()


async def test_dimension_mismatch_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "vectors.db"
    for index in (InMemoryVectorIndex(), SQLiteVectorIndex(path)):
        await index.add([Content("a", id="a")], [[1.0, 0.0, 0.0]])
        with pytest.raises(ValueError, match="holds 3-dimensional vectors, not 2-dimensional"):
            await index.add([Content("b", id="b")], [[1.0, 0.0]])
        with pytest.raises(ValueError, match="holds 3-dimensional vectors, not 4-dimensional"):
            await index.search([1.0, 0.0, 0.0, 0.0], k=1)
        assert await index.count() == 1
        retriever = EmbeddingRetriever(HashEmbeddings(dimension=8), index)
        with pytest.raises(ValueError, match="was the embedding model changed"):
            await retriever.retrieve(Query("a"))
        if isinstance(index, SQLiteVectorIndex):
            await index.aclose()
    with pytest.raises(ValueError, match="holds 3-dimensional vectors, not 5-dimensional"):
        await SQLiteVectorIndex(path, dimension=5).count()
    with pytest.raises(ValueError, match="holds 2-dimensional vectors, not 3-dimensional"):
        await InMemoryVectorIndex(dimension=2).add([Content("a")], [[1.0, 2.0, 3.0]])


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ([[1.0] * 64], "returned 1 vectors for 2 texts"),
        ([[1.0] * 64, [1.0] * 63], "returned vectors of lengths"),
        ([[], []], "returned vectors of lengths"),
        (42, "returned int, not vectors"),
    ],
)
async def test_malformed_embeddings_are_clear_errors_and_store_nothing(answer: Any, message: str) -> None:
    model = HashEmbeddings()
    model.answer = answer
    retriever = EmbeddingRetriever(model)
    with pytest.raises(ValueError, match=f"embedding model 'hash-bow' {message}"):
        await retriever.add(["first text", "second text"])
    assert await retriever.index.count() == 0


async def test_bad_vectors_store_nothing(sqlite_index: SQLiteVectorIndex) -> None:
    for index in (InMemoryVectorIndex(), sqlite_index):
        with pytest.raises(ValueError, match="finite"):
            await index.add([Content("a"), Content("b")], [[1.0, 2.0], [float("nan"), 1.0]])
        with pytest.raises(ValueError, match="2 contents need 2 vectors"):
            await index.add([Content("a"), Content("b")], [[1.0, 2.0]])
        assert await index.count() == 0
    with pytest.raises(ValueError, match="not JSON"):
        await sqlite_index.add([Content("a", {"when": object()})], [[1.0, 2.0]])
    assert await sqlite_index.count() == 0


async def test_upsert_replaces_by_id_and_the_last_duplicate_wins(sqlite_index: SQLiteVectorIndex) -> None:
    for index in (InMemoryVectorIndex(), sqlite_index):
        await index.add([Content("old", id="x"), Content("other", id="y")], [[1.0, 0.0], [0.0, 1.0]])
        await index.add([Content("first", id="x"), Content("new", id="x")], [[0.0, 1.0], [1.0, 1.0]])
        found = await index.search([1.0, 1.0], k=5)
        assert [(c.id, c.text, round(c.score or 0, 5)) for c in found] == [
            ("x", "new", 1.0),
            ("y", "other", 0.70711),
        ]
        assert await index.search([1.0, 1.0], k=5, min_score=0.9) == found[:1]
        # A zero vector is as similar to every row (0): ties, cut at k in row order.
        assert await index.search([0.0, 0.0], k=1) == [dataclasses.replace(found[0], score=0.0)]
        many = [Content(f"same {i}", id=f"same{i}") for i in range(50)]
        await index.add(many, [[0.0, -1.0]] * 50)
        assert [c.id for c in await index.search([0.0, -1.0], k=3)] == ["same0", "same1", "same2"]


async def test_empty_indexes_find_nothing(sqlite_index: SQLiteVectorIndex) -> None:
    model = HashEmbeddings()
    for index in (InMemoryVectorIndex(), sqlite_index):
        assert await EmbeddingRetriever(model, index).retrieve(Query("anything")) == []
        await EmbeddingRetriever(model, index).add(["", "   "])  # no chunks: the model is not asked
    assert model.calls == [["anything"], ["anything"]]


@pytest.mark.parametrize("in_thread", [False, True])
async def test_concurrent_vector_queries_match_sequential_ones(in_thread: bool, tmp_path: Path) -> None:
    model = HashEmbeddings()
    for index in (
        InMemoryVectorIndex(in_thread=in_thread),
        SQLiteVectorIndex(tmp_path / "v.db", in_thread=in_thread),
    ):
        retriever = EmbeddingRetriever(model, index, k=5)
        await retriever.add(generated_corpus(500))
        questions = [f"refund{i % 3} wifi{i % 4} delay{i % 5}" for i in range(20)]
        sequential = [ranking(await retriever.retrieve(Query(q))) for q in questions]
        assert all(sequential)
        assert await asked_at_once(retriever, questions) == sequential
        if isinstance(index, SQLiteVectorIndex):
            await index.aclose()


async def test_concurrent_writes_all_land(tmp_path: Path) -> None:
    """Writes are serialized: twenty adds at once, in worker threads or on the loop, keep every row,
    and searches meanwhile see whole snapshots."""
    path = tmp_path / "v.db"
    for index in (
        InMemoryVectorIndex(in_thread=True),
        InMemoryVectorIndex(in_thread=False),
        SQLiteVectorIndex(path),
    ):
        async with anyio.create_task_group() as group:
            for i in range(20):
                vector = [1.0 if j == i else 0.0 for j in range(20)]
                group.start_soon(index.add, [Content(f"t{i}", id=str(i))], [vector])
                group.start_soon(functools.partial(index.search, vector, k=3))
        assert await index.count() == 20
        for i in range(20):
            (found,) = await index.search([1.0 if j == i else 0.0 for j in range(20)], k=1)
            assert found.id == str(i)
        if isinstance(index, SQLiteVectorIndex):
            await index.aclose()
    reopened = SQLiteVectorIndex(path)
    assert await reopened.count() == 20
    await reopened.aclose()


async def test_cancelled_retrieve_leaves_nothing_running() -> None:
    model = HashEmbeddings(gate=anyio.Event())
    retriever = EmbeddingRetriever(model, InMemoryVectorIndex(in_thread=True))
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(retriever.retrieve, Query("refund"))
            await model.entered.wait()
            scope.cancel()
            # Released after the cancellation: a call still running would finish now, and say so.
            model.release()
    assert scope.cancelled_caught
    assert model.events == ["cancelled"]
    assert model.running == 0


async def test_cancelled_add_stores_nothing(sqlite_index: SQLiteVectorIndex) -> None:
    model = HashEmbeddings(gate=anyio.Event())
    retriever = EmbeddingRetriever(model, sqlite_index)
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(retriever.add, CORPUS)
            await model.entered.wait()
            scope.cancel()
            model.release()
    assert model.events == ["cancelled"]
    assert model.running == 0
    assert await sqlite_index.count() == 0


def test_protocols_and_settings(tmp_path: Path) -> None:
    model = HashEmbeddings()
    assert isinstance(InMemoryVectorIndex(), VectorIndex)
    assert isinstance(SQLiteVectorIndex(tmp_path / "v.db"), VectorIndex)
    assert isinstance(EmbeddingRetriever(model), Retriever)
    assert isinstance(BM25Retriever(), Retriever)
    with pytest.raises(ConfigurationError, match="needs a file"):
        SQLiteVectorIndex(":memory:")
    with pytest.raises(ConfigurationError, match="k must be at least 1"):
        EmbeddingRetriever(model, k=0)
    with pytest.raises(ConfigurationError, match="dimension must be at least 1"):
        InMemoryVectorIndex(dimension=0)


def test_agentrt_imports_without_numpy_and_bm25s() -> None:
    code = (
        "import sys; sys.modules['numpy'] = None; sys.modules['bm25s'] = None\n"
        "import agentrt, agentrt.rag._bm25 as b, agentrt.rag._vectors as v\n"
        "import agentrt.rag._sqlite_vectors as s\n"
        "for make in (b.BM25Retriever, v.InMemoryVectorIndex, lambda: s.SQLiteVectorIndex('x.db')):\n"
        "    try:\n"
        "        make()\n"
        "    except ImportError as e:\n"
        "        print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == [
        "BM25Retriever needs numpy: pip install 'agentrt[rag]'",
        "InMemoryVectorIndex needs numpy: pip install 'agentrt[rag]'",
        "SQLiteVectorIndex('x.db') needs numpy: pip install 'agentrt[rag]'",
    ]


# --- SQLiteVectorIndex: a second writer keeps the dimension of the first ------------------------------------


@pytest.mark.virtual_clock
async def test_a_second_writer_cannot_store_another_dimension(tmp_path: Path) -> None:
    path = tmp_path / "vectors.db"
    first, second = SQLiteVectorIndex(path), SQLiteVectorIndex(path)
    reopened = SQLiteVectorIndex(path)
    try:
        assert await first.count() == 0 and await second.count() == 0  # both open, the file empty
        await first.add([Content("three", id="a")], [[1.0, 0.0, 0.0]])
        # Expected: refused, as the same handle would refuse it; actual: stored.
        with pytest.raises(ValueError, match="3-dimensional"):
            await second.add([Content("four", id="b")], [[1.0, 0.0, 0.0, 0.0]])
    finally:
        first.close()
        second.close()
    try:
        assert await reopened.count() == 1  # actual: ValueError, the file is unusable
    finally:
        reopened.close()


# --- BM25Retriever: its k, and odd text ---------------------------------------------------------------------


def test_bm25_refuses_a_k_that_is_not_an_int() -> None:
    with pytest.raises(ConfigurationError, match="BM25Retriever"):
        BM25Retriever(["dogs and cats"], k=1.5)  # type: ignore[arg-type]


@pytest.mark.virtual_clock
async def test_bm25_with_odd_text() -> None:
    # Regression: empty, blank, stop-word-only, emoji-only, NUL, non-Latin and lone-surrogate texts
    # index and search without error; queries of nothing searchable find nothing.
    texts = [
        "",
        "   ",
        "the and of",
        "🐶🐶",
        "Dogs\x00cats",
        "ÄÖÜ straße",
        "日本語のテキスト。",
        "\ud800 lone surrogate",
        "x" * 3000,
    ]
    retriever = BM25Retriever(texts, k=3)
    for query in ["", "the", "🐶", "\x00", "x" * 3000]:
        assert await retriever.retrieve(Query(query)) == []
    assert [c.text for c in await retriever.retrieve(Query("cats"))] == ["Dogs\x00cats"]
    assert [c.text for c in await retriever.retrieve(Query("straße"))] == ["ÄÖÜ straße"]
    assert [c.text for c in await retriever.retrieve(Query("surrogate"))] == ["\ud800 lone surrogate"]
    empty = BM25Retriever([], k=2)
    await empty.add(["the of and"])  # a corpus without a single token
    assert await empty.retrieve(Query("the")) == []
    await empty.add(["real words here"])
    assert [c.text for c in await empty.retrieve(Query("words"))] == ["real words here"]
