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

It prints one JSON line: the turn's value and the conversation as stored. MODE `p-start` /
`p-restart` / `p-adopt`: the same for a turn whose one round calls `refund` twice, one call after
the other (`max_concurrency=1`), then answers with the two results.

The approval modes run the turn `a1` of `Shop.ask` on a service whose `refund` needs approval (one
call, then the answer): `a-start` starts it and SIGKILLs itself once it waits; `a-restart` /
`a-adopt` recover it, see that it waits, run `a-decide` (a `Client` in a process of its own, which
approves it twice: a double click) and print the turn's value; `A-adopt` adopts executor `w2`'s turn
(decided already) and prints its value; `a-deny` starts the turn in this worker alone, tries
decisions that do not fit, sends an edit the tool refuses, then denies the call, and prints the
errors met and the decisions the turn refused too, then runs the turn `a2` of a service whose
approvals expire after 0.5 s, on which nobody decides.

MODE `f-run` / `f-read`: turns that fail, read again (see `failures`). `m-start` / `m-restart`: the
turn `t1` on an engine with `max_recoveries=1`. `r-keep` / `r-prune`: retention (see `retention`).
`n-register`: services an engine refuses (see `registering`). `l-start` / `l-wait`: the turn `t1`
on engines that beat (`adopt_after=1.0`); `l-wait` adopts nothing itself, it waits for the turn.
`k-run`: see `kept`. `c-run`: see `cancelled`. `u-start` / `u-approve` / `u-deny` / `u-crash`: see `unknown`.
`uA-adopt`: `A-adopt` on an engine with `unknown_outcome="approval"`, which approves the call of
unknown outcome it is asked about.

The streaming modes run the streamed turn `s1` of `Shop.chat`: a round that says "Let me look. " and
calls `lookup`, then the answer "Order A1 is paid." token by token. `s-start` starts it; its model
hangs after the answer's second token (the test, reading the turn's text once the worker printed
"started", kills it there);
`s-restart` / `s-adopt` recover it and print its value and the conversation. `x-start` /
`x-restart` / `x-adopt`: the same for the streamed turn of `Talk.chat` (see `streamed`), killed
at KILL `*:N`, the N-th kill point of any kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sqlite3
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
from dbos import DBOS

import agentrt
from agentrt import (
    ApprovalRequested,
    Approvals,
    Approve,
    Deny,
    MemoryId,
    ModelRequest,
    ToolResultMessage,
    ToolSettings,
    UserMessage,
    tool,
)
from agentrt.durable import Client, Engine, TurnFailedError
from agentrt.guardrails import GuardrailResult, OutputGuardrailRequest, output_guardrails, reprompt, success
from agentrt.memory import SQLiteStore
from agentrt.testing import CallTool, FunctionModel, Hang

KILL = sys.argv[5] if len(sys.argv) > 5 else ""
SEEN: Counter[str] = Counter()
DIR = Path(sys.argv[4])


EVENTS: list[str] = []


def listen(event: object) -> None:
    """The listener of every service here: what it saw, in order (a failure with its error's type)."""
    error = getattr(event, "error", None)
    EVENTS.append(type(event).__name__ + (f"({type(error).__name__})" if error is not None else ""))


def reach(point: str) -> None:
    SEEN[point] += 1
    SEEN["*"] += 1
    if KILL == f"{point}:{SEEN[point]}" or KILL == f"*:{SEEN['*']}":
        with (DIR / "killed").open("w") as killed:  # where (for a kill counted over every point)
            killed.write(f"{point}:{SEEN[point]}")
        os.kill(os.getpid(), signal.SIGKILL)


class Shop:
    async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...

    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> agentrt.TokenStream: ...


class Tools:
    @tool("Look an order up.", idempotent=True)
    async def lookup(self, order: str) -> str:
        return effect("lookup", f"order {order}: paid")

    @tool("Refund an order.")
    async def refund(self, order: str) -> str:
        return effect("refund", f"refunded {order}")


class Gated:
    @tool("Refund an order.", needs_approval=True)
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


def pair(request: ModelRequest) -> Any:
    reach("request")
    results = [m.text for m in request.messages if isinstance(m, ToolResultMessage)]
    if results:
        return "; ".join(results)
    return [CallTool("refund", {"order": "A1"}, id="c1"), CallTool("refund", {"order": "B2"}, id="c2")]


class Polite:
    name = "polite"

    def validate(self, request: OutputGuardrailRequest) -> GuardrailResult:
        return reprompt("rude", "Answer politely.") if "whatever" in request.text else success()


