"""`SQLiteVectorIndex`: a `VectorIndex` kept in an SQLite file, searched in memory.

Each content is one row of `agentrt_vectors`: its key (`Content.key()`), id, text, metadata (JSON)
and vector (float32, little-endian, as given); `agentrt_vectors_meta` holds the dimension. On first
use the rows are loaded, in file order, into the same in-memory matrix `InMemoryVectorIndex` uses, so
searches never touch the file and rank exactly as the in-memory index does: by brute force, as
sqlite-vec's `vec0` tables do. (sqlite-vec itself needs `enable_load_extension`, which many Python
builds leave out.)

sqlite3 blocks: opening, loading and every write run in a worker thread (`anyio.to_thread.run_sync`)
on one connection, one operation at a time (a `threading.Lock` the event loop never waits for). A
write is one transaction, applied to the matrix only once committed; a cancelled write finishes in
its thread first, so it happened entirely or not at all. Writes by other processes are seen when the
index is opened again (`aclose`, then use it).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from types import MappingProxyType
from typing import TYPE_CHECKING

import anyio.lowlevel
import anyio.to_thread
import orjson

from .._errors import ConfigurationError
from ..memory._sqlite import _enable_wal
from ._types import Content
from ._vectors import THREAD_CELLS, Rows, require, run_writing

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

__all__ = ["SQLiteVectorIndex"]

_BUSY_TIMEOUT = 10.0

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS agentrt_vectors (
        row INTEGER PRIMARY KEY,
        key TEXT NOT NULL UNIQUE,
        id TEXT,
        text TEXT NOT NULL,
        metadata TEXT NOT NULL,
        vector BLOB NOT NULL
    )""",
    "CREATE TABLE IF NOT EXISTS agentrt_vectors_meta (name TEXT NOT NULL PRIMARY KEY, value TEXT NOT NULL)",
)
_DIMENSION = "SELECT value FROM agentrt_vectors_meta WHERE name = 'dimension'"
_SET_DIMENSION = "INSERT OR IGNORE INTO agentrt_vectors_meta (name, value) VALUES ('dimension', ?)"
_LOAD = "SELECT key, id, text, metadata, vector FROM agentrt_vectors ORDER BY row"
# An existing key keeps its row (and so its place in the file's order, as in memory).
_UPSERT = (
    "INSERT INTO agentrt_vectors (key, id, text, metadata, vector) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (key) DO UPDATE SET id = excluded.id, text = excluded.text, "
    "metadata = excluded.metadata, vector = excluded.vector"
)
_DELETE = "DELETE FROM agentrt_vectors WHERE key = ?"


