"""Durable turns (`agentrt.durable`, on DBOS): a worker killed with SIGKILL at a point of a turn, then
the turn recovered by the restarted worker or by another one, on SQLite and on a real Postgres.

asyncio only: DBOS's async workflows need an asyncio loop (under trio they fail with "no running
event loop"), so durable mode is asyncio only; the workers run asyncio whatever the test runs on, and
the tests themselves are marked for asyncio alone. Each worker is a process of its own (DBOS is one
per process; tests/durable_worker.py): the worker kills itself at the point the test chooses, so
no timing decides where it dies.

The turn: a round calling `lookup` (idempotent), a round calling `refund` (not idempotent), an
answer the output guardrail rejects, the accepted answer. After recovery: the turn's value, each
tool's runs (its side-effect file), and the conversation as stored (one whole turn).
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from depth import FULL

from agentrt import RESET
from agentrt.durable import Client
from agentrt.durable._liveness import Heartbeats

pytest_plugins = ["postgres_server"]

# asyncio only (see above): DBOS's async workflows do not run under trio.
pytestmark = pytest.mark.parametrize("anyio_backend", ["asyncio"])

WORKER = str(Path(__file__).with_name("durable_worker.py"))
POINTS = [
    "request:1",  # the first model request
    "lookup_before:1",
    "lookup_after:1",
    "request:2",  # the request after the lookup round
    "refund_before:1",
    "refund_after:1",
    "request:3",  # the answer the guardrail rejects
    "request:4",  # the re-ask
    "commit_after:1",  # the store wrote the turn, DBOS did not record it
]


async def worker(database: str, executor: str, mode: str, directory: Path, kill: str = "") -> Any:
    command = [sys.executable, WORKER, database, executor, mode, str(directory), *([kill] if kill else [])]
    with anyio.fail_after(120):
        return await anyio.run_process(command, check=False)


def runs(directory: Path, tool: str) -> int:
    path = directory / tool
    return len(path.read_text().splitlines()) if path.exists() else 0


async def crash_and_recover(database: str, directory: Path, kill: str, how: str) -> None:
    """w1 runs the turn and dies at `kill`; it is recovered by w1 restarted or by w2 adopting."""
    first = await worker(database, "w1", "start", directory, kill)
    assert first.returncode == -signal.SIGKILL, first.stderr.decode()[-3000:]
    executor = "w1" if how == "restart" else "w2"
    second = await worker(database, executor, how, directory)
    assert second.returncode == 0, second.stderr.decode()[-3000:]
    out = json.loads(second.stdout.decode().splitlines()[-1])

    # The recovering worker's listener sees one run of the turn: started once (a new run, in this
    # process), no failure at the segments' ends, completed.
    events = out["events"]
    assert (events[0], events[-1], events.count("Started")) == ("Started", "Completed", 1), events
    assert not [event for event in events if event.startswith(("Failed", "Cancelled"))], events

    assert_once(directory, kill, out)


def assert_once(directory: Path, kill: str, out: Any) -> None:
    """The turn killed at `kill` completed once: its tools' runs, its value, the conversation."""
    point = kill.split(":")[0]
    # A completed call is never run again; a call killed inside runs again only if idempotent.
    assert runs(directory, "lookup") == (2 if point == "lookup_after" else 1)
    assert runs(directory, "refund") == (0 if point == "refund_before" else 1)
    unknown = point in ("refund_before", "refund_after")
    refund_text = "Error: tool 'refund' failed (OutcomeUnknownError)." if unknown else "refunded A1"
    answer = f"Order A1 is refunded ({refund_text})."
    assert out["value"] == answer
    # One whole turn, stored once: no rejected answer, no second copy.
    assert out["memory"] == whole_turn(refund_text)


def whole_turn(refund_text: str) -> list[list[str]]:
    """The crash tests' turn as memory stores it, once: its refund's result `refund_text`."""
    answer = f"Order A1 is refunded ({refund_text})."
    return [
        ["UserMessage", "Refund A1"],
        ["AssistantMessage", ""],
        ["ToolResultMessage", "order A1: paid"],
        ["AssistantMessage", ""],
        ["ToolResultMessage", refund_text],
        ["AssistantMessage", answer],
    ]


def sqlite(directory: Path) -> str:
    return f"sqlite:///{directory / 'dbos.sqlite'}"