class Store(SQLiteStore):
    async def commit(self, key: str, messages: Any, **options: Any) -> None:
        await super().commit(key, messages, **options)
        reach("commit_after")


def gated(request: ModelRequest) -> Any:
    reach("request")
    results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
    return f"Order A1: {results[-1].text}" if results else [CallTool("refund", {"order": "A1"}, id="c1")]


async def decide(database: str) -> None:
    """Another process (no engine): approves the turn `a1`, twice."""
    client = Client(database)
    try:
        approval = await client.approval("a1")
        assert approval is not None and [c.id for c in approval.calls] == ["c1"], approval
        for _ in range(2):
            await client.decide("a1", {"c1": Approve()})
    finally:
        client.close()


async def approval(database: str, executor: str, mode: str) -> None:
    if mode == "a-decide":
        await decide(database)
        return
    ask = mode.startswith("u")  # `uA-adopt`: `A-adopt` on an engine with unknown_outcome="approval"
    mode = mode.removeprefix("u")
    store = Store(DIR / "memory.sqlite", lease_seconds=1.0)

    def service(expires: float) -> Shop:
        return agentrt.build(
            Shop,
            model=FunctionModel(gated),
            memory=agentrt.memory.window(namespace="shop", store=store),
            tools=[Gated()],
            approvals=Approvals(expires_after=expires),
            listeners=[listen],
        )

    shop = service(3600.0)
    policy = "approval" if ask else "error"
    engine = Engine(database, executor_id=executor, polling_seconds=0.05, unknown_outcome=policy)
    engine.register("shop", shop)
    engine.register("brief", brief := service(0.5))
    errors: list[str] = []
    try:
        async with engine:
            if mode in ("a-start", "a-deny"):
                await engine.start("shop", "ask", turn_id="a1", conversation="c", question="Refund A1")
            elif mode != "a-restart":
                engine.adopt(["w2" if mode == "A-adopt" else "w1"])
            if mode != "A-adopt":  # (A-adopt: decided already, the turn goes on here)
                waits = await engine.approval("a1", wait=60)
                assert waits is not None and [c.tool for c in waits.calls] == ["refund"], waits
            if ask:  # the approved call, killed inside, is put to a human: approved again
                # (Until the turn asks, it still publishes the approval it went past before w2 died.)
                waits = await anew(engine, "a1", lambda run: run.startswith("unknown:"))
                await engine.decide("a1", {call.id: Approve() for call in waits.calls})
            if mode == "a-start":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "a-deny":
                for turn, decisions in (("nope", {"c1": Deny()}), ("a1", {"c2": Deny()}), ("a1", {})):
                    try:
                        await engine.decide(turn, decisions)
                    except agentrt.ApprovalError as error:
                        errors.append(f"{type(error).__name__}: {error}")
                # An edit the tool's schema refuses: the turn refuses it and takes the next decisions.
                await engine.decide("a1", {"c1": Approve(arguments={"order": 5})})
                await engine.decide("a1", {"c1": Deny("not today")})
            elif mode != "A-adopt":
                decider = await asyncio.create_subprocess_exec(
                    sys.executable, __file__, database, "d", "a-decide", str(DIR)
                )
                assert await decider.wait() == 0
            out = await finish(engine, shop, "a1", "c", errors)
            out["events"] = EVENTS[:]
            if mode == "a-deny":  # and a turn whose approval expires after 0.5 s: nobody decides
                await engine.call("brief", "ask", turn_id="a2", conversation="c2", question="Refund A1")
                out["expired"] = await finish(engine, brief, "a2", "c2", [])
    finally:
        store.close()
    print(json.dumps(out))


async def finish(engine: Engine, shop: Shop, turn: str, conversation: str, errors: list[str]) -> Any:
    value = await engine.result(turn)
    try:
        await engine.decide(turn, {"c1": Approve()})
    except agentrt.ApprovalError as error:
        errors.append(f"{type(error).__name__}: {error}")
    stored = await agentrt.memory.access(shop).read(conversation)
    memory = [[type(m).__name__, getattr(m, "text", None) or ""] for m in stored]
    steps = await DBOS.list_workflow_steps_async(turn)
    outputs = [step["output"] for step in steps if isinstance(step["output"], dict)]
    refused = [output["refused"] for output in outputs if "refused" in output]
    return {"value": value, "memory": memory, "errors": errors, "refused": refused, "unread": unread(turn)}


