"""Every test runs on asyncio and on trio (the anyio pytest plugin).

Tests marked `virtual_clock` run on virtual time: trio's `MockClock(autojump_threshold=0)` and, on
asyncio, an event loop whose clock jumps to the next timer whenever no I/O is ready. Sleeps and
deadlines then take no real time. Do not combine the mark with real network I/O that takes time: the
clock jumps while the loop waits for it.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

import pytest
from trio.testing import MockClock

pytest_plugins = ["anyio", "redis_server"]


class VirtualTimeEventLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose `time()` is virtual: when nothing is ready, time jumps to the next timer."""

    def __init__(self) -> None:
        super().__init__(selectors.DefaultSelector())
        self._virtual_now = 0.0
        real_select = self._selector.select  # type: ignore[attr-defined]

        def select(timeout: float | None = None) -> list[Any]:
            ready = real_select(0)
            if ready or timeout == 0:
                return ready
            if timeout is None:
                return real_select(None)
            self._virtual_now += timeout
            return []

        self._selector.select = select  # type: ignore[attr-defined]

    def time(self) -> float:
        return self._virtual_now


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    virtual = request.node.get_closest_marker("virtual_clock") is not None
    if request.param == "trio":
        return ("trio", {"clock": MockClock(autojump_threshold=0)} if virtual else {})
    return ("asyncio", {"loop_factory": VirtualTimeEventLoop} if virtual else {})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "virtual_clock: run on virtual time (instant sleeps and deadlines)")