async def test_a_turn_runs_whole_without_a_crash(tmp_path: Path) -> None:
    done = await worker(sqlite(tmp_path), "w1", "start", tmp_path)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = json.loads(done.stdout.decode().splitlines()[-1])
    assert out["value"] == "Order A1 is refunded (refunded A1)."
    assert len(out["memory"]) == 6
    assert (runs(tmp_path, "lookup"), runs(tmp_path, "refund")) == (1, 1)
    # A listener sees one turn, as without durability: started once, no failure where a segment ends.
    assert out["events"] == [
        "Started",
        *["RequestIssued", "ResponseReceived", "ToolCallRequested", "ToolExecuted"] * 2,
        *["RequestIssued", "ResponseReceived", "GuardrailVerdict"] * 2,
        "Completed",
    ]


# make test: each guarantee once, on both databases and both ways of recovering (a worker start is
# ~1 s of CPU: the suite's time); make test-deep: every point, both ways, on both databases.
CHOSEN = [
    ("sqlite", "request:2", "restart"),  # a completed round is not run again
    ("postgres", "refund_after:1", "adopt"),  # killed inside a non-idempotent call: unknown, not re-run
    ("sqlite", "lookup_after:1", "adopt"),  # killed inside an idempotent call: run again
    ("postgres", "commit_after:1", "restart"),  # the commit step run again stores the turn once
]
SWEEP = (
    [(db, point, how) for db in ("sqlite", "postgres") for point in POINTS for how in ("restart", "adopt")]
    if FULL
    else CHOSEN
)


@pytest.mark.exhaustive
@pytest.mark.parametrize(("db", "kill", "how"), SWEEP)
async def test_a_turn_killed_at_a_point_completes_once_after_recovery(
    request: pytest.FixtureRequest, tmp_path: Path, db: str, kill: str, how: str
) -> None:
    if db == "sqlite":
        database = sqlite(tmp_path)
    else:
        database = f"{request.getfixturevalue('postgres_url')}/t{uuid.uuid4().hex}"
    await crash_and_recover(database, tmp_path, kill, how)


# --- approvals -------------------------------------------------------------------------------------
# The turn `a1`: one call of `refund`, which needs approval, then the answer (tests/durable_worker.py).

NOT_WAITING = (
    "ApprovalNotFoundError: agentrt.durable: turn 'a1' does not wait for approval (its state: SUCCESS)"
)


def one_turn(result: str) -> list[list[str]]:
    return [
        ["UserMessage", "Refund A1"],
        ["AssistantMessage", ""],
        ["ToolResultMessage", result],
        ["AssistantMessage", f"Order A1: {result}"],
    ]


def last_line(done: Any) -> Any:
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return json.loads(done.stdout.decode().splitlines()[-1])


def database_for(request: pytest.FixtureRequest, db: str, directory: Path) -> str:
    if db == "sqlite":
        return sqlite(directory)
    return f"{request.getfixturevalue('postgres_url')}/t{uuid.uuid4().hex}"


# make test: the clean approval on Postgres, the approved call killed inside on SQLite (which waits
# across a kill, is recovered and approved from another process too); make test-deep: both on both.
@pytest.mark.exhaustive
@pytest.mark.parametrize(
    ("db", "how"), [("postgres", "a-adopt"), *([("sqlite", "a-restart")] if FULL else [])]
)
async def test_an_approval_waits_across_a_restart_of_every_worker(
    request: pytest.FixtureRequest, tmp_path: Path, db: str, how: str
) -> None:
    """w1 starts the turn and is killed while it waits; w1 restarted (or w2, adopting) recovers it
    and it waits again; another process approves it (twice: a double click); the tool runs once."""
    database = database_for(request, db, tmp_path)
    first = await worker(database, "w1", "a-start", tmp_path)
    assert first.returncode == -signal.SIGKILL, first.stderr.decode()[-3000:]
    assert runs(tmp_path, "refund") == 0
    out = last_line(await worker(database, "w1" if how == "a-restart" else "w2", how, tmp_path))
    assert runs(tmp_path, "refund") == 1
    assert out["value"] == "Order A1: refunded A1"
    assert out["memory"] == one_turn("refunded A1")
    assert out["errors"] == [NOT_WAITING]
    # The recovering worker's listener: the approved run, started once.
    assert out["events"] == ["Started", "ToolExecuted", "RequestIssued", "ResponseReceived", "Completed"]


