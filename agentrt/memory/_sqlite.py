"""`SQLiteStore`: chat memory that processes on one host share, kept in an SQLite file.

A conversation is the rows of `agentrt_messages` with its key, one JSON message per row
(`message_to_json`) numbered by `seq`, so a commit appends rows without rewriting what is stored. Its
lock is a row of `agentrt_leases` holding the owner and the wall-clock time its lease expires, renewed
by a `LeaseRenewer` thread while held (and while the event loop that took it answers). The tables
are prefixed so that the store can live in a file an application also uses for its own tables.

sqlite3 blocks, and agentrt runs on asyncio and trio: each operation runs in a worker thread with
`anyio.to_thread.run_sync`, one hop per operation, on that thread's own connection (a connection must
not be shared by threads that use it at once). A cancelled operation is never abandoned: the thread
finishes it, so a write happened entirely or not at all. Each write is one `BEGIN IMMEDIATE`
transaction, so the owner check and the write cannot be split by another process's write, and any
error rolls it back before the thread returns.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import weakref
from typing import TYPE_CHECKING, TypeVar

import anyio.to_thread

from .._errors import ConfigurationError, ConversationLockLostError
from .._messages import message_from_json, message_to_json
from ._lease import LeaseRenewer, check_lease_seconds
from ._store import TURNS_REMEMBERED

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterator, Sequence

    from .._messages import ChatMessage

__all__ = ["SQLiteStore"]

_T = TypeVar("_T")

# How long an operation waits for another connection's write lock before it fails (seconds).
_BUSY_TIMEOUT = 10.0

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS agentrt_messages (
        key TEXT NOT NULL,
        seq INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (key, seq)
    )""",
    """CREATE TABLE IF NOT EXISTS agentrt_leases (
        key TEXT NOT NULL PRIMARY KEY,
        owner TEXT NOT NULL,
        expires REAL NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS agentrt_pending (
        key TEXT NOT NULL PRIMARY KEY,
        run TEXT NOT NULL,
        body BLOB NOT NULL
    )""",
    # The turns committed with an id (`commit(turn=...)`), the last TURNS_REMEMBERED per key.
    """CREATE TABLE IF NOT EXISTS agentrt_turns (
        key TEXT NOT NULL,
        turn TEXT NOT NULL,
        PRIMARY KEY (key, turn)
    )""",
)

_LOAD = "SELECT body FROM agentrt_messages WHERE key = ? ORDER BY seq"
_OWNER = "SELECT owner FROM agentrt_leases WHERE key = ?"
_DROP = (
    "DELETE FROM agentrt_messages WHERE key = ? AND seq IN "
    "(SELECT seq FROM agentrt_messages WHERE key = ? ORDER BY seq LIMIT ?)"
)
_DELETE = "DELETE FROM agentrt_messages WHERE key = ?"
_LAST = "SELECT COALESCE(MAX(seq), 0) FROM agentrt_messages WHERE key = ?"
_INSERT = "INSERT INTO agentrt_messages (key, seq, body) VALUES (?, ?, ?)"
# Taken when there is no lease or it expired: one statement, so two takers cannot both win.
_TAKE = (
    "INSERT INTO agentrt_leases (key, owner, expires) VALUES (?, ?, ?) "
    "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expires = excluded.expires "
    "WHERE agentrt_leases.expires < ? OR agentrt_leases.owner = excluded.owner"
)
_RENEW = "UPDATE agentrt_leases SET expires = ? WHERE key = ? AND owner = ?"
_UNLOCK = "DELETE FROM agentrt_leases WHERE key = ? AND owner = ?"
_TURN_OF = "SELECT 1 FROM agentrt_turns WHERE key = ? AND turn = ?"
_ADD_TURN = "INSERT INTO agentrt_turns (key, turn) VALUES (?, ?)"
_FORGET_TURNS = (
    "DELETE FROM agentrt_turns WHERE key = ? AND rowid NOT IN "
    "(SELECT rowid FROM agentrt_turns WHERE key = ? ORDER BY rowid DESC LIMIT ?)"
)
_DELETE_TURNS = "DELETE FROM agentrt_turns WHERE key = ?"
_SAVE_PENDING = "INSERT OR REPLACE INTO agentrt_pending (key, run, body) VALUES (?, ?, ?)"
_LOAD_PENDING = "SELECT run, body FROM agentrt_pending WHERE key = ?"
_PENDING_OF = "SELECT body FROM agentrt_pending WHERE key = ? AND run = ?"
_DROP_PENDING = "DELETE FROM agentrt_pending WHERE key = ? AND run = ?"


