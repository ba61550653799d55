"""The cancel rule over real HTTP (issue 27): with `on_disconnect="cancel"` a client's turn is stored
if and only if the answer's final frame (native `done`, Vercel `finish`, AG-UI `RUN_FINISHED`) was
written to its connection before the server learned that the client was gone.

The server is uvicorn in a child process (tests/servers/cancel_app.py): every protocol, without a
run manager and with one. The truth is uvicorn's, not agentrt's: the server's HTTP protocol records
whether the final frame's bytes reached `transport.write` while the transport was open and the
socket took them. The client hangs up while the server's event loop is blocked at a point the test
chooses (the server holds there until the test closed the client's socket): each point from before
the last token to inside the memory write, then each loop iteration across the final send.

The rule is exact with the response's two loop turns between the final send and the commit
(`agentrt.sse._response._SETTLE`): with one, a hang-up read in the iteration
before the send stores a turn whose final frame was dropped; with three, one read in the very
iteration of the send (after it) stores nothing though the frame was written (the sweep shows both).

(No asyncio/trio split: the tests drive uvicorn, asyncio's, in a child process, with blocking
sockets one step at a time, and the 200 clients in one asyncio run of their own.)
"""

from __future__ import annotations

import json
import random
import socket
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
from served import serve

SERVERS = Path(__file__).parent / "servers"
PROTOCOLS = ("agentrt", "vercel-ui", "ag-ui")
PATHS = ("plain", "runs")
pytestmark = pytest.mark.xdist_group("real-time")  # one worker for the real-time tests (tests/conftest.py)


class Server:
    def __init__(self, base: str, control: socket.socket) -> None:
        self.base = base
        self.url = httpx.URL(base)
        self.control = control
        self.http = httpx.Client(base_url=base, timeout=30)

    def request(self, path: str, protocol: str, cid: str, point: str, extra: str = "") -> bytes:
        question = f"{cid} {point} {extra}".strip()
        body = json.dumps(_body(protocol, question)).encode()
        # the guarded service for the points in the guardrail, the unguarded one (tokens as they
        # come) for the rest
        guarded = point in ("token", "tokened", "guardrail", "send", "sent", "store")
        route = f"/{path}/{protocol}" + ("" if guarded else "/open")
        return (
            f"POST {route} HTTP/1.1\r\nhost: {self.url.host}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"x-cid: {cid}\r\nx-point: {point}\r\n\r\n"
        ).encode() + body

    def result(self, cid: str) -> dict[str, Any]:
        response = self.http.get(f"/result/{cid}")
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer


def _body(protocol: str, question: str) -> dict[str, Any]:
    if protocol == "agentrt":
        return {"question": question}
    if protocol == "vercel-ui":
        return {
            "id": "c1",
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": question}]}],
        }
    return {
        "threadId": "t1",
        "runId": f"r-{uuid.uuid4().hex}",
        "messages": [{"id": "u1", "role": "user", "content": question}],
    }


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with socket.socket() as control:
        control.bind(("127.0.0.1", 0))
        control.listen(16)
        control.settimeout(20)
        for base in serve(SERVERS / "cancel_app.py", str(control.getsockname()[1]), backlog=256):
            with httpx.Client(base_url=base.removesuffix("/v1"), timeout=30) as http:
                server = Server(base.removesuffix("/v1"), control)
                server.http = http
                yield server


def hang_up(client: socket.socket) -> None:
    """Close the client's socket with a FIN (what was sent to it is read first: a socket closed with
    unread data resets the connection instead)."""
    client.setblocking(False)
    try:
        while client.recv(65536):
            pass
    except BlockingIOError:
        pass
    client.close()


def held(server: Server, path: str, protocol: str, point: str, extra: str = "") -> dict[str, Any]:
    """One request whose client hangs up while the server holds at `point`; the server's account."""
    cid = f"c{uuid.uuid4().hex[:12]}"
    client = socket.create_connection((server.url.host, server.url.port or 80), timeout=20)
    try:
        client.sendall(server.request(path, protocol, cid, point, extra))
        waiting, _ = server.control.accept()  # the server's loop is blocked at `point` now
        with waiting:
            said = waiting.recv(200).decode().split()
            assert said == [cid, point], said
            hang_up(client)
            waiting.sendall(b"g")
    finally:
        client.close()
    result = server.result(cid)
    result["cid"] = cid
    return result


def stored_iff_written(result: dict[str, Any], tokens: int = 4) -> bool:
    """The rule: stored (the user's message and the answer) exactly when the final frame was
    written; and the turn is stored whole or not at all."""
    cid = result["cid"]
    if result["stored"] not in (
        [],
        [["user", f"{cid} {result['point']}"], ["assistant", ANSWER(cid, tokens)]],
    ):
        return False
    return bool(result["stored"]) == bool(result["written"])


def ANSWER(cid: str, tokens: int = 4) -> str:
    return "".join(f"k{index}x " for index in range(tokens - 1)) + f"{cid}-end"


POINTS = {
    "token": False,  # before the last token
    "tokened": False,  # after the last token, before the output guardrail
    "guardrail": False,  # in the output guardrail
    "send": True,  # just before the final frame is handed to uvicorn: uvicorn writes it
    "sent": True,  # just after
    "store": True,  # inside the memory write (the commit), which then awaits 8 loop turns
}
"""Each point the loop is held at, and whether the final frame is written when the client's hang-up
lands there (the truth the server records is asserted too)."""


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_hang_up_while_the_loop_is_blocked_at_each_point_from_the_last_token_to_the_commit(
    server: Server, protocol: str, path: str
) -> None:
    for point, written in POINTS.items():
        result = held(server, path, protocol, point)
        result["point"] = point
        assert bool(result["written"]) is written, (point, result)
        assert stored_iff_written(result), (point, result)
        if written:
            assert result["ended"] == "Completed", result
        else:
            assert result["ended"] == "CancelledEvent", result