async def test_a_denied_or_expired_call_never_runs_and_decisions_that_do_not_fit_are_refused(
    tmp_path: Path,
) -> None:
    out = last_line(await worker(sqlite(tmp_path), "w1", "a-deny", tmp_path))
    denied = "The user denied this call of 'refund'; it was not run. Reason: not today"
    assert runs(tmp_path, "refund") == 0
    assert out["value"] == f"Order A1: {denied}"
    assert out["memory"] == one_turn(denied)
    assert out["errors"] == [
        "ApprovalNotFoundError: agentrt.durable: no durable turn 'nope'",
        "ApprovalDecisionError: agentrt.durable: turn 'a1': decisions name calls that are not pending: "
        "['c2']",
        "ApprovalDecisionError: agentrt.durable: turn 'a1': no decision for pending call(s) ['c1']; "
        "decide on every one",
        NOT_WAITING,
    ]
    # Refused by the turn itself (the tool's schema), which then took the denial sent after it.
    assert out["refused"] == [
        "Shop.ask: the edited arguments of call 'c1' (refund) do not validate: order: Input should be a "
        "valid string"
    ]
    # An approval nobody decides: its calls are denied once it expires.
    expired = (
        "The user denied this call of 'refund'; it was not run. "
        "Reason: the approval request expired before anyone decided"
    )
    assert out["expired"]["value"] == f"Order A1: {expired}"
    assert out["expired"]["memory"] == one_turn(expired)
    # As without durability: the stop for approval, then each resumed run starts (the refused edit's
    # fails, as `agentrt.resume` raises it), the denied one completes.
    assert out["events"] == [
        *["Started", "RequestIssued", "ResponseReceived", "ToolCallRequested", "ApprovalRequested"],
        *["Started", "FailedEvent(ApprovalDecisionError)"],
        *["Started", "ToolExecuted", "RequestIssued", "ResponseReceived", "Completed"],
    ]


APPROVED_KILLS = (
    [(db, kill) for db in ("sqlite", "postgres") for kill in ("refund_before:1", "refund_after:1")]
    if FULL
    else [("sqlite", "refund_after:1")]
)


@pytest.mark.exhaustive
@pytest.mark.parametrize(("db", "kill"), APPROVED_KILLS)
async def test_a_worker_killed_inside_an_approved_call_leaves_its_outcome_unknown(
    request: pytest.FixtureRequest, tmp_path: Path, db: str, kill: str
) -> None:
    """w2 recovers the waiting turn, it is approved, and w2 dies inside the approved call (after the
    pending record was claimed); w3 adopts: the call is not run again, its outcome is reported
    unknown, and the turn completes once."""
    database = database_for(request, db, tmp_path)
    first = await worker(database, "w1", "a-start", tmp_path)
    assert first.returncode == -signal.SIGKILL, first.stderr.decode()[-3000:]
    second = await worker(database, "w2", "a-adopt", tmp_path, kill)
    assert second.returncode == -signal.SIGKILL, second.stderr.decode()[-3000:]
    out = last_line(await worker(database, "w3", "A-adopt", tmp_path))
    # Approved twice from the other process (a double click): sent once, read once.
    assert out["unread"] == (0 if db == "sqlite" else None)
    assert runs(tmp_path, "refund") == (0 if kill.startswith("refund_before") else 1)
    unknown = "Error: tool 'refund' failed (OutcomeUnknownError)."
    assert out["value"] == f"Order A1: {unknown}"
    assert out["memory"] == one_turn(unknown)
    assert out["events"] == ["Started", "ToolExecuted", "RequestIssued", "ResponseReceived", "Completed"]


# --- one record per call ---------------------------------------------------------------------------
# A round of two calls of `refund` (not idempotent), run one after the other; the worker is killed in
# one of them. Only a call that started and never finished is of unknown outcome: a call that
# finished before the kill is not run again (its recorded result stands), one never started runs.

PAIR_KILLS = {
    # kill: (refund's side effects, the two results the model reads)
    "refund_before:2": (1, ["refunded A1", "Error: tool 'refund' failed (OutcomeUnknownError)."]),
    "refund_after:2": (2, ["refunded A1", "Error: tool 'refund' failed (OutcomeUnknownError)."]),
    "refund_after:1": (2, ["Error: tool 'refund' failed (OutcomeUnknownError).", "refunded B2"]),
}
PAIRS = (
    [(db, kill, how) for db in ("sqlite", "postgres") for kill in PAIR_KILLS for how in ("restart", "adopt")]
    if FULL
    else [("sqlite", "refund_before:2", "restart")]
)