def unread(turn: str) -> int | None:
    """Messages sent to the turn that it never read (DBOS's table, SQLite only): a double click sent
    twice would leave one."""
    path = DIR / "dbos.sqlite"
    if not path.exists():
        return None
    with contextlib.closing(sqlite3.connect(path)) as db:
        query = "SELECT count(*) FROM notifications WHERE destination_uuid = ? AND NOT consumed"
        row = db.execute(query, (turn,)).fetchone()
    return int(row[0])


class Talk:
    @output_guardrails(Polite(), release="optimistic")
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> agentrt.TokenStream: ...


class Counted:
    """A model whose every chunk is a kill point (`token`)."""

    def __init__(self, inner: FunctionModel) -> None:
        self.inner = inner
        self.name = inner.name
        self.capabilities = inner.capabilities

    async def stream(self, request: ModelRequest) -> Any:
        chunks = self.inner.stream(request)
        try:
            async for chunk in chunks:
                reach("token")
                yield chunk
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]


def words(request: ModelRequest) -> Any:
    """`respond`'s answers, word by word."""
    answer = respond(request)
    return re.findall(r"\S+\s*", answer) if isinstance(answer, str) else answer


async def streamed(database: str, executor: str, mode: str) -> None:
    """`s-*`: the turn `s1` of `Shop.chat`; `x-*`: of `Talk.chat`, `Shop.ask`'s turn streamed (two
    tool rounds, a re-ask under `optimistic` release: the rejected answer is shown, then reset),
    every chunk a kill point."""

    def chat(request: ModelRequest) -> Any:
        if not any(isinstance(m, ToolResultMessage) for m in request.messages):
            return ["Let me look. ", CallTool("lookup", {"order": "A1"}, id="c1")]
        answer: list[Any] = ["Order ", "A1 ", "is ", "paid."]
        return [*answer[:2], Hang()] if mode == "s-start" else answer

    random = mode.startswith("x-")
    shop, store = service(
        Talk if random else Shop,
        Counted(FunctionModel(words)) if random else FunctionModel(chat),
        [Tools()],
        tool_settings=ToolSettings(max_concurrency=1),
    )
    engine = Engine(database, executor_id=executor, polling_seconds=0.05)
    engine.register("shop", shop)
    try:
        async with engine:
            if mode.endswith("-start"):
                await engine.stream("shop", "chat", turn_id="s1", conversation="c", question="Refund A1")
                print("started", flush=True)  # the test reads the turn's text from here on
            elif mode.endswith("-adopt"):
                engine.adopt(["w1"])
            value = await engine.result("s1")  # (s-start: killed by the test while it waits)
            stored = await agentrt.memory.access(shop).read("c")
    finally:
        store.close()
    memory = [[type(m).__name__, getattr(m, "text", None) or ""] for m in stored]
    print(json.dumps({"value": value, "memory": memory, "points": SEEN["*"]}))


def failing(request: ModelRequest) -> Any:
    question = str(getattr(request.messages[-1], "text", ""))
    if question == "rate":
        raise agentrt.RateLimitError("slow down", retry_after=3.0, status=429)
    raise ValueError("boom")


def caught(error: BaseException) -> list[str]:
    return [type(error).__name__, str(error), *getattr(error, "__notes__", ())]


async def failures(database: str, executor: str, mode: str) -> None:
    """Turns that fail (`f1`: agentrt's `RateLimitError`; `f2`: a `ValueError` of the model's own),
    each read: as it fails, started again with its id, its result, and that of a fork of the turn
    past its failed step (the step's error replayed in the workflow). `f-read`: their results, read by
    another worker. Prints, per turn, what each read raised (type, message, notes), and the
    attributes of the last one."""
    service = agentrt.build(Shop, model=FunctionModel(failing), listeners=[listen])
    engine = Engine(database, executor_id=executor, polling_seconds=0.05)
    engine.register("shop", service)
    out: dict[str, Any] = {}
    async with engine:
        for turn, question in (("f1", "rate"), ("f2", "bug")):
            reads: list[list[str]] = []
            ways = ["call", "call", "result", "fork"] if mode == "f-run" else ["result"]
            for way in ways:
                try:
                    if way == "call":
                        await engine.call("shop", "ask", turn_id=turn, conversation="c", question=question)
                    else:
                        await (engine.result(turn) if way == "result" else fork(engine, turn))
                except Exception as error:
                    reads.append(caught(error))
                    last = error
            out[turn] = reads
            out[f"{turn} events"] = EVENTS[:]
            EVENTS.clear()
            if isinstance(last, agentrt.RateLimitError):
                out[f"{turn} attributes"] = [last.retry_after, last.status, last.message]
            elif isinstance(last, TurnFailedError):
                out[f"{turn} attributes"] = [last.error_type, last.error_message]
        if mode == "f-run":  # a streamed turn that fails: its readers raise its error at the end
            out["f3"] = []
            client = Client(database)
            try:
                for reader in ("stream", "engine", "client"):
                    try:
                        if reader == "stream":
                            tokens = await engine.stream(
                                "shop", "chat", turn_id="f3", conversation="c", question="rate"
                            )
                        else:
                            tokens = (engine if reader == "engine" else client).read("f3")
                        async with tokens:
                            out["f3"].append([token async for token in tokens])
                    except Exception as error:
                        out["f3"].append(caught(error))
            finally:
                client.close()
    print(json.dumps(out))


