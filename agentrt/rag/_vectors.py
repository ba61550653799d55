"""Vector search: the `VectorIndex` protocol, `InMemoryVectorIndex` (numpy, exact cosine similarity)
and `EmbeddingRetriever`, which embeds texts through an `EmbeddingModel` and searches an index.

An index keeps unit vectors in one float32 matrix and finds the nearest by brute force (one matrix
product, then a partial sort), the algorithm of sqlite-vec's `vec0` tables: exact, and fast enough
for the tens of thousands of chunks an application's own documents make (see bench_rag.py).

Searches need no lock: an index publishes an immutable *snapshot* (a view of the first `n` rows and
the contents list, which later writes only append to past `n`); a write that replaces or deletes
rows builds new arrays instead. Writes are serialized by a `threading.Lock` the event loop never
waits for (`run_writing`). Work on large indexes runs in a worker thread, which a cancellation lets
finish: a write is applied whole or not at all.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import anyio.lowlevel
import anyio.to_thread

from .._errors import ConfigurationError
from ._splitter import Document, Splitter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    import numpy as np
    import numpy.typing as npt

    from ._types import Content, EmbeddingModel, Query

    Matrix = npt.NDArray[np.float32]

__all__ = ["EmbeddingRetriever", "InMemoryVectorIndex", "VectorIndex"]

_T = TypeVar("_T")

# Work on more matrix cells (rows x dimensions) than this runs in a worker thread (bench_rag.py: a
# search over 10,000 x 384 cells takes 0.5 to 1.5 ms on an idle machine, ten times that when
# OpenBLAS's threads contend with others; a hop to a worker thread costs about 0.1 ms).
THREAD_CELLS = 1_000_000


def require(module: str, user: str) -> Any:
    """Import `module` for `user`, or raise an `ImportError` that says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{user} needs {module}: pip install 'agentrt[rag]'") from exc


async def run_writing(lock: threading.Lock, work: Callable[[], _T], *, in_thread: bool) -> _T:
    """Run `work` holding `lock`: on the event loop when not `in_thread` and the lock is free at once,
    else in a worker thread that waits for the lock there (never the loop). A cancellation while the
    thread runs waits for it to finish."""
    if not in_thread and lock.acquire(blocking=False):
        try:
            return work()
        finally:
            lock.release()

    def locked() -> _T:
        with lock:
            return work()

    return await anyio.to_thread.run_sync(locked)


@runtime_checkable
class VectorIndex(Protocol):
    """Contents with their vectors, searched by cosine similarity.

    `add` stores each content with its vector, replacing a stored content with the same `key()`;
    `search` returns at most `k` contents, most similar first, each with its cosine similarity as
    `score` (from -1 to 1), leaving out those below `min_score`. Vectors of another dimension than
    those stored raise `ValueError`."""

    async def add(self, contents: Sequence[Content], vectors: Sequence[Sequence[float]]) -> None: ...

    async def search(
        self, vector: Sequence[float], *, k: int, min_score: float | None = None
    ) -> list[Content]: ...

    async def delete(self, ids: Iterable[str]) -> None: ...

    async def count(self) -> int: ...


class Snapshot:
    """What a search reads: unit vectors (`n` rows) and the contents of those rows."""

    __slots__ = ("contents", "matrix")

    def __init__(self, matrix: Matrix, contents: Sequence[Content]) -> None:
        self.matrix = matrix
        self.contents = contents

    def search(self, vector: Matrix, k: int, min_score: float | None) -> list[Content]:
        np = require("numpy", "vector search")
        rows = self.matrix.shape[0]
        if rows == 0:
            return []
        scores = self.matrix @ vector
        k = min(k, rows)
        if k < rows:
            # Every row scoring at least the k-th best score, so that ties at the cut are decided
            # by row order too.
            kth = scores[np.argpartition(-scores, k - 1)[k - 1]]
            top = np.flatnonzero(scores >= kth)
        else:
            top = np.arange(rows)
        # Best first; equal scores in row order, so that every index ranks alike.
        top = top[np.lexsort((top, -scores[top]))][:k]
        found = []
        for row, score in zip(top.tolist(), scores[top].tolist(), strict=True):
            if min_score is not None and score < min_score:
                break
            found.append(dataclasses.replace(self.contents[row], score=score))
        return found