@pytest.mark.exhaustive
@pytest.mark.parametrize(("db", "kill", "how"), PAIRS)
async def test_a_round_killed_between_two_unsafe_calls_reports_only_the_unfinished_one_unknown(
    request: pytest.FixtureRequest, tmp_path: Path, db: str, kill: str, how: str
) -> None:
    database = database_for(request, db, tmp_path)
    first = await worker(database, "w1", "p-start", tmp_path, kill)
    assert first.returncode == -signal.SIGKILL, first.stderr.decode()[-3000:]
    out = last_line(await worker(database, "w1" if how == "restart" else "w2", f"p-{how}", tmp_path))
    effects, results = PAIR_KILLS[kill]
    assert runs(tmp_path, "refund") == effects
    assert out["value"] == "; ".join(results)
    assert out["memory"] == [
        ["UserMessage", "Refund A1"],
        ["AssistantMessage", ""],
        *(["ToolResultMessage", text] for text in results),
        ["AssistantMessage", "; ".join(results)],
    ]


# --- a failed turn read again ----------------------------------------------------------------------
# DBOS records a turn's error as JSON (type name and message), so a failed turn read from its record
# (started again with its id, `result`, another worker, a replay) raised DBOS's PortableWorkflowError.

NOTE = (
    "agentrt.durable: read from the records of turn {!r}, which keep the error's type and message "
    "only (its other attributes are not recorded)"
)


async def test_a_failed_turn_read_again_raises_agentrt_errors(tmp_path: Path) -> None:
    """`f1` fails with agentrt's `RateLimitError`, `f2` with a `ValueError` (the model's own): read
    again, `f1` raises `RateLimitError` (the recorded message, a note, no other attribute), `f2`
    `TurnFailedError` naming the original; also in another worker, and when the failed step is
    replayed in the workflow (a fork past it)."""
    out = last_line(await worker(sqlite(tmp_path), "w1", "f-run", tmp_path))
    rate = ["RateLimitError", "slow down (status 429)"]
    bug = ["TurnFailedError", "durable turn 'f2' failed with ValueError: boom"]
    assert out["f1"][:3] == [rate, [*rate, NOTE.format("f1")], [*rate, NOTE.format("f1")]]
    assert out["f2"][:3] == [["ValueError", "boom"], bug, bug]
    # The fork: a new turn id, the same error (not `TurnFailedError` naming DBOS's).
    assert out["f1"][3][0] == "RateLimitError"
    assert out["f2"][3][0] == "TurnFailedError"
    assert out["f2"][3][1].endswith("failed with ValueError: boom")
    assert out["f1 attributes"] == [None, None, "slow down (status 429)"]
    assert out["f2 attributes"] == ["ValueError", "boom"]
    # A real failure: one FailedEvent (the segment before it ended silently).
    assert out["f1 events"] == ["Started", "RequestIssued", "FailedEvent(RateLimitError)"]
    assert out["f2 events"] == ["Started", "RequestIssued", "FailedEvent(ValueError)"]
    # A streamed turn that fails: its readers (the one `stream` gives, `Engine.read`, `Client.read`)
    # raise its error where the stream ends, as `result` does, instead of ending as if it completed.
    assert out["f3"] == [[*rate, NOTE.format("f3")]] * 3
    read = last_line(await worker(sqlite(tmp_path), "w2", "f-read", tmp_path))
    assert read["f1"] == [[*rate, NOTE.format("f1")]]
    assert read["f2"] == [bug]


# --- configuration ---------------------------------------------------------------------------------


