"""The connection pool of a model's own client: its limits, agentrt's FIFO admission in front of it,
and a client built off the event loop, within the request's deadline."""

from __future__ import annotations

import os
import shutil
import ssl
import threading
from typing import TYPE_CHECKING, Any

import anyio
import certifi
import httpx
import pytest

from agentrt import ModelRequest, ModelTimeoutError, UserMessage
from agentrt.models import OpenAIChatModel, RetryPolicy, complete
from agentrt.models._admission import Admission, AdmittedTransport

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from anyio.abc import SocketStream, TaskGroup

REQUEST = ModelRequest(messages=(UserMessage.of("hi"),))


# --- admission: first come, first served; cancellation never loses a slot ----------------------------


async def test_waiters_are_admitted_first_come_first_served() -> None:
    admission = Admission(1)
    await admission.acquire()
    admitted: list[int] = []

    async def wait(i: int) -> None:
        await admission.acquire()
        admitted.append(i)
        admission.release()

    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(wait, i)
            await anyio.wait_all_tasks_blocked()  # queued in this order
        assert admitted == []
        admission.release()
        await anyio.wait_all_tasks_blocked()
        assert admitted == [0, 1, 2, 3, 4]
    assert admission.free == 1


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    admission = Admission(1)
    await admission.acquire()
    admitted: list[str] = []

    async def wait(name: str, scope: anyio.CancelScope) -> None:
        with scope:
            await admission.acquire()
            admitted.append(name)
            admission.release()

    first, second = anyio.CancelScope(), anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, "first", first)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(wait, "second", second)
        await anyio.wait_all_tasks_blocked()
        first.cancel()
        await anyio.wait_all_tasks_blocked()
        admission.release()  # to "second": the cancelled waiter is skipped
        await anyio.wait_all_tasks_blocked()
        assert admitted == ["second"]  # here, so that a lost slot fails the test instead of hanging it
    assert admission.free == 1
    await admission.acquire()  # and nobody else holds a slot
    assert admission.free == 0


async def test_a_slot_handed_to_a_waiter_as_it_is_cancelled_is_not_lost() -> None:
    admission = Admission(1)
    await admission.acquire()
    admitted: list[str] = []

    async def wait(name: str, scope: anyio.CancelScope) -> None:
        with scope:
            await admission.acquire()
            try:
                admitted.append(name)
                await anyio.lowlevel.checkpoint()
            finally:
                admission.release()

    first, second = anyio.CancelScope(), anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, "first", first)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(wait, "second", second)
        await anyio.wait_all_tasks_blocked()
        # The slot goes to "first", which is cancelled before it runs again: it passes the slot on
        # (asyncio: its wait raises), or takes it and gives it back when its scope ends (trio).
        admission.release()
        first.cancel()
        await anyio.wait_all_tasks_blocked()
        assert admitted in (["second"], ["first", "second"])
    assert admission.free == 1


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_slot_handed_to_a_waiter_that_asyncio_cancels_is_passed_on() -> None:
    # asyncio's own cancellation (`asyncio.timeout`, a server cancelling a request's task) can reach a
    # waiter whose slot was just handed over: its wait raises although the slot is its. Trio and anyio's
    # cancel scopes let such a wait return, and cancel at the next checkpoint (the test above).
    import asyncio

    admission = Admission(1)
    await admission.acquire()
    admitted: list[str] = []
    tasks: list[asyncio.Task[Any]] = []

    async def first() -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(task)
        try:
            await admission.acquire()
        except asyncio.CancelledError:
            task.uncancel()
            admitted.append("first, cancelled")
            return
        admitted.append("first")
        admission.release()

    async def second() -> None:
        await admission.acquire()
        admitted.append("second")
        admission.release()

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(second)
        await anyio.wait_all_tasks_blocked()
        admission.release()
        tasks[0].cancel()
        await anyio.wait_all_tasks_blocked()
        assert admitted == ["first, cancelled", "second"]
    assert admission.free == 1


# --- the transport: no more requests in the pool than its connections ---------------------------------


class _Body(httpx.AsyncByteStream):
    def __init__(self, pool: _Pool) -> None:
        self._pool = pool

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"ok"

    async def aclose(self) -> None:
        self._pool.open -= 1


class _Pool(httpx.AsyncBaseTransport):
    """A pool that records the order requests reach it and how many of their responses are open."""

    def __init__(self) -> None:
        self.arrived: list[str] = []
        self.open = 0
        self.most = 0
        self.fail: set[str] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        name = request.url.path.strip("/")
        self.arrived.append(name)
        await anyio.lowlevel.checkpoint()
        if name in self.fail:
            raise httpx.ConnectError("refused", request=request)
        self.open += 1
        self.most = max(self.most, self.open)
        return httpx.Response(200, stream=_Body(self))


async def test_requests_beyond_the_pool_wait_in_order_and_hold_a_slot_until_closed() -> None:
    pool = _Pool()
    pool.fail.add("3")
    transport = AdmittedTransport(pool, 2)
    gates = [anyio.Event() for _ in range(7)]
    read: list[str] = []

    async def call(client: httpx.AsyncClient, i: int) -> None:
        try:
            async with client.stream("GET", f"http://pool.test/{i}") as response:
                await gates[i].wait()
                read.append((await response.aread()).decode() + str(i))
        except httpx.ConnectError:
            read.append(f"refused{i}")

    async with httpx.AsyncClient(transport=transport) as client, anyio.create_task_group() as tg:
        for i in range(7):
            tg.start_soon(call, client, i)
            await anyio.wait_all_tasks_blocked()
        assert pool.arrived == ["0", "1"]
        for i in (1, 0, 2, 4, 5, 6):
            gates[i].set()
            await anyio.wait_all_tasks_blocked()
    assert pool.arrived == ["0", "1", "2", "3", "4", "5", "6"]
    assert read == ["ok1", "ok0", "refused3", "ok2", "ok4", "ok5", "ok6"]
    assert pool.most == 2
    assert pool.open == 0
    assert transport.admission.free == 2  # a failed request gave its slot back too


