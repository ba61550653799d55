"""What a durable turn costs (agentrt.durable, on DBOS): per turn and per recorded step, on SQLite and
Postgres, against the same turn awaited plainly.

The turn is the crash tests' (tests/durable_worker.py, without kills): an idempotent tool round, a
non-idempotent one (so one intent step), an answer the output guardrail rejects and the accepted one;
memory in an SQLiteStore. The model answers at once, so what is measured is agentrt and DBOS: the
durable turn records 8 segment steps and 2 intent steps (one before each tool round), plus the
workflow's own rows and 2 events for the non-idempotent call (started, its outcome). Each turn has
a new id on a new conversation. Median of `TURNS` turns after `WARMUP`.

The streamed rows: a turn of one request whose answer is `TOKENS` tokens (from memory, at once),
read to its last token, plainly (a `TokenStream`) and as a durable streamed turn (`Engine.stream`,
read in the same process, SQLite polled every 10 ms), with the writes its text took (DBOS stream
rows: the writer batches what arrives during a write).

Postgres: `--postgres URL` (a server; the script makes its own database on it), else a server this
script starts like the tests do (tests/postgres_server.py: `initdb`/`pg_ctl` on PATH or Debian's),
else the Postgres row is skipped. It prints, it never asserts.

    .venv/bin/python -m benchmarks.bench_durable [--turns 30] [--postgres postgresql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import agentrt

if TYPE_CHECKING:
    from collections.abc import Iterator

TOKENS = 500
STEPS = 10  # 8 segments (prepare, 4 requests, 2 tool rounds, commit) and an intent step per round


def turn_parts(directory: Path) -> tuple[Any, Any]:
    sys.argv = [sys.argv[0], "", "", "", str(directory)]  # the worker module reads argv at import
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import durable_worker as w

    w.DIR = directory
    import agentrt

    store = w.Store(directory / "memory.sqlite", lease_seconds=5.0)
    shop = agentrt.build(
        w.Shop,
        model=w.FunctionModel(w.respond),
        memory=agentrt.memory.window(namespace="shop", store=store),
        tools=[w.Tools()],
        output_guardrails=[w.Polite()],
    )
    return shop, store


async def timed(turn: Any, turns: int, warmup: int) -> float:
    times = []
    for index in range(warmup + turns):
        started = time.perf_counter()
        await turn(index)
        if index >= warmup:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


async def durable(database: str, shop: Any, turns: int, warmup: int) -> float:
    from agentrt.durable import Engine

    engine = Engine(database, executor_id="bench", polling_seconds=0.05)
    engine.register("shop", shop)
    async with engine:
        run = uuid.uuid4().hex

        async def turn(index: int) -> None:
            await engine.call(
                "shop", "ask", turn_id=f"{run}-{index}", conversation=f"d{run}{index}", question="?"
            )

        return await timed(turn, turns, warmup)


class Talker:
    async def chat(self, question: str) -> agentrt.TokenStream: ...


def talker() -> Any:
    from agentrt.testing import FunctionModel

    words = [f"w{i} " for i in range(TOKENS)]
    return agentrt.build(Talker, model=FunctionModel(lambda request: words))


async def streamed(database: str | None, turns: int, warmup: int) -> tuple[float, float]:
    """The median time to a streamed turn's last token, and the writes (stream rows) it took."""
    service = talker()
    if database is None:

        async def plain(index: int) -> None:
            async with await service.chat("?") as tokens:
                async for _ in tokens:
                    pass

        return await timed(plain, turns, warmup), 0.0
    from dbos import DBOS

    from agentrt.durable import Engine

    engine = Engine(database, executor_id="bench-stream", polling_seconds=0.01)
    engine.register("talker", service)
    async with engine:
        run = uuid.uuid4().hex

        async def turn(index: int) -> None:
            async with await engine.stream(
                "talker", "chat", turn_id=f"{run}-{index}", question="?"
            ) as tokens:
                async for _ in tokens:
                    pass

        seconds = await timed(turn, turns, warmup)
        values = 0
        async for _ in DBOS.read_stream_async(f"{run}-0", "agentrt.text"):
            values += 1
    return seconds, float(values)


@contextlib.contextmanager
def postgres(url: str | None) -> Iterator[str | None]:
    if url is not None:
        yield url
        return
    from postgres_server import postgres_server

    servers = postgres_server()
    try:
        started = next(servers)
    except BaseException as exc:  # pytest.skip: no binaries
        print(f"(no Postgres: {exc})")
        yield None
        return
    try:
        yield started
    finally:
        servers.close()


async def main(turns: int, warmup: int, url: str | None) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-durable-") as tmp:
        directory = Path(tmp)
        shop, store = turn_parts(directory)

        async def plain(index: int) -> None:
            await shop.ask(f"p{index}", "?")

        base = await timed(plain, turns, warmup)
        rows = [("plain (awaited)", base)]
        rows.append(
            ("durable, SQLite", await durable(f"sqlite:///{directory / 'dbos.sqlite'}", shop, turns, warmup))
        )
        with postgres(url) as server:
            if server is not None:
                database = f"{server}/bench{uuid.uuid4().hex[:8]}"
                rows.append(("durable, Postgres", await durable(database, shop, turns, warmup)))
        store.close()
        streams = [("plain stream", *(await streamed(None, turns, warmup)))]
        streams.append(
            (
                "durable stream, SQLite",
                *(await streamed(f"sqlite:///{directory / 'stream.sqlite'}", turns, warmup)),
            )
        )
    print(f"median of {turns} turns ({STEPS} recorded steps per durable turn)")
    for name, seconds in rows:
        added = seconds - base
        per_step = f"  +{added / STEPS * 1e3:6.2f} ms/step" if seconds is not base else ""
        print(f"{name:20} {seconds * 1e3:8.2f} ms/turn  +{added * 1e3:7.2f} ms{per_step}")
    print(f"a streamed turn of {TOKENS} tokens, read to its last token (median of {turns})")
    base = streams[0][1]
    for name, seconds, values in streams:
        writes = (
            f"  {values:.0f} stream values ({TOKENS / max(values - 2, 1):.0f} tokens a write)"
            if values
            else ""
        )
        print(f"{name:24} {seconds * 1e3:8.2f} ms  +{(seconds - base) * 1e3:7.2f} ms{writes}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--postgres", default=None)
    options = parser.parse_args()
    asyncio.run(main(options.turns, options.warmup, options.postgres))