async def test_a_turn_recovered_more_than_max_recoveries_is_given_up(tmp_path: Path) -> None:
    """`max_recoveries=1`: w1 dies in the first request; restarted, it recovers the turn (once) and
    dies there again; restarted again, the turn is given up: `TurnFailedError`, nothing ran."""
    database = sqlite(tmp_path)
    for _ in range(2):
        died = await worker(database, "w1", "m-start" if _ == 0 else "m-restart", tmp_path, "request:1")
        assert died.returncode == -signal.SIGKILL, died.stderr.decode()[-3000:]
    out = last_line(await worker(database, "w1", "m-restart", tmp_path, "request:1"))
    assert out["value"] == [
        "TurnFailedError",
        "durable turn 't1' failed with MaxRecoveriesExceeded: given up: its workers died in it more "
        "often than max_recoveries lets it be recovered",
        "MaxRecoveriesExceeded",
        "MAX_RECOVERY_ATTEMPTS_EXCEEDED",
    ]
    assert (out["memory"], out["events"]) == ([], [])
    assert (runs(tmp_path, "lookup"), runs(tmp_path, "refund")) == (0, 0)


async def test_retention_deletes_the_records_of_turns_that_ended_before_it(tmp_path: Path) -> None:
    """Kept an hour, a finished turn stays; kept 0 s, it is deleted (as the engine starts, and by
    `prune`), every row of it; a turn that waits for approval is never deleted."""
    database = sqlite(tmp_path)
    kept = last_line(await worker(database, "w1", "r-keep", tmp_path))
    assert kept["pruned"] == []
    assert kept["status"] == {"r1": "SUCCESS", "r2": None, "a1": "PENDING"}
    assert set(kept["rows"].values()) != {0}
    pruned = last_line(await worker(database, "w2", "r-prune", tmp_path))
    assert pruned["pruned"] == ["r2"]  # (r1: deleted as the engine started)
    assert pruned["status"] == {"r1": None, "r2": None, "a1": "PENDING"}
    assert set(pruned["rows"].values()) == {0}


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("max_recoveries", -1, "max_recoveries must be an int >= 0 or None, got -1"),
        ("max_recoveries", 1.5, "max_recoveries must be an int >= 0 or None, got 1.5"),
        ("max_recoveries", True, "max_recoveries must be an int >= 0 or None, got True"),
        ("retention_seconds", -1, "retention_seconds must be a finite number of seconds >= 0 or None"),
        ("retention_seconds", float("inf"), "retention_seconds must be a finite number"),
        ("retention_seconds", "1d", "retention_seconds must be a finite number"),
    ],
)
async def test_bad_configuration_values_are_refused(option: str, value: Any, message: str) -> None:
    from agentrt.durable import Engine

    with pytest.raises(ValueError, match=message):
        Engine(**{option: value})


async def test_a_service_without_memory_whose_calls_may_wait_for_approval_is_refused_at_register(
    tmp_path: Path,
) -> None:
    """Its pending turn would live in one process: refused when registered, not when a turn meets
    the approval (the turn failed there before)."""
    out = last_line(await worker(sqlite(tmp_path), "w1", "n-register", tmp_path))
    assert out["errors"] == [
        "agentrt.durable: service 'forgetful' (Shop) has no memory, but its tool calls may wait for "
        "approval: a durable turn waits only on a service with memory (its pending record lives in the "
        "memory's store, which every worker shares)",
        "agentrt.durable: 'other' is not a service built by agentrt.build (a object)",
    ]


# --- streamed turns --------------------------------------------------------------------------------
# The streamed turn `s1` of `Shop.chat`: "Let me look. " with a call of `lookup`, then the answer
# "Order A1 is paid." token by token. The test reads its text (a `Client`, as a front end would)
# while w1 runs it, kills w1 once the answer's second token arrived (w1's model hangs there), and
# reads on while w1 restarted (or w2, adopting) finishes it.

STREAMED = ["Let me look. ", "Order ", "A1 ", "is ", "paid."]
# What a reader gets: the dead run's answer retracted, the text before it again, the new run's.
RETRACTED = ["Let me look. ", "Order ", "A1 ", RESET, "Let me look. ", *STREAMED[1:]]


