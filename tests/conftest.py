"""Every test runs on asyncio and on trio (the anyio pytest plugin).

Tests marked `virtual_clock` run on virtual time, as users' tests do with
`agentrt.testing.virtual_clock`: trio's `MockClock(autojump_threshold=0)` and, on asyncio, an event
loop whose clock jumps to the next timer whenever no I/O is ready. Sleeps and deadlines then take no
real time. Do not combine the mark with real network I/O that takes time: the clock jumps while the
loop waits for it.

`make test` runs the suite on several pytest-xdist workers (`--dist loadgroup`), each a pytest session
of its own: session fixtures (a redis-server, mypy's cache) are per worker, temporary paths are the
worker's, servers listen on sockets the worker opened. Tests marked `xdist_group("real-time")` (a
server's event loop blocked while 200 clients hang up, tests/test_sse_cancel_rule.py; uvicorn workers
killed mid-run with a 1 s lease, tests/test_runs_processes.py) run one after another on one worker,
never beside each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrt.testing import virtual_clock

pytest_plugins = ["anyio", "redis_server"]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    virtual = request.node.get_closest_marker("virtual_clock") is not None
    return (request.param, virtual_clock(request.param) if virtual else {})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "virtual_clock: run on virtual time (instant sleeps and deadlines)")
    # pytest-xdist's own mark, named here too so that a run without xdist (`-p no:xdist`) accepts it.
    config.addinivalue_line("markers", "xdist_group(name): on the group's one worker (--dist loadgroup)")


@pytest.fixture(scope="session")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mypy's cache directory for the session's type checks (tests/typecheck.py); under xdist each
    worker has its own session, so no two processes write one cache."""
    return tmp_path_factory.mktemp("mypy-cache")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The approvals' wall clock, set by the test: `clock[0] += 61` moves it on 61 seconds."""
    from agentrt._pipeline import _approve

    now = [1_000_000.0]
    monkeypatch.setattr(_approve, "_now", lambda: now[0])
    return now
