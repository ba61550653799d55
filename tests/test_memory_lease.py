"""The lease renewer's bookkeeping for lock attempts whose caller stopped waiting.

Plain threads, no event loop: the renewer runs outside any event loop by design (see `_lease.py`), so
these tests do not run on asyncio and trio. A `give_back` double records which leases it was asked to
give back, and in which thread.
"""

from __future__ import annotations

import threading

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