@pytest.mark.parametrize(
    ("db", "how"),
    [("sqlite", "adopt"), ("postgres", "restart")]
    if not FULL
    else [(db, how) for db in ("sqlite", "postgres") for how in ("restart", "adopt")],
)
@pytest.mark.exhaustive
async def test_a_streamed_turn_killed_mid_answer_retracts_it_and_streams_the_new_one(
    request: pytest.FixtureRequest, tmp_path: Path, db: str, how: str
) -> None:
    database = database_for(request, db, tmp_path)
    command = [sys.executable, WORKER, database, "w1", "s-start", str(tmp_path)]
    client = None
    try:
        with anyio.fail_after(120):
            async with await anyio.open_process(command) as first:
                assert first.stdout is not None
                assert (await first.stdout.receive()).startswith(b"started")  # the turn exists
                client = Client(database)
                tokens = client.read("s1", polling_seconds=0.02)
                seen = [await anext(tokens) for _ in range(3)]
                assert seen == STREAMED[:3]
                stopped = tokens.offset  # where a reader that left off here would go on
                first.kill()
                assert await first.wait() == -signal.SIGKILL
            executor = "w1" if how == "restart" else "w2"
            async with anyio.create_task_group() as group:
                done: list[Any] = []

                async def recover() -> None:
                    done.append(await worker(database, executor, f"s-{how}", tmp_path))

                group.start_soon(recover)
                seen += [token async for token in tokens]
            out = last_line(done[0])
            assert seen == RETRACTED
            assert out["value"] == "Order A1 is paid."
            assert out["memory"] == [  # one whole turn, the dead run's partial answer not in it
                ["UserMessage", "Refund A1"],
                ["AssistantMessage", "Let me look. "],
                ["ToolResultMessage", "order A1: paid"],
                ["AssistantMessage", "Order A1 is paid."],
            ]
            assert runs(tmp_path, "lookup") == 1  # its round completed before the kill: not run again
            # A reader that comes later reads the same tokens.
            async with client.read("s1", polling_seconds=0.02) as late:
                assert [token async for token in late] == RETRACTED
            # One that goes on where the first left off, mid-answer, gets the retraction too.
            async with client.read("s1", offset=stopped, polling_seconds=0.02) as resumed:
                assert [token async for token in resumed] == RETRACTED[3:]
    finally:
        if client is not None:
            client.close()


# The streamed turn `s1` of `Talk.chat`: `Shop.ask`'s turn (two tool rounds, a re-ask), streamed,
# the rejected answer shown and reset (`optimistic` release). w1 kills itself at the N-th of the
# turn's 23 kill points (every model chunk one of them; N from the seed, each N twice in 50 runs);
# w1 restarted or w2 adopting finishes it while the test reads its text. The text after a reader's
# last `RESET` is the turn's value (a dead run's text never stays: each retraction is explicit), a
# late reader reads the same tokens, and the turn completed once (`assert_once`).
POINTS_OF_A_RUN = 23
RANDOM_RUNS = [(db, seed) for db in ("sqlite", "postgres") for seed in range(50 if FULL else 2)]


@pytest.mark.exhaustive
@pytest.mark.parametrize(("db", "seed"), RANDOM_RUNS)
async def test_a_streamed_turn_killed_at_a_random_point_completes_once_and_reads_consistently(
    request: pytest.FixtureRequest, tmp_path: Path, db: str, seed: int
) -> None:
    database = database_for(request, db, tmp_path)
    # Every point comes twice in 50 runs, in an order drawn at random.
    order = random.Random(db).sample(range(1, POINTS_OF_A_RUN + 1), POINTS_OF_A_RUN)
    point = order[seed % POINTS_OF_A_RUN]
    how = ("restart", "adopt")[seed % 2]
    command = [sys.executable, WORKER, database, "w1", "x-start", str(tmp_path), f"*:{point}"]
    client = None
    try:
        with anyio.fail_after(120):
            async with await anyio.open_process(command) as first:
                assert first.stdout is not None
                with contextlib.suppress(anyio.EndOfStream):  # (killed before it printed it)
                    await first.stdout.receive()
                assert await first.wait() == -signal.SIGKILL
            client = Client(database)
            tokens = client.read("s1", polling_seconds=0.02)
            done: list[Any] = []

            async def recover() -> None:
                done.append(await worker(database, "w1" if how == "restart" else "w2", f"x-{how}", tmp_path))

            async with anyio.create_task_group() as group:
                group.start_soon(recover)
                seen = [token async for token in tokens]
            out = last_line(done[0])
            assert_once(tmp_path, (tmp_path / "killed").read_text(), out)
            shown = seen[len(seen) - seen[::-1].index(RESET) :]  # after the last RESET
            assert "".join(shown) == out["value"], seen
            assert seen.count(RESET) >= 1  # the rejected answer was shown, then reset
            async with client.read("s1", polling_seconds=0.02) as late:
                assert [token async for token in late] == seen
    finally:
        if client is not None:
            client.close()


