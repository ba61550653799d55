"""Throughput of structured-output extraction (`TypeParser.parse`): clean and adversarial answers of
1 MB and 10 MB, and how the time grows from one to the other (linear: about 10x).

    .venv/bin/python benchmarks/bench_extract.py
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel

from agentrt import OutputParsingError
from agentrt._pipeline._finish import OFF_LOOP
from agentrt.models._think import ThinkTagSplitter
from agentrt.output import parser_for
from agentrt.output._extract import candidates
from agentrt.output._partial import Snapshots


class Ticket(BaseModel):
    title: str
    priority: int


def clean(size: int) -> str:
    """A JSON list of numbers, fenced, with prose around it (numbers: what is measured is finding
    the JSON, not pydantic building objects)."""
    items = ",".join(["12345678"] * (size // 9))
    return f"Here are the numbers:\n```json\n[{items}]\n```\nHope this helps!"


def clean_spans(size: int) -> str:
    """The same, unfenced, after prose with braces: found by the span scan."""
    items = ",".join(["12345678"] * (size // 9))
    return f"Use {{braces}} like this: [{items}] Hope this helps!"


ADVERSARIAL = {
    "unclosed fence": lambda size: "```json" + " " * size,
    "brackets": lambda size: "[" * size,
    "unbalanced braces": lambda size: "{" * (size // 2) + "}" * (size // 2 - 1),
    "mismatched brackets": lambda size: "{]" * (size // 2),
    "many small spans": lambda size: '{"a": 1} ' * (size // 9),
    "unclosed string": lambda size: '{"title": "' + "x" * size,
}


def timed(parser: Any, text: str) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        try:
            parser.parse(text)
        except OutputParsingError:
            pass
        best = min(best, time.perf_counter() - started)
    return best


def found(text: str) -> float:
    """Seconds to list every candidate of `text` (the best of five)."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _candidate in candidates(text):
            pass
        best = min(best, time.perf_counter() - started)
    return best


def streamed(size: int, lead: str) -> float:
    """Seconds to feed an answer of `size` characters to `Snapshots` in 16-character deltas."""
    items = ",".join(["12345678"] * (size // 18))
    text = f"[{items}]"
    if lead:
        text = f"<think>{'a, ' * (size // 6)}</think>\n{text}"
    deltas = [text[at : at + 16] for at in range(0, len(text), 16)]
    best = float("inf")
    for _ in range(3):
        snapshots = Snapshots(parser_for(list[int]))  # type: ignore[arg-type]
        started = time.perf_counter()
        for delta in deltas:
            snapshots.feed(delta)
        best = min(best, time.perf_counter() - started)
    return best


def split_leading_space(deltas: int) -> float:
    """Seconds for `ThinkTagSplitter` to read `deltas` one-character white-space deltas, then a
    think block and the answer (the best of three)."""
    best = float("inf")
    for _ in range(3):
        splitter, out = ThinkTagSplitter(), []  # type: ignore[var-annotated]
        started = time.perf_counter()
        for _delta in range(deltas):
            splitter.feed(" ", out)
        splitter.feed("<think>plan</think>answer", out)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    numbers = parser_for(list[int])
    rows = [
        ("clean: fenced, prose around", numbers, clean),
        ("clean: in prose with braces", numbers, clean_spans),
    ]
    rows += [(name, parser_for(Ticket), make) for name, make in ADVERSARIAL.items()]
    print("structured-output extraction: seconds for 1 MB and 10 MB, MB/s at 10 MB, growth 10 MB / 1 MB")
    for name, parser, make in rows:
        small, large = timed(parser, make(1_000_000)), timed(parser, make(10_000_000))
        print(f"  {name:34} {small:7.3f} s {large:7.3f} s {10 / large:8.1f} MB/s   x{large / small:5.1f}")
    # The clean rows include pydantic building a list of 1.1 million ints from 10 MB, which grows
    # faster than the text (memory, not the algorithm): finding the JSON alone, for comparison.
    print("finding the JSON alone (every candidate, no validation): seconds for 1 MB and 10 MB, growth")
    for name, make in (("clean: fenced, prose around", clean), ("clean: in prose with braces", clean_spans)):
        small = found(make(1_000_000))
        large = found(make(10_000_000))
        print(f"  {name:34} {small:7.3f} s {large:7.3f} s {10 / large:8.1f} MB/s   x{large / small:5.1f}")
    # Partial values of a streamed answer (PartialStream): the whole stream's reads, in 16-character
    # deltas, after a think block as long as the JSON (where the JSON starts is found in one pass).
    print("partial values of a streamed answer, 16-character deltas: seconds for 1 MB and 10 MB, growth")
    for name, lead in (("JSON list of numbers", ""), ("after a think block", "think")):
        small, large = streamed(1_000_000, lead), streamed(10_000_000, lead)
        print(f"  {name:34} {small:7.3f} s {large:7.3f} s {10 / large:8.1f} MB/s   x{large / small:5.1f}")
    # Leading white space before a think block, one character a delta (was quadratic: 1.8 s at 80k).
    print("think tags: one-character white-space deltas before a think block, 20k / 40k / 80k")
    times = [split_leading_space(deltas) for deltas in (20_000, 40_000, 80_000)]
    shown = " ".join(f"{seconds * 1000:7.1f} ms" for seconds in times)
    print(f"  {shown}   x{times[2] / times[0]:4.1f}")
    # Answers up to OFF_LOOP characters are parsed on the event loop: the longest such parse.
    print(f"on the event loop (answers up to {OFF_LOOP} characters; longer ones go to a worker thread):")
    for name, parser, make in rows:
        print(f"  {name:34} {timed(parser, make(OFF_LOOP)[:OFF_LOOP]) * 1000:7.2f} ms")


if __name__ == "__main__":
    main()
