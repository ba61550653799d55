"""A worker process for the durable-turn tests (tests/test_durable.py): DBOS is one per process, and
a crash is a SIGKILL, so each worker is a process of its own.

    python tests/durable_worker.py DATABASE EXECUTOR MODE DIR [KILL]

It runs (MODE `start`), or recovers (`restart`: launched under the same EXECUTOR; `adopt`: launched
as another executor that adopts executor `w1`'s turns), the turn `t1` of `Shop.ask`: a round that
calls `lookup` (idempotent), a round that calls `refund` (not idempotent), an answer the output
guardrail rejects (a re-ask), then the accepted answer. Memory is an `SQLiteStore` in DIR. Each tool
appends a line to DIR/<tool> when it runs (its side effect).

KILL is `POINT:N`: the worker SIGKILLs itself the N-th time it reaches POINT: `request` (in a model
request), `lookup_before` / `lookup_after` / `refund_before` / `refund_after` (in a tool, before or
after its side effect), `commit_after` (the store wrote the turn; DBOS has not recorded the step).

It prints one JSON line: the turn's value and the conversation as stored.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import agentrt
from agentrt import MemoryId, ModelRequest, ToolResultMessage, tool
from agentrt.durable import Engine
from agentrt.guardrails import GuardrailResult, OutputGuardrailRequest, reprompt, success
from agentrt.memory import SQLiteStore
from agentrt.testing import CallTool, FunctionModel

KILL = sys.argv[5] if len(sys.argv) > 5 else ""
SEEN: Counter[str] = Counter()
DIR = Path(sys.argv[4])


def reach(point: str) -> None:
    SEEN[point] += 1
    if KILL == f"{point}:{SEEN[point]}":
        os.kill(os.getpid(), signal.SIGKILL)


class Shop:
    async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


class Tools:
    @tool("Look an order up.", idempotent=True)
    async def lookup(self, order: str) -> str:
        return effect("lookup", f"order {order}: paid")

    @tool("Refund an order.")
    async def refund(self, order: str) -> str:
        return effect("refund", f"refunded {order}")


def effect(name: str, text: str) -> str:
    reach(f"{name}_before")
    with (DIR / name).open("a") as side:
        side.write(f"{os.getpid()}\n")
    reach(f"{name}_after")
    return text


def respond(request: ModelRequest) -> Any:
    reach("request")
    results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
    if not results:
        return [CallTool("lookup", {"order": "A1"}, id="c1")]
    if len(results) == 1:
        return [CallTool("refund", {"order": "A1"}, id="c2")]
    reasked = any("politely" in str(getattr(m, "text", "")) for m in request.messages)
    return f"Order A1 is refunded ({results[-1].text})." if reasked else "Refunded, whatever."


class Polite:
    name = "polite"

    def validate(self, request: OutputGuardrailRequest) -> GuardrailResult:
        return reprompt("rude", "Answer politely.") if "whatever" in request.text else success()


class Store(SQLiteStore):
    async def commit(self, key: str, messages: Any, **options: Any) -> None:
        await super().commit(key, messages, **options)
        reach("commit_after")


async def main(database: str, executor: str, mode: str) -> None:
    store = Store(DIR / "memory.sqlite", lease_seconds=1.0)
    shop = agentrt.build(
        Shop,
        model=FunctionModel(respond),
        memory=agentrt.memory.window(namespace="shop", store=store),
        tools=[Tools()],
        output_guardrails=[Polite()],
    )
    engine = Engine(database, executor_id=executor, polling_seconds=0.05)
    engine.register("shop", shop)
    try:
        async with engine:
            if mode == "start":
                value = await engine.call("shop", "ask", turn_id="t1", conversation="c", question="Refund A1")
            else:
                if mode == "adopt":
                    engine.adopt(["w1"])
                value = await engine.result("t1")
            stored = await agentrt.memory.access(shop).read("c")
    finally:
        store.close()
    memory = [[type(m).__name__, getattr(m, "text", None) or ""] for m in stored]
    print(json.dumps({"value": value, "memory": memory}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
