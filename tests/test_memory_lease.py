"""The lease renewer: its bookkeeping for lock attempts whose caller stopped waiting, and renewal
only while the event loop that took a lease answers.

Plain threads: the renewer runs outside any event loop by design (see `_lease.py`), so these tests
do not run under the anyio plugin; those about event loops start them in threads themselves, on
asyncio and trio. A `give_back` double records which leases it was asked to give back, and in which
thread.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable

import anyio
import pytest

from agentrt.memory._lease import LeaseRenewer


def renewer() -> tuple[LeaseRenewer, list[tuple[str, str]]]:
    renewed: list[tuple[str, str]] = []

    def renew(leases: object) -> list[tuple[str, str]]:
        return []

    return LeaseRenewer(renew, 10.0, name="test"), renewed


class GiveBack:
    def __init__(self) -> None:
        self.called = threading.Event()
        self.thread: threading.Thread | None = None

    def __call__(self) -> None:
        self.thread = threading.current_thread()
        self.called.set()


def test_an_attempt_that_settles_normally_is_renewed() -> None:
    leases, _ = renewer()
    leases.attempt("k", "o")
    assert leases.settle("k", "o", taken=True)
    assert leases.held() == {("k", "o")}
    leases.release("k", "o")


def test_an_attempt_abandoned_in_flight_is_not_kept_when_it_settles() -> None:
    leases, _ = renewer()
    give_back = GiveBack()
    leases.attempt("k", "o")
    leases.abandon("k", "o", give_back)  # the caller stopped waiting; the thread is still at it

    assert not leases.settle("k", "o", taken=True)  # so its thread gives the lock back itself
    assert leases.held() == frozenset()
    assert not give_back.called.is_set()
    assert not leases._attempts and not leases._abandoned  # nothing left over


def test_an_attempt_abandoned_after_it_took_the_lock_gives_it_back_from_a_thread() -> None:
    leases, _ = renewer()
    give_back = GiveBack()
    leases.attempt("k", "o")
    assert leases.settle("k", "o", taken=True)
    leases.abandon("k", "o", give_back)

    assert give_back.called.wait(5)
    assert give_back.thread is not threading.current_thread()
    assert leases.held() == frozenset()


def test_an_abandoned_attempt_that_took_nothing_leaves_nothing() -> None:
    leases, _ = renewer()
    give_back = GiveBack()
    leases.attempt("k", "o")
    assert not leases.settle("k", "o", taken=False)
    leases.abandon("k", "o", give_back)
    assert not give_back.called.wait(0.05)
    assert not leases._attempts and not leases._abandoned and leases.held() == frozenset()


# --- renewal only while the event loop that took the lease answers -----------------------------------
#
# Event loops run in threads of their own here (asyncio and trio alike), as in a process that runs
# several: each test starts `anyio.run` itself. The renewer's interval is short, and each renewal is
# recorded, so that the tests follow the rounds rather than the clock.


class Renewals:
    """A `renew` double: records the leases of each call (none is lost)."""

    def __init__(self) -> None:
        self.calls: list[set[str]] = []
        self.changed = threading.Condition()

    def __call__(self, leases: object) -> list[tuple[str, str]]:
        assert isinstance(leases, list)
        with self.changed:
            self.calls.append({key for key, _ in leases})
            self.changed.notify_all()
        return []

    def wait_for(self, predicate: Callable[[list[set[str]]], bool]) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: predicate(self.calls), timeout=10), self.calls


def nothing() -> None:
    pass


def taken() -> bool:
    return True


@pytest.mark.parametrize(("wedged", "live"), [("asyncio", "trio"), ("trio", "asyncio")])
def test_a_wedged_loop_stops_renewing_its_leases_and_no_other_loops(wedged: str, live: str) -> None:
    renewals = Renewals()
    leases = LeaseRenewer(renewals, 0.01, name="test")
    held = threading.Barrier(3)
    wedge, blocked, unwedge, done = (threading.Event() for _ in range(4))
    errors: list[BaseException] = []

    async def wedged_loop() -> None:
        assert await leases.take("wedged", "o", taken, nothing)
        held.wait()
        await anyio.to_thread.run_sync(wedge.wait)
        blocked.set()
        unwedge.wait(30)  # blocks the event loop: no await
        await anyio.to_thread.run_sync(done.wait)
        await leases.give_back("wedged", "o", nothing)

    async def live_loop() -> None:
        assert await leases.take("live", "o", taken, nothing)
        held.wait()
        await anyio.to_thread.run_sync(done.wait)
        await leases.give_back("live", "o", nothing)

    def run(main: Callable[[], Awaitable[None]], backend: str) -> None:
        try:
            anyio.run(main, backend=backend)
        except BaseException as exc:  # reported below
            errors.append(exc)
            done.set()

    threads = [
        threading.Thread(target=run, args=(wedged_loop, wedged)),
        threading.Thread(target=run, args=(live_loop, live)),
    ]
    for thread in threads:
        thread.start()
    try:
        held.wait(10)
        renewals.wait_for(lambda calls: any(call == {"wedged", "live"} for call in calls))

        wedge.set()
        assert blocked.wait(10)
        start = len(renewals.calls)
        # The round under way may renew the wedged loop's lease, and the next one (its loop answered
        # the ping of the round under way); no round after those does. The live loop's go on.
        renewals.wait_for(lambda calls: len(calls) >= start + 6 and "live" in calls[-1])
        assert all("wedged" not in call for call in renewals.calls[start + 2 :]), renewals.calls[start:]
        assert leases.held() == {("wedged", "o"), ("live", "o")}  # held still: only not renewed

        unwedge.set()  # the loop answers again: its lease is renewed again
        renewals.wait_for(lambda calls: "wedged" in calls[-1])
    finally:
        unwedge.set()
        done.set()
        for thread in threads:
            thread.join(10)
    assert errors == []
    assert leases.held() == frozenset()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_leases_of_a_closed_loop_are_forgotten(backend: str) -> None:
    # A turn left open when its event loop ended (a stream never closed) holds a lease nobody will
    # release: the renewer forgets it, and it expires.
    renewals = Renewals()
    leases = LeaseRenewer(renewals, 0.01, name="test")

    async def main() -> None:
        assert await leases.take("k", "o", taken, nothing)

    anyio.run(main, backend=backend)
    with renewals.changed:
        assert renewals.changed.wait_for(lambda: not leases.held(), timeout=10)


def test_a_lease_held_outside_any_event_loop_is_renewed() -> None:
    renewals = Renewals()
    leases = LeaseRenewer(renewals, 0.01, name="test")
    leases.hold("k", "o")
    renewals.wait_for(lambda calls: len(calls) >= 3)
    assert all(call == {"k"} for call in renewals.calls)
    leases.release("k", "o")


def test_a_lease_is_renewed_in_the_first_round_after_it_was_taken() -> None:
    # Its loop was alive when it took it, so the first round renews it without waiting for an answer
    # to a ping: a lease taken just after a round would otherwise wait the renewer's linger and two
    # rounds for its first renewal, as long as the lease itself. Later rounds want an answer. The
    # loop here is a `home` that never runs what it is sent, as a wedged loop.
    renewals = Renewals()
    leases = LeaseRenewer(renewals, 0.01, name="test")
    leases.hold("always", "o")  # outside any event loop: renewed every round
    renewals.wait_for(lambda calls: len(calls) >= 2)
    pings: list[object] = []
    leases.hold("k", "o", pings.append)

    renewals.wait_for(lambda calls: any("k" in call for call in calls))
    first = next(i for i, call in enumerate(renewals.calls) if "k" in call)
    renewals.wait_for(lambda calls: len(calls) >= first + 4)
    assert all("k" not in call for call in renewals.calls[first + 1 :])
    assert pings  # it was asked to answer
    assert leases.held() == {("always", "o"), ("k", "o")}
    leases.release("always", "o")
    leases.release("k", "o")