SWEEP = range(0, 16)
"""The server holds K + 1 loop iterations after the model is about to send its last token, which it
sends 6 iterations later and its end 3 after that (`LEAD`, `TAIL` in tests/servers/cancel_app.py):
the final frame is sent a few iterations after that."""


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_hang_up_read_in_each_loop_iteration_around_the_final_send(
    server: Server, protocol: str, path: str
) -> None:
    # The hang-up reaches the server's socket while its loop is held in iteration K + 1 and is read
    # in the next: for every K, before the last token to after the final frame was sent. A server's
    # send returns also when it did not write (the transport drops writes once it read the end of
    # file, uvicorn drops sends once the connection is lost, a reset socket refuses them): those
    # turns must not be stored.
    outcomes = []
    for k in SWEEP:
        point = f"loop:{k}"
        # One token: the native stream then writes at most three frames in a row, so the response
        # takes no turn of its own between them (`_WRITES_PER_TURN`), and no wall-clock measure
        # (`_WAITED`) moves the final send from one request to the next.
        result = held(server, path, protocol, point, "1")
        result["point"] = f"{point} 1"
        outcomes.append((k, bool(result["written"]), bool(result["stored"])))
        assert stored_iff_written(result, tokens=1), (point, result, outcomes)
    # the sweep crosses the final send: not written, then written from some iteration on
    assert [written for _, written, _ in outcomes] == sorted(written for _, written, _ in outcomes)
    assert {written for _, written, _ in outcomes} == {False, True}, outcomes


FINAL = (b"event: done", b'"type":"finish"', b'"type":"RUN_FINISHED"')


def test_two_hundred_clients_fifty_hanging_up_at_random_points_on_a_blocked_loop(server: Server) -> None:
    # One server, its loop blocked 1 ms in every 4; 200 clients at once over every protocol and
    # both paths (no output guardrail: tokens stream as they come), 8 tokens 1 ms apart each. 50 of
    # them hang up at a random point (seeded): once they read token k (1 to 8; most often the last
    # one, right before the final frame is sent) or the final frame; half close (a FIN, or a reset
    # if unread data was left), half reset. (One asyncio client run: the server is asyncio's.)
    rng = random.Random(27)
    cases = [(rng.choice(PATHS), rng.choice(PROTOCOLS)) for _ in range(200)]
    points = [*range(1, 9), 8, 8, 8, 8, 9, 9]
    quitting = {index: (rng.choice(points), rng.random() < 0.5) for index in rng.sample(range(200), 50)}
    cids = [f"m{index}-{uuid.uuid4().hex[:8]}" for index in range(200)]
    results: dict[int, dict[str, Any]] = {}

    def seen(index: int, received: bytes) -> bool:
        """Whether the quitting client `index` read as far as it goes."""
        k = quitting[index][0]
        if k == 9:
            return any(mark in received for mark in FINAL)
        return (f"k{k - 1}x" if k < 8 else f"{cids[index]}-end").encode() in received

    async def client(index: int) -> None:
        path, protocol = cases[index]
        request = server.request(path, protocol, cids[index], "none", "8 1")
        async with await anyio.connect_tcp(server.url.host, server.url.port or 80) as stream:
            await stream.send(request)
            received = await stream.receive()
            assert received.startswith(b"HTTP/1.1 200"), received
            if index in quitting:
                while not seen(index, received):
                    received += await stream.receive()
                if quitting[index][1]:
                    raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
                    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            while not received.endswith(b"0\r\n\r\n"):  # the chunked body's end
                received += await stream.receive()

    async def main() -> None:
        # No keep-alive: a pooled connection idle past uvicorn's keep-alive timeout (5 s; the 200
        # clients can take longer on a loaded machine) may be closed by the server as it is reused.
        fresh = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.base, timeout=30, limits=fresh) as http:
            assert (await http.post("/blocks", json={"every": 0.003, "for": 0.001})).status_code == 200
            try:
                with anyio.fail_after(60):
                    async with anyio.create_task_group() as group:
                        for index in range(200):
                            group.start_soon(client, index)
            finally:
                await http.post("/blocks", json={"every": 0, "for": 0})

            async def result(index: int) -> None:
                response = await http.get(f"/result/{cids[index]}")
                results[index] = {**response.json(), "cid": cids[index], "point": "none 8 1"}

            with anyio.fail_after(60):
                async with anyio.create_task_group() as group:
                    for index in range(200):
                        group.start_soon(result, index)

    anyio.run(main)
    for index, answer in results.items():
        assert stored_iff_written(answer, tokens=8), (index, cases[index], quitting.get(index), answer)
        if index not in quitting:
            assert answer["written"] and answer["ended"] == "Completed", answer
    stored = sum(bool(results[index]["stored"]) for index in quitting)
    dropped = sum(bool(results[index]["dropped"]) for index in quitting)
    after_last = [index for index in quitting if quitting[index][0] == 8]
    print(
        f"\nof 50 hang-ups: {stored} stored (final frame written), {50 - stored} not "
        f"({dropped} of them with the final frame dropped); of the {len(after_last)} after the last "
        f"token: {sum(bool(results[index]['stored']) for index in after_last)} stored"
    )
    assert 0 < stored < 50