async def test_a_streamed_turn_stops_at_an_approval_and_is_read_on_from_there(tmp_path: Path) -> None:
    out = last_line(await worker(sqlite(tmp_path), "w1", "sa-run", tmp_path))
    assert (out["first"], out["waiting"]) == (["Checking. "], True)
    assert out["second"] == ["Order ", "A1: ", "refunded ", "A1"]
    assert out["again"] == ["Checking. "]
    assert out["value"] == "Order A1: refunded A1"
    assert runs(tmp_path, "refund") == 1


# --- liveness --------------------------------------------------------------------------------------


async def test_a_worker_that_stopped_beating_has_its_turn_adopted_by_a_live_one(tmp_path: Path) -> None:
    """w1 (beating) dies inside the turn; w2 (beating, `adopt_after=1.0`) is told nothing, takes the
    turn over once w1's last beat is older than a second, and the turn completes once."""
    database = sqlite(tmp_path)
    first = await worker(database, "w1", "l-start", tmp_path, "refund_after:1")
    assert first.returncode == -signal.SIGKILL, first.stderr.decode()[-3000:]
    out = last_line(await worker(database, "w2", "l-wait", tmp_path))
    assert_once(tmp_path, "refund_after:1", out)


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_heartbeats_say_who_stopped_beating_and_one_worker_takes_each(
    request: pytest.FixtureRequest, tmp_path: Path, db: str
) -> None:
    database = sqlite(tmp_path) if db == "sqlite" else f"{request.getfixturevalue('postgres_url')}/postgres"
    w1, w2, w3 = (Heartbeats(database, name) for name in ("w1", "w2", "w3"))
    try:
        w1.beat(now=100.0)
        w2.beat(now=105.0)
        w3.beat(now=105.5)
        assert w2.stale(3.0, now=106.0) == ["w1"]  # older than 3 s; never the asker itself
        assert w3.stale(3.0, now=106.0) == ["w1"]
        assert w2.stale(10.0, now=106.0) == []
        # Both see w1 stale: only one of them removes its row (and adopts its turns).
        assert [w2.forget("w1", 3.0, now=106.0), w3.forget("w1", 3.0, now=106.0)] == [True, False]
        assert w2.stale(3.0, now=106.0) == []
        # A worker that beat again meanwhile is not given up.
        w1.beat(now=107.0)
        assert w2.forget("w1", 3.0, now=108.0) is False
        assert w3.stale(3.0, now=108.0) == []
        assert w1.stale(3.0, now=110.0) == ["w2", "w3"]
    finally:
        for beats in (w1, w2, w3):
            beats.close()


# --- the conversation's lock -----------------------------------------------------------------------


async def test_a_durable_turn_holds_its_conversation_from_its_first_segment_to_its_commit(
    tmp_path: Path,
) -> None:
    """Another turn on the conversation, started during the durable turn's first tool round, waits
    for the durable turn's commit, not for the end of the segment it was started in."""
    out = last_line(await worker(sqlite(tmp_path), "w1", "k-run", tmp_path))
    # The lock is the turn's own: a worker recovering the turn takes it over.
    assert out["owners"] == ["agentrt.turn:k1"]
    assert out["value"] == "Order A1 is refunded (refunded A1)."
    assert out["other"] == "Other answer."
    assert out["memory"] == [
        *whole_turn("refunded A1"),
        ["UserMessage", "Another question"],
        ["AssistantMessage", "Other answer."],
    ]


# --- a call of unknown outcome, as an approval -----------------------------------------------------


@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_a_call_of_unknown_outcome_waits_for_a_human_under_the_approval_policy(
    tmp_path: Path, decision: str
) -> None:
    """w1 dies inside `refund` (after its side effect); w2 adopts the turn, which asks a human about
    that call before the round runs anything; approved, it runs again (the human chose: two
    refunds); denied, it does not, and the model is told why."""
    database = sqlite(tmp_path)
    first = await worker(database, "w1", "u-start", tmp_path, "refund_after:1")
    assert first.returncode == -signal.SIGKILL, first.stderr.decode()[-3000:]
    out = last_line(await worker(database, "w2", f"u-{decision}", tmp_path))
    assert out["asked"] == [["c2", "refund", {"order": "A1"}]]
    if decision == "approve":
        refund_text = "refunded A1"
    else:
        refund_text = (
            "The user chose not to run this call of 'refund' again; whether its first run took effect "
            "is unknown. Reason: it went through"
        )
    assert runs(tmp_path, "refund") == (2 if decision == "approve" else 1)
    assert runs(tmp_path, "lookup") == 1
    answer = f"Order A1 is refunded ({refund_text})."
    assert out["value"] == answer
    assert out["memory"] == whole_turn(refund_text)


