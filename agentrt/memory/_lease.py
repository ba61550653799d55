"""Lease renewal for shared stores: a daemon thread that renews the locks a process holds.

A lock across processes is a lease with an expiry, so that a crashed holder's lock frees itself. A
live holder must renew it for as long as its turn runs, and a turn may wait minutes on a tool or a
slow model without reaching a checkpoint of the pipeline. So renewal is not the pipeline's job: a
thread renews every held lease each `interval` seconds (a third of the lease), whatever the event
loops of the process are doing, on asyncio and trio alike. The thread runs only while leases are
held, and exits a second after the last one is released (unless another is taken meanwhile).
"""

from __future__ import annotations

import logging
import math
import threading
from typing import TYPE_CHECKING

import anyio.to_thread

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

__all__ = ["MIN_LEASE_SECONDS", "LeaseRenewer", "check_lease_seconds"]

MIN_LEASE_SECONDS = 0.1
"""Shorter leases would be renewed every few milliseconds: a busy loop against the store."""


def check_lease_seconds(value: object, where: str) -> float:
    """`lease_seconds` as a float: a finite number of seconds, at least `MIN_LEASE_SECONDS`."""
    from .._errors import ConfigurationError

    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        value_ok = False
    else:
        value_ok = value >= MIN_LEASE_SECONDS
    if not value_ok:
        raise ConfigurationError(
            f"{where}: lease_seconds must be a finite number of seconds >= {MIN_LEASE_SECONDS}, got {value!r}"
        )
    assert isinstance(value, int | float)
    return float(value)


logger = logging.getLogger("agentrt.memory")


class LeaseRenewer:
    """Renews held `(key, owner)` leases from a daemon thread.

    `renew` is called in that thread with the leases held and returns those it could not renew
    (another owner has them now): they are forgotten. It must be a plain blocking function that opens
    its own connections; an error it raises is logged and renewal is tried again next interval.
    """

    def __init__(
        self,
        renew: Callable[[Collection[tuple[str, str]]], Collection[tuple[str, str]]],
        interval: float,
        name: str,
    ) -> None:
        self._renew = renew
        self._interval = interval
        self._linger = min(1.0, interval)
        self._name = name
        self._held: set[tuple[str, str]] = set()
        self._attempts: set[tuple[str, str]] = set()  # try_lock calls under way in worker threads
        self._abandoned: set[tuple[str, str]] = set()  # ...whose caller stopped waiting
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def hold(self, key: str, owner: str) -> None:
        """Renew this lease from now on."""
        with self._lock:
            self._hold((key, owner))

    def _hold(self, lease: tuple[str, str]) -> None:
        self._held.add(lease)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    # An attempt to take a lock runs in a worker thread, which goes on when its caller stops waiting
    # (a cancellation; an event loop shutting down cancels every task). A lock it takes then would be
    # held and renewed with nobody to release it. So the store announces the attempt (`attempt`), the
    # thread settles it (`settle`), and a caller that stops waiting abandons it (`abandon`): whichever
    # comes second gives the lock back, from a thread, whatever became of the event loop.

    def attempt(self, key: str, owner: str) -> None:
        """A `try_lock` for `owner` is about to run in a worker thread."""
        with self._lock:
            self._attempts.add((key, owner))

    def settle(self, key: str, owner: str, taken: bool) -> bool:
        """In the attempt's thread, as it ends: whether to keep the lock it `taken` (it is renewed
        from now on). `False` for a lock taken after its caller stopped waiting: the thread must give
        it back."""
        lease = (key, owner)
        with self._lock:
            self._attempts.discard(lease)
            abandoned = lease in self._abandoned
            self._abandoned.discard(lease)
            if taken and not abandoned:
                self._hold(lease)
                return True
            return False

    def abandon(self, key: str, owner: str, give_back: Callable[[], None]) -> None:
        """The caller of a `try_lock` stopped waiting for it. A lock it took is given back by
        `give_back` (a blocking call, run in a thread of its own); one it is still taking is given
        back by its own thread (see `settle`)."""
        lease = (key, owner)
        with self._lock:
            if lease in self._attempts:
                self._abandoned.add(lease)
                return
            if lease not in self._held:
                return
            self._held.discard(lease)
            if not self._held:
                self._wake.notify()

        def run() -> None:
            try:
                give_back()
            except Exception:
                logger.warning("%s: could not give back the lock of %r", self._name, key, exc_info=True)

        threading.Thread(target=run, name=f"{self._name} give back", daemon=True).start()

    def release(self, key: str, owner: str) -> None:
        """Stop renewing this lease."""
        with self._lock:
            self._held.discard((key, owner))
            if not self._held:
                self._wake.notify()

    async def take(
        self, key: str, owner: str, attempt: Callable[[], bool], give_back: Callable[[], None]
    ) -> bool:
        """A store's `try_lock`: run `attempt` (a blocking call that takes the lock, `True` when taken)
        in a worker thread; renew the lock it takes; give it back (`give_back`, blocking) when the
        caller stopped waiting meanwhile."""
        self.attempt(key, owner)

        def run() -> bool:
            taken = False
            try:
                taken = attempt()
            finally:
                kept = self.settle(key, owner, taken)
            if taken and not kept:
                give_back()
            return kept

        try:
            return await anyio.to_thread.run_sync(run)
        except BaseException:
            self.abandon(key, owner, give_back)
            raise

    async def give_back(self, key: str, owner: str, give_back: Callable[[], None]) -> None:
        """A store's `unlock`: stop renewing, then `give_back` (blocking) in a worker thread."""

        def run() -> None:
            self.release(key, owner)
            give_back()

        await anyio.to_thread.run_sync(run)

    def held(self) -> frozenset[tuple[str, str]]:
        """The leases renewed now."""
        with self._lock:
            return frozenset(self._held)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._wake.wait(self._interval)
                if not self._held:
                    # Linger a moment before exiting: a thread start costs about as much as a turn's
                    # lock and unlock, and the next turn usually takes a lease right away.
                    self._wake.wait(self._linger)
                    if not self._held:
                        self._thread = None
                        return
                    continue  # renewed at the next interval: linger + interval < the lease
                leases = list(self._held)
            try:
                lost = self._renew(leases)
            except Exception:  # a store that is down now may be up at the next interval
                logger.warning("%s: could not renew %d lease(s)", self._name, len(leases), exc_info=True)
                continue
            if lost:
                with self._lock:
                    self._held.difference_update(lost)
