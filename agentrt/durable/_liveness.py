"""Which workers are alive: a heartbeat row per executor, beside DBOS's tables in its database.

DBOS has no liveness of its own (its hosted Conductor recovers dead executors; self-hosted, the
application must). An engine with `adopt_after` beats from a task of its event loop, so a worker
whose loop is wedged stops beating too, and takes over the pending turns of every executor whose
last beat is older than `adopt_after` (DBOS's recovery hands each turn to exactly one runner, so
two workers adopting the same dead one at once do not run a turn twice). A worker that comes back
after it was given up keeps running the steps it had started: pick `adopt_after` well above the
longest pause a live worker's loop may take.

Beats are dated by the database's clock, not the hosts': one clock for every worker, so a host whose
clock is ahead does not see live workers' beats as old (nor one behind see dead ones as fresh).
"""

from __future__ import annotations

from typing import Final

import sqlalchemy

__all__ = ["Heartbeats"]

_TABLE: Final = "agentrt_executors"
_CREATE: Final = sqlalchemy.text(
    f"CREATE TABLE IF NOT EXISTS {_TABLE} (executor_id TEXT PRIMARY KEY, beat_at DOUBLE PRECISION NOT NULL)"
)
_BEAT: Final = sqlalchemy.text(
    f"INSERT INTO {_TABLE} (executor_id, beat_at) VALUES (:executor, :now) "
    "ON CONFLICT (executor_id) DO UPDATE SET beat_at = excluded.beat_at"
)
_STALE: Final = sqlalchemy.text(
    f"SELECT executor_id FROM {_TABLE} WHERE beat_at < :before AND executor_id <> :executor "
    "ORDER BY executor_id"
)
_FORGET: Final = sqlalchemy.text(f"DELETE FROM {_TABLE} WHERE executor_id = :executor AND beat_at < :before")
_CLOCK: Final = {  # the database's time, in seconds since the epoch
    "sqlite": sqlalchemy.text("SELECT (julianday('now') - 2440587.5) * 86400.0"),
    "postgresql": sqlalchemy.text("SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"),
}


def _url(database: str) -> sqlalchemy.URL:
    url = sqlalchemy.make_url(database)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")  # the driver DBOS brings
    return url


class Heartbeats:
    """The heartbeat rows of the engines on `database` (DBOS's database: an SQLite or Postgres URL),
    seen from the executor `executor_id`. Blocking calls: run them in a worker thread."""

    def __init__(self, database: str, executor_id: str) -> None:
        url = _url(database)
        options = {"connect_args": {"timeout": 30}} if url.drivername.startswith("sqlite") else {}
        self._engine = sqlalchemy.create_engine(url, **options)
        self.executor_id = executor_id
        self._clock = _CLOCK["sqlite" if url.drivername.startswith("sqlite") else "postgresql"]
        with self._engine.begin() as db:
            db.execute(_CREATE)

    def _now(self, db: sqlalchemy.Connection, now: float | None) -> float:
        return float(db.execute(self._clock).scalar_one()) if now is None else now

    def beat(self, now: float | None = None) -> None:
        """This executor is alive (at `now`, seconds since the epoch; default: the database's time)."""
        with self._engine.begin() as db:
            db.execute(_BEAT, {"executor": self.executor_id, "now": self._now(db, now)})

    def stale(self, after: float, now: float | None = None) -> list[str]:
        """The other executors whose last beat is older than `after` seconds."""
        with self._engine.begin() as db:
            before = self._now(db, now) - after
            rows = db.execute(_STALE, {"before": before, "executor": self.executor_id})
            return [str(row[0]) for row in rows]

    def forget(self, executor_id: str, after: float, now: float | None = None) -> bool:
        """Remove `executor_id`'s row if it is still stale (a worker that beat again meanwhile
        keeps it); whether it was removed: only the worker that removed it adopts its turns."""
        with self._engine.begin() as db:
            before = self._now(db, now) - after
            return db.execute(_FORGET, {"executor": executor_id, "before": before}).rowcount == 1

    def close(self) -> None:
        self._engine.dispose()