async def test_an_approved_call_killed_inside_is_put_to_a_human_under_the_approval_policy(
    tmp_path: Path,
) -> None:
    """The round of an approval: w2 resumes it approved and dies inside `refund`; w3 (policy
    "approval") adopts the turn, asks a human about the call (not about the approval, claimed
    already), who approves it: it runs again, and the turn completes (it failed with
    ApprovalNotFoundError: the re-run round looked for the pending record its dead run had claimed)."""
    database = sqlite(tmp_path)
    first = await worker(database, "w1", "a-start", tmp_path)
    assert first.returncode == -signal.SIGKILL, first.stderr.decode()[-3000:]
    second = await worker(database, "w2", "a-adopt", tmp_path, "refund_after:1")
    assert second.returncode == -signal.SIGKILL, second.stderr.decode()[-3000:]
    out = last_line(await worker(database, "w3", "uA-adopt", tmp_path))
    assert runs(tmp_path, "refund") == 2
    assert out["value"] == "Order A1: refunded A1"
    assert out["memory"] == one_turn("refunded A1")


async def test_a_call_run_again_on_a_human_approval_and_killed_inside_is_asked_about_again(
    tmp_path: Path,
) -> None:
    """w1 dies inside `refund`; w2 asks, is told to run it again, and dies inside it again; w3 asks
    again (a new approval, its own run id: the same decision sent again is not taken for the first
    one's double click) rather than run it a third time on the first approval."""
    database = sqlite(tmp_path)
    first = await worker(database, "w1", "u-start", tmp_path, "refund_after:1")
    assert first.returncode == -signal.SIGKILL, first.stderr.decode()[-3000:]
    second = await worker(database, "w2", "u-crash", tmp_path, "refund_after:1")
    assert second.returncode == -signal.SIGKILL, second.stderr.decode()[-3000:]
    out = last_line(await worker(database, "w3", "u-approve", tmp_path))
    asked = (tmp_path / "asked").read_text().splitlines()
    assert len(asked) == len(set(asked)) == 2, asked
    assert out["asked"] == [["c2", "refund", {"order": "A1"}]]
    assert runs(tmp_path, "refund") == 3  # the first run, and one per approval
    answer = "Order A1 is refunded (refunded A1)."
    assert out["value"] == answer
    assert out["memory"][-2:] == [["ToolResultMessage", "refunded A1"], ["AssistantMessage", answer]]


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_a_worker_whose_clock_is_ahead_does_not_take_a_live_one_for_dead(
    request: pytest.FixtureRequest, tmp_path: Path, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beats are dated by the database's clock, one for every host: w2, on a host whose clock is
    100 s ahead, sees w1's fresh beat as fresh (dated by its own clock, it adopted w1's turns)."""
    from agentrt.durable import _liveness

    database = sqlite(tmp_path) if db == "sqlite" else f"{request.getfixturevalue('postgres_url')}/postgres"
    w1, w2 = (Heartbeats(database, name) for name in (f"w1-{uuid.uuid4().hex}", "w2"))
    try:
        w1.beat()
        ahead = time.time() + 100.0  # (this host's clock, as a module that dated beats by it reads it)
        clock = type("Clock", (), {"time": staticmethod(lambda: ahead)})
        monkeypatch.setattr(_liveness, "time", clock, raising=False)
        assert w1.executor_id not in w2.stale(3.0)
        assert w2.forget(w1.executor_id, 3.0) is False
    finally:
        for beats in (w1, w2):
            beats.close()


async def test_a_turn_cancelled_through_dbos_raises_for_its_result_and_its_readers(tmp_path: Path) -> None:
    out = last_line(await worker(sqlite(tmp_path), "w1", "c-run", tmp_path))
    assert out["seen"] == ["Looking "]
    cancelled = (
        "Cancelled: durable turn 'c1' failed with Cancelled: "
        "cancelled (through DBOS: `DBOS.cancel_workflow`) before it ended"
    )
    assert out["errors"] == [cancelled, cancelled]
