"""What chat memory costs: added time per awaited turn for each store, and turns/s under concurrency.

The model answers every request at once from memory (one short text chunk), so what is measured is
agentrt and the store: the conversation's lock, the load, the window, the longer request, the atomic
commit. One service is built without memory and once per store (in-memory, SQLite in a temporary
file, Redis on a `redis-server` this script starts on a free loopback port; without `redis-server` on
PATH the Redis rows are skipped).

- Per turn: turns awaited one after another on one conversation with a window of the newest
  `WINDOW` messages (warmed up until the window is full, so every timed turn does the same work).
  The in-memory store is also measured without a window over conversations that grow to
  `GROWING_TURNS` turns. Rows give microseconds per turn and what memory adds over the service
  without it; the in-memory store's budget is 50 µs added per turn.
- Throughput: `TASKS` tasks each await `TURNS_PER_TASK` turns at once, all on ONE conversation
  (its lock serializes them) and on `TASKS` conversations (one per task).

It prints, it never asserts.

    .venv/bin/python -m benchmarks.bench_memory            (asyncio)
    .venv/bin/python -m benchmarks.bench_memory --backend trio
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio

import agentrt
from agentrt import Capabilities, FinishReason, MemoryId, ModelRequest, TextDelta, Usage
from agentrt.memory import ChatMemory, ChatMemoryStore, InMemoryStore, RedisStore, SQLiteStore
from agentrt.models import Finish, ModelChunk
from agentrt.testing import FunctionModel

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator

WINDOW = 20  # messages: ten turns of history
REPEATS = 7
GROWING_TURNS = 200
TASKS = 100
TURNS_PER_TASK = 10
THROUGHPUT_REPEATS = 3
# Turns per timed block, per store: the in-process store is cheap, the shared ones cost thread hops
# and I/O (four per turn: lease, load, commit, unlock).
TURNS = {"none": 2_000, "in-memory": 2_000, "sqlite": 500, "redis": 500}


class MemoryModel:
    """Answers every request with the same chunks, from memory, without waiting or recording."""

    name = "memory"
    capabilities = Capabilities(handles_deadline=True)

    def __init__(self) -> None:
        self.chunks: list[ModelChunk] = [TextDelta("Noted."), Usage(10, 2), Finish(FinishReason.STOP)]

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        for chunk in self.chunks:
            yield chunk


class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


# -- redis-server on a free loopback port (as tests/redis_server.py does, which benchmarks do not import)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[str | None]:
    """Run a `redis-server` (nothing persisted) while open; yield its URL, or `None` if there is none
    on PATH or it did not start."""
    executable = shutil.which("redis-server")
    if executable is None:
        yield None
        return
    for _ in range(5):  # the free port may be taken before the server binds it
        port = _free_port()
        args = [executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(directory), "--daemonize", "no", "--logfile", str(directory / "redis.log")]
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and process.poll() is None and not _answers_ping(port):
            time.sleep(0.05)
        if process.poll() is None and _answers_ping(port):
            break
        if process.poll() is None:
            process.kill()
        process.wait()
    else:
        yield None
        return
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- measurements


async def best_of(runs: int, body: Callable[[], Coroutine[Any, Any, None]]) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        await body()
        samples.append(time.perf_counter() - start)
    return min(samples) if runs < 5 else statistics.median(sorted(samples)[: runs // 2 + 1])


def build(store: ChatMemoryStore | None, max_messages: int | None = WINDOW) -> Chat:
    memory = ChatMemory(store, max_messages=max_messages) if store is not None else None
    return agentrt.build(Chat, model=MemoryModel(), memory=memory)


async def per_turn(services: dict[str, Chat]) -> dict[str, float]:
    """Seconds per awaited turn on one windowed conversation, per service. Repeats are interleaved
    across services so that drift of the machine hits them alike."""
    for service in services.values():  # warm up: connections, schema, a full window
        for _ in range(WINDOW):
            await service.chat("bench", "What did I just say?")
    samples: dict[str, list[float]] = {name: [] for name in services}
    for _ in range(REPEATS):
        for name, service in services.items():
            turns = TURNS[name]
            start = time.perf_counter()
            for _ in range(turns):
                await service.chat("bench", "What did I just say?")
            samples[name].append((time.perf_counter() - start) / turns)
    return {name: statistics.median(sorted(s)[: REPEATS // 2 + 1]) for name, s in samples.items()}


async def growing() -> tuple[float, float]:
    """Seconds per turn over fresh conversations of `GROWING_TURNS` turns: no memory, and the
    in-memory store without a window (history up to 2 * GROWING_TURNS messages)."""
    plain, remembering = build(None), build(InMemoryStore(), max_messages=None)

    def conversation(service: Chat) -> Callable[[], Coroutine[Any, Any, None]]:
        async def body() -> None:
            memory_id = uuid.uuid4().hex
            for _ in range(GROWING_TURNS):
                await service.chat(memory_id, "What did I just say?")

        return body

    await conversation(remembering)()
    base = await best_of(REPEATS, conversation(plain))
    grown = await best_of(REPEATS, conversation(remembering))
    return base / GROWING_TURNS, grown / GROWING_TURNS


async def throughput(service: Chat, one_conversation: bool) -> float:
    """Turns per second: `TASKS` tasks of `TURNS_PER_TASK` turns, on one conversation or one each."""
    prefix = uuid.uuid4().hex

    async def task(index: int) -> None:
        memory_id = prefix if one_conversation else f"{prefix}-{index}"
        for _ in range(TURNS_PER_TASK):
            await service.chat(memory_id, "What did I just say?")

    async def run() -> None:
        async with anyio.create_task_group() as group:
            for index in range(TASKS):
                group.start_soon(task, index)

    await run()  # warm up: worker threads and their connections
    seconds = await best_of(THROUGHPUT_REPEATS, run)
    return TASKS * TURNS_PER_TASK / seconds


SLOW_MODEL = 0.02  # seconds a slow model takes to answer


async def overlap(store: ChatMemoryStore) -> tuple[float, float, float]:
    """With a model taking `SLOW_MODEL` s: one turn; `TASKS` turns on `TASKS` conversations at once
    (they overlap: about the time of one); `TURNS_PER_TASK` turns on one conversation at once (they
    run one after another)."""

    async def slow(request: ModelRequest) -> str:
        await anyio.sleep(SLOW_MODEL)
        return "ok"

    service = agentrt.build(Chat, model=FunctionModel(slow), memory=ChatMemory(store, max_messages=WINDOW))
    prefix = uuid.uuid4().hex

    async def at_once(ids: list[str]) -> float:
        start = time.perf_counter()
        async with anyio.create_task_group() as group:
            for memory_id in ids:
                group.start_soon(service.chat, memory_id, "What did I just say?")
        return time.perf_counter() - start

    await at_once([prefix])  # warm up
    one = min([await at_once([f"{prefix}-one"]) for _ in range(3)])
    many = min([await at_once([f"{prefix}-{i}-{r}" for i in range(TASKS)]) for r in range(3)])
    same = min([await at_once([f"{prefix}-same-{r}"] * TURNS_PER_TASK) for r in range(3)])
    return one, many, same


async def measure(redis_url: str | None, directory: Path) -> None:
    stores: dict[str, ChatMemoryStore] = {
        "in-memory": InMemoryStore(),
        "sqlite": SQLiteStore(directory / "memory.sqlite3"),
    }
    if redis_url is not None:
        stores["redis"] = RedisStore(redis_url, prefix=f"bench-{uuid.uuid4().hex[:8]}:")
    services = {"none": build(None), **{name: build(store) for name, store in stores.items()}}

    closers: list[Callable[[], Awaitable[None]]] = []
    for store in stores.values():
        aclose = getattr(store, "aclose", None)
        if aclose is not None:
            closers.append(aclose)
    try:
        seconds = await per_turn(services)
        base = seconds["none"]
        print(f"  per awaited turn, one conversation, window of {WINDOW} messages:")
        print(f"    {'store':24} {'µs/turn':>9} {'added µs':>9}")
        for name, value in seconds.items():
            over = "" if name == "none" else f"{(value - base) * 1e6:9.1f}"
            label = "no memory" if name == "none" else name
            print(f"    {label:24} {value * 1e6:9.1f} {over:>9}")
        plain, grown = await growing()
        print(
            f"    {'in-memory, no window':24} {grown * 1e6:9.1f} {(grown - plain) * 1e6:9.1f}"
            f"   (mean over {GROWING_TURNS}-turn conversations; no memory {plain * 1e6:.1f})"
        )
        added = (seconds["in-memory"] - base) * 1e6
        verdict = "within" if added < 50 else "OVER"
        print(f"    in-memory store adds {added:.1f} µs per turn: {verdict} the 50 µs budget")

        print(f"  turns/s, {TASKS} tasks x {TURNS_PER_TASK} turns at once:")
        print(f"    {'store':24} {'1 conversation':>15} {f'{TASKS} conversations':>17}")
        for name, service in services.items():
            one = await throughput(service, one_conversation=True)
            many = await throughput(service, one_conversation=False)
            label = "no memory" if name == "none" else name
            print(f"    {label:24} {one:15,.0f} {many:17,.0f}")

        print(f"  a model taking {SLOW_MODEL * 1e3:.0f} ms; ms for turns started at once:")
        print(f"    {'store':24} {'1 turn':>9} {f'{TASKS} ids':>9} {f'{TURNS_PER_TASK} on 1 id':>11}")
        for name, store in stores.items():
            one, many, same = await overlap(store)
            print(f"    {name:24} {one * 1e3:9.1f} {many * 1e3:9.1f} {same * 1e3:11.1f}")
    finally:
        for aclose in closers:
            await aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backend", choices=("asyncio", "trio", "both"), default="asyncio")
    backends = ("asyncio", "trio") if (backend := parser.parse_args().backend) == "both" else (backend,)
    with tempfile.TemporaryDirectory(prefix="agentrt-bench-memory-") as tmp:
        directory = Path(tmp)
        with redis_server(directory) as redis_url:
            print("agentrt chat memory cost (model answers from memory; listeners off)")
            if redis_url is None:
                print("  note: redis-server is not on PATH (or did not start): no Redis rows")
            for name in backends:
                print(f" {name}:")
                anyio.run(measure, redis_url, directory, backend=name)


if __name__ == "__main__":
    main()