async def test_a_request_cancelled_while_it_waits_for_a_slot_takes_none() -> None:
    pool = _Pool()
    transport = AdmittedTransport(pool, 1)
    release = anyio.Event()

    async def hold(client: httpx.AsyncClient) -> None:
        async with client.stream("GET", "http://pool.test/held"):
            await release.wait()

    async with httpx.AsyncClient(transport=transport) as client, anyio.create_task_group() as tg:
        tg.start_soon(hold, client)
        await anyio.wait_all_tasks_blocked()
        with anyio.CancelScope() as scope:

            async def cancel() -> None:
                await anyio.wait_all_tasks_blocked()  # the request waits for a slot
                scope.cancel()

            tg.start_soon(cancel)
            await client.get("http://pool.test/cancelled")
        assert scope.cancelled_caught
        release.set()
    assert pool.arrived == ["held"]
    assert transport.admission.free == 1


# --- the model's own client --------------------------------------------------------------------------

_EVENT = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
)


async def _serve(tg: TaskGroup, expected: int) -> str:
    """An OpenAI-compatible endpoint on loopback that answers no request before `expected` of them are
    in, each on its own connection (so a client whose pool is smaller never gets its answers)."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    arrived = 0
    everyone = anyio.Event()

    async def handle(stream: SocketStream) -> None:
        nonlocal arrived
        async with stream:
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive()
            headers, _, body = head.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in headers.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            while len(body) < length:
                body += await stream.receive()
            arrived += 1
            if arrived == expected:
                everyone.set()
            await everyone.wait()
            await stream.send(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n%s" % (len(_EVENT), _EVENT)
            )

    async def run() -> None:
        async with listener:
            await listener.serve(handle)

    tg.start_soon(run)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    return f"http://127.0.0.1:{port}/v1"


async def test_a_model_streams_more_responses_at_once_than_httpx_default_pool() -> None:
    # httpx's default pool has 100 connections; the openai SDK's, which agentrt's client now has, 1,000.
    calls = 150
    answers: list[str] = []
    with anyio.fail_after(30):  # with a 100-connection pool the server would wait forever
        async with anyio.create_task_group() as server:
            base_url = await _serve(server, calls)
            async with OpenAIChatModel("m", base_url=base_url, retry=RetryPolicy.never()) as model:

                async def call() -> None:
                    answers.append((await complete(model, REQUEST)).message.text)

                async with anyio.create_task_group() as tg:
                    for _ in range(calls):
                        tg.start_soon(call)
            server.cancel_scope.cancel()
    assert answers == ["hi"] * calls


@pytest.fixture
def own_ca_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, Any]]:
    """A CA setting no client was built with yet (so its SSL context is built afresh), and a record of
    the threads SSL contexts are created on."""
    bundle = tmp_path / "ca.pem"
    shutil.copy(certifi.where(), bundle)
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    created: list[tuple[int, Any]] = []
    real = ssl.create_default_context

    def create_default_context(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        created.append((threading.get_ident(), kwargs.get("cafile")))
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", create_default_context)
    return created


async def test_the_client_is_built_off_the_event_loop_and_models_share_its_ssl_context(
    own_ca_setting: list[tuple[int, Any]],
) -> None:
    # Loading the CA bundle took 30-160 ms on the event loop at each model's first request.
    async with anyio.create_task_group() as server:
        base_url = await _serve(server, 1)
        async with OpenAIChatModel("m", base_url=base_url, retry=RetryPolicy.never()) as first:
            assert (await complete(first, REQUEST)).message.text == "hi"
        async with OpenAIChatModel("m", base_url=base_url, retry=RetryPolicy.never()) as second:
            assert (await complete(second, REQUEST)).message.text == "hi"
        server.cancel_scope.cancel()
    [(thread, cafile)] = own_ca_setting  # once for both models
    assert cafile == os.environ["SSL_CERT_FILE"]
    assert thread != threading.get_ident()


async def test_a_deadline_covers_building_the_client(
    own_ca_setting: list[tuple[int, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 0.1 s time budget fired at 200-860 ms when the first call built the client on the loop.
    proceed, built = threading.Event(), threading.Event()
    slow = ssl.create_default_context

    def create_default_context(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        proceed.wait(5)  # today's code blocks the loop here; the test then fails instead of hanging
        try:
            return slow(*args, **kwargs)
        finally:
            built.set()

    monkeypatch.setattr(ssl, "create_default_context", create_default_context)
    model = OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1", retry=RetryPolicy.never())
    request = ModelRequest(messages=REQUEST.messages, deadline=anyio.current_time() + 0.05)
    try:
        with pytest.raises(ModelTimeoutError) as caught:
            await complete(model, request)
        assert not built.is_set()
        assert not caught.value.mid_stream
    finally:
        proceed.set()
        # The abandoned build ends before the test does; on a loaded machine the deadline may pass
        # before a worker thread takes the build at all (anyio then skips it): nothing to wait for.
        await anyio.to_thread.run_sync(built.wait, 10)
        await model.aclose()