class Rows:
    """The rows of an index: contents, unit vectors, the row of each key. One writer at a time (the
    caller's lock); readers take `snapshot` without one."""

    def __init__(self, dimension: int | None, owner: str) -> None:
        self._np = require("numpy", owner)
        self.owner = owner
        self.dimension = dimension
        self._buffer: Matrix = self._np.zeros((0, dimension or 0), dtype=self._np.float32)
        self._contents: list[Content] = []
        self._rows: dict[str, int] = {}
        self.snapshot = Snapshot(self._buffer, ())

    def __len__(self) -> int:
        return len(self._contents)

    def check(self, contents: Sequence[Content], vectors: Any) -> Matrix:
        """`vectors` as a float32 matrix of one row per content, or `ValueError`."""
        np = self._np
        try:
            matrix: Matrix = np.asarray(vectors, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{self.owner}: vectors must be lists of numbers of one length ({exc})") from exc
        if matrix.ndim != 2 or matrix.shape[0] != len(contents):
            raise ValueError(
                f"{self.owner}: {len(contents)} contents need {len(contents)} vectors of one length,"
                f" got an array of shape {matrix.shape}"
            )
        self.check_dimension(matrix.shape[1])
        if not np.isfinite(matrix).all():
            raise ValueError(f"{self.owner}: vectors must be finite (no NaN or infinity)")
        return matrix

    def check_dimension(self, dimension: int) -> None:
        if dimension == 0:
            raise ValueError(f"{self.owner}: vectors must not be empty")
        if self.dimension is not None and dimension != self.dimension:
            raise ValueError(
                f"{self.owner} holds {self.dimension}-dimensional vectors, not {dimension}-dimensional"
                " ones: was the embedding model changed? (use a new index for another model)"
            )

    def unit(self, matrix: Matrix) -> Matrix:
        """Each row divided by its length (rows of zeros stay zeros: similar to nothing)."""
        norms = self._np.linalg.norm(matrix, axis=1, keepdims=True)
        result: Matrix = matrix / self._np.where(norms == 0, 1, norms)
        return result

    def query(self, vector: Sequence[float]) -> Matrix | None:
        """The unit query vector, or `None` when the index is empty (nothing to compare with)."""
        np = self._np
        try:
            matrix: Matrix = np.asarray(vector, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{self.owner}: the query vector must be a list of numbers ({exc})") from exc
        if matrix.ndim != 1 or not np.isfinite(matrix).all():
            raise ValueError(f"{self.owner}: the query vector must be one list of finite numbers")
        self.check_dimension(matrix.shape[0])
        if self.dimension is None:
            return None
        unit: Matrix = self.unit(matrix[None, :])[0]
        return unit

    def upsert(self, contents: Sequence[Content], vectors: Matrix) -> None:
        """Store `vectors` (checked, not yet unit) for `contents`: a key already stored keeps its row
        and takes the new content and vector; a key given twice takes the last."""
        np = self._np
        vectors = self.unit(vectors)
        last: dict[str, int] = {}
        for i, content in enumerate(contents):
            last[content.key()] = i  # dict order: first occurrences, values: last ones
        replaced = [(self._rows[key], i) for key, i in last.items() if key in self._rows]
        added = [i for key, i in last.items() if key not in self._rows]
        n = len(self._contents)
        dimension = vectors.shape[1]
        if replaced or n + len(added) > self._buffer.shape[0] or self._buffer.shape[1] != dimension:
            # Readers may be reading the rows replaced, or the buffer is full: copy into a new one,
            # with room for as many rows again so that appends stay cheap.
            buffer = np.empty((max(2 * (n + len(added)), 16), dimension), dtype=np.float32)
            if n:
                buffer[:n] = self._buffer[:n]
            self._buffer = buffer
            self._contents = list(self._contents)
        for row, i in replaced:
            self._buffer[row] = vectors[i]
            self._contents[row] = contents[i]
        # Past the rows readers see: written in place.
        self._buffer[n : n + len(added)] = vectors[added]
        for offset, i in enumerate(added):
            self._rows[contents[i].key()] = n + offset
            self._contents.append(contents[i])
        self.dimension = dimension
        self._publish()

    def delete(self, keys: Iterable[str]) -> None:
        """Remove the rows of `keys` (unknown keys are ignored); the others keep their order."""
        gone = {self._rows[key] for key in keys if key in self._rows}
        if not gone:
            return
        keep = [row for row in range(len(self._contents)) if row not in gone]
        self._buffer = self._buffer[keep]  # a copy: readers keep the old one
        self._contents = [self._contents[row] for row in keep]
        self._rows = {content.key(): row for row, content in enumerate(self._contents)}
        self._publish()

    def _publish(self) -> None:
        matrix = self._buffer[: len(self._contents)]
        matrix.flags.writeable = False
        self.snapshot = Snapshot(matrix, self._contents)


class InMemoryVectorIndex:
    """A `VectorIndex` in this process's memory (numpy), exact cosine similarity.

    `dimension` fixes the vectors' length up front (default: that of the first vectors added).
    `in_thread`: `None` moves large writes and searches to a worker thread, `True` always, `False`
    never. Raises `ImportError` without numpy (`pip install 'agentrt[rag]'`)."""

    def __init__(self, dimension: int | None = None, *, in_thread: bool | None = None) -> None:
        if dimension is not None and dimension < 1:
            raise ConfigurationError(f"InMemoryVectorIndex: dimension must be at least 1, not {dimension}")
        self._rows = Rows(dimension, "InMemoryVectorIndex")
        self._writing = threading.Lock()
        self._in_thread = in_thread

    @property
    def dimension(self) -> int | None:
        """The vectors' length, `None` until the first are added."""
        return self._rows.dimension

    def _thread(self, cells: int) -> bool:
        return self._in_thread if self._in_thread is not None else cells > THREAD_CELLS

    async def add(self, contents: Sequence[Content], vectors: Sequence[Sequence[float]]) -> None:
        """Store `contents` with their `vectors` (see `VectorIndex`); `ValueError` for vectors of the
        wrong count, length or values, nothing stored then."""
        contents = list(contents)
        if not contents:
            await anyio.lowlevel.checkpoint()
            return
        matrix = self._rows.check(contents, vectors)
        await anyio.lowlevel.checkpoint()
        await run_writing(
            self._writing,
            lambda: self._rows.upsert(contents, self._rows.check(contents, matrix)),
            in_thread=self._thread(matrix.size + len(self._rows) * matrix.shape[1]),
        )

    async def search(
        self, vector: Sequence[float], *, k: int, min_score: float | None = None
    ) -> list[Content]:
        """The `k` contents most similar to `vector` (see `VectorIndex`)."""
        unit = self._rows.query(vector)
        snapshot = self._rows.snapshot
        if unit is None or k < 1:
            await anyio.lowlevel.checkpoint()
            return []
        if self._thread(snapshot.matrix.size):
            return await anyio.to_thread.run_sync(snapshot.search, unit, k, min_score)
        await anyio.lowlevel.checkpoint()
        return snapshot.search(unit, k, min_score)

    async def delete(self, ids: Iterable[str]) -> None:
        """Remove the contents with these keys (`Content.key()`); unknown ones are ignored."""
        keys = list(ids)
        await anyio.lowlevel.checkpoint()
        cells = len(self._rows) * (self._rows.dimension or 0)  # a deletion copies the matrix
        await run_writing(self._writing, lambda: self._rows.delete(keys), in_thread=self._thread(cells))

    async def count(self) -> int:
        """The number of contents stored."""
        return len(self._rows)


class EmbeddingRetriever:
    """A `Retriever` that embeds the query with `embedding_model` and returns the `k` most similar
    contents of `index` (default: a new `InMemoryVectorIndex`), leaving out those below `min_score`.

    `add` embeds documents (split by `splitter`) or contents and stores them. The model's answer is
    checked: another number of vectors than texts, or vectors of another length than the index's,
    raise `ValueError` naming the model (a retriever's error becomes a `RetrievalError` in a call).
    Cancelled while the model is embedding, `retrieve` and `add` leave nothing running (the model's
    own call is cancelled) and `add` stores nothing."""

    def __init__(
        self,
        embedding_model: EmbeddingModel,
        index: VectorIndex | None = None,
        *,
        k: int = 4,
        min_score: float | None = None,
        splitter: Splitter | None = None,
    ) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigurationError(f"EmbeddingRetriever: k must be at least 1 (an int), not {k!r}")
        self.embedding_model = embedding_model
        self.index: VectorIndex = index if index is not None else InMemoryVectorIndex()
        self.k = k
        self.min_score = min_score
        self._splitter = splitter if splitter is not None else Splitter()

    async def add(self, documents: Iterable[Document | Content | str]) -> None:
        """Embed and store `documents`: `Document`s and strings split into chunks, `Content`s as they
        are. One `embed` call for all texts (the model batches); nothing is stored if it fails."""
        contents = self._splitter.split(documents)
        if not contents:
            return
        vectors = await self._embed([content.text for content in contents])
        await self.index.add(contents, vectors)

    async def retrieve(self, query: Query) -> list[Content]:
        """The `k` stored contents most similar to `query.text`, best first, scored by cosine."""
        (vector,) = await self._embed([query.text])
        return await self.index.search(vector, k=self.k, min_score=self.min_score)

    async def _embed(self, texts: list[str]) -> list[list[float]]:
        vectors = await self.embedding_model.embed(texts)
        name = getattr(self.embedding_model, "name", type(self.embedding_model).__name__)
        try:
            count, lengths = len(vectors), {len(vector) for vector in vectors}
        except TypeError:
            raise ValueError(
                f"embedding model {name!r} returned {type(vectors).__name__}, not vectors"
            ) from None
        if count != len(texts):
            raise ValueError(f"embedding model {name!r} returned {count} vectors for {len(texts)} texts")
        if len(lengths) > 1 or 0 in lengths:
            raise ValueError(f"embedding model {name!r} returned vectors of lengths {sorted(lengths)}")
        return vectors
