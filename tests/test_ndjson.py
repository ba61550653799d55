"""The incremental NDJSON splitter: lines whole whatever the chunk boundaries, any bytes."""

from __future__ import annotations

from cassettes import load, one_byte_parts
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.models._ndjson import NDJSONDecoder


def decode(*parts: bytes) -> list[bytes]:
    decoder = NDJSONDecoder()
    lines = []
    for part in parts:
        lines += decoder.feed(part)
    return lines + decoder.close()


def test_lines_are_split_on_newlines_and_empty_lines_skipped() -> None:
    assert decode(b'{"a":1}\n\n{"b":2}\n') == [b'{"a":1}', b'{"b":2}']
    assert decode(b'{"a":1}\r\n{"b":2}\r\n') == [b'{"a":1}\r', b'{"b":2}\r']  # "\r" is JSON whitespace


def test_the_last_line_needs_no_newline() -> None:
    assert decode(b'{"a":1}\n{"b"', b":2}") == [b'{"a":1}', b'{"b":2}']


def test_lines_split_mid_character_come_out_whole() -> None:
    body = '{"content":"✅ “ok”"}\n'.encode()
    assert decode(*one_byte_parts(body)) == [body[:-1]]


def test_a_recorded_ollama_stream_frames_into_its_lines() -> None:
    body = load("26").body
    expected = [line for line in body.split(b"\n") if line]
    assert decode(body) == expected
    assert decode(*one_byte_parts(body)) == expected


@settings(max_examples=500, deadline=None)
@given(body=st.binary(max_size=400), data=st.data())
def test_any_bytes_frame_without_error_and_independently_of_splits(body: bytes, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=8)))
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    whole = decode(body)
    assert decode(*parts) == whole
    assert whole == [line for line in body.split(b"\n") if line]
