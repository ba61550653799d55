"""The virtual clock used by timing tests really is virtual, on both backends."""

from __future__ import annotations

import time

import anyio
import pytest


@pytest.mark.virtual_clock
async def test_virtual_clock_sleeps_take_no_real_time() -> None:
    real_start, virtual_start = time.monotonic(), anyio.current_time()
    await anyio.sleep(3600)
    with anyio.move_on_after(7200) as scope:
        await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert anyio.current_time() - virtual_start == pytest.approx(3 * 3600, abs=1)
    assert time.monotonic() - real_start < 5


async def test_tests_run_on_both_backends(anyio_backend: tuple[str, dict[str, object]]) -> None:
    import sniffio

    assert sniffio.current_async_library() == anyio_backend[0]
