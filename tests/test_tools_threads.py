"""The worker-thread limit of a service's sync tools (`ToolSettings.thread_limit`).

The limit counts tool bodies that run, across event loops and backends, abandoned ones included (a
call cut by its timeout leaves its thread running: it keeps its slot until it returns). Some of these
tests run event loops in several threads at once, which is what they are about: they are plain
functions that start `anyio.run` on asyncio and trio themselves.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import anyio
import pytest

import agentrt
from agentrt import Budget, BudgetExceededError, ToolSettings, tool
from agentrt.testing import CallTool, FunctionModel
from agentrt.tools._threads import ThreadLimiter


class Chat:
    async def ask(self, question: str) -> str: ...


class Gate:
    """A sync tool that blocks until the gate opens; records how many bodies ran at once."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.lock = threading.Condition()
        self.running = 0
        self.most = 0
        self.finished = 0

    @tool("Wait for the gate.")
    def wait(self) -> str:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            self.open.wait(timeout=30)
            return "passed"
        finally:
            with self.lock:
                self.running -= 1
                self.finished += 1
                self.lock.notify_all()


def tool_then_answer(request: agentrt.ModelRequest) -> Any:
    if isinstance(request.messages[-1], agentrt.ToolResultMessage):
        return f"done: {request.messages[-1].text}"
    return [CallTool("wait")]


def test_one_service_called_from_loops_in_several_threads() -> None:
    # Each thread runs its own event loop (asyncio and trio alike); the limit is one for all of
    # them, and no loop waits on another loop's limiter.
    gate = Gate()
    gate.open.set()
    service = agentrt.build(
        Chat, model=FunctionModel(tool_then_answer), tools=[gate], tool_settings=ToolSettings(thread_limit=1)
    )
    answers: list[str] = []
    errors: list[BaseException] = []

    def worker(backend: str) -> None:
        async def main() -> None:
            for _ in range(5):
                answers.append(await service.ask("go"))

        try:
            anyio.run(main, backend=backend)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(b,)) for b in ("asyncio", "trio", "asyncio", "trio")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert answers == ["done: passed"] * 20
    assert gate.most == 1


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_abandoned_tool_threads_keep_their_slots_until_they_return(backend: str) -> None:
    # Calls whose tool times out leave their threads running: with a limit of two, no more than two
    # bodies ever run, the calls that cannot start time out without running theirs, and once the
    # hung bodies return, a later run of the event loop calls tools again.
    gate = Gate()
    service = agentrt.build(
        Chat,
        model=FunctionModel(tool_then_answer),
        tools=[gate],
        tool_settings=ToolSettings(thread_limit=2, timeout=0.05),
    )

    async def hammer() -> list[str]:
        return [await service.ask("go") for _ in range(4)]

    answers = anyio.run(hammer, backend=backend)

    assert all("timed out" in answer for answer in answers)
    assert gate.most == 2
    gate.open.set()
    with gate.lock:  # the two hung bodies return now that the gate is open
        assert gate.lock.wait_for(lambda: gate.finished >= 2, timeout=10)
    assert gate.finished == 2  # the calls that never got a slot never ran their bodies

    assert anyio.run(service.ask, "again", backend=backend) == "done: passed"
    assert gate.most == 2


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_round_cut_at_the_deadline_keeps_the_calls_that_finished(backend: str) -> None:
    class Mixed:
        @tool("Quick.")
        async def quick(self) -> str:
            return "quick"

        @tool("Slow.")
        async def slow(self) -> str:
            await anyio.sleep(30)
            return "slow"

    model = FunctionModel(lambda request: [CallTool("quick", id="q"), CallTool("slow", id="s")])
    service = agentrt.build(Chat, model=model, tools=[Mixed()], budget=Budget(seconds=0.2))

    async def main() -> BudgetExceededError:
        with pytest.raises(BudgetExceededError) as info:
            await service.ask("go")
        return info.value

    error = anyio.run(main, backend=backend)

    assert [(e.name, e.call_id, e.result) for e in error.partial.tool_executions] == [("quick", "q", "quick")]
    assert error.partial.spent is not None and error.partial.spent.tool_calls == 2


# --- ThreadLimiter itself: threads wait for a slot in order, and a call abandoned meanwhile wakes its own --


def waiting_threads() -> int:
    """The threads waiting for a `ThreadLimiter` slot now (seen on their stacks)."""
    code = ThreadLimiter._acquire.__code__
    count = 0
    for frame in sys._current_frames().values():
        walked: FrameType | None = frame
        while walked is not None and walked.f_code is not code:
            walked = walked.f_back
        count += walked is not None
    return count


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(10):
        while True:
            if condition():
                return
            await anyio.sleep(0.005)


class Holder:
    """A tool body that holds its slot until released."""

    def __init__(self) -> None:
        self.holding = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> str:
        self.holding.set()
        self.release.wait(30)
        return "held"


@contextmanager
def held_from_other_loops(limiter: ThreadLimiter, holders: list[Holder], backend: str) -> Iterator[None]:
    """Each holder runs in a call from an event loop of its own, in a thread of its own, holding a
    slot (so the loop under test may start threads of its own: a limiter per loop); released and
    joined on exit."""
    threads = [
        threading.Thread(target=anyio.run, args=(limiter.run, holder), kwargs={"backend": backend})
        for holder in holders
    ]
    for thread in threads:
        thread.start()
    try:
        for holder in holders:
            assert holder.holding.wait(10)
        yield
    finally:
        for holder in holders:
            holder.release.set()
        for thread in threads:
            thread.join(10)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_call_abandoned_while_its_thread_waits_for_a_slot_ends_that_thread(backend: str) -> None:
    # The slot stays taken throughout: the waiting thread ends because its call was abandoned (it is
    # woken: nothing polls), its body never runs, and the slot it waited for is not lost.
    limiter = ThreadLimiter(1)
    holder = Holder()
    ran: list[str] = []

    async def main() -> None:
        with held_from_other_loops(limiter, [holder], backend):
            async with anyio.create_task_group() as tg:
                tg.start_soon(limiter.run, functools.partial(ran.append, "abandoned"))
                await until(lambda: waiting_threads() == 1)
                tg.cancel_scope.cancel()
            await until(lambda: waiting_threads() == 0)
            assert not holder.release.is_set()  # the slot is still taken
        assert await limiter.run(lambda: "again") == "again"  # the holder has returned its slot

    anyio.run(main, backend=backend)
    assert ran == []


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_threads_get_a_freed_slot_in_the_order_they_asked(backend: str) -> None:
    limiter = ThreadLimiter(2)
    holders = [Holder(), Holder()]
    order: list[str] = []

    async def main() -> None:
        with held_from_other_loops(limiter, holders, backend):
            async with anyio.create_task_group() as tg:
                for waiting, name in enumerate(["first", "second"], 1):
                    tg.start_soon(limiter.run, functools.partial(order.append, name))
                    await until(lambda waiting=waiting: waiting_threads() == waiting)
                # One slot frees: the first waiter's, then (once its body returns) the second's.
                holders[0].release.set()

    anyio.run(main, backend=backend)
    assert order == ["first", "second"]