async def fork(engine: Engine, turn: str) -> Any:
    """The turn forked after its last step: that step's recorded error replayed in the new workflow."""
    steps = await DBOS.list_workflow_steps_async(turn)
    handle = await DBOS.fork_workflow_async(turn, steps[-1]["function_id"] + 1)
    return await engine.result(handle.get_workflow_id())


async def retention(database: str, executor: str, mode: str) -> None:
    """`r-keep`: an engine that keeps finished turns an hour runs `r1` (no memory: it ends at once)
    and starts `a1`, which waits for approval; `prune` deletes nothing. `r-prune` (another worker,
    which does not recover `a1`): an engine that keeps them 0 s deletes `r1` as it starts; then
    `r2` runs and `prune` deletes it. Prints what `prune` returned, each turn's status, and the rows
    of `r1` left in DBOS's tables (SQLite)."""
    store = Store(DIR / "memory.sqlite", lease_seconds=1.0)
    plain = agentrt.build(Shop, model=FunctionModel(lambda request: "hello"))
    shop = agentrt.build(
        Shop,
        model=FunctionModel(gated),
        memory=agentrt.memory.window(namespace="shop", store=store),
        tools=[Gated()],
    )
    keep = 3600.0 if mode == "r-keep" else 0
    engine = Engine(database, executor_id=executor, polling_seconds=0.05, retention_seconds=keep)
    engine.register("plain", plain)
    engine.register("shop", shop)
    out: dict[str, Any] = {}
    try:
        async with engine:
            if mode == "r-keep":
                await engine.call("plain", "ask", turn_id="r1", conversation="c", question="Hi")
                await engine.start("shop", "ask", turn_id="a1", conversation="c", question="Refund A1")
                assert await engine.approval("a1", wait=60) is not None
            else:
                await engine.call("plain", "ask", turn_id="r2", conversation="c", question="Hi")
            out["pruned"] = await engine.prune()
            out["status"] = {turn: await engine.status(turn) for turn in ("r1", "r2", "a1")}
    finally:
        store.close()
    with contextlib.closing(sqlite3.connect(DIR / "dbos.sqlite")) as db:
        tables = ("workflow_status", "operation_outputs", "workflow_input", "workflow_output")
        out["rows"] = {
            table: db.execute(f"SELECT count(*) FROM {table} WHERE workflow_uuid = 'r1'").fetchone()[0]
            for table in tables
        }
    print(json.dumps(out))


async def registering(database: str, executor: str) -> None:
    """`n-register`: services registered with an engine (not launched): one without memory whose
    `refund` needs approval, one with memory, and an object that is no service. Prints the errors."""
    store = Store(DIR / "memory.sqlite", lease_seconds=1.0)
    forgetful = agentrt.build(Shop, model=FunctionModel(gated), tools=[Gated()])
    remembering = agentrt.build(
        Shop,
        model=FunctionModel(gated),
        tools=[Gated()],
        memory=agentrt.memory.window(namespace="s", store=store),
    )
    engine = Engine(database, executor_id=executor)
    errors: list[str] = []
    try:
        for name, service in (("forgetful", forgetful), ("remembering", remembering), ("other", object())):
            try:
                engine.register(name, service)
            except agentrt.ConfigurationError as error:
                errors.append(str(error))
    finally:
        engine.close()
        store.close()
    print(json.dumps({"errors": errors}))


def service(cls: type, model: Any, tools: list[Any], **options: Any) -> tuple[Any, Store]:
    """A service of `cls` with memory in DIR (an SQLiteStore: its store, to close)."""
    store = Store(DIR / "memory.sqlite", lease_seconds=1.0)
    memory = agentrt.memory.window(namespace="shop", store=store)
    return agentrt.build(cls, model=model, memory=memory, tools=tools, **options), store


