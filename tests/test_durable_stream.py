"""A durable turn's text without DBOS: the reader (`DurableStream`) over scripted stream values, and
the writer (`fold`) over scripted events with a fake DBOS. Neither part needs DBOS's loop, so these
run on asyncio and trio (tests/test_durable.py runs the real thing, asyncio only)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import agentrt
from agentrt import RESET
from agentrt._events import FailedEvent, TextDelta
from agentrt._pipeline import StopAtBoundary
from agentrt.durable import DurableStream, _stream

# A turn's stream as its segments write it (see agentrt/durable/_stream.py): segment 1 shows an
# answer, its worker dies, it runs again (retracted); the turn waits for approval; segment 3 resets
# once, dies after showing text, runs again; segment 4 (the commit) shows nothing.
VALUES: list[Any] = [
    {"segment": 0},
    ["Let me look. "],
    {"segment": 1},
    ["Order ", "A1 "],
    {"segment": 1},
    ["Order ", "A1 ", "is "],
    ["paid."],
    {"approval": "r1"},
    {"segment": 2},
    {"segment": 3},
    ["Refunded, ", None, "Refunded A1 "],
    {"segment": 3},
    ["Refunded, ", None, "Refunded A1 ", "politely."],
    {"segment": 4},
]
# What a reader reads ("|": where it stops for the approval, and a new reader goes on).
WHOLE: list[str] = [
    "Let me look. ",
    "Order ",
    "A1 ",
    RESET,
    "Let me look. ",  # the dead run retracted, what was held before its segment again
    "Order ",
    "A1 ",
    "is ",
    "paid.",
    "|",
    "Refunded, ",
    RESET,
    "Refunded A1 ",
    RESET,  # held before segment 3: "Let me look. Order A1 is paid.", which comes again
    "Let me look. Order A1 is paid.",
    "Refunded, ",
    RESET,
    "Refunded A1 ",
    "politely.",
]


async def values(script: list[Any]) -> Any:
    for value in script:
        yield value


async def read_on(script: list[Any], offset: int, failed: Any = None) -> list[str]:
    """What readers read from `offset` on, each approval read past by a new reader at the
    previous one's `offset` (as after a decision)."""
    seen: list[str] = []
    for _ in range(VALUES.count({"approval": "r1"}) + 1):  # (a reader that never gets past one: fails)
        async with DurableStream(values(script), "t1", offset, *([failed] if failed else [])) as tokens:
            seen += [token async for token in tokens]
        if not tokens.waiting:
            return seen
        seen.append("|")
        offset = tokens.offset
    raise AssertionError(f"readers stopped at more approvals than the turn has: {seen}")


async def test_a_reader_retracts_a_dead_segment_and_stops_at_an_approval() -> None:
    assert await read_on(VALUES, 0) == WHOLE


@pytest.mark.parametrize("offset", range(len(WHOLE) + 1))
async def test_a_reader_made_at_another_ones_offset_reads_on_exactly_where_that_one_stopped(
    offset: int,
) -> None:
    """Mid-answer too: a reader that left off before a dead segment's retraction gets it (`RESET`
    and what it held before that segment), as the reader it replaces would have."""
    async with DurableStream(values(VALUES), "t1") as first:
        seen = [await anext(first) for _ in range(min(offset, 9))]  # (9: the approval)
    assert first.offset == len(seen)
    rest = WHOLE[len(seen) :]
    assert await read_on(VALUES, first.offset) == rest
    # Any offset a reader could have reached (its tokens and stops, counted) reads on from there.
    assert await read_on(VALUES, offset) == WHOLE[offset:]


@pytest.mark.parametrize("offset", [-1, 1.5, True, "0"])
async def test_a_bad_offset_is_refused(offset: Any) -> None:
    with pytest.raises(ValueError, match="a stream's offset is an int >= 0"):
        DurableStream(values(VALUES), "t1", offset)


async def test_a_reader_raises_the_error_of_a_turn_that_failed_at_its_end_not_at_an_approval() -> None:
    calls: list[str] = []

    async def failed() -> None:
        calls.append("asked")
        raise agentrt.RateLimitError("slow down")

    async with DurableStream(values(VALUES[:9]), "t1", 0, failed) as tokens:
        assert [token async for token in tokens][-1] == "paid."
    assert (tokens.waiting, calls) == (True, [])  # stopped for approval: the turn goes on
    seen: list[str] = []

    async def read() -> None:
        async with DurableStream(values(VALUES[8:11]), "t1", 0, failed) as tokens:
            async for token in tokens:
                seen.append(token)

    with pytest.raises(agentrt.RateLimitError, match="slow down"):
        await read()
    assert (seen, calls) == (["Refunded, ", RESET, "Refunded A1 "], ["asked"])


class _Stop(StopAtBoundary):
    pass


class FakeDBOS:
    """`DBOS.write_stream_async`, failing from its `fail_at`-th call on."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.written: list[Any] = []

    async def write_stream_async(self, key: str, value: Any) -> None:
        if len(self.written) + 1 >= self.fail_at:
            raise OSError("database is locked")
        self.written.append(value)


async def segment(end: BaseException) -> Any:
    yield TextDelta("Order ")
    yield TextDelta("A1")
    raise end


@pytest.mark.parametrize("fail_at", [1, 99])
async def test_a_segment_whose_text_was_not_all_written_fails_where_it_stops_at_a_boundary(
    monkeypatch: pytest.MonkeyPatch, fail_at: int
) -> None:
    """A write that fails (the database locked, a connection lost) is the segment's failure, with a
    `FailedEvent`: a segment that ends at a boundary does not succeed with its text missing."""
    fake = FakeDBOS(fail_at)
    monkeypatch.setattr(_stream, "DBOS", fake)
    events: list[Any] = []
    turn: Any = SimpleNamespace(id="i1", runtime=SimpleNamespace(listeners=[events.append]), asked=None)
    if fail_at == 99:  # every write succeeds: the segment stops at its boundary
        with pytest.raises(_Stop):
            await _stream.fold(turn, segment(_Stop()))
        assert (["".join(value) for value in fake.written], events) == (["Order A1"], [])
        return
    with pytest.raises(OSError, match="database is locked"):
        await _stream.fold(turn, segment(_Stop()))
    assert [(type(e), str(getattr(e, "error", ""))) for e in events] == [(FailedEvent, "database is locked")]
    # The turn's own error comes first: the write's is secondary.
    with pytest.raises(agentrt.RateLimitError):
        await _stream.fold(turn, segment(agentrt.RateLimitError("slow down")))
