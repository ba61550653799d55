"""Approval across processes: a turn suspended in one Python process, resumed in another, on SQLite (a
file) and on a real redis-server (tests/redis_server.py).

Each process is a run of tests/approval_worker.py (its own interpreter, its own store instance; the
suspending one on the test's async backend, the resuming ones on the other). Its model answers the
user with three calls in one round: `refund A 5` and `refund B 7` need approval, `lookup A` does not.
Every tool call appends a line `PID TOOL ORDER AMOUNT` to a counter file: the side effect, which shows
which process ran which call, and how many times. What the store holds is read back by this process
through a store of its own.

One test suspends its turn in a child process that runs a function of this module
(`suspend_in_this_process`, the service built as an application builds it), and resumes it here.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import approval_worker as worker
import orjson
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from test_approval import ANSWER, GATED_ROUND, Support, tool_results

import agentrt
from agentrt import (
    ApprovalNotFoundError,
    ApprovalRequired,
    Approve,
    AssistantMessage,
    ChatMessage,
    ToolResultMessage,
    UserMessage,
    tool,
)
from agentrt.memory import ChatMemory, InMemoryStore, RedisStore, SQLiteStore, access
from agentrt.testing import ScriptedModel

WORKER = Path(worker.__file__)
ROOT = WORKER.parent.parent  # the worktree: the workers import this agentrt
QUESTION = "refund both orders"
SECONDS = 60  # the most a test waits for its workers (they take about a second each)


@dataclass
class Where:
    """One test's data in one kind of shared store, and the counter file its tools append to."""

    kind: str
    store: list[str]
    counter: Path
    backend: str
    made: list[SQLiteStore | RedisStore] = field(default_factory=list)

    def open(self) -> SQLiteStore | RedisStore:
        """A store of this process on the workers' data."""
        store: SQLiteStore | RedisStore
        if self.kind == "sqlite":
            store = SQLiteStore(self.store[1])
        else:
            store = RedisStore(self.store[1], prefix=self.store[2])
        self.made.append(store)
        return store

    @property
    def other_backend(self) -> str:
        return "trio" if self.backend == "asyncio" else "asyncio"

    def job(self, action: str, **fields: Any) -> dict[str, Any]:
        backend = self.backend if action == "suspend" else self.other_backend
        job = {"store": self.store, "counter": str(self.counter), "backend": backend, "view": "result"}
        return {**job, "action": action, **fields}

    def calls(self) -> list[tuple[int, str]]:
        """The tool calls made so far, in the order they ran: (the process that ran it, `TOOL ORDER
        AMOUNT`). The calls of one round run concurrently: compare those sorted."""
        if not self.counter.exists():
            return []
        lines = self.counter.read_text().splitlines()
        return [(int(pid), rest) for pid, rest in (line.split(" ", 1) for line in lines)]


@pytest.fixture(params=["sqlite", "redis"])
async def where(
    request: pytest.FixtureRequest, tmp_path: Path, anyio_backend_name: str
) -> AsyncIterator[Where]:
    if request.param == "sqlite":
        store = ["sqlite", str(tmp_path / "approvals.db")]
    else:
        url = request.getfixturevalue("redis_url")
        store = ["redis", url, f"test-{uuid.uuid4().hex[:12]}:"]  # tests share the server, never a key
    where = Where(request.param, store, tmp_path / "counter", anyio_backend_name)
    yield where
    for made in where.made:
        await made.aclose()


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


