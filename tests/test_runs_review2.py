"""A second outside review of issue 27 (runs that outlive their connection), of the change that makes
the first client's response read its run's stream itself (`agentrt.sse._respond` with a `Tee`) and
hands a detached run to the manager at its client's hang-up (`agentrt._sse_runs.adopt`).

Each test pins a defect the review found: it failed on the code as reviewed. See
/work/notes/review27b.md for the findings (reproduction, cause, fix). asyncio and trio.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from test_frontends import AGUI_BODY, VERCEL_BODY, by_thread
from test_runs import Chat, Client, Gate, app_with, run_client

import agentrt
import agentrt.sse
from agentrt import AssistantMessage
from agentrt.runs import Runs
from agentrt.testing import CallTool, ScriptedModel

PROTOCOLS = ("agentrt", "vercel-ui", "ag-ui")
BODIES = {"agentrt": {"question": "Hi"}, "vercel-ui": VERCEL_BODY, "ag-ui": AGUI_BODY}
THREADS = {"agentrt": "None", "vercel-ui": "chat-1", "ag-ui": "t1"}


def frames(text: str | bytes) -> list[tuple[str | None, str]]:
    """An SSE body's frames as (id, kind): the native event name, or the JSON data's `type`, or the
    data itself (Vercel's `[DONE]`)."""
    if isinstance(text, bytes):
        text = text.decode()
    out: list[tuple[str | None, str]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        if "data" not in fields:
            continue
        kind = fields.get("event")
        if kind is None:
            try:
                data = json.loads(fields["data"])
            except ValueError:
                data = fields["data"]
            kind = data.get("type", "?") if isinstance(data, dict) else str(data)
        out.append((fields.get("id"), kind))
    return out


async def logged(runs: Runs, run: str) -> list[tuple[str | None, str]]:
    """What the run's log holds (what a resume from its start reads)."""
    with anyio.fail_after(10):  # a log that never ends fails here
        return frames(b"".join([frame async for _, frame in runs.log.read(run, 0)]))


def stopped_end(protocol: str) -> list[str]:
    return {
        "agentrt": ["stopped"],
        "vercel-ui": ["abort", "[DONE]"],
        "ag-ui": ["RUN_FINISHED"],
    }[protocol]


def gated(protocol: str, policy: str) -> tuple[Any, Runs, Any, Client, ScriptedModel, Gate]:
    gate = Gate()
    model = ScriptedModel([CallTool("wait_for_gate", {}, id="c1")], ["The", " answer"])
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[gate])
    runs = Runs()
    handler = agentrt.sse.endpoint(
        svc.chat,
        memory_id=by_thread,
        runs=runs,
        protocol=protocol,  # type: ignore[arg-type]
        on_disconnect=policy,  # type: ignore[arg-type]
    )
    client = Client(json.dumps(BODIES[protocol]).encode())
    return svc, runs, app_with(runs, handler), client, model, gate


def run_id_of(client: Client) -> str:
    return client.headers["agentrt-run-id"]


# --- a stop that reaches the run through its manager after the answer's end was sent ---------------


class StopsOnTheEnd(Client):
    """A client whose user presses stop just as the answer's final frame reached it: the stop
    (`Runs.stop`, what the stop route and another worker's request call) lands right after the
    final frame's send returned."""

    def __init__(self, body: bytes, final: bytes, runs: Runs) -> None:
        super().__init__(body)
        self.final = final
        self.runs = runs

    async def send(self, message: dict[str, Any]) -> None:
        await super().send(message)
        if self.final in message.get("body", b""):
            await self.runs.stop(run_id_of(self))


FINALS = {"agentrt": b"event: done", "vercel-ui": b'"type":"finish"', "ag-ui": b'"type":"RUN_FINISHED"'}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("policy", ["cancel", "detach"])
async def test_a_stop_after_the_answer_s_end_was_sent_is_too_late_as_without_a_manager(
    protocol: str, policy: str
) -> None:
    # Without a manager the endpoint forgets the run at `Completed` ("a stop now would come too
    # late"): the stop route answers 404 and the turn is stored. With one, the manager still knew
    # the run: the stop cancelled the response in its settle turns, so under "cancel" the turn the
    # client was sent the end of was not stored, and the client (and the log) got a stopped end
    # after the answer's end.
    svc = agentrt.build(Chat, model=ScriptedModel(["The", " answer"]), memory=agentrt.memory.window())
    runs = Runs()
    handler = agentrt.sse.endpoint(
        svc.chat,
        memory_id=by_thread,
        runs=runs,
        protocol=protocol,  # type: ignore[arg-type]
        on_disconnect=policy,  # type: ignore[arg-type]
    )
    client = StopsOnTheEnd(json.dumps(BODIES[protocol]).encode(), FINALS[protocol], runs)
    async with runs:
        await run_client(app_with(runs, handler), client)
        run = run_id_of(client)
        log = await logged(runs, run)
    got = frames(client.text)
    assert got == log
    kinds = [kind for _, kind in got]
    assert not set(kinds) & {"stopped", "abort", "RUN_ERROR"}, kinds
    assert kinds.count("RUN_FINISHED") <= 1 and kinds.count("[DONE]") <= 1, kinds
    stored = await agentrt.memory.access(svc).read(f"ada:{THREADS[protocol]}")
    assert stored[-1:] == [AssistantMessage(text="The answer")]
    assert not runs._live  # type: ignore[attr-defined]


# --- a stop that lands while a detached run is handed over to the manager --------------------------


def stop_on_hand_over(runs: Runs) -> None:
    """Make a stop land between `adopt`'s start of the manager's task and that task's first step
    (as the stop route's or another worker's stop can: they run in tasks of their own)."""
    start = runs.start

    def starting(run: str, body: Any, stop: Any) -> None:
        start(run, body, stop)
        stop()

    runs.start = starting  # type: ignore[method-assign]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_stop_landing_as_a_detached_run_is_handed_over_ends_its_log_once(protocol: str) -> None:
    svc, runs, app, client, model, gate = gated(protocol, "detach")
    stop_on_hand_over(runs)
    async with runs, anyio.create_task_group() as group:
        group.start_soon(run_client, app, client)
        await client.frames.wait()  # the tool call was sent; the tool waits
        client.hang_up()
        await anyio.wait_all_tasks_blocked()  # the response heard of it
        gate.open.set()  # the next event: the run is handed over, and stopped as it is
        run = run_id_of(client)
        log = await logged(runs, run)
    kinds = [kind for _, kind in log]
    assert kinds[-len(stopped_end(protocol)) :] == stopped_end(protocol), kinds
    assert [seq for seq, _ in log] == [f"{run}:{n}" for n in range(1, len(log) + 1)]
    assert not set(kinds) & {"error", "RUN_ERROR"}, kinds
    assert kinds.count("[DONE]") <= 1 and kinds.count("RUN_FINISHED") <= 1, kinds
    assert await agentrt.memory.access(svc).read(f"ada:{THREADS[protocol]}") == []
    assert len(model.requests) == 1  # stopped: no second request
    assert not runs._live  # type: ignore[attr-defined]