class SQLiteVectorIndex:
    """A `VectorIndex` in the SQLite file `path` (made on first use, WAL mode), loaded into memory
    on first use and searched there (exact cosine similarity).

    `dimension` fixes the vectors' length (default: the file's, else that of the first vectors
    added); a file holding vectors of another length raises `ValueError` when opened, as do vectors
    of another length later. `in_thread`: `None` moves large searches to a worker thread, `True`
    always, `False` never (file I/O always runs in one). Raises `ImportError` without numpy (`pip
    install 'agentrt[rag]'`); `ConfigurationError` for `":memory:"` (use `InMemoryVectorIndex`).

    One process writes a file: others see its writes when they open it again."""

    def __init__(
        self, path: str | os.PathLike[str], *, dimension: int | None = None, in_thread: bool | None = None
    ) -> None:
        self._path = os.fspath(path)
        if self._path in ("", ":memory:"):
            raise ConfigurationError(f"SQLiteVectorIndex needs a file, not {self._path!r}")
        if dimension is not None and dimension < 1:
            raise ConfigurationError(f"SQLiteVectorIndex: dimension must be at least 1, not {dimension}")
        self._owner = f"SQLiteVectorIndex({self._path!r})"
        Rows(dimension, self._owner)  # numpy is there, or ImportError now
        self._dimension = dimension
        self._in_thread = in_thread
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._rows: Rows | None = None

    def __repr__(self) -> str:
        return self._owner

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    async def add(self, contents: Sequence[Content], vectors: Sequence[Sequence[float]]) -> None:
        """Store `contents` with their `vectors` in one transaction (see `VectorIndex`); `ValueError`
        for vectors of the wrong count, length or values or metadata that is not JSON, nothing stored
        then."""
        contents = list(contents)
        if not contents:
            await anyio.lowlevel.checkpoint()
            return
        rows = await self._loaded()
        matrix = rows.check(contents, vectors)
        records = []
        for content, vector in zip(contents, matrix.astype("<f4"), strict=True):
            try:
                metadata = orjson.dumps(dict(content.metadata)).decode()
            except TypeError as exc:
                raise ValueError(f"{self._owner}: metadata of {content.key()!r} is not JSON: {exc}") from exc
            records.append((content.key(), content.id, content.text, metadata, vector.tobytes()))

        def write() -> None:
            db, rows = self._open()
            checked = rows.check(contents, matrix)  # again: another write may have set the dimension

            def statements() -> None:
                # Inside the transaction: another handle on the file (another process) may have set
                # the dimension since this one loaded it.
                stored = db.execute(_DIMENSION).fetchone()
                if stored is not None and int(stored[0]) != checked.shape[1]:
                    raise ValueError(
                        f"{self._owner} holds {int(stored[0])}-dimensional vectors (written by another "
                        f"handle on the file), not {checked.shape[1]}-dimensional ones"
                    )
                db.execute(_SET_DIMENSION, (str(checked.shape[1]),))
                db.executemany(_UPSERT, records)

            _transaction(db, statements)
            rows.upsert(contents, checked)

        await run_writing(self._lock, write, in_thread=True)

    async def search(
        self, vector: Sequence[float], *, k: int, min_score: float | None = None
    ) -> list[Content]:
        """The `k` contents most similar to `vector` (see `VectorIndex`)."""
        rows = await self._loaded()
        unit = rows.query(vector)
        snapshot = rows.snapshot
        if unit is None or k < 1:
            await anyio.lowlevel.checkpoint()
            return []
        if self._in_thread if self._in_thread is not None else snapshot.matrix.size > THREAD_CELLS:
            return await anyio.to_thread.run_sync(snapshot.search, unit, k, min_score)
        await anyio.lowlevel.checkpoint()
        return snapshot.search(unit, k, min_score)

    async def delete(self, ids: Iterable[str]) -> None:
        """Remove the contents with these keys (`Content.key()`) in one transaction; unknown ones are
        ignored."""
        keys = [(key,) for key in ids]

        def write() -> None:
            db, rows = self._open()
            _transaction(db, lambda: db.executemany(_DELETE, keys))
            rows.delete(key for (key,) in keys)

        await run_writing(self._lock, write, in_thread=True)

    async def count(self) -> int:
        """The number of contents stored."""
        return len(await self._loaded())

    async def aclose(self) -> None:
        """Close the file (after a write in progress); a later use opens and loads it again."""
        await run_writing(self._lock, self._close, in_thread=True)

    def close(self) -> None:
        """`aclose`, for code outside an event loop (it waits for a write in progress)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
        self._db, self._rows = None, None

    async def _loaded(self) -> Rows:
        rows = self._rows
        if rows is not None:
            return rows
        return (await run_writing(self._lock, self._open, in_thread=True))[1]

    def _open(self) -> tuple[sqlite3.Connection, Rows]:
        """The connection and the rows, opened and loaded if need be (holding the lock)."""
        if self._db is not None and self._rows is not None:
            return self._db, self._rows
        db = sqlite3.connect(self._path, timeout=_BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
        try:
            db.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT * 1000)}")
            _enable_wal(db)
            db.execute("PRAGMA synchronous = NORMAL")
            _transaction(db, lambda: [db.execute(statement) for statement in _SCHEMA])
            rows = self._load(db)
        except BaseException:
            db.close()
            raise
        self._db, self._rows = db, rows
        return db, rows

    def _load(self, db: sqlite3.Connection) -> Rows:
        np = require("numpy", self._owner)
        stored = db.execute(_DIMENSION).fetchone()
        dimension = int(stored[0]) if stored is not None else None
        if dimension is not None and self._dimension is not None and dimension != self._dimension:
            raise ValueError(
                f"{self._owner} holds {dimension}-dimensional vectors, not {self._dimension}-dimensional ones"
            )
        rows = Rows(dimension if dimension is not None else self._dimension, self._owner)
        records: list[tuple[str, str | None, str, str, bytes]] = db.execute(_LOAD).fetchall()
        if not records:
            return rows
        if dimension is None or any(len(record[4]) != 4 * dimension for record in records):
            raise ValueError(
                f"{self._owner}: the file's vectors do not have the stored dimension {dimension}"
            )
        contents = [
            Content(text, MappingProxyType(orjson.loads(metadata)), id=id_)
            for _, id_, text, metadata, _ in records
        ]
        matrix = np.frombuffer(b"".join(record[4] for record in records), dtype="<f4").reshape(-1, dimension)
        rows.upsert(contents, matrix.astype(np.float32))
        return rows


def _transaction(db: sqlite3.Connection, body: Callable[[], object]) -> None:
    """Run `body()` in one write transaction: commit, or roll back on any error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        body()
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
