"""A worker process for the approval tests across processes: suspend a turn, or resume one.

    python tests/approval_worker.py JOB

JOB is JSON: `store` (`["sqlite", PATH]` or `["redis", URL, PREFIX]`), `counter` (a file each tool call
appends a line to: `PID TOOL ORDER AMOUNT`), `backend` (`asyncio` / `trio`), `view` (`result`: a
`Result[str]` method, `value`: a `str` method, `stream`: a `TokenStream` method), `action`:

- `suspend`: ask on conversation "c"; prints `{"run_id", "calls", "executions", "spent"}`, or
  `{"error": "ApprovalPendingError", "run_id"}` when a turn on "c" waits already.
- `resume`: `agentrt.resume` with `run_id` and `decisions` (`{call id: {"approve": true, "arguments"?}
  | {"approve": false, "reason"?}}`); prints `{"value", "executions", "spent", "elapsed"}`, or
  `{"error": TYPE, "message"}` for an `ApprovalError`.

With `"ready": true` the worker prints `{"ready": true}` once built and waits for a line on stdin
before it starts (so that two workers start their resumes at once). `budget_seconds` builds the
service with `Budget(seconds=...)`, `expires_after` with `Approvals(expires_after=...)`. Every line
printed is one JSON object, with the worker's `pid`.

The model is a function of the request, the same in every process: to the user's message it answers
with three calls in one round (refund A 5 and refund B 7 need approval, lookup A does not); to the
tool results, with "done: " and the results in order.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Annotated, Any

import anyio
import anyio.to_thread

import agentrt
from agentrt import (
    ApprovalError,
    ApprovalPendingError,
    ApprovalRequired,
    Approvals,
    Approve,
    Budget,
    Deny,
    MemoryId,
    ModelRequest,
    Result,
    TokenStream,
    ToolResultMessage,
    UserMessage,
    tool,
)
from agentrt.memory import ChatMemory, ChatMemoryStore, RedisStore, SQLiteStore
from agentrt.testing import CallTool, FunctionModel, Script

NAMESPACE = "approvals"
CONVERSATION = "c"
KEY = f'{NAMESPACE}:"{CONVERSATION}"'  # the conversation's key in the store


class Shop:
    async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> Result[str]: ...

    async def say(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...

    async def talk(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


METHODS = {"result": "ask", "value": "say", "stream": "talk"}


class Tools:
    def __init__(self, counter: str) -> None:
        self.counter = counter

    def _count(self, line: str) -> None:
        # O_APPEND: each call's line is one write, whole, whichever process makes it.
        fd = os.open(self.counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{os.getpid()} {line}\n".encode())
        finally:
            os.close(fd)

    @tool("Refund an order.", needs_approval=True)
    async def refund(self, order: str, amount: float) -> str:
        self._count(f"refund {order} {amount:g}")
        return f"refunded {amount:g} on {order}"

    @tool("Look up an order.")
    async def lookup(self, order: str) -> str:
        self._count(f"lookup {order} -")
        return f"{order} shipped"


def answer(request: ModelRequest) -> Script:
    last = request.messages[-1]
    if isinstance(last, UserMessage):
        return [
            CallTool("refund", {"order": "A", "amount": 5}, id="c1"),
            CallTool("lookup", {"order": "A"}, id="c2"),
            CallTool("refund", {"order": "B", "amount": 7}, id="c3"),
        ]
    results = [m.text for m in request.messages if isinstance(m, ToolResultMessage)]
    return ["done: ", "; ".join(results)]


def decision(raw: dict[str, Any]) -> Approve | Deny:
    if raw["approve"]:
        return Approve(arguments=raw.get("arguments"))
    return Deny(raw.get("reason"))


def spent_of(result: Result[Any]) -> dict[str, Any] | None:
    spent = result.spent
    if spent is None:
        return None
    return {
        "seconds": spent.seconds,
        "model_requests": spent.model_requests,
        "tool_calls": spent.tool_calls,
        "output_tokens": spent.output_tokens,
    }


def executions_of(result: Result[Any]) -> list[list[str]]:
    return [[e.call_id, e.name, e.outcome.value, str(e.result)] for e in result.tool_executions]


def emit(**fields: Any) -> None:
    print(json.dumps({"pid": os.getpid(), **fields}), flush=True)


async def suspend(service: Any, view: str) -> None:
    try:
        await _suspend(service, view)
    except ApprovalPendingError as error:  # the conversation has a turn waiting already
        emit(error=type(error).__name__, message=str(error), run_id=error.approval.run_id)


async def _suspend(service: Any, view: str) -> None:
    method = getattr(service, METHODS[view])
    if view == "value":
        try:
            await method(CONVERSATION, "refund both orders")
        except ApprovalRequired as stopped:
            result, approval = stopped.partial, stopped.approval
        else:
            raise AssertionError("the turn did not stop for approval")
    else:
        if view == "result":
            result = await method(CONVERSATION, "refund both orders")
        else:
            async with await method(CONVERSATION, "refund both orders") as stream:
                tokens = [token async for token in stream]
                assert tokens == [], tokens  # the round asked for calls only
                result = await stream.result()
        assert result.approval is not None
        approval = result.approval
    emit(
        run_id=approval.run_id,
        method=approval.method,
        memory_id=approval.memory_id,
        calls=[[c.id, c.tool, c.arguments] for c in approval.calls],
        executions=executions_of(result),
        spent=spent_of(result),
    )


async def resume(service: Any, view: str, run_id: str, decisions: dict[str, Any]) -> None:
    chosen = {call_id: decision(raw) for call_id, raw in decisions.items()}
    start = time.monotonic()
    try:
        resumed = await agentrt.resume(service, run_id, chosen, memory_id=CONVERSATION)
        if view == "value":  # the method's own view: its value
            elapsed = time.monotonic() - start
            emit(value=resumed, elapsed=elapsed)
            return
        if view == "stream":
            async with resumed as stream:
                text = "".join([token async for token in stream])
                result = await stream.result()
            assert text == result.text, (text, result.text)
        else:
            result = resumed
    except ApprovalError as error:
        emit(error=type(error).__name__, message=str(error))
        return
    elapsed = time.monotonic() - start
    emit(
        value=result.value,
        approval=result.approval is not None,
        executions=executions_of(result),
        spent=spent_of(result),
        elapsed=elapsed,
    )


async def main(job: dict[str, Any]) -> None:
    kind, *where = job["store"]
    store: ChatMemoryStore = (
        SQLiteStore(where[0]) if kind == "sqlite" else RedisStore(where[0], prefix=where[1])
    )
    budget = Budget(seconds=job["budget_seconds"]) if job.get("budget_seconds") else None
    service = agentrt.build(
        Shop,
        model=FunctionModel(answer),
        tools=[Tools(job["counter"])],
        memory=ChatMemory(store, namespace=NAMESPACE),
        budget=budget,
        approvals=Approvals(expires_after=job.get("expires_after", 3600.0)),
    )
    try:
        if job.get("ready"):
            emit(ready=True)
            assert (await anyio.to_thread.run_sync(sys.stdin.readline)).strip() == "go"
        if job["action"] == "suspend":
            await suspend(service, job["view"])
        else:
            await resume(service, job["view"], job["run_id"], job["decisions"])
    finally:
        await store.aclose()  # type: ignore[attr-defined]


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    anyio.run(main, job, backend=job["backend"])