async def streamed_approval(database: str, executor: str) -> None:
    """MODE `sa-run`: the streamed turn `sa1` of `Shop.chat` on a service whose `refund` needs
    approval: its text read up to the approval, then (approved) from where it stopped."""

    def chat(request: ModelRequest) -> Any:
        results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
        if results:
            return re.findall(r"\S+\s*", f"Order A1: {results[-1].text}")
        return ["Checking. ", CallTool("refund", {"order": "A1"}, id="c1")]

    shop, store = service(Shop, FunctionModel(chat), [Gated()], approvals=Approvals(expires_after=3600.0))
    engine = Engine(database, executor_id=executor, polling_seconds=0.05)
    engine.register("shop", shop)
    try:
        async with engine:
            async with await engine.stream(
                "shop", "chat", turn_id="sa1", conversation="c", question="Refund A1"
            ) as tokens:
                first = [token async for token in tokens]
            waiting, offset = tokens.waiting, tokens.offset
            await engine.decide("sa1", {"c1": Approve()})
            async with engine.read("sa1", offset=offset) as rest:
                second = [token async for token in rest]
            async with engine.read("sa1") as whole:  # from the start: it stops at the approval
                again = [token async for token in whole]
            value = await engine.result("sa1")
    finally:
        store.close()
    print(json.dumps({"first": first, "waiting": waiting, "second": second, "again": again, "value": value}))


async def kept(database: str, executor: str) -> None:
    """MODE `k-run`: the turn `k1` of `Shop.ask` (as `start` runs it); its `lookup` starts another,
    plain turn on the same conversation, which waits for the durable turn to end, not only for its
    segment: the conversation holds the durable turn whole, then the other."""
    others: list[asyncio.Task[str]] = []
    owners: list[str] = []

    class Busy(Tools):
        @tool("Look an order up.", idempotent=True)
        async def lookup(self, order: str) -> str:
            with contextlib.closing(sqlite3.connect(DIR / "memory.sqlite")) as db:
                owners.extend(row[0] for row in db.execute("SELECT owner FROM agentrt_leases"))
            others.append(asyncio.ensure_future(shop.ask("c", "Another question")))
            return effect("lookup", f"order {order}: paid")

    def answer(request: ModelRequest) -> Any:
        asked = [m for m in request.messages if isinstance(m, UserMessage)][-1].text
        return "Other answer." if asked == "Another question" else respond(request)

    shop, store = service(
        Shop,
        FunctionModel(answer),
        [Busy()],
        output_guardrails=[Polite()],
        tool_settings=ToolSettings(max_concurrency=1),
    )
    engine = Engine(database, executor_id=executor, polling_seconds=0.05)
    engine.register("shop", shop)
    try:
        async with engine:
            value = await engine.call("shop", "ask", turn_id="k1", conversation="c", question="Refund A1")
            other = await others[0]
            stored = await agentrt.memory.access(shop).read("c")
    finally:
        store.close()
    memory = [[type(m).__name__, getattr(m, "text", None) or ""] for m in stored]
    print(json.dumps({"value": value, "other": other, "memory": memory, "owners": owners}))


async def unknown(database: str, executor: str, mode: str) -> None:
    """MODE `u-start` / `u-approve` / `u-deny` / `u-crash`: the turn `t1` (as `start` runs it) on
    engines with `unknown_outcome="approval"`; `u-start` is killed inside `refund` (KILL), `u-approve`
    / `u-deny` adopt the turn (of `w1` or `w2`), see the approval it waits for (the call of unknown
    outcome; its run id appended to DIR/asked), decide, and print the turn's value, the conversation
    and the calls asked about; `u-crash` approves and is killed (KILL) inside the call run again."""
    shop, store = service(
        Shop,
        FunctionModel(respond),
        [Tools()],
        output_guardrails=[Polite()],
        tool_settings=ToolSettings(max_concurrency=1),
    )
    engine = Engine(database, executor_id=executor, polling_seconds=0.05, unknown_outcome="approval")
    engine.register("shop", shop)
    asked: list[Any] = []
    try:
        async with engine:
            if mode == "u-start":
                await engine.call("shop", "ask", turn_id="t1", conversation="c", question="Refund A1")
            engine.adopt(["w1", "w2"])
            log = DIR / "asked"
            before = log.read_text().splitlines() if log.exists() else []
            waits = await anew(engine, "t1", lambda run: run not in before)
            with (DIR / "asked").open("a") as log:  # each approval asked, by its run id
                log.write(f"{waits.run_id}\n")
            asked = [[c.id, c.tool, c.arguments] for c in waits.calls]
            decision = Deny("it went through") if mode == "u-deny" else Approve()  # u-crash: killed
            await engine.decide("t1", {call.id: decision for call in waits.calls})
            value = await engine.result("t1")
            stored = await agentrt.memory.access(shop).read("c")
    finally:
        store.close()
    memory = [[type(m).__name__, getattr(m, "text", None) or ""] for m in stored]
    print(json.dumps({"value": value, "memory": memory, "asked": asked}))


