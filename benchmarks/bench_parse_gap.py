"""How long parsing an answer stops the event loop: the longest gap a 1 ms ticker task sees while
`TypeParser.parse` reads a 10 MB answer in a worker thread (as `parse_off_loop` does), and how long
a 16 KiB answer dense in brackets takes on the loop (answers up to `OFF_LOOP` are parsed there).

A worker thread holds the GIL for one C call at a time (Python switches threads every 5 ms, between
calls): the gap is about that interval plus the longest call. Each figure is the best of three runs,
so a neighbour's load on a shared machine does not count; the idle and pure-Python rows are the floor.
The parsed value is kept until the measurement ends, as a caller keeps its result (freeing a 10 MB
list of models is one C call of ~0.1 s, wherever its last reference goes).

A list of models is the one shape above the floor: each model is two objects the cycle collector
tracks (the instance and its fields-set), ~0.5 M of them for 10 MB, and CPython 3.11-3.13 run a full
collection over the whole heap, holding the GIL, whenever the objects that survived since the last
one reach a quarter of it. The row with the collector off shows the rest of the parse is at the floor.

    .venv/bin/python benchmarks/bench_parse_gap.py
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from pydantic import BaseModel

from agentrt import OutputParsingError
from agentrt._pipeline._finish import OFF_LOOP
from agentrt.output import parser_for

if TYPE_CHECKING:
    from collections.abc import Callable


class Ticket(BaseModel):
    title: str
    priority: int


def _items(size: int) -> str:
    return ",".join(["12345678"] * (size // 9))


def _tickets(size: int) -> str:
    return ",".join(['{"title": "Printer on fire", "priority": 1}'] * (size // 44))


SHAPES: dict[str, tuple[Any, Callable[[int], str]]] = {
    "JSON list, fenced, prose around": (list[int], lambda n: f"Here:\n```json\n[{_items(n)}]\n```\nDone."),
    "JSON list in prose with braces": (list[int], lambda n: f"Use {{braces}}: [{_items(n)}] Done."),
    "JSON list, then a sentence": (list[int], lambda n: f"[{_items(n)}]\nHope this helps!"),
    "a list of models, fenced": (list[Ticket], lambda n: f"```json\n[{_tickets(n)}]\n```"),
    "a model with a 10 MB string": (Ticket, lambda n: f'{{"title": "{"x" * n}", "priority": 1}}'),
    "after a think block as long": (
        list[int],
        lambda n: f"<think>{'a, ' * (n // 6)}</think>[{_items(n // 2)}]",
    ),
    "unclosed fence": (Ticket, lambda n: "```json" + " " * n),
    "prose": (Ticket, lambda n: "Nothing to see here. " * (n // 21)),
    "white space": (Ticket, lambda n: " " * n),
    "100,000 [ (brackets)": (Ticket, lambda n: "[" * n),
    "unbalanced braces": (Ticket, lambda n: "{" * (n // 2) + "}" * (n // 2 - 1)),
    "mismatched {]": (Ticket, lambda n: "{]" * (n // 2)),
    "a brace every other character": (Ticket, lambda n: "{a" * (n // 2)),
    "a closer every other character": (Ticket, lambda n: "a}" * (n // 2)),
    "{} repeated": (Ticket, lambda n: "{}" * (n // 2)),
    "[1] repeated": (Ticket, lambda n: "[1] " * (n // 4)),
    '{"a": 1} repeated': (Ticket, lambda n: '{"a": 1} ' * (n // 9)),
    "quotes and braces": (Ticket, lambda n: '{"' * (n // 2)),
    "distinct spans [0] [1] ...": (Ticket, lambda n: " ".join(f"[{i}]" for i in range(n // 8))[:n]),
    "unclosed string": (Ticket, lambda n: '{"title": "' + "x" * n),
}


def parse(parser: Any, text: str) -> Any:
    try:
        return parser.parse(text)
    except OutputParsingError:
        return None


def busy(seconds: float) -> None:
    """Pure Python for `seconds`: the thread switch interval alone."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


async def longest_gap(work: Callable[[], object]) -> tuple[float, float]:
    """(the longest gap between ticks while `work` runs in a worker thread, how long it ran); what
    `work` returns is freed after the ticks end."""
    gaps = [0.0]
    done = anyio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await anyio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async with anyio.create_task_group() as group:
        group.start_soon(tick)
        await anyio.sleep(0.01)
        started = time.perf_counter()
        kept = await anyio.to_thread.run_sync(work)
        took = time.perf_counter() - started
        done.set()
    del kept
    return max(gaps), took


async def best_gap(work: Callable[[], object]) -> tuple[float, float]:
    runs = [await longest_gap(work) for _ in range(3)]
    return min(gap for gap, _ in runs), min(took for _, took in runs)


def on_loop(parser: Any, text: str) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        parse(parser, text)
        best = min(best, time.perf_counter() - started)
    return best


async def main() -> None:
    size = 10_000_000
    print(f"the event loop's longest gap while a {size // 1_000_000} MB answer is parsed in a worker thread")
    print("  (best of three; ms gap, s parse)")
    idle, _ = await best_gap(lambda: None)
    python, _ = await best_gap(lambda: busy(0.3))
    print(f"  {'floor: nothing to do':38} {idle * 1000:7.1f} ms")
    print(f"  {'floor: pure Python in the thread':38} {python * 1000:7.1f} ms")
    for name, (annotation, make) in SHAPES.items():
        parser, text = parser_for(annotation), make(size)
        gap, took = await best_gap(lambda parser=parser, text=text: parse(parser, text))  # type: ignore[misc]
        print(f"  {name:38} {gap * 1000:7.1f} ms {took:7.2f} s")
    parser, text = parser_for(list[Ticket]), SHAPES["a list of models, fenced"][1](size)
    gc.disable()
    try:
        gap, took = await best_gap(lambda: parse(parser, text))
    finally:
        gc.enable()
    print(f"  {'a list of models, the collector off':38} {gap * 1000:7.1f} ms {took:7.2f} s")
    print(f"on the event loop: answers of {OFF_LOOP} characters (best of five)")
    for name, (annotation, make) in SHAPES.items():
        text = make(OFF_LOOP)[:OFF_LOOP]
        print(f"  {name:38} {on_loop(parser_for(annotation), text) * 1000:7.2f} ms")


if __name__ == "__main__":
    anyio.run(main)
