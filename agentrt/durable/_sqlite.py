"""DBOS on an SQLite library older than 3.42 under Python 3.12+ (Debian 12's 3.40)."""

from __future__ import annotations

import sqlite3
import sys
import time
from typing import Any, Final

__all__ = ["SUBSEC_MISSING", "SubsecConnection"]

SUBSEC_MISSING: Final = sys.version_info >= (3, 12) and sqlite3.sqlite_version_info < (3, 42)
"""DBOS's SQLite schema and queries on Python 3.12+ read the time as `unixepoch('subsec')`, a modifier
SQLite has from 3.42 on; an older library (Debian 12's 3.40) gives NULL and every launch fails on a
NOT NULL column. On such a library each DBOS connection gets its own `unixepoch` (below)."""


def _unixepoch(value: object) -> float | int | None:
    """`unixepoch(x)` for one argument: the time in seconds with its fraction for `'subsec'` (what
    SQLite 3.42 gives), otherwise what SQLite's own function gives."""
    if value == "subsec":
        return time.time()
    with sqlite3.connect(":memory:") as builtin:
        row = builtin.execute("SELECT unixepoch(?)", (value,)).fetchone()
    return row[0] if row else None


class SubsecConnection(sqlite3.Connection):
    """A connection whose one-argument `unixepoch` knows `'subsec'` (an application-defined function
    overrides SQLite's built-in one of the same name and arity)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.create_function("unixepoch", 1, _unixepoch)