async def anew(engine: Engine, turn: str, fits: Callable[[str], bool]) -> ApprovalRequested:
    """The approval the turn waits for once its run id `fits` (a recovered turn publishes what it
    waited for before its worker died until it asks anew; a decided question is published as none)."""
    with anyio.fail_after(60):
        while True:
            waits = await engine.approval(turn, wait=60)
            if waits is not None and fits(waits.run_id):
                return waits
            await anyio.sleep(0.05)  # (set by the turn's workflow: no event of this process to wait on)


async def cancelled(database: str, executor: str) -> None:
    """MODE `c-run`: the streamed turn `c1` of `Shop.chat`, whose model shows a token and hangs, is
    cancelled through DBOS; prints what its result and a reader of its text raise."""
    shop, store = service(Shop, FunctionModel(lambda request: ["Looking ", Hang()]), [])
    engine = Engine(database, executor_id=executor, polling_seconds=0.05)
    engine.register("shop", shop)
    errors: list[str] = []
    try:
        async with engine:
            tokens = await engine.stream("shop", "chat", turn_id="c1", conversation="c", question="?")
            seen = [await anext(tokens)]
            await DBOS.cancel_workflow_async("c1")
            for attempt in (engine.result("c1"), anext(tokens)):
                try:
                    await attempt
                except TurnFailedError as error:
                    errors.append(f"{error.error_type}: {error}")
            await tokens.aclose()
    finally:
        store.close()
    print(json.dumps({"seen": seen, "errors": errors}))


async def main(database: str, executor: str, mode: str) -> None:
    if mode.lower().removeprefix("u").startswith("a-"):
        await approval(database, executor, mode)
        return
    if mode.startswith("f-"):
        await failures(database, executor, mode)
        return
    if mode == "n-register":
        await registering(database, executor)
        return
    if mode.startswith("r-"):
        await retention(database, executor, mode)
        return
    if mode[:2] in ("s-", "x-"):
        await streamed(database, executor, mode)
        return
    if mode == "c-run":
        await cancelled(database, executor)
        return
    if mode.startswith("u-"):
        await unknown(database, executor, mode)
        return
    if mode == "k-run":
        await kept(database, executor)
        return
    if mode == "sa-run":
        await streamed_approval(database, executor)
        return
    paired = mode.startswith("p-")  # a round of two refunds, run one after the other
    limited = mode.startswith("m-")  # an engine whose turns are recovered once at most
    live = mode.startswith("l-")  # engines that beat, and adopt an executor that stopped (`wait`)
    if paired or limited or live:
        mode = mode[2:]
    store = Store(DIR / "memory.sqlite", lease_seconds=1.0)
    shop = agentrt.build(
        Shop,
        model=FunctionModel(pair if paired else respond),
        memory=agentrt.memory.window(namespace="shop", store=store),
        tools=[Tools()],
        output_guardrails=[] if paired else [Polite()],
        tool_settings=ToolSettings(max_concurrency=1),
        listeners=[listen],
    )
    engine = Engine(
        database,
        executor_id=executor,
        polling_seconds=0.05,
        max_recoveries=1 if limited else 100,
        adopt_after=1.0 if live else None,
    )
    engine.register("shop", shop)
    try:
        async with engine:
            if mode == "start":
                value = await engine.call("shop", "ask", turn_id="t1", conversation="c", question="Refund A1")
            else:
                if mode == "adopt":
                    engine.adopt(["w1"])
                try:
                    value = await engine.result("t1")
                except TurnFailedError as error:  # given up (`m-`)
                    value = [type(error).__name__, str(error), error.error_type, await engine.status("t1")]
            stored = await agentrt.memory.access(shop).read("c")
    finally:
        store.close()
    memory = [[type(m).__name__, getattr(m, "text", None) or ""] for m in stored]
    print(json.dumps({"value": value, "memory": memory, "events": EVENTS}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
