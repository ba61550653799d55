"""The virtual clock used by timing tests, and offered to users' tests by `agentrt.testing`, really is
virtual, on both backends."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from test_readme import python_blocks

import agentrt
from agentrt.testing import Delay, ScriptedModel, virtual_clock

ROOT = Path(__file__).resolve().parent.parent


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


# --- agentrt.testing.virtual_clock: the same virtual time for users' own tests ---------------------


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_virtual_clock_runs_anyio_on_virtual_time(backend: str) -> None:
    seen: list[float] = []

    async def main() -> None:
        start = anyio.current_time()
        sum(range(10_000))  # work takes real time, never virtual time
        await anyio.lowlevel.checkpoint()
        # Checked here, before the sleeps: on a real clock they would take an hour.
        assert anyio.current_time() == start
        seen.append(anyio.current_time() - start)
        await anyio.sleep(3600)
        seen.append(anyio.current_time() - start)
        with anyio.move_on_after(60):
            await anyio.sleep_forever()
        seen.append(anyio.current_time() - start)

    anyio.run(main, backend=backend, backend_options=virtual_clock(backend))

    assert seen == [0, pytest.approx(3600), pytest.approx(3660)]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_budget_is_cut_on_virtual_time(backend: str) -> None:
    class Helpdesk:
        async def ask(self, question: str) -> str: ...

    model = ScriptedModel([Delay(60), "too late"])
    helpdesk = agentrt.build(Helpdesk, model=model, budget=agentrt.Budget(seconds=5))

    async def main() -> float:
        start = anyio.current_time()
        with pytest.raises(agentrt.BudgetExceededError):
            await helpdesk.ask("Hi")
        return anyio.current_time() - start

    elapsed = anyio.run(main, backend=backend, backend_options=virtual_clock(backend))

    assert elapsed == pytest.approx(5)
    assert model.streams[0].closed


def test_virtual_clock_names_the_backends_it_knows() -> None:
    with pytest.raises(ValueError, match="'asyncio' or 'trio'"):
        virtual_clock("curio")


def test_the_readme_testing_block_runs_under_pytest_on_both_backends(tmp_path: Path) -> None:
    (block,) = [b for b in python_blocks() if "virtual_clock" in b]
    (tmp_path / "test_timeouts.py").write_text(block)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }

    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error", "test_timeouts.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )

    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout


def test_a_virtual_asyncio_loop_closes_after_work_in_the_default_executor() -> None:
    # A DNS lookup (or any run_in_executor) leaves the default executor's threads to join when the
    # loop closes; on virtual time a join timeout would expire at once (Python 3.12+ warns "The
    # executor did not finishing joining its threads within 300 seconds").
    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, time.sleep, 0.05)
        await loop.getaddrinfo("localhost", 80)

    anyio.run(main, backend="asyncio", backend_options=virtual_clock("asyncio"))
