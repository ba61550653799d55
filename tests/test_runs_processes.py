"""Runs that outlive their connection across processes (issue 27's acceptance): two uvicorn workers of
one app (tests/servers/runs_app.py), on separate ports with no balancer between them, share a
redis-server for their runs' logs (`RedisRunLog`) and their chat memory (`RedisStore`); their model is
a scripted OpenAI-compatible server in a third process (tests/servers/runs_model_app.py).

Each run has a tool round, and an answer the output guardrail refuses once (`release="optimistic"`:
the client is shown it, then a `reset`, then the reprompted answer). A client reads part of a run
from one worker, cuts its connection at a random frame, and reads the rest from the other with
`Last-Event-ID`: it gets every frame once, and the text after its last `reset` is what memory stored.
A worker killed (SIGKILL) mid-run leaves its run lost: a client reading it on from the other worker
gets a terminal `error` event (`run_lost`), not a wait without end.

Only on asyncio: the workers are uvicorn processes (asyncio) whatever the test runs on, and the
client's side is plain HTTP; the logs themselves are tested on both backends in
tests/test_run_logs.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from agentrt import AssistantMessage
from agentrt.memory import RedisStore

pytestmark = [pytest.mark.parametrize("anyio_backend", ["asyncio"]), pytest.mark.xdist_group("real-time")]

SERVERS = Path(__file__).parent / "servers"
ROOT = SERVERS.parent.parent
ROUNDS = 50
SEED = 27
LOST_AFTER = 1.0  # tests/servers/runs_app.py's RedisRunLog(lost_after=...)
BOUND = 30  # seconds: the most any one step waits


def start(script: str, *args: str) -> tuple[str, subprocess.Popen[bytes]]:
    """Run `script <fd> [args]` on a socket that listens already (connections queue until uvicorn
    accepts them): its base URL and its process."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, str(SERVERS / script), str(listener.fileno()), *args],
        pass_fds=(listener.fileno(),),
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SERVERS.parent)])},
    )
    listener.close()
    return f"http://127.0.0.1:{port}", process


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    base, process = start("runs_model_app.py")
    try:
        yield f"{base}/v1"
    finally:
        stop(process)


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:12]}:"


@pytest.fixture(scope="module")
def workers(model_url: str, redis_url: str, prefix: str) -> Iterator[list[str]]:
    """Two workers of the app, for the whole module."""
    started = [start("runs_app.py", model_url, redis_url, prefix) for _ in range(2)]
    try:
        yield [base for base, _ in started]
    finally:
        for _, process in started:
            stop(process)


@pytest.fixture
async def store(redis_url: str, prefix: str) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_url, prefix=prefix)
    yield store
    await store.aclose()


