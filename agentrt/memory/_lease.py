"""Lease renewal for shared stores: a daemon thread that renews the locks a process holds, for as
long as the event loop that took each one is alive.

A lock across processes is a lease with an expiry, so that a crashed holder's lock frees itself. A
live holder must renew it for as long as its turn runs, and a turn may wait minutes on a tool or a
slow model without reaching a checkpoint of the pipeline. So renewal is not the pipeline's job: a
thread renews the held leases each `interval` seconds (a third of the lease), on asyncio and trio
alike, with several event loops in several threads.

A process that is alive but stuck must lose its locks as a crashed one does: a lease is renewed
only while the event loop that took it answers. Each round, the thread pings every loop that holds
a lease (a callback scheduled on it from the thread: `call_soon_threadsafe`, trio's `run_sync_soon`)
and renews the leases of the loops that answered the previous round's ping, and those taken since
(their loop was alive then). A loop that stops answering (blocked by a sync call, wedged) loses its
leases between one lease and one lease and a third later; one that answers again within two thirds
of a lease keeps them. A loop that is closed will never answer: its leases are forgotten (they
expire). A loop pays one callback per round, a turn nothing more than noting its loop.

The thread runs only while leases are held, and exits a second after the last one is released
(unless another is taken meanwhile).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from typing import TYPE_CHECKING

import anyio.to_thread

from .. import _backend

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from .._backend import Schedule

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
    """Renews held `(key, owner)` leases from a daemon thread while their event loops answer.

    `renew` is called in that thread with the leases to renew and returns those it could not renew
    (another owner has them now): they are forgotten. It must be a plain blocking function that opens
    its own connections; an error it raises is logged and renewal is tried again next interval.

    A lease belongs to the event loop that took it (`take`, or the `home` given to `hold` and
    `attempt`); one taken outside any event loop (`home=None`) is renewed unconditionally.
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
        # Each held lease: the `home` of the loop that took it, and when it was taken (monotonic).
        self._held: dict[tuple[str, str], tuple[Schedule | None, float]] = {}
        self._attempts: dict[tuple[str, str], Schedule | None] = {}  # try_lock calls under way
        self._abandoned: set[tuple[str, str]] = set()  # ...whose caller stopped waiting
        self._answered: dict[Schedule, float] = {}  # when each loop last answered a ping
        self._pinged = -math.inf  # when the last round pinged the loops
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def hold(self, key: str, owner: str, home: Schedule | None = None) -> None:
        """Renew this lease from now on, while the loop of `home` answers."""
        with self._lock:
            self._hold((key, owner), home)

    def _hold(self, lease: tuple[str, str], home: Schedule | None) -> None:
        self._held[lease] = (home, time.monotonic())
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    # An attempt to take a lock runs in a worker thread, which goes on when its caller stops waiting
    # (a cancellation; an event loop shutting down cancels every task). A lock it takes then would be
    # held and renewed with nobody to release it. So the store announces the attempt (`attempt`), the
    # thread settles it (`settle`), and a caller that stops waiting abandons it (`abandon`): whichever
    # comes second gives the lock back, from a thread, whatever became of the event loop.

    def attempt(self, key: str, owner: str, home: Schedule | None = None) -> None:
        """A `try_lock` for `owner` is about to run in a worker thread, for the loop of `home`."""
        with self._lock:
            self._attempts[key, owner] = home

    def settle(self, key: str, owner: str, taken: bool) -> bool:
        """In the attempt's thread, as it ends: whether to keep the lock it `taken` (it is renewed
        from now on). `False` for a lock taken after its caller stopped waiting: the thread must give
        it back."""
        lease = (key, owner)
        with self._lock:
            home = self._attempts.pop(lease, None)
            abandoned = lease in self._abandoned
            self._abandoned.discard(lease)
            if taken and not abandoned:
                self._hold(lease, home)
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
            if self._held.pop(lease, None) is None:
                return
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
            self._held.pop((key, owner), None)
            if not self._held:
                self._wake.notify()

    async def take(
        self, key: str, owner: str, attempt: Callable[[], bool], give_back: Callable[[], None]
    ) -> bool:
        """A store's `try_lock`: run `attempt` (a blocking call that takes the lock, `True` when taken)
        in a worker thread; renew the lock it takes while the calling event loop answers; give it
        back (`give_back`, blocking) when the caller stopped waiting meanwhile."""
        self.attempt(key, owner, _backend.home())

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
        """The leases held now (renewed while their loops answer)."""
        with self._lock:
            return frozenset(self._held)

    def _answer(self, home: Schedule) -> None:
        """In the loop of `home`: it is alive."""
        answered = time.monotonic()
        with self._lock:
            self._answered[home] = answered

    def _round(self) -> tuple[list[tuple[str, str]], set[Schedule]]:
        """Under the lock, in the thread: the leases to renew now (those of loops that answered since
        the last round, or taken since), and the loops to ping for the next round."""
        since = self._pinged
        answered = self._answered
        due = [
            lease
            for lease, (home, taken) in self._held.items()
            if home is None or taken >= since or answered.get(home, -math.inf) >= since
        ]
        homes = {home for home, _ in self._held.values() if home is not None}
        self._answered = {home: answered[home] for home in homes if home in answered}
        self._pinged = time.monotonic()  # before the pings go: an answer comes after it
        return due, homes

    def _ping(self, homes: Collection[Schedule]) -> None:
        """Ask each loop to answer; forget the leases of the loops that are closed."""
        closed = []
        for home in homes:
            try:
                home(functools.partial(self._answer, home))
            except RuntimeError:  # closed (trio's RunFinishedError is a RuntimeError)
                closed.append(home)
        if closed:
            with self._lock:
                for lease in [lease for lease, (home, _) in self._held.items() if home in closed]:
                    del self._held[lease]
            logger.warning("%s: an event loop closed while holding leases; they expire", self._name)

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
                        self._answered.clear()  # let closed loops go
                        return
                    continue  # renewed at the next interval: linger + interval < the lease
                leases, homes = self._round()
            self._ping(homes)
            if not leases:
                continue
            try:
                lost = self._renew(leases)
            except Exception:  # a store that is down now may be up at the next interval
                logger.warning("%s: could not renew %d lease(s)", self._name, len(leases), exc_info=True)
                continue
            if lost:
                with self._lock:
                    for lease in lost:
                        self._held.pop(lease, None)
