"""Admission in front of a connection pool: a FIFO queue of requests that costs O(1) per release.

httpcore's pool keeps the requests that wait for a connection in its own list and walks that list on
every request and every release: past the pool's size, each token of each stream pays for every waiting
request (1,000 streams through a 100-connection pool cost six times the CPU of a pool large enough).
`AdmittedTransport` lets no more requests into the pool than it has connections; the others wait here,
first come first served, and a release hands its slot straight to the first of them.

A slot is held from the request until its response is closed (the connection is busy until then), and
any task may release it: a stream opened by one task may be closed by another, or by the finalizer of
an abandoned stream.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import anyio
import httpx

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

__all__ = ["Admission", "AdmittedTransport"]


class _Waiter:
    __slots__ = ("event", "granted", "left")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.granted = False
        self.left = False


class Admission:
    """`capacity` slots, taken in the order they were asked for; releasable by any task.

    Cancellation-safe: a waiter cancelled before its turn leaves the queue (it is skipped, in O(1),
    when its turn comes); one cancelled just as a slot was handed to it passes the slot on. A slot is
    never lost, and never given twice.
    """

    __slots__ = ("_free", "_queue")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._free = capacity
        self._queue: deque[_Waiter] = deque()

    @property
    def free(self) -> int:
        """Slots nobody holds or waits for."""
        return self._free

    async def acquire(self) -> None:
        """Take a slot, waiting (first come, first served) while none is free."""
        if self._free:  # a free slot means nobody waits: a release hands slots to waiters first
            self._free -= 1
            return
        waiter = _Waiter()
        self._queue.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:
                self.release()  # handed over as the wait was cancelled: the next one gets it
            else:
                waiter.left = True
            raise

    def release(self) -> None:
        """Give a slot back: to the first waiter still waiting, else to the free slots."""
        queue = self._queue
        while queue:
            waiter = queue.popleft()
            if not waiter.left:
                waiter.granted = True
                waiter.event.set()
                return
        self._free += 1


class AdmittedTransport(httpx.AsyncBaseTransport):
    """A transport that admits at most `capacity` requests into `pool` at once (see the module)."""

    def __init__(self, pool: httpx.AsyncBaseTransport, capacity: int) -> None:
        self._pool = pool
        self.admission = Admission(capacity)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        admission = self.admission
        await admission.acquire()
        try:
            response = await self._pool.handle_async_request(request)
        except BaseException:
            admission.release()
            raise
        response.stream = _Held(response.stream, admission.release)
        return response

    async def aclose(self) -> None:
        await self._pool.aclose()


class _Held(httpx.AsyncByteStream):
    """A response body that gives its slot back when it is closed (once, whatever the close raises)."""

    __slots__ = ("_release", "_stream")

    def __init__(
        self, stream: httpx.SyncByteStream | httpx.AsyncByteStream, release: Callable[[], None]
    ) -> None:
        assert isinstance(stream, httpx.AsyncByteStream)
        self._stream = stream
        self._release: Callable[[], None] | None = release

    def __aiter__(self) -> AsyncIterator[bytes]:
        # The body's own iterator: holding a slot adds nothing to each read.
        return self._stream.__aiter__()

    async def aclose(self) -> None:
        release, self._release = self._release, None
        try:
            await self._stream.aclose()
        finally:
            if release is not None:
                release()