async def events_of(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The SSE events of a streamed response, as they come: `{"event", "id", "data"}`."""
    event: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if not line:
            if "event" in event:
                yield event
            event = {}
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            event[name] = json.loads(value) if name == "data" else value


async def read(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    headers: dict[str, str],
    cut: int | None = None,
    **kw: Any,
) -> list[dict[str, Any]]:
    """The events of one request; with `cut`, only the first `cut`: then the connection is closed (the
    response is left before its end)."""
    got: list[dict[str, Any]] = []
    async with client.stream(method, url, headers=headers, **kw) as response:
        assert response.status_code == 200, await response.aread()
        async for event in events_of(response):
            got.append(event)
            if len(got) == cut:
                break
    return got


def text_shown(events: list[dict[str, Any]]) -> str:
    """The text a client shows: the tokens after the last `reset`."""
    text = ""
    for event in events:
        if event["event"] == "reset":
            text = ""
        elif event["event"] == "token":
            text += event["data"]["text"]
    return text


async def stored_answer(store: RedisStore, user: str) -> AssistantMessage:
    """The user's conversation's last message once the turn is stored (a detached run stores it as
    it ends, which may be just after its last frame was read)."""
    with anyio.fail_after(BOUND):
        while True:
            messages = await store.load(f'runs:"{user}"')
            if messages and isinstance(messages[-1], AssistantMessage) and not messages[-1].tool_calls:
                return messages[-1]
            await anyio.sleep(0.01)


async def ended(store: RedisStore, run: str) -> Any:
    """The run's `ended` field in Redis (through the store's client: the same server and prefix)."""
    client = store._client
    return await anyio.to_thread.run_sync(lambda: client.hget(f"{store._prefix}run:{run}", "ended"))


async def test_a_run_read_on_another_worker_after_a_cut_gets_every_frame_once(
    workers: list[str], store: RedisStore
) -> None:
    rng = random.Random(SEED)
    async with httpx.AsyncClient(timeout=BOUND) as client:
        # A whole run, read from one worker: what every run of the test looks like.
        whole = await read(
            client, "POST", f"{workers[0]}/chat", {"x-user": "u-whole"}, json={"question": "w00"}
        )
        names = [e["event"] for e in whole]
        assert names[0] == "token" and names[-1] == "done", names
        assert names.count("reset") == 2  # the text that came with the tool call, the refused answer
        assert "tool_call" in names and "tool_result" in names
        assert text_shown(whole) == whole[-1]["data"]["text"] == "The answer: w00 backwards is 00w."
        assert (await stored_answer(store, "u-whole")).text == text_shown(whole)

        cuts = []
        going = 0  # rounds whose run had not ended when the client came back
        for round_ in range(ROUNDS):
            first, other = (workers[0], workers[1]) if round_ % 2 == 0 else (workers[1], workers[0])
            user, question = f"u{round_}", f"w{round_:02d}"
            cut = rng.randrange(1, len(whole))
            cuts.append(cut)
            with anyio.fail_after(BOUND):
                head = await read(
                    client, "POST", f"{first}/chat", {"x-user": user}, cut, json={"question": question}
                )
                assert len(head) == cut
                run = head[0]["id"].rpartition(":")[0]
                going += await ended(store, run) is None
                rest = await read(
                    client, "GET", f"{other}/chat/resume", {"x-user": user, "last-event-id": head[-1]["id"]}
                )
            events = head + rest
            assert [e["id"] for e in events] == [f"{run}:{n}" for n in range(1, len(events) + 1)], cut
            assert [e["event"] for e in events] == names, cut
            answer = f"The answer: {question} backwards is {question[::-1]}."
            assert text_shown(events) == events[-1]["data"]["text"] == answer, cut
            assert (await stored_answer(store, user)).text == answer
    assert len(set(cuts)) > 10  # the cuts fell all over the run
    print(f"runs still going when their client came back: {going} of {ROUNDS}")


async def test_a_worker_killed_mid_run_leaves_the_run_lost_for_a_reader_on_another(
    workers: list[str], model_url: str, redis_url: str, prefix: str
) -> None:
    doomed, process = start("runs_app.py", model_url, redis_url, prefix)
    try:
        async with httpx.AsyncClient(timeout=BOUND) as client:
            with anyio.fail_after(BOUND):
                head = await read(
                    client, "POST", f"{doomed}/chat", {"x-user": "u-killed"}, 3, json={"question": "hang"}
                )
            assert text_shown(head) == "Wait for it"  # the model's words: it hangs after them
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=BOUND)
            killed = time.monotonic()
            with anyio.fail_after(LOST_AFTER + 5):
                rest = await read(
                    client,
                    "GET",
                    f"{workers[1]}/chat/resume",
                    {"x-user": "u-killed", "last-event-id": head[-1]["id"]},
                )
            waited = time.monotonic() - killed
    finally:
        stop(process)
    assert [e["event"] for e in rest] == ["error"]
    assert rest[0]["data"]["type"] == "run_lost"
    print(f"SIGKILL to run_lost: {waited:.2f} s (lost_after {LOST_AFTER} s)")


async def test_a_stop_sent_to_the_other_worker_stops_the_run_where_it_runs(workers: list[str]) -> None:
    """The stop route of the worker that does not run the run relays the stop through Redis (pub/sub)
    to the one that does: the run ends with `stopped`, for its client there."""
    async with httpx.AsyncClient(timeout=BOUND) as client:
        with anyio.fail_after(BOUND):
            async with client.stream(
                "POST", f"{workers[0]}/chat", headers={"x-user": "u-stopped"}, json={"question": "hang"}
            ) as response:
                events = events_of(response)
                head = [await anext(events) for _ in range(3)]  # the model's words: then it hangs
                run = head[0]["id"].rpartition(":")[0]
                other = await client.post(
                    f"{workers[1]}/chat/stop", json={"runId": run}, headers={"x-user": "u-other"}
                )
                stopped = await client.post(
                    f"{workers[1]}/chat/stop", json={"runId": run}, headers={"x-user": "u-stopped"}
                )
                rest = [event async for event in events]
    assert other.status_code == 404  # another user's run is not found
    assert stopped.status_code == 202
    assert text_shown(head) == "Wait for it"
    assert [e["event"] for e in rest] == ["stopped"]