class _Connection:
    """One thread's connection. It lives in a `threading.local`, so it is closed (by its finalizer)
    when its thread ends; `SQLiteStore.close` closes those of live threads, each once its thread is
    done with it (`busy`): closing a connection another thread is using crashes the process."""

    __slots__ = ("__weakref__", "busy", "closed", "db")

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.busy = threading.Lock()
        self.closed = False
        weakref.finalize(self, db.close)


class SQLiteStore:
    """A `SharedChatMemoryStore` in an SQLite file, for processes on one host.

    The file is made on first use, in WAL mode (readers do not wait for a writer) with
    `synchronous=NORMAL`: a commit survives a crash of the process, the last ones may be lost to a
    power failure, and the file is never left inconsistent. A lock is a lease of `lease_seconds`,
    renewed every third of it while held by a live event loop: a holder that crashed, or whose event
    loop is blocked, loses it within one lease (and a third). Leases compare wall-clock times, which
    the processes of one host share.

    Do not put the file on a network file system: SQLite's locking is not reliable there.
    """

    def __init__(self, path: str | os.PathLike[str], *, lease_seconds: float = 30.0) -> None:
        lease_seconds = check_lease_seconds(lease_seconds, "SQLiteStore")
        self._path = os.fspath(path)
        if self._path == "" or self._path == ":memory:":
            # Each thread's connection would have a database of its own.
            raise ConfigurationError(f"SQLiteStore needs a file, not {self._path!r}")
        self._lease_seconds = float(lease_seconds)
        self._local = threading.local()
        self._lock = threading.Lock()
        # Writers of this process queue here rather than in SQLite's busy handler, which sleeps in
        # steps of up to 100 ms; other processes' writers still meet it (WAL lets readers through).
        self._writes = threading.Lock()
        self._connections: weakref.WeakSet[_Connection] = weakref.WeakSet()
        self._renewer = LeaseRenewer(self._renew, lease_seconds / 3, name=f"agentrt SQLiteStore {self._path}")

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r}, lease_seconds={self._lease_seconds})"

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    @property
    def renewer(self) -> LeaseRenewer:
        """The thread that renews this store's held leases (`held()` lists them)."""
        return self._renewer

    @contextlib.contextmanager
    def _use(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, for one operation (`close` waits for it to end); opened, and
        the schema made, on the thread's first use."""
        conn: _Connection | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self._open()
        with conn.busy:
            if conn.closed:  # closed by `close` while this thread waited for it
                conn = self._open()
                with conn.busy:
                    yield conn.db
            else:
                yield conn.db

    def _open(self) -> _Connection:
        # isolation_level=None: no implicit transactions, each write says BEGIN IMMEDIATE itself.
        # check_same_thread=False only so that `close` may close it from another thread.
        db = sqlite3.connect(self._path, timeout=_BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
        conn = _Connection(db)
        try:
            db.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT * 1000)}")
            _enable_wal(db)
            db.execute("PRAGMA synchronous = NORMAL")
            _transaction(db, lambda: [db.execute(statement) for statement in _SCHEMA])
        except BaseException:
            db.close()
            raise
        self._local.conn = conn
        with self._lock:
            self._connections.add(conn)
        return conn

    async def load(self, key: str) -> list[ChatMessage]:
        """The conversation's messages, oldest first (one SELECT, a consistent snapshot)."""

        def read() -> list[str]:
            with self._use() as db:
                return [body for (body,) in db.execute(_LOAD, (key,))]

        return [message_from_json(body) for body in await anyio.to_thread.run_sync(read)]

    async def commit(
        self,
        key: str,
        messages: Sequence[ChatMessage],
        *,
        drop: int = 0,
        owner: str | None = None,
        turn: str | None = None,
    ) -> None:
        """Drop the first `drop` rows and append `messages` in one transaction; with `owner`, only while
        the lease row is still its own (else `ConversationLockLostError`, nothing changed); with
        `turn`, only if no commit recorded that turn id (a row of `agentrt_turns`, written in the
        same transaction)."""
        if drop < 0:
            raise ValueError(f"drop must not be negative, not {drop}")
        await self._run_write(key, messages, drop, owner, turn)

    async def replace(self, key: str, messages: Sequence[ChatMessage], *, owner: str | None = None) -> None:
        """Make the conversation exactly `messages` in one transaction (`owner` as in `commit`)."""
        await self._run_write(key, messages, None, owner)

    async def delete(self, key: str, *, owner: str | None = None) -> None:
        """Remove the conversation, and the turn ids it recorded, in one transaction (`owner` as in
        `commit`)."""
        await self._run_write(key, (), None, owner, delete=True)

    async def _run_write(
        self,
        key: str,
        messages: Sequence[ChatMessage],
        drop: int | None,
        owner: str | None,
        turn: str | None = None,
        *,
        delete: bool = False,
    ) -> None:
        """`drop=None` removes every row first (`replace`, `delete`)."""
        # Serialize here, before the thread: a message that does not serialize fails before any I/O.
        bodies = [message_to_json(m).decode() for m in messages]

        def write() -> bool:
            with self._use() as db, self._writes:
                return _transaction(db, lambda: apply(db))

        def apply(db: sqlite3.Connection) -> bool:
            if turn is not None:
                if db.execute(_TURN_OF, (key, turn)).fetchone() is not None:
                    return True  # this turn is stored already
            if owner is not None and not _owns(db, key, owner):
                return False
            if turn is not None:
                db.execute(_ADD_TURN, (key, turn))
                db.execute(_FORGET_TURNS, (key, key, TURNS_REMEMBERED))
            if delete:
                db.execute(_DELETE_TURNS, (key,))
            if drop is None:
                db.execute(_DELETE, (key,))
            elif drop:
                db.execute(_DROP, (key, key, drop))
            if bodies:
                (last,) = db.execute(_LAST, (key,)).fetchone()
                db.executemany(_INSERT, [(key, last + i, body) for i, body in enumerate(bodies, 1)])
            return True

        if not await anyio.to_thread.run_sync(write):
            raise ConversationLockLostError(
                f"the lock on conversation {key!r} is no longer held by {owner!r}: nothing was written"
            )

    async def save_pending(self, key: str, run: str, data: bytes, *, owner: str | None = None) -> None:
        """Keep the conversation's pending turn (one row per conversation; `owner` as in `commit`)."""

        def apply(db: sqlite3.Connection) -> bool:
            if owner is not None and not _owns(db, key, owner):
                return False
            db.execute(_SAVE_PENDING, (key, run, data))
            return True

        await self._pending_write(key, owner, apply)

    async def load_pending(self, key: str) -> tuple[str, bytes] | None:
        """The conversation's pending turn (run id, data), or `None`."""

        def read() -> tuple[str, bytes] | None:
            with self._use() as db:
                row = db.execute(_LOAD_PENDING, (key,)).fetchone()
            return (str(row[0]), bytes(row[1])) if row is not None else None

        return await anyio.to_thread.run_sync(read)

    async def take_pending(self, key: str, run: str, *, owner: str | None = None) -> bytes | None:
        """Remove and return the pending turn `run` in one transaction (`None` if it is not there)."""
        taken: list[bytes] = []

        def apply(db: sqlite3.Connection) -> bool:
            if owner is not None and not _owns(db, key, owner):
                return False
            row = db.execute(_PENDING_OF, (key, run)).fetchone()
            if row is not None:
                db.execute(_DROP_PENDING, (key, run))
                taken.append(bytes(row[0]))
            return True

        await self._pending_write(key, owner, apply)
        return taken[0] if taken else None

    async def _pending_write(
        self, key: str, owner: str | None, apply: Callable[[sqlite3.Connection], bool]
    ) -> None:
        def write() -> bool:
            with self._use() as db, self._writes:
                return _transaction(db, lambda: apply(db))

        if not await anyio.to_thread.run_sync(write):
            raise ConversationLockLostError(
                f"the lock on conversation {key!r} is no longer held by {owner!r}: nothing was written"
            )

    async def try_lock(self, key: str, owner: str) -> bool:
        """Take the lease row if there is none, it expired or `owner` holds it (one upsert); when
        taken, the renewer renews it, and a caller that stopped waiting meanwhile has it given back (see
        `LeaseRenewer.attempt`)."""
        return await self._renewer.take(
            key, owner, lambda: self._take(key, owner), lambda: self._give_back(key, owner)
        )

    async def unlock(self, key: str, owner: str) -> None:
        """Stop renewing, then delete the lease row only if `owner` still holds it."""
        await self._renewer.give_back(key, owner, lambda: self._give_back(key, owner))

    def _take(self, key: str, owner: str) -> bool:
        with self._use() as db, self._writes:
            now = time.time()
            return db.execute(_TAKE, (key, owner, now + self._lease_seconds, now)).rowcount == 1

    def _give_back(self, key: str, owner: str) -> None:
        with self._use() as db, self._writes:
            db.execute(_UNLOCK, (key, owner))

    def _renew(self, leases: Collection[tuple[str, str]]) -> Collection[tuple[str, str]]:
        """In the renewer's thread (its own connection): extend every lease still held by its owner,
        in one transaction, and return those another owner has now or whose row is gone."""
        expires = time.time() + self._lease_seconds
        with self._use() as db, self._writes:
            return _transaction(
                db, lambda: [(k, o) for k, o in leases if db.execute(_RENEW, (expires, k, o)).rowcount != 1]
            )

    def close(self) -> None:
        """Stop renewing every lease (they expire within a lease) and close the connections of this
        store, each once the operation using it ended; a later operation opens new connections."""
        for key, owner in self._renewer.held():
            self._renewer.release(key, owner)
        with self._lock:
            connections = list(self._connections)
            self._connections.clear()
        for conn in connections:
            with conn.busy:
                conn.closed = True
                conn.db.close()

    async def aclose(self) -> None:
        """`close`, for code that closes stores with `await`."""
        self.close()


def _owns(db: sqlite3.Connection, key: str, owner: str) -> bool:
    """Whether `owner` holds the conversation's lease (an expired one still its own counts: nobody
    else wrote since, or they would own it)."""
    row = db.execute(_OWNER, (key,)).fetchone()
    return row is not None and row[0] == owner


def _transaction(db: sqlite3.Connection, body: Callable[[], _T]) -> _T:
    """Run `body` in a write transaction, taken up front (`BEGIN IMMEDIATE`) so that it never fails
    half-way to upgrade a read lock; commit, or roll back on any error before returning."""
    db.execute("BEGIN IMMEDIATE")
    try:
        result = body()
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.rollback()
        raise
    return result


def _enable_wal(db: sqlite3.Connection) -> None:
    """Switch the file to WAL (a setting the file keeps). The switch needs the file to itself and
    SQLite does not call the busy handler for it: when processes open a new file at once, all but one
    get "database is locked" at once, so retry until the busy timeout."""
    deadline = time.monotonic() + _BUSY_TIMEOUT
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)
