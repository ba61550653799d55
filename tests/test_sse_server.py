"""`agentrt.sse` over real HTTP: an endpoint served by uvicorn in a child process
(tests/servers/sse_app.py), whose model is the OpenAI-compatible test server in another
(tests/servers/openai_app.py). A client that goes away mid-stream must make the endpoint close its
upstream model connection; the upstream server says when its response ended (a long poll, no
polling loop). A client that resets the connection must not make the server write on to the dead
socket (tests/servers/reset_app.py). The last test drives the endpoint in this process: the loop's
turn every three writes, which keeps such a server from writing on, also when the events took time
(a strict xfail: not yet so)."""

from __future__ import annotations

import itertools
import json
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest
from served import serve
from test_frontends import by_thread
from test_runs import Chat, Client, chat_app, run_client

import agentrt
import agentrt.sse
from agentrt.testing import ScriptedModel

SERVERS = Path(__file__).parent / "servers"


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    yield from serve(SERVERS / "openai_app.py")


@pytest.fixture(scope="module")
def endpoint(upstream: str) -> Iterator[str]:
    for base in serve(SERVERS / "sse_app.py", upstream):
        yield base.removesuffix("/v1")


async def test_a_stream_over_real_http(endpoint: str) -> None:
    async with httpx.AsyncClient(timeout=20) as client:
        response = await client.post(f"{endpoint}/ask", json={"question": "hello there"})
    assert response.status_code == 200
    events = [line for line in response.text.splitlines() if line.startswith("event: ")]
    assert events[-1] == "event: done" and set(events[:-1]) == {"event: token"}
    data = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert "".join(d["text"] for d in data[:-1]) == "You said: hello there" == data[-1]["text"]


async def test_a_client_that_goes_away_closes_the_upstream_model_stream(upstream: str, endpoint: str) -> None:
    # A raw HTTP/1.1 client on a socket: it reads up to the first token event and hangs up (httpx's
    # own streams, left mid-way, leave generators that trio cannot finalize).
    stream_id = f"sse-{uuid.uuid4().hex}"
    url = httpx.URL(endpoint)
    body = json.dumps({"question": "hang"}).encode()
    request = (
        f"POST /ask HTTP/1.1\r\nhost: {url.host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nx-test-stream: {stream_id}\r\n\r\n"
    ).encode() + body
    received = b""
    async with httpx.AsyncClient(timeout=20) as client:
        async with await anyio.connect_tcp(url.host, url.port or 80) as connection:
            await connection.send(request)
            while b"event: token" not in received:
                received += await connection.receive()
        gone = time.monotonic()  # the connection is closed: the client went away
        closed = await client.get(f"{upstream}/streams/{stream_id}/closed")
        waited = time.monotonic() - gone
    assert received.startswith(b"HTTP/1.1 200")
    assert closed.json() == {"closed": True}
    # The issue asks for under 100 ms (3-5 ms here, printed with -s); the bound asserted is loose so
    # that a loaded machine cannot fail it.
    print(f"disconnect to upstream close: {waited * 1000:.1f} ms")
    assert waited < 5


# On asyncio only: agentrt serves in the child process (uvicorn, asyncio) whatever the test runs on;
# here only httpx reads, so a trio run repeated the same server's work (36 s each).
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_thousand_token_stream_to_a_hundred_clients_at_once(endpoint: str) -> None:
    bodies: list[str] = []

    async def client_reads(client: httpx.AsyncClient) -> None:
        response = await client.post(f"{endpoint}/tokens", json={"question": "1000"})
        assert response.status_code == 200
        bodies.append(response.text)

    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client, anyio.create_task_group() as group:
        for _ in range(100):
            group.start_soon(client_reads, client)
    assert len(bodies) == 100
    for body in bodies:
        events = [line[7:] for line in body.splitlines() if line.startswith("event: ")]
        assert events == ["token"] * 1000 + ["done"]
        ids = [line[4:] for line in body.splitlines() if line.startswith("id: ")]
        assert ids == [str(n) for n in range(1, 1002)]


BODIES = {
    "agentrt": {"question": "q"},
    "vercel-ui": {
        "id": "c1",
        "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "q"}]}],
    },
    "ag-ui": {"threadId": "t1", "runId": "r1", "messages": [{"id": "u1", "role": "user", "content": "q"}]},
}


@pytest.mark.parametrize("protocol", list(BODIES))
def test_a_client_that_resets_the_connection_leaves_no_socket_send_warnings(protocol: str) -> None:
    # (No asyncio/trio split: the test drives uvicorn, asyncio's, in a child process, with sockets.)
    with socket.socket() as control:
        control.bind(("127.0.0.1", 0))
        control.listen(1)
        for base in serve(SERVERS / "reset_app.py", str(control.getsockname()[1]), protocol):
            url = httpx.URL(base)
            body = json.dumps(BODIES[protocol]).encode()
            request = (
                f"POST /chat HTTP/1.1\r\nhost: {url.host}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n\r\n"
            ).encode() + body
            with socket.create_connection((url.host, url.port or 80), timeout=20) as client:
                client.sendall(request)
                received = b""
                while b"first" not in received:
                    received += client.recv(65536)
                # A reset, not a close: the server's next write to it fails.
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            control.settimeout(20)
            held, _ = control.accept()  # the server waits, blocked, right after `first`
            with held:
                held.sendall(b"go")  # its burst of 50 tokens now meets the reset socket
            logged = httpx.get(f"{str(url).removesuffix('/v1')}/log", timeout=20).json()
    assert received.startswith(b"HTTP/1.1 200")
    assert "socket.send() raised exception." not in logged, logged


# --- the loop's turn every three writes, in process -----------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="the response takes time between two events for a turn of the loop (_response._WAITED); "
    "a fix counts the loop's turns, not the time",
)
async def test_the_loop_gets_a_turn_every_three_writes_even_when_the_events_took_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # serving.md: "the endpoint gives the loop a turn every three writes" (so that a server hears of
    # a lost client before asyncio logs "socket.send() raised exception."). The response counts
    # writes since a turn, and starts the count again when an event came more than 0.5 ms after the
    # last write, taking it that the event was waited for. Time spent without a turn (a guardrail,
    # a listener or a structured answer's parse that takes 1 ms an event, in a burst of events from
    # one network read) is taken for a wait: every write then goes out without a turn.
    from agentrt.sse import _response

    now = [0.0]

    def clock() -> float:
        now[0] += 0.001  # each event took 1 ms of the loop's time: no turn was had
        return now[0]

    turns = [0]
    checkpoint = anyio.lowlevel.checkpoint

    async def counted() -> None:
        turns[0] += 1
        await checkpoint()

    monkeypatch.setattr(_response, "clock", clock)
    monkeypatch.setattr(anyio.lowlevel, "checkpoint", counted)
    model = ScriptedModel([f"t{i} " for i in range(30)])  # a burst: no turn between its chunks
    svc = agentrt.build(Chat, model=model, memory=agentrt.memory.window())
    client = Client(b'{"question": "Hi"}')
    writes: list[int] = []
    send = client.send

    async def sending(message: dict[str, Any]) -> None:
        if message.get("body"):
            writes.append(turns[0])  # the turns had before this write
        await send(message)

    client.send = sending  # type: ignore[method-assign]
    await run_client(chat_app(agentrt.sse.endpoint(svc.chat, memory_id=by_thread)), client)
    assert len(writes) == 31
    assert max(len(list(run)) for _, run in itertools.groupby(writes)) <= 3