async def run(job: dict[str, Any]) -> dict[str, Any]:
    """Run a worker to its end; its one line of output."""
    with anyio.fail_after(SECONDS):
        done = await anyio.run_process(
            [sys.executable, str(WORKER), json.dumps(job)], check=False, env=_env()
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1, lines
    output: dict[str, Any] = json.loads(lines[0])
    return output


class Started:
    """A worker started with `"ready": true`: it waits for `go()` before it starts its turn."""

    def __init__(self, process: Process, errors: Path) -> None:
        self.process = process
        self.errors = errors
        assert process.stdout is not None
        self.out = BufferedByteReceiveStream(process.stdout)

    async def line(self) -> dict[str, Any]:
        try:
            raw = await self.out.receive_until(b"\n", 1 << 20)
        except (anyio.EndOfStream, anyio.IncompleteRead):
            await self.process.wait()
            raise AssertionError(
                f"the worker exited ({self.process.returncode}): {self.errors.read_text()}"
            ) from None
        output: dict[str, Any] = json.loads(raw)
        return output

    async def go(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(b"go\n")

    async def finish(self) -> None:
        assert await self.process.wait() == 0, self.errors.read_text()


async def resume_at_once(tmp_path: Path, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Start a worker per job, wait until each is ready (imported, built), then let them all go at
    once; their outputs, in the jobs' order."""
    outputs: list[dict[str, Any]] = []
    with anyio.fail_after(SECONDS):
        started: list[Started] = []
        try:
            for index, job in enumerate(jobs):
                errors = tmp_path / f"worker-{index}.err"
                with errors.open("wb") as sink:
                    process = await anyio.open_process(
                        [sys.executable, str(WORKER), json.dumps({**job, "ready": True})],
                        stderr=sink,
                        env=_env(),
                    )
                started.append(Started(process, errors))
            for each in started:
                assert await each.line() == {"pid": each.process.pid, "ready": True}
            for each in started:
                await each.go()
            for each in started:
                outputs.append(await each.line())
            for each in started:
                await each.finish()
        finally:
            for each in started:
                if each.process.returncode is None:
                    each.process.kill()
                await each.process.aclose()
    return outputs


def arguments_of(message: ChatMessage) -> list[tuple[str, str, dict[str, Any]]]:
    assert isinstance(message, AssistantMessage)
    return [(call.id, call.name, json.loads(call.arguments)) for call in message.tool_calls]


def check_whole_turn(stored: list[ChatMessage], results: list[str], *, c3: dict[str, Any]) -> None:
    """The conversation holds the turn once: the user's message, the response with its three calls
    (the third with `c3`, its arguments as run), each call's result in the model's order, the answer."""
    assert len(stored) == 6, stored
    user, asked, *tool_results, answer = stored
    assert isinstance(user, UserMessage)
    assert user.text == QUESTION
    assert arguments_of(asked) == [
        ("c1", "refund", {"order": "A", "amount": 5}),
        ("c2", "lookup", {"order": "A"}),
        ("c3", "refund", c3),
    ]
    assert all(isinstance(m, ToolResultMessage) for m in tool_results)
    assert [(m.tool_call_id, m.text) for m in tool_results if isinstance(m, ToolResultMessage)] == list(
        zip(["c1", "c2", "c3"], results, strict=True)
    )
    assert isinstance(answer, AssistantMessage)
    assert answer.text == "done: " + "; ".join(results)
    assert answer.tool_calls == ()


async def suspend(where: Where, **fields: Any) -> dict[str, Any]:
    """Suspend a turn in a worker; check what it reports and what the store holds then."""
    suspended = await run(where.job("suspend", **fields))
    assert suspended["calls"] == [
        ["c1", "refund", {"order": "A", "amount": 5.0}],
        ["c3", "refund", {"order": "B", "amount": 7.0}],
    ]
    assert suspended["executions"] == [["c2", "lookup", "success", "A shipped"]]
    # The call that needed no approval ran, in the suspending process, before the turn stopped.
    assert where.calls() == [(suspended["pid"], "lookup A -")]
    store = where.open()
    found = await store.load_pending(worker.KEY)
    assert found is not None
    assert found[0] == suspended["run_id"]
    assert await store.load(worker.KEY) == []  # nothing in the history while the turn waits
    return suspended


# --- one process suspends, another resumes, a third finds nothing ---------------------------------


async def test_a_turn_suspended_in_one_process_is_resumed_in_another(where: Where) -> None:
    """Suspended in one process (the call needing no approval ran there, once); a new message from a
    second is refused; a third resumes it (one call approved, one approved with edited arguments):
    the approved calls run there, once each, and the conversation holds the whole turn once; a fourth
    process resuming the same run finds nothing."""
    suspended = await suspend(where)

    # A new message from another process, while the turn waits: refused (the default policy); nothing
    # ran, nothing was stored, the turn still waits.
    refused = await run(where.job("suspend"))
    assert refused["error"] == "ApprovalPendingError"
    assert refused["run_id"] == suspended["run_id"]
    assert len(where.calls()) == 1
    store = where.open()
    assert await store.load(worker.KEY) == []
    found = await store.load_pending(worker.KEY)
    assert found is not None
    assert found[0] == suspended["run_id"]

    decisions = {"c1": {"approve": True}, "c3": {"approve": True, "arguments": {"order": "B", "amount": 3}}}
    resumed = await run(where.job("resume", run_id=suspended["run_id"], decisions=decisions))

    results = ["refunded 5 on A", "A shipped", "refunded 3 on B"]
    assert resumed["value"] == "done: " + "; ".join(results)
    assert resumed["approval"] is False
    # Each approved call ran once, in the resuming process; the lookup did not run again.
    calls = where.calls()
    assert calls[0] == (suspended["pid"], "lookup A -")
    assert sorted(calls[1:]) == [(resumed["pid"], "refund A 5"), (resumed["pid"], "refund B 3")]
    check_whole_turn(await store.load(worker.KEY), results, c3={"order": "B", "amount": 3})
    assert await store.load_pending(worker.KEY) is None

    again = await run(where.job("resume", run_id=suspended["run_id"], decisions=decisions))
    assert again["error"] == "ApprovalNotFoundError"
    assert len(where.calls()) == 3  # nothing ran again
    check_whole_turn(await store.load(worker.KEY), results, c3={"order": "B", "amount": 3})


# --- two processes resume the same run at once --------------------------------------------------


async def test_two_processes_resuming_one_run_at_once_run_it_once(where: Where, tmp_path: Path) -> None:
    """Both start their resumes at once: one locks the conversation, claims the run and finishes the
    turn; the other waits for the lock, then finds the run gone (`ApprovalNotFoundError`). Each
    approved call ran once, in the winner."""
    suspended = await suspend(where)
    decisions = {"c1": {"approve": True}, "c3": {"approve": True}}
    job = where.job("resume", run_id=suspended["run_id"], decisions=decisions)
    first, second = await resume_at_once(tmp_path, [job, job])

    results = ["refunded 5 on A", "A shipped", "refunded 7 on B"]
    won, lost = (first, second) if "value" in first else (second, first)
    assert won["value"] == "done: " + "; ".join(results)
    assert lost.get("error") == "ApprovalNotFoundError", lost
    calls = where.calls()
    assert calls[0] == (suspended["pid"], "lookup A -")
    assert sorted(calls[1:]) == [(won["pid"], "refund A 5"), (won["pid"], "refund B 7")]
    store = where.open()
    check_whole_turn(await store.load(worker.KEY), results, c3={"order": "B", "amount": 7})
    assert await store.load_pending(worker.KEY) is None


# --- each view resumes as itself --------------------------------------------------------------------


@pytest.mark.parametrize("where", ["sqlite"], indirect=True)  # the views do not depend on the store
@pytest.mark.parametrize("view", ["value", "stream"])
async def test_each_view_resumes_in_another_process(where: Where, view: str) -> None:
    """An awaited value method (`ApprovalRequired` when it stops) and a stream method (it ends with the
    event) suspend and resume across processes as the `Result` method does; a denied call is not run
    anywhere, and its denial, with the reason, is its result."""
    suspended = await suspend(where, view=view)
    assert suspended["method"] == {"value": "Shop.say", "stream": "Shop.talk"}[view]
    decisions = {"c1": {"approve": True}, "c3": {"approve": False, "reason": "too late"}}
    resumed = await run(where.job("resume", run_id=suspended["run_id"], decisions=decisions, view=view))
    denial = "The user denied this call of 'refund'; it was not run. Reason: too late"
    results = ["refunded 5 on A", "A shipped", denial]
    assert resumed["value"] == "done: " + "; ".join(results)
    assert where.calls() == [(suspended["pid"], "lookup A -"), (resumed["pid"], "refund A 5")]
    check_whole_turn(await where.open().load(worker.KEY), results, c3={"order": "B", "amount": 7})


@pytest.mark.parametrize("where", ["sqlite"], indirect=True)  # expiry does not depend on the store
async def test_an_approval_expired_by_the_time_another_process_resumes_denies_every_call(
    where: Where,
) -> None:
    """Expiry is wall-clock time, which the processes of a host share: a turn whose approval expired
    (after a millisecond: the resuming process takes longer than that to start) runs no waiting call,
    whatever the decisions say; the model is told why."""
    suspended = await suspend(where, expires_after=0.001)
    decisions = {"c1": {"approve": True}, "c3": {"approve": True}}
    resumed = await run(
        where.job("resume", run_id=suspended["run_id"], decisions=decisions, expires_after=0.001)
    )
    expired = (
        "The user denied this call of 'refund'; it was not run. "
        "Reason: the approval request expired before anyone decided"
    )
    results = [expired, "A shipped", expired]
    assert resumed["value"] == "done: " + "; ".join(results)
    assert where.calls() == [(suspended["pid"], "lookup A -")]
    check_whole_turn(await where.open().load(worker.KEY), results, c3={"order": "B", "amount": 7})


# --- a turn the application suspended in one process, resumed in another (its own service) --------


class LoggedShop:
    """Tools whose side effects are lines of a file, so that two processes can be counted."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _log(self, line: str) -> None:
        with open(self.path, "a") as log:
            log.write(line + "\n")

    @tool("Refund an order.", needs_approval=lambda args, ctx: args["amount"] > 100)
    async def refund(self, order: str, amount: float) -> str:
        self._log(f"refund {order} {amount:g}")
        return f"refunded {amount:g} on {order}"

    @tool("Look an order up.")
    def lookup(self, order: str) -> str:
        self._log(f"lookup {order}")
        return f"{order}: delivered"


def shared_store(kind: str, where: str) -> Any:
    return SQLiteStore(where) if kind == "sqlite" else RedisStore(where, prefix="approval-processes:")


def process_service(kind: str, where: str, log: str, *script: Any) -> tuple[Any, Any]:
    store = shared_store(kind, where)
    svc = agentrt.build(
        Support,
        model=ScriptedModel(*script),
        tools=[LoggedShop(log)],
        memory=agentrt.memory.window(store=store, namespace="approval-processes"),
    )
    return svc, store


async def suspend_in_this_process(kind: str, where: str, log: str, conversation: str) -> str:
    svc, store = process_service(kind, where, log, GATED_ROUND)
    try:
        with pytest.raises(ApprovalRequired) as info:
            await svc.chat(conversation, "refund A1")
        return info.value.approval.run_id
    finally:
        await store.aclose()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_a_turn_suspended_in_one_process_is_resumed_in_another_once(
    kind: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    where = str(tmp_path / "db.sqlite") if kind == "sqlite" else request.getfixturevalue("redis_url")
    log = str(tmp_path / "log")
    conversation = f"c-{uuid.uuid4().hex[:8]}"
    code = (
        "import sys, anyio\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from test_approval_processes import suspend_in_this_process\n"
        f"print(anyio.run(suspend_in_this_process, {kind!r}, {where!r}, {log!r}, {conversation!r}))\n"
    )
    done = await anyio.run_process([sys.executable, "-c", code], check=True)
    run_id = done.stdout.decode().strip().splitlines()[-1]
    assert sorted((await anyio.Path(log).read_text()).splitlines()) == ["lookup A1", "lookup B2"]

    svc, store = process_service(kind, where, log, ANSWER)
    try:
        assert await agentrt.resume(svc, run_id, {"c2": Approve()}, memory_id=conversation) == "Done."
        with pytest.raises(ApprovalNotFoundError):
            await agentrt.resume(svc, run_id, {"c2": Approve()}, memory_id=conversation)
        stored = await access(svc).read(conversation)
        assert [r[0] for r in tool_results(stored)] == ["c1", "c2", "c3"]
    finally:
        await store.aclose()
    lines = (await anyio.Path(log).read_text()).splitlines()
    assert sorted(lines[:2]) == ["lookup A1", "lookup B2"] and lines[2:] == ["refund A1 250"]


# --- budgets ------------------------------------------------------------------------------------------


async def uninterrupted_spending(counter: Path) -> tuple[int, int, int]:
    """What the same turn spends in one piece (no call needs approval), in this process: its model
    requests, tool calls and output tokens."""
    service = agentrt.build(
        worker.Shop,
        model=worker.FunctionModel(worker.answer),
        tools=[worker.Tools(str(counter))],
        memory=ChatMemory(InMemoryStore(), namespace=worker.NAMESPACE),
        approvals=agentrt.Approvals(needs_approval={"refund": False}),
        budget=agentrt.Budget(seconds=SECONDS),
    )
    result = await service.ask(worker.CONVERSATION, QUESTION)
    assert result.spent is not None
    return result.spent.model_requests, result.spent.tool_calls, result.spent.output_tokens


async def test_a_resumed_turn_spends_what_it_had_spent_and_not_the_wait(where: Where, tmp_path: Path) -> None:
    """The seconds the turn had spent when it was saved carry over, and the time between the two
    processes (the second one starting, at least) is not spent; requests, tool calls and tokens carry
    over: the resumed turn spends what the turn spends in one piece."""
    suspended = await suspend(where, budget_seconds=SECONDS)
    found = await where.open().load_pending(worker.KEY)
    assert found is not None
    saved = orjson.loads(found[1])["checkpoint"]["account"]
    assert saved["model_requests"] == 1
    assert 0 < saved["seconds"] <= suspended["spent"]["seconds"]

    decisions = {"c1": {"approve": True}, "c3": {"approve": True}}
    resumed = await run(
        where.job("resume", run_id=suspended["run_id"], decisions=decisions, budget_seconds=SECONDS)
    )
    spent = resumed["spent"]
    # From the saved seconds on, only what the resume itself took (measured in the resuming process
    # around `agentrt.resume` and the turn): the wait for the decision is not in it.
    assert saved["seconds"] <= spent["seconds"] <= saved["seconds"] + resumed["elapsed"]

    whole = await uninterrupted_spending(tmp_path / "in-process-counter")
    assert (spent["model_requests"], spent["tool_calls"], spent["output_tokens"]) == whole


# --- found on the way: a resumed turn's executions were listed as they were recorded ---------------


async def test_a_resumed_results_tool_executions_are_in_the_models_order(tmp_path: Path) -> None:
    """In this process (the order does not depend on where the turn resumes): the uninterrupted turn
    gives c1, c2, c3; the resumed one gives c2, c3, c1."""
    store = SQLiteStore(tmp_path / "order.db")
    try:
        service = agentrt.build(
            worker.Shop,
            model=worker.FunctionModel(worker.answer),
            tools=[worker.Tools(str(tmp_path / "counter"))],
            memory=ChatMemory(store, namespace=worker.NAMESPACE),
        )
        stopped = await service.ask(worker.CONVERSATION, QUESTION)
        assert stopped.approval is not None
        decisions = {"c1": agentrt.Approve(), "c3": agentrt.Deny("no")}
        resumed = await agentrt.resume(
            service, stopped.approval.run_id, decisions, memory_id=worker.CONVERSATION
        )
        assert [e.call_id for e in resumed.tool_executions] == ["c1", "c2", "c3"]
    finally:
        await store.aclose()
